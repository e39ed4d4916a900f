//! One request in, one answer out: route, check limits, build the event,
//! wait for the journal's commit.

use super::{forward, reply};
use crate::config::Settings;
use crate::journal::{Journal, NewEvent};
use crate::lifecycle::Lifecycle;
use crate::server::Body;
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
        let id = match forward::event_id(req.headers()) {
            Ok(id) => id,
            Err(header) => {
                let msg = format!(
                    "header {header} must be 1 to {} visible characters",
                    forward::MAX_ID
                );
                return reply::reject(name, StatusCode::BAD_REQUEST, "bad_id", msg, None);
            }
        };
        let headers = forward::forwarded(req.headers());
        let method = req.method().as_str().to_string();
        let path_and_query = match req.uri().query() {
            Some(q) => format!("{rest}?{q}"),
            None => rest.to_string(),
        };
        let body = match Limited::new(req.into_body(), limit as usize)
            .collect()
            .await
        {
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
        let event = NewEvent {
            id: id.clone(),
            destination: dest.name.clone(),
            method,
            path: path_and_query,
            headers,
            body,
            accepted_ms: crate::clock::now_ms(),
        };
        match self.journal.append(vec![event]).await {
            Ok(a) => {
                let dup = if a.duplicates.is_empty() {
                    vec![]
                } else {
                    vec![id.clone()]
                };
                reply::accepted(&[id], &dup)
            }
            Err(e) => reply::journal_error(name, &e),
        }
    }
}
