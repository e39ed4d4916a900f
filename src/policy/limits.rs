//! When delivery of an event ends: `max_attempts` or `event_ttl` since
//! accept, whichever comes first (Event Grid's rule). An event whose next
//! attempt would fall after its TTL expires at the TTL, not at that attempt.

use super::schedule::{Phase, Schedule};
use crate::event::Reason;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_attempts: u32,
    pub ttl: Duration,
}

/// What happens after a failed attempt that may be retried. Times are
/// milliseconds since the Unix epoch, as stored in the journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    RetryAt(u64),
    /// No attempt fits before the TTL: dead-letter at this time.
    ExpireAt(u64),
    DeadLetter(Reason),
}

impl Limits {
    /// `attempts` made so far; `due` the wanted time of the next one.
    pub fn after_failure(&self, attempts: u32, accepted_ms: u64, due_ms: u64) -> Next {
        if attempts >= self.max_attempts {
            return Next::DeadLetter(Reason::MaxDeliveryAttemptsExceeded);
        }
        let deadline = self.deadline(accepted_ms);
        if due_ms >= deadline {
            Next::ExpireAt(deadline)
        } else {
            Next::RetryAt(due_ms)
        }
    }

    pub fn deadline(&self, accepted_ms: u64) -> u64 {
        accepted_ms.saturating_add(self.ttl.as_millis() as u64)
    }

    pub fn expired(&self, accepted_ms: u64, now_ms: u64) -> bool {
        now_ms >= self.deadline(accepted_ms)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct PlannedAttempt {
    pub attempt: u32,
    pub delay: Duration,
    pub at: Duration,
    pub phase: Phase,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    MaxAttempts,
    EventTtl,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::MaxAttempts => "max_attempts",
            EndReason::EventTtl => "event_ttl",
        }
    }
}

/// The retry plan of an event that never succeeds, without jitter.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub attempts: Vec<PlannedAttempt>,
    pub ends_after: u32,
    pub ends_at: Duration,
    pub reason: EndReason,
}

impl Plan {
    pub fn compute(schedule: &Schedule, limits: &Limits) -> Plan {
        Plan::with_floor(schedule, limits, Duration::ZERO)
    }

    /// The plan when every attempt fails with an answer whose minimum delay
    /// is `floor` (docs/delivery.md: a retry waits the larger of the two).
    pub fn with_floor(schedule: &Schedule, limits: &Limits, floor: Duration) -> Plan {
        let mut attempts = vec![PlannedAttempt {
            attempt: 1,
            delay: Duration::ZERO,
            at: Duration::ZERO,
            phase: schedule.phase(1),
        }];
        let mut at = Duration::ZERO;
        for attempt in 2..=limits.max_attempts {
            let delay = schedule.delay_before(attempt).max(floor);
            if at + delay >= limits.ttl {
                return Plan {
                    ends_after: attempt - 1,
                    ends_at: limits.ttl,
                    reason: EndReason::EventTtl,
                    attempts,
                };
            }
            at += delay;
            attempts.push(PlannedAttempt {
                attempt,
                delay,
                at,
                phase: schedule.phase(attempt),
            });
        }
        Plan {
            ends_after: limits.max_attempts,
            ends_at: at,
            reason: EndReason::MaxAttempts,
            attempts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;

    #[test]
    fn a_reason_reads_back_from_its_name() {
        for r in Reason::ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(r));
        }
        assert_eq!(Reason::parse("timetoliveexceeded"), None);
    }

    #[test]
    fn reference_000_ttl_30m_max_10_ends_after_6_attempts_at_30m() {
        let limits = Limits {
            max_attempts: 10,
            ttl: Duration::from_secs(30 * 60),
        };
        let plan = Plan::compute(&Schedule::EventGrid, &limits);
        let at: Vec<u64> = plan.attempts.iter().map(|a| a.at.as_secs()).collect();
        assert_eq!(at, [0, 10, 40, 100, 400, 1000]);
        assert_eq!(
            (plan.ends_after, plan.ends_at.as_secs(), plan.reason),
            (6, 1800, EndReason::EventTtl)
        );
    }

    #[test]
    fn max_attempts_ends_right_after_the_last_attempt() {
        let limits = Limits {
            max_attempts: 3,
            ttl: Duration::from_secs(86_400),
        };
        let plan = Plan::compute(&Schedule::EventGrid, &limits);
        assert_eq!(
            (plan.ends_after, plan.ends_at.as_secs(), plan.reason),
            (3, 40, EndReason::MaxAttempts)
        );
        let one = Plan::compute(
            &Schedule::EventGrid,
            &Limits {
                max_attempts: 1,
                ..limits
            },
        );
        assert_eq!(
            (one.attempts.len(), one.ends_after, one.ends_at),
            (1, 1, Duration::ZERO)
        );
    }

    #[test]
    fn default_policy_makes_30_attempts_or_stops_at_24h() {
        let limits = Limits {
            max_attempts: 30,
            ttl: Duration::from_secs(86_400),
        };
        let plan = Plan::compute(&Schedule::EventGrid, &limits);
        // 0, 10s, 40s, 1m40s, 6m40s, 16m40s, 46m40s, 1h46m40s, 4h46m40s, 10h46m40s, 22h46m40s
        assert_eq!(plan.ends_after, 11);
        assert_eq!(plan.attempts.last().map(|a| a.at.as_secs()), Some(82_000));
        assert_eq!(plan.reason, EndReason::EventTtl);
    }

    /// What `courier schedule --json` prints for the SNS documentation's
    /// example policy: one row per attempt with its phase.
    #[test]
    fn sns_reference_policy_plan_shows_the_four_phases() {
        use crate::policy::sns::SnsPolicy;
        let policy = SnsPolicy::reference();
        let limits = Limits {
            max_attempts: policy.max_attempts(),
            ttl: Duration::from_secs(86_400),
        };
        let plan = Plan::compute(&Schedule::Sns(policy), &limits);
        assert_eq!(plan.attempts.len(), 51);
        let rows: Vec<(u32, u64, u64, &str)> = plan
            .attempts
            .iter()
            .map(|a| {
                (
                    a.attempt,
                    a.delay.as_secs(),
                    a.at.as_secs(),
                    a.phase.as_str(),
                )
            })
            .collect();
        assert_eq!(
            rows[..17],
            [
                (1, 0, 0, "no-delay"),
                (2, 0, 0, "no-delay"),
                (3, 0, 0, "no-delay"),
                (4, 0, 0, "no-delay"),
                (5, 1, 1, "pre-backoff"),
                (6, 1, 2, "pre-backoff"),
                (7, 1, 3, "backoff"),
                (8, 1, 4, "backoff"),
                (9, 1, 5, "backoff"),
                (10, 1, 6, "backoff"),
                (11, 2, 8, "backoff"),
                (12, 2, 10, "backoff"),
                (13, 5, 15, "backoff"),
                (14, 10, 25, "backoff"),
                (15, 24, 49, "backoff"),
                (16, 60, 109, "backoff"),
                (17, 60, 169, "post-backoff"),
            ]
        );
        assert!(
            rows[16..]
                .iter()
                .all(|r| r.1 == 60 && r.3 == "post-backoff")
        );
        assert_eq!(rows[50], (51, 60, 2209, "post-backoff"));
        assert_eq!(
            (plan.ends_after, plan.ends_at.as_secs(), plan.reason),
            (51, 2209, EndReason::MaxAttempts)
        );
    }

    #[test]
    fn sns_plan_stops_at_a_short_ttl_and_exponential_plans_too() {
        use crate::policy::sns::SnsPolicy;
        let sns = Plan::compute(
            &Schedule::Sns(SnsPolicy::default()),
            &Limits {
                max_attempts: 4,
                ttl: Duration::from_secs(60),
            },
        );
        let at: Vec<u64> = sns.attempts.iter().map(|a| a.at.as_secs()).collect();
        assert_eq!(at, [0, 20, 40]);
        assert_eq!((sns.ends_after, sns.reason), (3, EndReason::EventTtl));
        let exp = Plan::compute(
            &Schedule::Exponential {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(600),
                multiplier: 2.0,
            },
            &Limits {
                max_attempts: 30,
                ttl: Duration::from_secs(3600),
            },
        );
        // 0, 1, 3, 7, ..., 1023 (attempt 11), 1623, 2223, 2823, 3423, then 4023 > 1h.
        let at: Vec<u64> = exp.attempts.iter().map(|a| a.at.as_secs()).collect();
        assert_eq!(at[10], 1023);
        assert_eq!(at.last(), Some(&3423));
        assert_eq!((exp.ends_after, exp.reason), (15, EndReason::EventTtl));
        assert!(
            exp.attempts
                .iter()
                .all(|a| a.phase.as_str() == "exponential")
        );
    }

    #[test]
    fn after_failure_applies_whichever_limit_comes_first() {
        let l = Limits {
            max_attempts: 3,
            ttl: Duration::from_secs(30 * 60),
        };
        let accepted = 1_000_000;
        assert_eq!(
            l.after_failure(1, accepted, accepted + MIN),
            Next::RetryAt(accepted + MIN)
        );
        assert_eq!(
            l.after_failure(3, accepted, accepted + MIN),
            Next::DeadLetter(Reason::MaxDeliveryAttemptsExceeded)
        );
        assert_eq!(
            l.after_failure(2, accepted, accepted + 31 * MIN),
            Next::ExpireAt(accepted + 30 * MIN)
        );
        assert_eq!(
            l.after_failure(2, accepted, accepted + 30 * MIN),
            Next::ExpireAt(accepted + 30 * MIN)
        );
        assert!(!l.expired(accepted, accepted + 30 * MIN - 1));
        assert!(l.expired(accepted, accepted + 30 * MIN));
    }
}
