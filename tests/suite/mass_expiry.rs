//! Mass expiry at speed (issue #12, item 4): a paused destination's backlog
//! whose TTL runs out is dead-lettered in groups (one sink append and sync,
//! one journal commit per group), each event exactly once. The rate is the
//! benchmark's (`cargo bench --bench courier_bench -- --steps x`); this test
//! bounds the wait only so far that one sync per event would miss it.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};
use support::{
    Courier, Receiver, check, check_eq, config, dl_dir, eventgrid_events, fail, metric, post,
    proc_status, read_dead_letters, wait_metric,
};

const EVENTS: usize = 100_000;
const PER_REQUEST: usize = 1000;
/// One fsync per event took about 60 s for 100,000 here; groups take ~5 s.
const DEADLINE: Duration = Duration::from_secs(40);
/// Beyond the runtime's workers (one per core): the main thread, the
/// journal's writer, indexer and checkpointer, the log writer, the config
/// watcher, and a few blocking threads for index reads and the two expiry
/// groups' sink writes (~10 in all on 2 cores).
const MAX_OTHER_THREADS: u64 = 22;

/// Pauses or resumes the destination `orders` through the admin API.
async fn orders(c: &Courier, verb: &str) {
    let url = format!("{}/v1/destinations/orders/{verb}", c.admin_url());
    let resp = support::admin_post(&url, "", &[]).await;
    check_eq!(c, resp.status, 200, "{verb}: {}", resp.text());
}

/// A stopped courier whose paused destination `orders` holds `n` events
/// (ids `old0`…) made 61 s older while it was stopped: past their 1 m TTL.
async fn aged_backlog(rx: &Receiver, dir: &Path, extra: &str, n: usize) -> Courier {
    let yaml = config(
        "orders",
        &rx.url(),
        &format!("schema: eventgrid\nretry: {{ event_ttl: 1m }}\n{extra}"),
    )
    .replacen("log: { level: debug }", "log: { level: info }", 1);
    let mut c = Courier::start(dir, &yaml).await;
    orders(&c, "pause").await;
    for from in (0..n).step_by(PER_REQUEST) {
        let body = eventgrid_events("old", from, PER_REQUEST.min(n - from));
        let resp = post(&c.url("orders"), body, &[]).await;
        check!(
            c,
            resp.status < 300,
            "publish from {from}: {} {}",
            resp.status,
            resp.text()
        );
    }
    c.terminate();
    c.wait_exit(Duration::from_secs(30)).await;
    let db = dir.join("journal").join("journal.db");
    let aged = rusqlite::Connection::open(&db)
        .and_then(|conn| conn.execute("UPDATE events SET accepted_ms = accepted_ms - 61000", []))
        .unwrap_or_else(|e| fail!(c, "age the events in {}: {e}", db.display()));
    check_eq!(c, aged, n, "rows aged");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_backlog_past_its_ttl_is_dead_lettered_each_event_once() {
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = aged_backlog(&rx, dir.path(), "concurrency: 64", EVENTS).await;
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
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    check!(
        c,
        threads <= cores + MAX_OTHER_THREADS,
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
        (0..EVENTS).all(|i| seen.contains_key(format!("old{i}").as_str())),
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

/// While the dead-letter sink fails (its writes retried for 10 minutes),
/// expired events wait for it in memory, a group's worth at most, and the
/// live events behind them are still delivered. Dead-lettering each
/// expired event in a task of its own held every slot instead, and
/// waiting at the front for a free group stopped delivery outright.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_events_are_delivered_while_expired_ones_wait_for_a_failing_sink() {
    const EXPIRED: usize = 2500;
    const LIVE: usize = 50;
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = aged_backlog(&rx, dir.path(), "", EXPIRED).await;
    // The destination's dead-letter folder is a file: every write fails.
    let sink = dl_dir(&c, "orders");
    if let Some(parent) = sink.parent() {
        std::fs::create_dir_all(parent).expect("dead-letter root");
    }
    std::fs::write(&sink, b"not a folder").expect("block the sink");
    c.restart().await;
    let resp = post(&c.url("orders"), eventgrid_events("live", 0, LIVE), &[]).await;
    check!(
        c,
        resp.status < 300,
        "publish: {} {}",
        resp.status,
        resp.text()
    );
    orders(&c, "resume").await;
    let Some(got) = rx.try_wait_for(LIVE, Duration::from_secs(20)).await else {
        let state = support::get(&format!("{}/v1/destinations", c.admin_url())).await;
        fail!(
            c,
            "{} of {LIVE} live events delivered while expired ones wait for the sink; {}",
            rx.count(),
            state.text()
        );
    };
    for r in &got {
        let id = r.json()[0]["id"].as_str().unwrap_or_default().to_string();
        check!(c, id.starts_with("live"), "an expired event was sent: {id}");
    }
    check!(
        c,
        c.logged(
            |l| l.contains("cannot write the dead letter; retrying"),
            Duration::from_secs(5)
        )
        .await,
        "the sink did not fail as the test meant"
    );
    // The expired events stay pending, the live ones' deletes recorded.
    wait_metric(
        &c,
        r#"courier_events_pending{destination="orders"}"#,
        EXPIRED as f64,
        Duration::from_secs(10),
    )
    .await;
}

/// Bytes in the destination's day files: a cheap look at whether the
/// expiry has begun writing, polled faster than the records could be read.
fn sink_bytes(sink: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(sink) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// The pending events in the journal of a killed courier: id, and whether
/// its fate (a dead-lettering decided) is recorded.
fn pending_fates(c: &Courier) -> HashMap<String, bool> {
    let db = c.dir().join("journal").join("journal.db");
    let read = || -> rusqlite::Result<HashMap<String, bool>> {
        let conn = rusqlite::Connection::open(&db)?;
        let mut stmt = conn.prepare("SELECT id, fate IS NOT NULL FROM events")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect()
    };
    read().unwrap_or_else(|e| fail!(c, "read {}: {e}", db.display()))
}

/// Issue #30 item 18: SIGKILL in the middle of a mass expiry of 10,000
/// events, then a restart, and each event's dead letter is in the sink
/// exactly once. The kill comes once the first group's records are in the
/// sink; an event whose record was written but whose delete was not yet
/// committed must have its fate in the journal (recorded before the write),
/// so that the restart finds its record instead of writing it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_during_a_mass_expiry_leaves_each_dead_letter_once() {
    const N: usize = 10_000;
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = aged_backlog(&rx, dir.path(), "", N).await;
    let sink = dl_dir(&c, "orders");
    c.restart().await;
    let started = Instant::now();
    let mut first_group = 0;
    // Bounded by the deadline: killed once about four groups of a
    // thousand are written, halfway through.
    loop {
        let bytes = sink_bytes(&sink);
        if first_group == 0 {
            first_group = bytes;
        }
        if first_group > 0 && bytes >= 4 * first_group {
            break;
        }
        if started.elapsed() >= DEADLINE {
            fail!(c, "{bytes} bytes of dead letters within {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    c.kill();
    let (_, at_kill) = read_dead_letters(&c, &sink);
    let written: HashMap<String, usize> = at_kill.iter().fold(HashMap::new(), |mut m, r| {
        *m.entry(r["id"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
        m
    });
    let pending = pending_fates(&c);
    let both: Vec<&String> = written
        .keys()
        .filter(|id| pending.contains_key(*id))
        .collect();
    let fated = pending.values().filter(|f| **f).count();
    eprintln!(
        "at the kill: {} records, {} pending ({fated} fated), {} both written and pending",
        at_kill.len(),
        pending.len(),
        both.len()
    );
    check!(
        c,
        !at_kill.is_empty() && at_kill.len() < N,
        "the kill was meant to come mid-expiry: {} of {N} records",
        at_kill.len()
    );
    check!(
        c,
        written.values().all(|&n| n == 1),
        "a record written twice before the kill"
    );
    check!(
        c,
        both.iter().all(|id| pending[*id]),
        "an event was written to the sink before its fate was recorded"
    );
    check_eq!(c, written.len() + pending.len() - both.len(), N, "events");

    c.restart().await;
    wait_metric(
        &c,
        r#"courier_events_pending{destination="orders"}"#,
        0.0,
        DEADLINE,
    )
    .await;
    let (_, records) = read_dead_letters(&c, &sink);
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for r in &records {
        *seen
            .entry(r["id"].as_str().unwrap_or_default())
            .or_default() += 1;
    }
    let twice = seen.values().filter(|&&n| n > 1).count();
    check_eq!(c, twice, 0, "events with more than one record");
    check!(
        c,
        (0..N).all(|i| seen.contains_key(format!("old{i}").as_str())),
        "an event has no record"
    );
    check_eq!(c, records.len(), N, "records");
    check_eq!(c, rx.count(), 0, "a paused destination was sent to");
}
