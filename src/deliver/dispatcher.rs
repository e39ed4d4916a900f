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
//! Each turn of the loop is `refill -> start_ready -> expire -> next_wake`,
//! and `Wake` names why the loop woke: every timer has a cause, so a
//! missed wake-up shows as a stall rather than hiding behind a fallback.
//!
//! With batching, each attempt takes a batch from the front of the ready
//! queue (`batch::take`): what is ready now, never waiting for more. A
//! batch is one attempt for `concurrency`, the rate limit and probation.
//!
//! With an ordering key, only the head of each lane (`journal::lanes`) is
//! held ready; an event taken from memory behind its head is parked until
//! the head's end gives it its turn (`promote`). Parked events are bounded
//! in bytes, and those behind a head being retried go back to the index
//! (`spill`), whose waiting rows the journal makes due at their turn. So
//! the ready queue holds at most one event of a key, and a batch too.

use super::batch;
use super::endpoints::{self, Again, Endpoints, Turn};
use super::letters::{self, Doomed};
use super::settle::{self, Ctx, EndpointTurn, Settled, Unit};
use crate::clock;
use crate::event::StoredEvent;
use crate::event::endpoint;
use crate::journal::{Change, DestinationState, LoadError, Reader, Turns};
use smallvec::SmallVec;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
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
/// records slowly; more in hand let a drain of the index go on while the
/// journal records. Batches stay one per slot: two gained nothing in the
/// batched drain and cost memory.
const IN_HAND: usize = 16;
/// As much as a destination's ready queue holds (`journal::ReadyQueue`).
const IN_HAND_BYTES: u64 = 4 * 1024 * 1024;
/// Bytes of events held in memory behind their ordering lane's head: a
/// burst of one key waits here for its turn, the rest in the index.
const PARKED_BYTES: u64 = IN_HAND_BYTES;
/// Bytes of events held ready (read, not yet in hand) without batching:
/// as much again. Counted in events alone, the window held four per slot
/// whatever their size, so large events at a high `concurrency` went past
/// any memory budget.
const READY_BYTES: u64 = IN_HAND_BYTES;

pub struct Dispatcher {
    ctx: Arc<Ctx>,
    /// A reloaded config's context, taken before the next attempt.
    updates: watch::Receiver<Arc<Ctx>>,
    /// Until the fleet drops the sender (the destination was removed).
    updates_open: bool,
    reader: Reader,
    state: Arc<DestinationState>,
    /// Cancelled at shutdown, or when a reload removes the destination.
    stop: CancellationToken,
    held: Held,
    /// Attempts, and the changes `set_waiting` records.
    tasks: JoinSet<Settled>,
    /// Dead-letter groups (`letters`): apart from `tasks`, so that a sink
    /// that is down holds no attempt's place. `false`: the journal refused.
    groups: JoinSet<bool>,
    slots: Arc<Slots>,
    /// Whether the index may hold due events this dispatcher has not read.
    look: bool,
    /// When the index's next event falls due.
    index_due: Option<u64>,
    /// Whether the last attempt went through (not rescheduled).
    answering: bool,
    expiry: Expiry,
}

/// When to look for events past their TTL. An event whose next attempt
/// lies beyond its deadline (a retry hours ahead, a TTL lowered since, a
/// pause) must still be dead-lettered at the deadline.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expiry {
    /// At once: at start (a restart may find fated events), after a
    /// reload (the TTL may have changed), when events were set aside as
    /// expired, or when a group ended with more overdue behind it.
    Now,
    /// The earliest deadline of a pending event.
    At(u64),
    /// Nothing pending is known: the next event held sets the deadline.
    Unknown,
}

/// Why `next_wake` returned: each wake-up has a cause, and no timer runs
/// without one.
#[derive(Debug)]
enum Wake {
    /// The indexer committed rows for this destination.
    Indexed,
    /// The writer put events in the ready queue.
    Fresh,
    /// Health changed: a resume, a probe's answer, a reload's probation.
    Health,
    /// A slot was given back while every slot was taken.
    SlotFree,
    /// An attempt ended (the first of those that did).
    Settled(Result<(tokio::task::Id, Settled), tokio::task::JoinError>),
    /// A dead-letter group ended.
    Written(Result<(tokio::task::Id, bool), tokio::task::JoinError>),
    /// A reload handed over a new context.
    Reload,
    /// The fleet dropped its end: no reload will come.
    FleetGone,
    /// The index's next event fell due.
    Due,
    /// The gate's wait (a Retry-After hold, probation, the rate limit) ended.
    GateOpens,
    /// A TTL deadline came, or an expiry group is free to take more.
    Expiry,
    /// All that was read went to the expired: read on, as no attempt's
    /// end will wake this loop.
    ReadOn,
    /// Shutdown began, or a reload removed the destination.
    Stop,
}

/// How much the dispatcher holds ready: events, and their bytes.
#[derive(Clone, Copy)]
struct Room {
    events: usize,
    bytes: u64,
}

/// What stopped `start_ready` before the ready queue was empty.
#[derive(Default)]
struct Blocked {
    /// The gate said to wait (`WaitUntil`, `Throttled`: until then).
    gate: Option<Gate>,
    /// Every slot was taken while events were ready: only then must a
    /// freed slot wake the loop (else each answer would, once more). A slot
    /// given back after this look leaves a permit that `freed` then finds.
    slots: bool,
}

/// A dead-letter group being written.
struct Group {
    seqs: Vec<i64>,
    /// Its events came from a look for expired ones (`expire_overdue`):
    /// more may be overdue behind them.
    overdue: bool,
}

/// A unit in hand: its events' seqs, and their bytes. Most units are one
/// event (every one of a `url: per_event` destination): its seq is kept
/// inline, not in an allocation of its own per attempt.
struct Running {
    seqs: SmallVec<[i64; 1]>,
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
    /// The dead-letter groups being written.
    expiring: HashMap<tokio::task::Id, Group>,
    /// Waiting for a group: taken from `ready` past their TTL, or fated
    /// by their attempt.
    expired: VecDeque<Doomed>,
    /// Read from the index while behind their ordering lane's head: their
    /// rows are to wait for its turn (`set_waiting`), not held ready.
    behind: Vec<i64>,
    /// Taken from memory while behind their ordering lane's head: held
    /// here, out of `ready`, until their turn (`promote`), or given back
    /// to the index (`spill`).
    parked: BTreeMap<i64, StoredEvent>,
    parked_bytes: u64,
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
    fn back(&mut self, task: tokio::task::Id) -> Option<SmallVec<[i64; 1]>> {
        let running = self.running.remove(&task)?;
        self.running_bytes = self.running_bytes.saturating_sub(running.bytes);
        Some(running.seqs)
    }
}

/// The tokio instant of `ms` on the wall clock: due times and TTLs are
/// wall-clock times (they survive a restart), timers run on tokio's clock
/// (which tests pause and step).
fn instant_at(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms.saturating_sub(clock::now_ms()))
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
            updates_open: true,
            reader,
            state,
            stop,
            held: Held::default(),
            tasks: JoinSet::new(),
            groups: JoinSet::new(),
            slots: Arc::new(Slots::default()),
            look: true,
            index_due: None,
            answering: true,
            expiry: Expiry::Now,
        }
    }

    /// Runs until shutdown begins, then waits for attempts in flight (the
    /// caller bounds that wait by `shutdown_grace`).
    pub async fn run(mut self) {
        loop {
            if self.updates.has_changed().unwrap_or(false) {
                self.reload();
            }
            self.refill().await;
            let blocked = self.start_ready();
            self.expire().await;
            if self.stop.is_cancelled()
                && self.tasks.is_empty()
                && self.groups.is_empty()
                && self.held.expired.is_empty()
            {
                return;
            }
            match self.next_wake(&blocked).await {
                Wake::Settled(first) => self.settled(first),
                Wake::Written(first) => self.written(first),
                Wake::Indexed => self.look = true,
                Wake::Reload => self.reload(),
                Wake::FleetGone => self.updates_open = false,
                Wake::Fresh
                | Wake::Health
                | Wake::SlotFree
                | Wake::Due
                | Wake::GateOpens
                | Wake::Expiry
                | Wake::ReadOn
                | Wake::Stop => {}
            }
        }
    }

    /// Takes a reloaded context: attempts in flight finish under the one
    /// they started with.
    fn reload(&mut self) {
        self.ctx = self.updates.borrow_and_update().clone();
        // The TTL may have changed: look for expired events again.
        self.expiry = Expiry::Now;
        self.look = true;
    }

    /// Events held ready; refilled when a quarter is left. Without
    /// batching: four per attempt slot, refilled below `concurrency`.
    fn room(&self) -> Room {
        let concurrency = self.ctx.dest.concurrency;
        let batching = self.ctx.dest.batch;
        let events = (concurrency * 4 * batching.max_events)
            .min(MAX_BATCH_WINDOW)
            .max(concurrency * 4);
        // And in bytes: with batching, room for a batch per slot.
        let bytes = if batching.enabled() {
            READY_BYTES.max(concurrency as u64 * batching.preferred_size as u64)
        } else {
            READY_BYTES
        };
        Room { events, bytes }
    }

    /// Whether to take more events. Expired events set aside wait for the
    /// dead-letter sink: while it fails, up to a group of them, not the
    /// whole backlog.
    fn wants_more(&self, room: Room) -> bool {
        let held = &self.held;
        held.ready.len() < room.events / 4
            && held.expired.len() < EXPIRY_GROUP
            && held.ready_bytes() < room.bytes / 4
    }

    /// Step 1: fills the ready queue, from the index when it has news, then
    /// from the journal's memory.
    async fn refill(&mut self) {
        if self.index_due.is_some_and(|t| clock::now_ms() >= t) {
            self.look = true;
            self.index_due = None;
        }
        self.promote();
        let room = self.room();
        if self.wants_more(room) && !self.stop.is_cancelled() {
            if self.look {
                (self.index_due, self.look) = self.read_due(room).await;
            }
            self.take_fresh(room);
            self.set_waiting();
        }
        // Events held with no deadline known set it: the first at an empty
        // destination, or those not in the index yet when `expire_overdue`
        // read it. Whether or not this turn took any: a paused destination
        // with a full window takes none.
        if self.expiry == Expiry::Unknown {
            self.expiry = self.earliest_deadline(&self.held.ready);
        }
    }

    fn earliest_deadline(&self, events: &VecDeque<StoredEvent>) -> Expiry {
        let limits = &self.ctx.dest.limits;
        events
            .iter()
            .map(|ev| limits.deadline(ev.event.accepted_ms))
            .min()
            .map_or(Expiry::Unknown, Expiry::At)
    }

    /// Step 2: starts attempts from the front of the ready queue while
    /// slots are free and the gate lets them; says what stopped it.
    fn start_ready(&mut self) -> Blocked {
        if let Some(endpoints) = self.ctx.endpoints.clone() {
            return self.start_by_endpoint(&endpoints);
        }
        let concurrency = self.ctx.dest.concurrency;
        let batching = self.ctx.dest.batch;
        let in_hand = if batching.enabled() {
            concurrency
        } else {
            concurrency * IN_HAND
        };
        let mut blocked = Blocked::default();
        // After a failed commit no outcome can be recorded: sending would
        // only deliver everything twice (once now, once after restart).
        let journal_ok = !self.ctx.journal.failed();
        while journal_ok
            && (self.tasks.len() < concurrency
                || (self.tasks.len() < in_hand && self.held.running_bytes < IN_HAND_BYTES))
            && !self.stop.is_cancelled()
        {
            let Some(front) = self.held.ready.front() else {
                break;
            };
            // `concurrency`, or the limit adaptive concurrency learnt.
            if self.slots.taken() >= self.ctx.limit.current() {
                blocked.slots = true;
                break;
            }
            if self.for_the_sink(front, clock::now_ms()) {
                // Set aside for `expire_overdue`'s groups (not one task
                // and sink write each); the live events behind it go on.
                if let Some(ev) = self.held.ready.pop_front() {
                    self.held.expired.push_back(Doomed::read(ev));
                }
                self.expiry = Expiry::Now;
                continue;
            }
            let gate = self.ctx.health.gate();
            let Gate::Go { probe } = gate else {
                blocked.gate = Some(gate);
                break;
            };
            let unit = if !batching.enabled() {
                let Some(ev) = self.held.ready.pop_front() else {
                    break;
                };
                Unit {
                    events: vec![ev],
                    batch: None,
                    endpoint: None,
                }
            } else {
                let mut events = batch::take(&mut self.held.ready, batching);
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
                    endpoint: None,
                }
            };
            self.spawn_unit(unit, probe);
        }
        self.pace(journal_ok, &blocked);
        blocked
    }

    /// Tells the journal what this pass found: ingress is paced only while
    /// this destination is delivering, and its new events go out from
    /// memory unless its gate holds it (its rate limit does not).
    fn pace(&self, journal_ok: bool, blocked: &Blocked) {
        let sending =
            matches!(blocked.gate, None | Some(Gate::Throttled(_))) && !self.stop.is_cancelled();
        self.state
            .pace(journal_ok && self.answering && sending, sending);
    }

    /// Step 2 of a `url: per_event` destination: goes through the ready
    /// queue oldest first and starts each event whose endpoint takes one
    /// more attempt (`Endpoints::start`) while the destination's slots
    /// and gate let it. An endpoint that cannot take its events now keeps
    /// at most `endpoints.concurrency` of them ready (busy: they go when
    /// one of its attempts ends); the rest go back to the index, due when
    /// it can take them (`defer`). So one endpoint's backlog or sickness
    /// never fills the window the others are read into.
    fn start_by_endpoint(&mut self, endpoints: &Arc<Endpoints>) -> Blocked {
        let concurrency = self.ctx.dest.concurrency;
        let cap = self
            .ctx
            .dest
            .per_event
            .as_ref()
            .map_or(1, |p| p.concurrency);
        let in_hand = concurrency * IN_HAND;
        let mut blocked = Blocked::default();
        let journal_ok = !self.ctx.journal.failed();
        let now = clock::now_ms();
        // Per endpoint blocked in this pass: why, and how many of its
        // events met since (it stays blocked for the rest of the pass).
        let mut blocked_by: HashMap<Arc<str>, (endpoints::Blocked, usize)> = HashMap::new();
        let mut back: Vec<(StoredEvent, u64)> = Vec::new();
        // For the sink, in one task: their endpoint is disabled.
        let mut disabled = Vec::new();
        // Those passed over this pass, to go back in front, in order. The
        // pass ends when the slots or the gate do: the events behind stay
        // where they are, not moved one by one (a pass per attempt ended).
        let mut kept = Vec::new();
        while !self.held.ready.is_empty() {
            let room = journal_ok
                && !self.stop.is_cancelled()
                && blocked.gate.is_none()
                && (self.tasks.len() < concurrency
                    || (self.tasks.len() < in_hand && self.held.running_bytes < IN_HAND_BYTES));
            if !room || self.slots.taken() >= self.ctx.limit.current() {
                blocked.slots |= room;
                break;
            }
            let Some(ev) = self.held.ready.pop_front() else {
                break;
            };
            if self.for_the_sink(&ev, now) {
                self.held.expired.push_back(Doomed::read(ev));
                self.expiry = Expiry::Now;
                continue;
            }
            // On the stack: an endpoint's state keeps the key its turn
            // holds, so an event of a known endpoint makes no string of
            // its own (two allocations an event before).
            let stacked = endpoint::url_of(&ev.event).and_then(endpoint::origin_on_stack);
            let origin = stacked.as_ref().map_or("", |o| o.as_str());
            let said = match blocked_by.get_mut(origin) {
                Some((why, n)) => {
                    *n += 1;
                    Err((*why, *n))
                }
                None => endpoints.start(origin, cap).map_err(|why| {
                    blocked_by.insert(origin.into(), (why, 0));
                    (why, 0)
                }),
            };
            let (key, probe) = match said {
                Ok(started) => started,
                Err((endpoints::Blocked::Disabled, _)) => {
                    disabled.push(ev);
                    continue;
                }
                Err((why, k)) => {
                    let when = Turn {
                        k,
                        cap,
                        pace_ms: endpoints.pace_ms(origin),
                        timeout_ms: self.ctx.dest.timeout.as_millis() as u64,
                        now,
                    };
                    let deadline = self.ctx.dest.limits.deadline(ev.event.accepted_ms);
                    let due = endpoints::due_again(why, when).map(|again| match again {
                        Again::At(t) => t,
                        Again::Spaced(t) => endpoints.slot(origin, t, cap, when.pace_ms),
                    });
                    // Past its TTL it goes to the sink when read, not later.
                    match due.map(|t| t.min(deadline.max(now))) {
                        Some(due) => back.push((ev, due)),
                        None => kept.push(ev),
                    }
                    continue;
                }
            };
            let turn = EndpointTurn::new(endpoints.clone(), key, probe);
            // The destination's own gate: an operator's pause, the rate
            // limit (its probation is its endpoints': `Health::end_probation`).
            let gate = self.ctx.health.gate();
            if !matches!(gate, Gate::Go { .. }) {
                drop(turn);
                blocked.gate = Some(gate);
                kept.push(ev);
                break;
            }
            let unit = Unit {
                events: vec![ev],
                batch: None,
                endpoint: Some(turn),
            };
            self.spawn_unit(unit, false);
        }
        for ev in kept.into_iter().rev() {
            self.held.ready.push_front(ev);
        }
        self.defer(back);
        if !disabled.is_empty() {
            let unit = Unit {
                events: disabled,
                batch: None,
                endpoint: None,
            };
            self.spawn_unit(unit, false);
        }
        self.pace(journal_ok, &blocked);
        blocked
    }

    /// Starts `unit`'s task in a slot, its events held while it runs.
    fn spawn_unit(&mut self, unit: Unit, probe: bool) {
        let running = Running::of(&unit.events);
        let ctx = self.ctx.clone();
        let slot = self.slots.take();
        // Boxed where it is made: a unit's turn is a future of a few KiB,
        // which the spawn would otherwise copy on its way into the task.
        let handle = self.tasks.spawn(Box::pin(async move {
            settle::run(&ctx, unit, probe, slot).await
        }));
        self.held.hand(handle.id(), running);
    }

    /// Gives events back to the index, due again at their times; they stay
    /// held until that is committed, so no read takes them again.
    fn defer(&mut self, back: Vec<(StoredEvent, u64)>) {
        if back.is_empty() {
            return;
        }
        let seqs: SmallVec<[i64; 1]> = back.iter().map(|(ev, _)| ev.seq).collect();
        let changes: Vec<Change> = back
            .iter()
            .map(|(ev, due)| Change::Defer {
                seq: ev.seq,
                due_ms: *due,
            })
            .collect();
        let journal = self.ctx.journal.clone();
        let name = self.ctx.dest.name.clone();
        let handle = self.tasks.spawn(async move {
            // Not released when refused: read again at once, they would
            // be put back again, a loop against a failing journal.
            let release = match journal.settle(&changes).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(destination = %name, error = %e, "cannot put events back for their endpoint's turn: they wait for a restart");
                    false
                }
            };
            Settled {
                deferred: true,
                ..Settled::done(release)
            }
        });
        self.held.hand(handle.id(), Running { seqs, bytes: 0 });
    }

    /// Step 3: while groups are free, starts them: of every expired event
    /// when a deadline passed, else of those waiting for one. Once
    /// stopping, only of those waiting (their fates are recorded: written
    /// within the shutdown grace, or after the next start).
    async fn expire(&mut self) {
        let overdue = match self.expiry {
            Expiry::Now => true,
            Expiry::At(t) => clock::now_ms() >= t,
            Expiry::Unknown => false,
        };
        if overdue && self.groups.len() < EXPIRY_GROUPS && !self.stop.is_cancelled() {
            self.expiry = self.expire_overdue().await;
        }
        while self.groups.len() < EXPIRY_GROUPS && !self.held.expired.is_empty() {
            let take = EXPIRY_GROUP.min(self.held.expired.len());
            let group = self.held.expired.drain(..take).collect();
            self.write_group(group, false);
        }
    }

    /// Hands a group to its own task; its events stay held until it ends.
    fn write_group(&mut self, group: Vec<Doomed>, overdue: bool) {
        let seqs = group.iter().map(|d| d.ev.seq).collect();
        let ctx = self.ctx.clone();
        let handle = self
            .groups
            .spawn(async move { letters::write(&ctx, group).await });
        self.held
            .expiring
            .insert(handle.id(), Group { seqs, overdue });
    }

    /// Step 4: waits for the first thing that can let the loop make
    /// progress, and says which.
    async fn next_wake(&mut self, blocked: &Blocked) -> Wake {
        let live = !self.stop.is_cancelled();
        if live && self.look && self.wants_more(self.room()) {
            return Wake::ReadOn;
        }
        let until = blocked.gate.as_ref().and_then(Gate::until);
        // With every expiry group in flight, the next look waits for one to end.
        let expiry = match self.expiry {
            _ if !live || self.groups.len() >= EXPIRY_GROUPS => None,
            Expiry::Now => Some(0),
            Expiry::At(t) => Some(t),
            Expiry::Unknown => None,
        };
        let due = self.index_due.filter(|_| live);
        let timer = [
            (due, Wake::Due),
            (until, Wake::GateOpens),
            (expiry, Wake::Expiry),
        ]
        .into_iter()
        .filter_map(|(t, wake)| Some((t?, wake)))
        .min_by_key(|(t, _)| *t);
        let timer = async move {
            match timer {
                Some((t, wake)) => {
                    tokio::time::sleep_until(instant_at(t)).await;
                    wake
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.state.indexed(), if live => Wake::Indexed,
            _ = self.state.fresh(), if live => Wake::Fresh,
            _ = self.ctx.health.wake.notified(), if live => Wake::Health,
            _ = self.slots.freed(), if blocked.slots && live => Wake::SlotFree,
            Some(done) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                Wake::Settled(done)
            }
            Some(done) = self.groups.join_next_with_id(), if !self.groups.is_empty() => {
                Wake::Written(done)
            }
            changed = self.updates.changed(), if self.updates_open && live => match changed {
                Ok(()) => Wake::Reload,
                Err(_) => Wake::FleetGone,
            },
            wake = timer => wake,
            _ = self.stop.cancelled(), if live => Wake::Stop,
        }
    }

    /// Takes back every attempt that has ended, not one per turn of the
    /// loop: under load several end between turns.
    fn settled(&mut self, first: Result<(tokio::task::Id, Settled), tokio::task::JoinError>) {
        let mut next = Some(first);
        while let Some(done) = next {
            let (id, release, doomed) = match done {
                Ok((id, settled)) => {
                    self.look |= settled.rescheduled || settled.deferred;
                    if !settled.deferred {
                        self.answering = !settled.rescheduled;
                    }
                    if settled.rescheduled && !self.held.parked.is_empty() {
                        self.spill(true);
                    }
                    (id, settled.release, settled.doomed)
                }
                Err(e) => {
                    tracing::error!(destination = %self.ctx.dest.name, error = %e, "an attempt task failed");
                    self.look = true;
                    (e.id(), true, Vec::new())
                }
            };
            // Still held: their records are yet to be written.
            let keep: HashSet<i64> = doomed.iter().map(|d| d.ev.seq).collect();
            self.held.expired.extend(doomed);
            if let Some(seqs) = self.held.back(id)
                && release
            {
                for seq in seqs.into_iter().filter(|seq| !keep.contains(seq)) {
                    self.held.seqs.remove(&seq);
                }
            }
            next = self.tasks.try_join_next_with_id();
        }
    }

    /// Takes back every dead-letter group that has ended.
    fn written(&mut self, first: Result<(tokio::task::Id, bool), tokio::task::JoinError>) {
        let mut next = Some(first);
        while let Some(done) = next {
            let (id, release) = match done {
                Ok((id, release)) => (id, release),
                Err(e) => {
                    tracing::error!(destination = %self.ctx.dest.name, error = %e, "a dead-letter task failed");
                    (e.id(), true)
                }
            };
            if let Some(group) = self.held.expiring.remove(&id) {
                // More may be overdue behind it.
                if group.overdue {
                    self.expiry = Expiry::Now;
                }
                if release {
                    for seq in group.seqs {
                        self.held.seqs.remove(&seq);
                    }
                }
            }
            next = self.groups.try_join_next_with_id();
        }
    }

    /// Reads due events from the index into the ready queue, up to the
    /// window's events and bytes. Returns when the index's next event
    /// falls due, and whether more are due now.
    async fn read_due(&mut self, room: Room) -> (Option<u64>, bool) {
        let name = &self.ctx.dest.name;
        let now = clock::now_ms();
        let want = room.events.saturating_sub(self.held.ready.len());
        let bytes = room.bytes.saturating_sub(self.held.ready_bytes());
        match self
            .reader
            .due(name, now, want, bytes, &self.held.seqs)
            .await
        {
            Ok((rows, more)) => {
                let taken = self.claim(rows);
                let turn = self.in_turn(taken, true);
                self.held.ready.extend(turn);
                if more {
                    return (None, true);
                }
                match self.reader.next_due_after(&self.ctx.dest.name, now).await {
                    Ok(t) => (t, false),
                    Err(e) => (Some(self.read_failed(&e, now)), false),
                }
            }
            Err(e) => (Some(self.read_failed(&e, now)), false),
        }
    }

    /// Takes events the journal put in memory, oldest first, up to the
    /// window's events and bytes.
    fn take_fresh(&mut self, room: Room) {
        let want = room.events.saturating_sub(self.held.ready.len());
        let bytes = room.bytes.saturating_sub(self.held.ready_bytes());
        if bytes == 0 {
            return;
        }
        let taken = self.state.take_ready(want, bytes);
        let fresh = taken
            .into_iter()
            // Already read from the index: this copy is the same event.
            .filter(|ev| self.held.seqs.insert(ev.seq))
            .collect();
        let turn = self.in_turn(fresh, false);
        self.held.ready.extend(turn);
    }

    /// The events whose turn it is. Those behind their ordering lane's
    /// head wait: from memory, parked here for their turn; from the index
    /// (seldom: their rows wait already, this is one read in the instant
    /// before), set aside for `set_waiting`.
    fn in_turn(&mut self, events: Vec<StoredEvent>, from_index: bool) -> Vec<StoredEvent> {
        let mut turn = Vec::with_capacity(events.len());
        for ev in events {
            // One fated before a restart goes to the sink, whatever its lane.
            if ev.fate.is_some() || self.state.may_start(ev.seq) {
                turn.push(ev);
            } else if from_index {
                self.state.hold(ev.seq);
                self.held.behind.push(ev.seq);
            } else {
                self.held.parked_bytes += ev.event.size();
                self.held.parked.insert(ev.seq, ev);
            }
        }
        if self.held.parked_bytes > PARKED_BYTES {
            self.spill(false);
        }
        turn
    }

    /// Parked events whose turn came go first.
    fn promote(&mut self) {
        if self.held.parked.is_empty() {
            // Turns still taken, so that they do not pile up.
            self.state.take_turns();
            return;
        }
        let seqs = match self.state.take_turns() {
            Turns::Some(seqs) => seqs,
            Turns::All => self.held.parked.keys().copied().collect(),
        };
        for seq in seqs {
            if !self.state.may_start(seq) {
                continue;
            }
            if let Some(ev) = self.held.parked.remove(&seq) {
                self.held.parked_bytes = self.held.parked_bytes.saturating_sub(ev.event.size());
                self.held.ready.push_front(ev);
            }
        }
    }

    /// Gives parked events back to the journal, whose index holds them
    /// until their turn: the newest while they hold more than
    /// `PARKED_BYTES`, and (`stalled`) those behind a head being retried,
    /// whose turn is far (they must also expire on time).
    fn spill(&mut self, stalled: bool) {
        let mut gone: Vec<i64> = Vec::new();
        if stalled {
            gone.extend(
                self.held
                    .parked
                    .keys()
                    .copied()
                    .filter(|&seq| self.state.stalled(seq)),
            );
        }
        let mut bytes = self.held.parked_bytes;
        for (seq, ev) in self.held.parked.iter().rev() {
            if bytes <= PARKED_BYTES {
                break;
            }
            bytes = bytes.saturating_sub(ev.event.size());
            gone.push(*seq);
        }
        for seq in gone {
            if let Some(ev) = self.held.parked.remove(&seq) {
                self.held.parked_bytes = self.held.parked_bytes.saturating_sub(ev.event.size());
                self.held.seqs.remove(&seq);
            }
        }
    }

    /// Has the rows of events set aside by `in_turn` wait for their turn;
    /// they stay held until that is committed, so no read takes them again.
    fn set_waiting(&mut self) {
        if self.held.behind.is_empty() {
            return;
        }
        let seqs = std::mem::take(&mut self.held.behind);
        let changes: Vec<Change> = seqs.iter().map(|&seq| Change::Wait { seq }).collect();
        let journal = self.ctx.journal.clone();
        let name = self.ctx.dest.name.clone();
        let handle = self.tasks.spawn(async move {
            if let Err(e) = journal.settle(&changes).await {
                tracing::warn!(destination = %name, error = %e, "cannot set events to wait for their ordering lane's turn");
            }
            Settled::done(true)
        });
        let seqs = SmallVec::from_vec(seqs);
        self.held.hand(handle.id(), Running { seqs, bytes: 0 });
    }

    /// The rows not held yet, now held; the ready queue forgets them, so
    /// the same event is never held twice.
    fn claim(&mut self, rows: Vec<StoredEvent>) -> Vec<StoredEvent> {
        let taken: Vec<StoredEvent> = rows
            .into_iter()
            .filter(|ev| self.held.seqs.insert(ev.seq))
            .collect();
        self.state.read_from_index(taken.iter().map(|ev| ev.seq));
        taken
    }

    /// Logs a failed read; returns when to read again.
    fn read_failed(&self, e: &LoadError, now: u64) -> u64 {
        tracing::error!(destination = %self.ctx.dest.name, error = %e, "cannot read the journal");
        now + READ_RETRY.as_millis() as u64
    }

    /// Dead-letters every event whose TTL has run out, queued or still in
    /// the journal, whatever its next due time; returns when to look again.
    async fn expire_overdue(&mut self) -> Expiry {
        let dest = self.ctx.dest.clone();
        let now = clock::now_ms();
        let ttl = dest.limits.ttl.as_millis() as u64;
        let take = EXPIRY_GROUP.min(self.held.expired.len());
        let mut expired: Vec<_> = self.held.expired.drain(..take).collect();
        let mut waiting = VecDeque::with_capacity(self.held.ready.len());
        for ev in std::mem::take(&mut self.held.ready) {
            if expired.len() < EXPIRY_GROUP && self.for_the_sink(&ev, now) {
                expired.push(Doomed::read(ev));
            } else {
                waiting.push_back(ev);
            }
        }
        self.held.ready = waiting;
        let mut failed = None;
        if expired.len() < EXPIRY_GROUP {
            let want = EXPIRY_GROUP - expired.len();
            let cutoff = now.saturating_sub(ttl);
            match self
                .reader
                .accepted_before(&dest.name, cutoff, want, &self.held.seqs)
                .await
            {
                Ok(rows) => expired.extend(self.claim(rows).into_iter().map(Doomed::read)),
                Err(e) => failed = Some(self.read_failed(&e, now)),
            }
        }
        let full = expired.len() >= EXPIRY_GROUP || !self.held.expired.is_empty();
        // Those taken from memory go even when the read failed: their seqs
        // are held, so nothing else would ever settle them.
        if !expired.is_empty() {
            self.write_group(expired, true);
        }
        if let Some(retry) = failed {
            return Expiry::At(retry);
        }
        if full {
            // More are overdue: read the next group while this one is written.
            return Expiry::Now;
        }
        match self.reader.oldest_accepted(&dest.name).await {
            // An expired event still in flight would make a deadline in the
            // past: look again a second later rather than spin.
            Ok(Some(oldest)) => match dest.limits.deadline(oldest) {
                d if d <= now => Expiry::At(now + 1000),
                d => Expiry::At(d),
            },
            // Events held but not in the index yet: `refill` sets their deadline.
            Ok(None) => Expiry::Unknown,
            Err(e) => Expiry::At(self.read_failed(&e, now)),
        }
    }

    /// Past its TTL, or fated before a restart: never attempted, its dead
    /// letter goes in an expiry group.
    fn for_the_sink(&self, ev: &StoredEvent, now: u64) -> bool {
        ev.fate.is_some() || self.ctx.dest.limits.expired(ev.event.accepted_ms, now)
    }
}
