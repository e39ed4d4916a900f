//! The Event Grid schema: the body is one event or an array of events, as
//! in Event Grid's publish API. Each event needs `id`, `subject`,
//! `eventType`, `eventTime`, `data` and `dataVersion`; `topic` and
//! `metadataVersion` are optional and kept, as is any other field.

use super::fields::{Fields, object};
use super::{Event, SchemaError, essence, raw_events, slice_of};
use bytes::Bytes;
use http::HeaderMap;

/// Content types taken: JSON, or none (Event Grid's clients send
/// `application/json`; a bare `curl --data-binary` sends nothing useful).
const ACCEPTED: &str = "application/json (or no Content-Type)";

pub fn parse(headers: &HeaderMap, body: &Bytes) -> Result<Vec<Event>, SchemaError> {
    if let Some(media) = essence(headers)
        && media != "application/json"
    {
        return Err(SchemaError::ContentType {
            got: media,
            schema: "eventgrid",
            expected: ACCEPTED,
        });
    }
    raw_events(body, true)?
        .into_iter()
        .enumerate()
        .map(|(index, raw)| {
            let map = object(index, raw.get())?;
            let f = Fields { index, map: &map };
            let id = f.id("id")?;
            let subject = f.string("subject")?.to_string();
            let event_type = f.string("eventType")?.to_string();
            let time = f.string("eventTime")?;
            f.time("eventTime", time)?;
            f.present("data")?;
            f.string("dataVersion")?;
            f.optional("topic")?;
            if let Some(v) = f.optional("metadataVersion")?
                && v != "1"
            {
                return Err(f.invalid(
                    "metadataVersion",
                    format!("must be \"1\" when given, got {v:?}"),
                ));
            }
            Ok(Event {
                id,
                event_type,
                subject: Some(subject),
                body: slice_of(body, raw),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::schema::Problem;
    use crate::ingress::schema::field_error;
    use serde_json::{Value, json};

    fn event(id: &str) -> Value {
        json!({
            "id": id,
            "subject": "/orders/1",
            "eventType": "Shop.OrderCreated",
            "eventTime": "2025-01-31T12:00:00.1234567Z",
            "data": {"order": 1},
            "dataVersion": "1.0",
        })
    }

    fn parse_json(v: &Value) -> Result<Vec<Event>, SchemaError> {
        parse(&HeaderMap::new(), &Bytes::from(v.to_string()))
    }

    #[test]
    fn one_event_or_an_array_keeps_the_apps_bytes() {
        let body = Bytes::from_static(
            b"{\"id\":\"a\", \"subject\":\"s\",\"eventType\":\"T\",\"eventTime\":\"2025-01-31T12:00:00Z\",\"data\":null,\"dataVersion\":\"1\",\"topic\":\"t\",\"metadataVersion\":\"1\",\"extra\":[1]}\n",
        );
        let events = parse(&HeaderMap::new(), &body).expect("valid");
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].id, "a");
        assert_eq!(events[0].event_type, "T");
        assert_eq!(events[0].subject.as_deref(), Some("s"));
        assert_eq!(events[0].body, body.slice(..body.len() - 1));

        let list = json!([event("e1"), event("e2"), event("e3")]);
        let events = parse_json(&list).expect("valid");
        let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["e1", "e2", "e3"]);
        let second: Value = serde_json::from_slice(&events[1].body).expect("json");
        assert_eq!(second, event("e2"));
    }

    #[test]
    fn every_required_field_missing_is_named_with_its_index() {
        for field in [
            "id",
            "subject",
            "eventType",
            "eventTime",
            "data",
            "dataVersion",
        ] {
            let mut bad = event("e3");
            bad.as_object_mut().expect("object").remove(field);
            let list = json!([event("e0"), event("e1"), event("e2"), bad]);
            let (index, named, problem) = field_error(parse_json(&list));
            assert_eq!((index, named.as_str()), (3, field));
            assert_eq!(problem, Problem::Missing(field.into()));
            let message = parse_json(&list).expect_err("refused").to_string();
            assert_eq!(
                message,
                format!("event 3: missing required field \"{field}\"")
            );
        }
    }

    #[test]
    fn every_string_field_of_the_wrong_type_or_empty_is_refused() {
        for field in [
            "id",
            "subject",
            "eventType",
            "eventTime",
            "dataVersion",
            "topic",
            "metadataVersion",
        ] {
            for wrong in [
                json!(7),
                json!(null),
                json!({"a": 1}),
                json!(["x"]),
                json!(true),
            ] {
                let mut bad = event("e1");
                bad[field] = wrong.clone();
                let (index, named, problem) = field_error(parse_json(&json!([event("e0"), bad])));
                assert_eq!((index, named.as_str()), (1, field), "{wrong}");
                assert!(
                    matches!(
                        problem,
                        Problem::Type {
                            expected: "a string",
                            ..
                        }
                    ),
                    "{problem:?}"
                );
            }
            let mut empty = event("e0");
            empty[field] = json!("");
            let (index, named, problem) = field_error(parse_json(&empty));
            assert_eq!((index, named.as_str()), (0, field));
            assert_eq!(problem, Problem::Empty(field.into()));
        }
    }

    #[test]
    fn data_may_be_any_json_but_must_be_present() {
        for data in [
            json!(null),
            json!("text"),
            json!(3),
            json!([1, 2]),
            json!({}),
        ] {
            let mut ok = event("e0");
            ok["data"] = data;
            assert!(parse_json(&ok).is_ok());
        }
    }

    #[test]
    fn event_time_ids_and_metadata_version_are_checked() {
        let mut bad = event("e0");
        bad["eventTime"] = json!("31/01/2025 12:00");
        let (_, field, problem) = field_error(parse_json(&bad));
        assert_eq!(field, "eventTime");
        assert!(matches!(problem, Problem::Invalid { .. }));
        for id in ["x".repeat(257), "tab\there".into(), "é".into()] {
            let (_, field, _) = field_error(parse_json(&event(&id)));
            assert_eq!(field, "id");
        }
        let mut bad = event("e0");
        bad["metadataVersion"] = json!("2");
        let (_, field, _) = field_error(parse_json(&bad));
        assert_eq!(field, "metadataVersion");
    }

    #[test]
    fn non_objects_bad_json_and_empty_arrays_are_refused() {
        assert_eq!(
            parse_json(&json!([event("e0"), 5])),
            Err(SchemaError::NotObject { index: 1 })
        );
        assert_eq!(parse_json(&json!([])), Err(SchemaError::Empty));
        assert!(matches!(
            parse(&HeaderMap::new(), &Bytes::from_static(b"[{\"id\":")),
            Err(SchemaError::Malformed(_))
        ));
    }

    #[test]
    fn only_json_content_types_are_taken() {
        let body = Bytes::from(event("e0").to_string());
        for (ct, ok) in [
            ("application/json", true),
            ("application/json; charset=utf-8", true),
            ("text/plain", false),
            ("application/cloudevents+json", false),
            ("application/x-www-form-urlencoded", false),
        ] {
            let mut h = HeaderMap::new();
            h.insert(http::header::CONTENT_TYPE, ct.parse().expect("value"));
            let r = parse(&h, &body);
            assert_eq!(r.is_ok(), ok, "{ct}: {r:?}");
            if !ok {
                assert!(matches!(r, Err(SchemaError::ContentType { .. })));
            }
        }
    }
}
