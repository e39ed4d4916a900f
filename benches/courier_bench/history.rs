//! Step y (issue #33): what event history costs, each figure beside the
//! same build with `history: { retain: 0s }` (off) in the same invocation.
//!
//! y. end to end as step b (wrk; accepted / (load + drain)), history off
//!    and on (the default, `retain: 24h, max_bytes: 256MiB`), in the order
//!    off, on, on, off, so that a steady drift of the machine's speed
//!    weighs on both alike; the ratio is of the means of each's two rates,
//!    with CPU per event beside it. Then 1,000,000 events (`--scale`
//!    multiplies them), 1 KiB each, from the Rust load generator, each with
//!    an `Idempotency-Key` of its own (its event id, as long as the UUIDv7
//!    courier would give), delivered to nginx during the load: history on,
//!    then off. Once every one is delivered and (on) recorded as
//!    delivered: the size of `<journal.dir>/history/` (every file, WAL
//!    included), 2,000 lookups of random ids among them by `GET
//!    /v1/events/{id}` on the admin listener, one after another, each
//!    timed from the request to the whole answer; and courier's RSS beside
//!    the same million with history off. The end-to-end rows and the
//!    million's give courier's CPU per event by thread (history is
//!    recorded by `journal-indexer`) and its bytes written to storage per
//!    event (`write_bytes` of /proc/PID/io).
//!
//! Budgets (issue #33): end to end with history ≥ 0.9× without; ≤ 200
//! bytes per event on disk; lookup p99 ≤ 5 ms; VmRSS after the million
//! (and after the lookups, the larger) ≤ 10 MiB over history off's.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use rand::Rng;
use support::client::{find_metric, try_get};
use support::load;

use super::alternated::{Alternated, TURNS};
use super::{
    Args, Budget, Check, DEADLINE, DELIVERED, DESTINATION, MIB, PENDING, POLL, Row, Run, backlog,
    budget, config, cpu_seconds, disk_bytes, end_to_end_with, events_to, metric, per_thread,
    proc_status, start_yaml, thread_cpu, written_bytes, written_per_event,
};

/// The history's events, before `--scale`.
pub const HISTORY_EVENTS: f64 = 1_000_000.0;
/// Lookups by id, at most one per event.
const LOOKUPS: u64 = 2_000;
/// GETs of `/healthz` before the lookups: what a request to the admin
/// listener costs without history, for scale.
const PROBES: usize = 200;
/// The event id's header and its first 24 characters (`load::numbered`).
const KEY: &str = "idempotency-key";
const ID_PREFIX: &str = "0193a5c2-7b1e-7000-8000-";
const RECORDS: &str = "courier_history_records";
const HISTORY_BYTES: &str = "courier_history_bytes";
/// Appended to a config: history off.
const OFF: &str = "history: { retain: 0s }\n";
/// After the last event, before disk and RSS are read: the allocator's
/// purge, the indexer's last commits and checkpoints.
const SETTLE: Duration = Duration::from_secs(2);

/// The budgets of issue #33.
const RATE_RATIO: f64 = 0.9;
const BYTES_PER_EVENT: f64 = 200.0;
const LOOKUP_P99_MS: f64 = 5.0;
const RSS_OVER_MIB: f64 = 10.0;

/// What step y measured, for its budgets.
pub struct Measured {
    pub rows: Vec<Row>,
    events: u64,
    /// End to end, history off and on.
    end_to_end: Alternated,
    /// The history's files, allocated bytes.
    disk: u64,
    p50_ms: f64,
    p99_ms: f64,
    /// VmRSS after the million, off and on (on: the larger of before and
    /// after the lookups).
    rss: [u64; 2],
}

/// The names of step y's budgets, without the label.
pub fn budget_names(args: &Args) -> [String; 4] {
    let events = backlog(HISTORY_EVENTS, args);
    [
        "history end-to-end".to_owned(),
        format!("history of {events} disk"),
        format!("history of {events} lookup p99"),
        format!("history of {events} RSS"),
    ]
}

pub fn budgets(label: &str, m: &Measured, args: &Args) -> Vec<Budget> {
    let [rate, disk, lookup, rss] = budget_names(args).map(|name| format!("{label} {name}"));
    let per_event = m.disk as f64 / m.events as f64;
    let over = (m.rss[1] as f64 - m.rss[0] as f64) / MIB;
    vec![
        m.end_to_end
            .budget(rate, RATE_RATIO, ["off", "on"], "x off"),
        budget(
            disk,
            vec![Check::at_most(per_event, BYTES_PER_EVENT, " bytes/event")],
            format!(
                "history/ {:.1} MiB = {per_event:.0} bytes/event (≤ {BYTES_PER_EVENT:.0})",
                m.disk as f64 / MIB
            ),
        ),
        budget(
            lookup,
            vec![Check::at_most(m.p99_ms, LOOKUP_P99_MS, " ms")],
            format!(
                "GET /v1/events/{{id}}: p50 {:.2} ms, p99 {:.2} ms (≤ {LOOKUP_P99_MS})",
                m.p50_ms, m.p99_ms
            ),
        ),
        budget(
            rss,
            vec![Check::at_most(over, RSS_OVER_MIB, " MiB")],
            format!(
                "VmRSS on {:.1} MiB, off {:.1} MiB: {over:+.1} MiB (≤ {RSS_OVER_MIB})",
                m.rss[1] as f64 / MIB,
                m.rss[0] as f64 / MIB
            ),
        ),
    ]
}

fn side(history: bool) -> &'static str {
    if history { "on" } else { "off" }
}

/// Step y.
pub async fn history(label: &str, bin: &Path, rx: &str, args: &Args) -> Result<Measured, String> {
    let on = config(rx, "");
    let off = format!("{on}{OFF}");
    let yaml = |history: bool| if history { &on } else { &off };
    let mut end_to_end = Alternated::default();
    for history in TURNS {
        let target = format!(
            "{label} y. end-to-end, history {} ({})",
            side(history),
            end_to_end.next(history)
        );
        let row = end_to_end_with(target, bin, yaml(history), true, args).await?;
        end_to_end.push(history, row);
    }
    let mut rows = std::mem::take(&mut end_to_end.rows);

    let events = backlog(HISTORY_EVENTS, args);
    // History on, with its lookups; then off, in a courier of its own.
    let run = start_yaml(bin, &on, &[]).await?;
    let mut with = deliver(label, &run, events, true, args).await?;
    let dir = run.dir.path().join("journal").join("history");
    let (disk, apparent, _) = disk_bytes(&dir);
    let files = std::fs::read_dir(&dir).map_or(0, |d| d.count());
    let said = metric(&run.courier, HISTORY_BYTES).await.unwrap_or(-1.0);
    let looked = lookups(label, &run, events).await?;
    let pid = run.courier.pid();
    let after = proc_status(pid, "VmRSS").unwrap_or(0);
    with.row.note = format!(
        "{} history/ {:.1} MiB in {files} files ({:.0} bytes/event; files' size {:.1} MiB; courier_history_bytes {:.1} MiB). After the lookups VmRSS {:.1} MiB ({}).",
        with.row.note,
        disk as f64 / MIB,
        disk as f64 / events as f64,
        apparent as f64 / MIB,
        said / MIB,
        after as f64 / MIB,
        rss_parts(pid),
    );
    rows.push(with.row);
    rows.push(looked.row);
    drop(run);
    let run = start_yaml(bin, &off, &[]).await?;
    let without = deliver(label, &run, events, false, args).await?;
    let (off_disk, _, _) = disk_bytes(&run.dir.path().join("journal").join("history"));
    if off_disk > 0 {
        return Err(format!("history off, yet history/ holds {off_disk} bytes"));
    }
    rows.push(without.row);
    drop(run);
    Ok(Measured {
        rows,
        events,
        end_to_end,
        disk,
        p50_ms: looked.p50_ms,
        p99_ms: looked.p99_ms,
        rss: [without.rss, with.rss.max(after)],
    })
}

/// One side's million: its row, and VmRSS once it settled.
struct Delivered {
    row: Row,
    rss: u64,
}

/// Sends `events` numbered events to `run`'s courier, delivered to nginx
/// as they come, and waits until every one is delivered and nothing is
/// pending, and (`history`) every one is recorded as delivered. Nothing
/// reads courier's metrics during the load, so that both sides spend
/// the same on it.
async fn deliver(
    label: &str,
    run: &Run,
    events: u64,
    history: bool,
    args: &Args,
) -> Result<Delivered, String> {
    let c = &run.courier;
    let pid = c.pid();
    let cpu = cpu_seconds(pid);
    let threads = thread_cpu(pid);
    let written = written_bytes(pid);
    let started = Instant::now();
    let spec = events_to(c.url(DESTINATION), args.connections);
    let report = load::run_n_numbered(spec, events, KEY, ID_PREFIX).await;
    let loaded = started.elapsed();
    if report.status_count(202) != events {
        return Err(format!(
            "{events} sent: statuses {:?}, first error {:?}",
            report.statuses, report.first_error
        ));
    }
    let metrics = format!("{}/metrics", c.admin_url());
    let mut done = None;
    // Bounded by the deadline.
    let recorded = loop {
        let text = try_get(&metrics).await?.text();
        let delivered = find_metric(&text, DELIVERED).unwrap_or(0.0);
        let pending = find_metric(&text, PENDING);
        if done.is_none() && delivered >= events as f64 && pending == Some(0.0) {
            done = Some(started.elapsed());
        }
        if let Some(done) = done {
            if !history {
                break done;
            }
            // The records' gauge is published about once a second; the
            // counts by state are live.
            let records = find_metric(&text, RECORDS).unwrap_or(0.0);
            if records >= events as f64 && delivered_in_history(c).await? >= events {
                break started.elapsed();
            }
        }
        if started.elapsed() >= DEADLINE {
            return Err(format!(
                "after {DEADLINE:?}: {delivered} of {events} delivered, {pending:?} pending, {:?} history records",
                find_metric(&text, RECORDS)
            ));
        }
        tokio::time::sleep(POLL).await;
    };
    let done = done.unwrap_or(recorded);
    let used = cpu_seconds(pid).zip(cpu).map(|(now, before)| now - before);
    let by = per_thread(&threads, &thread_cpu(pid), events as f64);
    let wrote = written_per_event(written, written_bytes(pid), events as f64);
    tokio::time::sleep(SETTLE).await;
    let rss = proc_status(pid, "VmRSS").unwrap_or(0);
    let mut note = format!(
        "sent with their own ids in {:.1} s ({:.0}/s), all delivered {:.1} s from the start",
        loaded.as_secs_f64(),
        report.rate(),
        done.as_secs_f64()
    );
    if history {
        let _ = write!(
            note,
            ", all recorded as delivered at {:.1} s",
            recorded.as_secs_f64()
        );
    }
    let _ = write!(
        note,
        ". {by} {wrote} VmRSS {:.1} MiB {SETTLE:?} later ({}).",
        rss as f64 / MIB,
        rss_parts(pid)
    );
    let row = Row {
        target: format!("{label} y. history {}: {events} delivered", side(history)),
        rate: Some(events as f64 / done.as_secs_f64()),
        cpu: used,
        events: Some(events as f64),
        rss: proc_status(pid, "VmHWM"),
        note,
        ..Row::default()
    };
    Ok(Delivered { row, rss })
}

/// `events.delivered` of the destination in `GET /v1/destinations`:
/// records in history whose state is delivered.
async fn delivered_in_history(c: &support::Courier) -> Result<u64, String> {
    let url = format!("{}/v1/destinations", c.admin_url());
    let resp = try_get(&url).await?;
    let json: serde_json::Value = serde_json::from_slice(&resp.body)
        .map_err(|e| format!("GET {url}: {}: not JSON ({e})", resp.status))?;
    let found = json["destinations"]
        .as_array()
        .and_then(|all| all.iter().find(|d| d["name"] == DESTINATION))
        .and_then(|d| d["events"]["delivered"].as_u64());
    found.ok_or_else(|| format!("GET {url}: no events.delivered for {DESTINATION}: {json}"))
}

/// RssAnon and RssFile of `pid`, in MiB.
fn rss_parts(pid: u32) -> String {
    ["RssAnon", "RssFile"]
        .map(|k| format!("{k} {:.1}", proc_status(pid, k).unwrap_or(0) as f64 / MIB))
        .join(", ")
}

/// What the lookups measured.
struct Looked {
    row: Row,
    p50_ms: f64,
    p99_ms: f64,
}

/// `LOOKUPS` random ids among the `events` sent, one `GET /v1/events/{id}`
/// after another on one kept-alive connection, each timed from the request
/// to the whole answer; every answer must be 200 with the event delivered
/// once. After as many GETs of `/healthz`, for scale.
async fn lookups(label: &str, run: &Run, events: u64) -> Result<Looked, String> {
    let admin = run.courier.admin_url();
    let n = LOOKUPS.min(events);
    // Picked before any await: the thread's generator is not `Send`.
    let picks: Vec<u64> = {
        let mut rng = rand::rng();
        (0..n).map(|_| rng.random_range(0..events)).collect()
    };
    let mut probes = Vec::with_capacity(PROBES);
    for _ in 0..PROBES {
        let t = Instant::now();
        let resp = try_get(&format!("{admin}/healthz")).await?;
        probes.push(t.elapsed().as_secs_f64() * 1e3);
        if resp.status != 200 {
            return Err(format!("GET /healthz: {}", resp.status));
        }
    }
    let mut ms = Vec::with_capacity(picks.len());
    let started = Instant::now();
    for &i in &picks {
        let id = load::numbered(ID_PREFIX, i);
        let url = format!("{admin}/v1/events/{id}");
        let t = Instant::now();
        let resp = try_get(&url).await?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        let json: serde_json::Value = serde_json::from_slice(&resp.body).map_err(|e| {
            format!(
                "GET {url}: {}: not JSON ({e}): {}",
                resp.status,
                resp.text()
            )
        })?;
        let deliveries = json["deliveries"].as_array().map_or(0, Vec::len);
        if resp.status != 200
            || json["id"] != id.as_str()
            || deliveries != 1
            || json["deliveries"][0]["state"] != "delivered"
        {
            return Err(format!("GET {url}: {}: {json}", resp.status));
        }
    }
    let took = started.elapsed();
    let (p50, p99, p999) = (
        percentile(&mut ms, 50.0),
        percentile(&mut ms, 99.0),
        percentile(&mut ms, 99.9),
    );
    let max = ms.last().copied().unwrap_or(0.0);
    let probe = percentile(&mut probes, 50.0);
    let row = Row {
        target: format!("{label} y. lookup by id among {events}"),
        rate: Some(picks.len() as f64 / took.as_secs_f64()),
        latency: Some((p50, p99, p999)),
        note: format!(
            "{} random ids, one GET /v1/events/{{id}} after another, each 200 with its one delivery delivered; max {max:.2} ms. GET /healthz on the same connection: p50 {probe:.2} ms.",
            picks.len()
        ),
        ..Row::default()
    };
    Ok(Looked {
        row,
        p50_ms: p50,
        p99_ms: p99,
    })
}

/// Nearest rank; sorts `values`.
fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return 0.0;
    }
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    values[rank.clamp(1, n) - 1]
}
