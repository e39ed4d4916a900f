//! Accept-path, drain and mixed benchmark of courier against a baseline
//! receiver.
//!
//! `cargo bench --bench courier_bench [-- --seconds 10 --connections 64 --steps abcde]`
//!
//! a. baseline: a bare receiver answering 202, loaded directly;
//! b. accept only, `journal.sync: always` (202 only after fdatasync): the
//!    destination is paused through the admin API first, so courier does not
//!    deliver while it is loaded and the events stay in the journal;
//! c. the same with `journal.sync: os` (fresh courier and journal);
//! d. drain: step b's courier (kept alive, still paused) is resumed and timed
//!    until the receiver has every event accepted in b (or the destination's
//!    `courier_events_pending` is 0): delivered events per second;
//! e. mixed: a fresh courier (`sync: always`, not paused) loaded like b while
//!    it delivers to the receiver.
//! f. batching: the same backlog (4,000 events per `--seconds`, accepted
//!    while paused) drained by a fresh courier with `batch.max_events: 1`
//!    (off) and then `100`, to a receiver answering 200 at once: delivered
//!    events/s of each, and how many requests each needed.
//!
//! The load generator, the receiver and courier share this machine's CPUs,
//! so compare ratios, not absolute numbers across machines.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use support::client::{find_metric, try_get, try_post};
use support::load::{self, LoadReport, LoadSpec};
use support::{Courier, Receiver, Reply, behavior, json_body};

const BODY_BYTES: usize = 1024;
const DESTINATION: &str = "bench";
const PENDING: &str = r#"courier_events_pending{destination="bench"}"#;
const ACCEPTED: &str = r#"courier_events_accepted_total{destination="bench"}"#;
const DELIVERED: &str = r#"courier_events_delivered_total{destination="bench"}"#;
/// Step d gives up when the backlog is not delivered within this.
const DRAIN_DEADLINE: Duration = Duration::from_secs(180);
/// How often step d reads the pending metric while it waits.
const DRAIN_POLL: Duration = Duration::from_millis(250);
/// After a load run, time for the requests it abandoned at the deadline to
/// finish inside courier before the journal is counted.
const SETTLE: Duration = Duration::from_secs(1);
/// Fixed addresses in the printed config for reproduction by hand.
const MANUAL_INGRESS: &str = "127.0.0.1:8080";
const MANUAL_ADMIN: &str = "127.0.0.1:9090";
const STEPS: &str = "abcdef";
/// Step f: events in its backlog per `--seconds`.
const BATCH_BACKLOG_PER_SECOND: u64 = 4_000;
/// Step f: how often the pending metric is read while draining.
const BATCH_POLL: Duration = Duration::from_millis(20);

struct Args {
    seconds: u64,
    connections: usize,
    steps: String,
    /// False when run without `--bench` (e.g. by `cargo test --benches`):
    /// then only a 1-second step a runs, as a check that the bench works.
    bench: bool,
}

const USAGE: &str =
    "usage: cargo bench --bench courier_bench [-- --seconds N --connections N --steps abcdef]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        seconds: 10,
        connections: 64,
        steps: STEPS.into(),
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
            "--steps" => {
                let steps = value("--steps")?;
                if steps.is_empty() || !steps.chars().all(|c| STEPS.contains(c)) {
                    return Err(format!("--steps takes letters from {STEPS}, not {steps:?}"));
                }
                args.steps = steps;
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => eprintln!("courier_bench: ignoring argument {other:?}"),
        }
    }
    if args.seconds == 0 || args.connections == 0 {
        return Err("--seconds and --connections must be > 0".into());
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
  {DESTINATION}:
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

fn per_second(count: u64, elapsed: Duration) -> f64 {
    if elapsed.is_zero() {
        0.0
    } else {
        count as f64 / elapsed.as_secs_f64()
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or("?".into(), |v| format!("{v:.0}"))
}

#[derive(Default)]
struct Baseline {
    rate: Option<f64>,
    p50: Option<f64>,
    p99: Option<f64>,
}

fn header() {
    println!(
        "{:<40} {:>10} {:>9} {:>9} {:>8} {:>7} {:>7} {:>7} {:>7}",
        "step", "rate/s", "p50 ms", "p99 ms", "non-202", "errors", "x rate", "x p50", "x p99"
    );
    println!("{}", "-".repeat(40 + 10 + 9 * 2 + 8 + 7 * 4 + 8));
}

/// One table row; `report` gives latencies and errors, `non_202` the
/// answers other than 202 (both absent for step d).
fn row(name: &str, rate: f64, report: Option<&LoadReport>, non_202: Option<u64>, base: &Baseline) {
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
    let non_202 = non_202.map_or("-".into(), |n| n.to_string());
    println!(
        "{name:<40} {rate:>10.0} {p50:>9} {p99:>9} {non_202:>8} {errors:>7} {:>7} {p50_ratio:>7} {p99_ratio:>7}",
        ratio(rate, base.rate),
    );
}

/// Answers other than 202 to the load generator (answered, not transport
/// errors).
fn non_202(report: &LoadReport) -> u64 {
    report.ok + report.non_2xx - report.status_count(202)
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

/// One series from courier's `/metrics`; `None` if unreachable or absent.
async fn metric(courier: &Courier, series: &str) -> Option<f64> {
    let resp = try_get(&format!("{}/metrics", courier.admin_url()))
        .await
        .ok()?;
    find_metric(&resp.text(), series)
}

/// `POST {admin}/v1/destinations/bench/{action}`; `Err` unless it answers
/// 200 with a JSON body.
async fn admin_action(courier: &Courier, action: &str) -> Result<serde_json::Value, String> {
    let url = format!(
        "{}/v1/destinations/{DESTINATION}/{action}",
        courier.admin_url()
    );
    let resp = try_post(&url, "", &[]).await?;
    if resp.status != 200 {
        return Err(format!(
            "POST {url}: expected 200, got {}: {}",
            resp.status,
            resp.text()
        ));
    }
    serde_json::from_slice(&resp.body)
        .map_err(|e| format!("POST {url}: answer is not JSON ({e}): {}", resp.text()))
}

/// The `bench` entry of `GET {admin}/v1/destinations`.
async fn destination_state(courier: &Courier) -> Result<serde_json::Value, String> {
    let url = format!("{}/v1/destinations", courier.admin_url());
    let resp = try_get(&url).await?;
    if resp.status != 200 {
        return Err(format!("GET {url}: {}: {}", resp.status, resp.text()));
    }
    let body: serde_json::Value = serde_json::from_slice(&resp.body)
        .map_err(|e| format!("GET {url}: answer is not JSON ({e}): {}", resp.text()))?;
    body["destinations"]
        .as_array()
        .and_then(|all| all.iter().find(|d| d["name"] == DESTINATION))
        .cloned()
        .ok_or_else(|| format!("GET {url}: no destination {DESTINATION:?} in {body}"))
}

async fn step_baseline(args: &Args, duration: Duration, base: &mut Baseline) {
    let rx = Receiver::start(behavior(|_, _| Reply::status(202))).await;
    rx.set_recording(false);
    let report = load::run(spec(rx.url(), args.connections, duration)).await;
    rx.stop().await;
    base.rate = Some(report.status_rate(202));
    base.p50 = Some(report.percentile(50.0).as_secs_f64());
    base.p99 = Some(report.percentile(99.0).as_secs_f64());
    row(
        "a. baseline receiver (202)",
        report.status_rate(202),
        Some(&report),
        Some(non_202(&report)),
        base,
    );
    notes(&report, 202);
}

/// A courier whose destination is paused, with the backlog of an accept-only
/// step in its journal. Fields drop in order: courier before its tempdir.
struct Backlog {
    rx: Receiver,
    courier: Courier,
    _dir: tempfile::TempDir,
    /// When the pause took effect.
    paused_at: Instant,
}

/// Steps b and c: pause the destination, then load the ingress.
async fn step_accept(
    bin: &Path,
    name: &str,
    sync: &str,
    args: &Args,
    duration: Duration,
    base: &Baseline,
) -> Result<Backlog, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("create a tempdir for courier: {e}"))?;
    let rx = Receiver::ok().await;
    rx.set_recording(false);
    let courier = Courier::start_with(bin, dir.path(), &config(&rx.url(), sync)).await;
    let paused = admin_action(&courier, "pause").await?;
    let paused_at = Instant::now();
    if paused["state"] != "paused" {
        return Err(format!("pause answered {paused}, not state paused"));
    }
    let state = destination_state(&courier).await?;
    if state["state"] != "paused" || state["paused_by"] != "operator" {
        return Err(format!("after pause, /v1/destinations shows {state}"));
    }

    let report = load::run(spec(courier.url(DESTINATION), args.connections, duration)).await;
    tokio::time::sleep(SETTLE).await;
    let accepted_total = metric(&courier, ACCEPTED).await;
    let pending = metric(&courier, PENDING).await;
    row(
        name,
        report.status_rate(202),
        Some(&report),
        Some(non_202(&report)),
        base,
    );
    notes(&report, 202);
    println!(
        "    202 accepted: {} in {:.1} s; delivered meanwhile: {} (paused); courier_events_accepted_total: {}, courier_events_pending: {}",
        report.status_count(202),
        report.elapsed.as_secs_f64(),
        rx.count(),
        opt(accepted_total),
        opt(pending),
    );
    Ok(Backlog {
        rx,
        courier,
        _dir: dir,
        paused_at,
    })
}

/// Step d: resume step b's courier and time the delivery of its backlog
/// (`Err` also when it is not delivered before the deadline).
async fn step_drain(b: Backlog, base: &Baseline) -> Result<(), String> {
    let before = b.rx.count();
    let pending = metric(&b.courier, PENDING)
        .await
        .ok_or("courier_events_pending is missing from /metrics")?;
    // The events accepted in b, all still in the journal.
    let backlog = pending as u64;
    let target = before + usize::try_from(backlog).expect("event count fits usize");

    let start = Instant::now();
    let resumed = admin_action(&b.courier, "resume").await?;
    if resumed["was_paused"] != true {
        return Err(format!(
            "resume answered {resumed}, expected was_paused: true"
        ));
    }
    let deadline = start + DRAIN_DEADLINE;
    // Bounded by the deadline.
    let by = loop {
        if b.rx.try_wait_for(target, DRAIN_POLL).await.is_some() {
            break "receiver count";
        }
        if metric(&b.courier, PENDING).await == Some(0.0) {
            break "courier_events_pending = 0";
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "TIMEOUT: the receiver got {} of {backlog} events within {} s after resume; courier_events_pending: {}",
                b.rx.count() - before,
                DRAIN_DEADLINE.as_secs(),
                opt(metric(&b.courier, PENDING).await),
            ));
        }
    };
    let drain =
        b.rx.last_at()
            .map_or(Duration::ZERO, |last| last.saturating_duration_since(start));
    let received = b.rx.count() - before;
    let delivered = metric(&b.courier, DELIVERED).await;
    row(
        &format!("d. drain {backlog} events (delivered/s)"),
        per_second(backlog, drain),
        None,
        None,
        base,
    );
    println!(
        "    {backlog} events pending at resume (paused {:.1} s); all delivered {:.2} s after resume (done by {by}); requests received: {received}; courier_events_delivered_total: {}",
        start.saturating_duration_since(b.paused_at).as_secs_f64(),
        drain.as_secs_f64(),
        opt(delivered),
    );
    Ok(())
}

/// Step f, one half: fill a paused courier with `backlog` events, resume,
/// and time until none is pending. Returns (events/s, requests received).
async fn batch_drain(
    bin: &Path,
    max_events: u32,
    backlog: u64,
    args: &Args,
) -> Result<(f64, usize), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("create a tempdir for courier: {e}"))?;
    let rx = Receiver::ok().await;
    rx.set_recording(false);
    let yaml = format!(
        "{}    batch: {{ max_events: {max_events} }}\n",
        config(&rx.url(), "always")
    );
    let courier = Courier::start_with(bin, dir.path(), &yaml).await;
    admin_action(&courier, "pause").await?;
    let fill = spec(courier.url(DESTINATION), args.connections, DRAIN_DEADLINE);
    let report = load::run_n(fill, backlog).await;
    tokio::time::sleep(SETTLE).await;
    let pending = metric(&courier, PENDING).await.unwrap_or(0.0) as u64;
    if pending != report.status_count(202) {
        return Err(format!(
            "{} events acknowledged but {pending} pending before resume",
            report.status_count(202)
        ));
    }
    let start = Instant::now();
    admin_action(&courier, "resume").await?;
    // Bounded by the deadline.
    loop {
        if metric(&courier, PENDING).await == Some(0.0) {
            break;
        }
        if start.elapsed() >= DRAIN_DEADLINE {
            return Err(format!(
                "TIMEOUT: max_events {max_events}: {} requests, courier_events_pending {} after {} s",
                rx.count(),
                opt(metric(&courier, PENDING).await),
                DRAIN_DEADLINE.as_secs()
            ));
        }
        tokio::time::sleep(BATCH_POLL).await;
    }
    let took = rx.last_at().map_or(start.elapsed(), |last| {
        last.saturating_duration_since(start)
    });
    Ok((per_second(pending, took), rx.count()))
}

/// Step f: batching off vs `max_events: 100` on the same backlog size.
async fn step_batching(bin: &Path, args: &Args, base: &Baseline) -> Result<(), String> {
    let backlog = BATCH_BACKLOG_PER_SECOND * args.seconds;
    let (off_rate, off_requests) = batch_drain(bin, 1, backlog, args).await?;
    row(
        &format!("f. drain {backlog}, batching off (ev/s)"),
        off_rate,
        None,
        None,
        base,
    );
    let (on_rate, on_requests) = batch_drain(bin, 100, backlog, args).await?;
    row(
        &format!("f. drain {backlog}, max_events 100 (ev/s)"),
        on_rate,
        None,
        None,
        base,
    );
    println!(
        "    batching: {:.2}x the delivered events/s; requests {off_requests} -> {on_requests} ({:.1} events per request, {:.3} of the requests)",
        on_rate / off_rate.max(f64::MIN_POSITIVE),
        backlog as f64 / on_requests.max(1) as f64,
        on_requests as f64 / off_requests.max(1) as f64,
    );
    Ok(())
}

/// Step e: load a courier that delivers at the same time.
async fn step_mixed(bin: &Path, args: &Args, duration: Duration, base: &Baseline) {
    let dir = tempfile::tempdir().expect("create a tempdir for courier");
    let rx = Receiver::ok().await;
    rx.set_recording(false);
    let courier = Courier::start_with(bin, dir.path(), &config(&rx.url(), "always")).await;
    let report = load::run(spec(courier.url(DESTINATION), args.connections, duration)).await;
    let delivered = rx.count();
    let pending = metric(&courier, PENDING).await;
    drop(courier);
    drop(dir);
    row(
        "e. mixed: accept + deliver, sync: always",
        report.status_rate(202),
        Some(&report),
        Some(non_202(&report)),
        base,
    );
    notes(&report, 202);
    println!(
        "    202 accepted: {} in {:.1} s; delivered meanwhile: {delivered} ({:.0}/s); courier_events_pending at the end: {}",
        report.status_count(202),
        report.elapsed.as_secs_f64(),
        per_second(delivered as u64, report.elapsed),
        opt(pending),
    );
}

fn print_manual(args: &Args) {
    let admin = format!("http://{MANUAL_ADMIN}/v1/destinations");
    println!(
        "Reproduce step b by hand: save the config below as courier.yaml (a receiver at RECEIVER_URL; journal.sync: os for c), then"
    );
    println!("  courier run -c courier.yaml");
    println!("  curl -fsS -X POST {admin}/{DESTINATION}/pause");
    println!(
        "  wrk -t2 -c{} -d{}s -s {}/benches/post.lua http://{MANUAL_INGRESS}/{DESTINATION}",
        args.connections,
        args.seconds,
        env!("CARGO_MANIFEST_DIR")
    );
    println!("  curl -fsS {admin}    # state and pending");
    println!("  curl -fsS -X POST {admin}/{DESTINATION}/resume    # step d: drain");
    print!(
        "{}",
        config("RECEIVER_URL", "always")
            .replace(
                "listen: 127.0.0.1:0\nadmin",
                &format!("listen: {MANUAL_INGRESS}\nadmin")
            )
            .replace(
                "admin_listen: 127.0.0.1:0",
                &format!("admin_listen: {MANUAL_ADMIN}")
            )
    );
}

async fn run(args: Args) -> ExitCode {
    let duration = Duration::from_secs(args.seconds);
    let mut base = Baseline::default();
    let wants_courier = args.steps.chars().any(|c| "bcdef".contains(c));
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
        "courier_bench: {} s per step, {} connections, {BODY_BYTES}-byte JSON bodies, {} CPUs{}",
        args.seconds,
        args.connections,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        bin.as_ref()
            .map_or(String::new(), |b| format!(", binary {}", b.display())),
    );
    println!();
    header();
    let mut ok = true;
    let mut fail = |step: char, e: String| {
        println!("{step}. FAILED: {e}");
        ok = false;
    };
    // Step b's courier, kept (paused, idle) for a later step d.
    let mut backlog: Option<Backlog> = None;
    let b_name = "b. accept only (paused), sync: always";
    for (i, step) in args.steps.char_indices() {
        let Some(bin) = bin.as_deref() else {
            if step == 'a' {
                step_baseline(&args, duration, &mut base).await;
            }
            continue;
        };
        match step {
            'a' => step_baseline(&args, duration, &mut base).await,
            'b' => match step_accept(bin, b_name, "always", &args, duration, &base).await {
                Ok(b) if args.steps[i..].contains('d') => backlog = Some(b),
                Ok(_) => {}
                Err(e) => fail('b', e),
            },
            'c' => {
                let name = "c. accept only (paused), sync: os";
                if let Err(e) = step_accept(bin, name, "os", &args, duration, &base).await {
                    fail('c', e);
                }
            }
            'd' => {
                let b = match backlog.take() {
                    Some(b) => Ok(b),
                    None => {
                        println!("    (step d drains step b's backlog: running b for it)");
                        step_accept(bin, b_name, "always", &args, duration, &base).await
                    }
                };
                if let Err(e) = match b {
                    Ok(b) => step_drain(b, &base).await,
                    Err(e) => Err(format!("step b for d: {e}")),
                } {
                    fail('d', e);
                }
            }
            'e' => step_mixed(bin, &args, duration, &base).await,
            'f' => {
                if let Err(e) = step_batching(bin, &args, &base).await {
                    fail('f', e);
                }
            }
            _ => {}
        }
    }
    drop(backlog);
    println!();
    println!(
        "x rate / x p50 / x p99: ratio to step a (baseline receiver). b, c, e: 202 answers/s; d, f: delivered events/s."
    );
    print_manual(&args);
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
