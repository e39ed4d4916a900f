//! Step l (issue #34): what ordering lanes cost on a fast endpoint, beside
//! the same build unordered in the same invocation.
//!
//! l. end to end as step b (wrk; accepted / (load + drain)), every event
//!    with an `Ordering-Key` header, 1,000 keys in turn, to a destination
//!    without `ordering` and with `ordering: { key: { header: Ordering-Key
//!    } }`, in the order unordered, ordered, ordered, unordered, so that a
//!    steady drift of the machine's speed weighs on both alike; the ratio
//!    is of the means of each's two rates, with CPU per event beside it.
//!    Then a backlog drain, unordered and ordered: the destination paused,
//!    wrk's load (the same 1,000 keys) for half of `--seconds` is accepted,
//!    and from the resume until nothing is pending: where ordering costs
//!    most, as every event but each key's first waits for a turn.
//!
//! Budget (issue #34): ordered end to end ≥ 0.8× unordered.

use std::path::Path;

use super::{
    Args, Budget, Check, DESTINATION, Row, admin_action, budget, config, cpu_seconds, drained,
    end_to_end_keyed, metric, proc_status, start_yaml, wrk_keyed,
};

/// Ordering keys, taken in turn by the load's requests.
const KEYS: usize = 1000;
const RATE_RATIO: f64 = 0.8;
const ORDERED: &str = "    ordering: { key: { header: Ordering-Key } }\n";

/// What step l measured, for its budget.
pub struct Measured {
    pub rows: Vec<Row>,
    /// Unordered and ordered: the mean of each side's two loads (events/s),
    /// and CPU per event over both (µs).
    rate: [f64; 2],
    us: [f64; 2],
}

pub fn budget_name() -> String {
    format!("ordering on {KEYS} keys end-to-end")
}

pub fn budgets(label: &str, m: &Measured) -> Vec<Budget> {
    let ratio = m.rate[1] / m.rate[0].max(1e-9);
    vec![budget(
        format!("{label} {}", budget_name()),
        vec![Check::at_least(ratio, RATE_RATIO, "x unordered")],
        format!(
            "ordered {:.0}/s at {:.1} µs/event, unordered {:.0}/s at {:.1} µs/event (means of two loads each): {ratio:.3}x (≥ {RATE_RATIO})",
            m.rate[1], m.us[1], m.rate[0], m.us[0]
        ),
    )]
}

/// Step l.
pub async fn ordering(label: &str, bin: &Path, rx: &str, args: &Args) -> Result<Measured, String> {
    let unordered = config(rx, "");
    let ordered = config(rx, ORDERED);
    let mut rows = Vec::new();
    let mut rates = [Vec::new(), Vec::new()];
    let mut cpu = [0.0; 2];
    let mut accepted = [0.0; 2];
    for lanes in [false, true, true, false] {
        let i = usize::from(lanes);
        let (name, yaml) = if lanes {
            ("ordered", &ordered)
        } else {
            ("unordered", &unordered)
        };
        let target = format!(
            "{label} l. end-to-end, {KEYS} keys, {name} ({})",
            rates[i].len() + 1
        );
        let row = end_to_end_keyed(target, bin, yaml, true, Some(KEYS), args).await?;
        rates[i].push(row.rate.unwrap_or(0.0));
        cpu[i] += row.cpu.unwrap_or(0.0);
        accepted[i] += row.events.unwrap_or(0.0);
        rows.push(row);
    }
    for (name, yaml) in [("unordered", &unordered), ("ordered", &ordered)] {
        rows.push(
            drain(
                format!("{label} l. backlog drain, {KEYS} keys, {name}"),
                bin,
                yaml,
                args,
            )
            .await?,
        );
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    Ok(Measured {
        rows,
        rate: [mean(&rates[0]), mean(&rates[1])],
        us: [0, 1].map(|i| cpu[i] * 1e6 / accepted[i].max(1.0)),
    })
}

/// A backlog accepted while paused (wrk, half of `--seconds`), timed from
/// the resume until nothing is pending.
async fn drain(target: String, bin: &Path, yaml: &str, args: &Args) -> Result<Row, String> {
    let run = start_yaml(bin, yaml, &[]).await?;
    let c = &run.courier;
    admin_action(c, "pause").await?;
    let half = Args {
        seconds: (args.seconds / 2).max(1),
        ..args.clone()
    };
    wrk_keyed(&c.url(DESTINATION), &half, Some(KEYS)).await?;
    let events = metric(c, super::PENDING).await.unwrap_or(0.0);
    let cpu = cpu_seconds(c.pid());
    admin_action(c, "resume").await?;
    let took = drained(c).await?;
    Ok(Row {
        target,
        rate: Some(events / took.as_secs_f64()),
        cpu: Some(cpu_seconds(c.pid()).unwrap_or(0.0) - cpu.unwrap_or(0.0)),
        events: Some(events),
        rss: proc_status(c.pid(), "VmHWM"),
        vs_direct: true,
        note: format!("{events:.0} events drained in {:.2} s", took.as_secs_f64()),
        ..Row::default()
    })
}
