//! A connection beyond the connection cap. It is not refused blindly: it is
//! served, without a slot, for [`BEYOND_CAP_DEADLINE`] and (in HTTP/1) one
//! request; the edge's `served_beyond_cap` paths get their real answer,
//! anything else a 503 `too_many_connections`.
//!
//! Why not the alternatives: slots reserved for probes cannot be given by
//! path, as the path is known only once the head is read, so connections
//! that send nothing fill the reserve as they fill the cap; closing the
//! oldest idle connection to make room turns a flood into the eviction of
//! Prometheus's kept-alive scrape connection. Serving probes beyond the cap
//! holds whatever the cap is full of (idle, half-open, busy), costs what
//! the 503 did (a task for a bounded moment per connection), and answers
//! the real state: `/healthz` still says 503 when the journal has failed.
//! The idle watch (`server::idle`) then frees the slots of connections that
//! ask nothing within `HEADER_TIMEOUT`.
//!
//! [`BEYOND_CAP_DEADLINE`]: super::edge::BEYOND_CAP_DEADLINE

use super::{Body, edge, json};
use crate::metrics;
use http::{Request, Response, StatusCode};
use http_body_util::Either;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower::Service;

/// The service of a connection beyond the cap.
#[derive(Clone)]
pub(super) struct BeyondCap<S> {
    pub(super) inner: S,
    pub(super) served: &'static [&'static str],
    pub(super) listener: &'static str,
}

impl<S, R, B> Service<Request<R>> for BeyondCap<S>
where
    S: Service<Request<R>, Response = Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<Either<B, Body>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<R>) -> Self::Future {
        if self.served.contains(&req.uri().path()) {
            let answer = self.inner.call(req);
            return Box::pin(async move { answer.await.map(|r| r.map(Either::Left)) });
        }
        metrics::connection_refused(self.listener);
        Box::pin(std::future::ready(Ok(refused().map(Either::Right))))
    }
}

/// The 503 of a request beyond the cap.
fn refused() -> Response<Body> {
    let mut resp = json(
        StatusCode::SERVICE_UNAVAILABLE,
        &serde_json::json!({
            "error": "too many connections open: retry shortly",
            "reason": "too_many_connections",
        }),
    );
    resp.headers_mut().insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from(edge::RETRY_AFTER_FULL),
    );
    resp
}
