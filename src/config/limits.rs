//! The file's size and nesting, checked before anything else reads it: the
//! checks that follow (positions, structure, serde) are not linear in a
//! hostile file's depth, and a config is read again on every reload, so a
//! ConfigMap written by mistake or malice must be refused at once rather
//! than stall `run`, `check` or a reload.

use super::position::Pos;
use saphyr_parser::{Event, Parser};

/// Far above any real config (the example with every key is ~9 KiB).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Mappings and lists inside each other; the deepest key of the config is
/// at depth 6 (`destinations.x.retry.schedule.exponential.initial`).
pub const MAX_DEPTH: usize = 32;

/// Why a file was refused before it was parsed.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    TooLarge(u64),
    TooDeep(Pos),
}

impl Refused {
    pub fn message(&self) -> String {
        match self {
            Refused::TooLarge(n) => format!(
                "the file is {n} bytes: a config file is at most {MAX_FILE_BYTES} bytes (1 MiB)"
            ),
            Refused::TooDeep(_) => format!(
                "mappings and lists nest deeper than {MAX_DEPTH} levels here: a config file nests at most {MAX_DEPTH}"
            ),
        }
    }
}

/// Refuses a text over the size limit, or one whose nesting passes the
/// depth limit (stopping at the first node that does, so the work is
/// bounded by the limit, not by the file). A syntax error is left to the
/// parse that follows, which reports it with its position.
pub fn check(text: &str) -> Result<(), Refused> {
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(Refused::TooLarge(text.len() as u64));
    }
    let mut depth = 0usize;
    for item in Parser::new_from_str(text) {
        let (event, span) = match item {
            Ok(item) => item,
            // The scanner reads ahead, and gives up on deep flow nesting
            // (a few hundred levels) before its events reach the limit here;
            // its error has no kind to match but its text.
            Err(e) if e.info().contains("recursion limit") => {
                return Err(Refused::TooDeep(Pos {
                    line: e.marker().line(),
                    col: e.marker().col() + 1,
                }));
            }
            Err(_) => break,
        };
        match event {
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(Refused::TooDeep(Pos {
                        line: span.start.line(),
                        col: span.start.col() + 1,
                    }));
                }
            }
            Event::MappingEnd | Event::SequenceEnd => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deep_file_is_refused_where_it_passes_the_limit() {
        let deep = format!("a: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
        assert!(
            matches!(check(&deep), Err(Refused::TooDeep(p)) if p.line == 1),
            "{:?}",
            check(&deep)
        );
        let forty = format!("a: {}{}\n", "[".repeat(40), "]".repeat(40));
        assert_eq!(
            check(&forty),
            Err(Refused::TooDeep(Pos {
                line: 1,
                col: 4 + MAX_DEPTH - 1
            }))
        );
        let block: String = (0..40)
            .map(|i| format!("{}k{i}:\n", "  ".repeat(i)))
            .collect();
        assert!(matches!(check(&block), Err(Refused::TooDeep(p)) if p.line == MAX_DEPTH + 1));
        let fits = format!(
            "a: {}{}\n",
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert_eq!(check(&fits), Ok(()));
    }

    #[test]
    fn a_large_file_is_refused_whatever_it_holds() {
        let comment = format!("#{}\n", "x".repeat(MAX_FILE_BYTES as usize));
        assert_eq!(check(&comment), Err(Refused::TooLarge(MAX_FILE_BYTES + 2)));
        let fits = format!("#{}\n", "x".repeat(MAX_FILE_BYTES as usize - 2));
        assert_eq!(check(&fits), Ok(()));
    }
}
