//! Where each key path sits in the YAML text, so that every error (structural
//! or found after deserialization) can name `line:column`: serde's own
//! positions are lost once the tree is re-read after pruning (see `structure`).
//! Built from the parser's events, it also finds keys given twice in one
//! mapping, which serde would silently resolve (the last wins).

use saphyr_parser::{Event, Parser};
use std::collections::HashMap;

/// 1-based line and column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

/// A key written twice in one mapping: where, and where it was first given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Duplicate {
    pub path: String,
    pub at: Pos,
    pub first: Pos,
}

#[derive(Default)]
pub struct PositionIndex {
    values: HashMap<String, Pos>,
    keys: HashMap<String, Pos>,
    pub duplicates: Vec<Duplicate>,
}

enum Frame {
    Map {
        path: String,
        key: Option<String>,
        seen: HashMap<String, Pos>,
    },
    Seq {
        path: String,
        next: usize,
    },
}

impl PositionIndex {
    /// Indexes `text`; on a YAML syntax error the index is simply partial
    /// (serde reports the syntax error itself).
    pub fn build(text: &str) -> Self {
        let mut index = PositionIndex::default();
        let mut stack: Vec<Frame> = Vec::new();
        for item in Parser::new_from_str(text) {
            let Ok((event, span)) = item else { break };
            let pos = Pos {
                line: span.start.line(),
                col: span.start.col() + 1,
            };
            match event {
                Event::Scalar(value, ..) => {
                    if let Some(Frame::Map { path, key, seen }) = stack.last_mut()
                        && key.is_none()
                    {
                        let full = join(path, &value);
                        match seen.get(value.as_ref()) {
                            Some(&first) => index.duplicates.push(Duplicate {
                                path: full,
                                at: pos,
                                first,
                            }),
                            None => {
                                seen.insert(value.to_string(), pos);
                                index.keys.entry(full).or_insert(pos);
                            }
                        }
                        *key = Some(value.into_owned());
                        continue;
                    }
                    let path = child_path(&mut stack);
                    index.values.entry(path).or_insert(pos);
                }
                Event::MappingStart(..) => {
                    let path = child_path(&mut stack);
                    index.values.entry(path.clone()).or_insert(pos);
                    stack.push(Frame::Map {
                        path,
                        key: None,
                        seen: HashMap::new(),
                    });
                }
                Event::SequenceStart(..) => {
                    let path = child_path(&mut stack);
                    index.values.entry(path.clone()).or_insert(pos);
                    stack.push(Frame::Seq { path, next: 0 });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                }
                Event::Alias(_) => {
                    let _ = child_path(&mut stack);
                }
                _ => {}
            }
        }
        index
    }

    /// The position of the key that ends `path` (where an unknown key is
    /// reported), else that of its value.
    pub fn find_key(&self, path: &str) -> Option<Pos> {
        self.keys.get(path).copied().or_else(|| self.find(path))
    }

    /// The position of `path`, or of its nearest written ancestor (a missing
    /// key is reported where its parent is).
    pub fn find(&self, path: &str) -> Option<Pos> {
        let mut p = path;
        loop {
            if let Some(pos) = self.values.get(p) {
                return Some(*pos);
            }
            let cut = p.rfind(['.', '['])?;
            p = &p[..cut];
        }
    }
}

/// The path of the value that starts now, consuming the pending map key.
fn child_path(stack: &mut [Frame]) -> String {
    match stack.last_mut() {
        None => String::new(),
        Some(Frame::Map { path, key, .. }) => join(path, &key.take().unwrap_or_default()),
        Some(Frame::Seq { path, next }) => {
            let p = format!("{path}[{next}]");
            *next += 1;
            p
        }
    }
}

/// `parent.key`, or `key` at the top level: the form serde's paths take.
fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nested_keys_list_items_and_falls_back_to_parents() {
        let text = "listen: 1.2.3.4:1\ndestinations:\n  orders:\n    url: http://x\n    retry:\n      schedule: [5s, 1m]\n      max_attempts: 99\n";
        let idx = PositionIndex::build(text);
        assert_eq!(idx.find("listen"), Some(Pos { line: 1, col: 9 }));
        assert_eq!(
            idx.find("destinations.orders.retry.max_attempts"),
            Some(Pos { line: 7, col: 21 })
        );
        assert_eq!(
            idx.find("destinations.orders.retry.schedule[1]"),
            Some(Pos { line: 6, col: 22 })
        );
        assert_eq!(
            idx.find("destinations.orders.timeout"),
            Some(Pos { line: 4, col: 5 })
        );
    }

    #[test]
    fn finds_keys_given_twice_with_both_positions() {
        let text = "a: 1\nd:\n  x: { u: 1, u: 2 }\n  x: {}\na: 3\n";
        let idx = PositionIndex::build(text);
        let at = |line, col| Pos { line, col };
        assert_eq!(
            idx.duplicates,
            vec![
                Duplicate {
                    path: "d.x.u".into(),
                    at: at(3, 14),
                    first: at(3, 8)
                },
                Duplicate {
                    path: "d.x".into(),
                    at: at(4, 3),
                    first: at(3, 3)
                },
                Duplicate {
                    path: "a".into(),
                    at: at(5, 1),
                    first: at(1, 1)
                },
            ]
        );
        assert_eq!(idx.find_key("d.x"), Some(at(3, 3)));
        assert_eq!(idx.find("d.x"), Some(at(3, 6)));
    }
}
