//! The running dispatchers, one per configured destination, kept in step
//! with the config as it is reloaded (docs/reload.md).
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

use super::disabling::{self, DisablingError};
use super::dispatcher::Dispatcher;
use super::endpoints::Endpoints;
use super::health::{Health, PauseReason};
use super::limit::Limit;
use super::settle::{Ctx, LateCompleted};
use super::{Connector, HttpsClient, Passthrough, stack};
use crate::config::{DestinationSettings, Settings, SinkAt};
use crate::deadletter::{BucketSink, DeadLetterSink, DirSink, Shelf, SinkStreak, SinkTally};
use crate::journal::{Disabled, Journal, Reader};
use crate::lifecycle::Lifecycle;
use crate::metrics;
use crate::policy::address::Guard;
use crate::storage::Bucket;
use crate::telemetry::Tracer;
use crate::tls::{TlsFileError, TlsFiles};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::CancellationToken;

/// Why a config could not be applied to the dispatchers; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("destination {0}: {1}")]
    Tls(String, #[source] TlsFileError),
    #[error("cannot open a journal reader: {0}")]
    Reader(#[source] rusqlite::Error),
    #[error("destination {0}: cannot open the dead-letter store {1}: {2}")]
    Sink(String, String, #[source] object_store::Error),
    #[error("destination {0}: cannot build its ordering lanes from the journal: {1}")]
    Ordering(String, #[source] crate::journal::LoadError),
}

pub struct Fleet {
    journal: Journal,
    connector: Connector,
    lifecycle: Arc<Lifecycle>,
    /// With tracing on, every attempt stack starts spans with it.
    tracer: Option<Tracer>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    running: HashMap<String, Running>,
    /// Dispatchers of removed destinations, finishing their attempts.
    retiring: HashMap<String, Task>,
    /// Kept across a removal, so that a destination that comes back keeps
    /// its pause, probation, learnt limit, late answers and dead-letter
    /// failure streak.
    healths: HashMap<String, Kept>,
    /// One per place, shared by the destinations that name it.
    sinks: HashMap<SinkAt, Arc<dyn Shelf>>,
    /// Each destination's connection pool and the `concurrency` and `tls`
    /// it was made for; a reload keeps the pool unless one changed.
    clients: HashMap<String, Pool>,
}

/// What a destination keeps across reloads and removals.
#[derive(Clone)]
struct Kept {
    health: Arc<Health>,
    /// `url: per_event`'s endpoints, made when the destination first has it.
    endpoints: Option<Arc<Endpoints>>,
    limit: Arc<Limit>,
    late: Arc<LateCompleted>,
    sink_streak: Arc<Mutex<SinkStreak>>,
}

#[derive(Clone)]
struct Pool {
    concurrency: usize,
    tls: Option<TlsFiles>,
    guard: Option<Arc<Guard>>,
    /// With `per_event`: per endpoint, and in all.
    idle: Option<(usize, usize)>,
    client: HttpsClient,
}

impl Pool {
    fn fits(&self, dest: &DestinationSettings) -> bool {
        self.concurrency == dest.concurrency
            && self.tls == dest.tls
            && self.guard == dest.guard
            && self.idle == idle_bounds(dest)
    }
}

fn idle_bounds(dest: &DestinationSettings) -> Option<(usize, usize)> {
    dest.per_event
        .as_ref()
        .map(|p| (p.concurrency, p.max_idle_connections))
}

struct Running {
    ctx: watch::Sender<Arc<Ctx>>,
    stop: CancellationToken,
    task: Task,
}

/// A dispatcher's task, and the retired ones of the same destination it
/// waits for before it starts (a chain after repeated removals), so that
/// `stop` can abort them all.
struct Task {
    handle: JoinHandle<()>,
    older: Vec<AbortHandle>,
}

impl Inner {
    /// The sink at `at`, opened on first use (a bucket makes no request
    /// to open; its credentials come from the environment).
    fn sink(&mut self, at: &SinkAt) -> Result<Arc<dyn Shelf>, object_store::Error> {
        if let Some(sink) = self.sinks.get(at) {
            return Ok(sink.clone());
        }
        let sink: Arc<dyn Shelf> = match at {
            SinkAt::Dir(root) => Arc::new(DirSink::new(root.clone())),
            SinkAt::Bucket(url) => Arc::new(BucketSink::new(Bucket::open(url)?)),
        };
        self.sinks.insert(at.clone(), sink.clone());
        Ok(sink)
    }
}

impl Fleet {
    /// The sink at `at`: the one delivery writes to, so that the admin
    /// API's marks and purges take the same lock.
    pub fn sink(&self, at: &SinkAt) -> Result<Arc<dyn Shelf>, object_store::Error> {
        self.lock().sink(at)
    }

    pub fn new(
        journal: Journal,
        connector: Connector,
        lifecycle: Arc<Lifecycle>,
        tracer: Option<Tracer>,
    ) -> Fleet {
        Fleet {
            journal,
            connector,
            lifecycle,
            tracer,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Plain maps: a panic elsewhere cannot leave them torn.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a dispatcher for each destination of `settings` that has none
    /// and hands the others their new settings; returns the names started.
    /// Call before ingress takes the new config (the journal's counters of
    /// an added destination, and every share, are in place once this
    /// returns), and `retire` after.
    pub fn apply(&self, settings: &Settings) -> Result<Vec<String>, ApplyError> {
        let mut inner = self.lock();
        // The steps that can fail, first: a failed apply changes nothing.
        let mut readers = HashMap::new();
        let mut pools = HashMap::new();
        for dest in &settings.destinations {
            let pool = match inner.clients.get(&dest.name) {
                Some(pool) if pool.fits(dest) => pool.clone(),
                _ => Pool {
                    concurrency: dest.concurrency,
                    tls: dest.tls.clone(),
                    guard: dest.guard.clone(),
                    idle: idle_bounds(dest),
                    client: self
                        .connector
                        .client(
                            dest.concurrency,
                            dest.tls.as_ref(),
                            dest.guard.as_ref(),
                            dest.per_event.as_deref(),
                        )
                        .map_err(|e| ApplyError::Tls(dest.name.clone(), e))?,
                },
            };
            pools.insert(dest.name.clone(), pool);
            if let Some(at) = &dest.dead_letter {
                inner.sink(at).map_err(|e| {
                    let place = match at {
                        SinkAt::Dir(dir) => dir.display().to_string(),
                        SinkAt::Bucket(url) => url.as_str().to_string(),
                    };
                    ApplyError::Sink(dest.name.clone(), place, e)
                })?;
            }
            if !inner.running.contains_key(&dest.name) {
                let reader = self.journal.reader().map_err(ApplyError::Reader)?;
                readers.insert(dest.name.clone(), reader);
                // Before ingress can route an event to it. A running
                // destination keeps its key (`reload::keep_fixed`).
                self.journal
                    .order(&dest.name, dest.ordering.clone())
                    .map_err(|e| ApplyError::Ordering(dest.name.clone(), e))?;
            }
        }
        let mut added = Vec::new();
        for dest in &settings.destinations {
            let name = &dest.name;
            // Only a limit: a changed share holds from the next request.
            self.journal.set_share(name, dest.max_pending_bytes);
            if let Some(p) = &dest.per_event {
                self.journal.set_endpoint_share(name, p.max_pending_bytes);
            }
            let kept = inner.healths.entry(name.clone()).or_insert_with(|| {
                let health = Health::new(dest.probation.clone(), dest.rate_limit_per_second);
                restore_pause(&self.journal, name, &health);
                Kept {
                    health: Arc::new(health),
                    endpoints: None,
                    limit: Arc::new(Limit::new(name, dest.concurrency, dest.adaptive)),
                    late: Arc::default(),
                    sink_streak: Arc::default(),
                }
            });
            if let Some(per_event) = &dest.per_event {
                let endpoints = kept.endpoints.get_or_insert_with(|| {
                    Arc::new(Endpoints::new(
                        dest.probation.clone(),
                        per_event.max_tracked,
                        per_event.disable_after,
                        self.journal.disabled_endpoints(name),
                    ))
                });
                endpoints.reconfigure(
                    &dest.probation,
                    per_event.max_tracked,
                    per_event.disable_after,
                );
            }
            let Kept {
                health,
                endpoints,
                limit,
                late,
                sink_streak,
            } = kept.clone();
            let endpoints = endpoints.filter(|_| dest.per_event.is_some());
            health.reconfigure(&dest.probation, dest.rate_limit_per_second);
            if dest.per_event.is_some() {
                health.end_probation();
            }
            limit.reconfigure(dest.concurrency, dest.adaptive);
            let sink = dest
                .dead_letter
                .as_ref()
                .and_then(|at| inner.sinks.get(at).cloned())
                .map(|s| s as Arc<dyn DeadLetterSink>);
            let Some(pool) = pools.remove(name) else {
                continue;
            };
            let client = pool.client.clone();
            inner.clients.insert(name.clone(), pool);
            let ctx = Arc::new(Ctx {
                dest: dest.clone(),
                journal: self.journal.clone(),
                sink,
                passthrough: stack::build_passthrough(dest, client.clone(), self.tracer.as_ref()),
                stack: stack::build(dest, stack::HttpService::new(client), self.tracer.as_ref()),
                health,
                endpoints,
                limit,
                late,
                sink_streak,
                metrics: metrics::Delivery::new(name),
                passthrough_attempts: Arc::new(metrics::PassthroughAttempts::new(name)),
            });
            if let Some(running) = inner.running.get(name) {
                running.ctx.send_replace(ctx);
                continue;
            }
            let Some(reader) = readers.remove(name) else {
                continue;
            };
            let retiring = inner.retiring.remove(name);
            let running = self.start(dest, ctx, reader, retiring);
            inner.running.insert(name.clone(), running);
            metrics::register(name, &crate::event::Reason::ALL.map(|r| r.as_str()));
            if dest.per_event.is_some() {
                metrics::endpoint_disabled(name, 0);
            }
            added.push(name.clone());
        }
        Ok(added)
    }

    /// Stops the dispatchers of destinations `settings` no longer has, once
    /// their attempts in flight are done; their events stay in the journal.
    /// Returns their names.
    pub fn retire(&self, settings: &Settings) -> Vec<String> {
        let mut inner = self.lock();
        let removed: Vec<String> = inner
            .running
            .keys()
            .filter(|name| settings.destination(name).is_none())
            .cloned()
            .collect();
        for name in &removed {
            if let Some(running) = inner.running.remove(name) {
                running.stop.cancel();
                inner.retiring.insert(name.clone(), running.task);
                inner.clients.remove(name);
            }
        }
        removed
    }

    fn start(
        &self,
        dest: &DestinationSettings,
        ctx: Arc<Ctx>,
        reader: Reader,
        retiring: Option<Task>,
    ) -> Running {
        let state = self.journal.add_destination(&dest.name);
        let stop = self.lifecycle.stop_dispatch.child_token();
        let (tx, rx) = watch::channel(ctx);
        let dispatcher = Dispatcher::new(rx, reader, state, stop.clone());
        let (old, mut older) = match retiring {
            Some(Task { handle, older }) => (Some(handle), older),
            None => (None, Vec::new()),
        };
        older.extend(old.as_ref().map(JoinHandle::abort_handle));
        let handle = tokio::spawn(async move {
            // The old dispatcher may still hold events it read: reading them
            // again before it is done would send them twice.
            if let Some(old) = old {
                let _ = old.await;
            }
            dispatcher.run().await;
        });
        Running {
            ctx: tx,
            stop,
            task: Task { handle, older },
        }
    }

    /// A configured destination's way to its endpoint for passthrough, in
    /// its current settings. A destination keeps its dispatcher whatever
    /// its mode: what it journaled while durable is still delivered.
    pub fn passthrough(&self, name: &str) -> Option<Passthrough> {
        let inner = self.lock();
        let ctx = inner.running.get(name)?.ctx.borrow().clone();
        Some(Passthrough::new(
            ctx.dest.clone(),
            ctx.passthrough.clone(),
            ctx.passthrough_attempts.clone(),
        ))
    }

    /// A configured destination's delivery context now.
    fn ctx(&self, name: &str) -> Option<Arc<Ctx>> {
        let inner = self.lock();
        Some(inner.running.get(name)?.ctx.borrow().clone())
    }

    /// An operator disables (`true`) or enables an endpoint of `name`
    /// (docs/endpoints.md): `Ok(None)` when it was so already, `None` for
    /// a destination that is not configured.
    pub async fn set_endpoint(
        &self,
        name: &str,
        origin: &str,
        disable: bool,
    ) -> Option<Result<Option<Disabled>, DisablingError>> {
        let ctx = self.ctx(name)?;
        Some(if disable {
            disabling::disable(&ctx, origin).await
        } else {
            disabling::enable(&ctx, origin).await
        })
    }

    /// The health of a configured destination.
    pub fn health(&self, name: &str) -> Option<Arc<Health>> {
        let inner = self.lock();
        inner
            .running
            .contains_key(name)
            .then(|| inner.healths.get(name).map(|k| k.health.clone()))?
    }

    /// The endpoints of a configured `url: per_event` destination.
    pub fn endpoints(&self, name: &str) -> Option<Arc<Endpoints>> {
        let inner = self.lock();
        inner
            .running
            .contains_key(name)
            .then(|| inner.healths.get(name).and_then(|k| k.endpoints.clone()))?
    }

    /// The concurrency limit of a configured destination.
    pub fn limit(&self, name: &str) -> Option<Arc<Limit>> {
        let inner = self.lock();
        inner
            .running
            .contains_key(name)
            .then(|| inner.healths.get(name).map(|k| k.limit.clone()))?
    }

    /// A destination's failing dead-letter writes, while they fail: the
    /// failed writes so far and since when (its events wait meanwhile).
    pub fn sink_failing(&self, name: &str) -> Option<SinkTally> {
        let inner = self.lock();
        let kept = inner.healths.get(name)?;
        let streak = kept.sink_streak.lock().unwrap_or_else(|p| p.into_inner());
        streak.open(tokio::time::Instant::now())
    }

    /// After `Lifecycle::drain`: waits up to `grace` for every dispatcher to
    /// finish its attempts in flight; returns false if the grace ran out
    /// (those attempts are abandoned, and retried after the next start).
    pub async fn stop(&self, grace: Duration) -> bool {
        let tasks: Vec<Task> = {
            let mut inner = self.lock();
            let running: Vec<Task> = inner.running.drain().map(|(_, r)| r.task).collect();
            running
                .into_iter()
                .chain(inner.retiring.drain().map(|(_, t)| t))
                .collect()
        };
        let aborts: Vec<AbortHandle> = tasks
            .iter()
            .flat_map(|t| t.older.iter().cloned().chain([t.handle.abort_handle()]))
            .collect();
        let finished = tokio::time::timeout(grace, async {
            for t in tasks {
                let _ = t.handle.await;
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

/// A pause recorded by an earlier run holds again: what an operator or a
/// 410 stopped stays stopped across restarts.
fn restore_pause(journal: &Journal, name: &str, health: &Health) {
    let Some(pause) = journal.pause(name) else {
        return;
    };
    let reason = PauseReason::parse(&pause.by).unwrap_or_else(|| {
        tracing::warn!(destination = %name, by = %pause.by, "unknown pause reason in the journal: kept paused as by an operator");
        PauseReason::Operator
    });
    health.pause(reason, pause.since_ms);
    tracing::info!(destination = %name, by = reason.as_str(), since = %crate::clock::rfc3339(pause.since_ms), "destination paused since before this start: resume it through the admin API");
}
