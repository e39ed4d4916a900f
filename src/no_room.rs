//! A start on a disk too full to open the journal (docs/journal.md, "A full
//! disk"). Exiting would put the pod in a crash loop, whose back-off grows
//! to minutes while nothing changes, and would leave the app's connections
//! refused without a reason. So courier listens at once and answers as on
//! any full disk: ingress 507 `disk_full`, `/healthz` 200 (a restart cannot
//! help), `/readyz` 503 (the journal is not loaded, docs/http-api.md), the scrape as
//! usual. It tries the open again, every `MAX_WAIT` at the longest, until
//! there is room or SIGTERM. Nothing is accepted meanwhile, so a kill while
//! waiting loses nothing.

use crate::config::Settings;
use crate::journal::{DestinationSummary, Journal, OpenError};
use crate::{admin, ingress, server};
use metrics_exporter_prometheus::PrometheusHandle;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The first wait before trying again; it doubles up to `MAX_WAIT`.
const FIRST_WAIT: Duration = Duration::from_millis(250);
/// Once there is room, the journal opens within this.
const MAX_WAIT: Duration = Duration::from_secs(2);

/// Why the wait ended without a journal.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error(transparent)]
    Journal(#[from] OpenError),
    #[error("cannot listen on {0} ({1}): {2}")]
    Listen(std::net::SocketAddr, &'static str, std::io::Error),
}

/// An open of the journal, tried again as often as needed.
pub(crate) type Open =
    Arc<dyn Fn() -> Result<(Journal, Vec<DestinationSummary>), OpenError> + Send + Sync>;

/// The journal, opened at last, and the listeners that answered meanwhile,
/// for the servers to go on with (the same ports, whatever `:0` gave).
pub(crate) struct Opened {
    pub journal: Journal,
    pub recovered: Vec<DestinationSummary>,
    pub ingress: TcpListener,
    pub admin: TcpListener,
}

/// Listens and answers as above until `open` succeeds (`Some`), SIGTERM or
/// SIGINT (`None`), or `open` fails for another reason than the full disk.
pub(crate) async fn wait(
    settings: Arc<Settings>,
    prometheus: PrometheusHandle,
    open: Open,
    free: u64,
) -> Result<Option<Opened>, WaitError> {
    let (ingress, ingress_kept) = listen_twice(settings.listen, "listen")?;
    let (admin, admin_kept) = listen_twice(settings.admin_listen, "admin_listen")?;
    tracing::warn!(
        dir = %settings.journal.dir.display(),
        free,
        ingress = %local(&ingress_kept, settings.listen, "listen")?,
        admin = %local(&admin_kept, settings.admin_listen, "admin_listen")?,
        "courier listening; the disk holding the journal is full, so the journal opens once there is room: until then ingress answers 507 disk_full and /readyz 503"
    );
    let (stop, closing) = (CancellationToken::new(), CancellationToken::new());
    let servers = serve(&settings, prometheus, ingress, admin, &stop, &closing);
    let started = Instant::now();
    let mut wait = FIRST_WAIT;
    let outcome = loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = crate::lifecycle::terminated() => break Ok(None),
        }
        let open = open.clone();
        match tokio::task::spawn_blocking(move || open()).await {
            Ok(Ok((journal, recovered))) => break Ok(Some((journal, recovered))),
            Ok(Err(OpenError::DiskFull(_, free))) => {
                tracing::debug!(free, "still no room to open the journal");
                wait = (wait * 2).min(MAX_WAIT);
            }
            Ok(Err(e)) => break Err(WaitError::Journal(e)),
            Err(panicked) => std::panic::resume_unwind(panicked.into_panic()),
        }
    };
    stop.cancel();
    for s in servers {
        let _ = s.await;
    }
    closing.cancel();
    let Some((journal, recovered)) = outcome? else {
        tracing::info!(
            "stopped while waiting for room: the journal was never opened, and nothing was accepted"
        );
        return Ok(None);
    };
    tracing::info!(
        waited_ms = started.elapsed().as_millis() as u64,
        "room on the journal's disk: the journal is open"
    );
    Ok(Some(Opened {
        journal,
        recovered,
        ingress: ingress_kept,
        admin: admin_kept,
    }))
}

/// A listener on `addr`, and a second handle on the same socket: the
/// waiting server closes its own, and connections not yet accepted stay
/// queued for the server that follows.
fn listen_twice(
    addr: std::net::SocketAddr,
    key: &'static str,
) -> Result<(TcpListener, TcpListener), WaitError> {
    let failed = |e| WaitError::Listen(addr, key, e);
    let listener = server::listen(addr)
        .map_err(failed)?
        .into_std()
        .map_err(failed)?;
    let other = listener.try_clone().map_err(failed)?;
    Ok((
        TcpListener::from_std(listener).map_err(failed)?,
        TcpListener::from_std(other).map_err(failed)?,
    ))
}

fn local(
    l: &TcpListener,
    addr: std::net::SocketAddr,
    key: &'static str,
) -> Result<std::net::SocketAddr, WaitError> {
    l.local_addr().map_err(|e| WaitError::Listen(addr, key, e))
}

fn serve(
    settings: &Arc<Settings>,
    prometheus: PrometheusHandle,
    ingress: TcpListener,
    admin: TcpListener,
    stop: &CancellationToken,
    closing: &CancellationToken,
) -> [tokio::task::JoinHandle<()>; 2] {
    let (for_ingress, for_admin) = (settings.clone(), settings.clone());
    [
        // A POST on a connection accepted as the journal opens is answered.
        tokio::spawn(server::serve(
            ingress,
            tower::service_fn(move |req| {
                let settings = for_ingress.clone();
                async move { Ok::<_, Infallible>(ingress::waiting(&settings, req).await) }
            }),
            server::Edge::INGRESS,
            stop.clone(),
            closing.clone(),
        )),
        tokio::spawn(server::serve(
            admin,
            tower::service_fn(move |req| {
                let resp = admin::waiting(&for_admin, &prometheus, &req);
                async move { Ok::<_, Infallible>(resp) }
            }),
            server::Edge::ADMIN,
            stop.clone(),
            stop.clone(),
        )),
    ]
}
