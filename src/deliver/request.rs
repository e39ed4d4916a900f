//! The HTTP request of one attempt, rebuilt from the journal row, its body
//! and content type shaped by the destination's schema.

use super::shape;
use crate::config::DestinationSettings;
use crate::deliver::stack::Attempt;
use crate::journal::StoredEvent;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request};
use http_body_util::Full;

pub fn build(
    dest: &DestinationSettings,
    ev: &StoredEvent,
) -> Result<Request<Full<Bytes>>, http::Error> {
    let e = &ev.event;
    let (rest, query) = match e.path.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (e.path.as_str(), None),
    };
    let method = Method::from_bytes(e.method.as_bytes()).unwrap_or(Method::POST);
    let mut req = Request::builder()
        .method(method)
        .uri(dest.target.url(rest, query))
        .body(Full::new(Bytes::new()))?;
    let headers = req.headers_mut();
    for (name, value) in &e.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(n, v);
        }
    }
    let shaped = shape::shape(dest.schema, std::slice::from_ref(&e.body));
    if let Some(content_type) = shaped.content_type {
        headers.insert(http::header::CONTENT_TYPE, content_type);
    }
    *req.body_mut() = Full::new(shaped.body);
    req.extensions_mut().insert(Attempt {
        id: e.id.clone(),
        number: ev.attempts + 1,
    });
    Ok(req)
}
