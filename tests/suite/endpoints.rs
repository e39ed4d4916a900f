//! `url: per_event` (docs/endpoints.md): the app names each event's
//! endpoint in `Courier-Endpoint`; ingress checks it, courier delivers to
//! it whole, signs with the endpoint's own secret (judged by the reference
//! `standardwebhooks` library), keeps each endpoint's trouble to that
//! endpoint, and never lets the secret out of the journal.
//!
//! Distinct endpoints are distinct loopback addresses: Linux routes all of
//! 127.0.0.0/8 to `lo`, so a receiver binds `127.0.x.y` with no setup.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support::python::check_with;
use support::{
    Courier, Received, Receiver, Reply, behavior, check, check_eq, destination_view, fail, get,
    post, quiet, requests, wait_dead_letters, wait_metric,
};

const WAIT: Duration = Duration::from_secs(30);

/// A courier with one `url: per_event` destination `customers`, loopback
/// opened to its guard, plain http allowed.
fn yaml(extra: &str) -> String {
    let mut y = String::from(
        "listen: 127.0.0.1:0\n\
         admin_listen: 127.0.0.1:0\n\
         log: { level: debug }\n\
         journal: { dir: ./journal }\n\
         dead_letter: { dir: ./dl }\n\
         destinations:\n  \
           customers:\n    \
             url: per_event\n    \
             headers: { X-Sender: { value: acme-saas } }\n",
    );
    for line in extra.lines().map(str::trim).filter(|l| !l.is_empty()) {
        y.push_str("    ");
        y.push_str(line);
        y.push('\n');
    }
    y
}

const OPEN: &str = "endpoints: { schemes: [http], allow_cidrs: [127.0.0.0/8] }";

/// The loopback address of endpoint `i`: 127.0.x.y, never 127.0.0.1.
fn address(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, (i / 250 + 1) as u8, (i % 250 + 1) as u8)
}

async fn receivers(n: usize, reply: impl Fn() -> support::Behavior) -> Vec<Receiver> {
    let mut all = Vec::with_capacity(n);
    for i in 0..n {
        all.push(Receiver::start_on(SocketAddr::from((address(i), 0)), reply()).await);
    }
    all
}

/// Endpoint `i`'s secret: its own key.
fn secret(i: usize) -> String {
    format!("whsec_{}", STANDARD.encode(format!("endpoint key {i}")))
}

/// Posts one event named `id` for the endpoint at `url`.
async fn publish(c: &Courier, id: &str, url: &str, secrets: Option<&str>) {
    let mut headers = vec![("idempotency-key", id), ("courier-endpoint", url)];
    if let Some(s) = secrets {
        headers.push(("courier-endpoint-secret", s));
    }
    // The app's path and query are not appended to the named URL.
    let resp = post(
        &c.url("customers/ignored?also=ignored"),
        format!(r#"{{"id":"{id}"}}"#),
        &headers,
    )
    .await;
    check_eq!(c, resp.status, 202, "POST for {url}: {}", resp.text());
}

/// What the reference library is given of one request.
fn wire(r: &Received, secrets: &[String]) -> Value {
    let headers: serde_json::Map<String, Value> = r
        .headers
        .iter()
        .filter_map(|(k, v)| Some((k.to_string(), Value::from(v.to_str().ok()?))))
        .collect();
    json!({"headers": headers, "body_b64": STANDARD.encode(&r.body), "secrets": secrets})
}

/// Per request, per secret: whether the library verified it.
fn verified(reqs: Vec<Value>) -> Vec<Vec<bool>> {
    let input = json!({"requests": reqs}).to_string();
    let out = check_with("verify_signatures.py", &[], input.as_bytes());
    let out: Value = serde_json::from_str(&out).expect("the checker prints JSON");
    out["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|per| {
            per.as_array()
                .expect("a result per secret")
                .iter()
                .map(|r| r["ok"].as_bool() == Some(true))
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_endpoints_each_get_their_event_signed_with_their_own_secret() {
    const N: usize = 1000;
    let rxs = receivers(N, || behavior(|_, _| Reply::status(200))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &yaml(&format!("concurrency: 64\n{OPEN}"))).await;
    // Every tenth endpoint is rotating: two secrets, each must verify.
    let secrets_of = |i: usize| -> Vec<String> {
        if i.is_multiple_of(10) {
            vec![secret(i), secret(N + i)]
        } else {
            vec![secret(i)]
        }
    };
    let urls: Vec<String> = rxs
        .iter()
        .enumerate()
        .map(|(i, rx)| format!("http://{}/hooks/{i}?tenant={i}", rx.addr()))
        .collect();
    for chunk in (0..N).collect::<Vec<_>>().chunks(50) {
        let posts = chunk.iter().map(|&i| {
            let (c, url, secrets) = (&c, &urls[i], secrets_of(i).join(" "));
            async move { publish(c, &format!("evt-{i}"), url, Some(&secrets)).await }
        });
        futures::future::join_all(posts).await;
    }
    let mut wires = Vec::with_capacity(N + 1);
    for (i, rx) in rxs.iter().enumerate() {
        let got = requests(&c, rx, 1, WAIT).await;
        let r = &got[0];
        check_eq!(
            c,
            r.path_and_query,
            format!("/hooks/{i}?tenant={i}"),
            "the named URL, whole"
        );
        check_eq!(
            c,
            r.webhook_id(),
            format!("evt-{i}"),
            "endpoint {i} got its own event"
        );
        check_eq!(
            c,
            r.header("x-sender"),
            Some("acme-saas"),
            "the destination's headers"
        );
        for own in ["courier-endpoint", "courier-endpoint-secret"] {
            check!(
                c,
                r.header(own).is_none(),
                "{own} was forwarded to endpoint {i}"
            );
        }
        wires.push(wire(r, &secrets_of(i)));
    }
    // A stranger's secret (the next endpoint's) must not verify.
    let first = requests(&c, &rxs[1], 1, WAIT).await;
    wires.push(wire(&first[0], &[secret(2)]));
    let results = verified(wires);
    for (i, per) in results.iter().take(N).enumerate() {
        check!(
            c,
            per.iter().all(|ok| *ok),
            "endpoint {i}: each of its secrets must verify: {per:?}"
        );
    }
    check_eq!(
        c,
        results[N],
        vec![false],
        "another endpoint's secret verified"
    );
    for rx in &rxs {
        quiet(&c, rx, 1, Duration::from_millis(1)).await;
    }
    // History names each event's endpoint by its origin alone (its path
    // and query may hold the customer's secret), and filters by it.
    let origin = format!("http://{}", rxs[5].addr());
    let page = get(&format!(
        "{}/v1/events?endpoint={}",
        c.admin_url(),
        urls[5]
            .replace(':', "%3A")
            .replace('/', "%2F")
            .replace('?', "%3F")
            .replace('=', "%3D")
    ))
    .await;
    let page = page.json();
    let events = page["events"].as_array().cloned().unwrap_or_default();
    check_eq!(c, events.len(), 1, "{page}");
    check_eq!(c, events[0]["id"], "evt-5", "{page}");
    check_eq!(c, events[0]["endpoint"], origin.as_str(), "{page}");
    let one = get(&format!("{}/v1/events/evt-5", c.admin_url()))
        .await
        .json();
    check_eq!(
        c,
        one["deliveries"][0]["endpoint"],
        origin.as_str(),
        "{one}"
    );
    check!(
        c,
        !one.to_string().contains("tenant="),
        "the query stays out: {one}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_refuses_a_url_by_the_rule_it_breaks_and_stores_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The defaults: https only, the guard on, no range open.
    let c = Courier::start(dir.path(), &yaml("")).await;
    let cases: Vec<(Option<&str>, Option<&str>, &str)> = vec![
        (None, None, "endpoint_missing"),
        (Some("/relative/path"), None, "endpoint_invalid"),
        (Some("not a url"), None, "endpoint_invalid"),
        (Some("http://hooks.acme.example/x"), None, "endpoint_scheme"),
        (
            Some("https://u:p@hooks.acme.example/x"),
            None,
            "endpoint_userinfo",
        ),
        (Some("https://127.0.0.1/x"), None, "endpoint_address"),
        (Some("https://10.0.0.1/x"), None, "endpoint_address"),
        (
            Some("https://169.254.169.254/latest/meta-data"),
            None,
            "endpoint_address",
        ),
        (Some("https://[::1]/x"), None, "endpoint_address"),
        (
            Some("https://[::ffff:127.0.0.1]/x"),
            None,
            "endpoint_address",
        ),
        (
            Some("https://[64:ff9b::7f00:1]/x"),
            None,
            "endpoint_address",
        ),
        (
            Some("https://hooks.acme.example/x"),
            Some("whsec_!!!"),
            "endpoint_secret",
        ),
    ];
    for (url, secret, reason) in cases {
        let mut headers = vec![];
        if let Some(u) = url {
            headers.push(("courier-endpoint", u));
        }
        if let Some(s) = secret {
            headers.push(("courier-endpoint-secret", s));
        }
        let resp = post(&c.url("customers"), r#"{"n":1}"#, &headers).await;
        check_eq!(c, resp.status, 400, "{url:?}: {}", resp.text());
        let body = resp.json();
        check_eq!(c, body["reason"], reason, "{url:?}: {body}");
        check!(
            c,
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("nothing was stored")),
            "{body}"
        );
    }
    let events = get(&format!(
        "{}/v1/events?destination=customers",
        c.admin_url()
    ))
    .await
    .json();
    check_eq!(c, events["events"], json!([]), "nothing stored: {events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_resolves_to_loopback_is_refused_at_connect_time() {
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &yaml("endpoints: { schemes: [http] }")).await;
    let url = format!("http://localhost:{}/x", rx.addr().port());
    publish(&c, "evt-local", &url, None).await;
    let (_, records) = wait_dead_letters(&c, "customers", 1, WAIT).await;
    check_eq!(
        c,
        records[0]["deadLetterReason"],
        "AddressNotAllowed",
        "{}",
        records[0]
    );
    check_eq!(
        c,
        records[0]["headers"]["courier-endpoint"],
        url.as_str(),
        "the record names the endpoint: {}",
        records[0]
    );
    quiet(&c, &rx, 0, Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sick_endpoint_goes_on_probation_alone_and_delays_no_other() {
    const HEALTHY: usize = 20;
    const EACH: usize = 5;
    const BACKLOG: usize = 400;
    let sick = Receiver::start_on(
        SocketAddr::from((address(999), 0)),
        behavior(|_, _| Reply::hang()),
    )
    .await;
    let rxs = receivers(HEALTHY, || behavior(|_, _| Reply::status(200))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(
        dir.path(),
        &yaml(&format!(
            "concurrency: 16\ntimeout: 200ms\nlate_answer_window: 0s\n\
             retry: {{ schedule: [50ms], max_attempts: 30 }}\n\
             probation: {{ after_failures: 3 }}\n{OPEN}"
        )),
    )
    .await;
    // The sick endpoint's backlog first: older than every healthy event.
    let sick_url = format!("http://{}/hook", sick.addr());
    for chunk in (0..BACKLOG).collect::<Vec<_>>().chunks(50) {
        let posts = chunk.iter().map(|&i| {
            let (c, url) = (&c, &sick_url);
            async move { publish(c, &format!("sick-{i}"), url, None).await }
        });
        futures::future::join_all(posts).await;
    }
    let started = tokio::time::Instant::now();
    for round in 0..EACH {
        for (i, rx) in rxs.iter().enumerate() {
            let url = format!("http://{}/h", rx.addr());
            publish(&c, &format!("ok-{i}-{round}"), &url, None).await;
        }
    }
    for rx in &rxs {
        requests(&c, rx, EACH, Duration::from_secs(10)).await;
    }
    let took = started.elapsed();
    // 100 events to fast endpoints: seconds would mean they waited behind
    // the sick one's 200 ms timeouts, 4 at a time.
    check!(
        c,
        took < Duration::from_secs(5),
        "healthy endpoints waited {took:?}"
    );
    wait_metric(
        &c,
        r#"courier_endpoints{destination="customers",state="probation"}"#,
        1.0,
        WAIT,
    )
    .await;
    let (view, body) = destination_view(&c.admin_url(), "customers").await;
    let state = view.map(|d| d["state"].clone());
    check_eq!(
        c,
        state,
        Some(json!("healthy")),
        "one endpoint's sickness is its own: {body}"
    );
    check!(
        c,
        sick.count() <= 4 * 3,
        "the sick endpoint got {} attempts: at most its cap (4) per probation's start",
        sick.count()
    );
}

/// Events for 500 endpoints pending across a SIGKILL: every one reaches
/// its own URL after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_for_500_endpoints_survive_sigkill_each_to_its_own_url() {
    const N: usize = 500;
    let open = Arc::new(AtomicBool::new(false));
    let rxs = receivers(N, || {
        let open = open.clone();
        behavior(move |_, _| {
            if open.load(Ordering::SeqCst) {
                Reply::status(200)
            } else {
                Reply::status(503)
            }
        })
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = Courier::start(
        dir.path(),
        &yaml(&format!(
            "concurrency: 64\nretry: {{ schedule: [200ms], max_attempts: 30 }}\nstatus: {{ min_delay: {{ 503: 0s }} }}\n\
             probation: {{ after_failures: 0 }}\n{OPEN}"
        )),
    )
    .await;
    for chunk in (0..N).collect::<Vec<_>>().chunks(50) {
        let posts = chunk.iter().map(|&i| {
            let url = format!("http://{}/e/{i}", rxs[i].addr());
            let secret = secret(i);
            let c = &c;
            async move { publish(c, &format!("evt-{i}"), &url, Some(&secret)).await }
        });
        futures::future::join_all(posts).await;
    }
    // Nothing was delivered before the kill: every endpoint answered 503.
    c.kill();
    open.store(true, Ordering::SeqCst);
    c.restart().await;
    // Delivered means answered 200, after the restart: wait for the last.
    wait_metric(
        &c,
        r#"courier_events_pending{destination="customers"}"#,
        0.0,
        WAIT,
    )
    .await;
    let mut wires = Vec::with_capacity(N);
    for (i, rx) in rxs.iter().enumerate() {
        let got = rx.received();
        check!(c, !got.is_empty(), "endpoint {i} got nothing");
        for r in &got {
            check_eq!(
                c,
                r.webhook_id(),
                format!("evt-{i}"),
                "endpoint {i} got another's event"
            );
            check_eq!(c, r.path_and_query, format!("/e/{i}"), "its own URL");
        }
        wires.push(wire(&got[got.len() - 1], &[secret(i)]));
    }
    let results = verified(wires);
    check!(
        c,
        results.iter().all(|per| per == &[true]),
        "each signed with its own secret after the restart"
    );
}

/// Every file under `dir` outside the journal's own files, as text.
fn files_outside_the_journal(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = HashSet::new();
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if !seen.insert(p.clone()) {
                continue;
            }
            let journal_file = p.parent() == Some(&dir.join("journal"))
                && p.file_name().is_some_and(|n| n != "history");
            if p.is_dir() {
                if !journal_file {
                    stack.push(p);
                }
            } else if !journal_file {
                let text =
                    String::from_utf8_lossy(&std::fs::read(&p).unwrap_or_default()).into_owned();
                out.push((p.display().to_string(), text));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_never_leaves_the_journal() {
    let rx = Receiver::start_on(
        SocketAddr::from((address(7), 0)),
        behavior(|_, _| Reply::status(400)),
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &yaml(OPEN)).await;
    let secret = secret(7);
    let key = secret.trim_start_matches("whsec_").to_string();
    let url = format!("http://{}/x", rx.addr());
    publish(&c, "evt-secret", &url, Some(&secret)).await;
    // 400: dead-lettered at its first attempt.
    let (_, records) = wait_dead_letters(&c, "customers", 1, WAIT).await;
    let got = requests(&c, &rx, 1, WAIT).await;
    let sent: String = got[0]
        .headers
        .iter()
        .map(|(k, v)| format!("{k}: {}\n", v.to_str().unwrap_or("")))
        .collect();
    let mut answers = String::new();
    for path in [
        "/v1/destinations",
        "/v1/events?destination=customers",
        "/v1/events/evt-secret",
        "/v1/dead-letters?destination=customers",
        "/v1/destinations/customers/endpoints",
        "/metrics",
    ] {
        answers.push_str(&get(&format!("{}{path}", c.admin_url())).await.text());
    }
    let logs = c.settled_logs().await;
    check!(
        c,
        logs.contains("evt-secret"),
        "the debug log names the event"
    );
    for (what, text) in [
        ("the endpoint's request", sent),
        ("a dead-letter record", records[0].to_string()),
        ("the /v1 and /metrics answers", answers),
        ("the log", logs),
    ] {
        check!(c, !text.contains(&key), "the secret is in {what}");
    }
    for (file, text) in files_outside_the_journal(dir.path()) {
        check!(c, !text.contains(&key), "the secret is in {file}");
    }
    check!(
        c,
        !records[0].to_string().contains("courier-endpoint-secret"),
        "the secret header is not even named: {}",
        records[0]
    );
    check_eq!(
        c,
        records[0]["headers"]["courier-endpoint"],
        url.as_str(),
        "{}",
        records[0]
    );
    // A replay goes back to the endpoint the record names, without the
    // secret the record does not hold.
    let replay = support::admin_post(
        &format!("{}/v1/dead-letters/replay", c.admin_url()),
        json!({"destination": "customers", "ids": ["evt-secret"]}).to_string(),
        &[("content-type", "application/json")],
    )
    .await;
    check_eq!(c, replay.json()["replayed_count"], 1, "{}", replay.text());
    let got = requests(&c, &rx, 2, WAIT).await;
    check_eq!(
        c,
        got[1].path_and_query,
        "/x",
        "the replay went to its endpoint"
    );
    check_eq!(c, got[1].webhook_id(), "evt-secret");
    check!(
        c,
        got[1].header("webhook-signature").is_none(),
        "no secret to sign with"
    );
}

/// A rolling deploy: courier A hands its pending events off to a bucket
/// (`moto_server`), courier B adopts them, and each still goes to its own
/// URL signed with its own secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_keeps_each_events_url_and_secret() {
    use support::stores::{Moto, s3_env};
    const N: usize = 20;
    let moto = Moto::start("courier").await;
    let open = Arc::new(AtomicBool::new(false));
    let rxs = receivers(N, || {
        let open = open.clone();
        behavior(move |_, _| {
            Reply::status(if open.load(Ordering::SeqCst) {
                200
            } else {
                503
            })
        })
    })
    .await;
    let yaml = yaml(&format!(
        "retry: {{ schedule: [200ms], max_attempts: 30 }}\n\
         status: {{ min_delay: {{ 503: 0s }} }}\n\
         probation: {{ after_failures: 0 }}\n{OPEN}"
    ))
    .replace(
        "journal: { dir: ./journal }\n",
        "journal: { dir: ./journal }\nshutdown_grace: 1s\nhandoff: { url: s3://courier/handoff, poll: 200ms, claim_timeout: 5s }\n",
    );
    let env = s3_env(&moto.endpoint());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let mut a = Courier::start_with_env(support::courier_bin(), dir_a.path(), &yaml, &env).await;
    for (i, rx) in rxs.iter().enumerate() {
        let url = format!("http://{}/h/{i}", rx.addr());
        publish(&a, &format!("evt-{i}"), &url, Some(&secret(i))).await;
    }
    for rx in &rxs {
        requests(&a, rx, 1, WAIT).await;
    }
    let b = Courier::start_with_env(support::courier_bin(), dir_b.path(), &yaml, &env).await;
    a.terminate_handing_off().await;
    let before: Vec<usize> = rxs.iter().map(Receiver::count).collect();
    open.store(true, Ordering::SeqCst);
    wait_metric(
        &b,
        r#"courier_handoff_events_total{direction="adopted"}"#,
        N as f64,
        WAIT,
    )
    .await;
    wait_metric(
        &b,
        r#"courier_events_pending{destination="customers"}"#,
        0.0,
        WAIT,
    )
    .await;
    let mut wires = Vec::with_capacity(N);
    for (i, rx) in rxs.iter().enumerate() {
        let got = rx.received();
        check!(b, got.len() > before[i], "endpoint {i} got nothing from B");
        let last = &got[got.len() - 1];
        check_eq!(
            b,
            last.webhook_id(),
            format!("evt-{i}"),
            "endpoint {i}'s own event"
        );
        check_eq!(b, last.path_and_query, format!("/h/{i}"), "its own URL");
        wires.push(wire(last, &[secret(i)]));
    }
    let results = verified(wires);
    check!(
        b,
        results.iter().all(|per| per == &[true]),
        "B signed each with its own secret: {results:?}"
    );
}

/// `customers` (`extra` under it) beside `ops`, a fixed destination that
/// gets the endpoints' notifications.
fn with_notify(extra: &str, ops: &Receiver) -> String {
    format!("{}  ops:\n    url: {}/notices\n", yaml(extra), ops.url())
}

/// Waits for the first notification of `kind` at `ops`. At least once:
/// one delivered just before a SIGKILL may come again, with its id.
async fn notice(c: &Courier, ops: &Receiver, kind: &str) -> Value {
    for _ in 0..(WAIT.as_millis() / 50) {
        let got = ops
            .received()
            .iter()
            .map(|r| r.json())
            .find(|n| n["type"] == kind);
        if let Some(n) = got {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fail!(
        c,
        "no {kind} notification; got {:?}",
        ops.received().iter().map(|r| r.text()).collect::<Vec<_>>()
    )
}

/// What `POST …/endpoints/{origin}/{action}` answered.
async fn set_endpoint(c: &Courier, origin: &str, action: &str) -> Value {
    let url = format!(
        "{}/v1/destinations/customers/endpoints/{}/{action}",
        c.admin_url(),
        origin.replace(':', "%3A").replace('/', "%2F")
    );
    let resp = support::admin_post(&url, "", &[]).await;
    check_eq!(c, resp.status, 200, "{action}: {}", resp.text());
    resp.json()
}

/// A 410 disables its endpoint alone: its pending events are dead-lettered
/// `EndpointDisabled`, new ones refused with 409, the app told through
/// `notify`; the disabling outlives a SIGKILL, and `enable` resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_answers_410_is_disabled_alone_and_the_app_is_told() {
    let gone = Receiver::start_on(
        SocketAddr::from((address(20), 0)),
        behavior(|_, n| {
            if n == 0 {
                Reply::status(410).delay(Duration::from_millis(400))
            } else {
                Reply::status(200)
            }
        }),
    )
    .await;
    let ok = Receiver::start_on(
        SocketAddr::from((address(21), 0)),
        behavior(|_, _| Reply::status(200)),
    )
    .await;
    let ops = Receiver::start(behavior(|_, _| Reply::status(200))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = with_notify(
        "concurrency: 4\nretry: { schedule: [50ms] }\nendpoints: { schemes: [http], allow_cidrs: [127.0.0.0/8], concurrency: 1, notify: ops }",
        &ops,
    );
    let mut c = Courier::start(dir.path(), &config).await;
    let (gone_url, ok_url) = (
        format!("http://{}/g", gone.addr()),
        format!("http://{}/o", ok.addr()),
    );
    let origin = format!("http://{}", gone.addr());
    // Five pending while the first attempt waits for its 410.
    for i in 0..5 {
        publish(&c, &format!("gone-{i}"), &gone_url, None).await;
    }
    for i in 0..4 {
        publish(&c, &format!("ok-{i}"), &ok_url, None).await;
    }
    requests(&c, &ok, 4, WAIT).await;
    let n = &notice(&c, &ops, "courier.endpoint.disabled").await;
    check_eq!(c, n["data"]["endpoint"], origin.as_str(), "{n}");
    check_eq!(c, n["data"]["destination"], "customers", "{n}");
    check_eq!(c, n["data"]["by"], "gone", "{n}");
    check_eq!(c, n["data"]["last_status"], 410, "{n}");
    let (_, records) = wait_dead_letters(&c, "customers", 5, WAIT).await;
    for r in &records {
        check_eq!(c, r["deadLetterReason"], "EndpointDisabled", "{r}");
    }
    check_eq!(c, gone.count(), 1, "nothing went after the 410");
    wait_metric(
        &c,
        r#"courier_endpoints{destination="customers",state="disabled"}"#,
        1.0,
        WAIT,
    )
    .await;
    wait_metric(
        &c,
        r#"courier_endpoint_disabled_total{destination="customers"}"#,
        1.0,
        WAIT,
    )
    .await;
    let (view, body) = destination_view(&c.admin_url(), "customers").await;
    check_eq!(
        c,
        view.map(|d| d["state"].clone()),
        Some(json!("healthy")),
        "the 410 is one endpoint's: {body}"
    );

    // Kept across a SIGKILL: new events for it are refused, nothing stored.
    c.kill();
    c.restart().await;
    let resp = post(
        &c.url("customers"),
        "{}",
        &[("courier-endpoint", gone_url.as_str())],
    )
    .await;
    check_eq!(c, resp.status, 409, "{}", resp.text());
    check_eq!(
        c,
        resp.json()["reason"],
        "endpoint_disabled",
        "{}",
        resp.text()
    );
    publish(&c, "ok-after", &ok_url, None).await;
    requests(&c, &ok, 5, WAIT).await;

    let answer = set_endpoint(&c, &origin, "enable").await;
    check_eq!(c, answer["changed"], true, "{answer}");
    let n = notice(&c, &ops, "courier.endpoint.recovered").await;
    check_eq!(c, n["data"]["endpoint"], origin.as_str(), "{n}");
    publish(&c, "gone-back", &gone_url, None).await;
    let got = requests(&c, &gone, 2, WAIT).await;
    check_eq!(c, got[1].json()["id"], "gone-back");
    let answer = set_endpoint(&c, &origin, "enable").await;
    check_eq!(c, answer["changed"], false, "enabled already: {answer}");
}

/// An endpoint failing with no success for `disable_after` is disabled;
/// the list shows each endpoint's state and pending events; an operator
/// disables and enables with the CLI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_past_disable_after_disables_and_the_list_and_cli_show_and_act() {
    let sick = Receiver::start_on(
        SocketAddr::from((address(40), 0)),
        behavior(|_, _| Reply::status(500)),
    )
    .await;
    let slow = Receiver::start_on(
        SocketAddr::from((address(41), 0)),
        behavior(|_, _| Reply::status(200).delay(Duration::from_secs(4))),
    )
    .await;
    let ops = Receiver::start(behavior(|_, _| Reply::status(200))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = with_notify(
        "concurrency: 8\nretry: { schedule: [100ms], max_attempts: 30 }\nstatus: { min_delay: { 500: 0s } }\nprobation: { after_failures: 1000 }\nendpoints: { schemes: [http], allow_cidrs: [127.0.0.0/8], concurrency: 1, disable_after: 1s, notify: ops }",
        &ops,
    );
    let c = Courier::start(dir.path(), &config).await;
    let (sick_url, slow_url) = (
        format!("http://{}/s", sick.addr()),
        format!("http://{}/w", slow.addr()),
    );
    let (sick_origin, slow_origin) = (
        format!("http://{}", sick.addr()),
        format!("http://{}", slow.addr()),
    );
    for i in 0..3 {
        publish(&c, &format!("sick-{i}"), &sick_url, None).await;
        publish(&c, &format!("slow-{i}"), &slow_url, None).await;
    }
    let n = notice(&c, &ops, "courier.endpoint.disabled").await;
    check_eq!(c, n["data"]["by"], "disable_after", "{n}");
    check_eq!(c, n["data"]["endpoint"], sick_origin.as_str());
    check!(c, n["data"]["failing_since"].is_string(), "{n}");
    let (_, records) = wait_dead_letters(&c, "customers", 3, WAIT).await;
    for r in &records {
        check_eq!(c, r["deadLetterReason"], "EndpointDisabled", "{r}");
        check_eq!(c, r["lastHttpStatusCode"], 500, "{r}");
    }

    // One slow attempt in flight, its three events pending (rows).
    let list = format!("{}/v1/destinations/customers/endpoints", c.admin_url());
    let mut page = Value::Null;
    for _ in 0..40 {
        page = get(&list).await.json();
        let slow_row = page["endpoints"].as_array().and_then(|a| {
            a.iter()
                .find(|e| e["origin"] == slow_origin.as_str())
                .cloned()
        });
        if slow_row.is_some_and(|e| e["pending"] == 3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let by_origin = |page: &Value, origin: &str| -> Value {
        page["endpoints"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["origin"] == origin).cloned())
            .unwrap_or(Value::Null)
    };
    let s = by_origin(&page, &slow_origin);
    check_eq!(c, s["state"], "healthy", "{page}");
    check_eq!(
        c,
        (s["pending"].clone(), s["in_flight"].clone()),
        (json!(3), json!(1)),
        "{page}"
    );
    check!(c, s["oldest_pending_age_s"].as_f64().is_some(), "{page}");
    let d = by_origin(&page, &sick_origin);
    check_eq!(c, d["state"], "disabled", "{page}");
    check_eq!(c, d["disabled_by"], "disable_after", "{page}");
    check_eq!(c, d["last_status"], 500, "{page}");
    check!(c, d["failing_since"].is_string(), "{page}");
    let only = get(&format!("{list}?state=disabled")).await.json();
    check_eq!(
        c,
        only["endpoints"].as_array().map(Vec::len),
        Some(1),
        "{only}"
    );
    let first = get(&format!("{list}?limit=1")).await.json();
    check_eq!(
        c,
        first["endpoints"][0]["origin"],
        sick_origin.as_str(),
        "{first}"
    );
    let next = first["next"].as_str().unwrap_or_default().to_string();
    let second = get(&format!("{list}?limit=1&after={next}")).await.json();
    check_eq!(
        c,
        second["endpoints"][0]["origin"],
        slow_origin.as_str(),
        "{second}"
    );
    check_eq!(c, second["next"], Value::Null, "{second}");

    // The CLI: disable the slow one, by any URL of it.
    let admin = c.admin_url();
    let cli = |args: Vec<String>| {
        let admin = admin.clone();
        async move {
            let mut all = vec!["endpoints".to_string(), "--admin".into(), admin];
            all.extend(args);
            let refs: Vec<&str> = all.iter().map(String::as_str).collect();
            support::run_cli(None, &refs, &[]).await
        }
    };
    let out = cli(vec![
        "disable".into(),
        "--destination".into(),
        "customers".into(),
        slow_url.clone(),
    ])
    .await;
    check!(c, out.success(), "{}", out.show());
    check!(c, out.stdout.contains("now disabled"), "{}", out.show());
    let resp = post(
        &c.url("customers"),
        "{}",
        &[("courier-endpoint", slow_url.as_str())],
    )
    .await;
    check_eq!(c, resp.status, 409, "{}", resp.text());
    let out = cli(vec![
        "list".into(),
        "--destination".into(),
        "customers".into(),
        "--state".into(),
        "disabled".into(),
    ])
    .await;
    check!(c, out.success(), "{}", out.show());
    for origin in [&sick_origin, &slow_origin] {
        check!(c, out.stdout.contains(origin.as_str()), "{}", out.show());
    }
    check!(
        c,
        out.stdout.contains("disabled (operator)"),
        "{}",
        out.show()
    );
    let out = cli(vec![
        "enable".into(),
        "--destination".into(),
        "customers".into(),
        sick_origin.clone(),
    ])
    .await;
    check!(c, out.stdout.contains("now healthy"), "{}", out.show());
    let resp = post(
        &c.url("customers"),
        "{}",
        &[("courier-endpoint", sick_url.as_str())],
    )
    .await;
    check_eq!(c, resp.status, 202, "enabled again: {}", resp.text());
}

/// Posts an event of about 1 KiB named `id` for the endpoint at `url`.
async fn post_kib(c: &Courier, url: &str, id: &str) -> support::Resp {
    let body = format!(r#"{{"id":"{id}","pad":"{}"}}"#, "x".repeat(1000));
    let headers = [("courier-endpoint", url), ("idempotency-key", id)];
    post(&c.url("customers"), body, &headers).await
}

/// An endpoint that holds its events fills its own share of the journal
/// and is answered `503 endpoint_full`, while another endpoint's events
/// are taken and delivered; bytes come back as events leave (from memory
/// and as rows), and a restart after SIGKILL counts the share again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_past_its_share_is_refused_alone_and_a_restart_counts_it_again() {
    let stuck = Receiver::start_on(
        SocketAddr::from((address(50), 0)),
        behavior(|_, _| Reply::hang()),
    )
    .await;
    // Its first answers fail: its events become rows and leave as rows.
    let flaky = Receiver::start_on(
        SocketAddr::from((address(51), 0)),
        behavior(|_, n| Reply::status(if n < 10 { 503 } else { 200 })),
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "ingress: {{ max_body_bytes: 2KiB }}\n{}",
        yaml(
            "concurrency: 8\ntimeout: 60s\nretry: { schedule: [200ms], max_attempts: 30 }\nstatus: { min_delay: { 503: 0s } }\nprobation: { after_failures: 1000 }\nmax_pending_bytes: 64KiB\nendpoints: { schemes: [http], allow_cidrs: [127.0.0.0/8], concurrency: 1, max_pending_bytes: 8KiB }"
        )
    );
    let mut c = Courier::start(dir.path(), &config).await;
    let (stuck_url, flaky_url) = (
        format!("http://{}/s", stuck.addr()),
        format!("http://{}/f", flaky.addr()),
    );
    let mut accepted = 0;
    let mut full = None;
    for i in 0..20 {
        let resp = post_kib(&c, &stuck_url, &format!("stuck-{i}")).await;
        if resp.status == 202 {
            accepted += 1;
            continue;
        }
        full = Some(resp);
        break;
    }
    let Some(full) = full else {
        fail!(
            c,
            "20 KiB for one endpoint with a share of 8 KiB: all accepted"
        );
    };
    check_eq!(c, full.status, 503, "{}", full.text());
    let body = full.json();
    check_eq!(c, body["reason"], "endpoint_full", "{body}");
    let origin = format!("http://{}", stuck.addr());
    check_eq!(c, body["endpoint"], origin.as_str(), "{body}");
    check_eq!(c, body["max_pending_bytes"], 8192, "{body}");
    check!(c, full.header("retry-after").is_some(), "{body}");
    check!(
        c,
        (5..=8).contains(&accepted),
        "{accepted} of ~1 KiB in 8 KiB"
    );
    // Another endpoint is not held by it: 20 KiB go through its own 8 KiB,
    // each taken after the one before it left the journal.
    for i in 0..20 {
        let id = format!("flaky-{i}");
        let mut taken = false;
        for _ in 0..200 {
            let resp = post_kib(&c, &flaky_url, &id).await;
            if resp.status == 202 {
                taken = true;
                break;
            }
            check_eq!(c, resp.json()["reason"], "endpoint_full", "{}", resp.text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        check!(c, taken, "{id} never fit in its endpoint's share");
    }
    requests(&c, &flaky, 30, WAIT).await;

    // The share is counted again from the journal after SIGKILL.
    c.kill();
    c.restart().await;
    let resp = post_kib(&c, &stuck_url, "stuck-after").await;
    check_eq!(
        c,
        resp.status,
        503,
        "the stuck endpoint's events are still pending: {}",
        resp.text()
    );
    // Its deliveries just before the kill may not have been synced: they
    // go again, and their bytes come back then.
    let mut resp = post_kib(&c, &flaky_url, "flaky-after").await;
    for _ in 0..100 {
        if resp.status == 202 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        resp = post_kib(&c, &flaky_url, "flaky-after").await;
    }
    check_eq!(c, resp.status, 202, "{}", resp.text());
}

/// An operator's disable sends an endpoint's waiting events to the sink
/// at once, even those held back for an hour by its Retry-After: the
/// dispatcher is woken to read them, not left to its next due time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_disable_dead_letters_events_held_for_an_hour_at_once() {
    let rx = Receiver::start_on(
        SocketAddr::from((address(70), 0)),
        behavior(|_, _| Reply::status(503).header("retry-after", "3600")),
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(
        dir.path(),
        &yaml("endpoints: { schemes: [http], allow_cidrs: [127.0.0.0/8], concurrency: 1 }"),
    )
    .await;
    let url = format!("http://{}/h", rx.addr());
    for i in 0..3 {
        publish(&c, &format!("held-{i}"), &url, None).await;
    }
    requests(&c, &rx, 1, WAIT).await;
    // The others are put back behind the hold, an hour away.
    quiet(&c, &rx, 1, Duration::from_millis(500)).await;
    let answer = set_endpoint(&c, &format!("http://{}", rx.addr()), "disable").await;
    check_eq!(c, answer["changed"], true, "{answer}");
    let (_, records) = wait_dead_letters(&c, "customers", 3, Duration::from_secs(10)).await;
    for r in &records {
        check_eq!(c, r["deadLetterReason"], "EndpointDisabled", "{r}");
    }
}

/// The endpoints' list pages through more endpoints with events than one
/// read of the index takes (500), merged with those held in memory: each
/// endpoint once, in origin order, whatever the page size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoints_list_pages_past_one_read_of_the_index() {
    const N: usize = 600;
    let (_socket, port) = support::refusing_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(
        dir.path(),
        &yaml("concurrency: 64\nretry: { schedule: [1h] }\nendpoints: { schemes: [http], allow_cidrs: [127.0.0.0/8] }"),
    )
    .await;
    for chunk in (0..N).collect::<Vec<_>>().chunks(50) {
        let posts = chunk.iter().map(|&i| {
            let (c, url) = (&c, format!("http://{}:{port}/p", address(100 + i)));
            async move { publish(c, &format!("p-{i}"), &url, None).await }
        });
        futures::future::join_all(posts).await;
    }
    let list = format!("{}/v1/destinations/customers/endpoints", c.admin_url());
    let mut whole = Value::Null;
    for _ in 0..200 {
        whole = get(&format!("{list}?limit=1000")).await.json();
        let rows = whole["endpoints"].as_array().map_or(0, |a| {
            a.iter()
                .filter(|e| e["pending"] == 1 && e["last_outcome"].is_string())
                .count()
        });
        if rows == N {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let origins = |page: &Value| -> Vec<String> {
        page["endpoints"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e["origin"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let all = origins(&whole);
    check_eq!(c, all.len(), N, "one page of 1,000: {}", whole["next"]);
    let mut sorted = all.clone();
    sorted.sort();
    sorted.dedup();
    check_eq!(c, sorted, all, "in origin order, each once");
    let mut paged = Vec::new();
    let mut after = String::new();
    for _ in 0..10 {
        let page = get(&format!("{list}?limit=250{after}")).await.json();
        paged.extend(origins(&page));
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    check_eq!(c, paged, all, "pages of 250 make the same list");
}

/// A slow endpoint's backlog is put back spaced as it can take it (one
/// every 300 ms here, its timeout); when it answers again, the whole
/// backlog is due at once, not at the pace it failed at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_recovers_gets_its_backlog_at_once() {
    const N: usize = 100;
    let rx = Receiver::start_on(
        SocketAddr::from((address(60), 0)),
        behavior(|_, n| {
            if n < 3 {
                Reply::hang()
            } else {
                Reply::status(200)
            }
        }),
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(
        dir.path(),
        &yaml(
            "timeout: 300ms\nlate_answer_window: 0s\nretry: { schedule: [100ms], max_attempts: 30 }\n\
             probation: { after_failures: 1000 }\n\
             endpoints: { schemes: [http], allow_cidrs: [127.0.0.0/8], concurrency: 1 }",
        ),
    )
    .await;
    let url = format!("http://{}/r", rx.addr());
    let start = std::time::Instant::now();
    for i in 0..N {
        publish(&c, &format!("r-{i}"), &url, None).await;
    }
    // Spaced at its failing pace, the backlog would take about 12 s
    // (measured with the recovery's due-at-once taken out); at once, 1–2 s.
    requests(&c, &rx, N + 3, Duration::from_secs(30)).await;
    check!(
        c,
        start.elapsed() < Duration::from_secs(6),
        "{:?} for {N} events",
        start.elapsed()
    );
}

/// A restart that turns a fixed url into `per_event` finds events that
/// name no endpoint: dead-lettered, not stuck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stored_for_a_fixed_url_are_dead_lettered_after_a_switch_to_per_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_socket, port) = support::refusing_port();
    let fixed = yaml(OPEN)
        .replace("url: per_event", &format!("url: http://127.0.0.1:{port}/x"))
        .replace(
            "    endpoints: { schemes: [http], allow_cidrs: [127.0.0.0/8] }\n",
            "    retry: { schedule: [100ms] }\n",
        );
    let mut c = Courier::start(dir.path(), &fixed).await;
    let resp = post(
        &c.url("customers"),
        r#"{"n":1}"#,
        &[("idempotency-key", "old-1")],
    )
    .await;
    check_eq!(c, resp.status, 202, "{}", resp.text());
    c.kill();
    std::fs::write(c.config_path(), yaml(OPEN)).expect("write the config");
    c.restart().await;
    let (_, records) = wait_dead_letters(&c, "customers", 1, WAIT).await;
    check_eq!(c, records[0]["id"], "old-1");
    check_eq!(
        c,
        records[0]["deadLetterReason"],
        "AddressNotAllowed",
        "{}",
        records[0]
    );
}

/// One fast endpoint with a backlog far beyond its share of the window:
/// what it cannot take at once goes back to the index spaced by its pace,
/// and the whole backlog still drains promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_endpoints_backlog_drains_though_it_is_put_back_in_turns() {
    const N: usize = 2000;
    let rx = Receiver::start_on(
        SocketAddr::from((address(30), 0)),
        behavior(|_, _| Reply::status(200)),
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &yaml(&format!("concurrency: 16\n{OPEN}"))).await;
    // Paused while the backlog is accepted, so that it is all waiting.
    let pause = support::admin_post(
        &format!("{}/v1/destinations/customers/pause", c.admin_url()),
        "",
        &[],
    )
    .await;
    check_eq!(c, pause.status, 200, "{}", pause.text());
    let url = format!("http://{}/b", rx.addr());
    for chunk in (0..N).collect::<Vec<_>>().chunks(50) {
        let posts = chunk.iter().map(|&i| {
            let (c, url) = (&c, &url);
            async move { publish(c, &format!("b-{i}"), url, None).await }
        });
        futures::future::join_all(posts).await;
    }
    let started = tokio::time::Instant::now();
    let resume = support::admin_post(
        &format!("{}/v1/destinations/customers/resume", c.admin_url()),
        "",
        &[],
    )
    .await;
    check_eq!(c, resume.status, 200, "{}", resume.text());
    requests(&c, &rx, N, WAIT).await;
    let took = started.elapsed();
    check!(
        c,
        took < Duration::from_secs(10),
        "{N} events to one fast endpoint took {took:?}"
    );
    eprintln!("{N} events to one fast endpoint drained in {took:?}");
}
