//! A dead letter is written once (issue #30 item 18). An event answered
//! 400 while the dead-letter sink cannot be written has a known outcome:
//! a restart must not send it to the endpoint again, but write its record
//! once the sink works, and only once.

use std::collections::HashMap;
use std::time::{Duration, Instant};
use support::{
    Courier, Receiver, Reply, behavior, check, check_eq, config, dl_dir, eventgrid_events, fail,
    post, quiet, requests, wait_dead_letters, wait_metric,
};

const EVENTS: usize = 100;
const WAIT: Duration = Duration::from_secs(20);

/// Events recorded in the journal as to be dead-lettered, read beside the
/// running courier (WAL lets a reader in).
fn fated(c: &Courier) -> i64 {
    let db = c.dir().join("journal").join("journal.db");
    rusqlite::Connection::open(&db)
        .and_then(|conn| {
            conn.query_row(
                "SELECT COUNT(*) FROM events WHERE fate IS NOT NULL",
                [],
                |r| r.get(0),
            )
        })
        .unwrap_or_else(|e| fail!(c, "read {}: {e}", db.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_answered_400_during_a_sink_outage_are_not_sent_again_after_a_restart() {
    let rx = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    // The destination's dead-letter folder is a file: every write fails
    // (permissions would not stop root).
    let sink = dir.path().join("dl").join("orders");
    std::fs::create_dir_all(dir.path().join("dl")).expect("dead-letter root");
    std::fs::write(&sink, b"not a folder").expect("block the sink");
    let yaml = config("orders", &rx.url(), "schema: eventgrid\nconcurrency: 16");
    let mut c = Courier::start(dir.path(), &yaml).await;
    let resp = post(&c.url("orders"), eventgrid_events("e", 0, EVENTS), &[]).await;
    check!(
        c,
        resp.status < 300,
        "publish: {} {}",
        resp.status,
        resp.text()
    );
    requests(&c, &rx, EVENTS, WAIT).await;
    // Every answer is in and its outcome recorded; the records wait for
    // the sink (retried every 5 s).
    let started = Instant::now();
    // Bounded by the deadline.
    while fated(&c) < EVENTS as i64 {
        if started.elapsed() >= WAIT {
            fail!(c, "{} of {EVENTS} fates recorded", fated(&c));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.kill();
    c.restart().await;
    // Still broken: the events wait for the sink, not for the endpoint,
    // which would have them again at once.
    quiet(&c, &rx, EVENTS, Duration::from_secs(3)).await;
    check_eq!(c, fated(&c), EVENTS as i64, "fates kept across the restart");
    std::fs::remove_file(&sink).expect("mend the sink");
    let (_, _) = wait_dead_letters(&c, "orders", EVENTS, WAIT).await;
    wait_metric(
        &c,
        r#"courier_events_pending{destination="orders"}"#,
        0.0,
        WAIT,
    )
    .await;
    let (_, records) = support::read_dead_letters(&c, &dl_dir(&c, "orders"));
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for r in &records {
        *seen
            .entry(r["id"].as_str().unwrap_or_default())
            .or_default() += 1;
        if r["deadLetterReason"] != "NonRetriableStatus"
            || r["deliveryAttempts"] != 1
            || r["lastHttpStatusCode"] != 400
        {
            fail!(c, "not the record of the 400 before the restart: {r}");
        }
    }
    check_eq!(c, seen.len(), EVENTS, "events with a record");
    check!(
        c,
        seen.values().all(|&n| n == 1),
        "an event has two records"
    );
    let mut sent: HashMap<String, usize> = HashMap::new();
    for r in rx.received() {
        *sent
            .entry(r.header("webhook-id").unwrap_or_default().to_string())
            .or_default() += 1;
    }
    check_eq!(c, sent.len(), EVENTS, "events sent");
    check!(c, sent.values().all(|&n| n == 1), "an event was sent again");
}
