//! Prometheus metrics (docs/http-api.md). Names live here only; other modules call
//! these functions, so a metric cannot be misspelt at a call site.
//!
//! A leaf: every module may call it and it imports nothing of the crate
//! (labels come in as strings, or as a [`Fixed`] set), so it can never be
//! part of an import cycle; `admin` only serves what it records.

pub use metrics::Gauge;
use metrics::{Counter, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;
use std::time::Duration;

pub const ACCEPTED: &str = "courier_events_accepted_total";
pub const ATTEMPTS: &str = "courier_delivery_attempts_total";
pub const DELIVERED: &str = "courier_events_delivered_total";
pub const DEAD_LETTERED: &str = "courier_events_dead_lettered_total";
pub const DROPPED: &str = "courier_events_dropped_total";
pub const PENDING: &str = "courier_events_pending";
pub const DURATION: &str = "courier_delivery_duration_seconds";
pub const REJECTED: &str = "courier_ingress_rejected_total";
pub const JOURNAL_BYTES: &str = "courier_journal_bytes";
pub const SYNC: &str = "courier_journal_sync_duration_seconds";
pub const PROBATION: &str = "courier_destination_probation";
pub const PAUSED: &str = "courier_destination_paused";
pub const JOURNAL_MAX_BYTES: &str = "courier_journal_max_bytes";
pub const MAX_PENDING_BYTES: &str = "courier_destination_max_pending_bytes";
pub const CONCURRENCY_LIMIT: &str = "courier_destination_concurrency_limit";
pub const CORRUPT: &str = "courier_journal_corrupt_records_total";
pub const DEDUPLICATED: &str = "courier_events_deduplicated_total";
pub const DEDUPE_EVICTED: &str = "courier_dedupe_evicted_total";
pub const REPLAYED: &str = "courier_events_replayed_total";
pub const UNMATCHED: &str = "courier_events_unmatched_total";
pub const RELOAD_FAILURES: &str = "courier_config_reload_failures_total";
pub const RELOAD_SUCCESS_AT: &str = "courier_config_last_reload_success_timestamp_seconds";
pub const RELOAD_OK: &str = "courier_config_last_reload_successful";
pub const PANICS: &str = "courier_http_panics_total";
pub const CONNECTIONS_REFUSED: &str = "courier_http_connections_refused_total";
pub const OLDEST_PENDING_AGE: &str = "courier_oldest_pending_age_seconds";
pub const ORDERING_LANES_BLOCKED: &str = "courier_ordering_lanes_blocked";
pub const ENDPOINTS: &str = "courier_endpoints";
pub const ENDPOINT_DISABLED: &str = "courier_endpoint_disabled_total";
pub const DEAD_LETTER_WRITE_FAILURES: &str = "courier_dead_letter_write_failures_total";
pub const BUILD_INFO: &str = "courier_build_info";
pub const OBJECT_STORE_REQUESTS: &str = "courier_object_store_requests_total";
pub const HANDOFF_EVENTS: &str = "courier_handoff_events_total";
pub const HANDOFF_PENDING_OBJECTS: &str = "courier_handoff_pending_objects";
pub const HANDOFF_OLDEST_AGE: &str = "courier_handoff_oldest_age_seconds";
pub const HISTORY_RECORDS: &str = "courier_history_records";
pub const HISTORY_BYTES: &str = "courier_history_bytes";
pub const TRACE_SPANS_DROPPED: &str = "courier_trace_spans_dropped_total";
pub const TRACE_EXPORT_FAILURES: &str = "courier_trace_export_failures_total";

const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A label value from a small fixed set (an attempt's outcome), numbered
/// so that a destination's series for it is looked up once.
pub trait Fixed: Copy {
    fn name(self) -> &'static str;
    /// Its place in the set; values at or past [`FIXED_MAX`] are counted
    /// too, only looked up at each call.
    fn ordinal(self) -> usize;
}

/// How many values of a [`Fixed`] set get a cached series.
pub const FIXED_MAX: usize = 16;

/// How often the histograms' samples are folded into their buckets. The
/// exporter keeps every sample recorded since the last fold, and only a
/// scrape or an upkeep folds them: a courier that nobody scraped held
/// about 20 bytes per delivered event, without end (benches/RESULTS.md).
pub const UPKEEP_EVERY: Duration = Duration::from_secs(1);

/// Installs the global recorder; its handle renders `/metrics`.
/// `listeners` (ingress, admin) get their connection series at 0.
/// Spawns the recorder's upkeep (`UPKEEP_EVERY`) on the current runtime.
pub fn install(listeners: &[&'static str]) -> Result<PrometheusHandle, BuildError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &BUCKETS)
        .and_then(|b| b.install_recorder())?;
    tokio::spawn(upkeep(handle.clone()));
    metrics::describe_counter!(
        ACCEPTED,
        "Events stored in the journal and acknowledged to the app."
    );
    metrics::describe_counter!(ATTEMPTS, "Delivery attempts by outcome.");
    metrics::describe_counter!(DELIVERED, "Events delivered to their endpoint.");
    metrics::describe_counter!(
        DEAD_LETTERED,
        "Events written to a dead-letter sink, by reason."
    );
    metrics::describe_counter!(
        DROPPED,
        "Events given up without a dead-letter sink, by reason."
    );
    metrics::describe_gauge!(PENDING, "Events waiting in the journal.");
    metrics::describe_histogram!(DURATION, "Duration of one delivery attempt.");
    metrics::describe_counter!(REJECTED, "Requests refused at ingress, by reason.");
    metrics::describe_gauge!(JOURNAL_BYTES, "Bytes of pending events in the journal.");
    metrics::describe_histogram!(SYNC, "Duration of one group commit, fdatasync included.");
    metrics::describe_gauge!(PROBATION, "1 while the destination is on probation.");
    metrics::describe_gauge!(
        PAUSED,
        "1 while the destination is paused by this cause (operator, gone: a 410 answer, retry_after: a 429 or 503 with Retry-After), else 0."
    );
    metrics::describe_gauge!(
        JOURNAL_MAX_BYTES,
        "journal.max_bytes in force: ingress answers 503 once the destinations' courier_journal_bytes add up to it."
    );
    metrics::describe_gauge!(
        MAX_PENDING_BYTES,
        "The destination's share of the journal in force (max_pending_bytes): its events are refused with 503 once its courier_journal_bytes reach it."
    );
    metrics::describe_gauge!(
        CONCURRENCY_LIMIT,
        "Attempts the destination may have in flight now: its concurrency, or the limit adaptive concurrency has learnt."
    );
    metrics::describe_counter!(
        CORRUPT,
        "Journal records that failed their checksum and were quarantined."
    );
    metrics::describe_counter!(
        DEDUPLICATED,
        "Events acknowledged but not stored: their id was seen within ingress.dedupe_window."
    );
    metrics::describe_counter!(
        DEDUPE_EVICTED,
        "Event ids forgotten before the end of ingress.dedupe_window, to bound memory."
    );
    metrics::describe_counter!(
        UNMATCHED,
        "Events posted to a topic that matched no subscriber: acknowledged, not stored."
    );
    metrics::describe_counter!(
        RELOAD_FAILURES,
        "Config reloads refused (invalid file): the config in force stays."
    );
    metrics::describe_gauge!(
        RELOAD_SUCCESS_AT,
        "When the config in force was loaded (start or last good reload), in seconds since the epoch."
    );
    metrics::describe_gauge!(
        RELOAD_OK,
        "1 if the last reload (or the start) succeeded, else 0."
    );
    metrics::describe_counter!(
        PANICS,
        "Requests whose handler panicked (answered 500), by listener."
    );
    metrics::describe_counter!(
        CONNECTIONS_REFUSED,
        "Connections answered 503 and closed: the listener's connection cap was reached."
    );
    metrics::describe_counter!(
        REPLAYED,
        "Dead-lettered events put back in the journal by a replay."
    );
    metrics::describe_gauge!(
        OLDEST_PENDING_AGE,
        "Age of the destination's oldest pending event (since its 202), 0 when none is pending."
    );
    metrics::describe_gauge!(
        ENDPOINTS,
        "Endpoints of a url: per_event destination held in memory, by state (no label per endpoint)."
    );
    metrics::describe_counter!(
        ENDPOINT_DISABLED,
        "Endpoints of a url: per_event destination disabled: by a 410, endpoints.disable_after, or an operator."
    );
    metrics::describe_gauge!(
        ORDERING_LANES_BLOCKED,
        "Ordering keys whose oldest event is being retried while later events of the key wait behind it."
    );
    metrics::describe_counter!(
        DEAD_LETTER_WRITE_FAILURES,
        "Dead-letter writes that failed (each is retried; the events stay in the journal)."
    );
    metrics::describe_counter!(
        OBJECT_STORE_REQUESTS,
        "Requests to object storage (dead-letter buckets, hand-off), by store URL, operation and result."
    );
    metrics::describe_counter!(
        HANDOFF_EVENTS,
        "Pending events handed off to object storage at shutdown (written), or taken from it (adopted)."
    );
    metrics::describe_gauge!(
        HANDOFF_PENDING_OBJECTS,
        "Hand-off objects waiting in the store for a courier to adopt them, at the last look."
    );
    metrics::describe_gauge!(
        HANDOFF_OLDEST_AGE,
        "Age of the oldest hand-off object waiting in the store at the last look, 0 when none."
    );
    metrics::describe_gauge!(
        HISTORY_RECORDS,
        "Event history records retained (one per event and destination)."
    );
    metrics::describe_gauge!(HISTORY_BYTES, "Bytes on disk of the event history's files.");
    metrics::describe_counter!(
        TRACE_SPANS_DROPPED,
        "Spans dropped because the export queue was full (tracing on, collector slow or down)."
    );
    metrics::describe_counter!(
        TRACE_EXPORT_FAILURES,
        "Batches of spans the OTLP exporter failed to send; their spans are lost."
    );
    metrics::describe_gauge!(
        BUILD_INFO,
        "Always 1; its version label is courier's version."
    );
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    process_collector().describe();
    counter!(RELOAD_FAILURES).increment(0);
    for &listener in listeners {
        counter!(PANICS, "listener" => listener).increment(0);
        counter!(CONNECTIONS_REFUSED, "listener" => listener).increment(0);
    }
    config_loaded();
    Ok(handle)
}

/// The config in force was loaded now (at start, or by a good reload).
pub fn config_loaded() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    gauge!(RELOAD_SUCCESS_AT).set(now.as_secs_f64());
    gauge!(RELOAD_OK).set(1.0);
}

/// The config file agrees with the config in force again.
pub fn config_ok() {
    gauge!(RELOAD_OK).set(1.0);
}

pub fn config_refused() {
    counter!(RELOAD_FAILURES).increment(1);
    gauge!(RELOAD_OK).set(0.0);
}

/// Creates a destination's counters at 0, so that `/metrics` lists them
/// before anything has happened (dashboards and alerts need the series);
/// `reasons`: every dead-letter reason.
pub fn register(destination: &str, reasons: &[&'static str]) {
    // Corrupt records too: an alert's `increase()` cannot see the first
    // increment of a series that appears with it.
    for name in [ACCEPTED, DELIVERED, CORRUPT] {
        counter!(name, "destination" => destination.to_string()).increment(0);
    }
    // The refusals that alert at their first occurrence (a full disk, a
    // failed journal), for the same reason.
    for reason in ["disk_full", "journal_failed"] {
        counter!(REJECTED, "destination" => destination.to_string(), "reason" => reason)
            .increment(0);
    }
    for &reason in reasons {
        counter!(DEAD_LETTERED, "destination" => destination.to_string(), "reason" => reason)
            .increment(0);
        counter!(DROPPED, "destination" => destination.to_string(), "reason" => reason)
            .increment(0);
    }
}

/// A destination's `courier_accepted_total`, kept by its journal state.
pub fn accepted(destination: &str) -> Counter {
    counter!(ACCEPTED, "destination" => destination.to_string())
}

/// The standard `process_*` series (CPU, resident and virtual memory, open
/// and maximum fds, threads, start time) of `metrics-process`.
fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

/// Reads the `process_*` series from `/proc`, just before a scrape.
/// `process_cpu_seconds_total` counts whole seconds: the facade's counters
/// are integers.
pub fn process() {
    process_collector().collect();
}

/// A destination's series of its attempts, looked up once per delivery
/// context: `counter!` with a `destination` label allocates the label and
/// finds the series in the registry on every call, three times per attempt.
pub struct Delivery {
    destination: String,
    delivered: Counter,
    dead_letter_write_failures: Counter,
    duration: Histogram,
    /// By outcome (its `Fixed::ordinal`), each made at its first use, so
    /// that `/metrics` lists only outcomes that happened.
    attempts: [OnceLock<Counter>; FIXED_MAX],
}

impl Delivery {
    pub fn new(destination: &str) -> Delivery {
        Delivery {
            destination: destination.to_string(),
            delivered: counter!(DELIVERED, "destination" => destination.to_string()),
            dead_letter_write_failures: counter!(DEAD_LETTER_WRITE_FAILURES, "destination" => destination.to_string()),
            duration: histogram!(DURATION, "destination" => destination.to_string()),
            attempts: [const { OnceLock::new() }; FIXED_MAX],
        }
    }

    pub fn attempt(&self, outcome: impl Fixed, took: Duration, events: u64) {
        let name = outcome.name();
        let series =
            || counter!(ATTEMPTS, "destination" => self.destination.clone(), "outcome" => name);
        match self.attempts.get(outcome.ordinal()) {
            Some(cached) => cached.get_or_init(series).increment(events),
            None => series().increment(events),
        }
        self.duration.record(took.as_secs_f64());
    }

    pub fn delivered(&self, n: u64) {
        self.delivered.increment(n);
    }

    pub fn dead_letter_write_failed(&self) {
        self.dead_letter_write_failures.increment(1);
    }
}

/// A destination's series of its passthrough attempts, told apart from
/// durable ones by `mode` (durable series keep docs/http-api.md's labels,
/// without it). Looked up once per delivery context, as [`Delivery`]'s are
/// (found at each attempt, they were ~1.2 µs of a passthrough request's
/// CPU, benches/RESULTS.md); each made at its first use, so a durable
/// destination lists none.
pub struct PassthroughAttempts {
    destination: String,
    duration: OnceLock<Histogram>,
    attempts: [OnceLock<Counter>; FIXED_MAX],
}

impl PassthroughAttempts {
    pub fn new(destination: &str) -> PassthroughAttempts {
        PassthroughAttempts {
            destination: destination.to_string(),
            duration: OnceLock::new(),
            attempts: [const { OnceLock::new() }; FIXED_MAX],
        }
    }

    pub fn attempt(&self, outcome: impl Fixed, took: Duration) {
        let name = outcome.name();
        let series = || counter!(ATTEMPTS, "destination" => self.destination.clone(), "outcome" => name, "mode" => "passthrough");
        match self.attempts.get(outcome.ordinal()) {
            Some(cached) => cached.get_or_init(series).increment(1),
            None => series().increment(1),
        }
        self.duration
            .get_or_init(|| histogram!(DURATION, "destination" => self.destination.clone(), "mode" => "passthrough"))
            .record(took.as_secs_f64());
    }
}

pub fn dead_lettered(destination: &str, reason: &'static str) {
    counter!(DEAD_LETTERED, "destination" => destination.to_string(), "reason" => reason)
        .increment(1);
}

pub fn replayed(destination: &str, n: u64) {
    counter!(REPLAYED, "destination" => destination.to_string()).increment(n);
}

pub fn dropped(destination: &str, reason: &'static str) {
    counter!(DROPPED, "destination" => destination.to_string(), "reason" => reason).increment(1);
}

pub fn rejected(destination: &str, reason: &'static str) {
    counter!(REJECTED, "destination" => destination.to_string(), "reason" => reason).increment(1);
}

/// One request to the store of URL `store`; `result` is `ok`, `error`,
/// `not_found` or `exists` (a conditional create that lost).
pub fn object_store_request(store: &str, op: &'static str, result: &'static str) {
    counter!(OBJECT_STORE_REQUESTS, "store" => store.to_string(), "op" => op, "result" => result)
        .increment(1);
}

/// Events handed off (`written`) or adopted (`adopted`).
pub fn handoff_events(direction: &'static str, n: u64) {
    counter!(HANDOFF_EVENTS, "direction" => direction).increment(n);
}

/// What the last look at the hand-off store found waiting.
pub fn handoff_waiting(objects: usize, oldest: Duration) {
    gauge!(HANDOFF_PENDING_OBJECTS).set(objects as f64);
    gauge!(HANDOFF_OLDEST_AGE).set(oldest.as_secs_f64());
}

/// Event history's size (docs/history.md): records retained, bytes on disk.
pub fn history(records: u64, bytes: u64) {
    gauge!(HISTORY_RECORDS).set(records as f64);
    gauge!(HISTORY_BYTES).set(bytes as f64);
}

/// Tracing is on: its series start at 0.
pub fn tracing_on() {
    counter!(TRACE_SPANS_DROPPED).increment(0);
    counter!(TRACE_EXPORT_FAILURES).increment(0);
}

pub fn trace_span_dropped() {
    counter!(TRACE_SPANS_DROPPED).increment(1);
}

pub fn trace_export_failed() {
    counter!(TRACE_EXPORT_FAILURES).increment(1);
}

pub fn http_panic(listener: &'static str) {
    counter!(PANICS, "listener" => listener).increment(1);
}

pub fn connection_refused(listener: &'static str) {
    counter!(CONNECTIONS_REFUSED, "listener" => listener).increment(1);
}

/// Runs for the process's life: there is one recorder, never uninstalled.
async fn upkeep(handle: PrometheusHandle) {
    let mut every = tokio::time::interval(UPKEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        handle.run_upkeep();
    }
}

/// `courier_journal_sync_duration_seconds`, kept by the journal's writer.
pub fn journal_sync() -> Histogram {
    histogram!(SYNC)
}

pub fn deduplicated(destination: &str) {
    counter!(DEDUPLICATED, "destination" => destination.to_string()).increment(1);
}

/// Labelled by `topic`, not `destination`: no destination is involved.
pub fn unmatched(topic: &str, n: u64) {
    counter!(UNMATCHED, "topic" => topic.to_string()).increment(n);
}

pub fn dedupe_evicted() {
    counter!(DEDUPE_EVICTED).increment(1);
}

pub fn corrupt(destination: &str) {
    counter!(CORRUPT, "destination" => destination.to_string()).increment(1);
}

/// Gauges read from the journal's counters just before a scrape.
pub fn pending(destination: &str, events: u64, bytes: u64, probation: bool) {
    gauge!(PENDING, "destination" => destination.to_string()).set(events as f64);
    gauge!(JOURNAL_BYTES, "destination" => destination.to_string()).set(bytes as f64);
    gauge!(PROBATION, "destination" => destination.to_string()).set(if probation {
        1.0
    } else {
        0.0
    });
}

/// Why a destination may be paused, the values of `PAUSED`'s `by` label:
/// each has its series, 1 for the cause in force, so that none vanishes.
pub const PAUSE_CAUSES: [&str; 3] = ["operator", "gone", "retry_after"];

/// Read from the destination's health just before a scrape; `by` is one of
/// [`PAUSE_CAUSES`], or `None` when it is not paused.
pub fn paused(destination: &str, by: Option<&str>) {
    for cause in PAUSE_CAUSES {
        let on = if by == Some(cause) { 1.0 } else { 0.0 };
        gauge!(PAUSED, "destination" => destination.to_string(), "by" => cause).set(on);
    }
}

/// The limits in force on the journal's pending bytes, just before a
/// scrape: `journal.max_bytes`, and each configured destination's share.
pub fn journal_max_bytes(bytes: u64) {
    gauge!(JOURNAL_MAX_BYTES).set(bytes as f64);
}

pub fn max_pending_bytes(destination: &str, bytes: u64) {
    gauge!(MAX_PENDING_BYTES, "destination" => destination.to_string()).set(bytes as f64);
}

/// Set for `url: per_event` destinations only: endpoints by state.
pub fn endpoints(destination: &str, states: [(&'static str, usize); 4]) {
    for (state, n) in states {
        gauge!(ENDPOINTS, "destination" => destination.to_string(), "state" => state).set(n as f64);
    }
}

/// At zero from the start for `url: per_event` destinations, so that an
/// alert's `increase()` sees the first.
pub fn endpoint_disabled(destination: &str, n: u64) {
    counter!(ENDPOINT_DISABLED, "destination" => destination.to_string()).increment(n);
}

/// Set for destinations with an ordering key only.
pub fn ordering_lanes_blocked(destination: &str, lanes: usize) {
    gauge!(ORDERING_LANES_BLOCKED, "destination" => destination.to_string()).set(lanes as f64);
}

/// A destination's concurrency limit, set by its owner when it changes.
pub fn concurrency_limit(destination: &str) -> Gauge {
    gauge!(CONCURRENCY_LIMIT, "destination" => destination.to_string())
}

/// 0 rather than absent when nothing is pending: the series stays, so
/// that an alert on it neither vanishes nor needs `absent()`.
pub fn oldest_pending_age(destination: &str, age: Duration) {
    gauge!(OLDEST_PENDING_AGE, "destination" => destination.to_string()).set(age.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two outcomes with a cached series and one past `FIXED_MAX`.
    #[derive(Clone, Copy)]
    enum Outcome {
        Delivered,
        Busy,
        Rare,
    }

    impl Fixed for Outcome {
        fn name(self) -> &'static str {
            match self {
                Outcome::Delivered => "Delivered",
                Outcome::Busy => "Busy",
                Outcome::Rare => "Rare",
            }
        }

        fn ordinal(self) -> usize {
            match self {
                Outcome::Rare => FIXED_MAX,
                o => o as usize,
            }
        }
    }

    #[test]
    fn delivery_handles_count_in_the_destinations_series_and_list_only_outcomes_that_happened() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let d = metrics::with_local_recorder(&recorder, || Delivery::new("orders"));
        let text = handle.render();
        assert!(
            !text.contains(ATTEMPTS),
            "an outcome that never happened is listed:\n{text}"
        );
        metrics::with_local_recorder(&recorder, || {
            d.attempt(Outcome::Busy, Duration::from_millis(3), 2);
            d.attempt(Outcome::Busy, Duration::from_millis(5), 1);
            d.attempt(Outcome::Delivered, Duration::from_millis(1), 1);
            d.attempt(Outcome::Rare, Duration::from_millis(1), 1);
            d.attempt(Outcome::Rare, Duration::from_millis(1), 1);
            d.delivered(1);
        });
        let text = handle.render();
        for line in [
            r#"courier_delivery_attempts_total{destination="orders",outcome="Busy"} 3"#,
            r#"courier_delivery_attempts_total{destination="orders",outcome="Delivered"} 1"#,
            r#"courier_delivery_attempts_total{destination="orders",outcome="Rare"} 2"#,
            r#"courier_events_delivered_total{destination="orders"} 1"#,
            r#"courier_delivery_duration_seconds_count{destination="orders"} 5"#,
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }

    #[test]
    fn passthrough_handles_count_with_their_mode_and_list_nothing_before_an_attempt() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let p = metrics::with_local_recorder(&recorder, || PassthroughAttempts::new("quotes"));
        let text = handle.render();
        assert!(
            !text.contains(ATTEMPTS) && !text.contains(DURATION),
            "a passthrough series listed before any attempt:\n{text}"
        );
        metrics::with_local_recorder(&recorder, || {
            p.attempt(Outcome::Busy, Duration::from_millis(3));
            p.attempt(Outcome::Busy, Duration::from_millis(5));
            p.attempt(Outcome::Rare, Duration::from_millis(1));
        });
        let text = handle.render();
        for line in [
            r#"courier_delivery_attempts_total{destination="quotes",outcome="Busy",mode="passthrough"} 2"#,
            r#"courier_delivery_attempts_total{destination="quotes",outcome="Rare",mode="passthrough"} 1"#,
            r#"courier_delivery_duration_seconds_count{destination="quotes",mode="passthrough"} 3"#,
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }
}
