//! Nothing acknowledged is ever lost: SIGKILL and SIGTERM in the middle of
//! work, then a restart, and every event that got a 202 is delivered.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use support::{Courier, Receiver, Reply, behavior, client, metric, receiver};

/// How long before a kill an answered delivery may still be unsynced.
const UNSYNCED: Duration = Duration::from_millis(1000);

fn config(url: &str, extra: &str) -> String {
    format!(
        "listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
shutdown_grace: 2s
journal: {{ dir: ./journal }}
dead_letter: {{ dir: ./dl }}
destinations:
  orders:
    url: {url}/hooks
    concurrency: 4
    retry: {{ schedule: [100ms], max_attempts: 30, jitter: 0 }}
    status: {{ min_delay: {{ 5xx: 0s }} }}
    probation: {{ after_failures: 0 }}
{extra}"
    )
}

/// The ids of the events a receiver got, with how often each arrived.
fn ids(receiver: &Receiver) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for r in receiver.received() {
        *seen
            .entry(r.header("webhook-id").unwrap_or("").to_string())
            .or_default() += 1;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_event_survives_sigkill_mid_stream() {
    // Slow at first, so that most accepted events are still pending at the kill.
    let slow = Arc::new(AtomicBool::new(true));
    let s = slow.clone();
    let receiver = Receiver::start(behavior(move |_, _| {
        if s.load(Ordering::Relaxed) {
            Reply::status(200).delay(Duration::from_millis(50))
        } else {
            Reply::status(200)
        }
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut courier = Courier::start(tmp.path(), &config(&receiver.url(), "")).await;
    let url = courier.url("orders");

    const EVENTS: usize = 1000;
    let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let mut posts = tokio::task::JoinSet::new();
    for worker in 0..50 {
        let (url, acked, count) = (url.clone(), acked.clone(), count.clone());
        posts.spawn(async move {
            for i in 0..EVENTS / 50 {
                let id = format!("evt-{worker}-{i}");
                let body = posted_body(&id);
                match client::try_post(
                    &url,
                    body,
                    &[
                        ("idempotency-key", &id),
                        ("content-type", "application/json"),
                    ],
                )
                .await
                {
                    Ok(r) if r.status == 202 => {
                        acked.lock().expect("lock").push(id);
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    // Refused or cut off by the kill: not acknowledged, may be lost.
                    _ => {}
                }
            }
        });
    }
    for _ in 0..2000 {
        if count.load(Ordering::Relaxed) >= 300 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let signalled = std::time::Instant::now();
    courier.kill();
    let kills = [(signalled, std::time::Instant::now())];
    while posts.join_next().await.is_some() {}
    let acked: HashSet<String> = acked.lock().expect("lock").iter().cloned().collect();
    // Delivered before the kill: answered in full while courier was up (an
    // attempt the kill cut off must be made again after the restart).
    let before_restart = answered_ids(&receiver, &kills).len();
    assert!(
        acked.len() >= 300,
        "only {} events were acknowledged before the kill",
        acked.len()
    );
    assert!(
        before_restart < acked.len(),
        "everything was delivered before the kill; the test proves nothing"
    );

    slow.store(false, Ordering::Relaxed);
    courier.restart().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let missing = loop {
        let seen = answered_ids(&receiver, &kills);
        let missing: Vec<&String> = acked.iter().filter(|id| !seen.contains(*id)).collect();
        if missing.is_empty() || tokio::time::Instant::now() > deadline {
            break missing.len();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let seen = ids(&receiver);
    let duplicates: usize = seen.values().map(|n| n - 1).sum();
    println!(
        "acknowledged {}, delivered before the kill {before_restart}, duplicates after restart {duplicates}",
        acked.len()
    );
    assert_eq!(
        missing,
        0,
        "acknowledged events lost after SIGKILL (not answered in full before the kill nor after the restart)\n{}",
        courier.logs()
    );
    // Every delivery carries the bytes that were posted under its id.
    for r in receiver.received() {
        let id = r.header("webhook-id").unwrap_or("");
        assert_eq!(
            r.body,
            posted_body(id).into_bytes(),
            "{id}: the delivered body differs from the posted one"
        );
    }
    // Deliveries are recorded lazily: one answered within UNSYNCED before
    // the kill (the indexer's lag plus its sync interval, 200 ms, with room
    // for a loaded CI machine), or cut off by it, may go out again after
    // the restart. Any other repeat means courier sent again an event whose
    // delivery it had recorded.
    let unexplained = receiver::unexplained_repeats(&receiver.received(), &kills, UNSYNCED);
    assert_eq!(
        unexplained, 0,
        "{duplicates} duplicate deliveries after the kill, {unexplained} of them answered more than {UNSYNCED:?} before it"
    );
}

/// The body posted under `id` in the SIGKILL test.
fn posted_body(id: &str) -> String {
    format!("{{\"n\":\"{id}\"}}")
}

/// The ids with at least one delivery answered in full within one life of
/// courier (no kill between its arrival and the end of its answer).
fn answered_ids(
    receiver: &Receiver,
    kills: &[(std::time::Instant, std::time::Instant)],
) -> HashSet<String> {
    receiver
        .received()
        .into_iter()
        .filter(|r| r.answered_within_life(kills))
        .filter_map(|r| r.header("webhook-id").map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_zero_and_attempt_counts_resume_after_restart() {
    let failing = Arc::new(AtomicBool::new(true));
    let f = failing.clone();
    let receiver = Receiver::start(behavior(move |_, _| {
        if f.load(Ordering::Relaxed) {
            Reply::status(503)
        } else {
            Reply::status(200)
        }
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut courier = Courier::start(tmp.path(), &config(&receiver.url(), "")).await;
    for i in 0..5 {
        let r = client::post(
            &courier.url("orders"),
            format!("{{\"i\":{i}}}"),
            &[("idempotency-key", &format!("t-{i}"))],
        )
        .await;
        assert_eq!(r.status, 202);
    }
    // Every event has failed at least twice.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while ids(&receiver).values().filter(|n| **n >= 2).count() < 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "events were not retried\n{}",
            courier.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    courier.terminate();
    let started = std::time::Instant::now();
    let status = courier.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(0), "{}", courier.logs());
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "shutdown took {:?}",
        started.elapsed()
    );
    let attempts_before: HashMap<String, u32> = max_attempt_by_id(&receiver);

    failing.store(false, Ordering::Relaxed);
    let delivered_before = receiver.count();
    courier.restart().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let after: Vec<_> = receiver
            .received()
            .into_iter()
            .skip(delivered_before)
            .collect();
        let done: HashSet<String> = after
            .iter()
            .filter_map(|r| r.header("webhook-id").map(str::to_string))
            .collect();
        if done.len() == 5 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pending events not delivered after restart\n{}",
            courier.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The attempt count went on from where it was: attempt N+1 (or later, if
    // an attempt was in flight at SIGTERM), never 1 again.
    for r in receiver.received().into_iter().skip(delivered_before) {
        let id = r.header("webhook-id").expect("id").to_string();
        let attempt: u32 = r
            .header("courier-delivery-attempt")
            .and_then(|a| a.parse().ok())
            .expect("attempt");
        assert!(
            attempt > attempts_before[&id],
            "{id}: attempt {attempt} after {} before restart",
            attempts_before[&id]
        );
    }
}

fn max_attempt_by_id(receiver: &Receiver) -> HashMap<String, u32> {
    let mut max = HashMap::new();
    for r in receiver.received() {
        let id = r.header("webhook-id").unwrap_or("").to_string();
        let n: u32 = r
            .header("courier-delivery-attempt")
            .and_then(|a| a.parse().ok())
            .unwrap_or(0);
        let e = max.entry(id).or_insert(0);
        *e = (*e).max(n);
    }
    max
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_is_quarantined_not_delivered_and_the_rest_goes_on() {
    let receiver = Receiver::start(behavior(|_, _| Reply::status(200))).await;
    let down = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let down_url = format!("http://{}", down.local_addr().expect("addr"));
    drop(down);
    let tmp = tempfile::tempdir().expect("tempdir");
    // First run: the endpoint is down, so both events stay pending.
    let mut courier = Courier::start(tmp.path(), &config(&down_url, "")).await;
    for id in ["good", "bad"] {
        let r = client::post(
            &courier.url("orders"),
            format!("{{\"id\":\"{id}\"}}"),
            &[("idempotency-key", id)],
        )
        .await;
        assert_eq!(r.status, 202);
    }
    courier.terminate();
    assert_eq!(
        courier.wait_exit(Duration::from_secs(10)).await.code(),
        Some(0)
    );

    // Change the body of one event where the journal keeps it (the intake
    // log, where its row points), behind courier's back.
    let dir = tmp.path().join("journal");
    let conn = rusqlite::Connection::open(dir.join("journal.db")).expect("open journal");
    let (at, len): (i64, i64) = conn
        .query_row("SELECT at, len FROM events WHERE id = 'bad'", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .expect("the second event's place");
    drop(conn);
    let (start, segment) = std::fs::read_dir(&dir)
        .expect("list")
        .filter_map(|e| {
            let path = e.expect("entry").path();
            let name = path.file_name()?.to_str()?.to_string();
            let hex = name.strip_prefix("intake-")?.strip_suffix(".log")?;
            Some((i64::from_str_radix(hex, 16).ok()?, path))
        })
        .filter(|(start, _)| *start <= at)
        .max()
        .expect("the segment holding it");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&segment)
            .expect("open segment");
        // The body ends the encoding: `{"id":"bad"}` becomes `{"id":"bod"}`.
        let offset = (at + len - 4 - start) as u64;
        let mut byte = [0u8; 1];
        f.read_exact_at(&mut byte, offset).expect("read");
        assert_eq!(&byte, b"a");
        f.write_all_at(b"o", offset).expect("write");
    }

    std::fs::write(tmp.path().join("courier.yaml"), config(&receiver.url(), "")).expect("config");
    courier.restart().await;
    let got = receiver.wait_for(1, Duration::from_secs(10)).await;
    receiver.assert_quiet(1, Duration::from_millis(500)).await;
    assert_eq!(got[0].header("webhook-id"), Some("good"));
    let corrupt = metric(
        &courier.admin_url(),
        r#"courier_journal_corrupt_records_total{destination="orders"}"#,
    )
    .await;
    assert_eq!(corrupt, Some(1.0), "{}", courier.logs());
    assert!(
        courier.logs().contains("journal record is corrupt"),
        "{}",
        courier.logs()
    );
    courier.terminate();
    assert_eq!(
        courier.wait_exit(Duration::from_secs(10)).await.code(),
        Some(0)
    );

    // The record is kept for an operator, and inspect reports it.
    let out = support::run_cli(
        None,
        &[
            "journal",
            "inspect",
            "--dir",
            &tmp.path().join("journal").display().to_string(),
        ],
        &[],
    )
    .await;
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("corrupt record: record seq"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("of the intake log is missing or damaged"),
        "{}",
        out.stdout
    );
}

/// Regression: after a clean stop the intake log resumes in a fresh segment
/// (and reuses the old one); a crash after that must still replay what the
/// new segment holds. 2,000 events acknowledged, SIGKILL at once (the indexer, at lower
/// priority, is then still behind the log), restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_acknowledged_after_a_clean_restart_survive_sigkill() {
    let receiver = Receiver::start(behavior(|_, _| Reply::status(503))).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut courier = Courier::start(tmp.path(), &config(&receiver.url(), "")).await;
    let first = client::post(
        &courier.url("orders"),
        "{}",
        &[("idempotency-key", "before")],
    )
    .await;
    assert_eq!(first.status, 202);
    courier.terminate();
    courier.wait_exit(Duration::from_secs(10)).await;
    courier.restart().await;

    let url = courier.url("orders");
    let posts: Vec<_> = (0..2000)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                let id = format!("after-{i}");
                let r = client::post(&url, "{}", &[("idempotency-key", &id)]).await;
                (id, r.status)
            })
        })
        .collect();
    let mut acked = HashSet::new();
    for p in posts {
        let (id, status) = p.await.expect("post task");
        assert_eq!(status, 202, "{id}");
        acked.insert(id);
    }
    courier.kill();
    receiver.stop().await;
    let healthy = Receiver::start_on(receiver.addr(), behavior(|_, _| Reply::status(200))).await;
    courier.restart().await;
    acked.insert("before".to_string());
    // Bounded by the receiver's wait.
    healthy.wait_for(acked.len(), Duration::from_secs(20)).await;
    let got: HashSet<String> = ids(&healthy).into_keys().collect();
    let missing: Vec<_> = acked.difference(&got).collect();
    assert!(
        missing.is_empty(),
        "lost after restart: {missing:?}\n{}",
        courier.logs()
    );
}

/// Copies the journal's SQLite files while courier is stopped (SIGSTOP), so
/// that putting them back later rolls SQLite back to before the events that
/// follow: they are then in the intake log only, as after a crash that beat
/// the indexer.
fn snapshot_sqlite(courier: &mut Courier, journal: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("snapshot dir");
    courier.signal(libc::SIGSTOP);
    for f in ["journal.db", "journal.db-wal"] {
        if journal.join(f).exists() {
            std::fs::copy(journal.join(f), to.join(f)).expect("copy");
        }
    }
    courier.signal(libc::SIGCONT);
}

fn restore_sqlite(from: &std::path::Path, journal: &std::path::Path) {
    for f in ["journal.db", "journal.db-wal", "journal.db-shm"] {
        let _ = std::fs::remove_file(journal.join(f));
        if from.join(f).exists() {
            std::fs::copy(from.join(f), journal.join(f)).expect("restore");
        }
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("list") {
        let entry = entry.expect("entry");
        // The disk reserve is only space, 64 MiB of it.
        if entry.file_name() == "reserve" {
            continue;
        }
        // The event history's partitions, as a folder of their own.
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
            continue;
        }
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
    }
}

/// Twenty events acknowledged and in the intake log only; then the log's
/// active segment is truncated. The start must refuse, naming the file and
/// the 20 events, and `journal inspect` must say the same; the same journal
/// without the damage delivers all twenty (so the 20 really were there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_intake_log_tail_stops_the_start_and_names_the_lost_events() {
    let (_closed, port) = support::setup::refusing_port();
    let tmp = tempfile::tempdir().expect("tempdir");
    let url = format!("http://127.0.0.1:{port}");
    let mut courier = Courier::start(
        tmp.path(),
        &config(&url, "").replace("schedule: [100ms]", "schedule: [1h]"),
    )
    .await;
    let journal = tmp.path().join("journal");
    tokio::time::sleep(Duration::from_millis(300)).await;
    snapshot_sqlite(&mut courier, &journal, &tmp.path().join("before"));
    for i in 0..20 {
        let r = client::post(
            &courier.url("orders"),
            "{}",
            &[("idempotency-key", &format!("t{i}"))],
        )
        .await;
        assert_eq!(r.status, 202, "{}", r.text());
    }
    courier.kill();
    restore_sqlite(&tmp.path().join("before"), &journal);
    let undamaged = tmp.path().join("undamaged");
    copy_dir(&journal, &undamaged);

    let segments: Vec<_> = std::fs::read_dir(&journal)
        .expect("list")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("intake-"))
        })
        .collect();
    let active = segments.iter().max().expect("a segment");
    std::fs::OpenOptions::new()
        .write(true)
        .open(active)
        .and_then(|f| f.set_len(0))
        .expect("truncate the active segment");

    let config_path = courier.config_path().display().to_string();
    let out = support::run_cli(None, &["run", "-c", &config_path], &[]).await;
    assert_eq!(out.code, 2, "{}", out.show());
    assert!(
        out.stderr.contains("lost 20 acknowledged events"),
        "{}",
        out.show()
    );
    assert!(
        out.stderr.contains(&active.display().to_string()),
        "names {}: {}",
        active.display(),
        out.show()
    );
    let inspect = support::run_cli(
        None,
        &[
            "journal",
            "inspect",
            "--dir",
            &journal.display().to_string(),
        ],
        &[],
    )
    .await;
    assert_eq!(inspect.code, 2, "{}", inspect.show());
    assert!(
        inspect
            .stdout
            .contains("20 acknowledged events are missing"),
        "{}",
        inspect.show()
    );

    // The control: the same files, undamaged, deliver every one.
    let receiver = Receiver::ok().await;
    let other = tempfile::tempdir().expect("tempdir");
    std::fs::rename(&undamaged, other.path().join("journal")).expect("move");
    let courier = Courier::start(other.path(), &config(&receiver.url(), "")).await;
    let got = receiver.wait_for(20, Duration::from_secs(10)).await;
    let ids: HashSet<String> = got
        .iter()
        .filter_map(|r| r.header("webhook-id").map(str::to_string))
        .collect();
    assert_eq!(ids.len(), 20, "{}", courier.logs());
}

/// `POST {admin}/v1/destinations/orders/{action}`, which must succeed.
async fn orders(courier: &Courier, action: &str) {
    let url = format!("{}/v1/destinations/orders/{action}", courier.admin_url());
    let resp = client::admin_post(&url, "{}", &[("content-type", "application/json")]).await;
    assert_eq!(resp.status, 200, "{url}: {}", resp.text());
}

/// Reads one answer's status line from a kept-alive connection.
async fn status_line(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .expect("an answer")
        .expect("read");
    let text = String::from_utf8_lossy(&buf[..n]);
    text.lines().next().unwrap_or("").to_string()
}

/// A keep-alive connection idle for a second is held without hyper
/// (`server::rest`) and served again by a new hyper connection when it
/// speaks: the events it gets a 202 for on it, one of them sent with its
/// head split across the rest, are delivered after a SIGKILL.
#[tokio::test]
async fn events_acknowledged_on_a_connection_back_from_rest_survive_sigkill() {
    use tokio::io::AsyncWriteExt;
    let receiver = Receiver::start(behavior(|_, _| Reply::status(200))).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut courier = Courier::start(tmp.path(), &config(&receiver.url(), "")).await;
    // Paused (which survives the restart), so that nothing is delivered
    // or runs out of attempts before the kill.
    orders(&courier, "pause").await;
    let rest = Duration::from_millis(1500);
    let request = |id: &str| {
        format!(
            "POST /orders HTTP/1.1\r\nhost: 127.0.0.1\r\nidempotency-key: {id}\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}"
        )
    };
    let mut kept = tokio::net::TcpStream::connect(courier.ingress_addr())
        .await
        .expect("connect");
    kept.write_all(request("rest-1").as_bytes())
        .await
        .expect("write");
    assert!(status_line(&mut kept).await.starts_with("HTTP/1.1 202"));
    tokio::time::sleep(rest).await;
    // Back from rest with a whole request.
    kept.write_all(request("rest-2").as_bytes())
        .await
        .expect("write");
    assert!(status_line(&mut kept).await.starts_with("HTTP/1.1 202"));
    tokio::time::sleep(rest).await;
    // A head cut in two by a rest: its first part is kept for the next
    // hyper connection.
    let third = request("rest-3");
    let (first, second) = third.split_at(30);
    kept.write_all(first.as_bytes()).await.expect("write");
    tokio::time::sleep(rest).await;
    kept.write_all(second.as_bytes()).await.expect("write");
    let answer = status_line(&mut kept).await;
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");

    courier.kill();
    courier.restart().await;
    orders(&courier, "resume").await;
    receiver.wait_for(3, Duration::from_secs(20)).await;
    let got = ids(&receiver);
    for id in ["rest-1", "rest-2", "rest-3"] {
        assert!(
            got.contains_key(id),
            "{id} lost: {got:?}\n{}",
            courier.logs()
        );
    }
}

/// The events of a paused destination go into the log packed
/// (journal/pack.rs): 400 JSON bodies of ~48 KiB, 19 MiB as sent, fit the
/// first 16 MiB segment. Each got a 202; after a SIGKILL and a restart
/// each is delivered with the very bytes the app sent.
#[tokio::test]
async fn packed_events_of_a_paused_destination_survive_sigkill_byte_for_byte() {
    let receiver = Receiver::start(behavior(|_, _| Reply::status(200))).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut courier = Courier::start(tmp.path(), &config(&receiver.url(), "")).await;
    orders(&courier, "pause").await;
    let body = |i: usize| {
        let items: Vec<String> = (0..1700)
            .map(|k| format!(r#"{{"sku":"S-{i}-{k}","qty":{}}}"#, (i + k) % 9))
            .collect();
        format!(r#"{{"order":{i},"items":[{}]}}"#, items.join(","))
    };
    let mut sent = HashMap::new();
    for i in 0..400 {
        let key = format!("packed-{i}");
        let resp = client::post(
            &courier.url("orders"),
            body(i),
            &[
                ("content-type", "application/json"),
                ("idempotency-key", &key),
            ],
        )
        .await;
        assert_eq!(resp.status, 202, "{}", resp.text());
        sent.insert(key, body(i));
    }
    let raw: usize = sent.values().map(String::len).sum();
    assert!(raw > 18 << 20, "{raw} bytes sent");
    let segments = std::fs::read_dir(tmp.path().join("journal"))
        .expect("journal dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("intake-"))
        .count();
    assert_eq!(segments, 1, "{raw} bytes sent took {segments} segments");

    courier.kill();
    courier.restart().await;
    orders(&courier, "resume").await;
    receiver.wait_for(400, Duration::from_secs(30)).await;
    let got: HashMap<String, bytes::Bytes> = receiver
        .received()
        .into_iter()
        .map(|r| (r.header("webhook-id").unwrap_or("").to_string(), r.body))
        .collect();
    for (key, body) in &sent {
        assert_eq!(
            got.get(key).map(|b| b.as_ref()),
            Some(body.as_bytes()),
            "{key}\n{}",
            courier.logs()
        );
    }
}
