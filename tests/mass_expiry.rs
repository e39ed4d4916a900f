//! Mass expiry at speed (issue #12, item 4): a paused destination's backlog
//! whose TTL runs out is dead-lettered in groups (one sink append and sync,
//! one journal commit per group), each event exactly once. The rate is the
//! benchmark's (`cargo bench --bench courier_bench -- --steps x`); this test
//! bounds the wait only so far that one sync per event would miss it.

mod support;

use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use support::{
    Courier, Receiver, check, check_eq, config, dl_dir, fail, metric, post, proc_status,
    read_dead_letters,
};

const EVENTS: usize = 100_000;
const PER_REQUEST: usize = 1000;
/// One fsync per event took about 60 s for 100,000 here; groups take ~5 s.
const DEADLINE: Duration = Duration::from_secs(40);
/// Two runtime workers, the journal's writer and indexer, the log writer,
/// and a few blocking threads for index reads and the two expiry groups'
/// sink writes.
const MAX_THREADS: u64 = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_backlog_past_its_ttl_is_dead_lettered_each_event_once() {
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = config(
        "orders",
        &rx.url(),
        "schema: eventgrid\nconcurrency: 64\nretry: { event_ttl: 1m }",
    )
    .replacen("log: { level: debug }", "log: { level: info }", 1);
    let mut c = Courier::start(dir.path(), &yaml).await;
    let pause = post(
        &format!("{}/v1/destinations/orders/pause", c.admin_url()),
        "",
        &[],
    )
    .await;
    check_eq!(c, pause.status, 200, "{}", pause.text());
    for r in 0..EVENTS / PER_REQUEST {
        let events: Vec<Value> = (0..PER_REQUEST)
            .map(|i| json!({"id": format!("e{}", r * PER_REQUEST + i), "subject": "s", "eventType": "t", "eventTime": "2026-11-23T09:00:00Z", "data": {"n": i}, "dataVersion": "1"}))
            .collect();
        let resp = post(&c.url("orders"), Value::Array(events).to_string(), &[]).await;
        check!(
            c,
            resp.status < 300,
            "publish {r}: {} {}",
            resp.status,
            resp.text()
        );
    }
    // Stopped, every event is made 61 s older: its 1 m TTL has run out.
    c.terminate();
    c.wait_exit(Duration::from_secs(30)).await;
    let db = dir.path().join("journal").join("journal.db");
    let aged = rusqlite::Connection::open(&db)
        .and_then(|conn| conn.execute("UPDATE events SET accepted_ms = accepted_ms - 61000", []))
        .unwrap_or_else(|e| fail!(c, "age the events in {}: {e}", db.display()));
    check_eq!(c, aged, EVENTS, "rows aged");
    let started = Instant::now();
    c.restart().await;
    let series =
        r#"courier_events_dead_lettered_total{destination="orders",reason="TimeToLiveExceeded"}"#;
    let mut threads = 0;
    // Bounded by the deadline.
    loop {
        threads = threads.max(proc_status(c.pid(), "Threads").unwrap_or(0));
        let dead = metric(&c.admin_url(), series).await.unwrap_or(0.0);
        if dead >= EVENTS as f64 {
            break;
        }
        if started.elapsed() >= DEADLINE {
            fail!(c, "{dead} of {EVENTS} dead-lettered within {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "{EVENTS} expired events dead-lettered {:?} after the restart, at most {threads} threads",
        started.elapsed()
    );
    // Events read into memory before they were seen as expired once went
    // one task and one blocking sink write each: 76 threads here (waiting
    // on the sink's lock), and 166–195 MiB of RSS with 1 KiB events.
    check!(
        c,
        threads <= MAX_THREADS,
        "{threads} threads while dead-lettering: expired events are not written in groups"
    );
    let (_, records) = read_dead_letters(&c, &dl_dir(&c, "orders"));
    check_eq!(c, records.len(), EVENTS, "records");
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for r in &records {
        *seen
            .entry(r["id"].as_str().unwrap_or_default())
            .or_default() += 1;
        if r["deadLetterReason"] != "TimeToLiveExceeded" || r["deliveryAttempts"] != 0 {
            fail!(c, "not a TTL dead letter of an unattempted event: {r}");
        }
    }
    check_eq!(c, seen.len(), EVENTS, "distinct ids");
    check!(
        c,
        seen.values().all(|&n| n == 1),
        "an event was dead-lettered twice"
    );
    check!(
        c,
        (0..EVENTS).all(|i| seen.contains_key(format!("e{i}").as_str())),
        "an id is missing"
    );
    check_eq!(c, rx.count(), 0, "a paused destination was sent to");
    let pending = metric(
        &c.admin_url(),
        r#"courier_events_pending{destination="orders"}"#,
    )
    .await;
    check_eq!(c, pending, Some(0.0));
}
