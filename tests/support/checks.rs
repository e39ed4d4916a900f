//! Checks that print courier's logs when they fail: the `fail!`, `check!`
//! and `check_eq!` macros (first argument: anything with `.logs()`, e.g. a
//! `Courier`) and bounded waits built on them.
//!
//! The macros are exported at the crate's root: `use support::{check, fail};`.

use std::time::{Duration, Instant};

use super::client::metric;
use super::courier::Courier;
use super::receiver::{Received, Receiver};

const POLL: Duration = Duration::from_millis(10);

/// `panic!` with courier's logs appended.
#[macro_export]
macro_rules! fail {
    ($c:expr, $($arg:tt)+) => {
        panic!("{}\n--- courier logs ---\n{}", format!($($arg)+), $c.logs())
    };
}

/// `assert!` that shows courier's logs when it fails.
#[macro_export]
macro_rules! check {
    ($c:expr, $cond:expr) => {
        $crate::check!($c, $cond, "{}", stringify!($cond))
    };
    ($c:expr, $cond:expr, $($arg:tt)+) => {
        if !$cond {
            $crate::fail!($c, "check failed: {}: {}", stringify!($cond), format!($($arg)+));
        }
    };
}

/// `assert_eq!` that shows courier's logs when it fails.
#[macro_export]
macro_rules! check_eq {
    ($c:expr, $left:expr, $right:expr) => {
        $crate::check_eq!($c, $left, $right, "{}", stringify!($left))
    };
    ($c:expr, $left:expr, $right:expr, $($arg:tt)+) => {{
        let (left, right) = (&$left, &$right);
        if left != right {
            $crate::fail!(
                $c,
                "{}\n  left: {:?}\n right: {:?}",
                format!($($arg)+),
                left,
                right
            );
        }
    }};
}

/// Waits (bounded) until the receiver got at least `n` requests.
pub async fn requests(c: &Courier, rx: &Receiver, n: usize, timeout: Duration) -> Vec<Received> {
    match rx.try_wait_for(n, timeout).await {
        Some(got) => got,
        None => fail!(
            c,
            "receiver: waited {timeout:?} for {n} requests, got {}",
            rx.count()
        ),
    }
}

/// Checks that the receiver gets no request beyond `expected` within `window`.
pub async fn quiet(c: &Courier, rx: &Receiver, expected: usize, window: Duration) {
    if rx.try_wait_for(expected + 1, window).await.is_some() {
        fail!(
            c,
            "receiver: expected {expected} requests in total within {window:?}, got {}",
            rx.count()
        );
    }
    check_eq!(c, rx.count(), expected, "receiver request count");
}

/// Waits (bounded) until the series has exactly the value `want`.
pub async fn wait_metric(c: &Courier, series: &str, want: f64, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut last;
    // Bounded by the deadline.
    loop {
        last = metric(&c.admin_url(), series).await;
        if last == Some(want) || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    check_eq!(c, last, Some(want), "metric {series} after {timeout:?}");
}

/// Taken by tests whose assertions are timings (µs of order, latency
/// that doubles) and by tests that load both cores for seconds (a 300 MiB
/// upload, thousands of objects, 15,000 events through a hand-off), so
/// that the one never runs beside the other: the suite runs two tests at
/// a time on a machine of two cores.
pub async fn alone() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}
