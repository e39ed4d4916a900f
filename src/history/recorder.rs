//! The writing side of history, owned by the journal's indexer thread: it
//! records what each indexer commit makes durable, rolls partitions, and
//! drops old ones. One writer, so that no lock is taken per event.

use super::Shared;
use super::partition::{self, Name, Record};
use super::step::{self, State, Step};
use crate::clock;
use crate::config::HistorySettings;
use rusqlite::Connection;
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
// tokio's, so that a test with paused time steps the partitions' clock.
use tokio::time::Instant;

/// An event the indexer read from the intake log.
pub struct Accepted<'a> {
    pub seq: i64,
    pub id: &'a str,
    pub destination: &'a str,
    pub accepted_ms: u64,
    /// Attempts made before a hand-off, and the due time it carried.
    pub prior: u32,
    pub next_due_ms: Option<u64>,
    /// Delivered from memory before the indexer got to it: its attempt.
    pub delivered: Option<&'a Step>,
    /// The origin of its endpoint (`url: per_event`).
    pub endpoint: Option<String>,
}

/// Bytes a record takes on disk, indexes and page slack included, before
/// a partition has told its own (benches/RESULTS.md has the measured figure).
const ROW_BYTES: u64 = 150;
/// Records a partition holds at most, whatever `max_bytes` allows: the
/// newest has no index by id or by endpoint (they are built when it
/// rolls, as inserts on random pages of them cost a page written per
/// record), so this bounds the ids it keeps in memory instead, the read
/// of it whole for `?endpoint=` (about 10 ms), and each roll's index
/// build (benches/RESULTS.md, step y).
const MAX_ROWS: u64 = 100_000;

pub struct Recorder {
    shared: Arc<Shared>,
    retain: Duration,
    max_bytes: u64,
    /// Oldest first; the last is written to.
    parts: Vec<(Name, Connection)>,
    /// The highest seq recorded: the next partition starts after it.
    max_seq: i64,
    /// Partitions written since the last sync, by index.
    unsynced: BTreeSet<usize>,
    last_look: Instant,
    /// Records in the newest partition: it is rolled once it holds its
    /// eighth of `max_bytes` by this count, within a commit if need be (a
    /// burst's commit may bring thousands), and never while it is empty.
    rows_in_current: u64,
    /// Records a partition holds at most, from the bytes a record took in
    /// the last one measured.
    rows_per_partition: u64,
}

impl Recorder {
    pub(super) fn open(shared: Arc<Shared>, s: HistorySettings) -> rusqlite::Result<Recorder> {
        let mut parts = Vec::new();
        let mut snapshots = Vec::new();
        let names = partition::list(&shared.dir)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        let newest = names.last().cloned();
        for name in names {
            let path = shared.dir.join(name.file());
            let conn = partition::open_writer(&path)?;
            if Some(&name) == newest.as_ref() {
                let rows = partition::unindexed_ids(&conn)?;
                shared.newest().reset(name.clone(), rows);
            } else {
                // Rolled by a courier that stopped before its indexes were
                // committed.
                partition::index_rolled(&conn)?;
                partition::idle(&conn)?;
            }
            snapshots.push((name.clone(), partition::snapshot(&path)?));
            parts.push((name, conn));
        }
        let rows: i64 = match parts.last() {
            Some((_, conn)) => {
                conn.query_row("SELECT COUNT(*) FROM deliveries", [], |r| r.get(0))?
            }
            None => 0,
        };
        // Over every partition: the newest may be empty (a stop right after
        // a roll), and an accept the log replays must still find its row.
        let mut max_seq = -1;
        for (_, conn) in &parts {
            let max: i64 =
                conn.query_row("SELECT COALESCE(MAX(seq), -1) FROM deliveries", [], |r| {
                    r.get(0)
                })?;
            max_seq = max_seq.max(max);
        }
        let mut r = Recorder {
            shared,
            retain: s.retain,
            max_bytes: s.max_bytes,
            parts,
            max_seq,
            unsynced: BTreeSet::new(),
            last_look: Instant::now(),
            rows_in_current: rows.max(0) as u64,
            rows_per_partition: (s.max_bytes / 8 / ROW_BYTES).clamp(1, MAX_ROWS),
        };
        if r.parts.is_empty() {
            r.start_partition()?;
        }
        r.publish();
        count_in_background(r.shared.clone(), snapshots);
        Ok(r)
    }

    /// A partition holds an eighth of what is kept, by time or by bytes:
    /// dropping the oldest frees about that much.
    fn span(&self) -> Duration {
        self.retain / 8
    }

    /// Records the events read from the log and the steps of a commit.
    /// A step for an event history does not hold (recorded before history
    /// was on) is passed over.
    pub fn record(
        &mut self,
        accepted: &[Accepted<'_>],
        steps: &[(i64, &Step)],
    ) -> rusqlite::Result<()> {
        if accepted.is_empty() && steps.is_empty() {
            return Ok(());
        }
        let mut open: BTreeSet<usize> = BTreeSet::new();
        let mut new_ids = Vec::new();
        let mut deltas = Vec::new();
        let result = self.record_in(accepted, steps, &mut open, &mut new_ids, &mut deltas);
        for &i in &open {
            let conn = &self.parts[i].1;
            if result.is_ok() {
                conn.execute_batch("COMMIT")?;
            } else {
                let _ = conn.execute_batch("ROLLBACK");
            }
        }
        if result.is_ok() {
            self.unsynced.extend(open);
            self.publish_ids(&new_ids);
            // Counted once committed: a failed record (a full disk) is not
            // retried, and its rows are gone.
            for (destination, state, delta) in deltas {
                self.shared.count(&destination, state, delta);
            }
        }
        result
    }

    /// Rows committed to the newest partition, for lookups by id.
    fn publish_ids(&self, rows: &[(u32, i64)]) {
        if let (false, Some((name, _))) = (rows.is_empty(), self.parts.last()) {
            self.shared.newest().extend(name, rows);
        }
    }

    fn record_in<'a>(
        &mut self,
        accepted: &[Accepted<'a>],
        steps: &[(i64, &Step)],
        open: &mut BTreeSet<usize>,
        new_ids: &mut Vec<(u32, i64)>,
        deltas: &mut Vec<(Cow<'a, str>, State, i64)>,
    ) -> rusqlite::Result<()> {
        for a in accepted {
            let mut r = Record {
                seq: a.seq,
                id: a.id.to_string(),
                destination: a.destination.to_string(),
                accepted_ms: a.accepted_ms,
                state: State::Pending,
                prior: a.prior,
                attempts: Vec::new(),
                next_due_ms: a.next_due_ms,
                finished_ms: None,
                reason: None,
                endpoint: a.endpoint.clone(),
            };
            if let Some(s) = a.delivered {
                apply(&mut r, s);
            }
            // Recorded before (the log replayed after a crash, or a commit
            // retried): the record keeps what came after its accept, in
            // whichever partition it is.
            if a.seq <= self.max_seq && self.find(a.seq)?.is_some() {
                continue;
            }
            if self.rows_in_current >= self.rows_per_partition {
                self.roll(open)?;
                // In the rolled partition's index, once committed.
                new_ids.clear();
            }
            let conn = self.begin(self.parts.len() - 1, open)?;
            if partition::insert(conn, &r)? {
                deltas.push((Cow::Borrowed(a.destination), r.state, 1));
                self.rows_in_current += 1;
                new_ids.push((partition::id_hash(&r.id), r.seq));
            }
            self.max_seq = self.max_seq.max(a.seq);
        }
        for &(seq, s) in steps {
            let Some((i, mut r)) = self.find(seq)? else {
                continue;
            };
            let before = r.state;
            apply(&mut r, s);
            partition::update(self.begin(i, open)?, &r)?;
            if before != r.state {
                deltas.push((Cow::Owned(r.destination.clone()), before, -1));
                deltas.push((Cow::Owned(r.destination), r.state, 1));
            }
        }
        Ok(())
    }

    fn begin(&self, i: usize, open: &mut BTreeSet<usize>) -> rusqlite::Result<&Connection> {
        let conn = &self.parts[i].1;
        if open.insert(i) {
            conn.execute_batch("BEGIN IMMEDIATE")?;
        }
        Ok(conn)
    }

    /// The row of `seq`: in the partition its seq falls in, else in a later
    /// one (a record copied forward by retention).
    fn find(&self, seq: i64) -> rusqlite::Result<Option<(usize, Record)>> {
        let home = self
            .parts
            .partition_point(|(n, _)| n.first_seq <= seq)
            .saturating_sub(1);
        for i in home..self.parts.len() {
            if let Some(r) = partition::get(&self.parts[i].1, seq)? {
                return Ok(Some((i, r)));
            }
        }
        Ok(None)
    }

    /// Makes every recorded change durable: called just before the
    /// journal's own sync, so that history is never behind what the
    /// journal made durable. One fdatasync per partition written since.
    pub fn sync(&mut self) -> std::io::Result<()> {
        for i in std::mem::take(&mut self.unsynced) {
            let Some((name, _)) = self.parts.get(i) else {
                continue;
            };
            let [_, wal, _] = partition::files(&self.shared.dir.join(name.file()));
            match std::fs::File::open(&wal) {
                Ok(f) => f.sync_data()?,
                // Checkpointed and truncated away: the main file holds it.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Rolls to a new partition and drops old ones when due; cheap to call
    /// every turn. `in_journal` tells whether an event is still pending,
    /// so that its record is copied forward rather than lost.
    pub fn maintain(&mut self, in_journal: &dyn Fn(i64) -> bool) -> rusqlite::Result<()> {
        let look_every = self
            .span()
            .clamp(Duration::from_millis(50), Duration::from_secs(1));
        if self.last_look.elapsed() < look_every {
            return Ok(());
        }
        self.last_look = Instant::now();
        let now = clock::now_ms();
        let sizes: Vec<u64> = self
            .parts
            .iter()
            .map(|(n, _)| partition::bytes(&self.shared.dir.join(n.file())))
            .collect();
        let (current, current_bytes) = match (self.parts.last(), sizes.last()) {
            (Some((n, _)), Some(b)) => (n.clone(), *b),
            _ => return Ok(()),
        };
        if self.rows_in_current >= 1000 {
            let per_row = (current_bytes / self.rows_in_current).max(1);
            self.rows_per_partition = (self.max_bytes / 8 / per_row).clamp(1, MAX_ROWS);
        }
        let span_ms = self.span().as_millis() as u64;
        if now.saturating_sub(current.start_ms) >= span_ms || current_bytes >= self.max_bytes / 8 {
            self.roll(&mut BTreeSet::new())?;
        }
        let retain_ms = self.retain.as_millis() as u64;
        let mut total: u64 = sizes.iter().sum();
        // Room for the newest partition to grow to its eighth before the
        // next look: `max_bytes` holds between looks, not only at them.
        let cap = self.max_bytes - self.max_bytes / 8;
        // Sizes as measured above: closing a connection folds its WAL in,
        // and a size read after that would count less than was counted.
        let mut sizes = sizes.into_iter();
        while self.parts.len() > 1 {
            // A partition's records were all first recorded before the
            // next one started.
            let ended = self.parts[1].0.start_ms;
            let old = now.saturating_sub(ended) >= retain_ms;
            if !old && total <= cap {
                break;
            }
            // Past `retain`, a record of an event still in the journal is
            // copied forward; past `max_bytes` nothing is: the cap holds
            // even with every record pending (a paused destination's
            // backlog), where copies would only move the bytes.
            let keep: &dyn Fn(i64) -> bool = if total > cap { &|_| false } else { in_journal };
            self.drop_oldest(keep)?;
            total = total.saturating_sub(sizes.next().unwrap_or(0));
        }
        self.publish();
        Ok(())
    }

    /// Starts a new partition, unless the newest holds nothing yet: it goes
    /// on (its start is when the one before it ended, which retention
    /// counts from). `open`: the partitions with a transaction open in this
    /// `record`; the newest one's is committed first, as SQLite cannot fold
    /// a WAL in under an open transaction (the partition kept its WAL until
    /// the next start). What it committed is as a retried commit finds it.
    fn roll(&mut self, open: &mut BTreeSet<usize>) -> rusqlite::Result<()> {
        if self.rows_in_current == 0 {
            return Ok(());
        }
        if let Some(newest) = self.parts.len().checked_sub(1)
            && open.contains(&newest)
        {
            self.parts[newest].1.execute_batch("COMMIT")?;
            open.remove(&newest);
            self.unsynced.insert(newest);
        }
        // Looked up by id and by endpoint through its indexes from now on:
        // built before the readers are told it is no longer the newest.
        // Without them (a full disk) a lookup reads the partition whole,
        // still right, and the next start builds them: history goes on
        // rolling and dropping.
        if let Some((name, conn)) = self.parts.last()
            && let Err(e) = partition::index_rolled(conn)
        {
            tracing::warn!(partition = %name.file(), error = %e, "cannot index a history partition by id and endpoint; lookups read it whole until the next start");
        }
        // Written seldom from now on (a retry's step): its WAL folded in,
        // its cache given back.
        if let Some((_, conn)) = self.parts.last()
            && let Err(e) = conn
                .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
                .and_then(|()| partition::idle(conn))
        {
            tracing::debug!(error = %e, "cannot fold a history partition's WAL in; it is later");
        }
        self.start_partition()
    }

    fn start_partition(&mut self) -> rusqlite::Result<()> {
        // Unique even when two start within a millisecond.
        let after = self.parts.last().map_or(0, |(n, _)| n.start_ms + 1);
        let name = Name {
            first_seq: self.max_seq + 1,
            start_ms: clock::now_ms().max(after),
        };
        let conn = partition::open_writer(&self.shared.dir.join(name.file()))?;
        self.shared.newest().reset(name.clone(), Vec::new());
        self.parts.push((name, conn));
        self.rows_in_current = 0;
        Ok(())
    }

    /// Copies the oldest partition's records of events still pending into
    /// the newest, then unlinks its files.
    fn drop_oldest(&mut self, in_journal: &dyn Fn(i64) -> bool) -> rusqlite::Result<()> {
        let (name, conn) = self.parts.remove(0);
        self.unsynced = self
            .unsynced
            .iter()
            .filter_map(|i| i.checked_sub(1))
            .collect();
        let path = self.shared.dir.join(name.file());
        let keep: Vec<Record> = partition::unfinished(&conn)?
            .into_iter()
            .filter(|r| in_journal(r.seq))
            .collect();
        let counts = partition::counts(&conn)?;
        if !keep.is_empty()
            && let Some((_, current)) = self.parts.last()
        {
            current.execute_batch("BEGIN IMMEDIATE")?;
            let copied = keep
                .iter()
                .try_for_each(|r| partition::insert(current, r).map(|_| ()));
            self.rows_in_current += keep.len() as u64;
            match copied {
                Ok(()) => {
                    current.execute_batch("COMMIT")?;
                    let ids: Vec<(u32, i64)> = keep
                        .iter()
                        .map(|r| (partition::id_hash(&r.id), r.seq))
                        .collect();
                    self.publish_ids(&ids);
                }
                Err(e) => {
                    let _ = current.execute_batch("ROLLBACK");
                    self.parts.insert(0, (name, conn));
                    return Err(e);
                }
            }
            self.unsynced.insert(self.parts.len() - 1);
            // Synced before the partition holding them goes.
            self.sync()
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        }
        for (destination, state, n) in counts {
            self.shared.count(&destination, state, -(n as i64));
        }
        for r in &keep {
            self.shared.count(&r.destination, r.state, 1);
        }
        drop(conn);
        for f in partition::files(&path) {
            if let Err(e) = std::fs::remove_file(&f)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %f.display(), error = %e, "cannot remove an old history partition");
            }
        }
        tracing::debug!(partition = %name.file(), copied = keep.len(), "history partition dropped");
        Ok(())
    }

    /// Tells the readers which partitions there are, and the metrics.
    fn publish(&self) {
        let names: Vec<Name> = self.parts.iter().map(|(n, _)| n.clone()).collect();
        let bytes: u64 = names
            .iter()
            .map(|n| partition::bytes(&self.shared.dir.join(n.file())))
            .sum();
        self.shared.bytes.store(bytes, Ordering::Relaxed);
        if let Ok(mut p) = self.shared.partitions.lock() {
            *p = names;
        }
        crate::metrics::history(self.shared.records(), bytes);
    }
}

/// Counts the records of the partitions a start found, on a thread of its
/// own: reading every row of a large history was most of the time from
/// spawn to ready (benches/RESULTS.md). Each connection holds a read
/// transaction begun before the recorder changed anything, so the count
/// and the recorder's deltas since add up exactly.
fn count_in_background(shared: Arc<Shared>, snapshots: Vec<(Name, Connection)>) {
    // Dropped with the closure whether it runs or the thread cannot start.
    let counted = Counted(shared);
    let spawned = std::thread::Builder::new()
        .name("history-count".into())
        .spawn(move || {
            count(&counted.0, snapshots);
            drop(counted);
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a thread to count history's records; the destinations' counts in /v1/destinations leave out those from before this start");
    }
}

fn count(shared: &Shared, snapshots: Vec<(Name, Connection)>) {
    // Newest first: its snapshot is the one a roll's checkpoint would wait
    // for, and it goes as soon as it is counted.
    for (name, conn) in snapshots.into_iter().rev() {
        match partition::counts(&conn) {
            Ok(counts) => {
                for (destination, state, n) in counts {
                    shared.count(&destination, state, n as i64);
                }
            }
            Err(e) => {
                tracing::warn!(partition = %name.file(), error = %e, "cannot count a history partition's records; the destinations' counts in /v1/destinations are off until the next start");
            }
        }
    }
    crate::metrics::history(shared.records(), shared.bytes.load(Ordering::Relaxed));
}

/// Tells the waiting readers the count is in, however it ends: an answer
/// of `/v1/destinations` must never wait for ever.
struct Counted(Arc<Shared>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.counted.send_replace(true);
    }
}

/// `s` applied to `r`: the journal is the truth, so a later step wins even
/// over a finished state (a delivery whose journal commit a crash lost is
/// attempted again).
fn apply(r: &mut Record, s: &Step) {
    let attempts = std::mem::take(&mut r.attempts);
    match s {
        Step::Attempted {
            attempt,
            next_due_ms,
        } => {
            r.attempts = step::with_attempt(attempts, attempt.clone());
            r.state = State::Pending;
            r.next_due_ms = Some(*next_due_ms);
            r.finished_ms = None;
            r.reason = None;
        }
        Step::Delivered { attempt } => {
            r.attempts = step::with_attempt(attempts, attempt.clone());
            r.state = State::Delivered;
            r.next_due_ms = None;
            r.finished_ms = Some(attempt.at_ms + u64::from(attempt.took_ms));
        }
        Step::DeliveredLate {
            number,
            status,
            at_ms,
        } => {
            r.attempts = attempts;
            let last = r.attempts.last().map(|a| a.number);
            if let Some(a) = r.attempts.iter_mut().find(|a| a.number == *number) {
                a.late = true;
                a.status = Some(*status);
                a.outcome = crate::event::Outcome::Delivered;
                a.took_ms = u32::try_from(at_ms.saturating_sub(a.at_ms)).unwrap_or(u32::MAX);
            }
            // A retry that went out since keeps the event pending.
            if last == Some(*number) {
                r.state = State::Delivered;
                r.next_due_ms = None;
                r.finished_ms = Some(*at_ms);
            }
        }
        Step::DeadLettered {
            reason,
            at_ms,
            attempt,
        }
        | Step::Dropped {
            reason,
            at_ms,
            attempt,
        } => {
            r.attempts = match attempt {
                Some(a) => step::with_attempt(attempts, a.clone()),
                None => attempts,
            };
            r.state = if matches!(s, Step::Dropped { .. }) {
                State::Dropped
            } else {
                State::DeadLettered
            };
            r.reason = Some(*reason);
            r.next_due_ms = None;
            r.finished_ms = Some(*at_ms);
        }
        Step::HandedOff { at_ms } => {
            r.attempts = attempts;
            r.state = State::HandedOff;
            r.next_due_ms = None;
            r.finished_ms = Some(*at_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Outcome, Reason};
    use crate::history::{Attempt, Filter, History};

    fn attempt(number: u32, outcome: Outcome, status: u16) -> Attempt {
        Attempt {
            number,
            at_ms: clock::now_ms(),
            took_ms: 7,
            status: Some(status),
            outcome,
            late: false,
        }
    }

    fn accepted(seq: i64, id: &str) -> Accepted<'_> {
        Accepted {
            seq,
            id,
            destination: "a",
            accepted_ms: clock::now_ms(),
            prior: 0,
            next_due_ms: None,
            delivered: None,
            endpoint: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn old_partitions_go_whole_and_pending_records_are_copied_forward() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let settings = HistorySettings {
            retain: Duration::from_secs(8),
            max_bytes: 1 << 30,
        };
        let (history, mut rec) = History::open(tmp.path(), settings).expect("open");
        let reader = history.reader();
        let failed = Step::Attempted {
            attempt: attempt(1, Outcome::Failed, 500),
            next_due_ms: clock::now_ms() + 3_600_000,
        };
        let delivered = Step::Delivered {
            attempt: attempt(1, Outcome::Delivered, 200),
        };
        let dead = Step::DeadLettered {
            reason: Reason::NonRetriableStatus,
            at_ms: clock::now_ms(),
            attempt: Some(attempt(1, Outcome::BadRequest, 400)),
        };
        let mut first = accepted(1, "one");
        first.delivered = Some(&delivered);
        rec.record(
            &[first, accepted(2, "two"), accepted(3, "three")],
            &[(2, &failed), (3, &dead)],
        )
        .expect("record");
        let in_journal = |seq: i64| seq == 2;
        tokio::time::advance(Duration::from_secs(2)).await;
        rec.maintain(&in_journal).expect("roll");
        let mut fourth = accepted(4, "four");
        fourth.delivered = Some(&delivered);
        rec.record(&[fourth], &[]).expect("record");
        assert_eq!(history.shared.partitions().len(), 2, "rolled after a span");
        assert_eq!(history.counts("a")[State::Delivered as usize], 2);

        tokio::time::advance(Duration::from_secs(9)).await;
        rec.maintain(&in_journal).expect("retain");
        assert!(
            reader.find("one", None).expect("find").is_empty(),
            "past retain"
        );
        assert!(reader.find("three", None).expect("find").is_empty());
        let two = reader.find("two", None).expect("find");
        assert_eq!(two.len(), 1, "still in the journal: copied forward");
        assert_eq!(two[0].attempts[0].status, Some(500));
        assert_eq!(two[0].state, State::Pending);
        assert_eq!(reader.find("four", Some("a")).expect("find").len(), 1);
        assert!(reader.find("four", Some("b")).expect("find").is_empty());
        let c = history.counts("a");
        assert_eq!(
            c[State::Delivered as usize],
            1,
            "one delivered record left: {c:?}"
        );
        assert_eq!(c[State::DeadLettered as usize], 0, "{c:?}");
        assert_eq!(c[State::Pending as usize], 1, "{c:?}");
        let files = partition::list(&history.shared.dir).expect("list");
        assert_eq!(files.len(), 2, "the oldest file is gone: {files:?}");

        // A later step finds the copied record in its new partition.
        let second = Step::Delivered {
            attempt: attempt(2, Outcome::Delivered, 200),
        };
        rec.record(&[], &[(2, &second)]).expect("record");
        let two = reader.find("two", None).expect("find");
        assert_eq!(two[0].state, State::Delivered);
        assert_eq!(two[0].attempts.len(), 2);
    }

    /// A partition every 10 s, by time alone.
    fn rolling_every_10s() -> HistorySettings {
        HistorySettings {
            retain: Duration::from_secs(80),
            max_bytes: 1 << 30,
        }
    }

    fn delivered() -> Step {
        Step::Delivered {
            attempt: attempt(1, Outcome::Delivered, 200),
        }
    }

    fn has_index(dir: &std::path::Path, name: &Name, index: &str) -> bool {
        let conn = Connection::open(dir.join(name.file())).expect("open");
        conn.query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = ?1",
            [index],
            |r| r.get::<_, i64>(0),
        )
        .expect("query")
            == 1
    }

    fn has_id_index(dir: &std::path::Path, name: &Name) -> bool {
        has_index(dir, name, "by_id")
    }

    /// The endpoint index is built at the roll, as the id index: written
    /// with every record, with many endpoints each record dirtied a page of
    /// it. `?endpoint=` reads the newest partition whole meanwhile.
    #[tokio::test(start_paused = true)]
    async fn an_endpoints_events_are_found_in_the_newest_partition_without_its_index_and_after_a_roll()
     {
        let tmp = tempfile::tempdir().expect("tempdir");
        let settings = rolling_every_10s();
        let of = |seq, id, endpoint: &str| Accepted {
            endpoint: Some(endpoint.to_string()),
            ..accepted(seq, id)
        };
        let (a, b) = ("https://a.example:443", "https://b.example:443");
        let (history, mut rec) = History::open(tmp.path(), settings).expect("open");
        rec.record(&[of(1, "a1", a), of(2, "b1", b), accepted(3, "fixed")], &[])
            .expect("record");
        let dir = history.shared.dir.clone();
        let first = history.shared.partitions()[0].clone();
        assert!(
            !has_index(&dir, &first, "by_endpoint"),
            "the newest goes without"
        );
        let reader = history.reader();
        let seqs_of = |reader: &crate::history::Reader, endpoint: &str| -> Vec<i64> {
            let filter = Filter {
                endpoint: Some(endpoint.to_string()),
                ..Filter::default()
            };
            let (rows, _) = reader.page(&filter, None, 10, &|_| true).expect("page");
            rows.iter().map(|r| r.seq).collect()
        };
        assert_eq!(seqs_of(&reader, a), [1], "read off the newest, unindexed");

        tokio::time::advance(Duration::from_secs(11)).await;
        rec.maintain(&|_| true).expect("roll");
        rec.record(&[of(4, "a2", a)], &[]).expect("record");
        assert!(has_index(&dir, &first, "by_endpoint"), "built at the roll");
        assert_eq!(seqs_of(&reader, a), [4, 1], "from both partitions");
        assert_eq!(seqs_of(&reader, b), [2]);
        let newest = history.shared.partitions()[1].clone();
        drop((reader, rec, history));
        // As a build that indexed the newest partition left it.
        Connection::open(dir.join(newest.file()))
            .expect("open")
            .execute_batch(
                "CREATE INDEX by_endpoint ON deliveries(endpoint, seq) WHERE endpoint IS NOT NULL",
            )
            .expect("index by hand");

        let (history, _rec) = History::open(tmp.path(), settings).expect("reopen");
        assert_eq!(history.shared.partitions()[1], newest);
        assert!(
            !has_index(&dir, &newest, "by_endpoint"),
            "the newest goes without it again"
        );
        assert_eq!(seqs_of(&history.reader(), a), [4, 1], "after a restart");
    }

    #[tokio::test(start_paused = true)]
    async fn ids_are_found_in_the_newest_partition_without_its_index_and_after_a_restart() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (settings, delivered) = (rolling_every_10s(), delivered());
        let mut old = accepted(1, "old");
        old.delivered = Some(&delivered);
        let (history, mut rec) = History::open(tmp.path(), settings).expect("open");
        rec.record(&[old, accepted(2, "twice")], &[])
            .expect("record");
        tokio::time::advance(Duration::from_secs(11)).await;
        rec.maintain(&|_| true).expect("roll");
        let mut copy = accepted(3, "twice");
        copy.destination = "b";
        rec.record(&[accepted(4, "new"), copy], &[])
            .expect("record");

        let dir = history.shared.dir.clone();
        let names = history.shared.partitions();
        assert_eq!(names.len(), 2, "rolled after a span");
        assert!(
            has_id_index(&dir, &names[0]),
            "a rolled partition has its index"
        );
        assert!(!has_id_index(&dir, &names[1]), "the newest goes without");
        let reader = history.reader();
        let found = |reader: &crate::history::Reader, id: &str| -> Vec<i64> {
            reader
                .find(id, None)
                .expect("find")
                .iter()
                .map(|r| r.seq)
                .collect()
        };
        assert_eq!(found(&reader, "old"), [1]);
        assert_eq!(found(&reader, "new"), [4], "found in memory");
        assert_eq!(found(&reader, "twice"), [2, 3], "in both partitions");
        assert!(found(&reader, "never").is_empty());
        drop((reader, rec, history));

        let (history, mut rec) = History::open(tmp.path(), settings).expect("reopen");
        let reader = history.reader();
        assert_eq!(found(&reader, "new"), [4], "the newest's ids read again");
        assert_eq!(found(&reader, "twice"), [2, 3]);
        rec.record(&[accepted(5, "later")], &[]).expect("record");
        assert_eq!(found(&reader, "later"), [5]);
        assert!(!has_id_index(&dir, &history.shared.partitions()[1]));
    }

    /// A partition that fills up within one commit rolls inside it: its
    /// rows are committed first, so that its WAL is folded in and its id
    /// index built (under the open transaction the checkpoint failed, and
    /// the partition kept its WAL until the next start).
    #[tokio::test(start_paused = true)]
    async fn a_roll_inside_a_commit_folds_the_full_partitions_wal_in() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (history, mut rec) = History::open(tmp.path(), rolling_every_10s()).expect("open");
        rec.rows_per_partition = 2;
        let ids = ["a1", "a2", "a3", "a4", "a5"];
        let accepts: Vec<Accepted<'_>> =
            (1..).zip(ids).map(|(seq, id)| accepted(seq, id)).collect();
        rec.record(&accepts, &[]).expect("record");
        tokio::time::advance(Duration::from_secs(1)).await;
        rec.maintain(&|_| true).expect("publish");

        let dir = history.shared.dir.clone();
        let names = history.shared.partitions();
        assert_eq!(names.len(), 3, "two rolls in one commit: {names:?}");
        for name in &names[..2] {
            let [_, wal, _] = partition::files(&dir.join(name.file()));
            let left = std::fs::metadata(&wal).map_or(0, |m| m.len());
            assert_eq!(left, 0, "{} keeps {left} bytes of WAL", name.file());
            assert!(has_id_index(&dir, name), "{} has its index", name.file());
        }
        let reader = history.reader();
        for (seq, id) in (1..).zip(ids) {
            let found = reader.find(id, None).expect("find");
            assert_eq!(
                found.iter().map(|r| r.seq).collect::<Vec<_>>(),
                [seq],
                "{id}"
            );
        }
    }

    /// A stop right after a roll leaves the newest partition empty: the
    /// accepts the log replays at the next start find their rows in the
    /// one before, rather than be recorded again as pending.
    #[tokio::test(start_paused = true)]
    async fn a_replayed_accept_after_a_stop_at_a_roll_keeps_its_record() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (settings, delivered) = (rolling_every_10s(), delivered());
        let (history, mut rec) = History::open(tmp.path(), settings).expect("open");
        let mut one = accepted(1, "one");
        one.delivered = Some(&delivered);
        rec.record(&[one], &[]).expect("record");
        tokio::time::advance(Duration::from_secs(11)).await;
        rec.maintain(&|_| true).expect("roll");
        assert_eq!(history.shared.partitions().len(), 2, "rolled");
        drop((rec, history));

        let (history, mut rec) = History::open(tmp.path(), settings).expect("reopen");
        rec.record(&[accepted(1, "one")], &[]).expect("replayed");
        let found = history.reader().find("one", None).expect("find");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].state, State::Delivered, "not pending again");
    }

    /// A start counts what it found in the background while the recorder
    /// goes on: the count is of the files as they were at the open, the
    /// recorder's changes since come on top, in whichever order they land.
    #[tokio::test(start_paused = true)]
    async fn a_reopened_history_counts_exactly_while_the_recorder_goes_on() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let settings = HistorySettings {
            retain: Duration::from_secs(8_000),
            max_bytes: 1 << 30,
        };
        let delivered = delivered();
        for round in 0..20 {
            let (history, mut rec) = History::open(tmp.path(), settings).expect("open");
            let (one, two) = (format!("one{round}"), format!("two{round}"));
            let base = 10 * round;
            rec.record(&[accepted(base, &one), accepted(base + 1, &two)], &[])
                .expect("record");
            rec.record(&[], &[(base, &delivered)]).expect("deliver");
            history.counted().await;
            let c = history.counts("a");
            let n = round as u64;
            assert_eq!(c[State::Delivered as usize], n + 1, "round {round}: {c:?}");
            assert_eq!(c[State::Pending as usize], n + 1, "round {round}: {c:?}");
            // A partition for each of the first rounds, all within `retain`.
            if round < 6 {
                tokio::time::advance(Duration::from_secs(1_001)).await;
                rec.maintain(&|_| true).expect("roll");
            }
        }
        let dir = tmp.path().join(super::super::DIR);
        assert_eq!(partition::list(&dir).expect("list").len(), 7);
    }

    /// A record that fails (a full disk) is rolled back whole and not
    /// retried: the counts keep none of it.
    #[tokio::test(start_paused = true)]
    async fn a_failed_record_changes_no_count() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (settings, delivered) = (rolling_every_10s(), delivered());
        let (history, mut rec) = History::open(tmp.path(), settings).expect("open");
        rec.record(&[accepted(1, "one")], &[]).expect("record");
        tokio::time::advance(Duration::from_secs(11)).await;
        rec.maintain(&|_| true).expect("roll");
        rec.record(&[accepted(2, "two")], &[]).expect("record");
        history.counted().await;
        let before = history.counts("a");
        // The older partition refuses writes: the step on 1 fails after 3
        // was inserted in the newest.
        rec.parts[0]
            .1
            .pragma_update(None, "query_only", true)
            .expect("query_only");
        let failed = rec.record(&[accepted(3, "three")], &[(1, &delivered)]);
        assert!(failed.is_err(), "the step on a read-only partition fails");
        assert_eq!(history.counts("a"), before, "nothing of it counted");
        assert!(
            history
                .reader()
                .find("three", None)
                .expect("find")
                .is_empty(),
            "rolled back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn past_max_bytes_the_oldest_partitions_go_and_a_replayed_accept_keeps_its_record() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let settings = HistorySettings {
            retain: Duration::from_secs(86_400),
            max_bytes: 1024 * 1024,
        };
        let (history, mut rec) = History::open(tmp.path(), settings).expect("open");
        let delivered = Step::Delivered {
            attempt: attempt(1, Outcome::Delivered, 200),
        };
        let ids: Vec<String> = (0..40_000).map(|i| format!("evt-{i:08}")).collect();
        let mut peak = 0;
        for (chunk, n) in ids.chunks(1000).zip(0..) {
            let batch: Vec<Accepted<'_>> = chunk
                .iter()
                .enumerate()
                .map(|(i, id)| {
                    let mut a = accepted(n * 1000 + i as i64, id);
                    a.delivered = Some(&delivered);
                    a
                })
                .collect();
            rec.record(&batch, &[]).expect("record");
            // Between clean-ups too: what is on disk right before one.
            let on_disk: u64 = std::fs::read_dir(tmp.path())
                .expect("dir")
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum();
            peak = peak.max(on_disk);
            tokio::time::advance(Duration::from_secs(2)).await;
            rec.maintain(&|_| false).expect("maintain");
        }
        assert!(
            peak <= 1024 * 1024,
            "{peak} bytes on disk before a clean-up"
        );
        let (records, bytes) = history.size();
        assert!(bytes <= 1024 * 1024, "{bytes} bytes kept");
        assert!(records < 40_000, "the oldest went: {records} left");
        let reader = history.reader();
        assert!(reader.find("evt-00000000", None).expect("find").is_empty());
        assert_eq!(reader.find("evt-00039999", None).expect("find").len(), 1);

        // The log replayed after a crash brings an accept again: the
        // record keeps what was recorded after it.
        rec.record(&[accepted(39_999, "evt-00039999")], &[])
            .expect("record");
        let r = reader.find("evt-00039999", None).expect("find");
        assert_eq!(r[0].state, State::Delivered);
    }

    #[tokio::test(start_paused = true)]
    async fn max_bytes_holds_even_when_every_record_is_pending() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let settings = HistorySettings {
            retain: Duration::from_secs(86_400),
            max_bytes: 1024 * 1024,
        };
        let (history, mut rec) = History::open(tmp.path(), settings).expect("open");
        let ids: Vec<String> = (0..30_000).map(|i| format!("held-{i:08}")).collect();
        for (chunk, n) in ids.chunks(5000).zip(0..) {
            let batch: Vec<Accepted<'_>> = chunk
                .iter()
                .enumerate()
                .map(|(i, id)| accepted(n * 5000 + i as i64, id))
                .collect();
            rec.record(&batch, &[]).expect("record");
            tokio::time::advance(Duration::from_secs(2)).await;
            // Every event still in the journal: no copy past max_bytes.
            rec.maintain(&|_| true).expect("maintain");
        }
        let (records, bytes) = history.size();
        assert!(bytes <= 1024 * 1024, "{bytes} bytes kept");
        assert!(records > 1000 && records < 30_000, "{records} records");
        let c = history.counts("a");
        assert_eq!(c[State::Pending as usize], records);
    }
}
