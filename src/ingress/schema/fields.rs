//! Field checks shared by both schemas, each naming the event and field it
//! refuses.

use super::{Problem, SchemaError};
use crate::clock::rfc3339;
use serde_json::{Map, Value};

/// Longest event id accepted, as for the `custom` id headers: the id
/// becomes the `webhook-id` header of every attempt.
pub const MAX_ID: usize = crate::ingress::forward::MAX_ID;

/// One event's fields, with its index for error messages.
pub struct Fields<'a> {
    pub index: usize,
    pub map: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    pub fn error(&self, field: &str, problem: Problem) -> SchemaError {
        SchemaError::Field {
            index: self.index,
            field: field.to_string(),
            problem,
        }
    }

    /// A required, non-empty string.
    pub fn string(&self, name: &str) -> Result<&'a str, SchemaError> {
        match self.map.get(name) {
            None => Err(self.error(name, Problem::Missing(name.into()))),
            Some(v) => self.non_empty(name, v),
        }
    }

    /// An optional string: non-empty when present.
    pub fn optional(&self, name: &str) -> Result<Option<&'a str>, SchemaError> {
        self.map
            .get(name)
            .map(|v| self.non_empty(name, v))
            .transpose()
    }

    fn non_empty(&self, name: &str, v: &'a Value) -> Result<&'a str, SchemaError> {
        match v {
            Value::String(s) if s.is_empty() => Err(self.error(name, Problem::Empty(name.into()))),
            Value::String(s) => Ok(s),
            _ => Err(self.error(
                name,
                Problem::Type {
                    field: name.into(),
                    expected: "a string",
                },
            )),
        }
    }

    /// The event id: a required string that can travel as `webhook-id`.
    pub fn id(&self, name: &str) -> Result<String, SchemaError> {
        let id = self.string(name)?;
        if id.len() > MAX_ID || !id.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(self.invalid(
                name,
                format!("must be at most {MAX_ID} printable ASCII characters (it becomes the webhook-id header)"),
            ));
        }
        Ok(id.to_string())
    }

    /// A string holding an RFC 3339 date-time.
    pub fn time(&self, name: &str, value: &str) -> Result<(), SchemaError> {
        if rfc3339::valid(value) {
            Ok(())
        } else {
            Err(self.invalid(
                name,
                format!(
                    "must be an RFC 3339 date-time such as 2025-01-31T12:00:00Z, got {value:?}"
                ),
            ))
        }
    }

    /// An optional string that may be empty (Event Grid's `dataVersion`,
    /// which Event Grid itself stamps empty).
    pub fn optional_text(&self, name: &str) -> Result<Option<&'a str>, SchemaError> {
        match self.map.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.error(
                name,
                Problem::Type {
                    field: name.into(),
                    expected: "a string",
                },
            )),
        }
    }

    pub fn invalid(&self, name: &str, why: String) -> SchemaError {
        self.error(
            name,
            Problem::Invalid {
                field: name.into(),
                why,
            },
        )
    }
}

/// Parses one raw event into its fields.
pub fn object(index: usize, raw: &str) -> Result<Map<String, Value>, SchemaError> {
    match serde_json::from_str::<Value>(raw) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(SchemaError::NotObject { index }),
        Err(e) => Err(SchemaError::Malformed(e.to_string())),
    }
}
