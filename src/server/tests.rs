//! The accept loop and its layers on a loopback listener, with a raw TCP
//! client: the connection cap and what is served beyond it, and a handler
//! panic answered 500.

use super::{Body, Edge, json, serve};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Answers 200, or panics on `/panic`.
async fn handler(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    assert!(req.uri().path() != "/panic", "injected panic");
    Ok(json(StatusCode::OK, &serde_json::json!({ "ok": true })))
}

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
