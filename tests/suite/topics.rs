//! Topics end to end (docs/publishing.md "Topics"): the real binary fans each event
//! posted to a topic out to every subscriber whose filter matches, exactly
//! those and each once; counts and reports unmatched events; refuses bad
//! requests whole; and a SIGKILL right after the 200s loses no copy.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use support::python::{check_with, request_json};
use support::{
    Courier, Received, Receiver, check, check_eq, fail, get, post, quiet, requests, wait_metric,
};

/// How long a test waits for something that should happen at once.
const PROMPT: Duration = Duration::from_secs(10);
/// How long a test watches for something that must not happen.
const QUIET: Duration = Duration::from_millis(500);

/// A config with `destinations` (name, url, schema) and the `topics` block
/// as written.
fn config(destinations: &[(&str, String, &str)], topics: &str) -> String {
    let mut yaml = "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nlog: { level: debug }\njournal: { dir: ./journal }\ndestinations:\n".to_string();
    for (name, url, schema) in destinations {
        yaml.push_str(&format!(
            "  {name}:\n    url: {url}\n    schema: {schema}\n    retry: {{ schedule: [50ms], max_attempts: 30, jitter: 0 }}\n"
        ));
    }
    yaml.push_str(topics);
    yaml
}

fn eg_event(id: &str, event_type: &str, subject: &str) -> Value {
    json!({
        "id": id,
        "subject": subject,
        "eventType": event_type,
        "eventTime": "2025-01-31T12:00:00Z",
        "data": {"n": id},
        "dataVersion": "1.0",
    })
}

fn ids_of(got: &[Received]) -> BTreeSet<String> {
    got.iter()
        .map(|r| r.header("webhook-id").unwrap_or("").to_string())
        .collect()
}

/// Waits for exactly `want.len()` deliveries at `rx` (no more within
/// `QUIET`) and checks their ids are exactly `want`.
async fn delivered_exactly(c: &Courier, rx: &Receiver, who: &str, want: &BTreeSet<String>) {
    let got = requests(c, rx, want.len(), PROMPT).await;
    quiet(c, rx, want.len(), QUIET).await;
    let got = ids_of(&got);
    let extra: Vec<&String> = got.difference(want).collect();
    let missing: Vec<&String> = want.difference(&got).collect();
    check!(
        c,
        extra.is_empty() && missing.is_empty(),
        "{who}: extra {extra:?}, missing {missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_eventgrid_events_reach_exactly_the_subscribers_whose_filters_match() {
    let (orders, images, audit) = (
        Receiver::ok().await,
        Receiver::ok().await,
        Receiver::ok().await,
    );
    let topics = "topics:\n  shop:\n    schema: eventgrid\n    subscribers:\n      orders: { event_types: [Shop.OrderCreated, shop.ordershipped] }\n      images: { subject_begins_with: /blobs/, subject_ends_with: .jpg }\n      audit: {}\n";
    let yaml = config(
        &[
            ("orders", orders.url(), "eventgrid"),
            ("images", images.url(), "eventgrid"),
            ("audit", audit.url(), "eventgrid"),
        ],
        topics,
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &yaml).await;

    const TYPES: [&str; 4] = [
        "Shop.OrderCreated",
        "SHOP.ORDERSHIPPED",
        "Shop.BlobCreated",
        "Shop.OrderCreatedLater",
    ];
    const SUBJECTS: [&str; 5] = [
        "/orders/{}",
        "/blobs/{}.jpg",
        "/blobs/{}.png",
        "/BLOBS/{}.JPG",
        "/other/{}.jpg",
    ];
    let events: Vec<Value> = (0..50)
        .map(|i| {
            let subject = SUBJECTS[i % 5].replace("{}", &i.to_string());
            eg_event(&format!("evt-{i:02}"), TYPES[i % 4], &subject)
        })
        .collect();
    // What each filter takes, worked out here independently: event types
    // ignore case, subjects ignore case (Event Grid's defaults).
    let take = |pred: &dyn Fn(&str, &str) -> bool| -> Vec<Value> {
        events
            .iter()
            .filter(|e| {
                pred(
                    &e["eventType"].as_str().unwrap_or("").to_lowercase(),
                    &e["subject"].as_str().unwrap_or("").to_lowercase(),
                )
            })
            .cloned()
            .collect()
    };
    let want_orders = take(&|t, _| t == "shop.ordercreated" || t == "shop.ordershipped");
    let want_images = take(&|_, s| s.starts_with("/blobs/") && s.ends_with(".jpg"));
    let want_audit = events.clone();
    // The mix is meant to leave every filter some events and some not.
    check!(c, want_orders.len() == 26, "{}", want_orders.len());
    check!(c, want_images.len() == 20, "{}", want_images.len());

    let resp = post(
        &c.url("shop"),
        Value::Array(events.clone()).to_string(),
        &[("content-type", "application/json")],
    )
    .await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    let v = resp.json();
    let copies = want_orders.len() + want_images.len() + want_audit.len();
    check_eq!(c, v["accepted"].as_u64(), Some(copies as u64), "{v}");
    check_eq!(c, v["unmatched"].as_u64(), Some(0), "{v}");
    let ids: Vec<&str> = events.iter().filter_map(|e| e["id"].as_str()).collect();
    check_eq!(c, v["ids"], json!(ids), "{v}");

    let id_set = |es: &[Value]| -> BTreeSet<String> {
        es.iter()
            .filter_map(|e| e["id"].as_str())
            .map(str::to_string)
            .collect()
    };
    delivered_exactly(&c, &orders, "orders", &id_set(&want_orders)).await;
    delivered_exactly(&c, &images, "images", &id_set(&want_images)).await;
    delivered_exactly(&c, &audit, "audit", &id_set(&want_audit)).await;

    for (rx, sent) in [
        (&orders, &want_orders),
        (&images, &want_images),
        (&audit, &want_audit),
    ] {
        let input = json!({
            "deliveries": rx.received().iter().map(request_json).collect::<Vec<_>>(),
            "sent": sent,
            // The topic's name in every subscriber's copy, as Event Grid's.
            "topic": "/courier/shop",
        });
        let out = check_with("check_eventgrid.py", &[], input.to_string().as_bytes());
        check!(
            c,
            out.starts_with(&format!("ok: {} events", sent.len())),
            "{out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_topic_filters_on_type_and_subject() {
    let (paid, eu) = (Receiver::ok().await, Receiver::ok().await);
    let topics = "topics:\n  orders-ce:\n    schema: cloudevents\n    subscribers:\n      paid: { event_types: [shop.order.paid] }\n      eu: { subject_begins_with: eu/, subject_ends_with: /1, subject_case_sensitive: true }\n";
    let yaml = config(
        &[
            ("paid", paid.url(), "cloudevents"),
            ("eu", eu.url(), "cloudevents"),
        ],
        topics,
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &yaml).await;
    let ce = |id: &str, ty: &str, subject: Option<&str>| {
        let mut e = json!({"specversion": "1.0", "id": id, "source": "/shop", "type": ty, "data": {"id": id}});
        if let Some(s) = subject {
            e["subject"] = json!(s);
        }
        e
    };
    let batch = json!([
        ce("a", "shop.order.paid", Some("eu/orders/1")), // paid, eu
        ce("b", "Shop.Order.Paid", None),                // paid (type ignores case)
        ce("c", "shop.order.created", Some("eu/orders/1")), // eu
        ce("d", "shop.order.created", Some("EU/orders/1")), // none: case-sensitive subject
        ce("e", "shop.order.created", None),             // none: no subject
        ce("f", "shop.order.paid", Some("us/orders/1")), // paid
    ]);
    let resp = post(
        &c.url("orders-ce"),
        batch.to_string(),
        &[("content-type", "application/cloudevents-batch+json")],
    )
    .await;
    check_eq!(c, resp.status, 202, "{}", resp.text());
    let v = resp.json();
    check_eq!(c, v["accepted"].as_u64(), Some(5), "{v}");
    check_eq!(c, v["unmatched"].as_u64(), Some(2), "{v}");
    check_eq!(c, v["ids"], json!(["a", "b", "c", "d", "e", "f"]), "{v}");
    let set = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    delivered_exactly(&c, &paid, "paid", &set(&["a", "b", "f"])).await;
    delivered_exactly(&c, &eu, "eu", &set(&["a", "c"])).await;
    for r in paid.received().iter().chain(eu.received().iter()) {
        check!(
            c,
            r.header("content-type")
                .is_some_and(|t| t.starts_with("application/cloudevents+json")),
            "{:?}",
            r.headers
        );
        let id = r.header("webhook-id").unwrap_or("");
        let body = r.json();
        check_eq!(c, body["id"].as_str(), Some(id), "{}", r.text());
    }
    // A single structured event in binary mode goes through the same filters.
    let resp = post(
        &c.url("orders-ce"),
        "{\"x\":1}",
        &[
            ("content-type", "application/json"),
            ("ce-specversion", "1.0"),
            ("ce-id", "g"),
            ("ce-source", "/shop"),
            ("ce-type", "shop.order.paid"),
        ],
    )
    .await;
    check_eq!(c, resp.status, 202, "{}", resp.text());
    check_eq!(c, resp.json()["accepted"].as_u64(), Some(1));
    let got = requests(&c, &paid, 4, PROMPT).await;
    check_eq!(c, got[3].header("webhook-id"), Some("g"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_events_are_accepted_and_counted_and_bad_requests_store_nothing() {
    let orders = Receiver::ok().await;
    let topics = "topics:\n  shop:\n    schema: eventgrid\n    subscribers:\n      orders: { event_types: [Shop.OrderCreated] }\n";
    let yaml = config(&[("orders", orders.url(), "eventgrid")], topics)
        .replace("journal:", "ingress: { dedupe_window: 1m }\njournal:");
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &yaml).await;
    let events = json!([
        eg_event("m1", "Shop.OrderCreated", "/o/1"),
        eg_event("u1", "Shop.Other", "/o/2"),
        eg_event("m2", "shop.ordercreated", "/o/3"),
        eg_event("u2", "Shop.Else", "/o/4"),
        eg_event("u3", "Shop.Else", "/o/5"),
    ]);
    let resp = post(&c.url("shop/sub/path?x=1"), events.to_string(), &[]).await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    let v = resp.json();
    check_eq!(
        c,
        v,
        json!({"accepted": 2, "ids": ["m1", "u1", "m2", "u2", "u3"], "unmatched": 3})
    );
    wait_metric(
        &c,
        "courier_events_unmatched_total{topic=\"shop\"}",
        3.0,
        PROMPT,
    )
    .await;
    let got = requests(&c, &orders, 2, PROMPT).await;
    quiet(&c, &orders, 2, QUIET).await;
    check_eq!(
        c,
        ids_of(&got),
        ["m1", "m2"]
            .iter()
            .map(|s| s.to_string())
            .collect::<BTreeSet<_>>()
    );
    // The app's /rest?query follows the copy to the subscriber's url.
    check!(
        c,
        got.iter().all(|r| r.path_and_query == "/sub/path?x=1"),
        "{:?}",
        got.iter().map(|r| &r.path_and_query).collect::<Vec<_>>()
    );

    // Only unmatched events: accepted, nothing stored, counted.
    let resp = post(
        &c.url("shop"),
        json!([eg_event("u4", "Nope", "/x")]).to_string(),
        &[],
    )
    .await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    check_eq!(
        c,
        resp.json(),
        json!({"accepted": 0, "ids": ["u4"], "unmatched": 1})
    );
    wait_metric(
        &c,
        "courier_events_unmatched_total{topic=\"shop\"}",
        4.0,
        PROMPT,
    )
    .await;

    // A repeat within the dedupe window: acknowledged, reported with its
    // subscriber, not delivered again.
    let resp = post(
        &c.url("shop"),
        json!([eg_event("m1", "Shop.OrderCreated", "/o/1")]).to_string(),
        &[],
    )
    .await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    check_eq!(
        c,
        resp.json()["duplicates"],
        json!([{"id": "m1", "destination": "orders"}])
    );

    // All or nothing: one bad event refuses the whole request.
    let mut bad = events.clone();
    bad[3]["eventTime"] = json!("yesterday");
    bad[0]["id"] = json!("new-1");
    let resp = post(&c.url("shop"), bad.to_string(), &[]).await;
    check_eq!(c, resp.status, 400, "{}", resp.text());
    let v = resp.json();
    check_eq!(c, v["index"].as_u64(), Some(3), "{v}");
    check_eq!(c, v["field"].as_str(), Some("eventTime"), "{v}");
    let resp = post(
        &c.url("shop"),
        "{}",
        &[("content-type", "application/cloudevents+json")],
    )
    .await;
    check_eq!(c, resp.status, 415, "{}", resp.text());
    quiet(&c, &orders, 2, QUIET).await;

    // An unknown name lists both destinations and topics; GET is refused.
    let resp = post(&c.url("nope"), "{}", &[]).await;
    check_eq!(c, resp.status, 404, "{}", resp.text());
    let v = resp.json();
    check_eq!(c, v["destinations"], json!(["orders"]), "{v}");
    check_eq!(c, v["topics"], json!(["shop"]), "{v}");
    let resp = get(&c.url("shop")).await;
    check_eq!(c, resp.status, 405, "{}", resp.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_copy_acknowledged_before_a_sigkill_is_delivered_after_restart() {
    let (orders, audit) = (Receiver::ok().await, Receiver::ok().await);
    let topics = "topics:\n  shop:\n    schema: eventgrid\n    subscribers:\n      orders: { subject_begins_with: /orders/ }\n      audit: {}\n";
    let yaml = config(
        &[
            ("orders", orders.url(), "eventgrid"),
            ("audit", audit.url(), "eventgrid"),
        ],
        topics,
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut c = Courier::start(tmp.path(), &yaml).await;
    // Paused, so that nothing is delivered before the kill: every copy must
    // come from the journal after the restart (then the pauses, which
    // outlive the kill, are lifted).
    for name in ["orders", "audit"] {
        let url = format!("{}/v1/destinations/{name}/pause", c.admin_url());
        let resp = support::admin_post(&url, "", &[]).await;
        check_eq!(c, resp.status, 200, "{}", resp.text());
    }
    let mut want_orders = BTreeSet::new();
    let mut want_audit = BTreeSet::new();
    for r in 0..20 {
        let events: Vec<Value> = (0..5)
            .map(|i| {
                let id = format!("k-{r}-{i}");
                let subject = if i % 2 == 0 { "/orders/x" } else { "/blobs/x" };
                eg_event(&id, "T", subject)
            })
            .collect();
        let resp = post(
            &c.url("shop"),
            Value::Array(events.clone()).to_string(),
            &[],
        )
        .await;
        check_eq!(c, resp.status, 200, "{}", resp.text());
        for e in &events {
            let id = e["id"].as_str().unwrap_or("").to_string();
            if e["subject"] == "/orders/x" {
                want_orders.insert(id.clone());
            }
            want_audit.insert(id);
        }
    }
    c.kill();
    check_eq!(
        c,
        orders.count() + audit.count(),
        0,
        "delivered before the kill"
    );
    c.restart().await;
    for name in ["orders", "audit"] {
        let url = format!("{}/v1/destinations/{name}/resume", c.admin_url());
        let resp = support::admin_post(&url, "", &[]).await;
        check_eq!(c, resp.status, 200, "{}", resp.text());
    }
    // At least once: every copy arrives; a repeat would not be a loss.
    for (rx, want, who) in [
        (&orders, &want_orders, "orders"),
        (&audit, &want_audit, "audit"),
    ] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let missing = loop {
            let got = ids_of(&rx.received());
            let missing: Vec<String> = want.difference(&got).cloned().collect();
            if missing.is_empty() || tokio::time::Instant::now() > deadline {
                break missing;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if !missing.is_empty() {
            fail!(c, "{who}: copies lost after SIGKILL: {missing:?}");
        }
        let extra: Vec<String> = ids_of(&rx.received()).difference(want).cloned().collect();
        check!(c, extra.is_empty(), "{who}: unexpected ids {extra:?}");
    }
    check_eq!(c, want_orders.len(), 60);
    check_eq!(c, want_audit.len(), 100);
}

/// A topic's request is stored whole or not at all (docs/publishing.md): when one
/// subscriber it needs a copy for is past its share of the journal
/// (`max_pending_bytes`), the request is refused 503 naming that one, and
/// the others get nothing of it; a request that needs no copy for the full
/// subscriber is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_needing_a_copy_for_a_full_subscriber_is_refused_whole() {
    let (_held, sick_port) = support::refusing_port();
    let healthy = Receiver::ok().await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nlog: {{ level: debug }}\n\
         journal: {{ dir: ./journal, max_bytes: 1MiB }}\n\
         ingress: {{ max_body_bytes: 64KiB }}\n\
         destinations:\n  \
           sick: {{ url: 'http://127.0.0.1:{sick_port}/', schema: eventgrid, max_pending_bytes: 64KiB }}\n  \
           healthy: {{ url: '{}/', schema: eventgrid }}\n\
         topics:\n  shop:\n    schema: eventgrid\n    subscribers:\n      \
           sick: {{ event_types: [Shop.OrderCreated] }}\n      healthy: {{}}\n",
        healthy.url()
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &yaml).await;
    let url = c.url("shop");
    let publish = |id: &str, event_type: &str| {
        let mut e = eg_event(id, event_type, "/orders/1");
        e["data"] = json!({ "pad": "x".repeat(8 * 1024) });
        post(
            &url,
            Value::Array(vec![e]).to_string(),
            &[("content-type", "application/json")],
        )
    };
    let mut accepted = BTreeSet::new();
    let mut refused = None;
    for i in 0..16 {
        let id = format!("fill-{i}");
        let resp = publish(&id, "Shop.OrderCreated").await;
        if resp.status != 200 {
            refused = Some(resp);
            break;
        }
        accepted.insert(id);
    }
    let Some(refused) = refused else {
        fail!(
            c,
            "16 copies of 8 KiB stored for a subscriber with a 64 KiB share"
        );
    };
    check_eq!(c, refused.status, 503, "{}", refused.text());
    let body = refused.json();
    check_eq!(c, body["reason"], "destination_full", "{body}");
    check_eq!(c, body["destination"], "sick", "{body}");
    check_eq!(c, body["max_pending_bytes"], 64 * 1024, "{body}");
    check!(c, refused.header("retry-after").is_some(), "{refused:?}");
    wait_metric(
        &c,
        "courier_ingress_rejected_total{destination=\"shop\",reason=\"destination_full\"}",
        1.0,
        PROMPT,
    )
    .await;

    // Not needing `sick`: accepted, one copy.
    let resp = publish("other-0", "Shop.OrderPaid").await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    check_eq!(c, resp.json()["accepted"], 1, "{}", resp.text());
    accepted.insert("other-0".to_string());
    // The refused request's healthy copy was never stored.
    delivered_exactly(&c, &healthy, "healthy", &accepted).await;
}
