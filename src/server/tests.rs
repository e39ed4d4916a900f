//! The accept loop and its layers on a loopback listener, with a raw TCP
//! client: the connection cap and what is served beyond it, a handler
//! panic answered 500, rests, and bodies read after their answers.

use super::linger::{Lingering, SLOTS};
use super::{Body, Edge, json, serve};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Answers 200, or panics on `/panic`; `/big` answers `BIG` bytes;
/// `/refuse` answers 404 before it reads the body.
async fn handler(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    assert!(req.uri().path() != "/panic", "injected panic");
    if req.uri().path() == "/refuse" {
        let (head, body) = req.into_parts();
        drop(Lingering::new(body, &head, 0));
        return Ok(json(StatusCode::NOT_FOUND, &serde_json::json!({})));
    }
    if req.uri().path() == "/big" {
        let body = bytes::Bytes::from(vec![b'x'; BIG]);
        return Ok(Response::new(Body::new(body)));
    }
    Ok(json(StatusCode::OK, &serde_json::json!({ "ok": true })))
}

/// More than loopback's socket buffers hold, so that hyper keeps part of
/// the answer until the client reads.
const BIG: usize = 48 << 20;

/// Longer than `rest::REST_AFTER`.
const PAST_REST: Duration = Duration::from_millis(1600);

async fn start(max_connections: usize) -> (SocketAddr, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = CancellationToken::new();
    let edge = Edge {
        name: "test",
        max_connections,
        served_beyond_cap: &["/healthz"],
    };
    tokio::spawn(serve(
        listener,
        tower::service_fn(handler),
        edge,
        stop.clone(),
        stop.clone(),
    ));
    (addr, stop)
}

/// Sends one GET on `stream` and reads one answer's head and (short) body.
async fn ask(stream: &mut TcpStream, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
    stream.write_all(req.as_bytes()).await.expect("write");
    read_answer(stream).await
}

/// Reads until a whole answer (head and `content-length` bytes) or EOF.
async fn read_answer(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    for _ in 0..100 {
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
        match read {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if length.is_some_and(|n| body.len() >= n) {
                break;
            }
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn beyond_the_cap_a_connection_gets_503_then_a_freed_slot_serves_again() {
    let (addr, stop) = start(1).await;
    let mut first = TcpStream::connect(addr).await.expect("connect");
    assert!(ask(&mut first, "/").await.starts_with("HTTP/1.1 200"));

    let mut second = TcpStream::connect(addr).await.expect("connect");
    let refused = ask(&mut second, "/").await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("retry-after: 1"), "{refused}");
    assert!(
        refused.contains(r#""reason":"too_many_connections""#),
        "{refused}"
    );

    drop(first);
    let mut served = false;
    for _ in 0..50 {
        let mut third = TcpStream::connect(addr).await.expect("connect");
        if ask(&mut third, "/").await.starts_with("HTTP/1.1 200") {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "the slot of a closed connection was not given back");
    stop.cancel();
}

#[tokio::test]
async fn beyond_the_cap_the_probe_paths_get_their_real_answer_once() {
    let (addr, stop) = start(1).await;
    // The slot held by a connection that sends nothing.
    let _holder = TcpStream::connect(addr).await.expect("connect");
    for _ in 0..3 {
        let mut probe = TcpStream::connect(addr).await.expect("connect");
        let answer = ask(&mut probe, "/healthz").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("connection: close"), "{answer}");
        let mut rest = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(5), probe.read_to_end(&mut rest)).await;
        assert!(matches!(closed, Ok(Ok(0))), "not closed after one answer");
    }
    let mut other = TcpStream::connect(addr).await.expect("connect");
    let refused = ask(&mut other, "/").await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    stop.cancel();
}

#[tokio::test]
async fn a_panicking_handler_answers_500_and_the_connection_keeps_serving() {
    let (addr, stop) = start(8).await;
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let panicked = ask(&mut stream, "/panic").await;
    assert!(panicked.starts_with("HTTP/1.1 500"), "{panicked}");
    assert!(
        panicked.contains(r#""reason":"internal_error""#),
        "{panicked}"
    );
    let next = ask(&mut stream, "/").await;
    assert!(next.starts_with("HTTP/1.1 200"), "{next}");
    stop.cancel();
}

#[tokio::test]
async fn a_connection_back_from_rest_is_served_even_with_a_head_cut_by_the_rest() {
    let (addr, stop) = start(8).await;
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    assert!(ask(&mut stream, "/").await.starts_with("HTTP/1.1 200"));
    tokio::time::sleep(PAST_REST).await;
    assert!(ask(&mut stream, "/").await.starts_with("HTTP/1.1 200"));
    // Half a head, a rest, the other half: the first half was read by the
    // hyper connection given up at the rest, and must reach the next one.
    stream
        .write_all(b"GET / HTTP/1.1\r\nho")
        .await
        .expect("write");
    tokio::time::sleep(PAST_REST).await;
    stream.write_all(b"st: x\r\n\r\n").await.expect("write");
    let answer = read_answer(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Two requests in one write after a rest: both answered, in order.
    tokio::time::sleep(PAST_REST).await;
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\nGET /panic HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let first = read_answer(&mut stream).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(
        first.contains("HTTP/1.1 500")
            || read_answer(&mut stream).await.starts_with("HTTP/1.1 500")
    );
    stop.cancel();
}

#[tokio::test]
async fn an_answer_the_client_has_not_read_is_not_cut_by_a_rest() {
    let (addr, stop) = start(8).await;
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    // The answer fills the socket buffers and waits in hyper meanwhile.
    tokio::time::sleep(PAST_REST * 2).await;
    let mut got = 0usize;
    let mut head = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    // Bounded: each pass reads at least a byte, or ends.
    loop {
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
        let n = match read {
            Ok(Ok(n)) if n > 0 => n,
            _ => break,
        };
        if head.len() < 4096 {
            head.extend_from_slice(&buf[..n.min(4096)]);
        }
        got += n;
        if got >= BIG {
            break;
        }
    }
    let head = String::from_utf8_lossy(&head);
    let head_len = head.find("\r\n\r\n").map_or(0, |i| i + 4);
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "{}",
        &head[..head_len.min(200)]
    );
    // Read on until the whole body is in, or the connection ends short.
    while got < BIG + head_len {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got += n,
            _ => break,
        }
    }
    assert_eq!(got, BIG + head_len, "the answer was cut");
    // And the connection still serves.
    assert!(ask(&mut stream, "/").await.starts_with("HTTP/1.1 200"));
    stop.cancel();
}

#[tokio::test]
async fn a_connection_closed_by_its_client_at_rest_gives_its_slot_back() {
    let (addr, stop) = start(1).await;
    let mut first = TcpStream::connect(addr).await.expect("connect");
    assert!(ask(&mut first, "/").await.starts_with("HTTP/1.1 200"));
    tokio::time::sleep(PAST_REST).await;
    drop(first);
    let mut served = false;
    for _ in 0..50 {
        let mut next = TcpStream::connect(addr).await.expect("connect");
        if ask(&mut next, "/").await.starts_with("HTTP/1.1 200") {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        served,
        "the slot of a connection closed at rest was not given back"
    );
    stop.cancel();
}

/// A body refused before it is read is read after the answer, the
/// connection busy meanwhile: a rest that took it apart in the middle of
/// the body parsed the rest of the body (here a request to `/panic`) as a
/// request. At most `SLOTS` bodies at once on a listener: one more is
/// cut, its connection closed as hyper does with a body left unread; a
/// read that ended gives its slot back.
#[tokio::test]
async fn bodies_read_after_their_answers_keep_their_connections_and_are_capped() {
    const FIRST: usize = 1000;
    let rest = b"GET /panic HTTP/1.1\r\nhost: x\r\n\r\n";
    let (addr, stop) = start(SLOTS + 8).await;
    let head = format!(
        "POST /refuse HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
        FIRST + rest.len()
    );
    let mut sent = head.into_bytes();
    sent.extend_from_slice(&[b'x'; FIRST]);
    let mut lingering = Vec::new();
    for _ in 0..=SLOTS {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(&sent).await.expect("write");
        let answer = read_answer(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
        lingering.push(stream);
    }
    let mut cut = lingering.pop().expect("one more than the slots");
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), cut.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "beyond the slots the connection closes: {read:?}"
    );
    tokio::time::sleep(PAST_REST).await;
    for stream in &mut lingering {
        stream.write_all(rest).await.expect("the rest of the body");
        let next = ask(stream, "/").await;
        assert!(next.starts_with("HTTP/1.1 200"), "{next}");
    }
    // The reads ended: their slots are free again.
    let mut again = TcpStream::connect(addr).await.expect("connect");
    again.write_all(&sent).await.expect("write");
    let answer = read_answer(&mut again).await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    again.write_all(rest).await.expect("the rest of the body");
    let next = ask(&mut again, "/").await;
    assert!(
        next.starts_with("HTTP/1.1 200"),
        "a slot given back: {next}"
    );
    stop.cancel();
}
