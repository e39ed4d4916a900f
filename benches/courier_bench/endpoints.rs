//! Step m (issue #46): a `url: per_event` destination whose events name
//! 10,000 endpoints in turn, beside the same build's single fixed
//! destination in the same invocation.
//!
//! m. step b's end to end (wrk; accepted / (load + drain)) to one nginx
//!    listening on 10,000 loopback addresses (127.1.x.y, one port: each a
//!    distinct endpoint, with its own health, cap and connections), the
//!    request's `Courier-Endpoint` naming them in turn (`benches/post.lua`
//!    with `COURIER_BENCH_ENDPOINTS`), against step b's fixed destination
//!    to the single-address nginx receiver, in the order fixed, many, many,
//!    fixed. Each endpoint gets an event per 10,000: what a SaaS app's
//!    fan-out to its customers looks like, and the worst case for
//!    connection reuse.
//!
//! Budget (issue #46): many ≥ 0.8× fixed.

use std::net::Ipv4Addr;
use std::path::Path;

use super::alternated::{Alternated, TURNS};
use super::{Args, Budget, Nginx, config, end_to_end_env, start_yaml};

const RATIO: f64 = 0.8;
/// Endpoints the events name, in turn.
const ENDPOINTS: usize = 10_000;

/// Endpoint `i`'s loopback address: Linux routes all of 127.0.0.0/8 to
/// `lo`, so nginx binds these with no setup.
pub fn address(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 1, (i / 250) as u8, (i % 250 + 1) as u8)
}

pub fn budget_name() -> String {
    format!("{ENDPOINTS} endpoints end-to-end")
}

pub fn budgets(label: &str, m: &Alternated) -> Vec<Budget> {
    let name = format!("{label} {}", budget_name());
    vec![m.budget(name, RATIO, ["fixed", "many"], "x fixed")]
}

/// Step m.
pub async fn endpoints(
    label: &str,
    bin: &Path,
    rx: &str,
    args: &Args,
) -> Result<Alternated, String> {
    let many_rx = Nginx::receiver_on_many(ENDPOINTS)?;
    let fixed = config(rx, "");
    let many = config(
        "per_event",
        "    endpoints: { schemes: [http], allow_cidrs: [127.0.0.0/8] }\n",
    );
    // Checked once, so that a build without `per_event` fails here.
    drop(start_yaml(bin, &many, &[]).await?);
    let env = [(
        "COURIER_BENCH_ENDPOINTS",
        format!("{ENDPOINTS}:{}", many_rx.port),
    )];
    let mut m = Alternated::default();
    for named in TURNS {
        let (name, yaml, env) = if named {
            ("many", &many, &env[..])
        } else {
            ("fixed", &fixed, &[][..])
        };
        let target = format!("{label} m. end-to-end, {name} ({})", m.next(named));
        let row = end_to_end_env(target, bin, yaml, true, env, args).await?;
        m.push(named, row);
    }
    Ok(m)
}
