//! courier: accept webhooks durably, deliver them with Event Grid semantics.
//! This file wires the parts together and owns the process life cycle.

// Modules `main.rs`, the tests, the bench and the fuzz targets reach.
// Private when built with `--cfg dead_code_check`, with `main.rs` read in
// as a module: the compiler then reports what nothing uses (`.ci/test`
// runs it; docs/architecture.md). Written out pair by pair, not by a
// macro: rustfmt follows `mod` items, never into a macro's call.
#[cfg(not(dead_code_check))]
pub mod admin;
#[cfg(dead_code_check)]
mod admin;
#[cfg(not(dead_code_check))]
pub mod clock;
#[cfg(dead_code_check)]
mod clock;
#[cfg(not(dead_code_check))]
pub mod config;
#[cfg(dead_code_check)]
mod config;
mod deadletter;
mod deliver;
#[cfg(not(dead_code_check))]
pub mod event;
#[cfg(dead_code_check)]
mod event;
mod file_modes;
/// The fuzz targets' door: public in every build, as the fuzzers use it.
#[doc(hidden)]
pub mod fuzzing;
mod handoff;
mod history;
mod ids;
mod ingress;
#[cfg(not(dead_code_check))]
pub mod journal;
#[cfg(dead_code_check)]
mod journal;
#[cfg(not(dead_code_check))]
pub mod lifecycle;
#[cfg(dead_code_check)]
mod lifecycle;
#[cfg(not(dead_code_check))]
pub mod logging;
#[cfg(dead_code_check)]
mod logging;
#[cfg(not(dead_code_check))]
pub mod metrics;
#[cfg(dead_code_check)]
mod metrics;
mod no_room;
#[cfg(not(dead_code_check))]
pub mod policy;
#[cfg(dead_code_check)]
mod policy;
mod reload;
mod seal;
mod server;
mod storage;
mod telemetry;
mod tls;

/// `main.rs` as a module of the library, for `dead_code_check`: what it
/// uses counts as used. Its own items are not checked here (the binary's
/// build does).
#[cfg(dead_code_check)]
extern crate self as courier;
#[cfg(dead_code_check)]
#[allow(dead_code)]
#[path = "main.rs"]
mod main_rs;

/// A header map of `pairs`, in order, for unit tests.
#[cfg(test)]
pub(crate) fn test_headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            v.parse().expect("value"),
        );
    }
    h
}

use config::{Live, Settings};
use deliver::Fleet;
use journal::Journal;
use lifecycle::Lifecycle;
use reload::Reloader;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;

/// Why `courier run` stopped with exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Journal(#[from] journal::OpenError),
    #[error(transparent)]
    NoRoom(#[from] no_room::WaitError),
    #[error("cannot listen on {0} ({1}): {2}")]
    Listen(std::net::SocketAddr, &'static str, std::io::Error),
    #[error("cannot install the metrics recorder: {0}")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
    #[error("cannot configure TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("cannot open a journal reader: {0}")]
    Reader(#[source] rusqlite::Error),
    #[error(transparent)]
    Fleet(#[from] deliver::ApplyError),
    #[error("cannot open the hand-off store {0}: {1}")]
    Handoff(String, #[source] object_store::Error),
    #[error("cannot start tracing: {0}")]
    Tracing(#[from] telemetry::StartError),
}

/// Where the config in force came from, so that a reload can read it again.
pub struct ConfigSource {
    pub path: PathBuf,
    /// The text `settings` were loaded from.
    pub text: String,
}

/// Runs courier until SIGTERM or SIGINT, then shuts down gracefully.
pub async fn run(settings: Settings, source: ConfigSource) -> Result<(), RunError> {
    lifecycle::fd_limit::raise();
    file_modes::private_umask();
    let hangups = reload::hangups();
    let prometheus = metrics::install(&[server::Edge::INGRESS.name, server::Edge::ADMIN.name])?;
    let names: Vec<String> = settings
        .destinations
        .iter()
        .map(|d| d.name.clone())
        .collect();
    let settings = Arc::new(settings);
    let open: no_room::Open = {
        let (j, names) = (settings.journal.clone(), names.clone());
        let (dedupe, history) = (settings.ingress.dedupe_window, settings.history);
        Arc::new(move || {
            Journal::open(
                &j.dir,
                j.sync == config::SyncMode::Always,
                j.max_bytes,
                dedupe,
                &names,
                history,
            )
        })
    };
    let (journal, recovered, listeners) = match open() {
        Err(journal::OpenError::DiskFull(_, free)) => {
            match no_room::wait(settings.clone(), prometheus.clone(), open, free).await? {
                Some(o) => (o.journal, o.recovered, Some((o.ingress, o.admin))),
                None => return Ok(()),
            }
        }
        opened => {
            let (journal, recovered) = opened?;
            (journal, recovered, None)
        }
    };
    for s in &recovered {
        let configured = names.contains(&s.destination);
        tracing::info!(destination = %s.destination, pending = s.pending, quarantined = s.quarantined, configured, "recovered pending events");
        if !configured {
            tracing::warn!(destination = %s.destination, pending = s.pending, "events are pending for a destination that is not configured; they are kept until it is configured again");
        }
    }
    let (ingress_listener, admin_listener) = match listeners {
        Some(kept) => kept,
        None => (
            server::listen(settings.listen)
                .map_err(|e| RunError::Listen(settings.listen, "listen", e))?,
            server::listen(settings.admin_listen)
                .map_err(|e| RunError::Listen(settings.admin_listen, "admin_listen", e))?,
        ),
    };
    let lifecycle = Arc::new(Lifecycle::default());
    let connector = deliver::build_connector()?;
    let telemetry = settings
        .tracing
        .as_ref()
        .map(telemetry::Telemetry::start)
        .transpose()?;
    let tracer = telemetry.as_ref().map(telemetry::Telemetry::tracer);
    let fleet = Arc::new(Fleet::new(
        journal.clone(),
        connector,
        lifecycle.clone(),
        tracer.clone(),
    ));
    fleet.apply(&settings)?;
    let handoff = match &settings.handoff {
        Some(h) => {
            Some(Arc::new(handoff::Handoff::open(h).map_err(|e| {
                RunError::Handoff(h.url.as_str().to_string(), e)
            })?))
        }
        None => None,
    };
    let live = Arc::new(Live::new(settings));
    let adoption = handoff.clone().map(|h| {
        tokio::spawn(handoff::adopt_loop(
            h,
            journal.clone(),
            live.clone(),
            lifecycle.stop_dispatch.clone(),
        ))
    });

    let ingress = Arc::new(ingress::Ingress::new(
        live.clone(),
        journal.clone(),
        lifecycle.clone(),
        fleet.clone(),
        tracer,
    ));
    let admin = Arc::new(admin::Admin {
        settings: live.clone(),
        journal: journal.clone(),
        lifecycle: lifecycle.clone(),
        prometheus,
        fleet: fleet.clone(),
        reader: journal.reader().map_err(RunError::Reader)?,
        dead_letter_ops: Arc::default(),
        history: journal.history().map(|h| Arc::new(h.reader())),
    });
    let (listen, admin_listen) = (live.load().listen, live.load().admin_listen);
    let ingress_addr = ingress_listener
        .local_addr()
        .map_err(|e| RunError::Listen(listen, "listen", e))?;
    let admin_addr = admin_listener
        .local_addr()
        .map_err(|e| RunError::Listen(admin_listen, "admin_listen", e))?;
    let servers = [
        tokio::spawn(server::serve(
            ingress_listener,
            tower::service_fn(move |req| {
                let ingress = ingress.clone();
                async move { Ok::<_, Infallible>(ingress.handle(req).await) }
            }),
            server::Edge::INGRESS,
            lifecycle.stop_servers.clone(),
            lifecycle.stop_servers.clone(),
        )),
        tokio::spawn(server::serve(
            admin_listener,
            tower::service_fn(move |req| {
                let admin = admin.clone();
                async move { Ok::<_, Infallible>(admin.handle(req).await) }
            }),
            server::Edge::ADMIN,
            lifecycle.stop_servers.clone(),
            lifecycle.stop_servers.clone(),
        )),
    ];
    let reloader = Reloader::new(source.path, source.text, live.clone(), fleet.clone());
    let reloads = reload::spawn(reloader, hangups, lifecycle.stop_dispatch.clone());
    lifecycle.set_ready();
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    tracing::info!(ingress = %ingress_addr, admin = %admin_addr, destinations = names.len(), workers, "courier listening");

    lifecycle::terminated().await;
    let grace = live.load().shutdown_grace;
    tracing::info!(grace = %config::units::format_duration(grace), "shutting down: refusing new events, finishing attempts in flight");
    lifecycle.drain();
    let _ = reloads.await;
    let passing = tokio::time::timeout(grace, lifecycle.passing.wait());
    let (stopped, passed) = tokio::join!(fleet.stop(grace), passing);
    if !stopped {
        tracing::warn!(
            "shutdown grace ran out; attempts still in flight are abandoned and retried after restart"
        );
    }
    if passed.is_err() {
        tracing::warn!(
            "shutdown grace ran out; passthrough requests still waiting for their endpoint are cut off as courier exits"
        );
    }
    // A look at the store in progress ends within the grace; every step
    // of an adoption is safe to cut (the claim is taken over later).
    if let Some(mut a) = adoption
        && tokio::time::timeout(grace, &mut a).await.is_err()
    {
        a.abort();
    }
    // After the grace, what is still pending goes to the hand-off store,
    // within as long again.
    if let Some(h) = &handoff {
        handoff::hand_off(h, &journal, tokio::time::Instant::now() + grace).await;
    }
    journal.close().await;
    // The attempts' last spans, for at most 2 s (and never more than the
    // grace): the pod's grace period is sized for the attempts, the
    // hand-off and the journal's close, and a collector that does not
    // answer must not stretch the exit past it.
    if let Some(t) = telemetry {
        t.shutdown(grace.min(SPAN_FLUSH)).await;
    }
    lifecycle.stop_servers.cancel();
    for s in servers {
        let _ = s.await;
    }
    tracing::info!("courier stopped");
    Ok(())
}

/// The longest courier waits at exit for its last spans to be exported.
const SPAN_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);
