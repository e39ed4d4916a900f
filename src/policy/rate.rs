//! `rate_limit.per_second` (SNS `maxReceivesPerSecond`): attempts are
//! spaced evenly, one every `1/rate` seconds, so there is no burst at a
//! second boundary. A batch counts as one attempt.

use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimit {
    interval_us: u64,
    /// The earliest time (µs, caller's clock) the next attempt may start.
    next_us: u64,
}

impl RateLimit {
    pub fn per_second(rate: u32) -> RateLimit {
        RateLimit {
            interval_us: 1_000_000 / u64::from(rate.max(1)),
            next_us: 0,
        }
    }

    /// The spacing between attempts: two limiters with the same one are the
    /// same setting.
    pub fn interval(&self) -> u64 {
        self.interval_us
    }

    /// Whether a slot is free at `now_us`, without taking it.
    pub fn free(&self, now_us: u64) -> bool {
        now_us >= self.next_us
    }

    /// Takes a slot at `now_us` if one is free; else how long to wait.
    pub fn try_take(&mut self, now_us: u64) -> Result<(), Duration> {
        if now_us < self.next_us {
            return Err(Duration::from_micros(self.next_us - now_us));
        }
        // Taken a little late (a timer's wake-up), the slot grid is kept so
        // the rate does not drift below its setting; after a pause of a whole
        // interval or more, the grid restarts from now: an idle limiter banks
        // no credit, so there is never more than one extra attempt in an interval.
        let late = now_us - self.next_us;
        self.next_us = if late < self.interval_us {
            self.next_us
        } else {
            now_us
        } + self.interval_us;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spaces_attempts_evenly_without_bursts() {
        let mut r = RateLimit::per_second(20);
        let mut now = 0;
        let mut taken = Vec::new();
        while now < 3_000_000 {
            match r.try_take(now) {
                Ok(()) => taken.push(now),
                Err(wait) => now += wait.as_micros() as u64,
            }
        }
        assert_eq!(taken.len(), 60);
        assert!(taken.windows(2).all(|w| w[1] - w[0] == 50_000));
    }

    #[test]
    fn late_wake_ups_do_not_lower_the_rate() {
        let mut r = RateLimit::per_second(100);
        let mut now = 0;
        let mut taken = 0;
        while now < 1_000_000 {
            match r.try_take(now) {
                Ok(()) => taken += 1,
                // every wake-up comes 2 ms after the slot it waited for
                Err(wait) => now += wait.as_micros() as u64 + 2_000,
            }
        }
        assert!((99..=101).contains(&taken), "{taken} in a second at 100/s");
    }

    #[test]
    fn idle_time_is_not_banked() {
        let mut r = RateLimit::per_second(10);
        assert_eq!(r.try_take(10_000_000), Ok(()));
        assert_eq!(r.try_take(10_000_001), Err(Duration::from_micros(99_999)));
    }
}
