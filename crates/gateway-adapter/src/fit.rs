//! Fitting gateway-provided metadata (a channel name, a run or session id, a caller's dedupe key
//! or payload) into the event rules of DESIGN.md section 3, so that metadata can
//! never make a producer lose its event: a store refuses the whole event when one of its
//! fields breaks a rule, and a best-effort producer would only log that.
//!
//! The rules are awareness-core's, so that every producer fits the same text the same way:
//! display text in a summary by [`validate::fit_summary`] (line breaks become spaces, too long
//! is cut and ends with `…`), ids and keys by [`validate::fit_key`] (control characters become
//! U+FFFD, too long is cut, a changed value ends with `#` and the hash of the original, so two
//! originals never merge and a retry still deduplicates). This module adds what is the
//! adapter's: an empty optional id is dropped, a payload the payload rules refuse (over 4 KiB,
//! or nested deeper than 64 levels) is left out (payload values themselves are kept as given),
//! and each change is logged (`tracing::warn`) with the session key, the event kind and the
//! field.

use std::borrow::Cow;

use awareness_core::validate::{self, MAX_KEY_BYTES, MAX_SUMMARY_CHARS};
use awareness_core::{EventKind, Payload, SessionKey};
use tracing::warn;

/// Fits the metadata of one event about `session`, logging what it changes.
#[derive(Debug, Clone)]
pub(crate) struct Fit<'a> {
    session: &'a SessionKey,
    kind: EventKind,
}

impl<'a> Fit<'a> {
    /// For an event of `kind` about `session`.
    pub(crate) fn new(session: &'a SessionKey, kind: EventKind) -> Self {
        Self { session, kind }
    }

    /// `prefix` then `text` (the gateway's `field`) as a valid summary
    /// ([`validate::fit_summary`]: `fallback` for blank text), logging a change.
    pub(crate) fn summary(
        &self,
        field: &'static str,
        prefix: &str,
        text: &str,
        fallback: &str,
    ) -> String {
        let (fitted, changed) = validate::fit_summary(prefix, text, fallback);
        if changed {
            warn!(
                session_key = %self.session,
                kind = %self.kind,
                field,
                chars = text.chars().count(),
                summary = %fitted,
                "the {field} did not fit a one-line summary of {MAX_SUMMARY_CHARS} characters; line breaks and control characters were replaced and it was shortened to fit"
            );
        }
        fitted
    }

    /// `value` (the gateway's `field`, an id or key) as a key of at most `max` bytes
    /// ([`validate::fit_key`]), logging a change.
    pub(crate) fn key<'v>(&self, field: &'static str, value: &'v str, max: usize) -> Cow<'v, str> {
        let fitted = validate::fit_key(value, max);
        if let Cow::Owned(changed) = &fitted {
            warn!(
                session_key = %self.session,
                kind = %self.kind,
                field,
                bytes = value.len(),
                fitted = %changed,
                "the {field} broke the key rules (at most {max} bytes, no control characters); control characters were replaced, it was shortened and its hash appended"
            );
        }
        fitted
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

    /// Ids are fitted by the core rule ([`validate::fit_key`]); an empty optional one is
    /// dropped, and a valid one kept as given.
    #[test]
    fn optional_ids_are_fitted_or_dropped() {
        let f = fit();
        assert_eq!(f.id("run id", Some(String::new())), None);
        assert_eq!(f.id("run id", None), None);
        assert_eq!(f.id("run id", Some("r".into())).as_deref(), Some("r"));
        let fitted = f.id("run id", Some("run\n1".into())).expect("kept");
        assert_eq!(fitted, validate::fit_key("run\n1", MAX_KEY_BYTES));
        assert_eq!(validate::key("run id", &fitted), Ok(()));
    }

    /// Only an empty id is dropped: one of spaces is a value within the key rule, and is kept as
    /// given. (What the mutation did: a blank id was dropped too, so a caller's dedupe key of
    /// spaces no longer deduplicated its retries; review of stop 67, GB32.)
    #[test]
    fn an_id_of_spaces_is_kept() {
        let f = fit();
        assert_eq!(validate::key("run id", " "), Ok(()), "within the key rule");
        assert_eq!(f.id("run id", Some(" ".into())).as_deref(), Some(" "));
    }

    /// An id of exactly [`MAX_KEY_BYTES`] bytes is within the key rule and kept as given; one byte
    /// more is cut and hashed. (What the mutation did: a limit one byte short, an id the core takes
    /// was recorded cut and hashed, and no longer matched the gateway's; review of stop 63, W03.)
    #[test]
    fn an_id_of_exactly_the_key_limit_is_kept() {
        let f = fit();
        let at_limit = "a".repeat(MAX_KEY_BYTES);
        assert_eq!(
            f.id("run id", Some(at_limit.clone())),
            Some(at_limit),
            "an id of exactly the limit is kept"
        );
        let over = "a".repeat(MAX_KEY_BYTES + 1);
        assert_ne!(f.id("run id", Some(over.clone())), Some(over));
    }

    /// Only a summary that had to be changed to fit is warned of. (What the mutation did: the
    /// condition turned round, every summary that fit was warned of and a cut one was not; review
    /// of stop 63, W02.)
    #[test]
    fn only_a_summary_that_was_changed_is_warned_of() {
        let capture = awareness_core::testkit::logs::Capture::default();
        let _logs = capture.install();
        let f = fit();
        f.summary("message text", "", "short and fine", "fallback");
        assert_eq!(
            capture.said(&["did not fit a one-line summary"]),
            0,
            "a summary that fits is not warned of: {:#?}",
            capture.lines()
        );
        f.summary(
            "message text",
            "",
            &"x".repeat(MAX_SUMMARY_CHARS + 10),
            "fallback",
        );
        assert_eq!(
            capture.said(&["did not fit a one-line summary", "level=WARN"]),
            1,
            "a cut summary is warned of: {:#?}",
            capture.lines()
        );
    }

    /// An empty id that is dropped is warned of, with its field, as every change this module
    /// makes is. (What the mutation did: the empty id dropped without a word, the operator could
    /// not tell why an event came without its run id; review of stop 68, GD28.)
    #[test]
    fn a_dropped_empty_id_is_warned_of() {
        let capture = awareness_core::testkit::logs::Capture::default();
        let _logs = capture.install();
        assert_eq!(fit().id("run id", Some(String::new())), None);
        assert_eq!(
            capture.said(&["the run id is empty", "level=WARN"]),
            1,
            "the dropped id is warned of: {:#?}",
            capture.lines()
        );
    }

    /// A payload the payload rules refuse is left out and warned of, with its field, as every
    /// change this module makes is; one within the rules is kept without a word. (What the
    /// mutation did: the payload dropped without a word, the operator could not tell why an event
    /// came without the payload the gateway gave; review of stop 72, GH08.)
    #[test]
    fn a_payload_left_out_is_warned_of() {
        let capture = awareness_core::testkit::logs::Capture::default();
        let _logs = capture.install();
        let mut fits = Payload::new();
        fits.insert("note".into(), "n".into());
        assert_eq!(fit().payload("payload", fits.clone()), Some(fits));
        assert_eq!(
            capture.said(&["broke the payload rules"]),
            0,
            "a payload that fits is not warned of: {:#?}",
            capture.lines()
        );
        let mut too_large = Payload::new();
        too_large.insert("note".into(), "n".repeat(5000).into());
        assert_eq!(fit().payload("payload", too_large), None, "left out");
        assert_eq!(
            capture.said(&["the payload broke the payload rules", "level=WARN"]),
            1,
            "the payload left out is warned of: {:#?}",
            capture.lines()
        );
    }

    /// An id the gateway did not give is left out without a word: only an empty one is warned
    /// of. (What the mutation did: an absent id was taken for an empty one, and every event
    /// without a run id logged a warning that its run id was empty; review of stop 70, GE12.)
    #[test]
    fn an_absent_id_is_not_warned_of() {
        let capture = awareness_core::testkit::logs::Capture::default();
        let _logs = capture.install();
        assert_eq!(fit().id("run id", None), None);
        assert_eq!(
            capture.said(&["the run id is empty"]),
            0,
            "an absent id is not warned of: {:#?}",
            capture.lines()
        );
    }
}
