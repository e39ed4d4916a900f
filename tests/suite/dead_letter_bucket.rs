//! Dead letters in a bucket (issue #32, item 1; docs/object-storage.md): a real S3
//! (`moto_server` on loopback) behind `dead_letter: { url: s3://... }`.
//! Records keep the shapes of docs/dead-letters.md, grouped into JSON Lines objects under
//! `<prefix>/<destination>/<day>/`, read back with boto3; the admin API and
//! the CLI list, show, replay and purge them; and a store that is down for
//! 10 s keeps every event in the journal until each record arrives, once.

use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;
use support::deadletters::today;
use support::stores::{Gate, Moto, objects_at, s3_env};
use support::{
    Courier, Receiver, check, check_eq, courier_bin, fail, get, metric_sum, post, requests, run_cli,
};

const BUCKET: &str = "courier";
const PROMPT: Duration = Duration::from_secs(20);

fn config(rx: &Receiver) -> String {
    format!(
        "listen: 127.0.0.1:0\n\
         admin_listen: 127.0.0.1:0\n\
         log: {{ level: debug }}\n\
         journal: {{ dir: ./journal }}\n\
         dead_letter: {{ url: s3://{BUCKET}/dl }}\n\
         destinations:\n  \
           orders:\n    \
             url: {url}\n  \
           grid:\n    \
             url: {url}\n    \
             schema: eventgrid\n",
        url = rx.url()
    )
}

async fn start(dir: &std::path::Path, rx: &Receiver, endpoint: &str) -> Courier {
    let env = s3_env(endpoint);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Courier::start_with_env(courier_bin(), dir, &config(rx), &env).await
}

/// The records in the bucket under `dl/<destination>/`, by object key.
fn records(endpoint: &str, destination: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for (key, text) in objects_at(endpoint, BUCKET, &format!("dl/{destination}/")) {
        if !key.ends_with(".jsonl") {
            continue;
        }
        for line in text.lines() {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{key}: a line is not JSON ({e}): {line}"));
            out.push((key.clone(), v));
        }
    }
    out
}

async fn wait_records(
    c: &Courier,
    endpoint: &str,
    destination: &str,
    n: usize,
) -> Vec<(String, Value)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    // Bounded by the deadline.
    loop {
        let got = records(endpoint, destination);
        if got.len() >= n {
            return got;
        }
        if tokio::time::Instant::now() >= deadline {
            fail!(
                c,
                "waited for {n} records of {destination} in the bucket, found {}",
                got.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn cli(c: &Courier, args: &[&str]) -> support::CliOutput {
    let admin = c.admin_url();
    let mut all = vec!["dead-letters", "--admin", &admin];
    all.extend_from_slice(args);
    run_cli(None, &all, &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_reach_the_bucket_in_their_shapes_and_the_api_works_on_them() {
    let moto = Moto::start(BUCKET).await;
    let (rx, accept) = support::receiver::refusing_until_set().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start(dir.path(), &rx, &moto.endpoint()).await;

    for i in 0..5 {
        let r = post(
            &c.url("orders"),
            format!(r#"{{"n":{i}}}"#),
            &[("Idempotency-Key", &format!("o{i}")), ("X-Tenant", "acme")],
        )
        .await;
        check_eq!(c, r.status, 202, "{}", r.text());
    }
    let grid = json!([{
        "id": "g1", "subject": "/orders/1", "eventType": "Shop.OrderCreated",
        "eventTime": "2026-11-27T10:00:00Z", "data": {"total": 3}, "dataVersion": "1"
    }]);
    let r = post(&c.url("grid"), grid.to_string(), &[]).await;
    check_eq!(c, r.status, 200, "{}", r.text());

    let orders = wait_records(&c, &moto.endpoint(), "orders", 5).await;
    let day = today();
    let mut ids: Vec<&str> = Vec::new();
    for (key, v) in &orders {
        check!(c, key.starts_with(&format!("dl/orders/{day}/")), "{key}");
        check_eq!(c, v["deadLetterReason"], "NonRetriableStatus", "{v}");
        check_eq!(c, v["lastHttpStatusCode"], 400, "{v}");
        check_eq!(c, v["deliveryAttempts"], 1, "{v}");
        check_eq!(
            c,
            v["subject"],
            "orders",
            "custom: the destination is the subject"
        );
        check!(c, v["data"]["n"].is_number(), "the body as JSON data: {v}");
        ids.push(v["id"].as_str().unwrap_or_default());
    }
    ids.sort_unstable();
    check_eq!(c, ids, ["o0", "o1", "o2", "o3", "o4"], "each record once");

    let grid = wait_records(&c, &moto.endpoint(), "grid", 1).await;
    let g = &grid[0].1;
    check_eq!(c, g["id"], "g1");
    check_eq!(c, g["eventType"], "Shop.OrderCreated");
    check_eq!(c, g["data"], json!({"total": 3}));
    check_eq!(c, g["deadLetterReason"], "NonRetriableStatus");
    check_eq!(c, g["lastDeliveryOutcome"], "BadRequest");

    // List pages through the bucket, two at a time.
    let mut listed = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10 {
        let url = match &after {
            Some(a) => format!(
                "{}/v1/dead-letters?destination=orders&limit=2&after={a}",
                c.admin_url()
            ),
            None => format!(
                "{}/v1/dead-letters?destination=orders&limit=2",
                c.admin_url()
            ),
        };
        let page = get(&url).await;
        check_eq!(c, page.status, 200, "{}", page.text());
        let v = page.json();
        for item in v["dead_letters"].as_array().into_iter().flatten() {
            listed.push(item["id"].as_str().unwrap_or_default().to_string());
        }
        match v["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => break,
        }
    }
    listed.sort();
    check_eq!(c, listed, ["o0", "o1", "o2", "o3", "o4"], "paged once each");

    let out = cli(&c, &["show", "--destination", "orders", "o3", "--json"]).await;
    check!(c, out.success(), "CLI show: {}", out.show());
    check_eq!(c, out.json()["record"]["data"], json!({"n": 3}));

    accept.store(true, Ordering::SeqCst);
    let before = rx.count();
    let out = cli(&c, &["replay", "--destination", "orders", "o1"]).await;
    check!(c, out.success(), "CLI replay: {}", out.show());
    let got = requests(&c, &rx, before + 1, PROMPT).await;
    let replayed = &got[before];
    check_eq!(
        c,
        replayed.body.as_ref(),
        br#"{"n":1}"#,
        "the body as the app sent it"
    );
    check_eq!(
        c,
        replayed
            .headers
            .get("x-tenant")
            .and_then(|v| v.to_str().ok()),
        Some("acme")
    );
    let page = get(&format!(
        "{}/v1/dead-letters?destination=orders",
        c.admin_url()
    ))
    .await;
    let marked: HashMap<String, bool> = page.json()["dead_letters"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            (
                i["id"].as_str().unwrap_or_default().to_string(),
                i["replayed"] == true,
            )
        })
        .collect();
    check_eq!(c, marked.get("o1"), Some(&true), "{marked:?}");
    check_eq!(c, marked.values().filter(|r| **r).count(), 1, "{marked:?}");

    let out = cli(&c, &["purge", "--destination", "orders", "--yes"]).await;
    check!(c, out.success(), "CLI purge: {}", out.show());
    check!(
        c,
        out.stdout.contains("purged 5 dead letters of orders"),
        "purged five: {}",
        out.show()
    );
    check_eq!(
        c,
        records(&moto.endpoint(), "orders").len(),
        0,
        "purged from the bucket"
    );
    check_eq!(
        c,
        objects_at(&moto.endpoint(), BUCKET, "dl/orders/").len(),
        0,
        "the replay marks go with their day"
    );
    check_eq!(
        c,
        records(&moto.endpoint(), "grid").len(),
        1,
        "another destination's stay"
    );
    let puts = metric_sum(
        &c.admin_url(),
        r#"courier_object_store_requests_total{op="put",result="ok"}"#,
    )
    .await;
    check!(c, puts >= 3.0, "requests are counted: {puts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_down_for_ten_seconds_keeps_the_events_and_each_record_arrives_once() {
    const EVENTS: usize = 200;
    let moto = Moto::start(BUCKET).await;
    let gate = Gate::start(moto.addr()).await;
    let (rx, _) = support::receiver::refusing_until_set().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start(dir.path(), &rx, &gate.endpoint()).await;

    gate.close();
    for i in 0..EVENTS {
        let r = post(
            &c.url("orders"),
            format!(r#"{{"n":{i}}}"#),
            &[("Idempotency-Key", &format!("e{i}"))],
        )
        .await;
        check_eq!(c, r.status, 202, "{}", r.text());
    }
    rx.wait_for(EVENTS, PROMPT).await;
    let failing = c
        .logged(
            |l| l.contains("cannot write the dead letter; retrying"),
            PROMPT,
        )
        .await;
    check!(c, failing, "the failed write is logged");
    let view = get(&format!("{}/v1/destinations", c.admin_url()))
        .await
        .json();
    let orders = view["destinations"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == "orders")
        .cloned()
        .unwrap_or_default();
    check_eq!(
        c,
        orders["pending"],
        EVENTS,
        "the events stay in the journal: {orders}"
    );
    check_eq!(c, orders["dead_letter"]["writing"], "failing", "{orders}");
    check_eq!(
        c,
        orders["dead_letter"]["sink"],
        format!("s3://{BUCKET}/dl")
    );
    let errors = metric_sum(
        &c.admin_url(),
        r#"courier_object_store_requests_total{op="put",result="error"}"#,
    )
    .await;
    check!(c, errors >= 1.0, "failed requests are counted: {errors}");

    tokio::time::sleep(Duration::from_secs(10)).await;
    gate.open();
    support::wait_metric(
        &c,
        r#"courier_events_pending{destination="orders"}"#,
        0.0,
        Duration::from_secs(60),
    )
    .await;
    // Every event left the journal: each record is in the bucket by now.
    let got = wait_records(&c, &moto.endpoint(), "orders", EVENTS).await;
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for (_, v) in &got {
        *per_id
            .entry(v["id"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
    }
    check_eq!(c, per_id.len(), EVENTS, "every dead letter arrived");
    let twice: Vec<_> = per_id.iter().filter(|(_, n)| **n > 1).collect();
    check!(c, twice.is_empty(), "records written twice: {twice:?}");
    check_eq!(c, rx.count(), EVENTS, "an event was sent again");
    let view = get(&format!("{}/v1/destinations", c.admin_url()))
        .await
        .json();
    let writing = view["destinations"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == "orders")
        .map(|d| d["dead_letter"]["writing"].clone());
    check_eq!(c, writing, Some(json!("ok")));
}
