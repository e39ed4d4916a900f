//! The innermost service: send the request, hand back the answer with its
//! body unread. Durable attempts drain it (`drain`); passthrough streams it
//! to the app.

use crate::deliver::HttpsClient;
use crate::deliver::client::Sending;
use crate::server::linger::discard;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower::BoxError;

/// Response bodies beyond this are not read; the status decides anyway.
const MAX_RESPONSE_BODY: usize = 64 * 1024;
/// How long a response body may take to drain before its connection is dropped.
const BODY_DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Clone)]
pub struct HttpService {
    client: HttpsClient,
}

impl HttpService {
    pub fn new(client: HttpsClient) -> Self {
        HttpService { client }
    }
}

impl tower::Service<Request<Full<Bytes>>> for HttpService {
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future = Sending;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Full<Bytes>>) -> Sending {
        self.client.request(req)
    }
}

/// Reads an answer's body nobody needs, so that its connection goes back
/// to the pool; a body too large or too slow costs the connection instead,
/// never an attempt's time. Most answers arrive whole with their head: those
/// are read here and now, and only the rest get a task of their own (one
/// per attempt showed in a drain's profile).
pub fn drain<B>(body: B)
where
    B: hyper::body::Body + Send + Unpin + 'static,
{
    let mut read = discard(body, MAX_RESPONSE_BODY);
    // A poll that finds no data leaves a waker that wakes nothing: the task
    // polls again with its own.
    let mut cx = Context::from_waker(std::task::Waker::noop());
    if Pin::new(&mut read).poll(&mut cx).is_ready() {
        return;
    }
    tokio::spawn(async move {
        let _ = tokio::time::timeout(BODY_DRAIN, read).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::body::{Body, Frame};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::mpsc;

    /// Frames from a channel; an empty chunk ends the body.
    struct Chunks(mpsc::UnboundedReceiver<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            match std::task::ready!(self.0.poll_recv(cx)) {
                Some(b) if !b.is_empty() => Poll::Ready(Some(Ok(Frame::data(b)))),
                _ => Poll::Ready(None),
            }
        }
    }

    /// Ten frames of 16 KiB, counting those taken.
    struct Large(Arc<AtomicUsize>);

    impl Body for Large {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if self.0.fetch_add(1, Ordering::Relaxed) >= 10 {
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![0; 16 * 1024])))))
        }
    }

    #[test]
    fn a_body_already_in_is_read_without_a_task() {
        // Outside a runtime: a spawn would panic.
        drain(Full::new(Bytes::from_static(b"ok")));
        drain(http_body_util::Empty::<Bytes>::new());
    }

    #[test]
    fn a_body_past_the_limit_is_left_unread() {
        let taken = Arc::new(AtomicUsize::new(0));
        drain(Large(taken.clone()));
        // 64 KiB fit in four frames; the fifth is one too many.
        assert_eq!(taken.load(Ordering::Relaxed), 5);
    }

    #[tokio::test]
    async fn a_body_still_coming_is_read_by_a_task_to_its_end() {
        let (tx, rx) = mpsc::unbounded_channel();
        drain(Chunks(rx));
        // The task runs and waits for the body before each part comes.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        tx.send(Bytes::from_static(b"ok")).expect("send");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        tx.send(Bytes::new()).expect("send");
        // The body is dropped once read to its end.
        tokio::time::timeout(std::time::Duration::from_secs(5), tx.closed())
            .await
            .expect("the body was read to its end");
    }
}
