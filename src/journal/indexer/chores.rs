//! The indexer's timed chores besides indexing: WAL checkpoints and the
//! expiry of dedupe keys.

use crate::journal::store;
use rusqlite::Connection;
use std::time::{Duration, Instant};

/// How often the indexer checkpoints, which lets the WAL restart.
pub(super) const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
/// How often dedupe keys older than the window leave the `seen` table.
const EXPIRE_SEEN_EVERY: Duration = Duration::from_secs(10);

pub(super) struct Checkpoints {
    last: Instant,
}

impl Checkpoints {
    pub fn new() -> Checkpoints {
        Checkpoints {
            last: Instant::now(),
        }
    }

    /// On a full disk (and no retry pending) at each turn: the pages of
    /// delivered events and the WAL must go back to the volume, or they
    /// keep the room the intake log needs. Otherwise every
    /// `CHECKPOINT_EVERY`: under sustained load the background
    /// checkpointer never catches up, so the WAL could never restart; from
    /// the indexer's thread no frame can arrive during the checkpoint.
    pub fn turn(&mut self, conn: &Connection, full: bool) {
        if full {
            let _ = store::give_back(conn);
            self.last = Instant::now();
        } else if self.last.elapsed() >= CHECKPOINT_EVERY {
            if let Err(e) = store::checkpoint(conn) {
                tracing::warn!(error = %e, "journal checkpoint failed; will retry");
            }
            self.last = Instant::now();
        }
    }
}

/// `ingress.dedupe_window`: the keys of indexed events go to `seen`, and
/// leave it once older than the window.
pub(super) struct Seen {
    window_ms: u64,
    last: Instant,
}

impl Seen {
    pub fn new(window_ms: u64) -> Seen {
        Seen {
            window_ms,
            last: Instant::now(),
        }
    }

    pub fn turn(&mut self, conn: &Connection) {
        if self.last.elapsed() < EXPIRE_SEEN_EVERY {
            return;
        }
        let cutoff = crate::clock::now_ms().saturating_sub(self.window_ms);
        if let Err(e) = store::expire_seen(conn, cutoff) {
            tracing::warn!(error = %e, "cannot expire dedupe keys; will retry");
        }
        self.last = Instant::now();
    }
}
