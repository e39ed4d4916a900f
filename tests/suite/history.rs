//! Event history (issue #33, SPEC §8): "where is my webhook?" by id and in
//! pages, across restarts, within its retention, and without a secret.

use bytes::Bytes;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;
use support::{
    Courier, Received, Receiver, Reply, admin_post, behavior, check, check_eq, config, fail, get,
    post,
};

const PROMPT: Duration = Duration::from_secs(10);

fn id_of(r: &Received) -> String {
    r.header("webhook-id").unwrap_or("").to_string()
}

fn attempt_of(r: &Received) -> u32 {
    r.header("courier-delivery-attempt")
        .and_then(|a| a.parse().ok())
        .unwrap_or(0)
}

async fn accept(c: &Courier, route: &str, id: &str, headers: &[(&str, &str)]) {
    let body = json!({ "id": id, "secret-body-marker": "BODY-7f3a" }).to_string();
    let mut all = vec![("Idempotency-Key", id)];
    all.extend_from_slice(headers);
    let resp = post(&c.url(route), body, &all).await;
    check!(
        c,
        resp.status / 100 == 2,
        "POST {id}: {} {}",
        resp.status,
        resp.text()
    );
}

/// `GET /v1/events/{id}` and its status.
async fn event(c: &Courier, id: &str) -> (u16, Value) {
    let resp = get(&format!("{}/v1/events/{id}", c.admin_url())).await;
    (resp.status, resp.json())
}

/// Polls the event until `pred` holds for its deliveries (bounded).
async fn event_until(c: &Courier, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    for _ in 0..(PROMPT.as_millis() / 50) {
        let (status, body) = event(c, id).await;
        if status == 200 && pred(&body) {
            return body;
        }
        last = body;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fail!(c, "event {id}: never {what}; last answer {last}")
}

fn first(body: &Value) -> &Value {
    &body["deliveries"][0]
}

fn state_is(state: &'static str) -> impl Fn(&Value) -> bool {
    move |b| first(b)["state"] == state
}

/// 500 then 200; 400; 500 forever (a long second delay); one held by a
/// pause; an unknown id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_outcome_has_its_state_attempts_and_timeline() {
    let rx = Receiver::start(behavior(|r, _| {
        let status = match (id_of(r).as_str(), attempt_of(r)) {
            ("evt-retry", 1) => 500,
            ("evt-retry", _) => 200,
            ("evt-bad", _) => 400,
            ("evt-wait", _) => 500,
            _ => 200,
        };
        Reply::status(status).delay(Duration::from_millis(20))
    }))
    .await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "retry: { schedule: [100ms, 1h], jitter: 0 }",
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &yaml).await;
    for id in ["evt-retry", "evt-bad", "evt-wait"] {
        accept(&c, "orders", id, &[]).await;
    }

    let done = event_until(&c, "evt-retry", "delivered", state_is("delivered")).await;
    check_eq!(c, done["id"], "evt-retry", "{done}");
    let d = first(&done);
    check_eq!(c, d["destination"], "orders", "{done}");
    let attempts = d["attempts"].as_array().cloned().unwrap_or_default();
    check_eq!(c, attempts.len(), 2, "two attempts: {done}");
    check_eq!(c, attempts[0]["attempt"], 1, "{done}");
    check_eq!(c, attempts[0]["status"], 500, "{done}");
    check_eq!(c, attempts[0]["outcome"], "Failed", "{done}");
    check_eq!(c, attempts[1]["status"], 200, "{done}");
    check_eq!(c, attempts[1]["outcome"], "Delivered", "{done}");
    for a in &attempts {
        let ms = a["duration_ms"].as_u64().unwrap_or(0);
        check!(
            c,
            (20..5_000).contains(&ms),
            "the receiver waits 20 ms: {a}"
        );
        check_eq!(c, a["late"], false, "{a}");
    }
    check!(c, d["finished_at"].is_string(), "{done}");
    check!(c, d["accepted_at"].is_string(), "{done}");
    check!(c, d.get("next_attempt_at").is_none(), "finished: {done}");

    let bad = event_until(&c, "evt-bad", "dead-lettered", state_is("dead_lettered")).await;
    check_eq!(c, first(&bad)["reason"], "NonRetriableStatus", "{bad}");
    check_eq!(c, first(&bad)["attempts"][0]["status"], 400, "{bad}");
    check_eq!(
        c,
        first(&bad)["attempts"][0]["outcome"],
        "BadRequest",
        "{bad}"
    );

    let wait = event_until(&c, "evt-wait", "retried once", |b| {
        first(b)["attempts"]
            .as_array()
            .is_some_and(|a| a.len() == 2)
    })
    .await;
    let w = first(&wait);
    check_eq!(c, w["state"], "pending", "{wait}");
    check_eq!(c, w["held_by"], "schedule", "{wait}");
    let next = w["next_attempt_at"].as_str().unwrap_or("");
    let accepted = w["accepted_at"].as_str().unwrap_or("");
    check!(c, next > accepted, "next attempt ahead: {wait}");
    let next_ms = chrono_ms(next);
    let now = support::now_ms() as u64;
    check!(
        c,
        next_ms > now + 3_000_000 && next_ms < now + 3_700_000,
        "the second delay is an hour: next {next} ({next_ms}) now {now}: {wait}"
    );

    let url = format!("{}/v1/destinations/orders/pause", c.admin_url());
    let resp = admin_post(&url, Bytes::new(), &[]).await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    accept(&c, "orders", "evt-held", &[]).await;
    let held = event_until(&c, "evt-held", "held", state_is("pending")).await;
    check_eq!(c, first(&held)["held_by"], "pause", "{held}");
    check_eq!(c, first(&held)["attempts"], json!([]), "{held}");

    let (status, body) = event(&c, "evt-never-sent").await;
    check_eq!(c, status, 404, "{body}");
    check!(
        c,
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("evt-never-sent")),
        "{body}"
    );
}

/// Milliseconds of an RFC 3339 UTC time as courier writes it.
fn chrono_ms(s: &str) -> u64 {
    courier::rfc3339::parse_ms_utc_default(s).unwrap_or(0)
}

/// Bytes under `dir`, recursively.
fn du(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => du(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}
