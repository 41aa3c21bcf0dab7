//! awareness-core's fitting of a gateway's text into what validation accepts
//! (`validate::fit_summary`, `validate::fit_key`), on any text: a fitted summary is a valid
//! summary, a fitted key a valid key (or dedupe key) within its bound, text that was valid
//! already is kept as it is, a text that had to change keeps what it can (a summary: the prefix,
//! then the text with each character that breaks the line as a space, cut with `…` only where
//! too long; a key: the text with each such character as U+FFFD, cut with `…` only where too
//! long, then `#` and the FNV-1a hash of the original), and two texts fit alike only when their
//! hashes collide or one is already the fitted form of the other (a dedupe key never merges two
//! events by accident).

use awareness_core::upstream::fnv1a64;
use awareness_core::validate::{
    self, ELLIPSIS, MAX_DEDUPE_KEY_BYTES, MAX_KEY_BYTES, MAX_SUMMARY_CHARS, breaks_key,
    breaks_summary, dedupe_key, fit_key, fit_summary, summary,
};

/// Summary prefixes gateways use (short constants, as `fit_summary` requires).
const PREFIXES: [&str; 3] = ["", "Human message in ", "Goal changed: "];

/// Runs the target on one input (any bytes); panics on a failure. Whether a fitted value was
/// checked beyond "valid text is kept": a summary or a key that had to change.
pub fn run(data: &[u8]) -> bool {
    let Some((&pick, rest)) = data.split_first() else {
        return false;
    };
    let text = String::from_utf8_lossy(rest);
    // Two texts from one input: the second after the first `\u{1}` byte, if any.
    let (a, b) = text.split_once('\u{1}').unwrap_or((&text, ""));

    let prefix = PREFIXES[usize::from(pick) % PREFIXES.len()];
    let mut compared = fitted_summary(prefix, a);

    for (max, valid) in [
        (MAX_KEY_BYTES, validate::key as fn(&'static str, &str) -> _),
        (MAX_DEDUPE_KEY_BYTES, |_, v: &str| dedupe_key(v)),
    ] {
        let max = if pick & 0x80 != 0 {
            max
        } else {
            40 + usize::from(pick % 64)
        };
        let fa = fit_key(a, max);
        let fb = fit_key(b, max);
        for (value, fitted) in [(a, &fa), (b, &fb)] {
            compared |= fitted_key(value, fitted, max, valid);
        }
        if fa == fb && a != b {
            // Two texts fit alike only when both had to change and their hashes collide (each
            // ends with its own, [`fitted_key`]), or one is a valid key kept as it is that is
            // exactly the other's fitted form (the other changed into it).
            let collide = fa != a && fb != b && fnv1a64(a.as_bytes()) == fnv1a64(b.as_bytes());
            let a_is_b_fitted = fa == a && fb != b;
            let b_is_a_fitted = fb == b && fa != a;
            assert!(
                collide || a_is_b_fitted || b_is_a_fitted,
                "{a:?} and {b:?} both fit as {fa:?}"
            );
        }
    }
    compared
}

/// `fit_summary(prefix, a, ..)` checked; whether it changed the text.
fn fitted_summary(prefix: &str, a: &str) -> bool {
    let fallback = "(no text)";
    let (fitted, changed) = fit_summary(prefix, a, fallback);
    assert!(summary(&fitted).is_ok(), "{fitted:?} from {a:?}");
    let shown = Some(a.trim()).filter(|t| !t.is_empty()).unwrap_or(fallback);
    let whole = format!("{prefix}{shown}");
    if summary(&whole).is_ok() {
        assert_eq!((fitted.as_str(), changed), (whole.as_str(), false));
        return false;
    }
    assert!(changed, "{a:?} fitted as {fitted:?} unchanged");
    // The text as fitted: each character that breaks the line a space, trimmed (the fallback
    // when nothing is left), after the prefix; cut to the room left, ending with `…`, only
    // where too long.
    let cleaned: String = shown
        .chars()
        .map(|c| if breaks_summary(c) { ' ' } else { c })
        .collect();
    let cleaned = Some(cleaned.trim())
        .filter(|t| !t.is_empty())
        .unwrap_or(fallback);
    let rest = fitted
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{fitted:?} from {a:?} lost its prefix {prefix:?}"));
    let room = MAX_SUMMARY_CHARS - prefix.chars().count();
    if cleaned.chars().count() <= room {
        assert_eq!(rest, cleaned, "{a:?} fitted as {fitted:?}");
    } else {
        let kept = rest
            .strip_suffix(ELLIPSIS)
            .unwrap_or_else(|| panic!("{a:?} cut as {fitted:?} without {ELLIPSIS:?}"));
        let dropped = cleaned
            .strip_prefix(kept)
            .unwrap_or_else(|| panic!("{a:?} cut as {fitted:?}: not a prefix of {cleaned:?}"));
        // All the room is used, but for whitespace trimmed before the ellipsis.
        let kept_chars = kept.chars().count();
        assert!(kept_chars < room, "{a:?} cut as {fitted:?}: over {room}");
        assert!(
            kept == kept.trim_end()
                && dropped
                    .chars()
                    .take(room - 1 - kept_chars)
                    .all(char::is_whitespace),
            "{a:?} cut as {fitted:?}: cut short or with trailing whitespace"
        );
    }
    true
}

/// `fitted`, the fit of `value` into a key of `max` bytes that `valid` accepts, checked;
/// whether `value` had to change.
fn fitted_key(
    value: &str,
    fitted: &str,
    max: usize,
    valid: fn(&'static str, &str) -> Result<(), validate::ValidationError>,
) -> bool {
    if value.is_empty() {
        assert_eq!(fitted, "", "an empty key stays empty");
        return false;
    }
    assert!(
        fitted.len() <= max,
        "{} bytes over {max}: {value:?}",
        fitted.len()
    );
    assert!(valid("key", fitted).is_ok(), "{fitted:?} from {value:?}");
    if value.len() <= max && valid("key", value).is_ok() {
        assert_eq!(fitted, value, "a valid key is kept");
        return false;
    }
    // Changed: the value, each character that breaks a key as U+FFFD, cut with `…` where too
    // long, then `#` and the hash of the value itself.
    let hash = format!("#{:016x}", fnv1a64(value.as_bytes()));
    let body = fitted
        .strip_suffix(hash.as_str())
        .unwrap_or_else(|| panic!("{value:?} fitted as {fitted:?}, not ending with {hash}"));
    let cleaned = value.replace(breaks_key, "\u{FFFD}");
    if body != cleaned {
        let cut = body
            .strip_suffix(ELLIPSIS)
            .unwrap_or_else(|| panic!("{value:?} fitted as {fitted:?}: neither whole nor cut"));
        assert!(
            cleaned.starts_with(cut),
            "{value:?} fitted as {fitted:?}: not a prefix of {cleaned:?}"
        );
        assert!(
            cleaned.len() + hash.len() > max,
            "{value:?} cut as {fitted:?} though it fits whole"
        );
        // Cut on the character boundary at or before the room left (a character is at most 4
        // bytes).
        assert!(
            fitted.len() + 3 >= max,
            "{value:?} cut as {fitted:?}: shorter than it need be for {max}"
        );
    }
    true
}
