//! Trust at the edges (README "Security"): what a bad payload, a crafted
//! path, a browser or a careless neighbour can and cannot make courier do.
//! Each test drives a real courier against a loopback receiver.

use serde_json::json;
use std::time::{Duration, Instant};
use support::{
    Courier, Receiver, Reply, behavior, check, check_eq, config, get, post, requests,
    wait_dead_letters,
};

const PROMPT: Duration = Duration::from_secs(5);

/// Ten malformed events in a row are dead-lettered at once (400 says the
/// event is bad), and the endpoint is not put on probation for them: the
/// next valid event goes out at once. Red when a 400 counts toward the
/// threshold (a 5-minute probation would hold it).
#[tokio::test]
async fn ten_bad_requests_in_a_row_do_not_delay_the_next_valid_event() {
    let rx = Receiver::start(behavior(|r, _| {
        Reply::status(if r.text().contains("bad") { 400 } else { 200 })
    }))
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = config(
        "orders",
        &rx.url(),
        "concurrency: 1
         retry: { schedule: [20ms], jitter: 0 }
         probation: { after_failures: 10 }",
    );
    let c = Courier::start(dir.path(), &yaml).await;
    for i in 0..10 {
        let resp = post(&c.url("orders"), json!({ "bad": i }).to_string(), &[]).await;
        check_eq!(c, resp.status, 202, "{}", resp.text());
    }
    let (_, records) = wait_dead_letters(&c, "orders", 10, PROMPT).await;
    check!(
        c,
        records
            .iter()
            .all(|r| r["deadLetterReason"] == "NonRetriableStatus"),
        "{records:?}"
    );
    let sent = Instant::now();
    let resp = post(&c.url("orders"), json!({ "good": 1 }).to_string(), &[]).await;
    check_eq!(c, resp.status, 202, "{}", resp.text());
    let got = requests(&c, &rx, 11, PROMPT).await;
    check!(c, got[10].text().contains("good"), "{}", got[10].text());
    check!(
        c,
        sent.elapsed() < Duration::from_secs(2),
        "the valid event took {:?}",
        sent.elapsed()
    );
    let d = get(&format!("{}/v1/destinations", c.admin_url()))
        .await
        .json();
    check_eq!(c, d["destinations"][0]["state"], "healthy", "{d}");
}

/// `/rest` with a dot segment (plain, percent-encoded, or behind an encoded
/// slash) is refused with a JSON 400 and never forwarded; an ordinary path
/// with dots in its names still is. Red when dot segments are forwarded.
#[tokio::test]
async fn a_rest_with_dot_segments_never_reaches_the_endpoint() {
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(
        dir.path(),
        &config("hdr", &format!("{}/hooks", rx.url()), ""),
    )
    .await;
    for rest in ["/../../admin", "/a/%2e%2E/b", "/x/.", "/a%2f..%2fadmin"] {
        let resp = post(&c.url(&format!("hdr{rest}")), "{}", &[]).await;
        check_eq!(c, resp.status, 400, "{rest}: {}", resp.text());
        check_eq!(c, resp.json()["reason"], "dot_segment", "{rest}");
    }
    let resp = post(&c.url("hdr/v1.2/.well-known/x..y"), "{}", &[]).await;
    check_eq!(c, resp.status, 202, "{}", resp.text());
    let got = requests(&c, &rx, 1, PROMPT).await;
    check_eq!(c, got[0].path_and_query, "/hooks/v1.2/.well-known/x..y");
    tokio::time::sleep(Duration::from_millis(300)).await;
    check_eq!(c, rx.count(), 1, "only the ordinary path was forwarded");
}
