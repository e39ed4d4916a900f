//! Adoption: at start and every `handoff.poll`, each hand-off object in the
//! store is claimed (a conditional create of its next claim generation:
//! one courier wins), read, appended to this journal with its events'
//! delivery state (durable), then deleted with its claims. Steps that fail
//! are tried again at the next look; the claim stays meanwhile, and
//! another courier takes the object over once it is `claim_timeout` old.

use super::Handoff;
use super::object;
use crate::bucket::Created;
use crate::journal::Journal;
use crate::metrics;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Events appended to the journal per commit.
const ADOPT_EVENTS: usize = 1000;

/// Looks for hand-offs until `stop`: at once, then every `poll`.
pub async fn adopt_loop(h: Arc<Handoff>, journal: Journal, stop: CancellationToken) {
    let me = claimer();
    tracing::info!(url = %h.bucket.label(), poll_s = h.settings.poll.as_secs_f64(), claimer = %me, "looking for hand-offs to adopt");
    // Ends when `stop` is cancelled.
    loop {
        look(&h, &journal, &me, &stop).await;
        tokio::select! {
            _ = tokio::time::sleep(h.settings.poll) => {}
            _ = stop.cancelled() => return,
        }
    }
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

/// One look: every object waiting, oldest first.
async fn look(h: &Handoff, journal: &Journal, me: &str, stop: &CancellationToken) {
    let objects = match h.bucket.list(&h.pending()).await {
        Ok(objects) => objects,
        Err(e) => {
            tracing::warn!(url = %h.bucket.label(), error = %e, "cannot look for hand-offs; trying again at the next poll");
            return;
        }
    };
    let now_ms = crate::clock::now_ms() as i64;
    let oldest = objects
        .iter()
        .map(|m| now_ms.saturating_sub(m.last_modified.timestamp_millis()))
        .max()
        .unwrap_or(0);
    metrics::handoff_waiting(objects.len(), Duration::from_millis(oldest.max(0) as u64));
    for meta in objects {
        if stop.is_cancelled() {
            return;
        }
        let Some(name) = meta.location.filename().map(str::to_string) else {
            continue;
        };
        // Only ours: `pending/<name>`, no deeper.
        if meta.location.parts().count() != h.pending().parts().count() + 1
            || !name.ends_with(".cho")
        {
            continue;
        }
        match claim(h, &name, me).await {
            Ok(Some(generation)) => adopt(h, journal, &name, generation, stop).await,
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(object = %name, error = %e, "cannot claim a hand-off; trying again at the next poll");
            }
        }
    }
}

/// Claims `name`: the generation won, or `None` when another courier holds
/// it (a live claim) or won the race.
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
            tracing::warn!(object = %name, age_s = age.as_secs(), claim_timeout_s = h.settings.claim_timeout.as_secs(),
                "a hand-off's claim is older than claim_timeout: its claimer died while adopting; taking it over (events it adopted before it died are delivered twice)");
            generation + 1
        }
    };
    let body = Bytes::from(format!(
        "{me}\n{}\n",
        crate::clock::rfc3339(crate::clock::now_ms())
    ));
    Ok(
        match h.bucket.create(&h.claim(name, generation), body).await? {
            Created::Won => Some(generation),
            Created::Exists => None,
        },
    )
}

/// Reads the claimed object, appends its events, then deletes it and its
/// claims. Any failure leaves the claim: the object is taken over once it
/// is `claim_timeout` old, and nothing is lost.
async fn adopt(
    h: &Handoff,
    journal: &Journal,
    name: &str,
    generation: u32,
    stop: &CancellationToken,
) {
    let started = Instant::now();
    let path = h.object(name);
    let got = match h.bucket.get(&path).await {
        Ok(Some(got)) => got,
        Ok(None) => {
            // Adopted and deleted by a courier whose claim had timed out.
            forget_claims(h, name).await;
            return;
        }
        Err(e) => {
            tracing::warn!(object = %name, error = %e, "cannot read a claimed hand-off; it is taken over after claim_timeout");
            return;
        }
    };
    let size = got.len();
    let events = match object::decode(&got) {
        // The object's bytes go once decoded: the events are copies.
        Ok(events) => {
            drop(got);
            events
        }
        Err(e) => {
            set_aside(h, name, &path, got, &e.to_string()).await;
            return;
        }
    };
    let count = events.len();
    let mut adopted = 0;
    let mut events = events;
    // Bounded: each round moves at least one event on.
    while !events.is_empty() {
        let rest = events.split_off(events.len().min(ADOPT_EVENTS));
        let chunk = std::mem::replace(&mut events, rest);
        if stop.is_cancelled() && adopted == 0 {
            // Nothing taken yet: the claim goes, so another courier need
            // not wait claim_timeout for it.
            let _ = h.bucket.delete(&h.claim(name, generation)).await;
            return;
        }
        if stop.is_cancelled() {
            tracing::warn!(object = %name, adopted, events = count, "shutting down in the middle of an adoption: the object stays claimed, and is taken over after claim_timeout (the events adopted so far are handed off with this courier's, and may be delivered twice)");
            return;
        }
        let n = chunk.len();
        if let Err(e) = journal.adopt(chunk).await {
            tracing::warn!(object = %name, adopted, events = count, error = %e,
                "the journal cannot take a hand-off's events now; the object stays claimed, and is taken over after claim_timeout");
            return;
        }
        adopted += n;
        metrics::handoff_events("adopted", n as u64);
    }
    // Durable in this journal's log. Indexed too before the next object:
    // appends of whole objects outrun the indexer, which would then read
    // tens of MiB of the log at once (a 100,000-event adoption peaked at
    // 87 MiB without this wait, bench step t).
    if let Err(e) = journal.index_all().await {
        tracing::debug!(object = %name, error = %e, "cannot index an adopted hand-off yet; its events are in the log");
    }
    if let Err(e) = h.bucket.delete(&path).await {
        tracing::warn!(object = %name, error = %e, "adopted a hand-off but cannot delete it: it is taken over after claim_timeout, and its events are delivered twice");
        return;
    }
    forget_claims(h, name).await;
    tracing::info!(object = %h.bucket.url_of(&path), events = count, bytes = size, generation,
        took_ms = started.elapsed().as_millis() as u64, "adopted a hand-off");
}

/// Moves a damaged object to `damaged/`, where no courier claims it again
/// and an operator finds it; its events are not delivered.
async fn set_aside(
    h: &Handoff,
    name: &str,
    path: &object_store::path::Path,
    bytes: Bytes,
    error: &str,
) {
    let aside = h.bucket.path([super::DAMAGED, name]);
    let moved = h.bucket.put(&aside, bytes).await.is_ok() && h.bucket.delete(path).await.is_ok();
    if moved {
        forget_claims(h, name).await;
        tracing::error!(object = %h.bucket.url_of(path), moved_to = %h.bucket.url_of(&aside), error,
            "cannot adopt a damaged hand-off: moved aside for an operator; its events are not delivered");
    } else {
        tracing::error!(object = %h.bucket.url_of(path), error,
            "cannot adopt a damaged hand-off, nor move it aside: it stays, claimed, and is looked at again after claim_timeout");
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
