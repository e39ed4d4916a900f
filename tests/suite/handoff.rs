//! Hand-off across a rolling deploy (issue #32, items 2 to 4; docs/object-storage.md), on
//! a real S3 (`moto_server` on loopback): courier A gets SIGTERM with
//! events pending, writes them to the bucket, and couriers with the same
//! `handoff.url` adopt them and deliver them, attempt numbers going on
//! from A's. Crashes (SIGKILL) while handing off or adopting lose nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::stores::{Gate, Moto, s3_env};
use support::{Courier, Receiver, Reply, behavior, check, check_eq, courier_bin, fail, post};

pub(crate) const BUCKET: &str = "courier";
pub(crate) const PROMPT: Duration = Duration::from_secs(60);

/// Per event id: the attempts refused (503 while failing) and delivered.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) refused: HashMap<String, Vec<u32>>,
    pub(crate) delivered: HashMap<String, Vec<u32>>,
}

/// A receiver that refuses (500) until `accept` is set, then delivers,
/// noting each attempt's number per event.
pub(crate) async fn endpoint() -> (Receiver, Arc<AtomicBool>, Arc<Mutex<Seen>>) {
    let accept = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (open, book) = (accept.clone(), seen.clone());
    let rx = Receiver::start(behavior(move |req, _| {
        let id = req.header("webhook-id").unwrap_or_default().to_string();
        let attempt = req
            .header("courier-delivery-attempt")
            .and_then(|a| a.parse().ok())
            .unwrap_or(0);
        let ok = open.load(Ordering::SeqCst);
        let mut seen = book.lock().expect("seen");
        let list = if ok {
            &mut seen.delivered
        } else {
            &mut seen.refused
        };
        list.entry(id).or_default().push(attempt);
        Reply::status(if ok { 200 } else { 500 })
    }))
    .await;
    (rx, accept, seen)
}

pub(crate) fn config(rx: &Receiver, grace: &str, claim_timeout: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\n\
         admin_listen: 127.0.0.1:0\n\
         log: {{ level: debug }}\n\
         shutdown_grace: {grace}\n\
         journal: {{ dir: ./journal }}\n\
         handoff: {{ url: s3://{BUCKET}/handoff, poll: 200ms, claim_timeout: {claim_timeout} }}\n\
         destinations:\n  \
           orders:\n    \
             url: {}\n    \
             retry: {{ schedule: [1s] }}\n    \
             status: {{ min_delay: {{ 500: 1s }} }}\n    \
             probation: {{ after_failures: 0 }}\n",
        rx.url()
    )
}

pub(crate) async fn start(dir: &std::path::Path, yaml: &str, endpoint: &str) -> Courier {
    start_env(dir, yaml, endpoint, &[]).await
}

/// `start`, with variables of its own (a hand-off key) besides the store's.
pub(crate) async fn start_env(
    dir: &std::path::Path,
    yaml: &str,
    endpoint: &str,
    extra: &[(&str, &str)],
) -> Courier {
    let mut env = s3_env(endpoint);
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Courier::start_with_env(courier_bin(), dir, yaml, &env).await
}

/// The variable a sealed hand-off's key is read from, in `sealed` configs.
pub(crate) const KEY_ENV: &str = "COURIER_HANDOFF_KEY";

/// `yaml` with hand-off objects sealed by the key in `KEY_ENV`.
pub(crate) fn sealed(yaml: &str) -> String {
    let at = yaml.find("claim_timeout:").expect("a handoff block");
    let end = at + yaml[at..].find(" }").expect("its end");
    format!(
        "{}, encryption_key_env: {KEY_ENV}{}",
        &yaml[..end],
        &yaml[end..]
    )
}

pub(crate) async fn post_events(c: &Courier, n: usize, body: &str) {
    for i in 0..n {
        let id = format!("e{i:05}");
        let r = post(
            &c.url("orders"),
            body.to_string(),
            &[("Idempotency-Key", &id)],
        )
        .await;
        check_eq!(c, r.status, 202, "{id}: {}", r.text());
    }
}

/// Waits until every one of `n` events was refused at least once.
pub(crate) async fn all_refused(c: &Courier, seen: &Mutex<Seen>, n: usize) {
    let deadline = tokio::time::Instant::now() + PROMPT;
    // Bounded by the deadline.
    while seen.lock().expect("seen").refused.len() < n {
        if tokio::time::Instant::now() >= deadline {
            fail!(c, "not every event was attempted");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every one of `n` events was delivered.
pub(crate) async fn all_delivered(couriers: &[&Courier], seen: &Mutex<Seen>, n: usize) {
    let deadline = tokio::time::Instant::now() + PROMPT;
    // Bounded by the deadline.
    loop {
        let got = seen.lock().expect("seen").delivered.len();
        if got >= n {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            for c in couriers {
                eprintln!("---- courier logs ----\n{}", c.logs());
            }
            panic!("{got} of {n} events delivered");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Events delivered more than once.
pub(crate) fn twice(seen: &Mutex<Seen>) -> usize {
    let seen = seen.lock().expect("seen");
    seen.delivered.values().filter(|a| a.len() > 1).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_hands_off_every_pending_event_and_attempts_go_on() {
    const EVENTS: usize = 1000;
    let moto = Moto::start(BUCKET).await;
    let (rx, accept, seen) = endpoint().await;
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let yaml = config(&rx, "1s", "5s");
    let mut a = start(dir_a.path(), &yaml, &moto.endpoint()).await;
    post_events(&a, EVENTS, r#"{"order":1}"#).await;
    all_refused(&a, &seen, EVENTS).await;
    // The new pod of a rolling deploy starts before the old one stops.
    let b = start(dir_b.path(), &yaml, &moto.endpoint()).await;
    a.terminate_handing_off().await;
    // What A tried, frozen: A is gone, B has not sent yet (it refuses still).
    let before: HashMap<String, u32> = seen
        .lock()
        .expect("seen")
        .refused
        .iter()
        .map(|(id, a)| (id.clone(), a.iter().copied().max().unwrap_or(0)))
        .collect();
    accept.store(true, Ordering::SeqCst);
    all_delivered(&[&b], &seen, EVENTS).await;
    let wrong = {
        let seen_now = seen.lock().expect("seen");
        let mut wrong = Vec::new();
        for (id, attempts) in &seen_now.delivered {
            let last_refused = seen_now
                .refused
                .get(id)
                .and_then(|a| a.iter().max())
                .copied();
            // B's own refused attempts (before the flip) count too.
            let expected = last_refused.unwrap_or(0) + 1;
            if attempts.first() != Some(&expected) || !before.contains_key(id) {
                wrong.push((id.clone(), attempts.clone(), last_refused));
            }
        }
        wrong
    };
    check!(
        b,
        wrong.is_empty(),
        "attempt numbers that do not go on from A's: {:?}",
        &wrong[..wrong.len().min(5)]
    );
    check_eq!(b, twice(&seen), 0, "events delivered twice");
    check!(
        b,
        b.logs().contains("adopted a hand-off"),
        "B says what it adopted"
    );
    // B's history has the adopted event from its first accept, with A's
    // attempts counted (docs/history.md).
    let (id, prior) = before
        .iter()
        .min_by_key(|(id, _)| id.as_str())
        .map(|(id, n)| (id.clone(), *n))
        .unwrap_or_default();
    let url = format!("{}/v1/events/{id}", b.admin_url());
    let mut shown = serde_json::Value::Null;
    // Bounded: 5 s in 50 ms polls, for the last outcome's record.
    for _ in 0..100 {
        shown = support::get(&url).await.json();
        if shown["deliveries"][0]["state"] == "delivered" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let d = &shown["deliveries"][0];
    check_eq!(b, d["state"], "delivered", "{shown}");
    check_eq!(b, d["attempts_before"], prior, "A's attempts: {shown}");
    let last = d["attempts"].as_array().and_then(|a| a.last()).cloned();
    check_eq!(
        b,
        last.map(|a| a["status"].clone()),
        Some(serde_json::json!(200)),
        "{shown}"
    );
    let adopted = support::metric(
        &b.admin_url(),
        r#"courier_handoff_events_total{direction="adopted"}"#,
    )
    .await;
    check_eq!(b, adopted, Some(EVENTS as f64));
    let left = support::stores::objects_at(&moto.endpoint(), BUCKET, "handoff/pending/");
    check!(
        b,
        left.is_empty(),
        "adopted objects are deleted: {} left",
        left.len()
    );
}

/// Posts `n` events of about `size` bytes, 16 at a time.
pub(crate) async fn post_many(c: &Courier, n: usize, size: usize) {
    let url = c.url("orders");
    let body = format!(r#"{{"pad":"{}"}}"#, "x".repeat(size));
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..16 {
        let (url, body) = (url.clone(), body.clone());
        tasks.spawn(async move {
            let mut i = w;
            while i < n {
                let id = format!("e{i:05}");
                let r = post(&url, body.clone(), &[("Idempotency-Key", &id)]).await;
                assert_eq!(r.status, 202, "{id}: {}", r.text());
                i += 16;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = r {
            fail!(c, "a poster failed: {e}");
        }
    }
}

/// A backlog of several hand-off objects (about 1 MiB each).
const MANY: usize = 12_000;
const PAD: usize = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_couriers_racing_to_adopt_deliver_each_event_once() {
    let moto = Moto::start(BUCKET).await;
    let (rx, accept, seen) = endpoint().await;
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().expect("dir")).collect();
    // A's hand-off gets as long again as its grace: 5 s, so that two
    // adopters reading the store at once do not cut it off on a busy
    // machine (at 1 s, 2 of 14 objects missed the deadline once).
    let yaml = config(&rx, "5s", "30s");
    let mut a = start(dirs[0].path(), &yaml, &moto.endpoint()).await;
    post_many(&a, MANY, PAD).await;
    let b1 = start(dirs[1].path(), &yaml, &moto.endpoint()).await;
    let b2 = start(dirs[2].path(), &yaml, &moto.endpoint()).await;
    accept.store(true, Ordering::SeqCst);
    a.terminate();
    let status = a.wait_exit(Duration::from_secs(30)).await;
    check!(a, status.success(), "{status:?}");
    all_delivered(&[&a, &b1, &b2], &seen, MANY).await;
    check_eq!(b1, twice(&seen), 0, "events delivered twice");
    let adopted = |c: &Courier| {
        let url = c.admin_url();
        async move {
            support::metric(&url, r#"courier_handoff_events_total{direction="adopted"}"#)
                .await
                .unwrap_or(0.0)
        }
    };
    let (n1, n2) = (adopted(&b1).await, adopted(&b2).await);
    let delivered_by_a = a.logs().matches("handed off every pending event").count();
    check_eq!(b1, delivered_by_a, 1, "A handed off its backlog");
    check!(
        b1,
        n1 + n2 <= MANY as f64,
        "no object was adopted twice: {n1} + {n2}"
    );
}

/// Kills `c` once `line` is logged (at most `PROMPT` later).
async fn kill_at(c: &mut Courier, line: &str) {
    c.wait_for_log(line, PROMPT).await;
    c.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_courier_killed_while_handing_off_or_adopting_loses_nothing() {
    killed_while_handing_off_or_adopting(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_courier_killed_while_handing_off_or_adopting_sealed_objects_loses_nothing() {
    killed_while_handing_off_or_adopting(Some(KEY)).await;
}

/// A key for sealed hand-offs: 32 bytes of base64.
pub(crate) const KEY: &str = "q83vEjRWeJC6u8zd7v8AESIzRFVmd4iZqrvM3e7/ABE=";

async fn killed_while_handing_off_or_adopting(key: Option<&str>) {
    let moto = Moto::start(BUCKET).await;
    // A slow store (2 MiB/s a connection: half a second an object), so that
    // each SIGKILL lands in the middle of the work.
    let slow = Gate::slow(moto.addr(), 2 << 20).await;
    let (rx, accept, seen) = endpoint().await;
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let yaml = config(&rx, "5s", "2s");
    let (yaml, env) = match key {
        Some(k) => (sealed(&yaml), vec![(KEY_ENV, k)]),
        None => (yaml, Vec::new()),
    };
    let mut a = start_env(dir_a.path(), &yaml, &slow.endpoint(), &env).await;
    post_many(&a, MANY, PAD).await;
    // SIGKILL in the middle of the hand-off: some objects stored, the rest
    // of the events still in A's journal (and maybe in both).
    a.terminate();
    kill_at(&mut a, "hand-off object written").await;
    check!(
        a,
        !a.logs().contains("handed off every pending event"),
        "the kill came after the hand-off ended: the test tested nothing"
    );
    if key.is_some() {
        let stored = support::stores::objects_at(&moto.endpoint(), BUCKET, "handoff/pending/");
        check!(a, !stored.is_empty(), "A stored objects");
        check!(
            a,
            stored
                .iter()
                .all(|(_, text)| text.starts_with("CHE1") && !text.contains("\"pad\":\"xxxxxxxx")),
            "every object is sealed: no body shows"
        );
    }
    // B adopts what A stored; SIGKILL in the middle of its adoption, while
    // it holds its next object's claim.
    let mut b = start_env(dir_b.path(), &yaml, &slow.endpoint(), &env).await;
    kill_at(&mut b, "adopted a hand-off").await;
    // Whether B died holding a claim (it claims the next object before it
    // reads it, slowly), which then has to be taken over: only a claim on
    // an object still pending (`claims/<object>/<generation>`). One whose
    // object B had already adopted and deleted, dying before the claim
    // went, leaves nothing to take over.
    let pending: Vec<String> =
        support::stores::objects_at(&moto.endpoint(), BUCKET, "handoff/pending/")
            .into_iter()
            .filter_map(|(k, _)| k.strip_prefix("handoff/pending/").map(str::to_string))
            .collect();
    let held = support::stores::objects_at(&moto.endpoint(), BUCKET, "handoff/claims/")
        .into_iter()
        .filter(|(k, _)| !k.ends_with(".probe"))
        .filter(|(k, _)| {
            k.strip_prefix("handoff/claims/")
                .and_then(|rest| rest.split('/').next())
                .is_some_and(|object| pending.iter().any(|p| p == object))
        })
        .count();
    eprintln!("claims held by B when it was killed: {held}");
    accept.store(true, Ordering::SeqCst);
    // Both start again on their journals: A delivers what it kept, B what
    // it adopted, and B's stale claim is taken over after claim_timeout.
    a.restart().await;
    b.restart().await;
    all_delivered(&[&a, &b], &seen, MANY).await;
    let dup = twice(&seen);
    eprintln!("events delivered twice after the crashes: {dup} of {MANY}");
    // The object B held when it died is taken over once its claim is
    // claim_timeout old, and adopted (its events delivered again).
    let deadline = tokio::time::Instant::now() + PROMPT;
    // Bounded by the deadline.
    loop {
        let left = support::stores::objects_at(&moto.endpoint(), BUCKET, "handoff/pending/");
        if left.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            fail!(b, "objects never adopted: {}", left.len());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if held > 0 {
        let took_over = a.logs().contains("taking it over") || b.logs().contains("taking it over");
        check!(b, took_over, "the claim B died holding was taken over");
    }
}

/// SIGTERM while the store cannot take the hand-off: courier exits within
/// its bound, keeps the events, and delivers them after a restart.
async fn kept_when_the_store_refuses(
    endpoint: &str,
    env_extra: &[(&str, &str)],
    close: Option<&Gate>,
) {
    const EVENTS: usize = 200;
    let (rx, accept, seen) = self::endpoint().await;
    let dir = tempfile::tempdir().expect("dir");
    let yaml = config(&rx, "1s", "5s");
    let mut env = s3_env(endpoint);
    env.extend(env_extra.iter().map(|(k, v)| (*k, v.to_string())));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut a = Courier::start_with_env(courier_bin(), dir.path(), &yaml, &env).await;
    post_events(&a, EVENTS, r#"{"order":2}"#).await;
    if let Some(g) = close {
        g.close();
    }
    let asked = tokio::time::Instant::now();
    a.terminate();
    let status = a.wait_exit(Duration::from_secs(30)).await;
    let took = asked.elapsed();
    check!(a, status.success(), "{status:?}");
    // 1s of grace for attempts in flight, as long again for the hand-off.
    check!(a, took < Duration::from_secs(6), "exit took {took:?}");
    check!(
        a,
        a.logs().contains("pending events stay in the journal")
            || a.logs().contains("hand-off incomplete"),
        "A says the events stay"
    );
    if let Some(g) = close {
        g.open();
    }
    accept.store(true, Ordering::SeqCst);
    a.restart().await;
    all_delivered(&[&a], &seen, EVENTS).await;
    check_eq!(a, twice(&seen), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_at_shutdown_leaves_the_events_in_the_journal() {
    let moto = Moto::start(BUCKET).await;
    let gate = Gate::start(moto.addr()).await;
    kept_when_the_store_refuses(&gate.endpoint(), &[], Some(&gate)).await;
    let left = support::stores::objects_at(&moto.endpoint(), BUCKET, "handoff/pending/");
    assert!(left.is_empty(), "nothing was handed off: {}", left.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_conditional_creates_gets_no_hand_off() {
    let moto = Moto::start(BUCKET).await;
    // object_store's switch for S3 stores without `If-None-Match`: its
    // conditional create then refuses, as such a store's would.
    kept_when_the_store_refuses(
        &moto.endpoint(),
        &[("AWS_CONDITIONAL_PUT", "disabled")],
        None,
    )
    .await;
    let left = support::stores::objects_at(&moto.endpoint(), BUCKET, "handoff/pending/");
    assert!(left.is_empty(), "nothing was handed off: {}", left.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_hand_off_is_set_aside_and_the_good_ones_adopted() {
    let moto = Moto::start(BUCKET).await;
    let (rx, accept, seen) = endpoint().await;
    accept.store(true, Ordering::SeqCst);
    // A good hand-off from A, and a damaged object beside it.
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let (_socket, port) = support::refusing_port();
    let down = format!("http://127.0.0.1:{port}/x");
    let yaml_a = config(&rx, "1s", "5s").replace(&rx.url(), &down);
    let mut a = start(dir_a.path(), &yaml_a, &moto.endpoint()).await;
    post_events(&a, 20, r#"{"order":3}"#).await;
    a.terminate();
    check!(
        a,
        a.wait_exit(Duration::from_secs(30)).await.success(),
        "A exits 0"
    );
    support::stores::put_object(
        &moto.endpoint(),
        BUCKET,
        "handoff/pending/00000000000000000000000000000000-3.cho",
        b"CHO1 not a hand-off at all",
    );
    let b = start(dir_b.path(), &config(&rx, "1s", "5s"), &moto.endpoint()).await;
    all_delivered(&[&b], &seen, 20).await;
    b.wait_for_log("moved aside for an operator", PROMPT).await;
    let pending = support::stores::objects_at(&moto.endpoint(), BUCKET, "handoff/pending/");
    check!(
        b,
        pending.is_empty(),
        "{} objects left in pending/",
        pending.len()
    );
    let damaged = support::stores::objects_at(&moto.endpoint(), BUCKET, "handoff/damaged/");
    check_eq!(
        b,
        damaged.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["handoff/damaged/00000000000000000000000000000000-3.cho"],
        "set aside whole, for an operator"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_keys_keep_their_order_through_a_hand_off() {
    const KEYS: usize = 3;
    const EVENTS: usize = 30;
    let moto = Moto::start(BUCKET).await;
    let (rx, accept, seen) = endpoint().await;
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let yaml = config(&rx, "1s", "5s").replace(
        "    probation: { after_failures: 0 }\n",
        "    probation: { after_failures: 0 }\n    ordering: { key: { header: Ordering-Key } }\n",
    );
    assert!(yaml.contains("ordering"), "{yaml}");
    let mut a = start(dir_a.path(), &yaml, &moto.endpoint()).await;
    for i in 0..EVENTS {
        let (id, key) = (format!("e{i:05}"), format!("k{}", i % KEYS));
        let headers = [
            ("Idempotency-Key", id.as_str()),
            ("Ordering-Key", key.as_str()),
        ];
        let r = post(&a.url("orders"), "{}", &headers).await;
        check_eq!(a, r.status, 202, "{id}: {}", r.text());
    }
    // Only each key's first event is tried while its endpoint refuses.
    all_refused(&a, &seen, KEYS).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let tried: Vec<String> = seen.lock().expect("seen").refused.keys().cloned().collect();
    check_eq!(a, tried.len(), KEYS, "only the heads: {tried:?}");
    let b = start(dir_b.path(), &yaml, &moto.endpoint()).await;
    a.terminate();
    let status = a.wait_exit(Duration::from_secs(30)).await;
    check!(
        a,
        status.success(),
        "A exits 0 after its hand-off: {status:?}"
    );
    accept.store(true, Ordering::SeqCst);
    all_delivered(&[&b], &seen, EVENTS).await;
    // B delivered each key's events in accept order: one at a time, so the
    // order of first deliveries is the order of the requests.
    let got = rx.received();
    for k in 0..KEYS {
        let sent: Vec<String> = got
            .iter()
            .filter(|r| r.header("ordering-key") == Some(format!("k{k}").as_str()))
            .filter_map(|r| r.header("webhook-id").map(str::to_string))
            .fold(Vec::new(), |mut v, id| {
                if !v.contains(&id) {
                    v.push(id);
                }
                v
            });
        let expected: Vec<String> = (0..EVENTS)
            .filter(|i| i % KEYS == k)
            .map(|i| format!("e{i:05}"))
            .collect();
        check_eq!(b, sent, expected, "key k{k}");
    }
    check_eq!(b, twice(&seen), 0, "events delivered twice");
}

/// A dead letter A decided but could not write (its sink blocked) goes
/// with the hand-off: B writes its record, and never sends the event again
/// (issue #45: the record is written apart from the attempt, so more of
/// them wait at a shutdown than before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_its_sink_did_not_take_goes_with_the_hand_off_and_is_never_sent_again() {
    const EVENTS: usize = 3;
    let moto = Moto::start(BUCKET).await;
    let rx = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let yaml = config(&rx, "1s", "5s")
        .replace("destinations:", "dead_letter: { dir: ./dl }\ndestinations:");
    let mut a = start(dir_a.path(), &yaml, &moto.endpoint()).await;
    // A's dead-letter folder is blocked: every write fails.
    support::block_sink(&a, "orders");
    post_events(&a, EVENTS, r#"{"order":1}"#).await;
    rx.wait_for(EVENTS, PROMPT).await;
    let failures = r#"courier_dead_letter_write_failures_total{destination="orders"}"#;
    let deadline = tokio::time::Instant::now() + PROMPT;
    // Bounded by the deadline.
    while support::metric(&a.admin_url(), failures)
        .await
        .unwrap_or(0.0)
        < 1.0
    {
        if tokio::time::Instant::now() >= deadline {
            fail!(a, "no dead letter met the blocked sink");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let b = start(dir_b.path(), &yaml, &moto.endpoint()).await;
    a.terminate_handing_off().await;
    let (_, records) =
        support::wait_dead_letters(&b, "orders", EVENTS, Duration::from_secs(30)).await;
    check_eq!(b, records.len(), EVENTS, "B wrote each record once");
    for r in &records {
        check_eq!(b, r["deadLetterReason"], "NonRetriableStatus", "{r}");
        check_eq!(b, r["deliveryAttempts"], 1, "{r}");
    }
    // Time for a wrongly adopted event to have gone out.
    tokio::time::sleep(Duration::from_millis(500)).await;
    check_eq!(
        b,
        rx.count(),
        EVENTS,
        "an event was sent again after its fate"
    );
}
