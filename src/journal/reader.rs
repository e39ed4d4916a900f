//! The dispatchers' and admin API's read side: their own SQLite
//! connections, which WAL lets run beside the indexer's commits.
//!
//! A row that fails its checksum is quarantined here, where it is read:
//! the caller gets sound events only, and a damaged one never reaches
//! delivery to come back as a change.

use super::disk::Disk;
use super::fetch::Log;
use super::indexer::ToIndexer;
use super::store::{self, EndpointRows, LoadError, StoreError};
use super::{Change, Shared, StoredEvent};
use crate::metrics;
use rusqlite::Connection;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

/// One dispatcher's read connection. Queries run on the blocking pool.
#[derive(Clone)]
pub struct Reader {
    conn: Arc<Mutex<Connection>>,
    /// The journal's directory, whose intake log holds the rows' events.
    dir: Arc<PathBuf>,
    /// The intake log's disk.
    disk: Arc<dyn Disk>,
    /// To fail the journal on a lasting read error. Weak: a reader kept
    /// after close must not hold the journal's lock.
    shared: Weak<Shared>,
    /// To quarantine the corrupt rows it reads.
    indexer: std::sync::mpsc::Sender<ToIndexer>,
}

type Loaded = Vec<Result<StoredEvent, StoreError>>;

impl Reader {
    pub(super) fn open(
        shared: &Arc<Shared>,
        indexer: std::sync::mpsc::Sender<ToIndexer>,
    ) -> Result<Reader, rusqlite::Error> {
        Ok(Reader {
            conn: Arc::new(Mutex::new(store::open_reader(&shared.path)?)),
            dir: Arc::new(shared.dir.clone()),
            disk: shared.disk.clone(),
            shared: Arc::downgrade(shared),
            indexer,
        })
    }

    /// The sound events of `rows`; each corrupt one is reported and
    /// quarantined (kept, never due again). A row that could not be read
    /// for another reason is left out, to be read again.
    async fn sound(&self, destination: &str, rows: Loaded) -> Vec<StoredEvent> {
        let mut sound = Vec::with_capacity(rows.len());
        let mut corrupt = Vec::new();
        for row in rows {
            match row {
                Ok(ev) => sound.push(ev),
                Err(e @ StoreError::Corrupt { seq, .. }) => {
                    tracing::error!(destination, journal = %self.dir.join(super::FILE).display(), error = %e,
                        "journal record is corrupt: it is kept but never delivered; inspect it with `courier journal inspect`");
                    metrics::corrupt(destination);
                    corrupt.push(Change::Quarantine { seq });
                }
                Err(e @ StoreError::Sqlite(_)) => {
                    tracing::warn!(destination, error = %e, "cannot read a journal row; it is read again later");
                }
            }
        }
        if !corrupt.is_empty()
            && let Err(e) = self.quarantine(corrupt).await
        {
            tracing::error!(destination, error = %e, "cannot quarantine the corrupt record");
        }
        sound
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, Log<'_>) -> Result<T, LoadError> + Send + 'static,
    ) -> Result<T, LoadError> {
        let conn = self.conn.clone();
        let dir = self.dir.clone();
        let disk = self.disk.clone();
        let result = tokio::task::spawn_blocking(move || {
            let guard = conn.lock().map_err(|_| LoadError::Unusable)?;
            let log = Log {
                disk: &*disk,
                dir: &dir,
            };
            f(&guard, log)
        })
        .await
        .map_err(|_| LoadError::Unusable)?;
        if let Err(e) = &result
            && let Some(reason) = log_failure(e)
            && let Some(shared) = self.shared.upgrade()
        {
            tracing::error!(error = %reason, dir = %self.dir.display(), "journal read failed; refusing writes until restart");
            if let Ok(mut f) = shared.gate.failed.lock() {
                f.get_or_insert(reason);
            }
        }
        result
    }

    /// Commits (synced) the quarantine of corrupt rows, unless the journal
    /// refuses writes.
    async fn quarantine(&self, changes: Vec<Change>) -> Result<(), super::JournalError> {
        // Not held across the commit: a reader must not keep the journal.
        self.shared
            .upgrade()
            .ok_or(super::JournalError::Closed)?
            .writable()?;
        super::to_indexer(&self.indexer, changes, true).await
    }

    /// Up to `limit` due events of `destination`, and no more once they
    /// hold `max_bytes`, skipping those in `held` without reading their
    /// events from the log (plus the rest of a stored batch the limit cut
    /// through), and whether more may be due.
    ///
    /// One read transaction for the scan and every row: in autocommit each
    /// statement takes and drops the WAL read lock (an `fcntl` apiece),
    /// which cost more than reading the rows in a backlog's drain.
    pub async fn due(
        &self,
        destination: &str,
        now_ms: u64,
        limit: usize,
        max_bytes: u64,
        held: &HashSet<i64>,
    ) -> Result<(Vec<StoredEvent>, bool), LoadError> {
        let d = destination.to_string();
        let held = held.clone();
        let (rows, more) = self
            .with(move |c, log| {
                let tx = c.unchecked_transaction()?;
                let (mut rows, more) = store::due(&tx, log, &d, now_ms, limit, max_bytes, &held)?;
                add_batch_siblings(&tx, log, &d, now_ms, &held, &mut rows)?;
                tx.finish()?;
                read_again_what_moved(c, log, &mut rows)?;
                Ok((rows, more))
            })
            .await?;
        Ok((self.sound(destination, rows).await, more))
    }

    /// Up to `limit` events of `destination` accepted at or before
    /// `cutoff_ms`, skipping those in `held`.
    pub async fn accepted_before(
        &self,
        destination: &str,
        cutoff_ms: u64,
        limit: usize,
        held: &HashSet<i64>,
    ) -> Result<Vec<StoredEvent>, LoadError> {
        let d = destination.to_string();
        let scan = limit + held.len();
        let seqs = self
            .with(move |c, _| Ok(store::accepted_before(c, &d, cutoff_ms, scan)?))
            .await?;
        let rows = self.load_unheld(seqs, held, limit).await?;
        Ok(self.sound(destination, rows).await)
    }

    async fn load_unheld(
        &self,
        seqs: Vec<i64>,
        held: &HashSet<i64>,
        limit: usize,
    ) -> Result<Loaded, LoadError> {
        let fresh: Vec<i64> = seqs
            .into_iter()
            .filter(|s| !held.contains(s))
            .take(limit)
            .collect();
        if fresh.is_empty() {
            return Ok(Vec::new());
        }
        self.with(move |c, log| {
            let mut rows = store::load(c, log, &fresh)?;
            read_again_what_moved(c, log, &mut rows)?;
            Ok(rows)
        })
        .await
    }

    pub async fn oldest_accepted(&self, destination: &str) -> Result<Option<u64>, LoadError> {
        let d = destination.to_string();
        self.with(move |c, _| Ok(store::oldest_accepted(c, &d)?))
            .await
    }

    /// `store::endpoint_rows`: a page of endpoints with pending events.
    pub async fn endpoint_rows(
        &self,
        destination: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<EndpointRows>, LoadError> {
        let (d, a) = (destination.to_string(), after.to_string());
        self.with(move |c, _| Ok(store::endpoint_rows(c, &d, &a, limit)?))
            .await
    }

    /// `store::endpoint_row`: one endpoint's pending events.
    pub async fn endpoint_row(
        &self,
        destination: &str,
        origin: &str,
    ) -> Result<Option<EndpointRows>, LoadError> {
        let (d, o) = (destination.to_string(), origin.to_string());
        self.with(move |c, _| Ok(store::endpoint_row(c, &d, &o)?))
            .await
    }

    /// The oldest accept time of `destination`'s pending events, wherever
    /// they are: in SQLite, or not yet (`Unindexed`). Two lookups of a
    /// first entry, cheap enough for every scrape.
    pub async fn oldest_pending(&self, destination: &str) -> Result<Option<u64>, LoadError> {
        let unindexed = self
            .shared
            .upgrade()
            .and_then(|s| s.destination(destination))
            .and_then(|d| d.unindexed.lock().ok().and_then(|u| u.oldest()));
        let indexed = self.oldest_accepted(destination).await?;
        Ok(indexed.into_iter().chain(unindexed).min())
    }

    /// Up to `limit` pending events of any destination after seq `after`,
    /// in seq order, and no more once they hold `max_bytes` (but always
    /// one), and the last seq looked at (`None`: none is left).
    pub async fn pending_after(
        &self,
        after: i64,
        limit: usize,
        max_bytes: u64,
    ) -> Result<(Vec<StoredEvent>, Option<i64>), LoadError> {
        let (rows, last) = self
            .with(move |c, log| {
                let seqs = store::pending_after(c, after, limit, max_bytes)?;
                let last = seqs.last().copied();
                let mut rows = store::load(c, log, &seqs)?;
                read_again_what_moved(c, log, &mut rows)?;
                Ok((rows, last))
            })
            .await?;
        Ok((self.sound("(hand-off)", rows).await, last))
    }

    pub async fn next_due_after(
        &self,
        destination: &str,
        now_ms: u64,
    ) -> Result<Option<u64>, LoadError> {
        let d = destination.to_string();
        self.with(move |c, _| Ok(store::next_due_after(c, &d, now_ms)?))
            .await
    }
}

/// A stored batch is retried whole: when the scan's limit cut through one,
/// the rest of its events (due at the same time) are read too.
fn add_batch_siblings(
    c: &Connection,
    log: Log<'_>,
    destination: &str,
    now_ms: u64,
    held: &HashSet<i64>,
    rows: &mut Loaded,
) -> Result<(), LoadError> {
    let batches: HashSet<String> = rows
        .iter()
        .filter_map(|r| r.as_ref().ok()?.batch.clone())
        .collect();
    if batches.is_empty() {
        return Ok(());
    }
    let mut have: HashSet<i64> = rows
        .iter()
        .filter_map(|r| r.as_ref().ok().map(|e| e.seq))
        .collect();
    have.extend(held);
    let mut missing = Vec::new();
    for b in &batches {
        missing.extend(
            store::batch_seqs(c, destination, b, now_ms)?
                .into_iter()
                .filter(|s| !have.contains(s)),
        );
    }
    if !missing.is_empty() {
        rows.extend(store::load(c, log, &missing)?);
    }
    Ok(())
}

/// A read of the intake log that failed for more than a passing shortage
/// (EIO, EACCES) fails the journal, as a failed write does (docs/journal.md
/// "Journal faults"): retried for ever, it would stall its destination
/// without a word to the kubelet.
fn log_failure(e: &LoadError) -> Option<String> {
    let LoadError::Log(io) = e else {
        return None;
    };
    (!super::intake::is_transient(io)).then(|| e.to_string())
}

/// Rows that failed are read once more, outside the read transaction that
/// found them: a spill may have copied a row's event into it and freed the
/// segment it pointed into meanwhile. What fails again is damaged; a row
/// gone since (delivered, by a late answer) is left out.
fn read_again_what_moved(c: &Connection, log: Log<'_>, rows: &mut Loaded) -> Result<(), LoadError> {
    let failed: Vec<i64> = rows
        .iter()
        .filter_map(|r| match r {
            Err(StoreError::Corrupt { seq, .. }) => Some(*seq),
            _ => None,
        })
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    // In place: the caller's order (due time, age) holds.
    let mut again = HashMap::new();
    let mut other = Vec::new();
    for r in store::load(c, log, &failed)? {
        match &r {
            Ok(s) => _ = again.insert(s.seq, r),
            Err(StoreError::Corrupt { seq, .. }) => _ = again.insert(*seq, r),
            Err(StoreError::Sqlite(_)) => other.push(r),
        }
    }
    let read = std::mem::take(rows);
    rows.extend(read.into_iter().filter_map(|r| match r {
        Err(StoreError::Corrupt { seq, .. }) => again.remove(&seq),
        sound => Some(sound),
    }));
    rows.extend(other);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lasting_log_read_error_fails_the_journal() {
        let io = |errno| LoadError::Log(std::io::Error::from_raw_os_error(errno));
        let said = log_failure(&io(libc::EIO)).expect("EIO fails the journal");
        assert!(said.contains("cannot read the intake log"), "{said}");
        assert!(log_failure(&io(libc::EACCES)).is_some());
        assert_eq!(log_failure(&io(libc::EMFILE)), None);
        assert_eq!(log_failure(&rusqlite::Error::InvalidQuery.into()), None);
        assert_eq!(log_failure(&LoadError::Unusable), None);
    }
}
