//! `ingress.dedupe_window`: an event id already stored for a destination
//! within the window is acknowledged again but not stored twice.
//!
//! The check runs in memory, in front of the intake log, so a retried
//! publish costs no disk write; the indexer keeps the same keys in SQLite's
//! `seen` table, from which a restart rebuilds the set. The key is
//! per destination: a topic's copies are deduplicated per subscriber.

use std::collections::{HashMap, VecDeque};

/// Keys kept at most: beyond, the oldest are forgotten early (and counted),
/// so that a flood of unique ids cannot exhaust memory.
const MAX_KEYS: usize = 4_000_000;

pub struct Dedupe {
    window_ms: u64,
    seen: HashMap<Box<str>, u64>,
    /// Keys in the order they were seen, for expiry.
    order: VecDeque<(u64, Box<str>)>,
}

pub fn key(destination: &str, id: &str) -> String {
    let mut k = String::with_capacity(destination.len() + id.len() + 1);
    k.push_str(destination);
    k.push('\n');
    k.push_str(id);
    k
}

impl Dedupe {
    pub fn new(window_ms: u64) -> Dedupe {
        Dedupe {
            window_ms,
            seen: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Marks `key` as seen at `at_ms`; true if it already was, within the window.
    pub fn claim(&mut self, key: &str, now_ms: u64) -> bool {
        self.expire(now_ms);
        if self.seen.contains_key(key) {
            return true;
        }
        self.insert(key.into(), now_ms);
        false
    }

    /// Loads a key seen before a restart.
    pub fn remember(&mut self, key: &str, at_ms: u64) {
        self.insert(key.into(), at_ms);
    }

    fn insert(&mut self, key: Box<str>, at_ms: u64) {
        if self.order.len() >= MAX_KEYS
            && let Some((at, old)) = self.order.pop_front()
            && self.seen.get(&old) == Some(&at)
        {
            self.seen.remove(&old);
            crate::admin::metrics::dedupe_evicted();
        }
        self.seen.insert(key.clone(), at_ms);
        self.order.push_back((at_ms, key));
    }

    /// Forgets a claim whose event was not stored after all.
    pub fn release(&mut self, key: &str) {
        self.seen.remove(key);
    }

    fn expire(&mut self, now_ms: u64) {
        let cutoff = now_ms.saturating_sub(self.window_ms);
        while let Some((at, _)) = self.order.front() {
            if *at >= cutoff {
                break;
            }
            if let Some((at, key)) = self.order.pop_front()
                && self.seen.get(&key) == Some(&at)
            {
                self.seen.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_a_duplicate_within_the_window_and_fresh_after_it() {
        let mut d = Dedupe::new(1000);
        assert!(!d.claim("a", 10_000));
        assert!(d.claim("a", 10_500));
        assert!(d.claim("a", 11_000));
        assert!(
            !d.claim("a", 11_001),
            "the window counts from the first sight"
        );
        assert!(d.claim("a", 11_500));
    }

    #[test]
    fn keys_are_per_destination_and_a_release_forgets() {
        let mut d = Dedupe::new(1000);
        assert!(!d.claim(&key("orders", "1"), 0));
        assert!(!d.claim(&key("audit", "1"), 0));
        d.release(&key("orders", "1"));
        assert!(!d.claim(&key("orders", "1"), 1));
    }

    #[test]
    fn remembered_keys_expire_in_their_own_time() {
        let mut d = Dedupe::new(1000);
        d.remember("old", 100);
        d.remember("new", 900);
        assert!(!d.claim("old", 1200), "seen at 100, window over at 1100");
        assert!(d.claim("new", 1200));
    }
}
