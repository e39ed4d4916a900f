//! The body and content type of one delivery, by schema (docs/batching.md): pure,
//! over a slice of event bodies so that batching can hand it several.
//! `eventgrid` is always a JSON array (an array of one without batching),
//! `cloudevents` is structured mode for one event and the batch format for
//! several, `custom` is the body as received (a JSON array when batched).

use crate::event::Schema;
use bytes::{BufMut, Bytes, BytesMut};
use http::HeaderValue;

pub const JSON: &str = "application/json";
pub const CLOUDEVENTS: &str = "application/cloudevents+json; charset=utf-8";
pub const CLOUDEVENTS_BATCH: &str = "application/cloudevents-batch+json; charset=utf-8";

/// What goes on the wire for a set of events.
#[derive(Debug, PartialEq)]
pub struct Shaped {
    pub body: Bytes,
    /// `None`: keep the app's own `Content-Type` (a single `custom` event).
    pub content_type: Option<HeaderValue>,
}

pub fn shape(schema: Schema, bodies: &[Bytes]) -> Shaped {
    match (schema, bodies) {
        (Schema::Custom, [one]) => Shaped {
            body: one.clone(),
            content_type: None,
        },
        (Schema::Cloudevents, [one]) => Shaped {
            body: one.clone(),
            content_type: Some(HeaderValue::from_static(CLOUDEVENTS)),
        },
        (_, many) => batch(schema, many),
    }
}

/// The batch shape whatever the count: a destination that batches always
/// sends arrays (a batch of one included), so its receiver parses one format.
pub fn batch(schema: Schema, bodies: &[Bytes]) -> Shaped {
    let content_type = match schema {
        Schema::Cloudevents => CLOUDEVENTS_BATCH,
        Schema::Eventgrid | Schema::Custom => JSON,
    };
    Shaped {
        body: array(bodies),
        content_type: Some(HeaderValue::from_static(content_type)),
    }
}

/// `[a,b,...]` from JSON values, their bytes kept.
fn array(bodies: &[Bytes]) -> Bytes {
    let len = bodies.iter().map(|b| b.len() + 1).sum::<usize>() + 1;
    let mut out = BytesMut::with_capacity(len);
    out.put_u8(b'[');
    for (i, body) in bodies.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_slice(body);
    }
    out.put_u8(b']');
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    #[test]
    fn eventgrid_is_always_an_array() {
        let one = shape(Schema::Eventgrid, &[b("{\"id\": \"a\"}")]);
        assert_eq!(one.body, b("[{\"id\": \"a\"}]"));
        assert_eq!(one.content_type, Some(HeaderValue::from_static(JSON)));
        let two = shape(
            Schema::Eventgrid,
            &[b("{\"id\":\"a\"}"), b("{\"id\":\"b\"}")],
        );
        assert_eq!(two.body, b("[{\"id\":\"a\"},{\"id\":\"b\"}]"));
    }

    #[test]
    fn cloudevents_is_structured_alone_and_batch_together() {
        let one = shape(Schema::Cloudevents, &[b("{\"id\":\"a\"}")]);
        assert_eq!(one.body, b("{\"id\":\"a\"}"));
        assert_eq!(
            one.content_type,
            Some(HeaderValue::from_static(CLOUDEVENTS))
        );
        let two = shape(
            Schema::Cloudevents,
            &[b("{\"id\":\"a\"}"), b("{\"id\":\"b\"}")],
        );
        assert_eq!(two.body, b("[{\"id\":\"a\"},{\"id\":\"b\"}]"));
        assert_eq!(
            two.content_type,
            Some(HeaderValue::from_static(CLOUDEVENTS_BATCH))
        );
    }

    #[test]
    fn custom_is_as_received_alone_and_an_array_together() {
        let one = shape(Schema::Custom, &[b("not json")]);
        assert_eq!(
            one,
            Shaped {
                body: b("not json"),
                content_type: None
            }
        );
        let two = shape(Schema::Custom, &[b("1"), b("{}")]);
        assert_eq!(two.body, b("[1,{}]"));
        assert_eq!(two.content_type, Some(HeaderValue::from_static(JSON)));
    }

    #[test]
    fn a_batch_of_one_is_still_an_array() {
        let one = batch(Schema::Custom, &[b("{}")]);
        assert_eq!(one.body, b("[{}]"));
        assert_eq!(one.content_type, Some(HeaderValue::from_static(JSON)));
        let one = batch(Schema::Cloudevents, &[b("{}")]);
        assert_eq!(one.body, b("[{}]"));
        assert_eq!(
            one.content_type,
            Some(HeaderValue::from_static(CLOUDEVENTS_BATCH))
        );
    }
}
