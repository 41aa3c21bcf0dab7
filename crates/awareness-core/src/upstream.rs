//! Upstream links of adopted sessions (DESIGN.md section 8): the link model, the rules every
//! backend applies when it writes one, the dedupe keys of what the upstream monitor records, the
//! self-echo normalization, and the [`UpstreamStore`] trait.
//!
//! A session adopted from a catalog of external agent threads (a local Claude Code transcript, a
//! thread on a paired node) keeps one link per ref `(session key, agent)`. The monitor in
//! `gateway-adapter` reads the upstream source forward from the link's **marker** and records
//! human activity typed straight into it. The rules here are pure and decided once:
//!
//! - [`plan_upsert`]: adopting again from the **same source** (same catalog, host, thread, kind
//!   and reference) keeps the marker and does not touch `updated_at`; a **changed source**
//!   replaces the marker with the given one (a *rebase*) and moves `updated_at`;
//! - [`plan_set_marker`]: marker updates are compare-and-set on `updated_at`, which every change
//!   moves strictly forward ([`next_updated_at`]), so a scan that started before a change can
//!   never overwrite it;
//! - [`human_dedupe_key`]: `upstream:<sessionKey>:<16 hex of the source hash>:<dedupeId>`;
//! - [`NormalizedText`]: trim and collapse whitespace (streaming, so a line of several MB is
//!   compared without being held), for self-echo detection.
//!
//! ```
//! use awareness_core::upstream::{self, LinkSpec};
//! use awareness_core::{SessionRef, Timestamp};
//! use serde_json::json;
//!
//! let session = SessionRef::parse("agent:main:main", "main")?;
//! let spec = LinkSpec::new(session, "claude-code", "local", "3f2a", "local-jsonl")
//!     .with_ref(json!({"path": "/home/me/.claude/projects/x/3f2a.jsonl"}))
//!     .with_marker(json!({"offset": 120}));
//! let first = upstream::plan_upsert(None, spec.clone(), Timestamp(1_000))?;
//! assert!(first.outcome.created);
//! // The same source again keeps the marker the monitor has advanced meanwhile.
//! let advanced = upstream::plan_set_marker(&first.outcome.link, Timestamp(1_000),
//!     json!({"offset": 900}), Timestamp(2_000)).unwrap();
//! let again = upstream::plan_upsert(Some(&advanced), spec, Timestamp(3_000))?;
//! assert!(!again.write && !again.outcome.rebased);
//! assert_eq!(again.outcome.link.marker, Some(json!({"offset": 900})));
//! # Ok::<(), awareness_core::ValidationError>(())
//! ```

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::StoreError;
use crate::model::{SessionRef, Timestamp};
use crate::store::AwarenessStore;
use crate::validate::{self, ValidationError};

/// How many of a session's most recent own prompts count for self-echo detection.
pub const SELF_ECHO_WINDOW: usize = 10;

/// Largest upstream reference or marker, in bytes of compact JSON.
pub const MAX_UPSTREAM_JSON_BYTES: usize = 16 * 1024;

/// Consecutive checks that must find the source gone before `upstream_missing` is recorded and
/// the link removed.
pub const MISSING_CHECKS: u32 = 3;

/// Longest `dedupeId` kept verbatim in a dedupe key; a longer one is replaced by its 16-hex hash
/// so the key stays within [`validate::MAX_DEDUPE_KEY_BYTES`] whatever the session key.
pub const MAX_DEDUPE_ID_BYTES: usize = 64;

/// The link of an adopted session to its upstream source, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamLink {
    /// The adopted session.
    pub session: SessionRef,
    /// The catalog the session was adopted from (`claude-code`, ...); the channel of its events.
    pub catalog_id: String,
    /// The host holding the thread (`local`, a paired node's id).
    pub host_id: String,
    /// The external thread.
    pub thread_id: String,
    /// Which provider reads the source (`local-jsonl`, `paired-node`).
    pub upstream_kind: String,
    /// Where the provider finds the source (a file path, ...), as the provider defines it.
    /// JSON `null` is a value like any other (`Some(Value::Null)`), kept apart from no
    /// reference (`None`, the field left out).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub upstream_ref: Option<Value>,
    /// How far the source has been read, as the provider defines it; `null` is kept apart
    /// from no marker, as for [`UpstreamLink::upstream_ref`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub marker: Option<Value>,
    /// When the monitor last scanned the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scanned_at: Option<Timestamp>,
    /// When the link was first created.
    pub created_at: Timestamp,
    /// When the source or the marker last changed; compare-and-set token of marker updates.
    pub updated_at: Timestamp,
}

/// Reads a JSON value that is present as `Some`, `null` included (serde's `Option` would read
/// `null` as `None`); an absent field is `None` through `default`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

impl UpstreamLink {
    /// Whether `spec` names the same source as this link (catalog, host, thread, kind, ref).
    pub fn same_source(&self, spec: &LinkSpec) -> bool {
        self.catalog_id == spec.catalog_id
            && self.host_id == spec.host_id
            && self.thread_id == spec.thread_id
            && self.upstream_kind == spec.upstream_kind
            && self.upstream_ref == spec.upstream_ref
    }
}

/// What an adoption asks for: the session, its source and the marker to start from.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkSpec {
    /// The adopted session.
    pub session: SessionRef,
    /// The catalog (`claude-code`, ...).
    pub catalog_id: String,
    /// The host (`local`, ...).
    pub host_id: String,
    /// The external thread.
    pub thread_id: String,
    /// The provider kind (`local-jsonl`, `paired-node`).
    pub upstream_kind: String,
    /// Where the provider finds the source.
    pub upstream_ref: Option<Value>,
    /// The marker to start from when the link is new or its source changed.
    pub marker: Option<Value>,
}

impl LinkSpec {
    /// A spec without reference or marker.
    pub fn new(
        session: SessionRef,
        catalog_id: impl Into<String>,
        host_id: impl Into<String>,
        thread_id: impl Into<String>,
        upstream_kind: impl Into<String>,
    ) -> Self {
        Self {
            session,
            catalog_id: catalog_id.into(),
            host_id: host_id.into(),
            thread_id: thread_id.into(),
            upstream_kind: upstream_kind.into(),
            upstream_ref: None,
            marker: None,
        }
    }

    /// Sets the upstream reference.
    #[must_use]
    pub fn with_ref(mut self, upstream_ref: Value) -> Self {
        self.upstream_ref = Some(upstream_ref);
        self
    }

    /// Sets the starting marker.
    #[must_use]
    pub fn with_marker(mut self, marker: Value) -> Self {
        self.marker = Some(marker);
        self
    }

    /// The ids are non-empty keys (at most 1 KiB, no control characters); the reference and the
    /// marker are at most [`MAX_UPSTREAM_JSON_BYTES`] of JSON each. The catalog id must also fit
    /// every event summary built from it ([`CATALOG_SUMMARY_PREFIXES`]): at most
    /// [`MAX_CATALOG_ID_CHARS`] characters, without U+2028 or U+2029. Otherwise the link would
    /// be stored while its `adopted`, `human_direct_message` and `upstream_missing` events were
    /// refused, every tick again.
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate::key("catalog id", &self.catalog_id)?;
        validate_catalog_summaries(&self.catalog_id)?;
        validate::key("host id", &self.host_id)?;
        validate::key("thread id", &self.thread_id)?;
        validate::key("upstream kind", &self.upstream_kind)?;
        validate_json("upstream ref", self.upstream_ref.as_ref())?;
        validate_json("marker", self.marker.as_ref())
    }
}

/// The prefixes of the event summaries `gateway-adapter` builds from a link's catalog id:
/// `adopted from <catalogId>` (`Awareness::adopted`), `human message via <catalogId>`
/// (`Awareness::human_message`, the catalog id being the channel of the monitor's human turns;
/// it is trimmed there, which only shortens it) and `upstream missing via <catalogId>` (the
/// monitor). No other [`LinkSpec`] field is built into a summary.
///
/// The adapter builds its summaries from these constants: a summary built from a link's
/// catalog id with a new prefix must add it here, or [`LinkSpec::validate`] accepts catalog
/// ids whose events every store refuses.
pub const CATALOG_SUMMARY_PREFIXES: [&str; 3] =
    [ADOPTED_FROM, HUMAN_MESSAGE_VIA, UPSTREAM_MISSING_VIA];

/// The summary of an `adopted` event starts with this, then the catalog id.
pub const ADOPTED_FROM: &str = "adopted from ";
/// The summary of a human turn the monitor found upstream starts with this, then the channel
/// (the link's catalog id).
pub const HUMAN_MESSAGE_VIA: &str = "human message via ";
/// The summary of an `upstream_missing` event starts with this, then the catalog id.
pub const UPSTREAM_MISSING_VIA: &str = "upstream missing via ";
/// What these summaries say for a blank channel or catalog id.
pub const UNKNOWN_CHANNEL: &str = "unknown";

/// Longest catalog id, in characters, that fits every summary of [`CATALOG_SUMMARY_PREFIXES`]
/// (the prefixes are ASCII, so their byte length is their length in characters).
pub const MAX_CATALOG_ID_CHARS: usize = validate::MAX_SUMMARY_CHARS - longest_prefix();

const fn longest_prefix() -> usize {
    let mut longest = 0;
    let mut i = 0;
    while i < CATALOG_SUMMARY_PREFIXES.len() {
        if CATALOG_SUMMARY_PREFIXES[i].len() > longest {
            longest = CATALOG_SUMMARY_PREFIXES[i].len();
        }
        i += 1;
    }
    longest
}

/// What the errors of [`validate_catalog_summaries`] name.
const CATALOG_IN_SUMMARIES: &str = "catalog id (quoted in one-line event summaries)";

/// Refuses a catalog id that would make one of the summaries of [`CATALOG_SUMMARY_PREFIXES`]
/// invalid ([`validate::summary`]), as an error naming the catalog id: too long is
/// [`ValidationError::CatalogIdTooLong`] (in characters, as summaries are measured), a line
/// break (U+2028, U+2029) is [`ValidationError::ControlCharacter`].
fn validate_catalog_summaries(catalog_id: &str) -> Result<(), ValidationError> {
    for prefix in CATALOG_SUMMARY_PREFIXES {
        validate::summary(&format!("{prefix}{catalog_id}")).map_err(|e| match e {
            ValidationError::SummaryTooLong { .. } => ValidationError::CatalogIdTooLong {
                chars: catalog_id.chars().count(),
                max: MAX_CATALOG_ID_CHARS,
            },
            ValidationError::SummaryNotOneLine => {
                let (at, found) = catalog_id
                    .char_indices()
                    .find(|&(_, c)| validate::breaks_summary(c))
                    .unwrap_or((0, '\u{fffd}'));
                ValidationError::ControlCharacter {
                    what: CATALOG_IN_SUMMARIES,
                    found,
                    at,
                }
            }
            // Blank cannot happen behind a non-blank prefix.
            other => other,
        })?;
    }
    Ok(())
}

/// Refuses a reference or marker larger than [`MAX_UPSTREAM_JSON_BYTES`] or nested deeper than
/// [`crate::validate::MAX_JSON_DEPTH`].
pub fn validate_json(what: &'static str, value: Option<&Value>) -> Result<(), ValidationError> {
    let Some(v) = value else { return Ok(()) };
    crate::validate::within_depth(what, crate::validate::json_depth(v))?;
    let bytes = serde_json::to_string(v).map_or(usize::MAX, |s| s.len());
    if bytes > MAX_UPSTREAM_JSON_BYTES {
        return Err(ValidationError::UpstreamJsonTooLarge { what, bytes });
    }
    Ok(())
}

/// The result of adopting a session.
#[derive(Debug, Clone, PartialEq)]
pub struct UpsertOutcome {
    /// The link in effect afterwards.
    pub link: UpstreamLink,
    /// No link existed for the ref.
    pub created: bool,
    /// A link existed with another source: its marker was replaced by the given one.
    pub rebased: bool,
}

/// What a backend does for [`UpstreamStore::upsert_link`].
#[derive(Debug, Clone, PartialEq)]
pub struct UpsertPlan {
    /// What the call returns.
    pub outcome: UpsertOutcome,
    /// Whether `outcome.link` must be written (false for a same-source refresh).
    pub write: bool,
}

/// The `updated_at` after a change: `now`, but always strictly after `previous`, so that a
/// compare-and-set token never repeats even when two changes share a millisecond.
pub fn next_updated_at(previous: Timestamp, now: Timestamp) -> Timestamp {
    now.max(previous.plus_ms(1))
}

/// Decides an adoption. A new ref gets a link with the spec's marker. An existing link with the
/// same source is kept exactly as it is (marker, `updated_at`, everything): a refresh never
/// breaks a marker update in flight. A changed source replaces the source and the marker (a
/// rebase) and moves `updated_at` with [`next_updated_at`]; `created_at` stays.
pub fn plan_upsert(
    existing: Option<&UpstreamLink>,
    spec: LinkSpec,
    now: Timestamp,
) -> Result<UpsertPlan, ValidationError> {
    spec.validate()?;
    let Some(old) = existing else {
        let link = UpstreamLink {
            session: spec.session,
            catalog_id: spec.catalog_id,
            host_id: spec.host_id,
            thread_id: spec.thread_id,
            upstream_kind: spec.upstream_kind,
            upstream_ref: spec.upstream_ref,
            marker: spec.marker,
            last_scanned_at: None,
            created_at: now,
            updated_at: now,
        };
        return Ok(UpsertPlan {
            outcome: UpsertOutcome {
                link,
                created: true,
                rebased: false,
            },
            write: true,
        });
    };
    if old.same_source(&spec) {
        return Ok(UpsertPlan {
            outcome: UpsertOutcome {
                link: old.clone(),
                created: false,
                rebased: false,
            },
            write: false,
        });
    }
    let link = UpstreamLink {
        session: old.session.clone(),
        catalog_id: spec.catalog_id,
        host_id: spec.host_id,
        thread_id: spec.thread_id,
        upstream_kind: spec.upstream_kind,
        upstream_ref: spec.upstream_ref,
        marker: spec.marker,
        last_scanned_at: old.last_scanned_at,
        created_at: old.created_at,
        updated_at: next_updated_at(old.updated_at, now),
    };
    Ok(UpsertPlan {
        outcome: UpsertOutcome {
            link,
            created: false,
            rebased: true,
        },
        write: true,
    })
}

/// Compare-and-set of a marker: the updated link when `link.updated_at == expected`, else `None`
/// (the link changed since the caller read it). The new `updated_at` is
/// [`next_updated_at`]`(expected, now)`.
pub fn plan_set_marker(
    link: &UpstreamLink,
    expected: Timestamp,
    marker: Value,
    now: Timestamp,
) -> Option<UpstreamLink> {
    if link.updated_at != expected {
        return None;
    }
    let mut next = link.clone();
    next.marker = Some(marker);
    next.updated_at = next_updated_at(expected, now);
    Some(next)
}

/// Whether [`UpstreamStore::remove_link`] with `expected` removes `link`.
pub fn may_remove(link: &UpstreamLink, expected: Option<Timestamp>) -> bool {
    expected.is_none_or(|t| t == link.updated_at)
}

/// The link an adoption decides over ([`plan_upsert`]), from the row a store `found` for the
/// ref: a row it cannot read (decision 0017) counts as none and is written over; its error
/// comes back beside, for the store to log.
pub fn adopting_over(
    found: Option<Result<UpstreamLink, StoreError>>,
) -> (Option<UpstreamLink>, Option<StoreError>) {
    match found {
        None => (None, None),
        Some(Ok(link)) => (Some(link), None),
        Some(Err(e)) => (None, Some(e)),
    }
}

/// Whether [`UpstreamStore::remove_link`] with `expected` removes the row a store `found` for
/// the ref: none, a link ([`may_remove`]), or a row it cannot read (decision 0017), which goes
/// without a token and fails the call, with the row's own error, with one (there is nothing to
/// compare the token with).
pub fn may_remove_found(
    found: Option<Result<UpstreamLink, StoreError>>,
    expected: Option<Timestamp>,
) -> Result<bool, StoreError> {
    match found {
        None => Ok(false),
        Some(Ok(link)) => Ok(may_remove(&link, expected)),
        Some(Err(e)) if expected.is_some() => Err(e),
        Some(Err(_)) => Ok(true),
    }
}

/// A `u64` in JSON that a reader of numbers as doubles (JavaScript: another reader of a link's
/// marker, which may write it back) keeps exactly: a number below 2^53, the string of its
/// decimal digits from 2^53 on. Read back from either form, so that what was stored as a
/// number before keeps reading. For `#[serde(with = "awareness_core::upstream::exact_u64")]`.
///
/// ```
/// #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
/// struct Marker {
///     #[serde(with = "awareness_core::upstream::exact_u64")]
///     ino: u64,
/// }
/// let big = Marker { ino: u64::MAX };
/// let json = serde_json::to_value(&big)?;
/// assert_eq!(json, serde_json::json!({"ino": "18446744073709551615"}));
/// assert_eq!(serde_json::from_value::<Marker>(json)?, big);
/// assert_eq!(serde_json::to_value(Marker { ino: 42 })?, serde_json::json!({"ino": 42}));
/// assert_eq!(serde_json::from_value::<Marker>(serde_json::json!({"ino": 42}))?.ino, 42);
/// # Ok::<(), serde_json::Error>(())
/// ```
pub mod exact_u64 {
    use std::fmt;

    use serde::{Deserializer, Serializer, de};

    /// 2^53, the first integer a double cannot tell from its neighbour (2^53 + 1 reads as it).
    pub const FIRST_INEXACT: u64 = 1 << 53;

    /// Writes `n` as a number below [`FIRST_INEXACT`], as a string of decimal digits from it on.
    pub fn serialize<S: Serializer>(n: &u64, s: S) -> Result<S::Ok, S::Error> {
        if *n < FIRST_INEXACT {
            s.serialize_u64(*n)
        } else {
            s.collect_str(n)
        }
    }

    /// Reads a non-negative integer written as a number or as a string of decimal digits.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        d.deserialize_any(Exact)
    }

    struct Exact;

    impl de::Visitor<'_> for Exact {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an integer from 0 to 2^64 - 1, as a number or a string of decimal digits")
        }

        fn visit_u64<E: de::Error>(self, n: u64) -> Result<u64, E> {
            Ok(n)
        }

        fn visit_i64<E: de::Error>(self, n: i64) -> Result<u64, E> {
            u64::try_from(n).map_err(|_| E::invalid_value(de::Unexpected::Signed(n), &self))
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<u64, E> {
            // Digits only: no sign, no space (which `parse` would refuse too, but a `+` it
            // would take).
            text.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| text.parse().ok())
                .flatten()
                .ok_or_else(|| E::invalid_value(de::Unexpected::Str(text), &self))
        }
    }
}

/// 64-bit FNV-1a, streaming. Stable across platforms and releases (it is part of dedupe keys).
/// In JSON (a resumable reader's state, in a marker) it is an [`exact_u64`]: a hash is almost
/// always above 2^53.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fnv64(#[serde(with = "exact_u64")] u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Self::new()
    }
}

impl Fnv64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    /// The empty hash.
    pub const fn new() -> Self {
        Self(Self::OFFSET)
    }

    /// Feeds bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    /// The hash so far.
    pub const fn finish(self) -> u64 {
        self.0
    }
}

/// FNV-1a 64 of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h = Fnv64::new();
    h.write(bytes);
    h.finish()
}

/// The source hash of a link and the provider's source id: FNV-1a 64 over, for each of agent
/// id, catalog id, host id, thread id, upstream kind and source id, its UTF-8 length as 8
/// little-endian bytes followed by its bytes. The agent is part of the source identity so that
/// two agents adopting one external thread under the same bare key (`global`) are each
/// recorded.
pub fn source_hash(link: &UpstreamLink, source_id: &str) -> u64 {
    let mut h = Fnv64::new();
    for part in [
        link.session.agent_id.as_str(),
        &link.catalog_id,
        &link.host_id,
        &link.thread_id,
        &link.upstream_kind,
        source_id,
    ] {
        h.write(&(part.len() as u64).to_le_bytes());
        h.write(part.as_bytes());
    }
    h.finish()
}

/// The dedupe key of a burst of human turns (DESIGN.md section 8):
/// `upstream:<sessionKey>:<16 lowercase hex of source_hash>:<dedupeId>`. A `dedupe_id` longer
/// than [`MAX_DEDUPE_ID_BYTES`] is replaced by the 16 hex of its FNV-1a 64.
pub fn human_dedupe_key(link: &UpstreamLink, source_id: &str, dedupe_id: &str) -> String {
    let id = if dedupe_id.len() > MAX_DEDUPE_ID_BYTES {
        format!("{:016x}", fnv1a64(dedupe_id.as_bytes()))
    } else {
        dedupe_id.to_owned()
    };
    format!(
        "upstream:{}:{:016x}:{id}",
        link.session.session_key,
        source_hash(link, source_id)
    )
}

/// The dedupe key of the `upstream_missing` event of one link incarnation (DESIGN.md leaves it
/// open): `upstream-missing:<sessionKey>:<16 hex of the source hash>:<updatedAt>`, so a retry
/// after a failed removal (the link unchanged) records nothing twice, while a link adopted
/// again meanwhile, at another path of the same thread id (its `createdAt` kept, its
/// `updatedAt` moved), or a fresh link of the same source, records its own.
pub fn missing_dedupe_key(link: &UpstreamLink) -> String {
    format!(
        "upstream-missing:{}:{:016x}:{}",
        link.session.session_key,
        source_hash(link, ""),
        link.updated_at
    )
}

/// The normalized form used for self-echo: trimmed, every run of whitespace one space.
pub fn normalize_text(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A text's identity after normalization: its FNV-1a 64 and its length in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct TextFingerprint {
    /// FNV-1a 64 of the normalized text's UTF-8.
    pub hash: u64,
    /// Characters of the normalized text.
    pub chars: u64,
}

/// The fingerprint of `text` after [`normalize_text`].
pub fn fingerprint(text: &str) -> TextFingerprint {
    let mut n = NormalizedText::new(0);
    n.push_str(text);
    n.fingerprint()
}

/// The fingerprints of a session's own recent prompts (oldest first): the last
/// [`SELF_ECHO_WINDOW`] of them. Not for what an upstream monitor hands a provider, which may
/// hold the prompts of several sessions linked to one thread, each windowed already: use
/// [`fingerprints`] there, as the providers of gateway-adapter do.
pub fn own_fingerprints(own_recent: &[String]) -> Vec<TextFingerprint> {
    let skip = own_recent.len().saturating_sub(SELF_ECHO_WINDOW);
    fingerprints(&own_recent[skip..])
}

/// The fingerprints of every text given: own prompts windowed already, as an upstream
/// monitor gives them for a source several sessions share (each session's last
/// [`SELF_ECHO_WINDOW`]).
pub fn fingerprints(texts: &[String]) -> Vec<TextFingerprint> {
    texts.iter().map(|t| fingerprint(t)).collect()
}

/// Streaming [`normalize_text`]: characters go in one at a time, the fingerprint and the first
/// `prefix_cap` normalized characters come out, in constant memory. Serializable, so a scan can
/// stop in the middle of a text and resume later.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NormalizedText {
    hash: Fnv64,
    chars: u64,
    /// Whitespace was seen after some text; it becomes one space if more text follows.
    pending_space: bool,
    prefix: String,
    prefix_cap: usize,
}

impl NormalizedText {
    /// An empty text keeping the first `prefix_cap` normalized characters.
    pub fn new(prefix_cap: usize) -> Self {
        Self {
            prefix_cap,
            ..Self::default()
        }
    }

    /// Feeds one character.
    pub fn push(&mut self, c: char) {
        if c.is_whitespace() {
            self.pending_space = self.chars > 0;
            return;
        }
        if self.pending_space {
            self.pending_space = false;
            self.emit(' ');
        }
        self.emit(c);
    }

    /// Feeds a string.
    pub fn push_str(&mut self, s: &str) {
        for c in s.chars() {
            self.push(c);
        }
    }

    /// Separates two parts of one text (as whitespace would).
    pub fn separate(&mut self) {
        self.push(' ');
    }

    fn emit(&mut self, c: char) {
        let mut buf = [0u8; 4];
        self.hash.write(c.encode_utf8(&mut buf).as_bytes());
        // Saturating: a count [`is_sound`](Self::is_sound) accepts never gets near the end of
        // `u64`, but a stored one it was not asked about must not panic or wrap to empty.
        self.chars = self.chars.saturating_add(1);
        // The prefix holds the first `min(chars, prefix_cap)` characters.
        if self.chars <= self.prefix_cap as u64 {
            self.prefix.push(c);
        }
    }

    /// Whether no non-whitespace character was fed.
    pub fn is_empty(&self) -> bool {
        self.chars == 0
    }

    /// Whether this text, read back from a stored marker, is one feeding could have made
    /// with a prefix of `prefix_cap` characters: that cap, a prefix of the first
    /// `min(chars, prefix_cap)` characters, a pending space only after some text, the empty
    /// hash while no character was fed, and at most [`MAX_TEXT_CHARS`](Self::MAX_TEXT_CHARS)
    /// characters. A stored state edited to another cap would keep a prefix as long as its
    /// line, and make markers too large to store again; one edited to a count near the end of
    /// `u64` would overflow it (a caller that knows how many bytes the text came from checks
    /// that it holds no more characters than that, as
    /// `gateway_adapter::upstream::transcript::LineScanner::is_sound` does).
    pub fn is_sound(&self, prefix_cap: usize) -> bool {
        let kept = self.prefix.chars().count() as u64;
        self.prefix_cap == prefix_cap
            && kept == self.chars.min(prefix_cap as u64)
            && (!self.pending_space || self.chars > 0)
            && (self.chars > 0 || self.hash == Fnv64::new())
            && self.chars <= Self::MAX_TEXT_CHARS
    }

    /// The most characters a text fed in can count: each takes at least a byte of what it was
    /// read from, and no file (its length is a signed 64-bit `off_t`) or slice (at most
    /// `isize::MAX` bytes) holds more bytes than this. Half of `u64`: a count
    /// [`is_sound`](Self::is_sound) accepts is far from overflowing.
    pub const MAX_TEXT_CHARS: u64 = i64::MAX.unsigned_abs();

    /// The first `prefix_cap` characters of the normalized text.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The fingerprint of the normalized text so far.
    pub fn fingerprint(&self) -> TextFingerprint {
        TextFingerprint {
            hash: self.hash.finish(),
            chars: self.chars,
        }
    }
}

/// Upstream links, keyed by ref. Every method is atomic.
///
/// Kept apart from [`AwarenessStore`] so that a backend adds it without touching the event and
/// cursor traits; [`FullStore`] names a backend that offers both. `EventStore::delete_session`
/// of such a backend also removes the ref's link.
///
/// # Errors
///
/// Every method may fail as any method of a store may (see
/// [`EventStore`](crate::EventStore#errors-common-to-every-method)); on a read-only handle, each
/// write (never a read) fails with [`StoreError::ReadOnly`]. A row that cannot be read as
/// a link (decision 0017) is left out of [`links`](Self::links), written over by
/// [`upsert_link`](Self::upsert_link) and removed by [`remove_link`](Self::remove_link)
/// without a token; what else it fails each method says.
#[async_trait]
pub trait UpstreamStore: Send + Sync {
    /// Adopts: creates the ref's link, or applies [`plan_upsert`] to the existing one.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] for a spec that [`LinkSpec::validate`] refuses (an empty,
    /// too long or line-breaking id, a catalog id too long for the event summaries quoted from
    /// it, a reference or marker over [`MAX_UPSTREAM_JSON_BYTES`] or nested too deep), on any
    /// handle; nothing is written. Otherwise those of every write (see the
    /// [trait](UpstreamStore#errors)).
    async fn upsert_link(
        &self,
        spec: LinkSpec,
        now: Timestamp,
    ) -> Result<UpsertOutcome, StoreError>;

    /// The ref's link.
    ///
    /// # Errors
    ///
    /// [`StoreError::Corrupt`] when the ref's row cannot be read as a link; otherwise those of
    /// every read (see the [trait](UpstreamStore#errors)).
    async fn link(&self, session: &SessionRef) -> Result<Option<UpstreamLink>, StoreError>;

    /// Every link, ordered by session key then agent.
    ///
    /// # Errors
    ///
    /// Only those of every read (see the [trait](UpstreamStore#errors)): a row that cannot be
    /// read as a link is left out, with a warning.
    async fn links(&self) -> Result<Vec<UpstreamLink>, StoreError>;

    /// Compare-and-set of the marker ([`plan_set_marker`]): `true` when the link's `updated_at`
    /// was still `expected_updated_at` and the marker was written; `false`, writing nothing,
    /// when the link changed meanwhile or is gone.
    ///
    /// # Errors
    ///
    /// - [`StoreError::InvalidInput`] for a marker larger than [`MAX_UPSTREAM_JSON_BYTES`], or
    ///   nesting arrays and objects deeper than [`crate::validate::MAX_JSON_DEPTH`], on any
    ///   handle; nothing is written.
    /// - [`StoreError::Corrupt`] when the ref's row cannot be read as a link; nothing is
    ///   written.
    /// - Those of every write (see the [trait](UpstreamStore#errors)).
    async fn set_marker(
        &self,
        session: &SessionRef,
        expected_updated_at: Timestamp,
        marker: Value,
        now: Timestamp,
    ) -> Result<bool, StoreError>;

    /// Stamps `last_scanned_at` with `now`, even one before the last stamp (a clock that stepped
    /// back). It does **not** move `updated_at`, so it never breaks a marker update in flight.
    /// `false` when the link is gone.
    ///
    /// It takes no token: a link re-adopted between the caller's read and the stamp is stamped
    /// too (the field is informational; no decision reads it).
    ///
    /// # Errors
    ///
    /// Those of every write (see the [trait](UpstreamStore#errors)). On a row that cannot be
    /// read as a link (decision 0017) a store may fail with [`StoreError::Corrupt`]
    /// (store-redb, which reads the link to stamp it) or stamp the column and leave the row as
    /// unreadable as it was (store-sqlite); the monitor stamps only links it listed, so it
    /// never meets one.
    async fn mark_scanned(&self, session: &SessionRef, now: Timestamp) -> Result<bool, StoreError>;

    /// Removes the ref's link; with `expected_updated_at`, only when the link has not changed
    /// since (see [`may_remove`]). `true` when a link was removed.
    ///
    /// # Errors
    ///
    /// [`StoreError::Corrupt`] when `expected_updated_at` is given and the ref's row cannot be
    /// read as a link (there is nothing to compare it with; [`may_remove_found`]), and
    /// nothing is removed; without it, such a row is removed. Otherwise those of every write
    /// (see the [trait](UpstreamStore#errors)).
    async fn remove_link(
        &self,
        session: &SessionRef,
        expected_updated_at: Option<Timestamp>,
    ) -> Result<bool, StoreError>;
}

/// A backend with the log, the cursors and the upstream links (every store of this workspace).
/// `Arc<dyn FullStore>` converts into `Arc<dyn AwarenessStore>` and `Arc<dyn UpstreamStore>`.
pub trait FullStore: AwarenessStore + UpstreamStore {}

impl<T: AwarenessStore + UpstreamStore + ?Sized> FullStore for T {}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec() -> LinkSpec {
        LinkSpec::new(
            SessionRef::parse("agent:main:main", "main").unwrap(),
            "claude-code",
            "local",
            "t1",
            "local-jsonl",
        )
        .with_ref(json!({"path": "/tmp/t1.jsonl"}))
        .with_marker(json!({"offset": 10}))
    }

    #[test]
    fn upsert_create_refresh_rebase() {
        let created = plan_upsert(None, spec(), Timestamp(100)).unwrap();
        assert!(created.write && created.outcome.created && !created.outcome.rebased);
        let link = created.outcome.link;
        assert_eq!(
            (link.created_at, link.updated_at),
            (Timestamp(100), Timestamp(100))
        );

        // Same source with another marker: nothing changes, not even updated_at.
        let refresh = plan_upsert(
            Some(&link),
            spec().with_marker(json!({"offset": 0})),
            Timestamp(200),
        )
        .unwrap();
        assert!(!refresh.write && !refresh.outcome.created && !refresh.outcome.rebased);
        assert_eq!(refresh.outcome.link, link);

        // Another thread: rebase, the given marker wins, updated_at moves, created_at stays.
        let mut other = spec().with_marker(json!({"offset": 0}));
        other.thread_id = "t2".into();
        let rebased = plan_upsert(Some(&link), other, Timestamp(100)).unwrap();
        assert!(rebased.write && rebased.outcome.rebased);
        assert_eq!(rebased.outcome.link.marker, Some(json!({"offset": 0})));
        assert_eq!(rebased.outcome.link.thread_id, "t2");
        assert_eq!(rebased.outcome.link.created_at, Timestamp(100));
        assert_eq!(
            rebased.outcome.link.updated_at,
            Timestamp(101),
            "strictly after the previous token even within the same millisecond"
        );

        // Rebased later, created_at still stays. (Above, at the same millisecond, a rebase that
        // reset it to now passed: review of stop 60.)
        let mut later = spec();
        later.thread_id = "t3".into();
        let rebased_later = plan_upsert(Some(&link), later, Timestamp(500)).unwrap();
        assert!(rebased_later.outcome.rebased);
        assert_eq!(
            (
                rebased_later.outcome.link.created_at,
                rebased_later.outcome.link.updated_at
            ),
            (Timestamp(100), Timestamp(500))
        );

        // A changed reference alone is a changed source too.
        let moved = spec().with_ref(json!({"path": "/tmp/elsewhere.jsonl"}));
        assert!(
            plan_upsert(Some(&link), moved, Timestamp(300))
                .unwrap()
                .outcome
                .rebased
        );
    }

    /// A spec's ids follow the key rules, the thread id's too, and an oversized marker is
    /// refused. (What the mutation did: the thread id's check removed, every store stored a link
    /// with an empty or line-breaking thread id; review of stop 65, CM27.)
    #[test]
    fn upsert_validates() {
        let mut bad = spec();
        bad.catalog_id = String::new();
        assert!(matches!(
            plan_upsert(None, bad, Timestamp(0)),
            Err(ValidationError::Empty { .. })
        ));
        let mut bad = spec();
        bad.thread_id = String::new();
        assert_eq!(
            bad.validate(),
            Err(ValidationError::Empty { what: "thread id" })
        );
        bad.thread_id = "t\n1".into();
        assert!(
            matches!(
                bad.validate(),
                Err(ValidationError::ControlCharacter {
                    what: "thread id",
                    ..
                })
            ),
            "{:?}",
            bad.validate()
        );
        assert!(plan_upsert(None, bad, Timestamp(0)).is_err());
        // A host id refused is named as the host id, not as another id, in the error an
        // adoption answers. (What the mutation did: the host id checked under the name "thread
        // id", so an empty host was reported as an empty thread; review of stop 72, CB62.)
        let mut bad = spec();
        bad.host_id = String::new();
        assert_eq!(
            bad.validate(),
            Err(ValidationError::Empty { what: "host id" })
        );
        let huge = spec().with_marker(json!({"x": "a".repeat(MAX_UPSTREAM_JSON_BYTES)}));
        assert!(matches!(
            plan_upsert(None, huge, Timestamp(0)),
            Err(ValidationError::UpstreamJsonTooLarge { what: "marker", .. })
        ));
    }

    /// A row a store cannot read is removed without a token and fails a removal with one
    /// (decision 0017); a readable link follows `may_remove`; no row is not removed.
    #[test]
    fn removal_of_a_row_found() {
        let link = plan_upsert(None, spec(), Timestamp(100))
            .expect("a valid spec")
            .outcome
            .link;
        let torn = || Some(Err(StoreError::corrupt("torn")));
        assert_eq!(may_remove_found(None, None).ok(), Some(false));
        assert_eq!(may_remove_found(torn(), None).ok(), Some(true));
        assert!(matches!(
            may_remove_found(torn(), Some(Timestamp(0))),
            Err(StoreError::Corrupt { .. })
        ));
        let stale = Some(link.updated_at.plus_ms(1));
        assert_eq!(
            may_remove_found(Some(Ok(link.clone())), stale).ok(),
            Some(false)
        );
        assert_eq!(
            may_remove_found(Some(Ok(link.clone())), Some(link.updated_at)).ok(),
            Some(true)
        );
    }

    /// An adoption decides over a readable link, and over none when the row cannot be read
    /// (decision 0017), whose error comes back for the store to log.
    #[test]
    fn adoption_over_a_row_found() {
        let link = plan_upsert(None, spec(), Timestamp(100))
            .expect("a valid spec")
            .outcome
            .link;
        assert!(matches!(adopting_over(None), (None, None)));
        assert_eq!(adopting_over(Some(Ok(link.clone()))).0, Some(link));
        let (over, error) = adopting_over(Some(Err(StoreError::corrupt("torn"))));
        assert_eq!(over, None);
        assert!(matches!(error, Some(StoreError::Corrupt { .. })));
    }

    /// Bug: the catalog id was only checked as a key (1 KiB), so a link was stored whose
    /// `adopted`, `human_direct_message` and `upstream_missing` summaries were refused.
    #[test]
    fn a_catalog_id_must_fit_the_summaries_built_from_it() {
        let with_catalog = |catalog: &str| {
            let mut s = spec();
            s.catalog_id = catalog.to_owned();
            s.validate()
        };
        assert_eq!(MAX_CATALOG_ID_CHARS, 179);
        assert_eq!(
            with_catalog(&"c".repeat(190)),
            Err(ValidationError::CatalogIdTooLong {
                chars: 190,
                max: 179,
            })
        );
        // Measured in characters, as the summaries are: 180 two-byte characters are 180.
        let msg = with_catalog(&"\u{e9}".repeat(180)).unwrap_err().to_string();
        assert!(
            msg.starts_with("catalog id is 180 characters") && msg.contains("summaries"),
            "{msg}"
        );
        // A line break is refused already as a key's (keys too go into one-line texts).
        for sep in ['\u{2028}', '\u{2029}'] {
            assert_eq!(
                with_catalog(&format!("claude{sep}code")),
                Err(ValidationError::ControlCharacter {
                    what: "catalog id",
                    found: sep,
                    at: 6
                })
            );
        }
        assert_eq!(with_catalog(&"c".repeat(150)), Ok(()));
        // The limit is exact and counts characters, not bytes.
        assert_eq!(with_catalog(&"c".repeat(MAX_CATALOG_ID_CHARS)), Ok(()));
        assert!(with_catalog(&"c".repeat(MAX_CATALOG_ID_CHARS + 1)).is_err());
        assert_eq!(with_catalog(&"\u{e9}".repeat(MAX_CATALOG_ID_CHARS)), Ok(()));
        for prefix in CATALOG_SUMMARY_PREFIXES {
            let longest = format!("{prefix}{}", "c".repeat(MAX_CATALOG_ID_CHARS));
            assert_eq!(validate::summary(&longest), Ok(()));
        }
        // plan_upsert refuses it too, so no store writes such a link.
        let mut bad = spec();
        bad.catalog_id = "c".repeat(190);
        assert!(matches!(
            plan_upsert(None, bad, Timestamp(0)),
            Err(ValidationError::CatalogIdTooLong { .. })
        ));
    }

    /// Each limit at its exact value: a marker of exactly 16 KiB is kept and one byte more is
    /// refused; an id of exactly 64 bytes is kept as it is in the dedupe key and one byte more
    /// is hashed (stored keys must not change between releases). Only values over the limits
    /// were tested, and `>=` for `>` passed every test (review, stop 58).
    #[test]
    fn limits_hold_at_their_exact_value() {
        let framing = serde_json::to_string(&json!({"x": ""})).unwrap().len();
        let sized = |n: usize| json!({"x": "a".repeat(n - framing)});
        let edge = sized(MAX_UPSTREAM_JSON_BYTES);
        assert_eq!(
            serde_json::to_string(&edge).unwrap().len(),
            MAX_UPSTREAM_JSON_BYTES
        );
        assert!(validate_json("marker", Some(&edge)).is_ok());
        assert!(validate_json("marker", Some(&sized(MAX_UPSTREAM_JSON_BYTES + 1))).is_err());
        let link = plan_upsert(None, spec(), Timestamp(100))
            .unwrap()
            .outcome
            .link;
        let id = "d".repeat(MAX_DEDUPE_ID_BYTES);
        assert!(human_dedupe_key(&link, "s", &id).ends_with(&format!(":{id}")));
        let over = "d".repeat(MAX_DEDUPE_ID_BYTES + 1);
        assert!(!human_dedupe_key(&link, "s", &over).contains(&over));
        // The values the decisions give, not only the constants: 16 KiB of JSON (0021), an id
        // of 64 bytes kept as it is (0004). (Either constant halved or cut by one passed every
        // test: review of stop 60.)
        assert!(validate_json("marker", Some(&sized(16 * 1024))).is_ok());
        let id64 = "d".repeat(64);
        assert!(human_dedupe_key(&link, "s", &id64).ends_with(&format!(":{id64}")));
    }

    /// A marker's exact number ([`exact_u64`]) is digits only, with no sign, and never
    /// negative: a marker another writer edited to `"+5"` or `-1` is refused, not read as 5 or
    /// 2^64 - 1. (Both passed every test under mutation: review of stop 60.)
    #[test]
    fn an_exact_number_refuses_a_sign_and_a_negative() {
        #[derive(serde::Deserialize, Debug)]
        struct Marker {
            #[serde(with = "exact_u64")]
            ino: u64,
        }
        let read = |v: serde_json::Value| serde_json::from_value::<Marker>(v).map(|m| m.ino);
        assert_eq!(read(json!({"ino": "5"})).unwrap(), 5);
        assert_eq!(read(json!({"ino": 5})).unwrap(), 5);
        for bad in [
            json!({"ino": "+5"}),
            json!({"ino": -1}),
            json!({"ino": "-1"}),
        ] {
            assert!(read(bad.clone()).is_err(), "{bad}");
        }
    }

    /// A rebase keeps the time of the last scan, as it keeps `created_at`: only the source, the
    /// marker and `updated_at` change. (What the mutation did: the time dropped, a rebase
    /// wiped OpenClaw's shared `last_scanned_at` column; review of stop 63, U04.)
    #[test]
    fn a_rebase_keeps_the_time_of_the_last_scan() {
        let mut link = plan_upsert(None, spec(), Timestamp(100))
            .unwrap()
            .outcome
            .link;
        link.last_scanned_at = Some(Timestamp(150));
        let mut other = spec();
        other.thread_id = "t2".into();
        let rebased = plan_upsert(Some(&link), other, Timestamp(200)).unwrap();
        assert!(rebased.outcome.rebased);
        assert_eq!(rebased.outcome.link.last_scanned_at, Some(Timestamp(150)));
    }

    /// 2^53 is the first number written as the string of its digits, as `exact_u64` says; the
    /// number below it is still a number. (What the mutation did: 2^53 written as a number, which a
    /// reader of doubles still reads right, but not in the form the docs give; review of stop 63,
    /// U05.)
    #[test]
    fn two_to_the_53_is_the_first_number_written_as_a_string() {
        #[derive(serde::Serialize)]
        struct Marker {
            #[serde(with = "exact_u64")]
            ino: u64,
        }
        let first = exact_u64::FIRST_INEXACT;
        assert_eq!(first, 1 << 53);
        assert_eq!(
            serde_json::to_value(Marker { ino: first }).unwrap(),
            json!({"ino": first.to_string()})
        );
        assert_eq!(
            serde_json::to_value(Marker { ino: first - 1 }).unwrap(),
            json!({"ino": first - 1})
        );
    }

    /// The hash that stands for a dedupe id too long to keep has sixteen hex digits, zeros
    /// leading, whatever its value. (What the mutation did: unpadded, for one long id in
    /// sixteen the human turn's dedupe key differed from the one earlier releases stored, and
    /// a monitor re-reading the burst after an upgrade recorded its turns again; review of
    /// stop 63, U07.)
    #[test]
    fn a_long_dedupe_ids_hash_keeps_sixteen_digits() {
        let link = plan_upsert(None, spec(), Timestamp(100))
            .unwrap()
            .outcome
            .link;
        let long = (0..10_000)
            .map(|i| format!("{i}-{}", "x".repeat(MAX_DEDUPE_ID_BYTES)))
            .find(|id| fnv1a64(id.as_bytes()) < 1 << 60)
            .expect("one hash in sixteen begins with a zero");
        let key = human_dedupe_key(&link, "s", &long);
        let hashed = key.rsplit(':').next().unwrap();
        assert_eq!(
            hashed,
            format!("{:016x}", fnv1a64(long.as_bytes())),
            "{key}"
        );
        assert_eq!(hashed.len(), 16, "{key}");
    }

    /// A stored text state whose prefix is shorter than its count of characters (up to the
    /// cap) is not sound: resumed, it would build a wrong prefix. (What the mutation did: a
    /// short prefix taken for sound, later characters were appended to it, and the prefix the
    /// monitor compares a human message by was wrong instead of the line being skipped and
    /// logged; review of stop 63, U08.)
    #[test]
    fn a_prefix_shorter_than_its_count_is_not_sound() {
        let mut fed = NormalizedText::new(4);
        fed.push_str("abc");
        assert!(fed.is_sound(4));
        let short = NormalizedText {
            prefix: "a".into(),
            ..fed.clone()
        };
        assert!(!short.is_sound(4), "{short:?}");
    }

    /// A link's upstream kind is a key like its ids: an empty one is refused. (What the
    /// mutation did: the check left out, every store took an empty or line-breaking kind,
    /// which no provider matches; review of stop 63, U10.)
    #[test]
    fn an_empty_upstream_kind_is_refused() {
        let mut no_kind = spec();
        no_kind.upstream_kind = String::new();
        assert_eq!(
            no_kind.validate(),
            Err(ValidationError::Empty {
                what: "upstream kind"
            })
        );
    }

    #[test]
    fn marker_cas() {
        let link = plan_upsert(None, spec(), Timestamp(100))
            .unwrap()
            .outcome
            .link;
        assert!(plan_set_marker(&link, Timestamp(99), json!(1), Timestamp(150)).is_none());
        let next = plan_set_marker(&link, Timestamp(100), json!(1), Timestamp(100)).unwrap();
        assert_eq!(next.marker, Some(json!(1)));
        assert_eq!(next.updated_at, Timestamp(101));
        // The old token no longer matches.
        assert!(plan_set_marker(&next, Timestamp(100), json!(2), Timestamp(300)).is_none());
        // Nor does a token above the link's `updated_at` (read from a link since removed and
        // adopted again under a clock that went back): the marker of another incarnation is
        // not written over this one.
        // (What the mutation did: `!=` for `>`, a token newer than the link set its marker;
        // review of stop 67, CR48.)
        assert!(plan_set_marker(&next, Timestamp(102), json!(2), Timestamp(300)).is_none());
        assert!(may_remove(&next, None));
        assert!(may_remove(&next, Some(Timestamp(101))));
        assert!(!may_remove(&next, Some(Timestamp(100))));
    }

    #[test]
    fn fnv_vectors() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn dedupe_keys() {
        let link = plan_upsert(None, spec(), Timestamp(100))
            .unwrap()
            .outcome
            .link;
        let key = human_dedupe_key(&link, "/tmp/t1.jsonl", "uuid-1");
        let hex = format!("{:016x}", source_hash(&link, "/tmp/t1.jsonl"));
        assert_eq!(key, format!("upstream:agent:main:main:{hex}:uuid-1"));
        assert_eq!(hex.len(), 16);
        assert!(
            hex.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        // Pinned: stored dedupe keys must not change between releases.
        assert_eq!(hex, "21eed463bc424bae");
        // Sixteen digits also when the hash begins with zeros (one source in sixteen; without
        // the padding those keys changed, and human turns were recorded again: review of stop
        // 60).
        let source = (0..10_000)
            .map(|i| format!("/tmp/s{i}.jsonl"))
            .find(|s| source_hash(&link, s) < 1 << 60)
            .expect("one hash in sixteen begins with a zero");
        let padded = human_dedupe_key(&link, &source, "id");
        let digits = padded
            .strip_prefix("upstream:agent:main:main:")
            .and_then(|rest| rest.strip_suffix(":id"))
            .expect("the key's parts");
        assert_eq!(digits.len(), 16, "{padded}");
        assert!(digits.starts_with('0'), "{padded}");
        // Another agent under the same key, another source, another id: other keys.
        let mut other_agent = link.clone();
        other_agent.session = SessionRef::parse("agent:main:main", "ops").unwrap();
        assert_ne!(
            human_dedupe_key(&other_agent, "/tmp/t1.jsonl", "uuid-1"),
            key
        );
        assert_ne!(human_dedupe_key(&link, "/tmp/t2.jsonl", "uuid-1"), key);
        assert_ne!(human_dedupe_key(&link, "/tmp/t1.jsonl", "uuid-2"), key);
        // Length-prefixed parts: moving a character between parts changes the hash.
        let mut shifted = link.clone();
        shifted.host_id = "localt".into();
        shifted.thread_id = "1".into();
        assert_ne!(source_hash(&shifted, "x"), source_hash(&link, "x"));
        // A long id is hashed, so the key stays a valid dedupe key.
        let long = human_dedupe_key(&link, "s", &"x".repeat(500));
        assert!(long.len() < 100, "{long}");
        assert!(validate::dedupe_key(&long).is_ok());
        // The `upstream_missing` key is stored with its event as well, pinned whole: its hash
        // is the link's source hash without a source id, so a retry after an upgrade finds
        // the event it recorded. (What the mutation did: the hash over another source id,
        // every key changed and every test passed; review of stop 67, CR53.)
        assert_eq!(
            missing_dedupe_key(&link),
            "upstream-missing:agent:main:main:8210ff5615941d17:100"
        );
        // One key per incarnation: the link unchanged keeps it; adopted again (its creation
        // kept, its source moved) it gets another.
        assert_eq!(missing_dedupe_key(&link.clone()), missing_dedupe_key(&link));
        let mut moved = link.clone();
        moved.updated_at = link.updated_at.plus_ms(1);
        assert_ne!(missing_dedupe_key(&moved), missing_dedupe_key(&link));
    }

    #[test]
    fn normalization_and_fingerprints() {
        assert_eq!(normalize_text("  fix \n\t the   bug \r\n"), "fix the bug");
        assert_eq!(normalize_text(" \u{a0}\u{2003} "), "");
        for (a, b) in [
            ("fix the bug", "  fix\nthe\t\tbug  "),
            ("é  ü", "é ü"),
            ("", "   \n"),
        ] {
            assert_eq!(fingerprint(a), fingerprint(b), "{a:?} vs {b:?}");
            assert_eq!(fingerprint(a), fingerprint(&normalize_text(b)));
        }
        assert_ne!(fingerprint("fix the bug"), fingerprint("fix thebug"));
        let mut n = NormalizedText::new(5);
        n.push_str("  hello   wonderful ");
        n.separate();
        n.push_str(" world ");
        assert_eq!(n.prefix(), "hello");
        assert_eq!(n.fingerprint(), fingerprint("hello wonderful world"));
        // Parts of one text with no whitespace between them are separated as whitespace
        // would: a transcript's text blocks "fix the" and "bug" read as "fix the bug", the
        // text the agent was prompted with, not "fix thebug".
        // (What the mutation did: `separate` pushed nothing, the parts ran together and an
        // own prompt split in blocks was no echo; review of stop 67, CR52.)
        let mut parts = NormalizedText::new(16);
        parts.push_str("fix the");
        parts.separate();
        parts.push_str("bug");
        assert_eq!(parts.fingerprint(), fingerprint("fix the bug"));
        assert_eq!(parts.prefix(), "fix the bug");
        assert!(NormalizedText::new(3).is_empty());
        let own: Vec<String> = (0..15).map(|i| format!("prompt {i}")).collect();
        let fps = own_fingerprints(&own);
        assert_eq!(fps.len(), SELF_ECHO_WINDOW);
        assert!(fps.contains(&fingerprint("prompt  14")));
        assert!(
            !fps.contains(&fingerprint("prompt 4")),
            "older than the window"
        );
        // Serializable mid-text, and resuming gives the same result.
        let mut half = NormalizedText::new(8);
        half.push_str("abc  ");
        let mut resumed: NormalizedText =
            serde_json::from_str(&serde_json::to_string(&half).unwrap()).unwrap();
        resumed.push_str(" def");
        assert_eq!(resumed.fingerprint(), fingerprint("abc def"));
        assert_eq!(resumed.prefix(), "abc def");
    }

    /// A text's count and kept prefix are in characters, not UTF-8 bytes: "héllo wörld" is
    /// eleven characters, a cap of 4 keeps four "é"s, and such a text is sound at its cap (a
    /// saved transcript position with non-ASCII text is resumed, not refused). (What the
    /// mutation did: `saturating_add(c.len_utf8())` for `saturating_add(1)`, a count in
    /// bytes, a shorter prefix and a text with an "é" not sound; review of stop 70, PR26.)
    #[test]
    fn a_text_counts_characters_not_bytes() {
        assert_eq!(fingerprint("héllo  wörld").chars, 11);
        let mut n = NormalizedText::new(4);
        n.push_str("ééééé");
        assert_eq!(n.prefix(), "éééé");
        assert_eq!(n.fingerprint().chars, 5);
        assert!(n.is_sound(4));
    }

    /// The 16 KiB limit of a ref or marker counts the bytes of its JSON, not its characters:
    /// a marker of multi-byte characters over 16 KiB is refused although it holds fewer
    /// characters. (What the mutation did: `s.chars().count()` for `s.len()`, such a marker
    /// accepted, up to four times the limit stored; review of stop 70, PR29.)
    #[test]
    fn the_json_limit_counts_bytes_not_characters() {
        let framing = serde_json::to_string(&json!({"x": ""})).unwrap().len();
        let wide = json!({"x": "é".repeat((MAX_UPSTREAM_JSON_BYTES - framing) / 2 + 1)});
        let text = serde_json::to_string(&wide).unwrap();
        assert!(text.len() > MAX_UPSTREAM_JSON_BYTES);
        assert!(text.chars().count() <= MAX_UPSTREAM_JSON_BYTES);
        assert!(matches!(
            validate_json("marker", Some(&wide)),
            Err(ValidationError::UpstreamJsonTooLarge { .. })
        ));
    }

    /// A link never scanned leaves its scan time out of its JSON (as `adopt --json` prints
    /// it), as it does a missing ref or marker: no `"lastScannedAt": null`. (What the mutation
    /// did: the field's `skip_serializing_if` removed, a `null` scan time in every new link's
    /// JSON; review of stop 70, PR40.)
    #[test]
    fn a_link_never_scanned_leaves_the_scan_time_out_of_its_json() {
        let mut link = plan_upsert(None, spec(), Timestamp(100))
            .unwrap()
            .outcome
            .link;
        let json = serde_json::to_value(&link).unwrap();
        assert_eq!(json.get("lastScannedAt"), None, "{json}");
        link.last_scanned_at = Some(Timestamp(7));
        let json = serde_json::to_value(&link).unwrap();
        assert_eq!(json["lastScannedAt"], json!(7), "{json}");
    }

    /// A text keeps no prefix at a prefix cap of 0, and is still not empty once a character
    /// was pushed: emptiness is the count of characters, not the kept prefix. (What the
    /// mutation did: `is_empty` read the prefix, a text under a cap of 0 was always empty;
    /// review of stop 68, CP39.)
    #[test]
    fn a_text_with_no_kept_prefix_is_empty_only_without_characters() {
        let mut n = NormalizedText::new(0);
        assert!(n.is_empty());
        n.push_str("  \n");
        assert!(n.is_empty(), "whitespace alone is no character");
        n.push_str("hi");
        assert_eq!(n.prefix(), "");
        assert!(!n.is_empty(), "two characters pushed, none kept");
    }

    /// A stored text no feeding makes (a count past any text, something hashed with no
    /// character) is not sound; one fed anyway neither panics on its count nor wraps it to
    /// an empty text.
    #[test]
    fn a_text_no_feeding_makes_is_not_sound_and_never_overflows() {
        let mut real = NormalizedText::new(4);
        real.push_str("ab");
        assert!(real.is_sound(4));
        let counted = |chars: u64| NormalizedText {
            chars,
            prefix: "abcd".into(),
            ..real.clone()
        };
        assert!(
            counted(NormalizedText::MAX_TEXT_CHARS).is_sound(4),
            "a long text"
        );
        assert!(!counted(u64::MAX).is_sound(4), "a count past every text");
        assert!(!counted(NormalizedText::MAX_TEXT_CHARS + 1).is_sound(4));
        let hashed_empty = NormalizedText {
            hash: real.hash,
            ..NormalizedText::new(4)
        };
        assert!(!hashed_empty.is_sound(4), "nothing fed, something hashed");
        // A pending space only after some text (a state edited by hand: resumed, it would
        // hash " x" where the session's own prompt hashes "x"; accepted under mutation, every
        // test passing: review of stop 60).
        let mut stored = serde_json::to_value(NormalizedText::new(4)).unwrap();
        assert!(
            serde_json::from_value::<NormalizedText>(stored.clone())
                .unwrap()
                .is_sound(4)
        );
        stored["pending_space"] = json!(true);
        let edited: NormalizedText = serde_json::from_value(stored).unwrap();
        assert!(!edited.is_sound(4), "{edited:?}");
        // Fed anyway (a caller that did not ask): the count stays at its end.
        let mut at_end = counted(u64::MAX);
        at_end.push_str(" c d");
        assert_eq!(at_end.fingerprint().chars, u64::MAX);
        assert!(!at_end.is_empty());
        assert_eq!(at_end.prefix(), "abcd");
    }
}
