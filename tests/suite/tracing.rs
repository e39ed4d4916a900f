//! Tracing (docs/tracing.md), judged by a real OTLP/HTTP receiver decoding with
//! the OpenTelemetry project's own protobuf classes
//! (`support::otlp::OtlpReceiver`): the accept span is a child of the
//! app's `traceparent`, every attempt a span of the app's trace, across a
//! SIGKILL and restart; the endpoint gets the attempt's own `traceparent`.
//! Off, nothing is exported and the app's `traceparent` is forwarded as
//! it came. A batch's span links each event; passthrough attempts are
//! children of the accept span.

use std::time::Duration;
use support::otlp::{OtlpReceiver, Span};
use support::{Courier, Receiver, Reply, behavior, check, check_eq, fail, post};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const APP_SPAN: &str = "00f067aa0ba902b7";
const PROMPT: Duration = Duration::from_secs(15);

fn traceparent() -> String {
    format!("00-{TRACE}-{APP_SPAN}-01")
}

/// One destination `orders` at `url` with `extra` keys, and tracing on
/// towards `otlp`.
fn traced(url: &str, extra: &str, otlp: &OtlpReceiver) -> String {
    format!(
        "{}tracing: {{ otlp_endpoint: {}, sample_ratio: 1.0 }}\n",
        support::config("orders", url, extra),
        otlp.endpoint()
    )
}

fn accept_spans(spans: &[Span]) -> Vec<&Span> {
    spans.iter().filter(|s| s.kind == Span::SERVER).collect()
}

fn attempt_spans(spans: &[Span]) -> Vec<&Span> {
    let mut a: Vec<&Span> = spans.iter().filter(|s| s.kind == Span::CLIENT).collect();
    a.sort_by_key(|s| s.attr_int("courier.attempt"));
    a
}

async fn post_event(c: &Courier, id: &str, headers: &[(&str, &str)]) {
    let mut all = vec![
        ("idempotency-key", id),
        ("content-type", "application/json"),
    ];
    all.extend_from_slice(headers);
    let resp = post(&c.url("orders"), "{\"n\":1}", &all).await;
    check_eq!(c, resp.status, 202, "POST /orders: {}", resp.text());
}

/// The endpoint's `traceparent` names the attempt span `span` in the
/// app's trace.
fn names_span(header: Option<&str>, span: &Span) -> bool {
    header == Some(format!("00-{TRACE}-{}-01", span.span_id).as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_join_the_apps_trace_across_a_sigkill_and_restart() {
    let otlp = OtlpReceiver::start().await;
    let receiver = Receiver::start(behavior(|_, n| match n {
        0 => Reply::status(500),
        _ => Reply::status(200),
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    // The retry waits long enough for the kill to come between the two
    // attempts; the first attempt's span is exported within half a second.
    let yaml = traced(
        &receiver.url(),
        "retry: { schedule: [3s], jitter: 0 }\nstatus: { min_delay: { 5xx: 30ms } }",
        &otlp,
    );
    let mut courier = Courier::start(tmp.path(), &yaml).await;
    let tp = traceparent();
    post_event(
        &courier,
        "ev-1",
        &[("traceparent", &tp), ("tracestate", "app=1")],
    )
    .await;

    // The first attempt's span has reached the receiver: only then the kill
    // (spans still in the exporter's queue at a SIGKILL are lost).
    let first = otlp
        .wait_for(PROMPT, |s| !attempt_spans(s).is_empty())
        .await;
    let Some(_) = first else {
        fail!(courier, "no attempt span in {PROMPT:?}: {:?}", otlp.spans());
    };
    check_eq!(
        courier,
        receiver.received().len(),
        1,
        "one attempt before the kill"
    );
    courier.kill();
    courier.restart().await;

    let spans = otlp
        .wait_for(PROMPT, |s| {
            attempt_spans(s).len() >= 2 && !accept_spans(s).is_empty()
        })
        .await
        .unwrap_or_else(|| fail!(courier, "attempt spans did not reach 2: {:?}", otlp.spans()));
    let accepts = accept_spans(&spans);
    check_eq!(courier, accepts.len(), 1, "{accepts:?}");
    let accept = accepts[0];
    check_eq!(
        courier,
        accept.trace_id,
        TRACE,
        "the accept span is in the app's trace"
    );
    check_eq!(
        courier,
        accept.parent_span_id,
        APP_SPAN,
        "its parent is the app's span"
    );
    check_eq!(
        courier,
        accept.attr_str("courier.destination"),
        Some("orders")
    );
    check_eq!(courier, accept.attr_str("courier.event_id"), Some("ev-1"));
    check_eq!(
        courier,
        accept.attr_int("http.response.status_code"),
        Some(202)
    );
    check_eq!(courier, accept.name, "POST /orders");

    let attempts = attempt_spans(&spans);
    check_eq!(courier, attempts.len(), 2, "{attempts:?}");
    let received = receiver.received();
    check_eq!(courier, received.len(), 2);
    for (i, (span, req)) in attempts.iter().zip(&received).enumerate() {
        let n = i as i64 + 1;
        check_eq!(
            courier,
            span.trace_id,
            TRACE,
            "attempt {n} is in the app's trace"
        );
        check_eq!(
            courier,
            span.parent_span_id,
            accept.span_id,
            "attempt {n} is a child of the accept span, after the restart too"
        );
        check_eq!(courier, span.attr_int("courier.attempt"), Some(n));
        check_eq!(courier, i64::from(req.attempt()), n);
        check_eq!(
            courier,
            span.attr_str("courier.destination"),
            Some("orders")
        );
        check_eq!(courier, span.attr_str("courier.event_id"), Some("ev-1"));
        check_eq!(courier, span.attr_str("http.request.method"), Some("POST"));
        check_eq!(courier, span.attr_str("server.address"), Some("127.0.0.1"));
        check!(
            courier,
            names_span(req.header("traceparent"), span),
            "attempt {n}: the endpoint's traceparent {:?} names its span {}",
            req.header("traceparent"),
            span.span_id
        );
        check_eq!(
            courier,
            req.header("tracestate"),
            Some("app=1"),
            "tracestate is kept"
        );
    }
    check_eq!(
        courier,
        attempts[0].attr_int("http.response.status_code"),
        Some(500)
    );
    check_eq!(
        courier,
        attempts[0].attr_str("courier.outcome"),
        Some("Failed")
    );
    check_eq!(courier, attempts[0].attr_str("error.type"), Some("500"));
    check_eq!(
        courier,
        attempts[0].status,
        2,
        "a failed attempt is an error span"
    );
    check_eq!(
        courier,
        attempts[1].attr_int("http.response.status_code"),
        Some(200)
    );
    check_eq!(
        courier,
        attempts[1].attr_str("courier.outcome"),
        Some("Delivered")
    );
    check_eq!(courier, attempts[1].attr("error.type"), None);
    let body_or_secret = spans.iter().flat_map(|s| s.attributes.values()).any(|v| {
        v.as_str()
            .is_some_and(|v| v.contains("\"n\"") || v.contains("app=1"))
    });
    check!(
        courier,
        !body_or_secret,
        "no body or header value in attributes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_the_apps_traceparent_is_forwarded_unchanged_and_nothing_is_exported() {
    let otlp = OtlpReceiver::start().await;
    let receiver = Receiver::ok().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = support::config("orders", &receiver.url(), "");
    // The standard variables point at the receiver: courier must not take
    // them as a reason to export when `tracing` is not configured.
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint()),
        ("OTEL_TRACES_EXPORTER", "otlp".to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let courier = Courier::start_with_env(support::courier_bin(), tmp.path(), &yaml, &env).await;
    let tp = traceparent();
    post_event(
        &courier,
        "ev-off",
        &[("traceparent", &tp), ("tracestate", "app=1")],
    )
    .await;
    let deadline = std::time::Instant::now() + PROMPT;
    while receiver.received().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let received = receiver.received();
    check_eq!(courier, received.len(), 1);
    check_eq!(
        courier,
        received[0].header("traceparent"),
        Some(tp.as_str())
    );
    check_eq!(courier, received[0].header("tracestate"), Some("app=1"));
    // Three times the export interval courier would use.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    check!(
        courier,
        otlp.spans().is_empty(),
        "exported: {:?}",
        otlp.spans()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_attempt_links_each_events_context() {
    let otlp = OtlpReceiver::start().await;
    let receiver = Receiver::ok().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = traced(&receiver.url(), "batch: { max_events: 10 }", &otlp);
    let courier = Courier::start(tmp.path(), &yaml).await;
    let pause = format!("{}/v1/destinations/orders/pause", courier.admin_url());
    check_eq!(
        courier,
        support::admin_post(&pause, "", &[]).await.status,
        200
    );
    // Three events, each from its own span of the app's trace.
    let app_spans = ["00000000000000a1", "00000000000000a2", "00000000000000a3"];
    for (i, span) in app_spans.iter().enumerate() {
        let tp = format!("00-{TRACE}-{span}-01");
        post_event(&courier, &format!("b-{i}"), &[("traceparent", &tp)]).await;
    }
    // Every event indexed, so that they go as one batch.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let resume = format!("{}/v1/destinations/orders/resume", courier.admin_url());
    check_eq!(
        courier,
        support::admin_post(&resume, "", &[]).await.status,
        200
    );
    let spans = otlp
        .wait_for(PROMPT, |s| {
            !attempt_spans(s).is_empty() && accept_spans(s).len() == 3
        })
        .await
        .unwrap_or_else(|| fail!(courier, "no batch span: {:?}", otlp.spans()));
    let received = receiver.received();
    check_eq!(courier, received.len(), 1, "one batch");
    let attempts = attempt_spans(&spans);
    check_eq!(courier, attempts.len(), 1, "{attempts:?}");
    let batch = attempts[0];
    check_eq!(courier, batch.attr_int("courier.batch_size"), Some(3));
    let batch_id = received[0].webhook_id();
    check_eq!(
        courier,
        batch.attr_str("courier.batch_id"),
        Some(batch_id.as_str())
    );
    check!(
        courier,
        names_or_other_trace(received[0].header("traceparent"), batch),
        "the endpoint's traceparent {:?} names the batch span {}",
        received[0].header("traceparent"),
        batch.span_id
    );
    // One link per event, to its accept span, which is the child of the
    // app's span that sent it.
    check_eq!(courier, batch.links.len(), 3, "{:?}", batch.links);
    for (i, app_span) in app_spans.iter().enumerate() {
        let id = format!("b-{i}");
        let accept = spans
            .iter()
            .find(|s| s.kind == Span::SERVER && s.attr_str("courier.event_id") == Some(&id))
            .unwrap_or_else(|| fail!(courier, "no accept span for {id}"));
        check_eq!(courier, accept.parent_span_id, *app_span);
        let linked = batch.links.iter().any(|(trace, span, attrs)| {
            trace == TRACE
                && *span == accept.span_id
                && attrs.get("courier.event_id").and_then(|v| v.as_str()) == Some(id.as_str())
        });
        check!(
            courier,
            linked,
            "no link to {id}'s accept span: {:?}",
            batch.links
        );
    }
}

/// A batch span is the root of its own trace: the endpoint's
/// `traceparent` names it in that trace.
fn names_or_other_trace(header: Option<&str>, span: &Span) -> bool {
    header == Some(format!("00-{}-{}-01", span.trace_id, span.span_id).as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_attempts_are_children_of_the_accept_span() {
    let otlp = OtlpReceiver::start().await;
    let receiver = Receiver::start(behavior(|_, n| match n {
        0 => Reply::status(503),
        _ => Reply::status(200),
    }))
    .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = traced(
        &receiver.url(),
        "mode: passthrough\npassthrough_deadline: 5s\nretry: { schedule: [50ms], jitter: 0 }\nstatus: { min_delay: { 5xx: 0s } }",
        &otlp,
    );
    let courier = Courier::start(tmp.path(), &yaml).await;
    let tp = traceparent();
    let resp = post(
        &courier.url("orders"),
        "{}",
        &[("idempotency-key", "p-1"), ("traceparent", &tp)],
    )
    .await;
    check_eq!(
        courier,
        resp.status,
        200,
        "the endpoint's answer: {}",
        resp.text()
    );
    let spans = otlp
        .wait_for(PROMPT, |s| {
            attempt_spans(s).len() >= 2 && !accept_spans(s).is_empty()
        })
        .await
        .unwrap_or_else(|| fail!(courier, "spans: {:?}", otlp.spans()));
    let accept = accept_spans(&spans)[0];
    check_eq!(courier, accept.trace_id, TRACE);
    check_eq!(courier, accept.parent_span_id, APP_SPAN);
    check_eq!(
        courier,
        accept.attr_int("http.response.status_code"),
        Some(200)
    );
    let attempts = attempt_spans(&spans);
    check_eq!(courier, attempts.len(), 2, "{attempts:?}");
    let received = receiver.received();
    check_eq!(courier, received.len(), 2);
    for (i, (span, req)) in attempts.iter().zip(&received).enumerate() {
        check_eq!(courier, span.trace_id, TRACE);
        check_eq!(courier, span.parent_span_id, accept.span_id);
        check_eq!(
            courier,
            span.attr_int("courier.attempt"),
            Some(i as i64 + 1)
        );
        check!(
            courier,
            names_span(req.header("traceparent"), span),
            "passthrough attempt {}: {:?}",
            i + 1,
            req.header("traceparent")
        );
    }
    check_eq!(
        courier,
        attempts[0].attr_str("courier.outcome"),
        Some("Busy")
    );
}

/// A receiver that answers 500 until `open` is set, then 200.
fn refusing_until(
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> support::receiver::Behavior {
    behavior(move |_, _| {
        if open.load(std::sync::atomic::Ordering::SeqCst) {
            Reply::status(200)
        } else {
            Reply::status(500)
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopting_courier_continues_the_trace_of_a_handed_off_event() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use support::stores::{Moto, s3_env};
    let moto = Moto::start("courier").await;
    let otlp = OtlpReceiver::start().await;
    let open = Arc::new(AtomicBool::new(false));
    let receiver = Receiver::start(refusing_until(open.clone())).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\n\
         admin_listen: 127.0.0.1:0\n\
         log: {{ level: debug }}\n\
         shutdown_grace: 1s\n\
         journal: {{ dir: ./journal }}\n\
         handoff: {{ url: s3://courier/handoff, poll: 200ms }}\n\
         tracing: {{ otlp_endpoint: {} }}\n\
         destinations:\n  \
           orders:\n    \
             url: {}\n    \
             retry: {{ schedule: [1s] }}\n    \
             status: {{ min_delay: {{ 500: 1s }} }}\n    \
             probation: {{ after_failures: 0 }}\n",
        otlp.endpoint(),
        receiver.url()
    );
    let env = s3_env(&moto.endpoint());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let mut a = Courier::start_with_env(support::courier_bin(), dir_a.path(), &yaml, &env).await;
    let tp = traceparent();
    post_event(&a, "h-1", &[("traceparent", &tp)]).await;
    let deadline = std::time::Instant::now() + PROMPT;
    while receiver.received().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.terminate_handing_off().await;
    // A's spans were flushed at its SIGTERM.
    let from_a = otlp.spans();
    check_eq!(a, accept_spans(&from_a).len(), 1, "{from_a:?}");
    check!(a, !attempt_spans(&from_a).is_empty(), "{from_a:?}");
    let b = Courier::start_with_env(support::courier_bin(), dir_b.path(), &yaml, &env).await;
    open.store(true, Ordering::SeqCst);
    let delivered = |r: &[support::Received]| {
        r.iter()
            .any(|r| r.header("webhook-id") == Some("h-1") && r.attempt() >= 2)
    };
    let deadline = std::time::Instant::now() + PROMPT;
    while !delivered(&receiver.received()) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let received = receiver.received();
    check!(
        b,
        delivered(&received),
        "B delivered h-1: {} requests",
        received.len()
    );
    let last = received.last().expect("a request");
    let spans = otlp
        .wait_for(PROMPT, |s| {
            attempt_spans(s)
                .iter()
                .any(|a| a.attr_int("courier.attempt") == Some(i64::from(last.attempt())))
        })
        .await
        .unwrap_or_else(|| fail!(b, "no span of B's attempt: {:?}", otlp.spans()));
    let accept = accept_spans(&spans)[0];
    check_eq!(b, accept.parent_span_id, APP_SPAN);
    let attempts = attempt_spans(&spans);
    check_eq!(
        b,
        attempts.len(),
        received.len(),
        "a span per attempt, A's and B's"
    );
    for span in &attempts {
        check_eq!(b, span.trace_id, TRACE, "{span:?}");
        check_eq!(
            b,
            span.parent_span_id,
            accept.span_id,
            "the adopter's attempt is a child of A's accept span"
        );
    }
    let adopted = attempts.last().expect("B's attempt");
    check_eq!(b, adopted.attr_str("courier.outcome"), Some("Delivered"));
    check!(
        b,
        names_span(last.header("traceparent"), adopted),
        "B's request names B's attempt span: {:?}",
        last.header("traceparent")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_flushes_the_spans_still_queued() {
    let otlp = OtlpReceiver::start().await;
    let receiver = Receiver::ok().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut courier = Courier::start(tmp.path(), &traced(&receiver.url(), "", &otlp)).await;
    for i in 0..5 {
        post_event(&courier, &format!("t-{i}"), &[]).await;
    }
    let deadline = std::time::Instant::now() + PROMPT;
    while receiver.received().len() < 5 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // At once: well within the half second spans wait for their batch.
    courier.terminate();
    let status = courier.wait_exit(Duration::from_secs(30)).await;
    check!(courier, status.success(), "{status:?}");
    let spans = otlp.spans();
    check_eq!(courier, accept_spans(&spans).len(), 5, "{spans:?}");
    check_eq!(courier, attempt_spans(&spans).len(), 5, "{spans:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_is_logged_once_and_delivery_goes_on() {
    let (_socket, port) = support::refusing_port();
    let receiver = Receiver::ok().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "{}tracing: {{ otlp_endpoint: http://127.0.0.1:{port} }}\n",
        support::config("orders", &receiver.url(), "")
    );
    let courier = Courier::start(tmp.path(), &yaml).await;
    const WARNING: &str = "tracing: cannot export spans";
    for round in 0..3 {
        for i in 0..3 {
            post_event(&courier, &format!("u-{round}-{i}"), &[]).await;
        }
        // Each round's spans go in an export of their own, and fail.
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    check_eq!(
        courier,
        receiver.received().len(),
        9,
        "every event delivered"
    );
    let failures =
        support::metric(&courier.admin_url(), "courier_trace_export_failures_total").await;
    check!(
        courier,
        failures.is_some_and(|f| f >= 2.0),
        "failed exports: {failures:?}"
    );
    let logged = courier.logs().matches(WARNING).count();
    check_eq!(
        courier,
        logged,
        1,
        "one warning for the streak of failed exports"
    );
}
