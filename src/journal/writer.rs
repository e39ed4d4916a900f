//! The writer thread: drains every queued append into one intake log
//! record, fdatasyncs it once for the whole group, then answers every
//! waiter; the indexer adds the rows to SQLite afterwards. The group grows
//! with load (concurrency × sync time), so there is no linger timer.
//! After a failed write or sync it refuses all writes: once fsync has
//! failed, the page cache can no longer be trusted to match the disk.

use super::indexer::ToIndexer;
use super::intake::{self, AppendError, LogWriter};
use super::reserve;
use super::{Command, DestinationState, Handed, JournalError, NewEvent, Shared, StoredEvent};
use crate::metrics;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// Upper bounds of one group, so one record cannot grow without end.
const MAX_GROUP: usize = 4096;
const MAX_GROUP_BYTES: u64 = 8 * 1024 * 1024;
/// The commands a group's list keeps between groups, as its payload keeps
/// `intake::KEEP_PAYLOAD` bytes: a burst of large groups grows it towards
/// `MAX_GROUP`, and `clear` alone would hold that memory for the life of
/// the process.
const KEEP_GROUP: usize = 256;
/// Pauses between tries of an append that met a transient error.
const TRANSIENT_PAUSES: [std::time::Duration; 4] = [
    std::time::Duration::from_millis(20),
    std::time::Duration::from_millis(40),
    std::time::Duration::from_millis(80),
    std::time::Duration::from_millis(160),
];

pub(super) struct Writer {
    pub log: LogWriter,
    pub next_seq: i64,
    pub full_sync: bool,
    pub shared: Arc<Shared>,
    pub indexer: std::sync::mpsc::Sender<ToIndexer>,
    /// When a failed recycle was last logged: it is tried at every group.
    pub recycle_warned: Option<Instant>,
    /// `courier_journal_sync_duration_seconds`, found once: looked up at each group,
    /// the registry was searched and a key made per commit.
    pub sync_seconds: ::metrics::Histogram,
}

/// A recycle that keeps failing is said this often, not at every group.
const RECYCLE_WARN_EVERY: Duration = Duration::from_secs(60);

pub(super) fn spawn(writer: Writer, rx: mpsc::Receiver<Command>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("journal-writer".into())
        .spawn(move || writer.run(rx))
        .map(|_| ())
}

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut group = Vec::with_capacity(KEEP_GROUP);
        let mut payload = Vec::with_capacity(intake::KEEP_PAYLOAD);
        // A command taken that starts the next group: adopted events are a
        // record of their own.
        let mut next: Option<Command> = None;
        while let Some(first) = next.take().or_else(|| rx.blocking_recv()) {
            let mut bytes = first.size();
            let alone = first.carried();
            group.push(first);
            while !alone && group.len() < MAX_GROUP && bytes < MAX_GROUP_BYTES {
                match rx.try_recv() {
                    Ok(cmd) if cmd.carried() => {
                        next = Some(cmd);
                        break;
                    }
                    Ok(cmd) => {
                        bytes += cmd.size();
                        group.push(cmd);
                    }
                    Err(_) => break,
                }
            }
            let close = group
                .iter()
                .position(|c| matches!(c, Command::Close { .. }));
            let rest = close.map(|i| group.split_off(i));
            // Counted before the commit drains the group. The payload holds
            // this group's encoding (the previous one's after a write refused
            // before encoding): what the buffer last needed either way,
            // without a pass over the events.
            let commands = group.len();
            self.commit(&mut group, &mut payload);
            trim(&mut group, commands, KEEP_GROUP);
            let encoded = payload.len();
            trim(&mut payload, encoded, intake::KEEP_PAYLOAD);
            if let Some(rest) = rest {
                self.close(rest, &mut rx);
                return;
            }
        }
    }

    fn commit(&mut self, group: &mut Vec<Command>, payload: &mut Vec<u8>) {
        if group.is_empty() {
            return;
        }
        let durable = self.shared.by_indexer.durable_pos.load(Ordering::Acquire);
        let keep = !self.shared.space.disk_full.load(Ordering::Acquire);
        let pinned = self
            .shared
            .by_indexer
            .pinned
            .lock()
            .ok()
            .map(|p| Arc::clone(&p));
        // A poisoned lock frees nothing: segments may be pinned.
        let recycled = match &pinned {
            Some(pinned) => self.log.recycle(durable, keep, pinned),
            None => Ok(()),
        };
        if let Err(e) = recycled
            && self
                .recycle_warned
                .is_none_or(|at| at.elapsed() >= RECYCLE_WARN_EVERY)
        {
            self.recycle_warned = Some(Instant::now());
            tracing::warn!(error = %e, "cannot recycle intake log segments; will retry at each commit");
        }
        let first_seq = self.next_seq;
        let started = Instant::now();
        let result = self.write(group, payload);
        self.sync_seconds.record(started.elapsed().as_secs_f64());
        match &result {
            Ok(_) => {
                account(group, &self.shared);
                admit_to_lanes(group, first_seq, &self.shared);
            }
            Err(_) => release(group, &self.shared),
        }
        // Published before the answers: a change to one of these events,
        // sent once its app or a dispatcher heard of it, must find it in the
        // log (the indexer reads this end after the change), or the change
        // would be committed before the event's row exists and be lost.
        if let Ok(end) = result {
            self.shared
                .by_writer
                .written_end
                .store(end, Ordering::SeqCst);
        }
        // The answers go next: every app waits for its group's turn, and
        // what follows only hands the events on.
        let answer = result.as_ref().map(|_| ()).map_err(Clone::clone);
        let now = crate::clock::now_ms();
        let mut written = Vec::new();
        let mut adopted = false;
        for cmd in group.drain(..) {
            if let Command::Append {
                events,
                reply,
                claims,
                carried,
                origins,
                ..
            } = cmd
            {
                adopted |= carried.is_some();
                // Duplicates of these ids become duplicates only now; on
                // failure the claims drop and free the ids.
                if answer.is_ok() {
                    for claim in claims {
                        claim.stored(now);
                    }
                }
                let _ = reply.send(answer.clone());
                let origins = origins.into_iter().chain(std::iter::repeat(None));
                written.extend(events.into_iter().zip(origins));
            }
        }
        if result.is_ok() {
            // The indexer is woken only when it sleeps with nothing to index.
            if self.shared.by_indexer.idle.swap(false, Ordering::SeqCst) {
                let _ = self.indexer.send(ToIndexer::Wake);
            }
            // Adopted events wait in the index for their due time.
            if !adopted {
                make_ready(written, first_seq, &self.shared);
            }
        }
    }

    /// Writes the group as one record and syncs it; returns the log's end.
    fn write(&mut self, group: &[Command], payload: &mut Vec<u8>) -> Result<u64, JournalError> {
        if let Some(reason) = self.shared.gate.failed.lock().ok().and_then(|f| f.clone()) {
            return Err(JournalError::Failed(reason));
        }
        if !self.shared.room() || !self.sqlite_keeps_room(group) {
            return Err(JournalError::DiskFull);
        }
        payload.clear();
        let mut seq = self.next_seq;
        let mut adopted = false;
        let states = self.shared.destinations.load();
        for cmd in group {
            if let Command::Append {
                events, carried, ..
            } = cmd
            {
                for (i, e) in events.iter().enumerate() {
                    // Packed if it will likely wait (`pack`): adopted (due
                    // when its state says), or its destination is not
                    // delivering (held back, or its last attempt failed:
                    // its first attempt may still go out from memory, but a
                    // failing endpoint's events mostly wait for retries), or
                    // its ready queue is nearly full (it waits in the index).
                    let waits = carried.is_some()
                        || states.get(&e.destination).is_none_or(|s| {
                            !s.delivering.load(Ordering::Relaxed)
                                || s.ready.lock().is_ok_and(|r| r.nearly_full())
                        });
                    intake::encode(payload, seq, e, waits);
                    if let Some(state) = carried.as_ref().and_then(|c| c.get(i)) {
                        intake::encode_carried(payload, state);
                        adopted = true;
                    }
                    seq += 1;
                }
            }
        }
        let count = (seq - self.next_seq) as u32;
        let mut written = self.log.append(payload, count, adopted);
        // Bounded: a few tries within ~0.3 s, then this group gets a 503
        // and the next one tries again; the journal stays healthy.
        for pause in TRANSIENT_PAUSES {
            let Err(AppendError::Transient(e)) = &written else {
                break;
            };
            tracing::warn!(error = %e, "the journal cannot write yet; retrying");
            std::thread::sleep(pause);
            written = self.log.append(payload, count, adopted);
        }
        // A failed fdatasync fails the journal whatever its errno.
        let written = written.and_then(|end| {
            if self.full_sync {
                self.log.sync().map_err(AppendError::Io)?;
            }
            Ok(end)
        });
        match written {
            Ok(end) => {
                self.next_seq = seq;
                let mark = intake::Mark { end, next_seq: seq };
                if let Err(e) = self.log.acknowledge(mark) {
                    // The events are durable; only the check for a lost
                    // tail at the next start is weaker until the next write.
                    tracing::warn!(error = %e, "cannot update the intake log's mark");
                }
                Ok(end)
            }
            Err(AppendError::DiskFull) => {
                self.log.drop_spares();
                self.shared.full();
                Err(JournalError::DiskFull)
            }
            Err(AppendError::Transient(e)) => Err(JournalError::Strained(e.to_string())),
            Err(AppendError::TooLarge) => Err(JournalError::Full {
                pending: payload.len() as u64,
                limit: u32::MAX as u64,
            }),
            Err(AppendError::Io(e)) => Err(self.fail(e.to_string())),
        }
    }

    /// Whether the volume keeps room, after this group, for SQLite to take
    /// in what the log holds and checkpoint its WAL (which grows journal.db
    /// by as much): with less, a full disk would leave SQLite unable to
    /// record the deliveries that free space, and nothing would move.
    /// Below it the disk counts as full before it is.
    fn sqlite_keeps_room(&self, group: &[Command]) -> bool {
        let Ok((_, free)) = reserve::space(&self.shared.dir) else {
            return true;
        };
        let durable = self.shared.by_indexer.durable_pos.load(Ordering::Acquire);
        let backlog = self.log.end().saturating_sub(durable);
        let wal =
            std::fs::metadata(self.shared.path.with_extension("db-wal")).map_or(0, |m| m.len());
        let group: u64 = group.iter().map(Command::size).sum();
        let keep = 2 * (backlog + group) + wal;
        if free >= group + keep {
            return true;
        }
        self.shared.full();
        false
    }

    fn fail(&self, reason: String) -> JournalError {
        tracing::error!(error = %reason, dir = %self.shared.dir.display(), "journal write failed; refusing writes until restart");
        if let Ok(mut f) = self.shared.gate.failed.lock() {
            f.get_or_insert(reason.clone());
        }
        JournalError::Failed(reason)
    }

    /// Answers what queued after the close, then has the indexer catch up
    /// and sync before the closer hears back.
    fn close(&mut self, rest: Vec<Command>, rx: &mut mpsc::Receiver<Command>) {
        rx.close();
        let mut closers = Vec::new();
        let mut leftover = rest;
        while let Ok(cmd) = rx.try_recv() {
            leftover.push(cmd);
        }
        release(&leftover, &self.shared);
        for cmd in leftover {
            match cmd {
                Command::Close { reply } => closers.push(reply),
                Command::Append { reply, .. } => {
                    let _ = reply.send(Err(JournalError::Closed));
                }
            }
        }
        let (reply, done) = oneshot::channel();
        if self.indexer.send(ToIndexer::Close { reply }).is_ok() {
            let _ = done.blocking_recv();
        }
        for c in closers {
            let _ = c.send(());
        }
    }
}

impl Command {
    /// Adopted events: a group of their own.
    fn carried(&self) -> bool {
        matches!(
            self,
            Command::Append {
                carried: Some(_),
                ..
            }
        )
    }

    fn size(&self) -> u64 {
        match self {
            Command::Append { events, .. } => events.iter().map(NewEvent::size).sum(),
            Command::Close { .. } => 0,
        }
    }
}

/// Gives back what a burst grew `buf` to beyond `keep`, once a group used
/// no more than half of `keep`: the load is small again. A load of large
/// groups keeps its room (no allocation per group); one that swings between
/// large and small groups grows it again after each small one, which costs
/// little beside the large group's fdatasync. `buf` is empty or dead here.
fn trim<T>(buf: &mut Vec<T>, used: usize, keep: usize) {
    if buf.capacity() > keep && used <= keep / 2 {
        *buf = Vec::with_capacity(keep);
    }
}

/// Gives back the bytes that admission reserved for appends that were not
/// written.
fn release(cmds: &[Command], shared: &Shared) {
    for cmd in cmds {
        if let Command::Append {
            events, origins, ..
        } = cmd
        {
            shared.unreserve(events, origins);
        }
    }
}

/// Counts the group's events as accepted once durable. Counted here, not
/// at the 202: an app that hung up before its answer still has its event.
/// Their bytes were counted at admission (`Shared::reserve`).
fn account(group: &[Command], shared: &Shared) {
    let states = shared.destinations.load();
    for cmd in group {
        if let Command::Append {
            events, carried, ..
        } = cmd
        {
            for e in events {
                let state = states.get(&e.destination);
                if let Some(d) = state {
                    d.pending.fetch_add(1, Ordering::Relaxed);
                }
                // An adopted event was accepted by the courier that handed
                // it off (`courier_handoff_events_total` counts it here).
                if carried.is_none() {
                    match state {
                        Some(d) => d.accepted(&e.destination, 1),
                        None => metrics::accepted(&e.destination).increment(1),
                    }
                }
            }
        }
    }
}

/// Puts each durable event of a destination with an ordering key in its
/// lane, in seq order. Before the log's end is published: the indexer,
/// which decides whether a row waits, and the dispatchers must find every
/// event in its lane. The lanes were found before the append was queued
/// (`lanes::place`); only an event whose destination got lanes since is
/// placed here.
fn admit_to_lanes(group: &[Command], first_seq: i64, shared: &Shared) {
    let states = shared.destinations.load();
    // Each destination's state, when it has lanes, looked up once.
    let mut ordered: Vec<(&str, Option<&Arc<DestinationState>>)> = Vec::new();
    let mut seq = first_seq;
    for cmd in group {
        let Command::Append { events, placed, .. } = cmd else {
            continue;
        };
        for (i, e) in events.iter().enumerate() {
            let at = match ordered.iter().position(|(d, _)| *d == e.destination) {
                Some(at) => at,
                None => {
                    let state = states
                        .get(&e.destination)
                        .filter(|state| state.lanes().is_some());
                    ordered.push((e.destination.as_str(), state));
                    ordered.len() - 1
                }
            };
            if let Some(state) = ordered[at].1
                && let Some(lanes) = state.lanes().as_mut()
                && let Some(lane) = lanes.lane(placed.get(i).and_then(Option::as_ref), e)
            {
                lanes.admit(seq, lane);
            }
            seq += 1;
        }
    }
}

/// The fast path: each durable event goes to its destination's ready
/// queue, from which the first attempt is sent without reading SQLite.
/// The seqs are those `write` gave, in the same order. Under the skip
/// lock, which the indexer takes to claim records: an event already
/// claimed is (or is about to be) a row, where its dispatcher finds it,
/// so it must not be handed out a second time from memory.
fn make_ready(events: Vec<(NewEvent, Option<Arc<str>>)>, first_seq: i64, shared: &Shared) {
    let states = shared.destinations.load();
    let Ok(mut skip) = shared.skip.lock() else {
        return;
    };
    let mut woken: Vec<&DestinationState> = Vec::new();
    // Per destination: its last seq in the group, its oldest accept time.
    let mut unindexed: Vec<(&DestinationState, i64, u64)> = Vec::new();
    for (seq, (mut event, origin)) in (first_seq..).zip(events) {
        let Some(state) = states.get(&event.destination) else {
            continue;
        };
        if skip.claimed(seq) {
            continue;
        }
        match unindexed
            .iter_mut()
            .find(|(s, ..)| std::ptr::eq(*s, state.as_ref()))
        {
            Some((_, last, oldest)) => {
                *last = seq;
                *oldest = (*oldest).min(event.accepted_ms);
            }
            None => unindexed.push((state, seq, event.accepted_ms)),
        }
        // Looked at before the copy. A destination that is not sending
        // (paused, on probation) finds its events in the index when it
        // sends again, as it would a full queue's; an event behind a
        // failing head of its lane waits there for its turn.
        if !state.sending.load(Ordering::Relaxed)
            || !state.ready.lock().is_ok_and(|r| r.fits(event.size()))
            || state.stalled(seq)
        {
            continue;
        }
        // Its own bytes: the body may be a slice of a large request (an
        // array post, a topic's fan-out), which must not stay alive for one
        // small event. Copied outside the lock the dispatcher takes too.
        event.body = bytes::Bytes::copy_from_slice(&event.body);
        let size = event.size();
        let held = state
            .ready
            .lock()
            .is_ok_and(|mut ready| ready.push(StoredEvent::fresh(seq, event)));
        if !held {
            continue;
        }
        // A delivery from memory is settled by seq: the journal frees
        // these counters by what it handed out, not by what it is told.
        skip.hand(
            seq,
            Handed {
                state: state.clone(),
                size,
                origin,
            },
        );
        if !woken.iter().any(|w| std::ptr::eq(*w, state.as_ref())) {
            woken.push(state);
        }
    }
    // Still under the skip lock: the indexer claims these seqs only after,
    // so it drops these entries once it has committed their rows.
    for (state, last, oldest) in unindexed {
        if let Ok(mut u) = state.unindexed.lock() {
            u.written(last, oldest);
        }
    }
    for state in woken {
        state.fresh.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::trim;

    #[test]
    fn a_buffer_a_burst_grew_is_given_back_once_groups_are_small_again() {
        let keep = 1 << 20;
        let mut buf: Vec<u8> = Vec::with_capacity(keep);
        // A burst: a group of 8 MiB.
        buf.resize(8 << 20, 1);
        trim(&mut buf, 8 << 20, keep);
        assert!(buf.capacity() >= 8 << 20, "a large group's room is kept");
        // Another large one: still kept, no allocation per group.
        buf.clear();
        buf.resize(keep, 1);
        trim(&mut buf, keep, keep);
        assert!(buf.capacity() >= 8 << 20, "kept while groups stay large");
        // Then a small group: the room goes back.
        buf.clear();
        buf.resize(4096, 1);
        trim(&mut buf, 4096, keep);
        assert!(
            buf.capacity() <= keep,
            "kept {} bytes after a small group",
            buf.capacity()
        );
        // Within `keep`: left alone.
        let before = buf.capacity();
        trim(&mut buf, 0, keep);
        assert_eq!(
            buf.capacity(),
            before,
            "a buffer within its keep was trimmed"
        );
    }
}
