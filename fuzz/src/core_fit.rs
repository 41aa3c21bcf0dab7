//! awareness-core's fitting of a gateway's text into what validation accepts
//! (`validate::fit_summary`, `validate::fit_key`), on any text: a fitted summary is a valid
//! summary, a fitted key a valid key (or dedupe key) within its bound, text that was valid
//! already is kept as it is, and two texts fit alike only when their hashes collide or one is
//! already the fitted form of the other (a dedupe key never merges two events by accident).

use awareness_core::upstream::fnv1a64;
use awareness_core::validate::{
    self, MAX_DEDUPE_KEY_BYTES, MAX_KEY_BYTES, dedupe_key, fit_key, fit_summary, summary,
};

/// Summary prefixes gateways use (short constants, as `fit_summary` requires).
const PREFIXES: [&str; 3] = ["", "Human message in ", "Goal changed: "];

/// Runs the target on one input (any bytes); panics on a failure.
pub fn run(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    // Two texts from one input: the second after the first `\u{1}` byte, if any.
    let (a, b) = text.split_once('\u{1}').unwrap_or((&text, ""));

    let prefix = PREFIXES[usize::from(pick) % PREFIXES.len()];
    let fallback = "(no text)";
    let (fitted, changed) = fit_summary(prefix, a, fallback);
    assert!(summary(&fitted).is_ok(), "{fitted:?} from {a:?}");
    let shown = Some(a.trim()).filter(|t| !t.is_empty()).unwrap_or(fallback);
    let whole = format!("{prefix}{shown}");
    if summary(&whole).is_ok() {
        assert_eq!((fitted.as_str(), changed), (whole.as_str(), false));
    }

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
        if !a.is_empty() {
            assert!(fa.len() <= max, "{} bytes over {max}: {a:?}", fa.len());
            assert!(valid("key", &fa).is_ok(), "{fa:?} from {a:?}");
        }
        if a.len() <= max && valid("key", a).is_ok() {
            assert_eq!(fa, a, "a valid key is kept");
        }
        let fb = fit_key(b, max);
        if fa == fb && a != b {
            let collide = fnv1a64(a.as_bytes()) == fnv1a64(b.as_bytes());
            assert!(
                collide || fa == a || fb == b,
                "{a:?} and {b:?} both fit as {fa:?}"
            );
        }
    }
}
