//! `tower::retry`'s policy for passthrough. Each attempt's answer is
//! counted like a durable one's (with `mode="passthrough"`), then the pure
//! `policy::inline` decides whether another fits before the deadline. The
//! next attempt is the app's request again with its number one higher; the
//! layers below give it fresh headers and a fresh signature.

use super::{Answered, Attempt, AttemptRequest, drain};
use crate::config::DestinationSettings;
use crate::deliver::answer_body::Unsettled;
use crate::metrics;
use crate::policy::inline::Inline;
use hyper::body::{Body, Incoming};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use tokio::time::{Instant, Sleep};
use tower::retry::Policy;

/// What the app's answer tells of the attempts made for it.
#[derive(Clone, Debug, Default)]
pub struct Trail {
    pub attempts: u32,
    /// The last status any attempt got, when the last attempt got none.
    pub last_status: Option<u16>,
}

#[derive(Clone)]
pub struct InlineRetry {
    dest: Arc<DestinationSettings>,
    deadline: Instant,
    trail: Arc<Mutex<Trail>>,
    counted: Arc<metrics::PassthroughAttempts>,
}

impl InlineRetry {
    pub fn new(
        dest: Arc<DestinationSettings>,
        deadline: Instant,
        trail: Arc<Mutex<Trail>>,
        counted: Arc<metrics::PassthroughAttempts>,
    ) -> Self {
        InlineRetry {
            dest,
            deadline,
            trail,
            counted,
        }
    }
}

impl Policy<AttemptRequest, Answered<Incoming>, Infallible> for InlineRetry {
    type Future = Sleep;

    fn retry(
        &mut self,
        req: &mut AttemptRequest,
        result: &mut Result<Answered<Incoming>, Infallible>,
    ) -> Option<Sleep> {
        let answered = match result {
            Ok(a) => a,
            Err(never) => match *never {},
        };
        let a = &answered.attempted;
        let number = req.extensions().get::<Attempt>().map_or(1, |at| at.number);
        let outcome = a.classified.outcome;
        tracing::debug!(destination = %self.dest.name, mode = "passthrough", attempt = number, outcome = outcome.as_str(), status = a.status, error = a.error.as_deref(), "attempt");
        if let Ok(mut trail) = self.trail.lock() {
            trail.attempts = number;
            trail.last_status = a.status.or(trail.last_status);
        }
        let inline = Inline {
            schedule: &self.dest.schedule,
            max_attempts: self.dest.limits.max_attempts,
            jitter: self.dest.jitter,
        };
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        let wait = inline.wait(a.classified, number, a.took, remaining, &mut rand::rng());
        let Some(wait) = wait else {
            // The app's answer: counted when its body ends, if it has one.
            match answered.answer.as_mut() {
                Some(answer) if !answer.body().is_end_stream() => {
                    let took = a.took;
                    answer.extensions_mut().insert(Unsettled {
                        counted: self.counted.clone(),
                        outcome,
                        took,
                    });
                }
                _ => self.counted.attempt(outcome, a.took),
            }
            return None;
        };
        self.counted.attempt(outcome, a.took);
        if let Some(answer) = answered.answer.take() {
            drain(answer.into_body());
        }
        if let Some(at) = req.extensions_mut().get_mut::<Attempt>() {
            at.number += 1;
        }
        Some(tokio::time::sleep(wait))
    }

    fn clone_request(&mut self, req: &AttemptRequest) -> Option<AttemptRequest> {
        let mut copy = AttemptRequest::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.version_mut() = req.version();
        *copy.headers_mut() = req.headers().clone();
        *copy.extensions_mut() = req.extensions().clone();
        Some(copy)
    }
}
