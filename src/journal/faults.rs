//! The journal on a disk that fails (`disk::faulty`): each fault gets the
//! answer the rules give it (docs/journal.md "Journal faults": a failed fdatasync
//! fails the journal, a full disk is a 507 until space comes back, a log
//! that cannot be read stops the start), and every event acknowledged
//! before it is still there when the journal opens again on a sound disk.

use super::disk::faulty::{ALWAYS, Faulty, Op};
use super::tests::{delete, event, log_only, noise, until};
use super::*;
use std::collections::BTreeMap;

fn open_on(disk: &Faulty, dir: &Path) -> Result<Journal, OpenError> {
    open_synced(disk, dir, true)
}

/// With `full_sync` false: `journal.sync: os`.
fn open_synced(disk: &Faulty, dir: &Path, full_sync: bool) -> Result<Journal, OpenError> {
    let destinations = ["orders".to_string()];
    Journal::open_with(
        disk.disk(),
        dir,
        full_sync,
        1 << 30,
        None,
        &destinations,
        None,
    )
    .map(|(j, _)| j)
}

/// A body of 4 MiB less a little: four such events fill a segment, and
/// the fifth makes the writer start the next one.
fn big(i: u64) -> NewEvent {
    NewEvent {
        body: noise(4 * 1024 * 1024 - 8192, i),
        ..event(i)
    }
}

/// Appends `events` one request each; the ids of those that were
/// acknowledged, and the error of the first that was not.
async fn append_all(
    journal: &Journal,
    events: impl IntoIterator<Item = NewEvent>,
) -> (Vec<String>, Option<JournalError>) {
    let mut acked = Vec::new();
    for e in events {
        let id = e.id.clone();
        match journal.append(vec![e]).await {
            Ok(_) => acked.push(id),
            Err(err) => return (acked, Some(err)),
        }
    }
    (acked, None)
}

/// The events the journal in `dir` holds, read after opening it on the
/// real disk, by id. Closes it again.
async fn held_after_reopen(dir: &Path) -> BTreeMap<String, NewEvent> {
    let (journal, _) = super::tests::reopen(dir).await;
    let due = journal
        .reader()
        .expect("reader")
        .due("orders", u64::MAX / 2, 100_000, u64::MAX, &HashSet::new())
        .await
        .expect("due")
        .0;
    journal.close().await;
    due.into_iter()
        .map(|s| (s.event.id.clone(), s.event))
        .collect()
}

/// Opens the journal in `dir` on `disk` again, once the last one's
/// threads have let go of its lock.
async fn reopen_on(disk: &Faulty, dir: &Path, full_sync: bool) -> Result<Journal, OpenError> {
    for _ in 0..100 {
        match open_synced(disk, dir, full_sync) {
            Err(OpenError::Locked(..)) => tokio::time::sleep(Duration::from_millis(20)).await,
            other => return other,
        }
    }
    panic!("the journal lock was never released");
}

/// After a fault that fails the journal: an append is refused as
/// `Failed`, and every acknowledged event is there when the journal
/// opens again on a sound disk.
async fn failed_and_kept(journal: Journal, dir: &Path, acked: &[String], why: &str) {
    let later = journal.append(vec![event(99)]).await;
    let Err(JournalError::Failed(_)) = &later else {
        panic!("{why}: an append answered {later:?}");
    };
    journal.close().await;
    drop(journal);
    let held = held_after_reopen(dir).await;
    assert_kept(&held, acked, small);
}

/// A journal in `dir`, on the real disk, that acknowledged two events and
/// was closed; their ids.
async fn two_acknowledged(dir: &Path) -> Vec<String> {
    let (journal, _) = super::tests::open(dir).expect("open");
    let (acked, refused) = append_all(&journal, [event(1), event(2)]).await;
    assert_eq!(refused, None);
    journal.close().await;
    acked
}

/// Every acknowledged id is held, with its event as it was sent.
fn assert_kept(
    held: &BTreeMap<String, NewEvent>,
    acked: &[String],
    sent: impl Fn(&str) -> NewEvent,
) {
    for id in acked {
        let got = held
            .get(id)
            .unwrap_or_else(|| panic!("acknowledged event {id} was lost"));
        assert_eq!(*got, sent(id), "event {id} came back changed");
    }
}

fn small(id: &str) -> NewEvent {
    let n: u64 = id.trim_start_matches("id-").parse().expect("an id-N");
    event(n)
}

fn large(id: &str) -> NewEvent {
    let n: u64 = id.trim_start_matches("id-").parse().expect("an id-N");
    big(n)
}

/// fdatasync failed: the journal refuses every write from then on (the page
/// cache may have dropped the pages it could not write, so a later fsync
/// that succeeds proves nothing), whatever the errno, even once the disk
/// answers again; what was acknowledged before stays.
#[tokio::test]
async fn a_failed_fdatasync_fails_the_journal_for_good() {
    for errno in [libc::EIO, libc::ENOSPC] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let disk = Faulty::new();
        let journal = open_on(&disk, tmp.path()).expect("open");
        let (acked, refused) = append_all(&journal, (1..=3).map(event)).await;
        assert_eq!((acked.len(), refused), (3, None));

        // Only the next fdatasync fails: a retry would succeed.
        disk.fail(Op::SyncData, 1, 1, errno);
        let failed = journal.append(vec![event(4)]).await;
        let Err(JournalError::Failed(_)) = &failed else {
            panic!("errno {errno}: a failed fdatasync answered {failed:?}");
        };
        assert!(journal.failed(), "/healthz answers 503 when this holds");

        let (syncs, writes) = (disk.calls(Op::SyncData), disk.calls(Op::Write));
        let later = journal.append(vec![event(5)]).await;
        assert!(
            matches!(later, Err(JournalError::Failed(_))),
            "errno {errno}: an append after the failure answered {later:?}"
        );
        assert_eq!(
            (disk.calls(Op::SyncData), disk.calls(Op::Write)),
            (syncs, writes),
            "nothing is written or synced after a failed fdatasync"
        );
        assert!(journal.failed());
        journal.close().await;
        drop(journal);

        let held = held_after_reopen(tmp.path()).await;
        assert_kept(&held, &acked, small);
        assert!(!held.contains_key("id-5"), "a refused event is not stored");
    }
}

/// `pwritev` may write less than asked: the writer writes the rest, and
/// the record reads back whole.
#[tokio::test]
async fn a_short_write_is_finished_not_taken_for_the_record() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let disk = Faulty::new();
    let journal = open_on(&disk, tmp.path()).expect("open");
    let (mut acked, _) = append_all(&journal, (1..=2).map(event)).await;
    let before = disk.calls(Op::Write);
    // The record's header cut, then its payload.
    disk.short_write(1, 10);
    disk.short_write(2, 40);
    let (more, refused) = append_all(&journal, (3..=4).map(event)).await;
    assert_eq!(refused, None, "a short write is no error");
    acked.extend(more);
    let writes = disk.calls(Op::Write) - before;
    journal.close().await;
    drop(journal);
    let held = held_after_reopen(tmp.path()).await;
    assert_kept(&held, &acked, small);
    assert_eq!(held.len(), 4);
    assert!(
        writes >= 4,
        "the cut record took three writes, not {writes}"
    );
}

/// A write cut short, then ENOSPC (a volume filling mid-record): a 507,
/// the journal healthy, and the torn record is never read as an event,
/// nor mistaken for a lost tail, at the next start.
#[tokio::test]
async fn a_record_torn_by_a_full_disk_is_a_507_and_never_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let disk = Faulty::new();
    let journal = open_on(&disk, tmp.path()).expect("open");
    let (acked, _) = append_all(&journal, (1..=2).map(event)).await;
    assert_eq!(acked.len(), 2);
    // The header and a few payload bytes make it to the file.
    disk.short_write(1, 30);
    disk.fail(Op::Write, 2, 1, libc::ENOSPC);
    let torn = journal.append(vec![event(3)]).await;
    let Err(JournalError::DiskFull) = &torn else {
        panic!("a write that ran out of space answered {torn:?}");
    };
    assert!(!journal.failed(), "a full disk is not a failed journal");
    journal.close().await;
    drop(journal);
    let held = held_after_reopen(tmp.path()).await;
    assert_kept(&held, &acked, small);
    assert_eq!(
        held.keys().collect::<Vec<_>>(),
        ["id-1", "id-2"],
        "the torn event is not read back"
    );
}

/// What a fault at one step of a group commit must answer.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    /// 507 while it lasts; writes go on once space is back.
    DiskFull,
    /// 503 and /healthz 503 until restart.
    Failed,
    /// The group is durable all the same.
    Stored,
}

/// ENOSPC at each step of a group commit that starts a new segment, in
/// order: create the file, allocate it (the full size, then just the
/// record's), sync the directory for its name, write the record, fdatasync,
/// update the mark. Each gets its answer; once space comes back, a small
/// group goes into the rest of the old segment and a large one starts the
/// new one; every acknowledged event is there at the next start.
#[tokio::test]
async fn enospc_at_each_step_of_a_group_commit() {
    let steps = [
        (Op::Create, ALWAYS, Answer::DiskFull),
        (Op::Allocate, ALWAYS, Answer::DiskFull),
        // Only the full size refused: a segment just large enough.
        (Op::Allocate, 1, Answer::Stored),
        (Op::SyncDir, ALWAYS, Answer::Failed),
        (Op::Write, ALWAYS, Answer::DiskFull),
        (Op::SyncData, ALWAYS, Answer::Failed),
        // The events are durable; the mark only lags, which claims less.
        (Op::WriteMark, ALWAYS, Answer::Stored),
    ];
    for (op, times, answer) in steps {
        let case = format!("ENOSPC at {op:?} x{times}");
        let tmp = tempfile::tempdir().expect("tempdir");
        let disk = Faulty::new();
        let journal = open_on(&disk, tmp.path()).expect("open");
        let (mut acked, refused) = append_all(&journal, (1..=4).map(big)).await;
        assert_eq!(refused, None, "{case}");
        assert_eq!(
            intake::segments(tmp.path()).expect("list").len(),
            1,
            "{case}: four fill one segment"
        );
        disk.fail(op, 1, times, libc::ENOSPC);
        let fifth = journal.append(vec![big(5)]).await;
        match (answer, &fifth) {
            (Answer::DiskFull, Err(JournalError::DiskFull)) => {
                assert!(!journal.failed(), "{case}");
                let again = journal.append(vec![big(6)]).await;
                assert_eq!(again, Err(JournalError::DiskFull), "{case}: while it lasts");
                disk.heal();
                let (more, refused) = append_all(&journal, [event(7), big(8)]).await;
                assert_eq!(refused, None, "{case}: space is back");
                acked.extend(more);
            }
            (Answer::Failed, Err(JournalError::Failed(_))) => {
                assert!(journal.failed(), "{case}");
                disk.heal();
                let later = journal.append(vec![event(7)]).await;
                assert!(
                    matches!(later, Err(JournalError::Failed(_))),
                    "{case}: after a failed fsync, {later:?}"
                );
            }
            (Answer::Stored, Ok(_)) => {
                acked.push("id-5".into());
                assert!(!journal.failed(), "{case}");
            }
            (_, other) => panic!("{case}: expected {answer:?}, got {other:?}"),
        }
        journal.close().await;
        drop(journal);
        let held = held_after_reopen(tmp.path()).await;
        let sent = |id: &str| if id == "id-7" { small(id) } else { large(id) };
        assert_kept(&held, &acked, sent);
        if answer == Answer::DiskFull {
            assert_eq!(
                held.len(),
                acked.len(),
                "{case}: a refused event is not stored"
            );
        }
    }
}

/// EIO reading the log at a start: the start is refused as damage (the
/// operator restores or moves the file aside), never taken for the log's
/// end; nothing is changed, so a start on a sound disk has every event.
#[tokio::test]
async fn eio_reading_the_log_at_start_refuses_the_start_and_loses_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    log_only(tmp.path(), &[1..3, 3..6]);
    let disk = Faulty::new();
    disk.fail(Op::Read, 1, ALWAYS, libc::EIO);
    let eio = std::io::Error::from_raw_os_error(libc::EIO).to_string();
    match open_on(&disk, tmp.path()) {
        Err(OpenError::Intake(dir, why)) => {
            assert_eq!(dir, tmp.path());
            assert!(why.contains(&eio), "{why}");
        }
        Err(other) => panic!("EIO at recovery refused the start as {other:?}"),
        Ok(_) => panic!("a log that cannot be read must stop the start"),
    }
    assert!(disk.calls(Op::Read) > 0, "recovery read the log");
    // Out of descriptors is a retry, not damage.
    let disk = Faulty::new();
    disk.fail(Op::Open, 1, ALWAYS, libc::EMFILE);
    assert!(matches!(
        open_on(&disk, tmp.path()),
        Err(OpenError::Retry(..))
    ));
    let held = held_after_reopen(tmp.path()).await;
    let ids: Vec<String> = (1..=5).map(|i| format!("id-{i}")).collect();
    assert_kept(&held, &ids, small);
    assert_eq!(held.len(), 5);
}

/// EIO while the indexer follows the log fails the journal (503, /healthz
/// 503) rather than skip the record; what was acknowledged stays.
#[tokio::test]
async fn eio_reading_the_log_while_indexing_fails_the_journal() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let disk = Faulty::new();
    let journal = open_on(&disk, tmp.path()).expect("open");
    let (mut acked, _) = append_all(&journal, [event(1)]).await;
    disk.fail(Op::Read, 1, ALWAYS, libc::EIO);
    let (more, refused) = append_all(&journal, [event(2)]).await;
    assert_eq!(refused, None, "the writer does not read");
    acked.extend(more);
    until("the indexer meets the EIO", || journal.failed()).await;
    failed_and_kept(journal, tmp.path(), &acked, "after a failed read").await;
}

/// With `sync: os` the writer does not fdatasync, but the indexer does
/// before rows point into the log: a failure there fails the journal as
/// the writer's would, whatever its errno, never a 507 that retries it.
#[tokio::test]
async fn with_sync_os_a_failed_fdatasync_before_indexing_fails_the_journal() {
    for errno in [libc::EIO, libc::ENOSPC] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let disk = Faulty::new();
        let journal = open_synced(&disk, tmp.path(), false).expect("open");
        disk.fail(Op::SyncData, 1, 1, errno);
        let (acked, refused) = append_all(&journal, [event(1)]).await;
        assert_eq!(refused, None, "errno {errno}: the writer does not sync");
        until("the indexer's fdatasync fails the journal", || {
            journal.failed()
        })
        .await;
        assert_eq!(disk.calls(Op::SyncData), 1, "errno {errno}: not retried");
        let why = format!("errno {errno}: after a failed fdatasync");
        failed_and_kept(journal, tmp.path(), &acked, &why).await;
    }
}

/// A transient error (out of descriptors) is retried a few times within
/// the append; one that lasts is a 503 `Strained` for that group only:
/// the journal stays healthy and the next group, once it passes, is stored.
#[tokio::test]
async fn a_transient_error_is_retried_and_never_fails_the_journal() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let disk = Faulty::new();
    let journal = open_on(&disk, tmp.path()).expect("open");
    // The first group makes the first segment: two tries fail, the third
    // succeeds.
    disk.fail(Op::Create, 1, 2, libc::EMFILE);
    let (mut acked, refused) = append_all(&journal, [event(1)]).await;
    assert_eq!(refused, None, "retried within the append");
    assert_eq!(disk.calls(Op::Create), 3);

    disk.fail(Op::Write, 1, ALWAYS, libc::EMFILE);
    let before = disk.calls(Op::Write);
    let strained = journal.append(vec![event(2)]).await;
    let Err(JournalError::Strained(_)) = &strained else {
        panic!("a lasting transient error answered {strained:?}");
    };
    assert_eq!(
        disk.calls(Op::Write) - before,
        5,
        "one try and four retries"
    );
    assert!(
        !journal.failed(),
        "a transient error does not fail the journal"
    );
    disk.heal();
    let (more, refused) = append_all(&journal, [event(3)]).await;
    assert_eq!(refused, None);
    acked.extend(more);
    journal.close().await;
    drop(journal);
    let held = held_after_reopen(tmp.path()).await;
    assert_kept(&held, &acked, small);
    assert_eq!(held.len(), 2, "the refused group is not stored");
}

/// The reads of events for their rows (a dispatcher's refill, an expiry)
/// go through the same disk as the writer: EIO there fails the journal as
/// a failed write does (docs/journal.md "Journal faults"), while running out of
/// descriptors only fails that read, to be tried again. Nothing
/// acknowledged is lost either way.
#[tokio::test]
async fn a_rows_event_unreadable_fails_the_journal_and_a_shortage_is_tried_again() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let acked = two_acknowledged(tmp.path()).await;
    // Reopened, the events are rows that point into the log.
    let disk = Faulty::new();
    let journal = reopen_on(&disk, tmp.path(), true).await.expect("reopen");
    let reader = journal.reader().expect("reader");
    let none = std::collections::HashSet::new();
    let due = || reader.due("orders", u64::MAX / 2, 10, u64::MAX, &none);
    disk.fail(Op::Open, 1, ALWAYS, libc::EMFILE);
    let short = due().await.expect_err("no descriptor to read the log with");
    assert!(matches!(short, LoadError::Log(_)), "{short:?}");
    assert!(!journal.failed(), "a shortage of descriptors passes");
    disk.heal();
    assert_eq!(due().await.expect("due").0.len(), 2, "read once it passed");
    disk.fail(Op::Read, 1, ALWAYS, libc::EIO);
    let eio = due().await.expect_err("the log cannot be read");
    assert!(matches!(eio, LoadError::Log(_)), "{eio:?}");
    assert!(journal.failed(), "EIO reading the log fails the journal");
    failed_and_kept(journal, tmp.path(), &acked, "after a failed read").await;
}

/// A segment that could not be removed once it was done with is removed
/// at a later group, not forgotten on the volume until the next start.
#[tokio::test]
async fn a_segment_that_failed_to_go_is_removed_at_the_next_try() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let disk = Faulty::new();
    let journal = open_on(&disk, tmp.path()).expect("open");
    // Three full segments and a fourth begun.
    let (acked, refused) = append_all(&journal, (1..=13).map(big)).await;
    assert_eq!(refused, None);
    let files = || intake::segments(tmp.path()).expect("list").len();
    assert_eq!(files(), 4);
    let deliveries: Vec<Change> = (1..=12).map(delete).collect();
    journal.settle(&deliveries).await.expect("settle");
    // Two become spares; removing the third fails once.
    disk.fail(Op::Remove, 1, 1, libc::EIO);
    // Bounded: each turn's group lets the writer recycle again.
    for i in 0..200 {
        journal.append(vec![event(100 + i)]).await.expect("append");
        if disk.calls(Op::Remove) >= 2 && files() == 3 {
            break;
        }
        assert!(i < 199, "the segment was never removed: {} files", files());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(disk.calls(Op::Remove), 2, "failed once, then removed");
    assert!(!journal.failed(), "a failed removal is not a failed write");
    journal.close().await;
    drop(journal);
    let held = held_after_reopen(tmp.path()).await;
    assert!(
        held.contains_key(&acked[12]),
        "the thirteenth is still pending"
    );
}

/// `intake.mark` says how far the log was acknowledged. One that exists
/// and cannot be read refuses the start with `sync: always` (a lost tail
/// would pass unseen), is a retry when descriptors run short, and with
/// `sync: os` is said and passed over. Nothing acknowledged is lost.
#[tokio::test]
async fn an_unreadable_mark_refuses_the_start_unless_sync_is_os() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let acked = two_acknowledged(tmp.path()).await;
    let disk = Faulty::new();
    disk.fail(Op::ReadMark, 1, ALWAYS, libc::EIO);
    match reopen_on(&disk, tmp.path(), true).await {
        Err(OpenError::MarkUnreadable(path, _)) => {
            assert_eq!(path, tmp.path().join(intake::MARK));
        }
        Err(other) => panic!("an unreadable mark refused the start as {other:?}"),
        Ok(_) => panic!("an unreadable mark must stop a start with sync: always"),
    }
    let disk = Faulty::new();
    disk.fail(Op::ReadMark, 1, ALWAYS, libc::EMFILE);
    assert!(matches!(
        reopen_on(&disk, tmp.path(), true).await,
        Err(OpenError::Retry(..))
    ));
    let disk = Faulty::new();
    disk.fail(Op::ReadMark, 1, ALWAYS, libc::EIO);
    let journal = reopen_on(&disk, tmp.path(), false)
        .await
        .expect("with sync: os the start goes on");
    journal.close().await;
    drop(journal);
    // An empty mark was made by a start that stopped before writing it,
    // when nothing was acknowledged: no mark, not damage.
    std::fs::write(tmp.path().join(intake::MARK), b"").expect("empty mark");
    let journal = reopen_on(&Faulty::new(), tmp.path(), true)
        .await
        .expect("an empty mark is no mark");
    journal.close().await;
    drop(journal);
    let held = held_after_reopen(tmp.path()).await;
    assert_kept(&held, &acked, small);
}
