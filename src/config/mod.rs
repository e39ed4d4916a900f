//! The config file (SPEC §2): parse, check every range, and report every
//! problem with `file:line:column`, the key path, the value and what is allowed.

mod position;
mod retry;
pub mod schema;
pub mod settings;
mod state_dir;
mod topics;
pub mod units;
mod validate;

pub use schema::{LogFormat, Schema, SyncMode};
pub use settings::{DestinationSettings, Settings, Subscription, Target, TopicSettings};
pub use state_dir::STATE_DIR_ENV;
pub use validate::{Env, ProcessEnv, Purpose};

use position::PositionIndex;
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

pub fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError {
        lines: vec![format!(
            "{}: cannot read the config file: {e}",
            path.display()
        )],
    })
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

pub fn parse(
    file: &str,
    text: &str,
    base_dir: PathBuf,
    purpose: Purpose,
    env: &dyn Env,
) -> Result<Loaded, ConfigError> {
    let raw: schema::RawConfig = serde_norway::from_str(text).map_err(|e| ConfigError {
        lines: vec![serde_line(file, &e)],
    })?;
    let index = PositionIndex::build(text);
    let at = |p: &validate::Problem| {
        let pos = index
            .find(&p.path)
            .map(|pos| format!("{}:{}", pos.line, pos.col))
            .unwrap_or_else(|| "1:1".into());
        format!("{file}:{pos}: {}: {}", p.path, p.message)
    };
    let checked =
        validate::check(&raw, &base_dir, env, purpose).map_err(|problems| ConfigError {
            lines: problems.iter().map(at).collect(),
        })?;
    Ok(Loaded {
        settings: checked.settings,
        warnings: checked.warnings.iter().map(at).collect(),
        effective: effective_yaml(raw, &checked.state_dir),
    })
}

/// serde's message with its position moved to the front, `file:line:col:`.
fn serde_line(file: &str, e: &serde_norway::Error) -> String {
    let msg = e.to_string();
    match e.location() {
        Some(loc) => {
            let msg = msg
                .rfind(" at line ")
                .map_or(msg.as_str(), |cut| &msg[..cut]);
            format!("{file}:{}:{}: {msg}", loc.line(), loc.column())
        }
        None => format!("{file}: {msg}"),
    }
}

/// `state_dir` is shown resolved (key, `COURIER_STATE_DIR` or the config's
/// folder), so `check` tells where the journal will really be.
fn effective_yaml(mut raw: schema::RawConfig, state_dir: &Path) -> String {
    raw.state_dir = Some(state_dir.display().to_string());
    for d in raw.destinations.values_mut() {
        if d.status.no_retry.is_empty() {
            d.status.no_retry = crate::policy::classify::DEFAULT_NO_RETRY
                .iter()
                .map(|&c| schema::StatusKey::Code(c.into()))
                .collect();
        }
        for h in d.headers.values_mut() {
            if h.secret && h.value.is_some() {
                h.value = Some("********".into());
            }
        }
    }
    serde_norway::to_string(&raw)
        .unwrap_or_else(|e| format!("# cannot print the effective config: {e}\n"))
}

#[cfg(test)]
mod tests;
