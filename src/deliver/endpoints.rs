//! The endpoints of a `url: per_event` destination, each kept apart from
//! the others (docs/endpoints.md): an endpoint is its origin, and its
//! health (probation and its probe, a Retry-After hold, a 410's pause) and
//! its attempts in flight (`endpoints.concurrency`) are its own. The
//! destination's `Health` keeps what is the destination's: an operator's
//! pause, the rate limit, the attempts in flight in all.
//!
//! One map under one lock: the dispatcher is its only frequent user (one
//! `start` per attempt, one `ended`), and the state of an endpoint is a few
//! words. At most `max_tracked` endpoints are held; past it, the idle ones
//! are forgotten, the healthy first, and an endpoint forgotten comes back
//! healthy. Its events stay in the journal.

use crate::clock;
use crate::event::Outcome;
use crate::policy::probation::{Admit, Probation, ProbationPolicy};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Before an endpoint has answered: the time an attempt is assumed to
/// take, which spaces the events put back for it (`pace`).
const FIRST_PACE_MS: u32 = 100;

/// Why an endpoint takes no attempt now (`Endpoints::start`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// Its attempts in flight are at `endpoints.concurrency`.
    Busy,
    /// Held by a Retry-After until then.
    WaitUntil(u64),
    /// On probation until then, when one probe may go.
    Probation(u64),
    /// Its probe is out: its answer comes within the timeout.
    Probing,
    /// It answered 410: nothing goes to it until courier restarts.
    Gone,
}

struct State {
    probation: Probation,
    hold_until_ms: Option<u64>,
    /// Since when it answered 410 Gone: nothing goes to it until it is
    /// forgotten or courier restarts.
    gone_since_ms: Option<u64>,
    in_flight: u32,
    /// How long its attempts take (a moving average, ms).
    pace_ms: u32,
}

impl State {
    fn new(policy: &ProbationPolicy) -> State {
        State {
            probation: Probation::new(policy.clone()),
            hold_until_ms: None,
            gone_since_ms: None,
            in_flight: 0,
            pace_ms: FIRST_PACE_MS,
        }
    }

    fn idle(&self) -> bool {
        self.in_flight == 0
    }

    fn healthy(&self, now: u64) -> bool {
        self.gone_since_ms.is_none()
            && !self.probation.on_probation(now)
            && self.probation.consecutive_failures() == 0
            && self.hold_until_ms.is_none_or(|t| t <= now)
    }
}

pub struct Endpoints {
    inner: Mutex<Inner>,
}

struct Inner {
    policy: ProbationPolicy,
    max_tracked: usize,
    states: HashMap<Arc<str>, State>,
}

/// How one attempt went, for its endpoint.
pub struct Ended {
    /// `None`: no attempt was made after all (its events had expired).
    pub outcome: Option<Outcome>,
    pub took: Duration,
    /// A Retry-After on 429 or 503.
    pub hold: Option<Duration>,
    pub probe: bool,
    /// It answered 410 Gone.
    pub gone: bool,
}

impl Endpoints {
    pub fn new(policy: ProbationPolicy, max_tracked: usize) -> Endpoints {
        Endpoints {
            inner: Mutex::new(Inner {
                policy,
                max_tracked,
                states: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Plain data: a panic elsewhere cannot leave it torn.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A reload's probation policy (endpoints on probation under another
    /// start afresh) and bound.
    pub fn reconfigure(&self, policy: &ProbationPolicy, max_tracked: usize) {
        let mut s = self.lock();
        if s.policy != *policy {
            s.policy = policy.clone();
            for state in s.states.values_mut() {
                state.probation = Probation::new(policy.clone());
            }
        }
        s.max_tracked = max_tracked;
    }

    /// May one more attempt go to `origin` now, with at most `cap` in
    /// flight? `Ok(probe)` counts it in flight (and marks the probe sent,
    /// when it is the one probe of a probation) until `ended`.
    pub fn start(&self, origin: &Arc<str>, cap: usize) -> Result<bool, Blocked> {
        let now = clock::now_ms();
        let mut s = self.lock();
        if !s.states.contains_key(origin) {
            s.make_room();
        }
        let Inner { states, policy, .. } = &mut *s;
        let state = states
            .entry(origin.clone())
            .or_insert_with(|| State::new(policy));
        if state.gone_since_ms.is_some() {
            return Err(Blocked::Gone);
        }
        if let Some(until) = state.hold_until_ms {
            if now < until {
                return Err(Blocked::WaitUntil(until));
            }
            state.hold_until_ms = None;
        }
        let probe = match state.probation.admit(now) {
            Admit::Go => false,
            Admit::Probe => true,
            Admit::WaitUntil(u64::MAX) => return Err(Blocked::Probing),
            Admit::WaitUntil(t) => return Err(Blocked::Probation(t)),
        };
        if state.in_flight as usize >= cap {
            return Err(Blocked::Busy);
        }
        if probe {
            state.probation.probe_started();
        }
        state.in_flight += 1;
        Ok(probe)
    }

    /// An attempt that `start` let go has ended. Returns the probation's
    /// end when this answer starts one.
    pub fn ended(&self, origin: &str, e: Ended) -> Option<u64> {
        let now = clock::now_ms();
        let mut s = self.lock();
        let state = s.states.get_mut(origin)?;
        state.in_flight = state.in_flight.saturating_sub(1);
        let Some(outcome) = e.outcome else {
            if e.probe {
                state.probation.probe_cancelled();
            }
            return None;
        };
        let took = e.took.as_millis().min(u32::MAX as u128) as u32;
        state.pace_ms = ((state.pace_ms as u64 * 3 + took as u64) / 4).max(1) as u32;
        if let Some(h) = e.hold {
            let until = now + h.as_millis() as u64;
            state.hold_until_ms = Some(state.hold_until_ms.map_or(until, |u| u.max(until)));
        }
        if e.gone {
            state.gone_since_ms.get_or_insert(now);
        }
        state.probation.record(outcome, now, e.probe)
    }

    /// How long `origin`'s attempts take (ms): the spacing of its events
    /// put back while it is busy.
    pub fn pace_ms(&self, origin: &str) -> u64 {
        let s = self.lock();
        s.states
            .get(origin)
            .map_or(FIRST_PACE_MS, |state| state.pace_ms) as u64
    }

    /// The endpoints held now, by state.
    pub fn census(&self) -> Census {
        let now = clock::now_ms();
        let s = self.lock();
        let mut c = Census::default();
        for st in s.states.values() {
            if st.gone_since_ms.is_some() || st.hold_until_ms.is_some_and(|t| t > now) {
                c.paused += 1;
            } else if st.probation.on_probation(now) {
                c.probation += 1;
            } else {
                c.healthy += 1;
            }
        }
        c
    }
}

/// Endpoints by state, as `courier_endpoints` counts them. None is
/// `disabled` yet: that state comes with `disable_after`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Census {
    pub healthy: usize,
    pub probation: usize,
    pub paused: usize,
}

impl Census {
    pub fn by_state(&self) -> [(&'static str, usize); 4] {
        [
            ("healthy", self.healthy),
            ("probation", self.probation),
            ("paused", self.paused),
            ("disabled", 0),
        ]
    }
}

impl Inner {
    /// At `max_tracked`, forgets idle endpoints down to seven eighths of
    /// it (a sweep per eighth, not one per new endpoint): the healthy
    /// first, then any idle one. Endpoints with attempts in flight stay.
    fn make_room(&mut self) {
        if self.states.len() < self.max_tracked {
            return;
        }
        let now = clock::now_ms();
        let keep = self.max_tracked - self.max_tracked / 8 - 1;
        let mut excess = self.states.len().saturating_sub(keep);
        self.states.retain(|_, st| {
            let forget = excess > 0 && st.idle() && st.healthy(now);
            excess -= usize::from(forget);
            !forget
        });
        self.states.retain(|_, st| {
            let forget = excess > 0 && st.idle();
            excess -= usize::from(forget);
            !forget
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(threshold: u32, max_tracked: usize) -> Endpoints {
        let policy = ProbationPolicy {
            threshold,
            ..ProbationPolicy::default()
        };
        Endpoints::new(policy, max_tracked)
    }

    fn failed() -> Ended {
        Ended {
            outcome: Some(Outcome::TimedOut),
            took: Duration::from_millis(50),
            hold: None,
            probe: false,
            gone: false,
        }
    }

    #[test]
    fn each_endpoint_has_its_own_cap_and_probation() {
        let e = endpoints(2, 100);
        let (a, b): (Arc<str>, Arc<str>) = ("https://a:443".into(), "https://b:443".into());
        assert_eq!(e.start(&a, 2), Ok(false));
        assert_eq!(e.start(&a, 2), Ok(false));
        assert_eq!(
            e.start(&a, 2),
            Err(Blocked::Busy),
            "two in flight at a cap of 2"
        );
        assert_eq!(e.start(&b, 2), Ok(false), "b has its own cap");
        assert_eq!(e.ended(&a, failed()), None);
        let until = e
            .ended(&a, failed())
            .expect("a second failure starts a probation");
        assert_eq!(e.start(&a, 2), Err(Blocked::Probation(until)));
        assert_eq!(e.start(&b, 2), Ok(false), "b is not on probation");
        let census = e.census();
        assert_eq!((census.healthy, census.probation), (1, 1));
    }

    #[test]
    fn a_retry_after_and_a_410_hold_only_their_endpoint() {
        let e = endpoints(10, 100);
        let (a, b): (Arc<str>, Arc<str>) = ("https://a:443".into(), "https://b:443".into());
        assert_eq!(e.start(&a, 4), Ok(false));
        e.ended(
            &a,
            Ended {
                hold: Some(Duration::from_secs(30)),
                ..failed()
            },
        );
        assert!(matches!(e.start(&a, 4), Err(Blocked::WaitUntil(_))));
        assert_eq!(e.start(&b, 4), Ok(false));
        e.ended(
            &b,
            Ended {
                gone: true,
                ..failed()
            },
        );
        assert_eq!(e.start(&b, 4), Err(Blocked::Gone), "b answered 410");
    }

    #[test]
    fn an_attempt_not_made_gives_back_its_place_and_its_probe() {
        let e = endpoints(1, 100);
        let a: Arc<str> = "https://a:443".into();
        assert_eq!(e.start(&a, 1), Ok(false));
        let until = e.ended(&a, failed()).expect("probation");
        let _ = until;
        // A probation of 10 s at the least: not over yet.
        assert!(matches!(e.start(&a, 1), Err(Blocked::Probation(_))));
        let e = endpoints(0, 100);
        assert_eq!(e.start(&a, 1), Ok(false));
        assert_eq!(e.start(&a, 1), Err(Blocked::Busy));
        e.ended(
            &a,
            Ended {
                outcome: None,
                ..failed()
            },
        );
        assert_eq!(e.start(&a, 1), Ok(false), "its place is free again");
    }

    #[test]
    fn past_max_tracked_idle_endpoints_are_forgotten_the_healthy_first() {
        let e = endpoints(1, 8);
        let sick: Arc<str> = "https://sick:443".into();
        assert_eq!(e.start(&sick, 4), Ok(false));
        e.ended(&sick, failed());
        let busy: Arc<str> = "https://busy:443".into();
        assert_eq!(e.start(&busy, 4), Ok(false));
        for i in 0..100 {
            let origin: Arc<str> = format!("https://h{i}:443").into();
            assert_eq!(e.start(&origin, 4), Ok(false));
            e.ended(
                &origin,
                Ended {
                    outcome: Some(Outcome::Delivered),
                    ..failed()
                },
            );
        }
        let c = e.census();
        let tracked = c.healthy + c.probation + c.paused;
        assert!(tracked <= 8, "{tracked} held past max_tracked");
        assert!(
            matches!(e.start(&sick, 4), Err(Blocked::Probation(_))),
            "the sick one was kept while healthy ones could go"
        );
        assert_eq!(e.start(&busy, 1), Err(Blocked::Busy), "in flight: kept");
    }

    #[test]
    fn the_pace_follows_the_attempts() {
        let e = endpoints(0, 100);
        let a: Arc<str> = "https://a:443".into();
        assert_eq!(e.pace_ms(&a), FIRST_PACE_MS as u64);
        for _ in 0..20 {
            assert_eq!(e.start(&a, 4), Ok(false));
            e.ended(
                &a,
                Ended {
                    outcome: Some(Outcome::Delivered),
                    took: Duration::from_millis(8),
                    ..failed()
                },
            );
        }
        assert!(e.pace_ms(&a) < 12, "{}", e.pace_ms(&a));
    }
}
