//! Adds the headers every attempt carries: `webhook-id`,
//! `courier-delivery-attempt`, `courier-destination`, and the destination's
//! custom headers (which replace any header of the same name from the app).
//!
//! `from_event` headers are evaluated here, per attempt, on the body about
//! to be sent (see `crate::event_path` for which event and which values). A
//! header without a value is left out, and so is any header of that name
//! from the app: the configured header owns the name. Why it was left out is
//! logged at debug level with the header and the path, never a value.

use super::{Attempt, AttemptRequest, body_bytes};
use crate::config::DestinationSettings;
use crate::config::settings::{CustomHeader, HeaderSource, MAX_HEADER_VALUE};
use crate::event_path::{self, EventPath, Missing};
use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// Made once: a `&str` name is copied into a new `HeaderName` on every insert.
const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
const ATTEMPT: HeaderName = HeaderName::from_static("courier-delivery-attempt");
const DESTINATION: HeaderName = HeaderName::from_static("courier-destination");

#[derive(Clone)]
pub struct HeadersLayer {
    destination: HeaderValue,
    custom: Arc<[CustomHeader]>,
    /// `courier-delivery-attempt`'s values up to `max_attempts`, made once
    /// (a clone shares the bytes; a number made into a value allocates).
    numbers: Arc<[HeaderValue]>,
}

impl HeadersLayer {
    pub fn new(dest: &DestinationSettings) -> Self {
        HeadersLayer {
            destination: HeaderValue::from_str(&dest.name)
                .unwrap_or(HeaderValue::from_static("invalid")),
            custom: dest.headers.clone().into(),
            numbers: (0..=dest.limits.max_attempts)
                .map(HeaderValue::from)
                .collect(),
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
        let event = self
            .layer
            .reads_event()
            .then(|| event_path::parse_body(&body_bytes(&mut req)));
        let (mut parts, body) = req.into_parts();
        let h = &mut parts.headers;
        if let Some(a) = parts.extensions.get::<Attempt>() {
            if let Ok(id) = HeaderValue::from_str(&a.id) {
                h.insert(WEBHOOK_ID, id);
            }
            h.insert(ATTEMPT, self.layer.number(a.number));
        }
        h.insert(DESTINATION, self.layer.destination.clone());
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
