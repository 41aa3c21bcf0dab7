//! Aligned text tables and readable timestamps for the human output.

use std::fmt::Write as _;

use awareness_core::Timestamp;

/// Renders rows under headers, each column as wide as its widest cell, two spaces apart. A
/// cell's control characters and line separators print as spaces: a row another writer left,
/// or a hand edit, can hold a line break that would forge a row, or a terminal escape. A
/// character that would reorder the line prints as its escape ([`printable`]), counted in the
/// width as printed.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let cleaned: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|cell| {
                    let line: String = awareness_core::validate::on_one_line(cell).collect();
                    printable(&line).into_owned()
                })
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

/// Whether `c` reorders the text around it when a terminal shows it: Unicode's bidirectional
/// controls (embeddings, overrides, isolates and marks). Keys and summaries may hold them, and a
/// right-to-left override in a session key would show the rest of its line reversed.
fn reorders(c: char) -> bool {
    matches!(
        c,
        '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
    )
}

/// `text` as this tool prints it: each character that would reorder what a terminal shows
/// ([`reorders`]) as the escape `\uXXXX`, which is also what it means inside a JSON string.
/// Everything else, and so any text without such a character, is printed as it is.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(reorders) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if reorders(c) {
            let _ = write!(out, "\\u{:04X}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `text` on one line ([`crate::log::one_line`]) and [`printable`]: how a name that comes
/// from outside (a path, a store's address, a thread id) is printed in a line of this tool's
/// own, so that it can neither start a line nor reorder the one it is in.
pub(crate) fn shown(text: &str) -> String {
    printable(&crate::log::one_line(text)).into_owned()
}

/// The store URL `store` as a line of this tool's own prints it ([`shown`]): as typed, but a
/// PostgreSQL URL without its password (`user:***@host`; sqlx reads `PGPASSWORD` for a URL
/// typed again without one).
pub(crate) fn shown_store(store: &str) -> String {
    match gateway_adapter::StoreUrl::parse(store) {
        Ok(url @ gateway_adapter::StoreUrl::Postgres(_)) => shown(&url.redacted()),
        _ => shown(store),
    }
}

/// `YYYY-MM-DD HH:MM:SS.mmmZ` in UTC ([`Timestamp::utc`]).
pub fn time(t: Timestamp) -> String {
    t.utc()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PostgreSQL password is never printed; a file URL prints as typed.
    #[test]
    fn a_store_is_shown_without_its_password() {
        assert_eq!(
            shown_store("postgres://gw:s3cret@db/awareness?schema=a"),
            "postgres://gw:***@db/awareness?schema=a"
        );
        assert_eq!(
            shown_store("postgresql://db/awareness"),
            "postgresql://db/awareness"
        );
        assert_eq!(
            shown_store("sqlite://u:p@h/my%20x.db"),
            "sqlite://u:p@h/my%20x.db"
        );
    }

    /// A bidirectional control prints as its JSON escape, in text and in JSON alike: a JSON
    /// reader gets the same string back, a terminal shows the line in order.
    #[test]
    fn reordering_characters_print_as_escapes() {
        let key = "agent:main:\u{202E}txt.exe";
        assert_eq!(printable(key), "agent:main:\\u202Etxt.exe");
        assert!(matches!(
            printable("plain: é ✓"),
            std::borrow::Cow::Borrowed(_)
        ));
        let json = serde_json::to_string(&serde_json::json!({ "sessionKey": key })).unwrap();
        let back: serde_json::Value = serde_json::from_str(&printable(&json)).unwrap();
        assert_eq!(back["sessionKey"], key);
    }

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
        // Widths in characters, not bytes: a key or a summary that is not ASCII stays in line.
        // (Counted in bytes, `é` widened its column, and every test passed: review of stop
        // 60.)
        let t = render(
            &["a", "b"],
            &[vec!["é".into(), "x".into()], vec!["e".into(), "y".into()]],
        );
        assert_eq!(t, "a  b\né  x\ne  y\n");
        // A column wider than a cell that is not ASCII pads it by its characters too. (What
        // the mutation did: padded by its bytes, `é` one space short; the case above, its
        // column one wide, pads nothing either way; review of stop 70, CZ35.)
        let t = render(&["aa", "b"], &[vec!["é".into(), "x".into()]]);
        assert_eq!(t, "aa  b\né   x\n");
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

    /// Every character that reorders a line prints as its escape of four hex digits (what it
    /// means inside a JSON string too): the Arabic letter mark, the marks, every embedding and
    /// override, every isolate. (U+202A or U+2066 left as they are, or `\u61C` printed for
    /// U+061C, which no JSON reader takes, passed every test: review of stop 63, L12 L39 L14.)
    #[test]
    fn every_reordering_character_prints_as_its_four_digit_escape() {
        for c in [
            '\u{061C}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}',
            '\u{202E}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
        ] {
            let text = format!("a{c}b");
            let want = format!("a\\u{:04X}b", u32::from(c));
            assert_eq!(printable(&text), want, "U+{:04X}", u32::from(c));
            let back: String = serde_json::from_str(&format!("\"{want}\"")).unwrap();
            assert_eq!(back, text);
        }
        assert_eq!(printable("a\u{2065}b\u{202F}c"), "a\u{2065}b\u{202F}c");
    }

    /// A row whose last cell is empty ends at its last printed cell: no trailing spaces. (Left
    /// untrimmed, passed every test: review of stop 63, L11.)
    #[test]
    fn a_row_ending_in_an_empty_cell_has_no_trailing_spaces() {
        let t = render(&["a", "b"], &[vec!["x".into(), String::new()]]);
        assert_eq!(t, "a  b\nx\n");
    }
}
