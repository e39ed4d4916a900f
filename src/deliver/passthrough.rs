//! Passthrough mode (docs/publishing.md): the app's request goes at once through the
//! destination's attempt stack, retried in line by `tower::retry` with
//! `stack::InlineRetry` while `passthrough_deadline` allows, and the app
//! gets the endpoint's own answer with its body streamed, or why there was
//! none. Nothing is journaled: until it has its answer the app holds the
//! request, and a crash costs it an error, never an event it was told is
//! safe.

use super::answer_body::{AnswerBody, Unsettled};
use super::outcome_log;
use super::request;
use super::stack::{Deadline, InlineRetry, PassthroughService, Trail};
use crate::config::DestinationSettings;
use crate::event::NewEvent;
use crate::event::Outcome;
use crate::metrics;
use http::Response;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;
use tower::ServiceExt;
use tower::retry::Retry;

/// One destination's passthrough: its settings and attempt stack.
#[derive(Clone)]
pub struct Passthrough {
    dest: Arc<DestinationSettings>,
    stack: PassthroughService,
    counted: Arc<metrics::PassthroughAttempts>,
}

/// How a passthrough request ended, for ingress to answer the app.
pub enum Passed {
    /// The endpoint's answer, whatever its status, body still to come.
    Answer {
        response: Response<AnswerBody>,
        attempts: u32,
    },
    /// The last attempt got no answer: `outcome` and `error` say why.
    NoAnswer {
        outcome: Outcome,
        error: String,
        attempts: u32,
        /// The status of an earlier attempt, if one got an answer.
        last_status: Option<u16>,
        /// The deadline the attempts were made within.
        deadline: std::time::Duration,
    },
    /// The request cannot be sent (its target is not a valid URI).
    Unsendable(String),
}

impl Passthrough {
    pub fn new(
        dest: Arc<DestinationSettings>,
        stack: PassthroughService,
        counted: Arc<metrics::PassthroughAttempts>,
    ) -> Self {
        Passthrough {
            dest,
            stack,
            counted,
        }
    }

    /// Forwards `event` and waits for the endpoint's answer, at most
    /// `passthrough_deadline` (counted from here).
    pub async fn forward(&self, event: &NewEvent) -> Passed {
        let started = Instant::now();
        let deadline = started + self.dest.passthrough_deadline;
        let mut req = match request::build_passthrough(&self.dest, event) {
            Ok(r) => r,
            Err(e) => return Passed::Unsendable(e.to_string()),
        };
        req.extensions_mut().insert(Deadline(deadline));
        let trail = Arc::new(Mutex::new(Trail::default()));
        let policy = InlineRetry::new(
            self.dest.clone(),
            deadline,
            trail.clone(),
            self.counted.clone(),
        );
        let answered = match Retry::new(policy, self.stack.clone()).oneshot(req).await {
            Ok(a) => a,
            Err(never) => match never {},
        };
        let trail = trail.lock().map(|t| t.clone()).unwrap_or_default();
        let a = &answered.attempted;
        outcome_log::passed_through(
            &event.destination,
            &event.id,
            trail.attempts,
            a.status,
            a.classified.outcome,
            started.elapsed(),
        );
        match answered.answer {
            Some(mut response) => {
                let tally = response.extensions_mut().remove::<Unsettled>();
                Passed::Answer {
                    response: response.map(|body| AnswerBody::new(body, tally)),
                    attempts: trail.attempts,
                }
            }
            None => Passed::NoAnswer {
                outcome: a.classified.outcome,
                error: a.error.clone().unwrap_or_default(),
                attempts: trail.attempts,
                last_status: trail.last_status,
                deadline: self.dest.passthrough_deadline,
            },
        }
    }
}
