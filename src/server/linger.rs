//! Lingering close for HTTP/1, as nginx's `lingering_close`: when a
//! request's body was not read to its end (a refusal by its headers, such
//! as 404, 401, 503 while draining or 413 by its declared length; a body
//! past `max_body_bytes`), the rest is read and dropped after the answer.
//!
//! hyper closes a connection whose request body was left unread, and the
//! kernel answers bytes still arriving on a closed socket with a reset.
//! Most HTTP clients (Python's, Node's, the Azure SDKs') write the whole
//! body before reading the answer: they met the reset, not the answer, so
//! an app saw a broken connection where a 413 said why, and could send the
//! same oversize event again forever.
//!
//! The connection counts as busy (its `Activity`) for as long as the body
//! lives, wherever a handler keeps it, and until its rest is read: hyper
//! is still in the middle of that request, and a connection taken apart
//! to rest (`rest`) or closed as idle meanwhile would have its body's next
//! bytes parsed as a request of their own.
//!
//! Bounded: at most `max(LINGER_BYTES, max_body_bytes)` bytes (a body that
//! declares more is cut at once), only until the body's deadline
//! (`BODY_DEADLINE` from the request's head), and at most [`SLOTS`] bodies
//! at once on a listener, as each is read through hyper's buffer (which
//! grows to about 400 KiB on a fast sender); a body beyond any of these is
//! cut as before, and so is one refused 503 `memory_budget`, over
//! `ingress.max_inflight_bytes` ([`Lingering::cut`]): memory comes first
//! there. A client trickling a refused body holds its slot until that
//! deadline: 32 of them hold all, and refusals meanwhile are cut as
//! before (nginx also bounds the wait between reads, `lingering_timeout`;
//! not done here). A client waiting for `100 Continue` before it sends the
//! body gets the answer instead and sends none, so such a body is read
//! only if the handler had started reading it. HTTP/2 needs none of this: an answer before the body ends
//! the stream with `RST_STREAM(NO_ERROR)`, which clients read as the end.

use super::BODY_DEADLINE;
use super::idle::{Activity, Busy};
use bytes::{Buf, Bytes};
use http::Version;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Read after the answer at least this much of a body left unread.
const LINGER_BYTES: usize = 64 * 1024 * 1024;

/// Bodies read after their answers at once, per listener.
pub(super) const SLOTS: usize = 32;

/// What an HTTP/1 connection lends its requests (as an extension), for a
/// body to be read after its answer: the connection's activity, kept busy
/// meanwhile, and the listener's slots.
#[derive(Clone)]
pub(super) struct Linger {
    activity: Arc<Activity>,
    slots: Arc<Semaphore>,
}

impl Linger {
    pub(super) fn new(activity: Arc<Activity>, slots: Arc<Semaphore>) -> Self {
        Linger { activity, slots }
    }
}

/// A request body that is read to its end when dropped unread.
pub struct Lingering {
    body: Option<Incoming>,
    /// What a read after the answer takes: the listener's slots, and the
    /// connection kept busy for as long as this body lives, wherever a
    /// handler keeps it, then while it is read. `None` where nothing may
    /// be read after the answer: HTTP/2, a connection that lends nothing
    /// (one served beyond the cap, which closes after its answer anyway),
    /// or a body `cut`.
    lent: Option<(Arc<Semaphore>, Busy)>,
    /// The client waits for `100 Continue` before it sends the body.
    expects_continue: bool,
    /// The handler started reading it (hyper sent `100 Continue`, if asked).
    polled: bool,
    /// Read to its end, or failed: nothing left to read.
    ended: bool,
    limit: usize,
    deadline: Instant,
}

impl Lingering {
    /// `body` of a request with `head`; `max_body` is the listener's
    /// `max_body_bytes`.
    pub fn new(body: Incoming, head: &http::request::Parts, max_body: u64) -> Self {
        let http1 = head.version <= Version::HTTP_11;
        let lent = head
            .extensions
            .get::<Linger>()
            .filter(|_| http1)
            .map(|l| (l.slots.clone(), l.activity.begin()));
        Lingering {
            body: Some(body),
            lent,
            // The last `Expect`, as hyper reads it to send `100 Continue`.
            expects_continue: head.version == Version::HTTP_11
                && head
                    .headers
                    .get_all(http::header::EXPECT)
                    .iter()
                    .next_back()
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue")),
            polled: false,
            ended: false,
            limit: usize::try_from(max_body)
                .unwrap_or(usize::MAX)
                .max(LINGER_BYTES),
            deadline: Instant::now() + BODY_DEADLINE,
        }
    }

    /// Drops the body with what is left of it unread: hyper closes its
    /// connection. For a refusal that must cost no memory.
    pub fn cut(mut self) {
        self.lent = None;
    }

    /// Whether what is left must be read after the answer.
    fn left_unread(&self, body: &Incoming) -> bool {
        !self.ended
            && (self.polled || !self.expects_continue)
            && !body.is_end_stream()
            && body.size_hint().lower() <= self.limit as u64
    }
}

impl Body for Lingering {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        self.polled = true;
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = std::task::ready!(Pin::new(body).poll_frame(cx));
        if !matches!(frame, Some(Ok(_))) {
            self.ended = true;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let (Some(body), Some((slots, busy))) = (self.body.take(), self.lent.take()) else {
            return;
        };
        if !self.left_unread(&body) || Instant::now() >= self.deadline {
            return;
        }
        let Ok(slot) = slots.try_acquire_owned() else {
            return;
        };
        // Dropped where no runtime runs (a test's teardown): nothing reads
        // this connection any more.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (limit, deadline) = (self.limit, self.deadline);
        runtime.spawn(async move {
            let _held = (slot, busy);
            let read = discard(body, limit);
            let _ = tokio::time::timeout_at(deadline, read).await;
        });
    }
}

/// Reads `body` to its end, or until it passes `limit` bytes, keeping none
/// of it; ends early (the body dropped, so its connection closes) on an
/// error. Also how delivery reads the answers it does not need.
pub fn discard<B: Body + Unpin>(body: B, limit: usize) -> Discard<B> {
    Discard { body, left: limit }
}

/// The future of [`discard`].
pub struct Discard<B> {
    body: B,
    left: usize,
}

impl<B: Body + Unpin> Future for Discard<B> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match std::task::ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let n = frame.data_ref().map_or(0, |d| d.remaining());
                    match self.left.checked_sub(n) {
                        Some(left) => self.left = left,
                        None => return Poll::Ready(()),
                    }
                }
                Some(Err(_)) | None => return Poll::Ready(()),
            }
        }
    }
}
