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

use std::collections::BTreeSet;

#[derive(Default)]
pub struct Skip {
    /// The highest seq the indexer has claimed (inserted or skipped).
    claimed: i64,
    /// Delivered seqs above `claimed`, to leave out when it gets there.
    delivered: BTreeSet<i64>,
}

impl Skip {
    pub fn new(claimed: i64) -> Self {
        Skip {
            claimed,
            delivered: BTreeSet::new(),
        }
    }

    /// Records the delivery of `seq`, whose record must not be claimed yet
    /// (else it is, or will be, a row for the indexer to delete); `false`
    /// when it was recorded before.
    pub fn delivered(&mut self, seq: i64) -> bool {
        debug_assert!(!self.claimed(seq));
        self.delivered.insert(seq)
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
                !self.delivered.contains(&seq)
            })
            .collect()
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_before_the_claim_is_skipped_and_one_after_is_for_the_indexer() {
        let mut s = Skip::new(10);
        assert!(s.claimed(10), "seq 10 is already a row");
        assert!(!s.claimed(12));
        assert!(s.delivered(12));
        assert_eq!(s.claim([11, 12, 13]), vec![true, false, true]);
        assert!(s.claimed(13) && !s.claimed(14));
        assert!(s.delivered(14));
    }

    #[test]
    fn the_same_delivery_twice_is_recorded_once() {
        let mut s = Skip::new(0);
        assert!(s.delivered(5));
        assert!(!s.delivered(5), "a retried settle must not count it again");
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn a_retried_claim_answers_the_same_until_committed() {
        let mut s = Skip::new(0);
        assert!(s.delivered(2));
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
            assert!(s.delivered(seq));
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
            assert!(s.delivered(seq));
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
