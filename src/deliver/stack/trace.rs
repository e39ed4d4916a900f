//! The attempt's span (docs/tracing.md), outermost, so that it sees the verdict
//! the layers below reach and its `traceparent` is in the request before
//! the headers and signature are added. Only in stacks built with tracing
//! on: off, the layer is not there at all.

use super::{Answered, Attempt, AttemptRequest};
use crate::telemetry::{EventContexts, Tracer};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

#[derive(Clone)]
pub struct TraceLayer {
    tracer: Tracer,
    destination: Arc<str>,
}

impl TraceLayer {
    pub fn new(tracer: Tracer, destination: &str) -> Self {
        TraceLayer {
            tracer,
            destination: destination.into(),
        }
    }
}

impl<S> Layer<S> for TraceLayer {
    type Service = Traced<S>;
    fn layer(&self, inner: S) -> Traced<S> {
        Traced {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Traced<S> {
    inner: S,
    layer: TraceLayer,
}

impl<S, B> Service<AttemptRequest> for Traced<S>
where
    S: Service<AttemptRequest, Response = Answered<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: 'static,
{
    type Response = Answered<B>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answered<B>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: AttemptRequest) -> Self::Future {
        let (id, number) = req
            .extensions()
            .get::<Attempt>()
            .map_or((String::new(), 1), |a| (a.id.clone(), a.number));
        let events = req.extensions_mut().remove::<EventContexts>();
        let span =
            self.layer
                .tracer
                .attempt(&self.layer.destination, &mut req, &id, number, events);
        let fut = self.inner.call(req);
        Box::pin(async move {
            let Ok(answered) = fut.await;
            let a = &answered.attempted;
            let outcome = a.classified.outcome;
            span.finish(
                a.status,
                outcome.as_str(),
                outcome == crate::event::Outcome::Delivered,
            );
            Ok(answered)
        })
    }
}
