//! The address guard at connect time (`policy::address` says which
//! addresses pass). Two doors lead to a socket in hyper-util's
//! `HttpConnector`: a host name goes through the resolver, whose answer is
//! filtered here after DNS (so a name that resolves to a private address,
//! or is rebound to one, is caught); an IP literal skips the resolver, so
//! `Guarded` checks it before the connector sees the URI. Either way no
//! connection is opened to a refused address. Redirects are never
//! followed: hyper's client does not follow them.

use super::resolver::Resolver;
use super::stream::Stream;
use crate::policy::address::{self, Guard};
use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Every address of the endpoint is refused by the guard: an
/// `AddressNotAllowed` attempt, never retried.
#[derive(Debug, thiserror::Error)]
#[error(
    "the address guard refuses {host} ({addresses}): a private or reserved address; endpoints.allow_cidrs opens a range"
)]
pub struct AddressRefused {
    host: String,
    addresses: String,
}

impl AddressRefused {
    fn new(host: &str, refused: &[IpAddr]) -> AddressRefused {
        let addresses: Vec<String> = refused.iter().map(IpAddr::to_string).collect();
        AddressRefused {
            host: host.to_string(),
            addresses: addresses.join(", "),
        }
    }
}

/// The addresses of `host` that `guard` lets through, in the resolver's
/// order; refused when none is left.
pub fn filter(
    guard: &Guard,
    host: &str,
    addrs: impl Iterator<Item = SocketAddr>,
) -> Result<Vec<SocketAddr>, AddressRefused> {
    let (kept, refused): (Vec<SocketAddr>, Vec<SocketAddr>) =
        addrs.partition(|a| guard.allows(a.ip()));
    if kept.is_empty() && !refused.is_empty() {
        let ips: Vec<IpAddr> = refused.iter().map(SocketAddr::ip).collect();
        return Err(AddressRefused::new(host, &ips));
    }
    Ok(kept)
}

/// The plain connector, with its IP literals checked first.
#[derive(Clone)]
pub struct Guarded {
    http: HttpConnector<Resolver>,
    guard: Option<Arc<Guard>>,
}

impl Guarded {
    pub fn new(http: HttpConnector<Resolver>, guard: Option<Arc<Guard>>) -> Guarded {
        Guarded { http, guard }
    }

    /// The refusal of `uri`'s host when it is an IP literal the guard
    /// refuses (as the connector reads literals: `[v6]` without brackets).
    fn refuses(&self, uri: &Uri) -> Option<AddressRefused> {
        let guard = self.guard.as_ref()?;
        let host = uri.host()?;
        let ip = address::literal(host)?;
        (!guard.allows(ip)).then(|| AddressRefused::new(host, &[ip]))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<Uri> for Guarded {
    type Response = Stream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        if let Some(refused) = self.refuses(&uri) {
            return Box::pin(async move { Err(refused.into()) });
        }
        let connect = self.http.call(uri);
        Box::pin(async move { connect.await.map(Stream).map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::Service;

    fn guard(allow: &[&str]) -> Arc<Guard> {
        Arc::new(Guard::new(
            allow.iter().map(|n| n.parse().expect("cidr")).collect(),
        ))
    }

    #[tokio::test]
    async fn an_ip_literal_the_guard_refuses_is_never_dialed() {
        // A listener on loopback: the connect would succeed if attempted.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let mut http = HttpConnector::new_with_resolver(Resolver::new(None));
        http.enforce_http(false);
        let mut refusing = Guarded::new(http.clone(), Some(guard(&[])));
        for uri in [
            format!("http://127.0.0.1:{port}/"),
            format!("http://[::ffff:127.0.0.1]:{port}/"),
            format!("http://[::1]:{port}/"),
        ] {
            let err = match refusing.call(uri.parse().expect("uri")).await {
                Ok(_) => panic!("{uri}: connected"),
                Err(e) => e,
            };
            assert!(err.is::<AddressRefused>(), "{uri}: {err}");
        }
        let mut opened = Guarded::new(http, Some(guard(&["127.0.0.0/8"])));
        let uri = format!("http://127.0.0.1:{port}/");
        assert!(opened.call(uri.parse().expect("uri")).await.is_ok());
    }

    #[tokio::test]
    async fn a_name_resolving_to_a_refused_address_is_refused_after_dns() {
        let mut http = HttpConnector::new_with_resolver(Resolver::new(Some(guard(&[]))));
        http.enforce_http(false);
        let mut connector = Guarded::new(http, Some(guard(&[])));
        let err = match connector
            .call("http://localhost:9/".parse().expect("uri"))
            .await
        {
            Ok(_) => panic!("connected to localhost"),
            Err(e) => e,
        };
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err.as_ref());
        let mut found = false;
        for _ in 0..8 {
            let Some(e) = cause else { break };
            found |= e.is::<AddressRefused>();
            cause = e.source();
        }
        assert!(found, "not refused by the guard: {err:?}");
    }

    #[test]
    fn a_name_keeps_its_allowed_addresses_and_is_refused_with_none() {
        let g = guard(&[]);
        let addr = |s: &str| -> SocketAddr { s.parse().expect("addr") };
        let kept = filter(
            &g,
            "mixed",
            [addr("10.0.0.1:443"), addr("8.8.8.8:443")].into_iter(),
        );
        assert_eq!(kept.expect("one public address"), vec![addr("8.8.8.8:443")]);
        let refused = filter(
            &g,
            "inside",
            [addr("10.0.0.1:443"), addr("[::1]:443")].into_iter(),
        );
        let e = refused.expect_err("only private addresses");
        assert!(e.to_string().contains("inside (10.0.0.1, ::1)"), "{e}");
    }
}
