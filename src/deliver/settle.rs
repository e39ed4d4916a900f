//! One attempt's turn (one event, or a batch of them), then each event's
//! end as `verdict` decides it: deleted when delivered, rescheduled with
//! the next due time, or fated for the dead-letter sink.
//!
//! A dead letter is written once, also across a crash. Its *fate* (all
//! its record says: reason, attempts, last outcome, dead-letter time) is
//! committed to the journal and synced here (`Change::DeadLetter`), before
//! the attempt's slot is free for the next event's turn; the record is
//! written by the dispatcher's dead-letter groups (`letters`), then the
//! event is deleted. A restart that finds a fated event pending never
//! sends it again: it joins a group, and the record is rebuilt from the
//! fate. Whether the sink already holds it (a crash between the sink's
//! sync and the delete) only the sink can tell: a journal commit saying
//! "written" would leave the same window before it. So that write asks
//! the sink first, by key (journal seq, id, dead-letter time), in the day
//! files those times name; a write retried after a failure asks too, as
//! it may have reached the sink in part. The fate is synced before the
//! write so that a power loss cannot keep the record and lose the fate.
//!
//! A batch is all or nothing: the attempt's outcome applies to every event
//! in it, while `max_attempts` and `event_ttl` still end each event on its
//! own. Its retries keep the batch id, so the same events go out together
//! under the same `webhook-id`; an event that leaves (dead-lettered, or
//! waiting for its TTL) leaves the batch.

use super::disabling;
use super::endpoints::{Ended, Endpoints, Said};
use super::health::{Health, PauseReason};
use super::letters::{self, Doomed};
use super::limit::Limit;
use super::outcome_log::{self, Confirmed};
use super::request;
use super::slots::Slot;
use super::stack::{AttemptService, Attempted, LateAnswer, PassthroughService};
use super::verdict::{self, Answered, End};
use crate::clock;
use crate::config::DestinationSettings;
use crate::deadletter::{DeadLetterSink, SinkStreak};
use crate::event::{Fate, Outcome, StoredEvent, endpoint};
use crate::history::{Attempt, Step};
use crate::journal::{Change, Journal, JournalError, Pause};
use crate::metrics;
use crate::policy::Verdict;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;

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
    /// `url: per_event`: each endpoint's health and attempts in flight,
    /// kept like `health` across reloads.
    pub endpoints: Option<Arc<Endpoints>>,
    /// Attempts that may be in flight, kept like `health` across reloads.
    pub limit: Arc<Limit>,
    /// Shared by every version of the context a reload makes, so that a
    /// late answer still cancels a retry read under the old one.
    pub late: Arc<LateCompleted>,
    /// Kept, like `late`, across the contexts a reload makes: a reload
    /// neither ends a streak nor logs its start again.
    pub sink_streak: Arc<Mutex<SinkStreak>>,
    pub metrics: metrics::Delivery,
    /// The series of `mode: passthrough`'s attempts, found once.
    pub passthrough_attempts: Arc<metrics::PassthroughAttempts>,
}

/// What one attempt carries.
pub struct Unit {
    pub events: Vec<StoredEvent>,
    /// `None`: one event, sent as without batching. `Some`: a batch under
    /// this id (its `webhook-id`), sent in the batch shape.
    pub batch: Option<String>,
    /// `url: per_event`: the endpoint's turn, whose health the answer
    /// tells instead of the destination's.
    pub endpoint: Option<EndpointTurn>,
}

/// An attempt an endpoint let go (`Endpoints::start`): counted in flight
/// there until it ends, also when its task ends early (dropped).
pub struct EndpointTurn {
    pub endpoints: Arc<Endpoints>,
    pub origin: Arc<str>,
    pub probe: bool,
    done: bool,
}

impl EndpointTurn {
    pub fn new(endpoints: Arc<Endpoints>, origin: Arc<str>, probe: bool) -> EndpointTurn {
        EndpointTurn {
            endpoints,
            origin,
            probe,
            done: false,
        }
    }

    fn end(&mut self, outcome: Option<Outcome>, a: Option<&Attempted>, gone: bool) -> Said {
        self.done = true;
        self.endpoints.ended(
            &self.origin,
            Ended {
                outcome,
                status: a.and_then(|a| a.status),
                took: a.map_or(Duration::ZERO, |a| a.took),
                hold: a.and_then(hold_of),
                probe: self.probe,
                gone,
            },
        )
    }
}

impl Drop for EndpointTurn {
    fn drop(&mut self) {
        if !self.done {
            self.end(None, None, false);
        }
    }
}

/// A Retry-After on 429 or 503: it holds the endpoint, not just this
/// attempt's events.
fn hold_of(a: &Attempted) -> Option<Duration> {
    a.retry_after
        .filter(|_| matches!(a.status, Some(429 | 503)))
}

/// How a unit's turn ended, for its dispatcher.
#[derive(Debug, Default)]
pub struct Settled {
    /// `false` when the journal refused a change: the unit's events must
    /// stay out of this process's dispatch (they are retried after a restart).
    pub release: bool,
    /// Some event got a later due time: the index has news for the timer.
    pub rescheduled: bool,
    /// Events went back to the index for their endpoint's turn: news for
    /// the timer, but no attempt's answer.
    pub deferred: bool,
    /// Events for the dispatcher's dead-letter groups: still held, as
    /// their records are still to be written.
    pub doomed: Vec<Doomed>,
}

impl Settled {
    pub fn done(release: bool) -> Self {
        Settled {
            release,
            ..Settled::default()
        }
    }
}

/// `probe`: this attempt is the one probe after a probation; if no attempt
/// is made after all, another unit may probe. `slot` is given back once
/// the answer is in and has told the destination's health (a Retry-After
/// hold, probation, a 410's pause), before the outcome is recorded.
pub async fn run(ctx: &Arc<Ctx>, unit: Unit, probe: bool, slot: Slot) -> Settled {
    let Unit {
        events,
        batch,
        mut endpoint,
    } = unit;
    let unturned = endpoint.is_none();
    let mut no_attempt = || match endpoint.as_mut() {
        Some(turn) => {
            turn.end(None, None, false);
        }
        None if probe => ctx.health.probe_cancelled(),
        None => {}
    };
    let now = clock::now_ms();
    let mut out = Settled::done(true);
    let mut live = Vec::with_capacity(events.len());
    let mut exhausted = Vec::new();
    for ev in events {
        if ctx.late.take(ev.seq) {
            continue;
        }
        // Fated before a restart, or past its TTL: for the sink.
        if ev.fate.is_some() || ctx.dest.limits.expired(ev.event.accepted_ms, now) {
            out.doomed.push(Doomed::read(ev));
            continue;
        }
        // Its attempts are used up: it waited out the late-answer window of
        // its last one (see `settle`), or a reload lowered `max_attempts`.
        if ev.attempts >= ctx.dest.limits.max_attempts {
            let fate = verdict::exhausted(&ev, now);
            exhausted.push((ev, fate));
            continue;
        }
        if let Some(fate) = no_endpoint(ctx, &ev, unturned, now) {
            exhausted.push((ev, fate));
            continue;
        }
        live.push(ev);
    }
    if !exhausted.is_empty() {
        match letters::fated(ctx, exhausted, None, None).await {
            Some(doomed) => out.doomed.extend(doomed),
            None => out.release = false,
        }
    }
    // Handed out as a disabled endpoint's (no turn), and enabled since:
    // back to the index, due now, to take a turn of their endpoint.
    if unturned && ctx.dest.per_event.is_some() && !live.is_empty() {
        let changes = live.iter().map(|ev| Change::Defer {
            seq: ev.seq,
            due_ms: now,
        });
        out.release &= apply(ctx, changes.collect(), Durable::Lazily).await;
        out.deferred = true;
        return out;
    }
    if live.is_empty() {
        no_attempt();
        return out;
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
            out.release &= apply(ctx, changes.collect(), Durable::Now).await;
            return out;
        }
    };
    let seqs = || live.iter().map(|ev| ev.seq);
    ctx.health.in_flight.fetch_add(1, Ordering::Relaxed);
    ctx.health.attempting(seqs(), true);
    let Ok(attempted) = ctx.stack.clone().oneshot(request).await;
    ctx.health.attempting(seqs(), false);
    ctx.health.in_flight.fetch_sub(1, Ordering::Relaxed);
    let settled = settle(ctx, live, batch, attempted, probe, slot, endpoint).await;
    out.release &= settled.release;
    out.rescheduled = settled.rescheduled;
    out.doomed.extend(settled.doomed);
    out
}

/// The fate of an event of a `url: per_event` destination that has no
/// endpoint to go to: stored while the destination had a fixed url, or
/// (`unturned`: handed out without a turn) its endpoint is disabled.
fn no_endpoint(ctx: &Ctx, ev: &StoredEvent, unturned: bool, now: u64) -> Option<Fate> {
    ctx.dest.per_event.as_ref()?;
    let Some(url) = endpoint::url_of(&ev.event) else {
        return Some(verdict::no_endpoint(ev, now));
    };
    let endpoints = ctx.endpoints.as_ref().filter(|_| unturned)?;
    endpoints
        .disabled_at(url)
        .map(|_| verdict::endpoint_disabled(ev, now))
}

/// What `inform` tells of an attempt besides its answer.
struct Told<'a> {
    /// The event's id, or the batch's.
    id: &'a str,
    events: usize,
    number: u32,
    probe: bool,
    now: u64,
}

/// Tells the health (the endpoint's with `url: per_event`, else the
/// destination's), adaptive limit, metrics and log of an attempt's answer;
/// a 410 pauses the destination, or its endpoint alone.
async fn inform(ctx: &Ctx, a: &Attempted, t: Told<'_>, endpoint: Option<&mut EndpointTurn>) {
    let dest = &ctx.dest;
    let outcome = a.classified.outcome;
    ctx.metrics.attempt(outcome, a.took, t.events as u64);
    let gone = a.classified.verdict == Verdict::Pause;
    if let Some(turn) = endpoint {
        let said = turn.end(Some(outcome), Some(a), gone);
        if let Some(until) = said.probation_until {
            tracing::warn!(destination = %dest.name, endpoint = %turn.origin, outcome = %outcome.as_str(), until = %clock::rfc3339(until), "endpoint on probation: no attempts to it until then, then one probe");
        }
        if let Some(d) = said.disabled {
            disabling::disabled(ctx, &turn.origin, &d).await;
        }
        if said.recovered {
            disabling::recovered(ctx, &turn.origin).await;
        }
        ctx.health.note(outcome);
        let in_flight = ctx.health.in_flight.load(Ordering::Relaxed) + 1;
        ctx.limit.record(outcome, a.took, in_flight);
        tracing::debug!(destination = %dest.name, endpoint = %turn.origin, id = %t.id, attempt = t.number, outcome = %outcome.as_str(), status = a.status, error = a.error.as_deref(), "attempt");
        return;
    }
    // A Retry-After on 429 or 503 holds the whole destination, not just
    // this attempt's events. A batch is one attempt for probation too.
    let hold = hold_of(a);
    // Unlike a busy endpoint, a failed handshake is a setup to fix (an
    // unknown CA, an expired or misnamed certificate, a refused client
    // certificate): its reason goes where operators look, once per streak.
    let tls_streak_starts =
        outcome == Outcome::TlsError && ctx.health.view().last_outcome != Some(Outcome::TlsError);
    if let Some(until) = ctx.health.record(outcome, hold, t.probe) {
        tracing::warn!(destination = %dest.name, outcome = %outcome.as_str(), until = %clock::rfc3339(until), "endpoint on probation: no attempts until then, then one probe");
    }
    // This attempt is no longer counted in flight; it was until its answer.
    let in_flight = ctx.health.in_flight.load(Ordering::Relaxed) + 1;
    ctx.limit.record(outcome, a.took, in_flight);
    let (id, number) = (t.id, t.number);
    tracing::debug!(destination = %dest.name, id = %id, events = t.events, attempt = number, outcome = %outcome.as_str(), status = a.status, error = a.error.as_deref(), "attempt");
    if tls_streak_starts {
        tracing::warn!(destination = %dest.name, id = %id, attempt = number, error = a.error.as_deref(), "TLS handshake failed: check the endpoint's certificate and this destination's tls files");
    }
    if gone {
        tracing::warn!(destination = %dest.name, "endpoint answered 410 Gone: destination paused until resumed");
        if ctx.health.pause(PauseReason::Gone, t.now) {
            record_gone(ctx, t.now).await;
        }
    }
}

/// Tells the destination's health of the answer, gives the slot back,
/// then records each event's end.
async fn settle(
    ctx: &Arc<Ctx>,
    evs: Vec<StoredEvent>,
    batch: Option<String>,
    mut a: Attempted,
    probe: bool,
    slot: Slot,
    mut endpoint: Option<EndpointTurn>,
) -> Settled {
    let dest = &ctx.dest;
    // The attempt's number, which picks the schedule's delay.
    let number = super::request::attempt_number(&evs);
    let now = clock::now_ms();
    let id = batch.as_deref().unwrap_or(evs[0].event.id.as_str());
    inform(
        ctx,
        &a,
        Told {
            id,
            events: evs.len(),
            number,
            probe,
            now,
        },
        endpoint.as_mut(),
    )
    .await;
    // Health knows the answer now (its hold, probation, a 410's pause): the
    // next attempt's gate sees it.
    drop(slot);
    let verdict = a.classified.verdict;
    let answered = Answered {
        verdict,
        now_ms: now,
        // One due time for the whole batch, so it stays together.
        retry_due_ms: match verdict {
            Verdict::Retry { min_delay } => {
                let wait =
                    dest.schedule
                        .retry_wait(number, min_delay, dest.jitter, &mut rand::rng());
                now + wait.as_millis() as u64
            }
            _ => now,
        },
        late_until_ms: a
            .late
            .is_some()
            .then(|| now + dest.late_answer_window.as_millis() as u64),
    };
    let outcome = a.classified.outcome;
    // What history keeps of it, numbered per event.
    let tried = Attempt {
        number,
        at_ms: now.saturating_sub(a.took.as_millis() as u64),
        took_ms: u32::try_from(a.took.as_millis()).unwrap_or(u32::MAX),
        status: a.status,
        outcome,
        late: false,
    };
    let Ends {
        delivered,
        changes,
        waiting,
        dead,
    } = ends(evs, &answered, &ctx.dest, &tried, batch.as_deref());
    let mut out = Settled::done(true);
    if !delivered.is_empty() {
        ctx.metrics.delivered(delivered.len() as u64);
        out.release &= apply(ctx, delivered, Durable::Lazily).await;
    }
    out.rescheduled = !changes.is_empty();
    if out.rescheduled {
        let kept = apply(ctx, changes, Durable::Lazily).await;
        if kept && let Some(late) = a.late.take() {
            watch_late_answer(ctx, waiting, batch.clone(), late);
        }
        out.release &= kept;
    }
    if !dead.is_empty() {
        match letters::fated(ctx, dead, Some(&tried), batch.as_deref()).await {
            Some(doomed) => out.doomed = doomed,
            None => out.release = false,
        }
    }
    out
}

/// An attempt's events sorted by their ends, as the journal records them.
#[derive(Default)]
struct Ends {
    delivered: Vec<Change>,
    changes: Vec<Change>,
    /// Rescheduled, with their attempt counts: a late answer may complete them.
    waiting: Vec<(StoredEvent, u32)>,
    dead: Vec<(StoredEvent, Fate)>,
}

/// Each event's end after `answered` (`verdict::end`): its change, or its
/// fate. `tried`: the attempt, as history keeps it.
fn ends(
    evs: Vec<StoredEvent>,
    answered: &Answered,
    dest: &DestinationSettings,
    tried: &Attempt,
    batch: Option<&str>,
) -> Ends {
    let mut e = Ends::default();
    for ev in evs {
        let attempts = ev.attempts + 1;
        match verdict::end(answered, &dest.limits, ev.attempts, ev.event.accepted_ms) {
            End::Delete => {
                let attempt = Attempt {
                    number: attempts,
                    ..tried.clone()
                };
                outcome_log::delivered(&ev, attempts, tried.status, batch, Confirmed::InTime);
                e.delivered
                    .push(delete(&ev, Some(Step::Delivered { attempt })));
            }
            End::Reschedule { due_ms, in_batch } => {
                e.changes.push(Change::Reschedule {
                    seq: ev.seq,
                    attempts,
                    next_due_ms: due_ms,
                    outcome: tried.outcome,
                    status: tried.status,
                    attempt_ms: answered.now_ms,
                    took_ms: tried.took_ms,
                    batch: batch.filter(|_| in_batch).map(str::to_string),
                });
                e.waiting.push((ev, attempts));
            }
            End::DeadLetter(reason) => {
                let now = answered.now_ms;
                let fate = verdict::attempted(&ev, reason, tried.outcome, tried.status, now);
                e.dead.push((ev, fate));
            }
        }
    }
    e
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

pub(super) fn delete(ev: &StoredEvent, step: Option<Step>) -> Change {
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

    pub(super) fn take(&self, seq: i64) -> bool {
        self.seqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&seq)
            .is_some()
    }
}

/// When a change must be durable.
#[derive(Clone, Copy)]
pub(super) enum Durable {
    /// Before the caller goes on: a dead letter's delete, a quarantine.
    Now,
    /// Within the journal's sync interval: a delivery or a reschedule,
    /// which a crash only repeats.
    Lazily,
}

/// Records `changes`, waiting out a full disk or queue: the event is held
/// meanwhile (neither re-sent nor lost). `false` after a lasting failure:
/// the event stays pending in the journal and is taken up after a restart.
pub(super) async fn apply(ctx: &Ctx, changes: Vec<Change>, durable: Durable) -> bool {
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
