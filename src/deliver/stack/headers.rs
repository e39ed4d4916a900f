//! Adds the headers every attempt carries: `webhook-id`,
//! `courier-delivery-attempt`, `courier-destination`, and the destination's
//! custom headers (which replace any header of the same name from the app).

use super::Attempt;
use crate::config::DestinationSettings;
use crate::config::settings::CustomHeader;
use http::{HeaderValue, Request};
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

#[derive(Clone)]
pub struct HeadersLayer {
    destination: HeaderValue,
    custom: Arc<[CustomHeader]>,
}

impl HeadersLayer {
    pub fn new(dest: &DestinationSettings) -> Self {
        HeadersLayer {
            destination: HeaderValue::from_str(&dest.name)
                .unwrap_or(HeaderValue::from_static("invalid")),
            custom: dest.headers.clone().into(),
        }
    }
}

impl<S> Layer<S> for HeadersLayer {
    type Service = Headers<S>;
    fn layer(&self, inner: S) -> Headers<S> {
        Headers {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Headers<S> {
    inner: S,
    layer: HeadersLayer,
}

impl<S, B> Service<Request<B>> for Headers<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        let attempt = req.extensions().get::<Attempt>().cloned();
        let h = req.headers_mut();
        if let Some(a) = attempt {
            if let Ok(id) = HeaderValue::from_str(&a.id) {
                h.insert("webhook-id", id);
            }
            h.insert("courier-delivery-attempt", HeaderValue::from(a.number));
        }
        h.insert("courier-destination", self.layer.destination.clone());
        for c in self.layer.custom.iter() {
            h.insert(c.name.clone(), c.value.clone());
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use tower::ServiceExt;

    #[tokio::test]
    async fn sets_attempt_headers_and_custom_headers_over_the_apps() {
        let layer = HeadersLayer {
            destination: HeaderValue::from_static("orders"),
            custom: vec![CustomHeader {
                name: http::HeaderName::from_static("x-tenant"),
                value: HeaderValue::from_static("acme"),
            }]
            .into(),
        };
        let echo = tower::service_fn(|req: Request<()>| async move {
            Ok::<_, Infallible>(req.headers().clone())
        });
        let mut req = Request::new(());
        req.headers_mut()
            .insert("x-tenant", HeaderValue::from_static("from-app"));
        req.extensions_mut().insert(Attempt {
            id: "evt-1".into(),
            number: 3,
        });
        let h = layer.layer(echo).oneshot(req).await.expect("infallible");
        assert_eq!(h["webhook-id"], "evt-1");
        assert_eq!(h["courier-delivery-attempt"], "3");
        assert_eq!(h["courier-destination"], "orders");
        assert_eq!(h.get_all("x-tenant").iter().collect::<Vec<_>>(), ["acme"]);
    }
}
