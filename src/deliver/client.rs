//! The pooled HTTP client: rustls (ring provider, no OpenSSL), system roots,
//! HTTP/1.1 and HTTP/2 (negotiated by ALPN), connections reused per host.
//!
//! Each destination gets its own pool (a `Client` sharing the connector's
//! TLS setup), holding at most `concurrency` idle connections for
//! [`IDLE_TIMEOUT`]. Without the bound, an endpoint slower than `timeout`
//! left hundreds of connections open: a timed-out attempt keeps its
//! connection while it waits for a late answer (SPEC §4.2), its retry opens
//! a new one, and when the late answer came the old one went back to an
//! unbounded pool for 90 s. Now a connection beyond `concurrency` idle ones
//! is closed as soon as it is free.

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;

pub type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// How long an idle connection is kept: below the keep-alive timeouts of
/// common servers and proxies (AWS ALB 60 s, nginx 75 s), so that courier,
/// not the server, closes it, and a request is not sent on a connection
/// the server is closing at the same moment.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The connector every destination's pool dials with.
#[derive(Clone)]
pub struct Connector(HttpsConnector<HttpConnector>);

impl Connector {
    /// A pool for one destination: at most `max_idle` idle connections.
    pub fn client(&self, max_idle: usize) -> HttpsClient {
        Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_max_idle_per_host(max_idle)
            .build(self.0.clone())
    }
}

pub fn build_connector() -> Result<Connector, String> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        tracing::warn!(
            "no system CA certificates found; https destinations will fail their TLS check"
        );
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot configure TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(10)));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Ok(Connector(https))
}
