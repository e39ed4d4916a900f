//! Reads an event back from its place in the intake log.
//!
//! Why rows point into the log rather than hold the event: the log already
//! holds every event, written once with one fdatasync per group. Copying
//! bodies into SQLite wrote each waiting event twice more (WAL, then the
//! checkpoint), made `journal.db` 1.39× the bodies (a 1M backlog: disk
//! 1.54×, the start's integrity check 0.7 s) and its deletes the largest
//! cost of a drain (bench/RESULTS.md). A row is now ~100 bytes; the log's
//! segments stay while a row points into them (`pins`), and a segment
//! mostly delivered has its few waiting events copied into their rows
//! (`Indexer::spill`) so that it can go.

use super::intake::{self, Logged, Place};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The segments one read (of a refill, a spill, an inspection) needs,
/// opened once each. Short-lived on purpose: a handle kept on a segment
/// that was since removed would keep its space from the volume.
pub struct Fetch {
    dir: PathBuf,
    /// Listed on first use; each opened on first read.
    segments: Option<Vec<Segment>>,
}

/// (start, size, handle once opened, path).
type Segment = (u64, u64, Option<File>, PathBuf);

impl Fetch {
    pub fn new(dir: &Path) -> Fetch {
        Fetch {
            dir: dir.to_path_buf(),
            segments: None,
        }
    }

    /// The event of `seq` at `place`; `None` when its segment is gone or
    /// the bytes there are not that event (damaged, or the segment reused
    /// after the row moved: the caller reads the row again to tell).
    pub fn event(&mut self, place: Place, seq: i64) -> io::Result<Option<Logged>> {
        if self.segments.is_none() {
            let listed = intake::segments(&self.dir)?
                .into_iter()
                .map(|(start, size, path)| (start, size, None, path))
                .collect();
            self.segments = Some(listed);
        }
        let end = place.at + u64::from(place.len);
        let Some((start, _, file, path)) = self.segments.as_mut().and_then(|s| {
            s.iter_mut()
                .rev()
                .find(|(start, size, _, _)| *start <= place.at && end <= start + size)
        }) else {
            return Ok(None);
        };
        let file = match file {
            Some(f) => f,
            None => match File::open(&*path) {
                Ok(f) => file.insert(f),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            },
        };
        let mut bytes = vec![0u8; place.len as usize];
        match file.read_exact_at(&mut bytes, place.at - *start) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        if crc32c::crc32c(&bytes) != place.crc {
            return Ok(None);
        }
        Ok(intake::decode_event(*start, place.at, &bytes).filter(|l| l.seq == seq))
    }
}
