//! A dead-letter record read back (docs/dead-letters.md): what the admin API lists,
//! and the request a replay puts back in the journal. The shape is told by
//! the record itself (`courierRequest`, `courierrequest`, or the custom
//! envelope with the request at the top level), not by the destination's
//! schema now, which a reload may have changed since it was written.

use super::record::{BODY_BASE64, CLOUDEVENTS, EVENTGRID, Key, Names, SEQ};
use crate::event::rules;
use crate::event::{Header, NewEvent};
use base64::Engine;
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::collections::HashMap;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParseError {
    #[error("not a JSON object")]
    NotObject,
    #[error("no `{0}`")]
    Missing(&'static str),
    #[error("header `{0}` is neither a string nor {{\"base64\": ...}}")]
    Header(String),
    #[error("`data_base64` is not base64")]
    Data,
    #[error("not a request ingress would accept: {0}")]
    Refused(#[from] crate::event::rules::Refused),
}

/// One record, parsed.
pub struct Record {
    fields: Map<String, Value>,
    shape: Shape,
}

#[derive(Clone, Copy)]
enum Shape {
    /// An eventgrid or cloudevents event with courier's fields spliced in.
    Event(&'static Names),
    Custom,
}

/// What a listing shows of a record.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub id: String,
    pub reason: Option<String>,
    pub attempts: Option<u64>,
    pub last_outcome: Option<String>,
    pub last_status: Option<u64>,
    pub accepted_at: Option<String>,
    pub dead_lettered_at: Option<String>,
}

/// The request a replay stores, and the headers the record did not keep.
pub struct Rebuilt {
    pub event: NewEvent,
    pub redacted: Vec<String>,
}

pub fn parse(line: &str) -> Result<Record, ParseError> {
    let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(line) else {
        return Err(ParseError::NotObject);
    };
    let shape = if fields.contains_key(EVENTGRID.request) {
        Shape::Event(&EVENTGRID)
    } else if fields.contains_key(CLOUDEVENTS.request) {
        Shape::Event(&CLOUDEVENTS)
    } else {
        Shape::Custom
    };
    let record = Record { fields, shape };
    record.id().ok_or(ParseError::Missing("id"))?;
    Ok(record)
}

impl Record {
    fn names(&self) -> &'static Names {
        match self.shape {
            Shape::Event(names) => names,
            Shape::Custom => &EVENTGRID,
        }
    }

    /// The request's parts: the courier object of an event shape, or the
    /// top level of the custom envelope.
    fn request(&self) -> Option<&Map<String, Value>> {
        match self.shape {
            Shape::Event(names) => self.fields.get(names.request)?.as_object(),
            Shape::Custom => Some(&self.fields),
        }
    }

    /// Courier's event id. Records written before it was in the request
    /// object have only the event's own `id`, which was courier's then.
    pub fn id(&self) -> Option<&str> {
        self.request()
            .and_then(|r| r.get("id"))
            .or_else(|| self.fields.get("id"))?
            .as_str()
    }

    fn text(&self, key: &str) -> Option<String> {
        self.fields.get(key)?.as_str().map(str::to_string)
    }

    pub fn reason(&self) -> Option<&str> {
        self.fields.get(self.names().reason)?.as_str()
    }

    /// When it was dead-lettered (ms since the epoch), when it says so.
    pub fn dead_lettered_ms(&self) -> Option<u64> {
        let at = self.fields.get(self.names().dead_lettered)?.as_str()?;
        crate::clock::rfc3339::parse_ms(at)
    }

    /// The record's key; `None` for one written before records had their
    /// seq (never one a restart looks for).
    pub fn key(&self) -> Option<Key> {
        Some(Key {
            seq: self.request()?.get(SEQ)?.as_i64()?,
            id: self.id()?.to_string(),
            at_ms: self.dead_lettered_ms()?,
        })
    }

    pub fn summary(&self) -> Summary {
        let n = self.names();
        Summary {
            id: self.id().unwrap_or_default().to_string(),
            reason: self.text(n.reason),
            attempts: self.fields.get(n.attempts).and_then(Value::as_u64),
            last_outcome: self.text(n.outcome),
            last_status: self.fields.get(n.status).and_then(Value::as_u64),
            accepted_at: self.text(n.publish),
            dead_lettered_at: self.text(n.dead_lettered),
        }
    }

    pub fn into_value(self) -> Value {
        Value::Object(self.fields)
    }

    /// The request as the app sent it, for `destination`, accepted anew
    /// at `now_ms` (a fresh TTL and attempt count). `line` is the record's
    /// text, from which an event's own bytes are cut when they are intact.
    pub fn rebuild(
        &self,
        line: &str,
        destination: &str,
        now_ms: u64,
    ) -> Result<Rebuilt, ParseError> {
        let request = self.request().ok_or(ParseError::Missing("request"))?;
        let text = |key: &'static str| -> Result<String, ParseError> {
            request
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or(ParseError::Missing(key))
        };
        let headers = match request.get("headers") {
            Some(Value::Object(h)) => headers(h)?,
            _ => Vec::new(),
        };
        let redacted = match request.get("redactedHeaders") {
            Some(Value::Array(names)) => names
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
            _ => Vec::new(),
        };
        let body = match (request.get(BODY_BASE64), self.shape) {
            (Some(Value::String(b64)), _) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map(Bytes::from)
                .map_err(|_| ParseError::Data)?,
            (_, Shape::Event(names)) => self.event_body(line, names),
            (_, Shape::Custom) => custom_body(line)?,
        };
        let event = NewEvent {
            id: self.id().ok_or(ParseError::Missing("id"))?.to_string(),
            destination: destination.to_string(),
            method: text("method")?,
            path: text("path")?,
            headers,
            body,
            accepted_ms: now_ms,
        };
        // A record on a volume is read as a request is: whoever can write
        // there must not send what ingress refuses. Its body was within
        // the limit when it was accepted, which a reload may have lowered
        // since: an operator's replay keeps it.
        let limits = rules::Limits {
            max_body_bytes: u64::MAX,
            keyed: false,
        };
        rules::check(
            &event.id,
            &event.destination,
            &event.method,
            &event.path,
            &event.headers,
            event.body.len(),
            limits,
        )?;
        Ok(Rebuilt { event, redacted })
    }

    /// The event without courier's fields. They were spliced in last, so
    /// when the line ends with exactly them, what precedes is the event's
    /// own text; otherwise (the event was re-encoded) it is re-encoded.
    fn event_body(&self, line: &str, names: &Names) -> Bytes {
        let mut event = self.fields.clone();
        let mut added = Map::new();
        for key in names.all() {
            if let Some(v) = event.remove(key) {
                added.insert(key.to_string(), v);
            }
        }
        let extra = Value::Object(added).to_string();
        if let Some(head) = line.trim_end().strip_suffix(&extra[1..]) {
            let mut body = head.strip_suffix(',').unwrap_or(head).to_string();
            body.push('}');
            if serde_json::from_str::<Value>(&body).is_ok_and(|v| v == Value::Object(event.clone()))
            {
                return Bytes::from(body);
            }
        }
        Bytes::from(Value::Object(event).to_string())
    }
}

/// The custom envelope's body: `data` byte for byte (`null` too), or
/// `data_base64`.
fn custom_body(line: &str) -> Result<Bytes, ParseError> {
    let fields: HashMap<String, Box<RawValue>> =
        serde_json::from_str(line).map_err(|_| ParseError::NotObject)?;
    if let Some(raw) = fields.get("data") {
        return Ok(Bytes::copy_from_slice(raw.get().as_bytes()));
    }
    match fields
        .get("data_base64")
        .map(|raw| serde_json::from_str::<String>(raw.get()))
    {
        Some(Ok(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map(Bytes::from)
            .map_err(|_| ParseError::Data),
        Some(Err(_)) => Err(ParseError::Data),
        None => Ok(Bytes::new()),
    }
}

/// One recorded header value's bytes: a string, or `{"base64": ...}` for
/// bytes that are not UTF-8.
pub(super) fn header_bytes(name: &str, v: &Value) -> Result<Vec<u8>, ParseError> {
    match v {
        Value::String(s) => Ok(s.as_bytes().to_vec()),
        Value::Object(o) => o
            .get("base64")
            .and_then(Value::as_str)
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .ok_or_else(|| ParseError::Header(name.to_string())),
        _ => Err(ParseError::Header(name.to_string())),
    }
}

/// The recorded headers, a repeated one from its list in order.
fn headers(h: &Map<String, Value>) -> Result<Vec<Header>, ParseError> {
    let mut out = Vec::new();
    for (name, v) in h {
        match v {
            Value::Array(list) => {
                for item in list {
                    out.push((name.clone(), header_bytes(name, item)?));
                }
            }
            one => out.push((name.clone(), header_bytes(name, one)?)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadletter::{Written, record};
    use crate::event::Fate;
    use crate::event::Reason;
    use crate::event::Schema;

    fn event(body: &'static [u8]) -> NewEvent {
        NewEvent {
            id: "evt-1".into(),
            destination: "orders".into(),
            method: "PUT".into(),
            path: "/hooks/a?x=1&y=%20".into(),
            headers: vec![
                ("content-type".into(), b"application/json".to_vec()),
                ("x-bin".into(), b"a\xffb".to_vec()),
                ("x-bin".into(), b"second".to_vec()),
                ("cookie".into(), b"session=1".to_vec()),
            ],
            body: Bytes::from_static(body),
            accepted_ms: 1_597_339_093_000,
        }
    }

    const FACTS: Fate = Fate {
        reason: Reason::NonRetriableStatus,
        attempts: 3,
        last_outcome: crate::event::Outcome::BadRequest,
        last_status: Some(400),
        last_attempt_ms: Some(1_597_339_094_000),
        at_ms: 1_597_339_095_000,
    };

    /// Writes a record, reads it back, rebuilds it for `into` at 42.
    fn round_trip(schema: Schema, e: &NewEvent, redact: &[String]) -> (Summary, Rebuilt) {
        let w = Written {
            at_ms: 1_597_339_095_000,
            seq: 12,
            redact,
        };
        let line = record(schema, e, &FACTS, &w);
        let r = parse(&line).expect("parses");
        let key = Key {
            seq: 12,
            id: e.id.clone(),
            at_ms: w.at_ms,
        };
        assert_eq!(r.key(), Some(key), "{schema:?}");
        let rebuilt = r.rebuild(&line, "into", 42).expect("rebuilds");
        (r.summary(), rebuilt)
    }

    #[test]
    fn every_shape_gives_back_the_request_byte_for_byte() {
        let bodies: [(Schema, &'static [u8]); 6] = [
            (Schema::Custom, br#"{"b": 2,  "a": [1, 2]}"#),
            (Schema::Custom, b"\x00\xffnot json"),
            (Schema::Custom, b""),
            (
                Schema::Eventgrid,
                br#"{"id":"e1", "data":{"n": 1}, "eventType":"T"}"#,
            ),
            (
                Schema::Cloudevents,
                br#"{"specversion":"1.0","id":"c1","data":"x"}"#,
            ),
            (Schema::Eventgrid, b"{}"),
        ];
        for (schema, body) in bodies {
            let e = event(body);
            let (summary, rebuilt) = round_trip(schema, &e, &[]);
            let got = rebuilt.event;
            assert_eq!(got.body, e.body, "{schema:?} {body:?}");
            assert_eq!(got.method, "PUT");
            assert_eq!(got.path, e.path);
            assert_eq!(got.id, "evt-1", "courier's id, not the body's");
            assert_eq!(got.destination, "into");
            assert_eq!(got.accepted_ms, 42, "a replay is accepted anew");
            let mut want = e.headers.clone();
            want.sort();
            let mut have = got.headers.clone();
            have.sort();
            assert_eq!(have, want, "{schema:?}");
            assert!(rebuilt.redacted.is_empty());
            assert_eq!(summary.id, "evt-1");
            assert_eq!(summary.reason.as_deref(), Some("NonRetriableStatus"));
            assert_eq!(summary.attempts, Some(3));
            assert_eq!(summary.last_status, Some(400));
            assert_eq!(summary.last_outcome.as_deref(), Some("BadRequest"));
            assert_eq!(
                summary.dead_lettered_at.as_deref(),
                Some("2020-08-13T17:18:15.000000Z")
            );
        }
    }

    #[test]
    fn redacted_headers_are_not_sent_and_are_named() {
        let redact = ["cookie".to_string()];
        for schema in [Schema::Custom, Schema::Eventgrid, Schema::Cloudevents] {
            let (_, rebuilt) = round_trip(schema, &event(br#"{"id":"e1"}"#), &redact);
            assert!(
                rebuilt.event.headers.iter().all(|(n, _)| n != "cookie"),
                "{schema:?}"
            );
            assert_eq!(rebuilt.redacted, ["cookie"], "{schema:?}");
        }
    }

    #[test]
    fn a_record_edited_on_the_volume_replays_only_what_ingress_would_accept() {
        let good = record(
            Schema::Custom,
            &event(b"{}"),
            &FACTS,
            &Written {
                at_ms: 1,
                seq: 1,
                redact: &[],
            },
        );
        for (from, to, reason) in [
            ("\"method\":\"PUT\"", "\"method\":\"DELETE\"", "method"),
            (
                "\"path\":\"/hooks/a?x=1&y=%20\"",
                "\"path\":\"@127.0.0.2:9/x\"",
                "path",
            ),
            (
                "\"path\":\"/hooks/a?x=1&y=%20\"",
                "\"path\":\"/../admin\"",
                "path",
            ),
        ] {
            assert!(good.contains(from), "{good}");
            let line = good.replace(from, to);
            match parse(&line).and_then(|r| r.rebuild(&line, "into", 42)) {
                Err(ParseError::Refused(why)) => assert_eq!(why.reason(), reason, "{to}"),
                Err(e) => panic!("{to}: {e}"),
                Ok(_) => panic!("{to}: replayed"),
            }
        }
        assert!(
            parse(&good)
                .and_then(|r| r.rebuild(&good, "into", 42))
                .is_ok()
        );
    }

    #[test]
    fn the_dead_letter_time_is_read_and_bad_lines_are_refused() {
        let line = record(
            Schema::Custom,
            &event(b"{}"),
            &FACTS,
            &Written {
                at_ms: 1_597_339_095_123,
                seq: 3,
                redact: &[],
            },
        );
        assert_eq!(
            parse(&line).expect("parses").dead_lettered_ms(),
            Some(1_597_339_095_123)
        );
        let unkeyed = r#"{"id":"e","deadLetterTime":"2020-08-13T17:18:15.123000Z"}"#;
        assert_eq!(parse(unkeyed).expect("parses").key(), None);
        assert!(matches!(parse("[1]"), Err(ParseError::NotObject)));
        assert!(matches!(parse("{\"id\":"), Err(ParseError::NotObject)));
        assert!(matches!(parse("{\"x\":1}"), Err(ParseError::Missing("id"))));
    }
}
