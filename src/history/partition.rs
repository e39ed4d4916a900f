//! One partition of history: a SQLite file holding the records of the
//! events first recorded while it was the newest. Retention drops a whole
//! file (unlink), never rows one by one: deleting rows leaves a file as
//! large as before and costs a write per row (Svix #1933), where an
//! unlinked file gives its space back at once.
//!
//! A row is one event at one destination (a topic's copies are rows of
//! their own under one id), keyed by the journal's seq. Its attempts are
//! one blob (`step::encode`); the id is looked up through a 31-bit hash
//! of it, so that the index stays a few bytes a row.

use super::step::{self, Attempt, State};
use crate::event::Reason;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row as SqlRow, params};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS deliveries (
    seq INTEGER PRIMARY KEY,
    idh INTEGER NOT NULL,
    id TEXT NOT NULL,
    destination TEXT NOT NULL,
    accepted_ms INTEGER NOT NULL,
    state INTEGER NOT NULL,
    prior INTEGER NOT NULL,
    attempts BLOB NOT NULL,
    next_due_ms INTEGER,
    finished_ms INTEGER,
    reason INTEGER,
    endpoint TEXT
);
CREATE INDEX IF NOT EXISTS unfinished ON deliveries(seq) WHERE state = 0;
";

/// The lookups by id and by endpoint, built when the partition stops being
/// the newest. A row's id is random, and with many endpoints so is its
/// place among the endpoints: kept while the partition is written, each
/// index dirtied a page a row, which its commit and checkpoint then wrote
/// (benches/RESULTS.md, step m). Until the roll, `newest` stands in for
/// the ids and `?endpoint=` reads the newest partition whole (at most
/// `recorder::MAX_ROWS` rows).
///
/// `by_endpoint` holds no `seq`: an index's entries end with the rowid,
/// which `seq` is, so an endpoint's rows are in seq order already (built
/// with `seq` too, it took 0.86 µs an event of step m against 0.59).
///
/// `endpoint` (`url: per_event`) is the endpoint's origin, never its path
/// or query, which often carry the endpoint's own secret, as history is
/// read without the admin token. Partitions written before it get the
/// column, NULL.
const ROLLED_INDEXES: &str = "
CREATE INDEX IF NOT EXISTS by_id ON deliveries(idh);
CREATE INDEX IF NOT EXISTS by_endpoint ON deliveries(endpoint) WHERE endpoint IS NOT NULL;
";

/// What a row holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub seq: i64,
    pub id: String,
    pub destination: String,
    pub accepted_ms: u64,
    pub state: State,
    /// Attempts made by a courier that handed the event off.
    pub prior: u32,
    pub attempts: Vec<Attempt>,
    pub next_due_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    pub reason: Option<Reason>,
    /// The origin of its endpoint (`url: per_event`).
    pub endpoint: Option<String>,
}

pub const COLUMNS: &str = "seq, id, destination, accepted_ms, state, prior, attempts, next_due_ms, finished_ms, reason, endpoint";

pub fn record(r: &SqlRow<'_>) -> rusqlite::Result<Record> {
    let accepted_ms = r.get::<_, i64>(3)?.max(0) as u64;
    let blob: Vec<u8> = r.get(6)?;
    Ok(Record {
        seq: r.get(0)?,
        id: r.get(1)?,
        destination: r.get(2)?,
        accepted_ms,
        state: State::from_code(r.get(4)?),
        prior: r.get::<_, i64>(5)?.clamp(0, i64::from(u32::MAX)) as u32,
        attempts: step::decode(&blob, accepted_ms),
        next_due_ms: r.get::<_, Option<i64>>(7)?.map(|t| t.max(0) as u64),
        finished_ms: r.get::<_, Option<i64>>(8)?.map(|t| t.max(0) as u64),
        reason: r.get::<_, Option<i64>>(9)?.and_then(step::reason_of),
        endpoint: r.get(10)?,
    })
}

/// The id's lookup key: a hash, not the id, so that the index stays small.
pub fn id_hash(id: &str) -> u32 {
    crc32c::crc32c(id.as_bytes()) & 0x7fff_ffff
}

/// Gives a partition no longer written to its indexes by id and by
/// endpoint.
pub fn index_rolled(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(ROLLED_INDEXES)
}

/// The newest partition goes without those indexes (a file written before
/// it went had them), and its rows' id hashes, for `newest`.
pub fn unindexed_ids(conn: &Connection) -> rusqlite::Result<Vec<(u32, i64)>> {
    conn.execute_batch("DROP INDEX IF EXISTS by_id; DROP INDEX IF EXISTS by_endpoint")?;
    let mut stmt = conn.prepare("SELECT idh, seq FROM deliveries ORDER BY seq")?;
    stmt.query_map([], |r| {
        Ok((
            u32::try_from(r.get::<_, i64>(0)?).unwrap_or(u32::MAX),
            r.get(1)?,
        ))
    })?
    .collect()
}

/// A partition's file name: `<first seq>-<start ms>.db`, so that a listing
/// sorts and places them without opening any.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name {
    pub first_seq: i64,
    pub start_ms: u64,
}

impl Name {
    pub fn file(&self) -> String {
        format!("{:020}-{}.db", self.first_seq, self.start_ms)
    }

    pub fn parse(file: &str) -> Option<Name> {
        let stem = file.strip_suffix(".db")?;
        let (seq, ms) = stem.split_once('-')?;
        Some(Name {
            first_seq: seq.parse().ok()?,
            start_ms: ms.parse().ok()?,
        })
    }
}

/// The partitions in `dir`, oldest first.
pub fn list(dir: &Path) -> std::io::Result<Vec<Name>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        if let Some(n) = entry?.file_name().to_str().and_then(Name::parse) {
            names.push(n);
        }
    }
    names.sort();
    Ok(names)
}

/// Its file and SQLite's companions (`-wal`, `-shm`).
pub fn files(path: &Path) -> [PathBuf; 3] {
    let with = |suffix: &str| {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        PathBuf::from(p)
    };
    [path.to_path_buf(), with("-wal"), with("-shm")]
}

/// Bytes on disk of the partition at `path`, its WAL included.
pub fn bytes(path: &Path) -> u64 {
    files(path)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// The writer's connection. synchronous=NORMAL, as journal.db: history is
/// synced with the journal's own syncs (`Recorder::sync`), never per event.
/// The WAL is checkpointed often and kept small, as it counts toward
/// `max_bytes`.
pub fn open_writer(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "wal_autocheckpoint", 64)?;
    conn.pragma_update(None, "journal_size_limit", 256 * 1024)?;
    conn.pragma_update(None, "cache_size", WRITING_CACHE_KIB)?;
    conn.execute_batch(SCHEMA)?;
    let has_endpoint: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('deliveries') WHERE name = 'endpoint')",
        [],
        |r| r.get(0),
    )?;
    if !has_endpoint {
        conn.execute_batch("ALTER TABLE deliveries ADD COLUMN endpoint TEXT")?;
    }
    Ok(conn)
}

/// Page caches, in KiB (negative: SQLite's unit for a size): the newest
/// partition takes every insert (and is read whole for a look-up by
/// endpoint), the others are read or written now and then. Kept small, as
/// a dozen connections each at SQLite's default 2 MiB would show in
/// courier's RSS.
const WRITING_CACHE_KIB: i64 = -1024;
const IDLE_CACHE_KIB: i64 = -128;

/// A partition no longer written to gives its cache back.
pub fn idle(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "cache_size", IDLE_CACHE_KIB)?;
    conn.execute_batch("PRAGMA shrink_memory")
}

/// A read-only connection for the admin API.
pub fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(2))?;
    conn.pragma_update(None, "cache_size", IDLE_CACHE_KIB)?;
    Ok(conn)
}

/// A reader holding a read transaction on the file as it is now: what it
/// reads stays as of this call, whatever is committed after it.
pub fn snapshot(path: &Path) -> rusqlite::Result<Connection> {
    let conn = open_reader(path)?;
    conn.execute_batch("BEGIN")?;
    // A WAL read transaction takes its snapshot at its first read.
    conn.query_row("SELECT COUNT(*) FROM sqlite_schema", [], |_| Ok(()))?;
    Ok(conn)
}

pub fn get(conn: &Connection, seq: i64) -> rusqlite::Result<Option<Record>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM deliveries WHERE seq = ?1"))?
        .query_row([seq], record)
        .optional()
}

/// Inserts `r` unless its seq is there: a log replayed after a crash must
/// not undo what a later commit recorded. Returns whether it was new.
pub fn insert(conn: &Connection, r: &Record) -> rusqlite::Result<bool> {
    let n = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO deliveries (seq, idh, id, destination, accepted_ms, state, prior, attempts, next_due_ms, finished_ms, reason, endpoint)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        )?
        .execute(params![
            r.seq,
            id_hash(&r.id),
            r.id,
            r.destination,
            r.accepted_ms as i64,
            r.state as i64,
            r.prior,
            step::encode_all(r.accepted_ms, &r.attempts),
            r.next_due_ms.map(|t| t as i64),
            r.finished_ms.map(|t| t as i64),
            r.reason.map(step::reason_code),
            r.endpoint,
        ])?;
    Ok(n == 1)
}

/// Writes `r`'s changing parts over its row.
pub fn update(conn: &Connection, r: &Record) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE deliveries SET state = ?2, attempts = ?3, next_due_ms = ?4, finished_ms = ?5, reason = ?6 WHERE seq = ?1",
    )?
    .execute(params![
        r.seq,
        r.state as i64,
        step::encode_all(r.accepted_ms, &r.attempts),
        r.next_due_ms.map(|t| t as i64),
        r.finished_ms.map(|t| t as i64),
        r.reason.map(step::reason_code),
    ])?;
    Ok(())
}

/// Rows still pending, for a retention that drops their partition.
pub fn unfinished(conn: &Connection) -> rusqlite::Result<Vec<Record>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM deliveries WHERE state = 0 ORDER BY seq"
    ))?;
    stmt.query_map([], record)?.collect()
}

/// Rows per destination and state, for the counters.
/// Counted here rather than by `GROUP BY`, which sorted every row into a
/// temporary b-tree: a plain scan costs a fraction of it, and no file.
pub fn counts(conn: &Connection) -> rusqlite::Result<Vec<(String, State, u64)>> {
    let mut stmt = conn.prepare("SELECT destination, state FROM deliveries")?;
    let mut rows = stmt.query([])?;
    let mut by_destination: HashMap<String, [u64; State::ALL.len()]> = HashMap::new();
    while let Some(row) = rows.next()? {
        let destination = row.get_ref(0)?.as_str()?;
        let state = State::from_code(row.get(1)?) as usize;
        match by_destination.get_mut(destination) {
            Some(counts) => counts[state] += 1,
            None => {
                let mut counts = [0; State::ALL.len()];
                counts[state] = 1;
                by_destination.insert(destination.to_string(), counts);
            }
        }
    }
    Ok(by_destination
        .into_iter()
        .flat_map(|(destination, counts)| {
            State::ALL
                .into_iter()
                .filter(move |&s| counts[s as usize] > 0)
                .map(move |s| (destination.clone(), s, counts[s as usize]))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_by_first_seq_and_round_trip() {
        let a = Name {
            first_seq: 9,
            start_ms: 500,
        };
        let b = Name {
            first_seq: 10,
            start_ms: 400,
        };
        assert_eq!(Name::parse(&a.file()), Some(a.clone()));
        assert!(a.file() < b.file(), "file names sort as their seqs");
        assert_eq!(Name::parse("journal.db"), None);
        assert_eq!(Name::parse("x-1.db"), None);
    }

    #[test]
    fn counts_are_by_destination_and_state() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let conn = open_writer(&tmp.path().join("p.db")).expect("open");
        let rows = [
            ("a", State::Pending),
            ("b", State::Delivered),
            ("a", State::Delivered),
            ("a", State::Pending),
            ("b", State::Dropped),
            ("a", State::HandedOff),
        ];
        for (seq, (destination, state)) in rows.into_iter().enumerate() {
            let r = Record {
                seq: seq as i64,
                id: format!("e{seq}"),
                destination: destination.into(),
                accepted_ms: 1,
                state,
                prior: 0,
                attempts: Vec::new(),
                next_due_ms: None,
                finished_ms: None,
                reason: None,
                endpoint: None,
            };
            assert!(insert(&conn, &r).expect("insert"));
        }
        let mut counts = counts(&conn).expect("counts");
        counts.sort_by_key(|(d, s, _)| (d.clone(), *s as i64));
        assert_eq!(
            counts,
            vec![
                ("a".to_string(), State::Pending, 2),
                ("a".to_string(), State::Delivered, 1),
                ("a".to_string(), State::HandedOff, 1),
                ("b".to_string(), State::Delivered, 1),
                ("b".to_string(), State::Dropped, 1),
            ]
        );
    }
}
