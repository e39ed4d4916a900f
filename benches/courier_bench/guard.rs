//! Step u (issue #46): what the address guard costs end to end, beside
//! the same build with it off in the same invocation.
//!
//! u. step b's end to end (wrk; accepted / (load + drain)) to the nginx
//!    receiver with `endpoints: { guard: on, allow_cidrs: [127.0.0.0/8] }`
//!    (the receiver is on loopback, which the guard refuses unless opened)
//!    and without the key, in the order off, on, on, off, so that the
//!    machine's drift weighs on both alike. The guard is asked once per
//!    new connection (the url is an IP literal: no DNS on either side), and
//!    connections are pooled, so this measures what it adds to the
//!    delivery path as a whole.
//!
//! Budget (issue #46): on ≥ 0.95× off.

use std::path::Path;

use super::{Args, Budget, Check, Row, budget, config, end_to_end_env, start_yaml};

const RATIO: f64 = 0.95;

/// What step u measured, for its budget.
pub struct Measured {
    pub rows: Vec<Row>,
    /// Off and on: the mean of each side's two loads (events/s), and CPU
    /// per event over both (µs).
    rate: [f64; 2],
    us: [f64; 2],
}

pub fn budget_name() -> String {
    "address guard on end-to-end".to_string()
}

pub fn budgets(label: &str, m: &Measured) -> Vec<Budget> {
    let ratio = m.rate[1] / m.rate[0].max(1e-9);
    vec![budget(
        format!("{label} {}", budget_name()),
        vec![Check::at_least(ratio, RATIO, "x off")],
        format!(
            "on {:.0}/s at {:.1} µs/event, off {:.0}/s at {:.1} µs/event (means of two loads each): {ratio:.3}x (≥ {RATIO})",
            m.rate[1], m.us[1], m.rate[0], m.us[0]
        ),
    )]
}

/// Step u.
pub async fn guard(label: &str, bin: &Path, rx: &str, args: &Args) -> Result<Measured, String> {
    let off = config(rx, "");
    let on = config(
        rx,
        "    endpoints: { guard: on, allow_cidrs: [127.0.0.0/8] }\n",
    );
    // Checked once, so that a build without the guard fails here, not as
    // a row of `on` measuring `off`.
    drop(start_yaml(bin, &on, &[]).await?);
    let mut rows = Vec::new();
    let mut rates = [Vec::new(), Vec::new()];
    let mut cpu = [0.0; 2];
    let mut accepted = [0.0; 2];
    for guarded in [false, true, true, false] {
        let i = usize::from(guarded);
        let (name, yaml) = if guarded { ("on", &on) } else { ("off", &off) };
        let target = format!(
            "{label} u. end-to-end, guard {name} ({})",
            rates[i].len() + 1
        );
        let row = end_to_end_env(target, bin, yaml, true, &[], args).await?;
        rates[i].push(row.rate.unwrap_or(0.0));
        cpu[i] += row.cpu.unwrap_or(0.0);
        accepted[i] += row.events.unwrap_or(0.0);
        rows.push(row);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    Ok(Measured {
        rows,
        rate: [mean(&rates[0]), mean(&rates[1])],
        us: [0, 1].map(|i| cpu[i] * 1e6 / accepted[i].max(1.0)),
    })
}
