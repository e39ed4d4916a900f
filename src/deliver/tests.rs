//! A dispatcher driven without sockets, as linkerd drives its routes with
//! `tower_test::mock::pair`: a real journal on a tempdir, the real attempt
//! stack over a mock leaf that each test answers, and tokio's clock paused
//! and stepped by the test alone (`Brake`). `clock::now_ms` reads that
//! clock under test, so due times and TTLs step with it.

use super::dispatcher::Dispatcher;
use super::health::{Health, PauseReason};
use super::limit::Limit;
use super::settle::Ctx;
use super::stack::{self, AttemptRequest};
use crate::clock;
use crate::config::{self, Purpose};
use crate::deadletter::{DeadLetterSink, Key, Line};
use crate::event::NewEvent;
use crate::journal::{Journal, Reader};
use crate::metrics;
use bytes::Bytes;
use http_body_util::Empty;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::advance;
use tokio_util::sync::CancellationToken;
use tower_test::mock;

type Answer = http::Response<Empty<Bytes>>;

const DEST: &str = "orders";
/// Real time a test watches for what must not happen.
const QUIET: Duration = Duration::from_millis(300);
/// Turns of `WAIT_STEP` (real time) a test waits for what must happen.
const PATIENCE: u32 = 1000;
const WAIT_STEP: Duration = Duration::from_millis(10);

/// Dead letters, kept in memory.
#[derive(Default)]
struct Sink(Mutex<Vec<String>>);

impl DeadLetterSink for Sink {
    fn write(&self, _: &str, _: &str, lines: &[&Line]) -> std::io::Result<()> {
        let mut held = self.0.lock().expect("sink");
        held.extend(lines.iter().map(|l| l.text.clone()));
        Ok(())
    }

    fn holds(&self, _: &str, _: &[Key]) -> std::io::Result<HashSet<Key>> {
        Ok(HashSet::new())
    }
}

/// Keeps tokio's paused clock from jumping to the next timer while the
/// runtime waits on the journal's threads: a blocking task in flight
/// inhibits auto-advance, so only `advance` moves time.
struct Brake {
    _release_on_drop: std::sync::mpsc::Sender<()>,
}

fn brake() -> Brake {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    tokio::task::spawn_blocking(move || rx.recv());
    Brake {
        _release_on_drop: tx,
    }
}

/// Waits in real time, without moving tokio's clock.
async fn real_sleep(d: Duration) {
    tokio::task::spawn_blocking(move || std::thread::sleep(d))
        .await
        .expect("sleep");
}

struct Harness {
    journal: Journal,
    /// Builds the context a reload hands over.
    leaf: mock::Mock<AttemptRequest, Answer>,
    reader: Reader,
    health: Arc<Health>,
    limit: Arc<Limit>,
    endpoint: mock::Handle<AttemptRequest, Answer>,
    sink: Arc<Sink>,
    stop: CancellationToken,
    ctx: watch::Sender<Arc<Ctx>>,
    _dir: tempfile::TempDir,
    _brake: Brake,
    next_id: u32,
}

/// A dispatcher for `orders` with `settings` (YAML under the destination)
/// and a paused health if `paused`, running.
fn start(settings: &str, paused: bool) -> Harness {
    let brake = brake();
    let dest = destination(settings);
    let dir = tempfile::tempdir().expect("tempdir");
    let (journal, _) =
        Journal::open(dir.path(), true, 1 << 30, None, &[DEST.into()], None).expect("journal");
    let (leaf, endpoint) = mock::pair::<AttemptRequest, Answer>();
    let health = Arc::new(Health::new(
        dest.probation.clone(),
        dest.rate_limit_per_second,
    ));
    if paused {
        health.pause(PauseReason::Operator, clock::now_ms());
    }
    let limit = Arc::new(Limit::new(DEST, dest.concurrency, dest.adaptive));
    let sink = Arc::new(Sink::default());
    let ctx = context(dest, &journal, &sink, &health, &limit, leaf.clone());
    let (tx, rx) = watch::channel(ctx);
    let stop = CancellationToken::new();
    let reader = journal.reader().expect("reader");
    let state = journal.add_destination(DEST);
    let dispatcher = Dispatcher::new(rx, reader.clone(), state, stop.clone());
    tokio::spawn(dispatcher.run());
    Harness {
        journal,
        leaf,
        reader,
        health,
        limit,
        endpoint,
        sink,
        stop,
        ctx: tx,
        _dir: dir,
        _brake: brake,
        next_id: 0,
    }
}

/// The destination `orders` with `settings` (YAML under it).
fn destination(settings: &str) -> Arc<config::DestinationSettings> {
    let yaml = format!("destinations:\n  {DEST}:\n    url: https://h.example/\n{settings}");
    let env = config::ProcessEnv;
    let loaded = config::parse("c.yaml", &yaml, ".".into(), Purpose::Run, &env).expect("config");
    loaded.settings.destinations[0].clone()
}

fn context(
    dest: Arc<config::DestinationSettings>,
    journal: &Journal,
    sink: &Arc<Sink>,
    health: &Arc<Health>,
    limit: &Arc<Limit>,
    leaf: mock::Mock<AttemptRequest, Answer>,
) -> Arc<Ctx> {
    Arc::new(Ctx {
        stack: stack::build(&dest, leaf, None),
        dest,
        journal: journal.clone(),
        sink: Some(sink.clone()),
        // Durable delivery never sends through it.
        passthrough: tower::util::BoxCloneSyncService::new(tower::service_fn(|_| {
            std::future::pending()
        })),
        health: health.clone(),
        endpoints: None,
        limit: limit.clone(),
        late: Arc::default(),
        sink_streak: Arc::default(),
        metrics: metrics::Delivery::new(DEST),
        passthrough_attempts: Arc::new(metrics::PassthroughAttempts::new(DEST)),
    })
}

fn answer(status: u16) -> Answer {
    http::Response::builder()
        .status(status)
        .body(Empty::new())
        .expect("answer")
}

fn attempt_number(req: &AttemptRequest) -> &str {
    req.headers()["courier-delivery-attempt"]
        .to_str()
        .expect("header")
}

impl Harness {
    /// Accepts `n` events, as ingress does, and returns their ids.
    async fn accept(&mut self, n: u32) -> Vec<String> {
        let events: Vec<NewEvent> = (0..n)
            .map(|_| {
                self.next_id += 1;
                NewEvent {
                    id: format!("evt-{}", self.next_id),
                    destination: DEST.into(),
                    method: "POST".into(),
                    path: String::new(),
                    headers: Vec::new(),
                    body: Bytes::from_static(b"{}"),
                    accepted_ms: clock::now_ms(),
                }
            })
            .collect();
        let ids = events.iter().map(|e| e.id.clone()).collect();
        self.journal.append(events).await.expect("append");
        ids
    }

    /// The next attempt to reach the endpoint.
    async fn attempt(&mut self) -> (AttemptRequest, mock::SendResponse<Answer>) {
        for _ in 0..PATIENCE {
            tokio::select! {
                biased;
                got = self.endpoint.next_request() => return got.expect("the stack is gone"),
                () = real_sleep(WAIT_STEP) => {}
            }
        }
        panic!("no attempt reached the endpoint");
    }

    /// Fails if an attempt reaches the endpoint in the next moments.
    async fn no_attempt(&mut self, why: &str) {
        tokio::select! {
            got = self.endpoint.next_request() => {
                let number = got.as_ref().map(|(req, _)| attempt_number(req).to_string());
                panic!("{why}: attempt {number:?} was made");
            }
            () = real_sleep(QUIET) => {}
        }
    }

    /// Waits for `n` dead letters in all.
    async fn dead_letters(&self, n: usize) -> Vec<String> {
        for _ in 0..PATIENCE {
            let lines = self.sink.0.lock().expect("sink").clone();
            if lines.len() >= n {
                return lines;
            }
            real_sleep(WAIT_STEP).await;
        }
        panic!("fewer than {n} dead letters were written");
    }

    /// Waits until the journal holds a retry due later, and returns when.
    async fn retry_due(&self) -> u64 {
        for _ in 0..PATIENCE {
            let now = clock::now_ms();
            if let Some(due) = self.reader.next_due_after(DEST, now).await.expect("read") {
                return due - now;
            }
            real_sleep(WAIT_STEP).await;
        }
        panic!("no retry was scheduled");
    }
}

impl Harness {
    /// Hands the dispatcher a reloaded context with `settings`.
    fn reload(&self, settings: &str) {
        let dest = destination(settings);
        self.limit.reconfigure(dest.concurrency, dest.adaptive);
        let ctx = context(
            dest,
            &self.journal,
            &self.sink,
            &self.health,
            &self.limit,
            self.leaf.clone(),
        );
        self.ctx.send(ctx).expect("the dispatcher listens");
    }
}

/// The JSON array a batch attempt carries.
async fn batch_of(req: AttemptRequest) -> Vec<serde_json::Value> {
    use http_body_util::BodyExt;
    let body = req.into_body().collect().await.expect("body").to_bytes();
    serde_json::from_slice(&body).expect("a JSON array")
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[tokio::test(start_paused = true)]
async fn a_retriable_failure_is_retried_after_the_schedules_delay() {
    let mut h = start("    retry: { schedule: [20s], jitter: 0 }\n", false);
    h.accept(1).await;
    let (req, answered) = h.attempt().await;
    assert_eq!(attempt_number(&req), "1");
    answered.send_response(answer(500));
    assert_eq!(
        h.retry_due().await,
        20_000,
        "the schedule's delay, from now"
    );
    advance(Duration::from_millis(19_999)).await;
    h.no_attempt("before its due time").await;
    advance(Duration::from_millis(1)).await;
    let (req, answered) = h.attempt().await;
    assert_eq!(attempt_number(&req), "2");
    answered.send_response(answer(200));
}

#[tokio::test(start_paused = true)]
async fn a_400_is_dead_lettered_at_once_and_never_retried() {
    let mut h = start("    retry: { schedule: [1s], jitter: 0 }\n", false);
    let ids = h.accept(1).await;
    let (_, answered) = h.attempt().await;
    answered.send_response(answer(400));
    let lines = h.dead_letters(1).await;
    assert!(lines[0].contains(&ids[0]), "{}", lines[0]);
    assert!(lines[0].contains("NonRetriableStatus"), "{}", lines[0]);
    advance(Duration::from_secs(3600)).await;
    h.no_attempt("a 400 is not retried").await;
    assert_eq!(h.reader.oldest_accepted(DEST).await.expect("read"), None);
}

#[tokio::test(start_paused = true)]
async fn concurrency_caps_the_attempts_on_the_wire() {
    let mut h = start("    concurrency: 2\n", false);
    h.accept(3).await;
    let (_, first) = h.attempt().await;
    let (_, _second) = h.attempt().await;
    h.no_attempt("two are on the wire").await;
    first.send_response(answer(200));
    h.attempt().await;
}

#[tokio::test(start_paused = true)]
async fn a_pause_stops_new_attempts_until_resumed() {
    let mut h = start("", true);
    h.accept(1).await;
    advance(Duration::from_secs(600)).await;
    h.no_attempt("the destination is paused").await;
    assert!(h.health.resume());
    let (req, _) = h.attempt().await;
    assert_eq!(attempt_number(&req), "1");
}

#[tokio::test(start_paused = true)]
async fn an_event_past_its_ttl_is_dead_lettered_at_its_deadline() {
    let mut h = start("    retry: { event_ttl: 1m }\n", true);
    let ids = h.accept(1).await;
    advance(Duration::from_millis(59_999)).await;
    real_sleep(QUIET).await;
    assert!(h.sink.0.lock().expect("sink").is_empty(), "before its TTL");
    advance(Duration::from_millis(1)).await;
    let lines = h.dead_letters(1).await;
    assert!(lines[0].contains(&ids[0]), "{}", lines[0]);
    assert!(lines[0].contains("TimeToLiveExceeded"), "{}", lines[0]);
    h.no_attempt("it expired without an attempt").await;
}

#[tokio::test(start_paused = true)]
async fn a_reload_applies_before_the_next_attempt() {
    let mut h = start("    concurrency: 1\n", false);
    h.accept(2).await;
    let (_, _first) = h.attempt().await;
    h.no_attempt("one slot, taken").await;
    h.reload("    concurrency: 2\n");
    let (req, _) = h.attempt().await;
    assert_eq!(
        attempt_number(&req),
        "1",
        "the second event's first attempt"
    );
}

#[tokio::test(start_paused = true)]
async fn ready_events_go_out_as_batches_of_at_most_max_events() {
    let mut h = start("    batch: { max_events: 3 }\n", true);
    h.accept(4).await;
    // The writer puts a group in memory after it has answered: once the
    // events are rows, all four are ready together, as a backlog is at a
    // resume.
    let mut indexed = false;
    for _ in 0..PATIENCE {
        indexed = h
            .reader
            .oldest_accepted(DEST)
            .await
            .expect("read")
            .is_some();
        if indexed {
            break;
        }
        real_sleep(WAIT_STEP).await;
    }
    assert!(indexed, "the four events never became rows");
    assert!(h.health.resume());
    let (first, a) = h.attempt().await;
    let (second, b) = h.attempt().await;
    let mut sizes = vec![batch_of(first).await.len(), batch_of(second).await.len()];
    sizes.sort_unstable();
    assert_eq!(sizes, [1, 3], "what is ready, cut at max_events");
    a.send_response(answer(200));
    b.send_response(answer(200));
    h.no_attempt("all four were delivered").await;
    for _ in 0..PATIENCE {
        if h.reader
            .oldest_accepted(DEST)
            .await
            .expect("read")
            .is_none()
        {
            return;
        }
        real_sleep(WAIT_STEP).await;
    }
    panic!("the delivered batches were not settled");
}

#[tokio::test(start_paused = true)]
async fn the_rate_limit_spaces_attempts_evenly() {
    let policy = r#"    retry: { schedule: { sns: { healthyRetryPolicy: { minDelayTarget: 1, maxDelayTarget: 2, numRetries: 1, numNoDelayRetries: 0, numMinDelayRetries: 0, numMaxDelayRetries: 0, backoffFunction: "linear" }, throttlePolicy: { maxReceivesPerSecond: 2 } } }, jitter: 0 }
"#;
    let mut h = start(policy, false);
    h.accept(2).await;
    let (_, first) = h.attempt().await;
    first.send_response(answer(200));
    h.no_attempt("the next slot is 500 ms after the first")
        .await;
    advance(Duration::from_millis(499)).await;
    h.no_attempt("still 1 ms early").await;
    // The gate rounds its wait up by a ms.
    advance(Duration::from_millis(2)).await;
    h.attempt().await;
}

#[tokio::test(start_paused = true)]
async fn adaptive_concurrency_holds_attempts_to_the_learnt_limit() {
    let mut h = start(
        "    concurrency: { adaptive: { min: 1, max: 8, initial: 2 } }\n    retry: { schedule: [1h], jitter: 0 }\n",
        false,
    );
    h.accept(6).await;
    let (_, a) = h.attempt().await;
    let (_, b) = h.attempt().await;
    h.no_attempt("the initial limit, 2, is on the wire").await;
    // A 503 cuts it to 1: the next attempt waits for both to end.
    a.send_response(answer(503));
    h.no_attempt("one is on the wire, and the limit is 1 now")
        .await;
    assert_eq!(h.limit.current(), 1);
    b.send_response(answer(200));
    let (_, c) = h.attempt().await;
    h.no_attempt("the limit is 1").await;
    c.send_response(answer(200));
    h.attempt().await;
}
