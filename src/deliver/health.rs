//! What the dispatcher and the admin API share about one destination: pause
//! (by an operator or a 410), a server-requested hold (429/503 with
//! Retry-After), probation, and the rate limit. The dispatcher asks `gate`
//! before every attempt; every result goes through `record`.

use crate::clock;
use crate::event::Outcome;
use crate::policy::probation::{Admit, Probation, ProbationPolicy};
use crate::policy::rate::RateLimit;
use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseReason {
    /// `POST /v1/destinations/{name}/pause`.
    Operator,
    /// The endpoint answered 410 Gone: it asks to be disabled.
    Gone,
}

impl PauseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            PauseReason::Operator => "operator",
            PauseReason::Gone => "gone",
        }
    }

    pub fn parse(s: &str) -> Option<PauseReason> {
        [PauseReason::Operator, PauseReason::Gone]
            .into_iter()
            .find(|r| r.as_str() == s)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Start the attempt (`probe`: it is the one probe after a probation).
    Go { probe: bool },
    /// Nothing may start before this time (ms since the epoch): a
    /// Retry-After, or a probation.
    WaitUntil(u64),
    /// The rate limit's next attempt, at this time: the destination sends,
    /// at its rate.
    Throttled(u64),
    /// Paused, or a probe is out: wait to be woken.
    Wait,
}

impl Gate {
    /// When it opens by itself (else it is woken).
    pub fn until(&self) -> Option<u64> {
        match *self {
            Gate::WaitUntil(t) | Gate::Throttled(t) => Some(t),
            Gate::Go { .. } | Gate::Wait => None,
        }
    }
}

/// A snapshot for `/v1/destinations`.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    pub state: &'static str,
    pub until_ms: Option<u64>,
    /// Who paused it, and when (ms since the epoch).
    pub paused: Option<(PauseReason, u64)>,
    pub consecutive_failures: u32,
    pub last_outcome: Option<Outcome>,
    pub last_attempt_ms: Option<u64>,
    pub in_flight: usize,
}

struct Inner {
    probation: Probation,
    paused: Option<(PauseReason, u64)>,
    hold_until_ms: Option<u64>,
    rate: Option<RateLimit>,
    last_outcome: Option<Outcome>,
    last_attempt_ms: Option<u64>,
}

pub struct Health {
    inner: Mutex<Inner>,
    /// Woken on resume and when a probe settles.
    pub wake: Notify,
    pub in_flight: AtomicUsize,
    /// The journal seqs of the events in attempts now, for history's
    /// `in_flight` (docs/history.md).
    attempting: Mutex<HashSet<i64>>,
}

impl Health {
    pub fn new(probation: ProbationPolicy, rate_per_second: Option<u32>) -> Self {
        Health {
            inner: Mutex::new(Inner {
                probation: Probation::new(probation),
                paused: None,
                hold_until_ms: None,
                rate: rate_per_second.map(RateLimit::per_second),
                last_outcome: None,
                last_attempt_ms: None,
            }),
            wake: Notify::new(),
            in_flight: AtomicUsize::new(0),
            attempting: Mutex::new(HashSet::new()),
        }
    }

    /// Applies a reloaded config's probation policy and rate limit. The
    /// probation in force is restarted only when its policy changed.
    pub fn reconfigure(&self, probation: &ProbationPolicy, rate_per_second: Option<u32>) {
        let mut s = self.lock();
        if s.probation.policy() != probation {
            s.probation = Probation::new(probation.clone());
        }
        let rate = rate_per_second.map(RateLimit::per_second);
        if s.rate.as_ref().map(RateLimit::interval) != rate.as_ref().map(RateLimit::interval) {
            s.rate = rate;
        }
        drop(s);
        self.wake.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The state is plain data: a panic elsewhere cannot leave it torn.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// May one more attempt start now? Takes a rate slot and marks the probe
    /// as sent when the answer is `Go`.
    pub fn gate(&self) -> Gate {
        let now = clock::now_ms();
        let mut s = self.lock();
        if s.paused.is_some() {
            return Gate::Wait;
        }
        if let Some(until) = s.hold_until_ms {
            if now < until {
                return Gate::WaitUntil(until);
            }
            s.hold_until_ms = None;
        }
        let probe = match s.probation.admit(now) {
            Admit::Go => false,
            Admit::Probe => true,
            Admit::WaitUntil(u64::MAX) => return Gate::Wait,
            Admit::WaitUntil(t) => return Gate::WaitUntil(t),
        };
        if let Some(rate) = s.rate.as_mut()
            && let Err(wait) = rate.try_take(clock::mono_us())
        {
            return Gate::Throttled(now + wait.as_millis() as u64 + 1);
        }
        if probe {
            s.probation.probe_started();
        }
        Gate::Go { probe }
    }

    /// Records an attempt's outcome; `hold` is a Retry-After that pauses the
    /// whole destination. Returns the probation end if one starts now.
    pub fn record(&self, outcome: Outcome, hold: Option<Duration>, probe: bool) -> Option<u64> {
        let now = clock::now_ms();
        let mut s = self.lock();
        s.last_outcome = Some(outcome);
        s.last_attempt_ms = Some(now);
        if let Some(h) = hold {
            let until = now + h.as_millis() as u64;
            s.hold_until_ms = Some(s.hold_until_ms.map_or(until, |u| u.max(until)));
        }
        let started = s.probation.record(outcome, now, probe);
        drop(s);
        self.wake.notify_one();
        started
    }

    /// An attempt whose health is its endpoint's (`url: per_event`): the
    /// destination's view shows it as the last, its probation is untouched.
    pub fn note(&self, outcome: Outcome) {
        let mut s = self.lock();
        s.last_outcome = Some(outcome);
        s.last_attempt_ms = Some(clock::now_ms());
    }

    /// Ends a probation at once: a destination that became `url:
    /// per_event` keeps probation per endpoint, and its own would never end.
    pub fn end_probation(&self) {
        let mut s = self.lock();
        let policy = s.probation.policy().clone();
        s.probation = Probation::new(policy);
        drop(s);
        self.wake.notify_one();
    }

    /// The probe's event needed no attempt after all: let another probe.
    pub fn probe_cancelled(&self) {
        self.lock().probation.probe_cancelled();
        self.wake.notify_one();
    }

    /// Pauses from `since_ms` on; an operator's pause replaces a 410's.
    /// Returns whether this changed who paused it.
    pub fn pause(&self, reason: PauseReason, since_ms: u64) -> bool {
        let mut s = self.lock();
        let replace = match s.paused {
            None => true,
            Some((by, _)) => by != reason && reason == PauseReason::Operator,
        };
        if replace {
            s.paused = Some((reason, since_ms));
        }
        replace
    }

    /// Lifts a pause; returns whether one was in force.
    pub fn resume(&self) -> bool {
        let was = self.lock().paused.take().is_some();
        self.wake.notify_one();
        was
    }

    /// An attempt of the events `seqs` starts (`true`) or ends.
    pub fn attempting(&self, seqs: impl IntoIterator<Item = i64>, starts: bool) {
        let mut set = self.attempting.lock().unwrap_or_else(|p| p.into_inner());
        for seq in seqs {
            if starts {
                set.insert(seq);
            } else {
                set.remove(&seq);
            }
        }
    }

    /// Events in attempts now (a batch counts each).
    pub fn attempting_events(&self) -> usize {
        self.attempting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    pub fn is_attempting(&self, seq: i64) -> bool {
        self.attempting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&seq)
    }

    /// What holds every attempt back now, as history names it: `pause` (an
    /// operator, a 410, a Retry-After), `probation`, `rate_limit`.
    pub fn held_by(&self) -> Option<&'static str> {
        let now = clock::now_ms();
        let s = self.lock();
        if s.paused.is_some() || s.hold_until_ms.is_some_and(|u| u > now) {
            Some("pause")
        } else if s.probation.on_probation(now) {
            Some("probation")
        } else if s.rate.as_ref().is_some_and(|r| !r.free(clock::mono_us())) {
            Some("rate_limit")
        } else {
            None
        }
    }

    pub fn on_probation(&self) -> bool {
        self.lock().probation.on_probation(clock::now_ms())
    }

    pub fn view(&self) -> View {
        let now = clock::now_ms();
        let s = self.lock();
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        let (state, until_ms) = if s.paused.is_some() {
            ("paused", None)
        } else if s.probation.on_probation(now) {
            ("probation", s.probation.until_ms())
        } else if let Some(until) = s.hold_until_ms.filter(|u| *u > now) {
            ("paused", Some(until))
        } else {
            ("healthy", None)
        };
        View {
            state,
            until_ms,
            paused: s.paused,
            consecutive_failures: s.probation.consecutive_failures(),
            last_outcome: s.last_outcome,
            last_attempt_ms: s.last_attempt_ms,
            in_flight,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(threshold: u32) -> Health {
        let probation = ProbationPolicy {
            threshold,
            ..ProbationPolicy::default()
        };
        Health::new(probation, None)
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_the_gate_until_resumed() {
        let h = health(0);
        assert!(h.pause(PauseReason::Gone, clock::now_ms()));
        assert_eq!(h.gate(), Gate::Wait);
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(h.gate(), Gate::Wait, "a pause has no end of its own");
        assert!(h.resume());
        assert_eq!(h.gate(), Gate::Go { probe: false });
    }

    /// The rate limit is told apart from a hold: a destination at its
    /// rate still sends, and its new events go out from memory.
    #[test]
    fn the_rate_limit_throttles_where_a_retry_after_holds() {
        let h = Health::new(ProbationPolicy::default(), Some(1));
        assert_eq!(h.gate(), Gate::Go { probe: false });
        let now = clock::now_ms();
        match h.gate() {
            Gate::Throttled(t) => assert!(t > now && t <= now + 1_001, "{t} against {now}"),
            other => panic!("at its rate: {other:?}"),
        }
        h.record(Outcome::Busy, Some(Duration::from_secs(30)), false);
        assert!(
            matches!(h.gate(), Gate::WaitUntil(_)),
            "a Retry-After holds"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_holds_the_gate_until_it_ends() {
        let h = health(0);
        let start = clock::now_ms();
        h.record(Outcome::Busy, Some(Duration::from_secs(30)), false);
        assert_eq!(h.gate(), Gate::WaitUntil(start + 30_000));
        tokio::time::advance(Duration::from_millis(29_999)).await;
        assert_eq!(h.gate(), Gate::WaitUntil(start + 30_000));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(h.gate(), Gate::Go { probe: false });
    }

    #[tokio::test(start_paused = true)]
    async fn probation_lets_one_probe_through_when_it_ends() {
        let h = health(2);
        let start = clock::now_ms();
        assert_eq!(h.record(Outcome::Failed, None, false), None);
        assert_eq!(h.gate(), Gate::Go { probe: false }, "one failure in a row");
        assert_eq!(h.record(Outcome::Failed, None, false), Some(start + 30_000));
        assert_eq!(h.gate(), Gate::WaitUntil(start + 30_000));
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(h.gate(), Gate::Go { probe: true });
        assert_eq!(h.gate(), Gate::Wait, "the probe is out");
        h.record(Outcome::Delivered, None, true);
        assert_eq!(h.gate(), Gate::Go { probe: false });
    }
}
