//! The intake log: where an accepted event becomes durable before its 202.
//!
//! Why it exists, and why it is written by hand: a SQLite commit of a group
//! writes a separate 4 KiB WAL frame for every page it touches and fsyncs
//! them, and inserting rows costs the writer CPU per event; together they
//! capped acceptance. Appending the group as ONE write into preallocated
//! space and calling fdatasync once costs a small part of that commit
//! (benches/RESULTS.md).
//! The rows are then added to SQLite by the indexer thread, off the
//! acceptance path; this log keeps every event the indexer has not yet made
//! durable in SQLite. No crate gives this shape (one positional write per
//! group on the caller's thread, positions that SQLite transactions record,
//! segments recycled once SQLite has synced past them).
//!
//! Layout: segment files `intake-<start lsn, hex>.log`, each preallocated.
//! The log sequence number (lsn) is a byte position that grows across
//! segments; a record that does not fit a segment's rest goes to the start
//! of the next segment (at `start + size`). A record is
//! `[magic u32][payload len u32][lsn u64][crc32c u32][events u32][payload]`,
//! and the next one starts at the next multiple of 8 bytes. The write also
//! puts zeros up to the end of its last 4 KiB page, which the next record
//! then overwrites: a write of part of a page that is not in memory would
//! make the kernel read it from disk first (a recycled segment's pages are
//! not), and the zeros make the bytes after the last record read as "end
//! of log". The lsn inside the header is what makes a recycled segment's
//! old records read so too.
//!
//! Records used to be padded to 4 KiB each (magic "CRR1", still read): a
//! group of one 1 KiB event, what an app sending one webhook at a time
//! makes, took 4 KiB of the log, so its segments were mostly padding and
//! the indexer's spill copied every waiting event into SQLite, where now
//! they stay in the log (benches/RESULTS.md). The cost: the last page of an
//! acknowledged record is written to disk again, with the same bytes plus
//! the next record's. That is safe under "powersafe overwrite" (a power
//! loss during a write changes no byte outside the range written: disks
//! write each sector whole), which SQLite assumes by default and
//! PostgreSQL's WAL relies on too. On a device that could tear a sector,
//! the record would fail its CRC at the next start, and the start would
//! report its events lost (the mark), never skip them silently.
//!
//! A log that holds "CRR2" records is not read by builds before it: roll
//! back only after a clean stop, which leaves nothing unindexed.
//!
//! An event's body may be stored compressed, its length word's top bit
//! set (`pack`, for events that will wait); its place and CRC cover the
//! compressed bytes, and every read gives the body as it came.
//!
//! Events adopted from another courier's hand-off (docs/object-storage.md) go in records
//! of their own, "CRC1": each event as in "CRR2", then its delivery state
//! so far (`Carried`, length-prefixed JSON), so that the event and where
//! its delivery stood are durable in one write. An event's place covers its
//! encoding only, which reads back the same from either kind.
//!
//! A record lost at the tail (a truncated or deleted segment, a damaged last
//! record) reads as a clean end. So after every commit the writer also puts
//! the log's acknowledged end in `intake.mark`, a file of its own that no
//! damage to a segment can shorten: a start that finds the log ending before
//! the mark knows that acknowledged events are gone, and says so.

use super::disk::{self, Disk, LogFile, Real};
use super::pack;
use super::record::{Carried, encode_headers, encoded_headers};
use crate::event::{Header, NewEvent, endpoint};
use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MAGIC: u32 = 0x4352_5232; // "CRR2"
/// The records of logs written before "CRR2", each padded to `PAGE`.
const MAGIC_PADDED: u32 = 0x4352_5231; // "CRR1"
/// Records of adopted events, each followed by its `Carried` state.
const MAGIC_CARRIED: u32 = 0x4352_4331; // "CRC1"
const HEADER: usize = 24;
/// Where records start: a multiple of this past their segment's start.
const ALIGN: u64 = 8;
const PAGE: u64 = 4096;
/// Size of a new segment; a group larger than this gets a segment of its own size.
pub const SEGMENT: u64 = 16 * 1024 * 1024;
/// Recycled segments kept for reuse; overwriting written blocks avoids the
/// metadata updates that make fdatasync slow on fresh extents.
const SPARES: usize = 2;

/// An event as the log holds it: the journal row's seq and the event.
#[derive(Debug, Clone, PartialEq)]
pub struct Logged {
    pub seq: i64,
    pub event: NewEvent,
    /// The headers as encoded in the record (and in the journal row), so
    /// the indexer does not encode them again.
    pub encoded_headers: Vec<u8>,
    /// The origin of the endpoint it names (`url: per_event`), read from
    /// `encoded_headers` by the index's read (`Bodies::Skip`), which keeps
    /// no headers; a whole read's event names it in its own
    /// (`endpoint::url_of`), and its readers take it from there.
    pub endpoint: Option<String>,
    /// Where the event's encoding lies in the log: a journal row keeps this
    /// place rather than a copy of the event (`fetch`).
    pub place: Place,
    /// The start of the segment holding it, which stays while rows point
    /// into it.
    pub segment: u64,
    /// An adopted event's delivery so far ("CRC1" records).
    pub carried: Option<Carried>,
    /// The body's length, also when it was not kept (`Bodies::Skip`);
    /// its raw length when it is packed.
    pub body_len: usize,
    /// Whether the body is stored compressed (`pack`): then `place.len`
    /// no longer tells the event's size, and its row keeps that.
    pub packed: bool,
}

impl Logged {
    /// What the event counts against `journal.max_bytes`, whether or not
    /// its body was kept.
    pub fn size(&self) -> u64 {
        // `NewEvent::size`, with each header's 6 bytes of lengths as encoded.
        let e = &self.event;
        (self.body_len + self.encoded_headers.len() + e.path.len() + e.id.len()) as u64
    }
}

/// Whether a read of the log keeps the events' bodies and their headers
/// decoded. The indexer's does not: its rows point into the log, and a
/// chunk it read to catch up held a copy of every body, 5 MiB of the peak
/// of a backlog's fill (benches/RESULTS.md); of the headers it needs only
/// the endpoint (`Logged::endpoint`), and copying each one was 5 of the
/// ~90 allocations an event took (uprobes, benches/RESULTS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bodies {
    Keep,
    Skip,
}

/// One event's encoding in the log: its lsn, length and CRC32C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub at: u64,
    pub len: u32,
    pub crc: u32,
}

/// The mark's file name, beside the segments.
pub const MARK: &str = "intake.mark";
const MARK_MAGIC: u32 = 0x4352_4d31; // "CRM1"
/// A mark's bytes: magic, CRC, end, next seq.
const MARK_LEN: usize = 24;

/// What the writer had acknowledged when it last wrote the mark: the log's
/// end after the last synced record, and the seq the next event would get.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mark {
    pub end: u64,
    pub next_seq: i64,
}

impl Mark {
    fn encode(&self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[0..4].copy_from_slice(&MARK_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.end.to_le_bytes());
        b[16..24].copy_from_slice(&self.next_seq.to_le_bytes());
        let crc = crc32c::crc32c(&b[8..24]);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `None` for anything but a whole mark (a missing or torn file).
    fn decode(b: &[u8]) -> Option<Mark> {
        let b: &[u8; MARK_LEN] = b.get(..MARK_LEN)?.try_into().ok()?;
        let [m0, m1, m2, m3, c0, c1, c2, c3, rest @ ..] = *b;
        let [e0, e1, e2, e3, e4, e5, e6, e7, s @ ..] = rest;
        if u32::from_le_bytes([m0, m1, m2, m3]) != MARK_MAGIC
            || u32::from_le_bytes([c0, c1, c2, c3]) != crc32c::crc32c(&rest)
        {
            return None;
        }
        Some(Mark {
            end: u64::from_le_bytes([e0, e1, e2, e3, e4, e5, e6, e7]),
            next_seq: i64::from_le_bytes(s),
        })
    }

    /// The mark in `dir`: `Ok(None)` when there is none (a journal that
    /// never wrote one); `Err` only when it exists and cannot be read.
    pub fn read(dir: &Path) -> io::Result<Option<Mark>> {
        Mark::read_on(&Real, dir)
    }

    pub(crate) fn read_on(disk: &dyn Disk, dir: &Path) -> io::Result<Option<Mark>> {
        match disk.read(&dir.join(MARK)) {
            // Shorter than a mark: made at a start that stopped before its
            // first write, when nothing was acknowledged yet.
            Ok(b) if b.len() < MARK_LEN => {
                tracing::warn!(file = %dir.join(MARK).display(), bytes = b.len(), "intake.mark was created but never written; taken as no mark");
                Ok(None)
            }
            Ok(b) => match Mark::decode(&b) {
                Some(m) => Ok(Some(m)),
                None => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is damaged", dir.join(MARK).display()),
                )),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The segment that holds (or should hold) `lsn`: the last one starting at
/// or before it; the one after it when that one is whole and `lsn` is its
/// end; or the name it would have.
pub fn segment_for(dir: &Path, lsn: u64) -> PathBuf {
    match segments(dir)
        .ok()
        .and_then(|s| s.into_iter().rev().find(|(start, _, _)| *start <= lsn))
    {
        Some((start, size, _)) if size >= SEGMENT && lsn >= start + size => {
            dir.join(name(start + size))
        }
        Some((_, _, path)) => path,
        None => dir.join(name(lsn)),
    }
}

pub(super) fn name(start: u64) -> String {
    format!("intake-{start:016x}.log")
}

fn parse_name(file: &str) -> Option<u64> {
    let hex = file.strip_prefix("intake-")?.strip_suffix(".log")?;
    u64::from_str_radix(hex, 16).ok()
}

/// The segments in `dir`, ordered by start lsn, with their sizes.
pub fn segments(dir: &Path) -> io::Result<Vec<(u64, u64, PathBuf)>> {
    segments_on(&Real, dir)
}

/// The same, as `disk` lists them. The writer renames spare segments
/// while the indexer lists: a name that is gone was a spare, never a
/// segment still to read (`Disk::list` leaves it out).
pub(crate) fn segments_on(disk: &dyn Disk, dir: &Path) -> io::Result<Vec<(u64, u64, PathBuf)>> {
    let mut out: Vec<(u64, u64, PathBuf)> = disk
        .list(dir)?
        .into_iter()
        .filter_map(|(path, len)| {
            let start = path.file_name()?.to_str().and_then(parse_name)?;
            Some((start, len, path))
        })
        .collect();
    out.sort_by_key(|s| s.0);
    Ok(out)
}

/// Why `sync_segments` failed: the segments could not be found or opened
/// (which may pass), or an fdatasync failed (which never is retried).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SyncError {
    #[error(transparent)]
    Find(io::Error),
    #[error(transparent)]
    Sync(io::Error),
}

/// fdatasync of every segment holding a byte between `from` and `to`
/// (with `sync: os`, before rows point into them). A segment gone meanwhile
/// was a spare renamed away: no row points there.
pub(crate) fn sync_segments(
    disk: &dyn Disk,
    dir: &Path,
    from: u64,
    to: u64,
) -> Result<(), SyncError> {
    for (start, size, path) in segments_on(disk, dir).map_err(SyncError::Find)? {
        if start >= to || start + size <= from {
            continue;
        }
        match disk.open(&path) {
            Ok(file) => file.sync_data().map_err(SyncError::Sync)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(SyncError::Find(e)),
        }
    }
    Ok(())
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Appends the encoding of one event to a group's payload; `pack`: with
/// its body compressed if that saves space (`pack`), for an event that
/// will wait.
pub fn encode(out: &mut Vec<u8>, seq: i64, e: &NewEvent, pack: bool) {
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&e.accepted_ms.to_le_bytes());
    for part in [
        e.id.as_bytes(),
        e.destination.as_bytes(),
        e.method.as_bytes(),
        e.path.as_bytes(),
    ] {
        put_bytes(out, part);
    }
    put_bytes(out, &encode_headers(&e.headers));
    if !(pack && pack::put_packed(out, &e.body)) {
        put_bytes(out, &e.body);
    }
}

/// An adopted event's state, after its encoding in a "CRC1" record.
pub fn encode_carried(out: &mut Vec<u8>, carried: &Carried) {
    // A plain struct of numbers and strings: serializing cannot fail.
    let json = serde_json::to_vec(carried).unwrap_or_default();
    put_bytes(out, &json);
}

#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq)]
#[error("malformed event {index} in the record at lsn {lsn}")]
pub struct Malformed {
    lsn: u64,
    index: usize,
}

/// The fewest bytes one encoded event takes: seq, accepted_ms and six lengths.
const MIN_EVENT: usize = 8 + 8 + 6 * 4;

/// Whether a decode reads packed bodies (`pack`). The log's own reads do.
/// A hand-off object (`handoff::object`, the same encoding) never holds one,
/// as no courier writes one there, and comes from a bucket: one there is
/// refused before it is unpacked, since 1 MiB of LZ4 can name 256 MiB of
/// body and the adopter's memory bound counts stored bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packed {
    Read,
    Refuse,
}

/// The events of the record at `lsn` in the segment starting at `segment`;
/// `carried`: a "CRC1" record, whose events are each followed by their state.
pub fn decode(
    segment: u64,
    lsn: u64,
    payload: &[u8],
    count: usize,
    carried: bool,
    packed: Packed,
) -> Result<Vec<Logged>, Malformed> {
    decode_record(segment, lsn, payload, count, carried, Bodies::Keep, packed)
}

fn decode_record(
    segment: u64,
    lsn: u64,
    payload: &[u8],
    count: usize,
    carried: bool,
    bodies: Bodies,
    packed: Packed,
) -> Result<Vec<Logged>, Malformed> {
    // `count` comes from the record header: a damaged one whose CRC still
    // matches must not reserve memory for billions of events (found by
    // fuzz/intake_decode); the payload cannot hold more than this.
    let mut out = Vec::with_capacity(count.min(payload.len() / MIN_EVENT));
    let mut offset = 0;
    for index in 0..count {
        let at = lsn + HEADER as u64 + offset as u64;
        let (mut logged, used) = decode_one(segment, at, &payload[offset..], bodies, packed)
            .ok_or(Malformed { lsn, index })?;
        offset += used;
        if carried {
            let (state, used) =
                decode_carried(&payload[offset..]).ok_or(Malformed { lsn, index })?;
            logged.carried = Some(state);
            offset += used;
        }
        out.push(logged);
    }
    if offset == payload.len() {
        Ok(out)
    } else {
        Err(Malformed { lsn, index: count })
    }
}

/// The one event encoded exactly in `bytes`, which `fetch` read back from
/// its place at `at`; `None` when they do not hold exactly one.
pub fn decode_event(segment: u64, at: u64, bytes: &[u8]) -> Option<Logged> {
    match decode_one(segment, at, bytes, Bodies::Keep, Packed::Read)? {
        (logged, used) if used == bytes.len() => Some(logged),
        _ => None,
    }
}

/// The state at the start of `p` and the bytes it took.
fn decode_carried(p: &[u8]) -> Option<(Carried, usize)> {
    let len = u32::from_le_bytes(p.get(..4)?.try_into().ok()?) as usize;
    let json = p.get(4..4 + len)?;
    Some((serde_json::from_slice(json).ok()?, 4 + len))
}

/// The event at the start of `p` and the bytes it took.
fn decode_one(
    segment: u64,
    at: u64,
    whole: &[u8],
    bodies: Bodies,
    allow: Packed,
) -> Option<(Logged, usize)> {
    let mut p = whole;
    let mut take = |n: usize| -> Option<&[u8]> {
        if p.len() < n {
            return None;
        }
        let (head, rest) = p.split_at(n);
        p = rest;
        Some(head)
    };
    let seq = i64::from_le_bytes(take(8)?.try_into().ok()?);
    let accepted_ms = u64::from_le_bytes(take(8)?.try_into().ok()?);
    // The parts in their encoded order; the body is the last.
    let mut parts: [Vec<u8>; 6] = Default::default();
    let body_part = parts.len() - 1;
    let (mut body_len, mut packed) = (0, false);
    for (i, part) in parts.iter_mut().enumerate() {
        let word = u32::from_le_bytes(take(4)?.try_into().ok()?);
        // Only a body is ever packed; in another part the bit reads as a
        // length no record holds, and the take fails.
        if i == body_part && word & pack::PACKED != 0 {
            if allow == Packed::Refuse {
                return None;
            }
            let bytes = take((word & !pack::PACKED) as usize)?;
            packed = true;
            body_len = pack::raw_len(bytes)?;
            if bodies == Bodies::Keep {
                *part = pack::unpack(bytes)?;
            }
            continue;
        }
        let bytes = take(word as usize)?;
        if i == body_part {
            body_len = bytes.len();
            if bodies == Bodies::Skip {
                continue;
            }
        }
        *part = bytes.to_vec();
    }
    let used = whole.len() - p.len();
    let [id, destination, method, path, headers, body] = parts;
    let text = |v: Vec<u8>| String::from_utf8(v).ok();
    // One walk, checking the block whole in either read; the headers are
    // copied only when the body is kept. The first URL header names the
    // endpoint, as `endpoint::url_of` reads a decoded event (where the
    // request goes, and its share).
    let mut url: Option<&[u8]> = None;
    let mut decoded: Vec<Header> = Vec::new();
    for h in encoded_headers(&headers) {
        let (name, value) = h.ok()?;
        if url.is_none() && name == endpoint::URL_HEADER {
            url = Some(value);
        }
        if bodies == Bodies::Keep {
            decoded.push((name.to_string(), value.to_vec()));
        }
    }
    let endpoint = url
        .filter(|_| bodies == Bodies::Skip)
        .and_then(|u| std::str::from_utf8(u).ok())
        .and_then(endpoint::stored_origin);
    let encoding = &whole[..used];
    Some((
        Logged {
            seq,
            endpoint,
            encoded_headers: headers,
            place: Place {
                at,
                len: u32::try_from(used).ok()?,
                crc: crc32c::crc32c(encoding),
            },
            segment,
            carried: None,
            body_len,
            packed,
            event: NewEvent {
                id: text(id)?,
                destination: text(destination)?,
                method: text(method)?,
                path: text(path)?,
                headers: decoded,
                body: body.into(),
                accepted_ms,
            },
        },
        used,
    ))
}

/// The bytes a record of `len` payload bytes takes in the log.
fn span(len: usize) -> u64 {
    ((HEADER + len) as u64).next_multiple_of(ALIGN)
}

/// The same for a "CRR1" record.
fn padded(len: usize) -> u64 {
    ((HEADER + len) as u64).next_multiple_of(PAGE)
}

/// A record's header: `[magic u32][payload len u32][lsn u64][crc32c u32][events u32]`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Head {
    magic: u32,
    len: u32,
    lsn: u64,
    crc: u32,
    count: u32,
}

impl Head {
    fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.lsn.to_le_bytes());
        b[16..20].copy_from_slice(&self.crc.to_le_bytes());
        b[20..24].copy_from_slice(&self.count.to_le_bytes());
        b
    }

    /// The header at the start of `b`, if `b` holds one whole and it has
    /// one of the magics; whether the record is valid is for its lsn and
    /// CRC to say.
    fn decode(b: &[u8]) -> Option<Head> {
        let b: &[u8; HEADER] = b.get(..HEADER)?.try_into().ok()?;
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut lsn = [0u8; 8];
        lsn.copy_from_slice(&b[8..16]);
        let head = Head {
            magic: word(0),
            len: word(4),
            lsn: u64::from_le_bytes(lsn),
            crc: word(16),
            count: word(20),
        };
        head.span().map(|_| head)
    }

    /// The bytes the record takes in the log, by its magic's layout.
    fn span(&self) -> Option<u64> {
        match self.magic {
            MAGIC | MAGIC_CARRIED => Some(span(self.len as usize)),
            MAGIC_PADDED => Some(padded(self.len as usize)),
            _ => None,
        }
    }
}

pub(super) fn is_disk_full(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT)
}

/// Errors that pass by themselves: out of descriptors or memory for a
/// moment, an interrupted call. Nothing was written that could be taken
/// for a record, so the same append can simply be tried again.
pub(super) fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EINTR | libc::EAGAIN)
    )
}

/// Why an append failed: the disk is full or a transient error (nothing
/// was written that could be taken for a record, try later), or anything
/// else (refuse writes).
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("the disk is full")]
    DiskFull,
    #[error("a group of events over 4 GiB")]
    TooLarge,
    #[error("{0}")]
    Transient(io::Error),
    #[error(transparent)]
    Io(io::Error),
}

impl From<io::Error> for AppendError {
    fn from(e: io::Error) -> AppendError {
        if is_disk_full(&e) {
            AppendError::DiskFull
        } else if is_transient(&e) {
            AppendError::Transient(e)
        } else {
            AppendError::Io(e)
        }
    }
}

struct Segment {
    start: u64,
    size: u64,
    file: Box<dyn LogFile>,
}

/// The writing end, owned by the journal's writer thread.
pub struct LogWriter {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    current: Option<Segment>,
    /// The lsn of the next record.
    pos: u64,
    /// Segments before `current`, oldest first: (start, size).
    retired: Vec<(u64, u64)>,
    spares: Vec<PathBuf>,
    mark: Box<dyn LogFile>,
}

impl LogWriter {
    /// A writer that starts a fresh segment at `pos`. Existing segment files
    /// that end at or before `pos` become spares (the caller has made their
    /// records durable elsewhere), unless journal rows still point into
    /// them (`pinned`, by start). The mark is set to `pos` and `next_seq`
    /// and synced first, so it never claims more than the log will hold.
    pub fn open(
        dir: &Path,
        pos: u64,
        next_seq: i64,
        pinned: &BTreeSet<u64>,
    ) -> io::Result<LogWriter> {
        LogWriter::open_on(disk::real(), dir, pos, next_seq, pinned)
    }

    /// The same, on `disk`.
    pub(crate) fn open_on(
        disk: Arc<dyn Disk>,
        dir: &Path,
        pos: u64,
        next_seq: i64,
        pinned: &BTreeSet<u64>,
    ) -> io::Result<LogWriter> {
        let mut spares = Vec::new();
        let mut retired = Vec::new();
        for (start, size, path) in segments_on(&*disk, dir)? {
            if start + size > pos {
                return Err(io::Error::other(format!(
                    "{} reaches past the position {pos} the log resumes at",
                    path.display()
                )));
            }
            if pinned.contains(&start) {
                retired.push((start, size));
            } else if spares.len() < SPARES && size >= SEGMENT {
                spares.push(path);
            } else {
                disk.remove(&path)?;
            }
        }
        let mark = disk.open_rw(&dir.join(MARK))?;
        let writer = LogWriter {
            disk,
            dir: dir.to_path_buf(),
            current: None,
            pos,
            retired,
            spares,
            mark,
        };
        writer.acknowledge(Mark { end: pos, next_seq })?;
        writer.mark.sync_all()?;
        writer.disk.open(dir)?.sync_all()?;
        Ok(writer)
    }

    /// Records that everything up to `mark.end` is acknowledged. One small
    /// write in place, not synced: it must outlive the process, not the
    /// machine, and after a power loss a lagging mark only claims less.
    pub fn acknowledge(&self, mark: Mark) -> io::Result<()> {
        self.mark.write_all_at(&mark.encode(), 0)
    }

    /// The lsn after the last record written.
    pub fn end(&self) -> u64 {
        self.pos
    }

    /// Writes one record holding `count` events encoded in `payload`;
    /// returns the lsn after it. Not durable until `sync`.
    /// Writes one record of `count` events; `carried`: adopted events, each
    /// followed by its state ("CRC1").
    pub fn append(
        &mut self,
        payload: &[u8],
        count: u32,
        carried: bool,
    ) -> Result<u64, AppendError> {
        let magic = if carried { MAGIC_CARRIED } else { MAGIC };
        if u32::try_from(payload.len()).is_err() {
            return Err(AppendError::TooLarge);
        }
        let need = span(payload.len());
        let fits = self
            .current
            .as_ref()
            .is_some_and(|s| self.pos + need <= s.start + s.size);
        if !fits {
            // The new segment becomes current only once the record is in
            // it: after a failed write the next group still goes where the
            // reader looks for it (the rest of the old segment).
            let next = self.next_segment(need)?;
            write_record(&next, 0, next.start, magic, payload, count)?;
            self.pos = next.start + need;
            if let Some(old) = self.current.replace(next) {
                self.retired.push((old.start, old.size));
            }
            return Ok(self.pos);
        }
        let Some(seg) = &self.current else {
            return Err(AppendError::Io(io::Error::other("no segment")));
        };
        let lsn = self.pos;
        write_record(seg, lsn - seg.start, lsn, magic, payload, count)?;
        self.pos = lsn + need;
        Ok(self.pos)
    }

    /// fdatasync of the current segment: every record written is durable.
    pub fn sync(&self) -> io::Result<()> {
        match &self.current {
            Some(seg) => seg.file.sync_data(),
            None => Ok(()),
        }
    }

    /// Segments wholly before `durable` (whose events SQLite has synced)
    /// and holding no pending event (`pinned` lists those that do) are kept
    /// as spares or removed. On a full disk (`keep` false) none is kept:
    /// the space goes back.
    ///
    /// A segment that cannot be removed stays listed, to be tried at the
    /// next call, and the others go on; the first error is returned.
    pub fn recycle(&mut self, durable: u64, keep: bool, pinned: &BTreeSet<u64>) -> io::Result<()> {
        let mut failed = None;
        let mut i = 0;
        while let Some(&(start, size)) = self.retired.get(i) {
            if start + size > durable {
                break;
            }
            if pinned.contains(&start) {
                i += 1;
                continue;
            }
            let path = self.dir.join(name(start));
            // A small segment (made on a nearly full disk) is not worth keeping.
            if keep && self.spares.len() < SPARES && size >= SEGMENT {
                self.spares.push(path);
            } else {
                // Forgotten only once gone: a removal that failed is
                // tried again at the next group, not left on the volume.
                match self.disk.remove(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => {
                        failed.get_or_insert(e);
                        i += 1;
                        continue;
                    }
                }
            }
            self.retired.remove(i);
        }
        failed.map_or(Ok(()), Err)
    }

    /// On a full disk, the spares' space is better given back.
    pub fn drop_spares(&mut self) {
        for path in self.spares.drain(..) {
            let _ = self.disk.remove(&path);
        }
    }

    /// The segment after the current one, created (or a spare renamed)
    /// with its name durable, not yet current.
    fn next_segment(&mut self, need: u64) -> Result<Segment, AppendError> {
        let start = match &self.current {
            Some(s) => s.start + s.size,
            None => self.pos,
        };
        let size = need.div_ceil(PAGE).saturating_mul(PAGE).max(SEGMENT);
        let path = self.dir.join(name(start));
        let file = match self.take_spare(size, &path)? {
            Some(f) => f,
            None => create(&*self.disk, &path, size, need)?,
        };
        // The new name must survive a crash before any record in it is
        // acknowledged. A failed fsync of the directory is a failed fsync:
        // whatever its errno (ENOSPC too), a retry that succeeds proves
        // nothing about what the first one dropped, so it fails the
        // journal as the segment's fdatasync would.
        self.disk
            .open(&self.dir)?
            .sync_all()
            .map_err(AppendError::Io)?;
        let size = file.len()?;
        Ok(Segment { start, size, file })
    }

    fn take_spare(&mut self, size: u64, path: &Path) -> io::Result<Option<Box<dyn LogFile>>> {
        let Some(i) = self
            .spares
            .iter()
            .position(|p| self.disk.len(p).is_ok_and(|len| len >= size))
        else {
            return Ok(None);
        };
        let spare = self.spares.remove(i);
        self.disk.rename(&spare, path)?;
        Ok(Some(self.disk.open_rw(path)?))
    }
}

/// Writes the record for `payload` at `lsn`, at `offset` in `segment`, and
/// zeros to the end of its last page (or of the segment): header, payload
/// and zeros as one `pwritev`, so the group's bytes are not copied once
/// more into a frame (that copy showed in the writer's profile under load,
/// and the writer's turn is every 202's wait).
fn write_record(
    segment: &Segment,
    offset: u64,
    lsn: u64,
    magic: u32,
    payload: &[u8],
    count: u32,
) -> io::Result<()> {
    static ZEROS: [u8; PAGE as usize] = [0; PAGE as usize];
    let file = &segment.file;
    let header = Head {
        magic,
        len: payload.len() as u32,
        lsn,
        crc: record_crc(lsn, count, payload),
        count,
    }
    .encode();
    // The record fits the segment (the caller checked): the zeros stop at
    // the page's end or the segment's, whichever is first, < PAGE bytes.
    let end = offset + (HEADER + payload.len()) as u64;
    let pad = (end.next_multiple_of(PAGE).min(segment.size) - end) as usize;
    let mut parts: [&[u8]; 3] = [&header, payload, &ZEROS[..pad]];
    let mut at = offset;
    // Bounded: each turn writes at least one byte or returns.
    while parts.iter().any(|p| !p.is_empty()) {
        let n = match file.write_parts_at(&parts, at) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let mut left = n;
        at += left as u64;
        for p in &mut parts {
            let k = left.min(p.len());
            *p = &p[k..];
            left -= k;
        }
    }
    Ok(())
}

/// A new segment of `size` bytes, allocated up front so that records never
/// change the file's size; on a nearly full disk, one of just `need` bytes.
fn create(
    disk: &dyn Disk,
    path: &Path,
    size: u64,
    need: u64,
) -> Result<Box<dyn LogFile>, AppendError> {
    let file = disk.create(path)?;
    for len in [size, need] {
        match file.allocate(len) {
            Ok(()) => return Ok(file),
            Err(e) if is_disk_full(&e) => continue,
            Err(e) => {
                let _ = disk.remove(path);
                return Err(e.into());
            }
        }
    }
    let _ = disk.remove(path);
    Err(AppendError::DiskFull)
}

fn record_crc(lsn: u64, count: u32, payload: &[u8]) -> u32 {
    let c = crc32c::crc32c(&lsn.to_le_bytes());
    let c = crc32c::crc32c_append(c, &(payload.len() as u32).to_le_bytes());
    let c = crc32c::crc32c_append(c, &count.to_le_bytes());
    crc32c::crc32c_append(c, payload)
}

/// What reading at an lsn found.
#[derive(Debug, PartialEq)]
pub enum Read {
    /// A record: its events and the lsn after it.
    Record(Vec<Logged>, u64),
    /// No record here or after: the end of the log.
    End,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error(
        "the intake log record at position {lsn} in {file} is damaged, but records after it exist"
    )]
    Corrupt { lsn: u64, file: PathBuf },
    #[error("in {file}: {source}")]
    Malformed { file: PathBuf, source: Malformed },
}

/// The reading end: the indexer follows the writer with it, and recovery
/// reads what SQLite had not yet made durable.
pub struct LogReader {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    current: Option<(Segment, PathBuf)>,
    bodies: Bodies,
    /// A record's payload, read into the same buffer each time: the
    /// indexer reads every record back, and a buffer made per record was
    /// an allocation per record. Kept up to `KEEP_PAYLOAD`.
    payload: std::cell::Cell<Vec<u8>>,
}

/// The most a payload buffer keeps between records, the writer's and a
/// reader's alike: a burst of large groups (big events, array posts) grows
/// one towards the writer's `MAX_GROUP_BYTES` or past it, and keeping that
/// would hold the memory for the life of the process. A reader's is given
/// back at once past it, where the writer's waits for a small group
/// (`writer::trim`): the indexer reads a large record once, the writer
/// writes a load of them.
pub(super) const KEEP_PAYLOAD: usize = 1 << 20;

impl LogReader {
    pub fn new(dir: &Path) -> LogReader {
        LogReader::on(disk::real(), dir)
    }

    /// A reader of the log in `dir` on `disk`.
    pub(crate) fn on(disk: Arc<dyn Disk>, dir: &Path) -> LogReader {
        LogReader {
            disk,
            dir: dir.to_path_buf(),
            current: None,
            bodies: Bodies::Keep,
            payload: Default::default(),
        }
    }

    /// A reader whose events come without their bodies (`Bodies::Skip`).
    pub(crate) fn without_bodies(self) -> LogReader {
        LogReader {
            bodies: Bodies::Skip,
            ..self
        }
    }

    /// Reads the record at `lsn`. A damaged record followed by valid ones is
    /// corruption, never taken for the end: acknowledged events lie after it.
    pub fn read(&mut self, lsn: u64) -> Result<Read, ReadError> {
        let Some((start, size)) = self.locate(lsn)? else {
            return self.end(lsn);
        };
        if let Some(r) = self.record_at(lsn)? {
            return Ok(r);
        }
        if self.later_record_in_segment(lsn)? {
            return Err(self.corrupt(lsn));
        }
        // The rest of a segment after its last record is skipped when the
        // next record did not fit: the log goes on at the next segment's
        // start. Only if it really could not have fitted here; otherwise
        // the record here is damaged.
        let next = start + size;
        if self.locate(next)?.is_some()
            && let Some(Read::Record(events, after)) = self.record_at(next)?
        {
            if after - next <= next - lsn {
                self.locate(lsn)?;
                return Err(self.corrupt(lsn));
            }
            return Ok(Read::Record(events, after));
        }
        self.locate(lsn)?;
        self.end(lsn)
    }

    /// Nothing valid at `lsn`: the end of the log, unless a later segment
    /// starts with a valid record (a segment lost or damaged in between).
    fn end(&mut self, lsn: u64) -> Result<Read, ReadError> {
        for (start, _, path) in segments_on(&*self.disk, &self.dir)? {
            if start > lsn && self.locate(start)?.is_some() && self.record_at(start)?.is_some() {
                return Err(ReadError::Corrupt { lsn, file: path });
            }
        }
        Ok(Read::End)
    }

    fn corrupt(&self, lsn: u64) -> ReadError {
        ReadError::Corrupt {
            lsn,
            file: self
                .current
                .as_ref()
                .map(|c| c.1.clone())
                .unwrap_or_else(|| self.dir.clone()),
        }
    }

    /// Opens the segment holding `lsn`; `None` when there is none.
    fn locate(&mut self, lsn: u64) -> io::Result<Option<(u64, u64)>> {
        if let Some((s, _)) = &self.current
            && s.start <= lsn
            && lsn < s.start + s.size
        {
            return Ok(Some((s.start, s.size)));
        }
        self.current = None;
        let found = segments_on(&*self.disk, &self.dir)?
            .into_iter()
            .rev()
            .find(|(start, size, _)| *start <= lsn && lsn < start + size);
        let Some((start, size, path)) = found else {
            return Ok(None);
        };
        let file = match self.disk.open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        self.current = Some((Segment { start, size, file }, path));
        Ok(Some((start, size)))
    }

    /// The valid record at `lsn` in the current segment, if there is one.
    fn record_at(&self, lsn: u64) -> Result<Option<Read>, ReadError> {
        let Some((seg, path)) = &self.current else {
            return Ok(None);
        };
        let offset = lsn - seg.start;
        if offset + HEADER as u64 > seg.size {
            return Ok(None);
        }
        let mut bytes = [0u8; HEADER];
        seg.file.read_exact_at(&mut bytes, offset)?;
        let Some((head, span)) = Head::decode(&bytes).and_then(|h| Some((h, h.span()?))) else {
            return Ok(None);
        };
        if head.lsn != lsn || offset + HEADER as u64 + u64::from(head.len) > seg.size {
            return Ok(None);
        }
        let mut payload = self.payload.take();
        payload.clear();
        payload.resize(head.len as usize, 0);
        let decoded = seg
            .file
            .read_exact_at(&mut payload, offset + HEADER as u64)
            .map_err(ReadError::from)
            .and_then(|()| {
                if record_crc(lsn, head.count, &payload) != head.crc {
                    return Ok(None);
                }
                let carried = head.magic == MAGIC_CARRIED;
                let count = head.count as usize;
                decode_record(
                    seg.start,
                    lsn,
                    &payload,
                    count,
                    carried,
                    self.bodies,
                    Packed::Read,
                )
                .map(Some)
                .map_err(|source| ReadError::Malformed {
                    file: path.clone(),
                    source,
                })
            });
        if payload.capacity() <= KEEP_PAYLOAD {
            self.payload.set(payload);
        }
        Ok(decoded?.map(|events| Read::Record(events, lsn + span)))
    }

    /// Whether a valid record starts anywhere after `lsn` in the current
    /// segment: the rest of it is read once, in chunks, and only a place
    /// whose header holds a magic and its own lsn is read as a record.
    /// Reached where a read finds no record: at a start's recovery, in an
    /// inspection, and when the indexer crosses into the next segment (the
    /// rest of the one it leaves is less than the record that did not fit).
    fn later_record_in_segment(&self, lsn: u64) -> Result<bool, ReadError> {
        const CHUNK: u64 = 1 << 20;
        let Some((seg, _)) = &self.current else {
            return Ok(false);
        };
        let seg_end = seg.start + seg.size;
        let mut at = lsn + ALIGN;
        let mut buf = vec![0u8; CHUNK.min(seg_end.saturating_sub(at)) as usize];
        // Bounded: each turn moves `at` a chunk on, towards the segment's end.
        while at + HEADER as u64 <= seg_end {
            let want = CHUNK.min(seg_end - at) as usize;
            let got =
                super::fetch::read_at_least(&*seg.file, &mut buf[..want], at - seg.start, want)?;
            // Only a header with a magic and its own lsn is read as a record;
            // one cut by the chunk's end is left to the next chunk.
            let whole = got.saturating_sub(HEADER - 1);
            for i in (0..whole).step_by(ALIGN as usize) {
                let here = at + i as u64;
                if Head::decode(&buf[i..got]).is_some_and(|h| h.lsn == here)
                    && self.record_at(here)?.is_some()
                {
                    return Ok(true);
                }
            }
            if got < want {
                break;
            }
            // The next chunk starts at the first place not looked at.
            at += whole.next_multiple_of(ALIGN as usize) as u64;
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::fs::OpenOptions;

    fn event(i: u64) -> NewEvent {
        NewEvent {
            id: format!("id-{i}"),
            destination: "orders".into(),
            method: "POST".into(),
            path: format!("/x?i={i}"),
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: Bytes::from(format!("{{\"i\":{i}}}")),
            accepted_ms: 1000 + i,
        }
    }

    fn group(seqs: std::ops::Range<i64>) -> (Vec<u8>, u32) {
        let mut payload = Vec::new();
        for s in seqs.clone() {
            encode(&mut payload, s, &event(s as u64), false);
        }
        (payload, seqs.count() as u32)
    }

    /// The payload of a one-event record whose body is `body` bytes: ~1 MiB
    /// records fill a 16 MiB segment in a few appends.
    fn big_payload(seq: i64, body: usize) -> Vec<u8> {
        let big = NewEvent {
            body: Bytes::from(vec![b'x'; body]),
            ..event(0)
        };
        let mut p = Vec::new();
        encode(&mut p, seq, &big, false);
        p
    }

    fn read_all(dir: &Path, from: u64) -> Result<(Vec<i64>, u64), ReadError> {
        let mut r = LogReader::new(dir);
        let (mut seqs, mut at) = (Vec::new(), from);
        for _ in 0..10_000 {
            match r.read(at)? {
                Read::Record(events, next) => {
                    seqs.extend(events.iter().map(|l| l.seq));
                    at = next;
                }
                Read::End => return Ok((seqs, at)),
            }
        }
        panic!("log did not end");
    }

    #[test]
    fn records_round_trip_with_every_field() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open");
        let (p, n) = group(1..4);
        let end = w.append(&p, n, false).expect("append");
        assert_eq!(end, span(p.len()), "a record takes its own bytes");
        w.sync().expect("sync");
        let mut r = LogReader::new(tmp.path());
        let Read::Record(events, next) = r.read(0).expect("read") else {
            panic!("no record");
        };
        assert_eq!(next, end);
        assert_eq!(events.len(), 3);
        assert_eq!(events[1].seq, 2);
        assert_eq!(events[1].event, event(2));
        assert_eq!(r.read(end).expect("read"), Read::End);
    }

    /// One reader's payload buffer serves record after record: each reads
    /// back as written whatever the size of the one before (no bytes of a
    /// longer one left behind), and one beyond `KEEP_PAYLOAD` is given back.
    #[test]
    fn records_of_every_size_read_back_through_one_buffer() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open");
        let bodies = [3000, 10, KEEP_PAYLOAD + 1, 700, 0, 5000];
        let mut at = Vec::new();
        let mut end = 0;
        for (i, &len) in bodies.iter().enumerate() {
            let p = big_payload(i as i64 + 1, len);
            at.push(end);
            end = w.append(&p, 1, false).expect("append");
        }
        w.sync().expect("sync");
        let mut r = LogReader::new(tmp.path());
        let mut largest = 0;
        for (i, &len) in bodies.iter().enumerate() {
            let Read::Record(events, _) = r.read(at[i]).expect("read") else {
                panic!("no record at {}", at[i]);
            };
            assert_eq!(events.len(), 1);
            assert_eq!(events[0].seq, i as i64 + 1);
            assert_eq!(events[0].event.body, vec![b'x'; len], "body {i}");
            let buffer = r.payload.take();
            let kept = buffer.capacity();
            r.payload.set(buffer);
            if len > KEEP_PAYLOAD {
                assert_eq!(kept, 0, "a buffer past KEEP_PAYLOAD is given back");
                largest = 0;
            } else {
                largest = largest.max(len);
                assert!(
                    kept >= largest,
                    "the buffer is kept: {kept} bytes after body {i}"
                );
            }
        }
        assert_eq!(r.read(end).expect("read"), Read::End);
    }

    /// The indexer's reads leave the bodies and the decoded headers out
    /// and change nothing else: the rows' places and CRCs, the sizes
    /// counted against `max_bytes` and the endpoint named are those of the
    /// whole event, a packed body's too.
    #[test]
    fn a_read_without_bodies_keeps_every_other_field_and_the_size() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open");
        let (mut p, mut n) = group(1..3);
        let mut named = event(3);
        // Two: the first names the endpoint, in either read.
        for url in ["https://hooks.example:8443/a?b=c", "https://other.example/"] {
            named
                .headers
                .push((endpoint::URL_HEADER.into(), url.as_bytes().to_vec()));
        }
        encode(&mut p, 3, &named, false);
        n += 1;
        w.append(&p, n, false).expect("append");
        // The second record packed, as the writer packs an event that will
        // wait: a body that shrinks, and one too short to.
        let mut packed = Vec::new();
        let big = NewEvent {
            body: Bytes::from(vec![b'x'; 100_000]),
            ..event(4)
        };
        encode(&mut packed, 4, &big, true);
        encode(&mut packed, 5, &event(5), true);
        w.append(&packed, 2, false).expect("append");
        let read = |reader: &mut LogReader, at| match reader.read(at).expect("read") {
            Read::Record(events, next) => (events, next),
            Read::End => panic!("no record at {at}"),
        };
        let (mut whole, mut lean) = (
            LogReader::new(tmp.path()),
            LogReader::new(tmp.path()).without_bodies(),
        );
        let mut at = 0;
        for _ in 0..2 {
            let ((kept, next), (skipped, lean_next)) = (read(&mut whole, at), read(&mut lean, at));
            assert_eq!(next, lean_next);
            assert_eq!(kept.len(), skipped.len());
            for (k, s) in kept.iter().zip(&skipped) {
                assert!(!k.event.body.is_empty() && s.event.body.is_empty());
                assert!(!k.event.headers.is_empty() && s.event.headers.is_empty());
                assert_eq!(k.endpoint, None, "a whole read's event names it");
                assert_eq!(s.body_len, k.event.body.len());
                assert_eq!((k.packed, s.packed), (k.seq == 4, k.seq == 4));
                if k.packed {
                    assert_eq!(k.event, big);
                    assert!(k.place.len < 1000, "{} bytes", k.place.len);
                }
                assert_eq!(s.size(), k.size());
                assert_eq!(s.size(), k.event.size());
                let named = (k.seq == 3).then(|| "https://hooks.example:8443".to_string());
                assert_eq!(s.endpoint, named, "seq {}", k.seq);
                let decoded = endpoint::url_of(&k.event).and_then(endpoint::stored_origin);
                assert_eq!(s.endpoint, decoded, "as a decoded event names it");
                let body_back = Logged {
                    event: k.event.clone(),
                    endpoint: None,
                    ..s.clone()
                };
                assert_eq!(&body_back, k, "only the body differs");
            }
            at = next;
        }
    }

    #[test]
    fn small_groups_follow_each_other_without_padding() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open");
        let mut ends = Vec::new();
        for seq in 1..=10 {
            let (p, n) = group(seq..seq + 1);
            let start = w.end();
            ends.push(w.append(&p, n, false).expect("append"));
            assert_eq!(ends.last(), Some(&(start + span(p.len()))));
        }
        assert!(
            w.end() < 2 * PAGE,
            "ten one-event groups took {} bytes",
            w.end()
        );
        assert_eq!(
            read_all(tmp.path(), 0).expect("read"),
            ((1..=10).collect(), w.end())
        );
    }

    /// A log written before records followed each other: each padded to
    /// 4 KiB under the magic "CRR1". An upgraded courier reads it.
    #[test]
    fn a_log_of_padded_records_still_reads() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut file = vec![0u8; SEGMENT as usize];
        let mut lsn: u64 = 0;
        for seqs in [1..3, 3..4] {
            let (payload, count) = group(seqs);
            let at = lsn as usize;
            let head = Head {
                magic: MAGIC_PADDED,
                len: payload.len() as u32,
                lsn,
                crc: record_crc(lsn, count, &payload),
                count,
            };
            file[at..at + HEADER].copy_from_slice(&head.encode());
            file[at + HEADER..at + HEADER + payload.len()].copy_from_slice(&payload);
            lsn += padded(payload.len());
        }
        std::fs::write(tmp.path().join(name(0)), &file).expect("write");
        assert_eq!(
            read_all(tmp.path(), 0).expect("read"),
            (vec![1, 2, 3], 2 * PAGE)
        );
        // A new run's writer starts a segment of its own after it.
        let mut w = LogWriter::open(tmp.path(), SEGMENT, 4, &BTreeSet::new()).expect("open");
        let (p, n) = group(4..5);
        w.append(&p, n, false).expect("append");
        let (seqs, _) = read_all(tmp.path(), SEGMENT).expect("read");
        assert_eq!(seqs, vec![4]);
    }

    #[test]
    fn a_torn_last_record_is_the_end_of_the_log() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open");
        let (p, n) = group(1..3);
        let first_end = w.append(&p, n, false).expect("append");
        let (p, n) = group(3..5);
        w.append(&p, n, false).expect("append");
        // Tear the second record: flip a payload byte.
        let path = tmp.path().join(name(0));
        let f = OpenOptions::new().write(true).open(&path).expect("open");
        f.write_all_at(&[0xff], first_end + HEADER as u64 + 3)
            .expect("write");
        assert_eq!(
            read_all(tmp.path(), 0).expect("read"),
            (vec![1, 2], first_end)
        );
    }

    #[test]
    fn a_damaged_record_with_later_records_is_corruption_not_the_end() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open");
        for i in 0..3 {
            let (p, n) = group(i * 10..i * 10 + 2);
            w.append(&p, n, false).expect("append");
        }
        let f = OpenOptions::new()
            .write(true)
            .open(tmp.path().join(name(0)))
            .expect("open");
        f.write_all_at(&[0xff], HEADER as u64 + 1).expect("write");
        assert!(matches!(
            read_all(tmp.path(), 0),
            Err(ReadError::Corrupt { lsn: 0, .. })
        ));
    }

    /// The search for a later record reads the segment in 1 MiB chunks:
    /// one that lies chunks past the damage is still found.
    #[test]
    fn a_later_record_chunks_past_the_damage_is_still_found() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open");
        let mut starts = Vec::new();
        for seq in 0..3 {
            let p = big_payload(seq, 1100 * 1024);
            starts.push(w.end());
            w.append(&p, 1, false).expect("append");
        }
        let (p, n) = group(3..4);
        starts.push(w.end());
        w.append(&p, n, false).expect("append");
        let f = OpenOptions::new()
            .write(true)
            .open(tmp.path().join(name(0)))
            .expect("open");
        // The first three records damaged: the fourth, 3.2 MiB on, is valid.
        for at in &starts[..3] {
            f.write_all_at(&[0xff], at + HEADER as u64 + 1)
                .expect("write");
        }
        assert!(matches!(
            read_all(tmp.path(), 0),
            Err(ReadError::Corrupt { lsn: 0, .. })
        ));
        // With it damaged too, the rest of the segment holds nothing.
        f.write_all_at(&[0xff], starts[3] + HEADER as u64 + 1)
            .expect("write");
        assert_eq!(read_all(tmp.path(), 0).expect("read"), (vec![], 0));
    }

    #[test]
    fn records_go_on_in_the_next_segment_and_recycled_segments_read_as_empty() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open");
        // Records of ~1 MiB: 16 fit a 16 MiB segment, the 17th rotates.
        let mut ends = Vec::new();
        for seq in 0..40 {
            let p = big_payload(seq, 1024 * 1024 - 200);
            ends.push(w.append(&p, 1, false).expect("append"));
        }
        assert!(segments(tmp.path()).expect("list").len() >= 3);
        let (seqs, end) = read_all(tmp.path(), 0).expect("read");
        assert_eq!(seqs, (0..40).collect::<Vec<_>>());
        assert_eq!(end, w.end());
        // Everything durable elsewhere: the old segments become spares and
        // are reused; their old records must not be read as new ones.
        w.recycle(w.end(), true, &BTreeSet::new()).expect("recycle");
        let from = w.end();
        let (p, n) = group(100..101);
        for _ in 0..20 {
            w.append(&p, n, false).expect("append");
        }
        let (seqs, _) = read_all(tmp.path(), from).expect("read");
        assert_eq!(seqs, vec![100; 20]);
        assert!(segments(tmp.path()).expect("list").len() <= 2 + SPARES);
    }

    /// The bytes after a record, to the end of its page, are written (as
    /// zeros) with it: in a recycled segment, a page written in part and
    /// no longer in memory would be read from disk before the write.
    #[test]
    fn the_rest_of_a_records_page_is_zeroed_in_a_recycled_segment() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open");
        let p = big_payload(1, 1024 * 1024 - 200);
        for _ in 0..20 {
            w.append(&p, 1, false).expect("append");
        }
        // The first segment becomes the spare; the next rotation takes it.
        w.recycle(w.end(), true, &BTreeSet::new()).expect("recycle");
        let current = |w: &LogWriter| w.current.as_ref().map(|s| s.start);
        let before = current(&w);
        for _ in 0..20 {
            if current(&w) != before {
                break;
            }
            w.append(&p, 1, false).expect("append");
        }
        assert_ne!(current(&w), before, "the writer moved on to the spare");
        let (q, n) = group(100..101);
        let end = w.append(&q, n, false).expect("append");
        let seg = w.current.as_ref().expect("a segment");
        let at = (end - seg.start) as usize;
        let page_end = at.div_ceil(PAGE as usize) * PAGE as usize;
        let mut bytes = vec![0u8; page_end + 64];
        seg.file.read_exact_at(&mut bytes, 0).expect("read");
        assert_ne!(at % PAGE as usize, 0, "the record ends inside a page");
        assert!(bytes[at..page_end].iter().all(|b| *b == 0));
        assert!(
            bytes[page_end..].contains(&b'x'),
            "beyond the page, the recycled segment's old bytes"
        );
        let (seqs, _) = read_all(tmp.path(), end - span(q.len())).expect("read");
        assert_eq!(seqs, vec![100]);
    }

    /// Segments rows point into are neither recycled nor made spares, at
    /// run time or at the next open, until they are no longer pinned.
    #[test]
    fn pinned_segments_stay_until_released() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open");
        let p = big_payload(1, 1024 * 1024 - 200);
        for _ in 0..40 {
            w.append(&p, 1, false).expect("append");
        }
        let starts: Vec<u64> = segments(tmp.path())
            .expect("list")
            .iter()
            .map(|s| s.0)
            .collect();
        assert_eq!(starts.len(), 3, "{starts:?}");
        let pinned = BTreeSet::from([starts[0]]);
        w.recycle(w.end(), false, &pinned).expect("recycle");
        let left: Vec<u64> = segments(tmp.path())
            .expect("list")
            .iter()
            .map(|s| s.0)
            .collect();
        assert_eq!(
            left,
            vec![starts[0], starts[2]],
            "only the unpinned old one goes"
        );
        let end = w.end();
        drop(w);
        let resume = starts[2] + SEGMENT;
        assert!(resume >= end);
        let mut w = LogWriter::open(tmp.path(), resume, 1, &pinned).expect("reopen");
        let left: Vec<u64> = segments(tmp.path())
            .expect("list")
            .iter()
            .map(|s| s.0)
            .collect();
        assert_eq!(
            left,
            vec![starts[0], starts[2]],
            "the pinned one survives the open"
        );
        w.append(&p, 1, false).expect("append");
        w.recycle(w.end(), false, &BTreeSet::new())
            .expect("recycle");
        let left: Vec<u64> = segments(tmp.path())
            .expect("list")
            .iter()
            .map(|s| s.0)
            .collect();
        assert_eq!(left, vec![resume], "released, it goes");
    }

    #[test]
    fn a_damaged_last_record_of_a_segment_is_corruption_not_a_skip() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open");
        let mut starts = Vec::new();
        for seq in 0..20 {
            let p = big_payload(seq, 1024 * 1024 - 200);
            let end = w.append(&p, 1, false).expect("append");
            starts.push(end - span(p.len()));
        }
        // The last record that went into the first segment, then damaged.
        let last = *starts.iter().filter(|s| **s < SEGMENT).max().expect("some");
        let f = OpenOptions::new()
            .write(true)
            .open(tmp.path().join(name(0)))
            .expect("open");
        f.write_all_at(&[0xff], last + HEADER as u64 + 5)
            .expect("write");
        match read_all(tmp.path(), 0) {
            Err(ReadError::Corrupt { lsn, .. }) => assert_eq!(lsn, last),
            other => panic!("a damaged record before good ones was {other:?}"),
        }
    }

    #[test]
    fn a_missing_segment_in_the_middle_is_corruption_not_the_end() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open");
        for seq in 0..40 {
            let p = big_payload(seq, 1024 * 1024 - 200);
            w.append(&p, 1, false).expect("append");
        }
        std::fs::remove_file(tmp.path().join(name(SEGMENT))).expect("remove the second segment");
        assert!(matches!(
            read_all(tmp.path(), 0),
            Err(ReadError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_group_larger_than_a_segment_gets_its_own() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open");
        let huge = NewEvent {
            body: Bytes::from(vec![b'y'; SEGMENT as usize + 10]),
            ..event(0)
        };
        let mut p = Vec::new();
        encode(&mut p, 7, &huge, false);
        w.append(&p, 1, false).expect("append");
        let (seqs, _) = read_all(tmp.path(), 0).expect("read");
        assert_eq!(seqs, vec![7]);
    }

    #[test]
    fn opening_refuses_segments_past_the_resume_position() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w = LogWriter::open(tmp.path(), 0, 1, &BTreeSet::new()).expect("open");
        let (p, n) = group(1..2);
        w.append(&p, n, false).expect("append");
        assert!(LogWriter::open(tmp.path(), 4096, 1, &BTreeSet::new()).is_err());
        assert!(LogWriter::open(tmp.path(), SEGMENT, 1, &BTreeSet::new()).is_ok());
    }
}
