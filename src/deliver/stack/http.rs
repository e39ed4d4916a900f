//! The innermost service: send the request, hand back the answer with its
//! body unread. Durable attempts drain it (`drain`); passthrough streams it
//! to the app.

use crate::deliver::HttpsClient;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Response bodies beyond this are not read; the status decides anyway.
const MAX_RESPONSE_BODY: usize = 64 * 1024;
/// How long a response body may take to drain before its connection is dropped.
const BODY_DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
pub struct HttpService {
    client: HttpsClient,
}

impl HttpService {
    pub fn new(client: HttpsClient) -> Self {
        HttpService { client }
    }
}

impl tower::Service<Request<Full<Bytes>>> for HttpService {
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Incoming>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Full<Bytes>>) -> Self::Future {
        let client = self.client.clone();
        Box::pin(async move { Ok(client.request(req).await?) })
    }
}

/// Reads an answer's body nobody needs, in the background, so that its
/// connection goes back to the pool; a body too large or too slow costs
/// the connection instead, never an attempt's time.
pub fn drain<B>(body: B)
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    tokio::spawn(async move {
        let drain = Limited::new(body, MAX_RESPONSE_BODY).collect();
        let _ = tokio::time::timeout(BODY_DRAIN, drain).await;
    });
}
