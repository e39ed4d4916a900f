//! Adaptive concurrency (`concurrency: { adaptive: {} }`) against endpoints
//! of limited capacity (`support::Capacity`): one that serves a few
//! requests at a time and answers 503 beyond, and one whose latency grows
//! with its load. Events come at a steady pace from the load generator,
//! so that the backlog never runs out; the limit is read from
//! `/v1/destinations` (and the gauge) as an operator would.

use std::time::Duration;

use support::load::{self, LoadSpec};
use support::{Capacity, Courier, Receiver, check, check_eq, config, get, metric, post};

/// Retries 50 ms apart (a 503's own minimum is 30 s by default) and no
/// probation: what a new user tries, as in the issue, so that the limit
/// alone decides how hard the endpoint is pushed.
const RETRIES: &str = "retry: { schedule: [50ms, 100ms], jitter: 0 }
status: { min_delay: { 503: 50ms } }
probation: { after_failures: 0 }";

const LIMIT: &str = r#"courier_destination_concurrency_limit{destination="orders"}"#;

/// courier delivering to `rx` with `concurrency` (its YAML value), logging
/// at info: a line per attempt would cost more than the attempts.
async fn start(dir: &std::path::Path, rx: &Receiver, concurrency: &str) -> Courier {
    let extra = format!("concurrency: {concurrency}\n{RETRIES}");
    let yaml = config("orders", &rx.url(), &extra).replace("level: debug", "level: info");
    Courier::start(dir, &yaml).await
}

/// Events posted at `per_second` for `seconds`, in the background.
fn feed(c: &Courier, per_second: f64, seconds: u64) -> tokio::task::JoinHandle<()> {
    let spec = LoadSpec {
        url: c.url("orders"),
        connections: 4,
        duration: Duration::from_secs(seconds),
        body: support::json_body(256, 0),
        headers: Vec::new(),
    };
    tokio::spawn(async move {
        load::run_paced(spec, per_second).await;
    })
}

/// The destination's concurrency limit as `/v1/destinations` shows it.
async fn limit(c: &Courier) -> u64 {
    let r = get(&format!("{}/v1/destinations", c.admin_url())).await;
    check_eq!(c, r.status, 200, "{}", r.text());
    let d = &r.json()["destinations"][0];
    check_eq!(c, d["concurrency"]["adaptive"], true, "{d}");
    d["concurrency"]["limit"].as_u64().unwrap_or(0)
}

/// The lowest and highest limit seen while polling for `d`.
async fn limits_over(c: &Courier, d: Duration) -> (u64, u64) {
    let end = tokio::time::Instant::now() + d;
    let (mut lo, mut hi) = (u64::MAX, 0);
    // Bounded by `end`.
    while tokio::time::Instant::now() < end {
        let l = limit(c).await;
        (lo, hi) = (lo.min(l), hi.max(l));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (lo, hi)
}

/// What the endpoint did over a stretch of time.
struct Served {
    /// Requests served over what its capacity serves in that time.
    used: f64,
    /// Attempts answered 503, of all.
    refused: f64,
}

/// `capacity` at `slots` × `service` each, watched for `d`.
async fn served_over(capacity: &Capacity, slots: usize, service: Duration, d: Duration) -> Served {
    let (served, refused) = (capacity.served(), capacity.refused());
    let at = tokio::time::Instant::now();
    tokio::time::sleep(d).await;
    let took = at.elapsed();
    let served = capacity.served() - served;
    let refused = capacity.refused() - refused;
    let can = took.as_secs_f64() / service.as_secs_f64() * slots as f64;
    Served {
        used: served as f64 / can,
        refused: refused as f64 / (served + refused).max(1) as f64,
    }
}

/// The issue's endpoint: 8 at a time, 20 ms each (400 requests/s), 503
/// beyond. Fed 600 events/s, watched from 3 s to 8 s; then, with
/// `adaptive`, the limit's range over a second.
async fn against_a_small_endpoint(
    concurrency: &str,
    adaptive: bool,
) -> (Served, (u64, u64), Courier) {
    const SLOTS: usize = 8;
    const SERVICE: Duration = Duration::from_millis(20);
    let capacity = Capacity::new(SLOTS, SERVICE);
    let rx = Receiver::with_capacity(capacity.clone()).await;
    rx.set_recording(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start(dir.path(), &rx, concurrency).await;
    let load = feed(&c, 600.0, 10);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let served = served_over(&capacity, SLOTS, SERVICE, Duration::from_secs(5)).await;
    let limits = if adaptive {
        limits_over(&c, Duration::from_secs(1)).await
    } else {
        (0, 0)
    };
    load.abort();
    eprintln!(
        "concurrency {concurrency}: {:.0}% of the endpoint's capacity, {:.1}% of attempts answered 503{}",
        served.used * 100.0,
        served.refused * 100.0,
        if adaptive {
            format!(", limit {}..={} after", limits.0, limits.1)
        } else {
            String::new()
        }
    );
    (served, limits, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_concurrency_fills_a_small_endpoint_where_a_fixed_64_drowns_it() {
    let (adaptive, (lo, hi), c) = against_a_small_endpoint("{ adaptive: {} }", true).await;
    check!(
        c,
        adaptive.used >= 0.70 && adaptive.refused <= 0.10,
        "adaptive: {:.2} of the capacity used, {:.3} of the attempts refused",
        adaptive.used,
        adaptive.refused
    );
    check!(
        c,
        lo >= 3 && hi <= 12,
        "limits {lo}..={hi} for a capacity of 8"
    );
    drop(c);
    let (fixed, _, c) = against_a_small_endpoint("64", false).await;
    check!(
        c,
        !(fixed.used >= 0.70 && fixed.refused <= 0.10),
        "fixed 64: {:.2} of the capacity used, {:.3} of the attempts refused",
        fixed.used,
        fixed.refused
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_that_doubles_under_load_lowers_the_limit_and_it_climbs_back_after() {
    let _alone = support::alone().await;
    // 50 ms at any load, as many at a time as come: no 503 ever.
    let capacity = Capacity::new(100_000, Duration::from_millis(50));
    let rx = Receiver::with_capacity(capacity.clone()).await;
    rx.set_recording(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start(dir.path(), &rx, "{ adaptive: {} }").await;
    // 400 events/s keep 20 in flight at 50 ms, and more once it slows.
    let load = feed(&c, 400.0, 30);
    let (_, fast) = limits_over(&c, Duration::from_secs(4)).await;
    check!(
        c,
        fast >= 32,
        "the limit reached only {fast} at a steady 50 ms"
    );

    // Now twice as slow at 8 in service, four times at 16: a queue.
    capacity.set_knee(Some(4));
    limits_over(&c, Duration::from_secs(6)).await;
    let (_, slow) = limits_over(&c, Duration::from_secs(4)).await;
    check!(
        c,
        slow <= 10,
        "the limit stayed at up to {slow} where latency doubles at 8"
    );
    let gauge = metric(&c.admin_url(), LIMIT).await.unwrap_or(-1.0);
    check!(c, (1.0..=10.0).contains(&gauge), "{LIMIT} {gauge}");
    eprintln!("limit up to {fast} at 50 ms, up to {slow} once twice as slow at 8");

    // Recovered: 50 ms again, whatever the load.
    capacity.set_knee(None);
    let (_, again) = limits_over(&c, Duration::from_secs(6)).await;
    check!(c, again >= 24, "the limit climbed back only to {again}");
    eprintln!("limit back up to {again} at 50 ms again");
    load.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_follows_an_endpoint_whose_capacity_comes_back() {
    // 4 at a time, 50 ms each (80/s), 503 beyond; then 32 at a time.
    let capacity = Capacity::new(4, Duration::from_millis(50));
    let rx = Receiver::with_capacity(capacity.clone()).await;
    rx.set_recording(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start(dir.path(), &rx, "{ adaptive: {} }").await;
    let load = feed(&c, 400.0, 20);
    limits_over(&c, Duration::from_secs(3)).await;
    let (_, small) = limits_over(&c, Duration::from_secs(2)).await;
    check!(c, small <= 6, "the limit went up to {small} for 4 slots");

    capacity.set_limit(32);
    let (_, back) = limits_over(&c, Duration::from_secs(6)).await;
    check!(c, back >= 24, "the limit climbed back only to {back}");
    eprintln!("limit up to {small} for 4 slots, back up to {back} for 32");
    load.abort();
}

/// Polls (bounded) until `/v1/destinations` shows `want` as the
/// destination's `concurrency` limit and kind; returns the whole object.
async fn wait_concurrency(c: &Courier, want: serde_json::Value) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let (mut seen, mut whole);
    // Bounded by the deadline.
    loop {
        let r = get(&format!("{}/v1/destinations", c.admin_url())).await;
        whole = r.json()["destinations"][0]["concurrency"].clone();
        seen = serde_json::json!({"limit": whole["limit"], "adaptive": whole["adaptive"]});
        if seen == want || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check_eq!(c, seen, want, "concurrency on /v1/destinations: {whole}");
    whole
}

#[tokio::test]
async fn a_reload_keeps_a_learnt_limit_and_applies_a_changed_block() {
    use serde_json::json;
    // Four deliveries, then a 503, then deliveries again.
    let mut replies = vec![support::Reply::status(200); 4];
    replies.extend([support::Reply::status(503), support::Reply::status(200)]);
    let rx = Receiver::sequence(replies).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = |concurrency: &str, timeout: &str| {
        let extra = format!(
            "concurrency: {concurrency}\ntimeout: {timeout}\nretry: {{ schedule: [1h], jitter: 0 }}"
        );
        config("orders", &rx.url(), &extra)
    };
    let c = Courier::start(dir.path(), &yaml("16", "30s")).await;
    let fixed = wait_concurrency(&c, json!({"limit": 16, "adaptive": false})).await;
    check!(c, fixed.get("baseline_ms").is_none(), "{fixed}");
    let gauge = metric(&c.admin_url(), LIMIT).await;
    check_eq!(c, gauge, Some(16.0), "{LIMIT} of a fixed concurrency");

    let block = "{ adaptive: { min: 2, max: 8, initial: 8 } }";
    let rewrite = |text: String| {
        let path = c.config_path().to_path_buf();
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write the config");
        std::fs::rename(&tmp, &path).expect("replace the config");
    };
    rewrite(yaml(block, "30s"));
    // The baseline is measured at 4 in flight first.
    wait_concurrency(&c, json!({"limit": 4, "adaptive": true})).await;
    for n in 0..4 {
        let r = post(&c.url("orders"), format!("{{\"n\":{n}}}"), &[]).await;
        check_eq!(c, r.status, 202, "{}", r.text());
    }
    let learnt = wait_concurrency(&c, json!({"limit": 8, "adaptive": true})).await;
    let baseline = learnt["baseline_ms"].as_f64();
    check!(c, baseline.is_some_and(|b| b > 0.0), "{learnt}");
    let r = post(&c.url("orders"), "{\"n\":4}", &[]).await;
    check_eq!(c, r.status, 202, "{}", r.text());
    wait_concurrency(&c, json!({"limit": 6, "adaptive": true})).await;

    // Another key changed, the block not: what was learnt stays.
    rewrite(yaml(block, "20s"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // Bounded by the deadline.
    while c.logs().matches("config reloaded").count() < 2 {
        check!(
            c,
            tokio::time::Instant::now() < deadline,
            "no second reload"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_concurrency(&c, json!({"limit": 6, "adaptive": true})).await;
    // A changed block starts again, from measuring the baseline.
    rewrite(yaml("{ adaptive: { min: 2, max: 8, initial: 7 } }", "20s"));
    wait_concurrency(&c, json!({"limit": 4, "adaptive": true})).await;
    rewrite(yaml("3", "20s"));
    wait_concurrency(&c, json!({"limit": 3, "adaptive": false})).await;
    let gauge = metric(&c.admin_url(), LIMIT).await;
    check_eq!(c, gauge, Some(3.0), "{LIMIT} after the reloads");
}
