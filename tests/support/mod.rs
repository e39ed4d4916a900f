//! Test support for courier: a webhook `Receiver` (and `chaos`, one that
//! misbehaves at random), the `Courier` child process harness, HTTP `client`
//! helpers and a `load` generator; for the end-to-end tests, `checks`
//! (`fail!`, `check!`, `check_eq!` and bounded waits), `deadletters`
//! readers, `setup` helpers, and `python` and `node` (independent checkers
//! from PyPI and npm).
//!
//! A crate of its own (`courier-test-support`, a dev-dependency named
//! `support`) used by the integration tests and `benches/courier_bench.rs`,
//! so it is compiled once instead of into every test binary.

pub mod certs;
pub mod chaos;
pub mod checks;
pub mod client;
pub mod courier;
pub mod deadletters;
pub mod install;
pub mod load;
pub mod markdown;
pub mod node;
pub mod otlp;
pub mod python;
pub mod receiver;
pub mod setup;
pub mod stores;

pub use checks::{alone, quiet, requests, wait_metric};
pub use client::{Resp, admin_post, destination_view, get, json, metric, metric_sum, post};
pub use courier::{CliOutput, Courier, courier_bin, proc_status, reset_peak_rss, run_cli};
pub use deadletters::{block_sink, dl_dir, files_under, read_dead_letters, wait_dead_letters};
pub use load::{LoadReport, LoadSpec};
pub use receiver::{Behavior, Capacity, Received, Receiver, Reply, behavior};
pub use setup::{config, now_ms, refusing_port};

/// An Event Grid array of `n` events, ids `{prefix}{from}` onwards, each
/// with `data: {"n": i}`.
pub fn eventgrid_events(prefix: &str, from: usize, n: usize) -> String {
    let events: Vec<serde_json::Value> = (from..from + n)
        .map(|i| serde_json::json!({"id": format!("{prefix}{i}"), "subject": "s", "eventType": "t", "eventTime": "2026-11-23T09:00:00Z", "data": {"n": i}, "dataVersion": "1"}))
        .collect();
    serde_json::Value::Array(events).to_string()
}

/// A JSON object of exactly `size` bytes (at least 32), e.g. for 1 KiB
/// benchmark events: `{"kind":"bench","seq":SEQ,"pad":"xxxx…"}`.
pub fn json_body(size: usize, seq: u64) -> bytes::Bytes {
    let head = format!(r#"{{"kind":"bench","seq":{seq},"pad":""#);
    let tail = r#""}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut body = String::with_capacity(size);
    body.push_str(&head);
    body.extend(std::iter::repeat_n('x', pad));
    body.push_str(tail);
    bytes::Bytes::from(body)
}
