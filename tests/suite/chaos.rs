//! Chaos (issue #9 item 6): thousands of events through a real courier to
//! two loopback endpoints that misbehave at random (seeded: see
//! `support::chaos`), then exact books per destination. Every accepted event
//! ends delivered, dead-lettered or dropped, never two of these; the
//! endpoint's own record says which, and the dead-letter records (and the
//! `dropped` log lines) name the endpoint's last answer.
//!
//! Reproduce a run with `COURIER_CHAOS_SEED=<seed printed by the test>`.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::chaos::{self, Action, ChaosReceiver, ChaosRecord, Mix, Timing};
use support::{
    Courier, check, check_eq, client, dl_dir, fail, metric, metric_sum, read_dead_letters,
};

/// Events per destination.
const EVENTS: usize = 2500;
const PUBLISHERS: usize = 16;
const MAX_ATTEMPTS: u32 = 4;
/// Courier's per-attempt timeout and late-answer window, and the
/// receiver's timings against them: a `Late` answer comes 300 ms after the
/// timeout and 1.2 s before the window closes; a trickled answer is done
/// 300 ms before the timeout.
const TIMEOUT: &str = "500ms";
const LATE_WINDOW: &str = "1500ms";
const TIMING: Timing = Timing {
    late_after: Duration::from_millis(800),
    trickle_step: Duration::from_millis(25),
    hang_cap: Duration::from_secs(5),
};
/// Every event has a final outcome within this, from the first post.
const SETTLE: Duration = Duration::from_secs(50);
const POLL: Duration = Duration::from_millis(100);

/// `alpha` dead-letters to `./dl`, `beta` has no sink (drops). Transport
/// timeouts wait courier's fixed 10 s minimum; everything else retries
/// within milliseconds: 5xx and 429 minimum delays are 0 (the receiver's
/// `Retry-After: 0` agrees), and probation is off so that a run of
/// failures does not stall a destination.
fn config(alpha: &str, beta: &str) -> String {
    let dest = |name: &str, url: &str, extra: &str| {
        format!(
            "  {name}:
    url: {url}/{name}
    timeout: {TIMEOUT}
    late_answer_window: {LATE_WINDOW}
    concurrency: 32
    retry: {{ schedule: [20ms, 50ms], max_attempts: {MAX_ATTEMPTS}, jitter: 0.1 }}
    status: {{ min_delay: {{ 5xx: 0s, 429: 0s }} }}
    probation: {{ after_failures: 0 }}
{extra}"
        )
    };
    format!(
        "listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
log: {{ format: json, level: info }}
journal: {{ dir: ./journal }}
dead_letter: {{ dir: ./dl }}
destinations:
{}{}",
        dest("alpha", alpha, ""),
        dest("beta", beta, "    dead_letter: none\n"),
    )
}

/// What the endpoint's record says became of one event.
#[derive(Debug, PartialEq, Eq)]
enum Fate {
    /// Its last request got a 2xx the receiver finished writing.
    Delivered,
    /// Every attempt failed; the last one like this.
    GivenUp(Action),
}

/// The fate of one event from its requests (arrival order), or why its
/// record is inconsistent.
fn fate(requests: &[ChaosRecord]) -> Result<Fate, String> {
    let numbers: Vec<Option<u32>> = requests.iter().map(|r| r.attempt).collect();
    let want: Vec<Option<u32>> = (1..=requests.len() as u32).map(Some).collect();
    if numbers != want {
        return Err(format!(
            "courier-delivery-attempt headers {numbers:?}, want {want:?}"
        ));
    }
    let last = requests.last().ok_or("no request")?;
    for (i, r) in requests.iter().enumerate() {
        if r.action.is_success() && !r.answered {
            return Err(format!(
                "the receiver could not finish writing its 200 to attempt {} ({:?}): courier closed the connection while it was still due an answer",
                i + 1,
                r.action
            ));
        }
        if r.action.is_success() && i + 1 < requests.len() {
            return Err(format!(
                "attempt {} got a 200 ({:?}), yet courier tried again ({} requests)",
                i + 1,
                r.action,
                requests.len()
            ));
        }
    }
    if last.action.is_success() {
        Ok(Fate::Delivered)
    } else if requests.len() == MAX_ATTEMPTS as usize {
        Ok(Fate::GivenUp(last.action))
    } else {
        Err(format!(
            "last of {} attempts was {:?} and no further attempt came (max_attempts {MAX_ATTEMPTS})",
            requests.len(),
            last.action
        ))
    }
}

/// Courier's JSON log lines with this `message` for `destination`, by id.
fn outcome_lines(logs: &str, message: &str, destination: &str) -> Vec<Value> {
    logs.lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"] == message && v["destination"] == destination)
        .collect()
}

/// Posts `EVENTS` events to each destination from `PUBLISHERS` tasks;
/// every one must be accepted. Returns the ids per destination.
async fn publish(c: &Courier, seed: u64) -> HashMap<&'static str, HashSet<String>> {
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..PUBLISHERS {
        let urls = [("alpha", c.url("alpha")), ("beta", c.url("beta"))];
        tasks.spawn(async move {
            let mut rejected = Vec::new();
            for i in (p..EVENTS).step_by(PUBLISHERS) {
                for (dest, url) in &urls {
                    let id = format!("{dest}-{i:05}");
                    let body = format!(r#"{{"n":{i},"id":"{id}"}}"#);
                    let headers = [
                        ("idempotency-key", id.as_str()),
                        ("content-type", "application/json"),
                    ];
                    match client::try_post(url, body, &headers).await {
                        Ok(r) if r.status == 202 => {}
                        Ok(r) => rejected.push(format!("{id}: {} {}", r.status, r.text())),
                        Err(e) => rejected.push(format!("{id}: {e}")),
                    }
                }
            }
            rejected
        });
    }
    let mut rejected = Vec::new();
    while let Some(r) = tasks.join_next().await {
        rejected.extend(r.expect("publisher task"));
    }
    check!(
        c,
        rejected.is_empty(),
        "seed {seed}: {} posts not accepted, e.g. {:?}",
        rejected.len(),
        &rejected[..rejected.len().min(5)]
    );
    let ids = |dest: &str| (0..EVENTS).map(|i| format!("{dest}-{i:05}")).collect();
    HashMap::from([("alpha", ids("alpha")), ("beta", ids("beta"))])
}

async fn counter(c: &Courier, name: &str, dest: &str) -> u64 {
    metric_sum(
        &c.admin_url(),
        &format!(r#"{name}{{destination="{dest}"}}"#),
    )
    .await as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_ends_exactly_once_and_dead_letters_name_the_last_answer() {
    let seed = chaos::seed();
    println!("chaos seed {seed} (rerun with COURIER_CHAOS_SEED={seed})");
    let started = Instant::now();
    let alpha = ChaosReceiver::start(seed, Mix::default(), TIMING).await;
    let beta = ChaosReceiver::start(seed.rotate_left(1), Mix::default(), TIMING).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &config(&alpha.url(), &beta.url())).await;

    let accepted_ids = publish(&c, seed).await;
    let published = started.elapsed();

    // Bounded: until nothing is pending anywhere and neither receiver is
    // still handling a request (a hang waits for courier to hang up).
    let deadline = started + SETTLE;
    loop {
        let admin = c.admin_url();
        let mut pending = 0.0;
        for dest in ["alpha", "beta"] {
            let series = format!(r#"courier_events_pending{{destination="{dest}"}}"#);
            pending += metric(&admin, &series).await.unwrap_or(f64::NAN);
        }
        let busy = alpha.in_flight() + beta.in_flight();
        if pending == 0.0 && busy == 0 {
            break;
        }
        if Instant::now() >= deadline {
            fail!(
                c,
                "seed {seed}: after {SETTLE:?} still {pending} events pending, {busy} requests in flight"
            );
        }
        tokio::time::sleep(POLL).await;
    }
    let settled = started.elapsed();

    // Outcome lines go out through courier's log writer thread, after the
    // counters: read the logs once they have stopped growing (seed
    // 4255713867718809195 read them one `delivered` line short).
    let mut logs = c.logs();
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = c.logs();
        if now.len() == logs.len() {
            break;
        }
        logs = now;
    }
    let mut summary = Vec::new();
    for (dest, rx) in [("alpha", &alpha), ("beta", &beta)] {
        let ids = &accepted_ids[dest];
        let accepted = counter(&c, "courier_events_accepted_total", dest).await;
        let delivered = counter(&c, "courier_events_delivered_total", dest).await;
        let dead = counter(&c, "courier_events_dead_lettered_total", dest).await;
        let dropped = counter(&c, "courier_events_dropped_total", dest).await;
        check_eq!(
            c,
            accepted,
            ids.len() as u64,
            "seed {seed}: {dest} accepted"
        );
        check_eq!(
            c,
            accepted,
            delivered + dead + dropped,
            "seed {seed}: {dest}: accepted = delivered ({delivered}) + dead-lettered ({dead}) + dropped ({dropped})"
        );

        // The receiver's side: each accepted event's fate, from its requests.
        check_eq!(
            c,
            rx.malformed(),
            Vec::<String>::new(),
            "seed {seed}: {dest}"
        );
        let by_event = rx.by_event();
        let unknown: Vec<&String> = by_event.keys().filter(|id| !ids.contains(*id)).collect();
        check!(
            c,
            unknown.is_empty(),
            "seed {seed}: {dest}: requests for ids never posted: {unknown:?}"
        );
        let mut fates: HashMap<&str, Fate> = HashMap::new();
        for id in ids {
            let Some(requests) = by_event.get(id) else {
                fail!(
                    c,
                    "seed {seed}: {dest}: accepted event {id} never reached the receiver"
                );
            };
            match fate(requests) {
                Ok(f) => {
                    fates.insert(id, f);
                }
                Err(e) => fail!(
                    c,
                    "seed {seed}: {dest}: event {id}: {e}; requests: {requests:?}"
                ),
            }
        }
        let rx_delivered: HashSet<&str> = fates
            .iter()
            .filter(|(_, f)| **f == Fate::Delivered)
            .map(|(id, _)| *id)
            .collect();
        let rx_given_up: HashMap<&str, Action> = fates
            .iter()
            .filter_map(|(id, f)| match f {
                Fate::GivenUp(a) => Some((*id, *a)),
                Fate::Delivered => None,
            })
            .collect();
        check_eq!(
            c,
            delivered,
            rx_delivered.len() as u64,
            "seed {seed}: {dest}: courier's delivered counter vs events the receiver answered 2xx"
        );
        check_eq!(
            c,
            dead + dropped,
            rx_given_up.len() as u64,
            "seed {seed}: {dest}: courier's given-up counters vs events whose {MAX_ATTEMPTS} attempts all failed"
        );

        // One `delivered` line per delivered event, none for the others.
        let delivered_lines = outcome_lines(&logs, "delivered", dest);
        let mut logged: Vec<&str> = delivered_lines
            .iter()
            .filter_map(|v| v["id"].as_str())
            .collect();
        logged.sort_unstable();
        let mut want: Vec<&str> = rx_delivered.iter().copied().collect();
        want.sort_unstable();
        check!(
            c,
            logged == want,
            "seed {seed}: {dest}: {} `delivered` lines for {} delivered events; not delivered per the receiver: {:?}",
            logged.len(),
            want.len(),
            logged
                .iter()
                .filter(|id| !rx_delivered.contains(*id))
                .take(10)
                .collect::<Vec<_>>()
        );

        // Each line names the attempt the receiver answered 200; an answer
        // the receiver held back past courier's timeout (`Late`, 300 ms
        // after it) is confirmed as late, through the late-answer window.
        let mut late_confirmed = 0;
        for line in &delivered_lines {
            let id = line["id"].as_str().unwrap_or_default();
            let requests = &by_event[id];
            let last = requests[requests.len() - 1].action;
            check_eq!(
                c,
                (line["attempts"].as_u64(), line["status"].as_u64()),
                (Some(requests.len() as u64), Some(200)),
                "seed {seed}: {dest}: {id}: `delivered` line {line} vs the receiver's {} requests, last {last:?}",
                requests.len()
            );
            if last == Action::Late {
                check_eq!(
                    c,
                    line["late"],
                    Value::Bool(true),
                    "seed {seed}: {dest}: {id} was answered only after the timeout: {line}"
                );
                late_confirmed += 1;
            }
        }

        // What was given up, and why, as courier wrote it down: the
        // dead-letter records (alpha) or the `dropped` lines (beta).
        let given_up: Vec<(String, Value, u64, Value)> = if dest == "alpha" {
            check_eq!(
                c,
                dropped,
                0,
                "seed {seed}: {dest} has a sink: nothing is dropped"
            );
            let (_, records) = read_dead_letters(&c, &dl_dir(&c, dest));
            for r in &records {
                check_eq!(
                    c,
                    r["deadLetterReason"],
                    "MaxDeliveryAttemptsExceeded",
                    "seed {seed}: {dest}: {r}"
                );
            }
            records
                .iter()
                .map(|r| {
                    let id = r["id"].as_str().unwrap_or_default().to_owned();
                    let attempts = r["deliveryAttempts"].as_u64().unwrap_or(0);
                    (
                        id,
                        r["lastDeliveryOutcome"].clone(),
                        attempts,
                        r["lastHttpStatusCode"].clone(),
                    )
                })
                .collect()
        } else {
            check_eq!(
                c,
                dead,
                0,
                "seed {seed}: {dest} has no sink: nothing is dead-lettered"
            );
            check!(
                c,
                !dl_dir(&c, dest).exists(),
                "seed {seed}: {dest} has no sink, yet {} exists",
                dl_dir(&c, dest).display()
            );
            outcome_lines(&logs, "dropped", dest)
                .iter()
                .map(|v| {
                    let id = v["id"].as_str().unwrap_or_default().to_owned();
                    let attempts = v["attempts"].as_u64().unwrap_or(0);
                    let status = v.get("status").cloned().unwrap_or(Value::Null);
                    (id, v["outcome"].clone(), attempts, status)
                })
                .collect()
        };
        check_eq!(
            c,
            given_up.len() as u64,
            dead + dropped,
            "seed {seed}: {dest}: records of given-up events vs the counters"
        );
        let mut seen = HashSet::new();
        let mut by_outcome: HashMap<String, usize> = HashMap::new();
        for (id, outcome, attempts, status) in &given_up {
            check!(
                c,
                seen.insert(id.clone()),
                "seed {seed}: {dest}: {id} given up twice"
            );
            check!(
                c,
                !rx_delivered.contains(id.as_str()),
                "seed {seed}: {dest}: {id} was answered 200 and courier gave it up too ({outcome})"
            );
            let Some(last) = rx_given_up.get(id.as_str()) else {
                fail!(
                    c,
                    "seed {seed}: {dest}: {id} given up but the receiver never failed its last attempt: {:?}",
                    by_event.get(id)
                )
            };
            let (want_outcome, want_status) = last.expected_outcome();
            check_eq!(
                c,
                (outcome.as_str(), *attempts, status.as_u64()),
                (
                    Some(want_outcome),
                    u64::from(MAX_ATTEMPTS),
                    want_status.map(u64::from)
                ),
                "seed {seed}: {dest}: {id}: (outcome, attempts, status) recorded vs the receiver's last action {last:?}"
            );
            *by_outcome.entry(want_outcome.to_owned()).or_default() += 1;
        }
        let actions: HashMap<String, usize> =
            rx.records().iter().fold(HashMap::new(), |mut m, r| {
                *m.entry(format!("{:?}", r.action)).or_default() += 1;
                m
            });
        summary.push(format!(
            "{dest}: accepted {accepted}, delivered {delivered} ({late_confirmed} by a late answer), dead-lettered {dead}, dropped {dropped}; \
             requests {} {actions:?}; given up by last outcome {by_outcome:?}",
            rx.records().len()
        ));
    }
    println!(
        "seed {seed}: published in {published:?}, settled in {settled:?}\n{}",
        summary.join("\n")
    );
}
