//! Batching (docs/batching.md): ready events of a destination go out together as
//! one JSON array (eventgrid, custom) or a CloudEvents batch, never more
//! than `max_events`, closed before `preferred_size`; a failed batch is
//! retried whole under the same `webhook-id`; a crash loses nothing.

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::python::{check_with, request_json};
use support::{
    Courier, Received, Receiver, Reply, behavior, check, check_eq, fail, metric, metric_sum, post,
    quiet, requests,
};

const PROMPT: Duration = Duration::from_secs(15);
const QUIET: Duration = Duration::from_millis(600);

fn config(url: &str, extra: &str) -> String {
    support::config("orders", url, extra)
}

/// The 202 comes once the intake log is synced; the dispatcher reads the
/// rows from SQLite, which the indexer fills a moment later. Before a
/// resume, give it that moment, so that every posted event is ready and
/// the batches are the ones the test expects.
async fn indexed() {
    tokio::time::sleep(Duration::from_millis(500)).await;
}

async fn set_paused(c: &Courier, name: &str, paused: bool) {
    let action = if paused { "pause" } else { "resume" };
    let url = format!("{}/v1/destinations/{name}/{action}", c.admin_url());
    let resp = support::admin_post(&url, "", &[]).await;
    check_eq!(c, resp.status, 200, "POST {url}: {}", resp.text());
}

/// The events of one delivery: its body must be a JSON array.
fn events(c: &Courier, r: &Received) -> Vec<Value> {
    match r.json() {
        Value::Array(events) => events,
        other => fail!(c, "a batch delivery is not a JSON array: {other}"),
    }
}

/// Posts custom JSON events `{"n": i}` with ids `e-i`, 25 requests at a time.
async fn post_events(c: &Courier, range: std::ops::Range<usize>) {
    let url = c.url("orders");
    let ids: Vec<usize> = range.collect();
    for chunk in ids.chunks(25) {
        let mut posts = tokio::task::JoinSet::new();
        for &i in chunk {
            let url = url.clone();
            posts.spawn(async move {
                let id = format!("e-{i}");
                let headers = [
                    ("idempotency-key", id.as_str()),
                    ("content-type", "application/json"),
                ];
                post(&url, format!("{{\"n\":{i}}}"), &headers).await.status
            });
        }
        while let Some(status) = posts.join_next().await {
            check_eq!(c, status.ok(), Some(202), "POST /orders");
        }
    }
}

fn numbers(c: &Courier, r: &Received) -> Vec<u64> {
    events(c, r)
        .iter()
        .map(|e| e["n"].as_u64().unwrap_or(u64::MAX))
        .collect()
}

async fn wait_delivered(c: &Courier, n: f64) {
    support::wait_metric(
        c,
        r#"courier_events_delivered_total{destination="orders"}"#,
        n,
        PROMPT,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_queued_events_go_out_in_at_most_ten_requests_each_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let c = Courier::start(dir.path(), &config(&rx.url(), "batch: { max_events: 100 }")).await;
    set_paused(&c, "orders", true).await;
    post_events(&c, 0..1000).await;
    check_eq!(c, rx.count(), 0, "requests while paused");
    indexed().await;
    set_paused(&c, "orders", false).await;
    wait_delivered(&c, 1000.0).await;
    let got = rx.received();
    quiet(&c, &rx, got.len(), QUIET).await;
    check!(c, got.len() <= 10, "{} requests for 1000 events", got.len());
    let mut seen = BTreeMap::new();
    let mut ids = BTreeSet::new();
    for r in &got {
        let ns = numbers(&c, r);
        check!(c, ns.len() <= 100, "a batch of {} events", ns.len());
        check_eq!(c, r.header("content-type"), Some("application/json"));
        check_eq!(c, r.header("courier-delivery-attempt"), Some("1"));
        let id = r.header("webhook-id").unwrap_or_default().to_string();
        check!(
            c,
            uuid::Uuid::parse_str(&id).is_ok_and(|u| u.get_version_num() == 7),
            "webhook-id of a batch is a UUIDv7: {id:?}"
        );
        check!(c, ids.insert(id.clone()), "webhook-id {id} used twice");
        check_eq!(
            c,
            r.header("idempotency-key"),
            None,
            "an event's key on a batch"
        );
        for n in ns {
            *seen.entry(n).or_insert(0) += 1;
        }
    }
    check_eq!(c, seen.len(), 1000, "distinct events delivered");
    check!(
        c,
        seen.values().all(|&k| k == 1),
        "an event delivered twice"
    );
    check_eq!(c, seen.keys().next_back().copied(), Some(999));
    // Attempts are counted per event (as Event Grid's delivery count),
    // requests by the duration histogram.
    let admin = c.admin_url();
    let attempts = metric_sum(&admin, "courier_delivery_attempts_total").await;
    check_eq!(c, attempts, 1000.0, "event attempts");
    let requests = metric_sum(&admin, "courier_delivery_duration_seconds_count").await;
    check_eq!(c, requests as usize, got.len(), "one request per batch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_larger_than_preferred_size_goes_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let c = Courier::start(
        dir.path(),
        &config(
            &rx.url(),
            "batch: { max_events: 100, preferred_size: 4KiB }\nconcurrency: 1",
        ),
    )
    .await;
    set_paused(&c, "orders", true).await;
    let big = json!({"n": "big", "pad": "x".repeat(10 * 1024)}).to_string();
    // 1316 bytes each: three make a 3952-byte array, four would pass 4 KiB.
    let small = |n: usize| json!({"n": n, "pad": "y".repeat(1300)}).to_string();
    let bodies = [
        small(1),
        small(2),
        big.clone(),
        small(3),
        small(4),
        small(5),
        small(6),
    ];
    for (i, body) in bodies.iter().enumerate() {
        let id = format!("s-{i}");
        let r = post(&c.url("orders"), body.clone(), &[("idempotency-key", &id)]).await;
        check_eq!(c, r.status, 202, "{}", r.text());
    }
    indexed().await;
    set_paused(&c, "orders", false).await;
    wait_delivered(&c, 7.0).await;
    let got = rx.received();
    quiet(&c, &rx, got.len(), QUIET).await;
    let batches: Vec<Vec<Value>> = got.iter().map(|r| events(&c, r)).collect();
    let order: Vec<Vec<Value>> = batches
        .iter()
        .map(|b| b.iter().map(|e| e["n"].clone()).collect())
        .collect();
    // The big one closes the first batch and goes alone.
    check_eq!(
        c,
        order,
        vec![
            vec![json!(1), json!(2)],
            vec![json!("big")],
            vec![json!(3), json!(4), json!(5)],
            vec![json!(6)]
        ],
        "batches in due order"
    );
    for r in &got {
        let n = events(&c, r).len();
        check!(
            c,
            n == 1 || r.body.len() <= 4096,
            "a batch of {n} events has {} bytes",
            r.body.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_is_retried_whole_under_the_same_webhook_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::sequence(vec![Reply::status(503), Reply::status(200)]).await;
    let extra = "batch: { max_events: 10 }\n\
                 retry: { schedule: [50ms], jitter: 0 }\n\
                 status: { min_delay: { 503: 50ms } }";
    let c = Courier::start(dir.path(), &config(&rx.url(), extra)).await;
    set_paused(&c, "orders", true).await;
    post_events(&c, 0..7).await;
    indexed().await;
    set_paused(&c, "orders", false).await;
    let got = requests(&c, &rx, 2, PROMPT).await;
    wait_delivered(&c, 7.0).await;
    quiet(&c, &rx, 2, QUIET).await;
    let (first, retry) = (&got[0], &got[1]);
    let mut sent = numbers(&c, first);
    sent.sort();
    check_eq!(c, sent, (0..7).collect::<Vec<u64>>());
    check_eq!(c, numbers(&c, retry), numbers(&c, first), "same events");
    check_eq!(c, first.body, retry.body, "same body");
    check!(c, first.header("webhook-id").is_some(), "no webhook-id");
    check_eq!(c, retry.header("webhook-id"), first.header("webhook-id"));
    check_eq!(c, first.header("courier-delivery-attempt"), Some("1"));
    check_eq!(c, retry.header("courier-delivery-attempt"), Some("2"));
    let busy = metric(
        &c.admin_url(),
        r#"courier_delivery_attempts_total{destination="orders",outcome="Busy"}"#,
    )
    .await;
    check_eq!(c, busy, Some(7.0), "one failed attempt for each event");
    let requests = metric_sum(&c.admin_url(), "courier_delivery_duration_seconds_count").await;
    check_eq!(c, requests, 2.0, "two requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_body_that_is_not_json_is_refused_when_the_destination_batches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let c = Courier::start(dir.path(), &config(&rx.url(), "batch: { max_events: 10 }")).await;
    let r = post(&c.url("orders"), "plain text, not json", &[]).await;
    check_eq!(c, r.status, 400, "{}", r.text());
    check_eq!(c, r.header("content-type"), Some("application/json"));
    check_eq!(c, r.json()["reason"], "not_json", "{}", r.text());
    quiet(&c, &rx, 0, QUIET).await;
    let accepted = metric_sum(&c.admin_url(), "courier_events_accepted_total").await;
    check_eq!(c, accepted, 0.0, "nothing stored");
    let pending = metric(
        &c.admin_url(),
        r#"courier_events_pending{destination="orders"}"#,
    )
    .await;
    check_eq!(c, pending.unwrap_or(0.0), 0.0);
    // JSON of any kind is fine.
    let r = post(&c.url("orders"), "[1, \"two\"]", &[]).await;
    check_eq!(c, r.status, 202, "{}", r.text());
    let got = requests(&c, &rx, 1, PROMPT).await;
    check_eq!(c, got[0].json(), json!([[1, "two"]]));
}

fn two_schemas(url: &str) -> String {
    let dest = |name: &str, schema: &str| {
        format!(
            "  {name}:\n    url: {url}/{name}\n    schema: {schema}\n    batch: {{ max_events: 10 }}\n"
        )
    };
    format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nlog: {{ level: debug }}\njournal: {{ dir: ./journal }}\ndestinations:\n{}{}",
        dest("eg", "eventgrid"),
        dest("ce", "cloudevents")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventgrid_and_cloudevents_batches_pass_the_sdks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let c = Courier::start(dir.path(), &two_schemas(&rx.url())).await;
    set_paused(&c, "eg", true).await;
    set_paused(&c, "ce", true).await;
    let eg: Vec<Value> = (0..4)
        .map(|i| {
            json!({
                "id": format!("eg-{i}"), "subject": format!("/orders/{i}"),
                "eventType": "Shop.OrderCreated", "eventTime": "2025-01-31T12:00:00Z",
                "data": {"order": i}, "dataVersion": "1.0",
            })
        })
        .collect();
    let ce: Vec<Value> = (0..4)
        .map(|i| {
            json!({
                "specversion": "1.0", "id": format!("ce-{i}"), "source": "/shop",
                "type": "shop.order.created", "time": "2025-01-31T12:00:00Z",
                "datacontenttype": "application/json", "data": {"order": i},
            })
        })
        .collect();
    let json_ct = [("content-type", "application/json")];
    let r = post(&c.url("eg"), Value::Array(eg.clone()).to_string(), &json_ct).await;
    check_eq!(c, r.status, 200, "{}", r.text());
    let batch_ct = "application/cloudevents-batch+json";
    let ce_batch = Value::Array(ce[..3].to_vec()).to_string();
    let r = post(
        &c.url("ce"),
        ce_batch.clone(),
        &[("content-type", batch_ct)],
    )
    .await;
    check_eq!(c, r.status, 202, "{}", r.text());
    let structured_ct = "application/cloudevents+json";
    let ce_one = ce[3].to_string();
    let r = post(
        &c.url("ce"),
        ce_one.clone(),
        &[("content-type", structured_ct)],
    )
    .await;
    check_eq!(c, r.status, 202, "{}", r.text());
    indexed().await;
    set_paused(&c, "eg", false).await;
    set_paused(&c, "ce", false).await;
    let got = requests(&c, &rx, 2, PROMPT).await;
    quiet(&c, &rx, 2, QUIET).await;
    let (eg_req, ce_req): (Vec<&Received>, Vec<&Received>) = got
        .iter()
        .partition(|r| r.path_and_query.starts_with("/eg"));
    check_eq!(c, eg_req.len(), 1, "one eventgrid batch");
    check_eq!(c, ce_req.len(), 1, "one cloudevents batch");
    check_eq!(
        c,
        eg_req[0].header("content-type"),
        Some("application/json")
    );
    check_eq!(
        c,
        ce_req[0].header("content-type"),
        Some("application/cloudevents-batch+json; charset=utf-8")
    );
    check_eq!(c, events(&c, eg_req[0]).len(), 4);
    check_eq!(c, events(&c, ce_req[0]).len(), 4);

    let input = json!({
        "deliveries": eg_req.iter().map(|r| request_json(r)).collect::<Vec<_>>(),
        "sent": eg,
        "topic": "/courier/eg",
    });
    let out = check_with("check_eventgrid.py", &[], input.to_string().as_bytes());
    check!(c, out.starts_with("ok: 4 events"), "{out}");
    let sent = [
        json!({"headers": {"content-type": batch_ct}, "body": ce_batch}),
        json!({"headers": {"content-type": structured_ct}, "body": ce_one}),
    ];
    let input = json!({
        "delivered": ce_req.iter().map(|r| request_json(r)).collect::<Vec<_>>(),
        "sent": sent,
    });
    let out = check_with("check_cloudevents.py", &[], input.to_string().as_bytes());
    check!(c, out.starts_with("ok: 4 events"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_event_is_delivered_after_sigkill_between_batch_retries() {
    let healthy = Arc::new(AtomicBool::new(false));
    let h = healthy.clone();
    let rx = Receiver::start(behavior(move |_, _| {
        Reply::status(if h.load(Ordering::SeqCst) { 200 } else { 503 })
    }))
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let extra = "batch: { max_events: 50 }\n\
                 retry: { schedule: [300ms], jitter: 0 }\n\
                 status: { min_delay: { 503: 300ms } }\n\
                 probation: { after_failures: 0 }";
    let mut c = Courier::start(dir.path(), &config(&rx.url(), extra)).await;
    post_events(&c, 0..300).await;
    // Batches formed, attempted, failed and rescheduled at least once.
    requests(&c, &rx, 8, PROMPT).await;
    c.kill();
    let before = rx.received();
    let mut batch_of: HashMap<String, Vec<u64>> = HashMap::new();
    for r in &before {
        let id = r.header("webhook-id").unwrap_or_default().to_string();
        batch_of.insert(id, numbers(&c, r));
    }
    healthy.store(true, Ordering::SeqCst);
    let flipped = Instant::now();
    c.restart().await;
    wait_delivered(&c, 300.0).await;
    let after: Vec<Received> = rx
        .received()
        .into_iter()
        .filter(|r| r.at >= flipped)
        .collect();
    let mut delivered = BTreeSet::new();
    let mut retried_whole = 0;
    for r in &after {
        let ns = numbers(&c, r);
        let id = r.header("webhook-id").unwrap_or_default();
        if let Some(before) = batch_of.get(id) {
            check_eq!(c, &ns, before, "batch {id} retried with other events");
            retried_whole += 1;
        }
        delivered.extend(ns);
    }
    check_eq!(
        c,
        delivered,
        (0..300).collect::<BTreeSet<u64>>(),
        "acknowledged events delivered after the restart"
    );
    check!(
        c,
        retried_whole > 0,
        "no batch from before the kill came back under its id"
    );
}
