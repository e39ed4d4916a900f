//! What history records of an event: its attempts and how it ended, and
//! the compact encoding of an event's attempts that a row keeps (one blob,
//! about 8 bytes an attempt, so that a million delivered events fit the
//! 200-bytes-an-event budget without a row per attempt).

// An outcome's code in the encoding is its place in `Outcome::ALL`
// (declaration order): new outcomes go at the end of the enum, so that
// stored codes keep their meaning (a test pins them).
use crate::event::{Outcome, Reason};

/// One attempt as history shows it (docs/history.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// 1, 2, ... (after those a handing-off courier made).
    pub number: u32,
    pub at_ms: u64,
    pub took_ms: u32,
    pub status: Option<u16>,
    pub outcome: Outcome,
    /// Answered after `timeout`, within `late_answer_window`.
    pub late: bool,
}

/// A change in an event's delivery, recorded with the journal change that
/// makes it durable.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// An attempt that failed; the event waits for `next_due_ms`.
    Attempted {
        attempt: Attempt,
        next_due_ms: u64,
    },
    Delivered {
        attempt: Attempt,
    },
    /// A late success to the attempt `number`, which had timed out.
    DeliveredLate {
        number: u32,
        status: u16,
        at_ms: u64,
    },
    DeadLettered {
        reason: Reason,
        at_ms: u64,
        /// The attempt that ended it, if one did (not a TTL's expiry).
        attempt: Option<Attempt>,
    },
    Dropped {
        reason: Reason,
        at_ms: u64,
        attempt: Option<Attempt>,
    },
    /// Written to object storage at shutdown, for another courier.
    HandedOff {
        at_ms: u64,
    },
}

/// Where an event's delivery stands, as stored. `in_flight` is never
/// stored: it is read from the dispatcher when asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Pending = 0,
    Delivered = 1,
    DeadLettered = 2,
    Dropped = 3,
    HandedOff = 4,
}

impl State {
    pub const ALL: [State; 5] = [
        State::Pending,
        State::Delivered,
        State::DeadLettered,
        State::Dropped,
        State::HandedOff,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Delivered => "delivered",
            State::DeadLettered => "dead_lettered",
            State::Dropped => "dropped",
            State::HandedOff => "handed_off",
        }
    }

    pub fn from_code(code: i64) -> State {
        State::ALL
            .into_iter()
            .find(|s| *s as i64 == code)
            .unwrap_or(State::Pending)
    }
}

const LATE: u8 = 0x80;

pub fn reason_code(r: Reason) -> i64 {
    Reason::ALL
        .iter()
        .position(|x| *x == r)
        .map_or(0, |i| i as i64 + 1)
}

pub fn reason_of(code: i64) -> Option<Reason> {
    usize::try_from(code - 1)
        .ok()
        .and_then(|i| Reason::ALL.get(i).copied())
}

/// Appends `a` to `buf`: number, start after `accepted_ms`, duration and
/// status as varints, then the outcome's code with the late flag.
pub fn encode(buf: &mut Vec<u8>, accepted_ms: u64, a: &Attempt) {
    varint(buf, u64::from(a.number));
    varint(buf, a.at_ms.saturating_sub(accepted_ms));
    varint(buf, u64::from(a.took_ms));
    varint(buf, a.status.map_or(0, u64::from));
    let code = Outcome::ALL
        .iter()
        .position(|o| *o == a.outcome)
        .unwrap_or(0) as u8;
    buf.push(code | if a.late { LATE } else { 0 });
}

/// The attempts of a row; a damaged tail (never written by courier) ends
/// the list rather than failing the answer.
pub fn decode(mut buf: &[u8], accepted_ms: u64) -> Vec<Attempt> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let mut next = || read_varint(&mut buf);
        let (Some(number), Some(after), Some(took), Some(status)) =
            (next(), next(), next(), next())
        else {
            break;
        };
        let Some((&code, rest)) = buf.split_first() else {
            break;
        };
        buf = rest;
        let Some(&outcome) = Outcome::ALL.get(usize::from(code & !LATE)) else {
            break;
        };
        out.push(Attempt {
            number: u32::try_from(number).unwrap_or(u32::MAX),
            at_ms: accepted_ms.saturating_add(after),
            took_ms: u32::try_from(took).unwrap_or(u32::MAX),
            status: u16::try_from(status).ok().filter(|s| *s != 0),
            outcome,
            late: code & LATE != 0,
        });
    }
    out
}

/// `attempts` with `a` in its number's place: recording the same attempt
/// twice (a commit retried after a failure) keeps one.
pub fn with_attempt(mut attempts: Vec<Attempt>, a: Attempt) -> Vec<Attempt> {
    attempts.retain(|x| x.number != a.number);
    let at = attempts.partition_point(|x| x.number < a.number);
    attempts.insert(at, a);
    attempts
}

pub fn encode_all(accepted_ms: u64, attempts: &[Attempt]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(attempts.len() * 10);
    for a in attempts {
        encode(&mut buf, accepted_ms, a);
    }
    buf
}

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn read_varint(buf: &mut &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(number: u32, outcome: Outcome, status: Option<u16>) -> Attempt {
        Attempt {
            number,
            at_ms: 1_700_000_000_000 + u64::from(number) * 10_000,
            took_ms: 12 * number,
            status,
            outcome,
            late: false,
        }
    }

    #[test]
    fn attempts_round_trip_for_every_outcome_with_and_without_status() {
        let accepted = 1_700_000_000_000;
        let mut all = Vec::new();
        for (i, o) in Outcome::ALL.iter().enumerate() {
            let mut a = attempt(i as u32 + 1, *o, (i % 2 == 0).then_some(500 + i as u16));
            a.late = i % 3 == 0;
            all.push(a);
        }
        all.push(Attempt {
            number: u32::MAX,
            at_ms: u64::MAX,
            took_ms: u32::MAX,
            status: Some(u16::MAX),
            outcome: Outcome::Delivered,
            late: true,
        });
        let buf = encode_all(accepted, &all);
        assert_eq!(decode(&buf, accepted), all);
    }

    #[test]
    fn stored_outcome_codes_keep_their_meaning() {
        let code = |o: Outcome| Outcome::ALL.iter().position(|x| *x == o);
        assert_eq!(code(Outcome::Delivered), Some(0));
        assert_eq!(code(Outcome::TimedOut), Some(7));
        assert_eq!(code(Outcome::Probation), Some(13));
    }

    #[test]
    fn a_delivered_attempt_takes_a_few_bytes() {
        let a = attempt(1, Outcome::Delivered, Some(200));
        let buf = encode_all(1_700_000_000_000 + 3, &[a]);
        assert!(buf.len() <= 10, "{} bytes", buf.len());
    }

    #[test]
    fn a_damaged_tail_ends_the_list() {
        let accepted = 5;
        let good = attempt(1, Outcome::Failed, Some(500));
        let mut buf = encode_all(accepted, std::slice::from_ref(&good));
        buf.extend_from_slice(&[0x81, 0x80]);
        assert_eq!(decode(&buf, accepted), vec![good.clone()]);
        buf.truncate(buf.len() - 2);
        buf.push(2);
        buf.push(0);
        buf.push(0);
        buf.push(0);
        buf.push(99);
        assert_eq!(
            decode(&buf, accepted),
            vec![good],
            "an unknown outcome code"
        );
    }

    #[test]
    fn the_same_attempt_recorded_twice_is_kept_once_in_order() {
        let one = attempt(1, Outcome::Failed, Some(500));
        let two = attempt(2, Outcome::Delivered, Some(200));
        let list = with_attempt(with_attempt(Vec::new(), two.clone()), one.clone());
        assert_eq!(list, vec![one.clone(), two.clone()]);
        let mut again = two.clone();
        again.took_ms = 99;
        assert_eq!(with_attempt(list, again.clone()), vec![one, again]);
    }

    #[test]
    fn states_and_reasons_keep_their_codes() {
        for s in State::ALL {
            assert_eq!(State::from_code(s as i64), s);
        }
        assert_eq!(State::DeadLettered.as_str(), "dead_lettered");
        for r in Reason::ALL {
            assert_eq!(reason_of(reason_code(r)), Some(r));
        }
        assert_eq!(reason_of(0), None);
    }
}
