//! The indexer thread: follows the intake log into SQLite, where the
//! dispatchers find due events, and commits their state changes (delivered,
//! rescheduled, quarantined).
//!
//! The index holds what waits: the indexer stays `LAG` behind the log, so
//! an event delivered from the ready queue within that time is never
//! inserted (`Skip`). A row holds the event's place in the log, not the
//! event; `pins` counts the rows per segment, in the same transaction. Row inserts, deliveries and reschedules are commits
//! with synchronous=NORMAL, synced at least every `DURABLE_EVERY`: the
//! intake log keeps the events until a synced commit covers them, and only
//! then may the writer recycle its segments; a delivery or reschedule lost
//! in a crash is an extra attempt, which at-least-once allows. A dead
//! letter's fate and delete, and a quarantine, are synced before their
//! callers hear back (with `sync: always`): a dead letter already written
//! must not come back after a crash as an event to send or write again.

mod chores;
mod history;
mod spill;

use super::disk::Disk;
use super::intake::{LogReader, Logged, Read, ReadError, SyncError};
use super::store::commit::{self as transaction, Freed, Rows};
use super::store::{self, Pin};
use super::{Change, DiskError, JournalError, Shared};
use crate::history::{Recorder, Step};
use crate::lifecycle::give_back;
use chores::{CHECKPOINT_EVERY, Checkpoints, Seen};
use history::HistoryJob;
use rusqlite::Connection;
use spill::{Segments, Spill};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long indexed rows may stay unsynced in SQLite (the intake log still
/// holds them): bounds the log's size and the replay after a crash.
/// Also how long a delivery may stay unsynced: with the lag, the window in
/// which a crash makes a delivered event go out again (about 200 ms).
const DURABLE_EVERY: Duration = Duration::from_millis(100);
/// How far the indexer stays behind the log: an event delivered from
/// memory sooner than this never becomes a row.
const LAG: Duration = Duration::from_millis(100);
/// Stretches both, so that tests can kill courier inside those windows
/// every time rather than by luck.
const PACE_ENV: &str = "COURIER_JOURNAL_LAG_MS";

/// The indexer's lag and sync interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Pace {
    lag: Duration,
    durable_every: Duration,
}

impl Pace {
    pub fn from_env() -> Pace {
        let ms = std::env::var(PACE_ENV)
            .ok()
            .and_then(|v| v.parse::<u64>().ok());
        match ms {
            Some(ms) => Pace {
                lag: Duration::from_millis(ms),
                durable_every: Duration::from_millis(ms),
            },
            None => Pace {
                lag: LAG,
                durable_every: DURABLE_EVERY,
            },
        }
    }
}
/// How long after a commit the next one gathers unsynced state changes
/// (deliveries, reschedules): a commit writes every page it touched into
/// the WAL (and the checkpoint copies them again), so a drain's commits of
/// a few dozen deletes each wrote the same pages again and again; lingering
/// lets more deletes share each page (benches/RESULTS.md). A settle may wait
/// that much longer; a change that must be synced (a dead letter's delete)
/// or the close ends the wait.
const LINGER: Duration = Duration::from_millis(3);
/// New rows are committed at most this often (state changes at once, or
/// `LINGER` after the last commit).
const INDEX_EVERY: Duration = Duration::from_millis(25);
/// After a full disk, how soon to try the pending rows again.
const RETRY_FULL: Duration = Duration::from_millis(100);
/// Events per transaction, so a long replay commits as it goes. A chunk's
/// events are held in memory until its commit, and the indexer, at a lower
/// priority, reads full chunks whenever a saturating load gets ahead of
/// it: 8,192 held 3 MiB more at the peak of a fill than 1,024
/// (benches/RESULTS.md), where a commit of 1,024 rows costs no more per row.
const CHUNK_EVENTS: usize = 1024;
const CHUNK_BYTES: u64 = 32 * 1024 * 1024;
/// On a full disk: each commit's WAL growth must fit what is left.
const FULL_CHUNK_BYTES: u64 = 256 * 1024;
#[cfg(test)]
pub(super) use spill::SPILL_EVERY;

type Reply = oneshot::Sender<Result<(), JournalError>>;
/// Changes, whether they must be synced before the reply, and the reply.
type Apply = (Vec<Change>, bool, Reply);

fn reply_all(applies: Vec<Apply>, result: &Result<(), JournalError>) {
    for (_, _, reply) in applies {
        let _ = reply.send(result.clone());
    }
}

/// What one turn of the indexer's loop received.
struct Inbox {
    applies: Vec<Apply>,
    close: Option<oneshot::Sender<()>>,
}

/// Waits up to `wait` for a message, then takes what else is queued; `None`
/// when every sender is gone. A change that needs no sync waits until
/// `linger_until` (`LINGER` after the last commit), for more to share the
/// next commit; one that does, or the close, ends the wait.
fn receive(
    rx: &Receiver<ToIndexer>,
    wait: Duration,
    linger_until: Instant,
    shared: &Shared,
) -> Option<Inbox> {
    let first = match rx.recv_timeout(wait) {
        Ok(msg) => Some(msg),
        Err(RecvTimeoutError::Timeout) => {
            // A whole wait with nothing written to index: what the last
            // burst freed goes back to the system.
            if !wait.is_zero() && shared.by_indexer.idle.load(Ordering::SeqCst) {
                give_back::rested();
            }
            None
        }
        Err(RecvTimeoutError::Disconnected) => return None,
    };
    shared.by_indexer.idle.store(false, Ordering::SeqCst);
    let linger = Cell::new(matches!(&first, Some(ToIndexer::Apply { sync: false, .. })));
    let more = std::iter::from_fn(|| {
        let left = linger_until.saturating_duration_since(Instant::now());
        if linger.get() && !left.is_zero() {
            rx.recv_timeout(left).ok()
        } else {
            rx.try_recv().ok()
        }
    });
    let mut inbox = Inbox {
        applies: Vec::new(),
        close: None,
    };
    for msg in first.into_iter().chain(more.take(4096)) {
        match msg {
            ToIndexer::Wake => {}
            ToIndexer::Apply {
                changes,
                sync,
                reply,
            } => {
                linger.set(linger.get() && !sync);
                inbox.applies.push((changes, sync, reply));
            }
            ToIndexer::Close { reply } => {
                linger.set(false);
                inbox.close = Some(reply);
            }
        }
    }
    Some(inbox)
}

/// Log ends the writer published, and when they were seen: indexed once
/// `lag` old. Read from `Shared` rather than sent per group, so a busy
/// writer does not wake the indexer thousands of times a second (a
/// context switch each, on cores shared with ingress).
struct Written {
    ends: VecDeque<(Instant, u64)>,
    /// The last end seen.
    seen: u64,
    /// The end the indexer is to reach.
    target: u64,
}

impl Written {
    fn new(indexed: u64) -> Self {
        Written {
            ends: VecDeque::new(),
            seen: indexed,
            target: indexed,
        }
    }

    fn saw(&mut self, end: u64) {
        if end > self.seen {
            self.ends.push_back((Instant::now(), end));
            self.seen = end;
        }
    }

    /// When the oldest end not yet taken was seen.
    fn oldest(&self) -> Option<Instant> {
        self.ends.front().map(|(at, _)| *at)
    }

    /// The end to index up to now: every end when catching up, else those
    /// `lag` old, and only once a commit is due (`index_now`): new rows
    /// share a commit, as each rewrites the same index pages into the WAL,
    /// and that write volume delays the log's fdatasync.
    fn due(&mut self, catch_up: bool, index_now: bool, lag: Duration) -> u64 {
        let now = Instant::now();
        while let Some(&(at, end)) = self.ends.front() {
            if !(catch_up || (index_now && now >= at + lag)) {
                break;
            }
            self.target = self.target.max(end);
            self.ends.pop_front();
        }
        self.target
    }
}

pub(super) enum ToIndexer {
    /// The writer wrote while the indexer slept with nothing to index:
    /// where the log ends is in `Shared::by_writer`.
    Wake,
    Apply {
        changes: Vec<Change>,
        /// Synced before the reply (with `sync: always`).
        sync: bool,
        reply: Reply,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

/// The loop steps through its jobs (`run`); what they share is here:
/// the connection, the log's reader, the pins, and the positions.
pub(super) struct Indexer {
    conn: Connection,
    reader: LogReader,
    /// The intake log's disk, which `reader` reads too.
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    pins: Pins,
    /// The lsn up to which rows are in SQLite.
    indexed: u64,
    /// Every event up to this seq is a row, or was delivered and skipped.
    rows_through: i64,
    durability: Durability,
    pace: Pace,
    last_commit: Instant,
    /// When a transient error was last logged: retries come every 100 ms.
    last_strain: Option<Instant>,
    spill: Spill,
    checkpoints: Checkpoints,
    /// With `ingress.dedupe_window`.
    seen: Option<Seen>,
    /// Event history, recorded in each commit before the journal's own
    /// transaction (`crate::history`).
    history: Option<HistoryJob>,
}

/// Rows pointing into each log segment, by its start: as committed.
#[derive(Default)]
struct Pins {
    by_segment: BTreeMap<u64, Pin>,
    /// Changed since last published.
    changed: bool,
}

impl Pins {
    fn add(&mut self, deltas: BTreeMap<u64, Pin>) {
        for (segment, d) in deltas {
            let pin = self.by_segment.entry(segment).or_default();
            pin.events += d.events;
            pin.bytes += d.bytes;
            if pin.events <= 0 {
                self.by_segment.remove(&segment);
            }
            self.changed = true;
        }
    }
}

/// What is synced: SQLite's rows and changes, and (with `sync: os`) the
/// log under them.
struct Durability {
    /// `sync: always`: the writer fdatasyncs the log, and changes asked
    /// to be synced are committed with synchronous=FULL.
    full_sync: bool,
    /// With `sync: os`: the lsn up to which the log is known on disk.
    log_synced: u64,
    /// The lsn up to which rows are synced.
    durable: u64,
    /// Changes committed since the last sync.
    dirty: bool,
    last_durable: Instant,
}

/// Why indexing stopped.
#[derive(Debug, thiserror::Error)]
pub(super) enum IndexError {
    #[error(transparent)]
    Log(#[from] ReadError),
    /// fdatasync of the log failed (`sync: os`): never retried, whatever
    /// its errno, as the writer's own.
    #[error("cannot fdatasync the intake log: {0}")]
    LogSync(std::io::Error),
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
}

impl IndexError {
    /// Out of descriptors or memory for a moment, or a lock held by a
    /// reader: retried, never a reason to fail the journal.
    pub fn transient(&self) -> bool {
        use rusqlite::ErrorCode::{CannotOpen, DatabaseBusy, DatabaseLocked, OutOfMemory};
        match self {
            IndexError::Sqlite(e) => matches!(
                e.sqlite_error_code(),
                Some(CannotOpen | OutOfMemory | DatabaseBusy | DatabaseLocked)
            ),
            IndexError::Log(ReadError::Io(e)) => super::intake::is_transient(e),
            IndexError::Log(_) | IndexError::LogSync(_) => false,
        }
    }
}

impl super::DiskError for IndexError {
    fn disk_full(&self) -> bool {
        match self {
            IndexError::Sqlite(e) => e.disk_full(),
            IndexError::Log(ReadError::Io(e)) => e.disk_full(),
            IndexError::Log(_) | IndexError::LogSync(_) => false,
        }
    }
}

impl Indexer {
    pub fn new(
        conn: Connection,
        disk: Arc<dyn Disk>,
        dir: &Path,
        full_sync: bool,
        pace: Pace,
        dedupe_ms: Option<u64>,
        history: Option<Recorder>,
    ) -> Result<Indexer, rusqlite::Error> {
        let indexed = store::intake_pos(&conn)?;
        let pins = Pins {
            by_segment: store::load_pins(&conn)?,
            changed: true,
        };
        Ok(Indexer {
            conn,
            reader: LogReader::on(disk.clone(), dir).without_bodies(),
            disk,
            dir: dir.to_path_buf(),
            pins,
            indexed,
            rows_through: 0,
            durability: Durability {
                full_sync,
                log_synced: 0,
                durable: indexed,
                dirty: false,
                last_durable: Instant::now(),
            },
            pace,
            last_commit: Instant::now(),
            last_strain: None,
            spill: Spill::new(),
            checkpoints: Checkpoints::new(),
            seen: dedupe_ms.map(Seen::new),
            history: history.map(HistoryJob::new),
        })
    }

    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// The segments rows point into, by start.
    pub fn pinned(&self) -> BTreeSet<u64> {
        self.pins.by_segment.keys().copied().collect()
    }

    /// Tells the writer which segments it may recycle: those wholly before
    /// the synced position that no row points into. Only while every
    /// committed change is synced: a delete not yet synced comes back after
    /// a crash, and its row must still find its event.
    fn publish(&mut self, shared: &Shared) {
        if self.durability.dirty {
            return;
        }
        if self.pins.changed
            && let Ok(mut pinned) = shared.by_indexer.pinned.lock()
        {
            *pinned = Arc::new(self.pinned());
            self.pins.changed = false;
        }
        // After the pins: the writer reads the position first, so what it
        // recycles by it was unpinned in pins at least as new.
        shared
            .by_indexer
            .durable_pos
            .store(self.durability.durable, Ordering::Release);
    }

    /// After recovery: every event below `next_seq` is a row or gone.
    pub fn rows_below(&mut self, next_seq: i64) {
        self.rows_through = next_seq - 1;
    }

    /// At start: indexes every record the log holds after the last synced
    /// commit, and syncs. Returns the log's end.
    pub fn recover(&mut self) -> Result<u64, IndexError> {
        loop {
            let (events, end, done) = self.read_chunk(None, CHUNK_BYTES)?;
            if !events.is_empty() || end != self.indexed {
                let insert = vec![true; events.len()];
                let rows = Rows {
                    events: &events,
                    insert: &insert,
                    waits: &[],
                };
                self.commit(rows, &[], &[], false, end)?;
            }
            if done {
                break;
            }
        }
        self.sync()?;
        Ok(self.indexed)
    }

    /// The writer starts a fresh segment at `lsn`, past every old one, which
    /// it will reuse: record (synced) that the log goes on there, or a crash
    /// would have recovery look for records in a reused segment's old place.
    pub fn resume_at(&mut self, lsn: u64) -> Result<(), IndexError> {
        if lsn != self.indexed {
            self.indexed = lsn;
            self.sync()?;
        }
        Ok(())
    }

    /// Reads records from `indexed` up to `target` (or the log's end), at
    /// most one chunk; `done` when nothing is left.
    fn read_chunk(
        &mut self,
        target: Option<u64>,
        chunk_bytes: u64,
    ) -> Result<(Vec<Logged>, u64, bool), IndexError> {
        let mut events = Vec::new();
        let mut bytes = 0;
        let mut at = self.indexed;
        while target.is_none_or(|t| at < t) {
            if events.len() >= CHUNK_EVENTS || bytes >= chunk_bytes {
                return Ok((events, at, false));
            }
            match self.reader.read(at)? {
                Read::Record(batch, next) => {
                    bytes += batch.iter().map(Logged::size).sum::<u64>();
                    events.extend(batch);
                    at = next;
                }
                Read::End => {
                    if target.is_some() {
                        // The writer said it wrote up to the target.
                        return Err(IndexError::Log(ReadError::Io(std::io::Error::other(
                            format!("the intake log ends at {at}, before {target:?}"),
                        ))));
                    }
                    break;
                }
            }
        }
        Ok((events, at, true))
    }

    /// One transaction: the rows of `events` marked in `insert`, the
    /// `changes`, the new log position; synced if `sync`. Returns what its
    /// deletes freed. History records them first (`delivered`: the
    /// deliveries of the events not inserted, as `Skip` kept them).
    fn commit(
        &mut self,
        Rows {
            events,
            insert,
            waits,
        }: Rows<'_>,
        delivered: &[Option<Step>],
        changes: &[Change],
        sync: bool,
        end: u64,
    ) -> Result<Freed, IndexError> {
        if insert.iter().any(|i| *i) {
            self.sync_log(end)?;
        }
        let full = self.durability.full_sync && sync;
        if let Some(h) = self.history.as_mut() {
            h.record(events, delivered, changes, full);
        }
        if full {
            store::set_full_sync(&self.conn, true)?;
        }
        let result = transaction::commit(
            &self.conn,
            &self.pins.by_segment,
            Rows {
                events,
                insert,
                waits,
            },
            changes,
            end,
            self.seen.is_some(),
        );
        if result.is_err() && full {
            let _ = store::set_full_sync(&self.conn, false);
        }
        let (freed, pins) = result?;
        self.pins.add(pins);
        self.indexed = end;
        self.last_commit = Instant::now();
        self.durability.dirty |= !changes.is_empty();
        if full {
            self.synced();
            if let Err(e) = store::set_full_sync(&self.conn, false) {
                tracing::warn!(error = %e, "cannot switch the journal back to synchronous=NORMAL");
            }
        }
        Ok(freed)
    }

    /// A synced commit: everything indexed so far survives a power loss.
    /// History first, so that it is never behind what the journal made
    /// durable.
    fn sync(&mut self) -> Result<(), IndexError> {
        if let Some(h) = self.history.as_mut() {
            h.sync();
        }
        transaction::sync_position(&self.conn, self.indexed)?;
        self.synced();
        Ok(())
    }

    /// With `sync: os` the writer never fdatasyncs the log: before rows
    /// that point into it are written (even unsynced: the checkpointer
    /// syncs the WAL on its own schedule), the log's pages under them go to
    /// disk, or a power loss could keep rows whose events never got there.
    /// One fdatasync per commit of rows, not per request.
    fn sync_log(&mut self, end: u64) -> Result<(), IndexError> {
        if self.durability.full_sync || end <= self.durability.log_synced {
            return Ok(());
        }
        let from = self.durability.log_synced;
        super::intake::sync_segments(&*self.disk, &self.dir, from, end).map_err(|e| match e {
            SyncError::Find(e) => IndexError::Log(ReadError::Io(e)),
            SyncError::Sync(e) => IndexError::LogSync(e),
        })?;
        self.durability.log_synced = end;
        Ok(())
    }

    fn synced(&mut self) {
        self.durability.durable = self.indexed;
        self.durability.dirty = false;
        self.durability.last_durable = Instant::now();
    }

    /// Rows or changes committed but not yet synced.
    fn unsynced(&self) -> bool {
        self.durability.durable < self.indexed || self.durability.dirty
    }

    pub fn spawn(self, rx: Receiver<ToIndexer>, shared: Arc<Shared>) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("journal-indexer".into())
            .spawn(move || {
                lower_priority();
                self.run(rx, shared)
            })
            .map(|_| ())
    }

    /// Each turn: `sleep_for -> receive -> Written::due -> step ->
    /// sync_if_due -> spill_if_due -> checkpoints -> seen -> history`, and
    /// `finish` at the close.
    fn run(mut self, rx: Receiver<ToIndexer>, shared: Arc<Shared>) {
        let mut written = Written::new(self.indexed);
        let mut retry = false;
        loop {
            let wait = self.sleep_for(retry, &written, &shared);
            let Some(inbox) = receive(&rx, wait, self.last_commit + LINGER, &shared) else {
                return;
            };
            // After the messages: a change to an event, or the close, was
            // sent after the writer published the end that holds it.
            written.saw(shared.by_writer.written_end.load(Ordering::SeqCst));
            // A change may concern an event the indexer has not made a row
            // yet (an attempt sent from the ready queue): catch up with the
            // log first. Changes to rows, e.g. a retry read from the index,
            // leave the lag alone.
            // An empty synced apply asks for every event to be a row
            // (`Journal::index_all`).
            let catch_up = inbox.close.is_some()
                || inbox.applies.iter().any(|(changes, sync, _)| {
                    (changes.is_empty() && *sync)
                        || changes.iter().any(|c| c.seq() > self.rows_through)
                });
            let index_now = Instant::now() >= self.last_commit + INDEX_EVERY;
            let target = written.due(catch_up, index_now, self.pace.lag);
            retry = !self.step(target, inbox.applies, &shared);
            retry |= self.sync_if_due(&shared);
            if !retry {
                self.spill_if_due(&shared);
            }
            let full = shared.space.disk_full.load(Ordering::Acquire) && !retry;
            self.checkpoints.turn(&self.conn, full);
            if let Some(seen) = self.seen.as_mut() {
                seen.turn(&self.conn);
            }
            if let Some(h) = self.history.as_mut() {
                h.maintain(&self.conn);
            }
            if let Some(reply) = inbox.close {
                self.finish(target, &shared);
                let _ = reply.send(());
                return;
            }
        }
    }

    /// How long to wait for messages: until a retry, the next sync or
    /// checkpoint, or the oldest unindexed end's turn. With nothing
    /// written to index, the writer's next group wakes the indexer (once),
    /// or it finds the group here.
    fn sleep_for(&self, retry: bool, written: &Written, shared: &Shared) -> Duration {
        let mut wait = if retry {
            RETRY_FULL
        } else if self.unsynced() {
            self.pace
                .durable_every
                .saturating_sub(self.durability.last_durable.elapsed())
        } else {
            CHECKPOINT_EVERY
        };
        match written.oldest() {
            Some(at) => {
                let due = (at + self.pace.lag).max(self.last_commit + INDEX_EVERY);
                // Writes go on meanwhile: look at the log's end that often.
                wait = wait
                    .min(INDEX_EVERY)
                    .min(due.saturating_duration_since(Instant::now()));
            }
            None => {
                shared.by_indexer.idle.store(true, Ordering::SeqCst);
                if shared.by_writer.written_end.load(Ordering::SeqCst) > written.seen {
                    wait = Duration::ZERO;
                }
            }
        }
        wait
    }

    /// Syncs when unsynced changes are `durable_every` old; true when a
    /// full disk or a passing error leaves it to retry shortly (the log
    /// still holds the rows).
    fn sync_if_due(&mut self, shared: &Shared) -> bool {
        if !self.unsynced() || self.durability.last_durable.elapsed() < self.pace.durable_every {
            return false;
        }
        match self.sync() {
            Ok(()) => {
                self.publish(shared);
                false
            }
            Err(e) if e.disk_full() => {
                shared.full();
                true
            }
            Err(e) if e.transient() => {
                self.strained(&e);
                true
            }
            Err(e) => {
                self.failure(&e, shared);
                false
            }
        }
    }

    /// Not on a full disk: a spill grows journal.db before the segment it
    /// frees goes back.
    fn spill_if_due(&mut self, shared: &Shared) {
        if shared.space.disk_full.load(Ordering::Acquire) || !self.spill.due() {
            return;
        }
        let segments = Segments {
            conn: &self.conn,
            disk: &self.disk,
            dir: &self.dir,
            pins: &self.pins.by_segment,
            durable: self.durability.durable,
        };
        match self.spill.once(segments) {
            // Another may be waiting: look again at the next turn.
            Ok(Some(deltas)) => {
                if !deltas.is_empty() {
                    self.pins.add(deltas);
                    // Synced before the writer may free the segment (`publish`).
                    self.durability.dirty = true;
                }
            }
            Ok(None) => self.spill.rest(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot copy waiting events out of an intake log segment; it stays until its rows change");
                self.spill.rest();
            }
        }
    }

    /// The writer has stopped: index what it wrote, sync, and fold the WAL
    /// into the main file (a backup is journal.db with the intake-*.log
    /// segments its rows point into).
    fn finish(&mut self, target: u64, shared: &Shared) {
        for _ in 0..1000 {
            if self.indexed >= target || !self.step(target, Vec::new(), shared) {
                break;
            }
        }
        if self.sync().is_ok() {
            self.publish(shared);
        }
        let _ = store::fold_wal(&self.conn);
    }

    /// Indexes up to `target` and applies `applies`; false when a full disk
    /// or a transient error left work to retry.
    ///
    /// A change may concern an event whose record the indexer has not
    /// reached (an attempt sent from the ready queue): it is committed with
    /// the chunk that reaches `target`, once its row exists, never before.
    fn step(&mut self, target: u64, applies: Vec<Apply>, shared: &Shared) -> bool {
        let failed = shared.gate.failed.lock().ok().and_then(|f| f.clone());
        if let Some(reason) = failed {
            reply_all(applies, &Err(JournalError::Failed(reason)));
            return true;
        }
        let full = shared.space.disk_full.load(Ordering::Acquire);
        let chunk = if full { FULL_CHUNK_BYTES } else { CHUNK_BYTES };
        let mut applies = applies;
        if full {
            // On a full disk, changes to existing rows are recorded on their
            // own first: deleting rows frees pages that indexing the backlog
            // then reuses, where one commit of both would fail as a whole,
            // again and again. The backlog follows in small commits, each
            // checkpointed away.
            let (rows, later): (Vec<Apply>, Vec<Apply>) = applies
                .into_iter()
                .partition(|(changes, _, _)| changes.iter().all(|c| c.seq() <= self.rows_through));
            if !rows.is_empty() {
                let done = self.commit_alone(rows, shared);
                if later.is_empty() || !done {
                    reply_all(later, &Err(JournalError::DiskFull));
                    // The backlog's turn comes at the next step, shortly.
                    return false;
                }
            }
            applies = later;
        }
        loop {
            let (events, end, done) = match self.read_chunk(Some(target), chunk) {
                Ok(r) => r,
                Err(e) if e.transient() => {
                    self.strained(&e);
                    reply_all(applies, &Err(JournalError::Strained(e.to_string())));
                    return false;
                }
                Err(e) => {
                    let err = self.failure(&e, shared);
                    reply_all(applies, &Err(err));
                    return true;
                }
            };
            let (changes, sync) = if done {
                self.changes_of(&applies)
            } else {
                (Vec::new(), false)
            };
            if events.is_empty() && changes.is_empty() && end == self.indexed {
                reply_all(applies, &Ok(()));
                return true;
            }
            let (insert, delivered) = match shared.skip.lock() {
                Ok(mut skip) => {
                    let insert = skip.claim(events.iter().map(|l| l.seq));
                    let delivered = if self.history.is_some() {
                        let steps = events.iter().zip(&insert);
                        steps
                            .map(|(l, i)| (!i).then(|| skip.step(l.seq).cloned()).flatten())
                            .collect()
                    } else {
                        Vec::new()
                    };
                    (insert, delivered)
                }
                Err(_) => (vec![true; events.len()], Vec::new()),
            };
            let waits = hold_in_lanes(&events, &insert, shared);
            let changes = still_waiting(changes, shared);
            let rows = Rows {
                events: &events,
                insert: &insert,
                waits: &waits,
            };
            match self.commit(rows, &delivered, &changes, sync, end) {
                Ok(freed) => {
                    if let Some(last) = events.last() {
                        self.rows_through = self.rows_through.max(last.seq);
                    }
                    if let Ok(mut skip) = shared.skip.lock() {
                        skip.committed(self.rows_through);
                    }
                    account(&events, &insert, freed, shared);
                    if self.durability.durable == self.indexed {
                        self.publish(shared);
                    }
                    if done {
                        reply_all(applies, &Ok(()));
                        return true;
                    }
                }
                Err(e) => {
                    let err = self.commit_error(&e, shared);
                    reply_all(applies, &Err(err));
                    return !(e.disk_full() || e.transient());
                }
            }
        }
    }

    /// Commits changes to existing rows without indexing more; false when
    /// it failed (the callers have heard why).
    fn commit_alone(&mut self, applies: Vec<Apply>, shared: &Shared) -> bool {
        let (changes, sync) = self.changes_of(&applies);
        let changes = still_waiting(changes, shared);
        match self.commit(Rows::NONE, &[], &changes, sync, self.indexed) {
            Ok(freed) => {
                account(&[], &[], freed, shared);
                reply_all(applies, &Ok(()));
                true
            }
            Err(e) => {
                let err = self.commit_error(&e, shared);
                reply_all(applies, &Err(err));
                false
            }
        }
    }

    /// The changes of `applies` and whether their commit must be synced:
    /// asked for, or a retry due within the sync interval, so that quick
    /// retries cannot pile up unsynced attempts (after a crash the count is
    /// at most one behind).
    fn changes_of(&self, applies: &[Apply]) -> (Vec<Change>, bool) {
        let soon = crate::clock::now_ms() + self.pace.durable_every.as_millis() as u64;
        let changes: Vec<Change> = applies
            .iter()
            .flat_map(|(c, _, _)| c.iter().cloned())
            .collect();
        let sync = applies.iter().any(|(_, sync, _)| *sync)
            || changes.iter().any(
                |c| matches!(c, Change::Reschedule { next_due_ms, .. } if *next_due_ms < soon),
            );
        (changes, sync)
    }

    fn commit_error(&mut self, e: &IndexError, shared: &Shared) -> JournalError {
        if e.disk_full() {
            shared.full();
            JournalError::DiskFull
        } else if e.transient() {
            self.strained(e);
            JournalError::Strained(e.to_string())
        } else {
            self.failure(e, shared)
        }
    }

    /// Logs a transient error at most every 10 s while it lasts.
    fn strained(&mut self, e: &IndexError) {
        if self
            .last_strain
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10))
        {
            tracing::warn!(error = %e, "the journal cannot index yet; retrying");
            self.last_strain = Some(Instant::now());
        }
    }

    fn failure(&self, e: &IndexError, shared: &Shared) -> JournalError {
        let reason = e.to_string();
        tracing::error!(error = %reason, dir = %shared.dir.display(), "journal commit failed; refusing writes until restart");
        if let Ok(mut f) = shared.gate.failed.lock() {
            f.get_or_insert(reason.clone());
        }
        JournalError::Failed(reason)
    }
}

/// The seqs of the events in the segment at `start`: from the first seq of
/// its first record to that of the next segment's. Events go into the log
/// in seq order, so every row pointing into the segment is in this range;
/// where a first record cannot be read, the range stays open on that side
/// (a read that went on into a later segment does not count).
pub(super) fn seqs_in(
    disk: &Arc<dyn Disk>,
    dir: &Path,
    start: u64,
    size: u64,
) -> std::ops::Range<i64> {
    let mut reader = LogReader::on(disk.clone(), dir).without_bodies();
    let mut first_seq = |lsn| match reader.read(lsn) {
        Ok(Read::Record(events, _)) => events.first().filter(|l| l.segment == lsn).map(|l| l.seq),
        _ => None,
    };
    let from = first_seq(start).unwrap_or(i64::MIN);
    let to = first_seq(start + size).unwrap_or(i64::MAX);
    from..to
}

/// Indexing and checkpoints are catch-up work: under a burst the threads
/// that answer the app go first, and the intake log holds the difference.
pub(super) fn lower_priority() {
    // SAFETY: plain syscalls on the calling thread's own id.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

/// Which of the rows to insert wait behind their lane's head; each such
/// event is marked in its lane, whose turn then makes its row due.
fn hold_in_lanes(events: &[Logged], insert: &[bool], shared: &Shared) -> Vec<bool> {
    let states = shared.destinations.load();
    events
        .iter()
        .zip(insert)
        .map(|(l, inserted)| {
            *inserted
                && states
                    .get(&l.event.destination)
                    .and_then(|state| state.lanes().as_mut().map(|lanes| lanes.hold(l.seq)))
                    .unwrap_or(false)
        })
        .collect()
}

/// `changes` without the waits of events whose turn came since they were
/// sent: that turn's `Unwait` may have been committed already, and a wait
/// after it would never end.
fn still_waiting(mut changes: Vec<Change>, shared: &Shared) -> Vec<Change> {
    if !changes.iter().any(|c| matches!(c, Change::Wait { .. })) {
        return changes;
    }
    let states = shared.destinations.load();
    changes.retain(|c| match c {
        Change::Wait { seq } => states
            .values()
            .any(|state| state.lanes().as_ref().is_some_and(|l| !l.may_start(*seq))),
        _ => true,
    });
    changes
}

/// After a commit: frees what its deletes removed, as the rows counted
/// it, and wakes the dispatchers whose events became rows.
fn account(events: &[Logged], inserted: &[bool], freed: Freed, shared: &Shared) {
    let states = shared.destinations.load();
    for (destination, (count, bytes)) in freed.destinations {
        shared.forget(states.get(&destination).map(Arc::as_ref), count, bytes);
    }
    for ((destination, origin), bytes) in freed.endpoints {
        if let Some(d) = states.get(&destination) {
            d.endpoints.give(&origin, bytes);
        }
    }
    let mut woken = HashSet::new();
    for (l, _) in events.iter().zip(inserted).filter(|(_, i)| **i) {
        if woken.insert(l.event.destination.as_str())
            && let Some(d) = states.get(&l.event.destination)
        {
            d.indexed.notify_one();
        }
    }
    // The committed rows are what readers find now: their events leave the
    // destinations' unindexed groups (any group up to the last seq has an
    // event among these).
    let Some(last) = events.last() else { return };
    let mut reached = HashSet::new();
    for l in events {
        if reached.insert(l.event.destination.as_str())
            && let Some(d) = states.get(&l.event.destination)
            && let Ok(mut u) = d.unindexed.lock()
        {
            u.indexed_through(last.seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_ends_are_indexed_once_lag_old_or_at_once_to_catch_up() {
        let hour = Duration::from_secs(3600);
        let mut w = Written::new(10);
        w.saw(5);
        assert_eq!(w.oldest(), None, "an end before the indexed one is no news");
        w.saw(20);
        w.saw(30);
        assert!(w.oldest().is_some());
        assert_eq!(w.due(false, true, hour), 10, "not lag old yet");
        assert_eq!(w.due(false, false, Duration::ZERO), 10, "no commit due yet");
        assert_eq!(w.due(false, true, Duration::ZERO), 30);
        assert_eq!(w.oldest(), None);
        w.saw(40);
        assert_eq!(
            w.due(true, false, hour),
            40,
            "a change to an event not a row yet"
        );
        assert_eq!(w.due(false, false, hour), 40, "the target never goes back");
    }
}
