//! Aligned text tables and readable timestamps for the human output.

use awareness_core::Timestamp;

/// Renders rows under headers, each column as wide as its widest cell, two spaces apart. A
/// cell's control characters and line separators print as spaces: a row another writer left,
/// or a hand edit, can hold a line break that would forge a row, or a terminal escape.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let cleaned: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|cell| awareness_core::validate::on_one_line(cell).collect())
                .collect()
        })
        .collect();
    let rows = cleaned.as_slice();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            out.push_str(cell);
            if i + 1 < widths.len() {
                out.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = line(&mut headers.iter().copied());
    out.push('\n');
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
        out.push('\n');
    }
    out
}

/// `YYYY-MM-DD HH:MM:SS.mmmZ` in UTC ([`Timestamp::utc`]).
pub fn time(t: Timestamp) -> String {
    t.utc()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc() {
        assert_eq!(time(Timestamp(951_782_400_123)), "2000-02-29 00:00:00.123Z");
    }

    #[test]
    fn tables_align() {
        let t = render(
            &["a", "bb"],
            &[
                vec!["long".into(), "x".into()],
                vec!["s".into(), "yy".into()],
            ],
        );
        assert_eq!(t, "a     bb\nlong  x\ns     yy\n");
    }

    /// A cell holding a line break or a terminal escape stays on its row, as spaces.
    #[test]
    fn cells_keep_to_their_row() {
        let t = render(
            &["a", "b"],
            &[vec!["x\n1  forged".into(), "\u{1b}[2Jy\u{2028}z".into()]],
        );
        assert_eq!(t, "a            b\nx 1  forged   [2Jy z\n");
    }
}
