//! One request in, one answer out: route, check limits, parse the body by
//! the destination's schema into events, wait for the journal's commit of
//! all of them.

use super::{forward, reply, schema};
use crate::config::{Schema, Settings};
use crate::journal::{Journal, NewEvent};
use crate::lifecycle::Lifecycle;
use crate::server::Body;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use std::sync::Arc;

pub struct Ingress {
    settings: Arc<Settings>,
    journal: Journal,
    lifecycle: Arc<Lifecycle>,
    names: Vec<String>,
}

impl Ingress {
    pub fn new(settings: Arc<Settings>, journal: Journal, lifecycle: Arc<Lifecycle>) -> Self {
        let names = settings
            .destinations
            .iter()
            .map(|d| d.name.clone())
            .collect();
        Ingress {
            settings,
            journal,
            lifecycle,
            names,
        }
    }

    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path();
        let trimmed = path.strip_prefix('/').unwrap_or(path);
        let (name, rest) = match trimmed.find('/') {
            Some(i) => (&trimmed[..i], &trimmed[i..]),
            None => (trimmed, ""),
        };
        let Some(dest) = self.settings.destination(name).cloned() else {
            return reply::unknown_destination(name, &self.names);
        };
        let name = dest.name.as_str();
        if !matches!(*req.method(), Method::POST | Method::PUT | Method::PATCH) {
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
            return reply::reject(
                name,
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "courier is shutting down: retry shortly".into(),
                Some(5),
            );
        }
        let limit = self.settings.ingress.max_body_bytes;
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
        let custom_id = match dest.schema {
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
        let mut headers = forward::forwarded(req.headers());
        headers.retain(|(n, _)| schema::forwards_header(dest.schema, n));
        let method = req.method().as_str().to_string();
        let path_and_query = match req.uri().query() {
            Some(q) => format!("{rest}?{q}"),
            None => rest.to_string(),
        };
        let (head, body) = req.into_parts();
        let body = match Limited::new(body, limit as usize).collect().await {
            Ok(b) => b.to_bytes(),
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
        if dest.schema == Schema::Custom
            && dest.batch.enabled()
            && serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_err()
        {
            let msg = "the body is not JSON: this destination batches, and a batch is a JSON array of its events";
            return reply::reject(name, StatusCode::BAD_REQUEST, "not_json", msg.into(), None);
        }
        let parts: Vec<(String, Bytes)> = match schema::parse(dest.schema, &head.headers, &body) {
            None => custom_id.into_iter().map(|id| (id, body.clone())).collect(),
            Some(Err(e)) => return reply::schema_error(name, &e),
            Some(Ok(events)) => events
                .into_iter()
                .map(|e| {
                    tracing::debug!(destination = %name, id = %e.id, event_type = %e.event_type, subject = ?e.subject, "event parsed");
                    (e.id, e.body)
                })
                .collect(),
        };
        let accepted_ms = crate::clock::now_ms();
        let ids: Vec<String> = parts.iter().map(|(id, _)| id.clone()).collect();
        let events = parts
            .into_iter()
            .map(|(id, body)| NewEvent {
                id,
                destination: dest.name.clone(),
                method: method.clone(),
                path: path_and_query.clone(),
                headers: headers.clone(),
                body,
                accepted_ms,
            })
            .collect();
        // One append: every event of the request is committed in one group,
        // or none is.
        match self.journal.append(events).await {
            Ok(a) => {
                let dup: Vec<String> = a.duplicates.iter().map(|&i| ids[i].clone()).collect();
                reply::accepted(&ids, &dup)
            }
            Err(e) => reply::journal_error(name, &e),
        }
    }
}
