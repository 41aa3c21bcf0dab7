//! Fitting gateway-provided metadata (a channel name, a run or session id, a caller's dedupe key
//! or payload) into the event rules of DESIGN.md section 3, so that metadata can
//! never make a producer lose its event: a store refuses the whole event when one of its
//! fields breaks a rule, and a best-effort producer would only log that.
//!
//! - Display text in a summary keeps its meaning: every character the summary rules refuse
//!   becomes a space, and text too long for the summary is cut on a character boundary and
//!   ends with `…`.
//! - An id or key keeps its identity: a refused character becomes U+FFFD, a value too long is
//!   cut, and a value changed either way ends with `#` and the FNV-1a 64 hash of the original
//!   ([`upstream::fnv1a64`]), so two different originals stay different (a dedupe key never
//!   merges two events) and one original always gives the same value (a retry still
//!   deduplicates, a `child_spawned` and its run's outcome still carry the same run id).
//! - An empty optional id is dropped, and so is a payload the payload rules refuse (over 4 KiB,
//!   or nested deeper than 64 levels); payload values themselves are kept as given.
//!
//! Each change is logged (`tracing::warn`) with the session key, the event kind and the field.

use std::borrow::Cow;

use awareness_core::validate::{self, MAX_KEY_BYTES, MAX_SUMMARY_CHARS};
use awareness_core::{EventKind, Payload, SessionKey, upstream};
use tracing::warn;

/// What ends a summary that was cut.
pub(crate) const ELLIPSIS: char = '…';

/// What stands for a character an id may not hold.
const REPLACEMENT: char = char::REPLACEMENT_CHARACTER;

/// Whether the key rules ([`validate::key`], [`validate::dedupe_key`]) refuse `c`.
fn breaks_key(c: char) -> bool {
    c.is_control()
}

/// `text`, cut to at most `max` characters: its first `max - 1` characters (less trailing
/// whitespace) and [`ELLIPSIS`]. Unchanged when it fits.
fn shorten(text: &str, max: usize) -> Cow<'_, str> {
    if text.chars().count() <= max {
        return Cow::Borrowed(text);
    }
    let Some(keep) = max.checked_sub(1) else {
        return Cow::Borrowed("");
    };
    let end = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
    let mut out = text[..end].trim_end().to_owned();
    out.push(ELLIPSIS);
    Cow::Owned(out)
}

/// Fits the metadata of one event about `session`, logging what it changes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fit<'a> {
    session: &'a SessionKey,
    kind: EventKind,
}

impl<'a> Fit<'a> {
    /// For an event of `kind` about `session`.
    pub(crate) fn new(session: &'a SessionKey, kind: EventKind) -> Self {
        Self { session, kind }
    }

    /// `prefix` then `text` (the gateway's `field`), as a valid summary: unchanged when it is
    /// one; else each character the summary rules refuse becomes a space, the text is trimmed
    /// (`fallback` when nothing is left) and cut to the room the prefix leaves, ending with
    /// [`ELLIPSIS`]. `prefix` is a producer's constant: ASCII, one line and short.
    pub(crate) fn summary(
        &self,
        field: &'static str,
        prefix: &str,
        text: &str,
        fallback: &str,
    ) -> String {
        let whole = format!("{prefix}{text}");
        if validate::summary(&whole).is_ok() {
            return whole;
        }
        let cleaned: String = text
            .chars()
            .map(|c| if validate::breaks_summary(c) { ' ' } else { c })
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
            validate::summary(&fitted).is_ok(),
            "a fitted summary is valid: {fitted:?}"
        );
        warn!(
            session_key = %self.session,
            kind = %self.kind,
            field,
            chars = text.chars().count(),
            summary = %fitted,
            "the {field} did not fit a one-line summary of {MAX_SUMMARY_CHARS} characters; line breaks and control characters were replaced and it was shortened to fit"
        );
        fitted
    }

    /// `value` (the gateway's `field`, an id or key) as a key of at most `max` bytes without
    /// control characters: unchanged when it is one; else each control character becomes
    /// U+FFFD, the value is cut to fit on a character boundary, and `#` with the hash of the
    /// original is appended (`…#<hash>` when it was cut). An empty value stays empty.
    pub(crate) fn key<'v>(&self, field: &'static str, value: &'v str, max: usize) -> Cow<'v, str> {
        if value.len() <= max && !value.chars().any(breaks_key) {
            return Cow::Borrowed(value);
        }
        let hash = format!("#{:016x}", upstream::fnv1a64(value.as_bytes()));
        let cleaned: String = value
            .chars()
            .map(|c| if breaks_key(c) { REPLACEMENT } else { c })
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
        warn!(
            session_key = %self.session,
            kind = %self.kind,
            field,
            bytes = value.len(),
            fitted = %fitted,
            "the {field} broke the key rules (at most {max} bytes, no control characters); control characters were replaced, it was shortened and its hash appended"
        );
        Cow::Owned(fitted)
    }

    /// An optional id (at most [`MAX_KEY_BYTES`]) fitted as [`Fit::key`] does; an empty one is
    /// dropped.
    pub(crate) fn id(&self, field: &'static str, value: Option<String>) -> Option<String> {
        self.optional_key(field, value, MAX_KEY_BYTES)
    }

    /// An optional key of at most `max` bytes fitted as [`Fit::key`] does; an empty one is
    /// dropped.
    pub(crate) fn optional_key(
        &self,
        field: &'static str,
        value: Option<String>,
        max: usize,
    ) -> Option<String> {
        let value = value?;
        if value.is_empty() {
            warn!(session_key = %self.session, kind = %self.kind, field, "the {field} is empty; the event is recorded without it");
            return None;
        }
        Some(match self.key(field, &value, max) {
            Cow::Borrowed(_) => value,
            Cow::Owned(fitted) => fitted,
        })
    }

    /// The payload when it is within the payload rules; else `None`, logged.
    pub(crate) fn payload(&self, field: &'static str, payload: Payload) -> Option<Payload> {
        match validate::payload(&payload) {
            Ok(()) => Some(payload),
            Err(e) => {
                warn!(session_key = %self.session, kind = %self.kind, field, error = %e, "the {field} broke the payload rules; the event is recorded without it");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fit() -> Fit<'static> {
        static KEY: std::sync::OnceLock<SessionKey> = std::sync::OnceLock::new();
        Fit::new(
            KEY.get_or_init(|| SessionKey::new("agent:main:main").unwrap()),
            EventKind::HumanDirectMessage,
        )
    }

    #[test]
    fn summaries_fit_and_stay_informative() {
        let f = fit();
        assert_eq!(
            f.summary("channel", "via ", "telegram", "x"),
            "via telegram"
        );
        assert_eq!(
            f.summary("channel", "via ", "tele\ngram", "x"),
            "via tele gram"
        );
        assert_eq!(
            f.summary("channel", "via ", "\u{2028}tele\u{2029}gram\u{85}", "x"),
            "via tele gram"
        );
        assert_eq!(
            f.summary("channel", "via ", "\n\t", "unknown"),
            "via unknown"
        );
        assert_eq!(f.summary("goal", "", "", "goal changed"), "goal changed");
        let long = f.summary("channel", "via ", &"é".repeat(300), "x");
        assert_eq!(long.chars().count(), MAX_SUMMARY_CHARS);
        assert!(long.ends_with("é…"), "{long}");
        assert_eq!(validate::summary(&long), Ok(()));
        // Whitespace before the cut is not kept in front of the ellipsis.
        let spaced = f.summary(
            "channel",
            "",
            &format!("{} {}", "a".repeat(198), "b".repeat(9)),
            "x",
        );
        assert_eq!(spaced, format!("{}…", "a".repeat(198)));
    }

    #[test]
    fn keys_fit_and_stay_distinct() {
        let f = fit();
        assert_eq!(f.key("run id", "run-1", MAX_KEY_BYTES), "run-1");
        let a = f.key("run id", "run\n1", MAX_KEY_BYTES);
        let b = f.key("run id", "run\t1", MAX_KEY_BYTES);
        assert!(a.starts_with("run\u{fffd}1#"), "{a}");
        assert_ne!(a, b, "two originals stay two keys");
        assert_eq!(a, f.key("run id", "run\n1", MAX_KEY_BYTES), "deterministic");
        assert_eq!(validate::key("run id", &a), Ok(()));
        for long in [
            "r".repeat(5000),
            "é".repeat(3000),
            format!("{}\n", "r".repeat(MAX_KEY_BYTES)),
        ] {
            let fitted = f.key("run id", &long, MAX_KEY_BYTES);
            assert!(fitted.len() <= MAX_KEY_BYTES, "{}", fitted.len());
            assert!(fitted.len() > MAX_KEY_BYTES - 24, "{}", fitted.len());
            assert!(fitted.contains("…#"), "{fitted}");
            assert_eq!(validate::key("run id", &fitted), Ok(()));
        }
        assert_eq!(f.id("run id", Some(String::new())), None);
        assert_eq!(f.id("run id", None), None);
        assert_eq!(f.id("run id", Some("r".into())).as_deref(), Some("r"));
    }
}
