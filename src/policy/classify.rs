//! Classification of every attempt result (docs/delivery.md, after Event Grid's
//! webhook table): an outcome name for metrics and dead letters, and a verdict
//! with the minimum delay before the next attempt. Retry timing itself is
//! `schedule`'s job; this only says "not before".

use crate::event::Outcome;
use std::ops::RangeInclusive;
use std::time::{Duration, SystemTime};

/// Attempts are counted per outcome.
impl crate::metrics::Fixed for Outcome {
    fn name(self) -> &'static str {
        self.as_str()
    }

    fn ordinal(self) -> usize {
        self as usize
    }
}

impl Outcome {
    /// The name of an HTTP status, whatever the verdict on it.
    pub fn of_status(status: u16) -> Outcome {
        match status {
            200..=204 => Outcome::Delivered,
            400 => Outcome::BadRequest,
            401 => Outcome::Unauthorized,
            403 => Outcome::Forbidden,
            404 => Outcome::NotFound,
            408 => Outcome::TimedOut,
            410 => Outcome::Gone,
            413 => Outcome::PayloadTooLarge,
            429 | 503 => Outcome::Busy,
            _ => Outcome::Failed,
        }
    }
}

/// A failure below HTTP: no status to classify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// No answer within the per-attempt timeout.
    TimedOut,
    /// Connection refused, reset, or closed before a full answer.
    Socket,
    /// The host name did not resolve.
    Resolution,
    /// The TLS handshake or certificate check failed.
    Tls,
    /// The address guard refused every address of the endpoint: nothing
    /// was sent.
    AddressRefused,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Delivered,
    /// Try again, not sooner than `min_delay`.
    Retry {
        min_delay: Duration,
    },
    /// Never retried: dead-letter now.
    DeadLetter,
    /// The endpoint's address is refused (the address guard): dead-letter
    /// now, with that reason.
    Refused,
    /// The receiver asked to be disabled (410): pause the destination.
    Pause,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classified {
    pub outcome: Outcome,
    pub verdict: Verdict,
}

/// Codes as configured: a single code or an inclusive range (`5xx`, `500-599`).
pub type Codes = RangeInclusive<u16>;

/// The per-destination status table: docs/delivery.md's defaults with the
/// `status.*` overrides applied.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusPolicy {
    /// Extra success codes; 200–204 always succeed.
    pub success: Vec<Codes>,
    /// Codes dead-lettered at once; replaces the default set when configured.
    pub no_retry: Vec<Codes>,
    /// Minimum delays by code; these take precedence over the defaults.
    pub min_delay: Vec<(Codes, Duration)>,
}

pub const DEFAULT_NO_RETRY: [u16; 5] = [400, 401, 403, 404, 413];

/// One row of `StatusPolicy::floors`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Floor {
    /// The answers it covers: `503`, `500-599`, `timeout`, ...
    pub answers: String,
    pub min_delay: Duration,
}
/// Minimum delay after a timeout, a generic failure, or a 429 without Retry-After.
pub const DEFAULT_MIN_DELAY: Duration = Duration::from_secs(10);
/// Server hints beyond this are treated as this: a broken clock or a typo in
/// a Retry-After header must not park events for weeks.
pub const RETRY_AFTER_CAP: Duration = Duration::from_secs(24 * 3600);

impl Default for StatusPolicy {
    fn default() -> Self {
        StatusPolicy {
            success: Vec::new(),
            no_retry: DEFAULT_NO_RETRY.iter().map(|&c| c..=c).collect(),
            min_delay: Vec::new(),
        }
    }
}

impl StatusPolicy {
    pub fn classify_status(&self, status: u16, retry_after: Option<Duration>) -> Classified {
        let outcome = Outcome::of_status(status);
        let verdict = if (200..=204).contains(&status) || matches(&self.success, status) {
            return Classified {
                outcome: Outcome::Delivered,
                verdict: Verdict::Delivered,
            };
        } else if matches(&self.no_retry, status) {
            Verdict::DeadLetter
        } else if status == 410 {
            Verdict::Pause
        } else {
            Verdict::Retry {
                min_delay: self.min_delay_for(status, retry_after),
            }
        };
        Classified { outcome, verdict }
    }

    fn min_delay_for(&self, status: u16, retry_after: Option<Duration>) -> Duration {
        let configured = self
            .min_delay
            .iter()
            .find(|(codes, _)| codes.contains(&status))
            .map(|(_, d)| *d);
        let base = configured.unwrap_or(match status {
            408 => Duration::from_secs(120),
            503 => Duration::from_secs(30),
            // 429 without a hint waits 10s; with one, the hint alone decides.
            429 if retry_after.is_some() => Duration::ZERO,
            _ => DEFAULT_MIN_DELAY,
        });
        base.max(retry_after.unwrap_or_default())
    }

    /// The least wait before a retry for each kind of answer that is
    /// retried (a Retry-After can only lengthen it): the configured ranges,
    /// then the defaults they leave in force. Connection, DNS and TLS
    /// failures have none, so they follow the schedule alone.
    pub fn floors(&self) -> Vec<Floor> {
        let configured = |code: u16| self.min_delay.iter().any(|(c, _)| c.contains(&code));
        let retried = |code: u16| {
            !(200..=204).contains(&code)
                && !matches(&self.success, code)
                && !matches(&self.no_retry, code)
                && code != 410
        };
        let mut out: Vec<Floor> = self
            .min_delay
            .iter()
            .map(|(codes, d)| Floor {
                answers: if codes.start() == codes.end() {
                    codes.start().to_string()
                } else {
                    format!("{}-{}", codes.start(), codes.end())
                },
                min_delay: *d,
            })
            .collect();
        for (code, answers) in [(408, "408"), (429, "429 without Retry-After"), (503, "503")] {
            if retried(code) && !configured(code) {
                out.push(Floor {
                    answers: answers.into(),
                    min_delay: self.min_delay_for(code, None),
                });
            }
        }
        let by_default =
            |code: u16| retried(code) && !configured(code) && ![408, 429, 503].contains(&code);
        if (100..=599).any(by_default) {
            out.push(Floor {
                answers: "other statuses".into(),
                min_delay: DEFAULT_MIN_DELAY,
            });
        }
        out.push(Floor {
            answers: "timeout".into(),
            min_delay: DEFAULT_MIN_DELAY,
        });
        out
    }

    pub fn classify_transport(&self, error: Transport) -> Classified {
        let retry = |min_delay| Verdict::Retry { min_delay };
        let (outcome, verdict) = match error {
            Transport::TimedOut => (Outcome::TimedOut, retry(DEFAULT_MIN_DELAY)),
            Transport::Socket => (Outcome::SocketError, retry(Duration::ZERO)),
            Transport::Resolution => (Outcome::ResolutionError, retry(Duration::ZERO)),
            Transport::Tls => (Outcome::TlsError, retry(Duration::ZERO)),
            Transport::AddressRefused => (Outcome::AddressNotAllowed, Verdict::Refused),
        };
        Classified { outcome, verdict }
    }
}

fn matches(set: &[Codes], status: u16) -> bool {
    set.iter().any(|c| c.contains(&status))
}

/// `Retry-After` as delay-seconds or an HTTP date (RFC 9110 §10.2.3), capped
/// at [`RETRY_AFTER_CAP`]. Garbage and dates in the past give `None`/zero.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    let d = if let Ok(secs) = v.parse::<u64>() {
        Duration::from_secs(secs)
    } else {
        let at = httpdate::parse_http_date(v).ok()?;
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(d.min(RETRY_AFTER_CAP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_name_each_minimum_in_force() {
        let rows = |p: &StatusPolicy| -> Vec<(String, u64)> {
            p.floors()
                .into_iter()
                .map(|f| (f.answers, f.min_delay.as_secs()))
                .collect()
        };
        let owned = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|(a, s)| (a.to_string(), *s)).collect()
        };
        assert_eq!(
            rows(&StatusPolicy::default()),
            owned(&[
                ("408", 120),
                ("429 without Retry-After", 10),
                ("503", 30),
                ("other statuses", 10),
                ("timeout", 10)
            ])
        );
        // A configured range covers the defaults inside it.
        let p = StatusPolicy {
            min_delay: vec![
                (503..=503, Duration::from_secs(1)),
                (100..=599, Duration::from_secs(2)),
            ],
            ..StatusPolicy::default()
        };
        assert_eq!(
            rows(&p),
            owned(&[("503", 1), ("100-599", 2), ("timeout", 10)])
        );
        // A status never retried has no row.
        let p = StatusPolicy {
            no_retry: vec![408..=408, 429..=429],
            ..StatusPolicy::default()
        };
        assert_eq!(
            rows(&p),
            owned(&[("503", 30), ("other statuses", 10), ("timeout", 10)])
        );
    }

    fn retry(secs: u64) -> Verdict {
        Verdict::Retry {
            min_delay: Duration::from_secs(secs),
        }
    }

    #[test]
    fn every_row_of_the_default_table() {
        let p = StatusPolicy::default();
        let rows: [(u16, Outcome, Verdict); 17] = [
            (200, Outcome::Delivered, Verdict::Delivered),
            (201, Outcome::Delivered, Verdict::Delivered),
            (202, Outcome::Delivered, Verdict::Delivered),
            (203, Outcome::Delivered, Verdict::Delivered),
            (204, Outcome::Delivered, Verdict::Delivered),
            (205, Outcome::Failed, retry(10)),
            (400, Outcome::BadRequest, Verdict::DeadLetter),
            (401, Outcome::Unauthorized, Verdict::DeadLetter),
            (403, Outcome::Forbidden, Verdict::DeadLetter),
            (404, Outcome::NotFound, Verdict::DeadLetter),
            (410, Outcome::Gone, Verdict::Pause),
            (413, Outcome::PayloadTooLarge, Verdict::DeadLetter),
            (408, Outcome::TimedOut, retry(120)),
            (429, Outcome::Busy, retry(10)),
            (503, Outcome::Busy, retry(30)),
            (500, Outcome::Failed, retry(10)),
            (302, Outcome::Failed, retry(10)),
        ];
        for (status, outcome, verdict) in rows {
            assert_eq!(
                p.classify_status(status, None),
                Classified { outcome, verdict },
                "{status}"
            );
        }
    }

    #[test]
    fn transport_errors_retry() {
        let p = StatusPolicy::default();
        assert_eq!(
            p.classify_transport(Transport::TimedOut),
            Classified {
                outcome: Outcome::TimedOut,
                verdict: retry(10)
            }
        );
        assert_eq!(
            p.classify_transport(Transport::Socket).outcome,
            Outcome::SocketError
        );
        assert_eq!(
            p.classify_transport(Transport::Resolution).outcome,
            Outcome::ResolutionError
        );
        assert_eq!(
            p.classify_transport(Transport::Tls).outcome,
            Outcome::TlsError
        );
        assert_eq!(p.classify_transport(Transport::Tls).verdict, retry(0));
    }

    #[test]
    fn retry_after_raises_the_minimum() {
        let p = StatusPolicy::default();
        let s = Duration::from_secs;
        assert_eq!(p.classify_status(429, Some(s(1))).verdict, retry(1));
        assert_eq!(p.classify_status(429, Some(s(90))).verdict, retry(90));
        assert_eq!(p.classify_status(503, Some(s(5))).verdict, retry(30));
        assert_eq!(p.classify_status(503, Some(s(45))).verdict, retry(45));
        assert_eq!(p.classify_status(500, Some(s(20))).verdict, retry(20));
    }

    #[test]
    fn overrides_apply_to_codes_and_ranges() {
        let p = StatusPolicy {
            success: vec![409..=409],
            no_retry: vec![400..=400, 500..=599],
            min_delay: vec![
                (503..=503, Duration::from_millis(50)),
                (400..=499, Duration::from_secs(1)),
            ],
        };
        assert_eq!(p.classify_status(409, None).verdict, Verdict::Delivered);
        assert_eq!(
            p.classify_status(404, None),
            Classified {
                outcome: Outcome::NotFound,
                verdict: retry(1)
            }
        );
        assert_eq!(p.classify_status(502, None).verdict, Verdict::DeadLetter);
        assert_eq!(p.classify_status(400, None).verdict, Verdict::DeadLetter);
        let p = StatusPolicy {
            no_retry: vec![],
            min_delay: vec![(503..=503, Duration::from_millis(50))],
            ..p
        };
        assert_eq!(
            p.classify_status(503, None).verdict,
            Verdict::Retry {
                min_delay: Duration::from_millis(50)
            }
        );
    }

    #[test]
    fn retry_after_parses_seconds_dates_and_rejects_garbage() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 3 ", now), Some(Duration::from_secs(3)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            parse_retry_after(&later, now),
            Some(Duration::from_secs(30))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
        assert_eq!(parse_retry_after("99999999999", now), Some(RETRY_AFTER_CAP));
        let far = httpdate::fmt_http_date(now + Duration::from_secs(400 * 86_400));
        assert_eq!(parse_retry_after(&far, now), Some(RETRY_AFTER_CAP));
    }

    #[test]
    fn outcome_names_round_trip() {
        for o in Outcome::ALL {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
        }
    }
}
