//! What a stored event may hold, whoever wrote it. Ingress applies these
//! rules to a request before it stores it; adoption applies them again to
//! every event of a hand-off object, and replay to every dead-letter record,
//! because a bucket or a file on a volume is outside the process: whoever
//! can write there must not be able to send a method, a path, a header or a
//! body that ingress would have refused (docs/object-storage.md).

use super::endpoint;
use http::uri::PathAndQuery;

/// The methods an app may publish with.
pub const METHODS: [&str; 3] = ["POST", "PUT", "PATCH"];

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

/// Besides the hop-by-hop ones, what the request itself frames.
const FRAMING: [&str; 3] = ["expect", "host", "content-length"];

/// Credentials for courier's ingress, not for the endpoint
/// (docs/publishing.md): Event Grid's topic key and signature.
pub const INGRESS_CREDENTIALS: [&str; 2] = [KEY_HEADER, TOKEN_HEADER];
/// Event Grid's topic key, as its publishers send it.
pub const KEY_HEADER: &str = "aeg-sas-key";
/// Event Grid's SAS token.
pub const TOKEN_HEADER: &str = "aeg-sas-token";

/// Most headers an event carries: hyper's own limit on a request's.
pub const MAX_HEADERS: usize = 100;
/// Longest stored `/rest?query`: hyper reads a request line of at most this.
pub const MAX_PATH: usize = 64 * 1024;
/// Longest event id.
pub const MAX_ID: usize = 256;

/// A destination or topic name: one url path segment, without escapes,
/// and not a dot segment: the name is also a folder of the dead-letter
/// directory, and `..` there would be its parent.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "-_.~".contains(ch))
}

/// Why an event read from outside is not delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("method `{0}` is not one an app may publish with (POST, PUT, PATCH)")]
    Method(String),
    #[error("the path does not start with `/`: it could change the endpoint's host")]
    NotAPath,
    #[error("the path has a `.` or `..` segment")]
    DotSegment,
    #[error("the path is not a valid url path and query")]
    BadPath,
    #[error("header `{0}` never travels with an event")]
    Header(String),
    #[error("header `{0}` appears more than once, where ingress stores it once")]
    Repeated(String),
    #[error("a header name or value is not valid HTTP")]
    BadHeader,
    #[error("more than {MAX_HEADERS} headers")]
    TooManyHeaders,
    #[error("the body ({0} bytes) is larger than ingress.max_body_bytes ({1})")]
    TooLarge(usize, u64),
    #[error("the id is empty or longer than {MAX_ID} bytes")]
    Id,
    #[error("`{0}` is not a destination name")]
    Destination(String),
    #[error("its delivery state is not one a courier writes")]
    State,
    #[error("its endpoint: {0}")]
    Endpoint(super::endpoint::Refused),
}

impl Refused {
    /// A short name for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::Method(_) => "method",
            Refused::NotAPath | Refused::DotSegment | Refused::BadPath => "path",
            Refused::Header(_)
            | Refused::Repeated(_)
            | Refused::BadHeader
            | Refused::TooManyHeaders => "header",
            Refused::TooLarge(..) => "too_large",
            Refused::Id => "id",
            Refused::Destination(_) => "destination",
            Refused::State => "state",
            Refused::Endpoint(_) => "endpoint",
        }
    }
}

pub fn method_allowed(method: &str) -> bool {
    METHODS.contains(&method)
}

/// True when the `/rest` of a request has a `.` or `..` segment, also
/// percent-encoded (`%2e`, or behind an encoded `%2f` or a `\\`, which some
/// servers read as `/`): an endpoint that normalises paths would read
/// `/hooks/../../admin` as `/admin`, outside the destination's base path,
/// so such a request is refused rather than forwarded (docs/publishing.md).
pub fn has_dot_segment(rest: &str) -> bool {
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(rest).collect();
    decoded
        .split(|b| *b == b'/' || *b == b'\\')
        .any(|segment| segment == b"." || segment == b"..")
}

/// Whether a header of the app's travels with its event. `listed`: the
/// names its `Connection` header lists, in any case; `keyed`: ingress
/// keys are set, so `Authorization` carried one of them. `courier-*` and
/// `webhook-*` (Standard Webhooks) are courier's own.
pub fn header_travels(name: &str, listed: &[&str], keyed: bool) -> bool {
    let credential = INGRESS_CREDENTIALS.contains(&name) || (keyed && name == "authorization");
    !credential
        && !HOP_BY_HOP.contains(&name)
        && !FRAMING.contains(&name)
        && !name.starts_with("webhook-")
        && !name.starts_with("courier-")
        && !listed.iter().any(|l| l.eq_ignore_ascii_case(name))
}

/// `/rest?query` as stored: empty or a path from the root, without dot
/// segments, that parses as a url's path and query. A path that does not
/// start with `/` would be read as part of the authority by anything that
/// joins it to the destination's url as text.
pub fn check_path(path: &str) -> Result<(), Refused> {
    if path.len() > MAX_PATH {
        return Err(Refused::BadPath);
    }
    let (rest, _) = path.split_once('?').unwrap_or((path, ""));
    if !(rest.is_empty() || rest.starts_with('/')) {
        return Err(Refused::NotAPath);
    }
    if has_dot_segment(rest) {
        return Err(Refused::DotSegment);
    }
    if path.contains('#') || (!path.is_empty() && PathAndQuery::try_from(path).is_err()) {
        return Err(Refused::BadPath);
    }
    Ok(())
}

/// What the checks of a stored event depend on: the reading courier's own
/// ingress settings.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_body_bytes: u64,
    /// `ingress.keys_from_env` is set.
    pub keyed: bool,
}

/// Checks an event read from outside the process against what ingress
/// admits; the endpoint's own headers (`url: per_event`) are checked as
/// ingress checked them. `destination` must be a name a config could hold (an unknown one
/// is kept as orphaned by the journal, as after a reload removed it).
pub fn check(
    id: &str,
    destination: &str,
    method: &str,
    path: &str,
    headers: &[(String, Vec<u8>)],
    body_len: usize,
    limits: Limits,
) -> Result<(), Refused> {
    if id.is_empty() || id.len() > MAX_ID {
        return Err(Refused::Id);
    }
    if !valid_name(destination) {
        return Err(Refused::Destination(destination.chars().take(64).collect()));
    }
    if !method_allowed(method) {
        return Err(Refused::Method(method.chars().take(16).collect()));
    }
    check_path(path)?;
    if headers.len() > MAX_HEADERS {
        return Err(Refused::TooManyHeaders);
    }
    for (i, (name, value)) in headers.iter().enumerate() {
        let parsed = http::HeaderName::from_bytes(name.as_bytes());
        // Stored names are lower case, as hyper gives them.
        if parsed.as_ref().map(|n| n.as_str()).ok() != Some(name.as_str())
            || http::HeaderValue::from_bytes(value).is_err()
        {
            return Err(Refused::BadHeader);
        }
        if endpoint::is_own(name) {
            // Set by ingress for `url: per_event`, once each: a second
            // would leave which one is the endpoint to each reader.
            if headers[..i].iter().any(|(n, _)| n == name) {
                return Err(Refused::Repeated(name.clone()));
            }
            // Checked again as a URL (its address is judged when courier
            // connects) or secrets.
            let checked = if name == endpoint::URL_HEADER {
                endpoint::check(value, &["http".into(), "https".into()]).map(drop)
            } else {
                endpoint::check_secrets(value).map(drop)
            };
            checked.map_err(Refused::Endpoint)?;
            continue;
        }
        if !header_travels(name, &[], limits.keyed) {
            return Err(Refused::Header(name.clone()));
        }
    }
    if body_len as u64 > limits.max_body_bytes {
        return Err(Refused::TooLarge(body_len, limits.max_body_bytes));
    }
    Ok(())
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

    #[test]
    fn a_path_cannot_reach_the_authority_or_climb_out() {
        for ok in ["", "/", "/a/b", "/a?x=1&y=%20", "?code=1", "/@x/y"] {
            assert_eq!(check_path(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("@127.0.0.2:7411/steal", Refused::NotAPath),
            (":99/x", Refused::NotAPath),
            ("x/y", Refused::NotAPath),
            ("/../../admin", Refused::DotSegment),
            ("/a/%2e%2e?x", Refused::DotSegment),
            ("/a b", Refused::BadPath),
            ("/a#frag", Refused::BadPath),
            ("/a\n", Refused::BadPath),
        ] {
            assert_eq!(check_path(bad), Err(why), "{bad:?}");
        }
        assert_eq!(
            check_path(&format!("/{}", "a".repeat(MAX_PATH))),
            Err(Refused::BadPath)
        );
    }

    fn event(
        method: &str,
        path: &str,
        headers: &[(&str, &[u8])],
        body: usize,
    ) -> Result<(), Refused> {
        let headers: Vec<(String, Vec<u8>)> = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_vec()))
            .collect();
        let limits = Limits {
            max_body_bytes: 100,
            keyed: false,
        };
        check("e1", "orders", method, path, &headers, body, limits)
    }

    #[test]
    fn an_event_from_outside_passes_what_ingress_admits_and_nothing_else() {
        let fine: &[(&str, &[u8])] = &[("content-type", b"application/json"), ("x-a", b"1")];
        assert_eq!(event("POST", "/x?y=1", fine, 100), Ok(()));
        assert_eq!(
            event("PATCH", "", &[("authorization", b"Bearer t")], 0),
            Ok(())
        );
        assert_eq!(
            event("DELETE", "/x", fine, 1),
            Err(Refused::Method("DELETE".into()))
        );
        assert_eq!(
            event("GET", "", fine, 1).map_err(|e| e.reason()),
            Err("method")
        );
        assert_eq!(
            event("POST", "/x", fine, 101),
            Err(Refused::TooLarge(101, 100))
        );
        for name in [
            "host",
            "content-length",
            "transfer-encoding",
            "connection",
            "aeg-sas-key",
            "courier-delivery-attempt",
            "webhook-signature",
        ] {
            assert_eq!(
                event("POST", "/x", &[(name, b"v")], 1),
                Err(Refused::Header(name.into())),
                "{name}"
            );
        }
        // The endpoint's own headers pass only as ingress would store them.
        let secret = crate::event::signature::encode(b"k");
        let own: &[(&str, &[u8])] = &[
            ("courier-endpoint", b"https://hooks.acme.example/x"),
            ("courier-endpoint-secret", secret.as_bytes()),
        ];
        assert_eq!(event("POST", "", own, 1), Ok(()));
        for name in ["courier-endpoint", "courier-endpoint-secret"] {
            let (_, value) = own.iter().find(|(n, _)| *n == name).expect("own");
            let twice = [own, &[(name, *value)]].concat();
            assert_eq!(
                event("POST", "", &twice, 1),
                Err(Refused::Repeated(name.into())),
                "{name}"
            );
        }
        for (name, bad) in [
            ("courier-endpoint", &b"ftp://h.example/x"[..]),
            ("courier-endpoint", b"https://u:p@h.example/"),
            ("courier-endpoint", b"/relative"),
            ("courier-endpoint-secret", b"whsec_!!"),
        ] {
            assert_eq!(
                event("POST", "", &[(name, bad)], 1).map_err(|e| e.reason()),
                Err("endpoint"),
                "{name}: {bad:?}"
            );
        }
        assert_eq!(
            event("POST", "/x", &[("X-Upper", b"v")], 1),
            Err(Refused::BadHeader)
        );
        assert_eq!(
            event("POST", "/x", &[("x-a", b"a\r\nb")], 1),
            Err(Refused::BadHeader)
        );
        let many: Vec<(String, Vec<u8>)> = (0..=MAX_HEADERS)
            .map(|i| (format!("x-{i}"), b"v".to_vec()))
            .collect();
        let limits = Limits {
            max_body_bytes: 1,
            keyed: true,
        };
        assert_eq!(
            check("e", "orders", "POST", "", &many, 0, limits),
            Err(Refused::TooManyHeaders)
        );
        let auth = [("authorization".to_string(), b"Bearer k".to_vec())];
        assert_eq!(
            check("e", "orders", "POST", "", &auth, 0, limits),
            Err(Refused::Header("authorization".into())),
            "with ingress keys set, Authorization carried one"
        );
        assert_eq!(
            check("", "orders", "POST", "", &[], 0, limits),
            Err(Refused::Id)
        );
        assert_eq!(
            check("e", "../x", "POST", "", &[], 0, limits),
            Err(Refused::Destination("../x".into()))
        );
    }
}
