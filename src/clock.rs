//! Wall-clock time as the journal stores it: milliseconds since the Unix
//! epoch, so due times and TTLs survive a restart.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub fn to_system(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// RFC 3339 with microseconds, as Event Grid prints its times.
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_micros(to_system(ms)).to_string()
}

/// Microseconds on a monotonic clock, for spacing attempts.
pub fn mono_us() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_micros() as u64
}
