//! A hand-off object's bytes: `[magic "CHO1" u32][events u32][crc32c u32]`
//! then each event as the intake log encodes an adopted one (the event,
//! then its `Carried` state): the journal's own codec, so an event crosses
//! couriers exactly as it would cross a restart. The CRC covers the count
//! and the events: a damaged object is refused whole, and left in the
//! store for an operator, never adopted in part.

use crate::event::NewEvent;
use crate::journal::Carried;
use crate::journal::intake::{self, Logged};
use crate::seal::{self, Key, OpenError};

const MAGIC: u32 = 0x4348_4f31; // "CHO1"
pub(super) const HEAD: usize = 12;
/// An object holds about this many bytes of events before the one that
/// passes it: few requests for a large backlog (100 for 100,000 events of
/// 1 KiB), and little memory held per object in flight (4 MiB objects
/// peaked courier at 74 MiB).
pub const OBJECT_BYTES: usize = 1 << 20;
/// What an event takes in an object besides its body, at most: its id,
/// destination, method, path (64 KiB), headers (hyper reads at most about
/// 400 KiB of them) and delivery state.
const EVENT_OVERHEAD: u64 = 512 << 10;
/// What a new object's buffer holds before it grows: a hand-off object
/// (1 MiB) and the event that passes it.
const ROOM: usize = 9 << 17;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ObjectError {
    #[error("not a hand-off object (no CHO1 header)")]
    NotHandoff,
    #[error("cannot open it: {0}")]
    Sealed(#[from] OpenError),
    #[error("it holds {0} events where its name says {1}")]
    Count(usize, u32),
    #[error("the hand-off object is damaged (its checksum fails)")]
    Damaged,
    #[error("the hand-off object is damaged: {0}")]
    Malformed(#[from] intake::Malformed),
}

/// Builds one object, event by event, in one buffer sized for an object of
/// the hand-off's size (growing only past it, for a larger event).
pub struct Builder {
    bytes: Vec<u8>,
    count: u32,
}

impl Default for Builder {
    fn default() -> Builder {
        let mut bytes = Vec::with_capacity(ROOM);
        bytes.resize(HEAD, 0);
        Builder { bytes, count: 0 }
    }
}

impl Builder {
    pub fn push(&mut self, event: &NewEvent, carried: &Carried) {
        // Not packed: the object is sealed as a whole, and read by another
        // courier, which may be of a build before packed bodies.
        intake::encode(&mut self.bytes, 0, event, false);
        intake::encode_carried(&mut self.bytes, carried);
        self.count += 1;
    }

    /// The object's size so far.
    pub fn size(&self) -> usize {
        self.bytes.len()
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.bytes[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        self.bytes[4..8].copy_from_slice(&self.count.to_le_bytes());
        let crc = crc32c::crc32c(&self.bytes[4..8]);
        let crc = crc32c::crc32c_append(crc, &self.bytes[HEAD..]);
        self.bytes[8..12].copy_from_slice(&crc.to_le_bytes());
        self.bytes
    }
}

/// The largest object a courier writes whose events a courier with
/// `max_body_bytes` would take: its chunk, then one event at the limit.
pub fn max_size(max_body_bytes: u64) -> u64 {
    (HEAD + OBJECT_BYTES + seal::OVERHEAD) as u64 + max_body_bytes + EVENT_OVERHEAD
}

/// `<uuidv7>-<events>.cho`, the name a courier gives an object: the
/// count of events, or `None` for a name no courier writes.
pub fn parse_name(name: &str) -> Option<u32> {
    let (uuid, rest) = name.split_once('-')?;
    let count = rest.strip_suffix(".cho")?;
    let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    if uuid.len() != 32 || !uuid.chars().all(hex) {
        return None;
    }
    if count.is_empty() || count.len() > 10 || !count.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    count.parse().ok()
}

/// `<uuidv7>-<events>.cho`: names sort by when they were written.
pub fn name(events: u32) -> String {
    format!("{}-{events}.cho", uuid::Uuid::now_v7().simple())
}

/// An object's bytes as stored: sealed with the first key when keys are set.
pub fn store(keys: &[Key], name: &str, plain: Vec<u8>) -> Vec<u8> {
    match keys.first() {
        Some(key) => seal::seal(key, name, plain),
        None => plain,
    }
}

/// The events of the object `name` as stored: opened, checked against its
/// checksum and the count its name gives.
pub fn read(
    keys: &[Key],
    name: &str,
    stored: Vec<u8>,
) -> Result<Vec<(NewEvent, Carried)>, ObjectError> {
    let plain = seal::open(keys, name, stored)?;
    let events = decode(&plain)?;
    match parse_name(name) {
        Some(n) if n as usize == events.len() => Ok(events),
        Some(n) => Err(ObjectError::Count(events.len(), n)),
        None => Ok(events),
    }
}

/// The events of an object, with their state.
pub fn decode(bytes: &[u8]) -> Result<Vec<(NewEvent, Carried)>, ObjectError> {
    let head = bytes.get(..HEAD).ok_or(ObjectError::NotHandoff)?;
    let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    if word(0) != MAGIC {
        return Err(ObjectError::NotHandoff);
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&head[4..8]), &bytes[HEAD..]);
    if crc != word(8) {
        return Err(ObjectError::Damaged);
    }
    let logged = intake::decode(
        0,
        0,
        &bytes[HEAD..],
        word(4) as usize,
        true,
        intake::Packed::Refuse,
    )?;
    Ok(logged
        .into_iter()
        .map(|Logged { event, carried, .. }| {
            // A "CRC1" decode gives every event its state.
            let carried = carried.unwrap_or(Carried {
                attempts: 0,
                next_due_ms: event.accepted_ms,
                last_outcome: None,
                last_status: None,
                last_attempt_ms: None,
                batch: None,
                fate: None,
            });
            (event, carried)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(i: u64) -> (NewEvent, Carried) {
        (
            NewEvent {
                id: format!("e{i}"),
                destination: "orders".into(),
                method: "PUT".into(),
                path: format!("/x/{i}?q=1"),
                headers: vec![("x-tenant".into(), b"acme".to_vec())],
                body: bytes::Bytes::from(vec![i as u8; 300]),
                accepted_ms: 1_000 + i,
            },
            Carried {
                attempts: i as u32,
                next_due_ms: 9_000 + i,
                last_outcome: Some("Failed".into()),
                last_status: Some(500),
                last_attempt_ms: Some(8_000),
                batch: i.is_multiple_of(2).then(|| format!("b{i}")),
                fate: None,
            },
        )
    }

    #[test]
    fn events_cross_an_object_whole_and_a_damaged_one_is_refused() {
        let events: Vec<_> = (0..5).map(event).collect();
        let mut b = Builder::default();
        for (e, c) in &events {
            b.push(e, c);
        }
        assert_eq!(b.count(), 5);
        let bytes = b.finish();
        assert_eq!(decode(&bytes), Ok(events));

        let mut flipped = bytes.clone();
        flipped[HEAD + 40] ^= 1;
        assert_eq!(decode(&flipped), Err(ObjectError::Damaged));
        let mut counted = bytes.clone();
        counted[4] = 6;
        assert_eq!(
            decode(&counted),
            Err(ObjectError::Damaged),
            "the count is covered"
        );
        assert_eq!(decode(b"{}"), Err(ObjectError::NotHandoff));
        assert_eq!(decode(&Builder::default().finish()), Ok(Vec::new()));
    }

    /// A packed body (journal/pack.rs) is the log's, never an object's: one
    /// in a bucket, with a good CRC, is refused before it is unpacked, as
    /// 1 MiB of LZ4 there could name a body of 256 MiB. The same event
    /// written as couriers write it is taken.
    #[test]
    fn an_object_holding_a_packed_body_is_refused() {
        let (e, c) = event(1);
        let zeros = NewEvent {
            body: bytes::Bytes::from(vec![0; 1 << 20]),
            ..e
        };
        let mut b = Builder::default();
        intake::encode(&mut b.bytes, 0, &zeros, true);
        intake::encode_carried(&mut b.bytes, &c);
        b.count = 1;
        let packed = b.finish();
        assert!(packed.len() < 64 << 10, "{} bytes", packed.len());
        assert!(
            matches!(decode(&packed), Err(ObjectError::Malformed(_))),
            "{:?}",
            decode(&packed).map(|v| v.len())
        );
        let mut b = Builder::default();
        b.push(&zeros, &c);
        assert_eq!(decode(&b.finish()), Ok(vec![(zeros, c)]));
    }
}
