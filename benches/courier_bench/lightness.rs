//! Issue #47's budgets, each against a baseline run in the same
//! invocation: step b's CPU per delivered event against step h's durable
//! floor and nginx proxy's CPU per request, its rate and accept p99
//! against nginx proxy's; step p's passthrough to nginx against nginx
//! proxy's CPU; step q's durable run at 5,000 events/s and step d's
//! backlog by their peak RSS.

use super::{Budget, Check, MIB, Row, Wrk, budget};

/// Step h's row these budgets compare with.
pub const FLOOR_ROW: &str =
    "floor h. hyper + append + fdatasync, end to end, delivered from memory";
/// Step p's row, after its label.
pub const PASSTHROUGH_ROW: &str = "p. passthrough → nginx";

pub const END_TO_END: [&str; 2] = [
    "lightness: CPU per delivered event",
    "lightness: end to end rate and accept p99",
];
pub const PASSTHROUGH: &str = "lightness: passthrough CPU per request";
pub const PACED_RSS: &str = "lightness: RSS at 5,000 events/s";

const FLOOR_RATIO: f64 = 1.2;
const NGINX_CPU_RATIO: f64 = 2.5;
const RATE_RATIO: f64 = 0.6;
const P99_RATIO: f64 = 5.0;
const PASSTHROUGH_RATIO: f64 = 1.3;
const PACED_RSS_MIB: f64 = 24.0;
const BACKLOG_RSS_MIB: f64 = 32.0;

/// Step b's two budgets; `proxy` is the run's first nginx proxy baseline,
/// used when none was measured beside the row.
pub fn end_to_end(label: &str, row: &Row, proxy: Option<&Wrk>, floor: Option<f64>) -> [Budget; 2] {
    let [cpu_name, load_name] = END_TO_END.map(|n| format!("{label} {n}"));
    let near = row.against.as_ref().or(proxy).filter(|p| p.rate > 0.0);
    let us = row.cpu_per_event_us();
    let nginx_us = near.and_then(|p| p.nginx_us(true));
    let mut checks = Vec::new();
    let mut detail = Vec::new();
    if let (Some(us), Some(f)) = (us, floor) {
        checks.push(Check::at_most(us / f, FLOOR_RATIO, "x floor"));
        detail.push(format!(
            "{us:.1} µs = {:.2}x the floor's {f:.1} (≤ {FLOOR_RATIO})",
            us / f
        ));
    }
    if let (Some(us), Some(n)) = (us, nginx_us) {
        checks.push(Check::at_most(us / n, NGINX_CPU_RATIO, "x nginx proxy"));
        detail.push(format!(
            "{:.2}x nginx proxy's {n:.1} µs a request (≤ {NGINX_CPU_RATIO})",
            us / n
        ));
    }
    let cpu = budget(
        cpu_name,
        checks,
        if detail.is_empty() {
            "no floor (step h) or nginx proxy CPU to compare with".into()
        } else {
            detail.join("; ")
        },
    );
    let (rate, p99) = (row.rate.unwrap_or(0.0), row.latency.map_or(0.0, |l| l.1));
    let load = match near.filter(|p| p.p99 > 0.0) {
        Some(p) => budget(
            load_name,
            vec![
                Check::at_least(rate / p.rate, RATE_RATIO, "x proxy"),
                Check::at_most(p99 / p.p99, P99_RATIO, "x proxy's p99"),
            ],
            format!(
                "{rate:.0}/s = {:.3}x proxy (≥ {RATE_RATIO}), accept p99 {p99:.2} ms = {:.2}x proxy's (≤ {P99_RATIO})",
                rate / p.rate,
                p99 / p.p99
            ),
        ),
        None => budget(load_name, Vec::new(), "no nginx proxy baseline".into()),
    };
    [cpu, load]
}

/// Step p's budget: passthrough to nginx, CPU per request against nginx
/// proxy's.
pub fn passthrough(label: &str, row: Option<&Row>, proxy: Option<&Wrk>) -> Budget {
    let name = format!("{label} {PASSTHROUGH}");
    match (
        row.and_then(Row::cpu_per_event_us),
        proxy.and_then(|p| p.nginx_us(true)),
    ) {
        (Some(us), Some(n)) => budget(
            name,
            vec![Check::at_most(us / n, PASSTHROUGH_RATIO, "x nginx proxy")],
            format!(
                "{us:.1} µs = {:.2}x nginx proxy's {n:.1} µs a request (≤ {PASSTHROUGH_RATIO})",
                us / n
            ),
        ),
        _ => budget(
            name,
            Vec::new(),
            "no nginx proxy CPU to compare with".into(),
        ),
    }
}

/// Step q's durable run: its peak RSS.
pub fn paced_rss(label: &str, hwm: u64) -> Budget {
    let mib = hwm as f64 / MIB;
    budget(
        format!("{label} {PACED_RSS}"),
        vec![Check::at_most(mib, PACED_RSS_MIB, " MiB")],
        format!("VmHWM {mib:.1} MiB (≤ {PACED_RSS_MIB}), durable, the defaults"),
    )
}

/// Step d: the peak RSS while the backlog was filled.
pub fn backlog_rss(label: &str, events: u64, hwm_mib: f64) -> Budget {
    budget(
        format!("{label} lightness: {events} backlog peak RSS"),
        vec![Check::at_most(hwm_mib, BACKLOG_RSS_MIB, " MiB")],
        format!("VmHWM {hwm_mib:.1} MiB (≤ {BACKLOG_RSS_MIB})"),
    )
}
