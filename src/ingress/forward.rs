//! Which of the app's headers travel with the event, and which id it gets.

use crate::config::ingress_keys as keys;
use crate::event::Header;
use crate::event::Schema;
use http::HeaderMap;
use smallvec::SmallVec;
use std::borrow::Cow;

use crate::event::rules;
pub use crate::event::rules::HOP_BY_HOP;

/// The names a `Connection` header lists: hop-by-hop for this message too.
/// As written (compare them without case): most clients send
/// `Connection: keep-alive` with every request, and a lower-case copy of
/// each name was two allocations a request.
pub fn connection_listed(headers: &HeaderMap) -> SmallVec<[&str; 2]> {
    headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(str::trim))
        .collect()
}

/// Whether a request is an Event Grid publish: to a route of `schema:
/// eventgrid`, or sent by an Event Grid client to any route. Such a client
/// carries `aeg-sas-key` or `aeg-sas-token`, or an Azure SDK's `User-Agent`
/// (`azsdk-<language>-eventgrid/<version>`), as the SDKs' `CloudEvent`
/// sends to a `cloudevents` route do.
pub fn eventgrid_publish(schema: Schema, headers: &HeaderMap) -> bool {
    // Without allocating: this runs for every request.
    let has = |ua: &[u8], needle: &[u8]| {
        ua.windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
    };
    let sdk = headers
        .get(http::header::USER_AGENT)
        .is_some_and(|ua| has(ua.as_bytes(), b"azsdk-") && has(ua.as_bytes(), b"eventgrid"));
    let credential =
        headers.contains_key(keys::KEY_HEADER) || headers.contains_key(keys::TOKEN_HEADER);
    schema == Schema::Eventgrid || credential || sdk
}

/// The headers forwarded to the endpoint, in the order received.
/// `Authorization` is kept back when `keyed` (ingress keys are set, so it
/// may carry one); otherwise it may be meant for the endpoint and travels.
/// An Event Grid publish (`eventgrid_publish`) keeps its `User-Agent` back:
/// it names the publisher's SDK, and Event Grid's deliveries never carry
/// the publisher's.
pub fn forwarded(headers: &HeaderMap, keyed: bool, eventgrid_publish: bool) -> Vec<Header> {
    let listed = connection_listed(headers);
    headers
        .iter()
        .filter(|(name, _)| {
            let publisher = eventgrid_publish && *name == http::header::USER_AGENT;
            !publisher && rules::header_travels(name.as_str(), &listed, keyed)
        })
        .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
        .collect()
}

/// The app's query as it travels, `None` when nothing is left of it. An
/// Event Grid publish loses its `api-version` parameters: the SDKs add one
/// for Event Grid's publish API (`2018-01-01`), not for the endpoint, and
/// Event Grid's deliveries carry only the subscription's own url.
pub fn query(query: &str, eventgrid_publish: bool) -> Option<Cow<'_, str>> {
    let api_version = |pair: &&str| {
        let key = pair.split('=').next().unwrap_or_default();
        key.eq_ignore_ascii_case("api-version")
    };
    if !eventgrid_publish || !query.split('&').any(|p| api_version(&p)) {
        return Some(Cow::Borrowed(query));
    }
    let kept: Vec<&str> = query.split('&').filter(|p| !api_version(p)).collect();
    (!kept.is_empty()).then(|| Cow::Owned(kept.join("&")))
}

/// Longest event id accepted from the app.
pub const MAX_ID: usize = rules::MAX_ID;

/// `custom` schema: the app's `Idempotency-Key`, else `webhook-id`, else a
/// new UUIDv7. `Err` carries the header whose value is unusable.
pub fn event_id(headers: &HeaderMap) -> Result<String, &'static str> {
    // Names made once: a `&str` key is parsed again at every lookup.
    static NAMES: [http::HeaderName; 2] = [
        http::HeaderName::from_static("idempotency-key"),
        http::HeaderName::from_static("webhook-id"),
    ];
    for name in NAMES.iter() {
        if let Some(v) = headers.get(name) {
            let name = name.as_str();
            let id = v.to_str().map_err(|_| name)?.trim();
            if id.is_empty() || id.len() > MAX_ID {
                return Err(name);
            }
            return Ok(id.to_string());
        }
    }
    Ok(crate::ids::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        h
    }

    #[test]
    fn hop_by_hop_host_length_and_courier_headers_are_not_forwarded() {
        let h = map(&[
            ("host", "x"),
            ("content-length", "3"),
            // Listed names are matched in any case.
            ("connection", "Keep-Alive,X-Hop"),
            ("x-hop", "1"),
            ("courier-delivery-attempt", "9"),
            ("webhook-id", "w"),
            ("webhook-foo", "f"),
            ("content-type", "application/json"),
            ("x-trace", "a"),
            ("x-trace", "b"),
        ]);
        let names: Vec<(String, Vec<u8>)> = forwarded(&h, false, false);
        assert_eq!(
            names,
            vec![
                ("content-type".into(), b"application/json".to_vec()),
                ("x-trace".into(), b"a".to_vec()),
                ("x-trace".into(), b"b".to_vec())
            ]
        );
    }

    #[test]
    fn ingress_credentials_stay_and_authorization_only_with_keys() {
        let h = map(&[
            ("aeg-sas-key", "topic-key"),
            ("aeg-sas-token", "r=a&e=b&s=c"),
            ("authorization", "Bearer for-someone"),
            ("x-keep", "1"),
        ]);
        let names = |keyed| -> Vec<String> {
            forwarded(&h, keyed, false)
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        };
        assert_eq!(names(false), ["authorization", "x-keep"]);
        assert_eq!(names(true), ["x-keep"]);
    }

    #[test]
    fn event_grid_publishers_are_told_by_route_key_or_user_agent() {
        let none = map(&[]);
        assert!(eventgrid_publish(Schema::Eventgrid, &none));
        assert!(!eventgrid_publish(Schema::Cloudevents, &none));
        assert!(!eventgrid_publish(Schema::Custom, &none));
        for ua in [
            "azsdk-python-eventgrid/4.22.1 Python/3.11.2 (Linux)",
            "AZSDK-Net-Messaging.EventGrid/4.28.0 (.NET 8.0)",
            "azsdk-js-eventgrid/5.12.0 core-rest-pipeline/1.22.2 Node/20.20.2 OS/(x64-Linux)",
        ] {
            let h = map(&[("user-agent", ua)]);
            assert!(eventgrid_publish(Schema::Cloudevents, &h), "{ua}");
        }
        for ua in [
            "azsdk-python-storage-blob/12.0",
            "curl/8.5.0 eventgrid-tool",
        ] {
            let h = map(&[("user-agent", ua)]);
            assert!(!eventgrid_publish(Schema::Custom, &h), "{ua}");
        }
        for credential in ["aeg-sas-key", "aeg-sas-token"] {
            let h = map(&[(credential, "x")]);
            assert!(eventgrid_publish(Schema::Custom, &h), "{credential}");
        }
    }

    #[test]
    fn an_event_grid_publish_keeps_its_user_agent_and_api_version_back() {
        let h = map(&[("user-agent", "azsdk-js-eventgrid/5.12.0"), ("x-keep", "1")]);
        let names = |publish| -> Vec<String> {
            forwarded(&h, false, publish)
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        };
        assert_eq!(names(false), ["user-agent", "x-keep"]);
        assert_eq!(names(true), ["x-keep"]);

        let q = |text, publish| query(text, publish).map(|c| c.into_owned());
        assert_eq!(q("api-version=2018-01-01", true), None);
        assert_eq!(
            q(
                "a=1&api-version=2018-01-01&API-Version=x&b=api-version",
                true
            )
            .as_deref(),
            Some("a=1&b=api-version")
        );
        assert_eq!(q("x=1", true).as_deref(), Some("x=1"));
        assert_eq!(q("", true).as_deref(), Some(""));
        assert_eq!(
            q("api-version=2018-01-01", false).as_deref(),
            Some("api-version=2018-01-01"),
            "an app's own api-version is the endpoint's"
        );
    }

    #[test]
    fn id_comes_from_idempotency_key_then_webhook_id_then_uuid7() {
        assert_eq!(
            event_id(&map(&[("idempotency-key", "k1"), ("webhook-id", "w1")])),
            Ok("k1".into())
        );
        assert_eq!(event_id(&map(&[("webhook-id", "w1")])), Ok("w1".into()));
        let generated = event_id(&HeaderMap::new()).expect("uuid");
        assert_eq!(
            uuid::Uuid::parse_str(&generated).map(|u| u.get_version_num()),
            Ok(7)
        );
        assert_eq!(
            event_id(&map(&[("idempotency-key", " ")])),
            Err("idempotency-key")
        );
        assert_eq!(
            event_id(&map(&[("webhook-id", &"x".repeat(300))])),
            Err("webhook-id")
        );
    }
}
