//! Retry schedules as data: the delay before each attempt, without jitter,
//! plus the jitter applied at run time. `courier schedule` prints exactly
//! what this computes.

use rand::Rng;
use std::time::Duration;

/// Event Grid's published schedule; after the last step it repeats every 12h.
pub const EVENTGRID: [u64; 10] = [
    10,
    30,
    60,
    300,
    600,
    1800,
    3600,
    3 * 3600,
    6 * 3600,
    12 * 3600,
];

#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    EventGrid,
    /// Delays before attempts 2, 3, ...; the last one repeats.
    List(Vec<Duration>),
}

/// Which part of a schedule produced a delay (SPEC §1, `courier schedule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    EventGrid,
    List,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::EventGrid => "eventgrid",
            Phase::List => "list",
        }
    }
}

impl Schedule {
    /// The delay before attempt `attempt` (1-based; the first attempt is immediate).
    pub fn delay_before(&self, attempt: u32) -> Duration {
        let Some(retry) = (attempt as usize).checked_sub(2) else {
            return Duration::ZERO;
        };
        match self {
            Schedule::EventGrid => Duration::from_secs(EVENTGRID[retry.min(EVENTGRID.len() - 1)]),
            Schedule::List(delays) => match delays.get(retry).or(delays.last()) {
                Some(d) => *d,
                None => Duration::ZERO,
            },
        }
    }

    pub fn phase(&self, _attempt: u32) -> Phase {
        match self {
            Schedule::EventGrid => Phase::EventGrid,
            Schedule::List(_) => Phase::List,
        }
    }
}

/// `d` times a uniform factor in `[1 - jitter, 1 + jitter]`.
pub fn jittered(d: Duration, jitter: f64, rng: &mut impl Rng) -> Duration {
    if jitter <= 0.0 || d.is_zero() {
        return d;
    }
    d.mul_f64(rng.random_range((1.0 - jitter)..=(1.0 + jitter)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn eventgrid_steps_then_every_12h() {
        let g = Schedule::EventGrid;
        assert_eq!(g.delay_before(1), Duration::ZERO);
        let got: Vec<u64> = (2..=13).map(|a| g.delay_before(a).as_secs()).collect();
        assert_eq!(
            got,
            [
                10, 30, 60, 300, 600, 1800, 3600, 10800, 21600, 43200, 43200, 43200
            ]
        );
        assert_eq!(g.phase(5).as_str(), "eventgrid");
    }

    #[test]
    fn list_repeats_its_last_delay() {
        let l = Schedule::List(vec![s(5), s(300), s(1800)]);
        let got: Vec<u64> = (1..=6).map(|a| l.delay_before(a).as_secs()).collect();
        assert_eq!(got, [0, 5, 300, 1800, 1800, 1800]);
        assert_eq!(l.phase(2).as_str(), "list");
    }

    #[test]
    fn jitter_stays_within_bounds_and_spreads() {
        let mut rng = rand::rng();
        let base = s(100);
        let (mut lo, mut hi) = (base, base);
        for _ in 0..2000 {
            let d = jittered(base, 0.1, &mut rng);
            assert!(d >= s(90) && d <= s(110), "{d:?}");
            lo = lo.min(d);
            hi = hi.max(d);
        }
        assert!(
            lo < s(95) && hi > s(105),
            "jitter did not spread: {lo:?}..{hi:?}"
        );
        assert_eq!(jittered(base, 0.0, &mut rng), base);
        assert_eq!(jittered(Duration::ZERO, 0.5, &mut rng), Duration::ZERO);
    }
}
