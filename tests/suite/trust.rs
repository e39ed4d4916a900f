//! Trust at the edges (docs/http-api.md): what a bad payload, a crafted
//! path, a browser or a careless neighbour can and cannot make courier do.
//! Each test drives a real courier against a loopback receiver.

use serde_json::json;
use std::time::{Duration, Instant};
use support::{
    Courier, Receiver, Reply, behavior, check, check_eq, config, get, post, requests,
    wait_dead_letters,
};

const PROMPT: Duration = Duration::from_secs(5);

/// Ten malformed events in a row are dead-lettered at once (400 says the
/// event is bad), and the endpoint is not put on probation for them: the
/// next valid event goes out at once. Red when a 400 counts toward the
/// threshold (a 5-minute probation would hold it).
#[tokio::test]
async fn ten_bad_requests_in_a_row_do_not_delay_the_next_valid_event() {
    let rx = Receiver::start(behavior(|r, _| {
        Reply::status(if r.text().contains("bad") { 400 } else { 200 })
    }))
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = config(
        "orders",
        &rx.url(),
        "concurrency: 1
         retry: { schedule: [20ms], jitter: 0 }
         probation: { after_failures: 10 }",
    );
    let c = Courier::start(dir.path(), &yaml).await;
    for i in 0..10 {
        let resp = post(&c.url("orders"), json!({ "bad": i }).to_string(), &[]).await;
        check_eq!(c, resp.status, 202, "{}", resp.text());
    }
    let (_, records) = wait_dead_letters(&c, "orders", 10, PROMPT).await;
    check!(
        c,
        records
            .iter()
            .all(|r| r["deadLetterReason"] == "NonRetriableStatus"),
        "{records:?}"
    );
    let sent = Instant::now();
    let resp = post(&c.url("orders"), json!({ "good": 1 }).to_string(), &[]).await;
    check_eq!(c, resp.status, 202, "{}", resp.text());
    let got = requests(&c, &rx, 11, PROMPT).await;
    check!(c, got[10].text().contains("good"), "{}", got[10].text());
    check!(
        c,
        sent.elapsed() < Duration::from_secs(2),
        "the valid event took {:?}",
        sent.elapsed()
    );
    let d = get(&format!("{}/v1/destinations", c.admin_url()))
        .await
        .json();
    check_eq!(c, d["destinations"][0]["state"], "healthy", "{d}");
}

/// `/rest` with a dot segment (plain, percent-encoded, or behind an encoded
/// slash) is refused with a JSON 400 and never forwarded; an ordinary path
/// with dots in its names still is. Red when dot segments are forwarded.
#[tokio::test]
async fn a_rest_with_dot_segments_never_reaches_the_endpoint() {
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(
        dir.path(),
        &config("hdr", &format!("{}/hooks", rx.url()), ""),
    )
    .await;
    for rest in ["/../../admin", "/a/%2e%2E/b", "/x/.", "/a%2f..%2fadmin"] {
        let resp = post(&c.url(&format!("hdr{rest}")), "{}", &[]).await;
        check_eq!(c, resp.status, 400, "{rest}: {}", resp.text());
        check_eq!(c, resp.json()["reason"], "dot_segment", "{rest}");
    }
    let resp = post(&c.url("hdr/v1.2/.well-known/x..y"), "{}", &[]).await;
    check_eq!(c, resp.status, 202, "{}", resp.text());
    let got = requests(&c, &rx, 1, PROMPT).await;
    check_eq!(c, got[0].path_and_query, "/hooks/v1.2/.well-known/x..y");
    tokio::time::sleep(Duration::from_millis(300)).await;
    check_eq!(c, rx.count(), 1, "only the ordinary path was forwarded");
}

/// The app's `Authorization` and `Cookie` reach the endpoint but no
/// dead-letter file (the record names them as redacted), and every file
/// courier wrote is private: 0600 in 0700 folders. Red when the defaults
/// are not redacted, or when the umask or the segment mode is dropped.
#[tokio::test]
async fn credentials_stay_out_of_dead_letters_and_state_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let rx = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &config("orders", &rx.url(), "")).await;
    let headers = [
        ("authorization", "Bearer app-secret-123"),
        ("cookie", "session=cookie-secret-456"),
        ("x-tenant", "acme"),
    ];
    let resp = post(&c.url("orders"), "{\"n\":1}", &headers).await;
    check_eq!(c, resp.status, 202, "{}", resp.text());
    let got = requests(&c, &rx, 1, PROMPT).await;
    check_eq!(
        c,
        got[0].header("authorization"),
        Some("Bearer app-secret-123")
    );
    let (_, records) = wait_dead_letters(&c, "orders", 1, PROMPT).await;
    let redacted = &records[0]["redactedHeaders"];
    check!(
        c,
        redacted
            .as_array()
            .is_some_and(|r| r.contains(&json!("authorization")) && r.contains(&json!("cookie"))),
        "{}",
        records[0]
    );
    check_eq!(
        c,
        records[0]["headers"]["x-tenant"],
        "acme",
        "{}",
        records[0]
    );
    for file in support::files_under(&dir.path().join("dl")) {
        let text = std::fs::read_to_string(&file).expect("read");
        check!(
            c,
            !text.contains("app-secret-123") && !text.contains("cookie-secret-456"),
            "{} holds a credential",
            file.display()
        );
    }
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or(0)
    };
    let mut seen = 0;
    for root in ["journal", "dl"] {
        let root = dir.path().join(root);
        let mut folders = vec![root.clone()];
        for file in support::files_under(&root) {
            check_eq!(c, mode(&file), 0o600, "{}", file.display());
            folders.push(file.parent().expect("parent").to_path_buf());
            seen += 1;
        }
        for folder in folders {
            check_eq!(c, mode(&folder), 0o700, "{}", folder.display());
        }
    }
    let logs = support::files_under(&dir.path().join("journal"));
    check!(
        c,
        seen > 2 && logs.iter().any(|p| p.to_string_lossy().contains("intake-")),
        "no intake log among {logs:?}"
    );
}

/// What a web page can send to a loopback courier changes nothing: a
/// cross-site `POST` (foreign `Origin`, `text/plain`), a bodiless `POST`
/// without JSON, and any request under a re-bound name (DNS rebinding),
/// to the admin API and to ingress alike; a name in `allowed_hosts` passes.
#[tokio::test]
async fn a_browser_cannot_drive_the_admin_api_or_ingress() {
    use http::Method;
    use support::client::request;
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "allowed_hosts: [courier.test]\n{}",
        config("orders", &rx.url(), "")
    );
    let c = Courier::start(dir.path(), &yaml).await;
    let admin = c.admin_url();
    let pause = format!("{admin}/v1/destinations/orders/pause");
    let evil = ("origin", "http://evil.example");
    let rebind = ("host", "rebind.evil.example:9090");
    /// A request (method, url, headers) and the status and reason it gets.
    type Refused<'a> = (Method, String, &'a [(&'a str, &'a str)], u16, &'a str);
    let calls: [Refused; 7] = [
        (
            Method::POST,
            pause.clone(),
            &[evil, ("content-type", "text/plain")],
            403,
            "cross_origin",
        ),
        (
            Method::POST,
            pause.clone(),
            &[evil, ("content-type", "application/json")],
            403,
            "cross_origin",
        ),
        (
            Method::POST,
            pause.clone(),
            &[("content-type", "text/plain")],
            415,
            "not_json",
        ),
        (Method::POST, pause.clone(), &[], 415, "not_json"),
        (
            Method::POST,
            pause.clone(),
            &[rebind, ("content-type", "application/json")],
            403,
            "host_not_allowed",
        ),
        (
            Method::GET,
            format!("{admin}/v1/destinations"),
            &[rebind],
            403,
            "host_not_allowed",
        ),
        (
            Method::DELETE,
            format!("{admin}/v1/dead-letters?destination=orders"),
            &[evil],
            403,
            "cross_origin",
        ),
    ];
    for (method, url, headers, status, reason) in calls {
        let resp = request(method.clone(), &url, "", headers).await;
        check_eq!(
            c,
            resp.status,
            status,
            "{method} {url} {headers:?}: {}",
            resp.text()
        );
        check_eq!(
            c,
            resp.json()["reason"],
            reason,
            "{method} {url} {headers:?}"
        );
    }
    let own = request(
        Method::GET,
        &format!("{admin}/v1/destinations"),
        "",
        &[("host", "courier.test")],
    )
    .await;
    check_eq!(c, own.status, 200, "{}", own.text());
    check_eq!(
        c,
        own.json()["destinations"][0]["state"],
        "healthy",
        "a refused pause took effect"
    );

    for headers in [
        &[evil, ("content-type", "text/plain")][..],
        &[("host", "rebind.evil.example:8080")][..],
    ] {
        let resp = post(&c.url("orders"), "{\"from\":\"a page\"}", headers).await;
        check_eq!(c, resp.status, 403, "{headers:?}: {}", resp.text());
    }
    let resp = post(&c.url("orders"), "{\"from\":\"the app\"}", &[]).await;
    check_eq!(c, resp.status, 202, "{}", resp.text());
    let got = requests(&c, &rx, 1, PROMPT).await;
    check!(c, got[0].text().contains("the app"), "{}", got[0].text());
    tokio::time::sleep(Duration::from_millis(300)).await;
    check_eq!(c, rx.count(), 1, "a page's event was delivered");
}

/// Hostile config files are refused at once, by `check` and by `run`
/// (which reads the file the same way, and so does a reload): a flow list
/// nested 100,000 deep, 6 MB of keys, and a 50 MB comment, each within a
/// second, with the limit named. Red when the loader parses them first
/// (22 s, and over a minute, before the limits).
#[tokio::test]
async fn hostile_config_files_are_refused_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let deep = format!("a: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    let keys: String = (0..200_000).map(|i| format!("k{i:07}: v\n")).collect();
    let comment = format!("#{}\n", "x".repeat(50 << 20));
    for (name, text, says) in [
        ("deep.yaml", deep, "nest deeper than 32 levels"),
        ("keys.yaml", keys, "a config file is at most 1048576 bytes"),
        (
            "comment.yaml",
            comment,
            "a config file is at most 1048576 bytes",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        let path = path.to_string_lossy().to_string();
        for command in ["check", "run"] {
            let started = Instant::now();
            let out = support::run_cli(None, &[command, "-c", &path], &[]).await;
            let took = started.elapsed();
            assert_eq!(out.code, 1, "{command} {name}: {}", out.show());
            assert!(
                out.stderr.contains(says),
                "{command} {name}: {}",
                out.show()
            );
            assert!(
                took < Duration::from_secs(1),
                "{command} {name} took {took:?}"
            );
        }
    }
}
