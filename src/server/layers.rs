//! The tower-http layers in front of every edge service: a panic answers
//! 500 (and is counted) instead of dropping the connection, and credentials
//! in headers are marked sensitive, so that the debug-level request span,
//! which prints headers, never shows them.

use super::{Body, json};
use crate::metrics;
use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use serde_json::json;
use std::any::Any;
use std::convert::Infallible;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_http::body::UnsyncBoxBody;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::trace::{DefaultMakeSpan, DefaultOnFailure, TraceLayer};
use tracing::Level;

/// Headers that carry credentials: the admin token, Event Grid's SAS key
/// and token, cookies.
const SENSITIVE: [HeaderName; 4] = [
    http::header::AUTHORIZATION,
    HeaderName::from_static("aeg-sas-key"),
    HeaderName::from_static("aeg-sas-token"),
    http::header::COOKIE,
];

/// What the layered service answers with: `CatchPanicLayer` boxes the body.
pub(super) type LayeredBody = UnsyncBoxBody<Bytes, BoxError>;

/// `inner` behind the layers; `edge` names the listener in the panic
/// metric. Outermost first: a panic anywhere below is caught, and headers
/// are marked before the span records them. The span and its events are at
/// debug (failures too: a 503 is flow control, not an error), so nothing is
/// logged per request at info.
pub(super) fn stack<S, B, RB>(
    inner: S,
    edge: &'static str,
) -> impl Service<
    Request<B>,
    Response = Response<LayeredBody>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ 'static
where
    S: Service<Request<B>, Response = Response<RB>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body + Send + 'static,
    RB: hyper::body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError> + std::fmt::Display,
{
    ServiceBuilder::new()
        .layer(CatchPanicLayer::custom(move |panic| panicked(edge, panic)))
        .layer(SetSensitiveRequestHeadersLayer::new(SENSITIVE))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(DefaultMakeSpan::new().include_headers(true))
                .on_failure(DefaultOnFailure::new().level(Level::DEBUG)),
        )
        // The handler's answer, boxed where it is made: it is a few KiB,
        // and each layer above, and the connection's own (`Tracked`,
        // `AddExtension`), would move it again (benches/RESULTS.md).
        .service(inner.map_future(Box::pin))
}

/// The answer to a request whose handler panicked. For ingress the events
/// may or may not be stored: a retry is safe where ids deduplicate.
fn panicked(edge: &'static str, panic: Box<dyn Any + Send>) -> Response<Body> {
    let message = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    metrics::http_panic(edge);
    tracing::error!(
        listener = edge,
        panic = message,
        "a request handler panicked: answered 500, still serving"
    );
    json(
        StatusCode::INTERNAL_SERVER_ERROR,
        &json!({
            "error": "courier failed while handling this request: retry",
            "reason": "internal_error",
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;

    fn future_size<S: Service<R>, R>(_: &S) -> usize {
        std::mem::size_of::<S::Future>()
    }

    /// What the layers and the connection move per request is a pointer
    /// to the handler's answer, however large the handler's state.
    #[test]
    fn a_large_handlers_answer_is_not_carried_by_the_layers() {
        let large = tower::service_fn(|_: Request<Full<Bytes>>| async {
            let state = [7u8; 8192];
            tokio::task::yield_now().await;
            let len = std::hint::black_box(&state).len();
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(len.to_string()))))
        });
        assert!(future_size(&large) > 8192);
        let layered = stack(large, "test");
        let size = future_size(&layered);
        assert!(size < 1024, "the layers carry {size} bytes per request");
    }
}
