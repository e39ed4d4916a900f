//! Ordering lanes: which lane an event belongs to. Events of one lane are
//! delivered in accept order (`journal::lanes` keeps the order); an event
//! whose key is absent has no lane and goes unordered.
//!
//! A lane is a 64-bit digest of the key, not the key: the journal keeps
//! one per pending event in memory, and a digest is the same size whatever
//! the key. Two keys with the same digest would share a lane: more order
//! than asked for, never less. Digests are never stored (the lanes are
//! rebuilt from the stored events at each start), so `std`'s hasher does.

use super::path::{EventPath, parse_body};
use std::hash::{Hash, Hasher};

/// What makes two events of a destination one lane (`ordering.key`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Key {
    /// The value of this request header (its lower-case name).
    Header(String),
    /// A field of the event's JSON, read as `from_event` headers read it
    /// (`subject`, `data.orderId`); for a one-segment path, a CloudEvent in
    /// binary mode gives it as its `ce-<field>` header.
    FromEvent(EventPath),
    /// One lane for the whole destination.
    Destination,
}

/// A lane: the digest of a key's value.
pub type Lane = u64;

/// An event's headers as the journal keeps them: name, value.
type Headers = [(String, Vec<u8>)];

/// The lane of the event with `headers` and `body` under `key`; `None`
/// when the event lacks the key. Given parts, not the journal's event, so
/// that the config can name a key without depending on the journal.
pub fn lane_of(key: &Key, headers: &Headers, body: &[u8]) -> Option<Lane> {
    match key {
        Key::Destination => Some(0),
        Key::Header(name) => header(headers, name).map(digest),
        Key::FromEvent(path) => {
            let field = parse_body(body)
                .ok()
                .and_then(|body| path.lookup(&body).ok());
            match field {
                Some(value) => Some(digest(value.as_bytes())),
                None if !path.as_str().contains('.') => {
                    header(headers, &format!("ce-{}", path.as_str())).map(digest)
                }
                None => None,
            }
        }
    }
}

fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

fn digest(value: &[u8]) -> Lane {
    let mut h = std::hash::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event's headers and body.
    struct Event(Vec<(String, Vec<u8>)>, Vec<u8>);

    fn event(headers: &[(&str, &str)], body: &str) -> Event {
        let headers = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect();
        Event(headers, body.as_bytes().to_vec())
    }

    fn lane_of(key: &Key, e: &Event) -> Option<Lane> {
        super::lane_of(key, &e.0, &e.1)
    }

    fn from_event(path: &str) -> Key {
        Key::FromEvent(EventPath::parse(path).expect("a valid path"))
    }

    #[test]
    fn a_header_key_is_its_value_whatever_the_name_case() {
        let key = Key::Header("ordering-key".into());
        let a = lane_of(&key, &event(&[("Ordering-Key", "order-1")], "{}"));
        let b = lane_of(&key, &event(&[("ordering-key", "order-1")], "x"));
        let c = lane_of(&key, &event(&[("ordering-key", "order-2")], "{}"));
        assert!(a.is_some());
        assert_eq!(a, b, "same value, same lane, whatever the body");
        assert_ne!(a, c);
        assert_eq!(lane_of(&key, &event(&[("other", "order-1")], "{}")), None);
    }

    #[test]
    fn a_field_key_reads_the_event_json_or_the_cloudevents_header() {
        let key = from_event("subject");
        let nested = r#"{"data":{"subject":"inner"},"subject":"orders/1","id":"x"}"#;
        let structured = lane_of(&key, &event(&[], nested));
        assert_eq!(
            structured,
            Some(digest(b"orders/1")),
            "the top level, not data's"
        );
        let binary = lane_of(&key, &event(&[("ce-subject", "orders/1")], "not json"));
        assert_eq!(
            binary, structured,
            "binary mode: the same subject, the same lane"
        );
        for unkeyed in [r#"{"id":"x"}"#, r#"{"subject":null}"#, "[]", "", "{"] {
            assert_eq!(lane_of(&key, &event(&[], unkeyed)), None, "{unkeyed}");
        }
        let deep = from_event("data.orderId");
        let a = lane_of(&deep, &event(&[], r#"{"data":{"orderId":42}}"#));
        assert_eq!(a, Some(digest(b"42")), "a number keys by its JSON text");
    }

    #[test]
    fn the_destination_key_puts_every_event_in_one_lane() {
        let key = Key::Destination;
        let a = lane_of(&key, &event(&[("a", "1")], "{}"));
        assert!(a.is_some());
        assert_eq!(a, lane_of(&key, &event(&[], "other")));
    }
}
