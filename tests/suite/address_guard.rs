//! The address guard (docs/delivery.md, "The address guard") on a fixed url
//! with `endpoints: { guard: on }`: a host name that resolves to loopback
//! is refused after DNS, no connection is made, and its events are
//! dead-lettered `AddressNotAllowed` at their first attempt; an operator's
//! `allow_cidrs` opens the range.

use std::time::Duration;
use support::{
    Courier, Receiver, Reply, behavior, check, check_eq, config, destination_view,
    eventgrid_events, post, quiet, requests, wait_dead_letters, wait_metric,
};

const WAIT: Duration = Duration::from_secs(20);
const EVENTS: usize = 3;

/// A receiver on loopback, and a courier whose destination `orders` names
/// it as `localhost` with `endpoints` and `extra`, holding `EVENTS` events.
async fn published(endpoints: &str, extra: &str) -> (Receiver, tempfile::TempDir, Courier) {
    let rx = Receiver::start(behavior(|_, _| Reply::status(200))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("http://localhost:{}/hook", rx.addr().port());
    let extra = format!("schema: eventgrid\nendpoints: {endpoints}\n{extra}");
    let c = Courier::start(dir.path(), &config("orders", &url, &extra)).await;
    let resp = post(&c.url("orders"), eventgrid_events("e", 0, EVENTS), &[]).await;
    check!(
        c,
        resp.status < 300,
        "publish: {} {}",
        resp.status,
        resp.text()
    );
    (rx, dir, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_resolving_to_loopback_is_refused_after_dns_and_dead_lettered_at_once() {
    // Probation after 2 failures: were a refusal counted against the
    // endpoint, the third event would be held back.
    let (rx, _dir, c) = published(
        "{ guard: on }",
        "retry: { schedule: [50ms], max_attempts: 5 }\nprobation: { after_failures: 2 }",
    )
    .await;
    let (_, records) = wait_dead_letters(&c, "orders", EVENTS, WAIT).await;
    for r in &records {
        check_eq!(c, r["deadLetterReason"], "AddressNotAllowed", "{r}");
        check_eq!(c, r["lastDeliveryOutcome"], "AddressNotAllowed", "{r}");
        check_eq!(c, r["deliveryAttempts"], 1, "never retried: {r}");
    }
    wait_metric(
        &c,
        r#"courier_delivery_attempts_total{destination="orders",outcome="AddressNotAllowed"}"#,
        EVENTS as f64,
        WAIT,
    )
    .await;
    let (view, body) = destination_view(&c.admin_url(), "orders").await;
    let state = view.map(|d| d["state"].clone());
    check_eq!(
        c,
        state,
        Some(serde_json::json!("healthy")),
        "the url is at fault, not the endpoint: {body}"
    );
    quiet(&c, &rx, 0, Duration::from_millis(300)).await;
    check_eq!(c, rx.count(), 0, "no request reached the receiver");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_cidrs_opens_loopback_to_a_guarded_destination() {
    let (rx, _dir, c) =
        published("{ guard: on, allow_cidrs: [127.0.0.0/8, \"::1/128\"] }", "").await;
    requests(&c, &rx, EVENTS, WAIT).await;
}
