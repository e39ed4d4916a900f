//! Publishers' own SDKs, unchanged (SPEC §3; issue #11): azure-eventgrid's
//! `EventGridPublisherClient` (tests/py/publish_azure.py), which nobody on
//! this project wrote, sends `EventGridEvent`s and `CloudEvent`s to courier
//! and returns normally; its topic key (`aeg-sas-key`, or a signature in
//! `aeg-sas-token`) is courier's ingress credential: never forwarded,
//! logged or written to a dead-letter record, and checked against
//! `ingress.keys_from_env` when that is set.

use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use support::{
    Courier, Receiver, Reply, behavior, check, check_eq, files_under, post, requests,
    wait_dead_letters, wait_metric,
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
    }
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
