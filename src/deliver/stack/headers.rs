//! Adds the headers every attempt carries: `webhook-id`,
//! `courier-delivery-attempt`, `courier-destination`, and the destination's
//! custom headers (which replace any header of the same name from the app).
//!
//! A `schema: eventgrid` destination's attempts also carry Event Grid's
//! delivery headers (docs/delivery.md), so that code written for Event Grid reads
//! them as it would Event Grid's: `aeg-event-type: Notification`,
//! `aeg-subscription-name` (the destination's name in upper case, as Event
//! Grid spells its subscription names there), `aeg-delivery-count` (the
//! attempts before this one), `aeg-metadata-version: 1` and
//! `aeg-data-version` (the `dataVersion` of the first event: a batch has
//! one header for all its events). They replace the app's of those names.
//!
//! `from_event` headers are evaluated here, per attempt, on the body about
//! to be sent (see `crate::event::path` for which event and which values). A
//! header without a value is left out, and so is any header of that name
//! from the app: the configured header owns the name. Why it was left out is
//! logged at debug level with the header and the path, never a value.

use super::{Attempt, AttemptRequest, body_bytes};
use crate::config::DestinationSettings;
use crate::config::settings::{CustomHeader, HeaderSource, MAX_HEADER_VALUE};
use crate::event::Schema;
use crate::event::path::{self, EventPath, Missing};
use http::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// Made once: a `&str` name is copied into a new `HeaderName` on every insert.
const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
const ATTEMPT: HeaderName = HeaderName::from_static("courier-delivery-attempt");
const DESTINATION: HeaderName = HeaderName::from_static("courier-destination");
const AEG_EVENT_TYPE: HeaderName = HeaderName::from_static("aeg-event-type");
const AEG_SUBSCRIPTION: HeaderName = HeaderName::from_static("aeg-subscription-name");
const AEG_DELIVERY_COUNT: HeaderName = HeaderName::from_static("aeg-delivery-count");
const AEG_METADATA_VERSION: HeaderName = HeaderName::from_static("aeg-metadata-version");
const AEG_DATA_VERSION: HeaderName = HeaderName::from_static("aeg-data-version");

#[derive(Clone)]
pub struct HeadersLayer {
    destination: HeaderValue,
    custom: Arc<[CustomHeader]>,
    /// `courier-delivery-attempt`'s values up to `max_attempts`, made once
    /// (a clone shares the bytes; a number made into a value allocates).
    numbers: Arc<[HeaderValue]>,
    /// `aeg-subscription-name`'s value; `Some` only for `schema:
    /// eventgrid`, whose attempts alone carry the `aeg-*` headers.
    subscription: Option<HeaderValue>,
}

impl HeadersLayer {
    pub fn new(dest: &DestinationSettings) -> Self {
        let subscription = (dest.schema == Schema::Eventgrid)
            .then(|| HeaderValue::from_str(&dest.name.to_ascii_uppercase()).ok())
            .flatten();
        HeadersLayer {
            destination: HeaderValue::from_str(&dest.name)
                .unwrap_or(HeaderValue::from_static("invalid")),
            custom: dest.headers.clone().into(),
            numbers: (0..=dest.limits.max_attempts)
                .map(HeaderValue::from)
                .collect(),
            subscription,
        }
    }

    fn number(&self, n: u32) -> HeaderValue {
        match self.numbers.get(n as usize) {
            Some(v) => v.clone(),
            None => HeaderValue::from(n),
        }
    }

    /// Whether some header needs the event, so the body is parsed only then.
    fn reads_event(&self) -> bool {
        self.custom
            .iter()
            .any(|c| matches!(c.value, HeaderSource::FromEvent { .. }))
    }
}

impl<S> Layer<S> for HeadersLayer {
    type Service = Headers<S>;
    fn layer(&self, inner: S) -> Headers<S> {
        Headers {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Headers<S> {
    inner: S,
    layer: HeadersLayer,
}

impl<S> Service<AttemptRequest> for Headers<S>
where
    S: Service<AttemptRequest>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: AttemptRequest) -> S::Future {
        let reads_event = self.layer.reads_event();
        let bytes =
            (reads_event || self.layer.subscription.is_some()).then(|| body_bytes(&mut req));
        let event = bytes
            .as_ref()
            .filter(|_| reads_event)
            .map(|b| path::parse_body(b));
        let (mut parts, body) = req.into_parts();
        let h = &mut parts.headers;
        let attempt = parts.extensions.get::<Attempt>();
        if let Some(a) = attempt {
            if let Ok(id) = HeaderValue::from_str(&a.id) {
                h.insert(WEBHOOK_ID, id);
            }
            h.insert(ATTEMPT, self.layer.number(a.number));
        }
        h.insert(DESTINATION, self.layer.destination.clone());
        if let (Some(name), Some(bytes)) = (&self.layer.subscription, &bytes) {
            h.insert(AEG_EVENT_TYPE, HeaderValue::from_static("Notification"));
            h.insert(AEG_SUBSCRIPTION, name.clone());
            h.insert(AEG_METADATA_VERSION, HeaderValue::from_static("1"));
            if let Some(a) = attempt {
                let before = a.number.saturating_sub(1);
                h.insert(AEG_DELIVERY_COUNT, self.layer.number(before));
            }
            match first_data_version(bytes).and_then(|v| HeaderValue::from_str(&v).ok()) {
                Some(v) => h.insert(AEG_DATA_VERSION, v),
                None => h.remove(AEG_DATA_VERSION),
            };
        }
        for c in self.layer.custom.iter() {
            match &c.value {
                HeaderSource::Fixed(v) => {
                    h.insert(c.name.clone(), v.clone());
                }
                HeaderSource::FromEvent { path, secret } => {
                    let event = event.as_ref().map(|e| e.as_ref().map_err(|m| *m));
                    set_from_event(h, &c.name, path, *secret, event);
                }
            }
        }
        self.inner.call(AttemptRequest::from_parts(parts, body))
    }
}

/// The `dataVersion` of the first event of an Event Grid body (a JSON
/// array), read without building the events: the rest is only skipped.
fn first_data_version(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Versioned {
        #[serde(rename = "dataVersion")]
        data_version: Option<String>,
    }
    struct First(Option<String>);
    impl<'de> Deserialize<'de> for First {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<First, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = First;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("an array of events")
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(
                    self,
                    mut seq: A,
                ) -> Result<First, A::Error> {
                    let first = seq.next_element::<Versioned>()?;
                    while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                    Ok(First(first.and_then(|v| v.data_version)))
                }
            }
            d.deserialize_seq(Visit)
        }
    }
    serde_json::from_slice::<First>(body).ok()?.0
}

/// Sets `name` from the event's field at `path`, or removes it.
fn set_from_event(
    h: &mut HeaderMap,
    name: &HeaderName,
    path: &EventPath,
    secret: bool,
    event: Option<Result<&Value, Missing>>,
) {
    let value = event
        .unwrap_or(Err(Missing::NotJson))
        .and_then(|ev| path.lookup(ev))
        .map_err(Missing::as_str)
        .and_then(|text| {
            if text.len() > MAX_HEADER_VALUE {
                return Err("value is longer than a header value may be");
            }
            HeaderValue::from_str(&text).map_err(|_| "value is not a valid header value")
        });
    match value {
        Ok(mut v) => {
            v.set_sensitive(secret);
            h.insert(name.clone(), v);
        }
        Err(why) => {
            h.remove(name);
            tracing::debug!(header = %name, from_event = path.as_str(), why, "from_event header left out");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Full;
    use std::convert::Infallible;
    use tower::ServiceExt;

    fn layer(custom: Vec<CustomHeader>) -> HeadersLayer {
        HeadersLayer {
            destination: HeaderValue::from_static("orders"),
            custom: custom.into(),
            numbers: (0..=3).map(HeaderValue::from).collect(),
            subscription: None,
        }
    }

    fn from_event(name: &'static str, path: &str) -> CustomHeader {
        CustomHeader {
            name: HeaderName::from_static(name),
            value: HeaderSource::FromEvent {
                path: EventPath::parse(path).expect("valid path"),
                secret: false,
            },
        }
    }

    async fn send(
        layer: HeadersLayer,
        body: &'static str,
        app: &[(&'static str, &'static str)],
    ) -> (HeaderMap, Bytes) {
        let echo = tower::service_fn(|req: AttemptRequest| async move {
            let (parts, body) = req.into_parts();
            Ok::<_, Infallible>((parts.headers, body.into_inner().unwrap_or_default()))
        });
        let mut req = AttemptRequest::new(Full::new(Bytes::from_static(body.as_bytes())));
        for (n, v) in app {
            req.headers_mut().insert(*n, HeaderValue::from_static(v));
        }
        req.extensions_mut().insert(Attempt {
            id: "evt-1".into(),
            number: 3,
        });
        layer.layer(echo).oneshot(req).await.expect("infallible")
    }

    #[test]
    fn attempt_numbers_up_to_max_attempts_are_made_once_and_beyond_on_the_spot() {
        let yaml = "destinations:\n  orders:\n    url: https://h.example/\n    retry: { max_attempts: 5 }\n";
        let env = crate::config::ProcessEnv;
        let run = crate::config::Purpose::Run;
        let loaded = crate::config::parse("c.yaml", yaml, ".".into(), run, &env).expect("config");
        let l = HeadersLayer::new(&loaded.settings.destinations[0]);
        assert_eq!(l.numbers.len(), 6);
        for n in [1, 5, 6, 40] {
            assert_eq!(l.number(n), n.to_string().as_str());
        }
    }

    #[tokio::test]
    async fn sets_attempt_headers_and_custom_headers_over_the_apps() {
        let layer = layer(vec![CustomHeader {
            name: HeaderName::from_static("x-tenant"),
            value: HeaderSource::Fixed(HeaderValue::from_static("acme")),
        }]);
        let (h, _) = send(layer, "", &[("x-tenant", "from-app")]).await;
        assert_eq!(h["webhook-id"], "evt-1");
        assert_eq!(h["courier-delivery-attempt"], "3");
        assert_eq!(h["courier-destination"], "orders");
        assert_eq!(h.get_all("x-tenant").iter().collect::<Vec<_>>(), ["acme"]);
    }

    #[tokio::test]
    async fn eventgrid_attempts_carry_event_grid_delivery_headers_and_others_do_not() {
        let yaml = "destinations:\n  Orders-eu.1:\n    url: https://h.example/\n    schema: eventgrid\n  plain:\n    url: https://h.example/\n";
        let env = crate::config::ProcessEnv;
        let run = crate::config::Purpose::Run;
        let loaded = crate::config::parse("c.yaml", yaml, ".".into(), run, &env).expect("config");
        let dests = &loaded.settings.destinations;
        let eg = HeadersLayer::new(&dests[0]);
        let app = [
            ("aeg-data-version", "from-app"),
            ("aeg-delivery-count", "9"),
        ];
        let body = r#"[{"id":"a","dataVersion":"2.0","data":{"dataVersion":"x"}},{"id":"b","dataVersion":"3.0"}]"#;
        let (h, sent) = send(eg.clone(), body, &app).await;
        assert_eq!(sent, body.as_bytes(), "the body goes on unchanged");
        assert_eq!(h["aeg-event-type"], "Notification");
        assert_eq!(h["aeg-subscription-name"], "ORDERS-EU.1");
        assert_eq!(h["aeg-delivery-count"], "2", "attempt 3 has two before it");
        assert_eq!(h["aeg-metadata-version"], "1");
        assert_eq!(
            h.get_all("aeg-data-version").iter().collect::<Vec<_>>(),
            ["2.0"],
            "the first event's, over the app's"
        );
        let (h, _) = send(eg, r#"[{"id":"a"}]"#, &app).await;
        assert!(h.get("aeg-data-version").is_none(), "none to give");

        let (h, _) = send(HeadersLayer::new(&dests[1]), body, &[]).await;
        assert!(h.keys().all(|n| !n.as_str().starts_with("aeg-")), "{h:?}");
    }

    #[test]
    fn the_first_data_version_is_read_from_arrays_only() {
        assert_eq!(
            first_data_version(br#"[{"dataVersion":"1.0"},{"dataVersion":"2"},3]"#).as_deref(),
            Some("1.0")
        );
        for none in [
            &br#"[]"#[..],
            br#"[{"dataVersion":1}]"#,
            br#"{"dataVersion":"1"}"#,
            b"[{",
            b"",
        ] {
            assert_eq!(
                first_data_version(none),
                None,
                "{}",
                String::from_utf8_lossy(none)
            );
        }
    }

    #[tokio::test]
    async fn from_event_headers_read_the_body_being_sent() {
        let layer = layer(vec![
            from_event("x-subject", "subject"),
            from_event("x-tenant", "data.tenant"),
            from_event("x-count", "data.n"),
            from_event("x-missing", "data.nope"),
            from_event("x-bad", "data.bad"),
        ]);
        let body = r#"{"subject":"/orders/1","data":{"tenant":"acme","n":7,"bad":"a\nb"}}"#;
        let (h, sent) = send(layer.clone(), body, &[("x-missing", "from-app")]).await;
        assert_eq!(sent, body.as_bytes(), "the body goes on unchanged");
        assert_eq!(h["x-subject"], "/orders/1");
        assert_eq!(h["x-tenant"], "acme");
        assert_eq!(h["x-count"], "7");
        assert!(
            h.get("x-missing").is_none(),
            "a missing field removes the app's header too"
        );
        assert!(h.get("x-bad").is_none(), "a newline cannot be in a header");

        let (h, _) = send(
            layer.clone(),
            r#"[{"subject":"first"},{"subject":"second"}]"#,
            &[],
        )
        .await;
        assert_eq!(h["x-subject"], "first");
        let (h, _) = send(layer, "not json", &[]).await;
        assert!(h.get("x-subject").is_none());
        assert_eq!(h["webhook-id"], "evt-1");
    }
}
