//! One request in, one answer out: route (a destination or a topic), check
//! limits, parse the body by the schema into events, wait for the journal's
//! commit of all of them (for a topic: of every subscriber's copy), or, in
//! passthrough mode, for the endpoint's answer.

use super::budget::Budget;
use super::credits::{self, Credits};
use super::{Body, forward, passed, rejection, reply, schema, topic};
use crate::config::{DestinationSettings, Live, Mode, Schema, Settings, TopicSettings};
use crate::deliver::Fleet;
use crate::journal::{Appended, Header, Journal, NewEvent};
use crate::lifecycle::Lifecycle;
use crate::metrics;
use crate::server::{BODY_DEADLINE, RemoteAddr, guard};
use crate::telemetry::{Accept, Tracer};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use std::sync::Arc;

pub struct Ingress {
    /// Read once per request: a reload swaps it between requests.
    settings: Arc<Live>,
    journal: Journal,
    lifecycle: Arc<Lifecycle>,
    /// Kept across reloads: a reload does not hand out a second grant.
    credits: Credits,
    /// Passthrough's way to the endpoints.
    fleet: Arc<Fleet>,
    /// `ingress.max_inflight_bytes`, sized once: a reload keeps it.
    budget: Budget,
    /// With tracing on: each request is a span, whose context is stored
    /// with its events (`telemetry`).
    tracer: Option<Tracer>,
}

/// Where a request goes: names are unique across both (checked at load).
enum Route {
    Destination(Arc<DestinationSettings>),
    Topic(Arc<TopicSettings>),
}

impl Route {
    fn name(&self) -> &str {
        match self {
            Route::Destination(d) => &d.name,
            Route::Topic(t) => &t.name,
        }
    }

    fn schema(&self) -> Schema {
        match self {
            Route::Destination(d) => d.schema,
            Route::Topic(t) => t.schema,
        }
    }

    fn eventgrid_topic(&self) -> &str {
        match self {
            Route::Destination(d) => &d.eventgrid_topic,
            Route::Topic(t) => &t.eventgrid_topic,
        }
    }
}

/// What every request passes before anything is read: the browser rules,
/// the key (before the route, so that a caller without one learns no
/// names), and the route. Returns the route and the path after its name.
fn gate<'r>(
    settings: &Settings,
    req: &'r Request<Incoming>,
) -> Result<(Route, &'r str), Box<Response<Body>>> {
    let path = req.uri().path();
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    let (name, rest) = match trimmed.find('/') {
        Some(i) => (&trimmed[..i], &trimmed[i..]),
        None => (trimmed, ""),
    };
    let loopback = settings.listen.ip().is_loopback();
    if let Err(refused) = guard::check(req.headers(), req.uri(), loopback, &settings.allowed_hosts)
    {
        return Err(Box::new(reply::browser_refused(name, refused)));
    }
    if let Some(Err(denied)) = settings
        .ingress
        .keys
        .as_ref()
        .map(|k| k.admit(req.headers(), crate::clock::now_ms()))
    {
        let configured = settings.destination(name).is_some() || settings.topic(name).is_some();
        return Err(Box::new(reply::unauthorized(name, configured, &denied)));
    }
    if let Some(d) = settings.destination(name) {
        Ok((Route::Destination(d.clone()), rest))
    } else if let Some(t) = settings.topic(name) {
        Ok((Route::Topic(t.clone()), rest))
    } else {
        let names: Vec<String> = settings
            .destinations
            .iter()
            .map(|d| d.name.clone())
            .collect();
        let topics: Vec<String> = settings.topics.iter().map(|t| t.name.clone()).collect();
        Err(Box::new(reply::unknown_destination(name, &names, &topics)))
    }
}

/// Ingress while the journal waits for room on its disk to open
/// (`crate::no_room`): what passes the gate is refused 507 `disk_full`, as
/// on a full disk with the journal open; counted and logged the same way.
pub fn waiting(settings: &Settings, req: &Request<Incoming>) -> Response<Body> {
    let resp = match gate(settings, req) {
        Ok((route, _)) => {
            reply::journal_error(route.name(), &crate::journal::JournalError::DiskFull)
        }
        Err(refused) => *refused,
    };
    rejection::record(&resp, req.extensions().get::<RemoteAddr>().copied());
    resp
}

impl Ingress {
    pub fn new(
        settings: Arc<Live>,
        journal: Journal,
        lifecycle: Arc<Lifecycle>,
        fleet: Arc<Fleet>,
        tracer: Option<Tracer>,
    ) -> Self {
        let budget = Budget::new(settings.load().ingress.max_inflight_bytes);
        Ingress {
            settings,
            journal,
            lifecycle,
            credits: Credits::default(),
            fleet,
            budget,
            tracer,
        }
    }

    /// Answers one request; a refusal is counted and logged with its sender.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let remote = req.extensions().get::<RemoteAddr>().copied();
        let mut accept = self
            .tracer
            .as_ref()
            .map(|t| t.accept(req.method(), req.headers()));
        let resp = self.admit(req, accept.as_mut()).await;
        if let Some(a) = accept {
            a.end(resp.status());
        }
        rejection::record(&resp, remote);
        resp
    }

    async fn admit(
        &self,
        req: Request<Incoming>,
        mut accept: Option<&mut Accept>,
    ) -> Response<Body> {
        let settings = self.settings.load();
        let (route, rest) = match gate(&settings, &req) {
            Ok(routed) => routed,
            Err(refused) => return *refused,
        };
        let keys = settings.ingress.keys.as_ref();
        let name = route.name();
        if let Some(a) = accept.as_deref_mut() {
            a.routed(name);
        }
        if crate::event::rules::has_dot_segment(rest) {
            let msg = format!(
                "the path after /{name} has a `.` or `..` segment: the endpoint could read it as a path outside the destination's url; nothing was stored"
            );
            return reply::reject(name, StatusCode::BAD_REQUEST, "dot_segment", msg, None);
        }
        if !crate::event::rules::method_allowed(req.method().as_str()) {
            let mut resp = reply::reject(
                name,
                StatusCode::METHOD_NOT_ALLOWED,
                "method",
                format!(
                    "method {} is not accepted: use POST, PUT or PATCH",
                    req.method()
                ),
                None,
            );
            resp.headers_mut().insert(
                http::header::ALLOW,
                http::HeaderValue::from_static("POST, PUT, PATCH"),
            );
            return resp;
        }
        if self.lifecycle.draining() {
            return shutting_down(name);
        }
        let limit = settings.ingress.max_body_bytes;
        let too_large = || {
            reply::reject(
                name,
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("the body is larger than ingress.max_body_bytes ({limit} bytes)"),
                None,
            )
        };
        let declared = req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit) {
            return too_large();
        }
        let custom_id = match route.schema() {
            Schema::Custom => match forward::event_id(req.headers()) {
                Ok(id) => Some(id),
                Err(header) => {
                    let msg = format!(
                        "header {header} must be 1 to {} visible characters",
                        forward::MAX_ID
                    );
                    return reply::reject(name, StatusCode::BAD_REQUEST, "bad_id", msg, None);
                }
            },
            Schema::Eventgrid | Schema::Cloudevents => None,
        };
        let publish = forward::eventgrid_publish(route.schema(), req.headers());
        let mut headers = forward::forwarded(req.headers(), keys.is_some(), publish);
        headers.retain(|(n, _)| schema::forwards_header(route.schema(), n));
        if let Some(a) = accept.as_deref() {
            a.stamp(&mut headers);
        }
        let success = reply::success_status(publish);
        let method = req.method().as_str().to_string();
        let query = req.uri().query().and_then(|q| forward::query(q, publish));
        let path_and_query = match query {
            Some(q) => format!("{rest}?{q}"),
            None => rest.to_string(),
        };
        // Last, just before the body is read: a request refused for
        // anything else never takes room.
        let Some(share) = self.budget.try_take(declared.unwrap_or(limit)) else {
            return reply::over_budget(name, self.budget.bytes());
        };
        // The limit is http-body-util's `Limited`, with this request's
        // `max_body_bytes` (a reload changes it; tower-http's limit layer is
        // fixed when the service is built), and the deadline is the body's
        // alone: the journal's wait after it is not the app's to time out.
        let (head, body) = req.into_parts();
        let declared = declared.map(|n| n as usize);
        let read = share.read(body, limit as usize, declared);
        let body = match tokio::time::timeout(BODY_DEADLINE, read).await {
            Err(_) => return reply::body_timeout(name, BODY_DEADLINE),
            Ok(read) => read,
        };
        let body = match body {
            Ok(b) => b,
            Err(e) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
            Err(e) => {
                return reply::reject(
                    name,
                    StatusCode::BAD_REQUEST,
                    "bad_body",
                    format!("cannot read the request body: {e}"),
                    None,
                );
            }
        };
        // A batch of `custom` events is a JSON array of their bodies.
        if let Route::Destination(dest) = &route
            && dest.schema == Schema::Custom
            && dest.batch.enabled()
            && serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_err()
        {
            let msg = "the body is not JSON: this destination batches, and a batch is a JSON array of its events";
            return reply::reject(name, StatusCode::BAD_REQUEST, "not_json", msg.into(), None);
        }
        let request = Admitted {
            success,
            method,
            path: path_and_query,
            headers,
            accepted_ms: crate::clock::now_ms(),
        };
        if let Route::Destination(dest) = &route
            && dest.mode == Mode::Passthrough
        {
            let per_second = settings.ingress.credits_per_second;
            if let Some(refused) = self.throttle(name, per_second, credits::cost(1, 0)) {
                return refused;
            }
            // Validation allows passthrough only with schema custom, which
            // always has an id; any other would get a fresh one.
            let id = custom_id.unwrap_or_else(crate::ids::new);
            if let Some(a) = accept.as_deref_mut() {
                a.events(std::slice::from_ref(&id));
            }
            return self.pass(dest, request.event(id, &dest.name, body)).await;
        }
        let parsed = schema::parse(
            route.schema(),
            &head.headers,
            &body,
            route.eventgrid_topic(),
        );
        match &route {
            Route::Destination(dest) => {
                let parts: Vec<(String, Bytes)> = match parsed {
                    None => custom_id.into_iter().map(|id| (id, body.clone())).collect(),
                    Some(Err(e)) => return reply::schema_error(name, &e),
                    Some(Ok(events)) => events
                        .into_iter()
                        .map(|e| {
                            tracing::debug!(destination = %name, id = %e.id, event_type = %e.event_type, subject = e.subject.as_deref(), "event parsed");
                            (e.id, e.body)
                        })
                        .collect(),
                };
                let per_second = settings.ingress.credits_per_second;
                if let Some(refused) =
                    self.throttle(name, per_second, credits::cost(parts.len(), 0))
                {
                    return refused;
                }
                let ids: Vec<String> = parts.iter().map(|(id, _)| id.clone()).collect();
                if let Some(a) = accept.as_deref_mut() {
                    a.events(&ids);
                }
                let success = request.success;
                let events = request.events(parts, &dest.name);
                // One append: every event of the request is committed in one
                // group, or none is.
                match self.journal.append(events).await {
                    Ok(a) => {
                        let dup: Vec<String> =
                            a.duplicates.iter().map(|&i| ids[i].clone()).collect();
                        reply::accepted(success, &ids, &dup)
                    }
                    Err(e) => reply::journal_error(name, &e),
                }
            }
            Route::Topic(t) => {
                let events = match parsed {
                    Some(Ok(events)) => events,
                    Some(Err(e)) => return reply::schema_error(name, &e),
                    // Validation allows only eventgrid and cloudevents topics.
                    None => Vec::new(),
                };
                let per_second = settings.ingress.credits_per_second;
                if let Some(a) = accept {
                    let ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
                    a.events(&ids);
                }
                let cost = credits::cost(events.len(), t.subscribers.len());
                if let Some(refused) = self.throttle(name, per_second, cost) {
                    return refused;
                }
                self.fan_out(t, &request, &events).await
            }
        }
    }

    /// Passthrough: the endpoint's answer, or why there is none.
    async fn pass(&self, dest: &DestinationSettings, event: NewEvent) -> Response<Body> {
        let Some(passthrough) = self.fleet.passthrough(&dest.name) else {
            // Removed by a reload while the body was read.
            return reply::reject(
                &dest.name,
                StatusCode::SERVICE_UNAVAILABLE,
                "reconfiguring",
                "this destination was removed by a reload: retry shortly".into(),
                Some(1),
            );
        };
        // Checked again, now that the body is read: a request forwarded
        // after SIGTERM's grace began would reach the endpoint and lose its
        // answer when the process exits, and the app would send it again.
        let tracked = self
            .lifecycle
            .passing
            .track_future(passthrough.forward(&event));
        if self.lifecycle.draining() {
            return shutting_down(&dest.name);
        }
        passed::answer(&dest.name, tracked.await)
    }

    /// Service Bus's throttle, when on (`per_second` > 0): takes the
    /// request's credits, or gives the refusal. Checked once the events are
    /// counted and before anything is stored, so a refusal stores nothing.
    fn throttle(&self, route: &str, per_second: u64, cost: u64) -> Option<Response<Body>> {
        if per_second == 0 {
            return None;
        }
        let now_ms = crate::clock::mono_us() / 1000;
        let taken = self.credits.take(route, per_second, cost, now_ms);
        taken.err().map(|t| reply::throttled(route, per_second, &t))
    }

    /// A topic's request: one copy per matching subscriber and event, all
    /// in ONE append, so that the 202 covers every copy or none is stored.
    async fn fan_out(
        &self,
        topic: &TopicSettings,
        request: &Admitted,
        events: &[schema::Event],
    ) -> Response<Body> {
        let fan = topic::fan_out(topic, events);
        for c in &fan.copies {
            let e = &events[c.event];
            tracing::debug!(topic = %topic.name, destination = %c.destination, id = %e.id, event_type = %e.event_type, subject = e.subject.as_deref(), "event copied");
        }
        let copies: Vec<NewEvent> = fan
            .copies
            .iter()
            .map(|c| {
                let e = &events[c.event];
                request.event(e.id.clone(), c.destination, e.body.clone())
            })
            .collect();
        let appended = if copies.is_empty() {
            // Nothing to store: every event matched no subscriber.
            Appended::default()
        } else {
            match self.journal.append(copies).await {
                Ok(a) => a,
                Err(e) => return reply::journal_error(&topic.name, &e),
            }
        };
        if !fan.unmatched.is_empty() {
            metrics::unmatched(&topic.name, fan.unmatched.len() as u64);
        }
        let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        let duplicates: Vec<(&str, &str)> = appended
            .duplicates
            .iter()
            .filter_map(|&i| fan.copies.get(i))
            .map(|c| (ids[c.event], c.destination))
            .collect();
        reply::fanned_out(
            request.success,
            fan.copies.len(),
            &ids,
            fan.unmatched.len(),
            &duplicates,
        )
    }
}

fn shutting_down(name: &str) -> Response<Body> {
    reply::reject(
        name,
        StatusCode::SERVICE_UNAVAILABLE,
        "shutting_down",
        "courier is shutting down: retry shortly".into(),
        Some(5),
    )
}

/// What every event of one request shares.
#[derive(Clone)]
struct Admitted {
    /// The answer once stored: 202, or 200 for an Event Grid publisher.
    success: StatusCode,
    method: String,
    path: String,
    headers: Vec<Header>,
    accepted_ms: u64,
}

impl Admitted {
    /// One event per part; the last takes what they share rather than a
    /// copy (most requests carry one event).
    fn events(self, parts: Vec<(String, Bytes)>, destination: &str) -> Vec<NewEvent> {
        let mut events = Vec::with_capacity(parts.len());
        let mut parts = parts.into_iter().peekable();
        while let Some((id, body)) = parts.next() {
            if parts.peek().is_some() {
                events.push(self.event(id, destination, body));
            } else {
                events.push(self.into_event(id, destination, body));
                break;
            }
        }
        events
    }

    fn event(&self, id: String, destination: &str, body: Bytes) -> NewEvent {
        self.clone().into_event(id, destination, body)
    }

    fn into_event(self, id: String, destination: &str, body: Bytes) -> NewEvent {
        NewEvent {
            id,
            destination: destination.to_string(),
            method: self.method,
            path: self.path,
            headers: self.headers,
            body,
            accepted_ms: self.accepted_ms,
        }
    }
}
