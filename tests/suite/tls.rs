//! TLS to endpoints (docs/delivery.md "TLS to endpoints"): HTTPS receivers on
//! loopback with certificates from CAs made in the test. A private CA works
//! only through `tls.ca_file`; a receiver that demands a client certificate
//! takes courier's `client_cert`; expired or unknown certificates are
//! `TlsError` with rustls's reason in the log; and certificate files
//! replaced in place (as cert-manager and kubelet do) are used by the next
//! connection, without a restart or a reload.

use std::path::Path;
use std::time::{Duration, Instant};

use support::certs::{self, TestCa};
use support::{
    Courier, Receiver, Reply, behavior, check, check_eq, fail, post, read_dead_letters, requests,
    wait_dead_letters,
};

const PROMPT: Duration = Duration::from_secs(10);

/// One `custom` destination per `(name, url, tls)`, with short retries and
/// dead letters in `./dl`.
fn config(destinations: &[(&str, String, String)]) -> String {
    let mut yaml = "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nlog: { level: debug }\njournal: { dir: ./journal }\ndead_letter: { dir: ./dl }\ndestinations:\n".to_string();
    for (name, url, tls) in destinations {
        yaml.push_str(&format!(
            "  {name}:\n    url: {url}/{name}\n    retry: {{ schedule: [50ms], max_attempts: 2, jitter: 0 }}\n    probation: {{ after_failures: 0 }}\n"
        ));
        if !tls.is_empty() {
            yaml.push_str(&format!("    tls: {tls}\n"));
        }
    }
    yaml
}

fn tls_key(dir: &Path, ca: Option<&str>, client: Option<(&str, &str)>) -> String {
    let mut parts = Vec::new();
    if let Some(ca) = ca {
        parts.push(format!("ca_file: {}", dir.join(ca).display()));
    }
    if let Some((cert, key)) = client {
        parts.push(format!("client_cert: {}", dir.join(cert).display()));
        parts.push(format!("client_key: {}", dir.join(key).display()));
    }
    format!("{{ {} }}", parts.join(", "))
}

/// Posts one event to `name` and expects it accepted.
async fn accept(c: &Courier, name: &str) {
    let resp = post(&c.url(name), format!(r#"{{"to":"{name}"}}"#), &[]).await;
    check_eq!(c, resp.status, 202, "{name}: {}", resp.text());
}

/// Waits for `name`'s one dead letter and checks it was a TLS failure.
async fn dead_by_tls(c: &Courier, name: &str) {
    let (_, records) = wait_dead_letters(c, name, 1, PROMPT).await;
    check_eq!(c, records.len(), 1, "{name}");
    check_eq!(
        c,
        records[0]["lastDeliveryOutcome"],
        "TlsError",
        "{name}: {}",
        records[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_ca_works_through_ca_file_and_only_through_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("courier test CA");
    certs::write(tmp.path(), "ca.pem", &ca.pem);
    let rx = Receiver::start_tls(
        behavior(|_, _| Reply::status(200)),
        certs::server_config(&ca.server(false), None),
    )
    .await;
    let expired_rx = Receiver::start_tls(
        behavior(|_, _| Reply::status(200)),
        certs::server_config(&ca.server(true), None),
    )
    .await;
    let with_ca = tls_key(tmp.path(), Some("ca.pem"), None);
    let mut c = Courier::start(
        tmp.path(),
        &config(&[
            ("trusted", rx.url(), with_ca.clone()),
            ("untrusted", rx.url(), String::new()),
            ("expired", expired_rx.url(), with_ca),
        ]),
    )
    .await;
    for name in ["trusted", "untrusted", "expired"] {
        accept(&c, name).await;
    }
    dead_by_tls(&c, "untrusted").await;
    dead_by_tls(&c, "expired").await;
    // rustls's reason, at warn, where operators look.
    let logs = c.logs();
    let warned: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("TLS handshake failed"))
        .collect();
    for (name, reason) in [
        ("untrusted", "UnknownIssuer"),
        ("expired", "certificate expired"),
    ] {
        let hit = warned
            .iter()
            .any(|l| l.contains(&format!("destination={name}")) && l.contains(reason));
        check!(c, hit, "no warning with {reason} for {name}: {warned:?}");
    }
    let got = requests(&c, &rx, 1, PROMPT).await;
    check_eq!(c, got[0].path_and_query, "/trusted");
    check_eq!(c, got[0].version, http::Version::HTTP_2, "ALPN offered h2");
    check_eq!(
        c,
        expired_rx.count(),
        0,
        "an expired certificate got a request"
    );

    // Accepted while the endpoint is away, killed: delivered over TLS after.
    rx.stop().await;
    accept(&c, "trusted").await;
    c.kill();
    let rx = Receiver::start_tls(
        behavior(|_, _| Reply::status(200)),
        certs::server_config(&ca.server(false), None),
    )
    .await;
    // The new receiver has another port: point the config at it.
    std::fs::write(
        c.config_path(),
        config(&[(
            "trusted",
            rx.url(),
            tls_key(tmp.path(), Some("ca.pem"), None),
        )]),
    )
    .expect("config");
    c.restart().await;
    let got = requests(&c, &rx, 1, PROMPT).await;
    check_eq!(c, got[0].path_and_query, "/trusted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mtls_endpoint_takes_courier_only_with_its_client_certificate() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server_ca = TestCa::new("server CA");
    let client_ca = TestCa::new("client CA");
    let mine = client_ca.client("courier");
    certs::write(tmp.path(), "ca.pem", &server_ca.pem);
    certs::write(tmp.path(), "client.pem", &mine.cert);
    certs::write(tmp.path(), "client.key", &mine.key);
    let rx = Receiver::start_tls(
        behavior(|_, _| Reply::status(200)),
        certs::server_config(&server_ca.server(false), Some(&client_ca)),
    )
    .await;
    let c = Courier::start(
        tmp.path(),
        &config(&[
            (
                "anonymous",
                rx.url(),
                tls_key(tmp.path(), Some("ca.pem"), None),
            ),
            (
                "mutual",
                rx.url(),
                tls_key(
                    tmp.path(),
                    Some("ca.pem"),
                    Some(("client.pem", "client.key")),
                ),
            ),
        ]),
    )
    .await;
    accept(&c, "anonymous").await;
    accept(&c, "mutual").await;
    // Refused by the server after the TLS 1.3 handshake. The client sees
    // the server's alert, or only its close (a broken pipe) when that comes
    // first; the alert, when seen, is a TLS failure.
    wait_dead_letters(&c, "anonymous", 1, PROMPT).await;
    let logs = c.logs();
    let misread: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("destination=anonymous") && l.contains("received fatal alert"))
        .filter(|l| !l.contains("outcome=TlsError") && !l.contains("TLS handshake failed"))
        .collect();
    check!(
        c,
        misread.is_empty(),
        "a TLS alert not classified TlsError: {misread:?}"
    );
    let got = requests(&c, &rx, 1, PROMPT).await;
    check_eq!(c, got.len(), 1);
    check_eq!(c, got[0].path_and_query, "/mutual");
    let (_, none) = read_dead_letters(&c, &support::dl_dir(&c, "mutual"));
    check!(c, none.is_empty(), "mutual was dead-lettered: {none:?}");
}

/// The client certificate and the CA file are replaced in place while
/// courier runs: attempts that failed with the old files succeed with the
/// new ones, with no restart and no reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_files_replaced_in_place_are_used_by_the_next_connection() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server_ca = TestCa::new("server CA");
    let old_ca = TestCa::new("retired CA");
    let client_ca = TestCa::new("client CA");
    let stale_client = old_ca.client("courier");
    certs::write(tmp.path(), "server-ca.pem", &server_ca.pem);
    certs::write(tmp.path(), "stale-ca.pem", &old_ca.pem);
    certs::write(tmp.path(), "client.pem", &stale_client.cert);
    certs::write(tmp.path(), "client.key", &stale_client.key);
    let plain = Receiver::start_tls(
        behavior(|_, _| Reply::status(200)),
        certs::server_config(&server_ca.server(false), None),
    )
    .await;
    let mutual = Receiver::start_tls(
        behavior(|_, _| Reply::status(200)),
        certs::server_config(&server_ca.server(false), Some(&client_ca)),
    )
    .await;
    // Retries for a while, so that the new files arrive mid-way.
    let yaml = config(&[
        (
            "roots",
            plain.url(),
            tls_key(tmp.path(), Some("stale-ca.pem"), None),
        ),
        (
            "client",
            mutual.url(),
            tls_key(
                tmp.path(),
                Some("server-ca.pem"),
                Some(("client.pem", "client.key")),
            ),
        ),
    ])
    .replace("max_attempts: 2", "max_attempts: 30")
    .replace("schedule: [50ms]", "schedule: [200ms]");
    let c = Courier::start(tmp.path(), &yaml).await;
    accept(&c, "roots").await;
    accept(&c, "client").await;
    c.wait_for_log("outcome=TlsError", PROMPT).await;
    check_eq!(c, plain.count() + mutual.count(), 0);

    // As kubelet does: write the new file beside, rename over the old.
    let replace = |name: &str, text: &str| {
        let next = tmp.path().join(format!(".{name}.new"));
        std::fs::write(&next, text).expect("write");
        std::fs::rename(&next, tmp.path().join(name)).expect("rename");
    };
    replace("stale-ca.pem", &server_ca.pem);
    let fresh = client_ca.client("courier");
    replace("client.key", &fresh.key);
    replace("client.pem", &fresh.cert);
    let started = Instant::now();
    let got = requests(&c, &plain, 1, PROMPT).await;
    check_eq!(c, got[0].path_and_query, "/roots");
    let got = requests(&c, &mutual, 1, PROMPT).await;
    check_eq!(c, got[0].path_and_query, "/client");
    check!(
        c,
        started.elapsed() < Duration::from_secs(8),
        "took {:?}",
        started.elapsed()
    );
    check!(
        c,
        c.logged(
            |l| l.contains("TLS files changed: new connections use them"),
            PROMPT
        )
        .await,
        "the change was not logged"
    );
    for name in ["roots", "client"] {
        let (_, dead) = read_dead_letters(&c, &support::dl_dir(&c, name));
        if !dead.is_empty() {
            fail!(c, "{name} was dead-lettered: {dead:?}");
        }
    }
}

/// A reload that adds `tls.ca_file` gives the destination a pool that
/// trusts it, for the event already retrying; one naming a file that is
/// not PEM is refused whole and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_tls_files_and_refuses_bad_ones() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("courier test CA");
    certs::write(tmp.path(), "ca.pem", &ca.pem);
    certs::write(tmp.path(), "junk.pem", "not a certificate\n");
    let rx = Receiver::start_tls(
        behavior(|_, _| Reply::status(200)),
        certs::server_config(&ca.server(false), None),
    )
    .await;
    let yaml = |tls: String| {
        config(&[("orders", rx.url(), tls)])
            .replace("max_attempts: 2", "max_attempts: 30")
            .replace("schedule: [50ms]", "schedule: [200ms]")
    };
    let c = Courier::start(tmp.path(), &yaml(String::new())).await;
    accept(&c, "orders").await;
    c.wait_for_log("outcome=TlsError", PROMPT).await;

    // Replaced whole, as a ConfigMap is; courier watches the file.
    let replace = |text: String| {
        let next = c.config_path().with_extension("next");
        std::fs::write(&next, text).expect("write config");
        std::fs::rename(&next, c.config_path()).expect("rename config");
    };
    replace(yaml(tls_key(tmp.path(), Some("junk.pem"), None)));
    c.wait_for_log("junk.pem holds no PEM certificate", PROMPT)
        .await;
    let failures = support::metric(&c.admin_url(), "courier_config_reload_failures_total").await;
    check!(c, failures.is_some_and(|n| n >= 1.0), "{failures:?}");
    check_eq!(c, rx.count(), 0, "delivered without a trusted CA");

    replace(yaml(tls_key(tmp.path(), Some("ca.pem"), None)));
    let got = requests(&c, &rx, 1, PROMPT).await;
    check_eq!(c, got[0].path_and_query, "/orders");
}

/// `url: per_event` connects through its own pool (`deliver::pool`): each
/// named HTTPS endpoint over HTTP/2 by ALPN, the destination's `tls` files
/// trusted, and a certificate they do not vouch for a `TlsError`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_event_endpoints_get_https_over_http2_with_the_destinations_ca() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("courier test CA");
    let other = TestCa::new("another CA");
    certs::write(tmp.path(), "ca.pem", &ca.pem);
    let ok = || behavior(|_, _| Reply::status(200));
    let trusted = [
        Receiver::start_tls(ok(), certs::server_config(&ca.server(false), None)).await,
        Receiver::start_tls(ok(), certs::server_config(&ca.server(false), None)).await,
    ];
    let stranger =
        Receiver::start_tls(ok(), certs::server_config(&other.server(false), None)).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nlog: {{ level: debug }}\njournal: {{ dir: ./journal }}\ndead_letter: {{ dir: ./dl }}\ndestinations:\n  customers:\n    url: per_event\n    retry: {{ schedule: [50ms], max_attempts: 2, jitter: 0 }}\n    probation: {{ after_failures: 0 }}\n    endpoints: {{ allow_cidrs: [127.0.0.0/8] }}\n    tls: {}\n",
        tls_key(tmp.path(), Some("ca.pem"), None)
    );
    let c = Courier::start(tmp.path(), &yaml).await;
    let named = |rx: &Receiver, i: usize| format!("{}/customer/{i}", rx.url());
    for i in 0..6 {
        let url = named(&trusted[i % 2], i);
        let resp = post(
            &c.url("customers"),
            format!(r#"{{"n":{i}}}"#),
            &[("courier-endpoint", &url)],
        )
        .await;
        check_eq!(c, resp.status, 202, "{url}: {}", resp.text());
    }
    let url = named(&stranger, 9);
    let resp = post(&c.url("customers"), "{}", &[("courier-endpoint", &url)]).await;
    check_eq!(c, resp.status, 202, "{}", resp.text());
    for (k, rx) in trusted.iter().enumerate() {
        let got = requests(&c, rx, 3, PROMPT).await;
        let mut paths: Vec<String> = got.iter().map(|r| r.path_and_query.clone()).collect();
        paths.sort();
        let want: Vec<String> = (0..6)
            .filter(|i| i % 2 == k)
            .map(|i| format!("/customer/{i}"))
            .collect();
        check_eq!(c, paths, want, "receiver {k}");
        for r in &got {
            check_eq!(c, r.version, http::Version::HTTP_2, "ALPN offered h2");
        }
    }
    dead_by_tls(&c, "customers").await;
    check_eq!(
        c,
        stranger.count(),
        0,
        "a certificate the CA file does not vouch for got a request"
    );
}
