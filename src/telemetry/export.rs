//! How spans leave: a bounded gate in front of the SDK's batch processor,
//! the OTLP/HTTP exporter behind it, and the HTTP client it sends with.
//!
//! - `Gate` bounds the spans waiting for export and counts what it drops
//!   (`courier_trace_spans_dropped_total`). The SDK's processor drops
//!   silently when its own queue is full; with its queue twice the gate's
//!   bound it never has to, so every drop is counted here. A span is
//!   waiting from its end until its batch's export returns, whatever the
//!   result.
//! - `Watched` wraps the exporter: a failing collector is logged once per
//!   streak of failed exports, and once when exports succeed again, never
//!   per span or per batch (`courier_trace_export_failures_total` counts
//!   the batches).
//! - `Client` sends on courier's tokio runtime with hyper and rustls, the
//!   stack delivery uses, instead of a second HTTP stack (reqwest) of the
//!   exporter's own. The batch processor's thread blocks on each export,
//!   so the request is spawned on the runtime and awaited from there.

use crate::metrics;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as Pool;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry::Context;
use opentelemetry_http::HttpError;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// One export request, the collector's answer included.
const TIMEOUT: Duration = Duration::from_secs(10);
/// A collector's answer is a small protobuf; a larger one is not read.
const MAX_ANSWER: usize = 64 * 1024;

/// The exporter to `traces_url`, sending with `client`; `queued` is the
/// gate's count, given back as each batch's export returns.
pub(super) fn exporter(
    traces_url: &str,
    client: Client,
    queued: Arc<AtomicUsize>,
) -> Result<Watched, opentelemetry_otlp::ExporterBuildError> {
    let inner = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(traces_url)
        .with_timeout(TIMEOUT)
        .build()?;
    Ok(Watched {
        inner,
        queued,
        endpoint: traces_url.to_string(),
        failing: AtomicU64::new(0),
    })
}

/// In front of the batch processor (`P`; a recorder in the tests).
#[derive(Debug)]
pub(super) struct Gate<P = BatchSpanProcessor> {
    inner: P,
    queued: Arc<AtomicUsize>,
    bound: usize,
}

impl<P: SpanProcessor> Gate<P> {
    pub(super) fn new(inner: P, queued: Arc<AtomicUsize>, bound: usize) -> Gate<P> {
        Gate {
            inner,
            queued,
            bound,
        }
    }
}

impl<P: SpanProcessor> SpanProcessor for Gate<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.bound {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            metrics::trace_span_dropped();
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[derive(Debug)]
pub(super) struct Watched {
    inner: opentelemetry_otlp::SpanExporter,
    queued: Arc<AtomicUsize>,
    endpoint: String,
    /// Failed exports in a row.
    failing: AtomicU64,
}

impl SpanExporter for Watched {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let result = self.inner.export(batch).await;
        self.queued.fetch_sub(n, Ordering::AcqRel);
        match &result {
            Ok(()) => {
                let failed = self.failing.swap(0, Ordering::AcqRel);
                if failed > 0 {
                    tracing::info!(endpoint = %self.endpoint, failed_exports = failed, "tracing: spans are exported again");
                }
            }
            Err(e) => {
                metrics::trace_export_failed();
                if self.failing.fetch_add(1, Ordering::AcqRel) == 0 {
                    tracing::warn!(endpoint = %self.endpoint, error = %e, spans = n, "tracing: cannot export spans; they are dropped until the collector answers again (logged once until then)");
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[derive(Debug)]
pub(super) struct Client {
    pool: Pool<HttpsConnector<HttpConnector>, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
}

impl Client {
    /// A machine without system CA certificates still exports to an
    /// `http://` collector (and fails an `https://` one at each export,
    /// logged): telemetry must never stop courier from starting.
    pub(super) fn new(runtime: tokio::runtime::Handle) -> std::io::Result<Client> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        let tls = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Client {
            pool: Pool::builder(TokioExecutor::new()).build(connector),
            runtime,
        })
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let pool = self.pool.clone();
        let sent = self.runtime.spawn(async move {
            tokio::time::timeout(TIMEOUT, async move {
                let answer = pool.request(request.map(Full::new)).await?;
                let (head, body) = answer.into_parts();
                let body = Limited::new(body, MAX_ANSWER).collect().await?.to_bytes();
                Ok::<_, HttpError>(Response::from_parts(head, body))
            })
            .await
        });
        match sent.await? {
            Ok(answer) => answer,
            Err(elapsed) => Err(Box::new(elapsed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanKind, Status};
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use std::sync::Mutex;
    use std::time::SystemTime;

    /// Records the names of the spans it is given.
    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl SpanProcessor for Recorder {
        fn on_start(&self, _: &mut Span, _: &Context) {}
        fn on_end(&self, span: SpanData) {
            self.0.lock().expect("lock").push(span.name.to_string());
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
    }

    fn span(name: &'static str) -> SpanData {
        SpanData {
            span_context: SpanContext::empty_context(),
            parent_span_id: opentelemetry::trace::SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: name.into(),
            start_time: SystemTime::UNIX_EPOCH,
            end_time: SystemTime::UNIX_EPOCH,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    #[test]
    fn the_gate_drops_beyond_its_bound_until_exports_make_room() {
        let queued = Arc::new(AtomicUsize::new(0));
        let gate = Gate::new(Recorder::default(), queued.clone(), 2);
        for name in ["a", "b", "c"] {
            gate.on_end(span(name));
        }
        assert_eq!(
            *gate.inner.0.lock().expect("lock"),
            ["a", "b"],
            "c is dropped"
        );
        assert_eq!(queued.load(Ordering::Acquire), 2);
        // An export returned for one span (`Watched`): room for one more.
        queued.fetch_sub(1, Ordering::AcqRel);
        gate.on_end(span("d"));
        gate.on_end(span("e"));
        assert_eq!(*gate.inner.0.lock().expect("lock"), ["a", "b", "d"]);
        assert_eq!(queued.load(Ordering::Acquire), 2);
    }
}
