//! Opening the journal, as a list of steps (`Journal::open_with`). Each
//! step can refuse the start, and none before `resume_log` moves the log
//! position the journal records: a refused start leaves the evidence (a
//! lost tail, a damaged record) for the next one to find.

use super::dedupe::Dedupe;
use super::disk::Disk;
use super::indexer::{self, Indexer};
use super::intake::{self, LogWriter};
use super::kept::{DISABLED, Kept, PAUSES, Pauses};
use super::reserve::{self, Reserve};
use super::skip::Skip;
use super::store::{self, DestinationSummary, FILE};
use super::writer::{self, Writer};
use super::{
    ByIndexer, ByWriter, DestinationState, DiskError, Gate, Journal, OpenError, QUEUE, Shared,
    Space, spawn_checkpointer,
};
use crate::clock;
use crate::config::HistorySettings;
use crate::history::{History, Recorder};
use arc_swap::ArcSwap;
use rusqlite::Connection;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// Free bytes below which a failed start is put down to a full disk.
const NEARLY_FULL: u64 = 64 * 1024;

impl Journal {
    /// `Journal::open`, with the intake log on `disk` (tests make it fail).
    pub(crate) fn open_with(
        disk: Arc<dyn Disk>,
        dir: &Path,
        full_sync: bool,
        max_bytes: u64,
        dedupe_window: Option<Duration>,
        destinations: &[String],
        history: Option<HistorySettings>,
    ) -> Result<(Journal, Vec<DestinationSummary>), OpenError> {
        let dedupe_ms = dedupe_window.map(|w| w.as_millis() as u64);
        let o = Opening {
            disk,
            dir,
            path: dir.join(FILE),
            full_sync,
        };
        let lock_file = o.lock()?;
        // Read before anything is written: a damaged file refuses the
        // start with the journal untouched.
        let pauses = Pauses::load(dir, &PAUSES)?;
        let disabled = Kept::load(dir, &DISABLED)?;
        let mark = o.mark()?;
        o.refuse_without_db(mark.as_ref())?;
        let reserve = o.release_reserve()?;
        let (history, recorder) = match history {
            Some(settings) => {
                // Its files are made on the same disk: a first start on a
                // full one fails there, and waits for room like the journal.
                let (h, r) = History::open(dir, settings)
                    .map_err(|e| o.full(&e).unwrap_or_else(|| e.into()))?;
                (Some(h), Some(r))
            }
            None => (None, None),
        };
        let (mut indexer, indexed) = o.recover(dedupe_ms, recorder)?;
        let next_seq = o.refuse_lost_tail(&indexer, mark.as_ref(), indexed)?;
        let next_seq = next_seq.max(mark.map_or(0, |m| m.next_seq));
        let (log, resume, pinned) = o.resume_log(&mut indexer, indexed, next_seq)?;
        let summary = store::summary(indexer.conn()).map_err(|e| o.open_error(e))?;
        let dedupe = o.dedupe(indexer.conn(), dedupe_ms)?;
        let (states, total) = counters(destinations, &summary);
        let by_endpoint = store::endpoint_bytes(indexer.conn()).map_err(|e| o.open_error(e))?;
        for (destination, origin, bytes) in by_endpoint {
            if let Some(state) = states.get(&destination) {
                state.endpoints.load([(origin, bytes)]);
            }
        }
        let without_room = o.take_reserve(&reserve);
        indexer.rows_below(next_seq);
        let shared = Arc::new(Shared {
            _lock: lock_file,
            dir: dir.to_path_buf(),
            disk: o.disk.clone(),
            path: o.path.clone(),
            by_writer: ByWriter {
                written_end: AtomicU64::new(0),
            },
            by_indexer: ByIndexer {
                durable_pos: AtomicU64::new(resume),
                pinned: Mutex::new(Arc::new(pinned)),
                idle: AtomicBool::new(false),
            },
            space: Space {
                max_bytes,
                pending_bytes: AtomicU64::new(total),
                disk_full: AtomicBool::new(without_room),
                disk_turn: Mutex::new(()),
                reserve,
            },
            gate: Gate {
                failed: Mutex::new(None),
                closed: AtomicBool::new(false),
                sealed: AtomicBool::new(false),
            },
            dedupe,
            skip: Mutex::new(Skip::new(next_seq - 1)),
            history,
            destinations: ArcSwap::from_pointee(states),
            pauses,
            disabled,
        });
        let journal = o.spawn(indexer, log, next_seq, shared)?;
        Ok((journal, summary))
    }
}

/// What every step of an open needs.
struct Opening<'a> {
    disk: Arc<dyn Disk>,
    dir: &'a Path,
    /// journal.db
    path: PathBuf,
    full_sync: bool,
}

impl Opening<'_> {
    /// The directory, private to courier, and its lock.
    fn lock(&self) -> Result<std::fs::File, OpenError> {
        std::fs::create_dir_all(self.dir).map_err(|e| self.dir_error(e))?;
        crate::file_modes::tighten(self.dir);
        lock(self.dir).map_err(|e| match e {
            LockError::Held(lock_path) => OpenError::Locked(self.path.clone(), lock_path),
            LockError::Open(lock_path, e) => OpenError::Lock(lock_path, e),
        })
    }

    /// Where the last run acknowledged the log up to, if it wrote a mark.
    /// One that exists and cannot be read refuses the start with `sync:
    /// always`: without it a lost tail would pass unseen. With `sync: os`,
    /// which allows a lost tail, it is said and the start goes on.
    fn mark(&self) -> Result<Option<intake::Mark>, OpenError> {
        match intake::Mark::read_on(&*self.disk, self.dir) {
            Ok(mark) => Ok(mark),
            Err(e) if intake::is_transient(&e) => Err(OpenError::Retry(
                self.dir.to_path_buf(),
                format!("cannot read {}: {e}", intake::MARK),
            )),
            Err(e) if self.full_sync => Err(OpenError::MarkUnreadable(
                self.dir.join(intake::MARK),
                e.to_string(),
            )),
            Err(e) => {
                tracing::error!(error = %e, "cannot read intake.mark: with journal.sync: os, starting without the check for a lost tail");
                Ok(None)
            }
        }
    }

    /// journal.db gone beside an earlier journal's intake log is a lost
    /// file, not a first start.
    fn refuse_without_db(&self, mark: Option<&intake::Mark>) -> Result<(), OpenError> {
        if self.path.exists() {
            return Ok(());
        }
        let segments =
            intake::segments_on(&*self.disk, self.dir).map_err(|e| self.intake_error(e))?;
        if mark.is_some() || !segments.is_empty() {
            return Err(OpenError::DbMissing(self.path.clone()));
        }
        Ok(())
    }

    /// The last run's reserve is this start's room to recover in.
    fn release_reserve(&self) -> Result<Reserve, OpenError> {
        let reserve = Reserve::new(self.dir).map_err(|e| self.dir_error(e))?;
        reserve.release();
        Ok(reserve)
    }

    /// Opens journal.db and replays the intake log beyond its last synced
    /// commit, beside SQLite's structural check; returns the indexer and
    /// the log position indexed.
    fn recover(
        &self,
        dedupe_ms: Option<u64>,
        history: Option<Recorder>,
    ) -> Result<(Indexer, u64), OpenError> {
        let started = std::time::Instant::now();
        let conn = store::open_writer(&self.path)
            .map_err(|e| self.full(&e).unwrap_or_else(|| self.open_error(e)))?;
        let check = spawn_integrity_check(&self.path).map_err(|e| self.dir_error(e))?;
        let pace = indexer::Pace::from_env();
        let recovered = Indexer::new(
            conn,
            self.disk.clone(),
            self.dir,
            self.full_sync,
            pace,
            dedupe_ms,
            history,
        )
        .map_err(|e| self.open_error(e))
        .and_then(|mut indexer| {
            let indexed = indexer.recover().map_err(|e| {
                self.full(&e).unwrap_or_else(|| {
                    if e.transient() {
                        OpenError::Retry(self.dir.to_path_buf(), e.to_string())
                    } else {
                        OpenError::Intake(self.dir.to_path_buf(), e.to_string())
                    }
                })
            })?;
            Ok((indexer, indexed))
        });
        // The check's verdict comes first: whatever else failed, a damaged
        // file is what the operator must hear about.
        let path = self.path.clone();
        let checked_in = match check.join() {
            Ok(Ok((None, took))) => took,
            Ok(Ok((Some(problem), _))) => return Err(OpenError::Integrity(path, problem)),
            Ok(Err(e)) => return Err(OpenError::Open(path, e)),
            Err(_) => return Err(OpenError::Integrity(path, "the check panicked".into())),
        };
        let recovered = recovered?;
        tracing::info!(
            dir = %self.dir.display(),
            checked_ms = checked_in.as_millis() as u64,
            opened_ms = started.elapsed().as_millis() as u64,
            "journal checked and recovered"
        );
        Ok(recovered)
    }

    /// The next seq, once the log is known to hold every acknowledged
    /// event: with `sync: always` a lost tail refuses the start. Checked
    /// before `resume_log` records the new position.
    fn refuse_lost_tail(
        &self,
        indexer: &Indexer,
        mark: Option<&intake::Mark>,
        indexed: u64,
    ) -> Result<i64, OpenError> {
        let next_seq = store::next_seq(indexer.conn()).map_err(|e| self.open_error(e))?;
        let Some(mark) = mark.filter(|m| m.end > indexed) else {
            return Ok(next_seq);
        };
        let events = (mark.next_seq - next_seq).max(0);
        let file = intake::segment_for(self.dir, indexed);
        if self.full_sync {
            return Err(OpenError::TailLost {
                dir: self.dir.to_path_buf(),
                file,
                events,
                end: indexed,
                acknowledged: mark.end,
            });
        }
        // With `sync: os` a crash of the machine may lose the tail, as
        // that setting allows; said loudly, not a reason to stay down.
        tracing::error!(events, file = %file.display(), "the intake log lost acknowledged events, as journal.sync: os allows after a machine crash; starting without them");
        Ok(next_seq)
    }

    /// The log resumes after every segment there is: what they hold is
    /// indexed and synced now, so they are all free for reuse. Returns
    /// the writer's log, where it resumes, and the segments rows point into.
    fn resume_log(
        &self,
        indexer: &mut Indexer,
        indexed: u64,
        next_seq: i64,
    ) -> Result<(LogWriter, u64, BTreeSet<u64>), OpenError> {
        let resume = intake::segments_on(&*self.disk, self.dir)
            .map_err(|e| self.intake_error(e))?
            .iter()
            .map(|(start, size, _)| start + size)
            .fold(indexed, u64::max);
        indexer.resume_at(resume).map_err(|e| {
            self.full(&e)
                .unwrap_or(OpenError::Intake(self.dir.to_path_buf(), e.to_string()))
        })?;
        let pinned = indexer.pinned();
        report_lost_segments(&*self.disk, self.dir, &pinned);
        let log = LogWriter::open_on(self.disk.clone(), self.dir, resume, next_seq, &pinned)
            .map_err(|e| self.full(&e).unwrap_or_else(|| self.intake_error(e)))?;
        Ok((log, resume, pinned))
    }

    /// The dedupe window's keys, as the index remembers them.
    fn dedupe(
        &self,
        conn: &Connection,
        dedupe_ms: Option<u64>,
    ) -> Result<Option<Arc<Mutex<Dedupe>>>, OpenError> {
        let Some(window) = dedupe_ms else {
            return Ok(None);
        };
        let mut d = Dedupe::new(window);
        let since = clock::now_ms().saturating_sub(window);
        for (key, at) in store::load_seen(conn, since).map_err(|e| self.open_error(e))? {
            d.remember(&key, at);
        }
        Ok(Some(Arc::new(Mutex::new(d))))
    }

    /// Takes the reserve back; true when there is no room for it, and
    /// ingress starts at 507, and says so.
    fn take_reserve(&self, reserve: &Reserve) -> bool {
        match reserve.take() {
            reserve::Taken::Held => false,
            reserve::Taken::Unsupported => {
                tracing::warn!(dir = %self.dir.display(), "the journal's file system cannot preallocate: no disk reserve, so a full disk may need a restart to recover");
                false
            }
            reserve::Taken::NoRoom { free, needed } => {
                tracing::warn!(dir = %self.dir.display(), free, needed, "the journal's disk has no room for its reserve: ingress answers 507 until `needed` bytes are free");
                true
            }
        }
    }

    /// The indexer, writer and checkpointer threads, and the handle.
    fn spawn(
        &self,
        indexer: Indexer,
        log: LogWriter,
        next_seq: i64,
        shared: Arc<Shared>,
    ) -> Result<Journal, OpenError> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let (to_indexer, from_writer) = std::sync::mpsc::channel();
        indexer
            .spawn(from_writer, shared.clone())
            .map_err(|e| self.dir_error(e))?;
        writer::spawn(
            Writer {
                log,
                next_seq,
                full_sync: self.full_sync,
                shared: shared.clone(),
                indexer: to_indexer.clone(),
                recycle_warned: None,
                sync_seconds: crate::metrics::journal_sync(),
            },
            rx,
        )
        .map_err(|e| self.dir_error(e))?;
        spawn_checkpointer(shared.clone()).map_err(|e| self.dir_error(e))?;
        Ok(Journal {
            tx,
            indexer: to_indexer,
            shared,
        })
    }

    /// SQLite may report a full disk as another I/O error (a -shm file
    /// it cannot size): with next to nothing free, it is the disk.
    fn full(&self, e: &dyn DiskError) -> Option<OpenError> {
        let free = reserve::space(self.dir).map_or(u64::MAX, |s| s.1);
        (e.disk_full() || free < NEARLY_FULL)
            .then(|| OpenError::DiskFull(self.dir.to_path_buf(), free))
    }

    fn dir_error(&self, e: std::io::Error) -> OpenError {
        OpenError::Dir(self.dir.to_path_buf(), e)
    }

    fn intake_error(&self, e: std::io::Error) -> OpenError {
        OpenError::Intake(self.dir.to_path_buf(), e.to_string())
    }

    fn open_error(&self, e: rusqlite::Error) -> OpenError {
        OpenError::Open(self.path.clone(), e)
    }
}

/// Every configured destination's counters, and those of destinations
/// only earlier configs named that still hold events; and the total bytes.
fn counters(
    destinations: &[String],
    summary: &[DestinationSummary],
) -> (HashMap<String, Arc<DestinationState>>, u64) {
    let mut states: HashMap<String, Arc<DestinationState>> = destinations
        .iter()
        .map(|d| (d.clone(), Arc::default()))
        .collect();
    let mut total = 0;
    for s in summary {
        let state = states.entry(s.destination.clone()).or_default();
        state.pending.store(s.pending, Ordering::Relaxed);
        state.bytes.store(s.bytes, Ordering::Relaxed);
        total += s.bytes;
    }
    (states, total)
}

/// Segments rows point into that are gone (removed by hand, or a restore
/// of journal.db without them): their events cannot be delivered, and each
/// is quarantined as damaged when it comes due. Said at start, by name.
fn report_lost_segments(disk: &dyn Disk, dir: &Path, pinned: &BTreeSet<u64>) {
    let present: BTreeSet<u64> = match intake::segments_on(disk, dir) {
        Ok(s) => s.into_iter().map(|(start, _, _)| start).collect(),
        // Not a reason to call every segment missing.
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot list the intake log's segments to look for missing ones");
            return;
        }
    };
    for start in pinned.difference(&present) {
        tracing::error!(
            file = %dir.join(intake::name(*start)).display(),
            "an intake log segment that pending events point into is missing: those events cannot be delivered and will be quarantined; restore the file from a backup to keep them"
        );
    }
}

/// SQLite's structural check, on a connection of its own beside the
/// replay of the intake log: on a large journal it reads the whole file,
/// and readiness waits for both.
type Checked = Result<(Option<String>, Duration), rusqlite::Error>;

fn spawn_integrity_check(path: &Path) -> std::io::Result<std::thread::JoinHandle<Checked>> {
    let path = path.to_path_buf();
    std::thread::Builder::new()
        .name("journal-check".into())
        .spawn(move || {
            let started = std::time::Instant::now();
            let conn = store::open_reader(&path)?;
            Ok((store::integrity_problem(&conn)?, started.elapsed()))
        })
}

/// An exclusive `flock` on `dir/courier.lock`, held while the journal's
/// threads live: two couriers on one journal would deliver everything twice.
pub(super) enum LockError {
    Open(PathBuf, std::io::Error),
    Held(PathBuf),
}

pub(super) fn lock(dir: &Path) -> Result<std::fs::File, LockError> {
    let lock_path = dir.join("courier.lock");
    let file = match std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
    {
        Ok(f) => f,
        Err(e) => return Err(LockError::Open(lock_path, e)),
    };
    // std's `flock(LOCK_EX | LOCK_NB)` on Linux, so an older courier's
    // lock and this one exclude each other; the lock goes with `file`.
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(LockError::Held(lock_path)),
        Err(std::fs::TryLockError::Error(e)) => Err(LockError::Open(lock_path, e)),
    }
}
