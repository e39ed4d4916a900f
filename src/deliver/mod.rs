//! Delivery: one dispatcher per destination drives attempts through a tower
//! stack built per destination, and settles each outcome in the journal.

mod batch;
mod client;
mod dispatcher;
mod fleet;
pub mod health;
mod outcome_log;
mod request;
mod settle;
mod shape;
pub mod stack;

pub use client::{Connector, HttpsClient, build_connector};
pub use fleet::Fleet;
