//! courier's integration tests, one module per behaviour, in one test
//! binary: each binary of its own would compile and link tokio, hyper and the
//! test support again (about 10 s each on 2 cores, against under a minute for
//! all of them together). Run one area with `cargo test --profile suite --test
//! suite <module>::`, e.g. `crash::`.
//!
//! Every module drives a real courier process (`support::Courier`) against
//! loopback receivers (`support::Receiver`).

mod adaptive;
mod address_guard;
mod admin;
mod azure_blob;
mod backlog;
mod backpressure;
mod batching;
mod chaos;
mod cli;
mod crash;
mod crash_loop;
mod crash_windows;
mod credits;
mod dead_letter_bucket;
mod dead_letter_bytes;
mod dead_letter_files;
mod dead_letter_once;
mod dead_letter_sink;
mod dead_letters_api;
mod dedupe;
mod delivery;
mod deploy;
mod disk;
mod docs;
mod edges;
mod endpoints;
mod fuzz_corpus;
mod handoff;
mod handoff_trust;
mod headers_config;
mod health;
mod history;
mod ingress;
mod late;
mod logs;
mod mass_expiry;
mod memory;
mod metrics;
mod monitoring;
mod ordering;
mod passthrough;
mod pauses;
mod publishers;
mod regressions;
mod release;
mod reload;
mod resources;
mod schemas;
mod signing;
mod support_smoke;
mod sync_order;
mod tls;
mod topics;
mod tracing;
mod trust;
