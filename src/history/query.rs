//! The reading side of history, for the admin API: lookups by id and
//! pages newest first. Each partition is read through its own read-only
//! connection, kept between calls (WAL lets them read beside the writer).

use super::Shared;
use super::partition::{self, COLUMNS, Name, Record};
use super::step::State;
use rusqlite::Connection;
use rusqlite::types::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What a page asks for; `None` is no filter.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub destination: Option<String>,
    pub state: Option<State>,
    /// Accepted at or after (ms since the epoch).
    pub since_ms: Option<u64>,
    /// Accepted before.
    pub until_ms: Option<u64>,
    /// The origin of its endpoint (`url: per_event`).
    pub endpoint: Option<String>,
}

/// How many rounds a page reads while a caller's own test refuses rows.
const ROUNDS: usize = 64;

pub struct Reader {
    shared: Arc<Shared>,
    conns: Mutex<HashMap<Name, Connection>>,
}

impl Reader {
    pub(super) fn new(shared: Arc<Shared>) -> Reader {
        Reader {
            shared,
            conns: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `f` on each partition, newest first.
    fn each<T>(
        &self,
        mut f: impl FnMut(&Name, &Connection) -> rusqlite::Result<Vec<T>>,
    ) -> rusqlite::Result<Vec<T>> {
        let names = self.shared.partitions();
        let mut conns = self
            .conns
            .lock()
            .map_err(|_| rusqlite::Error::InvalidQuery)?;
        conns.retain(|n, _| names.contains(n));
        let mut out = Vec::new();
        for name in names.iter().rev() {
            if !conns.contains_key(name) {
                match partition::open_reader(&self.shared.dir.join(name.file())) {
                    Ok(c) => {
                        conns.insert(name.clone(), c);
                    }
                    // Dropped since the list was read.
                    Err(_) if !self.shared.dir.join(name.file()).exists() => continue,
                    Err(e) => return Err(e),
                }
            }
            if let Some(conn) = conns.get(name) {
                match f(name, conn) {
                    Ok(rows) => out.extend(rows),
                    // Unlinked under the reader: its rows went elsewhere or away.
                    Err(_) if !self.shared.dir.join(name.file()).exists() => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(out)
    }

    /// Every delivery of `id` (one per destination, and one per replay),
    /// oldest first.
    pub fn find(&self, id: &str, destination: Option<&str>) -> rusqlite::Result<Vec<Record>> {
        let hash = partition::id_hash(id);
        let mut rows = self.each(|name, conn| {
            let newest = self.shared.newest_seqs(name, hash);
            let Some(seqs) = newest else {
                let mut stmt = conn.prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM deliveries WHERE idh = ?1 AND id = ?2 AND (?3 IS NULL OR destination = ?3)"
                ))?;
                return stmt
                    .query_map(rusqlite::params![hash, id, destination], partition::record)?
                    .collect();
            };
            let mut rows = Vec::new();
            for seq in seqs {
                if let Some(r) = partition::get(conn, seq)?
                    && r.id == id
                    && destination.is_none_or(|d| r.destination == d)
                {
                    rows.push(r);
                }
            }
            Ok(rows)
        })?;
        dedup(&mut rows);
        rows.reverse();
        Ok(rows)
    }

    /// Up to `limit` records, newest first (by journal seq, which is
    /// accept order), after the cursor `before` (a seq), that `keep`
    /// accepts too; and the cursor of the next page, if there may be one.
    pub fn page(
        &self,
        filter: &Filter,
        before: Option<i64>,
        limit: usize,
        keep: &dyn Fn(&Record) -> bool,
    ) -> rusqlite::Result<(Vec<Record>, Option<i64>)> {
        let mut cursor = before.unwrap_or(i64::MAX);
        let mut kept = Vec::new();
        let fetch = limit.clamp(1, 1000) + 1;
        for _ in 0..ROUNDS {
            let rows = self.below(filter, cursor, fetch)?;
            let more = rows.len() >= fetch;
            for r in rows {
                if kept.len() == limit {
                    let next = kept.last().map(|k: &Record| k.seq);
                    return Ok((kept, next));
                }
                cursor = r.seq;
                if keep(&r) {
                    kept.push(r);
                }
            }
            if !more {
                return Ok((kept, None));
            }
        }
        // Read enough for one call: the caller goes on from here.
        Ok((kept, Some(cursor)))
    }

    /// The `n` newest records below seq `cursor` matching `filter`.
    fn below(&self, filter: &Filter, cursor: i64, n: usize) -> rusqlite::Result<Vec<Record>> {
        let mut sql = format!("SELECT {COLUMNS} FROM deliveries WHERE seq < ?");
        let mut args: Vec<Value> = vec![Value::Integer(cursor)];
        if let Some(d) = &filter.destination {
            sql.push_str(" AND destination = ?");
            args.push(Value::Text(d.clone()));
        }
        if let Some(s) = filter.state {
            sql.push_str(" AND state = ?");
            args.push(Value::Integer(s as i64));
        }
        if let Some(t) = filter.since_ms {
            sql.push_str(" AND accepted_ms >= ?");
            args.push(Value::Integer(t as i64));
        }
        if let Some(t) = filter.until_ms {
            sql.push_str(" AND accepted_ms < ?");
            args.push(Value::Integer(t as i64));
        }
        if let Some(e) = &filter.endpoint {
            sql.push_str(" AND endpoint = ?");
            args.push(Value::Text(e.clone()));
        }
        sql.push_str(" ORDER BY seq DESC LIMIT ?");
        args.push(Value::Integer(n as i64));
        let mut rows = self.each(|_, conn| {
            let mut stmt = conn.prepare_cached(&sql)?;
            stmt.query_map(rusqlite::params_from_iter(args.iter()), partition::record)?
                .collect()
        })?;
        dedup(&mut rows);
        rows.truncate(n);
        Ok(rows)
    }
}

/// Newest seq first, each seq once: a record copied forward is read from
/// the newer partition, which `each` reads first.
fn dedup(rows: &mut Vec<Record>) {
    rows.sort_by_key(|r| std::cmp::Reverse(r.seq));
    rows.dedup_by_key(|r| r.seq);
}
