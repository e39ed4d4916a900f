//! Event history (docs/history.md): "where is my webhook?" answered by id, from
//! the API and the CLI, for every event and destination: accepted, each
//! attempt, and how it ended.
//!
//! Durability comes from the journal, not from syncs of its own: the
//! journal's indexer records history in each of its commits (`Recorder`,
//! driven from `journal::indexer`), before the journal's own transaction,
//! so that an outcome the journal made durable is in history too; and it
//! syncs history's files just before each of its own syncs. After a crash
//! the intake log replayed from the journal's position records accepts
//! again (an insert that finds its row keeps the row). A delivery the
//! journal never recorded (a crash within its sync interval) is sent
//! again after the restart, and that attempt is recorded then.
//!
//! Retention drops whole time partitions (`partition`): a file per eighth
//! of `retain`, or per eighth of `max_bytes` (at most 100,000 records),
//! whichever fills first. The
//! records of events still in the journal are copied forward before their
//! partition goes, so that a retried event never loses its attempts.
//!
//! `in_flight` and what holds a pending event are not stored: the admin
//! API reads them from the dispatchers when asked.

mod newest;
mod partition;
mod query;
mod recorder;
pub mod step;

pub use partition::Record;
pub use query::{Filter, Reader};
pub use recorder::{Accepted, Recorder};
pub use step::{Attempt, State, Step};

use crate::config::HistorySettings;
use newest::NewestIds;
use partition::Name;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};

/// The folder under `journal.dir`: history shares the journal's fate (an
/// `emptyDir` gone at a deploy takes both), and its seqs.
pub const DIR: &str = "history";

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("cannot open the event history in {0}: {1}")]
    Open(PathBuf, String),
    /// A start on a full disk waits for room rather than exit.
    #[error("cannot open the event history in {0}: the disk is full ({1})")]
    DiskFull(PathBuf, String),
}

/// Records per destination, by stored state.
pub type Counts = [u64; 5];

/// What the recorder publishes and the readers read.
struct Shared {
    dir: PathBuf,
    /// Oldest first; the last is the one written.
    partitions: Mutex<Vec<Name>>,
    newest: RwLock<NewestIds>,
    /// Signed: a start counts the partitions it opened in the background
    /// (`recorder::count_in_background`) while the recorder's changes
    /// since come as deltas, in either order.
    counts: Mutex<HashMap<String, [i64; 5]>>,
    /// Set once the start's count is in `counts`.
    counted: tokio::sync::watch::Sender<bool>,
    bytes: AtomicU64,
}

impl Shared {
    fn partitions(&self) -> Vec<Name> {
        self.partitions
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default()
    }

    fn newest(&self) -> std::sync::RwLockWriteGuard<'_, NewestIds> {
        self.newest
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// See `NewestIds::seqs`.
    fn newest_seqs(&self, partition: &Name, hash: u32) -> Option<Vec<i64>> {
        self.newest
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .seqs(partition, hash)
    }

    fn count(&self, destination: &str, state: State, delta: i64) {
        let Ok(mut counts) = self.counts.lock() else {
            return;
        };
        let c = &mut counts.entry(destination.to_string()).or_default()[state as usize];
        *c = c.saturating_add(delta);
    }

    /// Every record counted, for the metrics.
    fn records(&self) -> u64 {
        self.counts
            .lock()
            .map(|c| {
                c.values()
                    .flat_map(|v| v.iter())
                    .map(|&n| n.max(0) as u64)
                    .sum()
            })
            .unwrap_or(0)
    }
}

/// The read side, shared by the admin API; cheap to clone.
#[derive(Clone)]
pub struct History {
    shared: Arc<Shared>,
}

impl History {
    /// Opens (or starts) the history in `journal_dir`, and its recorder,
    /// which goes to the journal's indexer.
    pub fn open(
        journal_dir: &Path,
        settings: HistorySettings,
    ) -> Result<(History, Recorder), HistoryError> {
        let dir = journal_dir.join(DIR);
        let err = |e: &dyn std::fmt::Display, full: bool| {
            if full {
                HistoryError::DiskFull(dir.clone(), e.to_string())
            } else {
                HistoryError::Open(dir.clone(), e.to_string())
            }
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| err(&e, e.kind() == std::io::ErrorKind::StorageFull))?;
        crate::file_modes::tighten(&dir);
        let shared = Arc::new(Shared {
            dir: dir.clone(),
            partitions: Mutex::new(Vec::new()),
            newest: RwLock::new(NewestIds::default()),
            counts: Mutex::new(HashMap::new()),
            counted: tokio::sync::watch::Sender::new(false),
            bytes: AtomicU64::new(0),
        });
        let recorder = Recorder::open(shared.clone(), settings).map_err(|e| {
            let full = e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull);
            err(&e, full)
        })?;
        Ok((History { shared }, recorder))
    }

    pub fn reader(&self) -> Reader {
        Reader::new(self.shared.clone())
    }

    /// Records per stored state of `destination`, in what is retained;
    /// right once `counted` is.
    pub fn counts(&self, destination: &str) -> Counts {
        let signed = self
            .shared
            .counts
            .lock()
            .ok()
            .and_then(|c| c.get(destination).copied())
            .unwrap_or_default();
        signed.map(|n| n.max(0) as u64)
    }

    /// Once the start's count of the partitions it found is in `counts`.
    pub async fn counted(&self) {
        let mut done = self.shared.counted.subscribe();
        // The sender lives in `shared`, which `self` holds: never closed.
        let _ = done.wait_for(|&counted| counted).await;
    }

    /// Every record retained, and the bytes of the files holding them.
    #[cfg(test)]
    pub(crate) fn size(&self) -> (u64, u64) {
        (
            self.shared.records(),
            self.shared.bytes.load(std::sync::atomic::Ordering::Relaxed),
        )
    }
}
