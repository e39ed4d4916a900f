//! Dead-letter record shapes, after Event Grid's examples. `custom` events
//! get an Event Grid envelope plus the original request (method, path,
//! forwarded headers) so that replay can rebuild it. A JSON body is embedded
//! verbatim when it fits on one line, so replay sends the same bytes.

use crate::clock::rfc3339;
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

pub fn custom_record(e: &NewEvent, facts: &Facts) -> String {
    let mut headers = Map::new();
    for (name, value) in &e.headers {
        let v = Value::String(String::from_utf8_lossy(value).into_owned());
        match headers.get_mut(name) {
            Some(Value::Array(list)) => list.push(v),
            Some(first) => *first = Value::Array(vec![first.take(), v]),
            None => {
                headers.insert(name.clone(), v);
            }
        }
    }
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
