//! The HTTP/1.1 + h2c accept loop shared by ingress and admin. Each is a
//! `tower::Service` behind the layers of `layers`, served by hyper with the
//! limits of its `Edge`: a connection cap, and a header timeout that also
//! closes idle keep-alive connections.

mod edge;
pub mod guard;
mod layers;

pub use edge::{BODY_DEADLINE, Edge};

use crate::admin::metrics;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::Service;
use tower_http::add_extension::AddExtension;

pub type Body = Full<Bytes>;

/// The peer of the connection a request came on, in the request's
/// extensions: handlers log who asked (SPEC §6, a rejected request).
#[derive(Debug, Clone, Copy)]
pub struct RemoteAddr(pub SocketAddr);

/// A listener on `addr` with room for `edge::BACKLOG` connections not
/// yet accepted.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    // As `TcpListener::bind`: a restart can listen again at once.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(edge::BACKLOG)
}

/// Serves `service` on `listener` until `stop` is cancelled; open
/// connections are then shut down gracefully.
pub async fn serve<S, B>(listener: TcpListener, service: S, edge: Edge, stop: CancellationToken)
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<tower::BoxError> + std::fmt::Display,
{
    let service = layers::stack(service, edge.name);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(edge::HEADER_TIMEOUT);
    let builder = Arc::new(builder);
    let slots = Arc::new(Semaphore::new(edge.max_connections));
    let tracker = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics::connection_refused(edge.name);
            tracker.spawn(refuse(stream));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service =
            TowerToHyperService::new(AddExtension::new(service.clone(), RemoteAddr(peer)));
        let builder = builder.clone();
        let stop = stop.clone();
        tracker.spawn(async move {
            let _slot = slot;
            let first = tokio::select! {
                first = first_byte(&stream) => first,
                _ = stop.cancelled() => false,
            };
            if !first {
                return;
            }
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    tracker.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), tracker.wait()).await;
}

/// Waits up to the header timeout for the client's first byte: until then
/// hyper is still telling HTTP/1 from h2c, and its header timer has not
/// started, so a client that sends nothing would hold the slot forever.
async fn first_byte(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    let peeked = tokio::time::timeout(edge::HEADER_TIMEOUT, stream.peek(&mut byte)).await;
    matches!(peeked, Ok(Ok(n)) if n > 0)
}

/// A connection beyond the cap: a 503 written straight to the socket, with
/// no hyper connection and no slot, then closed. The request is read (for
/// up to a second) before the close, so that the close does not reset the
/// answer away.
async fn refuse(mut stream: TcpStream) {
    let body =
        r#"{"error":"too many connections open: retry shortly","reason":"too_many_connections"}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: {}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        edge::RETRY_AFTER_FULL,
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 1024];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// A JSON response.
pub fn json(status: http::StatusCode, value: &serde_json::Value) -> Response<Body> {
    json_bytes(status, Bytes::from(value.to_string()))
}

/// A JSON answer already serialized.
pub fn json_bytes(status: http::StatusCode, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests;
