//! The upstream markers a link stores, read back from whatever JSON the store holds (anyone
//! with the file can edit a link): a marker read is written back as the same marker, and a
//! transcript marker's line state the provider accepts (`is_sound`) reads on through any bytes
//! without a panic and stays sound. The input is JSON text; the bytes after its first `\n` are
//! what a resumed line reads.

use gateway_adapter::upstream::jsonl::JsonlMarker;
use gateway_adapter::upstream::paired::PairedMarker;
use serde_json::Value;

/// Runs the target on one input (any bytes); panics on a failure. Whether a marker (of either
/// kind) was read, and so compared with the marker written back.
pub fn run(data: &[u8]) -> bool {
    let (json, more) = match data.iter().position(|b| *b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let Ok(value) = serde_json::from_slice::<Value>(json) else {
        return false;
    };
    let mut compared = false;

    if let Some(marker) = JsonlMarker::from_value(&value) {
        compared = true;
        let _ = marker.position();
        assert_eq!(
            JsonlMarker::from_value(&marker.to_value()).as_ref(),
            Some(&marker),
            "{value}"
        );
        if let Some(mut scanner) = marker.partial.filter(|p| p.is_sound()) {
            let end = scanner.feed(more);
            assert!(scanner.is_sound(), "{value} then {more:?}: {scanner:?}");
            if end.is_some() {
                let _ = scanner.finish();
            }
        }
    }

    if let Some(marker) = PairedMarker::from_value(&value) {
        compared = true;
        let again = PairedMarker::from_value(&marker.to_value());
        let mut bare = marker.clone();
        bare.anchors.clear();
        if let Some(resume) = &mut bare.resume {
            resume.top_anchors.clear();
        }
        // Written whole, or without its anchors when they make it too large to store.
        assert!(
            again.as_ref() == Some(&marker) || again.as_ref() == Some(&bare),
            "{value} read back as {again:?}"
        );
    }
    compared
}
