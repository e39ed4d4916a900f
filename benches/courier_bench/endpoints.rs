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
//!
//! v. 100,000 endpoints tracked (`tracked`): RSS above the same build
//!    idle. Budget: ≤ 64 MiB.
//!
//! w. noisy neighbour (`noisy`): the healthy endpoints' delivery latency
//!    with a sick endpoint against without. Budget: p99 ≤ 2×.

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::client::try_post;
use support::json_body;

use super::alternated::{Alternated, TURNS};
use super::{
    Args, Budget, Check, DESTINATION, MIB, Nginx, Row, budget, config, cpu_seconds, end_to_end_env,
    metric, proc_status, start_yaml,
};

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

/// Step v: endpoints whose state courier holds.
const TRACKED: usize = 100_000;
/// Step v's budget: RSS above the same build idle.
const TRACKED_MIB: f64 = 64.0;
/// Step v's publishers at once.
const PUBLISHERS: usize = 32;

pub fn tracked_budget_name() -> String {
    format!("{TRACKED} endpoints tracked, RSS above idle")
}

/// Step v: a `url: per_event` destination given one event for each of
/// 100,000 endpoints that refuse connections (127.2.x.y at a port where
/// nothing listens: each attempt fails at once and is retried an hour
/// later), so that courier holds the state of every one; its RSS then,
/// against the same courier's before the first event.
pub async fn tracked(label: &str, bin: &Path) -> Result<(Row, Budget), String> {
    let yaml = config(
        "per_event",
        "    retry: { schedule: [1h] }\n    endpoints: { schemes: [http], allow_cidrs: [127.0.0.0/8] }\n",
    )
    .replace("concurrency: 64", "concurrency: 256");
    let run = start_yaml(bin, &yaml, &[]).await?;
    let c = &run.courier;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = proc_status(c.pid(), "VmRSS").unwrap_or(0);
    let (_refusing, port) = support::refusing_port();
    let url = c.url(DESTINATION);
    let started = Instant::now();
    post_many(&url, TRACKED, move |i| {
        format!(
            "http://127.{}.{}.{}:{port}/",
            2 + i / 62_500,
            (i / 250) % 250,
            i % 250 + 1
        )
    })
    .await?;
    // Every endpoint attempted once: held, and counted by state.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut held = 0.0;
    // Bounded by the deadline.
    while Instant::now() < deadline {
        held = 0.0;
        for state in ["healthy", "probation", "paused", "disabled"] {
            let series =
                format!("courier_endpoints{{destination=\"{DESTINATION}\",state=\"{state}\"}}");
            held += metric(c, &series).await.unwrap_or(0.0);
        }
        if held >= TRACKED as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if held < TRACKED as f64 {
        return Err(format!("{held} of {TRACKED} endpoints held after 120 s"));
    }
    let took = started.elapsed();
    let rss = proc_status(c.pid(), "VmRSS").unwrap_or(0);
    let peak = proc_status(c.pid(), "VmHWM").unwrap_or(0);
    let above = rss.saturating_sub(idle) as f64 / MIB;
    let row = Row {
        target: format!("{label} v. {TRACKED} endpoints tracked"),
        rss: Some(peak),
        note: format!(
            "VmRSS {:.1} MiB idle, {:.1} MiB with {held:.0} endpoints held ({above:.1} MiB above idle), peak {:.1} MiB; {TRACKED} events of 256 bytes posted and attempted in {:.1} s",
            idle as f64 / MIB,
            rss as f64 / MIB,
            peak as f64 / MIB,
            took.as_secs_f64()
        ),
        ..Row::default()
    };
    let b = budget(
        format!("{label} {}", tracked_budget_name()),
        vec![Check::at_most(above, TRACKED_MIB, " MiB")],
        format!("{above:.1} MiB above idle (≤ {TRACKED_MIB})"),
    );
    Ok((row, b))
}

/// Step w: healthy endpoints beside the sick one.
const HEALTHY: usize = 100;
/// Step w: the sick endpoint's backlog, queued before the steady load.
const BACKLOG: usize = 50_000;
/// Step w: the steady load's events, one every `PACE`.
const STEADY: usize = 10_000;
const PACE: Duration = Duration::from_millis(1);
/// Step w's budget: the healthy endpoints' p99 with the sick one against without.
const NOISY_RATIO: f64 = 2.0;

pub fn noisy_budget_name() -> String {
    "noisy neighbour: healthy endpoints' p99 delivery latency".to_string()
}

/// Step w: 100 healthy endpoints (in-process receivers on 127.3.0.x) under
/// a steady 1,000 events/s, their delivery latency (the 202 to the
/// request's arrival) measured without, then with, a sick endpoint whose
/// attempts all time out and which has 50,000 events queued before the
/// load starts.
pub async fn noisy(label: &str, bin: &Path) -> Result<(Vec<Row>, Budget), String> {
    use support::{Receiver, Reply, behavior};
    let mut healthy = Vec::with_capacity(HEALTHY);
    for i in 0..HEALTHY {
        let at = std::net::SocketAddr::from((Ipv4Addr::new(127, 3, 0, i as u8 + 1), 0));
        healthy.push(Receiver::start_on(at, behavior(|_, _| Reply::status(200))).await);
    }
    let sick_at = std::net::SocketAddr::from((Ipv4Addr::new(127, 3, 1, 1), 0));
    let sick = Receiver::start_on(sick_at, behavior(|_, _| Reply::hang())).await;
    let mut rows = Vec::new();
    let mut p99 = [0.0f64; 2];
    for (k, with_sick) in [false, true].into_iter().enumerate() {
        let yaml = config(
            "per_event",
            "    timeout: 1s\n    late_answer_window: 0s\n    endpoints: { schemes: [http], allow_cidrs: [127.0.0.0/8] }\n",
        );
        let run = start_yaml(bin, &yaml, &[]).await?;
        let c = &run.courier;
        let url = c.url(DESTINATION);
        let before: Vec<usize> = healthy.iter().map(Receiver::count).collect();
        if with_sick {
            let sick_url = format!("http://{}/", sick.addr());
            post_many(&url, BACKLOG, move |_| sick_url.clone()).await?;
        }
        // The steady load: event n to healthy endpoint n % HEALTHY, its
        // 202's instant kept by n.
        let mut accepted = Vec::with_capacity(STEADY);
        let cpu = cpu_seconds(c.pid()).unwrap_or(0.0);
        let mut tick = tokio::time::interval(PACE);
        for n in 0..STEADY {
            tick.tick().await;
            let endpoint = format!("http://{}/{n}", healthy[n % HEALTHY].addr());
            let resp = try_post(
                &url,
                json_body(256, n as u64),
                &[("courier-endpoint", &endpoint)],
            )
            .await?;
            if resp.status != 202 {
                return Err(format!("steady event {n}: {} {}", resp.status, resp.text()));
            }
            accepted.push(std::time::Instant::now());
        }
        let used = cpu_seconds(c.pid()).unwrap_or(0.0) - cpu;
        let mut latencies = Vec::with_capacity(STEADY);
        // The load's first and second five seconds, apart.
        let mut halves: [Vec<f64>; 2] = Default::default();
        for (i, rx) in healthy.iter().enumerate() {
            let want = before[i] + STEADY / HEALTHY;
            let got = rx
                .try_wait_for(want, Duration::from_secs(60))
                .await
                .ok_or_else(|| format!("healthy endpoint {i} got {} of {want}", rx.count()))?;
            for r in &got[before[i]..] {
                let n: usize = r
                    .path_and_query
                    .trim_start_matches('/')
                    .parse()
                    .map_err(|_| format!("a request to {}", r.path_and_query))?;
                let ms = r.at.saturating_duration_since(accepted[n]).as_secs_f64() * 1e3;
                latencies.push(ms);
                halves[usize::from(n >= STEADY / 2)].push(ms);
            }
        }
        latencies.sort_by(f64::total_cmp);
        let pick =
            |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
        p99[k] = pick(0.99);
        let half_p99 = halves.map(|mut h| {
            h.sort_by(f64::total_cmp);
            h.get((h.len() as f64 * 0.99) as usize)
                .copied()
                .unwrap_or(0.0)
        });
        let name = if with_sick { "with" } else { "without" };
        rows.push(Row {
            target: format!("{label} w. healthy endpoints, {name} a sick one"),
            latency: Some((pick(0.5), pick(0.99), pick(0.999))),
            cpu: Some(used),
            events: Some(STEADY as f64),
            note: format!(
                "delivery latency (202 to arrival) of {} events to {HEALTHY} endpoints at 1,000/s (p99 {:.2} ms in the first 5 s, {:.2} ms in the next){}",
                latencies.len(),
                half_p99[0],
                half_p99[1],
                if with_sick {
                    format!("; the sick endpoint (every attempt times out at 1 s) had {BACKLOG} events queued first, and got {} attempts", sick.count())
                } else {
                    String::new()
                }
            ),
            ..Row::default()
        });
    }
    let ratio = p99[1] / p99[0].max(1e-9);
    let b = budget(
        format!("{label} {}", noisy_budget_name()),
        vec![Check::at_most(ratio, NOISY_RATIO, "x without")],
        format!(
            "p99 {:.2} ms with the sick endpoint, {:.2} ms without: {ratio:.2}x (≤ {NOISY_RATIO})",
            p99[1], p99[0]
        ),
    );
    Ok((rows, b))
}

/// Posts `n` events, event `i` naming `endpoint(i)`, `PUBLISHERS` at a time.
async fn post_many(
    url: &str,
    n: usize,
    endpoint: impl Fn(usize) -> String + Send + Sync + 'static,
) -> Result<(), String> {
    let next = Arc::new(AtomicUsize::new(0));
    let endpoint = Arc::new(endpoint);
    let mut posts = tokio::task::JoinSet::new();
    for _ in 0..PUBLISHERS {
        let (next, url, endpoint) = (next.clone(), url.to_string(), endpoint.clone());
        posts.spawn(async move {
            // Bounded: each turn takes one of n numbers.
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<(), String>(());
                }
                let named = endpoint(i);
                let resp = try_post(
                    &url,
                    json_body(256, i as u64),
                    &[("courier-endpoint", &named)],
                )
                .await?;
                if resp.status != 202 {
                    return Err(format!("event {i}: {} {}", resp.status, resp.text()));
                }
            }
        });
    }
    while let Some(done) = posts.join_next().await {
        done.map_err(|e| format!("a publisher: {e}"))??;
    }
    Ok(())
}
