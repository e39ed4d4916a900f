//! deploy/monitoring/ against courier and itself (issue #35): the alerts of
//! `prometheusrule.yaml` pass `promtool check rules` and their unit tests
//! (`deploy/monitoring/tests/`, `promtool test rules`); every alert has a
//! case where it fires and one where it does not, a severity, a summary, a
//! description and a runbook section in `docs/runbook.md`; the dashboard's
//! queries are PromQL; and every series an alert or a panel names is one a
//! real courier exports, so that a renamed metric cannot leave an alert
//! silent or a panel empty. Only loopback links: nothing here points out of
//! the repository.

use serde_norway::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::markdown::anchors;
use support::{Courier, Receiver, Reply, admin_post, behavior, check, check_eq, post, wait_metric};

/// Series an alert or panel may name that courier does not export, each
/// with why it is needed.
const NOT_COURIERS: &[(&str, &str)] = &[(
    "up",
    "Prometheus's own per-target series (0 when a scrape fails): CourierDown and the targets panel need it, and a process that is down cannot export it",
)];

/// The rules file the tests read: `spec` of the PrometheusRule.
const RULES: &str = "courier-rules.yaml";

const SEVERITIES: [&str; 3] = ["critical", "warning", "info"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn monitoring() -> PathBuf {
    root().join("deploy/monitoring")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml(path: &Path) -> Value {
    serde_norway::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rule_object() -> Value {
    yaml(&monitoring().join("prometheusrule.yaml"))
}

/// Every alerting rule of the PrometheusRule.
fn alerts() -> Vec<Value> {
    let rule = rule_object();
    assert_eq!(
        (
            rule["apiVersion"].as_str(),
            rule["kind"].as_str(),
            rule["metadata"]["name"].as_str().is_some()
        ),
        (
            Some("monitoring.coreos.com/v1"),
            Some("PrometheusRule"),
            true
        ),
        "deploy/monitoring/prometheusrule.yaml is not a named PrometheusRule"
    );
    let groups = rule["spec"]["groups"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    assert!(!groups.is_empty(), "the PrometheusRule has no groups");
    let alerts: Vec<Value> = groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
        .filter(|r| r.get("alert").is_some())
        .collect();
    assert!(!alerts.is_empty(), "the PrometheusRule has no alerts");
    alerts
}

fn name(alert: &Value) -> String {
    alert["alert"].as_str().unwrap_or_default().to_string()
}

/// deploy/monitoring/tests/*.yaml, sorted.
fn test_files() -> Vec<PathBuf> {
    let dir = monitoring().join("tests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("read_dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no promtool tests in {}", dir.display());
    files
}

/// A folder with the PrometheusRule's `spec` as a plain rules file beside
/// copies of the unit tests, which name it in `rule_files`.
fn rules_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = serde_norway::to_string(&rule_object()["spec"]).expect("spec as YAML");
    std::fs::write(dir.path().join(RULES), spec).expect("write the rules file");
    for f in test_files() {
        let name = f.file_name().expect("a file name");
        assert_ne!(name, RULES, "a test file may not be called {RULES}");
        std::fs::copy(&f, dir.path().join(name)).expect("copy a test file");
    }
    dir
}

/// `promtool ARGS` in `dir`: its exit status and what it printed. Fails,
/// never skips, without promtool.
fn promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): install it with .ci/promtool (its binary from Debian's prometheus package)")
        });
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn promtool_checks_the_rules_and_passes_their_unit_tests() {
    let dir = rules_dir();
    let (ok, said) = promtool(dir.path(), &["check", "rules", RULES]);
    assert!(ok, "promtool check rules:\n{said}");
    let mut args = vec!["test".to_string(), "rules".to_string()];
    args.extend(test_files().iter().map(|f| {
        f.file_name()
            .expect("a file name")
            .to_string_lossy()
            .into_owned()
    }));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, said) = promtool(dir.path(), &args);
    assert!(ok, "promtool test rules:\n{said}");
    assert!(!said.contains("FAILED"), "promtool test rules:\n{said}");
}

/// Every `alert_rule_test` of the unit tests: (alert name, fires?).
fn alert_cases() -> Vec<(String, bool, String)> {
    let mut cases = Vec::new();
    for f in test_files() {
        let file = f
            .file_name()
            .expect("a file name")
            .to_string_lossy()
            .into_owned();
        let doc = yaml(&f);
        for test in doc["tests"].as_sequence().cloned().unwrap_or_default() {
            for case in test["alert_rule_test"]
                .as_sequence()
                .cloned()
                .unwrap_or_default()
            {
                let alert = case["alertname"].as_str().unwrap_or_default().to_string();
                let fires = case["exp_alerts"]
                    .as_sequence()
                    .is_some_and(|a| !a.is_empty());
                cases.push((alert, fires, file.clone()));
            }
        }
    }
    cases
}

#[test]
fn every_alert_has_a_case_where_it_fires_and_one_where_it_does_not() {
    let names: BTreeSet<String> = alerts().iter().map(name).collect();
    let cases = alert_cases();
    let mut missing = Vec::new();
    for alert in &names {
        for (fires, what) in [(true, "fires"), (false, "does not fire")] {
            if !cases.iter().any(|(a, f, _)| a == alert && *f == fires) {
                missing.push(format!("{alert}: no case where it {what}"));
            }
        }
    }
    for (alert, _, file) in &cases {
        if !names.contains(alert) {
            missing.push(format!(
                "{file} tests {alert}, which is no alert of the rule file"
            ));
        }
    }
    assert!(
        missing.is_empty(),
        "deploy/monitoring/tests/:\n{}",
        missing.join("\n")
    );
}

fn runbook() -> (PathBuf, String) {
    let path = root().join("docs/runbook.md");
    let text = read(&path);
    (path, text)
}

#[test]
fn every_alert_has_a_severity_a_for_a_summary_a_description_and_a_runbook_section() {
    let (_, text) = runbook();
    let sections = anchors(&text);
    let mut wrong = Vec::new();
    for alert in alerts() {
        let n = name(&alert);
        let severity = alert["labels"]["severity"].as_str().unwrap_or_default();
        if !SEVERITIES.contains(&severity) {
            wrong.push(format!(
                "{n}: severity {severity:?}, not one of {SEVERITIES:?}"
            ));
        }
        if alert["for"].as_str().is_none() {
            wrong.push(format!("{n}: no `for:` (write `for: 0m` to fire at once)"));
        }
        let annotations = &alert["annotations"];
        for key in ["summary", "description"] {
            let v = annotations[key].as_str().unwrap_or_default();
            if !(v.contains("$labels.namespace") || v.contains("$labels.pod")) {
                wrong.push(format!(
                    "{n}: its {key} does not say which pod or namespace"
                ));
            }
        }
        let expr = alert["expr"].as_str().unwrap_or_default();
        if expr.contains("destination") {
            let said = annotations["summary"].as_str().unwrap_or_default();
            if !said.contains("$labels.destination") {
                wrong.push(format!(
                    "{n}: its expr keeps `destination`, its summary does not name it"
                ));
            }
        }
        let want = format!("docs/runbook.md#{}", n.to_lowercase());
        let runbook = annotations["runbook"].as_str().unwrap_or_default();
        if runbook != want {
            wrong.push(format!(
                "{n}: runbook annotation {runbook:?}, want {want:?}"
            ));
        } else if !sections.contains(&n.to_lowercase()) {
            wrong.push(format!("{n}: docs/runbook.md has no heading `## {n}`"));
        }
    }
    assert!(
        wrong.is_empty(),
        "deploy/monitoring/prometheusrule.yaml:\n{}",
        wrong.join("\n")
    );
}

/// Nothing written for monitoring points out of the repository: no URL but
/// loopback ones (commands run beside courier), and every relative link of
/// the runbook reaches a file of the repository.
#[test]
fn monitoring_files_point_nowhere_outside_the_repository() {
    // The Markdown (the runbook, the README) is checked with every other
    // document by `docs::every_link_in_the_docs_resolves_inside_the_repo`.
    let mut files: Vec<PathBuf> = vec![
        monitoring().join("prometheusrule.yaml"),
        monitoring().join("dashboard.json"),
    ];
    files.extend(test_files());
    let mut wrong = Vec::new();
    for f in &files {
        let text = read(f);
        for (i, line) in text.lines().enumerate() {
            for scheme in ["http://", "https://"] {
                for (at, _) in line.match_indices(scheme) {
                    let host = &line[at + scheme.len()..];
                    if !(host.starts_with("127.0.0.1") || host.starts_with("localhost")) {
                        wrong.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "links out of the repository:\n{}",
        wrong.join("\n")
    );
}

fn dashboard() -> serde_json::Value {
    let path = monitoring().join("dashboard.json");
    serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every query of the dashboard: panel targets (rows' panels too) and the
/// metric selector of each `label_values(...)` variable, with a name for
/// messages.
fn dashboard_queries() -> Vec<(String, String)> {
    fn walk(panels: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or_default();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str() {
                    out.push((format!("panel {title:?}"), expr.to_string()));
                }
            }
            walk(&p["panels"], out);
        }
    }
    let d = dashboard();
    let mut out = Vec::new();
    walk(&d["panels"], &mut out);
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap_or_default();
        let selector = q
            .strip_prefix("label_values(")
            .and_then(|inner| inner.rsplit_once(','))
            .map(|(series, _label)| series.trim().to_string());
        match selector {
            Some(s) => out.push((format!("variable {}", v["name"]), s)),
            None => panic!(
                "variable {}: {q:?} is not label_values(series, label)",
                v["name"]
            ),
        }
    }
    assert!(
        out.len() > 10,
        "the dashboard has hardly any queries: {out:?}"
    );
    out
}

/// Grafana's variables replaced by values PromQL takes.
fn grafana_to_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h")
}

#[test]
fn the_dashboard_has_its_variables_and_its_queries_are_promql() {
    let d = dashboard();
    let vars: Vec<(String, String)> = d["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            (
                v["name"].as_str().unwrap_or_default().to_string(),
                v["type"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    for (want, kind) in [
        ("datasource", "datasource"),
        ("namespace", "query"),
        ("pod", "query"),
        ("destination", "query"),
    ] {
        assert!(
            vars.iter().any(|(n, k)| n == want && k == kind),
            "no {kind} variable {want} in {vars:?}"
        );
    }
    // Every panel and target reads the chosen data source.
    let text = read(&monitoring().join("dashboard.json"));
    let sources: Vec<serde_json::Value> = serde_json::from_str::<serde_json::Value>(&text)
        .map(|d| collect_datasources(&d["panels"]))
        .unwrap_or_default();
    for s in &sources {
        assert!(
            s["uid"] == "${datasource}",
            "a panel or target reads {s}, not the datasource variable"
        );
    }
    // promtool parses a rules file: one recording rule per query.
    let rules: Vec<serde_json::Value> = dashboard_queries()
        .iter()
        .enumerate()
        .map(|(i, (_, q))| serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": grafana_to_promql(q)}))
        .collect();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("dashboard.json"), file.to_string()).expect("write");
    let (ok, said) = promtool(dir.path(), &["check", "rules", "dashboard.json"]);
    assert!(ok, "the dashboard's queries as PromQL:\n{said}");
}

fn collect_datasources(panels: &serde_json::Value) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for p in panels.as_array().into_iter().flatten() {
        if p["type"] != "row" {
            out.push(p["datasource"].clone());
            for t in p["targets"].as_array().into_iter().flatten() {
                out.push(t["datasource"].clone());
            }
        }
        out.extend(collect_datasources(&p["panels"]));
    }
    out
}

/// PromQL's keywords and aggregation operators: bare words that are no
/// series. Functions are told by the `(` after them.
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "limitk",
    "limit_ratio",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "inf",
    "nan",
    "start",
    "end",
];

/// Keywords whose `(...)` that follows is a list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The series names a PromQL expression selects: identifiers standing
/// alone or before `{`, but not a function (before `(`), a keyword, a
/// label name (inside `{}` or a `by (...)`-like list), a string, a
/// number, a duration (inside `[]`), a Grafana `$variable` or a comment.
fn series_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = BTreeSet::new();
    let mut i = 0;
    // Skips from an opening bracket to past its closing one, over strings.
    let skip = |mut i: usize, open: char, close: char| -> usize {
        let mut depth = 0;
        while i < chars.len() {
            match chars[i] {
                '"' | '\'' | '`' => {
                    let q = chars[i];
                    i += 1;
                    while i < chars.len() && chars[i] != q {
                        i += if chars[i] == '\\' { 2 } else { 1 };
                    }
                }
                c if c == open => depth += 1,
                c if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        return i + 1;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        i
    };
    let next_non_space = |mut i: usize| -> Option<char> {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        chars.get(i).copied()
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            }
            '{' => i = skip(i, '{', '}'),
            '[' => i = skip(i, '[', ']'),
            '$' => {
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let lower = word.to_lowercase();
                if LABEL_LISTS.contains(&lower.as_str()) {
                    let mut j = i;
                    while j < chars.len() && chars[j].is_whitespace() {
                        j += 1;
                    }
                    if chars.get(j) == Some(&'(') {
                        i = skip(j, '(', ')');
                    }
                } else if KEYWORDS.contains(&lower.as_str()) || next_non_space(i) == Some('(') {
                    // A keyword, or a function.
                } else {
                    out.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    out
}

#[test]
fn series_names_are_told_from_functions_keywords_labels_and_numbers() {
    let expr = r#"
        histogram_quantile(0.99, sum by (le, destination) (
          rate(courier_delivery_duration_seconds_bucket{namespace=~"$namespace", reason="a{b}"}[$__rate_interval])
        )) > 0.5 # TUNE: courier_not_a_series
        and on (job, instance) courier_build_info
        / ignoring(reason) group_left (version) up offset 5m
        or vector(1) + time() - max without (pod) (courier_journal_bytes) * 1e3 > bool 2"#;
    let got: Vec<String> = series_names(expr).into_iter().collect();
    assert_eq!(
        got,
        [
            "courier_build_info",
            "courier_delivery_duration_seconds_bucket",
            "courier_journal_bytes",
            "up"
        ]
    );
}

/// Series names of every alert expr and dashboard query, each with where
/// it is named.
fn named_series() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for alert in alerts() {
        for s in series_names(alert["expr"].as_str().unwrap_or_default()) {
            out.push((s, format!("alert {}", name(&alert))));
        }
    }
    for (what, q) in dashboard_queries() {
        for s in series_names(&q) {
            out.push((s, format!("dashboard {what}")));
        }
    }
    out
}

/// The names of the samples of a scrape (`x_bucket`, `x_sum`, `x_count`
/// for a histogram `x`, as Prometheus stores them).
fn exported(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap_or_default().to_string())
        .collect()
}

/// A real courier, driven so that every family it can export appears: an
/// event handed off at SIGTERM and adopted after the restart (with
/// `handoff.url` a local store), then delivered; one dead-lettered to a
/// bucket sink (a `file://` store); a request to an unknown destination
/// (an ingress rejection); an ordering key; history. Then every series an
/// alert or the dashboard names must be in the scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_named_by_an_alert_or_a_panel_is_exported_by_courier() {
    let ok = Receiver::ok().await;
    let refused = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    for sub in ["handoff", "dlb"] {
        std::fs::create_dir_all(dir.path().join(sub)).expect("create a store folder");
    }
    let store = |sub: &str| format!("file://{}", dir.path().join(sub).display());
    let yaml = format!(
        "listen: 127.0.0.1:0\n\
         admin_listen: 127.0.0.1:0\n\
         shutdown_grace: 1s\n\
         journal: {{ dir: ./journal }}\n\
         dead_letter: {{ dir: ./dl }}\n\
         handoff: {{ url: {}, poll: 200ms }}\n\
         destinations:\n  \
           orders:\n    \
             url: {}\n    \
             ordering: {{ key: destination }}\n  \
           refused:\n    \
             url: {}\n    \
             dead_letter: {{ url: {} }}\n",
        store("handoff"),
        ok.url(),
        refused.url(),
        store("dlb"),
    );
    let mut c = Courier::start(dir.path(), &yaml).await;
    let pause = format!("{}/v1/destinations/orders/pause", c.admin_url());
    let r = admin_post(&pause, "{}", &[]).await;
    check_eq!(c, r.status, 200, "pause: {}", r.text());
    let r = post(&c.url("orders"), r#"{"n":1}"#, &[]).await;
    check_eq!(c, r.status, 202, "{}", r.text());
    c.terminate();
    let status = c.wait_exit(Duration::from_secs(20)).await;
    check!(c, status.success(), "SIGTERM: {status}");
    check!(
        c,
        c.logs().contains("hand-off object written"),
        "no hand-off written"
    );

    c.restart().await;
    wait_metric(
        &c,
        r#"courier_handoff_events_total{direction="adopted"}"#,
        1.0,
        Duration::from_secs(10),
    )
    .await;
    let resume = format!("{}/v1/destinations/orders/resume", c.admin_url());
    let r = admin_post(&resume, "{}", &[]).await;
    check_eq!(c, r.status, 200, "resume: {}", r.text());
    ok.wait_for(1, Duration::from_secs(10)).await;
    let r = post(&c.url("refused"), r#"{"n":2}"#, &[]).await;
    check_eq!(c, r.status, 202, "{}", r.text());
    let r = post(&c.url("nowhere"), r#"{"n":3}"#, &[]).await;
    check_eq!(c, r.status, 404, "{}", r.text());
    wait_metric(
        &c,
        r#"courier_events_delivered_total{destination="orders"}"#,
        1.0,
        Duration::from_secs(10),
    )
    .await;
    wait_metric(
        &c,
        r#"courier_events_dead_lettered_total{destination="refused",reason="NonRetriableStatus"}"#,
        1.0,
        Duration::from_secs(10),
    )
    .await;

    let text = support::client::metrics_text(&c.admin_url()).await;
    let have = exported(&text);
    let allowed: BTreeSet<&str> = NOT_COURIERS.iter().map(|(n, _)| *n).collect();
    let mut unknown: Vec<String> = named_series()
        .into_iter()
        .filter(|(s, _)| !have.contains(s) && !allowed.contains(s.as_str()))
        .map(|(s, at)| format!("{at}: {s}"))
        .collect();
    unknown.dedup();
    check!(
        c,
        unknown.is_empty(),
        "series no courier exports (renamed? or add the traffic that makes them appear here):\n{}\n--- scrape ---\n{text}",
        unknown.join("\n")
    );
    // And the allow-list holds only what is used: a stale entry would let
    // a typo pass.
    let used: BTreeSet<String> = named_series().into_iter().map(|(s, _)| s).collect();
    for (n, why) in NOT_COURIERS {
        check!(
            c,
            used.contains(*n),
            "{n} is allowed ({why}) but no alert or panel uses it"
        );
        check!(
            c,
            !have.contains(*n),
            "{n} is allowed as not courier's, but courier exports it"
        );
    }
}
