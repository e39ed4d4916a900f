//! The journal across its two stages: what the intake log alone holds
//! comes back at open, and what a damaged log would lose stops the start.

use super::indexer::{SPILL_EVERY, seqs_in};
use super::intake::{self, LogReader, LogWriter};
use super::*;
use bytes::Bytes;
use std::os::unix::fs::FileExt;

pub(super) fn event(i: u64) -> NewEvent {
    NewEvent {
        id: format!("id-{i}"),
        destination: "orders".into(),
        method: "POST".into(),
        path: format!("/p/{i}"),
        headers: vec![("x-n".into(), i.to_string().into_bytes())],
        body: Bytes::from(format!("{{\"n\":{i}}}")),
        accepted_ms: 1_000 + i,
    }
}

/// `len` bytes that LZ4 cannot shrink, different for each `seed`: a
/// test of how events fill segments holds its sizes whether or not the
/// writer packs them (`pack`: a journal without a dispatcher packs all).
pub(super) fn noise(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes groups straight into the intake log of a new journal, as the
/// writer does before the indexer has seen them (a crash right after the
/// 202s), marking each as acknowledged. Returns where each group's record
/// ends in the log.
pub(super) fn log_only(dir: &Path, groups: &[std::ops::Range<i64>]) -> Vec<u64> {
    drop(store::open_writer(&dir.join(FILE)).expect("create journal.db"));
    let mut w = LogWriter::open(dir, 0, 1, &BTreeSet::new()).expect("open log");
    let mut ends = Vec::new();
    for g in groups {
        let mut payload = Vec::new();
        for seq in g.clone() {
            intake::encode(&mut payload, seq, &event(seq as u64), false);
        }
        let end = w
            .append(&payload, g.clone().count() as u32, false)
            .expect("append");
        w.sync().expect("sync");
        w.acknowledge(intake::Mark {
            end,
            next_seq: g.end,
        })
        .expect("mark");
        ends.push(end);
    }
    ends
}

fn only_segment(dir: &Path) -> PathBuf {
    let segments = intake::segments(dir).expect("list");
    assert_eq!(segments.len(), 1, "{segments:?}");
    segments[0].2.clone()
}

fn open_refused(dir: &Path) -> OpenError {
    match open(dir) {
        Err(e) => e,
        Ok(_) => panic!("a start that would lose acknowledged events must be refused"),
    }
}

/// Three groups of 2, 3 and 3 events, one record each; the tail is then
/// damaged in each way a disk or an operator can.
#[tokio::test]
async fn a_lost_tail_of_acknowledged_events_stops_the_start_with_its_count() {
    /// The segment, and where the second record ends (the third's start).
    type Damage = fn(&Path, u64);
    let cases: [(&str, Damage, i64); 4] = [
        (
            "truncated to the last record",
            |seg, second_end| {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(seg)
                    .expect("open");
                f.set_len(second_end).expect("truncate");
            },
            3,
        ),
        (
            "truncated to zero",
            |seg, _| {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(seg)
                    .expect("open");
                f.set_len(0).expect("truncate");
            },
            8,
        ),
        (
            "deleted",
            |seg, _| std::fs::remove_file(seg).expect("remove"),
            8,
        ),
        (
            "a flipped byte in the last record",
            |seg, second_end| {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(seg)
                    .expect("open");
                f.write_all_at(b"\xff", second_end + 40).expect("flip");
            },
            3,
        ),
    ];
    for (how, damage, lost) in cases {
        let tmp = tempfile::tempdir().expect("tempdir");
        let ends = log_only(tmp.path(), &[1..3, 3..6, 6..9]);
        let seg = only_segment(tmp.path());
        damage(&seg, ends[1]);
        for attempt in ["first", "second"] {
            match open_refused(tmp.path()) {
                OpenError::TailLost { events, file, .. } => {
                    assert_eq!(events, lost, "{how}, {attempt} start");
                    assert_eq!(file, seg, "{how}: the file named");
                }
                other => panic!("{how}: {other}"),
            }
        }
        let report = inspect_closed(tmp.path()).await;
        let said = report.corrupt.join("\n");
        assert!(
            said.contains(&format!("{lost} acknowledged events are missing")),
            "{how}: inspect says {said:?}"
        );
        // The operator gives them up explicitly: the rest starts.
        std::fs::remove_file(tmp.path().join(intake::MARK)).expect("remove the mark");
        let (journal, summary) = reopen(tmp.path()).await;
        assert_eq!(
            summary.iter().map(|s| s.pending).sum::<u64>(),
            8 - lost as u64,
            "{how}"
        );
        journal.close().await;
    }
}

#[tokio::test]
async fn with_sync_os_a_lost_tail_is_reported_and_the_start_goes_on() {
    let tmp = tempfile::tempdir().expect("tempdir");
    log_only(tmp.path(), &[1..3, 3..6]);
    std::fs::remove_file(only_segment(tmp.path())).expect("remove");
    let (journal, summary) =
        Journal::open(tmp.path(), false, 1 << 30, None, &["orders".into()], None)
            .expect("sync: os starts");
    assert_eq!(summary.len(), 0);
    // Seqs go on after the lost ones: none is handed out twice.
    journal.append(vec![event(9)]).await.expect("append");
    journal.close().await;
    drop(journal);
    let conn = Connection::open(tmp.path().join(FILE)).expect("open db");
    let seq: i64 = conn
        .query_row("SELECT seq FROM events", [], |r| r.get(0))
        .expect("one row");
    assert_eq!(seq, 6);
}

/// Rows point into the log's segments: a segment lost under them is
/// damage, reported as such, and its events are never delivered as
/// something else; the start goes on with the rest.
#[tokio::test]
async fn a_lost_segment_that_rows_point_into_is_reported_as_damage() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    journal
        .append((1..=4).map(event).collect())
        .await
        .expect("append");
    journal.close().await;
    drop(journal);
    for (_, _, seg) in intake::segments(tmp.path()).expect("list") {
        std::fs::remove_file(seg).expect("remove");
    }
    let report = inspect_closed(tmp.path()).await;
    assert_eq!(report.corrupt.len(), 4, "{:?}", report.corrupt);
    assert!(
        report.corrupt[0].contains("of the intake log is missing or damaged"),
        "{:?}",
        report.corrupt
    );
    let (journal, summary) = reopen(tmp.path()).await;
    assert_eq!(summary[0].pending, 4);
    let due = all_due(&journal).await;
    assert!(due.is_empty(), "no damaged row reaches delivery: {due:?}");
    journal.close().await;
    drop(journal);
    // Each was quarantined where it was read: kept, never due again.
    assert_eq!(quarantined(tmp.path()), vec![1, 2, 3, 4]);
}

/// The seqs of the quarantined rows.
fn quarantined(dir: &Path) -> Vec<i64> {
    parked_at(dir, store::QUARANTINED)
}

/// The seqs of the rows whose next due time is `due` (a parking value).
fn parked_at(dir: &Path, due: i64) -> Vec<i64> {
    let conn = Connection::open(dir.join(FILE)).expect("open db");
    let mut stmt = conn
        .prepare("SELECT seq FROM events WHERE next_due_ms = ?1 ORDER BY seq")
        .expect("prepare");
    stmt.query_map([due], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

/// A refill is bounded in bytes as well as in events: a window of large
/// events holds a few of them, and always at least one.
#[tokio::test]
async fn due_events_stop_at_the_byte_bound_but_one_is_always_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    journal
        .append((1..=6).map(event).collect())
        .await
        .expect("append");
    journal.close().await;
    drop(journal);
    let (journal, _) = reopen(tmp.path()).await;
    let reader = journal.reader().expect("reader");
    let size = event(1).size();
    let none = HashSet::new();
    let due = |max_bytes| reader.due("orders", u64::MAX / 2, 100, max_bytes, &none);
    let (rows, more) = due(size * 5 / 2).await.expect("due");
    assert_eq!(
        rows.len(),
        3,
        "the third passes the bound and ends the read"
    );
    assert!(more, "more are due than were read");
    let (rows, more) = due(1).await.expect("due");
    assert_eq!(rows.len(), 1);
    assert!(more);
    let (rows, more) = due(u64::MAX).await.expect("due");
    assert_eq!(rows.len(), 6);
    assert!(!more);
    journal.close().await;
}

/// A segment the writer has left, with fewer than half of its bytes still
/// waiting, has those events copied into their rows and goes back to the
/// volume; one mostly waiting stays as it is. The copied events read back
/// whole, after a restart too.
#[tokio::test]
async fn a_mostly_delivered_segment_is_spilled_and_recycled() {
    // 1..=15 fill the first segment, the rest go on.
    let (tmp, journal, conn) = with_big_rows(20).await;
    let placed = |conn: &Connection, seq: i64| -> bool {
        conn.query_row(
            "SELECT at IS NOT NULL FROM events WHERE seq = ?1",
            [seq],
            |r| r.get(0),
        )
        .expect("row")
    };
    let (first, size, _) = intake::segments(tmp.path()).expect("list")[0].clone();
    // A spill finds the segment's rows by their seqs (no index on `at`).
    assert_eq!(
        seqs_in(&super::disk::real(), tmp.path(), first, size),
        1..16
    );
    // 12 of the first segment's 15 MiB still wait: it stays.
    journal
        .apply(&(1..=3).map(delete).collect::<Vec<_>>())
        .await
        .expect("apply");
    tokio::time::sleep(SPILL_EVERY + Duration::from_millis(500)).await;
    assert!(placed(&conn, 15), "a mostly waiting segment was spilled");
    // One of 15 waits: it is copied into its row, and the segment goes.
    journal
        .apply(&(4..=14).map(delete).collect::<Vec<_>>())
        .await
        .expect("apply");
    until("the waiting event is copied into its row", || {
        !placed(&conn, 15)
    })
    .await;
    assert!(
        placed(&conn, 16),
        "an event of the current segment was copied"
    );
    // Freed, the segment becomes a spare, which the next rotation reuses
    // under a new name: then it is gone under its own.
    let mut appended = 0;
    for i in 21..=60 {
        journal.append(vec![big(i)]).await.expect("append");
        appended += 1;
        if intake::segments(tmp.path())
            .expect("list")
            .iter()
            .all(|s| s.0 != first)
        {
            break;
        }
    }
    assert!(
        intake::segments(tmp.path())
            .expect("list")
            .iter()
            .all(|s| s.0 != first),
        "the spilled segment was never recycled"
    );
    let read = |journal: Journal| async move {
        let due = journal
            .reader()
            .expect("reader")
            .due("orders", u64::MAX / 2, 10, u64::MAX, &HashSet::new())
            .await
            .expect("due")
            .0;
        let got: Vec<(i64, NewEvent)> = due.into_iter().take(6).map(|s| (s.seq, s.event)).collect();
        assert_eq!(
            got,
            (15..=20).map(|s| (s, big(s as u64))).collect::<Vec<_>>()
        );
        journal.close().await;
    };
    read(journal).await;
    drop(conn);
    let (journal, summary) = reopen(tmp.path()).await;
    assert_eq!(summary[0].pending, 6 + appended);
    read(journal).await;
}

/// A segment whose events are still going out is left to free itself,
/// even once most of it is delivered: copying its rest into rows would
/// write those events twice while a drain sends them anyway.
#[tokio::test]
async fn a_segment_still_draining_is_not_spilled() {
    let (_tmp, journal, conn) = with_big_rows(20).await;
    let placed = |seq: i64| -> bool {
        conn.query_row(
            "SELECT at IS NOT NULL FROM events WHERE seq = ?1",
            [seq],
            |r| r.get(0),
        )
        .expect("row")
    };
    // 7 of the first segment's 15 still wait (less than half), then one
    // fewer at each step, for longer than a look takes to come round.
    journal
        .apply(&(1..=8).map(delete).collect::<Vec<_>>())
        .await
        .expect("apply");
    for seq in 9..=14 {
        tokio::time::sleep(SPILL_EVERY / 5).await;
        journal.apply(&[delete(seq)]).await.expect("apply");
        assert!(placed(15), "a segment still draining was spilled");
    }
    tokio::time::sleep(SPILL_EVERY / 5).await;
    assert!(placed(15), "a segment still draining was spilled");
    // Once nothing more of it goes out, its last event is copied.
    until("the settled segment is spilled", || !placed(15)).await;
    journal.close().await;
}

/// The index on `at` of journals from before spills found rows by seq
/// goes at open: it only made every insert dearer.
#[tokio::test]
async fn an_older_journal_loses_its_index_on_at() {
    let (tmp, journal, conn) = with_big_rows(2).await;
    journal.close().await;
    drop(journal);
    conn.execute_batch("CREATE INDEX events_at ON events(at) WHERE at IS NOT NULL")
        .expect("the older index");
    drop(conn);
    let (journal, _) = reopen(tmp.path()).await;
    let conn = Connection::open(tmp.path().join(FILE)).expect("open db");
    let left: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = 'events_at'",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(left, 0);
    journal.close().await;
}

#[tokio::test]
async fn a_deleted_journal_db_beside_its_intake_log_is_named_not_taken_for_damage() {
    let tmp = tempfile::tempdir().expect("tempdir");
    log_only(tmp.path(), &[1..2, 2..3]);
    std::fs::remove_file(tmp.path().join(FILE)).expect("remove journal.db");
    let err = open_refused(tmp.path());
    assert!(matches!(err, OpenError::DbMissing(_)), "{err}");
    let said = err.to_string();
    assert!(said.contains("journal.db was deleted or moved"), "{said}");
    assert!(
        !tmp.path().join(FILE).exists(),
        "a refused start creates nothing"
    );
}

#[tokio::test]
async fn an_unreadable_event_holds_its_segment_but_not_the_spill_of_later_ones() {
    // Segments of 1..=15 and 16..=30, then the current one.
    let (tmp, journal, conn) = with_big_rows(33).await;
    let at = |seq: i64| -> Option<i64> {
        conn.query_row("SELECT at FROM events WHERE seq = ?1", [seq], |r| r.get(0))
            .expect("row")
    };
    // Event 15's bytes in the first segment are damaged.
    let segments = intake::segments(tmp.path()).expect("list");
    let (start, _, path) = &segments[0];
    let offset = at(15).expect("placed") as u64 - start + 100;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open segment")
        .write_all_at(b"damage", offset)
        .expect("damage");
    // Both retired segments now hold one waiting event each.
    journal
        .apply(&(1..=14).chain(16..=29).map(delete).collect::<Vec<_>>())
        .await
        .expect("apply");
    for _ in 0..5 {
        if at(30).is_none() {
            break;
        }
        tokio::time::sleep(SPILL_EVERY).await;
    }
    assert_eq!(
        at(30),
        None,
        "the second segment's waiting event was never copied out"
    );
    assert!(at(15).is_some(), "an unreadable event was copied");
    journal.close().await;
}

/// A 1 MiB event: 15 of them, one record each, fill a 16 MiB segment.
fn big(i: u64) -> NewEvent {
    NewEvent {
        body: noise(1024 * 1024, i),
        ..event(i)
    }
}

/// Every event of "orders" due now, oldest first (at most 100).
async fn all_due(journal: &Journal) -> Vec<StoredEvent> {
    journal
        .reader()
        .expect("reader")
        .due("orders", u64::MAX / 2, 100, u64::MAX, &HashSet::new())
        .await
        .expect("due")
        .0
}

/// An unconditional delete, as a delivery's.
pub(super) fn delete(seq: i64) -> Change {
    Change::Delete {
        seq,
        only_if_attempts: None,
        step: None,
    }
}

/// A journal that took `big` events 1..=n, one record each, once every
/// one is a row; and a connection to look at the rows.
async fn with_big_rows(n: i64) -> (tempfile::TempDir, Journal, Connection) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    for i in 1..=n {
        journal.append(vec![big(i as u64)]).await.expect("append");
    }
    let conn = Connection::open(tmp.path().join(FILE)).expect("open db");
    until("every event is a row", || {
        conn.query_row("SELECT COUNT(*) FROM events", [], |r| r.get::<_, i64>(0))
            .expect("count")
            == n
    })
    .await;
    (tmp, journal, conn)
}

pub(super) fn open(dir: &Path) -> Result<(Journal, Vec<DestinationSummary>), OpenError> {
    Journal::open(dir, true, 1 << 30, None, &["orders".to_string()], None)
}

#[tokio::test]
async fn events_only_in_the_intake_log_are_indexed_at_open_and_seqs_go_on() {
    let tmp = tempfile::tempdir().expect("tempdir");
    log_only(tmp.path(), &[1..3, 3..6]);
    let (journal, summary) = open(tmp.path()).expect("open");
    assert_eq!(summary.len(), 1);
    assert_eq!(summary[0].pending, 5);
    let reader = journal.reader().expect("reader");
    let due = reader
        .due("orders", u64::MAX / 2, 100, u64::MAX, &HashSet::new())
        .await
        .expect("due")
        .0;
    let got: Vec<(i64, NewEvent)> = due.into_iter().map(|s| (s.seq, s.event)).collect();
    assert_eq!(
        got,
        (1..6).map(|s| (s, event(s as u64))).collect::<Vec<_>>()
    );
    // A new event after the replayed ones, never a reused seq.
    journal.append(vec![event(9)]).await.expect("append");
    journal.close().await;
    drop(journal);
    let report = inspect_closed(tmp.path()).await;
    assert_eq!(
        report.summary[0].pending, 6,
        "replayed events are not indexed twice"
    );
    let conn = Connection::open(tmp.path().join(FILE)).expect("open db");
    let seqs: Vec<i64> = conn
        .prepare("SELECT seq FROM events ORDER BY seq")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(seqs, vec![1, 2, 3, 4, 5, 6]);
    let copied: i64 = conn
        .query_row("SELECT SUM(length(body)) FROM events", [], |r| r.get(0))
        .expect("sum");
    assert_eq!(copied, 0, "rows point into the log, they hold no body");
}

#[tokio::test]
async fn a_damaged_record_before_good_ones_stops_the_start() {
    let tmp = tempfile::tempdir().expect("tempdir");
    log_only(tmp.path(), &[1..2, 2..3, 3..4]);
    let (_, _, seg) = intake::segments(tmp.path())
        .expect("list")
        .into_iter()
        .next()
        .expect("a segment");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .expect("open segment");
    f.write_all_at(b"XX", 30).expect("damage the first record");
    let err = match open(tmp.path()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a damaged intake log must stop the start"),
    };
    assert!(err.contains("intake log"), "{err}");
    assert!(err.contains("damaged"), "{err}");
}

/// Commands waiting in the writer's queue.
fn queued(journal: &Journal) -> usize {
    journal.tx.max_capacity() - journal.tx.capacity()
}

/// Polls (at most 5 s) until `cond` holds.
pub(super) async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("timed out waiting until {what}");
}

/// The event counts of the records in the intake log, in order.
fn records(dir: &Path) -> Vec<usize> {
    let segments = intake::segments(dir).expect("list segments");
    let mut lsn = segments.first().map_or(0, |s| s.0);
    let mut reader = LogReader::new(dir);
    let mut counts = Vec::new();
    // Bounded: far more turns than records here.
    for _ in 0..1000 {
        match reader.read(lsn).expect("read the intake log") {
            intake::Read::Record(events, after) => {
                counts.push(events.len());
                lsn = after;
            }
            intake::Read::End => return counts,
        }
    }
    panic!("more than 1000 records: {counts:?}");
}

/// The writer is held (in its check for room, behind the disk-full turn)
/// with one append in hand while 49 more queue up; once let go it writes
/// the one, then the 49 as a single record: two records, 1 and 49 events.
#[tokio::test]
async fn a_group_of_appends_is_one_record_and_every_waiter_hears() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let shared = journal.shared.clone();
    let holder = std::thread::spawn(move || {
        let turn = shared.space.disk_turn.lock().expect("disk turn");
        shared.space.disk_full.store(true, Ordering::Release);
        held_tx.send(()).expect("say held");
        let _ = go_rx.recv();
        shared.space.disk_full.store(false, Ordering::Release);
        drop(turn);
    });
    held_rx.recv().expect("the writer is held");

    let first = vec![event(0)];
    let origins = journal
        .shared
        .reserve(&first, false)
        .expect("room for the first");
    let (reply, first_heard) = oneshot::channel();
    let queued_first = journal.send(Command::Append {
        events: first,
        claims: Vec::new(),
        carried: None,
        placed: Vec::new(),
        origins,
        reply,
    });
    assert!(queued_first.is_ok(), "queue the first append");
    until("the writer took the first append", || queued(&journal) == 0).await;
    let appends: Vec<_> = (1..50)
        .map(|i| {
            let j = journal.clone();
            tokio::spawn(async move { j.append(vec![event(i)]).await })
        })
        .collect();
    until("49 appends wait in the queue", || queued(&journal) == 49).await;
    go_tx.send(()).expect("let the writer go");
    holder.join().expect("holder thread");

    assert_eq!(first_heard.await.expect("first reply"), Ok(()));
    for a in appends {
        assert_eq!(a.await.expect("task"), Ok(Appended::default()));
    }
    assert_eq!(
        records(tmp.path()),
        vec![1, 49],
        "one record per group: the one in hand, then all 49 queued"
    );
    assert_eq!(
        journal
            .destination("orders")
            .map(|d| d.pending.load(Ordering::Relaxed)),
        Some(50)
    );
    journal.close().await;
    drop(journal);
    let report = inspect_closed(tmp.path()).await;
    assert_eq!(report.summary[0].pending, 50);
    assert_eq!(report.unindexed, 0, "a clean close indexes everything");
}

/// Opens again once the previous journal's threads have let go of the lock.
pub(super) async fn reopen(dir: &Path) -> (Journal, Vec<DestinationSummary>) {
    for _ in 0..100 {
        match open(dir) {
            Err(OpenError::Locked(..)) => tokio::time::sleep(Duration::from_millis(20)).await,
            other => return other.expect("reopen"),
        }
    }
    panic!("the journal lock was never released");
}

fn intake_pos(dir: &Path) -> u64 {
    let conn = Connection::open(dir.join(FILE)).expect("open db");
    store::intake_pos(&conn).expect("intake_pos")
}

/// Regression: after a clean stop the writer resumes in a fresh segment past
/// the old ones (which it reuses); SQLite must say so before any record goes
/// there, or a crash would make recovery look for them at the old position,
/// find nothing, and lose acknowledged events.
#[tokio::test]
async fn the_recorded_log_position_is_where_the_writer_resumes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    journal.append(vec![event(1)]).await.expect("append");
    journal.close().await;
    drop(journal);
    let before = intake_pos(tmp.path());
    let (journal, _) = reopen(tmp.path()).await;
    let resumed = intake_pos(tmp.path());
    assert!(resumed > before, "{resumed} <= {before}");
    assert_eq!(resumed % intake::SEGMENT, 0, "a fresh segment's start");
    journal.append(vec![event(2)]).await.expect("append");
    let segments = intake::segments(tmp.path()).expect("list");
    assert!(
        segments.iter().any(|(start, _, _)| *start == resumed),
        "the new records are where SQLite says the log goes on: {segments:?}"
    );
    journal.close().await;
}

#[tokio::test]
async fn a_journal_from_before_batching_gets_the_batch_column() {
    let tmp = tempfile::tempdir().expect("tempdir");
    {
        let conn = Connection::open(tmp.path().join(FILE)).expect("create db");
        conn.execute_batch(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL,
             destination TEXT NOT NULL, method TEXT NOT NULL, path TEXT NOT NULL,
             headers BLOB NOT NULL, body BLOB NOT NULL, accepted_ms INTEGER NOT NULL,
             crc INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
             next_due_ms INTEGER NOT NULL, last_outcome TEXT, last_status INTEGER,
             last_attempt_ms INTEGER)",
        )
        .expect("old schema");
    }
    let (journal, _) = open(tmp.path()).expect("open an old journal");
    journal.append(vec![event(1)]).await.expect("append");
    let reader = journal.reader().expect("reader");
    // The 202 comes once the intake log has it; the row a moment later.
    let mut due = Vec::new();
    for _ in 0..200 {
        due = reader
            .due("orders", u64::MAX / 2, 10, u64::MAX, &HashSet::new())
            .await
            .expect("due")
            .0;
        if !due.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].batch, None);
}

/// Stored batch `b` (seqs 4..=6, due later than 1..=3): a scan limited to
/// four rows still hands over the whole batch, and a reschedule keeps or
/// clears the id.
#[tokio::test]
async fn a_stored_batch_is_read_whole_even_when_the_scan_limit_cuts_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    journal
        .append((1..=6).map(event).collect())
        .await
        .expect("append");
    let reschedule = |seq, batch: Option<&str>| Change::Reschedule {
        seq,
        attempts: 1,
        next_due_ms: 2_000,
        outcome: crate::event::Outcome::Busy,
        took_ms: 0,
        status: Some(503),
        attempt_ms: 1_500,
        batch: batch.map(str::to_string),
    };
    journal
        .apply(
            &(4..=6)
                .map(|s| reschedule(s, Some("b")))
                .collect::<Vec<_>>(),
        )
        .await
        .expect("apply");
    let reader = journal.reader().expect("reader");
    let due = reader
        .due("orders", 5_000, 4, u64::MAX, &HashSet::new())
        .await
        .expect("due")
        .0;
    let got: Vec<(i64, Option<String>)> = due.into_iter().map(|e| (e.seq, e.batch)).collect();
    let b = || Some("b".to_string());
    assert_eq!(
        got,
        vec![
            (1, None),
            (2, None),
            (3, None),
            (4, b()),
            (5, b()),
            (6, b())
        ]
    );
    // Held siblings are not read twice; not yet due ones not at all.
    let held: HashSet<i64> = [1, 2, 3, 5].into();
    let due = reader
        .due("orders", 5_000, 1, u64::MAX, &held)
        .await
        .expect("due")
        .0;
    let seqs: Vec<i64> = due.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![4, 6]);
    let due = reader
        .due("orders", 1_999, 10, u64::MAX, &HashSet::new())
        .await
        .expect("due")
        .0;
    assert_eq!(due.len(), 3, "the batch is not due before 2000");
    journal.apply(&[reschedule(6, None)]).await.expect("apply");
    let due = reader
        .due("orders", 5_000, 10, u64::MAX, &held)
        .await
        .expect("due")
        .0;
    let batches: Vec<Option<String>> = due.into_iter().map(|e| e.batch).collect();
    assert_eq!(batches, vec![b(), None]);
}

/// `inspect` once the closed journal's threads have let go of the lock.
async fn inspect_closed(dir: &Path) -> inspect::Inspection {
    for _ in 0..100 {
        match inspect(dir) {
            Err(OpenError::Locked(..)) => tokio::time::sleep(Duration::from_millis(20)).await,
            other => return other.expect("inspect"),
        }
    }
    panic!("the journal lock was never released");
}

/// The mark never claims more than the log holds: three rounds of ~40 MiB
/// (three segments each, spares reused from the second round on), each
/// closed and opened again, never a false alarm.
#[tokio::test]
async fn the_mark_follows_the_log_across_rotation_and_reused_spares() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let big = |i: u64| NewEvent {
        body: noise(1024 * 1024, i),
        ..event(i)
    };
    let mut pending = 0;
    for round in 0..3u64 {
        let (journal, summary) = reopen(tmp.path()).await;
        assert_eq!(
            summary.iter().map(|s| s.pending).sum::<u64>(),
            pending,
            "round {round}"
        );
        for i in 0..40 {
            journal
                .append(vec![big(round * 100 + i)])
                .await
                .expect("append");
        }
        pending += 40;
        journal.close().await;
    }
    let (_, summary) = reopen(tmp.path()).await;
    assert_eq!(summary[0].pending, pending);
}

/// `totals`, kept by the indexer's commits, says what a scan of the rows
/// says: after recovery's inserts, deletes (a run of consecutive seqs, read
/// and deleted as a range, and one beyond a gap the range must not cross),
/// a conditional delete that removed nothing, and two deletes of one event.
#[tokio::test]
async fn totals_match_the_rows_after_inserts_and_deletes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    log_only(tmp.path(), &[1..3, 3..6]);
    let (journal, summary) = reopen(tmp.path()).await;
    assert_eq!(summary[0].pending, 5);
    let delete = |seq: i64, only_if_attempts: Option<u32>| Change::Delete {
        seq,
        only_if_attempts,
        step: None,
    };
    journal
        .apply(&[
            delete(4, None),
            delete(2, None),
            delete(1, None),
            delete(3, Some(7)),
            // A late answer's delete and a retry's of one event, in one
            // commit: it leaves once, and is counted out once.
            delete(5, Some(0)),
            delete(5, None),
        ])
        .await
        .expect("apply");
    let in_memory = journal
        .destination("orders")
        .map(|d| (d.pending(), d.bytes()));
    assert_eq!(in_memory, Some((1, event(3).size())));
    journal.close().await;
    drop(journal);
    let (journal, summary) = reopen(tmp.path()).await;
    assert_eq!(summary[0].pending, 1, "{summary:?}");
    let expected: u64 = [3].iter().map(|i| event(*i).size()).sum();
    assert_eq!(summary[0].bytes, expected, "{summary:?}");
    journal.close().await;
    drop(journal);
    let conn = rusqlite::Connection::open(tmp.path().join(FILE)).expect("open");
    let rows: i64 = conn
        .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
        .expect("count");
    assert_eq!(rows, 1);
    totals_match_a_scan(&conn, &summary);
}

/// `totals`, kept by the indexer's commits, says what a scan of the rows
/// says (`store::summary` scans once `totals` is gone).
fn totals_match_a_scan(conn: &Connection, summary: &[DestinationSummary]) {
    conn.execute_batch("DROP TABLE totals")
        .expect("drop totals");
    assert_eq!(store::summary(conn).expect("scan"), summary);
}

/// Event `i` with a 4 KiB JSON body that LZ4 shrinks (`pack`).
fn packable(i: u64) -> NewEvent {
    NewEvent {
        body: Bytes::from(format!(r#"{{"n":{i},"pad":"{}"}}"#, "ab".repeat(2048))),
        ..event(i)
    }
}

/// Events whose destination is not delivering (no dispatcher here says
/// it is) go into the log packed: they take less than their bodies, come
/// back byte for byte, and count their whole size against `max_bytes`,
/// in memory, in `totals` and in a scan of the rows alike, through
/// inserts, deletes and a restart.
#[tokio::test]
async fn packed_events_come_back_whole_and_count_their_whole_size() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    for i in 1..=40 {
        journal.append(vec![packable(i)]).await.expect("append");
    }
    let size = |seqs: std::ops::RangeInclusive<u64>| seqs.map(|i| packable(i).size()).sum::<u64>();
    assert_eq!(bytes_of(&journal, "orders"), Some(size(1..=40)));
    journal.close().await;
    drop(journal);
    let logged: u64 = LogReader::new(tmp.path())
        .read(0)
        .map(|r| match r {
            intake::Read::Record(events, _) => events.iter().map(|l| u64::from(l.place.len)).sum(),
            intake::Read::End => 0,
        })
        .expect("read");
    assert!(
        logged < packable(1).body.len() as u64,
        "the first record took {logged} bytes"
    );
    let (journal, summary) = reopen(tmp.path()).await;
    assert_eq!((summary[0].pending, summary[0].bytes), (40, size(1..=40)));
    let got: Vec<NewEvent> = all_due(&journal)
        .await
        .into_iter()
        .map(|s| s.event)
        .collect();
    assert_eq!(got, (1..=40).map(packable).collect::<Vec<_>>());
    let deletes: Vec<Change> = (1..=30).map(delete).collect();
    journal.apply(&deletes).await.expect("apply");
    assert_eq!(bytes_of(&journal, "orders"), Some(size(31..=40)));
    journal.close().await;
    drop(journal);
    let (journal, summary) = reopen(tmp.path()).await;
    assert_eq!((summary[0].pending, summary[0].bytes), (10, size(31..=40)));
    journal.close().await;
    drop(journal);
    let conn = rusqlite::Connection::open(tmp.path().join(FILE)).expect("open");
    // The segment's pin counts the bytes its rows' events take there.
    let pins = store::load_pins(&conn).expect("pins");
    let placed: i64 = conn
        .query_row("SELECT SUM(len) FROM events", [], |r| r.get(0))
        .expect("sum");
    assert_eq!(
        pins.values()
            .map(|p| (p.events, p.bytes))
            .collect::<Vec<_>>(),
        [(10, placed)]
    );
    assert!(placed < size(31..=40) as i64 / 2, "{placed}");
    totals_match_a_scan(&conn, &summary);
}

/// A packed event spilled from a mostly delivered segment stays packed in
/// its row (`size` set, the body its packed part), and reads back whole,
/// counted at its whole size, after a restart too.
#[tokio::test]
async fn a_spilled_packed_event_stays_packed_in_its_row() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    let json = NewEvent {
        body: Bytes::from(format!(r#"{{"pad":"{}"}}"#, "ab".repeat(8192))),
        ..event(15)
    };
    // 1..=14 and 16 (noise, as they came) and 15 (packed) in the first
    // segment; 17..=20 beyond it.
    for i in 1..=20 {
        let e = if i == 15 { json.clone() } else { big(i) };
        journal.append(vec![e]).await.expect("append");
    }
    let conn = Connection::open(tmp.path().join(FILE)).expect("open db");
    until("every event is a row", || {
        conn.query_row("SELECT COUNT(*) FROM events", [], |r| r.get::<_, i64>(0))
            .expect("count")
            == 20
    })
    .await;
    let first = intake::segments(tmp.path()).expect("list")[0].0;
    let deletes: Vec<Change> = (1..=14).chain(16..=16).map(delete).collect();
    journal.apply(&deletes).await.expect("apply");
    let row = |conn: &Connection| -> (bool, Option<i64>, i64) {
        conn.query_row(
            "SELECT at IS NULL, size, length(body) FROM events WHERE seq = 15",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("row")
    };
    until("the packed event is copied into its row", || row(&conn).0).await;
    let (_, size, stored) = row(&conn);
    assert_eq!(size, Some(json.size() as i64));
    assert!(stored < json.body.len() as i64 / 4, "{stored} bytes stored");
    // Its CRC is the event's as it came: a build before packed rows, which
    // checks it over the bytes stored, quarantines the row rather than
    // send them as its body.
    let (crc, body, headers): (i64, Vec<u8>, Vec<u8>) = conn
        .query_row(
            "SELECT crc, body, headers FROM events WHERE seq = 15",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("row");
    let over = |body: &[u8]| {
        i64::from(record::crc(
            &json.id, "orders", "POST", &json.path, &headers, body,
        ))
    };
    assert_eq!(crc, over(&json.body));
    assert_ne!(crc, over(&body));
    // Its last row gone, the segment is pinned no more: it can go.
    let pins = store::load_pins(&conn).expect("pins");
    assert!(!pins.contains_key(&first), "{pins:?}");
    let expected = json.size() + (17..=20).map(|i| big(i).size()).sum::<u64>();
    assert_eq!(bytes_of(&journal, "orders"), Some(expected));
    let back = all_due(&journal).await;
    assert_eq!(back.first().map(|s| (s.seq, &s.event)), Some((15, &json)));
    journal.close().await;
    drop(journal);
    let (journal, summary) = reopen(tmp.path()).await;
    assert_eq!((summary[0].pending, summary[0].bytes), (5, expected));
    assert_eq!(all_due(&journal).await[0].event, json);
    journal.close().await;
    drop(journal);
    totals_match_a_scan(&conn, &summary);
}

/// The writer packs what will wait, not what goes out from memory: a
/// destination delivering with room in its ready queue gets its events as
/// they came; one whose last attempt failed, or whose queue is nearly
/// full, packed.
#[tokio::test]
async fn only_events_that_will_wait_are_packed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    let state = journal.destination("orders").expect("orders");
    state.pace(true, true);
    journal.append(vec![packable(1)]).await.expect("append");
    state.pace(false, true);
    journal.append(vec![packable(2)]).await.expect("append");
    state.pace(true, true);
    journal.append(vec![packable(3)]).await.expect("append");
    // Past seven eighths of the ready queue's 4 MiB, put there as the
    // writer would (which it does after it answers, unless the indexer
    // took the events first: not something to wait for here).
    if let Ok(mut ready) = state.ready.lock() {
        for i in 100..105 {
            let filler = NewEvent {
                body: noise(800 << 10, i),
                ..event(i)
            };
            ready.push(StoredEvent::fresh(i as i64, filler));
        }
    }
    assert!(state.ready.lock().is_ok_and(|r| r.nearly_full()));
    journal.append(vec![packable(4)]).await.expect("append");
    journal.close().await;
    drop(journal);
    let mut reader = LogReader::new(tmp.path());
    let (mut packed, mut at) = (Vec::new(), 0);
    // Bounded: each record moves `at` on, and the log ends.
    while let intake::Read::Record(events, next) = reader.read(at).expect("read") {
        packed.extend(events.iter().map(|l| (l.seq, l.packed)));
        at = next;
    }
    let json_seqs: Vec<(i64, bool)> = packed
        .into_iter()
        .filter(|(seq, _)| [1, 2, 3, 4].contains(seq))
        .collect();
    assert_eq!(json_seqs, [(1, false), (2, true), (3, false), (4, true)]);
}

fn to(destination: &str, i: u64) -> NewEvent {
    NewEvent {
        destination: destination.into(),
        ..event(i)
    }
}

fn bytes_of(journal: &Journal, name: &str) -> Option<u64> {
    journal.destination(name).map(|d| d.bytes())
}

/// Opens a journal of `sick` and `healthy`, each with a share of three
/// events, in a total of `total` events.
async fn shared_by_two(dir: &Path, total: u64) -> (Journal, u64) {
    let one = to("sick", 0).size();
    let names = ["sick".to_string(), "healthy".to_string()];
    for _ in 0..100 {
        if let Ok((journal, _)) = Journal::open(dir, true, total * one, None, &names, None) {
            journal.set_share("sick", 3 * one);
            journal.set_share("healthy", 3 * one);
            return (journal, one);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the journal's lock was not let go");
}

#[tokio::test]
async fn a_destination_past_its_share_is_refused_and_the_others_still_fit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, one) = shared_by_two(tmp.path(), 5).await;
    for i in 0..3 {
        journal
            .append(vec![to("sick", i)])
            .await
            .expect("within its share");
    }
    let sick_full = Err(JournalError::DestinationFull {
        destination: "sick".into(),
        pending: 3 * one,
        share: 3 * one,
    });
    assert_eq!(journal.append(vec![to("sick", 3)]).await, sick_full);
    // A topic's copies are stored together or not at all: the healthy
    // copy's room is given back.
    let both = journal.append(vec![to("healthy", 4), to("sick", 5)]).await;
    assert_eq!(both, sick_full);
    assert_eq!(bytes_of(&journal, "healthy"), Some(0));
    for i in 6..8 {
        journal
            .append(vec![to("healthy", i)])
            .await
            .expect("a healthy destination is not refused for a sick one");
    }
    // The total still holds, and its refusal gives the share's room back;
    // once it is full, that is what a destination past its share hears too.
    let full = Err(JournalError::Full {
        pending: 5 * one,
        limit: 5 * one,
    });
    assert_eq!(journal.append(vec![to("healthy", 8)]).await, full);
    assert_eq!(bytes_of(&journal, "healthy"), Some(2 * one));
    assert_eq!(journal.append(vec![to("sick", 9)]).await, full);
    assert_eq!(bytes_of(&journal, "sick"), Some(3 * one));

    // Recovered counters, in a larger journal: still at its share.
    journal.close().await;
    drop(journal);
    let (journal, _) = shared_by_two(tmp.path(), 8).await;
    assert_eq!(bytes_of(&journal, "sick"), Some(3 * one));
    assert_eq!(journal.append(vec![to("sick", 8)]).await, sick_full);
    journal
        .append(vec![to("healthy", 9)])
        .await
        .expect("healthy has room after the restart");
    assert_eq!(bytes_of(&journal, "healthy"), Some(3 * one));
    journal.close().await;
}

/// An event's fate, recorded while the event is only in the intake log
/// (the change waits for its row), comes back with it after a restart,
/// due at once; a fate the build cannot read quarantines its row.
#[tokio::test]
async fn a_recorded_fate_comes_back_with_its_event_after_a_restart() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    journal
        .append(vec![event(1), event(2)])
        .await
        .expect("append");
    let fate = Fate {
        reason: crate::event::Reason::NonRetriableStatus,
        attempts: 3,
        last_outcome: Outcome::BadRequest,
        last_status: Some(400),
        last_attempt_ms: Some(5_000),
        at_ms: 6_000,
    };
    let change = Change::DeadLetter {
        seq: 1,
        fate: fate.clone(),
        attempt: None,
    };
    journal.apply(&[change]).await.expect("apply");
    journal.close().await;
    drop(journal);
    let due = |journal: Journal| async move {
        let reader = journal.reader().expect("reader");
        let due = reader
            .due("orders", 6_000, 10, u64::MAX, &HashSet::new())
            .await;
        journal.close().await;
        due.expect("due").0
    };
    let (journal, _) = reopen(tmp.path()).await;
    let got: Vec<(i64, Option<Fate>, u32)> = due(journal)
        .await
        .into_iter()
        .map(|s| (s.seq, s.fate, s.attempts))
        .collect();
    assert_eq!(got, [(2, None, 0), (1, Some(fate), 3)]);
    let conn = Connection::open(tmp.path().join(FILE)).expect("open db");
    conn.execute("UPDATE events SET fate = 'Lost' WHERE seq = 1", [])
        .expect("edit");
    drop(conn);
    let (journal, _) = reopen(tmp.path()).await;
    let rows = due(journal).await;
    let seqs: Vec<i64> = rows.iter().map(|s| s.seq).collect();
    assert_eq!(seqs, [2], "the row with a fate it cannot read is left out");
    assert_eq!(quarantined(tmp.path()), [1]);
    // A last outcome this build does not name costs the event nothing.
    let conn = Connection::open(tmp.path().join(FILE)).expect("open db");
    conn.execute(
        "UPDATE events SET last_outcome = 'Teapot' WHERE seq = 2",
        [],
    )
    .expect("edit");
    drop(conn);
    let (journal, _) = reopen(tmp.path()).await;
    let rows = due(journal).await;
    let got: Vec<(i64, Option<Outcome>)> = rows.iter().map(|s| (s.seq, s.last_outcome)).collect();
    assert_eq!(got, [(2, Some(Outcome::Failed))]);
    assert_eq!(quarantined(tmp.path()), [1]);
}

/// A destination whose gate holds it (paused, on probation) gets no
/// events in its ready queue: they wait in the index, where its dispatcher
/// finds them when it sends again; once it sends, new events go out from
/// memory again, even while its attempts fail now and then.
#[tokio::test]
async fn a_destination_not_sending_keeps_no_events_in_memory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    let state = journal.destination("orders").expect("counters");
    state.pace(false, false);
    journal
        .append((1..=3).map(event).collect())
        .await
        .expect("append");
    journal.index_all().await.expect("index");
    assert!(
        state.take_ready(10, u64::MAX).is_empty(),
        "paused: nothing held in memory"
    );
    assert_eq!(state.pending(), 3, "all three pending");
    let reader = journal.reader().expect("reader");
    let (due, _) = reader
        .due(
            "orders",
            clock::now_ms() + 1000,
            100,
            u64::MAX,
            &HashSet::new(),
        )
        .await
        .expect("due");
    assert_eq!(due.len(), 3, "in the index");

    // Sending again, its last attempt failed (not delivering as fast as
    // it can): new events still go out from memory.
    state.pace(false, true);
    journal.append(vec![event(4)]).await.expect("append");
    tokio::time::timeout(Duration::from_secs(2), state.fresh())
        .await
        .expect("the writer puts the event in the ready queue");
    let ready: Vec<i64> = state
        .take_ready(10, u64::MAX)
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(ready.len(), 1, "sending again: the new event from memory");
}

/// Deliveries are settled by seq alone, and the journal frees what it
/// counted itself: from what it handed out with the events before the
/// indexer reaches them, from their rows after. A settle brought twice
/// frees once.
#[tokio::test]
async fn a_delivery_settled_by_seq_frees_what_the_journal_counted() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    let one = event(1).size();
    journal
        .append((1..=4).map(event).collect())
        .await
        .expect("append");
    let state = journal.destination("orders").expect("counters");
    assert_eq!((state.pending(), state.bytes()), (4, 4 * one));
    // The answer may come before the events are put in memory.
    tokio::time::timeout(Duration::from_secs(2), state.fresh())
        .await
        .expect("the writer puts the events in the ready queue");
    let seqs: Vec<i64> = state
        .take_ready(10, u64::MAX)
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs.len(), 4, "the fast path holds every event");
    let delete = |seq: i64| Change::Delete {
        seq,
        only_if_attempts: None,
        step: None,
    };
    let handed = |j: &Journal| j.shared.skip.lock().expect("skip").handed();
    // The indexer stays 100 ms behind: these two are not rows yet.
    journal
        .settle(&[delete(seqs[0]), delete(seqs[1])])
        .await
        .expect("settle");
    journal.settle(&[delete(seqs[1])]).await.expect("again");
    assert_eq!((state.pending(), state.bytes()), (2, 2 * one));
    // Read before the claim: claims only grow, so if the indexer has not
    // claimed the last two after the count was read, it had not before.
    let in_memory = handed(&journal);
    if !journal.shared.skip.lock().expect("skip").claimed(seqs[3]) {
        assert_eq!(in_memory, 2, "two are still only in memory");
    }
    // Once the other two are rows, their deletes go through the indexer.
    let conn = Connection::open(tmp.path().join(FILE)).expect("open db");
    let rows = || -> i64 {
        conn.query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
            .expect("count")
    };
    for _ in 0..300 {
        if rows() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rows(), 2, "the delivered two never become rows");
    assert_eq!(handed(&journal), 0, "claimed events are the indexer's");
    journal
        .settle(&[delete(seqs[2]), delete(seqs[3]), delete(seqs[3])])
        .await
        .expect("settle");
    assert_eq!((state.pending(), state.bytes()), (0, 0));
    assert_eq!(
        journal.shared.space.pending_bytes.load(Ordering::Relaxed),
        0
    );
    journal.close().await;
    drop(journal);
    let (journal, summary) = reopen(tmp.path()).await;
    assert!(summary.iter().all(|s| s.pending == 0), "{summary:?}");
    journal.close().await;
}

fn carried(attempts: u32, next_due_ms: u64) -> Carried {
    Carried {
        attempts,
        next_due_ms,
        last_outcome: Some("Busy".into()),
        last_status: Some(503),
        last_attempt_ms: Some(next_due_ms.saturating_sub(10)),
        batch: Some(format!("batch-{attempts}")),
        fate: None,
    }
}

/// Rows' delivery state, by seq: (attempts, next due, outcome, status, batch).
type RowState = (i64, u32, i64, Option<String>, Option<u16>, Option<String>);

fn row_states(dir: &Path) -> Vec<RowState> {
    let conn = Connection::open(dir.join(FILE)).expect("open db");
    conn.prepare(
        "SELECT seq, attempts, next_due_ms, last_outcome, last_status, batch FROM events ORDER BY seq",
    )
    .expect("prepare")
    .query_map([], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
    })
    .expect("query")
    .collect::<Result<_, _>>()
    .expect("rows")
}

#[tokio::test]
async fn adopted_events_keep_their_delivery_state_and_wait_in_the_index_not_in_memory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    let later = 4_000_000_000_000;
    journal.append(vec![event(1)]).await.expect("append");
    journal
        .adopt(vec![
            (event(2), carried(3, later)),
            (event(3), carried(1, 0)),
        ])
        .await
        .expect("adopt");
    journal.append(vec![event(4)]).await.expect("append");
    let state = journal.destination("orders").expect("orders");
    let ready: Vec<i64> = state
        .take_ready(100, u64::MAX)
        .iter()
        .map(|e| e.seq)
        .collect();
    // 1 and 4 are in memory unless the indexer claimed them first.
    assert!(
        !ready.contains(&2) && !ready.contains(&3),
        "adopted events are not handed out from memory: {ready:?}"
    );
    assert_eq!(state.pending(), 4, "adopted events count as pending");
    drop(state);
    // A destination this courier does not know: kept, as orphaned.
    let mut stray = event(5);
    stray.destination = "gone".into();
    journal
        .adopt(vec![(stray, carried(2, later))])
        .await
        .expect("adopt an unknown destination's event");
    journal.close().await;
    drop(journal);
    assert_eq!(
        row_states(tmp.path()),
        [
            (1, 0, 1001, None, None, None),
            (
                2,
                3,
                later as i64,
                Some("Busy".into()),
                Some(503),
                Some("batch-3".into())
            ),
            (
                3,
                1,
                0,
                Some("Busy".into()),
                Some(503),
                Some("batch-1".into())
            ),
            (4, 0, 1004, None, None, None),
            (
                5,
                2,
                later as i64,
                Some("Busy".into()),
                Some(503),
                Some("batch-2".into())
            ),
        ]
    );
    let (journal, summary) = reopen(tmp.path()).await;
    let gone = summary.iter().find(|s| s.destination == "gone");
    assert_eq!(gone.map(|s| s.pending), Some(1));
    let due = journal
        .reader()
        .expect("reader")
        .due("orders", 1_000_000, 100, u64::MAX, &HashSet::new())
        .await
        .expect("due")
        .0;
    let mut got: Vec<(i64, u32)> = due.iter().map(|e| (e.seq, e.attempts)).collect();
    got.sort_unstable();
    assert_eq!(got, [(1, 0), (3, 1), (4, 0)], "seq 2 is due later");
}

#[tokio::test]
async fn an_adopted_record_in_the_log_alone_is_indexed_at_open_with_its_state() {
    let tmp = tempfile::tempdir().expect("tempdir");
    drop(store::open_writer(&tmp.path().join(FILE)).expect("create journal.db"));
    let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open log");
    let mut payload = Vec::new();
    for seq in 1..3 {
        intake::encode(&mut payload, seq, &event(seq as u64), false);
        intake::encode_carried(&mut payload, &carried(seq as u32 + 5, 7_000));
    }
    let end = w.append(&payload, 2, true).expect("append");
    w.sync().expect("sync");
    w.acknowledge(intake::Mark { end, next_seq: 3 })
        .expect("mark");
    drop(w);
    let (journal, summary) = open(tmp.path()).expect("open");
    assert_eq!(summary[0].pending, 2);
    let due = journal
        .reader()
        .expect("reader")
        .due("orders", 8_000, 100, u64::MAX, &HashSet::new())
        .await
        .expect("due")
        .0;
    let got: Vec<(i64, u32, Option<String>, NewEvent)> = due
        .into_iter()
        .map(|e| (e.seq, e.attempts, e.batch, e.event))
        .collect();
    assert_eq!(
        got,
        [
            (1, 6, Some("batch-6".into()), event(1)),
            (2, 7, Some("batch-7".into()), event(2)),
        ],
        "the events read back from their places, with the state beside them"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoptions_racing_appends_keep_their_own_records_and_states() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    let later = 4_000_000_000_000;
    // Appends and adoptions queued at once: the writer groups appends and
    // gives each adoption a record of its own, whatever the order.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40u64 {
        let j = journal.clone();
        tasks.spawn(async move {
            if i % 4 == 0 {
                j.adopt(vec![(event(1000 + i), carried(7, later))]).await
            } else {
                j.append(vec![event(i)]).await.map(|_| ())
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("task").expect("stored");
    }
    journal.close().await;
    drop(journal);
    let rows = row_states(tmp.path());
    assert_eq!(rows.len(), 40);
    let conn = Connection::open(tmp.path().join(FILE)).expect("open db");
    for (seq, attempts, due, ..) in rows {
        let id: String = conn
            .query_row("SELECT id FROM events WHERE seq = ?1", [seq], |r| r.get(0))
            .expect("id");
        let adopted = id
            .strip_prefix("id-")
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n >= 1000);
        if adopted {
            assert_eq!(
                (attempts, due),
                (7, later as i64),
                "{id}: its carried state"
            );
        } else {
            assert_eq!(attempts, 0, "{id}: an append carries nothing");
        }
    }
}

/// The rows waiting for their ordering lane's turn.
fn waiting(dir: &Path) -> Vec<i64> {
    parked_at(dir, store::WAITING)
}

/// Lanes are found before an append is queued, for the destinations that
/// have lanes only, under the key in force.
#[test]
fn an_append_is_placed_in_its_lanes_before_it_reaches_the_writer() {
    use crate::event::ordering::Key;
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    let unordered = vec![to("orders", 1), to("other", 2)];
    assert!(lanes::place(&journal.shared, &unordered).is_empty());
    journal
        .order("orders", Some(Key::Header("k".into())))
        .expect("order");
    let keyed = |i, k: &str| NewEvent {
        headers: vec![("K".into(), k.as_bytes().to_vec())],
        ..to("orders", i)
    };
    let events = vec![
        keyed(1, "a"),
        to("other", 2),
        keyed(3, "a"),
        keyed(4, "b"),
        to("orders", 5),
    ];
    let placed = lanes::place(&journal.shared, &events);
    let lanes: Vec<Option<Option<u64>>> = placed
        .iter()
        .map(|p| p.as_ref().map(|p| p.lane()))
        .collect();
    assert_eq!(lanes.len(), 5);
    assert_eq!(lanes[1], None, "other has no lanes");
    assert_eq!(lanes[4], Some(None), "no key: in no lane");
    assert!(lanes[0].flatten().is_some() && lanes[0] == lanes[2] && lanes[0] != lanes[3]);
}

/// An append placed under lanes that were rebuilt before its write (the
/// destination removed, then added again with another key) is placed
/// again by the writer, under the key in force.
#[tokio::test]
async fn an_append_placed_under_lanes_since_rebuilt_is_placed_again_when_written() {
    use crate::event::ordering::Key;
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    journal
        .order("orders", Some(Key::Header("k".into())))
        .expect("order");
    let keyed = |i, k: &str| NewEvent {
        headers: vec![("K".into(), k.as_bytes().to_vec())],
        ..to("orders", i)
    };
    let events = vec![keyed(1, "a"), keyed(2, "b")];
    // Two keys: two lanes, each event the head of its own.
    let placed = lanes::place(&journal.shared, &events);
    journal
        .order("orders", Some(Key::Destination))
        .expect("rebuilt");
    let origins = journal.shared.reserve(&events, false).expect("room");
    let (reply, heard) = oneshot::channel();
    let queued = journal.send(Command::Append {
        events,
        claims: Vec::new(),
        carried: None,
        placed,
        origins,
        reply,
    });
    assert!(queued.is_ok(), "queued");
    heard.await.expect("answer").expect("written");
    let state = journal.destination("orders").expect("state");
    assert!(state.may_start(1), "the head of the destination's one lane");
    assert!(!state.may_start(2), "behind 1 under the key in force");
}

/// Ordering lanes in the journal: rows behind their lane's head wait (a
/// due read never sees them), the head's end makes the next one due, and a
/// start rebuilds the lanes from the rows, making due a head left waiting.
#[tokio::test]
async fn events_behind_their_lanes_head_wait_in_the_index_until_their_turn() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (journal, _) = open(tmp.path()).expect("open");
    journal
        .order("orders", Some(crate::event::ordering::Key::Destination))
        .expect("order");
    journal
        .append((1..=3).map(event).collect())
        .await
        .expect("append");
    journal.index_all().await.expect("index");
    assert_eq!(waiting(tmp.path()), vec![2, 3], "behind seq 1");
    let reader = journal.reader().expect("reader");
    let none = HashSet::new();
    let due = || reader.due("orders", clock::now_ms() + 1000, 100, u64::MAX, &none);
    let seqs = |rows: Vec<StoredEvent>| rows.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(seqs(due().await.expect("due").0), vec![1]);
    let state = journal.destination("orders").expect("state");
    assert!(state.may_start(1) && !state.may_start(2));
    let delete = |seq| Change::Delete {
        seq,
        only_if_attempts: None,
        step: None,
    };
    journal.settle(&[delete(1)]).await.expect("settle");
    assert_eq!(waiting(tmp.path()), vec![3], "2's turn");
    assert_eq!(seqs(due().await.expect("due").0), vec![2]);
    journal.close().await;
    drop((journal, reader));

    // A crash that kept a head waiting (its turn not committed): the start
    // makes it due; an unordered start makes every row due.
    let conn = Connection::open(tmp.path().join(FILE)).expect("open db");
    conn.execute(
        "UPDATE events SET next_due_ms = ?1 WHERE seq = 2",
        [store::WAITING],
    )
    .expect("update");
    drop(conn);
    let (journal, _) = reopen(tmp.path()).await;
    journal
        .order("orders", Some(crate::event::ordering::Key::Destination))
        .expect("order");
    assert_eq!(waiting(tmp.path()), vec![3], "2 heads its lane again");
    journal.order("orders", None).expect("unordered");
    assert_eq!(waiting(tmp.path()), Vec::<i64>::new());
    journal.close().await;
}

/// An event of `destination` naming the endpoint at `origin`.
fn at_endpoint(destination: &str, i: u64, origin: &str) -> NewEvent {
    let mut e = to(destination, i);
    let url = format!("{origin}/hook").into_bytes();
    e.headers.push((endpoint::URL_HEADER.into(), url));
    e
}

/// A refusal gives back exactly the endpoints' shares the request took:
/// by an endpoint past its share after another's was taken, and by the
/// journal's total after both were.
#[tokio::test]
async fn a_refused_request_gives_back_the_endpoint_shares_it_took() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b) = ("http://a.example:80", "http://b.example:80");
    let one = at_endpoint("d", 0, a).size();
    let names = ["d".to_string()];
    let (journal, _) = Journal::open(tmp.path(), true, 3 * one, None, &names, None).expect("open");
    // Past the total: its refusal, not the destination's, is the one met.
    journal.set_share("d", 4 * one);
    journal.set_endpoint_share("d", one);
    let shares = || {
        let d = journal.destination("d").expect("state");
        (d.endpoints.pending(a), d.endpoints.pending(b))
    };
    journal
        .append(vec![at_endpoint("d", 1, b)])
        .await
        .expect("b's one event");
    let refused = journal
        .append(vec![at_endpoint("d", 2, a), at_endpoint("d", 3, b)])
        .await;
    assert!(
        matches!(refused, Err(JournalError::EndpointFull { ref origin, .. }) if origin == b),
        "{refused:?}"
    );
    assert_eq!(shares(), (0, one), "a's taken share given back");
    journal
        .append(vec![at_endpoint("d", 4, a)])
        .await
        .expect("a's one event");
    journal.set_endpoint_share("d", 2 * one);
    let full = journal
        .append(vec![at_endpoint("d", 5, a), at_endpoint("d", 6, b)])
        .await;
    assert!(
        matches!(full, Err(JournalError::Full { .. })),
        "3 events' room, 4 asked: {full:?}"
    );
    assert_eq!(
        shares(),
        (one, one),
        "both given back by the total's refusal"
    );
    journal.close().await;
}
