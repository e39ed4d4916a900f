//! The id hashes of the newest partition's rows, in memory, in place of
//! its `by_id` index while it is written: an event id is random, so each
//! insert into that index dirtied a random page of it, and every commit
//! wrote about a page of WAL per event (6 KiB a row against 0.3 KiB
//! without the index; benches/RESULTS.md). A partition gets the index when
//! it is rolled, built once from sorted keys.
//!
//! A list scanned rather than a map: 12 bytes a row (at most 100,000 rows,
//! `recorder::MAX_ROWS`), appended in commit order, and a scan of the
//! hashes is tens of microseconds, which a lookup by id over HTTP does
//! not notice.

use super::partition::Name;

#[derive(Default)]
pub(super) struct NewestIds {
    /// The partition these rows are in; `None` before the first.
    partition: Option<Name>,
    hashes: Vec<u32>,
    seqs: Vec<i64>,
}

impl NewestIds {
    /// Starts over for `partition`, with the rows it already holds.
    pub fn reset(&mut self, partition: Name, rows: Vec<(u32, i64)>) {
        let (hashes, seqs) = rows.into_iter().unzip();
        *self = NewestIds {
            partition: Some(partition),
            hashes,
            seqs,
        };
    }

    /// Rows committed to `partition`; passed over if it is no longer the
    /// newest (its index holds them).
    pub fn extend(&mut self, partition: &Name, rows: &[(u32, i64)]) {
        if self.partition.as_ref() != Some(partition) {
            return;
        }
        for &(hash, seq) in rows {
            self.hashes.push(hash);
            self.seqs.push(seq);
        }
    }

    /// The seqs in `partition` whose id hashes to `hash`, or `None` when
    /// `partition` is not the newest (its `by_id` index answers).
    pub fn seqs(&self, partition: &Name, hash: u32) -> Option<Vec<i64>> {
        if self.partition.as_ref() != Some(partition) {
            return None;
        }
        Some(
            self.hashes
                .iter()
                .zip(&self.seqs)
                .filter(|(h, _)| **h == hash)
                .map(|(_, s)| *s)
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(first_seq: i64) -> Name {
        Name {
            first_seq,
            start_ms: 1,
        }
    }

    #[test]
    fn answers_for_the_newest_partition_only() {
        let mut ids = NewestIds::default();
        assert_eq!(ids.seqs(&name(0), 7), None, "no partition yet");
        ids.reset(name(0), vec![(7, 1), (8, 2)]);
        ids.extend(&name(0), &[(7, 3)]);
        assert_eq!(ids.seqs(&name(0), 7), Some(vec![1, 3]));
        assert_eq!(ids.seqs(&name(0), 9), Some(vec![]));
        ids.reset(name(4), Vec::new());
        assert_eq!(ids.seqs(&name(0), 7), None, "rolled: its index answers");
        ids.extend(&name(0), &[(7, 5)]);
        assert_eq!(
            ids.seqs(&name(4), 7),
            Some(vec![]),
            "a late extend of the old one"
        );
    }
}
