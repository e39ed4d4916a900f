//! The endpoints of a `url: per_event` destination (docs/endpoints.md):
//! a page of them with their state and pending events, and an operator's
//! disable and enable. State comes from the dispatcher's `Endpoints`
//! (those held in memory, and every disabled one); pending events from
//! the journal's `events_endpoint` index. An endpoint with events but no
//! state held (forgotten past `max_tracked`, or not tried since a
//! restart) is `healthy`, as it would be at its next attempt.

use super::Admin;
use super::api::{EndpointChange, EndpointItem, EndpointPage};
use super::dead_letters::{Answer, ApiError, bad, query, to_json};
use crate::clock;
use crate::deliver::endpoints::{Endpoints, View};
use crate::event::endpoint;
use crate::journal::{EndpointRows, LoadError};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{StatusCode, Uri};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;
const STATES: [&str; 4] = ["healthy", "probation", "paused", "disabled"];
/// Endpoints with rows read per query while a page is merged.
const ROWS_PAGE: usize = 500;

/// Where a merged page starts, what it keeps, and how long it is.
struct Page<'a> {
    after: &'a str,
    healthy_only: bool,
    limit: usize,
    now: u64,
}

fn read_error(e: LoadError) -> ApiError {
    ApiError::Read(e.to_string())
}

/// `scheme://host:port` of what an operator names: an origin, or any URL
/// of the endpoint.
fn origin_named(raw: &str) -> Result<String, ApiError> {
    let text = percent_encoding::percent_decode_str(raw).decode_utf8_lossy();
    endpoint::origin(&text).ok_or_else(|| {
        bad(format!(
            "`{text}` is not an endpoint's origin: give it as scheme://host:port, percent-encoded in the path"
        ))
    })
}

impl Admin {
    /// A configured `url: per_event` destination's endpoints, or why not.
    fn endpoints_of(&self, name: &str) -> Result<Arc<Endpoints>, ApiError> {
        let dest = self.configured(name)?;
        if dest.per_event.is_none() {
            return Err(bad(format!(
                "destination `{name}` has a fixed url: only a url: per_event destination has endpoints"
            )));
        }
        self.fleet
            .endpoints(name)
            .ok_or_else(|| ApiError::NotFound(format!("destination `{name}` is not running yet")))
    }

    pub(super) async fn list_endpoints(&self, name: &str, uri: &Uri) -> Answer {
        let endpoints = self.endpoints_of(name)?;
        let mut state = None;
        let mut limit = DEFAULT_LIMIT;
        let mut after = String::new();
        for (k, v) in query(uri, &["state", "limit", "after"])? {
            match k.as_str() {
                "state" if STATES.contains(&v.as_str()) => state = Some(v),
                "state" => {
                    return Err(bad(format!(
                        "state `{v}` is not one of {}",
                        STATES.join(", ")
                    )));
                }
                "limit" => {
                    limit = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| {
                            bad(format!("limit `{v}` is not a number in 1..={MAX_LIMIT}"))
                        })?;
                }
                _ => {
                    after = URL_SAFE_NO_PAD
                        .decode(&v)
                        .ok()
                        .and_then(|b| String::from_utf8(b).ok())
                        .ok_or_else(|| {
                            bad(format!(
                                "`after` is `{v}`, which is not a cursor this API gave"
                            ))
                        })?;
                }
            }
        }
        let now = clock::now_ms();
        let held: BTreeMap<Arc<str>, View> = endpoints
            .views()
            .into_iter()
            .filter(|(o, _)| **o > *after)
            .collect();
        let mut items: Vec<EndpointItem> = Vec::new();
        if let Some(only) = state.as_deref().filter(|s| *s != "healthy") {
            // Only endpoints held in memory can be in these states.
            let matching = held.into_iter().filter(|(_, v)| v.state == only);
            for (origin, view) in matching.take(limit + 1) {
                let rows = self
                    .reader
                    .endpoint_row(name, &origin)
                    .await
                    .map_err(read_error)?;
                items.push(item(&origin, Some(&view), rows.as_ref(), now, &endpoints));
            }
        } else {
            let page = Page {
                after: &after,
                healthy_only: state.is_some(),
                limit,
                now,
            };
            self.merge(name, held, page, &endpoints, &mut items).await?;
        }
        let next = (items.len() > limit).then(|| {
            items.truncate(limit);
            URL_SAFE_NO_PAD.encode(items[limit - 1].origin.as_bytes())
        });
        to_json(&EndpointPage {
            endpoints: items,
            next,
        })
    }

    /// Endpoints held in memory and endpoints with rows, in origin order,
    /// until `limit + 1`.
    async fn merge(
        &self,
        name: &str,
        held: BTreeMap<Arc<str>, View>,
        page: Page<'_>,
        endpoints: &Endpoints,
        items: &mut Vec<EndpointItem>,
    ) -> Result<(), ApiError> {
        let Page {
            after,
            healthy_only,
            limit,
            now,
        } = page;
        let wanted = |v: Option<&View>| !healthy_only || v.is_none_or(|v| v.state == "healthy");
        let mut held = held.into_iter().peekable();
        let mut cursor = after.to_string();
        // Bounded: each round reads a page further, and the rows end.
        loop {
            let rows = self
                .reader
                .endpoint_rows(name, &cursor, ROWS_PAGE)
                .await
                .map_err(read_error)?;
            let last_page = rows.len() < ROWS_PAGE;
            for r in &rows {
                while let Some((o, v)) = held.next_if(|(o, _)| **o < *r.origin) {
                    if wanted(Some(&v)) {
                        items.push(item(&o, Some(&v), None, now, endpoints));
                    }
                }
                let view = held.next_if(|(o, _)| **o == *r.origin).map(|(_, v)| v);
                if wanted(view.as_ref()) {
                    items.push(item(&r.origin, view.as_ref(), Some(r), now, endpoints));
                }
                if items.len() > limit {
                    return Ok(());
                }
            }
            if last_page {
                break;
            }
            cursor = rows.last().map(|r| r.origin.clone()).unwrap_or_default();
        }
        for (o, v) in held.filter(|(_, v)| wanted(Some(v))) {
            items.push(item(&o, Some(&v), None, now, endpoints));
            if items.len() > limit {
                break;
            }
        }
        Ok(())
    }

    pub(super) async fn set_endpoint(&self, name: &str, raw: &str, action: &str) -> Answer {
        self.endpoints_of(name)?;
        let origin = origin_named(raw)?;
        let disable = action == "disable";
        let changed = match self.fleet.set_endpoint(name, &origin, disable).await {
            None => {
                return Err(ApiError::NotFound(format!(
                    "destination `{name}` is not running"
                )));
            }
            Some(Err(e)) => {
                return Err(ApiError::Stopped(
                    StatusCode::SERVICE_UNAVAILABLE,
                    e.to_string(),
                    Box::new(json!({})),
                ));
            }
            Some(Ok(d)) => d.is_some(),
        };
        to_json(&EndpointChange {
            destination: name.to_string(),
            origin,
            state: if disable { "disabled" } else { "healthy" }.into(),
            changed,
        })
    }
}

fn item(
    origin: &str,
    view: Option<&View>,
    rows: Option<&EndpointRows>,
    now: u64,
    endpoints: &Endpoints,
) -> EndpointItem {
    let disabled = view
        .filter(|v| v.state == "disabled")
        .and_then(|_| endpoints.disabled(origin));
    EndpointItem {
        origin: origin.to_string(),
        state: view.map_or("healthy", |v| v.state).to_string(),
        pending: rows.map_or(0, |r| r.pending),
        in_flight: view.map_or(0, |v| u64::from(v.in_flight)),
        oldest_pending_age_s: rows
            .map(|r| now.saturating_sub(r.oldest_accepted_ms) as f64 / 1000.0),
        failing_since: view.and_then(|v| v.failing_since_ms).map(clock::rfc3339),
        last_outcome: view.and_then(|v| v.last_outcome.clone()),
        last_status: view.and_then(|v| v.last_status),
        disabled_by: disabled.as_ref().map(|d| d.by.clone()),
        disabled_at: disabled.map(|d| clock::rfc3339(d.since_ms)),
    }
}
