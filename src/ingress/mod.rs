//! Ingress: the app's side (SPEC §3). It only parses, validates and admits;
//! in durable mode it never talks to the endpoint. The answer is sent only
//! after the journal has committed the event.

mod admit;
mod credits;
mod forward;
pub(crate) mod keys;
mod rejection;
mod reply;
pub(crate) mod schema;
mod topic;

pub use admit::Ingress;
