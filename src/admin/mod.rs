//! The admin surface (docs/http-api.md): health, readiness, Prometheus metrics, and
//! the destinations API (state, pause, resume).

pub mod api;
pub mod client;
mod dead_letters;
mod endpoints;
mod events;
pub mod table;

use crate::clock;
use crate::config::{Live, Settings, SinkAt};
use crate::deliver::Fleet;
use crate::deliver::health::PauseReason;
use crate::history::State;
use crate::journal::{Journal, Pause, Reader};
use crate::lifecycle::Lifecycle;
use crate::metrics;
use crate::server::{Body, guard, json};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

pub(crate) struct Admin {
    pub settings: Arc<Live>,
    pub journal: Journal,
    pub lifecycle: Arc<Lifecycle>,
    pub prometheus: PrometheusHandle,
    pub fleet: Arc<Fleet>,
    pub reader: Reader,
    /// One replay or purge at a time: a purge never removes a file a
    /// replay is marking.
    pub dead_letter_ops: Arc<tokio::sync::Mutex<()>>,
    /// Reads event history (docs/history.md); `None` when it is off.
    pub history: Option<Arc<crate::history::Reader>>,
}

/// Why a destination is paused, as `courier_destination_paused`'s `by`
/// label says it: by the operator, by a 410 answer, or held by a
/// Retry-After (its state is `paused` with an `until`, no `paused_by`).
fn pause_cause(v: &crate::deliver::health::View) -> Option<&'static str> {
    match v.paused {
        Some((by, _)) => Some(by.as_str()),
        None if v.state == "paused" => Some("retry_after"),
        None => None,
    }
}

fn answer(a: dead_letters::Answer) -> Response<Body> {
    a.map_or_else(dead_letters::ApiError::reply, |v| json(StatusCode::OK, &v))
}

/// The token first, then the browser rules: what every admin answer,
/// the waiting one included, is behind.
fn refuse(settings: &Settings, req: &Request<Incoming>) -> Option<Response<Body>> {
    deny(settings, req).or_else(|| refuse_browsers(settings, req))
}

/// The admin while the journal waits for room on its disk to open
/// (`crate::no_room`): the process lives, so `/healthz` is 200; it is not
/// ready, so `/readyz` is 503; the scrape works; the API, which reads the
/// journal, answers 503 `disk_full`.
pub(crate) fn waiting(
    settings: &Settings,
    prometheus: &PrometheusHandle,
    req: &Request<Incoming>,
) -> Response<Body> {
    if let Some(refused) = refuse(settings, req) {
        return refused;
    }
    let waiting = "waiting for room on the journal's disk";
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => json(StatusCode::OK, &json!({ "status": waiting })),
        (&Method::GET, "/readyz") => json(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({ "status": "not ready", "reason": "disk_full" }),
        ),
        (&Method::GET, "/metrics") => scrape(prometheus),
        _ => json(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({
                "error": "the journal is not open yet: the disk holding it is full, and courier opens it once there is room",
                "reason": "disk_full",
            }),
        ),
    }
}

/// Prometheus' text, with the process' own gauges brought up to date.
fn scrape(prometheus: &PrometheusHandle) -> Response<Body> {
    metrics::process();
    let mut resp = Response::new(Full::new(Bytes::from(prometheus.render())));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    resp
}

/// Browsers cannot drive the admin API (docs/http-api.md): the guard's `Origin`
/// and `Host` rules, and a mutation must be `application/json`, which a
/// cross-site page cannot send without a CORS preflight that courier
/// never grants. A `DELETE` is always preflighted, so it may come without
/// a body or content type.
fn refuse_browsers(settings: &Settings, req: &Request<Incoming>) -> Option<Response<Body>> {
    let loopback = settings.admin_listen.ip().is_loopback();
    if let Err(r) = guard::check(req.headers(), req.uri(), loopback, &settings.allowed_hosts) {
        tracing::info!(method = %req.method(), path = req.uri().path(), reason = r.reason, "admin call refused");
        return Some(json(
            StatusCode::FORBIDDEN,
            &json!({ "error": r.message, "reason": r.reason }),
        ));
    }
    let content_type = req.headers().get(http::header::CONTENT_TYPE);
    let json_body = content_type.is_some_and(|v| {
        v.to_str().is_ok_and(|t| {
            t.split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
        })
    });
    let mutation = !matches!(*req.method(), Method::GET | Method::HEAD);
    let bodiless_delete = *req.method() == Method::DELETE && content_type.is_none();
    if mutation && !json_body && !bodiless_delete {
        tracing::info!(method = %req.method(), path = req.uri().path(), "admin call refused: not application/json");
        return Some(json(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &json!({ "error": "admin calls that change something take `Content-Type: application/json` only", "reason": "not_json" }),
        ));
    }
    None
}

/// With a token configured, every call but the probes and the scrape
/// needs it, reads included: dead letters hold the app's bodies and
/// headers. Checked before anything else, routing, the browser rules
/// and the content type included, so that nothing about the API is
/// learnt without it.
fn deny(settings: &Settings, req: &Request<Incoming>) -> Option<Response<Body>> {
    let token = settings.admin_token.as_ref()?;
    // History holds no body and no header (docs/history.md): its reads are open.
    let history = req.method() == Method::GET
        && (req.uri().path() == "/v1/events" || req.uri().path().starts_with("/v1/events/"));
    let open = history || matches!(req.uri().path(), "/healthz" | "/readyz" | "/metrics");
    if open || token.authorizes(req.headers()) {
        return None;
    }
    tracing::info!(method = %req.method(), path = req.uri().path(), "admin call refused: missing or wrong bearer token");
    let mut resp = json(
        StatusCode::UNAUTHORIZED,
        &json!({ "error": "this admin call needs `Authorization: Bearer <token>`, the token in the variable named by admin_token_env", "reason": "unauthorized" }),
    );
    resp.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Bearer realm=\"courier-admin\""),
    );
    Some(resp)
}

impl Admin {
    pub async fn handle(self: &Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_string();
        // The token first (docs/http-api.md): a caller without it learns
        // nothing, not even which of the browser rules it broke.
        if let Some(refused) = refuse(&self.settings.load(), &req) {
            return refused;
        }
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (req.method(), segments.as_slice()) {
            // A failed journal refuses every write until restart: tell the
            // liveness probe, so that the kubelet restarts the container.
            (&Method::GET, ["healthz"]) if self.journal.failed() => json(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({ "status": "journal failed" }),
            ),
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
            (&Method::GET, ["metrics"]) => self.metrics().await,
            (&Method::GET, ["v1", "destinations"]) => self.destinations().await,
            (&Method::POST, ["v1", "destinations", name, action @ ("pause" | "resume")]) => {
                self.pause_or_resume(name, action).await
            }
            (&Method::GET, ["v1", "destinations", name, "endpoints"]) => {
                answer(self.list_endpoints(name, req.uri()).await)
            }
            (
                &Method::POST,
                [
                    "v1",
                    "destinations",
                    name,
                    "endpoints",
                    origin,
                    action @ ("disable" | "enable"),
                ],
            ) => answer(self.set_endpoint(name, origin, action).await),
            (&Method::GET, ["v1", "events"]) => answer(self.list_events(req.uri()).await),
            (&Method::GET, ["v1", "events", id]) => answer(self.show_event(id, req.uri()).await),
            (&Method::GET, ["v1", "dead-letters"]) => {
                answer(self.list_dead_letters(req.uri()).await)
            }
            (&Method::GET, ["v1", "dead-letters", name, id]) => {
                answer(self.show_dead_letter(name, id).await)
            }
            (&Method::POST, ["v1", "dead-letters", "replay"]) => {
                answer(self.replay_dead_letters(req).await)
            }
            (&Method::DELETE, ["v1", "dead-letters"]) => {
                answer(self.purge_dead_letters(req.uri()).await)
            }
            _ => json(
                StatusCode::NOT_FOUND,
                &json!({ "error": format!("no admin endpoint {} {path}", req.method()) }),
            ),
        }
    }

    async fn metrics(&self) -> Response<Body> {
        // Every destination the journal knows, configured or orphaned by a
        // reload: events left waiting must show on a dashboard.
        let settings = self.settings.load();
        // The limits in force (a reload keeps `journal`, changes shares), so
        // that an alert can say how full the journal is.
        metrics::journal_max_bytes(settings.journal.max_bytes);
        for d in &settings.destinations {
            metrics::max_pending_bytes(&d.name, d.max_pending_bytes);
        }
        for name in self.journal.destination_names() {
            let health = self.fleet.health(&name);
            let probation = health.as_ref().is_some_and(|h| h.on_probation());
            // A destination a reload removed has no dispatcher to hold back:
            // its series say it is not paused, rather than keep the last cause.
            metrics::paused(&name, health.as_ref().and_then(|h| pause_cause(&h.view())));
            if let Some(state) = self.journal.destination(&name) {
                metrics::pending(&name, state.pending(), state.bytes(), probation);
                if let Some(lanes) = state.lanes_view() {
                    metrics::ordering_lanes_blocked(&name, lanes.blocked);
                }
                if let Some(endpoints) = self.fleet.endpoints(&name) {
                    metrics::endpoints(&name, endpoints.census().by_state());
                }
            }
            // A failed read leaves the last age: the journal is failed now,
            // which `/healthz` says.
            if let Ok(oldest) = self.reader.oldest_pending(&name).await {
                let ms = oldest.map_or(0, |t| clock::now_ms().saturating_sub(t));
                metrics::oldest_pending_age(&name, Duration::from_millis(ms));
            }
        }
        scrape(&self.prometheus)
    }

    /// Configured destinations, then orphaned ones: events kept in the
    /// journal for a destination a reload removed, delivered again if it
    /// comes back.
    async fn destinations(&self) -> Response<Body> {
        // Right after a start, history may still be counting its records.
        if let Some(history) = self.journal.history() {
            history.counted().await;
        }
        let now = clock::now_ms();
        let settings = self.settings.load();
        let mut out = Vec::new();
        for d in &settings.destinations {
            let (Some(health), Some(state)) = (
                self.fleet.health(&d.name),
                self.journal.destination(&d.name),
            ) else {
                continue;
            };
            let v = health.view();
            // Attempts it may have in flight now: `concurrency`, or the
            // limit adaptive concurrency has learnt, beside the baseline
            // latency it judges answers by.
            let concurrency = self.fleet.limit(&d.name).map(|l| {
                let mut c = json!({ "limit": l.current(), "adaptive": l.adaptive() });
                if let Some(b) = l.baseline() {
                    c["baseline_ms"] = json!(b.as_secs_f64() * 1000.0);
                }
                c
            });
            let oldest = self.reader.oldest_pending(&d.name).await.ok().flatten();
            let failing = self.fleet.sink_failing(&d.name);
            let dead_letter = json!({
                "sink": d.dead_letter.as_ref().map(|at| match at {
                    SinkAt::Dir(dir) => dir.display().to_string(),
                    SinkAt::Bucket(url) => url.as_str().to_string(),
                }),
                "writing": if failing.is_some() { "failing" } else { "ok" },
                "failed_writes": failing.map(|t| t.failures),
                "failing_for_s": failing.map(|t| t.lasted.as_secs_f64()),
            });
            // Counts by state (docs/history.md): what waits and what is in an
            // attempt now, and how events ended within history's retention.
            let in_flight_events = health.attempting_events() as u64;
            let ended = self.journal.history().map(|h| h.counts(&d.name));
            let events = json!({
                "pending": state.pending().saturating_sub(in_flight_events),
                "in_flight": in_flight_events,
                "delivered": ended.map(|c| c[State::Delivered as usize]),
                "dead_lettered": ended.map(|c| c[State::DeadLettered as usize]),
                "dropped": ended.map(|c| c[State::Dropped as usize]),
            });
            // With an ordering key: its keys with pending events, those whose
            // failing head holds others back, and for how long the first.
            let ordering = state.lanes_view().map(|l| {
                json!({
                    "lanes": l.lanes,
                    "blocked": l.blocked,
                    "oldest_blocked_age_s": l.blocked_since_ms.map(|t| now.saturating_sub(t) as f64 / 1000.0),
                })
            });
            out.push(json!({
                "name": d.name,
                "mode": d.mode.as_str(),
                "state": v.state,
                "until": v.until_ms.map(clock::rfc3339),
                "paused_by": v.paused.map(|(by, _)| by.as_str()),
                "paused_at": v.paused.map(|(_, at)| clock::rfc3339(at)),
                "pending": state.pending(),
                "in_flight": v.in_flight,
                "concurrency": concurrency,
                "oldest_pending_age_s": oldest.map(|t| now.saturating_sub(t) as f64 / 1000.0),
                "consecutive_failures": v.consecutive_failures,
                "last_outcome": v.last_outcome.map(|o| o.as_str()),
                "last_attempt": v.last_attempt_ms.map(clock::rfc3339),
                "dead_letter": dead_letter,
                "events": events,
                "ordering": ordering,
            }));
        }
        let mut orphaned = self.journal.destination_names();
        orphaned.retain(|name| settings.destination(name).is_none());
        orphaned.sort();
        for name in orphaned {
            let pending = self.journal.destination(&name).map_or(0, |s| s.pending());
            if pending == 0 {
                continue;
            }
            let oldest = self.reader.oldest_pending(&name).await.ok().flatten();
            out.push(json!({
                "name": name,
                "state": "orphaned",
                "pending": pending,
                "in_flight": 0,
                "oldest_pending_age_s": oldest.map(|t| now.saturating_sub(t) as f64 / 1000.0),
            }));
        }
        json(StatusCode::OK, &json!({ "destinations": out }))
    }

    async fn pause_or_resume(&self, name: &str, action: &str) -> Response<Body> {
        let Some(health) = self.fleet.health(name) else {
            let settings = self.settings.load();
            let names: Vec<&str> = settings
                .destinations
                .iter()
                .map(|d| d.name.as_str())
                .collect();
            return json(
                StatusCode::NOT_FOUND,
                &json!({ "error": format!("unknown destination `{name}`"), "destinations": names }),
            );
        };
        // Recorded before it takes effect and is answered: a restart, even
        // after SIGKILL, keeps what an operator was told.
        let pause = (action == "pause").then(|| {
            let since_ms = match health.view().paused {
                Some((PauseReason::Operator, since)) => since,
                _ => clock::now_ms(),
            };
            Pause {
                by: PauseReason::Operator.as_str().into(),
                since_ms,
            }
        });
        if let Err(e) = self.journal.set_pause(name, pause.clone()).await {
            tracing::error!(destination = %name, error = %e, "cannot record a pause or resume in the journal");
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({ "error": format!("cannot record the {action} of `{name}` in the journal: {e}; nothing changed") }),
            );
        }
        let body: Value = if let Some(pause) = pause {
            health.pause(PauseReason::Operator, pause.since_ms);
            tracing::info!(destination = %name, "paused by operator");
            json!({ "name": name, "state": "paused", "paused_at": clock::rfc3339(pause.since_ms) })
        } else {
            let was_paused = health.resume();
            tracing::info!(destination = %name, was_paused, "resumed by operator");
            json!({ "name": name, "state": health.view().state, "was_paused": was_paused })
        };
        json(StatusCode::OK, &body)
    }
}
