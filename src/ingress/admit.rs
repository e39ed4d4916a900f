//! One request in, one answer out: route (a destination or a topic), check
//! limits, parse the body by the schema into events, wait for the journal's
//! commit of all of them (for a topic: of every subscriber's copy), or, in
//! passthrough mode, for the endpoint's answer.

use super::budget::Budget;
use super::credits::{self, Credits};
use super::{Body, forward, passed, rejection, reply, schema, topic};
use crate::config::settings::PerEvent;
use crate::config::{DestinationSettings, Live, Mode, Settings, TopicSettings};
use crate::deliver::Fleet;
use crate::deliver::endpoints::Endpoints;
use crate::event::Schema;
use crate::event::{Header, NewEvent, endpoint};
use crate::journal::{Appended, Journal};
use crate::lifecycle::Lifecycle;
use crate::metrics;
use crate::server::linger::Lingering;
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
fn gate<'r, B>(
    settings: &Settings,
    req: &'r Request<B>,
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
///
/// Every HTTP/1 answer closes its connection, after the body is read and
/// dropped frame by frame (at most `max_body_bytes`, within the body's
/// deadline; nothing is kept): a connection kept alive here would be
/// closed under the app's client when the journal opens, and a POST sent
/// on it at that moment fails without an answer (the client cannot know
/// whether to send it again). A close with the body unread would reset
/// the connection before the client read the 507. A client that waits
/// for `100 Continue` has sent no body: it gets the 507 at once.
pub async fn waiting(settings: &Settings, req: Request<Incoming>) -> Response<Body> {
    let mut resp = match gate(settings, &req) {
        Ok((route, _)) => {
            reply::journal_error(route.name(), &crate::journal::JournalError::DiskFull)
        }
        Err(refused) => *refused,
    };
    rejection::record(&resp, req.extensions().get::<RemoteAddr>().copied());
    if !req.headers().contains_key(http::header::EXPECT) {
        let limit = usize::try_from(settings.ingress.max_body_bytes).unwrap_or(usize::MAX);
        let read = crate::server::linger::discard(req.into_body(), limit);
        let _ = tokio::time::timeout(BODY_DEADLINE, read).await;
    }
    resp.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
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
        let (head, body) = req.into_parts();
        let max_body = self.settings.load().ingress.max_body_bytes;
        let body = Lingering::new(body, &head, max_body);
        let req = Request::from_parts(head, body);
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

    async fn admit(&self, req: Request<Lingering>, accept: Option<&mut Accept>) -> Response<Body> {
        self.steps(req, accept)
            .await
            .unwrap_or_else(|refused| *refused)
    }

    /// The request's way in, a step a line: each step may refuse, and
    /// nothing is kept before `store`. Cheap checks come first, the body's
    /// read (which takes room in the budget) after them.
    async fn steps(
        &self,
        req: Request<Lingering>,
        mut accept: Option<&mut Accept>,
    ) -> Result<Response<Body>, Refused> {
        let settings = self.settings.load();
        let (route, rest) = gate(&settings, &req)?;
        let name = route.name();
        if let Some(a) = accept.as_deref_mut() {
            a.routed(name);
        }
        check_target(name, rest, req.method())?;
        if self.lifecycle.draining() {
            return Err(Box::new(shutting_down(name)));
        }
        let limit = settings.ingress.max_body_bytes;
        let declared = declared_length(name, req.headers(), limit)?;
        let custom_id = custom_id(&route, req.headers())?;
        let keyed = settings.ingress.keys.is_some();
        let mut admitted = Admitted::describe(&route, keyed, rest, &req);
        if let Route::Destination(dest) = &route
            && let Some(per_event) = &dest.per_event
        {
            let endpoints = self.fleet.endpoints(&dest.name);
            admitted.name_endpoint(dest, per_event, endpoints.as_deref(), req.headers())?;
        }
        if let Some(a) = accept.as_deref() {
            a.stamp(&mut admitted.headers);
        }
        let (headers, body) = self.read(name, req, limit, declared).await?;
        check_batch(&route, &body)?;
        admitted.accepted_ms = crate::clock::now_ms();
        let per_second = settings.ingress.credits_per_second;
        if let Route::Destination(dest) = &route
            && dest.mode == Mode::Passthrough
        {
            self.throttle(name, per_second, credits::cost(1, 0))?;
            // Validation allows passthrough only with schema custom, which
            // always has an id; any other would get a fresh one.
            let id = custom_id.unwrap_or_else(crate::ids::new);
            if let Some(a) = accept.as_deref_mut() {
                a.events(std::slice::from_ref(&id));
            }
            return Ok(self.pass(dest, admitted.event(id, &dest.name, body)).await);
        }
        let parsed = parse(route, &headers, body, custom_id)?;
        self.throttle(parsed.name(), per_second, parsed.cost())?;
        if let Some(a) = accept {
            a.events(&parsed.ids());
        }
        self.store(parsed, admitted).await
    }

    /// Takes the request's room in `ingress.max_inflight_bytes` (the
    /// declared length, else the limit) and reads its body within
    /// `max_body_bytes` and the body's own deadline. The limit is
    /// http-body-util's `Limited`, with this request's `max_body_bytes` (a
    /// reload changes it; tower-http's limit layer is fixed when the
    /// service is built); the journal's wait after it is not the app's to
    /// time out.
    async fn read(
        &self,
        name: &str,
        req: Request<Lingering>,
        limit: u64,
        declared: Option<u64>,
    ) -> Result<(http::HeaderMap, Bytes), Refused> {
        let Some(share) = self.budget.try_take(declared.unwrap_or(limit)) else {
            // Not read after the answer either: that would take the memory
            // this refusal is for.
            req.into_body().cut();
            return Err(Box::new(reply::over_budget(name, self.budget.bytes())));
        };
        let (head, body) = req.into_parts();
        let read = share.read(body, limit as usize, declared.map(|n| n as usize));
        let body = match tokio::time::timeout(BODY_DEADLINE, read).await {
            Err(_) => return Err(Box::new(reply::body_timeout(name, BODY_DEADLINE))),
            Ok(read) => read,
        };
        match body {
            Ok(b) => Ok((head.headers, b)),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                Err(Box::new(too_large(name, limit)))
            }
            Err(e) => Err(refuse(
                name,
                StatusCode::BAD_REQUEST,
                "bad_body",
                format!("cannot read the request body: {e}"),
            )),
        }
    }

    /// The one append of a request: all its events are committed in one
    /// group, or none is.
    async fn append(&self, name: &str, events: Vec<NewEvent>) -> Result<Appended, Refused> {
        if events.is_empty() {
            // A topic's events that matched no subscriber: nothing to store.
            return Ok(Appended::default());
        }
        self.journal
            .append(events)
            .await
            .map_err(|e| Box::new(reply::journal_error(name, &e)))
    }

    /// Stores what was parsed and answers for it.
    async fn store(&self, parsed: Parsed, admitted: Admitted) -> Result<Response<Body>, Refused> {
        match parsed {
            Parsed::Destination(dest, parts) => {
                let ids: Vec<String> = parts.iter().map(|(id, _)| id.clone()).collect();
                let success = admitted.success;
                let appended = self
                    .append(&dest.name, admitted.events(parts, &dest.name))
                    .await?;
                let dup: Vec<String> = appended
                    .duplicates
                    .iter()
                    .map(|&i| ids[i].clone())
                    .collect();
                Ok(reply::accepted(success, &ids, &dup))
            }
            Parsed::Topic(topic, events) => self.fan_out(&topic, &admitted, &events).await,
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
    /// request's credits, or refuses. Checked once the events are counted
    /// and before anything is stored, so a refusal stores nothing.
    fn throttle(&self, route: &str, per_second: u64, cost: u64) -> Result<(), Refused> {
        if per_second == 0 {
            return Ok(());
        }
        let now_ms = crate::clock::mono_us() / 1000;
        let taken = self.credits.take(route, per_second, cost, now_ms);
        taken.map_err(|t| Box::new(reply::throttled(route, per_second, &t)))
    }

    /// A topic's request: one copy per matching subscriber and event, all
    /// in ONE append, so that the 202 covers every copy or none is stored.
    async fn fan_out(
        &self,
        topic: &TopicSettings,
        request: &Admitted,
        events: &[schema::Event],
    ) -> Result<Response<Body>, Refused> {
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
        let appended = self.append(&topic.name, copies).await?;
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
        Ok(reply::fanned_out(
            request.success,
            fan.copies.len(),
            &ids,
            fan.unmatched.len(),
            &duplicates,
        ))
    }
}

/// A refusal: the steps return it early with `?` (boxed, as a response
/// is large beside what the steps return).
type Refused = Box<Response<Body>>;

fn refuse(name: &str, status: StatusCode, reason: &'static str, message: String) -> Refused {
    Box::new(reply::reject(name, status, reason, message, None))
}

fn too_large(name: &str, limit: u64) -> Response<Body> {
    reply::reject(
        name,
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("the body is larger than ingress.max_body_bytes ({limit} bytes)"),
        None,
    )
}

/// Where the request goes after the route's name, and how: no dot
/// segment (the endpoint could read it as a path outside the
/// destination's url), and a method an event may have.
fn check_target(name: &str, rest: &str, method: &http::Method) -> Result<(), Refused> {
    if crate::event::rules::has_dot_segment(rest) {
        let msg = format!(
            "the path after /{name} has a `.` or `..` segment: the endpoint could read it as a path outside the destination's url; nothing was stored"
        );
        return Err(refuse(name, StatusCode::BAD_REQUEST, "dot_segment", msg));
    }
    if !crate::event::rules::method_allowed(method.as_str()) {
        let mut resp = refuse(
            name,
            StatusCode::METHOD_NOT_ALLOWED,
            "method",
            format!("method {method} is not accepted: use POST, PUT or PATCH"),
        );
        resp.headers_mut().insert(
            http::header::ALLOW,
            http::HeaderValue::from_static("POST, PUT, PATCH"),
        );
        return Err(resp);
    }
    Ok(())
}

/// The body's declared length, refused at once when over `limit`.
fn declared_length(
    name: &str,
    headers: &http::HeaderMap,
    limit: u64,
) -> Result<Option<u64>, Refused> {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(Box::new(too_large(name, limit)));
    }
    Ok(declared)
}

/// For schema `custom`, the event's id from its headers.
fn custom_id(route: &Route, headers: &http::HeaderMap) -> Result<Option<String>, Refused> {
    match route.schema() {
        Schema::Custom => forward::event_id(headers).map(Some).map_err(|header| {
            let msg = format!(
                "header {header} must be 1 to {} visible characters",
                forward::MAX_ID
            );
            refuse(route.name(), StatusCode::BAD_REQUEST, "bad_id", msg)
        }),
        Schema::Eventgrid | Schema::Cloudevents => Ok(None),
    }
}

/// A batch of `custom` events is a JSON array of their bodies: a body of
/// one that is not JSON could never be batched.
fn check_batch(route: &Route, body: &Bytes) -> Result<(), Refused> {
    if let Route::Destination(dest) = route
        && dest.schema == Schema::Custom
        && dest.batch.enabled()
        && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_err()
    {
        let msg = "the body is not JSON: this destination batches, and a batch is a JSON array of its events";
        return Err(refuse(
            route.name(),
            StatusCode::BAD_REQUEST,
            "not_json",
            msg.into(),
        ));
    }
    Ok(())
}

/// A request's events, read by the route's schema.
enum Parsed {
    /// For one destination: each event's id and body.
    Destination(Arc<DestinationSettings>, Vec<(String, Bytes)>),
    /// For a topic, copied to its subscribers at `store`.
    Topic(Arc<TopicSettings>, Vec<schema::Event>),
}

impl Parsed {
    fn name(&self) -> &str {
        match self {
            Parsed::Destination(d, _) => &d.name,
            Parsed::Topic(t, _) => &t.name,
        }
    }

    fn ids(&self) -> Vec<String> {
        match self {
            Parsed::Destination(_, parts) => parts.iter().map(|(id, _)| id.clone()).collect(),
            Parsed::Topic(_, events) => events.iter().map(|e| e.id.clone()).collect(),
        }
    }

    /// Service Bus's credits: one per event, and one per copy of it.
    fn cost(&self) -> u64 {
        match self {
            Parsed::Destination(_, parts) => credits::cost(parts.len(), 0),
            Parsed::Topic(t, events) => credits::cost(events.len(), t.subscribers.len()),
        }
    }
}

fn parse(
    route: Route,
    headers: &http::HeaderMap,
    body: Bytes,
    custom_id: Option<String>,
) -> Result<Parsed, Refused> {
    let parsed = schema::parse(route.schema(), headers, &body, route.eventgrid_topic());
    let refused = |e: &schema::SchemaError| Box::new(reply::schema_error(route.name(), e));
    match (&route, parsed) {
        (_, Some(Err(e))) => Err(refused(&e)),
        (Route::Destination(dest), None) => Ok(Parsed::Destination(
            dest.clone(),
            custom_id.into_iter().map(|id| (id, body.clone())).collect(),
        )),
        (Route::Destination(dest), Some(Ok(events))) => {
            let parts = events
                .into_iter()
                .map(|e| {
                    tracing::debug!(destination = %dest.name, id = %e.id, event_type = %e.event_type, subject = e.subject.as_deref(), "event parsed");
                    (e.id, e.body)
                })
                .collect();
            Ok(Parsed::Destination(dest.clone(), parts))
        }
        (Route::Topic(t), Some(Ok(events))) => Ok(Parsed::Topic(t.clone(), events)),
        // Validation allows only eventgrid and cloudevents topics.
        (Route::Topic(t), None) => Ok(Parsed::Topic(t.clone(), Vec::new())),
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
    /// What the request says of its events, besides their bodies: the
    /// headers that travel, the method, the path after the route's name
    /// with the query that travels; `accepted_ms` is set once the body is read.
    fn describe<B>(route: &Route, keyed: bool, rest: &str, req: &Request<B>) -> Admitted {
        let publish = forward::eventgrid_publish(route.schema(), req.headers());
        let mut headers = forward::forwarded(req.headers(), keyed, publish);
        headers.retain(|(n, _)| schema::forwards_header(route.schema(), n));
        let query = req.uri().query().and_then(|q| forward::query(q, publish));
        Admitted {
            success: reply::success_status(publish),
            method: req.method().as_str().to_string(),
            path: match query {
                Some(q) => format!("{rest}?{q}"),
                None => rest.to_string(),
            },
            headers,
            accepted_ms: 0,
        }
    }

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

    /// `url: per_event`: the endpoint the request names, checked, kept with
    /// its events as courier's own headers (`event::endpoint`); the app's
    /// two headers do not travel.
    /// A disabled endpoint's events are refused (409), not stored to be
    /// dead-lettered: the app hears at once, and the journal keeps nothing.
    fn name_endpoint(
        &mut self,
        dest: &DestinationSettings,
        per_event: &PerEvent,
        endpoints: Option<&Endpoints>,
        headers: &http::HeaderMap,
    ) -> Result<(), Refused> {
        let refused = |e: endpoint::Refused| {
            let msg = format!("{e}; nothing was stored");
            refuse(&dest.name, StatusCode::BAD_REQUEST, e.reason(), msg)
        };
        let named = headers
            .get(&per_event.header)
            .ok_or_else(|| endpoint::Refused::Missing(per_event.header.to_string()))
            .and_then(|v| endpoint::check(v.as_bytes(), &per_event.schemes))
            .map_err(refused)?;
        // An address is judged here; a name, after DNS when courier connects.
        if let (Some(guard), Some(ip)) = (dest.guard.as_deref(), named.ip)
            && !guard.allows(ip)
        {
            return Err(refused(endpoint::Refused::Address(ip)));
        }
        if let Some((origin, d)) = endpoints.and_then(|e| e.disabled_at(&named.url)) {
            let msg = format!(
                "endpoint {origin} is disabled (by {}, since {}): enable it with `courier endpoints enable`; nothing was stored",
                d.by,
                crate::clock::rfc3339(d.since_ms)
            );
            return Err(refuse(
                &dest.name,
                StatusCode::CONFLICT,
                "endpoint_disabled",
                msg,
            ));
        }
        let secrets = headers
            .get(&per_event.secret_header)
            .map(|v| endpoint::check_secrets(v.as_bytes()))
            .transpose()
            .map_err(refused)?;
        self.headers.retain(|(n, _)| {
            n != per_event.header.as_str() && n != per_event.secret_header.as_str()
        });
        self.headers
            .push((endpoint::URL_HEADER.to_string(), named.url.into_bytes()));
        if let Some(secrets) = secrets {
            self.headers
                .push((endpoint::SECRET_HEADER.to_string(), secrets.into_bytes()));
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    async fn reason(refused: Refused) -> serde_json::Value {
        use http_body_util::BodyExt;
        let bytes = refused
            .into_body()
            .collect()
            .await
            .expect("a full body")
            .to_bytes();
        serde_json::from_slice::<serde_json::Value>(&bytes).expect("JSON")["reason"].clone()
    }

    #[tokio::test]
    async fn the_target_step_refuses_dot_segments_and_other_methods_and_passes_the_rest() {
        for rest in ["", "/a/b", "/a?b=../c", "/..a", "/a.b"] {
            assert!(
                check_target("d", rest, &http::Method::POST).is_ok(),
                "{rest}"
            );
        }
        for rest in ["/..", "/a/../b", "/./a", "/%2e%2E/x"] {
            let refused = check_target("d", rest, &http::Method::POST).expect_err(rest);
            assert_eq!(refused.status(), StatusCode::BAD_REQUEST, "{rest}");
            assert_eq!(reason(refused).await, "dot_segment", "{rest}");
        }
        for method in [http::Method::PUT, http::Method::PATCH] {
            assert!(check_target("d", "/a", &method).is_ok(), "{method}");
        }
        for method in [
            http::Method::GET,
            http::Method::DELETE,
            http::Method::OPTIONS,
        ] {
            let refused = check_target("d", "/a", &method).expect_err(method.as_str());
            assert_eq!(refused.status(), StatusCode::METHOD_NOT_ALLOWED);
            assert_eq!(refused.headers()[http::header::ALLOW], "POST, PUT, PATCH");
            assert_eq!(reason(refused).await, "method");
        }
    }

    #[tokio::test]
    async fn the_length_step_refuses_only_a_declared_length_over_the_limit() {
        let headers = |n: &str| crate::test_headers(&[("content-length", n)]);
        assert_eq!(
            declared_length("d", &http::HeaderMap::new(), 10).ok(),
            Some(None)
        );
        assert_eq!(
            declared_length("d", &headers("10"), 10).ok(),
            Some(Some(10))
        );
        // Not a number: hyper refuses such a request before it gets here;
        // the body's read enforces the limit either way.
        assert_eq!(declared_length("d", &headers("ten"), 10).ok(), Some(None));
        let refused = declared_length("d", &headers("11"), 10).expect_err("over");
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(reason(refused).await, "too_large");
    }
}
