//! A full disk is bad input too: courier answers 507, stores nothing
//! partial, keeps every event it acknowledged, and goes on once there is room.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::{Courier, client, run_cli};

/// A small tmpfs, unmounted on drop. The machines courier is developed and
/// tested on run tests as root, so mounting is allowed.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: &Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(at).expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk(at.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_gets_507_and_loses_no_acknowledged_event() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let disk = SmallDisk::mount(&tmp.path().join("fs"), "3m");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let config = format!(
        "listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
journal: {{ dir: {}/journal }}
destinations:
  orders:
    url: {url}
    retry: {{ schedule: [1h] }}
",
        disk.0.display()
    );
    let mut courier = Courier::start(tmp.path(), &config).await;
    let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(16 * 1024));
    let (mut accepted, mut full) = (0, None);
    for i in 0..1000 {
        let r = client::post(
            &courier.url("orders"),
            body.clone(),
            &[("idempotency-key", &format!("e{i}"))],
        )
        .await;
        match r.status {
            202 => accepted += 1,
            507 => {
                full = Some(r);
                break;
            }
            other => panic!("unexpected {other}: {}\n{}", r.text(), courier.logs()),
        }
    }
    let full = full.unwrap_or_else(|| panic!("the disk never filled\n{}", courier.logs()));
    assert!(
        accepted > 10,
        "only {accepted} accepted before the disk filled"
    );
    let err = full.json();
    assert_eq!(err["reason"], "disk_full", "{err}");
    assert!(
        err["error"].as_str().is_some_and(|e| e.contains("disk")),
        "{err}"
    );
    // Still serving, and a second try is refused the same way, not with a failure.
    let again = client::post(&courier.url("orders"), body.clone(), &[]).await;
    assert_eq!(again.status, 507, "{}", again.text());
    assert_eq!(
        client::get(&format!("{}/healthz", courier.admin_url()))
            .await
            .status,
        200
    );

    courier.kill();
    let out = run_cli(
        None,
        &[
            "journal",
            "inspect",
            "--dir",
            &disk.0.join("journal").display().to_string(),
        ],
        &[],
    )
    .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let row = out
        .stdout
        .lines()
        .find(|l| l.starts_with("orders"))
        .unwrap_or_else(|| panic!("{}", out.stdout));
    let pending: usize = row
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("pending column");
    assert_eq!(
        pending, accepted,
        "every acknowledged event is still pending, nothing more\n{}",
        out.stdout
    );
}
