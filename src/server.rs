//! The HTTP/1.1 + h2c accept loop shared by ingress and admin.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub type Body = Full<Bytes>;

/// The peer of the connection a request came on, in the request's
/// extensions: handlers log who asked (SPEC §6, a rejected request).
#[derive(Debug, Clone, Copy)]
pub struct RemoteAddr(pub SocketAddr);

/// Serves `handler` on `listener` until `stop` is cancelled; open
/// connections are then shut down gracefully.
pub async fn serve<H, F>(listener: TcpListener, handler: Arc<H>, stop: CancellationToken)
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let tracker = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let stop = stop.clone();
        tracker.spawn(async move {
            let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(RemoteAddr(peer));
                let fut = handler(req);
                async move { Ok::<_, Infallible>(fut.await) }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
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
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), tracker.wait()).await;
}

/// A JSON response.
pub fn json(status: http::StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(value.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}
