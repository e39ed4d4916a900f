//! Every structural error of a file in one run. serde stops at the first, so
//! the file is read into a loose tree (duplicate keys tolerated, the first
//! kept: `position` reports them), then deserialized again and again: each
//! error is recorded and the node it names cut out of the tree, until the rest
//! deserializes. The serde structs stay the one source of truth for the
//! allowed keys and types; there is no second list to drift.
//!
//! What it cannot do: an error inside a list cuts the whole list, so a second
//! bad item of the same list is only reported on the next run; a missing
//! required key cuts the mapping that lacks it, hiding that mapping's other
//! errors; a syntax error stops everything; and a file of many wrong keys
//! stops after a dozen errors or so (`REREAD_BUDGET`).

use serde::de::{self, Deserialize, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_norway::{Mapping, Number, Value};
use serde_path_to_error::Segment;
use std::fmt;

/// One structural error: the key path it names, the path whose position
/// locates it (an unknown key is shown at the key, named by its parent).
pub struct Found {
    pub path: String,
    pub locate: String,
    pub at_key: bool,
    pub message: String,
}

pub struct Structure<T> {
    /// The file with every bad node cut out, if the rest could be read.
    pub value: Option<T>,
    pub errors: Vec<Found>,
    /// Paths cut because their value was wrong or incomplete: later problems
    /// at, under or above them are consequences (a default stood in).
    pub cut: Vec<String>,
}

/// A bound on re-reads, far above what a hand-written file holds.
const MAX_ERRORS: usize = 200;

/// A bound on the bytes re-read, so that the work stays linear in the
/// file's size: a hand-written file (~10 KiB) meets `MAX_ERRORS` first,
/// while a file of a megabyte of wrong keys stops after a dozen errors
/// instead of re-reading a megabyte two hundred times.
const REREAD_BUDGET: usize = 12 << 20;

/// Reads `text` as `T`, collecting every structural error; `Err` only for a
/// YAML syntax error.
pub fn read<T: DeserializeOwned>(text: &str) -> Result<Structure<T>, serde_norway::Error> {
    let mut tree = match serde_norway::from_str::<Loose>(text)?.0 {
        Value::Null => Value::Mapping(Mapping::new()),
        tree => tree,
    };
    let mut found = Structure {
        value: None,
        errors: Vec::new(),
        cut: Vec::new(),
    };
    let mut reread = 0;
    while found.errors.len() < MAX_ERRORS && reread < REREAD_BUDGET {
        let again = serde_norway::to_string(&tree)?;
        reread += again.len();
        let err =
            match serde_path_to_error::deserialize(serde_norway::Deserializer::from_str(&again)) {
                Ok(value) => {
                    found.value = Some(value);
                    break;
                }
                Err(err) => err,
            };
        let segments: Vec<Segment> = err.path().iter().cloned().collect();
        let message = bare_message(&segments, &err.inner().to_string());
        // Only map keys can be cut one by one: a list is cut whole.
        let cuttable = segments
            .iter()
            .take_while(|s| matches!(s, Segment::Map { .. }))
            .count();
        let target = &segments[..cuttable];
        let full = render(&segments);
        if message.starts_with("unknown field ") {
            found.errors.push(Found {
                path: render(&segments[..segments.len().saturating_sub(1)]),
                locate: full,
                at_key: true,
                message: super::messages::humanize(&message),
            });
        } else {
            let missing = message
                .strip_prefix("missing field `")
                .and_then(|m| m.strip_suffix('`'))
                .map(|key| join(&full, key));
            // A required key cut for its bad value: already reported.
            if !missing.is_some_and(|m| found.cut.contains(&m)) {
                found.errors.push(Found {
                    path: full.clone(),
                    locate: full,
                    at_key: false,
                    message: super::messages::humanize(&message),
                });
            }
            found.cut.push(render(target));
        }
        if !cut(&mut tree, target) {
            break;
        }
    }
    Ok(found)
}

/// serde_norway's message without the path it puts in front (its own, which
/// may stop short of ours) and the position it puts behind (of the re-read
/// text, meaningless to the user).
fn bare_message(segments: &[Segment], msg: &str) -> String {
    let msg = msg.rfind(" at line ").map_or(msg, |cut| &msg[..cut]);
    (1..=segments.len())
        .rev()
        .find_map(|n| msg.strip_prefix(&format!("{}: ", render(&segments[..n]))))
        .unwrap_or(msg)
        .to_string()
}

/// A key path as messages and `PositionIndex` write it: `a.b[2].c`.
fn render(segments: &[Segment]) -> String {
    let mut path = String::new();
    for s in segments {
        match s {
            Segment::Map { key } | Segment::Enum { variant: key } => path = join(&path, key),
            Segment::Seq { index } => path.push_str(&format!("[{index}]")),
            Segment::Unknown => break,
        }
    }
    path
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// Removes the node at `path` (map keys only); false if there is none, or
/// the path is the whole file: nothing more can be learned then.
fn cut(tree: &mut Value, path: &[Segment]) -> bool {
    let Some((Segment::Map { key: last }, parents)) = path.split_last() else {
        return false;
    };
    let mut node = tree;
    for s in parents {
        let Segment::Map { key } = s else {
            return false;
        };
        let Some(next) = node.as_mapping_mut().and_then(|m| entry(m, key)) else {
            return false;
        };
        node = next;
    }
    let Some(map) = node.as_mapping_mut() else {
        return false;
    };
    let Some(k) = map
        .keys()
        .find(|k| key_text(k).as_deref() == Some(last))
        .cloned()
    else {
        return false;
    };
    map.shift_remove(&k).is_some()
}

fn entry<'a>(map: &'a mut Mapping, key: &str) -> Option<&'a mut Value> {
    map.iter_mut()
        .find(|(k, _)| key_text(k).as_deref() == Some(key))
        .map(|(_, v)| v)
}

/// A key as serde_path_to_error names it.
fn key_text(key: &Value) -> Option<String> {
    match key {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Any YAML value, with a key given twice kept at its first value (where
/// serde_norway's `Value` refuses the whole file).
struct Loose(Value);

impl<'de> Deserialize<'de> for Loose {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LooseVisitor).map(Loose)
    }
}

struct LooseVisitor;

impl<'de> Visitor<'de> for LooseVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(Number::from(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(Number::from(v)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Number(Number::from(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Loose::deserialize(d).map(|l| l.0)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Loose(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Sequence(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut m = Mapping::new();
        while let Some(Loose(k)) = map.next_key()? {
            let Loose(v) = map.next_value()?;
            if !m.contains_key(&k) {
                m.insert(k, v);
            }
        }
        Ok(Value::Mapping(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        url: String,
        #[serde(default)]
        n: u32,
        #[serde(default)]
        list: Vec<String>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        #[serde(default)]
        d: std::collections::BTreeMap<String, Inner>,
    }

    fn read_outer(text: &str) -> Structure<Outer> {
        read(text).expect("no syntax error")
    }

    #[test]
    fn reports_every_error_and_reads_the_rest() {
        let s = read_outer(
            "d:\n  a: { url: x, nn: 1 }\n  b: { url: y, n: many, list: [1, [2]] }\n  c: { url: z }\n  c: { url: w }\nzz: 1\n",
        );
        let seen: Vec<(&str, &str, &str)> = s
            .errors
            .iter()
            .map(|f| (f.path.as_str(), f.locate.as_str(), f.message.as_str()))
            .collect();
        assert_eq!(
            seen,
            vec![
                (
                    "d.a",
                    "d.a.nn",
                    "unknown key `nn`; expected one of url, n, list"
                ),
                ("d.b.n", "d.b.n", "expected a whole number, found \"many\""),
                (
                    "d.b.list[1]",
                    "d.b.list[1]",
                    "expected a string, found a list"
                ),
                ("", "zz", "unknown key `zz`; expected d"),
            ]
        );
        let value = s.value.expect("the rest is read");
        assert_eq!(value.d["c"].url, "z");
        assert_eq!(value.d["b"].n, 0);
        assert!(value.d["b"].list.is_empty());
        assert_eq!(s.cut, vec!["d.b.n", "d.b.list"]);
    }

    #[test]
    fn a_bad_required_value_is_reported_once() {
        let s = read_outer("d:\n  a: { url: [x] }\n  b: {}\n");
        let seen: Vec<(&str, &str)> = s
            .errors
            .iter()
            .map(|f| (f.path.as_str(), f.message.as_str()))
            .collect();
        assert_eq!(
            seen,
            vec![
                ("d.a.url", "expected a string, found a list"),
                ("d.b", "missing key `url`"),
            ]
        );
        assert!(s.value.expect("the rest").d.is_empty());
    }

    #[test]
    fn a_wrong_shape_for_the_whole_file_stops_with_one_error() {
        let s = read_outer("- 1\n");
        assert_eq!(s.errors.len(), 1);
        assert_eq!(s.errors[0].message, "expected a mapping, found a list");
        assert!(s.value.is_none());
    }
}
