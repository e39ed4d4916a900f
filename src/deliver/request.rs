//! The HTTP request of one attempt, rebuilt from the journal rows, its body
//! and content type shaped by the destination's schema.
//!
//! A batch is one request: method, path, query and forwarded headers are
//! those of its first event (events of one destination usually share
//! them; a receiver that needs each event's own must not batch), the body
//! is the array of every event's body, and `webhook-id` is the batch's id.
//! The first event's `Idempotency-Key` is left out: it names that event,
//! not the batch. Each event's id and stored `traceparent` go with the
//! request (`EventContexts`), for the attempt span's links when tracing
//! is on.

use super::shape::{self, Shaped};
use crate::config::DestinationSettings;
use crate::deliver::stack::{Attempt, EndpointSecrets};
use crate::event::{NewEvent, StoredEvent, endpoint};
use crate::telemetry::EventContexts;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request};
use http_body_util::Full;

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Http(#[from] http::Error),
    #[error(transparent)]
    Url(#[from] crate::config::settings::UrlError),
    #[error("a batch without events")]
    Empty,
    #[error(
        "the event names no endpoint, and its destination delivers to the one each event names"
    )]
    NoEndpoint,
}

pub fn build(
    dest: &DestinationSettings,
    ev: &StoredEvent,
) -> Result<Request<Full<Bytes>>, BuildError> {
    let shaped = shape::shape(dest.schema, std::slice::from_ref(&ev.event.body));
    let attempt = Attempt {
        id: ev.event.id.clone(),
        number: attempt_number(std::slice::from_ref(ev)),
    };
    assemble(dest, &ev.event, shaped, attempt, &[])
}

/// A passthrough request's first attempt: the app's request as it came,
/// never stored.
pub fn build_passthrough(
    dest: &DestinationSettings,
    ev: &NewEvent,
) -> Result<Request<Full<Bytes>>, BuildError> {
    let shaped = shape::shape(dest.schema, std::slice::from_ref(&ev.body));
    let attempt = Attempt {
        id: ev.id.clone(),
        number: 1,
    };
    assemble(dest, ev, shaped, attempt, &[])
}

/// One attempt for the batch `id`; its number is the highest attempt count
/// of its events plus one (they normally share it).
pub fn build_batch(
    dest: &DestinationSettings,
    evs: &[StoredEvent],
    id: &str,
) -> Result<Request<Full<Bytes>>, BuildError> {
    let first = evs.first().ok_or(BuildError::Empty)?;
    let bodies: Vec<Bytes> = evs.iter().map(|e| e.event.body.clone()).collect();
    let attempt = Attempt {
        id: id.to_string(),
        number: attempt_number(evs),
    };
    let shaped = shape::batch(dest.schema, &bodies);
    let mut req = assemble(dest, &first.event, shaped, attempt, &["idempotency-key"])?;
    let contexts = evs
        .iter()
        .map(|e| (e.event.id.as_str(), e.event.headers.as_slice()));
    req.extensions_mut().insert(EventContexts::of(contexts));
    Ok(req)
}

fn assemble(
    dest: &DestinationSettings,
    e: &NewEvent,
    shaped: Shaped,
    attempt: Attempt,
    skip: &[&str],
) -> Result<Request<Full<Bytes>>, BuildError> {
    let (rest, query) = match e.path.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (e.path.as_str(), None),
    };
    let method = Method::from_bytes(e.method.as_bytes()).unwrap_or(Method::POST);
    // The endpoint an event names is whole: the app's path and query
    // after the destination's name are not appended to it.
    let uri = match &dest.per_event {
        None => dest.target.uri(rest, query)?,
        Some(_) => endpoint::url_of(e)
            .ok_or(BuildError::NoEndpoint)?
            .parse::<http::Uri>()
            .map_err(http::Error::from)?,
    };
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .body(Full::new(shaped.body))?;
    if dest.per_event.is_some()
        && let Some(secrets) = endpoint::secrets_of(e)
    {
        req.extensions_mut().insert(EndpointSecrets(secrets.into()));
    }
    let headers = req.headers_mut();
    // The app's, a content type, the attempt's own (`HeadersLayer`: its
    // id, number and destination, a signature and its time) and hyper's
    // (`Host`, `Content-Length`): room for them all at once, as growing
    // the map on the way out took two more allocations an attempt.
    headers.reserve(e.headers.len() + 8);
    for (name, value) in &e.headers {
        if skip.contains(&name.as_str()) || endpoint::is_own(name) {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(n, v);
        }
    }
    if let Some(content_type) = shaped.content_type {
        headers.insert(http::header::CONTENT_TYPE, content_type);
    }
    req.extensions_mut().insert(attempt);
    Ok(req)
}

/// The number of the attempt about to go out for `evs` (a batch's events
/// share theirs; the highest counts).
pub fn attempt_number(evs: &[StoredEvent]) -> u32 {
    evs.iter().map(|e| e.attempts).max().unwrap_or(0) + 1
}
