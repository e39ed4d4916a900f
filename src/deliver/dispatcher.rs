//! One dispatcher per destination. It takes fresh events from the
//! destination's ready queue (the journal's fast path, in memory) and
//! reads due ones from the index (a bounded window, never the whole
//! backlog) only when the index has news: rows added, a retry due, an
//! attempt rescheduled. It asks the destination's
//! `Health` before every attempt (pause, Retry-After hold, probation, rate
//! limit), keeps at most `concurrency` attempts in flight, and sleeps until
//! the next due time, a new event, a finished attempt, or a resume. While
//! attempts are held back, events whose TTL runs out are still
//! dead-lettered on time: waiting is not an attempt. So are, first thing
//! after a restart, those whose dead-lettering a crash interrupted (their
//! fate is in the journal): they are never attempted again.
//!
//! With batching, each attempt takes a batch from the front of the ready
//! queue (`batch::take`): what is ready now, never waiting for more. A
//! batch is one attempt for `concurrency`, the rate limit and probation.

use super::batch;
use super::settle::{self, Ctx, Settled, Unit};
use crate::clock;
use crate::journal::{Change, DestinationState, Reader, StoreError, StoredEvent};
use crate::metrics;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::health::Gate;
use super::slots::Slots;

/// After a failed journal read, wait this long before the next.
const READ_RETRY: Duration = Duration::from_secs(1);
/// Expired events dead-lettered together: one sink write and fsync, one
/// journal commit. 1,000 events of 1 KiB hold about 2 MiB in memory.
const EXPIRY_GROUP: usize = 1000;
/// Groups in flight at once: one writes while the next is read.
const EXPIRY_GROUPS: usize = 2;
/// With batching, the most events held ready: enough for `concurrency`
/// full batches to go out back to back, without reading a large backlog
/// into memory.
const MAX_BATCH_WINDOW: usize = 16_384;
/// Single events in hand per slot: on the wire, or done with it and
/// recording their outcome (`slots`). Beyond one per slot, only while the
/// events in hand hold less than `IN_HAND_BYTES`: that bounds the memory
/// held, and the attempts sent but not yet recorded, while the journal
/// records slowly. A drain of the index went 19.7–21.7k → 28.9–29.9k
/// events/s with 4 per slot, 31.7–32.5k with 16 (`/tmp/prof/drain.sh`,
/// 1 KiB events). Batches stay one per slot: two gained nothing in the
/// batched drain and cost 14 MiB of RSS.
const IN_HAND: usize = 16;
/// As much as a destination's ready queue holds (`journal::ReadyQueue`).
const IN_HAND_BYTES: u64 = 4 * 1024 * 1024;
/// Bytes of events held ready (read, not yet in hand) without batching:
/// as much again. Counted in events alone, the window held four per slot
/// whatever their size: 64 MiB of 1 MiB events at concurrency 16, past
/// any memory budget.
const READY_BYTES: u64 = IN_HAND_BYTES;

pub struct Dispatcher {
    ctx: Arc<Ctx>,
    /// A reloaded config's context, taken before the next attempt.
    updates: watch::Receiver<Arc<Ctx>>,
    reader: Reader,
    state: Arc<DestinationState>,
    /// Cancelled at shutdown, or when a reload removes the destination.
    stop: CancellationToken,
}

/// A unit in hand: its events' seqs, and their bytes.
struct Running {
    seqs: Vec<i64>,
    bytes: u64,
}

/// Events read from the journal and not yet settled: queued or in flight.
#[derive(Default)]
struct Held {
    seqs: HashSet<i64>,
    ready: VecDeque<StoredEvent>,
    running: HashMap<tokio::task::Id, Running>,
    /// The bytes of `running`'s events (`NewEvent::size`), for `IN_HAND_BYTES`.
    running_bytes: u64,
    /// The tasks dead-lettering a group of expired events.
    expiring: HashSet<tokio::task::Id>,
    /// Taken from `ready` past their TTL, waiting for a group.
    expired: VecDeque<StoredEvent>,
}

impl Running {
    fn of(events: &[StoredEvent]) -> Running {
        Running {
            seqs: events.iter().map(|ev| ev.seq).collect(),
            bytes: events.iter().map(|ev| ev.event.size()).sum(),
        }
    }
}

impl Held {
    /// The bytes of the events held ready. Summed when asked: only while
    /// fewer than a quarter of the window are held, and so few.
    fn ready_bytes(&self) -> u64 {
        self.ready.iter().map(|ev| ev.event.size()).sum()
    }

    fn hand(&mut self, task: tokio::task::Id, running: Running) {
        self.running_bytes += running.bytes;
        self.running.insert(task, running);
    }

    /// The seqs of a unit whose task ended.
    fn back(&mut self, task: tokio::task::Id) -> Option<Vec<i64>> {
        let running = self.running.remove(&task)?;
        self.running_bytes = self.running_bytes.saturating_sub(running.bytes);
        Some(running.seqs)
    }
}

impl Dispatcher {
    pub fn new(
        mut updates: watch::Receiver<Arc<Ctx>>,
        reader: Reader,
        state: Arc<DestinationState>,
        stop: CancellationToken,
    ) -> Self {
        let ctx = updates.borrow_and_update().clone();
        Dispatcher {
            ctx,
            updates,
            reader,
            state,
            stop,
        }
    }

    /// Runs until shutdown begins, then waits for attempts in flight (the
    /// caller bounds that wait by `shutdown_grace`).
    pub async fn run(mut self) {
        let stop = self.stop.clone();
        let mut held = Held::default();
        let mut tasks: JoinSet<Settled> = JoinSet::new();
        let slots = Arc::new(Slots::default());
        // Whether the index may hold due events this dispatcher has not
        // read, and when its next one falls due.
        let mut look = true;
        let mut index_due: Option<u64> = None;
        // Whether the last attempt went through (not rescheduled).
        let mut answering = true;
        // The earliest TTL deadline of any pending event. An event whose
        // next attempt lies beyond it (a retry hours ahead, a TTL lowered
        // since, a pause) must still be dead-lettered at the deadline.
        let mut expiry_at = Some(0);
        let mut updates_open = true;
        // `changed()` marks the new context seen: remember to take it.
        let mut updated = false;
        loop {
            if std::mem::take(&mut updated) || self.updates.has_changed().unwrap_or(false) {
                // Attempts in flight finish under the context they started with.
                self.ctx = self.updates.borrow_and_update().clone();
                // The TTL may have changed: look for expired events again.
                expiry_at = Some(0);
                look = true;
            }
            let concurrency = self.ctx.dest.concurrency;
            let batching = self.ctx.dest.batch;
            // Events held ready; refilled when a quarter is left. Without
            // batching: four per attempt slot, refilled below `concurrency`.
            let window = (concurrency * 4 * batching.max_events)
                .min(MAX_BATCH_WINDOW)
                .max(concurrency * 4);
            // And in bytes: with batching, room for a batch per slot.
            let window_bytes = if batching.enabled() {
                READY_BYTES.max(concurrency as u64 * batching.preferred_size as u64)
            } else {
                READY_BYTES
            };
            if index_due.is_some_and(|t| clock::now_ms() >= t) {
                look = true;
                index_due = None;
            }
            // Expired events set aside wait for the dead-letter sink: while
            // it fails, up to a group of them, not the whole backlog.
            let wants_more = |held: &Held| {
                held.ready.len() < window / 4
                    && held.expired.len() < EXPIRY_GROUP
                    && held.ready_bytes() < window_bytes / 4
            };
            if wants_more(&held) && !stop.is_cancelled() {
                let room = (window, window_bytes);
                if look {
                    (index_due, look) = self.refill(&mut held, room).await;
                }
                self.take_fresh(&mut held, room);
                // Events arriving at an empty destination set the first deadline.
                if expiry_at.is_none() {
                    expiry_at = held
                        .ready
                        .iter()
                        .map(|ev| self.ctx.dest.limits.deadline(ev.event.accepted_ms))
                        .min();
                }
            }
            let in_hand = if batching.enabled() {
                concurrency
            } else {
                concurrency * IN_HAND
            };
            let mut gated = None;
            // Whether every slot was taken while events were ready: only then
            // must a freed slot wake this loop (else each answer would, once
            // more). Decided where the loop stops: a slot given back after
            // this look leaves a permit that `freed` then finds.
            let mut slot_bound = false;
            // After a failed commit no outcome can be recorded: sending would
            // only deliver everything twice (once now, once after restart).
            let journal_ok = !self.ctx.journal.failed();
            while journal_ok
                && (tasks.len() < concurrency
                    || (tasks.len() < in_hand && held.running_bytes < IN_HAND_BYTES))
                && !stop.is_cancelled()
            {
                let Some(front) = held.ready.front() else {
                    break;
                };
                if slots.taken() >= concurrency {
                    slot_bound = true;
                    break;
                }
                if self.for_the_sink(front, clock::now_ms()) {
                    // Set aside for `expire_overdue`'s groups (not one task
                    // and sink write each); the live events behind it go on.
                    if let Some(ev) = held.ready.pop_front() {
                        held.expired.push_back(ev);
                    }
                    expiry_at = Some(0);
                    continue;
                }
                let gate = self.ctx.health.gate();
                let Gate::Go { probe } = gate else {
                    gated = Some(gate);
                    break;
                };
                let unit = if !batching.enabled() {
                    let Some(ev) = held.ready.pop_front() else {
                        break;
                    };
                    Unit {
                        events: vec![ev],
                        batch: None,
                    }
                } else {
                    let mut events = batch::take(&mut held.ready, batching);
                    // Journal order: a retried batch's body is then the
                    // same bytes as its first attempt's.
                    events.sort_by_key(|ev| ev.seq);
                    let Some(first) = events.first() else {
                        break;
                    };
                    // A retried batch keeps its id; a new one gets a UUIDv7.
                    let id = first.batch.clone().unwrap_or_else(crate::ids::new);
                    Unit {
                        events,
                        batch: Some(id),
                    }
                };
                let running = Running::of(&unit.events);
                let ctx = self.ctx.clone();
                let slot = slots.take();
                let handle = tasks.spawn(async move { settle::run(&ctx, unit, probe, slot).await });
                held.hand(handle.id(), running);
            }
            // Ingress is paced only while this destination is delivering.
            let flowing = journal_ok && answering && gated.is_none() && !stop.is_cancelled();
            self.state.flowing.store(flowing, Ordering::Relaxed);
            let overdue = expiry_at.is_some_and(|t| clock::now_ms() >= t);
            if overdue && held.expiring.len() < EXPIRY_GROUPS && !stop.is_cancelled() {
                expiry_at = self.expire_overdue(&mut held, &mut tasks).await;
            }
            let until = match gated {
                Some(Gate::WaitUntil(t)) => Some(t),
                _ => None,
            };
            // With every expiry group in flight, the next look waits for one to end.
            let expiry =
                expiry_at.filter(|_| !stop.is_cancelled() && held.expiring.len() < EXPIRY_GROUPS);
            let due = index_due.filter(|_| !stop.is_cancelled());
            // Everything read was set aside as expired: read on at once, as
            // no attempt's end will wake this loop.
            let read_on = (look && wants_more(&held) && !stop.is_cancelled()).then_some(0);
            let wake_at = [due, until, expiry, read_on].into_iter().flatten().min();
            if stop.is_cancelled() && tasks.is_empty() {
                return;
            }
            let sleep = tokio::time::sleep(wake_at.map_or(Duration::from_secs(3600), |t| {
                Duration::from_millis(t.saturating_sub(clock::now_ms()))
            }));
            tokio::select! {
                _ = self.state.notify.notified(), if !stop.is_cancelled() => look = true,
                _ = self.state.fresh.notified(), if !stop.is_cancelled() => {}
                _ = self.ctx.health.wake.notified(), if !stop.is_cancelled() => {}
                _ = slots.freed(), if slot_bound && !stop.is_cancelled() => {}
                Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                    // Every attempt that has ended, not one per turn of
                    // this loop: under load several end between turns.
                    let mut next = Some(done);
                    while let Some(done) = next {
                        let (id, release) = match done {
                            Ok((id, settled)) => {
                                look |= settled.rescheduled;
                                answering = !settled.rescheduled;
                                (id, settled.release)
                            }
                            Err(e) => {
                                tracing::error!(destination = %self.ctx.dest.name, error = %e, "an attempt task failed");
                                look = true;
                                (e.id(), true)
                            }
                        };
                        // A group expired: more may be overdue behind it.
                        if held.expiring.remove(&id) {
                            expiry_at = Some(0);
                        }
                        if let Some(seqs) = held.back(id)
                            && release
                        {
                            for seq in seqs {
                                held.seqs.remove(&seq);
                            }
                        }
                        next = tasks.try_join_next_with_id();
                    }
                }
                changed = self.updates.changed(), if updates_open && !stop.is_cancelled() => {
                    updates_open = changed.is_ok();
                    updated = updates_open;
                }
                _ = sleep, if wake_at.is_some() => {}
                _ = stop.cancelled(), if !stop.is_cancelled() => {}
            }
        }
    }

    /// Reads due events from the index into the ready queue, up to the
    /// window's events and bytes. Returns when the index's next event
    /// falls due, and whether more are due now.
    async fn refill(&self, held: &mut Held, (window, bytes): (usize, u64)) -> (Option<u64>, bool) {
        let name = &self.ctx.dest.name;
        let now = clock::now_ms();
        let want = window.saturating_sub(held.ready.len());
        let room = bytes.saturating_sub(held.ready_bytes());
        match self.reader.due(name, now, want, room, &held.seqs).await {
            Ok((rows, more)) => {
                self.take(held, rows).await;
                if more {
                    return (None, true);
                }
                match self.reader.next_due_after(name, now).await {
                    Ok(t) => (t, false),
                    Err(e) => (self.read_failed(&e, now), false),
                }
            }
            Err(e) => (self.read_failed(&e, now), false),
        }
    }

    /// Takes events the journal put in memory, oldest first, up to the
    /// window's events and bytes.
    fn take_fresh(&self, held: &mut Held, (window, bytes): (usize, u64)) {
        let want = window.saturating_sub(held.ready.len());
        let room = bytes.saturating_sub(held.ready_bytes());
        if room == 0 {
            return;
        }
        let fresh = match self.state.ready.lock() {
            Ok(mut ready) => ready.take(want, room),
            Err(_) => return,
        };
        if !fresh.is_empty() {
            self.state.room.notify_waiters();
        }
        for ev in fresh {
            // Already read from the index: this copy is the same event.
            if held.seqs.insert(ev.seq) {
                held.ready.push_back(ev);
            }
        }
    }

    /// Adds rows read from the index to the held queue.
    async fn take(&self, held: &mut Held, rows: Vec<Result<StoredEvent, StoreError>>) {
        let taken = self.claim(held, rows).await;
        held.ready.extend(taken);
    }

    /// The rows not held yet, now held; the ready queue forgets them, so
    /// the same event is never held twice. A row that cannot be read is
    /// quarantined.
    async fn claim(
        &self,
        held: &mut Held,
        rows: Vec<Result<StoredEvent, StoreError>>,
    ) -> Vec<StoredEvent> {
        let mut taken = Vec::with_capacity(rows.len());
        for row in rows {
            match row {
                Ok(ev) if held.seqs.insert(ev.seq) => taken.push(ev),
                Ok(_) => {}
                Err(e) => self.quarantine(&e).await,
            }
        }
        if let Ok(mut ready) = self.state.ready.lock() {
            ready.remove(taken.iter().map(|ev| ev.seq));
        }
        taken
    }

    fn read_failed(&self, e: &rusqlite::Error, now: u64) -> Option<u64> {
        tracing::error!(destination = %self.ctx.dest.name, error = %e, "cannot read the journal");
        Some(now + READ_RETRY.as_millis() as u64)
    }

    /// Dead-letters every event whose TTL has run out, queued or still in
    /// the journal, whatever its next due time; returns the next deadline.
    async fn expire_overdue(&self, held: &mut Held, tasks: &mut JoinSet<Settled>) -> Option<u64> {
        let dest = &self.ctx.dest;
        let now = clock::now_ms();
        let ttl = dest.limits.ttl.as_millis() as u64;
        let take = EXPIRY_GROUP.min(held.expired.len());
        let mut expired: Vec<_> = held.expired.drain(..take).collect();
        let mut waiting = VecDeque::with_capacity(held.ready.len());
        for ev in std::mem::take(&mut held.ready) {
            if expired.len() < EXPIRY_GROUP && self.for_the_sink(&ev, now) {
                expired.push(ev);
            } else {
                waiting.push_back(ev);
            }
        }
        held.ready = waiting;
        let mut failed = None;
        if expired.len() < EXPIRY_GROUP {
            let want = EXPIRY_GROUP - expired.len();
            let cutoff = now.saturating_sub(ttl);
            match self
                .reader
                .accepted_before(&dest.name, cutoff, want, &held.seqs)
                .await
            {
                Ok(rows) => expired.extend(self.claim(held, rows).await),
                Err(e) => failed = Some(self.read_failed(&e, now)),
            }
        }
        let full = expired.len() >= EXPIRY_GROUP || !held.expired.is_empty();
        // Those taken from memory go even when the read failed: their seqs
        // are held, so nothing else would ever settle them.
        if !expired.is_empty() {
            let running = Running::of(&expired);
            let ctx = self.ctx.clone();
            let handle =
                tasks.spawn(async move { Settled::done(settle::expire(&ctx, expired).await) });
            held.hand(handle.id(), running);
            held.expiring.insert(handle.id());
        }
        if let Some(retry) = failed {
            return retry;
        }
        if full {
            // More are overdue: read the next group while this one is written.
            return Some(0);
        }
        match self.reader.oldest_accepted(&dest.name).await {
            // An expired event still in flight would make a deadline in the
            // past: look again a second later rather than spin.
            Ok(oldest) => oldest
                .map(|t| dest.limits.deadline(t))
                .map(|d| if d <= now { now + 1000 } else { d }),
            Err(e) => self.read_failed(&e, now),
        }
    }

    /// Past its TTL, or fated before a restart: never attempted, its dead
    /// letter goes in an expiry group.
    fn for_the_sink(&self, ev: &StoredEvent, now: u64) -> bool {
        ev.fate.is_some() || self.ctx.dest.limits.expired(ev.event.accepted_ms, now)
    }

    async fn quarantine(&self, e: &StoreError) {
        let name = &self.ctx.dest.name;
        let StoreError::Corrupt { seq, .. } = e else {
            return;
        };
        tracing::error!(destination = %name, journal = %self.ctx.journal.path().display(), error = %e,
            "journal record is corrupt: it is kept but never delivered; inspect it with `courier journal inspect`");
        metrics::corrupt(name);
        if let Err(err) = self
            .ctx
            .journal
            .apply(&[Change::Quarantine { seq: *seq }])
            .await
        {
            tracing::error!(destination = %name, error = %err, "cannot quarantine the corrupt record");
        }
    }
}
