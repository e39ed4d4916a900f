//! The history API (docs/history.md): "where is my webhook?" by id, and pages of
//! events newest first. Stored records say what the journal made durable;
//! whether an event is in an attempt right now, and what holds a pending
//! one, come from its destination's dispatcher when asked, so the answer is
//! current.

use super::Admin;
use super::api::{AttemptView, Delivery, EventAnswer, EventItem, EventPage};
use super::dead_letters::{Answer, ApiError, bad, query, time_ms, to_json};
use crate::clock;
use crate::event::endpoint;
use crate::history::{Filter, Record, State};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::Uri;
use std::sync::Arc;

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// States a listing may ask for: the stored ones and `in_flight`.
const STATES: [&str; 6] = [
    "pending",
    "in_flight",
    "delivered",
    "dead_lettered",
    "dropped",
    "handed_off",
];

/// A record's state now, with what the dispatcher knows.
struct Live {
    state: &'static str,
    next_attempt_at: Option<u64>,
    held_by: Option<&'static str>,
}

fn cursor(seq: i64) -> String {
    URL_SAFE_NO_PAD.encode(seq.to_be_bytes())
}

fn parse_cursor(s: &str) -> Result<i64, ApiError> {
    URL_SAFE_NO_PAD
        .decode(s)
        .ok()
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(i64::from_be_bytes)
        .ok_or_else(|| {
            bad(format!(
                "`after` is `{s}`, which is not a cursor this API gave"
            ))
        })
}

impl Admin {
    fn history_reader(&self) -> Result<Arc<crate::history::Reader>, ApiError> {
        self.history.clone().ok_or_else(|| {
            ApiError::NotFound(
                "event history is off (history.retain: 0s): courier keeps no record of events"
                    .into(),
            )
        })
    }

    fn live(&self, r: &Record) -> Live {
        let stored = Live {
            state: r.state.as_str(),
            next_attempt_at: None,
            held_by: None,
        };
        if r.state != State::Pending {
            return stored;
        }
        let health = self.fleet.health(&r.destination);
        if health.as_ref().is_some_and(|h| h.is_attempting(r.seq)) {
            return Live {
                state: "in_flight",
                ..stored
            };
        }
        // Behind its ordering lane's head: no attempt is due until it leaves.
        let behind = self
            .journal
            .destination(&r.destination)
            .is_some_and(|s| !s.may_start(r.seq));
        if behind {
            return Live {
                state: "pending",
                next_attempt_at: None,
                held_by: Some("ordering"),
            };
        }
        let due = r.next_due_ms.unwrap_or(r.accepted_ms);
        let held_by = health
            .and_then(|h| h.held_by())
            .or((due > clock::now_ms()).then_some("schedule"));
        Live {
            state: "pending",
            next_attempt_at: Some(due),
            held_by,
        }
    }

    pub(super) async fn show_event(&self, id: &str, uri: &Uri) -> Answer {
        // The id as the app sent it: clients percent-encode it in the path
        // (an id may hold `/`, `?` or a space), as for a dead letter's.
        let id = &percent_encoding::percent_decode_str(id)
            .decode_utf8_lossy()
            .into_owned();
        let pairs = query(uri, &["destination"])?;
        let destination = pairs.into_iter().next().map(|(_, v)| v);
        let reader = self.history_reader()?;
        let find = |reader: Arc<crate::history::Reader>| {
            let (id, destination) = (id.to_string(), destination.clone());
            tokio::task::spawn_blocking(move || reader.find(&id, destination.as_deref()))
        };
        let mut found = find(reader.clone())
            .await?
            .map_err(|e| ApiError::Read(e.to_string()))?;
        if found.is_empty() {
            // Accepted within the indexer's lag: have it record the log.
            if self.journal.index_all().await.is_ok() {
                found = find(reader)
                    .await?
                    .map_err(|e| ApiError::Read(e.to_string()))?;
            }
        }
        if found.is_empty() {
            let at = destination.map_or(String::new(), |d| format!(" at destination `{d}`"));
            return Err(ApiError::NotFound(format!(
                "courier knows no event `{id}`{at}: it was never accepted here, or its history is past history.retain or history.max_bytes"
            )));
        }
        let deliveries = found.iter().map(|r| self.delivery(r)).collect();
        to_json(&EventAnswer {
            id: id.to_string(),
            deliveries,
        })
    }

    fn delivery(&self, r: &Record) -> Delivery {
        let live = self.live(r);
        Delivery {
            destination: r.destination.clone(),
            state: live.state.to_string(),
            accepted_at: clock::rfc3339(r.accepted_ms),
            attempts: r
                .attempts
                .iter()
                .map(|a| AttemptView {
                    attempt: a.number,
                    at: clock::rfc3339(a.at_ms),
                    duration_ms: a.took_ms,
                    status: a.status,
                    outcome: a.outcome.as_str().to_string(),
                    late: a.late,
                })
                .collect(),
            attempts_before: (r.prior > 0).then_some(r.prior),
            next_attempt_at: live.next_attempt_at.map(clock::rfc3339),
            held_by: live.held_by.map(str::to_string),
            finished_at: r.finished_ms.map(clock::rfc3339),
            reason: r.reason.map(|x| x.as_str().to_string()),
            endpoint: r.endpoint.clone(),
        }
    }

    pub(super) async fn list_events(self: &Arc<Self>, uri: &Uri) -> Answer {
        let pairs = query(
            uri,
            &[
                "destination",
                "state",
                "since",
                "until",
                "limit",
                "after",
                "endpoint",
            ],
        )?;
        let mut filter = Filter::default();
        let mut wanted: Option<&'static str> = None;
        let mut limit = DEFAULT_LIMIT;
        let mut after = None;
        for (k, v) in &pairs {
            match k.as_str() {
                "destination" => filter.destination = Some(v.clone()),
                "state" => {
                    let Some(s) = STATES.iter().find(|s| **s == v) else {
                        return Err(bad(format!(
                            "`state` is `{v}`: expected one of {}",
                            STATES.join(", ")
                        )));
                    };
                    wanted = Some(s);
                    filter.state = State::ALL
                        .into_iter()
                        .find(|st| st.as_str() == *s)
                        .or(Some(State::Pending));
                }
                "since" => filter.since_ms = Some(time_ms("since", v)?),
                "until" => filter.until_ms = Some(time_ms("until", v)?),
                // Its origin, from any URL of it, as history keeps it.
                "endpoint" => {
                    filter.endpoint = Some(endpoint::origin(v).ok_or_else(|| {
                        bad(format!(
                            "`endpoint` is `{v}`: expected an endpoint's origin, scheme://host:port, or any URL of it"
                        ))
                    })?);
                }
                "limit" => {
                    limit = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| {
                            bad(format!("`limit` is `{v}`: expected 1..={MAX_LIMIT}"))
                        })?;
                }
                _ => after = Some(parse_cursor(v)?),
            }
        }
        let reader = self.history_reader()?;
        let admin = self.clone();
        let (records, next) = tokio::task::spawn_blocking(move || {
            // `pending` and `in_flight` are both stored as pending: which
            // one is asked of the dispatcher.
            let keep = |r: &Record| wanted.is_none_or(|w| admin.live(r).state == w);
            reader.page(&filter, after, limit, &keep)
        })
        .await?
        .map_err(|e| ApiError::Read(e.to_string()))?;
        let events = records
            .iter()
            .map(|r| EventItem {
                id: r.id.clone(),
                destination: r.destination.clone(),
                state: self.live(r).state.to_string(),
                attempts: r.prior + r.attempts.len() as u32,
                last_status: r.attempts.last().and_then(|a| a.status),
                last_outcome: r.attempts.last().map(|a| a.outcome.as_str().to_string()),
                accepted_at: clock::rfc3339(r.accepted_ms),
                finished_at: r.finished_ms.map(clock::rfc3339),
                endpoint: r.endpoint.clone(),
            })
            .collect();
        to_json(&EventPage {
            events,
            next: next.map(cursor),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_foreign_ones_are_refused() {
        for seq in [0, 1, 5_000, i64::MAX] {
            assert_eq!(parse_cursor(&cursor(seq)).ok(), Some(seq));
        }
        assert!(parse_cursor("not-a-cursor").is_err());
        assert!(parse_cursor("").is_err());
    }
}
