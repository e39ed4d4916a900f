//! HTTP client helpers (pooled hyper-util legacy client) and a Prometheus
//! text-format reader.

use std::cell::RefCell;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::sync::oneshot;

/// Every request made through these helpers gives up after this long.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// An HTTP answer, body fully read.
#[derive(Clone, Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        json(self)
    }
}

/// The body of `resp` parsed as JSON; panics with status and body if it is not.
pub fn json(resp: &Resp) -> serde_json::Value {
    serde_json::from_slice(&resp.body).unwrap_or_else(|e| {
        panic!(
            "response body is not JSON ({e}); status {}, body: {}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        )
    })
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

struct Pooled {
    /// Closed once the runtime that owns the pool's connection tasks is gone.
    runtime_alive: oneshot::Sender<()>,
    client: HttpClient,
}

thread_local! {
    static CLIENT: RefCell<Option<Pooled>> = const { RefCell::new(None) };
}

/// The pooled client for the current tokio runtime. A thread belongs to one
/// runtime at a time; each `#[tokio::test]` has its own runtime, so the client
/// is rebuilt when the runtime it was made on has been dropped (its pooled
/// connections died with it).
fn client() -> HttpClient {
    CLIENT.with(|cell| {
        let mut cell = cell.borrow_mut();
        if let Some(pooled) = cell.as_ref()
            && !pooled.runtime_alive.is_closed()
        {
            return pooled.client.clone();
        }
        let (runtime_alive, sentinel) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = sentinel.await;
        });
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(10)));
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            // Below courier's 10 s idle close (`server::edge::HEADER_TIMEOUT`):
            // a connection kept longer races the server's close, and a request
            // written as it closes fails with `IncompleteMessage`.
            .pool_idle_timeout(Duration::from_secs(5))
            .build(connector);
        *cell = Some(Pooled {
            runtime_alive,
            client: client.clone(),
        });
        client
    })
}

/// Sends one request; `Err` describes a transport failure (connection
/// refused, reset, timeout after [`REQUEST_TIMEOUT`]).
pub async fn try_request(
    method: Method,
    url: &str,
    body: impl Into<Bytes>,
    headers: &[(&str, &str)],
) -> Result<Resp, String> {
    let mut req = Request::builder()
        .method(method.clone())
        .uri(url)
        .body(Full::new(body.into()))
        .map_err(|e| format!("bad request {method} {url}: {e}"))?;
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| format!("bad header name {name:?}: {e}"))?;
        let value =
            HeaderValue::from_str(value).map_err(|e| format!("bad header value {value:?}: {e}"))?;
        req.headers_mut().append(name, value);
    }
    let fut = async {
        let resp = client()
            .request(req)
            .await
            .map_err(|e| format!("{method} {url}: {e} ({e:?})"))?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("{method} {url}: reading body: {e}"))?
            .to_bytes();
        Ok(Resp {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "{method} {url}: no answer within {REQUEST_TIMEOUT:?}"
        )),
    }
}

/// Sends one request; panics on a transport failure.
pub async fn request(
    method: Method,
    url: &str,
    body: impl Into<Bytes>,
    headers: &[(&str, &str)],
) -> Resp {
    try_request(method, url, body, headers)
        .await
        .unwrap_or_else(|e| panic!("request failed: {e}"))
}

pub async fn post(url: &str, body: impl Into<Bytes>, headers: &[(&str, &str)]) -> Resp {
    request(Method::POST, url, body, headers).await
}

pub async fn try_post(
    url: &str,
    body: impl Into<Bytes>,
    headers: &[(&str, &str)],
) -> Result<Resp, String> {
    try_request(Method::POST, url, body, headers).await
}

/// An admin call that changes something, as courier requires of them:
/// `Content-Type: application/json` (a browser's form cannot send it).
pub async fn admin_post(url: &str, body: impl Into<Bytes>, headers: &[(&str, &str)]) -> Resp {
    try_admin_post(url, body, headers)
        .await
        .unwrap_or_else(|e| panic!("request failed: {e}"))
}

pub async fn try_admin_post(
    url: &str,
    body: impl Into<Bytes>,
    headers: &[(&str, &str)],
) -> Result<Resp, String> {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    try_request(Method::POST, url, body, &all).await
}

pub async fn get(url: &str) -> Resp {
    request(Method::GET, url, Bytes::new(), &[]).await
}

pub async fn try_get(url: &str) -> Result<Resp, String> {
    try_request(Method::GET, url, Bytes::new(), &[]).await
}

pub async fn delete(url: &str, headers: &[(&str, &str)]) -> Resp {
    request(Method::DELETE, url, Bytes::new(), headers).await
}

/// `GET {admin_url}/metrics` as text; panics unless it answers 200.
pub async fn metrics_text(admin_url: &str) -> String {
    let url = format!("{}/metrics", admin_url.trim_end_matches('/'));
    let resp = get(&url).await;
    assert_eq!(resp.status, 200, "GET {url}: {}", resp.text());
    resp.text()
}

/// Destination `name`'s entry in `GET /v1/destinations`, with the whole
/// answer (for a failing check's message).
pub async fn destination_view(
    admin_url: &str,
    name: &str,
) -> (Option<serde_json::Value>, serde_json::Value) {
    let body = get(&format!("{admin_url}/v1/destinations")).await.json();
    let entry = body["destinations"]
        .as_array()
        .and_then(|list| list.iter().find(|d| d["name"] == name))
        .cloned();
    (entry, body)
}

/// The value of one exact series, e.g.
/// `courier_events_delivered_total{destination="orders"}`; label order does
/// not matter, but the label sets must be equal. `None` if absent.
pub async fn metric(admin_url: &str, series: &str) -> Option<f64> {
    find_metric(&metrics_text(admin_url).await, series)
}

/// Sum of every series named like `selector` whose labels include all of the
/// selector's labels, e.g. `courier_delivery_attempts_total{destination="a"}`
/// sums over every `outcome`. 0 if none matches.
pub async fn metric_sum(admin_url: &str, selector: &str) -> f64 {
    sum_metric(&metrics_text(admin_url).await, selector)
}

/// A series: metric name and sorted labels.
type Series = (String, Vec<(String, String)>);

/// Parses `name{a="x",b="y"}` (labels optional).
fn parse_series(s: &str) -> Option<Series> {
    let s = s.trim();
    let Some(open) = s.find('{') else {
        return (!s.is_empty()).then(|| (s.to_owned(), Vec::new()));
    };
    let name = s[..open].trim().to_owned();
    let (labels, rest) = parse_labels(&s[open + 1..])?;
    (rest.trim().is_empty() && !name.is_empty()).then_some((name, labels))
}

/// Parses `a="x",b="y"}` and returns the sorted labels and what follows `}`.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    // Each turn consumes one label (or the closing brace), so it is bounded by
    // the input length.
    for _ in 0..=s.len() {
        s = s.trim_start_matches([' ', ',']);
        if let Some(rest) = s.strip_prefix('}') {
            labels.sort();
            return Some((labels, rest));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_owned();
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        };
        s = &s[end + 1..];
        labels.push((key, value));
    }
    None
}

/// Splits one exposition line into its series and value.
fn parse_line(line: &str) -> Option<(Series, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, labels, rest) = match line.find(['{', ' ']) {
        Some(i) if line.as_bytes()[i] == b'{' => {
            let (labels, rest) = parse_labels(&line[i + 1..])?;
            (&line[..i], labels, rest)
        }
        Some(i) => (&line[..i], Vec::new(), &line[i..]),
        None => return None,
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(((name.trim().to_owned(), labels), value))
}

/// The value of the exact `series` in Prometheus text `text`.
pub fn find_metric(text: &str, series: &str) -> Option<f64> {
    let want = parse_series(series).unwrap_or_else(|| panic!("bad series selector {series:?}"));
    text.lines()
        .filter_map(parse_line)
        .find(|(s, _)| *s == want)
        .map(|(_, v)| v)
}

/// Sum of the series in `text` named like `selector` whose labels include
/// the selector's labels.
pub fn sum_metric(text: &str, selector: &str) -> f64 {
    let (name, want) =
        parse_series(selector).unwrap_or_else(|| panic!("bad series selector {selector:?}"));
    text.lines()
        .filter_map(parse_line)
        .filter(|((n, labels), _)| *n == name && want.iter().all(|l| labels.contains(l)))
        .map(|(_, v)| v)
        .sum()
}
