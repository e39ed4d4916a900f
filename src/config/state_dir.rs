//! Where relative journal and dead-letter paths resolve (docs/configuration.md `state_dir`):
//! the key, else `COURIER_STATE_DIR`, else the config file's folder. The
//! image sets the variable, so a config with relative paths works unchanged
//! when it is mounted read-only (a Kubernetes ConfigMap).

use super::validate::{Env, Problem};
use std::path::{Path, PathBuf};

/// Read when the config has no `state_dir` key; empty counts as unset.
pub const STATE_DIR_ENV: &str = "COURIER_STATE_DIR";

/// The state folder; a relative key or variable is taken from `config_dir`.
pub(super) fn resolve(
    key: Option<&str>,
    config_dir: &Path,
    env: &dyn Env,
) -> Result<PathBuf, Problem> {
    let chosen = match key {
        Some(k) if k.trim().is_empty() => {
            return Err(Problem {
                path: "state_dir".into(),
                message: "must not be empty: remove the key to use the config file's folder".into(),
            });
        }
        Some(k) => PathBuf::from(k),
        None => match env.get(STATE_DIR_ENV).filter(|v| !v.trim().is_empty()) {
            Some(v) => PathBuf::from(v),
            None => return Ok(config_dir.to_path_buf()),
        },
    };
    // `join` keeps an absolute `chosen`; components() drops inner `.`.
    Ok(config_dir.join(chosen).components().collect())
}
