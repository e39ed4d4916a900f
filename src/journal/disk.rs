//! The intake log's file I/O, behind a trait: so that tests can make the
//! disk fail (a failed fdatasync, a short write, ENOSPC, EIO) at any step,
//! without root or a full volume, and check what the journal does then.
//! Vector's disk buffer does the same (`disk_v2/io.rs`): a file system
//! trait, and a file trait the real `File` implements. Only what the log
//! does is here; SQLite keeps its own I/O.
//!
//! A trait object, not a type parameter: the journal's types stay as they
//! are, and the cost is one indirect call beside each `pwritev` and
//! `fdatasync`, which take microseconds to milliseconds.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(test)]
pub(crate) mod faulty;

/// The directory operations the log makes.
pub(crate) trait Disk: Send + Sync {
    /// A new segment file, read-write, emptied if it existed; 0600, as
    /// records hold the app's bodies and headers (`file_modes`).
    fn create(&self, path: &Path) -> io::Result<Box<dyn LogFile>>;
    /// A file read-write, created if missing (a spare taken into use, the
    /// mark).
    fn open_rw(&self, path: &Path) -> io::Result<Box<dyn LogFile>>;
    /// A file (or the directory, to sync it) read-only.
    fn open(&self, path: &Path) -> io::Result<Box<dyn LogFile>>;
    /// The whole of a small file (the mark).
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// The entries of `dir` with their sizes; one removed while listing is
    /// left out.
    fn list(&self, dir: &Path) -> io::Result<Vec<(PathBuf, u64)>>;
    fn len(&self, path: &Path) -> io::Result<u64>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
}

/// The operations on one open file.
pub(crate) trait LogFile: Send + Sync {
    /// One positional gathered write (`pwritev`); may write less than all.
    fn write_parts_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<usize>;
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    fn sync_data(&self) -> io::Result<()>;
    fn sync_all(&self) -> io::Result<()>;
    /// Makes the file `len` bytes long with its blocks allocated, or a
    /// sparse file where the file system cannot allocate.
    fn allocate(&self, len: u64) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;

    /// Fills `buf` from `offset`; `UnexpectedEof` if the file ends first.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        // Bounded: each turn reads at least one byte or returns.
        while !buf.is_empty() {
            match self.read_at(buf, offset) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The most parts one `write_parts_at` takes.
pub(crate) const MAX_PARTS: usize = 4;

/// The file system itself.
pub(crate) struct Real;

/// The disk production uses.
pub(crate) fn real() -> Arc<dyn Disk> {
    Arc::new(Real)
}

impl Disk for Real {
    fn create(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        Ok(Box::new(file))
    }

    fn open_rw(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        Ok(Box::new(file))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        Ok(Box::new(File::open(path)?))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<(PathBuf, u64)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            match entry.metadata() {
                Ok(m) => out.push((entry.path(), m.len())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        Ok(std::fs::metadata(path)?.len())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
}

impl LogFile for File {
    fn write_parts_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<usize> {
        // On the stack: this is every group commit's write.
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_PARTS];
        if parts.len() > MAX_PARTS {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        for (v, p) in iov.iter_mut().zip(parts) {
            v.iov_base = p.as_ptr() as *mut libc::c_void;
            v.iov_len = p.len();
        }
        let count = parts.len() as libc::c_int;
        let at = libc::off_t::try_from(offset).map_err(|_| io::Error::other("offset too large"))?;
        // SAFETY: every iovec points into a live slice of its stated length,
        // which pwritev only reads.
        let n = unsafe { libc::pwritev(self.as_raw_fd(), iov.as_ptr(), count, at) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        match super::reserve::fallocate(self, len) {
            // A file system without fallocate: a sized (sparse) file; a full
            // disk then shows up at the write, as DiskFull.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => self.set_len(len),
            other => other,
        }
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
}
