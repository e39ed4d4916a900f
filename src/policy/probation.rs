//! Delayed delivery for sick endpoints (docs/delivery.md, Event Grid's probation):
//! after `threshold` consecutive failures no attempt goes out, new or
//! retry, for a time that depends on the last outcome; then one probe goes
//! first, and full rate resumes only when it succeeds. Each probation that
//! follows a failed probe doubles, capped at an hour. Waiting is not an
//! attempt, so a dead endpoint costs one attempt per probation period.

use crate::event::Outcome;
use std::time::Duration;

/// Consecutive failures that put an endpoint on probation.
pub const DEFAULT_THRESHOLD: u32 = 10;
pub const MAX_PROBATION: Duration = Duration::from_secs(3600);

/// The destination's probation settings: Event Grid's table unless overridden.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbationPolicy {
    /// Consecutive failures that start a probation; 0 never does.
    pub threshold: u32,
    /// Lengths by outcome that replace `base_duration`'s.
    pub overrides: Vec<(Outcome, Duration)>,
    /// Cap of a probation's doubling.
    pub max: Duration,
}

impl Default for ProbationPolicy {
    fn default() -> Self {
        ProbationPolicy {
            threshold: DEFAULT_THRESHOLD,
            overrides: Vec::new(),
            max: MAX_PROBATION,
        }
    }
}

impl ProbationPolicy {
    /// The length of a probation after `outcome`, the `strikes`-th in a row.
    pub fn length(&self, outcome: Outcome, strikes: u32) -> Duration {
        let base = self
            .overrides
            .iter()
            .find(|(o, _)| *o == outcome)
            .map_or_else(|| base_duration(outcome), |(_, d)| *d);
        base.saturating_mul(1 << strikes.min(20)).min(self.max)
    }
}

/// Event Grid's probation table.
pub fn base_duration(outcome: Outcome) -> Duration {
    let secs = match outcome {
        Outcome::Busy | Outcome::TimedOut => 10,
        Outcome::SocketError | Outcome::Failed => 30,
        Outcome::NotFound
        | Outcome::ResolutionError
        | Outcome::Unauthorized
        | Outcome::Forbidden
        | Outcome::TlsError
        | Outcome::Gone => 300,
        // None of these starts a probation (`blames_the_event`).
        Outcome::Delivered
        | Outcome::Probation
        | Outcome::BadRequest
        | Outcome::PayloadTooLarge
        | Outcome::AddressNotAllowed => 10,
    };
    Duration::from_secs(secs)
}

/// 400 and 413 say the event is bad, not the endpoint (docs/delivery.md lists
/// neither): a run of malformed events is dead-lettered one by one and must
/// not put a healthy endpoint on probation. So does a refused address: no
/// connection was made, the URL is what is wrong. Such an answer neither counts
/// toward the threshold nor breaks a run of failures, but a probe answered
/// so has found the endpoint answering, which ends the probation.
fn blames_the_event(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::BadRequest | Outcome::PayloadTooLarge | Outcome::AddressNotAllowed
    )
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Attempts may go out.
    Go,
    /// Only one attempt, the probe, may go out now.
    Probe,
    /// No attempt until then (ms since the epoch).
    WaitUntil(u64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probation {
    policy: ProbationPolicy,
    consecutive: u32,
    /// How many probations in a row (each one after a failed probe doubles).
    strikes: u32,
    until_ms: Option<u64>,
    probing: bool,
}

impl Probation {
    pub fn new(policy: ProbationPolicy) -> Self {
        Probation {
            policy,
            consecutive: 0,
            strikes: 0,
            until_ms: None,
            probing: false,
        }
    }

    /// May an attempt start at `now_ms`?
    pub fn policy(&self) -> &ProbationPolicy {
        &self.policy
    }

    pub fn admit(&self, now_ms: u64) -> Admit {
        match self.until_ms {
            Some(until) if now_ms < until => Admit::WaitUntil(until),
            Some(_) if self.probing => Admit::WaitUntil(u64::MAX),
            Some(_) => Admit::Probe,
            None => Admit::Go,
        }
    }

    /// The probe was sent; no other attempt until its result.
    pub fn probe_started(&mut self) {
        self.probing = true;
    }

    /// The probe's turn ended without an attempt (its event expired or was
    /// already completed): the next event may probe.
    pub fn probe_cancelled(&mut self) {
        self.probing = false;
    }

    /// Records an attempt's result. Returns the probation end when this
    /// result starts a probation.
    /// `probe`: this result is the probe's; results of attempts that
    /// started before the probation neither end nor extend it.
    pub fn record(&mut self, outcome: Outcome, now_ms: u64, probe: bool) -> Option<u64> {
        let was_probing = probe && std::mem::take(&mut self.probing);
        if blames_the_event(outcome) && !was_probing {
            return None;
        }
        if outcome == Outcome::Delivered || blames_the_event(outcome) {
            self.consecutive = 0;
            self.strikes = 0;
            self.until_ms = None;
            return None;
        }
        self.consecutive = self.consecutive.saturating_add(1);
        let on_probation = self.until_ms.is_some();
        let threshold_reached =
            self.policy.threshold > 0 && self.consecutive >= self.policy.threshold;
        if was_probing || (!on_probation && threshold_reached) {
            let length = self.policy.length(outcome, self.strikes);
            self.strikes = self.strikes.saturating_add(1);
            let until = now_ms + length.as_millis() as u64;
            self.until_ms = Some(until);
            return Some(until);
        }
        None
    }

    pub fn on_probation(&self, now_ms: u64) -> bool {
        self.until_ms.is_some_and(|u| now_ms < u) || self.probing
    }

    pub fn until_ms(&self) -> Option<u64> {
        self.until_ms
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(threshold: u32) -> ProbationPolicy {
        ProbationPolicy {
            threshold,
            ..ProbationPolicy::default()
        }
    }

    #[test]
    fn overrides_and_cap_apply_and_zero_threshold_never_starts_one() {
        let p = ProbationPolicy {
            threshold: 0,
            overrides: vec![(Outcome::Failed, Duration::from_millis(500))],
            max: Duration::from_secs(2),
        };
        assert_eq!(p.length(Outcome::Failed, 0), Duration::from_millis(500));
        assert_eq!(p.length(Outcome::Failed, 3), Duration::from_secs(2));
        assert_eq!(p.length(Outcome::Busy, 0), Duration::from_secs(2));
        let mut never = Probation::new(p);
        for _ in 0..100 {
            assert_eq!(never.record(Outcome::Failed, 0, false), None);
        }
    }

    #[test]
    fn bad_events_neither_start_nor_break_a_run_of_failures() {
        let mut p = Probation::new(policy(10));
        for i in 0..50 {
            let outcome = if i % 2 == 0 {
                Outcome::BadRequest
            } else {
                Outcome::PayloadTooLarge
            };
            assert_eq!(p.record(outcome, 1000 + i, false), None);
            assert_eq!(p.admit(1000 + i), Admit::Go);
        }
        assert_eq!(p.consecutive_failures(), 0);
        for i in 0..9 {
            assert_eq!(p.record(Outcome::Failed, 2000 + i, false), None);
            assert_eq!(p.record(Outcome::BadRequest, 2000 + i, false), None);
        }
        assert_eq!(p.consecutive_failures(), 9);
        assert_eq!(p.record(Outcome::Failed, 3000, false), Some(33_000));
    }

    #[test]
    fn a_probe_answered_400_ends_the_probation() {
        let mut p = Probation::new(policy(1));
        assert_eq!(p.record(Outcome::Failed, 0, false), Some(30_000));
        assert_eq!(p.admit(30_000), Admit::Probe);
        p.probe_started();
        assert_eq!(p.record(Outcome::BadRequest, 30_001, true), None);
        assert_eq!(p.admit(30_002), Admit::Go);
        assert!(!p.on_probation(30_002));
        // The next failure starts over at the first length, not doubled.
        assert_eq!(p.record(Outcome::Failed, 40_000, false), Some(70_000));
    }

    #[test]
    fn ten_failures_start_probation_by_the_last_outcome() {
        let mut p = Probation::new(policy(10));
        for i in 0..9 {
            assert_eq!(p.record(Outcome::Failed, 1000 + i, false), None);
            assert_eq!(p.admit(1000 + i), Admit::Go);
        }
        assert_eq!(p.record(Outcome::Busy, 2000, false), Some(12_000));
        assert_eq!(p.admit(11_999), Admit::WaitUntil(12_000));
        assert!(p.on_probation(5000));
        assert_eq!(p.admit(12_000), Admit::Probe);
    }

    #[test]
    fn one_probe_then_full_rate_on_success() {
        let mut p = Probation::new(policy(2));
        p.record(Outcome::SocketError, 0, false);
        assert_eq!(p.record(Outcome::SocketError, 0, false), Some(30_000));
        assert_eq!(p.admit(30_000), Admit::Probe);
        p.probe_started();
        assert_eq!(
            p.admit(30_001),
            Admit::WaitUntil(u64::MAX),
            "no second attempt while the probe is out"
        );
        assert_eq!(p.record(Outcome::Delivered, 30_100, true), None);
        assert_eq!(p.admit(30_100), Admit::Go);
        assert_eq!(p.consecutive_failures(), 0);
    }

    #[test]
    fn only_the_probes_own_result_ends_the_probe() {
        let mut p = Probation::new(policy(1));
        let until = p.record(Outcome::Failed, 0, false).expect("probation");
        assert_eq!(p.admit(until), Admit::Probe);
        p.probe_started();
        // an attempt from before the probation times out now: not the probe
        assert_eq!(p.record(Outcome::TimedOut, until + 1, false), None);
        assert_eq!(p.admit(until + 2), Admit::WaitUntil(u64::MAX));
        p.probe_cancelled();
        assert_eq!(p.admit(until + 3), Admit::Probe);
    }

    #[test]
    fn failed_probes_double_the_probation_up_to_an_hour() {
        let mut p = Probation::new(policy(1));
        let mut now = 0;
        let mut lengths = Vec::new();
        let mut until = p.record(Outcome::Failed, now, false).expect("probation");
        for _ in 0..10 {
            lengths.push((until - now) / 1000);
            now = until;
            assert_eq!(p.admit(now), Admit::Probe);
            p.probe_started();
            until = p
                .record(Outcome::Failed, now, true)
                .expect("probation again");
        }
        assert_eq!(
            lengths,
            [30, 60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]
        );
    }

    #[test]
    fn probation_lengths_follow_event_grids_table() {
        let s = |o| base_duration(o).as_secs();
        assert_eq!(
            (
                s(Outcome::Busy),
                s(Outcome::TimedOut),
                s(Outcome::SocketError),
                s(Outcome::Failed)
            ),
            (10, 10, 30, 30)
        );
        for o in [
            Outcome::NotFound,
            Outcome::ResolutionError,
            Outcome::Unauthorized,
            Outcome::Forbidden,
            Outcome::TlsError,
        ] {
            assert_eq!(s(o), 300, "{o:?}");
        }
    }
}
