//! `ingress.dedupe_window`: an event id already stored for a destination
//! within the window is acknowledged again but not stored twice.
//!
//! The check runs in memory, in front of the intake log, so a retried
//! publish costs no disk write; the indexer keeps the same keys in SQLite's
//! `seen` table, from which a restart rebuilds the set. The key is
//! per destination: a topic's copies are deduplicated per subscriber.
//!
//! A key is only a duplicate once its first event is durable: until then it
//! is *pending*, held by a [`Claim`] that travels with the append to the
//! writer thread. A second request with the same id waits for the outcome;
//! if the first write fails (or its command is dropped, whatever the path),
//! the claim's `Drop` forgets the key and the waiter stores its own copy.
//! Otherwise a 202 could be answered for an event that was never stored.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Keys kept at most: beyond, the oldest are forgotten early (and counted),
/// so that a flood of unique ids cannot exhaust memory.
const MAX_KEYS: usize = 4_000_000;

enum Seen {
    Stored(u64),
    /// Closed when its claim is stored or dropped.
    Pending(watch::Receiver<()>),
}

pub struct Dedupe {
    window_ms: u64,
    seen: HashMap<Box<str>, Seen>,
    /// Stored keys in the order they were stored, for expiry.
    order: VecDeque<(u64, Box<str>)>,
}

pub fn key(destination: &str, id: &str) -> String {
    let mut k = String::with_capacity(destination.len() + id.len() + 1);
    k.push_str(destination);
    k.push('\n');
    k.push_str(id);
    k
}

/// What a look-up found.
pub enum Check {
    /// New: the caller stores the event and hands the claim to the writer.
    Fresh(Claim),
    /// Stored within the window.
    Duplicate,
    /// Another request is storing it: wait until this changes, then look again.
    Wait(watch::Receiver<()>),
}

/// A pending key. Stored by the writer after the sync; dropped otherwise,
/// which forgets the key.
pub struct Claim {
    dedupe: Arc<Mutex<Dedupe>>,
    key: Option<Box<str>>,
    _done: watch::Sender<()>,
}

impl Claim {
    pub fn stored(mut self, at_ms: u64) {
        if let Some(key) = self.key.take()
            && let Ok(mut d) = self.dedupe.lock()
        {
            d.insert(key, at_ms);
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(key) = self.key.take()
            && let Ok(mut d) = self.dedupe.lock()
            && matches!(d.seen.get(&key), Some(Seen::Pending(_)))
        {
            d.seen.remove(&key);
        }
    }
}

impl Dedupe {
    pub fn new(window_ms: u64) -> Dedupe {
        Dedupe {
            window_ms,
            seen: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Looks `key` up at `now_ms`, claiming it when new.
    pub fn check(this: &Arc<Mutex<Dedupe>>, d: &mut Dedupe, key: &str, now_ms: u64) -> Check {
        d.expire(now_ms);
        match d.seen.get(key) {
            Some(Seen::Stored(_)) => Check::Duplicate,
            Some(Seen::Pending(rx)) => Check::Wait(rx.clone()),
            None => {
                let (tx, rx) = watch::channel(());
                d.seen.insert(key.into(), Seen::Pending(rx));
                Check::Fresh(Claim {
                    dedupe: this.clone(),
                    key: Some(key.into()),
                    _done: tx,
                })
            }
        }
    }

    /// Loads a key stored before a restart.
    pub fn remember(&mut self, key: &str, at_ms: u64) {
        self.insert(key.into(), at_ms);
    }

    fn insert(&mut self, key: Box<str>, at_ms: u64) {
        if self.order.len() >= MAX_KEYS
            && let Some((at, old)) = self.order.pop_front()
            && matches!(self.seen.get(&old), Some(Seen::Stored(t)) if *t == at)
        {
            self.seen.remove(&old);
            crate::metrics::dedupe_evicted();
        }
        self.seen.insert(key.clone(), Seen::Stored(at_ms));
        self.order.push_back((at_ms, key));
    }

    fn expire(&mut self, now_ms: u64) {
        let cutoff = now_ms.saturating_sub(self.window_ms);
        while let Some((at, _)) = self.order.front() {
            if *at >= cutoff {
                break;
            }
            if let Some((at, key)) = self.order.pop_front()
                && matches!(self.seen.get(&key), Some(Seen::Stored(t)) if *t == at)
            {
                self.seen.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(d: &Arc<Mutex<Dedupe>>, key: &str, now: u64) -> Check {
        let mut guard = d.lock().expect("lock");
        Dedupe::check(d, &mut guard, key, now)
    }

    fn dedupe(window: u64) -> Arc<Mutex<Dedupe>> {
        Arc::new(Mutex::new(Dedupe::new(window)))
    }

    fn claim(d: &Arc<Mutex<Dedupe>>, key: &str, now: u64) -> Claim {
        match check(d, key, now) {
            Check::Fresh(c) => c,
            _ => panic!("{key} was not fresh at {now}"),
        }
    }

    #[test]
    fn a_key_is_a_duplicate_within_the_window_and_fresh_after_it() {
        let d = dedupe(1000);
        claim(&d, "a", 10_000).stored(10_000);
        assert!(matches!(check(&d, "a", 10_500), Check::Duplicate));
        assert!(matches!(check(&d, "a", 11_000), Check::Duplicate));
        claim(&d, "a", 11_001).stored(11_001);
        assert!(matches!(check(&d, "a", 11_500), Check::Duplicate));
    }

    #[test]
    fn a_pending_key_makes_others_wait_and_a_dropped_claim_frees_it() {
        let d = dedupe(1000);
        let first = claim(&d, "k", 0);
        let Check::Wait(rx) = check(&d, "k", 1) else {
            panic!("a pending key must make a second request wait");
        };
        // The first write failed: its claim is dropped.
        drop(first);
        assert!(rx.has_changed().is_err(), "waiters learn the outcome");
        let second = claim(&d, "k", 2);
        second.stored(2);
        assert!(matches!(check(&d, "k", 3), Check::Duplicate));
    }

    #[test]
    fn keys_are_per_destination() {
        let d = dedupe(1000);
        claim(&d, &key("orders", "1"), 0).stored(0);
        assert!(matches!(check(&d, &key("audit", "1"), 0), Check::Fresh(_)));
    }

    #[test]
    fn remembered_keys_expire_in_their_own_time() {
        let d = dedupe(1000);
        {
            let mut g = d.lock().expect("lock");
            g.remember("old", 100);
            g.remember("new", 900);
        }
        assert!(matches!(check(&d, "old", 1200), Check::Fresh(_)));
        assert!(matches!(check(&d, "new", 1200), Check::Duplicate));
    }
}
