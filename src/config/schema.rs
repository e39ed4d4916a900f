//! The config file as written: serde structs with `deny_unknown_fields` and
//! defaults filled in, so that the parsed value is also the effective config
//! that `courier check` prints. Range checks live in `validate`.

use super::units::{Dur, Size};
use crate::event::Schema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

fn secs(s: u64) -> Dur {
    Dur(Duration::from_secs(s))
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default = "default_listen")]
    pub listen: String,
    #[serde(default = "default_admin_listen")]
    pub admin_listen: String,
    /// The name of the environment variable holding the admin bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_token_env: Option<String>,
    /// Host names, besides IP addresses and `localhost`, that a loopback
    /// listener answers (`server::guard`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    /// Relative journal and dead-letter paths resolve here (`state_dir.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<String>,
    #[serde(default = "default_shutdown_grace")]
    pub shutdown_grace: Dur,
    #[serde(default)]
    pub log: Log,
    #[serde(default)]
    pub journal: Journal,
    #[serde(default)]
    pub ingress: Ingress,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetterSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<Handoff>,
    #[serde(default)]
    pub history: History,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<Tracing>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub topics: BTreeMap<String, Topic>,
    #[serde(default)]
    pub destinations: BTreeMap<String, Destination>,
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_admin_listen() -> String {
    "127.0.0.1:9090".into()
}
fn default_shutdown_grace() -> Dur {
    secs(20)
}

/// `handoff` (docs/object-storage.md): where pending events go on SIGTERM, and where
/// every courier of the same url looks for them.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Handoff {
    pub url: String,
    #[serde(default = "default_handoff_poll")]
    pub poll: Dur,
    #[serde(default = "default_claim_timeout")]
    pub claim_timeout: Dur,
    /// A variable holding AES-256 keys (base64, space-separated; the first
    /// seals): hand-off objects are encrypted and authenticated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_key_env: Option<String>,
}

fn default_handoff_poll() -> Dur {
    secs(30)
}

fn default_claim_timeout() -> Dur {
    secs(300)
}

/// `tracing` (docs/tracing.md): OpenTelemetry spans of accepts and attempts,
/// exported over OTLP/HTTP (protobuf); off when omitted.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Tracing {
    /// The collector's base URL; spans go to `<otlp_endpoint>/v1/traces`.
    pub otlp_endpoint: String,
    #[serde(default = "default_sample_ratio")]
    pub sample_ratio: f64,
}

fn default_sample_ratio() -> f64 {
    1.0
}

/// `history` (docs/history.md): how long, and how much, of every event's
/// delivery is kept for "where is my webhook?".
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct History {
    #[serde(default = "default_history_retain")]
    pub retain: Dur,
    #[serde(default = "default_history_max_bytes")]
    pub max_bytes: Size,
}

impl Default for History {
    fn default() -> Self {
        History {
            retain: default_history_retain(),
            max_bytes: default_history_max_bytes(),
        }
    }
}

fn default_history_retain() -> Dur {
    secs(86_400)
}

fn default_history_max_bytes() -> Size {
    Size(256 * 1024 * 1024)
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Log {
    #[serde(default)]
    pub format: LogFormat,
    #[serde(default = "default_level")]
    pub level: String,
    #[serde(default)]
    pub bodies: bool,
}

impl Default for Log {
    fn default() -> Self {
        Log {
            format: LogFormat::Text,
            level: default_level(),
            bodies: false,
        }
    }
}

fn default_level() -> String {
    "info".into()
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Journal {
    #[serde(default = "default_journal_dir")]
    pub dir: String,
    #[serde(default = "default_max_bytes")]
    pub max_bytes: Size,
    #[serde(default)]
    pub sync: SyncMode,
}

impl Default for Journal {
    fn default() -> Self {
        Journal {
            dir: default_journal_dir(),
            max_bytes: default_max_bytes(),
            sync: SyncMode::Always,
        }
    }
}

fn default_journal_dir() -> String {
    "./data/journal".into()
}
fn default_max_bytes() -> Size {
    Size(1 << 30)
}

/// `always`: answer only after fdatasync; `os`: leave flushing to the page cache.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    #[default]
    Always,
    Os,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Ingress {
    #[serde(default = "default_max_body")]
    pub max_body_bytes: Size,
    /// Bytes of request bodies held at once (docs/publishing.md "Memory").
    #[serde(default = "default_max_inflight")]
    pub max_inflight_bytes: Size,
    #[serde(default)]
    pub credits_per_second: u64,
    /// A repeated event id (per destination) within this window is
    /// answered 202 and stored once; absent = no deduplication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedupe_window: Option<Dur>,
    /// Environment variables holding publisher keys; absent = open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys_from_env: Option<Vec<String>>,
}

impl Default for Ingress {
    fn default() -> Self {
        Ingress {
            max_body_bytes: default_max_body(),
            max_inflight_bytes: default_max_inflight(),
            credits_per_second: 0,
            dedupe_window: None,
            keys_from_env: None,
        }
    }
}

fn default_max_body() -> Size {
    Size(1 << 20)
}
/// Sized for the 512Mi memory limit of `deploy/` (docs/publishing.md "Memory").
fn default_max_inflight() -> Size {
    Size(64 << 20)
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterSpec {
    /// A directory of JSON Lines files (docs/dead-letters.md)...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    /// ...or a bucket (docs/object-storage.md): one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redact_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keep_headers: Vec<String>,
}

/// A destination's sink: its own directory or bucket, or `none` (drop and
/// count).
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum DeadLetterChoice {
    Sink(DeadLetterSpec),
    Keyword(String),
}

impl<'de> Deserialize<'de> for DeadLetterChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        keyword_or_block(d, "`none` or a mapping with `dir` or `url`").map(|v| match v {
            KeywordOr::Keyword(k) => DeadLetterChoice::Keyword(k),
            KeywordOr::Block(b) => DeadLetterChoice::Sink(b),
        })
    }
}

enum KeywordOr<T> {
    Keyword(String),
    Block(T),
}

/// A keyword or a block, read by hand rather than as an untagged enum, so
/// that a wrong key inside the block is named with the keys allowed, as in
/// every other block, instead of "matches no variant".
fn keyword_or_block<'de, D, T>(d: D, expecting: &'static str) -> Result<KeywordOr<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    use serde::de::{self, MapAccess, Visitor, value::MapAccessDeserializer};
    struct V<T>(&'static str, std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
        type Value = KeywordOr<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str(self.0)
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<KeywordOr<T>, E> {
            Ok(KeywordOr::Keyword(s.to_string()))
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<KeywordOr<T>, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map)).map(KeywordOr::Block)
        }
    }
    d.deserialize_any(V(expecting, std::marker::PhantomData))
}

/// `tls`: files added to what the system provides; all optional.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<String>,
}

/// `url: per_event`: each event names its endpoint (docs/endpoints.md).
pub const PER_EVENT: &str = "per_event";

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Destination {
    pub url: String,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default)]
    pub schema: Schema,
    /// Event Grid's `topic` for events posted here that lack one (schema
    /// eventgrid only); default `/courier/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eventgrid_topic: Option<String>,
    #[serde(default = "default_timeout")]
    pub timeout: Dur,
    #[serde(default = "default_passthrough_deadline")]
    pub passthrough_deadline: Dur,
    #[serde(default = "default_late_answer_window")]
    pub late_answer_window: Dur,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// `None`: by mode (`default_concurrency`); the effective config shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Concurrency>,
    /// This destination's share of `journal.max_bytes`; the default
    /// (`validate::Shares`) depends on the other keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_bytes: Option<Size>,
    #[serde(default)]
    pub retry: Retry,
    #[serde(default)]
    pub status: Status,
    #[serde(default)]
    pub batch: BatchSpec,
    #[serde(default)]
    pub headers: BTreeMap<String, HeaderSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing: Option<SigningSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitSpec>,
    #[serde(default)]
    pub probation: ProbationSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetterChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering: Option<OrderingSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<EndpointsSpec>,
}

/// `endpoints:`: the address guard (docs/delivery.md, "The address guard")
/// for any destination, and for `url: per_event` where each event's
/// endpoint comes from and how endpoints are kept apart (docs/endpoints.md).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointsSpec {
    /// `on` or `off` (a YAML boolean too); off for a fixed url by default,
    /// on for `per_event`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<Toggle>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_cidrs: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schemes: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tracked: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_idle_connections: Option<u64>,
    /// Read so that a config written from the docs gets a clear "not yet"
    /// rather than "unknown field" (`validate::per_event`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_bytes: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_after: Option<Dur>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<String>,
}

impl EndpointsSpec {
    /// The keys given that only `url: per_event` reads.
    pub fn per_event_keys(&self) -> Vec<&'static str> {
        [
            ("header", self.header.is_some()),
            ("secret_header", self.secret_header.is_some()),
            ("schemes", self.schemes.is_some()),
            ("concurrency", self.concurrency.is_some()),
            ("max_tracked", self.max_tracked.is_some()),
            ("max_idle_connections", self.max_idle_connections.is_some()),
            ("max_pending_bytes", self.max_pending_bytes.is_some()),
            ("disable_after", self.disable_after.is_some()),
            ("notify", self.notify.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, given)| given.then_some(k))
        .collect()
    }
}

/// `on`/`off`, or a YAML boolean.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Toggle {
    Bool(bool),
    Word(String),
}

/// `ordering: { key: ... }`: events of one key are delivered in accept order.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OrderingSpec {
    pub key: OrderingKeySpec,
}

/// `destination` (one lane), or `{ header: NAME }`, or `{ from_event: FIELD }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum OrderingKeySpec {
    Keyword(String),
    Source(KeySource),
}

impl<'de> Deserialize<'de> for OrderingKeySpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        keyword_or_block(
            d,
            "`destination` or a mapping with `header` or `from_event`",
        )
        .map(|v| match v {
            KeywordOr::Keyword(k) => OrderingKeySpec::Keyword(k),
            KeywordOr::Block(b) => OrderingKeySpec::Source(b),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeySource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_event: Option<String>,
}

fn default_timeout() -> Dur {
    secs(30)
}
fn default_passthrough_deadline() -> Dur {
    secs(10)
}
fn default_late_answer_window() -> Dur {
    secs(180)
}
/// Attempts in flight to one endpoint unless configured. Durable: 16,
/// Event Grid's own per-subscription pace, so a backlog does not flood the
/// endpoint. Passthrough: the app waits for each answer, so its own
/// connections already bound what is in flight, and a slot it must wait
/// for is pure latency: 50 app connections at 5,000 requests/s waited on
/// 16 slots, well behind nginx proxy_pass, and 64 came close (issue #30,
/// benches/RESULTS.md); 256 keeps that headroom for app pools five times
/// that size.
pub fn default_concurrency(mode: Mode) -> u64 {
    match mode {
        Mode::Durable => 16,
        Mode::Passthrough => 256,
    }
}

/// `concurrency`: a whole number, or `{ adaptive: { min, max, initial } }`
/// (the limit learnt from the endpoint's answers, `policy::adaptive`).
/// Read by hand, not as an untagged enum, so that a wrong key inside the
/// block is named as elsewhere rather than "matches no variant".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Concurrency {
    Fixed(u64),
    Adaptive { adaptive: AdaptiveSpec },
}

/// The block of `concurrency: { adaptive: ... }`; a key left out takes
/// `policy::adaptive::Bounds::DEFAULT`'s value, filled in for the
/// effective config (kept `None` here so that a check can say a value
/// out of range was the default).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial: Option<u64>,
}

impl AdaptiveSpec {
    /// Every key, the defaults filled in, as the effective config shows it.
    pub fn filled(self) -> AdaptiveSpec {
        let d = crate::policy::adaptive::Bounds::DEFAULT;
        AdaptiveSpec {
            min: self.min.or(Some(d.min as u64)),
            max: self.max.or(Some(d.max as u64)),
            initial: self.initial.or(Some(d.initial as u64)),
        }
    }
}

impl<'de> Deserialize<'de> for Concurrency {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{self, MapAccess, Visitor, value::MapAccessDeserializer};
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Block {
            adaptive: AdaptiveSpec,
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Concurrency;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a whole number or `{ adaptive: { min, max, initial } }`")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Concurrency, E> {
                Ok(Concurrency::Fixed(n))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Concurrency, E> {
                Err(E::invalid_value(de::Unexpected::Signed(n), &self))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Concurrency, A::Error> {
                let block = Block::deserialize(MapAccessDeserializer::new(map))?;
                Ok(Concurrency::Adaptive {
                    adaptive: block.adaptive,
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// A topic (Event Grid's custom topic): the app posts to `/<name>` and each
/// subscriber whose filter matches gets its own copy of every event.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Topic {
    /// Optional here only so that a missing schema is reported by
    /// `validate` with the topic's position, like every other problem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Schema>,
    /// As a destination's: the `topic` of this topic's events that lack
    /// one, in every subscriber's copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eventgrid_topic: Option<String>,
    #[serde(default)]
    pub subscribers: BTreeMap<String, Subscriber>,
}

/// One subscription's filter, after Event Grid's `includedEventTypes`,
/// `subjectBeginsWith`, `subjectEndsWith` and `isSubjectCaseSensitive`.
/// Every key is optional: `{}` takes every event.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Subscriber {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_begins_with: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_ends_with: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub subject_case_sensitive: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Durable,
    Passthrough,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Durable => "durable",
            Mode::Passthrough => "passthrough",
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    /// `eventgrid`, a list of delays, or a keyed form (`exponential:`,
    /// `sns:`); interpreted by `validate` so errors can name list items.
    #[serde(default = "default_schedule")]
    pub schedule: serde_norway::Value,
    /// `None`: 30, or `numRetries + 1` with `sns:` (where setting it is an
    /// error, so it must be told apart from the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    #[serde(default = "default_ttl")]
    pub event_ttl: Dur,
    #[serde(default = "default_jitter")]
    pub jitter: f64,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            schedule: default_schedule(),
            max_attempts: None,
            event_ttl: default_ttl(),
            jitter: default_jitter(),
        }
    }
}

fn default_ttl() -> Dur {
    secs(1440 * 60)
}
fn default_jitter() -> f64 {
    0.1
}

fn default_schedule() -> serde_norway::Value {
    serde_norway::Value::String("eventgrid".into())
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Status {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub success: Vec<StatusKey>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_retry: Vec<StatusKey>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub min_delay: BTreeMap<StatusKey, Dur>,
}

/// A status code as written: `404`, `"5xx"` or `"500-599"`; parsed in `validate`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(untagged)]
pub enum StatusKey {
    Code(i64),
    Text(String),
}

impl std::fmt::Display for StatusKey {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            StatusKey::Code(c) => write!(f, "{c}"),
            StatusKey::Text(t) => f.write_str(t),
        }
    }
}

/// One custom header: exactly one of `value`, `from_env`, `from_event`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_event: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret: bool,
}

/// `signing: { secrets_from_env: [VAR, ...] }`: the names of the variables
/// holding `whsec_...` secrets. Only the names are in the file (and in the
/// effective config `courier check` prints), never the secrets.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SigningSpec {
    pub secrets_from_env: Vec<String>,
}

/// `batch: { max_events, preferred_size }` (docs/batching.md); `max_events: 1` is off.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    #[serde(default = "default_max_events")]
    pub max_events: u64,
    #[serde(default = "default_preferred_size")]
    pub preferred_size: Size,
}

impl Default for BatchSpec {
    fn default() -> Self {
        BatchSpec {
            max_events: default_max_events(),
            preferred_size: default_preferred_size(),
        }
    }
}

fn default_max_events() -> u64 {
    1
}
fn default_preferred_size() -> Size {
    Size(64 * 1024)
}

/// `rate_limit: { per_second: N }`, SNS's `maxReceivesPerSecond`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSpec {
    pub per_second: u64,
}

/// Delayed delivery for sick endpoints: Event Grid's behaviour by default.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProbationSpec {
    #[serde(default = "default_after_failures")]
    pub after_failures: u32,
    /// Probation length by last outcome (`Busy: 10s`), over Event Grid's table.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub durations: BTreeMap<String, Dur>,
    #[serde(default = "default_probation_max")]
    pub max: Dur,
}

impl Default for ProbationSpec {
    fn default() -> Self {
        ProbationSpec {
            after_failures: default_after_failures(),
            durations: BTreeMap::new(),
            max: default_probation_max(),
        }
    }
}

fn default_after_failures() -> u32 {
    crate::policy::probation::DEFAULT_THRESHOLD
}
fn default_probation_max() -> Dur {
    Dur(crate::policy::probation::MAX_PROBATION)
}
