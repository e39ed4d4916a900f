//! The indexer's history job: records in event history what each commit
//! makes durable, syncs it before the journal's own synced commits, and
//! rolls its partitions. A failure is said (at most every 10 s) and never
//! stops the journal: history serves operators, the journal the events.

use crate::history::{Accepted, Recorder, Step};
use crate::journal::Change;
use crate::journal::intake::Logged;
use crate::journal::store;
use rusqlite::Connection;
use std::time::{Duration, Instant};

pub(super) struct HistoryJob {
    recorder: Recorder,
    /// When a failure was last logged.
    strain: Option<Instant>,
}

impl HistoryJob {
    pub fn new(recorder: Recorder) -> HistoryJob {
        HistoryJob {
            recorder,
            strain: None,
        }
    }

    /// `delivered`: the deliveries of the events not inserted, as `Skip`
    /// kept them; synced at once when the commit is (`full`).
    pub fn record(
        &mut self,
        events: &[Logged],
        delivered: &[Option<Step>],
        changes: &[Change],
        full: bool,
    ) {
        let accepted: Vec<Accepted<'_>> = events
            .iter()
            .enumerate()
            .map(|(i, l)| Accepted {
                seq: l.seq,
                id: &l.event.id,
                destination: &l.event.destination,
                accepted_ms: l.event.accepted_ms,
                prior: l.carried.as_ref().map_or(0, |c| c.attempts),
                next_due_ms: l.carried.as_ref().map(|c| c.next_due_ms),
                delivered: delivered.get(i).and_then(Option::as_ref),
                endpoint: l.endpoint.clone(),
            })
            .collect();
        let steps: Vec<(i64, Step)> = changes
            .iter()
            .filter_map(|c| c.step().map(|s| (c.seq(), s)))
            .collect();
        let steps: Vec<(i64, &Step)> = steps.iter().map(|(seq, s)| (*seq, s)).collect();
        if let Err(e) = self.recorder.record(&accepted, &steps) {
            self.failed(&e.to_string());
        } else if full {
            self.sync();
        }
    }

    pub fn sync(&mut self) {
        if let Err(e) = self.recorder.sync() {
            self.failed(&e.to_string());
        }
    }

    /// Rolls history's partitions and drops old ones; an event still in
    /// the journal keeps its record.
    pub fn maintain(&mut self, conn: &Connection) {
        let in_journal = |seq: i64| store::holds(conn, seq).unwrap_or(true);
        if let Err(e) = self.recorder.maintain(&in_journal) {
            self.failed(&e.to_string());
        }
    }

    fn failed(&mut self, error: &str) {
        if self
            .strain
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10))
        {
            tracing::warn!(error, "cannot record event history; deliveries go on");
            self.strain = Some(Instant::now());
        }
    }
}
