//! State that outlives the process and belongs to no event: an operator's
//! or a 410's pause of a destination, and the endpoints disabled
//! (`url: per_event`). It is journal state like the events it holds back,
//! so it lives in `journal.dir`, each kind in one small JSON file replaced
//! atomically (write a temporary file, fsync it, rename it over, fsync the
//! directory) before the change is acknowledged. Files rather than tables
//! of `journal.db`: the indexer orders its commits by event, and these
//! change a few times a day, not per event.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Who paused a destination (`operator`, `gone`), and when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pause {
    pub by: String,
    pub since_ms: u64,
}

/// An endpoint disabled: by whom (`operator`, `gone` for a 410,
/// `disable_after`), since when, and how it had been failing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Disabled {
    pub by: String,
    pub since_ms: u64,
    pub failing_since_ms: Option<u64>,
    pub last_outcome: Option<String>,
    pub last_status: Option<u16>,
}

/// One kind of kept state: its file, and what to tell an operator of it.
pub struct Kind {
    pub file: &'static str,
    /// What the file records, for an error naming it.
    pub records: &'static str,
    /// What a start without it begins with.
    pub without: &'static str,
}

pub const PAUSES: Kind = Kind {
    file: "pauses.json",
    records: "which destinations are paused",
    without: "every destination resumed",
};

/// Keyed by `destination origin` (`key`).
pub const DISABLED: Kind = Kind {
    file: "endpoints-disabled.json",
    records: "which endpoints are disabled",
    without: "every endpoint enabled",
};

/// A disabled endpoint's key in its file.
pub fn endpoint_key(destination: &str, origin: &str) -> String {
    format!("{destination} {origin}")
}

#[derive(Debug, thiserror::Error)]
pub enum KeptError {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, io::Error),
    #[error("{0} is damaged ({1}): it records {2}. Fix it, or remove it to start with {3}")]
    Damaged(PathBuf, serde_json::Error, &'static str, &'static str),
}

pub struct Kept<V> {
    dir: PathBuf,
    file: &'static str,
    held: Mutex<BTreeMap<String, V>>,
}

pub type Pauses = Kept<Pause>;

impl<V: Clone + PartialEq + Serialize + DeserializeOwned> Kept<V> {
    /// A missing file holds nothing.
    pub fn load(dir: &Path, kind: &Kind) -> Result<Kept<V>, KeptError> {
        let path = dir.join(kind.file);
        let held = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| KeptError::Damaged(path, e, kind.records, kind.without))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(KeptError::Read(path, e)),
        };
        Ok(Kept {
            dir: dir.to_path_buf(),
            file: kind.file,
            held: Mutex::new(held),
        })
    }

    pub fn get(&self, key: &str) -> Option<V> {
        self.lock().get(key).cloned()
    }

    /// The entries whose key starts with `prefix`.
    pub fn with_prefix(&self, prefix: &str) -> Vec<(String, V)> {
        self.lock()
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Records (`Some`) or removes (`None`) an entry, durably before it
    /// returns; on error nothing changed, in memory or on disk.
    pub fn set(&self, key: &str, value: Option<V>) -> io::Result<()> {
        let mut held = self.lock();
        let mut next = held.clone();
        match value {
            Some(v) => next.insert(key.to_string(), v),
            None => next.remove(key),
        };
        if next == *held {
            return Ok(());
        }
        self.write(&next)?;
        *held = next;
        Ok(())
    }

    fn write(&self, entries: &BTreeMap<String, V>) -> io::Result<()> {
        let tmp = self.dir.join(format!("{}.tmp", self.file));
        let bytes = serde_json::to_vec_pretty(entries).map_err(io::Error::other)?;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(self.file))?;
        std::fs::File::open(&self.dir)?.sync_all()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, V>> {
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
        let pauses = Pauses::load(tmp.path(), &PAUSES).expect("no file is no pause");
        assert_eq!(pauses.get("orders"), None);
        pauses.set("orders", operator(5)).expect("pause");
        pauses.set("audit", operator(6)).expect("pause");
        pauses.set("audit", None).expect("resume");
        let again = Pauses::load(tmp.path(), &PAUSES).expect("reload");
        assert_eq!(again.get("orders"), operator(5));
        assert_eq!(again.get("audit"), None);
        assert!(!tmp.path().join(format!("{}.tmp", PAUSES.file)).exists());
    }

    #[test]
    fn a_damaged_file_is_refused_naming_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::write(tmp.path().join(PAUSES.file), b"{\"orders\": {\"by\": ").expect("write");
        let err = Pauses::load(tmp.path(), &PAUSES).err().expect("refused");
        let text = err.to_string();
        assert!(
            text.contains(PAUSES.file) && text.contains("remove it"),
            "{text}"
        );
    }

    #[test]
    fn a_failed_write_changes_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let pauses = Pauses::load(tmp.path(), &PAUSES).expect("load");
        // A directory where the temporary file must go: the write fails.
        std::fs::create_dir(tmp.path().join(format!("{}.tmp", PAUSES.file))).expect("block");
        assert!(pauses.set("orders", operator(1)).is_err());
        assert_eq!(pauses.get("orders"), None);
        assert!(!tmp.path().join(PAUSES.file).exists());
    }
}
