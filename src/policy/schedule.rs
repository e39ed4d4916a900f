//! Retry schedules as data: the delay before each attempt, without jitter,
//! plus the jitter applied at run time. `courier schedule` prints exactly
//! what this computes.
//!
//! Attempts are 1-based; the first attempt is immediate and "retry k" is
//! attempt k + 1. Every schedule answers two pure questions, the delay
//! before an attempt and the phase that produced it, which is all that
//! [`Plan::compute`](super::limits::Plan::compute) and the dispatcher need.

use super::sns::SnsPolicy;
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
    /// The delay before retry k is `min(initial × multiplier^(k-1), max)`:
    /// 1s, 2s, 4s, ... capped at `max`. Config keeps `initial` in
    /// 1ms..=24h, `max` in initial..=24h and `multiplier` in 1..=10.
    Exponential {
        initial: Duration,
        max: Duration,
        multiplier: f64,
    },
    /// Amazon SNS's HTTP/S `healthyRetryPolicy`; see [`super::sns`].
    Sns(SnsPolicy),
}

/// Which part of a schedule produced a delay (docs/cli.md, `courier schedule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    EventGrid,
    List,
    Exponential,
    /// SNS: immediate retries (and the first attempt, which has no delay either).
    NoDelay,
    /// SNS: retries at `minDelayTarget` before the backoff.
    PreBackoff,
    /// SNS: retries whose delay climbs from min to max by `backoffFunction`.
    Backoff,
    /// SNS: the last retries, at `maxDelayTarget`.
    PostBackoff,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::EventGrid => "eventgrid",
            Phase::List => "list",
            Phase::Exponential => "exponential",
            Phase::NoDelay => "no-delay",
            Phase::PreBackoff => "pre-backoff",
            Phase::Backoff => "backoff",
            Phase::PostBackoff => "post-backoff",
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
            Schedule::Exponential {
                initial,
                max,
                multiplier,
            } => exponential_delay(*initial, *max, *multiplier, retry),
            Schedule::Sns(p) => Duration::from_secs(p.retry(attempt - 1).1),
        }
    }

    /// The wait after attempt `attempt` failed with `min_delay` (docs/delivery.md):
    /// `max(schedule delay, min delay)` times jitter, never below the
    /// minimum. Durable delivery and passthrough's in-line retries both.
    pub fn retry_wait(
        &self,
        attempt: u32,
        min_delay: Duration,
        jitter: f64,
        rng: &mut impl Rng,
    ) -> Duration {
        let base = self.delay_before(attempt + 1).max(min_delay);
        jittered(base, jitter, rng).max(min_delay)
    }

    /// Which phase attempt `attempt` belongs to. SNS's first attempt is
    /// labelled `no-delay`: it is sent at once, before any retry phase.
    pub fn phase(&self, attempt: u32) -> Phase {
        match self {
            Schedule::EventGrid => Phase::EventGrid,
            Schedule::List(_) => Phase::List,
            Schedule::Exponential { .. } => Phase::Exponential,
            Schedule::Sns(p) => match attempt.checked_sub(1) {
                Some(retry) if retry > 0 => p.retry(retry).0,
                _ => Phase::NoDelay,
            },
        }
    }
}

/// `min(initial × multiplier^n, max)` where `n` retries came before, to the
/// millisecond (so 1.5^n stays readable in `courier schedule`). Computed in
/// f64 and compared before converting, so a huge `n` saturates at `max`
/// instead of overflowing a `Duration`.
fn exponential_delay(initial: Duration, max: Duration, multiplier: f64, n: usize) -> Duration {
    let exp = i32::try_from(n).unwrap_or(i32::MAX);
    let ms = initial.as_secs_f64() * 1000.0 * multiplier.powi(exp);
    if !ms.is_finite() || ms >= max.as_secs_f64() * 1000.0 {
        return max;
    }
    Duration::from_millis(ms.round() as u64).min(max)
}

/// `d` times a uniform factor in `[1 - jitter, 1 + jitter]`.
fn jittered(d: Duration, jitter: f64, rng: &mut impl Rng) -> Duration {
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
    fn exponential_doubles_from_initial_up_to_max() {
        let e = Schedule::Exponential {
            initial: s(1),
            max: s(600),
            multiplier: 2.0,
        };
        let got: Vec<u64> = (1..=13).map(|a| e.delay_before(a).as_secs()).collect();
        assert_eq!(got, [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600]);
        assert_eq!(e.delay_before(u32::MAX), s(600));
        assert_eq!(e.phase(1).as_str(), "exponential");
        assert_eq!(e.phase(7).as_str(), "exponential");
    }

    #[test]
    fn exponential_with_fractional_multiplier_and_multiplier_one() {
        let e = Schedule::Exponential {
            initial: Duration::from_millis(100),
            max: s(1),
            multiplier: 1.5,
        };
        let got: Vec<u128> = (2..=9).map(|a| e.delay_before(a).as_millis()).collect();
        assert_eq!(got, [100, 150, 225, 338, 506, 759, 1000, 1000]);
        let flat = Schedule::Exponential {
            initial: s(5),
            max: s(60),
            multiplier: 1.0,
        };
        assert_eq!(flat.delay_before(30), s(5));
    }

    #[test]
    fn sns_reference_policy_delays_and_phases_per_attempt() {
        let p = Schedule::Sns(SnsPolicy::reference());
        assert_eq!((p.delay_before(1), p.phase(1)), (s(0), Phase::NoDelay));
        // Attempt a is retry a - 1.
        for a in 2..=4 {
            assert_eq!((p.delay_before(a), p.phase(a)), (s(0), Phase::NoDelay));
        }
        for a in 5..=6 {
            assert_eq!((p.delay_before(a), p.phase(a)), (s(1), Phase::PreBackoff));
        }
        assert_eq!((p.delay_before(7), p.phase(7)), (s(1), Phase::Backoff));
        assert_eq!((p.delay_before(16), p.phase(16)), (s(60), Phase::Backoff));
        for a in 17..=51 {
            assert_eq!((p.delay_before(a), p.phase(a)), (s(60), Phase::PostBackoff));
        }
        let names: Vec<&str> = [1, 5, 7, 17].iter().map(|&a| p.phase(a).as_str()).collect();
        assert_eq!(
            names,
            ["no-delay", "pre-backoff", "backoff", "post-backoff"]
        );
    }

    #[test]
    fn sns_defaults_are_twenty_seconds_apart() {
        let p = Schedule::Sns(SnsPolicy::default());
        let got: Vec<u64> = (1..=4).map(|a| p.delay_before(a).as_secs()).collect();
        assert_eq!(got, [0, 20, 20, 20]);
        assert_eq!(p.phase(2), Phase::Backoff);
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
