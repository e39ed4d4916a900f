//! Entry points for the fuzz targets in `fuzz/` and for
//! `tests/suite/fuzz_corpus.rs`, which replays their corpora on every `cargo test`.
//! The parsers they reach are private to their modules; re-exporting them
//! here, and only here, leaves those modules' own interfaces as they were.
//! Not an API: hidden from the docs and free to change with the fuzzers.

pub use crate::handoff::object::{Builder as HandoffBuilder, decode as handoff_decode};
pub use crate::ingress::schema::{Event, parse as ingress_schema};
pub use crate::journal::intake::{
    LogReader, LogWriter, Logged, Packed, Read, decode as intake_decode, encode as intake_encode,
};

/// A hand-off object as a courier whose first key is `key` (base64)
/// stores it under `name`; `None` for a key that is not 32 bytes.
pub fn handoff_sealed(key: &str, name: &str, plain: Vec<u8>) -> Option<Vec<u8>> {
    let key = crate::seal::Key::parse(key).ok()?;
    Some(crate::handoff::object::store(&[key], name, plain))
}

/// The whole reader of a stored hand-off object, as adoption runs it:
/// opened with `keys` (base64), decoded, and each event checked as
/// ingress would; the events kept and set aside, or why none is read.
pub fn handoff_read(keys: &[&str], name: &str, stored: Vec<u8>) -> Result<(usize, usize), String> {
    let keys: Vec<_> = keys
        .iter()
        .filter_map(|k| crate::seal::Key::parse(k).ok())
        .collect();
    let events = crate::handoff::object::read(&keys, name, stored).map_err(|e| e.to_string())?;
    let limits = crate::event::rules::Limits {
        max_body_bytes: 1 << 20,
        keyed: false,
    };
    let (good, refused) = crate::handoff::sort(events, limits);
    Ok((good.len(), refused.len()))
}
