//! Ingress and end-to-end benchmark of courier against a baseline receiver.
//!
//! `cargo bench --bench courier_bench [-- --seconds 10 --connections 64 --events 20000 --steps abcd]`
//!
//! a. baseline: a bare receiver answering 202, loaded directly;
//! b. courier ingress with `journal.sync: always` (202 only after fdatasync);
//! c. courier ingress with `journal.sync: os`;
//! d. end to end: post `--events` events, time until the receiver got them all.
//!
//! The load generator, the receiver and courier share this machine's CPUs,
//! so compare ratios, not absolute numbers across machines.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use support::load::{self, LoadReport, LoadSpec};
use support::{Courier, Receiver, Reply, behavior, json_body};

const BODY_BYTES: usize = 1024;
const E2E_DEADLINE: Duration = Duration::from_secs(120);

struct Args {
    seconds: u64,
    connections: usize,
    events: u64,
    steps: String,
    /// False when run without `--bench` (e.g. by `cargo test --benches`):
    /// then only a 1-second step a runs, as a check that the bench works.
    bench: bool,
}

const USAGE: &str = "usage: cargo bench --bench courier_bench [-- --seconds N --connections N --events N --steps abcd]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        seconds: 10,
        connections: 64,
        events: 20_000,
        steps: "abcd".into(),
        bench: false,
    };
    let mut it = std::env::args().skip(1);
    // Bounded by the number of arguments.
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--bench" => args.bench = true,
            "--seconds" => args.seconds = number(&value("--seconds")?, "--seconds")?,
            "--connections" => {
                args.connections = number(&value("--connections")?, "--connections")?
            }
            "--events" => args.events = number(&value("--events")?, "--events")?,
            "--steps" => {
                let steps = value("--steps")?;
                if steps.is_empty() || !steps.chars().all(|c| "abcd".contains(c)) {
                    return Err(format!("--steps takes letters from abcd, not {steps:?}"));
                }
                args.steps = steps;
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => eprintln!("courier_bench: ignoring argument {other:?}"),
        }
    }
    if args.seconds == 0 || args.connections == 0 || args.events == 0 {
        return Err("--seconds, --connections and --events must be > 0".into());
    }
    Ok(args)
}

fn number<T: std::str::FromStr>(s: &str, name: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{name}: not a positive number: {s:?}"))
}

/// The release build of courier: cargo's `CARGO_BIN_EXE_courier` when it is
/// set for benches (cargo builds the binary with the bench profile, i.e. into
/// target/release), else `target/release/courier` under the package root.
fn courier_release_bin() -> Result<PathBuf, String> {
    let path = option_env!("CARGO_BIN_EXE_courier")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/courier"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "courier binary not found at {}; run `cargo build --release` first",
            path.display()
        ))
    }
}

fn config(receiver_url: &str, sync: &str) -> String {
    format!(
        "listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
log: {{ format: text, level: info }}
journal: {{ dir: ./journal, sync: {sync}, max_bytes: 4GiB }}
destinations:
  bench:
    url: {receiver_url}
    concurrency: 64
"
    )
}

fn spec(url: String, connections: usize, duration: Duration) -> LoadSpec {
    LoadSpec {
        url,
        connections,
        duration,
        body: json_body(BODY_BYTES, 0),
        headers: vec![("content-type".into(), "application/json".into())],
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn ratio(value: f64, base: Option<f64>) -> String {
    match base {
        Some(base) if base > 0.0 => format!("{:.2}", value / base),
        _ => "-".into(),
    }
}

#[derive(Default)]
struct Baseline {
    rate: Option<f64>,
    p50: Option<f64>,
    p99: Option<f64>,
}

fn header() {
    println!(
        "{:<38} {:>12} {:>9} {:>9} {:>8} {:>7} {:>8} {:>8} {:>8}",
        "step", "rate/s", "p50 ms", "p99 ms", "non-2xx", "errors", "x rate", "x p50", "x p99"
    );
    println!("{}", "-".repeat(38 + 12 + 9 * 2 + 8 + 7 + 8 * 3 + 8));
}

fn row(name: &str, rate: f64, report: Option<&LoadReport>, non_ok: u64, base: &Baseline) {
    let (p50, p99, errors) = match report {
        Some(r) => (
            ms(r.percentile(50.0)),
            ms(r.percentile(99.0)),
            r.errors.to_string(),
        ),
        None => ("-".into(), "-".into(), "-".into()),
    };
    let p50_ratio = report.map_or("-".into(), |r| {
        ratio(r.percentile(50.0).as_secs_f64(), base.p50)
    });
    let p99_ratio = report.map_or("-".into(), |r| {
        ratio(r.percentile(99.0).as_secs_f64(), base.p99)
    });
    println!(
        "{name:<38} {rate:>12.0} {p50:>9} {p99:>9} {non_ok:>8} {errors:>7} {:>8} {p50_ratio:>8} {p99_ratio:>8}",
        ratio(rate, base.rate),
    );
}

/// Prints status counts and the first transport error when a run had any.
fn notes(report: &LoadReport, expected: u16) {
    let others: Vec<String> = report
        .statuses
        .iter()
        .filter(|(s, _)| **s != expected)
        .map(|(s, n)| format!("{s}: {n}"))
        .collect();
    if !others.is_empty() {
        println!("    answers other than {expected}: {}", others.join(", "));
    }
    if let Some(e) = &report.first_error {
        println!("    {} transport errors, first: {e}", report.errors);
    }
}

async fn step_baseline(args: &Args, duration: Duration, base: &mut Baseline) {
    let rx = Receiver::start(behavior(|_, _| Reply::status(202))).await;
    rx.set_recording(false);
    let report = load::run(spec(rx.url(), args.connections, duration)).await;
    rx.stop().await;
    base.rate = Some(report.rate());
    base.p50 = Some(report.percentile(50.0).as_secs_f64());
    base.p99 = Some(report.percentile(99.0).as_secs_f64());
    row(
        "a. baseline receiver (202)",
        report.rate(),
        Some(&report),
        report.non_2xx,
        base,
    );
    notes(&report, 202);
}

async fn step_ingress(bin: &Path, sync: &str, args: &Args, duration: Duration, base: &Baseline) {
    let dir = tempfile::tempdir().expect("create a tempdir for courier");
    let rx = Receiver::ok().await;
    rx.set_recording(false);
    let courier = Courier::start_with(bin, dir.path(), &config(&rx.url(), sync)).await;
    let report = load::run(spec(courier.url("bench"), args.connections, duration)).await;
    let accepted = report.status_count(202);
    let answered = report.ok + report.non_2xx;
    let metric = support::client::try_get(&format!("{}/metrics", courier.admin_url()))
        .await
        .ok()
        .and_then(|r| {
            support::client::find_metric(
                &r.text(),
                r#"courier_events_accepted_total{destination="bench"}"#,
            )
        });
    drop(courier);
    drop(dir);
    let name = format!(
        "{}. courier ingress, sync: {sync}",
        if sync == "always" { 'b' } else { 'c' }
    );
    row(
        &name,
        report.status_rate(202),
        Some(&report),
        answered - accepted,
        base,
    );
    notes(&report, 202);
    println!(
        "    202 accepted: {accepted} in {:.1} s; delivered meanwhile: {}{}",
        report.elapsed.as_secs_f64(),
        rx.count(),
        metric.map_or(String::new(), |m| format!(
            "; courier_events_accepted_total: {m}"
        )),
    );
}

/// Returns false if not every accepted event arrived before the deadline.
async fn step_end_to_end(bin: &Path, args: &Args, base: &Baseline) -> bool {
    let dir = tempfile::tempdir().expect("create a tempdir for courier");
    let rx = Receiver::ok().await;
    rx.set_recording(false);
    let courier = Courier::start_with(bin, dir.path(), &config(&rx.url(), "always")).await;
    let start = Instant::now();
    let report = load::run_n(
        spec(courier.url("bench"), args.connections, E2E_DEADLINE),
        args.events,
    )
    .await;
    let posted = start.elapsed();
    let accepted = report.status_count(202);
    let all = usize::try_from(accepted).expect("event count fits usize");
    let done = rx.try_wait_for(all, E2E_DEADLINE).await.is_some();
    let received = rx.count();
    drop(courier);
    drop(dir);
    if !done {
        println!(
            "d. end-to-end: TIMEOUT: only {received} of {accepted} accepted events delivered within {} s after posting",
            E2E_DEADLINE.as_secs()
        );
        notes(&report, 202);
        return false;
    }
    let last = rx.last_at().unwrap_or(start);
    let total = last.saturating_duration_since(start);
    let rate = if total.is_zero() {
        0.0
    } else {
        accepted as f64 / total.as_secs_f64()
    };
    let name = format!("d. end-to-end {accepted} events (delivered/s)");
    row(
        &name,
        rate,
        None,
        report.ok + report.non_2xx - accepted,
        base,
    );
    notes(&report, 202);
    println!(
        "    posted in {:.2} s ({:.0} accepted/s, p50 {} ms, p99 {} ms); all delivered {:.2} s after the first post ({:.2} s after the last); requests received: {received}",
        posted.as_secs_f64(),
        report.status_rate(202),
        ms(report.percentile(50.0)),
        ms(report.percentile(99.0)),
        total.as_secs_f64(),
        total.saturating_sub(posted).as_secs_f64(),
    );
    true
}

async fn run(args: Args) -> ExitCode {
    let duration = Duration::from_secs(args.seconds);
    let mut base = Baseline::default();
    let wants_courier = args.steps.chars().any(|c| "bcd".contains(c));
    let bin = if wants_courier {
        match courier_release_bin() {
            Ok(bin) => Some(bin),
            Err(e) => {
                eprintln!("courier_bench: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    println!(
        "courier_bench: {} s per step, {} connections, {BODY_BYTES}-byte JSON bodies, {} end-to-end events, {} CPUs{}",
        args.seconds,
        args.connections,
        args.events,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        bin.as_ref()
            .map_or(String::new(), |b| format!(", binary {}", b.display())),
    );
    println!();
    header();
    let mut ok = true;
    for step in args.steps.chars() {
        match (step, bin.as_deref()) {
            ('a', _) => step_baseline(&args, duration, &mut base).await,
            ('b', Some(bin)) => step_ingress(bin, "always", &args, duration, &base).await,
            ('c', Some(bin)) => step_ingress(bin, "os", &args, duration, &base).await,
            ('d', Some(bin)) => ok &= step_end_to_end(bin, &args, &base).await,
            _ => {}
        }
    }
    println!();
    println!("x rate / x p50 / x p99: ratio to step a (baseline receiver).");
    println!(
        "Reproduce by hand with wrk: run `courier run -c courier.yaml` with the config below (listen: 127.0.0.1:8080) and a receiver at RECEIVER_URL, then:"
    );
    println!(
        "  wrk -t2 -c{} -d{}s -s {}/benches/post.lua http://127.0.0.1:8080/bench",
        args.connections,
        args.seconds,
        env!("CARGO_MANIFEST_DIR")
    );
    print!(
        "{}",
        config("RECEIVER_URL", "always").replace(
            "listen: 127.0.0.1:0\nadmin",
            "listen: 127.0.0.1:8080\nadmin"
        )
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let mut args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("courier_bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !args.bench {
        println!(
            "courier_bench: not run by `cargo bench` (no --bench): quick check of step a only"
        );
        args.seconds = 1;
        args.connections = args.connections.min(8);
        args.steps = "a".into();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("build the tokio runtime");
    runtime.block_on(run(args))
}
