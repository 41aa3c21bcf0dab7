//! store-sqlite's fast row reader (`crates/store-sqlite/src/rows.rs`, compiled here as it is)
//! against serde_json, which store-sqlite falls back to when the fast reader gives up.
//!
//! The reader's promise is that the two differ only in speed: whatever it reads, serde_json
//! reads the same way (the store decodes its rows with serde into integers, strings and
//! nullable strings). So for any text: when the reader gives rows of a shape, serde_json must
//! accept the text as an array of arrays of that shape, with equal values. When the reader
//! gives up, serde_json decides, and nothing is compared. Nothing may panic.

use std::borrow::Cow;

use serde_json::Value;

#[allow(dead_code)]
#[path = "../../crates/store-sqlite/src/rows.rs"]
mod rows;

use rows::Reader;

/// The row shapes store-sqlite reads (`crates/store-sqlite/src/decode.rs`): an event (12
/// columns), an event's fields (9), a cursor (8), a head (5). `i` is an integer, `s` a string,
/// `o` a string or null.
const SHAPES: [&str; 4] = ["isosssooisoo", "ossooisoo", "ssoiiiis", "ssiii"];

/// A value the fast reader read.
#[derive(Debug)]
enum Cell<'a> {
    Int(i64),
    Str(Option<Cow<'a, str>>),
}

/// The cells of one row of `shape`, from after its `[` to before its `]`, as store-sqlite's
/// row readers read one (`decode.rs`: a reader changed there is to be changed in [`SHAPES`]).
fn row<'a>(r: &mut Reader<'a>, shape: &str) -> Option<Vec<Cell<'a>>> {
    let mut cells = Vec::with_capacity(shape.len());
    for (n, kind) in shape.bytes().enumerate() {
        if n > 0 {
            r.comma()?;
        }
        cells.push(match kind {
            b'i' => Cell::Int(r.int()?),
            b's' => Cell::Str(Some(r.str()?)),
            _ => Cell::Str(r.opt_str()?),
        });
    }
    Some(cells)
}

/// `value` read by serde_json equals `cell` (an integer only when serde reads it as one: a
/// `-0` or `1.0` is a float to serde, which the store's `i64` fields refuse).
fn same(value: &Value, cell: &Cell<'_>) -> bool {
    match (value, cell) {
        (Value::Number(n), Cell::Int(i)) => (n.is_i64() || n.is_u64()) && n.as_i64() == Some(*i),
        (Value::Null, Cell::Str(None)) => true,
        (Value::String(s), Cell::Str(Some(c))) => s == c,
        _ => false,
    }
}

/// Runs the target on one input (any bytes); panics on a failure. Whether the fast reader
/// read rows (or integers), which were then compared with serde_json's.
pub fn run(data: &[u8]) -> bool {
    let Some((&pick, rest)) = data.split_first() else {
        return false;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return false;
    };
    match SHAPES.get(usize::from(pick % 5)) {
        Some(shape) => {
            let Some(rows) = rows::fast_rows(text, |r| row(r, shape)) else {
                return false;
            };
            let parsed: Vec<Vec<Value>> = serde_json::from_str(text).unwrap_or_else(|e| {
                panic!("the fast reader read rows serde_json refuses ({e}): {text:?}")
            });
            assert_eq!(parsed.len(), rows.len(), "{text:?}");
            for (values, cells) in parsed.iter().zip(&rows) {
                assert_eq!(values.len(), cells.len(), "{text:?}");
                for (value, cell) in values.iter().zip(cells) {
                    assert!(same(value, cell), "{value:?} read as {cell:?}: {text:?}");
                }
            }
            true
        }
        // A bare array of integers (`fast_ints`).
        None => {
            let Some(ints) = rows::fast_ints(text) else {
                return false;
            };
            let parsed: Vec<Value> = serde_json::from_str(text).unwrap_or_else(|e| {
                panic!("the fast reader read integers serde_json refuses ({e}): {text:?}")
            });
            assert_eq!(parsed.len(), ints.len(), "{text:?}");
            for (value, i) in parsed.iter().zip(&ints) {
                assert!(
                    same(value, &Cell::Int(*i)),
                    "{value:?} read as {i}: {text:?}"
                );
            }
            true
        }
    }
}
