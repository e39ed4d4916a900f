//! Dead letters (SPEC §4.6): an event that will not be delivered is written
//! to a sink, and synced, before it leaves the journal.

mod browse;
mod dir;
mod parse;
mod record;

pub use browse::{
    Cursor, Filter, Found, Item, Order, Page, Source, day_start_ms, find, page, unreplayed,
};
pub use dir::{DirSink, Place, Purged, is_day};
pub use parse::{ParseError, Rebuilt, Record, Summary, parse};
pub use record::{Facts, Written, record};

/// Where dead letters go. The directory sink is the one built in; the trait
/// keeps delivery independent of it (and lets tests inject failures).
pub trait DeadLetterSink: Send + Sync {
    /// Appends `lines` (one JSON object each) for `destination`, durably,
    /// before returning.
    fn write(&self, destination: &str, day: &str, lines: &[String]) -> std::io::Result<()>;
}
