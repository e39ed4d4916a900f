//! Per destination, the accept times of events the indexer has not reached
//! yet. Such an event is in the log only, in memory (the ready queue, or
//! its dispatcher's hands) and not in SQLite, where `oldest_accepted` looks:
//! the indexer stays a little behind the log on purpose, and a stalled one
//! (a full disk) can stay behind for long. The writer adds one entry per
//! group commit and destination, under the lock the indexer claims records
//! with; the indexer drops entries once their rows are committed (or their
//! events were delivered and skipped).

use std::collections::VecDeque;

#[derive(Default)]
pub struct Unindexed {
    /// Per group, in seq order: the seq of its last event of this
    /// destination, and the oldest accept time among them.
    groups: VecDeque<(i64, u64)>,
}

impl Unindexed {
    pub fn written(&mut self, last_seq: i64, oldest_ms: u64) {
        self.groups.push_back((last_seq, oldest_ms));
    }

    /// Every record up to `seq` is a committed row, or was skipped.
    pub fn indexed_through(&mut self, seq: i64) {
        while self.groups.front().is_some_and(|(last, _)| *last <= seq) {
            self.groups.pop_front();
        }
    }

    /// The first group's oldest accept time: the oldest but for a few ms
    /// (seqs follow accept times, but for requests admitted at once).
    pub fn oldest(&self) -> Option<u64> {
        self.groups.front().map(|(_, ms)| *ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_leaves_once_the_indexer_has_passed_its_last_event() {
        let mut u = Unindexed::default();
        assert_eq!(u.oldest(), None);
        u.written(3, 100);
        u.written(7, 180);
        u.indexed_through(2);
        assert_eq!(u.oldest(), Some(100), "seq 3 is not indexed yet");
        u.indexed_through(5);
        assert_eq!(u.oldest(), Some(180));
        u.indexed_through(7);
        assert_eq!(u.oldest(), None);
    }
}
