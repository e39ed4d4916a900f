//! Closing connections that ask nothing, whatever their protocol.
//!
//! hyper's only timer on a server connection is HTTP/1's header-read
//! timeout, and it runs only once hyper knows the connection is HTTP/1. Two
//! states had no timer at all: `auto::Builder` reading up to the 24 bytes
//! of the h2c preface to tell HTTP/1 from HTTP/2 (a client that sent `P`
//! and then nothing waited there forever), and an HTTP/2 connection with no
//! open stream (hyper has no idle timeout for it; a keep-alive PING does
//! not help, as a live but idle client answers it). Either held a slot of
//! the connection cap for good.
//!
//! So each connection counts the requests being handled on it: the service
//! is wrapped in [`Tracked`], and [`idle`] resolves once no request has been
//! handled for the timeout (from the connection's start or the end of its
//! last answer's body); the accept loop then shuts the connection down.
//! This bounds every state in which a client asks nothing, in HTTP/1 and
//! HTTP/2 alike. Idleness
//! is counted by requests, not bytes, as Go's HTTP/2 server counts its
//! `IdleTimeout` ("PING frames are not considered activity"): frames that
//! open no stream keep nothing open. What a request may take once handled
//! is the handlers' business (the ingress body deadline). hyper's HTTP/2
//! keep-alive PINGs are not turned on: a half-open connection is either
//! idle, and closed here, or has a handler running, which ends by its own
//! deadline and leaves it idle.

use http::Response;
use hyper::body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use tower::Service;

/// The requests being handled on one connection, and since when none has
/// been.
#[derive(Debug)]
pub(super) struct Activity(Mutex<State>);

#[derive(Debug)]
struct State {
    in_flight: usize,
    /// When `in_flight` last became 0 (or the connection opened).
    since: Instant,
}

impl Activity {
    pub(super) fn new() -> Arc<Activity> {
        Arc::new(Activity(Mutex::new(State {
            in_flight: 0,
            since: Instant::now(),
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request is being handled until the returned guard is dropped.
    pub(super) fn begin(self: &Arc<Self>) -> Busy {
        self.state().in_flight += 1;
        Busy(self.clone())
    }

    /// When the connection becomes idle for `timeout`, if nothing starts
    /// meanwhile; `None` while a request is being handled.
    fn idle_at(&self, timeout: Duration) -> Option<Instant> {
        let s = self.state();
        (s.in_flight == 0).then(|| s.since + timeout)
    }
}

/// One request being handled (or its body read after the answer,
/// `linger`).
pub(super) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut s = self.0.state();
        s.in_flight = s.in_flight.saturating_sub(1);
        if s.in_flight == 0 {
            s.since = Instant::now();
        }
    }
}

/// Resolves once `activity` has handled no request for `timeout`. While a
/// request is being handled it looks again a `timeout` later: the earliest
/// the connection could then be idle for that long.
pub(super) async fn idle(activity: &Activity, timeout: Duration) {
    loop {
        match activity.idle_at(timeout) {
            Some(at) if at <= Instant::now() => return,
            Some(at) => tokio::time::sleep_until(at).await,
            None => tokio::time::sleep(timeout).await,
        }
    }
}

/// A service that counts its calls, from the request head to the end of
/// the answer's body, in the connection's [`Activity`].
#[derive(Clone)]
pub(super) struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Tracked<S> {
    pub(super) fn new(inner: S, activity: Arc<Activity>) -> Self {
        Tracked { inner, activity }
    }
}

impl<S, R, B> Service<R> for Tracked<S>
where
    S: Service<R, Response = Response<B>>,
{
    type Response = Response<Held<B>>;
    type Error = S::Error;
    type Future = Answering<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let busy = self.activity.begin();
        Answering {
            answer: self.inner.call(req),
            busy: Some(busy),
        }
    }
}

pin_project_lite::pin_project! {
    /// A tracked call's answer, to come: named, not boxed, as the
    /// handler's answer is boxed already (`layers::stack`).
    pub(super) struct Answering<F> {
        #[pin]
        answer: F,
        busy: Option<Busy>,
    }
}

impl<F, B, E> Future for Answering<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<Held<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = std::task::ready!(this.answer.poll(cx));
        // Ended here, also when the call failed: the future may be kept
        // after its end (hyper keeps a failed one until the connection ends).
        let busy = this.busy.take();
        Poll::Ready(answer.map(|a| a.map(|body| Held { body, _busy: busy })))
    }
}

/// An answer's body, its request counted as handled until hyper has taken
/// the body's last frame (or dropped it): an answer streamed from an
/// endpoint that pauses (passthrough) is still being sent, and its
/// connection must not rest (`rest`) nor be closed as idle meanwhile.
pub(super) struct Held<B> {
    body: B,
    _busy: Option<Busy>,
}

impl<B: Body + Unpin> Body for Held<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures::FutureExt;
    use http_body_util::{BodyExt, Empty, StreamBody};
    use std::convert::Infallible;
    use tower::ServiceExt;

    const TIMEOUT: Duration = Duration::from_secs(10);

    /// How long `idle` takes to resolve, in paused time.
    async fn idle_after(activity: &Activity) -> Duration {
        let start = Instant::now();
        idle(activity, TIMEOUT).await;
        start.elapsed()
    }

    /// `idle_after`, or `None` if the connection is not idle within a minute.
    async fn idle_within_a_minute(activity: &Activity) -> Option<Duration> {
        let idle = idle_after(activity);
        tokio::time::timeout(Duration::from_secs(60), idle)
            .await
            .ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_asks_nothing_is_idle_at_the_timeout() {
        let activity = Activity::new();
        assert_eq!(idle_after(&activity).await, TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_being_handled_keeps_it_and_idleness_counts_from_the_last_answer() {
        let activity = Activity::new();
        let first = activity.begin();
        let second = activity.begin();
        let watch = tokio::spawn({
            let activity = activity.clone();
            async move { idle_after(&activity).await }
        });
        tokio::time::sleep(Duration::from_secs(25)).await;
        drop(first);
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert!(!watch.is_finished(), "idle while a request was handled");
        drop(second);
        // The last answer at 32 s: idle at 42 s, not before.
        assert_eq!(watch.await.expect("watch"), Duration::from_secs(42));
    }

    #[tokio::test(start_paused = true)]
    async fn a_tracked_call_is_busy_until_its_answer() {
        let activity = Activity::new();
        let slow = tower::service_fn(|wait: u64| async move {
            tokio::time::sleep(Duration::from_secs(wait)).await;
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        });
        // The answer's (empty) body is dropped with it.
        let call = Tracked::new(slow, activity.clone()).oneshot(15).map(drop);
        let ((), idle) = tokio::join!(call, idle_after(&activity));
        assert_eq!(idle, Duration::from_secs(25));
    }

    /// A call dropped before its answer, and one that fails, end their
    /// request then, not when the connection drops what is left of them.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_or_failed_call_ends_its_request_then() {
        let activity = Activity::new();
        let never = tower::service_fn(|()| std::future::pending::<Result<Response<()>, ()>>());
        let call = Tracked::new(never, activity.clone()).oneshot(());
        let cut = tokio::time::timeout(Duration::from_secs(5), call);
        let (cut, idle) = tokio::join!(cut, idle_within_a_minute(&activity));
        assert!(cut.is_err(), "the call never answers");
        assert_eq!(idle, Some(Duration::from_secs(15)), "dropped at 5 s");

        let activity = Activity::new();
        let failing = tower::service_fn(|()| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Err::<Response<()>, _>("refused")
        });
        let mut call = std::pin::pin!(Tracked::new(failing, activity.clone()).oneshot(()));
        let (failed, idle) = tokio::join!(call.as_mut(), idle_within_a_minute(&activity));
        assert!(failed.is_err());
        assert_eq!(
            idle,
            Some(Duration::from_secs(15)),
            "failed at 5 s, the call kept"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_tracked_call_is_busy_until_its_answers_body_ends() {
        let activity = Activity::new();
        let (end, ended) = tokio::sync::oneshot::channel::<()>();
        let last = futures::stream::once(async move {
            let _ = ended.await;
            Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"last")))
        });
        let mut body = Some(StreamBody::new(Box::pin(last)));
        let streamed = tower::service_fn(move |()| {
            let body = body.take();
            async move { Ok::<_, Infallible>(Response::new(body.expect("one call"))) }
        });
        let answer = Tracked::new(streamed, activity.clone())
            .oneshot(())
            .await
            .expect("answer");
        let reader = tokio::spawn(async move { answer.into_body().collect().await });
        let watch = tokio::spawn({
            let activity = activity.clone();
            async move { idle_after(&activity).await }
        });
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(
            !watch.is_finished(),
            "idle while the answer's body was still being sent"
        );
        let _ = end.send(());
        let read = reader.await.expect("reader").expect("body");
        assert_eq!(read.to_bytes(), "last");
        // The body ended at 20 s: idle at 30 s.
        assert_eq!(watch.await.expect("watch"), Duration::from_secs(30));
    }
}
