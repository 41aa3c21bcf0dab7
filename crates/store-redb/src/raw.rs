//! Rows that hold redb's own strings, read from their bytes.
//!
//! redb decodes a `&str` with `str::from_utf8(..).unwrap()` and a tuple by slicing at the
//! lengths its header states, without checking either: a key or value damaged at byte level
//! (text that is not UTF-8, a tuple cut short) panics in `AccessGuard::value`, before the store
//! can leave the row out as unreadable (docs/decisions/0016, 0020). A panic in a write
//! transaction fails its caller and marks the file for repair.
//!
//! So the tables whose rows the store reads many of at once (cursors, the by-target index, the
//! keys of the reference index when heads are listed and in every write transaction's event
//! tables, whose deletion of an event row that cannot be read scans them, the keys of the
//! dedupe index there too, the keys of the upstream links when they are listed, and schema 1's
//! heads when they are migrated) are opened under [`Bytes`]: the same table, of the same type
//! on disk, whose reads hand back the encoding, which `split_pair`, `split_ref` and
//! `split_cursor_row` take apart with every length checked. Text is then checked by the caller,
//! as `str::from_utf8` (the check redb's decode made). The recording benches of store-redb, run
//! before and after this view of the cursor tables alternately (stop 47), showed no consistent
//! difference (the view of the event tables was not benched: a recording encodes its index key
//! into a new buffer either way).
//! The encoders write exactly what redb writes for the typed tuple (a unit test compares them).
//!
//! What this covers: a row cut short or running long, and text that is not UTF-8 in a key or
//! a row. Not a key cut short: ordering keys stays redb's (`Key::compare` is the tuple's, which
//! slices by the lengths the key states), so a seek, a lookup or an insert that compares
//! against such a key still panics in redb; only a plain iteration that reaches it without
//! comparing passes it over (with a warning). A tolerant comparison would have to keep one
//! total order over good and damaged keys alike, which redb's B-tree relies on.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::marker::PhantomData;

use redb::{Key, TypeName, Value};

/// The redb type `T`, read as its encoding: a table opened under `Bytes<T>` is the table of `T`
/// (same type name, width and key order), whose reads return the stored bytes undecoded and
/// whose writes take bytes already encoded as `T` encodes.
#[derive(Debug)]
pub struct Bytes<T>(PhantomData<T>);

impl<T: Value + 'static> Value for Bytes<T> {
    type SelfType<'a>
        = &'a [u8]
    where
        Self: 'a;
    type AsBytes<'a>
        = &'a [u8]
    where
        Self: 'a;

    const NICHE: Option<&'static [u8]> = T::NICHE;

    fn fixed_width() -> Option<usize> {
        T::fixed_width()
    }

    fn from_bytes<'a>(data: &'a [u8]) -> &'a [u8]
    where
        Self: 'a,
    {
        data
    }

    fn as_bytes<'a, 'b: 'a>(value: &'a &'b [u8]) -> &'a [u8]
    where
        Self: 'b,
    {
        value
    }

    fn type_name() -> TypeName {
        T::type_name()
    }
}

impl<T: Key + 'static> Key for Bytes<T> {
    fn compare(data1: &[u8], data2: &[u8]) -> Ordering {
        T::compare(data1, data2)
    }

    fn separator<'a>(left: &'a [u8], right: &'a [u8]) -> Cow<'a, [u8]> {
        T::separator(left, right)
    }

    fn min_encoded_key() -> Option<Cow<'static, [u8]>> {
        T::min_encoded_key()
    }
}

/// Appends redb's length prefix of a variable-width tuple element.
fn put_len(len: usize, out: &mut Vec<u8>) {
    if len < 254 {
        out.push(u8::try_from(len).expect("below 254"));
    } else if let Ok(len) = u16::try_from(len) {
        out.push(254);
        out.extend_from_slice(&len.to_le_bytes());
    } else {
        let len = u32::try_from(len).expect("redb keeps no element of 4 GiB");
        out.push(255);
        out.extend_from_slice(&len.to_le_bytes());
    }
}

/// Reads a length prefix at the start of `data`: (length, bytes it took), or `None` when
/// `data` is too short to hold it.
fn take_len(data: &[u8]) -> Option<(usize, usize)> {
    match *data.first()? {
        n @ 0..=253 => Some((usize::from(n), 1)),
        254 => Some((
            usize::from(u16::from_le_bytes(data.get(1..3)?.try_into().ok()?)),
            3,
        )),
        255 => Some((
            usize::try_from(u32::from_le_bytes(data.get(1..5)?.try_into().ok()?)).ok()?,
            5,
        )),
    }
}

/// A little-endian word of eight bytes, exactly.
fn word(data: &[u8]) -> Option<[u8; 8]> {
    data.try_into().ok()
}

/// The encoding of the key `(a, b)`, both `&str` (as bytes, so that a key read back can be
/// named again whatever it holds).
pub(crate) fn pair(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len() + b.len() + 5);
    put_len(a.len(), &mut out);
    out.extend_from_slice(a);
    out.extend_from_slice(b);
    out
}

/// The two strings of a `(&str, &str)` key, as bytes; `None` when the encoding is cut short.
pub(crate) fn split_pair(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, at) = take_len(data)?;
    let rest = data.get(at..)?;
    (len <= rest.len()).then(|| rest.split_at(len))
}

/// The encoding of the reference index's key `(agent, key, seq)`.
pub(crate) fn by_ref(agent: &[u8], key: &[u8], seq: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(agent.len() + key.len() + 18);
    put_len(agent.len(), &mut out);
    put_len(key.len(), &mut out);
    out.extend_from_slice(agent);
    out.extend_from_slice(key);
    out.extend_from_slice(&seq.to_le_bytes());
    out
}

/// The parts of a reference index key `(agent, key, seq)`, the strings as bytes; `None` when
/// the encoding does not add up.
pub(crate) fn split_ref(data: &[u8]) -> Option<(&[u8], &[u8], u64)> {
    let (agent_len, at) = take_len(data)?;
    let (key_len, more) = take_len(data.get(at..)?)?;
    let rest = data.get(at + more..)?;
    let agent = rest.get(..agent_len)?;
    let key = rest.get(agent_len..agent_len.checked_add(key_len)?)?;
    let seq = word(rest.get(agent_len + key_len..)?)?;
    Some((agent, key, u64::from_le_bytes(seq)))
}

/// A cursor row as stored: (target agent, last seen, notified, material, updated at), the
/// agent as bytes.
pub(crate) type CursorParts<'a> = (&'a [u8], u64, u64, u64, i64);

/// The encoding of a cursor row.
pub(crate) fn cursor_row(
    agent: &[u8],
    last: u64,
    notified: u64,
    material: u64,
    at: i64,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(agent.len() + 33);
    put_len(agent.len(), &mut out);
    out.extend_from_slice(agent);
    for n in [last, notified, material] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(&at.to_le_bytes());
    out
}

/// The fields of a cursor row; `None` when the encoding is cut short or runs long.
pub(crate) fn split_cursor_row(data: &[u8]) -> Option<CursorParts<'_>> {
    let (len, at) = take_len(data)?;
    let rest = data.get(at..)?;
    let agent = rest.get(..len)?;
    let nums = rest.get(len..)?;
    if nums.len() != 32 {
        return None;
    }
    let n = |i: usize| word(&nums[i * 8..i * 8 + 8]).expect("eight bytes");
    Some((
        agent,
        u64::from_le_bytes(n(0)),
        u64::from_le_bytes(n(1)),
        u64::from_le_bytes(n(2)),
        i64::from_le_bytes(n(3)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Strings whose lengths take each size of redb's length prefix, with those either side of
    /// where one size gives way to the next.
    fn samples() -> Vec<String> {
        let mut out = vec![
            String::new(),
            "agent:main:main".to_owned(),
            "é".repeat(200),
            "k".repeat(70_000),
        ];
        out.extend([253, 254, 255, 65_535, 65_536].map(|n| "k".repeat(n)));
        out
    }

    /// The encoders write what redb writes for the typed tuples, and the splitters read back
    /// what they wrote: a store that wrote other bytes than redb would write a file redb's
    /// own reads (and other tools) decode wrongly.
    #[test]
    fn the_encodings_are_redbs_own() {
        for a in &samples() {
            for b in &samples() {
                let typed = <(&str, &str) as Value>::as_bytes(&(a.as_str(), b.as_str()));
                let ours = pair(a.as_bytes(), b.as_bytes());
                assert_eq!(ours, typed);
                assert_eq!(split_pair(&ours), Some((a.as_bytes(), b.as_bytes())));

                let typed = <(&str, &str, u64) as Value>::as_bytes(&(a.as_str(), b.as_str(), 7));
                let ours = by_ref(a.as_bytes(), b.as_bytes(), 7);
                assert_eq!(ours, typed);
                assert_eq!(split_ref(&ours), Some((a.as_bytes(), b.as_bytes(), 7)));
            }
            let typed = <(&str, u64, u64, u64, i64) as Value>::as_bytes(&(a.as_str(), 1, 2, 3, -4));
            let ours = cursor_row(a.as_bytes(), 1, 2, 3, -4);
            assert_eq!(ours, typed);
            assert_eq!(split_cursor_row(&ours), Some((a.as_bytes(), 1, 2, 3, -4)));
        }
    }

    /// Every encoding cut short, by any number of bytes, reads as `None` rather than panicking
    /// as redb's own decoders do (they slice at the lengths the header states).
    #[test]
    fn a_cut_encoding_reads_as_none() {
        let a = "agent:main:subagent:a";
        let whole = [
            pair(b"agent:main:main", a.as_bytes()),
            by_ref(b"main", a.as_bytes(), 9),
            cursor_row(b"main", 1, 2, 3, 4),
        ];
        for n in 0..whole[1].len() {
            assert_eq!(split_ref(&whole[1][..n]), None, "{n}");
        }
        for n in 0..whole[2].len() {
            assert_eq!(split_cursor_row(&whole[2][..n]), None, "{n}");
        }
        // A pair's last string runs to the end, so only a cut into its first one shows.
        for n in 0..16 {
            assert_eq!(split_pair(&whole[0][..n]), None, "{n}");
        }
        assert_eq!(
            split_cursor_row(&[whole[2].as_slice(), b"x"].concat()),
            None
        );
    }
}
