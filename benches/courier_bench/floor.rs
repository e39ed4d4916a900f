//! Step h: what courier's HTTP stack costs on this machine without courier.
//!
//! The budgets of issue #10 compare courier with nginx, which is written in
//! C and keeps nothing. These two rows run the crates courier is built on,
//! doing only the HTTP half of its work, so a miss can be split into what
//! the stack costs and what courier adds:
//! - a proxy: hyper's server (as courier's ingress builds it) reads each
//!   POST whole and sends it on with hyper-util's pooled client (as
//!   courier's delivery does) to nginx, answering with nginx's status.
//!   Nothing is written to disk: the ceiling of end to end and accept-only;
//! - a client: 64 keep-alive connections of hyper's client sending the
//!   backlog of step c to nginx: the ceiling of an unbatched drain.
//!
//! The proxy runs on its own tokio runtime with two workers (courier's on
//! this 2-CPU machine) in this process, which uses mimalloc as courier does.

use std::convert::Infallible;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::sync::oneshot;

type Pool = Client<HttpConnector, Full<Bytes>>;

/// The proxy; stopped (its runtime shut down) when dropped.
pub struct Proxy {
    pub port: u16,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy on a free loopback port that forwards to `upstream`.
    pub fn start(upstream: &str) -> Result<Proxy, String> {
        let upstream: Uri = upstream
            .parse()
            .map_err(|e| format!("floor proxy upstream {upstream:?}: {e}"))?;
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| format!("floor proxy bind: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("floor proxy address: {e}"))?
            .port();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("floor proxy runtime: {e}"))?;
        let (stop, stopped) = oneshot::channel();
        let thread =
            std::thread::spawn(move || runtime.block_on(serve(listener, upstream, stopped)));
        Ok(Proxy {
            port,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(listener: std::net::TcpListener, upstream: Uri, mut stopped: oneshot::Receiver<()>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let pool: Pool = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build_http();
    let upstream = Arc::new(upstream);
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    // Bounded by the stop signal.
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
            _ = &mut stopped => return,
        };
        let _ = stream.set_nodelay(true);
        let (pool, upstream, builder) = (pool.clone(), upstream.clone(), builder.clone());
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req| forward(pool.clone(), upstream.clone(), req));
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Reads the body whole (courier must, to store it), sends it on, answers
/// with the upstream's status; 502 if the upstream cannot be reached.
async fn forward(
    pool: Pool,
    upstream: Arc<Uri>,
    req: Request<Incoming>,
) -> Result<Response<Empty<Bytes>>, Infallible> {
    let status = async {
        let (parts, body) = req.into_parts();
        let body = body.collect().await.ok()?.to_bytes();
        let mut out = Request::post(upstream.as_ref().clone());
        if let Some(kind) = parts.headers.get(header::CONTENT_TYPE) {
            out = out.header(header::CONTENT_TYPE, kind);
        }
        let answer = pool.request(out.body(Full::new(body)).ok()?).await.ok()?;
        let status = answer.status();
        answer.into_body().collect().await.ok()?;
        Some(status)
    }
    .await
    .unwrap_or(StatusCode::BAD_GATEWAY);
    let mut response = Response::new(Empty::new());
    *response.status_mut() = status;
    Ok(response)
}
