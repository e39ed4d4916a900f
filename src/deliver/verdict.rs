//! What becomes of each event once an attempt is answered, and the fate a
//! dead letter records: plain functions of the answer, the event and the
//! destination's limits, so that every rule is unit tested without I/O.
//! `settle` carries them out (journal changes, health, the log).

use crate::event::{Fate, StoredEvent};
use crate::event::{Outcome, Reason};
use crate::policy::{Limits, Next, Verdict};

/// One event's end after an attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum End {
    Delete,
    /// Due again at `due_ms`; `in_batch`: it stays in its attempt's batch
    /// (a retry of the whole batch), else it leaves it (it waits for its
    /// TTL or a late answer alone).
    Reschedule {
        due_ms: u64,
        in_batch: bool,
    },
    DeadLetter(Reason),
}

/// What an attempt's answer means for the events it carried.
#[derive(Debug, Clone, Copy)]
pub struct Answered {
    pub verdict: Verdict,
    pub now_ms: u64,
    /// The schedule's next due time for a retriable answer (one for the
    /// whole batch, so that it stays together).
    pub retry_due_ms: u64,
    /// The attempt timed out and may still be answered until then: a last
    /// attempt waits for it instead of being dead-lettered at once.
    pub late_until_ms: Option<u64>,
}

/// The end of an event that had made `attempts` attempts before this one.
pub fn end(answered: &Answered, limits: &Limits, attempts: u32, accepted_ms: u64) -> End {
    let now = answered.now_ms;
    match answered.verdict {
        Verdict::Delivered => End::Delete,
        Verdict::DeadLetter => End::DeadLetter(Reason::NonRetriableStatus),
        Verdict::Refused => End::DeadLetter(Reason::AddressNotAllowed),
        // The receiver asked to be disabled: its events wait (due again at
        // once, for when it is resumed) and expire only at their TTL.
        Verdict::Pause => {
            let deadline = limits.deadline(accepted_ms);
            if now >= deadline {
                End::Reschedule {
                    due_ms: deadline,
                    in_batch: false,
                }
            } else {
                End::Reschedule {
                    due_ms: now,
                    in_batch: true,
                }
            }
        }
        Verdict::Retry { .. } => {
            match limits.after_failure(attempts + 1, accepted_ms, answered.retry_due_ms) {
                Next::RetryAt(due_ms) => End::Reschedule {
                    due_ms,
                    in_batch: true,
                },
                Next::ExpireAt(due_ms) => End::Reschedule {
                    due_ms,
                    in_batch: false,
                },
                Next::DeadLetter(Reason::MaxDeliveryAttemptsExceeded)
                    if let Some(until) = answered.late_until_ms =>
                {
                    End::Reschedule {
                        due_ms: until,
                        in_batch: false,
                    }
                }
                Next::DeadLetter(reason) => End::DeadLetter(reason),
            }
        }
    }
}

/// The fate of an event this attempt dead-letters.
pub fn attempted(
    ev: &StoredEvent,
    reason: Reason,
    outcome: Outcome,
    status: Option<u16>,
    now_ms: u64,
) -> Fate {
    Fate {
        reason,
        attempts: ev.attempts + 1,
        last_outcome: outcome,
        last_status: status,
        last_attempt_ms: Some(now_ms),
        at_ms: now_ms,
    }
}

/// The fate of an event whose attempts were used up before it was taken
/// again: it waited out its last attempt's late-answer window, or a reload
/// lowered `max_attempts`. Its last attempt ended as recorded.
pub fn exhausted(ev: &StoredEvent, now_ms: u64) -> Fate {
    Fate {
        reason: Reason::MaxDeliveryAttemptsExceeded,
        attempts: ev.attempts,
        last_outcome: ev.last_outcome.unwrap_or(Outcome::TimedOut),
        last_status: ev.last_status,
        last_attempt_ms: ev.last_attempt_ms,
        at_ms: now_ms,
    }
}

/// The fate of an event of a `url: per_event` destination that names no
/// endpoint (stored while the destination had a fixed url): no address
/// is allowed for it, and no attempt could change that.
pub fn no_endpoint(ev: &StoredEvent, now_ms: u64) -> Fate {
    Fate {
        reason: Reason::AddressNotAllowed,
        attempts: ev.attempts,
        last_outcome: Outcome::AddressNotAllowed,
        last_status: None,
        last_attempt_ms: ev.last_attempt_ms,
        at_ms: now_ms,
    }
}

/// The fate of an event whose endpoint is disabled (`url: per_event`):
/// it goes to the sink with how its last attempt went, as one whose TTL
/// ran out does (`Probation` when it had none).
pub fn endpoint_disabled(ev: &StoredEvent, now_ms: u64) -> Fate {
    Fate {
        reason: Reason::EndpointDisabled,
        attempts: ev.attempts,
        last_outcome: ev.last_outcome.unwrap_or(Outcome::Probation),
        last_status: ev.last_status,
        last_attempt_ms: ev.last_attempt_ms,
        at_ms: now_ms,
    }
}

/// The fate of an event whose TTL ran out before its next attempt; one
/// that a restart found fated keeps the fate it was given. One held back
/// by probation says so in `lastDeliveryOutcome`, as in Event Grid, as
/// does one never attempted.
pub fn expired(ev: &StoredEvent, on_probation: bool, now_ms: u64) -> Fate {
    ev.fate.clone().unwrap_or(Fate {
        reason: Reason::TimeToLiveExceeded,
        attempts: ev.attempts,
        last_outcome: match ev.last_outcome {
            Some(o) if !on_probation => o,
            _ => Outcome::Probation,
        },
        last_status: ev.last_status,
        last_attempt_ms: ev.last_attempt_ms,
        at_ms: now_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::NewEvent;
    use std::time::Duration;

    const NOW: u64 = 1_000_000;

    fn limits(max_attempts: u32, ttl_s: u64) -> Limits {
        Limits {
            max_attempts,
            ttl: Duration::from_secs(ttl_s),
        }
    }

    fn answered(verdict: Verdict) -> Answered {
        Answered {
            verdict,
            now_ms: NOW,
            retry_due_ms: NOW + 10_000,
            late_until_ms: None,
        }
    }

    const RETRY: Verdict = Verdict::Retry {
        min_delay: Duration::ZERO,
    };

    fn stored(attempts: u32, last_outcome: Option<Outcome>) -> StoredEvent {
        StoredEvent {
            seq: 7,
            event: NewEvent {
                id: "e".into(),
                destination: "orders".into(),
                method: "POST".into(),
                path: "/".into(),
                headers: Vec::new(),
                body: bytes::Bytes::new(),
                accepted_ms: NOW - 1000,
            },
            attempts,
            next_due_ms: NOW,
            last_outcome,
            last_status: last_outcome.map(|_| 503),
            last_attempt_ms: last_outcome.map(|_| NOW - 500),
            batch: None,
            fate: None,
        }
    }

    #[test]
    fn a_success_deletes_and_a_non_retriable_answer_dead_letters() {
        let l = limits(30, 3600);
        assert_eq!(end(&answered(Verdict::Delivered), &l, 0, NOW), End::Delete);
        assert_eq!(
            end(&answered(Verdict::DeadLetter), &l, 0, NOW),
            End::DeadLetter(Reason::NonRetriableStatus)
        );
    }

    #[test]
    fn a_retriable_answer_reschedules_in_its_batch_at_the_schedules_time() {
        let l = limits(30, 3600);
        assert_eq!(
            end(&answered(RETRY), &l, 3, NOW),
            End::Reschedule {
                due_ms: NOW + 10_000,
                in_batch: true
            }
        );
    }

    #[test]
    fn a_retry_past_the_ttl_waits_for_the_deadline_out_of_its_batch() {
        // Accepted 1 s ago with a TTL of 5 s: the retry 10 s ahead is too late.
        let l = limits(30, 5);
        assert_eq!(
            end(&answered(RETRY), &l, 0, NOW - 1000),
            End::Reschedule {
                due_ms: NOW + 4000,
                in_batch: false
            }
        );
    }

    #[test]
    fn the_last_attempt_dead_letters_unless_a_late_answer_may_still_come() {
        let l = limits(3, 3600);
        assert_eq!(
            end(&answered(RETRY), &l, 2, NOW),
            End::DeadLetter(Reason::MaxDeliveryAttemptsExceeded)
        );
        let late = Answered {
            late_until_ms: Some(NOW + 30_000),
            ..answered(RETRY)
        };
        assert_eq!(
            end(&late, &l, 2, NOW),
            End::Reschedule {
                due_ms: NOW + 30_000,
                in_batch: false
            }
        );
        // Not the last attempt: the late answer changes nothing.
        assert_eq!(
            end(&late, &l, 1, NOW),
            End::Reschedule {
                due_ms: NOW + 10_000,
                in_batch: true
            }
        );
    }

    #[test]
    fn a_410_holds_events_due_at_once_until_their_ttl() {
        let l = limits(3, 5);
        assert_eq!(
            end(&answered(Verdict::Pause), &l, 2, NOW - 1000),
            End::Reschedule {
                due_ms: NOW,
                in_batch: true
            },
            "not dead-lettered for its attempts: a pause is not the endpoint's failure"
        );
        assert_eq!(
            end(&answered(Verdict::Pause), &l, 0, NOW - 6000),
            End::Reschedule {
                due_ms: NOW - 1000,
                in_batch: false
            },
            "past its TTL: due at its deadline, for the sink"
        );
    }

    #[test]
    fn fates_tell_the_attempt_that_ended_the_event() {
        let ev = stored(2, Some(Outcome::Busy));
        let f = attempted(
            &ev,
            Reason::NonRetriableStatus,
            Outcome::BadRequest,
            Some(400),
            NOW,
        );
        assert_eq!(
            (f.attempts, f.last_outcome, f.last_status, f.last_attempt_ms),
            (3, Outcome::BadRequest, Some(400), Some(NOW))
        );
        let f = exhausted(&ev, NOW);
        assert_eq!(
            (f.reason, f.attempts, f.last_outcome, f.last_attempt_ms),
            (
                Reason::MaxDeliveryAttemptsExceeded,
                2,
                Outcome::Busy,
                Some(NOW - 500)
            )
        );
        assert_eq!(
            exhausted(&stored(3, None), NOW).last_outcome,
            Outcome::TimedOut
        );
    }

    #[test]
    fn an_expired_fate_names_probation_when_courier_held_the_event_back() {
        let tried = stored(1, Some(Outcome::Busy));
        assert_eq!(expired(&tried, false, NOW).last_outcome, Outcome::Busy);
        assert_eq!(expired(&tried, true, NOW).last_outcome, Outcome::Probation);
        assert_eq!(
            expired(&stored(0, None), false, NOW).last_outcome,
            Outcome::Probation
        );
        assert_eq!(
            expired(&tried, false, NOW).reason,
            Reason::TimeToLiveExceeded
        );
        let fated = StoredEvent {
            fate: Some(exhausted(&tried, NOW - 5)),
            ..tried
        };
        assert_eq!(
            expired(&fated, true, NOW),
            exhausted(&fated, NOW - 5),
            "a fate decided before a restart is kept"
        );
    }
}
