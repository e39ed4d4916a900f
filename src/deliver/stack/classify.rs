//! Turns whatever the inner stack returned (a response, a timeout, a
//! transport error) into a classified `Attempted`, beside the answer itself
//! (`Answered`). Classification itself is the pure `policy::classify`; this
//! layer only extracts status, Retry-After and the kind of transport failure.

use super::timeout::{LateAnswer, LateSlot, TimedOut};
use crate::deliver::guard::AddressRefused;
use crate::deliver::resolver::ResolveError;
use crate::policy::classify::parse_retry_after;
use crate::policy::{Classified, StatusPolicy, Transport};
use http::{Request, Response};
use std::convert::Infallible;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;
use tower::{BoxError, Layer, Service};

#[derive(Debug)]
pub struct Attempted {
    pub classified: Classified,
    pub status: Option<u16>,
    pub took: Duration,
    /// The answer's Retry-After, if any.
    pub retry_after: Option<Duration>,
    /// After a timeout: the answer's status, if it still comes in the
    /// late-answer window.
    pub late: Option<LateAnswer>,
    /// A short description of a transport failure, for logs.
    pub error: Option<String>,
}

/// An attempt's verdict and, when there was one, the answer with its body
/// unread: passthrough streams it to the app, durable delivery drains it.
pub struct Answered<B> {
    pub attempted: Attempted,
    pub answer: Option<Response<B>>,
}

#[derive(Clone)]
pub struct ClassifyLayer {
    policy: Arc<StatusPolicy>,
}

impl ClassifyLayer {
    pub fn new(policy: StatusPolicy) -> Self {
        ClassifyLayer {
            policy: Arc::new(policy),
        }
    }
}

impl<S> Layer<S> for ClassifyLayer {
    type Service = Classify<S>;
    fn layer(&self, inner: S) -> Classify<S> {
        Classify {
            inner,
            policy: self.policy.clone(),
            not_ready: None,
        }
    }
}

#[derive(Clone)]
pub struct Classify<S> {
    inner: S,
    policy: Arc<StatusPolicy>,
    /// The inner service failed `poll_ready`: the next call reports it as
    /// this attempt's transport failure instead of calling it.
    not_ready: Option<(Transport, String)>,
}

impl<S, ReqBody, B> Service<Request<ReqBody>> for Classify<S>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    S::Error: Into<BoxError>,
{
    type Response = Answered<B>;
    type Error = Infallible;
    type Future = Classifying<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        match self.inner.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => Poll::Ready(Ok(())),
            Poll::Ready(Err(e)) => {
                let e: BoxError = e.into();
                self.not_ready = Some((transport_kind(e.as_ref()), chain(e.as_ref())));
                Poll::Ready(Ok(()))
            }
        }
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Classifying<S::Future> {
        if let Some((kind, error)) = self.not_ready.take() {
            let attempted = Attempted {
                classified: self.policy.classify_transport(kind),
                status: None,
                took: Duration::ZERO,
                retry_after: None,
                late: None,
                error: Some(error),
            };
            return Classifying::Failed {
                attempted: Some(attempted),
            };
        }
        // The timeout layer leaves a late answer here, not in its error.
        let late = LateSlot::default();
        req.extensions_mut().insert(late.clone());
        Classifying::Sent {
            started: Instant::now(),
            inner: self.inner.call(req),
            policy: self.policy.clone(),
            late,
        }
    }
}

pin_project_lite::pin_project! {
    /// `Classify`'s answer: named rather than boxed, one allocation an
    /// attempt fewer (benches/RESULTS.md).
    #[project = Projected]
    pub enum Classifying<F> {
        /// The inner service was not ready: this attempt's failure, given
        /// once.
        Failed { attempted: Option<Attempted> },
        Sent {
            #[pin]
            inner: F,
            started: Instant,
            policy: Arc<StatusPolicy>,
            late: LateSlot,
        },
    }
}

impl<F, B, E> Future for Classifying<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Answered<B>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (result, started, policy, late) = match self.project() {
            // Polled again after its answer: there is none left to give.
            Projected::Failed { attempted } => {
                return match attempted.take() {
                    Some(attempted) => Poll::Ready(Ok(Answered {
                        attempted,
                        answer: None,
                    })),
                    None => Poll::Pending,
                };
            }
            Projected::Sent {
                inner,
                started,
                policy,
                late,
            } => match inner.poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(result) => (result, started, policy, late),
            },
        };
        let took = started.elapsed();
        Poll::Ready(Ok(match result {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let retry_after = resp
                    .headers()
                    .get(http::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| parse_retry_after(v, SystemTime::now()));
                Answered {
                    attempted: Attempted {
                        classified: policy.classify_status(status, retry_after),
                        status: Some(status),
                        took,
                        retry_after,
                        late: None,
                        error: None,
                    },
                    answer: Some(resp),
                }
            }
            Err(e) => {
                let e: BoxError = e.into();
                let kind = transport_kind(e.as_ref());
                Answered {
                    attempted: Attempted {
                        classified: policy.classify_transport(kind),
                        status: None,
                        took,
                        retry_after: None,
                        late: late.take(),
                        error: Some(chain(e.as_ref())),
                    },
                    answer: None,
                }
            }
        }))
    }
}

/// Walks the error chain: a timeout, a TLS failure, a DNS failure, or else
/// a socket-level failure.
pub fn transport_kind(err: &(dyn StdError + 'static)) -> Transport {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.is::<TimedOut>() {
            return Transport::TimedOut;
        }
        if e.is::<rustls::Error>() {
            return Transport::Tls;
        }
        // On HTTP/2 a TLS 1.3 server's refusal of the client certificate
        // arrives after the handshake, through h2, which keeps only the io
        // error's kind and text (its errors are `Clone`): known then by
        // tokio-rustls's kind and rustls's wording.
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && (wraps_rustls(io) || rustls_text(io))
        {
            return Transport::Tls;
        }
        if e.is::<ResolveError>() {
            return Transport::Resolution;
        }
        if e.is::<AddressRefused>() {
            return Transport::AddressRefused;
        }
        cur = e.source();
    }
    Transport::Socket
}

/// Whether a `rustls::Error` is inside `io`. Not found by `source()`: a
/// custom `io::Error` answers its inner error's source, not the inner
/// error, and hyper-rustls wraps tokio-rustls's `io::Error` (which holds
/// the `rustls::Error`) in another one.
fn wraps_rustls(io: &std::io::Error) -> bool {
    let mut inner = io.get_ref();
    while let Some(e) = inner {
        if e.is::<rustls::Error>() {
            return true;
        }
        inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref());
    }
    false
}

/// An `io::Error` rebuilt from a `rustls::Error`'s text: tokio-rustls
/// reports TLS failures as `InvalidData`, and rustls's messages for what
/// a peer sent begin with these words.
fn rustls_text(io: &std::io::Error) -> bool {
    const RUSTLS: [&str; 4] = [
        "received fatal alert",
        "invalid peer certificate",
        "peer is incompatible",
        "peer misbehaved",
    ];
    io.kind() == std::io::ErrorKind::InvalidData && {
        let text = io.to_string();
        RUSTLS.iter().any(|p| text.starts_with(p))
    }
}

fn chain(err: &(dyn StdError + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    let mut cur = err.source();
    while let Some(e) = cur {
        parts.push(e.to_string());
        cur = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Outcome;
    use crate::policy::Verdict;
    use tower::ServiceExt;

    #[derive(Debug)]
    struct Wrapped(Box<dyn StdError + Send + Sync>);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("client error (Connect)")
        }
    }
    impl StdError for Wrapped {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(self.0.as_ref())
        }
    }

    #[test]
    fn error_chains_map_to_transport_kinds() {
        let elapsed: BoxError = Box::new(TimedOut {
            after: Duration::from_secs(1),
        });
        assert_eq!(transport_kind(elapsed.as_ref()), Transport::TimedOut);
        let tls = Wrapped(Box::new(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::DecryptError,
        )));
        assert_eq!(transport_kind(&tls), Transport::Tls);
        // As hyper-rustls hands a failed handshake on: wrapped once more.
        let wrapped = Wrapped(Box::new(std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        ))));
        assert_eq!(transport_kind(&wrapped), Transport::Tls);
        // What h2 keeps of it, and hyper hands on: the kind and the text.
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        let kept = std::io::Error::new(std::io::ErrorKind::InvalidData, alert.to_string());
        assert!(rustls_text(&kept), "{kept}");
        let other = std::io::Error::new(std::io::ErrorKind::InvalidData, "bad frame size");
        assert!(!rustls_text(&other));
        let refused = Wrapped(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(transport_kind(&refused), Transport::Socket);
        // Found by its type: hyper-util's "dns error" around it, whatever
        // the resolver's words.
        let lookup = std::io::Error::other("failed to lookup address information");
        assert_eq!(
            transport_kind(&Wrapped(Box::new(ResolveError(lookup)))),
            Transport::Resolution
        );
        let worded = std::io::Error::other("dns error");
        assert_eq!(
            transport_kind(&Wrapped(Box::new(worded))),
            Transport::Socket
        );
    }

    #[tokio::test]
    async fn responses_are_classified_with_retry_after() {
        let inner = tower::service_fn(|_: Request<()>| async {
            let resp = Response::builder()
                .status(429)
                .header("retry-after", "7")
                .body(())
                .expect("response");
            Ok::<_, BoxError>(resp)
        });
        let answered = ClassifyLayer::new(StatusPolicy::default())
            .layer(inner)
            .oneshot(Request::new(()))
            .await
            .expect("infallible");
        assert_eq!(
            answered.answer.map(|r| r.headers()["retry-after"].clone()),
            Some(http::HeaderValue::from_static("7")),
            "the answer itself is handed on"
        );
        let out = answered.attempted;
        assert_eq!(out.status, Some(429));
        assert_eq!(out.classified.outcome, Outcome::Busy);
        assert_eq!(
            out.classified.verdict,
            Verdict::Retry {
                min_delay: Duration::from_secs(7)
            }
        );
    }

    /// A client that cannot take the attempt (its connector failed
    /// `poll_ready`) gives the attempt's failure, not a call: classified
    /// by the error's chain, with its text, and no answer.
    #[tokio::test]
    async fn an_inner_service_not_ready_is_the_attempts_transport_failure() {
        #[derive(Clone)]
        struct Refusing;
        impl Service<Request<()>> for Refusing {
            type Response = Response<()>;
            type Error = BoxError;
            type Future = std::future::Ready<Result<Response<()>, BoxError>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
                let e = std::io::Error::other("no route to 10.0.0.1");
                Poll::Ready(Err(Box::new(e)))
            }
            fn call(&mut self, _: Request<()>) -> Self::Future {
                panic!("called after a failed poll_ready")
            }
        }
        let answered = ClassifyLayer::new(StatusPolicy::default())
            .layer(Refusing)
            .oneshot(Request::new(()))
            .await
            .expect("infallible");
        assert!(answered.answer.is_none());
        let out = answered.attempted;
        assert_eq!(out.status, None);
        assert_eq!(out.classified.outcome, Outcome::SocketError);
        assert_eq!(
            out.classified.verdict,
            Verdict::Retry {
                min_delay: Duration::ZERO
            }
        );
        assert!(
            out.error.as_deref().is_some_and(|e| e.contains("10.0.0.1")),
            "{:?}",
            out.error
        );
    }
}
