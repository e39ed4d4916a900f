//! The documentation against the code, so that it cannot drift: every
//! config key courier's parser takes is in `docs/configuration.md`, with
//! the default `courier check` prints and the range it enforces; every series courier exports is in
//! `docs/metrics.md`; every relative link in the repo's Markdown resolves,
//! and none points outside the repo; the README stays short.
//!
//! The config keys are not listed by hand: they are found by asking the
//! real parser. A block given the key `__probe` is refused with the keys it
//! allows ("unknown key `__probe`; expected one of ..."), and each of those
//! is probed again, so a key added to the schema shows up here by itself.

use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use support::client::metrics_text;
use support::markdown::{anchor, anchors, links};
use support::{Courier, Receiver, Reply, behavior, config, post, run_cli};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A config that passes the parser's shape checks, for the probes to add to.
fn base() -> Value {
    json!({"destinations": {"a": {"url": "https://127.0.0.1:1/"}}})
}

/// The name a probe uses for the `*` of a map (`destinations.*`): one that
/// [`base`] already has where it has one.
fn name_for(parent: &str) -> &'static str {
    match parent {
        "destinations" => "a",
        _ => "x",
    }
}

/// `path` (dotted, `*` for a map's entries) set to `leaf` inside [`base`].
fn doc_with(path: &[String], leaf: Value) -> Value {
    let mut doc = base();
    let mut at = &mut doc;
    for (i, seg) in path.iter().enumerate() {
        let key = if seg == "*" {
            name_for(&path[i - 1]).to_string()
        } else {
            seg.clone()
        };
        let map = at.as_object_mut().expect("probes descend through mappings");
        let next = map.entry(key).or_insert_with(|| Value::Object(Map::new()));
        if !next.is_object() {
            *next = Value::Object(Map::new());
        }
        at = next;
    }
    if let (Some(map), Value::Object(extra)) = (at.as_object_mut(), leaf) {
        map.extend(extra);
    }
    doc
}

/// What `courier check` says of a config (JSON is YAML).
async fn check(doc: &Value, dir: &Path) -> String {
    let path = dir.join("probe.yaml");
    std::fs::write(&path, doc.to_string()).expect("write the probe");
    let out = run_cli(None, &["check", "-c", &path.to_string_lossy()], &[]).await;
    out.stderr
}

/// The keys a block at `path` allows, from its answer to `__probe`; `None`
/// when the value there is not a block of named keys.
async fn allowed_keys(path: &[String], dir: &Path) -> Option<Vec<String>> {
    let err = check(&doc_with(path, json!({"__probe": 1})), dir).await;
    for line in err.lines() {
        if !line.contains("`__probe`") {
            continue;
        }
        let list = if let Some((_, l)) = line.split_once("`__probe`; expected one of ") {
            l
        } else if let Some((_, l)) = line.split_once("`__probe`; expected ") {
            l
        } else if let Some((_, l)) = line
            .split_once("unknown key `__probe`")
            .and_then(|(_, l)| l.split_once(": allowed "))
        {
            l
        } else {
            continue;
        };
        return Some(list.split(", ").map(|k| k.trim().to_string()).collect());
    }
    None
}

/// Whether the value at `path` is a mapping of named entries (`headers`,
/// `topics`): its answer to `__probe: 1` says the entry must be a mapping.
async fn is_map_of_blocks(path: &[String], dir: &Path) -> bool {
    let err = check(&doc_with(path, json!({"__probe": 1})), dir).await;
    err.lines()
        .any(|l| l.contains(".__probe: expected a mapping"))
}

/// Keys whose value takes a form the probe cannot enter by itself: a
/// schedule is a keyword, a list, or a block named by its kind.
fn forms(path: &str) -> &'static [&'static str] {
    match path {
        "destinations.*.retry.schedule" => &["exponential", "sns"],
        "destinations.*.retry.schedule.sns" => &["healthyRetryPolicy", "throttlePolicy"],
        _ => &[],
    }
}

/// Every key path the parser takes, `*` standing for a map's names.
async fn config_keys() -> BTreeSet<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut found = BTreeSet::new();
    let mut todo: Vec<Vec<String>> = vec![vec![]];
    let mut probes = 0;
    while let Some(path) = todo.pop() {
        probes += 1;
        assert!(probes < 500, "the key walk does not end: {found:?}");
        for form in forms(&path.join(".")) {
            let mut f = path.clone();
            f.push((*form).into());
            found.insert(f.join("."));
            todo.push(f);
        }
        let Some(keys) = allowed_keys(&path, dir.path()).await else {
            continue;
        };
        for key in keys {
            let mut child = path.clone();
            child.push(key);
            found.insert(child.join("."));
            if is_map_of_blocks(&child, dir.path()).await {
                child.push("*".into());
                found.insert(child.join("."));
            }
            todo.push(child);
        }
    }
    found
}

/// The keys `docs/configuration.md` documents: the first cell of each table
/// row, in backticks, `<name>` written for a map's entries.
fn documented_keys(page: &str) -> BTreeMap<String, String> {
    let mut keys = BTreeMap::new();
    for line in page.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 || !cells[1].starts_with('`') {
            continue;
        }
        let key = cells[1].trim_matches('`');
        let starred: Vec<String> = key
            .split('.')
            .map(|s| {
                if s.starts_with('<') && s.ends_with('>') {
                    "*".to_string()
                } else {
                    s.to_string()
                }
            })
            .collect();
        keys.insert(starred.join("."), line.to_string());
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_config_key_is_in_the_configuration_reference_and_no_other() {
    let keys = config_keys().await;
    assert!(
        keys.contains("destinations.*.retry.schedule.exponential.multiplier")
            && keys.contains("destinations.*.headers.*.from_env")
            && keys.contains("topics.*.subscribers.*.event_types")
            && keys.contains("destinations.*.ordering.key.from_event"),
        "the walk reaches nested blocks: {keys:?}"
    );
    if std::env::var_os("COURIER_DUMP_KEYS").is_some() {
        eprintln!("{}", keys.iter().cloned().collect::<Vec<_>>().join("\n"));
    }
    let page = read("docs/configuration.md");
    let documented = documented_keys(&page);
    let missing: Vec<_> = keys
        .iter()
        .filter(|k| !documented.contains_key(*k))
        .collect();
    assert!(
        missing.is_empty(),
        "keys courier takes that docs/configuration.md has no row for (write `destinations.<name>.key` for `destinations.*.key`): {missing:#?}"
    );
    let stale: Vec<_> = documented.keys().filter(|k| !keys.contains(*k)).collect();
    assert!(
        stale.is_empty(),
        "rows of docs/configuration.md for keys courier refuses: {stale:#?}"
    );
}

/// The defaults a row gives (its third cell, when it starts with a value
/// in backticks) are those `courier check` prints for a minimal config.
#[tokio::test]
async fn defaults_in_the_configuration_reference_are_courier_checks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("min.yaml");
    std::fs::write(
        &path,
        "destinations:\n  a:\n    url: https://127.0.0.1:1/\n",
    )
    .expect("write");
    let out = run_cli(None, &["check", "-c", &path.to_string_lossy()], &[]).await;
    assert_eq!(out.code, 0, "{}", out.show());
    let effective: serde_norway::Value =
        serde_norway::from_str(&out.stdout).expect("check prints YAML");
    let page = read("docs/configuration.md");
    let mut compared = 0;
    let mut wrong = Vec::new();
    for (key, row) in documented_keys(&page) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(default) = cells[3]
            .strip_prefix('`')
            .and_then(|d| d.split_once('`'))
            .map(|(d, _)| d)
        else {
            continue;
        };
        let mut at = &effective;
        let mut present = true;
        for seg in key.split('.') {
            let seg = if seg == "*" { "a" } else { seg };
            match at.get(seg) {
                Some(v) => at = v,
                None => {
                    present = false;
                    break;
                }
            }
        }
        if !present {
            wrong.push(format!(
                "{key}: the page gives the default `{default}`, `courier check` prints none"
            ));
            continue;
        }
        let documented: serde_norway::Value =
            serde_norway::from_str(default).unwrap_or(serde_norway::Value::Null);
        compared += 1;
        if &documented != at {
            wrong.push(format!(
                "{key}: the page says `{default}`, courier check prints {}",
                serde_norway::to_string(at).unwrap_or_default().trim()
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(compared >= 30, "only {compared} defaults were compared");
}

/// A bound as the page or `courier check` writes it, as one number to
/// compare: a duration in milliseconds, a size in bytes, else the number.
fn bound(text: &str) -> Option<f64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: f64 = n.parse().ok()?;
    let scale = match unit {
        "" | "B" | "ms" => 1.0,
        "s" => 1e3,
        "m" => 60e3,
        "h" => 3600e3,
        "d" => 86_400e3,
        "KiB" => 1024.0,
        "MiB" => 1024f64.powi(2),
        "GiB" => 1024f64.powi(3),
        "TiB" => 1024f64.powi(4),
        "PiB" => 1024f64.powi(5),
        _ => return None,
    };
    Some(n * scale)
}

/// The first `A..=B` the page gives in a cell, in backticks.
fn documented_range(cell: &str) -> Option<(String, String)> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .find_map(|code| code.split_once("..="))
        .map(|(a, b)| (a.to_string(), b.to_string()))
}

/// `path` set to `value` inside [`base`], with what its block needs besides.
fn doc_setting(path: &[String], value: Value) -> Value {
    let (last, parent) = path.split_last().expect("a key");
    let mut leaf = Map::new();
    leaf.insert(last.clone(), value);
    let needs = match parent.join(".").as_str() {
        "handoff" => json!({"url": "file:///courier-probe"}),
        "tracing" => json!({"otlp_endpoint": "http://127.0.0.1:4318"}),
        _ => json!({}),
    };
    if let Value::Object(n) = needs {
        for (k, v) in n {
            leaf.entry(k).or_insert(v);
        }
    }
    doc_with(parent, Value::Object(leaf))
}

/// The range `courier check` gives a scalar key when its value is far out
/// of it: `None` when no such value is refused with a range.
async fn checked_range(path: &[String], dir: &Path) -> Option<(String, String)> {
    let at = path
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if s == "*" {
                name_for(&path[i - 1]).to_string()
            } else {
                s.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(".");
    for far in [json!(9_999_999_999_999_999u64), json!("99999d")] {
        let err = check(&doc_setting(path, far), dir).await;
        let found = err.lines().find_map(|l| {
            let (_, rest) = l.split_once(&format!(": {at}: "))?;
            let (_, range) = rest.split_once("is out of range: allowed ")?;
            let range = range.split(" (").next()?;
            range
                .split_once("..=")
                .map(|(a, b)| (a.to_string(), b.to_string()))
        });
        if found.is_some() {
            return found;
        }
    }
    None
}

/// Every range `courier check` enforces on a key is the first range its
/// row gives (`allowed` column), compared as numbers (`1KiB` is `1024`,
/// `90d` is `2160h`); an end written as another key's name is not compared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_in_the_configuration_reference_are_courier_checks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let page = read("docs/configuration.md");
    let mut compared = 0;
    let mut wrong = Vec::new();
    for (key, row) in documented_keys(&page) {
        let path: Vec<String> = key.split('.').map(str::to_string).collect();
        let Some((lo, hi)) = checked_range(&path, dir.path()).await else {
            continue;
        };
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some((dlo, dhi)) = documented_range(cells[4]) else {
            wrong.push(format!(
                "{key}: courier allows {lo}..={hi}, the page gives no range"
            ));
            continue;
        };
        for (doc, real) in [(&dlo, &lo), (&dhi, &hi)] {
            match (bound(doc), bound(real)) {
                (Some(d), Some(r)) => {
                    compared += 1;
                    if (d - r).abs() > 1e-9 * r.abs().max(1.0) {
                        wrong.push(format!(
                            "{key}: the page allows {dlo}..={dhi}, courier {lo}..={hi}"
                        ));
                    }
                }
                // An end named after another key (`min..=max`).
                (None, _) => {}
                (Some(_), None) => wrong.push(format!(
                    "{key}: courier's bound `{real}` is not a number to compare"
                )),
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // 59 when written.
    assert!(compared >= 50, "only {compared} bounds were compared");
}

/// Every series name in a scrape of a courier that has delivered, failed
/// and dead-lettered events, and every series name `src/metrics.rs` declares.
async fn exported_series() -> BTreeSet<String> {
    let rx = Receiver::start(behavior(|_, n| {
        if n % 2 == 0 {
            Reply::status(200)
        } else {
            Reply::status(400)
        }
    }))
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &config("orders", &rx.url(), "")).await;
    for i in 0..4 {
        let r = post(&c.url("orders"), format!("{{\"n\":{i}}}"), &[]).await;
        assert_eq!(r.status, 202, "{}", r.text());
    }
    rx.wait_for(4, std::time::Duration::from_secs(20)).await;
    let mut names = BTreeSet::new();
    for line in metrics_text(&c.admin_url()).await.lines() {
        if let Some(name) = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.split_whitespace().next())
        {
            names.insert(name.to_string());
        }
    }
    // The names `src/metrics.rs` declares, which every series goes by
    // (metrics are a leaf module): those a short run does not show, too.
    for line in read("src/metrics.rs").lines() {
        if let Some(name) = line
            .split_once(": &str = \"")
            .and_then(|(_, rest)| rest.split('"').next())
            .filter(|n| n.starts_with("courier_"))
        {
            names.insert(name.to_string());
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_is_in_the_metrics_reference_and_no_other() {
    let exported = exported_series().await;
    assert!(
        exported.contains("courier_events_delivered_total")
            && exported.contains("process_resident_memory_bytes"),
        "the scrape was read: {exported:?}"
    );
    let page = read("docs/metrics.md");
    let mut documented = BTreeSet::new();
    for line in page.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() >= 4 && cells[1].starts_with('`') {
            let name: String = cells[1]
                .trim_start_matches('`')
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            documented.insert(name);
        }
    }
    // A histogram's `_count` is documented with the histogram.
    let undocumented: Vec<_> = exported
        .iter()
        .filter(|n| {
            !documented.contains(*n)
                && !n
                    .strip_suffix("_count")
                    .is_some_and(|h| documented.contains(h))
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "series without a row in docs/metrics.md: {undocumented:#?}"
    );
    let stale: Vec<_> = documented.difference(&exported).collect();
    assert!(
        stale.is_empty(),
        "rows of docs/metrics.md for series courier does not export: {stale:#?}"
    );
}

/// Files under `dir` ending in `.ext`, leaving out build output and
/// installed packages.
fn walk(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if ![
                    "target",
                    "node_modules",
                    ".venv",
                    ".git",
                    "corpus",
                    "artifacts",
                ]
                .contains(&name.as_str())
                {
                    todo.push(p);
                }
            } else if name.ends_with(&format!(".{ext}")) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn every_link_in_the_docs_resolves_inside_the_repo() {
    let files = walk(&repo(), "md");
    assert!(files.len() >= 10, "the docs were found: {files:?}");
    let mut bad = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        let rel = file
            .strip_prefix(repo())
            .unwrap_or(file)
            .display()
            .to_string();
        for target in links(&text) {
            checked += 1;
            if target.contains("://") || target.starts_with("mailto:") {
                bad.push(format!("{rel}: {target} points outside the repo"));
                continue;
            }
            let (path, frag) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap_or(Path::new(".")).join(path)
            };
            if !dest.exists() {
                bad.push(format!("{rel}: {target}: no such file"));
                continue;
            }
            if !frag.is_empty() {
                let Ok(md) = std::fs::read_to_string(&dest) else {
                    bad.push(format!("{rel}: {target}: an anchor into a folder"));
                    continue;
                };
                if !anchors(&md).contains(frag) {
                    bad.push(format!("{rel}: {target}: no heading has that anchor"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
    assert!(checked >= 50, "only {checked} links were checked");
}

#[test]
fn the_readme_is_short_and_starts_with_the_two_commands() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; the rest goes in docs/"
    );
    let head: String = readme.lines().take(30).collect::<Vec<_>>().join("\n");
    assert!(
        head.contains("run -c config.example.yaml") && head.contains("\n.ci/test "),
        "the first lines give the run and test commands:\n{head}"
    );
}

/// The README's test command is the one script CI runs too, and it runs
/// both halves of the suite, the second even when the first failed.
#[test]
fn ci_runs_the_readmes_test_script_which_runs_both_halves() {
    let ci = read(".ci/run");
    assert!(
        ci.lines()
            .any(|l| matches!(l.trim(), ".ci/test" | "step .ci/test")),
        ".ci/run does not call .ci/test:\n{ci}"
    );
    let script = read(".ci/test");
    for command in [
        "cargo test --profile suite --no-fail-fast || status=1",
        "cargo test --profile suite --test suite -- --ignored disk:: || status=1",
        "exit $status",
    ] {
        assert!(
            script.contains(command),
            ".ci/test lacks `{command}`:\n{script}"
        );
    }
}

#[test]
fn anchors_follow_githubs_rules() {
    assert_eq!(
        anchor(" What happens on a rolling deploy"),
        "what-happens-on-a-rolling-deploy"
    );
    assert_eq!(anchor(" `journal.max_bytes`"), "journalmax_bytes");
    assert_eq!(anchor(" 410 Gone"), "410-gone");
    assert_eq!(
        links("see [a](b.md#c) and `[x](y)` and <https://example.com>"),
        vec!["b.md#c".to_string(), "https://example.com".to_string()]
    );
    assert_eq!(
        links("bare https://example.com/x. and `https://in.code`"),
        vec!["https://example.com/x".to_string()]
    );
    assert_eq!(
        links("[ref]: https://example.com"),
        vec!["https://example.com".to_string()]
    );
}
