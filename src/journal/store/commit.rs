//! The indexer's transactions: a commit of new rows and state changes,
//! with the totals and pins it changes in the same transaction; a spill's
//! copy of events into their rows; the synced log position.

use super::{Pin, QUARANTINED};
use crate::journal::Change;
use crate::journal::intake::{Logged, Place};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use std::collections::{BTreeMap, HashMap};

/// A commit's events read from the log: which to insert as rows (the
/// others were delivered from memory), and which of those wait behind
/// their ordering lane's head (`hold_in_lanes`; none when shorter).
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    pub events: &'a [Logged],
    pub insert: &'a [bool],
    pub waits: &'a [bool],
}

impl Rows<'_> {
    pub const NONE: Rows<'static> = Rows {
        events: &[],
        insert: &[],
        waits: &[],
    };
}

/// One transaction: the rows of `rows` marked to insert, the `changes`,
/// the totals and pins they change, and the log position `end`. Returns
/// what the deletes freed, for the counters, and what the commit added to
/// the pins of each segment (`pins`: as before). Rolled back on an error,
/// as the spill's and the position's transactions are.
pub fn commit(
    conn: &Connection,
    pins: &BTreeMap<u64, Pin>,
    rows: Rows<'_>,
    changes: &[Change],
    end: u64,
    dedupe: bool,
) -> Result<(Freed, BTreeMap<u64, Pin>), rusqlite::Error> {
    let tx = immediate(conn)?;
    let mut tally = Tally::default();
    insert(&tx, rows, &mut tally)?;
    if dedupe {
        seen(&tx, rows.events)?;
    }
    let unconditional = change(&tx, pins, changes, &mut tally)?;
    delete_runs(&tx, pins, unconditional, &mut tally)?;
    super::add_totals(&tx, &tally.totals)?;
    super::add_pins(&tx, &tally.pinned)?;
    super::set_intake_pos(&tx, end)?;
    tx.commit()?;
    Ok((tally.freed, tally.pinned))
}

/// A `BEGIN IMMEDIATE` transaction on the indexer's connection, which it
/// holds alone: rolled back when dropped uncommitted (an error's `?`).
pub(in crate::journal) fn immediate(conn: &Connection) -> Result<Transaction<'_>, rusqlite::Error> {
    Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
}

/// The rows of the events to insert.
fn insert(
    conn: &Connection,
    Rows {
        events,
        insert: insert_mask,
        waits,
    }: Rows<'_>,
    tally: &mut Tally,
) -> Result<(), rusqlite::Error> {
    // The row keeps the event's place in the log, not the event; its
    // id stays, for an operator's query.
    let mut insert = conn.prepare_cached(
        "INSERT INTO events (seq, id, destination, method, path, headers, body, accepted_ms, crc, attempts, next_due_ms, at, len, endpoint, size)
         VALUES (?1, ?8, ?2, ?3, '', x'', x'', ?4, ?5, 0, ?9, ?6, ?7, ?10, ?11)",
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
            super::WAITING
        } else {
            e.accepted_ms as i64
        };
        let bytes = l.body_len + l.encoded_headers.len() + e.path.len() + e.id.len();
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
            due,
            l.endpoint,
            l.packed.then_some(bytes as i64)
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
    Ok(())
}

/// The dedupe keys of the events read, whether inserted or delivered.
fn seen(conn: &Connection, events: &[Logged]) -> Result<(), rusqlite::Error> {
    let mut seen =
        conn.prepare_cached("INSERT OR REPLACE INTO seen (key, seen_ms) VALUES (?1, ?2)")?;
    for Logged { event: e, .. } in events {
        seen.execute(params![
            crate::journal::dedupe::key(&e.destination, &e.id),
            e.accepted_ms as i64
        ])?;
    }
    Ok(())
}

/// Applies `changes` but the unconditional deletes, which it returns.
fn change(
    conn: &Connection,
    pins: &BTreeMap<u64, Pin>,
    changes: &[Change],
    tally: &mut Tally,
) -> Result<Vec<i64>, rusqlite::Error> {
    // Read, then deleted by its key: `DELETE … RETURNING` builds a
    // temporary table per statement, which cost more than the read it
    // saves (benches/RESULTS.md).
    let mut doomed = conn.prepare_cached(&format!(
        "SELECT destination, {}, at, len, endpoint FROM events WHERE seq = ?1 AND attempts = ?2",
        super::ROW_BYTES
    ))?;
    let mut delete = conn.prepare_cached("DELETE FROM events WHERE seq = ?1")?;
    let mut reschedule = conn.prepare_cached(
        "UPDATE events SET attempts = ?2, next_due_ms = ?3, last_outcome = ?4, last_status = ?5, last_attempt_ms = ?6, batch = ?7 WHERE seq = ?1",
    )?;
    let mut quarantine =
        conn.prepare_cached("UPDATE events SET next_due_ms = ?2 WHERE seq = ?1")?;
    let mut wait = conn
        .prepare_cached("UPDATE events SET next_due_ms = ?2 WHERE seq = ?1 AND next_due_ms < ?2")?;
    let mut defer = conn.prepare_cached(
        "UPDATE events SET next_due_ms = ?2 WHERE seq = ?1 AND next_due_ms < ?3 AND fate IS NULL",
    )?;
    let mut unwait = conn
        .prepare_cached("UPDATE events SET next_due_ms = ?2 WHERE seq = ?1 AND next_due_ms = ?3")?;
    // Due at once, out of any batch: after a restart the dispatcher
    // reads it first thing, and hands it to the sink, never the endpoint.
    let mut fated = conn.prepare_cached(
        "UPDATE events SET fate = ?2, fate_ms = ?3, next_due_ms = ?3, attempts = ?4, last_outcome = ?5, last_status = ?6, last_attempt_ms = ?7, batch = NULL WHERE seq = ?1",
    )?;
    let mut endpoint_due = conn.prepare_cached(
        "UPDATE events SET next_due_ms = ?3 WHERE destination = ?1 AND endpoint = ?2
         AND +next_due_ms > ?3 AND +next_due_ms < ?4 AND fate IS NULL",
    )?;
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
                            r.get::<_, Option<String>>(4)?,
                        ))
                    })
                    .optional()?;
                if let Some((destination, bytes, at, len, endpoint)) = gone {
                    delete.execute([seq])?;
                    tally.forget(pins, &destination, endpoint.as_deref(), bytes, (at, len));
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
                wait.execute(params![seq, super::WAITING])?;
            }
            Change::Defer { seq, due_ms } => {
                let due = (*due_ms).min(super::WAITING as u64 - 1) as i64;
                defer.execute(params![seq, due, super::WAITING])?;
            }
            Change::EndpointDue {
                destination,
                origin,
                at_ms,
            } => {
                endpoint_due.execute(params![
                    destination,
                    origin,
                    *at_ms as i64,
                    super::WAITING
                ])?;
            }
            Change::Unwait { seq, at_ms } => {
                unwait.execute(params![seq, *at_ms as i64, super::WAITING])?;
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
    Ok(unconditional)
}

/// Unconditional deletes go after the other changes, in runs: the end
/// state is the same (a reschedule or quarantine of a row that is deleted
/// too leaves nothing behind), and a run of consecutive seqs, a drain's
/// usual commit, is one range read and one range delete instead of two
/// statements a row.
fn delete_runs(
    conn: &Connection,
    pins: &BTreeMap<u64, Pin>,
    mut unconditional: Vec<i64>,
    tally: &mut Tally,
) -> Result<(), rusqlite::Error> {
    unconditional.sort_unstable();
    unconditional.dedup();
    // Every seq of a run is one of its deletes (the run has no gap), so
    // the range read finds exactly the rows to delete.
    let mut doomed_run = conn.prepare_cached(&format!(
        "SELECT destination, {}, at, len, endpoint FROM events WHERE seq BETWEEN ?1 AND ?2",
        super::ROW_BYTES
    ))?;
    let mut delete_run = conn.prepare_cached("DELETE FROM events WHERE seq BETWEEN ?1 AND ?2")?;
    for run in unconditional.chunk_by(|a, b| *b == a + 1) {
        let (first, last) = (run[0], run[run.len() - 1]);
        let mut rows = doomed_run.query(params![first, last])?;
        while let Some(r) = rows.next()? {
            let destination = r.get_ref(0)?.as_str().map_err(rusqlite::Error::from)?;
            let endpoint = r
                .get_ref(4)?
                .as_str_or_null()
                .map_err(rusqlite::Error::from)?;
            tally.forget(
                pins,
                destination,
                endpoint,
                r.get(1)?,
                (r.get(2)?, r.get(3)?),
            );
        }
        delete_run.execute(params![first, last])?;
    }
    Ok(())
}

/// What a commit's deletes removed: per destination, events and bytes;
/// per endpoint of a `url: per_event` destination, bytes.
#[derive(Debug, Default)]
pub struct Freed {
    pub destinations: HashMap<String, (u64, u64)>,
    pub endpoints: HashMap<(String, String), u64>,
}

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
        endpoint: Option<&str>,
        bytes: i64,
        (at, len): (Option<i64>, Option<i64>),
    ) {
        add(&mut self.totals, destination, -1, -bytes);
        if let Some(origin) = endpoint {
            *self
                .freed
                .endpoints
                .entry((destination.to_string(), origin.to_string()))
                .or_default() += bytes.max(0) as u64;
        }
        match self.freed.destinations.get_mut(destination) {
            Some((n, b)) => {
                *n += 1;
                *b += bytes.max(0) as u64;
            }
            None => {
                self.freed
                    .destinations
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

/// Copies `moved` events (read from the segment at `start`) into their
/// rows, which then no longer point into the log; returns the change to
/// the segment's pin. A row whose place changed meanwhile is left alone.
/// An event packed in the log stays packed in its row (`size` says so):
/// unpacked, a paused destination's events spilled from among delivered
/// ones took their whole size again in SQLite (benches/RESULTS.md).
pub fn spill(
    conn: &Connection,
    start: u64,
    moved: &[(Logged, Place)],
) -> Result<BTreeMap<u64, Pin>, rusqlite::Error> {
    let tx = immediate(conn)?;
    let mut update = tx.prepare_cached(
        "UPDATE events SET id = ?2, path = ?3, headers = ?4, body = ?5, crc = ?6, at = NULL, len = NULL, size = ?8
         WHERE seq = ?1 AND at = ?7",
    )?;
    let mut pin = Pin::default();
    let mut part = Vec::new();
    for (l, place) in moved {
        let e = &l.event;
        part.clear();
        // The part after the length word: `[raw len][block]`.
        let packed = l.packed && crate::journal::pack::put_packed(&mut part, &e.body);
        let body = if packed { &part[4..] } else { &e.body[..] };
        // Over the body as it came, not as stored: a build before packed
        // rows then finds the CRC wrong and quarantines the row, where it
        // would otherwise send the packed bytes as the event's body.
        let crc = crate::journal::record::crc(
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
            body,
            crc,
            place.at as i64,
            packed.then_some(l.size() as i64)
        ])?;
        if n == 1 {
            pin.events -= 1;
            pin.bytes -= i64::from(place.len);
        }
    }
    let deltas = BTreeMap::from([(start, pin)]);
    super::add_pins(&tx, &deltas)?;
    drop(update);
    tx.commit()?;
    Ok(deltas)
}

/// A synced commit of the log position alone: everything committed
/// before it survives a power loss.
pub fn sync_position(conn: &Connection, lsn: u64) -> Result<(), rusqlite::Error> {
    super::set_full_sync(conn, true)?;
    let result = immediate(conn).and_then(|tx| {
        super::set_intake_pos(&tx, lsn)?;
        tx.commit()
    });
    super::set_full_sync(conn, false)?;
    result
}
