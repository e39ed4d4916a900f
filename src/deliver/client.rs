//! The pooled HTTP client: rustls (ring provider, no OpenSSL), system roots
//! (plus a destination's `tls` files, `crate::tls`),
//! HTTP/1.1 and HTTP/2 (negotiated by ALPN), connections reused per host.
//!
//! Each destination gets its own pool (a `Client` sharing the connector's
//! TLS setup; a `url: per_event` one, `super::pool`, bounded across its
//! endpoints), holding at most `concurrency` idle connections for
//! [`IDLE_TIMEOUT`]. Without the bound, an endpoint slower than `timeout`
//! left hundreds of connections open: a timed-out attempt keeps its
//! connection while it waits for a late answer (docs/delivery.md), its retry opens
//! a new one, and when the late answer came the old one went back to an
//! unbounded pool for 90 s. Now a connection beyond `concurrency` idle ones
//! is closed as soon as it is free.

use super::guard::Guarded;
use super::pool::Pool;
use super::resolver::Resolver;
use crate::config::settings::PerEvent;
use crate::policy::address::Guard;
use crate::tls::{TlsFileError, TlsFiles};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower::BoxError;

/// What a destination's attempts are sent with.
#[derive(Clone)]
pub enum HttpsClient {
    /// A fixed URL: hyper-util's pool, at most `concurrency` idle
    /// connections to its one host. Shared: an attempt takes a clone.
    Fixed(Arc<Client<HttpsConnector<Guarded>, Full<Bytes>>>),
    /// `url: per_event`: connections kept across endpoints, under one bound.
    Endpoints(Pool),
}

impl HttpsClient {
    /// Sends `req`. A fixed destination's answer comes in hyper-util's own
    /// future, not boxed once more: one allocation an attempt fewer.
    pub fn request(&self, req: Request<Full<Bytes>>) -> Sending {
        match self {
            HttpsClient::Fixed(client) => Sending::Fixed(client.request(req)),
            HttpsClient::Endpoints(pool) => {
                let pool = pool.clone();
                Sending::Endpoints(Box::pin(async move { Ok(pool.request(req).await?) }))
            }
        }
    }
}

type Answer = Result<Response<Incoming>, BoxError>;

/// An attempt's answer on its way.
pub enum Sending {
    Fixed(ResponseFuture),
    Endpoints(Pin<Box<dyn Future<Output = Answer> + Send>>),
}

impl Future for Sending {
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        // Both are `Unpin`: hyper-util's future boxes its own.
        match self.get_mut() {
            Sending::Fixed(f) => Pin::new(f).poll(cx).map_err(Into::into),
            Sending::Endpoints(f) => f.as_mut().poll(cx),
        }
    }
}

/// How long an idle connection may still be used: below the 5 s
/// keep-alive of Node.js, Apache httpd and uvicorn (AWS ALB's is 60 s,
/// nginx's 75 s), so that courier stops using an idle connection before
/// such a server may close it, and does not send on one being closed.
/// The pool reuses the connection freed last, so a steady stream keeps
/// its few warm, and closes what a burst opened beyond them within twice
/// this (its eviction runs once per timeout): at 30 s they stayed up to a
/// minute with their buffers (benches/RESULTS.md, step i). The cost: a
/// destination that gets less than one event every 4 s connects anew for
/// each.
const IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// What every destination's pool dials with: the system roots, loaded
/// once, and the connector of destinations without a `tls` key.
#[derive(Clone)]
pub struct Connector {
    system: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
    /// The TLS setup of destinations without a `tls` key.
    tls: rustls::ClientConfig,
    /// Their connector, without the address guard.
    plain: HttpsConnector<Guarded>,
}

impl Connector {
    /// A pool for one destination: at most `max_idle` idle connections
    /// (with `per_event`, per endpoint and its own bound in all); its own
    /// TLS setup when it has `tls` files; every address it dials checked
    /// by `guard` when on.
    pub fn client(
        &self,
        max_idle: usize,
        tls: Option<&TlsFiles>,
        guard: Option<&Arc<Guard>>,
        per_event: Option<&PerEvent>,
    ) -> Result<HttpsClient, TlsFileError> {
        let connector = match (tls, guard) {
            (None, None) => self.plain.clone(),
            (None, Some(_)) => https(self.tls.clone(), guard.cloned()),
            (Some(files), _) => https(
                crate::tls::client_config(&self.system, files, &self.provider)?,
                guard.cloned(),
            ),
        };
        if let Some(p) = per_event {
            return Ok(HttpsClient::Endpoints(Pool::new(
                connector,
                p.concurrency,
                p.max_idle_connections,
                IDLE_TIMEOUT,
            )));
        }
        let client = Client::builder(TokioExecutor::new())
            // Without a timer the pool closes nothing: an idle connection
            // is only found stale when it is next checked out.
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_max_idle_per_host(max_idle)
            .build(connector);
        Ok(HttpsClient::Fixed(Arc::new(client)))
    }
}

pub fn build_connector() -> Result<Connector, rustls::Error> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        tracing::warn!(
            "no system CA certificates found; https destinations without tls.ca_file will fail their TLS check"
        );
    }
    let system = Arc::new(roots);
    let provider = crate::tls::provider();
    let tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(system.clone())
        .with_no_client_auth();
    Ok(Connector {
        system,
        provider,
        plain: https(tls.clone(), None),
        tls,
    })
}

/// HTTP/1.1 and HTTP/2 (by ALPN) over `tls`, or plain HTTP.
fn https(tls: rustls::ClientConfig, guard: Option<Arc<Guard>>) -> HttpsConnector<Guarded> {
    let mut http = HttpConnector::new_with_resolver(Resolver::new(guard.clone()));
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(10)));
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(Guarded::new(http, guard))
}
