//! The admin surface (SPEC §5): health, readiness, Prometheus metrics.

pub mod metrics;

use crate::config::Settings;
use crate::journal::Journal;
use crate::lifecycle::Lifecycle;
use crate::server::{Body, json};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering;

pub struct Admin {
    pub settings: Arc<Settings>,
    pub journal: Journal,
    pub lifecycle: Arc<Lifecycle>,
    pub prometheus: PrometheusHandle,
}

impl Admin {
    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        match (req.method(), req.uri().path()) {
            (&Method::GET, "/healthz") => json(StatusCode::OK, &json!({ "status": "ok" })),
            (&Method::GET, "/readyz") => {
                if self.lifecycle.ready() {
                    json(StatusCode::OK, &json!({ "status": "ready" }))
                } else {
                    json(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &json!({ "status": "not ready" }),
                    )
                }
            }
            (&Method::GET, "/metrics") => self.metrics(),
            (_, path) => json(
                StatusCode::NOT_FOUND,
                &json!({ "error": format!("no admin endpoint {path}") }),
            ),
        }
    }

    fn metrics(&self) -> Response<Body> {
        for d in &self.settings.destinations {
            if let Some(state) = self.journal.destination(&d.name) {
                metrics::pending(
                    &d.name,
                    state.pending.load(Ordering::Relaxed),
                    state.bytes.load(Ordering::Relaxed),
                    false,
                );
            }
        }
        let mut resp = Response::new(Full::new(Bytes::from(self.prometheus.render())));
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        resp
    }
}
