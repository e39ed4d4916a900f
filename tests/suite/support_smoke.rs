//! Proves the test support works on its own: the receiver, the HTTP client
//! helpers, the metrics reader and the load generator, against each other.

use std::time::{Duration, Instant};

use bytes::Bytes;
use support::client::{find_metric, sum_metric, try_post};
use support::courier::{find_listening, strip_ansi};
use support::load::{self, LoadSpec};
use support::{Receiver, Reply, behavior, json, json_body, metric, metric_sum, post};

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_records_requests_and_answers_as_told() {
    let rx = Receiver::start(behavior(|req, n| {
        Reply::status(201)
            .header("x-index", &n.to_string())
            .json(&serde_json::json!({ "path": req.path_and_query, "n": n }))
    }))
    .await;
    assert!(rx.url().starts_with("http://127.0.0.1:"));
    assert_eq!(rx.url(), format!("http://{}", rx.addr()));

    let url = format!("{}/hook/a?x=1", rx.url());
    let resp = post(
        &url,
        r#"{"a":1}"#,
        &[("content-type", "application/json"), ("x-app", "shop")],
    )
    .await;
    assert_eq!(resp.status, 201);
    assert_eq!(resp.header("x-index"), Some("0"));
    assert_eq!(
        json(&resp),
        serde_json::json!({ "path": "/hook/a?x=1", "n": 0 })
    );
    let resp = post(&rx.url(), "second", &[]).await;
    assert_eq!(resp.header("x-index"), Some("1"));
    assert_eq!(json(&resp)["path"], "/");

    let got = rx.wait_for(2, SECOND).await;
    assert_eq!(got.len(), 2);
    assert_eq!(rx.count(), 2);
    assert_eq!(got[0].method, http::Method::POST);
    assert_eq!(got[0].path_and_query, "/hook/a?x=1");
    assert_eq!(got[0].header("x-app"), Some("shop"));
    assert_eq!(got[0].header("content-type"), Some("application/json"));
    assert_eq!(got[0].body, Bytes::from_static(br#"{"a":1}"#));
    assert_eq!(got[0].json()["a"], 1);
    assert_eq!(got[1].text(), "second");
    assert!(got[0].at <= got[1].at);
    assert_eq!(rx.last_at(), Some(got[1].at));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_answers_in_order_and_repeats_the_last_reply() {
    let rx = Receiver::sequence(vec![
        Reply::status(503).header("retry-after", "1"),
        Reply::status(500).body("boom"),
        Reply::status(200),
    ])
    .await;
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(post(&rx.url(), "e", &[]).await);
    }
    let codes: Vec<u16> = statuses.iter().map(|r| r.status).collect();
    assert_eq!(codes, [503, 500, 200, 200, 200]);
    assert_eq!(statuses[0].header("retry-after"), Some("1"));
    assert_eq!(statuses[1].text(), "boom");
    assert_eq!(rx.wait_for(5, SECOND).await.len(), 5);
    rx.assert_quiet(5, Duration::from_millis(50)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_answers_late_and_hang_never_answers() {
    let rx = Receiver::sequence(vec![
        Reply::status(200).delay(Duration::from_millis(200)),
        Reply::hang(),
    ])
    .await;
    let started = Instant::now();
    assert_eq!(post(&rx.url(), "slow", &[]).await.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(200));

    let hung = tokio::time::timeout(Duration::from_millis(300), post(&rx.url(), "hang", &[])).await;
    assert!(hung.is_err(), "a hanging reply must not be answered");
    // The hanging request was still received.
    assert_eq!(rx.wait_for(2, SECOND).await[1].text(), "hang");

    // stop() closes the held connection and returns promptly.
    tokio::time::timeout(2 * SECOND, rx.stop())
        .await
        .expect("stop() returns while a request hangs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_receiver_refuses_connections_and_can_come_back_on_its_port() {
    let rx = Receiver::ok().await;
    let addr = rx.addr();
    assert_eq!(post(&rx.url(), "1", &[]).await.status, 200);
    rx.stop().await;

    let refused = tokio::net::TcpStream::connect(addr).await;
    assert_eq!(
        refused.expect_err("port must be closed after stop").kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    assert!(try_post(&rx.url(), "2", &[]).await.is_err());
    assert_eq!(rx.count(), 1, "a stopped receiver records nothing");

    let back = Receiver::start_on(addr, behavior(|_, _| Reply::status(204))).await;
    assert_eq!(back.addr(), addr);
    assert_eq!(post(&back.url(), "3", &[]).await.status, 204);
    assert_eq!(back.wait_for(1, SECOND).await[0].text(), "3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "but only 1 arrived")]
async fn wait_for_panics_with_the_number_that_arrived() {
    let rx = Receiver::ok().await;
    post(&rx.url(), "only one", &[]).await;
    rx.wait_for(3, Duration::from_millis(100)).await;
}

fn spec(url: String, connections: usize, duration: Duration) -> LoadSpec {
    LoadSpec {
        url,
        connections,
        duration,
        body: json_body(1024, 0),
        headers: vec![("content-type".into(), "application/json".into())],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_generator_drives_the_receiver() {
    let rx = Receiver::start(behavior(|_, _| Reply::status(202))).await;
    let connections = 8;
    let report = load::run(spec(format!("{}/bench?x=1", rx.url()), connections, SECOND)).await;

    assert_eq!(report.errors, 0, "first error: {:?}", report.first_error);
    assert_eq!(report.non_2xx, 0);
    assert!(report.ok > 200, "only {} requests in 1 s", report.ok);
    assert_eq!(report.status_count(202), report.ok);
    assert!(
        report.elapsed >= SECOND && report.elapsed < 3 * SECOND,
        "{:?}",
        report.elapsed
    );
    assert_eq!(report.latencies_us.len() as u64, report.ok);
    assert!(report.answers.is_empty(), "`run` keeps no answers");
    assert!(
        report.latencies_us.windows(2).all(|w| w[0] <= w[1]),
        "latencies sorted"
    );
    let (p50, p99, max) = (
        report.percentile(50.0),
        report.percentile(99.0),
        report.percentile(100.0),
    );
    assert!(
        Duration::ZERO < p50 && p50 <= p99 && p99 <= max,
        "{p50:?} {p99:?} {max:?}"
    );
    assert_eq!(
        max,
        Duration::from_micros(u64::from(
            report.latencies_us[report.latencies_us.len() - 1]
        ))
    );
    let rate = report.rate();
    assert!((rate - report.ok as f64 / report.elapsed.as_secs_f64()).abs() < 1e-6);

    // Every counted answer was received; at most one request per connection
    // was in flight (received but abandoned) at the deadline.
    let got = rx.received();
    assert!(got.len() as u64 >= report.ok && got.len() as u64 <= report.ok + connections as u64);
    let body = json_body(1024, 0);
    assert_eq!(body.len(), 1024);
    for req in &got {
        assert_eq!(req.method, http::Method::POST);
        assert_eq!(req.path_and_query, "/bench?x=1");
        assert_eq!(req.header("content-type"), Some("application/json"));
        assert_eq!(req.header("host"), Some(rx.addr().to_string().as_str()));
        assert_eq!(req.body, body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_generator_keeps_the_body_of_each_2xx_answer_when_asked() {
    let rx = Receiver::start(behavior(|_, n| {
        Reply::status(if n % 2 == 0 { 200 } else { 500 }).body(n.to_string())
    }))
    .await;
    rx.set_recording(false);
    let report = load::run_keeping_answers(spec(rx.url(), 4, Duration::from_millis(300))).await;
    assert!(report.ok > 20 && report.non_2xx > 20, "{report:?}");
    assert_eq!(report.answers.len() as u64, report.ok);
    let numbers: std::collections::HashSet<usize> = report
        .answers
        .iter()
        .map(|b| String::from_utf8_lossy(b).parse().expect("a number"))
        .collect();
    assert_eq!(numbers.len(), report.answers.len(), "each answer once");
    assert!(numbers.iter().all(|n| n % 2 == 0), "only 2xx answers kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_generator_counts_non_2xx_and_recording_can_be_turned_off() {
    let rx = Receiver::start(behavior(|_, n| {
        Reply::status(if n % 2 == 0 { 200 } else { 500 })
    }))
    .await;
    rx.set_recording(false);
    let connections = 4;
    let report = load::run(spec(rx.url(), connections, Duration::from_millis(500))).await;
    assert_eq!(report.errors, 0, "first error: {:?}", report.first_error);
    assert!(report.ok > 50 && report.non_2xx > 50, "{report:?}");
    assert_eq!(report.status_count(500), report.non_2xx);
    assert!(report.ok.abs_diff(report.non_2xx) <= connections as u64);
    assert_eq!(report.latencies_us.len() as u64, report.ok + report.non_2xx);
    assert!(rx.received().is_empty(), "recording is off");
    assert!(rx.count() as u64 >= report.ok + report.non_2xx);
    assert!(rx.last_at().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_n_sends_exactly_n_requests() {
    let rx = Receiver::ok().await;
    let report = load::run_n(spec(rx.url(), 16, 30 * SECOND), 500).await;
    assert_eq!(report.ok, 500, "{:?}", report.first_error);
    assert_eq!(report.errors + report.non_2xx, 0);
    assert!(report.elapsed < 30 * SECOND);
    rx.assert_quiet(500, Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_generator_reports_errors_when_nothing_listens() {
    let rx = Receiver::ok().await;
    let url = rx.url();
    rx.stop().await;
    let report = load::run(spec(url, 2, Duration::from_millis(300))).await;
    assert_eq!(report.ok + report.non_2xx, 0);
    assert!(report.errors > 0);
    assert!(
        report
            .first_error
            .as_deref()
            .is_some_and(|e| e.contains("connect")),
        "{report:?}"
    );
    assert_eq!(report.rate(), 0.0);
    assert_eq!(report.percentile(99.0), Duration::ZERO);
}

const EXPOSITION: &str = r#"# HELP courier_events_delivered_total Delivered events.
# TYPE courier_events_delivered_total counter
courier_events_delivered_total{destination="orders"} 42
courier_events_delivered_total{destination="audit"} 7
# TYPE courier_delivery_attempts_total counter
courier_delivery_attempts_total{outcome="success",destination="orders"} 40
courier_delivery_attempts_total{destination="orders",outcome="retry"} 5
courier_delivery_attempts_total{destination="audit",outcome="success"} 7
courier_events_pending 3
courier_delivery_duration_seconds_bucket{destination="orders",le="+Inf"} 45
weird_total{destination="a,b}c",note="say \"hi\""} 1.5e3 1700000000000
"#;

#[test]
fn metric_parsing_matches_name_and_label_set() {
    let m = |s| find_metric(EXPOSITION, s);
    assert_eq!(
        m(r#"courier_events_delivered_total{destination="orders"}"#),
        Some(42.0)
    );
    assert_eq!(
        m(r#"courier_events_delivered_total{destination="audit"}"#),
        Some(7.0)
    );
    assert_eq!(
        m(r#"courier_events_delivered_total{destination="nope"}"#),
        None
    );
    assert_eq!(
        m("courier_events_delivered_total"),
        None,
        "label sets must be equal"
    );
    assert_eq!(
        m(r#"courier_delivery_attempts_total{destination="orders",outcome="success"}"#),
        Some(40.0)
    );
    assert_eq!(
        m(r#"courier_delivery_attempts_total{outcome="retry", destination="orders"}"#),
        Some(5.0)
    );
    assert_eq!(m("courier_events_pending"), Some(3.0));
    assert_eq!(m("courier_events_pending{}"), Some(3.0));
    assert_eq!(
        m(r#"courier_delivery_duration_seconds_bucket{le="+Inf",destination="orders"}"#),
        Some(45.0)
    );
    assert_eq!(
        m(r#"weird_total{note="say \"hi\"",destination="a,b}c"}"#),
        Some(1500.0)
    );
    assert_eq!(
        sum_metric(
            EXPOSITION,
            r#"courier_delivery_attempts_total{destination="orders"}"#
        ),
        45.0
    );
    assert_eq!(
        sum_metric(EXPOSITION, "courier_delivery_attempts_total"),
        52.0
    );
    assert_eq!(sum_metric(EXPOSITION, "absent_total"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_reads_a_live_metrics_endpoint() {
    let rx = Receiver::start(behavior(|req, _| {
        if req.path_and_query == "/metrics" {
            Reply::status(200)
                .header("content-type", "text/plain; version=0.0.4")
                .body(EXPOSITION)
        } else {
            Reply::status(404)
        }
    }))
    .await;
    assert_eq!(
        metric(
            &rx.url(),
            r#"courier_events_delivered_total{destination="orders"}"#
        )
        .await,
        Some(42.0)
    );
    assert_eq!(
        metric(&rx.url(), "courier_events_accepted_total").await,
        None
    );
    assert_eq!(
        metric_sum(
            &rx.url(),
            "courier_delivery_attempts_total{outcome=\"success\"}"
        )
        .await,
        47.0
    );
    assert_eq!(rx.received()[0].method, http::Method::GET);
}

#[test]
fn listening_line_is_found_in_text_and_json_logs() {
    let text = "\u{1b}[2m2026-01-01T00:00:00Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m \u{1b}[2mcourier\u{1b}[0m\u{1b}[2m:\u{1b}[0m courier listening \u{1b}[3mingress\u{1b}[0m\u{1b}[2m=\u{1b}[0m127.0.0.1:4100 \u{1b}[3madmin\u{1b}[0m\u{1b}[2m=\u{1b}[0m127.0.0.1:4200\n";
    let plain = strip_ansi(text);
    assert!(!plain.contains('\u{1b}'));
    assert!(plain.contains("courier listening ingress=127.0.0.1:4100 admin=127.0.0.1:4200"));
    let (ingress, admin) = find_listening(&plain).expect("text format");
    assert_eq!((ingress.port(), admin.port()), (4100, 4200));

    let json = r#"{"timestamp":"t","level":"INFO","fields":{"message":"courier listening","ingress":"127.0.0.1:5100","admin":"127.0.0.1:5200"}}"#;
    let (ingress, admin) = find_listening(json).expect("json format");
    assert_eq!((ingress.port(), admin.port()), (5100, 5200));

    let other = "INFO courier: config loaded admin_listen=127.0.0.1:9 ingress=127.0.0.1:1\n";
    assert_eq!(find_listening(other), None);
}

#[test]
fn json_body_has_the_exact_size() {
    for (size, seq) in [(64, 0), (1024, 7), (4096, 123_456)] {
        let body = json_body(size, seq);
        assert_eq!(body.len(), size);
        let v: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
        assert_eq!(v["seq"], seq);
    }
}

/// The benchmark's backlog bodies: exact size, valid JSON, one per seq,
/// and shaped as a real webhook is (neither all padding nor noise: LZ4
/// keeps between a third and four fifths of one of 1 KiB or more).
#[test]
fn webhook_body_has_the_exact_size_and_a_real_ones_redundancy() {
    let mut seen = std::collections::HashSet::new();
    for (size, seq) in [(512, 0), (1024, 7), (1024, 8), (4096, 123_456)] {
        let body = support::webhook_body(size, seq);
        assert_eq!(body.len(), size);
        let v: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
        assert_eq!(v["request"]["idempotency_key"], seq.to_string());
        assert!(seen.insert(body.clone()));
        let packed = lz4_flex::block::compress(&body).len();
        // A small one is mostly its random ids, as a real one is.
        let most = if size < 1024 { size } else { size * 4 / 5 };
        assert!(
            packed * 3 > size && packed < most,
            "{packed} of {size}: {}",
            String::from_utf8_lossy(&body)
        );
    }
}
