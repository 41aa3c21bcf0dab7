//! The local JSONL provider: a Claude Code transcript on this host (kind [`LOCAL_JSONL`], the
//! link's reference `{"path": "/abs/file.jsonl"}`).
//!
//! Each check reads forward from the marker ([`JsonlMarker`]), at most 1 MiB a tick, with
//! `std::fs` inside `spawn_blocking`, and classifies each complete line with
//! [`super::transcript`]:
//!
//! - **whole lines only**: `offset` sits at the start of a line; the bytes of a line not
//!   complete yet (its end is not written, or the tick's budget ran out inside it) are kept as
//!   the streaming reader's state in `partial`, and the next check resumes there. A line larger
//!   than the budget, or of several MB, is classified by streaming through it over as many ticks
//!   as it needs, never holding it, never skipping an unclassified byte, and never blocking the
//!   marker. The exceptions are a rebase (below) onto a last line that started more than one
//!   budget before the file's end: that line is skipped to its end (`offset` is then the first
//!   byte looked at, inside it), as everything before a rebase is; and a stored partial state
//!   the reader could not be in (a marker edited by hand, [`LineScanner::is_sound`]): that
//!   line is skipped to its end, logged, and the read goes on;
//! - **identity checked**: the marker remembers the file's device and inode, its size, and a
//!   hash of the 64 bytes before the read position. A file replaced by another (a new inode),
//!   shrunk (below its last size: an append-only transcript never shrinks), or rewritten under
//!   the position (the bytes before it changed) is **rebased** ([`CheckOutcome::Rebased`]): the marker moves to the start of the
//!   file's last line, and what the file held before is not counted (it cannot be told apart
//!   from old history). Finding that line reads back at most the tick's budget: a last line
//!   that started before it (an unfinished line of several MB) is skipped to its end. A file that no longer exists is [`CheckOutcome::Missing`].
//!   A rebase also gives the marker a new [`JsonlMarker::generation`], which the dedupe id of a
//!   turn without a uuid (`<dev>:<ino>:<16 hex of the generation>:<line offset>`) names: a
//!   line written at an offset where a recorded one was before a truncation is a new turn.
//! - **a read that hangs holds one thread, not one a tick**: a path that is not a regular file
//!   (a FIFO would block its open until a writer came) is refused before it is opened, and
//!   opened without blocking (`O_NONBLOCK` on Unix), so that one swapped in meanwhile fails at
//!   once; a link whose path is not absolute is not read (an adoption stores the absolute
//!   path); and a
//!   link whose previous check is still reading (a hung network mount, say: the monitor's
//!   timeout stops waiting for it, but a blocking read cannot be cancelled) fails its check at
//!   once instead of starting another read. (Links of several sessions on one transcript are
//!   read side by side, as before.) Without that, each tick would leave one more
//!   blocked thread behind, until tokio's blocking pool, which the other checks and a redb
//!   store share, was full.

use std::collections::HashSet;
use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use awareness_core::error::ErrorChain;
use awareness_core::upstream::{self, TextFingerprint, exact_u64};
use awareness_core::{LinkSpec, SessionRef, UpstreamLink, async_trait};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::debug;

use super::transcript::{LineEnd, LineScanner, classify};
use super::{CheckOutcome, UpstreamProvider};
use crate::config::ConfigError;

/// The `upstream_kind` of a local JSONL transcript.
pub const LOCAL_JSONL: &str = "local-jsonl";

/// Bytes read from a transcript in one check (DESIGN.md section 8).
pub const MAX_BYTES_PER_TICK: u64 = 1024 * 1024;

/// Size of one read.
const CHUNK: usize = 64 * 1024;

/// Bytes before the read position whose hash detects a rewritten file.
const TAIL_BYTES: u64 = 64;

/// How far a transcript has been read. Its 64-bit numbers are written as JSON numbers below
/// 2^53 and as strings of digits from 2^53 on ([`exact_u64`]: an inode can be that high, on
/// overlay file systems among others), so that another reader of the link that takes
/// numbers as doubles and writes the marker back leaves them exact; both forms are read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JsonlMarker {
    /// The start of the first line not classified yet; after a rebase onto a last line that
    /// started before the bytes it looked at, the first byte looked at (the line is then
    /// skipped to its end: `partial` is [`LineScanner::skipping`]).
    #[serde(with = "exact_u64")]
    pub offset: u64,
    /// The file's device when the marker was written: the fallback dedupe id of a turn without
    /// a uuid read from this marker names it (so a re-read of the same lines gives the same
    /// ids even if the device number changed meanwhile). Not compared: a device number can
    /// change across a reboot or a remount while the file stays. 0 when the marker did not
    /// say (a bare `{"offset": N}`, as another reader of the link may have written it).
    #[serde(default, with = "exact_u64")]
    pub dev: u64,
    /// The file's inode: another one means the file was replaced. 0 when the marker did not
    /// say: a bare offset is then only checked against the file's size (a replaced file as
    /// long is read from it, once: the next marker carries the identity and the tail).
    #[serde(default, with = "exact_u64")]
    pub ino: u64,
    /// The file's size when last checked (0 when the marker did not say).
    #[serde(default, with = "exact_u64")]
    pub size: u64,
    /// 16 hex of the FNV-1a 64 of the (up to) 64 bytes before [`JsonlMarker::position`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<String>,
    /// The streaming reader's state inside the line at `offset`, when part of it was read (or,
    /// after a rebase onto a line that started before `offset`, [`LineScanner::skipping`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<LineScanner>,
    /// Which reading of the file's bytes this is: a fresh value at each rebase (and adoption,
    /// [`marker_at_end`]), copied into every marker a forward read writes from it. The
    /// fallback dedupe id of a turn without a uuid names it beside the device, inode and line
    /// offset: after a truncation (the same inode, rebased) or a file recreated on a reused
    /// inode, a new line at an offset an old one had is another turn, not a dedupe hit on the
    /// old one's event, while the same lines read again from the same marker keep their ids.
    /// 0 (not stored) when the marker did not say: a marker written before generations
    /// existed, or a bare `{"offset": N}`; its fallback ids keep their form of then.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u64,
}

// `skip_serializing_if` passes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A [`JsonlMarker::generation`] no other rebase gives: random (std's random hash-map
/// keys) and distinct within the process (a counter and the clock are hashed in); never 0,
/// and below 2^53.
fn fresh_generation() -> u64 {
    use std::hash::BuildHasher as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let count = COUNT.fetch_add(1, Ordering::Relaxed);
    let hash = std::collections::hash_map::RandomState::new().hash_one((count, nanos));
    // Within a JSON number's exact integers (below 2^53), which a reader that takes numbers as
    // doubles (JavaScript) writes back unchanged.
    (hash & ((1 << 53) - 1)).max(1)
}

/// The dedupe id of a human turn without a uuid (or with an empty one) in the line starting at
/// `line_start`, read from a marker of `generation` on the file `dev`/`ino`.
fn fallback_id(dev: u64, ino: u64, generation: u64, line_start: u64) -> String {
    if generation == 0 {
        // The form of markers without a generation, so that a read made again after an
        // upgrade names the turns it already recorded alike.
        format!("{dev}:{ino}:{line_start}")
    } else {
        format!("{dev}:{ino}:{generation:016x}:{line_start}")
    }
}

impl JsonlMarker {
    /// Where the next read starts: `offset` plus what was read of the partial line (at most
    /// `u64::MAX`: a marker edited by hand to point past every file is rebased as one past
    /// its file's end).
    pub fn position(&self) -> u64 {
        self.offset
            .saturating_add(self.partial.as_ref().map_or(0, |p| p.consumed))
    }

    /// The marker as stored in the link.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// A stored marker; `None` when it is not one of ours (the link is then rebased).
    pub fn from_value(value: &Value) -> Option<Self> {
        serde_json::from_value(value.clone()).ok()
    }
}

/// The UTF-8 byte order mark.
const MARK: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// What the file's first bytes hold of a byte order mark ([`blank_byte_order_mark`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// The whole mark.
    Whole,
    /// Only the start of one so far (one or two bytes, and nothing after them).
    NotYet,
    /// None.
    None,
}

/// What the file's first three bytes hold of a byte order mark.
fn byte_order_mark(file: &mut File) -> std::io::Result<Mark> {
    let mut first = [0u8; 3];
    let mut got = 0;
    file.seek(SeekFrom::Start(0))?;
    while got < first.len() {
        match file.read(&mut first[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(match got {
        3 if first == MARK => Mark::Whole,
        1 | 2 if first[..got] == MARK[..got] => Mark::NotYet,
        _ => Mark::None,
    })
}

/// A UTF-8 byte order mark at the start of the file (a writer on Windows) is read as the
/// whitespace it stands for (RFC 8259 lets a reader ignore it): a row is an object, and the
/// mark made the first one malformed, its human turn never counted. Only a whole mark is: a
/// file that holds only its first byte or two is not read on until it holds three
/// ([`Mark::NotYet`]), so a mark written over two scans is blanked whole and a file that starts
/// with one of its bytes and goes on otherwise (or a later line that starts with one) is read
/// as written. `chunk` was read from file position `at`, in a file that starts with the mark
/// ([`Mark::Whole`]); the mark's bytes in it are blanked, nothing else.
fn blank_byte_order_mark(at: u64, chunk: &mut [u8]) {
    for position in (at as usize)..MARK.len() {
        if let Some(byte) = chunk.get_mut(position - at as usize) {
            *byte = b' ';
        }
    }
}

/// The reference of a transcript link: `{"path": "<path>"}`. A link stores its reference as
/// JSON text, so a path that is not UTF-8 is written lossily (its bad bytes as U+FFFD), naming
/// another file; [`adoption`] refuses such a path.
pub fn jsonl_ref(path: &Path) -> Value {
    json!({ "path": path.to_string_lossy() })
}

/// The transcript a link names.
pub fn path_of(link: &UpstreamLink) -> Option<PathBuf> {
    link.upstream_ref
        .as_ref()?
        .get("path")?
        .as_str()
        .map(PathBuf::from)
}

/// The file's device and inode (on a platform without them, zeros: only size and content are
/// checked there).
fn identity(meta: &std::fs::Metadata) -> (u64, u64) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        (meta.dev(), meta.ino())
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        (0, 0)
    }
}

fn tail_of(file: &mut File, pos: u64) -> std::io::Result<String> {
    let n = pos.min(TAIL_BYTES);
    let mut buf = vec![0u8; n as usize];
    file.seek(SeekFrom::Start(pos - n))?;
    file.read_exact(&mut buf)?;
    Ok(format!("{:016x}", upstream::fnv1a64(&buf)))
}

/// The start of the last line of a file of `size` bytes (its size when the last byte is `\n`)
/// when it lies within the last `limit` bytes; `None` when the last line starts before them.
fn last_line_start(file: &mut File, size: u64, limit: u64) -> std::io::Result<Option<u64>> {
    if size <= limit {
        // The whole file is within reach: a line starts at 0 if none starts later.
        return Ok(Some(last_newline_after(file, 0, size)?.unwrap_or(0)));
    }
    // A line starting at `size - limit` is within reach: the `\n` ending the line before it
    // is one byte further back.
    last_newline_after(file, size - limit - 1, size)
}

/// One past the last `\n` in `floor..size`, read backwards: the start of the line after it.
fn last_newline_after(file: &mut File, floor: u64, size: u64) -> std::io::Result<Option<u64>> {
    let mut end = size;
    let mut buf = vec![0u8; CHUNK];
    while end > floor {
        let start = end.saturating_sub(CHUNK as u64).max(floor);
        let chunk = &mut buf[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|b| *b == b'\n') {
            return Ok(Some(start + i as u64 + 1));
        }
        end = start;
    }
    Ok(None)
}

/// The marker at the end of `file`, found reading back at most `limit` bytes (see
/// [`marker_at_end`]).
fn marker_at_end_of(file: &mut File, limit: u64) -> std::io::Result<JsonlMarker> {
    let meta = file.metadata()?;
    let size = meta.len();
    let (offset, partial, position) = match last_line_start(file, size, limit)? {
        Some(offset) => (offset, None, offset),
        // The last line started before the bytes looked at: it is skipped to its end.
        None => (size - limit, Some(LineScanner::skipping(limit)), size),
    };
    let (dev, ino) = identity(&meta);
    Ok(JsonlMarker {
        offset,
        dev,
        ino,
        size,
        tail: Some(tail_of(file, position)?),
        partial,
        generation: fresh_generation(),
    })
}

/// The marker of a transcript "from now on": at the start of its last line (its end when the
/// last line is complete), so that nothing already written counts, while a line being written
/// right now does. It reads back at most [`MAX_BYTES_PER_TICK`] from the end: a last line that
/// started before them (an unfinished line of several MB, or a file without any newline) is
/// skipped to its end, not classified. Blocking.
///
/// A path that is not a regular file (a FIFO, whose open would block until a writer came, a
/// directory, a device) is refused before it is opened, with an
/// [`ErrorKind::InvalidInput`] error naming it.
pub fn marker_at_end(path: &Path) -> std::io::Result<JsonlMarker> {
    let (mut file, _) = open_regular(path)?;
    marker_at_end_of(&mut file, MAX_BYTES_PER_TICK)
}

/// Opens `path` for reading if it is a regular file, with its metadata; anything else (a FIFO,
/// a directory, a device) is an [`ErrorKind::InvalidInput`] error naming it. It is looked at
/// before it is opened, and again once opened (it may have been replaced between the two). On
/// Unix the open does not block (`O_NONBLOCK`, which changes nothing for a regular file):
/// opening a FIFO for reading otherwise waits until a writer comes, so that one swapped in
/// after the look (by whatever writes the transcript's directory) held a reading thread, and
/// one of the few reads allowed at once, for good.
fn open_regular(path: &Path) -> std::io::Result<(File, std::fs::Metadata)> {
    let not_a_file = || {
        std::io::Error::new(
            ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        )
    };
    if !std::fs::metadata(path)?.is_file() {
        return Err(not_a_file());
    }
    #[cfg(test)]
    tests::while_reading(path);
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = options.open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_a_file());
    }
    Ok((file, meta))
}

/// What [`crate::Awareness::adopt`] needs to adopt a transcript for `session`: catalog
/// `claude-code`, host `local`, the file's stem as the thread (unless given), the absolute path
/// as reference and [`marker_at_end`] as the marker. Blocking; a path that is not a regular
/// file is refused without being opened ([`marker_at_end`]), and so is one that is not UTF-8
/// (`InvalidInput`): the link stores it as JSON text.
pub fn adoption(
    session: SessionRef,
    path: &Path,
    thread_id: Option<&str>,
) -> std::io::Result<LinkSpec> {
    let path = std::fs::canonicalize(path)?;
    if path.to_str().is_none() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} is not a UTF-8 path, which a link cannot store",
                path.display()
            ),
        ));
    }
    let marker = marker_at_end(&path)?;
    let thread = match thread_id {
        Some(t) => t.to_owned(),
        None => path.file_stem().map_or_else(
            || "transcript".to_owned(),
            |s| s.to_string_lossy().into_owned(),
        ),
    };
    Ok(
        LinkSpec::new(session, "claude-code", "local", thread, LOCAL_JSONL)
            .with_ref(jsonl_ref(&path))
            .with_marker(marker.to_value()),
    )
}

/// Reads a transcript forward from `marker`, at most `budget` bytes, and counts human turns.
/// Blocking; the provider runs it in `spawn_blocking`.
pub fn scan(
    path: &Path,
    marker: Option<&JsonlMarker>,
    own: &[TextFingerprint],
    budget: u64,
) -> CheckOutcome {
    match try_scan(path, marker, own, budget.max(1)) {
        Ok(outcome) => outcome,
        Err(e) if e.kind() == ErrorKind::NotFound => CheckOutcome::Missing,
        Err(e) => CheckOutcome::Failed(format!("reading {}: {}", path.display(), ErrorChain(&e))),
    }
}

fn try_scan(
    path: &Path,
    marker: Option<&JsonlMarker>,
    own: &[TextFingerprint],
    budget: u64,
) -> std::io::Result<CheckOutcome> {
    let (mut file, meta) = open_regular(path)?;
    let ((dev, ino), size) = (identity(&meta), meta.len());
    let why_rebase = match marker {
        None => Some("no usable marker"),
        Some(m) if m.ino != 0 && m.ino != ino => Some("the file was replaced"),
        Some(m) if size < m.position() || size < m.size => Some("the file shrank"),
        Some(m) => match &m.tail {
            Some(t) if *t != tail_of(&mut file, m.position())? => {
                Some("the file was rewritten under the marker")
            }
            _ => None,
        },
    };
    let last = match (why_rebase, marker) {
        (None, Some(last)) => last,
        (why, _) => {
            // Within the check's budget too: a rebase onto a last line of several MB reads
            // no more than a forward read would.
            let rebased = marker_at_end_of(&mut file, budget)?;
            let why = why.unwrap_or("no usable marker");
            debug!(path = %path.display(), reason = why, offset = rebased.offset, "transcript rebased");
            return Ok(CheckOutcome::Rebased {
                marker: rebased.to_value(),
            });
        }
    };
    let start = last.position();
    // The file's byte order mark, when the read starts within the first three bytes.
    let mark = if start < MARK.len() as u64 {
        byte_order_mark(&mut file)?
    } else {
        Mark::None
    };
    if mark == Mark::NotYet {
        // Nothing but the start of a mark so far: read once it is whole, or is not a mark.
        return Ok(CheckOutcome::Unchanged {
            marker: last.to_value(),
        });
    }
    // The device the fallback ids name: the marker's, so that the same lines read again from
    // the same marker are named alike (as is its generation, `fallback_id`).
    let id_dev = if last.dev == 0 { dev } else { last.dev };
    // A partial line's state comes from the store, where anyone may have edited it: one the
    // scanner could not be in costs that line, which is skipped to its end.
    let mut scanner = match &last.partial {
        Some(p) if !p.is_sound() => {
            tracing::warn!(path = %path.display(), offset = last.offset,
                "the stored state of a partly read transcript line is not one the reader can be in; that line is skipped");
            LineScanner::skipping(p.consumed)
        }
        p => p.clone().unwrap_or_default(),
    };
    let mut line_start = last.offset;
    let mut at = start;
    let mut turns = 0u32;
    // The burst is named by its last human turn (see `CheckOutcome::HumanTurns::dedupe_id`).
    let mut last_id: Option<String> = None;
    let end = start.saturating_add(budget);
    let mut buf = vec![0u8; CHUNK];
    file.seek(SeekFrom::Start(start))?;
    while at < end {
        let want = (end - at).min(CHUNK as u64) as usize;
        let got = file.read(&mut buf[..want])?;
        if got == 0 {
            break;
        }
        if mark == Mark::Whole && at < MARK.len() as u64 {
            blank_byte_order_mark(at, &mut buf[..got]);
        }
        // `done`: bytes of this chunk consumed so far.
        let mut done = 0;
        while done < got {
            let Some(newline) = scanner.feed(&buf[done..got]) else {
                break;
            };
            let line = std::mem::take(&mut scanner).finish();
            if classify(&line, own).is_ok() {
                turns = turns.saturating_add(1);
                let uuid = match &line {
                    LineEnd::Row(f) => f.uuid.clone().filter(|u| !u.is_empty()),
                    _ => None,
                };
                last_id = Some(
                    uuid.unwrap_or_else(|| fallback_id(id_dev, ino, last.generation, line_start)),
                );
            }
            done += newline + 1;
            line_start = at + done as u64;
        }
        at += got as u64;
    }
    let next = JsonlMarker {
        offset: line_start,
        dev,
        ino,
        size: size.max(at),
        tail: Some(tail_of(&mut file, at)?),
        partial: (scanner.consumed > 0).then_some(scanner),
        // The same reading of the file goes on.
        generation: last.generation,
    };
    debug_assert_eq!(next.position(), at);
    let marker = next.to_value();
    Ok(match last_id {
        Some(dedupe_id) => CheckOutcome::HumanTurns {
            turns,
            dedupe_id,
            source_id: path.display().to_string(),
            marker,
        },
        None => CheckOutcome::Unchanged { marker },
    })
}

/// Reads local Claude Code transcripts (links of kind [`LOCAL_JSONL`]).
#[derive(Debug, Clone)]
pub struct JsonlProvider {
    budget: u64,
    /// The links (session and path) a check is reading now, shared by the provider's clones.
    reading: Arc<Mutex<HashSet<LinkRead>>>,
    /// One permit per read that may run at once ([`MAX_PARALLEL_READS`]), shared by the
    /// provider's clones.
    reads: Arc<tokio::sync::Semaphore>,
}

/// Reads one [`JsonlProvider`] (with its clones) runs at once, each on a thread of Tokio's
/// blocking pool. A read of a transcript on a file system that hangs keeps its thread until
/// the read returns; one link keeps at most one such thread, and this bounds them all, so that
/// hundreds of links on a hung mount cannot fill the pool the stores' blocking calls share. A
/// check waits its turn for at most [`READ_PERMIT_WAIT`]; with that many reads hung, the
/// other links' checks fail saying so, each tick, until one returns.
pub const MAX_PARALLEL_READS: usize = 8;

/// How long a check waits for one of the [`MAX_PARALLEL_READS`] reads before it fails.
pub const READ_PERMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What one link's check reads: its session's transcript at a path.
type LinkRead = (SessionRef, PathBuf);

/// A link's place in [`JsonlProvider`]'s `reading` set while its read runs: given back when
/// the read ends, whether or not anybody still waits for it.
struct Reading {
    set: Arc<Mutex<HashSet<LinkRead>>>,
    read: LinkRead,
}

impl Reading {
    /// Claims `read`, or `None` when a read of it is still running.
    fn claim(set: &Arc<Mutex<HashSet<LinkRead>>>, read: LinkRead) -> Option<Self> {
        let fresh = set
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(read.clone());
        fresh.then(|| Self {
            set: Arc::clone(set),
            read,
        })
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.read);
    }
}

impl Default for JsonlProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl JsonlProvider {
    /// At most [`MAX_BYTES_PER_TICK`] a check.
    pub fn new() -> Self {
        Self {
            budget: MAX_BYTES_PER_TICK,
            reading: Arc::default(),
            reads: Arc::new(tokio::sync::Semaphore::new(MAX_PARALLEL_READS)),
        }
    }

    /// At most `bytes` a check.
    ///
    /// # Panics
    ///
    /// On a budget of 0 (a check could read nothing), with the [`ConfigError`]'s text. A
    /// budget that comes from a user goes through [`JsonlProvider::try_with_budget`].
    #[must_use]
    pub fn with_budget(self, bytes: u64) -> Self {
        self.try_with_budget(bytes)
            .unwrap_or_else(|e| panic!("invalid JSONL provider budget: {e}"))
    }

    /// At most `bytes` a check, or a [`ConfigError`] for a budget of 0.
    pub fn try_with_budget(mut self, bytes: u64) -> Result<Self, ConfigError> {
        crate::config::at_least_one(
            "JsonlProvider.budget",
            bytes,
            "it must be at least 1 byte: a check reads at most this many bytes",
        )?;
        self.budget = bytes;
        Ok(self)
    }
}

#[async_trait]
impl UpstreamProvider for JsonlProvider {
    fn kind(&self) -> &str {
        LOCAL_JSONL
    }

    /// The transcript's path (stored absolute and canonical by [`adoption`]): its thread id is
    /// only a label, which two adoptions of one file may give differently.
    fn source_key(&self, link: &UpstreamLink) -> String {
        match path_of(link) {
            Some(path) => format!("{}\n{}", link.host_id, path.display()),
            None => format!("{}\n{}", link.host_id, link.thread_id),
        }
    }

    async fn check(&self, link: &UpstreamLink, own_recent: &[String]) -> CheckOutcome {
        let Some(path) = path_of(link) else {
            return CheckOutcome::Failed("the link names no transcript path".into());
        };
        if !path.is_absolute() {
            // An adoption stores the absolute path; a relative one (another writer's row) would
            // be read from wherever the gateway runs.
            return CheckOutcome::Failed(format!(
                "the link's transcript path {} is not absolute",
                path.display()
            ));
        }
        let marker = super::stored_marker(link, JsonlMarker::from_value);
        let own = upstream::fingerprints(own_recent);
        let budget = self.budget;
        let Some(reading) = Reading::claim(&self.reading, (link.session.clone(), path.clone()))
        else {
            return CheckOutcome::Failed(format!(
                "the previous check of {} is still reading it (a read that hangs)",
                path.display()
            ));
        };
        let waited =
            tokio::time::timeout(READ_PERMIT_WAIT, Arc::clone(&self.reads).acquire_owned()).await;
        let Ok(permit) = waited else {
            return CheckOutcome::Failed(format!(
                "{} was not read: the provider's {MAX_PARALLEL_READS} reads that may run at once \
                 were all still running after {READ_PERMIT_WAIT:?} (reads that hang on their \
                 file system, most likely)",
                path.display()
            ));
        };
        let permit = permit.expect("the reads' semaphore is never closed");
        tokio::task::spawn_blocking(move || {
            // Both held until the read returns, however long it hangs.
            let _reading = reading;
            let _permit = permit;
            scan(&path, marker.as_ref(), &own, budget)
        })
        .await
        .unwrap_or_else(|e| {
            CheckOutcome::Failed(format!("the scan task failed: {}", ErrorChain(&e)))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use awareness_core::{SessionRef, Timestamp, upstream};
    use serde_json::{Value, json};

    use super::{
        CheckOutcome, JsonlMarker, JsonlProvider, LineScanner, PoisonError, UpstreamProvider,
        adoption,
    };

    /// What runs inside the next read of a path, before the file is opened.
    type Hook = (PathBuf, Box<dyn FnOnce() + Send>);
    static WHILE_READING: Mutex<Option<Hook>> = Mutex::new(None);
    /// Paths every read of which hangs until the flag is set (a mount that stopped answering).
    type Hung = (Vec<PathBuf>, Arc<(Mutex<bool>, std::sync::Condvar)>);
    static EVERY_READ_HANGS: Mutex<Option<Hung>> = Mutex::new(None);
    /// Held by each test that sets the hook, so that two such tests do not replace each
    /// other's hook when they run at once.
    static ONE_HOOK_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// Called between the look at `path` and its opening: runs the hook set for this path.
    pub(super) fn while_reading(path: &Path) {
        let hung = EVERY_READ_HANGS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|(paths, _)| paths.iter().any(|p| p == path))
            .map(|(_, released)| Arc::clone(released));
        if let Some(released) = hung {
            let (flag, told) = &*released;
            let mut done = flag.lock().unwrap_or_else(PoisonError::into_inner);
            while !*done {
                done = told.wait(done).unwrap_or_else(PoisonError::into_inner);
            }
        }
        let hook = {
            let mut hook = WHILE_READING.lock().unwrap_or_else(PoisonError::into_inner);
            if hook.as_ref().is_some_and(|(p, _)| p == path) {
                hook.take()
            } else {
                None
            }
        };
        if let Some((_, run)) = hook {
            run();
        }
    }

    /// The link of `key`'s session to the transcript at `path`, which is written with one row
    /// when missing.
    fn link_to(path: &Path, key: &str) -> awareness_core::upstream::UpstreamLink {
        if !path.exists() {
            std::fs::write(path, "{}\n").expect("write the transcript");
        }
        let session = SessionRef::parse(key, "main").expect("ref");
        let spec = adoption(session, path, None).expect("adopt the transcript");
        upstream::plan_upsert(None, spec, Timestamp(0))
            .expect("a valid link")
            .outcome
            .link
    }

    /// Makes the next read of `link`'s transcript hang until the sender is used (or dropped);
    /// the receiver hears when that read has begun. The caller holds [`ONE_HOOK_AT_A_TIME`].
    fn hang_next_read(
        link: &awareness_core::upstream::UpstreamLink,
    ) -> (
        std::sync::mpsc::Sender<()>,
        tokio::sync::oneshot::Receiver<()>,
    ) {
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let (started, reading) = tokio::sync::oneshot::channel::<()>();
        *WHILE_READING.lock().unwrap() = Some((
            super::path_of(link).expect("the link's path"),
            Box::new(move || {
                started.send(()).ok();
                wait.recv().ok();
            }),
        ));
        (release, reading)
    }

    /// Makes every read of the transcripts of `links` hang until the guard is dropped. The
    /// caller holds [`ONE_HOOK_AT_A_TIME`].
    fn hang_every_read(links: &[&awareness_core::upstream::UpstreamLink]) -> impl Drop + use<> {
        struct Released(Arc<(Mutex<bool>, std::sync::Condvar)>);
        impl Drop for Released {
            fn drop(&mut self) {
                *EVERY_READ_HANGS
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = None;
                let (flag, told) = &*self.0;
                *flag.lock().unwrap_or_else(PoisonError::into_inner) = true;
                told.notify_all();
            }
        }
        let released = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let paths = links
            .iter()
            .map(|link| super::path_of(link).expect("the link's path"))
            .collect();
        *EVERY_READ_HANGS.lock().unwrap() = Some((paths, Arc::clone(&released)));
        Released(released)
    }

    /// The monitor passes over the sources of unwatched links one at a time, and not while an
    /// earlier pass still reads: sources whose every read hangs (a mount that stopped
    /// answering) hold one of the provider's read permits at most, and the watched links'
    /// checks keep the others. Each was read in a task of its own, and two such sources took
    /// both permits of this provider, so that the watched session's turn was never recorded
    /// (second reading, stop 56).
    #[tokio::test]
    async fn a_source_whose_reads_hang_takes_one_read_permit_from_the_checks_at_most() {
        use awareness_core::{CursorStore as _, EventKind, EventStore as _, Sequence, WatcherKey};
        let _one = ONE_HOOK_AT_A_TIME.lock().await;
        let dir = tempfile::tempdir().expect("dir");
        let watched_path = dir.path().join("w.jsonl");
        let idle_paths = [dir.path().join("i1.jsonl"), dir.path().join("i2.jsonl")];
        let store = Arc::new(store_memory::MemoryStore::new());
        let svc = Arc::new(
            crate::Awareness::builder(
                store.clone(),
                Arc::new(crate::InMemoryQueue::new()),
                Arc::new(crate::RecordingWake::new()),
                Arc::new(crate::InMemoryDirectory::new()),
            )
            .upstream(store.clone())
            .build(),
        );
        let watched = SessionRef::parse("agent:main:watched", "main").expect("ref");
        let idle_links = [
            link_to(&idle_paths[0], "agent:main:idle1"),
            link_to(&idle_paths[1], "agent:main:idle2"),
        ];
        link_to(&watched_path, "agent:main:watched");
        svc.try_adopt(adoption(watched.clone(), &watched_path, None).expect("spec"))
            .await
            .expect("adopt");
        for (link, path) in idle_links.iter().zip(&idle_paths) {
            svc.try_adopt(adoption(link.session.clone(), path, None).expect("spec"))
                .await
                .expect("adopt");
        }
        store
            .watch(
                &WatcherKey::parse("agent:main:main").expect("watcher"),
                &watched,
                Timestamp::now(),
            )
            .await
            .expect("watch");
        let provider = JsonlProvider {
            reads: Arc::new(tokio::sync::Semaphore::new(2)),
            ..JsonlProvider::new()
        };
        let monitor = crate::upstream::UpstreamMonitor::builder(svc, store.clone())
            .provider(Arc::new(provider))
            .config(crate::upstream::MonitorConfig {
                provider_timeout: std::time::Duration::from_millis(300),
                ..crate::upstream::MonitorConfig::default()
            })
            .build();
        let hung = hang_every_read(&[&idle_links[0], &idle_links[1]]);
        // The idle transcript grows, so that a pass over it reads it (and hangs).
        let append = |path: &Path, row: &Value| {
            std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{row}\n").as_bytes()))
                .expect("append");
        };
        for path in &idle_paths {
            append(path, &json!({"type": "assistant"}));
        }
        for _ in 0..3 {
            monitor.tick().await;
        }
        let row = json!({"type": "user", "uuid": "00000000-0000-4000-8000-000000000001",
            "message": {"role": "user", "content": "a person types"}});
        append(&watched_path, &row);
        monitor.tick().await;
        let humans = store
            .changes_since(&watched, Sequence::ZERO, 100)
            .await
            .expect("page")
            .events
            .iter()
            .filter(|e| e.kind == EventKind::HumanDirectMessage)
            .count();
        drop(hung);
        assert_eq!(humans, 1, "the watched session's turn");
    }

    /// Bug: a transcript swapped for a FIFO between the look at its path and its opening (by
    /// whatever writes its directory: the agent it records) held the reading thread until a
    /// writer came, for good, and one of the few reads allowed at once with it. The open does
    /// not wait: the check fails at once, saying the path is not a regular file.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_transcript_swapped_for_a_fifo_while_it_is_opened_does_not_hold_the_read() {
        let _one = ONE_HOOK_AT_A_TIME.lock().await;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.jsonl");
        let link = link_to(&path, "agent:main:main");
        let swapped = path.clone();
        *WHILE_READING.lock().unwrap() = Some((
            super::path_of(&link).expect("the link's path"),
            Box::new(move || {
                std::fs::remove_file(&swapped).expect("remove the transcript");
                let made = std::process::Command::new("mkfifo")
                    .arg(&swapped)
                    .status()
                    .expect("run mkfifo");
                assert!(made.success(), "mkfifo");
            }),
        ));
        let provider = JsonlProvider::new();
        let check = provider.check(&link, &[]);
        let Ok(out) = tokio::time::timeout(Duration::from_secs(30), check).await else {
            // A hang guard: a writer ends the open that waits for one, so that the blocked
            // thread ends and the runtime can shut down.
            drop(std::fs::OpenOptions::new().write(true).open(&path));
            panic!("the read of a FIFO waited for a writer");
        };
        assert!(
            matches!(&out, CheckOutcome::Failed(why) if why.contains("not a regular file")),
            "{out:?}"
        );
    }

    /// A link whose transcript path is relative (written by another writer of the store: an
    /// adoption stores the absolute path) is not read from the gateway's working directory:
    /// the check fails, naming the path.
    #[tokio::test]
    async fn a_relative_transcript_path_is_not_read() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.jsonl");
        let mut link = link_to(&path, "agent:main:main");
        link.upstream_ref = Some(super::jsonl_ref(Path::new("t.jsonl")));
        let out = JsonlProvider::new().check(&link, &[]).await;
        assert!(
            matches!(&out, CheckOutcome::Failed(why) if why.contains("t.jsonl is not absolute")),
            "{out:?}"
        );
    }

    /// A link whose reference names no transcript path (written by another writer of the
    /// store) fails its check saying so; it is not taken for a transcript that no longer
    /// exists, which the monitor counts towards giving the source up. (What the mutation did:
    /// such a link's check answered `Missing`; review of stop 70, J515.)
    #[tokio::test]
    async fn a_link_without_a_transcript_path_fails_saying_so() {
        let dir = tempfile::tempdir().expect("dir");
        let mut link = link_to(&dir.path().join("t.jsonl"), "agent:main:main");
        link.upstream_ref = Some(json!({}));
        let out = JsonlProvider::new().check(&link, &[]).await;
        assert!(
            matches!(&out, CheckOutcome::Failed(why) if why.contains("names no transcript path")),
            "{out:?}"
        );
    }

    /// A check whose read hangs is given up by the monitor's timeout, but its thread cannot be
    /// stopped: the next checks of that path fail at once instead of leaving one more blocked
    /// thread each, and checks come back once the read has ended.
    #[tokio::test]
    async fn a_hung_read_holds_one_thread_however_many_checks_follow() {
        let _one = ONE_HOOK_AT_A_TIME.lock().await;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.jsonl");
        let (link, other) = (
            link_to(&path, "agent:main:main"),
            link_to(&path, "agent:main:other"),
        );
        let (release, reading) = hang_next_read(&link);
        let provider = JsonlProvider::new();
        let first = {
            let p = provider.clone();
            let link = link.clone();
            tokio::spawn(async move { p.check(&link, &[]).await })
        };
        reading.await.expect("the first read started");
        // As the monitor's timeout does: nobody waits for the first check any more.
        first.abort();
        for _ in 0..3 {
            let out = provider.check(&link, &[]).await;
            assert!(
                matches!(&out, CheckOutcome::Failed(why) if why.contains("still reading")),
                "{out:?}"
            );
        }
        let out = provider.check(&other, &[]).await;
        assert!(
            matches!(out, CheckOutcome::Unchanged { .. }),
            "another session's link on the same transcript is read: {out:?}"
        );
        release.send(()).expect("the hung read waits");
        // Once the read has ended (on its blocking thread, which the test cannot await), the
        // path is checked again. Asked until then, or for 30 s: a hang guard, not a timing
        // assertion (a read that never let go of the path fails the assertion below).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut out = provider.check(&link, &[]).await;
        while matches!(&out, CheckOutcome::Failed(why) if why.contains("still reading"))
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
            out = provider.check(&link, &[]).await;
        }
        assert!(
            matches!(out, CheckOutcome::Unchanged { .. }),
            "the path is checked again once its hung read has ended: {out:?}"
        );
    }

    /// A read that hangs holds its own link's transcript only: the session's link to another
    /// transcript (adopted again meanwhile) is read. (What the mutation did: the hung read was
    /// known by its session alone, and the new transcript's checks failed as "still reading";
    /// review of stop 66, J318.)
    #[tokio::test]
    async fn a_hung_read_does_not_hold_the_sessions_link_to_another_transcript() {
        let _one = ONE_HOOK_AT_A_TIME.lock().await;
        let dir = tempfile::tempdir().expect("dir");
        let old = link_to(&dir.path().join("old.jsonl"), "agent:main:main");
        let new = link_to(&dir.path().join("new.jsonl"), "agent:main:main");
        let (release, reading) = hang_next_read(&old);
        let provider = JsonlProvider::new();
        let first = {
            let p = provider.clone();
            tokio::spawn(async move { p.check(&old, &[]).await })
        };
        reading.await.expect("the first read started");
        first.abort();
        let out = provider.check(&new, &[]).await;
        release.send(()).expect("the hung read waits");
        assert!(
            matches!(out, CheckOutcome::Unchanged { .. }),
            "the session's link to another transcript is read: {out:?}"
        );
    }

    /// Reads that hang hold at most [`super::MAX_PARALLEL_READS`] threads of the blocking pool
    /// in all: a read holds one of the provider's permits for as long as it runs, hung or not
    /// (its caller gone too), so with one permit a check of another transcript waits for the
    /// hung read instead of taking a thread of its own, and goes on once that read returns.
    #[tokio::test]
    async fn hung_reads_hold_a_bounded_number_of_threads() {
        let _one = ONE_HOOK_AT_A_TIME.lock().await;
        let dir = tempfile::tempdir().expect("dir");
        let hung = link_to(&dir.path().join("hung.jsonl"), "agent:main:main");
        let other = link_to(&dir.path().join("other.jsonl"), "agent:main:other");
        let (release, reading) = hang_next_read(&hung);
        let provider = JsonlProvider {
            reads: std::sync::Arc::new(tokio::sync::Semaphore::new(1)),
            ..JsonlProvider::new()
        };
        let first = {
            let p = provider.clone();
            tokio::spawn(async move { p.check(&hung, &[]).await })
        };
        reading.await.expect("the first read started");
        // As the monitor's timeout does: nobody waits for the first check any more.
        first.abort();
        assert!(
            first.await.expect_err("aborted").is_cancelled(),
            "the first check was cancelled while its read hung"
        );
        assert_eq!(
            provider.reads.available_permits(),
            0,
            "the hung read holds the permit, its check gone"
        );
        let second = {
            let p = provider.clone();
            tokio::spawn(async move { p.check(&other, &[]).await })
        };
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert!(!second.is_finished(), "the second read waits for a permit");
        assert_eq!(provider.reads.available_permits(), 0);
        release.send(()).expect("the hung read waits");
        let out = second.await.expect("the second check");
        assert!(matches!(out, CheckOutcome::Unchanged { .. }), "{out:?}");
        assert_eq!(
            provider.reads.available_permits(),
            1,
            "every permit is back"
        );
    }

    /// A check waits the whole [`super::READ_PERMIT_WAIT`] for a read permit: one given back
    /// just before that wait is over is taken, and the transcript read. (What the mutation did:
    /// the check gave up at half that wait, failing while the reads ahead of it were still
    /// within it; review of stop 72, MT22.) One that waits it out (every read hung) fails saying
    /// so, rather than waiting out the monitor's timeout, which blames its own file.
    #[tokio::test(start_paused = true)]
    async fn a_check_waits_the_whole_read_permit_wait_then_fails_saying_why() {
        let dir = tempfile::tempdir().expect("dir");
        let link = link_to(&dir.path().join("t.jsonl"), "agent:main:main");
        let provider = JsonlProvider {
            reads: std::sync::Arc::new(tokio::sync::Semaphore::new(0)),
            ..JsonlProvider::new()
        };
        let check = {
            let (p, link) = (provider.clone(), link.clone());
            tokio::spawn(async move { p.check(&link, &[]).await })
        };
        tokio::time::sleep(
            super::READ_PERMIT_WAIT.saturating_sub(std::time::Duration::from_millis(1)),
        )
        .await;
        provider.reads.add_permits(1);
        let out = check.await.expect("the check");
        assert!(matches!(out, CheckOutcome::Unchanged { .. }), "{out:?}");
        // Every read hung again: the permit the check gave back is taken for good.
        provider.reads.acquire().await.expect("the permit").forget();
        let out = provider.check(&link, &[]).await;
        assert!(
            matches!(&out, CheckOutcome::Failed(why) if why.contains("reads that may run at once")),
            "{out:?}"
        );
    }

    /// `value` as a reader that takes JSON numbers as doubles writes it back (JavaScript's
    /// `JSON.stringify(JSON.parse(...))`): each number rounded to a double, integers printed
    /// without a fraction.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    fn through_doubles(value: &Value) -> Value {
        match value {
            Value::Number(n) => {
                let x = n.as_f64().expect("a number");
                if x.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&x) {
                    Value::from(x as u64)
                } else {
                    // Past u64 (2^64 - 1 rounds up to 2^64): printed as JavaScript prints it.
                    serde_json::from_str(&format!("{x:e}")).expect("a number")
                }
            }
            Value::Array(items) => Value::Array(items.iter().map(through_doubles).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), through_doubles(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    /// A marker whose numbers are past 2^53 (an inode on an overlay file system, a device
    /// number, the hash of a long uuid the reader is in the middle of) comes back the same
    /// from a reader that takes numbers as doubles and writes the marker back: past 2^53 they
    /// are strings of digits. Before, such a reader changed the inode (the file read as
    /// replaced: its turns counted again) or wrote a number the marker no longer read (a
    /// rebase). A marker stored with those numbers as numbers still reads.
    #[test]
    fn a_marker_survives_a_reader_of_doubles() {
        let mut partial = LineScanner::new();
        let line = format!("{{\"type\":\"user\",\"uuid\":\"{}", "u".repeat(300));
        assert_eq!(partial.feed(line.as_bytes()), None);
        let marker = JsonlMarker {
            offset: 1 << 40,
            dev: (1 << 53) + 1,
            ino: u64::MAX - 6,
            size: (1 << 40) + 4096,
            tail: Some("00112233445566ff".into()),
            partial: Some(partial),
            generation: super::fresh_generation(),
        };
        let stored = marker.to_value();
        assert_eq!(stored["ino"], json!((u64::MAX - 6).to_string()));
        assert_eq!(stored["offset"], json!(1_u64 << 40), "a number below 2^53");
        let rewritten = through_doubles(&stored);
        assert_eq!(
            JsonlMarker::from_value(&rewritten).as_ref(),
            Some(&marker),
            "{rewritten}"
        );
        // As an earlier version stored it: every number a number.
        let mut old = stored.clone();
        old["dev"] = json!(marker.dev);
        old["ino"] = json!(marker.ino);
        assert_eq!(JsonlMarker::from_value(&old).as_ref(), Some(&marker));
        // A string that is not digits is no marker of ours.
        old["ino"] = json!("-1");
        assert_eq!(JsonlMarker::from_value(&old), None);
    }

    /// A marker's generation is an exact JSON integer (below 2^53), which a reader that takes
    /// numbers as doubles writes back unchanged, and never 0 (no generation).
    #[test]
    // The round trip through a double is what is checked.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    fn a_generation_survives_a_reader_of_doubles() {
        for _ in 0..10_000 {
            let g = super::fresh_generation();
            assert!(g > 0 && g < 1 << 53, "{g}");
            assert_eq!(g as f64 as u64, g);
        }
    }
}
