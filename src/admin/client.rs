//! `courier dead-letters` (SPEC §1): the admin API's dead-letters calls
//! from the command line, as a readable table or, with `--json`, the API's
//! own answers. Plain HTTP: the admin listener is the pod's, on loopback.

use super::api::DeadLetterItem;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
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
        if status.is_success() {
            return Ok(value);
        }
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
        Err(if status.is_client_error() {
            CliError::Arguments(message)
        } else {
            CliError::Runtime(message)
        })
    }
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
        serde_json::from_value(answer).map_err(|e| {
            CliError::Runtime(format!(
                "the admin API's answer to {path} is not what this courier expects ({e}): is it the same version?"
            ))
        })
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

/// Follows `next` until `limit` records are listed or none are left.
pub async fn list(
    client: &AdminClient,
    filters: &[(&str, Option<String>)],
    limit: usize,
) -> Result<Vec<DeadLetterItem>, CliError> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    // Bounded: every page but the last adds at least one record.
    for _ in 0..=limit {
        let want = (limit - out.len()).min(1000);
        let mut pairs = filters.to_vec();
        pairs.push(("limit", Some(want.to_string())));
        pairs.push(("after", after.clone()));
        let page: super::api::DeadLetterPage = client
            .call_as(
                Method::GET,
                &format!("/v1/dead-letters{}", query(&pairs)),
                None,
            )
            .await?;
        out.extend(page.dead_letters);
        after = page.next;
        if after.is_none() || out.len() >= limit {
            break;
        }
    }
    out.truncate(limit);
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
    crate::table::render(&head, rows, &[])
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
