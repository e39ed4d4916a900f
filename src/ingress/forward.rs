//! Which of the app's headers travel with the event, and which id it gets.

use super::keys;
use crate::journal::Header;
use http::HeaderMap;

/// Hop-by-hop headers (RFC 9110 §7.6.1): they describe one connection, not
/// the message, so they never cross courier, in either direction.
pub const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Besides the hop-by-hop ones, what the request itself frames. `courier-*`
/// and `webhook-*` (Standard Webhooks) are courier's own and dropped too.
const FRAMING: [&str; 3] = ["expect", "host", "content-length"];

/// The names a `Connection` header lists: hop-by-hop for this message too.
pub fn connection_listed(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .collect()
}

/// Credentials for courier's ingress, not for the endpoint (SPEC §3): Event
/// Grid's topic key and signature, never forwarded or stored.
const INGRESS_CREDENTIALS: [&str; 2] = [keys::KEY_HEADER, keys::TOKEN_HEADER];

/// The headers forwarded to the endpoint, in the order received.
/// `Authorization` is kept back when `keyed` (ingress keys are set, so it
/// may carry one); otherwise it may be meant for the endpoint and travels.
pub fn forwarded(headers: &HeaderMap, keyed: bool) -> Vec<Header> {
    let listed = connection_listed(headers);
    headers
        .iter()
        .filter(|(name, _)| {
            let n = name.as_str();
            let credential =
                INGRESS_CREDENTIALS.contains(&n) || (keyed && *name == http::header::AUTHORIZATION);
            !credential
                && !HOP_BY_HOP.contains(&n)
                && !FRAMING.contains(&n)
                && !n.starts_with("webhook-")
                && !n.starts_with("courier-")
                && !listed.iter().any(|l| l == n)
        })
        .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
        .collect()
}

/// Longest event id accepted from the app.
pub const MAX_ID: usize = 256;

/// `custom` schema: the app's `Idempotency-Key`, else `webhook-id`, else a
/// new UUIDv7. `Err` carries the header whose value is unusable.
pub fn event_id(headers: &HeaderMap) -> Result<String, &'static str> {
    // Names made once: a `&str` key is parsed again at every lookup.
    static NAMES: [http::HeaderName; 2] = [
        http::HeaderName::from_static("idempotency-key"),
        http::HeaderName::from_static("webhook-id"),
    ];
    for name in NAMES.iter() {
        if let Some(v) = headers.get(name) {
            let name = name.as_str();
            let id = v.to_str().map_err(|_| name)?.trim();
            if id.is_empty() || id.len() > MAX_ID {
                return Err(name);
            }
            return Ok(id.to_string());
        }
    }
    Ok(crate::ids::new())
}

/// True when the `/rest` of a request has a `.` or `..` segment, also
/// percent-encoded (`%2e`, or behind an encoded `%2f` or a `\\`, which some
/// servers read as `/`): an endpoint that normalises paths would read
/// `/hooks/../../admin` as `/admin`, outside the destination's base path,
/// so such a request is refused rather than forwarded (SPEC §3).
pub fn has_dot_segment(rest: &str) -> bool {
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(rest).collect();
    decoded
        .split(|b| *b == b'/' || *b == b'\\')
        .any(|segment| segment == b"." || segment == b"..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_are_found_also_when_percent_encoded() {
        for bad in [
            "/..",
            "/../../admin",
            "/a/./b",
            "/a/%2e%2E/b",
            "/%2e",
            "/.%2e/x",
            "/a/..",
            "/a%2f..",
            "/a\\..\\b",
            "/a%5C..%5Cb",
        ] {
            assert!(has_dot_segment(bad), "{bad}");
        }
        for ok in [
            "",
            "/",
            "/a/b",
            "/a..b",
            "/.well-known/x",
            "/...",
            "/a%2f...",
            "/a/.b.",
        ] {
            assert!(!has_dot_segment(ok), "{ok}");
        }
    }

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        h
    }

    #[test]
    fn hop_by_hop_host_length_and_courier_headers_are_not_forwarded() {
        let h = map(&[
            ("host", "x"),
            ("content-length", "3"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("courier-delivery-attempt", "9"),
            ("webhook-id", "w"),
            ("webhook-foo", "f"),
            ("content-type", "application/json"),
            ("x-trace", "a"),
            ("x-trace", "b"),
        ]);
        let names: Vec<(String, Vec<u8>)> = forwarded(&h, false);
        assert_eq!(
            names,
            vec![
                ("content-type".into(), b"application/json".to_vec()),
                ("x-trace".into(), b"a".to_vec()),
                ("x-trace".into(), b"b".to_vec())
            ]
        );
    }

    #[test]
    fn ingress_credentials_stay_and_authorization_only_with_keys() {
        let h = map(&[
            ("aeg-sas-key", "topic-key"),
            ("aeg-sas-token", "r=a&e=b&s=c"),
            ("authorization", "Bearer for-someone"),
            ("x-keep", "1"),
        ]);
        let names =
            |keyed| -> Vec<String> { forwarded(&h, keyed).into_iter().map(|(n, _)| n).collect() };
        assert_eq!(names(false), ["authorization", "x-keep"]);
        assert_eq!(names(true), ["x-keep"]);
    }

    #[test]
    fn id_comes_from_idempotency_key_then_webhook_id_then_uuid7() {
        assert_eq!(
            event_id(&map(&[("idempotency-key", "k1"), ("webhook-id", "w1")])),
            Ok("k1".into())
        );
        assert_eq!(event_id(&map(&[("webhook-id", "w1")])), Ok("w1".into()));
        let generated = event_id(&HeaderMap::new()).expect("uuid");
        assert_eq!(
            uuid::Uuid::parse_str(&generated).map(|u| u.get_version_num()),
            Ok(7)
        );
        assert_eq!(
            event_id(&map(&[("idempotency-key", " ")])),
            Err("idempotency-key")
        );
        assert_eq!(
            event_id(&map(&[("webhook-id", &"x".repeat(300))])),
            Err("webhook-id")
        );
    }
}
