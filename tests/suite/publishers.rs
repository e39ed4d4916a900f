//! Publishers' own SDKs (docs/publishing.md; issues #11, #30): the Python SDK
//! azure-eventgrid's `EventGridPublisherClient` (tests/py/publish_azure.py)
//! unchanged, and the Node SDK @azure/eventgrid's (tests/node/publish.mjs)
//! with `allowInsecureConnection: true`, which nobody on this project wrote,
//! send `EventGridEvent`s and `CloudEvent`s to courier and return normally;
//! the topic key (`aeg-sas-key`, or a signature in `aeg-sas-token`) is
//! courier's ingress credential: never forwarded, logged or written to a
//! dead-letter record, and checked against `ingress.keys_from_env` when
//! that is set. What is delivered reads as Event Grid's deliveries to both
//! SDKs' consumer side: the Node `EventGridDeserializer` and the Python
//! `EventGridEvent.from_dict`/`from_json` accept every event (each has
//! `topic` and `metadataVersion`), the `aeg-*` delivery headers are there,
//! and neither the SDK's `api-version` query nor its `User-Agent` travels.

use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use support::{
    Courier, Received, Receiver, Reply, behavior, check, check_eq, files_under, post, quiet,
    requests, wait_dead_letters, wait_metric,
};

const PROMPT: Duration = Duration::from_secs(10);
/// A topic key as Azure shows one: base64 of 32 bytes.
const KEY: &str = "bm90LWEtcmVhbC10b3BpYy1rZXktMDEyMzQ1Njc4OTA=";
const WRONG_KEY: &str = "YW5vdGhlci10b3BpYy1rZXktMDEyMzQ1Njc4OTAxMjM=";

/// `eg` (eventgrid) and `ce` (cloudevents) at the receiver, and `gone`
/// (eventgrid) whose endpoint answers 400, so its events are dead-lettered.
fn config(url: &str, ingress: &str) -> String {
    let dest = |name: &str, schema: &str| {
        format!(
            "  {name}:\n    url: {url}/{name}\n    schema: {schema}\n    retry: {{ schedule: [20ms], jitter: 0 }}\n    status: {{ min_delay: {{ 503: 20ms }} }}\n"
        )
    };
    format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nlog: {{ level: debug }}\njournal: {{ dir: ./journal }}\ndead_letter: {{ dir: ./dl }}\n{ingress}destinations:\n{}{}{}",
        dest("eg", "eventgrid"),
        dest("ce", "cloudevents"),
        dest("gone", "eventgrid"),
    )
}

/// A receiver that answers 400 on `/gone`, and 503 elsewhere until `open`.
async fn receiver() -> (Receiver, Arc<AtomicBool>) {
    let open = Arc::new(AtomicBool::new(false));
    let flag = open.clone();
    let rx = Receiver::start(behavior(move |r, _| {
        if r.path_and_query.starts_with("/gone") {
            Reply::status(400)
        } else if flag.load(Ordering::SeqCst) {
            Reply::status(200)
        } else {
            Reply::status(503)
        }
    }))
    .await;
    (rx, open)
}

/// Runs the SDK publisher; its exit status says whether `send` returned.
async fn publish(
    c: &Courier,
    route: &str,
    key: &str,
    credential: &str,
    kind: &str,
    ids: &[&str],
) -> Output {
    let mut cmd = Command::new(support::python::python());
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/py/publish_azure.py"
    ))
    .arg(c.url(route))
    .args([key, credential, kind])
    .args(ids)
    .stdin(Stdio::null());
    tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("run python")
}

fn show(o: &Output) -> String {
    format!(
        "{}\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ids_of(got: &[support::Received]) -> Vec<String> {
    let mut ids: Vec<String> = got
        .iter()
        .flat_map(|r| {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            match v {
                serde_json::Value::Array(a) => a,
                one => vec![one],
            }
        })
        .filter_map(|e| e["id"].as_str().map(String::from))
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Without ingress keys: both kinds of send return normally (Event Grid's
/// 200), the events survive a SIGKILL right after, and the key is in no
/// delivered request, log line or dead-letter file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_azure_sdk_publishes_unchanged_and_its_key_goes_nowhere() {
    let (rx, open) = receiver().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    // tower-http's request span, which prints headers, is on only when
    // asked for: ask, so that the masking below is seen to work.
    let mut c = Courier::start_with_env(
        support::courier_bin(),
        tmp.path(),
        &config(&rx.url(), ""),
        &[("COURIER_LOG", "warn,courier=debug,tower_http=debug")],
    )
    .await;

    for (route, kind, ids) in [
        ("eg", "eventgrid", &["eg-1", "eg-2"][..]),
        ("ce", "cloudevent", &["ce-1"][..]),
        ("gone", "eventgrid", &["dl-1"][..]),
    ] {
        let out = publish(&c, route, KEY, "key", kind, ids).await;
        check!(
            c,
            out.status.success(),
            "SDK send to {route}: {}",
            show(&out)
        );
    }
    wait_dead_letters(&c, "gone", 1, PROMPT).await;
    // dl-1 is done with (its journal entry too), so it is not sent again.
    let gone = r#"courier_events_pending{destination="gone"}"#;
    wait_metric(&c, gone, 0.0, PROMPT).await;
    // Acknowledged, then killed before any delivery could succeed.
    c.kill();
    open.store(true, Ordering::SeqCst);
    // Only what arrives after the restart counts: the 503s before do not.
    let before = rx.count();
    c.restart().await;
    let after = || rx.received().split_off(before);
    let deadline = tokio::time::Instant::now() + PROMPT;
    // Bounded by the deadline.
    while ids_of(&after()) != ["ce-1", "eg-1", "eg-2"] {
        check!(
            c,
            tokio::time::Instant::now() < deadline,
            "delivered after the restart {:?}",
            ids_of(&after())
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for r in rx.received() {
        check!(c, !r.headers.contains_key("aeg-sas-key"), "{:?}", r.headers);
        let head = format!("{:?}", r.headers);
        check!(c, !head.contains(KEY), "the key was forwarded: {head}");
        check!(
            c,
            !String::from_utf8_lossy(&r.body).contains(KEY),
            "in a body"
        );
        not_the_publishers(&c, &r);
    }
    let eg: Vec<Received> = rx
        .received()
        .into_iter()
        .filter(|r| r.path_and_query.starts_with("/eg"))
        .collect();
    for r in &eg {
        event_grid_headers(&c, r, "EG");
    }
    consumers_accept(&c, &eg, "eventgrid");
    let (_, gone) = wait_dead_letters(&c, "gone", 1, PROMPT).await;
    check_eq!(c, gone[0]["topic"], "/courier/gone", "{}", gone[0]);
    let input = serde_json::json!({ "dead_letters": gone });
    let out = support::python::check_with("check_eventgrid.py", &[], input.to_string().as_bytes());
    check!(c, out.contains("1 dead letters"), "{out}");
    let files = files_under(&tmp.path().join("dl"));
    check!(c, !files.is_empty(), "no dead-letter file");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        check!(c, text.contains("dl-1"), "{}: {text}", f.display());
        check!(
            c,
            !text.contains(KEY),
            "the key is in {}: {text}",
            f.display()
        );
        check!(c, !text.contains("aeg-sas"), "{}: {text}", f.display());
    }
    // The request span printed the header's name, not its value.
    check!(
        c,
        c.logged(|l| l.contains("\"aeg-sas-key\": Sensitive"), PROMPT)
            .await,
        "no request span logged the header"
    );
    check!(
        c,
        !c.settled_logs().await.contains(KEY),
        "the key is in the log"
    );
}

/// With `ingress.keys_from_env`: the SDK's key and its signature are
/// admitted, a wrong key makes `send` raise and stores nothing, and
/// `Authorization: Bearer <key>` is admitted and kept back, while without
/// keys an app's `Authorization` travels to the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_keys_admit_the_sdk_and_refuse_anything_else() {
    let (rx, open) = receiver().await;
    open.store(true, Ordering::SeqCst);
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = config(
        &rx.url(),
        "ingress: { keys_from_env: [TEST_INGRESS_KEY] }\n",
    );
    let c = Courier::start_with_env(
        support::courier_bin(),
        tmp.path(),
        &yaml,
        &[("TEST_INGRESS_KEY", KEY)],
    )
    .await;

    for (credential, kind, id) in [
        ("key", "eventgrid", "k-1"),
        ("sas", "eventgrid", "s-1"),
        ("sas", "cloudevent", "s-2"),
    ] {
        let route = if kind == "eventgrid" { "eg" } else { "ce" };
        let out = publish(&c, route, KEY, credential, kind, &[id]).await;
        check!(
            c,
            out.status.success(),
            "{credential} {kind}: {}",
            show(&out)
        );
    }
    for credential in ["key", "sas"] {
        let out = publish(&c, "eg", WRONG_KEY, credential, "eventgrid", &["bad"]).await;
        check!(c, !out.status.success(), "a wrong key was admitted");
        check!(c, show(&out).contains("Unauthorized"), "{}", show(&out));
    }
    let plain = [("content-type", "application/cloudevents+json")];
    let event = r#"{"specversion":"1.0","id":"b-1","source":"/shop","type":"t"}"#;
    let resp = post(&c.url("ce"), event, &plain).await;
    check_eq!(c, resp.status, 401, "no key: {}", resp.text());
    check_eq!(c, resp.json()["reason"], "unauthorized");
    // No key: an unknown name is not told the configured ones.
    let resp = post(&c.url("nope"), event, &plain).await;
    check_eq!(c, resp.status, 401, "{}", resp.text());
    check!(c, !resp.text().contains("\"eg\""), "{}", resp.text());
    let bearer = format!("Bearer {KEY}");
    let with_bearer = [plain[0], ("authorization", bearer.as_str())];
    let resp = post(&c.url("ce"), event, &with_bearer).await;
    check_eq!(c, resp.status, 202, "bearer key: {}", resp.text());

    let got = requests(&c, &rx, 4, PROMPT).await;
    check_eq!(
        c,
        ids_of(&got),
        ["b-1", "k-1", "s-1", "s-2"],
        "nothing refused was stored"
    );
    for r in &got {
        check!(
            c,
            !r.headers.contains_key("authorization"),
            "{:?}",
            r.headers
        );
        check!(
            c,
            !r.headers.contains_key("aeg-sas-token"),
            "{:?}",
            r.headers
        );
        check!(c, !r.headers.contains_key("aeg-sas-key"), "{:?}", r.headers);
    }
    for route in ["eg", "ce"] {
        let series = format!(r#"courier_events_pending{{destination="{route}"}}"#);
        wait_metric(&c, &series, 0.0, PROMPT).await;
    }

    // Without keys, Authorization may be the endpoint's: it travels.
    let (rx2, open2) = receiver().await;
    open2.store(true, Ordering::SeqCst);
    let tmp2 = tempfile::tempdir().expect("tempdir");
    let c2 = Courier::start_with_env(
        support::courier_bin(),
        tmp2.path(),
        &config(&rx2.url(), ""),
        &[("COURIER_LOG", "warn,courier=debug,tower_http=debug")],
    )
    .await;
    let for_endpoint = [plain[0], ("authorization", "Bearer endpoint-token")];
    let resp = post(&c2.url("ce"), event, &for_endpoint).await;
    check_eq!(c2, resp.status, 202, "{}", resp.text());
    let got = requests(&c2, &rx2, 1, PROMPT).await;
    check_eq!(
        c2,
        got[0].headers.get("authorization").map(|v| v.as_bytes()),
        Some(&b"Bearer endpoint-token"[..])
    );
    check!(
        c2,
        c2.logged(|l| l.contains("\"authorization\": Sensitive"), PROMPT)
            .await,
        "no request span logged the header"
    );
    check!(
        c2,
        !c2.settled_logs().await.contains("endpoint-token"),
        "Authorization is in the log"
    );
}

/// What an attempt must not carry from an Event Grid SDK's publish: the
/// `api-version` it adds for Event Grid's publish API, and its `User-Agent`.
fn not_the_publishers(c: &Courier, r: &Received) {
    check!(
        c,
        !r.path_and_query.contains("api-version"),
        "the SDK's api-version travelled: {}",
        r.path_and_query
    );
    check!(
        c,
        !r.headers.contains_key("user-agent"),
        "the SDK's user agent travelled: {:?}",
        r.headers
    );
}

/// Event Grid's delivery headers on an attempt of an eventgrid destination
/// whose subscription name (upper case) is `subscription`.
fn event_grid_headers(c: &Courier, r: &Received, subscription: &str) {
    let attempt: u32 = r
        .header("courier-delivery-attempt")
        .and_then(|a| a.parse().ok())
        .unwrap_or_default();
    check_eq!(c, r.header("aeg-event-type"), Some("Notification"));
    check_eq!(c, r.header("aeg-subscription-name"), Some(subscription));
    let before = attempt.saturating_sub(1).to_string();
    check_eq!(
        c,
        r.header("aeg-delivery-count"),
        Some(before.as_str()),
        "attempt {attempt}"
    );
    check_eq!(c, r.header("aeg-metadata-version"), Some("1"));
    let first = r.json()[0]["dataVersion"].as_str().map(String::from);
    check_eq!(c, r.header("aeg-data-version").map(String::from), first);
}

/// Both SDKs' consumer side reads every delivery of `schema`: the Node
/// `EventGridDeserializer`, and for eventgrid also the Python
/// `EventGridEvent.from_dict` and `from_json`. Returns the events as the
/// Node SDK read them.
fn consumers_accept(c: &Courier, got: &[Received], schema: &str) -> Vec<serde_json::Value> {
    let input = serde_json::json!({
        "deliveries": got.iter().map(support::python::request_json).collect::<Vec<_>>(),
    });
    let stdin = input.to_string();
    let out = support::node::check_with("check_deliveries.mjs", &[schema], stdin.as_bytes());
    let mut lines = out.lines();
    let head = lines.next().unwrap_or_default();
    let read: Vec<serde_json::Value> = lines
        .map(|l| serde_json::from_str(l).unwrap_or_default())
        .collect();
    check_eq!(c, head, format!("ok: {} events", read.len()));
    check!(c, !read.is_empty(), "nothing was read: {out}");
    if schema == "eventgrid" {
        let out = support::python::check_with("check_eventgrid.py", &[], stdin.as_bytes());
        check!(
            c,
            out.starts_with(&format!("ok: {} events", read.len())),
            "{out}"
        );
    }
    read
}

/// Runs the Node SDK publisher (`OPTIONS`: `insecure` or `defaults`); its
/// exit status says whether `send` returned.
async fn publish_node(c: &Courier, route: &str, kind: &str, options: &str, ids: &[&str]) -> Output {
    let url = c.url(route);
    let mut args = vec![url.as_str(), KEY, kind, options];
    args.extend_from_slice(ids);
    let args: Vec<String> = args.into_iter().map(String::from).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        support::node::run("publish.mjs", &args, b"")
    })
    .await
    .expect("join")
}

/// The Node SDK publishes EventGridEvents (to a destination and a topic)
/// and CloudEvents with `allowInsecureConnection: true`, and refuses
/// courier's http:// endpoint without it. Every delivery, first attempts
/// (answered 503) and retries, reads as Event Grid's: the Node
/// `EventGridDeserializer` and the Python consumer parsers accept every
/// event; `topic` is the publisher's if set, else the configured
/// `eventgrid_topic`, else `/courier/<route>`, and a topic's copies carry
/// the topic's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_sdk_publishes_with_insecure_connections_allowed_and_reads_every_delivery() {
    let rx = Receiver::start(behavior(|r, _| {
        let first = r.header("courier-delivery-attempt") == Some("1");
        Reply::status(if first { 503 } else { 200 })
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let url = rx.url();
    let dest = |name: &str, extra: &str| {
        format!(
            "  {name}:\n    url: {url}/{name}\n    {extra}\n    retry: {{ schedule: [20ms], jitter: 0 }}\n    status: {{ min_delay: {{ 503: 20ms }} }}\n"
        )
    };
    const ORDERS: &str =
        "/subscriptions/0000/resourceGroups/rg/providers/Microsoft.EventGrid/topics/orders";
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nlog: {{ level: debug }}\njournal: {{ dir: ./journal }}\ntopics:\n  shop:\n    schema: eventgrid\n    subscribers:\n      eg: {{}}\n      audit: {{}}\ndestinations:\n{}{}{}",
        dest(
            "eg",
            &format!("schema: eventgrid\n    eventgrid_topic: {ORDERS}")
        ),
        dest("audit", "schema: eventgrid"),
        dest("ce", "schema: cloudevents"),
    );
    let c = Courier::start(tmp.path(), &yaml).await;

    for (route, kind, ids) in [
        ("eg", "eventgrid", &["n-1", "n-2"][..]),
        ("shop", "eventgrid", &["s-1"][..]),
        ("ce", "cloudevent", &["c-1"][..]),
    ] {
        let out = publish_node(&c, route, kind, "insecure", ids).await;
        check!(
            c,
            out.status.success(),
            "Node SDK send to {route}: {}",
            show(&out)
        );
    }
    let out = publish_node(&c, "eg", "eventgrid", "defaults", &["never"]).await;
    check!(
        c,
        !out.status.success(),
        "sent without allowInsecureConnection"
    );
    check!(
        c,
        show(&out).contains("while allowInsecureConnection is false"),
        "{}",
        show(&out)
    );
    // A publisher's own topic and metadataVersion are kept as they are.
    let theirs = serde_json::json!([{
        "id": "p-1", "topic": "/theirs", "metadataVersion": "1", "subject": "/p",
        "eventType": "T", "eventTime": "2026-11-27T00:00:00Z", "data": null, "dataVersion": "2",
    }]);
    let resp = post(&c.url("audit"), theirs.to_string(), &[]).await;
    check_eq!(c, resp.status, 200, "{}", resp.text());

    // eg: n-1, n-2, s-1; audit: s-1, p-1; ce: c-1; each 503 then 200.
    let got = requests(&c, &rx, 12, PROMPT).await;
    quiet(&c, &rx, 12, Duration::from_millis(300)).await;
    let at = |route: &str| -> Vec<Received> {
        let path = format!("/{route}");
        got.iter()
            .filter(|r| r.path_and_query.split('?').next() == Some(path.as_str()))
            .cloned()
            .collect()
    };
    let mut topics = Vec::new();
    for (route, subscription) in [("eg", "EG"), ("audit", "AUDIT")] {
        let delivered = at(route);
        for r in &delivered {
            event_grid_headers(&c, r, subscription);
            not_the_publishers(&c, r);
        }
        for e in consumers_accept(&c, &delivered, "eventgrid") {
            let id = e["id"].as_str().unwrap_or_default().to_string();
            let topic = e["topic"].as_str().unwrap_or_default().to_string();
            check_eq!(c, e["metadataVersion"], "1", "{e}");
            topics.push((route, id, topic));
        }
    }
    topics.sort();
    topics.dedup();
    let want = |route, id: &str, topic: &str| (route, id.to_string(), topic.to_string());
    check_eq!(
        c,
        topics,
        [
            want("audit", "p-1", "/theirs"),
            want("audit", "s-1", "/courier/shop"),
            want("eg", "n-1", ORDERS),
            want("eg", "n-2", ORDERS),
            want("eg", "s-1", "/courier/shop"),
        ]
    );
    let ce = at("ce");
    check_eq!(c, ce.len(), 2, "c-1 twice");
    for r in &ce {
        not_the_publishers(&c, r);
        check!(
            c,
            r.headers.keys().all(|n| !n.as_str().starts_with("aeg-")),
            "{:?}",
            r.headers
        );
    }
    let read = consumers_accept(&c, &ce, "cloudevents");
    check!(c, read.iter().all(|e| e["id"] == "c-1"), "{read:?}");
}

/// Event Grid's optional fields, from the Python SDK's own objects:
/// `EventGridEvent(data=None)` (the SDK leaves `data` out) and one with
/// `data_version=None` (it leaves `dataVersion` out) are accepted, where
/// they were refused with 400, and delivered as Event Grid delivers them:
/// `"data": null` and `"dataVersion": ""` (with an empty
/// `aeg-data-version`), which both SDKs' consumer parsers read. An event
/// without what Event Grid requires (`eventTime`) is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdks_events_without_data_or_data_version_are_delivered_as_event_grid_stamps_them()
 {
    let (rx, open) = receiver().await;
    open.store(true, Ordering::SeqCst);
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &config(&rx.url(), "")).await;

    for (kind, ids) in [
        ("eventgrid-no-data", &["nd-1", "nd-2"][..]),
        ("eventgrid-no-version", &["nv-1"][..]),
    ] {
        let out = publish(&c, "eg", KEY, "key", kind, ids).await;
        check!(c, out.status.success(), "SDK send {kind}: {}", show(&out));
    }
    let no_time = serde_json::json!([{
        "id": "t-1", "subject": "/s", "eventType": "T", "data": {}, "dataVersion": "1",
    }]);
    let resp = post(&c.url("eg"), no_time.to_string(), &[]).await;
    check_eq!(c, resp.status, 400, "{}", resp.text());
    check!(c, resp.text().contains("eventTime"), "{}", resp.text());

    let got = requests(&c, &rx, 3, PROMPT).await;
    quiet(&c, &rx, 3, Duration::from_millis(300)).await;
    check_eq!(c, ids_of(&got), ["nd-1", "nd-2", "nv-1"]);
    for r in &got {
        event_grid_headers(&c, r, "EG");
        not_the_publishers(&c, r);
        let e = &r.json()[0];
        let id = e["id"].as_str().unwrap_or_default();
        let (data, version) = if id.starts_with("nd") {
            (serde_json::Value::Null, "1.0")
        } else {
            (serde_json::json!({ "order": id }), "")
        };
        check_eq!(c, e["data"], data, "{e}");
        check_eq!(c, e["dataVersion"], version, "{e}");
        check_eq!(c, r.header("aeg-data-version"), Some(version), "{id}");
    }
    let read = consumers_accept(&c, &got, "eventgrid");
    check_eq!(c, read.len(), 3, "{read:?}");
}
