//! Ingress (docs/publishing.md) and the admin surface (docs/http-api.md) against a real courier
//! over real HTTP: refusals store nothing, the journal limit is exact and
//! survives a restart, ids come from the app's headers, and SIGTERM drains.

use std::time::{Duration, Instant};

use http::Method;
use support::client::{metrics_text, request, sum_metric, try_request};
use support::{Courier, Receiver, Reply, get, json_body, metric, metric_sum, post, run_cli};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(5);

/// A config with one `orders` destination at `{url}/hooks` (plus any
/// `extra_dest` lines under it) and `extra_top` top-level keys.
fn config(url: &str, extra_top: &str, extra_dest: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nlog: {{ level: info }}\njournal: {{ dir: ./journal }}\n{extra_top}destinations:\n  orders:\n    url: {url}/hooks\n{extra_dest}"
    )
}

/// An endpoint that always fails, and a schedule that keeps the events
/// pending for an hour after their first attempt.
const HOLD: &str = "    retry: { schedule: [1h] }\n";

async fn pending(c: &Courier) -> f64 {
    metric(
        &c.admin_url(),
        "courier_events_pending{destination=\"orders\"}",
    )
    .await
    .unwrap_or_else(|| panic!("no pending gauge; logs:\n{}", c.logs()))
}

async fn accepted(c: &Courier) -> f64 {
    metric_sum(&c.admin_url(), "courier_events_accepted_total").await
}

/// Asserts that a refusal is a JSON object with a non-empty `error`.
fn error_json(resp: &support::client::Resp, c: &Courier) -> serde_json::Value {
    assert_eq!(
        resp.header("content-type"),
        Some("application/json"),
        "{resp:?}\nlogs:\n{}",
        c.logs()
    );
    let body = resp.json();
    assert!(
        body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "no error text: {body}\nlogs:\n{}",
        c.logs()
    );
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_destination_is_404_listing_the_configured_names() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::ok().await;
    let yaml = format!(
        "{}  billing:\n    url: {}/billing\n",
        config(&rx.url(), "", ""),
        rx.url()
    );
    let c = Courier::start(dir.path(), &yaml).await;

    let resp = post(&c.url("shipping/created?x=1"), "{\"a\":1}", &[]).await;
    assert_eq!(resp.status, 404, "{}\nlogs:\n{}", resp.text(), c.logs());
    let body = error_json(&resp, &c);
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("shipping"),
        "{body}"
    );
    let mut names: Vec<String> = body["destinations"]
        .as_array()
        .unwrap_or_else(|| panic!("no destinations list: {body}"))
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["billing", "orders"], "{body}");

    // The root path is not a destination either.
    let resp = post(&c.url(""), "x", &[]).await;
    assert_eq!(resp.status, 404, "{}\nlogs:\n{}", resp.text(), c.logs());

    let text = metrics_text(&c.admin_url()).await;
    assert_eq!(
        sum_metric(&text, "courier_events_accepted_total"),
        0.0,
        "{text}"
    );
    assert_eq!(
        support::client::find_metric(
            &text,
            "courier_ingress_rejected_total{destination=\"\",reason=\"unknown_destination\"}"
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(pending(&c).await, 0.0);
    rx.assert_quiet(0, Duration::from_millis(300)).await;
}

/// Sends one HTTP/1.1 request with a chunked body over a raw connection
/// (the pooled client always sends a Content-Length) and returns the status
/// and body of the answer.
async fn post_chunked(
    url_addr: std::net::SocketAddr,
    path: &str,
    chunks: &[Vec<u8>],
) -> (u16, String) {
    let mut raw = format!(
        "POST {path} HTTP/1.1\r\nHost: {url_addr}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    for chunk in chunks {
        raw.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        raw.extend_from_slice(chunk);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(url_addr).await?;
        stream.write_all(&raw).await?;
        let mut answer = Vec::new();
        // Connection: close, so the answer ends at end of file (a reset
        // after the answer is fine too).
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                Err(_) if !answer.is_empty() => break,
                Err(e) => return Err(e),
            }
        }
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(WAIT, exchange)
        .await
        .expect("chunked request: no answer in time")
        .expect("chunked request failed");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_over_max_body_bytes_is_413_with_or_without_content_length() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::ok().await;
    let c = Courier::start(
        dir.path(),
        &config(&rx.url(), "ingress: { max_body_bytes: 1KiB }\n", ""),
    )
    .await;

    // Declared length one byte over.
    let resp = post(
        &c.url("orders"),
        json_body(1025, 1),
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(resp.status, 413, "{}\nlogs:\n{}", resp.text(), c.logs());
    let body = error_json(&resp, &c);
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("max_body_bytes"),
        "{body}"
    );

    // Chunked: no length up front; found out while reading.
    let big: Vec<Vec<u8>> = (0..3).map(|_| vec![b'x'; 400]).collect();
    let (status, text) = post_chunked(c.ingress_addr(), "/orders", &big).await;
    assert_eq!(status, 413, "{text}\nlogs:\n{}", c.logs());
    let body: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("413 body is not JSON ({e}): {text:?}"));
    assert!(body["error"].is_string(), "{body}");

    assert_eq!(pending(&c).await, 0.0, "logs:\n{}", c.logs());
    assert_eq!(accepted(&c).await, 0.0, "logs:\n{}", c.logs());
    assert_eq!(
        metric(
            &c.admin_url(),
            "courier_ingress_rejected_total{destination=\"orders\",reason=\"too_large\"}"
        )
        .await,
        Some(2.0),
        "logs:\n{}",
        c.logs()
    );
    rx.assert_quiet(0, Duration::from_millis(300)).await;

    // The limit is inclusive, and chunked bodies within it are accepted.
    let resp = post(&c.url("orders"), json_body(1024, 2), &[]).await;
    assert_eq!(resp.status, 202, "{}\nlogs:\n{}", resp.text(), c.logs());
    let small: Vec<Vec<u8>> = vec![b"{\"chunked\":".to_vec(), b"true}".to_vec()];
    let (status, text) = post_chunked(c.ingress_addr(), "/orders", &small).await;
    assert_eq!(status, 202, "{text}\nlogs:\n{}", c.logs());
    let got = rx.wait_for(2, WAIT).await;
    let bodies: Vec<String> = got.iter().map(|r| r.text()).collect();
    assert!(
        bodies.contains(&"{\"chunked\":true}".to_owned()),
        "{bodies:?}"
    );
    assert!(bodies.iter().any(|b| b.len() == 1024), "{bodies:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_full_is_503_and_exactly_the_accepted_events_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::sequence(vec![Reply::status(500)]).await;
    let mut c = Courier::start(
        dir.path(),
        &config(&rx.url(), "", HOLD).replace(
            "journal: { dir: ./journal }",
            "journal: { dir: ./journal, max_bytes: 2KiB }",
        ),
    )
    .await;

    let mut ids: Vec<String> = Vec::new();
    let mut refused = None;
    for seq in 0..20u64 {
        let resp = post(&c.url("orders"), json_body(1024, seq), &[]).await;
        match resp.status {
            202 => ids.push(resp.json()["ids"][0].as_str().expect("id").to_owned()),
            _ => {
                refused = Some(resp);
                break;
            }
        }
    }
    let refused = refused
        .unwrap_or_else(|| panic!("20 KiB accepted into a 2 KiB journal; logs:\n{}", c.logs()));
    assert_eq!(
        refused.status,
        503,
        "{}\nlogs:\n{}",
        refused.text(),
        c.logs()
    );
    let retry_after = refused
        .header("retry-after")
        .unwrap_or_else(|| panic!("503 without Retry-After: {refused:?}\nlogs:\n{}", c.logs()));
    assert!(
        retry_after.parse::<u64>().is_ok_and(|s| s > 0),
        "Retry-After {retry_after:?}"
    );
    let body = error_json(&refused, &c);
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("max_bytes"),
        "{body}"
    );
    assert!(
        !ids.is_empty(),
        "not even one 1 KiB event fit; logs:\n{}",
        c.logs()
    );

    // A smaller event still fits: admission counts bytes, it is not a latch.
    let resp = post(&c.url("orders"), "{\"small\":true}", &[]).await;
    assert_eq!(resp.status, 202, "{}\nlogs:\n{}", resp.text(), c.logs());
    ids.push(resp.json()["ids"][0].as_str().expect("id").to_owned());
    let n = ids.len() as f64;

    assert_eq!(accepted(&c).await, n, "logs:\n{}", c.logs());
    assert_eq!(pending(&c).await, n, "logs:\n{}", c.logs());
    assert_eq!(
        metric(
            &c.admin_url(),
            "courier_ingress_rejected_total{destination=\"orders\",reason=\"journal_full\"}"
        )
        .await,
        Some(1.0),
        "logs:\n{}",
        c.logs()
    );
    let bytes = metric(
        &c.admin_url(),
        "courier_journal_bytes{destination=\"orders\"}",
    )
    .await
    .unwrap_or_default();
    assert!(bytes > 1024.0 && bytes <= 2048.0, "journal bytes {bytes}");
    // Their first attempts fail; they stay pending for an hour.
    rx.wait_for(ids.len(), WAIT).await;

    c.terminate();
    let status = c.wait_exit(WAIT).await;
    assert_eq!(status.code(), Some(0), "logs:\n{}", c.logs());

    let jdir = dir.path().join("journal");
    let out = run_cli(
        None,
        &["journal", "inspect", "--dir", jdir.to_str().unwrap()],
        &[],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    let row = out
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some("orders"))
        .unwrap_or_else(|| panic!("no orders row: {out:?}"));
    assert_eq!(
        row.split_whitespace().nth(1),
        Some(ids.len().to_string().as_str()),
        "{out:?}"
    );

    c.restart().await;
    assert_eq!(pending(&c).await, n, "logs:\n{}", c.logs());
    // Still full after the restart: the pending bytes were recovered.
    let resp = post(&c.url("orders"), json_body(1024, 99), &[]).await;
    assert_eq!(resp.status, 503, "{}\nlogs:\n{}", resp.text(), c.logs());
    assert_eq!(pending(&c).await, n, "logs:\n{}", c.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn journal_max_bytes_holds_under_concurrent_requests() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::sequence(vec![Reply::status(500)]).await;
    let c = Courier::start(
        dir.path(),
        &config(&rx.url(), "", HOLD).replace(
            "journal: { dir: ./journal }",
            "journal: { dir: ./journal, max_bytes: 2KiB }",
        ),
    )
    .await;
    let url = c.url("orders");
    let posts: Vec<_> = (0..20u64)
        .map(|seq| {
            let url = url.clone();
            tokio::spawn(async move { post(&url, json_body(1024, seq), &[]).await.status })
        })
        .collect();
    let mut statuses = Vec::new();
    for p in posts {
        statuses.push(p.await.expect("post task"));
    }
    let ok = statuses.iter().filter(|s| **s == 202).count();
    assert!(
        statuses.iter().all(|s| *s == 202 || *s == 503),
        "{statuses:?}"
    );
    let bytes = metric(
        &c.admin_url(),
        "courier_journal_bytes{destination=\"orders\"}",
    )
    .await
    .unwrap_or_default();
    assert!(
        bytes <= 2048.0,
        "{ok} of 20 concurrent 1 KiB events accepted: {bytes} pending bytes in a journal limited to 2 KiB (journal.max_bytes)\nlogs:\n{}",
        c.logs()
    );
    assert_eq!(accepted(&c).await, ok as f64);
    // And no fewer than fit: with `ok` events of the same size stored, a
    // refused one would not have fitted either (admission must not refuse
    // while the journal has room, e.g. by leaking reservations).
    assert!(ok >= 1, "none of 20 events accepted; logs:\n{}", c.logs());
    let per_event = bytes / ok as f64;
    assert!(
        ok == 20 || bytes + per_event > 2048.0,
        "only {ok} of 20 accepted with {bytes} of 2048 bytes used: room was left for one more ({per_event} bytes each)\nlogs:\n{}",
        c.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_methods_are_405_with_allow() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::ok().await;
    let c = Courier::start(dir.path(), &config(&rx.url(), "", "")).await;
    for method in [Method::GET, Method::DELETE, Method::HEAD] {
        let resp = request(method.clone(), &c.url("orders/x"), "", &[]).await;
        assert_eq!(resp.status, 405, "{method}: {resp:?}\nlogs:\n{}", c.logs());
        let allow = resp
            .header("allow")
            .unwrap_or_else(|| panic!("{method}: no Allow: {resp:?}"));
        for m in ["POST", "PUT", "PATCH"] {
            assert!(allow.contains(m), "{method}: Allow {allow:?}");
        }
        if method != Method::HEAD {
            error_json(&resp, &c);
        }
    }
    for method in [Method::PUT, Method::PATCH] {
        let resp = request(method.clone(), &c.url("orders"), "{}", &[]).await;
        assert_eq!(resp.status, 202, "{method}: {resp:?}\nlogs:\n{}", c.logs());
    }
    let got = rx.wait_for(2, WAIT).await;
    let mut methods: Vec<String> = got.iter().map(|r| r.method.to_string()).collect();
    methods.sort();
    assert_eq!(methods, ["PATCH", "PUT"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_id_comes_from_idempotency_key_then_webhook_id() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::ok().await;
    let c = Courier::start(dir.path(), &config(&rx.url(), "", "")).await;

    let resp = post(&c.url("orders/a"), "1", &[("webhook-id", "msg_2Kx")]).await;
    assert_eq!(resp.status, 202, "{}\nlogs:\n{}", resp.text(), c.logs());
    assert_eq!(
        resp.json(),
        serde_json::json!({"accepted": 1, "ids": ["msg_2Kx"]})
    );

    let resp = post(
        &c.url("orders/b"),
        "2",
        &[("idempotency-key", "key-7"), ("webhook-id", "msg_other")],
    )
    .await;
    assert_eq!(resp.status, 202, "{}\nlogs:\n{}", resp.text(), c.logs());
    assert_eq!(resp.json()["ids"], serde_json::json!(["key-7"]));

    let resp = post(&c.url("orders/c"), "3", &[]).await;
    assert_eq!(resp.status, 202, "{}\nlogs:\n{}", resp.text(), c.logs());
    let generated = resp.json()["ids"][0].as_str().expect("id").to_owned();
    assert_eq!(generated.len(), 36, "{generated}");
    assert_eq!(&generated[14..15], "7", "a UUIDv7: {generated}");

    let got = rx.wait_for(3, WAIT).await;
    let by_path = |p: &str| {
        got.iter()
            .find(|r| r.path_and_query == p)
            .unwrap_or_else(|| panic!("nothing delivered to {p}: {got:?}"))
    };
    assert_eq!(by_path("/hooks/a").header("webhook-id"), Some("msg_2Kx"));
    assert_eq!(by_path("/hooks/b").header("webhook-id"), Some("key-7"));
    assert_eq!(
        by_path("/hooks/c").header("webhook-id"),
        Some(generated.as_str())
    );

    // Unusable ids are a 400 and nothing is stored.
    let long = "k".repeat(257);
    for (name, value) in [
        ("idempotency-key", ""),
        ("webhook-id", ""),
        ("idempotency-key", long.as_str()),
    ] {
        let resp = post(&c.url("orders"), "x", &[(name, value)]).await;
        assert_eq!(
            resp.status,
            400,
            "{name}={value:?}: {resp:?}\nlogs:\n{}",
            c.logs()
        );
        let body = error_json(&resp, &c);
        assert!(
            body["error"]
                .as_str()
                .unwrap_or_default()
                .to_ascii_lowercase()
                .contains(name),
            "{name}: {body}"
        );
    }
    assert_eq!(accepted(&c).await, 3.0, "logs:\n{}", c.logs());
    rx.assert_quiet(3, Duration::from_millis(300)).await;
}

async fn status_of(url: &str) -> Result<u16, String> {
    try_request(Method::GET, url, "", &[])
        .await
        .map(|r| r.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_within_the_grace_and_keeps_the_event_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let hang = Receiver::start(support::behavior(|_, _| Reply::hang())).await;
    let mut c = Courier::start(dir.path(), &config(&hang.url(), "shutdown_grace: 1s\n", "")).await;
    let readyz = format!("{}/readyz", c.admin_url());
    assert_eq!(get(&readyz).await.status, 200, "logs:\n{}", c.logs());

    let resp = post(
        &c.url("orders"),
        "{\"keep\":1}",
        &[("idempotency-key", "keep-me")],
    )
    .await;
    assert_eq!(resp.status, 202, "{}\nlogs:\n{}", resp.text(), c.logs());
    hang.wait_for(1, WAIT).await; // the attempt is now in flight

    let term_at = Instant::now();
    c.terminate();
    // During the grace: /readyz turns 503, then ingress refuses new events
    // with 503 + Retry-After (polling /readyz first, so that no event is
    // accepted just before the signal is handled).
    let mut ready = status_of(&readyz).await;
    while ready == Ok(200) && term_at.elapsed() < Duration::from_millis(800) {
        tokio::time::sleep(Duration::from_millis(5)).await;
        ready = status_of(&readyz).await;
    }
    assert_eq!(
        ready,
        Ok(503),
        "readyz {:?} after SIGTERM; logs:\n{}",
        term_at.elapsed(),
        c.logs()
    );
    let refused = try_request(
        Method::POST,
        &c.url("orders"),
        "{\"late\":1}",
        &[("idempotency-key", "late")],
    )
    .await
    .unwrap_or_else(|e| panic!("ingress closed during the grace: {e}\nlogs:\n{}", c.logs()));
    assert_eq!(refused.status, 503, "{refused:?}\nlogs:\n{}", c.logs());
    assert!(refused.header("retry-after").is_some(), "{refused:?}");
    error_json(&refused, &c);
    assert!(
        term_at.elapsed() < Duration::from_secs(1),
        "checks took too long to fall inside the grace: {:?}",
        term_at.elapsed()
    );

    let status = c.wait_exit(Duration::from_secs(3)).await;
    let took = term_at.elapsed();
    assert_eq!(status.code(), Some(0), "logs:\n{}", c.logs());
    assert!(
        took >= Duration::from_millis(900),
        "exited after {took:?}, before the 1s grace ran out although an attempt was in flight; logs:\n{}",
        c.logs()
    );
    assert!(took < Duration::from_secs(3), "exited after {took:?}");

    // The event in flight is still pending; the refused one was not stored.
    let ok = Receiver::ok().await;
    let yaml = std::fs::read_to_string(c.config_path()).expect("config");
    std::fs::write(c.config_path(), yaml.replace(&hang.url(), &ok.url())).expect("config");
    c.restart().await;
    let got = ok.wait_for(1, WAIT).await;
    assert_eq!(
        got[0].header("webhook-id"),
        Some("keep-me"),
        "logs:\n{}",
        c.logs()
    );
    assert_eq!(got[0].text(), "{\"keep\":1}");
    // The attempt cut off by the shutdown is not counted (README).
    assert_eq!(
        got[0].header("courier-delivery-attempt"),
        Some("1"),
        "{got:?}\nlogs:\n{}",
        c.logs()
    );
    ok.assert_quiet(1, Duration::from_millis(500)).await;
    let deadline = Instant::now() + WAIT;
    while pending(&c).await != 0.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(pending(&c).await, 0.0, "logs:\n{}", c.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_journal_sync_histogram() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::ok().await;
    let c = Courier::start(dir.path(), &config(&rx.url(), "", "")).await;
    let health = get(&format!("{}/healthz", c.admin_url())).await;
    assert_eq!(health.status, 200, "logs:\n{}", c.logs());
    let ready = get(&format!("{}/readyz", c.admin_url())).await;
    assert_eq!(ready.status, 200, "logs:\n{}", c.logs());

    let resp = post(&c.url("orders"), "{}", &[]).await;
    assert_eq!(resp.status, 202, "{}\nlogs:\n{}", resp.text(), c.logs());
    let text = metrics_text(&c.admin_url()).await;
    assert!(
        text.contains("courier_journal_sync_duration_seconds_bucket"),
        "{text}"
    );
    assert!(
        sum_metric(&text, "courier_journal_sync_duration_seconds_count") >= 1.0,
        "{text}"
    );
    assert_eq!(
        support::client::find_metric(
            &text,
            "courier_events_accepted_total{destination=\"orders\"}"
        ),
        Some(1.0),
        "{text}"
    );
    rx.wait_for(1, WAIT).await;
}

/// A client that writes its whole request before it reads the answer, as
/// Python's, Node's and the Azure SDKs' do, on one kept-alive connection.
struct WritesFirst {
    stream: tokio::net::TcpStream,
    host: std::net::SocketAddr,
    /// Bytes read past the last answer.
    read: Vec<u8>,
}

impl WritesFirst {
    async fn connect(host: std::net::SocketAddr) -> WritesFirst {
        let stream = tokio::net::TcpStream::connect(host).await.expect("connect");
        WritesFirst {
            stream,
            host,
            read: Vec::new(),
        }
    }

    /// Sends `POST path` with `headers` and `body` (chunked when
    /// `chunked`) and returns the answer's status and body; an error when
    /// the connection broke before the answer came whole.
    async fn post(
        &mut self,
        path: &str,
        headers: &str,
        body: &[u8],
        chunked: bool,
    ) -> std::io::Result<(u16, String)> {
        let framing = if chunked {
            "Transfer-Encoding: chunked".to_string()
        } else {
            format!("Content-Length: {}", body.len())
        };
        let mut raw = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n{framing}\r\n{headers}\r\n",
            self.host
        )
        .into_bytes();
        if chunked {
            for chunk in body.chunks(64 * 1024) {
                raw.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                raw.extend_from_slice(chunk);
                raw.extend_from_slice(b"\r\n");
            }
            raw.extend_from_slice(b"0\r\n\r\n");
        } else {
            raw.extend_from_slice(body);
        }
        self.stream.write_all(&raw).await?;
        self.answer().await
    }

    /// Reads one answer: its head, then `Content-Length` bytes of body.
    async fn answer(&mut self) -> std::io::Result<(u16, String)> {
        let broken = |what: &str| std::io::Error::new(std::io::ErrorKind::UnexpectedEof, what);
        let mut buf = [0u8; 8192];
        let head_end = loop {
            if let Some(i) = self.read.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match self.stream.read(&mut buf).await? {
                0 => return Err(broken("closed before the answer's head")),
                n => self.read.extend_from_slice(&buf[..n]),
            }
        };
        let head = String::from_utf8_lossy(&self.read[..head_end]).to_lowercase();
        let status: u16 = head
            .get(9..12)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| broken("no status"))?;
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while self.read.len() < head_end + length {
            match self.stream.read(&mut buf).await? {
                0 => return Err(broken("closed within the answer's body")),
                n => self.read.extend_from_slice(&buf[..n]),
            }
        }
        let body = String::from_utf8_lossy(&self.read[head_end..head_end + length]).into_owned();
        self.read.drain(..head_end + length);
        Ok((status, body))
    }
}

fn answered(r: std::io::Result<(u16, String)>, what: &str, c: &Courier) -> (u16, String) {
    r.unwrap_or_else(|e| panic!("{what}: no answer ({e}); logs:\n{}", c.logs()))
}

/// Refusals made before the body is read (by its headers, or past
/// `max_body_bytes` while reading) reach a client that writes the whole
/// body first: the rest of the body is read and dropped after the answer
/// (a lingering close). Without it hyper closed the connection with the
/// body unread, the kernel reset it, and such a client saw a broken
/// connection instead of the 404, 413 or 503 that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_before_the_body_is_read_reach_a_client_that_writes_its_body_first() {
    let dir = tempfile::tempdir().unwrap();
    let hang = Receiver::start(support::behavior(|_, _| Reply::hang())).await;
    let mut c = Courier::start(
        dir.path(),
        &config(
            &hang.url(),
            "shutdown_grace: 3s\ningress: { max_body_bytes: 1KiB }\n",
            "",
        ),
    )
    .await;
    let big = vec![b'x'; 8 << 20];
    let mut app = WritesFirst::connect(c.ingress_addr()).await;

    let (status, body) = answered(app.post("/nope", "", &big, false).await, "404", &c);
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("\"error\""), "{body}");
    let (status, body) = answered(app.post("/orders", "", &big, false).await, "413", &c);
    assert_eq!(status, 413, "declared length: {body}");
    let (status, body) = answered(app.post("/orders", "", &big, true).await, "413", &c);
    assert_eq!(status, 413, "chunked, found while reading: {body}");
    // The bodies were read to their end: the connection goes on.
    let (status, body) = answered(
        app.post("/orders", "", b"{\"a\":1}", false).await,
        "202",
        &c,
    );
    assert_eq!(
        status, 202,
        "after the refusals, on their connection: {body}"
    );

    // A client waiting for `100 Continue` gets the refusal and sends nothing.
    let mut waits = WritesFirst::connect(c.ingress_addr()).await;
    let head = format!(
        "POST /orders HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        c.ingress_addr(),
        big.len()
    );
    waits
        .stream
        .write_all(head.as_bytes())
        .await
        .expect("write");
    let (status, body) = answered(waits.answer().await, "413 to Expect", &c);
    assert_eq!(status, 413, "no 100 Continue before it: {body}");

    // While draining, the 503 (its connection closing) reaches it too.
    hang.wait_for(1, WAIT).await;
    c.terminate();
    let readyz = format!("{}/readyz", c.admin_url());
    for _ in 0..200 {
        if status_of(&readyz).await != Ok(200) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut late = WritesFirst::connect(c.ingress_addr()).await;
    let (status, body) = answered(late.post("/orders", "", &big, false).await, "503", &c);
    assert_eq!(status, 503, "{body}");
    assert_eq!(c.wait_exit(Duration::from_secs(6)).await.code(), Some(0));
}

/// A body read after its refusal keeps its connection in the middle of
/// that request: neither given back to rest (`REST_AFTER`, 100 ms) nor
/// closed as idle while the client is still sending it. When it was,
/// the body's later bytes were parsed as a request of their own (a request
/// smuggled inside a refused body was accepted) and an honest slow client
/// got a 400 for the rest of its body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_read_after_its_refusal_is_never_parsed_as_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(support::behavior(|_, _| Reply::status(200))).await;
    let c = Courier::start(dir.path(), &config(&rx.url(), "", "")).await;
    let host = c.ingress_addr();
    let smuggled = format!(
        "POST /orders HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n{{\"smuggled\":1}}"
    );
    let first = b"0123456789";
    let mut app = WritesFirst::connect(host).await;
    let head = format!(
        "POST /nope HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        first.len() + smuggled.len()
    );
    let mut sent = head.into_bytes();
    sent.extend_from_slice(first);
    app.stream.write_all(&sent).await.expect("write");
    let (status, body) = answered(app.answer().await, "404", &c);
    assert_eq!(status, 404, "{body}");
    // The rest of the refused body comes after the connection's rest would
    // have begun.
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.stream
        .write_all(smuggled.as_bytes())
        .await
        .expect("write");
    let (status, body) = answered(
        app.post("/orders", "", b"{\"honest\":1}", false).await,
        "202",
        &c,
    );
    assert_eq!(status, 202, "the request after the refused body: {body}");
    let got = rx.wait_for(1, WAIT).await;
    assert_eq!(
        String::from_utf8_lossy(&got[0].body),
        "{\"honest\":1}",
        "the first delivered"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rx.count(), 1, "the body's bytes were delivered as an event");
}

/// A 503 `memory_budget` takes no memory: its connection is closed with the
/// body unread, not kept to read the body after the answer as other
/// refusals are (docs/publishing.md "Memory").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_over_the_memory_budget_closes_its_connection_unread() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(support::behavior(|_, _| Reply::status(200))).await;
    let c = Courier::start(
        dir.path(),
        &config(
            &rx.url(),
            "ingress: { max_body_bytes: 1MiB, max_inflight_bytes: 1MiB }\n",
            "",
        ),
    )
    .await;
    let host = c.ingress_addr();
    let head = |length: usize| {
        format!(
            "POST /orders HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n{{"
        )
    };
    // Holds the whole budget while its body does not come.
    let mut holder = tokio::net::TcpStream::connect(host).await.expect("connect");
    holder
        .write_all(head(1 << 20).as_bytes())
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut app = WritesFirst::connect(host).await;
    app.stream
        .write_all(head(1000).as_bytes())
        .await
        .expect("write");
    let (status, body) = answered(app.answer().await, "503", &c);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("memory_budget"), "{body}");
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(3), app.stream.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "the connection stays open for the rest of the body: {read:?}"
    );
    drop(holder);
}
