//! `from_event` header paths: a dotted path of JSON object keys
//! (`subject`, `data.tenant`), checked once at config load and evaluated on
//! every attempt against the event being sent.
//!
//! Which event: the body when it is a JSON object; when it is an array (an
//! Event Grid delivery, a batch), its first element, so a batch's headers
//! come from its first event. What is taken: a string as is, a number or a
//! boolean as its JSON text. Everything else (no JSON, no such field, null,
//! an object or an array) gives no value, and the header is left out: a
//! header must never invent a value the event does not have.
//!
//! Segments are object keys only: a key that itself contains a dot cannot be
//! reached, and `items.0` looks for a key named `0`, not an array index.

use serde_json::Value;

/// A checked path: at least one segment, none empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPath {
    text: String,
    segments: Vec<String>,
}

/// Why a path written in the config is not usable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PathError {
    #[error("the path is empty: write a field of the event, like subject or data.tenant")]
    Empty,
    #[error("`{0}` has an empty segment: write dot-separated field names, like data.tenant")]
    EmptySegment(String),
}

/// Why an attempt carries no value for a `from_event` header (logged at
/// debug level; the value itself is never logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    NotJson,
    NoEvent,
    NoField,
    NotAScalar,
}

impl Missing {
    pub fn as_str(self) -> &'static str {
        match self {
            Missing::NotJson => "body is not JSON",
            Missing::NoEvent => "body is neither a JSON object nor a non-empty array",
            Missing::NoField => "no such field",
            Missing::NotAScalar => "field is null, an object or an array",
        }
    }
}

impl EventPath {
    pub fn parse(text: &str) -> Result<EventPath, PathError> {
        if text.is_empty() {
            return Err(PathError::Empty);
        }
        let segments: Vec<String> = text.split('.').map(str::to_string).collect();
        if segments.iter().any(String::is_empty) {
            return Err(PathError::EmptySegment(text.to_string()));
        }
        Ok(EventPath {
            text: text.to_string(),
            segments,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The field's text in the event of an already parsed body.
    pub fn lookup(&self, body: &Value) -> Result<String, Missing> {
        let event = match body {
            Value::Array(items) => items.first().ok_or(Missing::NoEvent)?,
            v @ Value::Object(_) => v,
            _ => return Err(Missing::NoEvent),
        };
        let mut at = event;
        for key in &self.segments {
            at = at
                .as_object()
                .and_then(|o| o.get(key))
                .ok_or(Missing::NoField)?;
        }
        match at {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            Value::Bool(b) => Ok(b.to_string()),
            Value::Null | Value::Object(_) | Value::Array(_) => Err(Missing::NotAScalar),
        }
    }
}

/// Parses a body for [`EventPath::lookup`]; `Err` when it is not JSON.
pub fn parse_body(body: &[u8]) -> Result<Value, Missing> {
    serde_json::from_slice(body).map_err(|_| Missing::NotJson)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn get(path: &str, body: Value) -> Result<String, Missing> {
        EventPath::parse(path).expect("valid path").lookup(&body)
    }

    #[test]
    fn paths_are_checked() {
        assert_eq!(EventPath::parse(""), Err(PathError::Empty));
        for bad in [".", "a.", ".a", "a..b"] {
            assert_eq!(
                EventPath::parse(bad),
                Err(PathError::EmptySegment(bad.into()))
            );
        }
        assert_eq!(
            EventPath::parse("data.tenant").map(|p| p.segments),
            Ok(vec!["data".to_string(), "tenant".to_string()])
        );
    }

    #[test]
    fn scalars_become_text() {
        let ev = json!({"subject": "/orders/1", "data": {"tenant": "acme", "n": 42, "x": 1.5, "ok": true}});
        assert_eq!(get("subject", ev.clone()), Ok("/orders/1".into()));
        assert_eq!(get("data.tenant", ev.clone()), Ok("acme".into()));
        assert_eq!(get("data.n", ev.clone()), Ok("42".into()));
        assert_eq!(get("data.x", ev.clone()), Ok("1.5".into()));
        assert_eq!(get("data.ok", ev), Ok("true".into()));
    }

    #[test]
    fn arrays_use_their_first_event() {
        let batch = json!([{"subject": "first"}, {"subject": "second"}]);
        assert_eq!(get("subject", batch), Ok("first".into()));
        assert_eq!(get("subject", json!([])), Err(Missing::NoEvent));
        assert_eq!(get("subject", json!("text")), Err(Missing::NoEvent));
    }

    #[test]
    fn missing_and_non_scalar_fields_give_nothing() {
        let ev = json!({"data": {"tenant": null, "obj": {}, "list": [1]}, "s": "x"});
        assert_eq!(get("nope", ev.clone()), Err(Missing::NoField));
        assert_eq!(get("data.nope", ev.clone()), Err(Missing::NoField));
        assert_eq!(get("s.deeper", ev.clone()), Err(Missing::NoField));
        assert_eq!(get("data.tenant", ev.clone()), Err(Missing::NotAScalar));
        assert_eq!(get("data.obj", ev.clone()), Err(Missing::NotAScalar));
        assert_eq!(get("data.list", ev.clone()), Err(Missing::NotAScalar));
        assert_eq!(get("data.list.0", ev), Err(Missing::NoField));
        assert_eq!(parse_body(b"not json"), Err(Missing::NotJson));
    }
}
