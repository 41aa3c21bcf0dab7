//! The transcript scanner (`gateway_adapter::upstream::transcript`) on any line.
//!
//! - Read whole or in pieces of any size, its state stored between the pieces as a marker
//!   stores it (JSON) and read back, it ends the same way, and every state it passes through
//!   is one `is_sound` accepts (a state it refused would rebase the link and lose the line).
//! - On a line serde_json reads as a JSON object (without a repeated key, which serde_json
//!   keeps the last of), the facts it keeps are the ones a walk of serde_json's tree finds,
//!   field by field, under the same bounds (short strings cut at 64 bytes, a long uuid hashed,
//!   texts normalized). The scanner is more lenient than serde_json (JavaScript writes lone
//!   surrogates; a stray byte should not cost a person's turn), so a line serde_json refuses
//!   is not compared.

use std::collections::HashSet;
use std::fmt;

use awareness_core::upstream::{MAX_DEDUPE_ID_BYTES, NormalizedText, fnv1a64};
use gateway_adapter::upstream::transcript::{
    LineEnd, LineScanner, RowFacts, SMALL_BYTES, TEXT_PREFIX_CHARS,
};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Runs the target on one input (any bytes); panics on a failure. Whether the line was a
/// JSON object serde_json read, so that the scanner's facts were compared with a walk of its
/// tree (the pieces-against-whole comparison, made on every line, does not count).
pub fn run(data: &[u8]) -> bool {
    let Some((&step, rest)) = data.split_first() else {
        return false;
    };
    let line = rest.split(|b| *b == b'\n').next().unwrap_or_default();
    let whole = {
        let mut s = LineScanner::new();
        assert_eq!(s.feed(line), None);
        s.finish()
    };
    assert_eq!(pieces(line, usize::from(step % 64) + 1), whole, "{line:?}");
    if let Ok(Strict(Value::Object(row))) = serde_json::from_slice::<Strict>(line) {
        match &whole {
            LineEnd::Row(facts) => assert_eq!(**facts, expected(&row), "{line:?}"),
            other => panic!("a JSON object read as {other:?}: {line:?}"),
        }
        return true;
    }
    false
}

/// `line` fed `step` bytes at a time, the scanner stored as JSON and read back between feeds.
fn pieces(line: &[u8], step: usize) -> LineEnd {
    let mut scanner = LineScanner::new();
    for piece in line.chunks(step) {
        assert_eq!(scanner.feed(piece), None);
        assert!(scanner.is_sound(), "{scanner:?}");
        let stored = serde_json::to_value(&scanner).expect("a scanner serializes");
        let read: LineScanner = serde_json::from_value(stored).expect("and reads back");
        assert_eq!(read, scanner);
        scanner = read;
    }
    scanner.finish()
}

/// What the scanner should keep of `row`, found by walking serde_json's tree.
fn expected(row: &Map<String, Value>) -> RowFacts {
    let at = |path: &[&str]| -> Option<&Value> {
        let (last, parents) = path.split_last()?;
        let mut object = row;
        for key in parents {
            object = object.get(*key)?.as_object()?;
        }
        object.get(*last)
    };
    let short = |path: &[&str]| at(path).and_then(Value::as_str).map(cut);
    let flag = |path: &[&str]| at(path) == Some(&Value::Bool(true));
    let mut facts = RowFacts {
        row_type: short(&["type"]),
        uuid: at(&["uuid"]).and_then(Value::as_str).map(uuid),
        role: short(&["message", "role"]),
        is_sidechain: flag(&["isSidechain"]),
        is_meta: flag(&["isMeta"]),
        is_compact_summary: flag(&["isCompactSummary"]),
        is_visible_in_transcript_only: flag(&["isVisibleInTranscriptOnly"]),
        content: NormalizedText::new(TEXT_PREFIX_CHARS),
        attachment_type: short(&["attachment", "type"]),
        command_mode: short(&["attachment", "commandMode"]),
        origin_kind: short(&["attachment", "origin", "kind"]),
        attachment_is_meta: flag(&["attachment", "isMeta"]),
        prompt: NormalizedText::new(TEXT_PREFIX_CHARS),
        subtype: short(&["subtype"]),
        row_origin_kind: short(&["origin", "kind"]),
        ..RowFacts::default()
    };
    // The texts, in the order the line holds them: a row's top-level `content` (a system
    // row's), then `message.content`, or the other way round.
    for (key, value) in row {
        match (key.as_str(), value) {
            ("content", Value::String(s)) => text(&mut facts.content, s),
            ("message", Value::Object(message)) => {
                if let Some(content) = message.get("content") {
                    let (has_tool_result, has_non_text) = parts(&mut facts.content, content);
                    facts.has_tool_result = has_tool_result;
                    facts.has_non_text_part = has_non_text;
                }
            }
            ("attachment", Value::Object(attachment)) => {
                if let Some(prompt) = attachment.get("prompt") {
                    let (has_tool_result, has_non_text) = parts(&mut facts.prompt, prompt);
                    facts.prompt_has_non_text_part = has_tool_result || has_non_text;
                }
            }
            _ => {}
        }
    }
    facts
}

/// The texts of a content (a string, or an array of strings and parts with a `text`) fed to
/// `out`; whether a part's `type` is `tool_result`, and whether one is neither that nor `text`.
fn parts(out: &mut NormalizedText, content: &Value) -> (bool, bool) {
    let (mut tool_result, mut non_text) = (false, false);
    match content {
        Value::String(s) => text(out, s),
        Value::Array(items) => {
            for item in items {
                match item {
                    Value::String(s) => text(out, s),
                    Value::Object(part) => {
                        // In the order the part holds its keys, as the scanner meets them.
                        for (key, value) in part {
                            match (key.as_str(), value) {
                                ("text", Value::String(s)) => text(out, s),
                                ("type", Value::String(t)) if t == "tool_result" => {
                                    tool_result = true;
                                }
                                ("type", Value::String(t)) if t != "text" => non_text = true,
                                _ => {}
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
    (tool_result, non_text)
}

/// One string of a text: separated from what came before as whitespace would be.
fn text(out: &mut NormalizedText, s: &str) {
    if !out.is_empty() {
        out.separate();
    }
    for c in s.chars() {
        out.push(c);
    }
}

/// A short field as kept: characters added while under [`SMALL_BYTES`] bytes.
fn cut(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if out.len() >= SMALL_BYTES {
            break;
        }
        out.push(c);
    }
    out
}

/// A uuid as kept: whole up to [`MAX_DEDUPE_ID_BYTES`] bytes, else the hex of its hash.
fn uuid(s: &str) -> String {
    if s.len() <= MAX_DEDUPE_ID_BYTES {
        s.to_owned()
    } else {
        format!("{:016x}", fnv1a64(s.as_bytes()))
    }
}

/// A JSON value that refuses an object with a key twice.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON without a repeated key")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!("key {key:?} twice")));
            }
            let Strict(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}
