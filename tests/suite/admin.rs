//! The admin surface fit for a pod (docs/http-api.md): with `admin_token_env`, every
//! `/v1/*` call needs `Authorization: Bearer <token>`, reads included (401,
//! nothing revealed and no change otherwise), while the probes, the scrape
//! and reads of event history (docs/history.md: no body, no header) never do; a
//! non-loopback `admin_listen` without a token refuses to start.

use std::time::Duration;

use http::Method;
use support::client::request;
use support::{Courier, Receiver, check, check_eq, config, fail, get, post, run_cli};

const TOKEN: &str = "a-long-admin-token-0123456789";
const PROMPT: Duration = Duration::from_secs(5);

fn with_token(url: &str) -> String {
    config("orders", url, "").replacen(
        "admin_listen: 127.0.0.1:0\n",
        "admin_listen: 127.0.0.1:0\nadmin_token_env: TEST_ADMIN_TOKEN\n",
        1,
    )
}

async fn state(c: &Courier) -> String {
    let bearer = format!("Bearer {TOKEN}");
    let url = format!("{}/v1/destinations", c.admin_url());
    let resp = request(Method::GET, &url, "", &[("authorization", &bearer)]).await;
    check_eq!(c, resp.status, 200, "GET /v1/destinations: {}", resp.text());
    resp.json()["destinations"][0]["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn every_v1_call_needs_the_bearer_token_and_the_probes_do_not() {
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start_with_env(
        support::courier_bin(),
        dir.path(),
        &with_token(&rx.url()),
        &[("TEST_ADMIN_TOKEN", TOKEN)],
    )
    .await;
    let admin = c.admin_url();

    for path in ["/healthz", "/readyz", "/metrics"] {
        let resp = get(&format!("{admin}{path}")).await;
        check_eq!(
            c,
            resp.status,
            200,
            "GET {path} without a token: {}",
            resp.text()
        );
    }
    // Reads hold bodies and headers (dead letters): 401, naming nothing.
    for path in [
        "/v1/destinations",
        "/v1/dead-letters?destination=orders",
        "/v1/dead-letters/orders/some-id",
        "/v1/no-such-endpoint",
    ] {
        let resp = get(&format!("{admin}{path}")).await;
        check_eq!(c, resp.status, 401, "GET {path}: {}", resp.text());
        check!(
            c,
            !resp.text().contains("orders"),
            "GET {path} revealed a name: {}",
            resp.text()
        );
    }

    // Event history holds no body and no header (docs/history.md): read openly.
    let page = get(&format!("{admin}/v1/events?limit=1")).await;
    check_eq!(c, page.status, 200, "GET /v1/events: {}", page.text());
    let one = get(&format!("{admin}/v1/events/some-id")).await;
    check_eq!(c, one.status, 404, "unknown, not refused: {}", one.text());
    check!(c, one.json()["error"].is_string(), "{}", one.text());
    let resp = request(Method::DELETE, &format!("{admin}/v1/events"), "", &[]).await;
    check_eq!(
        c,
        resp.status,
        401,
        "only its reads are open: {}",
        resp.text()
    );

    let wrong = format!("Bearer {TOKEN}x");
    let refused: [&[(&str, &str)]; 4] = [
        &[],
        &[("Authorization", wrong.as_str())],
        &[("Authorization", TOKEN)],
        &[("Authorization", "Basic YWRtaW46YWRtaW4=")],
    ];
    for headers in refused {
        for path in [
            "/v1/destinations/orders/pause",
            "/v1/destinations/orders/resume",
            "/v1/no-such-endpoint",
        ] {
            let resp = support::admin_post(&format!("{admin}{path}"), "", headers).await;
            check_eq!(
                c,
                resp.status,
                401,
                "POST {path} with {headers:?}: {}",
                resp.text()
            );
            check_eq!(c, resp.json()["reason"], "unauthorized", "{}", resp.text());
            check!(
                c,
                resp.header("www-authenticate")
                    .is_some_and(|v| v.starts_with("Bearer")),
                "401 without WWW-Authenticate: Bearer"
            );
        }
    }
    // Nothing changed: the destination is not paused and delivers.
    check_eq!(c, state(&c).await, "healthy");
    let resp = post(&c.url("orders"), "{\"n\":1}", &[]).await;
    check_eq!(c, resp.status, 202, "{}", resp.text());
    if rx.try_wait_for(1, PROMPT).await.is_none() {
        fail!(
            c,
            "the event was not delivered: a refused pause took effect"
        );
    }

    let bearer = format!("Bearer {TOKEN}");
    let auth = [("Authorization", bearer.as_str())];
    let resp =
        support::admin_post(&format!("{admin}/v1/destinations/orders/pause"), "", &auth).await;
    check_eq!(c, resp.status, 200, "pause with the token: {}", resp.text());
    check_eq!(c, state(&c).await, "paused");
    let resp = post(&c.url("orders"), "{\"n\":2}", &[]).await;
    check_eq!(c, resp.status, 202, "{}", resp.text());
    rx.assert_quiet(1, Duration::from_millis(500)).await;
    let resp =
        support::admin_post(&format!("{admin}/v1/destinations/orders/resume"), "", &auth).await;
    check_eq!(
        c,
        resp.status,
        200,
        "resume with the token: {}",
        resp.text()
    );
    if rx.try_wait_for(2, PROMPT).await.is_none() {
        fail!(
            c,
            "the event held by the pause was not delivered after resume"
        );
    }
    let logs = c.logs();
    check!(c, !logs.contains(TOKEN), "the token appears in the logs");
}

/// Without the token, 401 comes before anything else (docs/http-api.md):
/// a bodiless `POST` without a content type, a foreign `Origin` and a
/// `Host` that is not allowed are all 401, not 415 or 403; with the token
/// those rules answer as before.
#[tokio::test]
async fn the_token_is_checked_before_the_content_type_and_the_browser_rules() {
    let rx = Receiver::ok().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start_with_env(
        support::courier_bin(),
        dir.path(),
        &with_token(&rx.url()),
        &[("TEST_ADMIN_TOKEN", TOKEN)],
    )
    .await;
    let pause = format!("{}/v1/destinations/orders/pause", c.admin_url());
    let bearer = format!("Bearer {TOKEN}");
    let auth = ("authorization", bearer.as_str());
    // Headers, then the answer with the token and its reason.
    type Case<'a> = (&'a [(&'a str, &'a str)], u16, &'a str);
    let cases: [Case; 3] = [
        (&[], 415, "not_json"),
        (
            &[
                ("content-type", "application/json"),
                ("origin", "http://evil.example"),
            ],
            403,
            "cross_origin",
        ),
        (
            &[
                ("content-type", "application/json"),
                ("host", "evil.example"),
            ],
            403,
            "host_not_allowed",
        ),
    ];
    for (headers, with_token, reason) in cases {
        let resp = request(Method::POST, &pause, "", headers).await;
        check_eq!(c, resp.status, 401, "{headers:?}: {}", resp.text());
        check_eq!(c, resp.json()["reason"], "unauthorized", "{}", resp.text());
        let mut authorized = headers.to_vec();
        authorized.push(auth);
        let resp = request(Method::POST, &pause, "", &authorized).await;
        check_eq!(
            c,
            resp.status,
            with_token,
            "{authorized:?}: {}",
            resp.text()
        );
        check_eq!(c, resp.json()["reason"], reason, "{}", resp.text());
    }
    // None of them paused the destination.
    check_eq!(c, state(&c).await, "healthy");
}

#[tokio::test]
async fn a_pod_address_without_a_token_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = config("orders", "http://127.0.0.1:9/", "").replacen(
        "admin_listen: 127.0.0.1:0",
        "admin_listen: 0.0.0.0:9090",
        1,
    );
    let path = dir.path().join("courier.yaml");
    std::fs::write(&path, yaml).expect("write config");
    let path = path.to_str().expect("utf-8 path");
    for cmd in ["run", "check"] {
        let out = run_cli(None, &[cmd, "-c", path], &[]).await;
        assert_eq!(out.code, 1, "courier {cmd}: {}", out.show());
        assert!(
            out.stderr.contains(
                "courier.yaml:2:15: admin_listen: `0.0.0.0:9090` is not a loopback address, so admin_token_env is required"
            ),
            "courier {cmd}: {}",
            out.show()
        );
    }
}
