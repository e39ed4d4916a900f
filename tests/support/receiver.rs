//! `Receiver`: a real HTTP/1.1 server on 127.0.0.1 standing in for the
//! webhook endpoint courier delivers to.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{Notify, watch};
use tokio::task::{JoinHandle, JoinSet};

/// One request the receiver got.
#[derive(Clone, Debug)]
pub struct Received {
    /// When the whole request (head and body) had arrived.
    pub at: Instant,
    pub method: Method,
    /// HTTP/1.1, or HTTP/2 when an HTTPS receiver's client chose it by ALPN.
    pub version: http::Version,
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// When the socket write that ended the answer to this request returned:
    /// the answer was then in the client's kernel (loopback). `None` while
    /// unanswered, when the connection was cut before the answer was written,
    /// or when recording was off. See [`Receiver::answered_within_life`].
    pub answered: Option<Instant>,
    /// When that write began: no client can have had the answer sooner,
    /// however late this receiver's task ran after the write (a thread
    /// descheduled on its way back from the syscall stamps `answered` late).
    pub answer_began: Option<Instant>,
}

impl Received {
    /// Its `webhook-id` (the event's id, or a batch's), empty when none.
    pub fn webhook_id(&self) -> String {
        self.header("webhook-id").unwrap_or("").to_string()
    }

    /// Its `courier-delivery-attempt`, 0 when none.
    pub fn attempt(&self) -> u32 {
        self.header("courier-delivery-attempt")
            .and_then(|a| a.parse().ok())
            .unwrap_or(0)
    }

    /// The value of header `name` as a string, if present and valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body parsed as JSON (panics with the body if it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "request body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The body as (lossy) UTF-8 text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Whether this request was answered in full within one life of the
    /// client process: its answer was written, and no kill (given as
    /// `(just before the kill signal, once the process was reaped)`) falls
    /// between its arrival and the end of its answer. A request a kill cut
    /// off does not count as delivered: the client never learnt the outcome.
    pub fn answered_within_life(&self, kills: &[(Instant, Instant)]) -> bool {
        let Some(answered) = self.answered else {
            return false;
        };
        kills
            .iter()
            .all(|(signalled, reaped)| answered < *signalled || self.at > *reaped)
    }
}

/// How many deliveries were repeated without an excuse. The journal
/// records deliveries lazily: a copy answered within `unsynced` before a
/// kill (given as for [`Received::answered_within_life`]), or cut off by
/// it, was undecided and may go out again after the restart. Every earlier
/// copy of a repeated `webhook-id` must be such a one; each that is not
/// counts.
pub fn unexplained_repeats(
    received: &[Received],
    kills: &[(Instant, Instant)],
    unsynced: Duration,
) -> usize {
    let mut by_id: std::collections::HashMap<&str, Vec<Option<Instant>>> =
        std::collections::HashMap::new();
    for r in received {
        if r.answered.is_none() || r.answered_within_life(kills) {
            by_id
                .entry(r.header("webhook-id").unwrap_or(""))
                .or_default()
                .push(r.answered);
        }
    }
    let undecided = |answered: &Option<Instant>| {
        answered.is_none_or(|at| {
            kills
                .iter()
                .any(|(signalled, _)| at <= *signalled && *signalled - at <= unsynced)
        })
    };
    by_id
        .values_mut()
        .map(|answers| {
            // `None` (cut off) sorts first; the last copy needs no excuse.
            answers.sort();
            let earlier = &answers[..answers.len().saturating_sub(1)];
            earlier.iter().filter(|a| !undecided(a)).count()
        })
        .sum()
}

/// What the receiver answers to one request.
#[derive(Clone, Debug)]
pub struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Bytes,
    delay: Duration,
    hang: bool,
}

impl Reply {
    /// Answer with this status, no body.
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Bytes::new(),
            delay: Duration::ZERO,
            hang: false,
        }
    }

    /// Never answer: hold the connection open until the client gives up (or
    /// the receiver is stopped).
    pub fn hang() -> Reply {
        Reply {
            hang: true,
            ..Reply::status(200)
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn body(mut self, body: impl Into<Bytes>) -> Reply {
        self.body = body.into();
        self
    }

    /// A JSON body with `content-type: application/json`.
    pub fn json(self, value: &serde_json::Value) -> Reply {
        self.header("content-type", "application/json")
            .body(value.to_string())
    }

    /// Answer only after this delay.
    pub fn delay(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

/// Decides the reply from the request and its 0-based index among all
/// requests this receiver got.
pub type Behavior = Arc<dyn Fn(&Received, usize) -> Reply + Send + Sync>;

/// A receiver that answers 400 (a dead letter at once) until the flag it
/// returns is set, then 200: dead letters made on demand, then replays
/// that go through.
pub async fn refusing_until_set() -> (Receiver, Arc<AtomicBool>) {
    let accept = Arc::new(AtomicBool::new(false));
    let open = accept.clone();
    let rx = Receiver::start(behavior(move |_, _| {
        Reply::status(if open.load(Ordering::SeqCst) {
            200
        } else {
            400
        })
    }))
    .await;
    (rx, accept)
}

/// Wraps a closure as a [`Behavior`] (helps closure type inference):
/// `Receiver::start(behavior(|req, n| Reply::status(if n < 2 { 503 } else { 200 })))`.
pub fn behavior(f: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static) -> Behavior {
    Arc::new(f)
}

/// An endpoint of limited capacity ([`Receiver::with_capacity`]): at most
/// `limit` requests in service at once, each for `service`; one more is
/// answered 503 at once, without Retry-After (a worker pool that sheds
/// load). With a `knee`, service slows down with the load beyond it:
/// `service × in_service / knee`, twice as slow at twice the knee. Every
/// setting may change while it runs (an endpoint that recovers).
pub struct Capacity {
    limit: AtomicUsize,
    service_us: AtomicU64,
    /// 0: none.
    knee: AtomicUsize,
    in_service: AtomicUsize,
    served: AtomicU64,
    refused: AtomicU64,
    /// Time spent serving, summed over the requests served.
    busy_us: AtomicU64,
}

/// One request in service; it leaves when its answer is built or its
/// connection is cut.
struct Serving<'a>(&'a Capacity);

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.in_service.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Capacity {
    pub fn new(limit: usize, service: Duration) -> Arc<Capacity> {
        Arc::new(Capacity {
            limit: AtomicUsize::new(limit),
            service_us: AtomicU64::new(service.as_micros() as u64),
            knee: AtomicUsize::new(0),
            in_service: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            busy_us: AtomicU64::new(0),
        })
    }

    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::SeqCst);
    }

    /// `Some(k)`: latency grows with the load beyond `k` in service.
    pub fn set_knee(&self, knee: Option<usize>) {
        self.knee.store(knee.unwrap_or(0), Ordering::SeqCst);
    }

    /// Requests answered 200 so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::SeqCst)
    }

    /// Requests answered 503 so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }

    /// Time spent serving so far, summed over requests.
    pub fn busy(&self) -> Duration {
        Duration::from_micros(self.busy_us.load(Ordering::SeqCst))
    }

    async fn serve(&self) -> Reply {
        let n = self.in_service.fetch_add(1, Ordering::SeqCst) + 1;
        let serving = Serving(self);
        if n > self.limit.load(Ordering::SeqCst) {
            drop(serving);
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Reply::status(503);
        }
        let knee = self.knee.load(Ordering::SeqCst);
        let slowdown = if knee == 0 {
            1.0
        } else {
            (n as f64 / knee as f64).max(1.0)
        };
        let service = Duration::from_micros(self.service_us.load(Ordering::SeqCst));
        let started = Instant::now();
        tokio::time::sleep(service.mul_f64(slowdown)).await;
        let took = started.elapsed().as_micros() as u64;
        drop(serving);
        self.busy_us.fetch_add(took, Ordering::SeqCst);
        self.served.fetch_add(1, Ordering::SeqCst);
        Reply::status(200)
    }
}

struct State {
    /// Number of requests seen (also the source of the request index).
    seen: AtomicUsize,
    recording: AtomicBool,
    records: Mutex<Vec<Received>>,
    last_at: Mutex<Option<Instant>>,
    arrived: Notify,
    behavior: Behavior,
    /// Answers instead of `behavior` when set (`with_capacity`).
    capacity: Option<Arc<Capacity>>,
}

impl State {
    fn records(&self) -> MutexGuard<'_, Vec<Received>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A real HTTP/1.1 server on 127.0.0.1 (keep-alive, TCP_NODELAY) that records
/// every request and answers according to its [`Behavior`].
pub struct Receiver {
    addr: SocketAddr,
    /// Serves HTTPS (`start_tls`).
    tls: bool,
    state: Arc<State>,
    shutdown: watch::Sender<bool>,
    server: Mutex<Option<JoinHandle<()>>>,
}

impl Receiver {
    /// Starts on 127.0.0.1 with an OS-chosen port.
    pub async fn start(behavior: Behavior) -> Receiver {
        Receiver::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), behavior).await
    }

    /// Starts on `addr` (e.g. the address of a stopped receiver, to come back
    /// on the same port). Only loopback addresses are allowed.
    pub async fn start_on(addr: SocketAddr, behavior: Behavior) -> Receiver {
        Receiver::start_serving(addr, behavior, None, None).await
    }

    /// Starts on 127.0.0.1, answering as `capacity` says.
    pub async fn with_capacity(capacity: Arc<Capacity>) -> Receiver {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let ok = behavior(|_, _| Reply::status(200));
        Receiver::start_serving(addr, ok, None, Some(capacity)).await
    }

    /// Starts an HTTPS receiver on 127.0.0.1 with `config` (see
    /// `support::certs`); `url()` is then `https://localhost:PORT`.
    pub async fn start_tls(behavior: Behavior, config: Arc<rustls::ServerConfig>) -> Receiver {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        Receiver::start_serving(addr, behavior, Some(acceptor), None).await
    }

    async fn start_serving(
        addr: SocketAddr,
        behavior: Behavior,
        tls: Option<tokio_rustls::TlsAcceptor>,
        capacity: Option<Arc<Capacity>>,
    ) -> Receiver {
        assert!(
            addr.ip().is_loopback(),
            "receiver must listen on loopback, not {addr}"
        );
        let listener = bind(addr).await;
        let addr = listener.local_addr().expect("listener has a local address");
        let state = Arc::new(State {
            seen: AtomicUsize::new(0),
            recording: AtomicBool::new(true),
            records: Mutex::new(Vec::new()),
            last_at: Mutex::new(None),
            arrived: Notify::new(),
            behavior,
            capacity,
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let https = tls.is_some();
        let server = tokio::spawn(serve(listener, state.clone(), shutdown_rx, tls));
        Receiver {
            addr,
            tls: https,
            state,
            shutdown,
            server: Mutex::new(Some(server)),
        }
    }

    /// Always answers 200 with no body.
    pub async fn ok() -> Receiver {
        Receiver::start(behavior(|_, _| Reply::status(200))).await
    }

    /// Answers the n-th request with the n-th reply; repeats the last one.
    pub async fn sequence(replies: Vec<Reply>) -> Receiver {
        assert!(
            !replies.is_empty(),
            "Receiver::sequence needs at least one reply"
        );
        Receiver::start(behavior(move |_, n| {
            replies[n.min(replies.len() - 1)].clone()
        }))
        .await
    }

    /// `http://127.0.0.1:PORT`, or `https://localhost:PORT` (the name its
    /// certificate has) for an HTTPS receiver.
    pub fn url(&self) -> String {
        if self.tls {
            format!("https://localhost:{}", self.addr.port())
        } else {
            format!("http://{}", self.addr)
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Turn recording of requests on or off (default on). Off keeps only the
    /// count and the arrival time of the last request: use it under load so
    /// memory does not grow with every body. `received()` and `wait_for()`
    /// return only what was recorded.
    pub fn set_recording(&self, on: bool) {
        self.state.recording.store(on, Ordering::SeqCst);
    }

    /// Every recorded request so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.state.records().clone()
    }

    /// Number of requests that arrived (recorded or not).
    pub fn count(&self) -> usize {
        self.state.seen.load(Ordering::SeqCst)
    }

    /// Arrival time of the latest request.
    pub fn last_at(&self) -> Option<Instant> {
        *self.state.last_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until at least `n` requests arrived and returns all recorded
    /// requests (possibly more than `n`). Panics after `timeout` with how many
    /// arrived.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Received> {
        match self.try_wait_for(n, timeout).await {
            Some(got) => got,
            None => {
                let got = self.received();
                let summary: Vec<String> = got
                    .iter()
                    .take(20)
                    .map(|r| format!("{} {}", r.method, r.path_and_query))
                    .collect();
                panic!(
                    "receiver {}: waited {timeout:?} for {n} requests but only {} arrived (first ones: {summary:?})",
                    self.addr,
                    self.count(),
                )
            }
        }
    }

    /// Like [`wait_for`](Self::wait_for) but returns `None` on timeout.
    pub async fn try_wait_for(&self, n: usize, timeout: Duration) -> Option<Vec<Received>> {
        let deadline = tokio::time::Instant::now() + timeout;
        // Bounded by the deadline: each turn waits for a new arrival or times out.
        loop {
            let notified = self.state.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count() >= n {
                return Some(self.received());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return (self.count() >= n).then(|| self.received());
            }
        }
    }

    /// Asserts that no further request arrives within `window` (beyond the
    /// `expected` total), e.g. to check that courier stopped retrying.
    pub async fn assert_quiet(&self, expected: usize, window: Duration) {
        if let Some(got) = self.try_wait_for(expected + 1, window).await {
            panic!(
                "receiver {}: expected {expected} requests in total, got {}",
                self.addr,
                got.len().max(self.count())
            );
        }
        assert_eq!(
            self.count(),
            expected,
            "receiver {}: request count",
            self.addr
        );
    }

    /// Stops listening and closes every connection (requests in progress get
    /// no answer). Afterwards connections to the port are refused.
    pub async fn stop(&self) {
        let _ = self.shutdown.send(true);
        let server = self.server.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(server) = server {
            let _ = server.await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

async fn bind(addr: SocketAddr) -> TcpListener {
    // A receiver coming back on the port of one just dropped may find its
    // listener not yet closed (its task sees the shutdown a moment later):
    // tried again for up to 2 s.
    let mut tries = 0;
    let socket = loop {
        let socket = match addr {
            SocketAddr::V4(_) => TcpSocket::new_v4(),
            SocketAddr::V6(_) => TcpSocket::new_v6(),
        }
        .expect("create socket");
        // So a receiver can come back on the port of a stopped one.
        socket.set_reuseaddr(true).expect("set SO_REUSEADDR");
        match socket.bind(addr) {
            Ok(()) => break socket,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 100 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => panic!("receiver cannot bind {addr}: {e}"),
        }
    };
    socket
        .listen(1024)
        .unwrap_or_else(|e| panic!("receiver cannot listen on {addr}: {e}"))
}

async fn serve(
    listener: TcpListener,
    state: Arc<State>,
    mut shutdown: watch::Receiver<bool>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let mut conns = JoinSet::new();
    // Runs until shutdown (or the Receiver is dropped).
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // e.g. EMFILE: back off briefly rather than spin.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let unwritten = Unwritten::default();
                let io = Stamping {
                    inner: stream,
                    unwritten: unwritten.clone(),
                    state: state.clone(),
                };
                let state = state.clone();
                let shutdown = shutdown.clone();
                let tls = tls.clone();
                conns.spawn(async move {
                    match tls {
                        None => connection(io, false, state, unwritten, shutdown).await,
                        // A failed handshake (say, no client certificate)
                        // closes the connection, as a real server does.
                        Some(tls) => {
                            if let Ok(io) = tls.accept(io).await {
                                let h2 = io.get_ref().1.alpn_protocol() == Some(b"h2");
                                connection(io, h2, state, unwritten, shutdown).await;
                            }
                        }
                    }
                });
            }
        }
    }
    drop(listener);
    // Aborts every connection task, which closes its socket.
    conns.shutdown().await;
}

/// Serves one connection: HTTP/1.1, or HTTP/2 when `h2` (an HTTPS client
/// chose it by ALPN).
async fn connection<I>(
    io: I,
    h2: bool,
    state: Arc<State>,
    unwritten: Unwritten,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| handle(state.clone(), unwritten.clone(), req));
    let io = TokioIo::new(io);
    tokio::select! {
        _ = async {
            if h2 {
                let builder = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
                let _ = builder.serve_connection(io, service).await;
            } else {
                let mut builder = hyper::server::conn::http1::Builder::new();
                let _ = builder.keep_alive(true).serve_connection(io, service).await;
            }
        } => {}
        _ = shutdown.changed() => {}
    }
}

async fn handle(
    state: Arc<State>,
    unwritten: Unwritten,
    req: Request<Incoming>,
) -> Result<Response<Answer>, hyper::Error> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let received = Received {
        at: Instant::now(),
        method: parts.method,
        version: parts.version,
        path_and_query: parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".to_owned()),
        headers: parts.headers,
        body,
        answered: None,
        answer_began: None,
    };
    let (index, slot) = if state.recording.load(Ordering::SeqCst) {
        let mut records = state.records();
        let index = state.seen.fetch_add(1, Ordering::SeqCst);
        records.push(received.clone());
        (index, Some(records.len() - 1))
    } else {
        (state.seen.fetch_add(1, Ordering::SeqCst), None)
    };
    {
        let mut last = state.last_at.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t < received.at) {
            *last = Some(received.at);
        }
    }
    state.arrived.notify_waiters();

    if let Some(capacity) = &state.capacity {
        let reply = capacity.serve().await;
        return Ok(build_response(reply, slot.map(|slot| (unwritten, slot))));
    }
    let reply = (state.behavior)(&received, index);
    if reply.hang {
        // Never answer; the connection task is dropped when the client closes
        // the connection or the receiver stops.
        std::future::pending::<()>().await;
    }
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    Ok(build_response(reply, slot.map(|slot| (unwritten, slot))))
}

fn build_response(reply: Reply, written: Option<(Unwritten, usize)>) -> Response<Answer> {
    let mut resp = Response::new(Answer {
        body: Full::new(reply.body),
        written,
    });
    *resp.status_mut() = StatusCode::from_u16(reply.status)
        .unwrap_or_else(|_| panic!("Reply::status: invalid status code {}", reply.status));
    for (name, value) in reply.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .unwrap_or_else(|_| panic!("Reply::header: invalid header name {name:?}"));
        let value = HeaderValue::from_str(&value)
            .unwrap_or_else(|_| panic!("Reply::header: invalid header value {value:?}"));
        resp.headers_mut().append(name, value);
    }
    resp
}

/// Per connection: the records whose answer hyper has taken whole (its body
/// was dropped) but not yet written to the socket.
type Unwritten = Arc<Mutex<Vec<usize>>>;

fn unwritten(u: &Unwritten) -> MutexGuard<'_, Vec<usize>> {
    u.lock().unwrap_or_else(|p| p.into_inner())
}

/// A reply body that, once hyper is done with it, marks its record as
/// waiting for the socket write that ends the answer. hyper 1's HTTP/1
/// dispatcher drops a body as soon as its last frame is buffered, before it
/// flushes, so the next successful write on the connection carries the end
/// of this answer (answers here are small: one write).
struct Answer {
    body: Full<Bytes>,
    written: Option<(Unwritten, usize)>,
}

impl hyper::body::Body for Answer {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some((u, slot)) = self.written.take() {
            unwritten(&u).push(slot);
        }
    }
}

/// The connection's socket; stamps `Received::answered` on the records
/// whose answers a successful write has just completed.
struct Stamping {
    inner: tokio::net::TcpStream,
    unwritten: Unwritten,
    state: Arc<State>,
}

impl Stamping {
    fn stamp(&self, began: Instant) {
        let slots = std::mem::take(&mut *unwritten(&self.unwritten));
        if slots.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut records = self.state.records();
        for slot in slots {
            if let Some(r) = records.get_mut(slot) {
                r.answered = Some(now);
                r.answer_began = Some(began);
            }
        }
    }

    fn stamp_if_written(&self, result: &Poll<std::io::Result<usize>>, began: Instant) {
        if matches!(result, Poll::Ready(Ok(n)) if *n > 0) {
            self.stamp(began);
        }
    }
}

impl AsyncRead for Stamping {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stamping {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let began = Instant::now();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.stamp_if_written(&result, began);
        result
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let began = Instant::now();
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.stamp_if_written(&result, began);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
