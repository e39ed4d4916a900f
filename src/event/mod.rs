//! Events as values, apart from where they are stored: ingress makes
//! them, the journal keeps them, delivery, dead letters and hand-off read
//! them; none of those needs another to name an event.

pub mod endpoint;
pub mod ordering;
mod outcome;
pub mod path;
pub mod rules;
mod schema;
pub(crate) mod signature;

pub use outcome::{Outcome, Reason};
pub use schema::Schema;

use bytes::Bytes;

/// A header as forwarded: the name (lowercase) and the raw value bytes.
pub type Header = (String, Vec<u8>);

/// An event as ingress hands it to the journal.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    pub id: String,
    pub destination: String,
    pub method: String,
    /// The app's `/rest?query` after the destination name.
    pub path: String,
    pub headers: Vec<Header>,
    pub body: Bytes,
    pub accepted_ms: u64,
}

impl NewEvent {
    /// What this event counts against `journal.max_bytes`.
    pub fn size(&self) -> u64 {
        let headers: usize = self
            .headers
            .iter()
            .map(|(n, v)| n.len() + v.len() + 6)
            .sum();
        (self.body.len() + headers + self.path.len() + self.id.len()) as u64
    }
}

/// A pending event as the dispatcher reads it back.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredEvent {
    pub seq: i64,
    pub event: NewEvent,
    pub attempts: u32,
    pub next_due_ms: u64,
    pub last_outcome: Option<Outcome>,
    pub last_status: Option<u16>,
    pub last_attempt_ms: Option<u64>,
    /// The batch this event was last attempted in: a failed batch is
    /// retried as a whole, under the same id (its `webhook-id`).
    pub batch: Option<String>,
    /// Set when a run before this one decided to dead-letter the event
    /// (`Change::DeadLetter`) and may not have finished: it is never
    /// attempted again, only its record written (once).
    pub fate: Option<Fate>,
}

impl StoredEvent {
    /// `event` as just accepted: never attempted, due at its accept time.
    pub fn fresh(seq: i64, event: NewEvent) -> StoredEvent {
        StoredEvent {
            seq,
            next_due_ms: event.accepted_ms,
            event,
            attempts: 0,
            last_outcome: None,
            last_status: None,
            last_attempt_ms: None,
            batch: None,
            fate: None,
        }
    }
}

/// Why an event is dead-lettered and what its record says, recorded in the
/// journal before the record is written, so that a restart writes the same
/// record (or finds it written) instead of deciding again.
#[derive(Clone, Debug, PartialEq)]
pub struct Fate {
    pub reason: Reason,
    pub attempts: u32,
    pub last_outcome: Outcome,
    pub last_status: Option<u16>,
    pub last_attempt_ms: Option<u64>,
    /// The record's `deadLetterTime`, which also names its day's file.
    pub at_ms: u64,
}
