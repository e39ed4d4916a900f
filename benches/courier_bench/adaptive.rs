//! Step g (issue #34): adaptive concurrency on a fast endpoint. Step b's
//! end to end (wrk against courier, which delivers to nginx during the
//! load; accepted / (load + drain)) with `concurrency: { adaptive: {} }`
//! (min 1, max 256, initial 16) and with fixed concurrencies 4, 16, 64
//! and 256, each fixed run between two adaptive ones: adaptive, 4,
//! adaptive, 16, adaptive, 64, adaptive, 256, adaptive. The best fixed
//! run is compared with the mean of the adaptive runs on either side of
//! it, so that the machine's drift (±20% within minutes here) weighs on
//! both alike. A first load at concurrency 64 warms the machine and is not
//! counted: the first load of an invocation often ran 20–25% slower in
//! every thread of courier, whatever its config. CPU per event beside each, and in each row's note the
//! limit in force at the end of the load
//! (`courier_destination_concurrency_limit`), adaptive's baseline, and
//! how long attempts took on average.
//!
//! Budget (issue #34): adaptive ≥ 0.95× the best fixed concurrency.

use std::path::Path;

use support::client::try_get;

use super::{
    Args, Budget, Check, DESTINATION, Row, budget, config, cpu_seconds, drained, metric,
    per_thread, proc_status, start_yaml, thread_cpu, wrk,
};

/// The fixed concurrencies adaptive is measured against.
const FIXED: [usize; 4] = [4, 16, 64, 256];
/// The budget: adaptive's rate over the best fixed one's.
const RATIO: f64 = 0.95;
const ACCEPTED: &str = r#"courier_events_accepted_total{destination="bench"}"#;
const DELIVERED: &str = r#"courier_events_delivered_total{destination="bench"}"#;
const LIMIT: &str = r#"courier_destination_concurrency_limit{destination="bench"}"#;
const TOOK_SUM: &str = r#"courier_delivery_duration_seconds_sum{destination="bench"}"#;
const TOOK_COUNT: &str = r#"courier_delivery_duration_seconds_count{destination="bench"}"#;

/// What step g measured, for its budget.
pub struct Measured {
    pub rows: Vec<Row>,
    /// Adaptive's rate (events/s) and CPU per event (µs): the means of the
    /// runs either side of the best fixed one.
    adaptive: (f64, f64),
    /// The best fixed concurrency, its rate and CPU per event.
    best: (usize, f64, f64),
}

pub fn budget_name() -> String {
    "adaptive concurrency end-to-end".to_owned()
}

pub fn budgets(label: &str, m: &Measured) -> Vec<Budget> {
    let (rate, us) = m.adaptive;
    let (n, best, best_us) = m.best;
    let ratio = rate / best.max(1e-9);
    vec![budget(
        format!("{label} {}", budget_name()),
        vec![Check::at_least(ratio, RATIO, "x best fixed")],
        format!(
            "best fixed concurrency {n} {best:.0}/s at {best_us:.1} µs/event, adaptive beside it {rate:.0}/s at {us:.1} µs/event (mean of the runs before and after): {ratio:.3}x (≥ {RATIO})"
        ),
    )]
}

/// Step g.
pub async fn adaptive(label: &str, bin: &Path, rx: &str, args: &Args) -> Result<Measured, String> {
    let mut rows = Vec::new();
    let warm = config(rx, "    concurrency: 64\n");
    let mut warming = end_to_end(
        format!("{label} g. warm-up, concurrency 64"),
        bin,
        &warm,
        args,
    )
    .await?;
    warming.note = format!("not counted. {}", warming.note);
    rows.push(warming);
    // Each run's rate and CPU per event: adaptive, then each fixed value
    // followed by adaptive again.
    let mut adaptive = vec![run(label, bin, rx, None, 1, args, &mut rows).await?];
    let mut fixed = Vec::new();
    for n in FIXED {
        fixed.push((n, run(label, bin, rx, Some(n), 0, args, &mut rows).await?));
        let round = adaptive.len() + 1;
        adaptive.push(run(label, bin, rx, None, round, args, &mut rows).await?);
    }
    let (at, (n, best)) = fixed
        .into_iter()
        .enumerate()
        .max_by(|a, b| (a.1).1.0.total_cmp(&(b.1).1.0))
        .ok_or("no fixed concurrency was measured")?;
    // The fixed run at `at` came between adaptive runs `at` and `at + 1`.
    let beside = &adaptive[at..=at + 1];
    let mean = |f: fn(&(f64, f64)) -> f64| beside.iter().map(f).sum::<f64>() / 2.0;
    Ok(Measured {
        rows,
        adaptive: (mean(|a| a.0), mean(|a| a.1)),
        best: (n, best.0, best.1),
    })
}

/// One end to end at `n` (adaptive for `None`, its `round`-th), its row
/// pushed; its rate and CPU per event.
async fn run(
    label: &str,
    bin: &Path,
    rx: &str,
    n: Option<usize>,
    round: usize,
    args: &Args,
    rows: &mut Vec<Row>,
) -> Result<(f64, f64), String> {
    let (value, name) = match n {
        Some(n) => (n.to_string(), format!("concurrency {n}")),
        None => ("{ adaptive: {} }".to_owned(), format!("adaptive ({round})")),
    };
    let yaml = config(rx, &format!("    concurrency: {value}\n"));
    let row = end_to_end(format!("{label} g. end-to-end, {name}"), bin, &yaml, args).await?;
    let measured = (
        row.rate.unwrap_or(0.0),
        row.cpu_per_event_us().unwrap_or(0.0),
    );
    rows.push(row);
    Ok(measured)
}

/// Step b's measure, noting the limit in force at the end of the load.
async fn end_to_end(target: String, bin: &Path, yaml: &str, args: &Args) -> Result<Row, String> {
    let run = start_yaml(bin, yaml, &[]).await?;
    let c = &run.courier;
    let cpu = cpu_seconds(c.pid());
    let threads = thread_cpu(c.pid());
    let w = wrk(&c.url(DESTINATION), args).await?;
    let limit = metric(c, LIMIT).await;
    let took = metric(c, TOOK_SUM)
        .await
        .zip(metric(c, TOOK_COUNT).await)
        .map(|(sum, n)| sum * 1000.0 / n.max(1.0));
    let baseline = baseline_ms(c).await;
    let during = metric(c, DELIVERED).await.unwrap_or(0.0);
    let drain = drained(c).await?.as_secs_f64();
    let accepted = metric(c, ACCEPTED).await.unwrap_or(0.0);
    let mut row = Row::load(target, &w);
    row.rate = Some(accepted / (w.seconds + drain));
    row.events = Some(accepted);
    row.cpu = Some(cpu_seconds(c.pid()).unwrap_or(0.0) - cpu.unwrap_or(0.0));
    row.rss = proc_status(c.pid(), "VmHWM");
    let limit = limit.map_or("-".to_owned(), |l| format!("{l:.0}"));
    let took = took.map_or("-".to_owned(), |t| format!("{t:.2}"));
    let baseline = baseline.map_or(String::new(), |b| format!(" (baseline {b:.2} ms)"));
    let by = per_thread(&threads, &thread_cpu(c.pid()), accepted);
    row.note = format!(
        "accepted {accepted:.0} ({:.0}/s), delivered {during:.0} during the load, drain {drain:.1} s; at the end of the load limit {limit}{baseline}, attempts took {took} ms on average. {by} {}",
        w.rate, row.note
    );
    Ok(row)
}

/// The baseline latency adaptive concurrency measured, from `/v1/destinations`.
async fn baseline_ms(c: &support::Courier) -> Option<f64> {
    let answer = try_get(&format!("{}/v1/destinations", c.admin_url()))
        .await
        .ok()?;
    answer.json()["destinations"][0]["concurrency"]["baseline_ms"].as_f64()
}
