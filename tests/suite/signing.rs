//! Signed deliveries and `from_event` headers end to end (docs/configuration.md `headers`
//! and `signing`, docs/signatures.md): the real binary delivers to a loopback `Receiver`,
//! and the reference `standardwebhooks` Python library (not our code) judges
//! every signature. Every wait is bounded; a failing check prints courier's
//! logs.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use support::python::check_with;
use support::{
    Courier, Received, Receiver, Reply, behavior, check, check_eq, config, courier_bin, fail, post,
    requests,
};

const PROMPT: Duration = Duration::from_secs(5);

/// Two secrets, as during a rotation: the old one prefixed, the new one bare
/// base64 without padding (both forms are accepted, as by the library).
const OLD: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const NEW: &str = "bmV3IGtleSBmb3IgdGhlIHJvdGF0aW9u";
/// A secret courier was not given: the library must reject with it.
const STRANGER: &str = "whsec_c3RyYW5nZXIga2V5";

async fn start(dir: &Path, yaml: &str, env: &[(&str, &str)]) -> Courier {
    Courier::start_with_env(courier_bin(), dir, yaml, env).await
}

async fn accept(c: &Courier, body: &'static [u8], headers: &[(&str, &str)]) {
    let resp = post(&c.url("orders"), body, headers).await;
    check_eq!(c, resp.status, 202, "POST /orders: {}", resp.text());
}

/// The checker's input for one request: its headers and its body (base64).
fn wire(r: &Received, body: &[u8]) -> Value {
    let headers: serde_json::Map<String, Value> = r
        .headers
        .iter()
        .filter_map(|(k, v)| Some((k.to_string(), Value::from(v.to_str().ok()?))))
        .collect();
    json!({"headers": headers, "body_b64": STANDARD.encode(body)})
}

/// Runs the reference library on `reqs` with each secret alone; returns
/// per request, per secret, `Ok(())` or the library's rejection.
fn verify(reqs: &[Value], secrets: &[&str]) -> Vec<Vec<Result<(), String>>> {
    let input = json!({"secrets": secrets, "requests": reqs}).to_string();
    let out = check_with("verify_signatures.py", &[], input.as_bytes());
    let out: Value = serde_json::from_str(&out).expect("the checker prints JSON");
    out["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|per_secret| {
            per_secret
                .as_array()
                .expect("a result per secret")
                .iter()
                .map(|r| match r["ok"].as_bool() {
                    Some(true) => Ok(()),
                    _ => Err(r["error"].to_string()),
                })
                .collect()
        })
        .collect()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

fn timestamp(c: &Courier, r: &Received) -> u64 {
    r.header("webhook-timestamp")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| fail!(c, "no numeric webhook-timestamp: {:?}", r.headers))
}

#[tokio::test]
async fn the_reference_library_verifies_with_each_rotation_secret_and_rejects_tampering() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rx = Receiver::ok().await;
    let yaml = config(
        "orders",
        &rx.url(),
        "signing: { secrets_from_env: [OLD_WHSEC, NEW_WHSEC] }",
    );
    let c = start(dir.path(), &yaml, &[("OLD_WHSEC", OLD), ("NEW_WHSEC", NEW)]).await;
    let bodies: [&'static [u8]; 3] = [
        br#"{"n":1}"#,
        "{\"text\":\"gr\u{fc}\u{df}e \u{2713}\",\"n\":2}".as_bytes(),
        b"[1, 2, 3]\n",
    ];
    let before = unix_now();
    for (i, body) in bodies.iter().enumerate() {
        let key = format!("evt-{i}");
        accept(&c, body, &[("idempotency-key", &key)]).await;
    }
    let got = requests(&c, &rx, 3, PROMPT).await;
    let after = unix_now();

    let mut exact = Vec::new();
    let mut tampered = Vec::new();
    for r in &got {
        check!(
            c,
            bodies.contains(&&r.body[..]),
            "body changed: {}",
            r.text()
        );
        check!(
            c,
            r.header("webhook-id")
                .is_some_and(|id| id.starts_with("evt-"))
        );
        let ts = timestamp(&c, r);
        check!(
            c,
            (before..=after).contains(&ts),
            "timestamp {ts} not in {before}..={after}"
        );
        let sig = r.header("webhook-signature").unwrap_or_default();
        check_eq!(
            c,
            sig.split(' ').count(),
            2,
            "one signature per secret: {sig}"
        );
        exact.push(wire(r, &r.body));
        let mut body = r.body.to_vec();
        body[1] ^= 0x01; // one byte changed, still valid UTF-8
        tampered.push(wire(r, &body));
    }

    for (i, per_secret) in verify(&exact, &[OLD, NEW, STRANGER]).iter().enumerate() {
        check!(
            c,
            per_secret[0].is_ok(),
            "request {i}, old secret: {:?}",
            per_secret[0]
        );
        check!(
            c,
            per_secret[1].is_ok(),
            "request {i}, new secret: {:?}",
            per_secret[1]
        );
        check!(
            c,
            per_secret[2].is_err(),
            "request {i} verified with a secret courier never had"
        );
    }
    for (i, per_secret) in verify(&tampered, &[OLD, NEW]).iter().enumerate() {
        for (s, r) in per_secret.iter().enumerate() {
            match r {
                Err(e) => check!(c, e.contains("No matching signature"), "request {i}: {e}"),
                Ok(()) => fail!(c, "request {i}: a tampered body verified with secret {s}"),
            }
        }
    }
    for secret in [OLD, NEW, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"] {
        check!(
            c,
            !c.settled_logs().await.contains(secret),
            "a signing secret is in the logs"
        );
    }
}

#[tokio::test]
async fn every_retry_is_signed_afresh_with_the_same_webhook_id() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rx = Receiver::start(behavior(|_, n| {
        Reply::status(if n == 0 { 503 } else { 200 })
    }))
    .await;
    // The retry comes 1.2 s later, so its timestamp is a later second.
    let yaml = config(
        "orders",
        &rx.url(),
        "signing: { secrets_from_env: [ORDERS_WHSEC] }\n\
         retry: { schedule: [1200ms], jitter: 0 }\n\
         status: { min_delay: { 503: 1200ms } }",
    );
    let c = start(dir.path(), &yaml, &[("ORDERS_WHSEC", OLD)]).await;
    accept(&c, br#"{"order":42}"#, &[]).await;
    let got = requests(&c, &rx, 2, PROMPT).await;
    let (first, second) = (&got[0], &got[1]);
    check_eq!(c, first.header("courier-delivery-attempt"), Some("1"));
    check_eq!(c, second.header("courier-delivery-attempt"), Some("2"));
    check!(c, first.header("webhook-id").is_some());
    check_eq!(
        c,
        first.header("webhook-id"),
        second.header("webhook-id"),
        "webhook-id across retries"
    );
    let (t1, t2) = (timestamp(&c, first), timestamp(&c, second));
    check!(c, t2 > t1, "the retry has a new timestamp: {t1} then {t2}");
    check!(
        c,
        first.header("webhook-signature") != second.header("webhook-signature"),
        "the retry has a new signature"
    );
    let reqs = [wire(first, &first.body), wire(second, &second.body)];
    for (i, per_secret) in verify(&reqs, &[OLD]).iter().enumerate() {
        check!(
            c,
            per_secret[0].is_ok(),
            "attempt {}: {:?}",
            i + 1,
            per_secret[0]
        );
    }
}

#[tokio::test]
async fn from_event_headers_come_from_the_json_body_and_are_left_out_when_missing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rx = Receiver::ok().await;
    let yaml = config(
        "orders",
        &rx.url(),
        "headers: { X-Subject: { from_event: subject }, X-Tenant: { from_event: data.tenant }, \
         X-Count: { from_event: data.count }, X-Region: { from_event: data.region }, \
         X-Api-Key: { from_env: ORDERS_API_KEY, secret: true } }",
    );
    let c = start(
        dir.path(),
        &yaml,
        &[("ORDERS_API_KEY", "key-4711-never-logged")],
    )
    .await;
    accept(
        &c,
        br#"{"subject":"/orders/7","data":{"tenant":"acme","count":3}}"#,
        &[("idempotency-key", "json"), ("x-region", "from-the-app")],
    )
    .await;
    let got = requests(&c, &rx, 1, PROMPT).await;
    let r = &got[0];
    check_eq!(c, r.header("x-subject"), Some("/orders/7"));
    check_eq!(c, r.header("x-tenant"), Some("acme"));
    check_eq!(c, r.header("x-count"), Some("3"));
    check_eq!(
        c,
        r.header("x-region"),
        None,
        "a missing field leaves the header out, the app's too"
    );
    check_eq!(c, r.header("x-api-key"), Some("key-4711-never-logged"));

    accept(&c, b"plain text", &[("idempotency-key", "text")]).await;
    let got = requests(&c, &rx, 2, PROMPT).await;
    let r = &got[1];
    check_eq!(c, r.header("webhook-id"), Some("text"));
    for h in ["x-subject", "x-tenant", "x-count", "x-region"] {
        check_eq!(c, r.header(h), None, "{h} on a body that is not JSON");
    }
    check_eq!(c, r.header("x-api-key"), Some("key-4711-never-logged"));
    // Logged at debug (the test config's level), without values.
    c.wait_for_log("from_event header left out", PROMPT).await;
    for secret in ["key-4711-never-logged", "acme", "/orders/7"] {
        check!(c, !c.logs().contains(secret), "{secret} is in the logs");
    }
}

/// The `python` block of docs/signatures.md that defines `verify_bytes`.
fn doc_snippet() -> String {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/signatures.md"))
        .expect("read docs/signatures.md");
    page.split("```python\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .find(|code| code.contains("def verify_bytes"))
        .expect("docs/signatures.md shows verify_bytes")
        .to_string()
}

/// Runs the doc's `verify_bytes` on each request (`wire` shape) with
/// `secret`; returns its answers.
fn verify_by_hand(reqs: &[Value], secret: &str) -> Vec<bool> {
    use std::io::Write;
    let driver = r#"
import json, sys
spec = json.load(sys.stdin)
print(json.dumps([verify_bytes(spec["secret"], r["headers"], base64.b64decode(r["body_b64"])) for r in spec["requests"]]))
"#;
    let mut script = tempfile::NamedTempFile::new().expect("temp file");
    script
        .write_all(format!("{}{driver}", doc_snippet()).as_bytes())
        .expect("write the script");
    let input = json!({"secret": secret, "requests": reqs}).to_string();
    let mut child = std::process::Command::new(support::python::python())
        .arg(script.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start python");
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes()).expect("write stdin");
    }
    let out = child.wait_with_output().expect("wait for python");
    assert!(
        out.status.success(),
        "the doc's snippet failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON list of answers")
}

/// A body that is not UTF-8 (docs/signatures.md): courier signs its bytes
/// and the page's `verify_bytes` snippet, HMAC-SHA256 by hand with no
/// library, verifies it with either rotation secret and refuses a changed
/// byte or a stranger's secret, while the reference `standardwebhooks`
/// library raises on the same request, as the page says.
#[tokio::test]
async fn a_body_that_is_not_utf8_verifies_by_hand_as_the_signatures_page_shows() {
    // A PNG signature, then bytes no UTF-8 decoder takes (0xff, 0x80).
    const BODY: &[u8] = b"\x89PNG\r\n\x1a\n\xff\xfe\x00binary \x80\xc3(";
    let dir = tempfile::tempdir().expect("temp dir");
    let rx = Receiver::ok().await;
    let yaml = config(
        "orders",
        &rx.url(),
        "signing: { secrets_from_env: [OLD_WHSEC, NEW_WHSEC] }",
    );
    let c = start(dir.path(), &yaml, &[("OLD_WHSEC", OLD), ("NEW_WHSEC", NEW)]).await;
    accept(
        &c,
        BODY,
        &[
            ("idempotency-key", "bin-1"),
            ("content-type", "application/octet-stream"),
        ],
    )
    .await;
    let got = requests(&c, &rx, 1, PROMPT).await;
    check_eq!(c, &got[0].body[..], BODY, "the body changed on the way");
    let exact = wire(&got[0], &got[0].body);
    let mut body = got[0].body.to_vec();
    body[9] ^= 0x01;
    let tampered = wire(&got[0], &body);

    for secret in [OLD, NEW] {
        let answers = verify_by_hand(&[exact.clone(), tampered.clone()], secret);
        check_eq!(c, answers, [true, false], "secret {secret}");
    }
    check_eq!(
        c,
        verify_by_hand(std::slice::from_ref(&exact), STRANGER),
        [false]
    );
    let library = verify(&[exact], &[OLD]);
    match &library[0][0] {
        Err(e) => check!(c, e.contains("UnicodeDecodeError"), "{e}"),
        Ok(()) => fail!(
            c,
            "standardwebhooks verified a non-UTF-8 body: the page is out of date"
        ),
    }
}
