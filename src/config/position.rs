//! Where each key path sits in the YAML text, so that errors found after
//! deserialization (ranges, cross-field rules) can still name `line:column`.
//! serde gives positions only for the first structural error; this index is
//! built from the parser's events and covers every value.

use saphyr_parser::{Event, Parser};
use std::collections::HashMap;

/// 1-based line and column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

#[derive(Default)]
pub struct PositionIndex {
    values: HashMap<String, Pos>,
}

enum Frame {
    Map { path: String, key: Option<String> },
    Seq { path: String, next: usize },
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
                    if let Some(Frame::Map { key, .. }) = stack.last_mut()
                        && key.is_none()
                    {
                        *key = Some(value.into_owned());
                        continue;
                    }
                    let path = child_path(&mut stack);
                    index.values.entry(path).or_insert(pos);
                }
                Event::MappingStart(..) => {
                    let path = child_path(&mut stack);
                    index.values.entry(path.clone()).or_insert(pos);
                    stack.push(Frame::Map { path, key: None });
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
        Some(Frame::Map { path, key }) => {
            let k = key.take().unwrap_or_default();
            if path.is_empty() {
                k
            } else {
                format!("{path}.{k}")
            }
        }
        Some(Frame::Seq { path, next }) => {
            let p = format!("{path}[{next}]");
            *next += 1;
            p
        }
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
}
