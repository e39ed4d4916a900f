//! The top-level modules of `src/` import each other without cycles: a
//! module that imports one that imports it back cannot be understood, or
//! tested, alone (issue #31: `metrics` a leaf, `config` below `admin` and
//! `ingress`). Read from the source, as `crate::` paths outside comments.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

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

fn without_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.split_once("//").map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
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
        edges.extend(
            imports(&without_comments(&text))
                .into_iter()
                .filter(|m| *m != top),
        );
    }
    graph
}

/// A cycle through `graph`'s edges, as the modules along it, if any.
fn cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit<'a>(
        graph: &'a Graph,
        at: &'a str,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|m| *m == at) {
            let mut ring: Vec<String> = path[i..].iter().map(|m| m.to_string()).collect();
            ring.push(at.to_string());
            return Some(ring);
        }
        if done.contains(at) {
            return None;
        }
        path.push(at);
        for next in graph.get(at).into_iter().flatten() {
            if let Some(ring) = visit(graph, next, path, done) {
                return Some(ring);
            }
        }
        path.pop();
        done.insert(at);
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(graph, m, &mut Vec::new(), &mut done))
}

#[test]
fn top_level_modules_import_each_other_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    assert!(
        graph.get("journal").is_some_and(|m| m.contains("metrics")),
        "the reader finds no imports (journal uses metrics): {graph:?}"
    );
    if let Some(ring) = cycle(&graph) {
        panic!("import cycle: {}", ring.join(" -> "));
    }
    assert!(
        graph.get("metrics").is_none_or(BTreeSet::is_empty),
        "metrics is a leaf, yet imports {:?}",
        graph.get("metrics")
    );
}

#[test]
fn the_reader_sees_grouped_imports_and_finds_a_cycle() {
    let code = "use crate::{a::x, b::{c, d}, e};\nlet v = crate::f::g();\nmy_crate::h();";
    assert_eq!(
        imports(code),
        ["a", "b", "e", "f"].map(String::from).into_iter().collect()
    );
    let mut graph = Graph::new();
    for (from, to) in [
        ("admin", "journal"),
        ("journal", "metrics"),
        ("metrics", "admin"),
    ] {
        graph.entry(from.into()).or_default().insert(to.into());
    }
    assert_eq!(
        cycle(&graph).map(|r| r.join(" -> ")),
        Some("admin -> journal -> metrics -> admin".into())
    );
    graph.remove("metrics");
    assert_eq!(cycle(&graph), None);
}
