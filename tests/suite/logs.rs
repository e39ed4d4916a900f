//! Logs an operator can read (docs/logs.md): with `log.format:
//! json` every line is one JSON object; at `info` one line per final
//! outcome of an event (`delivered`, `dead-lettered`, `dropped`) and one
//! per rejected request (`rejected`), with plain field values; never a
//! secret header or a body, unless `log.bodies: true` lets the body into
//! the lines of events given up.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use http::Method;
use serde_json::Value;
use support::client::request;
use support::{
    Courier, Receiver, Reply, behavior, check, check_eq, config, courier_bin, fail, post,
    refusing_port, wait_metric,
};

const PROMPT: Duration = Duration::from_secs(5);

const SECRET_HEADER: &str = "hdr-secret-Zq81vX";
const APP_TOKEN: &str = "app-bearer-Kp27wR";
const SAS_KEY: &str = "sas-key-Mv63nT";
const BODY_MARK: &str = "body-mark-Hx49cJ";

/// A receiver that answers by path: `/ok…` 200, `/bad…` 400, else 500.
async fn by_path() -> Receiver {
    Receiver::start(behavior(|r, _| {
        if r.path_and_query.starts_with("/ok") {
            Reply::status(200)
        } else if r.path_and_query.starts_with("/bad") {
            Reply::status(400)
        } else {
            Reply::status(500)
        }
    }))
    .await
}

/// Another destination block for a `config(...)` document (destinations
/// come last in it).
fn destination(name: &str, url: &str, extra: &str) -> String {
    let mut yaml = format!("  {name}:\n    url: {url}\n");
    for line in extra.lines().map(str::trim).filter(|l| !l.is_empty()) {
        yaml.push_str(&format!("    {line}\n"));
    }
    yaml
}

/// `config(...)` with `log:` replaced by `log`.
fn with_log(yaml: String, log: &str) -> String {
    yaml.replace("log: { level: debug }", &format!("log: {log}"))
}

/// Posts `body` and returns the one id of the answer: 202, or 200 for a
/// request that carries Event Grid's `aeg-sas-key` (an Event Grid
/// publisher, answered as Event Grid does).
async fn accept(c: &Courier, path: &str, body: &str, headers: &[(&str, &str)]) -> String {
    let resp = post(&c.url(path), body.to_string(), headers).await;
    let want = if headers.iter().any(|(n, _)| *n == "aeg-sas-key") {
        200
    } else {
        202
    };
    check_eq!(c, resp.status, want, "POST /{path}: {}", resp.text());
    let v = resp.json();
    match v["ids"].as_array().map(Vec::as_slice) {
        Some([Value::String(id)]) => id.clone(),
        _ => fail!(c, "answer without one id: {v}"),
    }
}

/// Every line of the log as a JSON object (the harness's restart markers
/// aside); fails on any other line.
fn json_lines(c: &Courier) -> Vec<serde_json::Map<String, Value>> {
    c.logs()
        .lines()
        .filter(|l| *l != "=== courier restart ===")
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(Value::Object(m)) => m,
            _ => fail!(c, "log line is not a JSON object: {l:?}"),
        })
        .collect()
}

/// The JSON lines whose message is `message`, for event `id`.
fn outcome_lines(
    lines: &[serde_json::Map<String, Value>],
    message: &str,
    id: &str,
) -> Vec<serde_json::Map<String, Value>> {
    lines
        .iter()
        .filter(|m| m.get("message") == Some(&Value::from(message)))
        .filter(|m| m.get("id") == Some(&Value::from(id)))
        .cloned()
        .collect()
}

/// Waits (bounded) until the log has a line with all of `needles`.
async fn wait_for_line(c: &Courier, needles: &[&str]) {
    let deadline = tokio::time::Instant::now() + PROMPT;
    while tokio::time::Instant::now() < deadline {
        if c.logs()
            .lines()
            .any(|l| needles.iter().all(|n| l.contains(n)))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fail!(c, "no log line with all of {needles:?}");
}

/// The only line with message `message` for `id`, checked for the fields
/// every outcome line has.
fn one_outcome(
    c: &Courier,
    lines: &[serde_json::Map<String, Value>],
    message: &str,
    id: &str,
    destination: &str,
    attempts: u64,
) -> serde_json::Map<String, Value> {
    let found = outcome_lines(lines, message, id);
    check_eq!(c, found.len(), 1, "`{message}` lines for {id}: {found:?}");
    let line = found[0].clone();
    check_eq!(c, line.get("destination"), Some(&Value::from(destination)));
    check_eq!(
        c,
        line.get("attempts"),
        Some(&Value::from(attempts)),
        "{line:?}"
    );
    check!(
        c,
        line.get("since_accept_ms").is_some_and(Value::is_u64),
        "since_accept_ms: {line:?}"
    );
    for other in ["delivered", "dead-lettered", "dropped"] {
        if other != message {
            let extra = outcome_lines(lines, other, id);
            check!(c, extra.is_empty(), "{id} also has {extra:?}");
        }
    }
    line
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_have_one_object_per_line_and_one_line_per_outcome_and_refusal() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = by_path().await;
    let (_refusing, port) = refusing_port();
    let url = rx.url();
    let mut yaml = with_log(
        config("ok", &format!("{url}/ok"), ""),
        "{ format: json, level: debug }",
    );
    yaml = yaml.replace("journal:", "ingress: { max_body_bytes: 1KiB }\njournal:");
    yaml += &destination("bad", &format!("{url}/bad"), "");
    yaml += &destination(
        "flaky",
        &format!("{url}/fail"),
        "retry: { schedule: [50ms], max_attempts: 2, jitter: 0 }
         status: { min_delay: { 5xx: 0s } }",
    );
    yaml += &destination(
        "gone",
        &format!("http://127.0.0.1:{port}/x"),
        "retry: { schedule: [50ms], max_attempts: 2, jitter: 0 }
         dead_letter: none",
    );
    yaml += &destination("batched", &format!("{url}/ok"), "batch: { max_events: 10 }");
    let c = Courier::start(tmp.path(), &yaml).await;

    let ok = accept(&c, "ok", "{}", &[]).await;
    let bad = accept(&c, "bad", "{}", &[]).await;
    let flaky = accept(&c, "flaky", "{}", &[]).await;
    let gone = accept(&c, "gone", "{}", &[]).await;
    let json = [("content-type", "application/json")];
    let mut batched = HashMap::new();
    for n in 0..3 {
        let id = accept(&c, "batched", &format!(r#"{{"n":{n}}}"#), &json).await;
        batched.insert(n, id);
    }
    // Refusals: unknown destination, a body over 1 KiB, a GET.
    check_eq!(c, post(&c.url("nope/x"), "{}", &[]).await.status, 404);
    check_eq!(
        c,
        post(&c.url("ok"), "x".repeat(2048), &[]).await.status,
        413
    );
    let get = request(Method::GET, &c.url("bad"), "", &[]).await;
    check_eq!(c, get.status, 405);

    let series = |name: &str, dest: &str| format!(r#"{name}{{destination="{dest}"}}"#);
    wait_metric(
        &c,
        &series("courier_events_delivered_total", "ok"),
        1.0,
        PROMPT,
    )
    .await;
    wait_metric(
        &c,
        &series("courier_events_delivered_total", "batched"),
        3.0,
        PROMPT,
    )
    .await;
    for dest in ["bad", "flaky", "gone"] {
        wait_metric(&c, &series("courier_events_pending", dest), 0.0, PROMPT).await;
    }
    // The log is written by its own thread, after the metrics move.
    wait_for_line(&c, &["dropped", &gone]).await;
    wait_for_line(&c, &["dead-lettered", &flaky]).await;
    wait_for_line(&c, &["dead-lettered", &bad]).await;
    wait_for_line(&c, &["\"delivered\"", &ok]).await;
    for id in batched.values() {
        wait_for_line(&c, &["\"delivered\"", id]).await;
    }
    // Every line, startup to now, is one JSON object.
    let lines = json_lines(&c);

    let line = one_outcome(&c, &lines, "delivered", &ok, "ok", 1);
    check_eq!(c, line.get("status"), Some(&Value::from(200)));
    check_eq!(c, line.get("outcome"), Some(&Value::from("Delivered")));
    check_eq!(c, line.get("batch"), None, "not batched: {line:?}");
    check_eq!(c, line.get("level"), Some(&Value::from("INFO")));

    let line = one_outcome(&c, &lines, "dead-lettered", &bad, "bad", 1);
    check_eq!(c, line.get("status"), Some(&Value::from(400)));
    check_eq!(c, line.get("outcome"), Some(&Value::from("BadRequest")));
    check_eq!(
        c,
        line.get("reason"),
        Some(&Value::from("NonRetriableStatus"))
    );
    check_eq!(c, line.get("body"), None, "log.bodies is off: {line:?}");

    let line = one_outcome(&c, &lines, "dead-lettered", &flaky, "flaky", 2);
    check_eq!(c, line.get("status"), Some(&Value::from(500)));
    check_eq!(c, line.get("outcome"), Some(&Value::from("Failed")));
    let reason = Value::from("MaxDeliveryAttemptsExceeded");
    check_eq!(c, line.get("reason"), Some(&reason));

    // No answer at all: no status, the outcome says why.
    let line = one_outcome(&c, &lines, "dropped", &gone, "gone", 2);
    check_eq!(
        c,
        line.get("status"),
        None,
        "no answer, no status: {line:?}"
    );
    check_eq!(c, line.get("outcome"), Some(&Value::from("SocketError")));
    check_eq!(c, line.get("reason"), Some(&reason));

    // A batch of N events gives N lines, each naming its batch: the
    // `webhook-id` of the request that carried the event.
    let mut batch_of = HashMap::new();
    for r in rx
        .received()
        .iter()
        .filter(|r| r.header("courier-destination") == Some("batched"))
    {
        let Value::Array(events) = r.json() else {
            fail!(c, "a batch is not a JSON array: {}", r.text());
        };
        for e in events {
            let id = &batched[&e["n"].as_u64().unwrap_or(99)];
            batch_of.insert(id.clone(), r.header("webhook-id").map(str::to_owned));
        }
    }
    for id in batched.values() {
        let line = one_outcome(&c, &lines, "delivered", id, "batched", 1);
        let batch = batch_of.get(id).cloned().flatten().map(Value::from);
        check!(c, batch.is_some(), "{id} was not received in a batch");
        check_eq!(c, line.get("batch"), batch.as_ref(), "{line:?}");
    }

    // One `rejected` line per refusal, with the peer's address.
    let rejected: Vec<_> = lines
        .iter()
        .filter(|m| m.get("message") == Some(&Value::from("rejected")))
        .collect();
    check_eq!(c, rejected.len(), 3, "rejected lines: {rejected:?}");
    for (status, reason, destination) in [
        (404, "unknown_destination", "nope"),
        (413, "too_large", "ok"),
        (405, "method", "bad"),
    ] {
        let found: Vec<_> = rejected
            .iter()
            .filter(|m| m.get("status") == Some(&Value::from(status)))
            .collect();
        check_eq!(c, found.len(), 1, "{status}: {rejected:?}");
        let line = found[0];
        check_eq!(c, line.get("reason"), Some(&Value::from(reason)));
        check_eq!(c, line.get("destination"), Some(&Value::from(destination)));
        let remote = line.get("remote").and_then(Value::as_str).unwrap_or("");
        check!(
            c,
            remote
                .parse::<SocketAddr>()
                .is_ok_and(|a| a.ip().is_loopback()),
            "remote is not a loopback ip:port: {line:?}"
        );
    }
}

/// Everything that must never be logged, sent by the app or configured.
async fn send_secrets(c: &Courier) -> String {
    let body = format!(r#"{{"note":"{BODY_MARK}"}}"#);
    let bearer = format!("Bearer {APP_TOKEN}");
    let headers = [
        ("authorization", bearer.as_str()),
        ("aeg-sas-key", SAS_KEY),
        ("content-type", "application/json"),
    ];
    accept(c, "orders", &body, &headers).await
}

fn secret_config(url: &str, log: &str) -> String {
    with_log(
        config(
            "orders",
            url,
            "retry: { schedule: [50ms], jitter: 0 }
             headers: { X-Api-Key: { from_env: LOGS_TEST_KEY, secret: true } }",
        ),
        log,
    )
}

async fn start_with_secret(dir: &Path, yaml: &str, extra_env: &[(&str, &str)]) -> Courier {
    let mut env = vec![("LOGS_TEST_KEY", SECRET_HEADER)];
    env.extend_from_slice(extra_env);
    Courier::start_with_env(courier_bin(), dir, yaml, &env).await
}

/// Fails if any secret or the body is anywhere in the log.
fn check_nothing_secret(c: &Courier, also_body: bool) {
    let logs = c.logs();
    for secret in [SECRET_HEADER, APP_TOKEN, SAS_KEY] {
        check!(c, !logs.contains(secret), "{secret} is in the log");
    }
    if also_body {
        check!(c, !logs.contains(BODY_MARK), "the body is in the log");
    }
}

/// `key=value` fields of a text line (values in quotes may hold spaces).
fn text_fields(line: &str) -> HashMap<String, String> {
    let mut fields = HashMap::new();
    let mut rest = line;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].rsplit(' ').next().unwrap_or("").to_string();
        let after = &rest[eq + 1..];
        let (value, next) = match after.strip_prefix('"') {
            Some(q) => {
                let end = q.find('"').unwrap_or(q.len());
                (&q[..end], &q[(end + 1).min(q.len())..])
            }
            None => {
                let end = after.find(' ').unwrap_or(after.len());
                (&after[..end], &after[end..])
            }
        };
        fields.insert(key, value.to_string());
        rest = next;
    }
    fields
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_lines_are_plain_and_never_show_secrets_or_bodies() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = by_path().await;
    let yaml = secret_config(
        &format!("{}/ok", rx.url()),
        "{ format: text, level: debug }",
    );
    let c = start_with_secret(tmp.path(), &yaml, &[]).await;
    let id = send_secrets(&c).await;
    let got = rx.wait_for(1, PROMPT).await;
    // The secrets did reach the receiver: absent from the log for a reason.
    check_eq!(c, got[0].header("x-api-key"), Some(SECRET_HEADER));
    check!(c, got[0].text().contains(BODY_MARK));
    wait_for_line(&c, &[" delivered ", &id]).await;
    // A refusal too, with its body and credentials.
    let bearer = format!("Bearer {APP_TOKEN}");
    let resp = post(&c.url("nope"), BODY_MARK, &[("authorization", &bearer)]).await;
    check_eq!(c, resp.status, 404);
    wait_for_line(&c, &[" rejected ", "status=404"]).await;

    let logs = c.logs();
    let line = logs
        .lines()
        .find(|l| l.contains(" delivered ") && l.contains(&id))
        .unwrap_or_else(|| fail!(c, "no delivered line for {id}"));
    let f = text_fields(line);
    for (key, want) in [
        ("destination", "orders"),
        ("id", id.as_str()),
        ("attempts", "1"),
        ("status", "200"),
        ("outcome", "Delivered"),
    ] {
        check_eq!(
            c,
            f.get(key).map(String::as_str),
            Some(want),
            "{key} in {line}"
        );
    }
    check!(
        c,
        f.get("since_accept_ms")
            .is_some_and(|v| v.parse::<u64>().is_ok()),
        "{line}"
    );
    let line = logs
        .lines()
        .find(|l| l.contains(" rejected "))
        .unwrap_or_else(|| fail!(c, "no rejected line"));
    let f = text_fields(line);
    check_eq!(
        c,
        f.get("reason").map(String::as_str),
        Some("unknown_destination")
    );
    check_eq!(c, f.get("destination").map(String::as_str), Some("nope"));
    check!(
        c,
        f.get("remote")
            .is_some_and(|r| r.parse::<SocketAddr>().is_ok()),
        "{line}"
    );
    for l in logs.lines() {
        check!(
            c,
            !l.contains("Some(") && !l.contains("None"),
            "Rust Debug text in {l:?}"
        );
    }
    check_nothing_secret(&c, true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_trace_level_secrets_and_bodies_stay_out_of_every_line() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = by_path().await;
    let yaml = secret_config(
        &format!("{}/bad", rx.url()),
        "{ format: json, level: info }",
    );
    let c = start_with_secret(tmp.path(), &yaml, &[("COURIER_LOG", "trace")]).await;
    let id = send_secrets(&c).await;
    rx.wait_for(1, PROMPT).await;
    wait_for_line(&c, &["dead-lettered", &id]).await;
    let lines = json_lines(&c);
    // COURIER_LOG took effect: there are lines below `info`.
    check!(
        c,
        lines
            .iter()
            .any(|m| m.get("level") == Some(&Value::from("TRACE"))),
        "no TRACE line"
    );
    check_nothing_secret(&c, true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_log_bodies_the_body_is_in_the_dead_letter_line_only() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = by_path().await;
    let yaml = secret_config(
        &format!("{}/bad", rx.url()),
        "{ format: json, level: debug, bodies: true }",
    );
    let c = start_with_secret(tmp.path(), &yaml, &[]).await;
    let id = send_secrets(&c).await;
    wait_for_line(&c, &["dead-lettered", &id]).await;
    let lines = json_lines(&c);
    let line = one_outcome(&c, &lines, "dead-lettered", &id, "orders", 1);
    let body = line.get("body").and_then(Value::as_str).unwrap_or("");
    check_eq!(c, body, format!(r#"{{"note":"{BODY_MARK}"}}"#), "{line:?}");
    let with_body = c.logs().lines().filter(|l| l.contains(BODY_MARK)).count();
    check_eq!(c, with_body, 1, "lines with the body");
    check_nothing_secret(&c, false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_time_failure_is_a_json_line_too() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let yaml = with_log(
        config("orders", "http://127.0.0.1:9/x", ""),
        "{ format: json }",
    )
    .replace(
        "listen: 127.0.0.1:0\nadmin",
        &format!("listen: {addr}\nadmin"),
    );
    let path = tmp.path().join("courier.yaml");
    std::fs::write(&path, yaml).expect("write config");
    let path = path.to_string_lossy().into_owned();
    let out = support::run_cli(None, &["run", "-c", &path], &[]).await;
    assert_eq!(out.code, 2, "{}", out.show());
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert!(!lines.is_empty(), "{}", out.show());
    for line in &lines {
        let parsed: Result<serde_json::Map<String, Value>, _> = serde_json::from_str(line);
        assert!(
            parsed.is_ok(),
            "not a JSON object: {line:?}\n{}",
            out.show()
        );
    }
    let error = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["level"] == "ERROR")
        .unwrap_or_else(|| panic!("no ERROR line:\n{}", out.show()));
    let message = error["message"].as_str().unwrap_or("");
    assert!(message.contains(&addr.to_string()), "{error}");
    drop(taken);
}
