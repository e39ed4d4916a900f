//! The per-attempt stack, outermost first: headers → classify → timeout (with late answers) →
//! http. Each layer has one job; the result is an `Attempted`, never an
//! error, so callers only deal with verdicts.

mod classify;
mod headers;
mod http;
mod timeout;

pub use classify::{Attempted, ClassifyLayer};
pub use headers::HeadersLayer;
pub use http::HttpService;
pub use timeout::{LateAnswer, TimedOut, TimeoutLayer};

use crate::config::DestinationSettings;
use crate::deliver::HttpsClient;
use bytes::Bytes;
use http_body_util::Full;
use std::convert::Infallible;
use tower::ServiceBuilder;
use tower::util::BoxCloneSyncService;

/// Which event and which attempt a request carries (a request extension).
#[derive(Clone, Debug)]
pub struct Attempt {
    pub id: String,
    pub number: u32,
}

pub type AttemptRequest = ::http::Request<Full<Bytes>>;
pub type AttemptService = BoxCloneSyncService<AttemptRequest, Attempted, Infallible>;

pub fn build(dest: &DestinationSettings, client: HttpsClient) -> AttemptService {
    let svc = ServiceBuilder::new()
        .layer(HeadersLayer::new(dest))
        .layer(ClassifyLayer::new(dest.status.clone()))
        .layer(TimeoutLayer::new(dest.timeout, dest.late_answer_window))
        .service(HttpService::new(client));
    BoxCloneSyncService::new(svc)
}
