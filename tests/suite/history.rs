//! Event history (issue #33, docs/history.md): "where is my webhook?" by id and in
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
    r.webhook_id()
}

fn attempt_of(r: &Received) -> u32 {
    r.attempt()
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
    courier::clock::rfc3339::parse_ms_utc_default(s).unwrap_or(0)
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

/// Every delivery of the events, as `GET /v1/events/{id}` shows them.
async fn deliveries(c: &Courier, ids: &[String]) -> Vec<Value> {
    let mut out = Vec::new();
    for id in ids {
        let (status, body) = event(c, id).await;
        check_eq!(c, status, 200, "{id}: {body}");
        out.push(body);
    }
    out
}

/// After SIGKILL and a restart, every event whose outcome was durable
/// keeps it, with the same attempts; a pending one keeps its attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_survives_sigkill_with_the_same_attempts() {
    let rx = Receiver::start(behavior(|r, _| {
        let id = id_of(r);
        let status = if id.starts_with("ok-") {
            200
        } else if id.starts_with("bad-") {
            400
        } else if id.starts_with("retry-") && attempt_of(r) == 1 {
            503
        } else if id.starts_with("retry-") {
            200
        } else {
            500
        };
        Reply::status(status)
    }))
    .await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "retry: { schedule: [100ms, 1h], jitter: 0 }\nstatus: { min_delay: { 503: 100ms } }\nprobation: { after_failures: 1000 }",
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut c = Courier::start(tmp.path(), &yaml).await;
    let mut ids = Vec::new();
    for kind in ["ok", "bad", "retry", "wait"] {
        for i in 0..5 {
            let id = format!("{kind}-{i}");
            accept(&c, "orders", &id, &[]).await;
            ids.push(id);
        }
    }
    // Settled: the ok, bad and retry ones finished, the wait ones tried twice.
    for id in &ids {
        event_until(&c, id, "settled", |b| {
            let d = first(b);
            d["state"] != "pending" && d["state"] != "in_flight"
                || d["attempts"].as_array().is_some_and(|a| a.len() == 2)
        })
        .await;
    }
    // Past the journal's sync interval: these outcomes are durable.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = deliveries(&c, &ids).await;
    c.kill();
    c.restart().await;
    let after = deliveries(&c, &ids).await;
    for (b, a) in before.iter().zip(&after) {
        check_eq!(
            c,
            first(a)["state"],
            first(b)["state"],
            "state kept: {b} then {a}"
        );
        check_eq!(
            c,
            first(a)["attempts"],
            first(b)["attempts"],
            "attempts kept: {b} then {a}"
        );
        check_eq!(c, first(a)["accepted_at"], first(b)["accepted_at"], "{a}");
    }
    let states: Vec<&Value> = after.iter().map(|b| &first(b)["state"]).collect();
    for (kind, want) in [
        ("ok", "delivered"),
        ("bad", "dead_lettered"),
        ("retry", "delivered"),
        ("wait", "pending"),
    ] {
        for (id, s) in ids.iter().zip(&states) {
            if id.starts_with(kind) {
                check_eq!(c, *s, want, "{id}");
            }
        }
    }
}

/// 5,000 events at each of two destinations: pages of the list see each
/// once, newest first, and the filters hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_pages_over_5000_events_without_repeats_or_gaps() {
    let a = Receiver::ok().await;
    let b = Receiver::start(behavior(|_, _| Reply::status(404))).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\njournal: {{ dir: ./journal }}\n\
         topics:\n  shop:\n    schema: eventgrid\n    subscribers:\n      alpha: {{}}\n      beta: {{}}\n\
         destinations:\n  alpha: {{ url: {}, schema: eventgrid }}\n  beta: {{ url: {}, schema: eventgrid, probation: {{ after_failures: 0 }} }}\n",
        a.url(),
        b.url()
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &yaml).await;
    const N: usize = 5_000;
    for from in (0..N).step_by(500) {
        let body = support::eventgrid_events("evt", from, 500);
        let resp = post(&c.url("shop"), body, &[]).await;
        check_eq!(c, resp.status, 200, "{}", resp.text());
    }
    let list = |query: String| {
        let url = format!("{}/v1/events?{query}", c.admin_url());
        async move { get(&url).await }
    };
    // Wait until every event has ended at both.
    for _ in 0..400 {
        let done = list("state=delivered&limit=1".into()).await.json();
        let gone = list("state=dropped&limit=1".into()).await.json();
        let counts = get(&format!("{}/v1/destinations", c.admin_url()))
            .await
            .json();
        let ended = |name: &str, key: &str| {
            counts["destinations"]
                .as_array()
                .and_then(|l| l.iter().find(|d| d["name"] == name))
                .and_then(|d| d["events"][key].as_u64())
                .unwrap_or(0)
        };
        if ended("alpha", "delivered") == N as u64
            && ended("beta", "dropped") + ended("beta", "dead_lettered") == N as u64
            && done["events"].is_array()
            && gone["events"].is_array()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let counts = get(&format!("{}/v1/destinations", c.admin_url()))
        .await
        .json();
    let of = |name: &str| {
        counts["destinations"]
            .as_array()
            .and_then(|l| l.iter().find(|d| d["name"] == name))
            .map(|d| d["events"].clone())
            .unwrap_or_default()
    };
    check_eq!(c, of("alpha")["delivered"], N, "{counts}");
    check_eq!(c, of("alpha")["pending"], 0, "{counts}");
    check_eq!(c, of("beta")["dropped"], N, "404 without a sink: {counts}");
    check_eq!(c, of("beta")["delivered"], 0, "{counts}");
    let mut seen = std::collections::HashSet::new();
    let mut order = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..100 {
        let q = match &after {
            Some(cur) => format!("limit=700&after={cur}"),
            None => "limit=700".to_string(),
        };
        let resp = list(q).await;
        check_eq!(c, resp.status, 200, "{}", resp.text());
        let page = resp.json();
        for e in page["events"].as_array().cloned().unwrap_or_default() {
            let key = (
                e["id"].as_str().unwrap_or("").to_string(),
                e["destination"].as_str().unwrap_or("").to_string(),
            );
            check!(c, seen.insert(key.clone()), "{key:?} listed twice");
            order.push(e["accepted_at"].as_str().unwrap_or("").to_string());
        }
        match page["next"].as_str() {
            Some(cur) => after = Some(cur.to_string()),
            None => break,
        }
    }
    check_eq!(c, seen.len(), 2 * N, "every delivery listed once");
    check!(c, order.windows(2).all(|w| w[0] >= w[1]), "newest first");
    let alpha = list("destination=alpha&state=delivered&limit=1000".into())
        .await
        .json();
    let rows = alpha["events"].as_array().cloned().unwrap_or_default();
    check_eq!(c, rows.len(), 1000, "{}", alpha["next"]);
    check!(
        c,
        rows.iter()
            .all(|e| e["destination"] == "alpha" && e["state"] == "delivered"),
        "filtered by destination and state"
    );
    let beta = list("destination=beta&state=delivered".into()).await.json();
    check_eq!(
        c,
        beta["events"],
        json!([]),
        "beta's endpoint answered 404: none delivered"
    );
    let bad = list("state=lost".into()).await;
    check_eq!(c, bad.status, 400, "{}", bad.text());
    check!(c, bad.json()["error"].is_string(), "{}", bad.text());
}

/// A topic's event at three subscribers: one id, three deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_event_shows_one_delivery_per_subscriber() {
    let rx = Receiver::ok().await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\njournal: {{ dir: ./journal }}\n\
         topics:\n  shop:\n    schema: eventgrid\n    subscribers:\n      one: {{}}\n      two: {{}}\n      three: {{}}\n\
         destinations:\n  one: {{ url: {u}/1, schema: eventgrid }}\n  two: {{ url: {u}/2, schema: eventgrid }}\n  three: {{ url: {u}/3, schema: eventgrid }}\n",
        u = rx.url()
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &yaml).await;
    let resp = post(&c.url("shop"), support::eventgrid_events("fan-", 0, 1), &[]).await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    let id = "fan-0";
    let body = event_until(&c, id, "delivered three times", |b| {
        b["deliveries"]
            .as_array()
            .is_some_and(|d| d.len() == 3 && d.iter().all(|x| x["state"] == "delivered"))
    })
    .await;
    let mut names: Vec<&str> = body["deliveries"]
        .as_array()
        .map(|d| d.iter().filter_map(|x| x["destination"].as_str()).collect())
        .unwrap_or_default();
    names.sort_unstable();
    check_eq!(c, names, vec!["one", "three", "two"], "{body}");
    let url = format!("{}/v1/events/{id}?destination=two", c.admin_url());
    let two = get(&url).await.json();
    check_eq!(
        c,
        two["deliveries"].as_array().map(Vec::len),
        Some(1),
        "{two}"
    );
}

/// Past `retain` the records go, and so does their disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_past_retain_disappear_and_free_their_disk() {
    let rx = Receiver::ok().await;
    let yaml = format!(
        "history: {{ retain: 2s }}\n{}",
        config("orders", &format!("{}/hooks", rx.url()), "")
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &yaml).await;
    for i in 0..200 {
        accept(&c, "orders", &format!("old-{i}"), &[]).await;
    }
    event_until(&c, "old-199", "delivered", state_is("delivered")).await;
    let dir = tmp.path().join("journal").join("history");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let full = du(&dir);
    // Bounded: 10 s in 100 ms steps.
    let mut gone = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if event(&c, "old-0").await.0 == 404 && event(&c, "old-199").await.0 == 404 {
            gone = true;
            break;
        }
    }
    check!(c, gone, "records older than retain are still there");
    let now = du(&dir);
    check!(
        c,
        now < full,
        "history's disk went down: {full} then {now} bytes"
    );
    accept(&c, "orders", "new-0", &[]).await;
    event_until(&c, "new-0", "delivered", state_is("delivered")).await;
}

/// Past `max_bytes` the oldest records go; the disk stays near the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_past_max_bytes_disappear_oldest_first() {
    let rx = Receiver::ok().await;
    let yaml = format!(
        "history: {{ retain: 1h, max_bytes: 1MiB }}\n{}",
        config(
            "orders",
            &format!("{}/hooks", rx.url()),
            "schema: eventgrid"
        )
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &yaml).await;
    const N: usize = 30_000;
    for from in (0..N).step_by(1000) {
        let resp = post(
            &c.url("orders"),
            support::eventgrid_events("big-", from, 1000),
            &[],
        )
        .await;
        check_eq!(c, resp.status, 200, "{}", resp.text());
    }
    let last = format!("big-{}", N - 1);
    event_until(&c, &last, "delivered", state_is("delivered")).await;
    let dir = tmp.path().join("journal").join("history");
    let mut gone = false;
    for _ in 0..100 {
        if event(&c, "big-0").await.0 == 404 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check!(c, gone, "the oldest record is still there past max_bytes");
    check_eq!(c, event(&c, &last).await.0, 200, "the newest stays");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let used = du(&dir);
    let files: Vec<(String, u64)> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let size = e.metadata().map_or(0, |m| m.len());
                    (e.file_name().to_string_lossy().into_owned(), size)
                })
                .collect()
        })
        .unwrap_or_default();
    check!(
        c,
        used <= 1024 * 1024 + 512 * 1024,
        "history holds {used} bytes, over max_bytes: {files:?}"
    );
    let records = support::metric(&c.admin_url(), "courier_history_records")
        .await
        .unwrap_or(0.0);
    check!(
        c,
        records > 0.0 && records < N as f64,
        "courier_history_records {records}"
    );
    let bytes = support::metric(&c.admin_url(), "courier_history_bytes")
        .await
        .unwrap_or(0.0);
    check!(
        c,
        bytes > 0.0 && bytes <= (1024 * 1024 + 512 * 1024) as f64,
        "courier_history_bytes {bytes}"
    );
}

/// No secret header value and no body in history's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_files_hold_no_secret_and_no_body() {
    let rx = Receiver::sequence(vec![Reply::status(500), Reply::status(200)]).await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "retry: { schedule: [50ms], jitter: 0 }\nheaders: { X-Api-Key: { from_env: HISTORY_TEST_KEY, secret: true } }",
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start_with_env(
        support::courier_bin(),
        tmp.path(),
        &yaml,
        &[("HISTORY_TEST_KEY", "KEY-SECRET-91c2")],
    )
    .await;
    accept(
        &c,
        "orders",
        "evt-secret",
        &[
            ("Authorization", "Bearer APP-SECRET-44d1"),
            ("X-App-Token", "APP-TOKEN-5e6f"),
        ],
    )
    .await;
    let done = event_until(&c, "evt-secret", "delivered", state_is("delivered")).await;
    check_eq!(
        c,
        first(&done)["attempts"].as_array().map(Vec::len),
        Some(2),
        "{done}"
    );
    let got = rx.received();
    check!(
        c,
        got.iter()
            .any(|r| r.header("x-api-key") == Some("KEY-SECRET-91c2")),
        "the endpoint got the secret header, so it was there to leak"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dir = tmp.path().join("journal").join("history");
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).expect("history dir").flatten() {
        let bytes = std::fs::read(entry.path()).unwrap_or_default();
        files += 1;
        let text = String::from_utf8_lossy(&bytes);
        for needle in [
            "KEY-SECRET-91c2",
            "APP-SECRET-44d1",
            "APP-TOKEN-5e6f",
            "BODY-7f3a",
        ] {
            check!(
                c,
                !text.contains(needle),
                "{} holds {needle}",
                entry.path().display()
            );
        }
    }
    let all: Vec<u8> = std::fs::read_dir(&dir)
        .expect("history dir")
        .flatten()
        .flat_map(|e| std::fs::read(e.path()).unwrap_or_default())
        .collect();
    check!(
        c,
        files > 0 && String::from_utf8_lossy(&all).contains("evt-secret"),
        "history's files hold the record (so the grep looked at it)"
    );
}

/// An attempt that timed out and was answered 200 within the late-answer
/// window: history says so (`late`), and the event is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_is_marked_late_and_delivers() {
    let rx = Receiver::start(behavior(|_, _| {
        Reply::status(200).delay(Duration::from_millis(500))
    }))
    .await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "timeout: 200ms\nlate_answer_window: 1m\nretry: { schedule: [1h], jitter: 0 }",
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &yaml).await;
    accept(&c, "orders", "evt-late", &[]).await;
    let body = event_until(&c, "evt-late", "delivered late", state_is("delivered")).await;
    let attempts = first(&body)["attempts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    check_eq!(c, attempts.len(), 1, "one attempt, answered late: {body}");
    check_eq!(c, attempts[0]["late"], true, "{body}");
    check_eq!(c, attempts[0]["status"], 200, "{body}");
    let took = attempts[0]["duration_ms"].as_u64().unwrap_or(0);
    check!(
        c,
        (400..5_000).contains(&took),
        "the answer came after ~500 ms: {body}"
    );
}
