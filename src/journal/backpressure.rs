//! Ingress keeps pace with delivery. While a destination is delivering
//! (its last attempt was not retried, and its dispatcher is not held back
//! by a pause, a probation or a Retry-After) but its ready queue is nearly
//! full, courier is not keeping
//! up with the app: an append for it waits for room, at most `MAX_WAIT`,
//! before it is stored anyway (then it waits in the index). The app's
//! requests slow down to the delivery rate instead of the journal filling
//! towards `journal.max_bytes`. A destination that is held back is not
//! paced, nor one whose endpoint fails: buffering events through an
//! outage is courier's job, up to its share of the journal
//! (`Shared::reserve`), which refuses only that destination's events.
//!
//! Both halves of the signal are the journal's: the dispatcher only says
//! whether it is delivering (`DestinationState::pace`); the queue's fill
//! is read here, and `DestinationState::take_ready` wakes the waiters.

use super::{DestinationState, NewEvent, Shared};
use smallvec::SmallVec;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The longest one append waits for a destination's ready queue.
pub const MAX_WAIT: Duration = Duration::from_millis(500);

/// Waits (bounded) until every destination of `events` that is
/// delivering has room in its ready queue.
pub(super) async fn keep_pace(shared: &Shared, events: &[NewEvent]) {
    // A list, not a set: a request names one destination, or a topic's
    // few, and hashing each name cost more than the scan (a profile of
    // accept-only, benches/RESULTS.md); the one inline, not allocated.
    let mut names: SmallVec<[&str; 1]> = SmallVec::new();
    for e in events {
        let name = e.destination.as_str();
        if names.last() != Some(&name) && !names.contains(&name) {
            names.push(name);
        }
    }
    let deadline = tokio::time::Instant::now() + MAX_WAIT;
    for name in names {
        let Some(state) = shared.destination(name) else {
            continue;
        };
        // Bounded by the deadline.
        loop {
            let room = state.room.notified();
            if !behind(&state) {
                break;
            }
            if tokio::time::timeout_at(deadline, room).await.is_err() {
                break;
            }
        }
    }
}

fn behind(state: &DestinationState) -> bool {
    state.delivering.load(Ordering::Relaxed) && state.ready.lock().is_ok_and(|r| r.nearly_full())
}
