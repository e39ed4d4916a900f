//! Writes a group of dead letters, retrying until the sink takes them: a
//! sink may be down for an hour (a bucket, a full volume), and the events
//! wait in the journal meanwhile, neither sent again nor lost. Runs apart
//! from delivery: the dispatcher hands a group here, so that a sink that
//! is down never holds an attempt slot a live event could use.

use super::streak::{Say, SinkStreak};
use super::{DeadLetterSink, Line, write_once};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A failed write waits this long before the next try, doubled after
/// each failure up to `RETRY_MAX`.
const RETRY: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// A destination's sink, and the streak of its failed writes (kept across
/// reloads by the caller: a reload neither ends a streak nor logs its
/// start again).
pub struct Writer<'a> {
    pub sink: &'a Arc<dyn DeadLetterSink>,
    pub destination: &'a str,
    pub streak: &'a Mutex<SinkStreak>,
    /// Counts a failed write (`courier_dead_letter_write_failures_total`).
    pub on_failure: &'a (dyn Fn() + Sync),
}

impl Writer<'_> {
    fn streak(&self) -> std::sync::MutexGuard<'_, SinkStreak> {
        self.streak.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns once every record of `lines` is in the sink, synced. With
    /// `check`, records the sink already holds are not written again
    /// (`write_once`); a failed write checks on its retries, as it may have
    /// reached the sink in part.
    pub async fn write(&self, lines: Arc<[Line]>, mut check: bool) {
        let first = lines.first().map_or("", |l| l.key.id.as_str()).to_string();
        let events = lines.len();
        let mut wait = RETRY;
        loop {
            let (sink, name, batch) = (
                self.sink.clone(),
                self.destination.to_string(),
                lines.clone(),
            );
            let error = match tokio::task::spawn_blocking(move || {
                write_once(sink.as_ref(), &name, &batch, check)
            })
            .await
            {
                Ok(Ok(())) => break,
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            };
            (self.on_failure)();
            let message = "cannot write the dead letter; retrying";
            let (destination, retry_s) = (self.destination, wait.as_secs());
            let said = self.streak().failed(tokio::time::Instant::now());
            match said {
                Say::Loud => {
                    tracing::error!(destination, id = %first, events, retry_s, error, "{message}");
                }
                Say::Remind(t) => {
                    tracing::error!(destination, id = %first, events, retry_s, error,
                        failures = t.failures, streak_s = t.lasted.as_secs(), "{message}");
                }
                Say::Quiet => {
                    tracing::debug!(destination, id = %first, events, retry_s, error, "{message}");
                }
            }
            check = true;
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(RETRY_MAX);
        }
        let ended = self.streak().written(tokio::time::Instant::now());
        if let Some(t) = ended {
            tracing::info!(
                destination = self.destination,
                failures = t.failures,
                streak_s = t.lasted.as_secs(),
                "dead letters are written again"
            );
        }
    }
}
