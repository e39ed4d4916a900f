//! One attempt's turn — one event, or a batch of them — then the verdict
//! for each event: delete when delivered, reschedule with the next due
//! time, or write the dead letter and only then delete.
//!
//! A dead letter is written once, also across a crash. Its *fate* (all
//! its record says: reason, attempts, last outcome, dead-letter time) is
//! committed to the journal and synced first (`Change::DeadLetter`, in the
//! indexer's shared commits), then the record goes to the sink, then the
//! event is deleted. A restart that finds a fated event pending never
//! sends it again: it joins an expiry group, and the record is rebuilt
//! from the fate. Whether the sink already holds it (a crash between the
//! sink's sync and the delete) only the sink can tell: a journal commit
//! saying "written" would leave the same window before it. So that write
//! asks the sink first, by key (journal seq, id, dead-letter time), in the
//! day files those times name; a write retried after a failure asks too,
//! as it may have reached the sink in part. The fate is synced before the
//! write so that a power loss cannot keep the record and lose the fate.
//!
//! A batch is all or nothing: the attempt's outcome applies to every event
//! in it, while `max_attempts` and `event_ttl` still end each event on its
//! own. Its retries keep the batch id, so the same events go out together
//! under the same `webhook-id`; an event that leaves (dead-lettered, or
//! waiting for its TTL) leaves the batch.

use super::health::{Health, PauseReason};
use super::limit::Limit;
use super::outcome_log::{self, Confirmed};
use super::request;
use super::sink_streak::{Say, SinkStreak};
use super::slots::Slot;
use super::stack::{AttemptService, Attempted, LateAnswer, PassthroughService};
use crate::clock;
use crate::config::DestinationSettings;
use crate::deadletter::{self, DeadLetterSink, Facts, Key, Line, Written, record};
use crate::history::{Attempt, Step};
use crate::journal::{Change, Fate, Journal, JournalError, Pause, StoredEvent};
use crate::metrics;
use crate::policy::{Next, Outcome, Reason, Verdict};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;

/// A dead letter that could not be written waits this long before the
/// next try, doubled after each failure up to `SINK_RETRY_MAX`: a sink is
/// tried until it takes the record (a bucket may be down for an hour), the
/// events held in the journal meanwhile.
const SINK_RETRY: Duration = Duration::from_secs(1);
const SINK_RETRY_MAX: Duration = Duration::from_secs(30);
/// How long a settled outcome keeps trying to reach the journal before its
/// event is left for the next start.
const PERSIST_FOR: Duration = Duration::from_secs(600);

pub struct Ctx {
    pub dest: Arc<DestinationSettings>,
    pub journal: Journal,
    pub sink: Option<Arc<dyn DeadLetterSink>>,
    pub stack: AttemptService,
    /// For `mode: passthrough`: the same layers, handing the answer on.
    /// Built whatever the mode, so that a request admitted under the
    /// settings before a reload finds it under those after.
    pub passthrough: PassthroughService,
    pub health: Arc<Health>,
    /// Attempts that may be in flight, kept like `health` across reloads.
    pub limit: Arc<Limit>,
    /// Shared by every version of the context a reload makes, so that a
    /// late answer still cancels a retry read under the old one.
    pub late: Arc<LateCompleted>,
    /// Kept, like `late`, across the contexts a reload makes: a reload
    /// neither ends a streak nor logs its start again.
    pub sink_streak: Arc<Mutex<SinkStreak>>,
    pub metrics: metrics::Delivery,
}

impl Ctx {
    fn streak(&self) -> std::sync::MutexGuard<'_, SinkStreak> {
        self.sink_streak.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What one attempt carries.
pub struct Unit {
    pub events: Vec<StoredEvent>,
    /// `None`: one event, sent as without batching. `Some`: a batch under
    /// this id (its `webhook-id`), sent in the batch shape.
    pub batch: Option<String>,
}

/// How a unit's turn ended, for its dispatcher.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settled {
    /// `false` when the journal refused a change: the unit's events must
    /// stay out of this process's dispatch (they are retried after a restart).
    pub release: bool,
    /// Some event got a later due time: the index has news for the timer.
    pub rescheduled: bool,
}

impl Settled {
    pub fn done(release: bool) -> Self {
        Settled {
            release,
            rescheduled: false,
        }
    }
}

/// `probe`: this attempt is the one probe after a probation; if no attempt
/// is made after all, another unit may probe. `slot` is given back once
/// the answer is in and has told the destination's health (a Retry-After
/// hold, probation, a 410's pause), before the outcome is recorded.
pub async fn run(ctx: &Arc<Ctx>, unit: Unit, probe: bool, slot: Slot) -> Settled {
    let no_attempt = || {
        if probe {
            ctx.health.probe_cancelled();
        }
    };
    let Unit { events, batch } = unit;
    let now = clock::now_ms();
    let mut kept = true;
    let mut live = Vec::with_capacity(events.len());
    let mut expired = Vec::new();
    for ev in events {
        if ctx.late.take(ev.seq) {
            continue;
        }
        // Fated before a restart: its record is written as decided then.
        if ev.fate.is_some() || ctx.dest.limits.expired(ev.event.accepted_ms, now) {
            expired.push(ev);
            continue;
        }
        // Its attempts are used up: it waited out the late-answer window of
        // its last one (see `settle`), or a reload lowered `max_attempts`.
        if ev.attempts >= ctx.dest.limits.max_attempts {
            kept &= exhausted(ctx, ev).await;
            continue;
        }
        live.push(ev);
    }
    kept &= expire(ctx, expired).await;
    if live.is_empty() {
        no_attempt();
        return Settled::done(kept);
    }
    let built = match (&batch, live.as_slice()) {
        (Some(id), evs) => request::build_batch(&ctx.dest, evs, id),
        (None, [ev]) => request::build(&ctx.dest, ev),
        (None, _) => Err(request::BuildError::Empty),
    };
    let request = match built {
        Ok(r) => r,
        Err(e) => {
            no_attempt();
            // Only a row edited by hand gets here: ingress stores valid requests.
            tracing::error!(destination = %ctx.dest.name, id = %live[0].event.id, error = %e, "stored request cannot be rebuilt; quarantining it");
            let changes = live.iter().map(|ev| Change::Quarantine { seq: ev.seq });
            return Settled::done(apply(ctx, changes.collect(), Durable::Now).await && kept);
        }
    };
    let seqs = || live.iter().map(|ev| ev.seq);
    ctx.health.in_flight.fetch_add(1, Ordering::Relaxed);
    ctx.health.attempting(seqs(), true);
    let Ok(attempted) = ctx.stack.clone().oneshot(request).await;
    ctx.health.attempting(seqs(), false);
    ctx.health.in_flight.fetch_sub(1, Ordering::Relaxed);
    let settled = settle(ctx, live, batch, attempted, probe, slot).await;
    Settled {
        release: settled.release && kept,
        ..settled
    }
}

/// Dead-letters events whose TTL ran out before their next attempt, and
/// those a restart found fated, as one group: one sink write and sync,
/// then one journal change, so that a paused destination's backlog
/// expiring at once costs one fsync per group, not per event. One held
/// back by probation says so in `lastDeliveryOutcome`, as in Event Grid.
pub async fn expire(ctx: &Ctx, mut evs: Vec<StoredEvent>) -> bool {
    // Delivered after all, by a late answer to an attempt that timed out.
    evs.retain(|ev| !ctx.late.take(ev.seq));
    if evs.is_empty() {
        return true;
    }
    let probation = ctx.health.on_probation();
    let at_ms = clock::now_ms();
    let items: Vec<(&StoredEvent, Fate)> = evs
        .iter()
        .map(|ev| {
            let fate = ev.fate.clone().unwrap_or_else(|| Fate {
                reason: Reason::TimeToLiveExceeded,
                attempts: ev.attempts,
                last_outcome: match &ev.last_outcome {
                    Some(o) if !probation => o.clone(),
                    // Never attempted: courier held it back the whole time.
                    _ => Outcome::Probation.as_str().to_string(),
                },
                last_status: ev.last_status,
                last_attempt_ms: ev.last_attempt_ms,
                at_ms,
            });
            (ev, fate)
        })
        .collect();
    dead_letter(ctx, &items, None, None).await
}

/// Dead-letters an event with no attempt left, as its last attempt ended.
async fn exhausted(ctx: &Ctx, ev: StoredEvent) -> bool {
    let fate = Fate {
        reason: Reason::MaxDeliveryAttemptsExceeded,
        attempts: ev.attempts,
        last_outcome: ev
            .last_outcome
            .clone()
            .unwrap_or_else(|| Outcome::TimedOut.as_str().into()),
        last_status: ev.last_status,
        last_attempt_ms: ev.last_attempt_ms,
        at_ms: clock::now_ms(),
    };
    dead_letter(ctx, &[(&ev, fate)], None, ev.batch.as_deref()).await
}

async fn settle(
    ctx: &Arc<Ctx>,
    evs: Vec<StoredEvent>,
    batch: Option<String>,
    mut a: Attempted,
    probe: bool,
    slot: Slot,
) -> Settled {
    let dest = &ctx.dest;
    let n = evs.len() as u64;
    // The attempt's number, which picks the schedule's delay.
    let number = super::request::attempt_number(&evs);
    let outcome = a.classified.outcome.as_str();
    let now = clock::now_ms();
    ctx.metrics.attempt(a.classified.outcome, a.took, n);
    // A Retry-After on 429 or 503 holds the whole destination, not just
    // this attempt's events. A batch is one attempt for probation too.
    let hold = a
        .retry_after
        .filter(|_| matches!(a.status, Some(429 | 503)));
    // Unlike a busy endpoint, a failed handshake is a setup to fix (an
    // unknown CA, an expired or misnamed certificate, a refused client
    // certificate): its reason goes where operators look, once per streak.
    let tls_streak_starts = a.classified.outcome == Outcome::TlsError
        && ctx.health.view().last_outcome != Some(Outcome::TlsError);
    if let Some(until) = ctx.health.record(a.classified.outcome, hold, probe) {
        tracing::warn!(destination = %dest.name, outcome, until = %clock::rfc3339(until), "endpoint on probation: no attempts until then, then one probe");
    }
    // This attempt is no longer counted in flight; it was until its answer.
    let in_flight = ctx.health.in_flight.load(Ordering::Relaxed) + 1;
    ctx.limit.record(a.classified.outcome, a.took, in_flight);
    let id = batch.as_deref().unwrap_or(evs[0].event.id.as_str());
    tracing::debug!(destination = %dest.name, id = %id, events = n, attempt = number, outcome = %outcome, status = a.status, error = a.error.as_deref(), "attempt");
    if tls_streak_starts {
        tracing::warn!(destination = %dest.name, id = %id, attempt = number, error = a.error.as_deref(), "TLS handshake failed: check the endpoint's certificate and this destination's tls files");
    }
    let retry_at = |min_delay: Duration| {
        let wait = dest
            .schedule
            .retry_wait(number, min_delay, dest.jitter, &mut rand::rng());
        now + wait.as_millis() as u64
    };
    // What history keeps of it, numbered per event.
    let tried = Attempt {
        number,
        at_ms: now.saturating_sub(a.took.as_millis() as u64),
        took_ms: u32::try_from(a.took.as_millis()).unwrap_or(u32::MAX),
        status: a.status,
        outcome: a.classified.outcome,
        late: false,
    };
    let tried_by = |ev: &StoredEvent| Attempt {
        number: ev.attempts + 1,
        ..tried.clone()
    };
    let next: Box<dyn Fn(&StoredEvent) -> Next + Send + Sync> = match a.classified.verdict {
        Verdict::Delivered => {
            ctx.metrics.delivered(n);
            for ev in &evs {
                let (attempts, batch) = (ev.attempts + 1, batch.as_deref());
                outcome_log::delivered(ev, attempts, a.status, batch, Confirmed::InTime);
            }
            let changes = evs
                .iter()
                .map(|ev| {
                    let attempt = tried_by(ev);
                    delete(ev, Some(Step::Delivered { attempt }))
                })
                .collect();
            drop(slot);
            return Settled::done(apply(ctx, changes, Durable::Lazily).await);
        }
        Verdict::DeadLetter => Box::new(|_| Next::DeadLetter(Reason::NonRetriableStatus)),
        // The receiver asks to be disabled: pause the destination; its
        // events wait (these due again at once) and expire only at TTL.
        Verdict::Pause => {
            tracing::warn!(destination = %dest.name, "endpoint answered 410 Gone: destination paused until resumed");
            if ctx.health.pause(PauseReason::Gone, now) {
                record_gone(ctx, now).await;
            }
            Box::new(move |ev| {
                let deadline = dest.limits.deadline(ev.event.accepted_ms);
                if now >= deadline {
                    Next::ExpireAt(deadline)
                } else {
                    Next::RetryAt(now)
                }
            })
        }
        Verdict::Retry { min_delay } => {
            // One due time for the whole batch, so it stays together.
            let due = retry_at(min_delay);
            Box::new(move |ev| {
                dest.limits
                    .after_failure(ev.attempts + 1, ev.event.accepted_ms, due)
            })
        }
    };
    // Health knows the answer now (its hold, probation, a 410's pause): the
    // next attempt's gate sees it.
    drop(slot);
    // A last attempt that timed out may still be answered: its events wait
    // out the late-answer window instead of being dead-lettered now; a
    // success completes them, else they are dead-lettered when due.
    let late_until = a
        .late
        .is_some()
        .then(|| now + dest.late_answer_window.as_millis() as u64);
    let mut changes = Vec::new();
    let mut waiting = Vec::new();
    let mut dead = Vec::new();
    for ev in evs {
        let attempts = ev.attempts + 1;
        let (due, batch) = match (next(&ev), late_until) {
            (Next::RetryAt(due), _) => (due, batch.clone()),
            // Due only at its TTL, to be dead-lettered: out of the batch.
            (Next::ExpireAt(due), _) => (due, None),
            (Next::DeadLetter(Reason::MaxDeliveryAttemptsExceeded), Some(until)) => (until, None),
            (Next::DeadLetter(reason), _) => {
                dead.push((ev, reason));
                continue;
            }
        };
        changes.push(Change::Reschedule {
            seq: ev.seq,
            attempts,
            next_due_ms: due,
            outcome: a.classified.outcome,
            status: a.status,
            attempt_ms: now,
            took_ms: tried.took_ms,
            batch,
        });
        waiting.push((ev, attempts));
    }
    let mut kept = true;
    let rescheduled = !changes.is_empty();
    if rescheduled {
        kept = apply(ctx, changes, Durable::Lazily).await;
        if kept && let Some(late) = a.late.take() {
            watch_late_answer(ctx, waiting, batch.clone(), late);
        }
    }
    if !dead.is_empty() {
        let fates: Vec<(&StoredEvent, Fate)> = dead
            .iter()
            .map(|(ev, reason)| {
                let fate = Fate {
                    reason: *reason,
                    attempts: ev.attempts + 1,
                    last_outcome: outcome.to_string(),
                    last_status: a.status,
                    last_attempt_ms: Some(now),
                    at_ms: now,
                };
                (ev, fate)
            })
            .collect();
        kept &= dead_letter(ctx, &fates, Some(&tried), batch.as_deref()).await;
    }
    Settled {
        release: kept,
        rescheduled,
    }
}

/// A 410's pause, recorded so that a restart keeps it (the operator's is
/// recorded by the admin API before it answers).
async fn record_gone(ctx: &Ctx, since_ms: u64) {
    let pause = Pause {
        by: PauseReason::Gone.as_str().into(),
        since_ms,
    };
    if let Err(e) = ctx.journal.set_pause(&ctx.dest.name, Some(pause)).await {
        tracing::error!(destination = %ctx.dest.name, error = %e, "cannot record the 410's pause in the journal: a restart will resume this destination");
    }
}

fn delete(ev: &StoredEvent, step: Option<Step>) -> Change {
    Change::Delete {
        seq: ev.seq,
        only_if_attempts: None,
        step,
    }
}

/// Event Grid's late answers: the attempt timed out and its events were
/// rescheduled, but a success that still arrives within the window
/// completes them all (a batch is all or nothing), and their retry is
/// cancelled if it has not gone out yet.
fn watch_late_answer(
    ctx: &Arc<Ctx>,
    evs: Vec<(StoredEvent, u32)>,
    batch: Option<String>,
    late: LateAnswer,
) {
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let Ok(status) = late.await else { return };
        if ctx.dest.status.classify_status(status, None).verdict != Verdict::Delivered {
            return;
        }
        ctx.late.mark(evs.iter().map(|(ev, _)| ev.seq));
        let at_ms = clock::now_ms();
        let changes: Vec<Change> = evs
            .iter()
            .map(|(ev, attempts)| Change::Delete {
                seq: ev.seq,
                only_if_attempts: Some(*attempts),
                step: Some(Step::DeliveredLate {
                    number: *attempts,
                    status,
                    at_ms,
                }),
            })
            .collect();
        if ctx.journal.settle(&changes).await.is_ok() {
            for (ev, attempts) in &evs {
                let batch = batch.as_deref();
                outcome_log::delivered(ev, *attempts, Some(status), batch, Confirmed::Late);
            }
            ctx.metrics.delivered(evs.len() as u64);
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
    fn mark(&self, completed: impl Iterator<Item = i64>) {
        let mut seqs = self.seqs.lock().unwrap_or_else(|p| p.into_inner());
        seqs.retain(|_, at| at.elapsed() < Duration::from_secs(3600));
        let now = std::time::Instant::now();
        seqs.extend(completed.map(|seq| (seq, now)));
    }

    fn take(&self, seq: i64) -> bool {
        self.seqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&seq)
            .is_some()
    }
}

/// When a change must be durable.
#[derive(Clone, Copy)]
enum Durable {
    /// Before the caller goes on: a dead letter's delete, a quarantine.
    Now,
    /// Within the journal's sync interval: a delivery or a reschedule,
    /// which a crash only repeats.
    Lazily,
}

/// Records `changes`, waiting out a full disk or queue: the event is held
/// meanwhile (neither re-sent nor lost). `false` after a lasting failure:
/// the event stays pending in the journal and is taken up after a restart.
async fn apply(ctx: &Ctx, changes: Vec<Change>, durable: Durable) -> bool {
    let mut wait = Duration::from_millis(100);
    let give_up = tokio::time::Instant::now() + PERSIST_FOR;
    loop {
        let recorded = match durable {
            Durable::Now => ctx.journal.apply(&changes).await,
            Durable::Lazily => ctx.journal.settle(&changes).await,
        };
        match recorded {
            Ok(()) => return true,
            Err(e @ (JournalError::DiskFull | JournalError::Busy | JournalError::Strained(_)))
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

/// Writes the dead letters durably (one sink write for all of them), then
/// deletes the events. Without a sink the events are dropped and counted.
/// `tried`: the attempt that ended them, if one did, for history.
/// `batch`: the batch of this attempt, for the log (else each event's own).
async fn dead_letter(
    ctx: &Ctx,
    items: &[(&StoredEvent, Fate)],
    tried: Option<&Attempt>,
    batch: Option<&str>,
) -> bool {
    let dest = &ctx.dest.name;
    let mut ends: Vec<Option<Step>> = vec![None; items.len()];
    match &ctx.sink {
        None => {
            for ((ev, fate), end) in items.iter().zip(&mut ends) {
                outcome_log::dropped(ev, &fate.into(), batch.or(ev.batch.as_deref()));
                metrics::dropped(dest, fate.reason.as_str());
                *end = Some(Step::Dropped {
                    reason: fate.reason,
                    at_ms: fate.at_ms,
                    attempt: attempt_of(tried, fate),
                });
            }
        }
        Some(sink) => {
            if !record_fates(ctx, items, tried).await {
                return false;
            }
            let lines: Arc<[Line]> = items.iter().map(|(ev, fate)| line(ctx, ev, fate)).collect();
            // Fated before a restart: the record may be written already.
            let mut check = items.iter().any(|(ev, _)| ev.fate.is_some());
            let first = items.first().map_or("", |(ev, _)| ev.event.id.as_str());
            let mut wait = SINK_RETRY;
            // Until written (a stopped dispatcher's task is aborted): the
            // events stay in the journal and are not sent again; only the
            // dead letters are retried.
            loop {
                let (sink, name, lines) = (sink.clone(), dest.clone(), lines.clone());
                let error = match tokio::task::spawn_blocking(move || {
                    deadletter::write_once(sink.as_ref(), &name, &lines, check)
                })
                .await
                {
                    Ok(Ok(())) => break,
                    Ok(Err(e)) => e.to_string(),
                    Err(e) => e.to_string(),
                };
                ctx.metrics.dead_letter_write_failed();
                let message = "cannot write the dead letter; retrying";
                let (events, retry_s) = (items.len(), wait.as_secs());
                match ctx.streak().failed(tokio::time::Instant::now()) {
                    Say::Loud => {
                        tracing::error!(destination = %dest, id = %first, events, retry_s, error, "{message}");
                    }
                    Say::Remind(t) => {
                        tracing::error!(destination = %dest, id = %first, events, retry_s, error,
                            failures = t.failures, streak_s = t.lasted.as_secs(), "{message}");
                    }
                    Say::Quiet => {
                        tracing::debug!(destination = %dest, id = %first, events, retry_s, error, "{message}");
                    }
                }
                // A failed write may have reached the sink in part.
                check = true;
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(SINK_RETRY_MAX);
            }
            let ended = ctx.streak().written(tokio::time::Instant::now());
            if let Some(t) = ended {
                tracing::info!(destination = %dest, failures = t.failures, streak_s = t.lasted.as_secs(), "dead letters are written again");
            }
            for (ev, fate) in items {
                outcome_log::dead_lettered(ev, &fate.into(), batch.or(ev.batch.as_deref()));
                metrics::dead_lettered(dest, fate.reason.as_str());
            }
        }
    }
    let changes = items
        .iter()
        .zip(ends)
        .map(|((ev, _), end)| delete(ev, end))
        .collect();
    apply(ctx, changes, Durable::Now).await
}

/// Records the fates not recorded before a restart, before the sink sees
/// their records. `false`: the journal refused, and nothing is written.
async fn record_fates(ctx: &Ctx, items: &[(&StoredEvent, Fate)], tried: Option<&Attempt>) -> bool {
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
        text: record(ctx.dest.schema, &ev.event, &Facts::from(fate), &written),
    }
}
