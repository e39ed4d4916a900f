//! Reads an event back from its place in the intake log.
//!
//! Why rows point into the log rather than hold the event: the log already
//! holds every event, written once with one fdatasync per group. Copying
//! bodies into SQLite wrote each waiting event twice more (WAL, then the
//! checkpoint), kept every body a second time in `journal.db` (which the
//! start's integrity check reads whole) and made its deletes the largest
//! cost of a drain (benches/RESULTS.md). A row now holds the event's id,
//! destination, method and place in the log; the log's segments stay while
//! a row points into them (`pins`), and a segment mostly delivered has its
//! few waiting events copied into their rows (`Spill::once` (indexer/spill.rs)) so that it
//! can go.

use super::disk::{Disk, LogFile};
use super::intake::{self, Logged, Place};
use std::io;
use std::path::{Path, PathBuf};

/// How much one read of the log takes in once reads go forward: rows read
/// together (a refill of a backlog, a spill) mostly point into one stretch
/// of a segment, so the next events are then in memory, not one `pread`
/// each. Retries due at scattered times read just their event.
const READ_AHEAD: u64 = 64 * 1024;

/// Where rows' events are read from: the intake log's disk and directory.
#[derive(Clone, Copy)]
pub struct Log<'a> {
    pub disk: &'a dyn Disk,
    pub dir: &'a Path,
}

/// The segments one read (of a refill, a spill, an inspection) needs,
/// opened once each. Short-lived on purpose: a handle kept on a segment
/// that was since removed would keep its space from the volume, and the
/// bytes read ahead are as old as the rows that led here.
pub struct Fetch<'a> {
    /// The intake log's disk, as the writer's (tests make it fail).
    disk: &'a dyn Disk,
    dir: PathBuf,
    /// Listed on first use; each opened on first read.
    segments: Option<Vec<Segment>>,
    /// The bytes last read, and the lsn where they start.
    ahead: Vec<u8>,
    ahead_at: u64,
    /// Where the last event asked for ended.
    last_end: u64,
}

/// (start, size, handle once opened, path).
type Segment = (u64, u64, Option<Box<dyn LogFile>>, PathBuf);

impl<'a> Fetch<'a> {
    pub fn new(log: Log<'a>) -> Fetch<'a> {
        Fetch {
            disk: log.disk,
            dir: log.dir.to_path_buf(),
            segments: None,
            ahead: Vec::new(),
            ahead_at: 0,
            last_end: 0,
        }
    }

    /// The event of `seq` at `place`; `None` when its segment is gone or
    /// the bytes there are not that event (damaged, or the segment reused
    /// after the row moved: the caller reads the row again to tell).
    pub fn event(&mut self, place: Place, seq: i64) -> io::Result<Option<Logged>> {
        if self.segments.is_none() {
            let listed = intake::segments_on(self.disk, &self.dir)?
                .into_iter()
                .map(|(start, size, path)| (start, size, None, path))
                .collect();
            self.segments = Some(listed);
        }
        let end = place.at + u64::from(place.len);
        let Some((start, size, file, path)) = self.segments.as_mut().and_then(|s| {
            s.iter_mut()
                .rev()
                .find(|(start, size, _, _)| *start <= place.at && end <= start + size)
        }) else {
            return Ok(None);
        };
        let (start, size) = (*start, *size);
        // Lsns are never reused, and a read ahead stops at its segment's
        // end: bytes held for this span are this segment's.
        let held = place.at >= self.ahead_at && end <= self.ahead_at + self.ahead.len() as u64;
        if !held {
            let file = match file {
                Some(f) => f,
                None => match self.disk.open(path) {
                    Ok(f) => file.insert(f),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(e),
                },
            };
            let forward = (self.last_end..self.last_end + READ_AHEAD).contains(&place.at);
            let want = if forward {
                u64::from(place.len)
                    .max(READ_AHEAD)
                    .min(start + size - place.at)
            } else {
                u64::from(place.len)
            };
            self.ahead.resize(want as usize, 0);
            self.ahead_at = place.at;
            let got = read_at_least(
                &**file,
                &mut self.ahead,
                place.at - start,
                place.len as usize,
            );
            match got {
                Ok(n) => self.ahead.truncate(n),
                Err(e) => {
                    self.ahead.clear();
                    return Err(e);
                }
            }
            if self.ahead.len() < place.len as usize {
                return Ok(None);
            }
        }
        self.last_end = end;
        let from = (place.at - self.ahead_at) as usize;
        let bytes = &self.ahead[from..from + place.len as usize];
        if crc32c::crc32c(bytes) != place.crc {
            return Ok(None);
        }
        Ok(intake::decode_event(start, place.at, bytes).filter(|l| l.seq == seq))
    }
}

/// Reads into `buf` from `offset` until at least `need` bytes are in, or
/// the file ends; returns how many are.
pub(super) fn read_at_least<F: LogFile + ?Sized>(
    file: &F,
    buf: &mut [u8],
    offset: u64,
    need: usize,
) -> io::Result<usize> {
    let mut got = 0;
    // Bounded: each turn reads at least one byte or stops.
    while got < need {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::NewEvent;
    use crate::journal::disk::Real;
    use crate::journal::intake::{LogReader, LogWriter, Read, encode};
    use bytes::Bytes;
    use std::collections::BTreeSet;

    /// Event `i`, with a body of `len` bytes.
    fn event(i: u64, len: usize) -> NewEvent {
        NewEvent {
            id: format!("id-{i}"),
            destination: "orders".into(),
            method: "POST".into(),
            path: format!("/x?i={i}"),
            headers: vec![],
            body: Bytes::from(vec![b'a' + (i % 26) as u8; len]),
            accepted_ms: i,
        }
    }

    /// A log of small events in several records (more than one read ahead
    /// of them), then 1 MiB events, one per record, into a second segment.
    fn log(dir: &Path) -> Vec<Logged> {
        let mut w = LogWriter::open(dir, 0, 1, &BTreeSet::new()).expect("open");
        let mut seq = 1;
        for len in [300, 300, 300, 1 << 20, 1 << 20]
            .into_iter()
            .chain([1 << 20; 14])
        {
            let mut payload = Vec::new();
            let n = if len < 1000 { 100 } else { 1 };
            for _ in 0..n {
                encode(&mut payload, seq, &event(seq as u64, len), false);
                seq += 1;
            }
            w.append(&payload, n as u32, false).expect("append");
        }
        let mut r = LogReader::new(dir);
        let (mut all, mut at) = (Vec::new(), 0);
        for _ in 0..100 {
            match r.read(at).expect("read") {
                Read::Record(events, next) => {
                    all.extend(events);
                    at = next;
                }
                Read::End => break,
            }
        }
        all
    }

    #[test]
    fn events_read_back_whole_in_any_order_across_reads_ahead_and_segments() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let logged = log(tmp.path());
        assert_eq!(logged.len(), 316);
        assert!(
            intake::segments(tmp.path()).expect("list").len() >= 2,
            "the big events reach a second segment"
        );
        let read = |order: &mut dyn Iterator<Item = &Logged>| {
            let mut fetch = Fetch::new(Log {
                disk: &Real,
                dir: tmp.path(),
            });
            for l in order {
                let got = fetch.event(l.place, l.seq).expect("read");
                assert_eq!(
                    got.as_ref().map(|g| (&g.event, g.seq)),
                    Some((&l.event, l.seq))
                );
            }
        };
        read(&mut logged.iter());
        read(&mut logged.iter().rev());
        // Every seventh, then back to the ones skipped: reads ahead that
        // hold some asked-for events and not others.
        read(&mut logged.iter().step_by(7).chain(logged.iter()));
    }

    #[test]
    fn bytes_that_are_not_the_event_read_as_none() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let logged = log(tmp.path());
        let mut fetch = Fetch::new(Log {
            disk: &Real,
            dir: tmp.path(),
        });
        let l = &logged[5];
        let wrong_crc = Place {
            crc: l.place.crc ^ 1,
            ..l.place
        };
        assert_eq!(fetch.event(wrong_crc, l.seq).expect("read"), None);
        assert_eq!(fetch.event(l.place, l.seq + 1).expect("read"), None);
        // Held by the read ahead, still checked.
        let next = &logged[6];
        assert_eq!(
            fetch
                .event(next.place, next.seq)
                .expect("read")
                .map(|g| g.seq),
            Some(next.seq)
        );
        let beyond = Place {
            at: u64::MAX / 2,
            ..next.place
        };
        assert_eq!(fetch.event(beyond, next.seq).expect("read"), None);
    }
}
