//! Delivery: one dispatcher per destination drives attempts through a tower
//! stack built per destination, and settles each outcome in the journal;
//! passthrough sends through the same stack while the app waits.

mod answer_body;
mod batch;
mod client;
mod disabling;
mod dispatcher;
pub mod endpoints;
mod fleet;
mod guard;
pub mod health;
mod letters;
pub mod limit;
mod outcome_log;
mod passthrough;
mod pool;
mod request;
mod resolver;
mod settle;
mod shape;
mod slots;
pub mod stack;
mod stream;
#[cfg(test)]
mod tests;
mod verdict;

pub use answer_body::AnswerBody;
pub use client::{Connector, HttpsClient, build_connector};
pub use fleet::{ApplyError, Fleet};
pub use passthrough::{Passed, Passthrough};
