//! Ingress keeps pace with a destination that delivers slower than the app
//! publishes: once its ready queue is nearly full (4 MiB), each accept
//! waits for delivery to make room, so the app slows to the delivery rate.
//! A destination whose endpoint fails is not paced: courier buffers it,
//! up to its share of the journal (`max_pending_bytes`), so that it cannot
//! fill the journal for the others.

use std::time::{Duration, Instant};
use support::{
    Courier, Receiver, Reply, behavior, client, json_body, metric, refusing_port, wait_metric,
};

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

/// Two destinations in a 1 MiB journal, each with the default share of
/// half of it: `sick`'s endpoint refuses connections, `healthy`'s is `url`.
fn two(sick_port: u16, url: &str) -> String {
    format!(
        "listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
log: {{ level: debug }}
journal: {{ dir: ./journal, max_bytes: 1MiB }}
destinations:
  sick:
    url: http://127.0.0.1:{sick_port}/hooks
  healthy:
    url: {url}/hooks
"
    )
}

/// 16 KiB: 32 fill a share of 512 KiB, 64 the whole journal.
const SLICE: usize = 16 * 1024;

/// Posts one event of `SLICE` bytes to `name`, numbered `seq`.
async fn post_slice(courier: &Courier, name: &str, seq: u64) -> client::Resp {
    client::post(&courier.url(name), json_body(SLICE, seq), &[]).await
}

/// Posts to `sick` until it is refused; the refusal must be its share's.
async fn fill_sick(courier: &Courier) -> serde_json::Value {
    for seq in 0..64 {
        let r = post_slice(courier, "sick", seq).await;
        if r.status == 202 {
            continue;
        }
        assert_eq!(r.status, 503, "{}\nlogs:\n{}", r.text(), courier.logs());
        assert!(
            r.header("retry-after")
                .is_some_and(|s| s.parse::<u64>().is_ok_and(|s| s > 0)),
            "{r:?}"
        );
        let body = r.json();
        assert_eq!(body["reason"], "destination_full", "{body}");
        assert_eq!(body["destination"], "sick", "{body}");
        assert_eq!(body["max_pending_bytes"], 512 * 1024, "{body}");
        let held = body["pending_bytes"].as_u64().unwrap_or_default();
        assert!(
            held > 512 * 1024 - 2 * SLICE as u64 && held <= 512 * 1024,
            "{body}"
        );
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("destinations.sick.max_pending_bytes")),
            "{body}"
        );
        return body;
    }
    panic!(
        "64 events of 16 KiB accepted for `sick` in a 1 MiB journal: no share held it\nlogs:\n{}",
        courier.logs()
    );
}

/// Posts `n` events to `healthy`, each of which must be accepted.
async fn feed_healthy(courier: &Courier, from: u64, n: u64) {
    for seq in from..from + n {
        let r = post_slice(courier, "healthy", seq).await;
        assert_eq!(
            r.status,
            202,
            "healthy event {seq} refused while sick is at its share: {}\nlogs:\n{}",
            r.text(),
            courier.logs()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_is_down_cannot_make_a_healthy_destinations_posts_fail() {
    let (_held, sick_port) = refusing_port();
    let receiver = Receiver::ok().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut courier = Courier::start(tmp.path(), &two(sick_port, &receiver.url())).await;
    let refused = fill_sick(&courier).await;
    // Twice the journal's size: the healthy one goes on at delivery's pace
    // beside the full share.
    feed_healthy(&courier, 1000, 64).await;
    delivered(&receiver, 1000..1064).await;
    let series = "courier_ingress_rejected_total{destination=\"sick\",reason=\"destination_full\"}";
    assert_eq!(metric(&courier.admin_url(), series).await, Some(1.0));
    assert_eq!(
        metric(
            &courier.admin_url(),
            "courier_ingress_rejected_total{destination=\"healthy\",reason=\"journal_full\"}"
        )
        .await
        .unwrap_or_default(),
        0.0
    );

    // The share is counted from the recovered counters after a SIGKILL.
    courier.kill();
    courier.restart().await;
    // Deliveries not yet synced before the kill are made again (at least
    // once): healthy's own events, up to all of them when the indexer was
    // behind (a loaded machine), which may hold the total over the limit
    // (then every post hears journal_full) until healthy has sent them.
    let healthy = r#"courier_journal_bytes{destination="healthy"}"#;
    wait_metric(&courier, healthy, 0.0, Duration::from_secs(30)).await;
    let r = post_slice(&courier, "sick", 99).await;
    let body = r.json();
    assert_eq!(
        (r.status, &body["reason"], &body["pending_bytes"]),
        (503, &refused["reason"], &refused["pending_bytes"]),
        "sick after the restart: {body}\nlogs:\n{}",
        courier.logs()
    );
    feed_healthy(&courier, 2000, 8).await;
    delivered(&receiver, 2000..2008).await;
}

/// Waits until every event numbered in `seqs` has reached `receiver`
/// (redeliveries after a SIGKILL may come too).
async fn delivered(receiver: &Receiver, seqs: std::ops::Range<u64>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let missing = || {
        let got: Vec<u64> = receiver
            .received()
            .iter()
            .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
            .filter_map(|v| v["seq"].as_u64())
            .collect();
        seqs.clone()
            .filter(|s| !got.contains(s))
            .collect::<Vec<u64>>()
    };
    while !missing().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(missing(), Vec::<u64>::new(), "events never delivered");
}
