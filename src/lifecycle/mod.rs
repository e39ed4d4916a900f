//! Process state shared by the servers and dispatchers: ready, draining
//! (SIGTERM received: refuse new work, finish in-flight), stopped.

pub(crate) mod fd_limit;
pub mod give_back;

use std::sync::atomic::{AtomicBool, Ordering};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Default)]
pub struct Lifecycle {
    ready: AtomicBool,
    draining: AtomicBool,
    /// Cancelled when dispatchers must stop starting attempts.
    pub stop_dispatch: CancellationToken,
    /// Cancelled when the servers must close.
    pub stop_servers: CancellationToken,
    /// Passthrough requests waiting for their endpoint: like attempts in
    /// flight, they get the shutdown grace to finish.
    pub passing: TaskTracker,
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
        self.passing.close();
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

/// Returns at SIGTERM or SIGINT.
pub async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop courier with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
