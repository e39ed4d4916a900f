//! Signs each attempt the Standard Webhooks way: `webhook-timestamp` (Unix
//! seconds, taken when the attempt goes out) and `webhook-signature` (one
//! `v1,` HMAC per secret, space-separated). It sits after `headers`, so it
//! signs the `webhook-id` that layer set (an event's id, later a batch's),
//! and it signs the body bytes from the request itself, so the signature
//! covers exactly what is sent. Each attempt, retries included, is signed
//! afresh: receivers reject timestamps older than a few minutes.
//!
//! Without secrets the layer is a pass-through, so every destination has the
//! same stack shape. An event that names its endpoint may carry that
//! endpoint's own secrets (`EndpointSecrets`): they sign in place of the
//! destination's.

use super::{AttemptRequest, body_bytes};
use crate::event::signature::{Secret, signature_header};
use http::{HeaderName, HeaderValue};
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// A request extension: the secrets of the endpoint an event names, which
/// sign its attempt instead of the destination's `signing` secrets.
#[derive(Clone)]
pub struct EndpointSecrets(pub Arc<[Secret]>);

#[derive(Clone)]
pub struct SigningLayer {
    secrets: Arc<[Secret]>,
}

impl SigningLayer {
    pub fn new(secrets: Vec<Secret>) -> Self {
        SigningLayer {
            secrets: secrets.into(),
        }
    }
}

impl<S> Layer<S> for SigningLayer {
    type Service = Signing<S>;
    fn layer(&self, inner: S) -> Signing<S> {
        Signing {
            inner,
            secrets: self.secrets.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Signing<S> {
    inner: S,
    secrets: Arc<[Secret]>,
}

impl<S> Service<AttemptRequest> for Signing<S>
where
    S: Service<AttemptRequest>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: AttemptRequest) -> S::Future {
        let secrets = match req.extensions_mut().remove::<EndpointSecrets>() {
            Some(EndpointSecrets(own)) => own,
            None => self.secrets.clone(),
        };
        if !secrets.is_empty() {
            let timestamp = crate::clock::now_ms() / 1000;
            sign(&mut req, &secrets, timestamp);
        }
        self.inner.call(req)
    }
}

const TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
const SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");

/// Sets `webhook-timestamp` and `webhook-signature` on `req`.
fn sign(req: &mut AttemptRequest, secrets: &[Secret], timestamp: u64) {
    let body = body_bytes(req);
    let h = req.headers_mut();
    let id = h
        .get("webhook-id")
        .map(HeaderValue::as_bytes)
        .unwrap_or_default();
    let signature = signature_header(secrets, id, timestamp, &body);
    h.insert(TIMESTAMP, HeaderValue::from(timestamp));
    // Base64, `v1,` and spaces only: always a valid header value.
    if let Ok(v) = HeaderValue::from_str(&signature) {
        h.insert(SIGNATURE, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::HeaderMap;
    use http_body_util::Full;
    use std::convert::Infallible;
    use tower::ServiceExt;

    fn secret(key: &[u8]) -> Secret {
        Secret::parse(&crate::event::signature::encode(key)).expect("valid secret")
    }

    fn request(body: &'static [u8]) -> AttemptRequest {
        let mut req = AttemptRequest::new(Full::new(Bytes::from_static(body)));
        req.headers_mut()
            .insert("webhook-id", HeaderValue::from_static("evt-1"));
        req
    }

    async fn send(layer: SigningLayer, req: AttemptRequest) -> (HeaderMap, Bytes) {
        let echo = tower::service_fn(|req: AttemptRequest| async move {
            let (parts, body) = req.into_parts();
            Ok::<_, Infallible>((parts.headers, body.into_inner().unwrap_or_default()))
        });
        layer.layer(echo).oneshot(req).await.expect("infallible")
    }

    #[test]
    fn signs_id_timestamp_and_body_with_every_secret() {
        let (a, b) = (secret(b"key a"), secret(b"key b"));
        let mut req = request(b"{\"n\":1}");
        sign(&mut req, &[a.clone(), b.clone()], 1_700_000_000);
        let h = req.headers();
        assert_eq!(h["webhook-timestamp"], "1700000000");
        let want = format!(
            "{} {}",
            a.sign(b"evt-1", 1_700_000_000, b"{\"n\":1}"),
            b.sign(b"evt-1", 1_700_000_000, b"{\"n\":1}")
        );
        assert_eq!(h["webhook-signature"], want.as_str());
    }

    #[tokio::test]
    async fn the_layer_stamps_the_current_time_and_keeps_the_body() {
        let before = crate::clock::now_ms() / 1000;
        let (h, body) = send(SigningLayer::new(vec![secret(b"k")]), request(b"payload")).await;
        let ts: u64 = h["webhook-timestamp"]
            .to_str()
            .ok()
            .and_then(|t| t.parse().ok())
            .expect("numeric timestamp");
        assert!(ts >= before && ts <= before + 2, "{ts} vs {before}");
        assert_eq!(body, &b"payload"[..]);
        assert_eq!(
            h["webhook-signature"],
            secret(b"k").sign(b"evt-1", ts, b"payload").as_str()
        );
    }

    #[tokio::test]
    async fn an_endpoints_own_secrets_sign_instead_of_the_destinations() {
        let mut req = request(b"x");
        let own = secret(b"endpoint key");
        req.extensions_mut()
            .insert(EndpointSecrets(vec![own.clone()].into()));
        let (h, _) = send(SigningLayer::new(vec![secret(b"destination key")]), req).await;
        let ts: u64 = h["webhook-timestamp"]
            .to_str()
            .ok()
            .and_then(|t| t.parse().ok())
            .expect("numeric timestamp");
        assert_eq!(
            h["webhook-signature"],
            own.sign(b"evt-1", ts, b"x").as_str(),
            "signed with the endpoint's secret alone"
        );
        let mut req = request(b"x");
        req.extensions_mut()
            .insert(EndpointSecrets(vec![own.clone()].into()));
        let (h, _) = send(SigningLayer::new(Vec::new()), req).await;
        assert!(
            h.get("webhook-signature").is_some(),
            "signed without destination secrets"
        );
    }

    #[tokio::test]
    async fn without_secrets_nothing_is_added() {
        let (h, body) = send(SigningLayer::new(Vec::new()), request(b"x")).await;
        assert!(h.get("webhook-signature").is_none());
        assert!(h.get("webhook-timestamp").is_none());
        assert_eq!(body, &b"x"[..]);
    }
}
