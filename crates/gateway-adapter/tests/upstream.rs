//! Upstream monitoring on real transcript files in temporary directories: the local JSONL
//! provider (appends, a 3 MiB line, truncation, replacement, deletion), the paired-node
//! provider (paging back past one window), and the monitor on tokio's paused clock (timing,
//! one event per burst, compare-and-set of the marker, `upstream_missing`, a hanging provider,
//! several agents on one thread).

// Short names keep the scenarios readable: `w` the world, `t` a transcript, `a`/`b` sessions.
#![allow(clippy::many_single_char_names)]

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use awareness_core::upstream::{self, UpstreamStore};
use awareness_core::{
    ActorType, AgentId, AwarenessStoreExt, CursorStore, EventKind, EventStore, LinkSpec, NewEvent,
    Sequence, SessionKey, SessionRef, StoreError, Timestamp, UpsertOutcome, UpstreamLink,
    WatcherKey, async_trait,
};
use gateway_adapter::upstream::jsonl::{self, JsonlMarker, MAX_BYTES_PER_TICK};
use gateway_adapter::upstream::paired::{MAX_PAGES, PAGE_ITEMS, PairedMarker};
use gateway_adapter::upstream::{
    CheckOutcome, Detection, JsonlProvider, MarkerMove, OwnPrompts, PairedError, PairedItem,
    PairedNodeClient, PairedNodeProvider, PairedPage, RecentPrompts, RunTracker, UpstreamMonitor,
    UpstreamProvider,
};
use gateway_adapter::{
    Awareness, InMemoryDirectory, InMemoryQueue, ManualClock, RecordingWake, SystemEventQueue,
};
use serde_json::{Value, json};
use store_memory::MemoryStore;
use tokio::sync::broadcast;

mod common;
use common::{World, settle, world};
use tokio::time::Instant;

// ----- transcripts -------------------------------------------------------------------------------

struct Transcript {
    _dir: tempfile::TempDir,
    path: PathBuf,
    n: usize,
}

impl Transcript {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir
            .path()
            .join("0b3c6f1e-8a7d-4e52-b1d4-6a1f3e9c2d77.jsonl");
        File::create(&path).unwrap();
        Self {
            _dir: dir,
            path,
            n: 0,
        }
    }

    fn raw(&self, bytes: &[u8]) {
        let mut f = OpenOptions::new().append(true).open(&self.path).unwrap();
        f.write_all(bytes).unwrap();
    }

    fn line(&self, row: &Value) {
        self.raw(format!("{row}\n").as_bytes());
    }

    fn uuid(&mut self) -> String {
        self.n += 1;
        format!("00000000-0000-4000-8000-{:012}", self.n)
    }

    /// A person's prompt; returns its uuid.
    fn human(&mut self, text: &str) -> String {
        let uuid = self.uuid();
        self.line(&user_row(&uuid, json!(text)));
        uuid
    }

    /// A model turn with a tool call and its result: rows that are never human turns.
    fn model_turn(&mut self) {
        let (a, t) = (self.uuid(), self.uuid());
        self.line(&json!({"type": "assistant", "isSidechain": false, "uuid": a,
            "timestamp": "2026-11-30T10:00:01Z",
            "message": {"role": "assistant", "model": "claude-opus-4", "content": [
                {"type": "text", "text": "Running the tests."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "cargo test"}}]}}));
        self.line(&user_row(
            &t,
            json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "test result: ok"}]),
        ));
    }
}

#[allow(clippy::needless_pass_by_value)] // called with `json!(...)` temporaries
fn user_row(uuid: &str, content: Value) -> Value {
    json!({
        "parentUuid": null, "isSidechain": false, "userType": "external",
        "cwd": "/home/me/project", "sessionId": "0b3c6f1e-8a7d-4e52-b1d4-6a1f3e9c2d77",
        "version": "2.0.55", "gitBranch": "main", "type": "user",
        "message": {"role": "user", "content": content},
        "uuid": uuid, "timestamp": "2026-11-30T10:00:00.000Z"
    })
}

fn marker_of(outcome: &CheckOutcome) -> JsonlMarker {
    match outcome {
        CheckOutcome::Unchanged { marker }
        | CheckOutcome::Rebased { marker }
        | CheckOutcome::HumanTurns { marker, .. } => JsonlMarker::from_value(marker).unwrap(),
        other => panic!("no marker in {other:?}"),
    }
}

fn scan(t: &Transcript, m: &JsonlMarker) -> CheckOutcome {
    jsonl::scan(&t.path, Some(m), &[], MAX_BYTES_PER_TICK)
}

fn turns(outcome: &CheckOutcome) -> u32 {
    match outcome {
        CheckOutcome::HumanTurns { turns, .. } => *turns,
        CheckOutcome::Unchanged { .. } => 0,
        other => panic!("expected a read, got {other:?}"),
    }
}

// ----- the local JSONL provider ------------------------------------------------------------------

/// A marker that says only where to read from (`{"offset": N}`, a byte offset as DESIGN.md
/// section 8 names it, as another reader of the link may write it) is resumed from, not
/// thrown away; and a device number that changed (a reboot, a remount) with the same inode is
/// the same file. Either was rebased to the end, losing the turns typed since.
#[test]
fn a_bare_offset_marker_and_a_changed_device_resume_where_they_were() {
    let mut t = Transcript::new();
    t.human("before");
    let at_end = jsonl::marker_at_end(&t.path).unwrap();
    t.human("typed while the gateway was down");
    let bare = JsonlMarker::from_value(&json!({"offset": at_end.offset}))
        .expect("a bare offset is a marker");
    assert_eq!(turns(&scan(&t, &bare)), 1);
    let mut moved = at_end.clone();
    moved.dev ^= 1;
    assert_eq!(turns(&scan(&t, &moved)), 1);
    // Another inode is still another file.
    let mut other = at_end;
    other.ino ^= 1;
    assert!(
        matches!(scan(&t, &other), CheckOutcome::Rebased { .. }),
        "a replaced file is rebased"
    );
}

/// A marker's `tail` is 16 hex digits (`JsonlMarker::tail`), leading zeros included: a
/// marker written so (by an earlier version, or another reader of the link) whose hash starts
/// with a zero resumes where it was. (What the mutation did: the tail was written without its
/// leading zeros, and such a stored marker, one link in sixteen, was rebased, losing the turns
/// typed since; review of stop 70, J502.)
#[test]
fn a_tail_hash_with_a_leading_zero_resumes_where_it_was() {
    let mut t = Transcript::new();
    let mut i = 0;
    let tail = loop {
        i += 1;
        t.human(&format!("probe {i}"));
        let bytes = std::fs::read(&t.path).unwrap();
        let tail = format!("{:016x}", upstream::fnv1a64(&bytes[bytes.len() - 64..]));
        if tail.starts_with('0') {
            break tail;
        }
    };
    let at_end = jsonl::marker_at_end(&t.path).unwrap();
    assert_eq!(at_end.tail.as_deref(), Some(tail.as_str()), "16 hex digits");
    let stored = JsonlMarker {
        tail: Some(tail),
        ..at_end
    };
    t.human("typed since");
    assert_eq!(turns(&scan(&t, &stored)), 1);
}

/// A check made again from the same marker (the marker of the one before was not stored),
/// over more turns without a uuid than that one read, is another burst: it is named by its
/// last turn's line, not by the line it started at. (What the mutation did: every turn
/// without a uuid read from a marker was named by the marker's offset, so the second check
/// was taken for a duplicate of the first and the turn typed meanwhile never reported;
/// review of stop 70, J510.)
#[test]
fn a_burst_without_uuids_is_named_by_its_last_line() {
    let t = Transcript::new();
    let m = jsonl::marker_at_end(&t.path).unwrap();
    let row = |text: &str| {
        let mut row = user_row("", json!(text));
        row.as_object_mut().unwrap().remove("uuid");
        row
    };
    let id = |outcome: &CheckOutcome| match outcome {
        CheckOutcome::HumanTurns { dedupe_id, .. } => dedupe_id.clone(),
        other => panic!("expected turns, got {other:?}"),
    };
    t.line(&row("one"));
    let first = scan(&t, &m);
    t.line(&row("two"));
    let again = scan(&t, &m);
    assert_eq!(turns(&again), 2);
    assert_ne!(
        id(&first),
        id(&again),
        "a burst with one more turn is not a duplicate of the first"
    );
}

/// A bare offset marker (no identity) read forward gives a marker that carries the file's
/// inode, so that a file replaced after that read (by a copy of it with more lines: a new
/// inode, the same bytes before the marker) is rebased, not read on as the old one. (What the
/// mutation did: the next marker kept the bare marker's inode of 0, the file's identity was
/// never checked again, and the copy's lines were counted as new turns; review of stop 70,
/// J535.)
#[test]
fn a_bare_offset_marker_read_once_carries_the_files_identity() {
    let mut t = Transcript::new();
    t.human("before");
    let at_end = jsonl::marker_at_end(&t.path).unwrap();
    let bare = JsonlMarker::from_value(&json!({"offset": at_end.offset})).unwrap();
    let read = marker_of(&scan(&t, &bare));
    assert_eq!(
        read.ino, at_end.ino,
        "the next marker names the file's inode"
    );
    let copy = t.path.with_extension("copy");
    std::fs::copy(&t.path, &copy).unwrap();
    std::fs::rename(&copy, &t.path).unwrap();
    t.human("a line of the copy");
    let out = scan(&t, &read);
    assert!(
        matches!(out, CheckOutcome::Rebased { .. }),
        "a replaced file is rebased: {out:?}"
    );
}

/// A transcript that starts with a UTF-8 byte order mark (a writer on Windows), adopted while
/// empty: its first row counts. The mark made that row malformed, its turn never counted.
#[test]
fn a_byte_order_mark_at_the_start_hides_no_turn() {
    let mut t = Transcript::new();
    let m = jsonl::marker_at_end(&t.path).unwrap();
    assert_eq!(m.offset, 0);
    t.raw("\u{feff}".as_bytes());
    t.human("typed into a file that starts with a BOM");
    t.human("and again");
    let out = scan(&t, &m);
    assert_eq!(turns(&out), 2, "{out:?}");
    assert_eq!(
        marker_of(&out).position(),
        std::fs::metadata(&t.path).unwrap().len()
    );
    // The mark written in two parts, each read by its own scan.
    let mut t = Transcript::new();
    let m = jsonl::marker_at_end(&t.path).unwrap();
    t.raw(b"\xEF");
    let m = marker_of(&scan(&t, &m));
    t.raw(b"\xBB\xBF");
    t.human("typed after a mark written in two parts");
    assert_eq!(turns(&scan(&t, &m)), 1);
}

/// A byte order mark read over checks whose budget is smaller than it (a provider made with a
/// budget of 1 byte) is blanked all the same: the row after it counts. (Blanked only by a read
/// that began at the file's start, a mutation every test passed, the mark's second and third
/// bytes, read by later checks, made the first row malformed and its turn was lost: review of
/// stop 61.)
#[test]
fn a_byte_order_mark_read_a_byte_a_check_hides_no_turn() {
    let mut t = Transcript::new();
    let mut m = jsonl::marker_at_end(&t.path).unwrap();
    t.raw("\u{feff}".as_bytes());
    t.human("typed into a file that starts with a BOM");
    let len = std::fs::metadata(&t.path).unwrap().len();
    let mut seen = 0;
    while m.position() < len {
        let out = jsonl::scan(&t.path, Some(&m), &[], 1);
        seen += turns(&out);
        m = marker_of(&out);
    }
    assert_eq!(seen, 1);
}

/// Bug (found by the `jsonl_scan` fuzz target): each of the file's first three bytes that was
/// the mark's byte at its position was blanked, whether or not a mark was there: a first line
/// starting with a stray `EF`, or a second line starting at byte 1 with a `BB`, was read as a
/// row it is not. Only a whole mark is blanked; a file holding only its start is not read on
/// until it holds three bytes.
#[test]
fn only_a_whole_byte_order_mark_is_read_as_whitespace() {
    let row = json!({"type": "user", "uuid": "u1", "message": {"role": "user", "content": "hi"}});
    for (start, why) in [
        (&b"\xEF"[..], "a stray first byte of a mark"),
        (
            &b"\n\xBB"[..],
            "a second line that starts at byte 1 with the mark's second byte",
        ),
        // (Taken for a whole mark, the space was blanked with it and the line read as a row;
        // review of stop 66, J323.)
        (&b"\xEF\xBB "[..], "the mark's first two bytes and a space"),
    ] {
        let t = Transcript::new();
        let m = jsonl::marker_at_end(&t.path).unwrap();
        t.raw(start);
        t.line(&row);
        let out = scan(&t, &m);
        assert_eq!(turns(&out), 0, "{why}: {out:?}");
        assert_eq!(
            marker_of(&out).position(),
            std::fs::metadata(&t.path).unwrap().len(),
            "{why}: read through"
        );
    }
    // The start of a mark alone is held until the file shows whether it is one.
    let t = Transcript::new();
    let m = jsonl::marker_at_end(&t.path).unwrap();
    t.raw(b"\xEF\xBB");
    let held = marker_of(&scan(&t, &m));
    assert_eq!(held.position(), 0, "nothing read of a mark's start");
    t.raw(b"{");
    t.raw(&serde_json::to_vec(&row).unwrap()[1..]);
    t.raw(b"\n");
    assert_eq!(turns(&scan(&t, &held)), 0, "not a mark: read as written");
}

#[test]
fn history_before_adoption_never_counts_and_appends_do() {
    let mut t = Transcript::new();
    t.human("first prompt, before adoption");
    t.model_turn();
    let m = jsonl::marker_at_end(&t.path).unwrap();
    assert_eq!(m.offset, std::fs::metadata(&t.path).unwrap().len());
    assert!(matches!(scan(&t, &m), CheckOutcome::Unchanged { .. }));

    t.human("please also handle the empty case");
    t.model_turn();
    t.human("<command-name>/compact</command-name>");
    t.line(
        &json!({"type": "attachment", "uuid": "q1", "attachment": {"type": "queued_command",
        "commandMode": "prompt", "origin": {"kind": "human"}, "prompt": "and update the docs"}}),
    );
    let out = scan(&t, &m);
    match &out {
        CheckOutcome::HumanTurns {
            turns,
            dedupe_id,
            source_id,
            ..
        } => {
            assert_eq!(*turns, 3);
            assert_eq!(dedupe_id, "q1", "the burst is named by its last turn");
            assert_eq!(source_id, &t.path.display().to_string());
        }
        other => panic!("{other:?}"),
    }
    // Reading again from the same marker finds the same burst (a retry is deduplicated).
    assert_eq!(scan(&t, &m), out);
    let m = marker_of(&out);
    assert_eq!(m.position(), std::fs::metadata(&t.path).unwrap().len());
    assert!(matches!(scan(&t, &m), CheckOutcome::Unchanged { .. }));

    // A half-written line is not counted until its end is written.
    let row = user_row("half-1", json!("typed while you were away")).to_string();
    let (head, tail) = row.split_at(row.len() / 2);
    t.raw(head.as_bytes());
    let out = scan(&t, &m);
    assert_eq!(turns(&out), 0);
    let half = marker_of(&out);
    assert_eq!(
        half.offset, m.offset,
        "the marker stays at the line's start"
    );
    assert_eq!(half.position(), m.offset + head.len() as u64);
    t.raw(tail.as_bytes());
    assert_eq!(turns(&scan(&t, &half)), 0, "still no newline");
    t.raw(b"\n");
    let out = scan(&t, &half);
    assert_eq!(turns(&out), 1);
    assert!(matches!(&out, CheckOutcome::HumanTurns { dedupe_id, .. } if dedupe_id == "half-1"));
}

/// A human row whose text holds an escaped surrogate pair, written to `t` up to the pair's low
/// half: the marker the scan of it leaves (`partly`, inside a string, holding the high half), the
/// same marker edited by hand to a state the scanner cannot be in (a high half no escape can
/// give), the row's whole text, and where it was cut.
fn cut_inside_an_escape(t: &Transcript) -> (JsonlMarker, JsonlMarker, String, usize) {
    let m = jsonl::marker_at_end(&t.path).unwrap();
    let row = user_row("u-1", json!("see \u{1f600} here")).to_string();
    let escaped = row.replace('\u{1f600}', "\\ud83d\\ude00");
    let cut = escaped.find("\\ude00").expect("the low half");
    t.raw(&escaped.as_bytes()[..cut]);
    let partly = marker_of(&scan(t, &m));
    let mut edited = partly.to_value();
    assert!(edited["partial"]["high"].is_u64(), "{edited}");
    edited["partial"]["high"] = json!(5);
    let edited = JsonlMarker::from_value(&edited).expect("still a marker of ours");
    (partly, edited, escaped, cut)
}

/// A marker edited by hand (the store is a file anyone may open) cannot keep a link from being
/// read: a partial line's state the scanner cannot be in panicked in every check of a debug
/// build and read garbage in a release build (here a high surrogate no escape can give), and
/// an offset near `u64::MAX` overflowed. Now the first costs that line alone, logged, in
/// either build, and the second is rebased as past the file's end.
#[test]
fn a_marker_edited_by_hand_costs_at_most_its_line() {
    let capture = common::Capture::default();
    let _guard = capture.install();
    let mut t = Transcript::new();
    let (partly, edited, escaped, cut) = cut_inside_an_escape(&t);
    t.raw(&escaped.as_bytes()[cut..]);
    t.raw(b"\n");
    let question = t.human("and this?");
    let out = scan(&t, &edited);
    assert_eq!(
        turns(&out),
        1,
        "the edited line is skipped, the next one counted"
    );
    assert!(matches!(&out, CheckOutcome::HumanTurns { dedupe_id, .. } if *dedupe_id == question));
    assert_eq!(
        marker_of(&out).offset,
        std::fs::metadata(&t.path).unwrap().len()
    );
    let warned = capture
        .lines()
        .into_iter()
        .filter(|l| l.contains("not one the reader can be in; that line is skipped"))
        .count();
    assert_eq!(warned, 1, "{:?}", capture.lines());
    // The same marker unedited reads both.
    assert_eq!(turns(&scan(&t, &partly)), 2);

    let mut past = partly.to_value();
    past["offset"] = json!(u64::MAX - 1);
    let past = JsonlMarker::from_value(&past).expect("still a marker of ours");
    assert!(
        matches!(scan(&t, &past), CheckOutcome::Rebased { .. }),
        "past the file's end"
    );
}

/// A marker edited by hand to point past every file, with a partly read line and without the
/// identity and tail a marker of ours carries (a bare offset, as another reader of the link
/// may write it), is rebased as past the file's end as well: its position does not wrap round
/// to the file's first bytes, whose rows were then read as new human turns. (What the
/// mutation did: the position added the partial line's bytes to the offset wrapping past
/// `u64::MAX`; review of stop 68, J437.)
#[test]
fn a_bare_marker_past_every_file_is_rebased_not_wrapped_round() {
    let mut t = Transcript::new();
    let (partly, _, escaped, cut) = cut_inside_an_escape(&t);
    t.raw(&escaped.as_bytes()[cut..]);
    t.raw(b"\n");
    t.human("and this?");
    let mut past = partly.to_value();
    past["offset"] = json!(u64::MAX - 1);
    for key in ["dev", "ino", "size", "tail"] {
        past.as_object_mut().unwrap().remove(key);
    }
    let past = JsonlMarker::from_value(&past).expect("still a marker of ours");
    assert!(
        past.partial.as_ref().is_some_and(|p| p.consumed > 2),
        "{past:?}"
    );
    let out = scan(&t, &past);
    assert!(
        matches!(out, CheckOutcome::Rebased { .. }),
        "past the file's end: {out:?}"
    );
}

#[test]
fn a_three_mib_line_is_streamed_over_ticks_without_blocking_the_marker() {
    let mut t = Transcript::new();
    let m = jsonl::marker_at_end(&t.path).unwrap();
    // A person pastes a 3 MiB log, then asks a question; the log line's end is written last.
    let pasted = format!(
        "here is the log:\n{}",
        "ERROR worker 7 failed: timeout\n".repeat(100_000)
    );
    let row = user_row("big-1", json!(pasted)).to_string();
    assert!(row.len() > 3 * 1024 * 1024);
    t.raw(&row.as_bytes()[..row.len() - 10]);
    let mut marker = m.clone();
    let mut ticks = 0;
    loop {
        let out = scan(&t, &marker);
        assert_eq!(turns(&out), 0, "not counted before its end is written");
        let next = marker_of(&out);
        ticks += 1;
        assert!(
            next.position() - marker.position() <= MAX_BYTES_PER_TICK,
            "1 MiB a tick"
        );
        assert_eq!(
            next.offset, m.offset,
            "whole lines only: the offset stays at the line"
        );
        assert!(
            next.to_value().to_string().len() < 4096,
            "the partial line is kept as a small state, not as bytes"
        );
        if next == marker {
            break;
        }
        marker = next;
    }
    assert_eq!(
        ticks, 5,
        "four ticks of reading, one that finds nothing more"
    );
    t.raw(&row.as_bytes()[row.len() - 10..]);
    t.raw(b"\n");
    let question = t.human("what do you make of it?");
    let out = scan(&t, &marker);
    assert_eq!(turns(&out), 2, "the big line and the question");
    assert!(matches!(&out, CheckOutcome::HumanTurns { dedupe_id, .. } if *dedupe_id == question));
    let end = marker_of(&out);
    assert_eq!(end.partial, None);
    assert_eq!(end.offset, std::fs::metadata(&t.path).unwrap().len());

    // A 3 MiB tool result (the usual big line) is read through and never counted.
    let tr = user_row(
        "tool-big",
        json!([{"type": "tool_result", "tool_use_id": "t", "content": "x".repeat(3 << 20)}]),
    );
    t.line(&tr);
    t.human("thanks");
    let mut marker = end;
    let mut total = 0;
    for _ in 0..5 {
        let out = scan(&t, &marker);
        total += turns(&out);
        marker = marker_of(&out);
    }
    assert_eq!(total, 1, "only the short prompt after it");
    assert_eq!(marker.offset, std::fs::metadata(&t.path).unwrap().len());
}

#[test]
fn truncated_rewritten_replaced_and_deleted_files() {
    let mut t = Transcript::new();
    t.human("old history");
    let m = jsonl::marker_at_end(&t.path).unwrap();
    t.human("one");
    t.human("two");
    let read = marker_of(&scan(&t, &m));

    // Truncated below the marker: rebased to the new end, never read from the stale offset.
    let f = OpenOptions::new().write(true).open(&t.path).unwrap();
    f.set_len(10).unwrap();
    drop(f);
    let out = scan(&t, &read);
    assert!(matches!(out, CheckOutcome::Rebased { .. }), "{out:?}");
    let rebased = marker_of(&out);
    assert_eq!(
        rebased.offset, 0,
        "the 10 bytes left are a line without its end"
    );
    let f = OpenOptions::new().write(true).open(&t.path).unwrap();
    f.set_len(0).unwrap();
    drop(f);
    let out = scan(&t, &rebased);
    assert!(
        matches!(out, CheckOutcome::Rebased { .. }),
        "shrunk again: {out:?}"
    );
    let rebased = marker_of(&out);
    t.human("after the truncation");
    assert_eq!(turns(&scan(&t, &rebased)), 1);

    // Rewritten in place (same inode) and grown past the marker: the bytes before the marker
    // changed, so it is rebased rather than read from the middle of another line.
    let read = marker_of(&scan(&t, &rebased));
    let mut other = Transcript::new();
    for _ in 0..5 {
        other.human("a different conversation, written over the file");
    }
    std::fs::write(&t.path, std::fs::read(&other.path).unwrap()).unwrap();
    assert!(std::fs::metadata(&t.path).unwrap().len() > read.position());
    let out = scan(&t, &read);
    assert!(matches!(out, CheckOutcome::Rebased { .. }), "{out:?}");
    let read = marker_of(&out);

    // Replaced by a new file (a new inode, even with more bytes): rebased.
    let tmp = t.path.with_extension("tmp");
    let mut bigger = std::fs::read(&t.path).unwrap();
    bigger.extend_from_slice(format!("{}\n", user_row("r1", json!("x"))).as_bytes());
    std::fs::write(&tmp, &bigger).unwrap();
    std::fs::rename(&tmp, &t.path).unwrap();
    let out = scan(&t, &read);
    assert!(matches!(out, CheckOutcome::Rebased { .. }), "{out:?}");
    let replaced = marker_of(&out);
    assert_ne!(replaced.ino, read.ino);
    t.human("typed into the new file");
    assert_eq!(turns(&scan(&t, &replaced)), 1);

    // Deleted: missing. No marker at all: rebased to the end.
    assert!(matches!(
        jsonl::scan(&t.path, None, &[], MAX_BYTES_PER_TICK),
        CheckOutcome::Rebased { .. }
    ));
    std::fs::remove_file(&t.path).unwrap();
    assert_eq!(scan(&t, &replaced), CheckOutcome::Missing);
}

/// A transcript rewritten in place under the marker is rebased even when the last bytes before
/// the marker read alike (every row Claude Code writes ends with its version): the hash covers
/// the 64 bytes before the marker, which hold the last row's uuid. (What the mutation did: the
/// hash covered the last 8 bytes only, and the rows written over the file were read on as new
/// turns; review of stop 66, J301.)
#[test]
fn a_rewrite_that_keeps_the_last_bytes_before_the_marker_is_rebased() {
    let mut t = Transcript::new();
    let uuid = t.human("old history");
    let m = jsonl::marker_at_end(&t.path).unwrap();
    let text = std::fs::read_to_string(&t.path).unwrap();
    let other = uuid.replace("000000000001", "000000000009");
    std::fs::write(&t.path, text.replace(&uuid, &other)).unwrap();
    t.human("a row of the other conversation");
    let out = scan(&t, &m);
    assert!(
        matches!(out, CheckOutcome::Rebased { .. }),
        "a file rewritten under the marker is rebased: {out:?}"
    );
}

/// A transcript that shrank below the size it had, though not below where the read stood (a
/// check with a small budget reads only part of what was written), is rebased: an append-only
/// transcript never shrinks. (What the mutation did: the marker kept the read position as the
/// file's size, and the rest of the truncated file was read on as new turns; review of stop 66,
/// J315.)
#[test]
fn a_file_shrunk_below_its_size_but_not_below_the_read_is_rebased() {
    let mut t = Transcript::new();
    let m = jsonl::marker_at_end(&t.path).unwrap();
    t.human("one");
    let one = std::fs::metadata(&t.path).unwrap().len();
    t.human("two");
    let read = marker_of(&jsonl::scan(&t.path, Some(&m), &[], 10));
    assert_eq!(read.position(), 10);
    OpenOptions::new()
        .write(true)
        .open(&t.path)
        .unwrap()
        .set_len(one)
        .unwrap();
    let out = scan(&t, &read);
    assert!(
        matches!(out, CheckOutcome::Rebased { .. }),
        "a transcript that shrank is rebased: {out:?}"
    );
}

/// A check of `t` with `budget` from `stale` made to look rewritten under its position (its
/// tail hash no longer matches): it must rebase; returns the new marker.
fn rebase(t: &Transcript, stale: JsonlMarker, budget: u64) -> JsonlMarker {
    let moved = JsonlMarker {
        tail: Some("0000000000000000".into()),
        ..stale
    };
    let out = jsonl::scan(&t.path, Some(&moved), &[], budget);
    assert!(matches!(out, CheckOutcome::Rebased { .. }), "{out:?}");
    marker_of(&out)
}

/// A rebase reads back from the end at most a check's budget, like a forward read: a last
/// line of several MB without its end (or a file without any newline) is skipped to its end
/// instead of being read back to its start. The turns typed after it still count.
#[test]
fn a_rebase_onto_a_line_longer_than_the_budget_reads_no_more_than_the_budget() {
    const BUDGET: u64 = 64 * 1024;
    let mut t = Transcript::new();
    t.human("old history");
    let stale = jsonl::marker_at_end(&t.path).unwrap();
    // A tool result being written: 300 KiB so far, no end yet.
    t.raw(
        format!(
            "{{\"type\":\"user\",\"toolUseResult\":\"{}",
            "x".repeat(300 * 1024)
        )
        .as_bytes(),
    );
    let size = std::fs::metadata(&t.path).unwrap().len();
    let rebased = rebase(&t, stale, BUDGET);
    assert!(
        rebased.offset >= size - BUDGET,
        "the rebase looked back past its budget, to {} of {size}",
        rebased.offset
    );
    assert_eq!(rebased.position(), size);
    // The long line ends, then a person types: one turn, and the long line is not one.
    t.raw(b"\"}\n");
    t.human("typed after the long line");
    assert_eq!(turns(&jsonl::scan(&t.path, Some(&rebased), &[], BUDGET)), 1);
    // Adopting such a file starts after the long line too.
    let mut u = Transcript::new();
    u.raw(&vec![
        b'y';
        usize::try_from(MAX_BYTES_PER_TICK).unwrap() + 10
    ]);
    let adopted = jsonl::marker_at_end(&u.path).unwrap();
    assert_eq!(
        adopted.offset, 10,
        "adoption looked back past one tick's budget"
    );
    u.raw(b"\n");
    u.human("typed after the adoption");
    assert_eq!(turns(&jsonl::scan(&u.path, Some(&adopted), &[], BUDGET)), 1);
}

/// A last line that starts exactly one budget before the end is within reach of a rebase: it
/// is classified when it ends, not skipped. (Found by a review: the look-back read the budget's
/// bytes but not the newline just before them, and skipped this line.)
#[test]
fn a_rebase_keeps_a_last_line_that_starts_exactly_one_budget_back() {
    const BUDGET: u64 = 256;
    let mut t = Transcript::new();
    t.human("old history");
    let stale = jsonl::marker_at_end(&t.path).unwrap();
    // A person's prompt being written: exactly BUDGET bytes so far, its end not yet written.
    let row = user_row("00000000-0000-4000-8000-999999999999", json!("PAD")).to_string();
    let open_part = row.split("PAD").next().unwrap().to_owned();
    let pad = usize::try_from(BUDGET).unwrap() - open_part.len();
    let start = std::fs::metadata(&t.path).unwrap().len();
    t.raw(format!("{open_part}{}", "y".repeat(pad)).as_bytes());
    assert_eq!(std::fs::metadata(&t.path).unwrap().len() - start, BUDGET);
    let rebased = rebase(&t, stale, BUDGET);
    // At the line's start with nothing of it read (a line skipped from its middle would sit at
    // the same offset, with a skipping reader behind the position).
    assert_eq!(
        (
            rebased.offset,
            rebased.position(),
            rebased.partial.is_none()
        ),
        (start, start, true),
        "the rebase did not find the line's start"
    );
    let rest = row.split("PAD").nth(1).unwrap();
    t.raw(format!("{rest}\n").as_bytes());
    let mut read = 0;
    let mut m = rebased;
    // The line is longer than the budget: it is read over a few checks.
    for _ in 0..4 {
        let out = jsonl::scan(&t.path, Some(&m), &[], BUDGET);
        read += turns(&out);
        m = marker_of(&out);
    }
    assert_eq!(
        read, 1,
        "the prompt being written at the rebase was not counted"
    );
}

/// A transcript of exactly one budget (1 MiB) that ends with a whole line is adopted at its
/// end, with nothing to skip, and the turn typed after it counts. (Its look-back taken for a
/// file larger than the budget, a mutation every test passed, subtracted past zero: the
/// adoption panicked on the overflow in the debug build the tests run, and a release build
/// wraps it into a look-back from nowhere: review of stop 61.)
#[test]
fn adopting_a_transcript_of_exactly_one_budget_loses_no_turn_after_it() {
    let mut t = Transcript::new();
    let head = br#"{"type":"summary","summary":""#;
    let tail = b"\"}\n";
    let pad = usize::try_from(MAX_BYTES_PER_TICK).unwrap() - head.len() - tail.len();
    let mut line = head.to_vec();
    line.extend(std::iter::repeat_n(b'x', pad));
    line.extend_from_slice(tail);
    t.raw(&line);
    assert_eq!(
        std::fs::metadata(&t.path).unwrap().len(),
        MAX_BYTES_PER_TICK
    );
    let m = jsonl::marker_at_end(&t.path).unwrap();
    assert_eq!((m.offset, m.partial.is_none()), (MAX_BYTES_PER_TICK, true));
    t.human("typed after the adoption");
    assert_eq!(turns(&scan(&t, &m)), 1);
}

/// A check reads no more than its budget, however small (here 10 bytes): the marker moves by
/// 10. (Each read asked for a whole 64 KiB chunk, a mutation every test passed: the default
/// budget is a multiple of the chunk, and a budget of 10 read 634 bytes: review of stop 61.)
#[test]
fn a_check_reads_no_more_than_its_budget() {
    let mut t = Transcript::new();
    let m = jsonl::marker_at_end(&t.path).unwrap();
    t.human("one");
    t.human("two");
    let out = jsonl::scan(&t.path, Some(&m), &[], 10);
    assert_eq!(marker_of(&out).position(), 10, "{out:?}");
}

/// The link a JSONL adoption of `path` for `key` (of agent main) makes, as stored at time 0.
fn jsonl_link(key: &str, path: &std::path::Path) -> UpstreamLink {
    let session = SessionRef::parse(key, "main").unwrap();
    let spec = jsonl::adoption(session, path, None).unwrap();
    upstream::plan_upsert(None, spec, Timestamp(0))
        .unwrap()
        .outcome
        .link
}

/// A provider made with a budget reads no more than that budget a check (a gateway's
/// configured budget, `JsonlProvider::try_with_budget`). (What the mutation did: the budget
/// given was not kept, and every check read up to 1 MiB; review of stop 66, J320.)
#[tokio::test]
async fn a_providers_budget_bounds_its_checks() {
    let mut t = Transcript::new();
    let link = jsonl_link("agent:main:main", &t.path);
    t.human("one");
    let out = JsonlProvider::new().with_budget(10).check(&link, &[]).await;
    assert_eq!(
        marker_of(&out).position(),
        10,
        "a check reads no more than the provider's budget: {out:?}"
    );
}

/// A provider made with the default budget reads a whole [`MAX_BYTES_PER_TICK`] (1 MiB,
/// DESIGN.md section 8) a check when that much was written. (What the mutation did: the
/// default provider read 1,000,000 bytes a check; review of stop 70, J514.)
#[tokio::test]
async fn the_default_provider_reads_one_mib_a_check() {
    let t = Transcript::new();
    let link = jsonl_link("agent:main:main", &t.path);
    let filler = user_row(
        "tool",
        json!([{"type": "tool_result", "tool_use_id": "t", "content": "x".repeat(300 << 10)}]),
    );
    for _ in 0..4 {
        t.line(&filler);
    }
    let out = JsonlProvider::new().check(&link, &[]).await;
    assert_eq!(
        marker_of(&out).position(),
        MAX_BYTES_PER_TICK,
        "one check reads one MiB: {out:?}"
    );
}

/// A transcript adopted through a symlink and by its own path is one source (its path stored
/// canonical), so the adopters are judged together: the prompts of each are echoes for the
/// other. (What the mutation did: the path was stored as given, and the two links were two
/// sources; review of stop 66, J307.)
#[cfg(unix)]
#[test]
fn a_transcript_adopted_through_a_symlink_is_the_same_source() {
    let t = Transcript::new();
    let dir = t.path.parent().unwrap();
    std::os::unix::fs::symlink(dir, dir.join("alias")).unwrap();
    let through = dir.join("alias").join(t.path.file_name().unwrap());
    let (a, b) = (
        jsonl_link("agent:main:main", &t.path),
        jsonl_link("agent:main:other", &through),
    );
    let provider = JsonlProvider::new();
    assert_eq!(
        provider.source_key(&a),
        provider.source_key(&b),
        "one transcript, one source"
    );
}

/// One path on two hosts names two transcripts, so their links are two sources, judged apart
/// (one adopter's prompts are no echoes for the other, and a run in one defers not the other):
/// gateways sharing a store adopt each their own host's transcript (`awareness adopt --host`),
/// at the same path when their projects lie alike. (What the mutation did: the source was named
/// by the path alone, whatever the host, so those links were one source; review of stop 72,
/// MT17.)
#[test]
fn one_transcript_path_on_two_hosts_is_two_sources() {
    let t = Transcript::new();
    let a = jsonl_link("agent:main:main", &t.path);
    let mut b = jsonl_link("agent:main:other", &t.path);
    b.host_id = "build-box".into();
    assert_eq!(jsonl::path_of(&a), jsonl::path_of(&b), "one path");
    let provider = JsonlProvider::new();
    assert_ne!(
        provider.source_key(&a),
        provider.source_key(&b),
        "two hosts, two sources"
    );
}

// ----- the paired-node provider -------------------------------------------------------------------

/// A thread on a paired node: items oldest first; pages are newest first, cursors are indexes.
#[derive(Default)]
struct FakeNode {
    items: Mutex<Vec<PairedItem>>,
    calls: AtomicUsize,
    gone: std::sync::atomic::AtomicBool,
}

impl FakeNode {
    /// A node whose thread holds `items`, oldest first.
    fn holding(items: impl IntoIterator<Item = PairedItem>) -> Arc<Self> {
        let node = Arc::new(Self::default());
        node.items.lock().unwrap().extend(items);
        node
    }
}

#[async_trait]
impl PairedNodeClient for FakeNode {
    async fn newest(
        &self,
        host_id: &str,
        thread_id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<PairedPage, PairedError> {
        assert_eq!((host_id, thread_id), ("node-2", "thread-9"));
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.gone.load(Ordering::SeqCst) {
            return Err(PairedError::NotFound);
        }
        let items = self.items.lock().unwrap();
        // A cursor past the items a node holds now (one that restarted empty): no items.
        let end = before.map_or(items.len(), |b| {
            b.parse::<usize>().unwrap().min(items.len())
        });
        let start = end.saturating_sub(limit);
        Ok(PairedPage {
            items: items[start..end].iter().rev().cloned().collect(),
            older: (start > 0).then(|| start.to_string()),
        })
    }
}

/// A transcript replaced by a FIFO: opening a FIFO for reading blocks until a writer comes,
/// so the check refuses it before opening it (each tick would otherwise leave a thread
/// blocked for good).
#[cfg(target_os = "linux")]
#[test]
fn a_transcript_replaced_by_a_fifo_is_refused_without_blocking() {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut t = Transcript::new();
    t.human("old history");
    let m = jsonl::marker_at_end(&t.path).unwrap();
    std::fs::remove_file(&t.path).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&t.path)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo failed");
    let (done, outcome) = std::sync::mpsc::channel();
    let path = t.path.clone();
    let reader = std::thread::spawn(move || {
        done.send(jsonl::scan(&path, Some(&m), &[], MAX_BYTES_PER_TICK))
            .ok();
    });
    // The timeout only keeps the test from hanging when the scan blocks in its open.
    let got = outcome.recv_timeout(Duration::from_mins(1));
    // A scan blocked in its open is let go by a writer (O_NONBLOCK: 0o4000 on Linux); with
    // no reader waiting, this open fails, which is all right.
    drop(
        OpenOptions::new()
            .write(true)
            .custom_flags(0o4000)
            .open(&t.path),
    );
    reader.join().expect("the scan thread");
    assert!(
        matches!(&got, Ok(CheckOutcome::Failed(why)) if why.contains("not a regular file")),
        "{got:?}"
    );
}

/// Bug: adopting a FIFO blocked for good (its open waits for a writer), while a check already
/// refused one. Adoption refuses it, naming it, before opening it.
#[cfg(target_os = "linux")]
#[test]
fn adopting_a_fifo_is_refused_without_blocking() {
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fifo.jsonl");
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo failed");
    let (done, outcome) = std::sync::mpsc::channel();
    let fifo = path.clone();
    let adopter = std::thread::spawn(move || {
        let session = SessionRef::parse("agent:main:worker", "main").unwrap();
        done.send(jsonl::adoption(session, &fifo, None).map(|spec| spec.thread_id))
            .ok();
    });
    // The timeout only keeps the test from hanging when the adoption blocks in its open.
    let got = outcome.recv_timeout(Duration::from_mins(1));
    // An adoption blocked in its open is let go by a writer (O_NONBLOCK: 0o4000 on Linux);
    // with no reader waiting, this open fails, which is all right.
    drop(
        OpenOptions::new()
            .write(true)
            .custom_flags(0o4000)
            .open(&path),
    );
    adopter.join().expect("the adoption thread");
    let got = got.expect("the adoption answered without a writer");
    let e = got.expect_err("a FIFO is no transcript");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
    let named = std::fs::canonicalize(&path).unwrap();
    assert_eq!(
        e.to_string(),
        format!("{} is not a regular file", named.display())
    );
}

/// Bug: a transcript path that is not UTF-8 (a Latin-1 directory name) panicked in the
/// adoption, where the link's reference is built as JSON. It is refused, naming the path.
#[cfg(target_os = "linux")] // macOS file systems refuse names that are not UTF-8
#[test]
fn adopting_a_path_that_is_not_utf8_is_refused() {
    use std::os::unix::ffi::OsStrExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir
        .path()
        .join(std::ffi::OsStr::from_bytes(b"caf\xe9.jsonl"));
    File::create(&path).unwrap();
    let session = SessionRef::parse("agent:main:worker", "main").unwrap();
    let e = jsonl::adoption(session, &path, None).expect_err("refused");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
    assert!(
        e.to_string()
            .ends_with("is not a UTF-8 path, which a link cannot store"),
        "{e}"
    );
}

fn paired_link(marker: Option<Value>) -> UpstreamLink {
    let session = SessionRef::parse("agent:main:main", "main").unwrap();
    let mut spec = LinkSpec::new(
        session,
        "openclaw-node",
        "node-2",
        "thread-9",
        "paired-node",
    );
    spec.marker = marker;
    upstream::plan_upsert(None, spec, Timestamp(0))
        .unwrap()
        .outcome
        .link
}

/// A stored marker a provider cannot read (another version's, or one edited by hand) makes the
/// check rebase the link, and the turns typed since it are never counted: that is said with a
/// `warn!` naming the session, as every best-effort loss is. It was a `debug!` line at most.
#[tokio::test]
async fn a_marker_a_provider_cannot_read_is_logged_when_the_link_is_rebased() {
    let capture = common::Capture::default();
    let _logging = capture.install();
    let mut t = Transcript::new();
    t.human("old history");
    let session = SessionRef::parse("agent:main:worker", "main").unwrap();
    let mut spec = jsonl::adoption(session.clone(), &t.path, None).unwrap();
    spec.marker = Some(json!({"offset": "x"}));
    let link = upstream::plan_upsert(None, spec, Timestamp(0))
        .unwrap()
        .outcome
        .link;
    let jsonl = JsonlProvider::new().check(&link, &[]).await;
    assert!(matches!(jsonl, CheckOutcome::Rebased { .. }), "{jsonl:?}");
    let node = FakeNode::holding([PairedItem::user("i0", "old")]);
    let paired = PairedNodeProvider::new(node)
        .check(&paired_link(Some(json!({"uuid": 1}))), &[])
        .await;
    assert!(matches!(paired, CheckOutcome::Rebased { .. }), "{paired:?}");
    // A link with no marker yet is no unreadable one: it is rebased without a warning. (What
    // the mutation did: a missing marker was read as an unreadable one, and every check of a
    // link without a marker warned that the turns since it were not counted; review of stop
    // 71, GF22.)
    let fresh = PairedNodeProvider::new(FakeNode::holding([PairedItem::user("i0", "old")]))
        .check(&paired_link(None), &[])
        .await;
    assert!(matches!(fresh, CheckOutcome::Rebased { .. }), "{fresh:?}");
    let warned: Vec<String> = capture
        .lines()
        .into_iter()
        .filter(|l| l.contains("upstream marker unreadable") && l.ends_with("level=WARN"))
        .collect();
    assert_eq!(warned.len(), 2, "{warned:#?}");
    assert!(warned[0].contains("agent:main:worker") && warned[0].contains("\"offset\":\"x\""));
    assert!(warned[1].contains("agent:main:main") && warned[1].contains("\"uuid\":1"));
}

/// Bug (review, stop 53): a paired item could not say it carried an image or a file, so a
/// person's message of such parts alone (no text) was skipped as empty, where the same message
/// in a transcript counts. An item with `non_text` and no text is a human turn; without it, an
/// empty item is still none, and an assistant's image is no human turn either.
#[tokio::test]
async fn an_image_only_message_on_a_paired_node_is_a_human_turn() {
    let mut image = PairedItem::user("p1", "");
    image.non_text = true;
    let mut reply = PairedItem::with_role("r1", "assistant", "");
    reply.non_text = true;
    let node = FakeNode::holding([
        PairedItem::user("m", "read before"),
        PairedItem::user("e1", "  "),
        image,
        reply,
    ]);
    let provider = PairedNodeProvider::new(node);
    assert_eq!(
        provider
            .check(&paired_link(Some(json!({"uuid": "m"}))), &[])
            .await,
        human_turns(1, "p1", json!({"uuid": "r1", "anchors": ["p1", "e1", "m"]}))
    );
}

/// A paired item a subagent wrote, or one delivered from another session, is no human turn
/// whatever its text (DESIGN.md section 8, as the same rows of a transcript). (Either flag
/// left unread, two mutations every test passed, counted it as the person's: review of
/// stop 61.)
#[tokio::test]
async fn a_paired_item_of_a_subagent_or_another_session_is_no_human_turn() {
    for item in [
        PairedItem {
            sidechain: true,
            ..PairedItem::user("i1", "a subagent's prompt")
        },
        PairedItem {
            inter_session: true,
            ..PairedItem::user("i1", "please review the diff")
        },
    ] {
        let provider =
            PairedNodeProvider::new(FakeNode::holding([PairedItem::user("i0", "old"), item]));
        let out = provider
            .check(&paired_link(Some(json!({"uuid": "i0"}))), &[])
            .await;
        assert_eq!(turns(&out), 0, "{out:?}");
    }
}

/// A paired item of a role other than `user` (a tool's result, a system note) is no human
/// turn, whatever its text: only a person's `user` item is, as only a `user` row of a
/// transcript is. (What the mutation did: only `assistant` items were skipped, and a tool's
/// output was counted as the person's turn; review of stop 68, J417.)
#[tokio::test]
async fn a_paired_item_of_a_tool_or_the_system_is_no_human_turn() {
    for role in ["tool", "system"] {
        let provider = PairedNodeProvider::new(FakeNode::holding([
            PairedItem::user("i0", "old"),
            PairedItem::with_role("i1", role, "exit code 0"),
        ]));
        let out = provider
            .check(&paired_link(Some(json!({"uuid": "i0"}))), &[])
            .await;
        assert_eq!(turns(&out), 0, "a {role} item is no human turn: {out:?}");
    }
}

/// A paired user item whose text is an envelope the text rules skip (a replay of a
/// transcript, an inter-session message, a task notification) is no human turn, however long
/// the envelope's opening words are: the item's text is judged on as many characters as a
/// transcript line's. (What the mutation did: a paired item's text was judged on its first 8
/// characters, and each of these was counted as the person's turn; review of stop 70, J520.)
#[tokio::test]
async fn a_paired_item_that_is_an_envelope_is_no_human_turn() {
    for text in [
        "Continue this conversation using the OpenClaw transcript below: ...",
        "[Inter-session message] from agent:main:other: please review",
        "<task-notification><task-id>t1</task-id></task-notification>",
    ] {
        let provider = PairedNodeProvider::new(FakeNode::holding([
            PairedItem::user("i0", "old"),
            PairedItem::user("i1", text),
        ]));
        let out = provider
            .check(&paired_link(Some(json!({"uuid": "i0"}))), &[])
            .await;
        assert_eq!(turns(&out), 0, "{text:?} is no human turn: {out:?}");
    }
}

/// Threads of one id on two paired nodes are two sources: the monitor judges them apart (one
/// session's prompts do not hide a person's turn of the same text in the other, and a run in
/// one does not defer the other's checks). (The source named by the thread alone, a mutation
/// every test passed, made them one: review of stop 61.)
#[test]
fn paired_threads_of_one_id_on_two_nodes_are_two_sources() {
    let provider = PairedNodeProvider::new(FakeNode::holding([]));
    let mut a = paired_link(None);
    let mut b = a.clone();
    b.host_id = "node-3".into();
    assert_eq!(a.thread_id, b.thread_id);
    assert_ne!(provider.source_key(&a), provider.source_key(&b));
    // The host and the thread are kept apart: a host whose name ends as another's thread
    // begins (`node-1` and `2x`, `node-12` and `x`) is another source. (What the mutation did:
    // the two were joined with nothing between, and such threads on two nodes were one source,
    // a run in one deferring the other's checks; review of stop 72, GH33.)
    (a.host_id, a.thread_id) = ("node-1".into(), "2x".into());
    (b.host_id, b.thread_id) = ("node-12".into(), "x".into());
    assert_ne!(provider.source_key(&a), provider.source_key(&b));
}

#[tokio::test]
async fn paired_node_pages_back_to_the_marker() {
    let mut items = Vec::new();
    for i in 0..10 {
        items.push(PairedItem::user(format!("i{i}"), format!("old {i}")));
    }
    // A burst of 60 human turns and 60 replies: 120 items, more than two windows.
    for i in 10..130 {
        items.push(if i % 2 == 0 {
            PairedItem::user(format!("i{i}"), format!("typed on the node {i}"))
        } else {
            PairedItem::with_role(format!("i{i}"), "assistant", "ok")
        });
    }
    let mut inter = PairedItem::user("i130", "[Inter-session message] from agent:ops:main");
    inter.inter_session = true;
    items.push(inter);
    items.push(PairedItem::user("i131", "echo of my own prompt"));
    let node = FakeNode::holding(items);
    let provider = PairedNodeProvider::new(node.clone());
    let own = vec!["echo of my   own prompt".to_owned()];
    let link = paired_link(Some(
        PairedMarker {
            uuid: Some("i9".into()),
            anchors: Vec::new(),
            resume: None,
        }
        .to_value(),
    ));
    let out = provider.check(&link, &own).await;
    // The newest item, and the items just below it (its anchors).
    let newest = json!({"uuid": "i131", "anchors": ["i130", "i129", "i128", "i127"]});
    assert_eq!(
        out,
        CheckOutcome::HumanTurns {
            turns: 60,
            dedupe_id: "i128".into(),
            source_id: "node-2/thread-9".into(),
            marker: newest.clone(),
        },
        "every turn of the burst, not only the newest {PAGE_ITEMS}"
    );
    assert_eq!(node.calls.load(Ordering::SeqCst), 3, "three pages of 50");

    let caught_up = paired_link(Some(json!({"uuid": "i131"})));
    assert_eq!(
        provider.check(&caught_up, &own).await,
        CheckOutcome::Unchanged {
            marker: json!({"uuid": "i131"})
        }
    );
    // No marker: start at the newest item (the only one read: no anchors). A marker item
    // that no longer exists: rebased, anchored at the items read below the newest.
    assert_eq!(
        provider.check(&paired_link(None), &own).await,
        CheckOutcome::Rebased {
            marker: json!({"uuid": "i131"})
        }
    );
    assert_eq!(
        provider
            .check(&paired_link(Some(json!({"uuid": "deleted"}))), &own)
            .await,
        CheckOutcome::Rebased { marker: newest }
    );
    // A node that answers one check with no items (restarting, still loading the thread): the
    // marker stays, and the check after it counts nothing old. It was rebased to "no item",
    // and the check after counted the thread's whole history as new turns.
    let all = std::mem::take(&mut *node.items.lock().unwrap());
    assert_eq!(
        provider.check(&caught_up, &own).await,
        CheckOutcome::Unchanged {
            marker: json!({"uuid": "i131"})
        }
    );
    *node.items.lock().unwrap() = all;
    assert_eq!(
        provider.check(&caught_up, &own).await,
        CheckOutcome::Unchanged {
            marker: json!({"uuid": "i131"})
        }
    );
    // The same, for a link without a usable marker: nothing is concluded (it was stored as
    // "no item", and the check after counted the whole thread), and the check after, with
    // the items back, starts at the newest.
    let all = std::mem::take(&mut *node.items.lock().unwrap());
    assert!(matches!(
        provider.check(&paired_link(None), &own).await,
        CheckOutcome::Failed(e) if e.contains("answered no items")
    ));
    *node.items.lock().unwrap() = all;
    assert_eq!(
        provider.check(&paired_link(None), &own).await,
        CheckOutcome::Rebased {
            marker: json!({"uuid": "i131"})
        }
    );
    // An empty thread at adoption: everything after is new.
    let fresh = paired_link(Some(json!({"uuid": null})));
    assert!(matches!(
        provider.check(&fresh, &[]).await,
        CheckOutcome::HumanTurns { turns: 71, .. }
    ));
    node.gone.store(true, Ordering::SeqCst);
    assert_eq!(
        provider.check(&caught_up, &own).await,
        CheckOutcome::Missing
    );
}

// ----- the monitor ---------------------------------------------------------------------------------

impl World {
    /// Adopts `spec` (a new link) and lets `watcher` watch its session; the session.
    async fn adopt_spec(&self, spec: LinkSpec, watcher: &str) -> SessionRef {
        let session = spec.session.clone();
        assert!(self.svc.try_adopt(spec).await.unwrap().created);
        self.store
            .watch(
                &WatcherKey::parse(watcher).unwrap(),
                &session,
                Timestamp::now(),
            )
            .await
            .unwrap();
        session
    }

    /// Adopts thread-9 of the paired node node-2 for agent:main:worker, with `marker`, and lets
    /// agent:main:main watch it.
    async fn watched_paired_thread(&self, marker: Value) -> SessionRef {
        let session = SessionRef::parse("agent:main:worker", "main").unwrap();
        let mut spec = LinkSpec::new(
            session,
            "openclaw-node",
            "node-2",
            "thread-9",
            "paired-node",
        );
        spec.marker = Some(marker);
        self.adopt_spec(spec, "agent:main:main").await
    }

    /// Adopts the transcript for `key` (agent `agent`) and lets `watcher` watch the session.
    async fn adopt(&self, t: &Transcript, key: &str, agent: &str, watcher: &str) -> SessionRef {
        let session = SessionRef::parse(key, agent).unwrap();
        let spec = jsonl::adoption(session, &t.path, None).unwrap();
        self.adopt_spec(spec, watcher).await
    }

    /// Adopts a remote session `key` (agent main) checked by the provider of `kind`, watched by
    /// agent:main:main.
    async fn adopt_remote(&self, key: &str, kind: &str) -> SessionRef {
        let r = SessionRef::parse(key, "main").unwrap();
        let spec = LinkSpec::new(r, "remote", "h", "t", kind);
        self.adopt_spec(spec, "agent:main:main").await
    }

    fn monitor(&self) -> gateway_adapter::upstream::MonitorBuilder {
        UpstreamMonitor::builder(self.svc.clone(), self.store.clone())
            .provider(Arc::new(JsonlProvider::new()))
    }

    /// How many `human_direct_message` events `session` holds.
    async fn human_events(&self, session: &SessionRef) -> usize {
        self.events(session, EventKind::HumanDirectMessage)
            .await
            .len()
    }

    async fn events(
        &self,
        session: &SessionRef,
        kind: EventKind,
    ) -> Vec<Arc<awareness_core::Event>> {
        self.store
            .changes_since(session, Sequence::ZERO, 200)
            .await
            .unwrap()
            .events
            .into_iter()
            .filter(|e| e.kind == kind)
            .collect()
    }
}

/// The next detection `pick` accepts (paused time runs on while the monitor waits; a virtual
/// hour without one fails the test instead of hanging it).
async fn next<T>(
    rx: &mut broadcast::Receiver<Detection>,
    mut pick: impl FnMut(&Detection) -> Option<T>,
) -> T {
    tokio::time::timeout(Duration::from_hours(1), async {
        loop {
            let d = rx.recv().await.expect("the monitor is running");
            if let Some(t) = pick(&d) {
                return t;
            }
        }
    })
    .await
    .expect("a detection within a virtual hour")
}

async fn next_tick(rx: &mut broadcast::Receiver<Detection>) -> gateway_adapter::TickReport {
    next(rx, |d| match d {
        Detection::TickDone(r) => Some(*r),
        _ => None,
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn monitor_records_one_event_per_burst_on_its_schedule() {
    let w = world();
    let mut t = Transcript::new();
    t.human("history");
    let session = w
        .adopt(&t, "agent:main:worker", "main", "agent:main:main")
        .await;
    let adopted = w.events(&session, EventKind::Adopted).await;
    assert_eq!(adopted.len(), 1);
    assert_eq!(adopted[0].summary, "adopted from claude-code");

    let monitor = w.monitor().build();
    let mut rx = monitor.subscribe();
    let started = Instant::now();
    let task = monitor.spawn();

    t.human("stop, the API changed");
    t.model_turn();
    t.human("<command-name>/model</command-name>");
    let last = t.human("[Request interrupted by user]");
    let (event, turns) = next(&mut rx, |d| match d {
        Detection::HumanTurns {
            event,
            turns,
            marker: MarkerMove::Moved,
            ..
        } => Some((event.clone(), *turns)),
        _ => None,
    })
    .await;
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(15),
        "first tick after 15 s"
    );
    assert_eq!(turns, 3);
    assert_eq!(event.kind, EventKind::HumanDirectMessage);
    assert_eq!(event.actor_type, ActorType::Human);
    assert_eq!(event.summary, "human message via claude-code");
    assert_eq!(event.payload.as_ref().unwrap()["turns"], json!(3));
    // The exact dedupe key of DESIGN.md section 8: recording it again is a dedupe hit.
    let link = w.store.link(&session).await.unwrap().unwrap();
    let key = upstream::human_dedupe_key(&link, &t.path.display().to_string(), &last);
    assert!(key.starts_with("upstream:agent:main:worker:"));
    let again = w
        .store
        .record(
            NewEvent::new(
                session.clone(),
                EventKind::HumanDirectMessage,
                ActorType::Human,
                "x",
            )
            .with_dedupe_key(key),
            Timestamp::now(),
        )
        .await
        .unwrap();
    assert!(again.deduplicated && again.event.sequence == event.sequence);
    // The watcher was told once.
    let queued = w.queue.peek(&SessionKey::new("agent:main:main").unwrap());
    assert_eq!(queued.len(), 1);
    assert!(queued[0].text.contains("agent:main:worker"));

    // Nothing new: the next tick, 60 s later, records nothing.
    let r = next_tick(&mut rx).await;
    assert_eq!((r.tick, r.checked), (1, 1));
    let r = next_tick(&mut rx).await;
    assert_eq!(r.tick, 2);
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(75),
        "then every 60 s"
    );
    assert_eq!(w.human_events(&session).await, 1);

    // A single turn: no payload.
    t.human("one more thing");
    let event = next(&mut rx, |d| match d {
        Detection::HumanTurns { event, .. } => Some(event.clone()),
        _ => None,
    })
    .await;
    assert_eq!(event.payload, None);
    assert_eq!(w.human_events(&session).await, 2);
    let link = w.store.link(&session).await.unwrap().unwrap();
    assert!(link.last_scanned_at.is_some());
    task.stop().await;
}

#[tokio::test(start_paused = true)]
async fn own_prompts_runs_and_unwatched_links() {
    let (w, mut t, session) = worker_adopted().await;
    let unwatched = SessionRef::parse("agent:main:lonely", "main").unwrap();
    w.svc
        .try_adopt(jsonl::adoption(unwatched.clone(), &t.path, None).unwrap())
        .await
        .unwrap();
    let prompts = Arc::new(RecentPrompts::new());
    let runs = Arc::new(RunTracker::new());
    let monitor = w
        .monitor()
        .own_prompts(prompts.clone())
        .run_activity(runs.clone())
        .build();

    // The gateway's own prompt echoes into the transcript: not a person.
    prompts.record(&session, "Run the   test suite and report.");
    t.human("Run the test suite\nand report.");
    let r = monitor.tick().await;
    assert_eq!((r.links, r.checked, r.unwatched), (2, 1, 1));
    assert!(
        w.events(&session, EventKind::HumanDirectMessage)
            .await
            .is_empty()
    );
    assert!(
        w.events(&unwatched, EventKind::HumanDirectMessage)
            .await
            .is_empty()
    );
    let lonely = w.store.link(&unwatched).await.unwrap().unwrap();
    assert_eq!(
        lonely.last_scanned_at, None,
        "an unwatched link is not read"
    );
    let read = w
        .store
        .link(&session)
        .await
        .unwrap()
        .unwrap()
        .marker
        .unwrap();
    assert_eq!(
        JsonlMarker::from_value(&read).unwrap().position(),
        std::fs::metadata(&t.path).unwrap().len(),
        "the marker moves over rows that are not human turns"
    );

    // A run is active: the scan waits.
    runs.started(&session);
    t.human("typed during the run");
    let mut rx = monitor.subscribe();
    let r = monitor.tick().await;
    assert_eq!(r.deferred, 1);
    assert_eq!(
        next(&mut rx, |d| match d {
            Detection::Deferred { session } => Some(session.clone()),
            _ => None,
        })
        .await,
        session
    );
    assert!(
        w.events(&session, EventKind::HumanDirectMessage)
            .await
            .is_empty()
    );
    runs.finished(&session);
    monitor.tick().await;
    let events = w.events(&session, EventKind::HumanDirectMessage).await;
    assert_eq!(events.len(), 1, "counted once the run ended");
    assert_eq!(events[0].payload, None, "the echo did not count");
}

/// A provider that never answers.
struct Hanging;

#[async_trait]
impl UpstreamProvider for Hanging {
    fn kind(&self) -> &'static str {
        "hanging"
    }

    async fn check(&self, _: &UpstreamLink, _: &[String]) -> CheckOutcome {
        std::future::pending().await
    }
}

/// A provider that always fails.
struct Broken;

#[async_trait]
impl UpstreamProvider for Broken {
    fn kind(&self) -> &'static str {
        "broken"
    }

    async fn check(&self, _: &UpstreamLink, _: &[String]) -> CheckOutcome {
        CheckOutcome::Failed("the node refused".into())
    }
}

/// Bug: with gateways sharing a store, each one's monitor checked every adopted session,
/// against its own prompts and runs only: the prompt the owning gateway sent into the session
/// read, in another gateway's monitor, as a person's turn, and every watcher was told of a
/// change by another actor. With `owned_watchers_only`, a monitor checks only the sessions
/// its directory knows; the owner's monitor checks them.
#[tokio::test(start_paused = true)]
async fn with_owned_watchers_only_a_monitor_checks_only_its_own_sessions() {
    let (w, mut t, session) = worker_adopted().await;
    t.human("run the tests");
    let monitor_of = |sessions: &[&SessionKey]| {
        let directory = Arc::new(InMemoryDirectory::new());
        for s in sessions {
            directory.upsert((*s).clone(), gateway_adapter::SessionEntry::default());
        }
        owned_watchers_only_monitor(&w, directory).build()
    };

    let report = monitor_of(&[]).tick().await;
    assert_eq!(
        (report.links, report.not_owned, report.checked),
        (1, 1, 0),
        "another gateway's session: {report:?}"
    );
    assert_eq!(w.human_events(&session).await, 0, "nothing recorded");

    let report = monitor_of(&[&session.session_key]).tick().await;
    assert_eq!(
        (report.links, report.not_owned, report.checked),
        (1, 0, 1),
        "its owner's: {report:?}"
    );
    assert_eq!(w.human_events(&session).await, 1);
}

/// With `owned_watchers_only`, under `session.scope = "global"`: each gateway's directory
/// knows a session called `global`, but another gateway's agent's adopted `global` is not this
/// gateway's. A directory that says which agents the gateway hosts
/// (`InMemoryDirectory::hosting`) keeps its monitor to its own agent's: gateway A's monitor
/// checked gateway B's adopted `global`, against A's prompts, and read B's own prompt as a
/// person's turn (review, stop 55).
#[tokio::test(start_paused = true)]
async fn with_owned_watchers_only_another_agents_bare_key_is_not_this_gateways() {
    let w = world();
    let mut t = Transcript::new();
    let b_global = w.adopt(&t, "global", "b", "agent:b:main").await;
    let monitor_of = |agent: &str| {
        let directory = Arc::new(InMemoryDirectory::hosting([AgentId::new(agent).unwrap()]));
        directory.upsert(
            SessionKey::new("global").unwrap(),
            gateway_adapter::SessionEntry::default(),
        );
        owned_watchers_only_monitor(&w, directory)
            .own_prompts(Arc::new(RecentPrompts::new()))
            .build()
    };
    t.human("gateway B's own prompt to its agent");
    let report = monitor_of("a").tick().await;
    assert_eq!(
        (
            report.not_owned,
            report.checked,
            w.human_events(&b_global).await
        ),
        (1, 0, 0),
        "gateway A's monitor: {report:?}"
    );
    let report = monitor_of("b").tick().await;
    assert_eq!(
        (report.not_owned, report.checked),
        (0, 1),
        "gateway B's monitor: {report:?}"
    );
}

/// A check that fails the same way at every tick (a transcript the gateway may not read) is
/// logged at warn level once, then at debug level while it repeats; another failure is
/// logged again, and so is the end of it, and a failure after that, and one after a tick that
/// did not check the link (nothing watched it). It was a warning at every tick, for as long
/// as the cause lasted (1,440 a day at the default interval, per link).
#[tokio::test(start_paused = true)]
async fn a_check_failing_alike_at_every_tick_is_warned_of_once() {
    struct Flaky(std::sync::Mutex<Vec<Option<&'static str>>>);
    #[async_trait]
    impl UpstreamProvider for Flaky {
        fn kind(&self) -> &'static str {
            "flaky"
        }

        async fn check(&self, _: &UpstreamLink, _: &[String]) -> CheckOutcome {
            match self.0.lock().unwrap().remove(0) {
                Some(error) => CheckOutcome::Failed(error.to_owned()),
                None => CheckOutcome::Unchanged {
                    marker: serde_json::json!(1),
                },
            }
        }
    }
    let capture = common::Capture::default();
    let _logs = capture.install();
    let w = world();
    let session = w.adopt_remote("agent:main:remote", "flaky").await;
    let denied = Some("permission denied");
    let gone = Some("the node is gone");
    // The sixth tick's, then the unwatched tick's (its source is read to pass it over, which
    // logs no check's failure), then the last tick's.
    let outcomes = vec![denied, denied, denied, gone, None, denied, denied, denied];
    let ticks = 6;
    let monitor = w
        .monitor()
        .provider(Arc::new(Flaky(std::sync::Mutex::new(outcomes))))
        .build();
    for _ in 0..ticks {
        monitor.tick().await;
    }
    let manager = WatcherKey::parse("agent:main:main").unwrap();
    assert!(
        w.store
            .unwatch(&manager, &session.session_key)
            .await
            .unwrap()
    );
    assert_eq!(monitor.tick().await.unwatched, 1);
    w.store
        .watch(&manager, &session, Timestamp::now())
        .await
        .unwrap();
    monitor.tick().await;
    let levels = |what: &str| -> Vec<String> {
        capture
            .lines()
            .iter()
            .filter(|l| l.contains(what))
            .map(|l| l.rsplit("level=").next().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(
        levels("upstream check failed"),
        ["WARN", "DEBUG", "DEBUG", "WARN", "WARN", "WARN"],
        "denied, twice again, gone, then denied after a check that worked, and after a tick \
         that did not check"
    );
    assert_eq!(levels("upstream check works again"), ["INFO"]);
}

/// A provider whose check panics fails that session's check, said as a failure naming the
/// session and the panic: the panic was logged without either, and no detection said it.
#[tokio::test(start_paused = true)]
async fn a_provider_whose_check_panics_fails_that_sessions_check() {
    struct Panics;
    #[async_trait]
    impl UpstreamProvider for Panics {
        fn kind(&self) -> &'static str {
            "panics"
        }

        async fn check(&self, _: &UpstreamLink, _: &[String]) -> CheckOutcome {
            panic!("the node's client panicked")
        }
    }
    let w = world();
    let mut t = Transcript::new();
    let good = w
        .adopt(&t, "agent:main:worker", "main", "agent:main:main")
        .await;
    let bad = w.adopt_remote("agent:main:remote", "panics").await;
    let monitor = w.monitor().provider(Arc::new(Panics)).build();
    let mut rx = monitor.subscribe();
    t.human("typed by a person");
    let report = monitor.tick().await;
    assert_eq!((report.links, report.checked), (2, 1));
    assert_eq!(w.human_events(&good).await, 1, "the other check goes on");
    let failed = next(&mut rx, |d| match d {
        Detection::Failed { session, error } => Some((session.clone(), error.clone())),
        _ => None,
    })
    .await;
    assert_eq!(failed.0, bad);
    assert!(
        failed.1.contains("the node's client panicked"),
        "{}",
        failed.1
    );
}

/// The JSONL provider, except that naming a link's source panics (which a provider must not).
struct SourceKeyPanics(JsonlProvider);

#[async_trait]
impl UpstreamProvider for SourceKeyPanics {
    fn kind(&self) -> &str {
        self.0.kind()
    }

    async fn check(&self, link: &UpstreamLink, own: &[String]) -> CheckOutcome {
        self.0.check(link, own).await
    }

    fn source_key(&self, link: &UpstreamLink) -> String {
        panic!(
            "the provider panicked naming the source of {}",
            link.session
        )
    }
}

/// A provider that panics naming a link's source costs no check: the link is judged alone,
/// and its human turns are recorded. (What the mutation did: the panic unwound through the
/// tick, which checked nothing, at every tick; review of stop 68, MN12.)
#[tokio::test(start_paused = true)]
async fn a_provider_panicking_naming_a_source_still_has_its_link_checked() {
    let (w, mut t, session) = worker_adopted().await;
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(SourceKeyPanics(JsonlProvider::new())))
        .build();
    t.human("typed while the provider cannot name its source");
    let report = monitor.tick().await;
    assert_eq!(report.checked, 1, "the link is checked, alone");
    assert_eq!(w.human_events(&session).await, 1, "its turn is recorded");
}

/// A link whose provider panics naming its source is judged alone, by its own session's
/// prompts: the gateway's own prompt echoed into its thread is no person's turn. (What the
/// mutation did: such a link was judged by no prompt at all, so the echo was recorded as a
/// person's turn; review of stop 68, MN43.)
#[tokio::test(start_paused = true)]
async fn a_link_judged_alone_after_its_source_could_not_be_named_keeps_its_own_prompts() {
    let (w, mut t, session) = worker_adopted().await;
    let prompts = Arc::new(RecentPrompts::new());
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(SourceKeyPanics(JsonlProvider::new())))
        .own_prompts(prompts.clone())
        .build();
    prompts.record(&session, "Run the test suite and report.");
    t.human("Run the test suite and report.");
    assert_eq!(monitor.tick().await.checked, 1);
    assert_eq!(
        w.human_events(&session).await,
        0,
        "the gateway's own prompt is no person's turn"
    );
}

/// Links whose provider panics naming their sources are each judged alone, not as one source: a
/// run in one session defers no other's check. (What the mutation did: every such link of a
/// kind was taken for one source, so a run in one session deferred the checks of all; review of
/// stop 70, MB36.)
#[tokio::test(start_paused = true)]
async fn links_whose_sources_could_not_be_named_are_not_judged_together() {
    let w = world();
    let mut ta = Transcript::new();
    let tb = Transcript::new();
    let alpha = w
        .adopt(&ta, "agent:alpha:main", "alpha", "agent:alpha:lead")
        .await;
    let beta = w
        .adopt(&tb, "agent:beta:main", "beta", "agent:beta:lead")
        .await;
    let runs = Arc::new(RunTracker::new());
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(SourceKeyPanics(JsonlProvider::new())))
        .run_activity(runs.clone())
        .build();
    runs.started(&beta);
    ta.human("typed in alpha's own thread");
    let r = monitor.tick().await;
    assert_eq!(
        (r.checked, r.deferred),
        (1, 1),
        "beta's run defers beta's check only"
    );
    assert_eq!(w.human_events(&alpha).await, 1, "alpha's turn is recorded");
}

/// A provider added for a kind the builder already has replaces the first one, as
/// `MonitorBuilder::provider` says. (What the mutation did: the first provider of a kind was
/// kept; review of stop 68, MN49.)
#[tokio::test(start_paused = true)]
async fn a_provider_added_again_for_its_kind_replaces_the_first() {
    let (w, mut t, session) = worker_adopted().await;
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(JsonlPanicsFor {
            inner: JsonlProvider::new(),
            bad: session.clone(),
        }))
        .provider(Arc::new(JsonlProvider::new()))
        .build();
    t.human("typed in the thread");
    monitor.tick().await;
    assert_eq!(
        w.human_events(&session).await,
        1,
        "read by the provider added last"
    );
}

/// A spawned monitor's task whose runtime shut down is finished (a host that asks whether the
/// task ended by itself is told it did). (What the mutation did: `is_finished` answered false;
/// review of stop 68, MN06.)
#[test]
fn a_monitor_task_whose_runtime_shut_down_is_finished() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let task = runtime.block_on(async { world().monitor().build().spawn() });
    assert!(!task.is_finished(), "running");
    drop(runtime);
    assert!(task.is_finished(), "ended with its runtime");
}

/// A gateway's run activity that panics for one session fails that session's check only: the
/// tick goes on, and the other session's turn is recorded. The panic ended the tick, and with
/// it the monitor.
#[tokio::test(start_paused = true)]
async fn a_run_activity_that_panics_for_one_session_fails_only_its_check() {
    let w = world();
    // Two threads: for one thread, see
    // `a_run_port_panicking_for_one_linked_session_does_not_stop_the_others_checks`.
    let mut t = Transcript::new();
    let mut other = Transcript::new();
    let good = w
        .adopt(&t, "agent:main:worker", "main", "agent:main:main")
        .await;
    let bad = w
        .adopt(&other, "agent:main:broken", "main", "agent:main:main")
        .await;
    let ports = Arc::new(PanicsFor::new(&bad));
    ports.runs.store(true, Ordering::SeqCst);
    let monitor = w.monitor().run_activity(ports).build();
    let mut rx = monitor.subscribe();
    t.human("typed by a person");
    other.human("typed by a person");
    let report = monitor.tick().await;
    assert_eq!((report.links, report.checked), (2, 1));
    assert_eq!(w.human_events(&good).await, 1);
    assert_eq!(w.human_events(&bad).await, 0);
    let failed = next(&mut rx, |d| match d {
        Detection::Failed { session, .. } => Some(session.clone()),
        _ => None,
    })
    .await;
    assert_eq!(failed, bad);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_or_failing_provider_never_stops_the_others() {
    let (w, mut t, session) = worker_adopted().await;
    let mut others = Vec::new();
    for (key, kind) in [
        ("agent:main:a-hang", "hanging"),
        ("agent:main:b-broken", "broken"),
    ] {
        others.push(w.adopt_remote(key, kind).await);
    }
    let monitor = w
        .monitor()
        .provider(Arc::new(Hanging))
        .provider(Arc::new(Broken))
        .build();
    let mut rx = monitor.subscribe();
    let started = Instant::now();
    let task = monitor.spawn();
    t.human("are you still there?");

    // One tick: every detection up to its end.
    let mut human_at = None;
    let mut failed = Vec::new();
    let report = next(&mut rx, |d| match d {
        Detection::HumanTurns { session: s, .. } => {
            assert_eq!(s, &session);
            human_at = Some(started.elapsed());
            None
        }
        Detection::Failed { session, error } => {
            failed.push((session.clone(), error.clone()));
            None
        }
        Detection::TickDone(r) => Some(*r),
        _ => None,
    })
    .await;
    assert_eq!(
        human_at,
        Some(Duration::from_secs(15)),
        "recorded at once, not after the hanging check"
    );
    assert_eq!(report.checked, 3);
    assert_eq!(
        started.elapsed(),
        Duration::from_mins(1), // 15 s to the tick, then the 45 s timeout
        "the tick ends when the hanging check times out"
    );
    failed.sort();
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert_eq!(failed[0].0, others[0]);
    assert!(failed[0].1.contains("timed out"), "{}", failed[0].1);
    assert_eq!(
        failed[1],
        (others[1].clone(), "the node refused".to_owned())
    );

    // The next tick comes on schedule, and the monitor still works.
    t.human("hello?");
    let n = next(&mut rx, |d| match d {
        Detection::HumanTurns { session, .. } => Some(session.clone()),
        _ => None,
    })
    .await;
    assert_eq!(n, session);
    assert_eq!(w.human_events(&session).await, 2);
    task.stop().await;
}

/// A provider that says when a check has begun, then never answers.
struct Begun(tokio::sync::mpsc::UnboundedSender<()>);

#[async_trait]
impl UpstreamProvider for Begun {
    fn kind(&self) -> &'static str {
        "begun"
    }

    async fn check(&self, _: &UpstreamLink, _: &[String]) -> CheckOutcome {
        let _ = self.0.send(());
        std::future::pending().await
    }
}

// Worker threads, as a gateway's runtime has: an aborted task is dropped on whichever thread
// runs it next, which may be after `stop` returned. A watched link's check, and the pass over an
// unwatched link's source that reads on past its tick (here once the tick's 10 ms are over),
// hold nothing once `stop` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_stopped_mid_tick_holds_nothing_once_stop_returns() {
    for watched in [true, false] {
        let w = world();
        let session = SessionRef::parse("agent:main:remote", "main").unwrap();
        if watched {
            w.adopt_remote("agent:main:remote", "begun").await;
        } else {
            // Adopted, watched by nobody: its source is passed over, not checked.
            let spec = LinkSpec::new(session, "remote", "h", "t", "begun");
            assert!(w.svc.try_adopt(spec).await.unwrap().created);
        }
        let World {
            store,
            svc: awareness,
            ..
        } = w;
        let (began, mut begun) = tokio::sync::mpsc::unbounded_channel();
        let monitor = UpstreamMonitor::builder(awareness.clone(), store.clone())
            .provider(Arc::new(HoldsTheStore(store.clone(), began)))
            .config(gateway_adapter::MonitorConfig {
                first_tick: Duration::ZERO,
                provider_timeout: if watched {
                    gateway_adapter::MonitorConfig::default().provider_timeout
                } else {
                    Duration::from_millis(10)
                },
                ..gateway_adapter::MonitorConfig::default()
            })
            .build();
        drop(awareness);
        let task = monitor.spawn();
        begun.recv().await.expect("a check or a pass began");
        task.stop().await;
        drop(monitor);
        // What the abandoned check or pass held (the monitor, and through it the store, and
        // the store itself for 300 ms after its abort) is let go of by now: the caller can
        // close the store through its last handle. (What the mutations did: the checks were
        // aborted and not waited for, so `stop` returned while one still held the store,
        // review of stop 66, M526; `stop` aborted the pass without waiting for it, review of
        // stop 71, MG17.)
        assert_eq!(
            Arc::strong_count(&store),
            1,
            "what the stopped monitor ran still holds the store (watched: {watched})"
        );
    }
}

/// `stop` abandons a tick in progress: a check that hangs (bounded only by a provider timeout of
/// an hour) does not hold it. (What the mutation did: the tick in progress was no longer raced
/// against the stop, so `stop` waited for the hung check's timeout; review of stop 71, MG28.)
#[tokio::test(start_paused = true)]
async fn stop_abandons_a_tick_whose_check_hangs() {
    let w = world();
    w.adopt_remote("agent:main:remote", "begun").await;
    let (began, mut begun) = tokio::sync::mpsc::unbounded_channel();
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(Begun(began)))
        .config(gateway_adapter::MonitorConfig {
            first_tick: Duration::ZERO,
            provider_timeout: Duration::from_hours(1),
            ..gateway_adapter::MonitorConfig::default()
        })
        .build();
    let task = monitor.spawn();
    begun.recv().await.expect("a check began");
    // Paused time: this wait is over before the check's hour only if `stop` waits for it.
    tokio::time::timeout(Duration::from_mins(10), task.stop())
        .await
        .expect("stop abandons the tick in progress");
}

/// Holds the store until dropped, and takes 300 ms to drop (an aborted check whose end is slow).
struct SlowDrop(Arc<MemoryStore>);

impl Drop for SlowDrop {
    fn drop(&mut self) {
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            Arc::strong_count(&self.0) > 1,
            "the test holds the store too"
        );
    }
}

/// A provider whose check holds the store and never ends.
struct HoldsTheStore(Arc<MemoryStore>, tokio::sync::mpsc::UnboundedSender<()>);

#[async_trait]
impl UpstreamProvider for HoldsTheStore {
    fn kind(&self) -> &'static str {
        "begun"
    }

    async fn check(&self, _: &UpstreamLink, _: &[String]) -> CheckOutcome {
        let _held = SlowDrop(self.0.clone());
        let _ = self.1.send(());
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn several_agents_adopting_one_thread_are_each_recorded() {
    let w = world();
    let mut t = Transcript::new();
    // Two agents' own sessions, and the same bare key under two agents (scope "global").
    let a = w
        .adopt(&t, "agent:alpha:main", "alpha", "agent:alpha:lead")
        .await;
    let b = w
        .adopt(&t, "agent:beta:main", "beta", "agent:beta:lead")
        .await;
    let ga = SessionRef::parse("global", "alpha").unwrap();
    let gb = SessionRef::parse("global", "beta").unwrap();
    for (r, watcher) in [(&ga, "agent:alpha:lead"), (&gb, "agent:beta:lead")] {
        w.store
            .upsert_link(
                jsonl::adoption(r.clone(), &t.path, None).unwrap(),
                Timestamp::now(),
            )
            .await
            .unwrap();
        w.store
            .watch(&WatcherKey::parse(watcher).unwrap(), r, Timestamp::now())
            .await
            .unwrap();
    }
    let monitor = w.monitor().build();
    t.human("a person typed this once");
    let r = monitor.tick().await;
    assert_eq!(r.checked, 4);
    let mut sequences = Vec::new();
    for session in [&a, &b, &ga, &gb] {
        let events = w.events(session, EventKind::HumanDirectMessage).await;
        assert_eq!(events.len(), 1, "{session}");
        sequences.push(events[0].sequence);
    }
    sequences.sort();
    sequences.dedup();
    assert_eq!(
        sequences.len(),
        4,
        "four events, none deduplicated into another"
    );
    for lead in ["agent:alpha:lead", "agent:beta:lead"] {
        assert_eq!(
            w.queue.peek(&SessionKey::new(lead).unwrap()).len(),
            2,
            "{lead}"
        );
    }
}

/// Bug: when two agents adopted one thread, each session's check judged the rows only by its
/// own prompts and runs: a prompt one agent's gateway sent into the shared thread was a
/// person's turn for the other, whose watchers were told another actor changed it, at every
/// prompt. The prompts of every session linked to the same source are echoes for each (each
/// one's last 10), and a run in any of them defers them all (DESIGN 9.6).
#[tokio::test(start_paused = true)]
async fn a_prompt_one_adopter_sends_into_a_shared_thread_is_no_human_turn_for_the_other() {
    let w = world();
    let mut t = Transcript::new();
    let alpha = w
        .adopt(&t, "agent:alpha:main", "alpha", "agent:alpha:lead")
        .await;
    // Beta adopted the same file under another thread label, through another catalog: one
    // source all the same (a transcript is its path). (What the mutation did: a source named
    // by the link's catalog, so the two links were judged apart and alpha's prompt was a
    // person's turn for beta; review of stop 70, MB01.)
    let beta = SessionRef::parse("agent:beta:main", "beta").unwrap();
    let mut spec = jsonl::adoption(beta, &t.path, Some("beta's label")).unwrap();
    spec.catalog_id = "another-catalog".into();
    let beta = w.adopt_spec(spec, "agent:beta:lead").await;
    let prompts = Arc::new(RecentPrompts::new());
    let runs = Arc::new(RunTracker::new());
    let monitor = w
        .monitor()
        .own_prompts(prompts.clone())
        .run_activity(runs.clone())
        .build();
    let humans = |s: &SessionRef| {
        let s = s.clone();
        let w = &w;
        async move { w.events(&s, EventKind::HumanDirectMessage).await.len() }
    };
    // Ten prompts each, the echoed one the oldest of each: neither session's window pushes
    // the other's out.
    prompts.record(&alpha, "Deploy the fix");
    prompts.record(&beta, "Roll back the release");
    for i in 1..10 {
        prompts.record(&alpha, format!("alpha's prompt {i}"));
        prompts.record(&beta, format!("beta's prompt {i}"));
    }
    t.human("Deploy   the fix");
    t.human("Roll back\nthe release");
    let r = monitor.tick().await;
    assert_eq!(r.checked, 2);
    assert_eq!((humans(&alpha).await, humans(&beta).await), (0, 0));
    // A run of alpha's: beta's check waits too, the thread being written into by alpha.
    runs.started(&alpha);
    t.human("written by alpha's run");
    let r = monitor.tick().await;
    assert_eq!((r.checked, r.deferred), (0, 2));
    runs.finished(&alpha);
    prompts.record(&alpha, "written by alpha's run");
    // A person's turn is still one for both, and one turn: the run's own prompt, read with
    // it, is an echo for beta too (counted, it would make `{"turns": 2}`).
    t.human("a person typed this");
    monitor.tick().await;
    for s in [&alpha, &beta] {
        let events = w.events(s, EventKind::HumanDirectMessage).await;
        assert_eq!(events.len(), 1, "{s}");
        assert_eq!(events[0].payload, None, "{s}: one turn");
    }
}

/// A world with a new transcript adopted for agent:main:worker, watched by agent:main:main.
async fn worker_adopted() -> (World, Transcript, SessionRef) {
    let w = world();
    let t = Transcript::new();
    let session = w
        .adopt(&t, "agent:main:worker", "main", "agent:main:main")
        .await;
    (w, t, session)
}

/// `t` adopted by agent:alpha:main and agent:beta:main, each watched by its agent's lead.
async fn alpha_and_beta(w: &World, t: &Transcript) -> (SessionRef, SessionRef) {
    let alpha = w
        .adopt(t, "agent:alpha:main", "alpha", "agent:alpha:lead")
        .await;
    let beta = w
        .adopt(t, "agent:beta:main", "beta", "agent:beta:lead")
        .await;
    (alpha, beta)
}

/// [`alpha_and_beta`] on a new transcript into which a person has typed, and a monitor whose
/// run activity is the tracker returned, where nothing runs yet.
async fn alpha_and_beta_with_runs(
    w: &World,
) -> (
    Transcript,
    SessionRef,
    SessionRef,
    Arc<RunTracker>,
    UpstreamMonitor,
) {
    let mut t = Transcript::new();
    let (alpha, beta) = alpha_and_beta(w, &t).await;
    let runs = Arc::new(RunTracker::new());
    let monitor = w.monitor().run_activity(runs.clone()).build();
    t.human("a person typed this");
    (t, alpha, beta, runs, monitor)
}

/// A run in one of the sessions linked to a thread defers the others' checks, but not for
/// good: two agents answering each other in one thread, one of them running at every tick,
/// kept a person's turn from ever being told to either's watchers. After five ticks deferred by
/// the other's runs, a session is deferred only by its own.
#[tokio::test(start_paused = true)]
async fn a_session_deferred_at_every_tick_by_a_linked_sessions_run_is_checked_after_five() {
    let w = world();
    let (_t, alpha, beta, runs, monitor) = alpha_and_beta_with_runs(&w).await;
    runs.started(&alpha);
    // Beta checked after five deferrals, alpha still running.
    deferred_five_times_then_checked_alone(&w, &monitor, &beta).await;
    assert_eq!(w.human_events(&alpha).await, 0);
}

/// Only deferrals by another linked session's run count towards checking a session alone:
/// a session whose own run lasted five ticks was then checked at once while the other
/// session's run began, with no deferral by it at all.
#[tokio::test(start_paused = true)]
async fn a_sessions_own_runs_do_not_count_towards_checking_it_alone() {
    let w = world();
    let (_t, alpha, beta, runs, monitor) = alpha_and_beta_with_runs(&w).await;
    runs.started(&alpha);
    deferring_both(&monitor, 5, "alpha running").await;
    // Alpha's run ends as beta's begins. Alpha was deferred by its own run only, so beta's
    // run defers it now (five times before it is checked alone); beta is checked alone, but
    // its own run defers it.
    runs.finished(&alpha);
    runs.started(&beta);
    deferred_five_times_then_checked_alone(&w, &monitor, &alpha).await;
    assert_eq!(w.human_events(&beta).await, 0);
}

/// `ticks` ticks of `monitor`, at each of which both of two linked sessions are deferred and
/// neither is checked; `when` names the ticks in a failure.
async fn deferring_both(monitor: &UpstreamMonitor, ticks: usize, when: &str) {
    for tick in 1..=ticks {
        let r = monitor.tick().await;
        assert_eq!(
            (r.checked, r.deferred),
            (0, 2),
            "{when}: tick {tick} of {ticks} deferred both"
        );
    }
}

/// Five ticks at which both linked sessions are deferred (`alone` by the other's run), then
/// one at which `alone` is checked by itself and its turn recorded.
async fn deferred_five_times_then_checked_alone(
    w: &World,
    monitor: &UpstreamMonitor,
    alone: &SessionRef,
) {
    deferring_both(monitor, 5, "the other running").await;
    assert_eq!(
        w.human_events(alone).await,
        0,
        "{alone}, not checked while deferred"
    );
    let r = monitor.tick().await;
    assert_eq!((r.checked, r.deferred), (1, 1), "{alone}, checked alone");
    assert_eq!(w.human_events(alone).await, 1);
}

/// A session whose own run defers its check counts nothing towards being checked alone, even
/// while another linked session runs too: which of the two runs was asked about first followed
/// the order of the links, which turns at every tick.
#[tokio::test(start_paused = true)]
async fn a_tick_both_sessions_run_in_counts_for_neither() {
    let w = world();
    let (_t, alpha, beta, runs, monitor) = alpha_and_beta_with_runs(&w).await;
    runs.started(&alpha);
    runs.started(&beta);
    deferring_both(&monitor, 5, "both running").await;
    // Only beta runs now: alpha is deferred by it five times before it is checked alone.
    runs.finished(&alpha);
    deferred_five_times_then_checked_alone(&w, &monitor, &alpha).await;
}

/// Links of two kinds whose providers name the same source key (the default one: the host and
/// thread ids) read two sources: a run in the session of one does not defer the check of the
/// other. (What the mutation did: a source was named by its key alone, whatever the provider, so
/// a run in a session adopted through one kind deferred a session adopted through another kind
/// whose thread had the same ids; review of stop 71, MG16.)
#[tokio::test]
async fn links_of_two_kinds_with_one_source_key_are_two_sources() {
    let w = world();
    let alpha = w.adopt_remote("agent:main:alpha", "scripted").await;
    w.adopt_remote("agent:main:beta", "broken").await;
    let runs = Arc::new(RunTracker::new());
    runs.started(&alpha);
    let monitor = w
        .monitor()
        .provider(Arc::new(Scripted::new(vec![])))
        .provider(Arc::new(Broken))
        .run_activity(runs.clone())
        .build();
    let r = monitor.tick().await;
    assert_eq!(
        (r.deferred, r.checked),
        (1, 1),
        "only alpha's check waits for its run; beta's source is another: {r:?}"
    );
}

/// A check that fails still went through (it was not deferred): it starts the count of
/// deferrals by linked runs again, so a later run in a linked session defers the session five
/// times more before it is checked alone. (What the mutation did: a failed check kept the count,
/// so the session was checked alone, in spite of a linked session's run, at the second deferral
/// after it; review of stop 71, MG25.)
#[tokio::test]
async fn a_failed_check_starts_the_count_of_deferrals_by_linked_runs_again() {
    let w = world();
    w.adopt_remote("agent:main:alpha", "broken").await;
    let beta = w.adopt_remote("agent:main:beta", "broken").await;
    let runs = Arc::new(RunTracker::new());
    let monitor = w
        .monitor()
        .provider(Arc::new(Broken))
        .run_activity(runs.clone())
        .build();
    runs.started(&beta);
    deferring_both(&monitor, 4, "beta runs").await;
    runs.finished(&beta);
    let r = monitor.tick().await;
    assert_eq!(
        (r.checked, r.deferred),
        (2, 0),
        "both checked, both failed: {r:?}"
    );
    runs.started(&beta);
    deferring_both(
        &monitor,
        2,
        "alpha's count started again at its failed check",
    )
    .await;
}

/// Two sessions linked to one thread running by turns, one tick each: each is deferred by the
/// other's run at every other tick, and by its own between. Its own runs do not start the count
/// again (they would reset it every other tick, and neither would ever be checked): each is
/// checked once the other's runs deferred it five times.
#[tokio::test(start_paused = true)]
async fn sessions_running_by_turns_in_one_thread_are_each_checked() {
    let w = world();
    let (_t, alpha, beta, runs, monitor) = alpha_and_beta_with_runs(&w).await;
    let mut running = alpha.clone();
    runs.started(&running);
    for _ in 0..14 {
        monitor.tick().await;
        runs.finished(&running);
        running = if running == alpha {
            beta.clone()
        } else {
            alpha.clone()
        };
        runs.started(&running);
    }
    assert_eq!(w.human_events(&alpha).await, 1, "alpha checked");
    assert_eq!(w.human_events(&beta).await, 1, "beta checked");
}

/// A gateway's run activity and own prompts (those `recent` holds), each of which panics when
/// asked about one session while told to (`runs`, `prompts`): a host whose store breaks on one
/// agent's key.
struct PanicsFor {
    session: SessionRef,
    runs: AtomicBool,
    prompts: AtomicBool,
    recent: RecentPrompts,
}

impl PanicsFor {
    fn new(session: &SessionRef) -> Self {
        Self {
            session: session.clone(),
            runs: AtomicBool::new(false),
            prompts: AtomicBool::new(false),
            recent: RecentPrompts::new(),
        }
    }

    fn ask(&self, port: &AtomicBool, session: &SessionRef, store: &str) {
        assert!(
            !port.load(Ordering::SeqCst) || *session != self.session,
            "the gateway's {store} panicked on {session}"
        );
    }
}

impl gateway_adapter::upstream::RunActivity for PanicsFor {
    fn is_active(&self, session: &SessionRef) -> bool {
        self.ask(&self.runs, session, "run tracker");
        false
    }
}

impl OwnPrompts for PanicsFor {
    fn recent(&self, session: &SessionRef) -> Vec<String> {
        self.ask(&self.prompts, session, "prompt store");
        self.recent.recent(session)
    }
}

/// Bug: sessions linked to one thread were judged together, their ports asked inside one
/// `catch_unwind`: a prompts port that panicked for one of them failed the checks of all, at
/// every tick, and a person's turn was never told to the others' watchers again. Now only that
/// session's check fails; the others' go on without its prompts, warned of once until it
/// answers again.
#[tokio::test(start_paused = true)]
async fn a_prompts_port_panicking_for_one_linked_session_does_not_stop_the_others_checks() {
    one_linked_sessions_port_panics(|p| &p.prompts, "own prompts panicked for a session linked")
        .await;
}

/// As above, with the run activity panicking for one of the sessions: it is taken as not
/// running for the others' checks.
#[tokio::test(start_paused = true)]
async fn a_run_port_panicking_for_one_linked_session_does_not_stop_the_others_checks() {
    one_linked_sessions_port_panics(|p| &p.runs, "run activity panicked for a session linked")
        .await;
}

/// Alpha and beta adopt one thread, and the port `panicking` picks panics for beta: beta's
/// check fails, alpha's detects a person's turn at every tick (its own prompt's echo still
/// none), and the `warning` naming both sessions and the panic is logged once, and once again
/// after the port answered for a tick.
async fn one_linked_sessions_port_panics(panicking: fn(&PanicsFor) -> &AtomicBool, warning: &str) {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let w = world();
    let mut t = Transcript::new();
    let (alpha, beta) = alpha_and_beta(&w, &t).await;
    let ports = Arc::new(PanicsFor::new(&beta));
    panicking(&ports).store(true, Ordering::SeqCst);
    let monitor = w
        .monitor()
        .run_activity(ports.clone())
        .own_prompts(ports.clone())
        .build();
    let mut rx = monitor.subscribe();
    ports.recent.record(&alpha, "Deploy the fix");
    t.human("Deploy   the fix");
    t.human("a person typed this");
    let r = monitor.tick().await;
    assert_eq!(w.human_events(&alpha).await, 1, "alpha's check goes on");
    let events = w.events(&alpha, EventKind::HumanDirectMessage).await;
    assert_eq!(events[0].payload, None, "one turn: alpha's echo is none");
    assert_eq!(r.checked, 1);
    assert_eq!(
        failed_sessions(&mut rx),
        [(
            beta.clone(),
            "the gateway's run activity or own prompts panicked".to_owned()
        )],
        "beta's check fails, and only it"
    );
    for _ in 0..3 {
        monitor.tick().await;
    }
    t.human("typed again");
    monitor.tick().await;
    assert_eq!(w.human_events(&alpha).await, 2, "at every tick");
    assert_eq!(w.human_events(&beta).await, 0);
    // The port answers for beta for a tick: beta's check goes through (alpha's prompt an echo
    // for it too), then the port panics again.
    panicking(&ports).store(false, Ordering::SeqCst);
    monitor.tick().await;
    let events = w.events(&beta, EventKind::HumanDirectMessage).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].payload.as_ref().unwrap()["turns"], json!(2));
    panicking(&ports).store(true, Ordering::SeqCst);
    monitor.tick().await;
    let lines = capture.lines();
    let warned: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains(warning) && l.ends_with("level=WARN"))
        .collect();
    assert_eq!(
        warned.len(),
        2,
        "once, and once again after it answered: {lines:#?}"
    );
    for line in warned {
        for said in [
            "session_key=agent:alpha:main",
            "linked_session_key=agent:beta:main",
            "panic=the gateway's",
        ] {
            assert!(line.contains(said), "{said} in {line}");
        }
    }
    let answered = lines
        .iter()
        .filter(|l| l.contains("port answers again"))
        .count();
    assert_eq!(answered, 1, "{lines:#?}");
}

/// A gateway's run activity that panics when asked about the checked session itself fails
/// that session's check, and is logged like every other failure of a tick: a `warn!` naming
/// the session and the panic once, `debug!` while it repeats, `info!` once the port answers
/// again. Only `Detection::Failed` said it; nothing was logged (review).
#[tokio::test(start_paused = true)]
async fn a_checked_sessions_own_port_panicking_is_logged() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let (w, _t, session) = worker_adopted().await;
    let ports = Arc::new(PanicsFor::new(&session));
    ports.runs.store(true, Ordering::SeqCst);
    let monitor = w.monitor().run_activity(ports.clone()).build();
    let mut rx = monitor.subscribe();
    for _ in 0..3 {
        assert_eq!(monitor.tick().await.checked, 0);
        assert_eq!(
            failed_sessions(&mut rx),
            [(
                session.clone(),
                "the gateway's run activity or own prompts panicked".to_owned()
            )]
        );
    }
    ports.runs.store(false, Ordering::SeqCst);
    assert_eq!(monitor.tick().await.checked, 1);
    let lines = capture.lines();
    let levels: Vec<&str> = lines
        .iter()
        .filter(|l| l.contains("panicked when asked about the checked session"))
        .map(|l| l.rsplit("level=").next().unwrap_or_default())
        .collect();
    assert_eq!(
        levels,
        ["WARN", "DEBUG", "DEBUG"],
        "warned of once while it repeats: {lines:#?}"
    );
    assert_eq!(
        capture.said(&[
            "session_key=agent:main:worker",
            "panic=the gateway's run tracker panicked on agent:main:worker",
            "level=WARN",
        ]),
        1,
        "{lines:#?}"
    );
    assert_eq!(
        capture.said(&["answer again for the checked session", "level=INFO"]),
        1,
        "{lines:#?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_deleted_transcript_is_missing_three_times_then_upstream_missing() {
    let (w, t, session) = worker_adopted().await;
    let monitor = w.monitor().build();
    let mut rx = monitor.subscribe();
    let task = monitor.spawn();
    std::fs::remove_file(&t.path).unwrap();
    let started = Instant::now();
    for n in 1..=2 {
        let c = next(&mut rx, |d| match d {
            Detection::Missing { consecutive, .. } => Some(*consecutive),
            _ => None,
        })
        .await;
        assert_eq!(c, n);
    }
    let (event, removed) = next(&mut rx, |d| match d {
        Detection::UpstreamMissing {
            event,
            link_removed,
            ..
        } => Some((event.clone(), *link_removed)),
        _ => None,
    })
    .await;
    assert_eq!(started.elapsed(), Duration::from_secs(15 + 60 + 60));
    assert!(removed);
    assert_eq!(event.kind, EventKind::UpstreamMissing);
    assert_eq!(event.summary, "upstream missing via claude-code");
    assert_eq!(
        event.payload.as_ref().unwrap()["channel"],
        json!("claude-code")
    );
    assert!(
        w.store.link(&session).await.unwrap().is_none(),
        "the link is removed"
    );
    assert_eq!(
        w.queue
            .peek(&SessionKey::new("agent:main:main").unwrap())
            .len(),
        1
    );
    // The next tick has no link left; exactly one upstream_missing was recorded.
    assert_eq!(
        next_tick(&mut rx).await.links,
        1,
        "the tick that removed it"
    );
    assert_eq!(next_tick(&mut rx).await.links, 0);
    task.stop().await;
    assert_eq!(
        w.events(&session, EventKind::UpstreamMissing).await.len(),
        1
    );

    // Continuing the session from the catalog again creates a fresh link.
    File::create(&t.path).unwrap();
    let fresh = w
        .svc
        .try_adopt(jsonl::adoption(session.clone(), &t.path, None).unwrap())
        .await
        .unwrap();
    assert!(fresh.created);
}

/// The `UpstreamMissing` detection names the catalog the link was adopted through, as its
/// event's summary and channel do (`monitor` prints it). (What the mutation did: it named the
/// link's upstream kind instead; review of stop 68, MN40.)
#[tokio::test(start_paused = true)]
async fn upstream_missing_is_published_with_the_links_catalog() {
    let (w, t, _session) = worker_adopted().await;
    let monitor = w.monitor().build();
    let mut rx = monitor.subscribe();
    std::fs::remove_file(&t.path).unwrap();
    for _ in 0..3 {
        monitor.tick().await;
    }
    let catalog = next(&mut rx, |d| match d {
        Detection::UpstreamMissing { catalog_id, .. } => Some(catalog_id.clone()),
        _ => None,
    })
    .await;
    assert_eq!(catalog, "claude-code", "the link's catalog");
}

/// The `upstream_missing` dedupe key names the link it was recorded for (its `created_at`):
/// a session adopted again after its source went missing is reported missing again when the
/// new source goes too, and its watcher is told again. (Found by a review: with a key made of
/// the session and the source alone, the second event is taken for a retry of the first:
/// nothing is recorded and the watcher is not told.)
#[tokio::test(start_paused = true)]
async fn a_session_adopted_again_is_reported_upstream_missing_again() {
    // The service's clock is moved on by hand with the paused time, so the two links are
    // created at distinct milliseconds however fast the test runs.
    let clock = Arc::new(ManualClock::new(Timestamp::now()));
    let store = Arc::new(MemoryStore::new());
    let queue = Arc::new(InMemoryQueue::new());
    let wake = Arc::new(RecordingWake::new());
    let svc = Arc::new(
        Awareness::builder(
            store.clone(),
            queue.clone(),
            wake.clone(),
            Arc::new(InMemoryDirectory::new()),
        )
        .upstream(store.clone())
        .clock(clock.clone())
        .build(),
    );
    let w = World {
        store,
        queue,
        wake,
        svc,
    };
    let watcher = SessionKey::new("agent:main:main").unwrap();
    let t = Transcript::new();
    let session = w
        .adopt(&t, "agent:main:worker", "main", "agent:main:main")
        .await;
    let monitor = w.monitor().build();
    let mut rx = monitor.subscribe();
    let task = monitor.spawn();
    let mut links = Vec::new();
    let mut events = Vec::new();
    for round in 1..=2 {
        links.push(w.store.link(&session).await.unwrap().expect("a link"));
        std::fs::remove_file(&t.path).unwrap();
        // The three checks take 2 min 15 s.
        clock.advance(135_000);
        for n in 1..=2 {
            let c = next(&mut rx, |d| match d {
                Detection::Missing { consecutive, .. } => Some(*consecutive),
                _ => None,
            })
            .await;
            assert_eq!(c, n, "round {round}");
        }
        let (event, removed) = next(&mut rx, |d| match d {
            Detection::UpstreamMissing {
                event,
                link_removed,
                ..
            } => Some((event.clone(), *link_removed)),
            _ => None,
        })
        .await;
        assert!(removed, "round {round}: the link is removed");
        assert!(w.store.link(&session).await.unwrap().is_none());
        let recorded = w.events(&session, EventKind::UpstreamMissing).await;
        assert_eq!(
            recorded.len(),
            round,
            "round {round}: one upstream_missing per link, none taken for a retry of \
             another's: {recorded:#?}"
        );
        assert_eq!(recorded.last().unwrap().sequence, event.sequence);
        // The watcher is told (and acknowledges, so that the next notice is seen).
        let told = w.svc.drain_turn(&watcher).await;
        assert!(
            told.len() == 1 && told[0].text.contains("\"agent:main:worker\" changed"),
            "round {round}: the watcher is told: {told:#?}"
        );
        events.push(event);
        if round == 1 {
            // Continuing the session from the catalog again creates a fresh link.
            File::create(&t.path).unwrap();
            let fresh = w
                .svc
                .try_adopt(jsonl::adoption(session.clone(), &t.path, None).unwrap())
                .await
                .unwrap();
            assert!(fresh.created);
            assert!(
                w.queue.peek(&watcher).is_empty(),
                "nothing queued: a notice next round is the new event's"
            );
        }
    }
    task.stop().await;
    assert_ne!(links[0].created_at, links[1].created_at, "two links");
    assert_ne!(events[0].sequence, events[1].sequence, "two events");
    assert_ne!(events[0].dedupe_key, events[1].dedupe_key);
}

/// Bug: the prompts kept for self-echo were forgotten only when the gateway said so, not when
/// the monitor removed a link whose source stayed gone, so they stayed for every session ever
/// adopted.
#[tokio::test]
async fn removing_a_link_forgets_its_own_prompts() {
    let w = world();
    let t = Transcript::new();
    let gone = w
        .adopt(&t, "agent:main:worker", "main", "agent:main:main")
        .await;
    let other = Transcript::new();
    let kept = w
        .adopt(&other, "agent:main:other", "main", "agent:main:main")
        .await;
    let prompts = Arc::new(RecentPrompts::new());
    prompts.record(&gone, "run the tests");
    prompts.record(&kept, "fix the build");
    let monitor = w
        .monitor()
        .own_prompts(prompts.clone())
        .config(gateway_adapter::MonitorConfig {
            missing_checks: 1,
            ..gateway_adapter::MonitorConfig::default()
        })
        .build();
    let mut rx = monitor.subscribe();
    std::fs::remove_file(&t.path).unwrap();
    monitor.tick().await;
    assert!(
        published(&mut rx).iter().any(|d| matches!(
            d,
            Detection::UpstreamMissing {
                link_removed: true,
                ..
            }
        )),
        "the link is removed"
    );
    assert_eq!(
        prompts.recent(&gone),
        Vec::<String>::new(),
        "the removed link's prompts are forgotten"
    );
    assert_eq!(prompts.recent(&kept), vec!["fix the build".to_owned()]);
}

/// Bug: the prompts kept for self-echo were forgotten only when the monitor itself removed a
/// link, so a link removed otherwise (its session deleted through the gateway, the link
/// removed by another process) left its session's prompts in memory for good. A link listed
/// at one tick and gone at the next takes them with it; a link still listed keeps its own.
#[tokio::test]
async fn a_link_removed_by_anyone_forgets_its_own_prompts() {
    let w = world();
    let (t1, t2, t3) = (Transcript::new(), Transcript::new(), Transcript::new());
    let deleted = w
        .adopt(&t1, "agent:main:worker", "main", "agent:main:main")
        .await;
    let removed = w
        .adopt(&t2, "agent:main:other", "main", "agent:main:main")
        .await;
    let kept = w
        .adopt(&t3, "agent:main:third", "main", "agent:main:main")
        .await;
    let prompts = Arc::new(RecentPrompts::new());
    for s in [&deleted, &removed, &kept] {
        prompts.record(s, "run the tests");
    }
    let monitor = w.monitor().own_prompts(prompts.clone()).build();
    monitor.tick().await;
    w.svc.on_delete(&deleted).await;
    assert!(w.store.remove_link(&removed, None).await.unwrap());
    assert_eq!(
        prompts.recent(&deleted),
        vec!["run the tests".to_owned()],
        "nothing is forgotten before the monitor looks"
    );
    monitor.tick().await;
    for s in [&deleted, &removed] {
        assert_eq!(
            prompts.recent(s),
            Vec::<String>::new(),
            "{s}: the gone link's prompts are forgotten"
        );
    }
    assert_eq!(prompts.recent(&kept), vec!["run the tests".to_owned()]);
    // A session that gets a link again and loses it again is forgotten again.
    let again = w
        .adopt(&t2, "agent:main:other", "main", "agent:main:main")
        .await;
    prompts.record(&again, "fix the build");
    monitor.tick().await;
    assert!(w.store.remove_link(&again, None).await.unwrap());
    monitor.tick().await;
    assert_eq!(prompts.recent(&again), Vec::<String>::new());
}

/// A link removal the store makes but answers too late (after `store_wait`) is taken for a
/// failure (`link_removed: false`); the next tick finds the link gone and forgets its prompts
/// then, as a removal answered in time does. They stayed for good.
#[tokio::test(start_paused = true)]
async fn a_link_removed_after_the_wait_still_forgets_its_prompts() {
    let w = world();
    let t = Transcript::new();
    let gone = w
        .adopt(&t, "agent:main:worker", "main", "agent:main:main")
        .await;
    let prompts = Arc::new(RecentPrompts::new());
    prompts.record(&gone, "run the tests");
    let late = Arc::new(Flaky {
        hang_removes: std::sync::atomic::AtomicBool::new(true),
        ..Flaky::over(&w.store)
    });
    let monitor = UpstreamMonitor::builder(w.svc.clone(), late)
        .provider(Arc::new(JsonlProvider::new()))
        .own_prompts(prompts.clone())
        .config(gateway_adapter::MonitorConfig {
            missing_checks: 1,
            ..gateway_adapter::MonitorConfig::default()
        })
        .build();
    let mut rx = monitor.subscribe();
    std::fs::remove_file(&t.path).unwrap();
    tokio::time::timeout(std::time::Duration::from_hours(1), monitor.tick())
        .await
        .expect("the tick ends");
    assert!(
        published(&mut rx).iter().any(|d| matches!(
            d,
            Detection::UpstreamMissing {
                link_removed: false,
                ..
            }
        )),
        "the removal was not answered in time"
    );
    assert!(
        w.store.link(&gone).await.unwrap().is_none(),
        "but it was made"
    );
    monitor.tick().await;
    assert_eq!(
        prompts.recent(&gone),
        Vec::<String>::new(),
        "the prompts go with the link"
    );
}

/// Delays every cursor read by `delay` while it is set (`Duration::MAX`: hangs it, a store
/// that stopped answering them).
struct SlowCursors {
    delay: Mutex<Option<Duration>>,
}

#[async_trait]
impl awareness_core::testkit::hooked::Hook for SlowCursors {
    async fn before(
        &self,
        call: awareness_core::testkit::hooked::Call,
        _: &dyn awareness_core::AwarenessStore,
    ) {
        if call != awareness_core::testkit::hooked::Call::Cursors {
            return;
        }
        let delay = *self.delay.lock().unwrap();
        match delay {
            None => {}
            Some(Duration::MAX) => std::future::pending::<()>().await,
            Some(d) => tokio::time::sleep(d).await,
        }
    }
}

/// The failures one tick published: each one's session and error.
fn failed_sessions(rx: &mut broadcast::Receiver<Detection>) -> Vec<(SessionRef, String)> {
    published(rx)
        .into_iter()
        .filter_map(|d| match d {
            Detection::Failed { session, error } => Some((session, error)),
            _ => None,
        })
        .collect()
}

/// A link no provider reads is counted as such even once the store's wait for the tick is over:
/// only asking whether a session is watched needs the store, and that link is never asked.
/// (What the mutation did: once the wait was over every link left was said as not checked,
/// those no provider reads included, which the tick then did not count; review of stop 70, MB25.)
#[tokio::test(start_paused = true)]
async fn a_link_no_provider_reads_is_counted_after_the_stores_wait_is_over() {
    let (World { store, svc, .. }, hooked) = common::hooked_world(SlowCursors {
        delay: Mutex::new(None),
    });
    let mut transcripts = Vec::new();
    for key in ["agent:main:a", "agent:main:b"] {
        let t = Transcript::new();
        let session = SessionRef::parse(key, "main").unwrap();
        let spec = jsonl::adoption(session, &t.path, None).unwrap();
        assert!(svc.try_adopt(spec).await.unwrap().created);
        transcripts.push(t);
    }
    let odd = SessionRef::parse("agent:main:odd", "main").unwrap();
    let spec = LinkSpec::new(odd, "remote", "h", "t", "no-such-kind");
    assert!(svc.try_adopt(spec).await.unwrap().created);
    let monitor = UpstreamMonitor::builder(svc.clone(), store.clone())
        .provider(Arc::new(JsonlProvider::new()))
        .build();
    *hooked.hook.delay.lock().unwrap() = Some(Duration::MAX);
    // Three ticks: the links turn, so the one no provider reads comes after the wait is over.
    for tick in 1..=3 {
        let report = monitor.tick().await;
        assert_eq!(
            (report.links, report.no_provider),
            (3, 1),
            "tick {tick}: the link no provider reads is counted"
        );
    }
}

/// Bug: a store that stopped answering held a tick for `store_wait` (10 s) per link, one link
/// after the other, while the monitor asked whether each session was watched: 1,000 s for 100
/// links, with every link's turns waiting. Now the asking shares one `store_wait` per tick:
/// the links not asked when it is over are said as not checked, and the next tick asks again,
/// starting one link further on, so that a store too slow for them all leaves out other links
/// each time.
#[tokio::test(start_paused = true)]
async fn a_store_that_does_not_answer_costs_a_tick_one_wait() {
    let (World { store, svc, .. }, hooked) = common::hooked_world(SlowCursors {
        delay: Mutex::new(None),
    });
    let mut transcripts = Vec::new();
    let mut sessions = Vec::new();
    for key in ["agent:main:a", "agent:main:b", "agent:main:c"] {
        let t = Transcript::new();
        let session = SessionRef::parse(key, "main").unwrap();
        let spec = jsonl::adoption(session.clone(), &t.path, None).unwrap();
        assert!(svc.try_adopt(spec).await.unwrap().created);
        store
            .watch(
                &WatcherKey::parse("agent:main:main").unwrap(),
                &session,
                Timestamp::now(),
            )
            .await
            .unwrap();
        transcripts.push(t);
        sessions.push(session);
    }
    let monitor = UpstreamMonitor::builder(svc.clone(), store.clone())
        .provider(Arc::new(JsonlProvider::new()))
        .build();
    let mut rx = monitor.subscribe();

    // A store that does not answer: one wait, every link said as failed.
    *hooked.hook.delay.lock().unwrap() = Some(Duration::MAX);
    let started = Instant::now();
    let report = monitor.tick().await;
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(10),
        "one store_wait, not one per link"
    );
    assert_eq!(report.checked, 0);
    let failed = failed_sessions(&mut rx);
    assert_eq!(failed.len(), 3, "{failed:?}");
    assert!(
        failed[0].1.contains("cannot read its watchers"),
        "{failed:?}"
    );
    assert!(
        failed[1..]
            .iter()
            .all(|f| f.1.contains("the store's wait for this tick was over")),
        "{failed:?}"
    );

    // A store that answers in 6 s: one link asked a tick, another each tick.
    *hooked.hook.delay.lock().unwrap() = Some(Duration::from_secs(6));
    let mut checked = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let report = monitor.tick().await;
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert_eq!(report.checked, 1);
        let failed: Vec<SessionRef> = failed_sessions(&mut rx).into_iter().map(|f| f.0).collect();
        assert_eq!(failed.len(), 2, "{failed:?}");
        let asked: Vec<&SessionRef> = sessions.iter().filter(|s| !failed.contains(s)).collect();
        assert_eq!(asked.len(), 1);
        checked.push(asked[0].clone());
    }
    checked.sort_by(|a, b| a.session_key.cmp(&b.session_key));
    checked.dedup();
    assert_eq!(checked, sessions, "each link checked in one of three ticks");

    *hooked.hook.delay.lock().unwrap() = None;
    assert_eq!(
        monitor.tick().await.checked,
        3,
        "the next tick asks them all"
    );
}

/// The gateway's own prompts, whose `forget` panics.
struct ForgetPanics;

impl OwnPrompts for ForgetPanics {
    fn recent(&self, _: &SessionRef) -> Vec<String> {
        Vec::new()
    }

    fn forget(&self, _: &SessionRef) {
        panic!("the gateway's prompt store panicked");
    }
}

/// Bug: an own-prompts port whose `forget` panicked took the monitor down with it: in a tick
/// (a link found gone after a late removal) the panic ended the tick, and with it the monitor's
/// task for every link; in a check (a removal answered in time) it hid the removal's
/// detection behind a failed check. Now the panic is logged and the monitor goes on.
#[tokio::test(start_paused = true)]
async fn an_own_prompts_port_that_panics_in_forget_stops_nothing() {
    let capture = common::Capture::default();
    let _guard = capture.install();
    let w = world();
    let t = Transcript::new();
    w.adopt(&t, "agent:main:worker", "main", "agent:main:main")
        .await;
    let late = Transcript::new();
    let late_ref = w
        .adopt(&late, "agent:main:late", "main", "agent:main:main")
        .await;
    let mut live = Transcript::new();
    let live_ref = w
        .adopt(&live, "agent:main:live", "main", "agent:main:main")
        .await;
    let store = Arc::new(Flaky::over(&w.store));
    let monitor = UpstreamMonitor::builder(w.svc.clone(), store.clone())
        .provider(Arc::new(JsonlProvider::new()))
        .own_prompts(Arc::new(ForgetPanics))
        .config(gateway_adapter::MonitorConfig {
            missing_checks: 1,
            ..gateway_adapter::MonitorConfig::default()
        })
        .build();
    let mut rx = monitor.subscribe();

    // A removal answered in time: `forget` in the check.
    std::fs::remove_file(&t.path).unwrap();
    monitor.tick().await;
    let first = published(&mut rx);
    assert!(
        first.iter().any(|d| matches!(
            d,
            Detection::UpstreamMissing {
                link_removed: true,
                ..
            }
        )),
        "the removal is said: {first:?}"
    );
    assert!(
        !first.iter().any(|d| matches!(d, Detection::Failed { .. })),
        "and no check failed: {first:?}"
    );

    // A removal answered too late: `forget` in the next tick, with the monitor running.
    store.hang_removes.store(true, Ordering::SeqCst);
    std::fs::remove_file(&late.path).unwrap();
    let task = monitor.spawn();
    let mut ticks = 0;
    next(&mut rx, |d| match d {
        Detection::UpstreamMissing {
            session,
            link_removed,
            ..
        } => {
            assert_eq!(session, &late_ref);
            assert!(!link_removed, "not answered in time");
            None
        }
        Detection::TickDone(_) => {
            ticks += 1;
            (ticks == 3).then_some(())
        }
        _ => None,
    })
    .await;
    assert!(w.store.link(&late_ref).await.unwrap().is_none());
    // The monitor still checks the links it has.
    live.human("still there?");
    let turns = next(&mut rx, |d| match d {
        Detection::HumanTurns { session, turns, .. } => {
            assert_eq!(session, &live_ref);
            Some(*turns)
        }
        _ => None,
    })
    .await;
    assert_eq!(turns, 1);
    assert!(!task.is_finished(), "the monitor's task runs on");
    task.stop().await;
    let warned = capture
        .lines()
        .into_iter()
        .filter(|l| l.contains("panicked while forgetting"))
        .count();
    assert_eq!(
        warned,
        2,
        "each panic is logged once: {:?}",
        capture.lines()
    );
}

/// Finds one human turn, after removing every watch of the session it checks (as a watcher
/// that unwatches while the check runs).
struct UnwatchDuringCheck(Arc<MemoryStore>);

#[async_trait]
impl UpstreamProvider for UnwatchDuringCheck {
    fn kind(&self) -> &'static str {
        "unwatch"
    }

    async fn check(&self, link: &UpstreamLink, _: &[String]) -> CheckOutcome {
        let watcher = WatcherKey::parse("agent:main:main").unwrap();
        self.0
            .unwatch(&watcher, &link.session.session_key)
            .await
            .unwrap();
        CheckOutcome::HumanTurns {
            turns: 1,
            dedupe_id: "turn-1".into(),
            source_id: "h/t".into(),
            marker: json!({"after": "turn-1"}),
        }
    }
}

/// Bug: human turns found in a session whose watch went during the check were not recorded,
/// and the monitor published only "the human turns were not recorded", relying on a log of the
/// service that was never written (an unwatched session is not a failure there).
#[tokio::test]
async fn turns_not_recorded_because_nothing_watches_any_more_say_so() {
    let w = world();
    w.adopt_remote("agent:main:remote", "unwatch").await;
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(UnwatchDuringCheck(w.store.clone())))
        .build();
    let mut rx = monitor.subscribe();
    monitor.tick().await;
    let failed: Vec<String> = published(&mut rx)
        .iter()
        .filter(|d| matches!(d, Detection::Failed { .. }))
        .map(ToString::to_string)
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        failed[0].contains("nothing watches the session any more"),
        "{failed:?}"
    );
}

/// Finds one human turn; on its first check, the gateway starts a run in the session, or sends
/// it a prompt, while the check reads.
struct GatewayActsDuringCheck {
    runs: Arc<RunTracker>,
    prompts: Arc<RecentPrompts>,
    prompt: bool,
    checks: AtomicUsize,
}

#[async_trait]
impl UpstreamProvider for GatewayActsDuringCheck {
    fn kind(&self) -> &'static str {
        "acts"
    }

    async fn check(&self, link: &UpstreamLink, _: &[String]) -> CheckOutcome {
        if self.checks.fetch_add(1, Ordering::SeqCst) == 0 {
            if self.prompt {
                self.prompts.record(&link.session, "deploy the fix");
            } else {
                self.runs.started(&link.session);
            }
        }
        CheckOutcome::HumanTurns {
            turns: 1,
            dedupe_id: "turn-1".into(),
            source_id: "h/t".into(),
            marker: json!({"after": "turn-1"}),
        }
    }
}

/// A provider of kind `run-begins` whose first check starts a run of the gateway in `other`
/// (another session linked to the same thread), then finds a human turn.
struct RunBeginsIn {
    runs: Arc<RunTracker>,
    other: SessionRef,
    started: AtomicBool,
}

#[async_trait]
impl UpstreamProvider for RunBeginsIn {
    fn kind(&self) -> &'static str {
        "run-begins"
    }

    async fn check(&self, _: &UpstreamLink, _: &[String]) -> CheckOutcome {
        if !self.started.swap(true, Ordering::SeqCst) {
            self.runs.started(&self.other);
        }
        human_turns(1, "turn-1", json!({"after": "turn-1"}))
    }
}

/// A run that begins in another session linked to the same thread while a check reads defers
/// that check too: the gateway writes into the thread then, and the turns it found are read
/// again later. (What the mutation did: the check's second look at the ports took it as checked
/// alone, so only its own session's runs counted, and the turns read while a linked session's
/// run began were recorded; review of stop 71, MG31.)
#[tokio::test(start_paused = true)]
async fn a_run_beginning_in_a_linked_session_during_the_check_defers_it() {
    let w = world();
    let alpha = w.adopt_remote("agent:main:alpha", "run-begins").await;
    let beta = w.adopt_remote("agent:main:beta", "run-begins").await;
    let runs = Arc::new(RunTracker::new());
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(RunBeginsIn {
            runs: runs.clone(),
            other: beta.clone(),
            started: AtomicBool::new(false),
        }))
        .run_activity(runs.clone())
        .build();
    let r = monitor.tick().await;
    assert_eq!(
        (r.deferred, r.checked),
        (2, 0),
        "beta's run began during both checks: {r:?}"
    );
    assert_eq!(
        w.human_events(&alpha).await,
        0,
        "alpha's turns read while beta's run began are not recorded"
    );
}

/// Bug: the monitor took the session's run state and own prompts before its check read, so a
/// prompt the gateway sent while the check read (its row judged against a list without it)
/// was recorded as a person's turn. Now such a check records nothing and keeps the marker
/// (`Deferred`); a later tick, once no run is active, reads the rows again.
#[tokio::test(start_paused = true)]
async fn human_turns_read_while_the_gateway_acted_are_read_again_later() {
    for prompt in [false, true] {
        let w = world();
        let session = w.adopt_remote("agent:main:remote", "acts").await;
        let runs = Arc::new(RunTracker::new());
        let prompts = Arc::new(RecentPrompts::new());
        let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
            .provider(Arc::new(GatewayActsDuringCheck {
                runs: runs.clone(),
                prompts: prompts.clone(),
                prompt,
                checks: AtomicUsize::new(0),
            }))
            .run_activity(runs.clone())
            .own_prompts(prompts.clone())
            .build();
        let mut rx = monitor.subscribe();
        let report = monitor.tick().await;
        assert_eq!(
            (report.checked, report.deferred),
            (0, 1),
            "prompt {prompt}: the tick counts the check as deferred"
        );
        assert_eq!(
            next(&mut rx, |d| match d {
                Detection::Deferred { session } => Some(session.clone()),
                _ => None,
            })
            .await,
            session,
            "prompt {prompt}"
        );
        assert!(
            w.events(&session, EventKind::HumanDirectMessage)
                .await
                .is_empty(),
            "prompt {prompt}: nothing recorded"
        );
        assert_eq!(
            w.store.link(&session).await.unwrap().unwrap().marker,
            None,
            "prompt {prompt}: the marker stays"
        );
        runs.finished(&session);
        let report = monitor.tick().await;
        assert_eq!((report.checked, report.deferred), (1, 0), "prompt {prompt}");
        assert_eq!(
            w.events(&session, EventKind::HumanDirectMessage)
                .await
                .len(),
            1,
            "prompt {prompt}: read again and recorded"
        );
    }
}

/// Bug: a link store that hung on a marker move held the monitor's tick for good, and with it
/// every later tick (one runs at a time). The move now waits the service's `store_wait` and
/// fails like any other store failure: the tick ends, its detection says the marker did not
/// move, and the next tick reads the rows again.
#[tokio::test(start_paused = true)]
async fn a_marker_move_that_hangs_fails_the_check_and_ends_the_tick() {
    let (w, mut t, session) = worker_adopted().await;
    let flaky = Arc::new(Flaky {
        hang_moves: std::sync::atomic::AtomicBool::new(true),
        ..Flaky::over(&w.store)
    });
    let monitor = UpstreamMonitor::builder(w.svc.clone(), flaky.clone())
        .provider(Arc::new(JsonlProvider::new()))
        .build();
    let mut rx = monitor.subscribe();
    let before = w.store.link(&session).await.unwrap().unwrap();
    t.human("typed by a person");
    let report = tokio::time::timeout(std::time::Duration::from_hours(1), monitor.tick())
        .await
        .expect("the tick ends although the store hangs");
    assert_eq!(report.checked, 1);
    assert_eq!(w.human_events(&session).await, 1, "the turn is recorded");
    let failed = next(&mut rx, |d| match d {
        Detection::HumanTurns {
            session,
            marker: MarkerMove::Failed(error),
            ..
        } => Some((session.clone(), error.clone())),
        _ => None,
    })
    .await;
    assert_eq!(failed.0, session);
    assert!(failed.1.contains("has not answered"), "{}", failed.1);
    assert_eq!(
        w.store.link(&session).await.unwrap().unwrap().marker,
        before.marker,
        "the marker stays"
    );
    // Once the store answers, the next tick moves it, and records nothing twice.
    flaky.hang_moves.store(false, Ordering::SeqCst);
    monitor.tick().await;
    assert_ne!(
        w.store.link(&session).await.unwrap().unwrap().marker,
        before.marker
    );
    assert_eq!(w.human_events(&session).await, 1);
}

/// Bug (review, stop 53): a store whose listing of the links panicked ended the monitor's
/// task, and with it the monitoring of every adopted session. The panic now fails the listing,
/// logged with it (since stop 57; before, the tick caught it as a tick that panicked), and the
/// next tick runs: the turn typed meanwhile is recorded at the second tick.
#[tokio::test(start_paused = true)]
async fn the_monitor_outlives_a_tick_that_panics() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let (w, mut t, session) = worker_adopted().await;
    let flaky = Arc::new(Flaky {
        panic_lists: AtomicUsize::new(1),
        ..Flaky::over(&w.store)
    });
    let monitor = UpstreamMonitor::builder(w.svc.clone(), flaky)
        .provider(Arc::new(JsonlProvider::new()))
        .build();
    let mut rx = monitor.subscribe();
    let started = Instant::now();
    let task = monitor.spawn();
    t.human("typed while the store failed");
    // The tick that panicked still ends, so that a subscriber counting ticks misses none.
    let first = next_tick(&mut rx).await;
    assert_eq!((first.tick, first.checked), (1, 0));
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(15),
        "at the first tick"
    );
    next(&mut rx, |d| match d {
        Detection::HumanTurns {
            marker: MarkerMove::Moved,
            ..
        } => Some(()),
        _ => None,
    })
    .await;
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(75),
        "at the second tick"
    );
    assert!(!task.is_finished());
    assert_eq!(w.human_events(&session).await, 1);
    assert!(
        capture.said(&["cannot list links", "the store panicked: the store failed"]) > 0,
        "{:?}",
        capture.lines()
    );
    task.stop().await;
}

/// A link store over `inner` whose first listings panic in the call itself, before it returns
/// its future (a port written by hand, not with `async_trait`): the panic unwinds through the
/// tick, not through the store's wait.
struct ListPanicsAtCall {
    inner: Arc<MemoryStore>,
    left: AtomicUsize,
}

#[async_trait]
impl UpstreamStore for ListPanicsAtCall {
    async fn upsert_link(
        &self,
        spec: LinkSpec,
        now: Timestamp,
    ) -> Result<UpsertOutcome, StoreError> {
        self.inner.upsert_link(spec, now).await
    }
    async fn link(&self, s: &SessionRef) -> Result<Option<UpstreamLink>, StoreError> {
        self.inner.link(s).await
    }
    fn links<'life0, 'async_trait>(
        &'life0 self,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<Vec<UpstreamLink>, StoreError>>
                + Send
                + 'async_trait,
        >,
    >
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let panics = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        assert!(!panics, "the store panicked before its future");
        self.inner.links()
    }
    async fn set_marker(
        &self,
        s: &SessionRef,
        expected: Timestamp,
        marker: Value,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        self.inner.set_marker(s, expected, marker, now).await
    }
    async fn mark_scanned(&self, s: &SessionRef, now: Timestamp) -> Result<bool, StoreError> {
        self.inner.mark_scanned(s, now).await
    }
    async fn remove_link(&self, s: &SessionRef, e: Option<Timestamp>) -> Result<bool, StoreError> {
        self.inner.remove_link(s, e).await
    }
}

/// A tick that panics (here a link store that panics in its call, not in its future) still ends
/// with its `TickDone`, so that a subscriber counting ticks misses none, and the next tick runs.
/// (What the mutation did: the tick that panicked published no `TickDone`; review of stop 66,
/// M516.)
#[tokio::test(start_paused = true)]
async fn a_tick_that_panics_outside_the_stores_wait_still_publishes_its_end() {
    let (w, mut t, session) = worker_adopted().await;
    let store = Arc::new(ListPanicsAtCall {
        inner: w.store.clone(),
        left: AtomicUsize::new(1),
    });
    let monitor = UpstreamMonitor::builder(w.svc.clone(), store)
        .provider(Arc::new(JsonlProvider::new()))
        .build();
    let mut rx = monitor.subscribe();
    let task = monitor.spawn();
    t.human("typed while the store panicked");
    let first = next_tick(&mut rx).await;
    assert_eq!(
        (first.tick, first.checked),
        (1, 0),
        "the tick that panicked ends with its TickDone"
    );
    let second = next_tick(&mut rx).await;
    assert_eq!((second.tick, second.checked), (2, 1), "the next tick runs");
    assert_eq!(w.human_events(&session).await, 1);
    task.stop().await;
}

/// A store over `inner` whose `cursors` call numbered `panic_at` (counted from 1, once armed)
/// panics in the call itself, before it returns its future: the panic unwinds through the
/// tick, after the checks of the links asked before it were spawned.
#[derive(Debug)]
struct CursorsPanicAtCall {
    inner: Arc<MemoryStore>,
    calls: AtomicUsize,
    panic_at: AtomicUsize,
}

#[async_trait]
impl EventStore for CursorsPanicAtCall {
    async fn record(
        &self,
        event: NewEvent,
        now: Timestamp,
    ) -> Result<awareness_core::Recorded, StoreError> {
        self.inner.record(event, now).await
    }
    async fn changes_since(
        &self,
        session: &SessionRef,
        after: Sequence,
        limit: usize,
    ) -> Result<awareness_core::ChangesPage, StoreError> {
        self.inner.changes_since(session, after, limit).await
    }
    async fn heads(
        &self,
        sessions: &[SessionRef],
    ) -> Result<Vec<awareness_core::Head>, StoreError> {
        self.inner.heads(sessions).await
    }
    async fn list_heads(
        &self,
        agent: Option<&AgentId>,
    ) -> Result<Vec<awareness_core::Head>, StoreError> {
        self.inner.list_heads(agent).await
    }
    async fn events_after(
        &self,
        after: Sequence,
        limit: usize,
    ) -> Result<Vec<Arc<awareness_core::Event>>, StoreError> {
        self.inner.events_after(after, limit).await
    }
    async fn log_stats(&self) -> Result<awareness_core::LogStats, StoreError> {
        self.inner.log_stats().await
    }
    async fn prune_chunk(
        &self,
        step: &awareness_core::PruneStep,
        max_rows: usize,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        self.inner.prune_chunk(step, max_rows, now).await
    }
    async fn delete_session(&self, session: &SessionRef) -> Result<(), StoreError> {
        self.inner.delete_session(session).await
    }
}

#[async_trait]
impl CursorStore for CursorsPanicAtCall {
    async fn watch(
        &self,
        watcher: &WatcherKey,
        target: &SessionRef,
        now: Timestamp,
    ) -> Result<awareness_core::Cursor, StoreError> {
        self.inner.watch(watcher, target, now).await
    }
    async fn unwatch(&self, watcher: &WatcherKey, target: &SessionKey) -> Result<bool, StoreError> {
        self.inner.unwatch(watcher, target).await
    }
    async fn acknowledge(
        &self,
        watcher: &WatcherKey,
        targets: &[awareness_core::AckTarget],
        now: Timestamp,
    ) -> Result<Vec<awareness_core::Notice>, StoreError> {
        self.inner.acknowledge(watcher, targets, now).await
    }
    async fn cursor(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<Option<awareness_core::Cursor>, StoreError> {
        self.inner.cursor(watcher, target).await
    }
    fn cursors<'life0, 'life1, 'async_trait>(
        &'life0 self,
        filter: &'life1 awareness_core::CursorFilter,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<Vec<awareness_core::Cursor>, StoreError>>
                + Send
                + 'async_trait,
        >,
    >
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        assert_ne!(
            call,
            self.panic_at.load(Ordering::SeqCst),
            "the store panicked before its future"
        );
        self.inner.cursors(filter)
    }
    async fn refreeze(
        &self,
        keys: &[awareness_core::CursorKey],
        now: Timestamp,
    ) -> Result<Vec<awareness_core::Notice>, StoreError> {
        self.inner.refreeze(keys, now).await
    }
    async fn reset_watcher(&self, watcher: &SessionKey) -> Result<u64, StoreError> {
        self.inner.reset_watcher(watcher).await
    }
}

/// A tick that panics once the checks of some of its links were spawned (a store whose
/// `cursors` panics in the call, asked about the next link) ends them unrecorded and counts
/// none of them as checked in its `TickDone`; the next tick checks every link. (What the
/// mutations did: MN09 counted the ended checks as checked; MN45 let them run on and record
/// their turns within the tick that panicked; review of stop 68, MN09 and MN45.)
#[tokio::test(start_paused = true)]
async fn a_tick_that_panics_after_its_first_checks_began_counts_and_records_none_of_them() {
    let store = Arc::new(MemoryStore::new());
    let cursors = Arc::new(CursorsPanicAtCall {
        inner: store.clone(),
        calls: AtomicUsize::new(0),
        panic_at: AtomicUsize::new(0),
    });
    let (svc, queue, wake) = common::service(cursors.clone(), Some(store.clone()));
    let w = World {
        store,
        queue,
        wake,
        svc,
    };
    let manager = WatcherKey::parse("agent:main:main").unwrap();
    let mut transcripts = Vec::new();
    let mut sessions = Vec::new();
    for key in ["agent:main:a", "agent:main:b"] {
        let t = Transcript::new();
        let session = SessionRef::parse(key, "main").unwrap();
        w.svc
            .try_adopt(jsonl::adoption(session.clone(), &t.path, None).unwrap())
            .await
            .unwrap();
        w.store
            .watch(&manager, &session, Timestamp::now())
            .await
            .unwrap();
        transcripts.push(t);
        sessions.push(session);
    }
    for t in &mut transcripts {
        t.human("typed before the tick that panics");
    }
    let monitor = w.monitor().build();
    let mut rx = monitor.subscribe();
    cursors.calls.store(0, Ordering::SeqCst);
    cursors.panic_at.store(2, Ordering::SeqCst);
    let task = monitor.spawn();
    let first = next_tick(&mut rx).await;
    assert_eq!(
        (first.tick, first.checked),
        (1, 0),
        "the tick that panicked counts no check"
    );
    // What it counted before the panic stays. (What the mutation did: the report of a tick that
    // panicked was emptied, its links counted none; review of stop 70, MB39.)
    assert_eq!(
        first.links, 2,
        "the tick that panicked still counts the links it listed"
    );
    for session in &sessions {
        assert_eq!(
            w.human_events(session).await,
            0,
            "nothing recorded by the tick that panicked: {session}"
        );
    }
    let second = next_tick(&mut rx).await;
    assert_eq!(
        (second.tick, second.checked),
        (2, 2),
        "the next tick checks both"
    );
    for session in &sessions {
        assert_eq!(w.human_events(session).await, 1, "{session}");
    }
    task.stop().await;
}

/// A JSONL monitor (default config) over `w`'s links whose first marker move fails.
fn monitor_failing_the_first_marker_move(w: &World) -> UpstreamMonitor {
    let flaky = Arc::new(Flaky {
        fail_moves: AtomicUsize::new(1),
        ..Flaky::over(&w.store)
    });
    UpstreamMonitor::builder(w.svc.clone(), flaky)
        .provider(Arc::new(JsonlProvider::new()))
        .build()
}

/// Wraps the memory store's links: re-adopts the session from another thread in the middle of
/// a check (through `on_check`), or fails the first marker moves.
struct Flaky {
    inner: Arc<MemoryStore>,
    fail_moves: AtomicUsize,
    /// Every marker move hangs (a store that stopped answering) while set.
    hang_moves: std::sync::atomic::AtomicBool,
    /// Every link removal is made, then never answered (a store that answers too late), while
    /// set.
    hang_removes: std::sync::atomic::AtomicBool,
    /// Every upsert is made, then answered once a permit is added here (one per upsert).
    hold_upserts: Option<Arc<tokio::sync::Semaphore>>,
    /// The first listings of the links panic (a store that panics).
    panic_lists: AtomicUsize,
    /// The first link removals fail, removing nothing.
    fail_removes: AtomicUsize,
    /// The next scan times stored fail (review of stop 65, MW13).
    fail_scans: AtomicUsize,
}

impl Flaky {
    /// Over `inner`'s links, failing and hanging nothing.
    fn over(inner: &Arc<MemoryStore>) -> Self {
        Self {
            inner: inner.clone(),
            fail_moves: AtomicUsize::new(0),
            hang_moves: std::sync::atomic::AtomicBool::new(false),
            hang_removes: std::sync::atomic::AtomicBool::new(false),
            hold_upserts: None,
            panic_lists: AtomicUsize::new(0),
            fail_removes: AtomicUsize::new(0),
            fail_scans: AtomicUsize::new(0),
        }
    }
}

#[async_trait]
impl UpstreamStore for Flaky {
    async fn upsert_link(
        &self,
        spec: LinkSpec,
        now: Timestamp,
    ) -> Result<UpsertOutcome, StoreError> {
        let upserted = self.inner.upsert_link(spec, now).await;
        if let Some(gate) = &self.hold_upserts {
            gate.acquire().await.expect("the gate stays open").forget();
        }
        upserted
    }
    async fn link(&self, s: &SessionRef) -> Result<Option<UpstreamLink>, StoreError> {
        self.inner.link(s).await
    }
    async fn links(&self) -> Result<Vec<UpstreamLink>, StoreError> {
        let panics = self
            .panic_lists
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        assert!(!panics, "the store failed");
        self.inner.links().await
    }
    async fn set_marker(
        &self,
        s: &SessionRef,
        expected: Timestamp,
        marker: Value,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        if self.hang_moves.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self
            .fail_moves
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(StoreError::backend("set_marker", "disk full"));
        }
        self.inner.set_marker(s, expected, marker, now).await
    }
    async fn mark_scanned(&self, s: &SessionRef, now: Timestamp) -> Result<bool, StoreError> {
        if self
            .fail_scans
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(StoreError::backend("mark_scanned", "disk full"));
        }
        self.inner.mark_scanned(s, now).await
    }
    async fn remove_link(&self, s: &SessionRef, e: Option<Timestamp>) -> Result<bool, StoreError> {
        if self
            .fail_removes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(StoreError::backend("remove_link", "disk full"));
        }
        let removed = self.inner.remove_link(s, e).await;
        if self.hang_removes.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        removed
    }
}

/// Only a marker that moved is said moved: one kept because the link changed during the
/// check is not (`monitor --json` says `"markerAdvanced": false`, and the detection's text says
/// the marker was kept). (What the mutation did: a marker kept because the link changed was
/// said moved; review of stop 68, MN05.)
#[test]
fn a_marker_kept_because_the_link_changed_is_not_said_moved() {
    assert!(MarkerMove::Moved.is_moved());
    assert!(
        !MarkerMove::LinkChanged.is_moved(),
        "a marker kept because the link changed is not moved"
    );
    assert!(!MarkerMove::Failed("disk full".into()).is_moved());
}

#[tokio::test(start_paused = true)]
async fn the_marker_moves_only_after_the_event_and_only_if_the_link_is_unchanged() {
    let (w, mut t, session) = worker_adopted().await;
    let monitor = monitor_failing_the_first_marker_move(&w);
    let before = w.store.link(&session).await.unwrap().unwrap();
    t.human("first");
    t.human("second");

    // The event is stored but the marker cannot move: the next tick reads the same burst and
    // its dedupe key makes the second record a no-op.
    let mut rx = monitor.subscribe();
    monitor.tick().await;
    let first = next(&mut rx, |d| match d {
        Detection::HumanTurns { event, marker, .. } => Some((event.sequence, marker.clone())),
        _ => None,
    })
    .await;
    assert!(
        matches!(&first.1, MarkerMove::Failed(why) if why.contains("disk full")),
        "{first:?}"
    );
    assert_eq!(
        w.store.link(&session).await.unwrap().unwrap().marker,
        before.marker
    );
    monitor.tick().await;
    let second = next(&mut rx, |d| match d {
        Detection::HumanTurns { event, marker, .. } => Some((event.sequence, marker.clone())),
        _ => None,
    })
    .await;
    assert_eq!(
        second,
        (first.0, MarkerMove::Moved),
        "the same event, and now the marker moved"
    );
    assert_eq!(w.human_events(&session).await, 1);

    // The session is adopted from another transcript while a check is in flight: the event
    // is recorded, but the stale marker never overwrites the new link's.
    let other = Transcript::new();
    let swap = Arc::new(SwapDuringCheck {
        store: w.store.clone(),
        to: jsonl::adoption(session.clone(), &other.path, None).unwrap(),
    });
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(swap.clone())
        .build();
    let mut rx = monitor.subscribe();
    t.human("third");
    monitor.tick().await;
    let advanced = next(&mut rx, |d| match d {
        Detection::HumanTurns { marker, .. } => Some(marker.clone()),
        _ => None,
    })
    .await;
    assert_eq!(advanced, MarkerMove::LinkChanged);
    let link = w.store.link(&session).await.unwrap().unwrap();
    assert_eq!(
        jsonl::path_of(&link).unwrap(),
        std::fs::canonicalize(&other.path).unwrap()
    );
    // (Compared with its adoption's marker, not with a new `marker_at_end`: each one has a
    // generation of its own.)
    assert_eq!(
        link.marker, swap.to.marker,
        "the new source keeps its own marker"
    );
}

/// What each detection says, for a failure's message.
fn texts(ds: &[Detection]) -> Vec<String> {
    ds.iter().map(ToString::to_string).collect()
}

/// The detections published so far.
fn published(rx: &mut broadcast::Receiver<Detection>) -> Vec<Detection> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

/// A tick's end, as `awareness monitor --verbose` prints it, says how many links it checked of
/// how many the store holds; a check that found the source gone says how many in a row did.
/// (What the mutation did: the two counts swapped, a tick that checked one of two links said it
/// checked 2 of 1; review of stop 72, MT55.)
#[tokio::test]
async fn a_ticks_end_says_how_many_links_it_checked_of_how_many() {
    let w = world();
    w.adopt_remote("agent:main:remote", "scripted").await;
    w.adopt_remote("agent:main:elsewhere", "unread").await;
    let monitor = w
        .monitor()
        .provider(Arc::new(Scripted::new(vec![
            CheckOutcome::Unchanged { marker: json!(1) },
            CheckOutcome::Missing,
        ])))
        .build();
    let mut rx = monitor.subscribe();
    let ds = tick_published(&monitor, &mut rx).await;
    let ends: Vec<String> = ds
        .iter()
        .filter(|d| matches!(d, Detection::TickDone(_)))
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        ends,
        ["tick 1: checked 1 of 2 link(s) (0 unwatched, 0 deferred)"],
        "{:?}",
        texts(&ds)
    );
    // The first check that finds the source gone says it is the first in a row. (What the
    // mutation did: the line said one more check in a row than had found it gone; review of
    // stop 72, MT61.)
    let ds = tick_published(&monitor, &mut rx).await;
    let missing: Vec<String> = ds
        .iter()
        .filter(|d| matches!(d, Detection::Missing { .. }))
        .map(ToString::to_string)
        .collect();
    assert_eq!(missing.len(), 1, "{:?}", texts(&ds));
    assert!(
        missing[0].ends_with("source not found (1 in a row)"),
        "{missing:?}"
    );
}

/// Bug: a marker move the store failed was published as "the link changed meanwhile; marker
/// kept" after human turns, and not at all after an unchanged or a rebased check (a rebase was
/// even published though its marker was not stored).
#[tokio::test(start_paused = true)]
async fn a_failed_marker_move_is_published_with_its_cause() {
    let w = world();
    let mut t = Transcript::new();
    w.adopt(&t, "agent:main:worker", "main", "agent:main:main")
        .await;
    let flaky = Arc::new(Flaky {
        ..Flaky::over(&w.store)
    });
    let monitor = UpstreamMonitor::builder(w.svc.clone(), flaky.clone())
        .provider(Arc::new(JsonlProvider::new()))
        .build();
    let mut rx = monitor.subscribe();

    // Human turns: the event is stored, the marker is not.
    t.human("first");
    flaky.fail_moves.store(1, Ordering::SeqCst);
    monitor.tick().await;
    let human: Vec<String> = published(&mut rx)
        .iter()
        .filter(|d| matches!(d, Detection::HumanTurns { .. }))
        .map(ToString::to_string)
        .collect();
    assert_eq!(human.len(), 1, "{human:?}");
    assert!(
        human[0].contains("marker not moved") && human[0].contains("disk full"),
        "{human:?}"
    );
    assert!(!human[0].contains("link changed"), "{human:?}");
    monitor.tick().await; // the marker moves now (the record is a dedupe hit)
    published(&mut rx);

    // Rows that are no human turns: the marker should move past them, and does not.
    t.model_turn();
    flaky.fail_moves.store(1, Ordering::SeqCst);
    monitor.tick().await;
    let ds = published(&mut rx);
    let failed: Vec<&Detection> = ds
        .iter()
        .filter(|d| matches!(d, Detection::Failed { .. }))
        .collect();
    assert_eq!(failed.len(), 1, "{:?}", texts(&ds));
    assert!(
        failed[0].to_string().contains("disk full"),
        "{:?}",
        texts(&ds)
    );

    // A truncated transcript: the rebase is not stored, so it is a failure, not a rebase.
    File::create(&t.path).unwrap();
    flaky.fail_moves.store(1, Ordering::SeqCst);
    monitor.tick().await;
    let ds = published(&mut rx);
    assert!(
        !ds.iter().any(|d| matches!(d, Detection::Rebased { .. })),
        "{:?}",
        texts(&ds)
    );
    let failed: Vec<String> = ds
        .iter()
        .filter(|d| matches!(d, Detection::Failed { .. }))
        .map(ToString::to_string)
        .collect();
    assert_eq!(failed.len(), 1, "{:?}", texts(&ds));
    assert!(
        failed[0].contains("replaced or truncated") && failed[0].contains("disk full"),
        "{failed:?}"
    );
    // With the store working again, the next tick rebases.
    monitor.tick().await;
    assert!(
        published(&mut rx)
            .iter()
            .any(|d| matches!(d, Detection::Rebased { .. }))
    );
}

/// Reads with the JSONL provider, but re-adopts the session from another source first.
struct SwapDuringCheck {
    store: Arc<MemoryStore>,
    to: LinkSpec,
}

#[async_trait]
impl UpstreamProvider for SwapDuringCheck {
    fn kind(&self) -> &str {
        jsonl::LOCAL_JSONL
    }

    async fn check(&self, link: &UpstreamLink, own: &[String]) -> CheckOutcome {
        let out = JsonlProvider::new().check(link, own).await;
        let moved = self
            .store
            .upsert_link(self.to.clone(), Timestamp::now())
            .await
            .unwrap();
        assert!(moved.rebased);
        out
    }
}

#[tokio::test]
async fn adopting_again_keeps_or_rebases_the_marker() {
    let w = world();
    let mut t = Transcript::new();
    let session = SessionRef::parse("agent:main:worker", "main").unwrap();
    let first = w
        .svc
        .try_adopt(jsonl::adoption(session.clone(), &t.path, None).unwrap())
        .await
        .unwrap();
    t.human("typed after adoption");
    // Adopting the same file again (its marker spec is now past the new line) keeps the old
    // marker, so the line is still counted.
    let again = w
        .svc
        .adopt(jsonl::adoption(session.clone(), &t.path, None).unwrap())
        .await
        .unwrap();
    assert!(!again.created && !again.rebased);
    assert_eq!(again.link.marker, first.link.marker);
    assert_eq!(
        w.events(&session, EventKind::Adopted).await.len(),
        1,
        "deduplicated"
    );
    // Another thread id for the same file is another source: rebased.
    let moved = w
        .svc
        .adopt(jsonl::adoption(session.clone(), &t.path, Some("renamed")).unwrap())
        .await
        .unwrap();
    assert!(moved.rebased);
    // Without an upstream store, adoption is refused (logged), not silently dropped.
    let bare = Awareness::builder(
        w.store.clone(),
        Arc::new(InMemoryQueue::new()),
        Arc::new(RecordingWake::new()),
        Arc::new(InMemoryDirectory::new()),
    )
    .build();
    assert!(
        bare.try_adopt(jsonl::adoption(session, &t.path, None).unwrap())
            .await
            .is_err()
    );
}

/// Bug: an adoption whose caller gave up (a host's own timeout, an aborted task) once its
/// link was written left the link without its `adopted` event: the event was recorded in the
/// caller's future, after the link's answer, so nobody watching the session was told of the
/// adoption until it was adopted again. The link and its event are written on one task now.
#[tokio::test]
async fn an_adoption_given_up_once_its_link_is_in_still_records_adopted() {
    let store = Arc::new(MemoryStore::new());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let links = Arc::new(Flaky {
        hold_upserts: Some(Arc::clone(&gate)),
        ..Flaky::over(&store)
    });
    let (svc, _queue, _wake) = common::service(store.clone(), Some(links));
    let session = SessionRef::parse("agent:main:worker", "main").unwrap();
    store
        .watch(
            &WatcherKey::parse("agent:main:main").unwrap(),
            &session,
            Timestamp::now(),
        )
        .await
        .unwrap();
    let t = Transcript::new();
    let spec = jsonl::adoption(session.clone(), &t.path, None).unwrap();
    let adopting = tokio::spawn({
        let svc = Arc::clone(&svc);
        async move { svc.try_adopt(spec).await }
    });
    // The link is written; its answer waits at the gate. The caller gives up there.
    let linked = async {
        while store.link(&session).await.unwrap().is_none() {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), linked)
        .await
        .expect("the link is written");
    adopting.abort();
    assert!(adopting.await.unwrap_err().is_cancelled());
    gate.add_permits(1);
    svc.wait_for_writes().await;
    let adopted = store
        .events_after(Sequence::ZERO, 10)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == EventKind::Adopted && e.session_ref() == session)
        .count();
    assert_eq!(adopted, 1, "the link is in, and so is its adopted event");
}

/// Bug: a catalog id was only checked as a key (1 KiB), while the summaries built from it
/// (`adopted from`, `human message via`, `upstream missing via`) allow 200 characters on one
/// line. The link was stored, its `adopted` event refused, and later every tick failed on the
/// same human turns, or on `upstream_missing` before the link could be removed.
#[tokio::test]
async fn a_catalog_id_too_long_or_broken_for_its_summaries_is_refused_before_adoption() {
    let w = world();
    let t = Transcript::new();
    let session = SessionRef::parse("agent:main:worker", "main").unwrap();
    for catalog in ["c".repeat(190), "claude\u{2028}code".to_owned()] {
        let spec = LinkSpec {
            catalog_id: catalog.clone(),
            ..jsonl::adoption(session.clone(), &t.path, None).unwrap()
        };
        let err = w.svc.try_adopt(spec).await.unwrap_err();
        let names_the_catalog_id = match &err {
            StoreError::InvalidInput(awareness_core::ValidationError::CatalogIdTooLong {
                ..
            }) => true,
            StoreError::InvalidInput(awareness_core::ValidationError::ControlCharacter {
                what,
                ..
            }) => what.starts_with("catalog id"),
            _ => false,
        };
        assert!(names_the_catalog_id, "{catalog:?}: {err}");
        assert_eq!(w.store.link(&session).await.unwrap(), None, "{catalog:?}");
        assert!(w.store.links().await.unwrap().is_empty(), "{catalog:?}");
        assert_eq!(
            w.store.state_version(&session).await.unwrap(),
            Sequence::ZERO,
            "{catalog:?}: nothing recorded"
        );
    }
    // A catalog id that fits is adopted, and its summary is valid.
    let fits = "c".repeat(150);
    let spec = LinkSpec {
        catalog_id: fits.clone(),
        ..jsonl::adoption(session.clone(), &t.path, None).unwrap()
    };
    assert!(w.svc.try_adopt(spec).await.unwrap().created);
    let adopted = w.events(&session, EventKind::Adopted).await;
    assert_eq!(adopted.len(), 1);
    assert_eq!(adopted[0].summary, format!("adopted from {fits}"));
}

/// Bug: the event's dedupe id was the burst's first human turn. When the marker could not move
/// after the event was stored and the person typed again before the next tick, that tick read
/// the grown burst, hit the stored event's dedupe key, recorded nothing and then moved the
/// marker past the new turn: it was never recorded nor notified.
#[tokio::test(start_paused = true)]
async fn a_burst_that_grew_after_a_failed_marker_move_is_recorded() {
    let (w, mut t, session) = worker_adopted().await;
    let monitor = monitor_failing_the_first_marker_move(&w);
    let manager = SessionKey::new("agent:main:main").unwrap();

    t.human("first");
    monitor.tick().await; // recorded; the marker move fails
    assert_eq!(w.human_events(&session).await, 1);
    assert_eq!(w.svc.drain_turn(&manager).await.len(), 1);

    t.human("second"); // typed before the next tick
    monitor.tick().await;
    let events = w.events(&session, EventKind::HumanDirectMessage).await;
    assert_eq!(events.len(), 2, "the grown burst is a new event");
    let c = w
        .store
        .cursor(
            &WatcherKey::parse("agent:main:main").unwrap(),
            &session.session_key,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.material, events[1].sequence, "and it notifies");
    assert_eq!(w.queue.peek(&manager).len(), 1);

    // The marker is now past both turns: reading again records nothing.
    monitor.tick().await;
    assert_eq!(w.human_events(&session).await, 2);
}

#[tokio::test]
async fn paired_bursts_are_named_by_their_last_human_turn() {
    let node = FakeNode::holding([
        PairedItem::user("i0", "old"),
        PairedItem::user("i1", "first"),
        PairedItem::with_role("i2", "assistant", "ok"),
    ]);
    let provider = PairedNodeProvider::new(node.clone());
    let link = paired_link(Some(json!({"uuid": "i0"})));
    let id = |out: CheckOutcome| match out {
        CheckOutcome::HumanTurns { dedupe_id, .. } => dedupe_id,
        other => panic!("{other:?}"),
    };
    let once = id(provider.check(&link, &[]).await);
    assert_eq!(
        id(provider.check(&link, &[]).await),
        once,
        "the same burst read again is deduplicated"
    );
    node.items
        .lock()
        .unwrap()
        .push(PairedItem::user("i3", "second"));
    assert_ne!(
        id(provider.check(&link, &[]).await),
        once,
        "a burst that grew is a new event"
    );
}

// ----- review: behaviours DESIGN.md states that no test caught breaking ----------------------------

/// One tick, and what it published.
async fn tick_published(
    monitor: &UpstreamMonitor,
    rx: &mut broadcast::Receiver<Detection>,
) -> Vec<Detection> {
    monitor.tick().await;
    published(rx)
}

/// The transcript moved away (its source is gone) for two ticks: what they published about it
/// (`missing N`: the N-th consecutive check that found it gone; `upstream_missing`).
async fn missing_twice(
    t: &Transcript,
    monitor: &UpstreamMonitor,
    rx: &mut broadcast::Receiver<Detection>,
) -> Vec<String> {
    std::fs::rename(&t.path, t.path.with_extension("away")).unwrap();
    let mut found = Vec::new();
    for _ in 0..2 {
        for d in tick_published(monitor, rx).await {
            match d {
                Detection::Missing { consecutive, .. } => {
                    found.push(format!("missing {consecutive}"));
                }
                Detection::UpstreamMissing { .. } => found.push("upstream_missing".into()),
                _ => {}
            }
        }
    }
    found
}

fn come_back(t: &Transcript) {
    std::fs::rename(t.path.with_extension("away"), &t.path).unwrap();
}

/// DESIGN.md section 8: `upstream_missing` needs a source gone on 3 **consecutive** checks. A
/// check that finds the source again restarts the count, whatever it found: nothing new,
/// human turns, or a truncated file. The marker moves of the last two fail, so that the link
/// never changes (`updated_at` stays) and only the finding itself can restart the count.
#[tokio::test(start_paused = true)]
async fn a_source_found_again_restarts_the_count_of_missing_checks() {
    let w = world();
    let mut t = Transcript::new();
    t.human("history, so that the file can shrink below the marker");
    let session = w
        .adopt(&t, "agent:main:worker", "main", "agent:main:main")
        .await;
    let adopted = w.store.link(&session).await.unwrap().unwrap();
    let flaky = Arc::new(Flaky {
        ..Flaky::over(&w.store)
    });
    let monitor = UpstreamMonitor::builder(w.svc.clone(), flaky.clone())
        .provider(Arc::new(JsonlProvider::new()))
        .build();
    let mut rx = monitor.subscribe();

    let twice = ["missing 1", "missing 2"];
    assert_eq!(missing_twice(&t, &monitor, &mut rx).await, twice);
    // Back, with nothing new: the marker stays where it was.
    come_back(&t);
    let ds = tick_published(&monitor, &mut rx).await;
    assert!(
        !ds.iter()
            .any(|d| matches!(d, Detection::Missing { .. } | Detection::Failed { .. })),
        "{:?}",
        texts(&ds)
    );
    assert_eq!(
        w.store.link(&session).await.unwrap().unwrap().marker,
        adopted.marker
    );
    assert_eq!(
        missing_twice(&t, &monitor, &mut rx).await,
        twice,
        "found unchanged: the count starts again"
    );

    // Back with a person's turn; the event is stored, the marker move fails.
    come_back(&t);
    t.human("typed while the transcript was back");
    flaky.fail_moves.store(1, Ordering::SeqCst);
    let ds = tick_published(&monitor, &mut rx).await;
    assert!(
        ds.iter().any(|d| matches!(
            d,
            Detection::HumanTurns {
                marker: MarkerMove::Failed(_),
                ..
            }
        )),
        "{:?}",
        texts(&ds)
    );
    assert_eq!(
        missing_twice(&t, &monitor, &mut rx).await,
        twice,
        "found with human turns: the count starts again"
    );

    // Back truncated: a rebase, whose marker move fails.
    come_back(&t);
    File::create(&t.path).unwrap();
    flaky.fail_moves.store(1, Ordering::SeqCst);
    let ds = tick_published(&monitor, &mut rx).await;
    assert!(
        ds.iter().any(
            |d| matches!(d, Detection::Failed { error, .. } if error.contains("replaced or truncated"))
        ),
        "{:?}",
        texts(&ds)
    );
    assert_eq!(
        missing_twice(&t, &monitor, &mut rx).await,
        twice,
        "found rebased: the count starts again"
    );

    // Nothing recorded so far, and the link is the one adopted.
    assert!(
        w.events(&session, EventKind::UpstreamMissing)
            .await
            .is_empty()
    );
    let link = w.store.link(&session).await.unwrap().unwrap();
    assert_eq!(
        link.updated_at, adopted.updated_at,
        "the link never changed"
    );
    // The third consecutive miss records it and removes the link.
    let ds = tick_published(&monitor, &mut rx).await;
    missing_recorded_and_link_removed(&w, &session, &ds, "the third miss").await;
}

/// Asserts that the tick that published `ds` reported `session`'s source missing and removed
/// its link, which is gone, with one `upstream_missing` event recorded.
async fn missing_recorded_and_link_removed(
    w: &World,
    session: &SessionRef,
    ds: &[Detection],
    what: &str,
) {
    assert!(
        ds.iter().any(|d| matches!(
            d,
            Detection::UpstreamMissing {
                link_removed: true,
                ..
            }
        )),
        "{what}: {:?}",
        texts(ds)
    );
    assert_eq!(
        w.events(session, EventKind::UpstreamMissing).await.len(),
        1,
        "{what}"
    );
    assert_eq!(w.store.link(session).await.unwrap(), None, "{what}");
}

/// DESIGN.md section 8, through the provider the monitor runs: one check reads at most
/// 1 MiB of a transcript (its marker's position moves by at most that much, its offset stays
/// at a line start), and the next check goes on from there.
#[tokio::test(start_paused = true)]
async fn the_monitor_reads_at_most_one_mib_a_tick_and_goes_on_next_tick() {
    let (w, mut t, session) = worker_adopted().await;
    let monitor = w.monitor().build();
    let stored = async || {
        let link = w.store.link(&session).await.unwrap().unwrap();
        JsonlMarker::from_value(&link.marker.unwrap()).unwrap()
    };
    let start = stored().await;
    // Twelve tool results of 200 KiB (the usual big lines), then a person's prompt.
    for i in 0..12 {
        t.line(&user_row(
            &format!("tool-{i}"),
            json!([{"type": "tool_result", "tool_use_id": "t", "content": "x".repeat(200 << 10)}]),
        ));
    }
    let prompt = t.human("so, what failed?");
    let bytes = std::fs::read(&t.path).unwrap();
    let size = bytes.len() as u64;
    assert!(size - start.position() > 2 * MAX_BYTES_PER_TICK);

    let mut at = start;
    let mut ticks = 0;
    while at.position() < size {
        ticks += 1;
        assert!(ticks <= 10, "no end after {ticks} ticks");
        monitor.tick().await;
        let next = stored().await;
        assert!(next.position() > at.position(), "tick {ticks} read nothing");
        assert!(
            next.position() - at.position() <= MAX_BYTES_PER_TICK,
            "tick {ticks} read {} bytes, more than one tick's {MAX_BYTES_PER_TICK}",
            next.position() - at.position()
        );
        let offset = usize::try_from(next.offset).unwrap();
        assert_eq!(
            bytes[offset - 1],
            b'\n',
            "tick {ticks}: the offset is not at a line start"
        );
        at = next;
    }
    assert!(ticks >= 3, "{ticks} ticks for {size} bytes");
    let events = w.events(&session, EventKind::HumanDirectMessage).await;
    assert_eq!(events.len(), 1, "the prompt, once; no tool result");
    let link = w.store.link(&session).await.unwrap().unwrap();
    assert_eq!(
        events[0].dedupe_key.as_deref(),
        Some(upstream::human_dedupe_key(&link, &t.path.display().to_string(), &prompt).as_str())
    );
}

/// A provider that counts its checks in flight and holds each one until the test lets it go.
struct Held {
    in_flight: AtomicUsize,
    most: AtomicUsize,
    began: AtomicUsize,
    go: tokio::sync::Semaphore,
}

#[async_trait]
impl UpstreamProvider for Held {
    fn kind(&self) -> &'static str {
        "held"
    }

    async fn check(&self, link: &UpstreamLink, _: &[String]) -> CheckOutcome {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        self.began.fetch_add(1, Ordering::SeqCst);
        self.go.acquire().await.expect("the gate is open").forget();
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        CheckOutcome::Unchanged {
            marker: link.marker.clone().unwrap_or_default(),
        }
    }
}

/// DESIGN.md section 8: one tick at a time. A tick asked for while another one's check is
/// still running waits for that tick to end before it checks anything.
#[tokio::test(start_paused = true)]
async fn a_tick_waits_for_the_tick_in_progress() {
    let w = world();
    w.adopt_remote("agent:main:remote", "held").await;
    let held = Arc::new(Held {
        in_flight: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
        began: AtomicUsize::new(0),
        go: tokio::sync::Semaphore::new(0),
    });
    let monitor = w.monitor().provider(held.clone()).build();
    let tick = || {
        let monitor = monitor.clone();
        tokio::spawn(async move { monitor.tick().await })
    };
    let first = tick();
    settle().await;
    assert_eq!(
        held.began.load(Ordering::SeqCst),
        1,
        "the first tick checks"
    );
    let second = tick();
    settle().await;
    assert_eq!(
        (
            held.began.load(Ordering::SeqCst),
            held.most.load(Ordering::SeqCst)
        ),
        (1, 1),
        "the second tick checked while the first one's check ran"
    );
    held.go.add_permits(2);
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!((first.tick, first.checked), (1, 1));
    assert_eq!((second.tick, second.checked), (2, 1));
    assert_eq!(held.began.load(Ordering::SeqCst), 2);
    assert_eq!(
        held.most.load(Ordering::SeqCst),
        1,
        "never two checks at once"
    );
}

// ----- the paging bound of the paired-node provider, resumed over checks ---------------------------

/// A paired thread: `i0` (the marker), then `early` human turns (`old0`, ...), then one bound
/// of items (`new0`, ...): every other one a turn when `turns_within`, else only replies.
fn burst_node(early: usize, turns_within: bool) -> Arc<FakeNode> {
    let bound = MAX_PAGES * PAGE_ITEMS;
    let mut items = Vec::new();
    items.push(PairedItem::user("i0", "read before"));
    for i in 0..early {
        items.push(PairedItem::user(
            format!("old{i}"),
            format!("early turn {i}"),
        ));
    }
    for i in 0..bound {
        items.push(if turns_within && i % 2 == 0 {
            PairedItem::user(format!("new{i}"), format!("turn {i}"))
        } else {
            PairedItem::with_role(format!("new{i}"), "assistant", "ok")
        });
    }
    FakeNode::holding(items)
}

fn human_turns(turns: usize, dedupe_id: &str, marker: Value) -> CheckOutcome {
    CheckOutcome::HumanTurns {
        turns: u32::try_from(turns).unwrap(),
        dedupe_id: dedupe_id.into(),
        source_id: "node-2/thread-9".into(),
        marker,
    }
}

/// Bug: paging back stopped at the bound (`MAX_PAGES` pages of `PAGE_ITEMS`, see
/// docs/decisions/0004) and moved the marker to the newest item, so the older turns of a
/// burst longer than the bound were never counted. The first check counts the turns within
/// the bound and stores where it stopped; the next one goes on from there to the marker.
#[tokio::test]
async fn a_paired_burst_longer_than_the_paging_bound_is_counted_whole_over_two_checks() {
    let capture = common::Capture::default();
    let _logging = capture.install();
    let bound = MAX_PAGES * PAGE_ITEMS;
    let node = burst_node(100, true);
    let provider = PairedNodeProvider::new(node.clone());
    let top = format!("new{}", bound - 1);
    // The fake node's cursors are indexes: the next older page ends after `i0` and `old*`.
    // The items just below the top become its anchors once the marker moves there.
    let top_anchors: Vec<String> = (2..6).map(|i| format!("new{}", bound - i)).collect();
    let resume = json!({"uuid": "i0", "resume": {"before": "101", "top": top,
        "top_anchors": top_anchors}});
    assert_eq!(
        provider
            .check(&paired_link(Some(json!({"uuid": "i0"}))), &[])
            .await,
        human_turns(bound / 2, &format!("new{}", bound - 2), resume.clone()),
        "the turns within the bound, and where to go on from"
    );
    // A node that answers no items where the check stopped (restarting) concludes nothing:
    // the marker stays, where to read on from included. It was rebased, and the rest of the
    // burst was never counted.
    let all = std::mem::take(&mut *node.items.lock().unwrap());
    let calls = node.calls.load(Ordering::SeqCst);
    assert_eq!(
        provider
            .check(&paired_link(Some(resume.clone())), &[])
            .await,
        CheckOutcome::Unchanged {
            marker: resume.clone()
        }
    );
    // So does one of a thread adopted empty, whose marker names no item. (It was moved to the
    // newest item, the rest of the burst never counted; review of stop 70, J529.)
    let from_empty = json!({"uuid": null, "resume": resume["resume"].clone()});
    assert_eq!(
        provider
            .check(&paired_link(Some(from_empty.clone())), &[])
            .await,
        CheckOutcome::Unchanged { marker: from_empty }
    );
    *node.items.lock().unwrap() = all;
    node.calls.store(calls, Ordering::SeqCst);
    // A thread that still has items, but none older than the stored cursor (dropped by the
    // node, or rewritten), reached its start without the marker's item: rebased to where the
    // read would have moved the marker, so that the turns typed from then on are counted.
    let dropped = json!({"uuid": "gone", "resume": {"before": "0", "top": top}});
    assert_eq!(
        provider.check(&paired_link(Some(dropped)), &[]).await,
        CheckOutcome::Rebased {
            marker: json!({"uuid": top})
        }
    );
    let rebasing = node.calls.load(Ordering::SeqCst) - calls;
    assert!(
        rebasing <= MAX_PAGES,
        "the rebasing check pages within the bound too: {rebasing} pages"
    );
    node.calls.store(calls, Ordering::SeqCst);
    assert_eq!(calls, MAX_PAGES, "the first check paged up to the bound");
    let warned: Vec<String> = capture
        .lines()
        .into_iter()
        .filter(|l| l.contains("further back than the paging bound"))
        .collect();
    assert_eq!(warned.len(), 1, "{:#?}", capture.lines());
    assert!(
        warned[0].contains(&format!("items={bound}"))
            && warned[0].contains("session_key=agent:main:main")
            && warned[0].contains("next check"),
        "{}",
        warned[0]
    );

    let newest = json!({"uuid": top, "anchors": top_anchors});
    assert_eq!(
        provider.check(&paired_link(Some(resume)), &[]).await,
        human_turns(100, "old99@101", newest.clone()),
        "the older turns, named by their own last turn; the marker at the burst's newest item"
    );
    assert_eq!(
        node.calls.load(Ordering::SeqCst),
        MAX_PAGES + 3,
        "from the stored cursor down to the marker: 101 items, three pages"
    );
    assert_eq!(
        provider
            .check(&paired_link(Some(newest.clone())), &[])
            .await,
        CheckOutcome::Unchanged { marker: newest },
        "nothing is left, nothing is counted twice"
    );
}

/// A node that answers each page after a delay.
struct SlowNode(Arc<FakeNode>, Duration);

#[async_trait]
impl PairedNodeClient for SlowNode {
    async fn newest(
        &self,
        host_id: &str,
        thread_id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<PairedPage, PairedError> {
        tokio::time::sleep(self.1).await;
        self.0.newest(host_id, thread_id, before, limit).await
    }
}

/// Bug: paging back stopped only at `MAX_PAGES`. On a node answering a page a second, a
/// burst of 50 pages outlasted the monitor's 45 s check timeout, and a check that times out
/// stores nothing: every tick read the same pages again and timed out, and the link never
/// moved. Paging stops after `PAGING_TIME` as at the page bound, with what it read and a
/// resume point, and the checks after count the rest, each turn once. A page still awaited
/// then is given up (a node answering a page in 25 s: the second page would end at 50 s).
#[tokio::test(start_paused = true)]
async fn a_slow_node_is_read_back_within_the_paging_time_and_counted_whole() {
    for delay in [Duration::from_secs(1), Duration::from_secs(25)] {
        slow_node_counted_whole(delay).await;
    }
}

async fn slow_node_counted_whole(delay: Duration) {
    let bound = MAX_PAGES * PAGE_ITEMS;
    let node = burst_node(0, true);
    let provider = PairedNodeProvider::new(Arc::new(SlowNode(node.clone(), delay)));
    let mut marker = json!({"uuid": "i0"});
    let mut turns = 0;
    let mut checks = 0;
    loop {
        let started = tokio::time::Instant::now();
        let out = provider
            .check(&paired_link(Some(marker.clone())), &[])
            .await;
        assert!(
            started.elapsed() < Duration::from_secs(45),
            "check {checks} took {:?}",
            started.elapsed()
        );
        checks += 1;
        marker = match out {
            CheckOutcome::HumanTurns {
                turns: n, marker, ..
            } => {
                turns += n;
                marker
            }
            CheckOutcome::Unchanged { .. } => break,
            other => panic!("check {checks}: {other:?}"),
        };
        assert!(checks <= MAX_PAGES + 1, "the checks never reach the marker");
    }
    assert_eq!(turns as usize, bound / 2, "every turn of the burst, once");
    assert!(
        checks >= 3,
        "the paging time split the burst: {checks} checks"
    );
    assert!(
        node.calls.load(Ordering::SeqCst) <= MAX_PAGES + 3 * checks,
        "no page read again and again: {} calls",
        node.calls.load(Ordering::SeqCst)
    );
}

/// The first page is read however long it takes (the paging time bounds only the pages after
/// it, as `with_paging_time` says): on a node slower than the paging time, the turn typed
/// after the marker counts. (The first page under the bound too, a mutation every test
/// passed, such a node was never read: every check ended unchanged: review of stop 61.)
#[tokio::test(start_paused = true)]
async fn the_first_page_is_read_however_long_it_takes() {
    let node = FakeNode::holding([
        PairedItem::user("i0", "old"),
        PairedItem::user("i1", "typed"),
    ]);
    let provider = PairedNodeProvider::new(Arc::new(SlowNode(node, Duration::from_secs(5))))
        .with_paging_time(Duration::from_secs(1));
    let out = provider
        .check(&paired_link(Some(json!({"uuid": "i0"}))), &[])
        .await;
    assert_eq!(turns(&out), 1, "{out:?}");
}

/// A paging time set to mean no bound (`Duration::MAX`) reads a burst within the page bound
/// in one check: the deadline overflowed the clock and every check panicked (the monitor
/// reported each link failed, so human turns there were never detected).
#[tokio::test(start_paused = true)]
async fn a_paging_time_of_duration_max_pages_to_the_bound() {
    let node = burst_node(0, true);
    let provider = PairedNodeProvider::new(Arc::new(SlowNode(node, Duration::from_secs(1))))
        .with_paging_time(Duration::MAX);
    let out = provider
        .check(&paired_link(Some(json!({"uuid": "i0"}))), &[])
        .await;
    match out {
        CheckOutcome::HumanTurns { turns, .. } => {
            assert_eq!(
                turns as usize,
                MAX_PAGES * PAGE_ITEMS / 2,
                "the whole burst"
            );
        }
        other => panic!("{other:?}"),
    }
}

/// Bug: when the items within the paging bound held no human turn (a long run of replies
/// after the person typed), the marker moved past the turns without recording them, and no
/// watcher was ever told. The first check stores where it stopped; the second records them.
#[tokio::test]
async fn turns_before_a_run_of_replies_longer_than_the_paging_bound_are_recorded_next_tick() {
    let bound = MAX_PAGES * PAGE_ITEMS;
    let top = format!("new{}", bound - 1);
    let top_anchors: Vec<String> = (2..6).map(|i| format!("new{}", bound - i)).collect();
    let resume = json!({"uuid": "i0", "resume": {"before": "11", "top": top,
        "top_anchors": top_anchors}});
    let moved = json!({"uuid": top, "anchors": top_anchors});
    let provider = PairedNodeProvider::new(burst_node(10, false));
    assert_eq!(
        provider
            .check(&paired_link(Some(json!({"uuid": "i0"}))), &[])
            .await,
        CheckOutcome::Unchanged {
            marker: resume.clone()
        },
        "nothing to record within the bound, but the place to go on from"
    );
    assert_eq!(
        provider
            .check(&paired_link(Some(resume.clone())), &[])
            .await,
        human_turns(10, "old9@11", moved.clone())
    );

    // Through the monitor: the watcher is told on the second tick.
    let w = world();
    let session = w.watched_paired_thread(json!({"uuid": "i0"})).await;
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(PairedNodeProvider::new(burst_node(10, false))))
        .build();
    let marker = async || w.store.link(&session).await.unwrap().unwrap().marker;
    monitor.tick().await;
    assert!(
        w.events(&session, EventKind::HumanDirectMessage)
            .await
            .is_empty()
    );
    assert_eq!(marker().await, Some(resume));
    monitor.tick().await;
    let events = w.events(&session, EventKind::HumanDirectMessage).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].payload.as_ref().unwrap()["turns"], json!(10));
    assert_eq!(marker().await, Some(moved));
    let told = w.queue.peek(&common::k("agent:main:main"));
    assert_eq!(told.len(), 1, "{told:?}");
    monitor.tick().await;
    assert_eq!(w.human_events(&session).await, 1);
}

/// A node still loading its thread: its first `empty` answers to a read from the newest item
/// hold no item, but an older cursor, each after `delay`.
struct LoadingNode {
    inner: Arc<FakeNode>,
    empty: AtomicUsize,
    delay: Duration,
}

#[async_trait]
impl PairedNodeClient for LoadingNode {
    async fn newest(
        &self,
        host_id: &str,
        thread_id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<PairedPage, PairedError> {
        let Ok(left) = self
            .empty
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        else {
            return self.inner.newest(host_id, thread_id, before, limit).await;
        };
        tokio::time::sleep(self.delay).await;
        // A cursor of its own for each page (the thread's end, or past it: read as the end).
        let held = self.inner.items.lock().unwrap().len();
        Ok(PairedPage {
            items: Vec::new(),
            older: Some((held + left - 1).to_string()),
        })
    }
}

/// Bug (review, stop 53): a check that reached the paging bound before any item came (a node
/// answering empty pages with older cursors: one first page slower than the paging time, or a
/// whole bound of them) stored a resume point without a `top`. The check that read that
/// segment counted its turns and left the marker where it was; the check after read the same
/// items again from the newest one, named without the cursor, and recorded them a second time.
/// Such a check now concludes nothing, and a resume point stored so is not followed.
#[tokio::test(start_paused = true)]
async fn a_paging_bound_reached_before_any_item_concludes_nothing() {
    let thread = || {
        FakeNode::holding([
            PairedItem::user("m", "read before"),
            PairedItem::user("h1", "typed one"),
            PairedItem::with_role("r1", "assistant", "ok"),
            PairedItem::user("h2", "typed two"),
        ])
    };
    let stays = json!({"uuid": "m"});
    let moved = json!({"uuid": "h2", "anchors": ["r1", "h1", "m"]});
    // One first page slower than the paging time, or a bound of empty pages.
    for (empty, delay) in [(1, Duration::from_secs(31)), (MAX_PAGES, Duration::ZERO)] {
        let provider = PairedNodeProvider::new(Arc::new(LoadingNode {
            inner: thread(),
            empty: AtomicUsize::new(empty),
            delay,
        }));
        let mut outcomes = Vec::new();
        let mut marker = stays.clone();
        for _ in 0..3 {
            let out = provider
                .check(&paired_link(Some(marker.clone())), &[])
                .await;
            marker = match &out {
                CheckOutcome::Unchanged { marker } | CheckOutcome::HumanTurns { marker, .. } => {
                    marker.clone()
                }
                other => panic!("{other:?}"),
            };
            outcomes.push(out);
        }
        assert_eq!(
            outcomes,
            [
                CheckOutcome::Unchanged {
                    marker: stays.clone()
                },
                human_turns(2, "h2", moved.clone()),
                CheckOutcome::Unchanged {
                    marker: moved.clone()
                },
            ],
            "{empty} empty page(s): the two turns once"
        );
    }
    // A resume point stored so by an earlier version: the check reads from the newest item.
    let provider = PairedNodeProvider::new(thread());
    let stored = json!({"uuid": "m", "resume": {"before": "4"}});
    assert_eq!(
        provider.check(&paired_link(Some(stored)), &[]).await,
        human_turns(2, "h2", moved)
    );
}

/// A check that reaches the paging bound before any item leaves the stored marker whole, its
/// anchors included, so the marker's item regenerated later still costs nothing. (What the
/// mutation did: the marker was written back without its anchors; review of stop 71, TJ45.)
#[tokio::test]
async fn a_paging_bound_before_any_item_keeps_the_markers_anchors() {
    let provider = PairedNodeProvider::new(Arc::new(LoadingNode {
        inner: FakeNode::holding([
            PairedItem::user("p", "older"),
            PairedItem::user("m", "read before"),
            PairedItem::user("h1", "typed"),
        ]),
        empty: AtomicUsize::new(MAX_PAGES),
        delay: Duration::ZERO,
    }));
    let stored = json!({"uuid": "m", "anchors": ["p"]});
    assert_eq!(
        provider
            .check(&paired_link(Some(stored.clone())), &[])
            .await,
        CheckOutcome::Unchanged { marker: stored },
        "the marker stays, anchors and all"
    );
}

/// A marker stored before resume points existed (`{"uuid": ...}`) reads as before, and a
/// check that has nothing to resume writes it back in the same form (a marker that moves gets
/// anchors, the items read below its new item).
#[tokio::test]
async fn a_paired_marker_stored_before_resume_points_reads_and_is_written_back_alike() {
    let node = FakeNode::holding([
        PairedItem::user("x", "old"),
        PairedItem::user("y", "typed"),
        PairedItem::with_role("z", "assistant", "ok"),
    ]);
    let provider = PairedNodeProvider::new(node);
    assert_eq!(
        provider
            .check(&paired_link(Some(json!({"uuid": "x"}))), &[])
            .await,
        human_turns(1, "y", json!({"uuid": "z", "anchors": ["y", "x"]}))
    );
    assert_eq!(
        provider
            .check(&paired_link(Some(json!({"uuid": "z"}))), &[])
            .await,
        CheckOutcome::Unchanged {
            marker: json!({"uuid": "z"})
        },
        "a marker that does not move is written back as it was"
    );
    assert_eq!(
        provider
            .check(&paired_link(Some(json!({"uuid": null}))), &[])
            .await,
        human_turns(2, "y", json!({"uuid": "z", "anchors": ["y", "x"]}))
    );
    for stored in [
        json!({"uuid": "x"}),
        json!({"uuid": null}),
        json!({"uuid": "x", "resume": {"before": "7", "top": "z"}}),
        json!({"uuid": null, "resume": {"before": "7"}}),
    ] {
        let read = PairedMarker::from_value(&stored).expect("a paired marker");
        assert_eq!(read.to_value(), stored);
    }
}

/// A thread adopted empty (`{"uuid": null}`) and still empty is read as unchanged without a
/// warning: an empty answer is what such a thread gives at every check. The warning that the
/// node answered no items is for a marker naming an item. (What the mutation did: every check
/// of a thread adopted empty and still empty warned that the node answered no items; review of
/// stop 72, MT50.)
#[tokio::test]
async fn a_thread_adopted_empty_and_still_empty_is_not_warned_of() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let provider = PairedNodeProvider::new(FakeNode::holding([]));
    for marker in [json!({"uuid": null}), json!({"uuid": "i0"})] {
        assert_eq!(
            provider
                .check(&paired_link(Some(marker.clone())), &[])
                .await,
            CheckOutcome::Unchanged { marker }
        );
    }
    let warned: Vec<String> = capture
        .lines()
        .into_iter()
        .filter(|l| l.contains("the thread answered no items") && l.ends_with("level=WARN"))
        .collect();
    assert_eq!(
        warned.len(),
        1,
        "only the marker naming an item: {warned:#?}"
    );
}

/// A resumed check ends where the thread ends when its marker item is gone (the thread was
/// rewritten: rebased to the item that was newest when the bound was hit, counting nothing),
/// or, for a thread that was empty when adopted, counts down to the thread's start.
#[tokio::test]
async fn a_resumed_check_rebases_to_its_top_when_the_marker_item_vanished() {
    let node = FakeNode::holding(
        (0..10).map(|i| PairedItem::user(format!("n{i}"), format!("rewritten {i}"))),
    );
    let provider = PairedNodeProvider::new(node.clone());
    let gone = json!({"uuid": "gone", "resume": {"before": "6", "top": "n7"}});
    assert_eq!(
        provider.check(&paired_link(Some(gone)), &[]).await,
        CheckOutcome::Rebased {
            marker: json!({"uuid": "n7"})
        }
    );
    assert_eq!(node.calls.load(Ordering::SeqCst), 1);
    // Items newer than the top are read by the next check, as after any check.
    assert_eq!(
        provider
            .check(&paired_link(Some(json!({"uuid": "n7"}))), &[])
            .await,
        human_turns(2, "n9", json!({"uuid": "n9", "anchors": ["n8", "n7"]}))
    );
    // Empty when adopted: everything older than the stored cursor counts.
    let empty_then = json!({"uuid": null, "resume": {"before": "6", "top": "n7"}});
    assert_eq!(
        provider.check(&paired_link(Some(empty_then)), &[]).await,
        human_turns(6, "n5@6", json!({"uuid": "n7"}))
    );
}

/// A burst takes as many checks as it needs: a check that hits the bound again keeps the
/// marker and the top and moves the cursor on; items added meanwhile wait for the check after.
#[tokio::test]
async fn a_paired_burst_is_read_in_as_many_checks_as_it_takes() {
    let mut items = Vec::new();
    items.push(PairedItem::user("i0", "read before"));
    items.extend((0..120).map(|i| PairedItem::user(format!("t{i}"), format!("turn {i}"))));
    let node = FakeNode::holding(items);
    let provider = PairedNodeProvider::new(node.clone()).with_max_pages(1);
    let top_anchors = json!(["t118", "t117", "t116", "t115"]);
    let first = json!({"uuid": "i0", "resume": {"before": "71", "top": "t119",
        "top_anchors": top_anchors}});
    assert_eq!(
        provider
            .check(&paired_link(Some(json!({"uuid": "i0"}))), &[])
            .await,
        human_turns(50, "t119", first.clone())
    );
    node.items
        .lock()
        .unwrap()
        .push(PairedItem::user("t120", "typed meanwhile"));
    let second = json!({"uuid": "i0", "resume": {"before": "21", "top": "t119",
        "top_anchors": top_anchors}});
    assert_eq!(
        provider.check(&paired_link(Some(first)), &[]).await,
        human_turns(50, "t69@71", second.clone())
    );
    assert_eq!(
        provider.check(&paired_link(Some(second)), &[]).await,
        human_turns(
            20,
            "t19@21",
            json!({"uuid": "t119", "anchors": top_anchors})
        )
    );
    assert_eq!(
        provider
            .check(&paired_link(Some(json!({"uuid": "t119"}))), &[])
            .await,
        human_turns(1, "t120", json!({"uuid": "t120", "anchors": ["t119"]}))
    );
}

/// `node`'s pages, with cursors of 20,000 bytes: too long to keep in a marker.
struct LongCursors(Arc<FakeNode>);

#[async_trait]
impl PairedNodeClient for LongCursors {
    async fn newest(
        &self,
        host_id: &str,
        thread_id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<PairedPage, PairedError> {
        let before = before.map(|b| b.split(':').next().unwrap_or(b).to_owned());
        let mut page = self
            .0
            .newest(host_id, thread_id, before.as_deref(), limit)
            .await?;
        page.older = page.older.map(|o| format!("{o}:{}", "x".repeat(20_000)));
        Ok(page)
    }
}

/// A burst past the paging bound on a node whose cursors are too long for a marker: the turns
/// read are counted and the marker moves to the newest item (the older turns are given up),
/// where a marker keeping the cursor would be refused by the store at every check and the link
/// would never move.
#[tokio::test]
async fn a_paging_cursor_too_long_for_a_marker_gives_up_the_older_items() {
    let mut items = vec![PairedItem::user("i0", "read before")];
    items.extend((0..120).map(|i| PairedItem::user(format!("t{i}"), format!("turn {i}"))));
    let node = FakeNode::holding(items);
    let provider = PairedNodeProvider::new(Arc::new(LongCursors(node))).with_max_pages(1);
    let out = provider
        .check(&paired_link(Some(json!({"uuid": "i0"}))), &[])
        .await;
    // The anchors the resume point would have kept go with the marker to the newest item.
    let newest = json!({"uuid": "t119", "anchors": ["t118", "t117", "t116", "t115"]});
    assert_eq!(out, human_turns(50, "t119", newest));
}

/// A burst past the paging bound whose item ids are too long to keep as anchors keeps its
/// resume point (without the anchors), and the checks after count the rest: every turn of
/// the burst. (The resume point's top anchors kept, a mutation every test passed, the marker
/// was still too long, the resume point was given up, and 70 of the 120 turns were never
/// counted: review of stop 61.)
#[tokio::test]
async fn a_resume_point_whose_anchors_are_too_long_is_kept_without_them() {
    let long = |i: usize| format!("{i:05}{}", "t".repeat(5_000));
    let mut items = vec![PairedItem::user("i0", "read before")];
    items.extend((0..120).map(|i| PairedItem::user(long(i), format!("turn {i}"))));
    let provider = PairedNodeProvider::new(FakeNode::holding(items)).with_max_pages(1);
    let mut marker = json!({"uuid": "i0"});
    let mut total = 0;
    for _ in 0..5 {
        let out = provider
            .check(&paired_link(Some(marker.clone())), &[])
            .await;
        total += turns(&out);
        marker = paired_marker_of(&out);
    }
    assert_eq!(total, 120, "every turn of the burst");
}

/// Answers the newest page of `node`, and `error` for every older page.
struct NoOlderPages {
    node: Arc<FakeNode>,
    error: PairedError,
}

#[async_trait]
impl PairedNodeClient for NoOlderPages {
    async fn newest(
        &self,
        host_id: &str,
        thread_id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<PairedPage, PairedError> {
        if before.is_some() {
            return Err(self.error.clone());
        }
        self.node.newest(host_id, thread_id, before, limit).await
    }
}

/// Answers every page with the same item and the same older cursor.
struct StuckCursor;

#[async_trait]
impl PairedNodeClient for StuckCursor {
    async fn newest(
        &self,
        _: &str,
        _: &str,
        _: Option<&str>,
        _: usize,
    ) -> Result<PairedPage, PairedError> {
        Ok(PairedPage {
            items: vec![PairedItem::user("again", "the same turn")],
            older: Some("again".into()),
        })
    }
}

/// A check that fails midway concludes nothing (the monitor keeps the marker, resume point
/// and all); a stored cursor the node no longer knows, on a thread it still has, rebases to
/// the top, and one it gave in the same check fails the check; a node that answers the cursor it was asked with fails instead of counting the
/// same items again.
#[tokio::test]
async fn a_resumed_check_that_fails_or_is_refused_its_cursor() {
    let node =
        FakeNode::holding((0..60).map(|i| PairedItem::user(format!("n{i}"), format!("turn {i}"))));
    let resume = json!({"uuid": "n0", "resume": {"before": "6", "top": "n7"}});
    let unavailable = PairedNodeProvider::new(Arc::new(NoOlderPages {
        node: node.clone(),
        error: PairedError::Unavailable("link down".into()),
    }));
    assert_eq!(
        unavailable
            .check(&paired_link(Some(resume.clone())), &[])
            .await,
        CheckOutcome::Failed("link down".into())
    );
    assert_eq!(
        unavailable
            .check(&paired_link(Some(json!({"uuid": "n0"}))), &[])
            .await,
        CheckOutcome::Failed("link down".into()),
        "the second page failed: nothing concluded from the first"
    );
    let refused = PairedNodeProvider::new(Arc::new(NoOlderPages {
        node: node.clone(),
        error: PairedError::NotFound,
    }));
    assert_eq!(
        refused.check(&paired_link(Some(resume.clone())), &[]).await,
        CheckOutcome::Rebased {
            marker: json!({"uuid": "n7"})
        }
    );
    // Bug: a cursor the node gave in the same check and then refused (it restarted midway)
    // counted as the thread gone; three such checks removed the link of a live thread.
    assert!(matches!(
        refused.check(&paired_link(Some(json!({"uuid": "n0"}))), &[]).await,
        CheckOutcome::Failed(why) if why.contains("no longer knows the older cursor")
    ));
    node.gone.store(true, Ordering::SeqCst);
    assert_eq!(
        refused.check(&paired_link(Some(resume)), &[]).await,
        CheckOutcome::Missing,
        "the thread itself is gone"
    );
    assert!(matches!(
        PairedNodeProvider::new(Arc::new(StuckCursor))
            .check(&paired_link(Some(json!({"uuid": "i0"}))), &[])
            .await,
        CheckOutcome::Failed(why) if why.contains("cursor")
    ));
}

/// Bug (found in review): a resumed segment was named by its newest human turn alone. When the
/// marker of the check that hit the bound was not stored (a failed write, a stopped task), the
/// check was made again from the newest items, whose window had moved on by one item; the
/// resumed read then ended at the same turn, took its name, and its older turns were recorded
/// as a duplicate of the first event: never reported. A resumed segment is also named by the
/// cursor it started from.
#[tokio::test]
async fn a_resumed_segment_is_not_taken_for_the_segment_of_a_check_made_again() {
    let mut items = Vec::new();
    items.push(PairedItem::user("i0", "read before"));
    items.extend((0..10).map(|i| PairedItem::user(format!("old{i}"), format!("turn {i}"))));
    items.push(PairedItem::user("h", "the last turn"));
    items.extend(
        (0..MAX_PAGES * PAGE_ITEMS - 1)
            .map(|i| PairedItem::with_role(format!("r{i}"), "assistant", "ok")),
    );
    let node = FakeNode::holding(items);
    let provider = PairedNodeProvider::new(node.clone());
    let before = paired_link(Some(json!({"uuid": "i0"})));
    let CheckOutcome::HumanTurns {
        turns: 1,
        dedupe_id: first,
        ..
    } = provider.check(&before, &[]).await
    else {
        panic!("the first check counts the one turn within the bound");
    };
    // Its marker is not stored; one more reply comes; the check is made again.
    node.items
        .lock()
        .unwrap()
        .push(PairedItem::with_role("late", "assistant", "ok"));
    let CheckOutcome::Unchanged { marker } = provider.check(&before, &[]).await else {
        panic!("no turn within the moved window");
    };
    let CheckOutcome::HumanTurns {
        turns, dedupe_id, ..
    } = provider.check(&paired_link(Some(marker)), &[]).await
    else {
        panic!("the resumed read counts the turns left");
    };
    assert_eq!(turns, 11);
    assert_ne!(
        dedupe_id, first,
        "the older turns would be recorded as a duplicate of the first event"
    );
}

// ----- anchors: the marker's item deleted or regenerated -----------------------------------------

/// The marker an outcome of the paired-node provider leaves.
fn paired_marker_of(outcome: &CheckOutcome) -> Value {
    match outcome {
        CheckOutcome::Unchanged { marker }
        | CheckOutcome::Rebased { marker }
        | CheckOutcome::HumanTurns { marker, .. } => marker.clone(),
        other => panic!("expected a marker, got {other:?}"),
    }
}

/// `h0 a0 h1 a1 ...`: a person's turn (`h<i>`) at even indexes, a reply (`a<i>`) at odd ones.
fn dialogue(n: usize) -> Vec<PairedItem> {
    (0..n)
        .map(|i| {
            if i % 2 == 0 {
                PairedItem::user(format!("h{i}"), format!("turn {i}"))
            } else {
                PairedItem::with_role(format!("a{i}"), "assistant", "ok")
            }
        })
        .collect()
}

/// Removes the newest `n` items of `node`'s thread and appends `then`.
fn rewrite_newest(node: &FakeNode, n: usize, then: impl IntoIterator<Item = PairedItem>) {
    let mut items = node.items.lock().unwrap();
    let keep = items.len() - n;
    items.truncate(keep);
    items.extend(then);
}

/// Bug (review): the marker was the newest item's id alone. A chat UI's "regenerate" replaces
/// the newest reply, so the next check paged back without meeting it: on a thread within the
/// paging bound it reached the start and rebased, and the turn the person typed after the
/// regenerated reply was never recorded. The marker keeps the ids of the items just older than
/// its own (its anchors), and a read stops at the nearest one that is left.
#[tokio::test]
async fn a_regenerated_reply_under_the_marker_loses_no_turn_typed_after_it() {
    let node = FakeNode::holding(dialogue(4));
    let provider = PairedNodeProvider::new(node.clone());
    let marker = json!({"uuid": "a3", "anchors": ["h2", "a1", "h0"]});
    assert_eq!(
        provider
            .check(&paired_link(Some(json!({"uuid": "h0"}))), &[])
            .await,
        human_turns(1, "h2", marker.clone()),
        "the marker keeps the items below its own"
    );
    // The reply is regenerated: removed first, then written again under a new id.
    rewrite_newest(&node, 1, []);
    assert_eq!(
        provider
            .check(&paired_link(Some(marker.clone())), &[])
            .await,
        CheckOutcome::Unchanged {
            marker: marker.clone()
        },
        "nothing newer than the nearest anchor left: nothing to count, nothing to rebase"
    );
    rewrite_newest(
        &node,
        0,
        [
            PairedItem::with_role("a3b", "assistant", "ok again"),
            PairedItem::user("h4", "typed after the regenerated reply"),
        ],
    );
    assert_eq!(
        provider.check(&paired_link(Some(marker)), &[]).await,
        human_turns(
            1,
            "h4",
            json!({"uuid": "h4", "anchors": ["a3b", "h2", "a1", "h0"]})
        ),
        "the one turn typed after the old marker, not a rebase"
    );
}

/// The same on a thread longer than the paging bound: the read used to page back to the bound
/// and record the thread's old history as new turns, segment by segment.
#[tokio::test]
async fn a_regenerated_reply_on_a_thread_longer_than_the_paging_bound_counts_no_old_history() {
    let node = FakeNode::holding(dialogue(3_000));
    let provider = PairedNodeProvider::new(node.clone());
    let marker = json!({"uuid": "a2999", "anchors": ["h2998", "a2997", "h2996", "a2995"]});
    assert_eq!(
        provider
            .check(&paired_link(Some(json!({"uuid": "a2995"}))), &[])
            .await,
        human_turns(2, "h2998", marker.clone()),
        "at most four anchors"
    );
    rewrite_newest(
        &node,
        1,
        [
            PairedItem::with_role("a2999b", "assistant", "ok again"),
            PairedItem::user("h3000", "typed after the regenerated reply"),
        ],
    );
    let calls = node.calls.load(Ordering::SeqCst);
    let next = json!({"uuid": "h3000", "anchors": ["a2999b", "h2998", "a2997", "h2996"]});
    assert_eq!(
        provider.check(&paired_link(Some(marker)), &[]).await,
        human_turns(1, "h3000", next.clone()),
        "the one new turn, no segment of old history"
    );
    assert_eq!(
        node.calls.load(Ordering::SeqCst) - calls,
        1,
        "one page, not paging back to the bound"
    );
    assert_eq!(
        provider.check(&paired_link(Some(next.clone())), &[]).await,
        CheckOutcome::Unchanged { marker: next }
    );
}

/// A turn edited by the person (it and the reply after it replaced) takes the marker's item and
/// its nearest anchor: the next anchor left is where the read stops.
#[tokio::test]
async fn a_read_stops_at_the_nearest_anchor_left() {
    let marker = json!({"uuid": "a7", "anchors": ["h6", "a5", "h4", "a3"]});
    for (gone, anchors) in [
        (2, json!(["h8b", "a5", "h4", "a3"])),
        (3, json!(["h8b", "h4", "a3"])),
        (4, json!(["h8b", "a3"])),
    ] {
        let node = FakeNode::holding(dialogue(8));
        rewrite_newest(
            &node,
            gone,
            [
                PairedItem::user("h8b", "the turn as edited"),
                PairedItem::with_role("a9b", "assistant", "ok"),
            ],
        );
        assert_eq!(
            PairedNodeProvider::new(node)
                .check(&paired_link(Some(marker.clone())), &[])
                .await,
            human_turns(1, "h8b", json!({"uuid": "a9b", "anchors": anchors})),
            "{gone} newest items gone"
        );
    }
    // The marker such a thread had: its newest item, and the four before it.
    assert_eq!(
        paired_marker_of(
            &PairedNodeProvider::new(FakeNode::holding(dialogue(8)))
                .check(&paired_link(Some(json!({"uuid": "h2"}))), &[])
                .await
        ),
        marker
    );
}

/// With the marker's item and every anchor gone, a thread is taken as rewritten, as before
/// anchors: rebased at its start (the rebase keeping the items read below the new marker as
/// its anchors), and read as a burst at the paging bound on a longer thread.
#[tokio::test]
async fn with_every_anchor_gone_a_thread_is_rebased_or_read_to_the_bound_as_before() {
    let rewritten = [
        PairedItem::user("new", "typed"),
        PairedItem::with_role("reply", "assistant", "ok"),
    ];
    let node = FakeNode::holding(dialogue(8));
    rewrite_newest(&node, 5, rewritten.clone());
    let marker = json!({"uuid": "a7", "anchors": ["h6", "a5", "h4", "a3"]});
    assert_eq!(
        PairedNodeProvider::new(node)
            .check(&paired_link(Some(marker)), &[])
            .await,
        CheckOutcome::Rebased {
            marker: json!({"uuid": "reply", "anchors": ["new", "h2", "a1", "h0"]})
        }
    );

    let bound = MAX_PAGES * PAGE_ITEMS;
    let node = FakeNode::holding(dialogue(3_000));
    rewrite_newest(&node, 5, rewritten);
    let marker = json!({"uuid": "a2999", "anchors": ["h2998", "a2997", "h2996", "a2995"]});
    // 2,997 items: the bound reads indexes 2,996 down to 497.
    let mut resume = marker.clone();
    resume["resume"] = json!({
        "before": (2_997 - bound).to_string(),
        "top": "reply",
        "top_anchors": ["new", "h2994", "a2993", "h2992"],
    });
    assert_eq!(
        PairedNodeProvider::new(node)
            .check(&paired_link(Some(marker)), &[])
            .await,
        human_turns(bound / 2, "new", resume),
        "a segment at the bound, the marker and its anchors kept"
    );
}

/// A resumed check that hits the paging bound again moves only its cursor on: the marker's
/// anchors stay, so the marker's item regenerated before the segment is read through still
/// leaves the read an anchor to stop at, and the segment's turns are counted. (What the
/// mutation did: the anchors were dropped at the second bound, the read then reached the
/// thread's start and rebased, losing the segment's 20 turns; review of stop 71, TJ40.)
#[tokio::test]
async fn a_resumed_check_at_the_bound_again_keeps_the_markers_anchors() {
    let mut items = vec![
        PairedItem::user("m0", "old"),
        PairedItem::with_role("r", "assistant", "reply read before"),
    ];
    items.extend((0..120).map(|i| PairedItem::user(format!("t{i}"), format!("turn {i}"))));
    let node = FakeNode::holding(items);
    let provider = PairedNodeProvider::new(node.clone()).with_max_pages(1);
    let mut marker = json!({"uuid": "r", "anchors": ["m0"]});
    for _ in 0..2 {
        marker = paired_marker_of(&provider.check(&paired_link(Some(marker)), &[]).await);
    }
    // The reply under the marker regenerated (in place: the node's cursors stay).
    node.items.lock().unwrap()[1] = PairedItem::with_role("r2", "assistant", "regenerated");
    assert_eq!(
        provider.check(&paired_link(Some(marker)), &[]).await,
        human_turns(
            20,
            "t19@22",
            json!({"uuid": "t119", "anchors": ["t118", "t117", "t116", "t115"]})
        ),
        "the last segment counted, stopping at the anchor"
    );
}

/// A check that first hits the paging bound keeps the items just below its top
/// (`top_anchors`); the resumed check that reaches the marker moves it to the top with them,
/// and the marker so stored survives the top's regeneration. A resumed check that reaches the
/// start without the marker's item rebases to the top with them too.
#[tokio::test]
async fn a_resumed_check_moves_the_marker_to_its_top_with_the_top_anchors() {
    let w = world();
    let session = w.watched_paired_thread(json!({"uuid": "i0"})).await;
    let mut items = vec![PairedItem::user("i0", "read before")];
    items.extend((0..120).map(|i| PairedItem::user(format!("t{i}"), format!("turn {i}"))));
    let node = FakeNode::holding(items);
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(
            PairedNodeProvider::new(node.clone()).with_max_pages(1),
        ))
        .build();
    let marker = async || w.store.link(&session).await.unwrap().unwrap().marker;
    let top_anchors = json!(["t118", "t117", "t116", "t115"]);
    monitor.tick().await;
    assert_eq!(
        marker().await,
        Some(
            json!({"uuid": "i0", "resume": {"before": "71", "top": "t119",
            "top_anchors": top_anchors}})
        )
    );
    monitor.tick().await;
    assert_eq!(
        marker().await,
        Some(
            json!({"uuid": "i0", "resume": {"before": "21", "top": "t119",
            "top_anchors": top_anchors}})
        ),
        "a check that hits the bound again keeps them"
    );
    monitor.tick().await;
    assert_eq!(
        marker().await,
        Some(json!({"uuid": "t119", "anchors": top_anchors}))
    );
    assert_eq!(w.human_events(&session).await, 3);
    // The top is deleted (regenerated), and the person types.
    rewrite_newest(&node, 1, [PairedItem::user("t120", "typed after it")]);
    monitor.tick().await;
    let events = w.events(&session, EventKind::HumanDirectMessage).await;
    assert_eq!(events.len(), 4);
    assert_eq!(
        events[3].payload.as_ref().and_then(|p| p.get("turns")),
        None,
        "one turn (`turns` is written from 2 on)"
    );
    assert_eq!(
        marker().await,
        Some(json!({"uuid": "t120", "anchors": ["t118", "t117", "t116", "t115"]}))
    );

    let rewritten = FakeNode::holding(
        (0..10).map(|i| PairedItem::user(format!("n{i}"), format!("rewritten {i}"))),
    );
    let gone = json!({"uuid": "gone", "anchors": ["gone too"],
        "resume": {"before": "6", "top": "n7", "top_anchors": ["n6"]}});
    assert_eq!(
        PairedNodeProvider::new(rewritten)
            .check(&paired_link(Some(gone)), &[])
            .await,
        CheckOutcome::Rebased {
            marker: json!({"uuid": "n7", "anchors": ["n6"]})
        }
    );
}

/// Markers stored before anchors still read and still work: a resume point stored without
/// `top_anchors` reads on and moves the marker to its `top`, without anchors (a marker
/// without a resume point: `a_paired_marker_stored_before_resume_points_reads_and_is_written_back_alike`).
/// The forms this version writes read back alike, more than four anchors (a marker edited by
/// hand) are cut to four, and anchors too long for the store are left out.
#[tokio::test]
async fn a_paired_marker_stored_before_anchors_reads_and_works() {
    // A marker without anchors, moved and kept: see
    // `a_paired_marker_stored_before_resume_points_reads_and_is_written_back_alike`.
    // A resume point stored before anchors: no `top_anchors`, and the top gets none.
    let mut items = vec![PairedItem::user("i0", "read before")];
    items.extend((0..120).map(|i| PairedItem::user(format!("t{i}"), format!("turn {i}"))));
    let provider = PairedNodeProvider::new(FakeNode::holding(items)).with_max_pages(1);
    let old = json!({"uuid": "i0", "resume": {"before": "71", "top": "t119"}});
    let still = json!({"uuid": "i0", "resume": {"before": "21", "top": "t119"}});
    assert_eq!(
        provider.check(&paired_link(Some(old)), &[]).await,
        human_turns(50, "t69@71", still.clone())
    );
    assert_eq!(
        provider.check(&paired_link(Some(still)), &[]).await,
        human_turns(20, "t19@21", json!({"uuid": "t119"}))
    );

    for stored in [
        json!({"uuid": "x", "anchors": ["w", "v"]}),
        json!({"uuid": "x", "anchors": ["w"], "resume": {"before": "7", "top": "z",
            "top_anchors": ["y"]}}),
        json!({"uuid": "x", "resume": {"before": "7", "top": "z", "top_anchors": ["y"]}}),
    ] {
        let read = PairedMarker::from_value(&stored).expect("a paired marker");
        assert_eq!(read.to_value(), stored);
    }
    let edited = json!({"uuid": "x", "anchors": ["a", "b", "c", "d", "e", "f"]});
    assert_eq!(
        PairedMarker::from_value(&edited).map(|m| m.to_value()),
        Some(json!({"uuid": "x", "anchors": ["a", "b", "c", "d"]}))
    );
    // Anchors too long for a marker the store accepts (16 KiB) are left out: the marker
    // stays one the store takes, and works as one without them.
    let long = |c: &str| c.repeat(6_000);
    let provider = PairedNodeProvider::new(FakeNode::holding([
        PairedItem::user(long("x"), "old"),
        PairedItem::user(long("y"), "typed"),
        PairedItem::with_role(long("z"), "assistant", "ok"),
    ]));
    let out = provider
        .check(&paired_link(Some(json!({"uuid": long("x")}))), &[])
        .await;
    assert_eq!(out, human_turns(1, &long("y"), json!({"uuid": long("z")})));
}

// ----- review: turns lost as dedupe duplicates, or counted from a marker not ours ---------------

/// A person's prompt without a `uuid` (as another writer may leave it).
fn user_row_without_uuid(text: &str) -> Value {
    json!({"type": "user", "isSidechain": false, "message": {"role": "user", "content": text}})
}

/// The dedupe id of a check that found human turns.
fn dedupe_id_of(outcome: &CheckOutcome) -> String {
    match outcome {
        CheckOutcome::HumanTurns { dedupe_id, .. } => dedupe_id.clone(),
        other => panic!("expected human turns, got {other:?}"),
    }
}

/// Bug (review): a turn without a uuid was named by its file (device, inode) and line offset
/// alone. After a transcript was truncated in place (`: > F`, the same inode), a new prompt
/// written at an offset a recorded one had got the same dedupe id: the store answered with the
/// old event, and the new turn was never recorded. A rebase gives the marker a new generation,
/// which the id names.
#[tokio::test(start_paused = true)]
async fn a_turn_without_a_uuid_after_a_truncation_is_recorded_as_its_own_event() {
    let (w, t, session) = worker_adopted().await;
    let monitor = w.monitor().build();
    t.line(&user_row_without_uuid("first, at offset 0"));
    monitor.tick().await;
    assert_eq!(w.human_events(&session).await, 1);
    File::create(&t.path).unwrap(); // truncated in place: the same inode
    monitor.tick().await; // rebased
    assert_eq!(w.human_events(&session).await, 1);
    t.line(&user_row_without_uuid("second, at offset 0 again"));
    monitor.tick().await;
    assert_eq!(
        w.human_events(&session).await,
        2,
        "the turn typed after the truncation is its own event"
    );
}

/// The generation a rebase gives is kept by the reads that follow, so the same lines read
/// again from the same marker keep their ids (a retry after a failed marker move records
/// nothing twice); a marker without one (written before generations existed) still reads.
#[test]
fn a_fallback_id_is_kept_by_a_reread_and_changed_by_a_rebase() {
    let t = Transcript::new();
    let adopted = jsonl::marker_at_end(&t.path).unwrap();
    assert_ne!(adopted.generation, 0);
    t.line(&user_row_without_uuid("typed"));
    let out = scan(&t, &adopted);
    let first = dedupe_id_of(&out);
    assert_eq!(dedupe_id_of(&scan(&t, &adopted)), first, "read again");
    let read = marker_of(&out);
    assert_eq!(
        read.generation, adopted.generation,
        "a forward read keeps it"
    );

    File::create(&t.path).unwrap();
    let rebased = marker_of(&scan(&t, &read));
    assert_ne!(
        rebased.generation, read.generation,
        "a rebase gives a new one"
    );
    t.line(&user_row_without_uuid("typed after the truncation"));
    let second = dedupe_id_of(&scan(&t, &rebased));
    assert_ne!(
        second, first,
        "the same offset after a truncation is another turn"
    );
    assert_eq!(dedupe_id_of(&scan(&t, &rebased)), second, "read again");

    let old = JsonlMarker {
        generation: 0,
        ..rebased
    };
    let stored = old.to_value();
    assert_eq!(stored.get("generation"), None, "stored as before");
    let old = JsonlMarker::from_value(&stored).expect("an old marker still reads");
    assert_eq!(old.generation, 0);
    let out = scan(&t, &old);
    assert_eq!(turns(&out), 1);
    // Its turns keep the ids of then (decision 0004), so that lines read again after an
    // upgrade are not recorded twice. (Named with a generation of zeros, a mutation every
    // test passed: review of stop 61.)
    assert_eq!(
        dedupe_id_of(&out),
        format!("{}:{}:{}", old.dev, old.ino, old.offset)
    );
}

/// Each rebase gives the marker a generation of its own, so a line written at an offset where
/// a recorded one was is a new turn after every truncation, not only after the first. (What
/// the mutation did: a rebased marker carried no generation, so the turn typed after a second
/// truncation was named as the one typed after the first, taken for it and never recorded;
/// review of stop 71, TJ33.)
#[test]
fn each_truncation_gives_the_turns_after_it_ids_of_their_own() {
    let t = Transcript::new();
    let mut m = jsonl::marker_at_end(&t.path).unwrap();
    let mut ids: Vec<String> = Vec::new();
    for round in 0..3 {
        t.line(&user_row_without_uuid(&format!(
            "typed at offset 0, round {round}"
        )));
        let out = scan(&t, &m);
        let id = dedupe_id_of(&out);
        assert!(
            !ids.contains(&id),
            "round {round}: {id} named as an earlier turn: {ids:?}"
        );
        ids.push(id);
        File::create(&t.path).unwrap(); // truncated in place: the same inode
        let rebased = scan(&t, &marker_of(&out));
        assert!(
            matches!(rebased, CheckOutcome::Rebased { .. }),
            "{rebased:?}"
        );
        m = marker_of(&rebased);
    }
}

/// A turn without a uuid read from a bare `{"offset": N}` (another reader of the link wrote
/// the marker back without our fields) is named by the file's device, as the same line read
/// from the marker that read made is: such a write-back at a line already read has it read
/// again and recognised, not recorded twice. (What the mutation did: named by device 0, so
/// the line read again after the write-back was another event; review of stop 71, TJ32.)
#[test]
fn a_bare_offset_marker_names_its_turns_as_a_full_marker_does() {
    let t = Transcript::new();
    t.line(&user_row_without_uuid("typed"));
    let bare = JsonlMarker::from_value(&json!({"offset": 0})).unwrap();
    let from_bare = dedupe_id_of(&scan(&t, &bare));
    // The same line read again from a full marker at its offset, as the first read wrote them.
    let written = marker_of(&scan(&t, &bare));
    assert_ne!(written.dev, 0);
    let full = JsonlMarker {
        offset: 0,
        size: 0,
        tail: None,
        partial: None,
        ..written
    };
    assert_eq!(
        dedupe_id_of(&scan(&t, &full)),
        from_bare,
        "the line read from a bare marker and from a full one"
    );
}

/// A transcript that cannot be read fails its check naming the path it tried. (What the
/// mutation did: the message said only the system's error, "Not a directory", and not which
/// link's file; review of stop 71, TJ28.)
#[test]
fn a_read_that_fails_names_the_transcript() {
    let t = Transcript::new();
    let m = jsonl::marker_at_end(&t.path).unwrap();
    // A path under a regular file: neither there nor "not found".
    let under_a_file = t.path.join("nested.jsonl");
    match jsonl::scan(&under_a_file, Some(&m), &[], MAX_BYTES_PER_TICK) {
        CheckOutcome::Failed(why) => assert!(
            why.contains(&under_a_file.display().to_string()),
            "{why:?} names {}",
            under_a_file.display()
        ),
        other => panic!("{other:?}"),
    }
}

/// A turn without a uuid is named by the device its marker recorded, not the file's device
/// now: after a remount that changed the device number between an event stored and its
/// marker's move (a retry reads the same lines again), the turn keeps its id and is not
/// recorded twice. (Named by the file's device, a mutation every test passed: review of stop
/// 61.)
#[test]
fn a_fallback_id_names_the_device_its_marker_recorded() {
    let t = Transcript::new();
    let mut m = jsonl::marker_at_end(&t.path).unwrap();
    // Stored before a remount gave the file another device number.
    m.dev ^= 1;
    t.line(&user_row_without_uuid("typed"));
    let id = dedupe_id_of(&scan(&t, &m));
    assert!(
        id.starts_with(&format!("{}:", m.dev)),
        "{id} (marker dev {})",
        m.dev
    );
}

/// Bug (review): any JSON object read as a paired marker, a missing `uuid` as `null` ("the
/// thread was empty when adopted"), so a marker that is not one of ours (`{}`, a transcript's
/// `{"offset": 0}`) had the thread's whole history counted as new human turns. It is rebased
/// to the newest item, counting nothing.
#[tokio::test]
async fn a_paired_marker_not_ours_is_rebased_and_counts_nothing() {
    let node = FakeNode::holding([
        PairedItem::user("x", "history"),
        PairedItem::user("y", "more history"),
        PairedItem::with_role("z", "assistant", "ok"),
    ]);
    let provider = PairedNodeProvider::new(node.clone());
    for foreign in [
        json!({}),
        json!({"offset": 0}),
        json!({"id": "x"}),
        json!({"uuid": "x", "offset": 0}),
        json!({"uuid": "x", "resume": {"before": "1", "after": "2"}}),
        json!(["x"]),
        // Keys of ours but no `uuid` (read as `null`, a mutation every test passed: review
        // of stop 61).
        json!({"anchors": ["x"]}),
    ] {
        assert_eq!(
            provider
                .check(&paired_link(Some(foreign.clone())), &[])
                .await,
            CheckOutcome::Rebased {
                marker: json!({"uuid": "z"})
            },
            "{foreign}"
        );
        assert_eq!(PairedMarker::from_value(&foreign), None, "{foreign}");
    }

    // Through the monitor: nothing is recorded, and the marker is one of ours from then on.
    let w = world();
    let session = w.watched_paired_thread(json!({"offset": 0})).await;
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(PairedNodeProvider::new(node)))
        .build();
    monitor.tick().await;
    assert_eq!(w.human_events(&session).await, 0);
    assert_eq!(
        w.store.link(&session).await.unwrap().unwrap().marker,
        Some(json!({"uuid": "z"}))
    );
}

/// Bug (review): a row's `uuid` was cut at its first 64 bytes, so two rows whose uuids share
/// them got one dedupe id and the second burst was taken for the first: never recorded. A
/// longer uuid is named by the hash of the whole value.
#[tokio::test(start_paused = true)]
async fn two_long_uuids_alike_in_their_first_64_bytes_are_two_events() {
    let (w, mut t, session) = worker_adopted().await;
    let monitor = w.monitor().build();
    let shared = "msg-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    assert!(shared.len() >= 64);
    t.line(&user_row(&format!("{shared}-first"), json!("first burst")));
    monitor.tick().await;
    assert_eq!(w.human_events(&session).await, 1);
    t.model_turn();
    t.line(&user_row(
        &format!("{shared}-second"),
        json!("second burst"),
    ));
    monitor.tick().await;
    assert_eq!(
        w.human_events(&session).await,
        2,
        "the second burst is its own event"
    );
    // Read again from the same marker, the same rows keep their id.
    let m = jsonl::marker_at_end(&t.path).unwrap();
    let long = format!("{shared}-third");
    t.line(&user_row(&long, json!("third burst")));
    let once = dedupe_id_of(&scan(&t, &m));
    assert_eq!(dedupe_id_of(&scan(&t, &m)), once);
    assert_eq!(once, format!("{:016x}", upstream::fnv1a64(long.as_bytes())));
}

// ----- the failure directions of the marker and the missing count --------------------------------

/// Refuses the next `left` event recordings with a store error (a store that failed to write
/// them); every other call goes through.
struct FailRecords {
    left: AtomicUsize,
}

#[async_trait]
impl awareness_core::testkit::hooked::Hook for FailRecords {
    fn refuse(&self, call: awareness_core::testkit::hooked::Call) -> Option<StoreError> {
        let refused = call == awareness_core::testkit::hooked::Call::Record
            && self
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        refused.then(|| StoreError::backend("record", "disk full"))
    }
}

/// The `HumanTurns` one tick published: each one's turns and what became of its marker.
fn human_turns_published(ds: &[Detection]) -> Vec<(u32, MarkerMove)> {
    ds.iter()
        .filter_map(|d| match d {
            Detection::HumanTurns { turns, marker, .. } => Some((*turns, marker.clone())),
            _ => None,
        })
        .collect()
}

/// The failures one tick published, as text.
fn failures_published(ds: &[Detection]) -> Vec<String> {
    ds.iter()
        .filter(|d| matches!(d, Detection::Failed { .. }))
        .map(ToString::to_string)
        .collect()
}

/// DESIGN.md section 8: the marker moves only after the burst's event is stored. When the
/// store fails the recording, the failure is published, no event is stored and the marker
/// stays where it was, so the next tick reads the same rows and records them: once in all,
/// with the marker moved past them then. (A marker moved before the recording, or after it
/// failed, skipped the turns for good.)
#[tokio::test(start_paused = true)]
async fn human_turns_whose_recording_fails_keep_the_marker_and_are_recorded_next_tick() {
    let (w, hooked) = common::hooked_world(FailRecords {
        left: AtomicUsize::new(0),
    });
    let mut t = Transcript::new();
    let session = w
        .adopt(&t, "agent:main:worker", "main", "agent:main:main")
        .await;
    let adopted = w.store.link(&session).await.unwrap().unwrap();
    let monitor = w.monitor().build();
    let mut rx = monitor.subscribe();

    t.human("first");
    t.human("second");
    hooked.hook.left.store(1, Ordering::SeqCst);
    let ds = tick_published(&monitor, &mut rx).await;
    assert_eq!(
        hooked.hook.left.load(Ordering::SeqCst),
        0,
        "the recording was tried"
    );
    assert_eq!(human_turns_published(&ds), [], "{:?}", texts(&ds));
    let failed = failures_published(&ds);
    assert_eq!(failed.len(), 1, "{:?}", texts(&ds));
    assert!(
        failed[0].contains("not recorded") && failed[0].contains("disk full"),
        "{failed:?}"
    );
    assert_eq!(w.human_events(&session).await, 0);
    assert_eq!(
        w.store.link(&session).await.unwrap().unwrap().marker,
        adopted.marker,
        "the marker stays"
    );

    // The store records again: the same rows are read and recorded, and the marker moves.
    let ds = tick_published(&monitor, &mut rx).await;
    assert_eq!(
        human_turns_published(&ds),
        [(2, MarkerMove::Moved)],
        "{:?}",
        texts(&ds)
    );
    assert_eq!(w.human_events(&session).await, 1);
    let moved = w.store.link(&session).await.unwrap().unwrap().marker;
    assert_eq!(
        JsonlMarker::from_value(&moved.unwrap()).unwrap().position(),
        std::fs::metadata(&t.path).unwrap().len(),
        "the marker moved past the turns"
    );
    // Nothing is left to read: the turns were recorded once in all, and told once.
    let ds = tick_published(&monitor, &mut rx).await;
    assert_eq!(human_turns_published(&ds), [], "{:?}", texts(&ds));
    assert_eq!(w.human_events(&session).await, 1);
    assert_eq!(
        w.queue
            .peek(&SessionKey::new("agent:main:main").unwrap())
            .len(),
        1
    );
}

/// What a [`FirstCheckAfter`] does before its first check: a write to the store (and the
/// transcript) that lands while the check reads.
type BeforeCheck =
    Box<dyn FnOnce(UpstreamLink) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// Reads with the JSONL provider; its first check runs `before` first, with the link it checks
/// (a watcher leaving, or a watch beginning, while the check reads).
struct FirstCheckAfter {
    inner: JsonlProvider,
    before: Mutex<Option<BeforeCheck>>,
}

impl FirstCheckAfter {
    fn new(before: BeforeCheck) -> Arc<Self> {
        Arc::new(Self {
            inner: JsonlProvider::new(),
            before: Mutex::new(Some(before)),
        })
    }
}

#[async_trait]
impl UpstreamProvider for FirstCheckAfter {
    fn kind(&self) -> &str {
        self.inner.kind()
    }

    async fn check(&self, link: &UpstreamLink, own: &[String]) -> CheckOutcome {
        let before = self.before.lock().unwrap().take();
        if let Some(before) = before {
            before(link.clone()).await;
        }
        self.inner.check(link, own).await
    }
}

/// DESIGN.md section 8: the marker moves only after the burst's event is stored. Turns found
/// in a session whose watch went during the check are not recorded (nothing watches it), and
/// the marker stays; at the next tick, the link unwatched, its rows are passed over (the
/// marker moves, nothing is recorded), so that a watch that begins later is not told of them,
/// as it is not told of the session's history before it; a turn typed once it watches is
/// recorded, once. (Until stop 56 the marker stayed while the link was unwatched, and the
/// rows were recorded once it was watched again, as OpenClaw does: decision 0004.)
#[tokio::test(start_paused = true)]
async fn human_turns_not_recorded_because_the_watch_went_keep_the_marker() {
    let (w, mut t, session) = worker_adopted().await;
    let adopted = w.store.link(&session).await.unwrap().unwrap();
    // The watcher leaves while the first check reads.
    let store = w.store.clone();
    let provider = FirstCheckAfter::new(Box::new(move |link| {
        Box::pin(async move {
            let watcher = WatcherKey::parse("agent:main:main").unwrap();
            store
                .unwatch(&watcher, &link.session.session_key)
                .await
                .unwrap();
        })
    }));
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(provider)
        .build();
    let mut rx = monitor.subscribe();
    let marker = async || w.store.link(&session).await.unwrap().unwrap().marker;

    t.human("typed while the watcher left");
    let ds = tick_published(&monitor, &mut rx).await;
    assert_eq!(human_turns_published(&ds), [], "{:?}", texts(&ds));
    let failed = failures_published(&ds);
    assert_eq!(failed.len(), 1, "{:?}", texts(&ds));
    assert!(
        failed[0].contains("nothing watches the session any more"),
        "{failed:?}"
    );
    assert_eq!(w.human_events(&session).await, 0);
    assert_eq!(marker().await, adopted.marker, "the marker stays");

    // Unwatched, the link is not checked: its rows are passed over.
    let r = monitor.tick().await;
    assert_eq!((r.checked, r.unwatched), (0, 1));
    assert_eq!(
        JsonlMarker::from_value(&marker().await.unwrap())
            .unwrap()
            .position(),
        std::fs::metadata(&t.path).unwrap().len(),
        "passed over"
    );

    // Watched again: what was typed before is not recorded; what is typed after is.
    w.store
        .watch(
            &WatcherKey::parse("agent:main:main").unwrap(),
            &session,
            Timestamp::now(),
        )
        .await
        .unwrap();
    let ds = tick_published(&monitor, &mut rx).await;
    assert_eq!(human_turns_published(&ds), [], "{:?}", texts(&ds));
    assert_eq!(w.human_events(&session).await, 0);
    t.human("typed once watched");
    let ds = tick_published(&monitor, &mut rx).await;
    assert_eq!(
        human_turns_published(&ds),
        [(1, MarkerMove::Moved)],
        "{:?}",
        texts(&ds)
    );
    assert_eq!(
        JsonlMarker::from_value(&marker().await.unwrap())
            .unwrap()
            .position(),
        std::fs::metadata(&t.path).unwrap().len()
    );
    tick_published(&monitor, &mut rx).await;
    assert_eq!(w.human_events(&session).await, 1, "recorded once");
}

/// A session the gateway drives while nothing watches it: its own prompts of that time, more
/// than the self-echo window keeps by the time a watch begins, are passed over with the rest,
/// not read as a person's turns once it is watched; and a person's turn typed before the watch
/// is not told to the new watcher, whose watch starts at the session's head (DESIGN.md
/// section 4). Both happened (review, stop 55): the link's marker stayed while it was
/// unwatched, and the backlog was judged at the first check of the watch.
#[tokio::test(start_paused = true)]
async fn what_was_written_while_nothing_watched_is_passed_over() {
    let w = world();
    let mut t = Transcript::new();
    let session = SessionRef::parse("agent:main:worker", "main").unwrap();
    w.svc
        .try_adopt(jsonl::adoption(session.clone(), &t.path, None).unwrap())
        .await
        .unwrap();
    let prompts = Arc::new(RecentPrompts::new());
    let monitor = w.monitor().own_prompts(prompts.clone()).build();
    t.human("typed before anyone watched");
    for i in 0..12 {
        let text = format!("gateway prompt number {i}");
        prompts.record(&session, text.clone());
        t.human(&text);
        t.model_turn();
        let r = monitor.tick().await;
        assert_eq!((r.unwatched, r.checked), (1, 0));
    }
    let manager = WatcherKey::parse("agent:main:main").unwrap();
    w.store
        .watch(&manager, &session, Timestamp::now())
        .await
        .unwrap();
    assert_eq!(monitor.tick().await.checked, 1);
    assert_eq!(
        w.human_events(&session).await,
        0,
        "nothing a person typed since the watch"
    );
    assert!(w.queue.peek(manager.session_key()).is_empty());
    t.human("typed once watched");
    monitor.tick().await;
    assert_eq!(w.human_events(&session).await, 1);
    assert_eq!(w.queue.peek(manager.session_key()).len(), 1);
}

/// A watch that begins while a pass over the unwatched link reads: the pass leaves the marker
/// where it was, and the next tick's check records the turn typed after the watch began. The
/// pass moved the marker past it, and the turn was never recorded (second reading, stop 56).
#[tokio::test(start_paused = true)]
async fn a_turn_typed_after_a_watch_that_began_during_a_pass_is_recorded() {
    let w = world();
    let t = Transcript::new();
    let session = SessionRef::parse("agent:main:worker", "main").unwrap();
    w.svc
        .try_adopt(jsonl::adoption(session.clone(), &t.path, None).unwrap())
        .await
        .unwrap();
    // A watch begins while the first read (the pass over the unwatched link) reads, and a
    // person types after it.
    let provider = watched_and_typed_into_during_the_first_check(
        w.store.clone(),
        t.path.clone(),
        "00000000-0000-4000-8000-999999999999",
        || {},
    );
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(provider)
        .build();
    let r = monitor.tick().await;
    assert_eq!((r.unwatched, r.checked), (1, 0));
    let r = monitor.tick().await;
    assert_eq!((r.unwatched, r.checked), (0, 1));
    assert_eq!(w.human_events(&session).await, 1);
}

/// A pass over an unwatched link that cannot tell, once it read, whether the session is watched
/// now (the store failed reading its watchers) keeps the marker: a watch began meanwhile, and the
/// turn typed after it is recorded at the next tick. (What the mutation did: only a watch seen
/// kept the marker, so a failed read moved it past the turn, which was never recorded; review of
/// stop 66, M534.)
#[tokio::test(start_paused = true)]
async fn a_pass_that_cannot_tell_whether_the_session_is_watched_keeps_the_marker() {
    let (w, hooked) = common::hooked_world(RefuseNext {
        call: awareness_core::testkit::hooked::Call::Cursors,
        left: AtomicUsize::new(0),
    });
    let t = Transcript::new();
    let session = SessionRef::parse("agent:main:worker", "main").unwrap();
    w.svc
        .try_adopt(jsonl::adoption(session.clone(), &t.path, None).unwrap())
        .await
        .unwrap();
    // While the pass reads: a watch begins, a person types, and the pass's read of the
    // session's watchers then fails.
    let refuse = hooked.clone();
    let provider = watched_and_typed_into_during_the_first_check(
        w.store.clone(),
        t.path.clone(),
        "00000000-0000-4000-8000-999999999998",
        move || refuse.hook.left.store(1, Ordering::SeqCst),
    );
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(provider)
        .build();
    let r = monitor.tick().await;
    assert_eq!((r.unwatched, r.checked), (1, 0));
    assert_eq!(
        hooked.hook.left.load(Ordering::SeqCst),
        0,
        "the pass's read of the watchers was refused"
    );
    let r = monitor.tick().await;
    assert_eq!((r.unwatched, r.checked), (0, 1));
    assert_eq!(
        w.human_events(&session).await,
        1,
        "the turn typed after the watch began is recorded"
    );
}

/// The JSONL provider, whose first check, before it reads, has `agent:main:main` begin watching
/// the link's session and a person type a turn (`uuid`) into the transcript at `path`, then runs
/// `then`.
fn watched_and_typed_into_during_the_first_check(
    store: Arc<MemoryStore>,
    path: PathBuf,
    uuid: &'static str,
    then: impl FnOnce() + Send + 'static,
) -> Arc<FirstCheckAfter> {
    FirstCheckAfter::new(Box::new(move |link| {
        Box::pin(async move {
            let watcher = WatcherKey::parse("agent:main:main").unwrap();
            store
                .watch(&watcher, &link.session, Timestamp::now())
                .await
                .unwrap();
            let row = user_row(uuid, json!("typed after the watch"));
            let mut f = OpenOptions::new().append(true).open(&path).unwrap();
            f.write_all(format!("{row}\n").as_bytes()).unwrap();
            then();
        })
    }))
}

/// The JSONL provider, except that its check panics for one session (`bad`).
struct JsonlPanicsFor {
    inner: JsonlProvider,
    bad: SessionRef,
}

impl JsonlPanicsFor {
    /// The monitor of `w` whose JSONL provider panics for `bad`.
    fn monitor(w: &World, bad: &SessionRef) -> UpstreamMonitor {
        UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
            .provider(Arc::new(Self {
                inner: JsonlProvider::new(),
                bad: bad.clone(),
            }))
            .build()
    }
}

#[async_trait]
impl UpstreamProvider for JsonlPanicsFor {
    fn kind(&self) -> &str {
        self.inner.kind()
    }

    async fn check(&self, link: &UpstreamLink, own: &[String]) -> CheckOutcome {
        assert!(
            link.session != self.bad,
            "the provider panicked on {}",
            link.session
        );
        self.inner.check(link, own).await
    }
}

/// A provider that panics passing over one unwatched link's source costs that link's pass
/// only: the others' markers still move past what was written at every tick (whichever link
/// comes first), so a watch that begins later is not told of their backlog, and the panic is
/// logged, once while it repeats. It ended the pass's task, leaving the links after it
/// unpassed, and was never logged (review).
#[tokio::test(start_paused = true)]
async fn a_provider_panicking_in_a_pass_costs_only_that_links_pass() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let w = world();
    let (ta, mut tb) = (Transcript::new(), Transcript::new());
    let a = SessionRef::parse("agent:main:a", "main").unwrap();
    let b = SessionRef::parse("agent:main:b", "main").unwrap();
    for (session, t) in [(&a, &ta), (&b, &tb)] {
        w.svc
            .try_adopt(jsonl::adoption(session.clone(), &t.path, None).unwrap())
            .await
            .unwrap();
    }
    let monitor = JsonlPanicsFor::monitor(&w, &a);
    // The ticks list the links turned by one each time: the pass reads a first at one of two.
    for tick in 1..=2 {
        tb.human("typed in b while nothing watches it");
        let before = w.store.link(&b).await.unwrap().unwrap().marker;
        assert_eq!(monitor.tick().await.unwatched, 2);
        let after = w.store.link(&b).await.unwrap().unwrap().marker.unwrap();
        assert_ne!(
            Some(&after),
            before.as_ref(),
            "b passed over at tick {tick}"
        );
        assert_eq!(
            JsonlMarker::from_value(&after).unwrap().position(),
            std::fs::metadata(&tb.path).unwrap().len(),
            "past what was typed, at tick {tick}"
        );
    }
    let manager = WatcherKey::parse("agent:main:main").unwrap();
    w.store.watch(&manager, &b, Timestamp::now()).await.unwrap();
    assert_eq!(monitor.tick().await.checked, 1);
    assert_eq!(w.human_events(&b).await, 0, "nothing typed since the watch");
    assert!(w.queue.peek(manager.session_key()).is_empty());
    let lines = capture.lines();
    let levels = pass_panic_levels(&lines, "agent:main:a");
    assert!(
        lines
            .iter()
            .filter(|l| l.contains("passing over the source of an unwatched link panicked"))
            .all(|l| l.contains("panic=the provider panicked on agent:main:a")),
        "{lines:#?}"
    );
    assert_eq!(
        levels,
        ["WARN", "DEBUG", "DEBUG"],
        "logged at each of the three passes, warned of once: {lines:#?}"
    );
}

/// A host that drives the monitor with `tick()` (no `spawn`) and then drops it, while the
/// pass over an unwatched link still reads (a provider that never answers), lets go of the
/// service and its store: dropping the last handle aborts the pass. The pass's task held the
/// monitor, and through it the service, for good (review).
#[tokio::test(start_paused = true)]
async fn a_monitor_driven_by_tick_lets_go_of_the_service_once_dropped() {
    let w = world();
    let r = SessionRef::parse("agent:main:remote", "main").unwrap();
    w.svc
        .try_adopt(LinkSpec::new(r, "remote", "h", "t", "hanging"))
        .await
        .unwrap();
    let (svc, store) = (Arc::strong_count(&w.svc), Arc::strong_count(&w.store));
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(Hanging))
        .build();
    // The pass hangs; the tick returns once a provider's timeout is over.
    assert_eq!(monitor.tick().await.unwatched, 1);
    drop(monitor);
    tokio::time::sleep(Duration::from_hours(1)).await;
    assert_eq!(
        (Arc::strong_count(&w.svc), Arc::strong_count(&w.store)),
        (svc, store),
        "nothing of the dropped monitor holds the service or the store"
    );
}

/// A pass that panics for a link at every tick while nothing watches it is warned of once;
/// once the link was watched for a tick (not passed over then) and is unwatched again, the same
/// panic is news again and warned of again, as a check's failure is after a tick that did not
/// check the link (second reading, stop 58).
#[tokio::test(start_paused = true)]
async fn a_pass_panicking_again_after_the_link_was_watched_is_warned_of_again() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let (w, _t, a) = adopted_a().await;
    let monitor = JsonlPanicsFor::monitor(&w, &a);
    for _ in 0..2 {
        assert_eq!(monitor.tick().await.unwatched, 1);
    }
    let manager = WatcherKey::parse("agent:main:main").unwrap();
    w.store.watch(&manager, &a, Timestamp::now()).await.unwrap();
    assert_eq!(
        monitor.tick().await.unwatched,
        0,
        "watched: not passed over"
    );
    assert!(w.store.unwatch(&manager, &a.session_key).await.unwrap());
    assert_eq!(monitor.tick().await.unwatched, 1);
    let lines = capture.lines();
    let levels = pass_panic_levels(&lines, "agent:main:a");
    assert_eq!(
        levels,
        ["WARN", "DEBUG", "WARN"],
        "warned of once while it repeats, and again after the watch: {lines:#?}"
    );
}

/// The JSONL provider, except that its first check panics and its second answers `then` (a
/// source that cannot be read, or is missing, for a while after).
struct PanicsThen {
    inner: JsonlProvider,
    then: CheckOutcome,
    calls: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl UpstreamProvider for PanicsThen {
    fn kind(&self) -> &str {
        self.inner.kind()
    }

    async fn check(&self, link: &UpstreamLink, own: &[String]) -> CheckOutcome {
        match self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
            0 => panic!("the provider panicked on {}", link.session),
            1 => self.then.clone(),
            _ => self.inner.check(link, own).await,
        }
    }
}

/// After a pass that panicked, the `info!` saying the link is passed over again comes at the
/// first pass that reads its source, not at one whose read failed or that found the source
/// missing, which read nothing either. (It followed any pass that did not panic, a failed read
/// among them: second reading, stop 58. What the mutation did: a pass that found the source
/// missing counted as one that read it; review of stop 68, MN21.)
#[tokio::test(start_paused = true)]
async fn a_pass_that_read_nothing_after_a_panic_is_not_said_to_pass_again() {
    for then in [
        CheckOutcome::Failed("the source cannot be read".into()),
        CheckOutcome::Missing,
    ] {
        let capture = common::Capture::default();
        let _logs = capture.install();
        let (w, _t, _a) = adopted_a().await;
        let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
            .provider(Arc::new(PanicsThen {
                inner: JsonlProvider::new(),
                then: then.clone(),
                calls: std::sync::atomic::AtomicUsize::new(0),
            }))
            .build();
        let again = |lines: &[String]| {
            lines
                .iter()
                .filter(|l| {
                    l.contains("is passed over again") && l.contains("session_key=agent:main:a")
                })
                .count()
        };
        for (tick, want) in [(1, 0), (2, 0), (3, 1), (4, 1)] {
            assert_eq!(monitor.tick().await.unwatched, 1);
            let lines = capture.lines();
            assert_eq!(
                again(&lines),
                want,
                "{then:?}: said to pass again after tick {tick}: {lines:#?}"
            );
        }
        assert_eq!(
            pass_panic_levels(&capture.lines(), "agent:main:a"),
            ["WARN"],
            "{then:?}"
        );
    }
}

/// A world with one link, `agent:main:a` adopted on a transcript of its own (kept while the
/// test runs), which nothing watches.
async fn adopted_a() -> (World, Transcript, SessionRef) {
    let w = world();
    let t = Transcript::new();
    let a = SessionRef::parse("agent:main:a", "main").unwrap();
    w.svc
        .try_adopt(jsonl::adoption(a.clone(), &t.path, None).unwrap())
        .await
        .unwrap();
    (w, t, a)
}

/// The levels of the log lines saying that passing over `session`'s source panicked, in order.
fn pass_panic_levels<'a>(lines: &'a [String], session: &str) -> Vec<&'a str> {
    let named = format!("session_key={session}");
    lines
        .iter()
        .filter(|l| {
            l.contains("passing over the source of an unwatched link panicked")
                && l.contains(&named)
        })
        .map(|l| l.rsplit("level=").next().unwrap_or_default())
        .collect()
}

/// The JSONL provider, each of whose reads takes `.1` first (a slow disk).
struct SlowJsonl(JsonlProvider, Duration);

#[async_trait]
impl UpstreamProvider for SlowJsonl {
    fn kind(&self) -> &str {
        self.0.kind()
    }

    async fn check(&self, link: &UpstreamLink, own: &[String]) -> CheckOutcome {
        tokio::time::sleep(self.1).await;
        self.0.check(link, own).await
    }
}

/// The task of `spawn` counts as a handle of the monitor: a host that drops every
/// `UpstreamMonitor` handle while the task runs ends no pass over an unwatched link that one
/// of its ticks started and that reads on past the tick; the pass moves the link's marker past
/// what was typed (second reading, stop 58).
#[tokio::test(start_paused = true)]
async fn dropping_a_spawned_monitors_handles_ends_no_pass_its_tick_started() {
    let w = world();
    let mut t = Transcript::new();
    let session = SessionRef::parse("agent:main:worker", "main").unwrap();
    w.svc
        .try_adopt(jsonl::adoption(session.clone(), &t.path, None).unwrap())
        .await
        .unwrap();
    t.human("typed while nothing watches it");
    // One tick within the test; its wait on the pass (a provider's timeout) is over before
    // the read is.
    let config = gateway_adapter::MonitorConfig {
        interval: Duration::from_hours(1),
        ..gateway_adapter::MonitorConfig::default()
    };
    let read = config.provider_timeout + Duration::from_secs(5);
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(SlowJsonl(JsonlProvider::new(), read)))
        .config(config)
        .build();
    let mut rx = monitor.subscribe();
    let before = w.store.link(&session).await.unwrap().unwrap().marker;
    let task = monitor.spawn();
    assert_eq!(next_tick(&mut rx).await.unwatched, 1);
    assert_eq!(
        w.store.link(&session).await.unwrap().unwrap().marker,
        before,
        "the pass still reads once the tick is done"
    );
    drop(monitor);
    tokio::time::sleep(read).await;
    let after = w
        .store
        .link(&session)
        .await
        .unwrap()
        .unwrap()
        .marker
        .unwrap();
    assert_ne!(Some(&after), before.as_ref(), "the pass went through");
    assert_eq!(
        JsonlMarker::from_value(&after).unwrap().position(),
        std::fs::metadata(&t.path).unwrap().len(),
        "past what was typed"
    );
    task.stop().await;
}

/// A link adopted again onto another source restarts its count of missing checks (DESIGN.md
/// section 8: three consecutive checks of the source): a new source gone at its first check
/// is not reported missing for the old source's misses. Nothing held that rule.
#[tokio::test(start_paused = true)]
async fn a_link_adopted_onto_another_source_restarts_its_missing_checks() {
    let (w, t, session) = worker_adopted().await;
    let monitor = w.monitor().build();
    std::fs::remove_file(&t.path).unwrap();
    monitor.tick().await;
    monitor.tick().await;
    let other = Transcript::new();
    let adopted = w
        .svc
        .try_adopt(jsonl::adoption(session.clone(), &other.path, Some("other")).unwrap())
        .await
        .unwrap();
    assert!(adopted.rebased);
    std::fs::remove_file(&other.path).unwrap();
    monitor.tick().await;
    monitor.tick().await;
    assert!(
        w.events(&session, EventKind::UpstreamMissing)
            .await
            .is_empty(),
        "the new source was missing at two checks"
    );
    monitor.tick().await;
    assert_eq!(
        w.events(&session, EventKind::UpstreamMissing).await.len(),
        1,
        "and at the third"
    );
}

/// Decision 0004: a check that fails (here a directory where the transcript was: the path
/// cannot be read) neither counts towards the consecutive missing checks nor restarts them.
/// Missing, missing, failed, missing: the failed check records nothing, and the miss after it
/// is the third, which records `upstream_missing` and removes the link.
#[tokio::test(start_paused = true)]
async fn a_failed_check_neither_counts_nor_restarts_the_missing_checks() {
    let (w, t, session) = worker_adopted().await;
    let monitor = w.monitor().build();
    let mut rx = monitor.subscribe();

    assert_eq!(
        missing_twice(&t, &monitor, &mut rx).await,
        ["missing 1", "missing 2"]
    );
    std::fs::create_dir(&t.path).unwrap();
    let ds = tick_published(&monitor, &mut rx).await;
    let failed = failures_published(&ds);
    assert_eq!(failed.len(), 1, "{:?}", texts(&ds));
    assert!(failed[0].contains("not a regular file"), "{failed:?}");
    assert!(
        !ds.iter().any(|d| matches!(
            d,
            Detection::Missing { .. } | Detection::UpstreamMissing { .. }
        )),
        "the failure does not count: {:?}",
        texts(&ds)
    );
    assert!(
        w.events(&session, EventKind::UpstreamMissing)
            .await
            .is_empty()
    );

    // Gone again: the third miss in a row, the failure between them notwithstanding.
    std::fs::remove_dir(&t.path).unwrap();
    let ds = tick_published(&monitor, &mut rx).await;
    missing_recorded_and_link_removed(&w, &session, &ds, "the count was not restarted").await;
}

/// A JSONL monitor over `w`'s store for a gateway with `owned_watchers_only` whose sessions
/// `directory` knows.
fn owned_watchers_only_monitor(
    w: &common::World,
    directory: Arc<InMemoryDirectory>,
) -> gateway_adapter::upstream::MonitorBuilder {
    let config = gateway_adapter::AwarenessConfig {
        owned_watchers_only: true,
        ..gateway_adapter::AwarenessConfig::default()
    };
    let (svc, _, _) =
        common::service_configured(w.store.clone(), Some(w.store.clone()), directory, config);
    UpstreamMonitor::builder(svc, w.store.clone()).provider(Arc::new(JsonlProvider::new()))
}

/// A gateway directory that panics when asked whether an adopted session is this gateway's
/// (`owned_watchers_only`).
struct PanicsWhenAsked;

impl gateway_adapter::SessionDirectory for PanicsWhenAsked {
    fn exists(&self, _session: &SessionKey) -> bool {
        panic!("the gateway's directory panicked")
    }

    fn entry(&self, _session: &SessionKey) -> Option<gateway_adapter::SessionEntry> {
        None
    }

    fn exists_as(&self, _session: &SessionRef) -> bool {
        panic!("the gateway's directory panicked")
    }
}

/// With `owned_watchers_only`, a session the directory cannot say is this gateway's (it panicked)
/// is skipped this tick, not checked as if it were: checked, another gateway's session would be
/// read against this gateway's prompts and runs. It is published as a failed check of that
/// session, as `Detection::Failed` says: a subscriber learns why it was not checked. (A panic
/// taken for "this gateway's" passed every test: review of stop 62, A20; so did a panic logged
/// but published as nothing: review of stop 66, M514.)
#[tokio::test(start_paused = true)]
async fn a_session_the_directory_panics_on_is_not_checked() {
    let (w, mut t, session) = worker_adopted().await;
    t.human("run the tests");
    let config = gateway_adapter::AwarenessConfig {
        owned_watchers_only: true,
        ..gateway_adapter::AwarenessConfig::default()
    };
    let svc = Arc::new(
        Awareness::builder(
            w.store.clone(),
            Arc::new(InMemoryQueue::new()),
            Arc::new(RecordingWake::new()),
            Arc::new(PanicsWhenAsked),
        )
        .upstream(w.store.clone())
        .config(config)
        .build(),
    );
    let monitor = UpstreamMonitor::builder(svc, w.store.clone())
        .provider(Arc::new(JsonlProvider::new()))
        .build();
    let mut rx = monitor.subscribe();
    let report = monitor.tick().await;
    assert_eq!(
        (report.links, report.not_owned, report.checked),
        (1, 0, 0),
        "skipped this tick: {report:?}"
    );
    assert_eq!(w.human_events(&session).await, 0, "nothing recorded");
    assert_eq!(
        failed_sessions(&mut rx),
        vec![(
            session,
            "the gateway's session directory panicked".to_owned()
        )],
        "the skipped session is published as failed"
    );
}

/// A provider answering the outcomes given, one a check; it records an own prompt for the
/// session while it reads human turns (`prompts`: the gateway sent one during the check), and
/// removes the link while it reads (`remove`: the link changed during the check).
struct Scripted {
    outcomes: Mutex<Vec<CheckOutcome>>,
    prompts: Option<Arc<RecentPrompts>>,
    remove: Option<Arc<MemoryStore>>,
}

impl Scripted {
    fn new(outcomes: Vec<CheckOutcome>) -> Self {
        Self {
            outcomes: Mutex::new(outcomes),
            prompts: None,
            remove: None,
        }
    }
}

#[async_trait]
impl UpstreamProvider for Scripted {
    fn kind(&self) -> &'static str {
        "scripted"
    }

    async fn check(&self, link: &UpstreamLink, _: &[String]) -> CheckOutcome {
        let outcome = self.outcomes.lock().unwrap().remove(0);
        if let (Some(prompts), CheckOutcome::HumanTurns { .. }) = (&self.prompts, &outcome) {
            prompts.record(&link.session, "sent during the check");
        }
        if let Some(store) = &self.remove {
            store.remove_link(&link.session, None).await.unwrap();
        }
        outcome
    }
}

/// A check that found the source (human turns), deferred because the gateway sent a prompt while it
/// read, still restarts the count of missing checks: two misses before it and one after are not
/// three in a row. (It passed every test when broken: review of stop 62, N11.)
#[tokio::test]
async fn a_source_found_by_a_deferred_check_restarts_the_missing_count() {
    let w = world();
    let session = w.adopt_remote("agent:main:remote", "scripted").await;
    let prompts = Arc::new(RecentPrompts::new());
    let provider = Scripted {
        prompts: Some(prompts.clone()),
        ..Scripted::new(vec![
            CheckOutcome::Missing,
            CheckOutcome::Missing,
            human_turns(1, "u1", json!(1)),
            CheckOutcome::Missing,
        ])
    };
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(provider))
        .own_prompts(prompts)
        .build();
    let mut rx = monitor.subscribe();
    for _ in 0..3 {
        monitor.tick().await;
    }
    assert!(
        published(&mut rx)
            .iter()
            .any(|d| matches!(d, Detection::Deferred { .. })),
        "the third check is deferred"
    );
    monitor.tick().await;
    let ds = published(&mut rx);
    assert!(
        ds.iter()
            .any(|d| matches!(d, Detection::Missing { consecutive: 1, .. })),
        "the miss after a deferred check that found the source is the first in a row: {:?}",
        texts(&ds)
    );
    assert!(
        w.store.link(&session).await.unwrap().is_some(),
        "the link stays"
    );
}

/// A prompt the gateway sent while a check read defers the turns it found even when the
/// session's window of own prompts was full: the window then holds as many prompts as before,
/// but not the same ones. (What the mutation did: only the windows' lengths were compared, so
/// with ten prompts sent the gateway's own prompt was recorded as a person's turn; review of
/// stop 70, MB24.)
#[tokio::test]
async fn a_prompt_sent_during_a_check_defers_its_turns_with_a_full_echo_window() {
    let w = world();
    let session = w.adopt_remote("agent:main:remote", "scripted").await;
    let prompts = Arc::new(RecentPrompts::new());
    for i in 0..upstream::SELF_ECHO_WINDOW {
        prompts.record(&session, format!("prompt {i}"));
    }
    let provider = Scripted {
        prompts: Some(prompts.clone()),
        ..Scripted::new(vec![human_turns(1, "u1", json!(1))])
    };
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(provider))
        .own_prompts(prompts)
        .build();
    let r = monitor.tick().await;
    assert_eq!(
        (r.checked, r.deferred),
        (0, 1),
        "the prompt sent during the check defers it, the window full"
    );
    assert_eq!(
        w.human_events(&session).await,
        0,
        "nothing recorded while the gateway acted"
    );
}

/// A provider that reports human turns with a count of 0 still has them recorded as one turn
/// (`turns.max(1)`), and the marker moves past them. (It passed every test when broken: review of
/// stop 62, N15.)
#[tokio::test]
async fn human_turns_counted_zero_by_a_provider_are_recorded_as_one() {
    let w = world();
    let session = w.adopt_remote("agent:main:remote", "scripted").await;
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(Scripted::new(vec![human_turns(
            0,
            "u1",
            json!(1),
        )])))
        .build();
    let mut rx = monitor.subscribe();
    monitor.tick().await;
    let ds = published(&mut rx);
    assert_eq!(
        w.human_events(&session).await,
        1,
        "a burst counted 0 is recorded as one turn: {:?}",
        texts(&ds)
    );
    assert_eq!(
        w.store.link(&session).await.unwrap().unwrap().marker,
        Some(json!(1))
    );
}

/// A link removed while its check read is not said to have been removed by the monitor (upstream
/// missing), and a rebase of it is not published (its marker was not stored). (It passed every test
/// when broken: review of stop 62, N06 and N21.)
#[tokio::test]
async fn a_link_removed_during_its_check_is_neither_said_removed_nor_rebased() {
    for rebased in [false, true] {
        let w = world();
        let session = w.adopt_remote("agent:main:remote", "scripted").await;
        let outcome = if rebased {
            CheckOutcome::Rebased { marker: json!(2) }
        } else {
            CheckOutcome::Missing
        };
        let provider = Scripted {
            remove: Some(w.store.clone()),
            ..Scripted::new(vec![outcome])
        };
        let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
            .provider(Arc::new(provider))
            .config(gateway_adapter::MonitorConfig {
                missing_checks: 1,
                ..gateway_adapter::MonitorConfig::default()
            })
            .build();
        let mut rx = monitor.subscribe();
        monitor.tick().await;
        let ds = published(&mut rx);
        assert!(
            !ds.iter().any(|d| matches!(d, Detection::Rebased { .. })),
            "rebased {rebased}: no rebase is published for a link that changed: {:?}",
            texts(&ds)
        );
        if !rebased {
            assert!(
                ds.iter().any(|d| matches!(
                    d,
                    Detection::UpstreamMissing {
                        link_removed: false,
                        ..
                    }
                )),
                "the link changed meanwhile: not removed by this check: {:?}",
                texts(&ds)
            );
        }
        assert!(w.store.link(&session).await.unwrap().is_none());
    }
}

/// A link whose removal failed is still there: its session keeps its own prompts and its count of
/// missing checks, so the next check records upstream_missing again and retries the removal at
/// once. (It passed every test when broken: review of stop 62, N20.)
#[tokio::test]
async fn a_failed_link_removal_keeps_the_prompts_and_is_retried_at_the_next_check() {
    let w = world();
    let t = Transcript::new();
    let session = w
        .adopt(&t, "agent:main:worker", "main", "agent:main:main")
        .await;
    let prompts = Arc::new(RecentPrompts::new());
    prompts.record(&session, "run the tests");
    let flaky = Arc::new(Flaky {
        fail_removes: AtomicUsize::new(1),
        ..Flaky::over(&w.store)
    });
    let monitor = UpstreamMonitor::builder(w.svc.clone(), flaky)
        .provider(Arc::new(JsonlProvider::new()))
        .own_prompts(prompts.clone())
        .build();
    let mut rx = monitor.subscribe();
    std::fs::remove_file(&t.path).unwrap();
    for _ in 0..3 {
        monitor.tick().await;
    }
    assert!(
        published(&mut rx).iter().any(|d| matches!(
            d,
            Detection::UpstreamMissing {
                link_removed: false,
                ..
            }
        )),
        "the removal failed"
    );
    assert_eq!(
        prompts.recent(&session),
        vec!["run the tests".to_owned()],
        "a link whose removal failed keeps its prompts"
    );
    monitor.tick().await;
    let ds = published(&mut rx);
    assert!(
        ds.iter().any(|d| matches!(
            d,
            Detection::UpstreamMissing {
                link_removed: true,
                ..
            }
        )),
        "the next check retries the removal: {:?}",
        texts(&ds)
    );
}

/// A tick at which nothing watches a session restarts its count of deferrals by a linked session's
/// runs: four deferrals before it and one after are not five. (It passed every test when broken:
/// review of stop 62, N17.)
#[tokio::test(start_paused = true)]
async fn an_unwatched_tick_restarts_the_count_of_deferrals_by_linked_runs() {
    let w = world();
    let (mut t, alpha, beta, runs, monitor) = alpha_and_beta_with_runs(&w).await;
    runs.started(&beta);
    deferring_both(&monitor, 4, "before").await;
    let lead = WatcherKey::parse("agent:alpha:lead").unwrap();
    assert!(w.store.unwatch(&lead, &alpha.session_key).await.unwrap());
    let r = monitor.tick().await;
    assert_eq!((r.unwatched, r.deferred), (1, 1));
    w.store
        .watch(&lead, &alpha, Timestamp::now())
        .await
        .unwrap();
    t.human("typed once watched again");
    deferring_both(&monitor, 2, "since the unwatched tick").await;
    assert_eq!(w.human_events(&alpha).await, 0);
}

/// An own-prompts port that keeps more than the self-echo window.
struct ManyPrompts(Vec<String>);

impl OwnPrompts for ManyPrompts {
    fn recent(&self, _: &SessionRef) -> Vec<String> {
        self.0.clone()
    }
}

/// Only a session's last `SELF_ECHO_WINDOW` own prompts are echoes, whatever its port keeps: a
/// person typing the text of an older prompt is recorded. (It passed every test when broken: review
/// of stop 62, N18.)
#[tokio::test]
async fn prompts_older_than_the_self_echo_window_are_no_echoes() {
    let w = world();
    let mut t = Transcript::new();
    let session = w
        .adopt(&t, "agent:main:worker", "main", "agent:main:main")
        .await;
    let prompts = (0..=upstream::SELF_ECHO_WINDOW)
        .map(|i| format!("gateway prompt number {i}"))
        .collect();
    let monitor = w
        .monitor()
        .own_prompts(Arc::new(ManyPrompts(prompts)))
        .build();
    t.human("gateway prompt number 0");
    monitor.tick().await;
    assert_eq!(
        w.human_events(&session).await,
        1,
        "the prompt before the last {} is no echo",
        upstream::SELF_ECHO_WINDOW
    );
}

/// A check that goes through restarts the count of deferrals by a linked session's runs: three
/// before it and two after are not five. (It passed every test when broken: review of stop 62,
/// N23.)
#[tokio::test(start_paused = true)]
async fn a_check_that_goes_through_restarts_the_count_of_deferrals_by_linked_runs() {
    let w = world();
    let (_t, alpha, beta, runs, monitor) = alpha_and_beta_with_runs(&w).await;
    runs.started(&beta);
    deferring_both(&monitor, 3, "before").await;
    runs.finished(&beta);
    let r = monitor.tick().await;
    assert_eq!((r.checked, r.deferred), (2, 0), "both checked");
    assert_eq!(w.human_events(&alpha).await, 1);
    runs.started(&beta);
    deferring_both(&monitor, 3, "since alpha's check went through").await;
}

/// A check deferred because the gateway sent a prompt while it read did not go through: it does
/// not start again the count of the ticks other sessions' runs deferred the session at, and four
/// such ticks before it and one after are five, the session then checked alone. (What the
/// mutation did: a check deferred while it read restarted that count, so the session waited
/// five more ticks of the other's runs; review of stop 70, MB05.)
#[tokio::test(start_paused = true)]
async fn a_check_deferred_while_it_read_keeps_the_count_of_deferrals_by_linked_runs() {
    let w = world();
    let adopt = |key: &str, agent: &str| {
        LinkSpec::new(
            SessionRef::parse(key, agent).unwrap(),
            "remote",
            "h",
            "t",
            "scripted",
        )
    };
    let alpha = w
        .adopt_spec(adopt("agent:alpha:main", "alpha"), "agent:alpha:lead")
        .await;
    w.adopt_spec(adopt("agent:beta:main", "beta"), "agent:beta:lead")
        .await;
    let prompts = Arc::new(RecentPrompts::new());
    let runs = Arc::new(RunTracker::new());
    let monitor = w
        .monitor()
        .own_prompts(prompts.clone())
        .run_activity(runs.clone())
        .provider(Arc::new(Scripted {
            // Each check made records a prompt while it reads (its turns are then deferred).
            prompts: Some(prompts.clone()),
            ..Scripted::new(vec![
                human_turns(1, "u1", json!(1)),
                human_turns(1, "u1", json!(1)),
                CheckOutcome::Unchanged { marker: json!(1) },
            ])
        }))
        .build();
    runs.started(&alpha);
    deferring_both(&monitor, 4, "alpha running").await;
    runs.finished(&alpha);
    let r = monitor.tick().await;
    assert_eq!(
        (r.checked, r.deferred),
        (0, 2),
        "both checks deferred by the prompts sent while they read"
    );
    runs.started(&alpha);
    deferring_both(&monitor, 1, "alpha running again").await;
    let r = monitor.tick().await;
    assert_eq!(
        (r.checked, r.deferred),
        (1, 1),
        "beta checked alone: alpha's runs deferred it at five ticks since its last check went through"
    );
}

/// Passing over an unwatched link whose source has nothing new writes nothing: its marker and
/// `updated_at` stay. (It passed every test when broken: review of stop 62, N25.)
#[tokio::test]
async fn passing_over_an_unchanged_unwatched_source_writes_nothing() {
    let w = world();
    let mut t = Transcript::new();
    let session = SessionRef::parse("agent:main:lonely", "main").unwrap();
    w.svc
        .try_adopt(jsonl::adoption(session.clone(), &t.path, None).unwrap())
        .await
        .unwrap();
    let monitor = w.monitor().build();
    t.human("typed while nothing watched");
    assert_eq!(monitor.tick().await.unwatched, 1);
    let before = w.store.link(&session).await.unwrap().unwrap();
    assert_eq!(monitor.tick().await.unwatched, 1);
    let after = w.store.link(&session).await.unwrap().unwrap();
    assert_eq!(
        (after.marker, after.updated_at),
        (before.marker, before.updated_at),
        "nothing new read: the link is not written"
    );
}

/// With `owned_watchers_only`, a tick at which another gateway owns the session restarts its count
/// of deferrals by a linked session's runs: four deferrals before it and one after are not five.
/// (It passed every test when broken: review of stop 62, N16.)
#[tokio::test(start_paused = true)]
async fn a_not_owned_tick_restarts_the_count_of_deferrals_by_linked_runs() {
    let w = world();
    let mut t = Transcript::new();
    let (alpha, beta) = alpha_and_beta(&w, &t).await;
    let directory = Arc::new(InMemoryDirectory::new());
    for s in [&alpha, &beta] {
        directory.upsert(
            s.session_key.clone(),
            gateway_adapter::SessionEntry::default(),
        );
    }
    let runs = Arc::new(RunTracker::new());
    let monitor = owned_watchers_only_monitor(&w, directory.clone())
        .run_activity(runs.clone())
        .build();
    t.human("a person typed this");
    runs.started(&beta);
    deferring_both(&monitor, 4, "before").await;
    directory.remove(&alpha.session_key);
    let r = monitor.tick().await;
    assert_eq!((r.not_owned, r.deferred), (1, 1));
    directory.upsert(
        alpha.session_key.clone(),
        gateway_adapter::SessionEntry::default(),
    );
    deferring_both(&monitor, 2, "since the tick another gateway owned it").await;
    assert_eq!(w.human_events(&alpha).await, 0);
}

/// A first tick beyond what the clock can reach (`Duration::MAX`: never, as
/// `UpstreamMonitor::spawn` says) never comes. (What the mutation did: such a tick taken as an hour
/// away, the monitor began checking after an hour; review of stop 63, W15.)
#[tokio::test(start_paused = true)]
async fn a_first_tick_beyond_the_clock_never_comes() {
    let w = world();
    w.adopt_remote("agent:main:remote", "begun").await;
    let (began, mut begun) = tokio::sync::mpsc::unbounded_channel();
    let monitor = UpstreamMonitor::builder(w.svc.clone(), w.store.clone())
        .provider(Arc::new(Begun(began)))
        .config(gateway_adapter::MonitorConfig {
            first_tick: Duration::MAX,
            ..gateway_adapter::MonitorConfig::default()
        })
        .build();
    let task = monitor.spawn();
    tokio::time::sleep(Duration::from_hours(3)).await;
    assert!(
        begun.try_recv().is_err(),
        "a check began though the first tick never comes"
    );
    task.stop().await;
}

/// A line a crashed writer left cut inside a string (its end never written) ends at its newline:
/// the person's prompt on the next line is a human turn. (What the mutation did: the newline left
/// out of the string's fast path, the cut string ran on into the next line, which was swallowed
/// into the malformed one, and the prompt was lost; review of stop 63, T10.)
#[test]
fn a_line_cut_inside_a_string_ends_at_its_newline() {
    let mut t = Transcript::new();
    let m = jsonl::marker_at_end(&t.path).unwrap();
    t.raw(b"{\"type\":\"user\",\"cwd\":\"/home/me/pro\n");
    let question = t.human("typed after the cut line");
    let out = scan(&t, &m);
    assert_eq!(turns(&out), 1, "the cut line swallowed the next: {out:?}");
    assert!(matches!(&out, CheckOutcome::HumanTurns { dedupe_id, .. } if *dedupe_id == question));
}

/// A line that is no JSON, longer than a check's byte budget, is skipped over several checks, each
/// going on where the last stopped, and the prompt after it counts. (What the mutation did: the
/// bytes skipped of the malformed line not counted, the saved position fell behind what was read,
/// and in a debug build every check panicked on the position's assertion; review of stop 63, T06.)
#[test]
fn a_malformed_line_longer_than_a_budget_is_skipped_over_checks() {
    const BUDGET: u64 = 64;
    let mut t = Transcript::new();
    let mut m = jsonl::marker_at_end(&t.path).unwrap();
    t.raw(format!("not json {}\n", "z".repeat(300)).as_bytes());
    t.human("typed after the garbage");
    let size = std::fs::metadata(&t.path).unwrap().len();
    let mut counted = 0;
    for _ in 0..size / BUDGET + 2 {
        let out = jsonl::scan(&t.path, Some(&m), &[], BUDGET);
        counted += turns(&out);
        m = marker_of(&out);
    }
    assert_eq!(counted, 1, "the prompt after the garbage line");
    assert_eq!(m.position(), size, "the marker is at the end");
}

/// A rebase looks back no further than its budget, also when a newline lies within one read chunk
/// (64 KiB) before the budget's bytes: the last line, started more than a budget back, is skipped
/// to its end. (What the mutation did: the chunk read from 64 KiB back whatever the budget, and the
/// rebase landed at that line's start, up to 64 KiB more read than a tick's budget; review of stop
/// 64, GW08.)
#[test]
fn a_rebase_does_not_look_back_past_its_budget_within_a_chunk() {
    const BUDGET: u64 = 256;
    let mut t = Transcript::new();
    t.human("old history");
    let stale = jsonl::marker_at_end(&t.path).unwrap();
    t.raw(
        format!(
            "{{\"type\":\"user\",\"toolUseResult\":\"{}",
            "x".repeat(1000)
        )
        .as_bytes(),
    );
    let size = std::fs::metadata(&t.path).unwrap().len();
    let rebased = rebase(&t, stale, BUDGET);
    assert!(
        rebased.offset >= size - BUDGET,
        "the rebase looked back past its budget, to {} of {size}",
        rebased.offset
    );
    assert_eq!(rebased.position(), size);
}

/// A stored partial state the reader cannot be in (edited by hand), of a line whose end is not
/// written yet, is skipped from where the read stood: the marker moves to the file's end (still
/// inside that line), and the turn typed after the line counts. (What the mutation did: skipped
/// with a count of 0, the marker behind the read: a debug build panicked at every check, a release
/// build rebased the link and lost the turns typed meanwhile; review of stop 64, GW14.)
#[test]
fn an_edited_partial_state_of_an_unfinished_line_is_skipped_from_where_it_was() {
    let mut t = Transcript::new();
    let (_, edited, escaped, cut) = cut_inside_an_escape(&t);
    // More of the line, its end not written yet.
    t.raw(&escaped.as_bytes()[cut..cut + 6]);
    let len = std::fs::metadata(&t.path).unwrap().len();
    let out = scan(&t, &edited);
    let after = marker_of(&out);
    assert_eq!(
        (after.offset, after.position()),
        (edited.offset, len),
        "the rest of the line is skipped from where the read stood: {out:?}"
    );
    t.raw(&escaped.as_bytes()[cut + 6..]);
    t.raw(b"\n");
    let question = t.human("and this?");
    let out = scan(&t, &after);
    assert!(
        matches!(&out, CheckOutcome::HumanTurns { turns: 1, dedupe_id, .. } if *dedupe_id == question),
        "the turn after the skipped line counts: {out:?}"
    );
}

/// A turn whose `uuid` is empty is named by its line, as one without a uuid, so two such bursts are
/// two events. (What the mutation did: both named `""`, and every burst after the first was taken
/// for a duplicate; review of stop 64, GW15.)
#[test]
fn turns_with_an_empty_uuid_are_named_by_their_line() {
    let t = Transcript::new();
    let m = jsonl::marker_at_end(&t.path).unwrap();
    t.line(&user_row("", json!("first")));
    let first_out = scan(&t, &m);
    let first = dedupe_id_of(&first_out);
    t.line(&user_row("", json!("second")));
    let second = dedupe_id_of(&scan(&t, &marker_of(&first_out)));
    assert!(
        !first.is_empty() && first != second,
        "an empty uuid names no turn: {first:?} then {second:?}"
    );
}

/// `jsonl::scan` with a budget of 0 reads as with 1 byte, so checks made with it still go forward
/// and count the turn. (What the mutation did: a budget of 0 read nothing, the same marker for
/// ever; the provider refuses a budget of 0, so only direct callers of `scan` saw it; review of
/// stop 64, GW20.)
#[test]
fn a_scan_with_a_budget_of_zero_still_goes_forward() {
    let mut t = Transcript::new();
    let mut m = jsonl::marker_at_end(&t.path).unwrap();
    t.human("typed");
    let len = std::fs::metadata(&t.path).unwrap().len();
    let mut seen = 0;
    for _ in 0..=len {
        let out = jsonl::scan(&t.path, Some(&m), &[], 0);
        seen += turns(&out);
        m = marker_of(&out);
    }
    assert_eq!(
        (seen, m.position()),
        (1, len),
        "a budget of 0 reads nothing, for ever"
    );
}

/// A stored marker's anchors past `MAX_ANCHORS` (edited by hand) are dropped, those of its resume
/// point as those of the marker. (What the mutation did: the resume point's extra anchors kept,
/// against `PairedMarker::from_value`'s doc, and written back; review of stop 64, GW28.)
#[test]
fn a_resume_points_anchors_past_the_bound_are_dropped() {
    let many: Vec<String> = (0..7).map(|i| format!("x{i}")).collect();
    let stored = json!({"uuid": "i0", "anchors": many,
        "resume": {"before": "9", "top": "t", "top_anchors": many}});
    let marker = PairedMarker::from_value(&stored).expect("a marker of ours");
    assert_eq!(marker.anchors.len(), 4, "the marker's anchors");
    assert_eq!(
        marker.resume.expect("its resume point").top_anchors,
        many[..4].to_vec(),
        "the resume point's anchors past the bound are dropped"
    );
}

/// A node whose second page repeats its newest item (its cursors counted from the newest
/// item, and one more item came between the two pages).
struct RepeatsTheTop;

#[async_trait]
impl PairedNodeClient for RepeatsTheTop {
    async fn newest(
        &self,
        _: &str,
        _: &str,
        before: Option<&str>,
        _: usize,
    ) -> Result<PairedPage, PairedError> {
        let ids: &[&str] = match before {
            None => &["t", "a", "b"],
            Some(_) => &["t", "m", "x1", "x2", "x3"],
        };
        Ok(PairedPage {
            items: ids
                .iter()
                .map(|id| PairedItem::with_role(*id, "assistant", "ok"))
                .collect(),
            older: before.is_none().then(|| "c1".into()),
        })
    }
}

/// The marker's new item is never one of its own anchors, even when the node answered it twice: the
/// anchors are the items below it. (What the mutation did: the top became an anchor of itself, one
/// of four slots wasted; review of stop 64, GW29.)
#[tokio::test]
async fn the_marker_item_is_not_among_its_anchors() {
    let provider = PairedNodeProvider::new(Arc::new(RepeatsTheTop));
    let out = provider
        .check(
            &paired_link(Some(json!({"uuid": "m", "anchors": ["x1", "x2", "x3"]}))),
            &[],
        )
        .await;
    let marker = PairedMarker::from_value(&paired_marker_of(&out)).expect("ours");
    assert_eq!(marker.uuid.as_deref(), Some("t"), "{out:?}");
    assert_eq!(
        marker.anchors,
        ["a", "b", "m", "x1"],
        "the top is not its own anchor"
    );
}

/// A resumed check whose node answers, as the older page's cursor, the very cursor it was asked
/// with fails, also when it may read one page only: it does not count the same items again and keep
/// the resume point where it was. (What the mutation did: the starting cursor not among those seen;
/// with one page a check, the link re-read the same page at every tick, never warned; review of
/// stop 64, GW32.)
#[tokio::test]
async fn a_resumed_read_given_back_its_own_cursor_fails_at_once() {
    let out = PairedNodeProvider::new(Arc::new(StuckCursor))
        .with_max_pages(1)
        .check(
            &paired_link(Some(
                json!({"uuid": "i0", "resume": {"before": "again", "top": "t0"}}),
            )),
            &[],
        )
        .await;
    assert!(
        matches!(&out, CheckOutcome::Failed(why) if why.contains("twice")),
        "the cursor it started from, given back: {out:?}"
    );
}

/// A resume point stored without a `top` (as stored until 12-05) is not followed, and a check that
/// finds nothing new writes the marker back without it. (What the mutation did: the stale resume
/// point written back, kept in the link until the thread moved; review of stop 64, GW34.)
#[tokio::test]
async fn a_resume_point_without_top_is_dropped_by_a_check() {
    let node = FakeNode::holding([PairedItem::user("i0", "read before")]);
    let out = PairedNodeProvider::new(node)
        .check(
            &paired_link(Some(json!({"uuid": "i0", "resume": {"before": "5"}}))),
            &[],
        )
        .await;
    assert_eq!(
        out,
        CheckOutcome::Unchanged {
            marker: json!({"uuid": "i0"})
        },
        "the resume point without a top is not kept"
    );
}

/// A cursor on the session's key that follows another agent does not watch the link: the link is
/// unwatched (passed over), not checked. (What the mutation did: any cursor on the session's key
/// counted as a watch, whatever its agent; review of stop 64, MO18.)
#[tokio::test]
async fn a_link_whose_key_only_another_agent_watches_is_unwatched() {
    let w = world();
    let ops = SessionRef::parse("agent:main:worker", "ops").unwrap();
    let spec = LinkSpec::new(ops.clone(), "remote", "h", "t", "scripted");
    assert!(w.svc.try_adopt(spec).await.unwrap().created);
    let main = SessionRef::parse("agent:main:worker", "main").unwrap();
    w.store
        .watch(
            &WatcherKey::parse("agent:main:lead").unwrap(),
            &main,
            Timestamp::now(),
        )
        .await
        .unwrap();
    let monitor = w
        .monitor()
        .provider(Arc::new(Scripted::new(vec![
            CheckOutcome::Unchanged { marker: json!(1) },
            CheckOutcome::Unchanged { marker: json!(1) },
        ])))
        .build();
    let r = monitor.tick().await;
    assert_eq!(
        (r.checked, r.unwatched),
        (0, 1),
        "the ops agent's link is watched by no cursor: {r:?}"
    );
}

/// A check stores the time of its scan, the service's now, not the link's `updated_at`, and the
/// marker it moves stamps the link with the time of the move. (What the mutations did: the link's
/// `updated_at` stored as the time of the scan, review of stop 64, MO36; the move's `now` the
/// link's old `updated_at`, so a link written long ago kept an `updated_at` of then after its
/// marker moved, review of stop 65, MW19.)
#[tokio::test]
async fn a_check_stamps_its_scan_and_its_marker_move_with_its_time() {
    let w = world();
    let session = SessionRef::parse("agent:main:remote", "main").unwrap();
    // A link written long ago.
    let spec = LinkSpec::new(session.clone(), "remote", "h", "t", "scripted");
    w.store.upsert_link(spec, Timestamp(1_000)).await.unwrap();
    w.store
        .watch(
            &WatcherKey::parse("agent:main:main").unwrap(),
            &session,
            Timestamp::now(),
        )
        .await
        .unwrap();
    let before = w.store.link(&session).await.unwrap().unwrap();
    let monitor = w
        .monitor()
        .provider(Arc::new(Scripted::new(vec![CheckOutcome::Unchanged {
            marker: json!(1),
        }])))
        .build();
    assert_eq!(monitor.tick().await.checked, 1);
    let after = w.store.link(&session).await.unwrap().unwrap();
    let scanned = after.last_scanned_at.expect("a scan time");
    assert!(
        scanned > before.updated_at,
        "the scan time is when the check ran: {scanned:?} vs updated_at {:?}",
        before.updated_at
    );
    assert_eq!(after.marker, Some(json!(1)), "the marker moved");
    assert!(
        after.updated_at >= scanned,
        "the move is stamped with its time: updated_at {:?} vs scanned {scanned:?}",
        after.updated_at
    );
}

/// A check that finds the source gone, or finds human turns, is a check made: it stamps the
/// link's scan time as every check that concluded does (only a failed check leaves it). (What the mutations did: a `Missing` check left the scan time
/// unstamped, so a link whose source is gone read as never scanned, review of stop 70, MB20; so
/// did a check that found human turns, so a link a person types into read as never scanned,
/// review of stop 71, MG03.)
#[tokio::test]
async fn a_check_that_finds_the_source_gone_stamps_its_scan() {
    for (outcome, what) in [
        (CheckOutcome::Missing, "found the source gone"),
        (human_turns(1, "t1", json!(1)), "found human turns"),
    ] {
        let w = world();
        let session = w.adopt_remote("agent:main:remote", "scripted").await;
        let before = w.store.link(&session).await.unwrap().unwrap();
        assert_eq!(before.last_scanned_at, None);
        let monitor = w
            .monitor()
            .provider(Arc::new(Scripted::new(vec![outcome])))
            .build();
        assert_eq!(monitor.tick().await.checked, 1, "{what}");
        let after = w.store.link(&session).await.unwrap().unwrap();
        assert!(
            after.last_scanned_at.is_some(),
            "a check that {what} stamps the scan time: {after:?}"
        );
        if what == "found human turns" {
            assert_eq!(w.human_events(&session).await, 1, "the turn is recorded");
        }
    }
}

/// The `upstream_missing` a check records is the gateway's own (actor type system), not a
/// person's or another session's. (What the mutation did: it was recorded with actor type
/// agent; review of stop 71, MG12.)
#[tokio::test]
async fn upstream_missing_is_recorded_as_the_gateways_own() {
    let w = world();
    let session = w.adopt_remote("agent:main:remote", "scripted").await;
    let monitor = w
        .monitor()
        .provider(Arc::new(Scripted::new(vec![CheckOutcome::Missing])))
        .config(gateway_adapter::MonitorConfig {
            missing_checks: 1,
            ..gateway_adapter::MonitorConfig::default()
        })
        .build();
    monitor.tick().await;
    let events = w.events(&session, EventKind::UpstreamMissing).await;
    assert_eq!(events.len(), 1, "upstream_missing recorded");
    assert_eq!(events[0].actor_type, ActorType::System, "{:?}", events[0]);
}

/// A check whose scan time the store fails to store still acts on what it read: the human turns
/// it found are recorded and the marker moves (the scan time is only logged as not stored).
/// (What the mutation did: a failed scan-time write ended the check, so a store that fails that
/// write left a person's turns unrecorded at every tick; review of stop 71, MG19.)
#[tokio::test]
async fn a_scan_time_not_stored_still_records_the_turns_found() {
    let w = world();
    let session = w.adopt_remote("agent:main:remote", "scripted").await;
    let flaky = Arc::new(Flaky {
        fail_scans: AtomicUsize::new(1),
        ..Flaky::over(&w.store)
    });
    let monitor = UpstreamMonitor::builder(w.svc.clone(), flaky)
        .provider(Arc::new(Scripted::new(vec![human_turns(
            1,
            "t1",
            json!(1),
        )])))
        .build();
    assert_eq!(monitor.tick().await.checked, 1);
    assert_eq!(
        w.human_events(&session).await,
        1,
        "the turn found is recorded though its scan time was not stored"
    );
    assert_eq!(
        w.store.link(&session).await.unwrap().unwrap().marker,
        Some(json!(1)),
        "the marker moved past the turn"
    );
}

/// A provider answering `Missing`, which at its `at`th check adopts the session again onto
/// another source (the link changes during the check).
struct ReadoptAt {
    store: Arc<MemoryStore>,
    checks: AtomicUsize,
    at: usize,
}

#[async_trait]
impl UpstreamProvider for ReadoptAt {
    fn kind(&self) -> &'static str {
        "scripted"
    }

    async fn check(&self, link: &UpstreamLink, _: &[String]) -> CheckOutcome {
        if self.checks.fetch_add(1, Ordering::SeqCst) + 1 == self.at {
            let spec = LinkSpec::new(link.session.clone(), "remote", "h", "t2", "scripted");
            self.store
                .upsert_link(spec, link.updated_at.plus_ms(1_000))
                .await
                .unwrap();
        }
        CheckOutcome::Missing
    }
}

/// The third missing check of a link adopted again during that check records upstream_missing but
/// keeps the new link: the removal is made only if the link is still the one the tick read. (What
/// the mutation did: the removal took no token, and a link adopted again during its last missing
/// check was removed; review of stop 64, MO29.)
#[tokio::test]
async fn a_link_adopted_again_during_its_last_missing_check_is_kept() {
    let w = world();
    let session = w.adopt_remote("agent:main:remote", "scripted").await;
    let monitor = w
        .monitor()
        .provider(Arc::new(ReadoptAt {
            store: w.store.clone(),
            checks: AtomicUsize::new(0),
            at: 3,
        }))
        .build();
    let mut rx = monitor.subscribe();
    for _ in 0..3 {
        monitor.tick().await;
    }
    let mut ds = Vec::new();
    while let Ok(d) = rx.try_recv() {
        ds.push(d);
    }
    assert!(
        ds.iter().any(|d| matches!(
            d,
            Detection::UpstreamMissing {
                link_removed: false,
                ..
            }
        )),
        "{ds:?}"
    );
    let link = w.store.link(&session).await.unwrap();
    assert_eq!(
        link.map(|l| l.thread_id),
        Some("t2".to_owned()),
        "the link adopted again during the check is kept"
    );
}

/// The warning that runs in linked sessions deferred a check at five ticks is given once per link,
/// not once per streak. (What the mutation did: the warning repeated for every run of deferrals;
/// review of stop 64, MO25, MO26.)
#[tokio::test(start_paused = true)]
async fn linked_runs_deferring_a_check_five_times_is_warned_of_once_per_link() {
    let capture = common::Capture::default();
    let _guard = capture.install();
    let w = world();
    let (mut t, alpha, _beta, runs, monitor) = alpha_and_beta_with_runs(&w).await;
    runs.started(&alpha);
    // Beta: five deferrals by alpha's run, then checked alone; twice.
    deferring_both(&monitor, 5, "first streak").await;
    assert_eq!(monitor.tick().await.checked, 1);
    t.human("typed again");
    deferring_both(&monitor, 5, "second streak").await;
    assert_eq!(monitor.tick().await.checked, 1);
    let warned = capture
        .lines()
        .into_iter()
        .filter(|l| l.contains("deferred a session's check at 5 ticks") && l.contains("level=WARN"))
        .count();
    assert_eq!(warned, 1, "once per link: {:?}", capture.lines());
}

/// A link removed and adopted again starts its count of deferrals by linked runs from 0: the
/// deferrals of the removed link do not count towards checking the new one alone. (What the
/// mutation did: the deferral counts of removed links kept, so a link adopted again was checked
/// alone too early; review of stop 64, MO03.)
#[tokio::test(start_paused = true)]
async fn a_link_adopted_again_after_its_removal_counts_its_deferrals_from_zero() {
    let w = world();
    let (t, alpha, beta, runs, monitor) = alpha_and_beta_with_runs(&w).await;
    runs.started(&beta);
    deferring_both(&monitor, 4, "before the removal").await;
    assert!(w.store.remove_link(&alpha, None).await.unwrap());
    let r = monitor.tick().await;
    assert_eq!((r.links, r.deferred), (1, 1), "only beta listed");
    w.svc
        .try_adopt(jsonl::adoption(alpha.clone(), &t.path, None).unwrap())
        .await
        .unwrap();
    deferring_both(&monitor, 2, "after alpha was adopted again").await;
}

/// Refuses the next `left` calls of `call` (a store error), once armed.
struct RefuseNext {
    call: awareness_core::testkit::hooked::Call,
    left: AtomicUsize,
}

#[async_trait]
impl awareness_core::testkit::hooked::Hook for RefuseNext {
    fn refuse(&self, call: awareness_core::testkit::hooked::Call) -> Option<StoreError> {
        (call == self.call
            && self
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok())
        .then(|| StoreError::backend("hook", "refused once"))
    }
}

/// A tick at which the store cannot say whether the linked sessions are watched neither checks
/// nor defers them, and does not start again the count of ticks the other's runs deferred a
/// session at: four such ticks before it and one after are five, the session then checked
/// alone. (What the mutation did: a session whose watchers could not be read had that count
/// restarted, so a store failing now and then while agents take turns running kept it from
/// ever being checked alone; review of stop 70, MB27.)
#[tokio::test(start_paused = true)]
async fn a_tick_that_cannot_tell_whether_a_session_is_watched_keeps_its_count_of_deferrals() {
    let (w, hooked) = common::hooked_world(RefuseNext {
        call: awareness_core::testkit::hooked::Call::Cursors,
        left: AtomicUsize::new(0),
    });
    let (_t, alpha, beta, runs, monitor) = alpha_and_beta_with_runs(&w).await;
    runs.started(&alpha);
    deferring_both(&monitor, 4, "alpha running").await;
    // Both sessions' watchers cannot be read this tick.
    hooked.hook.left.store(2, Ordering::SeqCst);
    let r = monitor.tick().await;
    assert_eq!(
        (r.checked, r.deferred),
        (0, 0),
        "neither is known to be watched: {r:?}"
    );
    deferring_both(&monitor, 1, "alpha running, after the failed reads").await;
    let r = monitor.tick().await;
    assert_eq!(
        (r.checked, r.deferred),
        (1, 1),
        "beta checked alone: alpha's runs deferred it at five ticks since its last check"
    );
    assert_eq!(w.human_events(&beta).await, 1);
}

/// A store that fails (answers an error, promptly) to read one session's watchers costs that
/// session's check only: the links asked after it this tick are still checked. (What the mutation
/// did: one failed read of a session's watchers stopped every later link's check that tick; review
/// of stop 64, MO10.)
#[tokio::test]
async fn a_store_error_reading_one_sessions_watchers_skips_no_other_link() {
    let (w, hooked) = common::hooked_world(RefuseNext {
        call: awareness_core::testkit::hooked::Call::Cursors,
        left: AtomicUsize::new(0),
    });
    w.adopt_remote("agent:main:a", "scripted").await;
    w.adopt_remote("agent:main:b", "scripted").await;
    let monitor = w
        .monitor()
        .provider(Arc::new(Scripted::new(vec![
            CheckOutcome::Unchanged {
                marker: json!(1)
            };
            4
        ])))
        .build();
    for tick in 1..=2 {
        hooked.hook.left.store(1, Ordering::SeqCst);
        let r = monitor.tick().await;
        assert_eq!(
            r.checked, 1,
            "tick {tick}: the link asked after the failed read is checked: {r:?}"
        );
    }
}

/// When recording upstream_missing fails, the count of missing checks stays: the next check that
/// finds the source gone records it (not `missing_checks` checks later). (What the mutation did: a
/// failed record restarted the missing count; review of stop 64, MO28.)
#[tokio::test]
async fn a_failed_upstream_missing_record_is_retried_at_the_next_check() {
    let (w, hooked) = common::hooked_world(RefuseNext {
        call: awareness_core::testkit::hooked::Call::Record,
        left: AtomicUsize::new(0),
    });
    let session = w.adopt_remote("agent:main:remote", "scripted").await;
    let monitor = w
        .monitor()
        .provider(Arc::new(Scripted::new(vec![CheckOutcome::Missing; 4])))
        .build();
    monitor.tick().await;
    monitor.tick().await;
    hooked.hook.left.store(1, Ordering::SeqCst);
    let mut rx = monitor.subscribe();
    monitor.tick().await;
    let third: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok())
        .map(|d| d.to_string())
        .collect();
    assert!(
        third
            .iter()
            .any(|d| d.contains("upstream_missing was not recorded")),
        "{third:?}"
    );
    monitor.tick().await;
    assert_eq!(
        w.events(&session, EventKind::UpstreamMissing).await.len(),
        1,
        "recorded at the next check"
    );
    assert!(
        w.store.link(&session).await.unwrap().is_none(),
        "and the link removed"
    );
}

/// The WARN lines saying a scripted check failed.
fn check_failed_warnings(capture: &common::Capture) -> usize {
    capture
        .lines()
        .into_iter()
        .filter(|l| {
            l.contains("upstream check failed; retried next tick") && l.contains("level=WARN")
        })
        .count()
}

/// A provider whose checks fail, three times.
fn failing_three_times() -> Arc<Scripted> {
    Arc::new(Scripted::new(vec![CheckOutcome::Failed("boom".into()); 3]))
}

/// Two ticks of `monitor`, whose check of the one link fails at each: the failure is warned of
/// once while it repeats.
async fn warned_of_once_while_it_repeats(monitor: &UpstreamMonitor, capture: &common::Capture) {
    monitor.tick().await;
    monitor.tick().await;
    assert_eq!(check_failed_warnings(capture), 1, "once while it repeats");
}

/// A check failure logged at WARN is news again for a link adopted again after its removal: the
/// failures of links gone from the store are forgotten. (What the mutation did: the failures of
/// removed links kept, so the same failure was not warned of again; review of stop 64, MO04.)
#[tokio::test]
async fn a_check_failure_is_warned_of_again_once_the_link_was_removed_and_adopted_again() {
    let capture = common::Capture::default();
    let _guard = capture.install();
    let w = world();
    let session = w.adopt_remote("agent:main:remote", "scripted").await;
    let monitor = w.monitor().provider(failing_three_times()).build();
    warned_of_once_while_it_repeats(&monitor, &capture).await;
    assert!(w.store.remove_link(&session, None).await.unwrap());
    assert_eq!(monitor.tick().await.links, 0);
    w.adopt_remote("agent:main:remote", "scripted").await;
    monitor.tick().await;
    assert_eq!(
        check_failed_warnings(&capture),
        2,
        "news again for the new link: {:?}",
        capture.lines()
    );
}

/// A check failure logged at WARN is news again after a tick at which a run deferred the check.
/// (What the mutation did: a deferred tick forgot nothing, and the failure was not warned of again;
/// review of stop 64, MO13.)
#[tokio::test]
async fn a_check_failure_is_warned_of_again_after_a_tick_a_run_deferred_it() {
    let capture = common::Capture::default();
    let _guard = capture.install();
    let w = world();
    let session = w.adopt_remote("agent:main:remote", "scripted").await;
    let runs = Arc::new(RunTracker::new());
    let monitor = w
        .monitor()
        .run_activity(runs.clone())
        .provider(failing_three_times())
        .build();
    warned_of_once_while_it_repeats(&monitor, &capture).await;
    runs.started(&session);
    assert_eq!(monitor.tick().await.deferred, 1);
    runs.finished(&session);
    monitor.tick().await;
    assert_eq!(
        check_failed_warnings(&capture),
        2,
        "news again after the deferred tick: {:?}",
        capture.lines()
    );
}

/// With `owned_watchers_only`, a check failure logged at WARN is news again after a tick at which
/// another gateway owned the session. (What the mutation did: a tick another gateway owned forgot
/// nothing, and the failure was not warned of again; review of stop 64, MO07.)
#[tokio::test]
async fn a_check_failure_is_warned_of_again_after_a_tick_another_gateway_owned_the_session() {
    let capture = common::Capture::default();
    let _guard = capture.install();
    let w = world();
    let session = w.adopt_remote("agent:main:remote", "scripted").await;
    let directory = Arc::new(InMemoryDirectory::new());
    directory.upsert(
        session.session_key.clone(),
        gateway_adapter::SessionEntry::default(),
    );
    let monitor = owned_watchers_only_monitor(&w, directory.clone())
        .provider(failing_three_times())
        .build();
    warned_of_once_while_it_repeats(&monitor, &capture).await;
    directory.remove(&session.session_key);
    assert_eq!(monitor.tick().await.not_owned, 1);
    directory.upsert(
        session.session_key.clone(),
        gateway_adapter::SessionEntry::default(),
    );
    monitor.tick().await;
    assert_eq!(
        check_failed_warnings(&capture),
        2,
        "news again after the not-owned tick: {:?}",
        capture.lines()
    );
}

/// The WARN lines saying the own prompts port panicked for a linked session.
fn linked_prompts_warnings(capture: &common::Capture) -> usize {
    capture
        .lines()
        .into_iter()
        .filter(|l| {
            l.contains("own prompts panicked for a session linked")
                && l.contains("session_key=agent:alpha:main")
                && l.contains("level=WARN")
        })
        .count()
}

/// A linked session's port that panics is warned of once until it answers, however the checked
/// link's own ticks go: a tick at which a run of its own deferred the check does not make the same
/// panic news again. (What the mutation did: forgetting a link dropped its linked sessions' port
/// failures too, warned of again; review of stop 64, MO33.)
#[tokio::test(start_paused = true)]
async fn a_linked_sessions_port_panic_is_not_warned_of_again_after_a_deferred_tick() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let w = world();
    let t = Transcript::new();
    let (alpha, beta) = alpha_and_beta(&w, &t).await;
    let ports = Arc::new(PanicsFor::new(&beta));
    ports.prompts.store(true, Ordering::SeqCst);
    let runs = Arc::new(RunTracker::new());
    let monitor = w
        .monitor()
        .run_activity(runs.clone())
        .own_prompts(ports.clone())
        .build();
    monitor.tick().await;
    monitor.tick().await;
    assert_eq!(
        linked_prompts_warnings(&capture),
        1,
        "once while it repeats"
    );
    runs.started(&alpha);
    assert_eq!(monitor.tick().await.deferred, 2);
    runs.finished(&alpha);
    monitor.tick().await;
    assert_eq!(
        linked_prompts_warnings(&capture),
        1,
        "the port has not answered since: {:?}",
        capture.lines()
    );
}

/// A linked session's port failure is forgotten once that session's link is gone: when it is
/// adopted again and its port still panics, that is news again. (What the mutation did: linked-port
/// failures of sessions whose link was gone kept, and not warned of again; review of stop 64,
/// MO34.)
#[tokio::test(start_paused = true)]
async fn a_linked_sessions_port_panic_is_warned_of_again_once_its_link_came_back() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let w = world();
    let t = Transcript::new();
    let (_alpha, beta) = alpha_and_beta(&w, &t).await;
    let ports = Arc::new(PanicsFor::new(&beta));
    ports.prompts.store(true, Ordering::SeqCst);
    let monitor = w.monitor().own_prompts(ports.clone()).build();
    monitor.tick().await;
    assert_eq!(linked_prompts_warnings(&capture), 1);
    assert!(w.store.remove_link(&beta, None).await.unwrap());
    assert_eq!(monitor.tick().await.links, 1);
    w.adopt(&t, "agent:beta:main", "beta", "agent:beta:lead")
        .await;
    monitor.tick().await;
    assert_eq!(
        linked_prompts_warnings(&capture),
        2,
        "news again once beta's link came back: {:?}",
        capture.lines()
    );
}

/// A check failure logged at WARN is news again after a tick at which the session's link was of a
/// kind no provider reads (adopted again onto another kind, then back). (What the mutation did: a
/// tick with no provider forgot nothing, and the failure was not warned of again; review of stop
/// 64, MO06.)
#[tokio::test]
async fn a_check_failure_is_warned_of_again_after_a_tick_its_link_had_no_provider() {
    let capture = common::Capture::default();
    let _guard = capture.install();
    let w = world();
    let session = w.adopt_remote("agent:main:remote", "scripted").await;
    let monitor = w.monitor().provider(failing_three_times()).build();
    warned_of_once_while_it_repeats(&monitor, &capture).await;
    let unread = LinkSpec::new(session.clone(), "remote", "h", "t", "no-such-kind");
    w.svc.adopt(unread).await.unwrap();
    assert_eq!(monitor.tick().await.no_provider, 1);
    let back = LinkSpec::new(session.clone(), "remote", "h", "t", "scripted");
    w.svc.adopt(back).await.unwrap();
    monitor.tick().await;
    assert_eq!(
        check_failed_warnings(&capture),
        2,
        "news again after the tick without a provider: {:?}",
        capture.lines()
    );
}

/// A gateway directory that panics while its flag is set, and otherwise knows every session.
struct PanicsWhileSet(AtomicBool);

impl gateway_adapter::SessionDirectory for PanicsWhileSet {
    fn exists(&self, _session: &SessionKey) -> bool {
        assert!(
            !self.0.load(Ordering::SeqCst),
            "the gateway's directory panicked"
        );
        true
    }

    fn entry(&self, _session: &SessionKey) -> Option<gateway_adapter::SessionEntry> {
        None
    }
}

/// A directory that panicked, answered, then panicked again is warned of again: its failure
/// ended when it answered. (What the mutation did: the directory's answer did not end the logged
/// failure, so the second panic was logged at DEBUG only; review of stop 65, MW05.)
#[tokio::test(start_paused = true)]
async fn a_directory_panicking_again_after_it_answered_is_warned_of_again() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let (w, _t, _session) = worker_adopted().await;
    let directory = Arc::new(PanicsWhileSet(AtomicBool::new(true)));
    let config = gateway_adapter::AwarenessConfig {
        owned_watchers_only: true,
        ..gateway_adapter::AwarenessConfig::default()
    };
    let svc = Arc::new(
        Awareness::builder(
            w.store.clone(),
            Arc::new(InMemoryQueue::new()),
            Arc::new(RecordingWake::new()),
            directory.clone(),
        )
        .upstream(w.store.clone())
        .config(config)
        .build(),
    );
    let monitor = UpstreamMonitor::builder(svc, w.store.clone())
        .provider(Arc::new(JsonlProvider::new()))
        .build();
    let what = "session directory panicked when asked";
    monitor.tick().await;
    monitor.tick().await;
    assert_eq!(
        capture.said(&[what, "level=WARN"]),
        1,
        "once while it repeats"
    );
    directory.0.store(false, Ordering::SeqCst);
    assert_eq!(monitor.tick().await.checked, 1, "the directory answers");
    directory.0.store(true, Ordering::SeqCst);
    monitor.tick().await;
    assert_eq!(
        capture.said(&[what, "level=WARN"]),
        2,
        "warned of again after the directory answered"
    );
}

/// A monitor over `flaky`'s links (those of `w`) with a scripted provider answering `outcomes`.
fn scripted_over(w: &World, flaky: &Arc<Flaky>, outcomes: Vec<CheckOutcome>) -> UpstreamMonitor {
    UpstreamMonitor::builder(w.svc.clone(), flaky.clone())
        .provider(Arc::new(Scripted::new(outcomes)))
        .build()
}

/// Ticks of `monitor` over one link whose store write fails while `fail` (given how many of the
/// next ones fail) says so: failing twice, the failure is warned of once; once a write worked,
/// failing again, it is warned of again.
async fn warned_again_once_it_worked(
    monitor: &UpstreamMonitor,
    capture: &common::Capture,
    what: &str,
    fail: impl Fn(usize),
) {
    fail(2);
    monitor.tick().await;
    monitor.tick().await;
    assert_eq!(
        capture.said(&[what, "level=WARN"]),
        1,
        "{what}: once while it repeats"
    );
    assert_eq!(monitor.tick().await.checked, 1, "{what}: the write works");
    fail(1);
    monitor.tick().await;
    assert_eq!(
        capture.said(&[what, "level=WARN"]),
        2,
        "{what}: warned of again after a write worked"
    );
}

/// A failure of a tick's store calls counts as over once the call works, and is warned of
/// again when it comes back, once while it repeats: storing the scan time, moving the marker,
/// listing the links, reading the session's watchers. (What the mutations did: the call that
/// worked did not end the logged failure, so the next one was logged at DEBUG only, review of
/// stop 65, MW13, MW20 and MW35, and of stop 66, M541 for the listing; or every failed listing
/// was warned of, at every tick, M542.)
#[tokio::test]
async fn a_store_write_failing_again_after_one_worked_is_warned_of_again() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    // The same marker at every check (only the scan time is stored), or a new one each time.
    let outcomes = |moving: bool| -> Vec<CheckOutcome> {
        (1..=4)
            .map(|n| CheckOutcome::Unchanged {
                marker: json!(if moving { n } else { 1 }),
            })
            .collect()
    };
    for (what, moving) in [
        ("scan time not stored", false),
        ("upstream marker not moved", true),
        ("cannot list links", false),
    ] {
        let w = world();
        w.adopt_remote("agent:main:remote", "scripted").await;
        let flaky = Arc::new(Flaky::over(&w.store));
        let monitor = scripted_over(&w, &flaky, outcomes(moving));
        let failing = match what {
            "scan time not stored" => &flaky.fail_scans,
            "upstream marker not moved" => &flaky.fail_moves,
            _ => &flaky.panic_lists,
        };
        warned_again_once_it_worked(&monitor, &capture, what, |n| {
            failing.store(n, Ordering::SeqCst);
        })
        .await;
    }
    let (w, hooked) = common::hooked_world(RefuseNext {
        call: awareness_core::testkit::hooked::Call::Cursors,
        left: AtomicUsize::new(0),
    });
    w.adopt_remote("agent:main:remote", "scripted").await;
    let monitor = w
        .monitor()
        .provider(Arc::new(Scripted::new(outcomes(false))))
        .build();
    warned_again_once_it_worked(
        &monitor,
        &capture,
        "cannot tell whether the session is watched",
        |n| hooked.hook.left.store(n, Ordering::SeqCst),
    )
    .await;
}

/// A link removal that failed, then worked, then failed again (for the session adopted again)
/// is warned of twice: the removal that worked ended the failure. (What the mutation did: a
/// removal that worked did not end the logged failure, and the session's link was back by the
/// next listing, so the next failure was logged at DEBUG only; review of stop 65, MW24.)
#[tokio::test]
async fn a_link_removal_failing_again_after_one_worked_is_warned_of_again() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let w = world();
    let session = w.adopt_remote("agent:main:remote", "scripted").await;
    let flaky = Arc::new(Flaky::over(&w.store));
    let monitor = scripted_over(&w, &flaky, vec![CheckOutcome::Missing; 7]);
    let what = "upstream link not removed";
    flaky.fail_removes.store(1, Ordering::SeqCst);
    for _ in 0..3 {
        monitor.tick().await;
    }
    assert_eq!(capture.said(&[what, "level=WARN"]), 1, "the removal failed");
    monitor.tick().await;
    assert!(w.store.link(&session).await.unwrap().is_none(), "removed");
    // Adopted again onto another thread: `upstream_missing`'s dedupe key names the link by its
    // source and its millisecond, and the same source adopted again within the millisecond
    // would be taken for a retry of the first event.
    let again = LinkSpec::new(session.clone(), "remote", "h", "t2", "scripted");
    w.adopt_spec(again, "agent:main:main").await;
    flaky.fail_removes.store(1, Ordering::SeqCst);
    for _ in 0..3 {
        monitor.tick().await;
    }
    assert_eq!(
        w.events(&session, EventKind::UpstreamMissing).await.len(),
        2,
        "recorded for each link"
    );
    assert_eq!(
        capture.said(&[what, "level=WARN"]),
        2,
        "warned of again after a removal worked"
    );
}

/// A link the tick does not check (here: of a kind no provider reads) forgets its own logged
/// failures only: another link's check failing alike at every tick is still warned of once.
/// (What the mutation did: such a link forgot every link's logged failures, so the other link's
/// failure was warned of at every tick; review of stop 66, M544.)
#[tokio::test]
async fn a_link_not_checked_forgets_no_other_links_logged_failure() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let w = world();
    w.adopt_remote("agent:main:a", "nobody").await;
    w.adopt_remote("agent:main:b", "scripted").await;
    let monitor = w.monitor().provider(failing_three_times()).build();
    monitor.tick().await;
    let r = monitor.tick().await;
    assert_eq!((r.no_provider, r.checked), (1, 1));
    assert_eq!(
        check_failed_warnings(&capture),
        1,
        "the other link's failure is warned of once while it repeats"
    );
}

/// A provider whose first check takes 150 s (of paused time); the others answer at once.
struct SlowFirst(AtomicBool);

#[async_trait]
impl UpstreamProvider for SlowFirst {
    fn kind(&self) -> &'static str {
        "scripted"
    }

    async fn check(&self, _: &UpstreamLink, _: &[String]) -> CheckOutcome {
        if self.0.swap(false, Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(150)).await;
        }
        CheckOutcome::Unchanged { marker: json!(1) }
    }
}

/// The times, from its task's start, at which the first `n` ticks of a monitor of one link end,
/// its ticks `interval` apart, the link's first check taking 150 s ([`SlowFirst`]).
async fn tick_ends_after_a_slow_first_check(interval: Duration, n: usize) -> Vec<Duration> {
    let w = world();
    w.adopt_remote("agent:main:remote", "scripted").await;
    let monitor = w
        .monitor()
        .provider(Arc::new(SlowFirst(AtomicBool::new(true))))
        .config(gateway_adapter::MonitorConfig {
            first_tick: Duration::from_secs(1),
            interval,
            provider_timeout: Duration::from_mins(5),
            missing_checks: 3,
        })
        .build();
    let mut rx = monitor.subscribe();
    let start = Instant::now();
    let task = monitor.spawn();
    let mut ends = Vec::new();
    for _ in 0..n {
        next_tick(&mut rx).await;
        ends.push(start.elapsed());
    }
    task.stop().await;
    ends
}

/// A tick longer than two intervals delays the ticks after it: the ones it missed are not run
/// back to back once it ends (one tick at its end, then one an interval later). (What the
/// mutation did: missed ticks burst, three ticks at the end of the long one; review of stop 65,
/// MW31.)
#[tokio::test(start_paused = true)]
async fn ticks_missed_during_a_long_tick_are_not_run_back_to_back() {
    let ends = tick_ends_after_a_slow_first_check(Duration::from_mins(1), 3).await;
    assert!(
        ends[2] >= ends[1] + Duration::from_secs(59),
        "an interval after the tick that followed the long one: {ends:?}"
    );
}

/// A tick keeps to the schedule of its task: one that takes a while (shorter than the interval)
/// does not push the next tick back, which comes an interval after it began. (What the mutation
/// did: the interval was counted again from the end of each tick, so the ticks drifted later by
/// each tick's length; review of stop 70, MB33.)
#[tokio::test(start_paused = true)]
async fn a_tick_shorter_than_the_interval_does_not_delay_the_next() {
    let ends = tick_ends_after_a_slow_first_check(Duration::from_mins(5), 2).await;
    assert!(
        ends[1] < ends[0] + Duration::from_mins(5),
        "the second tick comes an interval after the first began, not after it ended: {ends:?}"
    );
}

/// Stopping the monitor's task ends the pass over unwatched links that a tick left hanging:
/// `stop` returns, and once it has (and the monitor's handles are dropped), nothing of the pass
/// holds the store. (What the mutations did: the pass was awaited without being aborted, so a
/// read that hangs held `stop` for good, review of stop 65, MW30; the task's end left the pass
/// to the last handle's drop, which aborts it without waiting, so it still held the store when
/// the caller went on, review of stop 66, M539.)
#[tokio::test(start_paused = true)]
async fn stopping_the_task_ends_a_hanging_pass_over_an_unwatched_link() {
    let w = world();
    let r = SessionRef::parse("agent:main:remote", "main").unwrap();
    let spec = LinkSpec::new(r, "remote", "h", "t", "hanging");
    assert!(w.svc.try_adopt(spec).await.unwrap().created);
    let World {
        store,
        svc: awareness,
        ..
    } = w;
    let monitor = UpstreamMonitor::builder(awareness.clone(), store.clone())
        .provider(Arc::new(Hanging))
        .build();
    drop(awareness);
    let mut rx = monitor.subscribe();
    let task = monitor.spawn();
    assert_eq!(next_tick(&mut rx).await.unwatched, 1);
    assert!(
        tokio::time::timeout(Duration::from_hours(1), task.stop())
            .await
            .is_ok(),
        "stop returns though the pass still reads"
    );
    drop(monitor);
    assert_eq!(
        Arc::strong_count(&store),
        1,
        "the pass of the stopped monitor still holds the store"
    );
}
