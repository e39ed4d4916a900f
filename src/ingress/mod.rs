//! Ingress: the app's side (SPEC §3). It only parses, validates and admits;
//! in durable mode it never talks to the endpoint. The answer is sent only
//! after the journal has committed the event. In passthrough mode it hands
//! the request to `deliver::Passthrough` and the endpoint's answer back.

mod admit;
mod budget;
mod credits;
mod forward;
pub(crate) mod keys;
mod passed;
mod rejection;
pub(crate) mod reply;
pub(crate) mod schema;
mod topic;

pub use admit::Ingress;

/// An answer to the app: courier's own JSON, or an endpoint's answer
/// streamed through (passthrough).
pub type Body =
    http_body_util::Either<http_body_util::Full<bytes::Bytes>, crate::deliver::AnswerBody>;

/// A header map of `pairs`, in order, for unit tests.
#[cfg(test)]
fn test_headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            v.parse().expect("value"),
        );
    }
    h
}
