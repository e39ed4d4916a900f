//! Entry points for the fuzz targets in `fuzz/` and for
//! `tests/suite/fuzz_corpus.rs`, which replays their corpora on every `cargo test`.
//! The parsers they reach are private to their modules; re-exporting them
//! here, and only here, leaves those modules' own interfaces as they were.
//! Not an API: hidden from the docs and free to change with the fuzzers.

pub use crate::handoff::object::{Builder as HandoffBuilder, decode as handoff_decode};
pub use crate::ingress::schema::{Event, SchemaError, parse as ingress_schema};
pub use crate::journal::intake::{
    LogReader, LogWriter, Logged, Read, decode as intake_decode, encode as intake_encode,
};
