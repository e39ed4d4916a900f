//! One dispatcher per destination. It pulls due events from the journal
//! (a bounded window, never the whole backlog), keeps at most `concurrency`
//! attempts in flight, and sleeps until the next due time, a new event, or
//! a finished attempt.

use super::settle::{self, Ctx};
use crate::admin::metrics;
use crate::clock;
use crate::journal::{Change, DestinationState, Reader, StoredEvent};
use crate::lifecycle::Lifecycle;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// After a failed journal read, wait this long before the next.
const READ_RETRY: Duration = Duration::from_secs(1);

pub struct Dispatcher {
    ctx: Arc<Ctx>,
    reader: Reader,
    state: Arc<DestinationState>,
    lifecycle: Arc<Lifecycle>,
}

impl Dispatcher {
    pub fn new(
        ctx: Ctx,
        reader: Reader,
        state: Arc<DestinationState>,
        lifecycle: Arc<Lifecycle>,
    ) -> Self {
        Dispatcher {
            ctx: Arc::new(ctx),
            reader,
            state,
            lifecycle,
        }
    }

    /// Runs until shutdown begins, then waits for attempts in flight (the
    /// caller bounds that wait by `shutdown_grace`).
    pub async fn run(self) {
        let name = self.ctx.dest.name.clone();
        let concurrency = self.ctx.dest.concurrency;
        let window = concurrency * 4;
        let stop = self.lifecycle.stop_dispatch.clone();
        // Events read from the journal and not yet settled: queued or in flight.
        let mut held: HashSet<i64> = HashSet::new();
        let mut ready: VecDeque<StoredEvent> = VecDeque::new();
        let mut tasks = JoinSet::new();
        let mut running: HashMap<tokio::task::Id, i64> = HashMap::new();
        loop {
            let mut wake_at = None;
            if ready.len() < concurrency && !stop.is_cancelled() {
                let now = clock::now_ms();
                let want = window - ready.len();
                match self.reader.due(&name, now, want, &held).await {
                    Ok(rows) => {
                        let more = rows.len() == want;
                        for row in rows {
                            match row {
                                Ok(ev) if held.insert(ev.seq) => ready.push_back(ev),
                                Ok(_) => {}
                                Err(e) => self.quarantine(&e).await,
                            }
                        }
                        if !more {
                            wake_at = match self.reader.next_due_after(&name, now).await {
                                Ok(t) => t,
                                Err(e) => {
                                    tracing::error!(destination = %name, error = %e, "cannot read the journal");
                                    Some(now + READ_RETRY.as_millis() as u64)
                                }
                            };
                        }
                    }
                    Err(e) => {
                        tracing::error!(destination = %name, error = %e, "cannot read the journal");
                        wake_at = Some(now + READ_RETRY.as_millis() as u64);
                    }
                }
            }
            while tasks.len() < concurrency && !stop.is_cancelled() {
                let Some(ev) = ready.pop_front() else { break };
                let seq = ev.seq;
                let ctx = self.ctx.clone();
                let handle = tasks.spawn(async move { settle::run(&ctx, ev).await });
                running.insert(handle.id(), seq);
            }
            if stop.is_cancelled() && tasks.is_empty() {
                return;
            }
            let sleep = tokio::time::sleep(wake_at.map_or(Duration::from_secs(3600), |t| {
                Duration::from_millis(t.saturating_sub(clock::now_ms()))
            }));
            tokio::select! {
                _ = self.state.notify.notified(), if !stop.is_cancelled() => {}
                Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                    let (id, release) = match done {
                        Ok((id, release)) => (id, release),
                        Err(e) => {
                            tracing::error!(destination = %name, error = %e, "an attempt task failed");
                            (e.id(), true)
                        }
                    };
                    if let Some(seq) = running.remove(&id)
                        && release
                    {
                        held.remove(&seq);
                    }
                }
                _ = sleep, if wake_at.is_some() => {}
                _ = stop.cancelled(), if !stop.is_cancelled() => {}
            }
        }
    }

    async fn quarantine(&self, e: &crate::journal::StoreError) {
        let name = &self.ctx.dest.name;
        let crate::journal::StoreError::Corrupt { seq, .. } = e else {
            return;
        };
        tracing::error!(destination = %name, journal = %self.ctx.journal.path().display(), error = %e,
            "journal record is corrupt: it is kept but never delivered; inspect it with `courier journal inspect`");
        metrics::corrupt(name);
        if let Err(err) = self
            .ctx
            .journal
            .apply(vec![Change::Quarantine { seq: *seq }])
            .await
        {
            tracing::error!(destination = %name, error = %err, "cannot quarantine the corrupt record");
        }
    }
}
