//! Adoption: at start and every `handoff.poll`, each hand-off object in the
//! store is claimed (a conditional create of its next claim generation:
//! one courier wins), read, checked, appended to this journal with its
//! events' delivery state (durable), then deleted with its claims.
//!
//! The bucket is read as untrusted input (docs/object-storage.md): a key
//! that is not a name courier writes is skipped with one warning; an object
//! larger than a hand-off object can be is set aside unread; every event
//! passes the checks ingress applies to a request (`event::rules`) or is
//! set aside with its reason. Objects are adopted a few at a time, within
//! a budget of bytes held, those that look like hand-offs before those
//! that are set aside.
//!
//! A courier that cannot take all of an object now (its journal or a
//! destination's share is full) keeps its claim, refreshes it at every
//! look, and resumes where it stopped: it never takes over its own claim,
//! and no other courier takes over a claim that is refreshed. A claim not
//! refreshed for `claim_timeout` belongs to a courier that stopped while
//! adopting; the next generation takes it over.

use super::object;
use super::{DAMAGED, Handoff};
use crate::config::Live;
use crate::event::rules::{self, Limits, Refused};
use crate::event::{NewEvent, Reason};
use crate::journal::{Carried, Journal, JournalError};
use crate::metrics;
use crate::storage::{Created, GetError};
use bytes::Bytes;
use futures::StreamExt;
use object_store::ObjectMeta;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Events appended to the journal per commit, at most.
const ADOPT_EVENTS: usize = 1000;
/// Objects adopted at once.
const PARALLEL: usize = 4;
/// Bytes of objects held in memory at once (an object larger than this is
/// read alone): with their decoded events, about twice this at the peak.
const HELD_BYTES: u64 = 4 << 20;
/// Odd keys remembered so that each is warned about once.
const WARNED_KEYS: usize = 10_000;
/// Attempts of a carried state beyond this are not a courier's.
const MAX_ATTEMPTS: u32 = 100_000;

/// Looks for hand-offs until `stop`: at once, then every `poll` (sooner
/// while a claim of this courier must be refreshed).
pub async fn adopt_loop(
    h: Arc<Handoff>,
    journal: Journal,
    live: Arc<Live>,
    stop: CancellationToken,
) {
    let mut adopter = Adopter {
        me: claimer(),
        h,
        journal,
        live,
        held: HashMap::new(),
        warned: HashSet::new(),
        budget: Arc::new(Semaphore::new(HELD_BYTES as usize)),
    };
    tracing::info!(url = %adopter.h.bucket.label(), poll_s = adopter.h.settings.poll.as_secs_f64(), claimer = %adopter.me, "looking for hand-offs to adopt");
    // Ends when `stop` is cancelled.
    loop {
        adopter.look(&stop).await;
        let wait = if adopter.held.is_empty() {
            adopter.h.settings.poll
        } else {
            adopter
                .h
                .settings
                .poll
                .min(adopter.h.settings.claim_timeout / 3)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => break,
        }
    }
    adopter.release().await;
}

/// Who claims: the pod (`HOSTNAME` in Kubernetes), the process, and a
/// fresh id, so that a restarted process never takes a claim of its
/// previous life for its own.
fn claimer() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "courier".into());
    format!(
        "{host} pid {} {}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    )
}

/// An object this courier has claimed and not yet finished: the claim's
/// generation, and how many of its events are already in the journal.
#[derive(Debug, Clone, Copy)]
struct Held {
    generation: u32,
    adopted: usize,
}

struct Adopter {
    me: String,
    h: Arc<Handoff>,
    journal: Journal,
    live: Arc<Live>,
    held: HashMap<String, Held>,
    warned: HashSet<String>,
    budget: Arc<Semaphore>,
}

/// What one look does with a listed object.
enum Plan {
    Adopt { name: String, size: u64 },
    SetAside { name: String, why: String },
}

impl Adopter {
    /// One look: every object waiting, those that look like hand-offs first.
    async fn look(&mut self, stop: &CancellationToken) {
        let listed = match self.h.bucket.list_keys(&self.h.pending()).await {
            Ok(listed) => listed,
            Err(e) => {
                tracing::warn!(url = %self.h.bucket.label(), error = %e, "cannot look for hand-offs; trying again at the next poll");
                return;
            }
        };
        for key in listed.skipped {
            self.warn_once(key, "its key is not a path");
        }
        let limits = self.limits();
        let max = object::max_size(limits.max_body_bytes);
        let now_ms = crate::clock::now_ms() as i64;
        let mut plans = Vec::new();
        let mut oldest = 0;
        for meta in listed.objects {
            if let Some(plan) = self.plan(&meta, max) {
                oldest = oldest.max(now_ms.saturating_sub(meta.last_modified.timestamp_millis()));
                plans.push(plan);
            }
        }
        metrics::handoff_waiting(plans.len(), Duration::from_millis(oldest.max(0) as u64));
        // Stable: adoptions in name (time) order, then what is set aside.
        plans.sort_by_key(|p| matches!(p, Plan::SetAside { .. }));
        // A claim of an object no longer listed holds nothing.
        let mut held = std::mem::take(&mut self.held);
        let jobs = plans.into_iter().map(|plan| {
            let held = match &plan {
                Plan::Adopt { name, .. } => held.remove(name),
                Plan::SetAside { .. } => None,
            };
            let job = Job {
                h: &self.h,
                journal: &self.journal,
                me: &self.me,
                limits,
                budget: &self.budget,
                stop,
            };
            async move { job.run(plan, held).await }
        });
        let done: Vec<(String, Option<Held>)> = futures::stream::iter(jobs)
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        for (name, held) in done {
            if let Some(held) = held {
                self.held.insert(name, held);
            }
        }
    }

    /// What to do with a listed object, or `None` when it is not ours.
    fn plan(&mut self, meta: &ObjectMeta, max: u64) -> Option<Plan> {
        let deep = meta.location.parts().count() != self.h.pending().parts().count() + 1;
        let name = meta.location.filename().unwrap_or_default().to_string();
        if deep || object::parse_name(&name).is_none() {
            self.warn_once(
                meta.location.to_string(),
                "it is not named as a hand-off object",
            );
            return None;
        }
        if meta.size > max {
            let why = format!(
                "it is {} bytes, larger than a hand-off object can be ({max} bytes at this courier's ingress.max_body_bytes)",
                meta.size
            );
            return Some(Plan::SetAside { name, why });
        }
        if meta.size < object::HEAD as u64 {
            let why = format!("it is {} bytes, too short for a hand-off object", meta.size);
            return Some(Plan::SetAside { name, why });
        }
        Some(Plan::Adopt {
            name,
            size: meta.size,
        })
    }

    fn warn_once(&mut self, key: String, why: &str) {
        if self.warned.len() < WARNED_KEYS && self.warned.insert(key.clone()) {
            tracing::warn!(url = %self.h.bucket.label(), key = %key.escape_debug(), why, "skipping an object in the hand-off folder that is not a hand-off");
        }
    }

    /// The checks an adopted event passes: this courier's ingress's.
    fn limits(&self) -> Limits {
        let settings = self.live.load();
        Limits {
            max_body_bytes: settings.ingress.max_body_bytes,
            keyed: settings.ingress.keys.is_some(),
        }
    }

    /// At shutdown: a claim that took nothing yet goes, so that another
    /// courier need not wait `claim_timeout`; one that took part of its
    /// object stays, and is taken over once it is no longer refreshed.
    async fn release(&mut self) {
        for (name, held) in self.held.drain() {
            if held.adopted == 0 {
                let _ = self
                    .h
                    .bucket
                    .delete(&self.h.claim(&name, held.generation))
                    .await;
            } else {
                tracing::warn!(object = %name, adopted = held.adopted, "shutting down in the middle of an adoption: the object stays claimed, and is taken over once its claim is claim_timeout old (the events adopted so far are handed off with this courier's, and may be delivered twice)");
            }
        }
    }
}

/// What one adoption needs; several run at once.
#[derive(Clone, Copy)]
struct Job<'a> {
    h: &'a Handoff,
    journal: &'a Journal,
    me: &'a str,
    limits: Limits,
    budget: &'a Semaphore,
    stop: &'a CancellationToken,
}

impl Job<'_> {
    /// The object's name, and what this courier still holds of it.
    async fn run(self, plan: Plan, held: Option<Held>) -> (String, Option<Held>) {
        match plan {
            Plan::SetAside { name, why } => {
                // Never claimed: a size no courier claims.
                move_aside(self.h, &name, &why, false).await;
                (name, None)
            }
            Plan::Adopt { name, size } => {
                let held = self.adopt(&name, size, held).await;
                (name, held)
            }
        }
    }

    /// Claims (or refreshes the claim of) `name`, then adopts what is left
    /// of it; what this courier still holds when it cannot finish now.
    async fn adopt(self, name: &str, size: u64, held: Option<Held>) -> Option<Held> {
        if self.stop.is_cancelled() {
            return held;
        }
        let held = match held {
            Some(held) => match refresh(self.h, name, held, self.me).await {
                Ok(true) => held,
                Ok(false) => return None,
                Err(e) => {
                    tracing::warn!(object = %name, error = %e, "cannot refresh the claim of a hand-off being adopted; trying again at the next poll");
                    return Some(held);
                }
            },
            None => match claim(self.h, name, self.me).await {
                Ok(Some(generation)) => Held {
                    generation,
                    adopted: 0,
                },
                Ok(None) => return None,
                Err(e) => {
                    tracing::warn!(object = %name, error = %e, "cannot claim a hand-off; trying again at the next poll");
                    return None;
                }
            },
        };
        // Held within the budget: a large object alone.
        let want = size.min(HELD_BYTES) as u32;
        let Ok(_permit) = self.budget.acquire_many(want).await else {
            return Some(held);
        };
        self.read_and_append(name, held).await
    }

    async fn read_and_append(self, name: &str, mut held: Held) -> Option<Held> {
        let started = Instant::now();
        let path = self.h.object(name);
        let max = object::max_size(self.limits.max_body_bytes);
        let stored = match self.h.bucket.get_at_most(&path, max).await {
            Ok(Some(stored)) => stored,
            Ok(None) => {
                // Adopted and deleted by a courier whose claim had timed out.
                forget_claims(self.h, name).await;
                return None;
            }
            Err(GetError::TooLarge(n)) => {
                let why = format!(
                    "it is {n} bytes or more, larger than a hand-off object can be ({max} bytes)"
                );
                // Kept claimed when it cannot be moved: this courier tries
                // again, and never takes over its own claim.
                return (!move_aside(self.h, name, &why, true).await).then_some(held);
            }
            Err(GetError::Store(e)) => {
                tracing::warn!(object = %name, error = %e, "cannot read a claimed hand-off; trying again at the next poll");
                return Some(held);
            }
        };
        let size = stored.len();
        let events = match object::read(&self.h.settings.keys, name, Vec::from(stored)) {
            Ok(events) => events,
            Err(e) => {
                let why = format!("cannot adopt a damaged hand-off: {e}");
                return (!move_aside(self.h, name, &why, true).await).then_some(held);
            }
        };
        let count = events.len();
        let (good, refused) = sort(events, self.limits);
        // Bounded: each round appends at least one event, or returns.
        let mut chunk = ADOPT_EVENTS;
        while held.adopted < good.len() {
            if self.stop.is_cancelled() {
                return Some(held);
            }
            let end = good.len().min(held.adopted + chunk);
            let n = end - held.adopted;
            match self.journal.adopt(good[held.adopted..end].to_vec()).await {
                Ok(()) => {
                    held.adopted = end;
                    chunk = ADOPT_EVENTS;
                    metrics::handoff_events("adopted", n as u64);
                }
                Err(JournalError::Full { .. } | JournalError::DestinationFull { .. }) if n > 1 => {
                    chunk = n / 2;
                }
                Err(e) => {
                    tracing::warn!(object = %name, adopted = held.adopted, events = count, error = %e,
                        "the journal cannot take a hand-off's events now: this courier keeps its claim, refreshes it, and goes on where it stopped at the next poll");
                    return Some(held);
                }
            }
        }
        // Durable in this journal's log. Indexed too before the next object:
        // appends of whole objects outrun the indexer, which would then read
        // tens of MiB of the log at once (a 100,000-event adoption peaked at
        // 87 MiB without this wait, bench step t).
        if let Err(e) = self.journal.index_all().await {
            tracing::debug!(object = %name, error = %e, "cannot index an adopted hand-off yet; its events are in the log");
        }
        if !refused.is_empty()
            && !set_aside_events(self.h, name, &refused, &self.h.settings.keys).await
        {
            return Some(held);
        }
        if let Err(e) = self.h.bucket.delete(&path).await {
            tracing::warn!(object = %name, error = %e, "adopted a hand-off but cannot delete it yet; this courier keeps its claim and tries again at the next poll");
            return Some(held);
        }
        forget_claims(self.h, name).await;
        tracing::info!(object = %self.h.bucket.url_of(&path), events = good.len(), set_aside = refused.len(), bytes = size, generation = held.generation,
            took_ms = started.elapsed().as_millis() as u64, "adopted a hand-off");
        None
    }
}

/// An event refused, with why.
pub(crate) type Aside = (NewEvent, Carried, Refused);

/// The events that pass the checks, and those refused with their reason.
pub(crate) fn sort(
    events: Vec<(NewEvent, Carried)>,
    limits: Limits,
) -> (Vec<(NewEvent, Carried)>, Vec<Aside>) {
    let mut good = Vec::with_capacity(events.len());
    let mut refused = Vec::new();
    for (e, c) in events {
        match check(&e, &c, limits) {
            Ok(()) => good.push((e, c)),
            Err(why) => refused.push((e, c, why)),
        }
    }
    (good, refused)
}

/// An adopted event passes what ingress would check of it, and carries a
/// state a courier writes.
fn check(e: &NewEvent, c: &Carried, limits: Limits) -> Result<(), Refused> {
    rules::check(
        &e.id,
        &e.destination,
        &e.method,
        &e.path,
        &e.headers,
        e.body.len(),
        limits,
    )?;
    let short = |s: &Option<String>| s.as_ref().is_none_or(|s| s.len() <= rules::MAX_ID);
    // A fate's reason not of courier's names would leave its row unreadable
    // (an unknown last outcome reads as `Failed`).
    let fate = c.fate.as_ref();
    let named = fate.is_none_or(|f| Reason::parse(&f.reason).is_some());
    if c.attempts > MAX_ATTEMPTS || !named || !short(&c.last_outcome) || !short(&c.batch) {
        return Err(Refused::State);
    }
    Ok(())
}

/// Claims `name`: the generation won, or `None` when another courier holds
/// it (a claim refreshed within `claim_timeout`) or won the race.
async fn claim(h: &Handoff, name: &str, me: &str) -> Result<Option<u32>, object_store::Error> {
    let claims = h.bucket.list(&h.claims(name)).await?;
    let last = claims
        .iter()
        .filter_map(|m| Some((m.location.filename()?.parse::<u32>().ok()?, m)))
        .max_by_key(|(generation, _)| *generation);
    let generation = match last {
        None => 0,
        Some((generation, meta)) => {
            let age_ms =
                (crate::clock::now_ms() as i64 - meta.last_modified.timestamp_millis()).max(0);
            let age = Duration::from_millis(age_ms as u64);
            if age < h.settings.claim_timeout {
                return Ok(None);
            }
            let holder = match h.bucket.get_at_most(&meta.location, 1024).await {
                Ok(Some(body)) => String::from_utf8_lossy(&body)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .escape_debug()
                    .to_string(),
                _ => "unknown".to_string(),
            };
            tracing::warn!(object = %name, claimer = %holder, unrefreshed_s = age.as_secs(), claim_timeout_s = h.settings.claim_timeout.as_secs(),
                "a hand-off's claim has not been refreshed for claim_timeout: its claimer stopped while adopting; taking it over (events it adopted before it stopped are delivered twice)");
            generation + 1
        }
    };
    let created = h
        .bucket
        .create(&h.claim(name, generation), claim_body(me))
        .await?;
    Ok(match created {
        Created::Won => Some(generation),
        Created::Exists => None,
    })
}

fn claim_body(me: &str) -> Bytes {
    Bytes::from(format!(
        "{me}\n{}\n",
        crate::clock::rfc3339(crate::clock::now_ms())
    ))
}

/// Refreshes this courier's claim of `name`: `false` when a newer
/// generation took it over (this courier was not heard from for
/// `claim_timeout`; its part is then adopted twice, which the log says).
async fn refresh(
    h: &Handoff,
    name: &str,
    held: Held,
    me: &str,
) -> Result<bool, object_store::Error> {
    let claims = h.bucket.list(&h.claims(name)).await?;
    let newer = claims.iter().any(|m| {
        m.location
            .filename()
            .and_then(|f| f.parse::<u32>().ok())
            .is_some_and(|g| g > held.generation)
    });
    if newer {
        tracing::warn!(object = %name, adopted = held.adopted, "another courier took over this courier's claim of a hand-off (it was not refreshed for claim_timeout): the events adopted so far are delivered twice");
        return Ok(false);
    }
    h.bucket
        .put(&h.claim(name, held.generation), claim_body(me))
        .await?;
    Ok(true)
}

/// Moves an object to `damaged/` unread, where no courier claims it again
/// and an operator finds it; its events are not delivered. `claimed`: its
/// claims go too.
async fn move_aside(h: &Handoff, name: &str, why: &str, claimed: bool) -> bool {
    let (path, aside) = (h.object(name), h.bucket.path([DAMAGED, name]));
    match h.bucket.rename(&path, &aside).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {
            if claimed {
                forget_claims(h, name).await;
            }
            tracing::error!(object = %h.bucket.url_of(&path), moved_to = %h.bucket.url_of(&aside), why,
                "cannot adopt a hand-off: moved aside for an operator; its events are not delivered");
            true
        }
        Err(e) => {
            tracing::error!(object = %h.bucket.url_of(&path), why, error = %e,
                "cannot adopt a hand-off, nor move it aside: it is looked at again at the next poll");
            false
        }
    }
}

/// Writes the refused events of `name` to `damaged/<name>` (an object of
/// the same format, sealed as hand-offs are), each logged with its reason.
/// `false` when it could not be stored: the object then stays claimed.
async fn set_aside_events(
    h: &Handoff,
    name: &str,
    refused: &[Aside],
    keys: &[crate::seal::Key],
) -> bool {
    let mut b = object::Builder::default();
    for (e, c, why) in refused {
        tracing::error!(object = %name, id = %e.id.escape_debug(), destination = %e.destination.escape_debug(), reason = why.reason(), error = %why,
            "an event of a hand-off is not one ingress would accept: set aside, not delivered");
        b.push(e, c);
    }
    let aside = h.bucket.path([DAMAGED, name]);
    let bytes = object::store(keys, name, b.finish());
    match h.bucket.put(&aside, Bytes::from(bytes)).await {
        Ok(()) => {
            metrics::handoff_events("set_aside", refused.len() as u64);
            true
        }
        Err(e) => {
            tracing::warn!(object = %name, error = %e, "cannot set aside a hand-off's refused events yet; trying again at the next poll");
            false
        }
    }
}

/// Deletes every claim of `name` (its object is gone). A claim left
/// behind holds nothing: no object of that name comes again.
async fn forget_claims(h: &Handoff, name: &str) {
    let claims = match h.bucket.list(&h.claims(name)).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(object = %name, error = %e, "cannot list a hand-off's claims to remove them");
            return;
        }
    };
    for c in claims {
        if let Err(e) = h.bucket.delete(&c.location).await {
            tracing::debug!(claim = %c.location, error = %e, "cannot remove a hand-off's claim");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::record::CarriedFate;

    fn event(
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: usize,
    ) -> (NewEvent, Carried) {
        (
            NewEvent {
                id: "e1".into(),
                destination: "orders".into(),
                method: method.into(),
                path: path.into(),
                headers: headers
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                    .collect(),
                body: Bytes::from(vec![b'x'; body]),
                accepted_ms: 1,
            },
            Carried {
                attempts: 2,
                next_due_ms: 5,
                last_outcome: Some("Failed".into()),
                last_status: Some(500),
                last_attempt_ms: Some(4),
                batch: None,
                fate: None,
            },
        )
    }

    #[test]
    fn adopted_events_are_sorted_by_what_ingress_would_accept() {
        let limits = Limits {
            max_body_bytes: 10,
            keyed: false,
        };
        let mut wild = event("POST", "/x", &[], 1);
        wild.1.attempts = MAX_ATTEMPTS + 1;
        // Its row could not be read back: quarantined, never delivered.
        let mut unreasoned = event("POST", "/x", &[], 1);
        unreasoned.1.fate = Some(CarriedFate {
            reason: "Bored".into(),
            at_ms: 9,
        });
        // Dead-lettered by the courier that handed it off: adopted, to
        // have its record written.
        let mut fated = event("POST", "/x", &[], 1);
        fated.1.fate = Some(CarriedFate {
            reason: "NonRetriableStatus".into(),
            at_ms: 9,
        });
        let events = vec![
            event("POST", "/x?y=1", &[("x-a", "1")], 10),
            event("POST", "@127.0.0.2:7411/steal", &[], 1),
            event("DELETE", "/x", &[], 1),
            event("POST", "/../../admin", &[], 1),
            event("POST", "/x", &[("host", "evil.example")], 1),
            event("POST", "/x", &[], 11),
            wild,
            unreasoned,
            fated,
            event("PUT", "", &[], 0),
        ];
        let (good, refused) = sort(events, limits);
        assert_eq!(good.len(), 3);
        let reasons: Vec<&str> = refused.iter().map(|(_, _, r)| r.reason()).collect();
        assert_eq!(
            reasons,
            [
                "path",
                "method",
                "path",
                "header",
                "too_large",
                "state",
                "state"
            ]
        );
    }
}
