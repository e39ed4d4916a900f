//! What each fuzz target does with one input, shared by the targets in
//! `fuzz_targets/` and by `tests/suite/fuzz_corpus.rs` (which includes this file
//! with `#[path]`), so that every committed seed and crash is replayed by a
//! plain `cargo test` on stable, with the same checks as under libFuzzer.
//!
//! Each function returns normally for any input; a panic is a finding.
//! Beyond "no panic", each asserts what must hold of a successful parse.

use bytes::Bytes;
use courier::config::{self, Env, Purpose};
use courier::event::Schema;
use courier::fuzzing::{self, Event, Read};
use courier::journal::record::{decode_headers, encode_headers};
use courier::policy::classify::{RETRY_AFTER_CAP, parse_retry_after};
use http::{HeaderMap, HeaderName, HeaderValue};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A fixed environment, so runs repeat. Names ending in `_UNSET` are
/// missing; `WHSEC*` hold a valid signing secret; any other name holds a
/// value that names it. That reaches both the "variable set" and "variable
/// missing" paths of every `*_env` key and `from_env` header.
struct FuzzEnv;

impl Env for FuzzEnv {
    fn get(&self, name: &str) -> Option<String> {
        if name.ends_with("_UNSET") {
            None
        } else if name.starts_with("WHSEC") {
            Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into())
        } else {
            Some(format!("value-of-{name}"))
        }
    }
}

/// (a) YAML text to validated settings or an error, as `courier check`
/// does. A config that loads has an effective YAML, which must load again
/// without panicking (masked secrets may make it invalid; that is fine).
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let base = PathBuf::from("/fuzz-config-dir");
    for purpose in [Purpose::Check, Purpose::Run] {
        if let Ok(loaded) = config::parse("fuzz.yaml", text, base.clone(), purpose, &FuzzEnv) {
            let _ = config::parse(
                "effective.yaml",
                &loaded.effective,
                base.clone(),
                purpose,
                &FuzzEnv,
            );
        }
    }
}

/// (b) One ingress request of an `eventgrid` or `cloudevents` destination.
/// The input reads as text: a first line naming the schema (starting with
/// `e`: eventgrid, else cloudevents), header lines `name: value`, an empty
/// line, then the body. Accepted events must each be a JSON object that the
/// same schema accepts again, alone, in structured mode, with the same id,
/// type and subject: that is what delivery and dead letters send on. An
/// Event Grid event has a string `topic` and `metadataVersion: "1"`, and
/// reads back as its own bytes (nothing is added twice).
pub fn ingress(data: &[u8]) {
    let (head, body) = match find(data, b"\n\n") {
        Some(at) => (&data[..at], &data[at + 2..]),
        None => (data, &[][..]),
    };
    let mut lines = head.split(|&b| b == b'\n');
    let schema = match lines.next().and_then(|l| l.first()) {
        Some(b'e') => Schema::Eventgrid,
        _ => Schema::Cloudevents,
    };
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (line[..colon].trim_ascii(), line[colon + 1..].trim_ascii());
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(n, v);
        }
    }
    let body = Bytes::copy_from_slice(body);
    let Some(Ok(events)) = fuzzing::ingress_schema(schema, &headers, &body, TOPIC) else {
        return;
    };
    assert!(!events.is_empty(), "an accepted request holds events");
    for e in &events {
        let again = reparse(schema, e);
        assert_eq!(again.len(), 1);
        let a = &again[0];
        assert_eq!(
            (&a.id, &a.event_type, &a.subject),
            (&e.id, &e.event_type, &e.subject),
            "event {:?} reads differently on its own",
            String::from_utf8_lossy(&e.body)
        );
        if schema == Schema::Eventgrid {
            let v: serde_json::Value = serde_json::from_slice(&e.body).expect("JSON");
            assert!(v["topic"].is_string(), "no topic in {v}");
            assert_eq!(v["metadataVersion"], "1", "in {v}");
            assert_eq!(a.body, e.body, "filled twice");
        }
    }
}

/// The Event Grid topic of the fuzzed route, with characters JSON escapes.
const TOPIC: &str = "/courier/\"fuzz\"\\\u{1}";

fn reparse(schema: Schema, e: &Event) -> Vec<Event> {
    let value: serde_json::Value = serde_json::from_slice(&e.body).expect("event body is JSON");
    assert!(value.is_object(), "event body is an object");
    let mut headers = HeaderMap::new();
    let media = match schema {
        Schema::Eventgrid => "application/json",
        _ => "application/cloudevents+json",
    };
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(media));
    match fuzzing::ingress_schema(schema, &headers, &e.body, "/courier/other") {
        Some(Ok(events)) => events,
        other => panic!(
            "event {:?} is refused on its own: {other:?}",
            String::from_utf8_lossy(&e.body)
        ),
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// (c) A `Retry-After` value as a response carries it: header bytes, taken
/// only if they are a valid header value and visible ASCII (as
/// `deliver::stack::classify` reads them), against a few clocks including
/// the extremes. A hint never exceeds the cap.
pub fn retry_after(data: &[u8]) {
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    let Ok(text) = value.to_str() else {
        return;
    };
    let epoch = SystemTime::UNIX_EPOCH;
    for now in [
        epoch,
        epoch + Duration::from_secs(1_780_000_000),
        epoch + Duration::from_secs(253_402_300_799), // 9999-12-31T23:59:59Z
    ] {
        if let Some(d) = parse_retry_after(text, now) {
            assert!(d <= RETRY_AFTER_CAP, "{text:?} gave {d:?}");
        }
    }
}

/// (d) The events of one intake log record: `[count u32 LE][payload]`.
/// Whatever decodes must encode back to exactly the payload (the codec is
/// canonical), and its header block must decode to the same headers. A
/// packed body (journal/pack.rs) may come from another LZ4 block than the
/// one courier would write: a record holding one must decode, encoded
/// again, to the same events.
pub fn intake_decode(data: &[u8]) {
    let Some((count, payload)) = data.split_first_chunk::<4>() else {
        return;
    };
    let count = u32::from_le_bytes(*count) as usize;
    let Ok(logged) = fuzzing::intake_decode(0, 0, payload, count, false, fuzzing::Packed::Read)
    else {
        return;
    };
    // A hand-off object's decode refuses exactly the records holding one.
    let refused = fuzzing::intake_decode(0, 0, payload, count, false, fuzzing::Packed::Refuse);
    assert_eq!(refused.is_err(), logged.iter().any(|l| l.packed));
    assert_eq!(logged.len(), count);
    let mut again = Vec::with_capacity(payload.len());
    for l in &logged {
        assert_eq!(encode_headers(&l.event.headers), l.encoded_headers);
        assert_eq!(l.body_len, l.event.body.len());
        fuzzing::intake_encode(&mut again, l.seq, &l.event, l.packed);
    }
    if logged.iter().all(|l| !l.packed) {
        assert_eq!(again, payload, "decode then encode changed the record");
        return;
    }
    let back = fuzzing::intake_decode(0, 0, &again, count, false, fuzzing::Packed::Read)
        .unwrap_or_else(|e| panic!("a record encoded again does not decode: {e}"));
    let events = |ls: &[fuzzing::Logged]| {
        ls.iter()
            .map(|l| (l.seq, l.event.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        events(&back),
        events(&logged),
        "decode, encode, decode changed the events"
    );
}

/// A hand-off key for the harness: 32 zero bytes.
const HANDOFF_KEY: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

/// (d) A hand-off object as another courier wrote it to the bucket
/// (`handoff/object.rs`): `[magic u32][count u32][crc32c u32][events]`. Its
/// CRC is recomputed first when the magic is there, so that mutations reach
/// the event decoder; whatever decodes holds as many events as it says.
/// The whole reader runs on it too, encryption off and on: sealed by a
/// courier with the key, the same events come out; as they are, the bytes
/// are refused by a courier with the key, whatever they hold.
pub fn handoff_object(data: &[u8]) {
    let mut bytes = data.to_vec();
    if bytes.len() >= 12 && bytes[..4] == 0x4348_4f31u32.to_le_bytes() {
        let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[4..8]), &bytes[12..]);
        bytes[8..12].copy_from_slice(&crc.to_le_bytes());
    }
    let decoded = fuzzing::handoff_decode(&bytes)
        .map(|events| events.len())
        .ok();
    if let Some(n) = decoded {
        let count = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        assert_eq!(n, count as usize);
    }
    let name = format!("{}-{}.cho", "0".repeat(32), decoded.unwrap_or(0));
    let total = |r: Result<(usize, usize), String>| r.map(|(kept, aside)| kept + aside).ok();
    assert_eq!(
        total(fuzzing::handoff_read(&[], &name, bytes.clone())),
        decoded
    );
    let sealed = fuzzing::handoff_sealed(HANDOFF_KEY, &name, bytes).expect("a 32-byte key");
    assert_eq!(
        total(fuzzing::handoff_read(&[HANDOFF_KEY], &name, sealed)),
        decoded
    );
    assert!(fuzzing::handoff_read(&[HANDOFF_KEY], &name, data.to_vec()).is_err());
}

/// (d) The journal's forwarded-header block: decode, then encode must give
/// the input back.
pub fn headers(data: &[u8]) {
    if let Ok(h) = decode_headers(data) {
        assert_eq!(encode_headers(&h), data);
    }
}

/// The record layout of `journal/intake.rs`, repeated here so the harness
/// can give mutated records a valid checksum: without it libFuzzer would
/// almost never get past the CRC into the event decoder. Records start at
/// 8-byte steps ("CRR2"); those of older logs at 4 KiB steps ("CRR1"),
/// which are 8-byte steps too.
const MAGICS: [u32; 2] = [0x4352_5232, 0x4352_5231];
const HEADER: usize = 24;
const ALIGN: usize = 8;

/// (d) A whole intake log segment read by `LogReader` from lsn 0 to its
/// end, as recovery and `courier inspect` do. The input is the segment file;
/// before it is written, every 8-byte step whose header has a magic, its
/// own lsn and a length that fits gets its CRC recomputed ("resealed"), so
/// that mutations reach the decoder; other places stay as damaged as given.
pub fn intake_log(dir: &Path, data: &[u8]) {
    let mut seg = data.to_vec();
    reseal(&mut seg);
    let path = dir.join("intake-0000000000000000.log");
    std::fs::write(&path, &seg).expect("write segment");
    let mut reader = fuzzing::LogReader::new(dir);
    let mut at = 0u64;
    // Bounded: each record moves `at` on by at least one step.
    for _ in 0..=seg.len() / ALIGN {
        match reader.read(at) {
            Ok(Read::Record(_, next)) => {
                assert!(next > at, "the reader went back from {at} to {next}");
                at = next;
            }
            Ok(Read::End) | Err(_) => break,
        }
    }
}

/// Recomputes the CRC of every plausible record in `seg` (see `intake_log`).
pub fn reseal(seg: &mut [u8]) {
    let word = |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let mut off = 0;
    while off + HEADER <= seg.len() {
        let head = &seg[off..off + HEADER];
        let len = word(head, 4) as usize;
        let lsn = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
        let count = word(head, 20);
        if MAGICS.contains(&word(head, 0)) && lsn == off as u64 && off + HEADER + len <= seg.len() {
            let payload = &seg[off + HEADER..off + HEADER + len];
            let c = crc32c::crc32c(&lsn.to_le_bytes());
            let c = crc32c::crc32c_append(c, &(len as u32).to_le_bytes());
            let c = crc32c::crc32c_append(c, &count.to_le_bytes());
            let c = crc32c::crc32c_append(c, payload);
            seg[off + 16..off + 20].copy_from_slice(&c.to_le_bytes());
        }
        off += ALIGN;
    }
}
