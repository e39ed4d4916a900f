//! Steps o and t (issue #32): object storage, on a real S3 API —
//! `moto_server` (PyPI `moto[server]`, from `tests/py/requirements.txt`),
//! started by the step on a free loopback port and killed at its end.
//! Courier reads the store's credentials and endpoint from the environment
//! only (`support::stores::s3_env`).
//!
//! o. a mass expiry, as step x, to `dead_letter: { url: s3://… }`;
//! t. the hand-off of a paused destination's backlog at SIGTERM (courier
//!    A), and its adoption by a courier with an empty journal (B).

use std::path::Path;
use std::time::{Duration, Instant};

use support::client::{sum_metric, try_get};
use support::stores::{Moto, s3_env};

use super::{
    Args, DEADLINE, DESTINATION, MIB, PENDING, POLL, Row, admin_action, backlog, config,
    cpu_seconds, expire, fill, metric, proc_status, start_yaml,
};

const BUCKET: &str = "courier-bench";
/// Step o's sink: `s3://BUCKET/DL_PREFIX`.
const DL_PREFIX: &str = "dl";
/// Step t's store: `s3://BUCKET/HANDOFF_PREFIX`.
const HANDOFF_PREFIX: &str = "handoff";
/// Step t's backlog, before `--scale`.
pub const HANDOFF_BACKLOG: f64 = 100_000.0;
/// Step t's `shutdown_grace`, courier's default. Nothing is in flight (the
/// destination is paused), so the grace is not waited out; but the
/// hand-off's own deadline is as long again (`src/lib.rs`), and a shorter
/// one would cut it off rather than time it.
const GRACE: &str = "20s";
/// How often a courier's VmHWM and CPU are sampled while it runs.
const SAMPLE: Duration = Duration::from_millis(10);
const ADOPTED: &str = r#"courier_handoff_events_total{direction="adopted"}"#;
/// B's log line for each object adopted.
const ADOPTION: &str = "adopted a hand-off";
const OBJECT_REQUESTS: &str = "courier_object_store_requests_total";
/// Step o's budget (issue #32): dead letters to a bucket at this rate.
pub const BUCKET_EXPIRY_RATE: f64 = 20_000.0;
/// Step t's budgets (issue #32): each side within this long, and this RSS.
pub const HANDOFF_SECONDS: f64 = 10.0;
pub const HANDOFF_RSS_MIB: f64 = 64.0;
/// Step t's budget (issue #43): sealed objects at this share of the rate
/// in the clear, each side.
pub const SEALED_RATIO: f64 = 0.8;
/// The key of step t's sealed run: 32 bytes of base64.
const HANDOFF_KEY: &str = "q83vEjRWeJC6u8zd7v8AESIzRFVmd4iZqrvM3e7/ABE=";

/// Every key under `prefix` in the bucket of `moto` (unsigned
/// ListObjectsV2 pages, which moto answers): the names alone, where the
/// tests' boto3 reader fetches every object too.
async fn keys(moto: &Moto, prefix: &str) -> Result<Vec<String>, String> {
    use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
    let mut keys = Vec::new();
    let mut token: Option<String> = None;
    // Bounded: up to 1,000 keys a page; no step stores 10M objects.
    for _ in 0..10_000 {
        let mut url = format!(
            "{}/{BUCKET}?list-type=2&prefix={}",
            moto.endpoint(),
            utf8_percent_encode(prefix, NON_ALPHANUMERIC)
        );
        if let Some(t) = &token {
            url.push_str("&continuation-token=");
            url.extend(utf8_percent_encode(t, NON_ALPHANUMERIC));
        }
        let resp = try_get(&url).await?;
        let xml = resp.text();
        if resp.status != 200 {
            return Err(format!("GET {url}: {}: {xml}", resp.status));
        }
        keys.extend(elements(&xml, "Key"));
        let truncated = elements(&xml, "IsTruncated").first().map(String::as_str) == Some("true");
        match elements(&xml, "NextContinuationToken").pop() {
            Some(next) if truncated => token = Some(next),
            _ => return Ok(keys),
        }
    }
    Err(format!("more than 10,000 pages of keys under {prefix}"))
}

/// The text of every `<name>…</name>` in `xml`, XML escapes undone.
fn elements(xml: &str, name: &str) -> Vec<String> {
    let (open, close) = (format!("<{name}>"), format!("</{name}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    // Bounded: each round moves past one element.
    while let Some(at) = rest.find(&open) {
        let inner = &rest[at + open.len()..];
        let Some(end) = inner.find(&close) else {
            break;
        };
        out.push(
            inner[..end]
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&amp;", "&"),
        );
        rest = &inner[end + close.len()..];
    }
    out
}

/// `s3_env` for `Courier::start_with_env`.
fn env_of<'a>(vars: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    vars.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// The number after ` key=` in a text log line.
fn field(line: &str, key: &str) -> Option<f64> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.trim_matches('"').parse().ok())
}

/// The `took_ms` of every log line holding `message`: count, sum, max.
fn took(logs: &str, message: &str) -> (usize, f64, f64) {
    let times: Vec<f64> = logs
        .lines()
        .filter(|l| l.contains(message))
        .filter_map(|l| field(l, "took_ms"))
        .collect();
    let max = times.iter().copied().fold(0.0, f64::max);
    (times.len(), times.iter().sum(), max)
}

/// The count a name ends with: `…-<count>.<ext>`, as both object kinds
/// are named (dead-letter parts and hand-off objects).
fn count_in_name(key: &str, ext: &str) -> Option<u64> {
    key.strip_suffix(ext)?.rsplit('-').next()?.parse().ok()
}

/// The last VmHWM and CPU seen of a running process, and the most of its
/// RSS's parts seen (at each sample: what VmHWM does not tell apart).
#[derive(Default)]
struct Seen {
    hwm: Option<u64>,
    cpu: Option<f64>,
    anon: u64,
    file: u64,
}

impl Seen {
    /// Keeps what it saw before once the process is gone.
    fn sample(&mut self, pid: u32) {
        if let Some(hwm) = proc_status(pid, "VmHWM") {
            self.hwm = Some(hwm);
        }
        if let Some(cpu) = cpu_seconds(pid) {
            self.cpu = Some(cpu);
        }
        self.anon = self.anon.max(proc_status(pid, "RssAnon").unwrap_or(0));
        self.file = self.file.max(proc_status(pid, "RssFile").unwrap_or(0));
    }

    /// "RssAnon X, RssFile Y MiB", the most of each seen.
    fn parts(&self) -> String {
        format!(
            "RssAnon {:.1}, RssFile {:.1} MiB",
            self.anon as f64 / MIB,
            self.file as f64 / MIB
        )
    }
}

/// Step o: step x's mass expiry, the dead letters written to a bucket.
/// The row, the rate from the restart to all dead-lettered, and the peak
/// RSS since the restart.
pub async fn bucket_expiry(
    label: &str,
    bin: &Path,
    rx: &str,
    args: &Args,
) -> Result<(Row, f64, u64), String> {
    let events = backlog(super::EXPIRY_BACKLOG, args);
    let moto = Moto::try_start(BUCKET).await?;
    let vars = s3_env(&moto.endpoint());
    let extra = format!(
        "    retry: {{ event_ttl: 1h }}\n    dead_letter: {{ url: s3://{BUCKET}/{DL_PREFIX} }}\n"
    );
    let mut run = start_yaml(bin, &config(rx, &extra), &env_of(&vars)).await?;
    let filled = fill(&run.courier, events, args).await?;
    let (took, pid) = expire(&mut run, events).await?;
    let c = &run.courier;
    let hwm = proc_status(pid, "VmHWM").unwrap_or(0);
    let cpu = cpu_seconds(pid);
    let rss_parts: Vec<String> = ["RssAnon", "RssFile"]
        .iter()
        .map(|k| format!("{k} {:.1}", proc_status(pid, k).unwrap_or(0) as f64 / MIB))
        .collect();
    let requests = match try_get(&format!("{}/metrics", c.admin_url())).await {
        Ok(resp) => {
            let text = resp.text();
            // + 0.0: an empty sum is -0.
            let of =
                |op: &str| sum_metric(&text, &format!(r#"{OBJECT_REQUESTS}{{op="{op}"}}"#)) + 0.0;
            format!(
                "{:.0} PUTs, {:.0} GETs, {:.0} LISTs",
                of("put"),
                of("get"),
                of("list")
            )
        }
        Err(e) => format!("no metrics: {e}"),
    };
    let keys = keys(&moto, &format!("{DL_PREFIX}/{DESTINATION}/")).await?;
    let parts: Vec<u64> = keys
        .iter()
        .filter(|k| !k.contains("/replayed/"))
        .filter_map(|k| count_in_name(k, ".jsonl"))
        .collect();
    let records: u64 = parts.iter().sum();
    if records != events {
        return Err(format!(
            "{records} dead-letter records in {} objects for {events} events",
            parts.len()
        ));
    }
    let rate = events as f64 / took.as_secs_f64();
    let row = Row {
        target: format!("{label} o. mass expiry {events} to a bucket"),
        rate: Some(rate),
        cpu,
        events: Some(events as f64),
        rss: Some(hwm),
        note: format!(
            "moto_server; {filled}; restart to all dead-lettered {:.1} s ({rate:.0} events/s); {records} records in {} objects by their names ({:.0} a PUT); {requests} to the store; at the end {} MiB. CPU: courier's since the restart",
            took.as_secs_f64(),
            parts.len(),
            records as f64 / parts.len().max(1) as f64,
            rss_parts.join(", "),
        ),
        ..Row::default()
    };
    Ok((row, rate, hwm))
}

/// What step t measured, for its budgets.
pub struct HandOff {
    pub rows: Vec<Row>,
    /// The hand-off as A's summary line times it (`took_ms`).
    pub written: Duration,
    /// From B's spawn to every event adopted.
    pub adopted: Duration,
    /// SIGTERM to A's exit.
    pub wall: Duration,
    /// A's peak RSS over its life (filling included), and B's.
    pub hwm_a: u64,
    pub hwm_b: u64,
    /// A's peak RSS from the SIGTERM on (VmHWM reset then), when it was reset.
    pub hwm_handing: Option<u64>,
}

/// Step t: courier A, its destination paused, holds the backlog; SIGTERM,
/// and A writes it to hand-off objects and exits; then courier B (an empty
/// journal, its destination paused too, so that it adopts without
/// delivering) starts on the same `handoff.url`, and adopts it.
/// `sealed`: with `handoff.encryption_key_env` (AES-256-GCM objects).
pub async fn hand_off(
    label: &str,
    bin: &Path,
    rx: &str,
    args: &Args,
    sealed: bool,
) -> Result<HandOff, String> {
    let events = backlog(HANDOFF_BACKLOG, args);
    let moto = Moto::try_start(BUCKET).await?;
    let mut vars = s3_env(&moto.endpoint());
    let (enc, kind) = if sealed {
        vars.push(("COURIER_HANDOFF_KEY", HANDOFF_KEY.to_string()));
        (", encryption_key_env: COURIER_HANDOFF_KEY", " sealed")
    } else {
        ("", "")
    };
    let env = env_of(&vars);
    let plain = config(rx, "");
    let with_handoff = format!(
        "{plain}shutdown_grace: {GRACE}\nhandoff: {{ url: s3://{BUCKET}/{HANDOFF_PREFIX}, poll: 200ms, claim_timeout: 5m{enc} }}\n"
    );
    // B's pause goes in its journal first, without hand-off (nothing to
    // adopt yet); B starts again with it later, and the pause holds.
    let mut b = start_yaml(bin, &plain, &env).await?;
    admin_action(&b.courier, "pause").await?;
    b.courier.terminate();
    b.courier.wait_exit(DEADLINE).await;
    let b_config = b.courier.config_path().to_path_buf();
    std::fs::write(&b_config, &with_handoff)
        .map_err(|e| format!("write {}: {e}", b_config.display()))?;

    let mut a = start_yaml(bin, &with_handoff, &env).await?;
    let filled = fill(&a.courier, events, args).await?;
    let pid = a.courier.pid();
    let hwm_filled = proc_status(pid, "VmHWM").unwrap_or(0);
    let reset = support::reset_peak_rss(pid).is_ok();
    let cpu_before = cpu_seconds(pid);
    let mut seen = Seen::default();
    seen.sample(pid);
    let signalled = Instant::now();
    a.courier.terminate();
    // Bounded by the deadline.
    let wall = loop {
        seen.sample(pid);
        if !a.courier.is_running() {
            break signalled.elapsed();
        }
        if signalled.elapsed() >= DEADLINE {
            return Err(format!("A still running {DEADLINE:?} after SIGTERM"));
        }
        tokio::time::sleep(SAMPLE).await;
    };
    let status = a.courier.wait_exit(DEADLINE).await;
    let logs = a.courier.logs();
    let summary = logs
        .lines()
        .find(|l| l.contains("handed off every pending event"));
    let Some(summary) = summary.filter(|_| status.success()) else {
        let said: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("hand-off") || l.contains("ERROR"))
            .take(5)
            .collect();
        return Err(format!("A exited {status}: {}", said.join("; ")));
    };
    let written_ms = field(summary, "took_ms").unwrap_or(f64::NAN);
    let written_events = field(summary, "events").unwrap_or(0.0);
    let bytes = field(summary, "bytes").unwrap_or(0.0);
    if written_events != events as f64 {
        return Err(format!(
            "A handed off {written_events} of {events}: {summary}"
        ));
    }
    let (objects, sum_ms, max_ms) = took(&logs, "hand-off object written");
    let pending_keys = format!("{HANDOFF_PREFIX}/pending/");
    let stored: u64 = keys(&moto, &pending_keys)
        .await?
        .iter()
        .filter_map(|k| count_in_name(k, ".cho"))
        .sum();
    if stored != events {
        return Err(format!(
            "{stored} events in the hand-off objects for {events}"
        ));
    }
    let hwm_a = seen.hwm.unwrap_or(0).max(hwm_filled);
    let cpu_a = seen.cpu.zip(cpu_before).map(|(now, before)| now - before);
    let written = Duration::from_secs_f64(written_ms.max(0.0) / 1000.0);
    let hwm_handing = seen.hwm.filter(|_| reset);
    let handing = hwm_handing.map_or("not measured (clear_refs refused)".into(), |h| {
        format!("{:.1} MiB", h as f64 / MIB)
    });
    let row_a = Row {
        target: format!("{label} t. hand-off{kind} {events}: A, SIGTERM to exit"),
        rate: Some(events as f64 / written.as_secs_f64().max(1e-9)),
        cpu: cpu_a,
        events: Some(events as f64),
        rss: Some(hwm_a),
        note: format!(
            "moto_server; {filled}; destination paused; shutdown_grace {GRACE}; hand-off {:.2} s by its summary ({objects} objects, {:.0} MiB; each object's PUT + journal delete {:.0} ms mean, {max_ms:.0} ms max, {:.1} s summed), SIGTERM to exit {:.2} s; peak RSS filling {:.1} MiB, from the SIGTERM {handing} (sampled every {} ms: at most {}). CPU: courier's from the SIGTERM",
            written.as_secs_f64(),
            bytes / MIB,
            sum_ms / objects.max(1) as f64,
            sum_ms / 1000.0,
            wall.as_secs_f64(),
            hwm_filled as f64 / MIB,
            SAMPLE.as_millis(),
            seen.parts(),
        ),
        ..Row::default()
    };

    let spawned = Instant::now();
    b.courier.restart().await;
    let pid_b = b.courier.pid();
    let listening = spawned.elapsed();
    let rss_listening = proc_status(pid_b, "VmRSS").unwrap_or(0);
    let mut seen_b = Seen::default();
    // Bounded by the deadline.
    let adopted = loop {
        seen_b.sample(pid_b);
        let n = metric(&b.courier, ADOPTED).await.unwrap_or(0.0);
        if n >= events as f64 {
            break spawned.elapsed();
        }
        if spawned.elapsed() >= DEADLINE {
            return Err(format!("B adopted {n} of {events} within {DEADLINE:?}"));
        }
        tokio::time::sleep(POLL).await;
    };
    seen_b.sample(pid_b);
    let pending = metric(&b.courier, PENDING).await.unwrap_or(-1.0);
    // An object's line comes once it is deleted, after its events count:
    // the last may not be logged yet (a bounded wait, not timed).
    let settled = Instant::now() + Duration::from_secs(10);
    // Bounded by `settled`.
    while took(&b.courier.logs(), ADOPTION).0 < objects && Instant::now() < settled {
        tokio::time::sleep(POLL).await;
    }
    let (adoptions, adopt_ms, adopt_max) = took(&b.courier.logs(), ADOPTION);
    let left = keys(&moto, &pending_keys).await.map_or(0, |k| k.len());
    let hwm_b = seen_b.hwm.unwrap_or(0);
    let row_b = Row {
        target: format!("{label} t. hand-off{kind} {events}: B, spawn to adopted"),
        rate: Some(events as f64 / adopted.as_secs_f64()),
        cpu: seen_b.cpu,
        events: Some(events as f64),
        rss: Some(hwm_b),
        note: format!(
            "an empty journal, its destination paused; poll 200ms; spawn to listening {} ms (RSS {:.1} MiB), to all adopted {:.2} s; {adoptions} objects adopted, each read, appended and deleted (after its claim) in {:.0} ms mean, {adopt_max:.0} ms max ({:.1} s summed); then {pending:.0} pending, {left} objects left; sampled every {} ms: at most {}. CPU: courier's since its spawn",
            listening.as_millis(),
            rss_listening as f64 / MIB,
            adopted.as_secs_f64(),
            adopt_ms / adoptions.max(1) as f64,
            adopt_ms / 1000.0,
            POLL.as_millis(),
            seen_b.parts(),
        ),
        ..Row::default()
    };
    Ok(HandOff {
        rows: vec![row_a, row_b],
        written,
        adopted,
        wall,
        hwm_a,
        hwm_b,
        hwm_handing,
    })
}
