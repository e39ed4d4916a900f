//! A courier container's config as Kubernetes would hand it over: the file
//! named by `-c`, `COURIER_CONFIG` or the image's default, read from the
//! ConfigMap volume mounted at its folder; then checked by the real binary,
//! whose effective config tells where the journal goes.

use super::manifests::{CourierPod, Image, at, seq, str_at};
use courier::config::STATE_DIR_ENV;
use courier::config::units::{Dur, Size};
use serde_norway::Value;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;
use support::{CliOutput, run_cli};

/// The config file's path in the container.
pub fn config_path(pod: &CourierPod, image: &Image) -> PathBuf {
    let args: Vec<&str> = seq(&pod.container, &["command"])
        .iter()
        .chain(seq(&pod.container, &["args"]))
        .filter_map(Value::as_str)
        .collect();
    let flag = args
        .windows(2)
        .find(|w| w[0] == "-c" || w[0] == "--config")
        .map(|w| w[1]);
    let path = flag
        .or_else(|| pod.env_value("COURIER_CONFIG"))
        .or(image.env.get("COURIER_CONFIG").map(String::as_str))
        .expect("a config path: -c, COURIER_CONFIG or the image's default");
    PathBuf::from(path)
}

/// `COURIER_STATE_DIR` as the container sees it.
pub fn state_dir_env<'a>(pod: &'a CourierPod, image: &'a Image) -> Option<&'a str> {
    pod.env_value(STATE_DIR_ENV)
        .or(image.env.get(STATE_DIR_ENV).map(String::as_str))
}

/// The volume mount whose path is `dir` or the longest folder above it.
pub fn mount_for<'a>(pod: &'a CourierPod, path: &Path) -> Option<&'a Value> {
    seq(&pod.container, &["volumeMounts"])
        .iter()
        .filter(|m| str_at(m, &["mountPath"]).is_some_and(|p| path.starts_with(p)))
        .max_by_key(|m| str_at(m, &["mountPath"]).map_or(0, str::len))
}

/// The pod volume (or StatefulSet claim template) named `name`.
pub fn volume<'a>(pod: &'a CourierPod, name: &str) -> Option<&'a Value> {
    let named = |v: &&Value| {
        str_at(v, &["name"]) == Some(name) || str_at(v, &["metadata", "name"]) == Some(name)
    };
    seq(pod.pod_spec(), &["volumes"])
        .iter()
        .find(named)
        .or_else(|| {
            seq(&pod.workload, &["spec", "volumeClaimTemplates"])
                .iter()
                .find(named)
        })
}

/// The config text: the file's folder must be a read-only directory mount
/// (no subPath, so ConfigMap updates arrive) of a ConfigMap of this folder
/// that has the file's name as a key.
pub fn config_text(pod: &CourierPod, config: &Path) -> Result<String, String> {
    let dir = config.parent().ok_or("the config path has no folder")?;
    let file = config
        .file_name()
        .ok_or("the config path has no file name")?
        .to_string_lossy();
    let mount = seq(&pod.container, &["volumeMounts"])
        .iter()
        .find(|m| str_at(m, &["mountPath"]).map(Path::new) == Some(dir))
        .ok_or_else(|| format!("nothing is mounted at {}", dir.display()))?;
    if at(mount, &["readOnly"]).as_bool() != Some(true) {
        return Err(format!("{} is not mounted readOnly", dir.display()));
    }
    if !at(mount, &["subPath"]).is_null() {
        return Err("the config mount uses subPath: ConfigMap updates never reach it".into());
    }
    let name = str_at(mount, &["name"]).unwrap_or("");
    let cm = volume(pod, name)
        .map(|v| at(v, &["configMap"]))
        .filter(|cm| cm.is_mapping())
        .ok_or_else(|| format!("volume {name} is not a configMap volume"))?;
    if !at(cm, &["items"]).is_null() {
        return Err("configMap items are not supported by this test".into());
    }
    let cm_name = str_at(cm, &["name"]).unwrap_or("");
    pod.config_maps
        .get(cm_name)
        .ok_or_else(|| format!("no ConfigMap {cm_name} beside the manifest"))?
        .get(file.as_ref())
        .cloned()
        .ok_or_else(|| format!("ConfigMap {cm_name} has no key {file}"))
}

/// What the tests need from `courier check`'s effective config.
pub struct Effective {
    pub admin_port: u16,
    pub admin_token_env: Option<String>,
    pub shutdown_grace: Duration,
    pub journal_max_bytes: u64,
    /// Journal and dead-letter folders as paths in the container, each with
    /// the key it comes from (a `dead_letter.url` sink has none).
    pub data_dirs: Vec<(String, PathBuf)>,
    /// `handoff.url` is set: on SIGTERM, after `shutdown_grace`, pending
    /// events get as long again to reach the bucket.
    pub handoff: bool,
}

/// `courier check` on the container's config, with the container's
/// `COURIER_STATE_DIR` and a token in the `admin_token_env` variable (the
/// pod gets it from a Secret, checked separately).
pub async fn check(pod: &CourierPod, image: &Image) -> Result<Effective, String> {
    let config = config_path(pod, image);
    let text = config_text(pod, &config)?;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let file = tmp.path().join(config.file_name().ok_or("no file name")?);
    std::fs::write(&file, &text).map_err(|e| e.to_string())?;
    let raw: Value = serde_norway::from_str(&text).map_err(|e| e.to_string())?;
    let mut env: Vec<(&str, &str)> = Vec::new();
    if let Some(var) = str_at(&raw, &["admin_token_env"]) {
        env.push((var, "test-token"));
    }
    if let Some(dir) = state_dir_env(pod, image) {
        env.push((STATE_DIR_ENV, dir));
    }
    let file_arg = file.to_str().ok_or("temp paths are UTF-8")?;
    let out: CliOutput = run_cli(None, &["check", "-c", file_arg], &env).await;
    if !out.success() {
        return Err(format!("courier check failed:\n{}", out.show()));
    }
    let v: Value = serde_norway::from_str(&out.stdout).map_err(|e| e.to_string())?;
    let container_dir = config.parent().ok_or("no folder")?;
    let in_container = |p: &Path| match p.strip_prefix(tmp.path()) {
        Ok(rest) => container_dir.join(rest),
        Err(_) => p.to_path_buf(),
    };
    let state_dir = in_container(Path::new(str_at(&v, &["state_dir"]).ok_or("no state_dir")?));
    let resolve = |dir: &str| normalize(&state_dir.join(dir));
    let mut data_dirs = vec![(
        "journal.dir".to_string(),
        resolve(str_at(&v, &["journal", "dir"]).ok_or("no journal.dir")?),
    )];
    if let Some(dir) = str_at(&v, &["dead_letter", "dir"]) {
        data_dirs.push(("dead_letter.dir".into(), resolve(dir)));
    }
    for (name, d) in at(&v, &["destinations"]).as_mapping().into_iter().flatten() {
        if let Some(dir) = str_at(d, &["dead_letter", "dir"]) {
            let key = format!(
                "destinations.{}.dead_letter.dir",
                name.as_str().unwrap_or("?")
            );
            data_dirs.push((key, resolve(dir)));
        }
    }
    let admin: std::net::SocketAddr = str_at(&v, &["admin_listen"])
        .ok_or("no admin_listen")?
        .parse()
        .map_err(|e| format!("admin_listen: {e}"))?;
    let grace: Dur = serde_norway::from_value(at(&v, &["shutdown_grace"]).clone())
        .map_err(|e| format!("shutdown_grace: {e}"))?;
    let max: Size = serde_norway::from_value(at(&v, &["journal", "max_bytes"]).clone())
        .map_err(|e| format!("journal.max_bytes: {e}"))?;
    Ok(Effective {
        admin_port: admin.port(),
        admin_token_env: str_at(&v, &["admin_token_env"]).map(str::to_string),
        shutdown_grace: grace.0,
        journal_max_bytes: max.0,
        data_dirs,
        handoff: str_at(&v, &["handoff", "url"]).is_some(),
    })
}

/// `a/./b/../c` -> `a/c`, so that mount prefixes compare as Kubernetes does.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}
