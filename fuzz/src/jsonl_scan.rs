//! The transcript provider's read (`gateway_adapter::upstream::jsonl::scan`) on a real file that
//! grows by appends in any pieces (whole rows, rows cut anywhere, any bytes, a byte order mark
//! first), checked between the appends with any budget, its marker stored as JSON and read back
//! between checks as a link stores it.
//!
//! Each check must report exactly the human turns of the lines it finished (their `\n` between
//! the marker's position and its new line start), named by the last one's id (its uuid, else
//! its position in this reading of the file), as classifying each finished line whole finds
//! them; an append-only file is never rebased and never fails. So no turn is lost, none is
//! counted twice, and none is named as another, however the file was written and read.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use awareness_core::upstream::fingerprints;
use gateway_adapter::upstream::jsonl::{JsonlMarker, marker_at_end, scan};
use gateway_adapter::upstream::transcript::{LineEnd, LineScanner, classify};

/// The session's own prompt: a row with this text is its echo, not a person's turn.
const OWN: &str = "own prompt";

/// Rows of the kinds a transcript holds (`{n}` is a counter, so that rows differ).
const ROWS: [&str; 12] = [
    r#"{"type":"user","uuid":"u{n}","message":{"role":"user","content":"hello {n}"}}"#,
    r#"{"type":"user","message":{"role":"user","content":[{"type":"text","text":"no uuid {n}"}]}}"#,
    r#"{"type":"assistant","uuid":"a{n}","message":{"role":"assistant","content":"reply"}}"#,
    r#"{"type":"user","uuid":"t{n}","message":{"role":"user","content":[{"type":"tool_result","content":"out"}]}}"#,
    r#"{"type":"user","uuid":"e{n}","message":{"role":"user","content":"own  prompt"}}"#,
    r#"{"type":"attachment","uuid":"q{n}","attachment":{"type":"queued_command","prompt":"typed {n}","origin":{"kind":"human"},"commandMode":"prompt"}}"#,
    r#"{"type":"system","uuid":"s{n}","subtype":"local_command","content":"<command-name>/clear</command-name>"}"#,
    r#"{"type":"user","uuid":"m{n}","isMeta":true,"message":{"role":"user","content":"meta"}}"#,
    r#"{"type":"user","uuid":"i{n}","message":{"role":"user","content":"[Inter-session message] hi"}}"#,
    r#"{"type":"user","uuid":"l{n}","message":{"role":"user","content":"long {n} xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}"#,
    "   ",
    r#"{"type":"user","message":"#,
];

/// Runs the target on one input (any bytes); panics on a failure. Whether a check reported a
/// human turn that was compared with the file's (a check that reports none is compared as well,
/// but does not count).
pub fn run(data: &[u8]) -> bool {
    let transcript = TempFile::new();
    let path = transcript.0.as_path();
    let mut file = std::fs::File::create(path).expect("create the transcript");
    let mut content = Vec::new();
    let own = fingerprints(&[OWN.to_owned()]);
    let mut marker = marker_at_end(path).expect("adopt the empty file");
    let mut compared = false;
    let meta = std::fs::metadata(path).expect("stat");
    let (dev, ino) = (meta.dev(), meta.ino());

    let mut bytes = data.iter().copied();
    let mut n = 0u32;
    let append = |file: &mut std::fs::File, content: &mut Vec<u8>, b: &[u8]| {
        file.write_all(b).expect("append");
        content.extend_from_slice(b);
    };
    if data.first().is_some_and(|b| b & 0x80 != 0) {
        append(&mut file, &mut content, b"\xEF\xBB\xBF");
    }
    while let Some(op) = bytes.next() {
        let arg = bytes.next().unwrap_or(0);
        match op % 5 {
            0 | 1 => {
                n += 1;
                let row = ROWS[usize::from(arg) % ROWS.len()].replace("{n}", &n.to_string());
                append(&mut file, &mut content, row.as_bytes());
                if op % 5 == 0 {
                    append(&mut file, &mut content, b"\n");
                }
            }
            2 => {
                let raw: Vec<u8> = bytes.by_ref().take(usize::from(arg % 16)).collect();
                append(&mut file, &mut content, &raw);
            }
            3 => {
                let budget = if arg == 255 {
                    u64::MAX
                } else {
                    1 + u64::from(arg) * 3
                };
                let turns;
                (marker, turns) = check(path, &marker, &own, budget, &content, (dev, ino));
                compared |= turns;
            }
            _ => append(&mut file, &mut content, b"\n"),
        }
    }
    append(&mut file, &mut content, b"\n");
    let turns;
    (marker, turns) = check(path, &marker, &own, u64::MAX, &content, (dev, ino));
    assert_eq!(marker.position(), content.len() as u64, "everything read");
    compared || turns
}

/// One check from `marker` with `budget`, its outcome compared with what `content` (the file)
/// holds; the marker it leaves, as stored and read back, and whether it reported human turns.
fn check(
    path: &Path,
    marker: &JsonlMarker,
    own: &[awareness_core::upstream::TextFingerprint],
    budget: u64,
    content: &[u8],
    (dev, ino): (u64, u64),
) -> (JsonlMarker, bool) {
    let from = marker.position();
    let outcome = scan(path, Some(marker), own, budget);
    let (stored, got) = crate::went_through(&outcome)
        .unwrap_or_else(|| panic!("an append-only file read as {outcome:?}"));
    let next = JsonlMarker::from_value(&stored).expect("the marker reads back");
    assert!(next.position() >= from, "the marker went back");
    assert!(
        next.position() <= from.saturating_add(budget),
        "read past the budget"
    );
    // The human lines finished by this check: their `\n` in [from, next line start).
    let mut turns = 0u32;
    let mut last = None;
    let mut start = 0usize;
    for (at, b) in content.iter().enumerate() {
        if *b != b'\n' {
            continue;
        }
        let line_start = start;
        start = at + 1;
        if (at as u64) < from || (at as u64) >= next.offset {
            continue;
        }
        let mut line = content[line_start..at].to_vec();
        // The file's byte order mark reads as whitespace.
        if line_start == 0 && line.starts_with(b"\xEF\xBB\xBF") {
            line[..3].copy_from_slice(b"   ");
        }
        let mut scanner = LineScanner::new();
        assert_eq!(scanner.feed(&line), None);
        let end = scanner.finish();
        if classify(&end, own).is_ok() {
            turns += 1;
            let uuid = match &end {
                LineEnd::Row(f) => f.uuid.clone().filter(|u| !u.is_empty()),
                _ => None,
            };
            last =
                Some(uuid.unwrap_or_else(|| {
                    format!("{dev}:{ino}:{:016x}:{line_start}", marker.generation)
                }));
        }
    }
    let expected = last.map(|id| (turns, id));
    let reported = expected.is_some();
    assert_eq!(
        got,
        expected,
        "check from {from} with budget {budget}: {:?}",
        String::from_utf8_lossy(content)
    );
    (next, reported)
}

/// A transcript file of this thread's, removed when dropped (a failure included).
struct TempFile(PathBuf);

impl TempFile {
    fn new() -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("awareness-fuzz-jsonl-{}-{n}.jsonl", std::process::id());
        Self(std::env::temp_dir().join(name))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
