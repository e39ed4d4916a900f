//! The connections of a `url: per_event` destination, kept across its
//! endpoints under one bound (`endpoints.max_idle_connections`).
//!
//! Hand-written rather than hyper-util's pool, which bounds idle
//! connections per host only: a fan-out to thousands of endpoints kept a
//! connection (~22 KiB: hyper's buffers, its request channel) for every
//! endpoint used in the last 4–8 s, with no bound (10,000 endpoints took
//! RSS from 16 to 231 MiB, benches/RESULTS.md), and a connection closed
//! under it kept its entry until the pool's next sweep. Here the idle
//! connections of all endpoints are one list in the order they were freed:
//! past the bound the oldest is closed and gone at once (its task ends when
//! its sender drops); one the server closed leaves at the next sweep.
//!
//! What is kept from hyper-util: an HTTP/1 connection is used again only
//! once ready for the next request (its answer's body read), an HTTP/2 one
//! is shared by every attempt to its origin, and a request that a reused
//! connection could not start (closed by the server as it was taken) is
//! sent again on a new one. An HTTP/1 connection goes back as soon as its
//! answer's head is in, not from a task that waits for it to be ready (as
//! hyper-util does): in a test of 2,000 kept connections the task per
//! attempt cost ~1 KiB more each.

use super::guard::Guarded;
use crate::event::endpoint;
use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::Connection;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use smallvec::SmallVec;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tower::{BoxError, ServiceExt};

type Body = Full<Bytes>;
/// An origin as the pool keys it: the endpoint's origin
/// (`endpoint::origin_on_stack`: scheme, host in lowercase, the port
/// always written), so that `https://a/x` and `https://A:443/y`, one
/// endpoint to its share and health, share connections too. A string,
/// hashed in one write and compared as bytes: `(Scheme, Authority)` hashed
/// each byte apart, compared them case-blind, and its clones promoted the
/// URL's buffer to a shared one (~1.5 µs of an event's ~106 in step m's
/// profile, 10,000 endpoints). One allocation a request, shared by the
/// queue's turn.
type Origin = Arc<str>;

/// The key of `uri`'s origin, if it has one.
fn origin_of(uri: &Uri) -> Option<Origin> {
    let (scheme, authority) = (uri.scheme_str()?, uri.authority()?.as_str());
    endpoint::authority_origin(scheme, authority).map(|o| Arc::from(o.as_str()))
}

/// How often idle connections past their time are closed.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("the endpoint's URL has no scheme or host")]
    NoOrigin,
    #[error("cannot connect")]
    Connect(#[source] BoxError),
    #[error("the HTTP handshake failed")]
    Handshake(#[source] hyper::Error),
    #[error("the request failed")]
    Request(#[source] hyper::Error),
}

#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    connector: HttpsConnector<Guarded>,
    /// Idle connections kept per origin: its concurrency, as no more are
    /// ever in use at once.
    per_origin: usize,
    /// Idle connections kept in all.
    max_idle: usize,
    /// How long an idle connection may still be used.
    idle_timeout: Duration,
    idle: Mutex<Idle>,
}

/// Each attempt takes a connection and puts it back, so with thousands of
/// endpoints these are cold: each change touches one origin's entry, kept
/// (empty) until the sweep rather than removed and made again, and a queue
/// of turns whose taken entries are skipped when met, not removed from a
/// tree (a profile of step m had the pool at ~2.5 µs an event, of ~200).
#[derive(Default)]
struct Idle {
    /// Per origin, oldest first: the one freed last is used first, so a
    /// steady stream keeps few warm. One kept in the map's own slot, where
    /// a fan-out keeps one an origin: no list elsewhere to reach (a cache
    /// miss an attempt with thousands of endpoints).
    by_origin: HashMap<Origin, SmallVec<[Entry; 1]>>,
    /// Connections in `by_origin`.
    count: usize,
    /// Turns in the order they were put, the oldest first: those still in
    /// `by_origin` and some taken since (`stale`), skipped when met.
    order: VecDeque<(u64, Origin)>,
    stale: usize,
    turn: u64,
    /// A task closes the connections idle past their time.
    swept: bool,
}

struct Entry {
    turn: u64,
    since: Instant,
    conn: Conn,
}

enum Conn {
    H1(http1::SendRequest<Body>),
    /// Shared: a clone per attempt, and this one kept while in use.
    H2(http2::SendRequest<Body>),
}

impl Conn {
    fn is_ready(&self) -> bool {
        match self {
            Conn::H1(s) => s.is_ready(),
            Conn::H2(s) => s.is_ready(),
        }
    }

    fn is_closed(&self) -> bool {
        match self {
            Conn::H1(s) => s.is_closed(),
            Conn::H2(s) => s.is_closed(),
        }
    }
}

impl Pool {
    pub fn new(
        connector: HttpsConnector<Guarded>,
        per_origin: usize,
        max_idle: usize,
        idle_timeout: Duration,
    ) -> Pool {
        Pool {
            inner: Arc::new(Inner {
                connector,
                per_origin: per_origin.max(1),
                max_idle,
                idle_timeout,
                idle: Mutex::new(Idle::default()),
            }),
        }
    }

    /// Sends `req` (its URI absolute) on a kept connection to its origin,
    /// or a new one.
    pub async fn request(&self, mut req: Request<Body>) -> Result<Response<Incoming>, PoolError> {
        let uri = req.uri().clone();
        let origin = origin_of(&uri).ok_or(PoolError::NoOrigin)?;
        // A kept connection the server closed as it was taken, at most
        // once each: they are few, and a new connection ends the loop.
        loop {
            let (conn, reused) = match self.inner.checkout(&origin) {
                Some(conn) => (conn, true),
                None => (self.connect(&origin, &uri).await?, false),
            };
            let sent = match conn {
                // A GOAWAY or a close may meet a request not yet started.
                Conn::H2(mut sender) => sender.try_send_request(req).await,
                Conn::H1(mut sender) => {
                    to_origin_form(&mut req, &uri);
                    let sent = sender.try_send_request(req).await;
                    if sent.is_ok() {
                        // Kept while its answer's body is read: taken
                        // again only once it is ready (`Idle::take`).
                        self.put(origin.clone(), Conn::H1(sender));
                    }
                    sent
                }
            };
            match sent {
                Ok(answer) => return Ok(answer),
                Err(mut e) => match e.take_message() {
                    Some(unsent) if reused => {
                        req = unsent;
                        *req.uri_mut() = uri.clone();
                    }
                    _ => return Err(PoolError::Request(e.into_error())),
                },
            }
        }
    }

    async fn connect(&self, origin: &Origin, uri: &Uri) -> Result<Conn, PoolError> {
        let io = self
            .inner
            .connector
            .clone()
            .oneshot(uri.clone())
            .await
            .map_err(PoolError::Connect)?;
        if io.connected().is_negotiated_h2() {
            let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .handshake(io)
                .await
                .map_err(PoolError::Handshake)?;
            tokio::spawn(conn);
            self.put(origin.clone(), Conn::H2(sender.clone()));
            Ok(Conn::H2(sender))
        } else {
            let (sender, conn) = http1::handshake(io).await.map_err(PoolError::Handshake)?;
            tokio::spawn(conn);
            Ok(Conn::H1(sender))
        }
    }

    fn put(&self, origin: Origin, conn: Conn) {
        let mut idle = self.inner.lock();
        let closed = idle.put(origin, conn, self.inner.per_origin, self.inner.max_idle);
        let first = !std::mem::replace(&mut idle.swept, true);
        drop(idle);
        // Closed outside the lock.
        drop(closed);
        if first {
            tokio::spawn(sweep_while_used(Arc::downgrade(&self.inner)));
        }
    }

    /// Connections kept now, for tests: all, and those ready for a request.
    #[cfg(test)]
    fn kept(&self) -> (usize, usize) {
        let idle = self.inner.lock();
        let ready = idle.by_origin.values().flatten();
        (idle.count, ready.filter(|e| e.conn.is_ready()).count())
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Idle> {
        // Plain maps, each change whole: a panic elsewhere cannot tear them.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A kept connection to `origin` that can take a request now.
    fn checkout(&self, origin: &Origin) -> Option<Conn> {
        let mut idle = self.lock();
        let mut closed = Vec::new();
        let found = idle.take(origin, self.idle_timeout, &mut closed);
        if let Some(Conn::H2(sender)) = &found {
            let keep = Conn::H2(sender.clone());
            closed.extend(idle.put(origin.clone(), keep, self.per_origin, self.max_idle));
        }
        drop(idle);
        drop(closed);
        found
    }
}

impl Idle {
    /// The newest connection to `origin` ready for a request, taken out
    /// (an HTTP/2 one is put back by the caller). Closed ones and those
    /// past `timeout` go to `closed`; one still busy with its answer's body
    /// stays.
    fn take(
        &mut self,
        origin: &Origin,
        timeout: Duration,
        closed: &mut Vec<Entry>,
    ) -> Option<Conn> {
        let list = self.by_origin.get_mut(origin)?;
        let mut found = None;
        for i in (0..list.len()).rev() {
            let e = &list[i];
            let (ready, gone) = (e.conn.is_ready(), e.conn.is_closed());
            let expired = e.since.elapsed() >= timeout;
            if !(ready || gone || expired) {
                continue;
            }
            let e = list.remove(i);
            self.count -= 1;
            self.stale += 1;
            if ready && !expired {
                found = Some(e.conn);
                break;
            }
            closed.push(e);
        }
        found
    }

    /// Keeps `conn`; returns what that closes: the origin's oldest past
    /// `per_origin`, and the oldest of all past `max_idle` (`conn` itself
    /// when that is 0).
    fn put(
        &mut self,
        origin: Origin,
        conn: Conn,
        per_origin: usize,
        max_idle: usize,
    ) -> Vec<Entry> {
        let mut closed = Vec::new();
        self.turn += 1;
        let turn = self.turn;
        self.order.push_back((turn, origin.clone()));
        self.count += 1;
        let list = self.by_origin.entry(origin).or_default();
        list.push(Entry {
            turn,
            since: Instant::now(),
            conn,
        });
        if list.len() > per_origin {
            closed.push(list.remove(0));
            self.count -= 1;
            self.stale += 1;
        }
        while self.count > max_idle {
            closed.extend(self.close_oldest());
        }
        // Taken turns are skipped at the front; elsewhere they wait for
        // it. Past as many as the kept ones, they go at once: the queue
        // stays within twice the connections kept.
        if self.stale > self.count.max(64) {
            self.drop_stale();
        }
        closed
    }

    /// The connection idle longest, with the taken turns before it
    /// dropped from the queue (its turn is then the queue's first).
    fn oldest(&mut self) -> Option<&Entry> {
        loop {
            let (turn, origin) = self.order.front()?;
            // Each origin's list is in turn order: its oldest is first.
            let first = self.by_origin.get(origin).and_then(|l| l.first());
            if first.is_some_and(|e| e.turn == *turn) {
                return first;
            }
            // Older than the origin's first, or none: taken.
            self.order.pop_front();
            self.stale = self.stale.saturating_sub(1);
        }
    }

    /// Removes the connection idle longest.
    fn close_oldest(&mut self) -> Option<Entry> {
        self.oldest()?;
        let (_, origin) = self.order.pop_front()?;
        let oldest = self.by_origin.get_mut(&origin)?.remove(0);
        self.count -= 1;
        Some(oldest)
    }

    /// Keeps in `order` only the turns still in `by_origin`.
    fn drop_stale(&mut self) {
        let by_origin = &self.by_origin;
        self.order.retain(|(turn, origin)| {
            by_origin
                .get(origin)
                .is_some_and(|l| l.iter().any(|e| e.turn == *turn))
        });
        self.stale = 0;
    }

    /// Removes the connections idle `timeout` or more, and those closed
    /// under the pool (a server's close, an answer's `Connection: close`),
    /// which would hold places of the bounds.
    fn expire(&mut self, timeout: Duration) -> Vec<Entry> {
        let mut closed = Vec::new();
        let mut gone = 0;
        // Also forgets the origins with none kept.
        self.by_origin.retain(|_, list| {
            let before = list.len();
            list.retain(|e| !e.conn.is_closed());
            gone += before - list.len();
            !list.is_empty()
        });
        self.count -= gone;
        self.stale += gone;
        while self.oldest().is_some_and(|e| e.since.elapsed() >= timeout) {
            closed.extend(self.close_oldest());
        }
        closed
    }
}

/// Closes idle connections past their time, so that what a burst opened
/// is given back after it; ends with the pool.
async fn sweep_while_used(pool: Weak<Inner>) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = pool.upgrade() else { return };
        let closed = inner.lock().expire(inner.idle_timeout);
        drop(inner);
        drop(closed);
    }
}

/// HTTP/1 sends the path of `uri`, the request's (and the host in
/// `Host`, as a URL names it).
fn to_origin_form(req: &mut Request<Body>, uri: &Uri) {
    if !req.headers().contains_key(http::header::HOST)
        && let Some(host) = host_header(uri)
    {
        req.headers_mut().insert(http::header::HOST, host);
    }
    let path = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    *req.uri_mut() = Uri::from(path);
}

/// The host, and the port when it is not the scheme's own: the URL's
/// authority as written (ingress refuses userinfo), with no string made
/// per attempt.
fn host_header(uri: &Uri) -> Option<HeaderValue> {
    let authority = uri.authority()?;
    let default = match uri.scheme_str() {
        Some("https") => Some(443),
        Some("http") => Some(80),
        _ => None,
    };
    let host = match authority.port_u16() {
        Some(port) if Some(port) != default => authority.as_str(),
        _ => authority.host(),
    };
    // Past an `@`, as hyper-util's: a URL with userinfo names its host after it.
    HeaderValue::from_str(host.rsplit('@').next()?).ok()
}

#[cfg(test)]
mod tests;
