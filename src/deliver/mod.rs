//! Delivery: one dispatcher per destination drives attempts through a tower
//! stack built per destination, and settles each outcome in the journal.

mod batch;
mod client;
mod dispatcher;
pub mod health;
mod outcome_log;
mod request;
mod settle;
mod shape;
pub mod stack;

pub use client::{HttpsClient, build_client};
pub use dispatcher::Dispatcher;

use crate::config::DestinationSettings;
use crate::deadletter::DeadLetterSink;
use crate::journal::Journal;
use std::sync::Arc;

/// Everything one destination's attempts need.
pub fn settle_ctx(
    dest: Arc<DestinationSettings>,
    journal: Journal,
    sink: Option<Arc<dyn DeadLetterSink>>,
    client: HttpsClient,
    health: Arc<health::Health>,
) -> settle::Ctx {
    let stack = stack::build(&dest, client);
    settle::Ctx {
        dest,
        journal,
        sink,
        stack,
        health,
        late: settle::LateCompleted::default(),
    }
}
