//! Input rules of DESIGN.md section 3, as pure functions with typed errors.

use crate::model::{Payload, Timestamp};

/// Longest summary, in characters.
pub const MAX_SUMMARY_CHARS: usize = 200;
/// Largest payload, in bytes of compact JSON.
pub const MAX_PAYLOAD_BYTES: usize = 4096;
/// Longest key or id, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Longest dedupe key, in bytes: room for the keys DESIGN.md section 3 builds out of up to three
/// keys or ids of at most [`MAX_KEY_BYTES`] each (`created:<agentId>:<sessionKey>:<sessionId>`,
/// `upstream:<sessionKey>:<16 hex>:<dedupeId>`), so an event about an accepted session is never
/// refused for its own dedupe key.
pub const MAX_DEDUPE_KEY_BYTES: usize = 4096;
/// Deepest nesting of arrays and objects in a payload, an upstream reference or a marker (a
/// payload object is level 1). The durable stores read JSON back with serde_json, which refuses
/// more than 128 levels, and wrap a value in a few more (a page of events, a link): a value
/// nested deeper than that would be written and then fail every read of it as corrupt.
pub const MAX_JSON_DEPTH: usize = 64;
/// The most watchers one event may name ([`crate::NewEvent::with_watcher`]): a spawn names its
/// spawner, a session's turn its spawner or parent. Each one named is a cursor written in the recording's
/// transaction, so the count is bounded.
pub const MAX_NAMED_WATCHERS: usize = 64;
/// How far back an event's `occurredAt` may lie.
pub const MAX_EVENT_AGE_MS: i64 = Timestamp::DAY_MS;

/// Why an input was refused. Nothing is written when an input is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationError {
    /// A key or id is empty.
    #[error("{what} must not be empty")]
    Empty {
        /// Which field.
        what: &'static str,
    },
    /// A key or id is too long.
    #[error("{what} is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Which field.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The most allowed ([`MAX_KEY_BYTES`], or [`MAX_DEDUPE_KEY_BYTES`] for a dedupe key).
        max: usize,
    },
    /// The event names more watchers than [`MAX_NAMED_WATCHERS`] (a watcher named twice
    /// counts once).
    #[error("the event names {count} watchers; at most {max} are allowed")]
    TooManyWatchers {
        /// How many distinct watchers it names.
        count: usize,
        /// [`MAX_NAMED_WATCHERS`].
        max: usize,
    },
    /// A key or id contains a character that breaks a line ([`breaks_key`]).
    #[error(
        "{what} contains a control character or a line separator (U+{:04X} at byte {at})",
        u32::from(*found)
    )]
    ControlCharacter {
        /// Which field.
        what: &'static str,
        /// The first such character.
        found: char,
        /// Where it is, in bytes from the start of the value.
        at: usize,
    },
    /// The summary is longer than 200 characters.
    #[error("summary is {chars} characters long; at most {MAX_SUMMARY_CHARS} are allowed")]
    SummaryTooLong {
        /// Its length in characters.
        chars: usize,
    },
    /// A link's catalog id is too long for the one-line event summaries quoted from it
    /// (`crate::upstream::CATALOG_SUMMARY_PREFIXES`).
    #[error(
        "catalog id is {chars} characters long; at most {max} fit the one-line event summaries quoted from it"
    )]
    CatalogIdTooLong {
        /// Its length in characters.
        chars: usize,
        /// The most that fit (`crate::upstream::MAX_CATALOG_ID_CHARS`).
        max: usize,
    },
    /// The summary is empty or blank.
    #[error("summary must not be blank")]
    SummaryBlank,
    /// The summary is not one line or holds another control character.
    #[error("summary must be one line without control characters")]
    SummaryNotOneLine,
    /// The payload is larger than 4 KiB.
    #[error("payload is {bytes} bytes of JSON; at most {MAX_PAYLOAD_BYTES} are allowed")]
    PayloadTooLarge {
        /// Its size.
        bytes: usize,
    },
    /// The payload is not a JSON object.
    #[error("payload must be a JSON object")]
    PayloadNotObject,
    /// A payload, an upstream reference or a marker nests arrays and objects deeper than
    /// [`MAX_JSON_DEPTH`].
    #[error(
        "{what} nests arrays and objects {depth} levels deep; at most {MAX_JSON_DEPTH} are allowed"
    )]
    JsonTooDeep {
        /// Which value.
        what: &'static str,
        /// Its depth.
        depth: usize,
    },
    /// A watcher key is not agent-qualified.
    #[error(
        "{key:?} is not an agent-qualified session key (agent:<agentId>:<rest>) and cannot watch"
    )]
    NotAgentQualified {
        /// The key.
        key: String,
    },
    /// An agent id holds a `:`, which ends an agent id in an agent-qualified key
    /// (`agent:<agentId>:<rest>`): the key `agent:a:b:x` is agent `a`'s, never agent `a:b`'s.
    #[error("agent id {value:?} contains ':', which ends an agent id in a session key")]
    ColonInAgentId {
        /// The agent id.
        value: String,
    },
    /// A session cannot watch itself.
    #[error("session {key:?} cannot watch itself")]
    SelfWatch {
        /// The key.
        key: String,
    },
    /// An unknown event kind.
    #[error("unknown event kind {value:?} (the kinds are {})", spellings(&crate::model::EventKind::ALL.map(|k| k.as_str().to_owned())))]
    UnknownKind {
        /// The spelling seen.
        value: String,
    },
    /// An unknown actor type.
    #[error("unknown actor type {value:?} (the types are {})", spellings(&crate::model::ActorType::ALL.map(|a| a.as_str().to_owned())))]
    UnknownActorType {
        /// The spelling seen.
        value: String,
    },
    /// An upstream reference or marker is larger than
    /// [`crate::upstream::MAX_UPSTREAM_JSON_BYTES`].
    #[error(
        "{what} is {bytes} bytes of JSON; at most {} are allowed",
        crate::upstream::MAX_UPSTREAM_JSON_BYTES
    )]
    UpstreamJsonTooLarge {
        /// Which value.
        what: &'static str,
        /// Its size.
        bytes: usize,
    },
    /// A context key that is not `session-state:<hex of UTF-8>`.
    #[error("invalid session-state context key {value:?}: {reason}")]
    ContextKey {
        /// The key seen.
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A retention policy that would delete what it is meant to keep (a cutoff at or after
    /// now deletes every event or every cursor, with their pending notices).
    #[error("retention policy: {field} is {value}; {rule}")]
    RetentionPolicy {
        /// The field (`maxAgeMs`, `maxRows`, `cursorIdleMs`, `chunkRows`).
        field: &'static str,
        /// Its value.
        value: i128,
        /// What it must be.
        rule: &'static str,
    },
}

/// A non-empty key or id without control characters or line separators (U+2028, U+2029), at
/// most 1 KiB.
pub fn key(what: &'static str, value: &str) -> Result<(), ValidationError> {
    bounded_key(what, value, MAX_KEY_BYTES)
}

/// An agent id: a key ([`key`]) without `:`, so that the agent an agent-qualified key names
/// (`agent:<agentId>:<rest>`, up to the first `:` after `agent:`) is the one it was built with.
pub fn agent_id(value: &str) -> Result<(), ValidationError> {
    key("agent id", value)?;
    if value.contains(':') {
        return Err(ValidationError::ColonInAgentId {
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// A non-empty dedupe key without control characters or line separators (U+2028, U+2029), at
/// most 4 KiB.
pub fn dedupe_key(value: &str) -> Result<(), ValidationError> {
    bounded_key("dedupe key", value, MAX_DEDUPE_KEY_BYTES)
}

fn bounded_key(what: &'static str, value: &str, max: usize) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::Empty { what });
    }
    if value.len() > max {
        return Err(ValidationError::TooLong {
            what,
            len: value.len(),
            max,
        });
    }
    if let Some((at, found)) = value.char_indices().find(|&(_, c)| breaks_key(c)) {
        return Err(ValidationError::ControlCharacter { what, found, at });
    }
    Ok(())
}

/// `names` joined for an error's text: `a, b or c`.
fn spellings(names: &[String]) -> String {
    match names {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// Whether the key rules ([`key`], [`dedupe_key`]) refuse `c`: what breaks a summary's one
/// line ([`breaks_summary`]), since a key is written into notice texts, which are one line
/// (DESIGN.md section 4).
pub fn breaks_key(c: char) -> bool {
    breaks_summary(c)
}

/// What ends text that [`fit_summary`] or [`fit_key`] cut.
pub const ELLIPSIS: char = '…';

/// `text`, cut to at most `max` characters: its first `max - 1` characters (less trailing
/// whitespace) and [`ELLIPSIS`]. Unchanged when it fits.
fn shorten(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.chars().count() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let Some(keep) = max.checked_sub(1) else {
        return std::borrow::Cow::Borrowed("");
    };
    let end = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
    let mut out = text[..end].trim_end().to_owned();
    out.push(ELLIPSIS);
    std::borrow::Cow::Owned(out)
}

/// `prefix` then `text` (display text a gateway supplied, such as a channel name) as a valid
/// [`summary`], and whether `text` had to be changed for it: `text` is trimmed (`fallback` when
/// nothing is left); when the result breaks the summary rules, each character that breaks the
/// line ([`breaks_summary`]) becomes a space, the text is trimmed again and cut to the room the
/// prefix leaves, ending with [`ELLIPSIS`]. `prefix` and `fallback` are a producer's constants:
/// one short line each. Every producer of a summary from such text uses this, so the same text
/// always gives the same summary.
pub fn fit_summary(prefix: &str, text: &str, fallback: &str) -> (String, bool) {
    let trimmed = text.trim();
    let shown = if trimmed.is_empty() {
        fallback
    } else {
        trimmed
    };
    let whole = format!("{prefix}{shown}");
    if summary(&whole).is_ok() {
        return (whole, false);
    }
    let cleaned: String = shown
        .chars()
        .map(|c| if breaks_summary(c) { ' ' } else { c })
        .collect();
    let cleaned = cleaned.trim();
    let shown = if cleaned.is_empty() {
        fallback
    } else {
        cleaned
    };
    let room = MAX_SUMMARY_CHARS.saturating_sub(prefix.chars().count());
    let fitted = format!("{prefix}{}", shorten(shown, room));
    debug_assert!(
        summary(&fitted).is_ok(),
        "a fitted summary is valid: {fitted:?}"
    );
    (fitted, true)
}

/// `value` (an id or a key a gateway supplied) as a key of at most `max` bytes that the key
/// rules accept: unchanged (borrowed) when it is one; else each character that breaks them
/// ([`breaks_key`]) becomes U+FFFD, the value is cut to fit on a character boundary, and `#`
/// with the FNV-1a 64 hash of the original ([`crate::upstream::fnv1a64`]) is appended
/// (`…#<hash>` when it was cut). So two different originals stay different (a dedupe key never
/// merges two events) unless their hashes collide (FNV-1a is no defence against collisions
/// made on purpose) or one original is already the fitted form of the other, and one original
/// always gives the same value (a retry still deduplicates). An empty value stays empty.
/// `max` must leave room for the suffix (20 bytes: every caller passes [`MAX_KEY_BYTES`] or
/// [`MAX_DEDUPE_KEY_BYTES`]); a smaller one gives a key longer than `max`.
pub fn fit_key(value: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if value.len() <= max && !value.chars().any(breaks_key) {
        return std::borrow::Cow::Borrowed(value);
    }
    let hash = format!("#{:016x}", crate::upstream::fnv1a64(value.as_bytes()));
    let cleaned: String = value
        .chars()
        .map(|c| {
            if breaks_key(c) {
                char::REPLACEMENT_CHARACTER
            } else {
                c
            }
        })
        .collect();
    let fitted = if cleaned.len() + hash.len() <= max {
        cleaned + &hash
    } else {
        let room = max.saturating_sub(hash.len() + ELLIPSIS.len_utf8());
        let mut end = room.min(cleaned.len());
        while !cleaned.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}{ELLIPSIS}{hash}", &cleaned[..end])
    };
    std::borrow::Cow::Owned(fitted)
}

/// Whether `c` breaks a summary's one line ([`summary`] refuses it): a control character, or a
/// line or paragraph separator (U+2028, U+2029), which are not control characters but break
/// the line for JavaScript and most renderers.
pub fn breaks_summary(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

/// `text` as part of one line of a text view: each character that would end the line or drive
/// a terminal ([`breaks_summary`]) as a space. For text read from rows another writer left
/// (decision 0013), which no validation saw.
pub fn on_one_line(text: &str) -> impl Iterator<Item = char> + '_ {
    text.chars()
        .map(|c| if breaks_summary(c) { ' ' } else { c })
}

/// One line of at most 200 characters (Unicode scalar values), not blank, without control
/// characters or line separators ([`breaks_summary`]).
pub fn summary(value: &str) -> Result<(), ValidationError> {
    // Summaries are almost always ASCII: then one pass over the bytes answers all three
    // questions (an ASCII whitespace other than the space is a control character, so only
    // spaces can remain for the blank test).
    let (control, chars, blank) = if value.is_ascii() {
        let bytes = value.as_bytes();
        (
            bytes.iter().any(u8::is_ascii_control),
            bytes.len(),
            bytes.iter().all(|b| *b == b' '),
        )
    } else {
        (
            value.chars().any(breaks_summary),
            value.chars().count(),
            value.trim().is_empty(),
        )
    };
    if control {
        return Err(ValidationError::SummaryNotOneLine);
    }
    if chars > MAX_SUMMARY_CHARS {
        return Err(ValidationError::SummaryTooLong { chars });
    }
    if blank {
        return Err(ValidationError::SummaryBlank);
    }
    Ok(())
}

/// A payload of at most 4 KiB of compact JSON, nested at most [`MAX_JSON_DEPTH`] levels deep.
pub fn payload(value: &Payload) -> Result<(), ValidationError> {
    // Depth first: serializing (to measure the size) recurses once per level.
    within_depth(
        "payload",
        1 + value.values().map(json_depth).max().unwrap_or(0),
    )?;
    let bytes = payload_json(value).len();
    if bytes > MAX_PAYLOAD_BYTES {
        return Err(ValidationError::PayloadTooLarge { bytes });
    }
    Ok(())
}

/// Refuses `what`, nested `depth` levels deep, beyond [`MAX_JSON_DEPTH`].
pub fn within_depth(what: &'static str, depth: usize) -> Result<(), ValidationError> {
    if depth > MAX_JSON_DEPTH {
        return Err(ValidationError::JsonTooDeep { what, depth });
    }
    Ok(())
}

/// How deep `value` nests arrays and objects: 0 for a scalar, 1 for `[]` or `{"a": 1}`.
/// Iterative, so a value nested deeper than the stack allows is measured, not overflowed.
pub fn json_depth(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    let nests = |v: &Value| matches!(v, Value::Array(_) | Value::Object(_));
    // Most payload values are scalars: no stack for them (this runs on every recording).
    if !nests(value) {
        return 0;
    }
    let mut deepest = 0;
    let mut stack = vec![(value, 1)];
    while let Some((v, level)) = stack.pop() {
        deepest = deepest.max(level);
        let below = |c: &&Value| nests(c);
        match v {
            Value::Array(items) => stack.extend(items.iter().filter(below).map(|c| (c, level + 1))),
            Value::Object(map) => stack.extend(map.values().filter(below).map(|c| (c, level + 1))),
            _ => {}
        }
    }
    deepest
}

/// Parses a JSON value into a payload, refusing anything but an object.
pub fn payload_from_value(value: serde_json::Value) -> Result<Payload, ValidationError> {
    match value {
        serde_json::Value::Object(map) => {
            payload(&map)?;
            Ok(map)
        }
        _ => Err(ValidationError::PayloadNotObject),
    }
}

/// The compact JSON text stored for a payload.
pub fn payload_json(value: &Payload) -> String {
    // Serializing a map of JSON values cannot fail.
    serde_json::to_string(value).unwrap_or_default()
}

/// Clamps a producer's time into `[now - 24 h, now]`; a missing time is `now`.
pub fn clamp_occurred_at(occurred_at: Option<Timestamp>, now: Timestamp) -> Timestamp {
    match occurred_at {
        None => now,
        Some(t) => t.clamp(oldest_occurred_at(now), now),
    }
}

/// Whether [`clamp_occurred_at`] moves a producer's time forward: it is more than 24 h before
/// `now` (most often a time in seconds, read as milliseconds).
pub fn occurred_at_too_old(occurred_at: Timestamp, now: Timestamp) -> bool {
    occurred_at < oldest_occurred_at(now)
}

/// The oldest producer's time recorded as given at `now`.
fn oldest_occurred_at(now: Timestamp) -> Timestamp {
    now.minus_ms(MAX_EVENT_AGE_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused key names the character and where it is, and an unknown kind or actor type
    /// lists the accepted spellings: "contains a control character" alone left the user to
    /// find which one, in a key that may be 1 KiB long.
    #[test]
    fn refusals_name_what_is_wrong_and_what_is_accepted() {
        let e = crate::SessionKey::new("agent:main:a\nb").unwrap_err();
        assert_eq!(
            e,
            ValidationError::ControlCharacter {
                what: "session key",
                found: '\n',
                at: 12
            }
        );
        assert!(e.to_string().ends_with("(U+000A at byte 12)"), "{e}");
        let e = crate::EventKind::parse("goal-changed")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("human_direct_message, goal_changed,") && e.contains(" or created)"),
            "{e}"
        );
        let e = crate::ActorType::parse("bot").unwrap_err().to_string();
        assert!(e.ends_with("(the types are human, agent or system)"), "{e}");
    }

    /// A key goes into the one-line notice text as it is: a line or paragraph separator,
    /// which is no control character, is refused like one.
    #[test]
    fn keys_refuse_what_breaks_a_line() {
        for bad in [
            "agent:main:a\u{2028}b",
            "agent:main:a\u{2029}b",
            "agent:main:a\nb",
        ] {
            assert!(
                matches!(
                    crate::SessionKey::new(bad),
                    Err(ValidationError::ControlCharacter { .. })
                ),
                "{bad:?}"
            );
            assert!(crate::AgentId::new(&bad[11..]).is_err(), "{bad:?}");
        }
    }

    /// Text read from rows another writer left is shown on one line: a line or paragraph
    /// separator, which is no control character, becomes a space as a line break does.
    /// (What the mutation did: only control characters replaced, so a U+2028 in a stored
    /// summary broke a row of the CLI's tables; review of stop 69, CQ10.)
    #[test]
    fn text_read_from_rows_is_shown_on_one_line() {
        let shown: String = on_one_line("a\u{2028}b\u{2029}c\nd\u{85}e").collect();
        assert_eq!(shown, "a b c d e", "every line breaker a space");
    }

    /// An agent id refused as empty or with a control character names the agent id, not the
    /// session key, in the error the CLI prints. (What the mutation did: the agent id's
    /// errors said "session key must not be empty"; review of stop 69, CQ29.)
    #[test]
    fn an_agent_ids_refusal_names_the_agent_id() {
        assert_eq!(
            crate::SessionRef::parse("agent:main:main", ""),
            Err(ValidationError::Empty { what: "agent id" })
        );
        let e = crate::AgentId::new("ma\nin").unwrap_err().to_string();
        assert!(e.starts_with("agent id contains"), "{e}");
    }

    #[test]
    fn summaries_fit_and_stay_informative() {
        let fit = |prefix: &str, text: &str, fallback: &str| fit_summary(prefix, text, fallback).0;
        assert_eq!(
            fit_summary("via ", "telegram", "x"),
            ("via telegram".into(), false)
        );
        assert_eq!(
            fit_summary("via ", " telegram ", "x"),
            ("via telegram".into(), false)
        );
        assert_eq!(
            fit_summary("via ", "tele\ngram", "x"),
            ("via tele gram".into(), true)
        );
        assert_eq!(
            fit("via ", "\u{2028}tele\u{2029}gram\u{85}", "x"),
            "via tele gram"
        );
        assert_eq!(fit("via ", "\n\t", "unknown"), "via unknown");
        assert_eq!(fit("via ", "  ", "unknown"), "via unknown");
        assert_eq!(fit("", "", "goal changed"), "goal changed");
        let long = fit("via ", &"é".repeat(300), "x");
        assert_eq!(long.chars().count(), MAX_SUMMARY_CHARS);
        assert!(long.ends_with("é…"), "{long}");
        assert_eq!(summary(&long), Ok(()));
        // Whitespace before the cut is not kept in front of the ellipsis.
        let spaced = fit("", &format!("{} {}", "a".repeat(198), "b".repeat(9)), "x");
        assert_eq!(spaced, format!("{}…", "a".repeat(198)));
        // The review of stop 60 found these three edges untested (each passed under mutation):
        // text that cleans to nothing but is not blank gets the fallback (a goal summary of
        // "\0" was "" and refused as blank); a cleaned text that fits exactly, the prefix
        // counted, keeps its last character.
        assert_eq!(
            fit_summary("via ", "\u{0}", "unknown"),
            ("via unknown".into(), true)
        );
        assert_eq!(fit("", "\u{0}", "goal changed"), "goal changed");
        let exact = fit_summary("via ", &format!("a\n{}", "b".repeat(194)), "x");
        assert_eq!(exact, (format!("via a {}", "b".repeat(194)), true));
        assert_eq!(exact.0.chars().count(), MAX_SUMMARY_CHARS);
    }

    #[test]
    fn keys_fit_and_stay_distinct() {
        assert!(matches!(
            fit_key("run-1", MAX_KEY_BYTES),
            std::borrow::Cow::Borrowed("run-1")
        ));
        let a = fit_key("run\n1", MAX_KEY_BYTES);
        let b = fit_key("run\t1", MAX_KEY_BYTES);
        assert!(a.starts_with("run\u{fffd}1#"), "{a}");
        assert_ne!(a, b, "two originals stay two keys");
        assert_eq!(a, fit_key("run\n1", MAX_KEY_BYTES), "deterministic");
        assert_eq!(key("run id", &a), Ok(()));
        for long in [
            "r".repeat(5000),
            "é".repeat(3000),
            format!("{}\n", "r".repeat(MAX_KEY_BYTES)),
        ] {
            let fitted = fit_key(&long, MAX_KEY_BYTES);
            assert!(fitted.len() <= MAX_KEY_BYTES, "{}", fitted.len());
            assert!(fitted.len() > MAX_KEY_BYTES - 24, "{}", fitted.len());
            assert!(fitted.contains("…#"), "{fitted}");
            assert_eq!(key("run id", &fitted), Ok(()));
        }
        // The review of stop 60 found these edges untested (each passed under mutation). A
        // cut between the bytes of a three-byte character moves back to its start, not past
        // it: the key fits, at either limit.
        for (value, max) in [
            ("€".repeat(2000), MAX_KEY_BYTES),
            ("€".repeat(5000), MAX_DEDUPE_KEY_BYTES),
        ] {
            let fitted = fit_key(&value, max);
            assert!(fitted.len() <= max, "{} > {max}", fitted.len());
            assert!(fitted.contains("…#"), "{fitted}");
        }
        assert_eq!(
            key("run id", &fit_key(&"€".repeat(2000), MAX_KEY_BYTES)),
            Ok(())
        );
        assert_eq!(
            dedupe_key(&fit_key(&"€".repeat(5000), MAX_DEDUPE_KEY_BYTES)),
            Ok(())
        );
        // A valid key of exactly the limit is returned as it is.
        let whole = "r".repeat(MAX_KEY_BYTES);
        assert!(matches!(
            fit_key(&whole, MAX_KEY_BYTES),
            std::borrow::Cow::Borrowed(v) if v == whole
        ));
        // A cleaned key that fits exactly with its hash (`#` and 16 hex digits) is not cut.
        // "\n" cleans to U+FFFD, three bytes: 3 + 1004 + 17 = 1024.
        let broken = format!("\n{}", "r".repeat(MAX_KEY_BYTES - 20));
        let cleaned_fits = fit_key(&broken, MAX_KEY_BYTES);
        assert_eq!(cleaned_fits.len(), MAX_KEY_BYTES, "{cleaned_fits}");
        assert!(!cleaned_fits.contains('…'), "cut needlessly");
    }

    /// A fitted key passes the key rules whatever the original held: a line or paragraph
    /// separator (no control character) is replaced as a control character is, and a value of
    /// one-byte control characters that fits only before they become three-byte U+FFFD is cut.
    /// (What the mutations did: a value with only U+2028 returned unchanged, which the key
    /// rules then refused; the room checked on the original's length, so the cleaned key came
    /// out 3,017 bytes long; review of stop 70, AU30 and AU31.)
    #[test]
    fn a_fitted_key_passes_the_key_rules() {
        let separated = fit_key("run\u{2028}1", MAX_KEY_BYTES);
        assert_eq!(key("run id", &separated), Ok(()), "{separated:?}");
        assert!(separated.starts_with("run\u{fffd}1#"), "{separated:?}");
        let newlines = "\n".repeat(1000);
        let controls = fit_key(&newlines, MAX_KEY_BYTES);
        assert!(controls.len() <= MAX_KEY_BYTES, "{} bytes", controls.len());
        assert_eq!(key("run id", &controls), Ok(()));
    }

    use serde_json::json;

    #[test]
    fn json_depth_counts_the_deepest_branch() {
        assert_eq!(json_depth(&json!(1)), 0);
        assert_eq!(json_depth(&json!([])), 1);
        assert_eq!(json_depth(&json!({"a": 1, "b": "x"})), 1);
        assert_eq!(
            json_depth(&json!({"a": [1, {"b": [[]]}], "c": {"d": 2}})),
            5
        );
        assert_eq!(json_depth(&json!([[1], [[2]], 3])), 3);
    }

    /// The depth of an object is that of its deepest value, whichever key holds it: a payload
    /// nested too deep under its second key is refused. (What the mutation did: only an
    /// object's first value measured; review of stop 70, AU32.)
    #[test]
    fn an_objects_depth_is_its_deepest_values() {
        assert_eq!(json_depth(&json!({"a": 1, "b": [[1]]})), 3);
        let mut deep = json!(1);
        for _ in 0..MAX_JSON_DEPTH {
            deep = json!([deep]);
        }
        assert_eq!(
            payload_from_value(json!({"a": 1, "b": deep})),
            Err(ValidationError::JsonTooDeep {
                what: "payload",
                depth: MAX_JSON_DEPTH + 1
            })
        );
    }

    /// The deepest payload allowed still reads back with serde_json (at most 128 levels) once
    /// wrapped in a page of events, as a caller of the protocol reads it. (What the mutation
    /// did: a limit of 126 levels, which the stores read back alone, but a page of them was
    /// 129 levels deep and failed every reader; review of stop 69, CQ12.)
    #[test]
    fn the_deepest_payload_allowed_reads_back_in_a_page() {
        let mut value = json!(1);
        for _ in 1..MAX_JSON_DEPTH {
            value = json!([value]);
        }
        let mut deepest = Payload::new();
        deepest.insert("x".into(), value);
        assert_eq!(payload(&deepest), Ok(()));
        let event = crate::NewEvent::new(
            crate::SessionRef::parse("agent:main:main", "main").unwrap(),
            crate::EventKind::GoalChanged,
            crate::ActorType::System,
            "x",
        )
        .with_payload(deepest)
        .into_event(crate::Sequence(1), Timestamp(0));
        let page = serde_json::to_string(&json!({ "events": [event] })).unwrap();
        let read = serde_json::from_str::<serde_json::Value>(&page);
        assert!(read.is_ok(), "{read:?}");
    }

    #[test]
    fn summaries() {
        assert!(summary("human message via telegram").is_ok());
        assert!(summary(&"é".repeat(200)).is_ok());
        assert_eq!(
            summary(&"é".repeat(201)),
            Err(ValidationError::SummaryTooLong { chars: 201 })
        );
        assert_eq!(summary("a\nb"), Err(ValidationError::SummaryNotOneLine));
        assert_eq!(summary("a\tb"), Err(ValidationError::SummaryNotOneLine));
        assert_eq!(summary("a\u{7f}"), Err(ValidationError::SummaryNotOneLine));
        assert_eq!(summary("  "), Err(ValidationError::SummaryBlank));
        assert_eq!(summary(""), Err(ValidationError::SummaryBlank));
        assert_eq!(summary(" \u{3000} "), Err(ValidationError::SummaryBlank));
        assert_eq!(summary(" \u{b} "), Err(ValidationError::SummaryNotOneLine));
        assert_eq!(summary("é\u{85}"), Err(ValidationError::SummaryNotOneLine));
        assert_eq!(
            summary("line one\u{2028}line two"),
            Err(ValidationError::SummaryNotOneLine)
        );
        assert_eq!(
            summary("a\u{2029}b"),
            Err(ValidationError::SummaryNotOneLine)
        );
        assert!(summary(&"a".repeat(200)).is_ok());
        assert_eq!(
            summary(&"a".repeat(201)),
            Err(ValidationError::SummaryTooLong { chars: 201 })
        );
        assert_eq!(
            summary(&format!("{}\n", "a".repeat(300))),
            Err(ValidationError::SummaryNotOneLine),
            "a control character is reported before the length"
        );
        // A blank summary past the limit is refused for its length, as any summary past it
        // is: the length is checked before blankness. (What the mutation did: 300 spaces
        // refused as blank; review of stop 69, CQ13.)
        assert_eq!(
            summary(&" ".repeat(300)),
            Err(ValidationError::SummaryTooLong { chars: 300 })
        );
    }

    proptest::proptest! {
        /// The ASCII fast path answers exactly as the general rules written with `char`s.
        #[test]
        fn summary_fast_path_agrees_with_the_rules(
            value in "[ -~\t\n\u{7f}\u{3000}\u{2028}\u{2029}é]{0,210}"
        ) {
            let breaks = |c: char| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}');
            proptest::prop_assert!(value.chars().all(|c| breaks(c) == breaks_summary(c)));
            let general = if value.chars().any(breaks) {
                Err(ValidationError::SummaryNotOneLine)
            } else if value.chars().count() > MAX_SUMMARY_CHARS {
                Err(ValidationError::SummaryTooLong { chars: value.chars().count() })
            } else if value.trim().is_empty() {
                Err(ValidationError::SummaryBlank)
            } else {
                Ok(())
            };
            proptest::prop_assert_eq!(summary(&value), general);
        }
    }

    #[test]
    fn payloads() {
        let small = payload_from_value(json!({"turns": 3})).unwrap();
        assert_eq!(payload_json(&small), r#"{"turns":3}"#);
        assert_eq!(
            payload_from_value(json!([1])),
            Err(ValidationError::PayloadNotObject)
        );
        let big = json!({"x": "a".repeat(MAX_PAYLOAD_BYTES)});
        assert!(matches!(
            payload_from_value(big),
            Err(ValidationError::PayloadTooLarge { .. })
        ));
        // exactly at the limit passes: {"x":"..."} is 8 bytes of framing
        let edge = json!({"x": "a".repeat(MAX_PAYLOAD_BYTES - 8)});
        assert!(payload_from_value(edge).is_ok());
        // One byte past 4 KiB (README, decision 0021) is refused. (What the mutation did: a
        // limit of 4,097 bytes, which the tests above, built on the constant, followed; review
        // of stop 69, CQ27.)
        assert_eq!(
            payload_from_value(json!({"x": "a".repeat(4089)})),
            Err(ValidationError::PayloadTooLarge { bytes: 4097 })
        );
    }

    /// The payload limit is 4 KiB of JSON bytes, not characters: a payload of 2,100 two-byte
    /// characters (4,208 bytes) is refused. (What the mutation did: the size counted in
    /// characters, so a non-ASCII payload up to twice the limit was written; review of stop 70,
    /// AU23.)
    #[test]
    fn the_payload_limit_counts_bytes() {
        assert_eq!(
            payload_from_value(json!({"x": "é".repeat(2100)})).map(|_| ()),
            Err(ValidationError::PayloadTooLarge { bytes: 4208 }),
            "2,100 two-byte characters"
        );
    }

    #[test]
    fn keys() {
        assert_eq!(key("k", ""), Err(ValidationError::Empty { what: "k" }));
        assert!(key("k", "a\u{0}").is_err());
        assert!(key("k", &"a".repeat(MAX_KEY_BYTES + 1)).is_err());
        assert_eq!(
            key("k", &"a".repeat(MAX_KEY_BYTES + 1)),
            Err(ValidationError::TooLong {
                what: "k",
                len: MAX_KEY_BYTES + 1,
                max: MAX_KEY_BYTES
            })
        );
    }

    /// A key or id is at most 1 KiB (DESIGN.md section 3): 1,024 bytes pass, 1,025 are refused,
    /// and so are 600 two-byte characters. (What the mutations did: a limit of 1,025 bytes,
    /// which every test built on the constant followed; the length counted in characters, which
    /// ASCII keys cannot tell from bytes; review of stop 70, AU26 and AU36.)
    #[test]
    fn a_key_is_at_most_one_kib() {
        assert_eq!(key("k", &"a".repeat(1024)), Ok(()));
        assert_eq!(
            key("k", &"a".repeat(1025)),
            Err(ValidationError::TooLong {
                what: "k",
                len: 1025,
                max: 1024
            }),
            "one byte past 1 KiB"
        );
        assert_eq!(
            key("k", &"é".repeat(600)),
            Err(ValidationError::TooLong {
                what: "k",
                len: 1200,
                max: 1024
            }),
            "600 characters of two bytes"
        );
    }

    /// A refused key's character is placed in bytes from the start, as its error says, past
    /// characters of more than one byte too. (What the mutation did: the place counted in
    /// characters, which ASCII keys cannot tell from bytes; review of stop 70, AU19.)
    #[test]
    fn a_refused_keys_character_is_placed_in_bytes() {
        assert_eq!(
            key("k", "é€\nb"),
            Err(ValidationError::ControlCharacter {
                what: "k",
                found: '\n',
                at: 5
            }),
            "é is 2 bytes and € 3"
        );
    }

    /// A dedupe key built, as DESIGN.md builds them, out of a session key and ids of the
    /// longest accepted length is accepted; past 4 KiB it is refused, naming its limit.
    #[test]
    fn dedupe_keys() {
        let long = "a".repeat(MAX_KEY_BYTES);
        let created = format!("created:{long}:{long}:{long}");
        assert!(key("session key", &long).is_ok());
        assert!(dedupe_key(&created).is_ok(), "{} bytes", created.len());
        let upstream = format!("upstream:{long}:{:016x}:{long}", 7);
        assert!(dedupe_key(&upstream).is_ok());
        let err = dedupe_key(&"a".repeat(MAX_DEDUPE_KEY_BYTES + 1)).unwrap_err();
        assert_eq!(
            err,
            ValidationError::TooLong {
                what: "dedupe key",
                len: MAX_DEDUPE_KEY_BYTES + 1,
                max: MAX_DEDUPE_KEY_BYTES
            }
        );
        assert!(err.to_string().contains("at most 4096"), "{err}");
        assert!(dedupe_key("dk\u{0}").is_err());
    }

    #[test]
    fn clamping() {
        let now = Timestamp(1_802_678_400_000);
        assert_eq!(clamp_occurred_at(None, now), now);
        assert_eq!(
            clamp_occurred_at(Some(Timestamp(0)), now),
            Timestamp(1_802_592_000_000)
        );
        assert_eq!(
            clamp_occurred_at(Some(Timestamp(1_803_456_000_000)), now),
            now
        );
        let inside = Timestamp(1_802_600_000_000);
        assert_eq!(clamp_occurred_at(Some(inside), now), inside);
        // Too old exactly when the clamp moves it forward.
        for t in [
            Timestamp(0),
            Timestamp(1_802_591_999_999),
            Timestamp(1_802_592_000_000),
            inside,
        ] {
            assert_eq!(
                occurred_at_too_old(t, now),
                clamp_occurred_at(Some(t), now) != t,
                "{t:?}"
            );
        }
    }
}
