//! Crash loop (issue #9 item 6): publishers post without pause while
//! courier is SIGKILLed at random moments (seeded) and restarted on the
//! same journal, round after round; at the end nothing that got a 202 is
//! missing at the endpoint: each was answered in full within one life of
//! courier (an attempt a kill cut off does not count) with the bytes that
//! were posted. Duplicates are allowed (at least once), counted and bounded
//! by what the kills could leave undecided.
//!
//! `COURIER_CRASH_ROUNDS=N` runs N rounds (default 20);
//! `COURIER_CRASH_SEED=S` replays the kill timings and slow rounds of a
//! printed seed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::{
    Courier, Receiver, Reply, behavior, chaos, check, check_eq, client, metric, receiver,
};

const PUBLISHERS: usize = 4;
/// The destination's `concurrency` in `config`.
const CONCURRENCY: usize = 16;
/// How long before a kill an answered delivery may still be unsynced.
const UNSYNCED: Duration = Duration::from_millis(1000);
const DEFAULT_ROUNDS: usize = 20;
/// Each publisher waits this long between two acknowledged posts (about
/// 400 events/s in all), below what even a slow round delivers (16 × 50/s).
const PACE: Duration = Duration::from_millis(10);
/// A kill comes this long after the previous (re)start, uniformly.
const MIN_UP: Duration = Duration::from_millis(150);
const MAX_UP: Duration = Duration::from_millis(2000);
/// After the last round, everything acknowledged arrives within this.
const DRAIN: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

fn config(url: &str) -> String {
    format!(
        "listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
log: {{ level: info }}
journal: {{ dir: ./journal }}
dead_letter: {{ dir: ./dl }}
destinations:
  orders:
    url: {url}/hooks
    concurrency: {CONCURRENCY}
    retry: {{ schedule: [100ms], max_attempts: 30, jitter: 0 }}
    status: {{ min_delay: {{ 5xx: 0s }} }}
    probation: {{ after_failures: 0 }}
"
    )
}

fn rounds() -> usize {
    match std::env::var("COURIER_CRASH_ROUNDS") {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("COURIER_CRASH_ROUNDS={v:?}: {e}")),
        Err(_) => DEFAULT_ROUNDS,
    }
}

/// The body a publisher posts under `p{p}-{seq}`.
fn posted_body(p: usize, seq: u64) -> String {
    format!(r#"{{"publisher":{p},"seq":{seq}}}"#)
}

/// The publisher and sequence number in an id `p{p}-{seq:06}`.
fn parse_id(id: &str) -> Option<(usize, u64)> {
    let (p, s) = id.strip_prefix('p')?.split_once('-')?;
    Some((p.parse().ok()?, s.parse().ok()?))
}

/// Kills so far: (just before the signal, once reaped).
type Kills = Vec<(Instant, Instant)>;

/// Ids delivered for good: answered in full within one life of courier (a
/// request whose answer a kill cut off does not count).
fn answered(rx: &Receiver, kills: &[(Instant, Instant)]) -> HashSet<String> {
    rx.received()
        .into_iter()
        .filter(|r| r.answered_within_life(kills))
        .filter_map(|r| r.header("webhook-id").map(str::to_owned))
        .collect()
}

/// Delivered ids with how many times each arrived.
fn delivered(rx: &Receiver) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for r in rx.received() {
        *seen
            .entry(r.header("webhook-id").unwrap_or("").to_owned())
            .or_default() += 1;
    }
    seen
}

/// Whether `body` is a complete 202 answer that lists `id` among the
/// accepted ones (a fresh accept or a dedupe hit of an earlier one).
fn acknowledges(status: u16, body: &[u8], id: &str) -> bool {
    if status != 202 {
        return false;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    let listed = |key: &str| {
        v[key]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == id || x["id"] == id))
    };
    listed("ids") || listed("duplicates")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_event_is_lost_across_repeated_sigkills() {
    let seed = chaos::seed_from_env("COURIER_CRASH_SEED");
    let rounds = rounds();
    println!("crash loop seed {seed}, {rounds} rounds (rerun with COURIER_CRASH_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();

    // A plain 200 endpoint, slow (20 ms an answer) in some rounds so that a
    // backlog builds up for the kill to land in.
    let slow = Arc::new(AtomicBool::new(false));
    let s = slow.clone();
    let rx = Receiver::start(behavior(move |_, _| {
        if s.load(Ordering::Relaxed) {
            Reply::status(200).delay(Duration::from_millis(20))
        } else {
            Reply::status(200)
        }
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut c = Courier::start(tmp.path(), &config(&rx.url())).await;

    // Publishers post to whatever courier is up now, retrying an id (same
    // Idempotency-Key) until a 202 for it was read whole.
    let url = Arc::new(RwLock::new(c.url("orders")));
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut publishers = tokio::task::JoinSet::new();
    for p in 0..PUBLISHERS {
        let (url, stop, acked) = (url.clone(), stop.clone(), acked.clone());
        publishers.spawn(async move {
            let mut seq = 0u64;
            // Until told to stop; each turn is one post.
            while !stop.load(Ordering::Relaxed) {
                let id = format!("p{p}-{seq:06}");
                let target = url.read().unwrap_or_else(|e| e.into_inner()).clone();
                let body = posted_body(p, seq);
                let headers = [
                    ("idempotency-key", id.as_str()),
                    ("content-type", "application/json"),
                ];
                match client::try_post(&target, body, &headers).await {
                    Ok(r) if acknowledges(r.status, &r.body, &id) => {
                        acked.lock().unwrap_or_else(|e| e.into_inner()).push(id);
                        seq += 1;
                        tokio::time::sleep(PACE).await;
                    }
                    // Refused, reset, cut short, 503 while starting: not
                    // acknowledged; try the same id again shortly.
                    _ => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
            (p, seq)
        });
    }

    let mut kills_with_backlog = 0;
    let mut restart_times = Vec::new();
    let mut kills: Kills = Vec::new();
    for round in 0..rounds {
        slow.store(rng.random_bool(0.5), Ordering::Relaxed);
        let up = rng.random_range(MIN_UP..=MAX_UP);
        tokio::time::sleep(up).await;
        let acked_now: HashSet<String> = acked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        let signalled = Instant::now();
        c.kill();
        kills.push((signalled, Instant::now()));
        let seen = answered(&rx, &kills);
        if acked_now.iter().any(|id| !seen.contains(id)) {
            kills_with_backlog += 1;
        }
        let t = Instant::now();
        c.restart().await;
        restart_times.push(t.elapsed());
        *url.write().unwrap_or_else(|e| e.into_inner()) = c.url("orders");
        if round % 10 == 9 {
            println!("round {}: {:?} since start", round + 1, started.elapsed());
        }
    }
    stop.store(true, Ordering::Relaxed);
    // The last id each publisher tried (acknowledged or not).
    let mut last_tried = HashMap::new();
    while let Some(done) = publishers.join_next().await {
        let (p, seq) = done.expect("publisher task");
        last_tried.insert(p, seq);
    }
    slow.store(false, Ordering::Relaxed);

    let acked: Vec<String> = acked.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let acked_set: HashSet<&String> = acked.iter().collect();
    check_eq!(
        c,
        acked.len(),
        acked_set.len(),
        "seed {seed}: an id was acknowledged twice by the publishers' own count"
    );
    // Bounded: until every acknowledged id has arrived and nothing is
    // pending, or the deadline.
    let deadline = Instant::now() + DRAIN;
    let (missing, pending) = loop {
        let seen = answered(&rx, &kills);
        let missing: Vec<&String> = acked.iter().filter(|id| !seen.contains(*id)).collect();
        let pending = metric(
            &c.admin_url(),
            r#"courier_events_pending{destination="orders"}"#,
        )
        .await;
        if (missing.is_empty() && pending == Some(0.0)) || Instant::now() >= deadline {
            break (missing.into_iter().cloned().collect::<Vec<_>>(), pending);
        }
        tokio::time::sleep(POLL).await;
    };
    let seen = delivered(&rx);
    let duplicates: usize = seen.values().map(|n| n - 1).sum();
    let duplicated_ids = seen.values().filter(|n| **n > 1).count();
    let unacked_delivered = seen.keys().filter(|id| !acked_set.contains(id)).count();
    let slowest_restart = restart_times.iter().max().copied().unwrap_or_default();
    println!(
        "crash loop seed {seed}: rounds {rounds}, acknowledged {}, delivered {} distinct ({} of them acknowledged), \
         missing {}, duplicates {duplicates} (over {duplicated_ids} ids), delivered without a 202 {unacked_delivered}, \
         kills with acknowledged events not yet delivered {kills_with_backlog}, slowest restart {slowest_restart:?}, total {:?}",
        acked.len(),
        seen.len(),
        seen.len() - unacked_delivered,
        missing.len(),
        started.elapsed()
    );
    check!(
        c,
        missing.is_empty(),
        "seed {seed}: {} acknowledged events not delivered (answered in full within one life of courier) {DRAIN:?} after {rounds} SIGKILLs ({pending:?} still pending), e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    // Every delivered id was posted (no garbage from a torn journal).
    let unknown: Vec<&String> = seen
        .keys()
        .filter(|id| {
            parse_id(id).is_none_or(|(p, s)| last_tried.get(&p).is_none_or(|last| s > *last))
        })
        .collect();
    check!(
        c,
        unknown.is_empty(),
        "seed {seed}: delivered ids never posted: {unknown:?}"
    );
    // Every delivery carries the bytes that were posted under its id.
    let torn: Vec<String> = rx
        .received()
        .iter()
        .filter(|r| {
            let id = r.header("webhook-id").unwrap_or("");
            parse_id(id).is_none_or(|(p, s)| r.body != posted_body(p, s).as_bytes())
        })
        .map(|r| format!("{:?}: {}", r.header("webhook-id"), r.text()))
        .collect();
    check!(
        c,
        torn.is_empty(),
        "seed {seed}: {} deliveries differ from the posted body, e.g. {:?}",
        torn.len(),
        &torn[..torn.len().min(5)]
    );
    // Duplicates come only from what a kill left undecided: a delivery
    // answered within UNSYNCED before a kill (the indexer's lag plus its
    // sync interval, 200 ms, with room for a loaded CI machine), or cut off
    // by it. The exception: a publisher whose post was cut off by the
    // kill posts the same id again, and if that post reaches a courier
    // that has not journaled the id's dedupe key, the event is stored
    // twice; at most one per publisher per kill.
    let unexplained = receiver::unexplained_repeats(&rx.received(), &kills, UNSYNCED);
    // The duplicate window as measured: how long before the kill that
    // repeated it the first copy of a delivery was answered.
    let mut copies: HashMap<String, Vec<Instant>> = HashMap::new();
    for r in rx.received() {
        if let Some(at) = r.answered.filter(|_| r.answered_within_life(&kills)) {
            let id = r.header("webhook-id").unwrap_or("").to_owned();
            copies.entry(id).or_default().push(at);
        }
    }
    let ages: Vec<Duration> = copies
        .values()
        .filter(|c| c.len() > 1)
        .filter_map(|c| {
            // Copies on both sides of a kill; copies within one life are
            // an id posted twice (a re-post after a cut-off answer).
            let first = *c.iter().min()?;
            let last = *c.iter().max()?;
            kills
                .iter()
                .find(|(k, reaped)| *k >= first && last > *reaped)
                .map(|(k, _)| *k - first)
        })
        .collect();
    let window = ages.iter().max().copied().unwrap_or_default();
    let late = ages
        .iter()
        .filter(|a| **a > Duration::from_millis(250))
        .count();
    println!(
        "seed {seed}: repeated deliveries were answered at most {window:?} before their kill; {late} of {} more than 250 ms before",
        ages.len()
    );
    let bound = PUBLISHERS * kills.len();
    check!(
        c,
        unexplained <= bound,
        "seed {seed}: {unexplained} deliveries were repeated though answered more than {UNSYNCED:?} before any kill (at most {bound} re-posts allowed)"
    );
    check_eq!(
        c,
        pending,
        Some(0.0),
        "seed {seed}: still pending after the drain"
    );
    // The test proves something only if kills hit acknowledged work in flight.
    check!(
        c,
        kills_with_backlog > 0,
        "seed {seed}: no kill found an acknowledged event undelivered; the loop tested nothing"
    );
}
