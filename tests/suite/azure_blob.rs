//! The bucket features on Azure Blob (issue #32; docs/object-storage.md), against Azurite
//! (npm `azurite`) on loopback, with the emulator's standard environment
//! (`AZURE_STORAGE_USE_EMULATOR`): dead letters reach the container in
//! their docs/dead-letters.md shapes and the admin API lists them; a hand-off goes from one
//! courier to another through it (Azure's conditional create claims it).

use std::collections::HashSet;
use std::time::Duration;
use support::stores::Azurite;
use support::{Courier, Receiver, Reply, behavior, check, check_eq, courier_bin, get, post};

const CONTAINER: &str = "courier";

async fn start(dir: &std::path::Path, yaml: &str, az: &Azurite) -> Courier {
    let env = az.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Courier::start_with_env(courier_bin(), dir, yaml, &env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_and_a_hand_off_go_through_azure_blob() {
    let az = Azurite::start(CONTAINER).await;
    // Dead letters: every event is refused with 400.
    let refusing = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nlog: {{ level: debug }}\n\
         journal: {{ dir: ./journal }}\n\
         dead_letter: {{ url: az://{CONTAINER}/dl }}\n\
         destinations:\n  orders:\n    url: {}\n",
        refusing.url()
    );
    let c = start(dir.path(), &yaml, &az).await;
    for i in 0..3 {
        let r = post(
            &c.url("orders"),
            format!(r#"{{"n":{i}}}"#),
            &[("Idempotency-Key", &format!("d{i}"))],
        )
        .await;
        check_eq!(c, r.status, 202, "{}", r.text());
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let records = loop {
        let records: Vec<serde_json::Value> = az
            .blobs(CONTAINER, "dl/orders/")
            .iter()
            .filter(|(name, _)| name.ends_with(".jsonl"))
            .flat_map(|(_, text)| {
                text.lines()
                    .map(|l| serde_json::from_str(l).expect("a JSON line"))
                    .collect::<Vec<_>>()
            })
            .collect();
        if records.len() >= 3 || tokio::time::Instant::now() >= deadline {
            break records;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let ids: HashSet<&str> = records.iter().filter_map(|r| r["id"].as_str()).collect();
    check_eq!(
        c,
        ids,
        HashSet::from(["d0", "d1", "d2"]),
        "each record once, in the container"
    );
    check!(
        c,
        records
            .iter()
            .all(|r| r["deadLetterReason"] == "NonRetriableStatus"),
        "{records:?}"
    );
    let page = get(&format!(
        "{}/v1/dead-letters?destination=orders",
        c.admin_url()
    ))
    .await;
    check_eq!(c, page.status, 200, "{}", page.text());
    check_eq!(
        c,
        page.json()["dead_letters"].as_array().map(Vec::len),
        Some(3)
    );

    // Hand-off: A holds events for an endpoint that is down, B adopts them.
    let (_socket, port) = support::refusing_port();
    let ok = Receiver::start(behavior(|_, _| Reply::status(200))).await;
    let handoff = |url: &str| {
        format!(
            "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nlog: {{ level: debug }}\nshutdown_grace: 1s\n\
             journal: {{ dir: ./journal }}\n\
             handoff: {{ url: az://{CONTAINER}/handoff, poll: 200ms }}\n\
             destinations:\n  orders:\n    url: {url}\n"
        )
    };
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let mut a = start(
        dir_a.path(),
        &handoff(&format!("http://127.0.0.1:{port}/x")),
        &az,
    )
    .await;
    for i in 0..50 {
        let r = post(
            &a.url("orders"),
            "{}".to_string(),
            &[("Idempotency-Key", &format!("h{i}"))],
        )
        .await;
        check_eq!(a, r.status, 202, "{}", r.text());
    }
    a.terminate_handing_off().await;
    let b = start(dir_b.path(), &handoff(&ok.url()), &az).await;
    let got: HashSet<String> = ok
        .wait_for(50, Duration::from_secs(30))
        .await
        .iter()
        .filter_map(|r| r.header("webhook-id").map(str::to_string))
        .collect();
    check_eq!(b, got.len(), 50, "every event delivered by B");
    // The object goes once its events are indexed, which may be just after
    // the deliveries began.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let left = loop {
        let left: Vec<String> = az
            .blobs(CONTAINER, "handoff/pending/")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        if left.is_empty() || tokio::time::Instant::now() >= deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    check!(b, left.is_empty(), "adopted objects are deleted: {left:?}");
}
