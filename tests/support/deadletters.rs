//! Reading what courier dead-lettered: `dl/<destination>/<UTC day>.jsonl`
//! files of one JSON record a line.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::courier::Courier;
use crate::fail;

const POLL: Duration = Duration::from_millis(10);

/// Today's UTC date, as dead-letter files are named.
pub fn today() -> String {
    humantime::format_rfc3339(std::time::SystemTime::now()).to_string()[..10].to_string()
}

/// `dl/<destination>` under the courier's directory.
pub fn dl_dir(c: &Courier, destination: &str) -> PathBuf {
    c.dir().join("dl").join(destination)
}

/// Blocks `destination`'s dead-letter folder: a file stands in its place,
/// so every write to it fails until the file is removed. Its path.
pub fn block_sink(c: &Courier, destination: &str) -> PathBuf {
    let sink = dl_dir(c, destination);
    if let Some(parent) = sink.parent() {
        std::fs::create_dir_all(parent).expect("dead-letter root");
    }
    std::fs::write(&sink, b"not a folder").expect("block the sink");
    sink
}

/// Every complete line of every `*.jsonl` file in `dir` (not the
/// `<day>.replayed` marks beside them), parsed, with the file names.
pub fn read_dead_letters(c: &Courier, dir: &Path) -> (Vec<String>, Vec<Value>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (Vec::new(), Vec::new());
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    let mut names = Vec::new();
    let mut records = Vec::new();
    for file in files {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| fail!(c, "read {}: {e}", file.display()));
        // A line still being appended has no newline yet: leave it for later.
        let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        for line in complete.lines() {
            let v = serde_json::from_str(line).unwrap_or_else(|e| {
                fail!(c, "{}: a line is not JSON ({e}): {line:?}", file.display())
            });
            records.push(v);
        }
        names.push(name);
    }
    (names, records)
}

/// Waits (bounded) for at least `n` dead-letter records under
/// `dl/<destination>/`; returns the file names and the records.
pub async fn wait_dead_letters(
    c: &Courier,
    destination: &str,
    n: usize,
    timeout: Duration,
) -> (Vec<String>, Vec<Value>) {
    let dir = dl_dir(c, destination);
    let deadline = Instant::now() + timeout;
    // Bounded by the deadline.
    loop {
        let (names, records) = read_dead_letters(c, &dir);
        if records.len() >= n {
            return (names, records);
        }
        if Instant::now() >= deadline {
            fail!(
                c,
                "waited {timeout:?} for {n} dead letters in {}, found {} in {names:?}",
                dir.display(),
                records.len()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Every file under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}
