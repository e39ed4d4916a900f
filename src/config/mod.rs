//! The config file (docs/configuration.md): parse, check every range, and report every
//! problem with `file:line:column`, the key path, the value and what is allowed.

pub mod admin_token;
pub mod ingress_keys;
mod limits;
mod messages;
mod position;
mod retry;
pub mod schema;
pub mod settings;
mod state_dir;
mod structure;
mod topics;
pub mod units;
mod validate;

pub use schema::{LogFormat, Mode, SyncMode};
pub use settings::{
    DestinationSettings, HandoffSettings, HistorySettings, Settings, SinkAt, Subscription,
    TopicSettings, TracingSettings,
};
// Used by tests/suite/deploy alone.
#[cfg_attr(dead_code_check, allow(unused_imports))]
pub use state_dir::STATE_DIR_ENV;
pub use validate::{Env, ProcessEnv, Purpose};

use position::{Pos, PositionIndex};
use std::fmt;
use std::path::{Path, PathBuf};

/// The settings in force: swapped whole by a reload, read once per request.
pub type Live = arc_swap::ArcSwap<Settings>;

/// A config that passed every check.
pub struct Loaded {
    pub settings: Settings,
    /// Problems that do not stop `check` (a secret's variable missing).
    pub warnings: Vec<String>,
    /// The effective config as YAML: defaults filled in, secrets masked.
    pub effective: String,
}

/// Everything wrong with a config file, one line each.
#[derive(Debug)]
pub struct ConfigError {
    pub lines: Vec<String>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.lines.join("\n"))
    }
}

impl std::error::Error for ConfigError {}

pub fn load(path: &Path, purpose: Purpose, env: &dyn Env) -> Result<Loaded, ConfigError> {
    load_text(path, &read(path)?, purpose, env)
}

/// Reads the file, refusing one over the size limit without reading it
/// whole (a 50 MB file is not read into memory on every reload).
pub fn read(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    let fail = |message: String| ConfigError {
        lines: vec![format!("{}: {message}", path.display())],
    };
    let cannot = |e: std::io::Error| fail(format!("cannot read the config file: {e}"));
    let file = std::fs::File::open(path).map_err(cannot)?;
    let mut text = String::new();
    file.take(limits::MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(cannot)?;
    if text.len() as u64 > limits::MAX_FILE_BYTES {
        let size = std::fs::metadata(path).map_or(text.len() as u64, |m| m.len());
        return Err(fail(limits::Refused::TooLarge(size).message()));
    }
    Ok(text)
}

/// Checks `text`, read from `path` (which names it in messages and anchors
/// its relative paths).
pub fn load_text(
    path: &Path,
    text: &str,
    purpose: Purpose,
    env: &dyn Env,
) -> Result<Loaded, ConfigError> {
    parse(
        &path.display().to_string(),
        text,
        base_dir(path),
        purpose,
        env,
    )
}

fn base_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Checks a config: duplicate keys, then every structural error (unknown
/// keys, wrong types), then ranges and cross-field rules on what could be
/// read, all reported together in line order. Only a YAML syntax error stops
/// the checks early.
pub fn parse(
    file: &str,
    text: &str,
    base_dir: PathBuf,
    purpose: Purpose,
    env: &dyn Env,
) -> Result<Loaded, ConfigError> {
    if let Err(refused) = limits::check(text) {
        let at = match refused {
            limits::Refused::TooDeep(at) => at,
            limits::Refused::TooLarge(_) => Pos { line: 1, col: 1 },
        };
        return Err(ConfigError {
            lines: vec![format!(
                "{file}:{}:{}: {}",
                at.line,
                at.col,
                refused.message()
            )],
        });
    }
    let index = PositionIndex::build(text);
    let mut report = Report::default();
    for d in &index.duplicates {
        let message = format!(
            "duplicate key; first given at {}:{}",
            d.first.line, d.first.col
        );
        report.add(Some(d.at), &d.path, &message);
    }
    let structure = match structure::read::<schema::RawConfig>(text) {
        Ok(s) => s,
        Err(e) => {
            report.syntax(&e);
            return Err(report.into_error(file));
        }
    };
    for f in &structure.errors {
        let at = if f.at_key {
            index.find_key(&f.locate)
        } else {
            index.find(&f.locate)
        };
        report.add(at, &f.path, &f.message);
    }
    let Some(raw) = structure.value else {
        return Err(report.into_error(file));
    };
    let at = |p: &validate::Problem| {
        let pos = index.find(&p.path).unwrap_or(Pos { line: 1, col: 1 });
        format!("{file}:{}:{}: {}: {}", pos.line, pos.col, p.path, p.message)
    };
    match validate::check(&raw, &base_dir, env, purpose) {
        Err(problems) => {
            let follow = |p: &&validate::Problem| structure.cut.iter().any(|c| related(&p.path, c));
            for p in problems.iter().filter(|p| !follow(p)) {
                report.add(index.find(&p.path), &p.path, &p.message);
            }
            Err(report.into_error(file))
        }
        Ok(checked) if report.is_empty() => Ok(Loaded {
            effective: effective_yaml(raw, &checked.state_dir, &checked.settings),
            settings: checked.settings,
            warnings: checked.warnings.iter().map(at).collect(),
        }),
        Ok(_) => Err(report.into_error(file)),
    }
}

/// Whether a problem at `path` may only be a consequence of the bad value
/// cut at `cut` (a default stood in for it): at, under or above it.
fn related(path: &str, cut: &str) -> bool {
    let under = |a: &str, b: &str| {
        b.is_empty() || a == b || a.strip_prefix(b).is_some_and(|r| r.starts_with(['.', '[']))
    };
    under(path, cut) || under(cut, path)
}

/// The problems of one file, each with its position, printed in line order.
#[derive(Default)]
struct Report {
    lines: Vec<(Pos, String)>,
}

impl Report {
    fn add(&mut self, at: Option<Pos>, path: &str, message: &str) {
        let at = at.unwrap_or(Pos { line: 1, col: 1 });
        let text = if path.is_empty() {
            message.to_string()
        } else {
            format!("{path}: {message}")
        };
        self.lines.push((at, text));
    }

    /// A syntax error: serde_norway's own message and position.
    fn syntax(&mut self, e: &serde_norway::Error) {
        let msg = e.to_string();
        let msg = msg
            .rfind(" at line ")
            .map_or(msg.as_str(), |cut| &msg[..cut]);
        let at = e.location().map(|l| Pos {
            line: l.line(),
            col: l.column(),
        });
        self.add(at, "", msg);
    }

    fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    fn into_error(mut self, file: &str) -> ConfigError {
        self.lines.sort_by_key(|(at, _)| (at.line, at.col));
        ConfigError {
            lines: self
                .lines
                .into_iter()
                .map(|(at, text)| format!("{file}:{}:{}: {text}", at.line, at.col))
                .collect(),
        }
    }
}

/// `url` with every query value masked: the names stay, to be checked.
fn mask_query(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_string();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let masked: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !v.is_empty() => format!("{k}=********"),
            _ => pair.to_string(),
        })
        .collect();
    let mut out = format!("{base}?{}", masked.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// `state_dir` is shown resolved (key, `COURIER_STATE_DIR` or the config's
/// folder), so `check` tells where the journal will really be; so is the
/// `eventgrid_topic` an eventgrid route's events get. Default minimum
/// delays are shown too: those a status key states exactly (408, 503) in
/// `min_delay`, the rest (429 without Retry-After, other statuses,
/// timeouts), which no key can state, in a comment per destination.
fn effective_yaml(
    mut raw: schema::RawConfig,
    state_dir: &Path,
    settings: &settings::Settings,
) -> String {
    raw.state_dir = Some(state_dir.display().to_string());
    let eventgrid = |schema, name: &str, topic: &mut Option<String>| {
        if schema == crate::event::Schema::Eventgrid {
            topic.get_or_insert_with(|| validate::default_eventgrid_topic(name));
        }
    };
    for (name, t) in raw.topics.iter_mut() {
        if let Some(s) = t.schema {
            eventgrid(s, name, &mut t.eventgrid_topic);
        }
    }
    let mut minimums = String::new();
    for (name, d) in raw.destinations.iter_mut() {
        eventgrid(d.schema, name, &mut d.eventgrid_topic);
        let concurrency =
            d.concurrency
                .get_or_insert(schema::Concurrency::Fixed(schema::default_concurrency(
                    d.mode,
                )));
        if let schema::Concurrency::Adaptive { adaptive } = concurrency {
            *adaptive = adaptive.filled();
        }
        // Not beside `sns:`, where its numRetries decides (and the key
        // would make the printed config an error).
        if d.retry.schedule.get("sns").is_none() {
            d.retry
                .max_attempts
                .get_or_insert(retry::DEFAULT_MAX_ATTEMPTS);
        }
        if d.status.no_retry.is_empty() {
            d.status.no_retry = crate::policy::classify::DEFAULT_NO_RETRY
                .iter()
                .map(|&c| schema::StatusKey::Code(c.into()))
                .collect();
        }
        if let Some(checked) = settings.destination(name) {
            d.max_pending_bytes
                .get_or_insert(units::Size(checked.max_pending_bytes));
            let floors = checked.status.floors();
            for f in &floors {
                let configured = |code: u16| {
                    checked
                        .status
                        .min_delay
                        .iter()
                        .any(|(c, _)| c.contains(&code))
                };
                if let Ok(code) = f.answers.parse::<u16>()
                    && !configured(code)
                {
                    d.status
                        .min_delay
                        .entry(schema::StatusKey::Code(code.into()))
                        .or_insert(units::Dur(f.min_delay));
                }
            }
            let rows: Vec<String> = floors
                .iter()
                .map(|f| format!("{} {}", f.answers, units::format_duration(f.min_delay)))
                .collect();
            minimums.push_str(&format!(
                "# destinations.{name}: least wait before a retry: {}; connection, DNS and TLS failures none\n",
                rows.join(", ")
            ));
        }
        for h in d.headers.values_mut() {
            if h.secret && h.value.is_some() {
                h.value = Some("********".into());
            }
        }
        // A query often holds a token (Azure Functions' `?code=`).
        d.url = mask_query(&d.url);
    }
    match serde_norway::to_string(&raw) {
        Ok(yaml) => format!("{yaml}{minimums}"),
        Err(e) => format!("# cannot print the effective config: {e}\n"),
    }
}

#[cfg(test)]
mod tests;
