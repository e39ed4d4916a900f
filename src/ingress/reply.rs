//! Every answer ingress gives, as JSON (docs/publishing.md). A refusal carries a
//! `Rejection`, for `rejection::record` to count and log.

use super::Body;
use super::credits::Throttled;
use super::rejection::Rejection;
use super::schema::SchemaError;
use crate::config::ingress_keys::Denied;
use crate::journal::JournalError;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::Either;
use serde_json::json;
use std::time::Duration;

pub(super) fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    crate::server::json(status, value).map(Either::Left)
}

/// The status of a stored request: `202 Accepted`, except that an Event
/// Grid publish (`forward::eventgrid_publish`) gets `200 OK`, as Event Grid
/// answers it, since the Azure SDKs take any other status as an error (and
/// an app that retries on it sends everything twice).
pub fn success_status(eventgrid_publish: bool) -> StatusCode {
    if eventgrid_publish {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    }
}

/// `ids` are every event acknowledged; `duplicates` those among them that
/// were already stored within `ingress.dedupe_window` (listed only if any).
pub fn accepted(status: StatusCode, ids: &[String], duplicates: &[String]) -> Response<Body> {
    /// Serialized from the ids in place: this answers every request, and a
    /// `serde_json::Value` copied each id first.
    #[derive(serde::Serialize)]
    struct Accepted<'a> {
        accepted: usize,
        ids: &'a [String],
        #[serde(skip_serializing_if = "<[String]>::is_empty")]
        duplicates: &'a [String],
    }
    let body = Accepted {
        accepted: ids.len(),
        ids,
        duplicates,
    };
    // Room for it all at once: grown from empty, it took three allocations.
    let room = 48
        + ids
            .iter()
            .chain(duplicates)
            .map(|id| id.len() + 3)
            .sum::<usize>();
    let mut bytes = Vec::with_capacity(room);
    // Strings and a number: serializing cannot fail.
    let _ = serde_json::to_writer(&mut bytes, &body);
    crate::server::json_bytes(status, bytes.into()).map(Either::Left)
}

/// A topic's answer (docs/topics.md), with `status` as for a
/// destination (`success_status`): `accepted` counts the copies
/// journaled (one per event and matching subscriber), `ids` lists every event
/// of the request once, `unmatched` counts the events no subscriber took
/// (acknowledged, not stored). Copies already stored within
/// `ingress.dedupe_window` are listed as `duplicates`, each with its
/// subscriber, since the same id is fresh for one subscriber and a repeat
/// for another.
pub fn fanned_out(
    status: StatusCode,
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
    json(status, &body)
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

/// A request over `ingress.credits_per_second`: 429 until the route's next
/// period (`Retry-After` in whole seconds, the exact wait in
/// `retry_after_ms`), or 413 when it alone needs more than a period grants,
/// since waiting would never help.
pub fn throttled(route: &str, per_second: u64, t: &Throttled) -> Response<Body> {
    match *t {
        Throttled::Wait { ms } => {
            let reason = "throttled";
            let message = format!(
                "{route} has used the {per_second} credits it gets per second (ingress.credits_per_second): nothing was stored; wait and retry"
            );
            let mut resp = json(
                StatusCode::TOO_MANY_REQUESTS,
                &json!({ "error": message, "reason": reason, "retry_after_ms": ms }),
            );
            resp.extensions_mut().insert(Rejection::new(route, reason));
            let secs = ms.div_ceil(1000).max(1);
            resp.headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
            resp
        }
        Throttled::Never { cost } => reject(
            route,
            StatusCode::PAYLOAD_TOO_LARGE,
            "over_credits",
            format!(
                "this request needs {cost} credits (1 per event, and on a topic 1 more per subscriber), more than ingress.credits_per_second ({per_second}) grants in a second: send fewer events per request"
            ),
            None,
        ),
    }
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

/// A body that does not fit in `ingress.max_inflight_bytes` now
/// (`budget`): refused before it is read, and the connection closed, as
/// the unread body would otherwise be read as the next request.
pub fn over_budget(destination: &str, budget: u64) -> Response<Body> {
    let message = format!(
        "courier holds as many request bodies as ingress.max_inflight_bytes ({budget} bytes) allows: nothing was read or stored; retry shortly"
    );
    let mut resp = reject(
        destination,
        StatusCode::SERVICE_UNAVAILABLE,
        "memory_budget",
        message,
        Some(1),
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
        JournalError::DestinationFull {
            destination: full,
            pending,
            share,
        } => return destination_full(destination, full, *pending, *share, e),
        JournalError::EndpointFull {
            origin,
            pending,
            share,
            ..
        } => return endpoint_full(destination, origin, *pending, *share, e),
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

/// A destination past its share of the journal (`max_pending_bytes`):
/// 503 naming it (for a topic, the subscriber that is full; nothing of the
/// request was stored) and its share, so that the app can tell one sick
/// endpoint from a full journal.
fn destination_full(
    route: &str,
    full: &str,
    pending: u64,
    share: u64,
    e: &JournalError,
) -> Response<Body> {
    let reason = "destination_full";
    let mut resp = json(
        StatusCode::SERVICE_UNAVAILABLE,
        &json!({
            "error": format!("not accepted: {e}"),
            "reason": reason,
            "destination": full,
            "max_pending_bytes": share,
            "pending_bytes": pending,
        }),
    );
    resp.extensions_mut().insert(Rejection::new(route, reason));
    resp.headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from(5u32));
    resp
}

/// An endpoint of a `url: per_event` destination past its share
/// (`endpoints.max_pending_bytes`): 503 naming it, so that the app can
/// hold that customer's events while the others go on.
fn endpoint_full(
    route: &str,
    origin: &str,
    pending: u64,
    share: u64,
    e: &JournalError,
) -> Response<Body> {
    let reason = "endpoint_full";
    let mut resp = json(
        StatusCode::SERVICE_UNAVAILABLE,
        &json!({
            "error": format!("not accepted: {e}"),
            "reason": reason,
            "endpoint": origin,
            "max_pending_bytes": share,
            "pending_bytes": pending,
        }),
    );
    resp.extensions_mut().insert(Rejection::new(route, reason));
    resp.headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from(5u32));
    resp
}

/// A publisher without a valid key (`ingress.keys_from_env`). Unknown
/// names are counted as unknown, so that paths cannot create series.
pub fn unauthorized(name: &str, configured: bool, denied: &Denied) -> Response<Body> {
    let reason = "unauthorized";
    let mut resp = json(
        StatusCode::UNAUTHORIZED,
        &json!({ "error": denied.to_string(), "reason": reason }),
    );
    resp.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"courier ingress\""),
    );
    let rejection = if configured {
        Rejection::new(name, reason)
    } else {
        Rejection::unknown(name, reason)
    };
    resp.extensions_mut().insert(rejection);
    resp
}

/// A request a browser could have sent (`server::guard`): 403 before the
/// route, counted under `""` as an unknown name is, since it is refused
/// before its name is looked at.
pub fn browser_refused(name: &str, refused: crate::server::guard::Refused) -> Response<Body> {
    let mut resp = json(
        StatusCode::FORBIDDEN,
        &json!({ "error": refused.message, "reason": refused.reason }),
    );
    resp.extensions_mut()
        .insert(Rejection::unknown(name, refused.reason));
    resp
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

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(resp: Response<Body>) -> serde_json::Value {
        use http_body_util::BodyExt;
        let bytes = resp
            .into_body()
            .collect()
            .await
            .expect("a full body")
            .to_bytes();
        serde_json::from_slice(&bytes).expect("JSON")
    }

    /// What the app hears for each way an append fails (the journal's own
    /// tests, in `journal/faults.rs`, check which error each disk fault is).
    #[tokio::test]
    async fn each_journal_error_has_its_status_reason_and_retry_after() {
        let cases = [
            (JournalError::DiskFull, 507, "disk_full"),
            (
                JournalError::Failed("fdatasync".into()),
                503,
                "journal_failed",
            ),
            (
                JournalError::Strained("EMFILE".into()),
                503,
                "journal_unavailable",
            ),
            (JournalError::Busy, 503, "journal_busy"),
            (JournalError::Closed, 503, "shutting_down"),
        ];
        for (e, status, reason) in cases {
            let resp = journal_error("orders", &e);
            assert_eq!(resp.status().as_u16(), status, "{e}");
            assert!(
                resp.headers().contains_key(http::header::RETRY_AFTER),
                "{e}"
            );
            assert_eq!(body_of(resp).await["reason"], reason, "{e}");
        }
    }

    #[tokio::test]
    async fn the_acknowledgement_lists_ids_and_duplicates_only_when_there_are_some() {
        let ids = ["a".to_string(), "b\"c".to_string()];
        let resp = accepted(StatusCode::ACCEPTED, &ids, &[]);
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        assert_eq!(
            resp.headers().get(http::header::CONTENT_TYPE),
            Some(&HeaderValue::from_static("application/json"))
        );
        assert_eq!(
            body_of(resp).await,
            json!({ "accepted": 2, "ids": ["a", "b\"c"] })
        );
        let resp = accepted(StatusCode::OK, &ids, &ids[1..]);
        assert_eq!(
            body_of(resp).await,
            json!({ "accepted": 2, "ids": ["a", "b\"c"], "duplicates": ["b\"c"] })
        );
    }
}
