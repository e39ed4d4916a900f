//! A long outage: the receiver is down while far more events arrive than
//! the journal's ready queue holds in memory (4 MiB per destination). They
//! wait in the index, courier's memory stays bounded, and once the
//! receiver is up every event is delivered with its bytes.

use std::collections::HashMap;
use std::time::Duration;
use support::{Courier, Receiver, Reply, behavior, client, json_body, proc_status, refusing_port};

const WORKERS: usize = 16;
const PER_WORKER: usize = 2000;
const BODY: usize = 2048;
/// Peak RSS allowed: the process at rest (~12 MiB), the ready queue's
/// 4 MiB, the indexer's read chunk (up to 8,192 events: 16 MiB here), the
/// writer's group buffer, SQLite's caches and 16 connections' buffers, with
/// room for a loaded CI machine (43 MiB seen); holding the backlog (64 MiB
/// of bodies on top of the process) would pass it.
const PEAK_RSS_KIB: u64 = 60 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_beyond_the_memory_bound_waits_in_the_index_and_is_all_delivered() {
    let (socket, port) = refusing_port();
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = support::config(
        "orders",
        &format!("http://127.0.0.1:{port}/hooks"),
        "concurrency: 8
         retry: { schedule: [1s], max_attempts: 30, jitter: 0 }
         probation: { after_failures: 0 }",
    );
    let courier = Courier::start(tmp.path(), &yaml).await;
    let url = courier.url("orders");
    let mut posts = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let url = url.clone();
        posts.spawn(async move {
            let mut posted = Vec::with_capacity(PER_WORKER);
            for i in 0..PER_WORKER {
                let seq = (w * PER_WORKER + i) as u64;
                let id = format!("evt-{seq}");
                let body = json_body(BODY, seq);
                let r = client::post(&url, body.clone(), &[("idempotency-key", &id)]).await;
                assert_eq!(r.status, 202, "event {id}: {}", r.text());
                posted.push((id, body));
            }
            posted
        });
    }
    let mut posted: HashMap<String, bytes::Bytes> = HashMap::new();
    while let Some(done) = posts.join_next().await {
        posted.extend(done.expect("poster"));
    }
    let total = WORKERS * PER_WORKER;
    assert_eq!(posted.len(), total);

    drop(socket);
    let receiver = Receiver::start_on(
        ([127, 0, 0, 1], port).into(),
        behavior(|_, _| Reply::status(200)),
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let seen = loop {
        let mut seen: HashMap<String, Vec<bytes::Bytes>> = HashMap::new();
        for r in receiver.received() {
            seen.entry(r.header("webhook-id").unwrap_or("").to_string())
                .or_default()
                .push(r.body.clone());
        }
        let missing = posted.keys().filter(|id| !seen.contains_key(*id)).count();
        if missing == 0 {
            break seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{missing} of {total} events not delivered\n{}",
            courier.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (id, body) in &posted {
        for got in &seen[id] {
            assert!(got == body, "event {id} delivered with other bytes");
        }
    }
    let peak = proc_status(courier.pid(), "VmHWM").expect("VmHWM of a running courier");
    println!("backlog {total} events of {BODY} bytes: peak RSS {peak} KiB");
    assert!(
        peak < PEAK_RSS_KIB,
        "peak RSS {peak} KiB with a backlog of {} KiB: the backlog is held in memory",
        total * BODY / 1024
    );
}
