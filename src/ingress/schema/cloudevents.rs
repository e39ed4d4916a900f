//! The CloudEvents schema (specversion 1.0) in its three HTTP modes:
//! structured (`application/cloudevents+json`, one event), batch
//! (`application/cloudevents-batch+json`, an array) and binary (`ce-*`
//! headers, the body is the data). Binary mode is turned into the
//! structured JSON form here, so that the journal, delivery and dead
//! letters only ever see one shape.

use super::fields::{Fields, object};
use super::{Event, SchemaError, essence, is_json, raw_events, slice_of};
use base64::Engine;
use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Map, Value};

pub const STRUCTURED: &str = "application/cloudevents+json";
pub const BATCH: &str = "application/cloudevents-batch+json";

/// Attributes of the CloudEvents 1.0 core; any other is an extension.
const CORE: [&str; 8] = [
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "datacontenttype",
    "dataschema",
];

pub fn parse(headers: &HeaderMap, body: &Bytes) -> Result<Vec<Event>, SchemaError> {
    let media = essence(headers);
    match media.as_deref() {
        Some(STRUCTURED) => structured(body, false),
        Some(BATCH) => structured(body, true),
        _ if headers.contains_key("ce-specversion") => Ok(vec![binary(headers, body)?]),
        other => Err(SchemaError::ContentType {
            got: other.unwrap_or("(none)").to_string(),
            schema: "cloudevents",
            expected: "application/cloudevents+json, application/cloudevents-batch+json, or binary mode (ce-specversion and the other ce-* headers)",
        }),
    }
}

fn structured(body: &Bytes, batch: bool) -> Result<Vec<Event>, SchemaError> {
    raw_events(body, batch)?
        .into_iter()
        .enumerate()
        .map(|(index, raw)| {
            let map = object(index, raw.get())?;
            let (id, event_type, subject) = validate(&Fields { index, map: &map })?;
            Ok(Event {
                id,
                event_type,
                subject,
                body: slice_of(body, raw),
            })
        })
        .collect()
}

/// Checks one event's attributes; returns its id, type and subject.
fn validate(f: &Fields) -> Result<(String, String, Option<String>), SchemaError> {
    let version = f.string("specversion")?;
    if version != "1.0" {
        return Err(f.invalid("specversion", format!("must be \"1.0\", got {version:?}")));
    }
    let id = f.id("id")?;
    f.string("source")?;
    let event_type = f.string("type")?.to_string();
    let subject = f.optional("subject")?.map(str::to_string);
    f.optional("datacontenttype")?;
    f.optional("dataschema")?;
    if let Some(time) = f.optional("time")? {
        f.time("time", time)?;
    }
    if let Some(b64) = f.map.get("data_base64") {
        if !b64.is_string() {
            return Err(f.error(
                "data_base64",
                super::Problem::Type {
                    field: "data_base64".into(),
                    expected: "a base64 string",
                },
            ));
        }
        if f.map.contains_key("data") {
            return Err(f.invalid("data_base64", "cannot be given beside \"data\"".into()));
        }
    }
    for (name, value) in f.map {
        if name == "data" || name == "data_base64" || CORE.contains(&name.as_str()) {
            continue;
        }
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(f.invalid(
                name,
                "is not a valid attribute name: use lowercase letters a-z and digits 0-9".into(),
            ));
        }
        if value.is_object() || value.is_array() {
            return Err(f.error(
                name,
                super::Problem::Type {
                    field: name.clone(),
                    expected: "a string, number or boolean (an extension attribute)",
                },
            ));
        }
    }
    Ok((id, event_type, subject))
}

/// Binary mode: attributes from the percent-encoded `ce-*` headers,
/// `datacontenttype` from `Content-Type`, and the body as `data` (JSON
/// types), a string (`text/*`) or `data_base64` (anything else).
fn binary(headers: &HeaderMap, body: &Bytes) -> Result<Event, SchemaError> {
    let mut map = Map::new();
    let field = |name: &str, why: String| SchemaError::Field {
        index: 0,
        field: name.to_string(),
        problem: super::Problem::Invalid {
            field: name.to_string(),
            why,
        },
    };
    for (name, value) in headers {
        let Some(attr) = name.as_str().strip_prefix("ce-") else {
            continue;
        };
        // Either would sit beside the body's own `data` or `data_base64`
        // in the structured event that delivery sends on.
        if attr == "data" || attr == "data_base64" {
            return Err(field(
                attr,
                format!("is reserved: in binary mode the body is the data (header ce-{attr})"),
            ));
        }
        let decoded = percent_decode(value.as_bytes()).ok_or_else(|| {
            field(
                attr,
                format!("must be percent-encoded UTF-8 (header ce-{attr})"),
            )
        })?;
        map.insert(attr.to_string(), Value::String(decoded));
    }
    let content_type = headers
        .get(http::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if let Some(ct) = &content_type {
        map.insert("datacontenttype".into(), Value::String(ct.clone()));
    }
    let (id, event_type, subject) = validate(&Fields {
        index: 0,
        map: &map,
    })?;
    let media = essence(headers).unwrap_or_default();
    let mut data = None;
    if !body.is_empty() {
        if is_json(&media) {
            let raw: &serde_json::value::RawValue = serde_json::from_slice(body).map_err(|e| {
                field(
                    "data",
                    format!("must be valid JSON as the Content-Type says ({e})"),
                )
            })?;
            data = Some(format!("\"data\":{}", raw.get()));
        } else if let Some(text) = media
            .starts_with("text/")
            .then(|| std::str::from_utf8(body).ok())
            .flatten()
        {
            map.insert("data".into(), Value::String(text.to_string()));
        } else {
            let b64 = base64::engine::general_purpose::STANDARD.encode(body);
            map.insert("data_base64".into(), Value::String(b64));
        }
    }
    // `map` is never empty (it holds at least the required attributes), so
    // the raw JSON data is spliced in before its closing brace.
    let mut json = Value::Object(map).to_string();
    if let Some(data) = data {
        json.pop();
        json.push(',');
        json.push_str(&data);
        json.push('}');
    }
    Ok(Event {
        id,
        event_type,
        subject,
        body: Bytes::from(json),
    })
}

/// Percent-decoding of a header value (CloudEvents HTTP binding 3.1.3.2);
/// `None` when an escape is broken or the result is not UTF-8.
fn percent_decode(value: &[u8]) -> Option<String> {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        if value[i] == b'%' {
            let hi = hex(*value.get(i + 1)?)?;
            let lo = hex(*value.get(i + 2)?)?;
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(value[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::schema::Problem;
    use crate::ingress::schema::field_error;
    use crate::test_headers as headers;
    use serde_json::json;

    fn event(id: &str) -> Value {
        json!({
            "specversion": "1.0",
            "id": id,
            "source": "/shop",
            "type": "shop.order.created",
            "subject": "orders/1",
            "time": "2025-01-31T12:00:00Z",
            "datacontenttype": "application/json",
            "data": {"order": 1},
        })
    }

    fn send(content_type: &str, body: &Value) -> Result<Vec<Event>, SchemaError> {
        parse(
            &headers(&[("content-type", content_type)]),
            &Bytes::from(body.to_string()),
        )
    }

    const BINARY: [(&str, &str); 4] = [
        ("ce-specversion", "1.0"),
        ("ce-id", "b1"),
        ("ce-source", "/shop"),
        ("ce-type", "shop.order.created"),
    ];

    fn binary_with(extra: &[(&str, &str)], body: &'static [u8]) -> Result<Value, SchemaError> {
        let mut pairs = BINARY.to_vec();
        pairs.extend_from_slice(extra);
        let events = parse(&headers(&pairs), &Bytes::from_static(body))?;
        assert_eq!(events.len(), 1);
        Ok(serde_json::from_slice(&events[0].body).expect("structured json"))
    }

    #[test]
    fn structured_and_batch_keep_the_apps_bytes() {
        let one = send(STRUCTURED, &event("c1")).expect("valid");
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].id, "c1");
        assert_eq!(one[0].event_type, "shop.order.created");
        assert_eq!(one[0].subject.as_deref(), Some("orders/1"));
        assert_eq!(one[0].body, Bytes::from(event("c1").to_string()));
        let batch = send(
            &format!("{BATCH}; charset=utf-8"),
            &json!([event("c1"), event("c2")]),
        )
        .expect("valid");
        let ids: Vec<&str> = batch.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["c1", "c2"]);
        let mut minimal = event("c3");
        for optional in ["subject", "time", "datacontenttype", "data"] {
            minimal.as_object_mut().expect("object").remove(optional);
        }
        let parsed = send(STRUCTURED, &minimal).expect("valid");
        assert_eq!(parsed[0].subject, None);
    }

    #[test]
    fn structured_takes_one_event_and_batch_needs_events() {
        assert!(matches!(
            send(STRUCTURED, &json!([event("c1")])),
            Err(SchemaError::Shape(_))
        ));
        assert_eq!(send(BATCH, &json!([])), Err(SchemaError::Empty));
        assert_eq!(
            send(BATCH, &json!([event("c1"), "x"])),
            Err(SchemaError::NotObject { index: 1 })
        );
    }

    #[test]
    fn every_required_attribute_missing_or_mistyped_is_named_with_its_index() {
        for field in ["specversion", "id", "source", "type"] {
            let mut bad = event("c2");
            bad.as_object_mut().expect("object").remove(field);
            let body = json!([event("c0"), event("c1"), bad]);
            let (index, named, problem) = field_error(send(BATCH, &body));
            assert_eq!((index, named.as_str()), (2, field));
            assert_eq!(problem, Problem::Missing(field.into()));
            assert_eq!(
                send(BATCH, &body).expect_err("refused").to_string(),
                format!("event 2: missing required field \"{field}\"")
            );
            for wrong in [json!(1), json!(null), json!({}), json!([]), json!(false)] {
                let mut bad = event("c1");
                bad[field] = wrong.clone();
                let (index, named, problem) = field_error(send(BATCH, &json!([event("c0"), bad])));
                assert_eq!((index, named.as_str()), (1, field), "{wrong}");
                assert!(matches!(problem, Problem::Type { .. }), "{problem:?}");
            }
            let mut empty = event("c0");
            empty[field] = json!("");
            let (_, named, problem) = field_error(send(STRUCTURED, &empty));
            assert_eq!(named, field);
            assert_eq!(problem, Problem::Empty(field.into()));
        }
    }

    #[test]
    fn specversion_must_be_1_0() {
        for version in ["0.3", "1", "1.0.0"] {
            let mut bad = event("c0");
            bad["specversion"] = json!(version);
            let (_, field, problem) = field_error(send(STRUCTURED, &bad));
            assert_eq!(field, "specversion");
            assert!(matches!(problem, Problem::Invalid { .. }));
        }
        let mut h = BINARY.to_vec();
        h[0] = ("ce-specversion", "0.3");
        let (_, field, _) = field_error(parse(&headers(&h), &Bytes::new()));
        assert_eq!(field, "specversion");
    }

    #[test]
    fn optional_attributes_and_extensions_are_checked() {
        for (field, value) in [
            ("time", json!("noon")),
            ("subject", json!("")),
            ("dataschema", json!(5)),
            ("datacontenttype", json!(null)),
            ("Bad-Name", json!("x")),
            ("traceparent", json!({"a": 1})),
            ("data_base64", json!(12)),
        ] {
            let mut bad = event("c0");
            bad.as_object_mut().expect("object").remove("data");
            bad[field] = value;
            let (_, named, _) = field_error(send(STRUCTURED, &bad));
            assert_eq!(named, field);
        }
        let mut both = event("c0");
        both["data_base64"] = json!("AAEC");
        let (_, named, _) = field_error(send(STRUCTURED, &both));
        assert_eq!(named, "data_base64");
        let mut ext = event("c0");
        ext["traceparent"] = json!("00-abc");
        ext["priority"] = json!(3);
        assert!(send(STRUCTURED, &ext).is_ok());
    }

    #[test]
    fn binary_json_data_becomes_structured_with_the_data_as_json() {
        let v = binary_with(
            &[
                ("content-type", "application/json"),
                ("ce-subject", "orders/1"),
                ("ce-time", "2025-01-31T12:00:00Z"),
                ("ce-traceparent", "00-1"),
            ],
            b"{\"order\": 1, \"big\": 123456789012345678901234567890}",
        )
        .expect("valid");
        assert_eq!(
            v,
            json!({
                "specversion": "1.0", "id": "b1", "source": "/shop",
                "type": "shop.order.created", "subject": "orders/1",
                "time": "2025-01-31T12:00:00Z", "traceparent": "00-1",
                "datacontenttype": "application/json",
                "data": {"order": 1, "big": 123456789012345678901234567890.0},
            })
        );
        let events = parse(
            &headers(
                &[
                    BINARY.as_slice(),
                    &[("content-type", "application/vnd.x+json")],
                ]
                .concat(),
            ),
            &Bytes::from_static(b"{\"big\": 123456789012345678901234567890}"),
        )
        .expect("valid");
        let text = String::from_utf8(events[0].body.to_vec()).expect("utf-8");
        assert!(
            text.ends_with(",\"data\":{\"big\": 123456789012345678901234567890}}"),
            "{text}"
        );
    }

    #[test]
    fn binary_text_and_bytes_and_no_body() {
        let v = binary_with(&[("content-type", "text/plain; charset=utf-8")], b"hello\n")
            .expect("valid");
        assert_eq!(v["data"], "hello\n");
        assert_eq!(v["datacontenttype"], "text/plain; charset=utf-8");
        let v = binary_with(&[("content-type", "application/octet-stream")], b"\x00\xff")
            .expect("valid");
        assert_eq!(v["data_base64"], "AP8=");
        assert!(v.get("data").is_none());
        let v = binary_with(&[("content-type", "text/plain")], b"\xff").expect("valid");
        assert_eq!(v["data_base64"], "/w==");
        let v = binary_with(&[], b"").expect("valid");
        assert!(v.get("data").is_none() && v.get("data_base64").is_none());
        assert!(v.get("datacontenttype").is_none());
        let (_, field, _) = field_error(
            binary_with(&[("content-type", "application/json")], b"{not json").map(|_| vec![]),
        );
        assert_eq!(field, "data");
    }

    #[test]
    fn binary_headers_are_percent_decoded() {
        let v = binary_with(
            &[
                ("ce-subject", "caf%C3%A9%20%22au%20lait%22%25"),
                ("ce-source", "%2Fshop%2Feu"),
            ],
            b"",
        )
        .expect("valid");
        assert_eq!(v["subject"], "café \"au lait\"%");
        assert_eq!(v["source"], "/shop/eu");
        for broken in ["%", "%4", "%zz", "%C3"] {
            let (_, field, _) =
                field_error(binary_with(&[("ce-subject", broken)], b"").map(|_| vec![]));
            assert_eq!(field, "subject", "{broken}");
        }
        assert_eq!(percent_decode(b"a%41%62"), Some("aAb".into()));
    }

    #[test]
    fn binary_required_headers_names_and_reserved_data() {
        for (i, (name, _)) in BINARY.iter().enumerate().skip(1) {
            let mut h = BINARY.to_vec();
            h.remove(i);
            let (index, field, problem) = field_error(parse(&headers(&h), &Bytes::new()));
            let attr = &name[3..];
            assert_eq!((index, field.as_str()), (0, attr));
            assert_eq!(problem, Problem::Missing(attr.into()));
        }
        let (_, field, _) = field_error(binary_with(&[("ce-trace-id", "1")], b"").map(|_| vec![]));
        assert_eq!(field, "trace-id");
        let (_, field, _) = field_error(binary_with(&[("ce-data", "1")], b"").map(|_| vec![]));
        assert_eq!(field, "data");
        // Found by the ingress fuzz target (fuzz/seeds/ingress/crash-ce-binary):
        // accepted, it became an event that `data` and `data_base64` both fill.
        let (_, field, _) =
            field_error(binary_with(&[("ce-data_base64", "AAEC")], b"x").map(|_| vec![]));
        assert_eq!(field, "data_base64");
        let (_, field, _) = field_error(binary_with(&[("ce-time", "later")], b"").map(|_| vec![]));
        assert_eq!(field, "time");
    }

    #[test]
    fn content_types_decide_the_mode() {
        let body = Bytes::from(event("c0").to_string());
        for ct in ["application/json", "text/plain"] {
            let r = parse(&headers(&[("content-type", ct)]), &body);
            assert!(
                matches!(r, Err(SchemaError::ContentType { .. })),
                "{ct}: {r:?}"
            );
        }
        let r = parse(&HeaderMap::new(), &body);
        assert!(matches!(r, Err(SchemaError::ContentType { ref got, .. }) if got == "(none)"));
        // A structured content type wins over stray ce-* headers.
        let mut h = headers(&BINARY);
        h.insert(
            http::header::CONTENT_TYPE,
            STRUCTURED.parse().expect("value"),
        );
        let events = parse(&h, &body).expect("structured");
        assert_eq!(events[0].id, "c0");
    }
}
