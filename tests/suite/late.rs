//! Event Grid's late answers: a success after the attempt's timeout still
//! completes the event when it comes before the retry.

use std::time::Duration;
use support::{Courier, Receiver, Reply, behavior, metric};

/// A 200 ms timeout, the given late-answer window, retries 2 s apart (but
/// at least 10 s after a timeout, the fixed TimedOut minimum) and
/// `max_attempts` attempts in all.
fn config(url: &str, window: &str, max_attempts: u32) -> String {
    support::config(
        "orders",
        url,
        &format!(
            "timeout: 200ms\nlate_answer_window: {window}\nretry: {{ schedule: [2s], max_attempts: {max_attempts}, jitter: 0 }}"
        ),
    )
}

/// A courier on `config(…, window, max_attempts)` before a receiver that
/// answers every request with `reply`, after one event (with
/// `Idempotency-Key: key`) was accepted and its first attempt arrived.
async fn one_attempt(
    reply: Reply,
    window: &str,
    max_attempts: u32,
    key: Option<&str>,
) -> (tempfile::TempDir, Receiver, Courier) {
    let receiver = Receiver::start(behavior(move |_, _| reply.clone())).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let courier = Courier::start(tmp.path(), &config(&receiver.url(), window, max_attempts)).await;
    let headers: Vec<(&str, &str)> = key.map(|k| ("idempotency-key", k)).into_iter().collect();
    let r = support::post(&courier.url("orders"), "{}", &headers).await;
    assert_eq!(r.status, 202, "{}", courier.logs());
    receiver.wait_for(1, Duration::from_secs(5)).await;
    (tmp, receiver, courier)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_after_the_timeout_completes_the_event_and_cancels_the_retry() {
    let (_tmp, receiver, courier) = one_attempt(
        Reply::status(200).delay(Duration::from_millis(500)),
        "3m",
        30,
        Some("late-1"),
    )
    .await;
    let first = std::time::Instant::now();
    // The retry would go out 10 s after the timeout (the TimedOut minimum;
    // RETRY_AT after the first attempt); the late 200 at 500 ms must cancel
    // it: the event leaves the journal.
    let admin = courier.admin_url();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let pending = metric(&admin, r#"courier_events_pending{destination="orders"}"#).await;
        if pending == Some(0.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "event still pending after its late answer\n{}",
            courier.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        metric(
            &admin,
            r#"courier_delivery_attempts_total{destination="orders",outcome="TimedOut"}"#
        )
        .await,
        Some(1.0)
    );
    assert_eq!(
        metric(
            &admin,
            r#"courier_events_delivered_total{destination="orders"}"#
        )
        .await,
        Some(1.0)
    );
    // The log is written by its own thread, after the metrics move.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let late_line = |logs: &str| {
        logs.lines()
            .any(|l| l.contains(" delivered ") && l.contains("late=true"))
    };
    while !late_line(&courier.logs()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no `delivered … late=true` line:\n{}",
            courier.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Watch until well past the time the cancelled retry would have come.
    let watch = RETRY_AT.saturating_sub(first.elapsed()) + Duration::from_secs(1);
    receiver.assert_quiet(1, watch).await;
}

/// When a retry of the first attempt would arrive: the 200 ms timeout, then
/// the 10 s minimum after a timeout (longer than the schedule's 2 s; not
/// configurable: `status.min_delay` takes status codes only).
const RETRY_AT: Duration = Duration::from_millis(10_200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_window_off_a_late_success_does_not_count() {
    let (_tmp, _receiver, courier) = one_attempt(
        Reply::status(200).delay(Duration::from_millis(500)),
        "0s",
        30,
        None,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let admin = courier.admin_url();
    assert_eq!(
        metric(&admin, r#"courier_events_pending{destination="orders"}"#).await,
        Some(1.0),
        "{}",
        courier.logs()
    );
    assert_eq!(
        metric(
            &admin,
            r#"courier_events_delivered_total{destination="orders"}"#
        )
        .await,
        Some(0.0),
        "the counter exists from the start and stays at 0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_success_on_the_last_attempt_completes_the_event() {
    let (_tmp, receiver, courier) = one_attempt(
        Reply::status(200).delay(Duration::from_millis(600)),
        "2s",
        1,
        Some("last-1"),
    )
    .await;
    // Past the end of the window: had the event been dead-lettered at the
    // timeout, or at the window's end, it would show by now.
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let admin = courier.admin_url();
    let dead = support::metric_sum(
        &admin,
        r#"courier_events_dead_lettered_total{destination="orders"}"#,
    )
    .await;
    assert_eq!(
        dead,
        0.0,
        "a late success was dead-lettered too\n{}",
        courier.logs()
    );
    assert_eq!(
        metric(
            &admin,
            r#"courier_events_delivered_total{destination="orders"}"#
        )
        .await,
        Some(1.0),
        "{}",
        courier.logs()
    );
    assert_eq!(
        metric(&admin, r#"courier_events_pending{destination="orders"}"#).await,
        Some(0.0)
    );
    assert!(support::files_under(&support::dl_dir(&courier, "orders")).is_empty());
    receiver.assert_quiet(1, Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_attempt_without_a_late_success_is_dead_lettered_when_the_window_closes() {
    let (_tmp, receiver, courier) = one_attempt(Reply::hang(), "1500ms", 1, Some("last-2")).await;
    let attempted = std::time::Instant::now();
    // The timeout (200 ms) is long past; the window (1.5 s) is not.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let admin = courier.admin_url();
    let early = support::metric_sum(
        &admin,
        r#"courier_events_dead_lettered_total{destination="orders"}"#,
    )
    .await;
    assert_eq!(
        early,
        0.0,
        "dead-lettered before the late-answer window closed\n{}",
        courier.logs()
    );
    let (_, records) =
        support::wait_dead_letters(&courier, "orders", 1, Duration::from_secs(5)).await;
    let waited = attempted.elapsed();
    assert!(
        waited >= Duration::from_millis(1200),
        "dead-lettered after only {waited:?}"
    );
    assert_eq!(records.len(), 1, "{records:?}");
    let rec = &records[0];
    assert_eq!(
        rec["deadLetterReason"], "MaxDeliveryAttemptsExceeded",
        "{rec}"
    );
    assert_eq!(rec["deliveryAttempts"], 1, "{rec}");
    assert_eq!(rec["lastDeliveryOutcome"], "TimedOut", "{rec}");
    // No second attempt was made for it.
    receiver.assert_quiet(1, Duration::from_millis(200)).await;
}
