//! Operating-system resources: the open-file limit raised at start, and
//! outbound connections to a destination bounded by its `concurrency`,
//! reused across events, and closed soon after a burst.

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use support::load::{self, LoadSpec};
use support::{Courier, check, check_eq, config, courier_bin, fail};
use tokio::net::TcpListener;
use tokio::time::Instant;

const CONCURRENCY: usize = 4;

/// A receiver that answers 200 (after `SLOW` while `slow` is set) and
/// counts TCP connections: accepted in all, open now, the most open at once.
#[derive(Default)]
struct Conns {
    slow: AtomicBool,
    accepted: AtomicUsize,
    open: AtomicUsize,
    max_open: AtomicUsize,
    requests: AtomicUsize,
}

const SLOW: Duration = Duration::from_millis(300);

async fn counting_receiver() -> (String, Arc<Conns>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let conns = Arc::new(Conns::default());
    let c = conns.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            c.accepted.fetch_add(1, Ordering::SeqCst);
            let open = c.open.fetch_add(1, Ordering::SeqCst) + 1;
            c.max_open.fetch_max(open, Ordering::SeqCst);
            let c = c.clone();
            tokio::spawn(async move {
                let counter = c.clone();
                let svc = service_fn(move |_req| {
                    let slow = counter.slow.load(Ordering::SeqCst);
                    let counter = counter.clone();
                    async move {
                        if slow {
                            tokio::time::sleep(SLOW).await;
                        }
                        counter.requests.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::new())))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
                c.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (url, conns)
}

async fn send(c: &Courier, conns: &Conns, events: usize) {
    let before = conns.requests.load(Ordering::SeqCst);
    let report = load::run_n(
        LoadSpec {
            url: c.url("/hooks"),
            connections: 8,
            duration: Duration::from_secs(60),
            body: Bytes::from_static(br#"{"n":1}"#),
            headers: vec![],
        },
        events as u64,
    )
    .await;
    check_eq!(c, report.ok, events as u64, "{report:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while conns.requests.load(Ordering::SeqCst) < before + events {
        if Instant::now() > deadline {
            fail!(
                c,
                "only {} answers",
                conns.requests.load(Ordering::SeqCst) - before
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_to_a_destination_stay_near_its_concurrency_and_are_reused() {
    let (url, conns) = counting_receiver().await;
    let dir = tempfile::tempdir().expect("tempdir");
    // Attempts time out before the slow receiver answers; their late
    // answers (a success) complete the events, which keeps each timed-out
    // attempt's connection busy past its timeout while the next attempts
    // need connections of their own.
    let extra = format!("concurrency: {CONCURRENCY}\ntimeout: 100ms\nretry: {{ schedule: [1s] }}");
    let yaml = config("hooks", &url, &extra).replace("level: debug", "level: info");
    let c = Courier::start(dir.path(), &yaml).await;
    conns.slow.store(true, Ordering::SeqCst);
    // Fewer timeouts than put the endpoint on probation (10).
    send(&c, &conns, 2 * CONCURRENCY).await;
    conns.slow.store(false, Ordering::SeqCst);
    let slow_accepted = conns.accepted.load(Ordering::SeqCst);
    let slow_max_open = conns.max_open.load(Ordering::SeqCst);
    conns
        .max_open
        .store(conns.open.load(Ordering::SeqCst), Ordering::SeqCst);

    const EVENTS: usize = 3000;
    send(&c, &conns, EVENTS).await;
    let accepted = conns.accepted.load(Ordering::SeqCst) - slow_accepted;
    let max_open = conns.max_open.load(Ordering::SeqCst);
    let open = conns.open.load(Ordering::SeqCst);
    eprintln!(
        "slow phase: {slow_accepted} accepted, at most {slow_max_open} open; \
         fast phase ({EVENTS} events): {accepted} accepted, at most {max_open} open, {open} open at the end"
    );
    // In use (≤ concurrency) plus idle (≤ concurrency); what the slow phase
    // opened beyond that must have been closed, not kept idle.
    check!(
        c,
        max_open <= 2 * CONCURRENCY,
        "{max_open} connections open at once with concurrency {CONCURRENCY}"
    );
    check!(
        c,
        open <= CONCURRENCY,
        "{open} connections still open once idle"
    );
    // Reused: a handful of connections carried thousands of events.
    check!(
        c,
        accepted <= 2 * CONCURRENCY,
        "{accepted} connections opened for {EVENTS} events"
    );
}

/// Connections a burst opened are closed soon after it (the pool's idle
/// timeout, 4 s, checked once per timeout): with 30 s they stayed up to a
/// minute, each holding its buffers (benches/RESULTS.md, step i).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bursts_connections_are_closed_within_seconds_of_their_last_use() {
    let (url, conns) = counting_receiver().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let extra = format!("concurrency: {CONCURRENCY}");
    let yaml = config("hooks", &url, &extra).replace("level: debug", "level: info");
    let c = Courier::start(dir.path(), &yaml).await;
    // Slow answers keep every slot busy: the burst opens `CONCURRENCY`.
    conns.slow.store(true, Ordering::SeqCst);
    send(&c, &conns, 2 * CONCURRENCY).await;
    let delivered = Instant::now();
    let open = conns.open.load(Ordering::SeqCst);
    check!(c, open >= 2, "only {open} connections open after the burst");
    let deadline = delivered + Duration::from_secs(12);
    while conns.open.load(Ordering::SeqCst) > 0 {
        if Instant::now() > deadline {
            fail!(
                c,
                "{} of {open} connections still open 12 s after their last answer",
                conns.open.load(Ordering::SeqCst)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let closed_after = delivered.elapsed();
    eprintln!("{open} idle connections closed {closed_after:?} after the last answer");
    // Not before the timeout: an idle connection is kept for reuse that long.
    check!(
        c,
        closed_after >= Duration::from_secs(3),
        "idle connections closed after {closed_after:?}, before the 4 s timeout"
    );
}

/// Runs courier with its soft open-file limit lowered (a shell wrapper's
/// `ulimit -Sn`) and reads its limits from /proc.
#[tokio::test]
async fn the_soft_open_file_limit_is_raised_to_the_hard_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wrapper = dir.path().join("courier-low-nofile.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nulimit -Sn 256 || exit 97\nexec '{}' \"$@\"\n",
            courier_bin().display()
        ),
    )
    .expect("write wrapper");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let yaml = config("hooks", "http://127.0.0.1:9", "");
    let c = Courier::start_with(&wrapper, dir.path(), &yaml).await;
    let limits =
        std::fs::read_to_string(format!("/proc/{}/limits", c.pid())).expect("read /proc limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| fail!(c, "no open-files line in\n{limits}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (soft, hard) = (fields[3], fields[4]);
    check!(
        c,
        hard != "256",
        "the hard limit is 256 too; nothing to raise: {line}"
    );
    check_eq!(c, soft, hard, "{line}");
    check!(
        c,
        c.logged(|l| l.contains("old=256"), Duration::from_secs(10))
            .await,
        "the raise is logged with the old value"
    );
}

/// Unmounts on drop, so that a failing check leaves no mount behind.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A journal directory that exists but cannot be written: the message names
/// the lock file, not "cannot create the journal directory".
#[tokio::test]
async fn a_read_only_journal_directory_is_named_as_such() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = dir.path().join("journal");
    std::fs::create_dir(&journal).expect("mkdir");
    // Root ignores permission bits: a read-only mount stops it instead.
    let _unmount = if unsafe { libc::geteuid() } == 0 {
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro,size=64k", "tmpfs"])
            .arg(&journal)
            .status();
        if !matches!(mounted, Ok(s) if s.success()) {
            eprintln!("skipped: running as root and cannot mount a read-only tmpfs ({mounted:?})");
            return;
        }
        Some(Unmount(journal.clone()))
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&journal, std::fs::Permissions::from_mode(0o555)).expect("chmod");
        None
    };
    let yaml = dir.path().join("courier.yaml");
    std::fs::write(&yaml, config("hooks", "http://127.0.0.1:9", "")).expect("write config");
    let out = support::run_cli(None, &["run", "-c", &yaml.to_string_lossy()], &[]).await;
    let text = format!("{}{}", out.stdout, out.stderr);
    let lock = journal.join("courier.lock");
    assert_eq!(out.code, 2, "{}", out.show());
    assert!(
        text.contains(&format!("cannot create the lock file {}", lock.display())),
        "{}",
        out.show()
    );
    assert!(
        text.contains("journal.dir must be writable"),
        "{}",
        out.show()
    );
    assert!(
        !text.contains("cannot create the journal directory"),
        "{}",
        out.show()
    );
}

/// Sets courier's open-file limit with prlimit(2); returns the old one.
fn set_nofile(pid: u32, limit: Option<libc::rlimit>) -> libc::rlimit {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    let new = limit.as_ref().map_or(std::ptr::null(), |l| l as *const _);
    // SAFETY: prlimit on our own child; `new` is null or points at a live value.
    let rc = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, new, &mut old) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    old
}

/// One request on an already open keep-alive connection (a new one could
/// not be accepted while courier has no descriptor to spare).
async fn post_on(conn: &mut tokio::net::TcpStream, path: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.expect("send");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // Bounded by the timeout and the answer's length.
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let n = conn.read(&mut chunk).await.expect("read");
            assert!(n > 0, "courier closed the connection");
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).to_string();
            if let Some((head, rest)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_string())
                    })
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if rest.len() >= len {
                    let status = head
                        .split(' ')
                        .nth(1)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    return (status, rest.to_string());
                }
            }
        }
    });
    read.await.expect("an answer within 10 s")
}

/// Out of descriptors when the journal opens its first intake segment: a
/// 503 that says to try again, not a journal failed until restart; once
/// descriptors are free the same connection gets a 202, the event is
/// delivered, and /healthz stayed 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_descriptors_is_a_retry_not_a_failed_journal() {
    let receiver = support::Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &config("orders", &receiver.url(), "")).await;
    let mut conn = tokio::net::TcpStream::connect(c.ingress_addr())
        .await
        .expect("connect");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The soft limit only: raising a hard limit back needs CAP_SYS_RESOURCE.
    let old = set_nofile(c.pid(), None);
    // Below every descriptor in use: no free slot is left anywhere.
    set_nofile(
        c.pid(),
        Some(libc::rlimit {
            rlim_cur: 3,
            rlim_max: old.rlim_max,
        }),
    );
    let (status, body) = post_on(&mut conn, "/orders", "{\"n\":1}").await;
    set_nofile(c.pid(), Some(old));
    check_eq!(c, status, 503, "{body}");
    check!(
        c,
        body.contains("journal_unavailable"),
        "a transient error, not a failed journal: {body}"
    );
    let (status, body) = post_on(&mut conn, "/orders", "{\"n\":2}").await;
    check_eq!(c, status, 202, "descriptors are free again: {body}");
    let health = support::get(&format!("{}/healthz", c.admin_url())).await;
    check_eq!(c, health.status, 200, "{}", health.text());
    let got = receiver.wait_for(1, Duration::from_secs(10)).await;
    check_eq!(c, got[0].body.as_ref(), b"{\"n\":2}".as_slice());
}
