//! The endpoint's name lookup (the system resolver, as before), wrapped so
//! that its failure is a type, [`ResolveError`], which classify finds in
//! the error chain; hyper-util only names it by the words "dns error".

use hyper_util::client::legacy::connect::dns::{GaiAddrs, GaiResolver, Name};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The system resolver (`getaddrinfo` on a blocking thread).
#[derive(Clone)]
pub struct Resolver(GaiResolver);

/// The endpoint's host name did not resolve: a `ResolutionError` attempt.
#[derive(Debug, thiserror::Error)]
#[error("cannot resolve the host: {0}")]
pub struct ResolveError(#[source] pub(crate) std::io::Error);

impl Resolver {
    pub fn new() -> Resolver {
        Resolver(GaiResolver::new())
    }
}

impl tower::Service<Name> for Resolver {
    type Response = GaiAddrs;
    type Error = ResolveError;
    type Future = Pin<Box<dyn Future<Output = Result<GaiAddrs, ResolveError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ResolveError>> {
        self.0.poll_ready(cx).map_err(ResolveError)
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let lookup = self.0.call(name);
        Box::pin(async move { lookup.await.map_err(ResolveError) })
    }
}
