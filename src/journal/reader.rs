//! The dispatchers' and admin API's read side: their own SQLite
//! connections, which WAL lets run beside the indexer's commits.

use super::StoredEvent;
use super::store::{self, StoreError};
use rusqlite::Connection;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One dispatcher's read connection. Queries run on the blocking pool.
#[derive(Clone)]
pub struct Reader {
    conn: Arc<Mutex<Connection>>,
    /// The journal's directory, whose intake log holds the rows' events.
    dir: Arc<PathBuf>,
}

type Loaded = Vec<Result<StoredEvent, StoreError>>;

impl Reader {
    pub(super) fn open(path: &Path) -> Result<Reader, rusqlite::Error> {
        Ok(Reader {
            conn: Arc::new(Mutex::new(store::open_reader(path)?)),
            dir: Arc::new(path.parent().unwrap_or(Path::new(".")).to_path_buf()),
        })
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, &Path) -> Result<T, rusqlite::Error> + Send + 'static,
    ) -> Result<T, rusqlite::Error> {
        let conn = self.conn.clone();
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || {
            let guard = conn.lock().map_err(|_| rusqlite::Error::InvalidQuery)?;
            f(&guard, &dir)
        })
        .await
        .map_err(|_| rusqlite::Error::InvalidQuery)?
    }

    /// Up to `limit` due events of `destination`, skipping those in `held`
    /// without reading their rows (plus the rest of a stored batch the
    /// limit cut through), and whether more may be due.
    ///
    /// One read transaction for the scan and every row: in autocommit each
    /// statement takes and drops the WAL read lock (an `fcntl` apiece),
    /// which cost more than reading the rows in a backlog's drain.
    pub async fn due(
        &self,
        destination: &str,
        now_ms: u64,
        limit: usize,
        held: &HashSet<i64>,
    ) -> Result<(Loaded, bool), rusqlite::Error> {
        let d = destination.to_string();
        let held = held.clone();
        self.with(move |c, dir| {
            let tx = c.unchecked_transaction()?;
            let seqs = store::due_seqs(&tx, &d, now_ms, limit + held.len())?;
            let fresh: Vec<i64> = seqs
                .into_iter()
                .filter(|s| !held.contains(s))
                .take(limit)
                .collect();
            // Counted before loading: a row deleted meanwhile (a late
            // answer) must not make the rest look like the end.
            let more = fresh.len() >= limit;
            let mut rows = store::load(&tx, dir, &fresh)?;
            add_batch_siblings(&tx, dir, &d, now_ms, &held, &mut rows)?;
            tx.finish()?;
            read_again_what_moved(c, dir, &mut rows)?;
            Ok((rows, more))
        })
        .await
    }

    /// Up to `limit` events of `destination` accepted at or before
    /// `cutoff_ms`, skipping those in `held`.
    pub async fn accepted_before(
        &self,
        destination: &str,
        cutoff_ms: u64,
        limit: usize,
        held: &HashSet<i64>,
    ) -> Result<Loaded, rusqlite::Error> {
        let d = destination.to_string();
        let scan = limit + held.len();
        let seqs = self
            .with(move |c, _| store::accepted_before(c, &d, cutoff_ms, scan))
            .await?;
        self.load_unheld(seqs, held, limit).await
    }

    async fn load_unheld(
        &self,
        seqs: Vec<i64>,
        held: &HashSet<i64>,
        limit: usize,
    ) -> Result<Loaded, rusqlite::Error> {
        let fresh: Vec<i64> = seqs
            .into_iter()
            .filter(|s| !held.contains(s))
            .take(limit)
            .collect();
        if fresh.is_empty() {
            return Ok(Vec::new());
        }
        self.with(move |c, dir| {
            let mut rows = store::load(c, dir, &fresh)?;
            read_again_what_moved(c, dir, &mut rows)?;
            Ok(rows)
        })
        .await
    }

    pub async fn oldest_accepted(&self, destination: &str) -> Result<Option<u64>, rusqlite::Error> {
        let d = destination.to_string();
        self.with(move |c, _| store::oldest_accepted(c, &d)).await
    }

    pub async fn next_due_after(
        &self,
        destination: &str,
        now_ms: u64,
    ) -> Result<Option<u64>, rusqlite::Error> {
        let d = destination.to_string();
        self.with(move |c, _| store::next_due_after(c, &d, now_ms))
            .await
    }
}

/// A stored batch is retried whole: when the scan's limit cut through one,
/// the rest of its events (due at the same time) are read too.
fn add_batch_siblings(
    c: &Connection,
    dir: &Path,
    destination: &str,
    now_ms: u64,
    held: &HashSet<i64>,
    rows: &mut Loaded,
) -> Result<(), rusqlite::Error> {
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
        rows.extend(store::load(c, dir, &missing)?);
    }
    Ok(())
}

/// Rows that failed are read once more, outside the read transaction that
/// found them: a spill may have copied a row's event into it and freed the
/// segment it pointed into meanwhile. What fails again is damaged; a row
/// gone since (delivered, by a late answer) is left out.
fn read_again_what_moved(
    c: &Connection,
    dir: &Path,
    rows: &mut Loaded,
) -> Result<(), rusqlite::Error> {
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
    rows.retain(Result::is_ok);
    rows.extend(store::load(c, dir, &failed)?);
    Ok(())
}
