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

use super::alternated::{Alternated, TURNS};
use super::{Args, Budget, config, end_to_end_env, start_yaml};

const RATIO: f64 = 0.95;

pub fn budget_name() -> String {
    "address guard on end-to-end".to_string()
}

pub fn budgets(label: &str, m: &Alternated) -> Vec<Budget> {
    let name = format!("{label} {}", budget_name());
    vec![m.budget(name, RATIO, ["off", "on"], "x off")]
}

/// Step u.
pub async fn guard(label: &str, bin: &Path, rx: &str, args: &Args) -> Result<Alternated, String> {
    let off = config(rx, "");
    let on = config(
        rx,
        "    endpoints: { guard: on, allow_cidrs: [127.0.0.0/8] }\n",
    );
    // Checked once, so that a build without the guard fails here, not as
    // a row of `on` measuring `off`.
    drop(start_yaml(bin, &on, &[]).await?);
    let mut m = Alternated::default();
    for guarded in TURNS {
        let (name, yaml) = if guarded { ("on", &on) } else { ("off", &off) };
        let target = format!("{label} u. end-to-end, guard {name} ({})", m.next(guarded));
        let row = end_to_end_env(target, bin, yaml, true, &[], args).await?;
        m.push(guarded, row);
    }
    Ok(m)
}
