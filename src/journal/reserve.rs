//! Disk space held back in the journal's directory for a full disk.
//!
//! When the volume fills, ingress must stop (507) but the journal must not:
//! SQLite needs room to index what the intake log holds, to record
//! deliveries (which is what frees space) and to checkpoint its WAL. Without
//! room for those, a full disk deadlocks, and whatever an operator frees is
//! taken by the next retried SQLite write before ingress can use it. The
//! writer keeps SQLite's own room (it answers 507 before a group would leave
//! less than SQLite needs, see `writer`); this file is for whatever else
//! fills the volume meanwhile. The journal keeps `reserve`, a preallocated
//! file, and deletes it when the disk fills and at every start (a start on a
//! full disk has room to recover). Ingress opens again only once the volume
//! has room for the reserve and as much again (at most a segment): the
//! reserve is taken back first, so the next fill finds it again. The same
//! pattern as CockroachDB's ballast file.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

const FILE: &str = "reserve";
/// A sixteenth of the volume, within these bounds: enough for SQLite to
/// index a burst's worth of the intake log and checkpoint it.
const MIN: u64 = 64 * 1024;
const MAX: u64 = 64 * 1024 * 1024;

pub(super) struct Reserve {
    path: PathBuf,
    size: u64,
}

/// What `take` found.
#[derive(Debug, PartialEq)]
pub(super) enum Taken {
    /// The reserve is held and the volume has room beyond it.
    Held,
    /// The file system cannot preallocate: no reserve, but room.
    Unsupported,
    /// Not enough room: `free` bytes of the `needed`.
    NoRoom { free: u64, needed: u64 },
}

impl Reserve {
    pub fn new(dir: &Path) -> io::Result<Reserve> {
        let (total, _) = space(dir)?;
        Ok(Reserve {
            path: dir.join(FILE),
            size: (total / 16).clamp(MIN, MAX),
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The free bytes ingress needs to open again: the reserve, and as much
    /// again (at most a segment) for the intake log to write into.
    pub fn needed(&self) -> u64 {
        self.size + self.size.min(super::intake::SEGMENT)
    }

    /// Gives the space back to the volume.
    pub fn release(&self) {
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(error = %e, path = %self.path.display(), "cannot release the journal's disk reserve");
        }
    }

    /// Takes the reserve (again) if the volume has `needed` bytes free.
    pub fn take(&self) -> Taken {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let free = space(dir).map_or(0, |(_, free)| free);
        let held = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        // A reserve still held counts as free: it is about to be rewritten.
        if free + held < self.needed() {
            return Taken::NoRoom {
                free: free + held,
                needed: self.needed(),
            };
        }
        let allocated = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&self.path)
            .and_then(|f| fallocate(&f, self.size));
        match allocated {
            Ok(()) => Taken::Held,
            Err(e) => {
                self.release();
                if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                    Taken::Unsupported
                } else {
                    Taken::NoRoom {
                        free,
                        needed: self.needed(),
                    }
                }
            }
        }
    }
}

/// Allocates `len` bytes of `file` on the disk, so that writing them can
/// never fail for space; EOPNOTSUPP where the file system cannot.
pub(super) fn fallocate(file: &std::fs::File, len: u64) -> io::Result<()> {
    // SAFETY: a valid descriptor owned by `file`.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The volume's size and the bytes an unprivileged writer may still use.
pub(super) fn space(dir: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs writes only into `st`; `path` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let unit = st.f_frsize as u64;
    Ok((st.f_blocks as u64 * unit, st.f_bavail as u64 * unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_a_sixteenth_of_the_volume_within_bounds_and_comes_and_goes() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let r = Reserve::new(tmp.path()).expect("reserve");
        let (total, _) = space(tmp.path()).expect("space");
        assert_eq!(r.size(), (total / 16).clamp(MIN, MAX));
        assert_eq!(
            r.take(),
            Taken::Held,
            "a volume with room gives the reserve"
        );
        let held = std::fs::metadata(tmp.path().join(FILE)).expect("reserve file");
        assert_eq!(held.len(), r.size());
        assert_eq!(
            r.take(),
            Taken::Held,
            "taking a held reserve again keeps it"
        );
        r.release();
        assert!(!tmp.path().join(FILE).exists());
        r.release();
    }
}
