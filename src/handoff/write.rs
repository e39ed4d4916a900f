//! The hand-off at shutdown: every pending event, read from the journal in
//! seq order, goes into objects of up to `OBJECT_BYTES`; each object is
//! stored, then its events are deleted from the journal (a synced commit).
//! A crash between the two leaves an event in both places: delivered
//! twice at worst, never lost. Objects are stored a few at a time, and
//! the whole is bounded by a deadline: what is not handed off by then
//! stays in the journal for the next start on this volume.

use super::Handoff;
use super::object::Builder;
use crate::journal::{Carried, Change, Journal, Reader};
use crate::metrics;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// An object holds about this many bytes of events: few requests for a
/// large backlog (100 for 100,000 events of 1 KiB), and little memory held
/// per object in flight (4 MiB objects peaked courier at 74 MiB).
const OBJECT_BYTES: usize = 1 << 20;
/// Events read from the journal at a time, and their bytes at most.
const READ_EVENTS: usize = 1000;
const READ_BYTES: u64 = 1 << 20;
/// Objects being stored at once.
const IN_FLIGHT: usize = 4;
/// The first wait after a failed store, doubled up to `RETRY_MAX`.
const RETRY: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(4);

/// What a hand-off did.
#[derive(Debug, Default, PartialEq)]
pub struct Written {
    pub events: u64,
    pub objects: u64,
    pub bytes: u64,
    /// Whether events are left in the journal (the deadline came first, or
    /// the store or the journal refused).
    pub left: bool,
}

/// Hands off every pending event before `deadline`.
pub async fn hand_off(h: &Arc<Handoff>, journal: &Journal, deadline: Instant) -> Written {
    let started = Instant::now();
    let mut done = Written::default();
    let reader = match journal.reader() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "hand-off: cannot read the journal; pending events stay in it for the next start");
            done.left = true;
            return done;
        }
    };
    if let Err(e) = probe(h).await {
        tracing::error!(url = %h.bucket.label(), error = %e,
            "hand-off: the store cannot take a conditional create, so no courier could claim a hand-off there; pending events stay in the journal for the next start");
        done.left = true;
        return done;
    }
    if let Err(e) = journal.index_all().await {
        tracing::error!(error = %e, "hand-off: the journal cannot index its log; pending events stay in it for the next start");
        done.left = true;
        return done;
    }
    let mut tasks: JoinSet<Stored> = JoinSet::new();
    let mut failed = false;
    let mut after = 0;
    let mut object = Builder::default();
    let mut seqs = Vec::new();
    // Bounded: each round reads past at least one seq, or stops.
    while !failed && Instant::now() < deadline {
        let (events, last) = match reader.pending_after(after, READ_EVENTS, READ_BYTES).await {
            Ok(page) => page,
            Err(e) => {
                tracing::error!(error = %e, "hand-off: cannot read pending events");
                failed = true;
                break;
            }
        };
        for ev in events {
            object.push(&ev.event, &Carried::of(&ev));
            seqs.push(ev.seq);
            if object.size() >= OBJECT_BYTES {
                failed |= !flush(
                    h,
                    journal,
                    deadline,
                    &mut object,
                    &mut seqs,
                    &mut tasks,
                    &mut done,
                )
                .await;
            }
        }
        if last.is_none() && object.count() > 0 {
            failed |= !flush(
                h,
                journal,
                deadline,
                &mut object,
                &mut seqs,
                &mut tasks,
                &mut done,
            )
            .await;
        }
        match last {
            Some(seq) => after = seq,
            None => break,
        }
    }
    // Bounded by the deadline each task keeps.
    while let Some(r) = tasks.join_next().await {
        failed |= !settled(Some(r), &mut done);
    }
    done.left =
        failed || !seqs.is_empty() || (Instant::now() >= deadline && pending(&reader, after).await);
    let took_ms = started.elapsed().as_millis() as u64;
    if done.left {
        tracing::error!(
            events = done.events,
            objects = done.objects,
            bytes = done.bytes,
            took_ms,
            "hand-off incomplete: the events not handed off stay in the journal, and are delivered after the next start on this volume"
        );
    } else {
        tracing::info!(events = done.events, objects = done.objects, bytes = done.bytes, took_ms, url = %h.bucket.label(),
            "handed off every pending event");
    }
    done
}

/// Creates and removes an object with a conditional create, as adoption
/// claims: a store that refuses it (unreachable, or without conditional
/// writes) would take the events and never give them to anyone.
async fn probe(h: &Handoff) -> Result<(), String> {
    let name = format!("{}.probe", uuid::Uuid::now_v7().simple());
    let path = h.bucket.path([super::CLAIMS, name.as_str()]);
    match h.bucket.create(&path, Bytes::from_static(b"probe")).await {
        Ok(crate::bucket::Created::Won) => {
            let _ = h.bucket.delete(&path).await;
            Ok(())
        }
        Ok(crate::bucket::Created::Exists) => Err("a new object's conditional create lost".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Hands the object built so far to a task that stores it, once fewer than
/// `IN_FLIGHT` are; false when one that ended meanwhile had failed.
async fn flush(
    h: &Arc<Handoff>,
    journal: &Journal,
    deadline: Instant,
    object: &mut Builder,
    seqs: &mut Vec<i64>,
    tasks: &mut JoinSet<Stored>,
    done: &mut Written,
) -> bool {
    let mut ok = true;
    while tasks.len() >= IN_FLIGHT {
        ok &= settled(tasks.join_next().await, done);
    }
    let full = std::mem::take(object);
    let store = Store {
        bucket_path: h.object(&object_name(full.count())),
        seqs: std::mem::take(seqs),
        bytes: Bytes::from(full.finish()),
    };
    let (journal, h) = (journal.clone(), h.clone());
    tasks.spawn(async move { store.run(&h, &journal, deadline).await });
    ok
}

/// Whether any event is left after `after` (the deadline stopped the read).
async fn pending(reader: &Reader, after: i64) -> bool {
    reader
        .pending_after(after, 1, 1)
        .await
        .map_or(true, |(events, _)| !events.is_empty())
}

/// Adds a stored object to `done`; false when it failed.
fn settled(r: Option<Result<Stored, tokio::task::JoinError>>, done: &mut Written) -> bool {
    match r {
        Some(Ok(Ok((events, bytes)))) => {
            done.events += events;
            done.bytes += bytes;
            done.objects += 1;
            true
        }
        Some(Ok(Err(e))) => {
            tracing::error!(error = %e, "hand-off: an object could not be stored; its events stay in the journal");
            false
        }
        Some(Err(e)) => {
            tracing::error!(error = %e, "hand-off: a store task failed; its events stay in the journal");
            false
        }
        None => true,
    }
}

/// `<uuidv7>-<events>.cho`: names sort by when they were written.
fn object_name(events: u32) -> String {
    format!("{}-{events}.cho", uuid::Uuid::now_v7().simple())
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
        let deletes: Vec<Change> = self
            .seqs
            .iter()
            .map(|&seq| Change::Delete {
                seq,
                only_if_attempts: None,
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
