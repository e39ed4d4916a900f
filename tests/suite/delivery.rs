//! Delivery end to end (docs/publishing.md, docs/delivery.md, docs/dead-letters.md): the real binary accepts
//! an event, delivers it to a loopback `Receiver` with Event Grid retry
//! semantics, and dead-letters (or drops) what it cannot deliver.
//!
//! Every delay comes from the config (schedules of milliseconds, `min_delay`
//! overrides, a short `timeout`), so each test finishes in a few seconds, and
//! every wait is bounded. A failing check prints courier's logs.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use support::{
    Courier, Receiver, Reply, behavior, check, check_eq, config, courier_bin, fail, files_under,
    metric, metric_sum, now_ms, post, quiet, refusing_port, requests, wait_dead_letters,
    wait_metric,
};

const SECOND: Duration = Duration::from_secs(1);
/// How long a test waits for something that should happen at once.
const PROMPT: Duration = Duration::from_secs(5);
/// How long a test watches for something that must not happen.
const QUIET: Duration = Duration::from_millis(400);
const POLL: Duration = Duration::from_millis(10);

async fn start(dir: &Path, yaml: &str) -> Courier {
    Courier::start(dir, yaml).await
}

/// Posts an event and checks it was accepted; returns the 202 body.
async fn accept(c: &Courier, path: &str, body: &[u8], headers: &[(&str, &str)]) -> Value {
    let resp = post(&c.url(path), bytes::Bytes::copy_from_slice(body), headers).await;
    check_eq!(c, resp.status, 202, "POST /{path}: {}", resp.text());
    serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| fail!(c, "202 body is not JSON ({e}): {}", resp.text()))
}

/// `yyyy-mm-dd` of the UTC day of `t`.
fn utc_day(t: SystemTime) -> String {
    humantime::format_rfc3339(t).to_string()[..10].to_owned()
}

/// Waits (bounded) for at least `n` dead-letter records of `destination`
/// under `dl/<destination>/`, checks the file is `<UTC day>.jsonl`, and
/// returns the records.
async fn dead_letters(c: &Courier, destination: &str, n: usize, timeout: Duration) -> Vec<Value> {
    let day_before = utc_day(SystemTime::now());
    let (names, records) = wait_dead_letters(c, destination, n, timeout).await;
    let day_after = utc_day(SystemTime::now());
    for name in &names {
        check!(
            c,
            *name == format!("{day_before}.jsonl") || *name == format!("{day_after}.jsonl"),
            "dead-letter file {name} in {} is not named after the UTC day ({day_after})",
            support::dl_dir(c, destination).display()
        );
    }
    records
}

/// Waits (bounded) until `destination` has no event pending.
async fn wait_nothing_pending(c: &Courier, destination: &str) {
    let series = format!(r#"courier_events_pending{{destination="{destination}"}}"#);
    wait_metric(c, &series, 0.0, PROMPT).await;
}

/// Waits (bounded) until one event of `destination` was dead-lettered for
/// `reason`.
async fn wait_dead_lettered(c: &Courier, destination: &str, reason: &str) {
    let series = format!(
        r#"courier_events_dead_lettered_total{{destination="{destination}",reason="{reason}"}}"#
    );
    wait_metric(c, &series, 1.0, PROMPT).await;
}

/// The end of a test whose one `orders` event was dead-lettered for `reason`
/// after one attempt: no more requests, the counter, nothing pending.
async fn dead_lettered_once(c: &Courier, rx: &Receiver, reason: &str) {
    quiet(c, rx, 1, QUIET).await;
    wait_dead_lettered(c, "orders", reason).await;
    wait_nothing_pending(c, "orders").await;
}

/// The journal row of one event: (accepted_ms, next_due_ms, attempts,
/// last_outcome, last_status).
type Row = (i64, i64, i64, Option<String>, Option<i64>);

fn journal_row(db: &Path, id: &str) -> rusqlite::Result<Option<Row>> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    conn.busy_timeout(SECOND)?;
    let mut stmt = conn.prepare(
        "SELECT accepted_ms, next_due_ms, attempts, last_outcome, last_status FROM events WHERE id = ?1",
    )?;
    let mut rows = stmt.query_map([id], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
    })?;
    rows.next().transpose()
}

// 1 ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_with_path_query_body_and_headers() {
    const KEY: &str = "s3cret-key-value-7f3a";
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "retry: { schedule: [50ms], jitter: 0 }
         headers: { X-Tenant: { value: acme }, X-Key: { from_env: TEST_KEY, secret: true } }",
    );
    let c = Courier::start_with_env(courier_bin(), tmp.path(), &yaml, &[("TEST_KEY", KEY)]).await;

    let body: &[u8] = br#"{"order":42,"items":[1,2],"note":"a b"}"#;
    let resp = post(
        &c.url("orders/a/b?x=1"),
        body,
        &[
            ("Idempotency-Key", "evt-1"),
            ("X-Trace", "t1"),
            ("content-type", "application/json"),
        ],
    )
    .await;
    check_eq!(c, resp.status, 202, "POST: {}", resp.text());
    check_eq!(
        c,
        resp.text(),
        r#"{"accepted":1,"ids":["evt-1"]}"#,
        "202 body"
    );

    let got = requests(&c, &rx, 1, PROMPT).await;
    let r = &got[0];
    check_eq!(c, r.method, http::Method::POST);
    check_eq!(c, r.path_and_query, "/hooks/a/b?x=1");
    check_eq!(c, r.body.as_ref(), body, "delivered body");
    for (name, want) in [
        ("x-trace", "t1"),
        ("content-type", "application/json"),
        ("x-tenant", "acme"),
        ("x-key", KEY),
        ("webhook-id", "evt-1"),
        ("courier-delivery-attempt", "1"),
        ("courier-destination", "orders"),
    ] {
        check_eq!(c, r.header(name), Some(want), "header {name}");
    }

    wait_metric(
        &c,
        r#"courier_events_delivered_total{destination="orders"}"#,
        1.0,
        PROMPT,
    )
    .await;
    wait_nothing_pending(&c, "orders").await;
    quiet(&c, &rx, 1, QUIET).await;
    check!(
        c,
        !c.logs().contains(KEY),
        "the secret header value appears in the logs"
    );
    check!(
        c,
        files_under(&tmp.path().join("dl")).is_empty(),
        "dead letters written"
    );
}

// 2 ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_request_is_dead_lettered_after_one_attempt() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "retry: { schedule: [50ms], max_attempts: 5, jitter: 0 }
         status: { min_delay: { 5xx: 0s } }",
    );
    let c = start(tmp.path(), &yaml).await;

    let posted = json!({ "order": 7, "lines": [{ "sku": "A-1", "qty": 2 }], "ok": true });
    let accepted = accept(
        &c,
        "orders/created?v=2",
        posted.to_string().as_bytes(),
        &[
            ("Idempotency-Key", "evt-400"),
            ("content-type", "application/json"),
        ],
    )
    .await;
    check_eq!(c, accepted, json!({ "accepted": 1, "ids": ["evt-400"] }));

    let dead = dead_letters(&c, "orders", 1, PROMPT).await;
    check_eq!(c, dead.len(), 1, "dead letters: {dead:?}");
    let d = &dead[0];
    check_eq!(c, d["id"], "evt-400");
    check_eq!(c, d["subject"], "orders");
    check_eq!(c, d["eventType"], "Courier.Custom");
    check_eq!(c, d["deadLetterReason"], "NonRetriableStatus");
    check_eq!(c, d["lastDeliveryOutcome"], "BadRequest");
    check_eq!(c, d["lastHttpStatusCode"], 400);
    check_eq!(c, d["deliveryAttempts"], 1);
    check_eq!(c, d["data"], posted, "data");
    check!(c, d.get("data_base64").is_none(), "record: {d}");
    check_eq!(c, d["method"], "POST");
    check_eq!(c, d["path"], "/created?v=2");
    check_eq!(c, d["headers"]["content-type"], "application/json");
    for key in ["eventTime", "publishTime", "lastDeliveryAttemptTime"] {
        check!(c, d[key].is_string(), "{key} missing in {d}");
    }

    dead_lettered_once(&c, &rx, "NonRetriableStatus").await;
}

// 3 ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_then_ok_is_delivered_on_attempt_three_after_min_delay() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::sequence(vec![
        Reply::status(503),
        Reply::status(503),
        Reply::status(200),
    ])
    .await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "retry: { schedule: [50ms], max_attempts: 5, jitter: 0 }
         status: { min_delay: { 503: 300ms } }",
    );
    let c = start(tmp.path(), &yaml).await;

    accept(
        &c,
        "orders",
        br#"{"n":3}"#,
        &[("Idempotency-Key", "evt-503")],
    )
    .await;
    let got = requests(&c, &rx, 3, PROMPT).await;
    for (i, r) in got.iter().enumerate() {
        let attempt = (i + 1).to_string();
        check_eq!(
            c,
            r.header("courier-delivery-attempt"),
            Some(attempt.as_str()),
            "request {i}"
        );
        check_eq!(c, r.header("webhook-id"), Some("evt-503"), "request {i}");
        check_eq!(c, r.body.as_ref(), br#"{"n":3}"#.as_slice(), "request {i}");
    }
    for pair in got.windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        check!(
            c,
            gap >= Duration::from_millis(300) && gap < 3 * SECOND,
            "gap between attempts {gap:?}, want 300ms..3s"
        );
    }
    wait_metric(
        &c,
        r#"courier_events_delivered_total{destination="orders"}"#,
        1.0,
        PROMPT,
    )
    .await;
    quiet(&c, &rx, 3, QUIET).await;
    let dead = metric_sum(
        &c.admin_url(),
        r#"courier_events_dead_lettered_total{destination="orders"}"#,
    )
    .await;
    check_eq!(c, dead, 0.0, "dead-lettered");
    check!(
        c,
        files_under(&tmp.path().join("dl")).is_empty(),
        "dead letters written"
    );
    check_eq!(
        c,
        metric(
            &c.admin_url(),
            r#"courier_delivery_attempts_total{destination="orders",outcome="Busy"}"#
        )
        .await,
        Some(2.0)
    );
}

// 4 ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_requests_waits_for_retry_after() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::sequence(vec![
        Reply::status(429).header("Retry-After", "1"),
        Reply::status(200),
    ])
    .await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "retry: { schedule: [50ms], max_attempts: 5, jitter: 0 }",
    );
    let c = start(tmp.path(), &yaml).await;

    accept(&c, "orders", b"{}", &[("Idempotency-Key", "evt-429")]).await;
    let got = requests(&c, &rx, 2, PROMPT).await;
    let gap = got[1].at.duration_since(got[0].at);
    check!(
        c,
        gap >= SECOND && gap < 4 * SECOND,
        "gap after 429 + Retry-After: 1 was {gap:?}, want 1s..4s"
    );
    check_eq!(c, got[1].header("courier-delivery-attempt"), Some("2"));
    wait_metric(
        &c,
        r#"courier_events_delivered_total{destination="orders"}"#,
        1.0,
        PROMPT,
    )
    .await;
    quiet(&c, &rx, 2, QUIET).await;
}

// 5 ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_attempts_then_dead_letter() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start(behavior(|_, _| Reply::status(500))).await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "retry: { schedule: [50ms], max_attempts: 3, jitter: 0 }
         status: { min_delay: { 5xx: 0s } }",
    );
    let c = start(tmp.path(), &yaml).await;

    accept(
        &c,
        "orders",
        br#"{"n":5}"#,
        &[("Idempotency-Key", "evt-500")],
    )
    .await;
    let dead = dead_letters(&c, "orders", 1, PROMPT).await;
    let d = &dead[0];
    check_eq!(c, d["id"], "evt-500");
    check_eq!(c, d["deadLetterReason"], "MaxDeliveryAttemptsExceeded");
    check_eq!(c, d["deliveryAttempts"], 3);
    check_eq!(c, d["lastDeliveryOutcome"], "Failed");
    check_eq!(c, d["lastHttpStatusCode"], 500);
    check_eq!(c, d["data"], json!({ "n": 5 }));

    quiet(&c, &rx, 3, QUIET).await;
    let got = rx.received();
    let attempts: Vec<Option<&str>> = got
        .iter()
        .map(|r| r.header("courier-delivery-attempt"))
        .collect();
    check_eq!(c, attempts, vec![Some("1"), Some("2"), Some("3")]);
    check_eq!(
        c,
        dead_letters(&c, "orders", 1, PROMPT).await.len(),
        1,
        "dead letters"
    );
    wait_dead_lettered(&c, "orders", "MaxDeliveryAttemptsExceeded").await;
    wait_metric(
        &c,
        r#"courier_delivery_attempts_total{destination="orders",outcome="Failed"}"#,
        3.0,
        PROMPT,
    )
    .await;
    wait_nothing_pending(&c, "orders").await;
}

// 6 ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expires_at_its_deadline_and_survives_a_restart() {
    const TTL_MS: i64 = 60_000;
    const SHIFT_MS: i64 = 59_500;
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start(behavior(|_, _| Reply::status(500))).await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "retry: { schedule: [1h], max_attempts: 30, event_ttl: 1m, jitter: 0 }
         status: { min_delay: { 5xx: 0s } }",
    );
    let mut c = start(tmp.path(), &yaml).await;
    let db = tmp.path().join("journal").join("journal.db");

    let before = now_ms();
    accept(
        &c,
        "orders",
        br#"{"n":6}"#,
        &[("Idempotency-Key", "evt-ttl")],
    )
    .await;
    let after = now_ms();
    requests(&c, &rx, 1, PROMPT).await;

    // Wait (bounded) for the failed attempt to be committed.
    let deadline = Instant::now() + PROMPT;
    let row = loop {
        match journal_row(&db, "evt-ttl") {
            Ok(Some(row)) if row.2 == 1 => break row,
            Ok(_) | Err(_) if Instant::now() < deadline => tokio::time::sleep(POLL).await,
            other => fail!(
                c,
                "journal row of evt-ttl after the first attempt: {other:?}"
            ),
        }
    };
    let (accepted_ms, next_due_ms, attempts, outcome, status) = row;
    check!(
        c,
        (before..=after).contains(&accepted_ms),
        "accepted_ms {accepted_ms} not within {before}..={after}"
    );
    check_eq!(
        c,
        next_due_ms,
        accepted_ms + TTL_MS,
        "the next attempt (1h) is beyond the TTL: the event must be due at its TTL deadline"
    );
    check_eq!(c, attempts, 1);
    check_eq!(c, outcome.as_deref(), Some("Failed"));
    check_eq!(c, status, Some(500));

    // Crash, then make the event 59.5 s older: its TTL deadline is now at
    // most 0.5 s away.
    c.kill();
    {
        let conn = rusqlite::Connection::open(&db)
            .unwrap_or_else(|e| fail!(c, "open {}: {e}", db.display()));
        let changed = conn
            .execute(
                "UPDATE events SET accepted_ms = accepted_ms - ?1, next_due_ms = next_due_ms - ?1 WHERE id = ?2",
                rusqlite::params![SHIFT_MS, "evt-ttl"],
            )
            .unwrap_or_else(|e| fail!(c, "update the journal: {e}"));
        check_eq!(c, changed, 1, "rows moved back in time");
    }
    let restarted = Instant::now();
    c.restart().await;

    let dead = dead_letters(&c, "orders", 1, PROMPT).await;
    let took = restarted.elapsed();
    let d = &dead[0];
    check_eq!(c, d["id"], "evt-ttl");
    check_eq!(c, d["deadLetterReason"], "TimeToLiveExceeded");
    check_eq!(c, d["deliveryAttempts"], 1);
    check_eq!(c, d["lastDeliveryOutcome"], "Failed");
    check_eq!(c, d["lastHttpStatusCode"], 500);
    check_eq!(c, d["data"], json!({ "n": 6 }));
    check!(
        c,
        took < 4 * SECOND,
        "dead letter took {took:?} after restart"
    );

    dead_lettered_once(&c, &rx, "TimeToLiveExceeded").await;
}

// 7 ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_receiver_is_a_socket_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_reserved, port) = refusing_port();
    let refused = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
    assert_eq!(
        refused.map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionRefused),
        "port {port} must refuse connections"
    );
    let yaml = config(
        "orders",
        &format!("http://127.0.0.1:{port}/hooks"),
        "retry: { schedule: [50ms], max_attempts: 2, jitter: 0 }",
    );
    let c = start(tmp.path(), &yaml).await;

    accept(
        &c,
        "orders",
        br#"{"n":7}"#,
        &[("Idempotency-Key", "evt-refused")],
    )
    .await;
    let dead = dead_letters(&c, "orders", 1, PROMPT).await;
    let d = &dead[0];
    check_eq!(c, d["id"], "evt-refused");
    check_eq!(c, d["deadLetterReason"], "MaxDeliveryAttemptsExceeded");
    check_eq!(c, d["deliveryAttempts"], 2);
    check_eq!(c, d["lastDeliveryOutcome"], "SocketError");
    check!(
        c,
        d.get("lastHttpStatusCode") == Some(&Value::Null),
        "lastHttpStatusCode must be present and null: {d}"
    );
    wait_metric(
        &c,
        r#"courier_delivery_attempts_total{destination="orders",outcome="SocketError"}"#,
        2.0,
        PROMPT,
    )
    .await;
}

/// A destination whose host name cannot resolve (`.invalid` never does,
/// RFC 6761; no packet leaves the machine) is a `ResolutionError`, as the
/// real resolver's error reaches the classifier, not a hand-made one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_host_is_a_resolution_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = config(
        "orders",
        "http://courier-test.invalid/hooks",
        "timeout: 10s\nretry: { schedule: [50ms], max_attempts: 1, jitter: 0 }",
    );
    let c = start(tmp.path(), &yaml).await;
    accept(
        &c,
        "orders",
        br#"{"n":8}"#,
        &[("Idempotency-Key", "evt-unresolvable")],
    )
    .await;
    let dead = dead_letters(&c, "orders", 1, Duration::from_secs(15)).await;
    let d = &dead[0];
    check_eq!(c, d["id"], "evt-unresolvable");
    check_eq!(c, d["deliveryAttempts"], 1);
    check_eq!(c, d["lastDeliveryOutcome"], "ResolutionError");
    wait_metric(
        &c,
        r#"courier_delivery_attempts_total{destination="orders",outcome="ResolutionError"}"#,
        1.0,
        PROMPT,
    )
    .await;
}

// 8 ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_receiver_times_out() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start(behavior(|_, _| Reply::hang())).await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        // No late-answer window: the last attempt's timeout ends delivery
        // at once (with one, tests/suite/late.rs: only when the window closes).
        "timeout: 200ms
         late_answer_window: 0s
         retry: { schedule: [50ms], max_attempts: 1, jitter: 0 }",
    );
    let c = start(tmp.path(), &yaml).await;

    let posted = Instant::now();
    accept(
        &c,
        "orders",
        br#"{"n":8}"#,
        &[("Idempotency-Key", "evt-hang")],
    )
    .await;
    let dead = dead_letters(&c, "orders", 1, 3 * SECOND).await;
    let took = posted.elapsed();
    check!(
        c,
        took >= Duration::from_millis(200) && took < 3 * SECOND,
        "dead letter written {took:?} after posting, want 200ms..3s"
    );
    let d = &dead[0];
    check_eq!(c, d["deadLetterReason"], "MaxDeliveryAttemptsExceeded");
    check_eq!(c, d["deliveryAttempts"], 1);
    check_eq!(c, d["lastDeliveryOutcome"], "TimedOut");
    check!(
        c,
        d.get("lastHttpStatusCode") == Some(&Value::Null),
        "lastHttpStatusCode must be present and null: {d}"
    );
    quiet(&c, &rx, 1, QUIET).await;
}

// 9 ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_sink_events_are_dropped_and_counted() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let yaml = config(
        "audit",
        &format!("{}/hooks", rx.url()),
        "retry: { schedule: [50ms], jitter: 0 }
         dead_letter: none",
    );
    let c = start(tmp.path(), &yaml).await;

    accept(
        &c,
        "audit",
        br#"{"n":9}"#,
        &[("Idempotency-Key", "evt-drop")],
    )
    .await;
    wait_metric(
        &c,
        r#"courier_events_dropped_total{destination="audit",reason="NonRetriableStatus"}"#,
        1.0,
        PROMPT,
    )
    .await;
    wait_nothing_pending(&c, "audit").await;
    quiet(&c, &rx, 1, QUIET).await;
    let files = files_under(&tmp.path().join("dl"));
    check!(
        c,
        files.is_empty(),
        "files in the dead-letter dir: {files:?}"
    );
    let dead = metric_sum(
        &c.admin_url(),
        r#"courier_events_dead_lettered_total{destination="audit"}"#,
    )
    .await;
    check_eq!(c, dead, 0.0, "dead-lettered");
}

// 10 -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_body_is_dead_lettered_as_base64() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "retry: { schedule: [50ms], jitter: 0 }",
    );
    let c = start(tmp.path(), &yaml).await;

    accept(
        &c,
        "orders/bin",
        b"hello\x00",
        &[
            ("Idempotency-Key", "evt-bin"),
            ("content-type", "application/octet-stream"),
        ],
    )
    .await;
    let got = requests(&c, &rx, 1, PROMPT).await;
    check_eq!(
        c,
        got[0].body.as_ref(),
        b"hello\x00".as_slice(),
        "delivered body"
    );

    let dead = dead_letters(&c, "orders", 1, PROMPT).await;
    let d = &dead[0];
    check_eq!(c, d["id"], "evt-bin");
    check_eq!(c, d["data_base64"], "aGVsbG8A");
    check!(c, d.get("data").is_none(), "record has `data`: {d}");
    check_eq!(c, d["headers"]["content-type"], "application/octet-stream");
    check_eq!(c, d["path"], "/bin");
    check_eq!(c, d["deadLetterReason"], "NonRetriableStatus");
}

/// The most requests the receiver held at once: each from its arrival until
/// its answer was written, since courier can put the next attempt in that
/// slot only once it has read the answer.
fn most_at_once(received: &[support::Received]) -> usize {
    let mut edges: Vec<(Instant, i32)> = received
        .iter()
        .flat_map(|r| [Some((r.at, 1)), r.answered.map(|a| (a, -1))])
        .flatten()
        .collect();
    // At one instant an answer (-1) sorts before an arrival (+1).
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    most as usize
}

/// `concurrency` counts attempts on the wire: a delivered event that has a
/// journal row gives its slot back when its answer is in, before the
/// indexer has committed its delete, and no more than `concurrency`
/// requests are ever at the endpoint at once, for events sent from memory
/// and for events read back from the index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_caps_the_attempts_on_the_wire_from_memory_and_from_the_index() {
    const CONCURRENCY: usize = 3;
    const EVENTS: usize = 24;
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start(behavior(|_, _| {
        Reply::status(200).delay(Duration::from_millis(40))
    }))
    .await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        &format!("concurrency: {CONCURRENCY}"),
    );
    let c = start(tmp.path(), &yaml).await;
    let admin = |action: &str| format!("{}/v1/destinations/orders/{action}", c.admin_url());
    let r = support::admin_post(&admin("pause"), "", &[]).await;
    check!(c, r.status < 300, "pause: {} {}", r.status, r.text());
    let send = |from: usize| {
        let url = c.url("orders");
        async move {
            let mut posts = tokio::task::JoinSet::new();
            for i in from..from + EVENTS {
                let url = url.clone();
                posts.spawn(async move {
                    let key = format!("evt-{i}");
                    post(&url, "{}", &[("Idempotency-Key", key.as_str())])
                        .await
                        .status
                });
            }
            posts.join_all().await
        }
    };
    let statuses = send(0).await;
    check!(c, statuses.iter().all(|s| *s == 202), "{statuses:?}");
    // Every event a row, so that each delivery waits for the indexer.
    let db = tmp.path().join("journal/journal.db");
    let deadline = Instant::now() + PROMPT;
    // Bounded by the deadline.
    while (0..EVENTS).any(|i| !matches!(journal_row(&db, &format!("evt-{i}")), Ok(Some(_)))) {
        check!(
            c,
            Instant::now() < deadline,
            "the paused events never became rows"
        );
        tokio::time::sleep(POLL).await;
    }
    let r = support::admin_post(&admin("resume"), "", &[]).await;
    check!(c, r.status < 300, "resume: {} {}", r.status, r.text());
    requests(&c, &rx, EVENTS, PROMPT).await;
    wait_nothing_pending(&c, "orders").await;
    let from_index = most_at_once(&rx.received());
    let statuses = send(EVENTS).await;
    check!(c, statuses.iter().all(|s| *s == 202), "{statuses:?}");
    let got = requests(&c, &rx, 2 * EVENTS, PROMPT).await;
    let from_memory = most_at_once(&got[EVENTS..]);
    check!(
        c,
        from_index == CONCURRENCY && from_memory == CONCURRENCY,
        "at most {CONCURRENCY} requests at once, and the slots used: {from_index} at once from the index, {from_memory} from memory"
    );
}

/// An attempt gives its slot back once its answer is in, and the event
/// waiting for that slot goes out then, while the attempt still records its
/// outcome: here a 400 whose dead letter cannot be written (the folder is a
/// file), so that attempt retries the sink for minutes. With
/// `concurrency: 1`, the next event must not wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_slot_sends_the_next_event_while_the_last_one_still_records_its_outcome() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::start(behavior(|r, _| {
        if r.text().contains("refused") {
            Reply::status(400).delay(Duration::from_millis(300))
        } else {
            Reply::status(200)
        }
    }))
    .await;
    let yaml = config("orders", &rx.url(), "concurrency: 1");
    let c = start(tmp.path(), &yaml).await;
    let sink = support::dl_dir(&c, "orders");
    if let Some(parent) = sink.parent() {
        std::fs::create_dir_all(parent).expect("dead-letter root");
    }
    std::fs::write(&sink, b"not a folder").expect("block the sink");
    let r = post(&c.url("orders"), r#"{"n":"refused"}"#, &[]).await;
    check_eq!(c, r.status, 202, "{}", r.text());
    // On the wire, its answer 300 ms away: the next event waits for the slot.
    rx.wait_for(1, PROMPT).await;
    let r = post(&c.url("orders"), r#"{"n":"next"}"#, &[]).await;
    check_eq!(c, r.status, 202, "{}", r.text());
    let Some(got) = rx.try_wait_for(2, PROMPT).await else {
        fail!(
            c,
            "the next event was not sent while the refused one waits for its dead letter ({} requests)",
            rx.count()
        );
    };
    check!(c, got[1].text().contains("next"), "{}", got[1].text());
    check!(
        c,
        c.logged(
            |l| l.contains("cannot write the dead letter; retrying"),
            PROMPT
        )
        .await,
        "the sink did not fail as the test meant"
    );
}
