//! The answer to a passthrough request (docs/passthrough.md): the
//! endpoint's own, streamed, or courier's JSON saying why there is none.

use super::forward::{HOP_BY_HOP, connection_listed};
use super::{Body, reply};
use crate::deliver::Passed;
use crate::event::Outcome;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::Either;
use serde_json::json;

/// How many attempts the answer took.
const ATTEMPTS: HeaderName = HeaderName::from_static("courier-delivery-attempts");

/// The endpoint's answer as it came (status, headers less hop-by-hop ones,
/// body streamed), with `courier-delivery-attempts`; or, when the last
/// attempt got none, 504 for a timeout (the deadline's included) and 502
/// for the rest, naming the last outcome.
pub fn answer(destination: &str, passed: Passed) -> Response<Body> {
    match passed {
        Passed::Answer { response, attempts } => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            parts.headers.insert(ATTEMPTS, HeaderValue::from(attempts));
            Response::from_parts(parts, Either::Right(body))
        }
        Passed::NoAnswer {
            outcome,
            error,
            attempts,
            last_status,
            deadline,
        } => {
            let (status, reason) = if outcome == Outcome::TimedOut {
                (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout")
            } else {
                (StatusCode::BAD_GATEWAY, "upstream_unreachable")
            };
            let mut body = json!({
                "error": format!(
                    "no answer from {destination}'s endpoint after {attempts} attempt(s) within the passthrough deadline ({}): the last was {}: {error}",
                    humantime::format_duration(deadline),
                    outcome.as_str(),
                ),
                "reason": reason,
                "destination": destination,
                "attempts": attempts,
                "last_outcome": outcome.as_str(),
            });
            if let Some(s) = last_status {
                body["last_status"] = json!(s);
            }
            let mut resp = reply::json(status, &body);
            resp.headers_mut()
                .insert(ATTEMPTS, HeaderValue::from(attempts));
            resp
        }
        Passed::Unsendable(why) => reply::reject(
            destination,
            StatusCode::BAD_REQUEST,
            "bad_target",
            format!("the request cannot be sent to {destination}'s endpoint: {why}"),
            None,
        ),
    }
}

/// The endpoint's connection to courier is not the app's to courier.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<String> = connection_listed(headers)
        .iter()
        .map(|name| name.to_ascii_lowercase())
        .collect();
    for name in HOP_BY_HOP
        .iter()
        .copied()
        .chain(listed.iter().map(String::as_str))
    {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_headers as with;

    #[test]
    fn an_answers_hop_by_hop_headers_stay_behind_and_the_rest_travel() {
        let mut h = with(&[
            ("connection", "keep-alive, X-Hop"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("x-hop", "1"),
            ("content-type", "application/json"),
            ("content-length", "17"),
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
        ]);
        strip_hop_by_hop(&mut h);
        // Removal may reorder names; values of one name keep their order.
        let mut kept: Vec<(&str, &str)> = h
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().expect("text")))
            .collect();
        kept.sort_by_key(|(n, _)| *n);
        assert_eq!(
            kept,
            [
                ("content-length", "17"),
                ("content-type", "application/json"),
                ("set-cookie", "a=1"),
                ("set-cookie", "b=2"),
            ]
        );
    }
}
