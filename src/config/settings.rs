//! Checked settings: what the rest of courier runs on. Built once from the
//! raw config by `validate`; every value here is known to be in range.

use super::admin_token::AdminToken;
use super::ingress_keys::IngressKeys;
use super::schema::{LogFormat, Mode, SyncMode};
use crate::event::Schema;
use crate::event::path::EventPath;
use crate::event::signature::Secret;
use crate::policy::adaptive::Bounds;
use crate::policy::probation::ProbationPolicy;
use crate::policy::{Limits, Schedule, StatusPolicy};
use crate::storage::StoreUrl;
use crate::tls::TlsFiles;
use http::uri::{Authority, Scheme};
use http::{HeaderName, HeaderValue, Uri};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug)]
pub struct Settings {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// `None`: mutating admin calls are open (only allowed on loopback).
    pub admin_token: Option<AdminToken>,
    /// Lower case, without a trailing dot.
    pub allowed_hosts: Vec<String>,
    pub shutdown_grace: Duration,
    pub log: LogSettings,
    pub journal: JournalSettings,
    pub ingress: IngressSettings,
    pub destinations: Vec<Arc<DestinationSettings>>,
    pub topics: Vec<Arc<TopicSettings>>,
    pub handoff: Option<HandoffSettings>,
    /// `None`: `history.retain: 0s`, no history kept.
    pub history: Option<HistorySettings>,
    /// `None`: no `tracing` key, nothing traced or exported.
    pub tracing: Option<TracingSettings>,
}

/// `tracing`, checked (docs/tracing.md).
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// Where spans are posted: the configured endpoint plus `/v1/traces`,
    /// as OTLP/HTTP exporters build it from a base URL.
    pub traces_url: String,
    /// Of the traces courier starts (no sampled parent from the app), the
    /// share kept; a parent's decision is followed. In 0..=1.
    pub sample_ratio: f64,
}

/// `history`, checked (docs/history.md).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HistorySettings {
    pub retain: Duration,
    pub max_bytes: u64,
}

/// `handoff`, checked (docs/object-storage.md).
#[derive(Debug, Clone, PartialEq)]
pub struct HandoffSettings {
    pub url: StoreUrl,
    /// How often the store is looked at for other couriers' hand-offs.
    pub poll: Duration,
    /// A claim older than this is taken over: its claimer died.
    pub claim_timeout: Duration,
    /// `encryption_key_env`'s keys; the first seals, any opens. Empty:
    /// objects are written in the clear.
    pub keys: Vec<crate::seal::Key>,
}

impl Settings {
    pub fn destination(&self, name: &str) -> Option<&Arc<DestinationSettings>> {
        self.destinations.iter().find(|d| d.name == name)
    }

    pub fn topic(&self, name: &str) -> Option<&Arc<TopicSettings>> {
        self.topics.iter().find(|t| t.name == name)
    }
}

/// A checked topic: its schema is `eventgrid` or `cloudevents`, and every
/// subscriber is a destination of that same schema.
#[derive(Debug)]
pub struct TopicSettings {
    pub name: String,
    pub schema: Schema,
    /// See `DestinationSettings::eventgrid_topic`; a topic's copies all
    /// carry the topic's, as Event Grid's deliveries name the topic.
    pub eventgrid_topic: String,
    pub subscribers: Vec<Subscription>,
}

/// One subscriber and its filter; matching lives in `ingress::topic`.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscription {
    pub destination: String,
    /// `None` takes every type. Stored in lower case: Event Grid compares
    /// event types ignoring case.
    pub event_types: Option<Vec<String>>,
    /// Stored in lower case unless `subject_case_sensitive`, so that
    /// matching lowers only the event's subject.
    pub subject_begins_with: Option<String>,
    pub subject_ends_with: Option<String>,
    pub subject_case_sensitive: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LogSettings {
    pub format: LogFormat,
    pub level: String,
    pub bodies: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct JournalSettings {
    pub dir: PathBuf,
    pub max_bytes: u64,
    pub sync: SyncMode,
}

#[derive(Debug)]
pub struct IngressSettings {
    pub max_body_bytes: u64,
    /// Bytes of request bodies held at once; at least `max_body_bytes`.
    pub max_inflight_bytes: u64,
    pub dedupe_window: Option<Duration>,
    /// Credits per route and second (Service Bus's throttle); 0 = off.
    pub credits_per_second: u64,
    /// `None`: publishers need no key.
    pub keys: Option<IngressKeys>,
}

#[derive(Debug, Clone)]
pub struct DestinationSettings {
    pub name: String,
    pub target: Target,
    pub schema: Schema,
    /// The `topic` given at ingress to Event Grid events that lack one
    /// (`eventgrid_topic`, default `/courier/<name>`): receivers and SDKs
    /// require it, and Event Grid always fills it on delivery.
    pub eventgrid_topic: String,
    /// Durable (the journal answers the app) or passthrough (the endpoint
    /// does, within `passthrough_deadline`).
    pub mode: Mode,
    /// The most of the journal its pending events may hold
    /// (`max_pending_bytes`), so that its endpoint being down cannot fill
    /// the journal for the other destinations.
    pub max_pending_bytes: u64,
    pub passthrough_deadline: Duration,
    pub timeout: Duration,
    /// The most attempts in flight: the configured number, or adaptive's
    /// `max`. It also sizes the connection pool.
    pub concurrency: usize,
    /// `concurrency: { adaptive: ... }`: the limit in force is learnt
    /// (`deliver::limit`), within these bounds.
    pub adaptive: Option<Bounds>,
    pub schedule: Schedule,
    pub limits: Limits,
    pub jitter: f64,
    pub status: StatusPolicy,
    pub headers: Vec<CustomHeader>,
    /// Standard Webhooks signing keys (1..=3, several during a rotation);
    /// empty = requests are not signed.
    pub signing: Vec<Secret>,
    /// Where dead letters go; `None` drops and counts.
    pub dead_letter: Option<SinkAt>,
    /// App headers never written to a dead-letter record (lowercase): the
    /// global `dead_letter.redact_headers` and the destination's own.
    pub redact_headers: Vec<String>,
    /// `rate_limit.per_second` or SNS `maxReceivesPerSecond`.
    pub rate_limit_per_second: Option<u32>,
    pub probation: ProbationPolicy,
    pub batch: BatchSettings,
    /// How long a timed-out attempt's answer is still awaited (0 = not).
    pub late_answer_window: Duration,
    /// Extra CA and client certificate files (`crate::tls`).
    pub tls: Option<TlsFiles>,
    /// `ordering.key`: events of one key are delivered in accept order.
    pub ordering: Option<crate::event::ordering::Key>,
    /// `endpoints.guard`: the addresses this destination may connect to;
    /// `None` when off.
    pub guard: Option<Arc<crate::policy::address::Guard>>,
    /// `url: per_event`: each event names its endpoint (docs/endpoints.md);
    /// `target` is then unused.
    pub per_event: Option<Arc<PerEvent>>,
}

/// `url: per_event`'s settings (`endpoints:`).
#[derive(Debug, Clone, PartialEq)]
pub struct PerEvent {
    /// The app's header that names the endpoint's URL (lowercase).
    pub header: HeaderName,
    /// The app's header that carries the endpoint's secrets (lowercase).
    pub secret_header: HeaderName,
    /// Schemes a named URL may have (lowercase).
    pub schemes: Vec<String>,
    /// Attempts in flight to one endpoint, within the destination's.
    pub concurrency: usize,
    /// Endpoints whose state is kept in memory at once.
    pub max_tracked: usize,
    /// Idle connections kept across the endpoints (`deliver::pool`).
    pub max_idle_connections: usize,
    /// Each endpoint's share of the journal (`503 endpoint_full` past it).
    pub max_pending_bytes: u64,
    /// An endpoint failing with no success this long is disabled (`None`:
    /// never).
    pub disable_after: Option<std::time::Duration>,
    /// The destination that gets `courier.endpoint.disabled` and
    /// `.recovered` events.
    pub notify: Option<String>,
}

/// `batch`: how many ready events one attempt may carry (docs/batching.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSettings {
    /// 1..=5000; 1 = every event is its own attempt, as without batching.
    pub max_events: usize,
    /// A batch closes when the next event would make its body larger.
    pub preferred_size: usize,
}

impl BatchSettings {
    pub fn enabled(&self) -> bool {
        self.max_events > 1
    }
}

/// The longest custom header value, in bytes (docs/configuration.md): checked at load for
/// fixed values and at each attempt for `from_event` values.
pub const MAX_HEADER_VALUE: usize = 4096;

#[derive(Debug, Clone)]
pub struct CustomHeader {
    pub name: HeaderName,
    pub value: HeaderSource,
}

/// Where a custom header's value comes from.
#[derive(Debug, Clone)]
pub enum HeaderSource {
    /// `value:` or `from_env:`, known at load (marked sensitive when `secret`).
    Fixed(HeaderValue),
    /// `from_event:`, read from each attempt's event.
    FromEvent { path: EventPath, secret: bool },
}

/// The destination url split so that `/rest?query` from the app can be appended.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// `scheme://authority`
    origin: String,
    /// Path without a trailing slash (empty for the root).
    path: String,
    query: Option<String>,
    /// The scheme and authority, parsed once: an attempt's url is built
    /// from parts, so that no stored path can reach the authority.
    parts: Option<(Scheme, Authority)>,
    /// The url itself, parsed once: most apps post to `/<name>` alone, and
    /// a clone shares its bytes where a format and a parse would allocate.
    base: Option<Uri>,
}

/// Why an attempt has no url.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("the stored path does not start with `/`")]
    NotAPath,
    #[error(transparent)]
    Http(#[from] http::Error),
}

impl Target {
    pub fn new(origin: String, path: String, query: Option<String>) -> Target {
        let parts = origin.parse::<Uri>().ok().and_then(|u| {
            let p = u.into_parts();
            Some((p.scheme?, p.authority?))
        });
        let mut t = Target {
            origin,
            path,
            query,
            parts,
            base: None,
        };
        t.base = t.join("", None).ok();
        t
    }

    /// `http://`, where a destination's `tls` settings cannot apply.
    pub fn is_plain_http(&self) -> bool {
        self.origin.starts_with("http://")
    }

    /// The url of one attempt as text (for the log and tests): see `uri`.
    pub fn url(&self, rest: &str, query: Option<&str>) -> String {
        match self.uri(rest, query) {
            Ok(uri) => uri.to_string(),
            Err(e) => format!("{}{} ({e})", self.origin, self.path),
        }
    }

    /// The url of one attempt: the configured path plus the app's `rest`
    /// (empty, or a path from `/`), and both queries joined with `&`.
    pub fn uri(&self, rest: &str, query: Option<&str>) -> Result<Uri, UrlError> {
        match &self.base {
            Some(base) if rest.is_empty() && query.is_none_or(str::is_empty) => Ok(base.clone()),
            _ => self.join(rest, query),
        }
    }

    fn join(&self, rest: &str, query: Option<&str>) -> Result<Uri, UrlError> {
        if !(rest.is_empty() || rest.starts_with('/')) {
            return Err(UrlError::NotAPath);
        }
        let mut pq = format!("{}{}", self.path, rest);
        if pq.is_empty() {
            pq.push('/');
        }
        let queries: Vec<&str> = [self.query.as_deref(), query]
            .into_iter()
            .flatten()
            .filter(|q| !q.is_empty())
            .collect();
        if !queries.is_empty() {
            pq.push('?');
            pq.push_str(&queries.join("&"));
        }
        let mut builder = Uri::builder();
        if let Some((scheme, authority)) = &self.parts {
            builder = builder.scheme(scheme.clone()).authority(authority.clone());
        }
        Ok(builder.path_and_query(pq).build()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rest_and_query_are_appended() {
        let t = Target::new(
            "https://h.example".into(),
            "/hooks".into(),
            Some("code=k".into()),
        );
        assert_eq!(t.url("", None), "https://h.example/hooks?code=k");
        assert_eq!(
            t.url("/a/b", Some("x=1")),
            "https://h.example/hooks/a/b?code=k&x=1"
        );
        let root = Target::new("http://127.0.0.1:9".into(), String::new(), None);
        assert_eq!(root.url("", None), "http://127.0.0.1:9/");
        assert_eq!(root.url("/x", Some("")), "http://127.0.0.1:9/x");
    }
    #[test]
    fn no_stored_path_reaches_the_authority() {
        let root = Target::new("http://127.0.0.1:7410".into(), String::new(), None);
        assert!(matches!(
            root.uri("@127.0.0.2:7411/steal", None),
            Err(UrlError::NotAPath)
        ));
        let uri = root.uri("/@127.0.0.2:7411/steal", None).expect("a path");
        assert_eq!(uri.authority().map(|a| a.as_str()), Some("127.0.0.1:7410"));
        assert_eq!(uri.path(), "/@127.0.0.2:7411/steal");
        let uri = root.uri("", Some("a=1@b:2/c")).expect("a query");
        assert_eq!(uri.authority().map(|a| a.as_str()), Some("127.0.0.1:7410"));
        assert!(root.uri("/a b", None).is_err(), "not a url path");
    }

    #[test]
    fn the_parsed_url_is_the_url_with_or_without_the_apps_part() {
        for t in [
            Target::new(
                "https://h.example".into(),
                "/hooks".into(),
                Some("code=k".into()),
            ),
            Target::new("http://127.0.0.1:9".into(), String::new(), None),
        ] {
            for (rest, query) in [("", None), ("", Some("")), ("/a", None), ("", Some("x=1"))] {
                let uri = t.uri(rest, query).expect("a url");
                assert_eq!(
                    uri.to_string(),
                    t.url(rest, query),
                    "{t:?} {rest} {query:?}"
                );
            }
        }
    }
}

/// Where a destination's dead letters go.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SinkAt {
    /// `dead_letter.dir`: JSON Lines files, a file per day (docs/dead-letters.md).
    Dir(PathBuf),
    /// `dead_letter.url`: objects in a bucket (docs/object-storage.md).
    Bucket(StoreUrl),
}
