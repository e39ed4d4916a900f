//! A sink read back by the admin API (docs/http-api.md), whether a directory or a
//! bucket: records by UTC day of dead-lettering; a day in parts, in the
//! order they were written (a directory's day is one file, a bucket's day
//! one object per group of dead letters); a record's place is (day, part,
//! byte offset of its line), stable until a purge removes its day.
//!
//! Blocking: callers run these off the runtime (a bucket's methods wait
//! for its requests there).

use super::DeadLetterSink;
use std::collections::HashSet;

/// A record's place in the sink.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Place {
    pub day: String,
    /// The part of the day: empty for a directory's one file.
    pub part: String,
    pub offset: u64,
}

/// What a purge removed.
#[derive(Debug, Default, PartialEq)]
pub struct Purged {
    pub records: u64,
    /// The files or objects removed.
    pub files: Vec<String>,
}

pub trait Shelf: DeadLetterSink {
    /// The days that hold records of `destination`, oldest first.
    fn days(&self, destination: &str) -> std::io::Result<Vec<String>>;

    /// A day's parts, in order, with their sizes now: what a replay of
    /// `all` reads, so that it never reaches the records its own replays
    /// write.
    fn parts(&self, destination: &str, day: &str) -> std::io::Result<Vec<(String, u64)>>;

    /// Calls `each(offset, line)` for every whole line of a part from
    /// `from` on and before `upto`, until it returns false. A last line
    /// without its newline is a write in progress and is skipped.
    fn lines(
        &self,
        destination: &str,
        day: &str,
        part: &str,
        from: u64,
        upto: u64,
        each: &mut dyn FnMut(u64, &str) -> bool,
    ) -> std::io::Result<()>;

    /// The (part, offset) of a day's records already replayed.
    fn replayed(&self, destination: &str, day: &str) -> std::io::Result<HashSet<(String, u64)>>;

    /// Records `places` as replayed, durably; the records never change.
    fn mark_replayed(&self, destination: &str, places: &[Place]) -> std::io::Result<()>;

    /// Removes `destination`'s days before `before` (all of them without),
    /// with their replay marks; counts the records removed.
    fn purge(&self, destination: &str, before: Option<&str>) -> std::io::Result<Purged>;
}

/// The days `places` are in, each once, in order: a sink marks a day's
/// replays together.
pub(super) fn days_of(places: &[Place]) -> Vec<&str> {
    let mut days: Vec<&str> = places.iter().map(|p| p.day.as_str()).collect();
    days.sort_unstable();
    days.dedup();
    days
}

/// `yyyy-mm-dd`, as the sinks name their days (a stray name is ignored).
pub fn is_day(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
}
