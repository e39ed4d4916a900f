//! The journal: the single source of truth for pending work. Every state
//! change of an event is a journal write; the 202 to the app waits for it.
//!
//! Two stages, each on its own thread. The writer appends each group of
//! accepted events to the intake log as one record with one fdatasync
//! (group commit: the group grows with load, so there is no linger timer),
//! and only then answers. The indexer follows the log into SQLite (WAL
//! mode), where events that wait (retries scheduled hours ahead, a held
//! back destination's backlog) are rows with an index on (destination,
//! next due). A row keeps its event's place in the log, not a copy
//! (`fetch`): segments stay while rows point into them, and one mostly
//! delivered has its last waiting events copied into their rows so that
//! it can go (`Spill::once` (indexer/spill.rs)). Reads go through their own connections,
//! which WAL lets run beside the indexer. On start, whatever the log holds
//! beyond SQLite's last synced commit is indexed again before anything
//! else runs.

mod backpressure;
mod dedupe;
mod disk;
mod fetch;
mod indexer;
mod inspect;
pub(crate) mod intake;
mod kept;
mod lanes;
mod open;
mod pack;
mod reader;
mod ready;
pub mod record;
mod reserve;
mod shares;
mod skip;
mod store;
mod unindexed;
mod writer;

pub use inspect::inspect;
pub(crate) use kept::{Disabled, Pause};
pub(crate) use lanes::{LanesView, Turns};
pub(crate) use reader::Reader;
pub(crate) use ready::ReadyQueue;
pub use record::Carried;
pub(crate) use store::{DestinationSummary, EndpointRows, FILE, LoadError};

use crate::clock;
use crate::config::HistorySettings;
use crate::event::{Fate, NewEvent, Outcome, StoredEvent, endpoint};
use crate::history::{Attempt, History, HistoryError, Step};
use crate::metrics;
use arc_swap::ArcSwap;
use dedupe::{Check, Claim, Dedupe};
use indexer::ToIndexer;
use kept::{Kept, KeptError, Pauses};
use lanes::Lanes;
use reserve::Reserve;
use rusqlite::Connection;
use shares::EndpointShares;
use skip::{Delivered, Skip};
use smallvec::SmallVec;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::futures::Notified;
use tokio::sync::{Notify, mpsc, oneshot};
use unindexed::Unindexed;

/// What `append` did beyond storing.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Appended {
    /// Indexes (in the request) of events left out as duplicates.
    pub duplicates: Vec<usize>,
}

/// Why a write was refused; each maps to one ingress status.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub(crate) enum JournalError {
    #[error(
        "the journal holds {pending} bytes of pending events; its limit (journal.max_bytes) is {limit}"
    )]
    Full { pending: u64, limit: u64 },
    #[error(
        "the destination {destination} holds {pending} bytes of pending events; its share of the journal (destinations.{destination}.max_pending_bytes) is {share}"
    )]
    DestinationFull {
        destination: String,
        pending: u64,
        share: u64,
    },
    #[error(
        "the endpoint {origin} of {destination} holds {pending} bytes of pending events; its share of the journal (destinations.{destination}.endpoints.max_pending_bytes) is {share}"
    )]
    EndpointFull {
        destination: String,
        origin: String,
        pending: u64,
        share: u64,
    },
    #[error("the disk holding the journal is full")]
    DiskFull,
    #[error(
        "the journal refused writes after a failed commit ({0}); fix the disk and restart courier"
    )]
    Failed(String),
    #[error("the journal's queue is full")]
    Busy,
    #[error("the journal cannot write right now ({0}); try again shortly")]
    Strained(String),
    #[error("courier is shutting down")]
    Closed,
}

/// Errors that stop courier from starting.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot create the journal directory {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("cannot create the lock file {0}: {1}; journal.dir must be writable by courier")]
    Lock(PathBuf, std::io::Error),
    #[error("the journal {0} is in use by another courier process (lock held on {1})")]
    Locked(PathBuf, PathBuf),
    #[error("no journal at {0}: courier has not run with this journal.dir, or the path is wrong")]
    Missing(PathBuf),
    #[error(
        "cannot open the journal {0}: {1}. If the file is damaged, stop courier, move it aside, and inspect it with `courier journal inspect --dir DIR`"
    )]
    Open(PathBuf, rusqlite::Error),
    #[error(
        "the journal {0} failed its integrity check ({1}). Courier will not start and discard pending events: restore the file from a backup, or move it aside to start empty and inspect it with `courier journal inspect --dir DIR`"
    )]
    Integrity(PathBuf, String),
    #[error(
        "cannot replay the journal's intake log in {0}: {1}. Courier will not start and discard acknowledged events: restore the directory from a backup, or move the damaged intake-*.log file aside (giving up the events in it and after it); journal.db keeps everything else"
    )]
    Intake(PathBuf, String),
    #[error(
        "the journal's intake log in {dir} lost {events} acknowledged events: they should follow position {end} in {file}, which is truncated, damaged or missing (the log was acknowledged up to position {acknowledged}). Courier will not start and discard them: restore {file} from a backup; or, to give them up and start, remove {dir}/intake.mark"
    )]
    TailLost {
        dir: PathBuf,
        file: PathBuf,
        events: i64,
        end: u64,
        acknowledged: u64,
    },
    #[error(
        "cannot read {0} ({1}), which records how far the intake log was acknowledged: courier will not start without knowing whether acknowledged events were lost. Restore the file from a backup; or, to start without that check, remove it"
    )]
    MarkUnreadable(PathBuf, String),
    #[error("cannot read the intake log in {0} to check the rows' events: {1}")]
    InspectLog(PathBuf, String),
    #[error(
        "the disk holding the journal {0} is full ({1} bytes free): free space on that volume or give it more room (journal.max_bytes of pending events and about as much again), then start courier again. No event was lost"
    )]
    DiskFull(PathBuf, u64),
    #[error(
        "cannot replay the journal's intake log in {0} right now ({1}): this passes by itself, nothing is damaged. Start courier again"
    )]
    Retry(PathBuf, String),
    #[error(
        "{0} is missing, but its directory holds the intake log of an earlier journal: journal.db was deleted or moved. Restore it from a backup; or, to start empty, move intake.mark and the intake-*.log files aside too"
    )]
    DbMissing(PathBuf),
    #[error(transparent)]
    Kept(#[from] KeptError),
    #[error(transparent)]
    History(#[from] HistoryError),
}

/// Errors that may mean the disk is full rather than damaged.
trait DiskError {
    fn disk_full(&self) -> bool;
}

impl DiskError for std::io::Error {
    fn disk_full(&self) -> bool {
        intake::is_disk_full(self)
    }
}

impl DiskError for HistoryError {
    fn disk_full(&self) -> bool {
        matches!(self, HistoryError::DiskFull(..))
    }
}

impl DiskError for rusqlite::Error {
    fn disk_full(&self) -> bool {
        self.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
    }
}

/// A change to an event after an attempt (or a TTL expiry), named by its
/// seq alone: the journal knows each event's destination and size, and
/// keeps its counters from what it recorded, not from what a caller says.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Change {
    /// Delivered or dead-lettered: the event leaves the journal. With
    /// `only_if_attempts`, only if no later attempt was recorded since.
    Delete {
        seq: i64,
        only_if_attempts: Option<u32>,
        /// For history: how it ended (`None`: recorded already, as a
        /// dead letter's fate is).
        step: Option<Step>,
    },
    Reschedule {
        seq: i64,
        attempts: u32,
        next_due_ms: u64,
        outcome: Outcome,
        status: Option<u16>,
        attempt_ms: u64,
        /// How long the attempt took, for history.
        took_ms: u32,
        /// The batch the event stays in for its retry (`None`: none).
        batch: Option<String>,
    },
    /// A row whose checksum failed: kept, never due again.
    Quarantine { seq: i64 },
    /// An event met behind its ordering lane's head: due only once the
    /// head leaves (`lanes`).
    Wait { seq: i64 },
    /// The head of its lane left: a waiting event is due at `at_ms`.
    Unwait { seq: i64, at_ms: u64 },
    /// Its endpoint cannot take it now (`url: per_event`): due again at
    /// `due_ms`, no attempt counted. A waiting or quarantined row stays so.
    Defer { seq: i64, due_ms: u64 },
    /// Every pending row of one endpoint is due at `at_ms` (it was
    /// disabled: they go to the sink now, not at their next attempt). A
    /// waiting, quarantined or fated row stays so; events not yet rows
    /// are due already.
    EndpointDue {
        destination: String,
        origin: String,
        at_ms: u64,
    },
    /// The event will be dead-lettered: its fate, recorded (and synced)
    /// before the sink is written, so that a crash between the record and
    /// the delete neither sends the event again nor writes a second record.
    DeadLetter {
        seq: i64,
        fate: Fate,
        /// The attempt that ended it, for history (none at a TTL).
        attempt: Option<Attempt>,
    },
}

impl Change {
    /// What history records of this change.
    pub(crate) fn step(&self) -> Option<Step> {
        match self {
            Change::Delete { step, .. } => step.clone(),
            Change::Reschedule {
                attempts,
                next_due_ms,
                outcome,
                status,
                attempt_ms,
                took_ms,
                ..
            } => Some(Step::Attempted {
                attempt: Attempt {
                    number: *attempts,
                    // `attempt_ms` is when it ended, as the journal keeps it.
                    at_ms: attempt_ms.saturating_sub(u64::from(*took_ms)),
                    took_ms: *took_ms,
                    status: *status,
                    outcome: *outcome,
                    late: false,
                },
                next_due_ms: *next_due_ms,
            }),
            Change::Quarantine { .. }
            | Change::Wait { .. }
            | Change::Unwait { .. }
            | Change::Defer { .. }
            | Change::EndpointDue { .. } => None,
            Change::DeadLetter { fate, attempt, .. } => Some(Step::DeadLettered {
                reason: fate.reason,
                at_ms: fate.at_ms,
                attempt: attempt.clone(),
            }),
        }
    }

    pub(crate) fn seq(&self) -> i64 {
        match self {
            Change::Delete { seq, .. }
            | Change::Reschedule { seq, .. }
            | Change::Quarantine { seq }
            | Change::Wait { seq }
            | Change::Unwait { seq, .. }
            | Change::Defer { seq, .. }
            | Change::DeadLetter { seq, .. } => *seq,
            // Of the rows there are: none waits for a row to come.
            Change::EndpointDue { .. } => 0,
        }
    }
}

/// One destination's face of the journal: its counters, kept in memory so
/// that admission and metrics never query the file, and its fast path.
/// Only the journal writes them; a dispatcher takes events, says whether
/// it is delivering (the pacing signal), and waits for news.
pub(crate) struct DestinationState {
    pending: AtomicU64,
    /// Counted from admission, as the journal's total is: taken before the
    /// write (so that concurrent requests cannot all pass the share), given
    /// back if the write fails.
    bytes: AtomicU64,
    /// The most `bytes` may reach (`max_pending_bytes`), so that an
    /// endpoint that is down fills only its own part of the journal.
    /// `u64::MAX` until the config sets it: a destination known only from
    /// an earlier config's events counts toward the total only.
    share: AtomicU64,
    /// Woken after a commit that added rows for this destination.
    indexed: Notify,
    /// Events durable in the log, not yet taken by the dispatcher.
    ready: Mutex<ReadyQueue>,
    /// Woken when the writer put events in `ready`.
    fresh: Notify,
    /// Woken (all waiters) when the dispatcher took events from `ready`.
    room: Notify,
    /// Set by the dispatcher while it is sending (not paused, on
    /// probation or held by a Retry-After): only then is ingress paced.
    delivering: AtomicBool,
    /// Cleared by the dispatcher while its gate holds it (paused, on
    /// probation, a Retry-After; not its rate limit, at which it still
    /// sends): the writer then leaves new events to the
    /// index, where the dispatcher finds them when it sends again, rather
    /// than keep `ready` full for nothing (a paused destination's backlog
    /// held 4 MiB there). Not cleared by a failing attempt alone: the
    /// events of an endpoint that fails now and then still go out from
    /// memory.
    sending: AtomicBool,
    /// Accept times of events not in SQLite yet, for the oldest's age.
    unindexed: Mutex<Unindexed>,
    /// `url: per_event`: each endpoint's bytes, against its share.
    endpoints: EndpointShares,
    /// Its ordering lanes, when it has an `ordering` key: kept by the
    /// writer (accepts), the indexer (waiting rows) and the changes that
    /// end events (`Shared::pass_turns`).
    lanes: Mutex<Option<Lanes>>,
    /// Its `courier_accepted_total`, found at its first event: looked up
    /// at each commit, the series' label was allocated and the registry
    /// hashed, ~2.5 of an event's allocations (benches/RESULTS.md).
    accepted: OnceLock<::metrics::Counter>,
}

impl Default for DestinationState {
    fn default() -> Self {
        DestinationState {
            pending: AtomicU64::default(),
            bytes: AtomicU64::default(),
            share: AtomicU64::new(u64::MAX),
            endpoints: EndpointShares::default(),
            indexed: Notify::default(),
            ready: Mutex::default(),
            fresh: Notify::default(),
            room: Notify::default(),
            delivering: AtomicBool::default(),
            sending: AtomicBool::new(true),
            unindexed: Mutex::default(),
            lanes: Mutex::default(),
            accepted: OnceLock::new(),
        }
    }
}

impl DestinationState {
    /// Counts `n` events of `name` (this state's destination) accepted.
    pub(crate) fn accepted(&self, name: &str, n: u64) {
        self.accepted
            .get_or_init(|| crate::metrics::accepted(name))
            .increment(n);
    }

    /// Events pending: durable and not yet delivered or dead-lettered.
    pub(crate) fn pending(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }

    /// Their bytes, with those of appends under way.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Resolves after a commit that made rows of this destination's events.
    pub(crate) fn indexed(&self) -> Notified<'_> {
        self.indexed.notified()
    }

    /// Resolves when the writer put events in the ready queue.
    pub(crate) fn fresh(&self) -> Notified<'_> {
        self.fresh.notified()
    }

    /// Takes up to `n` durable events from memory, oldest first, and no
    /// more once they hold `max_bytes` (at least one); paced appends
    /// waiting for room are woken.
    pub(crate) fn take_ready(&self, n: usize, max_bytes: u64) -> Vec<StoredEvent> {
        let taken = match self.ready.lock() {
            Ok(mut ready) => ready.take(n, max_bytes),
            Err(_) => return Vec::new(),
        };
        if !taken.is_empty() {
            self.room.notify_waiters();
        }
        taken
    }

    /// `seqs` were read from the index: their copies in memory go, so that
    /// no event is handed out twice.
    pub(crate) fn read_from_index(&self, seqs: impl IntoIterator<Item = i64>) {
        if let Ok(mut ready) = self.ready.lock() {
            ready.remove(seqs);
        }
    }

    pub(super) fn lanes(&self) -> std::sync::MutexGuard<'_, Option<Lanes>> {
        // Plain bookkeeping: a panic elsewhere cannot leave it torn.
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the event `seq` may be attempted now: it has no ordering
    /// lane, or every earlier event of its lane has left the journal.
    pub(crate) fn may_start(&self, seq: i64) -> bool {
        self.lanes().as_ref().is_none_or(|l| l.may_start(seq))
    }

    /// Whether `seq` waits behind its lane's head; if so, it is marked to
    /// be named when its turn comes (its row is to wait: `Change::Wait`).
    pub(crate) fn hold(&self, seq: i64) -> bool {
        self.lanes().as_mut().is_some_and(|l| l.hold(seq))
    }

    /// The events whose turn came since the last call (`Lanes::take_turns`).
    pub(crate) fn take_turns(&self) -> Turns {
        match self.lanes().as_mut() {
            Some(l) => l.take_turns(),
            None => Turns::Some(Vec::new()),
        }
    }

    /// Whether `seq` waits behind a head that is being retried.
    pub(crate) fn stalled(&self, seq: i64) -> bool {
        self.lanes().as_ref().is_some_and(|l| l.stalled(seq))
    }

    /// Its lanes, when it has an ordering key.
    pub(crate) fn lanes_view(&self) -> Option<LanesView> {
        self.lanes().as_ref().map(Lanes::view)
    }

    /// The backpressure signal: whether this destination is delivering as
    /// fast as it can (neither held back nor failing), so that ingress
    /// should keep pace with it rather than fill the journal; and whether
    /// its gate lets it send at all (`sending`).
    pub(crate) fn pace(&self, delivering: bool, sending: bool) {
        self.delivering.store(delivering, Ordering::Relaxed);
        self.sending.store(sending, Ordering::Relaxed);
    }
}

/// An event handed out from memory: its destination's counters, its size,
/// and its endpoint's origin when its bytes count against the endpoint's
/// share, freed when it is delivered.
pub(crate) struct Handed {
    pub state: Arc<DestinationState>,
    pub size: u64,
    pub origin: Option<Arc<str>>,
}

pub(crate) struct Shared {
    /// Released when the last thread of this journal is gone.
    _lock: std::fs::File,
    dir: PathBuf,
    /// The intake log's disk, which readers read events from too.
    disk: Arc<dyn disk::Disk>,
    path: PathBuf,
    /// Set by the writer thread.
    by_writer: ByWriter,
    /// Set by the indexer thread.
    by_indexer: ByIndexer,
    /// Room for events: taken by appends, given back by deletes.
    space: Space,
    /// Whether writes are taken.
    gate: Gate,
    dedupe: Option<Arc<Mutex<Dedupe>>>,
    /// Deliveries of events the indexer has not reached, and the counters
    /// and size each event in memory was handed out with.
    skip: Mutex<Skip<Handed>>,
    /// Copied on write: a reload adds a destination rarely, every group
    /// commit reads the map.
    destinations: ArcSwap<HashMap<String, Arc<DestinationState>>>,
    pauses: Pauses,
    /// Endpoints disabled, by `kept::endpoint_key`.
    disabled: Kept<Disabled>,
    /// Recorded by the indexer (docs/history.md); `None` when off.
    history: Option<History>,
}

struct ByWriter {
    /// The intake log's end after the writer's last group.
    written_end: AtomicU64,
}

struct ByIndexer {
    /// The intake log's position up to which SQLite has synced the rows:
    /// segments before it may be recycled, unless `pinned`.
    durable_pos: AtomicU64,
    /// Starts of the log segments synced rows point into; published before
    /// `durable_pos`, so it is never older than the position read first.
    pinned: Mutex<Arc<BTreeSet<u64>>>,
    /// The indexer sleeps with nothing to index: the writer's next group
    /// wakes it.
    idle: AtomicBool,
}

struct Space {
    max_bytes: u64,
    pending_bytes: AtomicU64,
    /// Set at ENOSPC: ingress answers 507 without touching the disk until
    /// the reserve can be taken back.
    disk_full: AtomicBool,
    /// One transition of `disk_full` at a time.
    disk_turn: Mutex<()>,
    reserve: Reserve,
}

struct Gate {
    /// Why a commit failed: writes are refused until restart.
    failed: Mutex<Option<String>>,
    closed: AtomicBool,
    /// Set before a hand-off reads what is pending: no event comes in
    /// after it (appends, replays and adoptions answer `Closed`), while
    /// deletes and the index go on.
    sealed: AtomicBool,
}

impl Shared {
    /// The disk is full: stop taking events, give SQLite the reserve.
    fn full(&self) {
        let Ok(_turn) = self.space.disk_turn.lock() else {
            return;
        };
        if !self.space.disk_full.swap(true, Ordering::AcqRel) {
            self.space.reserve.release();
            tracing::warn!(
                dir = %self.dir.display(),
                released = self.space.reserve.size(),
                needed = self.space.reserve.needed(),
                "the journal's disk is full: ingress answers 507 until `needed` bytes are free; deliveries go on in the released reserve"
            );
        }
    }

    /// Whether ingress may write again: only once the reserve is back.
    fn room(&self) -> bool {
        if !self.space.disk_full.load(Ordering::Acquire) {
            return true;
        }
        // One transition at a time: a `full` from the indexer between the
        // take and the flag would otherwise leave no reserve and no flag.
        let Ok(_turn) = self.space.disk_turn.lock() else {
            return false;
        };
        if !self.space.disk_full.load(Ordering::Acquire) {
            return true;
        }
        if matches!(self.space.reserve.take(), reserve::Taken::NoRoom { .. }) {
            return false;
        }
        self.space.disk_full.store(false, Ordering::Release);
        tracing::info!(dir = %self.dir.display(), "the journal's disk has room again: accepting events");
        true
    }

    fn destination(&self, name: &str) -> Option<Arc<DestinationState>> {
        self.destinations.load().get(name).cloned()
    }

    /// What `changes` do to ordering lanes: an event that leaves (deleted,
    /// or quarantined: it never goes out again) passes its lane's turn on,
    /// and a rescheduled head blocks its lane. Returns the changes that
    /// make waiting rows due, and the destinations to wake once they are
    /// committed. Before the commit: a failed one fails the journal, and
    /// nothing is attempted after it.
    fn pass_turns(&self, changes: &[Change]) -> (Vec<Change>, Vec<Arc<DestinationState>>) {
        let mut unwaits = Vec::new();
        let mut woken = Vec::new();
        let now = clock::now_ms();
        for state in self.destinations.load().values() {
            let mut lanes = state.lanes();
            let Some(lanes) = lanes.as_mut() else {
                continue;
            };
            let before = unwaits.len();
            for c in changes {
                match c {
                    // A fated event is never attempted again: the next of
                    // its lane goes on while its record waits for the sink,
                    // as after a restart (`in_seq_order` leaves it out).
                    Change::Delete { seq, .. }
                    | Change::Quarantine { seq }
                    | Change::DeadLetter { seq, .. } => {
                        if let Some(next) = lanes.finish(*seq) {
                            unwaits.push(Change::Unwait {
                                seq: next,
                                at_ms: now,
                            });
                        }
                    }
                    Change::Reschedule { seq, .. } => lanes.retrying(*seq, now),
                    _ => {}
                }
            }
            if unwaits.len() > before {
                woken.push(state.clone());
            }
        }
        (unwaits, woken)
    }

    /// Writes are refused after a failed commit, and once closing.
    fn writable(&self) -> Result<(), JournalError> {
        if let Some(reason) = self
            .gate
            .failed
            .lock()
            .map_err(|_| JournalError::Closed)?
            .as_ref()
        {
            return Err(JournalError::Failed(reason.clone()));
        }
        if self.gate.closed.load(Ordering::Acquire) {
            return Err(JournalError::Closed);
        }
        Ok(())
    }

    /// Whether new events may come in: writable and not sealed.
    fn admits(&self) -> Result<(), JournalError> {
        self.writable()?;
        if self.gate.sealed.load(Ordering::Acquire) {
            return Err(JournalError::Closed);
        }
        Ok(())
    }

    /// `events` of `bytes` in all left the journal: their bytes are free.
    fn forget(&self, destination: Option<&DestinationState>, events: u64, bytes: u64) {
        sub(&self.space.pending_bytes, bytes);
        if let Some(d) = destination {
            sub(&d.pending, events);
            sub(&d.bytes, bytes);
        }
    }

    /// Takes room for `events` before they are queued, so that concurrent
    /// requests cannot all pass the checks: each destination's share
    /// first, so that a request its share refuses never holds room in the
    /// total that another destination's request could need, then the
    /// total. All or nothing, as the events are committed together. The
    /// room is kept once they are durable, given back by `unreserve` if
    /// the write fails. Returns the origins whose shares it took.
    fn reserve(&self, events: &[NewEvent], adopted: bool) -> Result<Origins, JournalError> {
        let sizes = by_destination(events);
        let size: u64 = sizes.iter().map(|(_, n)| n).sum();
        let limit = self.space.max_bytes;
        let states = self.destinations.load();
        let mut taken: SmallVec<[(&DestinationState, u64); 1]> = SmallVec::new();
        let give_back = |taken: &[(&DestinationState, u64)]| {
            for (d, own) in taken {
                sub(&d.bytes, *own);
            }
        };
        for &(name, own) in &sizes {
            let Some(d) = states.get(name) else {
                continue;
            };
            let share = d.share.load(Ordering::Relaxed);
            let fits = d
                .bytes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                    b.checked_add(own).filter(|n| *n <= share)
                });
            if let Err(pending) = fits {
                give_back(&taken);
                // When the total refuses too, a full journal is the answer
                // (for a lone destination the share is the whole journal).
                let total = self.space.pending_bytes.load(Ordering::Acquire);
                if total + size > limit {
                    return Err(JournalError::Full {
                        pending: total,
                        limit,
                    });
                }
                return Err(JournalError::DestinationFull {
                    destination: name.to_string(),
                    pending,
                    share,
                });
            }
            taken.push((d, own));
        }
        let origins = match take_endpoint_shares(&states, events, adopted) {
            Ok(origins) => origins,
            Err(e) => {
                give_back(&taken);
                return Err(e);
            }
        };
        let fits =
            self.space
                .pending_bytes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                    (p + size <= limit).then_some(p + size)
                });
        if let Err(pending) = fits {
            give_back(&taken);
            give_endpoint_shares(&states, events, &origins);
            return Err(JournalError::Full { pending, limit });
        }
        Ok(origins)
    }

    /// Gives back what `reserve` took for `events`, which were not written
    /// (`origins`: the endpoints' shares it took, as it returned them).
    fn unreserve(&self, events: &[NewEvent], origins: &Origins) {
        let states = self.destinations.load();
        give_endpoint_shares(&states, events, origins);
        for e in events {
            let size = e.size();
            sub(&self.space.pending_bytes, size);
            // Every destination an event can name has counters before
            // ingress routes to it (`set_share`), and counters are never
            // removed: those found here are those `reserve` charged.
            if let Some(d) = states.get(&e.destination) {
                sub(&d.bytes, size);
            }
        }
    }
}

/// Each event's endpoint origin where its destination counts endpoint
/// shares, in the events' order; empty when none does. The writer hands
/// them on with the events, which then need not read their URLs again
/// (with 10,000 endpoints that was ~0.4 µs an event on its thread).
pub(crate) type Origins = Vec<Option<Arc<str>>>;

/// Takes each event's bytes from its endpoint's share, for destinations
/// that count them: all or nothing.
fn take_endpoint_shares(
    states: &HashMap<String, Arc<DestinationState>>,
    events: &[NewEvent],
    adopted: bool,
) -> Result<Origins, JournalError> {
    let mut origins = Origins::new();
    for (i, e) in events.iter().enumerate() {
        let Some(d) = states.get(&e.destination).filter(|d| d.endpoints.counted()) else {
            continue;
        };
        // Shared by the share's map and the event handed out: one copy.
        let Some(origin) = endpoint::shared_origin_of(e) else {
            continue;
        };
        match d.endpoints.take(&origin, e.size(), adopted) {
            Ok(true) => {
                origins.resize(events.len(), None);
                origins[i] = Some(origin);
            }
            // Not counted after all (a reload between the two looks).
            Ok(false) => {}
            Err((pending, share)) => {
                give_endpoint_shares(states, &events[..i], &origins);
                return Err(JournalError::EndpointFull {
                    destination: e.destination.clone(),
                    origin: origin.to_string(),
                    pending,
                    share,
                });
            }
        }
    }
    Ok(origins)
}

/// Gives back what `take_endpoint_shares` took for `events`: by the
/// origins it recorded, not by the config now (a reload between the two
/// would have given back bytes never taken, or kept some).
fn give_endpoint_shares(
    states: &HashMap<String, Arc<DestinationState>>,
    events: &[NewEvent],
    origins: &Origins,
) {
    for (e, origin) in events.iter().zip(origins) {
        if let (Some(d), Some(origin)) = (states.get(&e.destination), origin) {
            d.endpoints.give(origin, e.size());
        }
    }
}

/// Changes for the indexer, committed (and synced if `sync`) when this
/// returns.
async fn to_indexer(
    indexer: &std::sync::mpsc::Sender<ToIndexer>,
    changes: Vec<Change>,
    sync: bool,
) -> Result<(), JournalError> {
    let (reply, rx) = oneshot::channel();
    indexer
        .send(ToIndexer::Apply {
            changes,
            sync,
            reply,
        })
        .map_err(|_| JournalError::Closed)?;
    rx.await.map_err(|_| JournalError::Closed)?
}

/// Wakes the dispatchers of destinations whose waiting rows became due.
fn wake(states: &[Arc<DestinationState>]) {
    for state in states {
        state.indexed.notify_one();
    }
}

/// Lowers a counter, never below zero.
fn sub(v: &AtomicU64, n: u64) {
    let _ = v.fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
        Some(x.saturating_sub(n))
    });
}

/// The bytes of `events` per destination. A list, not a map: a request
/// names one destination, or a topic's few.
fn by_destination(events: &[NewEvent]) -> SmallVec<[(&str, u64); 1]> {
    let mut sizes: SmallVec<[(&str, u64); 1]> = SmallVec::new();
    for e in events {
        let name = e.destination.as_str();
        match sizes.iter_mut().find(|(n, _)| *n == name) {
            Some((_, size)) => *size += e.size(),
            None => sizes.push((name, e.size())),
        }
    }
    sizes
}

pub(crate) enum Command {
    Append {
        events: Vec<NewEvent>,
        /// Dedupe keys of `events`, pending until they are durable.
        claims: Vec<Claim>,
        /// Adopted events' delivery so far, one per event: such a command
        /// is a group, and a record, of its own ("CRC1"), and its events
        /// wait in the index for their due time, never in memory.
        carried: Option<Vec<Carried>>,
        /// Each event's ordering lane (`lanes::place`); empty when no
        /// destination of these events has lanes.
        placed: Vec<Option<lanes::Placed>>,
        /// Each event's endpoint, as its share was taken (`reserve`).
        origins: Origins,
        reply: oneshot::Sender<Result<(), JournalError>>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

/// A handle to the journal; cheap to clone.
#[derive(Clone)]
pub(crate) struct Journal {
    tx: mpsc::Sender<Command>,
    indexer: std::sync::mpsc::Sender<ToIndexer>,
    shared: Arc<Shared>,
}

/// How often one append may wait for other requests' writes of the same
/// ids before it gives up with 503.
const DEDUPE_ROUNDS: usize = 64;

/// Commands queued beyond this are refused with 503 rather than held.
const QUEUE: usize = 16_384;

impl Journal {
    /// Opens the journal in `dir`, checks it, and recovers the counters of
    /// every pending event. `destinations` are the configured names; rows of
    /// other destinations are kept and reported, never dropped.
    pub(crate) fn open(
        dir: &Path,
        full_sync: bool,
        max_bytes: u64,
        dedupe_window: Option<Duration>,
        destinations: &[String],
        history: Option<HistorySettings>,
    ) -> Result<(Journal, Vec<DestinationSummary>), OpenError> {
        Journal::open_with(
            disk::real(),
            dir,
            full_sync,
            max_bytes,
            dedupe_window,
            destinations,
            history,
        )
    }

    /// The event history this journal records, when on.
    pub(crate) fn history(&self) -> Option<&History> {
        self.shared.history.as_ref()
    }

    /// Stores `events` durably (per `journal.sync`); returns once committed.
    /// With a dedupe window, events whose id this destination already
    /// stored within it are left out, and reported.
    pub(crate) async fn append(&self, events: Vec<NewEvent>) -> Result<Appended, JournalError> {
        self.shared.admits()?;
        backpressure::keep_pace(&self.shared, &events).await;
        let Some(dedupe) = &self.shared.dedupe else {
            self.store(events, Vec::new(), None).await?;
            return Ok(Appended::default());
        };
        // Bounded: each round waits for another request's write to finish.
        for _ in 0..DEDUPE_ROUNDS {
            let now = clock::now_ms();
            let mut claims = Vec::with_capacity(events.len());
            let mut duplicates = Vec::new();
            let mut wait = None;
            {
                let mut d = dedupe.lock().map_err(|_| JournalError::Closed)?;
                for (i, e) in events.iter().enumerate() {
                    let key = dedupe::key(&e.destination, &e.id);
                    match Dedupe::check(dedupe, &mut d, &key, now) {
                        Check::Fresh(claim) => claims.push((i, claim)),
                        Check::Duplicate => duplicates.push(i),
                        Check::Wait(rx) => {
                            wait = Some(rx);
                            break;
                        }
                    }
                }
            }
            if let Some(mut rx) = wait {
                // Never hold claims while waiting on another request's: two
                // requests sharing ids could otherwise wait on each other.
                drop(claims);
                let _ = rx.changed().await;
                continue;
            }
            for &i in &duplicates {
                metrics::deduplicated(&events[i].destination);
            }
            if claims.is_empty() {
                return Ok(Appended { duplicates });
            }
            let keep: HashSet<usize> = claims.iter().map(|(i, _)| *i).collect();
            let fresh = events
                .into_iter()
                .enumerate()
                .filter(|(i, _)| keep.contains(i))
                .map(|(_, e)| e)
                .collect();
            let claims = claims.into_iter().map(|(_, c)| c).collect();
            self.store(fresh, claims, None).await?;
            return Ok(Appended { duplicates });
        }
        Err(JournalError::Busy)
    }

    /// Stores dead letters put back by an operator, durably, past the
    /// dedupe window: a replay is meant to be delivered again.
    pub(crate) async fn replay(&self, events: Vec<NewEvent>) -> Result<(), JournalError> {
        self.shared.admits()?;
        backpressure::keep_pace(&self.shared, &events).await;
        self.store(events, Vec::new(), None).await
    }

    /// Stores events handed off by another courier, durably, each with
    /// its delivery so far (docs/object-storage.md), past the dedupe window (an adopted
    /// event was accepted once already). A destination this courier does
    /// not know gets counters, and its events wait as orphaned ones do.
    pub(crate) async fn adopt(&self, events: Vec<(NewEvent, Carried)>) -> Result<(), JournalError> {
        self.shared.admits()?;
        for (e, _) in &events {
            if self.shared.destination(&e.destination).is_none() {
                self.add_destination(&e.destination);
                self.set_share(&e.destination, self.shared.space.max_bytes);
            }
        }
        let (events, carried): (Vec<NewEvent>, Vec<Carried>) = events.into_iter().unzip();
        backpressure::keep_pace(&self.shared, &events).await;
        self.store(events, Vec::new(), Some(carried)).await
    }

    /// `claims` go with the command: the writer stores them once the events
    /// are durable, and any other fate of the command drops (frees) them.
    async fn store(
        &self,
        events: Vec<NewEvent>,
        claims: Vec<Claim>,
        carried: Option<Vec<Carried>>,
    ) -> Result<(), JournalError> {
        // Once queued, the writer gives the room back if the write fails,
        // even when this request's caller has gone away.
        // An adopted event was accepted once already: its endpoint's share
        // counts it, but does not refuse it (one full endpoint would hold
        // back every other event of the object).
        let origins = self.shared.reserve(&events, carried.is_some())?;
        let placed = lanes::place(&self.shared, &events);
        let (reply, rx) = oneshot::channel();
        if let Err(refused) = self.send(Command::Append {
            events,
            origins,
            claims,
            carried,
            placed,
            reply,
        }) {
            let (e, cmd) = *refused;
            if let Command::Append {
                events, origins, ..
            } = &cmd
            {
                self.shared.unreserve(events, origins);
            }
            return Err(e);
        }
        rx.await.unwrap_or(Err(JournalError::Closed))
    }

    /// Applies changes that must survive a crash once this returns (with
    /// `sync: always`): a dead letter's fate and its delete, a quarantine. They go
    /// straight to the indexer, never behind a burst of ingress.
    pub(crate) async fn apply(&self, changes: &[Change]) -> Result<(), JournalError> {
        self.shared.writable()?;
        let (unwaits, woken) = self.shared.pass_turns(changes);
        let all = changes.iter().cloned().chain(unwaits).collect();
        to_indexer(&self.indexer, all, true).await?;
        wake(&woken);
        Ok(())
    }

    /// Takes no new event from now on (appends, replays and adoptions
    /// answer `Closed`): what is pending can then be read whole, and
    /// handed off, while deliveries' deletes still go on.
    pub(crate) fn seal(&self) {
        self.shared.gate.sealed.store(true, Ordering::Release);
    }

    /// Has the indexer make rows of every event the log holds, synced:
    /// then a reader sees every pending event (a hand-off reads them all).
    pub(crate) async fn index_all(&self) -> Result<(), JournalError> {
        self.shared.writable()?;
        to_indexer(&self.indexer, Vec::new(), true).await
    }

    /// Records deliveries and reschedules: committed when this returns, so
    /// a dispatcher never reads a delivered event back, and synced within
    /// `DURABLE_EVERY` (a crash before then delivers those events again,
    /// or retries them one attempt behind, as at-least-once allows). A
    /// delivery of an event handed out from memory that the indexer has
    /// not reached costs no write.
    /// Takes the changes by reference so that a caller can try again
    /// without a copy made each time for a failure that seldom comes.
    pub(crate) async fn settle(&self, changes: &[Change]) -> Result<(), JournalError> {
        self.shared.writable()?;
        let (mut rest, woken) = self.shared.pass_turns(changes);
        {
            let mut skip = self.shared.skip.lock().map_err(|_| JournalError::Closed)?;
            for c in changes {
                match c {
                    Change::Delete {
                        seq,
                        only_if_attempts: None,
                        step,
                    } if !skip.claimed(*seq) => match skip.delivered(*seq, step.clone()) {
                        Delivered::Now(h) => {
                            self.shared.forget(Some(&h.state), 1, h.size);
                            if let Some(origin) = &h.origin {
                                h.state.endpoints.give(origin, h.size);
                            }
                        }
                        // A retried `settle` may bring it twice: counted once.
                        Delivered::Again => {}
                        Delivered::NotHanded => rest.push(c.clone()),
                    },
                    _ => rest.push(c.clone()),
                }
            }
        }
        if rest.is_empty() {
            return Ok(());
        }
        to_indexer(&self.indexer, rest, false).await?;
        wake(&woken);
        Ok(())
    }

    /// Queues `cmd` for the writer; a refused one comes back with why.
    fn send(&self, cmd: Command) -> Result<(), Box<(JournalError, Command)>> {
        self.tx.try_send(cmd).map_err(|e| match e {
            mpsc::error::TrySendError::Full(cmd) => Box::new((JournalError::Busy, cmd)),
            mpsc::error::TrySendError::Closed(cmd) => Box::new((JournalError::Closed, cmd)),
        })
    }

    /// Commits what is queued, then stops the writer: later writes get `Closed`.
    pub(crate) async fn close(&self) {
        self.shared.gate.closed.store(true, Ordering::Release);
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Command::Close { reply }).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// True after a failed commit: writes are refused until restart.
    pub(crate) fn failed(&self) -> bool {
        self.shared.gate.failed.lock().map_or(true, |f| f.is_some())
    }

    pub(crate) fn destination(&self, name: &str) -> Option<Arc<DestinationState>> {
        self.shared.destination(name)
    }

    /// The pause recorded for `destination` by this or an earlier run.
    pub(crate) fn pause(&self, destination: &str) -> Option<Pause> {
        self.shared.pauses.get(destination)
    }

    /// Records (`Some`) or lifts (`None`) a pause, durably: a restart,
    /// even after SIGKILL, keeps what this returned `Ok` for.
    pub(crate) async fn set_pause(
        &self,
        destination: &str,
        pause: Option<Pause>,
    ) -> std::io::Result<()> {
        let shared = self.shared.clone();
        let destination = destination.to_string();
        tokio::task::spawn_blocking(move || shared.pauses.set(&destination, pause))
            .await
            .map_err(std::io::Error::other)?
    }

    /// The endpoints of `destination` disabled by this or an earlier run,
    /// by origin.
    pub(crate) fn disabled_endpoints(&self, destination: &str) -> Vec<(String, Disabled)> {
        let prefix = kept::endpoint_key(destination, "");
        self.shared
            .disabled
            .with_prefix(&prefix)
            .into_iter()
            .map(|(k, v)| (k[prefix.len()..].to_string(), v))
            .collect()
    }

    /// Records (`Some`) or lifts (`None`) an endpoint's disabling,
    /// durably: a restart, even after SIGKILL, keeps what this returned
    /// `Ok` for.
    pub(crate) async fn set_disabled(
        &self,
        destination: &str,
        origin: &str,
        disabled: Option<Disabled>,
    ) -> std::io::Result<()> {
        let shared = self.shared.clone();
        let key = kept::endpoint_key(destination, origin);
        tokio::task::spawn_blocking(move || shared.disabled.set(&key, disabled))
            .await
            .map_err(std::io::Error::other)?
    }

    /// The counters of `name`, created for a destination added by a reload
    /// before any event of it can be accepted.
    pub(crate) fn add_destination(&self, name: &str) -> Arc<DestinationState> {
        self.shared.destinations.rcu(|map| {
            let mut map = HashMap::clone(map);
            map.entry(name.to_string()).or_default();
            map
        });
        self.shared.destination(name).unwrap_or_default()
    }

    /// Sets the share of each endpoint of `name` (`url: per_event`).
    pub(crate) fn set_endpoint_share(&self, name: &str, share: u64) {
        if let Some(d) = self.destination(name) {
            d.endpoints.set_share(share);
        }
    }

    /// Wakes `name`'s dispatcher to read the index: rows changed under it
    /// (`Change::EndpointDue`) that no insert announced.
    pub(crate) fn wake(&self, name: &str) {
        if let Some(d) = self.destination(name) {
            d.indexed.notify_one();
        }
    }

    /// Sets `name`'s share of the journal (`max_pending_bytes`), with its
    /// counters created if need be: at start and at each reload, before
    /// ingress routes to it. A share below what it holds refuses its
    /// events until deliveries bring it under.
    pub(crate) fn set_share(&self, name: &str, share: u64) {
        let state = match self.shared.destination(name) {
            Some(state) => state,
            None => self.add_destination(name),
        };
        state.share.store(share, Ordering::Relaxed);
    }

    /// Sets `name`'s ordering key and builds its lanes from its pending
    /// events in seq order: at start, and for a destination a reload adds,
    /// before ingress can route an event to it (from then on the writer
    /// keeps them). Each row is set to what its lane says: one behind its
    /// lane's head waits, a head that waited is due now (the events before
    /// it left while courier was down, or it waited under another key).
    /// Without a key every waiting row is due now. The key in force keeps
    /// its lanes as they are.
    pub(crate) fn order(
        &self,
        name: &str,
        key: Option<crate::event::ordering::Key>,
    ) -> Result<(), LoadError> {
        use crate::event::ordering::{Key, lane_of};
        let state = match self.shared.destination(name) {
            Some(state) => state,
            None => self.add_destination(name),
        };
        if key.is_some() && state.lanes().as_ref().map(Lanes::key) == key.as_ref() {
            return Ok(());
        }
        let conn = Connection::open(&self.shared.path)?;
        conn.busy_timeout(Duration::from_secs(30))?;
        let log = fetch::Log {
            disk: &*self.shared.disk,
            dir: &self.shared.dir,
        };
        let mut lanes = key.clone().map(Lanes::new);
        let with_events = !matches!(key, None | Some(Key::Destination));
        // (seq, whether its row is to wait)
        let mut turns: Vec<(i64, bool)> = Vec::new();
        if key.is_none() {
            turns = store::waiting(&conn, name)?
                .into_iter()
                .map(|seq| (seq, false))
                .collect();
        } else {
            store::in_seq_order(&conn, log, name, with_events, |seq, waiting, ev| {
                let lane = match (&key, ev) {
                    (Some(Key::Destination), _) => Some(0),
                    (Some(k), Some(ev)) => lane_of(k, &ev.headers, &ev.body),
                    _ => None,
                };
                let wait = match (lanes.as_mut(), lane) {
                    (Some(l), Some(lane)) => {
                        l.admit(seq, lane);
                        l.hold(seq)
                    }
                    _ => false,
                };
                if wait != waiting {
                    turns.push((seq, wait));
                }
            })?;
        }
        if !turns.is_empty() {
            store::set_turns(&conn, &turns, clock::now_ms())?;
            tracing::info!(
                destination = name,
                rows = turns.len(),
                "ordering lanes rebuilt: rows set to wait for, or take, their turn"
            );
        }
        *state.lanes() = lanes;
        Ok(())
    }

    /// Every destination the journal has counters for: configured now, or
    /// holding events from an earlier config.
    pub(crate) fn destination_names(&self) -> Vec<String> {
        self.shared.destinations.load().keys().cloned().collect()
    }

    /// A read connection for one dispatcher.
    pub(crate) fn reader(&self) -> Result<Reader, rusqlite::Error> {
        Reader::open(&self.shared, self.indexer.clone())
    }
}

/// PASSIVE checkpoints on their own connection, so the indexer never stalls
/// on one; WAL frames are copied to the main file while commits go on.
/// Often and small: each ends with an fsync of journal.db, and a large one
/// keeps the disk busy long enough to stall the intake log's fdatasync,
/// which every 202 waits for (benches/RESULTS.md).
fn spawn_checkpointer(shared: Arc<Shared>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("journal-checkpoint".into())
        .spawn(move || {
            indexer::lower_priority();
            let Ok(conn) = Connection::open(&shared.path) else {
                return;
            };
            while !shared.gate.closed.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(100));
                if let Err(e) = store::checkpoint(&conn) {
                    tracing::warn!(error = %e, "journal checkpoint failed; will retry");
                }
            }
        })
        .map(|_| ())
}

#[cfg(test)]
mod faults;
#[cfg(test)]
mod tests;
