//! Step h: what courier's HTTP stack costs on this machine without courier.
//!
//! The budgets of issue #10 compare courier with nginx, which is written in
//! C and keeps nothing. These rows run the crates courier is built on,
//! doing only part of its work, so a miss can be split into what the stack
//! and durability cost and what courier adds:
//! - a proxy: hyper's server (as courier's ingress builds it) reads each
//!   POST whole and sends it on with hyper-util's pooled client (as
//!   courier's delivery does) to nginx, answering with nginx's status.
//!   Nothing is written to disk;
//! - a durable proxy, the least a sidecar that answers only once an event
//!   is durable can do: each body appended to a file by a writer thread,
//!   one `fdatasync` per group of requests waiting for it, then 202; with
//!   delivery, each stored body sent to nginx from memory (64 at a time)
//!   once and forgotten: no index, no retries, no acks, no metrics, no
//!   logs. The ceiling of accept-only and of end to end;
//! - a client: 64 keep-alive connections of hyper's client sending the
//!   backlog of step c to nginx: the ceiling of an unbatched drain.
//!
//! The proxies run on their own tokio runtime with two workers (courier's on
//! this 2-CPU machine) in this process, which uses mimalloc as courier does.

use std::convert::Infallible;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::sync::{Semaphore, oneshot};

type Pool = Client<HttpConnector, Full<Bytes>>;
type Reply = Result<Response<Empty<Bytes>>, Infallible>;

/// Concurrent deliveries of the durable proxy: courier's `concurrency: 64`.
const SLOTS: usize = 64;

/// A server on its own runtime; stopped (its runtime shut down) when
/// dropped.
pub struct Server {
    pub port: u16,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Serves `handle` on a free loopback port.
    fn start<F, R>(handle: F) -> Result<Server, String>
    where
        F: Fn(Request<Incoming>) -> R + Clone + Send + Sync + 'static,
        R: Future<Output = Reply> + Send + 'static,
    {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| format!("floor bind: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("floor address: {e}"))?
            .port();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("floor runtime: {e}"))?;
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::spawn(move || runtime.block_on(serve(listener, stopped, handle)));
        Ok(Server {
            port,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve<F, R>(listener: std::net::TcpListener, mut stopped: oneshot::Receiver<()>, handle: F)
where
    F: Fn(Request<Incoming>) -> R + Clone + Send + Sync + 'static,
    R: Future<Output = Reply> + Send + 'static,
{
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
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
        let (handle, builder) = (handle.clone(), builder.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(handle);
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn pool() -> Pool {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(SLOTS)
        .build_http()
}

fn parse(upstream: &str) -> Result<Arc<Uri>, String> {
    upstream
        .parse()
        .map(Arc::new)
        .map_err(|e| format!("floor upstream {upstream:?}: {e}"))
}

fn reply(status: StatusCode) -> Reply {
    let mut response = Response::new(Empty::new());
    *response.status_mut() = status;
    Ok(response)
}

/// The proxy that stores nothing: a server forwarding to `upstream`.
pub fn proxy(upstream: &str) -> Result<Server, String> {
    let (upstream, pool) = (parse(upstream)?, pool());
    Server::start(move |req| forward(pool.clone(), upstream.clone(), req))
}

/// Reads the body whole (courier must, to store it), sends it on, answers
/// with the upstream's status; 502 if the upstream cannot be reached.
async fn forward(pool: Pool, upstream: Arc<Uri>, req: Request<Incoming>) -> Reply {
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
    reply(status)
}

/// What the durable proxy has done so far.
#[derive(Default)]
pub struct Counts {
    pub accepted: AtomicU64,
    pub delivered: AtomicU64,
    /// Sends that failed or were answered non-2xx (never retried).
    pub failed: AtomicU64,
}

/// A body waiting for the writer thread, and who to tell once it is
/// durable.
type Append = (Bytes, oneshot::Sender<()>);

struct Durable {
    journal: std::sync::mpsc::Sender<Append>,
    /// Where and how to deliver; `None`: accept only.
    upstream: Option<(Arc<Uri>, Pool, Arc<Semaphore>)>,
    counts: Arc<Counts>,
}

/// The durable proxy, journaling to `file`; it delivers to `upstream` when
/// given one. The writer thread ends when the server is dropped.
pub fn durable(file: &Path, upstream: Option<&str>) -> Result<(Server, Arc<Counts>), String> {
    let file = std::fs::File::create(file)
        .map_err(|e| format!("floor journal {}: {e}", file.display()))?;
    let (journal, appends) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("floor-writer".into())
        .spawn(move || write(file, appends))
        .map_err(|e| format!("floor writer thread: {e}"))?;
    let upstream = match upstream {
        Some(url) => Some((parse(url)?, pool(), Arc::new(Semaphore::new(SLOTS)))),
        None => None,
    };
    let counts = Arc::new(Counts::default());
    let state = Arc::new(Durable {
        journal,
        upstream,
        counts: counts.clone(),
    });
    let server = Server::start(move |req| store(state.clone(), req))?;
    Ok((server, counts))
}

/// Group commit: everything queued while the last `fdatasync` ran goes out
/// in one write and one `fdatasync`, each body framed by its length and
/// CRC32C as a journal record must be to be read back safely.
fn write(mut file: std::fs::File, appends: std::sync::mpsc::Receiver<Append>) {
    let mut buf = Vec::new();
    let mut waiting = Vec::new();
    // Ends when every sender (the server's state) is gone.
    while let Ok(first) = appends.recv() {
        waiting.push(first);
        waiting.extend(appends.try_iter());
        buf.clear();
        for (body, _) in &waiting {
            buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
            buf.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
            buf.extend_from_slice(body);
        }
        if file
            .write_all(&buf)
            .and_then(|()| file.sync_data())
            .is_err()
        {
            // Dropping the senders answers those requests 500.
            waiting.clear();
            continue;
        }
        for (_, durable) in waiting.drain(..) {
            let _ = durable.send(());
        }
    }
}

/// Reads the body whole, waits until it is durable, answers 202 and sends
/// it on in the background.
async fn store(state: Arc<Durable>, req: Request<Incoming>) -> Reply {
    let status = async {
        let body = req.into_body().collect().await.ok()?.to_bytes();
        let (done, durable) = oneshot::channel();
        state.journal.send((body.clone(), done)).ok()?;
        durable.await.ok()?;
        state.counts.accepted.fetch_add(1, Ordering::Relaxed);
        if let Some((uri, pool, slots)) = &state.upstream {
            let (uri, pool, slots) = (uri.clone(), pool.clone(), slots.clone());
            let counts = state.counts.clone();
            tokio::spawn(async move {
                let Ok(_slot) = slots.acquire().await else {
                    return;
                };
                let sent = async {
                    let out = Request::post(uri.as_ref().clone())
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(Full::new(body))
                        .ok()?;
                    let answer = pool.request(out).await.ok()?;
                    let ok = answer.status().is_success();
                    answer.into_body().collect().await.ok()?;
                    Some(ok)
                };
                let counter = match sent.await {
                    Some(true) => &counts.delivered,
                    _ => &counts.failed,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            });
        }
        Some(StatusCode::ACCEPTED)
    }
    .await
    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    reply(status)
}
