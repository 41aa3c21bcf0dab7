//! A reader for the one JSON shape the hot reads return: an array of rows (events, heads,
//! cursors), each a flat array of integers, strings and nulls, as SQLite's `json_array` and
//! `json_group_array` write it.
//!
//! serde_json decoded a 200-event reconcile page in 98-152 µs on this machine (up to more than
//! half of the 240 µs target for the whole read): a visitor call per value and a `Vec` of
//! intermediate rows. This reader walks the bytes once, borrows every string without an escape,
//! and builds the rows directly: 76 µs for the same page, alternating with serde in one probe.
//! It only accepts what it fully understands: anything else (a float, an exponent, an integer
//! out of range, `-0`, a raw control character, a lone surrogate, a nested value, trailing text)
//! makes it give up with `None`, and the caller decodes the same text with serde_json, which
//! either reads it or names the fault. So the two can only differ in speed; a property test in
//! `decode` checks that they agree on what SQLite itself writes, and the fuzz target
//! `sqlite_rows` (`fuzz/`) that whatever this reader reads, serde_json reads alike.

use std::borrow::Cow;

/// A cursor over JSON text.
pub(crate) struct Reader<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `text`.
    pub(crate) fn new(text: &'a str) -> Self {
        Self { text, pos: 0 }
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// The next byte that is not JSON whitespace, without consuming it.
    fn peek(&mut self) -> Option<u8> {
        while let Some(&b) = self.bytes().get(self.pos) {
            if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                self.pos += 1;
            } else {
                return Some(b);
            }
        }
        None
    }

    /// Consumes `b` (after whitespace), or gives up.
    pub(crate) fn eat(&mut self, b: u8) -> Option<()> {
        (self.peek()? == b).then(|| self.pos += 1)
    }

    /// Consumes the `,` between two values, or gives up; then reads on.
    pub(crate) fn comma(&mut self) -> Option<&mut Self> {
        self.eat(b',')?;
        Some(self)
    }

    /// Consumes the literal `null` if it comes next.
    fn null(&mut self) -> Option<bool> {
        if self.peek()? == b'n' {
            self.bytes()
                .get(self.pos..self.pos + 4)
                .filter(|w| *w == b"null")?;
            self.pos += 4;
            Some(true)
        } else {
            Some(false)
        }
    }

    /// At an array's `[`: consumes it and says whether the array is empty (its `]` consumed
    /// too).
    pub(crate) fn open_array(&mut self) -> Option<bool> {
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.pos += 1;
            Some(true)
        } else {
            Some(false)
        }
    }

    /// After an element: consumes `,` (true: another element follows) or `]` (false).
    pub(crate) fn next_element(&mut self) -> Option<bool> {
        match self.peek()? {
            b',' => {
                self.pos += 1;
                Some(true)
            }
            b']' => {
                self.pos += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// Succeeds only at the end of the text (whitespace aside).
    pub(crate) fn end(&mut self) -> Option<()> {
        self.peek().is_none().then_some(())
    }

    /// An integer written without fraction or exponent, within `i64`.
    pub(crate) fn int(&mut self) -> Option<i64> {
        self.peek()?;
        let bytes = self.bytes();
        let mut i = self.pos;
        let negative = bytes[i] == b'-';
        if negative {
            i += 1;
        }
        let digits = i;
        // Accumulated on the negative side, which holds `i64::MIN` too.
        let mut value: i64 = 0;
        while let Some(&b) = bytes.get(i).filter(|b| b.is_ascii_digit()) {
            value = value.checked_mul(10)?.checked_sub(i64::from(b - b'0'))?;
            i += 1;
        }
        // JSON has no leading zeros, no empty integer; a fraction or exponent is not ours, nor
        // is `-0`, which serde_json reads as a float (and the store's integer fields refuse).
        let n = i - digits;
        if n == 0
            || (n > 1 && bytes[digits] == b'0')
            || (negative && value == 0)
            || matches!(bytes.get(i), Some(b'.' | b'e' | b'E'))
        {
            return None;
        }
        self.pos = i;
        if negative {
            Some(value)
        } else {
            value.checked_neg()
        }
    }

    /// A string, borrowed when it holds no escape.
    pub(crate) fn str(&mut self) -> Option<Cow<'a, str>> {
        self.eat(b'"')?;
        let bytes = self.bytes();
        let start = self.pos;
        let mut i = start;
        loop {
            match *bytes.get(i)? {
                b'"' => {
                    self.pos = i + 1;
                    return Some(Cow::Borrowed(&self.text[start..i]));
                }
                b'\\' => break,
                0..0x20 => return None,
                _ => i += 1,
            }
        }
        let mut out = String::with_capacity(i - start + 16);
        out.push_str(&self.text[start..i]);
        let mut run = i;
        loop {
            match *bytes.get(i)? {
                b'"' => {
                    out.push_str(&self.text[run..i]);
                    self.pos = i + 1;
                    return Some(Cow::Owned(out));
                }
                b'\\' => {
                    out.push_str(&self.text[run..i]);
                    i = self.escape(i + 1, &mut out)?;
                    run = i;
                }
                0..0x20 => return None,
                _ => i += 1,
            }
        }
    }

    /// A string or `null`.
    #[allow(
        clippy::option_option,
        reason = "the outer None gives up, the inner one is null"
    )]
    pub(crate) fn opt_str(&mut self) -> Option<Option<Cow<'a, str>>> {
        if self.null()? {
            Some(None)
        } else {
            self.str().map(Some)
        }
    }

    /// An owned string or `null`.
    #[allow(
        clippy::option_option,
        reason = "the outer None gives up, the inner one is null"
    )]
    pub(crate) fn opt_string(&mut self) -> Option<Option<String>> {
        self.opt_str().map(|s| s.map(Cow::into_owned))
    }

    /// Decodes the escape whose letter is at `i` into `out`; returns the index after it.
    fn escape(&self, i: usize, out: &mut String) -> Option<usize> {
        let bytes = self.bytes();
        let c = match *bytes.get(i)? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = self.hex4(i + 1)?;
                if (0xD800..0xDC00).contains(&hi) {
                    // A high surrogate must be followed by an escaped low one.
                    if bytes.get(i + 5..i + 7)? != b"\\u" {
                        return None;
                    }
                    let lo = self.hex4(i + 7)?;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return None;
                    }
                    let c = char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?;
                    out.push(c);
                    return Some(i + 11);
                }
                out.push(char::from_u32(hi)?);
                return Some(i + 5);
            }
            _ => return None,
        };
        out.push(c);
        Some(i + 1)
    }

    /// Four hex digits at `i`.
    fn hex4(&self, i: usize) -> Option<u32> {
        let digits = self.text.get(i..i + 4)?;
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(digits, 16).ok()
    }
}

/// The rows of an array of arrays, each read by `row` (from after its `[` to before its `]`):
/// the fast path of store-sqlite's row decoding (`decode`), `None` where the reader gives up.
pub(crate) fn fast_rows<'a, T>(
    text: &'a str,
    row: impl Fn(&mut Reader<'a>) -> Option<T>,
) -> Option<Vec<T>> {
    fast_list(text, |r| {
        r.eat(b'[')?;
        let v = row(r)?;
        r.eat(b']')?;
        Some(v)
    })
}

/// A JSON array of integers, read by the fast reader; `None` where it gives up.
pub(crate) fn fast_ints(text: &str) -> Option<Vec<i64>> {
    fast_list(text, Reader::int)
}

/// The whole of `text` as a JSON array whose elements `item` reads; `None` where it gives up.
pub(crate) fn fast_list<'a, T>(
    text: &'a str,
    item: impl Fn(&mut Reader<'a>) -> Option<T>,
) -> Option<Vec<T>> {
    let mut r = Reader::new(text);
    let mut out = Vec::new();
    if !r.open_array()? {
        loop {
            out.push(item(&mut r)?);
            if !r.next_element()? {
                break;
            }
        }
    }
    r.end()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads `[int, string|null, ...]` in the order of `kinds` (`i`, `s`, `o`), as strings.
    fn row(text: &str, kinds: &str) -> Option<Vec<String>> {
        let mut r = Reader::new(text);
        let mut out = Vec::new();
        let empty = r.open_array()?;
        if !empty {
            for (n, k) in kinds.chars().enumerate() {
                out.push(match k {
                    'i' => r.int()?.to_string(),
                    's' => r.str()?.into_owned(),
                    _ => format!("{:?}", r.opt_string()?),
                });
                let more = r.next_element()?;
                if more != (n + 1 < kinds.len()) {
                    return None;
                }
            }
        }
        r.end()?;
        Some(out)
    }

    #[test]
    fn reads_integers_strings_and_nulls() {
        assert_eq!(
            row(
                r#"[ -12 , "a\"b\\c\/\n\t\u00e9\ud83d\ude00" ,null, "x"]"#,
                "isoo"
            ),
            Some(vec![
                "-12".into(),
                "a\"b\\c/\n\té😀".into(),
                "None".into(),
                "Some(\"x\")".into()
            ])
        );
        assert_eq!(row("[]", "i"), Some(vec![]));
        assert_eq!(
            row("[9223372036854775807,-9223372036854775808,0,7]", "iiii"),
            Some(vec![
                i64::MAX.to_string(),
                i64::MIN.to_string(),
                "0".into(),
                "7".into()
            ])
        );
    }

    #[test]
    fn gives_up_on_what_it_does_not_fully_understand() {
        for text in [
            "[1.0]",
            "[1e3]",
            "[01]",
            "[-]",
            "[9223372036854775808]",
            "[-9223372036854775809]",
            "[-01]",
            "[-0]",
            "[\"a\u{1}\"]",
            r#"["\ud83d"]"#,
            r#"["\ude00"]"#,
            r#"["\ud83d\u0041"]"#,
            r#"["\x"]"#,
            r#"["\u12g4"]"#,
            r#"["abc"#,
            "[1] x",
            "[1,]",
            "[nul]",
        ] {
            let kinds = if text.contains('"') { "s" } else { "i" };
            assert_eq!(row(text, kinds), None, "{text}");
        }
    }

    #[test]
    fn borrows_strings_without_escapes() {
        let mut r = Reader::new(r#""plain text é""#);
        assert!(matches!(r.str(), Some(Cow::Borrowed("plain text é"))));
    }
}
