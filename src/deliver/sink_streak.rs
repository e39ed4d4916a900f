//! A destination's failed dead-letter writes, told in the log as streaks.
//! A sink that fails fails for every event that reaches it (a full volume,
//! a folder that is a file), and each such event retries its write every
//! few seconds: a line per failed write buried the log (200 ERROR lines
//! for 100 events in 5 s). So the first failure of a streak is an ERROR
//! line with its error; the others are DEBUG lines (and each counts in
//! `courier_dead_letter_write_failures_total`); while the streak lasts, a
//! failure at least `REMIND_EVERY` after the last ERROR line is one again,
//! with the streak's tally, so that a long streak still shows in a log
//! kept for a short while; the first event of the streak whose write is
//! given up (it then waits for a restart) is one too; and the first write
//! that succeeds ends the streak with one line giving its tally.
//!
//! Pure: the caller passes the time and does the logging.

use std::time::Duration;
use tokio::time::Instant;

/// At most one reminder per this while a streak lasts.
pub const REMIND_EVERY: Duration = Duration::from_secs(60);

/// How to log one failed write.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Say {
    /// Counted only: a DEBUG line.
    Quiet,
    /// An ERROR line: the streak starts, or its first give-up.
    Loud,
    /// An ERROR line with the streak so far.
    Remind(Tally),
}

/// A streak so far, or as it ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tally {
    /// Failed writes.
    pub failures: u64,
    /// Since the first of them.
    pub lasted: Duration,
    /// Events whose writes were given up: they wait in the journal for a
    /// restart.
    pub left_pending: u64,
}

#[derive(Default)]
pub struct SinkStreak {
    open: Option<Open>,
}

struct Open {
    since: Instant,
    failures: u64,
    left_pending: u64,
    last_loud: Instant,
}

impl SinkStreak {
    /// A write failed; `given_up`: the events it held that now wait for a
    /// restart (0 while they are retried).
    pub fn failed(&mut self, now: Instant, given_up: u64) -> Say {
        let Some(open) = &mut self.open else {
            self.open = Some(Open {
                since: now,
                failures: 1,
                left_pending: given_up,
                last_loud: now,
            });
            return Say::Loud;
        };
        open.failures += 1;
        let first_give_up = open.left_pending == 0 && given_up > 0;
        open.left_pending += given_up;
        if first_give_up {
            open.last_loud = now;
            Say::Loud
        } else if now.duration_since(open.last_loud) >= REMIND_EVERY {
            open.last_loud = now;
            Say::Remind(open.tally(now))
        } else {
            Say::Quiet
        }
    }

    /// A write succeeded: the tally of the streak it ends, if any.
    pub fn written(&mut self, now: Instant) -> Option<Tally> {
        self.open.take().map(|open| open.tally(now))
    }
}

impl Open {
    fn tally(&self, now: Instant) -> Tally {
        Tally {
            failures: self.failures,
            lasted: now.duration_since(self.since),
            left_pending: self.left_pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn one_loud_line_per_streak_and_its_tally_when_a_write_succeeds() {
        let t0 = Instant::now();
        let mut s = SinkStreak::default();
        assert_eq!(s.written(t0), None, "no streak, nothing to end");
        assert_eq!(s.failed(t0, 0), Say::Loud);
        for i in 1..200 {
            assert_eq!(s.failed(t0 + Duration::from_millis(i * 50), 0), Say::Quiet);
        }
        assert_eq!(
            s.written(t0 + secs(12)),
            Some(Tally {
                failures: 200,
                lasted: secs(12),
                left_pending: 0
            })
        );
        assert_eq!(s.written(t0 + secs(13)), None, "the streak ended once");
        assert_eq!(s.failed(t0 + secs(14), 0), Say::Loud, "a new streak");
    }

    #[test]
    fn a_long_streak_reminds_at_most_once_per_interval() {
        let t0 = Instant::now();
        let mut s = SinkStreak::default();
        s.failed(t0, 0);
        let mut reminders = Vec::new();
        // A failure every 5 s for 3 minutes.
        for i in 1..=36 {
            let at = secs(5 * i);
            if let Say::Remind(t) = s.failed(t0 + at, 0) {
                reminders.push((at, t.failures));
            }
        }
        assert_eq!(
            reminders,
            vec![(secs(60), 13), (secs(120), 25), (secs(180), 37)]
        );
    }

    #[test]
    fn the_first_give_up_is_loud_and_every_one_is_counted() {
        let t0 = Instant::now();
        let mut s = SinkStreak::default();
        s.failed(t0, 0);
        assert_eq!(s.failed(t0 + secs(1), 3), Say::Loud);
        assert_eq!(s.failed(t0 + secs(2), 2), Say::Quiet);
        assert_eq!(
            s.failed(t0 + secs(61), 0),
            Say::Remind(Tally {
                failures: 4,
                lasted: secs(61),
                left_pending: 5
            })
        );
        assert_eq!(s.written(t0 + secs(70)).map(|t| t.left_pending), Some(5));
    }
}
