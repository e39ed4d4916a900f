//! Ingress keeps pace with a destination that delivers slower than the app
//! publishes: once its ready queue is nearly full (4 MiB), each accept
//! waits for delivery to make room, so the app slows to the delivery rate.
//! A destination whose endpoint fails is not paced: courier buffers it.

use std::time::{Duration, Instant};
use support::{Courier, Receiver, Reply, behavior, client, json_body};

/// 64 KiB events: the 4 MiB ready queue is nearly full after 56.
const BODY: usize = 64 * 1024;
const EVENTS: usize = 100;

fn config(url: &str) -> String {
    support::config(
        "orders",
        &format!("{url}/hooks"),
        "concurrency: 1
         retry: { schedule: [10s], max_attempts: 30, jitter: 0 }
         probation: { after_failures: 0 }",
    )
}

/// Posts `EVENTS` events one after another; returns how long that took.
async fn post_all(courier: &Courier) -> Duration {
    let url = courier.url("orders");
    let started = Instant::now();
    for i in 0..EVENTS {
        let r = client::post(&url, json_body(BODY, i as u64), &[]).await;
        assert_eq!(r.status, 202, "event {i}: {}", r.text());
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepting_slows_to_the_delivery_rate_of_a_slow_endpoint() {
    // 10 deliveries a second, one at a time.
    let receiver = Receiver::start(behavior(|_, _| {
        Reply::status(200).delay(Duration::from_millis(100))
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let courier = Courier::start(tmp.path(), &config(&receiver.url())).await;
    let took = post_all(&courier).await;
    // Past the first ~56 events, each accept waits for a delivery (100 ms)
    // to make room: 44 × 100 ms. Without pacing all 100 take well under 1 s.
    assert!(
        took >= Duration::from_secs(3),
        "100 accepts took {took:?}: ingress did not wait for the slow endpoint"
    );
    receiver.wait_for(EVENTS, Duration::from_secs(60)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_endpoint_is_buffered_not_paced() {
    let receiver = Receiver::start(behavior(|_, _| Reply::status(503))).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let courier = Courier::start(tmp.path(), &config(&receiver.url())).await;
    let took = post_all(&courier).await;
    // No wait for room: a few fsyncs of 64 KiB each, far below the 44 × 500 ms
    // that pacing would cost.
    assert!(
        took < Duration::from_secs(10),
        "100 accepts took {took:?}: a failing endpoint's events were paced"
    );
    assert!(
        receiver.count() >= 1,
        "the endpoint was never attempted, so the test proves nothing"
    );
}
