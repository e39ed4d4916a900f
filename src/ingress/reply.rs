//! Every answer ingress gives, as JSON (SPEC §3). A refusal carries a
//! `Rejection`, for `rejection::record` to count and log.

use super::rejection::Rejection;
use super::schema::SchemaError;
use crate::journal::JournalError;
use crate::server::{Body, json};
use http::{HeaderValue, Response, StatusCode};
use serde_json::json;
use std::time::Duration;

/// `ids` are every event acknowledged; `duplicates` those among them that
/// were already stored within `ingress.dedupe_window` (listed only if any).
pub fn accepted(ids: &[String], duplicates: &[String]) -> Response<Body> {
    let mut body = json!({ "accepted": ids.len(), "ids": ids });
    if !duplicates.is_empty() {
        body["duplicates"] = json!(duplicates);
    }
    json(StatusCode::ACCEPTED, &body)
}

/// A topic's answer (README "Topics"): `accepted` counts the copies
/// journaled (one per event and matching subscriber), `ids` lists every event
/// of the request once, `unmatched` counts the events no subscriber took
/// (acknowledged, not stored). Copies already stored within
/// `ingress.dedupe_window` are listed as `duplicates`, each with its
/// subscriber, since the same id is fresh for one subscriber and a repeat
/// for another.
pub fn fanned_out(
    copies: usize,
    ids: &[&str],
    unmatched: usize,
    duplicates: &[(&str, &str)],
) -> Response<Body> {
    let mut body = json!({ "accepted": copies, "ids": ids, "unmatched": unmatched });
    if !duplicates.is_empty() {
        body["duplicates"] = duplicates
            .iter()
            .map(|(id, destination)| json!({ "id": id, "destination": destination }))
            .collect();
    }
    json(StatusCode::ACCEPTED, &body)
}

/// A refusal, by `reason`, with `Retry-After` when waiting helps.
pub fn reject(
    destination: &str,
    status: StatusCode,
    reason: &'static str,
    message: String,
    retry_after: Option<u32>,
) -> Response<Body> {
    let mut resp = json(status, &json!({ "error": message, "reason": reason }));
    resp.extensions_mut()
        .insert(Rejection::new(destination, reason));
    if let Some(secs) = retry_after {
        resp.headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// A body still incomplete at the deadline (`server::BODY_DEADLINE`):
/// nothing is stored, and the connection is closed, as the rest of the body
/// would otherwise be read as the next request.
pub fn body_timeout(destination: &str, deadline: Duration) -> Response<Body> {
    let message = format!(
        "the request body did not arrive within {} s: nothing was stored",
        deadline.as_secs()
    );
    let mut resp = reject(
        destination,
        StatusCode::REQUEST_TIMEOUT,
        "body_timeout",
        message,
        None,
    );
    resp.headers_mut()
        .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// A request whose events the schema refuses: 400 or 415, naming the event
/// `index` and `field` when the error is about one.
pub fn schema_error(destination: &str, e: &SchemaError) -> Response<Body> {
    let reason = e.reason();
    let mut body = json!({ "error": e.to_string(), "reason": reason });
    if let Some(index) = e.index() {
        body["index"] = json!(index);
    }
    if let Some(field) = e.field() {
        body["field"] = json!(field);
    }
    let mut resp = json(e.status(), &body);
    resp.extensions_mut()
        .insert(Rejection::new(destination, reason));
    resp
}

pub fn journal_error(destination: &str, e: &JournalError) -> Response<Body> {
    let (status, reason, retry) = match e {
        JournalError::Full { .. } => (StatusCode::SERVICE_UNAVAILABLE, "journal_full", Some(5)),
        JournalError::Busy => (StatusCode::SERVICE_UNAVAILABLE, "journal_busy", Some(1)),
        JournalError::Strained(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "journal_unavailable",
            Some(1),
        ),
        JournalError::Closed => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down", Some(5)),
        JournalError::Failed(_) => (StatusCode::SERVICE_UNAVAILABLE, "journal_failed", Some(30)),
        JournalError::DiskFull => (StatusCode::INSUFFICIENT_STORAGE, "disk_full", Some(30)),
    };
    reject(
        destination,
        status,
        reason,
        format!("not accepted: {e}"),
        retry,
    )
}

pub fn unknown_destination(
    name: &str,
    destinations: &[String],
    topics: &[String],
) -> Response<Body> {
    let reason = "unknown_destination";
    let mut resp = json(
        StatusCode::NOT_FOUND,
        &json!({
            "error": format!("unknown destination or topic `{name}`: post to /<destination> or /<topic> with one of the configured names"),
            "reason": reason,
            "destinations": destinations,
            "topics": topics,
        }),
    );
    resp.extensions_mut()
        .insert(Rejection::unknown(name, reason));
    resp
}
