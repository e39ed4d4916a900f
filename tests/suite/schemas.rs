//! Event schemas end to end (docs/publishing.md "Schemas", docs/batching.md, docs/dead-letters.md): the real binary
//! refuses bad `eventgrid` and `cloudevents` requests whole, naming event
//! and field, and stores nothing; it delivers every event on its own in its
//! schema's shape; and its deliveries and dead letters are read back by the
//! schemas' own SDKs (`tests/py`: the CloudEvents SDK and azure-eventgrid),
//! libraries nobody on this project wrote.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use support::python::{check_with, request_json};
use support::{
    Courier, Receiver, Reply, behavior, check, check_eq, fail, metric_sum, post, quiet, requests,
    wait_dead_letters,
};

/// How long a test waits for something that should happen at once.
const PROMPT: Duration = Duration::from_secs(5);
/// How long a test watches for something that must not happen.
const QUIET: Duration = Duration::from_millis(500);

/// Two destinations at the receiver: `eg` (eventgrid) and `ce`
/// (cloudevents), with a dead-letter sink and fast retries.
fn config(url: &str) -> String {
    let dest = |name: &str, schema: &str| {
        format!(
            "  {name}:\n    url: {url}/{name}\n    schema: {schema}\n    retry: {{ schedule: [50ms], max_attempts: 3 }}\n"
        )
    };
    format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nlog: {{ level: debug }}\njournal: {{ dir: ./journal }}\ndead_letter: {{ dir: ./dl }}\ndestinations:\n{}{}",
        dest("eg", "eventgrid"),
        dest("ce", "cloudevents")
    )
}

fn eg_event(id: &str) -> Value {
    json!({
        "id": id,
        "topic": "/shop",
        "subject": format!("/orders/{id}"),
        "eventType": "Shop.OrderCreated",
        "eventTime": "2025-01-31T12:00:00.1234567Z",
        "data": {"order": id, "total": 12.5},
        "dataVersion": "1.0",
        "metadataVersion": "1",
    })
}

fn ce_event(id: &str) -> Value {
    json!({
        "specversion": "1.0",
        "id": id,
        "source": "/shop",
        "type": "shop.order.created",
        "subject": format!("orders/{id}"),
        "time": "2025-01-31T12:00:00Z",
        "datacontenttype": "application/json",
        "traceparent": "00-abc-01",
        "data": {"order": id},
    })
}

type Header<'a> = (&'a str, &'a str);

/// A request as the Python checkers read it.
fn as_request(headers: &[Header], body: &str) -> Value {
    let headers: BTreeMap<&str, &str> = headers.iter().copied().collect();
    json!({ "headers": headers, "body": body })
}

/// Posts `body` and expects a refusal with `status` whose JSON error names
/// `index` and `field` (when given).
async fn refused(
    c: &Courier,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
    status: u16,
    index: Option<u64>,
    field: Option<&str>,
) {
    let resp = post(&c.url(path), body.to_string(), headers).await;
    check_eq!(
        c,
        resp.status,
        status,
        "POST /{path} {body}: {}",
        resp.text()
    );
    check_eq!(c, resp.header("content-type"), Some("application/json"));
    let v = resp.json();
    let error = v["error"].as_str().unwrap_or_default();
    check!(c, !error.is_empty(), "no error text: {v}");
    check_eq!(c, v["index"].as_u64(), index, "index in {v}");
    check_eq!(c, v["field"].as_str(), field, "field in {v}");
    if let (Some(i), Some(f)) = (index, field) {
        check!(c, error.starts_with(&format!("event {i}: ")), "{v}");
        check!(c, error.contains(&format!("\"{f}\"")), "{v}");
    }
}

/// Nothing was journaled: no delivery within a short wait, and no event
/// counted as accepted.
async fn nothing_stored(c: &Courier, rx: &Receiver) {
    quiet(c, rx, 0, QUIET).await;
    let accepted = metric_sum(&c.admin_url(), "courier_events_accepted_total").await;
    check_eq!(c, accepted, 0.0, "courier_events_accepted_total");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventgrid_refusals_name_event_and_field_and_store_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let c = Courier::start(dir.path(), &config(&rx.url())).await;
    let json_ct = [("content-type", "application/json")];

    // `data` and `dataVersion` may be left out, as in Event Grid's schema
    // (publishers.rs delivers such events); a `dataVersion` given must be
    // a string.
    for field in ["id", "subject", "eventType", "eventTime"] {
        let mut bad = eg_event("e2");
        bad.as_object_mut().expect("object").remove(field);
        let body = json!([eg_event("e0"), eg_event("e1"), bad]).to_string();
        refused(&c, "eg", &body, &json_ct, 400, Some(2), Some(field)).await;
    }
    for field in ["id", "subject", "eventType", "eventTime", "dataVersion"] {
        let mut bad = eg_event("e1");
        bad[field] = json!(42);
        let body = json!([eg_event("e0"), bad]).to_string();
        refused(&c, "eg", &body, &[], 400, Some(1), Some(field)).await;
    }
    let mut bad_time = eg_event("e0");
    bad_time["eventTime"] = json!("last tuesday");
    refused(
        &c,
        "eg",
        &bad_time.to_string(),
        &[],
        400,
        Some(0),
        Some("eventTime"),
    )
    .await;
    refused(&c, "eg", "[]", &[], 400, None, None).await;
    refused(&c, "eg", "[{\"id\": ", &[], 400, None, None).await;
    let one = eg_event("e0").to_string();
    refused(
        &c,
        "eg",
        &one,
        &[("content-type", "text/plain")],
        415,
        None,
        None,
    )
    .await;
    refused(
        &c,
        "eg",
        &one,
        &[("content-type", "application/cloudevents+json")],
        415,
        None,
        None,
    )
    .await;

    nothing_stored(&c, &rx).await;
    let rejected = metric_sum(
        &c.admin_url(),
        "courier_ingress_rejected_total{destination=\"eg\",reason=\"invalid_event\"}",
    )
    .await;
    // 4 missing + 5 mistyped fields, a bad eventTime, an empty array.
    check_eq!(c, rejected, 11.0, "invalid_event rejections");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_refusals_name_event_and_field_and_store_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let c = Courier::start(dir.path(), &config(&rx.url())).await;
    let structured = [("content-type", "application/cloudevents+json")];
    let batch = [("content-type", "application/cloudevents-batch+json")];

    for field in ["specversion", "id", "source", "type"] {
        let mut bad = ce_event("c1");
        bad.as_object_mut().expect("object").remove(field);
        let body = json!([ce_event("c0"), bad]).to_string();
        refused(&c, "ce", &body, &batch, 400, Some(1), Some(field)).await;
        let mut bad = ce_event("c0");
        bad[field] = json!(7);
        refused(
            &c,
            "ce",
            &bad.to_string(),
            &structured,
            400,
            Some(0),
            Some(field),
        )
        .await;
    }
    let mut old = ce_event("c0");
    old["specversion"] = json!("0.3");
    refused(
        &c,
        "ce",
        &old.to_string(),
        &structured,
        400,
        Some(0),
        Some("specversion"),
    )
    .await;
    refused(&c, "ce", "[]", &batch, 400, None, None).await;
    refused(&c, "ce", "{\"specversion\"", &structured, 400, None, None).await;

    let binary = [
        ("ce-specversion", "1.0"),
        ("ce-id", "b1"),
        ("ce-source", "/shop"),
        ("ce-type", "shop.order.created"),
    ];
    for skip in 1..binary.len() {
        let mut headers = binary.to_vec();
        let (name, _) = headers.remove(skip);
        headers.push(("content-type", "application/json"));
        refused(&c, "ce", "{}", &headers, 400, Some(0), Some(&name[3..])).await;
    }
    let mut v03 = binary.to_vec();
    v03[0] = ("ce-specversion", "0.3");
    refused(&c, "ce", "{}", &v03, 400, Some(0), Some("specversion")).await;
    let mut broken = binary.to_vec();
    broken.push(("ce-subject", "%zz"));
    refused(&c, "ce", "{}", &broken, 400, Some(0), Some("subject")).await;

    let one = ce_event("c0").to_string();
    refused(
        &c,
        "ce",
        &one,
        &[("content-type", "application/json")],
        415,
        None,
        None,
    )
    .await;
    refused(&c, "ce", &one, &[], 415, None, None).await;

    nothing_stored(&c, &rx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eventgrid_array_is_delivered_as_arrays_of_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let c = Courier::start(dir.path(), &config(&rx.url())).await;
    let sent = vec![eg_event("e1"), eg_event("e2"), eg_event("e3")];
    let resp = post(
        &c.url("eg/hooks?x=1"),
        Value::Array(sent.clone()).to_string(),
        &[("content-type", "application/json"), ("x-trace", "t-1")],
    )
    .await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    check_eq!(
        c,
        resp.json(),
        json!({"accepted": 3, "ids": ["e1", "e2", "e3"]})
    );

    let got = requests(&c, &rx, 3, PROMPT).await;
    quiet(&c, &rx, 3, QUIET).await;
    let mut ids = Vec::new();
    for r in &got {
        check_eq!(c, r.path_and_query, "/eg/hooks?x=1");
        check_eq!(c, r.header("content-type"), Some("application/json"));
        check_eq!(c, r.header("x-trace"), Some("t-1"));
        let body = r.json();
        let events = body.as_array().cloned().unwrap_or_default();
        check_eq!(c, events.len(), 1, "an array of one: {body}");
        let id = events[0]["id"].as_str().unwrap_or_default().to_string();
        check_eq!(c, r.header("webhook-id"), Some(id.as_str()));
        ids.push(id);
    }
    ids.sort();
    check_eq!(c, ids, ["e1", "e2", "e3"]);

    let input = json!({
        "deliveries": got.iter().map(request_json).collect::<Vec<_>>(),
        "sent": sent,
        "topic": "/courier/eg",
    });
    let out = check_with("check_eventgrid.py", &[], input.to_string().as_bytes());
    check!(c, out.starts_with("ok: 3 events"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_structured_batch_and_binary_are_delivered_structured() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let c = Courier::start(dir.path(), &config(&rx.url())).await;
    let structured_ct = [("content-type", "application/cloudevents+json")];
    let batch_ct = [("content-type", "application/cloudevents-batch+json")];
    let structured = ce_event("s1").to_string();
    let batch = json!([ce_event("b1"), ce_event("b2")]).to_string();
    let binary_json = [
        ("ce-specversion", "1.0"),
        ("ce-id", "bin-json"),
        ("ce-source", "/shop"),
        ("ce-type", "shop.order.created"),
        ("ce-subject", "caf%C3%A9%20%22au%20lait%22"),
        ("ce-time", "2025-01-31T12:00:00Z"),
        ("ce-traceparent", "00-abc-01"),
        ("content-type", "application/json"),
        ("x-trace", "t-2"),
    ];
    let binary_text = [
        ("ce-specversion", "1.0"),
        ("ce-id", "bin-text"),
        ("ce-source", "/shop"),
        ("ce-type", "shop.note"),
        ("content-type", "text/plain; charset=utf-8"),
    ];
    let binary_bytes = [
        ("ce-specversion", "1.0"),
        ("ce-id", "bin-bytes"),
        ("ce-source", "/shop"),
        ("ce-type", "shop.blob"),
        ("content-type", "application/octet-stream"),
    ];
    let sends: Vec<(&[Header], &str, Vec<&str>)> = vec![
        (&structured_ct, &structured, vec!["s1"]),
        (&batch_ct, &batch, vec!["b1", "b2"]),
        (&binary_json, "{\"order\": 7}", vec!["bin-json"]),
        (&binary_text, "hello\nworld", vec!["bin-text"]),
        (&binary_bytes, "\u{1}\u{2}bytes", vec!["bin-bytes"]),
    ];
    let mut sent = Vec::new();
    for (headers, body, ids) in &sends {
        let resp = post(&c.url("ce"), body.to_string(), headers).await;
        check_eq!(c, resp.status, 202, "{}", resp.text());
        check_eq!(c, resp.json(), json!({"accepted": ids.len(), "ids": ids}));
        sent.push(as_request(headers, body));
    }

    let got = requests(&c, &rx, 6, PROMPT).await;
    quiet(&c, &rx, 6, QUIET).await;
    for r in &got {
        check_eq!(
            c,
            r.header("content-type"),
            Some("application/cloudevents+json; charset=utf-8")
        );
        let ce_headers: Vec<&str> = r
            .headers
            .keys()
            .map(|k| k.as_str())
            .filter(|k| k.starts_with("ce-"))
            .collect();
        check!(
            c,
            ce_headers.is_empty(),
            "ce-* headers forwarded: {ce_headers:?}"
        );
        let body = r.json();
        check_eq!(c, r.header("webhook-id"), body["id"].as_str());
        if body["id"] == "bin-json" {
            check_eq!(c, body["subject"], "café \"au lait\"");
            check_eq!(c, body["data"], json!({"order": 7}));
            check_eq!(c, r.header("x-trace"), Some("t-2"));
        }
        if body["id"] == "bin-bytes" {
            check_eq!(c, body["data_base64"], "AQJieXRlcw==");
        }
    }
    let input = json!({
        "delivered": got.iter().map(request_json).collect::<Vec<_>>(),
        "sent": sent,
    });
    let out = check_with("check_cloudevents.py", &[], input.to_string().as_bytes());
    check!(c, out.starts_with("ok: 6 events"), "{out}");
}

/// The fields courier adds to a dead letter, per schema.
const EG_FIELDS: [&str; 8] = [
    "deadLetterTime",
    "deadLetterReason",
    "deliveryAttempts",
    "lastDeliveryOutcome",
    "lastHttpStatusCode",
    "publishTime",
    "lastDeliveryAttemptTime",
    "courierRequest",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_keep_each_schemas_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let c = Courier::start(dir.path(), &config(&rx.url())).await;

    let sent_eg = eg_event("dl-e1");
    let resp = post(
        &c.url("eg/p?q=1"),
        sent_eg.to_string(),
        &[("x-trace", "t-3")],
    )
    .await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    let binary = [
        ("ce-specversion", "1.0"),
        ("ce-id", "dl-c1"),
        ("ce-source", "/shop"),
        ("ce-type", "shop.order.created"),
        ("ce-subject", "orders%2F1"),
        ("content-type", "application/json"),
    ];
    let resp = post(&c.url("ce"), "{\"order\": 1}", &binary).await;
    check_eq!(c, resp.status, 202, "{}", resp.text());

    let (_, eg) = wait_dead_letters(&c, "eg", 1, PROMPT).await;
    let (_, ce) = wait_dead_letters(&c, "ce", 1, PROMPT).await;
    check_eq!(c, rx.count(), 2, "one attempt each");
    let record = &eg[0];
    check_eq!(c, record["deadLetterReason"], "NonRetriableStatus");
    check_eq!(c, record["deliveryAttempts"], 1);
    check_eq!(c, record["lastDeliveryOutcome"], "BadRequest");
    check_eq!(c, record["lastHttpStatusCode"], 400);
    check!(c, record["publishTime"].is_string(), "{record}");
    check!(c, record["lastDeliveryAttemptTime"].is_string(), "{record}");
    // `seq`, the event's in the journal, keys the record (written once).
    let mut request = record["courierRequest"].clone();
    let seq = request.as_object_mut().and_then(|r| r.remove("seq"));
    check!(c, seq.as_ref().is_some_and(Value::is_i64), "{record}");
    check_eq!(
        c,
        request,
        json!({"id": "dl-e1", "method": "POST", "path": "/p?q=1", "headers": {"x-trace": "t-3"}})
    );
    check!(c, record["deadLetterTime"].is_string(), "{record}");
    // Replay rebuilds the event: the record without courier's fields.
    let mut event = record.as_object().cloned().unwrap_or_default();
    for k in EG_FIELDS {
        event.remove(k);
    }
    check_eq!(c, Value::Object(event), sent_eg);
    let out = check_with(
        "check_eventgrid.py",
        &[],
        json!({ "dead_letters": eg }).to_string().as_bytes(),
    );
    check!(c, out.contains("1 dead letters"), "{out}");

    let record = &ce[0];
    check_eq!(c, record["deadletterreason"], "NonRetriableStatus");
    check_eq!(c, record["deliveryattempts"], 1);
    check_eq!(c, record["lastdeliveryoutcome"], "BadRequest");
    check_eq!(c, record["lasthttpstatuscode"], 400);
    check!(c, record["publishtime"].is_string(), "{record}");
    check!(c, record["lastdeliveryattempttime"].is_string(), "{record}");
    check!(c, record.get("deadLetterReason").is_none(), "{record}");
    let mut event = record.as_object().cloned().unwrap_or_default();
    for k in EG_FIELDS {
        event.remove(&k.to_ascii_lowercase());
    }
    // The CloudEvents SDK reads the record, less courier's fields, as the
    // event the app sent in binary mode.
    let input = json!({
        "delivered": [as_request(
            &[("content-type", "application/cloudevents+json")],
            &Value::Object(event).to_string(),
        )],
        "sent": [as_request(&binary, "{\"order\": 1}")],
    });
    let out = check_with("check_cloudevents.py", &[], input.to_string().as_bytes());
    check!(c, out.starts_with("ok: 1 events"), "{out}");
    if rx.count() != 2 {
        fail!(c, "a dead-lettered event was attempted again");
    }
}
