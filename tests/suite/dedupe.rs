//! `ingress.dedupe_window`: a repeated event id is acknowledged but stored
//! (and so delivered) once, across a clean restart and a SIGKILL.

use std::time::Duration;
use support::{Courier, Receiver, client};

fn config(url: &str, window: &str) -> String {
    format!(
        "listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
journal: {{ dir: ./journal }}
ingress: {{ dedupe_window: {window} }}
destinations:
  orders:
    url: {url}
"
    )
}

async fn post_id(c: &Courier, id: &str) -> serde_json::Value {
    let r = client::post(
        &c.url("orders"),
        format!("{{\"id\":\"{id}\"}}"),
        &[("idempotency-key", id)],
    )
    .await;
    assert_eq!(r.status, 202, "{}\n{}", r.text(), c.logs());
    r.json()
}

fn ids_received(rx: &Receiver) -> Vec<String> {
    let mut ids: Vec<String> = rx
        .received()
        .iter()
        .filter_map(|r| r.header("webhook-id").map(str::to_string))
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_id_is_acknowledged_and_delivered_once_across_restarts() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let mut c = Courier::start(tmp.path(), &config(&rx.url(), "10m")).await;

    let first = post_id(&c, "evt-1").await;
    assert_eq!(first["ids"], serde_json::json!(["evt-1"]));
    assert!(first.get("duplicates").is_none(), "{first}");
    rx.wait_for(1, Duration::from_secs(10)).await;

    let again = post_id(&c, "evt-1").await;
    assert_eq!(again["accepted"], 1, "{again}");
    assert_eq!(again["duplicates"], serde_json::json!(["evt-1"]), "{again}");

    // A clean restart, then a SIGKILL right after a 202: both remember.
    c.terminate();
    c.wait_exit(Duration::from_secs(10)).await;
    c.restart().await;
    let after_restart = post_id(&c, "evt-1").await;
    assert_eq!(after_restart["duplicates"], serde_json::json!(["evt-1"]));
    post_id(&c, "evt-2").await;
    c.kill();
    c.restart().await;
    let after_kill = post_id(&c, "evt-2").await;
    assert_eq!(
        after_kill["duplicates"],
        serde_json::json!(["evt-2"]),
        "{after_kill}\n{}",
        c.logs()
    );
    let dups = client::metric(
        &c.admin_url(),
        r#"courier_events_deduplicated_total{destination="orders"}"#,
    )
    .await;
    assert_eq!(dups, Some(1.0));

    rx.wait_for(2, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    // evt-2 may come twice (SIGKILL between its delivery and the journal's
    // record of it: at least once); evt-1 was settled long before.
    let mut ids = ids_received(&rx);
    assert_eq!(ids.iter().filter(|i| *i == "evt-1").count(), 1, "{ids:?}");
    ids.dedup();
    assert_eq!(ids, vec!["evt-1", "evt-2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_window_the_same_id_is_a_new_event() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let c = Courier::start(tmp.path(), &config(&rx.url(), "1s")).await;
    post_id(&c, "evt-1").await;
    let dup = post_id(&c, "evt-1").await;
    assert_eq!(dup["duplicates"], serde_json::json!(["evt-1"]));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let fresh = post_id(&c, "evt-1").await;
    assert!(fresh.get("duplicates").is_none(), "{fresh}");
    rx.wait_for(2, Duration::from_secs(10)).await;
    rx.assert_quiet(2, Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_window_every_post_is_stored() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rx = Receiver::ok().await;
    let yaml = config(&rx.url(), "1s").replace("ingress: { dedupe_window: 1s }\n", "");
    let c = Courier::start(tmp.path(), &yaml).await;
    post_id(&c, "evt-1").await;
    let second = post_id(&c, "evt-1").await;
    assert!(second.get("duplicates").is_none(), "{second}");
    rx.wait_for(2, Duration::from_secs(10)).await;
}
