//! An endpoint of a `url: per_event` destination disabled, enabled
//! again, or answering again after failures (its waiting events due at
//! once). Disabling (docs/endpoints.md, "Disabling"): the app is told first, by an
//! event to `endpoints.notify` stored durably like any event; then the
//! change is recorded in the journal's kept state, so that a restart keeps
//! it; then the endpoint's pending events are made due, so that they go to
//! the sink now rather than at their next attempt. Told before recorded:
//! a crash between the two tells the app twice, never not at all.

use super::endpoints::Endpoints;
use super::settle::Ctx;
use crate::clock;
use crate::event::NewEvent;
use crate::journal::{Change, Disabled, JournalError};
use crate::metrics;
use bytes::Bytes;
use serde_json::json;

pub const DISABLED: &str = "courier.endpoint.disabled";
pub const RECOVERED: &str = "courier.endpoint.recovered";

#[derive(Debug, thiserror::Error)]
pub enum DisablingError {
    #[error("destination `{0}` has a fixed url: only a url: per_event destination has endpoints")]
    Fixed(String),
    #[error("cannot store the {kind} notification for `{notify}`: {source}; nothing changed")]
    Notify {
        kind: &'static str,
        notify: String,
        source: JournalError,
    },
    #[error("cannot record it in the journal: {0}; nothing changed")]
    Record(std::io::Error),
}

/// A 410 or `disable_after` disabled `origin` (`Endpoints::ended`, which
/// holds it disabled already): told, recorded, counted, its events due.
/// A failure is logged: the endpoint stays disabled until courier
/// restarts, when the next failure disables it again.
pub async fn disabled(ctx: &Ctx, origin: &str, d: &Disabled) {
    let dest = &ctx.dest.name;
    tracing::warn!(destination = %dest, endpoint = %origin, by = %d.by, failing_since = d.failing_since_ms.map(clock::rfc3339), last_outcome = d.last_outcome.as_deref(), last_status = d.last_status, "endpoint disabled: its events are dead-lettered EndpointDisabled until it is enabled");
    let Ok(endpoints) = endpoints(ctx) else {
        return;
    };
    let _one = endpoints.changing.lock().await;
    // An operator may have enabled it since: then it stays enabled.
    if endpoints.disabled(origin).as_ref() != Some(d) {
        return;
    }
    if let Err(e) = record(ctx, origin, Some(d)).await {
        tracing::error!(destination = %dest, endpoint = %origin, error = %e, "cannot complete the endpoint's disabling: it holds until courier restarts");
    }
    due_now(ctx, origin, true).await;
}

/// `origin` answered well after failing: its events, put back spaced
/// while it failed (`endpoints::due_again`), are due now.
pub async fn recovered(ctx: &Ctx, origin: &str) {
    tracing::info!(destination = %ctx.dest.name, endpoint = %origin, "endpoint answered again: its waiting events are due now");
    due_now(ctx, origin, false).await;
}

/// An operator disables `origin`: `Ok(None)` when it was disabled already.
/// Told and recorded before it takes effect: a failure changes nothing.
pub async fn disable(ctx: &Ctx, origin: &str) -> Result<Option<Disabled>, DisablingError> {
    let endpoints = endpoints(ctx)?;
    let _one = endpoints.changing.lock().await;
    let Some(d) = endpoints.would_disable(origin, clock::now_ms()) else {
        return Ok(None);
    };
    record(ctx, origin, Some(&d)).await?;
    endpoints.hold_disabled(origin, d.clone());
    due_now(ctx, origin, true).await;
    tracing::info!(destination = %ctx.dest.name, endpoint = %origin, "endpoint disabled by operator");
    Ok(Some(d))
}

/// An operator enables `origin` again, afresh: what its disabling was;
/// `Ok(None)` when it was not disabled.
pub async fn enable(ctx: &Ctx, origin: &str) -> Result<Option<Disabled>, DisablingError> {
    let endpoints = endpoints(ctx)?;
    let _one = endpoints.changing.lock().await;
    let Some(d) = endpoints.disabled(origin) else {
        return Ok(None);
    };
    record(ctx, origin, None).await?;
    endpoints.enable(origin);
    tracing::info!(destination = %ctx.dest.name, endpoint = %origin, was_by = %d.by, "endpoint enabled by operator");
    Ok(Some(d))
}

fn endpoints(ctx: &Ctx) -> Result<&Endpoints, DisablingError> {
    ctx.endpoints
        .as_deref()
        .ok_or_else(|| DisablingError::Fixed(ctx.dest.name.clone()))
}

/// Tells the app (`endpoints.notify`), then records the change in the
/// journal's kept state: `Some` disables, `None` enables.
async fn record(ctx: &Ctx, origin: &str, d: Option<&Disabled>) -> Result<(), DisablingError> {
    let dest = &ctx.dest.name;
    let kind = if d.is_some() { DISABLED } else { RECOVERED };
    if let Some(notify) = ctx.dest.per_event.as_ref().and_then(|p| p.notify.as_ref()) {
        let event = notification(dest, notify, origin, kind, d);
        ctx.journal
            .append(vec![event])
            .await
            .map_err(|source| DisablingError::Notify {
                kind,
                notify: notify.clone(),
                source,
            })?;
    }
    ctx.journal
        .set_disabled(dest, origin, d.cloned())
        .await
        .map_err(DisablingError::Record)?;
    if d.is_some() {
        metrics::endpoint_disabled(dest, 1);
    }
    Ok(())
}

/// Makes `origin`'s waiting rows due now and wakes the dispatcher to read
/// them: a disabled endpoint's go to the sink, a recovered one's to it.
/// Not needed for them to go (they do at the times they were put back
/// to), so a failure is logged only.
async fn due_now(ctx: &Ctx, origin: &str, disabled: bool) {
    let dest = &ctx.dest.name;
    let due = Change::EndpointDue {
        destination: dest.clone(),
        origin: origin.to_string(),
        at_ms: clock::now_ms(),
    };
    match ctx.journal.settle(&[due]).await {
        Ok(()) => ctx.journal.wake(dest),
        Err(e) => {
            let what = if disabled { "dead-lettered" } else { "sent" };
            tracing::warn!(destination = %dest, endpoint = %origin, error = %e, "cannot make the endpoint's waiting events due now: they are {what} at the times they were put back to", what = what);
        }
    }
}

/// A CloudEvents 1.0 event in the structured mode, for `notify`.
fn notification(
    destination: &str,
    notify: &str,
    origin: &str,
    kind: &'static str,
    d: Option<&Disabled>,
) -> NewEvent {
    let now = clock::now_ms();
    let id = uuid::Uuid::now_v7().to_string();
    let data = match d {
        Some(d) => json!({
            "destination": destination,
            "endpoint": origin,
            "by": d.by,
            "disabled_at": clock::rfc3339(d.since_ms),
            "failing_since": d.failing_since_ms.map(clock::rfc3339),
            "last_outcome": d.last_outcome,
            "last_status": d.last_status,
        }),
        None => json!({
            "destination": destination,
            "endpoint": origin,
            "enabled_at": clock::rfc3339(now),
        }),
    };
    let body = json!({
        "specversion": "1.0",
        "type": kind,
        "source": format!("/courier/destinations/{destination}"),
        "subject": origin,
        "id": id,
        "time": clock::rfc3339(now),
        "datacontenttype": "application/json",
        "data": data,
    });
    NewEvent {
        id,
        destination: notify.to_string(),
        method: "POST".into(),
        path: String::new(),
        headers: vec![(
            "content-type".into(),
            b"application/cloudevents+json".to_vec(),
        )],
        body: Bytes::from(body.to_string()),
        accepted_ms: now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_is_a_structured_cloudevent_for_the_notify_destination() {
        let d = Disabled {
            by: "gone".into(),
            since_ms: 1_700_000_000_000,
            failing_since_ms: Some(1_699_000_000_000),
            last_outcome: Some("Gone".into()),
            last_status: Some(410),
        };
        let e = notification(
            "customers",
            "ops",
            "https://a.example:443",
            DISABLED,
            Some(&d),
        );
        assert_eq!(e.destination, "ops");
        let v: serde_json::Value = serde_json::from_slice(&e.body).expect("json");
        assert_eq!(v["type"], DISABLED);
        assert_eq!(v["id"], e.id.as_str());
        assert_eq!(v["data"]["endpoint"], "https://a.example:443");
        assert_eq!(v["data"]["last_status"], 410);
        assert_eq!(
            v["data"]["failing_since"],
            clock::rfc3339(1_699_000_000_000)
        );
        let recovered = notification("customers", "ops", "https://a.example:443", RECOVERED, None);
        let v: serde_json::Value = serde_json::from_slice(&recovered.body).expect("json");
        assert_eq!(v["type"], RECOVERED);
        assert_ne!(recovered.id, e.id);
    }
}
