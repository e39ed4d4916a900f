//! The metrics recorder's memory stays bounded when nobody scrapes
//! `/metrics`: the exporter keeps each histogram sample until it is
//! folded into its buckets, and before `metrics::install` spawned an
//! upkeep only a scrape folded them (a sidecar in a pod without
//! Prometheus grew by every delivered event's sample). Its own test
//! binary: it counts the process's heap with a global allocator of its
//! own, and installs the one global recorder.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

/// The system allocator, counting the bytes held.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only the
// count is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Samples recorded between two upkeeps, and how many such rounds.
const PER_ROUND: usize = 20_000;
const ROUNDS: usize = 40;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn histogram_samples_are_folded_without_a_scrape() {
    let _handle = courier::metrics::install(&[]).expect("the only recorder of this binary");
    // The series exists, and the upkeep has run once, before the count.
    let sync = courier::metrics::journal_sync();
    sync.record(Duration::from_micros(1).as_secs_f64());
    tokio::time::sleep(courier::metrics::UPKEEP_EVERY).await;
    let before = HELD.load(Ordering::Relaxed);
    let mut most = 0;
    for round in 0..ROUNDS {
        for i in 0..PER_ROUND {
            sync.record(Duration::from_micros((round * PER_ROUND + i) as u64).as_secs_f64());
        }
        most = most.max(HELD.load(Ordering::Relaxed) - before);
        tokio::time::sleep(courier::metrics::UPKEEP_EVERY).await;
    }
    let grown = HELD.load(Ordering::Relaxed) - before;
    let recorded = (PER_ROUND * ROUNDS * size_of::<f64>()) as isize;
    // What one round's samples take (0.33 MB) stays at most until the
    // next upkeep, and the blocks it frees wait for the recorder's epoch
    // to move on (crossbeam's deferred frees, a bounded number): allow
    // 1 MiB. Every sample kept took 13 MB.
    assert!(
        most > 0 && grown < 1 << 20,
        "the recorder held {grown} bytes more after {} samples ({recorded} bytes of them), {most} at most after a round",
        PER_ROUND * ROUNDS
    );
}
