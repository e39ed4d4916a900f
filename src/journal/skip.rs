//! Deliveries of events the indexer has not reached yet. Such an event is
//! never inserted into SQLite: the indexer passes over it when it gets to
//! its record, and the synced commit that moves the log position past that
//! record is what makes the delivery durable. A crash before then replays
//! the record and delivers the event again, which at-least-once allows.
//!
//! One lock orders the sides: a delivery either lands here before the
//! indexer claims its record (and is skipped), or finds the record claimed
//! and goes to the indexer as a delete of a row that will exist; the
//! writer puts an event in the ready queue only while it is unclaimed.
//!
//! What the writer handed out with an unclaimed event (its destination's
//! counters and its size) waits here too: a delivery is settled by seq
//! alone, and the journal frees the counters from what it recorded
//! itself, never from what the caller says the event was.

use crate::history::Step;
use std::collections::BTreeMap;

/// What `Skip::delivered` made of a delivery.
#[derive(Debug, PartialEq)]
pub enum Delivered<T> {
    /// Settled here: free what the event was handed out with.
    Now(T),
    /// A retried settle of a delivery settled before: nothing to free.
    Again,
    /// Not handed out from memory: for the indexer, from its row.
    NotHanded,
}

pub struct Skip<T> {
    /// The highest seq the indexer has claimed (inserted or skipped).
    claimed: i64,
    /// Delivered seqs above `claimed`, to leave out when it gets there,
    /// with what history records of their delivery.
    delivered: BTreeMap<i64, Option<Step>>,
    /// Events handed out from memory and not claimed yet.
    handed: BTreeMap<i64, T>,
}

impl<T> Skip<T> {
    pub fn new(claimed: i64) -> Self {
        Skip {
            claimed,
            delivered: BTreeMap::new(),
            handed: BTreeMap::new(),
        }
    }

    /// The writer hands out `seq`, not claimed yet, with `what`.
    pub fn hand(&mut self, seq: i64, what: T) {
        debug_assert!(!self.claimed(seq));
        self.handed.insert(seq, what);
    }

    /// Records the delivery of `seq`, whose record must not be claimed yet
    /// (else it is, or will be, a row for the indexer to delete). Only an
    /// event handed out from memory is settled here, freed by what it was
    /// handed out with; any other is the indexer's, which frees it from
    /// its row.
    pub fn delivered(&mut self, seq: i64, step: Option<Step>) -> Delivered<T> {
        debug_assert!(!self.claimed(seq));
        if self.delivered.contains_key(&seq) {
            return Delivered::Again;
        }
        match self.handed.remove(&seq) {
            Some(what) => {
                self.delivered.insert(seq, step);
                Delivered::Now(what)
            }
            None => Delivered::NotHanded,
        }
    }

    /// Whether the indexer has taken the record of `seq`.
    pub fn claimed(&self, seq: i64) -> bool {
        seq <= self.claimed
    }

    /// The indexer takes the records holding `seqs` (ascending): returns
    /// which of them to insert. Called again for the same records after a
    /// failed commit, it answers the same.
    pub fn claim(&mut self, seqs: impl IntoIterator<Item = i64>) -> Vec<bool> {
        seqs.into_iter()
            .map(|seq| {
                self.claimed = self.claimed.max(seq);
                // A row now, or skipped: a delivery goes to the indexer.
                self.handed.remove(&seq);
                !self.delivered.contains_key(&seq)
            })
            .collect()
    }

    /// What history records of the skipped delivery of `seq`.
    pub fn step(&self, seq: i64) -> Option<&Step> {
        self.delivered.get(&seq).and_then(Option::as_ref)
    }

    /// After a commit of the records up to `seq`: the deliveries skipped
    /// there are settled. Claimed records beyond it (a commit that failed)
    /// keep theirs, to be skipped again.
    pub fn committed(&mut self, seq: i64) {
        let rest = self.delivered.split_off(&(seq + 1));
        self.delivered = rest;
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.delivered.len()
    }

    #[cfg(test)]
    pub fn handed(&self) -> usize {
        self.handed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands `seq` out (with its seq as the payload) and delivers it.
    fn deliver(s: &mut Skip<i64>, seq: i64) -> Option<i64> {
        s.hand(seq, seq * 100);
        match s.delivered(seq, None) {
            Delivered::Now(what) => Some(what),
            _ => None,
        }
    }

    #[test]
    fn a_delivery_before_the_claim_is_skipped_and_one_after_is_for_the_indexer() {
        let mut s = Skip::new(10);
        assert!(s.claimed(10), "seq 10 is already a row");
        assert!(!s.claimed(12));
        assert_eq!(deliver(&mut s, 12), Some(1200));
        assert_eq!(s.claim([11, 12, 13]), vec![true, false, true]);
        assert!(s.claimed(13) && !s.claimed(14));
        assert_eq!(deliver(&mut s, 14), Some(1400));
    }

    #[test]
    fn the_same_delivery_twice_is_recorded_once_and_counted_once() {
        let mut s = Skip::new(0);
        assert_eq!(deliver(&mut s, 5), Some(500));
        assert_eq!(
            s.delivered(5, None),
            Delivered::Again,
            "a retried settle must not count it again"
        );
        assert_eq!(s.len(), 1);
        assert_eq!(s.handed(), 0);
    }

    #[test]
    fn an_event_never_handed_out_is_left_to_the_indexer() {
        let mut s: Skip<i64> = Skip::new(0);
        assert_eq!(s.delivered(3, None), Delivered::NotHanded);
        assert_eq!(s.len(), 0, "not skipped: its row frees it");
        assert_eq!(s.claim([3]), vec![true], "the indexer inserts its row");
    }

    #[test]
    fn a_claim_forgets_what_was_handed_out_with_its_records() {
        let mut s = Skip::new(0);
        for seq in 1..=4 {
            s.hand(seq, seq);
        }
        assert_eq!(s.claim([1, 2]), vec![true, true]);
        assert_eq!(s.handed(), 2, "3 and 4 are not rows yet");
        assert_eq!(s.delivered(3, None), Delivered::Now(3));
        s.claim([3, 4]);
        assert_eq!(s.handed(), 0);
    }

    #[test]
    fn a_retried_claim_answers_the_same_until_committed() {
        let mut s = Skip::new(0);
        assert!(deliver(&mut s, 2).is_some());
        assert_eq!(s.claim([1, 2, 3]), vec![true, false, true]);
        // The commit failed: the same records are claimed again.
        assert_eq!(s.claim([1, 2, 3]), vec![true, false, true]);
        s.committed(3);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn a_smaller_commit_after_a_failed_one_keeps_the_rest_skipped() {
        let mut s = Skip::new(0);
        for seq in [2, 6] {
            assert!(deliver(&mut s, seq).is_some());
        }
        // Records 1..=8 claimed, their commit failed; then only 1..=4 made it.
        assert_eq!(s.claim(1..=8).iter().filter(|i| !**i).count(), 2);
        s.committed(4);
        assert_eq!(s.len(), 1);
        assert_eq!(s.claim(5..=8), vec![true, false, true, true]);
        s.committed(8);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn committing_keeps_deliveries_beyond_the_claim() {
        let mut s = Skip::new(0);
        for seq in [3, 7, 9] {
            assert!(deliver(&mut s, seq).is_some());
        }
        assert_eq!(
            s.claim([1, 2, 3, 4, 5]),
            vec![true, true, false, true, true]
        );
        s.committed(5);
        assert_eq!(s.len(), 2, "7 and 9 wait for their records");
        assert_eq!(s.claim([6, 7, 8, 9]), vec![true, false, true, false]);
        s.committed(9);
        assert_eq!(s.len(), 0);
    }
}
