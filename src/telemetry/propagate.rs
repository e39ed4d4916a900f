//! W3C Trace Context (`traceparent`, `tracestate`) read from and written to
//! an app's request, a stored event's headers, and an attempt's request,
//! with the SDK's propagator (it validates the version, ids and flags).

use http::HeaderMap;
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;

pub(super) const TRACEPARENT: &str = "traceparent";
pub(super) const TRACESTATE: &str = "tracestate";

/// The remote parent a request names, or an empty context (a root).
pub(super) fn extract(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// `cx`'s span as the request's `traceparent` (and `tracestate`),
/// replacing what was there.
pub(super) fn inject(cx: &Context, headers: &mut HeaderMap) {
    headers.remove(TRACESTATE);
    TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
}

/// A stored event's headers with `cx`'s span as their trace context, in
/// place of the app's.
pub(super) fn stamp(cx: &Context, headers: &mut Vec<(String, Vec<u8>)>) {
    headers.retain(|(n, _)| n != TRACEPARENT && n != TRACESTATE);
    TraceContextPropagator::new().inject_context(cx, &mut Stored(headers));
}

struct Stored<'a>(&'a mut Vec<(String, Vec<u8>)>);

impl Injector for Stored<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_string(), value.into_bytes()));
    }
}

/// One event of a batch: its id and the `traceparent` stored with it.
#[derive(Clone, Debug)]
pub struct EventContext {
    pub id: String,
    pub traceparent: Option<Vec<u8>>,
}

impl EventContext {
    /// The span the event's trace context names, if it is valid.
    pub(super) fn span_context(&self) -> Option<SpanContext> {
        let value = self.traceparent.as_deref()?;
        let cx = TraceContextPropagator::new().extract(&One(std::str::from_utf8(value).ok()?));
        let sc = cx.span().span_context().clone();
        sc.is_valid().then_some(sc)
    }
}

/// A batch attempt's events (a request extension): its span links each.
#[derive(Clone, Debug)]
pub struct EventContexts(pub Vec<EventContext>);

impl EventContexts {
    /// The contexts of events given as (id, stored headers).
    pub fn of<'a>(events: impl Iterator<Item = (&'a str, &'a [(String, Vec<u8>)])>) -> Self {
        EventContexts(
            events
                .map(|(id, headers)| EventContext {
                    id: id.to_string(),
                    traceparent: headers
                        .iter()
                        .find(|(n, _)| n == TRACEPARENT)
                        .map(|(_, v)| v.clone()),
                })
                .collect(),
        )
    }
}

/// A lone `traceparent` value, as an extractor.
struct One<'a>(&'a str);

impl Extractor for One<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == TRACEPARENT).then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};

    const APP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn context(span: u64) -> Context {
        let sc = SpanContext::new(
            TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").expect("trace id"),
            SpanId::from(span),
            TraceFlags::SAMPLED,
            false,
            TraceState::from_key_value([("vendor", "x")]).expect("state"),
        );
        Context::new().with_remote_span_context(sc)
    }

    #[test]
    fn a_stored_events_context_replaces_the_apps_and_keeps_the_rest() {
        let mut headers = vec![
            ("x-a".to_string(), b"1".to_vec()),
            (TRACEPARENT.to_string(), APP.as_bytes().to_vec()),
            (TRACESTATE.to_string(), b"vendor=x".to_vec()),
        ];
        stamp(&context(0x1122), &mut headers);
        assert_eq!(headers[0], ("x-a".to_string(), b"1".to_vec()));
        let parent: Vec<_> = headers.iter().filter(|(n, _)| n == TRACEPARENT).collect();
        assert_eq!(parent.len(), 1, "{headers:?}");
        assert_eq!(
            parent[0].1,
            b"00-0af7651916cd43dd8448eb211c80319c-0000000000001122-01"
        );
        assert!(headers.contains(&(TRACESTATE.to_string(), b"vendor=x".to_vec())));
        let ev = EventContext {
            id: "e".into(),
            traceparent: Some(parent[0].1.clone()),
        };
        assert_eq!(
            ev.span_context().map(|s| s.span_id()),
            Some(SpanId::from(0x1122))
        );
    }

    #[test]
    fn an_invalid_or_missing_traceparent_names_no_span() {
        for bad in [None, Some(&b"00-zz-01"[..]), Some(&[0xff, 0xfe][..])] {
            let ev = EventContext {
                id: "e".into(),
                traceparent: bad.map(<[u8]>::to_vec),
            };
            assert!(ev.span_context().is_none(), "{bad:?}");
        }
        let mut map = HeaderMap::new();
        map.insert(TRACEPARENT, "00-0-0-0".parse().expect("value"));
        assert!(!extract(&map).span().span_context().is_valid());
    }

    #[test]
    fn inject_replaces_the_requests_context() {
        let mut map = HeaderMap::new();
        map.insert(TRACEPARENT, APP.parse().expect("value"));
        map.insert(TRACESTATE, "old=1".parse().expect("value"));
        inject(&context(0x33), &mut map);
        assert_eq!(
            map.get(TRACEPARENT).map(|v| v.as_bytes()),
            Some(&b"00-0af7651916cd43dd8448eb211c80319c-0000000000000033-01"[..])
        );
        assert_eq!(
            map.get(TRACESTATE).map(|v| v.as_bytes()),
            Some(&b"vendor=x"[..])
        );
    }
}
