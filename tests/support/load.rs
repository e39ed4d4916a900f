//! A small HTTP/1.1 load generator: each connection is one task with its own
//! keep-alive connection sending POSTs back to back, or on a schedule
//! ([`run_paced`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// Full URL, e.g. `http://127.0.0.1:8080/bench`.
    pub url: String,
    pub connections: usize,
    pub duration: Duration,
    pub body: Bytes,
    pub headers: Vec<(String, String)>,
}

#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    /// 2xx answers.
    pub ok: u64,
    pub non_2xx: u64,
    /// Transport failures (connect, reset, malformed answer).
    pub errors: u64,
    pub elapsed: Duration,
    /// Latency of every answered request (2xx or not), microseconds, sorted.
    pub latencies_us: Vec<u32>,
    /// Count of answers per status code.
    pub statuses: BTreeMap<u16, u64>,
    /// The first transport error, for diagnostics.
    pub first_error: Option<String>,
    /// The body of every 2xx answer, in no particular order; kept only by
    /// [`run_keeping_answers`].
    pub answers: Vec<Bytes>,
}

impl LoadReport {
    /// 2xx answers per second.
    pub fn rate(&self) -> f64 {
        per_second(self.ok, self.elapsed)
    }

    pub fn status_count(&self, status: u16) -> u64 {
        self.statuses.get(&status).copied().unwrap_or(0)
    }

    /// Nearest-rank percentile (`p` in 0..=100) of the latencies; zero if
    /// nothing was answered.
    pub fn percentile(&self, p: f64) -> Duration {
        let n = self.latencies_us.len();
        if n == 0 {
            return Duration::ZERO;
        }
        let rank = ((p.clamp(0.0, 100.0) / 100.0) * n as f64).ceil() as usize;
        let idx = rank.clamp(1, n) - 1;
        Duration::from_micros(u64::from(self.latencies_us[idx]))
    }
}

fn per_second(count: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 { count as f64 / secs } else { 0.0 }
}

/// Loads `spec.url` for `spec.duration`. Requests still in flight at the end
/// are abandoned and not counted.
pub async fn run(spec: LoadSpec) -> LoadReport {
    run_inner(spec, None, None, false, None).await
}

/// Sends `per_second` requests a second in all, spread evenly over the
/// connections and over time, for `spec.duration`: an app's ordinary load
/// rather than a flood. A latency is counted from when its request was due,
/// not from when it went out, so a server that makes requests queue pays
/// for the queueing (as wrk2 does; a closed loop would hide it, sending
/// less while the server is slow).
pub async fn run_paced(spec: LoadSpec, per_second: f64) -> LoadReport {
    assert!(
        per_second.is_finite() && per_second > 0.0,
        "run_paced: per_second must be > 0"
    );
    run_inner(spec, None, Some(per_second), false, None).await
}

/// As [`run`], and keeps each 2xx answer's body (courier's 202 lists the
/// ids it acknowledged): what a crash test needs to know was promised.
pub async fn run_keeping_answers(spec: LoadSpec) -> LoadReport {
    run_inner(spec, None, None, true, None).await
}

/// Sends exactly `total` requests (as fast as `spec.connections` allow),
/// with `spec.duration` as a deadline.
pub async fn run_n(spec: LoadSpec, total: u64) -> LoadReport {
    run_inner(spec, Some(total), None, false, None).await
}

/// As [`run_n`], each request with the header `name` set to
/// [`numbered`]`(prefix, n)`, n counting the requests from 0: e.g. an
/// `Idempotency-Key` per request, so that each event's id is known.
pub async fn run_n_numbered(spec: LoadSpec, total: u64, name: &str, prefix: &str) -> LoadReport {
    let name = HeaderName::from_bytes(name.as_bytes())
        .unwrap_or_else(|_| panic!("run_n_numbered: bad header name {name:?}"));
    run_inner(spec, Some(total), None, false, Some((name, prefix.into()))).await
}

/// The value of [`run_n_numbered`]'s header on request `n`: `prefix` and
/// `n` in 12 digits (a 24-character prefix makes it as long as a UUID).
pub fn numbered(prefix: &str, n: u64) -> String {
    format!("{prefix}{n:012}")
}

struct Target {
    addr: String,
    authority: String,
    path_and_query: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
    /// A header numbered per request: its name and the value's prefix.
    numbered: Option<(HeaderName, String)>,
}

async fn run_inner(
    spec: LoadSpec,
    total: Option<u64>,
    per_second: Option<f64>,
    keep: bool,
    numbered: Option<(HeaderName, String)>,
) -> LoadReport {
    assert!(spec.connections > 0, "LoadSpec.connections must be > 0");
    let uri: Uri = spec
        .url
        .parse()
        .unwrap_or_else(|e| panic!("LoadSpec.url {:?}: {e}", spec.url));
    assert_eq!(
        uri.scheme_str(),
        Some("http"),
        "load generator speaks plain http only: {}",
        spec.url
    );
    let authority = uri
        .authority()
        .unwrap_or_else(|| panic!("LoadSpec.url has no host: {}", spec.url))
        .clone();
    let port = authority.port_u16().unwrap_or(80);
    let host = authority.host();
    assert!(
        host == "127.0.0.1" || host == "localhost",
        "load generator targets loopback only, not {host}"
    );
    let mut headers = Vec::new();
    for (k, v) in &spec.headers {
        let name = HeaderName::from_bytes(k.as_bytes())
            .unwrap_or_else(|_| panic!("LoadSpec.headers: bad header name {k:?}"));
        let value = HeaderValue::from_str(v)
            .unwrap_or_else(|_| panic!("LoadSpec.headers: bad header value {v:?}"));
        headers.push((name, value));
    }
    let target = Arc::new(Target {
        addr: format!("127.0.0.1:{port}"),
        authority: authority.to_string(),
        path_and_query: uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".to_owned()),
        headers,
        body: spec.body.clone(),
        numbered,
    });

    let issued = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + spec.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..spec.connections {
        let target = target.clone();
        let issued = issued.clone();
        // Connection i sends at offset i/rate, then every connections/rate.
        let pace = per_second.map(|rate| Pace {
            next: start + Duration::from_secs_f64(i as f64 / rate),
            every: Duration::from_secs_f64(spec.connections as f64 / rate),
        });
        tasks.spawn(connection(target, deadline, total, pace, issued, keep));
    }
    let mut report = LoadReport::default();
    let mut latencies = Vec::new();
    while let Some(part) = tasks.join_next().await {
        let part = part.expect("load connection task panicked");
        report.ok += part.ok;
        report.non_2xx += part.non_2xx;
        report.errors += part.errors;
        for (status, n) in part.statuses {
            *report.statuses.entry(status).or_insert(0) += n;
        }
        if report.first_error.is_none() {
            report.first_error = part.first_error;
        }
        latencies.push(part.latencies_us);
        report.answers.extend(part.answers);
    }
    report.elapsed = start.elapsed();
    let mut all: Vec<u32> = latencies.concat();
    all.sort_unstable();
    report.latencies_us = all;
    report
}

async fn connect(target: &Target) -> Result<SendRequest<Full<Bytes>>, String> {
    let stream = TcpStream::connect(&target.addr)
        .await
        .map_err(|e| format!("connect {}: {e}", target.addr))?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake {}: {e}", target.addr))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// The request; `n` is its number (from 0) when `target.numbered` is set.
fn build_request(target: &Target, n: u64) -> Request<Full<Bytes>> {
    let mut req = Request::new(Full::new(target.body.clone()));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = target
        .path_and_query
        .parse()
        .expect("path and query came from a valid Uri");
    let headers = req.headers_mut();
    headers.insert(
        header::HOST,
        HeaderValue::from_str(&target.authority).expect("authority is a valid header value"),
    );
    for (name, value) in &target.headers {
        headers.append(name.clone(), value.clone());
    }
    if let Some((name, prefix)) = &target.numbered {
        let value = HeaderValue::from_str(&numbered(prefix, n))
            .unwrap_or_else(|_| panic!("run_n_numbered: bad header value prefix {prefix:?}"));
        headers.insert(name.clone(), value);
    }
    req
}

/// When a paced connection's next request is due, and how often.
struct Pace {
    next: Instant,
    every: Duration,
}

async fn connection(
    target: Arc<Target>,
    deadline: Instant,
    total: Option<u64>,
    mut pace: Option<Pace>,
    issued: Arc<AtomicU64>,
    keep: bool,
) -> LoadReport {
    let mut part = LoadReport::default();
    let mut sender: Option<SendRequest<Full<Bytes>>> = None;
    // Bounded by the deadline (and by `total` when given).
    while Instant::now() < deadline {
        let mut conn = match sender.take() {
            Some(s) => s,
            None => match tokio::time::timeout_at(deadline, connect(&target)).await {
                Err(_) => break,
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    note_error(&mut part, e);
                    tokio::time::sleep_until(deadline.min(Instant::now() + ms(10))).await;
                    continue;
                }
            },
        };
        match tokio::time::timeout_at(deadline, conn.ready()).await {
            Err(_) => break,
            // Closed by the server (e.g. after a non-keep-alive answer).
            Ok(Err(_)) => continue,
            Ok(Ok(())) => {}
        }
        // Counted only where a total or a numbered header needs it.
        let n = if total.is_some() || target.numbered.is_some() {
            issued.fetch_add(1, Ordering::SeqCst)
        } else {
            0
        };
        if total.is_some_and(|total| n >= total) {
            break;
        }
        let sent = match &mut pace {
            Some(p) => {
                let due = p.next;
                if due >= deadline {
                    break;
                }
                tokio::time::sleep_until(due).await;
                p.next += p.every;
                due
            }
            None => Instant::now(),
        };
        let req = build_request(&target, n);
        let exchange = async {
            let resp = conn.send_request(req).await?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<(u16, Bytes), hyper::Error>((status, body))
        };
        match tokio::time::timeout_at(deadline, exchange).await {
            // In flight at the deadline: abandoned, not counted.
            Err(_) => break,
            Ok(Ok((status, body))) => {
                let us = sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
                part.latencies_us.push(us);
                *part.statuses.entry(status).or_insert(0) += 1;
                if (200..300).contains(&status) {
                    part.ok += 1;
                    if keep {
                        part.answers.push(body);
                    }
                } else {
                    part.non_2xx += 1;
                }
                sender = Some(conn);
            }
            Ok(Err(e)) => {
                // The connection is unusable; reconnect on the next turn.
                note_error(&mut part, format!("request: {e}"));
            }
        }
    }
    part
}

fn note_error(part: &mut LoadReport, e: String) {
    part.errors += 1;
    if part.first_error.is_none() {
        part.first_error = Some(e);
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
