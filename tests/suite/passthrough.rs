//! Passthrough mode (docs/publishing.md) across the wire: the app gets the endpoint's
//! own answer (status, headers, body streamed), retried in line within
//! `passthrough_deadline`, or a JSON 502/504 naming the last outcome; and
//! nothing is journaled, so a SIGKILL after the answer sends nothing again.

use std::time::{Duration, Instant};

use serde_json::json;
use support::{Courier, Receiver, Reply, behavior, check, check_eq, metric, post, quiet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn passthrough(url: &str, extra: &str) -> String {
    support::config("orders", url, &format!("mode: passthrough\n{extra}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_then_200_gives_the_app_the_200_with_its_body_and_headers_and_journals_nothing() {
    let rx = Receiver::start(behavior(|_, n| {
        if n == 0 {
            Reply::status(503).body("busy")
        } else {
            Reply::status(200)
                .header("x-upstream", "yes")
                .json(&json!({"order": 17, "state": "created"}))
        }
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = passthrough(
        &rx.url(),
        "passthrough_deadline: 5s
         retry: { schedule: [50ms], jitter: 0 }
         status: { min_delay: { 503: 20ms } }
         signing: { secrets_from_env: [PT_WHSEC] }",
    );
    let mut c = Courier::start_with_env(
        support::courier_bin(),
        tmp.path(),
        &yaml,
        &[("PT_WHSEC", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")],
    )
    .await;

    let started = Instant::now();
    let r = post(
        &c.url("orders/v1/orders?x=1"),
        r#"{"buy":1}"#,
        &[("idempotency-key", "pt-1"), ("x-app", "a")],
    )
    .await;
    let took = started.elapsed();
    check_eq!(c, r.status, 200, "{}", r.text());
    check_eq!(c, r.json(), json!({"order": 17, "state": "created"}));
    check_eq!(c, r.header("x-upstream"), Some("yes"));
    check_eq!(c, r.header("content-type"), Some("application/json"));
    check_eq!(c, r.header("courier-delivery-attempts"), Some("2"));
    check!(c, took < Duration::from_secs(3), "took {took:?}");

    // Delivered before the app's 200, by construction: both attempts are in.
    let got = rx.received();
    check_eq!(c, got.len(), 2);
    for (i, req) in got.iter().enumerate() {
        check_eq!(c, req.path_and_query.as_str(), "/v1/orders?x=1");
        check_eq!(c, req.text(), r#"{"buy":1}"#);
        check_eq!(c, req.header("webhook-id"), Some("pt-1"));
        check_eq!(c, req.header("x-app"), Some("a"));
        check_eq!(
            c,
            req.header("courier-delivery-attempt"),
            Some(&*(i + 1).to_string())
        );
        check!(
            c,
            req.header("webhook-signature")
                .is_some_and(|s| s.starts_with("v1,")),
            "attempt {} is signed",
            i + 1
        );
    }

    // Nothing was journaled: no acceptance, nothing pending, and a SIGKILL
    // and restart send nothing again.
    let admin = c.admin_url();
    let accepted = r#"courier_events_accepted_total{destination="orders"}"#;
    check_eq!(c, metric(&admin, accepted).await, Some(0.0));
    let pending = r#"courier_events_pending{destination="orders"}"#;
    check_eq!(c, metric(&admin, pending).await, Some(0.0));
    let busy = r#"courier_delivery_attempts_total{destination="orders",outcome="Busy",mode="passthrough"}"#;
    check_eq!(c, metric(&admin, busy).await, Some(1.0));
    let delivered = r#"courier_delivery_attempts_total{destination="orders",outcome="Delivered",mode="passthrough"}"#;
    check_eq!(c, metric(&admin, delivered).await, Some(1.0));
    c.wait_for_log("passed through", Duration::from_secs(5))
        .await;
    c.kill();
    c.restart().await;
    quiet(&c, &rx, 2, Duration::from_millis(1500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_gives_502_after_in_line_retries_within_the_deadline() {
    let (_held, port) = support::refusing_port();
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = passthrough(
        &format!("http://127.0.0.1:{port}/hook"),
        "passthrough_deadline: 1s
         timeout: 500ms
         retry: { schedule: [100ms], jitter: 0 }",
    );
    let c = Courier::start(tmp.path(), &yaml).await;
    let started = Instant::now();
    let r = post(&c.url("orders"), "{}", &[]).await;
    let took = started.elapsed();
    check_eq!(c, r.status, 502, "{}", r.text());
    let body = r.json();
    check_eq!(c, body["reason"], "upstream_unreachable");
    check_eq!(c, body["last_outcome"], "SocketError");
    let attempts = body["attempts"].as_u64().unwrap_or(0);
    // Refused at once, then every 100 ms: about ten fit in the second.
    check!(c, (5..=11).contains(&attempts), "{body}");
    check_eq!(
        c,
        r.header("courier-delivery-attempts"),
        Some(&*attempts.to_string())
    );
    // No later than the deadline plus one timeout.
    check!(c, took < Duration::from_millis(1500), "took {took:?}");
    let series = r#"courier_delivery_attempts_total{destination="orders",outcome="SocketError",mode="passthrough"}"#;
    check_eq!(
        c,
        metric(&c.admin_url(), series).await,
        Some(attempts as f64)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_endpoint_gives_504_at_the_deadline() {
    let rx = Receiver::start(behavior(|_, _| Reply::hang())).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = passthrough(&rx.url(), "passthrough_deadline: 800ms\ntimeout: 30s");
    let c = Courier::start(tmp.path(), &yaml).await;
    let started = Instant::now();
    let r = post(&c.url("orders"), "{}", &[]).await;
    let took = started.elapsed();
    check_eq!(c, r.status, 504, "{}", r.text());
    let body = r.json();
    check_eq!(c, body["reason"], "upstream_timeout");
    check_eq!(c, body["last_outcome"], "TimedOut");
    check_eq!(c, body["attempts"], 1);
    check!(
        c,
        took >= Duration::from_millis(800) && took < Duration::from_millis(1800),
        "took {took:?}"
    );
    check_eq!(c, rx.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_400_is_handed_back_at_once_and_never_retried_or_dead_lettered() {
    let rx = Receiver::start(behavior(|_, _| {
        Reply::status(400).json(&json!({"error": "no such sku"}))
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = passthrough(&rx.url(), "retry: { schedule: [50ms], jitter: 0 }");
    let c = Courier::start(tmp.path(), &yaml).await;
    let r = post(&c.url("orders"), r#"{"sku":"x"}"#, &[]).await;
    check_eq!(c, r.status, 400, "{}", r.text());
    check_eq!(c, r.json(), json!({"error": "no such sku"}));
    check_eq!(c, r.header("courier-delivery-attempts"), Some("1"));
    // Ten times the schedule's delay: a retry would have come.
    quiet(&c, &rx, 1, Duration::from_millis(500)).await;
    let dl = support::files_under(&tmp.path().join("dl"));
    check!(c, dl.is_empty(), "dead letters: {dl:?}");
    let listed = support::get(&format!("{}/v1/destinations", c.admin_url())).await;
    check_eq!(
        c,
        listed.json()["destinations"][0]["mode"],
        "passthrough",
        "{}",
        listed.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_past_the_deadline_hands_back_the_429_at_once() {
    let rx = Receiver::start(behavior(|_, _| {
        Reply::status(429)
            .header("retry-after", "5")
            .body("slow down")
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = passthrough(
        &rx.url(),
        "passthrough_deadline: 2s\nretry: { schedule: [50ms], jitter: 0 }",
    );
    let c = Courier::start(tmp.path(), &yaml).await;
    let started = Instant::now();
    let r = post(&c.url("orders"), "{}", &[]).await;
    let took = started.elapsed();
    check_eq!(c, r.status, 429, "{}", r.text());
    check_eq!(c, r.text(), "slow down");
    check_eq!(c, r.header("retry-after"), Some("5"));
    check!(c, took < Duration::from_secs(1), "took {took:?}");
    check_eq!(c, rx.count(), 1);
}

/// The endpoint's body reaches the app while the endpoint is still sending
/// it: the endpoint holds back its last chunk until the app has the first,
/// and then 1.5 s more, longer than a keep-alive connection waits before it
/// rests (`server::rest::REST_AFTER`): an answer still being sent is not
/// idle (its connection was taken back from hyper mid-body, the app left
/// with the first chunk).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_body_is_streamed_not_buffered() {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/stream", upstream.local_addr().expect("addr"));
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let endpoint = tokio::spawn(async move {
        let (mut s, _) = upstream.accept().await.expect("accept");
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        // Bounded: the request is a few hundred bytes.
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.expect("read the request");
            assert!(n > 0, "closed before the request ended");
            seen.extend_from_slice(&buf[..n]);
        }
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n";
        s.write_all(format!("{head}5\r\nfirst\r\n").as_bytes())
            .await
            .expect("write the first chunk");
        let _ = tokio::time::timeout(Duration::from_secs(10), released).await;
        s.write_all(b"4\r\nlast\r\n0\r\n\r\n")
            .await
            .expect("write the rest");
    });
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &passthrough(&url, "")).await;

    let ingress = c.url("");
    let addr = ingress.trim_start_matches("http://").trim_end_matches('/');
    let mut app = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to courier");
    app.write_all(b"POST /orders HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .expect("send");
    let mut got = Vec::new();
    let first = read_until(&mut app, &mut got, b"first").await;
    let text = String::from_utf8_lossy(&got).into_owned();
    check!(
        c,
        first,
        "the first chunk did not arrive before the last was sent: {text:?}"
    );
    check!(c, !text.contains("last"), "{text:?}");
    check!(c, text.starts_with("HTTP/1.1 200"), "{text:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _ = release.send(());
    let rest = read_until(&mut app, &mut got, b"0\r\n\r\n").await;
    let text = String::from_utf8_lossy(&got).into_owned();
    check!(c, rest && text.contains("last"), "{text:?}");
    let _ = endpoint.await;
}

/// Reads from `stream` into `got` until it holds `needle`; false if the
/// stream ends or 5 s pass first.
async fn read_until(stream: &mut tokio::net::TcpStream, got: &mut Vec<u8>, needle: &[u8]) -> bool {
    let mut buf = [0u8; 4096];
    let read = async {
        while !got.windows(needle.len()).any(|w| w == needle) {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        true
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .unwrap_or(false)
}

/// SIGTERM while the app waits for its endpoint: the request gets the
/// shutdown grace like an attempt in flight, so the app gets the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_waiting_request_have_its_answer() {
    let rx = Receiver::start(behavior(|_, _| {
        Reply::status(201)
            .body("made")
            .delay(Duration::from_millis(4500))
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    // Longer than the servers' own 2 s drain, well within the grace.
    let yaml = passthrough(&rx.url(), "").replace("log:", "shutdown_grace: 8s\nlog:");
    let mut c = Courier::start(tmp.path(), &yaml).await;
    let url = c.url("orders");
    let waiting = tokio::spawn(async move { post(&url, "{}", &[]).await });
    rx.wait_for(1, Duration::from_secs(5)).await;
    c.terminate();
    let r = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("answered within the grace")
        .expect("join");
    check_eq!(c, r.status, 201, "{}", r.text());
    check_eq!(c, r.text(), "made");
    let status = c.wait_exit(Duration::from_secs(10)).await;
    check!(c, status.success(), "{status}");
    check!(
        c,
        !c.logs().contains("passthrough requests still waiting"),
        "the grace was not needed in full"
    );
}

/// A reload switches a destination between the modes, each way, without a
/// restart: the next request takes the new mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_switches_between_passthrough_and_durable() {
    let rx = Receiver::start(behavior(|_, _| {
        Reply::status(200).body("from the endpoint")
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &passthrough(&rx.url(), "")).await;
    let reload = |yaml: String, n: usize| {
        let path = c.config_path().to_path_buf();
        let logs = || c.logs().matches("config reloaded").count();
        async move {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, yaml).expect("write the new config");
            std::fs::rename(&tmp, &path).expect("swap it in");
            let deadline = Instant::now() + Duration::from_secs(10);
            while logs() < n && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            logs() >= n
        }
    };
    let r = post(&c.url("orders"), "{}", &[("idempotency-key", "a")]).await;
    check_eq!(
        c,
        (r.status, r.text()),
        (200, "from the endpoint".to_string())
    );

    let reloaded = reload(support::config("orders", &rx.url(), ""), 1).await;
    check!(c, reloaded, "no reload to durable");
    let r = post(&c.url("orders"), "{}", &[("idempotency-key", "b")]).await;
    check_eq!(c, r.status, 202, "{}", r.text());
    check_eq!(c, r.json()["ids"], json!(["b"]));
    rx.wait_for(2, Duration::from_secs(10)).await;

    let reloaded = reload(passthrough(&rx.url(), ""), 2).await;
    check!(c, reloaded, "no reload back to passthrough");
    let r = post(&c.url("orders"), "{}", &[("idempotency-key", "c")]).await;
    check_eq!(
        c,
        (r.status, r.text()),
        (200, "from the endpoint".to_string())
    );
    check_eq!(c, rx.count(), 3);
}

/// An answered attempt, then one the deadline cuts: 504, naming the status
/// the app would otherwise never see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_504_names_an_earlier_attempts_status() {
    let rx = Receiver::start(behavior(|_, n| {
        if n == 0 {
            Reply::status(503)
        } else {
            Reply::hang()
        }
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = passthrough(
        &rx.url(),
        "passthrough_deadline: 1s
         retry: { schedule: [50ms], jitter: 0 }
         status: { min_delay: { 503: 0s } }",
    );
    let c = Courier::start(tmp.path(), &yaml).await;
    let r = post(&c.url("orders"), "{}", &[]).await;
    check_eq!(c, r.status, 504, "{}", r.text());
    let body = r.json();
    check_eq!(c, body["attempts"], 2, "{body}");
    check_eq!(c, body["last_outcome"], "TimedOut", "{body}");
    check_eq!(c, body["last_status"], 503, "{body}");
}

/// An answer cut off mid-body (the endpoint promised 100 bytes, sent 10 and
/// closed) is counted as the `SocketError` it is, never as `Delivered`; a
/// whole answer is `Delivered`. Red when the attempt is counted at its head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_cut_off_mid_body_is_not_counted_delivered() {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/cut", upstream.local_addr().expect("addr"));
    let endpoint = tokio::spawn(async move {
        for answer in [
            "HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789",
            "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789",
        ] {
            let (mut s, _) = upstream.accept().await.expect("accept");
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            // Bounded: the request is a few hundred bytes.
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.expect("read the request");
                assert!(n > 0, "closed before the request ended");
                seen.extend_from_slice(&buf[..n]);
            }
            s.write_all(answer.as_bytes()).await.expect("answer");
            // Dropping `s` closes the connection: the first answer is cut.
        }
    });
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(tmp.path(), &passthrough(&url, "")).await;
    let series = |outcome: &str| {
        format!(
            r#"courier_delivery_attempts_total{{destination="orders",outcome="{outcome}",mode="passthrough"}}"#
        )
    };
    let cut = support::client::try_post(&c.url("orders"), "{}", &[]).await;
    check!(
        c,
        cut.is_err(),
        "a cut answer reached the app whole: {cut:?}"
    );
    support::wait_metric(&c, &series("SocketError"), 1.0, Duration::from_secs(5)).await;
    check_eq!(c, metric(&c.admin_url(), &series("Delivered")).await, None);
    let whole = post(&c.url("orders"), "{}", &[]).await;
    check_eq!(c, whole.status, 200);
    check_eq!(c, whole.text(), "0123456789");
    support::wait_metric(&c, &series("Delivered"), 1.0, Duration::from_secs(5)).await;
    let _ = endpoint.await;
}
