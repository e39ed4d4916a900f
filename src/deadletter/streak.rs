//! A destination's failed dead-letter writes, told in the log as streaks.
//! A sink that fails fails for every event that reaches it (a full volume,
//! a folder that is a file), and each such event retries its write every
//! few seconds: a line per failed write buried the log (200 ERROR lines
//! for 100 events in 5 s). So the first failure of a streak is an ERROR
//! line with its error; the others are DEBUG lines (and each counts in
//! `courier_dead_letter_write_failures_total`); while the streak lasts, a
//! failure at least `REMIND_EVERY` after the last ERROR line is one again,
//! with the streak's tally, so that a long streak still shows in a log
//! kept for a short while; and the first write that succeeds ends the
//! streak with one line giving its tally. `/v1/destinations` shows an
//! open streak.
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
    /// An ERROR line: the streak starts.
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
}

#[derive(Default)]
pub struct SinkStreak {
    open: Option<Open>,
}

struct Open {
    since: Instant,
    failures: u64,
    last_loud: Instant,
}

impl SinkStreak {
    /// A write failed (it is tried again).
    pub fn failed(&mut self, now: Instant) -> Say {
        let Some(open) = &mut self.open else {
            self.open = Some(Open {
                since: now,
                failures: 1,
                last_loud: now,
            });
            return Say::Loud;
        };
        open.failures += 1;
        if now.duration_since(open.last_loud) >= REMIND_EVERY {
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

    /// The streak so far, while one lasts.
    pub fn open(&self, now: Instant) -> Option<Tally> {
        self.open.as_ref().map(|open| open.tally(now))
    }
}

impl Open {
    fn tally(&self, now: Instant) -> Tally {
        Tally {
            failures: self.failures,
            lasted: now.duration_since(self.since),
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
        assert_eq!(s.open(t0), None);
        assert_eq!(s.failed(t0), Say::Loud);
        for i in 1..200 {
            assert_eq!(s.failed(t0 + Duration::from_millis(i * 50)), Say::Quiet);
        }
        let tally = Tally {
            failures: 200,
            lasted: secs(12),
        };
        assert_eq!(s.open(t0 + secs(12)), Some(tally), "shown while it lasts");
        assert_eq!(s.written(t0 + secs(12)), Some(tally));
        assert_eq!(s.open(t0 + secs(12)), None);
        assert_eq!(s.written(t0 + secs(13)), None, "the streak ended once");
        assert_eq!(s.failed(t0 + secs(14)), Say::Loud, "a new streak");
    }

    #[test]
    fn a_long_streak_reminds_at_most_once_per_interval() {
        let t0 = Instant::now();
        let mut s = SinkStreak::default();
        s.failed(t0);
        let mut reminders = Vec::new();
        // A failure every 5 s for 3 minutes.
        for i in 1..=36 {
            let at = secs(5 * i);
            if let Say::Remind(t) = s.failed(t0 + at) {
                reminders.push((at, t.failures));
            }
        }
        assert_eq!(
            reminders,
            vec![(secs(60), 13), (secs(120), 25), (secs(180), 37)]
        );
    }
}
