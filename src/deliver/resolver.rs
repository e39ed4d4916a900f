//! The endpoint's name lookup (the system resolver, as before), wrapped so
//! that its failure is a type, [`ResolveError`], which classify finds in
//! the error chain; hyper-util only names it by the words "dns error".
//! With the address guard on, the addresses it answers are filtered
//! (`guard::filter`) before the connector dials any.

use super::guard::{self, AddressRefused};
use crate::policy::address::Guard;
use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The system resolver (`getaddrinfo` on a blocking thread).
#[derive(Clone)]
pub struct Resolver {
    gai: GaiResolver,
    guard: Option<Arc<Guard>>,
}

/// The endpoint's host name did not resolve: a `ResolutionError` attempt.
#[derive(Debug, thiserror::Error)]
#[error("cannot resolve the host: {0}")]
pub struct ResolveError(#[source] pub(crate) std::io::Error);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Resolver {
    pub fn new(guard: Option<Arc<Guard>>) -> Resolver {
        Resolver {
            gai: GaiResolver::new(),
            guard,
        }
    }
}

impl tower::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    /// A [`ResolveError`] or an [`AddressRefused`], boxed as the connector
    /// keeps it, so that classify finds either by its type.
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.gai
            .poll_ready(cx)
            .map_err(|e| Box::new(ResolveError(e)) as BoxError)
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let host = name.as_str().to_string();
        let lookup = self.gai.call(name);
        let guard = self.guard.clone();
        Box::pin(async move {
            let addrs = lookup
                .await
                .map_err(|e| Box::new(ResolveError(e)) as BoxError)?;
            let addrs: Vec<SocketAddr> = match &guard {
                Some(guard) => guard::filter(guard, &host, addrs)
                    .map_err(|e: AddressRefused| Box::new(e) as BoxError)?,
                None => addrs.collect(),
            };
            Ok(addrs.into_iter())
        })
    }
}
