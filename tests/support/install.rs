//! Installing a checker's packages once: test binaries run in parallel, so
//! the install runs under a file lock, and only when the manifest it was
//! made from (requirements, lock file) differs from the stamp left by the
//! last one.

use std::path::Path;

/// Runs `install` under the lock file `lock`, unless `stamp` already holds
/// `manifest`; then writes `manifest` to `stamp`.
pub fn once(lock: &Path, stamp: &Path, manifest: &[u8], install: impl FnOnce()) {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock)
        .unwrap_or_else(|e| panic!("open {}: {e}", lock.display()));
    // SAFETY: a valid fd owned by `file`, which outlives the flock.
    let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock {}", lock.display());
    if std::fs::read(stamp).ok().as_deref() != Some(manifest) {
        install();
        std::fs::write(stamp, manifest)
            .unwrap_or_else(|e| panic!("write {}: {e}", stamp.display()));
    }
}
