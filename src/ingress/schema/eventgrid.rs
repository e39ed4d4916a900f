//! The Event Grid schema: the body is one event or an array of events, as
//! in Event Grid's publish API. Each event needs `id`, `subject`,
//! `eventType` and `eventTime`; `data`, `dataVersion`, `topic` and
//! `metadataVersion` are optional, as Event Grid's event schema has them
//! (Azure's Python SDK leaves `data` out when it is `None`), and any other
//! field is kept.
//!
//! Event Grid fills `topic`, `metadataVersion: "1"` and an empty
//! `dataVersion` in what it delivers, and receivers rely on them and on
//! `data` (the Node SDK's `EventGridDeserializer` refuses an event without
//! any of the four; the Python SDK's model marks `data` and `dataVersion`
//! required). So an event that lacks one gets it here, `data` as `null`,
//! before the journal: every attempt, dead letter and replay then shows the
//! same event, and a topic's copies all carry the topic's name. A field the
//! publisher set is never changed, and an event that has them all keeps
//! the app's bytes.

use super::fields::{Fields, object};
use super::{Event, SchemaError, essence, raw_events, slice_of};
use bytes::{BufMut, Bytes, BytesMut};
use http::HeaderMap;
use serde_json::value::RawValue;

/// Content types taken: JSON, or none (Event Grid's clients send
/// `application/json`; a bare `curl --data-binary` sends nothing useful).
const ACCEPTED: &str = "application/json (or no Content-Type)";

const METADATA_VERSION: &[u8] = br#""metadataVersion":"1","#;
/// What Event Grid delivers for a `dataVersion` left out: an empty one.
const DATA_VERSION: &[u8] = br#""dataVersion":"","#;
/// What a receiver's parser needs for `data` left out.
const DATA: &[u8] = br#""data":null,"#;

/// The events of one request; `topic` is the route's Event Grid topic,
/// given to events that name none.
pub fn parse(headers: &HeaderMap, body: &Bytes, topic: &str) -> Result<Vec<Event>, SchemaError> {
    if let Some(media) = essence(headers)
        && media != "application/json"
    {
        return Err(SchemaError::ContentType {
            got: media,
            schema: "eventgrid",
            expected: ACCEPTED,
        });
    }
    let raws = raw_events(body, true)?;
    let mut events = Vec::with_capacity(raws.len());
    let mut lacking = Vec::new();
    for (index, raw) in raws.iter().enumerate() {
        let map = object(index, raw.get())?;
        let f = Fields { index, map: &map };
        let id = f.id("id")?;
        let subject = f.string("subject")?.to_string();
        let event_type = f.string("eventType")?.to_string();
        let time = f.string("eventTime")?;
        f.time("eventTime", time)?;
        let has_data = f.map.contains_key("data");
        let has_data_version = f.optional_text("dataVersion")?.is_some();
        let has_topic = f.optional("topic")?.is_some();
        let has_version = match f.optional("metadataVersion")? {
            Some("1") => true,
            Some(v) => {
                return Err(f.invalid(
                    "metadataVersion",
                    format!("must be \"1\" when given, got {v:?}"),
                ));
            }
            None => false,
        };
        if !(has_topic && has_version && has_data && has_data_version) {
            lacking.push(Lacks {
                index,
                raw,
                topic: !has_topic,
                version: !has_version,
                data: !has_data,
                data_version: !has_data_version,
            });
        }
        events.push(Event {
            id,
            event_type,
            subject: Some(subject),
            body: slice_of(body, raw),
        });
    }
    fill(&mut events, &lacking, topic);
    Ok(events)
}

/// An event without `topic`, `metadataVersion`, `data` or `dataVersion`,
/// as received.
struct Lacks<'a> {
    index: usize,
    raw: &'a RawValue,
    topic: bool,
    version: bool,
    data: bool,
    data_version: bool,
}

impl Lacks<'_> {
    /// The fields to write at the front of the object (empty where the
    /// event has its own), `topic_field` being the route's `topic`.
    fn stamps<'s>(&self, topic_field: &'s [u8]) -> [&'s [u8]; 4] {
        let pick = |lacks: bool, field: &'s [u8]| if lacks { field } else { &[][..] };
        [
            pick(self.topic, topic_field),
            pick(self.version, METADATA_VERSION),
            pick(self.data, DATA),
            pick(self.data_version, DATA_VERSION),
        ]
    }

    /// The event's length once stamped.
    fn len(&self, topic_field: &[u8]) -> usize {
        let stamps = self.stamps(topic_field);
        self.raw.get().len() + stamps.iter().map(|s| s.len()).sum::<usize>()
    }
}

/// Writes the fields each lacking event needs at the front of its object,
/// all into one buffer that the events then share (one allocation per
/// request, not per event).
fn fill(events: &mut [Event], lacking: &[Lacks], topic: &str) {
    if lacking.is_empty() {
        return;
    }
    let topic_field = format!("\"topic\":{},", serde_json::Value::from(topic));
    let topic_field = topic_field.as_bytes();
    let mut buf = BytesMut::with_capacity(lacking.iter().map(|l| l.len(topic_field)).sum());
    for l in lacking {
        // A RawValue holds no surrounding whitespace, and parsed as an
        // object it opens with `{` and has fields (the required ones), so
        // a field and its comma go right after the brace.
        let (brace, fields) = l.raw.get().as_bytes().split_at(1);
        buf.put_slice(brace);
        for stamp in l.stamps(topic_field) {
            buf.put_slice(stamp);
        }
        buf.put_slice(fields);
    }
    let mut filled = buf.freeze();
    for l in lacking {
        events[l.index].body = filled.split_to(l.len(topic_field));
    }
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
        parse(&HeaderMap::new(), &Bytes::from(v.to_string()), "/courier/t")
    }

    #[test]
    fn one_event_or_an_array_keeps_the_apps_bytes() {
        let body = Bytes::from_static(
            b"{\"id\":\"a\", \"subject\":\"s\",\"eventType\":\"T\",\"eventTime\":\"2025-01-31T12:00:00Z\",\"data\":null,\"dataVersion\":\"1\",\"topic\":\"t\",\"metadataVersion\":\"1\",\"extra\":[1]}\n",
        );
        let events = parse(&HeaderMap::new(), &body, "/courier/t").expect("valid");
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].id, "a");
        assert_eq!(events[0].event_type, "T");
        assert_eq!(events[0].subject.as_deref(), Some("s"));
        assert_eq!(events[0].body, body.slice(..body.len() - 1));

        assert_eq!(
            events[0].body.as_ptr(),
            body.as_ptr(),
            "a slice of the request, not a copy"
        );

        let whole = |id: &str| {
            let mut e = event(id);
            e["topic"] = json!("/theirs");
            e["metadataVersion"] = json!("1");
            e
        };
        let list = json!([whole("e1"), whole("e2"), whole("e3")]);
        let events = parse_json(&list).expect("valid");
        let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["e1", "e2", "e3"]);
        let second: Value = serde_json::from_slice(&events[1].body).expect("json");
        assert_eq!(second, whole("e2"));
    }

    #[test]
    fn topic_and_metadata_version_are_added_where_missing_and_never_changed() {
        let mut only_topic = event("t");
        only_topic["topic"] = json!("/publisher/topic");
        let mut only_version = event("v");
        only_version["metadataVersion"] = json!("1");
        let mut both = event("b");
        both["topic"] = json!("/theirs");
        both["metadataVersion"] = json!("1");
        let list = json!([event("n"), only_topic, only_version, both]);
        let body = Bytes::from(list.to_string());
        let topic = r#"/courier/a "quoted" \ name"#;
        let events = parse(&HeaderMap::new(), &body, topic).expect("valid");
        let read: Vec<Value> = events
            .iter()
            .map(|e| serde_json::from_slice(&e.body).expect("still JSON"))
            .collect();
        let want = |mut e: Value, t: &str| {
            e["topic"] = json!(t);
            e["metadataVersion"] = json!("1");
            e
        };
        assert_eq!(read[0], want(event("n"), topic));
        assert_eq!(read[1], want(event("t"), "/publisher/topic"));
        assert_eq!(read[2], want(event("v"), topic));
        assert_eq!(read[3], want(event("b"), "/theirs"));
        let inside = |e: &Event| {
            let at = e.body.as_ptr() as usize;
            (body.as_ptr() as usize..body.as_ptr() as usize + body.len()).contains(&at)
        };
        assert!(inside(&events[3]), "a whole event keeps the app's bytes");
        assert!(!inside(&events[0]));
        // Filled once: the filled event reads back as itself.
        for e in &events {
            let again = parse(&HeaderMap::new(), &e.body, "/other").expect("valid");
            assert_eq!(again[0].body, e.body);
        }
    }

    #[test]
    fn every_required_field_missing_is_named_with_its_index() {
        for field in ["id", "subject", "eventType", "eventTime"] {
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
            if field == "dataVersion" {
                // What Event Grid itself delivers when none was given.
                assert!(parse_json(&empty).is_ok());
                continue;
            }
            let (index, named, problem) = field_error(parse_json(&empty));
            assert_eq!((index, named.as_str()), (0, field));
            assert_eq!(problem, Problem::Empty(field.into()));
        }
    }

    #[test]
    fn data_may_be_any_json() {
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

    /// As Event Grid's schema has them: an event without `data` (the
    /// Python SDK's `EventGridEvent(data=None)`) or `dataVersion` is taken,
    /// and gets `"data": null` and `"dataVersion": ""` for its receivers;
    /// one that has them keeps its own, `null` and `""` included.
    #[test]
    fn data_and_data_version_left_out_are_stamped_null_and_empty() {
        let without = |fields: &[&str]| {
            let mut e = event("e0");
            e["topic"] = json!("/theirs");
            e["metadataVersion"] = json!("1");
            for f in fields {
                e.as_object_mut().expect("object").remove(*f);
            }
            e
        };
        let list = json!([
            without(&["data"]),
            without(&["dataVersion"]),
            without(&["data", "dataVersion", "topic"]),
            without(&[]),
        ]);
        let body = Bytes::from(list.to_string());
        let events = parse(&HeaderMap::new(), &body, "/courier/t").expect("valid");
        let read: Vec<Value> = events
            .iter()
            .map(|e| serde_json::from_slice(&e.body).expect("still JSON"))
            .collect();
        let with = |mut e: Value, data: Value, version: &str| {
            e["data"] = data;
            e["dataVersion"] = json!(version);
            e
        };
        assert_eq!(read[0], with(without(&[]), json!(null), "1.0"));
        assert_eq!(read[1], with(without(&[]), json!({"order": 1}), ""));
        let mut all = with(without(&[]), json!(null), "");
        all["topic"] = json!("/courier/t");
        assert_eq!(read[2], all);
        assert_eq!(read[3], without(&[]));
        let inside = |e: &Event| {
            let at = e.body.as_ptr() as usize;
            (body.as_ptr() as usize..body.as_ptr() as usize + body.len()).contains(&at)
        };
        assert!(inside(&events[3]), "a whole event keeps the app's bytes");
        assert!(!inside(&events[0]) && !inside(&events[1]));
        // Stamped once: a stamped event reads back as itself.
        for e in &events {
            let again = parse(&HeaderMap::new(), &e.body, "/other").expect("valid");
            assert_eq!(again[0].body, e.body);
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
            parse(
                &HeaderMap::new(),
                &Bytes::from_static(b"[{\"id\":"),
                "/courier/t"
            ),
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
            let r = parse(&h, &body, "/courier/t");
            assert_eq!(r.is_ok(), ok, "{ct}: {r:?}");
            if !ok {
                assert!(matches!(r, Err(SchemaError::ContentType { .. })));
            }
        }
    }
}
