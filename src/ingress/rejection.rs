//! The one place a refused request is accounted for (docs/http-api.md, docs/logs.md): the
//! `courier_ingress_rejected_total{reason}` counter and one `info` line,
//! `rejected`, with `status`, `reason` (as in the JSON answer and the
//! metric), `destination` (the name from the path, even an unknown one)
//! and `remote` (the peer's ip:port). `reply` tags every refusal it builds
//! with a `Rejection`, and `Ingress::handle` hands every answer here, so no
//! path that refuses can forget either. Never a header or the body.

use super::Body;
use crate::metrics;
use crate::server::RemoteAddr;
use http::Response;

/// The longest name from the path that a line repeats: the path is the
/// sender's to choose.
const NAME_LIMIT: usize = 128;

/// Carried in the extensions of a refusal.
#[derive(Clone)]
pub(super) struct Rejection {
    reason: &'static str,
    destination: String,
    /// A configured name, and so a metric label; refusals of unknown names
    /// are counted under `""`, so that paths cannot create series.
    configured: bool,
}

impl Rejection {
    pub(super) fn new(destination: &str, reason: &'static str) -> Self {
        Rejection {
            reason,
            destination: destination.to_string(),
            configured: true,
        }
    }

    pub(super) fn unknown(name: &str, reason: &'static str) -> Self {
        let cut = (0..=NAME_LIMIT.min(name.len()))
            .rev()
            .find(|&i| name.is_char_boundary(i))
            .unwrap_or(0);
        Rejection {
            reason,
            destination: name[..cut].to_string(),
            configured: false,
        }
    }
}

/// Counts and logs `resp` if it is a refusal; `remote` is the peer.
pub(super) fn record(resp: &Response<Body>, remote: Option<RemoteAddr>) {
    let Some(r) = resp.extensions().get::<Rejection>() else {
        return;
    };
    let label = if r.configured { &r.destination } else { "" };
    metrics::rejected(label, r.reason);
    tracing::info!(
        status = resp.status().as_u16(),
        reason = %r.reason,
        destination = %r.destination,
        remote = remote.map(|a| tracing::field::display(a.0)),
        "rejected"
    );
}

#[cfg(test)]
mod tests {
    use super::Rejection;

    #[test]
    fn unknown_names_are_cut_on_a_character_boundary() {
        let long = "é".repeat(100);
        let r = Rejection::unknown(&long, "unknown_destination");
        assert_eq!(r.destination, "é".repeat(64));
        assert!(!r.configured);
        assert_eq!(Rejection::unknown("orderz", "x").destination, "orderz");
    }
}
