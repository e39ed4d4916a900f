//! How `courier run` logs (docs/logs.md): one `tracing`
//! subscriber on stderr, text or one JSON object per line; a panic hook
//! that logs through it, so that JSON output stays JSON even then; and
//! `log.bodies`, the one switch that lets an event's body into a line.
//!
//! Fields are recorded as plain values: names and numbers with `%` or as
//! integers, optional ones as `Option<T>` values, which `tracing` records
//! as the inner value or leaves out (never `?option`, whose Debug text
//! would print `Some(..)`).

use crate::config::LogFormat;
use crate::config::settings::LogSettings;
use std::io::IsTerminal;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing_subscriber::EnvFilter;

mod format;
mod lines;

/// `log.bodies`. Global like the subscriber it belongs to.
static BODIES: AtomicBool = AtomicBool::new(false);

/// A body in a log line is cut after this many bytes: enough to recognise
/// an event, not so much that one event floods the log.
const BODY_LIMIT: usize = 2048;

/// Bytes queued for the writer thread before a logging task waits.
const QUEUED_BYTES: usize = 1 << 20;

/// How long the writer thread waits with nothing to write before it gives
/// back a burst's buffers (`lines`).
const REST: std::time::Duration = std::time::Duration::from_secs(1);

/// How long the writer thread lets a burst of lines gather: how late a
/// line may reach stderr, and the bound on the thread's wakeups (100/s).
const LINGER: std::time::Duration = std::time::Duration::from_millis(10);

/// Sets the level filter of the installed subscriber; `None` when
/// `COURIER_LOG` is set, which wins over `log.level` for the whole run.
type SetLevel = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;
static SET_LEVEL: OnceLock<Option<SetLevel>> = OnceLock::new();

fn filter(level: &str) -> EnvFilter {
    EnvFilter::new(format!("warn,courier={level}"))
}

/// Installs the subscriber (`COURIER_LOG`, an `EnvFilter` directive, wins
/// over `log.level`) and the panic hook. Call once, before anything logs;
/// keep the guard until exit: dropping it writes out what is queued.
///
/// Lines go to stderr from a thread of their own, each burst in one write
/// (`lines`): a write per delivered event on the delivery path showed in
/// courier's CPU under load (benches/RESULTS.md). A full queue blocks rather
/// than drops: an outcome line is a promise of docs/logs.md. A SIGKILL loses
/// only lines logged in the last `LINGER` before it.
pub fn init(log: &LogSettings) -> std::io::Result<lines::Guard> {
    BODIES.store(log.bodies, Ordering::Relaxed);
    let from_env = EnvFilter::try_from_env("COURIER_LOG").ok();
    let fixed = from_env.is_some();
    let pace = lines::Pace {
        linger: LINGER,
        rest: REST,
    };
    let (writer, guard) = lines::spawn(std::io::stderr(), pace, QUEUED_BYTES, "log-writer")?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(from_env.unwrap_or_else(|| filter(&log.level)))
        .with_writer(writer)
        .with_timer(format::Clock);
    // The handle's type differs per format: keep it behind one closure.
    let set: SetLevel = match log.format {
        LogFormat::Json => {
            let builder = builder.json().flatten_event(true).with_filter_reloading();
            let handle = builder.reload_handle();
            builder.init();
            Box::new(move |level| handle.reload(filter(level)).map_err(|e| e.to_string()))
        }
        LogFormat::Text => {
            let builder = builder
                .fmt_fields(format::Fields)
                .with_ansi(std::io::stderr().is_terminal())
                .with_filter_reloading();
            let handle = builder.reload_handle();
            builder.init();
            Box::new(move |level| handle.reload(filter(level)).map_err(|e| e.to_string()))
        }
    };
    let _ = SET_LEVEL.set((!fixed).then_some(set));
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        let location = info.location().map(tracing::field::display);
        tracing::error!(
            panic = message,
            location,
            "a courier task panicked (a bug; please report it)"
        );
    }));
    Ok(guard)
}

/// Applies a reloaded config's `log.level` and `log.bodies` (the format
/// is fixed once the subscriber is installed).
pub fn reconfigure(log: &LogSettings) {
    BODIES.store(log.bodies, Ordering::Relaxed);
    if let Some(Some(set)) = SET_LEVEL.get()
        && let Err(e) = set(&log.level)
    {
        tracing::warn!(error = %e, "cannot change the log level");
    }
}

/// The body as it may appear in a log line: `None` unless `log.bodies` is
/// on; else lossy UTF-8 of at most `BODY_LIMIT` bytes, and when cut, the
/// full size after `…`.
pub(crate) fn body(bytes: &[u8]) -> Option<String> {
    BODIES
        .load(Ordering::Relaxed)
        .then(|| shown_body(bytes, BODY_LIMIT))
}

fn shown_body(bytes: &[u8], limit: usize) -> String {
    if bytes.len() <= limit {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    // Back up to the start of a UTF-8 character (at most 3 bytes), so the
    // cut does not leave a replacement character behind.
    let mut cut = limit;
    for _ in 0..3 {
        if cut > 0 && bytes[cut] & 0xC0 == 0x80 {
            cut -= 1;
        }
    }
    format!(
        "{}…({} bytes)",
        String::from_utf8_lossy(&bytes[..cut]),
        bytes.len()
    )
}

#[cfg(test)]
mod tests {
    use super::shown_body;

    #[test]
    fn short_bodies_are_shown_whole() {
        assert_eq!(shown_body(br#"{"a":1}"#, 16), r#"{"a":1}"#);
        assert_eq!(shown_body(b"\xff ok", 16), "\u{fffd} ok");
    }

    #[test]
    fn long_bodies_are_cut_with_their_size() {
        assert_eq!(shown_body(b"abcdefgh", 4), "abcd…(8 bytes)");
    }

    #[test]
    fn the_cut_never_splits_a_character() {
        // "é" is two bytes; a cut after its first byte moves before it.
        assert_eq!(shown_body("abcé".as_bytes(), 4), "abc…(5 bytes)");
        assert_eq!(shown_body("ééé".as_bytes(), 3), "é…(6 bytes)");
    }
}
