//! One event's turn: attempt it (or expire it), then record the verdict —
//! delete when delivered, reschedule with the next due time, or write the
//! dead letter and only then delete.

use super::health::{Health, PauseReason};
use super::request;
use super::stack::{AttemptService, Attempted, LateAnswer};
use crate::admin::metrics;
use crate::clock;
use crate::config::DestinationSettings;
use crate::deadletter::{DeadLetterSink, Facts, record};
use crate::journal::{Change, Journal, JournalError, StoredEvent};
use crate::policy::schedule::jittered;
use crate::policy::{Next, Outcome, Reason, Verdict};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;

/// How long a dead letter that could not be written waits before the next try.
const SINK_RETRY: Duration = Duration::from_secs(5);
/// How long a settled outcome keeps trying to reach the journal or the sink
/// before its event is left for the next start.
const PERSIST_FOR: Duration = Duration::from_secs(600);

pub struct Ctx {
    pub dest: Arc<DestinationSettings>,
    pub journal: Journal,
    pub sink: Option<Arc<dyn DeadLetterSink>>,
    pub stack: AttemptService,
    pub health: Arc<Health>,
    pub late: LateCompleted,
}

/// `false` when the journal refused the change: the event must stay out of
/// this process's dispatch (it is retried after a restart).
/// `probe`: this attempt is the one probe after a probation; if no attempt
/// is made after all, another event may probe.
pub async fn run(ctx: &Arc<Ctx>, ev: StoredEvent, probe: bool) -> bool {
    let no_attempt = || {
        if probe {
            ctx.health.probe_cancelled();
        }
    };
    if ctx.late.take(ev.seq) {
        no_attempt();
        return true;
    }
    if ctx
        .dest
        .limits
        .expired(ev.event.accepted_ms, clock::now_ms())
    {
        no_attempt();
        return expire(ctx, ev).await;
    }
    let request = match request::build(&ctx.dest, &ev) {
        Ok(r) => r,
        Err(e) => {
            no_attempt();
            // Only a row edited by hand gets here: ingress stores valid requests.
            tracing::error!(destination = %ctx.dest.name, id = %ev.event.id, error = %e, "stored request cannot be rebuilt; quarantining it");
            return apply(ctx, vec![Change::Quarantine { seq: ev.seq }]).await;
        }
    };
    ctx.health.in_flight.fetch_add(1, Ordering::Relaxed);
    let Ok(attempted) = ctx.stack.clone().oneshot(request).await;
    ctx.health.in_flight.fetch_sub(1, Ordering::Relaxed);
    settle(ctx, ev, attempted, probe).await
}

/// Dead-letters an event whose TTL ran out before its next attempt. One
/// held back by probation says so in `lastDeliveryOutcome`, as in Event Grid.
pub async fn expire(ctx: &Ctx, ev: StoredEvent) -> bool {
    let outcome = if ctx.health.on_probation() {
        Outcome::Probation.as_str().to_string()
    } else {
        // Never attempted: courier held it back the whole time.
        ev.last_outcome
            .clone()
            .unwrap_or_else(|| Outcome::Probation.as_str().into())
    };
    let facts = Facts {
        reason: Reason::TimeToLiveExceeded,
        attempts: ev.attempts,
        last_outcome: &outcome,
        last_status: ev.last_status,
        last_attempt_ms: ev.last_attempt_ms,
    };
    dead_letter(ctx, &ev, &facts).await
}

async fn settle(ctx: &Arc<Ctx>, ev: StoredEvent, mut a: Attempted, probe: bool) -> bool {
    let dest = &ctx.dest;
    let attempts = ev.attempts + 1;
    let outcome = a.classified.outcome.as_str();
    let now = clock::now_ms();
    metrics::attempt(&dest.name, outcome, a.took, 1);
    // A Retry-After on 429 or 503 holds the whole destination, not just this event.
    let hold = a
        .retry_after
        .filter(|_| matches!(a.status, Some(429 | 503)));
    if let Some(until) = ctx.health.record(a.classified.outcome, hold, probe) {
        tracing::warn!(destination = %dest.name, outcome, until = %clock::rfc3339(until), "endpoint on probation: no attempts until then, then one probe");
    }
    tracing::debug!(destination = %dest.name, id = %ev.event.id, attempt = attempts, outcome, status = ?a.status, error = ?a.error, "attempt");
    let retry_at = |min_delay: Duration| {
        let base = dest.schedule.delay_before(attempts + 1).max(min_delay);
        let delay = jittered(base, dest.jitter, &mut rand::rng()).max(min_delay);
        now + delay.as_millis() as u64
    };
    let next = match a.classified.verdict {
        Verdict::Delivered => {
            metrics::delivered(&dest.name, 1);
            return apply(ctx, vec![delete(&ev)]).await;
        }
        Verdict::DeadLetter => Next::DeadLetter(Reason::NonRetriableStatus),
        // The receiver asks to be disabled: pause the destination; its
        // events wait (this one due again at once) and expire only at TTL.
        Verdict::Pause => {
            tracing::warn!(destination = %dest.name, "endpoint answered 410 Gone: destination paused until resumed");
            ctx.health.pause(PauseReason::Gone);
            let deadline = dest.limits.deadline(ev.event.accepted_ms);
            if now >= deadline {
                Next::ExpireAt(deadline)
            } else {
                Next::RetryAt(now)
            }
        }
        Verdict::Retry { min_delay } => {
            dest.limits
                .after_failure(attempts, ev.event.accepted_ms, retry_at(min_delay))
        }
    };
    match next {
        Next::RetryAt(due) | Next::ExpireAt(due) => {
            let change = Change::Reschedule {
                seq: ev.seq,
                attempts,
                next_due_ms: due,
                outcome,
                status: a.status,
                attempt_ms: now,
            };
            let kept = apply(ctx, vec![change]).await;
            if kept && let Some(late) = a.late.take() {
                watch_late_answer(ctx, ev, attempts, late);
            }
            kept
        }
        Next::DeadLetter(reason) => {
            let facts = Facts {
                reason,
                attempts,
                last_outcome: outcome,
                last_status: a.status,
                last_attempt_ms: Some(now),
            };
            dead_letter(ctx, &ev, &facts).await
        }
    }
}

fn delete(ev: &StoredEvent) -> Change {
    delete_if(ev, None)
}

fn delete_if(ev: &StoredEvent, only_if_attempts: Option<u32>) -> Change {
    Change::Delete {
        seq: ev.seq,
        destination: ev.event.destination.clone(),
        size: ev.event.size(),
        only_if_attempts,
    }
}

/// Event Grid's late answers: the attempt timed out and the event was
/// rescheduled, but a success that still arrives within the window
/// completes it, and its retry is cancelled if it has not gone out yet.
fn watch_late_answer(ctx: &Arc<Ctx>, ev: StoredEvent, attempts: u32, late: LateAnswer) {
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let Ok(status) = late.await else { return };
        if ctx.dest.status.classify_status(status, None).verdict != Verdict::Delivered {
            return;
        }
        ctx.late.mark(ev.seq);
        let change = delete_if(&ev, Some(attempts));
        if ctx.journal.apply(vec![change]).await.is_ok() {
            tracing::info!(destination = %ctx.dest.name, id = %ev.event.id, status, "late answer: delivered after its timeout; retry cancelled");
            metrics::delivered(&ctx.dest.name, 1);
        }
    });
}

/// Events completed by a late answer, so that a retry already read from
/// the journal does not go out. Entries are dropped when consumed, or after
/// an hour (the retry went out before the answer, or never will).
#[derive(Default)]
pub struct LateCompleted {
    seqs: Mutex<HashMap<i64, std::time::Instant>>,
}

impl LateCompleted {
    fn mark(&self, seq: i64) {
        let mut seqs = self.seqs.lock().unwrap_or_else(|p| p.into_inner());
        seqs.retain(|_, at| at.elapsed() < Duration::from_secs(3600));
        seqs.insert(seq, std::time::Instant::now());
    }

    fn take(&self, seq: i64) -> bool {
        self.seqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&seq)
            .is_some()
    }
}

/// Records `changes`, waiting out a full disk or queue: the event is held
/// meanwhile (neither re-sent nor lost). `false` after a lasting failure:
/// the event stays pending in the journal and is taken up after a restart.
async fn apply(ctx: &Ctx, changes: Vec<Change>) -> bool {
    let mut wait = Duration::from_millis(100);
    let give_up = tokio::time::Instant::now() + PERSIST_FOR;
    loop {
        match ctx.journal.apply(changes.clone()).await {
            Ok(()) => return true,
            Err(e @ (JournalError::DiskFull | JournalError::Busy))
                if tokio::time::Instant::now() < give_up =>
            {
                tracing::warn!(destination = %ctx.dest.name, error = %e, "journal cannot record a delivery update yet; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                tracing::error!(destination = %ctx.dest.name, error = %e, "journal refused a delivery update; the event stays pending until restart");
                return false;
            }
        }
    }
}

/// Writes the dead letter durably, then deletes the event. Without a sink
/// the event is dropped and counted.
async fn dead_letter(ctx: &Ctx, ev: &StoredEvent, facts: &Facts<'_>) -> bool {
    let dest = &ctx.dest.name;
    let reason = facts.reason.as_str();
    match &ctx.sink {
        None => {
            tracing::warn!(destination = %dest, id = %ev.event.id, reason, "no dead-letter sink: event dropped");
            metrics::dropped(dest, reason);
        }
        Some(sink) => {
            let line = record(ctx.dest.schema, &ev.event, facts);
            let day = clock::rfc3339(clock::now_ms())[..10].to_string();
            let give_up = tokio::time::Instant::now() + PERSIST_FOR;
            loop {
                let (sink, name, day, line) =
                    (sink.clone(), dest.clone(), day.clone(), line.clone());
                let error =
                    match tokio::task::spawn_blocking(move || sink.write(&name, &day, &[line]))
                        .await
                    {
                        Ok(Ok(())) => break,
                        Ok(Err(e)) => e.to_string(),
                        Err(e) => e.to_string(),
                    };
                // The event stays in the journal and is not sent again: only
                // the dead letter is retried.
                if tokio::time::Instant::now() >= give_up {
                    tracing::error!(destination = %dest, id = %ev.event.id, error, "cannot write the dead letter; the event stays pending until restart");
                    return false;
                }
                tracing::error!(destination = %dest, id = %ev.event.id, error, "cannot write the dead letter; retrying");
                tokio::time::sleep(SINK_RETRY).await;
            }
            tracing::info!(destination = %dest, id = %ev.event.id, reason, attempts = facts.attempts, "dead-lettered");
            metrics::dead_lettered(dest, reason);
        }
    }
    apply(ctx, vec![delete(ev)]).await
}
