//! The directory sink: `<dir>/<destination>/<yyyy-mm-dd>.jsonl`, one JSON
//! object per line, appended and fdatasync'ed before the journal forgets.
//!
//! The files are also what the admin API reads, replays and purges. A
//! day is one part (its file, named ""), and a record's offset in it is
//! its stable handle: files are only appended to, or removed whole by a
//! purge. Replayed records are listed by offset in `<day>.replayed`
//! beside their file, so the records themselves never change, and tools
//! that read `*.jsonl` see nothing new.

use super::shelf::{Place, Purged, Shelf, days_of, is_day};
use super::{DeadLetterSink, Key, Line, keys_by_day};
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

pub struct DirSink {
    root: PathBuf,
    /// Serializes appends, marks and purges, so that lines from concurrent
    /// attempts never interleave and a purge never cuts a write in two.
    lock: Mutex<()>,
}

impl DirSink {
    pub fn new(root: PathBuf) -> Self {
        DirSink {
            root,
            lock: Mutex::new(()),
        }
    }

    fn lock(&self) -> std::io::Result<MutexGuard<'_, ()>> {
        self.lock
            .lock()
            .map_err(|_| std::io::Error::other("dead-letter sink lock poisoned"))
    }

    fn file(&self, destination: &str, day: &str, ext: &str) -> PathBuf {
        self.root.join(destination).join(format!("{day}.{ext}"))
    }

    /// Every whole line of a day's file from `from` on and before `upto`,
    /// to `each` until it returns false.
    fn read(
        &self,
        destination: &str,
        day: &str,
        from: u64,
        upto: u64,
        each: &mut dyn FnMut(u64, &str) -> bool,
    ) -> std::io::Result<()> {
        let mut file = match File::open(self.file(destination, day, "jsonl")) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        file.seek(SeekFrom::Start(from))?;
        let mut reader = BufReader::with_capacity(256 << 10, file);
        let mut offset = from;
        let mut buf = Vec::new();
        while offset < upto {
            buf.clear();
            let n = reader.read_until(b'\n', &mut buf)?;
            if n == 0 || buf.last() != Some(&b'\n') {
                return Ok(());
            }
            let line = String::from_utf8_lossy(&buf[..n - 1]);
            if !each(offset, &line) {
                return Ok(());
            }
            offset += n as u64;
        }
        Ok(())
    }
}

impl Shelf for DirSink {
    fn days(&self, destination: &str) -> std::io::Result<Vec<String>> {
        let entries = match std::fs::read_dir(self.root.join(destination)) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut days = Vec::new();
        for entry in entries {
            let name = entry?.file_name();
            let Some(day) = name.to_str().and_then(|n| n.strip_suffix(".jsonl")) else {
                continue;
            };
            if is_day(day) {
                days.push(day.to_string());
            }
        }
        days.sort();
        Ok(days)
    }

    fn parts(&self, destination: &str, day: &str) -> std::io::Result<Vec<(String, u64)>> {
        match std::fs::metadata(self.file(destination, day, "jsonl")) {
            Ok(m) => Ok(vec![(String::new(), m.len())]),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    fn lines(
        &self,
        destination: &str,
        day: &str,
        _part: &str,
        from: u64,
        upto: u64,
        each: &mut dyn FnMut(u64, &str) -> bool,
    ) -> std::io::Result<()> {
        self.read(destination, day, from, upto, each)
    }

    fn replayed(&self, destination: &str, day: &str) -> std::io::Result<HashSet<(String, u64)>> {
        let mut text = String::new();
        match File::open(self.file(destination, day, "replayed")) {
            Ok(mut f) => f.read_to_string(&mut text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashSet::new()),
            Err(e) => return Err(e),
        };
        // A last line without its newline was cut by a crash: `10240` cut
        // to `10` would hide another record, so it counts for nothing (that
        // record may be replayed again, never hidden).
        let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        Ok(whole
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .map(|offset| (String::new(), offset))
            .collect())
    }

    fn mark_replayed(&self, destination: &str, places: &[Place]) -> std::io::Result<()> {
        let _guard = self.lock()?;
        for day in days_of(places) {
            let text: String = places
                .iter()
                .filter(|p| p.day == day)
                .map(|p| format!("{}\n", p.offset))
                .collect();
            append(
                &self.root,
                destination,
                &self.file(destination, day, "replayed"),
                text.as_bytes(),
            )?;
        }
        Ok(())
    }

    fn purge(&self, destination: &str, before: Option<&str>) -> std::io::Result<Purged> {
        let _guard = self.lock()?;
        let mut purged = Purged::default();
        for day in self.days(destination)? {
            if before.is_some_and(|b| day.as_str() >= b) {
                continue;
            }
            let path = self.file(destination, &day, "jsonl");
            let mut records = 0;
            self.read(destination, &day, 0, u64::MAX, &mut |_, _| {
                records += 1;
                true
            })?;
            // Marks first: a crash between the two leaves records offered
            // again, never a later file of the same day with stale marks.
            match std::fs::remove_file(self.file(destination, &day, "replayed")) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            std::fs::remove_file(&path)?;
            purged.records += records;
            purged.files.push(path.display().to_string());
        }
        if !purged.files.is_empty() {
            File::open(self.root.join(destination))?.sync_all()?;
        }
        Ok(purged)
    }
}

/// Appends `bytes` to `path` (created 0600) in `root/destination`, durably:
/// the data, and the directory entries of a new folder or file.
fn append(root: &Path, destination: &str, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = root.join(destination);
    let created = !path.exists();
    if !dir.exists() {
        std::fs::create_dir_all(&dir)?;
        File::open(root)?.sync_all()?;
    }
    // 0600: a record holds the app's body and headers, at rest.
    let mut file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    // A write cut by a crash leaves a line without its newline, never read
    // as a record: cut it off, so that the next one starts a line of its own.
    let len = file.metadata()?.len();
    if len > 0 && !ends_line(&file, len)? {
        let mut end = len;
        let mut byte = [0u8];
        // Bounded by the file's length.
        while end > 0 {
            file.read_exact_at(&mut byte, end - 1)?;
            if byte[0] == b'\n' {
                break;
            }
            end -= 1;
        }
        file.set_len(end)?;
    }
    file.write_all(bytes)?;
    file.sync_data()?;
    if created {
        File::open(&dir)?.sync_all()?;
    }
    Ok(())
}

fn ends_line(file: &File, len: u64) -> std::io::Result<bool> {
    let mut last = [0u8];
    file.read_exact_at(&mut last, len - 1)?;
    Ok(last[0] == b'\n')
}

impl DeadLetterSink for DirSink {
    /// Reads the day files the keys' dead-letter times name, whole (a
    /// record is appended after its time was chosen, but maybe long after,
    /// behind later ones), until every key is found.
    fn holds(&self, destination: &str, keys: &[Key]) -> std::io::Result<HashSet<Key>> {
        let mut found = HashSet::new();
        for (day, wanted) in keys_by_day(keys) {
            let mut left = wanted.keys.len();
            self.read(destination, &day, 0, u64::MAX, &mut |_, line| {
                if let Some(k) = wanted.find(line)
                    && found.insert(k)
                {
                    left -= 1;
                }
                left > 0
            })?;
        }
        Ok(found)
    }

    fn write(&self, destination: &str, day: &str, lines: &[&Line]) -> std::io::Result<()> {
        let _guard = self.lock()?;
        let mut buf = Vec::with_capacity(lines.iter().map(|l| l.text.len() + 1).sum());
        for line in lines {
            buf.extend_from_slice(line.text.as_bytes());
            buf.push(b'\n');
        }
        append(
            &self.root,
            destination,
            &self.file(destination, day, "jsonl"),
            &buf,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(sink: &DirSink, day: &str, lines: &[&str]) {
        let lines: Vec<Line> = lines.iter().map(|l| Line::bare(l)).collect();
        let refs: Vec<&Line> = lines.iter().collect();
        sink.write("orders", day, &refs).expect("write");
    }

    fn all(sink: &DirSink, day: &str) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        sink.lines("orders", day, "", 0, u64::MAX, &mut |o, l| {
            out.push((o, l.to_string()));
            true
        })
        .expect("lines");
        out
    }

    #[test]
    fn appends_lines_per_destination_and_day() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let sink = DirSink::new(tmp.path().to_path_buf());
        write(&sink, "2026-11-22", &["{\"a\":1}"]);
        write(&sink, "2026-11-22", &["{\"a\":2}", "{\"a\":3}"]);
        let text =
            std::fs::read_to_string(tmp.path().join("orders/2026-11-22.jsonl")).expect("read");
        assert_eq!(text, "{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n");
        assert_eq!(
            all(&sink, "2026-11-22"),
            [
                (0, "{\"a\":1}".into()),
                (8, "{\"a\":2}".into()),
                (16, "{\"a\":3}".into())
            ]
        );
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_cut_off_by_the_next_write() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let sink = DirSink::new(tmp.path().to_path_buf());
        write(&sink, "2026-11-22", &["{\"a\":1}"]);
        let path = tmp.path().join("orders/2026-11-22.jsonl");
        let mut f = OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(b"{\"torn\":").expect("write");
        assert_eq!(
            all(&sink, "2026-11-22").len(),
            1,
            "the torn line is not a record"
        );
        write(&sink, "2026-11-22", &["{\"a\":2}"]);
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text, "{\"a\":1}\n{\"a\":2}\n", "the torn line is cut off");
        // Only what existed when a reader started is read.
        write(&sink, "2026-11-22", &["{\"a\":3}"]);
        let mut upto = Vec::new();
        sink.lines("orders", "2026-11-22", "", 0, 16, &mut |o, _| {
            upto.push(o);
            true
        })
        .expect("lines");
        assert_eq!(upto, [0, 8]);
        // A torn replay mark hides nothing, and is cut off by the next.
        std::fs::write(tmp.path().join("orders/2026-11-22.replayed"), "8\n1").expect("write");
        assert_eq!(
            sink.replayed("orders", "2026-11-22").expect("read"),
            HashSet::from([(String::new(), 8)])
        );
        let place = Place {
            day: "2026-11-22".into(),
            part: String::new(),
            offset: 16,
        };
        sink.mark_replayed("orders", &[place]).expect("mark");
        assert_eq!(
            sink.replayed("orders", "2026-11-22").expect("read"),
            HashSet::from([(String::new(), 8), (String::new(), 16)])
        );
    }

    /// Records as delivery writes them, for `holds`.
    fn keyed(seq: i64, id: &str, at_ms: u64) -> (Key, String) {
        let event = crate::event::NewEvent {
            id: id.into(),
            destination: "orders".into(),
            method: "POST".into(),
            path: String::new(),
            headers: Vec::new(),
            body: bytes::Bytes::from_static(b"{}"),
            accepted_ms: 1_795_300_000_000,
        };
        let facts = crate::event::Fate {
            reason: crate::event::Reason::TimeToLiveExceeded,
            attempts: 0,
            last_outcome: crate::event::Outcome::Probation,
            last_status: None,
            last_attempt_ms: None,
            at_ms,
        };
        let written = super::super::Written {
            at_ms,
            seq,
            redact: &[],
        };
        let text = super::super::record(crate::event::Schema::Eventgrid, &event, &facts, &written);
        let key = Key {
            seq,
            id: id.into(),
            at_ms,
        };
        (key, text)
    }

    #[test]
    fn holds_finds_the_records_written_and_only_those() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let sink = DirSink::new(tmp.path().to_path_buf());
        // 2026-11-22, and the next day.
        let (t, next) = (1_795_350_000_000, 1_795_400_000_000);
        let (a, a_text) = keyed(1, "a", t);
        let (b, _) = keyed(2, "b", t);
        // The same id dead-lettered before (replayed since), another seq.
        let (a_before, a_before_text) = keyed(9, "a", t - 1);
        let (c, c_text) = keyed(3, "c", next);
        // A record from before records had a seq: the same id and time.
        let old = a_text.replacen(",\"seq\":1", "", 1);
        assert_ne!(old, a_text, "the seq was taken out");
        write(&sink, "2026-11-22", &[&old, &a_before_text]);
        let keys = [a.clone(), b.clone(), c.clone()];
        assert!(sink.holds("orders", &keys).expect("holds").is_empty());
        write(&sink, "2026-11-22", &[&a_text]);
        write(&sink, "2026-11-23", &[&c_text]);
        // A record cut by a crash is not one.
        let (d, d_text) = keyed(4, "d", t);
        let path = tmp.path().join("orders/2026-11-22.jsonl");
        let mut f = OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(&d_text.as_bytes()[..d_text.len() - 1])
            .expect("write");
        let found = sink
            .holds("orders", &[a.clone(), b, c.clone(), d])
            .expect("holds");
        assert_eq!(found, HashSet::from([a, c]));
        assert!(!found.contains(&a_before));
        assert!(
            sink.holds("other", &keys).expect("holds").is_empty(),
            "no folder: nothing held"
        );
    }

    #[test]
    fn marks_and_purges_by_day() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let sink = DirSink::new(tmp.path().to_path_buf());
        write(&sink, "2026-11-20", &["{}", "{}"]);
        write(&sink, "2026-11-21", &["{}"]);
        write(&sink, "2026-11-22", &["{}"]);
        std::fs::write(tmp.path().join("orders/notes.txt"), "keep").expect("write");
        let place = |day: &str, offset| Place {
            day: day.into(),
            part: String::new(),
            offset,
        };
        sink.mark_replayed("orders", &[place("2026-11-20", 3), place("2026-11-22", 0)])
            .expect("mark");
        assert_eq!(
            sink.replayed("orders", "2026-11-20").expect("read"),
            HashSet::from([(String::new(), 3)])
        );
        assert_eq!(
            sink.days("orders").expect("days"),
            ["2026-11-20", "2026-11-21", "2026-11-22"]
        );
        let purged = sink.purge("orders", Some("2026-11-22")).expect("purge");
        assert_eq!(purged.records, 3);
        assert_eq!(purged.files.len(), 2);
        assert_eq!(sink.days("orders").expect("days"), ["2026-11-22"]);
        assert!(!tmp.path().join("orders/2026-11-20.replayed").exists());
        assert_eq!(
            sink.replayed("orders", "2026-11-22").expect("read"),
            HashSet::from([(String::new(), 0)])
        );
        assert!(
            tmp.path().join("orders/notes.txt").exists(),
            "not the sink's: kept"
        );
        let purged = sink.purge("orders", None).expect("purge");
        assert_eq!(purged.records, 1);
        assert!(sink.days("orders").expect("days").is_empty());
    }
}
