//! The running dispatchers, one per configured destination, kept in step
//! with the config as it is reloaded (SPEC §6).
//!
//! A changed destination keeps its dispatcher: the dispatcher is handed a
//! new context (url, headers, retry policy, limits) and uses it from its
//! next attempt on, while attempts in flight finish under the old one. Its
//! queue of events read from the journal is kept, so no event is read
//! twice and none is sent twice because of the reload. A removed
//! destination's dispatcher finishes its attempts in flight and stops; its
//! events stay in the journal. When the destination comes back, the new
//! dispatcher starts only after the old one has stopped, for the same
//! reason.

use super::dispatcher::Dispatcher;
use super::health::Health;
use super::settle::{Ctx, LateCompleted};
use super::{HttpsClient, stack};
use crate::admin::metrics;
use crate::config::{DestinationSettings, Settings};
use crate::deadletter::{DeadLetterSink, DirSink};
use crate::journal::{Journal, Reader};
use crate::lifecycle::Lifecycle;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub struct Fleet {
    journal: Journal,
    client: HttpsClient,
    lifecycle: Arc<Lifecycle>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    running: HashMap<String, Running>,
    /// Dispatchers of removed destinations, finishing their attempts.
    retiring: HashMap<String, JoinHandle<()>>,
    /// Kept across a removal, so that a destination that comes back keeps
    /// its pause, probation and late answers.
    healths: HashMap<String, (Arc<Health>, Arc<LateCompleted>)>,
    sinks: HashMap<PathBuf, Arc<dyn DeadLetterSink>>,
}

struct Running {
    ctx: watch::Sender<Arc<Ctx>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// What `apply` changed, for the reload's log line.
#[derive(Debug, Default, PartialEq)]
pub struct Applied {
    pub added: Vec<String>,
    pub updated: Vec<String>,
    pub removed: Vec<String>,
}

impl Fleet {
    pub fn new(journal: Journal, client: HttpsClient, lifecycle: Arc<Lifecycle>) -> Fleet {
        Fleet {
            journal,
            client,
            lifecycle,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Plain maps: a panic elsewhere cannot leave them torn.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the running dispatchers match `settings`: starts the added
    /// destinations, hands the others their new settings, retires the
    /// removed ones. Call after the journal knows every destination
    /// (`Journal::add_destination`) and before ingress takes the new config.
    pub fn apply(&self, settings: &Settings) -> Result<Applied, String> {
        let mut inner = self.lock();
        // The one step that can fail, first: a failed apply changes nothing.
        let mut readers = HashMap::new();
        for dest in &settings.destinations {
            if !inner.running.contains_key(&dest.name) {
                let reader = self
                    .journal
                    .reader()
                    .map_err(|e| format!("cannot open a journal reader: {e}"))?;
                readers.insert(dest.name.clone(), reader);
            }
        }
        let mut applied = Applied::default();
        for dest in &settings.destinations {
            let name = &dest.name;
            let (health, late) = inner
                .healths
                .entry(name.clone())
                .or_insert_with(|| {
                    let health = Health::new(dest.probation.clone(), dest.rate_limit_per_second);
                    (Arc::new(health), Arc::default())
                })
                .clone();
            health.reconfigure(&dest.probation, dest.rate_limit_per_second);
            let sink = dest.dead_letter.as_ref().map(|root| {
                inner
                    .sinks
                    .entry(root.clone())
                    .or_insert_with(|| Arc::new(DirSink::new(root.clone())))
                    .clone()
            });
            let ctx = Arc::new(Ctx {
                dest: dest.clone(),
                journal: self.journal.clone(),
                sink,
                stack: stack::build(dest, self.client.clone()),
                health,
                late,
            });
            if let Some(running) = inner.running.get(name) {
                running.ctx.send_replace(ctx);
                applied.updated.push(name.clone());
                continue;
            }
            let Some(reader) = readers.remove(name) else {
                continue;
            };
            let retiring = inner.retiring.remove(name);
            let running = self.start(dest, ctx, reader, retiring);
            inner.running.insert(name.clone(), running);
            metrics::register(name);
            applied.added.push(name.clone());
        }
        let removed: Vec<String> = inner
            .running
            .keys()
            .filter(|name| settings.destination(name).is_none())
            .cloned()
            .collect();
        for name in removed {
            if let Some(running) = inner.running.remove(&name) {
                running.stop.cancel();
                inner.retiring.insert(name.clone(), running.task);
                applied.removed.push(name);
            }
        }
        Ok(applied)
    }

    fn start(
        &self,
        dest: &DestinationSettings,
        ctx: Arc<Ctx>,
        reader: Reader,
        retiring: Option<JoinHandle<()>>,
    ) -> Running {
        let state = self.journal.add_destination(&dest.name);
        let stop = self.lifecycle.stop_dispatch.child_token();
        let (tx, rx) = watch::channel(ctx);
        let dispatcher = Dispatcher::new(rx, reader, state, stop.clone());
        let task = tokio::spawn(async move {
            // The old dispatcher may still hold events it read: reading them
            // again before it is done would send them twice.
            if let Some(old) = retiring {
                let _ = old.await;
            }
            dispatcher.run().await;
        });
        Running {
            ctx: tx,
            stop,
            task,
        }
    }

    /// The health of a configured destination.
    pub fn health(&self, name: &str) -> Option<Arc<Health>> {
        let inner = self.lock();
        inner
            .running
            .contains_key(name)
            .then(|| inner.healths.get(name).map(|(h, _)| h.clone()))?
    }

    /// After `Lifecycle::drain`: waits up to `grace` for every dispatcher to
    /// finish its attempts in flight; returns false if the grace ran out
    /// (those attempts are abandoned, and retried after the next start).
    pub async fn stop(&self, grace: Duration) -> bool {
        let tasks: Vec<JoinHandle<()>> = {
            let mut inner = self.lock();
            let running = inner
                .running
                .drain()
                .map(|(_, r)| r.task)
                .collect::<Vec<_>>();
            running
                .into_iter()
                .chain(inner.retiring.drain().map(|(_, t)| t))
                .collect()
        };
        let aborts: Vec<_> = tasks.iter().map(JoinHandle::abort_handle).collect();
        let finished = tokio::time::timeout(grace, async {
            for t in tasks {
                let _ = t.await;
            }
        })
        .await
        .is_ok();
        if !finished {
            for a in aborts {
                a.abort();
            }
        }
        finished
    }
}
