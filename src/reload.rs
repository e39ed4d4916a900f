//! Config hot reload (docs/reload.md): on SIGHUP, or when the config file's folder
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
//! Listen addresses, the journal and the log format are fixed for the
//! life of the process (the sockets, files and log subscriber are set up
//! once): a reload that changes them keeps the old values and says that a
//! restart is needed. So does `tracing`: its exporter, and the tracer
//! that ingress and each attempt stack hold, are set up at start. The log
//! level and `log.bodies` change live.

use crate::config::{self, Live, ProcessEnv, Purpose, Settings};
use crate::deliver::Fleet;
use crate::metrics;
use notify::{RecursiveMode, Watcher};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{Signal, SignalKind, signal};
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
    /// The text last refused: the same text is not refused again on every
    /// event in the folder.
    refused: Option<String>,
}

impl Reloader {
    /// `text` is what `live` was loaded from.
    pub fn new(path: PathBuf, text: String, live: Arc<Live>, fleet: Arc<Fleet>) -> Reloader {
        Reloader {
            path,
            live,
            fleet,
            applied: text,
            refused: None,
        }
    }

    pub fn reload(&mut self, trigger: Trigger) {
        let why = trigger.as_str();
        let text = match config::read(&self.path) {
            Ok(t) => t,
            Err(e) => return refused(why, &e.lines),
        };
        if trigger == Trigger::FileChanged {
            if text == self.applied {
                // Back to the config in force after a refused edit.
                if self.refused.take().is_some() {
                    metrics::config_ok();
                    tracing::info!(file = %self.path.display(), "config file is back to the config in force");
                }
                return;
            }
            if self.refused.as_ref() == Some(&text) {
                return;
            }
        }
        match self.apply(why, &text) {
            Ok(()) => {
                self.applied = text;
                self.refused = None;
            }
            Err(lines) => {
                refused(why, &lines);
                self.refused = Some(text);
            }
        }
    }

    fn apply(&self, why: &str, text: &str) -> Result<(), Vec<String>> {
        let loaded =
            config::load_text(&self.path, text, Purpose::Run, &ProcessEnv).map_err(|e| e.lines)?;
        let old = self.live.load_full();
        let (settings, fixed) = keep_fixed(&old, loaded.settings)
            .map_err(|e| vec![format!("{}: {e}", self.path.display())])?;
        for key in &fixed {
            tracing::warn!(
                key,
                "config reload: {key} changed, which needs a restart; the running value stays in force until then"
            );
        }
        // Added destinations start before ingress routes to them; removed
        // ones retire after it stops routing to them.
        let added = self
            .fleet
            .apply(&settings)
            .map_err(|e| vec![e.to_string()])?;
        crate::logging::reconfigure(&settings.log);
        self.live.store(Arc::new(settings));
        let removed = self.fleet.retire(&self.live.load());
        metrics::config_loaded();
        tracing::info!(
            trigger = why,
            file = %self.path.display(),
            added = %added.join(","),
            removed = %removed.join(","),
            "config reloaded"
        );
        for name in &removed {
            tracing::warn!(destination = %name, "destination removed by a reload: its pending events stay in the journal (orphaned) and are delivered if it is configured again");
        }
        Ok(())
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
/// and the keys whose new value was not taken. Refused when the result
/// would leave the admin API on a pod address without a token: the rule
/// holds for the address in force, not the one written.
pub fn keep_fixed(
    old: &Settings,
    mut new: Settings,
) -> Result<(Settings, Vec<&'static str>), String> {
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
    if new.handoff != old.handoff {
        fixed.push("handoff");
        new.handoff = old.handoff.clone();
    }
    // The exporter and the tracer every attempt stack holds are built once.
    if new.tracing != old.tracing {
        fixed.push("tracing");
        new.tracing = old.tracing.clone();
    }
    // Its partitions are sized by `retain` and `max_bytes` when opened.
    if new.history != old.history {
        fixed.push("history");
        new.history = old.history;
    }
    // Lanes are built from the journal under one key; a new key would
    // reorder events already waiting under the old one.
    let mut reordered = false;
    for dest in &mut new.destinations {
        if let Some(was) = old.destination(&dest.name)
            && was.ordering != dest.ordering
        {
            Arc::make_mut(dest).ordering = was.ordering.clone();
            reordered = true;
        }
    }
    if reordered {
        fixed.push("destinations.*.ordering");
    }
    if new.ingress.dedupe_window != old.ingress.dedupe_window {
        fixed.push("ingress.dedupe_window");
        new.ingress.dedupe_window = old.ingress.dedupe_window;
    }
    if new.log.format != old.log.format {
        fixed.push("log.format");
        new.log.format = old.log.format;
    }
    // Sized once: a budget shrunk while bodies hold it would have to
    // take room back from them.
    if new.ingress.max_inflight_bytes != old.ingress.max_inflight_bytes {
        fixed.push("ingress.max_inflight_bytes");
        new.ingress.max_inflight_bytes = old.ingress.max_inflight_bytes;
    }
    if new.ingress.max_body_bytes > new.ingress.max_inflight_bytes {
        return Err(format!(
            "ingress.max_body_bytes: {} is more than ingress.max_inflight_bytes in force ({}), which only a restart changes: a body of that size could never be accepted",
            new.ingress.max_body_bytes, new.ingress.max_inflight_bytes
        ));
    }
    // Pending events were stored for one kind: those of a fixed url name
    // no endpoint, those of `per_event` would go to the fixed url.
    for dest in &new.destinations {
        if let Some(was) = old.destination(&dest.name)
            && was.per_event.is_some() != dest.per_event.is_some()
        {
            return Err(format!(
                "destinations.{}.url: switching between a fixed url and per_event takes a restart (docs/endpoints.md): events pending now were stored for the other kind",
                dest.name
            ));
        }
    }
    if !new.admin_listen.ip().is_loopback() && new.admin_token.is_none() {
        return Err(format!(
            "admin_token_env: required while admin_listen is `{}`, which only a restart changes",
            new.admin_listen
        ));
    }
    Ok((new, fixed))
}

/// The SIGHUP handler, installed first thing at start: SIGHUP's default
/// action ends the process, and a config reloader may send one while a
/// large journal is still being recovered. One that comes early is kept
/// and reloads once `run` starts.
pub fn hangups() -> Option<Signal> {
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle SIGHUP; the config reloads only on file changes");
            None
        }
    }
}

/// Reloads on SIGHUP and on changes in the config's folder until `stop`.
/// The watch is in place when this returns, before courier says it is
/// listening: an edit written right after that is seen.
pub fn spawn(
    reloader: Reloader,
    hup: Option<Signal>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let (tx, changed) = mpsc::channel::<()>(1);
    let watcher = watch_folder(&reloader.path, tx.clone());
    // An edit between the start's read and the watch: one look covers it
    // (an unchanged file is no reload).
    let _ = tx.try_send(());
    tokio::spawn(run(reloader, hup, stop, watcher, changed))
}

async fn run(
    mut reloader: Reloader,
    mut hup: Option<Signal>,
    stop: CancellationToken,
    // Held until the end of this function, which ends the watch.
    _watcher: Option<notify::RecommendedWatcher>,
    mut changed: mpsc::Receiver<()>,
) {
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
    let name = path.file_name().map(|n| n.to_os_string());
    let watched = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if concerns_config(&event, name.as_deref()) {
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

/// A change to the config file itself (an edit, a rename over it) or to
/// the kubelet's `..data` link. Not an access: reading the file, as every
/// reload does, must not set off another read; nor anything else in the
/// folder, such as a journal kept beside the config.
fn concerns_config(event: &notify::Event, name: Option<&OsStr>) -> bool {
    use notify::EventKind;
    if !matches!(
        event.kind,
        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_) | EventKind::Any
    ) {
        return false;
    }
    event
        .paths
        .iter()
        .filter_map(|p| p.file_name())
        .any(|f| Some(f) == name || f.to_str().is_some_and(|f| f.starts_with("..data")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Env, parse};

    /// Only `ADMIN_TOKEN` is set.
    struct TestEnv;
    impl Env for TestEnv {
        fn get(&self, name: &str) -> Option<String> {
            (name == "ADMIN_TOKEN").then(|| "t0ken".into())
        }
    }

    fn settings(text: &str) -> Settings {
        parse(
            "c.yaml",
            text,
            "/etc/courier".into(),
            Purpose::Run,
            &TestEnv,
        )
        .expect("valid")
        .settings
    }

    #[test]
    fn a_reload_cannot_drop_the_token_of_an_admin_api_on_a_pod_address() {
        let pod = OLD.replace(
            "admin_listen: 127.0.0.1:9090",
            "admin_listen: 0.0.0.0:9090\nadmin_token_env: ADMIN_TOKEN",
        );
        // Valid on its own (loopback needs no token), but 0.0.0.0 stays.
        let e = keep_fixed(&settings(&pod), settings(OLD))
            .map(|_| ())
            .expect_err("refused");
        assert!(
            e.starts_with("admin_token_env: required while admin_listen is `0.0.0.0:9090`"),
            "{e}"
        );
        let (kept, fixed) = keep_fixed(&settings(&pod), settings(&pod)).expect("kept");
        assert!(fixed.is_empty() && kept.admin_token.is_some());
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
ingress: { dedupe_window: 2m, max_body_bytes: 2KiB, max_inflight_bytes: 1GiB }
log: { level: debug, format: json }
history: { retain: 0s }
destinations:
  b: { url: http://127.0.0.1:9/b }
";
        let (kept, fixed) = keep_fixed(&settings(OLD), settings(new)).expect("kept");
        assert_eq!(
            fixed,
            [
                "listen",
                "admin_listen",
                "journal",
                "history",
                "ingress.dedupe_window",
                "log.format",
                "ingress.max_inflight_bytes"
            ]
        );
        assert!(kept.history.is_some(), "history stays on until a restart");
        assert_eq!(kept.listen.port(), 8080);
        assert_eq!(kept.admin_listen.port(), 9090);
        assert_eq!(kept.journal.dir, Path::new("/var/lib/courier/journal"));
        assert_eq!(kept.ingress.dedupe_window, Some(Duration::from_secs(60)));
        assert_eq!(kept.log.format, crate::config::LogFormat::Text);
        assert_eq!(kept.ingress.max_inflight_bytes, 64 << 20);
        // What a reload may change is taken.
        assert_eq!(kept.log.level, "debug");
        assert_eq!(kept.ingress.max_body_bytes, 2048);
        assert_eq!(kept.destinations[0].name, "b");
    }

    #[test]
    fn tracing_waits_for_a_restart() {
        let on = format!("{OLD}tracing: {{ otlp_endpoint: http://127.0.0.1:4318 }}\n");
        let (kept, fixed) = keep_fixed(&settings(OLD), settings(&on)).expect("kept");
        assert_eq!(fixed, ["tracing"]);
        assert_eq!(kept.tracing, None, "stays off until a restart");
    }

    #[test]
    fn a_running_destinations_ordering_key_waits_for_a_restart_a_new_ones_does_not() {
        let new = OLD.replace(
            "  a: { url: http://127.0.0.1:9/a }",
            "  a: { url: http://127.0.0.1:9/a, ordering: { key: destination } }\n  \
             b: { url: http://127.0.0.1:9/b, ordering: { key: destination } }",
        );
        let (kept, fixed) = keep_fixed(&settings(OLD), settings(&new)).expect("kept");
        assert_eq!(fixed, ["destinations.*.ordering"]);
        let key = |name: &str| kept.destination(name).and_then(|d| d.ordering.clone());
        assert_eq!(key("a"), None, "a keeps running unordered until a restart");
        assert_eq!(key("b"), Some(crate::event::ordering::Key::Destination));
    }

    #[test]
    fn a_reload_cannot_switch_a_destination_between_a_fixed_url_and_per_event() {
        let per_event = OLD.replace(
            "  a: { url: http://127.0.0.1:9/a }",
            "  a: { url: per_event }\n  b: { url: per_event }",
        );
        let e = keep_fixed(&settings(OLD), settings(&per_event)).expect_err("refused");
        assert!(
            e.contains("destinations.a.url") && e.contains("restart"),
            "{e}"
        );
        let e = keep_fixed(&settings(&per_event), settings(OLD)).expect_err("refused");
        assert!(e.contains("destinations.a.url"), "{e}");
        // A new destination may be either.
        assert!(
            keep_fixed(
                &settings(OLD),
                settings(&OLD.replace(
                    "  a: { url: http://127.0.0.1:9/a }",
                    "  a: { url: http://127.0.0.1:9/a }\n  b: { url: per_event }",
                ))
            )
            .is_ok()
        );
    }

    #[test]
    fn a_reload_cannot_raise_the_body_limit_past_the_budget_in_force() {
        let small = OLD.replace(
            "max_body_bytes: 1KiB }",
            "max_body_bytes: 1KiB, max_inflight_bytes: 2MiB }",
        );
        let larger = small
            .replace("max_body_bytes: 1KiB", "max_body_bytes: 4MiB")
            .replace("max_inflight_bytes: 2MiB", "max_inflight_bytes: 8MiB");
        let e = keep_fixed(&settings(&small), settings(&larger))
            .map(|_| ())
            .expect_err("refused");
        assert!(
            e.starts_with("ingress.max_body_bytes: 4194304 is more than ingress.max_inflight_bytes in force (2097152)"),
            "{e}"
        );
    }

    #[test]
    fn an_unchanged_config_keeps_nothing_back() {
        let (_, fixed) = keep_fixed(&settings(OLD), settings(OLD)).expect("kept");
        assert!(fixed.is_empty(), "{fixed:?}");
    }
}

#[cfg(test)]
mod watch_tests {
    use super::*;
    use notify::event::{AccessKind, CreateKind, EventKind, ModifyKind, RenameMode};

    fn event(kind: EventKind, path: &str) -> notify::Event {
        notify::Event::new(kind).add_path(PathBuf::from(path))
    }

    #[test]
    fn only_changes_to_the_config_or_its_data_link_count() {
        let name = Some(OsStr::new("courier.yaml"));
        let rename = EventKind::Modify(ModifyKind::Name(RenameMode::To));
        assert!(concerns_config(
            &event(rename, "/etc/courier/courier.yaml"),
            name
        ));
        assert!(concerns_config(&event(rename, "/etc/courier/..data"), name));
        let create = EventKind::Create(CreateKind::Any);
        assert!(concerns_config(
            &event(create, "/etc/courier/..data_tmp"),
            name
        ));
        // Reading the file (each reload does) is no change.
        let open = EventKind::Access(AccessKind::Any);
        assert!(!concerns_config(
            &event(open, "/etc/courier/courier.yaml"),
            name
        ));
        // Other files in the folder: a journal, an editor's swap file.
        assert!(!concerns_config(&event(create, "/etc/courier/data"), name));
        assert!(!concerns_config(
            &event(rename, "/etc/courier/.courier.yaml.swp"),
            name
        ));
    }
}
