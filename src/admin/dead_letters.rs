//! The dead-letters API (docs/http-api.md): list, show, replay and purge the records
//! in the sinks (directories or buckets) of configured destinations.
//!
//! A replay puts each record's request back in the journal as the app sent
//! it (method, path and query, forwarded headers, body), under its id, with
//! a fresh attempt count and a fresh TTL from the replay, past the dedupe
//! window; only then is the record marked replayed. A crash between the two
//! can replay a record twice, never lose one (at least once, as delivery).

use super::Admin;
use super::api::{
    DeadLetterItem, DeadLetterPage, PurgeAnswer, ReplayAnswer, ReplayRequest, UnreadableRecord,
};
use crate::clock;
use crate::deadletter::{
    Cursor, Filter, Order, Place, Source, Summary, day_start_ms, find, is_day, page, parse,
    unreplayed,
};
use crate::event::NewEvent;
use crate::event::Reason;
use crate::journal::Journal;
use crate::metrics;
use crate::server::{Body, json};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{Value, json};
use std::collections::HashSet;

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;
/// Ids one replay call may name; `all` has no limit.
const MAX_IDS: usize = 1000;
/// Records a replay of `all` stores per journal write.
const CHUNK: usize = 500;
/// Ids a replay of `all` lists in its answer (the count is exact).
const LISTED: usize = 1000;

/// Why a call failed; `reply` is its one conversion to an answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum ApiError {
    #[error("{0}")]
    Bad(String),
    #[error("{0}")]
    NotFound(String),
    #[error(
        "unknown destination `{0}`: it is not in the config, so its dead letters cannot be read or replayed here (any records stay in the dead-letter folder named `{0}`); add it back to the config to work on them"
    )]
    Unknown(String, Vec<String>),
    #[error("cannot read the dead letters: {0}")]
    Read(String),
    /// A replay that stopped part way: why, and what it did before.
    #[error("{1}")]
    Stopped(StatusCode, String, Box<Value>),
}

impl ApiError {
    pub(super) fn reply(self) -> Response<Body> {
        let message = self.to_string();
        let (status, mut body) = match self {
            ApiError::Bad(_) => (StatusCode::BAD_REQUEST, json!({})),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, json!({})),
            ApiError::Unknown(_, names) => {
                (StatusCode::NOT_FOUND, json!({ "destinations": names }))
            }
            ApiError::Read(_) => (StatusCode::INTERNAL_SERVER_ERROR, json!({})),
            ApiError::Stopped(status, _, done) => (status, *done),
        };
        body["error"] = json!(message);
        json(status, &body)
    }
}

impl From<std::io::Error> for ApiError {
    fn from(e: std::io::Error) -> Self {
        ApiError::Read(e.to_string())
    }
}

impl From<tokio::task::JoinError> for ApiError {
    fn from(e: tokio::task::JoinError) -> Self {
        ApiError::Read(e.to_string())
    }
}

pub(super) type Answer = Result<Value, ApiError>;

pub(super) fn bad(message: impl Into<String>) -> ApiError {
    ApiError::Bad(message.into())
}

/// `yyyy-mm-dd` (midnight UTC) or an RFC 3339 time in UTC.
pub(super) fn time_ms(key: &str, value: &str) -> Result<u64, ApiError> {
    let ms = if is_day(value) {
        day_start_ms(value)
    } else {
        crate::clock::rfc3339::parse_ms_utc_default(value)
    };
    ms.ok_or_else(|| {
        bad(format!(
            "`{key}` is `{value}`: expected a date (2026-11-22) or a UTC time (2026-11-22T10:00:00Z)"
        ))
    })
}

fn reason(value: &str) -> Result<String, ApiError> {
    let names = Reason::ALL.map(|r| r.as_str());
    if names.contains(&value) {
        return Ok(value.to_string());
    }
    Err(bad(format!(
        "`reason` is `{value}`: expected one of {}",
        names.join(", ")
    )))
}

/// The query's pairs, refusing keys not in `allowed` (a typo would
/// otherwise widen a listing or a purge silently).
pub(super) fn query(uri: &Uri, allowed: &[&str]) -> Result<Vec<(String, String)>, ApiError> {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if let Some((k, _)) = pairs.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        return Err(bad(format!(
            "unknown parameter `{k}`; expected one of {}",
            allowed.join(", ")
        )));
    }
    Ok(pairs)
}

fn item(destination: &str, summary: Summary, replayed: bool) -> DeadLetterItem {
    DeadLetterItem {
        summary,
        destination: destination.to_string(),
        replayed,
    }
}

/// An answer's body as JSON.
pub(super) fn to_json(body: &impl serde::Serialize) -> Answer {
    serde_json::to_value(body).map_err(|e| ApiError::Read(e.to_string()))
}

/// What `list` reads: the page wanted, and where from.
struct Listing {
    only: Option<String>,
    filter: Filter,
    order: Order,
    after: Option<Cursor>,
    limit: usize,
}

impl Listing {
    fn parse(uri: &Uri) -> Result<Listing, ApiError> {
        let allowed = [
            "destination",
            "limit",
            "after",
            "order",
            "reason",
            "since",
            "until",
        ];
        let mut l = Listing {
            only: None,
            filter: Filter::default(),
            order: Order::Newest,
            after: None,
            limit: DEFAULT_LIMIT,
        };
        for (k, v) in query(uri, &allowed)? {
            match k.as_str() {
                "destination" => l.only = Some(v),
                "limit" => {
                    l.limit = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| {
                            bad(format!("`limit` is `{v}`: expected 1 to {MAX_LIMIT}"))
                        })?;
                }
                "after" => {
                    l.after = Some(Cursor::decode(&v).ok_or_else(|| {
                        bad(format!(
                            "`after` is `{v}`, which is not a cursor this API gave"
                        ))
                    })?);
                }
                "order" => {
                    l.order = match v.as_str() {
                        "newest" => Order::Newest,
                        "oldest" => Order::Oldest,
                        _ => {
                            return Err(bad(format!(
                                "`order` is `{v}`: expected newest or oldest"
                            )));
                        }
                    };
                }
                "reason" => l.filter.reason = Some(reason(&v)?),
                "since" => l.filter.since_ms = Some(time_ms(&k, &v)?),
                _ => l.filter.until_ms = Some(time_ms(&k, &v)?),
            }
        }
        if l.after.as_ref().is_some_and(|c| c.order != l.order) {
            return Err(bad(
                "`after` is a cursor of the other `order`: page on with the order it was made under",
            ));
        }
        Ok(l)
    }
}

/// The filter of a replay of `all`.
fn replay_filter(ask: &ReplayRequest) -> Result<Filter, ApiError> {
    let time = |key: &str, v: &Option<String>| v.as_deref().map(|v| time_ms(key, v)).transpose();
    Ok(Filter {
        reason: ask.reason.as_deref().map(reason).transpose()?,
        since_ms: time("since", &ask.since)?,
        until_ms: time("until", &ask.until)?,
    })
}

impl Admin {
    /// A configured destination's settings; `Unknown`, with the names
    /// there are, for any other.
    pub(super) fn configured(
        &self,
        name: &str,
    ) -> Result<std::sync::Arc<crate::config::DestinationSettings>, ApiError> {
        let settings = self.settings.load();
        settings.destination(name).cloned().ok_or_else(|| {
            let names = settings
                .destinations
                .iter()
                .map(|d| d.name.clone())
                .collect();
            ApiError::Unknown(name.to_string(), names)
        })
    }

    /// The sink of a configured destination.
    fn source(&self, name: &str) -> Result<Source, ApiError> {
        let dest = self.configured(name)?;
        let Some(at) = &dest.dead_letter else {
            return Err(ApiError::NotFound(format!(
                "destination `{name}` has no dead-letter sink (`dead_letter: none`, or no default `dead_letter`): its events are dropped, not kept"
            )));
        };
        let sink = self
            .fleet
            .sink(at)
            .map_err(|e| ApiError::Read(format!("cannot open the dead-letter store: {e}")))?;
        Ok(Source {
            destination: name.to_string(),
            sink,
        })
    }

    /// `GET /v1/dead-letters`.
    pub(super) async fn list_dead_letters(&self, uri: &Uri) -> Answer {
        let l = Listing::parse(uri)?;
        let sources = match &l.only {
            Some(name) => vec![self.source(name)?],
            None => {
                let settings = self.settings.load();
                let mut names: Vec<&str> = settings
                    .destinations
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect();
                names.sort_unstable();
                names
                    .into_iter()
                    .filter_map(|n| self.source(n).ok())
                    .collect()
            }
        };
        let p = tokio::task::spawn_blocking(move || {
            page(&sources, &l.filter, l.order, l.after.as_ref(), l.limit)
        })
        .await??;
        to_json(&DeadLetterPage {
            dead_letters: p
                .items
                .into_iter()
                .map(|i| item(&i.destination, i.summary, i.replayed))
                .collect(),
            next: p.next.map(|c| c.encode()),
            unreadable_lines: p.unreadable,
        })
    }

    /// `GET /v1/dead-letters/{destination}/{id}`: the newest record of `id`.
    pub(super) async fn show_dead_letter(&self, name: &str, id: &str) -> Answer {
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let (name, id) = (&decode(name), decode(id));
        let source = self.source(name)?;
        let ids = HashSet::from([id.clone()]);
        let mut found = tokio::task::spawn_blocking(move || find(&source, &ids)).await??;
        let f = found.remove(&id).ok_or_else(|| {
            ApiError::NotFound(format!("no dead letter `{id}` for destination `{name}`"))
        })?;
        let record = parse(&f.line)
            .map_err(|e| ApiError::Read(format!("the record of `{id}` is unreadable: {e}")))?;
        let mut v = to_json(&item(name, record.summary(), f.replayed))?;
        v["record"] = record.into_value();
        Ok(v)
    }

    /// `DELETE /v1/dead-letters?destination=&before=`.
    pub(super) async fn purge_dead_letters(&self, uri: &Uri) -> Answer {
        let pairs = query(uri, &["destination", "before"])?;
        let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        let name = get("destination").ok_or_else(|| {
            bad("a purge needs `destination`: it never spans every destination at once")
        })?;
        let before = get("before");
        if let Some(b) = before
            .as_deref()
            .filter(|b| day_start_ms(b).is_none() || !is_day(b))
        {
            return Err(bad(format!(
                "`before` is `{b}`: expected a date (2026-11-22); records are kept in one file per UTC day, and a purge removes whole days before it"
            )));
        }
        let source = self.source(&name)?;
        // Held by the purge itself: a caller that goes away cannot free it early.
        let one = self.dead_letter_ops.clone().lock_owned().await;
        let b = before.clone();
        let purged = tokio::task::spawn_blocking(move || {
            let _one = one;
            source.sink.purge(&source.destination, b.as_deref())
        })
        .await??;
        tracing::info!(destination = %name, before = before.as_deref(), records = purged.records, files = purged.files.len(), "dead letters purged");
        to_json(&PurgeAnswer {
            destination: name,
            before,
            purged: purged.records,
            files: purged.files,
        })
    }

    /// `POST /v1/dead-letters/replay`.
    pub(super) async fn replay_dead_letters(&self, req: Request<Incoming>) -> Answer {
        let body = Limited::new(req.into_body(), 1 << 20)
            .collect()
            .await
            .map_err(|e| bad(format!("cannot read the request body: {e}")))?
            .to_bytes();
        let ask: ReplayRequest = serde_json::from_slice(&body).map_err(|e| {
            bad(format!(
                "the body is not a replay request: {e}; expected {{\"destination\": \"...\", \"ids\": [\"...\"]}} or {{\"destination\": \"...\", \"all\": true}}"
            ))
        })?;
        let source = self.source(&ask.destination)?;
        let filter = replay_filter(&ask)?;
        let named = ask.reason.is_some() || ask.since.is_some() || ask.until.is_some();
        let what = match (ask.ids, ask.all) {
            (Some(ids), false) if !ids.is_empty() && ids.len() <= MAX_IDS => {
                if named {
                    return Err(bad(
                        "`reason`, `since` and `until` go with `all`; named ids are replayed as named",
                    ));
                }
                Some(ids)
            }
            (Some(ids), false) if ids.len() > MAX_IDS => {
                return Err(bad(format!(
                    "{} ids: at most {MAX_IDS} per call, or `all`",
                    ids.len()
                )));
            }
            (None, true) => None,
            _ => {
                return Err(bad(
                    "a replay needs either `ids` (a non-empty list) or `all: true`, not both",
                ));
            }
        };
        let one = self.dead_letter_ops.clone().lock_owned().await;
        let replayer = Replayer {
            journal: self.journal.clone(),
            source,
        };
        // A task of its own: a caller that goes away mid-replay (a client's
        // timeout) must not leave events stored but unmarked.
        let task = tokio::spawn(async move {
            let _one = one;
            let mut done = Replay::new(&replayer.source.destination);
            let outcome = match what {
                Some(ids) => replayer.ids(&ids, &mut done).await,
                None => replayer.all(filter, &mut done).await,
            };
            (done, outcome)
        });
        let (done, outcome) = task.await?;
        let name = &done.destination;
        tracing::info!(destination = %name, replayed = done.count, not_found = done.not_found.len(), "dead letters replayed");
        match outcome {
            Ok(()) => to_json(&done.answer()),
            Err((status, error)) => {
                tracing::error!(destination = %name, error, "replay stopped");
                let body = serde_json::to_value(done.answer()).unwrap_or_default();
                Err(ApiError::Stopped(status, error, Box::new(body)))
            }
        }
    }
}

/// A replay's work, owned, so that it runs to its end in a task.
struct Replayer {
    journal: Journal,
    source: Source,
}

impl Replayer {
    async fn ids(&self, ids: &[String], done: &mut Replay) -> Stopped {
        let wanted: HashSet<String> = ids.iter().cloned().collect();
        let src = self.source.clone();
        let mut found = match tokio::task::spawn_blocking(move || find(&src, &wanted)).await {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => return Err(unreadable(&e.to_string())),
            Err(e) => return Err(unreadable(&e.to_string())),
        };
        let mut chunk = Vec::new();
        let mut seen = HashSet::new();
        for id in ids {
            if !seen.insert(id) {
                continue;
            }
            match found.remove(id) {
                Some(f) => {
                    if f.replayed {
                        done.again.push(id.clone());
                    }
                    chunk.push((f.place, f.line));
                }
                None => done.not_found.push(id.clone()),
            }
        }
        self.chunk(chunk, done).await
    }

    async fn all(&self, filter: Filter, done: &mut Replay) -> Stopped {
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let src = self.source.clone();
        let scan = tokio::task::spawn_blocking(move || {
            unreplayed(&src, &filter, CHUNK, |chunk| {
                tx.blocking_send(chunk).is_ok()
            })
        });
        while let Some(chunk) = rx.recv().await {
            if let Err(stop) = self.chunk(chunk, done).await {
                drop(rx);
                let _ = scan.await;
                return Err(stop);
            }
        }
        match scan.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(unreadable(&e.to_string())),
            Err(e) => Err(unreadable(&e.to_string())),
        }
    }

    /// Stores one chunk in the journal, then marks it replayed.
    async fn chunk(&self, chunk: Vec<(Place, String)>, done: &mut Replay) -> Stopped {
        let destination = &self.source.destination;
        let now = clock::now_ms();
        let mut events: Vec<NewEvent> = Vec::with_capacity(chunk.len());
        let mut places = Vec::with_capacity(chunk.len());
        for (place, line) in chunk {
            match parse(&line).and_then(|r| r.rebuild(&line, destination, now)) {
                Ok(r) => {
                    for name in r.redacted {
                        if !done.redacted.contains(&name) {
                            done.redacted.push(name);
                        }
                    }
                    events.push(r.event);
                    places.push(place);
                }
                Err(e) => done.unreadable.push(UnreadableRecord {
                    day: place.day,
                    offset: place.offset,
                    error: e.to_string(),
                }),
            }
        }
        if events.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
        if let Err(e) = self.journal.replay(events).await {
            return Err((
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the journal refused the replay ({e}); what is listed as replayed was stored, the rest is untouched"
                ),
            ));
        }
        metrics::replayed(destination, ids.len() as u64);
        done.add(ids);
        let src = self.source.clone();
        let marked =
            tokio::task::spawn_blocking(move || src.sink.mark_replayed(&src.destination, &places))
                .await;
        match marked {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(unmarked(&e.to_string())),
            Err(e) => Err(unmarked(&e.to_string())),
        }
    }
}

/// How a replay stopped: the status and the reason.
type Stopped = Result<(), (StatusCode, String)>;

fn unreadable(e: &str) -> (StatusCode, String) {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("cannot read the dead letters: {e}"),
    )
}

fn unmarked(e: &str) -> (StatusCode, String) {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!(
            "the events were stored but could not be marked replayed ({e}): a replay of `all` would send them again"
        ),
    )
}

/// What a replay did, as its answer says.
struct Replay {
    destination: String,
    count: u64,
    ids: Vec<String>,
    not_found: Vec<String>,
    /// Named ids whose record was replayed before: sent again, as asked.
    again: Vec<String>,
    unreadable: Vec<UnreadableRecord>,
    redacted: Vec<String>,
}

impl Replay {
    fn new(destination: &str) -> Self {
        Replay {
            destination: destination.to_string(),
            count: 0,
            ids: Vec::new(),
            not_found: Vec::new(),
            again: Vec::new(),
            unreadable: Vec::new(),
            redacted: Vec::new(),
        }
    }

    fn add(&mut self, ids: Vec<String>) {
        self.count += ids.len() as u64;
        let room = LISTED.saturating_sub(self.ids.len());
        self.ids.extend(ids.into_iter().take(room));
    }

    fn answer(&self) -> ReplayAnswer {
        let listed = self.count > self.ids.len() as u64;
        ReplayAnswer {
            destination: self.destination.clone(),
            replayed: self.ids.clone(),
            replayed_count: self.count,
            not_found: self.not_found.clone(),
            unreadable: self.unreadable.clone(),
            replayed_before: self.again.clone(),
            replayed_listed: listed.then_some(self.ids.len()),
            redacted_headers: self.redacted.clone(),
            note: (!self.redacted.is_empty()).then(|| {
                format!(
                    "sent without the headers the records did not keep (dead_letter.redact_headers): {}",
                    self.redacted.join(", ")
                )
            }),
        }
    }
}
