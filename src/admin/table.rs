//! The CLI's plain text tables: columns as wide as their widest cell, two
//! spaces apart, no borders, so that `grep`, `awk` and an operator's eye
//! read them alike. Laid out by `comfy-table`, which measures cells by
//! their display width.

use comfy_table::{CellAlignment, Table, presets};

/// `rows` under `head`; the columns in `right` are aligned right (numbers).
pub fn render(head: &[&str], rows: Vec<Vec<String>>, right: &[usize]) -> String {
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    t.set_header(head.to_vec());
    for row in rows {
        t.add_row(row);
    }
    for (i, column) in t.column_iter_mut().enumerate() {
        column.set_padding((0, 2));
        if right.contains(&i) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    let mut out = t.trim_fmt();
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_two_spaces_apart_and_numbers_align_right() {
        let rows = vec![
            vec!["orders".to_string(), "5".to_string(), "x".to_string()],
            vec![
                "a-long-destination".to_string(),
                "12345".to_string(),
                String::new(),
            ],
        ];
        let t = render(&["destination", "pending", "note"], rows, &[1]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "destination         pending  note");
        assert_eq!(lines[1], "orders                    5  x");
        assert_eq!(lines[2], "a-long-destination    12345");
        assert!(t.ends_with('\n'));
    }
}
