//! Passthrough's in-line retries (docs/publishing.md): the same table, schedule,
//! minimum delays and `max_attempts` as durable delivery, inside a deadline
//! the app is waiting on. A wait that would end past the deadline (a long
//! schedule step, a `min_delay`, a Retry-After) is not started: the app gets
//! the answer it would otherwise get later, now.

use super::classify::{Classified, Verdict};
use super::schedule::Schedule;
use rand::Rng;
use std::time::Duration;

/// What one in-line attempt's answer leaves to do.
pub struct Inline<'a> {
    pub schedule: &'a Schedule,
    pub max_attempts: u32,
    pub jitter: f64,
}

impl Inline<'_> {
    /// The wait before the next attempt after attempt `attempt` was
    /// `classified` in `took`, with `remaining` of the deadline left;
    /// `None`: answer the app with this attempt's result. The next attempt
    /// is expected to take as long as this one: one that could not finish
    /// before the deadline would turn the endpoint's answer in hand into a
    /// 504. 410 is answered too: passthrough has no queue to pause.
    pub fn wait(
        &self,
        classified: Classified,
        attempt: u32,
        took: Duration,
        remaining: Duration,
        rng: &mut impl Rng,
    ) -> Option<Duration> {
        let Verdict::Retry { min_delay } = classified.verdict else {
            return None;
        };
        if attempt >= self.max_attempts {
            return None;
        }
        let wait = self
            .schedule
            .retry_wait(attempt, min_delay, self.jitter, rng);
        (wait + took < remaining).then_some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Outcome;
    use crate::policy::{StatusPolicy, Transport};
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn list() -> Schedule {
        Schedule::List(vec![ms(50), ms(100)])
    }

    fn inline(schedule: &Schedule, max_attempts: u32) -> Inline<'_> {
        Inline {
            schedule,
            max_attempts,
            jitter: 0.0,
        }
    }

    #[test]
    fn retriable_answers_wait_the_schedule_while_the_deadline_allows() {
        let s = list();
        let p = inline(&s, 30);
        let rng = &mut StdRng::seed_from_u64(1);
        let policy = StatusPolicy {
            min_delay: vec![(503..=503, Duration::ZERO)],
            ..StatusPolicy::default()
        };
        let busy = policy.classify_status(503, None);
        assert_eq!(p.wait(busy, 1, ms(0), ms(1000), rng), Some(ms(50)));
        assert_eq!(p.wait(busy, 2, ms(0), ms(1000), rng), Some(ms(100)));
        assert_eq!(
            p.wait(busy, 7, ms(0), ms(1000), rng),
            Some(ms(100)),
            "the last repeats"
        );
        let refused = policy.classify_transport(Transport::Socket);
        assert_eq!(p.wait(refused, 1, ms(0), ms(51), rng), Some(ms(50)));
        assert_eq!(
            p.wait(refused, 1, ms(0), ms(50), rng),
            None,
            "a wait that ends at the deadline leaves no time for the attempt"
        );
    }

    #[test]
    fn a_retry_needs_room_for_an_attempt_as_long_as_the_last() {
        let s = list();
        let p = inline(&s, 30);
        let rng = &mut StdRng::seed_from_u64(6);
        let policy = StatusPolicy {
            min_delay: vec![(503..=503, Duration::ZERO)],
            ..StatusPolicy::default()
        };
        let busy = policy.classify_status(503, None);
        // 50 ms wait + 200 ms attempt fit in 300 ms, not in 240 ms.
        assert_eq!(p.wait(busy, 1, ms(200), ms(300), rng), Some(ms(50)));
        assert_eq!(p.wait(busy, 1, ms(200), ms(240), rng), None);
    }

    #[test]
    fn final_answers_are_never_retried() {
        let s = list();
        let p = inline(&s, 30);
        let rng = &mut StdRng::seed_from_u64(2);
        let policy = StatusPolicy::default();
        for status in [200, 204, 400, 401, 403, 404, 410, 413] {
            let c = policy.classify_status(status, None);
            assert_eq!(p.wait(c, 1, ms(0), ms(10_000), rng), None, "{status}");
        }
        let c = policy.classify_status(410, None);
        assert_eq!(c.outcome, Outcome::Gone);
    }

    #[test]
    fn min_delays_and_retry_after_cut_the_retries_short() {
        let s = list();
        let p = inline(&s, 30);
        let rng = &mut StdRng::seed_from_u64(3);
        let policy = StatusPolicy::default();
        // 503's default 30 s minimum is past a 10 s deadline: answered now.
        let busy = policy.classify_status(503, None);
        assert_eq!(p.wait(busy, 1, ms(0), ms(10_000), rng), None);
        // A Retry-After of 2 s within 10 s is honoured, past 1 s it ends.
        let hinted = policy.classify_status(429, Some(Duration::from_secs(2)));
        assert_eq!(
            p.wait(hinted, 1, ms(0), ms(10_000), rng),
            Some(Duration::from_secs(2))
        );
        assert_eq!(p.wait(hinted, 1, ms(0), ms(1_000), rng), None);
    }

    #[test]
    fn max_attempts_ends_the_retries() {
        let s = list();
        let p = inline(&s, 3);
        let rng = &mut StdRng::seed_from_u64(4);
        let refused = StatusPolicy::default().classify_transport(Transport::Socket);
        assert!(p.wait(refused, 2, ms(0), ms(10_000), rng).is_some());
        assert_eq!(p.wait(refused, 3, ms(0), ms(10_000), rng), None);
    }

    #[test]
    fn jitter_stays_within_its_band_and_above_the_minimum() {
        let s = Schedule::List(vec![ms(1000)]);
        let p = Inline {
            schedule: &s,
            max_attempts: 30,
            jitter: 0.5,
        };
        let rng = &mut StdRng::seed_from_u64(5);
        let policy = StatusPolicy {
            min_delay: vec![(500..=599, ms(900))],
            ..StatusPolicy::default()
        };
        let failed = policy.classify_status(500, None);
        let waits: Vec<Duration> = (0..200)
            .map(|_| p.wait(failed, 1, ms(0), ms(60_000), rng).expect("retried"))
            .collect();
        for w in &waits {
            assert!((ms(900)..=ms(1500)).contains(w), "{w:?}");
        }
        assert!(
            waits.iter().any(|w| *w < ms(990)) && waits.iter().any(|w| *w > ms(1010)),
            "jitter spreads the waits: {waits:?}"
        );
    }
}
