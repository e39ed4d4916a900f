//! Config hot reload (SPEC §6): on SIGHUP, or when the config file's folder
//! changes, a valid new config is applied without a restart; an invalid one
//! is refused, logged with its positions, counted, and the old one runs on.
//!
//! The folder is watched, not the file: Kubernetes updates a mounted
//! ConfigMap by writing a new hidden folder and renaming the `..data`
//! symlink over the old one, so the file's own inode never changes and a
//! watch on it would see nothing. Any event in the folder leads to a read
//! of the file; a text equal to the one in force is no reload, so events
//! of unrelated files cost one small read.
//!
//! Listen addresses, the journal and the log settings are fixed for the
//! life of the process (the sockets, files and log subscriber are set up
//! once): a reload that changes them keeps the old values and says that a
//! restart is needed.

use crate::admin::metrics;
use crate::config::{self, Live, ProcessEnv, Purpose, Settings};
use crate::deliver::Fleet;
use notify::{RecursiveMode, Watcher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Events of one editor save or one ConfigMap swap come in a burst: wait
/// this long after the first for the rest, then read the file once.
const SETTLE: Duration = Duration::from_millis(250);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// SIGHUP: read the file even if no change was seen.
    Signal,
    /// Something changed in the config's folder.
    FileChanged,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Signal => "SIGHUP",
            Trigger::FileChanged => "file change",
        }
    }
}

pub struct Reloader {
    path: PathBuf,
    live: Arc<Live>,
    fleet: Arc<Fleet>,
    /// The text of the config in force.
    applied: String,
}

impl Reloader {
    /// `text` is what `live` was loaded from.
    pub fn new(path: PathBuf, text: String, live: Arc<Live>, fleet: Arc<Fleet>) -> Reloader {
        Reloader {
            path,
            live,
            fleet,
            applied: text,
        }
    }

    pub fn reload(&mut self, trigger: Trigger) {
        let why = trigger.as_str();
        let text = match config::read(&self.path) {
            Ok(t) => t,
            Err(e) => return refused(why, &e.lines),
        };
        if trigger == Trigger::FileChanged && text == self.applied {
            return;
        }
        let loaded = match config::load_text(&self.path, &text, Purpose::Run, &ProcessEnv) {
            Ok(l) => l,
            Err(e) => return refused(why, &e.lines),
        };
        let old = self.live.load_full();
        let (settings, fixed) = keep_fixed(&old, loaded.settings);
        for key in &fixed {
            tracing::warn!(
                key,
                "config reload: {key} changed, which needs a restart; the running value stays in force until then"
            );
        }
        let applied = match self.fleet.apply(&settings) {
            Ok(a) => a,
            Err(e) => return refused(why, &[e]),
        };
        self.live.store(Arc::new(settings));
        self.applied = text;
        metrics::config_loaded();
        tracing::info!(
            trigger = why,
            file = %self.path.display(),
            added = %applied.added.join(","),
            removed = %applied.removed.join(","),
            updated = applied.updated.len(),
            "config reloaded"
        );
        for name in &applied.removed {
            tracing::warn!(destination = %name, "destination removed by a reload: its pending events stay in the journal (orphaned) and are delivered if it is configured again");
        }
    }
}

fn refused(trigger: &str, lines: &[String]) {
    metrics::config_refused();
    tracing::error!(
        trigger,
        errors = %lines.join("; "),
        "config reload refused: the config in force stays"
    );
}

/// `new` with the values that only a restart can change taken from `old`,
/// and the keys whose new value was not taken.
pub fn keep_fixed(old: &Settings, mut new: Settings) -> (Settings, Vec<&'static str>) {
    let mut fixed = Vec::new();
    if new.listen != old.listen {
        fixed.push("listen");
        new.listen = old.listen;
    }
    if new.admin_listen != old.admin_listen {
        fixed.push("admin_listen");
        new.admin_listen = old.admin_listen;
    }
    if new.journal != old.journal {
        fixed.push("journal");
        new.journal = old.journal.clone();
    }
    if new.ingress.dedupe_window != old.ingress.dedupe_window {
        fixed.push("ingress.dedupe_window");
        new.ingress.dedupe_window = old.ingress.dedupe_window;
    }
    if new.log != old.log {
        fixed.push("log");
        new.log = old.log.clone();
    }
    (new, fixed)
}

/// Reloads on SIGHUP and on changes in the config's folder until `stop`.
pub async fn run(mut reloader: Reloader, stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (tx, mut changed) = mpsc::channel::<()>(1);
    // Dropped at the end of this function, which ends the watch.
    let _watcher = watch_folder(&reloader.path, tx);
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle SIGHUP; the config reloads only on file changes");
            None
        }
    };
    loop {
        tokio::select! {
            Some(()) = async { hup.as_mut()?.recv().await }, if hup.is_some() => {
                reloader.reload(Trigger::Signal);
            }
            Some(()) = changed.recv() => {
                tokio::time::sleep(SETTLE).await;
                // Whatever came meanwhile is covered by this read.
                while changed.try_recv().is_ok() {}
                reloader.reload(Trigger::FileChanged);
            }
            _ = stop.cancelled() => return,
        }
    }
}

/// Watches the folder holding `path` (not recursively: a journal below it
/// stays out of the watch). Without a watch, SIGHUP still reloads.
fn watch_folder(path: &Path, tx: mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let watched = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok() {
            // Full: a read is already due, which will see this change too.
            let _ = tx.try_send(());
        }
    })
    .and_then(|mut w| w.watch(&folder, RecursiveMode::NonRecursive).map(|()| w));
    match watched {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(folder = %folder.display(), error = %e, "cannot watch the config's folder; reload with SIGHUP");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Env, parse};

    struct NoEnv;
    impl Env for NoEnv {
        fn get(&self, _: &str) -> Option<String> {
            None
        }
    }

    fn settings(text: &str) -> Settings {
        parse("c.yaml", text, "/etc/courier".into(), Purpose::Run, &NoEnv)
            .expect("valid")
            .settings
    }

    const OLD: &str = "\
listen: 127.0.0.1:8080
admin_listen: 127.0.0.1:9090
journal: { dir: /var/lib/courier/journal, max_bytes: 1MiB }
ingress: { dedupe_window: 1m, max_body_bytes: 1KiB }
destinations:
  a: { url: http://127.0.0.1:9/a }
";

    #[test]
    fn what_needs_a_restart_keeps_its_running_value_and_is_named() {
        let new = "\
listen: 127.0.0.1:8081
admin_listen: 127.0.0.1:9091
journal: { dir: /elsewhere, max_bytes: 1MiB }
ingress: { dedupe_window: 2m, max_body_bytes: 2KiB }
log: { level: debug }
destinations:
  b: { url: http://127.0.0.1:9/b }
";
        let (kept, fixed) = keep_fixed(&settings(OLD), settings(new));
        assert_eq!(
            fixed,
            [
                "listen",
                "admin_listen",
                "journal",
                "ingress.dedupe_window",
                "log"
            ]
        );
        assert_eq!(kept.listen.port(), 8080);
        assert_eq!(kept.admin_listen.port(), 9090);
        assert_eq!(kept.journal.dir, Path::new("/var/lib/courier/journal"));
        assert_eq!(kept.ingress.dedupe_window, Some(Duration::from_secs(60)));
        assert_eq!(kept.log.level, "info");
        // What a reload may change is taken.
        assert_eq!(kept.ingress.max_body_bytes, 2048);
        assert_eq!(kept.destinations[0].name, "b");
    }

    #[test]
    fn an_unchanged_config_keeps_nothing_back() {
        let (_, fixed) = keep_fixed(&settings(OLD), settings(OLD));
        assert!(fixed.is_empty(), "{fixed:?}");
    }
}
