//! Pauses that survive a restart (issue #12, item 5): an operator's pause
//! and a 410 Gone's are journal state. After SIGTERM and after SIGKILL the
//! destination is still paused, says who paused it and since when, holds
//! its events (also one accepted before the kill) until resumed, and a
//! resume is kept across a restart too.

use bytes::Bytes;
use serde_json::{Value, json};
use std::time::Duration;
use support::{
    Courier, Received, Receiver, Reply, check, check_eq, config, fail, get, post, quiet, requests,
};

const PROMPT: Duration = Duration::from_secs(5);
const HELD: Duration = Duration::from_millis(800);

async fn accept(c: &Courier, id: &str) {
    let body = json!({ "id": id }).to_string();
    let resp = post(&c.url("orders"), body, &[("Idempotency-Key", id)]).await;
    check_eq!(c, resp.status, 202, "POST ({id}): {}", resp.text());
}

fn id_of(r: &Received) -> &str {
    r.header("webhook-id").unwrap_or("")
}

async fn orders(c: &Courier) -> Value {
    let url = format!("{}/v1/destinations", c.admin_url());
    let resp = get(&url).await;
    check_eq!(c, resp.status, 200, "GET {url}: {}", resp.text());
    let body = resp.json();
    match body["destinations"]
        .as_array()
        .and_then(|l| l.iter().find(|d| d["name"] == "orders"))
    {
        Some(d) => d.clone(),
        None => fail!(c, "GET {url}: no orders: {body}"),
    }
}

async fn admin(c: &Courier, action: &str) -> Value {
    let url = format!("{}/v1/destinations/orders/{action}", c.admin_url());
    let resp = support::admin_post(&url, Bytes::new(), &[]).await;
    check_eq!(c, resp.status, 200, "POST {url}: {}", resp.text());
    resp.json()
}

/// Restarts courier after SIGTERM (a clean stop) or SIGKILL.
async fn restart(c: &mut Courier, kill: bool) {
    if kill {
        c.kill();
    } else {
        c.terminate();
        let status = c.wait_exit(PROMPT).await;
        check!(c, status.success(), "exit after SIGTERM: {status:?}");
    }
    c.restart().await;
}

/// Paused by an operator, a restart (clean or SIGKILL) keeps the pause and
/// its time; the event accepted before it waits; resume sends it, and a
/// later restart keeps the resume.
async fn operator_pause_survives(kill: bool) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let yaml = config("orders", &format!("{}/hooks", rx.url()), "");
    let mut c = Courier::start(tmp.path(), &yaml).await;

    let paused = admin(&c, "pause").await;
    let at = paused["paused_at"].clone();
    check!(
        c,
        at.is_string(),
        "pause answer without paused_at: {paused}"
    );
    accept(&c, "evt-before").await;
    restart(&mut c, kill).await;

    let d = orders(&c).await;
    check_eq!(c, d["state"], "paused", "after restart: {d}");
    check_eq!(c, d["paused_by"], "operator", "{d}");
    check_eq!(c, d["paused_at"], at, "the pause keeps its time: {d}");
    check_eq!(c, d["pending"], 1, "{d}");
    accept(&c, "evt-after").await;
    quiet(&c, &rx, 0, HELD).await;

    let resumed = admin(&c, "resume").await;
    check_eq!(c, resumed["was_paused"], true, "{resumed}");
    let got = requests(&c, &rx, 2, PROMPT).await;
    let mut ids: Vec<&str> = got.iter().map(id_of).collect();
    ids.sort_unstable();
    check_eq!(c, ids, vec!["evt-after", "evt-before"]);

    restart(&mut c, kill).await;
    let d = orders(&c).await;
    check_eq!(c, d["state"], "healthy", "the resume is kept too: {d}");
    accept(&c, "evt-resumed").await;
    // A SIGKILL right after the two deliveries may send them again (their
    // acks were not durable yet): wait for the new event by id.
    // Bounded: PROMPT in 10 ms polls.
    for _ in 0..500 {
        if rx.received().iter().any(|r| id_of(r) == "evt-resumed") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fail!(c, "evt-resumed not delivered after the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pause_survives_sigterm_and_restart() {
    operator_pause_survives(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pause_survives_sigkill_and_restart() {
    operator_pause_survives(true).await;
}

/// A 410's pause is recorded too: after SIGKILL the destination is still
/// paused by `gone`, and nothing is sent until an operator resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_pause_survives_sigkill_and_restart() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::sequence(vec![Reply::status(410), Reply::status(200)]).await;
    let yaml = config(
        "orders",
        &format!("{}/hooks", rx.url()),
        "concurrency: 1
         retry: { schedule: [10ms], jitter: 0 }",
    );
    let mut c = Courier::start(tmp.path(), &yaml).await;
    accept(&c, "evt-gone").await;
    requests(&c, &rx, 1, PROMPT).await;
    // Bounded: PROMPT in 10 ms polls.
    for _ in 0..500 {
        if orders(&c).await["paused_by"] == "gone" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check_eq!(c, orders(&c).await["paused_by"], "gone");
    // The pause is written right after the 410 is classified; give the
    // write its moment before the kill.
    tokio::time::sleep(Duration::from_millis(200)).await;
    restart(&mut c, true).await;

    let d = orders(&c).await;
    check_eq!(c, d["state"], "paused", "after SIGKILL: {d}");
    check_eq!(c, d["paused_by"], "gone", "{d}");
    check!(c, d["paused_at"].is_string(), "{d}");
    quiet(&c, &rx, 1, HELD).await;
    admin(&c, "resume").await;
    let got = requests(&c, &rx, 2, PROMPT).await;
    check_eq!(c, id_of(&got[1]), "evt-gone");
}

/// A damaged pause file stops the start with exit 2, naming the file and
/// what to do, rather than resuming what an operator paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_pause_file_stops_the_start() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let yaml = config("orders", &format!("{}/hooks", rx.url()), "");
    let mut c = Courier::start(tmp.path(), &yaml).await;
    admin(&c, "pause").await;
    c.terminate();
    c.wait_exit(PROMPT).await;
    let file = tmp.path().join("journal/pauses.json");
    std::fs::write(&file, b"{ not json").expect("damage the file");
    let out = support::courier::run_cli_in(
        None,
        Some(c.dir()),
        &["run", "--config", &c.config_path().display().to_string()],
        &[],
    )
    .await;
    check_eq!(c, out.code, 2, "{}", out.show());
    check!(
        c,
        out.stderr.contains("pauses.json") && out.stderr.contains("remove it"),
        "{}",
        out.show()
    );
}
