//! Regressions found in review: each test reproduces a bug that lost or
//! stranded an event, and fails if it comes back. They wait out the real
//! 10 s minimum after a timeout, so they take 15–30 s each.
use std::time::Duration;
use support::{Courier, Receiver, Reply, behavior, config, metric};

/// Seq reuse + late-answer conditional delete removes a *different* event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_never_deletes_another_event() {
    let receiver = Receiver::start(behavior(|r, _n| {
        let id = r.header("webhook-id").unwrap_or("").to_string();
        let attempt = r
            .header("courier-delivery-attempt")
            .unwrap_or("")
            .to_string();
        match (id.as_str(), attempt.as_str()) {
            ("A", "1") => Reply::status(200).delay(Duration::from_secs(12)),
            ("A", _) => Reply::status(200),
            ("B", "1") => Reply::status(500),
            _ => Reply::status(200),
        }
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(
        "orders",
        &receiver.url(),
        "timeout: 200ms\nlate_answer_window: 3m\nretry: { schedule: [1s], jitter: 0 }",
    );
    let courier = Courier::start(tmp.path(), &cfg).await;
    let r = support::post(&courier.url("orders"), "{}", &[("idempotency-key", "A")]).await;
    assert_eq!(r.status, 202);
    // A attempt 1 (hangs 12s, times out at 200ms), A attempt 2 at ~10s: 200.
    receiver.wait_for(2, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = support::post(&courier.url("orders"), "{}", &[("idempotency-key", "B")]).await;
    assert_eq!(r.status, 202);
    receiver.wait_for(3, Duration::from_secs(5)).await; // B attempt 1: 500
    // A's late 200 arrives at ~12s; B's retry would be due ~10s after its 500.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let got: Vec<(String, String)> = receiver
        .received()
        .iter()
        .map(|r| {
            (
                r.header("webhook-id").unwrap_or("").into(),
                r.header("courier-delivery-attempt").unwrap_or("").into(),
            )
        })
        .collect();
    let admin = courier.admin_url();
    let pending = metric(&admin, r#"courier_events_pending{destination="orders"}"#).await;
    let dl = std::fs::read_dir(tmp.path().join("dl"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(
        got.iter().any(|(id, a)| id == "B" && a == "2"),
        "B was never retried: it was deleted by A's late answer\nrequests: {got:?}\npending: {pending:?}\ndead-letter dirs: {dl}\nlogs:\n{}",
        courier.logs()
    );
}

/// A probe slot consumed by an event that a late answer already completed
/// is never released: the destination never sends again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_without_an_attempt_frees_the_probe_slot() {
    let receiver = Receiver::start(behavior(|r, _n| {
        match r.header("webhook-id").unwrap_or("") {
            "X" => Reply::status(200).delay(Duration::from_secs(11)),
            _ => Reply::status(200),
        }
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(
        "orders",
        &receiver.url(),
        "timeout: 200ms\nlate_answer_window: 3m\nretry: { schedule: [1s], jitter: 0 }\nprobation: { after_failures: 1, durations: { TimedOut: 12s } }",
    );
    let courier = Courier::start(tmp.path(), &cfg).await;
    let r = support::post(&courier.url("orders"), "{}", &[("idempotency-key", "X")]).await;
    assert_eq!(r.status, 202);
    tokio::time::sleep(Duration::from_secs(14)).await;
    let r = support::post(&courier.url("orders"), "{}", &[("idempotency-key", "Y")]).await;
    assert_eq!(r.status, 202);
    // Bounded: until Y arrives or 20 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let sent_y = || {
        receiver
            .received()
            .iter()
            .any(|r| r.header("webhook-id") == Some("Y"))
    };
    while !sent_y() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let admin = courier.admin_url();
    let dests = support::get(&format!("{admin}/v1/destinations"))
        .await
        .text();
    assert!(
        sent_y(),
        "Y was never sent: the probe slot was lost\ndestinations: {dests}\nlogs:\n{}",
        courier.logs()
    );
}

/// A dead letter that cannot be written makes courier send the event to the
/// endpoint again (a 400 event was re-sent every 30 s, attempt number
/// repeated: the failed write rescheduled the event SINK_RETRY later, then
/// 30 s, now 5 s in src/deliver/settle.rs). The watch covers two of today's
/// sink retries, and the test checks that they happened, so the window
/// cannot silently end before the re-send would come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_that_cannot_be_written_is_not_sent_again() {
    let receiver = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(tmp.path().join("dl"), b"not a dir").expect("file");
    let cfg = config(
        "orders",
        &receiver.url(),
        "retry: { schedule: [1s], jitter: 0, max_attempts: 1 }",
    );
    let courier = Courier::start(tmp.path(), &cfg).await;
    let r = support::post(&courier.url("orders"), "{}", &[("idempotency-key", "E")]).await;
    assert_eq!(r.status, 202);
    let got = receiver.try_wait_for(2, SINK_WATCH).await;
    let seen: Vec<String> = receiver
        .received()
        .iter()
        .map(|r| {
            r.header("courier-delivery-attempt")
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert!(
        got.is_none(),
        "a 400 event with max_attempts 1 was sent again: {seen:?}"
    );
    let retries = courier
        .logs()
        .matches("cannot write the dead letter; retrying")
        .count();
    assert!(
        retries >= 3,
        "{retries} failed dead-letter writes within {SINK_WATCH:?}: the watch no longer covers two sink retries (was SINK_RETRY in src/deliver/settle.rs lengthened?)\n{}",
        courier.logs()
    );
}

/// Two of settle.rs's 5 s sink retries after the first failed write, plus
/// the 1 s schedule and slack.
const SINK_WATCH: Duration = Duration::from_secs(12);
