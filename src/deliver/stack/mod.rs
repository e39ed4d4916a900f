//! The per-attempt stack, outermost first: trace (with tracing on) →
//! headers → signing → classify → timeout (with late answers) → http. Each layer has one job; the result is
//! an `Attempted`, never an error, so callers only deal with verdicts.
//! Passthrough puts `tower::retry` with `InlineRetry` on top of the same
//! layers and keeps the answer itself (`Answered`) to hand to the app.

mod classify;
mod headers;
mod http;
mod retry;
mod signing;
mod timeout;
mod trace;

pub use classify::{Answered, Attempted, ClassifyLayer};
pub use headers::HeadersLayer;
pub use http::{HttpService, drain};
pub use retry::{InlineRetry, Trail};
pub use signing::{EndpointSecrets, SigningLayer};
pub use timeout::{Deadline, LateAnswer, TimeoutLayer};
pub use trace::TraceLayer;

use crate::config::DestinationSettings;
use crate::deliver::HttpsClient;
use crate::telemetry::Tracer;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use std::convert::Infallible;
use std::time::Duration;
use tower::ServiceBuilder;
use tower::util::BoxCloneSyncService;

/// Which event and which attempt a request carries (a request extension).
#[derive(Clone, Debug)]
pub struct Attempt {
    pub id: String,
    pub number: u32,
}

pub type AttemptRequest = ::http::Request<Full<Bytes>>;
pub type AttemptService = BoxCloneSyncService<AttemptRequest, Attempted, Infallible>;
/// One passthrough attempt: its verdict and the answer, body unread.
pub type PassthroughService = BoxCloneSyncService<AttemptRequest, Answered<Incoming>, Infallible>;

/// Durable delivery's stack over `leaf` (`HttpService`; a mock in tests):
/// only the verdict is kept, the answer drained. Each attempt is a span
/// when `tracer` is given.
pub fn build<S, B>(dest: &DestinationSettings, leaf: S, tracer: Option<&Tracer>) -> AttemptService
where
    S: Leaf<B>,
    B: Body,
{
    let svc = tower::ServiceExt::map_response(
        layers(dest, leaf, dest.late_answer_window, tracer),
        |a: Answered<B>| {
            if let Some(answer) = a.answer {
                drain(answer.into_body());
            }
            a.attempted
        },
    );
    BoxCloneSyncService::new(svc)
}

/// Passthrough's stack: the answer kept, and no late answers (the app has
/// been answered by then).
pub fn build_passthrough(
    dest: &DestinationSettings,
    client: HttpsClient,
    tracer: Option<&Tracer>,
) -> PassthroughService {
    BoxCloneSyncService::new(layers(
        dest,
        HttpService::new(client),
        Duration::ZERO,
        tracer,
    ))
}

/// What sends an attempt, under the layers.
pub trait Leaf<B>:
    tower::Service<
        AttemptRequest,
        Response = ::http::Response<B>,
        Error: Into<tower::BoxError>,
        Future: Send + Unpin + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S, B> Leaf<B> for S where
    S: tower::Service<
            AttemptRequest,
            Response = ::http::Response<B>,
            Error: Into<tower::BoxError>,
            Future: Send + Unpin + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// An answer's body, as the timeout layer and `drain` take it.
pub trait Body:
    hyper::body::Body<Data: Send, Error: Into<tower::BoxError>> + Send + Unpin + 'static
{
}

impl<B> Body for B where
    B: hyper::body::Body<Data: Send, Error: Into<tower::BoxError>> + Send + Unpin + 'static
{
}

/// The layers both stacks share, unboxed so that each boxes once.
fn layers<S, B>(
    dest: &DestinationSettings,
    leaf: S,
    late_window: Duration,
    tracer: Option<&Tracer>,
) -> impl tower::Service<
    AttemptRequest,
    Response = Answered<B>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ Sync
+ 'static
where
    S: Leaf<B>,
    B: Body,
{
    ServiceBuilder::new()
        .option_layer(tracer.map(|t| TraceLayer::new(t.clone(), &dest.name)))
        .layer(HeadersLayer::new(dest))
        .layer(SigningLayer::new(dest.signing.clone()))
        .layer(ClassifyLayer::new(dest.status.clone()))
        .layer(TimeoutLayer::new(dest.timeout, late_window))
        .service(leaf)
}

/// The bytes of an attempt's body, leaving an identical body in place.
///
/// Layers that need the body (dynamic headers, the signature) read it from
/// the request itself rather than from a copy carried beside it, so what they
/// see is by construction what is sent. Cloning `Bytes` shares the buffer.
fn body_bytes(req: &mut AttemptRequest) -> Bytes {
    let bytes = std::mem::take(req.body_mut())
        .into_inner()
        .unwrap_or_default();
    *req.body_mut() = Full::new(bytes.clone());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_bytes_reads_the_body_and_leaves_it_whole() {
        let mut req = AttemptRequest::new(Full::new(Bytes::from_static(b"{\"a\":1}")));
        assert_eq!(body_bytes(&mut req), &b"{\"a\":1}"[..]);
        assert_eq!(body_bytes(&mut req), &b"{\"a\":1}"[..]);
        let mut empty = AttemptRequest::new(Full::new(Bytes::new()));
        assert_eq!(body_bytes(&mut empty), Bytes::new());
    }
}
