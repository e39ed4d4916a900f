//! The endpoints of a `url: per_event` destination, each kept apart from
//! the others (docs/endpoints.md): an endpoint is its origin, and its
//! health (probation and its probe, a Retry-After hold), its attempts in
//! flight (`endpoints.concurrency`) and its disabling are its own. The
//! destination's `Health` keeps what is the destination's: an operator's
//! pause, the rate limit, the attempts in flight in all.
//!
//! One map under one lock: the dispatcher is its only frequent user (one
//! `start` per attempt, one `ended`), and the state of an endpoint is a few
//! words. At most `max_tracked` endpoints are held; past it, the idle ones
//! are forgotten, the healthy first, and an endpoint forgotten comes back
//! healthy. Its events stay in the journal. Disabled endpoints are held
//! apart, never forgotten: the journal's `endpoints-disabled.json` keeps
//! them across restarts, and a disabling lasts until an operator ends it.

use crate::clock;
use crate::event::{Outcome, endpoint};
use crate::journal::Disabled;
use crate::policy::probation::{Admit, Probation, ProbationPolicy};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Before an endpoint has answered: the time an attempt is assumed to
/// take, which spaces the events put back for it (`pace`).
const FIRST_PACE_MS: u32 = 100;

/// Who disabled an endpoint, as `Disabled::by` and the notification say.
pub const BY_OPERATOR: &str = "operator";
pub const BY_GONE: &str = "gone";
pub const BY_DISABLE_AFTER: &str = "disable_after";

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
    /// Disabled: its events are dead-lettered `EndpointDisabled`.
    Disabled,
}

/// Where an event met while its endpoint is blocked stands: the `k`-th
/// (from 0) of that endpoint's in this pass.
#[derive(Clone, Copy, Debug)]
pub struct Turn {
    pub k: usize,
    /// `endpoints.concurrency`.
    pub cap: usize,
    /// How long the endpoint's attempts take (`Endpoints::pace_ms`).
    pub pace_ms: u64,
    pub timeout_ms: u64,
    pub now: u64,
}

/// When an event of an endpoint blocked by `why` may be due again;
/// `None`: it stays ready. `Spaced` times are the earliest: the event
/// takes the endpoint's next free slot from then (`Endpoints::slot`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Again {
    At(u64),
    Spaced(u64),
}

/// Past the first few, an endpoint's events come back spaced as it can
/// take them (`cap` per `pace_ms`), whatever blocks it, in slots that go
/// on from one pass to the next: a blocked endpoint's backlog put back at
/// one instant came due at one instant, and every read after it met the
/// whole backlog again, read each event and put it back (benches/RESULTS.md,
/// step w). When the endpoint recovers, its events are made due at once
/// (`Said::recovered`), so the spacing never outlasts its trouble.
pub fn due_again(why: Blocked, t: Turn) -> Option<Again> {
    match why {
        // Ready the moment one of its attempts ends.
        Blocked::Busy if t.k < t.cap => None,
        Blocked::Busy => Some(Again::Spaced(t.now + t.pace_ms)),
        Blocked::WaitUntil(until) => Some(Again::Spaced(until)),
        // One comes back when it ends, to be the probe; the rest once the
        // probe has had its answer.
        Blocked::Probation(until) if t.k == 0 => Some(Again::At(until)),
        Blocked::Probation(until) => Some(Again::Spaced(until + t.timeout_ms)),
        // Its probe's answer comes within the timeout.
        Blocked::Probing => Some(Again::Spaced(t.now + t.timeout_ms.max(1000))),
        // Handed to the sink in the same pass.
        Blocked::Disabled => None,
    }
}

struct State {
    probation: Probation,
    hold_until_ms: Option<u64>,
    in_flight: u32,
    /// How long its attempts take (a moving average, ms).
    pace_ms: u32,
    /// The first failure since its last success.
    failing_since_ms: Option<u64>,
    /// Events put back spaced: the next slot's time, and how many it
    /// holds (`cap` a slot).
    next_slot_ms: u64,
    in_slot: u32,
    last: Option<(Outcome, Option<u16>)>,
}

impl State {
    fn new(policy: &ProbationPolicy) -> State {
        State {
            probation: Probation::new(policy.clone()),
            hold_until_ms: None,
            in_flight: 0,
            pace_ms: FIRST_PACE_MS,
            failing_since_ms: None,
            last: None,
            next_slot_ms: 0,
            in_slot: 0,
        }
    }

    fn idle(&self) -> bool {
        self.in_flight == 0
    }

    fn healthy(&self, now: u64) -> bool {
        !self.probation.on_probation(now)
            && self.probation.consecutive_failures() == 0
            && self.hold_until_ms.is_none_or(|t| t <= now)
    }

    /// `paused` (a Retry-After), `probation` or `healthy`.
    fn state(&self, now: u64) -> &'static str {
        if self.hold_until_ms.is_some_and(|t| t > now) {
            "paused"
        } else if self.probation.on_probation(now) {
            "probation"
        } else {
            "healthy"
        }
    }
}

pub struct Endpoints {
    inner: Mutex<Inner>,
    /// One disabling or enabling at a time (`deliver::disabling`): each
    /// is told, recorded and held in that order, and a 410's disabling
    /// recorded after an operator's enable must not undo it.
    pub changing: tokio::sync::Mutex<()>,
}

struct Inner {
    policy: ProbationPolicy,
    max_tracked: usize,
    disable_after: Option<Duration>,
    states: HashMap<Arc<str>, State>,
    disabled: HashMap<Arc<str>, Disabled>,
}

/// How one attempt went, for its endpoint.
pub struct Ended {
    /// `None`: no attempt was made after all (its events had expired).
    pub outcome: Option<Outcome>,
    pub status: Option<u16>,
    pub took: Duration,
    /// A Retry-After on 429 or 503.
    pub hold: Option<Duration>,
    pub probe: bool,
    /// It answered 410 Gone.
    pub gone: bool,
}

/// What an answer did to its endpoint.
#[derive(Debug, Default, PartialEq)]
pub struct Said {
    /// A probation started, until then.
    pub probation_until: Option<u64>,
    /// It disabled the endpoint (a 410, or `disable_after`): to be
    /// recorded and notified.
    pub disabled: Option<Disabled>,
    /// The first success after failures: the events put back spaced
    /// while it failed are due now.
    pub recovered: bool,
}

/// One endpoint as the admin API lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    pub state: &'static str,
    pub in_flight: u32,
    pub failing_since_ms: Option<u64>,
    pub last_outcome: Option<String>,
    pub last_status: Option<u16>,
}

impl Endpoints {
    pub fn new(
        policy: ProbationPolicy,
        max_tracked: usize,
        disable_after: Option<Duration>,
        disabled: Vec<(String, Disabled)>,
    ) -> Endpoints {
        Endpoints {
            inner: Mutex::new(Inner {
                policy,
                max_tracked,
                disable_after,
                states: HashMap::new(),
                disabled: disabled.into_iter().map(|(o, d)| (o.into(), d)).collect(),
            }),
            changing: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Plain data: a panic elsewhere cannot leave it torn.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A reload's probation policy (endpoints on probation under another
    /// start afresh), bound and `disable_after`.
    pub fn reconfigure(
        &self,
        policy: &ProbationPolicy,
        max_tracked: usize,
        disable_after: Option<Duration>,
    ) {
        let mut s = self.lock();
        if s.policy != *policy {
            s.policy = policy.clone();
            for state in s.states.values_mut() {
                state.probation = Probation::new(policy.clone());
            }
        }
        s.max_tracked = max_tracked;
        s.disable_after = disable_after;
    }

    /// May one more attempt go to `origin` now, with at most `cap` in
    /// flight? `Ok((its key, probe))` counts it in flight (and marks the
    /// probe sent, when it is the one probe of a probation) until `ended`.
    pub fn start(&self, origin: &str, cap: usize) -> Result<(Arc<str>, bool), Blocked> {
        let now = clock::now_ms();
        let mut s = self.lock();
        // Its key, kept: the caller's turn holds it, with no copy of its
        // own an attempt. A disabled endpoint has no state (`ended`,
        // `hold_disabled`): one found is not disabled.
        let key = match s.states.get_key_value(origin) {
            Some((key, _)) => key.clone(),
            None => {
                if s.disabled.contains_key(origin) {
                    return Err(Blocked::Disabled);
                }
                s.make_room();
                Arc::from(origin)
            }
        };
        let Inner { states, policy, .. } = &mut *s;
        let state = states
            .entry(key.clone())
            .or_insert_with(|| State::new(policy));
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
        Ok((key, probe))
    }

    /// An attempt that `start` let go has ended: what it did to the
    /// endpoint. A 410, or a failure `disable_after` past the first since
    /// the last success, disables it here, before the caller records it.
    pub fn ended(&self, origin: &str, e: Ended) -> Said {
        let now = clock::now_ms();
        let mut s = self.lock();
        let disable_after = s.disable_after;
        let Some(state) = s.states.get_mut(origin) else {
            return Said::default();
        };
        state.in_flight = state.in_flight.saturating_sub(1);
        let Some(outcome) = e.outcome else {
            if e.probe {
                state.probation.probe_cancelled();
            }
            return Said::default();
        };
        let took = e.took.as_millis().min(u32::MAX as u128) as u32;
        state.pace_ms = ((state.pace_ms as u64 * 3 + took as u64) / 4).max(1) as u32;
        if let Some(h) = e.hold {
            let until = now + h.as_millis() as u64;
            state.hold_until_ms = Some(state.hold_until_ms.map_or(until, |u| u.max(until)));
        }
        state.last = Some((outcome, e.status));
        let mut recovered = false;
        let failing_since = if outcome == Outcome::Delivered {
            recovered = state.failing_since_ms.take().is_some();
            if recovered {
                // Its failures' times (timeouts) said nothing of how fast
                // it takes events: its backlog goes at its new pace.
                state.next_slot_ms = 0;
                state.pace_ms = took.max(1);
            }
            None
        } else {
            Some(*state.failing_since_ms.get_or_insert(now))
        };
        let probation_until = state.probation.record(outcome, now, e.probe);
        let by = if e.gone {
            Some(BY_GONE)
        } else {
            failing_since
                .zip(disable_after)
                .filter(|(since, after)| now.saturating_sub(*since) >= after.as_millis() as u64)
                .map(|_| BY_DISABLE_AFTER)
        };
        let disabled = by.map(|by| Disabled {
            by: by.into(),
            since_ms: now,
            failing_since_ms: failing_since,
            last_outcome: Some(outcome.as_str().into()),
            last_status: e.status,
        });
        if let Some(d) = &disabled {
            s.disabled.insert(origin.into(), d.clone());
            s.states.remove(origin);
        }
        Said {
            probation_until,
            disabled,
            recovered,
        }
    }

    /// What disabling `origin` now records (an operator's call), from its
    /// state so far: `None` when it is disabled already. Nothing changes
    /// until `hold_disabled`.
    pub fn would_disable(&self, origin: &str, now: u64) -> Option<Disabled> {
        let s = self.lock();
        if s.disabled.contains_key(origin) {
            return None;
        }
        let last = s.states.get(origin).and_then(|st| st.last);
        Some(Disabled {
            by: BY_OPERATOR.into(),
            since_ms: now,
            failing_since_ms: s.states.get(origin).and_then(|st| st.failing_since_ms),
            last_outcome: last.map(|(o, _)| o.as_str().into()),
            last_status: last.and_then(|(_, s)| s),
        })
    }

    /// Holds `origin` disabled as `d` says (recorded already).
    pub fn hold_disabled(&self, origin: &str, d: Disabled) {
        let mut s = self.lock();
        s.states.remove(origin);
        s.disabled.insert(origin.into(), d);
    }

    /// Enables `origin` again, afresh: what its disabling was, if any.
    pub fn enable(&self, origin: &str) -> Option<Disabled> {
        let mut s = self.lock();
        s.states.remove(origin);
        s.disabled.remove(origin)
    }

    pub fn disabled(&self, origin: &str) -> Option<Disabled> {
        self.lock().disabled.get(origin).cloned()
    }

    /// The endpoint `url` names (as stored), its origin and disabling, if
    /// it is disabled. While none is, the URL is not read: each event's
    /// admission made its origin's string for this check before.
    pub fn disabled_at(&self, url: &str) -> Option<(String, Disabled)> {
        if self.lock().disabled.is_empty() {
            return None;
        }
        // Made outside the lock, which the dispatcher takes per attempt.
        let origin = endpoint::stored_origin(url)?;
        let d = self.disabled(&origin)?;
        Some((origin, d))
    }

    /// The time an event of `origin` put back no earlier than `from` is
    /// due: the endpoint's next slot, `cap` events a slot, a slot every
    /// `pace_ms`. An endpoint not held gets `from`.
    pub fn slot(&self, origin: &str, from: u64, cap: usize, pace_ms: u64) -> u64 {
        let mut s = self.lock();
        let Some(st) = s.states.get_mut(origin) else {
            return from;
        };
        if st.next_slot_ms < from {
            st.next_slot_ms = from;
            st.in_slot = 0;
        }
        let at = st.next_slot_ms;
        st.in_slot += 1;
        if st.in_slot as usize >= cap.max(1) {
            st.next_slot_ms += pace_ms.max(1);
            st.in_slot = 0;
        }
        at
    }

    /// How long `origin`'s attempts take (ms): the spacing of its events
    /// put back while it is busy.
    pub fn pace_ms(&self, origin: &str) -> u64 {
        let s = self.lock();
        s.states
            .get(origin)
            .map_or(FIRST_PACE_MS, |state| state.pace_ms) as u64
    }

    /// Every endpoint held now, disabled ones included, by origin.
    pub fn views(&self) -> Vec<(Arc<str>, View)> {
        let now = clock::now_ms();
        let s = self.lock();
        let held = s.states.iter().map(|(o, st)| {
            let view = View {
                state: st.state(now),
                in_flight: st.in_flight,
                failing_since_ms: st.failing_since_ms,
                last_outcome: st.last.map(|(o, _)| o.as_str().into()),
                last_status: st.last.and_then(|(_, s)| s),
            };
            (o.clone(), view)
        });
        let disabled = s.disabled.iter().map(|(o, d)| {
            let view = View {
                state: "disabled",
                in_flight: 0,
                failing_since_ms: d.failing_since_ms,
                last_outcome: d.last_outcome.clone(),
                last_status: d.last_status,
            };
            (o.clone(), view)
        });
        held.chain(disabled).collect()
    }

    /// The endpoints held now, by state.
    pub fn census(&self) -> Census {
        let now = clock::now_ms();
        let s = self.lock();
        let mut c = Census {
            disabled: s.disabled.len(),
            ..Census::default()
        };
        for st in s.states.values() {
            match st.state(now) {
                "paused" => c.paused += 1,
                "probation" => c.probation += 1,
                _ => c.healthy += 1,
            }
        }
        c
    }
}

/// Endpoints by state, as `courier_endpoints` counts them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Census {
    pub healthy: usize,
    pub probation: usize,
    pub paused: usize,
    pub disabled: usize,
}

impl Census {
    pub fn by_state(&self) -> [(&'static str, usize); 4] {
        [
            ("healthy", self.healthy),
            ("probation", self.probation),
            ("paused", self.paused),
            ("disabled", self.disabled),
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

    /// `start`'s answer without the key: whether the attempt is the probe.
    fn probe(e: &Endpoints, origin: &str, cap: usize) -> Result<bool, Blocked> {
        e.start(origin, cap).map(|(_, probe)| probe)
    }

    fn endpoints(threshold: u32, max_tracked: usize) -> Endpoints {
        let policy = ProbationPolicy {
            threshold,
            ..ProbationPolicy::default()
        };
        Endpoints::new(policy, max_tracked, None, Vec::new())
    }

    fn failed() -> Ended {
        Ended {
            outcome: Some(Outcome::TimedOut),
            status: None,
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
        assert_eq!(probe(&e, &a, 2), Ok(false));
        assert_eq!(probe(&e, &a, 2), Ok(false));
        assert_eq!(
            probe(&e, &a, 2),
            Err(Blocked::Busy),
            "two in flight at a cap of 2"
        );
        assert_eq!(probe(&e, &b, 2), Ok(false), "b has its own cap");
        assert_eq!(e.ended(&a, failed()), Said::default());
        let until = e
            .ended(&a, failed())
            .probation_until
            .expect("a second failure starts a probation");
        assert_eq!(probe(&e, &a, 2), Err(Blocked::Probation(until)));
        assert_eq!(probe(&e, &b, 2), Ok(false), "b is not on probation");
        let census = e.census();
        assert_eq!((census.healthy, census.probation), (1, 1));
    }

    #[test]
    fn a_retry_after_holds_and_a_410_disables_only_their_endpoint() {
        let e = endpoints(10, 100);
        let (a, b): (Arc<str>, Arc<str>) = ("https://a:443".into(), "https://b:443".into());
        assert_eq!(probe(&e, &a, 4), Ok(false));
        e.ended(
            &a,
            Ended {
                hold: Some(Duration::from_secs(30)),
                ..failed()
            },
        );
        assert!(matches!(probe(&e, &a, 4), Err(Blocked::WaitUntil(_))));
        assert_eq!(probe(&e, &b, 4), Ok(false));
        let said = e.ended(
            &b,
            Ended {
                gone: true,
                status: Some(410),
                ..failed()
            },
        );
        let d = said.disabled.expect("a 410 disables");
        assert_eq!((d.by.as_str(), d.last_status), (BY_GONE, Some(410)));
        assert_eq!(probe(&e, &b, 4), Err(Blocked::Disabled), "b answered 410");
        assert!(matches!(probe(&e, &a, 4), Err(Blocked::WaitUntil(_))));
        assert_eq!(e.census().disabled, 1);
        assert_eq!(e.enable(&b), Some(d));
        assert_eq!(probe(&e, &b, 4), Ok(false), "enabled afresh");
    }

    #[test]
    fn failing_with_no_success_for_disable_after_disables() {
        let e = Endpoints::new(
            ProbationPolicy::default(),
            100,
            Some(Duration::from_millis(40)),
            Vec::new(),
        );
        let a: Arc<str> = "https://a:443".into();
        assert_eq!(probe(&e, &a, 4), Ok(false));
        assert_eq!(e.ended(&a, failed()).disabled, None, "the first failure");
        std::thread::sleep(Duration::from_millis(50));
        // A success in between starts the clock again.
        assert_eq!(probe(&e, &a, 4), Ok(false));
        let ok = Ended {
            outcome: Some(Outcome::Delivered),
            ..failed()
        };
        assert_eq!(e.ended(&a, ok).disabled, None);
        assert_eq!(probe(&e, &a, 4), Ok(false));
        assert_eq!(e.ended(&a, failed()).disabled, None, "failing anew");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(probe(&e, &a, 4), Ok(false));
        let d = e.ended(&a, failed()).disabled.expect("40 ms failing");
        assert_eq!(d.by, BY_DISABLE_AFTER);
        assert!(d.failing_since_ms.is_some_and(|t| t < d.since_ms));
        assert_eq!(probe(&e, &a, 4), Err(Blocked::Disabled));
    }

    #[test]
    fn the_key_a_start_gives_is_the_states_own() {
        let e = Endpoints::new(ProbationPolicy::default(), 8, None, Vec::new());
        let (first, _) = e.start("https://a:443", 4).expect("started");
        let (again, _) = e.start("https://a:443", 4).expect("started");
        assert!(Arc::ptr_eq(&first, &again), "one key, not a copy a start");
        assert_eq!(&*first, "https://a:443");
        assert_eq!(e.disabled_at("https://a/x"), None, "none disabled");
    }

    #[test]
    fn disabled_endpoints_are_kept_past_max_tracked_and_loaded_at_start() {
        let kept = Disabled {
            by: BY_OPERATOR.into(),
            since_ms: 1,
            failing_since_ms: None,
            last_outcome: None,
            last_status: None,
        };
        let e = Endpoints::new(
            ProbationPolicy::default(),
            8,
            None,
            vec![("https://off:443".into(), kept.clone())],
        );
        for i in 0..50 {
            let origin: Arc<str> = format!("https://h{i}:443").into();
            assert_eq!(probe(&e, &origin, 4), Ok(false));
            e.ended(&origin, failed());
        }
        let off: Arc<str> = "https://off:443".into();
        assert_eq!(probe(&e, &off, 4), Err(Blocked::Disabled));
        assert_eq!(e.disabled(&off), Some(kept.clone()));
        assert_eq!(
            e.disabled_at("https://OFF/x?y=1"),
            Some(("https://off:443".to_string(), kept)),
            "found by a URL of its origin"
        );
        assert_eq!(e.disabled_at("https://h1/x"), None);
        assert_eq!(e.would_disable(&off, 5), None, "disabled already");
        let other: Arc<str> = "https://fresh:443".into();
        assert_eq!(probe(&e, &other, 4), Ok(false));
        e.ended(&other, failed());
        let d = e.would_disable(&other, 5).expect("not disabled");
        assert_eq!(
            d.last_outcome.as_deref(),
            Some("TimedOut"),
            "from its state"
        );
        assert_eq!(probe(&e, &other, 4), Ok(false), "nothing changed yet");
        e.ended(&other, failed());
        e.hold_disabled(&other, d);
        assert_eq!(probe(&e, &other, 4), Err(Blocked::Disabled));
        let views = e.views();
        assert_eq!(
            views.iter().filter(|(_, v)| v.state == "disabled").count(),
            2
        );
    }

    #[test]
    fn an_attempt_not_made_gives_back_its_place_and_its_probe() {
        let e = endpoints(1, 100);
        let a: Arc<str> = "https://a:443".into();
        assert_eq!(probe(&e, &a, 1), Ok(false));
        let until = e.ended(&a, failed()).probation_until.expect("probation");
        let _ = until;
        // A probation of 10 s at the least: not over yet.
        assert!(matches!(probe(&e, &a, 1), Err(Blocked::Probation(_))));
        let e = endpoints(0, 100);
        assert_eq!(probe(&e, &a, 1), Ok(false));
        assert_eq!(probe(&e, &a, 1), Err(Blocked::Busy));
        e.ended(
            &a,
            Ended {
                outcome: None,
                ..failed()
            },
        );
        assert_eq!(probe(&e, &a, 1), Ok(false), "its place is free again");
    }

    #[test]
    fn past_max_tracked_idle_endpoints_are_forgotten_the_healthy_first() {
        let e = endpoints(1, 8);
        let sick: Arc<str> = "https://sick:443".into();
        assert_eq!(probe(&e, &sick, 4), Ok(false));
        e.ended(&sick, failed());
        let busy: Arc<str> = "https://busy:443".into();
        assert_eq!(probe(&e, &busy, 4), Ok(false));
        for i in 0..100 {
            let origin: Arc<str> = format!("https://h{i}:443").into();
            assert_eq!(probe(&e, &origin, 4), Ok(false));
            e.ended(
                &origin,
                Ended {
                    outcome: Some(Outcome::Delivered),
                    ..failed()
                },
            );
        }
        let c = e.census();
        let tracked = c.healthy + c.probation + c.paused + c.disabled;
        assert!(tracked <= 8, "{tracked} held past max_tracked");
        assert!(
            matches!(probe(&e, &sick, 4), Err(Blocked::Probation(_))),
            "the sick one was kept while healthy ones could go"
        );
        assert_eq!(probe(&e, &busy, 1), Err(Blocked::Busy), "in flight: kept");
    }

    #[test]
    fn a_blocked_endpoints_events_come_back_spaced_across_passes() {
        let t = |k| Turn {
            k,
            cap: 4,
            pace_ms: 1000,
            timeout_ms: 500,
            now: 10_000,
        };
        assert_eq!(
            due_again(Blocked::Busy, t(3)),
            None,
            "within its cap: ready"
        );
        assert_eq!(due_again(Blocked::Busy, t(4)), Some(Again::Spaced(11_000)));
        let probation = Blocked::Probation(20_000);
        assert_eq!(
            due_again(probation, t(0)),
            Some(Again::At(20_000)),
            "the probe"
        );
        assert_eq!(due_again(probation, t(1)), Some(Again::Spaced(20_500)));
        assert_eq!(
            due_again(Blocked::WaitUntil(15_000), t(7)),
            Some(Again::Spaced(15_000))
        );
        assert_eq!(
            due_again(Blocked::Probing, t(0)),
            Some(Again::Spaced(11_000)),
            "1 s at least"
        );
        assert_eq!(due_again(Blocked::Disabled, t(9)), None);

        let e = endpoints(100, 100);
        let a: Arc<str> = "https://a:443".into();
        assert_eq!(e.slot(&a, 5_000, 4, 1000), 5_000, "not held: as asked");
        assert_eq!(probe(&e, &a, 4), Ok(false));
        // Two passes of six each: the second goes on after the first.
        let slots: Vec<u64> = (0..12).map(|_| e.slot(&a, 20_500, 4, 1000)).collect();
        assert_eq!(
            slots,
            [
                20_500, 20_500, 20_500, 20_500, 21_500, 21_500, 21_500, 21_500, 22_500, 22_500,
                22_500, 22_500
            ]
        );
        assert_eq!(
            e.slot(&a, 30_000, 4, 1000),
            30_000,
            "a later start moves the slots"
        );
    }

    #[test]
    fn the_first_success_after_failures_is_a_recovery() {
        let e = endpoints(100, 100);
        let a: Arc<str> = "https://a:443".into();
        let ok = || Ended {
            outcome: Some(Outcome::Delivered),
            ..failed()
        };
        assert_eq!(probe(&e, &a, 4), Ok(false));
        assert!(!e.ended(&a, ok()).recovered, "never failed");
        assert_eq!(probe(&e, &a, 4), Ok(false));
        e.ended(&a, failed());
        assert_eq!(probe(&e, &a, 4), Ok(false));
        assert!(e.ended(&a, ok()).recovered);
        assert_eq!(probe(&e, &a, 4), Ok(false));
        assert!(!e.ended(&a, ok()).recovered, "once");
    }

    #[test]
    fn the_pace_follows_the_attempts() {
        let e = endpoints(0, 100);
        let a: Arc<str> = "https://a:443".into();
        assert_eq!(e.pace_ms(&a), FIRST_PACE_MS as u64);
        for _ in 0..20 {
            assert_eq!(probe(&e, &a, 4), Ok(false));
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
