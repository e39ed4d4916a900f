//! The two kinds of span: `Accept` (a SERVER span per request from the
//! app) and `AttemptSpan` (a CLIENT span per delivery attempt). Attribute
//! names follow OpenTelemetry's HTTP conventions, plus `courier.*` ones.
//! Never a header value, a body or a query string: they may hold secrets.

use super::Tracer;
use super::propagate::{self, EventContexts};
use http::{HeaderMap, Method, Request};
use opentelemetry::trace::{Link, Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::Span;

const METHOD: &str = "http.request.method";
const ROUTE: &str = "http.route";
const STATUS: &str = "http.response.status_code";
const SERVER_ADDRESS: &str = "server.address";
const SERVER_PORT: &str = "server.port";
const ERROR_TYPE: &str = "error.type";
const DESTINATION: &str = "courier.destination";
const EVENT_ID: &str = "courier.event_id";
const EVENT_COUNT: &str = "courier.event_count";
const BATCH_ID: &str = "courier.batch_id";
const BATCH_SIZE: &str = "courier.batch_size";
const ATTEMPT: &str = "courier.attempt";
const OUTCOME: &str = "courier.outcome";

impl Tracer {
    /// The span of one request from the app: a child of its `traceparent`
    /// when it sent a valid one, else the root of a new trace.
    pub fn accept(&self, method: &Method, headers: &HeaderMap) -> Accept {
        let parent = propagate::extract(headers);
        let span = self
            .inner
            .span_builder(method.as_str().to_string())
            .with_kind(SpanKind::Server)
            .with_attributes([KeyValue::new(METHOD, method.as_str().to_string())])
            .start_with_context(&self.inner, &parent);
        Accept {
            span,
            method: method.clone(),
        }
    }

    /// The span of one attempt, and `req` carrying it as its `traceparent`.
    /// One event's attempt is a child of the context its request carries
    /// (the accept span's, stored with the event); a batch's (`events`) is
    /// a root with a link to each event's.
    pub fn attempt<B>(
        &self,
        destination: &str,
        req: &mut Request<B>,
        id: &str,
        number: u32,
        events: Option<EventContexts>,
    ) -> AttemptSpan {
        let uri = req.uri();
        let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        });
        let mut attributes = vec![
            KeyValue::new(METHOD, req.method().as_str().to_string()),
            KeyValue::new(SERVER_ADDRESS, uri.host().unwrap_or_default().to_string()),
            KeyValue::new(SERVER_PORT, i64::from(port)),
            KeyValue::new(DESTINATION, destination.to_string()),
            KeyValue::new(ATTEMPT, i64::from(number)),
        ];
        let builder = self
            .inner
            .span_builder(format!("deliver {destination}"))
            .with_kind(SpanKind::Client);
        let (parent, builder) = match events {
            None => {
                attributes.push(KeyValue::new(EVENT_ID, id.to_string()));
                (propagate::extract(req.headers()), builder)
            }
            Some(EventContexts(events)) => {
                attributes.push(KeyValue::new(BATCH_ID, id.to_string()));
                attributes.push(KeyValue::new(BATCH_SIZE, events.len() as i64));
                let links = events
                    .iter()
                    .filter_map(|e| {
                        let sc = e.span_context()?;
                        Some(Link::new(
                            sc,
                            vec![KeyValue::new(EVENT_ID, e.id.clone())],
                            0,
                        ))
                    })
                    .collect();
                (Context::new(), builder.with_links(links))
            }
        };
        let span = builder
            .with_attributes(attributes)
            .start_with_context(&self.inner, &parent);
        let cx = Context::new().with_remote_span_context(span.span_context().clone());
        propagate::inject(&cx, req.headers_mut());
        AttemptSpan { span }
    }
}

/// An accept span, open while ingress handles the request.
pub struct Accept {
    span: Span,
    method: Method,
}

impl Accept {
    /// The request names a configured destination or topic.
    pub fn routed(&mut self, route: &str) {
        self.span.update_name(format!("{} /{route}", self.method));
        self.span
            .set_attribute(KeyValue::new(ROUTE, format!("/{route}")));
        self.span
            .set_attribute(KeyValue::new(DESTINATION, route.to_string()));
    }

    /// The ids of the events the request carries.
    pub fn events(&mut self, ids: &[String]) {
        if let [id] = ids {
            self.span.set_attribute(KeyValue::new(EVENT_ID, id.clone()));
        }
        self.span
            .set_attribute(KeyValue::new(EVENT_COUNT, ids.len() as i64));
    }

    /// `headers`, about to be stored, with this span as their trace
    /// context: what each attempt will be a child of.
    pub fn stamp(&self, headers: &mut Vec<(String, Vec<u8>)>) {
        let cx = Context::new().with_remote_span_context(self.span.span_context().clone());
        propagate::stamp(&cx, headers);
    }

    /// Ends the span with the answer's status; a 5xx is an error (for a
    /// server span a 4xx is the client's).
    pub fn end(mut self, status: http::StatusCode) {
        self.span
            .set_attribute(KeyValue::new(STATUS, i64::from(status.as_u16())));
        if status.is_server_error() {
            self.span
                .set_status(Status::error(status.as_str().to_string()));
        }
        self.span.end();
    }
}

/// An attempt span, open while the attempt is in flight.
pub struct AttemptSpan {
    span: Span,
}

impl AttemptSpan {
    /// Ends the span with the attempt's verdict: `status` when there was
    /// an answer, and courier's `outcome` (`Delivered`, `Busy`,
    /// `TimedOut`, ...). `error.type` is the status for 4xx and 5xx, else
    /// the outcome, as the HTTP conventions have it.
    pub fn finish(mut self, status: Option<u16>, outcome: &'static str, delivered: bool) {
        if let Some(s) = status {
            self.span.set_attribute(KeyValue::new(STATUS, i64::from(s)));
        }
        self.span.set_attribute(KeyValue::new(OUTCOME, outcome));
        if !delivered {
            let kind = match status {
                Some(s) if s >= 400 => s.to_string(),
                _ => outcome.to_string(),
            };
            self.span
                .set_attribute(KeyValue::new(ERROR_TYPE, kind.clone()));
            self.span.set_status(Status::error(kind));
        }
        self.span.end();
    }
}
