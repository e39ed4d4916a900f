//! The memory budget of ingress (docs/publishing.md "Memory"): the bytes of request
//! bodies held at once, `ingress.max_inflight_bytes`. Without it, memory
//! grew with the bodies in flight until the container's limit killed
//! courier with acknowledged events in it.
//!
//! A request takes its share before its body is read: the declared
//! `Content-Length`, else `ingress.max_body_bytes`, trimmed to the buffer
//! once read. Without room it is refused at once (503 `memory_budget`),
//! never queued: waiting requests would hold their connections, and a
//! flood would pile up behind them.
//!
//! The share is the owner of the body's `Bytes`, so it comes back when the
//! last slice of the body is dropped, wherever that is: once the journal's
//! writer has written it (the ready queue keeps a copy of its own), or the
//! endpoint has taken it in passthrough, and also after the app hung up
//! first, when a share given back at the answer would let new bodies in
//! while the old ones still wait in the writer's queue.

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::BoxError;

/// Permits are KiB: a `u32` of them covers any body (`max_body_bytes` is
/// at most 256 MiB), and a rounding of under 1 KiB per body is noise.
const UNIT: u64 = 1024;

/// Room for `ingress.max_inflight_bytes` of bodies, shared by every request.
pub(super) struct Budget {
    room: Arc<Semaphore>,
    bytes: u64,
}

impl Budget {
    pub(super) fn new(bytes: u64) -> Budget {
        Budget {
            room: Arc::new(Semaphore::new(permits(bytes) as usize)),
            bytes,
        }
    }

    /// The whole budget, for the refusal's message.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// A share of `bytes`, or `None` while the budget has not that much room.
    pub(super) fn try_take(&self, bytes: u64) -> Option<Share> {
        let permit = self
            .room
            .clone()
            .try_acquire_many_owned(permits(bytes))
            .ok()?;
        Some(Share { permit })
    }
}

/// Whole KiB, rounded up; at most `u32::MAX` (more than any budget has).
fn permits(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX)
}

/// One request's part of the budget.
pub(super) struct Share {
    permit: OwnedSemaphorePermit,
}

impl Share {
    /// Reads `body` (at most `limit` bytes: more is a `LengthLimitError`)
    /// into one buffer of the `declared` size, or, without one, grown by
    /// doubling up to `limit`. Returns it as `Bytes` that hold the share,
    /// trimmed to the buffer, until their last slice is dropped.
    pub(super) async fn read<B>(
        mut self,
        body: B,
        limit: usize,
        declared: Option<usize>,
    ) -> Result<Bytes, BoxError>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let mut body = std::pin::pin!(Limited::new(body, limit));
        // One buffer, not the chunks and then a copy of them: a body is in
        // memory once (plus one chunk) while it is read.
        let mut buf = Vec::with_capacity(declared.unwrap_or(0).min(limit));
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            let need = buf.len() + data.len();
            if need > buf.capacity() {
                // `Limited` ends the body before it passes `limit`.
                let grown = (buf.capacity() * 2).clamp(need, limit.max(need));
                buf.reserve_exact(grown - buf.len());
            }
            buf.extend_from_slice(&data);
        }
        self.trim(buf.capacity() as u64);
        Ok(Bytes::from_owner(Held {
            body: buf,
            _share: self,
        }))
    }

    /// Gives back what is over `bytes`.
    fn trim(&mut self, bytes: u64) {
        let over = self
            .permit
            .num_permits()
            .saturating_sub(permits(bytes) as usize);
        drop(self.permit.split(over));
    }
}

/// A body and the share it holds until it is dropped.
struct Held {
    body: Vec<u8>,
    _share: Share,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use hyper::body::Frame;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    const MIB: u64 = 1 << 20;

    /// A body that comes in `0`'s chunks and no length, as a chunked
    /// request's does.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl hyper::body::Body for Chunks {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(self.0.pop_front().map(|c| Ok(Frame::data(c))))
        }
    }

    fn left(b: &Budget) -> u64 {
        b.room.available_permits() as u64 * UNIT
    }

    #[test]
    fn shares_are_taken_while_there_is_room_and_refused_beyond() {
        let b = Budget::new(3 * MIB);
        let one = b.try_take(MIB).expect("room for one");
        let two = b.try_take(2 * MIB).expect("room for two more");
        assert!(b.try_take(1).is_none(), "the budget is spent");
        drop(one);
        assert_eq!(left(&b), MIB);
        assert!(b.try_take(MIB + 1).is_none(), "rounded up to whole KiB");
        drop(two);
        assert_eq!(left(&b), 3 * MIB);
        assert!(b.try_take(0).is_some(), "an empty body needs no room");
    }

    #[tokio::test]
    async fn a_body_holds_its_share_until_its_last_slice_is_dropped() {
        let b = Budget::new(4 * MIB);
        let share = b.try_take(MIB).expect("room");
        let body = vec![b'x'; MIB as usize];
        let declared = Some(body.len());
        let read = share
            .read(Full::new(Bytes::from(body)), MIB as usize, declared)
            .await
            .expect("read");
        assert_eq!(read.len() as u64, MIB);
        assert_eq!(left(&b), 3 * MIB);
        let slice = read.slice(10..20);
        drop(read);
        assert_eq!(left(&b), 3 * MIB, "a slice still holds the share");
        drop(slice);
        assert_eq!(left(&b), 4 * MIB);
    }

    #[tokio::test]
    async fn a_body_without_a_length_keeps_only_the_buffer_it_filled() {
        let b = Budget::new(4 * MIB);
        let share = b.try_take(MIB).expect("room for the largest body");
        let body = Chunks((0..3).map(|_| Bytes::from(vec![b'y'; 3000])).collect());
        let read = share.read(body, MIB as usize, None).await.expect("read");
        assert_eq!(read.len(), 9000);
        // Doubled from the first chunk: 3000, 6000, 12000 bytes.
        assert_eq!(left(&b), 4 * MIB - 12 * UNIT);
        drop(read);
        assert_eq!(left(&b), 4 * MIB);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_and_gives_its_share_back() {
        let b = Budget::new(MIB);
        let share = b.try_take(MIB).expect("room");
        let e = share
            .read(Full::new(Bytes::from(vec![0u8; 2048])), 1024, None)
            .await
            .expect_err("over the limit");
        assert!(e.is::<http_body_util::LengthLimitError>(), "{e}");
        assert_eq!(left(&b), MIB);
    }
}
