//! Amazon SNS's HTTP/S retry policy (`healthyRetryPolicy`), computed the way
//! SNS describes it, so that a policy pasted from AWS behaves here as it
//! does there.
//!
//! # The four phases
//!
//! After the first attempt, the `numRetries` retries fall into four phases,
//! in this order:
//!
//! | phase | retries | delay before each |
//! |---|---|---|
//! | no-delay | `numNoDelayRetries` | 0 |
//! | pre-backoff | `numMinDelayRetries` | `minDelayTarget` |
//! | backoff | `numRetries - numNoDelayRetries - numMinDelayRetries - numMaxDelayRetries` | from `minDelayTarget` to `maxDelayTarget` by `backoffFunction` |
//! | post-backoff | `numMaxDelayRetries` | `maxDelayTarget` |
//!
//! # The backoff functions
//!
//! SNS says `minDelayTarget` is the delay of the *first* backoff retry and
//! `maxDelayTarget` that of the *last*, and names four functions without
//! publishing their formulas. courier defines them so that every one starts
//! exactly at min, ends exactly at max, never decreases, and has its own
//! shape. For backoff retry `i` of `n` (1-based), with `k = i - 1`,
//! `m = n - 1`, `t = k / m` (0 for the first retry, 1 for the last),
//! `d = max - min` and `r = max / min`:
//!
//! | function | delay | shape |
//! |---|---|---|
//! | `linear` (SNS's default) | `min + d·t` | the gap between delays is constant |
//! | `arithmetic` | `min + d·k(k+1) / (m(m+1))` | the gaps form an arithmetic progression (c, 2c, 3c, ...): quadratic growth |
//! | `geometric` | `min·r^t` | each delay is the previous one times a constant ratio `r^(1/m)` |
//! | `exponential` | `min + d·(B^t - 1) / (B - 1)`, `B = max(2^12, r²)` | the *excess over min* grows by a constant factor: it stays near min, then climbs steeply to max |
//!
//! Why that `B`: `geometric` is itself `min + d·(r^t - 1)/(r - 1)`, the same
//! family with base `r`. A fixed base for `exponential` would coincide with
//! `geometric` for the policy whose `r` equals it; `B ≥ r²` keeps
//! `exponential` strictly steeper than `geometric` for every policy, and the
//! floor `2^12` (twelve doublings of the excess across the phase) keeps it
//! visibly different even when min and max are close. At any point inside
//! the phase `exponential ≤ geometric` and `exponential ≤ arithmetic ≤
//! linear`.
//!
//! With a single backoff retry (`n = 1`) its delay is `maxDelayTarget`: it is
//! the last of the phase and leads into the post-backoff phase at max.
//!
//! SNS expresses every delay in whole seconds; so does courier: each backoff
//! delay is rounded to the nearest second (rounding keeps the order, so the
//! delays still never decrease).
//!
//! # Limits
//!
//! SNS caps the total retry time of an HTTP/S policy (the sum of all delays)
//! at 3600 s: [`SnsPolicy::total_retry_time`] is what config checks against
//! [`MAX_TOTAL_RETRY_SECS`].

use super::schedule::Phase;
use std::time::Duration;

/// SNS's hard limit on the total retry time of an HTTP/S policy.
pub const MAX_TOTAL_RETRY_SECS: u64 = 3600;
/// Largest `maxDelayTarget` (seconds).
pub const MAX_DELAY_TARGET: u32 = 3600;
/// Largest `numRetries`.
pub const MAX_NUM_RETRIES: u32 = 100;
/// The least total growth factor of the excess over min in `exponential`.
const EXPONENTIAL_MIN_BASE: f64 = 4096.0;

/// `backoffFunction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backoff {
    #[default]
    Linear,
    Arithmetic,
    Geometric,
    Exponential,
}

impl Backoff {
    pub const ALL: [Backoff; 4] = [
        Backoff::Linear,
        Backoff::Arithmetic,
        Backoff::Geometric,
        Backoff::Exponential,
    ];

    /// SNS's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Backoff::Linear => "linear",
            Backoff::Arithmetic => "arithmetic",
            Backoff::Geometric => "geometric",
            Backoff::Exponential => "exponential",
        }
    }

    pub fn parse(s: &str) -> Option<Backoff> {
        Backoff::ALL.into_iter().find(|b| b.as_str() == s)
    }

    /// How far from min to max (0..=1) backoff retry `k` of `0..=m` is.
    fn fraction(self, k: u32, m: u32, ratio: f64) -> f64 {
        let t = f64::from(k) / f64::from(m);
        match self {
            Backoff::Linear => t,
            Backoff::Arithmetic => {
                let (k, m) = (f64::from(k), f64::from(m));
                k * (k + 1.0) / (m * (m + 1.0))
            }
            Backoff::Geometric => excess_growth(ratio, t),
            Backoff::Exponential => excess_growth((ratio * ratio).max(EXPONENTIAL_MIN_BASE), t),
        }
    }
}

/// `(base^t - 1) / (base - 1)`: 0 at t = 0, 1 at t = 1, convex for base > 1.
fn excess_growth(base: f64, t: f64) -> f64 {
    if base <= 1.0 {
        return t;
    }
    (base.powf(t) - 1.0) / (base - 1.0)
}

/// An SNS `healthyRetryPolicy`. Delays are whole seconds, as in SNS.
///
/// The methods assume the phase counts fit in `num_retries` (config
/// rejects a policy where they do not); if they do not, the backoff phase
/// is simply empty, nothing panics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnsPolicy {
    pub min_delay_target: u32,
    pub max_delay_target: u32,
    pub num_retries: u32,
    pub num_no_delay_retries: u32,
    pub num_min_delay_retries: u32,
    pub num_max_delay_retries: u32,
    pub backoff_function: Backoff,
}

impl Default for SnsPolicy {
    /// SNS's defaults: 3 retries, 20 s apart.
    fn default() -> Self {
        SnsPolicy {
            min_delay_target: 20,
            max_delay_target: 20,
            num_retries: 3,
            num_no_delay_retries: 0,
            num_min_delay_retries: 0,
            num_max_delay_retries: 0,
            backoff_function: Backoff::Linear,
        }
    }
}

impl SnsPolicy {
    /// The example policy of the SNS documentation, the tests' fixture.
    #[cfg(test)]
    pub(crate) fn reference() -> SnsPolicy {
        SnsPolicy {
            min_delay_target: 1,
            max_delay_target: 60,
            num_retries: 50,
            num_no_delay_retries: 3,
            num_min_delay_retries: 2,
            num_max_delay_retries: 35,
            backoff_function: Backoff::Exponential,
        }
    }

    /// Retries in the no-delay, pre-backoff and post-backoff phases together.
    pub fn fixed_phase_retries(&self) -> u64 {
        u64::from(self.num_no_delay_retries)
            + u64::from(self.num_min_delay_retries)
            + u64::from(self.num_max_delay_retries)
    }

    /// SNS's `numRetries - numNoDelayRetries - numMinDelayRetries -
    /// numMaxDelayRetries`; `None` when the phases need more than
    /// `numRetries`.
    pub fn backoff_retries(&self) -> Option<u32> {
        u64::from(self.num_retries)
            .checked_sub(self.fixed_phase_retries())
            .and_then(|n| u32::try_from(n).ok())
    }

    /// Attempts in all: the first plus the retries.
    pub fn max_attempts(&self) -> u32 {
        self.num_retries.saturating_add(1)
    }

    /// The phase and delay (whole seconds) of retry `retry` (1-based: retry
    /// 1 is attempt 2). Past `numRetries` it stays at max, post-backoff.
    pub fn retry(&self, retry: u32) -> (Phase, u64) {
        let (min, max) = (
            u64::from(self.min_delay_target),
            u64::from(self.max_delay_target),
        );
        let no_delay = self.num_no_delay_retries;
        let pre = no_delay.saturating_add(self.num_min_delay_retries);
        let backoff = self.backoff_retries().unwrap_or(0);
        let ramp = pre.saturating_add(backoff);
        if retry <= no_delay {
            (Phase::NoDelay, 0)
        } else if retry <= pre {
            (Phase::PreBackoff, min)
        } else if retry <= ramp {
            (Phase::Backoff, self.backoff_delay(retry - pre, backoff))
        } else {
            (Phase::PostBackoff, max)
        }
    }

    /// Delay (whole seconds) of backoff retry `i` of `n` (both 1-based).
    pub fn backoff_delay(&self, i: u32, n: u32) -> u64 {
        let (min, max) = (
            u64::from(self.min_delay_target),
            u64::from(self.max_delay_target),
        );
        if n <= 1 || i >= n || max <= min {
            return max.max(min);
        }
        if i <= 1 {
            return min;
        }
        let (lo, hi) = (min as f64, max as f64);
        let ratio = if lo > 0.0 { hi / lo } else { f64::INFINITY };
        let f = self.backoff_function.fraction(i - 1, n - 1, ratio);
        let secs = (lo + (hi - lo) * f).round();
        if secs.is_finite() {
            (secs as u64).clamp(min, max)
        } else {
            min
        }
    }

    /// Sum of every retry's delay: the time from the first attempt to the
    /// last retry, which SNS caps at [`MAX_TOTAL_RETRY_SECS`].
    pub fn total_retry_time(&self) -> Duration {
        Duration::from_secs((1..=self.num_retries).map(|r| self.retry(r).1).sum())
    }

    /// The sum of the backoff phase's delays alone (for error messages).
    pub fn backoff_time(&self) -> Duration {
        let n = self.backoff_retries().unwrap_or(0);
        Duration::from_secs((1..=n).map(|i| self.backoff_delay(i, n)).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(f: Backoff, min: u32, max: u32, n: u32) -> Vec<u64> {
        let p = SnsPolicy {
            min_delay_target: min,
            max_delay_target: max,
            backoff_function: f,
            ..SnsPolicy::default()
        };
        (1..=n).map(|i| p.backoff_delay(i, n)).collect()
    }

    #[test]
    fn reference_policy_phases_and_delays() {
        let p = SnsPolicy::reference();
        assert_eq!(p.backoff_retries(), Some(10));
        assert_eq!(p.max_attempts(), 51);
        for r in 1..=3 {
            assert_eq!(p.retry(r), (Phase::NoDelay, 0), "retry {r}");
        }
        for r in 4..=5 {
            assert_eq!(p.retry(r), (Phase::PreBackoff, 1), "retry {r}");
        }
        let backoff: Vec<u64> = (6..=15)
            .map(|r| {
                let (phase, d) = p.retry(r);
                assert_eq!(phase, Phase::Backoff, "retry {r}");
                d
            })
            .collect();
        assert_eq!(backoff, [1, 1, 1, 1, 2, 2, 5, 10, 24, 60]);
        for r in 16..=50 {
            assert_eq!(p.retry(r), (Phase::PostBackoff, 60), "retry {r}");
        }
        assert_eq!(p.backoff_time().as_secs(), 107);
        // 3×0 + 2×1 + 107 + 35×60: well within SNS's 3600 s.
        assert_eq!(p.total_retry_time().as_secs(), 2209);
        assert!(p.total_retry_time().as_secs() <= MAX_TOTAL_RETRY_SECS);
    }

    #[test]
    fn defaults_are_three_retries_twenty_seconds_apart() {
        let p = SnsPolicy::default();
        assert_eq!(p.max_attempts(), 4);
        assert_eq!(p.backoff_retries(), Some(3));
        let got: Vec<(Phase, u64)> = (1..=3).map(|r| p.retry(r)).collect();
        assert_eq!(got, [(Phase::Backoff, 20); 3]);
        assert_eq!(p.total_retry_time().as_secs(), 60);
    }

    #[test]
    fn every_function_starts_at_min_ends_at_max_and_never_decreases() {
        for (min, max, n) in [
            (5, 260, 10),
            (1, 60, 10),
            (1, 3000, 10),
            (20, 30, 5),
            (3, 3, 4),
        ] {
            for f in Backoff::ALL {
                let c = curve(f, min, max, n);
                assert_eq!(c.first(), Some(&u64::from(min)), "{f:?} {c:?}");
                assert_eq!(c.last(), Some(&u64::from(max)), "{f:?} {c:?}");
                assert!(c.windows(2).all(|w| w[0] <= w[1]), "{f:?} {c:?}");
            }
        }
    }

    #[test]
    fn the_four_functions_have_different_shapes() {
        // SNS's own illustration: 10 retries from 5 s to 260 s.
        let lin = curve(Backoff::Linear, 5, 260, 10);
        let ari = curve(Backoff::Arithmetic, 5, 260, 10);
        let geo = curve(Backoff::Geometric, 5, 260, 10);
        let exp = curve(Backoff::Exponential, 5, 260, 10);
        assert_eq!(lin, [5, 33, 62, 90, 118, 147, 175, 203, 232, 260]);
        assert_eq!(ari, [5, 11, 22, 39, 62, 90, 124, 164, 209, 260]);
        assert_eq!(geo, [5, 8, 12, 19, 29, 45, 70, 108, 168, 260]);
        assert_eq!(exp, [5, 5, 5, 6, 7, 11, 21, 45, 106, 260]);
        // Strictly ordered inside the phase: linear > arithmetic > geometric > exponential.
        for i in 1..9 {
            assert!(
                lin[i] > ari[i] && ari[i] > geo[i] && geo[i] > exp[i],
                "retry {i}"
            );
        }
        // Linear gaps are constant (±1 s of rounding); arithmetic gaps grow by a
        // constant step; geometric ratios are constant.
        let gaps = |c: &[u64]| c.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>();
        assert!(gaps(&lin).iter().all(|g| (28..=29).contains(g)));
        let ari_gaps = gaps(&ari);
        assert!(ari_gaps.windows(2).all(|w| w[1] > w[0]));
        assert!(
            geo.windows(2)
                .all(|w| (1.4..1.7).contains(&(w[1] as f64 / w[0] as f64)))
        );
    }

    #[test]
    fn exponential_stays_steeper_than_geometric_even_at_extreme_ratios() {
        // A fixed base 4096 would make these two nearly equal at r = 3000.
        let geo = curve(Backoff::Geometric, 1, 3000, 10);
        let exp = curve(Backoff::Exponential, 1, 3000, 10);
        assert!(exp[7] * 2 < geo[7], "{exp:?} vs {geo:?}");
        // And close min and max still give visibly different curves.
        let geo = curve(Backoff::Geometric, 20, 30, 10);
        let exp = curve(Backoff::Exponential, 20, 30, 10);
        assert_ne!(geo, exp);
    }

    #[test]
    fn a_single_backoff_retry_is_at_max_and_min_equal_max_is_flat() {
        assert_eq!(curve(Backoff::Exponential, 1, 60, 1), [60]);
        assert_eq!(curve(Backoff::Geometric, 7, 7, 3), [7, 7, 7]);
    }

    #[test]
    fn phases_that_need_more_than_num_retries_leave_no_backoff() {
        let p = SnsPolicy {
            num_retries: 4,
            num_no_delay_retries: 3,
            num_max_delay_retries: 2,
            ..SnsPolicy::default()
        };
        assert_eq!(p.backoff_retries(), None);
        // Still total, never a panic.
        assert_eq!(p.retry(4), (Phase::PostBackoff, 20));
    }

    #[test]
    fn backoff_function_names_round_trip() {
        for f in Backoff::ALL {
            assert_eq!(Backoff::parse(f.as_str()), Some(f));
        }
        assert_eq!(Backoff::parse("Linear"), None);
        assert_eq!(Backoff::default(), Backoff::Linear);
    }
}
