//! The body of an endpoint's answer, streamed to a passthrough app. Its
//! attempt is counted when the body ends, not when the head arrives: an
//! answer cut off mid-body is a `SocketError` (the connection closed early),
//! not the `Delivered` its status promised.

use crate::event::Outcome;
use crate::metrics;
use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// An attempt whose count waits for the end of its answer's body; put in
/// the answer's extensions by the in-line retry policy.
#[derive(Clone)]
pub struct Unsettled {
    pub counted: Arc<metrics::PassthroughAttempts>,
    pub outcome: Outcome,
    pub took: Duration,
}

impl Unsettled {
    fn count(self, outcome: Outcome) {
        self.counted.attempt(outcome, self.took);
    }
}

pub struct AnswerBody {
    inner: Incoming,
    /// `None` once counted, or when the head's count was final already.
    tally: Option<Unsettled>,
}

impl AnswerBody {
    pub fn new(inner: Incoming, tally: Option<Unsettled>) -> Self {
        AnswerBody { inner, tally }
    }

    fn settle(&mut self, cut: bool) {
        if let Some(t) = self.tally.take() {
            let outcome = if cut { Outcome::SocketError } else { t.outcome };
            t.count(outcome);
        }
    }
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Err(_))) => self.settle(true),
            Poll::Ready(None) => self.settle(false),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The app hung up before the end: nothing says the answer was cut, so it
/// counts as its head said.
impl Drop for AnswerBody {
    fn drop(&mut self) {
        self.settle(false);
    }
}
