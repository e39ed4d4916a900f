//! The address guard (SPEC §11, issue #46 item 3) on a fixed url with
//! `endpoints: { guard: on }`: a host name that resolves to loopback is
//! refused after DNS, no connection is made, and its events are
//! dead-lettered `AddressNotAllowed` at their first attempt; an operator's
//! `allow_cidrs` opens the range.

use std::time::Duration;
use support::{
    Courier, Receiver, Reply, behavior, check, check_eq, config, eventgrid_events, post, quiet,
    requests, wait_dead_letters, wait_metric,
};

const WAIT: Duration = Duration::from_secs(20);
const EVENTS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_resolving_to_loopback_is_refused_after_dns_and_dead_lettered_at_once() {
    let rx = Receiver::start(behavior(|_, _| Reply::status(200))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("http://localhost:{}/hook", rx.addr().port());
    let extra =
        "schema: eventgrid\nendpoints: { guard: on }\nretry: { schedule: [50ms], max_attempts: 5 }";
    let c = Courier::start(dir.path(), &config("orders", &url, extra)).await;
    let resp = post(&c.url("orders"), eventgrid_events("e", 0, EVENTS), &[]).await;
    check!(
        c,
        resp.status < 300,
        "publish: {} {}",
        resp.status,
        resp.text()
    );
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
    // The refusal blames the url, not the endpoint: no probation.
    let health = support::get(&format!("{}/v1/destinations", c.admin_url())).await;
    check!(c, !health.text().contains("probation"), "{}", health.text());
    quiet(&c, &rx, 0, Duration::from_millis(300)).await;
    check_eq!(c, rx.count(), 0, "no request reached the receiver");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_cidrs_opens_loopback_to_a_guarded_destination() {
    let rx = Receiver::start(behavior(|_, _| Reply::status(200))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("http://localhost:{}/hook", rx.addr().port());
    let extra =
        "schema: eventgrid\nendpoints: { guard: on, allow_cidrs: [127.0.0.0/8, \"::1/128\"] }";
    let c = Courier::start(dir.path(), &config("orders", &url, extra)).await;
    let resp = post(&c.url("orders"), eventgrid_events("e", 0, EVENTS), &[]).await;
    check!(
        c,
        resp.status < 300,
        "publish: {} {}",
        resp.status,
        resp.text()
    );
    requests(&c, &rx, EVENTS, WAIT).await;
}
