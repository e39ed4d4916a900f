//! `topics:` (docs/topics.md): fan-out after Event Grid topics and event
//! subscriptions. Checked after the destinations, since every subscriber
//! must be one of them, with the topic's schema.
//!
//! Why a subscriber's schema must equal the topic's: a copy is the app's
//! event as parsed at ingress (an Event Grid event or a CloudEvent), and the
//! destination's delivery shape and dead-letter record are chosen by its
//! schema. A `custom` destination would get an envelope it never asked for,
//! and a cloudevents one an Event Grid event; courier does not convert.

use super::schema::{Destination, Mode, PER_EVENT, Subscriber, Topic};
use super::settings::{Subscription, TopicSettings};
use super::validate::{Checker, NAME_RULE, eventgrid_topic};
use crate::event::Schema;
use crate::event::rules::valid_name;
use std::collections::BTreeMap;

pub(super) fn topics(
    c: &mut Checker,
    raw: &BTreeMap<String, Topic>,
    destinations: &BTreeMap<String, Destination>,
) -> Vec<TopicSettings> {
    raw.iter()
        .filter_map(|(name, t)| topic(c, name, t, destinations))
        .collect()
}

fn topic(
    c: &mut Checker,
    name: &str,
    t: &Topic,
    destinations: &BTreeMap<String, Destination>,
) -> Option<TopicSettings> {
    let p = format!("topics.{name}");
    if !valid_name(name) {
        c.err(&p, format!("name `{name}` {NAME_RULE}"));
    }
    if destinations.contains_key(name) {
        c.err(
            &p,
            format!("`{name}` is also a destination: a name is either a topic or a destination, since the app posts to /{name}"),
        );
    }
    let schema = match t.schema {
        None => {
            c.err(&p, "needs `schema: eventgrid` or `schema: cloudevents`");
            None
        }
        Some(Schema::Custom) => {
            c.err(
                format!("{p}.schema"),
                "custom is not a topic schema: filters need each event's id, type and subject; use eventgrid or cloudevents",
            );
            None
        }
        Some(s) => Some(s),
    };
    if t.subscribers.is_empty() {
        c.err(
            format!("{p}.subscribers"),
            "at least one subscriber is needed: a destination name, with a filter or `{}` for every event",
        );
    }
    let mut subscribers = Vec::new();
    for (dest, sub) in &t.subscribers {
        let sp = format!("{p}.subscribers.{dest}");
        match destinations.get(dest) {
            None => {
                let known: Vec<&str> = destinations.keys().map(String::as_str).collect();
                c.err(
                    &sp,
                    format!(
                        "`{dest}` is not a configured destination: subscribers are destinations ({})",
                        known.join(", ")
                    ),
                );
            }
            Some(d) if d.mode == Mode::Passthrough => {
                c.err(
                    &sp,
                    format!(
                        "destination `{dest}` is passthrough: a topic's copies are journaled and answered 202 at once, so a subscriber must be mode durable"
                    ),
                );
            }
            Some(d) if d.url == PER_EVENT => {
                c.err(
                    &sp,
                    format!(
                        "destination `{dest}` has url per_event: a topic's copies name no endpoint, so a subscriber needs a fixed url"
                    ),
                );
            }
            Some(d) => {
                if let Some(s) = schema.filter(|&s| s != d.schema) {
                    c.err(
                        &sp,
                        format!(
                            "destination `{dest}` has schema {}, topic `{name}` has {}: a subscriber gets the topic's events unchanged, so its schema must be {}",
                            d.schema.as_str(),
                            s.as_str(),
                            s.as_str()
                        ),
                    );
                }
            }
        }
        if let Some(s) = subscription(c, &sp, dest, sub) {
            subscribers.push(s);
        }
    }
    let eventgrid_topic = eventgrid_topic(c, &p, name, schema, t.eventgrid_topic.as_deref());
    Some(TopicSettings {
        name: name.to_string(),
        schema: schema?,
        eventgrid_topic,
        subscribers,
    })
}

/// The filter, normalised for matching (see `Subscription`); `None` after
/// reporting an empty value.
fn subscription(c: &mut Checker, p: &str, dest: &str, s: &Subscriber) -> Option<Subscription> {
    let mut ok = true;
    if let Some(types) = &s.event_types {
        if types.is_empty() {
            c.err(
                format!("{p}.event_types"),
                "must list at least one event type: omit the key to take every type",
            );
            ok = false;
        }
        for (i, t) in types.iter().enumerate() {
            if t.trim().is_empty() {
                c.err(format!("{p}.event_types[{i}]"), "must not be empty");
                ok = false;
            }
        }
    }
    for (key, v) in [
        ("subject_begins_with", &s.subject_begins_with),
        ("subject_ends_with", &s.subject_ends_with),
    ] {
        if v.as_deref().is_some_and(str::is_empty) {
            c.err(
                format!("{p}.{key}"),
                "must not be empty: omit the key to take every subject",
            );
            ok = false;
        }
    }
    let case = |v: &Option<String>| {
        v.as_ref().map(|v| {
            if s.subject_case_sensitive {
                v.clone()
            } else {
                v.to_lowercase()
            }
        })
    };
    ok.then(|| Subscription {
        destination: dest.to_string(),
        event_types: s
            .event_types
            .as_ref()
            .map(|ts| ts.iter().map(|t| t.to_lowercase()).collect()),
        subject_begins_with: case(&s.subject_begins_with),
        subject_ends_with: case(&s.subject_ends_with),
        subject_case_sensitive: s.subject_case_sensitive,
    })
}
