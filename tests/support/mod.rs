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

/// A JSON object of exactly `size` bytes (at least 512) shaped like a
/// payment provider's webhook: random ids, amounts and times, line items,
/// then a description in words to the size. What a backlog of real events stores
/// (journal/pack.rs packs it to about half), where `json_body`'s padding
/// would pack to almost nothing.
pub fn webhook_body(size: usize, seq: u64) -> bytes::Bytes {
    let mut x = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut id = |n: usize| -> String {
        (0..n)
            .map(|_| ALPHABET[(next() % 62) as usize] as char)
            .collect()
    };
    let (evt, pi, cus, req) = (id(24), id(24), id(14), id(14));
    let mut x2 = seq ^ 0x5851_f42d_4c95_7f2d;
    let mut num = move |m: u64| {
        x2 = x2
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x2 >> 33) % m
    };
    let created = 1_764_000_000 + num(10_000_000);
    let mut body = format!(
        r#"{{"id":"evt_{evt}","object":"event","api_version":"2024-06-20","created":{created},"type":"payment_intent.succeeded","livemode":false,"pending_webhooks":1,"request":{{"id":"req_{req}","idempotency_key":"{seq}"}},"data":{{"object":{{"id":"pi_{pi}","object":"payment_intent","amount":{},"currency":"eur","customer":"cus_{cus}","status":"succeeded","items":["#,
        num(100_000)
    );
    let tail_room = 40;
    let mut first = true;
    while body.len() + 90 + tail_room < size {
        if !first {
            body.push(',');
        }
        first = false;
        body.push_str(&format!(
            r#"{{"sku":"SKU-{}","quantity":{},"unit_amount":{},"tax_rate":"txr_{}"}}"#,
            num(1_000_000),
            1 + num(5),
            num(20_000),
            id(8)
        ));
    }
    body.push_str(r#"]}},"description":""#);
    let end = r#""}"#;
    const WORDS: [&str; 16] = [
        "order",
        "shipped",
        "to",
        "customer",
        "invoice",
        "paid",
        "by",
        "card",
        "for",
        "the",
        "subscription",
        "renewal",
        "of",
        "plan",
        "annual",
        "team",
    ];
    // Bounded: each pass adds at least one byte.
    while body.len() + end.len() < size {
        let room = size - body.len() - end.len();
        let word = WORDS[num(16) as usize];
        if room > word.len() {
            body.push_str(word);
            body.push(' ');
        } else {
            body.push_str(&id(room));
        }
    }
    body.push_str(end);
    bytes::Bytes::from(body)
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
