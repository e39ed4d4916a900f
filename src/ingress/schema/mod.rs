//! Event schemas at ingress (docs/publishing.md): turns one request of an `eventgrid`
//! or `cloudevents` destination into its events, or says precisely why not.
//!
//! Pure: headers and body in, events or an error out, no I/O, so every rule
//! is unit tested here. A request is all-or-nothing: the first bad event
//! rejects it, naming its index and field. Each event keeps the app's own
//! bytes where it can (a slice of the body), and carries its type and
//! subject so that topic filters can match on them without parsing again.

mod cloudevents;
mod eventgrid;
mod fields;

use crate::event::Schema;
use bytes::Bytes;
use http::HeaderMap;
use serde_json::value::RawValue;

/// One event of a request, ready to be journaled.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: String,
    /// Event Grid `eventType`, CloudEvents `type`.
    pub event_type: String,
    /// Event Grid `subject`, CloudEvents `subject` (optional there).
    pub subject: Option<String>,
    /// The event alone as JSON: the app's bytes, or for CloudEvents binary
    /// mode the structured form built from the headers and body.
    pub body: Bytes,
}

/// Why a request's events were refused; `status` maps each to 400 or 415.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchemaError {
    #[error("content type {got} is not accepted by schema {schema}: send {expected}")]
    ContentType {
        got: String,
        schema: &'static str,
        expected: &'static str,
    },
    #[error("the body is not valid JSON: {0}")]
    Malformed(String),
    #[error("{0}")]
    Shape(&'static str),
    #[error("the array holds no events: send at least one")]
    Empty,
    #[error("event {index}: must be a JSON object")]
    NotObject { index: usize },
    #[error("event {index}: {problem}")]
    Field {
        index: usize,
        field: String,
        problem: Problem,
    },
}

/// What is wrong with one field of one event.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Problem {
    #[error("missing required field \"{0}\"")]
    Missing(String),
    #[error("field \"{field}\" must be {expected}")]
    Type {
        field: String,
        expected: &'static str,
    },
    #[error("field \"{0}\" must not be empty")]
    Empty(String),
    #[error("field \"{field}\" {why}")]
    Invalid { field: String, why: String },
}

impl SchemaError {
    /// The HTTP status of the refusal: 415 for a content type the schema
    /// does not take, else 400.
    pub fn status(&self) -> http::StatusCode {
        match self {
            SchemaError::ContentType { .. } => http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            _ => http::StatusCode::BAD_REQUEST,
        }
    }

    /// The `reason` label of `courier_ingress_rejected_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            SchemaError::ContentType { .. } => "content_type",
            SchemaError::Malformed(_) => "malformed",
            _ => "invalid_event",
        }
    }

    /// The event index the error is about, if it is about one.
    pub fn index(&self) -> Option<usize> {
        match self {
            SchemaError::NotObject { index } | SchemaError::Field { index, .. } => Some(*index),
            _ => None,
        }
    }

    /// The field the error is about, if it is about one.
    pub fn field(&self) -> Option<&str> {
        match self {
            SchemaError::Field { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// The events of one request to a route of `schema`; `None` for `custom`,
/// whose body is delivered as received. `eventgrid_topic` is the route's
/// Event Grid topic, for Event Grid events that name none.
pub fn parse(
    schema: Schema,
    headers: &HeaderMap,
    body: &Bytes,
    eventgrid_topic: &str,
) -> Option<Result<Vec<Event>, SchemaError>> {
    match schema {
        Schema::Custom => None,
        Schema::Eventgrid => Some(eventgrid::parse(headers, body, eventgrid_topic)),
        Schema::Cloudevents => Some(cloudevents::parse(headers, body)),
    }
}

/// Whether an app header travels with the events of `schema`. For
/// `eventgrid` and `cloudevents`, courier sets `Content-Type` itself on
/// delivery, and `ce-*` headers are dropped: binary mode is converted to
/// structured mode at ingress, and a stray `ce-*` header beside a
/// structured body would make receivers read it as binary mode.
pub fn forwards_header(schema: Schema, name: &str) -> bool {
    match schema {
        Schema::Custom => true,
        Schema::Eventgrid | Schema::Cloudevents => {
            name != "content-type" && !name.starts_with("ce-")
        }
    }
}

/// The media type of a `Content-Type` value, lower case, without
/// parameters.
fn essence(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(http::header::CONTENT_TYPE)?;
    let text = String::from_utf8_lossy(value.as_bytes());
    let media = text.split(';').next().unwrap_or_default().trim();
    Some(media.to_ascii_lowercase())
}

/// Whether a media type is JSON: `application/json`, `text/json` or any
/// `+json` suffix (as the CloudEvents JSON format reads it).
fn is_json(media: &str) -> bool {
    matches!(media, "application/json" | "text/json") || media.ends_with("+json")
}

/// The body as a list of raw events: one object, or an array when
/// `array_ok`. Each element keeps its exact bytes.
fn raw_events(body: &[u8], array_ok: bool) -> Result<Vec<&RawValue>, SchemaError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    match first {
        Some(b'[') if array_ok => {
            let list: Vec<&RawValue> =
                serde_json::from_slice(body).map_err(|e| SchemaError::Malformed(e.to_string()))?;
            if list.is_empty() {
                return Err(SchemaError::Empty);
            }
            Ok(list)
        }
        Some(b'[') => Err(SchemaError::Shape(
            "the body must be one JSON object (a batch is sent as application/cloudevents-batch+json)",
        )),
        Some(b'{') => {
            let one: &RawValue =
                serde_json::from_slice(body).map_err(|e| SchemaError::Malformed(e.to_string()))?;
            Ok(vec![one])
        }
        None => Err(SchemaError::Shape("the body is empty: send a JSON event")),
        Some(_) => match serde_json::from_slice::<serde_json::Value>(body) {
            Err(e) => Err(SchemaError::Malformed(e.to_string())),
            Ok(_) if array_ok => Err(SchemaError::Shape(
                "the body must be a JSON object (one event) or an array of events",
            )),
            Ok(_) => Err(SchemaError::Shape("the body must be a JSON object")),
        },
    }
}

/// The event's bytes as a slice of the request body (no copy).
fn slice_of(body: &Bytes, raw: &RawValue) -> Bytes {
    let text = raw.get().as_bytes();
    let (base, at) = (body.as_ptr() as usize, text.as_ptr() as usize);
    if at >= base && at + text.len() <= base + body.len() {
        body.slice(at - base..at - base + text.len())
    } else {
        Bytes::copy_from_slice(text)
    }
}

/// The index, field and problem of a field error (panics otherwise), for
/// the schema parsers' unit tests.
#[cfg(test)]
fn field_error(r: Result<Vec<Event>, SchemaError>) -> (usize, String, Problem) {
    match r {
        Err(SchemaError::Field {
            index,
            field,
            problem,
        }) => (index, field, problem),
        other => panic!("expected a field error, got {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_reasons_and_messages() {
        let e = SchemaError::Field {
            index: 3,
            field: "eventType".into(),
            problem: Problem::Missing("eventType".into()),
        };
        assert_eq!(
            e.to_string(),
            "event 3: missing required field \"eventType\""
        );
        assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
        assert_eq!((e.index(), e.field()), (Some(3), Some("eventType")));
        let ct = SchemaError::ContentType {
            got: "text/plain".into(),
            schema: "eventgrid",
            expected: "application/json",
        };
        assert_eq!(ct.status(), http::StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(ct.reason(), "content_type");
        assert_eq!((ct.index(), ct.field()), (None, None));
    }

    #[test]
    fn raw_events_keep_bytes_and_refuse_other_shapes() {
        let body = Bytes::from_static(b" [ {\"a\": 1} , {\"b\":2}\n] ");
        let raws = raw_events(&body, true).expect("array");
        let parts: Vec<Bytes> = raws.iter().map(|r| slice_of(&body, r)).collect();
        assert_eq!(parts, [&b"{\"a\": 1}"[..], &b"{\"b\":2}"[..]]);
        assert!(matches!(raw_events(b"[]", true), Err(SchemaError::Empty)));
        assert!(matches!(
            raw_events(b"[{}]", false),
            Err(SchemaError::Shape(_))
        ));
        assert!(matches!(
            raw_events(b"{\"a\":", true),
            Err(SchemaError::Malformed(_))
        ));
        assert!(matches!(
            raw_events(b"42", true),
            Err(SchemaError::Shape(_))
        ));
        assert!(matches!(
            raw_events(b"nope", true),
            Err(SchemaError::Malformed(_))
        ));
        assert!(matches!(
            raw_events(b"  ", true),
            Err(SchemaError::Shape(_))
        ));
    }

    #[test]
    fn json_media_types() {
        for json in ["application/json", "text/json", "application/vnd.x+json"] {
            assert!(is_json(json), "{json}");
        }
        for other in [
            "text/plain",
            "application/octet-stream",
            "application/jsonx",
        ] {
            assert!(!is_json(other), "{other}");
        }
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("Application/JSON ; charset=utf-8"),
        );
        assert_eq!(essence(&h).as_deref(), Some("application/json"));
        assert_eq!(essence(&HeaderMap::new()), None);
    }

    #[test]
    fn schema_headers_are_not_forwarded() {
        assert!(forwards_header(Schema::Custom, "content-type"));
        assert!(forwards_header(Schema::Custom, "ce-id"));
        for s in [Schema::Eventgrid, Schema::Cloudevents] {
            assert!(!forwards_header(s, "content-type"));
            assert!(!forwards_header(s, "ce-id"));
            assert!(forwards_header(s, "x-trace"));
        }
    }
}
