//! Dead letters (docs/dead-letters.md): an event that will not be delivered is written
//! to a sink, and synced, before it leaves the journal.

mod browse;
mod bucket;
mod dir;
mod parse;
mod record;
mod shelf;
mod streak;
mod writer;

pub use browse::{Cursor, Filter, Order, Source, day_start_ms, find, page, unreplayed};
pub use bucket::BucketSink;
pub use dir::DirSink;
pub use parse::{Summary, parse};
pub use record::{Key, Written, record};
pub use shelf::{Place, Shelf, is_day};
pub use streak::{SinkStreak, Tally as SinkTally};
pub use writer::Writer;

use std::collections::{BTreeMap, HashSet};

/// Where dead letters go: a directory or a bucket. The trait keeps
/// delivery independent of them (and lets tests inject failures).
pub trait DeadLetterSink: Send + Sync {
    /// Stores `lines` (records of dead-letter day `day`) for
    /// `destination`, durably, before returning.
    fn write(&self, destination: &str, day: &str, lines: &[&Line]) -> std::io::Result<()>;

    /// Those of `keys` whose record `destination` already holds.
    fn holds(&self, destination: &str, keys: &[Key]) -> std::io::Result<HashSet<Key>>;
}

/// One record to write, under its key.
pub struct Line {
    pub key: Key,
    pub text: String,
}

impl Line {
    /// A record under a key of no event, for tests of what sinks store.
    #[cfg(test)]
    pub(crate) fn bare(text: &str) -> Line {
        Line {
            key: Key {
                seq: 0,
                id: String::new(),
                at_ms: 0,
            },
            text: text.to_string(),
        }
    }
}

/// Writes the records of `lines`, each to the file of its dead-letter day.
/// With `check`, those the sink already holds are left out: after a crash
/// between a record's write and the journal's delete, or a write that
/// failed part way, the record is there, and is not written twice.
pub fn write_once(
    sink: &dyn DeadLetterSink,
    destination: &str,
    lines: &[Line],
    check: bool,
) -> std::io::Result<()> {
    let held = if check {
        let keys: Vec<Key> = lines.iter().map(|l| l.key.clone()).collect();
        sink.holds(destination, &keys)?
    } else {
        HashSet::new()
    };
    if !held.is_empty() {
        tracing::info!(
            destination,
            records = held.len(),
            "dead letters found already written (before a restart, or by a failed write): not written again"
        );
    }
    for (day, day_lines) in missing_by_day(lines, &held) {
        sink.write(destination, &day, &day_lines)?;
    }
    Ok(())
}

/// The lines not `held`, per UTC day of their dead-letter time (the
/// sink's file or folder), in their order.
fn missing_by_day<'a>(lines: &'a [Line], held: &HashSet<Key>) -> BTreeMap<String, Vec<&'a Line>> {
    let mut days: BTreeMap<String, Vec<&Line>> = BTreeMap::new();
    for line in lines.iter().filter(|l| !held.contains(&l.key)) {
        days.entry(day_of(line.key.at_ms)).or_default().push(line);
    }
    days
}

/// The keys a sink is searched for. Only a line that holds one of their
/// dead-letter times is parsed: most of a day's records are not.
struct Wanted {
    keys: HashSet<Key>,
    times: Vec<String>,
}

impl Wanted {
    fn new(keys: HashSet<Key>) -> Self {
        let mut times: Vec<String> = keys
            .iter()
            .map(|k| crate::clock::rfc3339(k.at_ms))
            .collect();
        times.sort_unstable();
        times.dedup();
        Wanted { keys, times }
    }

    /// The key of `line`, when it is one wanted.
    fn find(&self, line: &str) -> Option<Key> {
        if !self.times.iter().any(|t| line.contains(t.as_str())) {
            return None;
        }
        parse(line).ok()?.key().filter(|k| self.keys.contains(k))
    }
}

/// The keys wanted of each day (a dead-letter time's day is its record's).
fn keys_by_day(keys: &[Key]) -> BTreeMap<String, Wanted> {
    let mut days: BTreeMap<String, HashSet<Key>> = BTreeMap::new();
    for k in keys {
        days.entry(day_of(k.at_ms)).or_default().insert(k.clone());
    }
    days.into_iter().map(|(d, k)| (d, Wanted::new(k))).collect()
}

/// `yyyy-mm-dd` (UTC) of a dead-letter time: the day file its record is in.
fn day_of(at_ms: u64) -> String {
    crate::clock::rfc3339(at_ms)[..10].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Holds what it is told it holds; records each write.
    #[derive(Default)]
    struct Fake {
        held: HashSet<Key>,
        writes: Mutex<Vec<(String, Vec<String>)>>,
    }

    impl DeadLetterSink for Fake {
        fn write(&self, _: &str, day: &str, lines: &[&Line]) -> std::io::Result<()> {
            let mut writes = self.writes.lock().expect("lock");
            writes.push((
                day.to_string(),
                lines.iter().map(|l| l.text.clone()).collect(),
            ));
            Ok(())
        }

        fn holds(&self, _: &str, keys: &[Key]) -> std::io::Result<HashSet<Key>> {
            Ok(keys
                .iter()
                .filter(|k| self.held.contains(*k))
                .cloned()
                .collect())
        }
    }

    /// 2026-11-22T23:59:59.999Z and a millisecond later: two day files.
    const LATE: u64 = 1_795_391_999_999;

    fn line(seq: i64, at_ms: u64) -> Line {
        Line {
            key: Key {
                seq,
                id: format!("e{seq}"),
                at_ms,
            },
            text: format!("r{seq}"),
        }
    }

    #[test]
    fn a_checked_write_leaves_out_the_records_the_sink_holds_and_splits_by_day() {
        let lines = [line(1, LATE), line(2, LATE), line(3, LATE + 1)];
        let sink = Fake {
            held: HashSet::from([lines[0].key.clone()]),
            ..Fake::default()
        };
        write_once(&sink, "orders", &lines, true).expect("write");
        let writes = sink.writes.lock().expect("lock").clone();
        assert_eq!(
            writes,
            [
                ("2026-11-22".to_string(), vec!["r2".to_string()]),
                ("2026-11-23".to_string(), vec!["r3".to_string()]),
            ]
        );
    }

    #[test]
    fn an_unchecked_write_writes_every_record() {
        let lines = [line(1, LATE), line(2, LATE)];
        let sink = Fake {
            held: HashSet::from([lines[0].key.clone()]),
            ..Fake::default()
        };
        write_once(&sink, "orders", &lines, false).expect("write");
        let writes = sink.writes.lock().expect("lock").clone();
        assert_eq!(writes.len(), 1);
        assert_eq!(writes[0].1, ["r1", "r2"]);
    }
}
