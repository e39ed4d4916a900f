//! The directory sink: `<dir>/<destination>/<yyyy-mm-dd>.jsonl`, one JSON
//! object per line, appended and fdatasync'ed before the journal forgets.

use super::DeadLetterSink;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Mutex;

pub struct DirSink {
    root: PathBuf,
    /// Serializes appends so lines from concurrent attempts never interleave.
    lock: Mutex<()>,
}

impl DirSink {
    pub fn new(root: PathBuf) -> Self {
        DirSink {
            root,
            lock: Mutex::new(()),
        }
    }
}

impl DeadLetterSink for DirSink {
    fn write(&self, destination: &str, day: &str, lines: &[String]) -> std::io::Result<()> {
        let _guard = self
            .lock
            .lock()
            .map_err(|_| std::io::Error::other("dead-letter sink lock poisoned"))?;
        let dir = self.root.join(destination);
        let path = dir.join(format!("{day}.jsonl"));
        let created = !path.exists();
        let new_dir = !dir.exists();
        std::fs::create_dir_all(&dir)?;
        if new_dir {
            // The destination folder's own entry must be durable too.
            File::open(&self.root)?.sync_all()?;
        }
        // 0600: a record holds the app's body and headers, at rest.
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)?;
        let mut buf = Vec::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
        for line in lines {
            buf.extend_from_slice(line.as_bytes());
            buf.push(b'\n');
        }
        file.write_all(&buf)?;
        file.sync_data()?;
        if created {
            // A new file's directory entry must be durable too.
            File::open(&dir)?.sync_all()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_lines_per_destination_and_day() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let sink = DirSink::new(tmp.path().to_path_buf());
        sink.write("orders", "2026-11-22", &["{\"a\":1}".into()])
            .expect("write");
        sink.write(
            "orders",
            "2026-11-22",
            &["{\"a\":2}".into(), "{\"a\":3}".into()],
        )
        .expect("write");
        let text =
            std::fs::read_to_string(tmp.path().join("orders/2026-11-22.jsonl")).expect("read");
        assert_eq!(text, "{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n");
    }
}
