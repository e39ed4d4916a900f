//! A dispatcher's dead-letter groups: events past their TTL, events an
//! attempt fated (their fates recorded already), and events a restart
//! found fated. Each group is one sink write and sync, then one journal
//! change deleting its events, so that a paused destination's backlog
//! expiring at once costs one fsync per group, not per event.
//!
//! A group runs as the dispatcher's task apart from its attempts: a sink
//! that is down (`deadletter::Writer` retries it) never holds a delivery
//! slot, and live events of the destination go out meanwhile.

use super::outcome_log;
use super::settle::{Ctx, Durable, apply, delete};
use super::verdict;
use crate::clock;
use crate::deadletter::{Key, Line, Writer, Written, record};
use crate::event::{Fate, StoredEvent};
use crate::history::{Attempt, Step};
use crate::journal::Change;
use crate::metrics;
use std::sync::Arc;

/// An event on its way to the sink.
#[derive(Debug)]
pub struct Doomed {
    pub ev: StoredEvent,
    /// The sink may hold its record already: it was fated before a restart
    /// (the crash may have come after the write). Asked of the sink first.
    pub check: bool,
}

impl Doomed {
    /// An event read from the journal, or taken from memory.
    pub fn read(ev: StoredEvent) -> Doomed {
        let check = ev.fate.is_some();
        Doomed { ev, check }
    }
}

/// Writes a group's dead letters durably, then deletes the events. `false`
/// when the journal refused a change: the events stay pending until a
/// restart.
pub async fn write(ctx: &Ctx, mut group: Vec<Doomed>) -> bool {
    // Delivered after all, by a late answer to an attempt that timed out.
    group.retain(|d| !ctx.late.take(d.ev.seq));
    if group.is_empty() {
        return true;
    }
    let probation = ctx.health.on_probation();
    let now = clock::now_ms();
    let check = group.iter().any(|d| d.check);
    let items: Vec<(StoredEvent, Fate)> = group
        .into_iter()
        .map(|d| {
            let fate = verdict::expired(&d.ev, probation, now);
            (d.ev, fate)
        })
        .collect();
    let Some(sink) = &ctx.sink else {
        return dropped(ctx, &items, None, None).await;
    };
    if !record_fates(ctx, &items, None).await {
        return false;
    }
    let lines: Arc<[Line]> = items.iter().map(|(ev, fate)| line(ctx, ev, fate)).collect();
    let failed = || ctx.metrics.dead_letter_write_failed();
    let writer = Writer {
        sink,
        destination: &ctx.dest.name,
        streak: &ctx.sink_streak,
        on_failure: &failed,
    };
    writer.write(lines, check).await;
    for (ev, fate) in &items {
        outcome_log::dead_lettered(ev, fate, ev.batch.as_deref());
        metrics::dead_lettered(&ctx.dest.name, fate.reason.as_str());
    }
    let changes = items.iter().map(|(ev, _)| delete(ev, None)).collect();
    apply(ctx, changes, Durable::Now).await
}

/// Events fated by their attempt (`tried`, for history) or by the attempts
/// they used up: without a sink dropped now; with one, their fates
/// recorded and the events handed back for a group (with `batch`, the
/// attempt's, for the log). `None` when the journal refused.
pub async fn fated(
    ctx: &Ctx,
    items: Vec<(StoredEvent, Fate)>,
    tried: Option<&Attempt>,
    batch: Option<&str>,
) -> Option<Vec<Doomed>> {
    if ctx.sink.is_none() {
        return dropped(ctx, &items, tried, batch).await.then(Vec::new);
    }
    if !record_fates(ctx, &items, tried).await {
        return None;
    }
    let doomed = items
        .into_iter()
        .map(|(mut ev, fate)| {
            ev.fate = Some(fate);
            if let Some(b) = batch {
                ev.batch = Some(b.to_string());
            }
            Doomed { ev, check: false }
        })
        .collect();
    Some(doomed)
}

/// Deletes events that have no sink to go to, counted and logged.
async fn dropped(
    ctx: &Ctx,
    items: &[(StoredEvent, Fate)],
    tried: Option<&Attempt>,
    batch: Option<&str>,
) -> bool {
    let dest = &ctx.dest.name;
    let changes = items
        .iter()
        .map(|(ev, fate)| {
            outcome_log::dropped(ev, fate, batch.or(ev.batch.as_deref()));
            metrics::dropped(dest, fate.reason.as_str());
            let step = Step::Dropped {
                reason: fate.reason,
                at_ms: fate.at_ms,
                attempt: attempt_of(tried, fate),
            };
            delete(ev, Some(step))
        })
        .collect();
    apply(ctx, changes, Durable::Now).await
}

/// Records the fates not recorded yet, before the sink sees their records,
/// so that a restart writes the same record (or finds it written) instead
/// of deciding again. `false`: the journal refused, and nothing is written.
async fn record_fates(ctx: &Ctx, items: &[(StoredEvent, Fate)], tried: Option<&Attempt>) -> bool {
    let changes: Vec<Change> = items
        .iter()
        .filter(|(ev, _)| ev.fate.is_none())
        .map(|(ev, fate)| Change::DeadLetter {
            seq: ev.seq,
            fate: fate.clone(),
            attempt: attempt_of(tried, fate),
        })
        .collect();
    changes.is_empty() || apply(ctx, changes, Durable::Now).await
}

/// The attempt that ended an event, as the event counts it (its fate's
/// count: a batch's events may have different counts).
fn attempt_of(tried: Option<&Attempt>, fate: &Fate) -> Option<Attempt> {
    tried.map(|a| Attempt {
        number: fate.attempts,
        ..a.clone()
    })
}

/// An event's record, under its key.
fn line(ctx: &Ctx, ev: &StoredEvent, fate: &Fate) -> Line {
    let written = Written {
        at_ms: fate.at_ms,
        seq: ev.seq,
        redact: &ctx.dest.redact_headers,
    };
    Line {
        key: Key {
            seq: ev.seq,
            id: ev.event.id.clone(),
            at_ms: fate.at_ms,
        },
        text: record(ctx.dest.schema, &ev.event, fate, &written),
    }
}
