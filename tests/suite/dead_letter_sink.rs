//! A dead-letter sink that cannot be written (issue #30, item 16): the
//! events stay in the journal and their writes are retried, every failed
//! write counts in `courier_dead_letter_write_failures_total`, and the log
//! tells the streak in one ERROR line and one line when it ends, not a line
//! per failure (200 ERROR lines for 100 events in 5 s before).

use std::time::Duration;
use support::{
    Courier, Receiver, Reply, behavior, check, check_eq, config, dl_dir, metric, post,
    wait_dead_letters, wait_metric,
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
    // The destination's dead-letter folder is a file: every write fails.
    let sink = dl_dir(&c, "orders");
    if let Some(parent) = sink.parent() {
        std::fs::create_dir_all(parent).expect("dead-letter root");
    }
    std::fs::write(&sink, b"not a folder").expect("block the sink");
    for i in 0..EVENTS {
        let r = post(&c.url("orders"), format!(r#"{{"n":{i}}}"#), &[]).await;
        check_eq!(c, r.status, 202, "{}", r.text());
    }
    rx.wait_for(EVENTS, Duration::from_secs(10)).await;
    // Each write is retried 1 s after it failed (then 2 s, 4 s...): wait
    // for a second round.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while failures(&c).await < (2 * EVENTS) as f64 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let failed = failures(&c).await;
    check!(c, failed >= (2 * EVENTS) as f64, "{failed} failed writes");
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
