//! What keeps a browser from driving courier (docs/http-api.md). A web page open on
//! the developer's machine can send a cross-site `POST` to `127.0.0.1`
//! (no preflight for `text/plain`), and a page whose name is re-bound to
//! 127.0.0.1 (DNS rebinding) is same-origin with it. So: a request whose
//! `Origin` is not the host it was sent to is refused, and on a loopback
//! listener the `Host` must be an IP address, `localhost` or a name in
//! `allowed_hosts`. Apps, probes and Prometheus send no `Origin`, and reach
//! a loopback listener by address or `localhost`. Pure, so the rules are
//! tested without a server.

use http::{HeaderMap, Uri};
use std::net::IpAddr;

/// Why a request was refused, for its JSON error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub reason: &'static str,
    pub message: String,
}

/// Checks the browser rules for a request that came to a listener
/// (`loopback`: it listens on a loopback address).
pub fn check(
    headers: &HeaderMap,
    uri: &Uri,
    loopback: bool,
    allowed_hosts: &[String],
) -> Result<(), Refused> {
    // HTTP/2 carries the host as `:authority`, which hyper puts in the uri.
    let host = headers
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()));
    if let Some(origin) = headers.get(http::header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let own = origin
            .split_once("://")
            .is_some_and(|(_, authority)| host.is_some_and(|h| authority.eq_ignore_ascii_case(h)));
        if !own {
            return Err(Refused {
                reason: "cross_origin",
                message: format!(
                    "a request from a web page (Origin `{origin}`) is refused: courier takes requests from apps and operators, not from browsers"
                ),
            });
        }
    }
    if let Some(host) = host
        && loopback
        && !host_allowed(host, allowed_hosts)
    {
        return Err(Refused {
            reason: "host_not_allowed",
            message: format!(
                "Host `{host}` is refused on a loopback listener: use an IP address or localhost, or add the name to allowed_hosts"
            ),
        });
    }
    Ok(())
}

/// An IP address, `localhost`, or a configured name, with any port.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => {
            return v6
                .split_once(']')
                .is_some_and(|(ip, _)| ip.parse::<IpAddr>().is_ok());
        }
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    name.parse::<IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        h
    }

    fn refused(pairs: &[(&str, &str)], loopback: bool) -> Option<&'static str> {
        let allowed = ["courier.internal".to_string()];
        check(&headers(pairs), &Uri::from_static("/x"), loopback, &allowed)
            .err()
            .map(|r| r.reason)
    }

    #[test]
    fn apps_and_probes_pass() {
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "[::1]:9090",
            "10.1.2.3:9090",
            "courier.internal:9090",
            "Courier.Internal.",
        ] {
            assert_eq!(refused(&[("host", host)], true), None, "{host}");
        }
        assert_eq!(refused(&[], true), None, "no Host (HTTP/1.0)");
        let own = [
            ("host", "127.0.0.1:9090"),
            ("origin", "http://127.0.0.1:9090"),
        ];
        assert_eq!(refused(&own, true), None);
    }

    #[test]
    fn a_foreign_origin_is_refused_on_every_listener() {
        for origin in [
            "http://evil.example",
            "null",
            "http://127.0.0.1:9091",
            "garbage",
        ] {
            let h = [("host", "127.0.0.1:9090"), ("origin", origin)];
            assert_eq!(refused(&h, true), Some("cross_origin"), "{origin}");
            assert_eq!(refused(&h, false), Some("cross_origin"), "{origin}");
        }
    }

    #[test]
    fn a_rebound_name_is_refused_on_loopback_only() {
        for host in [
            "rebind.evil.example:9090",
            "evil",
            "[not-an-ip]:1",
            "courier.internal.evil",
        ] {
            assert_eq!(
                refused(&[("host", host)], true),
                Some("host_not_allowed"),
                "{host}"
            );
            assert_eq!(refused(&[("host", host)], false), None, "{host}");
        }
        // Rebinding makes the page same-origin: the Host rule still holds.
        let h = [
            ("host", "rebind.evil.example:9090"),
            ("origin", "http://rebind.evil.example:9090"),
        ];
        assert_eq!(refused(&h, true), Some("host_not_allowed"));
    }

    #[test]
    fn the_authority_of_an_h2_request_stands_for_host() {
        let uri = Uri::from_static("http://rebind.evil.example:9090/v1/destinations");
        let got = check(&HeaderMap::new(), &uri, true, &[])
            .err()
            .map(|r| r.reason);
        assert_eq!(got, Some("host_not_allowed"));
    }
}
