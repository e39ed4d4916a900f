//! The SQLite file: schema, opening with the right pragmas, the integrity
//! check at start, and the read queries the dispatchers and `inspect` use.

use super::fetch::{Fetch, Log};
use super::intake::Place;
use super::record::decode_headers;
use crate::event::Reason;
use crate::event::{Fate, NewEvent, Outcome, StoredEvent};
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, params};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

pub mod commit;

pub const FILE: &str = "journal.db";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL,
    destination TEXT NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    headers BLOB NOT NULL,
    body BLOB NOT NULL,
    accepted_ms INTEGER NOT NULL,
    crc INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_due_ms INTEGER NOT NULL,
    last_outcome TEXT,
    last_status INTEGER,
    last_attempt_ms INTEGER,
    batch TEXT
);
CREATE INDEX IF NOT EXISTS events_due ON events(destination, next_due_ms);
CREATE INDEX IF NOT EXISTS events_age ON events(destination, accepted_ms);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS seen (key TEXT PRIMARY KEY, seen_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS seen_age ON seen(seen_ms);
";

/// What a start needs of every pending event, its count and bytes per
/// destination, kept by the indexer in the transaction that changes the
/// rows (`add_totals`): summing every row's lengths at start read the
/// whole file, a good part of the time to ready with a big backlog
/// (benches/RESULTS.md). Not triggers: one per deleted row slowed a drain's
/// deletes.
const TOTALS: &str = "
CREATE TABLE totals (destination TEXT PRIMARY KEY, pending INTEGER NOT NULL, bytes INTEGER NOT NULL);
INSERT INTO totals (destination, pending, bytes)
    SELECT destination, COUNT(*), SUM(length(body) + length(headers) + length(CAST(path AS BLOB)) + length(CAST(id AS BLOB)))
    FROM events GROUP BY destination;
";

/// A row's bytes as `totals` counts them (`NewEvent::size`). A row that
/// points into the log (`at`) holds the event's id, destination and
/// method, not its path, headers and body; its encoding there (`len`) is
/// `NewEvent::size` plus the destination and method, plus 40 bytes of
/// lengths, seq and accept time, unless its body is packed (`pack`), in
/// the log or in the row (a spill keeps it packed): then the row keeps the
/// size (`size`).
pub const ROW_BYTES: &str = "CASE WHEN size IS NOT NULL THEN size
    WHEN at IS NULL
    THEN length(body) + length(headers) + length(CAST(path AS BLOB)) + length(CAST(id AS BLOB))
    ELSE len - 40 - length(CAST(destination AS BLOB)) - length(CAST(method AS BLOB)) END";

/// The size of an event whose body is packed, in the log or in its row
/// (then `body` holds the packed part, `pack`), which the stored lengths
/// no longer tell; NULL for the others, and in rows of journals from
/// before packed bodies, which get the column.
const SIZES: &str = "ALTER TABLE events ADD COLUMN size INTEGER;";

/// The same, for a journal from before rows pointed into the log.
const INLINE_BYTES: &str =
    "length(body) + length(headers) + length(CAST(path AS BLOB)) + length(CAST(id AS BLOB))";

/// The origin an event of a `url: per_event` destination names, set at
/// insert: what the endpoints' list counts pending events and their age
/// by, without reading each event's headers from the log. Rows of
/// journals from before it, and of fixed destinations, hold NULL.
const ENDPOINTS: &str = "ALTER TABLE events ADD COLUMN endpoint TEXT;";
/// Partial: only those rows, and covering what the list asks of them.
const ENDPOINTS_INDEX: &str = "CREATE INDEX IF NOT EXISTS events_endpoint
    ON events(destination, endpoint, accepted_ms) WHERE endpoint IS NOT NULL;";

/// Rows written before rows pointed into the log lack `at` and `len`:
/// they are added in place (NULL: those rows hold their event). `pins`
/// counts, per log segment, the rows that point into it, kept in the same
/// transaction as the rows.
const PLACES: &str = "
ALTER TABLE events ADD COLUMN at INTEGER;
ALTER TABLE events ADD COLUMN len INTEGER;
";
/// An event's fate (`Change::DeadLetter`): its `deadLetterReason` and
/// dead-letter time; the rest of what its record says goes in the columns
/// an attempt sets. Journals from before it get both columns, NULL.
const FATES: &str = "
ALTER TABLE events ADD COLUMN fate TEXT;
ALTER TABLE events ADD COLUMN fate_ms INTEGER;
";

/// No index on `at`: rows point into the log in seq order, so the rows of
/// one segment are a range of seqs (`placed_in`). The index cost every
/// insert, on the indexer's path per accepted event (benches/RESULTS.md),
/// for a spill that looks once a second; journals that have it lose it here.
const PINS: &str = "
DROP INDEX IF EXISTS events_at;
CREATE TABLE IF NOT EXISTS pins (segment INTEGER PRIMARY KEY, events INTEGER NOT NULL, bytes INTEGER NOT NULL);
";

/// Where the intake log goes on after what the rows hold: recorded in the
/// same transaction as the rows, so replay after a crash resumes exactly.
const INTAKE_POS: &str = "intake_pos";

/// A corrupt row is parked here: never due, kept for an operator.
pub const QUARANTINED: i64 = i64::MAX;
/// An event behind its ordering lane's head (`lanes`): never due until
/// the head leaves, which makes it due. Below `QUARANTINED`: it is
/// pending, so TTL expiry, the oldest age and a hand-off count it.
pub const WAITING: i64 = i64::MAX - 1;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error("record seq {seq}: {what}")]
    Corrupt { seq: i64, what: String },
}

/// Opens (creating if needed) the indexer's connection. Commits are
/// synchronous=NORMAL: the intake log holds what they do not yet make
/// durable, and the indexer syncs (`set_full_sync`) when it must.
pub fn open_writer(path: &Path) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open(path)?;
    stable_plans(&conn)?;
    conn.set_prepared_statement_cache_capacity(STATEMENTS);
    // Takes effect for a new file only (an older journal would need a
    // VACUUM): lets a full disk get back the pages of delivered events.
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // Checkpoints run on their own thread: inside the writer they stall
    // every commit behind them while they copy the WAL.
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)?;
    conn.execute_batch(SCHEMA)?;
    add_batch_column(&conn)?;
    create_totals(&conn)?;
    if !has_column(&conn, "at")? {
        // Both columns or neither: a crash between them would leave a
        // journal that this check passes and every query then fails on.
        let tx = conn.unchecked_transaction()?;
        tx.execute_batch(PLACES)?;
        tx.commit()?;
    }
    conn.execute_batch(PINS)?;
    if !has_column(&conn, "fate")? {
        let tx = conn.unchecked_transaction()?;
        tx.execute_batch(FATES)?;
        tx.commit()?;
    }
    if !has_column(&conn, "endpoint")? {
        conn.execute_batch(ENDPOINTS)?;
    }
    if !has_column(&conn, "size")? {
        conn.execute_batch(SIZES)?;
    }
    conn.execute_batch(ENDPOINTS_INDEX)?;
    Ok(conn)
}

fn has_column(conn: &Connection, name: &str) -> Result<bool, rusqlite::Error> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('events') WHERE name = ?1)",
        [name],
        |r| r.get(0),
    )
}

/// The rows pointing into one log segment: how many, and their events'
/// bytes there (`place.len`), about what a spill would copy into them (a
/// packed event stays packed in its row).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pin {
    pub events: i64,
    pub bytes: i64,
}

/// Every segment rows point into, by start.
pub fn load_pins(conn: &Connection) -> Result<BTreeMap<u64, Pin>, rusqlite::Error> {
    let mut stmt = conn.prepare("SELECT segment, events, bytes FROM pins WHERE events > 0")?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?.max(0) as u64,
            Pin {
                events: r.get(1)?,
                bytes: r.get(2)?,
            },
        ))
    })?;
    rows.collect()
}

/// Adds one commit's changes to `pins`; segments at zero leave it.
pub fn add_pins(conn: &Connection, deltas: &BTreeMap<u64, Pin>) -> Result<(), rusqlite::Error> {
    if deltas.is_empty() {
        return Ok(());
    }
    let mut stmt = conn.prepare_cached(
        "INSERT INTO pins (segment, events, bytes) VALUES (?1, ?2, ?3)
         ON CONFLICT (segment) DO UPDATE SET events = events + excluded.events, bytes = bytes + excluded.bytes",
    )?;
    for (segment, pin) in deltas {
        stmt.execute(params![*segment as i64, pin.events, pin.bytes])?;
    }
    conn.prepare_cached("DELETE FROM pins WHERE events <= 0")?
        .execute([])?;
    Ok(())
}

/// The seqs and places of the rows pointing into `[from, to)` of the log,
/// which are among `seqs` (the segment's, from its records).
pub fn placed_in(
    conn: &Connection,
    from: u64,
    to: u64,
    seqs: std::ops::Range<i64>,
) -> Result<Vec<(i64, Place)>, rusqlite::Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq, at, len, crc FROM events
         WHERE seq >= ?1 AND seq < ?2 AND at >= ?3 AND at < ?4 ORDER BY seq",
    )?;
    let rows = stmt.query_map(params![seqs.start, seqs.end, from as i64, to as i64], |r| {
        Ok((
            r.get(0)?,
            Place {
                at: r.get::<_, i64>(1)?.max(0) as u64,
                len: r.get::<_, i64>(2)?.clamp(0, u32::MAX as i64) as u32,
                crc: r.get::<_, i64>(3)? as u32,
            },
        ))
    })?;
    rows.collect()
}

fn has_table(conn: &Connection, name: &str) -> Result<bool, rusqlite::Error> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        [name],
        |r| r.get(0),
    )
}

/// Adds what one commit inserted and deleted, per destination (events,
/// bytes; negative for deletes).
pub fn add_totals(
    conn: &Connection,
    deltas: &std::collections::HashMap<String, (i64, i64)>,
) -> Result<(), rusqlite::Error> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO totals (destination, pending, bytes) VALUES (?1, ?2, ?3)
         ON CONFLICT (destination) DO UPDATE SET pending = pending + excluded.pending, bytes = bytes + excluded.bytes",
    )?;
    for (destination, (events, bytes)) in deltas {
        if (*events, *bytes) != (0, 0) {
            stmt.execute(params![destination, events, bytes])?;
        }
    }
    Ok(())
}

/// Journals written before `totals` get it, filled from their rows in the
/// same transaction that adds the triggers.
fn create_totals(conn: &Connection) -> Result<(), rusqlite::Error> {
    if has_table(conn, "totals")? {
        return Ok(());
    }
    let tx = conn.unchecked_transaction()?;
    tx.execute_batch(TOTALS)?;
    tx.commit()
}

/// Journals written before batching lack the `batch` column: it is added
/// in place (NULL for every row: none of them was batched).
fn add_batch_column(conn: &Connection) -> Result<(), rusqlite::Error> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('events')")?;
    let names: Vec<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if !names.iter().any(|n| n == "batch") {
        conn.execute_batch("ALTER TABLE events ADD COLUMN batch TEXT")?;
    }
    // Partial: only batched rows, which retries look up by batch id.
    conn.execute_batch(
        "CREATE INDEX IF NOT EXISTS events_batch ON events(batch) WHERE batch IS NOT NULL",
    )
}

/// With FULL, the next COMMIT fsyncs the WAL, making it and every commit
/// before it durable.
/// Whether the event `seq` is still pending (a row).
pub fn holds(conn: &Connection, seq: i64) -> Result<bool, rusqlite::Error> {
    conn.prepare_cached("SELECT 1 FROM events WHERE seq = ?1")?
        .query_row([seq], |_| Ok(()))
        .optional()
        .map(|r| r.is_some())
}

pub fn set_full_sync(conn: &Connection, full: bool) -> Result<(), rusqlite::Error> {
    conn.pragma_update(None, "synchronous", if full { "FULL" } else { "NORMAL" })
}

pub fn intake_pos(conn: &Connection) -> Result<u64, rusqlite::Error> {
    // A journal from before the intake log (read-only in `inspect`) has no
    // meta table: nothing of it lives in a log.
    if !has_table(conn, "meta")? {
        return Ok(0);
    }
    let v: Option<i64> = conn
        .query_row("SELECT value FROM meta WHERE key = ?1", [INTAKE_POS], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(v.map_or(0, |v| v.max(0) as u64))
}

pub fn set_intake_pos(conn: &Connection, lsn: u64) -> Result<(), rusqlite::Error> {
    conn.prepare_cached("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)")?
        .execute(params![INTAKE_POS, lsn as i64])?;
    Ok(())
}

/// The seq the next event gets: above every seq ever used, even when the
/// table is empty (a late answer must never delete a newer event).
pub fn next_seq(conn: &Connection) -> Result<i64, rusqlite::Error> {
    let v: Option<i64> = conn
        .query_row(
            "SELECT seq FROM sqlite_sequence WHERE name = 'events'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    Ok(v.unwrap_or(0) + 1)
}

/// Dedupe keys seen at or after `since_ms`, oldest first.
pub fn load_seen(conn: &Connection, since_ms: u64) -> Result<Vec<(String, u64)>, rusqlite::Error> {
    let mut stmt =
        conn.prepare("SELECT key, seen_ms FROM seen WHERE seen_ms >= ?1 ORDER BY seen_ms")?;
    let rows = stmt.query_map([since_ms as i64], |r| {
        Ok((r.get(0)?, r.get::<_, i64>(1)?.max(0) as u64))
    })?;
    rows.collect()
}

pub fn expire_seen(conn: &Connection, before_ms: u64) -> Result<(), rusqlite::Error> {
    conn.prepare_cached("DELETE FROM seen WHERE seen_ms < ?1")?
        .execute([before_ms as i64])?;
    Ok(())
}

pub fn open_reader(path: &Path) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.pragma_update(None, "query_only", 1)?;
    stable_plans(&conn)?;
    conn.set_prepared_statement_cache_capacity(STATEMENTS);
    Ok(conn)
}

/// Prepared statements a connection keeps, above the 33 places that
/// prepare one: rusqlite keeps 16, fewer than the indexer uses in one
/// commit once its rows are inserted and deleted rather than delivered
/// before it sees them (`url: per_event`, step m), and each statement
/// pushed out was prepared again at its next use (0.7 µs an event there,
/// benches/RESULTS.md).
const STATEMENTS: usize = 64;

/// SQLite (as built with STAT4) marks a statement whose `LIMIT ?` or range
/// parameter could change its plan, and prepares it again each time that
/// parameter is bound: every `due` read of a drain did (benches/RESULTS.md).
/// The plans here never depend on bound values (no ANALYZE is run), so
/// the query planner stability guarantee costs nothing and keeps them.
fn stable_plans(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

/// SQLite's own structural check; `None` when the file is sound.
pub fn integrity_problem(conn: &Connection) -> Result<Option<String>, rusqlite::Error> {
    let mut stmt = conn.prepare("PRAGMA quick_check")?;
    let lines: Vec<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(if lines.len() == 1 && lines[0] == "ok" {
        None
    } else {
        Some(lines.join("; "))
    })
}

/// `batch`, `at`, `len`, `fate`, `fate_ms` and `size` come last: `journal inspect`
/// may open a journal from before them (read-only, so not migrated) and
/// reads NULL instead.
const COLUMNS: &str = "seq, id, destination, method, path, headers, body, accepted_ms, crc, attempts, next_due_ms, last_outcome, last_status, last_attempt_ms";

fn load_columns(conn: &Connection) -> Result<String, rusqlite::Error> {
    let batch = if has_column(conn, "batch")? {
        "batch"
    } else {
        "NULL"
    };
    let place = if has_column(conn, "at")? {
        "at, len"
    } else {
        "NULL, NULL"
    };
    let fate = if has_column(conn, "fate")? {
        "fate, fate_ms"
    } else {
        "NULL, NULL"
    };
    let size = if has_column(conn, "size")? {
        "size"
    } else {
        "NULL"
    };
    Ok(format!("{COLUMNS}, {batch}, {place}, {fate}, {size}"))
}

/// The columns of a row the writer's connection has brought up to date.
const LOAD_COLUMNS: &str = "seq, id, destination, method, path, headers, body, accepted_ms, crc, attempts, next_due_ms, last_outcome, last_status, last_attempt_ms, batch, at, len, fate, fate_ms, size";

/// Why rows could not be read at all. A failed read of the intake log is
/// kept apart from SQLite's errors: it fails the read rather than condemn
/// the row, and a passing shortage is tried again while anything else
/// fails the journal (`reader`).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error("cannot read the intake log: {0}")]
    Log(std::io::Error),
    #[error("the journal's read connection is unusable (a read panicked)")]
    Unusable,
}

fn row(r: &Row, fetch: &mut Fetch) -> Result<Result<StoredEvent, StoreError>, LoadError> {
    let seq: i64 = r.get(0)?;
    let stored_crc: i64 = r.get(8)?;
    let place = match (r.get::<_, Option<i64>>(15)?, r.get::<_, Option<i64>>(16)?) {
        (Some(at), Some(len)) => Some(Place {
            at: at.max(0) as u64,
            len: len.clamp(0, u32::MAX as i64) as u32,
            crc: stored_crc as u32,
        }),
        _ => None,
    };
    let event = match place {
        // The row's accept time rules (TTLs are computed from it).
        Some(place) => match fetch.event(place, seq).map_err(LoadError::Log)? {
            Some(logged) => NewEvent {
                accepted_ms: r.get::<_, Option<i64>>(7)?.map_or(0, |v| v.max(0) as u64),
                ..logged.event
            },
            None => {
                return Ok(Err(StoreError::Corrupt {
                    seq,
                    what: format!(
                        "its event at position {} of the intake log is missing or damaged",
                        place.at
                    ),
                }));
            }
        },
        None => match inline_event(r, seq, stored_crc)? {
            Ok(e) => e,
            Err(e) => return Ok(Err(e)),
        },
    };
    let ms = |i: usize| -> Result<Option<u64>, LoadError> {
        Ok(r.get::<_, Option<i64>>(i)?.map(|v| v.max(0) as u64))
    };
    let attempts = r.get::<_, i64>(9)?.clamp(0, u32::MAX as i64) as u32;
    // Informational: a name this build does not know (a row from a later
    // build) costs the event nothing.
    let last_outcome = r.get::<_, Option<String>>(11)?.map(|name| {
        Outcome::parse(&name).unwrap_or_else(|| {
            tracing::warn!(seq, outcome = %name, "a journal row names a delivery outcome this build does not know: read as Failed");
            Outcome::Failed
        })
    });
    let last_status = r
        .get::<_, Option<i64>>(12)?
        .and_then(|s| u16::try_from(s).ok());
    let last_attempt_ms = ms(13)?;
    let fate = match (r.get::<_, Option<String>>(17)?, ms(18)?) {
        (Some(reason), Some(at_ms)) => {
            let Some(reason) = Reason::parse(&reason) else {
                return Ok(Err(StoreError::Corrupt {
                    seq,
                    what: format!("unknown dead-letter reason {reason:?}"),
                }));
            };
            Some(Fate {
                reason,
                attempts,
                last_outcome: last_outcome.unwrap_or(Outcome::Failed),
                last_status,
                last_attempt_ms,
                at_ms,
            })
        }
        _ => None,
    };
    Ok(Ok(StoredEvent {
        seq,
        event,
        attempts,
        next_due_ms: ms(10)?.unwrap_or(0),
        last_outcome,
        last_status,
        last_attempt_ms,
        batch: r.get(14)?,
        fate,
    }))
}

/// The event a row holds itself (written before rows pointed into the
/// log, or copied in by a spill), checked against its CRC. The CRC is over
/// the body as it came: a packed one (`size` set) is unpacked first, which
/// `pack::unpack` bounds whatever the bytes say.
fn inline_event(
    r: &Row,
    seq: i64,
    stored_crc: i64,
) -> Result<Result<NewEvent, StoreError>, rusqlite::Error> {
    let headers_blob: Vec<u8> = r.get(5)?;
    let stored: Vec<u8> = r.get(6)?;
    let (id, destination, method, path): (String, String, String, String) =
        (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?);
    let corrupt = |what: &str| {
        Ok(Err(StoreError::Corrupt {
            seq,
            what: what.into(),
        }))
    };
    let body = match r.get::<_, Option<i64>>(19)? {
        None => stored,
        Some(_) => match super::pack::unpack(&stored) {
            Some(body) => body,
            None => return corrupt("its packed body does not unpack"),
        },
    };
    let crc = super::record::crc(&id, &destination, &method, &path, &headers_blob, &body);
    if i64::from(crc) != stored_crc {
        return corrupt("checksum mismatch");
    }
    let headers = match decode_headers(&headers_blob) {
        Ok(h) => h,
        Err(e) => return corrupt(&e.to_string()),
    };
    Ok(Ok(NewEvent {
        id,
        destination,
        method,
        path,
        headers,
        body: body.into(),
        accepted_ms: r.get::<_, Option<i64>>(7)?.map_or(0, |v| v.max(0) as u64),
    }))
}

/// Up to `limit` due events of `destination` not in `held`, by due time,
/// stopping once they hold `max_bytes` (at least one is read), and whether
/// more may be due: one statement for the scan and the rows (a scan for
/// seqs, then a lookup per seq, ran a statement per event).
pub fn due(
    conn: &Connection,
    log: Log<'_>,
    destination: &str,
    now_ms: u64,
    limit: usize,
    max_bytes: u64,
    held: &HashSet<i64>,
) -> Result<(Vec<Result<StoredEvent, StoreError>>, bool), LoadError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {LOAD_COLUMNS} FROM events WHERE destination = ?1 AND next_due_ms <= ?2 ORDER BY next_due_ms, seq LIMIT ?3"
    ))?;
    let scan = limit.saturating_add(held.len());
    let mut rows = stmt.query(params![destination, now_ms as i64, scan as i64])?;
    let mut fetch = Fetch::new(log);
    let mut out = Vec::with_capacity(limit.min(scan));
    let mut bytes = 0;
    while out.len() < limit
        && (out.is_empty() || bytes < max_bytes)
        && let Some(r) = rows.next()?
    {
        if !held.contains(&r.get::<_, i64>(0)?) {
            let loaded = row(r, &mut fetch)?;
            bytes += loaded.as_ref().map_or(0, |ev| ev.event.size());
            out.push(loaded);
        }
    }
    let more = out.len() >= limit || bytes >= max_bytes;
    Ok((out, more))
}

/// `destination`'s pending events in seq order, quarantined and fated
/// rows aside (those never go to the endpoint again), each passed to
/// `each` as read, with whether its row waits (`WAITING`): what its
/// ordering lanes are built from. The event is read only when
/// `with_events` (a key found in it); a row whose event cannot be read is
/// passed over, to be quarantined when a dispatcher reads it.
pub fn in_seq_order(
    conn: &Connection,
    log: Log<'_>,
    destination: &str,
    with_events: bool,
    mut each: impl FnMut(i64, bool, Option<&NewEvent>),
) -> Result<(), LoadError> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {LOAD_COLUMNS} FROM events WHERE destination = ?1 AND next_due_ms < ?2 AND fate IS NULL ORDER BY seq"
    ))?;
    let mut rows = stmt.query(params![destination, QUARANTINED])?;
    let mut fetch = Fetch::new(log);
    while let Some(r) = rows.next()? {
        let seq: i64 = r.get(0)?;
        let waiting = r.get::<_, i64>(10)? == WAITING;
        if !with_events {
            each(seq, waiting, None);
        } else if let Ok(ev) = row(r, &mut fetch)? {
            each(seq, waiting, Some(&ev.event));
        }
    }
    Ok(())
}

/// `destination`'s rows that wait for an ordering lane's turn, in seq
/// order: without a key, all there is to set right at a start, read
/// through `events_due` rather than by a scan of every pending row (a
/// million-event backlog took a second to be ready for it).
pub fn waiting(conn: &Connection, destination: &str) -> Result<Vec<i64>, rusqlite::Error> {
    let mut stmt = conn.prepare(
        "SELECT seq FROM events WHERE destination = ?1 AND next_due_ms = ?2 AND fate IS NULL ORDER BY seq",
    )?;
    stmt.query_map(params![destination, WAITING], |r| r.get(0))?
        .collect()
}

/// Sets each row of `turns` (seq, whether it is to wait) to wait for its
/// ordering lane's turn, or due at `now_ms`, in one transaction.
pub fn set_turns(
    conn: &Connection,
    turns: &[(i64, bool)],
    now_ms: u64,
) -> Result<(), rusqlite::Error> {
    let tx = commit::immediate(conn)?;
    let mut set = tx.prepare_cached("UPDATE events SET next_due_ms = ?2 WHERE seq = ?1")?;
    for (seq, wait) in turns {
        set.execute(params![seq, if *wait { WAITING } else { now_ms as i64 }])?;
    }
    drop(set);
    tx.commit()
}

/// Copies WAL frames into the main file without waiting for readers.
pub fn checkpoint(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)")
}

/// Folds the WAL into the main file and truncates it.
pub fn fold_wal(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
}

/// Gives free pages and the WAL back to the volume (a full disk).
pub fn give_back(conn: &Connection) -> Result<(), rusqlite::Error> {
    let vacuumed = conn.execute_batch("PRAGMA incremental_vacuum");
    let folded = fold_wal(conn);
    vacuumed.and(folded)
}

/// Seqs of the due events of one stored batch, in the batch's order.
pub fn batch_seqs(
    conn: &Connection,
    destination: &str,
    batch: &str,
    now_ms: u64,
) -> Result<Vec<i64>, rusqlite::Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq FROM events WHERE batch = ?1 AND destination = ?2 AND next_due_ms <= ?3 ORDER BY seq",
    )?;
    let rows = stmt.query_map(params![batch, destination, now_ms as i64], |r| r.get(0))?;
    rows.collect()
}

/// The rows of `seqs` still present, their events read from the log in
/// `dir` where they point into it. A row that fails its checksum comes
/// back as `Err` so the caller can quarantine it.
pub fn load(
    conn: &Connection,
    log: Log<'_>,
    seqs: &[i64],
) -> Result<Vec<Result<StoredEvent, StoreError>>, LoadError> {
    let mut stmt =
        conn.prepare_cached(&format!("SELECT {LOAD_COLUMNS} FROM events WHERE seq = ?1"))?;
    let mut fetch = Fetch::new(log);
    let mut out = Vec::with_capacity(seqs.len());
    for seq in seqs {
        if let Some(r) = stmt.query([seq])?.next()? {
            out.push(row(r, &mut fetch)?);
        }
    }
    Ok(out)
}

/// Seqs of every destination's pending events after `after`, in order,
/// quarantined rows aside, up to `limit` of them and no more once they
/// hold `max_bytes` (but always one): what a hand-off takes (docs/object-storage.md).
pub fn pending_after(
    conn: &Connection,
    after: i64,
    limit: usize,
    max_bytes: u64,
) -> Result<Vec<i64>, rusqlite::Error> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT seq, {ROW_BYTES} FROM events WHERE seq > ?1 AND next_due_ms < ?2 ORDER BY seq LIMIT ?3"
    ))?;
    let mut rows = stmt.query(params![after, QUARANTINED, limit as i64])?;
    let (mut seqs, mut bytes) = (Vec::new(), 0u64);
    while let Some(r) = rows.next()? {
        let size = r.get::<_, i64>(1)?.max(0) as u64;
        if !seqs.is_empty() && bytes + size > max_bytes {
            break;
        }
        bytes += size;
        seqs.push(r.get(0)?);
    }
    Ok(seqs)
}

/// Seqs of `destination`'s events accepted at or before `cutoff_ms`
/// (expired, when the cutoff is now minus the TTL), quarantined rows aside.
pub fn accepted_before(
    conn: &Connection,
    destination: &str,
    cutoff_ms: u64,
    limit: usize,
) -> Result<Vec<i64>, rusqlite::Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq FROM events WHERE destination = ?1 AND accepted_ms <= ?2 AND next_due_ms < ?3 ORDER BY accepted_ms LIMIT ?4",
    )?;
    let rows = stmt.query_map(
        params![destination, cutoff_ms as i64, QUARANTINED, limit as i64],
        |r| r.get(0),
    )?;
    rows.collect()
}

/// The oldest pending accept time of a destination. The `+` keeps
/// `next_due_ms` out of the index choice: offered `events_due`, SQLite
/// took it and sorted all the destination's rows to find the first (a
/// whole backlog, for each `/v1/destinations` call and each dispatcher's
/// expiry pass), where `events_age` gives the first row at once
/// (quarantined rows, the only ones the filter drops, are few).
const OLDEST_ACCEPTED: &str = "SELECT accepted_ms FROM events WHERE destination = ?1 AND +next_due_ms < ?2 ORDER BY accepted_ms LIMIT 1";

/// The oldest accept time of `destination`'s pending events.
pub fn oldest_accepted(
    conn: &Connection,
    destination: &str,
) -> Result<Option<u64>, rusqlite::Error> {
    let mut stmt = conn.prepare_cached(OLDEST_ACCEPTED)?;
    let v: Option<i64> = stmt
        .query_row(params![destination, QUARANTINED], |r| r.get(0))
        .optional()?;
    Ok(v.map(|v| v as u64))
}

/// One endpoint's pending rows: how many, and the oldest accept time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointRows {
    pub origin: String,
    pub pending: u64,
    pub oldest_accepted_ms: u64,
}

/// The endpoints of `destination` with rows, `after` (an origin, or ""
/// for the first) in order, up to `limit`: from `events_endpoint` alone.
pub fn endpoint_rows(
    conn: &Connection,
    destination: &str,
    after: &str,
    limit: usize,
) -> Result<Vec<EndpointRows>, rusqlite::Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT endpoint, COUNT(*), MIN(accepted_ms) FROM events
         WHERE destination = ?1 AND endpoint > ?2 GROUP BY endpoint ORDER BY endpoint LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![destination, after, limit as i64], |r| {
        Ok(EndpointRows {
            origin: r.get(0)?,
            pending: r.get::<_, i64>(1)?.max(0) as u64,
            oldest_accepted_ms: r.get::<_, i64>(2)?.max(0) as u64,
        })
    })?;
    rows.collect()
}

/// Per destination and endpoint, the bytes of its rows (as `totals`
/// counts them): each endpoint's share taken at a start. Reads only the
/// rows of `url: per_event` destinations.
pub fn endpoint_bytes(conn: &Connection) -> Result<Vec<(String, String, u64)>, rusqlite::Error> {
    let mut stmt = conn.prepare(&format!(
        "SELECT destination, endpoint, SUM({ROW_BYTES}) FROM events
         WHERE endpoint IS NOT NULL GROUP BY destination, endpoint"
    ))?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)?.max(0) as u64))
    })?;
    rows.collect()
}

/// One endpoint's rows, `None` when it has none.
pub fn endpoint_row(
    conn: &Connection,
    destination: &str,
    origin: &str,
) -> Result<Option<EndpointRows>, rusqlite::Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT COUNT(*), MIN(accepted_ms) FROM events WHERE destination = ?1 AND endpoint = ?2",
    )?;
    let (n, oldest): (i64, Option<i64>) =
        stmt.query_row(params![destination, origin], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(oldest.map(|t| EndpointRows {
        origin: origin.to_string(),
        pending: n.max(0) as u64,
        oldest_accepted_ms: t.max(0) as u64,
    }))
}

/// The earliest due time after `now_ms`, for the dispatcher's timer.
pub fn next_due_after(
    conn: &Connection,
    destination: &str,
    now_ms: u64,
) -> Result<Option<u64>, rusqlite::Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT next_due_ms FROM events WHERE destination = ?1 AND next_due_ms > ?2 AND next_due_ms < ?3 ORDER BY next_due_ms LIMIT 1",
    )?;
    let v: Option<i64> = stmt
        .query_row(params![destination, now_ms as i64, WAITING], |r| r.get(0))
        .optional()?;
    Ok(v.map(|v| v as u64))
}

/// Per destination: pending count, bytes, oldest accept time, quarantined rows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DestinationSummary {
    pub destination: String,
    pub pending: u64,
    pub bytes: u64,
    pub oldest_accepted_ms: Option<u64>,
    pub quarantined: u64,
}

/// Read from `totals`, plus two index lookups per destination; a journal
/// from before `totals` (read-only in `inspect`) is scanned instead.
pub fn summary(conn: &Connection) -> Result<Vec<DestinationSummary>, rusqlite::Error> {
    let sql = if has_table(conn, "totals")? {
        "SELECT t.destination, t.pending, t.bytes,
                (SELECT MIN(accepted_ms) FROM events e WHERE e.destination = t.destination),
                (SELECT COUNT(*) FROM events e WHERE e.destination = t.destination AND e.next_due_ms = ?1)
         FROM totals t WHERE t.pending > 0 ORDER BY t.destination"
            .to_string()
    } else {
        let bytes = if has_column(conn, "at")? {
            ROW_BYTES
        } else {
            INLINE_BYTES
        };
        format!(
            "SELECT destination, COUNT(*), SUM({bytes}), MIN(accepted_ms),
                SUM(next_due_ms = ?1) FROM events GROUP BY destination ORDER BY destination"
        )
    };
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map([QUARANTINED], |r| {
        Ok(DestinationSummary {
            destination: r.get(0)?,
            pending: r.get::<_, i64>(1)?.max(0) as u64,
            bytes: r.get::<_, Option<i64>>(2)?.unwrap_or(0).max(0) as u64,
            oldest_accepted_ms: r.get::<_, Option<i64>>(3)?.map(|v| v as u64),
            quarantined: r.get::<_, Option<i64>>(4)?.unwrap_or(0) as u64,
        })
    })?;
    rows.collect()
}

/// Every row that fails its checksum or header decoding, or whose event
/// is not in the log in `dir` (for `journal inspect`).
pub fn corrupt_rows(conn: &Connection, log: Log<'_>) -> Result<Vec<StoreError>, LoadError> {
    let mut stmt = conn.prepare(&format!("SELECT {} FROM events", load_columns(conn)?))?;
    let mut fetch = Fetch::new(log);
    let mut rows = stmt.query([])?;
    let mut bad = Vec::new();
    while let Some(r) = rows.next()? {
        if let Err(e) = row(r, &mut fetch)? {
            bad.push(e);
        }
    }
    Ok(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn insert(conn: &Connection, destination: &str, body: &[u8], accepted_ms: i64) {
        conn.execute(
            "INSERT INTO events (id, destination, method, path, headers, body, accepted_ms, crc, next_due_ms)
             VALUES (?1, ?2, 'POST', '/x', x'0102', ?3, ?4, 0, ?4)",
            params![format!("id-{accepted_ms}"), destination, body, accepted_ms],
        )
        .expect("insert");
    }

    /// What the scan of every row says, to hold `totals` against.
    fn scanned(conn: &Connection) -> Vec<DestinationSummary> {
        conn.execute_batch("DROP TABLE totals")
            .expect("drop totals");
        summary(conn).expect("scan")
    }

    #[test]
    fn a_journal_from_before_totals_gets_them_from_its_rows() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join(FILE);
        {
            let conn = Connection::open(&path).expect("open");
            conn.execute_batch(SCHEMA).expect("old schema");
            add_batch_column(&conn).expect("batch column");
            insert(&conn, "a", &[1; 50], 7);
            insert(&conn, "a", &[1; 60], 3);
            insert(&conn, "b", &[1; 9], 5);
            conn.execute(
                "UPDATE events SET next_due_ms = ?1 WHERE destination = 'b'",
                [QUARANTINED],
            )
            .expect("quarantine");
            assert!(!has_table(&conn, "totals").expect("look"));
        }
        let conn = open_writer(&path).expect("reopen");
        let kept = summary(&conn).expect("summary");
        // id "id-N" (4 bytes) + path 2 + headers 2 + body.
        assert_eq!(
            kept[0],
            DestinationSummary {
                destination: "a".into(),
                pending: 2,
                bytes: (4 + 2 + 2 + 50) + (4 + 2 + 2 + 60),
                oldest_accepted_ms: Some(3),
                quarantined: 0,
            }
        );
        assert_eq!((kept[1].pending, kept[1].quarantined), (1, 1));
        assert_eq!(kept, scanned(&conn));
    }

    #[test]
    fn totals_add_up_and_a_destination_at_zero_is_not_reported() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let conn = open_writer(&tmp.path().join(FILE)).expect("open");
        let step = |pairs: &[(&str, i64, i64)]| {
            let deltas: HashMap<String, (i64, i64)> = pairs
                .iter()
                .map(|(d, n, b)| ((*d).to_string(), (*n, *b)))
                .collect();
            add_totals(&conn, &deltas).expect("add");
        };
        step(&[("a", 3, 300), ("b", 1, 10)]);
        step(&[("a", -1, -100), ("b", -1, -10)]);
        let kept = summary(&conn).expect("summary");
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!((kept[0].pending, kept[0].bytes), (2, 200));
    }

    #[test]
    fn a_statement_with_a_bound_limit_is_not_prepared_again_for_each_limit() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join(FILE);
        let reprepares = |conn: &Connection| {
            for (d, ms) in [("a", 1), ("a", 2), ("a", 3)] {
                insert(conn, d, b"x", ms);
            }
            let sql = "SELECT seq FROM events WHERE destination = ?1 AND next_due_ms <= ?2 ORDER BY next_due_ms, seq LIMIT ?3";
            let mut stmt = conn.prepare_cached(sql).expect("prepare");
            for limit in [1, 2, 3] {
                let n = stmt
                    .query_map(params!["a", 10, limit], |r| r.get::<_, i64>(0))
                    .expect("query")
                    .count();
                assert_eq!(n, limit as usize);
            }
            let n = stmt.get_status(rusqlite::StatementStatus::RePrepare);
            conn.execute_batch("DELETE FROM events").expect("empty");
            n
        };
        let plain = open_writer(&path).expect("open");
        plain
            .set_db_config(
                rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
                false,
            )
            .expect("config");
        // Without it, each new limit prepares the statement again.
        assert!(reprepares(&plain) > 0);
        drop(plain);
        assert_eq!(reprepares(&open_writer(&path).expect("open")), 0);
        assert_eq!(reprepares(&open_reader_rw_for_test(&path)), 0);
    }

    #[test]
    fn the_oldest_accept_time_comes_from_the_age_index_without_sorting_the_backlog() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let conn = open_writer(&tmp.path().join(FILE)).expect("open");
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {OLDEST_ACCEPTED}"))
            .expect("explain");
        let plan: Vec<String> = stmt
            .query_map(params!["a", QUARANTINED], |r| r.get(3))
            .expect("plan")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert!(
            plan.iter().any(|step| step.contains("events_age"))
                && !plan.iter().any(|step| step.contains("TEMP B-TREE")),
            "{plan:?}"
        );
        for ms in [5, 2, 9] {
            insert(&conn, "a", b"x", ms);
        }
        insert(&conn, "b", b"x", 1);
        conn.execute(
            "UPDATE events SET next_due_ms = ?1 WHERE accepted_ms = 2",
            [QUARANTINED],
        )
        .expect("quarantine");
        assert_eq!(oldest_accepted(&conn, "a").expect("read"), Some(5));
        assert_eq!(oldest_accepted(&conn, "c").expect("read"), None);
    }

    /// `open_reader` is query-only; the test inserts through it first.
    fn open_reader_rw_for_test(path: &Path) -> Connection {
        let conn = open_reader(path).expect("open");
        conn.pragma_update(None, "query_only", 0).expect("writable");
        conn
    }
}
