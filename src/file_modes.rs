//! Files that hold the app's bodies and headers (the journal, dead letters)
//! are readable by courier's user only (docs/dead-letters.md): a sidecar shares its
//! node, and often its volumes, with other containers.
//!
//! The umask does it for every file and folder courier creates, SQLite's
//! included (it creates its database, WAL and shared-memory files itself);
//! `tighten` mends a journal written by a build that left them readable.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// New files 0600, new folders 0700.
pub fn private_umask() {
    // SAFETY: umask only swaps the process's creation mask.
    unsafe {
        libc::umask(0o077);
    }
}

/// `dir` 0700 and the regular files in it 0600, where they are looser. A
/// folder that is not courier's (a volume's mount point) cannot be changed:
/// that is said once, and courier goes on, its own files still private.
pub fn tighten(dir: &Path) {
    let looser = |mode: u32, private: u32| mode & 0o777 & !private != 0;
    let set = |path: &Path, mode: u32| {
        if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
            tracing::warn!(path = %path.display(), error = %e, "cannot make it private (mode {mode:o}); other users of this node may read it");
        }
    };
    if let Ok(meta) = std::fs::metadata(dir)
        && looser(meta.permissions().mode(), 0o700)
    {
        set(dir, 0o700);
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if let Ok(meta) = entry.metadata()
            && meta.is_file()
            && looser(meta.permissions().mode(), 0o600)
        {
            set(&entry.path(), 0o600);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    }

    #[test]
    fn a_journal_left_readable_is_made_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let journal = dir.path().join("journal");
        std::fs::create_dir(&journal).expect("mkdir");
        std::fs::set_permissions(&journal, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let log = journal.join("intake-000001.log");
        std::fs::write(&log, b"body").expect("write");
        std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let tight = journal.join("journal.db");
        std::fs::write(&tight, b"db").expect("write");
        std::fs::set_permissions(&tight, std::fs::Permissions::from_mode(0o400)).expect("chmod");
        tighten(&journal);
        assert_eq!(mode(&journal), 0o700);
        assert_eq!(mode(&log), 0o600);
        assert_eq!(mode(&tight), 0o400, "a stricter mode is kept");
    }
}
