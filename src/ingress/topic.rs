//! Topic fan-out (docs/publishing.md "Topics"): which subscribers get a copy of which
//! event. Pure, so every filter rule is unit tested here.
//!
//! Matching follows Event Grid's event subscription filter:
//! - `event_types`: the event's type (Event Grid `eventType`, CloudEvents
//!   `type`) equals one of them, ignoring case, as Event Grid compares
//!   event type names; absent = every type.
//! - `subject_begins_with` / `subject_ends_with`: a prefix / suffix of the
//!   subject, ignoring case unless `subject_case_sensitive: true` (Event
//!   Grid's `isSubjectCaseSensitive`, false by default). A CloudEvent
//!   without `subject` matches only subscribers without subject filters.
//! - all given conditions must hold; `{}` takes every event.

use super::schema::Event;
use crate::config::{Subscription, TopicSettings};

/// One copy to journal: event `event` (an index into the request's events)
/// for destination `destination`.
#[derive(Debug, Clone, PartialEq)]
pub struct EventCopy<'a> {
    pub event: usize,
    pub destination: &'a str,
}

/// The copies of one request, event by event and in subscriber order, and
/// the indexes of the events no subscriber took.
#[derive(Debug, Default, PartialEq)]
pub struct FanOut<'a> {
    pub copies: Vec<EventCopy<'a>>,
    pub unmatched: Vec<usize>,
}

pub fn fan_out<'a>(topic: &'a TopicSettings, events: &[Event]) -> FanOut<'a> {
    let mut out = FanOut::default();
    for (i, e) in events.iter().enumerate() {
        // Lowered once per event, not once per subscriber.
        let event_type = e.event_type.to_lowercase();
        let subject = e.subject.as_deref();
        let lowered = subject.map(str::to_lowercase);
        let before = out.copies.len();
        for s in &topic.subscribers {
            let subject = if s.subject_case_sensitive {
                subject
            } else {
                lowered.as_deref()
            };
            if matches(s, &event_type, subject) {
                out.copies.push(EventCopy {
                    event: i,
                    destination: &s.destination,
                });
            }
        }
        if out.copies.len() == before {
            out.unmatched.push(i);
        }
    }
    out
}

/// `event_type` is lower case; `subject` is lower case unless the
/// subscription is case sensitive (its own strings are stored the same way).
fn matches(s: &Subscription, event_type: &str, subject: Option<&str>) -> bool {
    let type_ok = s
        .event_types
        .as_ref()
        .is_none_or(|ts| ts.iter().any(|t| t == event_type));
    let begins_ok = s
        .subject_begins_with
        .as_deref()
        .is_none_or(|p| subject.is_some_and(|sub| sub.starts_with(p)));
    let ends_ok = s
        .subject_ends_with
        .as_deref()
        .is_none_or(|p| subject.is_some_and(|sub| sub.ends_with(p)));
    type_ok && begins_ok && ends_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Schema;
    use bytes::Bytes;

    fn sub(
        dest: &str,
        types: Option<&[&str]>,
        begins: Option<&str>,
        ends: Option<&str>,
    ) -> Subscription {
        Subscription {
            destination: dest.into(),
            event_types: types.map(|ts| ts.iter().map(|t| t.to_lowercase()).collect()),
            subject_begins_with: begins.map(str::to_lowercase),
            subject_ends_with: ends.map(str::to_lowercase),
            subject_case_sensitive: false,
        }
    }

    fn event(id: &str, event_type: &str, subject: Option<&str>) -> Event {
        Event {
            id: id.into(),
            event_type: event_type.into(),
            subject: subject.map(Into::into),
            body: Bytes::from_static(b"{}"),
        }
    }

    fn topic(subscribers: Vec<Subscription>) -> TopicSettings {
        TopicSettings {
            name: "shop".into(),
            schema: Schema::Eventgrid,
            eventgrid_topic: "/courier/shop".into(),
            subscribers,
        }
    }

    fn takers(t: &TopicSettings, e: Event) -> Vec<&str> {
        let events = [e];
        fan_out(t, &events)
            .copies
            .into_iter()
            .map(|c| c.destination)
            .collect()
    }

    #[test]
    fn each_matching_subscriber_gets_one_copy_in_order() {
        let t = topic(vec![
            sub("orders", Some(&["Shop.OrderCreated"]), None, None),
            sub("images", None, Some("/blobs/"), Some(".jpg")),
            sub("audit", None, None, None),
        ]);
        let events = [
            event("a", "Shop.OrderCreated", Some("/orders/1")),
            event("b", "Shop.BlobCreated", Some("/blobs/x.jpg")),
            event("c", "Shop.BlobCreated", Some("/blobs/x.png")),
        ];
        let f = fan_out(&t, &events);
        let got: Vec<(usize, &str)> = f.copies.iter().map(|c| (c.event, c.destination)).collect();
        assert_eq!(
            got,
            [
                (0, "orders"),
                (0, "audit"),
                (1, "images"),
                (1, "audit"),
                (2, "audit")
            ]
        );
        assert!(f.unmatched.is_empty());
    }

    #[test]
    fn events_no_subscriber_takes_are_listed_as_unmatched() {
        let t = topic(vec![sub("orders", Some(&["A", "B"]), None, None)]);
        let events = [
            event("x", "C", Some("s")),
            event("y", "b", Some("s")),
            event("z", "D", None),
        ];
        let f = fan_out(&t, &events);
        assert_eq!(
            f.copies,
            [EventCopy {
                event: 1,
                destination: "orders"
            }]
        );
        assert_eq!(f.unmatched, [0, 2]);
    }

    #[test]
    fn event_types_and_subjects_ignore_case_by_default() {
        let t = topic(vec![sub(
            "o",
            Some(&["Shop.OrderCreated"]),
            Some("/Orders/"),
            Some(".JSON"),
        )]);
        assert_eq!(
            takers(&t, event("1", "shop.ordercreated", Some("/orders/7.json"))),
            ["o"]
        );
        assert_eq!(
            takers(&t, event("2", "SHOP.ORDERCREATED", Some("/ORDERS/7.Json"))),
            ["o"]
        );
        assert!(takers(&t, event("3", "Shop.OrderCreated2", Some("/orders/7.json"))).is_empty());
    }

    #[test]
    fn a_case_sensitive_subscription_compares_subjects_exactly() {
        let mut s = sub("o", None, None, None);
        s.subject_begins_with = Some("/Orders/".into());
        s.subject_case_sensitive = true;
        let t = topic(vec![s]);
        assert_eq!(takers(&t, event("1", "T", Some("/Orders/1"))), ["o"]);
        assert!(takers(&t, event("2", "T", Some("/orders/1"))).is_empty());
    }

    #[test]
    fn every_condition_must_hold() {
        let t = topic(vec![sub("o", Some(&["T"]), Some("/a"), Some("z"))]);
        assert_eq!(takers(&t, event("1", "T", Some("/a-z"))), ["o"]);
        assert!(takers(&t, event("2", "U", Some("/a-z"))).is_empty());
        assert!(takers(&t, event("3", "T", Some("/b-z"))).is_empty());
        assert!(takers(&t, event("4", "T", Some("/a-y"))).is_empty());
    }

    #[test]
    fn an_event_without_subject_matches_only_subscribers_without_subject_filters() {
        let t = topic(vec![
            sub("begins", None, Some("/"), None),
            sub("ends", None, None, Some("x")),
            sub("typed", Some(&["T"]), None, None),
        ]);
        assert_eq!(takers(&t, event("1", "T", None)), ["typed"]);
    }

    #[test]
    fn case_folding_beyond_ascii_is_applied_to_both_sides() {
        let t = topic(vec![sub("o", None, Some("/Straße/Ä"), None)]);
        assert_eq!(takers(&t, event("1", "T", Some("/STRAßE/ä/1"))), ["o"]);
    }
}
