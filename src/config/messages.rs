//! serde's messages in the words of the config file, in one place: a user
//! reads "a whole number" and "a list", never `u32`, `struct Journal` or
//! "a sequence". Messages courier wrote itself (durations, sizes, ranges)
//! pass through unchanged.

/// `msg` as serde_norway wrote it, without its path and position.
pub fn humanize(msg: &str) -> String {
    if let Some(rest) = msg.strip_prefix("unknown field ") {
        return choice("unknown key", rest);
    }
    if let Some(rest) = msg.strip_prefix("unknown variant ") {
        return choice("unknown value", rest);
    }
    if let Some(rest) = msg.strip_prefix("missing field ") {
        return format!("missing key {rest}");
    }
    if let Some(name) = msg.strip_prefix("data did not match any variant of untagged enum ") {
        return format!("expected {}", untagged(name));
    }
    let shape = msg
        .strip_prefix("invalid type: ")
        .or_else(|| msg.strip_prefix("invalid value: "));
    if let Some((found, expected)) = shape.and_then(|s| s.split_once(", expected ")) {
        return format!(
            "expected {}, found {}",
            expected_words(expected),
            found_words(found)
        );
    }
    msg.to_string()
}

/// `unknown key `x`; expected one of a, b, c` from serde's
/// "`x`, expected one of `a`, `b`, `c`" (or "expected `a` or `b`").
fn choice(what: &str, rest: &str) -> String {
    let (given, allowed) = rest.split_once(", ").unwrap_or((rest, ""));
    let names: Vec<&str> = allowed.split('`').skip(1).step_by(2).collect();
    match names.as_slice() {
        [] => format!("{what} {given}; nothing is allowed here"),
        [one] => format!("{what} {given}; expected {one}"),
        _ => format!("{what} {given}; expected one of {}", names.join(", ")),
    }
}

/// What a value should have been, from serde's `expected ...` (a Rust type
/// name or a visitor's `expecting` text).
fn expected_words(expected: &str) -> &str {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" | "i8" | "i16" | "i32" | "i64" | "i128"
        | "isize" => "a whole number",
        "f32" | "f64" => "a number",
        "a boolean" => "true or false",
        "a string" | "a borrowed string" | "a character" => "a string",
        "a sequence" => "a list",
        "a map" => "a mapping",
        e if e.starts_with("struct ") => "a mapping",
        // An enum of words (`mode`, `schema`, ...) given a list or mapping.
        e if e.starts_with("enum ") || e.contains("YAML tag") || e.contains("Tagged") => {
            "a single word"
        }
        e if looks_rusty(e) => "a value of another kind",
        e => e,
    }
}

/// What was given, from serde's `invalid type: ...`.
fn found_words(found: &str) -> String {
    if let Some(s) = found.strip_prefix("string ") {
        return s.to_string();
    }
    for prefix in ["integer ", "floating point ", "boolean "] {
        if let Some(v) = found.strip_prefix(prefix) {
            return v.to_string();
        }
    }
    match found {
        "sequence" => "a list",
        "map" => "a mapping",
        "unit value" | "unit" | "Option value" => "nothing",
        _ => "a value of another kind",
    }
    .to_string()
}

/// The untagged enums of `schema`, by the shapes they take.
fn untagged(name: &str) -> &'static str {
    match name {
        "StatusKey" => "a status code like 404, 5xx or 500-599",
        _ => "a value of another shape",
    }
}

fn looks_rusty(s: &str) -> bool {
    [
        "struct", "enum", "Option", "Vec", "sequence", "u32", "u64", "usize",
    ]
    .iter()
    .any(|w| s.contains(w))
}

#[cfg(test)]
mod tests {
    use super::humanize;

    #[test]
    fn rust_words_become_the_config_files_words() {
        let cases = [
            (
                "invalid type: string \"x\", expected u32",
                "expected a whole number, found \"x\"",
            ),
            (
                "invalid value: integer `-1`, expected u64",
                "expected a whole number, found `-1`",
            ),
            (
                "invalid type: string \"x\", expected f64",
                "expected a number, found \"x\"",
            ),
            (
                "invalid type: map, expected a sequence",
                "expected a list, found a mapping",
            ),
            (
                "invalid type: sequence, expected struct Journal",
                "expected a mapping, found a list",
            ),
            (
                "invalid type: integer `3`, expected a map",
                "expected a mapping, found `3`",
            ),
            (
                "invalid type: string \"yes\", expected a boolean",
                "expected true or false, found \"yes\"",
            ),
            (
                "invalid type: unit value, expected a string",
                "expected a string, found nothing",
            ),
            (
                "invalid type: sequence, expected a YAML tag starting with '!'",
                "expected a single word, found a list",
            ),
            (
                "unknown field `timout`, expected one of `url`, `mode`, `timeout`",
                "unknown key `timout`; expected one of url, mode, timeout",
            ),
            (
                "unknown field `y`, expected `x`",
                "unknown key `y`; expected x",
            ),
            (
                "unknown variant `xml`, expected `text` or `json`",
                "unknown value `xml`; expected one of text, json",
            ),
            ("missing field `url`", "missing key `url`"),
            (
                "invalid duration `soon`: expected a number",
                "invalid duration `soon`: expected a number",
            ),
        ];
        for (serde, ours) in cases {
            assert_eq!(humanize(serde), ours, "{serde}");
        }
    }
}
