//! courier against nginx under the same wrk load, in one invocation:
//!
//! `cargo bench --bench courier_bench [-- --seconds 10 --connections 50
//!  --steps nhabcdeikpqxotylgrumvw --scale 1 --compare PATH --rounds 1 --write-results]`
//!
//! n. baselines, run as their users run them: wrk against an nginx answering
//!    200 to every POST (`direct`: the receiver, which courier delivers to
//!    too), and against a second nginx, `proxy_pass` to the first with
//!    upstream keepalive (`proxy`, the non-durable baseline). Each is its
//!    own nginx (own tempdir, conf and pid file) at `worker_processes auto`
//!    (a worker per core, as the packaged /etc/nginx/nginx.conf has it):
//!    the proxy as a new user runs it, and the receiver as the separate
//!    service it stands for, so neither takes the other's workers. Each
//!    row's CPU is its nginx's (master + workers, utime + stime over the
//!    load); the proxy row's notes give the receiver's too, and those of
//!    courier's rows give the CPU per request of the baseline measured
//!    just before them;
//! a. accept only: the destination is paused through the admin API, so the
//!    load measures the path to a durable 202 (`journal.sync: always`);
//! b. end to end: courier delivers to nginx during the load; the rate is
//!    accepted events / (load seconds + the drain after it);
//! c. drain of a 100,000-event backlog (accepted while paused, then resumed),
//!    unbatched and with `batch: { max_events: 100 }`, in events/s;
//! d. a 1,000,000-event backlog: courier's RSS, the journal's disk use
//!    (bodies shaped as a real webhook's, `webhook_body`: a paused
//!    destination's events are packed, journal/pack.rs), then SIGKILL and
//!    the time from the new process's spawn to `/readyz` 200;
//! e. idle RSS: one destination, nothing sent, after 2 s;
//! i. idle keep-alive connections (issue #47, `courier_bench/connections.rs`):
//!    RSS with 5,000 connections held open after one event each, and 30 s
//!    after the clients close them, both above idle. Budgets: ≤ 32 MiB
//!    held, ≤ 4 MiB after;
//! k. the duplicate window: courier delivers to a receiver in this
//!    process (which notes when each answer was written) under the load of
//!    step b from the Rust load generator, is SIGKILLed after 3 s, started
//!    again on its journal and drained. Every event answered 202 must
//!    arrive; an event that arrives twice is a duplicate, and how long
//!    before the kill its first copy had been answered is the window;
//! h. the floor of courier's HTTP stack (`courier_bench/floor.rs`): wrk
//!    through a proxy made of hyper and hyper-util's client alone (nothing
//!    stored); through the least durable sidecar (each body appended and
//!    `fdatasync`ed in groups before its 202, then sent on from memory
//!    once: no index, retries or acks), accept only and end to end; and
//!    step c's backlog sent to nginx by a hyper client with 64
//!    connections: what the crates courier is built on, and durability on
//!    this disk, reach here without courier, beside nginx's `proxy` and
//!    `direct`;
//! p. passthrough (issue #11): wrk through a `mode: passthrough`
//!    destination to nginx (beside `direct` and `proxy`), then to a receiver
//!    in this process answering 200, and to the same receiver answering each
//!    request's first attempt 503 and its second 200 (one in-line retry
//!    per request, `schedule: [1ms]`): the last two rows' difference is what
//!    an in-line retry costs;
//! q. paced passthrough (issue #30 item 6): an app's ordinary load rather
//!    than a flood: 5,000 requests/s from 50 connections (the Rust load
//!    generator, latency counted from when each request was due), through
//!    nginx proxy (with its CPU, as in step n), through a passthrough
//!    destination at its default concurrency, and at `concurrency: 16` (the
//!    default before). Budget: the default's p50 ≤ 1.5 × nginx proxy's;
//! x. mass expiry (issue #12): a 100,000-event
//!    backlog of a paused destination (`--scale` multiplies it) whose TTL
//!    has run out: SIGTERM, every event made an hour older in `journal.db`
//!    (`event_ttl: 1h`), start again, and time until every event is
//!    dead-lettered, with courier's peak RSS meanwhile; then `replay all`
//!    of those records, timed to its answer (still paused), and the
//!    resume's drain of the replayed events to nginx;
//! o. mass expiry to a bucket (issue #32): step x's expiry with
//!    `dead_letter: { url: s3://… }` on `moto_server` (below), timed from
//!    the restart until every event is dead-lettered (the records counted
//!    by the bucket's object names), with courier's peak RSS. Budget:
//!    ≥ 20,000 events/s;
//! t. hand-off (issue #32): courier A, its destination paused, holds
//!    100,000 1 KiB events (`--scale` multiplies them) with `handoff: { url:
//!    s3://…, poll: 200ms }` and `shutdown_grace: 20s` (nothing is in
//!    flight, so it is not waited out; the hand-off gets as long again);
//!    SIGTERM, and the hand-off is timed by A's summary log line (`took_ms`)
//!    and from SIGTERM to exit, with A's peak RSS (VmHWM sampled while it
//!    runs, and reset at the SIGTERM for the hand-off's own). Then courier
//!    B (an empty journal, its destination paused) starts on the same url
//!    and is timed from its spawn until `courier_handoff_events_total
//!    {direction="adopted"}` counts every event, with its peak RSS.
//!    Budgets: written ≤ 10 s and adopted ≤ 10 s, each side's peak RSS
//!    ≤ 64 MiB;
//! y. event history (issue #33, `courier_bench/history.rs`): step b with
//!    history on (the default) and off (`history: { retain: 0s }`), in the
//!    order off, on, on, off, with CPU per event; then 1,000,000 events
//!    (`--scale` multiplies them), each with its own `Idempotency-Key`,
//!    delivered to nginx during the load, history on and then off: the
//!    size of `<journal.dir>/history/`, 2,000 lookups of random ids among
//!    them (`GET /v1/events/{id}`, one after another), and courier's RSS
//!    beside history off's. Budgets: end to end on ≥ 0.9× off, ≤ 200
//!    bytes per event on disk, lookup p99 ≤ 5 ms, RSS ≤ 10 MiB over off;
//! l. ordering lanes (issue #34, `courier_bench/ordering.rs`): step b with
//!    1,000 ordering keys in turn, unordered and ordered by that key, in
//!    the order unordered, ordered, ordered, unordered. Budget: ordered
//!    ≥ 0.8× unordered.
//! g. adaptive concurrency (issue #34, `courier_bench/adaptive.rs`): step
//!    b with `concurrency: { adaptive: {} }` and with 4, 16, 64 and 256,
//!    each fixed run between two adaptive ones (after a load that warms
//!    the machine), with CPU per event and the limit in force at the end
//!    of each load. Budget: adaptive (the runs
//!    beside the best fixed one) ≥ 0.95× the best fixed.
//! r. tracing (issue #35, `courier_bench/tracing.rs`): step b with a
//!    `traceparent` on every request, tracing off and on (`sample_ratio:
//!    1.0`, exporting to a loopback OTLP sink in this process that answers
//!    200 and discards), in the order off, on, on, off, with CPU per
//!    event. Budget: on ≥ 0.9× off.
//! u. the address guard (issue #46, `courier_bench/guard.rs`): step b with
//!    `endpoints: { guard: on }` (loopback opened by `allow_cidrs`) and
//!    without, in the order off, on, on, off, with CPU per event. Budget:
//!    on ≥ 0.95× off.
//! m. many endpoints (issue #46, `courier_bench/endpoints.rs`): step b to
//!    a `url: per_event` destination whose events name 10,000 endpoints in
//!    turn (one nginx listening on 10,000 loopback addresses), and to the
//!    same build's single fixed destination, in the order fixed, many,
//!    many, fixed. Budget: many ≥ 0.8× fixed.
//! v. 100,000 endpoints tracked (issue #46, `courier_bench/endpoints.rs`):
//!    one event each for endpoints that refuse connections, so that
//!    courier holds every one's state; RSS above the same build idle.
//!    Budget: ≤ 64 MiB.
//! w. noisy neighbour (issue #46, `courier_bench/endpoints.rs`): 100
//!    healthy endpoints under a steady 1,000 events/s, their delivery
//!    latency without, then with, a sick endpoint (every attempt times out)
//!    holding 50,000 events queued first. Budget: p99 with ≤ 2× without.
//!
//! Steps o and t start their own `moto_server` (PyPI `moto[server]`, in
//! `tests/py/requirements.txt`) on a free loopback port and kill it at
//! their end: the one beside `COURIER_PYTHON` when set, else
//! `.venv/bin/moto_server` at this checkout's root (or the main checkout's,
//! from a `git worktree`), else installed into `./.venv` as the tests do.
//!
//! Each courier step runs for the courier built by `cargo bench` (or
//! `COURIER_BIN`) and, with `--compare PATH`, for a second binary, so
//! before/after lands in one table. `--rounds N` runs them N times, the
//! binaries taking turns, and adds the medians of the rounds, with each
//! budget judged on its medians. `--scale F` multiplies the backlog sizes
//! of c, d, x, o and t, and step y's million. The table is printed with
//! PASS/MISS for the budgets of issue #10 and those named above;
//! `--write-results` also writes it to benches/RESULTS.md, keeping that
//! file's hand-kept `## Measurements behind the code` section at its end.
//!
//! wrk, the two nginx, courier and this process share the machine's CPUs,
//! so compare ratios within one invocation, not absolute numbers across
//! machines; CPU per event (per request for nginx) is what each spends,
//! whatever its share of the cores. The machine's speed also drifts within
//! a run (nginx's own rate by 20–30% between two files): steps a and b are
//! judged against nginx proxy, and step c against nginx direct, measured
//! again just before them.

#[path = "courier_bench/adaptive.rs"]
mod adaptive;
#[path = "courier_bench/alternated.rs"]
mod alternated;
#[path = "courier_bench/connections.rs"]
mod connections;
#[path = "courier_bench/endpoints.rs"]
mod endpoints;
#[path = "courier_bench/floor.rs"]
mod floor;
#[path = "courier_bench/guard.rs"]
mod guard;
#[path = "courier_bench/history.rs"]
mod history;
#[path = "courier_bench/lightness.rs"]
mod lightness;
#[path = "courier_bench/objects.rs"]
mod objects;
#[path = "courier_bench/ordering.rs"]
mod ordering;
#[path = "courier_bench/tracing.rs"]
mod tracing;
/// As courier's own binary, so the floor (step h) pays what courier pays.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::fmt::Write as _;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use support::client::{find_metric, try_get, try_post};
use support::load::{self, LoadSpec};
use support::{Courier, webhook_body};

const BODY_BYTES: usize = 1024;
const DESTINATION: &str = "bench";
const PENDING: &str = r#"courier_events_pending{destination="bench"}"#;
const ACCEPTED: &str = r#"courier_events_accepted_total{destination="bench"}"#;
const DELIVERED: &str = r#"courier_events_delivered_total{destination="bench"}"#;
/// Every step, run by default; `--steps` picks some.
const STEPS: &str = "nhabcdeikpqxotylgrumvw";
/// Step c's backlog and step d's, before `--scale`.
const DRAIN_BACKLOG: f64 = 100_000.0;
/// Step h's client: as many connections as courier's `concurrency: 64`.
const FLOOR_CONNECTIONS: usize = 64;
const BIG_BACKLOG: f64 = 1_000_000.0;
/// Step x's backlog (and step o's), before `--scale`.
const EXPIRY_BACKLOG: f64 = 100_000.0;
const DEAD_LETTERED: &str =
    r#"courier_events_dead_lettered_total{destination="bench",reason="TimeToLiveExceeded"}"#;
/// Filling a backlog or draining one gives up after this.
const DEADLINE: Duration = Duration::from_secs(600);
/// How often the pending metric and `/readyz` are read while waiting.
const POLL: Duration = Duration::from_millis(20);
/// Step e waits this long after the start before reading RSS.
const IDLE: Duration = Duration::from_secs(2);
const MIB: f64 = 1024.0 * 1024.0;
const USAGE: &str = "usage: cargo bench --bench courier_bench [-- --seconds N --connections N --steps nhabcdeikpqxotylgrumvw --scale F --compare PATH --rounds N --write-results]";

#[derive(Clone)]
struct Args {
    seconds: u64,
    connections: usize,
    steps: String,
    scale: f64,
    compare: Option<PathBuf>,
    /// Each binary's steps this many times, the binaries taking turns: this
    /// machine's speed moves by ±20% between runs minutes apart, so one
    /// round's ratio is one draw; rounds show the spread and pair the turns.
    rounds: usize,
    write_results: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        seconds: 10,
        connections: 50,
        steps: STEPS.into(),
        scale: 1.0,
        compare: None,
        rounds: 1,
        write_results: false,
    };
    let mut it = std::env::args().skip(1);
    // Bounded by the number of arguments.
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--bench" => {}
            "--write-results" => args.write_results = true,
            "--seconds" => args.seconds = number(&value("--seconds")?, "--seconds")?,
            "--connections" => {
                args.connections = number(&value("--connections")?, "--connections")?
            }
            "--scale" => args.scale = number(&value("--scale")?, "--scale")?,
            "--compare" => args.compare = Some(PathBuf::from(value("--compare")?)),
            "--rounds" => args.rounds = number(&value("--rounds")?, "--rounds")?,
            "--steps" => {
                let steps = value("--steps")?;
                if steps.is_empty() || !steps.chars().all(|c| STEPS.contains(c)) {
                    return Err(format!("--steps takes letters from {STEPS}, not {steps:?}"));
                }
                args.steps = steps;
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if args.seconds == 0
        || args.connections == 0
        || args.rounds == 0
        || args.scale.is_nan()
        || args.scale <= 0.0
    {
        return Err("--seconds, --connections, --rounds and --scale must be > 0".into());
    }
    Ok(args)
}

fn number<T: std::str::FromStr>(s: &str, name: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{name}: not a positive number: {s:?}"))
}

/// `COURIER_BIN`, else the build of this package that `cargo bench` made.
fn courier_release_bin() -> PathBuf {
    std::env::var_os("COURIER_BIN")
        .map(PathBuf::from)
        .or_else(|| option_env!("CARGO_BIN_EXE_courier").map(PathBuf::from))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/courier"))
}

/// `concurrency: 64` unless `extra` sets it (`concurrency: ~` leaves it
/// to the mode's default).
fn config(receiver_url: &str, extra: &str) -> String {
    let concurrency = if extra.contains("    concurrency:") {
        ""
    } else {
        "    concurrency: 64\n"
    };
    format!(
        "listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
log: {{ format: text, level: info }}
journal: {{ dir: ./journal, sync: always, max_bytes: 4GiB }}
destinations:
  {DESTINATION}:
    url: {receiver_url}
{concurrency}{extra}"
    )
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// One nginx, run in the foreground from its own tempdir (its conf, pid
/// file and temp paths) at `worker_processes auto`, as its users run it:
/// the receiver (`direct`: 200 to every POST) or the proxy (`proxy`: a
/// keepalive reverse proxy to the receiver). Two of them, never one nginx
/// serving both, so that neither takes the other's worker.
struct Nginx {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Nginx {
    /// The receiver: 200 to every POST; also what courier delivers to.
    fn receiver() -> Result<Nginx, String> {
        Nginx::start("receiver", "", "location / { return 200 ''; }")
    }

    /// The receiver on `n` loopback addresses at one port
    /// (`endpoints::address`): `n` distinct endpoints for step m.
    fn receiver_on_many(n: usize) -> Result<Nginx, String> {
        Nginx::start_listening("receiver", "", "location / { return 200 ''; }", n)
    }

    /// The proxy: `proxy_pass` to the receiver on `upstream`, keeping up
    /// to 64 idle connections to it per worker.
    fn proxy(upstream: u16) -> Result<Nginx, String> {
        Nginx::start(
            "proxy",
            &format!("upstream receiver {{ server 127.0.0.1:{upstream}; keepalive 64; }}"),
            "location / {
            proxy_pass http://receiver;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }",
        )
    }

    fn start(role: &str, upstream: &str, location: &str) -> Result<Nginx, String> {
        Nginx::start_listening(role, upstream, location, 0)
    }

    /// `many`: listens on that many addresses of `endpoints::address`
    /// instead of 127.0.0.1, each connection a worker's file.
    fn start_listening(
        role: &str,
        upstream: &str,
        location: &str,
        many: usize,
    ) -> Result<Nginx, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir for nginx {role}: {e}"))?;
        let port = free_port();
        let listen = if many == 0 {
            format!("listen 127.0.0.1:{port};")
        } else {
            (0..many)
                .map(|i| format!("listen {}:{port};", endpoints::address(i)))
                .collect::<Vec<_>>()
                .join("\n        ")
        };
        // Listening sockets count among a worker's connections: room for
        // every address and a connection to each, under an open file
        // limit raised to match (nginx's master sets it as root).
        let (connections, files) = if many == 0 {
            (4096, String::new())
        } else {
            (3 * many, format!("worker_rlimit_nofile {};", 4 * many))
        };
        let host = if many == 0 {
            Ipv4Addr::LOCALHOST
        } else {
            endpoints::address(0)
        };
        let conf = format!(
            "# nginx {role}, as users run it: a worker per core.
worker_processes auto;
{files}
pid nginx.pid;
error_log stderr warn;
events {{ worker_connections {connections}; }}
http {{
    access_log off;
    client_body_temp_path body;
    proxy_temp_path proxy;
    keepalive_requests 1000000;
    client_max_body_size 1m;
    {upstream}
    server {{
        {listen}
        {location}
    }}
}}
"
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf).map_err(|e| format!("write {}: {e}", path.display()))?;
        let child = Command::new(NGINX)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&path)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn {NGINX}: {e}"))?;
        let nginx = Nginx {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        // Listening, and its workers forked: the master listens first,
        // then forks them one by one, so their number must hold for a poll.
        let mut forked = 0;
        // Bounded by the deadline.
        loop {
            let workers = nginx_cpu_seconds(nginx.pid()).map_or(0, |(_, w)| w);
            // Without /proc's `children` (a kernel built without it) the
            // workers cannot be counted: listening is all there is to see.
            let settled = (workers > 0 && workers == forked) || !children_listed();
            if settled && TcpStream::connect((host, port)).is_ok() {
                return Ok(nginx);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "nginx {role} is not listening on {port} with its workers ({workers} forked)"
                ));
            }
            forked = workers;
            std::thread::sleep(POLL);
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn url(port: u16) -> String {
        format!("http://127.0.0.1:{port}/{DESTINATION}")
    }
}

impl Drop for Nginx {
    /// SIGTERM, so the master stops its workers too (SIGKILL would leave
    /// them running); SIGKILL after 5 s.
    fn drop(&mut self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        // Bounded by the deadline.
        while matches!(self.child.try_wait(), Ok(None)) {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(POLL);
        }
    }
}

/// Whether this kernel lists a task's children in /proc (for nginx's
/// workers and their CPU).
fn children_listed() -> bool {
    let pid = std::process::id();
    std::path::Path::new(&format!("/proc/{pid}/task/{pid}/children")).exists()
}

/// utime + stime of an nginx, in seconds: its master `pid` and the
/// children running now (its workers), and how many workers there were.
fn nginx_cpu_seconds(pid: u32) -> Option<(f64, usize)> {
    let mut total = cpu_seconds(pid)?;
    let mut workers = 0;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    // Bounded: the master's threads, each with its few children.
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            // A worker that exited meanwhile is left out.
            if let Some(cpu) = cpu_seconds(child) {
                total += cpu;
                workers += 1;
            }
        }
    }
    Some((total, workers))
}

/// The two nginx's masters, to read their CPU around a baseline's load.
#[derive(Clone, Copy)]
struct NginxPids {
    receiver: u32,
    proxy: u32,
}

/// What each nginx spent (master + workers, utime + stime) over a load,
/// in seconds, and its workers.
#[derive(Clone, Copy)]
struct NginxCpu {
    receiver: f64,
    proxy: f64,
    receiver_workers: usize,
    proxy_workers: usize,
}

impl NginxPids {
    fn cpu(&self) -> Option<NginxCpu> {
        let (receiver, receiver_workers) = nginx_cpu_seconds(self.receiver)?;
        let (proxy, proxy_workers) = nginx_cpu_seconds(self.proxy)?;
        Some(NginxCpu {
            receiver,
            proxy,
            receiver_workers,
            proxy_workers,
        })
    }
}

impl NginxCpu {
    /// The CPU spent from `before` to `self`.
    fn since(self, before: NginxCpu) -> NginxCpu {
        NginxCpu {
            receiver: self.receiver - before.receiver,
            proxy: self.proxy - before.proxy,
            ..self
        }
    }

    /// The proxy's CPU (`proxy`) or the receiver's.
    fn of(&self, proxy: bool) -> f64 {
        if proxy { self.proxy } else { self.receiver }
    }
}

const WRK: &str = "/usr/bin/wrk";
const NGINX: &str = "/usr/sbin/nginx";

/// What one wrk run measured (from post.lua's `done` line).
#[derive(Clone)]
struct Wrk {
    rate: f64,
    seconds: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    non_2xx: u64,
    socket_errors: u64,
    /// Against nginx (`wrk_nginx`): what each nginx spent over the load.
    nginx_cpu: Option<NginxCpu>,
}

impl Wrk {
    /// The proxy nginx's CPU (`proxy`) or the receiver's over the load, in
    /// µs per request answered 2xx.
    fn nginx_us(&self, proxy: bool) -> Option<f64> {
        let requests = self.rate * self.seconds;
        self.nginx_cpu
            .filter(|_| requests > 0.0)
            .map(|c| c.of(proxy) * 1e6 / requests)
    }
}

/// wrk against one of the two nginx, with each nginx's CPU over the load.
async fn wrk_nginx(url: &str, pids: NginxPids, args: &Args) -> Result<Wrk, String> {
    let before = pids.cpu();
    let mut w = wrk(url, args).await?;
    w.nginx_cpu = pids
        .cpu()
        .zip(before)
        .map(|(now, before)| now.since(before));
    Ok(w)
}

async fn wrk(url: &str, args: &Args) -> Result<Wrk, String> {
    wrk_keyed(url, args, None).await
}

/// wrk as `wrk`, each request with an `Ordering-Key` of `keys` (in turn)
/// when given.
async fn wrk_keyed(url: &str, args: &Args, keys: Option<usize>) -> Result<Wrk, String> {
    let env: Vec<(&str, String)> = keys
        .map(|k| ("COURIER_BENCH_KEYS", k.to_string()))
        .into_iter()
        .collect();
    wrk_env(url, args, &env).await
}

/// wrk with `env` for `post.lua` (`COURIER_BENCH_KEYS`,
/// `COURIER_BENCH_TRACEPARENT`).
async fn wrk_env(url: &str, args: &Args, env: &[(&str, String)]) -> Result<Wrk, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/post.lua");
    let mut wrk = tokio::process::Command::new(WRK);
    wrk.envs(env.iter().map(|(k, v)| (k, v)));
    let out = wrk
        .arg("-t2")
        .arg(format!("-c{}", args.connections))
        .arg(format!("-d{}s", args.seconds))
        .arg("--latency")
        .arg("-s")
        .arg(&script)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("run {WRK}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("courier_bench: "))
        .ok_or_else(|| {
            format!(
                "wrk {url}: no `courier_bench:` line ({}); output:\n{stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let field = |key: &str| -> Result<f64, String> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("wrk: no {key} in {line:?}"))
    };
    let seconds = field("duration_us")? / 1e6;
    let non_2xx = field("non_2xx")? as u64;
    Ok(Wrk {
        rate: (field("requests")? - non_2xx as f64) / seconds.max(1e-9),
        seconds,
        p50: field("p50_us")? / 1000.0,
        p99: field("p99_us")? / 1000.0,
        p999: field("p999_us")? / 1000.0,
        non_2xx,
        socket_errors: field("socket_errors")? as u64,
        nginx_cpu: None,
    })
}

/// One line of the table. Latencies in ms; `rss` in bytes.
#[derive(Default)]
struct Row {
    target: String,
    rate: Option<f64>,
    latency: Option<(f64, f64, f64)>,
    cpu: Option<f64>,
    /// The events (or requests) that `cpu` was spent on, for CPU per event.
    events: Option<f64>,
    rss: Option<u64>,
    /// Compared with nginx direct (drains, and nginx itself) rather than
    /// only with the proxy.
    vs_direct: bool,
    /// The baseline measured just before this row (proxy for a load,
    /// direct for a drain), which its ratio and budget use: the machine's
    /// speed drifts over a run by more than the budgets' margins.
    against: Option<Wrk>,
    note: String,
}

impl Row {
    fn load(target: String, w: &Wrk) -> Row {
        let mut note = String::new();
        if w.non_2xx + w.socket_errors > 0 {
            note = format!("non-2xx {}, socket errors {}", w.non_2xx, w.socket_errors);
        }
        Row {
            target,
            rate: Some(w.rate),
            latency: Some((w.p50, w.p99, w.p999)),
            events: Some(w.rate * w.seconds),
            note,
            ..Row::default()
        }
    }
}

/// One measure of a budget against its limit.
#[derive(Clone, Copy)]
struct Check {
    value: f64,
    limit: f64,
    at_least: bool,
    /// After the number: "x proxy", " MiB".
    unit: &'static str,
}

impl Check {
    fn at_least(value: f64, limit: f64, unit: &'static str) -> Check {
        Check {
            value,
            limit,
            at_least: true,
            unit,
        }
    }

    fn at_most(value: f64, limit: f64, unit: &'static str) -> Check {
        Check {
            value,
            limit,
            at_least: false,
            unit,
        }
    }

    fn pass(&self) -> bool {
        if self.at_least {
            self.value >= self.limit
        } else {
            self.value <= self.limit
        }
    }

    /// Ratios with three decimals, MiB with one, ms and rates whole.
    fn number(&self, value: f64) -> String {
        let digits = match self.limit {
            l if l >= 100.0 => 0,
            l if l >= 10.0 => 1,
            _ => 3,
        };
        format!("{value:.digits$}")
    }
}

/// One budget's verdict: every check passes; none when its baseline was
/// not measured.
struct Budget {
    name: String,
    checks: Vec<Check>,
    detail: String,
    /// Its step failed: nothing was measured.
    failed: bool,
}

fn budget(name: String, checks: Vec<Check>, detail: String) -> Budget {
    Budget {
        name,
        checks,
        detail,
        failed: false,
    }
}

impl Budget {
    fn verdict(&self) -> &'static str {
        if self.failed {
            "FAILED"
        } else {
            verdict(all_pass(&self.checks))
        }
    }
}

/// Every check passes; none when there are none (no baseline).
fn all_pass(checks: &[Check]) -> Option<bool> {
    (!checks.is_empty()).then(|| checks.iter().all(Check::pass))
}

/// `target` without its " (round k)" label, to gather the rounds of a row
/// or a budget.
fn without_round(target: &str) -> String {
    match target.find(" (round ") {
        Some(at) => match target[at..].find(')') {
            Some(end) => format!("{}{}", &target[..at], &target[at + end + 1..]),
            None => target.to_owned(),
        },
        None => target.to_owned(),
    }
}

/// The items labelled with a round, gathered by their name without it, in
/// the order of their first round.
fn rounds_of<T>(items: &[T], name: impl Fn(&T) -> &str) -> Vec<(String, Vec<&T>)> {
    let mut groups: Vec<(String, Vec<&T>)> = Vec::new();
    for item in items.iter().filter(|i| name(i).contains(" (round ")) {
        let key = without_round(name(item));
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(item),
            None => groups.push((key, vec![item])),
        }
    }
    groups
}

fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

struct Baselines {
    direct: Option<Wrk>,
    proxy: Option<Wrk>,
    /// nginx's ports, for the baselines taken again beside each courier
    /// load and drain (none without step n).
    urls: Option<(String, String)>,
    /// nginx proxy's URL, for step q's paced baseline (with or without n).
    proxy_url: String,
    /// For nginx's CPU over each baseline's load.
    pids: NginxPids,
    /// Step h's durable floor end to end, µs of CPU per event.
    floor: Option<f64>,
}

impl Baselines {
    /// nginx direct or proxy measured again now, for the step that follows.
    async fn again(&self, proxy: bool, args: &Args) -> Option<Wrk> {
        let (direct_url, proxy_url) = self.urls.as_ref()?;
        let url = if proxy { proxy_url } else { direct_url };
        match wrk_nginx(url, self.pids, args).await {
            Ok(w) => Some(w),
            Err(e) => {
                eprintln!("courier_bench: nginx baseline again: {e}");
                None
            }
        }
    }
}

/// utime + stime of `pid` in seconds, from /proc/PID/stat.
fn cpu_seconds(pid: u32) -> Option<f64> {
    stat_cpu_seconds(Path::new(&format!("/proc/{pid}/stat")))
}

/// utime + stime in seconds from a /proc `stat` file (a process's or a
/// thread's).
fn stat_cpu_seconds(path: &Path) -> Option<f64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name `(...)`: state is field 3, utime 14.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks / hz.max(1) as f64)
}

/// utime + stime of each of `pid`'s threads, in seconds, summed by thread
/// name (tokio's workers share one), in name order.
fn thread_cpu(pid: u32) -> Vec<(String, f64)> {
    let mut by: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    // Bounded: the process's threads.
    for task in tasks.flatten() {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let cpu = stat_cpu_seconds(&task.path().join("stat")).unwrap_or(0.0);
        *by.entry(name.trim().to_owned()).or_default() += cpu;
    }
    by.into_iter().collect()
}

/// The CPU each thread name spent from `before` to `after`, in µs per
/// event, most first: "CPU µs/event by thread: tokio-rt-worker 40.1, …".
fn per_thread(before: &[(String, f64)], after: &[(String, f64)], events: f64) -> String {
    let mut spent: Vec<(&str, f64)> = after
        .iter()
        .map(|(name, now)| {
            let was = before
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0.0, |(_, c)| *c);
            (name.as_str(), (now - was) * 1e6 / events.max(1.0))
        })
        .filter(|(_, us)| *us >= 0.05)
        .collect();
    spent.sort_by(|a, b| b.1.total_cmp(&a.1));
    let list: Vec<String> = spent.iter().map(|(n, us)| format!("{n} {us:.1}")).collect();
    format!("CPU µs/event by thread: {}.", list.join(", "))
}

/// The bytes `pid` had written to storage (`write_bytes` of /proc/PID/io).
fn written_bytes(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// "Written to storage: N bytes/event." from two `written_bytes`.
fn written_per_event(before: Option<u64>, after: Option<u64>, events: f64) -> String {
    match before.zip(after) {
        Some((b, a)) => format!(
            "Written to storage: {:.0} bytes/event.",
            a.saturating_sub(b) as f64 / events.max(1.0)
        ),
        None => String::new(),
    }
}

/// A `VmRSS`/`VmHWM`-style line of /proc/PID/status, in bytes.
fn proc_status(pid: u32, key: &str) -> Option<u64> {
    support::proc_status(pid, key).map(|kib| kib * 1024)
}

/// Bytes allocated under `dir` (like `du`: fallocated room counts), the
/// files' apparent size, and the allocated bytes by the journal's part a
/// file belongs to (`part_of`), in a fixed order.
fn disk_bytes(dir: &Path) -> (u64, u64, [(&'static str, u64); 4]) {
    let mut parts = PARTS.map(|p| (p, 0));
    let (mut allocated, mut apparent) = (0, 0);
    let mut dirs = vec![dir.to_path_buf()];
    // Bounded: each directory is taken once; the journal's tree is shallow.
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => dirs.push(entry.path()),
                Ok(m) => {
                    let bytes = m.blocks() * 512;
                    allocated += bytes;
                    apparent += m.len();
                    parts[part_of(&entry.file_name().to_string_lossy())].1 += bytes;
                }
                Err(_) => {}
            }
        }
    }
    (allocated, apparent, parts)
}

const PARTS: [&str; 4] = ["intake log", "index", "reserve", "other"];

/// Which of `PARTS` a file in the journal's directory belongs to: the
/// intake log's segments (the events, and preallocated room), SQLite's
/// index of waiting events with its WAL, the disk-full reserve, or other.
fn part_of(name: &str) -> usize {
    if name.starts_with("intake-") {
        0
    } else if name.starts_with("journal.db") {
        1
    } else if name == "reserve" {
        2
    } else {
        3
    }
}

async fn metric(courier: &Courier, series: &str) -> Option<f64> {
    let resp = try_get(&format!("{}/metrics", courier.admin_url()))
        .await
        .ok()?;
    find_metric(&resp.text(), series)
}

/// `POST {admin}/v1/destinations/bench/{pause|resume}`.
async fn admin_action(courier: &Courier, action: &str) -> Result<(), String> {
    let url = format!(
        "{}/v1/destinations/{DESTINATION}/{action}",
        courier.admin_url()
    );
    let resp = support::client::try_admin_post(&url, "", &[]).await?;
    if resp.status == 200 {
        Ok(())
    } else {
        Err(format!("POST {url}: {}: {}", resp.status, resp.text()))
    }
}

/// Waits until nothing is pending; the time it took.
async fn drained(courier: &Courier) -> Result<Duration, String> {
    let start = Instant::now();
    // Bounded by the deadline.
    loop {
        if metric(courier, PENDING).await == Some(0.0) {
            return Ok(start.elapsed());
        }
        if start.elapsed() >= DEADLINE {
            return Err(format!(
                "still {:?} pending after {DEADLINE:?}",
                metric(courier, PENDING).await
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A fresh courier in its own tempdir (dropped after the courier).
struct Run {
    courier: Courier,
    dir: tempfile::TempDir,
}

/// The config is checked first (`courier check`): a `--compare` build
/// that lacks a step's feature fails that step, not the whole run.
async fn start(bin: &Path, url: &str, extra: &str) -> Result<Run, String> {
    start_yaml(bin, &config(url, extra), &[]).await
}

/// `start` with a whole config and extra environment (the S3 store's, for
/// steps o and t), given to `courier check` too.
async fn start_yaml(bin: &Path, yaml: &str, env: &[(&str, &str)]) -> Result<Run, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir for courier: {e}"))?;
    let path = dir.path().join("check.yaml");
    std::fs::write(&path, yaml).map_err(|e| format!("write {}: {e}", path.display()))?;
    let checked = std::process::Command::new(bin)
        .args(["check", "-c"])
        .arg(&path)
        .envs(env.iter().copied())
        .output()
        .map_err(|e| format!("run {} check: {e}", bin.display()))?;
    if !checked.status.success() {
        let said = [&checked.stdout, &checked.stderr]
            .map(|out| String::from_utf8_lossy(out).trim().to_string())
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        // One line: the message becomes a table cell.
        return Err(format!(
            "{} refuses the step's config: {}",
            bin.display(),
            said.replace('\n', "; ")
        ));
    }
    let courier = Courier::start_with_env(bin, dir.path(), yaml, env).await;
    Ok(Run { courier, dir })
}

/// The Rust load generator's 1 KiB JSON events to `url`, for `load::run_n`:
/// shaped as a real webhook (`webhook_body`), which matters where they
/// wait (steps c, d, x and the hand-off's): the journal packs those.
fn events_to(url: String, connections: usize) -> LoadSpec {
    LoadSpec {
        url,
        connections,
        duration: DEADLINE,
        body: webhook_body(BODY_BYTES, 0),
        headers: vec![("content-type".into(), "application/json".into())],
    }
}

/// Pauses the destination and sends it exactly `events` events with the
/// Rust load generator; the note says how long that took.
async fn fill(c: &Courier, events: u64, args: &Args) -> Result<String, String> {
    admin_action(c, "pause").await?;
    let report = load::run_n(events_to(c.url(DESTINATION), args.connections), events).await;
    let accepted = report.status_count(202);
    let pending = metric(c, PENDING).await.unwrap_or(-1.0);
    if accepted != events || pending != events as f64 {
        return Err(format!(
            "{events} sent: {accepted} answered 202, {pending} pending, statuses {:?}, first error {:?}",
            report.statuses, report.first_error
        ));
    }
    Ok(format!(
        "filled in {:.1} s ({:.0}/s)",
        report.elapsed.as_secs_f64(),
        report.rate()
    ))
}

/// Step a.
async fn accept_only(label: &str, bin: &Path, rx: &str, args: &Args) -> Result<Row, String> {
    let run = start(bin, rx, "").await?;
    let c = &run.courier;
    admin_action(c, "pause").await?;
    let cpu = cpu_seconds(c.pid());
    let w = wrk(&c.url(DESTINATION), args).await?;
    let mut row = Row::load(format!("{label} a. accept-only"), &w);
    row.cpu = Some(cpu_seconds(c.pid()).unwrap_or(0.0) - cpu.unwrap_or(0.0));
    row.rss = proc_status(c.pid(), "VmHWM");
    Ok(row)
}

/// Step b: the rate is accepted / (load + drain).
async fn end_to_end(label: &str, bin: &Path, rx: &str, args: &Args) -> Result<Row, String> {
    end_to_end_with(
        format!("{label} b. end-to-end"),
        bin,
        &config(rx, ""),
        false,
        args,
    )
    .await
}

/// Step b's measure of a courier run on `yaml` (step y's too), as the row
/// `target`; `by_thread` adds courier's CPU per event by thread to its note.
async fn end_to_end_with(
    target: String,
    bin: &Path,
    yaml: &str,
    by_thread: bool,
    args: &Args,
) -> Result<Row, String> {
    end_to_end_keyed(target, bin, yaml, by_thread, None, args).await
}

/// `end_to_end_with`, each event with one of `keys` ordering keys when
/// given (step l).
async fn end_to_end_keyed(
    target: String,
    bin: &Path,
    yaml: &str,
    by_thread: bool,
    keys: Option<usize>,
    args: &Args,
) -> Result<Row, String> {
    let env: Vec<(&str, String)> = keys
        .map(|k| ("COURIER_BENCH_KEYS", k.to_string()))
        .into_iter()
        .collect();
    end_to_end_env(target, bin, yaml, by_thread, &env, args).await
}

/// Step b's end to end with `env` for wrk's `post.lua`.
async fn end_to_end_env(
    target: String,
    bin: &Path,
    yaml: &str,
    by_thread: bool,
    env: &[(&str, String)],
    args: &Args,
) -> Result<Row, String> {
    let run = start_yaml(bin, yaml, &[]).await?;
    let c = &run.courier;
    let cpu = cpu_seconds(c.pid());
    let threads = thread_cpu(c.pid());
    let written = written_bytes(c.pid());
    let w = wrk_env(&c.url(DESTINATION), args, env).await?;
    let during = metric(c, DELIVERED).await.unwrap_or(0.0);
    let drain = drained(c).await?.as_secs_f64();
    // Step r: spans dropped would hide part of tracing's cost.
    let dropped = metric(c, tracing::DROPPED).await;
    let accepted = metric(c, ACCEPTED).await.unwrap_or(0.0);
    let delivered = metric(c, DELIVERED).await.unwrap_or(0.0);
    let mut row = Row::load(target, &w);
    row.rate = Some(accepted / (w.seconds + drain));
    row.events = Some(accepted);
    row.cpu = Some(cpu_seconds(c.pid()).unwrap_or(0.0) - cpu.unwrap_or(0.0));
    row.rss = proc_status(c.pid(), "VmHWM");
    row.note = format!(
        "accepted {accepted:.0} ({:.0}/s), delivered {during:.0} during the load, drain {drain:.1} s, delivered {delivered:.0}. {}",
        w.rate, row.note
    );
    if let Some(d) = dropped {
        row.note = format!("{} spans dropped {d:.0}.", row.note.trim());
    }
    if by_thread {
        let by = per_thread(&threads, &thread_cpu(c.pid()), accepted);
        let wrote = written_per_event(written, written_bytes(c.pid()), accepted);
        row.note = format!("{} {by} {wrote}", row.note.trim());
    }
    Ok(row)
}

/// Step k: the SIGKILL comes this long into the load.
const KILL_AFTER: Duration = Duration::from_secs(3);
/// Step k's budget: docs/journal.md "Durability" (about 200 ms).
const WINDOW_BUDGET: &str = "duplicate window after SIGKILL";
const PACED_BUDGET: &str = "paced passthrough p50";

/// Step k: a SIGKILL under load, then the same journal started again.
/// The row, and the window: how long before the kill the first copy of a
/// repeated event had been answered, at most.
async fn crash_window(label: &str, bin: &Path, args: &Args) -> Result<(Row, f64), String> {
    // Records each request and when its answer was written.
    let receiver = support::Receiver::ok().await;
    let mut run = start(bin, &receiver.url(), "").await?;
    let c = &mut run.courier;
    let spec = LoadSpec {
        // A little past the kill: the load's last requests meet a closed port.
        duration: KILL_AFTER + Duration::from_millis(200),
        ..events_to(c.url(DESTINATION), args.connections)
    };
    let load = tokio::spawn(load::run_keeping_answers(spec));
    tokio::time::sleep(KILL_AFTER).await;
    let signalled = std::time::Instant::now();
    c.kill();
    let reaped = std::time::Instant::now();
    let report = load.await.map_err(|e| format!("the load's task: {e}"))?;
    c.restart().await;
    drained(c).await?;
    let mut acknowledged = Vec::new();
    for answer in &report.answers {
        // `{"accepted": n, "ids": [n strings]}` (docs/http-api.md), else the step fails.
        let json: serde_json::Value = serde_json::from_slice(answer)
            .map_err(|e| format!("a 202 that is not JSON ({e}): {answer:?}"))?;
        let ids: Option<Vec<&str>> = json["ids"]
            .as_array()
            .and_then(|ids| ids.iter().map(serde_json::Value::as_str).collect());
        match ids {
            Some(ids) if json["accepted"] == ids.len() && !ids.is_empty() => {
                acknowledged.extend(ids.into_iter().map(str::to_owned))
            }
            _ => return Err(format!("a 202 whose ids do not match `accepted`: {json}")),
        }
    }
    let received = receiver.received();
    let mut copies: std::collections::HashMap<&str, Vec<&support::Received>> =
        std::collections::HashMap::new();
    for r in &received {
        let id = r
            .header("webhook-id")
            .ok_or_else(|| format!("a delivery without webhook-id: {:?}", r.headers))?;
        copies.entry(id).or_default().push(r);
    }
    let missing = acknowledged
        .iter()
        .filter(|id| !copies.contains_key(id.as_str()))
        .count();
    if missing > 0 {
        return Err(format!(
            "{missing} of {} events answered 202 never arrived",
            acknowledged.len()
        ));
    }
    let kills = [(signalled, reaped)];
    let mut duplicates = 0;
    let mut cut_off = 0;
    // For each repeated event, how long before the kill its first copy's
    // answer was written.
    let mut ages = Vec::new();
    for list in copies.values().filter(|l| l.len() > 1) {
        duplicates += list.len() - 1;
        let first = list
            .iter()
            .filter(|r| r.answered_within_life(&kills))
            .filter_map(|r| r.answered)
            .min();
        match first {
            Some(at) if at <= signalled => ages.push((signalled - at).as_secs_f64() * 1000.0),
            _ => cut_off += 1,
        }
    }
    let answered_before = received
        .iter()
        .filter(|r| r.answered.is_some_and(|at| at <= signalled))
        .count();
    // Else no window could show: nothing was delivered before the kill.
    if answered_before == 0 {
        return Err(format!(
            "nothing delivered in the {KILL_AFTER:?} before the kill"
        ));
    }
    let last_second = received
        .iter()
        .filter(|r| {
            r.answered
                .is_some_and(|at| at <= signalled && signalled - at <= Duration::from_secs(1))
        })
        .count();
    // Sorted by `median`: the longest is last.
    let typical = median(&mut ages).unwrap_or(0.0);
    let longest = ages.last().copied().unwrap_or(0.0);
    let row = Row {
        target: format!("{label} k. SIGKILL under load, then restart"),
        note: format!(
            "{} answered 202 in {:.1} s, all delivered by the end; {answered_before} deliveries answered before the kill ({last_second} in its last second); {duplicates} duplicates ({:.1}% of the 202s): {} first answered before the kill, up to {longest:.0} ms before it (median {typical:.0} ms), {cut_off} cut off by it; {duplicates} deliveries are {:.0} ms of the rate before the kill",
            acknowledged.len(),
            KILL_AFTER.as_secs_f64(),
            100.0 * duplicates as f64 / acknowledged.len().max(1) as f64,
            ages.len(),
            1000.0 * duplicates as f64 / last_second.max(1) as f64,
        ),
        ..Row::default()
    };
    Ok((row, longest))
}

/// Step c, one half.
async fn drain(
    label: &str,
    bin: &Path,
    rx: &str,
    max_events: u32,
    args: &Args,
) -> Result<Row, String> {
    let events = backlog(DRAIN_BACKLOG, args);
    let extra = format!("    batch: {{ max_events: {max_events} }}\n");
    let run = start(bin, rx, &extra).await?;
    let c = &run.courier;
    let filled = fill(c, events, args).await?;
    let cpu = cpu_seconds(c.pid());
    admin_action(c, "resume").await?;
    let took = drained(c).await?;
    let name = if max_events == 1 {
        "unbatched".to_owned()
    } else {
        format!("max_events {max_events}")
    };
    Ok(Row {
        target: format!("{label} c. drain {events}, {name}"),
        rate: Some(events as f64 / took.as_secs_f64()),
        cpu: Some(cpu_seconds(c.pid()).unwrap_or(0.0) - cpu.unwrap_or(0.0)),
        events: Some(events as f64),
        rss: proc_status(c.pid(), "VmHWM"),
        vs_direct: true,
        note: format!("{filled}; drained in {:.2} s", took.as_secs_f64()),
        ..Row::default()
    })
}

fn backlog(base: f64, args: &Args) -> u64 {
    ((base * args.scale).round() as u64).max(1000)
}

/// What step d measured, for the budgets.
struct Big {
    events: u64,
    rss: u64,
    hwm: u64,
    disk: u64,
    ready: Duration,
}

/// Step d.
async fn big_backlog(label: &str, bin: &Path, rx: &str, args: &Args) -> Result<(Row, Big), String> {
    let events = backlog(BIG_BACKLOG, args);
    let mut run = start(bin, rx, "").await?;
    let c = &mut run.courier;
    let filled = fill(c, events, args).await?;
    let pid = c.pid();
    let cpu = cpu_seconds(pid);
    let rss = proc_status(pid, "VmRSS").unwrap_or(0);
    let hwm = proc_status(pid, "VmHWM").unwrap_or(0);
    let (disk, apparent, parts) = disk_bytes(&run.dir.path().join("journal"));
    let bodies = (events * BODY_BYTES as u64) as f64;
    let parts = parts
        .iter()
        .map(|(part, bytes)| format!("{part} {:.3}x", *bytes as f64 / bodies))
        .collect::<Vec<_>>()
        .join(", ");
    c.kill();
    let spawned = Instant::now();
    c.restart().await;
    let ready_url = format!("{}/readyz", c.admin_url());
    // Bounded by the deadline.
    let ready = loop {
        if try_get(&ready_url).await.is_ok_and(|r| r.status == 200) {
            break spawned.elapsed();
        }
        if spawned.elapsed() >= DEADLINE {
            return Err(format!("{ready_url} not 200 within {DEADLINE:?}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let pending = metric(c, PENDING).await.unwrap_or(-1.0);
    let row = Row {
        target: format!("{label} d. backlog {events}"),
        cpu,
        events: Some(events as f64),
        rss: Some(hwm),
        note: format!(
            "{filled}; RSS {:.1} MiB (peak {:.1}); journal {:.0} MiB on disk ({:.2}x the bodies: {parts}; files' size {:.0} MiB); SIGKILL, spawn to /readyz {} ms, then {pending:.0} pending",
            rss as f64 / MIB,
            hwm as f64 / MIB,
            disk as f64 / MIB,
            disk as f64 / bodies,
            apparent as f64 / MIB,
            ready.as_millis()
        ),
        ..Row::default()
    };
    Ok((
        row,
        Big {
            events,
            rss,
            hwm,
            disk,
            ready,
        },
    ))
}

/// Step x.
async fn mass_expiry(
    label: &str,
    bin: &Path,
    rx: &str,
    args: &Args,
) -> Result<(Row, Row, f64, u64), String> {
    let events = backlog(EXPIRY_BACKLOG, args);
    // An hour: a 1M fill takes longer than the smallest TTL, a minute.
    let extra = "    retry: { event_ttl: 1h }\n    dead_letter: { dir: ./dl }\n";
    let mut run = start(bin, rx, extra).await?;
    let filled = fill(&run.courier, events, args).await?;
    let (took, pid) = expire(&mut run, events).await?;
    let c = &run.courier;
    let hwm = proc_status(pid, "VmHWM").unwrap_or(0);
    let parts: Vec<String> = ["RssAnon", "RssFile", "RssShmem"]
        .iter()
        .map(|k| format!("{k} {:.1}", proc_status(pid, k).unwrap_or(0) as f64 / MIB))
        .collect();
    let records: usize = std::fs::read_dir(run.dir.path().join("dl").join(DESTINATION))
        .map_err(|e| format!("read the dead-letter dir: {e}"))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
        .map(|e| std::fs::read(e.path()).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count()))
        .sum();
    if records as u64 != events {
        return Err(format!("{records} dead-letter records for {events} events"));
    }
    let rate = events as f64 / took.as_secs_f64();
    let cpu = cpu_seconds(pid);
    let expiry = Row {
        target: format!("{label} x. mass expiry {events}"),
        cpu,
        rss: Some(hwm),
        note: format!(
            "{filled}; restart to all dead-lettered {:.1} s ({rate:.0} events/s), {records} records; at the end {} MiB",
            took.as_secs_f64(),
            parts.join(", ")
        ),
        ..Row::default()
    };
    let replay = replay_all(label, c, events, cpu).await?;
    Ok((expiry, replay, rate, hwm))
}

/// Steps x and o: SIGTERM, every event of the backlog made an hour older
/// in `journal.db` (`event_ttl: 1h`), start again, and wait until every
/// one is dead-lettered and nothing is pending; the time from the restart,
/// and the new process's pid.
async fn expire(run: &mut Run, events: u64) -> Result<(Duration, u32), String> {
    let c = &mut run.courier;
    c.terminate();
    c.wait_exit(DEADLINE).await;
    let db = run.dir.path().join("journal").join("journal.db");
    let aged = rusqlite::Connection::open(&db)
        .and_then(|conn| conn.execute("UPDATE events SET accepted_ms = accepted_ms - 3601000", []))
        .map_err(|e| format!("age the events in {}: {e}", db.display()))?;
    if aged as u64 != events {
        return Err(format!(
            "{aged} rows aged in {}, {events} expected",
            db.display()
        ));
    }
    let started = Instant::now();
    c.restart().await;
    let pid = c.pid();
    // Bounded by the deadline.
    loop {
        let dead = metric(c, DEAD_LETTERED).await.unwrap_or(0.0);
        if dead >= events as f64 && metric(c, PENDING).await == Some(0.0) {
            return Ok((started.elapsed(), pid));
        }
        if started.elapsed() >= DEADLINE {
            return Err(format!(
                "{dead} of {events} dead-lettered within {DEADLINE:?}"
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Step x, continued: `replay all` of the records just written, timed to
/// the answer (every event stored in the journal and its record marked)
/// while the destination is still paused, then the resume's drain to nginx.
async fn replay_all(
    label: &str,
    c: &Courier,
    events: u64,
    cpu_before: Option<f64>,
) -> Result<Row, String> {
    let url = format!("{}/v1/dead-letters/replay", c.admin_url());
    let ask = format!(r#"{{"destination":"{DESTINATION}","all":true}}"#);
    let started = Instant::now();
    let resp = try_post(&url, ask, &[("content-type", "application/json")]).await?;
    let stored = started.elapsed();
    let answer: serde_json::Value = serde_json::from_slice(&resp.body).map_err(|e| {
        format!(
            "POST {url}: {}: not JSON ({e}): {}",
            resp.status,
            resp.text()
        )
    })?;
    if resp.status != 200 || answer["replayed_count"] != events {
        return Err(format!("POST {url}: {}: {answer}", resp.status));
    }
    let pending = metric(c, PENDING).await.unwrap_or(-1.0);
    if pending != events as f64 {
        return Err(format!("{pending} pending after replaying {events}"));
    }
    let delivered_before = metric(c, DELIVERED).await.unwrap_or(0.0);
    admin_action(c, "resume").await?;
    let drain = drained(c).await?;
    let delivered = metric(c, DELIVERED).await.unwrap_or(0.0) - delivered_before;
    if delivered != events as f64 {
        return Err(format!("{delivered} delivered after replaying {events}"));
    }
    let pid = c.pid();
    let cpu = cpu_seconds(pid)
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    let rate = events as f64 / stored.as_secs_f64();
    Ok(Row {
        target: format!("{label} x. replay all {events}"),
        rate: Some(rate),
        cpu,
        rss: proc_status(pid, "VmHWM"),
        note: format!(
            "replay answered in {:.1} s ({rate:.0} events/s stored and marked, paused); resume to delivered {:.1} s ({:.0} events/s); replay to delivered {:.0} events/s",
            stored.as_secs_f64(),
            drain.as_secs_f64(),
            events as f64 / drain.as_secs_f64(),
            events as f64 / (stored + drain).as_secs_f64(),
        ),
        ..Row::default()
    })
}

/// Step e.
async fn idle(label: &str, bin: &Path, rx: &str) -> Result<Row, String> {
    let run = start(bin, rx, "").await?;
    tokio::time::sleep(IDLE).await;
    let pid = run.courier.pid();
    Ok(Row {
        target: format!("{label} e. idle"),
        cpu: cpu_seconds(pid),
        rss: proc_status(pid, "VmRSS"),
        note: format!("VmRSS {IDLE:?} after start"),
        ..Row::default()
    })
}

/// Step h: the floor of courier's HTTP stack and of durability
/// (`floor.rs`), run once as the baselines are. Its CPU is this process's.
async fn floor_rows(receiver: u16, args: &Args) -> Result<Vec<Row>, String> {
    let me = std::process::id();
    let upstream = Nginx::url(receiver);
    let proxy = floor::proxy(&upstream)?;
    let cpu = cpu_seconds(me).unwrap_or(0.0);
    let w = wrk(&Nginx::url(proxy.port), args).await?;
    let used = cpu_seconds(me).unwrap_or(0.0) - cpu;
    drop(proxy);
    let mut proxied = Row::load("floor h. hyper proxy → nginx, nothing stored".into(), &w);
    proxied.cpu = Some(used);
    proxied.note = format!("CPU: the proxy's process. {}", proxied.note);
    let mut rows = vec![proxied];
    for deliver in [false, true] {
        rows.push(durable_floor(&upstream, deliver, args).await?);
    }
    let events = backlog(DRAIN_BACKLOG, args);
    let spec = events_to(Nginx::url(receiver), FLOOR_CONNECTIONS);
    let cpu = cpu_seconds(me).unwrap_or(0.0);
    let report = load::run_n(spec, events).await;
    let used = cpu_seconds(me).unwrap_or(0.0) - cpu;
    if report.ok != events {
        return Err(format!(
            "hyper client: {events} sent, {} answered 2xx, statuses {:?}, first error {:?}",
            report.ok, report.statuses, report.first_error
        ));
    }
    let sent = Row {
        target: format!("floor h. hyper client → nginx, {events} events"),
        rate: Some(report.rate()),
        cpu: Some(used),
        events: Some(events as f64),
        vs_direct: true,
        note: format!(
            "{FLOOR_CONNECTIONS} connections (courier's concurrency), sent in {:.2} s. CPU: the client's process",
            report.elapsed.as_secs_f64()
        ),
        ..Row::default()
    };
    rows.push(sent);
    Ok(rows)
}

/// Step h's durable proxy under wrk: accept only, or end to end (as step
/// b: accepted / (load + the drain after it)).
async fn durable_floor(upstream: &str, deliver: bool, args: &Args) -> Result<Row, String> {
    let me = std::process::id();
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir for the floor: {e}"))?;
    let (server, counts) =
        floor::durable(&dir.path().join("journal"), deliver.then_some(upstream))?;
    let cpu = cpu_seconds(me).unwrap_or(0.0);
    let w = wrk(&Nginx::url(server.port), args).await?;
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    let (accepted, during) = (count(&counts.accepted), count(&counts.delivered));
    let start = Instant::now();
    // Bounded by the deadline.
    while deliver && count(&counts.delivered) + count(&counts.failed) < accepted {
        if start.elapsed() >= DEADLINE {
            return Err(format!(
                "durable floor: {accepted} accepted, {} delivered after {DEADLINE:?}",
                count(&counts.delivered)
            ));
        }
        tokio::time::sleep(POLL).await;
    }
    let drain = start.elapsed().as_secs_f64();
    let used = cpu_seconds(me).unwrap_or(0.0) - cpu;
    drop(server);
    let target = if deliver {
        lightness::FLOOR_ROW
    } else {
        "floor h. hyper + append + fdatasync, accept only"
    };
    let mut row = Row::load(target.into(), &w);
    row.cpu = Some(used);
    if deliver {
        row.rate = Some(accepted as f64 / (w.seconds + drain));
        row.events = Some(accepted as f64);
        row.note = format!(
            "accepted {accepted} ({:.0}/s), delivered {during} during the load, drain {drain:.1} s, failed {}. {}",
            w.rate,
            count(&counts.failed),
            row.note
        );
    }
    row.note = format!("CPU: the proxy's process. {}", row.note);
    Ok(row)
}

/// Step p: passthrough to nginx, to an in-process receiver, and to the
/// same receiver with one in-line retry per request.
async fn passthrough(label: &str, bin: &Path, rx: &str, args: &Args) -> Result<Vec<Row>, String> {
    const MODE: &str = "    mode: passthrough\n    passthrough_deadline: 5s\n    retry: { schedule: [1ms], jitter: 0 }\n    status: { min_delay: { 503: 0s } }\n";
    let mut rows = Vec::new();
    let mut load = |target: String, w: &Wrk, cpu: f64, pid: u32| {
        let mut row = Row::load(target, w);
        row.cpu = Some(cpu);
        row.rss = proc_status(pid, "VmHWM");
        rows.push(row);
    };
    let run = start(bin, rx, MODE).await?;
    let c = &run.courier;
    let cpu = cpu_seconds(c.pid()).unwrap_or(0.0);
    let w = wrk(&c.url(DESTINATION), args).await?;
    let used = cpu_seconds(c.pid()).unwrap_or(0.0) - cpu;
    load(
        format!("{label} {}", lightness::PASSTHROUGH_ROW),
        &w,
        used,
        c.pid(),
    );
    drop(run);
    for retried in [false, true] {
        let receiver = support::Receiver::start(support::behavior(move |req, _| {
            let first = req.header("courier-delivery-attempt") == Some("1");
            support::Reply::status(if retried && first { 503 } else { 200 })
        }))
        .await;
        receiver.set_recording(false);
        let run = start(bin, &receiver.url(), MODE).await?;
        let c = &run.courier;
        let cpu = cpu_seconds(c.pid()).unwrap_or(0.0);
        let w = wrk(&c.url(DESTINATION), args).await?;
        let used = cpu_seconds(c.pid()).unwrap_or(0.0) - cpu;
        let what = if retried {
            "503 then 200 (one in-line retry)"
        } else {
            "200"
        };
        load(
            format!("{label} p. passthrough → test receiver, {what}"),
            &w,
            used,
            c.pid(),
        );
    }
    Ok(rows)
}

/// Step q's load: what an app sends (issue #30 item 6).
const PACED_PER_SECOND: f64 = 5_000.0;
const PACED_CONNECTIONS: usize = 50;
/// Step q's budget: passthrough's p50 over nginx proxy's.
const PACED_P50_BUDGET: f64 = 1.5;

/// Step q: the paced load through nginx proxy (with its CPU), then through
/// passthrough at its default concurrency and at 16, then durable; the
/// rows, the passthrough default's p50 over the proxy's, and the durable
/// run's peak RSS.
async fn paced(
    label: &str,
    bin: &Path,
    rx: &str,
    base: &Baselines,
    args: &Args,
) -> Result<(Vec<Row>, f64, u64), String> {
    const MODE: &str = "    mode: passthrough\n";
    let spec = |url: String| LoadSpec {
        duration: Duration::from_secs(args.seconds),
        ..events_to(url, PACED_CONNECTIONS)
    };
    let row = |target: String, r: &load::LoadReport| {
        let ms = |p: f64| r.percentile(p).as_secs_f64() * 1e3;
        let mut note = format!("{:.0}/s asked", PACED_PER_SECOND);
        if r.non_2xx + r.errors > 0 {
            note = format!(
                "{note}; non-2xx {}, errors {} ({:?})",
                r.non_2xx, r.errors, r.first_error
            );
        }
        Row {
            target,
            rate: Some(r.rate()),
            latency: Some((ms(50.0), ms(99.0), ms(99.9))),
            events: Some(r.ok as f64),
            note,
            ..Row::default()
        }
    };
    let before = base.pids.cpu();
    let proxied = load::run_paced(spec(base.proxy_url.clone()), PACED_PER_SECOND).await;
    let cpu = base.pids.cpu().zip(before).map(|(now, b)| now.since(b));
    let base_p50 = proxied.percentile(50.0).as_secs_f64();
    let mut proxy_row = row(format!("{label} q. paced: nginx proxy"), &proxied);
    if let Some(cpu) = cpu {
        set_nginx_cpu(&mut proxy_row, cpu, true);
    }
    let mut rows = vec![proxy_row];
    let mut p50 = f64::NAN;
    // (config, row, whether its answers must all be 2xx, its role)
    let runs = [
        (
            format!("{MODE}    concurrency: ~\n"),
            "passthrough, default concurrency",
            true,
        ),
        (
            format!("{MODE}    concurrency: 16\n"),
            "passthrough, concurrency 16",
            false,
        ),
        // Issue #47: RSS at 5,000 events/s, durable, the defaults.
        (String::new(), "durable, the defaults", true),
    ];
    let mut hwm = 0;
    for (i, (config, what, checked)) in runs.into_iter().enumerate() {
        let run = start(bin, rx, &config).await?;
        let c = &run.courier;
        let cpu = cpu_seconds(c.pid()).unwrap_or(0.0);
        let r = load::run_paced(spec(c.url(DESTINATION)), PACED_PER_SECOND).await;
        let mut row = row(format!("{label} q. paced: {what}"), &r);
        row.cpu = cpu_seconds(c.pid()).map(|now| now - cpu);
        row.rss = proc_status(c.pid(), "VmHWM");
        if checked && (r.ok == 0 || r.non_2xx + r.errors > 0) {
            return Err(format!(
                "{what}: {} ok, {} non-2xx, {} errors ({:?})",
                r.ok, r.non_2xx, r.errors, r.first_error
            ));
        }
        match i {
            0 => p50 = r.percentile(50.0).as_secs_f64() / base_p50,
            2 => hwm = row.rss.unwrap_or(0),
            _ => {}
        }
        rows.push(row);
    }
    Ok((rows, p50, hwm))
}

/// An nginx row's CPU: the proxy nginx's (`proxy`) or the receiver's,
/// named in its note; the proxy's row names the receiver's CPU too.
fn set_nginx_cpu(row: &mut Row, cpu: NginxCpu, proxy: bool) {
    row.cpu = Some(cpu.of(proxy));
    let note = if proxy {
        let per = row.events.filter(|&e| e > 0.0).map_or(String::new(), |e| {
            format!(", {:.1} µs/request", cpu.receiver * 1e6 / e)
        });
        format!(
            "CPU: the proxy nginx's (master + {} workers); the receiver nginx's: {:.1} s{per}.",
            cpu.proxy_workers, cpu.receiver
        )
    } else {
        format!(
            "CPU: the receiver nginx's (master + {} workers).",
            cpu.receiver_workers
        )
    };
    row.note = format!("{note} {}", row.note).trim().to_owned();
}

/// `row` with the baseline measured just before it, named in its note.
fn beside(mut row: Row, near: Option<Wrk>) -> Row {
    if let Some(w) = &near {
        let what = if row.vs_direct { "direct" } else { "proxy" };
        let cpu = w
            .nginx_us(!row.vs_direct)
            .map_or(String::new(), |us| format!(", its CPU {us:.1} µs/request"));
        let note = format!(
            "nginx {what} just before: {:.0}/s, p99 {:.2} ms{cpu}.",
            w.rate, w.p99
        );
        row.note = format!("{} {note}", row.note.trim()).trim().to_owned();
    }
    row.against = near;
    row
}

fn ratio(value: f64, base: Option<&Wrk>) -> Option<f64> {
    base.filter(|b| b.rate > 0.0).map(|b| value / b.rate)
}

/// Steps a to e for one binary; rows go to `rows`, verdicts to `budgets`.
async fn courier_steps(
    label: &str,
    bin: &Path,
    rx: &str,
    args: &Args,
    base: &Baselines,
    rows: &mut Vec<Row>,
    budgets: &mut Vec<Budget>,
) -> bool {
    let mut ok = true;
    // A failed step's row says why; its budgets say FAILED, so that the
    // medians of rounds cannot pass on the rounds that worked.
    let mut failed = |step: &str,
                      e: String,
                      rows: &mut Vec<Row>,
                      budgets: &mut Vec<Budget>,
                      names: &[String]| {
        eprintln!("courier_bench: {label} {step} FAILED: {e}");
        rows.push(Row {
            target: format!("{label} {step}"),
            note: format!("FAILED: {e}"),
            ..Row::default()
        });
        for name in names {
            budgets.push(Budget {
                failed: true,
                ..budget(
                    format!("{label} {name}"),
                    Vec::new(),
                    format!("step {step} failed"),
                )
            });
        }
        ok = false;
    };
    let proxy = base.proxy.as_ref();
    let direct = base.direct.as_ref();
    // A load budget: rate ≥ min × proxy and p99 ≤ 2 × proxy's, the proxy
    // as measured just before the row when it was.
    let load_budget = |name: &str, row: &Row, min: f64| {
        let (rate, p99) = (row.rate.unwrap_or(0.0), row.latency.map_or(0.0, |l| l.1));
        let proxy = row.against.as_ref().or(proxy);
        // No baseline, or one that measured nothing: no verdict.
        let proxy = proxy.filter(|p| p.rate > 0.0 && p.p99 > 0.0);
        let checks = proxy.map_or(Vec::new(), |p| {
            vec![
                Check::at_least(rate / p.rate, min, "x proxy"),
                Check::at_most(p99 / p.p99, 2.0, "x proxy's p99"),
            ]
        });
        let detail = proxy.map_or("no nginx proxy baseline".into(), |p| {
            format!(
                "{rate:.0}/s = {:.3}x proxy (≥ {min}), p99 {p99:.2} ms = {:.3}x proxy's (≤ 2)",
                rate / p.rate,
                p99 / p.p99
            )
        });
        budget(format!("{label} {name}"), checks, detail)
    };
    for step in args.steps.chars() {
        match step {
            'a' | 'b' => {
                let near = base.again(true, args).await;
                let (run, name, budget_name, min) = if step == 'a' {
                    let run = accept_only(label, bin, rx, args).await;
                    (run, "a. accept-only", "accept-only", 1.0)
                } else {
                    let run = end_to_end(label, bin, rx, args).await;
                    (run, "b. end-to-end", "end-to-end unbatched", 0.7)
                };
                match run {
                    Ok(row) => {
                        let row = beside(row, near);
                        budgets.push(load_budget(budget_name, &row, min));
                        if step == 'b' {
                            budgets.extend(lightness::end_to_end(label, &row, proxy, base.floor));
                        }
                        rows.push(row);
                    }
                    Err(e) => {
                        let mut names = vec![budget_name.to_string()];
                        if step == 'b' {
                            names.extend(lightness::END_TO_END.map(String::from));
                        }
                        failed(name, e, rows, budgets, &names)
                    }
                }
            }
            'c' => {
                let near = base.again(false, args).await;
                for (max_events, min) in [(1, 0.5), (100, 1.0)] {
                    match drain(label, bin, rx, max_events, args).await {
                        Ok(row) => {
                            let row = beside(row, near.clone());
                            let direct = row.against.as_ref().or(direct);
                            let rate = row.rate.unwrap_or(0.0);
                            let checks = ratio(rate, direct)
                                .map_or(Vec::new(), |r| vec![Check::at_least(r, min, "x direct")]);
                            let detail = ratio(rate, direct)
                                .map_or("no nginx direct baseline".into(), |r| {
                                    format!("{rate:.0} events/s = {r:.3}x direct (≥ {min})")
                                });
                            let name = format!("drain, max_events {max_events}");
                            budgets.push(budget(format!("{label} {name}"), checks, detail));
                            rows.push(row);
                        }
                        Err(e) => failed(
                            &format!("c. drain, max_events {max_events}"),
                            e,
                            rows,
                            budgets,
                            &[format!("drain, max_events {max_events}")],
                        ),
                    }
                }
            }
            'd' => match big_backlog(label, bin, rx, args).await {
                Ok((row, big)) => {
                    let name = |what: &str| format!("{label} {} backlog {what}", big.events);
                    let (rss, hwm) = (big.rss as f64 / MIB, big.hwm as f64 / MIB);
                    budgets.push(budget(
                        name("peak RSS"),
                        vec![Check::at_most(hwm, 64.0, " MiB")],
                        format!("VmHWM {hwm:.1} MiB (≤ 64), VmRSS {rss:.1} MiB"),
                    ));
                    budgets.push(lightness::backlog_rss(label, big.events, hwm));
                    budgets.push(budget(
                        name("ready after SIGKILL"),
                        vec![Check::at_most(
                            big.ready.as_secs_f64() * 1000.0,
                            1000.0,
                            " ms",
                        )],
                        format!("{} ms (≤ 1000)", big.ready.as_millis()),
                    ));
                    let bodies = big.events as f64 * BODY_BYTES as f64;
                    budgets.push(budget(
                        name("disk"),
                        vec![Check::at_most(
                            big.disk as f64 / bodies,
                            1.2,
                            "x the bodies",
                        )],
                        format!(
                            "{:.0} MiB = {:.2}x the bodies (≤ 1.2)",
                            big.disk as f64 / MIB,
                            big.disk as f64 / bodies
                        ),
                    ));
                    rows.push(row);
                }
                Err(e) => {
                    let events = backlog(BIG_BACKLOG, args);
                    let names = ["peak RSS", "ready after SIGKILL", "disk"]
                        .map(|what| format!("{events} backlog {what}"));
                    failed("d. backlog", e, rows, budgets, &names)
                }
            },
            'x' => match mass_expiry(label, bin, rx, args).await {
                Ok((row, replay, rate, hwm)) => {
                    let events = backlog(EXPIRY_BACKLOG, args);
                    let hwm = hwm as f64 / MIB;
                    // Issue #12: 1,000,000 in ≤ 60 s, RSS ≤ 64 MiB.
                    budgets.push(budget(
                        format!("{label} mass expiry {events}"),
                        vec![
                            Check::at_least(rate, 1_000_000.0 / 60.0, " events/s"),
                            Check::at_most(hwm, 64.0, " MiB"),
                        ],
                        format!("{rate:.0} events/s (≥ 16,667: 1M in 60 s), peak RSS {hwm:.1} MiB (≤ 64)"),
                    ));
                    rows.push(row);
                    rows.push(replay);
                }
                Err(e) => {
                    let name = format!("mass expiry {}", backlog(EXPIRY_BACKLOG, args));
                    failed("x. mass expiry", e, rows, budgets, &[name])
                }
            },
            'o' => match objects::bucket_expiry(label, bin, rx, args).await {
                Ok((row, rate, hwm)) => {
                    let events = backlog(EXPIRY_BACKLOG, args);
                    let hwm = hwm as f64 / MIB;
                    let min = objects::BUCKET_EXPIRY_RATE;
                    budgets.push(budget(
                        format!("{label} mass expiry {events} to a bucket"),
                        vec![Check::at_least(rate, min, " events/s")],
                        format!("{rate:.0} events/s (≥ {min:.0}), peak RSS {hwm:.1} MiB"),
                    ));
                    rows.push(row);
                }
                Err(e) => {
                    let name = format!("mass expiry {} to a bucket", backlog(EXPIRY_BACKLOG, args));
                    failed("o. mass expiry to a bucket", e, rows, budgets, &[name])
                }
            },
            't' => {
                let events = backlog(objects::HANDOFF_BACKLOG, args);
                let (secs, mib) = (objects::HANDOFF_SECONDS, objects::HANDOFF_RSS_MIB);
                let mut runs: Vec<Option<objects::HandOff>> = Vec::new();
                for sealed in [false, true] {
                    let kind = if sealed { " sealed" } else { "" };
                    match objects::hand_off(label, bin, rx, args, sealed).await {
                        Ok(mut h) => {
                            let (hwm_a, hwm_b) = (h.hwm_a as f64 / MIB, h.hwm_b as f64 / MIB);
                            let handing = h.hwm_handing.map_or(String::new(), |b| {
                                format!(" ({:.1} from the SIGTERM)", b as f64 / MIB)
                            });
                            budgets.push(budget(
                                format!("{label} hand-off{kind} {events} written"),
                                vec![
                                    Check::at_most(h.written.as_secs_f64(), secs, " s"),
                                    Check::at_most(hwm_a, mib, " MiB"),
                                ],
                                format!(
                                    "{:.2} s by A's log (≤ {secs}; SIGTERM to exit {:.2} s), A's peak RSS {hwm_a:.1} MiB{handing} (≤ {mib})",
                                    h.written.as_secs_f64(),
                                    h.wall.as_secs_f64()
                                ),
                            ));
                            budgets.push(budget(
                                format!("{label} hand-off{kind} {events} adopted"),
                                vec![
                                    Check::at_most(h.adopted.as_secs_f64(), secs, " s"),
                                    Check::at_most(hwm_b, mib, " MiB"),
                                ],
                                format!(
                                    "{:.2} s from B's spawn (≤ {secs}), B's peak RSS {hwm_b:.1} MiB (≤ {mib})",
                                    h.adopted.as_secs_f64()
                                ),
                            ));
                            rows.extend(std::mem::take(&mut h.rows));
                            runs.push(Some(h));
                        }
                        Err(e) => {
                            let names = ["written", "adopted"]
                                .map(|w| format!("hand-off{kind} {events} {w}"));
                            failed("t. hand-off", e, rows, budgets, &names);
                            runs.push(None);
                        }
                    }
                }
                if let [Some(plain), Some(sealed)] = runs.as_slice() {
                    let ratio =
                        |p: Duration, s: Duration| p.as_secs_f64() / s.as_secs_f64().max(1e-9);
                    let (w, a) = (
                        ratio(plain.written, sealed.written),
                        ratio(plain.adopted, sealed.adopted),
                    );
                    let min = objects::SEALED_RATIO;
                    budgets.push(budget(
                        format!("{label} hand-off sealed / in the clear"),
                        vec![Check::at_least(w, min, "x"), Check::at_least(a, min, "x")],
                        format!(
                            "written {w:.2}x, adopted {a:.2}x the rate in the clear (≥ {min}x each; one run each, moto_server)"
                        ),
                    ));
                }
            }
            'l' => match ordering::ordering(label, bin, rx, args).await {
                Ok(m) => {
                    budgets.extend(ordering::budgets(label, &m));
                    rows.extend(m.rows);
                }
                Err(e) => failed(
                    "l. ordering lanes",
                    e,
                    rows,
                    budgets,
                    &[ordering::budget_name()],
                ),
            },
            'y' => match history::history(label, bin, rx, args).await {
                Ok(m) => {
                    budgets.extend(history::budgets(label, &m, args));
                    rows.extend(m.rows);
                }
                Err(e) => failed(
                    "y. event history",
                    e,
                    rows,
                    budgets,
                    &history::budget_names(args),
                ),
            },
            'm' => match endpoints::endpoints(label, bin, rx, args).await {
                Ok(m) => {
                    budgets.extend(endpoints::budgets(label, &m));
                    rows.extend(m.rows);
                }
                Err(e) => failed(
                    "m. many endpoints",
                    e,
                    rows,
                    budgets,
                    &[endpoints::budget_name()],
                ),
            },
            'v' => match endpoints::tracked(label, bin).await {
                Ok((row, b)) => {
                    budgets.push(b);
                    rows.push(row);
                }
                Err(e) => failed(
                    "v. endpoints tracked",
                    e,
                    rows,
                    budgets,
                    &[endpoints::tracked_budget_name()],
                ),
            },
            'w' => match endpoints::noisy(label, bin).await {
                Ok((r, b)) => {
                    budgets.push(b);
                    rows.extend(r);
                }
                Err(e) => failed(
                    "w. noisy neighbour",
                    e,
                    rows,
                    budgets,
                    &[endpoints::noisy_budget_name()],
                ),
            },
            'u' => match guard::guard(label, bin, rx, args).await {
                Ok(m) => {
                    budgets.extend(guard::budgets(label, &m));
                    rows.extend(m.rows);
                }
                Err(e) => failed("u. guard", e, rows, budgets, &[guard::budget_name()]),
            },
            'r' => match tracing::tracing(label, bin, rx, args).await {
                Ok(m) => {
                    budgets.extend(tracing::budgets(label, &m));
                    rows.extend(m.rows);
                }
                Err(e) => failed("r. tracing", e, rows, budgets, &[tracing::budget_name()]),
            },
            'g' => match adaptive::adaptive(label, bin, rx, args).await {
                Ok(m) => {
                    budgets.extend(adaptive::budgets(label, &m));
                    rows.extend(m.rows);
                }
                Err(e) => failed(
                    "g. adaptive concurrency",
                    e,
                    rows,
                    budgets,
                    &[adaptive::budget_name()],
                ),
            },
            'p' => match passthrough(label, bin, rx, args).await {
                Ok(p) => {
                    let to_nginx = p
                        .iter()
                        .find(|r| r.target.ends_with(lightness::PASSTHROUGH_ROW));
                    budgets.push(lightness::passthrough(label, to_nginx, proxy));
                    rows.extend(p)
                }
                Err(e) => failed(
                    "p. passthrough",
                    e,
                    rows,
                    budgets,
                    &[lightness::PASSTHROUGH.into()],
                ),
            },
            'q' => {
                let name = format!("{label} {PACED_BUDGET}");
                match paced(label, bin, rx, base, args).await {
                    Ok((p, ratio, hwm)) => {
                        budgets.push(budget(
                            name,
                            vec![Check::at_most(ratio, PACED_P50_BUDGET, "x proxy")],
                            format!("p50 {ratio:.2}x nginx proxy's (≤ {PACED_P50_BUDGET})"),
                        ));
                        budgets.push(lightness::paced_rss(label, hwm));
                        rows.extend(p);
                    }
                    Err(e) => failed(
                        "q. paced passthrough",
                        e,
                        rows,
                        budgets,
                        &[PACED_BUDGET.into(), lightness::PACED_RSS.into()],
                    ),
                }
            }
            'k' => match crash_window(label, bin, args).await {
                Ok((row, window)) => {
                    // docs/journal.md "Durability": about 200 ms.
                    budgets.push(budget(
                        format!("{label} {WINDOW_BUDGET}"),
                        vec![Check::at_most(window, 200.0, " ms")],
                        format!("{window:.0} ms (≤ 200, docs/journal.md's \"about 200 ms\"); none of the 202s lost"),
                    ));
                    rows.push(row);
                }
                Err(e) => failed(
                    "k. SIGKILL under load",
                    e,
                    rows,
                    budgets,
                    &[WINDOW_BUDGET.into()],
                ),
            },
            'i' => match connections::idle_connections(label, bin, rx).await {
                Ok((row, b)) => {
                    budgets.extend(b);
                    rows.push(row);
                }
                Err(e) => failed(
                    "i. idle connections",
                    e,
                    rows,
                    budgets,
                    &connections::budget_names(),
                ),
            },
            'e' => match idle(label, bin, rx).await {
                Ok(row) => {
                    let rss = row.rss.unwrap_or(u64::MAX) as f64 / MIB;
                    budgets.push(budget(
                        format!("{label} idle RSS"),
                        vec![Check::at_most(rss, 20.0, " MiB")],
                        format!("{rss:.1} MiB (≤ 20)"),
                    ));
                    rows.push(row);
                }
                Err(e) => failed("e. idle", e, rows, budgets, &["idle RSS".into()]),
            },
            _ => {}
        }
    }
    ok
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

impl Row {
    /// Its rate over nginx proxy's (loads only) and over nginx direct's
    /// (drains and nginx itself), each as measured just before the row
    /// when it was.
    fn ratios(&self, base: &Baselines) -> (Option<f64>, Option<f64>) {
        let near = |direct: bool| self.against.as_ref().filter(|_| self.vs_direct == direct);
        let proxy = self
            .rate
            .and_then(|v| ratio(v, near(false).or(base.proxy.as_ref())))
            .filter(|_| self.latency.is_some());
        let direct = self
            .rate
            .and_then(|v| ratio(v, near(true).or(base.direct.as_ref())))
            .filter(|_| self.vs_direct);
        (proxy, direct)
    }

    fn cpu_per_event_us(&self) -> Option<f64> {
        self.cpu
            .zip(self.events.filter(|&e| e > 0.0))
            .map(|(cpu, events)| cpu * 1e6 / events)
    }
}

fn verdict(pass: Option<bool>) -> &'static str {
    match pass {
        Some(true) => "PASS",
        Some(false) => "MISS",
        None => "n/a",
    }
}

/// The table and the budgets as markdown (also what is printed); with
/// rounds, their medians after them.
fn render(rows: &[Row], budgets: &[Budget], base: &Baselines) -> String {
    let mut out = String::from(
        "| target | req/s | p50 ms | p99 ms | p999 ms | × proxy | × direct | CPU s | CPU µs/event | peak RSS MiB | notes |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        let lat = |i: usize| opt(r.latency.map(|l| [l.0, l.1, l.2][i]), 2);
        let (proxy, direct) = r.ratios(base);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.target,
            opt(r.rate, 0),
            lat(0),
            lat(1),
            lat(2),
            opt(proxy, 2),
            opt(direct, 2),
            opt(r.cpu, 1),
            opt(r.cpu_per_event_us(), 1),
            opt(r.rss.map(|b| b as f64 / MIB), 1),
            r.note.trim()
        );
    }
    if !budgets.is_empty() {
        out.push_str("\n| budget | verdict | measured |\n|---|---|---|\n");
    }
    for b in budgets {
        let _ = writeln!(out, "| {} | {} | {} |", b.name, b.verdict(), b.detail);
    }
    out.push_str(&render_medians(rows, budgets, base));
    out
}

/// Rows and budgets run in more than one round, gathered by name: the
/// median of each figure (ratios taken per round, each against its own
/// baseline), and each budget judged on its medians. Empty without rounds.
fn render_medians(rows: &[Row], budgets: &[Budget], base: &Baselines) -> String {
    let mut out = String::new();
    let mut groups = rounds_of(rows, |r| &r.target);
    // Rows with figures (step k's is all notes), seen in more than one round.
    groups.retain(|(_, members)| {
        members.len() > 1
            && members
                .iter()
                .any(|r| r.rate.is_some() || r.cpu.is_some() || r.rss.is_some())
    });
    if !groups.is_empty() {
        out.push_str(
            "\n| target, median of rounds | rounds | req/s | p99 ms | × proxy | × direct | CPU µs/event | peak RSS MiB |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
    }
    for (key, members) in &groups {
        let med = |f: &dyn Fn(&Row) -> Option<f64>| {
            median(&mut members.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
        };
        // Rounds that measured; a failed one is named beside them.
        let failed = members
            .iter()
            .filter(|r| r.note.starts_with("FAILED"))
            .count();
        let rounds = match failed {
            0 => (members.len()).to_string(),
            n => format!("{} ({n} failed)", members.len() - n),
        };
        let _ = writeln!(
            out,
            "| {key} | {rounds} | {} | {} | {} | {} | {} | {} |",
            opt(med(&|r| r.rate), 0),
            opt(med(&|r| r.latency.map(|l| l.1)), 2),
            opt(med(&|r| r.ratios(base).0), 3),
            opt(med(&|r| r.ratios(base).1), 3),
            opt(med(&|r| r.cpu_per_event_us()), 1),
            opt(med(&|r| r.rss.map(|b| b as f64 / MIB)), 1),
        );
    }
    let mut judged = rounds_of(budgets, |b| &b.name);
    judged.retain(|(_, members)| members.len() > 1);
    if !judged.is_empty() {
        out.push_str("\n| budget, on the medians of rounds | verdict | median (each round) |\n|---|---|---|\n");
    }
    for (key, members) in &judged {
        if let Some(at) = members.iter().position(|b| b.failed) {
            let _ = writeln!(
                out,
                "| {key} | FAILED | its step failed in round {} |",
                at + 1
            );
            continue;
        }
        // A round whose baseline was missing has no checks: left out.
        let measured: Vec<&&Budget> = members.iter().filter(|b| !b.checks.is_empty()).collect();
        let Some(first) = measured.first() else {
            let _ = writeln!(out, "| {key} | n/a | no round measured |");
            continue;
        };
        let mut checks = Vec::new();
        let mut parts = Vec::new();
        for (i, check) in first.checks.iter().enumerate() {
            let mut values: Vec<f64> = measured
                .iter()
                .filter_map(|b| b.checks.get(i).map(|c| c.value))
                .collect();
            let each = values
                .iter()
                .map(|v| check.number(*v))
                .collect::<Vec<_>>()
                .join(", ");
            let Some(value) = median(&mut values) else {
                continue;
            };
            let m = Check { value, ..*check };
            let bound = if m.at_least { "≥" } else { "≤" };
            parts.push(format!(
                "{}{} ({bound} {}; rounds: {each})",
                m.number(value),
                m.unit,
                m.number(m.limit)
            ));
            checks.push(m);
        }
        let _ = writeln!(
            out,
            "| {key} | {} | median of {}: {} |",
            verdict(all_pass(&checks)),
            measured.len(),
            parts.join("; ")
        );
    }
    out
}

fn shell(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// The heading of benches/RESULTS.md's last section, the figures behind the
/// code's comments: written by hand, so a new run keeps it.
const KEPT_HEADING: &str = "## Measurements behind the code";

/// `old`'s section from the line `KEPT_HEADING` to its end; "" without one.
fn kept_section(old: &str) -> &str {
    let mut at = 0;
    for line in old.split_inclusive('\n') {
        if line.trim_end() == KEPT_HEADING {
            return &old[at..];
        }
        at += line.len();
    }
    ""
}

/// Writes benches/RESULTS.md anew, keeping the old file's `KEPT_HEADING`
/// section after the new table.
fn write_results(
    command: &str,
    header: &str,
    table: &str,
    load_before: &str,
) -> Result<PathBuf, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches");
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let path = dir.join("RESULTS.md");
    // A file that cannot be read must not lose its kept section to the rewrite.
    let old = match std::fs::read_to_string(&path) {
        Ok(old) => old,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("read {}: {e}", path.display())),
    };
    let mut text = format!(
        "# courier_bench results\n\n\
         Written by `{command}` on {} at commit {}.\n\n\
         Other work on the machine: `uptime` before the run: {load_before}; after: {}.\n\n\
         {header}\n\n{table}\n\
         × proxy / × direct: req/s (events/s for drains, accepted / (load + drain) for \
         end-to-end) over nginx's, as measured just before the row (named in its notes) \
         for courier's loads and drains. CPU: utime + stime of the process named in the notes \
         (courier's for courier's rows) during the load (a, b, p, q, and nginx's: the nginx \
         master and its workers), the drain (c), the fill (d), since start (e; x and o: since the restart; t: B's), \
         from the SIGTERM (t: A's) or over the load and its delivery (y, l); CPU \
         µs/event: that over the events (requests for nginx) answered 2xx (a, p, q, nginx, \
         h's loads), accepted (b, h's end to end, y, l), drained (c), filled (d), dead-lettered (o) \
         or handed off (t). Peak RSS: VmHWM (e: VmRSS). With \
         `--rounds`, the medians of the rounds follow the budgets.\n",
        shell("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        shell("git", &["rev-parse", "--short", "HEAD"]),
        shell("uptime", &[]),
    );
    let kept = kept_section(&old);
    if !kept.is_empty() {
        text.push('\n');
        text.push_str(kept);
    }
    std::fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
    Ok(path)
}

async fn run(args: Args) -> ExitCode {
    let mut binaries = vec![("courier".to_owned(), courier_release_bin())];
    if let Some(path) = &args.compare {
        binaries.push(("compare".to_owned(), path.clone()));
    }
    for (_, bin) in &binaries {
        if !bin.is_file() {
            eprintln!("courier_bench: no courier binary at {}", bin.display());
            return ExitCode::FAILURE;
        }
    }
    let load_before = shell("uptime", &[]);
    println!("courier_bench: uptime: {load_before}");
    let nginx = Nginx::receiver().and_then(|r| Ok((Nginx::proxy(r.port)?, r)));
    let (proxy, receiver) = match nginx {
        Ok(n) => n,
        Err(e) => {
            eprintln!("courier_bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let pids = NginxPids {
        receiver: receiver.pid(),
        proxy: proxy.pid(),
    };
    let workers = pids.cpu().map_or("?".into(), |c| {
        format!(
            "proxy {} workers, receiver {}",
            c.proxy_workers, c.receiver_workers
        )
    });
    let header = format!(
        "wrk -t2 -c{} -d{}s, {BODY_BYTES}-byte JSON POSTs, {} CPUs, backlog scale {}; \
         nginx proxy and receiver each its own nginx at worker_processes auto \
         ({workers}); {}",
        args.connections,
        args.seconds,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        args.scale,
        binaries
            .iter()
            .map(|(label, bin)| format!("{label} = {}", bin.display()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("courier_bench: {header}");
    let mut rows = Vec::new();
    let mut budgets = Vec::new();
    let mut base = Baselines {
        direct: None,
        proxy: None,
        urls: None,
        proxy_url: Nginx::url(proxy.port),
        pids,
        floor: None,
    };
    let mut ok = true;
    if args.steps.contains('n') {
        base.urls = Some((Nginx::url(receiver.port), Nginx::url(proxy.port)));
        for (name, port) in [("direct", receiver.port), ("proxy", proxy.port)] {
            match wrk_nginx(&Nginx::url(port), pids, &args).await {
                Ok(w) => {
                    let mut row = Row {
                        vs_direct: true,
                        ..Row::load(format!("nginx {name}"), &w)
                    };
                    if let Some(cpu) = w.nginx_cpu {
                        set_nginx_cpu(&mut row, cpu, name == "proxy");
                    }
                    rows.push(row);
                    if name == "direct" {
                        base.direct = Some(w);
                    } else {
                        base.proxy = Some(w);
                    }
                }
                Err(e) => {
                    eprintln!("courier_bench: nginx {name}: {e}");
                    ok = false;
                }
            }
        }
    }
    if args.steps.contains('h') {
        match floor_rows(receiver.port, &args).await {
            Ok(floor) => {
                base.floor = floor
                    .iter()
                    .find(|r| r.target == lightness::FLOOR_ROW)
                    .and_then(Row::cpu_per_event_us);
                rows.extend(floor)
            }
            Err(e) => {
                eprintln!("courier_bench: floor: {e}");
                ok = false;
            }
        }
    }
    let rx = Nginx::url(receiver.port);
    for round in 1..=args.rounds {
        for (label, bin) in &binaries {
            let label = if args.rounds > 1 {
                format!("{label} (round {round})")
            } else {
                label.clone()
            };
            ok &= courier_steps(&label, bin, &rx, &args, &base, &mut rows, &mut budgets).await;
        }
    }
    drop(proxy);
    drop(receiver);
    let table = render(&rows, &budgets, &base);
    println!("\n{table}");
    println!("courier_bench: uptime: {}", shell("uptime", &[]));
    if args.write_results {
        let command = format!(
            "cargo bench --bench courier_bench -- {}",
            std::env::args()
                .skip(1)
                .filter(|a| a != "--bench")
                .collect::<Vec<_>>()
                .join(" ")
        );
        let command = command.trim_end_matches(" -- ");
        match write_results(command, &header, &table, &load_before) {
            Ok(path) => println!("courier_bench: wrote {}", path.display()),
            Err(e) => {
                eprintln!("courier_bench: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    // `cargo test --benches` (and `--all-targets`) runs this without `--bench`,
    // maybe with test-harness arguments: nothing to do then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("courier_bench: skipped (not run by `cargo bench --bench courier_bench`)");
        return ExitCode::SUCCESS;
    }
    if let Some(missing) = [WRK, NGINX].into_iter().find(|p| !Path::new(p).is_file()) {
        println!(
            "courier_bench: skipped: {missing} is missing (apt-get install -y wrk nginx-light)"
        );
        return ExitCode::SUCCESS;
    }
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("courier_bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("build the tokio runtime");
    runtime.block_on(run(args))
}
