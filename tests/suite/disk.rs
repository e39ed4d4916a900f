//! A full disk is bad input too: courier answers 507, stores nothing
//! partial, keeps every event it acknowledged (through a SIGKILL and a start
//! on the still-full disk), and goes on by itself once there is room.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{Courier, Receiver, Reply, behavior, client};

/// A small tmpfs, unmounted on drop. Mounting needs root, so these tests
/// are `#[ignore]`d in a plain `cargo test` (which lists them as ignored,
/// with the reason) and run by `.ci/test` as root with `-- --ignored disk::`;
/// there a failed mount fails the test, never passes it unrun.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: &Path, size: &str) -> Result<SmallDisk, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(SmallDisk(at.to_path_buf()))
    }

    /// Fills the disk with `filler` until the write fails, then gives back
    /// `leave` bytes.
    fn fill(&self, leave: u64) {
        let path = self.0.join("filler");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("filler");
        let chunk = vec![7u8; 16 * 1024];
        // Bounded: the disk is a few MiB.
        for _ in 0..100_000 {
            if f.write_all(&chunk).is_err() {
                break;
            }
        }
        let len = f.metadata().expect("filler size").len();
        f.set_len(len.saturating_sub(leave)).expect("give back");
    }

    /// Bytes free, as `df` says.
    fn available(&self) -> u64 {
        let out = Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(&self.0)
            .output()
            .expect("df");
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("df said: {text}"))
    }

    fn free(&self) {
        std::fs::remove_file(self.0.join("filler")).expect("remove the filler");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

const BODY: usize = 16 * 1024;

/// A courier whose journal is on a small tmpfs, delivering to a receiver
/// that answers 503 until `open`, and remembers the ids it answered 200.
struct Setup {
    disk: SmallDisk,
    open: Arc<AtomicBool>,
    delivered: Arc<Mutex<HashSet<String>>>,
    _receiver: Receiver,
    courier: Courier,
    _tmp: tempfile::TempDir,
}

async fn setup(size: &str) -> Setup {
    let tmp = tempfile::tempdir().expect("tempdir");
    let disk = SmallDisk::mount(&tmp.path().join("fs"), size)
        .unwrap_or_else(|why| panic!("cannot mount a small tmpfs (these tests need root): {why}"));
    let open = Arc::new(AtomicBool::new(false));
    let delivered = Arc::new(Mutex::new(HashSet::new()));
    let (gate, sink) = (open.clone(), delivered.clone());
    let receiver = Receiver::start(behavior(move |r, _| {
        if !gate.load(Ordering::Relaxed) {
            return Reply::status(503);
        }
        if let (Some(id), Ok(mut sink)) = (r.header("webhook-id"), sink.lock()) {
            sink.insert(id.to_string());
        }
        Reply::status(200)
    }))
    .await;
    let config = format!(
        "listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
shutdown_grace: 2s
journal: {{ dir: {}/journal }}
destinations:
  orders:
    url: {}
    retry: {{ schedule: [1s], max_attempts: 30, jitter: 0 }}
    status: {{ min_delay: {{ 5xx: 0s }} }}
    probation: {{ after_failures: 0 }}
",
        disk.0.display(),
        receiver.url()
    );
    let courier = Courier::start(tmp.path(), &config).await;
    Setup {
        disk,
        open,
        delivered,
        _receiver: receiver,
        courier,
        _tmp: tmp,
    }
}

/// A JSON body of random hex, a new one each call: LZ4 cannot shrink it,
/// so the events of the failing destination fill the disk at their size
/// whether or not the journal packs them (journal/pack.rs).
fn body() -> String {
    static SEED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let mut x = SEED
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        | 1;
    let hex: String = (0..BODY)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b"0123456789abcdef"[(x & 15) as usize])
        })
        .collect();
    format!("{{\"pad\":\"{hex}\"}}")
}

/// Posts until the first 507, which must say why.
/// Ids are `{prefix}e{i}`.
async fn fill_with_events(s: &Setup, acked: &mut HashSet<String>, prefix: &str) {
    let url = s.courier.url("orders");
    let mut full = None;
    for i in 0..1000 {
        let id = format!("{prefix}e{i}");
        let r = client::post(&url, body(), &[("idempotency-key", &id)]).await;
        match r.status {
            202 => {
                acked.insert(id);
            }
            507 => {
                full = Some(r);
                break;
            }
            other => panic!("unexpected {other}: {}\n{}", r.text(), s.courier.logs()),
        }
    }
    let full = full.unwrap_or_else(|| panic!("the disk never filled\n{}", s.courier.logs()));
    // Enough that the loss checks after it mean something; how many fit
    // depends on how far the indexer lags (the writer keeps room for it).
    assert!(
        acked.len() >= 5,
        "only {} accepted before the disk filled",
        acked.len()
    );
    let err = full.json();
    assert_eq!(err["reason"], "disk_full", "{err}");
    assert!(
        err["error"].as_str().is_some_and(|e| e.contains("disk")),
        "{err}"
    );
}

/// How a start on a disk full to the last byte came up. Never an exit: the
/// documented behaviour (docs/journal.md) is that courier runs, `/healthz`
/// 200, opens the journal as soon as there is room, and answers 507
/// `disk_full` exactly while the volume lacks room for its reserve and as
/// much again. Which of these a start meets depends on the disk (how much
/// its own recovery frees: a WAL checkpointed, segments recycled), not on
/// chance.
#[derive(Debug, PartialEq)]
enum FullStart {
    /// SQLite found no room to open: `/readyz` 503 until it does.
    Waiting,
    /// Open, with no room for the reserve: 507, ready.
    OpenFull,
    /// The recovery itself freed room for the reserve: accepting.
    OpenWithRoom,
}

/// SIGKILL, the disk filled to the last byte, a start: checks the above.
/// An event accepted goes into `acked`.
async fn start_on_a_full_disk(s: &mut Setup, acked: &mut HashSet<String>) -> FullStart {
    static POSTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    s.courier.kill();
    s.disk.fill(0);
    let offset = s.courier.logs().len();
    s.courier.restart().await;
    let healthz = client::get(&format!("{}/healthz", s.courier.admin_url())).await;
    assert_eq!(
        healthz.status,
        200,
        "{}\n{}",
        healthz.text(),
        s.courier.logs()
    );
    let id = format!("full-start{}", POSTS.fetch_add(1, Ordering::Relaxed));
    let r = client::post(
        &s.courier.url("orders"),
        body(),
        &[("idempotency-key", &id)],
    )
    .await;
    let readyz = ready(s).await;
    // The log writer lets each burst gather for 10 ms (docs/logs.md): the
    // line that explains the answers may come a moment after them.
    let deadline = Instant::now() + Duration::from_secs(2);
    let wanted: &[&str] = match (readyz, r.status) {
        (503, 507) => &["the journal opens once there is room"],
        // Opened without room for the reserve, or with it, and then the
        // event found the disk full (the reserve released for deliveries).
        (200, 507) => &[
            "the journal's disk has no room for its reserve",
            "the journal's disk is full",
        ],
        (200, 202) => &["journal checked and recovered"],
        other => panic!(
            "/readyz and ingress answered {other:?}: {}\n{}",
            r.text(),
            &s.courier.logs()[offset..]
        ),
    };
    let mut logs = s.courier.logs()[offset..].to_string();
    // Bounded by the deadline.
    while !wanted.iter().any(|w| logs.contains(w)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        logs = s.courier.logs()[offset..].to_string();
    }
    let started = match (readyz, r.status) {
        (503, _) => {
            // Kept alive, the connection would be closed under the app's
            // next POST when the journal opens (no_room.rs).
            assert_eq!(r.header("connection"), Some("close"), "{:?}", r.headers);
            FullStart::Waiting
        }
        (_, 507) => FullStart::OpenFull,
        _ => FullStart::OpenWithRoom,
    };
    assert!(
        wanted.iter().any(|w| logs.contains(w)),
        "{started:?} but the log says none of {wanted:?}:\n{logs}"
    );
    if r.status == 507 {
        assert_eq!(r.json()["reason"], "disk_full", "{}", r.text());
    } else {
        // Accepting means the reserve was taken with as much again left
        // (a sixteenth of the 8 MiB volume, 512 KiB), less the event.
        let free = s.disk.available();
        assert!(
            free >= 448 * 1024,
            "accepting with {free} bytes free\n{logs}"
        );
        acked.insert(id);
    }
    assert!(s.courier.is_running(), "{logs}");
    started
}

async fn ready(s: &Setup) -> u16 {
    client::get(&format!("{}/readyz", s.courier.admin_url()))
        .await
        .status
}

/// Polls `/readyz` until 200, at most 5 s: once the journal opens, the
/// servers take over and are ready a moment later.
async fn until_ready(s: &Setup) {
    for _ in 0..100 {
        if ready(s).await == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "not ready 5 s after the journal opened\n{}",
        s.courier.logs()
    );
}

/// Two processes that keep both cores busy while they live: the full-disk
/// start must not decide by how the scheduler happens to run it.
struct Busy(Vec<std::process::Child>);

impl Busy {
    fn start() -> Busy {
        Busy(
            (0..2)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .expect("sh")
                })
                .collect(),
        )
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Polls until ingress takes an event again (at most 10 s); prints how
/// long after `since` that was, and returns the event's id (unique in the
/// test binary).
async fn accepted_again(s: &Setup, since: &str) -> String {
    static TRIES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let start = Instant::now();
    for _ in 0..200 {
        let id = format!("again{}", TRIES.fetch_add(1, Ordering::Relaxed));
        let r = client::post(
            &s.courier.url("orders"),
            body(),
            &[("idempotency-key", &id)],
        )
        .await;
        if r.status == 202 {
            println!(
                "ingress accepted again {} ms after {since}",
                start.elapsed().as_millis()
            );
            return id;
        }
        assert_eq!(r.status, 507, "{}", r.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("ingress stayed at 507 after {since}\n{}", s.courier.logs());
}

/// Opens the receiver and waits until every acknowledged id got its 200.
async fn all_delivered(s: &Setup, acked: &HashSet<String>) {
    s.open.store(true, Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = HashSet::new();
    // Bounded by the deadline.
    while Instant::now() < deadline {
        got = s.delivered.lock().expect("delivered ids").clone();
        if acked.is_subset(&got) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let missing: Vec<_> = acked.difference(&got).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged events never delivered: {missing:?}\n{}",
        missing.len(),
        s.courier.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "mounts a tmpfs, so needs root: .ci/test runs it as root with -- --ignored disk::"]
async fn a_full_disk_gets_507_and_courier_recovers_by_itself_losing_nothing() {
    let mut s = setup("8m").await;
    let mut acked = HashSet::new();
    s.disk.fill(4 * 1024 * 1024);
    fill_with_events(&s, &mut acked, "").await;
    let healthz = format!("{}/healthz", s.courier.admin_url());
    assert_eq!(
        client::get(&healthz).await.status,
        200,
        "a full disk is no reason to restart"
    );

    // SIGKILL, and the disk filled to the last byte, with the reserve gone
    // (given to SQLite at the 507): the start comes up all the same, 507.
    let started = start_on_a_full_disk(&mut s, &mut acked).await;
    println!("the start on a full disk: {started:?}");
    s.disk.free();
    acked.insert(accepted_again(&s, "space was freed").await);

    // The start took its reserve back. SIGKILL, the disk fills up to the
    // last byte, and the reserve is the next start's room.
    s.courier.kill();
    s.disk.fill(0);
    s.courier.restart().await;
    assert_eq!(
        ready(&s).await,
        200,
        "the reserve was room enough to open the journal\n{}",
        s.courier.logs()
    );
    let r = client::post(&s.courier.url("orders"), body(), &[]).await;
    assert_eq!(r.status, 507, "{}\n{}", r.text(), s.courier.logs());

    // Room again: ingress comes back by itself.
    s.disk.free();
    let id = accepted_again(&s, "space was freed").await;
    acked.insert(id);

    all_delivered(&s, &acked).await;
    s.courier.terminate();
    let status = s.courier.wait_exit(Duration::from_secs(7)).await;
    assert!(status.success(), "{status}\n{}", s.courier.logs());
}

/// SIGTERM on a full disk keeps to its grace and loses nothing: the next
/// start, once there is room, delivers every acknowledged event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "mounts a tmpfs, so needs root: .ci/test runs it as root with -- --ignored disk::"]
async fn sigterm_on_a_full_disk_exits_within_its_grace() {
    let mut s = setup("8m").await;
    let mut acked = HashSet::new();
    s.disk.fill(4 * 1024 * 1024);
    fill_with_events(&s, &mut acked, "").await;
    s.courier.terminate();
    // shutdown_grace 2s, plus the journal's close.
    let status = s.courier.wait_exit(Duration::from_secs(7)).await;
    assert!(status.success(), "{status}\n{}", s.courier.logs());
    s.disk.free();
    s.courier.restart().await;
    all_delivered(&s, &acked).await;
}

/// The disk filled by courier's own backlog (the receiver down), with no
/// operator to free anything: once the receiver is back and the backlog is
/// delivered, the space goes back to the volume and ingress
/// opens again by itself. Red before ingress kept room for SQLite: the
/// backlog's WAL frames could then not be checkpointed into journal.db, and
/// no delivery could be recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "mounts a tmpfs, so needs root: .ci/test runs it as root with -- --ignored disk::"]
async fn a_disk_filled_by_the_backlog_opens_again_once_it_is_delivered() {
    let s = setup("8m").await;
    let mut acked = HashSet::new();
    fill_with_events(&s, &mut acked, "").await;
    all_delivered(&s, &acked).await;
    accepted_again(&s, "the backlog was delivered").await;
}

/// A first start on a disk with no room to create the journal waits for
/// room (`no_room.rs`), and every answer it gives meanwhile closes its
/// connection: an app's client posting back to back on kept-alive
/// connections gets an answer to every POST across the moment the journal
/// opens (a kept-alive connection was closed under a POST there, which
/// then failed without an answer), and the first 202 is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "mounts a tmpfs, so needs root: .ci/test runs it as root with -- --ignored disk::"]
async fn a_start_waiting_for_room_answers_every_post_across_the_journals_open() {
    let mut s = setup("8m").await;
    s.courier.kill();
    std::fs::remove_dir_all(s.disk.0.join("journal")).expect("remove the journal");
    s.disk.fill(0);
    s.courier.restart().await;
    assert_eq!(ready(&s).await, 503, "{}", s.courier.logs());
    let r = client::post(&s.courier.url("orders"), body(), &[]).await;
    assert_eq!(r.status, 507, "{}\n{}", r.text(), s.courier.logs());
    assert_eq!(r.header("connection"), Some("close"), "{:?}", r.headers);

    // Four clients at once, so that some connection is being accepted or
    // read at the moment the journal opens.
    let posters: Vec<_> = (0..4)
        .map(|p| {
            let url = s.courier.url("orders");
            tokio::spawn(async move {
                let mut answers = Vec::new();
                // Bounded: 10 s of POSTs at most.
                for i in 0..2000 {
                    let id = format!("across{p}-{i}");
                    let r = client::try_post(&url, body(), &[("idempotency-key", &id)])
                        .await
                        .unwrap_or_else(|e| panic!("POST {i} of client {p} got no answer: {e}"));
                    answers.push(r.status);
                    if r.status == 202 {
                        return (answers, id);
                    }
                    assert_eq!(r.status, 507, "{}", r.text());
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                panic!("never accepted: {answers:?}");
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.disk.free();
    let mut acked = HashSet::new();
    for poster in posters {
        let (answers, id) = poster.await.expect("a poster");
        println!("{} answers before the first 202", answers.len() - 1);
        assert!(answers.len() > 1, "the disk was freed before any 507");
        acked.insert(id);
    }
    until_ready(&s).await;
    all_delivered(&s, &acked).await;
}

/// A start on a disk full to the last byte, 20 times beside two busy
/// loops, comes up the same documented way every time (`start_on_a_full_disk`)
/// and loses nothing: each round fills the disk with events, SIGKILLs,
/// starts, frees the space, and has every acknowledged event delivered.
/// Red before courier waited for room: the start then exited 2 or came
/// up by chance, as SQLite happened to find room to open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "mounts a tmpfs, so needs root: .ci/test runs it as root with -- --ignored disk::"]
async fn a_start_on_a_full_disk_comes_up_the_same_way_every_time() {
    let _alone = support::alone().await;
    let mut s = setup("8m").await;
    let _busy = Busy::start();
    let mut acked = HashSet::new();
    let mut seen = Vec::new();
    for round in 0..20 {
        s.open.store(false, Ordering::Relaxed);
        s.disk.fill(4 * 1024 * 1024);
        fill_with_events(&s, &mut acked, &format!("r{round}")).await;
        seen.push(start_on_a_full_disk(&mut s, &mut acked).await);
        s.disk.free();
        acked.insert(accepted_again(&s, &format!("space was freed (round {round})")).await);
        until_ready(&s).await;
        all_delivered(&s, &acked).await;
    }
    println!("starts on a full disk: {seen:?}");
}

/// A container with a read-only root filesystem (as deploy/ runs courier):
/// only the journal's volume is writable. History's first partition rolls
/// at 100,000 records, and its index is built then by a sort past
/// SQLite's cache, into a temporary file; courier puts those beside the
/// journal. Where SQLite's defaults (/var/tmp, /usr/tmp, /tmp, the working
/// directory) were read-only, the roll left the partition without its
/// index, and the next start, which builds it, failed with "disk I/O
/// error" and exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "mounts a tmpfs, so needs root: .ci/test runs it as root with -- --ignored disk::"]
async fn a_start_with_a_read_only_root_filesystem_reopens_a_large_history() {
    const EVENTS: usize = 105_000;
    const PER_REQUEST: usize = 1_000;
    let tmp = tempfile::tempdir().expect("tempdir");
    let disk = SmallDisk::mount(&tmp.path().join("fs"), "256m")
        .unwrap_or_else(|why| panic!("cannot mount a small tmpfs (these tests need root): {why}"));
    let receiver = Receiver::start(behavior(|_, _| Reply::status(503))).await;
    let config = format!(
        "listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
journal: {{ dir: {}/journal }}
destinations:
  grid:
    url: {}
    schema: eventgrid
    retry: {{ schedule: [1h], jitter: 0 }}
",
        disk.0.display(),
        receiver.url()
    );
    // Every file system but the journal's tmpfs read-only, as in a pod.
    let read_only = "mount -o remount,bind,ro / && \
        for d in /var/tmp /usr/tmp /tmp; do if mountpoint -q $d; then mount -o remount,bind,ro $d; fi; done && \
        exec \"$@\"";
    let wrapper = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        read_only,
        "sh",
    ];
    let mut courier =
        Courier::start_wrapped(&wrapper, support::courier_bin(), tmp.path(), &config, &[]).await;
    for first in (0..EVENTS).step_by(PER_REQUEST) {
        let events: Vec<String> = (first..first + PER_REQUEST)
            .map(|i| {
                format!(
                    r#"{{"id":"e{i}","eventType":"t","subject":"s","eventTime":"2026-12-04T00:00:00Z","data":{{"i":{i}}},"dataVersion":"1"}}"#
                )
            })
            .collect();
        let r = client::post(
            &courier.url("grid"),
            format!("[{}]", events.join(",")),
            &[("content-type", "application/json")],
        )
        .await;
        assert!(r.status < 300, "{} {}", r.status, r.text());
    }
    // The first start's recovery records in history what the indexer had
    // not yet; the second opens them all.
    for _ in 0..2 {
        courier.kill();
        courier.restart().await;
        let readyz = format!("{}/readyz", courier.admin_url());
        // Bounded: 10 s.
        for _ in 0..200 {
            if client::get(&readyz).await.status == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(client::get(&readyz).await.status, 200, "{}", courier.logs());
    }
    let listed = client::get(&format!("{}/v1/destinations", courier.admin_url())).await;
    let pending = listed.json()["destinations"][0]["pending"].as_u64();
    assert_eq!(pending, Some(EVENTS as u64), "{}", listed.text());
}
