//! The journal's fast path opens windows in which an event lives only in
//! the intake log and memory, or its delivery is recorded but not synced.
//! Each test stretches the window (`COURIER_JOURNAL_LAG_MS`: how far the
//! indexer trails the log and how long deliveries stay unsynced) so the
//! SIGKILL lands inside it every time, then proves nothing is missing.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support::{Courier, Receiver, Reply, behavior, client, courier_bin, json_body};

/// Far longer than each test's work before its kill.
const STRETCHED: &str = "10000";

fn config(url: &str, concurrency: usize) -> String {
    support::config(
        "orders",
        &format!("{url}/hooks"),
        &format!(
            "concurrency: {concurrency}
             retry: {{ schedule: [50ms], max_attempts: 30, jitter: 0 }}
             status: {{ min_delay: {{ 5xx: 0s }} }}
             probation: {{ after_failures: 0 }}"
        ),
    )
}

async fn start(dir: &Path, yaml: &str, lag_ms: Option<&str>) -> Courier {
    let env: Vec<(&str, &str)> = lag_ms
        .map(|ms| ("COURIER_JOURNAL_LAG_MS", ms))
        .into_iter()
        .collect();
    Courier::start_with_env(courier_bin(), dir, yaml, &env).await
}

/// Posts `n` events with distinct ids and bodies; all must be acknowledged.
async fn post_all(courier: &Courier, n: usize, body_bytes: usize) -> HashMap<String, Vec<u8>> {
    let url = courier.url("orders");
    let mut posted = HashMap::new();
    for i in 0..n {
        let id = format!("evt-{i}");
        let body = json_body(body_bytes, i as u64);
        let r = client::post(
            &url,
            body.clone(),
            &[
                ("idempotency-key", &id),
                ("content-type", "application/json"),
            ],
        )
        .await;
        assert_eq!(r.status, 202, "event {i} not acknowledged: {}", r.text());
        posted.insert(id, body.to_vec());
    }
    posted
}

/// The deliveries the receiver got after its first `skip` requests, per
/// id: each with its body.
fn delivered(receiver: &Receiver, skip: usize) -> HashMap<String, Vec<Vec<u8>>> {
    let mut seen: HashMap<String, Vec<Vec<u8>>> = HashMap::new();
    for r in receiver.received().into_iter().skip(skip) {
        let id = r.header("webhook-id").unwrap_or("").to_string();
        seen.entry(id).or_default().push(r.body.to_vec());
    }
    seen
}

/// Waits (bounded) until every posted id arrived at least `times` times
/// after the receiver's first `skip` requests.
async fn wait_delivered(
    receiver: &Receiver,
    skip: usize,
    posted: &HashMap<String, Vec<u8>>,
    times: usize,
    courier: &Courier,
) -> HashMap<String, Vec<Vec<u8>>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let seen = delivered(receiver, skip);
        let short = posted
            .keys()
            .filter(|id| seen.get(*id).map_or(0, Vec::len) < times)
            .count();
        if short == 0 {
            return seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{short} of {} acknowledged events were not delivered {times} time(s)\n{}",
            posted.len(),
            courier.logs()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Every delivery of every posted event carries the bytes the app sent.
fn assert_bodies(seen: &HashMap<String, Vec<Vec<u8>>>, posted: &HashMap<String, Vec<u8>>) {
    for (id, body) in posted {
        for got in seen.get(id).into_iter().flatten() {
            assert!(got == body, "event {id} was delivered with other bytes");
        }
    }
}

/// Rows in journal.db, read beside the killed process.
fn rows(dir: &Path) -> i64 {
    let db = dir.join("journal").join("journal.db");
    let conn =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap_or_else(|e| panic!("open {}: {e}", db.display()));
    conn.query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("count rows: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_not_yet_synced_are_sent_again_after_sigkill_and_none_is_missing() {
    let receiver = Receiver::ok().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut courier = start(tmp.path(), &config(&receiver.url(), 4), Some(STRETCHED)).await;
    const EVENTS: usize = 40;
    let posted = post_all(&courier, EVENTS, 300).await;
    wait_delivered(&receiver, 0, &posted, 1, &courier).await;
    // Let courier take in the answers; the kill still comes seconds before
    // the indexer would pass these events and sync.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        rows(tmp.path()),
        0,
        "delivered from memory before the indexer got there: no event became a row"
    );
    courier.kill();
    courier.restart().await;
    let seen = wait_delivered(&receiver, 0, &posted, 2, &courier).await;
    assert_bodies(&seen, &posted);
    // The whole window was lost with the process: each delivery is repeated
    // once, as at-least-once allows, and none more.
    for (id, got) in &seen {
        assert_eq!(got.len(), 2, "event {id} delivered {} times", got.len());
    }
    assert_eq!(seen.len(), EVENTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_only_in_memory_and_the_log_survive_sigkill() {
    // The receiver holds every request, so the events are in flight or in
    // the ready queue at the kill, and none has an answer.
    let slow = Arc::new(AtomicBool::new(true));
    let s = slow.clone();
    let receiver = Receiver::start(behavior(move |_, _| {
        if s.load(Ordering::Relaxed) {
            Reply::status(200).delay(Duration::from_secs(30))
        } else {
            Reply::status(200)
        }
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut courier = start(tmp.path(), &config(&receiver.url(), 2), Some(STRETCHED)).await;
    let posted = post_all(&courier, 30, 500).await;
    assert_eq!(rows(tmp.path()), 0, "the events are in the log only");
    courier.kill();
    // Requests cut off by the kill were never answered: they do not count.
    let cut_off = receiver.received().len();
    slow.store(false, Ordering::Relaxed);
    courier.restart().await;
    let seen = wait_delivered(&receiver, cut_off, &posted, 1, &courier).await;
    assert_bodies(&seen, &posted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_beyond_the_memory_bound_while_the_index_is_behind_survive_sigkill() {
    // Paused: the events pile up past the ready queue's bound (4 MiB)
    // while the indexer trails the log by seconds.
    let receiver = Receiver::ok().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut courier = start(tmp.path(), &config(&receiver.url(), 2), Some(STRETCHED)).await;
    let pause = format!("{}/v1/destinations/orders/pause", courier.admin_url());
    let r = client::admin_post(&pause, "", &[]).await;
    assert!(r.status < 300, "pause: {} {}", r.status, r.text());
    const EVENTS: usize = 1500;
    let posted = post_all(&courier, EVENTS, 4096).await;
    let indexed = rows(tmp.path());
    assert!(
        indexed < EVENTS as i64,
        "the index is meant to be behind the log at the kill, it holds {indexed} of {EVENTS}"
    );
    assert!(receiver.received().is_empty(), "paused, yet delivered");
    courier.kill();
    // The pause outlives the process: lifted after the restart, it delivers.
    courier.restart().await;
    let resume = format!("{}/v1/destinations/orders/resume", courier.admin_url());
    let r = client::admin_post(&resume, "", &[]).await;
    assert!(r.status < 300, "resume: {} {}", r.status, r.text());
    let seen = wait_delivered(&receiver, 0, &posted, 1, &courier).await;
    assert_bodies(&seen, &posted);
}

/// An event retried while the rest of its intake log segment is delivered:
/// its row pointed into that segment, then the event was copied into the
/// row and the segment was given back and reused. A SIGKILL after that
/// loses nothing: the event is delivered after the restart, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_copied_out_of_a_reused_segment_survives_sigkill() {
    let failing = Arc::new(AtomicBool::new(true));
    let f = failing.clone();
    let receiver = Receiver::start(behavior(move |r, _| {
        if f.load(Ordering::Relaxed) && r.header("webhook-id") == Some("evt-slow") {
            Reply::status(503)
        } else {
            Reply::status(200)
        }
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = support::config(
        "orders",
        &format!("{}/hooks", receiver.url()),
        "concurrency: 4
         retry: { schedule: [1s], max_attempts: 30, jitter: 0 }
         status: { min_delay: { 503: 0s } }
         probation: { after_failures: 0 }",
    );
    let mut courier = start(tmp.path(), &yaml, None).await;
    let url = courier.url("orders");
    let slow = json_body(1000, 7);
    let r = client::post(
        &url,
        slow.clone(),
        &[
            ("idempotency-key", "evt-slow"),
            ("content-type", "application/json"),
        ],
    )
    .await;
    assert_eq!(r.status, 202);
    let first = tmp
        .path()
        .join("journal")
        .join("intake-0000000000000000.log");
    assert!(first.exists(), "the first segment is {}", first.display());
    let db = tmp.path().join("journal").join("journal.db");
    let placed = || -> Option<bool> {
        let conn =
            rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .ok()?;
        conn.query_row(
            "SELECT at IS NOT NULL FROM events WHERE id = 'evt-slow'",
            [],
            |r| r.get(0),
        )
        .ok()
    };
    // 64 KiB events, delivered at once, fill the first segment and go on
    // until it has been spilled, freed and reused under another name.
    let mut pointed = false;
    // Spills are looked for each second: past the first 40 MiB, slower.
    for i in 0..2000u64 {
        pointed |= placed() == Some(true);
        if !first.exists() {
            break;
        }
        let r = client::post(&url, json_body(64 * 1024, i), &[]).await;
        assert_eq!(r.status, 202, "{}", r.text());
        if i > 600 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert!(
        pointed,
        "the retried event's row never pointed into the log"
    );
    assert!(
        !first.exists(),
        "the first segment was never reused\n{}",
        courier.logs()
    );
    assert_eq!(
        placed(),
        Some(false),
        "the event was not copied into its row"
    );
    courier.kill();
    let before = receiver.received().len();
    failing.store(false, Ordering::Relaxed);
    courier.restart().await;
    let posted = HashMap::from([("evt-slow".to_string(), slow.to_vec())]);
    let seen = wait_delivered(&receiver, before, &posted, 1, &courier).await;
    assert_bodies(&seen, &posted);
}
