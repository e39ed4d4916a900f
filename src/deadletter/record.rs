//! Dead-letter record shapes per schema, after Event Grid's examples
//! (docs/dead-letters.md). Every record lets a replay rebuild the original request:
//!
//! - `eventgrid`: the event's own fields plus `deadLetterReason`,
//!   `deliveryAttempts`, `lastDeliveryOutcome`, `lastHttpStatusCode`,
//!   `publishTime`, `lastDeliveryAttemptTime`, courier's `deadLetterTime`,
//!   and `courierRequest` (courier's event `id`, `method`, `path`,
//!   forwarded `headers`, `redactedHeaders`) for the rest of the request,
//!   and the event's journal `seq`, which with the id and `deadLetterTime`
//!   is the record's `Key`.
//!   The id is there because the body's own `id` is not always courier's
//!   (a binary-mode CloudEvent's body is its data).
//! - `cloudevents`: the event plus the same fields in lower case
//!   (CloudEvents attribute names), `courierrequest` likewise.
//! - `custom`: an Event Grid envelope plus the original request (method,
//!   path, forwarded headers, redacted header names) and `seq` at the top
//!   level.
//!
//! Headers named in `dead_letter.redact_headers` are left out, and their
//! names listed, so that a replay can say what it sends without.
//!
//! Header values are kept byte for byte: a UTF-8 value is a JSON string, a
//! value that is not UTF-8 (HTTP allows any octet but control characters)
//! is `{"base64": "<its bytes>"}`, since a string would have to replace its
//! bytes with U+FFFD and replay could not rebuild the request.
//!
//! The event's bytes are kept when it fits on one line (the fields are
//! spliced in before its closing brace), so replay sends the same bytes; a
//! multi-line event, one with whitespace around it, or one that already has
//! a field of the same name, is re-encoded with the fields set, and its
//! exact bytes go in the request object as `bodyBase64` (in the custom
//! shape, at the top level, when `data` is JSON but not the body's bytes).

use crate::clock::rfc3339;
use crate::event::Schema;
use crate::event::{Fate, NewEvent};
use base64::Engine;
use serde_json::{Map, Value, json};

/// What identifies one dead-lettered event's record, whatever its shape:
/// the event's journal seq, its id and its dead-letter time (ms). Seqs
/// start again in a new journal; the three together never repeat.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub seq: i64,
    pub id: String,
    pub at_ms: u64,
}

/// The name of the key's seq in the request object (or, custom, at the
/// top level).
pub(super) const SEQ: &str = "seq";

/// The names of the dead-letter fields in one schema's spelling.
pub(super) struct Names {
    pub(super) reason: &'static str,
    pub(super) attempts: &'static str,
    pub(super) outcome: &'static str,
    pub(super) status: &'static str,
    pub(super) publish: &'static str,
    pub(super) last_attempt: &'static str,
    pub(super) dead_lettered: &'static str,
    pub(super) request: &'static str,
}

pub(super) const EVENTGRID: Names = Names {
    reason: "deadLetterReason",
    attempts: "deliveryAttempts",
    outcome: "lastDeliveryOutcome",
    status: "lastHttpStatusCode",
    publish: "publishTime",
    last_attempt: "lastDeliveryAttemptTime",
    dead_lettered: "deadLetterTime",
    request: "courierRequest",
};

pub(super) const CLOUDEVENTS: Names = Names {
    reason: "deadletterreason",
    attempts: "deliveryattempts",
    outcome: "lastdeliveryoutcome",
    status: "lasthttpstatuscode",
    publish: "publishtime",
    last_attempt: "lastdeliveryattempttime",
    dead_lettered: "deadlettertime",
    request: "courierrequest",
};

impl Names {
    /// Every field courier adds to the event.
    pub(super) fn all(&self) -> [&'static str; 8] {
        [
            self.reason,
            self.attempts,
            self.outcome,
            self.status,
            self.publish,
            self.last_attempt,
            self.dead_lettered,
            self.request,
        ]
    }
}

/// How a record is written: when, under which journal seq, and which app
/// headers stay out of it.
pub struct Written<'a> {
    pub at_ms: u64,
    pub seq: i64,
    /// Lowercase header names (`dead_letter.redact_headers`).
    pub redact: &'a [String],
}

/// One JSON line for a dead-lettered event of a destination of `schema`.
pub fn record(schema: Schema, e: &NewEvent, facts: &Fate, w: &Written) -> String {
    let names = match schema {
        Schema::Custom => return custom_record(e, facts, w),
        Schema::Eventgrid => &EVENTGRID,
        Schema::Cloudevents => &CLOUDEVENTS,
    };
    // A body that is no JSON object was accepted while the destination
    // was `custom`: it keeps the custom shape, which replay understands.
    event_record(e, facts, w, names).unwrap_or_else(|| custom_record(e, facts, w))
}

/// The request object of the event shapes.
fn request_json(e: &NewEvent, w: &Written) -> Value {
    let (headers, redacted) = headers_json(e, w.redact);
    let mut request =
        json!({ "id": e.id, "method": e.method, "path": e.path, "headers": headers, SEQ: w.seq });
    if !redacted.is_empty() {
        request["redactedHeaders"] = json!(redacted);
    }
    request
}

fn event_record(e: &NewEvent, facts: &Fate, w: &Written, names: &Names) -> Option<String> {
    let Ok(Value::Object(mut event)) = serde_json::from_slice::<Value>(&e.body) else {
        return None;
    };
    let text = std::str::from_utf8(&e.body).ok()?;
    // Spliced, the event keeps its bytes; else it is re-encoded, and its
    // bytes go with the request, so that a replay sends them as they were.
    let clash = names.all().iter().any(|k| event.contains_key(*k));
    let splice =
        !clash && !text.contains(['\n', '\r']) && text.starts_with('{') && text.ends_with('}');
    let mut request = request_json(e, w);
    if !splice {
        request[BODY_BASE64] = json!(base64::engine::general_purpose::STANDARD.encode(&e.body));
    }
    let mut fields = Map::new();
    for (name, value) in [
        (names.reason, json!(facts.reason.as_str())),
        (names.attempts, json!(facts.attempts)),
        (names.outcome, json!(facts.last_outcome.as_str())),
        (names.status, json!(facts.last_status)),
        (names.publish, json!(rfc3339(e.accepted_ms))),
        (
            names.last_attempt,
            json!(facts.last_attempt_ms.map(rfc3339)),
        ),
        (names.dead_lettered, json!(rfc3339(w.at_ms))),
        (names.request, request),
    ] {
        fields.insert(name.to_string(), value);
    }
    if !splice {
        event.extend(fields);
        return Some(Value::Object(event).to_string());
    }
    // Splice before the closing brace: `{<event's own text>,<fields>}`.
    let extra = Value::Object(fields).to_string();
    let head = &text[..text.len() - 1];
    let mut line = String::with_capacity(text.len() + extra.len());
    line.push_str(head);
    if !head[1..].trim().is_empty() {
        line.push(',');
    }
    line.push_str(&extra[1..]);
    Some(line)
}

/// One header value: a string when it is UTF-8, else its bytes in base64.
fn header_value(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => Value::String(text.to_owned()),
        Err(_) => json!({ "base64": base64::engine::general_purpose::STANDARD.encode(bytes) }),
    }
}

/// The forwarded headers as an object (a repeated header becomes a list),
/// and the names of those redacted, in order, once each.
fn headers_json(e: &NewEvent, redact: &[String]) -> (Map<String, Value>, Vec<String>) {
    let mut headers = Map::new();
    let mut redacted: Vec<String> = Vec::new();
    for (name, value) in &e.headers {
        // An endpoint's secret is never written, not even by name.
        if name == crate::event::endpoint::SECRET_HEADER {
            continue;
        }
        if redact.contains(name) {
            if !redacted.contains(name) {
                redacted.push(name.clone());
            }
            continue;
        }
        let v = header_value(value);
        match headers.get_mut(name) {
            Some(Value::Array(list)) => list.push(v),
            Some(first) => *first = Value::Array(vec![first.take(), v]),
            None => {
                headers.insert(name.clone(), v);
            }
        }
    }
    (headers, redacted)
}

fn custom_record(e: &NewEvent, facts: &Fate, w: &Written) -> String {
    let (headers, redacted) = headers_json(e, w.redact);
    let mut record = json!({
        "id": e.id,
        "eventTime": rfc3339(e.accepted_ms),
        "eventType": "Courier.Custom",
        "subject": e.destination,
        "dataVersion": "1.0",
        "metadataVersion": "1",
        "deadLetterReason": facts.reason.as_str(),
        "deliveryAttempts": facts.attempts,
        "lastDeliveryOutcome": facts.last_outcome.as_str(),
        "lastHttpStatusCode": facts.last_status,
        "publishTime": rfc3339(e.accepted_ms),
        "lastDeliveryAttemptTime": facts.last_attempt_ms.map(rfc3339),
        "deadLetterTime": rfc3339(w.at_ms),
        "method": e.method,
        "path": e.path,
        "headers": headers,
        SEQ: w.seq,
    });
    if !redacted.is_empty() {
        record["redactedHeaders"] = json!(redacted);
    }
    let one_line = !e.body.contains(&b'\n') && !e.body.contains(&b'\r');
    let data = match serde_json::from_slice::<&serde_json::value::RawValue>(&e.body) {
        Ok(raw) if one_line => raw.get().to_string(),
        Ok(_) => match serde_json::from_slice::<Value>(&e.body) {
            Ok(v) => v.to_string(),
            Err(_) => String::new(),
        },
        Err(_) => String::new(),
    };
    let data = if data.is_empty() {
        base64_data(&e.body)
    } else {
        // JSON, but not its bytes (whitespace around it, or re-encoded
        // across lines): the bytes go too, for a replay.
        if data.as_bytes() != &e.body[..] {
            record[BODY_BASE64] = json!(base64::engine::general_purpose::STANDARD.encode(&e.body));
        }
        format!("\"data\":{data}")
    };
    // Splice the data in last: `{...,"data":<body>}`.
    let mut line = record.to_string();
    line.pop();
    line.push(',');
    line.push_str(&data);
    line.push('}');
    line
}

/// The body's exact bytes, where the record's JSON does not hold them.
pub(super) const BODY_BASE64: &str = "bodyBase64";

fn base64_data(body: &[u8]) -> String {
    format!(
        "\"data_base64\":\"{}\"",
        base64::engine::general_purpose::STANDARD.encode(body)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Outcome, Reason};
    use bytes::Bytes;

    fn event(body: &'static [u8]) -> NewEvent {
        NewEvent {
            id: "evt-1".into(),
            destination: "orders".into(),
            method: "POST".into(),
            path: "/x?y=1".into(),
            headers: vec![
                ("content-type".into(), b"application/json".to_vec()),
                ("x-a".into(), b"1".to_vec()),
                ("x-a".into(), b"2".to_vec()),
            ],
            body: Bytes::from_static(body),
            accepted_ms: 1_597_339_093_000,
        }
    }

    const W: Written = Written {
        at_ms: 1_597_339_095_000,
        seq: 7,
        redact: &[],
    };

    fn facts() -> Fate {
        Fate {
            reason: Reason::NonRetriableStatus,
            attempts: 1,
            last_outcome: Outcome::BadRequest,
            last_status: Some(400),
            last_attempt_ms: Some(1_597_339_094_000),
            at_ms: W.at_ms,
        }
    }

    #[test]
    fn json_body_is_embedded_verbatim_with_the_envelope() {
        let line = custom_record(&event(br#"{"b": 2,  "a": 1}"#), &facts(), &W);
        assert!(line.ends_with(r#","data":{"b": 2,  "a": 1}}"#), "{line}");
        let v: Value = serde_json::from_str(&line).expect("valid json");
        assert_eq!(v["id"], "evt-1");
        assert_eq!(v["subject"], "orders");
        assert_eq!(v["eventTime"], "2020-08-13T17:18:13.000000Z");
        assert_eq!(v["deadLetterReason"], "NonRetriableStatus");
        assert_eq!(v["deliveryAttempts"], 1);
        assert_eq!(v["lastDeliveryOutcome"], "BadRequest");
        assert_eq!(v["lastHttpStatusCode"], 400);
        assert_eq!(v["headers"]["x-a"], json!(["1", "2"]));
        assert_eq!(v["path"], "/x?y=1");
        assert_eq!(v["seq"], 7);
        assert_eq!(v["data"], json!({"a": 1, "b": 2}));
    }

    fn with_body(body: &'static [u8]) -> NewEvent {
        NewEvent {
            headers: vec![("x-trace".into(), b"t1".to_vec())],
            ..event(body)
        }
    }

    #[test]
    fn eventgrid_record_is_the_event_plus_the_fields_and_the_request() {
        let body = br#"{"id":"e1","subject":"/s", "eventType":"T","eventTime":"2025-01-31T12:00:00Z","data":{"n": 1},"dataVersion":"1"}"#;
        let line = record(Schema::Eventgrid, &with_body(body), &facts(), &W);
        let event = std::str::from_utf8(body).expect("utf-8");
        assert!(line.starts_with(&event[..event.len() - 1]), "{line}");
        let v: Value = serde_json::from_str(&line).expect("json");
        assert_eq!(v["id"], "e1");
        assert_eq!(v["data"], json!({"n": 1}));
        assert_eq!(v["deadLetterReason"], "NonRetriableStatus");
        assert_eq!(v["deliveryAttempts"], 1);
        assert_eq!(v["lastDeliveryOutcome"], "BadRequest");
        assert_eq!(v["lastHttpStatusCode"], 400);
        assert_eq!(v["publishTime"], "2020-08-13T17:18:13.000000Z");
        assert_eq!(v["lastDeliveryAttemptTime"], "2020-08-13T17:18:14.000000Z");
        assert_eq!(v["deadLetterTime"], "2020-08-13T17:18:15.000000Z");
        assert_eq!(
            v["courierRequest"],
            json!({"id": "evt-1", "method": "POST", "path": "/x?y=1", "headers": {"x-trace": "t1"}, "seq": 7})
        );
        // Replay: the record without courier's fields is the event.
        let mut replayed = v.as_object().expect("object").clone();
        for k in EVENTGRID_KEYS {
            replayed.remove(k);
        }
        let original: Value = serde_json::from_slice(body).expect("json");
        assert_eq!(Value::Object(replayed), original);
    }

    const EVENTGRID_KEYS: [&str; 8] = [
        "deadLetterTime",
        "deadLetterReason",
        "deliveryAttempts",
        "lastDeliveryOutcome",
        "lastHttpStatusCode",
        "publishTime",
        "lastDeliveryAttemptTime",
        "courierRequest",
    ];

    #[test]
    fn cloudevents_record_uses_lower_case_names() {
        let body = b"{\n \"specversion\": \"1.0\", \"id\": \"c1\", \"source\": \"/s\", \"type\": \"t\", \"data_base64\": \"AP8=\"\n}";
        let f = Fate {
            last_status: None,
            last_attempt_ms: None,
            ..facts()
        };
        let line = record(Schema::Cloudevents, &with_body(body), &f, &W);
        assert!(!line.contains('\n'), "{line}");
        let v: Value = serde_json::from_str(&line).expect("json");
        assert_eq!(v["id"], "c1");
        assert_eq!(v["data_base64"], "AP8=");
        assert_eq!(v["deadletterreason"], "NonRetriableStatus");
        assert_eq!(v["deliveryattempts"], 1);
        assert_eq!(v["lastdeliveryoutcome"], "BadRequest");
        assert_eq!(v["lasthttpstatuscode"], Value::Null);
        assert_eq!(v["publishtime"], "2020-08-13T17:18:13.000000Z");
        assert_eq!(v["lastdeliveryattempttime"], Value::Null);
        assert_eq!(v["courierrequest"]["path"], "/x?y=1");
        assert!(v.get("deadLetterReason").is_none());
    }

    #[test]
    fn a_clashing_field_is_overwritten_and_a_non_object_keeps_the_custom_shape() {
        let line = record(
            Schema::Eventgrid,
            &with_body(br#"{"id":"e1","deliveryAttempts":99}"#),
            &facts(),
            &W,
        );
        let v: Value = serde_json::from_str(&line).expect("json");
        assert_eq!(v["deliveryAttempts"], 1);
        assert_eq!(line.matches("deliveryAttempts").count(), 1, "{line}");
        let v: Value = serde_json::from_str(&record(
            Schema::Cloudevents,
            &with_body(b"plain"),
            &facts(),
            &W,
        ))
        .expect("json");
        assert_eq!(v["eventType"], "Courier.Custom");
        assert_eq!(v["data_base64"], "cGxhaW4=");
    }

    /// What a replay does with a recorded header value.
    fn decode(v: &Value) -> Option<Vec<u8>> {
        crate::deadletter::parse::header_bytes("x-test", v).ok()
    }

    #[test]
    fn header_values_round_trip_byte_for_byte() {
        let values: [&[u8]; 5] = [
            b"",
            b"plain",
            "caf\u{e9}".as_bytes(),
            b"\xff\xfe",
            b"ok\x80",
        ];
        for bytes in values {
            assert_eq!(
                decode(&header_value(bytes)).as_deref(),
                Some(bytes),
                "{bytes:?}"
            );
        }
        // UTF-8 stays a plain string, as before.
        assert_eq!(header_value("caf\u{e9}".as_bytes()), json!("caf\u{e9}"));
        assert_eq!(header_value(b"\xff\xfe"), json!({"base64": "//4="}));
        let e = NewEvent {
            headers: vec![
                ("x-bin".into(), b"a\xffb".to_vec()),
                ("x-bin".into(), b"text".to_vec()),
            ],
            ..event(b"{}")
        };
        let v: Value = serde_json::from_str(&custom_record(&e, &facts(), &W)).expect("json");
        let list = v["headers"]["x-bin"]
            .as_array()
            .expect("a repeated header is a list");
        assert_eq!(decode(&list[0]).as_deref(), Some(&b"a\xffb"[..]));
        assert_eq!(decode(&list[1]).as_deref(), Some(&b"text"[..]));
        let v: Value =
            serde_json::from_str(&record(Schema::Eventgrid, &e, &facts(), &W)).expect("json");
        assert_eq!(
            v["courierRequest"]["headers"]["x-bin"][0],
            json!({"base64": "Yf9i"})
        );
    }

    #[test]
    fn multiline_json_is_reencoded_and_binary_goes_base64() {
        let v: Value =
            serde_json::from_str(&custom_record(&event(b"{\n\"a\": 1\n}"), &facts(), &W))
                .expect("json");
        assert_eq!(v["data"], json!({"a": 1}));
        let line = custom_record(&event(b"\x00\xffnot json"), &facts(), &W);
        assert!(!line.contains('\n'));
        let v: Value = serde_json::from_str(&line).expect("json");
        assert_eq!(v["data_base64"], "AP9ub3QganNvbg==");
        assert!(v.get("data").is_none());
    }
}

#[cfg(test)]
mod redaction {
    use super::*;
    use crate::event::{Outcome, Reason};
    use bytes::Bytes;

    #[test]
    fn redacted_headers_are_left_out_and_named_in_every_shape() {
        let e = NewEvent {
            id: "evt-9".into(),
            destination: "orders".into(),
            method: "POST".into(),
            path: "/".into(),
            headers: vec![
                ("cookie".into(), b"session=s3cr3t".to_vec()),
                ("x-keep".into(), b"1".to_vec()),
                ("cookie".into(), b"other=s3cr3t".to_vec()),
            ],
            body: Bytes::from_static(br#"{"id":"evt-9","specversion":"1.0"}"#),
            accepted_ms: 1_597_339_093_000,
        };
        let facts = Fate {
            reason: Reason::NonRetriableStatus,
            attempts: 1,
            last_outcome: Outcome::BadRequest,
            last_status: Some(400),
            last_attempt_ms: None,
            at_ms: 1_597_339_095_000,
        };
        let redact = ["cookie".to_string()];
        let w = Written {
            at_ms: 1_597_339_095_000,
            seq: 1,
            redact: &redact,
        };
        for (schema, request) in [
            (Schema::Custom, None),
            (Schema::Eventgrid, Some("courierRequest")),
            (Schema::Cloudevents, Some("courierrequest")),
        ] {
            let line = record(schema, &e, &facts, &w);
            assert!(!line.contains("s3cr3t"), "{schema:?}: {line}");
            let v: Value = serde_json::from_str(&line).expect("json");
            let r = request.map_or(&v, |k| &v[k]);
            assert_eq!(r["headers"], json!({"x-keep": "1"}), "{schema:?}");
            assert_eq!(r["redactedHeaders"], json!(["cookie"]), "{schema:?}");
        }
    }
}
