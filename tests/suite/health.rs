//! Sick endpoints end to end (docs/delivery.md "Sick endpoints", docs/http-api.md): probation after
//! consecutive failures (one probe, then doubling), a 429's Retry-After
//! holding the whole destination, the smooth rate limit, 410 Gone and
//! operator pauses, TTL expiry while paused, a pasted SNS delivery policy,
//! and a dead endpoint that must not burn attempts.
//!
//! Every duration comes from the config (probations of a second or two,
//! schedules of milliseconds), so each test finishes in a few seconds, and
//! every wait is bounded. A failing check prints courier's logs.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};
use support::{
    Courier, Received, Receiver, Reply, behavior, check, check_eq, config, fail, files_under, get,
    metric, metric_sum, now_ms, post, quiet, refusing_port, requests, wait_dead_letters,
    wait_metric,
};

const SECOND: Duration = Duration::from_secs(1);
/// How long a test waits for something that should happen at once.
const PROMPT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(10);

/// Posts an event with `Idempotency-Key: id` and checks it was accepted.
async fn accept(c: &Courier, path: &str, id: &str) {
    let body = json!({ "id": id }).to_string();
    let resp = post(&c.url(path), body, &[("Idempotency-Key", id)]).await;
    check_eq!(c, resp.status, 202, "POST /{path} ({id}): {}", resp.text());
}

/// The `webhook-id` of a request.
fn id_of(r: &Received) -> &str {
    r.header("webhook-id").unwrap_or("")
}

/// The `courier-delivery-attempt` of a request.
fn attempt_of(r: &Received) -> &str {
    r.header("courier-delivery-attempt").unwrap_or("")
}

/// `later.at - earlier.at`.
fn gap(earlier: &Received, later: &Received) -> Duration {
    later.at.saturating_duration_since(earlier.at)
}

// Admin API ------------------------------------------------------------------

/// `GET /v1/destinations`, the entry of `name`.
async fn destination(c: &Courier, name: &str) -> Value {
    let url = format!("{}/v1/destinations", c.admin_url());
    let resp = get(&url).await;
    check_eq!(c, resp.status, 200, "GET {url}: {}", resp.text());
    let body = resp.json();
    let Some(list) = body["destinations"].as_array() else {
        fail!(c, "GET {url}: no `destinations` array: {body}")
    };
    match list.iter().find(|d| d["name"] == name) {
        Some(d) => d.clone(),
        None => fail!(c, "GET {url}: no destination {name}: {body}"),
    }
}

/// Polls `/v1/destinations` (bounded) until `name`'s entry satisfies `ok`.
async fn wait_destination(
    c: &Courier,
    name: &str,
    what: &str,
    timeout: Duration,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + timeout;
    // Bounded by the deadline.
    loop {
        let d = destination(c, name).await;
        if ok(&d) {
            return d;
        }
        if Instant::now() >= deadline {
            fail!(
                c,
                "destination {name} not {what} within {timeout:?}; last: {d}"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `POST {admin}/v1/destinations/{name}/{action}`; returns status and JSON body.
async fn admin_post(c: &Courier, name: &str, action: &str) -> (u16, Value) {
    let url = format!("{}/v1/destinations/{name}/{action}", c.admin_url());
    let resp = support::admin_post(&url, Bytes::new(), &[]).await;
    let body = serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| fail!(c, "POST {url}: body is not JSON ({e}): {}", resp.text()));
    (resp.status, body)
}

/// Pauses or resumes `name` and checks the 200.
async fn set_paused(c: &Courier, name: &str, paused: bool) -> Value {
    let action = if paused { "pause" } else { "resume" };
    let (status, body) = admin_post(c, name, action).await;
    check_eq!(c, status, 200, "POST .../{name}/{action}: {body}");
    body
}

// Dead letters and journal ---------------------------------------------------

/// Waits (bounded) for at least `n` dead-letter records of `destination`.
async fn dead_letters(c: &Courier, destination: &str, n: usize, timeout: Duration) -> Vec<Value> {
    wait_dead_letters(c, destination, n, timeout).await.1
}

/// Checks that nothing was dead-lettered (no file, counter 0).
async fn nothing_dead_lettered(c: &Courier, destination: &str) {
    let files = files_under(&c.dir().join("dl"));
    check!(c, files.is_empty(), "dead-letter files: {files:?}");
    let dead = metric_sum(
        &c.admin_url(),
        &format!(r#"courier_events_dead_lettered_total{{destination="{destination}"}}"#),
    )
    .await;
    check_eq!(c, dead, 0.0, "dead-lettered");
}

/// Waits (bounded) until `orders` counts `n` delivered events.
async fn wait_delivered(c: &Courier, n: f64) {
    wait_metric(
        c,
        r#"courier_events_delivered_total{destination="orders"}"#,
        n,
        PROMPT,
    )
    .await;
}

/// The end of a test: the receiver got `total` requests and no more, and
/// nothing was dead-lettered.
async fn all_done(c: &Courier, rx: &Receiver, total: usize) {
    quiet(c, rx, total, Duration::from_millis(300)).await;
    nothing_dead_lettered(c, "orders").await;
}

/// An event's journal row: (accepted_ms, next_due_ms, attempts), if it is there.
fn journal_row(db: &Path, id: &str) -> rusqlite::Result<Option<(i64, i64, i64)>> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    conn.busy_timeout(SECOND)?;
    let mut stmt =
        conn.prepare("SELECT accepted_ms, next_due_ms, attempts FROM events WHERE id = ?1")?;
    let mut rows = stmt.query_map([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    rows.next().transpose()
}

/// Waits (bounded) until the event's journal row records `attempts`.
/// A courier in `dir` whose receiver answers 410 to the one event `id`
/// (TTL 1m): waits until the destination is paused by it and the row shows
/// one attempt; returns the row's (accepted, next due, attempts).
async fn paused_by_gone(
    dir: &Path,
    id: &str,
) -> (Receiver, Courier, std::path::PathBuf, (i64, i64, i64)) {
    let rx = Receiver::start(behavior(|_, _| Reply::status(410))).await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "retry: { schedule: [10ms], max_attempts: 30, event_ttl: 1m, jitter: 0 }",
    );
    let c = Courier::start(dir, &yaml).await;
    let db = dir.join("journal").join("journal.db");
    accept(&c, "orders", id).await;
    requests(&c, &rx, 1, PROMPT).await;
    wait_destination(&c, "orders", "paused by gone", PROMPT, |d| {
        d["paused_by"] == "gone"
    })
    .await;
    let row = wait_row(&c, &db, id, 1).await;
    (rx, c, db, row)
}

async fn wait_row(c: &Courier, db: &Path, id: &str, attempts: i64) -> (i64, i64, i64) {
    let deadline = Instant::now() + PROMPT;
    // Bounded by the deadline.
    loop {
        match journal_row(db, id) {
            Ok(Some(row)) if row.2 == attempts => return row,
            Ok(_) | Err(_) if Instant::now() < deadline => tokio::time::sleep(POLL).await,
            other => fail!(
                c,
                "journal row of {id}, want {attempts} attempts: {other:?}"
            ),
        }
    }
}

// 1 ------------------------------------------------------------------------

/// Ten failures in a row put the endpoint on probation: no attempt (new or
/// retry) until it ends, then exactly one probe; a failed probe doubles the
/// next probation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_failures_start_a_probation_then_one_probe_and_doubling() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start(behavior(|_, _| Reply::status(500))).await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "concurrency: 1
         retry: { schedule: [20ms], max_attempts: 30, jitter: 0 }
         status: { min_delay: { 5xx: 0s } }
         probation: { after_failures: 10, durations: { Failed: 1500ms } }",
    );
    let c = Courier::start(tmp.path(), &yaml).await;

    accept(&c, "orders", "evt-a").await;
    let got = requests(&c, &rx, 10, PROMPT).await;
    let tenth = got[9].clone();
    for (i, r) in got.iter().take(10).enumerate() {
        check_eq!(c, id_of(r), "evt-a", "request {i}");
        check_eq!(c, attempt_of(r), (i + 1).to_string(), "request {i}");
    }
    check!(
        c,
        gap(&got[0], &tenth) < 2 * SECOND,
        "the first 10 attempts took {:?}",
        gap(&got[0], &tenth)
    );

    // On probation: visible in the admin API and the metric.
    let d = wait_destination(&c, "orders", "on probation", PROMPT, |d| {
        d["state"] == "probation"
    })
    .await;
    check!(c, d["until"].is_string(), "no `until`: {d}");
    let failures = d["consecutive_failures"].as_u64().unwrap_or(0);
    check!(c, failures >= 10, "consecutive_failures {failures}: {d}");
    check_eq!(c, d["last_outcome"], "Failed", "{d}");
    wait_metric(
        &c,
        r#"courier_destination_probation{destination="orders"}"#,
        1.0,
        SECOND,
    )
    .await;

    // A new event is held back too.
    accept(&c, "orders", "evt-b").await;
    check!(
        c,
        tenth.at.elapsed() < Duration::from_millis(1200),
        "test too slow: evt-b was posted {:?} after request 10, probation is 1.5s",
        tenth.at.elapsed()
    );

    let got = requests(&c, &rx, 11, 3 * SECOND).await;
    let first_gap = gap(&tenth, &got[10]);
    check!(
        c,
        first_gap >= Duration::from_millis(1400),
        "gap between request 10 and the probe {first_gap:?}, want >= 1.4s (probation 1.5s)"
    );
    if let Some(b) = got.iter().find(|r| id_of(r) == "evt-b") {
        let after = gap(&tenth, b);
        check!(
            c,
            after >= Duration::from_millis(1400),
            "evt-b was attempted {after:?} after the probation began"
        );
    }

    // The probe failed: the next probation is twice as long (3 s).
    let got = requests(&c, &rx, 12, 5 * SECOND).await;
    let second_gap = gap(&got[10], &got[11]);
    eprintln!("probation gaps: first {first_gap:?}, second {second_gap:?}");
    check!(
        c,
        second_gap >= Duration::from_millis(2900),
        "gap between the failed probe and the next {second_gap:?}, want >= 2.9s (doubled)"
    );
    check!(
        c,
        second_gap > first_gap,
        "second probation {second_gap:?} not longer than the first {first_gap:?}"
    );
    // Waiting is not an attempt: evt-a was tried 10 times, then probes.
    let attempts: Vec<(&str, &str)> = got
        .iter()
        .take(12)
        .map(|r| (id_of(r), attempt_of(r)))
        .collect();
    let probes = &attempts[10..12];
    for (id, attempt) in probes {
        let want = match *id {
            "evt-a" => ["11", "12"].contains(attempt),
            "evt-b" => ["1", "2"].contains(attempt),
            _ => false,
        };
        check!(
            c,
            want,
            "probe ({id}, attempt {attempt}); all: {attempts:?}"
        );
    }
}

// 2 ------------------------------------------------------------------------

/// A successful probe ends the probation: the events queued meanwhile go
/// out at full rate and the destination is healthy again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successful_probe_ends_the_probation() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start(behavior(|_, n| {
        Reply::status(if n < 10 { 500 } else { 200 })
    }))
    .await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "concurrency: 4
         retry: { schedule: [20ms], max_attempts: 30, jitter: 0 }
         status: { min_delay: { 5xx: 0s } }
         probation: { after_failures: 10, durations: { Failed: 1s } }",
    );
    let c = Courier::start(tmp.path(), &yaml).await;

    accept(&c, "orders", "evt-0").await;
    let got = requests(&c, &rx, 10, PROMPT).await;
    let tenth = got[9].clone();
    wait_destination(&c, "orders", "on probation", PROMPT, |d| {
        d["state"] == "probation"
    })
    .await;
    let queued: Vec<String> = (1..=5).map(|i| format!("evt-{i}")).collect();
    for id in &queued {
        accept(&c, "orders", id).await;
    }
    check!(
        c,
        tenth.at.elapsed() < Duration::from_millis(800),
        "test too slow: events queued {:?} after the probation began (1s)",
        tenth.at.elapsed()
    );

    let got = requests(&c, &rx, 16, PROMPT).await;
    let probe = &got[10];
    check!(
        c,
        gap(&tenth, probe) >= Duration::from_millis(900),
        "probe {:?} after request 10, want >= 0.9s",
        gap(&tenth, probe)
    );
    let burst = gap(probe, &got[15]);
    eprintln!(
        "probe {:?} after request 10; the other 5 within {burst:?} after it",
        gap(&tenth, probe)
    );
    check!(
        c,
        burst < Duration::from_millis(500),
        "the queued events took {burst:?} after the successful probe"
    );
    let ids: BTreeSet<&str> = got[10..16].iter().map(id_of).collect();
    let want: BTreeSet<&str> = std::iter::once("evt-0")
        .chain(queued.iter().map(String::as_str))
        .collect();
    check_eq!(c, ids, want, "delivered after the probe");

    wait_delivered(&c, 6.0).await;
    let d = wait_destination(&c, "orders", "healthy", PROMPT, |d| d["state"] == "healthy").await;
    check_eq!(c, d["consecutive_failures"], 0, "{d}");
    check_eq!(c, d["last_outcome"], "Delivered", "{d}");
    wait_metric(
        &c,
        r#"courier_destination_probation{destination="orders"}"#,
        0.0,
        SECOND,
    )
    .await;
    all_done(&c, &rx, 16).await;
}

// 3 ------------------------------------------------------------------------

/// A 429 with `Retry-After: 1` holds the whole destination for a second,
/// not just the event that got it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_on_429_holds_the_whole_destination() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start(behavior(|_, n| {
        if n == 0 {
            Reply::status(429).header("Retry-After", "1")
        } else {
            Reply::status(200)
        }
    }))
    .await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "concurrency: 1
         retry: { schedule: [10ms], max_attempts: 5, jitter: 0 }",
    );
    let c = Courier::start(tmp.path(), &yaml).await;

    accept(&c, "orders", "evt-a").await;
    accept(&c, "orders", "evt-b").await;
    let got = requests(&c, &rx, 3, PROMPT).await;
    let t0 = &got[0];
    let held = gap(t0, &got[1]);
    eprintln!("first request after the 429 came {held:?} later");
    check!(
        c,
        held >= Duration::from_millis(900),
        "a request ({}, attempt {}) went out {held:?} after the 429 with Retry-After: 1",
        id_of(&got[1]),
        attempt_of(&got[1])
    );
    check!(c, held < 3 * SECOND, "the hold lasted {held:?}");
    let ids: BTreeSet<&str> = got[1..3].iter().map(id_of).collect();
    check_eq!(c, ids, BTreeSet::from(["evt-a", "evt-b"]));
    wait_delivered(&c, 2.0).await;
    all_done(&c, &rx, 3).await;
}

// 4 ------------------------------------------------------------------------

/// `rate_limit.per_second: 20` spaces attempts evenly: about 60 in 3 s from
/// a backlog of 200, and never a burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_spaces_attempts_evenly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "concurrency: 16
         rate_limit: { per_second: 20 }
         retry: { schedule: [10ms], jitter: 0 }",
    );
    let c = Courier::start(tmp.path(), &yaml).await;
    set_paused(&c, "orders", true).await;

    let mut posts = tokio::task::JoinSet::new();
    for worker in 0..10 {
        let url = c.url("orders");
        posts.spawn(async move {
            for i in 0..20 {
                let id = format!("evt-{worker}-{i}");
                let resp = post(&url, "{}", &[("Idempotency-Key", id.as_str())]).await;
                if resp.status != 202 {
                    return Err(format!("{id}: {} {}", resp.status, resp.text()));
                }
            }
            Ok(())
        });
    }
    while let Some(done) = posts.join_next().await {
        if let Err(e) = done.expect("post task") {
            fail!(c, "POST failed: {e}");
        }
    }
    check_eq!(c, rx.count(), 0, "requests while paused");
    wait_metric(
        &c,
        r#"courier_events_pending{destination="orders"}"#,
        200.0,
        SECOND,
    )
    .await;

    let resumed = Instant::now();
    set_paused(&c, "orders", false).await;
    let window = 3 * SECOND;
    tokio::time::sleep(window + Duration::from_millis(100)).await;
    let got: Vec<Received> = rx
        .received()
        .into_iter()
        .filter(|r| r.at >= resumed && r.at <= resumed + window)
        .collect();
    let worst = got
        .iter()
        .map(|r| {
            got.iter()
                .filter(|s| s.at >= r.at && s.at < r.at + Duration::from_millis(100))
                .count()
        })
        .max()
        .unwrap_or(0);
    let mut times: Vec<Instant> = got.iter().map(|r| r.at).collect();
    times.sort();
    let spacing: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    eprintln!(
        "rate limit 20/s: {} requests in the 3 s after resume, at most {worst} in a 100 ms window, spacing {:?}..{:?}",
        got.len(),
        spacing.iter().min(),
        spacing.iter().max()
    );
    check!(
        c,
        (54..=66).contains(&got.len()),
        "{} requests in the 3 s after resume, want 60 ± 6",
        got.len()
    );
    // Spaced, 2 fall in a 100 ms window, 3 with the timer's jitter; a
    // stall of the loaded test machine lets one more catch up after it
    // (seen in CI: 4). Unspaced, the 16 slots would send 16 at once.
    check!(
        c,
        worst <= 5,
        "{worst} requests within 100 ms: a burst at 20/s"
    );
}

// 5 ------------------------------------------------------------------------

/// 410 Gone pauses the destination until resumed; no event is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_pauses_the_destination_until_resumed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::sequence(vec![Reply::status(410), Reply::status(200)]).await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "concurrency: 1
         retry: { schedule: [10ms], max_attempts: 5, jitter: 0 }",
    );
    let c = Courier::start(tmp.path(), &yaml).await;

    for id in ["evt-1", "evt-2", "evt-3"] {
        accept(&c, "orders", id).await;
    }
    let got = requests(&c, &rx, 1, PROMPT).await;
    let gone_id = id_of(&got[0]).to_string();
    quiet(&c, &rx, 1, SECOND).await;
    let d = destination(&c, "orders").await;
    check_eq!(c, d["state"], "paused", "{d}");
    check_eq!(c, d["paused_by"], "gone", "{d}");
    check_eq!(c, d["last_outcome"], "Gone", "{d}");
    check_eq!(c, d["pending"], 3, "{d}");

    let resumed = set_paused(&c, "orders", false).await;
    check_eq!(c, resumed["was_paused"], true, "{resumed}");
    let got = requests(&c, &rx, 4, PROMPT).await;
    let ids: BTreeSet<&str> = got[1..4].iter().map(id_of).collect();
    check_eq!(c, ids, BTreeSet::from(["evt-1", "evt-2", "evt-3"]));
    let again = got[1..4]
        .iter()
        .find(|r| id_of(r) == gone_id)
        .map(attempt_of);
    check_eq!(c, again, Some("2"), "attempt of {gone_id}, the 410'd event");
    wait_delivered(&c, 3.0).await;
    all_done(&c, &rx, 4).await;
    let d = destination(&c, "orders").await;
    check_eq!(c, d["state"], "healthy", "{d}");
}

// 6 ------------------------------------------------------------------------

/// An operator pause holds events in the journal until resume; an unknown
/// destination is a 404 with a JSON error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_pause_and_resume() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "retry: { schedule: [10ms], jitter: 0 }",
    );
    let c = Courier::start(tmp.path(), &yaml).await;

    let paused = set_paused(&c, "orders", true).await;
    check_eq!(c, paused["state"], "paused", "{paused}");
    let d = destination(&c, "orders").await;
    check_eq!(c, d["state"], "paused", "{d}");
    check_eq!(c, d["paused_by"], "operator", "{d}");

    accept(&c, "orders", "evt-held").await;
    quiet(&c, &rx, 0, SECOND).await;
    let d = destination(&c, "orders").await;
    check_eq!(c, d["pending"], 1, "{d}");
    let age = d["oldest_pending_age_s"].as_f64().unwrap_or(0.0);
    check!(c, (0.9..).contains(&age), "oldest_pending_age_s {age}: {d}");

    let resumed = set_paused(&c, "orders", false).await;
    check_eq!(c, resumed["was_paused"], true, "{resumed}");
    let got = requests(&c, &rx, 1, PROMPT).await;
    check_eq!(c, id_of(&got[0]), "evt-held");
    check_eq!(c, attempt_of(&got[0]), "1");
    wait_delivered(&c, 1.0).await;
    let d = destination(&c, "orders").await;
    check_eq!(c, d["state"], "healthy", "{d}");
    check!(c, d["paused_by"].is_null(), "{d}");

    for action in ["pause", "resume"] {
        let (status, body) = admin_post(&c, "nope", action).await;
        check_eq!(c, status, 404, "{action} of an unknown destination: {body}");
        check!(c, body["error"].is_string(), "{action}: {body}");
        check_eq!(
            c,
            body["destinations"],
            json!(["orders"]),
            "{action}: {body}"
        );
    }
}

// 7 ------------------------------------------------------------------------

/// Waiting is not an attempt: an event of a paused destination is
/// dead-lettered at its TTL, with the attempts it really had, even when its
/// next due time lies beyond the TTL (as after `event_ttl` was lowered).
///
/// Fails at the time of writing: the dispatcher looks at TTL deadlines only
/// while an event that is due is held back by the gate, so an event whose
/// `next_due_ms` is past its deadline waits until `next_due_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expires_while_the_destination_is_paused() {
    const SHIFT_MS: i64 = 59_500;
    let tmp = tempfile::tempdir().expect("tempdir");
    let (rx, mut c, db, _) = paused_by_gone(tmp.path(), "evt-ttl").await;

    // Crash; make the event 59.5 s older (its TTL ends in 0.5 s) and due
    // only in an hour, so that it is not attempted before the pause below.
    c.kill();
    {
        let conn = rusqlite::Connection::open(&db)
            .unwrap_or_else(|e| fail!(c, "open {}: {e}", db.display()));
        let changed = conn
            .execute(
                "UPDATE events SET accepted_ms = accepted_ms - ?1, next_due_ms = ?2 WHERE id = ?3",
                rusqlite::params![SHIFT_MS, now_ms() + 3_600_000, "evt-ttl"],
            )
            .unwrap_or_else(|e| fail!(c, "update the journal: {e}"));
        check_eq!(c, changed, 1, "rows moved back in time");
    }
    let restarted = Instant::now();
    c.restart().await;
    set_paused(&c, "orders", true).await;

    let dead = dead_letters(&c, "orders", 1, PROMPT).await;
    let took = restarted.elapsed();
    eprintln!("dead-lettered {took:?} after restart");
    let d = &dead[0];
    check_eq!(c, d["id"], "evt-ttl");
    check_eq!(c, d["deadLetterReason"], "TimeToLiveExceeded");
    check_eq!(
        c,
        d["deliveryAttempts"],
        1,
        "waiting is not an attempt: {d}"
    );
    check_eq!(c, d["lastDeliveryOutcome"], "Gone", "{d}");
    check_eq!(c, d["lastHttpStatusCode"], 410, "{d}");
    check!(
        c,
        took < 4 * SECOND,
        "dead letter took {took:?} after restart"
    );
    check_eq!(c, rx.count(), 1, "requests to the receiver");
    wait_metric(
        &c,
        r#"courier_events_dead_lettered_total{destination="orders",reason="TimeToLiveExceeded"}"#,
        1.0,
        PROMPT,
    )
    .await;
    wait_metric(
        &c,
        r#"courier_events_pending{destination="orders"}"#,
        0.0,
        PROMPT,
    )
    .await;
    let d = destination(&c, "orders").await;
    check_eq!(c, d["state"], "paused", "{d}");
}

// 7b -----------------------------------------------------------------------

/// The same without touching `next_due_ms`: the event is due while the
/// destination is paused by a 410, so it waits in the dispatcher's queue,
/// and it is dead-lettered at its TTL deadline, not before and not
/// attempted again, also not after the restart: the 410's pause is
/// recorded before the attempt's outcome, and outlives the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expires_while_held_back_by_a_gone_pause() {
    const TTL_MS: i64 = 60_000;
    const SHIFT_MS: i64 = 59_000;
    let tmp = tempfile::tempdir().expect("tempdir");
    let (rx, mut c, db, (accepted_ms, next_due_ms, _)) =
        paused_by_gone(tmp.path(), "evt-held").await;
    check!(
        c,
        next_due_ms <= now_ms(),
        "after a 410 the event is due at once (held by the pause): next_due_ms {next_due_ms}"
    );

    // Crash; make the event 59 s older: its TTL ends 1 s from now.
    c.kill();
    {
        let conn = rusqlite::Connection::open(&db)
            .unwrap_or_else(|e| fail!(c, "open {}: {e}", db.display()));
        let changed = conn
            .execute(
                "UPDATE events SET accepted_ms = accepted_ms - ?1, next_due_ms = next_due_ms - ?1 WHERE id = ?2",
                rusqlite::params![SHIFT_MS, "evt-held"],
            )
            .unwrap_or_else(|e| fail!(c, "update the journal: {e}"));
        check_eq!(c, changed, 1, "rows moved back in time");
    }
    let deadline_ms = accepted_ms - SHIFT_MS + TTL_MS;
    c.restart().await;

    let dead = dead_letters(&c, "orders", 1, PROMPT).await;
    let seen_ms = now_ms();
    eprintln!(
        "held-back event dead-lettered {} ms after its TTL deadline",
        seen_ms - deadline_ms
    );
    check!(
        c,
        seen_ms >= deadline_ms,
        "dead-lettered {} ms before its TTL deadline",
        deadline_ms - seen_ms
    );
    check!(
        c,
        seen_ms < deadline_ms + 1500,
        "dead-lettered {} ms after its TTL deadline",
        seen_ms - deadline_ms
    );
    let attempts = rx.count();
    eprintln!("held-back event: {attempts} attempts in all");
    check_eq!(
        c,
        attempts,
        1,
        "requests: the event was attempted while paused"
    );
    let d = &dead[0];
    check_eq!(c, d["id"], "evt-held");
    check_eq!(c, d["deadLetterReason"], "TimeToLiveExceeded");
    check_eq!(
        c,
        d["deliveryAttempts"],
        attempts,
        "waiting is not an attempt: {d}"
    );
    check_eq!(c, d["lastDeliveryOutcome"], "Gone", "{d}");
    check_eq!(c, d["lastHttpStatusCode"], 410, "{d}");
    quiet(&c, &rx, attempts, Duration::from_millis(300)).await;
    let d = destination(&c, "orders").await;
    check_eq!(c, d["state"], "paused", "{d}");
    check_eq!(c, d["pending"], 0, "{d}");
}

// 8 ------------------------------------------------------------------------

/// A pasted SNS delivery policy, scaled down: two no-delay retries, one at
/// min, one backoff retry at max; its throttle policy caps the rate. What
/// happens agrees with `courier schedule --json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pasted_sns_policy_runs_its_phases() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start(behavior(|_, n| {
        Reply::status(if n < 4 { 500 } else { 200 })
    }))
    .await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        r#"retry: { schedule: { sns: { healthyRetryPolicy: { minDelayTarget: 1, maxDelayTarget: 2, numRetries: 5, numNoDelayRetries: 2, numMinDelayRetries: 1, numMaxDelayRetries: 1, backoffFunction: "linear" }, sicklyRetryPolicy: null, throttlePolicy: { maxReceivesPerSecond: 10 }, guaranteed: false } }, jitter: 0 }
           status: { min_delay: { 5xx: 0s } }"#,
    );
    let c = Courier::start(tmp.path(), &yaml).await;

    accept(&c, "orders", "evt-sns").await;
    let got = requests(&c, &rx, 5, 8 * SECOND).await;
    let attempts: Vec<&str> = got.iter().map(attempt_of).collect();
    check_eq!(c, attempts, vec!["1", "2", "3", "4", "5"]);
    let gaps: Vec<Duration> = got.windows(2).map(|w| gap(&w[0], &w[1])).collect();
    eprintln!("sns gaps: {gaps:?}");
    // No-delay retries: back to back, but at most 10 a second.
    for (i, g) in gaps[..2].iter().enumerate() {
        check!(
            c,
            *g >= Duration::from_millis(90) && *g < Duration::from_millis(500),
            "gap before attempt {} was {g:?}: no-delay retry, maxReceivesPerSecond 10",
            i + 2
        );
    }
    check!(
        c,
        gaps[2] >= Duration::from_millis(950) && gaps[2] < Duration::from_millis(1600),
        "gap before attempt 4 (pre-backoff at min 1s) was {:?}",
        gaps[2]
    );
    check!(
        c,
        gaps[3] >= Duration::from_millis(1950) && gaps[3] < Duration::from_millis(2600),
        "gap before attempt 5 (the one backoff retry, at max 2s) was {:?}",
        gaps[3]
    );
    wait_delivered(&c, 1.0).await;
    quiet(&c, &rx, 5, Duration::from_millis(300)).await;

    // The plan courier prints agrees.
    let config_path = c.config_path().to_string_lossy().into_owned();
    let out = support::run_cli(
        None,
        &["schedule", "-c", &config_path, "orders", "--json"],
        &[],
    )
    .await;
    check!(
        c,
        out.success(),
        "courier schedule: {}\n{}",
        out.stdout,
        out.stderr
    );
    let plan = out.json();
    let rows = plan["attempts"].as_array().cloned().unwrap_or_default();
    let planned: Vec<(u64, f64, String)> = rows
        .iter()
        .map(|r| {
            (
                r["attempt"].as_u64().unwrap_or(0),
                r["delay_s"].as_f64().unwrap_or(-1.0),
                r["phase"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    check_eq!(c, planned.len(), 6, "plan: {plan}");
    check_eq!(
        c,
        plan["ends"],
        json!({ "after_attempt": 6, "at_s": 5, "reason": "max_attempts" }),
        "plan: {plan}"
    );
    let phases: Vec<&str> = planned.iter().map(|p| p.2.as_str()).collect();
    check_eq!(
        c,
        phases[1..],
        [
            "no-delay",
            "no-delay",
            "pre-backoff",
            "backoff",
            "post-backoff"
        ],
        "plan: {plan}"
    );
    for (i, g) in gaps.iter().enumerate() {
        let (attempt, delay_s, _) = &planned[i + 1];
        check_eq!(c, *attempt, i as u64 + 2, "plan: {plan}");
        let observed = g.as_secs_f64();
        check!(
            c,
            observed >= delay_s - 0.05 && observed < delay_s + 0.6,
            "attempt {attempt}: planned delay {delay_s}s, observed {g:?}"
        );
    }
}

// 9 ------------------------------------------------------------------------

/// A dead endpoint costs about one attempt per probation period, not one
/// per schedule step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_does_not_burn_attempts() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_reserved, port) = refusing_port();
    let yaml = config(
        "orders",
        &format!("http://127.0.0.1:{port}/hooks"),
        "concurrency: 4
         retry: { schedule: [10ms], max_attempts: 30, jitter: 0 }
         probation: { after_failures: 10, durations: { SocketError: 1s } }",
    );
    let c = Courier::start(tmp.path(), &yaml).await;

    let started = Instant::now();
    for i in 0..5 {
        accept(&c, "orders", &format!("evt-{i}")).await;
    }
    tokio::time::sleep((4 * SECOND).saturating_sub(started.elapsed())).await;
    let series = r#"courier_delivery_attempts_total{destination="orders",outcome="SocketError"}"#;
    let attempts = metric(&c.admin_url(), series).await.unwrap_or(0.0);
    let all = metric_sum(
        &c.admin_url(),
        r#"courier_delivery_attempts_total{destination="orders"}"#,
    )
    .await;
    eprintln!("dead endpoint: {attempts} SocketError attempts ({all} in all) in 4 s");
    check_eq!(c, all, attempts, "every attempt is a SocketError");
    check!(
        c,
        (10.0..=20.0).contains(&attempts),
        "{attempts} attempts in 4 s; the schedule alone would make 150, probation about 12"
    );
    let d = destination(&c, "orders").await;
    check_eq!(c, d["state"], "probation", "{d}");
    check_eq!(c, d["last_outcome"], "SocketError", "{d}");
    check_eq!(c, d["pending"], 5, "{d}");
    nothing_dead_lettered(&c, "orders").await;
}
