//! A destination's limit on attempts in flight, as its dispatcher applies
//! it: the configured `concurrency`, or with `concurrency: { adaptive }`
//! the one `policy::adaptive` learns from every attempt's outcome and
//! duration. Beside `Health`, not inside it: health's gates (pause,
//! Retry-After hold, probation, rate limit) say whether the next attempt
//! may start at all, this says how many may be out at once, and each
//! answer tells both.
//!
//! Kept across reloads with the destination's health (`fleet::Kept`), so
//! that a reload which leaves the adaptive block as it was keeps what was
//! learnt; a changed block starts again from its `initial`.

use crate::clock;
use crate::event::Outcome;
use crate::metrics;
use crate::policy::adaptive::{Bounds, Limiter, Sample, Signal};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub struct Limit {
    /// The limit in force, read before every attempt.
    current: AtomicUsize,
    /// `None`: the configured number holds.
    adaptive: Mutex<Option<Limiter>>,
    /// `courier_destination_concurrency_limit`, set when `current` changes.
    gauge: metrics::Gauge,
}

impl Limit {
    /// `concurrency`: the configured number (the cap, with `adaptive`).
    pub fn new(destination: &str, concurrency: usize, adaptive: Option<Bounds>) -> Limit {
        let limit = Limit {
            // Not a limit: `reconfigure` sets the first, and the gauge.
            current: AtomicUsize::new(0),
            adaptive: Mutex::new(None),
            gauge: metrics::concurrency_limit(destination),
        };
        limit.reconfigure(concurrency, adaptive);
        limit
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Limiter>> {
        // Plain data: a panic elsewhere cannot leave it torn.
        self.adaptive.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A reloaded config's `concurrency`: the learnt limit is kept while
    /// the adaptive bounds stay as they were.
    pub fn reconfigure(&self, concurrency: usize, adaptive: Option<Bounds>) {
        let mut limiter = self.lock();
        match adaptive {
            None => *limiter = None,
            Some(bounds) if limiter.as_ref().is_some_and(|l| l.bounds() == bounds) => {}
            Some(bounds) => *limiter = Some(Limiter::new(bounds, now())),
        }
        let limit = limiter.as_ref().map_or(concurrency, Limiter::limit);
        self.set(limit);
    }

    /// Attempts that may be in flight now.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Acquire)
    }

    pub fn adaptive(&self) -> bool {
        self.lock().is_some()
    }

    /// The endpoint's latency without courier's queue, as adaptive
    /// concurrency measured it (once it has).
    pub fn baseline(&self) -> Option<Duration> {
        self.lock().as_ref().and_then(Limiter::baseline)
    }

    /// One attempt's end: `in_flight` counts it. Nothing changes for a
    /// fixed limit.
    pub fn record(&self, outcome: Outcome, took: Duration, in_flight: usize) {
        let mut limiter = self.lock();
        let Some(l) = limiter.as_mut() else {
            return;
        };
        let sample = Sample {
            signal: Signal::of(outcome),
            took,
            in_flight,
        };
        l.record(sample, now());
        let limit = l.limit();
        drop(limiter);
        self.set(limit);
    }

    fn set(&self, limit: usize) {
        if self.current.swap(limit, Ordering::AcqRel) != limit {
            self.gauge.set(limit as f64);
        }
    }
}

/// The limiter's clock: monotonic, from any fixed origin.
fn now() -> Duration {
    Duration::from_micros(clock::mono_us())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(min: usize, max: usize, initial: usize) -> Option<Bounds> {
        Some(Bounds { min, max, initial })
    }

    #[test]
    fn a_fixed_limit_holds_whatever_the_answers() {
        let l = Limit::new("fixed", 8, None);
        assert!(!l.adaptive());
        for _ in 0..20 {
            l.record(Outcome::Busy, Duration::from_millis(1), 8);
        }
        assert_eq!(l.current(), 8);
    }

    #[test]
    fn a_reload_keeps_the_learnt_limit_unless_the_block_changed() {
        let l = Limit::new("learnt", 64, bounds(1, 64, 16));
        assert!(l.adaptive());
        // The baseline is probed first, then the initial limit holds
        // until a refusal cuts it.
        assert_eq!((l.current(), l.baseline()), (4, None));
        // Answered at once: no time passes on this clock.
        for _ in 0..4 {
            l.record(Outcome::Delivered, Duration::ZERO, 4);
        }
        assert_eq!((l.current(), l.baseline()), (16, Some(Duration::ZERO)));
        l.record(Outcome::Busy, Duration::ZERO, 16);
        assert_eq!(l.current(), 12);
        l.reconfigure(64, bounds(1, 64, 16));
        assert_eq!(l.current(), 12, "unchanged block: kept");
        l.reconfigure(32, bounds(2, 32, 2));
        assert_eq!(l.current(), 2, "a new block starts at its initial");
        l.reconfigure(5, None);
        assert_eq!((l.current(), l.adaptive()), (5, false));
        l.reconfigure(64, bounds(1, 64, 16));
        assert!(l.adaptive());
    }
}
