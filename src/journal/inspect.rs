//! `courier journal inspect`: what a stopped courier left behind, read
//! without changing anything.

use super::intake::{self, LogReader};
use super::open::{LockError, lock};
use super::store::{self, DestinationSummary, FILE};
use super::{NewEvent, OpenError};
use rusqlite::Connection;
use std::path::{Path, PathBuf};

/// `courier journal inspect`: reads a stopped courier's journal.
pub fn inspect(dir: &Path) -> Result<Inspection, OpenError> {
    let path = dir.join(FILE);
    if !path.exists() {
        return Err(OpenError::Missing(path));
    }
    // A running courier's log changes under the reader: refuse, rather than
    // report a moving end as damage.
    let _lock = lock(dir).map_err(|e| match e {
        LockError::Held(lock_path) => OpenError::Locked(path.clone(), lock_path),
        LockError::Open(lock_path, e) => OpenError::Dir(lock_path, e),
    })?;
    let conn = Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| OpenError::Open(path.clone(), e))?;
    let integrity =
        store::integrity_problem(&conn).map_err(|e| OpenError::Open(path.clone(), e))?;
    let mut summary = store::summary(&conn).map_err(|e| OpenError::Open(path.clone(), e))?;
    let mut corrupt: Vec<String> = store::corrupt_rows(
        &conn,
        super::fetch::Log {
            disk: &super::disk::Real,
            dir,
        },
    )
    .map_err(|e| match e {
        store::LoadError::Sqlite(e) => OpenError::Open(path.clone(), e),
        other => OpenError::InspectLog(dir.to_path_buf(), other.to_string()),
    })?
    .iter()
    .map(ToString::to_string)
    .collect();
    // Events the log holds beyond SQLite's rows are pending too: the next
    // start indexes them.
    let mut unindexed = 0;
    let mut reader = LogReader::new(dir);
    let mut at = store::intake_pos(&conn).map_err(|e| OpenError::Open(path.clone(), e))?;
    let mut next_seq = store::next_seq(&conn).map_err(|e| OpenError::Open(path.clone(), e))?;
    loop {
        match reader.read(at) {
            Ok(intake::Read::Record(events, next)) => {
                for l in events {
                    unindexed += 1;
                    next_seq = next_seq.max(l.seq + 1);
                    add_pending(&mut summary, &l.event);
                }
                at = next;
            }
            Ok(intake::Read::End) => {
                // What the start would refuse: a log ending before its mark.
                match intake::Mark::read(dir) {
                    Ok(Some(mark)) if mark.end > at => corrupt.push(format!(
                        "{} acknowledged events are missing from the intake log: they should follow position {at} in {}, which is truncated, damaged or missing (acknowledged up to position {})",
                        (mark.next_seq - next_seq).max(0),
                        intake::segment_for(dir, at).display(),
                        mark.end
                    )),
                    Ok(_) => {}
                    Err(e) => corrupt.push(e.to_string()),
                }
                break;
            }
            Err(e) => {
                corrupt.push(e.to_string());
                break;
            }
        }
    }
    let mut file_bytes: u64 = ["", "-wal"]
        .iter()
        .filter_map(|s| std::fs::metadata(format!("{}{s}", path.display())).ok())
        .map(|m| m.len())
        .sum();
    file_bytes += intake::segments(dir)
        .map(|s| s.iter().map(|(_, size, _)| size).sum::<u64>())
        .unwrap_or(0);
    Ok(Inspection {
        path,
        integrity,
        summary,
        corrupt,
        file_bytes,
        unindexed,
    })
}

fn add_pending(summary: &mut Vec<DestinationSummary>, e: &NewEvent) {
    let i = match summary.iter().position(|s| s.destination == e.destination) {
        Some(i) => i,
        None => {
            summary.push(DestinationSummary {
                destination: e.destination.clone(),
                ..Default::default()
            });
            summary.len() - 1
        }
    };
    let s = &mut summary[i];
    s.pending += 1;
    s.bytes += e.size();
    s.oldest_accepted_ms = Some(
        s.oldest_accepted_ms
            .map_or(e.accepted_ms, |o| o.min(e.accepted_ms)),
    );
}

pub struct Inspection {
    pub path: PathBuf,
    pub integrity: Option<String>,
    pub summary: Vec<DestinationSummary>,
    pub corrupt: Vec<String>,
    pub file_bytes: u64,
    /// Events in the intake log not yet in SQLite (counted in `summary`).
    pub unindexed: u64,
}
