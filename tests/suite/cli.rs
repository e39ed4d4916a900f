//! The `courier` command line, run as the real binary: `check`, `schedule`,
//! `journal inspect`, `events` (and the timeline `dead-letters show` adds),
//! argument errors, and the start-up failures of `run` (damaged journal,
//! port in use, journal locked). Exit codes follow docs/cli.md: 0 ok, 1 bad
//! config or arguments, 2 runtime failure.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::courier::run_cli_in;
use support::{
    CliOutput, Courier, Received, Receiver, Reply, behavior, check, check_eq, courier_bin, fail,
    get, post, run_cli, wait_dead_letters,
};

/// Upper bound for a `courier run` that is expected to fail at start.
const FAIL_FAST: Duration = Duration::from_secs(10);

fn example_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config.example.yaml")
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

fn s(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

/// No panic message, backtrace or Rust debug dump in the output.
fn assert_no_panic(out: &CliOutput) {
    for bad in ["panicked", "RUST_BACKTRACE", "stack backtrace", "Os {"] {
        assert!(
            !out.stderr.contains(bad) && !out.stdout.contains(bad),
            "output contains {bad:?}:\n{}",
            out.show()
        );
    }
}

async fn check(path: &Path) -> CliOutput {
    run_cli(None, &["check", "-c", s(path)], &[]).await
}

/// `courier check` without `ORDERS_API_KEY` in the environment, whatever the
/// host has (the support helper cannot remove a variable).
fn check_without_env(path: &Path, remove: &str) -> CliOutput {
    let out = std::process::Command::new(courier_bin())
        .args(["check", "-c", s(path)])
        .env_remove(remove)
        .env_remove("RUST_LOG")
        .env_remove("COURIER_CONFIG")
        .output()
        .expect("run courier check");
    CliOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `courier run -c FILE` that must fail at start: bounded by [`FAIL_FAST`]
/// (the child is killed if it is still running then).
async fn run_must_fail(config: &Path) -> (CliOutput, Duration) {
    let started = Instant::now();
    let out = tokio::time::timeout(
        FAIL_FAST,
        run_cli_in(
            None,
            config.parent(),
            &["run", "-c", s(config)],
            &[("COURIER_LOG", "info")],
        ),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "`courier run -c {}` was still running after {FAIL_FAST:?}; it should have exited 2",
            config.display()
        )
    });
    (out, started.elapsed())
}

/// 1-based `line:col` in `text` of `needle`, which must occur exactly once.
/// A `|` in the needle marks the exact spot (`"concurrency: |0"` is the
/// position of the `0`).
fn pos_of(text: &str, needle: &str) -> (usize, usize) {
    let (before, after) = needle.split_once('|').unwrap_or(("", needle));
    let whole = format!("{before}{after}");
    assert_eq!(
        text.matches(&whole).count(),
        1,
        "needle {whole:?} must occur exactly once in:\n{text}"
    );
    for (i, line) in text.lines().enumerate() {
        if let Some(col) = line.find(&whole) {
            return (i + 1, col + before.len() + 1);
        }
    }
    panic!("needle {whole:?} spans lines in:\n{text}")
}

/// The rows of `courier schedule`'s plan: the lines that start with an
/// attempt number.
fn plan_rows(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.parse::<u32>().is_ok())
        })
        .collect()
}

fn yaml_with_dest(dest_lines: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\njournal: {{ dir: ./journal }}\ndestinations:\n  orders:\n    url: http://127.0.0.1:9/hooks\n{dest_lines}"
    )
}

// ---------------------------------------------------------------- check

#[tokio::test]
async fn check_example_config_prints_effective_config_and_warns_about_missing_secret() {
    let path = example_config();
    let out = check_without_env(&path, "ORDERS_API_KEY");
    assert_eq!(out.code, 0, "{}", out.show());
    assert!(out.stdout.contains("max_attempts: 30"), "{}", out.show());
    assert!(out.stdout.contains("destinations:"), "{}", out.show());
    assert!(out.stdout.contains("\n  orders:\n"), "{}", out.show());
    assert!(
        out.stdout.contains("url: http://127.0.0.1:9000/orders"),
        "{}",
        out.show()
    );
    // The effective config is YAML that parses.
    let parsed: serde_norway::Value =
        serde_norway::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}\n{}", out.show()));
    assert_eq!(
        parsed["destinations"]["orders"]["retry"]["max_attempts"].as_u64(),
        Some(30),
        "{}",
        out.show()
    );
    assert!(
        out.stderr.contains("warning") && out.stderr.contains("ORDERS_API_KEY"),
        "check must warn about the missing variable:\n{}",
        out.show()
    );
    assert!(
        out.stderr.contains("config.example.yaml:"),
        "the warning should say where: {}",
        out.show()
    );
    assert_no_panic(&out);

    // With the variable set: no warning, and its value is never printed.
    let out = run_cli(
        None,
        &["check", "-c", s(&path)],
        &[("ORDERS_API_KEY", "topsecret-4711")],
    )
    .await;
    assert_eq!(out.code, 0, "{}", out.show());
    assert!(!out.stderr.contains("ORDERS_API_KEY"), "{}", out.show());
    assert!(
        !out.stdout.contains("topsecret-4711") && !out.stderr.contains("topsecret-4711"),
        "{}",
        out.show()
    );
}

#[tokio::test]
async fn check_masks_secret_literal_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "c.yaml",
        &yaml_with_dest(
            "    headers:\n      X-Key: { value: hunter2, secret: true }\n      X-Tenant: { value: acme }\n",
        ),
    );
    let out = check(&path).await;
    assert_eq!(out.code, 0, "{}", out.show());
    assert!(out.stdout.contains("********"), "{}", out.show());
    assert!(
        !out.stdout.contains("hunter2") && !out.stderr.contains("hunter2"),
        "{}",
        out.show()
    );
    // A value that is not secret is shown as is.
    assert!(out.stdout.contains("acme"), "{}", out.show());
}

#[tokio::test]
async fn check_reads_config_from_courier_config_env() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "c.yaml", &yaml_with_dest(""));
    let out = run_cli(None, &["check"], &[("COURIER_CONFIG", s(&path))]).await;
    assert_eq!(out.code, 0, "{}", out.show());
    assert!(
        out.stdout.contains("url: http://127.0.0.1:9/hooks"),
        "{}",
        out.show()
    );
}

/// One bad config: the text, the text at which the error must be reported
/// (its line and column), and what the message must say.
struct Bad {
    name: &'static str,
    yaml: String,
    at: &'static str,
    says: Vec<&'static str>,
}

fn bad_configs() -> Vec<Bad> {
    let many_headers: Vec<String> = (1..=11)
        .map(|i| format!("X-H{i}: {{ value: v }}"))
        .collect();
    let big = "a".repeat(4097);
    vec![
        Bad {
            name: "unknown_key",
            yaml: yaml_with_dest("    timout: 5s\n"),
            at: "timout",
            says: vec!["destinations.orders", "unknown key `timout`", "timeout,"],
        },
        Bad {
            name: "max_attempts",
            yaml: yaml_with_dest("    retry:\n      max_attempts: 31\n"),
            at: "31",
            says: vec!["destinations.orders.retry.max_attempts", "31", "1..=30"],
        },
        Bad {
            name: "event_ttl",
            yaml: yaml_with_dest("    retry:\n      event_ttl: 30s\n"),
            at: "30s",
            says: vec!["destinations.orders.retry.event_ttl", "30s", "1m..=24h"],
        },
        Bad {
            name: "jitter",
            yaml: yaml_with_dest("    retry:\n      jitter: 0.9\n"),
            at: "0.9",
            says: vec!["destinations.orders.retry.jitter", "0.9", "0..=0.5"],
        },
        Bad {
            name: "bad_duration",
            yaml: yaml_with_dest("    timeout: soon\n"),
            at: "soon",
            says: vec!["destinations.orders.timeout", "`soon`", "unit"],
        },
        Bad {
            name: "url_scheme",
            yaml: "listen: 127.0.0.1:0\ndestinations:\n  orders:\n    url: ftp://127.0.0.1:9/hooks\n"
                .into(),
            at: "ftp://",
            says: vec!["destinations.orders.url", "`ftp`", "http, https"],
        },
        Bad {
            name: "concurrency",
            yaml: yaml_with_dest("    concurrency: 0\n"),
            at: "concurrency: |0",
            says: vec!["destinations.orders.concurrency", "1..=1024"],
        },
        Bad {
            name: "no_retry_code",
            yaml: yaml_with_dest("    status:\n      no_retry: [700]\n"),
            at: "700",
            says: vec!["destinations.orders.status.no_retry[0]", "`700`", "200..=599"],
        },
        Bad {
            name: "min_delay_code",
            yaml: yaml_with_dest("    status:\n      min_delay:\n        \"6xx\": 15s\n"),
            at: "15s",
            says: vec!["destinations.orders.status.min_delay.6xx", "`6xx`", "200..=599"],
        },
        Bad {
            name: "too_many_headers",
            yaml: yaml_with_dest(&format!("    headers: {{ {} }}\n", many_headers.join(", "))),
            at: "{ X-H1:",
            says: vec!["destinations.orders.headers", "11", "at most 10"],
        },
        Bad {
            name: "header_too_long",
            yaml: yaml_with_dest(&format!("    headers:\n      X-Big: {{ value: {big} }}\n")),
            at: "{ value: aaa",
            says: vec!["destinations.orders.headers.X-Big", "4097 bytes", "4096"],
        },
        Bad {
            name: "listen",
            yaml: "listen: nonsense\ndestinations:\n  orders:\n    url: http://127.0.0.1:9/hooks\n"
                .into(),
            at: "nonsense",
            says: vec!["listen", "`nonsense`", "ip:port"],
        },
        Bad {
            name: "journal_max_bytes",
            yaml: "journal:\n  dir: ./journal\n  max_bytes: 10\ndestinations:\n  orders:\n    url: http://127.0.0.1:9/hooks\n"
                .into(),
            at: "max_bytes: |10",
            says: vec!["journal.max_bytes", "10", "allowed 1024..="],
        },
        Bad {
            name: "batch_max_events",
            yaml: yaml_with_dest("    batch: { max_events: 5001 }\n"),
            at: "max_events: |5001",
            says: vec!["destinations.orders.batch.max_events", "5001", "allowed 1..=5000"],
        },
        Bad {
            name: "schema_unknown",
            yaml: yaml_with_dest("    schema: event-grid\n"),
            at: "event-grid",
            says: vec!["destinations.orders.schema", "event-grid", "eventgrid"],
        },
        Bad {
            name: "topic_subscriber_schema",
            yaml: format!(
                "topics:\n  shop:\n    schema: eventgrid\n    subscribers:\n      orders: {{}}\n{}",
                yaml_with_dest("")
            ),
            at: "{}",
            says: vec![
                "topics.shop.subscribers.orders",
                "has schema custom",
                "must be eventgrid",
            ],
        },
        Bad {
            name: "yaml_syntax",
            yaml: "listen: 127.0.0.1:0\ndestinations:\n  orders:\n    url: http://127.0.0.1:9/hooks\n   oops: indentation\n"
                .into(),
            at: "oops",
            says: vec!["did not find expected key"],
        },
    ]
}

#[tokio::test]
async fn check_reports_each_bad_config_with_position_key_path_and_allowed_range() {
    let dir = tempfile::tempdir().unwrap();
    let cases = bad_configs();
    assert!(cases.len() >= 8);
    let runs = cases.iter().map(|case| {
        let path = write(dir.path(), &format!("{}.yaml", case.name), &case.yaml);
        async move { (path.clone(), check(&path).await) }
    });
    let outs = futures_join_all(runs).await;
    let mut failures = Vec::new();
    for (case, (path, out)) in cases.iter().zip(outs) {
        let (line, col) = pos_of(&case.yaml, case.at);
        let at = format!("{}:{line}:{col}: ", path.display());
        let mut problems = Vec::new();
        if out.code != 1 {
            problems.push(format!("exit code {} (want 1)", out.code));
        }
        if !out.stderr.contains(&at) {
            problems.push(format!("stderr lacks the position {at:?}"));
        }
        for want in &case.says {
            if !out.stderr.contains(want) {
                problems.push(format!("stderr lacks {want:?}"));
            }
        }
        if !out.stdout.trim().is_empty() {
            problems.push("a rejected config printed an effective config".into());
        }
        if out.stderr.contains("panicked") {
            problems.push("panic".into());
        }
        if !problems.is_empty() {
            failures.push(format!(
                "case {}: {}\n{}",
                case.name,
                problems.join("; "),
                out.show()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `join_all` without the futures crate: run the CLI calls concurrently.
async fn futures_join_all<F, T>(futs: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

/// Bad input of every kind in one file: a duplicate destination, typos in
/// two destinations, a wrong type and a range, all in one run, in line order,
/// worded without Rust types.
#[tokio::test]
async fn check_reports_duplicates_typos_types_and_ranges_together_in_line_order() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = yaml_with_dest(
        "    timout: 5s\n    concurrency: many\n  billing:\n    url: http://127.0.0.1:9/b\n    retyr: {}\n    batch: { max_events: 5001 }\n  orders:\n    url: http://127.0.0.1:9/again\n",
    );
    let path = write(dir.path(), "bad_input.yaml", &yaml);
    let out = check(&path).await;
    assert_eq!(out.code, 1, "{}", out.show());
    let file = path.display().to_string();
    let at = |needle: &str| {
        let (line, col) = pos_of(&yaml, needle);
        format!("{file}:{line}:{col}: ")
    };
    // `orders:` is written twice: first on line 5, again above the `again` url.
    let (again, _) = pos_of(&yaml, "/again");
    let want = [
        format!(
            "{}destinations.orders: unknown key `timout`; expected one of url, mode,",
            at("timout")
        ),
        format!(
            "{}destinations.orders.concurrency: expected a whole number or `{{ adaptive: {{ min, max, initial }} }}`, found \"many\"",
            at("many")
        ),
        format!(
            "{}destinations.billing: unknown key `retyr`; expected one of url, mode,",
            at("retyr")
        ),
        format!(
            "{}destinations.billing.batch.max_events: 5001 is out of range",
            at("5001")
        ),
        format!(
            "{file}:{}:3: destinations.orders: duplicate key; first given at 5:3",
            again - 1
        ),
    ];
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(lines.len(), want.len(), "{}", out.show());
    for (line, want) in lines.iter().zip(&want) {
        assert!(
            line.starts_with(want.as_str()),
            "want {want:?}:\n{}",
            out.show()
        );
        for word in [
            "u32", "u64", "usize", "struct", "enum", "Option", "Vec", "sequence",
        ] {
            assert!(!line.contains(word), "{word}:\n{}", out.show());
        }
    }
}

#[tokio::test]
async fn check_reports_every_error_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = yaml_with_dest(
        "    concurrency: 0\n    retry:\n      max_attempts: 31\n      jitter: 0.9\n",
    );
    let path = write(dir.path(), "three.yaml", &yaml);
    let out = check(&path).await;
    assert_eq!(out.code, 1, "{}", out.show());
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(lines.len(), 3, "want one line per error:\n{}", out.show());
    let file = path.display().to_string();
    for (needle, key, range) in [
        (
            "concurrency: |0",
            "destinations.orders.concurrency",
            "1..=1024",
        ),
        ("31", "destinations.orders.retry.max_attempts", "1..=30"),
        ("0.9", "destinations.orders.retry.jitter", "0..=0.5"),
    ] {
        let (line, col) = pos_of(&yaml, needle);
        let prefix = format!("{file}:{line}:{col}: {key}: ");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&prefix) && l.contains(range)),
            "no line starting with {prefix:?} and naming {range}:\n{}",
            out.show()
        );
    }
}

#[tokio::test]
async fn missing_config_file_is_one_clear_sentence_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("does-not-exist.yaml");
    for cmd in ["check", "run"] {
        let out = run_cli(None, &[cmd, "-c", s(&path)], &[]).await;
        assert_eq!(out.code, 1, "courier {cmd}: {}", out.show());
        assert!(
            out.stderr.contains(s(&path)) && out.stderr.contains("cannot read the config file"),
            "courier {cmd}: {}",
            out.show()
        );
        assert_eq!(
            out.stderr.trim().lines().count(),
            1,
            "courier {cmd}: {}",
            out.show()
        );
        assert_no_panic(&out);
    }
}

/// `TOKIO_WORKER_THREADS` sets the runtime's workers (deploy/README.md);
/// one that is no number in range is a clear error and exit 1 (tokio,
/// reading it itself, panicked). Three, which no machine of ours has as
/// its cores (the default), are the start line's workers.
#[tokio::test]
async fn worker_threads_from_the_env_are_checked_and_used() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::ok().await;
    let yaml = run_config(&rx.url(), "");
    let path = write(dir.path(), "c.yaml", &yaml);
    for bad in ["abc", "0", "-1", "100000", ""] {
        let out = run_cli(
            None,
            &["run", "-c", s(&path)],
            &[("TOKIO_WORKER_THREADS", bad)],
        )
        .await;
        assert_eq!(out.code, 1, "TOKIO_WORKER_THREADS={bad:?}: {}", out.show());
        assert!(
            out.stderr.contains("TOKIO_WORKER_THREADS") && out.stderr.contains("1..=256"),
            "{}",
            out.show()
        );
        assert_no_panic(&out);
    }
    let c = Courier::start_with_env(
        courier_bin(),
        dir.path(),
        &yaml,
        &[("TOKIO_WORKER_THREADS", "3")],
    )
    .await;
    let resp = post(&c.url("orders"), "{\"a\":1}", &[]).await;
    assert_eq!(resp.status, 202, "{}\nlogs:\n{}", resp.text(), c.logs());
    rx.wait_for(1, Duration::from_secs(5)).await;
    let listening = c.logs();
    let listening = listening
        .lines()
        .find(|l| l.contains("courier listening"))
        .unwrap_or_else(|| panic!("no start line; logs:\n{}", c.logs()));
    assert!(listening.contains("workers=3"), "{listening}");
}

#[tokio::test]
async fn bad_arguments_exit_1_not_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "c.yaml", &yaml_with_dest(""));
    let cases: Vec<Vec<&str>> = vec![
        vec!["frobnicate"],
        vec![],
        vec!["check", "--bogus"],
        vec!["schedule", "-c", s(&path)],
        vec!["journal", "inspect"],
        vec!["journal", "compact", "--dir", "x"],
        vec!["schedule", "-c", s(&path), "orders", "--json=maybe"],
    ];
    for args in cases {
        let out = run_cli(None, &args, &[]).await;
        assert_eq!(out.code, 1, "courier {args:?}: {}", out.show());
        assert!(
            !out.stderr.trim().is_empty(),
            "courier {args:?}: {}",
            out.show()
        );
        assert_no_panic(&out);
    }
    let out = run_cli(None, &["--help"], &[]).await;
    assert_eq!(out.code, 0, "{}", out.show());
    assert!(out.stdout.contains("check") && out.stdout.contains("schedule"));
}

// ------------------------------------------------------------- schedule

/// JSON numbers compared by value (`0` equals `0.0`).
fn num(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

/// `schedule: [2s]` and a 500: the retry comes after 10 s, the default
/// minimum of a 5xx; `schedule` says so beside the 2 s plan, in text and
/// JSON, and `check` prints the defaults. Red when the minimums are left
/// out of either.
#[tokio::test]
async fn schedule_and_check_show_the_minimum_delays_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = yaml_with_dest(
        "    retry: { schedule: [2s], max_attempts: 4, jitter: 0 }\n    status: { min_delay: { 502: 1m } }\n",
    );
    let path = write(dir.path(), "c.yaml", &yaml);
    let out = run_cli(None, &["schedule", "-c", s(&path), "orders"], &[]).await;
    assert_eq!(out.code, 0, "{}", out.show());
    let line = |start: &str| {
        out.stdout
            .lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line("after other statuses:").contains("at least 10s: 10s ×3, last attempt 4 at 30s"),
        "{}",
        out.show()
    );
    assert!(
        line("after 503:").contains("at least 30s: 30s ×3"),
        "{}",
        out.show()
    );
    assert!(
        line("after 502:").contains("at least 1m: 1m ×3"),
        "{}",
        out.show()
    );
    assert!(
        line("after timeout:").contains("at least 10s"),
        "{}",
        out.show()
    );
    let rows = plan_rows(&out.stdout);
    assert_eq!(rows.len(), 4, "{}", out.show());
    assert!(rows[1].contains("2s"), "{}", out.show());
    let last = out.stdout.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("ends after attempt 4 at 6s: max_attempts"),
        "{last}"
    );

    let out = run_cli(None, &["schedule", "-c", s(&path), "orders", "--json"], &[]).await;
    assert_eq!(out.code, 0, "{}", out.show());
    let plan = out.json();
    let other = plan["minimums"]
        .as_array()
        .and_then(|m| m.iter().find(|r| r["answers"] == "other statuses"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(other["min_delay_s"], 10.0, "{plan}");
    assert_eq!(other["attempts"][1]["delay_s"], 10.0, "{plan}");
    assert_eq!(plan["attempts"][1]["delay_s"], 2.0, "{plan}");

    let out = run_cli(None, &["check", "-c", s(&path)], &[]).await;
    assert_eq!(out.code, 0, "{}", out.show());
    for want in ["408: 2m", "503: 30s", "502: 1m"] {
        assert!(out.stdout.contains(want), "{want} missing:\n{}", out.show());
    }
    assert!(
        out.stdout
            .contains("429 without Retry-After 10s, 503 30s, other statuses 10s, timeout 10s"),
        "{}",
        out.show()
    );
}

#[tokio::test]
async fn schedule_default_eventgrid_ends_at_the_24h_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "c.yaml", &yaml_with_dest(""));

    let out = run_cli(None, &["schedule", "-c", s(&path), "orders"], &[]).await;
    assert_eq!(out.code, 0, "{}", out.show());
    let rows = plan_rows(&out.stdout);
    assert_eq!(rows.len(), 11, "{}", out.show());
    assert!(
        rows.iter().all(|r| r.contains("eventgrid")),
        "{}",
        out.show()
    );
    let last = out.stdout.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.contains("ends after attempt 11")
            && last.contains("24h")
            && last.contains("event_ttl"),
        "last line: {last:?}\n{}",
        out.show()
    );

    let out = run_cli(None, &["schedule", "-c", s(&path), "orders", "--json"], &[]).await;
    assert_eq!(out.code, 0, "{}", out.show());
    let plan = out.json();
    let first = &plan["attempts"][0];
    assert_eq!(first["attempt"], 1, "{plan:#}");
    assert_eq!(num(&first["delay_s"]), 0.0, "{plan:#}");
    assert_eq!(num(&first["at_s"]), 0.0, "{plan:#}");
    assert_eq!(first["phase"], "eventgrid", "{plan:#}");
    assert_eq!(
        first.as_object().map(|o| o.len()),
        Some(4),
        "attempt rows have exactly attempt, delay_s, at_s, phase: {plan:#}"
    );
    let at: Vec<f64> = plan["attempts"]
        .as_array()
        .expect("attempts is an array")
        .iter()
        .map(|a| num(&a["at_s"]))
        .collect();
    assert_eq!(
        at,
        [
            0.0, 10.0, 40.0, 100.0, 400.0, 1000.0, 2800.0, 6400.0, 17200.0, 38800.0, 82000.0
        ],
        "{plan:#}"
    );
    assert_eq!(plan["ends"]["after_attempt"], 11, "{plan:#}");
    assert_eq!(plan["ends"]["reason"], "event_ttl", "{plan:#}");
    assert_eq!(num(&plan["ends"]["at_s"]), 86400.0, "{plan:#}");
}

#[tokio::test]
async fn schedule_eventgrid_documentation_example_max_10_ttl_30m() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "c.yaml",
        &yaml_with_dest("    retry: { max_attempts: 10, event_ttl: 30m }\n"),
    );
    let out = run_cli(None, &["schedule", "-c", s(&path), "orders", "--json"], &[]).await;
    assert_eq!(out.code, 0, "{}", out.show());
    let plan = out.json();
    let at: Vec<f64> = plan["attempts"]
        .as_array()
        .expect("attempts is an array")
        .iter()
        .map(|a| num(&a["at_s"]))
        .collect();
    assert_eq!(at, [0.0, 10.0, 40.0, 100.0, 400.0, 1000.0], "{plan:#}");
    assert_eq!(plan["ends"]["after_attempt"], 6, "{plan:#}");
    assert_eq!(num(&plan["ends"]["at_s"]), 1800.0, "{plan:#}");
    assert_eq!(plan["ends"]["reason"], "event_ttl", "{plan:#}");
}

#[tokio::test]
async fn schedule_list_ends_at_max_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "c.yaml",
        &yaml_with_dest("    retry: { schedule: [5s, 1m], max_attempts: 4 }\n"),
    );
    let out = run_cli(None, &["schedule", "-c", s(&path), "orders", "--json"], &[]).await;
    assert_eq!(out.code, 0, "{}", out.show());
    let plan = out.json();
    let attempts = plan["attempts"].as_array().expect("attempts is an array");
    assert_eq!(attempts.len(), 4, "{plan:#}");
    let rows: Vec<(u64, f64, f64, &str)> = attempts
        .iter()
        .map(|a| {
            (
                a["attempt"].as_u64().expect("attempt"),
                num(&a["delay_s"]),
                num(&a["at_s"]),
                a["phase"].as_str().expect("phase"),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (1, 0.0, 0.0, "list"),
            (2, 5.0, 5.0, "list"),
            (3, 60.0, 65.0, "list"),
            (4, 60.0, 125.0, "list")
        ],
        "{plan:#}"
    );
    assert_eq!(plan["ends"]["after_attempt"], 4, "{plan:#}");
    assert_eq!(plan["ends"]["reason"], "max_attempts", "{plan:#}");
    assert_eq!(num(&plan["ends"]["at_s"]), 125.0, "{plan:#}");

    let out = run_cli(None, &["schedule", "-c", s(&path), "orders"], &[]).await;
    assert_eq!(out.code, 0, "{}", out.show());
    let last = out.stdout.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.contains("ends after attempt 4") && last.contains("max_attempts"),
        "{}",
        out.show()
    );
}

#[tokio::test]
async fn schedule_unknown_destination_exits_1_naming_the_configured_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "c.yaml", &yaml_with_dest(""));
    let out = run_cli(None, &["schedule", "-c", s(&path), "nope"], &[]).await;
    assert_eq!(out.code, 1, "{}", out.show());
    assert!(
        out.stderr.contains("nope") && out.stderr.contains("orders"),
        "{}",
        out.show()
    );
    assert!(out.stdout.trim().is_empty(), "{}", out.show());
    assert_no_panic(&out);

    // A bad config is exit 1 for `schedule` too.
    let bad = write(
        dir.path(),
        "bad.yaml",
        &yaml_with_dest("    concurrency: 0\n"),
    );
    let out = run_cli(None, &["schedule", "-c", s(&bad), "orders"], &[]).await;
    assert_eq!(out.code, 1, "{}", out.show());
    assert!(out.stderr.contains("1..=1024"), "{}", out.show());
}

// ------------------------------------------------------ journal and run

fn run_config(url: &str, extra_dest: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nlog: {{ level: info }}\nshutdown_grace: 2s\njournal: {{ dir: ./journal }}\ndestinations:\n  orders:\n    url: {url}/hooks\n{extra_dest}"
    )
}

/// Starts a courier whose endpoint always answers 500 and retries only in an
/// hour, posts `n` events, waits for their first attempts, and stops it with
/// SIGTERM (exit 0). Returns the stopped courier (for its logs and dir).
async fn stopped_courier_with_pending(dir: &Path, n: usize) -> Courier {
    let rx = Receiver::sequence(vec![Reply::status(500)]).await;
    let mut c = Courier::start(
        dir,
        &run_config(&rx.url(), "    retry: { schedule: [1h] }\n"),
    )
    .await;
    for i in 0..n {
        let resp = post(&c.url("orders"), format!("{{\"n\":{i}}}"), &[]).await;
        assert_eq!(resp.status, 202, "{}\nlogs:\n{}", resp.text(), c.logs());
    }
    if rx.try_wait_for(n, Duration::from_secs(5)).await.is_none() {
        panic!(
            "receiver got {} of {n} first attempts; logs:\n{}",
            rx.count(),
            c.logs()
        );
    }
    c.terminate();
    let status = c.wait_exit(Duration::from_secs(5)).await;
    assert_eq!(status.code(), Some(0), "logs:\n{}", c.logs());
    c
}

/// Copies the WAL into `journal.db` and removes `-wal`/`-shm`, as SQLite does
/// on a last clean close, so that damage to the main file hits the events.
fn checkpoint(jdir: &Path) {
    let db = jdir.join("journal.db");
    let conn = rusqlite::Connection::open(&db).expect("open journal.db");
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .expect("checkpoint");
    drop(conn);
    for side in ["journal.db-wal", "journal.db-shm"] {
        let _ = std::fs::remove_file(jdir.join(side));
    }
}

fn journal_dir(dir: &Path) -> PathBuf {
    dir.join("journal")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_inspect_lists_pending_events_of_a_stopped_courier() {
    let dir = tempfile::tempdir().unwrap();
    let c = stopped_courier_with_pending(dir.path(), 3).await;
    let jdir = journal_dir(dir.path());
    let out = run_cli(None, &["journal", "inspect", "--dir", s(&jdir)], &[]).await;
    assert_eq!(out.code, 0, "{}\ncourier logs:\n{}", out.show(), c.logs());
    let row = out
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some("orders"))
        .unwrap_or_else(|| panic!("no row for orders:\n{}", out.show()));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cols.get(1),
        Some(&"3"),
        "pending column: {row:?}\n{}",
        out.show()
    );
    assert_eq!(
        cols.get(3),
        Some(&"0"),
        "quarantined column: {row:?}\n{}",
        out.show()
    );
    assert!(out.stdout.contains("integrity: ok"), "{}", out.show());
    assert!(out.stdout.contains("journal.db"), "{}", out.show());
}

#[tokio::test]
async fn journal_inspect_without_a_journal_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_cli(None, &["journal", "inspect", "--dir", s(dir.path())], &[]).await;
    assert_eq!(out.code, 2, "{}", out.show());
    assert!(
        out.stderr
            .contains(&dir.path().join("journal.db").display().to_string()),
        "the message should name the file it looked for:\n{}",
        out.show()
    );
    assert_no_panic(&out);
    // It must not create a journal while looking.
    assert!(!dir.path().join("journal.db").exists());

    let missing = dir.path().join("no-such-dir");
    let out = run_cli(None, &["journal", "inspect", "--dir", s(&missing)], &[]).await;
    assert_eq!(out.code, 2, "{}", out.show());
    assert_no_panic(&out);
    assert!(!missing.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_journal_header_stops_run_with_exit_2_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let c = stopped_courier_with_pending(dir.path(), 3).await;
    let jdir = journal_dir(dir.path());
    let db = jdir.join("journal.db");
    // The journal is sound; move the events into the main file and
    // overwrite SQLite's 100-byte header with junk.
    let out = run_cli(None, &["journal", "inspect", "--dir", s(&jdir)], &[]).await;
    assert_eq!(out.code, 0, "{}", out.show());
    checkpoint(&jdir);
    let mut bytes = std::fs::read(&db).expect("read journal.db");
    assert!(bytes.len() > 100);
    bytes[..100].copy_from_slice(&[0xA5; 100]);
    std::fs::write(&db, &bytes).expect("write journal.db");

    let (out, took) = run_must_fail(c.config_path()).await;
    assert_eq!(out.code, 2, "{}", out.show());
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(out.stderr.contains("journal.db"), "{}", out.show());
    assert!(
        out.stderr.contains("move it aside") || out.stderr.contains("restore"),
        "the message should say what to do:\n{}",
        out.show()
    );
    assert_no_panic(&out);
    // Nothing was discarded: the damaged file is still there, same size.
    assert_eq!(
        std::fs::metadata(&db).map(|m| m.len()).ok(),
        Some(bytes.len() as u64)
    );

    // `journal inspect` reports it as well, without a panic.
    let out = run_cli(None, &["journal", "inspect", "--dir", s(&jdir)], &[]).await;
    assert_eq!(out.code, 2, "{}", out.show());
    assert!(out.stderr.contains("journal.db"), "{}", out.show());
    assert_no_panic(&out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_journal_pages_fail_the_integrity_check_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let c = stopped_courier_with_pending(dir.path(), 3).await;
    let jdir = journal_dir(dir.path());
    let db = jdir.join("journal.db");
    let out = run_cli(None, &["journal", "inspect", "--dir", s(&jdir)], &[]).await;
    assert_eq!(out.code, 0, "{}", out.show());
    checkpoint(&jdir);
    // Junk over the start of every page after the first (b-tree page headers).
    let mut bytes = std::fs::read(&db).expect("read journal.db");
    let page = u16::from_be_bytes([bytes[16], bytes[17]]) as usize;
    let page = if page == 1 { 65536 } else { page };
    assert!(
        bytes.len() >= 2 * page,
        "{} bytes, page {page}",
        bytes.len()
    );
    let mut off = page;
    while off + 64 <= bytes.len() {
        bytes[off..off + 64].copy_from_slice(&[0x5A; 64]);
        off += page;
    }
    std::fs::write(&db, &bytes).expect("write journal.db");

    let (out, took) = run_must_fail(c.config_path()).await;
    assert_eq!(out.code, 2, "{}", out.show());
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(out.stderr.contains("journal.db"), "{}", out.show());
    assert!(
        out.stderr.contains("move it aside") || out.stderr.contains("restore"),
        "{}",
        out.show()
    );
    assert_no_panic(&out);
}

#[tokio::test]
async fn port_in_use_exits_2_naming_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    for key in ["listen", "admin_listen"] {
        let other = if key == "listen" {
            "admin_listen"
        } else {
            "listen"
        };
        let yaml = format!(
            "{key}: {addr}\n{other}: 127.0.0.1:0\njournal: {{ dir: ./journal-{key} }}\ndestinations:\n  orders:\n    url: http://127.0.0.1:9/hooks\n"
        );
        let path = write(dir.path(), &format!("{key}.yaml"), &yaml);
        let (out, took) = run_must_fail(&path).await;
        assert_eq!(out.code, 2, "{key}: {}", out.show());
        assert!(took < Duration::from_secs(5), "took {took:?}");
        assert!(
            out.stderr.contains(&addr.to_string()),
            "{key}: the message should name {addr}:\n{}",
            out.show()
        );
        assert!(out.stderr.contains(key), "{key}: {}", out.show());
        assert_no_panic(&out);
    }
    drop(taken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_courier_on_the_same_journal_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::ok().await;
    let mut first = Courier::start(dir.path(), &run_config(&rx.url(), "")).await;

    // Same journal dir (absolute, so the second config can live elsewhere).
    let other = tempfile::tempdir().unwrap();
    let jdir = journal_dir(dir.path());
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\njournal: {{ dir: {} }}\ndestinations:\n  orders:\n    url: {}/hooks\n",
        jdir.display(),
        rx.url()
    );
    let path = write(other.path(), "second.yaml", &yaml);
    let (out, took) = run_must_fail(&path).await;
    assert_eq!(
        out.code,
        2,
        "{}\nfirst courier:\n{}",
        out.show(),
        first.logs()
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        out.stderr.contains("in use"),
        "the message should say the journal is in use:\n{}",
        out.show()
    );
    assert!(out.stderr.contains("journal.db"), "{}", out.show());
    assert_no_panic(&out);

    // The first courier is unaffected.
    assert!(first.is_running(), "logs:\n{}", first.logs());
    let resp = post(&first.url("orders"), "{}", &[]).await;
    assert_eq!(resp.status, 202, "logs:\n{}", first.logs());
    rx.wait_for(1, Duration::from_secs(5)).await;
    first.terminate();
    let status = first.wait_exit(Duration::from_secs(5)).await;
    assert_eq!(status.code(), Some(0), "logs:\n{}", first.logs());

    // Once it is gone the journal is free again.
    let mut second = Courier::start(other.path(), &yaml).await;
    second.terminate();
    assert_eq!(
        second.wait_exit(Duration::from_secs(5)).await.code(),
        Some(0),
        "logs:\n{}",
        second.logs()
    );
}

/// Bound of the waits for an outcome in event history.
const PROMPT: Duration = Duration::from_secs(10);

/// The dead-lettered event of the `events` test: `:` and `/` must be
/// percent-encoded in the path by the CLI and decoded by the API.
const BAD_ID: &str = "evt:bad/1";

/// `courier GROUP --admin <c's admin URL> ARGS`.
async fn admin_cli(c: &Courier, group: &str, args: &[&str]) -> CliOutput {
    let admin = c.admin_url();
    let mut all = vec![group, "--admin", &admin];
    all.extend_from_slice(args);
    run_cli(None, &all, &[]).await
}

/// Polls `GET /v1/events/{id}` until its one delivery is in `state`.
async fn wait_event(c: &Courier, id: &str, state: &str) -> Value {
    let url = format!("{}/v1/events/{}", c.admin_url(), path_segment(id));
    let mut last = String::new();
    for _ in 0..(PROMPT.as_millis() / 50) {
        let resp = get(&url).await;
        if resp.status == 200 && resp.json()["deliveries"][0]["state"] == state {
            return resp.json();
        }
        last = format!("{} {}", resp.status, resp.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fail!(c, "event {id} never {state}; last answer {last}")
}

/// An id as a path segment (what the CLI sends, written out here).
fn path_segment(id: &str) -> String {
    id.replace(':', "%3A").replace('/', "%2F")
}

fn ids_of(page: &Value) -> Vec<&str> {
    page["events"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["id"].as_str()).collect())
        .unwrap_or_default()
}

/// "Where is my webhook?" from the command line: one event answered 500
/// then 200, one answered 400, as `courier events show|list` and
/// `courier dead-letters show` print them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_show_and_list_tell_where_each_webhook_is() {
    let rx = Receiver::start(behavior(|r: &Received, _| {
        let id = r.header("webhook-id").unwrap_or("");
        let attempt = r.header("courier-delivery-attempt").unwrap_or("");
        Reply::status(match (id, attempt) {
            ("evt-retry", "1") => 500,
            (BAD_ID, _) => 400,
            _ => 200,
        })
    }))
    .await;
    let yaml = support::config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "retry: { schedule: [100ms, 1h], jitter: 0 }\nstatus: { min_delay: { 5xx: 100ms } }",
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &yaml).await;
    for id in ["evt-retry", BAD_ID] {
        let resp = post(&c.url("orders"), "{}", &[("Idempotency-Key", id)]).await;
        check!(
            c,
            resp.status / 100 == 2,
            "POST {id}: {} {}",
            resp.status,
            resp.text()
        );
    }
    wait_event(&c, "evt-retry", "delivered").await;
    wait_event(&c, BAD_ID, "dead_lettered").await;
    wait_dead_letters(&c, "orders", 1, PROMPT).await;

    // The timeline: accepted, both attempts with their answers, delivered.
    let out = admin_cli(&c, "events", &["show", "evt-retry"]).await;
    check!(c, out.success(), "{}", out.show());
    let lines: Vec<&str> = out.stdout.lines().collect();
    check_eq!(c, lines.len(), 5, "{}", out.show());
    check_eq!(c, lines[0], "orders  delivered", "{}", out.show());
    check!(c, lines[1].ends_with("Z  accepted"), "{}", out.show());
    check!(
        c,
        lines[2].contains("Z  attempt 1  500 Failed  "),
        "{}",
        out.show()
    );
    check!(
        c,
        lines[3].contains("Z  attempt 2  200 Delivered  "),
        "{}",
        out.show()
    );
    check!(c, lines[4].ends_with("Z  delivered"), "{}", out.show());

    let out = admin_cli(&c, "events", &["show", "evt-retry", "--json"]).await;
    check!(c, out.success(), "{}", out.show());
    let shown = out.json();
    check_eq!(c, shown["id"], "evt-retry");
    let attempts = shown["deliveries"][0]["attempts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    check_eq!(c, attempts.len(), 2, "{shown}");
    check_eq!(c, attempts[0]["status"], 500, "{shown}");
    check_eq!(c, attempts[1]["status"], 200, "{shown}");

    // An id that needs escaping, asked for one destination.
    let out = admin_cli(&c, "events", &["show", BAD_ID, "--destination", "orders"]).await;
    check!(c, out.success(), "{}", out.show());
    check!(
        c,
        out.stdout.contains("attempt 1  400 BadRequest"),
        "{}",
        out.show()
    );
    check!(
        c,
        out.stdout.contains("dead-lettered: NonRetriableStatus"),
        "{}",
        out.show()
    );

    let out = admin_cli(
        &c,
        "events",
        &["list", "--state", "dead_lettered", "--json"],
    )
    .await;
    check!(c, out.success(), "{}", out.show());
    let page = out.json();
    check_eq!(c, ids_of(&page), [BAD_ID], "{page}");
    check_eq!(c, page["next"], Value::Null, "{page}");

    let out = admin_cli(&c, "events", &["list"]).await;
    check!(c, out.success(), "{}", out.show());
    let lines: Vec<&str> = out.stdout.lines().collect();
    check_eq!(c, lines.len(), 3, "a head and two rows: {}", out.show());
    check!(c, lines[0].starts_with("ID "), "{}", out.show());
    check!(
        c,
        lines[1].starts_with(BAD_ID) && lines[1].contains("  dead_lettered  "),
        "newest first: {}",
        out.show()
    );
    check!(c, lines[1].contains("BadRequest (400)"), "{}", out.show());
    check!(
        c,
        lines[2].starts_with("evt-retry ") && lines[2].contains("Delivered (200)"),
        "{}",
        out.show()
    );

    // A page of one says where the next begins; that cursor gives it.
    let out = admin_cli(&c, "events", &["list", "--limit", "1"]).await;
    check!(c, out.success(), "{}", out.show());
    let cursor = out
        .stdout
        .split_whitespace()
        .skip_while(|w| *w != "--after")
        .nth(1)
        .unwrap_or_else(|| fail!(c, "no cursor hint: {}", out.show()))
        .to_string();
    let out = admin_cli(
        &c,
        "events",
        &["list", "--limit", "1", "--after", &cursor, "--json"],
    )
    .await;
    check!(c, out.success(), "{}", out.show());
    let page = out.json();
    check_eq!(c, ids_of(&page), ["evt-retry"], "{page}");

    // Unknown: exit 1 and one sentence naming the id.
    let out = admin_cli(&c, "events", &["show", "evt-never-sent"]).await;
    check_eq!(c, out.code, 1, "{}", out.show());
    assert_no_panic(&out);
    check_eq!(c, out.stdout, "", "{}", out.show());
    check_eq!(c, out.stderr.trim().lines().count(), 1, "{}", out.show());
    check!(c, out.stderr.contains("evt-never-sent"), "{}", out.show());

    // The dead letter's record, then its attempts from history; `--json`
    // stays the record alone.
    let out = admin_cli(
        &c,
        "dead-letters",
        &["show", "--destination", "orders", BAD_ID],
    )
    .await;
    check!(c, out.success(), "{}", out.show());
    check!(
        c,
        out.stdout.starts_with('{'),
        "the record first: {}",
        out.show()
    );
    check!(
        c,
        out.stdout
            .lines()
            .any(|l| l.contains("attempt 1  400 BadRequest")),
        "{}",
        out.show()
    );
    let out = admin_cli(
        &c,
        "dead-letters",
        &["show", "--destination", "orders", BAD_ID, "--json"],
    )
    .await;
    check!(c, out.success(), "{}", out.show());
    check_eq!(c, out.json()["id"], BAD_ID, "{}", out.show());
}
