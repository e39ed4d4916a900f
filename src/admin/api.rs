//! The admin API's request and answer bodies, one definition for the
//! server (`admin::dead_letters`) and the CLI that calls it
//! (`admin::client`, `courier dead-letters`): a field renamed on one side
//! is renamed on the other, where `json!` and `answer["key"]` drifted
//! apart silently.

use crate::deadletter::Summary;
use serde::{Deserialize, Serialize};

/// One dead letter in a listing, or the head of `show`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetterItem {
    #[serde(flatten)]
    pub summary: Summary,
    pub destination: String,
    pub replayed: bool,
}

/// `GET /v1/dead-letters`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetterPage {
    pub dead_letters: Vec<DeadLetterItem>,
    /// The cursor of the next page; `None` on the last.
    pub next: Option<String>,
    /// Lines of the sink's files that are not records, passed over.
    pub unreadable_lines: u64,
}

/// `POST /v1/dead-letters/replay`: named ids, or `all` (with filters).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    pub destination: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
}

/// A record a replay could not read, by its place in the sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnreadableRecord {
    pub day: String,
    pub offset: u64,
    pub error: String,
}

/// What a replay did (also the body of a replay that stopped part way,
/// beside its `error`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplayAnswer {
    pub destination: String,
    /// The ids replayed, up to a listed number (`replayed_listed`).
    pub replayed: Vec<String>,
    pub replayed_count: u64,
    pub not_found: Vec<String>,
    pub unreadable: Vec<UnreadableRecord>,
    /// Named ids whose record was replayed before: sent again, as asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replayed_before: Vec<String>,
    /// Set when `replayed` lists fewer ids than `replayed_count`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed_listed: Option<usize>,
    /// Headers the records did not keep (`dead_letter.redact_headers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redacted_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// `DELETE /v1/dead-letters?destination=&before=`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PurgeAnswer {
    pub destination: String,
    pub before: Option<String>,
    pub purged: u64,
    pub files: Vec<String>,
}

/// `GET /v1/events/{id}` (docs/history.md): the event at each destination.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventAnswer {
    pub id: String,
    pub deliveries: Vec<Delivery>,
}

/// One event at one destination.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    pub destination: String,
    /// `pending`, `in_flight`, `delivered`, `dead_lettered`, `dropped`,
    /// or `handed_off` (to another courier at shutdown).
    pub state: String,
    pub accepted_at: String,
    pub attempts: Vec<AttemptView>,
    /// Attempts made by the courier that handed the event off, whose
    /// details stayed there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts_before: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<String>,
    /// What keeps a pending event from going now: `schedule`, `probation`,
    /// `pause` or `rate_limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Why it was dead-lettered or dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `url: per_event`: the origin of its endpoint (never its path or
    /// query: history is read without the admin token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptView {
    pub attempt: u32,
    pub at: String,
    pub duration_ms: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    pub outcome: String,
    pub late: bool,
}

/// One event at one destination in `GET /v1/events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventItem {
    pub id: String,
    pub destination: String,
    pub state: String,
    pub attempts: u32,
    pub last_status: Option<u16>,
    pub last_outcome: Option<String>,
    pub accepted_at: String,
    pub finished_at: Option<String>,
    /// `url: per_event`: the origin of its endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// `GET /v1/events`: newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventPage {
    pub events: Vec<EventItem>,
    /// The cursor of the next page (`after=`); `None` on the last.
    pub next: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_item_is_its_summary_flattened_beside_destination_and_replayed() {
        let item = DeadLetterItem {
            summary: Summary {
                id: "e1".into(),
                reason: Some("NonRetriableStatus".into()),
                attempts: Some(1),
                last_outcome: Some("BadRequest".into()),
                last_status: Some(400),
                accepted_at: None,
                dead_lettered_at: Some("2026-11-23T09:00:00.000000Z".into()),
            },
            destination: "orders".into(),
            replayed: false,
        };
        let v = serde_json::to_value(&item).expect("serialize");
        assert_eq!(v["id"], "e1");
        assert_eq!(v["last_status"], 400);
        assert_eq!(v["destination"], "orders");
        assert_eq!(v["replayed"], false);
        let back: DeadLetterItem = serde_json::from_value(v).expect("deserialize");
        assert_eq!(back, item);
    }

    #[test]
    fn a_replay_request_refuses_unknown_fields_and_writes_only_what_is_set() {
        let bad = serde_json::from_value::<ReplayRequest>(json!({"destination": "o", "idz": []}));
        assert!(bad.is_err());
        let ask = ReplayRequest {
            destination: "o".into(),
            ids: Some(vec!["a".into()]),
            all: false,
            reason: None,
            since: None,
            until: None,
        };
        let v = serde_json::to_value(&ask).expect("serialize");
        assert_eq!(v, json!({"destination": "o", "ids": ["a"]}));
    }

    #[test]
    fn optional_parts_of_a_replay_answer_appear_only_when_they_say_something() {
        let mut a = ReplayAnswer {
            destination: "o".into(),
            replayed_count: 2,
            replayed: vec!["a".into(), "b".into()],
            ..ReplayAnswer::default()
        };
        let v = serde_json::to_value(&a).expect("serialize");
        for absent in [
            "replayed_before",
            "replayed_listed",
            "redacted_headers",
            "note",
        ] {
            assert!(v.get(absent).is_none(), "{absent}: {v}");
        }
        a.note = Some("n".into());
        a.replayed_before = vec!["a".into()];
        let v = serde_json::to_value(&a).expect("serialize");
        assert_eq!(v["note"], "n");
        assert_eq!(v["replayed_before"], json!(["a"]));
    }
}

/// One endpoint of a `url: per_event` destination, in
/// `GET /v1/destinations/{name}/endpoints`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointItem {
    /// `scheme://host:port`.
    pub origin: String,
    /// `healthy`, `probation`, `paused` or `disabled`.
    pub state: String,
    /// Its events in the journal that are rows (not those accepted within
    /// the indexer's lag, about 100 ms).
    pub pending: u64,
    pub in_flight: u64,
    pub oldest_pending_age_s: Option<f64>,
    pub failing_since: Option<String>,
    pub last_outcome: Option<String>,
    pub last_status: Option<u16>,
    /// For a disabled one: by whom (`operator`, `gone`, `disable_after`)
    /// and since when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_at: Option<String>,
}

/// `GET /v1/destinations/{name}/endpoints`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointPage {
    pub endpoints: Vec<EndpointItem>,
    /// The cursor of the next page; `None` on the last.
    pub next: Option<String>,
}

/// `POST /v1/destinations/{name}/endpoints/{origin}/disable|enable`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointChange {
    pub destination: String,
    pub origin: String,
    pub state: String,
    /// `false`: it was so already, nothing changed.
    pub changed: bool,
}
