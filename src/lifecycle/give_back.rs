//! Memory freed in a burst goes back to the system only when the thread
//! that owns it calls into the allocator again (mimalloc keeps pages, and
//! their delayed purge, per thread): a thread that sleeps after a burst
//! kept what it freed, and what others freed into its pages, until its
//! next wake (benches/RESULTS.md, step i). The binary says how to give it
//! back (`set`: `main.rs` collects mimalloc's heap of the calling thread);
//! tokio's workers do it as they park, and the library's own threads when
//! a wait of theirs ends with nothing to do (`rested`).

use std::sync::OnceLock;

static HOOK: OnceLock<fn()> = OnceLock::new();

/// Set once, before the threads start; later calls change nothing.
pub fn set(hook: fn()) {
    let _ = HOOK.set(hook);
}

/// Called by a thread whose wait ended with nothing to do. Nothing without
/// a hook (the library's tests).
pub fn rested() {
    if let Some(hook) = HOOK.get() {
        hook();
    }
}
