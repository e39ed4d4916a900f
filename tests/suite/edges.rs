//! The edges against a real courier, with raw TCP clients (docs/http-api.md "Edges"):
//! a client that sends its request head too slowly, or nothing, or goes
//! idle between requests, is disconnected at the header timeout (10 s),
//! and a body still incomplete at the body deadline (10 s) gets a 408 and
//! stores nothing. Connections that fill the admin cap and ask nothing
//! (h2c after its SETTINGS, or one byte of the preface) leave the probes
//! answering and are closed at the idle timeout. The ingress cap and a
//! handler panic are tested on the accept loop itself (src/server/tests.rs):
//! neither can be reached in a release binary without a test-only door.

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::{Courier, Receiver, config, metric, metric_sum, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The header timeout and body deadline of src/server/edge.rs.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Scheduling slack on a shared machine.
const MARGIN: Duration = Duration::from_secs(4);

/// How a raw connection ended, and when (since `start`).
#[derive(Debug)]
struct Ended {
    after: Duration,
    /// Everything the server wrote before closing.
    answer: String,
}

/// Sends `bytes` one per `pace`, reading meanwhile, until the server closes
/// the connection (EOF, reset, or a write refused) or `bytes` run out.
async fn trickle(stream: &mut TcpStream, bytes: &[u8], pace: Duration) -> Option<Ended> {
    let start = Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    for byte in bytes {
        let ended = |answer: &[u8]| Ended {
            after: start.elapsed(),
            answer: String::from_utf8_lossy(answer).into_owned(),
        };
        if stream.write_all(&[*byte]).await.is_err() {
            return Some(ended(&answer));
        }
        let until = Instant::now() + pace;
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match tokio::time::timeout(left, stream.read(&mut buf)).await {
                Err(_) => break,
                Ok(Ok(0)) | Ok(Err(_)) => return Some(ended(&answer)),
                Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            }
        }
    }
    None
}

/// Reads until EOF or reset, for at most `limit`; `None` if still open.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    let deadline = start + limit;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
    None
}

async fn accepted(c: &Courier) -> f64 {
    metric_sum(&c.admin_url(), "courier_events_accepted_total").await
}

#[tokio::test]
async fn a_slowloris_client_is_cut_off_at_the_header_timeout_while_others_are_served() {
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &config("orders", &rx.url(), "")).await;

    // Long enough to take 40 s at one byte a second.
    let head = format!(
        "POST /orders HTTP/1.1\r\nhost: 127.0.0.1\r\nx-pad: {}\r\n\r\n",
        "p".repeat(20)
    );
    let mut slow = TcpStream::connect(c.ingress_addr()).await.expect("connect");
    let url = c.url("/orders");
    let others = tokio::spawn(async move {
        let mut slowest = Duration::ZERO;
        for i in 0..20 {
            let sent = Instant::now();
            let resp = post(&url, format!("{{\"n\":{i}}}"), &[("ce-id", "x")]).await;
            assert_eq!(resp.status, 202, "{}", resp.text());
            slowest = slowest.max(sent.elapsed());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        slowest
    });
    let ended = trickle(&mut slow, head.as_bytes(), Duration::from_secs(1))
        .await
        .unwrap_or_else(|| panic!("the slowloris connection was never closed"));
    assert!(
        ended.after <= TIMEOUT + MARGIN,
        "closed only after {:?}",
        ended.after
    );
    let slowest = others.await.expect("others");
    assert!(
        slowest < Duration::from_secs(2),
        "a normal request took {slowest:?} meanwhile"
    );
}

#[tokio::test]
async fn idle_connections_are_closed_at_the_header_timeout() {
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &config("orders", &rx.url(), "")).await;

    // One request, then idle on a kept-alive connection.
    let mut kept = TcpStream::connect(c.ingress_addr()).await.expect("connect");
    let body = r#"{"n":1}"#;
    let req = format!(
        "POST /orders HTTP/1.1\r\nhost: 127.0.0.1\r\nce-id: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    kept.write_all(req.as_bytes()).await.expect("write");
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), kept.read(&mut buf))
        .await
        .expect("an answer")
        .expect("read");
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 202"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    // And one that never sends a byte.
    let mut silent = TcpStream::connect(c.ingress_addr()).await.expect("connect");

    let (kept, silent) = tokio::join!(
        closed_within(&mut kept, TIMEOUT + MARGIN),
        closed_within(&mut silent, TIMEOUT + MARGIN)
    );
    let kept = kept.unwrap_or_else(|| panic!("the idle keep-alive connection stayed open"));
    let silent = silent.unwrap_or_else(|| panic!("the silent connection stayed open"));
    // Kept alive until the timeout, not closed after each answer.
    assert!(kept >= TIMEOUT - MARGIN, "closed after {kept:?}");
    assert!(silent >= TIMEOUT - MARGIN, "closed after {silent:?}");
}

#[tokio::test]
async fn a_trickling_body_gets_408_at_the_deadline_and_stores_nothing() {
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &config("orders", &rx.url(), "")).await;

    let mut slow = TcpStream::connect(c.ingress_addr()).await.expect("connect");
    let head =
        "POST /orders HTTP/1.1\r\nhost: 127.0.0.1\r\nce-id: slow\r\ncontent-length: 1000\r\n\r\n";
    slow.write_all(head.as_bytes()).await.expect("write");
    // A byte a second: never silent long enough for a per-read timeout.
    let body = vec![b' '; 40];
    let ended = trickle(&mut slow, &body, Duration::from_secs(1))
        .await
        .unwrap_or_else(|| panic!("the slow body was never cut off"));
    assert!(
        ended.after <= TIMEOUT + MARGIN,
        "cut off after {:?}",
        ended.after
    );
    assert!(ended.answer.starts_with("HTTP/1.1 408"), "{}", ended.answer);
    let json = ended
        .answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or("");
    let json: serde_json::Value = serde_json::from_str(json).expect("a JSON body");
    assert_eq!(json["reason"], "body_timeout", "{json}");
    assert!(json["error"].is_string(), "{json}");

    let rejected = metric(
        &c.admin_url(),
        "courier_ingress_rejected_total{destination=\"orders\",reason=\"body_timeout\"}",
    )
    .await;
    assert_eq!(rejected, Some(1.0));
    assert_eq!(accepted(&c).await, 0.0);
    rx.assert_quiet(0, Duration::from_secs(1)).await;
}

/// The admin listener's connection cap (src/server/edge.rs).
const ADMIN_CAP: usize = 256;

/// The h2c preface and an empty SETTINGS frame: an HTTP/2 client that then
/// opens no stream.
const H2C_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// A `GET` of `path` on a new connection: the status line, or why none.
async fn probe(addr: SocketAddr, path: &str) -> String {
    let asked = async {
        let mut stream = TcpStream::connect(addr).await?;
        let req = format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    match tokio::time::timeout(Duration::from_secs(5), asked).await {
        Ok(Ok(answer)) => String::from_utf8_lossy(&answer)
            .lines()
            .next()
            .unwrap_or("(no answer)")
            .to_string(),
        Ok(Err(e)) => format!("(failed: {e})"),
        Err(_) => "(no answer within 5 s)".to_string(),
    }
}

/// Opens `count` connections to the admin port that each send `hello` and
/// then nothing; checks that the probes answer 200 over new connections
/// meanwhile, and that courier closes every one of them by the idle timeout
/// (those within the cap holding their slot until about then).
async fn admin_lock_out_is_survived(hello: &'static [u8], count: usize) {
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &config("orders", &rx.url(), "")).await;
    let admin = c.admin_addr();

    let start = Instant::now();
    let mut idle = Vec::with_capacity(count);
    for _ in 0..count {
        let mut stream = TcpStream::connect(admin).await.expect("connect");
        stream.write_all(hello).await.expect("write");
        idle.push(stream);
    }
    for round in 0..3 {
        for path in ["/healthz", "/readyz", "/metrics"] {
            let status = probe(admin, path).await;
            assert!(
                status.starts_with("HTTP/1.1 200"),
                "round {round}, {path} with {count} idle connections open: {status}"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        start.elapsed() < TIMEOUT - MARGIN,
        "too slow to have probed while the cap was full"
    );

    let deadline = start + TIMEOUT + MARGIN;
    let mut watches = tokio::task::JoinSet::new();
    for mut stream in idle {
        watches.spawn(async move {
            let left = deadline.saturating_duration_since(Instant::now());
            closed_within(&mut stream, left)
                .await
                .map(|_| start.elapsed())
        });
    }
    let closed = watches.join_all().await;
    let open = closed.iter().filter(|c| c.is_none()).count();
    assert_eq!(
        open,
        0,
        "{open} of {count} idle connections still open at {:?}",
        TIMEOUT + MARGIN
    );
    // The cap was full while the probes answered: the connections holding
    // it were closed by the idle timeout, not earlier.
    let held = closed
        .iter()
        .flatten()
        .filter(|at| **at >= TIMEOUT - MARGIN)
        .count();
    assert!(
        held >= ADMIN_CAP,
        "only {held} connections held a slot until the idle timeout"
    );
}

#[tokio::test]
async fn idle_h2c_connections_beyond_the_admin_cap_leave_the_probes_answering_and_are_closed() {
    admin_lock_out_is_survived(H2C_HELLO, 300).await;
}

#[tokio::test]
async fn connections_that_sent_one_byte_leave_the_probes_answering_and_are_closed() {
    admin_lock_out_is_survived(b"P", ADMIN_CAP + 4).await;
}
