//! Pauses that outlive the process: an operator's, and a 410 Gone's. A
//! pause is journal state like the events it holds back, so it lives in
//! `journal.dir`, in one small JSON file replaced atomically (write a
//! temporary file, fsync it, rename it over, fsync the directory) before
//! the pause is acknowledged. A file rather than a table of `journal.db`:
//! the indexer orders its commits by event, and a pause belongs to no
//! event; pauses change a few times a day, not per event.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub const FILE: &str = "pauses.json";

/// Who paused a destination (`operator`, `gone`), and when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pause {
    pub by: String,
    pub since_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PausesError {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, io::Error),
    #[error(
        "{0} is damaged ({1}): it records which destinations are paused. Fix it, or remove it to start with every destination resumed"
    )]
    Damaged(PathBuf, serde_json::Error),
}

pub struct Pauses {
    dir: PathBuf,
    held: Mutex<BTreeMap<String, Pause>>,
}

impl Pauses {
    /// A missing file is no pause.
    pub fn load(dir: &Path) -> Result<Pauses, PausesError> {
        let path = dir.join(FILE);
        let held = match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| PausesError::Damaged(path, e))?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(PausesError::Read(path, e)),
        };
        Ok(Pauses {
            dir: dir.to_path_buf(),
            held: Mutex::new(held),
        })
    }

    pub fn get(&self, destination: &str) -> Option<Pause> {
        self.lock().get(destination).cloned()
    }

    /// Records (`Some`) or lifts (`None`) a pause, durably before it
    /// returns; on error nothing changed, in memory or on disk.
    pub fn set(&self, destination: &str, pause: Option<Pause>) -> io::Result<()> {
        let mut held = self.lock();
        let mut next = held.clone();
        match pause {
            Some(p) => next.insert(destination.to_string(), p),
            None => next.remove(destination),
        };
        if next == *held {
            return Ok(());
        }
        self.write(&next)?;
        *held = next;
        Ok(())
    }

    fn write(&self, pauses: &BTreeMap<String, Pause>) -> io::Result<()> {
        let tmp = self.dir.join(format!("{FILE}.tmp"));
        let bytes = serde_json::to_vec_pretty(pauses).map_err(io::Error::other)?;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(FILE))?;
        std::fs::File::open(&self.dir)?.sync_all()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Pause>> {
        // Plain data, replaced whole: a panic cannot leave it torn.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operator(at: u64) -> Option<Pause> {
        Some(Pause {
            by: "operator".into(),
            since_ms: at,
        })
    }

    #[test]
    fn pauses_are_read_back_by_the_next_process() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let pauses = Pauses::load(tmp.path()).expect("no file is no pause");
        assert_eq!(pauses.get("orders"), None);
        pauses.set("orders", operator(5)).expect("pause");
        pauses.set("audit", operator(6)).expect("pause");
        pauses.set("audit", None).expect("resume");
        let again = Pauses::load(tmp.path()).expect("reload");
        assert_eq!(again.get("orders"), operator(5));
        assert_eq!(again.get("audit"), None);
        assert!(!tmp.path().join(format!("{FILE}.tmp")).exists());
    }

    #[test]
    fn a_damaged_file_is_refused_naming_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::write(tmp.path().join(FILE), b"{\"orders\": {\"by\": ").expect("write");
        let err = Pauses::load(tmp.path()).err().expect("refused");
        let text = err.to_string();
        assert!(text.contains(FILE) && text.contains("remove it"), "{text}");
    }

    #[test]
    fn a_failed_write_changes_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let pauses = Pauses::load(tmp.path()).expect("load");
        // A directory where the temporary file must go: the write fails.
        std::fs::create_dir(tmp.path().join(format!("{FILE}.tmp"))).expect("block");
        assert!(pauses.set("orders", operator(1)).is_err());
        assert_eq!(pauses.get("orders"), None);
        assert!(!tmp.path().join(FILE).exists());
    }
}
