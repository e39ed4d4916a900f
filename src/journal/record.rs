//! What one journal row holds, and the codec for its forwarded headers.
//! Each row carries a CRC32C over its immutable fields: SQLite detects a
//! broken page structure, but not a flipped bit inside a body, and courier
//! must never deliver a corrupted event as if it were the app's.

use crate::event::{Header, StoredEvent};

/// What an event handed off by another courier brings of its delivery so
/// far (docs/object-storage.md): it goes on where it stopped, not from attempt 1. Kept
/// beside the event in the intake log (a "CRC1" record), so the event and
/// its state become durable in one commit.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Carried {
    pub attempts: u32,
    pub next_due_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    /// Set when the courier that handed it off had dead-lettered it and
    /// its record was still to be written (its sink down, or its shutdown
    /// grace over): the adopter writes the record, and never sends the
    /// event. Its other facts are the fields above. Absent in objects of
    /// builds before it, which ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fate: Option<CarriedFate>,
}

/// A carried event's `deadLetterReason` and `deadLetterTime`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CarriedFate {
    pub reason: String,
    pub at_ms: u64,
}

impl Carried {
    /// The delivery state of `ev`, to carry to another journal.
    pub(crate) fn of(ev: &StoredEvent) -> Carried {
        Carried {
            attempts: ev.attempts,
            // One waiting for its lane's turn: the adopter's lanes decide.
            next_due_ms: if ev.next_due_ms >= super::store::WAITING as u64 {
                ev.event.accepted_ms
            } else {
                ev.next_due_ms
            },
            last_outcome: ev.last_outcome.map(|o| o.as_str().to_string()),
            last_status: ev.last_status,
            last_attempt_ms: ev.last_attempt_ms,
            batch: ev.batch.clone(),
            fate: ev.fate.as_ref().map(|f| CarriedFate {
                reason: f.reason.as_str().to_string(),
                at_ms: f.at_ms,
            }),
        }
    }
}

pub(crate) fn crc(
    id: &str,
    destination: &str,
    method: &str,
    path: &str,
    headers: &[u8],
    body: &[u8],
) -> u32 {
    let mut c = 0;
    for part in [
        id.as_bytes(),
        destination.as_bytes(),
        method.as_bytes(),
        path.as_bytes(),
        headers,
        body,
    ] {
        c = crc32c::crc32c_append(c, &(part.len() as u32).to_le_bytes());
        c = crc32c::crc32c_append(c, part);
    }
    c
}

/// `[u16 name len][name][u32 value len][value]...`, little endian.
pub fn encode_headers(headers: &[Header]) -> Vec<u8> {
    let mut out = Vec::with_capacity(headers.iter().map(|(n, v)| n.len() + v.len() + 6).sum());
    for (name, value) in headers {
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("header block is truncated or malformed at byte {0}")]
pub struct DecodeError(pub usize);

pub fn decode_headers(b: &[u8]) -> Result<Vec<Header>, DecodeError> {
    encoded_headers(b)
        .map(|h| h.map(|(name, value)| (name.to_string(), value.to_vec())))
        .collect()
}

/// The headers of an encoded block, borrowed from it: a reader that needs
/// one of them, or only to know the block is whole (the indexer, once per
/// event), makes no copy of the others.
pub fn encoded_headers(b: &[u8]) -> EncodedHeaders<'_> {
    EncodedHeaders { b, total: b.len() }
}

pub struct EncodedHeaders<'a> {
    b: &'a [u8],
    total: usize,
}

impl<'a> EncodedHeaders<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError(self.total - self.b.len()));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn next_header(&mut self) -> Result<(&'a str, &'a [u8]), DecodeError> {
        let n = self.take(2)?;
        let name = self.take(u16::from_le_bytes([n[0], n[1]]) as usize)?;
        let name = std::str::from_utf8(name).map_err(|_| DecodeError(self.total - self.b.len()))?;
        let v = self.take(4)?;
        let value = self.take(u32::from_le_bytes([v[0], v[1], v[2], v[3]]) as usize)?;
        Ok((name, value))
    }
}

impl<'a> Iterator for EncodedHeaders<'a> {
    type Item = Result<(&'a str, &'a [u8]), DecodeError>;

    /// After an error, nothing: the block's rest cannot be framed.
    fn next(&mut self) -> Option<Self::Item> {
        if self.b.is_empty() {
            return None;
        }
        let h = self.next_header();
        if h.is_err() {
            self.b = &[];
        }
        Some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::NewEvent;
    use bytes::Bytes;

    /// A block cut anywhere is refused, by the borrowed walk as by the
    /// copying decode, at the same byte; the walk then ends (its rest
    /// cannot be framed) rather than reading on from the wrong place.
    #[test]
    fn a_truncated_block_is_refused_by_both_reads_alike() {
        let block = encode_headers(&[
            ("x-a".to_string(), b"1".to_vec()),
            ("x-b".to_string(), b"22".to_vec()),
        ]);
        let first = encode_headers(&[("x-a".to_string(), b"1".to_vec())]).len();
        for cut in (1..block.len()).filter(|&c| c != first) {
            let part = &block[..cut];
            let walked: Vec<_> = encoded_headers(part).collect();
            let err = walked.last().and_then(|h| h.as_ref().err()).cloned();
            assert!(err.is_some(), "cut at {cut}: {walked:?}");
            assert_eq!(decode_headers(part).err(), err, "cut at {cut}");
            assert!(walked[..walked.len() - 1].iter().all(Result::is_ok));
        }
        let whole: Vec<_> = encoded_headers(&block).collect();
        assert_eq!(whole, vec![Ok(("x-a", &b"1"[..])), Ok(("x-b", &b"22"[..]))]);
    }

    #[test]
    fn headers_round_trip_including_binary_values() {
        let h = vec![
            ("x-a".to_string(), b"1".to_vec()),
            ("x-bin".into(), vec![0, 255, 10]),
            ("x-empty".into(), vec![]),
        ];
        assert_eq!(decode_headers(&encode_headers(&h)), Ok(h));
        assert_eq!(decode_headers(&[]), Ok(vec![]));
    }

    #[test]
    fn truncated_headers_are_an_error_not_a_panic() {
        let enc = encode_headers(&[("x-a".to_string(), b"value".to_vec())]);
        for cut in 1..enc.len() {
            assert!(decode_headers(&enc[..cut]).is_err(), "cut at {cut}");
        }
        assert!(decode_headers(&[5, 0, 0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn crc_covers_every_immutable_field() {
        let e = NewEvent {
            id: "1".into(),
            destination: "d".into(),
            method: "POST".into(),
            path: "/x".into(),
            headers: vec![("a".into(), b"b".to_vec())],
            body: Bytes::from_static(b"{}"),
            accepted_ms: 5,
        };
        let crc_of = |e: &NewEvent| {
            let headers = encode_headers(&e.headers);
            crc(&e.id, &e.destination, &e.method, &e.path, &headers, &e.body)
        };
        let base = crc_of(&e);
        let mut other = e.clone();
        other.body = Bytes::from_static(b"{ }");
        assert_ne!(crc_of(&other), base);
        let mut other = e.clone();
        other.path = "/y".into();
        assert_ne!(crc_of(&other), base);
        // field boundaries matter: ("ab","") differs from ("a","b")
        assert_ne!(
            crc("ab", "", "", "", &[], &[]),
            crc("a", "b", "", "", &[], &[])
        );
    }
}
