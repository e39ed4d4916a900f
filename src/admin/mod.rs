//! The admin surface (SPEC §5): health, readiness, Prometheus metrics, and
//! the destinations API (state, pause, resume).

pub mod metrics;

use crate::clock;
use crate::config::Settings;
use crate::deliver::health::{Health, PauseReason};
use crate::journal::{Journal, Reader};
use crate::lifecycle::Lifecycle;
use crate::server::{Body, json};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

pub struct Admin {
    pub settings: Arc<Settings>,
    pub journal: Journal,
    pub lifecycle: Arc<Lifecycle>,
    pub prometheus: PrometheusHandle,
    pub healths: HashMap<String, Arc<Health>>,
    pub reader: Reader,
}

impl Admin {
    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_string();
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (req.method(), segments.as_slice()) {
            (&Method::GET, ["healthz"]) => json(StatusCode::OK, &json!({ "status": "ok" })),
            (&Method::GET, ["readyz"]) => {
                if self.lifecycle.ready() && !self.journal.failed() {
                    json(StatusCode::OK, &json!({ "status": "ready" }))
                } else {
                    json(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &json!({ "status": "not ready" }),
                    )
                }
            }
            (&Method::GET, ["metrics"]) => self.metrics(),
            (&Method::GET, ["v1", "destinations"]) => self.destinations().await,
            (&Method::POST, ["v1", "destinations", name, action @ ("pause" | "resume")]) => {
                self.pause_or_resume(name, action)
            }
            _ => json(
                StatusCode::NOT_FOUND,
                &json!({ "error": format!("no admin endpoint {} {path}", req.method()) }),
            ),
        }
    }

    fn metrics(&self) -> Response<Body> {
        for d in &self.settings.destinations {
            let probation = self.healths.get(&d.name).is_some_and(|h| h.on_probation());
            if let Some(state) = self.journal.destination(&d.name) {
                metrics::pending(
                    &d.name,
                    state.pending.load(Ordering::Relaxed),
                    state.bytes.load(Ordering::Relaxed),
                    probation,
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

    async fn destinations(&self) -> Response<Body> {
        let now = clock::now_ms();
        let mut out = Vec::new();
        for d in &self.settings.destinations {
            let (Some(health), Some(state)) =
                (self.healths.get(&d.name), self.journal.destination(&d.name))
            else {
                continue;
            };
            let v = health.view();
            let oldest = self.reader.oldest_accepted(&d.name).await.ok().flatten();
            out.push(json!({
                "name": d.name,
                "state": v.state,
                "until": v.until_ms.map(clock::rfc3339),
                "paused_by": v.paused.map(PauseReason::as_str),
                "pending": state.pending.load(Ordering::Relaxed),
                "in_flight": v.in_flight,
                "oldest_pending_age_s": oldest.map(|t| now.saturating_sub(t) as f64 / 1000.0),
                "consecutive_failures": v.consecutive_failures,
                "last_outcome": v.last_outcome.map(|o| o.as_str()),
                "last_attempt": v.last_attempt_ms.map(clock::rfc3339),
            }));
        }
        json(StatusCode::OK, &json!({ "destinations": out }))
    }

    fn pause_or_resume(&self, name: &str, action: &str) -> Response<Body> {
        let Some(health) = self.healths.get(name) else {
            let names: Vec<&str> = self
                .settings
                .destinations
                .iter()
                .map(|d| d.name.as_str())
                .collect();
            return json(
                StatusCode::NOT_FOUND,
                &json!({ "error": format!("unknown destination `{name}`"), "destinations": names }),
            );
        };
        let body: Value = if action == "pause" {
            health.pause(PauseReason::Operator);
            tracing::info!(destination = %name, "paused by operator");
            json!({ "name": name, "state": "paused" })
        } else {
            let was_paused = health.resume();
            tracing::info!(destination = %name, was_paused, "resumed by operator");
            json!({ "name": name, "state": health.view().state, "was_paused": was_paused })
        };
        json(StatusCode::OK, &body)
    }
}
