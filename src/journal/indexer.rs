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

use super::disk::Disk;
use super::fetch::{Fetch, Log};
use super::intake::{LogReader, Logged, Read, ReadError, SyncError};
use super::store::{self, Pin, QUARANTINED};
use super::{Change, DiskError, JournalError, Shared};
use crate::history::{Accepted, Recorder, Step};
use rusqlite::{Connection, OptionalExtension, params};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
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
/// How often the indexer checkpoints, which lets the WAL restart.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
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
/// Events per transaction, so a long replay commits as it goes.
const CHUNK_EVENTS: usize = 8192;
const CHUNK_BYTES: u64 = 32 * 1024 * 1024;
/// On a full disk: each commit's WAL growth must fit what is left.
const FULL_CHUNK_BYTES: u64 = 256 * 1024;
/// How often dedupe keys older than the window leave the `seen` table.
const EXPIRE_SEEN_EVERY: Duration = Duration::from_secs(10);
/// How often the segments rows point into are looked at for a spill.
pub(super) const SPILL_EVERY: Duration = Duration::from_secs(1);
/// The longest a segment waits for a spill while its events go on going
/// out: a slow trickle (retries delivered one by one from many old
/// segments) must not keep every such segment on the volume for hours.
/// A drain of 800 events/s empties half a segment of 1 KiB events within it.
const SPILL_WAITS_AT_MOST: Duration = Duration::from_secs(10);

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
        Err(RecvTimeoutError::Timeout) => None,
        Err(RecvTimeoutError::Disconnected) => return None,
    };
    shared.indexer_idle.store(false, Ordering::SeqCst);
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
    /// where the log ends is in `Shared::written_end`.
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

pub(super) struct Indexer {
    conn: Connection,
    reader: LogReader,
    /// The intake log's disk, which `reader` reads too.
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    /// Rows pointing into each log segment, by its start: as committed.
    pins: BTreeMap<u64, Pin>,
    /// Whether `pins` changed since they were last published.
    pins_changed: bool,
    /// With `sync: os`: the lsn up to which the log is known on disk.
    log_synced: u64,
    last_spill: Instant,
    /// Segments a spill could not copy anything out of (every row left is
    /// unreadable), with their row count then: passed over until it
    /// changes, so one damaged event does not hold back every later spill.
    unspillable: HashMap<u64, i64>,
    /// Segments a spill could take: their count of waiting events, since
    /// when it has stayed so, and since when they could be taken.
    settling: HashMap<u64, (i64, Instant, Instant)>,
    /// The lsn up to which rows are in SQLite.
    indexed: u64,
    /// The lsn up to which they are synced.
    durable: u64,
    /// Every event up to this seq is a row, or was delivered and skipped.
    rows_through: i64,
    full_sync: bool,
    pace: Pace,
    /// `ingress.dedupe_window` in ms: the keys of indexed events go to `seen`.
    dedupe_ms: Option<u64>,
    last_durable: Instant,
    /// Changes committed since the last sync.
    dirty: bool,
    last_checkpoint: Instant,
    last_expiry: Instant,
    last_commit: Instant,
    /// When a transient error was last logged: retries come every 100 ms.
    last_strain: Option<Instant>,
    /// Event history, recorded in each commit before the journal's own
    /// transaction (`crate::history`).
    history: Option<Recorder>,
    /// When a history error was last logged.
    history_strain: Option<Instant>,
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
        let pins = store::load_pins(&conn)?;
        Ok(Indexer {
            conn,
            reader: LogReader::on(disk.clone(), dir),
            disk,
            dir: dir.to_path_buf(),
            pins,
            pins_changed: true,
            log_synced: 0,
            last_spill: Instant::now(),
            unspillable: HashMap::new(),
            settling: HashMap::new(),
            indexed,
            durable: indexed,
            rows_through: 0,
            full_sync,
            pace,
            dedupe_ms,
            last_durable: Instant::now(),
            dirty: false,
            last_checkpoint: Instant::now(),
            last_expiry: Instant::now(),
            last_commit: Instant::now(),
            last_strain: None,
            history,
            history_strain: None,
        })
    }

    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// The segments rows point into, by start.
    pub fn pinned(&self) -> BTreeSet<u64> {
        self.pins.keys().copied().collect()
    }

    /// Tells the writer which segments it may recycle: those wholly before
    /// the synced position that no row points into. Only while every
    /// committed change is synced: a delete not yet synced comes back after
    /// a crash, and its row must still find its event.
    fn publish(&mut self, shared: &Shared) {
        if self.dirty {
            return;
        }
        if self.pins_changed
            && let Ok(mut pinned) = shared.pinned.lock()
        {
            *pinned = Arc::new(self.pinned());
            self.pins_changed = false;
        }
        // After the pins: the writer reads the position first, so what it
        // recycles by it was unpinned in pins at least as new.
        shared.durable_pos.store(self.durable, Ordering::Release);
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
                    bytes += batch.iter().map(|l| l.event.size()).sum::<u64>();
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
        let full = self.full_sync && sync;
        self.record_history(events, delivered, changes, full);
        if full {
            store::set_full_sync(&self.conn, true)?;
        }
        let result = write(
            &self.conn,
            &self.pins,
            Rows {
                events,
                insert,
                waits,
            },
            changes,
            end,
            self.dedupe_ms.is_some(),
        );
        if result.is_err() {
            let _ = self.conn.execute_batch("ROLLBACK");
            if full {
                let _ = store::set_full_sync(&self.conn, false);
            }
        }
        let (freed, pins) = result?;
        self.add_pins(pins);
        self.indexed = end;
        self.last_commit = Instant::now();
        self.dirty |= !changes.is_empty();
        if full {
            self.synced();
            if let Err(e) = store::set_full_sync(&self.conn, false) {
                tracing::warn!(error = %e, "cannot switch the journal back to synchronous=NORMAL");
            }
        }
        Ok(freed)
    }

    fn add_pins(&mut self, deltas: BTreeMap<u64, Pin>) {
        for (segment, d) in deltas {
            let pin = self.pins.entry(segment).or_default();
            pin.events += d.events;
            pin.bytes += d.bytes;
            if pin.events <= 0 {
                self.pins.remove(&segment);
            }
            self.pins_changed = true;
        }
    }

    /// Copies the events of the rows still pointing into one segment the
    /// writer has left, and that is less than half live, into their rows:
    /// one event retried for hours must not keep 16 MiB of delivered ones
    /// on the volume. A segment mostly live (a paused destination's
    /// backlog) stays: copying it would only double its bytes for a while.
    /// Nor, for a while, one whose events are still going out (`settled`):
    /// a drain frees it, and copying its rest would write those events
    /// twice for nothing (benches/RESULTS.md).
    /// Returns whether another segment may be waiting: the caller looks
    /// again at its next turn.
    fn spill(&mut self) -> Result<bool, IndexError> {
        let sizes = super::intake::segments_on(&*self.disk, &self.dir).map_err(ReadError::Io)?;
        let now = Instant::now();
        let mut candidates = HashMap::new();
        let mut found = None;
        for &(start, size, _) in &sizes {
            let Some(pin) = self.pins.get(&start) else {
                continue;
            };
            if start + size > self.durable
                || (pin.bytes.max(0) as u64) * 2 >= size
                || self.unspillable.get(&start) == Some(&pin.events)
            {
                continue;
            }
            let (since, first) = match self.settling.get(&start) {
                Some(&(events, since, first)) if events == pin.events => (since, first),
                Some(&(_, _, first)) => (now, first),
                None => (now, now),
            };
            candidates.insert(start, (pin.events, since, first));
            if found.is_none() && settled(now - since, now - first) {
                found = Some((start, size));
            }
        }
        self.settling = candidates;
        let Some((start, size)) = found else {
            return Ok(false);
        };
        self.unspillable.retain(|s, _| self.pins.contains_key(s));
        let events = self.pins.get(&start).map_or(0, |p| p.events);
        let seqs = seqs_in(&self.disk, &self.dir, start, size);
        let placed = store::placed_in(&self.conn, start, start + size, seqs)?;
        let mut fetch = Fetch::new(Log {
            disk: &*self.disk,
            dir: &self.dir,
        });
        let mut moved = Vec::with_capacity(placed.len());
        for (seq, place) in placed {
            // A row whose event cannot be read keeps the segment: it stays
            // for an operator, and the row is quarantined when it is due.
            match fetch.event(place, seq) {
                Ok(Some(l)) => moved.push((l, place)),
                Ok(None) => {}
                Err(e) => {
                    self.unspillable.insert(start, events);
                    return Err(ReadError::Io(e).into());
                }
            }
        }
        if moved.is_empty() {
            self.unspillable.insert(start, events);
            return Ok(true);
        }
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let result = (|| {
            let mut update = self.conn.prepare_cached(
                "UPDATE events SET id = ?2, path = ?3, headers = ?4, body = ?5, crc = ?6, at = NULL, len = NULL
                 WHERE seq = ?1 AND at = ?7",
            )?;
            let mut pin = Pin::default();
            for (l, place) in &moved {
                let e = &l.event;
                let crc = super::record::crc(
                    &e.id,
                    &e.destination,
                    &e.method,
                    &e.path,
                    &l.encoded_headers,
                    &e.body,
                );
                let n = update.execute(params![
                    l.seq,
                    e.id,
                    e.path,
                    l.encoded_headers,
                    &e.body[..],
                    crc,
                    place.at as i64
                ])?;
                if n == 1 {
                    pin.events -= 1;
                    pin.bytes -= i64::from(place.len);
                }
            }
            let deltas = BTreeMap::from([(start, pin)]);
            store::add_pins(&self.conn, &deltas)?;
            self.conn.execute_batch("COMMIT")?;
            Ok::<_, rusqlite::Error>(deltas)
        })();
        match result {
            Ok(deltas) => {
                self.add_pins(deltas);
                // Synced before the writer may free the segment (`publish`).
                self.dirty = true;
                tracing::debug!(
                    segment = start,
                    events = moved.len(),
                    "copied waiting events out of an intake log segment"
                );
                Ok(true)
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                Err(e.into())
            }
        }
    }

    /// A synced commit: everything indexed so far survives a power loss.
    /// History first, so that it is never behind what the journal made
    /// durable.
    fn sync(&mut self) -> Result<(), IndexError> {
        self.sync_history();
        store::set_full_sync(&self.conn, true)?;
        let result = (|| {
            self.conn.execute_batch("BEGIN IMMEDIATE")?;
            store::set_intake_pos(&self.conn, self.indexed)?;
            self.conn.execute_batch("COMMIT")
        })();
        if result.is_err() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        store::set_full_sync(&self.conn, false)?;
        result?;
        self.synced();
        Ok(())
    }

    /// With `sync: os` the writer never fdatasyncs the log: before rows
    /// that point into it are written (even unsynced: the checkpointer
    /// syncs the WAL on its own schedule), the log's pages under them go to
    /// disk, or a power loss could keep rows whose events never got there.
    /// One fdatasync per commit of rows, not per request.
    fn sync_log(&mut self, end: u64) -> Result<(), IndexError> {
        if self.full_sync || end <= self.log_synced {
            return Ok(());
        }
        super::intake::sync_segments(&*self.disk, &self.dir, self.log_synced, end).map_err(
            |e| match e {
                SyncError::Find(e) => IndexError::Log(ReadError::Io(e)),
                SyncError::Sync(e) => IndexError::LogSync(e),
            },
        )?;
        self.log_synced = end;
        Ok(())
    }

    fn synced(&mut self) {
        self.durable = self.indexed;
        self.dirty = false;
        self.last_durable = Instant::now();
    }

    /// Rows or changes committed but not yet synced.
    fn unsynced(&self) -> bool {
        self.durable < self.indexed || self.dirty
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
    /// sync_if_due -> spill_if_due -> checkpoint -> expire_seen`, and
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
            written.saw(shared.written_end.load(Ordering::SeqCst));
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
            self.checkpoint(retry, &shared);
            self.expire_seen();
            self.maintain_history();
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
                .saturating_sub(self.last_durable.elapsed())
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
                shared.indexer_idle.store(true, Ordering::SeqCst);
                if shared.written_end.load(Ordering::SeqCst) > written.seen {
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
        if !self.unsynced() || self.last_durable.elapsed() < self.pace.durable_every {
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
        if shared.disk_full.load(Ordering::Acquire) || self.last_spill.elapsed() < SPILL_EVERY {
            return;
        }
        match self.spill() {
            // Another may be waiting: look again at the next turn.
            Ok(true) => {}
            Ok(false) => self.last_spill = Instant::now(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot copy waiting events out of an intake log segment; it stays until its rows change");
                self.last_spill = Instant::now();
            }
        }
    }

    fn checkpoint(&mut self, retry: bool, shared: &Shared) {
        if shared.disk_full.load(Ordering::Acquire) && !retry {
            // On a full disk the pages of delivered events and the WAL
            // must go back to the volume, or they keep the room the
            // intake log needs.
            let _ = self.conn.execute_batch("PRAGMA incremental_vacuum");
            let _ = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)");
            self.last_checkpoint = Instant::now();
        } else if self.last_checkpoint.elapsed() >= CHECKPOINT_EVERY {
            // Under sustained load the background checkpointer never
            // catches up, so the WAL could never restart; from here no
            // frame can arrive during the checkpoint.
            if let Err(e) = self.conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)") {
                tracing::warn!(error = %e, "journal checkpoint failed; will retry");
            }
            self.last_checkpoint = Instant::now();
        }
    }

    /// Records in history what a commit makes durable. A failure is said
    /// (at most every 10 s) and never stops the journal: history serves
    /// operators, the journal the events.
    fn record_history(
        &mut self,
        events: &[Logged],
        delivered: &[Option<Step>],
        changes: &[Change],
        full: bool,
    ) {
        let Some(h) = self.history.as_mut() else {
            return;
        };
        let accepted: Vec<Accepted<'_>> = events
            .iter()
            .enumerate()
            .map(|(i, l)| Accepted {
                seq: l.seq,
                id: &l.event.id,
                destination: &l.event.destination,
                accepted_ms: l.event.accepted_ms,
                prior: l.carried.as_ref().map_or(0, |c| c.attempts),
                next_due_ms: l.carried.as_ref().map(|c| c.next_due_ms),
                delivered: delivered.get(i).and_then(Option::as_ref),
            })
            .collect();
        let steps: Vec<(i64, Step)> = changes
            .iter()
            .filter_map(|c| c.step().map(|s| (c.seq(), s)))
            .collect();
        let steps: Vec<(i64, &Step)> = steps.iter().map(|(seq, s)| (*seq, s)).collect();
        let result = h.record(&accepted, &steps);
        if let Err(e) = result {
            self.history_failed(&e.to_string());
        } else if full {
            self.sync_history();
        }
    }

    fn sync_history(&mut self) {
        if let Some(h) = self.history.as_mut()
            && let Err(e) = h.sync()
        {
            self.history_failed(&e.to_string());
        }
    }

    /// Rolls history's partitions and drops old ones; an event still in
    /// the journal keeps its record.
    fn maintain_history(&mut self) {
        let Some(h) = self.history.as_mut() else {
            return;
        };
        let conn = &self.conn;
        let in_journal = |seq: i64| store::holds(conn, seq).unwrap_or(true);
        if let Err(e) = h.maintain(&in_journal) {
            let e = e.to_string();
            self.history_failed(&e);
        }
    }

    fn history_failed(&mut self, error: &str) {
        if self
            .history_strain
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10))
        {
            tracing::warn!(error, "cannot record event history; deliveries go on");
            self.history_strain = Some(Instant::now());
        }
    }

    /// Dedupe keys older than the window go.
    fn expire_seen(&mut self) {
        let Some(window) = self.dedupe_ms else {
            return;
        };
        if self.last_expiry.elapsed() < EXPIRE_SEEN_EVERY {
            return;
        }
        let cutoff = crate::clock::now_ms().saturating_sub(window);
        if let Err(e) = store::expire_seen(&self.conn, cutoff) {
            tracing::warn!(error = %e, "cannot expire dedupe keys; will retry");
        }
        self.last_expiry = Instant::now();
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
        let _ = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)");
    }

    /// Indexes up to `target` and applies `applies`; false when a full disk
    /// or a transient error left work to retry.
    ///
    /// A change may concern an event whose record the indexer has not
    /// reached (an attempt sent from the ready queue): it is committed with
    /// the chunk that reaches `target`, once its row exists, never before.
    fn step(&mut self, target: u64, applies: Vec<Apply>, shared: &Shared) -> bool {
        let failed = shared.failed.lock().ok().and_then(|f| f.clone());
        if let Some(reason) = failed {
            reply_all(applies, &Err(JournalError::Failed(reason)));
            return true;
        }
        let full = shared.disk_full.load(Ordering::Acquire);
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
                    if self.durable == self.indexed {
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
        if let Ok(mut f) = shared.failed.lock() {
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
    let mut reader = LogReader::on(disk.clone(), dir);
    let mut first_seq = |lsn| match reader.read(lsn) {
        Ok(Read::Record(events, _)) => events.first().filter(|l| l.segment == lsn).map(|l| l.seq),
        _ => None,
    };
    let from = first_seq(start).unwrap_or(i64::MIN);
    let to = first_seq(start + size).unwrap_or(i64::MAX);
    from..to
}

/// Whether a segment a spill could take is taken: once its count of
/// waiting events has stayed the same for `SPILL_EVERY` (nothing goes out
/// of it any more), or once it has waited `SPILL_WAITS_AT_MOST`.
fn settled(unchanged_for: Duration, waited: Duration) -> bool {
    unchanged_for >= SPILL_EVERY || waited >= SPILL_WAITS_AT_MOST
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

/// A commit's events read from the log: which to insert as rows (the
/// others were delivered from memory), and which of those wait behind
/// their ordering lane's head (`hold_in_lanes`; none when shorter).
#[derive(Clone, Copy)]
struct Rows<'a> {
    events: &'a [Logged],
    insert: &'a [bool],
    waits: &'a [bool],
}

impl Rows<'_> {
    const NONE: Rows<'static> = Rows {
        events: &[],
        insert: &[],
        waits: &[],
    };
}

/// Returns what the deletes freed, for the counters, and
/// what the commit added to the pins of each segment (`pins`: as before).
fn write(
    conn: &Connection,
    pins: &BTreeMap<u64, Pin>,
    Rows {
        events,
        insert: insert_mask,
        waits,
    }: Rows<'_>,
    changes: &[Change],
    end: u64,
    dedupe: bool,
) -> Result<(Freed, BTreeMap<u64, Pin>), IndexError> {
    let mut tally = Tally::default();
    conn.execute_batch("BEGIN IMMEDIATE")?;
    {
        // The row keeps the event's place in the log, not the event; its
        // id stays, for an operator's query.
        let mut insert = conn.prepare_cached(
            "INSERT INTO events (seq, id, destination, method, path, headers, body, accepted_ms, crc, attempts, next_due_ms, at, len)
             VALUES (?1, ?8, ?2, ?3, '', x'', x'', ?4, ?5, 0, ?9, ?6, ?7)",
        )?;
        // An adopted event goes on where its delivery stood.
        let mut carry = conn.prepare_cached(
            "UPDATE events SET attempts = ?2, next_due_ms = ?3, last_outcome = ?4, last_status = ?5, last_attempt_ms = ?6, batch = ?7, fate = ?8, fate_ms = ?9 WHERE seq = ?1",
        )?;
        for (i, l) in events.iter().enumerate().filter(|(i, _)| insert_mask[*i]) {
            let e = &l.event;
            // Behind its lane's head: due only when the head leaves.
            let waits = waits.get(i).copied().unwrap_or(false);
            let due = if waits {
                store::WAITING
            } else {
                e.accepted_ms as i64
            };
            let bytes = e.body.len() + l.encoded_headers.len() + e.path.len() + e.id.len();
            add(&mut tally.totals, &e.destination, 1, bytes as i64);
            let pin = tally.pinned.entry(l.segment).or_default();
            pin.events += 1;
            pin.bytes += i64::from(l.place.len);
            insert.execute(params![
                l.seq,
                e.destination,
                e.method,
                e.accepted_ms as i64,
                l.place.crc,
                l.place.at as i64,
                l.place.len,
                e.id,
                due
            ])?;
            if let Some(c) = &l.carried {
                carry.execute(params![
                    l.seq,
                    c.attempts,
                    if waits { due } else { c.next_due_ms as i64 },
                    c.last_outcome,
                    c.last_status,
                    c.last_attempt_ms.map(|t| t as i64),
                    c.batch,
                    c.fate.as_ref().map(|f| f.reason.as_str()),
                    c.fate.as_ref().map(|f| f.at_ms as i64)
                ])?;
            }
        }
        if dedupe {
            let mut seen =
                conn.prepare_cached("INSERT OR REPLACE INTO seen (key, seen_ms) VALUES (?1, ?2)")?;
            for Logged { event: e, .. } in events {
                seen.execute(params![
                    super::dedupe::key(&e.destination, &e.id),
                    e.accepted_ms as i64
                ])?;
            }
        }
        // Read, then deleted by its key: `DELETE … RETURNING` builds a
        // temporary table per statement, which cost more than the read it
        // saves (benches/RESULTS.md).
        let mut doomed = conn.prepare_cached(&format!(
            "SELECT destination, {}, at, len FROM events WHERE seq = ?1 AND attempts = ?2",
            store::ROW_BYTES
        ))?;
        let mut delete = conn.prepare_cached("DELETE FROM events WHERE seq = ?1")?;
        let mut reschedule = conn.prepare_cached(
            "UPDATE events SET attempts = ?2, next_due_ms = ?3, last_outcome = ?4, last_status = ?5, last_attempt_ms = ?6, batch = ?7 WHERE seq = ?1",
        )?;
        let mut quarantine =
            conn.prepare_cached("UPDATE events SET next_due_ms = ?2 WHERE seq = ?1")?;
        let mut wait = conn.prepare_cached(
            "UPDATE events SET next_due_ms = ?2 WHERE seq = ?1 AND next_due_ms < ?2",
        )?;
        let mut unwait = conn.prepare_cached(
            "UPDATE events SET next_due_ms = ?2 WHERE seq = ?1 AND next_due_ms = ?3",
        )?;
        // Due at once, out of any batch: after a restart the dispatcher
        // reads it first thing, and hands it to the sink, never the endpoint.
        let mut fated = conn.prepare_cached(
            "UPDATE events SET fate = ?2, fate_ms = ?3, next_due_ms = ?3, attempts = ?4, last_outcome = ?5, last_status = ?6, last_attempt_ms = ?7, batch = NULL WHERE seq = ?1",
        )?;
        // Unconditional deletes go after the other changes, in runs: the
        // end state is the same (a reschedule or quarantine of a row that
        // is deleted too leaves nothing behind), and a run of consecutive
        // seqs, a drain's usual commit, is one range read and one range
        // delete instead of two statements a row.
        let mut unconditional: Vec<i64> = Vec::new();
        for c in changes {
            match c {
                Change::Delete {
                    seq,
                    only_if_attempts: None,
                    ..
                } => unconditional.push(*seq),
                Change::Delete {
                    seq,
                    only_if_attempts: Some(attempts),
                    ..
                } => {
                    // The row's own destination and bytes: what its insert added.
                    let gone = doomed
                        .query_row(params![seq, attempts], |r| {
                            Ok((
                                r.get::<_, String>(0)?,
                                r.get::<_, i64>(1)?,
                                r.get::<_, Option<i64>>(2)?,
                                r.get::<_, Option<i64>>(3)?,
                            ))
                        })
                        .optional()?;
                    if let Some((destination, bytes, at, len)) = gone {
                        delete.execute([seq])?;
                        tally.forget(pins, &destination, bytes, at, len);
                    }
                }
                Change::Reschedule {
                    seq,
                    attempts,
                    next_due_ms,
                    outcome,
                    status,
                    attempt_ms,
                    batch,
                    ..
                } => {
                    reschedule.execute(params![
                        seq,
                        attempts,
                        *next_due_ms as i64,
                        outcome.as_str(),
                        status,
                        *attempt_ms as i64,
                        batch
                    ])?;
                }
                Change::Quarantine { seq } => {
                    quarantine.execute(params![seq, QUARANTINED])?;
                }
                Change::Wait { seq } => {
                    wait.execute(params![seq, store::WAITING])?;
                }
                Change::Unwait { seq, at_ms } => {
                    unwait.execute(params![seq, *at_ms as i64, store::WAITING])?;
                }
                Change::DeadLetter { seq, fate, .. } => {
                    fated.execute(params![
                        seq,
                        fate.reason.as_str(),
                        fate.at_ms as i64,
                        fate.attempts,
                        fate.last_outcome.as_str(),
                        fate.last_status,
                        fate.last_attempt_ms.map(|t| t as i64)
                    ])?;
                }
            }
        }
        unconditional.sort_unstable();
        unconditional.dedup();
        // Every seq of a run is one of its deletes (the run has no gap), so
        // the range read finds exactly the rows to delete.
        let mut doomed_run = conn.prepare_cached(&format!(
            "SELECT destination, {}, at, len FROM events WHERE seq BETWEEN ?1 AND ?2",
            store::ROW_BYTES
        ))?;
        let mut delete_run =
            conn.prepare_cached("DELETE FROM events WHERE seq BETWEEN ?1 AND ?2")?;
        for run in unconditional.chunk_by(|a, b| *b == a + 1) {
            let (first, last) = (run[0], run[run.len() - 1]);
            let mut rows = doomed_run.query(params![first, last])?;
            while let Some(r) = rows.next()? {
                let destination = r.get_ref(0)?.as_str().map_err(rusqlite::Error::from)?;
                tally.forget(pins, destination, r.get(1)?, r.get(2)?, r.get(3)?);
            }
            delete_run.execute(params![first, last])?;
        }
        store::add_totals(conn, &tally.totals)?;
        store::add_pins(conn, &tally.pinned)?;
        store::set_intake_pos(conn, end)?;
    }
    conn.execute_batch("COMMIT")?;
    Ok((tally.freed, tally.pinned))
}

/// Per destination: the events and bytes a commit's deletes removed.
pub(super) type Freed = HashMap<String, (u64, u64)>;

/// What one commit changes in the totals and the pins, and what its
/// deletes free.
#[derive(Default)]
struct Tally {
    /// Per destination: events and bytes this commit adds (negative: removes).
    totals: HashMap<String, (i64, i64)>,
    freed: Freed,
    pinned: BTreeMap<u64, Pin>,
}

impl Tally {
    /// A deleted row, counted once however many changes named it (a late
    /// answer's delete and a retry's may share a commit: the second finds
    /// no row): `bytes` are its own (what its insert added), `at` and
    /// `len` its event's place in the log, when it points there.
    fn forget(
        &mut self,
        pins: &BTreeMap<u64, Pin>,
        destination: &str,
        bytes: i64,
        at: Option<i64>,
        len: Option<i64>,
    ) {
        add(&mut self.totals, destination, -1, -bytes);
        match self.freed.get_mut(destination) {
            Some((n, b)) => {
                *n += 1;
                *b += bytes.max(0) as u64;
            }
            None => {
                self.freed
                    .insert(destination.to_string(), (1, bytes.max(0) as u64));
            }
        }
        if let (Some(at), Some(len)) = (at, len)
            && let Some(segment) = segment_of(pins, &self.pinned, at.max(0) as u64)
        {
            let pin = self.pinned.entry(segment).or_default();
            pin.events -= 1;
            pin.bytes -= len;
        }
    }
}

/// The segment holding the event at `at`: the last one starting at or
/// before it among those rows point into (committed, or by this commit's
/// inserts). The row pointing there keeps it among them.
fn segment_of(pins: &BTreeMap<u64, Pin>, adding: &BTreeMap<u64, Pin>, at: u64) -> Option<u64> {
    let last = |m: &BTreeMap<u64, Pin>| m.range(..=at).next_back().map(|(s, _)| *s);
    last(pins).max(last(adding))
}

/// Adds to `destination`'s totals, allocating its name once per commit
/// rather than once per event.
fn add(totals: &mut HashMap<String, (i64, i64)>, destination: &str, events: i64, bytes: i64) {
    match totals.get_mut(destination) {
        Some(t) => *t = (t.0 + events, t.1 + bytes),
        None => {
            totals.insert(destination.to_string(), (events, bytes));
        }
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
    for (destination, (count, bytes)) in freed {
        shared.forget(states.get(&destination).map(Arc::as_ref), count, bytes);
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

    #[test]
    fn a_spill_waits_while_events_go_out_but_not_for_ever() {
        let ms = Duration::from_millis;
        // Nothing went out of it for a look's time: taken.
        assert!(settled(SPILL_EVERY, SPILL_EVERY));
        // Still going out: left to free itself...
        assert!(!settled(SPILL_EVERY - ms(1), SPILL_EVERY));
        assert!(!settled(ms(200), SPILL_WAITS_AT_MOST - ms(1)));
        // ...up to a bound.
        assert!(settled(ms(200), SPILL_WAITS_AT_MOST));
    }
}
