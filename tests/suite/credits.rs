//! The Service Bus credit throttle (docs/configuration.md `ingress.credits_per_second`,
//! docs/publishing.md) across the wire: a burst gets exactly the period's
//! credits and the rest 429 with `Retry-After`; what was refused is never
//! delivered and is accepted after the refill; what was accepted survives a
//! SIGKILL; a topic event costs one credit per subscriber more.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::json;
use support::{Courier, Receiver, check, check_eq, fail, metric_sum, post, quiet, requests};

const PROMPT: Duration = Duration::from_secs(10);

fn ids(got: &[support::Received]) -> BTreeSet<String> {
    got.iter()
        .map(|r| r.header("webhook-id").unwrap_or("").to_string())
        .collect()
}

/// Posts one `custom` event per id, all at once; the statuses by id.
async fn burst(c: &Courier, ids: &[String]) -> Vec<(String, support::client::Resp)> {
    let url = c.url("orders");
    let sends = ids.iter().map(|id| {
        let url = url.clone();
        let id = id.clone();
        tokio::spawn(async move {
            let resp = post(
                &url,
                format!(r#"{{"n":"{id}"}}"#),
                &[("idempotency-key", &id)],
            )
            .await;
            (id, resp)
        })
    });
    let tasks: Vec<_> = sends.collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.expect("join"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_gets_the_periods_credits_and_the_rest_waits_for_the_refill() {
    let rx = Receiver::ok().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    // Nothing listens at first, so no attempt can succeed before the kill.
    let yaml = |url: &str| {
        support::config(
            "orders",
            url,
            "retry: { schedule: [200ms], max_attempts: 30, jitter: 0 }",
        )
        .replace(
            "destinations:\n",
            "ingress: { credits_per_second: 50 }\ndestinations:\n",
        )
    };
    let mut c = Courier::start(tmp.path(), &yaml("http://127.0.0.1:9/orders")).await;

    let all: Vec<String> = (0..200).map(|i| format!("ev-{i:03}")).collect();
    let started = Instant::now();
    let answers = burst(&c, &all).await;
    let took = started.elapsed();
    // The test's premise: the burst fits in one period.
    check!(
        c,
        took < Duration::from_millis(900),
        "the burst took {took:?}"
    );
    let mut accepted = BTreeSet::new();
    let mut refused = Vec::new();
    for (id, resp) in &answers {
        match resp.status {
            202 => {
                accepted.insert(id.clone());
            }
            429 => {
                check_eq!(c, resp.header("retry-after"), Some("1"), "{id}");
                let body = resp.json();
                check_eq!(c, body["reason"], "throttled", "{body}");
                let wait = body["retry_after_ms"].as_u64().unwrap_or(0);
                check!(c, (1..=1000).contains(&wait), "{body}");
                check!(
                    c,
                    body["error"]
                        .as_str()
                        .unwrap_or("")
                        .contains("credits_per_second"),
                    "{body}"
                );
                refused.push(id.clone());
            }
            other => fail!(c, "{id}: {other} {}", resp.text()),
        }
    }
    check_eq!(c, accepted.len(), 50, "accepted in one period");
    check_eq!(c, refused.len(), 150);
    let throttled = metric_sum(
        &c.admin_url(),
        r#"courier_ingress_rejected_total{reason="throttled"}"#,
    )
    .await;
    check_eq!(c, throttled, 150.0);

    // Acknowledged, then killed before any delivery could succeed.
    c.kill();
    std::fs::write(c.config_path(), yaml(&rx.url())).expect("write config");
    c.restart().await;
    let got = requests(&c, &rx, 50, PROMPT).await;
    quiet(&c, &rx, 50, Duration::from_millis(300)).await;
    check_eq!(
        c,
        ids(&got),
        accepted,
        "exactly the accepted, nothing refused"
    );

    // After the refill, the refused are accepted, a period's worth at a time.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut waiting = refused;
    // Bounded by the deadline.
    while !waiting.is_empty() {
        check!(
            c,
            Instant::now() < deadline,
            "{} still refused",
            waiting.len()
        );
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let started = Instant::now();
        let answers = burst(&c, &waiting).await;
        // A burst slower than a period may span two grants.
        let grants = if started.elapsed() < Duration::from_millis(900) {
            1
        } else {
            2
        };
        let before = waiting.len();
        waiting = answers
            .into_iter()
            .filter(|(_, r)| r.status == 429)
            .map(|(id, _)| id)
            .collect();
        let taken = before - waiting.len();
        check!(
            c,
            (1..=50 * grants).contains(&taken),
            "{taken} accepted in {grants} period(s)"
        );
    }
    let got = requests(&c, &rx, 200, PROMPT).await;
    quiet(&c, &rx, 200, Duration::from_millis(300)).await;
    let want: BTreeSet<String> = all.into_iter().collect();
    check_eq!(c, ids(&got), want);
}

fn eg_event(id: &str) -> serde_json::Value {
    json!({
        "id": id,
        "subject": "/orders/1",
        "eventType": "Shop.OrderCreated",
        "eventTime": "2026-11-24T12:00:00Z",
        "data": {},
        "dataVersion": "1.0",
    })
}

/// A topic event costs 1 + one per subscriber's filter: with three
/// subscribers and 10 credits, two events a period; a request that could
/// never fit in a period is 413, not 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_event_costs_one_credit_per_subscriber_more() {
    let rx = Receiver::ok().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let url = rx.url();
    let mut yaml = "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\njournal: { dir: ./journal }\ningress: { credits_per_second: 10 }\ndestinations:\n".to_string();
    for name in ["a", "b", "c", "direct"] {
        yaml.push_str(&format!(
            "  {name}:\n    url: {url}/{name}\n    schema: eventgrid\n"
        ));
    }
    yaml.push_str("topics:\n  shop:\n    schema: eventgrid\n    subscribers:\n      a: {}\n      b: { event_types: [Other.Type] }\n      c: {}\n");
    let c = Courier::start(tmp.path(), &yaml).await;
    let topic = c.url("shop");
    let json_type = [("content-type", "application/json")];

    // One event matching two of three subscribers still costs 4. The
    // test's premise: three small requests take far less than a period.
    let started = Instant::now();
    for id in ["t-1", "t-2"] {
        let resp = post(&topic, eg_event(id).to_string(), &json_type).await;
        check_eq!(c, resp.status, 200, "{id}: {}", resp.text());
    }
    let resp = post(&topic, eg_event("t-3").to_string(), &json_type).await;
    let took = started.elapsed();
    check!(
        c,
        took < Duration::from_millis(900),
        "premise: took {took:?}"
    );
    check_eq!(c, resp.status, 429, "8 of 10 used: {}", resp.text());
    check_eq!(c, resp.header("retry-after"), Some("1"));
    // Three events need 12 credits, more than a period grants.
    let three = json!([eg_event("x-1"), eg_event("x-2"), eg_event("x-3")]).to_string();
    let resp = post(&topic, three, &json_type).await;
    check_eq!(c, resp.status, 413, "{}", resp.text());
    check_eq!(c, resp.json()["reason"], "over_credits");
    // A destination's route has its own credits: 10 events in one request.
    let ten: Vec<_> = (0..10).map(|i| eg_event(&format!("d-{i}"))).collect();
    let started = Instant::now();
    let resp = post(&c.url("direct"), json!(ten).to_string(), &json_type).await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    let resp = post(&c.url("direct"), eg_event("d-10").to_string(), &json_type).await;
    let took = started.elapsed();
    check!(
        c,
        took < Duration::from_millis(900),
        "premise: took {took:?}"
    );
    check_eq!(c, resp.status, 429, "{}", resp.text());

    // t-1 and t-2 each reached a and c, the ten reached direct; nothing else.
    let got = requests(&c, &rx, 14, PROMPT).await;
    quiet(&c, &rx, 14, Duration::from_millis(300)).await;
    let mut delivered: Vec<String> = got
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r.path_and_query,
                r.header("webhook-id").unwrap_or("")
            )
        })
        .collect();
    delivered.sort();
    let mut want: Vec<String> = ["a", "c"]
        .iter()
        .flat_map(|d| ["t-1", "t-2"].map(|id| format!("/{d} {id}")))
        .chain((0..10).map(|i| format!("/direct d-{i}")))
        .collect();
    want.sort();
    check_eq!(c, delivered, want);
}
