//! Wall-clock time as the journal stores it: milliseconds since the Unix
//! epoch, so due times and TTLs survive a restart.

pub mod rfc3339;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[cfg(not(test))]
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Under test, wall time is read off tokio's clock, so that a test that
/// pauses time steps due times and TTLs with the timers that wait for
/// them. Unpaused, it runs with real time.
#[cfg(test)]
pub fn now_ms() -> u64 {
    static ORIGIN: std::sync::OnceLock<(u128, std::time::Instant)> = std::sync::OnceLock::new();
    let (wall_ns, at) = *ORIGIN.get_or_init(|| {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        (wall.as_nanos(), std::time::Instant::now())
    });
    // Signed: a runtime paused before the origin was taken reads earlier.
    let t = tokio::time::Instant::now().into_std();
    let ns = match t.checked_duration_since(at) {
        Some(d) => wall_ns + d.as_nanos(),
        None => wall_ns - at.duration_since(t).as_nanos(),
    };
    (ns / 1_000_000) as u64
}

pub fn to_system(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// RFC 3339 with microseconds, as Event Grid prints its times.
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_micros(to_system(ms)).to_string()
}

/// Microseconds on a monotonic clock, for spacing attempts.
#[cfg(not(test))]
pub fn mono_us() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_micros() as u64
}

/// Under test, off tokio's clock as `now_ms` is (to the ms), so that a
/// paused test steps the rate limit's spacing with its timers.
#[cfg(test)]
pub fn mono_us() -> u64 {
    now_ms() * 1000
}
