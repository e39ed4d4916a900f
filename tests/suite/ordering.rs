//! Ordering lanes (issue #34): events of one key are delivered in accept
//! order, across a SIGKILL and a reload; other keys and unkeyed events are
//! not held; a dead-lettered head releases its key.

use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support::{
    Courier, Received, Receiver, Reply, behavior, check, check_eq, config, fail, get, post,
};

const PROMPT: Duration = Duration::from_secs(20);

fn id_of(r: &Received) -> String {
    r.webhook_id()
}

fn attempt_of(r: &Received) -> u32 {
    r.attempt()
}

/// Ordered by the `Ordering-Key` header, quick retries, no probation.
fn ordered(url: &str, extra: &str) -> String {
    config(
        "orders",
        url,
        &format!(
            "ordering: {{ key: {{ header: Ordering-Key }} }}\n\
             retry: {{ schedule: [30ms], max_attempts: 20, jitter: 0 }}\n\
             status: {{ min_delay: {{ 5xx: 30ms }} }}\n\
             probation: {{ after_failures: 0 }}\n{extra}"
        ),
    )
}

async fn accept(c: &Courier, id: &str, key: Option<&str>) {
    let mut headers = vec![("Idempotency-Key", id)];
    if let Some(k) = key {
        headers.push(("Ordering-Key", k));
    }
    let resp = post(&c.url("orders"), json!({ "id": id }).to_string(), &headers).await;
    check_eq!(c, resp.status, 202, "POST {id}: {}", resp.text());
}

/// Polls the receiver until every id in `ids` got a 2xx (bounded).
async fn until_delivered(
    c: &Courier,
    rx: &Receiver,
    ids: &[String],
    ok: impl Fn(&Received) -> bool,
) {
    for _ in 0..(PROMPT.as_millis() / 50) {
        let got = rx.received();
        if ids
            .iter()
            .all(|id| got.iter().any(|r| id_of(r) == *id && ok(r)))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got = rx.received();
    let missing: Vec<_> = ids
        .iter()
        .filter(|id| !got.iter().any(|r| id_of(r) == **id && ok(r)))
        .collect();
    fail!(c, "never delivered: {missing:?}")
}

/// For each key's events in accept order: no first attempt of an event
/// before the first successful attempt of the one before it was answered.
fn check_in_order(
    c: &Courier,
    got: &[Received],
    keys: &HashMap<String, Vec<String>>,
    ok: impl Fn(&Received) -> bool,
) {
    let first_at = |id: &str| got.iter().filter(|r| id_of(r) == id).map(|r| r.at).min();
    let success_answered = |id: &str| {
        got.iter()
            .filter(|r| id_of(r) == id && ok(r))
            .filter_map(|r| r.answer_began)
            .min()
    };
    for (key, ids) in keys {
        for pair in ids.windows(2) {
            let (before, after) = (&pair[0], &pair[1]);
            let (Some(done), Some(started)) = (success_answered(before), first_at(after)) else {
                fail!(
                    c,
                    "key {key}: {before} or {after} never arrived as expected"
                );
            };
            // `answer_began` is taken before the answer's write: courier
            // cannot have the answer sooner, so a next request that arrived
            // before it was sent while the one before was on the wire.
            check!(
                c,
                started >= done,
                "key {key}: {after} was first sent {:?} before {before} was delivered",
                done - started
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_goes_in_accept_order_across_a_kill_and_a_reload() {
    // Every event fails its first attempt: each head is retried while the
    // events of its key wait.
    let rx = Receiver::start(behavior(|r, _| {
        Reply::status(if attempt_of(r) <= 1 { 500 } else { 200 })
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut c = Courier::start(tmp.path(), &ordered(&rx.url(), "timeout: 5s")).await;
    let mut keys: HashMap<String, Vec<String>> = HashMap::new();
    let mut ids = Vec::new();
    for i in 0..60 {
        let (key, id) = (format!("k{}", i % 4), format!("e{i:03}"));
        if i == 20 {
            // SIGKILL with events of every key pending, some mid-retry.
            c.kill();
            c.restart().await;
        }
        if i == 40 {
            let yaml = ordered(&rx.url(), "timeout: 6s");
            std::fs::write(c.config_path(), yaml).expect("rewrite config");
            c.signal(libc::SIGHUP);
            check!(
                c,
                c.logged(|l| l.contains("config reloaded"), PROMPT).await,
                "reloaded"
            );
        }
        accept(&c, &id, Some(&key)).await;
        keys.entry(key).or_default().push(id.clone());
        ids.push(id);
    }
    let ok = |r: &Received| attempt_of(r) > 1;
    until_delivered(&c, &rx, &ids, ok).await;
    check_in_order(&c, &rx.received(), &keys, ok);
    let lanes = destination(&c).await["ordering"].clone();
    check_eq!(c, lanes["blocked"], 0, "{lanes}");
}

async fn destination(c: &Courier) -> Value {
    let resp = get(&format!("{}/v1/destinations", c.admin_url())).await;
    resp.json()["destinations"][0].clone()
}

/// The (id, attempt) pairs a receiver answered 2xx.
type Delivered = Arc<std::sync::Mutex<std::collections::HashSet<(String, u32)>>>;

fn delivered(set: &Delivered) -> impl Fn(&Received) -> bool + '_ {
    move |r| {
        set.lock()
            .map(|s| s.contains(&(id_of(r), attempt_of(r))))
            .unwrap_or(false)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_head_holds_only_its_key_and_unkeyed_events_flow() {
    let open = Arc::new(AtomicBool::new(false));
    let oks: Delivered = Arc::default();
    let (gate, seen) = (open.clone(), oks.clone());
    let rx = Receiver::start(behavior(move |r, _| {
        let stuck = r.header("ordering-key") == Some("stuck");
        if stuck && !gate.load(Ordering::SeqCst) {
            return Reply::status(500);
        }
        if let Ok(mut s) = seen.lock() {
            s.insert((id_of(r), attempt_of(r)));
        }
        Reply::status(200)
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &ordered(&rx.url(), "")).await;
    let stuck: Vec<String> = (0..3).map(|i| format!("stuck-{i}")).collect();
    for id in &stuck {
        accept(&c, id, Some("stuck")).await;
    }
    let mut flowing = Vec::new();
    for i in 0..10 {
        let id = format!("free-{i}");
        accept(&c, &id, Some("free")).await;
        flowing.push(id);
        let id = format!("none-{i}");
        accept(&c, &id, None).await;
        flowing.push(id);
    }
    until_delivered(&c, &rx, &flowing, delivered(&oks)).await;
    // Meanwhile the stuck key's head is retried, and nothing behind it sent.
    let tries = |got: &[Received]| got.iter().filter(|r| id_of(r) == "stuck-0").count();
    for _ in 0..(PROMPT.as_millis() / 20) {
        if tries(&rx.received()) >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let got = rx.received();
    check!(c, tries(&got) >= 4, "the head was retried: {}", tries(&got));
    check!(
        c,
        !got.iter()
            .any(|r| id_of(r) == "stuck-1" || id_of(r) == "stuck-2"),
        "nothing behind a failing head is sent"
    );
    let lanes = destination(&c).await["ordering"].clone();
    check_eq!(c, lanes["blocked"], 1, "{lanes}");
    check!(
        c,
        lanes["oldest_blocked_age_s"]
            .as_f64()
            .is_some_and(|s| s >= 0.0),
        "{lanes}"
    );
    let blocked = support::metric(
        &c.admin_url(),
        r#"courier_ordering_lanes_blocked{destination="orders"}"#,
    )
    .await;
    check_eq!(c, blocked, Some(1.0));
    let behind = get(&format!("{}/v1/events/stuck-2", c.admin_url()))
        .await
        .json();
    check_eq!(
        c,
        behind["deliveries"][0]["held_by"],
        "ordering",
        "{behind}"
    );

    // The endpoint recovers: the stuck key goes, in order.
    open.store(true, Ordering::SeqCst);
    until_delivered(&c, &rx, &stuck, delivered(&oks)).await;
    let keys = HashMap::from([("stuck".to_string(), stuck.clone())]);
    check_in_order(&c, &rx.received(), &keys, delivered(&oks));
    let lanes = destination(&c).await["ordering"].clone();
    check_eq!(c, lanes["blocked"], 0, "{lanes}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_head_releases_its_key() {
    // Event Grid events ordered by subject; the first of subject a fails
    // every attempt: dead-lettered after its third, it lets the next go.
    let rx = Receiver::start(behavior(|r, _| {
        Reply::status(if id_of(r) == "a-0" { 500 } else { 200 })
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = config(
        "orders",
        &rx.url(),
        "schema: eventgrid\n\
         ordering: { key: { from_event: subject } }\n\
         retry: { schedule: [30ms], max_attempts: 3, jitter: 0 }\n\
         status: { min_delay: { 5xx: 30ms } }\n\
         probation: { after_failures: 0 }",
    );
    let c = Courier::start(tmp.path(), &yaml).await;
    let mut keys: HashMap<String, Vec<String>> = HashMap::new();
    let mut ids = Vec::new();
    for i in 0..6 {
        let subject = if i % 2 == 0 { "a" } else { "b" };
        let id = format!("{subject}-{i}");
        let event = json!([{
            "id": id, "subject": subject, "eventType": "t",
            "eventTime": "2026-11-27T09:00:00Z", "data": {"n": i}, "dataVersion": "1"
        }]);
        let resp = post(&c.url("orders"), event.to_string(), &[]).await;
        check!(
            c,
            resp.status / 100 == 2,
            "POST {id}: {} {}",
            resp.status,
            resp.text()
        );
        keys.entry(subject.to_string())
            .or_default()
            .push(id.clone());
        ids.push(id);
    }
    let ok = |r: &Received| id_of(r) != "a-0";
    until_delivered(&c, &rx, &ids[1..], ok).await;
    let got = rx.received();
    // a-0's end is the answer to its last attempt.
    let refused = got
        .iter()
        .filter(|r| id_of(r) == "a-0")
        .filter_map(|r| r.answer_began)
        .max();
    let next = got.iter().filter(|r| id_of(r) == "a-2").map(|r| r.at).min();
    check!(
        c,
        refused.is_some() && next >= refused,
        "a-2 waited for a-0's end"
    );
    check_eq!(
        c,
        got.iter().filter(|r| id_of(r) == "a-0").count(),
        3,
        "every attempt"
    );
    let mut later = keys.clone();
    if let Some(a) = later.get_mut("a") {
        a.remove(0);
    }
    check_in_order(&c, &got, &later, ok);
    let dead = support::metric(
        &c.admin_url(),
        r#"courier_events_dead_lettered_total{destination="orders",reason="MaxDeliveryAttemptsExceeded"}"#,
    )
    .await;
    check_eq!(c, dead, Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_never_puts_an_event_before_an_earlier_one_of_its_key() {
    // Every batch fails once: its events hold their keys while retried.
    let rx = Receiver::start(behavior(|r, _| {
        Reply::status(if attempt_of(r) <= 1 { 500 } else { 200 })
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &ordered(&rx.url(), "batch: { max_events: 10 }")).await;
    // A backlog first, so that batches have several keys to take from.
    let pause = format!("{}/v1/destinations/orders/pause", c.admin_url());
    check_eq!(c, support::admin_post(&pause, "", &[]).await.status, 200);
    let mut keys: HashMap<String, Vec<u64>> = HashMap::new();
    for n in 0..24u64 {
        let key = format!("k{}", n % 3);
        let body = json!({ "key": key, "n": n }).to_string();
        let resp = post(&c.url("orders"), body, &[("Ordering-Key", key.as_str())]).await;
        check_eq!(c, resp.status, 202, "{}", resp.text());
        keys.entry(key).or_default().push(n);
    }
    let resume = format!("{}/v1/destinations/orders/resume", c.admin_url());
    check_eq!(c, support::admin_post(&resume, "", &[]).await.status, 200);
    let numbers = |r: &Received| -> Vec<(String, u64)> {
        match r.json() {
            Value::Array(events) => events
                .iter()
                .map(|e| {
                    (
                        e["key"].as_str().unwrap_or("").to_string(),
                        e["n"].as_u64().unwrap_or(u64::MAX),
                    )
                })
                .collect(),
            _ => Vec::new(),
        }
    };
    let mut done = false;
    for _ in 0..(PROMPT.as_millis() / 50) {
        let ok: usize = rx
            .received()
            .iter()
            .filter(|r| attempt_of(r) > 1)
            .map(|r| numbers(r).len())
            .sum();
        if ok >= 24 {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check!(
        c,
        done,
        "every event delivered: {:?}",
        rx.received().iter().map(numbers).collect::<Vec<_>>()
    );
    let got = rx.received();
    for r in &got {
        let events = numbers(r);
        let mut seen: Vec<&String> = events.iter().map(|(k, _)| k).collect();
        seen.sort();
        seen.dedup();
        check_eq!(
            c,
            seen.len(),
            events.len(),
            "one event of a key per batch: {events:?}"
        );
    }
    // Per key: n's first request came after n-1's successful one was answered.
    for (key, ns) in &keys {
        for pair in ns.windows(2) {
            let has = |r: &Received, n: u64| numbers(r).iter().any(|(k, m)| k == key && *m == n);
            let done = got
                .iter()
                .filter(|r| attempt_of(r) > 1 && has(r, pair[0]))
                .filter_map(|r| r.answer_began)
                .min();
            let started = got.iter().filter(|r| has(r, pair[1])).map(|r| r.at).min();
            check!(
                c,
                done.is_some() && started >= done,
                "key {key}: {} went before {} was delivered",
                pair[1],
                pair[0]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_posted_at_once_each_go_in_order_to_a_fast_endpoint() {
    let _alone = support::alone().await;
    // Each answer takes a little while: the next event of a key comes in
    // while its head is on the wire, and waits for its turn in memory.
    let rx = Receiver::start(behavior(|_, _| {
        Reply::status(200).delay(Duration::from_millis(2))
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Arc::new(Courier::start(tmp.path(), &ordered(&rx.url(), "concurrency: 16")).await);
    const KEYS: usize = 8;
    const EACH: usize = 100;
    let mut posters = tokio::task::JoinSet::new();
    for k in 0..KEYS {
        let c = c.clone();
        // One key's events one after another (each after the last's 202),
        // the keys side by side.
        posters.spawn(async move {
            for n in 0..EACH {
                accept(&c, &format!("k{k}-{n:03}"), Some(&format!("k{k}"))).await;
            }
        });
    }
    while let Some(done) = posters.join_next().await {
        check!(c, done.is_ok(), "a poster failed: {done:?}");
    }
    let keys: HashMap<String, Vec<String>> = (0..KEYS)
        .map(|k| {
            (
                format!("k{k}"),
                (0..EACH).map(|n| format!("k{k}-{n:03}")).collect(),
            )
        })
        .collect();
    let ids: Vec<String> = keys.values().flatten().cloned().collect();
    until_delivered(&c, &rx, &ids, |_| true).await;
    check_in_order(&c, &rx.received(), &keys, |_| true);
}
