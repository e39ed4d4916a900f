//! The `courier` command line (docs/cli.md). Errors become one sentence on
//! stderr and an exit code: 1 for bad config or arguments, 2 at run time.
//! Once `courier run` has read its config, that sentence is a log line in
//! the configured format (JSON stays JSON); before, the format is not known
//! and the sentence is plain text.

/// mimalloc rather than glibc's malloc: per event, ingress, the journal
/// and delivery allocate and free buffers on different threads, where
/// glibc's malloc and free (with `malloc_consolidate`) stood out in a
/// `perf` profile of the end-to-end bench (benches/RESULTS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Args, Parser, Subcommand};
use courier::admin::client::{self, AdminClient, CliError};
use courier::config::{self, ProcessEnv, Purpose};
use courier::policy::Plan;
use courier::policy::classify::Floor;
use courier::policy::limits::PlannedAttempt;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "courier",
    version,
    about = "Reliable outbound webhooks: accept durably, deliver with Event Grid semantics"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the sidecar.
    Run {
        #[arg(short, long, env = "COURIER_CONFIG", default_value = "./courier.yaml")]
        config: PathBuf,
    },
    /// Validate the config and print the effective config.
    Check {
        #[arg(short, long, env = "COURIER_CONFIG", default_value = "./courier.yaml")]
        config: PathBuf,
    },
    /// Print a destination's retry plan, without jitter.
    Schedule {
        #[arg(short, long, env = "COURIER_CONFIG", default_value = "./courier.yaml")]
        config: PathBuf,
        destination: String,
        #[arg(long)]
        json: bool,
    },
    /// Work on dead-lettered events through the admin API.
    DeadLetters {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: DeadLetterCommand,
    },
    /// Where is my webhook: event history through the admin API.
    Events {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: EventCommand,
    },
    /// The endpoints of a url: per_event destination through the admin API.
    Endpoints {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: EndpointCommand,
    },
    /// Work on a stopped courier's journal.
    Journal {
        #[command(subcommand)]
        command: JournalCommand,
    },
}

/// How the commands that call the admin API reach it; one definition, so
/// that `dead-letters` and `events` take the same options.
#[derive(Args)]
struct AdminArgs {
    /// The admin listener (admin_listen).
    #[arg(long, global = true, default_value = "http://127.0.0.1:9090")]
    admin: String,
    /// The variable holding the admin token (admin_token_env).
    #[arg(long, global = true, default_value = "COURIER_ADMIN_TOKEN")]
    token_env: String,
    /// Print the API's JSON instead of a table or timeline.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum EventCommand {
    /// An event's state and attempts at each destination.
    Show {
        id: String,
        /// Only this destination's delivery.
        #[arg(long)]
        destination: Option<String>,
    },
    /// A page of events, newest first.
    List {
        #[arg(long)]
        destination: Option<String>,
        /// pending, in_flight, delivered, dead_lettered, dropped or handed_off.
        #[arg(long)]
        state: Option<String>,
        /// Accepted at or after (2026-11-22 or 2026-11-22T10:00:00Z).
        #[arg(long)]
        since: Option<String>,
        /// Accepted before.
        #[arg(long)]
        until: Option<String>,
        /// Events on the page, 1 to 1000 (default 100).
        #[arg(long)]
        limit: Option<usize>,
        /// The cursor a previous page printed, for the page after it.
        #[arg(long)]
        after: Option<String>,
        /// Only events of this endpoint (url: per_event): its origin or any URL of it.
        #[arg(long)]
        endpoint: Option<String>,
    },
}

#[derive(Subcommand)]
enum EndpointCommand {
    /// A page of endpoints, in origin order.
    List {
        #[arg(long)]
        destination: String,
        /// healthy, probation, paused or disabled.
        #[arg(long)]
        state: Option<String>,
        /// Endpoints on the page, 1 to 1000 (default 100).
        #[arg(long)]
        limit: Option<usize>,
        /// The cursor a previous page printed, for the page after it.
        #[arg(long)]
        after: Option<String>,
    },
    /// Disable an endpoint: its pending events are dead-lettered
    /// EndpointDisabled, new ones refused (409).
    Disable {
        #[arg(long)]
        destination: String,
        /// Its origin (https://host:port) or any URL of it.
        endpoint: String,
    },
    /// Enable a disabled endpoint again.
    Enable {
        #[arg(long)]
        destination: String,
        endpoint: String,
    },
}

#[derive(Subcommand)]
enum DeadLetterCommand {
    /// List dead letters, newest first.
    List {
        #[arg(long)]
        destination: Option<String>,
        /// Records on the page (default 100); `more: add --after …` says
        /// when there are more.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// NonRetriableStatus, MaxDeliveryAttemptsExceeded or TimeToLiveExceeded.
        #[arg(long)]
        reason: Option<String>,
        /// Dead-lettered at or after (2026-11-22 or 2026-11-22T10:00:00Z).
        #[arg(long)]
        since: Option<String>,
        /// Dead-lettered before.
        #[arg(long)]
        until: Option<String>,
        /// List oldest first.
        #[arg(long)]
        oldest_first: bool,
        /// The cursor a previous page printed, for the page after it (with
        /// the same filters and order).
        #[arg(long)]
        after: Option<String>,
    },
    /// Show one record (the newest with that id).
    Show {
        #[arg(long)]
        destination: String,
        id: String,
    },
    /// Put records back in the journal, with a fresh attempt count.
    Replay {
        #[arg(long)]
        destination: String,
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<String>,
        /// Every record not replayed yet (with --yes).
        #[arg(long)]
        all: bool,
        #[arg(long)]
        yes: bool,
        /// With --all: only records with this reason.
        #[arg(long, requires = "all")]
        reason: Option<String>,
        #[arg(long, requires = "all")]
        since: Option<String>,
        #[arg(long, requires = "all")]
        until: Option<String>,
    },
    /// Remove a destination's records (of the days before --before).
    Purge {
        #[arg(long)]
        destination: String,
        /// A date: records of earlier days are removed.
        #[arg(long)]
        before: Option<String>,
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Subcommand)]
enum JournalCommand {
    /// Pending events per destination, oldest, size on disk, integrity.
    Inspect {
        #[arg(long)]
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.command {
        Command::Run { config } => run(&config),
        Command::Check { config } => check(&config),
        Command::Schedule {
            config,
            destination,
            json,
        } => schedule(&config, &destination, json),
        Command::DeadLetters { admin, command } => {
            admin_command(dead_letters_call(&admin, command))
        }
        Command::Events { admin, command } => admin_command(events_call(&admin, command)),
        Command::Endpoints { admin, command } => admin_command(endpoints_call(&admin, command)),
        Command::Journal {
            command: JournalCommand::Inspect { dir },
        } => inspect(&dir),
    }
}

/// Runs one command that calls the admin API: its text on stdout, or its
/// error as one sentence on stderr with the exit code of docs/cli.md.
fn admin_command(call: impl std::future::Future<Output = Result<String, CliError>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("courier: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(call) {
        Ok(text) => {
            emit(&text);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("courier: {e}");
            ExitCode::from(e.code())
        }
    }
}

/// The admin API's JSON as the commands print it with `--json`.
fn pretty(v: &serde_json::Value) -> String {
    format!("{v:#}\n")
}

async fn events_call(admin: &AdminArgs, command: EventCommand) -> Result<String, CliError> {
    use courier::admin::api::{EventAnswer, EventPage};
    use http::Method;
    let client = AdminClient::new(&admin.admin, &admin.token_env)?;
    match command {
        EventCommand::Show { id, destination } => {
            let path = format!(
                "/v1/events/{}{}",
                client::segment(&id),
                client::query(&[("destination", destination)])
            );
            if admin.json {
                return Ok(pretty(&client.call(Method::GET, &path, None).await?));
            }
            let answer: EventAnswer = client.call_as(Method::GET, &path, None).await?;
            Ok(client::timeline(&answer))
        }
        EventCommand::List {
            destination,
            state,
            since,
            until,
            limit,
            after,
            endpoint,
        } => {
            let path = format!(
                "/v1/events{}",
                client::query(&[
                    ("destination", destination),
                    ("state", state),
                    ("since", since),
                    ("until", until),
                    ("limit", limit.map(|n| n.to_string())),
                    ("after", after),
                    ("endpoint", endpoint),
                ])
            );
            if admin.json {
                return Ok(pretty(&client.call(Method::GET, &path, None).await?));
            }
            let page: EventPage = client.call_as(Method::GET, &path, None).await?;
            let mut o = client::events_table(&page.events);
            if let Some(next) = page.next {
                let _ = writeln!(
                    o,
                    "more events: add --after {next} (with the same filters) for the next page"
                );
            }
            Ok(o)
        }
    }
}

async fn endpoints_call(admin: &AdminArgs, command: EndpointCommand) -> Result<String, CliError> {
    use courier::admin::api::{EndpointChange, EndpointPage};
    use http::Method;
    let client = AdminClient::new(&admin.admin, &admin.token_env)?;
    let (destination, endpoint, action) = match command {
        EndpointCommand::List {
            destination,
            state,
            limit,
            after,
        } => {
            let path = format!(
                "/v1/destinations/{}/endpoints{}",
                client::segment(&destination),
                client::query(&[
                    ("state", state),
                    ("limit", limit.map(|n| n.to_string())),
                    ("after", after),
                ])
            );
            if admin.json {
                return Ok(pretty(&client.call(Method::GET, &path, None).await?));
            }
            let page: EndpointPage = client.call_as(Method::GET, &path, None).await?;
            let mut o = client::endpoints_table(&page.endpoints);
            if let Some(next) = page.next {
                let _ = writeln!(
                    o,
                    "more endpoints: add --after {next} (with the same filters) for the next page"
                );
            }
            return Ok(o);
        }
        EndpointCommand::Disable {
            destination,
            endpoint,
        } => (destination, endpoint, "disable"),
        EndpointCommand::Enable {
            destination,
            endpoint,
        } => (destination, endpoint, "enable"),
    };
    // The origin alone goes over the wire: a URL's path or query may hold
    // the customer's secret, and a refused admin call logs its path.
    let origin = courier::event::endpoint::origin(&endpoint).unwrap_or(endpoint);
    let path = format!(
        "/v1/destinations/{}/endpoints/{}/{action}",
        client::segment(&destination),
        client::segment(&origin)
    );
    if admin.json {
        return Ok(pretty(&client.call(Method::POST, &path, None).await?));
    }
    let c: EndpointChange = client.call_as(Method::POST, &path, None).await?;
    let done = if c.changed { "now" } else { "already" };
    Ok(format!(
        "{} of {}: {done} {}\n",
        c.origin, c.destination, c.state
    ))
}

/// What event history knows of a dead letter's attempts, after its record.
/// An extra only: nothing when history has no such event (turned off, past
/// its retention, an older courier), and a failed read is a note on
/// stderr, never the failure of `show`.
async fn dead_letter_timeline(client: &AdminClient, destination: &str, id: &str) -> String {
    let path = format!(
        "/v1/events/{}{}",
        client::segment(id),
        client::query(&[("destination", Some(destination.to_string()))])
    );
    match client
        .find_as::<courier::admin::api::EventAnswer>(&path)
        .await
    {
        Ok(Some(answer)) => format!("\n{}", client::timeline(&answer)),
        Ok(None) => String::new(),
        Err(e) => {
            eprintln!("courier: no attempt timeline from event history: {e}");
            String::new()
        }
    }
}

async fn dead_letters_call(
    admin: &AdminArgs,
    command: DeadLetterCommand,
) -> Result<String, CliError> {
    use courier::admin::api::{PurgeAnswer, ReplayAnswer, ReplayRequest};
    use http::Method;
    use serde_json::json;
    let client = AdminClient::new(&admin.admin, &admin.token_env)?;
    let json = admin.json;
    let mut o = String::new();
    match command {
        DeadLetterCommand::List {
            destination,
            limit,
            reason,
            since,
            until,
            oldest_first,
            after,
        } => {
            let order = oldest_first.then(|| "oldest".to_string());
            let filters = [
                ("destination", destination),
                ("reason", reason),
                ("since", since),
                ("until", until),
                ("order", order),
            ];
            let page = client::list(&client, &filters, limit, after).await?;
            if json {
                return Ok(pretty(&json!(page)));
            }
            o.push_str(&client::table(&page.dead_letters));
            if page.unreadable_lines > 0 {
                let _ = writeln!(
                    o,
                    "{} lines of the sink's files are not records and were passed over",
                    page.unreadable_lines
                );
            }
            if let Some(next) = page.next {
                let _ = writeln!(
                    o,
                    "more dead letters: add --after {next} (with the same filters) for the next page"
                );
            }
        }
        DeadLetterCommand::Show { destination, id } => {
            let path = format!(
                "/v1/dead-letters/{}/{}",
                client::segment(&destination),
                client::segment(&id)
            );
            let record = pretty(&client.call(Method::GET, &path, None).await?);
            if json {
                return Ok(record);
            }
            let timeline = dead_letter_timeline(&client, &destination, &id).await;
            return Ok(record + &timeline);
        }
        DeadLetterCommand::Replay {
            destination,
            ids,
            all,
            yes,
            reason,
            since,
            until,
        } => {
            if all && !yes {
                return Err(CliError::Arguments(format!(
                    "replaying every dead letter of `{destination}` needs --yes"
                )));
            }
            let ask = if all {
                ReplayRequest {
                    destination: destination.clone(),
                    ids: None,
                    all: true,
                    reason,
                    since,
                    until,
                }
            } else {
                ReplayRequest {
                    destination: destination.clone(),
                    ids: Some(ids),
                    all: false,
                    reason: None,
                    since: None,
                    until: None,
                }
            };
            let body = serde_json::to_value(&ask)
                .map_err(|e| CliError::Runtime(format!("cannot write the request: {e}")))?;
            let answer: ReplayAnswer = client
                .call_as(Method::POST, "/v1/dead-letters/replay", Some(body))
                .await?;
            if json {
                return Ok(pretty(&json!(answer)));
            }
            let _ = writeln!(
                o,
                "replayed {} dead letters of {destination}",
                answer.replayed_count
            );
            if !answer.not_found.is_empty() {
                let _ = writeln!(o, "not found: {}", answer.not_found.join(", "));
            }
            if !answer.unreadable.is_empty() {
                let unreadable: Vec<String> = answer
                    .unreadable
                    .iter()
                    .map(|u| format!("{} at {} ({})", u.day, u.offset, u.error))
                    .collect();
                let _ = writeln!(
                    o,
                    "unreadable records, not replayed: {}",
                    unreadable.join(", ")
                );
            }
            if let Some(note) = &answer.note {
                let _ = writeln!(o, "{note}");
            }
        }
        DeadLetterCommand::Purge {
            destination,
            before,
            yes,
        } => {
            if !yes {
                return Err(CliError::Arguments(format!(
                    "purging the dead letters of `{destination}` removes them for good: add --yes"
                )));
            }
            let q = client::query(&[
                ("destination", Some(destination.clone())),
                ("before", before),
            ]);
            let answer: PurgeAnswer = client
                .call_as(Method::DELETE, &format!("/v1/dead-letters{q}"), None)
                .await?;
            if json {
                return Ok(pretty(&json!(answer)));
            }
            let _ = writeln!(
                o,
                "purged {} dead letters of {destination} ({} files)",
                answer.purged,
                answer.files.len()
            );
        }
    }
    Ok(o)
}

fn load(path: &Path, purpose: Purpose) -> Result<config::Loaded, ExitCode> {
    config::load(path, purpose, &ProcessEnv).map_err(|e| {
        eprintln!("{e}");
        ExitCode::from(1)
    })
}

fn check(path: &Path) -> ExitCode {
    let loaded = match load(path, Purpose::Check) {
        Ok(l) => l,
        Err(code) => return code,
    };
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
    emit(&loaded.effective);
    ExitCode::SUCCESS
}

fn run(path: &Path) -> ExitCode {
    let loaded = config::read(path).and_then(|text| {
        Ok((
            config::load_text(path, &text, Purpose::Run, &ProcessEnv)?,
            text,
        ))
    });
    let (loaded, text) = match loaded {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    let workers = match worker_threads(std::env::var("TOKIO_WORKER_THREADS")) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    limit_malloc_arenas();
    sqlite_temp_files_in(&loaded.settings.journal.dir);
    bound_sqlite_memory();
    purge_freed_pages_promptly();
    courier::lifecycle::give_back::set(give_back_freed_pages);
    let _log = match courier::logging::init(&loaded.settings.log) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("cannot start the log writer thread: {e}");
            return ExitCode::from(2);
        }
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        runtime.worker_threads(n);
    }
    let runtime = match runtime
        .enable_all()
        .on_thread_park(give_back_freed_pages)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let source = courier::ConfigSource {
        path: path.to_path_buf(),
        text,
    };
    match runtime.block_on(courier::run(loaded.settings, source)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(2)
        }
    }
}

/// The most worker threads `TOKIO_WORKER_THREADS` may ask for.
const MAX_WORKER_THREADS: usize = 256;

/// `TOKIO_WORKER_THREADS` (deploy/README.md): the runtime's worker
/// threads, else one per core of the CPU limit. Read here because tokio,
/// which reads it too, panics on a value that is no positive number.
fn worker_threads(var: Result<String, std::env::VarError>) -> Result<Option<usize>, String> {
    let text = match var {
        Err(std::env::VarError::NotPresent) => return Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => v.to_string_lossy().into_owned(),
        Ok(v) => v,
    };
    match text.trim().parse::<usize>() {
        Ok(n @ 1..=MAX_WORKER_THREADS) => Ok(Some(n)),
        _ => Err(format!(
            "TOKIO_WORKER_THREADS: {text:?} is not a number of worker threads (1..={MAX_WORKER_THREADS}); unset it for one per core of the CPU limit"
        )),
    }
}

/// Where SQLite puts the temporary files of a sort too large for its cache
/// (a history partition's index, built when it rolls or at the next
/// start): by default /var/tmp, /usr/tmp, /tmp or the working directory,
/// none of which is writable in a container with a read-only root
/// filesystem (as deploy/ runs courier), where such a start failed with
/// "disk I/O error". The journal's directory is writable by definition,
/// and SQLite unlinks each file as it opens it. `SQLITE_TMPDIR` or
/// `TMPDIR`, when set, is the operator's choice.
fn sqlite_temp_files_in(journal_dir: &Path) {
    if std::env::var_os("SQLITE_TMPDIR").is_none() && std::env::var_os("TMPDIR").is_none() {
        // SAFETY: called before any other thread starts, and before SQLite
        // initializes (it reads the variable once, at its initialization).
        unsafe {
            std::env::set_var("SQLITE_TMPDIR", journal_dir);
        }
    }
}

/// SQLite's memory, all its connections together: each keeps a page cache
/// (2 MiB by default; the journal has several connections, and history one
/// per partition), and together they grew to 18 MiB while a million-event
/// backlog was filled, the largest part of courier's RSS there
/// (benches/RESULTS.md). Past this soft limit SQLite reuses the pages it
/// caches rather than allocate more; nothing fails at it. 4 MiB rather
/// than 8: SQLite sat at the limit through a fill, and step d's peak went
/// 33.9 -> 30.3 MiB with no cost measured (benches/RESULTS.md).
const SQLITE_SOFT_HEAP_BYTES: i64 = 4 * 1024 * 1024;

fn bound_sqlite_memory() {
    // SAFETY: sets a process-wide number; SQLite allows it at any time.
    unsafe {
        rusqlite::ffi::sqlite3_soft_heap_limit64(SQLITE_SOFT_HEAP_BYTES);
    }
}

/// SQLite allocates with glibc's malloc (Rust code with mimalloc), and
/// glibc gives a thread that meets contention an arena of its own, up to
/// eight per core, whose freed memory is rarely returned to the system:
/// index reads spread over tokio's blocking threads would leave the pod's
/// RSS high. `MALLOC_ARENA_MAX`, when set, is the operator's choice.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
        // SAFETY: called before any other thread starts; mallopt only sets
        // a limit for arenas created from now on.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, cores as libc::c_int);
        }
    }
}

/// mimalloc's `purge_delay` (`mi_option_purge_delay`, 15 in its v2 and v3
/// headers alike).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// mimalloc (v3, as libmimalloc-sys builds it) gives pages that empty back
/// to the system only after they stayed empty 1 s, so that a page freed and
/// soon needed again costs nothing; in a burst over many threads (a mass
/// expiry's readers, sink writers and workers) the pages waiting out that
/// second made the peak. 10 ms (mimalloc v2's default) instead: a lower
/// peak for a mass expiry and a batched drain, rates unchanged; 0 ms,
/// purging at once, slowed a batched drain (benches/RESULTS.md).
/// `MIMALLOC_PURGE_DELAY`, when set, is the operator's choice.
fn purge_freed_pages_promptly() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: called before any other thread starts (mimalloc's option
        // setters are not thread safe); the option takes a number of ms.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 10) }
    }
}

/// The least time between two collections of one thread's heap.
const COLLECT_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// Run by each tokio worker as it parks, and by the library's own threads
/// when a wait of theirs ends with nothing to do (`give_back`): mimalloc
/// returns a thread's empty pages to the system only when that thread
/// calls into it, and a block freed by another thread (a task moved
/// between workers) is counted free only when its owner collects. A
/// worker that parks after a burst (5,000
/// connections closing, each freeing its buffers) may sleep for minutes,
/// and courier's RSS stayed near its peak long after the burst
/// (benches/RESULTS.md, step i). At most every `COLLECT_EVERY` per
/// thread, so that a loaded worker, which parks thousands of times a
/// second, pays for a collection a hundred times a second at most; what is
/// freed after a worker's last collection before a long sleep waits for
/// its next wake.
fn give_back_freed_pages() {
    use std::cell::Cell;
    use std::time::Instant;
    thread_local!(static LAST: Cell<Option<Instant>> = const { Cell::new(None) });
    LAST.with(|last| {
        let now = Instant::now();
        if last
            .get()
            .is_none_or(|t| now.duration_since(t) >= COLLECT_EVERY)
        {
            last.set(Some(now));
            // SAFETY: collects the calling thread's own heap; no pointer
            // is passed, and mimalloc allows it at any time.
            unsafe { libmimalloc_sys::mi_collect(false) }
        }
    });
}

fn schedule(path: &Path, name: &str, json: bool) -> ExitCode {
    let mut o = String::new();
    let loaded = match load(path, Purpose::Check) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let Some(dest) = loaded.settings.destination(name) else {
        let names: Vec<&str> = loaded
            .settings
            .destinations
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        eprintln!(
            "courier: no destination `{name}` in {}; configured: {}",
            path.display(),
            names.join(", ")
        );
        return ExitCode::from(1);
    };
    let plan = Plan::compute(&dest.schedule, &dest.limits);
    let floors: Vec<(Floor, Plan)> = dest
        .status
        .floors()
        .into_iter()
        .map(|f| {
            let plan = Plan::with_floor(&dest.schedule, &dest.limits, f.min_delay);
            (f, plan)
        })
        .collect();
    if json {
        let row = |a: &PlannedAttempt| serde_json::json!({ "attempt": a.attempt, "delay_s": seconds(a.delay), "at_s": seconds(a.at), "phase": a.phase.as_str() });
        let ends = |p: &Plan| serde_json::json!({ "after_attempt": p.ends_after, "at_s": seconds(p.ends_at), "reason": p.reason.as_str() });
        let minimums: Vec<serde_json::Value> = floors
            .iter()
            .map(|(f, p)| {
                serde_json::json!({
                    "answers": f.answers,
                    "min_delay_s": seconds(f.min_delay),
                    "attempts": p.attempts.iter().map(row).collect::<Vec<_>>(),
                    "ends": ends(p),
                })
            })
            .collect();
        let out = serde_json::json!({
            "attempts": plan.attempts.iter().map(row).collect::<Vec<_>>(),
            "ends": ends(&plan),
            "minimums": minimums,
        });
        let _ = writeln!(o, "{out:#}");
    } else {
        let f = |d: std::time::Duration| config::units::format_duration(d);
        // First, so that the plan's rows and its closing line stay as
        // they were: what scripts read.
        let _ = writeln!(
            o,
            "A retry waits at least the minimum of the answer before it (status.min_delay over the defaults;\na Retry-After only lengthens it). When every attempt fails with one of these answers:"
        );
        for (floor, p) in &floors {
            let _ = writeln!(
                o,
                "  after {}: at least {}: {}, last attempt {} at {} ({})",
                floor.answers,
                f(floor.min_delay),
                runs(p.attempts.iter().skip(1).map(|a| f(a.delay))),
                p.ends_after,
                f(p.ends_at),
                p.reason.as_str()
            );
        }
        let _ = writeln!(
            o,
            "Connection, DNS and TLS failures have none, and follow this plan:\n"
        );
        let _ = writeln!(o, "{:>7}  {:>8}  {:>10}  phase", "attempt", "delay", "at");
        for a in &plan.attempts {
            let _ = writeln!(
                o,
                "{:>7}  {:>8}  {:>10}  {}",
                a.attempt,
                f(a.delay),
                f(a.at),
                a.phase.as_str()
            );
        }
        let _ = writeln!(
            o,
            "ends after attempt {} at {}: {} (jitter of ±{}% applies to each delay at run time)",
            plan.ends_after,
            f(plan.ends_at),
            plan.reason.as_str(),
            dest.jitter * 100.0
        );
    }
    emit(&o);
    ExitCode::SUCCESS
}

/// `10s, 10s, 10s, 1m` as `10s ×3, 1m`.
fn runs(items: impl Iterator<Item = String>) -> String {
    let mut out: Vec<(String, usize)> = Vec::new();
    for item in items {
        match out.last_mut() {
            Some((last, n)) if *last == item => *n += 1,
            _ => out.push((item, 1)),
        }
    }
    if out.is_empty() {
        return "no retry".into();
    }
    out.iter()
        .map(|(item, n)| {
            if *n > 1 {
                format!("{item} ×{n}")
            } else {
                item.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn inspect(dir: &Path) -> ExitCode {
    // Run with `kubectl exec` in the same read-only container.
    sqlite_temp_files_in(dir);
    let mut o = String::new();
    let report = match courier::journal::inspect(dir) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("courier: {e}");
            return ExitCode::from(2);
        }
    };
    let _ = writeln!(
        o,
        "journal {} ({} bytes on disk)",
        report.path.display(),
        report.file_bytes
    );
    let rows = report
        .summary
        .iter()
        .map(|s| {
            let oldest = s.oldest_accepted_ms.map(courier::clock::rfc3339);
            vec![
                s.destination.clone(),
                s.pending.to_string(),
                s.bytes.to_string(),
                s.quarantined.to_string(),
                oldest.unwrap_or_default(),
            ]
        })
        .collect();
    o.push_str(&courier::admin::table::render(
        &["destination", "pending", "bytes", "quarantined", "oldest"],
        rows,
        &[1, 2, 3],
    ));
    if report.unindexed > 0 {
        let _ = writeln!(
            o,
            "{} of these events are in the intake log only; the next start adds them to {}",
            report.unindexed,
            report.path.display()
        );
    }
    let mut sound = true;
    if let Some(problem) = &report.integrity {
        let _ = writeln!(o, "integrity: FAILED: {problem}");
        sound = false;
    }
    for c in &report.corrupt {
        let _ = writeln!(o, "corrupt record: {c}");
        sound = false;
    }
    if sound {
        let _ = writeln!(o, "integrity: ok");
    }
    emit(&o);
    if sound {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

/// Writes command output; a closed pipe (`| head`) is not an error worth a panic.
fn emit(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// Whole seconds print as integers (`0`, not `0.0`).
fn seconds(d: std::time::Duration) -> serde_json::Value {
    if d.subsec_nanos() == 0 {
        d.as_secs().into()
    } else {
        d.as_secs_f64().into()
    }
}
