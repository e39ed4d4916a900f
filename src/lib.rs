//! courier: accept webhooks durably, deliver them with Event Grid semantics.
//! This file wires the parts together and owns the process life cycle.

pub mod admin;
pub mod clock;
pub mod config;
pub mod deadletter;
pub mod deliver;
pub mod event_path;
mod ingress;
pub mod journal;
pub mod lifecycle;
pub mod logging;
pub mod policy;
pub mod server;
pub mod signature;

use config::Settings;
use deadletter::{DeadLetterSink, DirSink};
use journal::Journal;
use lifecycle::Lifecycle;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Why `courier run` stopped with exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Journal(#[from] journal::OpenError),
    #[error("cannot listen on {0} ({1}): {2}")]
    Listen(std::net::SocketAddr, &'static str, std::io::Error),
    #[error("{0}")]
    Setup(String),
}

/// Runs courier until SIGTERM or SIGINT, then shuts down gracefully.
pub async fn run(settings: Settings) -> Result<(), RunError> {
    let settings = Arc::new(settings);
    let prometheus = admin::metrics::install().map_err(RunError::Setup)?;
    let names: Vec<String> = settings
        .destinations
        .iter()
        .map(|d| d.name.clone())
        .collect();
    for name in &names {
        admin::metrics::register(name);
    }
    let j = &settings.journal;
    let (journal, recovered) = Journal::open(
        &j.dir,
        j.sync == config::SyncMode::Always,
        j.max_bytes,
        settings.ingress.dedupe_window,
        &names,
    )?;
    for s in &recovered {
        let configured = names.contains(&s.destination);
        tracing::info!(destination = %s.destination, pending = s.pending, quarantined = s.quarantined, configured, "recovered pending events");
        if !configured {
            tracing::warn!(destination = %s.destination, pending = s.pending, "events are pending for a destination that is not configured; they are kept until it is configured again");
        }
    }
    let ingress_listener = TcpListener::bind(settings.listen)
        .await
        .map_err(|e| RunError::Listen(settings.listen, "listen", e))?;
    let admin_listener = TcpListener::bind(settings.admin_listen)
        .await
        .map_err(|e| RunError::Listen(settings.admin_listen, "admin_listen", e))?;
    let lifecycle = Arc::new(Lifecycle::default());
    let client = deliver::build_client().map_err(RunError::Setup)?;

    let mut sinks: HashMap<PathBuf, Arc<dyn DeadLetterSink>> = HashMap::new();
    let mut dispatchers = tokio::task::JoinSet::new();
    let mut healths = HashMap::new();
    for dest in &settings.destinations {
        let sink = dest.dead_letter.as_ref().map(|root| {
            sinks
                .entry(root.clone())
                .or_insert_with(|| Arc::new(DirSink::new(root.clone())))
                .clone()
        });
        let reader = journal
            .reader()
            .map_err(|e| RunError::Setup(format!("cannot open a journal reader: {e}")))?;
        let state = journal
            .destination(&dest.name)
            .ok_or_else(|| RunError::Setup(format!("no journal state for {}", dest.name)))?;
        let health = Arc::new(deliver::health::Health::new(
            dest.probation.clone(),
            dest.rate_limit_per_second,
        ));
        healths.insert(dest.name.clone(), health.clone());
        let ctx = deliver::settle_ctx(dest.clone(), journal.clone(), sink, client.clone(), health);
        dispatchers.spawn(deliver::Dispatcher::new(ctx, reader, state, lifecycle.clone()).run());
    }

    let ingress = Arc::new(ingress::Ingress::new(
        settings.clone(),
        journal.clone(),
        lifecycle.clone(),
    ));
    let admin = Arc::new(admin::Admin {
        settings: settings.clone(),
        journal: journal.clone(),
        lifecycle: lifecycle.clone(),
        prometheus,
        healths,
        reader: journal
            .reader()
            .map_err(|e| RunError::Setup(format!("cannot open a journal reader: {e}")))?,
    });
    let ingress_addr = ingress_listener
        .local_addr()
        .map_err(|e| RunError::Listen(settings.listen, "listen", e))?;
    let admin_addr = admin_listener
        .local_addr()
        .map_err(|e| RunError::Listen(settings.admin_listen, "admin_listen", e))?;
    let servers = [
        tokio::spawn(server::serve(
            ingress_listener,
            Arc::new(move |req| {
                let ingress = ingress.clone();
                async move { ingress.handle(req).await }
            }),
            lifecycle.stop_servers.clone(),
        )),
        tokio::spawn(server::serve(
            admin_listener,
            Arc::new(move |req| {
                let admin = admin.clone();
                async move { admin.handle(req).await }
            }),
            lifecycle.stop_servers.clone(),
        )),
    ];
    lifecycle.set_ready();
    tracing::info!(ingress = %ingress_addr, admin = %admin_addr, destinations = names.len(), "courier listening");

    wait_for_signal().await;
    tracing::info!(grace = %config::units::format_duration(settings.shutdown_grace), "shutting down: refusing new events, finishing attempts in flight");
    lifecycle.drain();
    let drained = tokio::time::timeout(settings.shutdown_grace, async {
        while dispatchers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            "shutdown grace ran out; attempts still in flight are abandoned and retried after restart"
        );
        dispatchers.abort_all();
    }
    journal.close().await;
    lifecycle.stop_servers.cancel();
    for s in servers {
        let _ = s.await;
    }
    tracing::info!("courier stopped");
    Ok(())
}

async fn wait_for_signal() {
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
