//! Process state shared by the servers and dispatchers: ready, draining
//! (SIGTERM received: refuse new work, finish in-flight), stopped.

use std::sync::atomic::{AtomicBool, Ordering};
use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub struct Lifecycle {
    ready: AtomicBool,
    draining: AtomicBool,
    /// Cancelled when dispatchers must stop starting attempts.
    pub stop_dispatch: CancellationToken,
    /// Cancelled when the servers must close.
    pub stop_servers: CancellationToken,
}

impl Lifecycle {
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.draining()
    }

    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
        self.stop_dispatch.cancel();
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}
