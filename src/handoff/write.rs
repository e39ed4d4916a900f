//! The hand-off at shutdown: every pending event, read from the journal in
//! seq order, goes into objects of up to `OBJECT_BYTES`; each object is
//! stored, then its events are deleted from the journal (a synced commit).
//! A crash between the two leaves an event in both places: delivered
//! twice at worst, never lost. Objects are stored a few at a time, and
//! the whole is bounded by a deadline: what is not handed off by then
//! stays in the journal for the next start on this volume.

use super::Handoff;
use super::object::{self, Builder, OBJECT_BYTES};
use crate::history::Step;
use crate::journal::{Carried, Change, Journal, Reader};
use crate::metrics;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Events read from the journal at a time, and their bytes at most.
const READ_EVENTS: usize = 1000;
const READ_BYTES: u64 = 1 << 20;
/// Objects being stored at once.
const IN_FLIGHT: usize = 4;
/// The first wait after a failed store, doubled up to `RETRY_MAX`.
const RETRY: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(4);

/// What a hand-off did, for its log line.
#[derive(Default)]
struct Written {
    events: u64,
    objects: u64,
    bytes: u64,
}

/// A hand-off under way: the object being built and those being stored.
struct Run<'a> {
    h: &'a Arc<Handoff>,
    journal: &'a Journal,
    deadline: Instant,
    object: Builder,
    seqs: Vec<i64>,
    tasks: JoinSet<Stored>,
    done: Written,
    failed: bool,
}

/// Hands off every pending event before `deadline`. The journal is sealed
/// first: nothing comes in after the read (an app's request gets 503).
pub async fn hand_off(h: &Arc<Handoff>, journal: &Journal, deadline: Instant) {
    let started = Instant::now();
    journal.seal();
    let reader = match journal.reader() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "hand-off: cannot read the journal; pending events stay in it for the next start");
            return;
        }
    };
    let probed = tokio::time::timeout_at(deadline, probe(h))
        .await
        .unwrap_or_else(|_| Err("no answer before the shutdown deadline".into()));
    if let Err(e) = probed {
        tracing::error!(url = %h.bucket.label(), error = %e,
            "hand-off: the store cannot take a conditional create, so no courier could claim a hand-off there; pending events stay in the journal for the next start");
        return;
    }
    let mut run = Run {
        h,
        journal,
        deadline,
        object: Builder::default(),
        seqs: Vec::new(),
        tasks: JoinSet::new(),
        done: Written::default(),
        failed: false,
    };
    let mut after = 0;
    // A pass reads what is pending after `after`; another follows while one
    // finds more (an append queued before the seal, written after the
    // read). Bounded by the deadline.
    loop {
        if let Err(e) = journal.index_all().await {
            tracing::error!(error = %e, "hand-off: the journal cannot index its log");
            break;
        }
        let before = after;
        after = run.pass(&reader, after).await;
        run.settle_all().await;
        if run.failed || after == before || Instant::now() >= deadline {
            break;
        }
    }
    // Whatever is left (the deadline, a failed store, a row that could not
    // be read) stays in the journal: said, never silent.
    let left = reader
        .pending_after(0, 1, 1)
        .await
        .map_or(true, |(events, _)| !events.is_empty());
    let Written {
        events,
        objects,
        bytes,
    } = run.done;
    let took_ms = started.elapsed().as_millis() as u64;
    if left {
        tracing::error!(
            events,
            objects,
            bytes,
            took_ms,
            "hand-off incomplete: the events not handed off stay in the journal, and are delivered after the next start on this volume"
        );
    } else {
        tracing::info!(events, objects, bytes, took_ms, url = %h.bucket.label(),
            "handed off every pending event");
    }
}

impl Run<'_> {
    /// Reads every pending event after `after` into objects, handed to
    /// store tasks; returns the last seq read.
    async fn pass(&mut self, reader: &Reader, mut after: i64) -> i64 {
        // Bounded: each round reads past at least one seq, or stops.
        while !self.failed && Instant::now() < self.deadline {
            let (events, last) = match reader.pending_after(after, READ_EVENTS, READ_BYTES).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::error!(error = %e, "hand-off: cannot read pending events");
                    self.failed = true;
                    break;
                }
            };
            for ev in events {
                self.object.push(&ev.event, &Carried::of(&ev));
                self.seqs.push(ev.seq);
                if self.object.size() >= OBJECT_BYTES {
                    self.flush().await;
                }
            }
            match last {
                Some(seq) => after = seq,
                None => break,
            }
        }
        if self.object.count() > 0 && !self.failed {
            self.flush().await;
        }
        after
    }

    /// Hands the object built so far to a task that stores it, once fewer
    /// than `IN_FLIGHT` are.
    async fn flush(&mut self) {
        while self.tasks.len() >= IN_FLIGHT {
            let r = self.tasks.join_next().await;
            self.settled(r);
        }
        let full = std::mem::take(&mut self.object);
        let name = object::name(full.count());
        let store = Store {
            bucket_path: self.h.object(&name),
            seqs: std::mem::take(&mut self.seqs),
            bytes: Bytes::from(object::store(&self.h.settings.keys, &name, full.finish())),
        };
        let (journal, h, deadline) = (self.journal.clone(), self.h.clone(), self.deadline);
        self.tasks
            .spawn(async move { store.run(&h, &journal, deadline).await });
    }

    /// Waits for every store task (each keeps the deadline).
    async fn settle_all(&mut self) {
        while let Some(r) = self.tasks.join_next().await {
            self.settled(Some(r));
        }
    }

    fn settled(&mut self, r: Option<Result<Stored, tokio::task::JoinError>>) {
        match r {
            Some(Ok(Ok((events, bytes)))) => {
                self.done.events += events;
                self.done.bytes += bytes;
                self.done.objects += 1;
            }
            Some(Ok(Err(e))) => {
                tracing::error!(error = %e, "hand-off: an object could not be stored; its events stay in the journal");
                self.failed = true;
            }
            Some(Err(e)) => {
                tracing::error!(error = %e, "hand-off: a store task failed; its events stay in the journal");
                self.failed = true;
            }
            None => {}
        }
    }
}

/// Creates and removes an object with a conditional create, as adoption
/// claims: a store that refuses it (unreachable, or without conditional
/// writes) would take the events and never give them to anyone.
async fn probe(h: &Handoff) -> Result<(), String> {
    let name = format!("{}.probe", uuid::Uuid::now_v7().simple());
    let path = h.bucket.path([super::CLAIMS, name.as_str()]);
    match h.bucket.create(&path, Bytes::from_static(b"probe")).await {
        Ok(crate::storage::Created::Won) => {
            let _ = h.bucket.delete(&path).await;
            Ok(())
        }
        Ok(crate::storage::Created::Exists) => Err("a new object's conditional create lost".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A stored object's events and bytes, or why it was not stored.
type Stored = Result<(u64, u64), String>;

/// One object to store, and the events it holds.
struct Store {
    bucket_path: object_store::path::Path,
    seqs: Vec<i64>,
    bytes: Bytes,
}

impl Store {
    /// Stores the object (tried again until `deadline`), then deletes its
    /// events from the journal; their count and the object's size.
    async fn run(
        self,
        h: &Handoff,
        journal: &Journal,
        deadline: Instant,
    ) -> Result<(u64, u64), String> {
        let started = Instant::now();
        let mut wait = RETRY;
        // Bounded by the deadline.
        loop {
            let put = tokio::time::timeout_at(
                deadline,
                h.bucket.put(&self.bucket_path, self.bytes.clone()),
            );
            match put.await {
                Ok(Ok(())) => break,
                Ok(Err(e)) if Instant::now() + wait < deadline => {
                    tracing::warn!(object = %h.bucket.url_of(&self.bucket_path), error = %e, retry_ms = wait.as_millis() as u64, "hand-off: cannot store an object; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(RETRY_MAX);
                }
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => return Err("the shutdown deadline came first".into()),
            }
        }
        let at_ms = crate::clock::now_ms();
        let deletes: Vec<Change> = self
            .seqs
            .iter()
            .map(|&seq| Change::Delete {
                seq,
                only_if_attempts: None,
                step: Some(Step::HandedOff { at_ms }),
            })
            .collect();
        // Stored: a failed delete leaves the events in both places, which
        // delivers them twice at worst.
        journal
            .apply(&deletes)
            .await
            .map_err(|e| format!("stored, but the journal cannot forget its events ({e}): they will be delivered twice"))?;
        let events = self.seqs.len() as u64;
        metrics::handoff_events("written", events);
        tracing::info!(object = %h.bucket.url_of(&self.bucket_path), events, bytes = self.bytes.len(),
            took_ms = started.elapsed().as_millis() as u64, "hand-off object written");
        Ok((events, self.bytes.len() as u64))
    }
}
