//! Dead-letter record shapes per schema, after Event Grid's examples
//! (SPEC §4.6). Every record lets a replay rebuild the original request:
//!
//! - `eventgrid`: the event's own fields plus `deadLetterReason`,
//!   `deliveryAttempts`, `lastDeliveryOutcome`, `lastHttpStatusCode`,
//!   `publishTime`, `lastDeliveryAttemptTime`, and `courierRequest`
//!   (`method`, `path`, forwarded `headers`) for the rest of the request.
//! - `cloudevents`: the event plus the same fields in lower case
//!   (CloudEvents attribute names), `courierrequest` likewise.
//! - `custom`: an Event Grid envelope plus the original request (method,
//!   path, forwarded headers) at the top level.
//!
//! Header values are kept byte for byte: a UTF-8 value is a JSON string, a
//! value that is not UTF-8 (HTTP allows any octet but control characters)
//! is `{"base64": "<its bytes>"}`, since a string would have to replace its
//! bytes with U+FFFD and replay could not rebuild the request.
//!
//! The event's bytes are kept when it fits on one line (the fields are
//! spliced in before its closing brace), so replay sends the same bytes; a
//! multi-line event, or one that already has a field of the same name, is
//! re-encoded with the fields set.

use crate::clock::rfc3339;
use crate::config::Schema;
use crate::journal::NewEvent;
use crate::policy::Reason;
use base64::Engine;
use serde_json::{Map, Value, json};

/// What delivery knows when it gives an event up.
pub struct Facts<'a> {
    pub reason: Reason,
    pub attempts: u32,
    pub last_outcome: &'a str,
    pub last_status: Option<u16>,
    pub last_attempt_ms: Option<u64>,
}

/// The names of the dead-letter fields in one schema's spelling.
struct Names {
    reason: &'static str,
    attempts: &'static str,
    outcome: &'static str,
    status: &'static str,
    publish: &'static str,
    last_attempt: &'static str,
    request: &'static str,
}

const EVENTGRID: Names = Names {
    reason: "deadLetterReason",
    attempts: "deliveryAttempts",
    outcome: "lastDeliveryOutcome",
    status: "lastHttpStatusCode",
    publish: "publishTime",
    last_attempt: "lastDeliveryAttemptTime",
    request: "courierRequest",
};

const CLOUDEVENTS: Names = Names {
    reason: "deadletterreason",
    attempts: "deliveryattempts",
    outcome: "lastdeliveryoutcome",
    status: "lasthttpstatuscode",
    publish: "publishtime",
    last_attempt: "lastdeliveryattempttime",
    request: "courierrequest",
};

/// One JSON line for a dead-lettered event of a destination of `schema`.
pub fn record(schema: Schema, e: &NewEvent, facts: &Facts) -> String {
    let names = match schema {
        Schema::Custom => return custom_record(e, facts),
        Schema::Eventgrid => &EVENTGRID,
        Schema::Cloudevents => &CLOUDEVENTS,
    };
    // A body that is no JSON object was accepted while the destination
    // was `custom`: it keeps the custom shape, which replay understands.
    event_record(e, facts, names).unwrap_or_else(|| custom_record(e, facts))
}

fn event_record(e: &NewEvent, facts: &Facts, names: &Names) -> Option<String> {
    let Ok(Value::Object(mut event)) = serde_json::from_slice::<Value>(&e.body) else {
        return None;
    };
    let mut fields = Map::new();
    for (name, value) in [
        (names.reason, json!(facts.reason.as_str())),
        (names.attempts, json!(facts.attempts)),
        (names.outcome, json!(facts.last_outcome)),
        (names.status, json!(facts.last_status)),
        (names.publish, json!(rfc3339(e.accepted_ms))),
        (
            names.last_attempt,
            json!(facts.last_attempt_ms.map(rfc3339)),
        ),
        (
            names.request,
            json!({ "method": e.method, "path": e.path, "headers": headers_json(e) }),
        ),
    ] {
        fields.insert(name.to_string(), value);
    }
    let clash = fields.keys().any(|k| event.contains_key(k));
    let text = std::str::from_utf8(&e.body).ok()?.trim();
    let one_line = !text.contains(['\n', '\r']);
    if clash || !one_line || !text.ends_with('}') {
        event.extend(fields);
        return Some(Value::Object(event).to_string());
    }
    // Splice: `{<event fields>,<dead-letter fields>}`.
    let extra = Value::Object(fields).to_string();
    let inner = text[1..text.len() - 1].trim();
    let mut line = String::with_capacity(text.len() + extra.len());
    line.push('{');
    line.push_str(inner);
    if !inner.is_empty() {
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

/// The forwarded headers as an object; a repeated header becomes a list.
fn headers_json(e: &NewEvent) -> Map<String, Value> {
    let mut headers = Map::new();
    for (name, value) in &e.headers {
        let v = header_value(value);
        match headers.get_mut(name) {
            Some(Value::Array(list)) => list.push(v),
            Some(first) => *first = Value::Array(vec![first.take(), v]),
            None => {
                headers.insert(name.clone(), v);
            }
        }
    }
    headers
}

fn custom_record(e: &NewEvent, facts: &Facts) -> String {
    let headers = headers_json(e);
    let record = json!({
        "id": e.id,
        "eventTime": rfc3339(e.accepted_ms),
        "eventType": "Courier.Custom",
        "subject": e.destination,
        "dataVersion": "1.0",
        "metadataVersion": "1",
        "deadLetterReason": facts.reason.as_str(),
        "deliveryAttempts": facts.attempts,
        "lastDeliveryOutcome": facts.last_outcome,
        "lastHttpStatusCode": facts.last_status,
        "publishTime": rfc3339(e.accepted_ms),
        "lastDeliveryAttemptTime": facts.last_attempt_ms.map(rfc3339),
        "method": e.method,
        "path": e.path,
        "headers": headers,
    });
    let one_line = !e.body.contains(&b'\n') && !e.body.contains(&b'\r');
    let data = match serde_json::from_slice::<&serde_json::value::RawValue>(&e.body) {
        Ok(raw) if one_line => format!("\"data\":{}", raw.get()),
        Ok(_) => match serde_json::from_slice::<Value>(&e.body) {
            Ok(v) => format!("\"data\":{v}"),
            Err(_) => base64_data(&e.body),
        },
        Err(_) => base64_data(&e.body),
    };
    // Splice the data in last: `{...,"data":<body>}`.
    let mut line = record.to_string();
    line.pop();
    line.push(',');
    line.push_str(&data);
    line.push('}');
    line
}

fn base64_data(body: &[u8]) -> String {
    format!(
        "\"data_base64\":\"{}\"",
        base64::engine::general_purpose::STANDARD.encode(body)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
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

    fn facts() -> Facts<'static> {
        Facts {
            reason: Reason::NonRetriableStatus,
            attempts: 1,
            last_outcome: "BadRequest",
            last_status: Some(400),
            last_attempt_ms: Some(1_597_339_094_000),
        }
    }

    #[test]
    fn json_body_is_embedded_verbatim_with_the_envelope() {
        let line = custom_record(&event(br#"{"b": 2,  "a": 1}"#), &facts());
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
        let line = record(Schema::Eventgrid, &with_body(body), &facts());
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
        assert_eq!(
            v["courierRequest"],
            json!({"method": "POST", "path": "/x?y=1", "headers": {"x-trace": "t1"}})
        );
        // Replay: the record without courier's fields is the event.
        let mut replayed = v.as_object().expect("object").clone();
        for k in EVENTGRID_KEYS {
            replayed.remove(k);
        }
        let original: Value = serde_json::from_slice(body).expect("json");
        assert_eq!(Value::Object(replayed), original);
    }

    const EVENTGRID_KEYS: [&str; 7] = [
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
        let f = Facts {
            last_status: None,
            last_attempt_ms: None,
            ..facts()
        };
        let line = record(Schema::Cloudevents, &with_body(body), &f);
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
        );
        let v: Value = serde_json::from_str(&line).expect("json");
        assert_eq!(v["deliveryAttempts"], 1);
        assert_eq!(line.matches("deliveryAttempts").count(), 1, "{line}");
        let v: Value =
            serde_json::from_str(&record(Schema::Cloudevents, &with_body(b"plain"), &facts()))
                .expect("json");
        assert_eq!(v["eventType"], "Courier.Custom");
        assert_eq!(v["data_base64"], "cGxhaW4=");
    }

    /// What a replay does with a recorded header value.
    fn decode(v: &Value) -> Option<Vec<u8>> {
        match v {
            Value::String(s) => Some(s.as_bytes().to_vec()),
            Value::Object(o) => base64::engine::general_purpose::STANDARD
                .decode(o.get("base64")?.as_str()?)
                .ok(),
            _ => None,
        }
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
        let v: Value = serde_json::from_str(&custom_record(&e, &facts())).expect("json");
        let list = v["headers"]["x-bin"]
            .as_array()
            .expect("a repeated header is a list");
        assert_eq!(decode(&list[0]).as_deref(), Some(&b"a\xffb"[..]));
        assert_eq!(decode(&list[1]).as_deref(), Some(&b"text"[..]));
        let v: Value =
            serde_json::from_str(&record(Schema::Eventgrid, &e, &facts())).expect("json");
        assert_eq!(
            v["courierRequest"]["headers"]["x-bin"][0],
            json!({"base64": "Yf9i"})
        );
    }

    #[test]
    fn multiline_json_is_reencoded_and_binary_goes_base64() {
        let v: Value = serde_json::from_str(&custom_record(&event(b"{\n\"a\": 1\n}"), &facts()))
            .expect("json");
        assert_eq!(v["data"], json!({"a": 1}));
        let line = custom_record(&event(b"\x00\xffnot json"), &facts());
        assert!(!line.contains('\n'));
        let v: Value = serde_json::from_str(&line).expect("json");
        assert_eq!(v["data_base64"], "AP9ub3QganNvbg==");
        assert!(v.get("data").is_none());
    }
}
