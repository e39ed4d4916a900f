//! Config hot reload end to end (docs/reload.md): a destination's url changed
//! while events flow, with every event delivered exactly once across the
//! old and the new receiver; invalid configs refused while the old one
//! delivers on; SIGHUP; a Kubernetes ConfigMap swap (the `..data` symlink
//! renamed); destinations removed (their events kept, orphaned) and added
//! (their acknowledged events surviving a SIGKILL).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::{
    Courier, Received, Receiver, check, check_eq, config, fail, get, metric, post, quiet, requests,
};

const PROMPT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);
const RELOADS: &str = "courier_config_last_reload_success_timestamp_seconds";
const FAILURES: &str = "courier_config_reload_failures_total";

/// Replaces `path` whole, as editors and config tools do (a reader never
/// sees half a file).
fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
}

/// How many reloads courier has logged as applied.
fn reloads(c: &Courier) -> usize {
    c.logs().matches("config reloaded").count()
}

async fn wait_reloads(c: &Courier, n: usize) {
    let deadline = Instant::now() + PROMPT;
    while reloads(c) < n {
        if Instant::now() >= deadline {
            fail!(
                c,
                "courier did not apply reload number {n} within {PROMPT:?}"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn wait_failures(c: &Courier, n: f64) {
    let deadline = Instant::now() + PROMPT;
    loop {
        let got = metric(&c.admin_url(), FAILURES).await.unwrap_or(0.0);
        if got >= n {
            check_eq!(c, got, n, "more reloads refused than configs written");
            return;
        }
        if Instant::now() >= deadline {
            fail!(c, "{FAILURES} stayed at {got}, expected {n}");
        }
        tokio::time::sleep(POLL).await;
    }
}

fn ids(got: &[Received]) -> Vec<String> {
    got.iter()
        .map(|r| r.header("webhook-id").unwrap_or_default().to_string())
        .collect()
}

async fn accept(c: &Courier, path: &str, id: &str) {
    let resp = post(
        &c.url(path),
        format!("{{\"id\":\"{id}\"}}"),
        &[("Idempotency-Key", id)],
    )
    .await;
    check_eq!(c, resp.status, 202, "POST /{path} {id}: {}", resp.text());
}

#[tokio::test]
async fn a_url_changed_while_events_flow_delivers_each_event_exactly_once() {
    const EVENTS: usize = 2000;
    const WORKERS: usize = 8;
    let (a, b) = (Receiver::ok().await, Receiver::ok().await);
    let dir = tempfile::tempdir().expect("tempdir");
    let c =
        Arc::new(Courier::start(dir.path(), &config("orders", &a.url(), "concurrency: 16")).await);
    let accepted = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (c, accepted) = (c.clone(), accepted.clone());
        workers.push(tokio::spawn(async move {
            for i in (w..EVENTS).step_by(WORKERS) {
                accept(&c, "orders", &format!("ev-{i}")).await;
                accepted.fetch_add(1, Ordering::Relaxed);
                // About 1,000 events/s in all: the flow spans the reload.
                tokio::time::sleep(Duration::from_millis(8)).await;
            }
        }));
    }
    let deadline = Instant::now() + PROMPT;
    while accepted.load(Ordering::Relaxed) < EVENTS / 4 {
        check!(c, Instant::now() < deadline, "posting stalled");
        tokio::time::sleep(POLL).await;
    }
    write_atomic(
        c.config_path(),
        &config("orders", &b.url(), "concurrency: 16"),
    );
    wait_reloads(&c, 1).await;
    let at_reload = accepted.load(Ordering::Relaxed);
    for w in workers {
        w.await.expect("poster");
    }
    let deadline = Instant::now() + PROMPT;
    while a.count() + b.count() < EVENTS {
        if Instant::now() >= deadline {
            fail!(c, "delivered {} + {} of {EVENTS}", a.count(), b.count());
        }
        tokio::time::sleep(POLL).await;
    }
    // Anything doubled would arrive now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (to_a, to_b) = (ids(&a.received()), ids(&b.received()));
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for id in to_a.iter().chain(&to_b) {
        *seen.entry(id).or_default() += 1;
    }
    let doubled: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    check!(
        c,
        doubled.is_empty(),
        "delivered more than once: {doubled:?}"
    );
    check_eq!(c, seen.len(), EVENTS, "distinct events delivered");
    for i in 0..EVENTS {
        check!(
            c,
            seen.contains_key(format!("ev-{i}").as_str()),
            "ev-{i} was never delivered"
        );
    }
    // The reload came mid-flow: both receivers had a real share.
    check!(c, at_reload < EVENTS, "the reload came after the last post");
    check!(
        c,
        to_a.len() >= EVENTS / 8,
        "old url got only {}",
        to_a.len()
    );
    check!(
        c,
        to_b.len() >= EVENTS / 8,
        "new url got only {}",
        to_b.len()
    );
    eprintln!(
        "reload mid-flow: {EVENTS} events, {} to the old url, {} to the new, 0 doubled, 0 lost; {at_reload} accepted before the reload was applied",
        to_a.len(),
        to_b.len()
    );
}

#[tokio::test]
async fn an_invalid_config_is_refused_and_the_old_one_delivers_on() {
    let (a, b) = (Receiver::ok().await, Receiver::ok().await);
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &config("orders", &a.url(), "")).await;
    let started = metric(&c.admin_url(), RELOADS).await.unwrap_or(0.0);
    let set = started > 0.0;
    check!(c, set, "{RELOADS} is not set at start");
    check_eq!(c, metric(&c.admin_url(), FAILURES).await, Some(0.0));

    // A YAML syntax error: the message names file, line and column.
    let broken = config("orders", &b.url(), "").replace("destinations:", "destinations: [");
    write_atomic(c.config_path(), &broken);
    wait_failures(&c, 1.0).await;
    // Refused once, not again at every read of the folder.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    check_eq!(
        c,
        metric(&c.admin_url(), FAILURES).await,
        Some(1.0),
        "one bad write refused more than once"
    );
    check_eq!(
        c,
        c.settled_logs()
            .await
            .matches("config reload refused")
            .count(),
        1
    );
    check!(
        c,
        c.logs().contains("config reload refused"),
        "no refusal logged"
    );
    check!(
        c,
        c.logged(
            |l| l.contains("config reload refused") && l.contains("courier.yaml:"),
            PROMPT
        )
        .await,
        "the refusal does not name the file and position"
    );
    check_eq!(
        c,
        metric(&c.admin_url(), "courier_config_last_reload_successful").await,
        Some(0.0)
    );
    accept(&c, "orders", "after-syntax-error").await;
    let got = requests(&c, &a, 1, PROMPT).await;
    check_eq!(c, ids(&got), ["after-syntax-error"]);

    // A value out of range: refused with the key path and its position.
    let out_of_range = config("orders", &b.url(), "retry: { max_attempts: 99 }");
    write_atomic(c.config_path(), &out_of_range);
    wait_failures(&c, 2.0).await;
    check!(
        c,
        c.logged(
            |l| l.contains("config reload refused")
                && l.contains("courier.yaml:9:")
                && l.contains("destinations.orders.retry.max_attempts: 99 is out of range"),
            PROMPT
        )
        .await,
        "the refusal does not name the key, value and position"
    );
    accept(&c, "orders", "after-out-of-range").await;
    requests(&c, &a, 2, PROMPT).await;
    check_eq!(c, b.count(), 0, "a refused config reached the new url");
    check_eq!(c, metric(&c.admin_url(), RELOADS).await, Some(started));

    // The file back to the config in force: healthy again, nothing reloaded.
    write_atomic(c.config_path(), &config("orders", &a.url(), ""));
    let deadline = Instant::now() + PROMPT;
    while metric(&c.admin_url(), "courier_config_last_reload_successful").await != Some(1.0) {
        if Instant::now() >= deadline {
            fail!(c, "the gauge stayed 0 after the file was restored");
        }
        tokio::time::sleep(POLL).await;
    }
    check_eq!(c, reloads(&c), 0, "restoring the text in force reloaded");

    // A good one is applied, and the metrics say so.
    write_atomic(c.config_path(), &config("orders", &b.url(), ""));
    wait_reloads(&c, 1).await;
    accept(&c, "orders", "after-good").await;
    check_eq!(c, ids(&requests(&c, &b, 1, PROMPT).await), ["after-good"]);
    quiet(&c, &a, 2, Duration::from_millis(300)).await;
    check_eq!(
        c,
        metric(&c.admin_url(), "courier_config_last_reload_successful").await,
        Some(1.0)
    );
    let later = metric(&c.admin_url(), RELOADS).await.unwrap_or(0.0);
    let moved = later > started;
    check!(c, moved, "{RELOADS} did not move: {started} -> {later}");
}

#[tokio::test]
async fn sighup_reloads_a_change_the_folder_watch_cannot_see() {
    let (a, b) = (Receiver::ok().await, Receiver::ok().await);
    let dir = tempfile::tempdir().expect("tempdir");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let mut c = Courier::start(dir.path(), &config("orders", &a.url(), "")).await;
    // The config becomes a link to a file in another folder: changes there
    // make no event in the watched one.
    let target = elsewhere.path().join("courier.yaml");
    std::fs::write(&target, config("orders", &a.url(), "")).expect("write target");
    let link = dir.path().join("courier.yaml.link");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    std::fs::rename(&link, c.config_path()).expect("swap in the link");
    // Let the watch read the (unchanged) text behind the new link first.
    tokio::time::sleep(Duration::from_millis(800)).await;
    check_eq!(c, reloads(&c), 0, "an unchanged config was reloaded");
    write_atomic(&target, &config("orders", &b.url(), ""));
    // The premise: the watch did not see it.
    tokio::time::sleep(Duration::from_millis(800)).await;
    check_eq!(
        c,
        reloads(&c),
        0,
        "the folder watch saw a change outside the folder"
    );
    c.signal(libc::SIGHUP);
    wait_reloads(&c, 1).await;
    check!(
        c,
        c.logs()
            .lines()
            .any(|l| l.contains("config reloaded") && l.contains("SIGHUP")),
        "the reload does not say SIGHUP caused it"
    );
    accept(&c, "orders", "after-hup").await;
    check_eq!(c, ids(&requests(&c, &b, 1, PROMPT).await), ["after-hup"]);
    check_eq!(c, a.count(), 0);
}

/// Lays out `dir` as the kubelet does for a ConfigMap volume:
/// `courier.yaml -> ..data/courier.yaml`, `..data -> ..<version>`.
fn configmap_version(dir: &Path, version: &str, text: &str) {
    let folder = dir.join(format!("..{version}"));
    std::fs::create_dir(&folder).expect("create version folder");
    std::fs::write(folder.join("courier.yaml"), text).expect("write version");
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).expect("symlink ..data_tmp");
    std::fs::rename(&tmp, dir.join("..data")).expect("rename ..data_tmp to ..data");
}

#[tokio::test]
async fn a_configmap_symlink_swap_is_reloaded() {
    let (a, b) = (Receiver::ok().await, Receiver::ok().await);
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &config("orders", &a.url(), "")).await;
    let d = dir.path();
    configmap_version(d, "v1", &config("orders", &a.url(), ""));
    let link = d.join("courier.yaml.link");
    std::os::unix::fs::symlink("..data/courier.yaml", &link).expect("symlink");
    std::fs::rename(&link, c.config_path()).expect("swap in the link");
    // Same text behind the link: no reload.
    tokio::time::sleep(Duration::from_millis(800)).await;
    check_eq!(c, reloads(&c), 0, "an unchanged config was reloaded");

    configmap_version(d, "v2", &config("orders", &b.url(), ""));
    std::fs::remove_dir_all(d.join("..v1")).expect("remove the old version");
    wait_reloads(&c, 1).await;
    accept(&c, "orders", "after-swap").await;
    check_eq!(c, ids(&requests(&c, &b, 1, PROMPT).await), ["after-swap"]);
    check_eq!(c, a.count(), 0);
}

async fn destination(c: &Courier, name: &str) -> Option<serde_json::Value> {
    let resp = get(&format!("{}/v1/destinations", c.admin_url())).await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    resp.json()["destinations"]
        .as_array()
        .and_then(|l| l.iter().find(|d| d["name"] == name).cloned())
}

fn two(a: &str, b: &str) -> String {
    format!("{}  audit:\n    url: {b}\n", config("orders", a, ""))
}

#[tokio::test]
async fn a_removed_destination_keeps_its_events_until_it_returns() {
    let (a, audit) = (Receiver::ok().await, Receiver::ok().await);
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &two(&a.url(), &audit.url())).await;
    let pause = format!("{}/v1/destinations/orders/pause", c.admin_url());
    check_eq!(c, support::admin_post(&pause, "", &[]).await.status, 200);
    for i in 0..5 {
        accept(&c, "orders", &format!("kept-{i}")).await;
    }
    write_atomic(c.config_path(), &config("audit", &audit.url(), ""));
    wait_reloads(&c, 1).await;
    let orphaned = destination(&c, "orders").await;
    check!(
        c,
        orphaned
            .as_ref()
            .is_some_and(|d| d["state"] == "orphaned" && d["pending"] == 5),
        "orders is not reported orphaned with 5 pending: {orphaned:?}"
    );
    let resp = post(&c.url("orders"), "{}", &[]).await;
    check_eq!(
        c,
        resp.status,
        404,
        "a removed destination still accepts: {}",
        resp.text()
    );
    accept(&c, "audit", "audit-1").await;
    requests(&c, &audit, 1, PROMPT).await;

    write_atomic(c.config_path(), &two(&a.url(), &audit.url()));
    wait_reloads(&c, 2).await;
    // The operator's pause outlived the removal; lifting it delivers all.
    let back = destination(&c, "orders").await;
    check!(
        c,
        back.as_ref().is_some_and(|d| d["state"] == "paused"),
        "{back:?}"
    );
    let resume = format!("{}/v1/destinations/orders/resume", c.admin_url());
    check_eq!(c, support::admin_post(&resume, "", &[]).await.status, 200);
    let got = requests(&c, &a, 5, PROMPT).await;
    let mut got = ids(&got);
    got.sort();
    check_eq!(
        c,
        got,
        (0..5).map(|i| format!("kept-{i}")).collect::<Vec<_>>()
    );
    quiet(&c, &a, 5, Duration::from_millis(300)).await;
}

#[tokio::test]
async fn events_for_a_destination_added_by_reload_survive_sigkill() {
    let (a, added) = (Receiver::ok().await, Receiver::ok().await);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = Courier::start(dir.path(), &config("orders", &a.url(), "")).await;
    write_atomic(c.config_path(), &two(&a.url(), &added.url()));
    wait_reloads(&c, 1).await;
    // Paused, so that every event is still pending when courier is killed;
    // the pause outlives the kill and is lifted after the restart.
    let pause = format!("{}/v1/destinations/audit/pause", c.admin_url());
    check_eq!(
        c,
        support::admin_post(&pause, "", &[]).await.status,
        200,
        "the added destination is not running"
    );
    for i in 0..20 {
        accept(&c, "audit", &format!("added-{i}")).await;
    }
    let pending = metric(
        &c.admin_url(),
        r#"courier_events_pending{destination="audit"}"#,
    )
    .await;
    check_eq!(c, pending, Some(20.0), "the added destination's counters");
    c.kill();
    check_eq!(c, added.count(), 0);
    c.restart().await;
    let resume = format!("{}/v1/destinations/audit/resume", c.admin_url());
    check_eq!(c, support::admin_post(&resume, "", &[]).await.status, 200);
    let got = requests(&c, &added, 20, PROMPT).await;
    let mut got = ids(&got);
    got.sort();
    got.dedup();
    check_eq!(
        c,
        got.len(),
        20,
        "distinct events delivered after SIGKILL: {got:?}"
    );
}

#[tokio::test]
async fn the_log_level_changes_without_a_restart() {
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let quiet_cfg = config("orders", &rx.url(), "").replace("level: debug", "level: info");
    let c = Courier::start(dir.path(), &quiet_cfg).await;
    accept(&c, "orders", "at-info").await;
    requests(&c, &rx, 1, PROMPT).await;
    check!(
        c,
        !c.settled_logs().await.contains("DEBUG"),
        "a debug line at level info"
    );
    write_atomic(c.config_path(), &config("orders", &rx.url(), ""));
    wait_reloads(&c, 1).await;
    accept(&c, "orders", "at-debug").await;
    requests(&c, &rx, 2, PROMPT).await;
    let deadline = Instant::now() + PROMPT;
    while !c
        .logs()
        .lines()
        .any(|l| l.contains("DEBUG") && l.contains("at-debug"))
    {
        if Instant::now() >= deadline {
            fail!(
                c,
                "no debug line about the event after the level was raised"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test]
async fn removed_and_added_back_while_attempts_are_in_flight_sends_each_event_once() {
    // Slow answers: the attempts are in flight through both reloads.
    let rx = Receiver::start(support::behavior(|_, _| {
        support::Reply::status(200).delay(Duration::from_millis(1500))
    }))
    .await;
    let other = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config("orders", &rx.url(), "concurrency: 16");
    let c = Courier::start(dir.path(), &cfg).await;
    for i in 0..8 {
        accept(&c, "orders", &format!("e{i}")).await;
    }
    rx.wait_for(8, PROMPT).await;
    write_atomic(c.config_path(), &config("audit", &other.url(), ""));
    wait_reloads(&c, 1).await;
    write_atomic(c.config_path(), &cfg);
    wait_reloads(&c, 2).await;
    write_atomic(c.config_path(), &config("audit", &other.url(), ""));
    wait_reloads(&c, 3).await;
    write_atomic(c.config_path(), &cfg);
    wait_reloads(&c, 4).await;
    // Every answer is in by now; a second dispatcher would have re-sent.
    let deadline = Instant::now() + PROMPT;
    loop {
        let pending = metric(
            &c.admin_url(),
            r#"courier_events_pending{destination="orders"}"#,
        )
        .await;
        if pending == Some(0.0) {
            break;
        }
        if Instant::now() >= deadline {
            fail!(c, "still pending: {pending:?}");
        }
        tokio::time::sleep(POLL).await;
    }
    quiet(&c, &rx, 8, Duration::from_millis(500)).await;
    let mut got = ids(&rx.received());
    got.sort();
    check_eq!(c, got, (0..8).map(|i| format!("e{i}")).collect::<Vec<_>>());
}

/// `orders` paused (its events stay pending) with a share of `share`.
fn with_share(url: &str, share: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nlog: {{ level: debug }}\n\
         journal: {{ dir: ./journal, max_bytes: 64KiB }}\n\
         ingress: {{ max_body_bytes: 1KiB }}\n\
         destinations:\n  orders:\n    url: {url}\n    max_pending_bytes: {share}\n"
    )
}

/// Posts 1 KiB events to `orders` until one is refused (at most 64);
/// returns how many were accepted, and checks the refusal is the share's.
async fn fill(c: &Courier, from: usize) -> usize {
    for i in 0..64 {
        let resp = post(
            &c.url("orders"),
            support::json_body(1000, (from + i) as u64),
            &[],
        )
        .await;
        if resp.status == 202 {
            continue;
        }
        check_eq!(c, resp.status, 503, "{}", resp.text());
        check_eq!(
            c,
            resp.json()["reason"],
            "destination_full",
            "{}",
            resp.text()
        );
        return i;
    }
    fail!(c, "64 KiB accepted past orders' share");
}

/// A share is only a limit: a reload that raises it lets more in at once,
/// one that lowers it below what is held refuses until deliveries free room.
#[tokio::test]
async fn a_changed_share_applies_on_reload() {
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &with_share(&rx.url(), "4KiB")).await;
    let pause = format!("{}/v1/destinations/orders/pause", c.admin_url());
    check_eq!(c, support::admin_post(&pause, "", &[]).await.status, 200);
    let first = fill(&c, 0).await;
    check!(
        c,
        (2..=4).contains(&first),
        "{first} events of 1 KiB in 4 KiB"
    );

    write_atomic(c.config_path(), &with_share(&rx.url(), "8KiB"));
    wait_reloads(&c, 1).await;
    let more = fill(&c, first).await;
    check!(c, more >= 3, "a raised share took only {more} more events");

    write_atomic(c.config_path(), &with_share(&rx.url(), "2KiB"));
    wait_reloads(&c, 2).await;
    check_eq!(c, fill(&c, 100).await, 0, "a lowered share let an event in");
    let resume = format!("{}/v1/destinations/orders/resume", c.admin_url());
    check_eq!(c, support::admin_post(&resume, "", &[]).await.status, 200);
    requests(&c, &rx, first + more, PROMPT).await;
    let bytes = r#"courier_journal_bytes{destination="orders"}"#;
    support::wait_metric(&c, bytes, 0.0, PROMPT).await;
    check!(c, fill(&c, 200).await >= 1, "delivered, yet still refused");
}
