//! W3C Trace Context (`traceparent`, `tracestate`) read from and written to
//! an app's request, a stored event's headers, and an attempt's request,
//! with the SDK's propagator. Its parser reads each field as a number, so
//! it takes `00-1-1-01` or padded ids; a `traceparent` is first checked to
//! the letter of the W3C format here, and one that is not well formed is
//! ignored, as the recommendation says (the span is then a root).

use http::HeaderMap;
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;

pub(super) const TRACEPARENT: &str = "traceparent";
pub(super) const TRACESTATE: &str = "tracestate";

/// Whether `v` is a `traceparent` as W3C Trace Context writes it: a
/// version of two lowercase hex digits (not `ff`), a 32-digit trace id and a
/// 16-digit parent id that are not all zeros, two digits of flags; exactly
/// that for version `00`, and for a later version possibly more after a `-`.
pub(super) fn well_formed(v: &str) -> bool {
    let b = v.as_bytes();
    let hex = |r: std::ops::Range<usize>| {
        b.get(r)
            .is_some_and(|s| s.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
    };
    let zeros = |r: std::ops::Range<usize>| b[r].iter().all(|c| *c == b'0');
    let shape = b.len() >= 55
        && hex(0..2)
        && hex(3..35)
        && hex(36..52)
        && hex(53..55)
        && [2, 35, 52].iter().all(|&i| b[i] == b'-');
    if !shape || &b[0..2] == b"ff" || zeros(3..35) || zeros(36..52) {
        return false;
    }
    b.len() == 55 || (&b[0..2] != b"00" && b[55] == b'-')
}

/// A request's headers with a `traceparent` that is not well formed
/// hidden, so that the propagator reads no parent from it.
struct Checked<'a>(HeaderExtractor<'a>);

impl Extractor for Checked<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let v = self.0.get(key)?;
        (key != TRACEPARENT || well_formed(v)).then_some(v)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys()
    }
}

/// The remote parent a request names, or an empty context (a root).
pub(super) fn extract(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&Checked(HeaderExtractor(headers)))
}

/// `cx`'s span as the request's `traceparent` (and `tracestate`, when it
/// has one), replacing what was there.
pub(super) fn inject(cx: &Context, headers: &mut HeaderMap) {
    headers.remove(TRACESTATE);
    TraceContextPropagator::new().inject_context(cx, &mut NonEmpty(HeaderInjector(headers)));
}

/// The SDK writes `tracestate` even when it is empty; an empty header says
/// nothing, so none is sent or stored.
struct NonEmpty<I>(I);

impl<I: Injector> Injector for NonEmpty<I> {
    fn set(&mut self, key: &str, value: String) {
        if !value.is_empty() {
            self.0.set(key, value);
        }
    }
}

/// A stored event's headers with `cx`'s span as their trace context, in
/// place of the app's.
pub(super) fn stamp(cx: &Context, headers: &mut Vec<(String, Vec<u8>)>) {
    headers.retain(|(n, _)| n != TRACEPARENT && n != TRACESTATE);
    TraceContextPropagator::new().inject_context(cx, &mut NonEmpty(Stored(headers)));
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
        let value = std::str::from_utf8(self.traceparent.as_deref()?).ok()?;
        if !well_formed(value) {
            return None;
        }
        let cx = TraceContextPropagator::new().extract(&One(value));
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

    #[test]
    fn only_a_traceparent_written_to_the_letter_names_a_parent() {
        let tid = "0af7651916cd43dd8448eb211c80319c";
        let sid = "b7ad6b7169203331";
        assert!(well_formed(APP));
        assert!(well_formed(&format!("01-{tid}-{sid}-01-future")));
        for bad in [
            "00-1-1-01".to_string(),
            format!("00-+{}-{sid}-01", &tid[1..]),
            format!("00-0{tid}-{sid}-01"),
            format!("0-{tid}-{sid}-01"),
            format!("00-{tid}-{sid}-1"),
            format!("00-{tid}-{sid}-01-"),
            format!("00-{tid}-{sid}-01x"),
            format!("00-{}-{sid}-01", tid.to_uppercase()),
            format!("00-{}-{sid}-01", "0".repeat(32)),
            format!("00-{tid}-{}-01", "0".repeat(16)),
            format!("ff-{tid}-{sid}-01"),
            format!("01-{tid}-{sid}-01x"),
        ] {
            assert!(!well_formed(&bad), "{bad}");
            let mut map = HeaderMap::new();
            map.insert(TRACEPARENT, bad.parse().expect("value"));
            assert!(
                !extract(&map).span().span_context().is_valid(),
                "{bad} names no parent"
            );
            let ev = EventContext {
                id: "e".into(),
                traceparent: Some(bad.clone().into_bytes()),
            };
            assert!(ev.span_context().is_none(), "{bad}");
        }
    }

    #[test]
    fn an_empty_tracestate_is_neither_sent_nor_stored() {
        let sc = SpanContext::new(
            TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").expect("trace id"),
            SpanId::from(0x44),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        let cx = Context::new().with_remote_span_context(sc);
        let mut map = HeaderMap::new();
        inject(&cx, &mut map);
        assert!(map.get(TRACEPARENT).is_some());
        assert!(map.get(TRACESTATE).is_none(), "{map:?}");
        let mut stored = vec![("x-a".to_string(), b"1".to_vec())];
        stamp(&cx, &mut stored);
        let names: Vec<&str> = stored.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x-a", TRACEPARENT]);
    }
}
