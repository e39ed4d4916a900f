//! The HTTP/1.1 + h2c accept loop shared by ingress and admin. Each is a
//! `tower::Service` behind the layers of `layers`, served by hyper with the
//! limits of its `Edge`: a connection cap, beyond which only the edge's
//! probes are served (`beyond_cap`), and an idle timeout that closes a
//! connection asking nothing, HTTP/1 or HTTP/2 (`idle`).

mod beyond_cap;
mod edge;
pub mod guard;
mod idle;
mod layers;
pub mod linger;
mod rest;

pub use edge::{BODY_DEADLINE, Edge};

use beyond_cap::BeyondCap;
use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use idle::{Activity, Tracked};
use linger::Linger;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tower::Service;
use tower_http::add_extension::AddExtension;

pub type Body = Full<Bytes>;

/// The peer of the connection a request came on, in the request's
/// extensions: handlers log who asked (docs/logs.md, a rejected request).
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

/// Serves `service` on `listener` until `accepting` is cancelled; the
/// connections open then go on until they end or `connections` is, and
/// are shut down gracefully. Most callers pass one token for both; the
/// ingress of `no_room` passes two, as its answers each close their
/// connection: one accepted as the journal opens is still answered.
/// Returns once no connection is left, or after 2 s.
pub async fn serve<S, B>(
    listener: TcpListener,
    service: S,
    edge: Edge,
    accepting: CancellationToken,
    connections: CancellationToken,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Unpin
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<tower::BoxError> + std::fmt::Display,
{
    let service = layers::stack(service, edge.name);
    let builders = Arc::new(Builders::new());
    let once = Arc::new(builder(false));
    let slots = Arc::new(Semaphore::new(edge.max_connections));
    let lingering = Arc::new(Semaphore::new(linger::SLOTS));
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
            _ = accepting.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let service = AddExtension::new(service.clone(), RemoteAddr(peer));
        match slots.clone().try_acquire_owned() {
            Ok(slot) => tracker.spawn(connection(
                stream,
                service,
                slot,
                lingering.clone(),
                builders.clone(),
                connections.clone(),
            )),
            Err(_) => {
                let service = BeyondCap {
                    inner: service,
                    served: edge.served_beyond_cap,
                    listener: edge.name,
                };
                tracker.spawn(beyond_cap(stream, service, once.clone()))
            }
        };
    }
    tracker.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), tracker.wait()).await;
}

/// How a connection within the cap is served, by the protocol its first
/// bytes tell.
struct Builders {
    http1: http1::Builder,
    h2c: auto::Builder<TokioExecutor>,
}

impl Builders {
    fn new() -> Builders {
        let mut http1 = http1::Builder::new();
        http1
            .keep_alive(true)
            .timer(TokioTimer::new())
            .header_read_timeout(edge::HEADER_TIMEOUT);
        Builders {
            http1,
            h2c: builder(true),
        }
    }
}

/// hyper's HTTP/1 and h2c server; `keep_alive: false` answers one HTTP/1
/// request and closes.
fn builder(keep_alive: bool) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .keep_alive(keep_alive)
        .timer(TokioTimer::new())
        .header_read_timeout(edge::HEADER_TIMEOUT);
    builder
}

/// A connection holding `slot`: served until the client closes it, it asks
/// nothing for `HEADER_TIMEOUT`, or `stop`. HTTP/1 is served by `http1`,
/// and held without hyper's buffers while it rests (`rest`); h2c by `h2c`.
/// Its requests' bodies may be read after their answers in `lingering`.
async fn connection<S, B>(
    mut stream: TcpStream,
    service: S,
    slot: OwnedSemaphorePermit,
    lingering: Arc<Semaphore>,
    builders: Arc<Builders>,
    stop: CancellationToken,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Unpin
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<tower::BoxError>,
{
    let _slot = slot;
    let activity = Activity::new();
    let service = AddExtension::new(service, Linger::new(activity.clone(), lingering));
    let service = TowerToHyperService::new(Tracked::new(service, activity.clone()));
    let mut front = BytesMut::new();
    let protocol = tokio::select! {
        sniffed = rest::sniff(&mut stream, &mut front) => match sniffed {
            Ok(Some(p)) => p,
            Ok(None) | Err(_) => return,
        },
        _ = idle::idle(&activity, edge::HEADER_TIMEOUT) => return,
        _ = stop.cancelled() => return,
    };
    let mut front = front.freeze();
    if let rest::Protocol::H2 = protocol {
        let wire = rest::Wire::new(stream, front);
        // Boxed, as the HTTP/1 connection below: the task's own size is
        // that of its largest state, which a resting connection keeps.
        let mut conn = Box::pin(builders.h2c.serve_connection(TokioIo::new(wire), service));
        let stopping = tokio::select! {
            _ = conn.as_mut() => return,
            _ = idle::idle(&activity, edge::HEADER_TIMEOUT) => false,
            _ = stop.cancelled() => true,
        };
        conn.as_mut().graceful_shutdown();
        return closing(conn, stopping).await;
    }
    // Bounded: each pass ends the connection or waits for its next bytes.
    loop {
        let woke = tokio::time::Instant::now();
        let wire = rest::Wire::new(stream, front);
        let unsent = wire.unsent();
        let mut conn = Box::pin(
            builders
                .http1
                .serve_connection(TokioIo::new(wire), service.clone()),
        );
        // Idle for `REST_AFTER` since the last answer and since this pass
        // began, with nothing unsent: an answer a client has not read
        // keeps the connection whole until it has.
        let rested = async {
            tokio::time::sleep_until(woke + rest::REST_AFTER).await;
            idle::idle(&activity, rest::REST_AFTER).await;
            // Bounded by the idle timeout, which the select puts first.
            while unsent.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(rest::REST_AFTER).await;
            }
        };
        let stopping = tokio::select! {
            biased;
            _ = stop.cancelled() => true,
            _ = idle::idle(&activity, edge::HEADER_TIMEOUT) => false,
            // hyper ended it (the client closed, asked to, or broke the
            // protocol), its answers flushed and the socket shut down.
            _ = conn.as_mut() => return,
            _ = rested => {
                let (rested, unparsed) = take_back(*std::pin::Pin::into_inner(conn));
                (stream, front) = (rested, unparsed);
                // Whatever `front` holds is a head not yet whole (hyper
                // parses a whole one at once): the rest of it is waited
                // for like any bytes.
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => return,
                    _ = idle::idle(&activity, edge::HEADER_TIMEOUT) => return,
                    woken = rest::woken(&stream) => if !woken { return },
                }
                continue;
            }
        };
        conn.as_mut().graceful_shutdown();
        return closing(conn, stopping).await;
    }
}

/// A connection told to shut down gracefully, driven to its end: all the
/// time it takes when courier stops (its answers in flight finish), else
/// `CLOSE_GRACE`.
async fn closing(conn: impl std::future::Future, stopping: bool) {
    if stopping {
        conn.await;
    } else {
        let _ = tokio::time::timeout(edge::CLOSE_GRACE, conn).await;
    }
}

/// The socket and the bytes read but not parsed, from a connection hyper
/// is between messages on.
fn take_back<S, B>(conn: http1::Connection<TokioIo<rest::Wire>, S>) -> (TcpStream, Bytes)
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    B: hyper::body::Body + 'static,
    B::Error: Into<tower::BoxError>,
{
    let parts = conn.into_parts();
    parts.io.into_inner().take_back(parts.read_buf)
}

/// A connection beyond the cap: served without a slot for
/// `BEYOND_CAP_DEADLINE` at most, by `once` (one HTTP/1 request).
async fn beyond_cap<S, B>(stream: TcpStream, service: S, once: Arc<auto::Builder<TokioExecutor>>)
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<tower::BoxError>,
{
    let conn = once.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
    let _ = tokio::time::timeout(edge::BEYOND_CAP_DEADLINE, conn).await;
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
