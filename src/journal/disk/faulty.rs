//! A disk that fails when a test says so: the real file system (in a
//! temporary directory) with faults scripted per operation, so that a test
//! reaches each error path of the intake log on purpose.

use super::{Disk, LogFile, Real};
use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// What the log does to the disk, as a fault names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Op {
    /// A new segment file made.
    Create,
    /// A new segment's blocks allocated.
    Allocate,
    /// A record written into a segment (one `pwritev`).
    Write,
    /// fdatasync of a segment.
    SyncData,
    /// fsync of the directory, after a new segment's name.
    SyncDir,
    /// The mark written, or synced (at open).
    WriteMark,
    SyncMark,
    /// A read of a segment.
    Read,
    /// The mark read (at open).
    ReadMark,
    /// A file opened read-only (a segment to read, the directory to sync).
    Open,
    List,
    Rename,
    Remove,
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Fail(i32),
    /// A write that takes only this many bytes, and says so.
    Short(usize),
}

#[derive(Debug)]
struct Rule {
    op: Op,
    /// Calls of `op` still to let through before this rule fires.
    pass: u64,
    /// Calls it fires on after that.
    times: u64,
    action: Action,
}

#[derive(Default)]
struct Faults {
    rules: Mutex<Vec<Rule>>,
    calls: Mutex<HashMap<Op, u64>>,
}

impl Faults {
    /// Counts a call of `op`; the action of the first rule it fires.
    fn hit(&self, op: Op) -> Option<Action> {
        if let Ok(mut calls) = self.calls.lock() {
            *calls.entry(op).or_default() += 1;
        }
        let mut rules = self.rules.lock().expect("fault rules");
        let mut fired = None;
        for rule in rules.iter_mut().filter(|r| r.op == op) {
            if rule.pass > 0 {
                rule.pass -= 1;
            } else if rule.times > 0 && fired.is_none() {
                rule.times -= 1;
                fired = Some(rule.action);
            }
        }
        fired
    }

    fn check(&self, op: Op) -> io::Result<()> {
        match self.hit(op) {
            Some(Action::Fail(errno)) => Err(io::Error::from_raw_os_error(errno)),
            _ => Ok(()),
        }
    }
}

/// The real disk, with faults a test adds as it goes.
#[derive(Clone, Default)]
pub(crate) struct Faulty {
    faults: Arc<Faults>,
}

/// Every call from the one a rule starts at, until `heal`.
pub(crate) const ALWAYS: u64 = u64::MAX;

impl Faulty {
    pub fn new() -> Faulty {
        Faulty::default()
    }

    /// The disk as the journal takes it; faults added later still apply.
    pub fn disk(&self) -> Arc<dyn Disk> {
        Arc::new(self.clone())
    }

    /// The `nth` call of `op` from now (1: the next) fails with `errno`,
    /// and the `times - 1` after it too.
    pub fn fail(&self, op: Op, nth: u64, times: u64, errno: i32) {
        self.add(op, nth, times, Action::Fail(errno));
    }

    /// The `nth` record write from now writes only `keep` bytes (and says
    /// so, as `pwritev` may), the rest left to the caller.
    pub fn short_write(&self, nth: u64, keep: usize) {
        self.add(Op::Write, nth, 1, Action::Short(keep));
    }

    fn add(&self, op: Op, nth: u64, times: u64, action: Action) {
        assert!(nth >= 1, "the first call is the 1st");
        self.faults.rules.lock().expect("fault rules").push(Rule {
            op,
            pass: nth - 1,
            times,
            action,
        });
    }

    /// No more faults: the disk works again (space came back).
    pub fn heal(&self) {
        self.faults.rules.lock().expect("fault rules").clear();
    }

    /// How often `op` was called so far.
    pub fn calls(&self, op: Op) -> u64 {
        let calls = self.faults.calls.lock().expect("fault calls");
        calls.get(&op).copied().unwrap_or(0)
    }

    fn wrap(&self, path: &Path, inner: Box<dyn LogFile>) -> Box<dyn LogFile> {
        let kind =
            if path.file_name().and_then(|n| n.to_str()) == Some(crate::journal::intake::MARK) {
                Kind::Mark
            } else if path.is_dir() {
                Kind::Dir
            } else {
                Kind::Segment
            };
        Box::new(FaultyFile {
            inner,
            kind,
            faults: self.faults.clone(),
        })
    }
}

impl Disk for Faulty {
    fn create(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        self.faults.check(Op::Create)?;
        Ok(self.wrap(path, Real.create(path)?))
    }

    fn open_rw(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        Ok(self.wrap(path, Real.open_rw(path)?))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        self.faults.check(Op::Open)?;
        Ok(self.wrap(path, Real.open(path)?))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.faults.check(Op::ReadMark)?;
        Real.read(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<(std::path::PathBuf, u64)>> {
        self.faults.check(Op::List)?;
        Real.list(dir)
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        Real.len(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.faults.check(Op::Rename)?;
        Real.rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.faults.check(Op::Remove)?;
        Real.remove(path)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Segment,
    Mark,
    Dir,
}

struct FaultyFile {
    inner: Box<dyn LogFile>,
    kind: Kind,
    faults: Arc<Faults>,
}

impl LogFile for FaultyFile {
    fn write_parts_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<usize> {
        match self.faults.hit(Op::Write) {
            Some(Action::Fail(errno)) => Err(io::Error::from_raw_os_error(errno)),
            Some(Action::Short(keep)) => {
                let mut left = keep;
                let cut: Vec<&[u8]> = parts
                    .iter()
                    .map(|p| {
                        let k = left.min(p.len());
                        left -= k;
                        &p[..k]
                    })
                    .collect();
                self.inner.write_parts_at(&cut, offset)
            }
            None => self.inner.write_parts_at(parts, offset),
        }
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.kind == Kind::Mark {
            self.faults.check(Op::WriteMark)?;
        }
        self.inner.write_all_at(buf, offset)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.faults.check(Op::Read)?;
        self.inner.read_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.faults.check(Op::SyncData)?;
        self.inner.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        match self.kind {
            Kind::Dir => self.faults.check(Op::SyncDir)?,
            Kind::Mark => self.faults.check(Op::SyncMark)?,
            Kind::Segment => self.faults.check(Op::SyncData)?,
        }
        self.inner.sync_all()
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        self.faults.check(Op::Allocate)?;
        self.inner.allocate(len)
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
}
