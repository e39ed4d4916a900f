//! Dead letters (SPEC §4.6): an event that will not be delivered is written
//! to a sink, and synced, before it leaves the journal.

mod dir;
mod record;

pub use dir::DirSink;
pub use record::{Facts, record};

/// Where dead letters go. The directory sink is the one built in; the trait
/// keeps delivery independent of it (and lets tests inject failures).
pub trait DeadLetterSink: Send + Sync {
    /// Appends `lines` (one JSON object each) for `destination`, durably,
    /// before returning.
    fn write(&self, destination: &str, day: &str, lines: &[String]) -> std::io::Result<()>;
}
