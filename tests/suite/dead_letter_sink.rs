//! A dead-letter sink that cannot be written (issue #30, item 16): the
//! events stay in the journal and their writes are retried, every failed
//! write counts in `courier_dead_letter_write_failures_total`, and the log
//! tells the streak in one ERROR line and one line when it ends, not a line
//! per failure (200 ERROR lines for 100 events in 5 s before). A sink that
//! is down holds no attempt's slot: live events of the destination go out
//! while its dead letters wait (issue #45, item 2).

use std::time::Duration;
use support::{
    Courier, Received, Receiver, Reply, behavior, block_sink, check, check_eq, config, fail,
    metric, post, wait_dead_letters, wait_metric,
};

const EVENTS: usize = 100;
const FAILURES: &str = r#"courier_dead_letter_write_failures_total{destination="orders"}"#;
const PENDING: &str = r#"courier_events_pending{destination="orders"}"#;
const FAILED_WRITE: &str = "cannot write the dead letter; retrying";
const ENDED: &str = "dead letters are written again";

async fn failures(c: &Courier) -> f64 {
    metric(&c.admin_url(), FAILURES).await.unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_sink_is_one_error_line_per_streak_and_a_count_of_every_failed_write() {
    let rx = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    // `log.level: debug` (the test config): each failed write has a line,
    // at DEBUG but for the streak's first.
    let c = Courier::start(dir.path(), &config("orders", &rx.url(), "")).await;
    check_eq!(
        c,
        failures(&c).await,
        0.0,
        "the series exists from the start"
    );
    let sink = block_sink(&c, "orders");
    for i in 0..EVENTS {
        let r = post(&c.url("orders"), format!(r#"{{"n":{i}}}"#), &[]).await;
        check_eq!(c, r.status, 202, "{}", r.text());
    }
    rx.wait_for(EVENTS, Duration::from_secs(10)).await;
    // The dead letters go to the sink in groups (at most two written at
    // once), each write retried 1 s after it failed (then 2 s, 4 s...):
    // wait for a second round of both.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while failures(&c).await < 4.0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let failed = failures(&c).await;
    check!(c, failed >= 4.0, "{failed} failed writes");
    check_eq!(
        c,
        metric(&c.admin_url(), PENDING).await,
        Some(EVENTS as f64),
        "the events stay in the journal"
    );
    check_eq!(c, rx.count(), EVENTS, "an event was sent again");

    // Fixed between two rounds (the third comes 2 s after the second, and each takes as
    // long as the posts did), so that no write that began before the fix
    // fails after it and starts a streak of its own.
    std::fs::remove_file(&sink).expect("unblock the sink");
    let (_, records) = wait_dead_letters(&c, "orders", EVENTS, Duration::from_secs(15)).await;
    check_eq!(c, records.len(), EVENTS);
    wait_metric(&c, PENDING, 0.0, Duration::from_secs(10)).await;

    let logs = c.settled_logs().await;
    let failed = failures(&c).await;
    let lines: Vec<&str> = logs.lines().filter(|l| l.contains(FAILED_WRITE)).collect();
    let errors = lines.iter().filter(|l| l.contains(" ERROR ")).count();
    check_eq!(c, errors, 1, "ERROR lines for one streak");
    check_eq!(
        c,
        lines.len() as f64,
        failed,
        "a line (DEBUG but the first) per failed write, against the counter"
    );
    let ended: Vec<&str> = logs.lines().filter(|l| l.contains(ENDED)).collect();
    check_eq!(c, ended.len(), 1, "lines ending the streak: {ended:?}");
    check!(
        c,
        ended[0].contains(&format!("failures={failed} ")),
        "the end of the streak tells its {failed} failures: {}",
        ended[0]
    );
}

/// Whether a request's body says `dead`.
fn dead(r: &Received) -> bool {
    r.body.windows(4).any(|w| w == b"dead")
}

/// A courier for `orders` (settings `extra`) whose receiver refuses events
/// whose body says `dead` and takes the rest, with its dead-letter folder
/// blocked; the folder's path, to unblock it.
async fn blocked_sink(extra: &str) -> (Receiver, tempfile::TempDir, Courier, std::path::PathBuf) {
    let rx = Receiver::start(behavior(|r, _| {
        Reply::status(if dead(r) { 400 } else { 200 })
    }))
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &config("orders", &rx.url(), extra)).await;
    let sink = block_sink(&c, "orders");
    (rx, dir, c, sink)
}

/// Posts a live event and asserts that it is delivered within `within`.
async fn delivered_at_once(c: &Courier, rx: &Receiver, n: usize, within: Duration) {
    let before = rx.count();
    let sent = std::time::Instant::now();
    let r = post(&c.url("orders"), format!(r#"{{"live":{n}}}"#), &[]).await;
    check_eq!(c, r.status, 202, "{}", r.text());
    let Some(got) = rx.try_wait_for(before + 1, within).await else {
        fail!(
            c,
            "live event {n} not delivered within {within:?}: its destination waits for the dead-letter sink"
        );
    };
    let last = got
        .iter()
        .max_by_key(|g| g.at)
        .map(|g| g.at.duration_since(sent));
    check!(
        c,
        last.is_some_and(|d| d < within),
        "live event {n} took {last:?}"
    );
}

/// Unblocks the sink and checks that each dead letter is written once,
/// and that nothing is left pending.
async fn unblock_and_drain(c: &Courier, sink: &std::path::Path, dead: usize) {
    std::fs::remove_file(sink).expect("unblock the sink");
    let (_, records) = wait_dead_letters(c, "orders", dead, Duration::from_secs(40)).await;
    check_eq!(c, records.len(), dead, "dead letters written");
    wait_metric(c, PENDING, 0.0, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_is_down_holds_no_delivery_slot_one_dead_letter_a_second() {
    // Batched: a batch holds its slot until settled, so two dead letters
    // waiting in their attempts' slots would stop the destination.
    let (rx, _dir, c, sink) = blocked_sink("concurrency: 2\nbatch: { max_events: 10 }").await;
    const ROUNDS: usize = 4;
    for n in 0..ROUNDS {
        let seen = rx.count();
        let r = post(&c.url("orders"), format!(r#"{{"dead":{n}}}"#), &[]).await;
        check_eq!(c, r.status, 202, "{}", r.text());
        rx.wait_for(seen + 1, Duration::from_secs(5)).await;
        // Its dead letter fails to be written, and waits.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while failures(&c).await < (n + 1) as f64 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        delivered_at_once(&c, &rx, n, Duration::from_millis(1500)).await;
    }
    check!(
        c,
        failures(&c).await >= ROUNDS as f64,
        "every dead letter met the blocked sink"
    );
    unblock_and_drain(&c, &sink, ROUNDS).await;
    let live = rx.received().iter().filter(|r| !dead(r)).count();
    check_eq!(c, live, ROUNDS, "each live event delivered once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_is_down_holds_no_delivery_slot_after_many_dead_letters() {
    let (rx, _dir, c, sink) = blocked_sink("concurrency: 2").await;
    // More than the attempts a destination keeps in hand (16 a slot).
    const DEAD: usize = 40;
    for n in 0..DEAD {
        let r = post(&c.url("orders"), format!(r#"{{"dead":{n}}}"#), &[]).await;
        check_eq!(c, r.status, 202, "{}", r.text());
    }
    rx.wait_for(DEAD, Duration::from_secs(10)).await;
    for n in 0..3 {
        delivered_at_once(&c, &rx, n, Duration::from_millis(1500)).await;
    }
    // The dead letters wait in the journal (a delivery's delete is counted
    // once the journal commits it).
    wait_metric(&c, PENDING, DEAD as f64, Duration::from_secs(5)).await;
    unblock_and_drain(&c, &sink, DEAD).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_head_lets_its_ordering_key_go_on_while_the_sink_is_down() {
    let (rx, _dir, c, sink) = blocked_sink("ordering: { key: { header: Ordering-Key } }").await;
    let key = [("Ordering-Key", "k")];
    let r = post(&c.url("orders"), r#"{"dead":0}"#.to_string(), &key).await;
    check_eq!(c, r.status, 202, "{}", r.text());
    rx.wait_for(1, Duration::from_secs(5)).await;
    let r = post(&c.url("orders"), r#"{"live":0}"#.to_string(), &key).await;
    check_eq!(c, r.status, 202, "{}", r.text());
    // Its key's head is dead-lettered (its fate recorded), its record
    // waiting for the sink: the next of the key goes.
    let Some(got) = rx.try_wait_for(2, Duration::from_secs(3)).await else {
        fail!(c, "the key's next event waits for its dead head's record");
    };
    check!(c, !dead(&got[1]), "the live event went second");
    unblock_and_drain(&c, &sink, 1).await;
}
