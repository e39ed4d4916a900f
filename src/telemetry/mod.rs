//! OpenTelemetry tracing (docs/tracing.md): a span for each accepted request and
//! for each delivery attempt, exported over OTLP/HTTP (protobuf) to
//! `tracing.otlp_endpoint`. Off, nothing here exists: ingress and the
//! attempt stacks hold an `Option<Tracer>` that is `None`, so the cost is a
//! branch per request.
//!
//! **The trace context travels in the event's own `traceparent` header.**
//! With tracing on, ingress replaces the app's `traceparent` in the
//! headers it stores with one naming the accept span (same trace id and
//! flags; the app's `tracestate` kept), or adds one when the app sent
//! none. The attempt, minutes or hours later, after a restart or in the
//! courier that adopted the event from a hand-off, starts its span as a
//! child of the context read back from that header. Why the header and
//! not a field of its own: the headers are already in every copy of an
//! event (the intake log, the SQLite index, hand-off objects), written in
//! the same batched commits, so nothing about the journal's or the
//! hand-off's formats changes; records and objects of older couriers (the
//! app's own `traceparent`, or none) are read as ever, the attempt then
//! being a child of the app's span or a root; and an older courier reading
//! a newer record forwards a valid `traceparent` of the same trace. The
//! cost: a dead-letter record or a replay shows the accept span's
//! `traceparent`, not the app's (a span of the same trace, one level
//! down), and an event accepted with tracing on and delivered with it off
//! carries that header to the endpoint.
//!
//! The attempt's request carries its own span's `traceparent` (keeping
//! `tracestate`), so that the endpoint continues the trace. A batch is one
//! span, a root, with a link to each event's context (OpenTelemetry's
//! messaging conventions for a batch). Passthrough attempts are children
//! of the accept span, in the app's trace.
//!
//! Why the `opentelemetry` API directly and not `tracing-opentelemetry`:
//! courier's spans are few, explicit, parented by remote contexts and
//! carry links, which the API states directly; the bridge would also turn
//! every `tracing` span of the process (tower-http's, for one) into an
//! exported span, and its per-span bookkeeping runs for every request.
//!
//! Export never slows delivery (`export.rs`): spans queue in a bounded
//! queue and are dropped, and counted, when it is full; a thread of the
//! SDK's batch processor sends them, with courier's own hyper client.

mod export;
mod propagate;
mod spans;

pub use propagate::EventContexts;
pub use spans::Accept;

use crate::config::TracingSettings;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

/// Spans waiting for export; beyond it they are dropped and counted. At
/// one accept and one attempt span per event this is two seconds of
/// 1,000 events per second while the exporter is stuck.
const QUEUE: usize = 4096;
/// How long a span may wait before its batch goes: short, so that a span
/// reaches the collector before most restarts could lose it.
const DELAY: Duration = Duration::from_millis(500);
/// Spans per export request.
const BATCH: usize = 512;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("tracing needs a tokio runtime")]
    NoRuntime,
    #[error("cannot load the system CA certificates for tracing.otlp_endpoint: {0}")]
    Roots(#[source] std::io::Error),
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The exporter and its provider, kept by `run` to flush at shutdown.
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: Tracer,
}

impl Telemetry {
    /// Sets up the exporter; call inside the runtime its requests run on.
    pub fn start(settings: &TracingSettings) -> Result<Telemetry, StartError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| StartError::NoRuntime)?;
        let client = export::Client::new(runtime).map_err(StartError::Roots)?;
        let queued = Arc::new(AtomicUsize::new(0));
        let exporter = export::exporter(&settings.traces_url, client, queued.clone())?;
        let config = BatchConfigBuilder::default()
            // Twice the gate's bound: the processor itself never drops, so
            // that every drop is one the gate counts.
            .with_max_queue_size(2 * QUEUE)
            .with_scheduled_delay(DELAY)
            .with_max_export_batch_size(BATCH)
            .build();
        let batch = BatchSpanProcessor::builder(exporter)
            .with_batch_config(config)
            .build();
        let mut resource = opentelemetry_sdk::Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("courier");
        }
        let resource = resource
            .with_attribute(opentelemetry::KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION"),
            ))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(export::Gate::new(batch, queued, QUEUE))
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                settings.sample_ratio,
            ))))
            .with_resource(resource)
            .build();
        let tracer = Tracer {
            inner: provider.tracer("courier"),
        };
        crate::metrics::tracing_on();
        tracing::info!(endpoint = %settings.traces_url, sample_ratio = settings.sample_ratio, "tracing on: exporting spans over OTLP/HTTP");
        Ok(Telemetry { provider, tracer })
    }

    pub fn tracer(&self) -> Tracer {
        self.tracer.clone()
    }

    /// Exports what is queued, within `within`. Spans still queued after
    /// it, or when the process is killed, are lost: they are telemetry,
    /// never events.
    pub async fn shutdown(self, within: Duration) {
        let provider = self.provider;
        let done = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(within));
        match done.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "tracing: spans still queued at shutdown may be lost")
            }
            Err(e) => tracing::warn!(error = %e, "tracing: the exporter's shutdown failed"),
        }
    }
}

/// What ingress and the attempt stacks start spans with; cheap to clone.
#[derive(Clone, Debug)]
pub struct Tracer {
    inner: opentelemetry_sdk::trace::SdkTracer,
}
