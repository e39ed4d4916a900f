//! Each endpoint's share of the journal (`url: per_event`,
//! `endpoints.max_pending_bytes`): the bytes of pending events per
//! endpoint, taken at admission as a destination's are (before the write,
//! so that concurrent requests cannot all pass), given back when an event
//! leaves the journal or its write fails. One endpoint that is down then
//! fills its own part of its destination's share, and the app hears
//! `503 endpoint_full` for that endpoint alone.
//!
//! An endpoint is in the map only while it has pending events: the map is
//! as large as the set of endpoints with a backlog, never larger.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) struct EndpointShares {
    /// The most one endpoint's bytes may reach; `u64::MAX` (a fixed url,
    /// or before the config sets it): not counted.
    share: AtomicU64,
    bytes: Mutex<HashMap<Arc<str>, u64>>,
}

impl Default for EndpointShares {
    fn default() -> Self {
        EndpointShares {
            share: AtomicU64::new(u64::MAX),
            bytes: Mutex::default(),
        }
    }
}

impl EndpointShares {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, u64>> {
        // Plain counters: a panic elsewhere cannot leave them torn.
        self.bytes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_share(&self, share: u64) {
        self.share.store(share, Ordering::Relaxed);
    }

    /// Whether this destination's endpoints are counted.
    pub fn counted(&self) -> bool {
        self.share.load(Ordering::Relaxed) != u64::MAX
    }

    /// Takes `size` bytes for `origin`: `Ok(false)` when this destination's
    /// endpoints are not counted (nothing taken, nothing to give back);
    /// `Err((pending, share))` when they would pass its share (unless
    /// `anyway`), and nothing is taken.
    pub fn take(&self, origin: &Arc<str>, size: u64, anyway: bool) -> Result<bool, (u64, u64)> {
        let share = self.share.load(Ordering::Relaxed);
        if share == u64::MAX {
            return Ok(false);
        }
        let mut bytes = self.lock();
        let pending = bytes.get_mut(&**origin);
        let now = pending.as_deref().copied().unwrap_or(0);
        if !anyway && now.saturating_add(size) > share {
            return Err((now, share));
        }
        // The caller's origin is the key: no copy made for the map.
        match pending {
            Some(b) => *b += size,
            None => {
                bytes.insert(origin.clone(), size);
            }
        }
        Ok(true)
    }

    /// Gives back `size` bytes of `origin`'s; an endpoint at zero leaves
    /// the map.
    pub fn give(&self, origin: &str, size: u64) {
        let mut bytes = self.lock();
        if let Some(b) = bytes.get_mut(origin) {
            *b = b.saturating_sub(size);
            if *b == 0 {
                bytes.remove(origin);
            }
        }
    }

    /// What a start finds in the index, per endpoint.
    pub fn load(&self, rows: impl IntoIterator<Item = (String, u64)>) {
        let mut bytes = self.lock();
        for (origin, b) in rows.into_iter().filter(|(_, b)| *b > 0) {
            *bytes.entry(origin.into()).or_default() += b;
        }
    }

    #[cfg(test)]
    pub fn pending(&self, origin: &str) -> u64 {
        self.lock().get(origin).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_endpoint_fills_its_own_share_and_leaves_the_map_when_empty() {
        let s = EndpointShares::default();
        assert_eq!(
            s.take(&"a".into(), 1 << 40, false),
            Ok(false),
            "no share set: not counted"
        );
        assert_eq!(s.pending("a"), 0);
        s.set_share(100);
        assert_eq!(s.take(&"a".into(), 60, false), Ok(true));
        assert_eq!(
            s.take(&"a".into(), 50, false),
            Err((60, 100)),
            "60 + 50 > 100"
        );
        assert_eq!(
            s.take(&"b".into(), 100, false),
            Ok(true),
            "b has its own share"
        );
        assert_eq!(
            s.take(&"a".into(), 40, false),
            Ok(true),
            "exactly the share"
        );
        assert_eq!(
            s.take(&"b".into(), 10, true),
            Ok(true),
            "an adoption is counted, not refused"
        );
        assert_eq!(s.pending("b"), 110);
        s.give("a", 100);
        assert_eq!(s.pending("a"), 0);
        assert!(!s.lock().contains_key("a"), "at zero it leaves the map");
        s.give("a", 5);
        assert_eq!(s.pending("a"), 0, "never below zero");
        s.load([("b".to_string(), 7), ("c".to_string(), 0)]);
        assert_eq!(s.pending("b"), 117);
        assert!(!s.lock().contains_key("c"));
    }
}
