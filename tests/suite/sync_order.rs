//! The order of the system calls behind one acknowledged event, seen by
//! strace on the real binary: with `journal.sync: always` the event's bytes
//! are written to an intake log segment, then that segment is fdatasynced,
//! and only after the sync returned does courier start writing the
//! `HTTP/1.1 202` to the app's socket. With `journal.sync: os` no sync of
//! the segment comes between the write and the 202, but one comes before
//! the event's row, which points into the segment, is written to SQLite.
//!
//! Needs strace (`.ci/run` installs it); without it the tests fail, saying
//! so, rather than pass without looking.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{Courier, client, courier_bin, refusing_port};

const STRACE: &str = "strace";
const EVENTS: usize = 3;

fn config(url: &str, sync: &str) -> String {
    format!(
        "listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
journal: {{ dir: ./journal, sync: {sync} }}
destinations:
  orders:
    url: {url}/hooks
    retry: {{ schedule: [1h], max_attempts: 2, jitter: 0 }}
"
    )
}

fn require_strace() {
    let found = Command::new(STRACE).arg("-V").output();
    assert!(
        found.as_ref().is_ok_and(|o| o.status.success()),
        "strace is needed for this test and was not found or does not run ({found:?}); \
         install it (e.g. `apt-get install strace`; .ci/run does)"
    );
}

/// Runs courier under strace with `sync`, posts `EVENTS` events one after
/// the other (each body and id a unique marker), stops courier and returns
/// the markers and the trace.
async fn traced_run(sync: &str) -> (Vec<String>, Vec<String>) {
    require_strace();
    let tmp = tempfile::tempdir().expect("tempdir");
    let trace = tmp.path().join("strace.txt");
    let trace_arg = trace.display().to_string();
    // Nothing is delivered (the port refuses, the retry is an hour away), so
    // the trace holds little beyond intake.
    let (_closed, port) = refusing_port();
    let url = format!("http://127.0.0.1:{port}");
    let wrapper = [
        STRACE,
        "-f",
        "-yy",
        "-s",
        "8192",
        "-e",
        "trace=write,pwrite64,writev,pwritev,pwritev2,fdatasync,fsync,sendto,sendmsg",
        "-o",
        &trace_arg,
        "--",
    ];
    let mut courier = Courier::start_wrapped(
        &wrapper,
        courier_bin(),
        tmp.path(),
        &config(&url, sync),
        &[],
    )
    .await;
    let mut markers = Vec::new();
    for i in 0..EVENTS {
        let marker = format!("syncorder{}x{i}", std::process::id());
        let r = client::post(
            &courier.url("orders"),
            marker.clone(),
            &[("idempotency-key", &marker)],
        )
        .await;
        assert_eq!(r.status, 202, "{}\n{}", r.text(), courier.logs());
        markers.push(marker);
    }
    // SIGTERM to courier itself (strace, the process `Courier` holds, does
    // not pass it on); strace exits after it, and the trace file is then
    // complete.
    let traced = traced_child(courier.pid());
    // SAFETY: kill(2) on strace's child, which strace has not reaped (it
    // exits only after it).
    let rc = unsafe { libc::kill(traced, libc::SIGTERM) };
    assert_eq!(
        rc,
        0,
        "kill({traced}, SIGTERM): {}",
        std::io::Error::last_os_error()
    );
    let status = courier.wait_exit(Duration::from_secs(20)).await;
    assert!(
        status.success(),
        "strace exited with {status}\n{}",
        courier.logs()
    );
    let text = std::fs::read_to_string(&trace)
        .unwrap_or_else(|e| panic!("read {}: {e}\n{}", trace.display(), courier.logs()));
    (markers, text.lines().map(str::to_owned).collect())
}

/// The pid of the process strace (pid `strace`) started.
fn traced_child(strace: u32) -> libc::pid_t {
    let path = format!("/proc/{strace}/task/{strace}/children");
    let children = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let mut pids = children.split_whitespace();
    match (pids.next().map(str::parse), pids.next()) {
        (Some(Ok(pid)), None) => pid,
        _ => panic!("strace {strace} should have one child, has {children:?}"),
    }
}

/// One system call in the trace: where it started and where it completed
/// (line numbers; strace writes lines in the order it saw the calls enter
/// and leave, and a thread stays stopped at each until strace has written
/// it, so line order is causal order across threads).
#[derive(Clone, Debug)]
struct Call {
    name: String,
    /// The first argument's `-yy` annotation: a path, or `TCP:[a->b]`.
    fd: String,
    /// The start line, with the data strace printed.
    text: String,
    start: usize,
    end: usize,
}

/// Parses `PID name(FD<what>, ...) = R`, `PID name(... <unfinished ...>`
/// and `PID <... name resumed>...) = R` lines into calls (a call that never
/// completed gets `end = usize::MAX`).
fn calls(lines: &[String]) -> Vec<Call> {
    let mut done = Vec::new();
    let mut open: std::collections::HashMap<String, Call> = std::collections::HashMap::new();
    for (n, line) in lines.iter().enumerate() {
        let Some((pid, rest)) = line.split_once(' ') else {
            continue;
        };
        let rest = rest.trim_start();
        if let Some(resumed) = rest.strip_prefix("<... ") {
            if resumed.contains(" resumed>")
                && let Some(mut call) = open.remove(pid)
            {
                call.end = n;
                done.push(call);
            }
            continue;
        }
        let Some((name, args)) = rest.split_once('(') else {
            continue;
        };
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let call = Call {
            name: name.to_owned(),
            fd: annotation(args),
            text: line.clone(),
            start: n,
            end: n,
        };
        if rest.ends_with("<unfinished ...>") {
            open.insert(pid.to_owned(), call);
        } else {
            done.push(call);
        }
    }
    done.extend(open.into_values().map(|c| Call {
        end: usize::MAX,
        ..c
    }));
    done.sort_by_key(|c| c.start);
    done
}

/// `7</tmp/x/intake-0.log>, ...` → `/tmp/x/intake-0.log`;
/// `9<TCP:[127.0.0.1:1->127.0.0.1:2]>, ...` → `TCP:[127.0.0.1:1->127.0.0.1:2]`.
fn annotation(args: &str) -> String {
    let Some(open) = args.find('<') else {
        return String::new();
    };
    let inner = &args[open + 1..];
    let end = if inner.starts_with("TCP") || inner.starts_with("UNIX") {
        inner.find("]>").map(|i| i + 1)
    } else {
        inner.find('>')
    };
    end.map(|e| inner[..e].to_owned()).unwrap_or_default()
}

fn is_intake_log(fd: &str) -> bool {
    Path::new(fd).file_name().is_some_and(|name| {
        let name = name.to_string_lossy();
        name.starts_with("intake-") && name.ends_with(".log")
    })
}

const WRITES: [&str; 5] = ["write", "pwrite64", "writev", "pwritev", "pwritev2"];
const SYNCS: [&str; 2] = ["fdatasync", "fsync"];
const SENDS: [&str; 4] = ["write", "writev", "sendto", "sendmsg"];

/// For one marker: the write of its bytes to an intake log segment and the
/// write of the 202 that lists it to a TCP socket (panics, with the trace,
/// if either is missing or they come in the wrong order).
fn write_and_answer<'a>(calls: &'a [Call], marker: &str, trace: &[String]) -> (&'a Call, &'a Call) {
    let show = || trace.join("\n");
    let write = calls
        .iter()
        .find(|c| {
            WRITES.contains(&c.name.as_str()) && is_intake_log(&c.fd) && c.text.contains(marker)
        })
        .unwrap_or_else(|| {
            panic!(
                "no write of {marker} to an intake-*.log segment in the trace:\n{}",
                show()
            )
        });
    let answer = calls
        .iter()
        .find(|c| {
            SENDS.contains(&c.name.as_str())
                && c.fd.starts_with("TCP")
                && c.text.contains("HTTP/1.1 202")
                && c.text.contains(marker)
        })
        .unwrap_or_else(|| {
            panic!(
                "no `HTTP/1.1 202` listing {marker} written to a TCP socket in the trace:\n{}",
                show()
            )
        });
    assert!(
        write.end < answer.start,
        "{marker}: the 202 (line {}) started before the write to the intake log completed (line {}):\n{}",
        answer.start + 1,
        write.end + 1,
        show()
    );
    (write, answer)
}

/// The thread that made a call: the pid strace -f puts first on its line.
fn thread(call: &Call) -> &str {
    call.text.split_whitespace().next().unwrap_or("")
}

/// The syncs of `path` that started after line `after` and before line
/// `before`.
fn syncs_between<'a>(calls: &'a [Call], path: &str, after: usize, before: usize) -> Vec<&'a Call> {
    calls
        .iter()
        .filter(|c| SYNCS.contains(&c.name.as_str()) && c.fd == path)
        .filter(|c| c.start > after && c.start < before)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_always_fdatasyncs_the_intake_log_between_the_write_and_the_202() {
    let (markers, trace) = traced_run("always").await;
    let calls = calls(&trace);
    for marker in &markers {
        let (write, answer) = write_and_answer(&calls, marker, &trace);
        let syncs = syncs_between(&calls, &write.fd, write.end, answer.start);
        let synced = syncs.iter().find(|s| s.end < answer.start);
        assert!(
            synced.is_some(),
            "{marker}: written to {} (line {}) but no fdatasync of it completed before the 202 started (line {}); syncs started in between: {syncs:?}\ntrace:\n{}",
            write.fd,
            write.end + 1,
            answer.start + 1,
            trace.join("\n")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_os_answers_without_syncing_the_intake_log() {
    let (markers, trace) = traced_run("os").await;
    let calls = calls(&trace);
    for marker in &markers {
        let (write, answer) = write_and_answer(&calls, marker, &trace);
        // The indexer's own sync of the log (before it writes rows) may
        // fall in between; the writer's, which the 202 would wait for, not.
        let mut syncs = syncs_between(&calls, &write.fd, write.end, answer.start);
        syncs.retain(|s| thread(s) == thread(write));
        assert!(
            syncs.is_empty(),
            "{marker}: with sync: os, the thread that wrote to {} synced it between the event's write (line {}) and the 202 (line {}): {syncs:?}",
            write.fd,
            write.end + 1,
            answer.start + 1,
        );
    }
}

/// With `sync: os` a row is written only once the log bytes it points
/// into are on disk: SQLite's WAL is synced on its own schedule (the
/// checkpointer), and a synced row over a lost page would come back after a
/// power loss as damage, not as the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_os_syncs_the_intake_log_before_writing_rows_that_point_into_it() {
    let (markers, trace) = traced_run("os").await;
    let calls = calls(&trace);
    for marker in &markers {
        let (write, _) = write_and_answer(&calls, marker, &trace);
        let row = calls
            .iter()
            .find(|c| {
                WRITES.contains(&c.name.as_str())
                    && c.fd.ends_with("journal.db-wal")
                    && c.text.contains(marker.as_str())
                    && c.start > write.end
            })
            .unwrap_or_else(|| {
                panic!(
                    "{marker}: no write of its row to journal.db-wal after its write to {} (line {}):\n{}",
                    write.fd,
                    write.end + 1,
                    trace.join("\n")
                )
            });
        let syncs = syncs_between(&calls, &write.fd, write.end, row.start);
        assert!(
            syncs.iter().any(|s| s.end < row.start),
            "{marker}: its row went to the WAL (line {}) before {} (written at line {}) was synced; syncs started in between: {syncs:?}",
            row.start + 1,
            write.fd,
            write.end + 1,
        );
    }
}

#[test]
fn the_parser_pairs_unfinished_and_resumed_lines_and_reads_annotations() {
    let lines: Vec<String> = [
        r#"10 pwrite64(7</j/intake-00000000000000000000.log>, "m1", 2, 0 <unfinished ...>"#,
        r#"11 write(9<TCP:[127.0.0.1:8080->127.0.0.1:4000]>, "HTTP/1.1 202 m0", 15) = 15"#,
        r#"10 <... pwrite64 resumed>) = 2"#,
        r#"10 fdatasync(7</j/intake-00000000000000000000.log>) = 0"#,
        r#"12 writev(9<TCP:[127.0.0.1:8080->127.0.0.1:4000]>, [{iov_base="HTTP/1.1 202 m1"}], 1) = 15"#,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let calls = calls(&lines);
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert_eq!(calls[0].name, "pwrite64");
    assert_eq!(thread(&calls[0]), "10");
    assert_eq!(thread(&calls[1]), "11");
    assert_eq!(calls[0].fd, "/j/intake-00000000000000000000.log");
    assert_eq!((calls[0].start, calls[0].end), (0, 2));
    assert_eq!(calls[1].fd, "TCP:[127.0.0.1:8080->127.0.0.1:4000]");
    let (write, answer) = write_and_answer(&calls, "m1", &lines);
    assert_eq!((write.start, answer.start), (0, 4));
    let syncs = syncs_between(&calls, &write.fd, write.end, answer.start);
    assert_eq!(syncs.len(), 1, "{syncs:?}");
    assert!(syncs_between(&calls, &write.fd, 0, 2).is_empty());
}
