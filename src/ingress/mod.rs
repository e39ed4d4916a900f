//! Ingress: the app's side (docs/publishing.md). It only parses, validates and admits;
//! in durable mode it never talks to the endpoint. The answer is sent only
//! after the journal has committed the event. In passthrough mode it hands
//! the request to `deliver::Passthrough` and the endpoint's answer back.

mod admit;
mod budget;
mod credits;
mod forward;
mod passed;
mod rejection;
mod reply;
pub(crate) mod schema;
mod topic;

pub use admit::{Ingress, waiting};

/// An answer to the app: courier's own JSON, or an endpoint's answer
/// streamed through (passthrough).
pub type Body =
    http_body_util::Either<http_body_util::Full<bytes::Bytes>, crate::deliver::AnswerBody>;
