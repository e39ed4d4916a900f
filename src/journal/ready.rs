//! A destination's events that are durable in the intake log and not yet
//! taken by its dispatcher: the fast path. The writer puts each event here
//! once its group is synced, so the first attempt goes out from memory,
//! without waiting for the indexer or reading SQLite.
//!
//! Bounded in bytes: beyond the bound an event is left to the index, where
//! the dispatcher finds it as before. The queue is only a cache of the log:
//! what it holds is also in the log (and in SQLite once the indexer gets
//! there), so dropping it loses nothing.

use super::StoredEvent;
use std::collections::BTreeMap;

/// Bytes of events held per destination. Enough for tens of thousands of
/// small events to go out back to back; a paused or slow destination's
/// backlog beyond it waits in the index, not in memory.
const LIMIT: u64 = 4 * 1024 * 1024;

pub struct ReadyQueue {
    /// By seq: taken oldest first, and removable by seq when the
    /// dispatcher meets the same event in the index.
    events: BTreeMap<i64, StoredEvent>,
    bytes: u64,
    limit: u64,
}

impl Default for ReadyQueue {
    fn default() -> Self {
        ReadyQueue::new(LIMIT)
    }
}

impl ReadyQueue {
    pub fn new(limit: u64) -> Self {
        ReadyQueue {
            events: BTreeMap::new(),
            bytes: 0,
            limit,
        }
    }

    /// Holds `ev` unless that would pass the bound; `false`: left to the index.
    pub fn push(&mut self, ev: StoredEvent) -> bool {
        let size = ev.event.size();
        if !self.fits(size) {
            return false;
        }
        self.bytes += size;
        if let Some(old) = self.events.insert(ev.seq, ev) {
            self.bytes -= old.event.size();
        }
        true
    }

    /// Whether an event of `size` bytes would be held.
    pub fn fits(&self, size: u64) -> bool {
        self.bytes + size <= self.limit
    }

    /// Up to `n` events, oldest first, and no more once they hold
    /// `max_bytes` (at least one is taken).
    pub fn take(&mut self, n: usize, max_bytes: u64) -> Vec<StoredEvent> {
        let mut out = Vec::with_capacity(n.min(self.events.len()));
        let mut taken = 0;
        while out.len() < n && (out.is_empty() || taken < max_bytes) {
            let Some((_, ev)) = self.events.pop_first() else {
                break;
            };
            let size = ev.event.size();
            self.bytes -= size;
            taken += size;
            out.push(ev);
        }
        out
    }

    /// Forgets `seqs`: the dispatcher read them from the index instead.
    pub fn remove(&mut self, seqs: impl IntoIterator<Item = i64>) {
        for seq in seqs {
            if let Some(ev) = self.events.remove(&seq) {
                self.bytes -= ev.event.size();
            }
        }
    }

    /// Past seven eighths of the bound: ingress should wait for room.
    pub fn nearly_full(&self) -> bool {
        self.bytes >= self.limit / 8 * 7
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.events.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::NewEvent;

    fn event(seq: i64, body: usize) -> StoredEvent {
        let event = NewEvent {
            id: format!("e{seq}"),
            destination: "d".into(),
            method: "POST".into(),
            path: String::new(),
            headers: Vec::new(),
            body: vec![b'x'; body].into(),
            accepted_ms: 0,
        };
        StoredEvent::fresh(seq, event)
    }

    #[test]
    fn holds_events_up_to_the_byte_bound_and_refuses_beyond() {
        let one = event(1, 100).event.size();
        let mut q = ReadyQueue::new(3 * one);
        assert!(q.push(event(1, 100)));
        assert!(!q.nearly_full());
        assert!(q.push(event(2, 100)));
        assert!(q.push(event(3, 100)));
        assert!(q.nearly_full());
        assert!(!q.push(event(4, 100)), "a fourth event passes the bound");
        assert_eq!(q.len(), 3);
        assert_eq!(q.bytes(), 3 * one);
        // Taking one makes room for exactly one more.
        assert_eq!(q.take(1, u64::MAX).len(), 1);
        assert!(q.push(event(5, 100)));
        assert!(!q.push(event(6, 100)));
    }

    #[test]
    fn gives_events_oldest_first_whatever_the_push_order() {
        let mut q = ReadyQueue::new(LIMIT);
        for seq in [5, 2, 9, 1] {
            assert!(q.push(event(seq, 10)));
        }
        let seqs: Vec<i64> = q.take(3, u64::MAX).iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![1, 2, 5]);
        let rest: Vec<i64> = q.take(10, u64::MAX).iter().map(|e| e.seq).collect();
        assert_eq!(rest, vec![9]);
        assert!(q.is_empty());
        assert_eq!(q.bytes(), 0);
    }

    #[test]
    fn a_take_stops_at_its_byte_bound_after_at_least_one_event() {
        let one = event(1, 100).event.size();
        let mut q = ReadyQueue::new(LIMIT);
        for seq in 1..=5 {
            q.push(event(seq, 100));
        }
        assert_eq!(q.take(10, one * 3 / 2).len(), 2);
        assert_eq!(q.take(10, 0).len(), 1);
        assert_eq!(q.take(10, u64::MAX).len(), 2);
        assert!(q.is_empty());
    }

    #[test]
    fn removing_seqs_read_from_the_index_frees_their_bytes() {
        let mut q = ReadyQueue::new(LIMIT);
        for seq in 1..=4 {
            q.push(event(seq, 50));
        }
        let before = q.bytes();
        q.remove([2, 3, 42]);
        assert_eq!(q.len(), 2);
        assert_eq!(q.bytes(), before / 2);
        let seqs: Vec<i64> = q.take(10, u64::MAX).iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![1, 4]);
    }

    #[test]
    fn the_same_seq_twice_is_held_once() {
        let mut q = ReadyQueue::new(LIMIT);
        q.push(event(7, 10));
        q.push(event(7, 10));
        assert_eq!(q.len(), 1);
        assert_eq!(q.bytes(), event(7, 10).event.size());
    }
}
