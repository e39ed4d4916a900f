//! The spill: copies the events of the rows still pointing into one
//! segment the writer has left, and that is less than half live, into
//! their rows: one event retried for hours must not keep 16 MiB of
//! delivered ones on the volume. A segment mostly live (a paused
//! destination's backlog) stays: copying it would only double its bytes
//! for a while. Nor, for a while, one whose events are still going out
//! (`settled`): a drain frees it, and copying its rest would write those
//! events twice for nothing (benches/RESULTS.md). A packed event
//! (journal/pack.rs) is copied packed, so what a copy writes is about what
//! its events take of the segment (`Pin::bytes`).

use super::IndexError;
use crate::journal::disk::Disk;
use crate::journal::fetch::{Fetch, Log};
use crate::journal::intake::{self, ReadError};
use crate::journal::store::{self, Pin};
use rusqlite::Connection;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the segments rows point into are looked at for a spill.
pub(in crate::journal) const SPILL_EVERY: Duration = Duration::from_secs(1);
/// The longest a segment waits for a spill while its events go on going
/// out: a slow trickle (retries delivered one by one from many old
/// segments) must not keep every such segment on the volume for hours.
/// A drain of 800 events/s empties half a segment of 1 KiB events within it.
const SPILL_WAITS_AT_MOST: Duration = Duration::from_secs(10);

pub(super) struct Spill {
    /// When a look found nothing to take (or failed): the next waits
    /// `SPILL_EVERY`.
    rested: Instant,
    /// Segments a spill could not copy anything out of (every row left is
    /// unreadable), with their row count then: passed over until it
    /// changes, so one damaged event does not hold back every later spill.
    unspillable: HashMap<u64, i64>,
    /// Segments a spill could take: their count of waiting events, since
    /// when it has stayed so, and since when they could be taken.
    settling: HashMap<u64, (i64, Instant, Instant)>,
}

/// What the indexer's state a spill reads.
pub(super) struct Segments<'a> {
    pub conn: &'a Connection,
    pub disk: &'a Arc<dyn Disk>,
    pub dir: &'a Path,
    pub pins: &'a BTreeMap<u64, Pin>,
    /// The log position up to which rows are synced: a segment after it
    /// is not taken.
    pub durable: u64,
}

impl Spill {
    pub fn new() -> Spill {
        Spill {
            rested: Instant::now(),
            unspillable: HashMap::new(),
            settling: HashMap::new(),
        }
    }

    pub fn due(&self) -> bool {
        self.rested.elapsed() >= SPILL_EVERY
    }

    /// Waits `SPILL_EVERY` before the next look.
    pub fn rest(&mut self) {
        self.rested = Instant::now();
    }

    /// Spills at most one segment. `None` when none is to be taken; else
    /// what the commit changed in the pins (nothing when the segment's
    /// rows could not be read), and another segment may be waiting.
    pub fn once(&mut self, at: Segments<'_>) -> Result<Option<BTreeMap<u64, Pin>>, IndexError> {
        let sizes = intake::segments_on(&**at.disk, at.dir).map_err(ReadError::Io)?;
        let Some((start, size)) = self.pick(&sizes, at.pins, at.durable, Instant::now()) else {
            return Ok(None);
        };
        self.unspillable.retain(|s, _| at.pins.contains_key(s));
        let events = at.pins.get(&start).map_or(0, |p| p.events);
        let seqs = super::seqs_in(at.disk, at.dir, start, size);
        let placed = store::placed_in(at.conn, start, start + size, seqs)?;
        let mut fetch = Fetch::new(Log {
            disk: &**at.disk,
            dir: at.dir,
        });
        let mut moved = Vec::with_capacity(placed.len());
        for (seq, place) in placed {
            // A row whose event cannot be read keeps the segment: it stays
            // for an operator, and the row is quarantined when it is due.
            match fetch.event(place, seq) {
                Ok(Some(l)) => moved.push((l, place)),
                Ok(None) => {}
                Err(e) => {
                    self.unspillable.insert(start, events);
                    return Err(ReadError::Io(e).into());
                }
            }
        }
        if moved.is_empty() {
            self.unspillable.insert(start, events);
            return Ok(Some(BTreeMap::new()));
        }
        let deltas = store::commit::spill(at.conn, start, &moved)?;
        tracing::debug!(
            segment = start,
            events = moved.len(),
            "copied waiting events out of an intake log segment"
        );
        Ok(Some(deltas))
    }

    /// The first segment to take, if any, remembering how long each one
    /// that could be taken has kept its count.
    fn pick(
        &mut self,
        sizes: &[(u64, u64, std::path::PathBuf)],
        pins: &BTreeMap<u64, Pin>,
        durable: u64,
        now: Instant,
    ) -> Option<(u64, u64)> {
        let mut candidates = HashMap::new();
        let mut found = None;
        for &(start, size, _) in sizes {
            let Some(pin) = pins.get(&start) else {
                continue;
            };
            if start + size > durable
                || (pin.bytes.max(0) as u64) * 2 >= size
                || self.unspillable.get(&start) == Some(&pin.events)
            {
                continue;
            }
            let (since, first) = match self.settling.get(&start) {
                Some(&(events, since, first)) if events == pin.events => (since, first),
                Some(&(_, _, first)) => (now, first),
                None => (now, now),
            };
            candidates.insert(start, (pin.events, since, first));
            if found.is_none() && settled(now - since, now - first) {
                found = Some((start, size));
            }
        }
        self.settling = candidates;
        found
    }
}

/// Whether a segment a spill could take is taken: once its count of
/// waiting events has stayed the same for `SPILL_EVERY` (nothing goes out
/// of it any more), or once it has waited `SPILL_WAITS_AT_MOST`.
fn settled(unchanged_for: Duration, waited: Duration) -> bool {
    unchanged_for >= SPILL_EVERY || waited >= SPILL_WAITS_AT_MOST
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spill_waits_while_events_go_out_but_not_for_ever() {
        let ms = Duration::from_millis;
        // Nothing went out of it for a look's time: taken.
        assert!(settled(SPILL_EVERY, SPILL_EVERY));
        // Still going out: left to free itself...
        assert!(!settled(SPILL_EVERY - ms(1), SPILL_EVERY));
        assert!(!settled(ms(200), SPILL_WAITS_AT_MOST - ms(1)));
        // ...up to a bound.
        assert!(settled(ms(200), SPILL_WAITS_AT_MOST));
    }
}
