//! Forming batches (docs/batching.md) from the events a dispatcher holds ready,
//! in due order. Pure, so the rules are tested without I/O:
//!
//! - events that share a stored batch id (a batch that failed and is being
//!   retried) go together, whatever the limits say now: the receiver sees
//!   the same batch under the same `webhook-id` again;
//! - other events are packed in order from the front; a batch closes at
//!   `max_events`, or when the next event would make the JSON array larger
//!   than `preferred_size`; an event larger than that on its own goes alone;
//! - optimistic: only what is ready now is taken, a batch is never held
//!   back to fill up (waiting would add latency to every event under light
//!   load, and the journal already groups a burst into ready events).

use crate::config::settings::BatchSettings;
use crate::event::StoredEvent;
use std::collections::VecDeque;

/// What forming needs to know about an event.
pub trait Member {
    /// The stored batch id, when the event was attempted in a batch.
    fn batch(&self) -> Option<&str>;
    /// Bytes of its body in the batch's array.
    fn size(&self) -> usize;
}

impl Member for StoredEvent {
    fn batch(&self) -> Option<&str> {
        self.batch.as_deref()
    }
    fn size(&self) -> usize {
        self.event.body.len()
    }
}

/// Takes the next batch from the front of `ready` (empty only when
/// `ready` is). With batching off, that is the front event alone.
pub fn take<T: Member>(ready: &mut VecDeque<T>, limits: BatchSettings) -> Vec<T> {
    let Some(front) = ready.front() else {
        return Vec::new();
    };
    if !limits.enabled() {
        return ready.pop_front().into_iter().collect();
    }
    if let Some(id) = front.batch().map(str::to_string) {
        // Siblings are read together, so they are usually adjacent; the
        // scan also finds any that a later read put further back.
        let mut batch = Vec::new();
        let mut rest = VecDeque::with_capacity(ready.len());
        for e in ready.drain(..) {
            if e.batch() == Some(id.as_str()) {
                batch.push(e);
            } else {
                rest.push_back(e);
            }
        }
        *ready = rest;
        return batch;
    }
    let mut taken = Vec::new();
    // `[` and `]`, then each body and the commas between them.
    let mut size = 2;
    while taken.len() < limits.max_events {
        let Some(next) = ready.front() else { break };
        if next.batch().is_some() {
            break;
        }
        let add = next.size() + usize::from(!taken.is_empty());
        if !taken.is_empty() && size + add > limits.preferred_size {
            break;
        }
        size += add;
        taken.extend(ready.pop_front());
        if size >= limits.preferred_size {
            break;
        }
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct E {
        n: u32,
        size: usize,
        batch: Option<&'static str>,
    }

    impl Member for E {
        fn batch(&self) -> Option<&str> {
            self.batch
        }
        fn size(&self) -> usize {
            self.size
        }
    }

    fn e(n: u32, size: usize) -> E {
        E {
            n,
            size,
            batch: None,
        }
    }

    fn stored(n: u32, batch: &'static str) -> E {
        E {
            n,
            size: 10,
            batch: Some(batch),
        }
    }

    fn limits(max_events: usize, preferred_size: usize) -> BatchSettings {
        BatchSettings {
            max_events,
            preferred_size,
        }
    }

    /// Every batch `take` forms from `events`, as event numbers.
    fn form(events: Vec<E>, l: BatchSettings) -> Vec<Vec<u32>> {
        let mut ready: VecDeque<E> = events.into();
        let mut out = Vec::new();
        // Each round takes at least one event.
        for _ in 0..ready.len() {
            let batch = take(&mut ready, l);
            if batch.is_empty() {
                break;
            }
            out.push(batch.iter().map(|e| e.n).collect());
        }
        assert!(ready.is_empty(), "every event is taken");
        out
    }

    #[test]
    fn batching_off_takes_one_event_at_a_time_even_of_a_stored_batch() {
        let events = vec![e(1, 10), stored(2, "b"), stored(3, "b")];
        assert_eq!(
            form(events, limits(1, 1024)),
            vec![vec![1], vec![2], vec![3]]
        );
        assert!(take::<E>(&mut VecDeque::new(), limits(5, 1024)).is_empty());
    }

    #[test]
    fn max_events_closes_a_batch_in_due_order() {
        let events = (1..=7).map(|n| e(n, 10)).collect();
        assert_eq!(
            form(events, limits(3, 64 * 1024)),
            vec![vec![1, 2, 3], vec![4, 5, 6], vec![7]]
        );
    }

    #[test]
    fn preferred_size_closes_a_batch_before_the_body_would_pass_it() {
        // [a,b,c] = 2 + 3 * 300 + 2 = 904 bytes fits 1000; a fourth does not.
        let events = (1..=5).map(|n| e(n, 300)).collect();
        assert_eq!(
            form(events, limits(100, 1000)),
            vec![vec![1, 2, 3], vec![4, 5]]
        );
        // Exactly at the limit: [x,y] = 2 + 499 + 1 + 498 = 1000.
        let events = vec![e(1, 499), e(2, 498), e(3, 1)];
        assert_eq!(form(events, limits(100, 1000)), vec![vec![1, 2], vec![3]]);
    }

    #[test]
    fn an_event_larger_than_preferred_size_goes_alone() {
        let events = vec![e(1, 10), e(2, 10 * 1024), e(3, 10), e(4, 10)];
        assert_eq!(
            form(events, limits(100, 4096)),
            vec![vec![1], vec![2], vec![3, 4]]
        );
    }

    #[test]
    fn a_stored_batch_goes_whole_and_alone_whatever_the_limits() {
        let events = vec![
            stored(1, "a"),
            e(2, 10),
            stored(3, "a"),
            e(4, 10),
            stored(5, "b"),
            stored(6, "b"),
            stored(7, "b"),
            e(8, 10),
            stored(9, "a"),
        ];
        // `b` has more events than max_events allows now: still whole.
        assert_eq!(
            form(events, limits(2, 64 * 1024)),
            vec![vec![1, 3, 9], vec![2, 4], vec![5, 6, 7], vec![8]]
        );
    }

    #[test]
    fn packing_stops_at_a_stored_batch_member_and_keeps_order() {
        let events = vec![e(1, 10), e(2, 10), stored(3, "s"), e(4, 10)];
        assert_eq!(
            form(events, limits(10, 64 * 1024)),
            vec![vec![1, 2], vec![3], vec![4]]
        );
    }
}
