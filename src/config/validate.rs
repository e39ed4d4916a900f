//! Range and cross-field checks on the parsed config. Every problem is
//! collected (not just the first), each with its key path, the bad value and
//! what is allowed; `mod.rs` adds the file position.

use super::admin_token::AdminToken;
use super::ingress_keys::IngressKeys;
use super::schema::{
    Concurrency, DeadLetterChoice, DeadLetterSpec, Destination, HeaderSpec, KeySource, Mode,
    OrderingKeySpec, PER_EVENT, RawConfig, SigningSpec, StatusKey, TlsSpec,
};
use super::settings::*;
use super::units::{Dur, Size};
use crate::event::Outcome;
use crate::event::Schema;
use crate::event::path::EventPath;
use crate::event::rules::valid_name;
use crate::event::signature::Secret;
use crate::policy::adaptive::Bounds;
use crate::policy::classify::Codes;
use crate::policy::probation::ProbationPolicy;
use crate::policy::{Limits, StatusPolicy};
use crate::storage::StoreUrl;
use crate::tls::{TlsFileError, TlsFiles};
use http::{HeaderName, HeaderValue};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// One problem at one key path.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

/// Where secrets from the environment come from, and whether a missing one
/// is an error (`run`) or a warning (`check`, which may run without them).
pub trait Env {
    fn get(&self, name: &str) -> Option<String>;
}

pub struct ProcessEnv;
impl Env for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Run,
    Check,
}

pub struct Checked {
    pub settings: Settings,
    pub warnings: Vec<Problem>,
    /// Where relative data paths were resolved (`state_dir.rs`).
    pub state_dir: PathBuf,
}

const MAX_HEADERS: usize = 10;
const MAX_SIGNING_SECRETS: usize = 3;
const RESERVED_HEADERS: [&str; 7] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
];

pub(super) struct Checker<'a> {
    problems: Vec<Problem>,
    warnings: Vec<Problem>,
    /// Relative journal and dead-letter paths are taken from here.
    state_dir: PathBuf,
    env: &'a dyn Env,
    purpose: Purpose,
}

impl Checker<'_> {
    pub(super) fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            path: path.into(),
            message: message.into(),
        });
    }

    pub(super) fn warn(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(Problem {
            path: path.into(),
            message: message.into(),
        });
    }

    pub(super) fn range_dur(
        &mut self,
        path: &str,
        d: Dur,
        min: Duration,
        max: Duration,
    ) -> Duration {
        if d.0 < min || d.0 > max {
            self.err(
                path,
                format!("{d} is out of range: allowed {}..={}", Dur(min), Dur(max)),
            );
        }
        d.0
    }

    pub(super) fn range_u64(&mut self, path: &str, v: u64, min: u64, max: u64) -> u64 {
        if v < min || v > max {
            self.err(path, format!("{v} is out of range: allowed {min}..={max}"));
        }
        v
    }

    /// The value of environment variable `var`, read for the key at `path`.
    /// Missing: an error for `run`, a warning for `check` (which may run
    /// where the secrets are not), and `None` either way.
    fn env_var(&mut self, path: String, var: &str) -> Option<String> {
        let value = self.env.get(var);
        if value.is_none() {
            let problem = Problem {
                path,
                message: format!("environment variable {var} is not set"),
            };
            match self.purpose {
                Purpose::Run => self.problems.push(problem),
                Purpose::Check => self.warnings.push(problem),
            }
        }
        value
    }

    fn addr(&mut self, path: &str, s: &str) -> SocketAddr {
        s.parse().unwrap_or_else(|_| {
            self.err(
                path,
                format!("`{s}` is not an address: expected ip:port, like 127.0.0.1:8080"),
            );
            SocketAddr::from(([127, 0, 0, 1], 0))
        })
    }

    fn dir(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        let joined = if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.state_dir.join(p)
        };
        // `././journal` reads badly in messages; components() drops inner `.`.
        joined.components().collect()
    }
}

/// Checks `raw`; relative data paths are taken from the state folder, which
/// defaults to `base_dir` (the config file's folder).
pub fn check(
    raw: &RawConfig,
    base_dir: &Path,
    env: &dyn Env,
    purpose: Purpose,
) -> Result<Checked, Vec<Problem>> {
    let (state_dir, state_problem) =
        match super::state_dir::resolve(raw.state_dir.as_deref(), base_dir, env) {
            Ok(dir) => (dir, None),
            Err(p) => (base_dir.to_path_buf(), Some(p)),
        };
    let mut c = Checker {
        problems: state_problem.into_iter().collect(),
        warnings: Vec::new(),
        state_dir,
        env,
        purpose,
    };
    let listen = c.addr("listen", &raw.listen);
    let admin_listen = c.addr("admin_listen", &raw.admin_listen);
    if listen == admin_listen && listen.port() != 0 {
        c.err(
            "admin_listen",
            format!("`{admin_listen}` is also `listen`: use two different ports"),
        );
    }
    let admin_token = admin_token(&mut c, raw.admin_token_env.as_deref(), admin_listen);
    let shutdown_grace = c.range_dur(
        "shutdown_grace",
        raw.shutdown_grace,
        Duration::ZERO,
        Duration::from_secs(3600),
    );
    let level = raw.log.level.to_ascii_lowercase();
    if !["trace", "debug", "info", "warn", "error"].contains(&level.as_str()) {
        c.err(
            "log.level",
            format!(
                "`{}` is not a level: allowed trace, debug, info, warn, error",
                raw.log.level
            ),
        );
    }
    let max_bytes = c.range_u64(
        "journal.max_bytes",
        raw.journal.max_bytes.0,
        1 << 10,
        1 << 50,
    );
    if raw.journal.dir.trim().is_empty() {
        c.err("journal.dir", "must not be empty");
    }
    let max_body_bytes = c.range_u64(
        "ingress.max_body_bytes",
        raw.ingress.max_body_bytes.0,
        1,
        256 << 20,
    );
    let max_inflight_bytes = c.range_u64(
        "ingress.max_inflight_bytes",
        raw.ingress.max_inflight_bytes.0,
        1 << 10,
        1 << 40,
    );
    if max_inflight_bytes < max_body_bytes {
        c.err(
            "ingress.max_inflight_bytes",
            format!(
                "{max_inflight_bytes} is less than ingress.max_body_bytes ({max_body_bytes}): a body of that size could never be accepted"
            ),
        );
    }
    let credits_per_second = c.range_u64(
        "ingress.credits_per_second",
        raw.ingress.credits_per_second,
        0,
        10_000_000,
    );
    let dedupe_window = raw.ingress.dedupe_window.map(|d| {
        c.range_dur(
            "ingress.dedupe_window",
            d,
            Duration::from_secs(1),
            Duration::from_secs(24 * 3600),
        )
    });
    let keys = raw
        .ingress
        .keys_from_env
        .as_deref()
        .map(|vars| ingress_keys(&mut c, vars));
    if raw.destinations.is_empty() {
        c.err("destinations", "at least one destination is needed");
    }
    let durable = raw
        .destinations
        .values()
        .filter(|d| d.mode == Mode::Durable)
        .count();
    let shares = Shares::new(&mut c, max_bytes, max_body_bytes, durable);
    let default_sink = raw.dead_letter.as_ref().and_then(|d| {
        let redact = redaction(&mut c, "dead_letter", d, &Redaction::default());
        sink_at(&mut c, "dead_letter", d).map(|at| (at, redact))
    });
    let destinations = raw
        .destinations
        .iter()
        .map(|(name, d)| Arc::new(destination(&mut c, name, d, default_sink.as_ref(), &shares)))
        .collect();
    notify_targets(&mut c, &raw.destinations);
    let topics = super::topics::topics(&mut c, &raw.topics, &raw.destinations)
        .into_iter()
        .map(Arc::new)
        .collect();
    if !c.problems.is_empty() {
        return Err(c.problems);
    }
    let allowed_hosts = allowed_hosts(&mut c, &raw.allowed_hosts);
    let handoff = raw.handoff.as_ref().and_then(|h| handoff(&mut c, h));
    let history = history(&mut c, &raw.history);
    let tracing = raw.tracing.as_ref().and_then(|t| tracing(&mut c, t));
    if !c.problems.is_empty() {
        return Err(c.problems);
    }
    let settings = Settings {
        listen,
        admin_listen,
        admin_token,
        allowed_hosts,
        shutdown_grace,
        log: LogSettings {
            format: raw.log.format,
            level,
            bodies: raw.log.bodies,
        },
        journal: JournalSettings {
            dir: c.dir(&raw.journal.dir),
            max_bytes,
            sync: raw.journal.sync,
        },
        ingress: IngressSettings {
            max_body_bytes,
            max_inflight_bytes,
            dedupe_window,
            credits_per_second,
            keys,
        },
        destinations,
        topics,
        handoff,
        history,
        tracing,
    };
    Ok(Checked {
        settings,
        warnings: c.warnings,
        state_dir: c.state_dir,
    })
}

/// `retain: 0s` turns history off; otherwise at least a second (the
/// partitions it is dropped by are an eighth of it) and at most 90 days.
fn history(c: &mut Checker, h: &super::schema::History) -> Option<HistorySettings> {
    if h.retain.0.is_zero() {
        return None;
    }
    let retain = c.range_dur(
        "history.retain",
        h.retain,
        Duration::from_secs(1),
        Duration::from_secs(90 * 86_400),
    );
    let max_bytes = c.range_u64(
        "history.max_bytes",
        h.max_bytes.0,
        1024 * 1024,
        1024 * 1024 * 1024 * 1024,
    );
    Some(HistorySettings { retain, max_bytes })
}

fn handoff(c: &mut Checker, h: &super::schema::Handoff) -> Option<HandoffSettings> {
    let poll = c.range_dur(
        "handoff.poll",
        h.poll,
        Duration::from_millis(100),
        Duration::from_secs(3600),
    );
    let claim_timeout = c.range_dur(
        "handoff.claim_timeout",
        h.claim_timeout,
        Duration::from_secs(1),
        Duration::from_secs(86_400),
    );
    if claim_timeout <= poll * 2 {
        // A courier stuck adopting refreshes its claim at every look: the
        // claim must outlive two of them.
        c.err(
            "handoff.claim_timeout",
            format!(
                "{} must be more than twice handoff.poll ({}): an adopter refreshes its claims at every look",
                super::units::format_duration(claim_timeout),
                super::units::format_duration(poll)
            ),
        );
    }
    let keys = h
        .encryption_key_env
        .as_deref()
        .map(|var| handoff_keys(c, var))
        .unwrap_or_default();
    match StoreUrl::parse(&h.url) {
        Ok(url) => Some(HandoffSettings {
            url,
            poll,
            claim_timeout,
            keys,
        }),
        Err(e) => {
            c.err("handoff.url", e.to_string());
            None
        }
    }
}

/// `handoff.encryption_key_env`: 1..=4 keys, each 32 bytes of base64,
/// separated by spaces: the new key first during a rotation, the old ones
/// after it until no object sealed with them is left.
fn handoff_keys(c: &mut Checker, var: &str) -> Vec<crate::seal::Key> {
    const MAX_KEYS: usize = 4;
    let p = "handoff.encryption_key_env";
    let Some(value) = c.env_var(p.to_string(), var) else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    for (i, text) in value.split_whitespace().enumerate() {
        match crate::seal::Key::parse(text) {
            Ok(k) => keys.push(k),
            Err(e) => c.err(
                p,
                format!("key {} of environment variable {var} {e}", i + 1),
            ),
        }
    }
    let n = value.split_whitespace().count();
    if !(1..=MAX_KEYS).contains(&n) {
        c.err(
            p,
            format!("environment variable {var} holds {n} keys: allowed 1..={MAX_KEYS}"),
        );
    }
    keys
}

/// `tracing`: an http(s) base URL without credentials, query or fragment
/// (they would end up in every export request and in logs), and a ratio.
fn tracing(c: &mut Checker, t: &super::schema::Tracing) -> Option<TracingSettings> {
    let ratio = t.sample_ratio;
    if !(0.0..=1.0).contains(&ratio) {
        c.err(
            "tracing.sample_ratio",
            format!("{ratio} is out of range: allowed 0..=1"),
        );
    }
    let endpoint = t.otlp_endpoint.trim();
    let problem = match url::Url::parse(endpoint) {
        Err(e) => Some(format!("`{endpoint}` is not a URL: {e}")),
        Ok(u) if !matches!(u.scheme(), "http" | "https") => Some(format!(
            "`{endpoint}` must be an http or https URL, like http://127.0.0.1:4318 (OTLP over HTTP)"
        )),
        Ok(u) if !u.username().is_empty() || u.password().is_some() => {
            Some(format!("`{endpoint}` must not carry credentials"))
        }
        Ok(u) if u.query().is_some() || u.fragment().is_some() => Some(format!(
            "`{endpoint}` must not have a query or fragment: courier appends /v1/traces to it"
        )),
        Ok(u) if u.host_str().is_none_or(str::is_empty) => {
            Some(format!("`{endpoint}` has no host"))
        }
        Ok(_) => None,
    };
    if let Some(message) = problem {
        c.err("tracing.otlp_endpoint", message);
        return None;
    }
    Some(TracingSettings {
        traces_url: format!("{}/v1/traces", endpoint.trim_end_matches('/')),
        sample_ratio: ratio,
    })
}

/// `allowed_hosts`: DNS names (an IP address needs no entry), compared
/// without case and trailing dot.
fn allowed_hosts(c: &mut Checker, names: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let name = name.trim().trim_end_matches('.').to_ascii_lowercase();
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '-')
        };
        if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
            c.err(
                format!("allowed_hosts[{i}]"),
                format!("`{name}` is not a host name: letters, digits and `-` in dot-separated labels, without a port"),
            );
        } else if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// The admin token from `admin_token_env`. Without one, the admin API must
/// stay on loopback: on a pod address anyone in the cluster could pause
/// destinations (docs/http-api.md).
fn admin_token(c: &mut Checker, var: Option<&str>, admin_listen: SocketAddr) -> Option<AdminToken> {
    let Some(var) = var else {
        if !admin_listen.ip().is_loopback() {
            c.err(
                "admin_listen",
                format!("`{admin_listen}` is not a loopback address, so admin_token_env is required: set it to the name of an environment variable holding a bearer token for mutating admin calls"),
            );
        }
        return None;
    };
    if var.trim().is_empty() {
        c.err(
            "admin_token_env",
            "must name an environment variable, like COURIER_ADMIN_TOKEN",
        );
        return None;
    }
    let token = c.env_var("admin_token_env".into(), var)?;
    if token.trim().is_empty() {
        c.err(
            "admin_token_env",
            format!("environment variable {var} is empty: it must hold the admin bearer token"),
        );
        return None;
    }
    Some(AdminToken::new(&token))
}

/// `ingress.keys_from_env`: 1..=4 variables (Event Grid's two keys, with
/// room for a rotation of both), each holding a key.
fn ingress_keys(c: &mut Checker, vars: &[String]) -> IngressKeys {
    const MAX_KEYS: usize = 4;
    let p = "ingress.keys_from_env";
    if vars.is_empty() || vars.len() > MAX_KEYS {
        c.err(
            p,
            format!(
                "{} keys is out of range: allowed 1..={MAX_KEYS}",
                vars.len()
            ),
        );
    }
    let mut keys = Vec::new();
    for (i, var) in vars.iter().enumerate() {
        let item = format!("{p}[{i}]");
        if var.trim().is_empty() {
            c.err(
                item,
                "must name an environment variable, like COURIER_INGRESS_KEY",
            );
            continue;
        }
        let Some(value) = c.env_var(item.clone(), var) else {
            continue;
        };
        if value.trim().is_empty() {
            c.err(
                item,
                format!("environment variable {var} is empty: it must hold a publisher key"),
            );
            continue;
        }
        keys.push(value);
    }
    IngressKeys::new(keys.iter().map(String::as_str))
}

/// What a destination's `max_pending_bytes` may be, and its default.
struct Shares {
    min: u64,
    max: u64,
    default: u64,
}

impl Shares {
    /// The default is half of `journal.max_bytes` when courier has two or
    /// more durable destinations: the common case is a few of them and one
    /// endpoint down, which then buffers up to half the journal while the
    /// others, delivering as they go, keep the other half. With one, all
    /// of it: there is no other to keep room for. A given share must hold
    /// one request (`ingress.max_body_bytes`), or be at least the default
    /// when that is smaller, so that the effective config `check` prints
    /// passes `check`.
    fn new(c: &mut Checker, max_bytes: u64, max_body_bytes: u64, durable: usize) -> Shares {
        let default = if durable > 1 {
            max_bytes / 2
        } else {
            max_bytes
        };
        if durable > 1 && default < max_body_bytes {
            c.warn(
                "journal.max_bytes",
                format!(
                    "half of it ({}) is each destination's default share (max_pending_bytes), less than ingress.max_body_bytes ({}): a larger request is never stored (503 destination_full); raise journal.max_bytes or lower ingress.max_body_bytes",
                    Size(default),
                    Size(max_body_bytes)
                ),
            );
        }
        Shares {
            min: max_body_bytes.min(default),
            max: max_bytes,
            default,
        }
    }

    fn check(&self, c: &mut Checker, p: &str, given: Option<Size>) -> u64 {
        let Some(Size(v)) = given else {
            return self.default;
        };
        if v < self.min || v > self.max {
            c.err(
                format!("{p}.max_pending_bytes"),
                format!(
                    "{} is out of range: allowed {}..={} (at least ingress.max_body_bytes, so that a request fits, or the default share if that is smaller; at most journal.max_bytes)",
                    Size(v),
                    Size(self.min),
                    Size(self.max)
                ),
            );
        }
        v
    }
}

fn destination(
    c: &mut Checker,
    name: &str,
    d: &Destination,
    default_sink: Option<&(SinkAt, Redaction)>,
    shares: &Shares,
) -> DestinationSettings {
    let p = format!("destinations.{name}");
    if !valid_name(name) {
        c.err(&p, format!("name `{name}` {NAME_RULE}"));
    }
    let max_pending_bytes = shares.check(c, &p, d.max_pending_bytes);
    let target = if d.url == PER_EVENT {
        Target::new(String::new(), String::new(), None)
    } else {
        target(c, &format!("{p}.url"), &d.url)
    };
    let timeout = c.range_dur(
        &format!("{p}.timeout"),
        d.timeout,
        Duration::from_millis(10),
        Duration::from_secs(600),
    );
    let passthrough_deadline = c.range_dur(
        &format!("{p}.passthrough_deadline"),
        d.passthrough_deadline,
        Duration::from_millis(10),
        Duration::from_secs(600),
    );
    let tls = d.tls.as_ref().and_then(|spec| tls(c, &p, &target, spec));
    let batch = BatchSettings {
        max_events: c.range_u64(
            &format!("{p}.batch.max_events"),
            d.batch.max_events,
            1,
            5000,
        ) as usize,
        preferred_size: c.range_u64(
            &format!("{p}.batch.preferred_size"),
            d.batch.preferred_size.0,
            1024,
            1024 * 1024,
        ) as usize,
    };
    let (concurrency, adaptive) = concurrency(c, &p, d);
    let super::retry::RetryPlan {
        schedule,
        max_attempts,
        rate_limit_per_second,
    } = super::retry::retry(c, &format!("{p}.retry"), &d.retry);
    let rate_limit_per_second = match (&d.rate_limit, rate_limit_per_second) {
        (Some(_), Some(_)) => {
            c.err(
                format!("{p}.rate_limit"),
                "set either rate_limit or the sns throttlePolicy, not both",
            );
            None
        }
        (Some(r), None) => Some(c.range_u64(
            &format!("{p}.rate_limit.per_second"),
            r.per_second,
            1,
            100_000,
        ) as u32),
        (None, sns) => sns,
    };
    let ttl = c.range_dur(
        &format!("{p}.retry.event_ttl"),
        d.retry.event_ttl,
        Duration::from_secs(60),
        Duration::from_secs(1440 * 60),
    );
    let jitter = d.retry.jitter;
    if !(0.0..=0.5).contains(&jitter) {
        c.err(
            format!("{p}.retry.jitter"),
            format!("{jitter} is out of range: allowed 0..=0.5"),
        );
    }
    let status = status(c, &format!("{p}.status"), d);
    let headers = headers(c, &format!("{p}.headers"), &d.headers);
    let signing = d
        .signing
        .as_ref()
        .map(|spec| signing(c, &format!("{p}.signing"), spec))
        .unwrap_or_default();
    let mut redact = default_sink.map(|(_, r)| r.clone()).unwrap_or_default();
    let dead_letter = match &d.dead_letter {
        None => default_sink.map(|(dir, _)| dir.clone()),
        Some(DeadLetterChoice::Sink(dl)) => {
            redact = redaction(c, &format!("{p}.dead_letter"), dl, &redact);
            sink_at(c, &format!("{p}.dead_letter"), dl)
        }
        Some(DeadLetterChoice::Keyword(k)) if k == "none" => None,
        Some(DeadLetterChoice::Keyword(k)) => {
            c.err(
                format!("{p}.dead_letter"),
                format!("`{k}` is not a sink: write `{{ dir: PATH }}`, `{{ url: s3://bucket/prefix }}` or `none`"),
            );
            None
        }
    };
    if d.mode == Mode::Passthrough {
        passthrough(c, &p, d, &batch, rate_limit_per_second.is_some());
    }
    let ordering = d
        .ordering
        .as_ref()
        .and_then(|o| ordering(c, &format!("{p}.ordering.key"), &o.key));
    let guard = guard(c, &p, d.endpoints.as_ref(), &d.url);
    let per_event = (d.url == PER_EVENT).then(|| {
        let share = EndpointShare {
            destination: max_pending_bytes,
            min: shares.min.min(max_pending_bytes),
        };
        per_event(c, &p, d, concurrency, &batch, share)
    });
    if let (None, Some(spec)) = (&per_event, &d.endpoints) {
        for key in spec.per_event_keys() {
            c.err(
                format!("{p}.endpoints.{key}"),
                "applies to url: per_event only: this destination's url is fixed",
            );
        }
    }
    DestinationSettings {
        name: name.to_string(),
        target,
        schema: d.schema,
        eventgrid_topic: eventgrid_topic(c, &p, name, Some(d.schema), d.eventgrid_topic.as_deref()),
        mode: d.mode,
        max_pending_bytes,
        passthrough_deadline,
        timeout,
        concurrency,
        adaptive,
        schedule,
        limits: Limits { max_attempts, ttl },
        jitter,
        status,
        headers,
        signing,
        dead_letter,
        redact_headers: redact.names(),
        rate_limit_per_second,
        batch,
        probation: probation(c, &format!("{p}.probation"), &d.probation),
        late_answer_window: c.range_dur(
            &format!("{p}.late_answer_window"),
            d.late_answer_window,
            Duration::ZERO,
            Duration::from_secs(3600),
        ),
        tls,
        ordering,
        guard,
        per_event,
    }
}

/// `url: per_event`'s `endpoints` keys. What the destination does that
/// cannot follow one endpoint per event is refused here: a batch (one
/// request, so one endpoint), passthrough (the app waits on one answer
/// from a fixed place); the keys not built yet are refused by name.
/// What an endpoint's share of the journal may be: within its
/// destination's, and holding one request.
struct EndpointShare {
    destination: u64,
    min: u64,
}

fn per_event(
    c: &mut Checker,
    p: &str,
    d: &Destination,
    concurrency: usize,
    batch: &BatchSettings,
    share: EndpointShare,
) -> Arc<PerEvent> {
    let spec = d.endpoints.clone().unwrap_or_default();
    let e = format!("{p}.endpoints");
    let header_name = |c: &mut Checker, key: &str, given: Option<&str>, default: &'static str| {
        let name = given.unwrap_or(default);
        match HeaderName::from_bytes(name.as_bytes()) {
            Ok(h) if !crate::event::rules::HOP_BY_HOP.contains(&h.as_str()) => h,
            _ => {
                c.err(
                    format!("{e}.{key}"),
                    format!("`{name}` is not a header name an app can send: letters, digits and `-`, not a hop-by-hop header"),
                );
                HeaderName::from_static(default)
            }
        }
    };
    let header = header_name(c, "header", spec.header.as_deref(), "courier-endpoint");
    let secret_header = header_name(
        c,
        "secret_header",
        spec.secret_header.as_deref(),
        "courier-endpoint-secret",
    );
    if header == secret_header {
        c.err(
            format!("{e}.secret_header"),
            format!("`{secret_header}` is also endpoints.header: the URL and the secret need a header each"),
        );
    }
    let schemes: Vec<String> = spec
        .schemes
        .clone()
        .unwrap_or_else(|| vec!["https".into()])
        .into_iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    if schemes.is_empty() {
        c.err(
            format!("{e}.schemes"),
            "at least one scheme is needed: https, http",
        );
    }
    for (i, s) in schemes.iter().enumerate() {
        if s != "https" && s != "http" {
            c.err(
                format!("{e}.schemes[{i}]"),
                format!("`{s}` is not a scheme courier sends with: allowed https, http"),
            );
        }
    }
    let per_endpoint = c.range_u64(
        &format!("{e}.concurrency"),
        spec.concurrency.unwrap_or(4),
        1,
        MAX_CONCURRENCY,
    ) as usize;
    if per_endpoint > concurrency && spec.concurrency.is_some() {
        c.err(
            format!("{e}.concurrency"),
            format!("{per_endpoint} is more than the destination's concurrency ({concurrency}): one endpoint's attempts are within the destination's"),
        );
    }
    let max_tracked = c.range_u64(
        &format!("{e}.max_tracked"),
        spec.max_tracked.unwrap_or(100_000),
        1,
        10_000_000,
    ) as usize;
    let max_idle_connections = c.range_u64(
        &format!("{e}.max_idle_connections"),
        spec.max_idle_connections.unwrap_or(MAX_IDLE_CONNECTIONS),
        0,
        1_000_000,
    ) as usize;
    // A quarter of the destination's by default: a few endpoints down
    // leave the others room.
    let max_pending_bytes = match spec.max_pending_bytes {
        None => (share.destination / 4).max(share.min),
        Some(given) => {
            if given.0 < share.min || given.0 > share.destination {
                c.err(
                    format!("{e}.max_pending_bytes"),
                    format!(
                        "{given} is out of range: allowed {}..={} (at least ingress.max_body_bytes, so that a request fits; at most the destination's max_pending_bytes)",
                        Size(share.min),
                        Size(share.destination)
                    ),
                );
            }
            given.0
        }
    };
    // Off with 0s; else long enough that one failed attempt cannot do it.
    let disable_after = match spec.disable_after {
        Some(d) if d.0.is_zero() => None,
        given => Some(c.range_dur(
            &format!("{e}.disable_after"),
            given.unwrap_or(Dur(DISABLE_AFTER)),
            Duration::from_millis(100),
            Duration::from_secs(365 * 86_400),
        )),
    };
    if batch.enabled() {
        c.err(
            format!("{p}.batch.max_events"),
            "a batch is one request to one endpoint: a per_event destination sends each event alone (max_events: 1)",
        );
    }
    if d.mode == Mode::Passthrough {
        c.err(
            format!("{p}.mode"),
            "passthrough answers the app with one fixed endpoint's answer: a per_event destination is durable",
        );
    }
    if matches!(d.concurrency, Some(Concurrency::Adaptive { .. })) {
        c.err(
            format!("{p}.concurrency.adaptive"),
            "learns one endpoint's capacity: with per_event, one slow endpoint would lower every other's; set a number, and endpoints.concurrency per endpoint",
        );
    }
    Arc::new(PerEvent {
        header,
        secret_header,
        schemes,
        concurrency: per_endpoint.min(concurrency),
        max_tracked,
        max_idle_connections,
        max_pending_bytes,
        disable_after,
        notify: spec.notify.clone(),
    })
}

/// Idle connections a `per_event` destination keeps by default: ~26 KiB
/// each (~260 MiB at the bound), enough for 10,000 endpoints getting an
/// event a second each to reuse theirs (docs/endpoints.md).
const MAX_IDLE_CONNECTIONS: u64 = 10_000;

/// An endpoint failing with no success this long is disabled.
const DISABLE_AFTER: Duration = Duration::from_secs(5 * 86_400);

/// `endpoints.notify` names a destination that can take courier's own
/// events: one with a fixed url, durable (a notification has no app
/// waiting for an answer).
fn notify_targets(c: &mut Checker, all: &std::collections::BTreeMap<String, Destination>) {
    for (name, d) in all {
        let Some(target) = d.endpoints.as_ref().and_then(|e| e.notify.as_deref()) else {
            continue;
        };
        let path = format!("destinations.{name}.endpoints.notify");
        match all.get(target) {
            None => {
                let names: Vec<&str> = all.keys().map(String::as_str).collect();
                c.err(
                    path,
                    format!("`{target}` is not a destination: one of {}", names.join(", ")),
                );
            }
            Some(t) if t.url == PER_EVENT => c.err(
                path,
                format!("`{target}` has url: per_event: notifications go to a destination with a fixed url, the app's own endpoint"),
            ),
            Some(t) if t.mode == Mode::Passthrough => c.err(
                path,
                format!("`{target}` is passthrough: a notification has no app waiting for its answer, name a durable destination"),
            ),
            Some(_) => {}
        }
    }
}

/// `endpoints`' address guard: off for a fixed url unless `guard: on`; a
/// guarded url whose host is an IP literal the guard refuses could never
/// be delivered, so it is refused here.
fn guard(
    c: &mut Checker,
    p: &str,
    spec: Option<&super::schema::EndpointsSpec>,
    url: &str,
) -> Option<Arc<crate::policy::address::Guard>> {
    use super::schema::Toggle;
    let per_event = url == PER_EVENT;
    let default = super::schema::EndpointsSpec::default();
    let spec = match spec {
        Some(spec) => spec,
        None if per_event => &default,
        None => return None,
    };
    let on = match &spec.guard {
        None => per_event,
        Some(Toggle::Bool(on)) => *on,
        Some(Toggle::Word(w)) if w == "on" => true,
        Some(Toggle::Word(w)) if w == "off" => false,
        Some(Toggle::Word(w)) => {
            c.err(
                format!("{p}.endpoints.guard"),
                format!("`{w}` is not a switch: allowed on, off"),
            );
            false
        }
    };
    let mut allow = Vec::new();
    for (i, cidr) in spec.allow_cidrs.iter().enumerate() {
        let net = cidr
            .parse::<ipnet::IpNet>()
            .or_else(|_| cidr.parse::<std::net::IpAddr>().map(ipnet::IpNet::from));
        match net {
            Ok(net) => allow.push(net),
            Err(_) => c.err(
                format!("{p}.endpoints.allow_cidrs[{i}]"),
                format!("`{cidr}` is not a CIDR range: expected an address and a prefix length, e.g. 10.20.0.0/16 or fd00::/64"),
            ),
        }
    }
    if !on {
        if !allow.is_empty() {
            c.err(
                format!("{p}.endpoints.allow_cidrs"),
                "opens ranges of the address guard, which is off for this destination: add `guard: on`",
            );
        }
        return None;
    }
    let guard = crate::policy::address::Guard::new(allow);
    let literal = url
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().and_then(crate::policy::address::literal));
    if let Some(ip) = literal
        && !guard.allows(ip)
    {
        c.err(
            format!("{p}.url"),
            format!("the address guard (endpoints.guard: on) refuses {ip}, a private or reserved address: open it with endpoints.allow_cidrs"),
        );
    }
    Some(Arc::new(guard))
}

/// `ordering.key` at `path`.
fn ordering(
    c: &mut Checker,
    path: &str,
    key: &OrderingKeySpec,
) -> Option<crate::event::ordering::Key> {
    use crate::event::ordering::Key;
    let kinds = "write `destination`, `{ header: NAME }` or `{ from_event: FIELD }`";
    match key {
        OrderingKeySpec::Keyword(k) if k == "destination" => Some(Key::Destination),
        OrderingKeySpec::Keyword(k) => {
            c.err(path, format!("`{k}` is not an ordering key: {kinds}"));
            None
        }
        OrderingKeySpec::Source(KeySource {
            header: Some(name),
            from_event: None,
        }) => match HeaderName::from_bytes(name.as_bytes()) {
            Ok(h) => Some(Key::Header(h.as_str().to_string())),
            Err(_) => {
                c.err(
                    format!("{path}.header"),
                    format!("`{name}` is not a valid header name"),
                );
                None
            }
        },
        OrderingKeySpec::Source(KeySource {
            header: None,
            from_event: Some(field),
        }) => match EventPath::parse(field) {
            Ok(p) => Some(Key::FromEvent(p)),
            Err(e) => {
                c.err(format!("{path}.from_event"), e.to_string());
                None
            }
        },
        OrderingKeySpec::Source(_) => {
            c.err(path, format!("name exactly one source: {kinds}"));
            None
        }
    }
}

/// The most attempts in flight a destination may be given, fixed or adaptive.
const MAX_CONCURRENCY: u64 = 1024;

/// `concurrency`: the cap on attempts in flight (the number, or adaptive's
/// `max`) and adaptive's bounds, `min <= initial <= max`. A key left out
/// that breaks that order is named as the default, so that `max: 8` alone
/// does not read as an error about a key never written.
fn concurrency(c: &mut Checker, p: &str, d: &Destination) -> (usize, Option<Bounds>) {
    let key = format!("{p}.concurrency");
    let given = d
        .concurrency
        .unwrap_or(Concurrency::Fixed(super::schema::default_concurrency(
            d.mode,
        )));
    let spec = match given {
        Concurrency::Fixed(n) => return (c.range_u64(&key, n, 1, MAX_CONCURRENCY) as usize, None),
        Concurrency::Adaptive { adaptive } => adaptive,
    };
    let at = |name: &str| format!("{key}.adaptive.{name}");
    let how = |v: Option<u64>| if v.is_some() { "" } else { " (the default)" };
    let filled = spec.filled();
    let [min, max, initial] = [filled.min, filled.max, filled.initial].map(|v| v.unwrap_or(0));
    let mut ranged = true;
    for (name, v) in [("min", min), ("max", max), ("initial", initial)] {
        c.range_u64(&at(name), v, 1, MAX_CONCURRENCY);
        ranged &= (1..=MAX_CONCURRENCY).contains(&v);
    }
    if ranged {
        if min > max {
            c.err(
                at("max"),
                format!("{max}{} is less than min ({min})", how(spec.max)),
            );
        } else if !(min..=max).contains(&initial) {
            c.err(
                at("initial"),
                format!(
                    "{initial}{} is out of range: allowed min..=max, here {min}..={max}",
                    how(spec.initial)
                ),
            );
        }
    }
    let bounds = Bounds {
        min: min as usize,
        max: max as usize,
        initial: initial as usize,
    };
    (bounds.max, Some(bounds))
}

/// A route's Event Grid topic when the config names none: stable across
/// restarts and reloads, and unlike any Azure resource id.
pub(super) fn default_eventgrid_topic(name: &str) -> String {
    format!("/courier/{name}")
}

/// `eventgrid_topic` of the destination or topic `name` at `p`: the given
/// name, else `/courier/<name>`. Refused beside another schema, where no
/// event would carry it.
pub(super) fn eventgrid_topic(
    c: &mut Checker,
    p: &str,
    name: &str,
    schema: Option<Schema>,
    given: Option<&str>,
) -> String {
    let Some(given) = given else {
        return default_eventgrid_topic(name);
    };
    let key = format!("{p}.eventgrid_topic");
    if let Some(other) = schema.filter(|&s| s != Schema::Eventgrid) {
        c.err(
            &key,
            format!(
                "applies to schema eventgrid only (this is {}): it names the Event Grid topic of the events",
                other.as_str()
            ),
        );
    }
    if given.trim().is_empty() {
        c.err(&key, "must not be empty: omit the key for /courier/<name>");
    }
    given.to_string()
}

/// What passthrough cannot do, refused rather than ignored: it forwards one
/// request as the app sent it, at the app's pace, and journals nothing.
fn passthrough(
    c: &mut Checker,
    p: &str,
    d: &Destination,
    batch: &BatchSettings,
    rate_limited: bool,
) {
    if d.schema != Schema::Custom {
        c.err(
            format!("{p}.schema"),
            format!(
                "passthrough forwards the app's request as it is, so its schema must be custom, not {}",
                d.schema.as_str()
            ),
        );
    }
    if batch.enabled() {
        c.err(
            format!("{p}.batch.max_events"),
            "passthrough sends each request alone, as the app waits for its answer: batching needs mode durable",
        );
    }
    if d.ordering.is_some() {
        c.err(
            format!("{p}.ordering"),
            "passthrough sends each request at once, as the app waits for its answer: ordering needs mode durable",
        );
    }
    if let Some(Concurrency::Adaptive { .. }) = d.concurrency {
        c.err(
            format!("{p}.concurrency.adaptive"),
            "passthrough goes at the app's pace, as the app waits for its answer: adaptive concurrency needs mode durable",
        );
    }
    if rate_limited {
        let key = if d.rate_limit.is_some() {
            "rate_limit"
        } else {
            "retry.schedule.sns.throttlePolicy"
        };
        c.err(
            format!("{p}.{key}"),
            "passthrough goes at the app's pace, as the app waits for its answer: a rate limit needs mode durable",
        );
    }
}

/// `tls`: every file is loaded as a handshake would load it, so that a bad
/// one stops `run` (or a reload) with its key path rather than failing
/// every delivery. For `check`, which may run where the certificates are
/// not mounted, a missing file is a warning.
fn tls(c: &mut Checker, p: &str, target: &Target, spec: &TlsSpec) -> Option<TlsFiles> {
    let p = format!("{p}.tls");
    if target.is_plain_http() {
        c.err(
            &p,
            "the url is http://, and tls applies to https:// only: use https or remove tls",
        );
    }
    let client = match (&spec.client_cert, &spec.client_key) {
        (Some(cert), Some(key)) => Some((c.dir(cert), c.dir(key))),
        (None, None) => None,
        (Some(_), None) => {
            c.err(format!("{p}.client_cert"), "needs client_key too");
            None
        }
        (None, Some(_)) => {
            c.err(format!("{p}.client_key"), "needs client_cert too");
            None
        }
    };
    let files = TlsFiles {
        ca_file: spec.ca_file.as_deref().map(|f| c.dir(f)),
        client,
    };
    if let Err(e) = crate::tls::check(&files) {
        let key = match e.path() {
            Some(path) if Some(path) == files.ca_file.as_deref() => "ca_file",
            Some(path) if files.client.as_ref().is_some_and(|(cert, _)| cert == path) => {
                "client_cert"
            }
            _ => "client_key",
        };
        let missing = matches!(&e, TlsFileError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound);
        if missing && c.purpose == Purpose::Check {
            c.warn(format!("{p}.{key}"), e.to_string());
        } else {
            c.err(format!("{p}.{key}"), e.to_string());
        }
    }
    (files.ca_file.is_some() || files.client.is_some()).then_some(files)
}

/// What `valid_name` refuses, said once for destinations and topics.
pub(super) const NAME_RULE: &str = "must be letters, digits, `-`, `_`, `.` or `~` (it is a url path segment and a folder name), and not `.` or `..`";

fn target(c: &mut Checker, path: &str, url: &str) -> Target {
    let fallback = Target::new(String::new(), String::new(), None);
    let uri: http::Uri = match url.parse() {
        Ok(u) => u,
        Err(_) => {
            c.err(
                path,
                format!("`{url}` is not a url: expected https://host[:port]/path"),
            );
            return fallback;
        }
    };
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        c.err(
            path,
            format!("`{url}` is not an absolute url: expected https://host[:port]/path"),
        );
        return fallback;
    };
    if scheme != "http" && scheme != "https" {
        c.err(
            path,
            format!("`{url}` has scheme `{scheme}`: allowed http, https"),
        );
    }
    if authority.as_str().contains('@') {
        c.err(path, "credentials in the url are not allowed: use a header with `from_env` and `secret: true`");
    }
    Target::new(
        format!("{scheme}://{authority}"),
        uri.path().trim_end_matches('/').to_string(),
        uri.query().map(str::to_string),
    )
}

fn probation(c: &mut Checker, path: &str, spec: &super::schema::ProbationSpec) -> ProbationPolicy {
    let threshold = c.range_u64(
        &format!("{path}.after_failures"),
        spec.after_failures.into(),
        0,
        1000,
    ) as u32;
    let max = c.range_dur(
        &format!("{path}.max"),
        spec.max,
        Duration::from_secs(1),
        Duration::from_secs(24 * 3600),
    );
    let mut overrides = Vec::new();
    for (name, d) in &spec.durations {
        let p = format!("{path}.durations.{name}");
        match Outcome::parse(name) {
            Some(Outcome::BadRequest | Outcome::PayloadTooLarge | Outcome::AddressNotAllowed) => c.err(
                p,
                format!("`{name}` never starts a probation: it says the event is bad, not the endpoint"),
            ),
            Some(outcome) if !matches!(outcome, Outcome::Delivered | Outcome::Probation) => {
                overrides.push((outcome, c.range_dur(&p, *d, Duration::from_millis(10), max)))
            }
            _ => c.err(
                p,
                format!(
                    "`{name}` is not an outcome: allowed Unauthorized, Forbidden, NotFound, Gone, TimedOut, Busy, Failed, SocketError, ResolutionError, TlsError"
                ),
            ),
        }
    }
    ProbationPolicy {
        threshold,
        overrides,
        max,
    }
}

/// `404`, `"5xx"` or `"500-599"`.
pub fn parse_codes(key: &StatusKey) -> Result<Codes, String> {
    let bad = || {
        format!(
            "`{key}` is not a status: write a code (404), a class (5xx) or a range (500-599) within 200..=599"
        )
    };
    let (lo, hi) = match key {
        StatusKey::Code(n) => (
            u16::try_from(*n).map_err(|_| bad())?,
            u16::try_from(*n).map_err(|_| bad())?,
        ),
        StatusKey::Text(t) => {
            let t = t.trim();
            if let Some(class) = t.strip_suffix("xx").or_else(|| t.strip_suffix("XX")) {
                let d: u16 = class
                    .parse()
                    .ok()
                    .filter(|d| (2..=5).contains(d))
                    .ok_or_else(bad)?;
                (d * 100, d * 100 + 99)
            } else if let Some((a, b)) = t.split_once('-') {
                (
                    a.trim().parse().map_err(|_| bad())?,
                    b.trim().parse().map_err(|_| bad())?,
                )
            } else {
                let n: u16 = t.parse().map_err(|_| bad())?;
                (n, n)
            }
        }
    };
    if lo > hi || lo < 200 || hi > 599 {
        return Err(bad());
    }
    Ok(lo..=hi)
}

fn status(c: &mut Checker, path: &str, d: &Destination) -> StatusPolicy {
    let list = |c: &mut Checker, key: &str, keys: &[StatusKey]| -> Vec<Codes> {
        keys.iter()
            .enumerate()
            .filter_map(|(i, k)| {
                parse_codes(k)
                    .map_err(|e| c.err(format!("{path}.{key}[{i}]"), e))
                    .ok()
            })
            .collect()
    };
    let success = list(c, "success", &d.status.success);
    let no_retry = if d.status.no_retry.is_empty() {
        StatusPolicy::default().no_retry
    } else {
        list(c, "no_retry", &d.status.no_retry)
    };
    for s in &success {
        if no_retry
            .iter()
            .any(|n| n.start() <= s.end() && s.start() <= n.end())
        {
            c.err(
                format!("{path}.success"),
                format!(
                    "{}-{} is also in no_retry: a status is either success or not",
                    s.start(),
                    s.end()
                ),
            );
        }
    }
    let mut min_delay = Vec::new();
    for (k, v) in &d.status.min_delay {
        let p = format!("{path}.min_delay.{k}");
        match parse_codes(k) {
            Ok(codes) => min_delay.push((
                codes,
                c.range_dur(&p, *v, Duration::ZERO, Duration::from_secs(1440 * 60)),
            )),
            Err(e) => c.err(p, e),
        }
    }
    // Single codes before ranges, so `503: 1s` wins over `5xx: 10s`.
    min_delay.sort_by_key(|(codes, _)| codes.end() - codes.start());
    StatusPolicy {
        success,
        no_retry,
        min_delay,
    }
}

/// App headers left out of dead-letter records unless an operator keeps
/// them (docs/dead-letters.md): credentials for the endpoint, which a record at rest
/// must not hold.
const REDACTED_BY_DEFAULT: [&str; 3] = ["authorization", "proxy-authorization", "cookie"];

/// The header names a sink leaves out of its records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Redaction {
    redact: Vec<String>,
    /// Default names an operator took back with `keep_headers`.
    kept: Vec<String>,
}

impl Default for Redaction {
    fn default() -> Self {
        Redaction {
            redact: REDACTED_BY_DEFAULT.map(String::from).to_vec(),
            kept: Vec::new(),
        }
    }
}

impl Redaction {
    pub(super) fn names(&self) -> Vec<String> {
        self.redact
            .iter()
            .filter(|n| !self.kept.contains(n))
            .cloned()
            .collect()
    }
}

/// Where a sink is: `dir` or `url`, exactly one.
fn sink_at(c: &mut Checker, path: &str, sink: &DeadLetterSpec) -> Option<SinkAt> {
    match (&sink.dir, &sink.url) {
        (Some(dir), None) => Some(SinkAt::Dir(c.dir(dir))),
        (None, Some(url)) => match StoreUrl::parse(url) {
            Ok(url) => Some(SinkAt::Bucket(url)),
            Err(e) => {
                c.err(format!("{path}.url"), e.to_string());
                None
            }
        },
        (Some(_), Some(_)) => {
            c.err(
                path,
                "has both `dir` and `url`: a sink is one directory or one bucket",
            );
            None
        }
        (None, None) => {
            c.err(
                path,
                "needs `dir: PATH` or `url: s3://bucket/prefix` (or az://, gs://, file:///)",
            );
            None
        }
    }
}

/// A sink's `redact_headers` and `keep_headers` over what it inherits (the
/// defaults, or the global sink's): names are added by the one and taken
/// back from the defaults by the other.
fn redaction(
    c: &mut Checker,
    path: &str,
    sink: &DeadLetterSpec,
    inherited: &Redaction,
) -> Redaction {
    let mut out = inherited.clone();
    for name in redact_headers(c, &format!("{path}.redact_headers"), &sink.redact_headers) {
        out.kept.retain(|k| *k != name);
        if !out.redact.contains(&name) {
            out.redact.push(name);
        }
    }
    let keep = redact_headers(c, &format!("{path}.keep_headers"), &sink.keep_headers);
    for (i, name) in keep.into_iter().enumerate() {
        let p = format!("{path}.keep_headers[{i}]");
        if sink
            .redact_headers
            .iter()
            .any(|r| r.trim().eq_ignore_ascii_case(&name))
        {
            c.err(
                p,
                format!("`{name}` is also in redact_headers: keep it or redact it"),
            );
        } else if !REDACTED_BY_DEFAULT.contains(&name.as_str()) {
            c.err(
                p,
                format!(
                    "`{name}` is not redacted by default: keep_headers takes back only {}",
                    REDACTED_BY_DEFAULT.join(", ")
                ),
            );
        } else if !out.kept.contains(&name) {
            out.kept.push(name);
        }
    }
    out
}

/// `redact_headers`: valid header names, kept lowercase (as forwarded).
fn redact_headers(c: &mut Checker, path: &str, names: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        match HeaderName::from_bytes(name.trim().as_bytes()) {
            Ok(h) if !out.iter().any(|o| o == h.as_str()) => out.push(h.as_str().to_string()),
            Ok(_) => {}
            Err(_) => c.err(
                format!("{path}[{i}]"),
                format!("`{name}` is not a valid header name"),
            ),
        }
    }
    out
}

fn headers(
    c: &mut Checker,
    path: &str,
    specs: &std::collections::BTreeMap<String, HeaderSpec>,
) -> Vec<CustomHeader> {
    if specs.len() > MAX_HEADERS {
        c.err(
            path,
            format!("{} headers: at most {MAX_HEADERS} are allowed", specs.len()),
        );
    }
    let mut out = Vec::new();
    for (name, spec) in specs {
        let p = format!("{path}.{name}");
        let Ok(header) = HeaderName::from_bytes(name.as_bytes()) else {
            c.err(&p, format!("`{name}` is not a valid header name"));
            continue;
        };
        let lower = header.as_str();
        if RESERVED_HEADERS.contains(&lower) || lower.starts_with("courier-") {
            c.err(
                &p,
                format!("`{name}` is set by courier and cannot be overridden"),
            );
            continue;
        }
        if out.iter().any(|h: &CustomHeader| h.name == header) {
            c.err(
                &p,
                format!("`{name}` is already set: header names ignore case"),
            );
            continue;
        }
        // The text, the key it came from, and how to name it in a message
        // (a variable's value is described, never shown).
        let (value, key, what) = match (&spec.value, &spec.from_env, &spec.from_event) {
            (Some(v), None, None) => (v.clone(), p.clone(), "value".to_string()),
            (None, Some(var), None) => match c.env_var(format!("{p}.from_env"), var) {
                Some(v) => (
                    v,
                    format!("{p}.from_env"),
                    format!("value of environment variable {var}"),
                ),
                None => continue,
            },
            (None, None, Some(field)) => {
                match EventPath::parse(field) {
                    Ok(path) => out.push(CustomHeader {
                        name: header,
                        value: HeaderSource::FromEvent {
                            path,
                            secret: spec.secret,
                        },
                    }),
                    Err(e) => c.err(format!("{p}.from_event"), e.to_string()),
                }
                continue;
            }
            _ => {
                c.err(&p, "needs exactly one of value, from_env, from_event");
                continue;
            }
        };
        if value.len() > MAX_HEADER_VALUE {
            c.err(
                key,
                format!(
                    "{what} is {} bytes: at most {MAX_HEADER_VALUE} are allowed",
                    value.len()
                ),
            );
            continue;
        }
        let Ok(mut value) = HeaderValue::from_str(&value) else {
            c.err(
                key,
                format!("{what} has characters that are not allowed in a header"),
            );
            continue;
        };
        value.set_sensitive(spec.secret);
        out.push(CustomHeader {
            name: header,
            value: HeaderSource::Fixed(value),
        });
    }
    out
}

/// `signing.secrets_from_env`: 1..=3 variables, each holding a Standard
/// Webhooks secret. Three covers a rotation (old and new key) with one to
/// spare; every extra key costs one HMAC per attempt and header bytes.
fn signing(c: &mut Checker, path: &str, spec: &SigningSpec) -> Vec<Secret> {
    let p = format!("{path}.secrets_from_env");
    let n = spec.secrets_from_env.len();
    if !(1..=MAX_SIGNING_SECRETS).contains(&n) {
        c.err(
            &p,
            format!("{n} secrets is out of range: allowed 1..={MAX_SIGNING_SECRETS}"),
        );
    }
    let mut secrets = Vec::new();
    for (i, var) in spec.secrets_from_env.iter().enumerate() {
        let item = format!("{p}[{i}]");
        let Some(value) = c.env_var(item.clone(), var) else {
            continue;
        };
        match Secret::parse(&value) {
            Ok(s) => secrets.push(s),
            Err(e) => c.err(item, format!("environment variable {var} {e}")),
        }
    }
    secrets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_keys_parse_codes_classes_and_ranges() {
        assert_eq!(parse_codes(&StatusKey::Code(404)), Ok(404..=404));
        assert_eq!(parse_codes(&StatusKey::Text("5xx".into())), Ok(500..=599));
        assert_eq!(
            parse_codes(&StatusKey::Text("500-504".into())),
            Ok(500..=504)
        );
        assert!(parse_codes(&StatusKey::Text("6xx".into())).is_err());
        assert!(parse_codes(&StatusKey::Text("504-500".into())).is_err());
        assert!(parse_codes(&StatusKey::Code(99)).is_err());
        assert!(parse_codes(&StatusKey::Code(-1)).is_err());
    }
}
