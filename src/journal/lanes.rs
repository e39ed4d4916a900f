//! One destination's ordering lanes: every pending event that has a lane,
//! in accept (seq) order per lane. Only a lane's head, its oldest pending
//! event, may be attempted; the others wait until every earlier event of
//! the lane has left the journal (delivered, dead-lettered, dropped).
//!
//! Kept in memory and rebuilt from the stored events at each start: the
//! order is the journal's seq order, which is durable, so nothing about
//! lanes needs a write of its own. What does need one is a waiting event's
//! row: it is stored as due never (`store::WAITING`), so that a
//! dispatcher's scan of due rows never meets the events queued behind a
//! failing head, however many; the head's end makes the next one due
//! (`finish` says which). `waiting` remembers which rows are so marked.
//!
//! An event's lane is found on the publisher's task (`place`), before its
//! append is queued: the writer thread, which every append goes through,
//! only admits it (a key in the body is a JSON parse per event).
//!
//! Hand-written: the bookkeeping is a map and a queue per lane; the point
//! is who may start, and that is the product's rule.

use super::{NewEvent, Shared};
use crate::event::ordering::{Key, Lane, lane_of};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

pub struct Lanes {
    /// Shared with the events placed under it (`Placed`): one placed under
    /// lanes since rebuilt is known by the pointer.
    key: Arc<Key>,
    lanes: HashMap<Lane, Queue>,
    /// Every event in a lane, by seq.
    of: HashMap<i64, Member>,
    /// Events whose turn came since the dispatcher last looked: it may
    /// hold them in memory, waiting (`Turns`).
    turned: Vec<i64>,
    /// More turns came than `turned` keeps: the dispatcher must look at
    /// every event it holds back.
    overflowed: bool,
}

/// Turns kept for the dispatcher: a burst of deliveries between two of its
/// looks, not a whole backlog (a lane's next event is then in the index).
const TURNS: usize = 16_384;

/// An event's lane under the key its destination had when it was placed.
#[derive(Debug)]
pub(crate) struct Placed {
    key: Arc<Key>,
    lane: Option<Lane>,
}

#[cfg(test)]
impl Placed {
    pub(super) fn lane(&self) -> Option<Lane> {
        self.lane
    }
}

/// The lane of each of `events` whose destination has lanes, one entry per
/// event; empty when none has. Called for every append: the destination's
/// key is read once per run of its events (a request's events share one),
/// nothing is allocated for an unordered destination, and the bodies are
/// parsed outside the lanes' lock, which dispatchers take.
pub(super) fn place(shared: &Shared, events: &[NewEvent]) -> Vec<Option<Placed>> {
    let states = shared.destinations.load();
    let mut last: Option<(&str, Option<Arc<Key>>)> = None;
    let mut placed = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if last.as_ref().is_none_or(|(d, _)| *d != e.destination) {
            let key = states
                .get(&e.destination)
                .and_then(|state| state.lanes().as_ref().map(|l| l.key.clone()));
            last = Some((e.destination.as_str(), key));
        }
        let Some((_, Some(key))) = &last else {
            continue;
        };
        if placed.is_empty() {
            placed.resize_with(events.len(), || None);
        }
        placed[i] = Some(Placed {
            key: key.clone(),
            lane: lane_of(key, &e.headers, &e.body),
        });
    }
    placed
}

/// What `Lanes::take_turns` gives the dispatcher.
#[derive(Debug, PartialEq, Eq)]
pub enum Turns {
    /// These events' turns came.
    Some(Vec<i64>),
    /// Too many to keep: look at each event held back.
    All,
}

struct Member {
    lane: Lane,
    /// Its row is stored as waiting: its turn needs a write.
    waiting: bool,
}

#[derive(Default)]
struct Queue {
    /// Seqs in accept order. An event that leaves from the middle (its TTL
    /// ran out) stays here until it reaches the front, where it is passed
    /// over: the front is always a member.
    seqs: VecDeque<i64>,
    members: usize,
    /// Since when its head has been failing (its first retry).
    retrying_since: Option<u64>,
}

/// What `/v1/destinations` and the metrics show of a destination's lanes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LanesView {
    /// Keys with pending events.
    pub lanes: usize,
    /// Keys whose head is being retried while events wait behind it.
    pub blocked: usize,
    /// Since when the longest-blocked lane's head has been failing.
    pub blocked_since_ms: Option<u64>,
}

impl Lanes {
    pub fn new(key: Key) -> Lanes {
        Lanes {
            key: Arc::new(key),
            lanes: HashMap::new(),
            of: HashMap::new(),
            turned: Vec::new(),
            overflowed: false,
        }
    }

    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The lane of `event`, placed as `placed` says: an event placed under
    /// lanes since rebuilt (its destination removed, then added again with
    /// another key, while the append was queued) is placed again here.
    pub(super) fn lane(&self, placed: Option<&Placed>, event: &NewEvent) -> Option<Lane> {
        match placed {
            Some(p) if Arc::ptr_eq(&p.key, &self.key) => p.lane,
            _ => lane_of(&self.key, &event.headers, &event.body),
        }
    }

    /// `seq` was accepted in `lane`; seqs come in ascending order.
    pub fn admit(&mut self, seq: i64, lane: Lane) {
        let q = self.lanes.entry(lane).or_default();
        q.seqs.push_back(seq);
        q.members += 1;
        self.of.insert(
            seq,
            Member {
                lane,
                waiting: false,
            },
        );
    }

    /// Whether `seq` may be attempted: it has no lane, or heads its lane.
    pub fn may_start(&self, seq: i64) -> bool {
        match self.of.get(&seq) {
            None => true,
            Some(m) => self.lanes.get(&m.lane).and_then(|q| q.seqs.front()) == Some(&seq),
        }
    }

    /// Whether `seq`'s row must be stored as waiting: it is behind its
    /// lane's head. Then its turn (`finish`) names it.
    pub fn hold(&mut self, seq: i64) -> bool {
        if self.may_start(seq) {
            return false;
        }
        if let Some(m) = self.of.get_mut(&seq) {
            m.waiting = true;
        }
        true
    }

    /// `seq` left the journal. Returns the next event of its lane when its
    /// row waits, to be made due now.
    pub fn finish(&mut self, seq: i64) -> Option<i64> {
        let m = self.of.remove(&seq)?;
        let q = self.lanes.get_mut(&m.lane)?;
        q.members -= 1;
        if q.seqs.front() != Some(&seq) {
            // From the middle: passed over when it reaches the front.
            return None;
        }
        q.retrying_since = None;
        while let Some(front) = q.seqs.front()
            && !self.of.contains_key(front)
        {
            q.seqs.pop_front();
        }
        let Some(&next) = q.seqs.front() else {
            self.lanes.remove(&m.lane);
            return None;
        };
        if self.turned.len() < TURNS {
            self.turned.push(next);
        } else {
            self.overflowed = true;
        }
        let member = self.of.get_mut(&next)?;
        std::mem::take(&mut member.waiting).then_some(next)
    }

    /// The events whose turn came since the last call.
    pub fn take_turns(&mut self) -> Turns {
        if std::mem::take(&mut self.overflowed) {
            self.turned.clear();
            return Turns::All;
        }
        Turns::Some(std::mem::take(&mut self.turned))
    }

    /// Whether `seq` waits behind a head that is being retried: its turn is
    /// far, so it waits in the index rather than in memory.
    pub fn stalled(&self, seq: i64) -> bool {
        self.of.get(&seq).is_some_and(|m| {
            self.lanes
                .get(&m.lane)
                .is_some_and(|q| q.retrying_since.is_some() && q.seqs.front() != Some(&seq))
        })
    }

    /// `seq` failed and will be retried: when it heads its lane, the lane
    /// is blocked from `now` on, until it leaves.
    pub fn retrying(&mut self, seq: i64, now_ms: u64) {
        if !self.may_start(seq) {
            return;
        }
        if let Some(q) = self.of.get(&seq).and_then(|m| self.lanes.get_mut(&m.lane)) {
            q.retrying_since.get_or_insert(now_ms);
        }
    }

    pub fn view(&self) -> LanesView {
        let mut view = LanesView {
            lanes: self.lanes.len(),
            ..LanesView::default()
        };
        for q in self.lanes.values() {
            if let (Some(since), true) = (q.retrying_since, q.members > 1) {
                view.blocked += 1;
                view.blocked_since_ms = Some(view.blocked_since_ms.map_or(since, |s| s.min(since)));
            }
        }
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_beyond_what_is_kept_ask_for_a_look_at_everything() {
        let mut l = Lanes::new(Key::Destination);
        for seq in 0..(TURNS as i64 + 2) {
            l.admit(seq, 1);
        }
        for seq in 0..=(TURNS as i64) {
            l.finish(seq);
        }
        assert_eq!(l.take_turns(), Turns::All);
        assert_eq!(l.take_turns(), Turns::Some(vec![]), "then as before");
    }

    #[test]
    fn an_event_keeps_the_lane_placed_under_these_lanes_and_is_placed_again_under_others() {
        let key = Key::Header("ordering-key".into());
        let l = Lanes::new(key.clone());
        let event = NewEvent {
            id: "e".into(),
            destination: "d".into(),
            method: "POST".into(),
            path: String::new(),
            headers: vec![("Ordering-Key".into(), b"a".to_vec())],
            body: bytes::Bytes::new(),
            accepted_ms: 0,
        };
        let found = lane_of(&key, &event.headers, &event.body);
        assert!(found.is_some_and(|lane| lane != 5));
        let here = Placed {
            key: l.key.clone(),
            lane: Some(5),
        };
        assert_eq!(l.lane(Some(&here), &event), Some(5), "not parsed again");
        // The same key, but another lanes' (a destination added again).
        let elsewhere = Placed {
            key: Arc::new(key),
            lane: Some(5),
        };
        assert_eq!(l.lane(Some(&elsewhere), &event), found);
        assert_eq!(l.lane(None, &event), found, "never placed");
    }

    fn lanes(members: &[(i64, Lane)]) -> Lanes {
        let mut l = Lanes::new(Key::Destination);
        for &(seq, lane) in members {
            l.admit(seq, lane);
        }
        l
    }

    #[test]
    fn only_the_oldest_of_a_lane_may_start_and_unlaned_events_always_may() {
        let l = lanes(&[(1, 7), (2, 8), (3, 7), (4, 7)]);
        assert!(l.may_start(1) && l.may_start(2), "heads of lanes 7 and 8");
        assert!(!l.may_start(3) && !l.may_start(4), "behind 1");
        assert!(l.may_start(99), "not in a lane: unordered");
    }

    #[test]
    fn a_finished_head_passes_the_turn_to_the_next_and_names_it_when_its_row_waits() {
        let mut l = lanes(&[(1, 7), (3, 7), (4, 7)]);
        assert!(l.hold(3), "behind 1: stored as waiting");
        assert!(!l.hold(1), "a head never waits");
        assert_eq!(l.finish(1), Some(3), "3's row waits: make it due");
        assert!(l.may_start(3) && !l.may_start(4));
        assert_eq!(l.finish(3), None, "4's row was never marked waiting");
        assert!(l.may_start(4));
        assert_eq!(
            l.take_turns(),
            Turns::Some(vec![3, 4]),
            "for the dispatcher"
        );
        assert_eq!(l.take_turns(), Turns::Some(vec![]));
        assert_eq!(l.finish(4), None);
        assert_eq!(l.view().lanes, 0, "an empty lane is forgotten");
        assert_eq!(l.finish(4), None, "a second finish is a no-op");
    }

    #[test]
    fn an_event_leaving_from_the_middle_is_passed_over() {
        let mut l = lanes(&[(1, 7), (2, 7), (3, 7)]);
        assert!(l.hold(3));
        assert_eq!(l.finish(2), None, "2's TTL ran out behind 1");
        assert!(!l.may_start(3), "1 is still the head");
        assert_eq!(l.finish(1), Some(3), "the turn skips 2");
        assert!(l.may_start(3));
    }

    #[test]
    fn a_lane_is_blocked_while_its_failing_head_holds_events_back() {
        let mut l = lanes(&[(1, 7), (2, 7), (5, 9)]);
        l.retrying(2, 100);
        assert_eq!(l.view().blocked, 0, "2 is not a head: nothing blocked");
        l.retrying(5, 100);
        assert_eq!(l.view().blocked, 0, "5 holds nothing back");
        assert!(!l.stalled(2), "1 has not failed yet");
        l.retrying(1, 200);
        l.retrying(1, 300);
        assert!(
            l.stalled(2) && !l.stalled(1),
            "2 waits behind a failing head"
        );
        let view = l.view();
        assert_eq!((view.lanes, view.blocked), (2, 1));
        assert_eq!(view.blocked_since_ms, Some(200), "since the first failure");
        l.finish(1);
        assert_eq!(l.view().blocked, 0, "the next head has not failed");
    }
}
