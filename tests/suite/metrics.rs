//! `/metrics` as Prometheus and operators read it (issue #30, item 7): the
//! standard `process_*` series, `courier_build_info`, and each
//! destination's `courier_oldest_pending_age_seconds`, in a text that
//! `promtool check metrics` passes without a remark.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::{Courier, Receiver, admin_post, check, check_eq, config, get, post, wait_metric};

const AGE: &str = r#"courier_oldest_pending_age_seconds{destination="orders"}"#;

/// `promtool check metrics` on `text`: its exit status and what it printed.
/// Fails, never skips, without promtool.
fn promtool_check(text: &str) -> (bool, String) {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => panic!(
            "cannot run promtool ({e}): install it with .ci/promtool (its binary from Debian's prometheus package)"
        ),
    };
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(text.as_bytes()).expect("write to promtool");
    }
    let out = child.wait_with_output().expect("promtool output");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said.trim().to_string())
}

/// The value of the line for `series` exactly as written (name and labels).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

async fn scrape(c: &Courier) -> String {
    let r = get(&format!("{}/metrics", c.admin_url())).await;
    check_eq!(c, r.status, 200, "{}", r.text());
    r.text()
}

/// The index stays 5 s behind the log here (`COURIER_JOURNAL_LAG_MS`), so a
/// paused destination's event 1.2 s old is in the ready queue only; after a
/// restart it is in the index only. The gauge must find it both times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrape_passes_promtool_with_process_build_and_oldest_age_series() {
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = Courier::start_with_env(
        support::courier_bin(),
        dir.path(),
        &config("orders", &rx.url(), ""),
        &[("COURIER_JOURNAL_LAG_MS", "5000")],
    )
    .await;
    let pause = format!("{}/v1/destinations/orders/pause", c.admin_url());
    let r = admin_post(&pause, "{}", &[]).await;
    check_eq!(c, r.status, 200, "pause: {}", r.text());
    let r = post(&c.url("orders"), r#"{"n":1}"#, &[]).await;
    check_eq!(c, r.status, 202, "{}", r.text());
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let text = scrape(&c).await;
    let (ok, said) = promtool_check(&text);
    check!(
        c,
        ok && said.is_empty(),
        "promtool check metrics: {said}\n{text}"
    );
    for series in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_virtual_memory_bytes",
        "process_threads",
    ] {
        let v = value(&text, series);
        check!(c, v.is_some_and(|v| v > 0.0), "{series}: {v:?}\n{text}");
    }
    check!(
        c,
        value(&text, "process_cpu_seconds_total").is_some(),
        "no process_cpu_seconds_total\n{text}"
    );
    let start = value(&text, "process_start_time_seconds").unwrap_or(0.0);
    let now = support::now_ms() as f64 / 1000.0;
    check!(
        c,
        // Whole seconds, from the boot time: a little slack either way.
        (now - 120.0..=now + 5.0).contains(&start),
        "process_start_time_seconds {start}, now {now}"
    );
    let build = format!(
        r#"courier_build_info{{version="{}"}}"#,
        env!("CARGO_PKG_VERSION")
    );
    check_eq!(c, value(&text, &build), Some(1.0), "{build}\n{text}");
    let age = value(&text, AGE);
    check!(
        c,
        age.is_some_and(|a| (1.0..10.0).contains(&a)),
        "age of an event held 1.2 s, not yet indexed: {age:?}"
    );

    c.restart().await;
    let text = scrape(&c).await;
    let age = value(&text, AGE);
    check!(
        c,
        age.is_some_and(|a| (1.2..30.0).contains(&a)),
        "age of the event read back into the index at restart: {age:?}"
    );

    let resume = format!("{}/v1/destinations/orders/resume", c.admin_url());
    let r = admin_post(&resume, "{}", &[]).await;
    check_eq!(c, r.status, 200, "resume: {}", r.text());
    rx.wait_for(1, Duration::from_secs(10)).await;
    wait_metric(&c, AGE, 0.0, Duration::from_secs(10)).await;
}

/// What the alerts of deploy/monitoring/ need beyond docs/http-api.md: why a
/// destination is paused (`courier_destination_paused{by}`, one series per
/// cause, 1 for the one in force), and the limits on the journal's
/// pending bytes (`courier_journal_max_bytes`,
/// `courier_destination_max_pending_bytes`), so that an alert can divide
/// `courier_journal_bytes` by them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrape_says_why_a_destination_is_paused_and_the_journals_limits() {
    let gone = Receiver::start(support::behavior(|_, _| support::Reply::status(410))).await;
    let busy = Receiver::start(support::behavior(|_, _| {
        support::Reply::status(429).header("Retry-After", "600")
    }))
    .await;
    let ok = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "listen: 127.0.0.1:0\n\
         admin_listen: 127.0.0.1:0\n\
         journal: {{ dir: ./journal, max_bytes: 64MiB }}\n\
         dead_letter: {{ dir: ./dl }}\n\
         destinations:\n  \
           gone: {{ url: {} }}\n  \
           busy: {{ url: {} }}\n  \
           held: {{ url: {}, max_pending_bytes: 16MiB }}\n",
        gone.url(),
        busy.url(),
        ok.url()
    );
    let c = Courier::start(dir.path(), &yaml).await;
    let paused =
        |d: &str, by: &str| format!(r#"courier_destination_paused{{destination="{d}",by="{by}"}}"#);
    let text = scrape(&c).await;
    for d in ["gone", "busy", "held"] {
        for by in ["operator", "gone", "retry_after"] {
            check_eq!(
                c,
                value(&text, &paused(d, by)),
                Some(0.0),
                "{d} {by} before anything\n{text}"
            );
        }
    }
    check_eq!(
        c,
        value(&text, "courier_journal_max_bytes"),
        Some(64.0 * 1024.0 * 1024.0),
        "{text}"
    );
    check_eq!(
        c,
        value(
            &text,
            r#"courier_destination_max_pending_bytes{destination="held"}"#
        ),
        Some(16.0 * 1024.0 * 1024.0),
        "{text}"
    );

    let pause = format!("{}/v1/destinations/held/pause", c.admin_url());
    let r = admin_post(&pause, "{}", &[]).await;
    check_eq!(c, r.status, 200, "pause: {}", r.text());
    for d in ["gone", "busy"] {
        let r = post(&c.url(d), r#"{"n":1}"#, &[]).await;
        check_eq!(c, r.status, 202, "{}", r.text());
    }
    gone.wait_for(1, Duration::from_secs(10)).await;
    busy.wait_for(1, Duration::from_secs(10)).await;
    for (d, by) in [
        ("held", "operator"),
        ("gone", "gone"),
        ("busy", "retry_after"),
    ] {
        wait_metric(&c, &paused(d, by), 1.0, Duration::from_secs(10)).await;
    }
    let text = scrape(&c).await;
    for d in ["gone", "busy", "held"] {
        let on: Vec<&str> = ["operator", "gone", "retry_after"]
            .into_iter()
            .filter(|by| value(&text, &paused(d, by)) == Some(1.0))
            .collect();
        check_eq!(c, on.len(), 1, "{d}: causes at 1: {on:?}\n{text}");
    }
    let (ok_, said) = promtool_check(&text);
    check!(
        c,
        ok_ && said.is_empty(),
        "promtool check metrics: {said}\n{text}"
    );

    let resume = format!("{}/v1/destinations/held/resume", c.admin_url());
    let r = admin_post(&resume, "{}", &[]).await;
    check_eq!(c, r.status, 200, "resume: {}", r.text());
    wait_metric(
        &c,
        &paused("held", "operator"),
        0.0,
        Duration::from_secs(10),
    )
    .await;
}
