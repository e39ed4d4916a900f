//! Markdown as the repository's documents use it: the anchors GitHub
//! gives headings, and the link targets outside code, for the checks that
//! every link resolves (`tests/suite/docs.rs`, `tests/suite/monitoring.rs`).

use std::collections::BTreeSet;

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_`
/// dropped, spaces as `-`.
pub fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

pub fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of `[text](target)` links outside code.
pub fn links(markdown: &str) -> Vec<String> {
    let mut fenced = false;
    // Inside an inline code span, which may go on over a line break (but
    // not past the paragraph's end).
    let mut code = false;
    let mut out = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if line.trim().is_empty() {
            code = false;
        }
        // Inline code is not a link.
        let mut prose = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i > 0 {
                code = !code;
            }
            if !code {
                prose.push_str(part);
                prose.push(' ');
            }
        }
        for (i, _) in prose.match_indices("](") {
            if let Some(end) = prose[i + 2..].find(')') {
                out.push(prose[i + 2..i + 2 + end].to_string());
            }
        }
        for (i, _) in prose.match_indices("<http") {
            out.push(prose[i + 1..].split('>').next().unwrap_or("").to_string());
        }
        // Reference-style definitions: `[name]: target`.
        if let Some(target) = line
            .strip_prefix('[')
            .and_then(|l| l.split_once("]: "))
            .map(|(_, t)| t.trim())
        {
            out.push(target.to_string());
            continue;
        }
        // Bare URLs, which renderers turn into links too.
        for word in prose.split_whitespace() {
            if word.starts_with("http://") || word.starts_with("https://") {
                out.push(word.trim_end_matches(['.', ',', ')', ';']).to_string());
            }
        }
    }
    out
}
