//! The bucket sink (docs/object-storage.md): `dead_letter: { url: s3://bucket/prefix }`.
//! Each group of dead letters written together is one object,
//! `<prefix>/<destination>/<yyyy-mm-dd>/<first>-<last>-<uuid>-<count>.jsonl`
//! (its records' earliest and latest dead-letter times in ms, zero-padded,
//! and a UUIDv7, so that names sort by time and then by write; its record
//! count, so that a purge counts without reading), stored with one PUT before the journal forgets the
//! events: a mass expiry costs one request per group, not per event.
//!
//! Objects are never changed. A replay marks what it took with an object
//! of its own under `<day>/replayed/`, one `part offset` line per record,
//! so tools that read the `*.jsonl` objects see nothing new. A purge
//! deletes a day's objects, marks last (a crash between leaves records
//! offered again, never marks that hide a later record).
//!
//! The trait is blocking (its callers run it off the runtime, as for the
//! directory sink); each method waits for its requests on the runtime that
//! called `spawn_blocking`.

use super::shelf::{Place, Purged, Shelf, days_of, is_day};
use super::{DeadLetterSink, Key, Line, keys_by_day};
use crate::storage::Bucket;
use bytes::Bytes;
use std::collections::HashSet;
use std::future::Future;

pub struct BucketSink {
    bucket: Bucket,
}

/// The folder of replay marks in a day.
const MARKS: &str = "replayed";

/// What a part's name says of it.
#[derive(Debug, PartialEq)]
struct PartName {
    first_ms: u64,
    last_ms: u64,
    records: u64,
}

impl PartName {
    fn parse(name: &str) -> Option<PartName> {
        let stem = name.strip_suffix(".jsonl")?;
        let mut fields = stem.splitn(4, '-');
        let first_ms = fields.next()?.parse().ok()?;
        let last_ms = fields.next()?.parse().ok()?;
        fields.next()?;
        let records = fields.next()?.parse().ok()?;
        Some(PartName {
            first_ms,
            last_ms,
            records,
        })
    }

    fn name(lines: &[&Line]) -> String {
        let first = lines.iter().map(|l| l.key.at_ms).min().unwrap_or(0);
        let last = lines.iter().map(|l| l.key.at_ms).max().unwrap_or(0);
        let id = uuid::Uuid::now_v7().simple();
        format!("{first:013}-{last:013}-{id}-{}.jsonl", lines.len())
    }
}

fn io(e: object_store::Error) -> std::io::Error {
    std::io::Error::other(e)
}

/// Waits for `f` on the runtime of the blocking thread this runs on.
fn wait<T>(f: impl Future<Output = object_store::Result<T>>) -> std::io::Result<T> {
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|_| std::io::Error::other("the bucket sink was called outside the runtime"))?;
    handle.block_on(f).map_err(io)
}

impl BucketSink {
    pub fn new(bucket: Bucket) -> Self {
        BucketSink { bucket }
    }

    /// The objects directly in a day's folder: its parts, by name.
    fn listed(&self, destination: &str, day: &str) -> std::io::Result<Vec<(String, u64)>> {
        let prefix = self.bucket.path([destination, day]);
        let files = wait(self.bucket.files(&prefix))?;
        Ok(files
            .into_iter()
            .filter_map(|meta| {
                let name = meta.location.filename()?.to_string();
                PartName::parse(&name).map(|_| (name, meta.size))
            })
            .collect())
    }

    fn body(&self, destination: &str, day: &str, part: &str) -> std::io::Result<Option<Bytes>> {
        wait(self.bucket.get(&self.bucket.path([destination, day, part])))
    }
}

/// Every whole line of `body` from `from` on and before `upto`.
fn each_line(body: &[u8], from: u64, upto: u64, each: &mut dyn FnMut(u64, &str) -> bool) {
    let mut offset = from as usize;
    let end = body.len().min(usize::try_from(upto).unwrap_or(usize::MAX));
    // Bounded: each round moves past one line.
    while offset < end {
        let Some(n) = body[offset..].iter().position(|b| *b == b'\n') else {
            return;
        };
        let line = String::from_utf8_lossy(&body[offset..offset + n]);
        if !each(offset as u64, &line) {
            return;
        }
        offset += n + 1;
    }
}

impl DeadLetterSink for BucketSink {
    fn write(&self, destination: &str, day: &str, lines: &[&Line]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(lines.iter().map(|l| l.text.len() + 1).sum());
        for line in lines {
            buf.extend_from_slice(line.text.as_bytes());
            buf.push(b'\n');
        }
        let path = self
            .bucket
            .path([destination, day, PartName::name(lines).as_str()]);
        wait(self.bucket.put(&path, Bytes::from(buf)))
    }

    /// Reads the parts of the keys' days whose times can hold them.
    fn holds(&self, destination: &str, keys: &[Key]) -> std::io::Result<HashSet<Key>> {
        let mut found = HashSet::new();
        for (day, wanted) in keys_by_day(keys) {
            let lo = wanted.keys.iter().map(|k| k.at_ms).min().unwrap_or(0);
            let hi = wanted
                .keys
                .iter()
                .map(|k| k.at_ms)
                .max()
                .unwrap_or(u64::MAX);
            for (part, _) in self.listed(destination, &day)? {
                if !PartName::parse(&part).is_some_and(|p| p.first_ms <= hi && lo <= p.last_ms) {
                    continue;
                }
                let Some(body) = self.body(destination, &day, &part)? else {
                    continue;
                };
                each_line(&body, 0, u64::MAX, &mut |_, line| {
                    if let Some(k) = wanted.find(line) {
                        found.insert(k);
                    }
                    true
                });
            }
        }
        Ok(found)
    }
}

impl Shelf for BucketSink {
    fn days(&self, destination: &str) -> std::io::Result<Vec<String>> {
        let mut days = wait(self.bucket.folders(&self.bucket.path([destination])))?;
        days.retain(|d| is_day(d));
        Ok(days)
    }

    fn parts(&self, destination: &str, day: &str) -> std::io::Result<Vec<(String, u64)>> {
        self.listed(destination, day)
    }

    fn lines(
        &self,
        destination: &str,
        day: &str,
        part: &str,
        from: u64,
        upto: u64,
        each: &mut dyn FnMut(u64, &str) -> bool,
    ) -> std::io::Result<()> {
        if let Some(body) = self.body(destination, day, part)? {
            each_line(&body, from, upto, each);
        }
        Ok(())
    }

    fn replayed(&self, destination: &str, day: &str) -> std::io::Result<HashSet<(String, u64)>> {
        let marks = wait(
            self.bucket
                .list(&self.bucket.path([destination, day, MARKS])),
        )?;
        let mut out = HashSet::new();
        for meta in marks {
            let Some(body) = wait(self.bucket.get(&meta.location))? else {
                continue;
            };
            for line in String::from_utf8_lossy(&body).lines() {
                if let Some((part, offset)) = line.split_once(' ')
                    && let Ok(offset) = offset.parse()
                {
                    out.insert((part.to_string(), offset));
                }
            }
        }
        Ok(out)
    }

    fn mark_replayed(&self, destination: &str, places: &[Place]) -> std::io::Result<()> {
        for day in days_of(places) {
            let text: String = places
                .iter()
                .filter(|p| p.day == day)
                .map(|p| format!("{} {}\n", p.part, p.offset))
                .collect();
            let name = format!("{}.marks", uuid::Uuid::now_v7().simple());
            let path = self.bucket.path([destination, day, MARKS, name.as_str()]);
            wait(self.bucket.put(&path, Bytes::from(text)))?;
        }
        Ok(())
    }

    fn purge(&self, destination: &str, before: Option<&str>) -> std::io::Result<Purged> {
        let mut purged = Purged::default();
        for day in self.days(destination)? {
            if before.is_some_and(|b| day.as_str() >= b) {
                continue;
            }
            let objects = wait(self.bucket.list(&self.bucket.path([destination, &day])))?;
            let marks_folder = self.bucket.path([destination, &day, MARKS]);
            let (marks, parts): (Vec<_>, Vec<_>) = objects
                .into_iter()
                .partition(|m| m.location.prefix_matches(&marks_folder));
            for meta in parts.iter().chain(&marks) {
                wait(self.bucket.delete(&meta.location))?;
                if let Some(p) = meta.location.filename().and_then(PartName::parse) {
                    purged.records += p.records;
                    purged.files.push(self.bucket.url_of(&meta.location));
                }
            }
        }
        Ok(purged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_name_sorts_by_time_and_carries_its_count() {
        let line = |at_ms| Line {
            key: Key {
                seq: 1,
                id: "a".into(),
                at_ms,
            },
            text: String::new(),
        };
        let (a, b) = (line(1_795_391_999_999), line(5));
        let name = PartName::name(&[&a, &b]);
        assert!(name.starts_with("0000000000005-1795391999999-"), "{name}");
        assert!(name.ends_with("-2.jsonl"), "{name}");
        assert_eq!(
            PartName::parse(&name),
            Some(PartName {
                first_ms: 5,
                last_ms: 1_795_391_999_999,
                records: 2
            })
        );
        assert_eq!(PartName::parse("notes.txt"), None);
        assert_eq!(PartName::parse("1-2-x-y.jsonl"), None, "no count");
    }

    #[test]
    fn lines_of_an_object_skip_a_torn_end_and_stop_at_the_bound() {
        let body = b"{\"a\":1}\n{\"a\":2}\n{\"torn\":";
        let mut seen = Vec::new();
        each_line(body, 0, u64::MAX, &mut |o, l| {
            seen.push((o, l.to_string()));
            true
        });
        assert_eq!(seen, [(0, "{\"a\":1}".into()), (8, "{\"a\":2}".into())]);
        seen.clear();
        each_line(body, 8, 8, &mut |o, l| {
            seen.push((o, l.to_string()));
            true
        });
        assert!(seen.is_empty(), "nothing before the bound");
    }
}
