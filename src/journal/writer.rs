//! The writer thread: drains every queued command into one transaction,
//! commits (one fdatasync for the group), then answers every waiter.
//! After a failed commit it refuses all writes: once fsync has failed, the
//! page cache can no longer be trusted to match the disk.

use super::store::QUARANTINED;
use super::{Change, Command, JournalError, Shared};
use crate::admin::metrics;
use rusqlite::{Connection, ErrorCode, params};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Upper bound of commands in one group, so one commit cannot grow without end.
const MAX_GROUP: usize = 4096;
/// How often the writer itself checkpoints, which lets the WAL restart.
const WRITER_CHECKPOINT: Duration = Duration::from_secs(1);

pub(super) fn spawn(
    conn: Connection,
    rx: mpsc::Receiver<Command>,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("journal-writer".into())
        .spawn(move || run(conn, rx, shared))
        .map(|_| ())
}

fn run(conn: Connection, mut rx: mpsc::Receiver<Command>, shared: Arc<Shared>) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    let mut last_checkpoint = Instant::now();
    while let Some(first) = rx.blocking_recv() {
        group.push(first);
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(cmd) => group.push(cmd),
                Err(_) => break,
            }
        }
        let close = group
            .iter()
            .position(|c| matches!(c, Command::Close { .. }));
        let rest = close.map(|i| group.split_off(i));
        commit_group(&conn, &mut group, &shared);
        if last_checkpoint.elapsed() >= WRITER_CHECKPOINT {
            // Under sustained load the background checkpointer never catches
            // up with the writer, so the WAL could never restart and would
            // grow without bound; from the writer no frame can arrive during
            // the checkpoint. The background one has copied most pages, so
            // this stall is short.
            if let Err(e) = conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)") {
                tracing::warn!(error = %e, "journal checkpoint failed; will retry");
            }
            last_checkpoint = Instant::now();
        }
        if let Some(rest) = rest {
            release(rest.iter(), shared.as_ref());
            for cmd in rest {
                match cmd {
                    Command::Close { reply } => {
                        let _ = reply.send(());
                    }
                    Command::Append { reply, .. } | Command::Apply { reply, .. } => {
                        let _ = reply.send(Err(JournalError::Closed));
                    }
                }
            }
            rx.close();
            // Fold the WAL into the main file on a clean stop, so that a copy
            // of journal.db alone is a complete backup.
            let _ = conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)");
            return;
        }
    }
}

fn commit_group(conn: &Connection, group: &mut Vec<Command>, shared: &Shared) {
    if group.is_empty() {
        return;
    }
    let failed = shared.failed.lock().ok().and_then(|f| f.clone());
    let started = Instant::now();
    let result = match failed {
        Some(reason) => Err(JournalError::Failed(reason)),
        None => write(conn, group).map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            if matches!(e.sqlite_error_code(), Some(ErrorCode::DiskFull)) {
                JournalError::DiskFull
            } else {
                let reason = e.to_string();
                tracing::error!(error = %reason, path = %shared.path.display(), "journal commit failed; refusing writes until restart");
                if let Ok(mut f) = shared.failed.lock() {
                    *f = Some(reason.clone());
                }
                JournalError::Failed(reason)
            }
        }),
    };
    metrics::journal_sync(started.elapsed());
    let result = result.map(|deleted| account(group, shared, &deleted));
    if result.is_err() {
        release(group.iter(), shared);
    }
    for cmd in group.drain(..) {
        match cmd {
            Command::Append { reply, .. } | Command::Apply { reply, .. } => {
                let _ = reply.send(result.clone());
            }
            Command::Close { .. } => {}
        }
    }
}

/// Returns the seqs that deletes actually removed, for the counters.
fn write(conn: &Connection, group: &[Command]) -> Result<HashSet<i64>, rusqlite::Error> {
    let mut deleted = HashSet::new();
    conn.execute_batch("BEGIN IMMEDIATE")?;
    {
        let mut insert = conn.prepare_cached(
            "INSERT INTO events (id, destination, method, path, headers, body, accepted_ms, crc, attempts, next_due_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 0, ?7)",
        )?;
        let mut delete = conn.prepare_cached(
            "DELETE FROM events WHERE seq = ?1 AND (?2 IS NULL OR attempts = ?2)",
        )?;
        let mut reschedule = conn.prepare_cached(
            "UPDATE events SET attempts = ?2, next_due_ms = ?3, last_outcome = ?4, last_status = ?5, last_attempt_ms = ?6 WHERE seq = ?1",
        )?;
        let mut quarantine =
            conn.prepare_cached("UPDATE events SET next_due_ms = ?2 WHERE seq = ?1")?;
        for cmd in group {
            match cmd {
                Command::Append { events, .. } => {
                    for e in events {
                        let headers = super::record::encode_headers(&e.headers);
                        let crc = super::record::crc(
                            &e.id,
                            &e.destination,
                            &e.method,
                            &e.path,
                            &headers,
                            &e.body,
                        );
                        insert.execute(params![
                            e.id,
                            e.destination,
                            e.method,
                            e.path,
                            headers,
                            &e.body[..],
                            e.accepted_ms as i64,
                            crc
                        ])?;
                    }
                }
                Command::Apply { changes, .. } => {
                    for c in changes {
                        match c {
                            Change::Delete {
                                seq,
                                only_if_attempts,
                                ..
                            } => {
                                if delete.execute(params![seq, only_if_attempts])? > 0 {
                                    deleted.insert(*seq);
                                }
                            }
                            Change::Reschedule {
                                seq,
                                attempts,
                                next_due_ms,
                                outcome,
                                status,
                                attempt_ms,
                            } => {
                                reschedule.execute(params![
                                    seq,
                                    attempts,
                                    *next_due_ms as i64,
                                    outcome,
                                    status,
                                    *attempt_ms as i64
                                ])?;
                            }
                            Change::Quarantine { seq } => {
                                quarantine.execute(params![seq, QUARANTINED])?;
                            }
                        }
                    }
                }
                Command::Close { .. } => {}
            }
        }
    }
    conn.execute_batch("COMMIT")?;
    Ok(deleted)
}

/// Gives back the bytes that admission reserved for appends that were not
/// written.
fn release<'a>(cmds: impl Iterator<Item = &'a Command>, shared: &Shared) {
    let size: u64 = cmds
        .filter_map(|c| match c {
            Command::Append { events, .. } => {
                Some(events.iter().map(super::NewEvent::size).sum::<u64>())
            }
            _ => None,
        })
        .sum();
    let _ = shared
        .pending_bytes
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
            Some(p.saturating_sub(size))
        });
}

/// Updates the in-memory counters after a commit and wakes the dispatchers.
fn account(group: &[Command], shared: &Shared, deleted: &HashSet<i64>) {
    let mut accepted: HashMap<&str, u64> = HashMap::new();
    for cmd in group {
        match cmd {
            Command::Append { events, .. } => {
                for e in events {
                    let size = e.size();
                    if let Some(d) = shared.destination(&e.destination) {
                        d.pending.fetch_add(1, Ordering::Relaxed);
                        d.bytes.fetch_add(size, Ordering::Relaxed);
                    }
                    // Counted here, not at the 202: an app that hung up
                    // before its answer still has its event stored.
                    *accepted.entry(e.destination.as_str()).or_default() += 1;
                }
            }
            Command::Apply { changes, .. } => {
                for c in changes {
                    if let Change::Delete {
                        seq,
                        destination,
                        size,
                        ..
                    } = c
                        && deleted.contains(seq)
                    {
                        let _ = shared.pending_bytes.fetch_update(
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                            |v| Some(v.saturating_sub(*size)),
                        );
                        if let Some(d) = shared.destination(destination) {
                            let _ =
                                d.pending
                                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                                        Some(v.saturating_sub(1))
                                    });
                            let _ =
                                d.bytes
                                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                                        Some(v.saturating_sub(*size))
                                    });
                        }
                    }
                }
            }
            Command::Close { .. } => {}
        }
    }
    for (destination, n) in accepted {
        metrics::accepted(destination, n);
        if let Some(d) = shared.destination(destination) {
            d.notify.notify_one();
        }
    }
}

/// PASSIVE checkpoints on their own connection, so the writer never stalls
/// on one; WAL frames are copied to the main file while commits go on.
pub(super) fn spawn_checkpointer(shared: Arc<Shared>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("journal-checkpoint".into())
        .spawn(move || {
            let Ok(conn) = Connection::open(&shared.path) else {
                return;
            };
            while !shared.closed.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(250));
                if let Err(e) = conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)") {
                    tracing::warn!(error = %e, "journal checkpoint failed; will retry");
                }
            }
        })
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::NewEvent;
    use std::path::PathBuf;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use tokio::sync::oneshot;

    fn shared(path: PathBuf) -> Shared {
        Shared {
            path,
            max_bytes: 1 << 30,
            pending_bytes: AtomicU64::new(0),
            failed: Mutex::new(None),
            closed: AtomicBool::new(false),
            destinations: [("d".to_string(), Arc::default())].into_iter().collect(),
        }
    }

    fn append(id: &str) -> (Command, oneshot::Receiver<Result<(), JournalError>>) {
        let event = NewEvent {
            id: id.into(),
            destination: "d".into(),
            method: "POST".into(),
            path: String::new(),
            headers: vec![],
            body: bytes::Bytes::from_static(b"{}"),
            accepted_ms: 1,
        };
        let (reply, rx) = oneshot::channel();
        (
            Command::Append {
                events: vec![event],
                reply,
            },
            rx,
        )
    }

    #[test]
    fn a_group_shares_one_commit_and_every_waiter_hears_the_result() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("j.db");
        let conn = crate::journal::store::open_writer(&path, true).expect("open");
        let shared = shared(path);
        let (a, mut ra) = append("a");
        let (b, mut rb) = append("b");
        commit_group(&conn, &mut vec![a, b], &shared);
        assert_eq!(ra.try_recv().expect("answered"), Ok(()));
        assert_eq!(rb.try_recv().expect("answered"), Ok(()));
        let n: i64 = conn
            .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
            .expect("count");
        assert_eq!(n, 2);
        assert_eq!(
            shared
                .destination("d")
                .map(|d| d.pending.load(Ordering::Relaxed)),
            Some(2)
        );
    }

    #[test]
    fn after_a_failed_commit_every_write_is_refused_and_nothing_is_counted() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("j.db");
        let conn = crate::journal::store::open_writer(&path, true).expect("open");
        let shared = shared(path);
        // A real SQLite error on the write path (not a disk-full one).
        conn.pragma_update(None, "query_only", 1).expect("pragma");
        let (a, mut ra) = append("a");
        commit_group(&conn, &mut vec![a], &shared);
        assert!(matches!(
            ra.try_recv().expect("answered"),
            Err(JournalError::Failed(_))
        ));
        // Even once the cause is gone, the journal stays refused until restart.
        conn.pragma_update(None, "query_only", 0).expect("pragma");
        let (b, mut rb) = append("b");
        commit_group(&conn, &mut vec![b], &shared);
        assert!(matches!(
            rb.try_recv().expect("answered"),
            Err(JournalError::Failed(_))
        ));
        let n: i64 = conn
            .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
            .expect("count");
        assert_eq!(n, 0);
        assert_eq!(shared.pending_bytes.load(Ordering::Relaxed), 0);
    }
}
