//! How `courier run` logs (SPEC §6, README "Logs"): one `tracing`
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
use std::sync::atomic::{AtomicBool, Ordering};

/// `log.bodies`. Global like the subscriber it belongs to.
static BODIES: AtomicBool = AtomicBool::new(false);

/// A body in a log line is cut after this many bytes: enough to recognise
/// an event, not so much that one event floods the log.
const BODY_LIMIT: usize = 2048;

/// Installs the subscriber (`COURIER_LOG`, an `EnvFilter` directive, wins
/// over `log.level`) and the panic hook. Call once, before anything logs.
pub fn init(log: &LogSettings) {
    BODIES.store(log.bodies, Ordering::Relaxed);
    let filter = tracing_subscriber::EnvFilter::try_from_env("COURIER_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("warn,courier={}", log.level))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match log.format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
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
