//! `courier dead-letters` and `courier events` (docs/cli.md, docs/history.md): the admin
//! API's calls from the command line, as a readable table or timeline or,
//! with `--json`, the API's own answers. Plain HTTP: the admin listener is
//! the pod's, on loopback.

use super::api::{DeadLetterItem, EndpointItem, EventAnswer, EventItem};
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::time::Duration;

/// How long one call may take: a replay of `all` works while it answers.
const CALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Why a command failed, and its exit code: 1 for what the caller can fix
/// in the arguments (a 4xx), 2 at run time.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Arguments(String),
    #[error("{0}")]
    Runtime(String),
}

impl CliError {
    pub fn code(&self) -> u8 {
        match self {
            CliError::Arguments(_) => 1,
            CliError::Runtime(_) => 2,
        }
    }
}

pub struct AdminClient {
    base: String,
    token: Option<String>,
    /// Where the token came from, for a 401's hint.
    token_env: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl AdminClient {
    /// `base`: the admin listener's URL; the bearer token, if any, is in
    /// the variable `token_env`.
    pub fn new(base: &str, token_env: &str) -> Result<AdminClient, CliError> {
        let base = base.trim_end_matches('/').to_string();
        if !base.starts_with("http://") || base.parse::<http::Uri>().is_err() {
            return Err(CliError::Arguments(format!(
                "--admin is `{base}`: expected the admin listener as http://HOST:PORT (admin_listen, default http://127.0.0.1:9090)"
            )));
        }
        Ok(AdminClient {
            base,
            token: std::env::var(token_env)
                .ok()
                .filter(|t| !t.trim().is_empty()),
            token_env: token_env.to_string(),
            client: Client::builder(TokioExecutor::new()).build_http(),
        })
    }

    /// One call; the answer's JSON on 2xx, else its `error` as a `CliError`.
    pub async fn call(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Value>,
    ) -> Result<Value, CliError> {
        let (status, value) = self.send(method, path_and_query, body).await?;
        if status.is_success() {
            return Ok(value);
        }
        Err(self.refusal(status, &value))
    }

    /// A read whose 404 is an answer, not a failure: `None` when the API
    /// has no such thing (or, on an older courier, no such endpoint).
    pub async fn find_as<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>, CliError> {
        let (status, value) = self.send(Method::GET, path, None).await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(self.refusal(status, &value));
        }
        read_as(path, value).map(Some)
    }

    /// Sends one request: the answer's status and JSON (a body that is not
    /// JSON becomes `{"error": text}`); `Err` only when no answer came.
    async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, Value), CliError> {
        let url = format!("{}{path_and_query}", self.base);
        let post = method == Method::POST;
        let mut req = Request::builder().method(method).uri(&url);
        if let Some(t) = &self.token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {}", t.trim()));
        }
        let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        // Admin mutations take JSON only, bodiless ones too (a browser's
        // form cannot send it); a bodiless DELETE needs no content type.
        if !bytes.is_empty() || post {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(bytes))
            .map_err(|e| CliError::Arguments(format!("cannot build a request for {url}: {e}")))?;
        let unreachable = |e: String| {
            CliError::Runtime(format!(
                "cannot reach the admin API at {}: {e}. Is courier running, and is --admin its admin_listen?",
                self.base
            ))
        };
        let resp = tokio::time::timeout(CALL_TIMEOUT, self.client.request(req))
            .await
            .map_err(|_| {
                CliError::Runtime(format!(
                    "no answer from {url} within {}s; a replay or purge goes on in courier even so: list the dead letters to see where it stands",
                    CALL_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| unreachable(e.to_string()))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(e.to_string()))?
            .to_bytes();
        let value: Value = serde_json::from_slice(&body).unwrap_or_else(
            |_| json!({ "error": String::from_utf8_lossy(&body).trim().to_string() }),
        );
        Ok((status, value))
    }

    /// A refused call as one sentence: exit 1 for a 4xx (the arguments can
    /// fix it), 2 for the rest.
    fn refusal(&self, status: StatusCode, value: &Value) -> CliError {
        let error = value["error"]
            .as_str()
            .unwrap_or("no reason given")
            .to_string();
        let message = match status {
            StatusCode::UNAUTHORIZED => format!(
                "the admin API refused the call (401): {error}. Set the token in {}, or name its variable with --token-env",
                self.token_env
            ),
            s => format!("the admin API answered {}: {error}", s.as_u16()),
        };
        if status.is_client_error() {
            CliError::Arguments(message)
        } else {
            CliError::Runtime(message)
        }
    }
}

/// An answer read as `T`; a mismatch most likely means another version.
fn read_as<T: DeserializeOwned>(path: &str, answer: Value) -> Result<T, CliError> {
    serde_json::from_value(answer).map_err(|e| {
        CliError::Runtime(format!(
            "the admin API's answer to {path} is not what this courier expects ({e}): is it the same version?"
        ))
    })
}

impl AdminClient {
    /// `call`, its answer read as `T`.
    pub async fn call_as<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<T, CliError> {
        let answer = self.call(method, path, body).await?;
        read_as(path, answer)
    }
}

/// A query string from the pairs that are set.
pub fn query(pairs: &[(&str, Option<String>)]) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        if let Some(v) = v {
            q.append_pair(k, v);
        }
    }
    let q = q.finish();
    if q.is_empty() { q } else { format!("?{q}") }
}

/// What a path segment keeps as it is: RFC 3986's unreserved characters.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// A path segment, percent-encoded (an id may hold `/` or `?`).
pub fn segment(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, SEGMENT).to_string()
}

/// One page of up to `limit` records from the cursor `after`, as the API
/// gives it: the API's pages hold at most 1000, so a larger `limit`
/// follows `next` until it is listed or none are left. The page's `next`
/// is the cursor after its last record (what `--after` takes) and
/// `unreadable_lines` counts over every API page read.
pub async fn list(
    client: &AdminClient,
    filters: &[(&str, Option<String>)],
    limit: usize,
    after: Option<String>,
) -> Result<super::api::DeadLetterPage, CliError> {
    let mut out = super::api::DeadLetterPage {
        dead_letters: Vec::new(),
        next: after,
        unreadable_lines: 0,
    };
    // Bounded: every page but the last adds at least one record.
    for _ in 0..=limit {
        let want = (limit - out.dead_letters.len()).min(1000);
        let mut pairs = filters.to_vec();
        pairs.push(("limit", Some(want.to_string())));
        pairs.push(("after", out.next.take()));
        let page: super::api::DeadLetterPage = client
            .call_as(
                Method::GET,
                &format!("/v1/dead-letters{}", query(&pairs)),
                None,
            )
            .await?;
        out.dead_letters.extend(page.dead_letters);
        out.unreadable_lines += page.unreadable_lines;
        out.next = page.next;
        if out.next.is_none() || out.dead_letters.len() >= limit {
            break;
        }
    }
    Ok(out)
}

/// The records as a table: the columns an operator scans first.
pub fn table(items: &[DeadLetterItem]) -> String {
    let text = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let head = [
        "ID",
        "DESTINATION",
        "REASON",
        "LAST OUTCOME",
        "ATTEMPTS",
        "DEAD-LETTERED AT",
        "REPLAYED",
    ];
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|i| {
            let s = &i.summary;
            let outcome = match (text(&s.last_outcome), s.last_status) {
                (o, Some(n)) => format!("{o} ({n})"),
                (o, None) => o,
            };
            vec![
                s.id.clone(),
                i.destination.clone(),
                text(&s.reason),
                outcome,
                s.attempts.map_or_else(|| "-".into(), |n| n.to_string()),
                text(&s.dead_lettered_at),
                if i.replayed { "yes" } else { "no" }.to_string(),
            ]
        })
        .collect();
    crate::admin::table::render(&head, rows, &[])
}

/// Events of a history page as a table, newest first as the API gives them.
pub fn events_table(items: &[EventItem]) -> String {
    let head = [
        "ID",
        "DESTINATION",
        "STATE",
        "ATTEMPTS",
        "LAST OUTCOME",
        "ACCEPTED AT",
        "FINISHED AT",
    ];
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|i| {
            let outcome = outcome_cell(i.last_outcome.as_deref(), i.last_status);
            vec![
                i.id.clone(),
                i.destination.clone(),
                i.state.clone(),
                i.attempts.to_string(),
                outcome,
                i.accepted_at.clone(),
                i.finished_at.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    crate::admin::table::render(&head, rows, &[3])
}

/// `Failed (500)`, `TimedOut`, or `-` when there was no attempt.
fn outcome_cell(outcome: Option<&str>, status: Option<u16>) -> String {
    match (outcome, status) {
        (Some(o), Some(n)) => format!("{o} ({n})"),
        (Some(o), None) => o.to_string(),
        (None, _) => "-".into(),
    }
}

/// Endpoints of a destination as a table, in origin order.
pub fn endpoints_table(items: &[EndpointItem]) -> String {
    let head = [
        "ENDPOINT",
        "STATE",
        "PENDING",
        "IN FLIGHT",
        "OLDEST (S)",
        "FAILING SINCE",
        "LAST OUTCOME",
    ];
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|i| {
            let outcome = outcome_cell(i.last_outcome.as_deref(), i.last_status);
            let state = match &i.disabled_by {
                Some(by) => format!("{} ({by})", i.state),
                None => i.state.clone(),
            };
            vec![
                i.origin.clone(),
                state,
                i.pending.to_string(),
                i.in_flight.to_string(),
                i.oldest_pending_age_s
                    .map_or_else(|| "-".into(), |s| format!("{s:.0}")),
                i.failing_since.clone().unwrap_or_else(|| "-".into()),
                outcome,
            ]
        })
        .collect();
    crate::admin::table::render(&head, rows, &[2, 3, 4])
}

/// "Where is my webhook?" read top to bottom: per destination, its state,
/// then a line per step in time order (accepted, each attempt, how it
/// ended or what it waits for). Lines without a time of their own leave
/// the time column blank, so that the steps stay in one column.
pub fn timeline(answer: &EventAnswer) -> String {
    let mut o = String::new();
    for (i, d) in answer.deliveries.iter().enumerate() {
        if i > 0 {
            o.push('\n');
        }
        let _ = writeln!(o, "{}  {}", d.destination, d.state);
        let blank = " ".repeat(d.accepted_at.len());
        let mut line = |at: Option<&str>, what: &str| {
            let _ = writeln!(o, "  {}  {what}", at.unwrap_or(&blank));
        };
        line(Some(&d.accepted_at), "accepted");
        if let Some(n) = d.attempts_before.filter(|n| *n > 0) {
            let s = if n == 1 { "" } else { "s" };
            line(
                None,
                &format!("{n} earlier attempt{s} by the courier that handed it off"),
            );
        }
        for a in &d.attempts {
            let answer = match a.status {
                Some(s) => format!("{s} {}", a.outcome),
                None => a.outcome.clone(),
            };
            let late = if a.late { "  (late)" } else { "" };
            line(
                Some(&a.at),
                &format!(
                    "attempt {}  {answer}  {} ms{late}",
                    a.attempt, a.duration_ms
                ),
            );
        }
        let finished = d.finished_at.as_deref();
        let why = |what: &str| match &d.reason {
            Some(r) => format!("{what}: {r}"),
            None => what.to_string(),
        };
        match d.state.as_str() {
            "delivered" => line(finished, "delivered"),
            "dead_lettered" => line(finished, &why("dead-lettered")),
            "dropped" => line(finished, &why("dropped")),
            "handed_off" => line(finished, "handed off to another courier"),
            "pending" => {
                let held = d
                    .held_by
                    .as_ref()
                    .map_or(String::new(), |h| format!(" (held by {h})"));
                match &d.next_attempt_at {
                    Some(at) => line(None, &format!("next attempt at {at}{held}")),
                    None => line(None, &format!("waiting for its next attempt{held}")),
                }
            }
            "in_flight" => {
                let next = d
                    .attempts
                    .last()
                    .map_or_else(|| d.attempts_before.unwrap_or(0) + 1, |a| a.attempt + 1);
                line(None, &format!("attempt {next} in progress"));
            }
            other => line(finished, &why(other)),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lines_up_and_shows_missing_values_as_dashes() {
        let items: Vec<DeadLetterItem> = [
            json!({"id": "evt-1", "destination": "orders", "reason": "NonRetriableStatus", "last_outcome": "BadRequest", "last_status": 400, "attempts": 1, "accepted_at": null, "dead_lettered_at": "2026-11-23T09:00:00.000000Z", "replayed": false}),
            json!({"id": "a-much-longer-id", "destination": "o", "reason": "TimeToLiveExceeded", "last_outcome": null, "last_status": null, "attempts": 0, "accepted_at": null, "dead_lettered_at": null, "replayed": true}),
        ]
        .into_iter()
        .map(|v| serde_json::from_value(v).expect("an item"))
        .collect();
        let t = table(&items);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[0].starts_with("ID                DESTINATION  REASON"),
            "{t}"
        );
        assert!(lines[1].contains("BadRequest (400)"), "{t}");
        assert!(lines[1].ends_with("no"), "{t}");
        assert!(lines[2].contains("TimeToLiveExceeded  -  "), "{t}");
        assert!(lines[2].ends_with("yes"), "{t}");
        // Columns start at the same place on every line.
        let col = lines[0].find("REASON").expect("header");
        assert_eq!(&lines[1][col..col + 18], "NonRetriableStatus");
    }

    fn answer(v: Value) -> EventAnswer {
        serde_json::from_value(v).expect("an event answer")
    }

    #[test]
    fn a_timeline_shows_each_attempt_and_how_the_delivery_ended_or_waits() {
        let delivered = answer(json!({"id": "evt-1", "deliveries": [
            {"destination": "orders", "state": "delivered",
             "accepted_at": "2026-11-27T10:00:00.000Z",
             "attempts": [
                {"attempt": 1, "at": "2026-11-27T10:00:00.120Z", "duration_ms": 23, "status": 500, "outcome": "Failed", "late": false},
                {"attempt": 2, "at": "2026-11-27T10:00:10.200Z", "duration_ms": 18, "status": 200, "outcome": "Delivered", "late": false}],
             "finished_at": "2026-11-27T10:00:10.218Z"},
            {"destination": "audit", "state": "pending",
             "accepted_at": "2026-11-27T10:00:00.000Z",
             "attempts": [
                {"attempt": 1, "at": "2026-11-27T10:00:00.130Z", "duration_ms": 30000, "outcome": "TimedOut", "late": true}],
             "next_attempt_at": "2026-11-27T10:01:00.130Z", "held_by": "schedule"}]}));
        let want = "\
orders  delivered
  2026-11-27T10:00:00.000Z  accepted
  2026-11-27T10:00:00.120Z  attempt 1  500 Failed  23 ms
  2026-11-27T10:00:10.200Z  attempt 2  200 Delivered  18 ms
  2026-11-27T10:00:10.218Z  delivered

audit  pending
  2026-11-27T10:00:00.000Z  accepted
  2026-11-27T10:00:00.130Z  attempt 1  TimedOut  30000 ms  (late)
                            next attempt at 2026-11-27T10:01:00.130Z (held by schedule)
";
        assert_eq!(timeline(&delivered), want);
    }

    #[test]
    fn a_timeline_ends_in_the_reason_and_counts_a_previous_courier_s_attempts() {
        let dead = answer(json!({"id": "evt-2", "deliveries": [
            {"destination": "orders", "state": "dead_lettered",
             "accepted_at": "2026-11-27T10:00:00.000Z",
             "attempts": [
                {"attempt": 4, "at": "2026-11-27T10:05:00.000Z", "duration_ms": 7, "status": 400, "outcome": "BadRequest", "late": false}],
             "attempts_before": 3,
             "finished_at": "2026-11-27T10:05:00.007Z", "reason": "NonRetriableStatus"},
            {"destination": "audit", "state": "in_flight",
             "accepted_at": "2026-11-27T10:00:00.000Z", "attempts": [], "attempts_before": 1}]}));
        let t = timeline(&dead);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[2],
            "                            3 earlier attempts by the courier that handed it off",
            "{t}"
        );
        assert_eq!(
            lines[3], "  2026-11-27T10:05:00.000Z  attempt 4  400 BadRequest  7 ms",
            "{t}"
        );
        assert_eq!(
            lines[4], "  2026-11-27T10:05:00.007Z  dead-lettered: NonRetriableStatus",
            "{t}"
        );
        assert_eq!(
            lines[8],
            "                            1 earlier attempt by the courier that handed it off",
            "{t}"
        );
        assert_eq!(
            lines[9], "                            attempt 2 in progress",
            "{t}"
        );
    }

    #[test]
    fn the_events_table_shows_the_last_answer_and_dashes_for_what_is_missing() {
        let items: Vec<EventItem> = [
            json!({"id": "evt-1", "destination": "orders", "state": "delivered", "attempts": 2, "last_status": 200, "last_outcome": "Delivered", "accepted_at": "2026-11-27T10:00:00.000Z", "finished_at": "2026-11-27T10:00:10.218Z"}),
            json!({"id": "evt-22", "destination": "orders", "state": "pending", "attempts": 0, "last_status": null, "last_outcome": null, "accepted_at": "2026-11-27T10:00:01.000Z", "finished_at": null}),
        ]
        .into_iter()
        .map(|v| serde_json::from_value(v).expect("an item"))
        .collect();
        let t = events_table(&items);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[0].starts_with("ID      DESTINATION  STATE"), "{t}");
        assert!(lines[1].contains("  Delivered (200)  "), "{t}");
        assert!(lines[1].ends_with("2026-11-27T10:00:10.218Z"), "{t}");
        assert!(lines[2].contains("  pending  "), "{t}");
        assert!(lines[2].ends_with("2026-11-27T10:00:01.000Z  -"), "{t}");
    }

    #[test]
    fn queries_and_segments_are_encoded() {
        assert_eq!(
            query(&[("destination", Some("a b".into())), ("since", None)]),
            "?destination=a+b"
        );
        assert_eq!(query(&[("since", None)]), "");
        assert_eq!(segment("a/b?c"), "a%2Fb%3Fc");
        assert_eq!(segment("order-events_v1.x~"), "order-events_v1.x~");
    }
}
