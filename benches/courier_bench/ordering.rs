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

use super::alternated::{Alternated, TURNS};
use super::{
    Args, Budget, DESTINATION, Row, admin_action, config, cpu_seconds, drained, end_to_end_keyed,
    metric, proc_status, start_yaml, wrk_keyed,
};

/// Ordering keys, taken in turn by the load's requests.
const KEYS: usize = 1000;
const RATE_RATIO: f64 = 0.8;
const ORDERED: &str = "    ordering: { key: { header: Ordering-Key } }\n";

pub fn budget_name() -> String {
    format!("ordering on {KEYS} keys end-to-end")
}

pub fn budgets(label: &str, m: &Alternated) -> Vec<Budget> {
    let name = format!("{label} {}", budget_name());
    vec![m.budget(name, RATE_RATIO, ["unordered", "ordered"], "x unordered")]
}

/// Step l.
pub async fn ordering(
    label: &str,
    bin: &Path,
    rx: &str,
    args: &Args,
) -> Result<Alternated, String> {
    let unordered = config(rx, "");
    let ordered = config(rx, ORDERED);
    let mut m = Alternated::default();
    for lanes in TURNS {
        let (name, yaml) = if lanes {
            ("ordered", &ordered)
        } else {
            ("unordered", &unordered)
        };
        let target = format!(
            "{label} l. end-to-end, {KEYS} keys, {name} ({})",
            m.next(lanes)
        );
        let row = end_to_end_keyed(target, bin, yaml, true, Some(KEYS), args).await?;
        m.push(lanes, row);
    }
    for (name, yaml) in [("unordered", &unordered), ("ordered", &ordered)] {
        m.rows.push(
            drain(
                format!("{label} l. backlog drain, {KEYS} keys, {name}"),
                bin,
                yaml,
                args,
            )
            .await?,
        );
    }
    Ok(m)
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
