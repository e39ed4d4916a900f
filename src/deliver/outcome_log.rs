//! The one log line per final outcome of an event (docs/logs.md): `delivered`, `dead-lettered` or `dropped`, each a fixed
//! message so operators can grep for it, with the same fields:
//! `destination`, `id`, `attempts`, the last `status` (left out when the
//! last attempt got no answer, or there was none), `outcome`,
//! `since_accept_ms`, and `batch` when the last attempt was a batch. A
//! batch of N events ends N events, so it gives N lines: each event's id
//! can be found with one grep, whether or not it went in a batch.
//!
//! A passthrough request gives one `passed through` line, with `mode`.
//!
//! Never a header; the body only with `log.bodies` and only on the lines
//! of events given up (`dead-lettered`, `dropped`), where it helps.

use crate::clock;
use crate::event::{Fate, Outcome, StoredEvent};
use crate::logging;

/// How a delivery was confirmed.
pub(super) enum Confirmed {
    /// By the attempt's own answer.
    InTime,
    /// By an answer that came after the attempt's timeout, within
    /// `late_answer_window`.
    Late,
}

/// `attempts` counts the attempt that succeeded.
pub(super) fn delivered(
    ev: &StoredEvent,
    attempts: u32,
    status: Option<u16>,
    batch: Option<&str>,
    confirmed: Confirmed,
) {
    let late = matches!(confirmed, Confirmed::Late).then_some(true);
    tracing::info!(
        destination = %ev.event.destination,
        id = %ev.event.id,
        attempts,
        status,
        outcome = %Outcome::Delivered.as_str(),
        since_accept_ms = since_accept(ev),
        batch,
        late,
        "delivered"
    );
}

/// The line of an event given up: the same fields at `info` or `warn`
/// (tracing's level must be known where the event is written).
macro_rules! given_up {
    ($level:expr, $message:literal, $ev:expr, $facts:expr, $batch:expr) => {{
        let (ev, facts) = ($ev, $facts);
        let body = logging::body(&ev.event.body);
        tracing::event!(
            $level,
            destination = %ev.event.destination,
            id = %ev.event.id,
            attempts = facts.attempts,
            status = facts.last_status,
            outcome = %facts.last_outcome.as_str(),
            reason = %facts.reason.as_str(),
            since_accept_ms = since_accept(ev),
            batch = $batch,
            body = body.as_deref(),
            $message
        )
    }};
}

pub(super) fn dead_lettered(ev: &StoredEvent, facts: &Fate, batch: Option<&str>) {
    given_up!(tracing::Level::INFO, "dead-lettered", ev, facts, batch);
}

/// Given up with no dead-letter sink: the event is gone, hence `warn`.
pub(super) fn dropped(ev: &StoredEvent, facts: &Fate, batch: Option<&str>) {
    given_up!(tracing::Level::WARN, "dropped", ev, facts, batch);
}

/// The line of a passthrough request, whatever its end: `status` is the
/// endpoint's answer handed to the app (left out when there was none, and
/// the app got a 502 or 504), `took_ms` the time the app waited on it.
pub(super) fn passed_through(
    destination: &str,
    id: &str,
    attempts: u32,
    status: Option<u16>,
    outcome: Outcome,
    took: std::time::Duration,
) {
    tracing::info!(
        destination,
        id,
        mode = "passthrough",
        attempts,
        status,
        outcome = %outcome.as_str(),
        took_ms = took.as_millis() as u64,
        "passed through"
    );
}

fn since_accept(ev: &StoredEvent) -> u64 {
    clock::now_ms().saturating_sub(ev.event.accepted_ms)
}
