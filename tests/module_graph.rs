//! The top-level modules of `src/` import each other in one direction:
//! each belongs to a layer of `LAYERS`, and imports only modules of the
//! layers below its own. A module that imports one that imports it back
//! cannot be understood, or tested, alone (issue #31), and an import that
//! points up (say `ingress` → `admin`) is how the next cycle starts (issue
//! #45). Read from the source, as `crate::` paths outside comments and
//! literals; docs/architecture.md shows the same layers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Lowest first. A new top-level module must be placed here.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "leaves: no import of the crate",
        &[
            "clock",
            "event",
            "file_modes",
            "lifecycle",
            "metrics",
            "seal",
            "tls",
        ],
    ),
    (
        "pure rules and plain edges",
        &["ids", "policy", "server", "storage"],
    ),
    ("the config", &["config"]),
    (
        "what the config drives",
        &["history", "logging", "telemetry"],
    ),
    ("the journal", &["journal"]),
    ("what reads the journal", &["deadletter"]),
    ("delivery and hand-off", &["deliver", "handoff"]),
    (
        "the app's and the operator's edges",
        &["admin", "ingress", "reload"],
    ),
    (
        "the start, and the fuzz targets' door",
        &["fuzzing", "no_room"],
    ),
];

/// Items of the crate root that modules may name: unit tests' helpers.
const ROOT_ITEMS: &[&str] = &["test_headers"];

/// `code` with comments, string, byte-string, raw-string and char
/// literals blanked out (newlines kept), so that neither `"http://x"` nor
/// `"crate::a"` nor `/* crate::b */` is read as code.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    // Blanks b[from..to], keeping newlines.
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        out.extend(
            b[from..to]
                .iter()
                .map(|&c| if c == b'\n' { c } else { b' ' }),
        );
    };
    while i < b.len() {
        let rest = &b[i..];
        let after_ident = i > 0 && ident(b[i - 1]);
        if rest.starts_with(b"//") {
            let end = rest
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            // Block comments nest in Rust.
            let (mut depth, mut j) = (0usize, i);
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if let Some(end) = (!after_ident).then(|| raw_string_end(b, i)).flatten() {
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(b.len());
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\''), or a lifetime ('a), which
            // has no closing quote and is kept.
            let end = if rest.get(1) == Some(&b'\\') {
                rest.iter()
                    .skip(3)
                    .position(|&c| c == b'\'')
                    .map(|n| i + 4 + n)
            } else {
                // The width of the UTF-8 char after the quote.
                let len = match rest.get(1) {
                    Some(0xC0..=0xDF) => 2,
                    Some(0xE0..=0xEF) => 3,
                    Some(0xF0..) => 4,
                    _ => 1,
                };
                (rest.get(1 + len) == Some(&b'\'')).then_some(i + 2 + len)
            };
            match end {
                Some(end) => {
                    blank(&mut out, i, end);
                    i = end;
                }
                None => {
                    out.push(b[i]);
                    i += 1;
                }
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where a raw string literal (`r"…"`, `r#"…"#`, `br##"…"##`) that starts
/// at `i` ends, if one does.
fn raw_string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i;
    if b.get(j) == Some(&b'b') {
        j += 1;
    }
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = b[j..].iter().take_while(|&&c| c == b'#').count();
    j += hashes;
    if b.get(j) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    let from = j + 1;
    b[from..]
        .windows(close.len())
        .position(|w| w == close.as_slice())
        .map(|n| from + n + close.len())
        .or(Some(b.len()))
}

/// `crate::name` and each `name` of `crate::{name, other::x, ...}` in `code`.
fn imports(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        // Not `foo_crate::`: the path must start here.
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 1 => break,
                    '}' => depth -= 1,
                    ',' if depth == 1 => start = true,
                    c if c.is_whitespace() => {}
                    _ if start && depth == 1 => {
                        found.insert(ident(&group[i..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            found.insert(ident(rest));
        }
    }
    found.retain(|m| !m.is_empty() && m != "self");
    found
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Each top-level module and what it imports: other modules, or items of
/// the crate root.
fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("under src");
        let first = rel.components().next().expect("a component");
        let top = Path::new(first.as_os_str())
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        // The crate root wires everything together; it is no module.
        if top == "lib" || top == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        let edges = graph.entry(top.clone()).or_default();
        edges.extend(imports(&code_only(&text)).into_iter().filter(|m| *m != top));
    }
    graph
}

/// Every import against `layers`: `(from, to, why)`.
fn against(graph: &Graph, layers: &[(&str, &[&str])]) -> Vec<String> {
    let layer_of = |m: &str| layers.iter().position(|(_, ms)| ms.contains(&m));
    let mut wrong = Vec::new();
    for (from, tos) in graph {
        let Some(at) = layer_of(from) else {
            wrong.push(format!(
                "{from}: a top-level module in no layer: place it in LAYERS"
            ));
            continue;
        };
        for to in tos {
            match layer_of(to) {
                None if graph.contains_key(to) => {
                    wrong.push(format!("{from} -> {to}: {to} is in no layer"))
                }
                None if ROOT_ITEMS.contains(&to.as_str()) => {}
                None => wrong.push(format!(
                    "{from} -> {to}: imports the crate root, which is above every module"
                )),
                Some(l) if l >= at => wrong.push(format!(
                    "{from} -> {to}: `{}` may import only layers below it, and {to} is in `{}`",
                    layers[at].0, layers[l].0
                )),
                Some(_) => {}
            }
        }
    }
    wrong
}

#[test]
fn top_level_modules_import_only_the_layers_below_their_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    assert!(
        graph.get("journal").is_some_and(|m| m.contains("metrics")),
        "the reader finds no imports (journal uses metrics): {graph:?}"
    );
    let wrong = against(&graph, LAYERS);
    assert!(
        wrong.is_empty(),
        "imports against tests/module_graph.rs's LAYERS:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_reader_skips_comments_and_literals_and_sees_grouped_imports() {
    let code = r####"use crate::{a::x, b::{c, d}, e};
let v = crate::f::g(); my_crate::h();
let url = "http://example"; crate::i::j();
let s = "crate::no1 \" crate::no2"; /* crate::no3 /* nested */ crate::no4 */
let r = r#"crate::no5 " crate::no6"#; let q = br##"crate::no7"##;
fn f<'a>(x: &'a str) -> char { let c = '"'; crate::k::l(); '\'' }
// crate::no8
let e = '\\'; crate::m();"####;
    assert_eq!(
        imports(&code_only(code)),
        ["a", "b", "e", "f", "i", "k", "m"]
            .map(String::from)
            .into_iter()
            .collect()
    );
}

#[test]
fn an_import_against_the_order_is_refused() {
    const TEST_LAYERS: &[(&str, &[&str])] = &[
        ("low", &["metrics"]),
        ("middle", &["journal"]),
        ("high", &["admin", "ingress"]),
    ];
    let mut graph = Graph::new();
    for (from, to) in [
        ("admin", "journal"),
        ("journal", "metrics"),
        ("ingress", "journal"),
    ] {
        graph.entry(from.into()).or_default().insert(to.into());
    }
    graph.entry("metrics".into()).or_default();
    assert_eq!(against(&graph, TEST_LAYERS), Vec::<String>::new());
    // Up, sideways, into the root, and a module placed nowhere.
    for (from, to) in [
        ("journal", "admin"),
        ("ingress", "admin"),
        ("metrics", "run"),
        ("newcomer", "metrics"),
    ] {
        let mut g = graph.clone();
        g.entry(from.into()).or_default().insert(to.into());
        let wrong = against(&g, TEST_LAYERS);
        assert_eq!(wrong.len(), 1, "{from} -> {to}: {wrong:?}");
        assert!(wrong[0].starts_with(from), "{wrong:?}");
    }
}
