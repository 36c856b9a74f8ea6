//! What the CLI prints for people and for scripts. Everything goes through
//! `say!`, [`print_table`] or [`print_json`], which escape control characters:
//! names, errors and contexts come from documents, and documents are hostile input
//! (see [`crate::printable`]).

/// `println!`, with control characters escaped.
macro_rules! say {
    ($($t:tt)*) => {
        println!("{}", $crate::printable::escape(&format!($($t)*)))
    };
}

pub(crate) use crate::pool::view::{age, int, text};

/// Prints rows as aligned columns under a header, each cell escaped once.
pub(super) fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| crate::printable::escape(c).into_owned())
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{:<w$}  ", c, w = widths[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Prints a value as pretty JSON on stdout.
pub(super) fn print_json(v: &impl serde::Serialize) {
    let text = serde_json::to_string_pretty(v).unwrap_or_default();
    println!("{}", crate::printable::escape_json(&text));
}
