//! The endpoint an event names itself (`url: per_event`, docs/endpoints.md):
//! the URL checked at ingress, and how it is kept with the event.
//!
//! The URL and the endpoint's secrets are kept as two stored headers under
//! courier's own names (`courier-*` never travels from the app, so only
//! ingress sets them): the journal, hand-off objects and dead-letter
//! records then carry them with no change to their formats, and a
//! replayed dead letter goes back to its endpoint. The request builder
//! takes the URL as the attempt's target and sends neither header; the
//! secret header is left out of every record a person reads.

use super::NewEvent;
use super::signature::{Secret, SecretError};
use http::Uri;
use smallvec::SmallVec;
use std::fmt::Write;
use std::net::IpAddr;
use std::sync::Arc;

/// The stored header that holds the endpoint's URL.
pub const URL_HEADER: &str = "courier-endpoint";
/// The stored header that holds the endpoint's secrets, space-separated.
pub const SECRET_HEADER: &str = "courier-endpoint-secret";
/// The longest URL accepted: browsers and proxies stop near 8 KiB.
pub const MAX_URL: usize = 8 * 1024;
/// The most secrets one event may carry: a rotation needs two.
pub const MAX_SECRETS: usize = 4;

/// Why a named endpoint is refused; each names the rule it broke, and the
/// message says what to send instead.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    #[error("no endpoint: this destination delivers to the URL named in header {0}")]
    Missing(String),
    #[error("the endpoint URL is longer than {MAX_URL} bytes")]
    TooLong,
    #[error("the endpoint URL is not an absolute URL: expected https://host[:port]/path")]
    NotAbsolute,
    #[error("the endpoint URL's scheme `{0}` is not allowed here: allowed {1}")]
    Scheme(String, String),
    #[error("the endpoint URL carries credentials (user:password@): put them in a header")]
    Userinfo,
    #[error(
        "the endpoint URL names {0}, a private or reserved address that the address guard refuses"
    )]
    Address(IpAddr),
    #[error("the endpoint secret {0}")]
    Secret(SecretError),
    #[error("more than {MAX_SECRETS} endpoint secrets")]
    TooManySecrets,
}

impl Refused {
    /// The `reason` of the 400 answer.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::Missing(_) => "endpoint_missing",
            Refused::TooLong | Refused::NotAbsolute => "endpoint_invalid",
            Refused::Scheme(..) => "endpoint_scheme",
            Refused::Userinfo => "endpoint_userinfo",
            Refused::Address(_) => "endpoint_address",
            Refused::Secret(_) | Refused::TooManySecrets => "endpoint_secret",
        }
    }
}

/// A named endpoint, checked: its URL as it is stored and sent, and the
/// address it names when its host is one, for the address guard to judge
/// (a name is judged after DNS, at connect time).
#[derive(Debug, PartialEq, Eq)]
pub struct Named {
    pub url: String,
    pub ip: Option<IpAddr>,
}

/// Checks a named endpoint's URL; `schemes` are those allowed.
pub fn check(value: &[u8], schemes: &[String]) -> Result<Named, Refused> {
    if value.len() > MAX_URL {
        return Err(Refused::TooLong);
    }
    let text = std::str::from_utf8(value).map_err(|_| Refused::NotAbsolute)?;
    let uri: Uri = text.trim().parse().map_err(|_| Refused::NotAbsolute)?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(Refused::NotAbsolute);
    };
    if !schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme)) {
        return Err(Refused::Scheme(scheme.to_string(), schemes.join(", ")));
    }
    if authority.as_str().contains('@') {
        return Err(Refused::Userinfo);
    }
    let host = authority.host();
    // A zone id (`%`) names an interface, not an address on the internet.
    if host.is_empty() || host.contains('%') {
        return Err(Refused::NotAbsolute);
    }
    let ip = match host.trim_start_matches('[').trim_end_matches(']').parse() {
        Ok(ip) => Some(ip),
        // A last label in digits is no DNS name: the system's resolver
        // reads such hosts as inet_aton does (`2130706433`, `0x7f.1`,
        // `127.1` are 127.0.0.1), and so does the check.
        Err(_) if numeric_last_label(host) => {
            Some(IpAddr::V4(inet_aton(host).ok_or(Refused::NotAbsolute)?))
        }
        Err(_) => None,
    };
    // As `Uri` writes it (an empty path as `/`), in one allocation: grown
    // by its parts, it took three.
    let mut url = String::with_capacity(text.len() + 1);
    // Writing to a String cannot fail.
    let _ = write!(url, "{uri}");
    Ok(Named { url, ip })
}

fn numeric_last_label(host: &str) -> bool {
    let last = host.trim_end_matches('.').rsplit('.').next().unwrap_or("");
    last.starts_with(|c: char| c.is_ascii_digit())
}

/// An IPv4 address as inet_aton(3) reads it: one to four parts, each
/// decimal, octal (`0` first) or hexadecimal (`0x` first), the last
/// filling the bytes the others leave.
fn inet_aton(host: &str) -> Option<std::net::Ipv4Addr> {
    let parts: Vec<u32> = host
        .trim_end_matches('.')
        .split('.')
        .map(|p| {
            let (digits, radix) = match p.get(..2) {
                Some("0x" | "0X") => (&p[2..], 16),
                _ if p.len() > 1 && p.starts_with('0') => (&p[1..], 8),
                _ => (p, 10),
            };
            u32::from_str_radix(digits, radix).ok()
        })
        .collect::<Option<_>>()?;
    let (last, init) = parts.split_last()?;
    if init.len() > 3 || init.iter().any(|&p| p > 255) {
        return None;
    }
    let room = 8 * (4 - init.len() as u32);
    if room < 32 && *last >= 1 << room {
        return None;
    }
    let head = init
        .iter()
        .fold(0u32, |acc, &p| (acc << 8) | p)
        .checked_shl(room)
        .unwrap_or(0);
    Some((head | last).into())
}

/// Checks an endpoint's secrets (`whsec_…`, space-separated) and returns
/// them as stored: the value itself, trimmed.
pub fn check_secrets(value: &[u8]) -> Result<String, Refused> {
    let text = std::str::from_utf8(value)
        .map_err(|_| Refused::Secret(SecretError::NotBase64))?
        .trim();
    let secrets = parse_secrets(text).map_err(Refused::Secret)?;
    if secrets.is_empty() {
        return Err(Refused::Secret(SecretError::Empty));
    }
    if secrets.len() > MAX_SECRETS {
        return Err(Refused::TooManySecrets);
    }
    Ok(text.to_string())
}

fn parse_secrets(text: &str) -> Result<Vec<Secret>, SecretError> {
    text.split_ascii_whitespace().map(Secret::parse).collect()
}

/// The URL an event names, as stored.
pub fn url_of(e: &NewEvent) -> Option<&str> {
    stored(e, URL_HEADER).and_then(|v| std::str::from_utf8(v).ok())
}

/// The secrets an event carries for its endpoint; `None` when it carries
/// none (the destination's own, if any, sign it then). A stored value that
/// no longer parses (edited by hand) signs with none of it.
pub fn secrets_of(e: &NewEvent) -> Option<Vec<Secret>> {
    let text = std::str::from_utf8(stored(e, SECRET_HEADER)?).ok()?;
    parse_secrets(text).ok().filter(|s| !s.is_empty())
}

fn stored<'e>(e: &'e NewEvent, name: &str) -> Option<&'e [u8]> {
    e.headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_slice())
}

/// Whether a stored header is courier's own for the endpoint, never sent.
pub fn is_own(name: &str) -> bool {
    name == URL_HEADER || name == SECRET_HEADER
}

/// An endpoint's origin (scheme, host, port): what its health, its share
/// and its place in the fair turn are kept by. The port is always written
/// so that `https://a` and `https://a:443` are one endpoint.
pub fn origin(url: &str) -> Option<String> {
    // Checked as a URI, as ingress checks what it stores.
    url.parse::<Uri>().ok()?;
    stored_origin(url)
}

/// The origin of a URL as ingress stored it (checked, written by `Uri`):
/// read off its bytes with one allocation. A `Uri` parse copies the URL
/// and the origin took two more, at each of the places an event's origin
/// is needed (admission, its share, the writer, the index, the dispatch);
/// with 10,000 endpoints that was 3 µs of an event's ~130. Bytes, not
/// `str` patterns: the `"://"` searcher's setup, the char searchers and
/// formatting the port were 1.5 µs of an event's ~106 (step m's profile).
pub fn stored_origin(url: &str) -> Option<String> {
    // From the stack in one allocation, exactly its length: the holders
    // that keep it as a `Box<str>` then take it as it is.
    origin_on_stack(url).map(|o| o.as_str().to_owned())
}

/// The origin of the endpoint an event names, shared: one copy into its
/// `Arc`, for holders that pass it on (an endpoint's share and the event
/// handed to its dispatcher).
pub fn shared_origin_of(e: &NewEvent) -> Option<Arc<str>> {
    origin_on_stack(url_of(e)?).map(|o| Arc::from(o.as_str()))
}

/// An origin written on the stack (on the heap only past 128 bytes), for
/// a caller that only looks it up, or copies it where it keeps it.
pub struct StackOrigin(SmallVec<[u8; 128]>);

impl StackOrigin {
    pub fn as_str(&self) -> &str {
        // Made of pieces of a `str` cut at ASCII bytes, and ASCII: valid.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// `stored_origin`, on the stack.
pub fn origin_on_stack(url: &str) -> Option<StackOrigin> {
    // A `Uri`'s scheme ends at its first colon, and `://` follows it.
    let colon = url.bytes().position(|c| c == b':')?;
    let (scheme, rest) = (&url[..colon], url[colon..].strip_prefix("://")?);
    let end = rest
        .bytes()
        .position(|c| matches!(c, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    authority_origin(scheme, &rest[..end])
}

/// The same origin, from a URL's scheme and authority already apart (a
/// `Uri`'s, as the connection pool keys its connections by).
pub fn authority_origin(scheme: &str, authority: &str) -> Option<StackOrigin> {
    let (scheme, host, port) = origin_parts(scheme, authority)?;
    let mut o = SmallVec::new();
    o.extend_from_slice(scheme.as_bytes());
    o.extend_from_slice(b"://");
    let host_at = o.len();
    o.extend_from_slice(host.as_bytes());
    o[host_at..].make_ascii_lowercase();
    o.push(b':');
    let (digits, first) = port_digits(port);
    o.extend_from_slice(&digits[first..]);
    Some(StackOrigin(o))
}

/// An origin's scheme (`http` and `https` in lowercase, others as
/// written), host (as written) and port (the scheme's own when none is).
fn origin_parts<'a>(scheme: &'a str, authority: &'a str) -> Option<(&'a str, &'a str, u16)> {
    let at = match authority.bytes().rposition(|c| c == b'@') {
        Some(i) => &authority[i + 1..],
        None => authority,
    };
    // A colon after an IPv6 literal's `]`, or in a name, starts the port.
    let (host, port) = match at.bytes().rposition(|c| c == b':') {
        Some(i) if !at.as_bytes()[i..].contains(&b']') => (&at[..i], Some(&at[i + 1..])),
        _ => (at, None),
    };
    let (scheme, default) = if scheme.eq_ignore_ascii_case("https") {
        ("https", Some(443))
    } else if scheme.eq_ignore_ascii_case("http") {
        ("http", Some(80))
    } else {
        (scheme, None)
    };
    // As `Uri::port_u16`: a port that is no u16 is no port.
    let port = port.and_then(|p| p.parse::<u16>().ok()).or(default)?;
    (!host.is_empty()).then_some((scheme, host, port))
}

/// A port's decimal digits, from the index returned on: no formatter.
fn port_digits(port: u16) -> ([u8; 5], usize) {
    let mut digits = [0u8; 5];
    let mut first = digits.len();
    let mut n = port;
    loop {
        first -= 1;
        digits[first] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    (digits, first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::uri::Scheme;

    fn https() -> Vec<String> {
        vec!["https".to_string()]
    }

    #[test]
    fn a_url_is_refused_by_the_rule_it_breaks() {
        let check = |url: &str| check(url.as_bytes(), &https()).map(|n| n.url);
        assert_eq!(
            check("https://hooks.acme.example/x?a=1").as_deref(),
            Ok("https://hooks.acme.example/x?a=1")
        );
        assert_eq!(check("/x"), Err(Refused::NotAbsolute));
        assert_eq!(check("hooks.acme.example/x"), Err(Refused::NotAbsolute));
        assert_eq!(check("not a url"), Err(Refused::NotAbsolute));
        assert_eq!(
            check("http://hooks.acme.example/x"),
            Err(Refused::Scheme("http".into(), "https".into()))
        );
        assert_eq!(
            check("https://u:p@hooks.acme.example/x"),
            Err(Refused::Userinfo)
        );
        assert_eq!(check("https://1.2.3.4.5/x"), Err(Refused::NotAbsolute));
        assert_eq!(
            check("https://[fe80::1%25eth0]/x"),
            Err(Refused::NotAbsolute)
        );
        let long = format!("https://a.example/{}", "x".repeat(MAX_URL));
        assert_eq!(check(&long), Err(Refused::TooLong));
        let both = vec!["http".to_string(), "https".to_string()];
        assert!(super::check(b"http://127.0.0.1/", &both).is_ok());
    }

    #[test]
    fn the_address_a_host_names_is_found_also_in_the_resolvers_forms() {
        let ip = |url: &str| check(url.as_bytes(), &https()).map(|n| n.ip);
        for (url, want) in [
            ("https://127.0.0.1/x", "127.0.0.1"),
            ("https://169.254.169.254/latest", "169.254.169.254"),
            ("https://[::1]/x", "::1"),
            ("https://[::ffff:127.0.0.1]/x", "::ffff:127.0.0.1"),
            ("https://[64:ff9b::7f00:1]/x", "64:ff9b::7f00:1"),
            // What inet_aton, and so the system's resolver, reads.
            ("https://2130706433/x", "127.0.0.1"),
            ("https://0x7f.1/x", "127.0.0.1"),
            ("https://017700000001/x", "127.0.0.1"),
            ("https://127.1/x", "127.0.0.1"),
            ("https://10.1.2/x", "10.1.0.2"),
        ] {
            let want: IpAddr = want.parse().expect("an address");
            assert_eq!(ip(url), Ok(Some(want)), "{url}");
        }
        assert_eq!(ip("https://hooks.acme.example/x"), Ok(None));
        assert_eq!(
            ip("https://1password.example/x"),
            Ok(None),
            "a name that starts with a digit"
        );
    }

    #[test]
    fn secrets_are_checked_and_kept_as_given() {
        let a = crate::event::signature::encode(b"key a");
        let b = crate::event::signature::encode(b"key b");
        let two = format!(" {a} {b} ");
        assert_eq!(check_secrets(two.as_bytes()), Ok(format!("{a} {b}")));
        assert_eq!(
            check_secrets(b"whsec_***"),
            Err(Refused::Secret(SecretError::NotBase64))
        );
        assert_eq!(
            check_secrets(b"  "),
            Err(Refused::Secret(SecretError::Empty))
        );
        let five = [a.as_str(); 5].join(" ");
        assert_eq!(check_secrets(five.as_bytes()), Err(Refused::TooManySecrets));
    }

    #[test]
    fn an_origin_always_has_its_port() {
        assert_eq!(
            origin("https://Hooks.Acme.example/x").as_deref(),
            Some("https://hooks.acme.example:443")
        );
        assert_eq!(
            origin("https://hooks.acme.example:443/y").as_deref(),
            Some("https://hooks.acme.example:443")
        );
        assert_eq!(
            origin("http://127.0.0.1:9000/").as_deref(),
            Some("http://127.0.0.1:9000")
        );
        assert_eq!(
            origin("https://[::1]:8443/").as_deref(),
            Some("https://[::1]:8443")
        );
        assert_eq!(origin("/x"), None);
        // A scheme ends at the first colon: a later `://` starts none.
        assert_eq!(origin("/a:b/c://h:80"), None);
        assert_eq!(stored_origin("x:y://h:80/"), None);
        let long = format!("https://{}.example/x", "a".repeat(200));
        assert_eq!(
            origin_on_stack(&long).map(|o| o.as_str().to_string()),
            Some(format!("https://{}.example:443", "a".repeat(200))),
            "past the stack's 128 bytes"
        );
    }

    /// The origin as a `Uri` gave it, before `stored_origin`.
    fn uri_origin(url: &str) -> Option<String> {
        let uri: Uri = url.parse().ok()?;
        let scheme = uri.scheme()?;
        let authority = uri.authority()?;
        let port = authority.port_u16().or(if *scheme == Scheme::HTTPS {
            Some(443)
        } else if *scheme == Scheme::HTTP {
            Some(80)
        } else {
            None
        })?;
        let host = authority.host().to_ascii_lowercase();
        Some(format!("{}://{host}:{port}", scheme.as_str()))
    }

    #[test]
    fn an_origin_read_off_the_text_is_the_one_a_uri_gives() {
        let schemes = ["https", "HTTP", "http", "Https", "ftp", ""];
        let users = ["", "u@", "u:p@", "a@b@"];
        let hosts = [
            "hooks.Acme.example",
            "127.0.0.1",
            "[::1]",
            "[::ffff:127.0.0.1]",
            "[FE80::1]",
            "",
            "xn--bcher-kva.example",
        ];
        let ports = [
            "", ":", ":0", ":443", ":8443", ":65535", ":65536", ":99999", ":+80",
        ];
        let tails = ["", "/", "/x?a=1", "?q", "/p:q@r", "#f", "/a/[b]"];
        let mut compared = 0;
        for s in schemes {
            for u in users {
                for h in hosts {
                    for p in ports {
                        for t in tails {
                            let url = format!("{s}://{u}{h}{p}{t}");
                            // Stricter than a `Uri` in one thing: no host, no origin.
                            let want = uri_origin(&url).filter(|o| !o.contains("://:"));
                            assert_eq!(origin(&url), want, "{url}");
                            if let Some(o) = stored_origin(&url) {
                                assert_eq!(o.capacity(), o.len(), "{url}: {o}");
                            }
                            let named = NewEvent {
                                id: "e".into(),
                                destination: "d".into(),
                                method: "POST".into(),
                                path: String::new(),
                                headers: vec![(URL_HEADER.into(), url.clone().into_bytes())],
                                body: bytes::Bytes::new(),
                                accepted_ms: 0,
                            };
                            assert_eq!(
                                shared_origin_of(&named).as_deref(),
                                stored_origin(&url).as_deref(),
                                "{url}"
                            );
                            if let Ok(named) =
                                check(url.as_bytes(), &["https".into(), "http".into()])
                            {
                                assert_eq!(
                                    stored_origin(&named.url),
                                    uri_origin(&named.url),
                                    "{url}"
                                );
                                compared += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(compared > 100, "{compared} checked URLs compared");
    }

    #[test]
    fn the_stored_headers_give_back_url_and_secrets() {
        let secret = crate::event::signature::encode(b"k");
        let e = NewEvent {
            id: "e".into(),
            destination: "d".into(),
            method: "POST".into(),
            path: String::new(),
            headers: vec![
                ("x-a".into(), b"1".to_vec()),
                (URL_HEADER.into(), b"https://a.example/h".to_vec()),
                (SECRET_HEADER.into(), secret.into_bytes()),
            ],
            body: bytes::Bytes::new(),
            accepted_ms: 0,
        };
        assert_eq!(url_of(&e), Some("https://a.example/h"));
        assert_eq!(secrets_of(&e).map(|s| s.len()), Some(1));
        assert!(is_own(URL_HEADER) && is_own(SECRET_HEADER) && !is_own("x-a"));
    }
}
