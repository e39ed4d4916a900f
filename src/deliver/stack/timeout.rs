//! The per-attempt timeout, with Event Grid's late answers: when an attempt
//! times out, the request is not dropped but kept waiting for
//! `late_answer_window` in the background; its status, if one comes, is
//! handed to whoever settles the attempt (docs/delivery.md), through the
//! request's [`LateSlot`]: the error says only what happened.
//!
//! A request may carry a [`Deadline`] (passthrough: the app is waiting):
//! its attempt then times out at the deadline if that comes first.

use http::{Request, Response};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;
use tower::{BoxError, Layer, Service};

/// The status of an answer that arrived after the timeout.
pub type LateAnswer = oneshot::Receiver<u16>;

/// When the whole exchange must end: an attempt never outlives it.
#[derive(Clone, Copy, Debug)]
pub struct Deadline(pub tokio::time::Instant);

/// Where a request that timed out leaves its late answer: a request
/// extension its sender puts in and reads after the attempt. Without one,
/// nobody would read a late answer, and none is waited for.
#[derive(Clone, Debug, Default)]
pub struct LateSlot(Arc<Mutex<Option<LateAnswer>>>);

impl LateSlot {
    /// The late answer of the attempt that carried this slot, if it timed
    /// out with a late-answer window.
    pub fn take(&self) -> Option<LateAnswer> {
        self.0.lock().ok()?.take()
    }

    fn put(&self, late: LateAnswer) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(late);
        }
    }
}

/// No answer within the timeout.
#[derive(Debug)]
pub struct TimedOut {
    pub after: Duration,
}

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "no answer within {:?}", self.after)
    }
}

impl std::error::Error for TimedOut {}

#[derive(Clone)]
pub struct TimeoutLayer {
    timeout: Duration,
    late_window: Duration,
}

impl TimeoutLayer {
    pub fn new(timeout: Duration, late_window: Duration) -> Self {
        TimeoutLayer {
            timeout,
            late_window,
        }
    }
}

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;
    fn layer(&self, inner: S) -> Timeout<S> {
        Timeout {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Timeout<S> {
    inner: S,
    layer: TimeoutLayer,
}

impl<S, ReqBody, B> Service<Request<ReqBody>> for Timeout<S>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    // Unpin: the attempt is awaited in place, and on a timeout moved into
    // the task that waits for its late answer.
    S::Future: Send + Unpin + 'static,
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let TimeoutLayer {
            mut timeout,
            late_window,
        } = self.layer;
        if let Some(Deadline(at)) = req.extensions().get::<Deadline>() {
            timeout = timeout.min(at.saturating_duration_since(tokio::time::Instant::now()));
        }
        let slot = req
            .extensions()
            .get::<LateSlot>()
            .filter(|_| !late_window.is_zero())
            .cloned();
        let mut fut = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout(timeout, &mut fut).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => {
                    if let Some(slot) = slot {
                        let (tx, rx) = oneshot::channel();
                        tokio::spawn(async move {
                            if let Ok(Ok(resp)) = tokio::time::timeout(late_window, fut).await {
                                let _ = tx.send(resp.status().as_u16());
                                // So that its connection goes back to the pool.
                                super::drain(resp.into_body());
                            }
                        });
                        slot.put(rx);
                    }
                    Err(Box::new(TimedOut { after: timeout }) as BoxError)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Empty;
    use tower::ServiceExt;

    fn slow(
        after: Duration,
    ) -> impl Service<
        Request<()>,
        Response = Response<Empty<Bytes>>,
        Error = BoxError,
        Future: Send + Unpin + 'static,
    > + Clone {
        tower::service_fn(move |_: Request<()>| async move {
            tokio::time::sleep(after).await;
            let resp = Response::builder().status(201).body(Empty::new());
            Ok::<_, BoxError>(resp.expect("response"))
        })
        .map_future(Box::pin)
    }

    fn req() -> Request<()> {
        Request::new(())
    }

    /// A request carrying a slot for its late answer, and the slot.
    fn with_slot() -> (Request<()>, LateSlot) {
        let slot = LateSlot::default();
        let mut r = req();
        r.extensions_mut().insert(slot.clone());
        (r, slot)
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_answer_within_the_window_is_handed_over() {
        let svc = TimeoutLayer::new(Duration::from_millis(200), Duration::from_secs(3))
            .layer(slow(Duration::from_millis(500)));
        let (r, slot) = with_slot();
        let err = svc.oneshot(r).await.expect_err("times out");
        assert!(err.is::<TimedOut>(), "{err}");
        let late = slot.take().expect("late channel");
        assert_eq!(late.await, Ok(201));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_after_the_window_is_not_and_zero_disables_waiting() {
        let svc = TimeoutLayer::new(Duration::from_millis(200), Duration::from_secs(1))
            .layer(slow(Duration::from_secs(5)));
        let (r, slot) = with_slot();
        svc.oneshot(r).await.expect_err("times out");
        assert!(slot.take().expect("channel").await.is_err());
        let svc = TimeoutLayer::new(Duration::from_millis(200), Duration::ZERO)
            .layer(slow(Duration::from_secs(5)));
        let (r, slot) = with_slot();
        svc.oneshot(r).await.expect_err("times out");
        assert!(slot.take().is_none(), "no window: nothing waits");
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_before_the_timeout_cuts_the_attempt_there() {
        let started = tokio::time::Instant::now();
        let with_deadline = |after: Duration| {
            let mut r = req();
            r.extensions_mut().insert(Deadline(started + after));
            r
        };
        let svc = TimeoutLayer::new(Duration::from_secs(2), Duration::ZERO)
            .layer(slow(Duration::from_secs(5)));
        let err = svc
            .clone()
            .oneshot(with_deadline(Duration::from_millis(700)))
            .await
            .expect_err("cut");
        let timed_out = err.downcast_ref::<TimedOut>().expect("TimedOut");
        assert_eq!(timed_out.after, Duration::from_millis(700));
        assert_eq!(started.elapsed(), Duration::from_millis(700));
        // A deadline after the timeout leaves the timeout as it is.
        let err = svc
            .oneshot(with_deadline(Duration::from_secs(60)))
            .await
            .expect_err("times out");
        let timed_out = err.downcast_ref::<TimedOut>().expect("TimedOut");
        assert_eq!(timed_out.after, Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn answers_in_time_pass_through() {
        let svc = TimeoutLayer::new(Duration::from_secs(1), Duration::from_secs(1))
            .layer(slow(Duration::from_millis(10)));
        assert_eq!(svc.oneshot(req()).await.expect("in time").status(), 201);
    }
}
