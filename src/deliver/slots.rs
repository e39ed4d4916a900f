//! A destination's `concurrency` counts attempts on the wire, not the
//! recording of their outcomes. A delivered event that has a row waits
//! for the indexer to commit its delete before its dispatcher may read
//! the index again (it would find the row), but its connection is free
//! and so is its slot once the answer has told the destination's health:
//! holding slots through that commit held a drain of the index well below
//! what more slots gave (`concurrency` is what the endpoint sees; the wait
//! is ours).
//!
//! A counter, not `tokio::sync::Semaphore` or `tower::limit`: a reload
//! changes `concurrency` while attempts hold slots, and a semaphore shrinks
//! only by its free permits, so lowering it under load would need a debt
//! kept beside it, which is this counter again. The dispatcher compares
//! the count with the limit in force at each attempt (`concurrency`, or
//! the one adaptive concurrency learns, which moves with every answer).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Notify;

/// The slots of one dispatcher.
#[derive(Default)]
pub struct Slots {
    taken: AtomicUsize,
    freed: Notify,
}

impl Slots {
    /// Attempts on the wire (or about to be).
    pub fn taken(&self) -> usize {
        self.taken.load(Ordering::Acquire)
    }

    pub fn take(self: &Arc<Self>) -> Slot {
        self.taken.fetch_add(1, Ordering::AcqRel);
        Slot(Arc::clone(self))
    }

    /// Resolves once a slot was given back since the last call (a permit
    /// is kept if none was waiting, so a release is never missed).
    pub async fn freed(&self) {
        self.freed.notified().await;
    }
}

/// One attempt's slot, given back when dropped: once its answer (or its
/// failure) is in, or when the unit ends without an attempt.
pub struct Slot(Arc<Slots>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.taken.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_slot_counts_until_dropped_and_its_release_wakes_the_dispatcher() {
        let slots = Arc::new(Slots::default());
        let (a, b) = (slots.take(), slots.take());
        assert_eq!(slots.taken(), 2);
        let quick = Duration::from_millis(50);
        assert!(
            tokio::time::timeout(quick, slots.freed()).await.is_err(),
            "nothing was given back yet"
        );
        drop(a);
        assert_eq!(slots.taken(), 1);
        // Given back before anyone waited: the wake is kept, not lost.
        assert!(tokio::time::timeout(quick, slots.freed()).await.is_ok());
        let waiter = {
            let slots = Arc::clone(&slots);
            tokio::spawn(async move { slots.freed().await })
        };
        tokio::task::yield_now().await;
        drop(b);
        assert_eq!(slots.taken(), 0);
        assert!(
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .is_ok()
        );
    }
}
