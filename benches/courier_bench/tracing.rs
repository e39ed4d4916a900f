//! Step r (issue #35): what tracing costs end to end, beside the same build
//! with tracing off in the same invocation.
//!
//! r. step b's end to end (wrk; accepted / (load + drain)) with a
//!    `traceparent` on every request (one sampled app span), to a
//!    destination with tracing off (no `tracing` key) and on (`sample_ratio:
//!    1.0`: an accept span and an attempt span per event), in the order
//!    off, on, on, off, so that the machine's drift weighs on both alike.
//!    The spans go to a loopback OTLP/HTTP sink in this process (hyper,
//!    answering 200 to each export and discarding it), so that no collector
//!    takes the CPU; its note gives what it received and the spans courier
//!    dropped (`courier_trace_spans_dropped_total`): a cost hidden by drops
//!    would be no measure.
//!
//! Budget (issue #35): on ≥ 0.9× off.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use super::alternated::{Alternated, TURNS};
use super::{Args, Budget, config, end_to_end_env, start_yaml};

const RATIO: f64 = 0.9;
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// Read by `end_to_end_env` into each row's note.
pub const DROPPED: &str = "courier_trace_spans_dropped_total";

pub fn budget_name() -> String {
    "tracing on (sample_ratio 1.0) end-to-end".to_string()
}

pub fn budgets(label: &str, m: &Alternated) -> Vec<Budget> {
    let name = format!("{label} {}", budget_name());
    vec![m.budget(name, RATIO, ["off", "on"], "x off")]
}

/// A loopback OTLP/HTTP sink: 200 to every request, body read and
/// discarded; counts requests and bytes.
struct Sink {
    port: u16,
    requests: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Sink {
    async fn start() -> Result<Sink, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind the OTLP sink: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("OTLP sink address: {e}"))?
            .port();
        let requests = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let (r, b) = (requests.clone(), bytes.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (r, b) = (r.clone(), b.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let (r, b) = (r.clone(), b.clone());
                        async move {
                            let body = req.into_body().collect().await?.to_bytes();
                            r.fetch_add(1, Ordering::Relaxed);
                            b.fetch_add(body.len() as u64, Ordering::Relaxed);
                            let mut resp = hyper::Response::new(Full::new(Bytes::new()));
                            resp.headers_mut().insert(
                                http::header::CONTENT_TYPE,
                                http::HeaderValue::from_static("application/x-protobuf"),
                            );
                            Ok::<_, hyper::Error>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Sink {
            port,
            requests,
            bytes,
            task,
        })
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Step r.
pub async fn tracing(label: &str, bin: &Path, rx: &str, args: &Args) -> Result<Alternated, String> {
    let sink = Sink::start().await?;
    let off = config(rx, "");
    let on = format!(
        "{}tracing: {{ otlp_endpoint: http://127.0.0.1:{}, sample_ratio: 1.0 }}\n",
        config(rx, ""),
        sink.port
    );
    // Checked once, so that a build without tracing fails here, not as a
    // row of `on` measuring `off`.
    drop(start_yaml(bin, &on, &[]).await?);
    let env = [("COURIER_BENCH_TRACEPARENT", TRACEPARENT.to_string())];
    let mut m = Alternated::default();
    for traced in TURNS {
        let (name, yaml) = if traced { ("on", &on) } else { ("off", &off) };
        let target = format!(
            "{label} r. end-to-end, traceparent, tracing {name} ({})",
            m.next(traced)
        );
        let before = (
            sink.requests.load(Ordering::Relaxed),
            sink.bytes.load(Ordering::Relaxed),
        );
        let mut row = end_to_end_env(target, bin, yaml, true, &env, args).await?;
        if traced {
            // The last spans are exported within the scheduled delay.
            tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
            let requests = sink.requests.load(Ordering::Relaxed) - before.0;
            let kib = (sink.bytes.load(Ordering::Relaxed) - before.1) as f64 / 1024.0;
            row.note = format!(
                "{} OTLP sink: {requests} exports, {kib:.0} KiB.",
                row.note.trim()
            );
        }
        m.push(traced, row);
    }
    Ok(m)
}
