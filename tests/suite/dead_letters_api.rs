//! Dead letters an operator can work with (issue #12, items 1 to 3): the
//! admin API and the `courier dead-letters` CLI list, show, replay and
//! purge the records of a real courier, replays reach a real receiver as
//! the app sent them, and the admin token guards what changes anything.

use http::Method;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;
use support::client::request;
use support::{
    CliOutput, Courier, Received, Receiver, Reply, behavior, check, check_eq, config, dl_dir, fail,
    files_under, get, post, requests, run_cli, wait_dead_letters,
};

const PROMPT: Duration = Duration::from_secs(10);
const TOKEN: &str = "dead-letter-admin-token-0123456789";

/// The destination of the replay tests: its name needs no escaping in a
/// path, but a careless client escapes its `-`.
const DEST: &str = "order-events";

/// What the app sends: a query, custom headers, a header to redact.
async fn send(c: &Courier, id: &str) {
    let resp = request(
        Method::PUT,
        &c.url(&format!("{DEST}/hooks/v1?tenant=a%20b&x=1")),
        format!(r#"{{"order": "{id}",  "total": 12.50}}"#),
        &[
            ("Idempotency-Key", id),
            ("X-Trace", "trace-1"),
            ("X-Multi", "one"),
            ("Cookie", "session=do-not-store"),
            ("Content-Type", "application/json"),
            ("X-Multi", "two"),
        ],
    )
    .await;
    check_eq!(c, resp.status, 202, "PUT {id}: {}", resp.text());
}

/// `courier dead-letters --admin <c's admin URL> ARGS`, with `env` set.
async fn cli_with(c: &Courier, args: &[&str], env: &[(&str, &str)]) -> CliOutput {
    let admin = c.admin_url();
    let mut all = vec!["dead-letters", "--admin", &admin];
    all.extend_from_slice(args);
    run_cli(None, &all, env).await
}

async fn cli(c: &Courier, args: &[&str]) -> CliOutput {
    cli_with(c, args, &[]).await
}

fn admin(c: &Courier, path: &str) -> String {
    format!("{}{path}", c.admin_url())
}

async fn replay(c: &Courier, body: Value, token: Option<&str>) -> support::Resp {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .as_deref()
        .map(|b| vec![("Authorization", b)])
        .unwrap_or_default();
    support::admin_post(
        &admin(c, "/v1/dead-letters/replay"),
        body.to_string(),
        &headers,
    )
    .await
}

async fn purge(c: &Courier, query: &str, token: Option<&str>) -> support::Resp {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .as_deref()
        .map(|b| vec![("Authorization", b)])
        .unwrap_or_default();
    support::client::delete(&admin(c, &format!("/v1/dead-letters?{query}")), &headers).await
}

/// Every listed id, following `next` (bounded). The token goes along: a
/// courier with one configured needs it for reads too, one without ignores it.
async fn list_all(c: &Courier, query: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = String::new();
    let bearer = format!("Bearer {TOKEN}");
    for _ in 0..2000 {
        let url = admin(c, &format!("/v1/dead-letters?{query}{after}"));
        let resp =
            support::client::request(Method::GET, &url, "", &[("authorization", &bearer)]).await;
        check_eq!(c, resp.status, 200, "GET {url}: {}", resp.text());
        let page = resp.json();
        out.extend(page["dead_letters"].as_array().cloned().unwrap_or_default());
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => return out,
        }
    }
    fail!(c, "paging did not end");
}

fn id_of(r: &Received) -> String {
    r.header("webhook-id").unwrap_or_default().to_string()
}

/// The app's headers as the receiver got them (not courier's own).
fn app_headers(r: &Received) -> Vec<(String, String)> {
    r.headers
        .iter()
        .filter(|(n, _)| n.as_str().starts_with("x-") || *n == "content-type" || *n == "cookie")
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("?").to_string()))
        .collect()
}

/// A replay is the first delivery again, but for the redacted cookie.
fn check_as_sent(c: &Courier, r: &Received, first: &Received, id: &str) {
    check_eq!(c, r.method, Method::PUT);
    check_eq!(c, r.path_and_query, "/hooks/v1?tenant=a%20b&x=1");
    check_eq!(c, r.body, first.body, "body");
    check_eq!(
        c,
        r.text(),
        format!(r#"{{"order": "{id}",  "total": 12.50}}"#)
    );
    check_eq!(c, r.header("courier-delivery-attempt"), Some("1"));
    check_eq!(c, id_of(r), id);
    let mut want = app_headers(first);
    check!(
        c,
        want.iter().any(|(n, _)| n == "cookie"),
        "the first delivery had the cookie"
    );
    want.retain(|(n, _)| n != "cookie");
    let mut have = app_headers(r);
    // Headers of different names may come in another order (RFC 9110 §5.3);
    // a repeated one keeps its order.
    want.sort_by(|a, b| a.0.cmp(&b.0));
    have.sort_by(|a, b| a.0.cmp(&b.0));
    check_eq!(c, have, want, "headers");
    let multi: Vec<&str> = have
        .iter()
        .filter(|(n, _)| n == "x-multi")
        .map(|(_, v)| v.as_str())
        .collect();
    check_eq!(c, multi, ["one", "two"]);
}

fn first_of<'a>(c: &Courier, got: &'a [Received], id: &str) -> &'a Received {
    got.iter()
        .find(|r| id_of(r) == id)
        .unwrap_or_else(|| fail!(c, "no first delivery of {id}"))
}

fn orders_config(url: &str) -> String {
    config(DEST, url, "").replacen(
        "dead_letter: { dir: ./dl }",
        "dead_letter: { dir: ./dl, redact_headers: [Cookie] }",
        1,
    )
}

#[tokio::test]
async fn a_replay_through_the_api_and_the_cli_sends_the_request_as_the_app_did() {
    let (rx, accept) = support::receiver::refusing_until_set().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &orders_config(&rx.url())).await;
    for id in ["evt-a", "evt-b", "evt-c"] {
        send(&c, id).await;
    }
    wait_dead_letters(&c, DEST, 3, PROMPT).await;
    let firsts = rx.received();
    // At rest: the redacted header is in no file, and the record says so.
    for file in files_under(&dl_dir(&c, DEST)) {
        let text = std::fs::read_to_string(&file).expect("read");
        check!(
            c,
            !text.contains("do-not-store"),
            "{} holds the cookie",
            file.display()
        );
    }
    let out = cli(&c, &["show", "--destination", DEST, "evt-a", "--json"]).await;
    check!(c, out.success(), "CLI show: {}", out.show());
    let shown = out.json();
    check_eq!(c, shown["reason"], "NonRetriableStatus");
    check_eq!(c, shown["last_status"], 400);
    check_eq!(c, shown["attempts"], 1);
    check_eq!(c, shown["replayed"], false);
    check_eq!(c, shown["record"]["redactedHeaders"], json!(["cookie"]));
    check_eq!(
        c,
        shown["record"]["data"],
        json!({"order": "evt-a", "total": 12.50})
    );

    accept.store(true, Ordering::SeqCst);
    let before = rx.count();
    let resp = replay(
        &c,
        json!({"destination": DEST, "ids": ["evt-a", "nope"]}),
        None,
    )
    .await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    let answer = resp.json();
    check_eq!(c, answer["replayed"], json!(["evt-a"]));
    check_eq!(c, answer["not_found"], json!(["nope"]));
    check_eq!(c, answer["redacted_headers"], json!(["cookie"]));
    let got = requests(&c, &rx, before + 1, PROMPT).await;
    check_as_sent(&c, &got[before], first_of(&c, &firsts, "evt-a"), "evt-a");

    let out = cli(&c, &["replay", "--destination", DEST, "evt-b"]).await;
    check!(c, out.success(), "CLI replay: {}", out.show());
    check!(
        c,
        out.stdout
            .contains(&format!("replayed 1 dead letters of {DEST}")),
        "{}",
        out.show()
    );
    check!(
        c,
        out.stdout.contains("cookie"),
        "the CLI does not say what was left out: {}",
        out.show()
    );
    let got = requests(&c, &rx, before + 2, PROMPT).await;
    check_as_sent(
        &c,
        &got[before + 1],
        first_of(&c, &firsts, "evt-b"),
        "evt-b",
    );

    // `all` takes what was not replayed yet, once.
    let out = cli(&c, &["replay", "--destination", DEST, "--all"]).await;
    check_eq!(c, out.code, 1, "--all without --yes: {}", out.show());
    let resp = replay(&c, json!({"destination": DEST, "all": true}), None).await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    check_eq!(c, resp.json()["replayed"], json!(["evt-c"]));
    let resp = replay(&c, json!({"destination": DEST, "all": true}), None).await;
    check_eq!(c, resp.json()["replayed_count"], 0, "{}", resp.text());
    support::quiet(&c, &rx, before + 3, Duration::from_millis(500)).await;
    let ids: Vec<String> = rx.received()[before..].iter().map(id_of).collect();
    check_eq!(c, ids, ["evt-a", "evt-b", "evt-c"]);
    let listed = list_all(&c, &format!("destination={DEST}")).await;
    check!(
        c,
        listed.iter().all(|i| i["replayed"] == true),
        "{listed:?}"
    );
}

#[tokio::test]
async fn a_listing_of_a_thousand_records_pages_each_once_and_the_cli_prints_a_table() {
    let rx = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = config(
        "orders",
        &rx.url(),
        "schema: eventgrid\nprobation: { after_failures: 0 }",
    );
    let c = Courier::start(dir.path(), &yaml).await;
    // Ten requests of a hundred Event Grid events each.
    for r in 0..10 {
        let events: Vec<Value> = (0..100)
            .map(|i| json!({"id": format!("e{:04}", r * 100 + i), "subject": "s", "eventType": "t", "eventTime": "2026-11-23T09:00:00Z", "data": {}, "dataVersion": "1"}))
            .collect();
        let resp = post(&c.url("orders"), Value::Array(events).to_string(), &[]).await;
        check!(
            c,
            resp.status < 300,
            "publish: {} {}",
            resp.status,
            resp.text()
        );
    }
    wait_dead_letters(&c, "orders", 1000, Duration::from_secs(60)).await;
    let want: HashSet<String> = (0..1000).map(|i| format!("e{i:04}")).collect();
    for query in ["destination=orders&limit=7", "limit=333&order=oldest"] {
        let listed = list_all(&c, query).await;
        let ids: Vec<String> = listed
            .iter()
            .map(|i| i["id"].as_str().unwrap_or_default().to_string())
            .collect();
        check_eq!(c, ids.len(), 1000, "{query}");
        check_eq!(
            c,
            ids.iter().cloned().collect::<HashSet<_>>(),
            want,
            "{query}"
        );
    }
    let bad = get(&admin(&c, "/v1/dead-letters?destination=orders&limit=0")).await;
    check_eq!(c, bad.status, 400, "{}", bad.text());
    check!(
        c,
        bad.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("limit")),
        "{}",
        bad.text()
    );
    let typo = get(&admin(&c, "/v1/dead-letters?destinaton=orders")).await;
    check_eq!(c, typo.status, 400, "{}", typo.text());
    let missing = get(&admin(&c, "/v1/dead-letters/orders/no-such-id")).await;
    check_eq!(c, missing.status, 404, "{}", missing.text());
    check!(
        c,
        missing.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("no-such-id")),
        "{}",
        missing.text()
    );
    let unknown = get(&admin(&c, "/v1/dead-letters?destination=gone")).await;
    check_eq!(c, unknown.status, 404, "{}", unknown.text());

    let out = cli(&c, &["list", "--destination", "orders", "--limit", "5"]).await;
    check!(c, out.success(), "{}", out.show());
    let lines: Vec<&str> = out.stdout.lines().collect();
    check_eq!(c, lines.len(), 7, "head, 5 rows, the hint: {}", out.show());
    check!(
        c,
        lines[6].starts_with("more dead letters: add --after "),
        "{}",
        out.show()
    );
    check!(
        c,
        lines[0].starts_with("ID") && lines[0].contains("DEAD-LETTERED AT"),
        "{}",
        out.show()
    );
    check!(
        c,
        lines[1].contains("NonRetriableStatus") && lines[1].contains("BadRequest (400)"),
        "{}",
        out.show()
    );
    let out = cli(&c, &["--json", "list", "--limit", "1500"]).await;
    check!(c, out.success(), "{}", out.show());
    check_eq!(
        c,
        out.json()["dead_letters"].as_array().map(Vec::len),
        Some(1000)
    );
    check_eq!(c, out.json()["next"], Value::Null, "{}", out.show());

    // Replayed while the endpoint still answers 400, each is dead-lettered
    // again during the replay: one replay of `all` takes the 1,000 there
    // were, not the new records its own replays write.
    let resp = replay(
        &c,
        json!({"destination": "orders", "all": true, "reason": "NonRetriableStatus"}),
        None,
    )
    .await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    check_eq!(
        c,
        resp.json()["replayed_count"],
        1000,
        "{}",
        resp.json()["replayed_count"]
    );
    wait_dead_letters(&c, "orders", 2000, Duration::from_secs(60)).await;
    support::quiet(&c, &rx, 2000, Duration::from_millis(300)).await;
    let listed = list_all(&c, "destination=orders&limit=1000").await;
    let replayed = listed.iter().filter(|i| i["replayed"] == true).count();
    check_eq!(c, (listed.len(), replayed), (2000, 1000));
}

#[tokio::test]
async fn a_purge_removes_what_it_says_and_the_token_guards_purge_and_replay() {
    let rx = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "{}  billing:\n    url: {}\n",
        config("orders", &rx.url(), ""),
        rx.url()
    )
    .replacen(
        "admin_listen: 127.0.0.1:0\n",
        "admin_listen: 127.0.0.1:0\nadmin_token_env: TEST_ADMIN_TOKEN\n",
        1,
    );
    let c = Courier::start_with_env(
        support::courier_bin(),
        dir.path(),
        &yaml,
        &[("TEST_ADMIN_TOKEN", TOKEN)],
    )
    .await;
    for (dest, id) in [("orders", "o1"), ("orders", "o2"), ("billing", "b1")] {
        let resp = post(&c.url(dest), "{}", &[("Idempotency-Key", id)]).await;
        check_eq!(c, resp.status, 202, "{}", resp.text());
    }
    wait_dead_letters(&c, "orders", 2, PROMPT).await;
    wait_dead_letters(&c, "billing", 1, PROMPT).await;
    // The journal forgets an event after its dead letter is written.
    for dest in ["orders", "billing"] {
        let series = format!(r#"courier_events_pending{{destination="{dest}"}}"#);
        support::wait_metric(&c, &series, 0.0, PROMPT).await;
    }
    // An old day's file, as if written months ago.
    let old = dl_dir(&c, "orders").join("2026-01-01.jsonl");
    std::fs::write(
        &old,
        "{\"id\":\"old-1\",\"deadLetterReason\":\"TimeToLiveExceeded\"}\n",
    )
    .expect("write");
    let files = || {
        let mut f: Vec<String> = files_under(&dir.path().join("dl"))
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        f.sort();
        f
    };
    let all = files();

    // Without the token: 401, nothing changes.
    let resp = purge(&c, "destination=orders", None).await;
    check_eq!(c, resp.status, 401, "{}", resp.text());
    let resp = purge(&c, "destination=orders", Some("wrong-token")).await;
    check_eq!(c, resp.status, 401, "{}", resp.text());
    let resp = replay(&c, json!({"destination": "orders", "all": true}), None).await;
    check_eq!(c, resp.status, 401, "{}", resp.text());
    // With the token, a malformed request: 400 with a JSON error, nothing
    // stored, nothing marked.
    let bearer = format!("Bearer {TOKEN}");
    let url = admin(&c, "/v1/dead-letters/replay");
    for bad in [
        r#"not json"#,
        r#"{"destination": "orders", "al": true}"#,
        r#"{"destination": "orders", "ids": ["o1"], "all": true}"#,
        r#"{"destination": "orders", "ids": []}"#,
        r#"{"destination": "orders", "ids": ["o1"], "reason": "NonRetriableStatus"}"#,
        r#"{"destination": "orders", "all": true, "since": "last tuesday"}"#,
    ] {
        let resp = support::admin_post(&url, bad, &[("authorization", &bearer)]).await;
        check_eq!(c, resp.status, 400, "{bad}: {}", resp.text());
        check!(
            c,
            resp.json()["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{bad}: {}",
            resp.text()
        );
    }
    check_eq!(c, files(), all, "a refused call changed the files");
    check_eq!(c, rx.count(), 3, "a refused replay sent something");
    let pending = support::metric_sum(&c.admin_url(), "courier_events_pending").await;
    check_eq!(c, pending, 0.0, "a refused replay stored something");
    let listed = list_all(&c, "destination=orders").await;
    check!(
        c,
        listed.iter().all(|i| i["replayed"] == false),
        "{listed:?}"
    );

    // `before` today: only the old day goes.
    let today = &support::deadletters::today();
    let resp = purge(
        &c,
        &format!("destination=orders&before={today}"),
        Some(TOKEN),
    )
    .await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    check_eq!(c, resp.json()["purged"], 1, "{}", resp.text());
    check!(c, !old.exists(), "the old day was kept");
    let ids: HashSet<String> = list_all(&c, "")
        .await
        .iter()
        .map(|i| i["id"].as_str().unwrap_or_default().to_string())
        .collect();
    check_eq!(
        c,
        ids,
        HashSet::from(["o1".into(), "o2".into(), "b1".into()])
    );
    let resp = purge(&c, "destination=orders&before=yesterday", Some(TOKEN)).await;
    check_eq!(c, resp.status, 400, "{}", resp.text());

    // The CLI, with the token from the environment: all of orders, not billing.
    let args = ["purge", "--destination", "orders"];
    let out = cli_with(&c, &args, &[("COURIER_ADMIN_TOKEN", TOKEN)]).await;
    check_eq!(c, out.code, 1, "purge without --yes: {}", out.show());
    let mut with_yes = args.to_vec();
    with_yes.push("--yes");
    let out = cli(&c, &with_yes).await;
    check_eq!(c, out.code, 1, "no token: {}", out.show());
    check!(c, out.stderr.contains("401"), "{}", out.show());
    let out = cli_with(&c, &with_yes, &[("COURIER_ADMIN_TOKEN", TOKEN)]).await;
    check!(c, out.success(), "{}", out.show());
    check!(
        c,
        out.stdout.contains("purged 2 dead letters of orders"),
        "{}",
        out.show()
    );
    let left: Vec<String> = list_all(&c, "")
        .await
        .iter()
        .map(|i| {
            format!(
                "{}/{}",
                i["destination"].as_str().unwrap_or_default(),
                i["id"].as_str().unwrap_or_default()
            )
        })
        .collect();
    check_eq!(c, left, ["billing/b1"]);
}

#[tokio::test]
async fn a_replayed_event_survives_sigkill_before_its_delivery() {
    let (rx, accept) = support::receiver::refusing_until_set().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = Courier::start(dir.path(), &orders_config(&rx.url())).await;
    send(&c, "evt-k").await;
    wait_dead_letters(&c, DEST, 1, PROMPT).await;
    let first = rx.received();
    // Paused, the replayed event can only be in the journal at the kill.
    let pause = support::admin_post(
        &admin(&c, &format!("/v1/destinations/{DEST}/pause")),
        "",
        &[],
    )
    .await;
    check_eq!(c, pause.status, 200, "{}", pause.text());
    let resp = replay(&c, json!({"destination": DEST, "ids": ["evt-k"]}), None).await;
    check_eq!(c, resp.status, 200, "{}", resp.text());
    c.kill();
    accept.store(true, Ordering::SeqCst);
    c.restart().await;
    let resume = support::admin_post(
        &admin(&c, &format!("/v1/destinations/{DEST}/resume")),
        "",
        &[],
    )
    .await;
    check_eq!(c, resume.status, 200, "{}", resume.text());
    let got = requests(&c, &rx, 2, PROMPT).await;
    check_as_sent(&c, &got[1], &first[0], "evt-k");
    // Marked before the answer: a second `all` finds nothing.
    let again = replay(&c, json!({"destination": DEST, "all": true}), None).await;
    check_eq!(c, again.json()["replayed_count"], 0, "{}", again.text());
}

#[tokio::test]
async fn a_destination_removed_from_the_config_cannot_be_replayed_to() {
    let rx = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let base = config("orders", &rx.url(), "");
    let yaml = format!("{base}  billing:\n    url: {}\n", rx.url());
    let mut c = Courier::start(dir.path(), &yaml).await;
    let resp = post(&c.url("billing"), "{}", &[("Idempotency-Key", "b1")]).await;
    check_eq!(c, resp.status, 202, "{}", resp.text());
    wait_dead_letters(&c, "billing", 1, PROMPT).await;
    std::fs::write(c.config_path(), &base).expect("write the config");
    c.signal(libc::SIGHUP);
    c.wait_for_log("config reloaded", PROMPT).await;
    let resp = replay(&c, json!({"destination": "billing", "ids": ["b1"]}), None).await;
    check_eq!(c, resp.status, 404, "{}", resp.text());
    let error = resp.json()["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    check!(
        c,
        error.contains("`billing`") && error.contains("not in the config"),
        "{error}"
    );
    check_eq!(c, resp.json()["destinations"], json!(["orders"]));
    check_eq!(c, rx.count(), 1, "nothing was sent");
    check_eq!(
        c,
        support::read_dead_letters(&c, &dl_dir(&c, "billing"))
            .1
            .len(),
        1,
        "the record is kept"
    );
}

/// The cursor of a `courier dead-letters list` page's hint
/// (`more dead letters: add --after CURSOR …`), if it printed one.
fn hint_cursor(out: &CliOutput) -> Option<String> {
    let hint = out
        .stdout
        .lines()
        .find(|l| l.starts_with("more dead letters: add --after "))?;
    hint.split_whitespace()
        .skip_while(|w| *w != "--after")
        .nth(1)
        .map(String::from)
}

/// The table's ids (its first column, under the `ID` head).
fn table_ids(out: &CliOutput) -> Vec<String> {
    out.stdout
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("more dead letters"))
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

/// `courier dead-letters list` pages as `courier events list` does: 25
/// records with `--limit 10` are three pages, each record listed once,
/// every page but the last ending with `more dead letters: add --after …`,
/// whose cursor gives the next; `--json` prints the API's page whole
/// (`dead_letters`, `next`, `unreadable_lines`), and its `next` pages on
/// the same way.
#[tokio::test]
async fn the_cli_pages_dead_letters_with_after_and_its_json_keeps_next() {
    let rx = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &config("orders", &rx.url(), "")).await;
    for i in 0..25 {
        let id = format!("p{i:02}");
        let resp = post(&c.url("orders"), "{}", &[("Idempotency-Key", id.as_str())]).await;
        check_eq!(c, resp.status, 202, "{id}: {}", resp.text());
    }
    wait_dead_letters(&c, "orders", 25, PROMPT).await;
    let want: HashSet<String> = (0..25).map(|i| format!("p{i:02}")).collect();

    let mut seen = Vec::new();
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..4 {
        let mut args = vec!["list", "--destination", "orders", "--limit", "10"];
        if let Some(a) = &after {
            args.extend(["--after", a.as_str()]);
        }
        let out = cli(&c, &args).await;
        check!(c, out.success(), "{}", out.show());
        let ids = table_ids(&out);
        pages.push(ids.len());
        seen.extend(ids);
        after = hint_cursor(&out);
        if after.is_none() {
            break;
        }
    }
    check_eq!(c, pages, [10, 10, 5], "{seen:?}");
    check_eq!(c, seen.len(), 25, "each record once: {seen:?}");
    check_eq!(c, seen.into_iter().collect::<HashSet<_>>(), want);

    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for page in 0..3 {
        let mut args = vec!["--json", "list", "--limit", "10"];
        if let Some(a) = &after {
            args.extend(["--after", a.as_str()]);
        }
        let out = cli(&c, &args).await;
        check!(c, out.success(), "{}", out.show());
        let v = out.json();
        check_eq!(c, v["unreadable_lines"], 0, "{v}");
        let items = v["dead_letters"].as_array().cloned().unwrap_or_default();
        seen.extend(
            items
                .iter()
                .filter_map(|i| i["id"].as_str().map(String::from)),
        );
        after = v["next"].as_str().map(String::from);
        check_eq!(c, after.is_some(), page < 2, "page {page}: {v}");
        check!(c, v.get("next").is_some(), "no `next` key: {v}");
    }
    check_eq!(c, seen.len(), 25, "each record once: {seen:?}");
    check_eq!(c, seen.into_iter().collect::<HashSet<_>>(), want);
}
