//! What counts as a human turn in a Claude Code transcript (DESIGN.md section 8), and the
//! streaming reader that finds out without holding a line.
//!
//! A transcript is append-only JSON lines, split on `\n` only. Each line is one JSON object: a
//! `user` or `assistant` row (`message.role`, `message.content` as a string or an array of
//! parts, `uuid`, `timestamp`, flags such as `isSidechain` or `isMeta`, and on recent versions
//! `origin.kind` saying who wrote a `user` row), an `attachment` row (`attachment.type ==
//! "queued_command"` holds what the person typed while a turn was running), a `system` row
//! (`subtype == "local_command"`: recent versions write a slash command the person ran there,
//! as top-level `content`, where older ones wrote a `user` row), or bookkeeping (`summary`,
//! other `system` rows, `queue-operation`, ...).
//!
//! [`LineScanner`] is a byte-level JSON tokenizer that keeps only the [`RowFacts`] the rules
//! need: a few short strings, flags, whether the content holds a tool result, and the
//! content's text as a [`NormalizedText`] (a fingerprint and a short prefix). Its memory is
//! bounded whatever the line's size (lines of several MB are normal: pasted logs, tool
//! output), and its state is serializable, so a line whose end is not written yet, or that is
//! longer than one tick's read budget, is resumed on the next tick from where it stopped:
//! no byte is read twice and none is skipped unclassified.
//!
//! [`classify`] then applies the rules, in order:
//!
//! | row | verdict |
//! |---|---|
//! | `assistant` | [`SkipReason::Assistant`] |
//! | `isSidechain` (a subagent's row) | [`SkipReason::Sidechain`] |
//! | `isMeta`, `isCompactSummary`, `isVisibleInTranscriptOnly` | skipped |
//! | content holding a `tool_result` part | [`SkipReason::ToolResult`] |
//! | `origin.kind` `task-notification` / `peer` (another Claude session) | [`SkipReason::TaskNotification`] / [`SkipReason::InterSession`] |
//! | text starting `[Inter-session message]` | [`SkipReason::InterSession`] |
//! | text starting `Continue this conversation using the OpenClaw transcript below` | [`SkipReason::Replay`] |
//! | text starting `<task-notification` | [`SkipReason::TaskNotification`] |
//! | text starting `<local-command-`, `<bash-stdout`, `<bash-stderr` | [`SkipReason::CommandOutput`] |
//! | text equal, normalized, to one of the own prompts given (the session's 10 latest, and those of the sessions linked to the same thread) | [`SkipReason::SelfEcho`] |
//! | any other `user` row with text or a non-text part (an image) | a human turn |
//! | `queued_command` attachment, `origin.kind == "human"`, mode `prompt`/`bash`, same text rules (a prompt of only an image counts) | a human turn |
//! | `system` row, `subtype == "local_command"`, not a sidechain or meta row, whose text is a slash command (by the same text rules) | a human turn; any other `system` row is [`SkipReason::NotConversation`] |
//!
//! A slash command (`<command-name>`), a `[Request interrupted by user]` marker and a `!` shell
//! command (`<bash-input>`) are human turns and count once each: the rows Claude Code writes
//! around them (the caveat, the expanded prompt, the captured output) are meta or output rows.

use awareness_core::upstream::{Fnv64, MAX_DEDUPE_ID_BYTES, NormalizedText, TextFingerprint};
use serde::{Deserialize, Serialize};

/// Normalized characters of a text kept for the prefix rules.
pub const TEXT_PREFIX_CHARS: usize = 96;
/// Bytes kept of a short string field (`type`, `role`, ...; a `uuid` is kept whole up to
/// [`MAX_DEDUPE_ID_BYTES`], and hashed past that, see [`RowFacts::uuid`]): characters are
/// kept while fewer bytes than this are, so a field kept may end up to 3 bytes past it.
pub const SMALL_BYTES: usize = 64;
/// Bytes kept of an object key (longer keys are not among the ones read).
const KEY_BYTES: usize = 40;
/// Nesting levels whose keys are tracked (the deepest field read is
/// `message.content[i].text`).
const PATH_DEPTH: usize = 4;
/// Deepest nesting followed; a deeper line is not a transcript row and is skipped (as
/// malformed) to its end.
const MAX_DEPTH: usize = 256;
/// Most bytes of one line: no file is longer (its length is a signed 64-bit `off_t`). Half of
/// `u64`, so that a count [`LineScanner::is_sound`] accepts is far from overflowing.
const MAX_LINE_BYTES: u64 = i64::MAX.unsigned_abs();

/// An object key the rules read; every other key is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Key {
    Type,
    Uuid,
    IsSidechain,
    IsMeta,
    IsCompactSummary,
    IsVisibleInTranscriptOnly,
    Message,
    Role,
    Content,
    Text,
    Attachment,
    CommandMode,
    Origin,
    Kind,
    Prompt,
    Subtype,
    Other,
}

impl Key {
    fn of(s: &str) -> Key {
        match s {
            "type" => Key::Type,
            "uuid" => Key::Uuid,
            "isSidechain" => Key::IsSidechain,
            "isMeta" => Key::IsMeta,
            "isCompactSummary" => Key::IsCompactSummary,
            "isVisibleInTranscriptOnly" => Key::IsVisibleInTranscriptOnly,
            "message" => Key::Message,
            "role" => Key::Role,
            "content" => Key::Content,
            "text" => Key::Text,
            "attachment" => Key::Attachment,
            "commandMode" => Key::CommandMode,
            "origin" => Key::Origin,
            "kind" => Key::Kind,
            "prompt" => Key::Prompt,
            "subtype" => Key::Subtype,
            _ => Key::Other,
        }
    }
}

/// One level of the path to the current value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Seg {
    /// An object, at the value of this key (`None` before the first key is read).
    Obj(Option<Key>),
    /// An array element.
    Item,
}

/// A boolean field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Flag {
    Sidechain,
    Meta,
    CompactSummary,
    TranscriptOnly,
    AttachmentMeta,
}

/// Where the value being read goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
enum Sink {
    #[default]
    Ignore,
    RowType,
    Uuid,
    Role,
    Flag(Flag),
    ContentText,
    PartType,
    AttachmentType,
    CommandMode,
    OriginKind,
    PromptText,
    PromptPartType,
    Subtype,
    RowOriginKind,
}

impl Sink {
    fn at(path: &[Seg]) -> Sink {
        use Key as K;
        use Seg::{Item, Obj};
        match path {
            [Obj(Some(K::Type))] => Sink::RowType,
            [Obj(Some(K::Uuid))] => Sink::Uuid,
            [Obj(Some(K::IsSidechain))] => Sink::Flag(Flag::Sidechain),
            [Obj(Some(K::IsMeta))] => Sink::Flag(Flag::Meta),
            [Obj(Some(K::IsCompactSummary))] => Sink::Flag(Flag::CompactSummary),
            [Obj(Some(K::IsVisibleInTranscriptOnly))] => Sink::Flag(Flag::TranscriptOnly),
            [Obj(Some(K::Message)), Obj(Some(K::Role))] => Sink::Role,
            [Obj(Some(K::Subtype))] => Sink::Subtype,
            [Obj(Some(K::Origin)), Obj(Some(K::Kind))] => Sink::RowOriginKind,
            // A `system` row's text is its top-level `content` (a string).
            [Obj(Some(K::Content))]
            | [Obj(Some(K::Message)), Obj(Some(K::Content))]
            | [Obj(Some(K::Message)), Obj(Some(K::Content)), Item]
            | [
                Obj(Some(K::Message)),
                Obj(Some(K::Content)),
                Item,
                Obj(Some(K::Text)),
            ] => Sink::ContentText,
            [
                Obj(Some(K::Message)),
                Obj(Some(K::Content)),
                Item,
                Obj(Some(K::Type)),
            ] => Sink::PartType,
            [Obj(Some(K::Attachment)), Obj(Some(K::Type))] => Sink::AttachmentType,
            [Obj(Some(K::Attachment)), Obj(Some(K::CommandMode))] => Sink::CommandMode,
            [Obj(Some(K::Attachment)), Obj(Some(K::IsMeta))] => Sink::Flag(Flag::AttachmentMeta),
            [
                Obj(Some(K::Attachment)),
                Obj(Some(K::Origin)),
                Obj(Some(K::Kind)),
            ] => Sink::OriginKind,
            [
                Obj(Some(K::Attachment)),
                Obj(Some(K::Prompt)),
                Item,
                Obj(Some(K::Type)),
            ] => Sink::PromptPartType,
            [Obj(Some(K::Attachment)), Obj(Some(K::Prompt))]
            | [Obj(Some(K::Attachment)), Obj(Some(K::Prompt)), Item]
            | [
                Obj(Some(K::Attachment)),
                Obj(Some(K::Prompt)),
                Item,
                Obj(Some(K::Text)),
            ] => Sink::PromptText,
            _ => Sink::Ignore,
        }
    }

    fn is_text(self) -> bool {
        matches!(self, Sink::ContentText | Sink::PromptText)
    }
}

/// What the rules need to know about one transcript line.
// One field per flag of the transcript's own rows.
#[allow(clippy::struct_excessive_bools)]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RowFacts {
    /// `type` (`user`, `assistant`, `attachment`, ...).
    pub row_type: Option<String>,
    /// `uuid`; one longer than [`MAX_DEDUPE_ID_BYTES`] bytes is the 16 lowercase hex of the
    /// FNV-1a 64 of the whole value (hashed as it streams by, so it is the same however the
    /// line is read), which is what [`awareness_core::upstream::human_dedupe_key`] makes of
    /// such an id: two uuids alike in their first bytes stay apart, and the dedupe key is the
    /// one the whole uuid gives. (Cut at its first 64 bytes, the second of two such rows was
    /// taken for the first and its turn lost.)
    pub uuid: Option<String>,
    /// `message.role`.
    pub role: Option<String>,
    /// `isSidechain`.
    pub is_sidechain: bool,
    /// `isMeta`.
    pub is_meta: bool,
    /// `isCompactSummary`.
    pub is_compact_summary: bool,
    /// `isVisibleInTranscriptOnly`.
    pub is_visible_in_transcript_only: bool,
    /// The text of `message.content` (a string, or the text parts of an array), or of a
    /// `system` row's `content`.
    pub content: NormalizedText,
    /// `message.content` holds a `tool_result` part.
    pub has_tool_result: bool,
    /// `message.content` holds a part that is not text (an image the person pasted).
    pub has_non_text_part: bool,
    /// `attachment.type`.
    pub attachment_type: Option<String>,
    /// `attachment.commandMode`.
    pub command_mode: Option<String>,
    /// `attachment.origin.kind`.
    pub origin_kind: Option<String>,
    /// `attachment.isMeta`.
    pub attachment_is_meta: bool,
    /// The text of `attachment.prompt`.
    pub prompt: NormalizedText,
    /// `attachment.prompt` holds a part that is not text (an image the person pasted).
    #[serde(default)]
    pub prompt_has_non_text_part: bool,
    /// `subtype` (a `system` row's).
    #[serde(default)]
    pub subtype: Option<String>,
    /// `origin.kind` (a `user` row's: `human`, `task-notification`, `peer`, ...).
    #[serde(default)]
    pub row_origin_kind: Option<String>,
}

impl RowFacts {
    fn empty() -> Self {
        Self {
            content: NormalizedText::new(TEXT_PREFIX_CHARS),
            prompt: NormalizedText::new(TEXT_PREFIX_CHARS),
            ..Self::default()
        }
    }

    /// The facts of one complete line (without its `\n`); `None` for a blank line.
    pub fn from_line(line: &[u8]) -> Option<LineEnd> {
        let mut s = LineScanner::new();
        debug_assert!(!line.contains(&b'\n'));
        s.feed(line);
        Some(s.finish()).filter(|e| *e != LineEnd::Blank)
    }
}

/// How a line ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineEnd {
    /// Only whitespace.
    Blank,
    /// Not one JSON object (or nested deeper than the reader follows).
    Malformed,
    /// A JSON object, and what the rules need of it.
    Row(Box<RowFacts>),
}

/// The tokenizer's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
enum Tok {
    /// Before the line's value.
    #[default]
    Start,
    /// After `:` or `,` in an array: a value.
    Value,
    /// After `[`: a value or `]`.
    ArrayFirst,
    /// After `{`: a key or `}`.
    ObjectFirst,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value: `,` or the container's end.
    After,
    /// Inside a string (a key when `key`).
    Str { key: bool },
    /// Inside a number or literal.
    Scalar,
    /// The line's value is complete: only whitespace may follow.
    Done,
    /// Not JSON we follow: the rest of the line is skipped.
    Malformed,
}

/// A string escape in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
enum Esc {
    #[default]
    None,
    /// After `\`.
    Backslash,
    /// After `\u` and `n` of its hex digits.
    Unicode { n: u8, value: u16 },
}

/// A resumable JSON line reader that keeps only [`RowFacts`]. Feed it bytes with
/// [`LineScanner::feed`] until it reports the line's `\n`, then [`LineScanner::finish`] it.
/// Its serialized form is small (bounded by the nesting depth it follows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineScanner {
    /// Bytes of the line consumed so far.
    pub consumed: u64,
    /// `o`/`a` per open container, outermost first.
    kinds: String,
    /// The path segments of the outermost [`PATH_DEPTH`] levels.
    path: Vec<Seg>,
    tok: Tok,
    sink: Sink,
    esc: Esc,
    /// A high surrogate waiting for its low half.
    high: Option<u16>,
    /// The bytes of a UTF-8 character not complete yet.
    utf8: Vec<u8>,
    /// The key or short string being read.
    buf: String,
    /// The FNV-1a 64 so far of the `uuid` being read, once it is longer than
    /// [`MAX_DEDUPE_ID_BYTES`] (`buf` is then empty): [`RowFacts::uuid`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    long_uuid: Option<Fnv64>,
    /// The number or literal being read (first bytes only).
    scalar: String,
    facts: RowFacts,
}

impl Default for LineScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl LineScanner {
    /// A scanner at the start of a line.
    pub fn new() -> Self {
        Self {
            consumed: 0,
            kinds: String::new(),
            path: Vec::new(),
            tok: Tok::Start,
            sink: Sink::Ignore,
            esc: Esc::None,
            high: None,
            utf8: Vec::new(),
            buf: String::new(),
            long_uuid: None,
            scalar: String::new(),
            facts: RowFacts::empty(),
        }
    }

    /// A scanner inside a line whose start was not read, `consumed` bytes of it behind: the
    /// rest of the line is skipped, and the line is [`LineEnd::Malformed`] (a line cannot be
    /// classified from its middle).
    pub fn skipping(consumed: u64) -> Self {
        let mut scanner = Self::new();
        scanner.malformed();
        scanner.consumed = consumed;
        scanner
    }

    /// Whether this state is one the scanner itself can be in (a state read back from a
    /// stored marker, which anyone may have edited, may not be): a lone high surrogate is one,
    /// a `\\u` escape has read at most 3 of its digits, at most 3 bytes of a UTF-8 character
    /// wait, the open containers are objects and arrays no deeper than followed, the path
    /// holds the outermost of them, a token that belongs inside a container has one of its
    /// kind, every field the reader keeps (a key or short string, a number's first bytes,
    /// the row's short facts, its uuid, each text's prefix and its cap) is within its bound,
    /// no more bytes were consumed than a file holds, and the texts hold no more characters
    /// than were consumed (each character kept took at least a byte of its own, a space
    /// between words the byte of a whitespace or of a string's opening quote): a count near
    /// the end of `u64` would overflow as the line is read on.
    pub fn is_sound(&self) -> bool {
        let depth = self.kinds.len();
        let innermost = self.kinds.as_bytes().last().copied();
        let high = self.high.is_none_or(|h| (0xD800..=0xDBFF).contains(&h));
        let escape = match self.esc {
            Esc::Unicode { n, .. } => n <= 3,
            Esc::None | Esc::Backslash => true,
        };
        let tok = match self.tok {
            Tok::Start | Tok::Done => depth == 0,
            Tok::ObjectFirst | Tok::Key | Tok::Colon => innermost == Some(b'o'),
            Tok::ArrayFirst => innermost == Some(b'a'),
            Tok::Value | Tok::After => depth > 0,
            Tok::Str { key } => !key || innermost == Some(b'o'),
            Tok::Scalar | Tok::Malformed => true,
        };
        // A line found malformed inside an escape keeps the escape (the rest is skipped anyway).
        let escape_in_string =
            matches!(self.esc, Esc::None) || matches!(self.tok, Tok::Str { .. } | Tok::Malformed);
        // What the reader keeps of a field stays within its bounds (a character may take the
        // last 4 bytes), so that a stored state read back keeps markers small enough to store.
        let bounded = |s: &Option<String>, max: usize| s.as_ref().is_none_or(|s| s.len() <= max);
        let f = &self.facts;
        let facts = [
            &f.row_type,
            &f.role,
            &f.attachment_type,
            &f.command_mode,
            &f.origin_kind,
            &f.subtype,
            &f.row_origin_kind,
        ]
        .into_iter()
        .all(|s| bounded(s, SMALL_BYTES + 4))
            && bounded(&f.uuid, MAX_DEDUPE_ID_BYTES + 4)
            && f.content.is_sound(TEXT_PREFIX_CHARS)
            && f.prompt.is_sound(TEXT_PREFIX_CHARS);
        // Each text's count is at most `NormalizedText::MAX_TEXT_CHARS` once `facts` holds.
        let chars = f
            .content
            .fingerprint()
            .chars
            .saturating_add(f.prompt.fingerprint().chars);
        high && escape
            && tok
            && escape_in_string
            && self.utf8.len() <= 3
            && depth <= MAX_DEPTH
            && self.kinds.bytes().all(|k| k == b'o' || k == b'a')
            && self.path.len() == depth.min(PATH_DEPTH)
            && self.buf.len() <= MAX_DEDUPE_ID_BYTES.max(SMALL_BYTES).max(KEY_BYTES) + 4
            && self.scalar.len() <= 8 + 4
            && facts
            && self.consumed <= MAX_LINE_BYTES
            && chars <= self.consumed
    }

    /// Consumes `bytes` up to the line's end: returns `Some(i)` when `bytes[i]` is the line's
    /// `\n` (bytes after it are not consumed), `None` when all of `bytes` belong to the line.
    pub fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        // `consumed` adds saturating: a count [`Self::is_sound`] accepts is far from the end
        // of `u64`, but a state read back without asking it, or skipped on from a refused
        // one's count ([`Self::skipping`]), must neither panic nor wrap.
        let mut i = 0;
        while i < bytes.len() {
            // Fast paths: the long runs of a line are ignored strings and skipped rests.
            match self.tok {
                Tok::Str { key: false } if self.sink == Sink::Ignore && self.esc == Esc::None => {
                    let run = bytes[i..]
                        .iter()
                        .position(|b| matches!(b, b'"' | b'\\' | b'\n'))
                        .unwrap_or(bytes.len() - i);
                    i += run;
                    self.consumed = self.consumed.saturating_add(run as u64);
                    if i == bytes.len() {
                        break;
                    }
                }
                Tok::Malformed => {
                    let run = bytes[i..]
                        .iter()
                        .position(|b| *b == b'\n')
                        .unwrap_or(bytes.len() - i);
                    i += run;
                    self.consumed = self.consumed.saturating_add(run as u64);
                    if i == bytes.len() {
                        break;
                    }
                }
                _ => {}
            }
            let b = bytes[i];
            if b == b'\n' {
                return Some(i);
            }
            self.consumed = self.consumed.saturating_add(1);
            self.byte(b);
            i += 1;
        }
        None
    }

    /// Ends the line (its `\n` was seen).
    pub fn finish(self) -> LineEnd {
        match self.tok {
            Tok::Start => LineEnd::Blank,
            Tok::Done => LineEnd::Row(Box::new(self.facts)),
            // A top-level number or literal ends at the line's end: not a row either way.
            _ => LineEnd::Malformed,
        }
    }

    fn malformed(&mut self) {
        self.tok = Tok::Malformed;
        // Nothing of a skipped line is kept; the serialized state stays small.
        self.kinds.clear();
        self.path.clear();
        self.buf.clear();
        self.long_uuid = None;
        self.scalar.clear();
        self.utf8.clear();
        self.facts = RowFacts::empty();
    }

    fn depth(&self) -> usize {
        self.kinds.len()
    }

    fn in_object(&self) -> bool {
        self.kinds.ends_with('o')
    }

    fn byte(&mut self, b: u8) {
        match self.tok {
            Tok::Str { key } => self.string_byte(b, key),
            Tok::Scalar => {
                if matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\r') {
                    self.end_scalar();
                    if self.tok != Tok::Malformed {
                        self.byte(b);
                    }
                } else if self.scalar.len() < 8 {
                    self.scalar.push(char::from(b));
                }
            }
            Tok::Malformed => {}
            _ if matches!(b, b' ' | b'\t' | b'\r') => {}
            Tok::Done => self.malformed(),
            Tok::Start | Tok::Value | Tok::ArrayFirst => {
                if self.tok == Tok::ArrayFirst && b == b']' {
                    self.close(b'a');
                } else {
                    self.value_start(b);
                }
            }
            Tok::ObjectFirst | Tok::Key => match b {
                b'"' => {
                    self.buf.clear();
                    self.tok = Tok::Str { key: true };
                }
                b'}' if self.tok == Tok::ObjectFirst => self.close(b'o'),
                _ => self.malformed(),
            },
            Tok::Colon => {
                if b == b':' {
                    self.tok = Tok::Value;
                } else {
                    self.malformed();
                }
            }
            Tok::After => match (b, self.in_object()) {
                (b',', true) => self.tok = Tok::Key,
                (b',', false) => self.tok = Tok::Value,
                (b'}', true) => self.close(b'o'),
                (b']', false) => self.close(b'a'),
                _ => self.malformed(),
            },
        }
    }

    /// The first byte of a value.
    fn value_start(&mut self, b: u8) {
        if self.tok == Tok::Start && b != b'{' {
            // A transcript row is an object; anything else is skipped.
            self.malformed();
            return;
        }
        // Only the outermost levels are tracked; anything deeper is read by no rule.
        self.sink = if self.depth() <= PATH_DEPTH {
            Sink::at(&self.path)
        } else {
            Sink::Ignore
        };
        match b {
            b'{' | b'[' => self.open(b),
            b'"' => {
                self.buf.clear();
                self.long_uuid = None;
                if self.sink.is_text() {
                    let text = self.text_mut();
                    if !text.is_empty() {
                        // Parts of one text are separated as whitespace would.
                        text.separate();
                    }
                }
                self.tok = Tok::Str { key: false };
            }
            b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                self.scalar.clear();
                self.scalar.push(char::from(b));
                self.tok = Tok::Scalar;
            }
            _ => self.malformed(),
        }
    }

    fn open(&mut self, b: u8) {
        if self.depth() >= MAX_DEPTH {
            self.malformed();
            return;
        }
        let is_object = b == b'{';
        self.kinds.push(if is_object { 'o' } else { 'a' });
        if self.depth() <= PATH_DEPTH {
            self.path
                .push(if is_object { Seg::Obj(None) } else { Seg::Item });
        }
        self.tok = if is_object {
            Tok::ObjectFirst
        } else {
            Tok::ArrayFirst
        };
    }

    fn close(&mut self, kind: u8) {
        debug_assert_eq!(self.kinds.as_bytes().last(), Some(&kind));
        if self.depth() <= PATH_DEPTH {
            self.path.pop();
        }
        self.kinds.pop();
        self.value_done();
    }

    fn value_done(&mut self) {
        self.tok = if self.kinds.is_empty() {
            Tok::Done
        } else {
            Tok::After
        };
    }

    fn end_scalar(&mut self) {
        let ok = matches!(self.scalar.as_str(), "true" | "false" | "null")
            || self
                .scalar
                .starts_with(|c: char| c == '-' || c.is_ascii_digit());
        if !ok {
            self.malformed();
            return;
        }
        if let Sink::Flag(f) = self.sink {
            let on = self.scalar == "true";
            match f {
                Flag::Sidechain => self.facts.is_sidechain = on,
                Flag::Meta => self.facts.is_meta = on,
                Flag::CompactSummary => self.facts.is_compact_summary = on,
                Flag::TranscriptOnly => self.facts.is_visible_in_transcript_only = on,
                Flag::AttachmentMeta => self.facts.attachment_is_meta = on,
            }
        }
        self.value_done();
    }

    fn text_mut(&mut self) -> &mut NormalizedText {
        if self.sink == Sink::PromptText {
            &mut self.facts.prompt
        } else {
            &mut self.facts.content
        }
    }

    fn string_byte(&mut self, b: u8, key: bool) {
        let keep = if key {
            self.depth() <= PATH_DEPTH
        } else {
            self.sink != Sink::Ignore
        };
        match self.esc {
            Esc::Backslash => {
                self.esc = Esc::None;
                let c = match b {
                    b'"' => '"',
                    b'\\' => '\\',
                    b'/' => '/',
                    b'b' => '\u{8}',
                    b'f' => '\u{c}',
                    b'n' => '\n',
                    b'r' => '\r',
                    b't' => '\t',
                    b'u' => {
                        self.esc = Esc::Unicode { n: 0, value: 0 };
                        return;
                    }
                    _ => return self.malformed(),
                };
                if keep {
                    self.flush_high();
                    self.char_out(c, key);
                }
            }
            Esc::Unicode { n, value } => {
                let Some(d) = char::from(b).to_digit(16) else {
                    return self.malformed();
                };
                let value = (value << 4) | d as u16;
                if n < 3 {
                    self.esc = Esc::Unicode { n: n + 1, value };
                } else {
                    self.esc = Esc::None;
                    if keep {
                        self.code_unit(value, key);
                    }
                }
            }
            Esc::None => match b {
                b'"' => {
                    if keep {
                        self.flush_high();
                        self.flush_utf8(key);
                    }
                    self.end_string(key);
                }
                b'\\' => self.esc = Esc::Backslash,
                _ if keep => {
                    self.flush_high();
                    self.utf8_byte(b, key);
                }
                _ => {}
            },
        }
    }

    fn code_unit(&mut self, unit: u16, key: bool) {
        match (self.high.take(), unit) {
            (None, 0xD800..=0xDBFF) => self.high = Some(unit),
            (Some(high), 0xDC00..=0xDFFF) => {
                let c = 0x10000 + ((u32::from(high) - 0xD800) << 10) + (u32::from(unit) - 0xDC00);
                self.char_out(char::from_u32(c).unwrap_or('\u{fffd}'), key);
            }
            (high, _) => {
                if high.is_some() {
                    self.char_out('\u{fffd}', key);
                }
                if (0xD800..=0xDFFF).contains(&unit) {
                    if (0xD800..=0xDBFF).contains(&unit) {
                        self.high = Some(unit);
                    } else {
                        self.char_out('\u{fffd}', key);
                    }
                } else {
                    self.char_out(char::from_u32(u32::from(unit)).unwrap_or('\u{fffd}'), key);
                }
            }
        }
    }

    /// A lone high surrogate followed by anything but its low half.
    fn flush_high(&mut self) {
        if self.high.take().is_some() {
            let key = matches!(self.tok, Tok::Str { key: true });
            self.char_out('\u{fffd}', key);
        }
    }

    fn utf8_byte(&mut self, b: u8, key: bool) {
        if b < 0x80 {
            self.flush_utf8(key);
            self.char_out(char::from(b), key);
            return;
        }
        if b & 0xC0 != 0x80 {
            // A lead byte: whatever was pending is cut short.
            self.flush_utf8(key);
        }
        self.utf8.push(b);
        let want = match self.utf8[0] {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        if self.utf8.len() >= want {
            self.flush_utf8(key);
        }
    }

    fn flush_utf8(&mut self, key: bool) {
        if self.utf8.is_empty() {
            return;
        }
        let bytes = std::mem::take(&mut self.utf8);
        match std::str::from_utf8(&bytes) {
            Ok(s) => {
                for c in s.chars() {
                    self.char_out(c, key);
                }
            }
            Err(_) => self.char_out('\u{fffd}', key),
        }
    }

    fn char_out(&mut self, c: char, key: bool) {
        if key {
            // One character past the limit marks a key too long to be one of ours.
            if self.buf.len() <= KEY_BYTES {
                self.buf.push(c);
            }
            return;
        }
        match self.sink {
            Sink::Ignore | Sink::Flag(_) => {}
            Sink::ContentText => self.facts.content.push(c),
            Sink::PromptText => self.facts.prompt.push(c),
            Sink::Uuid => self.uuid_char(c),
            _ => {
                if self.buf.len() < SMALL_BYTES {
                    self.buf.push(c);
                }
            }
        }
    }

    /// A character of a `uuid`: kept while the value fits in [`MAX_DEDUPE_ID_BYTES`] bytes;
    /// past that, the whole value is hashed instead ([`RowFacts::uuid`]).
    fn uuid_char(&mut self, c: char) {
        let mut utf8 = [0u8; 4];
        let bytes = c.encode_utf8(&mut utf8).as_bytes();
        if let Some(hash) = &mut self.long_uuid {
            hash.write(bytes);
        } else if self.buf.len() + bytes.len() <= MAX_DEDUPE_ID_BYTES {
            self.buf.push(c);
        } else {
            let mut hash = Fnv64::new();
            hash.write(self.buf.as_bytes());
            hash.write(bytes);
            self.long_uuid = Some(hash);
            self.buf.clear();
        }
    }

    fn end_string(&mut self, key: bool) {
        if key {
            if self.depth() <= PATH_DEPTH {
                let k = if self.buf.len() > KEY_BYTES {
                    Key::Other
                } else {
                    Key::of(&self.buf)
                };
                if let Some(last) = self.path.last_mut() {
                    *last = Seg::Obj(Some(k));
                }
            }
            self.buf.clear();
            self.tok = Tok::Colon;
            return;
        }
        let value = std::mem::take(&mut self.buf);
        let long_uuid = self.long_uuid.take();
        let f = &mut self.facts;
        match self.sink {
            Sink::RowType => f.row_type = Some(value),
            Sink::Uuid => {
                f.uuid = Some(long_uuid.map_or(value, |h| format!("{:016x}", h.finish())));
            }
            Sink::Role => f.role = Some(value),
            Sink::PartType => match value.as_str() {
                "tool_result" => f.has_tool_result = true,
                // The part's text is read from its `text` field.
                "text" => {}
                _ => f.has_non_text_part = true,
            },
            // As in `message.content`: a prompt of only an image the person pasted counts.
            Sink::PromptPartType => {
                if value != "text" {
                    f.prompt_has_non_text_part = true;
                }
            }
            Sink::AttachmentType => f.attachment_type = Some(value),
            Sink::CommandMode => f.command_mode = Some(value),
            Sink::OriginKind => f.origin_kind = Some(value),
            Sink::Subtype => f.subtype = Some(value),
            Sink::RowOriginKind => f.row_origin_kind = Some(value),
            Sink::Ignore | Sink::Flag(_) | Sink::ContentText | Sink::PromptText => {}
        }
        self.value_done();
    }
}

/// A human intervention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HumanKind {
    /// Text the person typed.
    Prompt,
    /// A slash command the person ran.
    SlashCommand,
    /// "[Request interrupted by user]".
    Interrupt,
    /// A `!` shell command the person ran.
    BashInput,
    /// Text typed while a turn was running (a queued-command attachment of human origin).
    Queued,
}

/// Why a line is not a human turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// Not one JSON object.
    Malformed,
    /// Bookkeeping (`summary`, `system`, other attachments, ...).
    NotConversation,
    /// The model's row.
    Assistant,
    /// A subagent's row.
    Sidechain,
    /// `isMeta`: written by the harness (caveats, expanded command prompts).
    Meta,
    /// `isCompactSummary`.
    CompactSummary,
    /// `isVisibleInTranscriptOnly`.
    TranscriptOnly,
    /// A `user` row whose role is not `user`.
    NotUserRole,
    /// Content holding a tool result.
    ToolResult,
    /// Another session's message (`[Inter-session message]`).
    InterSession,
    /// The gateway's own replay preamble.
    Replay,
    /// A background task's notification.
    TaskNotification,
    /// A command's captured output.
    CommandOutput,
    /// One of the session's own recent prompts.
    SelfEcho,
    /// No text and nothing else.
    Empty,
    /// A queued command that no person typed.
    QueuedNotHuman,
}

/// The verdict on one line.
pub type Verdict = Result<HumanKind, SkipReason>;

const INTER_SESSION: &str = "[Inter-session message]";
const REPLAY: &str = "Continue this conversation using the OpenClaw transcript below";
const TASK_NOTIFICATION: &str = "<task-notification";
const COMMAND_OUTPUT: [&str; 3] = ["<local-command-", "<bash-stdout", "<bash-stderr"];
const SLASH_COMMAND: [&str; 2] = ["<command-name>", "<command-message>"];
const INTERRUPT: &str = "[Request interrupted by user";
const BASH_INPUT: &str = "<bash-input>";

/// The text rules shared by every provider: a text that is an inter-session envelope, the
/// gateway's replay header, a task notification, a command's captured output or self-echo is
/// not a human turn; an empty text is one only when something else came with it (an image).
pub fn text_verdict(
    text: &NormalizedText,
    has_non_text_part: bool,
    own: &[TextFingerprint],
) -> Verdict {
    let p = text.prefix();
    if p.starts_with(INTER_SESSION) {
        return Err(SkipReason::InterSession);
    }
    if p.starts_with(REPLAY) {
        return Err(SkipReason::Replay);
    }
    if p.starts_with(TASK_NOTIFICATION) {
        return Err(SkipReason::TaskNotification);
    }
    if COMMAND_OUTPUT.iter().any(|x| p.starts_with(x)) {
        return Err(SkipReason::CommandOutput);
    }
    if text.is_empty() {
        return if has_non_text_part {
            Ok(HumanKind::Prompt)
        } else {
            Err(SkipReason::Empty)
        };
    }
    if own.contains(&text.fingerprint()) {
        return Err(SkipReason::SelfEcho);
    }
    if SLASH_COMMAND.iter().any(|x| p.starts_with(x)) {
        return Ok(HumanKind::SlashCommand);
    }
    if p.starts_with(INTERRUPT) {
        return Ok(HumanKind::Interrupt);
    }
    if p.starts_with(BASH_INPUT) {
        return Ok(HumanKind::BashInput);
    }
    Ok(HumanKind::Prompt)
}

/// Whether a transcript line is a human turn (DESIGN.md section 8). `own` holds the
/// fingerprints of the own prompts the monitor gave ([`awareness_core::upstream::fingerprints`]:
/// the session's recent ones, and those of the sessions linked to the same thread).
pub fn classify(end: &LineEnd, own: &[TextFingerprint]) -> Verdict {
    let f = match end {
        LineEnd::Row(f) => f,
        LineEnd::Blank => return Err(SkipReason::Empty),
        LineEnd::Malformed => return Err(SkipReason::Malformed),
    };
    match f.row_type.as_deref() {
        Some("user") => {
            if f.is_sidechain {
                return Err(SkipReason::Sidechain);
            }
            if f.is_meta {
                return Err(SkipReason::Meta);
            }
            if f.is_compact_summary {
                return Err(SkipReason::CompactSummary);
            }
            if f.is_visible_in_transcript_only {
                return Err(SkipReason::TranscriptOnly);
            }
            if f.role.as_deref().is_some_and(|r| r != "user") {
                return Err(SkipReason::NotUserRole);
            }
            if f.has_tool_result {
                return Err(SkipReason::ToolResult);
            }
            // Who wrote the row, where the version says so: a background task's notification
            // or another Claude session's message, whatever its text.
            match f.row_origin_kind.as_deref() {
                Some("task-notification") => return Err(SkipReason::TaskNotification),
                Some("peer") => return Err(SkipReason::InterSession),
                _ => {}
            }
            text_verdict(&f.content, f.has_non_text_part, own)
        }
        Some("system") if f.subtype.as_deref() == Some("local_command") => {
            if f.is_sidechain {
                return Err(SkipReason::Sidechain);
            }
            if f.is_meta {
                return Err(SkipReason::Meta);
            }
            // A slash command the person ran; the same row type holds its captured output.
            match text_verdict(&f.content, false, own)? {
                HumanKind::SlashCommand => Ok(HumanKind::SlashCommand),
                _ => Err(SkipReason::NotConversation),
            }
        }
        Some("assistant") => Err(SkipReason::Assistant),
        Some("attachment") if f.attachment_type.as_deref() == Some("queued_command") => {
            if f.is_sidechain {
                return Err(SkipReason::Sidechain);
            }
            if f.is_meta || f.attachment_is_meta {
                return Err(SkipReason::Meta);
            }
            let typed_mode = matches!(f.command_mode.as_deref(), Some("prompt" | "bash"));
            if f.origin_kind.as_deref() != Some("human") || !typed_mode {
                return Err(SkipReason::QueuedNotHuman);
            }
            text_verdict(&f.prompt, f.prompt_has_non_text_part, own).map(|_| HumanKind::Queued)
        }
        _ => Err(SkipReason::NotConversation),
    }
}

#[cfg(test)]
mod tests {
    use awareness_core::upstream::{fingerprint, own_fingerprints};
    use serde_json::{Value, json};

    use super::*;

    /// The facts of a line through the streaming reader, fed in pieces of `step` bytes and
    /// through a serialize/deserialize round trip between pieces (as a resumed tick would).
    fn facts_in_pieces(line: &str, step: usize) -> LineEnd {
        let mut s = LineScanner::new();
        for piece in line.as_bytes().chunks(step.max(1)) {
            assert_eq!(s.feed(piece), None);
            // Every state the reader reaches is one a stored marker may hold unskipped.
            assert!(s.is_sound(), "{s:?} after {} bytes of {line}", s.consumed);
            s = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        }
        assert_eq!(s.feed(b"\nnext"), Some(0));
        assert_eq!(s.consumed, line.len() as u64);
        s.finish()
    }

    /// Every state the reader reaches on odd lines (malformed ones, escapes cut anywhere,
    /// surrogates, bytes that are not UTF-8, nesting past what is followed) is one
    /// [`LineScanner::is_sound`] accepts: a stored state it refused would cost a line that
    /// did not need to be skipped.
    #[test]
    fn every_state_the_reader_reaches_is_sound() {
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(300), "]".repeat(300));
        // Every field the reader keeps at and past its bound, in characters of 1 to 4 bytes,
        // the last one crossing the bound (a 4-byte character after 63 bytes of a short
        // field, after 40 of a key).
        let past = format!("{}😀", "a".repeat(63));
        let past_key = format!("{}😀", "a".repeat(40));
        let long = format!(
            r#"{{"type":"{a}","uuid":"{e}","{k}":1,"{kk}":2,"message":{{"role":"{p}","content":"{t}"}},"attachment":{{"type":"{e}","prompt":"{t}","origin":{{"kind":"{a}"}}}},"subtype":"{p}","n":-12345678901234567890e-5}}"#,
            a = "é".repeat(40),
            e = "😀".repeat(30),
            k = "ключ".repeat(20),
            kk = past_key,
            p = past,
            t = "слово ".repeat(100),
        );
        let lines: Vec<Vec<u8>> = [
            r#"{"a":"\u12zz","type":"user"}"#,
            r#"{"a":"\q"}"#,
            r#"{"message":{"content":"\ud83d\ude00 \ud83d x \ude00 \ud83d\u0041"}}"#,
            // The last high surrogate. (What the mutation did: a state holding it refused, and
            // a line cut there skipped at the next check; review of stop 65, T332.)
            r#"{"message":{"content":"\udbff\udfff"}}"#,
            "[1,2]",
            r#""top""#,
            r#"{"a":tru,"b":nul}"#,
            r#"{"a" "b"}"#,
            "{} x",
            r#"{"a":[{"b":[1,{"c":"d"}]},[],{}],"e":-1.5e3}"#,
            r#"{"a":1,}"#,
            r#"{"type":"user","message":{"role":"user","content":[{"type":"text","text":"hi"}]}}"#,
            // As many characters for as few bytes as texts take.
            r#"{"message":{"content":["a","b",{"text":"c d"}]},"attachment":{"prompt":["e","f"]}}"#,
            deep.as_str(),
            long.as_str(),
        ]
        .iter()
        .map(|l| l.as_bytes().to_vec())
        .chain([
            b"{\"message\":{\"content\":\"caf\xc3\xa9 \xff\xe2\x82 \xf0\x9f\x98\x80\"}}".to_vec(),
            b"{\"\xc3\xa9\":\"\xe2\x82\xac\"}".to_vec(),
            // A number whose last kept byte is not ASCII (kept as a character of 2 bytes).
            b"{\"n\":-123456\xff\xfe}".to_vec(),
        ])
        .collect();
        for line in &lines {
            let mut s = LineScanner::new();
            for (i, byte) in line.iter().enumerate() {
                assert_eq!(s.feed(std::slice::from_ref(byte)), None);
                assert!(
                    s.is_sound(),
                    "{s:?} after {} bytes of {}",
                    i + 1,
                    String::from_utf8_lossy(line)
                );
            }
        }
    }

    /// Whether `scanner`'s state, stored and edited by `edit`, reads back as sound.
    fn sound_after(scanner: &LineScanner, edit: &dyn Fn(&mut Value)) -> bool {
        let mut v = serde_json::to_value(scanner).unwrap();
        edit(&mut v);
        serde_json::from_value::<LineScanner>(v).unwrap().is_sound()
    }

    /// A line state an earlier version stored, without the facts added since (a queued
    /// prompt's part that is not text, a `system` row's subtype, a row's origin kind), reads
    /// back as the same state: a marker holding a partial line is resumed after an upgrade,
    /// not found unreadable and its link rebased, losing the turns since. (What the mutation
    /// did: the flag required; review of stop 69, T535. A missing `Option` field reads as
    /// `None` with or without `#[serde(default)]`: T536 and T537 were equivalent.)
    #[test]
    fn a_state_stored_before_the_newer_facts_reads_back() {
        let mut s = LineScanner::new();
        assert_eq!(
            s.feed(br#"{"type":"user","message":{"role":"user","content":"half a pro"#),
            None
        );
        let mut v = serde_json::to_value(&s).unwrap();
        for field in ["prompt_has_non_text_part", "subtype", "row_origin_kind"] {
            v["facts"].as_object_mut().unwrap().remove(field);
        }
        let read = serde_json::from_value::<LineScanner>(v);
        assert_eq!(read.ok(), Some(s), "a state without the newer facts");
    }

    /// States a stored marker may hold but the reader cannot reach are refused.
    #[test]
    fn a_state_the_reader_cannot_reach_is_not_sound() {
        let mut inside = LineScanner::new();
        assert_eq!(inside.feed(br#"{"message":{"content":"x"#), None);
        assert!(inside.is_sound());
        let edited = |edit: &dyn Fn(&mut Value)| sound_after(&inside, edit);
        assert!(edited(&|_| {}), "unedited");
        assert!(!edited(&|v| v["high"] = json!(5)), "not a high surrogate");
        assert!(!edited(&|v| v["kinds"] = json!("ox")), "not a container");
        assert!(!edited(&|v| v["kinds"] = json!("o")), "the path is deeper");
        assert!(
            !edited(&|v| v["kinds"] = json!("o".repeat(300))),
            "too deep"
        );
        // A state nested deeper than the reader follows is refused, its path of the outermost
        // levels fitting it (the path's length alone refused the one above). (What the mutation
        // did: the depth left unbounded, such an edited state was read on; review of stop 72,
        // MT41.)
        assert!(
            !edited(&|v| {
                let p = v["path"].clone();
                v["kinds"] = json!("o".repeat(MAX_DEPTH + 1));
                v["path"] = json!([p[0], p[1], p[1], p[1]]);
            }),
            "deeper than followed"
        );
        assert!(
            !edited(&|v| v["utf8"] = json!([226, 130, 172, 1])),
            "a character has 4 bytes at most"
        );
        assert!(
            !edited(&|v| v["tok"] = json!("Done")),
            "done inside containers"
        );
        assert!(
            !edited(&|v| v["esc"] = json!({"Unicode": {"n": 4, "value": 0}})),
            "4 digits read"
        );
        // Kept fields past their bounds: a marker read back with one would grow past what a
        // link may store, and be read again at every tick.
        assert!(
            !edited(&|v| v["buf"] = json!("x".repeat(100))),
            "a key or short string"
        );
        assert!(
            !edited(&|v| v["scalar"] = json!("1".repeat(20))),
            "a number's first bytes"
        );
        assert!(
            !edited(&|v| v["facts"]["row_type"] = json!("x".repeat(100))),
            "a short field"
        );
        // Every short field, the row origin's kind as well. (What the mutation did: it left
        // out of the fields bounded, such an edited marker was read on; review of stop 67,
        // T404.)
        assert!(
            !edited(&|v| v["facts"]["row_origin_kind"] = json!("x".repeat(100))),
            "a row's origin kind past its bound"
        );
        // Each of the other short fields as well. (What the mutations did: each left out of
        // the fields bounded, such an edited marker was read on, its field growing past what a
        // link may store; review of stop 69, T501 to T505.)
        for field in [
            "role",
            "attachment_type",
            "command_mode",
            "origin_kind",
            "subtype",
        ] {
            assert!(
                !edited(&|v| v["facts"][field] = json!("x".repeat(100))),
                "{field} past its bound"
            );
        }
        assert!(
            !edited(&|v| v["facts"]["uuid"] = json!("x".repeat(100))),
            "a uuid kept whole"
        );
        assert!(
            !edited(&|v| v["facts"]["content"]["prefix_cap"] = json!(1_000_000)),
            "another text prefix"
        );
        assert!(
            !edited(&|v| v["facts"]["prompt"]["prefix"] = json!("y")),
            "a prefix longer than the text"
        );
        // Counts no line reaches: read on, they would overflow (a panic with overflow checks,
        // the monitor failing the link at every tick; else a text wrapped to empty, and the
        // person's turn dropped).
        assert!(
            !edited(&|v| v["consumed"] = json!(u64::MAX)),
            "more bytes than a file holds"
        );
        let counted = |chars: u64| {
            move |v: &mut Value| {
                v["facts"]["content"]["chars"] = json!(chars);
                let kept =
                    usize::try_from(chars).map_or(TEXT_PREFIX_CHARS, |c| c.min(TEXT_PREFIX_CHARS));
                v["facts"]["content"]["prefix"] = json!("x".repeat(kept));
            }
        };
        assert!(!edited(&counted(u64::MAX)), "a text past every line");
        assert!(
            !edited(&counted(inside.consumed + 1)),
            "more characters than bytes consumed"
        );
        // An escape is read inside a string only: a state holding one between tokens is refused,
        // not read on with the next string's first character taken for an escape. (What the
        // mutation did: such a state taken for sound; review of stop 69, T506.)
        let mut between = LineScanner::new();
        assert_eq!(
            between.feed(br#"{"type":"user","message":{"role":"user","content":"hi""#),
            None
        );
        assert!(between.is_sound());
        for esc in [json!("Backslash"), json!({"Unicode": {"n": 1, "value": 0}})] {
            assert!(
                !sound_after(&between, &|v| v["esc"] = esc.clone()),
                "an escape {esc} between tokens"
            );
        }
        // A queued prompt's count as well, up to the bytes consumed and not past them, read
        // in a prompt. (What the mutation did: the prompt's count left out of the characters
        // bounded; review of stop 67, T405.)
        let mut inside = LineScanner::new();
        assert_eq!(inside.feed(br#"{"attachment":{"prompt":"x"#), None);
        let edited = |edit: &dyn Fn(&mut Value)| sound_after(&inside, edit);
        let prompt_chars = |chars: u64| {
            move |v: &mut Value| {
                v["facts"]["prompt"]["chars"] = json!(chars);
                v["facts"]["prompt"]["prefix"] =
                    json!("x".repeat(usize::try_from(chars).unwrap().min(TEXT_PREFIX_CHARS)));
            }
        };
        assert!(
            edited(&prompt_chars(inside.consumed)),
            "as many characters in the prompt as bytes consumed"
        );
        assert!(
            !edited(&prompt_chars(inside.consumed + 1)),
            "more characters in the prompt than bytes consumed"
        );
        assert!(
            edited(&|v| {
                counted(inside.consumed)(v);
                v["consumed"] = json!(u64::MAX / 2);
            }),
            "as many characters as bytes consumed, of a line as long as a file can be"
        );
    }

    /// A stored state with a count at the end of `u64`, read on anyway (the caller did not ask
    /// [`LineScanner::is_sound`], or skips on from its count), neither panics nor wraps: the
    /// byte count stays at its end, and a text stays a text (wrapped to 0 it would be empty,
    /// and a person's turn dropped as such).
    #[test]
    fn a_count_at_the_end_of_u64_reads_on_without_overflow() {
        let at_end = |line: &[u8], edit: &dyn Fn(&mut Value)| {
            let mut s = LineScanner::new();
            assert_eq!(s.feed(line), None);
            let mut v = serde_json::to_value(&s).unwrap();
            edit(&mut v);
            serde_json::from_value::<LineScanner>(v).unwrap()
        };
        let max_consumed = |v: &mut Value| v["consumed"] = json!(u64::MAX);
        let content = br#"{"type":"user","message":{"role":"user","content":"ab"#;
        // Byte by byte (a text), in an ignored string's run, in a skipped rest's run.
        let cases: [(&[u8], &[u8]); 3] =
            [(content, b"c d"), (br#"{"a":"b"#, b"cdef"), (b"[", b"1, 2")];
        for (line, more) in cases {
            let mut s = at_end(line, &max_consumed);
            assert_eq!(s.feed(more), None);
            assert_eq!(s.consumed, u64::MAX);
            assert_eq!(LineScanner::skipping(u64::MAX).feed(more), None);
        }
        let mut s = at_end(content, &|v| {
            v["facts"]["content"]["chars"] = json!(u64::MAX);
            v["facts"]["content"]["prefix"] = json!("a".repeat(TEXT_PREFIX_CHARS));
        });
        assert_eq!(s.feed(b"c\"}}\n"), Some(4));
        let LineEnd::Row(facts) = s.finish() else {
            panic!("not a row");
        };
        assert_eq!(facts.content.fingerprint().chars, u64::MAX);
        assert!(!facts.content.is_empty());
    }

    /// The reviewer's case through the provider: a stored line state edited to a text count
    /// at the end of `u64` is refused, so its line is skipped (not resumed into an overflow),
    /// the marker moves past it, and the next line's turn is counted.
    #[test]
    fn a_stored_count_at_the_end_of_u64_costs_its_line_not_the_link() {
        use std::io::Write as _;

        use crate::upstream::CheckOutcome;
        use crate::upstream::jsonl::{JsonlMarker, marker_at_end, scan};

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(br#"{"type":"user","message":{"role":"user","content":"ab"#)
            .unwrap();
        let m0 = marker_at_end(&path).unwrap();
        let CheckOutcome::Unchanged { marker } = scan(&path, Some(&m0), &[], u64::MAX) else {
            panic!("a partial line");
        };
        let mut v = marker.clone();
        v["partial"]["facts"]["content"]["chars"] = json!(u64::MAX);
        v["partial"]["facts"]["content"]["prefix"] = json!("a".repeat(TEXT_PREFIX_CHARS));
        let edited = JsonlMarker::from_value(&v).unwrap();
        assert!(!edited.partial.as_ref().unwrap().is_sound());
        f.write_all(b"c\"}}\n").unwrap();
        let CheckOutcome::Unchanged { marker } = scan(&path, Some(&edited), &[], u64::MAX) else {
            panic!("the edited line is skipped, not counted");
        };
        let moved = JsonlMarker::from_value(&marker).unwrap();
        assert_eq!(moved.position(), std::fs::metadata(&path).unwrap().len());
        f.write_all(br#"{"type":"user","uuid":"u2","message":{"role":"user","content":"next"}}"#)
            .unwrap();
        f.write_all(b"\n").unwrap();
        let outcome = scan(&path, Some(&moved), &[], u64::MAX);
        assert!(
            matches!(&outcome, CheckOutcome::HumanTurns { turns: 1, dedupe_id, .. } if dedupe_id == "u2"),
            "{outcome:?}"
        );
    }

    fn verdict(line: &Value) -> Verdict {
        verdict_with(line, &[])
    }

    fn verdict_with(line: &Value, own: &[String]) -> Verdict {
        let text = line.to_string();
        let end = RowFacts::from_line(text.as_bytes()).expect("not blank");
        // Every way of cutting the line gives the same facts (big lines in big pieces only:
        // each piece goes through a serialize/deserialize round trip).
        let steps: &[usize] = if text.len() > 64 * 1024 {
            &[64 * 1024]
        } else {
            &[1, 7, 64]
        };
        for &step in steps {
            assert_eq!(facts_in_pieces(&text, step), end, "step {step}: {text}");
        }
        classify(&end, &own_fingerprints(own))
    }

    /// A realistic `user` row around `content`.
    #[allow(clippy::needless_pass_by_value)] // called with `json!(...)` temporaries
    fn user(content: Value) -> Value {
        json!({
            "parentUuid": "5b7e0c7e-3f7a-4c43-9a8e-2f1d6b3a9c10",
            "isSidechain": false,
            "userType": "external",
            "cwd": "/home/me/project",
            "sessionId": "0b3c6f1e-8a7d-4e52-b1d4-6a1f3e9c2d77",
            "version": "2.0.55",
            "gitBranch": "main",
            "type": "user",
            "message": {"role": "user", "content": content},
            "uuid": "e1f2a3b4-c5d6-4e7f-8a9b-0c1d2e3f4a5b",
            "timestamp": "2026-11-30T10:15:30.123Z"
        })
    }

    fn with(mut row: Value, key: &str, value: Value) -> Value {
        row[key] = value;
        row
    }

    #[test]
    fn counted_rows() {
        assert_eq!(
            verdict(&user(json!("please also cover the error path"))),
            Ok(HumanKind::Prompt)
        );
        assert_eq!(
            verdict(&user(json!([{"type": "text", "text": "and rename it"}]))),
            Ok(HumanKind::Prompt)
        );
        assert_eq!(
            verdict(&user(json!(
                "<command-name>/model</command-name>\n            <command-message>model</command-message>\n            <command-args>opus</command-args>"
            ))),
            Ok(HumanKind::SlashCommand)
        );
        assert_eq!(
            verdict(&user(json!(
                "<command-message>review is running…</command-message>\n<command-name>/review</command-name>"
            ))),
            Ok(HumanKind::SlashCommand)
        );
        assert_eq!(
            verdict(&user(
                json!([{"type": "text", "text": "[Request interrupted by user]"}])
            )),
            Ok(HumanKind::Interrupt)
        );
        assert_eq!(
            verdict(&user(
                json!([{"type": "text", "text": "[Request interrupted by user for tool use]"}])
            )),
            Ok(HumanKind::Interrupt)
        );
        assert_eq!(
            verdict(&user(json!("<bash-input>git status</bash-input>"))),
            Ok(HumanKind::BashInput)
        );
        let image = json!([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]);
        assert_eq!(verdict(&user(image.clone())), Ok(HumanKind::Prompt));
        let queued = json!({
            "parentUuid": "5b7e0c7e-3f7a-4c43-9a8e-2f1d6b3a9c10",
            "isSidechain": false,
            "type": "attachment",
            "attachment": {"type": "queued_command", "commandMode": "prompt",
                "origin": {"kind": "human"}, "prompt": "stop, use the v2 API instead"},
            "uuid": "aa11aa11-0000-4000-8000-000000000001",
            "timestamp": "2026-11-30T10:16:00.000Z"
        });
        assert_eq!(verdict(&queued), Ok(HumanKind::Queued));
        let mut parts = queued.clone();
        parts["attachment"]["prompt"] = json!([{"type": "text", "text": "use v2"}]);
        assert_eq!(verdict(&parts), Ok(HumanKind::Queued));
        // A queued prompt of only a pasted image counts, as the same content in a user row.
        let mut pasted = queued.clone();
        pasted["attachment"]["prompt"] = image;
        assert_eq!(verdict(&pasted), Ok(HumanKind::Queued));
    }

    /// A `!` shell command the person typed while a turn ran (a queued command of mode
    /// `bash`, human origin) is a human turn, as the module's table says. (Only mode `prompt`
    /// taken as typed, a mutation every test passed, such a command was no turn, and no
    /// `human_direct_message` was recorded for it: review of stop 61.)
    #[test]
    fn a_queued_shell_command_is_a_human_turn() {
        let queued = json!({
            "type": "attachment",
            "attachment": {"type": "queued_command", "commandMode": "bash",
                "origin": {"kind": "human"}, "prompt": "ls -la"},
            "uuid": "aa11aa11-0000-4000-8000-000000000002"
        });
        assert_eq!(verdict(&queued), Ok(HumanKind::Queued));
    }

    /// A row that starts with a command's captured standard error is its output, not a
    /// person's turn: a shell command's and a slash command's alike. (The only such row the
    /// tests had began with stdout, so a list of prefixes naming `<bash-stdout` twice and never
    /// `<bash-stderr`, a mutation, passed every test: a command's error output was then
    /// recorded as a human turn: review of stop 61. And with `<local-command-` narrowed to
    /// `<local-command-stdout`, a slash command's error output was: review of stop 65, T325.)
    #[test]
    fn captured_standard_error_is_command_output() {
        assert_eq!(
            verdict(&user(json!(
                "<bash-stderr>ls: cannot access 'x': No such file or directory</bash-stderr>"
            ))),
            Err(SkipReason::CommandOutput)
        );
        assert_eq!(
            verdict(&user(json!(
                "<local-command-stderr>Error: unknown model 'opuss'</local-command-stderr>"
            ))),
            Err(SkipReason::CommandOutput),
            "a slash command's standard error"
        );
    }

    /// A flag written `null` (a row another writer left) is not set: the row is the
    /// person's. (Anything but `false` read as set, a mutation every test passed, skipped it
    /// as a subagent's or a meta row: review of stop 61.)
    #[test]
    fn a_flag_written_null_is_not_set() {
        let row = with(
            with(user(json!("typed")), "isSidechain", Value::Null),
            "isMeta",
            Value::Null,
        );
        assert_eq!(verdict(&row), Ok(HumanKind::Prompt));
    }

    /// A flag written `false` is not set: a `user` row that says it is no compact summary, or
    /// not only for the transcript, is the person's, and so is a queued command whose
    /// attachment says it is not meta. (What the mutations did: each of these flags read as set
    /// whatever its value, and the person's turn was skipped; review of stop 70, T637, T638
    /// and T640.)
    #[test]
    fn a_flag_written_false_is_not_set() {
        assert_eq!(
            verdict(&with(
                user(json!("typed")),
                "isCompactSummary",
                json!(false)
            )),
            Ok(HumanKind::Prompt),
            "isCompactSummary: false"
        );
        assert_eq!(
            verdict(&with(
                user(json!("typed")),
                "isVisibleInTranscriptOnly",
                json!(false)
            )),
            Ok(HumanKind::Prompt),
            "isVisibleInTranscriptOnly: false"
        );
        let queued = json!({
            "type": "attachment",
            "attachment": {"type": "queued_command", "commandMode": "prompt",
                "origin": {"kind": "human"}, "isMeta": false, "prompt": "use v2"},
            "uuid": "aa11aa11-0000-4000-8000-000000000003"
        });
        assert_eq!(
            verdict(&queued),
            Ok(HumanKind::Queued),
            "attachment.isMeta: false"
        );
    }

    /// Rows of recent Claude Code versions: a slash command the person ran is a `system` row
    /// (`subtype: local_command`, top-level `content`), beside its captured output in the same
    /// row type; a `user` row's `origin.kind` says a background task or another Claude session
    /// wrote it, whatever its text.
    #[test]
    fn rows_of_recent_versions() {
        let system = |content: &str| {
            json!({
                "parentUuid": "5b7e0c7e-3f7a-4c43-9a8e-2f1d6b3a9c10",
                "isSidechain": false,
                "type": "system",
                "subtype": "local_command",
                "content": content,
                "level": "info",
                "timestamp": "2026-11-30T10:15:30.123Z",
                "uuid": "c1d2e3f4-a5b6-4c7d-8e9f-0a1b2c3d4e5f",
                "isMeta": false
            })
        };
        let command = system(
            "<command-name>/model</command-name>\n            <command-message>model</command-message>\n            <command-args>opus</command-args>",
        );
        assert_eq!(verdict(&command), Ok(HumanKind::SlashCommand));
        assert_eq!(
            verdict(&system(
                "<local-command-stdout>Set model to opus</local-command-stdout>"
            )),
            Err(SkipReason::CommandOutput)
        );
        assert_eq!(
            verdict(&with(command.clone(), "isSidechain", json!(true))),
            Err(SkipReason::Sidechain)
        );
        assert_eq!(
            verdict(&with(command.clone(), "isMeta", json!(true))),
            Err(SkipReason::Meta)
        );
        assert_eq!(
            verdict(&with(command.clone(), "subtype", json!("informational"))),
            Err(SkipReason::NotConversation)
        );
        assert_eq!(
            verdict(&system("Conversation compacted")),
            Err(SkipReason::NotConversation),
            "only a slash command counts"
        );
        // A slash command's tag read at the text's start only, as every prefix rule. (What the
        // mutation did: a `system` row naming a command after its start counted as one; review
        // of stop 69, T529.)
        assert_eq!(
            verdict(&system(
                "Unknown skill, see <command-name>/help</command-name>"
            )),
            Err(SkipReason::NotConversation),
            "a command named after the text's start"
        );

        let from =
            |kind: &str, text: &str| with(user(json!(text)), "origin", json!({"kind": kind}));
        assert_eq!(
            verdict(&from("task-notification", "a background command finished")),
            Err(SkipReason::TaskNotification)
        );
        assert_eq!(
            verdict(&from(
                "peer",
                "Another Claude session sent a message: please rebase"
            )),
            Err(SkipReason::InterSession)
        );
        assert_eq!(
            verdict(&from("human", "please also cover the error path")),
            Ok(HumanKind::Prompt)
        );
        // `attachment.origin` is the queued command's, not the row's.
        let queued_origin = with(
            user(json!("and the docs")),
            "attachment",
            json!({"origin": {"kind": "task-notification"}}),
        );
        assert_eq!(verdict(&queued_origin), Ok(HumanKind::Prompt));
    }

    #[test]
    fn skipped_rows() {
        let assistant = json!({
            "parentUuid": "e1f2a3b4-c5d6-4e7f-8a9b-0c1d2e3f4a5b", "isSidechain": false,
            "type": "assistant",
            "message": {"id": "msg_01", "type": "message", "role": "assistant",
                "model": "claude-opus-4", "content": [{"type": "text", "text": "Done."},
                {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls"}}],
                "stop_reason": "tool_use", "usage": {"input_tokens": 10, "output_tokens": 5}},
            "uuid": "f0f0f0f0-0000-4000-8000-000000000002", "timestamp": "2026-11-30T10:15:31Z"
        });
        assert_eq!(verdict(&assistant), Err(SkipReason::Assistant));
        let tool_result = with(
            user(json!([{"tool_use_id": "toolu_01", "type": "tool_result",
                "content": "total 8\ndrwxr-xr-x 2 me me 4096 .", "is_error": false}])),
            "toolUseResult",
            json!({"stdout": "total 8", "stderr": "", "interrupted": false}),
        );
        assert_eq!(verdict(&tool_result), Err(SkipReason::ToolResult));
        // A tool result with a text part beside it as well. (What the mutation did: such a row
        // counted as a human turn; review of stop 67, T428.)
        let with_text = user(json!([
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "ok"},
            {"type": "text", "text": "hook feedback"}
        ]));
        assert_eq!(verdict(&with_text), Err(SkipReason::ToolResult));
        // A tool result after a part that is not text (an image the tool returned beside it)
        // is a tool result all the same, whatever the order of the parts. (What the mutation
        // did: a `tool_result` part after an image left the row counted as a human turn;
        // review of stop 71, TJ16.)
        let after_image = user(json!([
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "ok"}
        ]));
        assert_eq!(
            verdict(&after_image),
            Err(SkipReason::ToolResult),
            "a tool result after an image"
        );
        assert_eq!(
            verdict(&with(
                user(json!("look at tests/")),
                "isSidechain",
                json!(true)
            )),
            Err(SkipReason::Sidechain)
        );
        assert_eq!(
            verdict(&with(
                user(json!(
                    "Caveat: The messages below were generated by the user while running local commands. DO NOT respond to these messages or otherwise consider them in your response unless the user explicitly asks you to."
                )),
                "isMeta",
                json!(true)
            )),
            Err(SkipReason::Meta)
        );
        assert_eq!(
            verdict(&with(
                user(json!(
                    "This session is being continued from a previous conversation that ran out of context. The conversation is summarized below: ..."
                )),
                "isCompactSummary",
                json!(true)
            )),
            Err(SkipReason::CompactSummary)
        );
        assert_eq!(
            verdict(&with(
                user(json!("Compacted (ctrl+r to see full summary)")),
                "isVisibleInTranscriptOnly",
                json!(true)
            )),
            Err(SkipReason::TranscriptOnly)
        );
        assert_eq!(
            verdict(&user(json!(
                "[Inter-session message] from agent:main:main: please rebase onto main"
            ))),
            Err(SkipReason::InterSession)
        );
        // The envelope is read at a text's start only: a person quoting it is a human turn.
        // (What the mutation did: the marker anywhere skipped the prompt; review of stop 67,
        // T423.)
        assert_eq!(
            verdict(&user(json!(
                "why did an [Inter-session message] reach this session?"
            ))),
            Ok(HumanKind::Prompt)
        );
        // So are a task notification's tag, the replay header and a command's output tags: a
        // person quoting one is a human turn. (What the mutations did: each found anywhere in
        // the text's prefix, the person's prompt was skipped; review of stop 69, T514, T515 and
        // T516.)
        for quoted in [
            "what does a <task-notification> mean in the log?",
            "why did you say Continue this conversation using the OpenClaw transcript below?",
            "I ran it and got <bash-stdout>ok</bash-stdout>, is that right?",
            "it printed <local-command-stdout>Set model</local-command-stdout> twice",
            // The replay header whole, not its first words. (What the mutation did: the header
            // cut to `Continue this conversation`, a person's prompt starting so was skipped as
            // the gateway's replay; review of stop 70, T619.)
            "Continue this conversation from where we stopped yesterday",
        ] {
            assert_eq!(
                verdict(&user(json!(quoted))),
                Ok(HumanKind::Prompt),
                "{quoted}"
            );
        }
        assert_eq!(
            verdict(&user(json!(
                "Continue this conversation using the OpenClaw transcript below.\n\nuser: hi\nassistant: hello"
            ))),
            Err(SkipReason::Replay)
        );
        assert_eq!(
            verdict(&user(json!(
                "<task-notification>\n<task-id>b7c1</task-id>\n<status>completed</status>\n<summary>Background command finished</summary>\n</task-notification>"
            ))),
            Err(SkipReason::TaskNotification)
        );
        assert_eq!(
            verdict(&user(json!(
                "<local-command-stdout>Set model to opus (claude-opus-4)</local-command-stdout>"
            ))),
            Err(SkipReason::CommandOutput)
        );
        assert_eq!(
            verdict(&user(json!(
                "<bash-stdout>On branch main\nnothing to commit</bash-stdout><bash-stderr></bash-stderr>"
            ))),
            Err(SkipReason::CommandOutput)
        );
        // Self-echo: the session's own prompt, whitespace aside; only the last 10 count.
        let own: Vec<String> = std::iter::once("Fix the flaky test in  ci.yml".to_owned())
            .chain((0..9).map(|i| format!("own prompt {i}")))
            .collect();
        assert_eq!(
            verdict_with(&user(json!("  Fix the flaky test\nin ci.yml ")), &own),
            Err(SkipReason::SelfEcho)
        );
        assert_eq!(
            verdict_with(
                &user(json!([{"type": "text", "text": "own prompt 3"}])),
                &own
            ),
            Err(SkipReason::SelfEcho)
        );
        // Read as itself, a character whose first byte is 0xEF (fullwidth punctuation, common
        // in Chinese text). (What the mutation did: each of its bytes read as U+FFFD, and the
        // echo counted as a turn; review of stop 65, T320.)
        assert_eq!(
            verdict_with(
                &user(json!("修复测试，谢谢！")),
                &["修复测试，谢谢！".to_owned()]
            ),
            Err(SkipReason::SelfEcho),
            "a character with lead byte 0xEF"
        );
        let mut longer = own.clone();
        longer.push("one more".into());
        assert_eq!(
            verdict_with(&user(json!("Fix the flaky test in ci.yml")), &longer),
            Ok(HumanKind::Prompt),
            "the 11th most recent prompt is out of the window"
        );
        // Queued commands that no person typed.
        let queued = |attachment: Value| json!({"type": "attachment", "attachment": attachment, "uuid": "u"});
        assert_eq!(
            verdict(&queued(
                json!({"type": "queued_command", "commandMode": "prompt", "origin": {"kind": "peer"}, "prompt": "hi"})
            )),
            Err(SkipReason::QueuedNotHuman)
        );
        assert_eq!(
            verdict(&queued(
                json!({"type": "queued_command", "commandMode": "task-notification", "origin": {"kind": "human"}, "prompt": "<task-notification>x</task-notification>"})
            )),
            Err(SkipReason::QueuedNotHuman)
        );
        assert_eq!(
            verdict(&queued(
                json!({"type": "queued_command", "commandMode": "prompt", "prompt": "no origin"})
            )),
            Err(SkipReason::QueuedNotHuman)
        );
        assert_eq!(
            verdict(&queued(
                json!({"type": "queued_command", "commandMode": "prompt", "isMeta": true, "origin": {"kind": "human"}, "prompt": "x"})
            )),
            Err(SkipReason::Meta)
        );
        assert_eq!(
            verdict(&queued(
                json!({"type": "queued_command", "commandMode": "prompt", "origin": {"kind": "human"}, "prompt": "[Inter-session message] hi"})
            )),
            Err(SkipReason::InterSession)
        );
        assert_eq!(
            verdict(&queued(
                json!({"type": "hook_additional_context", "content": ["x"]})
            )),
            Err(SkipReason::NotConversation)
        );
        // Bookkeeping rows and oddities.
        for row in [
            json!({"type": "summary", "summary": "Fixing CI", "leafUuid": "x"}),
            json!({"type": "system", "subtype": "turn_duration", "durationMs": 1200}),
            json!({"type": "queue-operation", "operation": "dequeue"}),
            json!({"type": "file-history-snapshot", "messageId": "m", "snapshot": {}}),
            // Only a slash command makes a `system` row a turn, not a `!` shell command's input.
            // (What the mutation did: this row counted as a slash command; review of stop 67,
            // T430.)
            json!({"type": "system", "subtype": "local_command",
                "content": "<bash-input>ls</bash-input>", "isMeta": false, "uuid": "s1"}),
        ] {
            assert_eq!(verdict(&row), Err(SkipReason::NotConversation), "{row}");
        }
        assert_eq!(verdict(&user(json!("   "))), Err(SkipReason::Empty));
        assert_eq!(verdict(&user(json!([]))), Err(SkipReason::Empty));
        // Any role but `user`, not only `assistant`. (What the mutation did: a `system` role
        // counted as a human turn; review of stop 67, T427.)
        for role in ["assistant", "system"] {
            let mut other_role = user(json!("x"));
            other_role["message"]["role"] = json!(role);
            assert_eq!(verdict(&other_role), Err(SkipReason::NotUserRole), "{role}");
        }
    }

    #[test]
    fn malformed_and_blank_lines() {
        for bad in [
            "{\"type\":\"user\"",
            "{\"type\" \"user\"}",
            "[1,2]",
            "\"user\"",
            "{\"a\":tru}",
            "{\"a\":1}}",
            "{\"a\":\"\\x\"}",
            "{\"a\":1,}",
            "nul",
            // A container closes with its own bracket only. (What the mutations did: `}` closed
            // an array, `]` an object, such a line read as a row (in a debug build, a panic);
            // review of stop 67, T409 and T410.)
            r#"{"type":"user","a":[1}}"#,
            r#"{"type":"user","a":{"b":1]}"#,
            // A `\u` escape with a digit that is not hex. (What the mutation did: the escape
            // dropped and the line read on, a prompt holding it counted; review of stop 69, T507.)
            r#"{"type":"user","message":{"role":"user","content":"bad \uzzzz escape"}}"#,
            // A key followed by anything but `:` is not JSON. (What the mutation did: any byte
            // taken for the colon, a line with `=` between its keys and values read as a row and
            // counted as a person's turn; review of stop 70, T601.)
            r#"{"type"="user","message"={"role"="user","content"="typed"}}"#,
        ] {
            assert_eq!(
                RowFacts::from_line(bad.as_bytes()),
                Some(LineEnd::Malformed),
                "{bad}"
            );
        }
        assert_eq!(RowFacts::from_line(b"   \r"), None);
        assert_eq!(RowFacts::from_line(b""), None);
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(300), "]".repeat(300));
        assert_eq!(
            RowFacts::from_line(deep.as_bytes()),
            Some(LineEnd::Malformed)
        );
        // Past the depth followed the rest of the line is skipped, whatever it holds: a row
        // opened there is not read. (What the mutation did: the reader went on after finding
        // the line malformed, and a row opened past the depth counted as a turn; review of
        // stop 69, T527.)
        let past = format!(
            r#"{{"a":{}{{"type":"user","message":{{"role":"user","content":"deep"}}}}"#,
            "[".repeat(255)
        );
        assert_eq!(
            RowFacts::from_line(past.as_bytes()),
            Some(LineEnd::Malformed),
            "a row opened past the depth followed"
        );
        let ok = format!("{{\"a\":{}{}}}", "[".repeat(100), "]".repeat(100));
        assert!(matches!(
            RowFacts::from_line(ok.as_bytes()),
            Some(LineEnd::Row(_))
        ));
        // Exactly as deep as the reader follows (256 levels, the row one of them) is read,
        // prompt and all; one level more is malformed. (What the mutation did: 128 levels
        // followed, a row nested deeper, and the prompt in it, skipped; review of stop 67, T412.)
        let nested = |levels: usize| {
            format!(
                r#"{{"type":"user","message":{{"role":"user","content":"deep"}},"a":{}{}}}"#,
                "[".repeat(levels),
                "]".repeat(levels)
            )
        };
        assert_eq!(
            classify(&RowFacts::from_line(nested(255).as_bytes()).unwrap(), &[]),
            Ok(HumanKind::Prompt),
            "a row 256 levels deep"
        );
        assert_eq!(
            RowFacts::from_line(nested(256).as_bytes()),
            Some(LineEnd::Malformed)
        );
        // CRLF line endings and escapes everywhere.
        let line = "{\"ty\\u0070e\":\"user\",\"message\":{\"content\":\"caf\\u00e9 \\ud83d\\ude00 \\\"q\\\"\"}}\r";
        let Some(LineEnd::Row(f)) = RowFacts::from_line(line.as_bytes()) else {
            panic!("a row");
        };
        assert_eq!(f.row_type.as_deref(), Some("user"));
        assert_eq!(f.content.fingerprint(), fingerprint("café 😀 \"q\""));
    }

    #[test]
    fn facts_match_a_full_parse() {
        // The streaming reader agrees with serde_json on every field it reads, on rows with
        // unicode, escapes, nesting and keys in any order.
        let rows = [
            json!({"uuid": "u1", "message": {"content": [{"text": "b  c", "type": "text"}, {"type": "text", "text": "d"}], "role": "user"}, "type": "user"}),
            json!({"type": "user", "message": {"role": "user", "content": ["plain \u{1F600} part", {"type": "text", "text": "x\ty"}]}}),
            json!({"type": "user", "toolUseResult": {"message": {"content": "decoy"}, "type": "assistant"}, "message": {"role": "user", "content": "réal"}}),
            json!({"type": "attachment", "attachment": {"prompt": [{"type": "text", "text": "p"}], "origin": {"kind": "human", "extra": [1, {"kind": "no"}]}, "commandMode": "bash", "type": "queued_command"}}),
        ];
        for row in rows {
            let text = row.to_string();
            let Some(LineEnd::Row(f)) = RowFacts::from_line(text.as_bytes()) else {
                panic!("a row: {text}");
            };
            assert_eq!(f.row_type.as_deref(), row["type"].as_str());
            assert_eq!(f.uuid.as_deref(), row["uuid"].as_str());
            assert_eq!(f.role.as_deref(), row["message"]["role"].as_str());
            let texts: Vec<String> = match &row["message"]["content"] {
                Value::String(s) => vec![s.clone()],
                Value::Array(parts) => parts
                    .iter()
                    .filter_map(|p| p.as_str().or_else(|| p["text"].as_str()))
                    .map(str::to_owned)
                    .collect(),
                _ => Vec::new(),
            };
            assert_eq!(
                f.content.fingerprint(),
                fingerprint(&texts.join(" ")),
                "{text}"
            );
            assert_eq!(
                f.origin_kind.as_deref(),
                row["attachment"]["origin"]["kind"].as_str()
            );
            assert_eq!(
                f.command_mode.as_deref(),
                row["attachment"]["commandMode"].as_str()
            );
        }
    }

    /// A key written twice in one object reads as a full parse reads it: the last value holds
    /// (serde_json, and JavaScript's `JSON.parse`, keep the last). (What the mutation did: the
    /// first `type` or `message.role` was kept, and a row a full parse calls a person's was
    /// skipped as the model's; review of stop 71, TJ17 and TJ18.)
    #[test]
    fn a_key_written_twice_reads_as_its_last_value() {
        let line = r#"{"type":"assistant","message":{"role":"assistant","role":"user","content":"hi there"},"type":"user"}"#;
        let full: Value = serde_json::from_str(line).unwrap();
        assert_eq!(full["type"], "user");
        assert_eq!(full["message"]["role"], "user");
        let Some(LineEnd::Row(f)) = RowFacts::from_line(line.as_bytes()) else {
            panic!("a row: {line}");
        };
        assert_eq!(f.row_type.as_deref(), Some("user"), "the last `type`");
        assert_eq!(f.role.as_deref(), Some("user"), "the last `message.role`");
        assert_eq!(
            classify(&LineEnd::Row(f), &[]),
            Ok(HumanKind::Prompt),
            "the row a full parse reads"
        );
    }

    /// Bug (review): a `uuid` was cut at its first 64 bytes, so two rows whose uuids share them
    /// were named alike and the second burst was taken for the first. A longer uuid is the hash
    /// of its whole (unescaped) value, however the line is cut and resumed; one of 64 bytes is
    /// kept as it is.
    #[test]
    fn a_uuid_longer_than_a_dedupe_id_is_named_by_its_whole_value() {
        use awareness_core::upstream::fnv1a64;
        // The uuid of `line`, the same through every way of cutting it.
        let uuid_of = |line: &str| {
            let whole = RowFacts::from_line(line.as_bytes()).expect("not blank");
            for step in [1, 7, 64, 100] {
                assert_eq!(facts_in_pieces(line, step), whole, "step {step}: {line}");
            }
            let LineEnd::Row(f) = whole else {
                panic!("a row: {line}");
            };
            f.uuid.expect("a uuid")
        };
        let row = |uuid: &str| with(user(json!("hi")), "uuid", json!(uuid)).to_string();
        let hex = |uuid: &str| format!("{:016x}", fnv1a64(uuid.as_bytes()));
        let fits = "u".repeat(MAX_DEDUPE_ID_BYTES);
        assert_eq!(uuid_of(&row(&fits)), fits, "kept as it is");
        let (a, b) = (format!("{fits}a"), format!("{fits}b"));
        assert_eq!(uuid_of(&row(&a)), hex(&a));
        assert_eq!(uuid_of(&row(&b)), hex(&b));
        assert_ne!(uuid_of(&row(&a)), uuid_of(&row(&b)));
        // Sixteen digits, a hash's leading zeros kept, as `human_dedupe_key` writes it. (What
        // the mutation did: written without them; review of stop 65, T340.)
        let zero_led = (0..10_000)
            .map(|i| format!("{fits}{i}"))
            .find(|u| fnv1a64(u.as_bytes()) >> 60 == 0)
            .expect("one hash in 16 has a leading zero nibble");
        assert_eq!(uuid_of(&row(&zero_led)), hex(&zero_led));
        // Hashed as the text it stands for: escapes and characters of several bytes.
        let accented = format!("{}\\u00e9", "u".repeat(MAX_DEDUPE_ID_BYTES - 1));
        let line = format!(
            r#"{{"type":"user","uuid":"{accented}","message":{{"role":"user","content":"hi"}}}}"#
        );
        let decoded = format!("{}é", "u".repeat(MAX_DEDUPE_ID_BYTES - 1));
        assert_eq!(uuid_of(&line), hex(&decoded));
        // A uuid of any size is read in bounded state.
        let huge = "v".repeat(1 << 20);
        let mut s = LineScanner::new();
        for piece in row(&huge).as_bytes().chunks(64 * 1024) {
            assert_eq!(s.feed(piece), None);
            assert!(serde_json::to_string(&s).unwrap().len() < 2048);
        }
        assert_eq!(s.feed(b"\n"), Some(0));
        let LineEnd::Row(f) = s.finish() else {
            panic!("a row");
        };
        assert_eq!(f.uuid, Some(hex(&huge)));
    }

    #[test]
    fn a_huge_line_is_read_in_bounded_state() {
        // A 3 MiB pasted text: classified by streaming, the state never holds the text.
        let big = "log line with some words\n".repeat(3 * 1024 * 1024 / 25);
        let row = user(json!(big.clone()));
        let text = row.to_string();
        assert!(text.len() > 3 * 1024 * 1024);
        let mut s = LineScanner::new();
        for piece in text.as_bytes().chunks(64 * 1024) {
            assert_eq!(s.feed(piece), None);
            assert!(
                serde_json::to_string(&s).unwrap().len() < 2048,
                "the resumable state stays small"
            );
        }
        assert_eq!(s.feed(b"\n"), Some(0));
        let end = s.finish();
        assert_eq!(classify(&end, &[]), Ok(HumanKind::Prompt));
        assert_eq!(
            classify(&end, &own_fingerprints(&[big])),
            Err(SkipReason::SelfEcho),
            "self-echo is detected on the whole text, not on a prefix"
        );
        // A huge tool result is skipped as such, even though its flag comes late.
        let tool = user(
            json!([{"type": "tool_result", "tool_use_id": "t", "content": "x".repeat(3 << 20)}]),
        );
        assert_eq!(verdict(&tool), Err(SkipReason::ToolResult));
        let meta_late = format!(
            "{{\"type\":\"user\",\"message\":{{\"role\":\"user\",\"content\":\"{}\"}},\"isMeta\":true}}",
            "y".repeat(2 << 20)
        );
        assert_eq!(
            classify(&RowFacts::from_line(meta_late.as_bytes()).unwrap(), &[]),
            Err(SkipReason::Meta),
            "a flag after several MB of content still counts"
        );
    }

    /// A row holding a negative number anywhere (an offset, an exit code) is read, not taken for
    /// malformed: a person's prompt beside one is a human turn. (What the mutation did: `-` no
    /// longer began a number, every row holding a negative number was malformed, and the prompt in
    /// it was lost; review of stop 63, T01.)
    #[test]
    fn a_row_holding_a_negative_number_is_read() {
        let row = with(user(json!("typed beside a negative")), "offset", json!(-1));
        assert_eq!(
            verdict(&row),
            Ok(HumanKind::Prompt),
            "a negative number made the row malformed"
        );
        // A number ends at its array's `]` (the ids of the images a person pasted), a literal
        // at a tab as at a space. (What the mutations did: neither ended there, the line was
        // malformed and the person's prompt lost; review of stop 67, T407 and T408.)
        let pasted = with(
            user(json!("see the screenshot")),
            "imagePasteIds",
            json!([1]),
        );
        assert_eq!(
            verdict(&pasted),
            Ok(HumanKind::Prompt),
            "an array ending in a number"
        );
        let tabbed = b"{\"type\":\"user\",\"isMeta\":false\t,\"message\":{\"role\":\"user\",\"content\":\"tabbed\"}}";
        assert_eq!(
            classify(&RowFacts::from_line(tabbed).unwrap(), &[]),
            Ok(HumanKind::Prompt),
            "a tab after a literal"
        );
    }

    /// A queued command of a subagent (`isSidechain`), or in a row marked `isMeta`, is no person's
    /// turn, as every other kind of row says. (What the mutations did: either check left out for
    /// queued commands, such a command was recorded as a human turn; review of stop 63, T02 and
    /// T03.)
    #[test]
    fn a_queued_command_of_a_subagent_or_a_meta_row_is_no_turn() {
        let queued = json!({
            "type": "attachment", "isSidechain": false,
            "attachment": {"type": "queued_command", "commandMode": "prompt",
                "origin": {"kind": "human"}, "prompt": "stop, use the v2 API"},
            "uuid": "aa11aa11-0000-4000-8000-000000000003"
        });
        assert_eq!(verdict(&queued), Ok(HumanKind::Queued));
        assert_eq!(
            verdict(&with(queued.clone(), "isSidechain", json!(true))),
            Err(SkipReason::Sidechain),
            "a subagent's queued command"
        );
        assert_eq!(
            verdict(&with(queued.clone(), "isMeta", json!(true))),
            Err(SkipReason::Meta),
            "a queued command in a meta row"
        );
        // A queued command's own `isMeta` is its own: a row-level `false` written after it
        // does not undo it. (What the mutation did: the later row-level flag overwrote it, and
        // a harness's queued command counted as a person's turn; review of stop 67, T413.)
        let mut own_meta = queued;
        own_meta["attachment"]["isMeta"] = json!(true);
        assert_eq!(
            verdict(&with(own_meta, "isMeta", json!(false))),
            Err(SkipReason::Meta),
            "a queued command's own isMeta"
        );
    }

    /// A queued prompt written as an array is read as `message.content` is: bare string parts are
    /// its text, and its parts are separated as whitespace would be, so that the session's own
    /// prompt queued in two parts is its echo. (What the mutations did: the bare string parts left
    /// out, such a prompt read as empty and was no turn; the parts joined with nothing between
    /// them, the session's own prompt was recorded as a human turn; review of stop 63, T04 and
    /// T11.)
    #[test]
    fn a_queued_prompt_in_parts_is_read_as_content_is() {
        let queued = |prompt: Value| {
            json!({
                "type": "attachment",
                "attachment": {"type": "queued_command", "commandMode": "prompt",
                    "origin": {"kind": "human"}, "prompt": prompt},
                "uuid": "aa11aa11-0000-4000-8000-000000000004"
            })
        };
        assert_eq!(
            verdict(&queued(json!(["stop, use the v2 API"]))),
            Ok(HumanKind::Queued),
            "a bare string part of a queued prompt is its text"
        );
        let own = ["Fix the flaky test in ci.yml".to_owned()];
        assert_eq!(
            verdict_with(
                &queued(json!([{"type": "text", "text": "Fix the flaky test"},
                    {"type": "text", "text": "in ci.yml"}])),
                &own
            ),
            Err(SkipReason::SelfEcho),
            "the parts of a queued prompt are separated as whitespace"
        );
    }

    /// A text part holding only whitespace is nothing typed: the row is empty, as one whose content
    /// is an empty string, and so is a queued prompt made of it. (What the mutations did: such a
    /// part was taken for one that is not text, an image, and the empty row counted as a turn;
    /// review of stop 63, T09, and of a queued prompt, review of stop 65, T324.)
    #[test]
    fn a_text_part_without_text_is_empty() {
        assert_eq!(
            verdict(&user(json!([{"type": "text", "text": "  "}]))),
            Err(SkipReason::Empty),
            "an empty text part counted as a non-text part"
        );
        let queued = json!({
            "type": "attachment",
            "attachment": {"type": "queued_command", "commandMode": "prompt",
                "origin": {"kind": "human"}, "prompt": [{"type": "text", "text": "  "}]},
            "uuid": "aa11aa11-0000-4000-8000-000000000005"
        });
        assert_eq!(
            verdict(&queued),
            Err(SkipReason::Empty),
            "an empty text part of a queued prompt"
        );
    }

    /// A `user` row that names no role is a person's row; only a role other than `user` is skipped.
    /// (What the mutation did: a missing role was taken for another role, and the row skipped;
    /// review of stop 63, T07.)
    #[test]
    fn a_user_row_without_a_role_is_counted() {
        let mut row = user(json!("no role written"));
        row["message"].as_object_mut().unwrap().remove("role");
        assert_eq!(
            verdict(&row),
            Ok(HumanKind::Prompt),
            "a missing role read as another role"
        );
    }

    /// JSON another writer formats otherwise reads alike: whitespace after a literal or a number
    /// before `,` or `}`, a tab between tokens, and the escapes of `/`, a carriage return and a
    /// backspace. (What the mutations did: each made the line malformed, and its prompt was
    /// lost; review of stop 63, T08 and T20, and of stop 65, T304, T315 and T316.)
    #[test]
    fn json_another_writer_formats_otherwise_reads_alike() {
        let tabbed =
            b"{\"type\":\"user\",\t\"message\":{\"role\":\"user\",\t\"content\":\"tabbed\"}}";
        assert_eq!(
            classify(&RowFacts::from_line(tabbed).unwrap(), &[]),
            Ok(HumanKind::Prompt),
            "a tab between tokens"
        );
        assert_eq!(
            verdict(&user(json!("pasted from a windows editor\r\nsecond line"))),
            Ok(HumanKind::Prompt),
            "an escaped carriage return"
        );
        assert_eq!(
            verdict(&user(json!("a stray backspace\u{8} in the prompt"))),
            Ok(HumanKind::Prompt),
            "an escaped backspace"
        );
        let spaced = br#"{ "type": "user", "isSidechain": false , "message": { "role": "user", "content": "spaced" }, "n": 1 }"#;
        assert_eq!(
            classify(&RowFacts::from_line(spaced).unwrap(), &[]),
            Ok(HumanKind::Prompt),
            "whitespace after a literal"
        );
        // A carriage return is whitespace after a literal too. (What the mutation did: `\r` not
        // ending a literal, the row read as malformed and the person's turn lost; review of
        // stop 70, T613.)
        let cr = b"{\"type\":\"user\",\"isSidechain\":false\r,\"message\":{\"role\":\"user\",\"content\":\"typed\"}}";
        assert_eq!(
            classify(&RowFacts::from_line(cr).unwrap(), &[]),
            Ok(HumanKind::Prompt),
            "a carriage return after a literal"
        );
        let slash = br#"{"type":"user","message":{"role":"user","content":"see src\/main.rs"}}"#;
        assert_eq!(
            classify(&RowFacts::from_line(slash).unwrap(), &[]),
            Ok(HumanKind::Prompt),
            "an escaped slash"
        );
    }

    /// A `]` where a value is due (after `[1,`, after a key's `:`) is not JSON: the line is
    /// malformed, and the reader closes no object with it. (What the mutation did: `]` taken
    /// wherever a value is due, `[1,]` was read as a row; review of stop 63, T26.)
    #[test]
    fn a_bracket_where_a_value_is_due_is_malformed() {
        for bad in [r#"{"type":"user","a":[1,]}"#, r#"{"type":"user","a":]}"#] {
            assert_eq!(
                RowFacts::from_line(bad.as_bytes()),
                Some(LineEnd::Malformed),
                "{bad}"
            );
        }
    }

    /// A stored scanner state whose token belongs inside a container it does not have (a value or
    /// its end at the top, an object's key inside an array) is not sound: read on, a `]` or `}`
    /// would close a container that is not open. (What the mutations did: either state taken for
    /// sound, a hand-edited marker would have been read on from it; review of stop 63, T24 and
    /// T29.)
    #[test]
    fn a_token_outside_its_container_is_not_sound() {
        let mut inside = LineScanner::new();
        assert_eq!(inside.feed(br#"{"a":[1"#), None);
        assert!(inside.is_sound());
        let edited = |tok: Value, kinds: &str, path: Value| {
            sound_after(&inside, &|v| {
                v["tok"] = tok.clone();
                v["kinds"] = json!(kinds);
                v["path"] = path.clone();
            })
        };
        assert!(
            !edited(json!("After"), "", json!([])),
            "a value's end at the top"
        );
        assert!(
            !edited(json!("Value"), "", json!([])),
            "a value due at the top"
        );
        assert!(
            !edited(json!("ObjectFirst"), "oa", json!([{"Obj": null}, "Item"])),
            "an object's first key inside an array"
        );
        // And an array's first value inside an object. (What the mutation did: taken for
        // sound; review of stop 65, T341.)
        let mut in_object = LineScanner::new();
        assert_eq!(in_object.feed(br#"{"a":1"#), None);
        assert!(
            !sound_after(&in_object, &|v| v["tok"] = json!("ArrayFirst")),
            "an array's first value inside an object"
        );
    }

    /// A prompt holding a backslash (a Windows path, a regular expression) or a form feed is
    /// read as written, so that the session's own such prompt is its echo. (What the mutations
    /// did: the escapes `\\` and `\f` made the line malformed, and the person's prompt was lost;
    /// review of stop 67, T414 and T415.)
    #[test]
    fn a_backslash_or_a_form_feed_in_a_prompt_is_read() {
        let path = "open C:\\Users\\me\\notes.txt and fix \\d+";
        assert_eq!(
            verdict(&user(json!(path))),
            Ok(HumanKind::Prompt),
            "an escaped backslash"
        );
        assert_eq!(
            verdict_with(&user(json!(path)), &[path.to_owned()]),
            Err(SkipReason::SelfEcho),
            "an escaped backslash read as itself"
        );
        assert_eq!(
            verdict(&user(json!("page one\u{c}page two"))),
            Ok(HumanKind::Prompt),
            "an escaped form feed"
        );
    }

    /// Characters at the ends of their encodings read as themselves: a 2-byte character led by
    /// 0xDF, a 4-byte one led by 0xF4, an escaped pair whose low half is `\udfff` (a dark skin
    /// tone); a byte that is not UTF-8 and a lone surrogate are each one U+FFFD, and a pair after
    /// a lone high surrogate is kept. (What the mutations did: each read otherwise, the
    /// session's own prompt holding such a character was recorded as a human turn, and a prompt
    /// of one byte not UTF-8 read as empty and lost; review of stop 67, T416 to T420, T432.)
    #[test]
    fn characters_at_the_ends_of_their_encodings_read_as_themselves() {
        let edges = "\u{7ff} and \u{10fffd}";
        assert_eq!(
            verdict_with(&user(json!(edges)), &[edges.to_owned()]),
            Err(SkipReason::SelfEcho),
            "lead bytes 0xDF and 0xF4"
        );
        let toned = br#"{"type":"user","message":{"role":"user","content":"thanks \ud83d\udc4d\ud83c\udfff"}}"#;
        assert_eq!(
            classify(
                &RowFacts::from_line(toned).unwrap(),
                &own_fingerprints(&["thanks \u{1f44d}\u{1f3ff}".to_owned()])
            ),
            Err(SkipReason::SelfEcho),
            "an escaped pair with low half \\udfff"
        );
        let content = |line: &[u8]| {
            let Some(LineEnd::Row(f)) = RowFacts::from_line(line) else {
                panic!("a row");
            };
            f.content.fingerprint()
        };
        assert_eq!(
            content(br#"{"message":{"content":"\ud83d\ud83d\ude00 \ude00"}}"#),
            fingerprint("\u{fffd}\u{1f600} \u{fffd}"),
            "lone surrogates"
        );
        let not_utf8 = b"{\"type\":\"user\",\"message\":{\"role\":\"user\",\"content\":\"\xff\"}}";
        assert_eq!(content(not_utf8), fingerprint("\u{fffd}"));
        assert_eq!(
            classify(&RowFacts::from_line(not_utf8).unwrap(), &[]),
            Ok(HumanKind::Prompt),
            "a byte that is not UTF-8 is not nothing"
        );
        // A lone high surrogate is one U+FFFD where it stands, at a string's end, before an
        // escape, and in a field no rule reads: it never spills into the next string (the
        // row's `type` read after it). (What the mutations did: it was left pending at a
        // string's end, kept pending after its U+FFFD, put after an escaped character, or
        // taken from an ignored field; each put a U+FFFD into a later string, the row's `type`
        // was not `user` and the person's turn lost, or the text read otherwise; review of
        // stop 69, T508, T517, T525 and T528.)
        let cut = br#"{"message":{"role":"user","content":"cut \ud83d"},"type":"user"}"#;
        assert_eq!(
            content(cut),
            fingerprint("cut \u{fffd}"),
            "at a string's end"
        );
        assert_eq!(
            classify(&RowFacts::from_line(cut).unwrap(), &[]),
            Ok(HumanKind::Prompt),
            "a text cut after a high surrogate"
        );
        assert_eq!(
            content(br#"{"message":{"content":"\ud83d\"q"}}"#),
            fingerprint("\u{fffd}\"q"),
            "before an escape"
        );
        let ignored =
            br#"{"cwd":"x\ud83d","type":"user","message":{"role":"user","content":"hi"}}"#;
        assert_eq!(
            classify(&RowFacts::from_line(ignored).unwrap(), &[]),
            Ok(HumanKind::Prompt),
            "in a field no rule reads"
        );
        // Bytes that are not UTF-8 read as `String::from_utf8_lossy` reads them: a stray
        // continuation byte is a U+FFFD of its own, and a character cut short by an ASCII
        // byte is one before it. (What the mutations did: a byte that cannot lead a character
        // waited for one more, or an ASCII byte went out before the cut character's U+FFFD;
        // review of stop 69, T509 and T526.)
        for bytes in [&b"\xff\x80"[..], b"\xe2\x82a", b"a\xc3b\xa9"] {
            let mut line = b"{\"message\":{\"content\":\"".to_vec();
            line.extend_from_slice(bytes);
            line.extend_from_slice(b"\"}}");
            assert_eq!(
                content(&line),
                fingerprint(&String::from_utf8_lossy(bytes)),
                "{bytes:?}"
            );
        }
    }

    /// A lone high surrogate is one U+FFFD where it stands: the text after it reads after it,
    /// and a low half escaped later does not pair with it across that text; one in a key is
    /// part of the key, not of the row's text. (What the mutations did: the pending high half
    /// not flushed before a plain character, `\ud83dx\ude00` read as `x😀`; flushed as a value's
    /// character, a key in a content part gave the row a text, and a row with none counted as
    /// a person's turn; review of stop 70, T604 and T605.)
    #[test]
    fn a_lone_high_surrogate_stays_where_it_stands() {
        let line = br#"{"type":"user","message":{"role":"user","content":"\ud83dx\ude00"}}"#;
        let Some(LineEnd::Row(f)) = RowFacts::from_line(line) else {
            panic!("a row");
        };
        assert_eq!(
            f.content.fingerprint(),
            fingerprint("\u{fffd}x\u{fffd}"),
            "a lone high surrogate before a plain character"
        );
        let keyed = br#"{"type":"user","message":{"role":"user","content":[{"\ud800x":1}]}}"#;
        assert_eq!(
            classify(&RowFacts::from_line(keyed).unwrap(), &[]),
            Err(SkipReason::Empty),
            "a lone high surrogate in a key is no text"
        );
    }

    /// The session's own text is its echo even when it is a slash command, in a `user` row and
    /// in a `system` row alike (self-echo comes before the slash command rule). (What the
    /// mutations did: a slash command checked before self-echo, or a `system` row's text not
    /// checked against the own prompts, the gateway's own command was recorded as a human turn;
    /// review of stop 67, T425 and T429.)
    #[test]
    fn the_sessions_own_slash_command_is_its_echo() {
        let command =
            "<command-name>/compact</command-name>\n<command-message>compact</command-message>";
        let own = [command.to_owned()];
        assert_eq!(
            verdict_with(&user(json!(command)), &own),
            Err(SkipReason::SelfEcho),
            "in a user row"
        );
        let system = json!({"type": "system", "subtype": "local_command", "content": command,
            "isMeta": false, "uuid": "c1d2e3f4-a5b6-4c7d-8e9f-0a1b2c3d4e5f"});
        assert_eq!(verdict(&system), Ok(HumanKind::SlashCommand));
        assert_eq!(
            verdict_with(&system, &own),
            Err(SkipReason::SelfEcho),
            "in a system row"
        );
    }

    /// A message of only a pasted document (a part that is not text, as an image) is a human
    /// turn, in a `user` row and in a queued prompt alike. (What the mutations did: only an
    /// image counted as a part that is not text, and a pasted document alone was lost as empty;
    /// review of stop 67, T435 and T436.)
    #[test]
    fn a_pasted_document_alone_is_a_human_turn() {
        let document = json!([{"type": "document", "source": {"type": "base64",
            "media_type": "application/pdf", "data": "JVBERi0xLjQ="}}]);
        assert_eq!(verdict(&user(document.clone())), Ok(HumanKind::Prompt));
        let queued = json!({
            "type": "attachment",
            "attachment": {"type": "queued_command", "commandMode": "prompt",
                "origin": {"kind": "human"}, "prompt": document},
            "uuid": "aa11aa11-0000-4000-8000-000000000006"
        });
        assert_eq!(verdict(&queued), Ok(HumanKind::Queued));
    }
}
