//! Turning the JSON values the statements build back into core types, and core types into the
//! JSON the write statements read. Anything a stored row cannot be is a
//! [`StoreError::Corrupt`] naming the row, except in a list of cursors, where such a row is
//! set apart ([`CursorRows`], docs/decisions/0016).

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use awareness_core::{
    ActorType, AgentId, Cursor, Event, EventKind, Head, Payload, Sequence, SessionKey, SessionRef,
    StoreError, Timestamp, UnreadableCursor, UpstreamLink, WatchProvenance, WatcherKey,
};
use serde::Deserialize;

use crate::rows::{Reader, fast_ints, fast_rows};

/// `json_array(sequence, session_key, session_id, agent_id, kind, actor_type, actor_id, run_id,
/// occurred_at, summary, payload_json, dedupe_key)`.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct RawEvent<'a>(
    i64,
    #[serde(borrow)] Cow<'a, str>,
    Option<String>,
    #[serde(borrow)] Cow<'a, str>,
    #[serde(borrow)] Cow<'a, str>,
    #[serde(borrow)] Cow<'a, str>,
    Option<String>,
    Option<String>,
    i64,
    String,
    #[serde(borrow)] Option<Cow<'a, str>>,
    Option<String>,
);

/// An event's fields after its sequence, key and agent (`fields_json!`): `json_array(session_id,
/// kind, actor_type, actor_id, run_id, occurred_at, summary, payload_json, dedupe_key)`.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct RawFields<'a>(
    Option<String>,
    #[serde(borrow)] Cow<'a, str>,
    #[serde(borrow)] Cow<'a, str>,
    Option<String>,
    Option<String>,
    i64,
    String,
    #[serde(borrow)] Option<Cow<'a, str>>,
    Option<String>,
);

/// `json_array(watcher, target, target_agent_id, last_seen, notified, material, updated_at,
/// provenance)`.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct RawCursor<'a>(
    #[serde(borrow)] Cow<'a, str>,
    #[serde(borrow)] Cow<'a, str>,
    #[serde(borrow)] Option<Cow<'a, str>>,
    i64,
    i64,
    i64,
    i64,
    #[serde(borrow)] Cow<'a, str>,
);

/// `json_array(session_key, agent_id, last_sequence, pruned_max_sequence, updated_at)`.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct RawHead<'a>(
    #[serde(borrow)] Cow<'a, str>,
    #[serde(borrow)] Cow<'a, str>,
    i64,
    i64,
    i64,
);

/// A many-row JSON text as SQLite handed it back: as it is when it is UTF-8, and `false`; else
/// (a row holds text that is not UTF-8: SQLite stores such bytes as they are, and copies them
/// into the JSON it builds) with each bad sequence read as U+FFFD, and `true`, instead of
/// failing the whole read. A reader of cursors or heads then counts a row holding U+FFFD as
/// unreadable ([`spoiled`]), set apart like any other; pruning victims keep the text as read
/// ([`victims`]).
pub(crate) fn lossy_text(bytes: &[u8]) -> (Cow<'_, str>, bool) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (Cow::Borrowed(text), false),
        Err(_) => (String::from_utf8_lossy(bytes), true),
    }
}

/// Whether a row of a [`lossy_text`] that was not UTF-8 (`lossy`) holds a replaced sequence in
/// one of its text `fields`. (A U+FFFD stored as such in a row of the same read counts too: a
/// rare false alarm on a read that already holds a damaged row.)
fn spoiled(lossy: bool, fields: &[&str]) -> bool {
    lossy
        && fields
            .iter()
            .any(|f| f.contains(char::REPLACEMENT_CHARACTER))
}

/// The reason given for a row [`spoiled`] says is unreadable.
const NOT_UTF8: &str = "text that is not UTF-8";

fn json<'a, T: Deserialize<'a>>(what: &str, text: &'a str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
        context: format!("{what}: unreadable row set"),
        source: Some(Box::new(e)),
    })
}

/// Rows of an array of arrays, each read by `row` (from after its `[` to before its `]`)
/// with the fast [`Reader`]; when that reader gives up, serde_json decodes the whole text, so
/// that what the fast path cannot read is read the same way or reported the same way as
/// before (see the `rows` module).
fn rows<'a, T: Deserialize<'a>>(
    what: &str,
    text: &'a str,
    row: impl Fn(&mut Reader<'a>) -> Option<T>,
) -> Result<Vec<T>, StoreError> {
    fast_rows(text, row).map_or_else(|| json(what, text), Ok)
}

/// `fields_json!`'s fields, read by the fast reader.
fn fields<'a>(r: &mut Reader<'a>) -> Option<RawFields<'a>> {
    let session_id = r.opt_string()?;
    fields_rest(r, session_id)
}

/// `event_json!`'s fields, read by the fast reader: the sequence, the key, then
/// `fields_json!`'s fields with the agent after the session id.
fn event_fields<'a>(r: &mut Reader<'a>) -> Option<RawEvent<'a>> {
    let seq = r.int()?;
    let key = r.comma()?.str()?;
    let session_id = r.comma()?.opt_string()?;
    let agent = r.comma()?.str()?;
    let RawFields(
        session_id,
        kind,
        actor_type,
        actor_id,
        run_id,
        occurred_at,
        summary,
        payload,
        dedupe_key,
    ) = fields_rest(r, session_id)?;
    Some(RawEvent(
        seq,
        key,
        session_id,
        agent,
        kind,
        actor_type,
        actor_id,
        run_id,
        occurred_at,
        summary,
        payload,
        dedupe_key,
    ))
}

/// The fields both event shapes end with, from the kind on (arguments are read in order).
fn fields_rest<'a>(r: &mut Reader<'a>, session_id: Option<String>) -> Option<RawFields<'a>> {
    Some(RawFields(
        session_id,
        r.comma()?.str()?,
        r.comma()?.str()?,
        r.comma()?.opt_string()?,
        r.comma()?.opt_string()?,
        r.comma()?.int()?,
        r.comma()?.str()?.into_owned(),
        r.comma()?.opt_str()?,
        r.comma()?.opt_string()?,
    ))
}

/// `cursor_json!`'s fields, read by the fast reader.
fn cursor_fields<'a>(r: &mut Reader<'a>) -> Option<RawCursor<'a>> {
    Some(RawCursor(
        r.str()?,
        r.comma()?.str()?,
        r.comma()?.opt_str()?,
        r.comma()?.int()?,
        r.comma()?.int()?,
        r.comma()?.int()?,
        r.comma()?.int()?,
        r.comma()?.str()?,
    ))
}

/// `head_json!`'s fields, read by the fast reader.
fn head_fields<'a>(r: &mut Reader<'a>) -> Option<RawHead<'a>> {
    Some(RawHead(
        r.str()?,
        r.comma()?.str()?,
        r.comma()?.int()?,
        r.comma()?.int()?,
        r.comma()?.int()?,
    ))
}

/// A stored sequence (never negative).
pub(crate) fn sequence(what: &str, v: i64) -> Result<Sequence, StoreError> {
    sequence_of(v, || what.to_owned())
}

/// [`sequence`] for a row whose name `what` is only built when the value is bad: rows are
/// decoded by the hundred, and naming each one cost more than the rest of its decoding.
fn sequence_of(v: i64, what: impl FnOnce() -> String) -> Result<Sequence, StoreError> {
    u64::try_from(v)
        .map(Sequence)
        .map_err(|_| StoreError::corrupt(format!("{}: negative sequence {v}", what())))
}

/// A sequence as SQLite stores it.
pub(crate) fn int(s: Sequence) -> i64 {
    i64::try_from(s.get()).unwrap_or(i64::MAX)
}

/// A count or limit as SQLite takes it.
pub(crate) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A stored key and agent, validated again.
fn session_ref(key: &str, agent: &str) -> Result<SessionRef, String> {
    SessionRef::parse(key, agent).map_err(|e| e.to_string())
}

/// `path`, the store's file, names it in the warnings ([`build_event`]).
fn event(raw: RawEvent<'_>, path: &Path) -> Result<Event, StoreError> {
    let RawEvent(
        seq,
        key,
        session_id,
        agent,
        kind,
        actor_type,
        actor_id,
        run_id,
        occurred_at,
        summary,
        payload,
        dedupe_key,
    ) = raw;
    let r = session_ref(&key, &agent).map_err(|why| {
        StoreError::corrupt(format!("{}: {why}", event_of_key(seq, &key, &agent)))
    })?;
    build_event(
        r,
        seq,
        RawFields(
            session_id,
            kind,
            actor_type,
            actor_id,
            run_id,
            occurred_at,
            summary,
            payload,
            dedupe_key,
        ),
        path,
    )
}

/// An event from its fields; `path`, the store's file, names it in the warning about a payload
/// left out.
fn build_event(
    r: SessionRef,
    seq: i64,
    raw: RawFields<'_>,
    path: &Path,
) -> Result<Event, StoreError> {
    let RawFields(
        session_id,
        kind,
        actor_type,
        actor_id,
        run_id,
        occurred_at,
        summary,
        payload,
        dedupe_key,
    ) = raw;
    let bad = |why: String| StoreError::corrupt(format!("{}: {why}", event_of(seq, &r)));
    // Read as OpenClaw reads a row (`rowToSessionStateEvent`): an empty optional text is
    // absent, a payload that is not a JSON object is left out instead of failing the row and
    // with it every page that holds it, and a kind this version does not know is returned as
    // it is spelled (`EventKind::Other`). The store's own rows have none of these (validation
    // refuses all three); rows another writer left may. An actor type stays strict.
    let present = |v: Option<String>| v.filter(|s| !s.is_empty());
    let payload = match payload.filter(|t| !t.is_empty()) {
        None => None,
        Some(text) => match serde_json::from_str::<Payload>(&text) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(
                    path = %path.display(),
                    sequence = seq,
                    error = %awareness_core::error::ErrorChain(&e),
                    "an event's payload_json is not a JSON object this store can read; the event is read without it, as OpenClaw reads it"
                );
                None
            }
        },
    };
    let number = sequence_of(seq, || event_of(seq, &r))?;
    let actor_type = ActorType::parse(&actor_type).map_err(|e| bad(e.to_string()))?;
    Ok(Event {
        sequence: number,
        session_key: r.session_key,
        session_id: present(session_id),
        agent_id: r.agent_id,
        kind: EventKind::from_stored(&kind),
        actor_type,
        actor_id: present(actor_id),
        run_id: present(run_id),
        occurred_at: Timestamp(occurred_at),
        summary,
        payload,
        dedupe_key,
    })
}

/// The events of one ref's page from its two arrays (see `sql::CHANGES_SINCE`): `sequences`
/// (integers) and `fields` (`fields_json!` rows), in the same order; returned in ascending
/// sequence order. `path`, the store's file, names it in the warnings.
pub(crate) fn page_events(
    sequences: &str,
    fields_text: &str,
    session: &SessionRef,
    path: &Path,
) -> Result<Vec<Arc<Event>>, StoreError> {
    let seqs = fast_ints(sequences).map_or_else(|| json("event sequences", sequences), Ok)?;
    let raws = rows("events", fields_text, fields)?;
    if seqs.len() != raws.len() {
        return Err(StoreError::corrupt(format!(
            "a page of {} sequences and {} events",
            seqs.len(),
            raws.len()
        )));
    }
    let mut out = seqs
        .into_iter()
        .zip(raws)
        .map(|(seq, raw)| build_event(session.clone(), seq, raw, path).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    ascending(&mut out);
    Ok(out)
}

/// SQLite aggregates rows in the order its subquery yields them (ascending by sequence), which
/// SQL does not promise; this makes it so at the cost of one comparison per event.
fn ascending(events: &mut [Arc<Event>]) {
    if !events.is_sorted_by_key(|e| e.sequence) {
        events.sort_by_key(|e| e.sequence);
    }
}

/// An event row in an error: `event <sequence> of <session>`, the words an operator looks for.
fn event_of(seq: i64, session: &SessionRef) -> String {
    event_of_key(seq, session.session_key.as_str(), session.agent_id.as_str())
}

/// [`event_of`] for a row whose key and agent are as stored (perhaps not a ref this store
/// reads, perhaps read with U+FFFD for text that was not UTF-8).
fn event_of_key(seq: i64, key: &str, agent: &str) -> String {
    format!("event {seq} of session {key:?} (agent {agent:?})")
}

/// The name ([`event_of_key`]) of one `event_json!` row that did not read as an event, from
/// its first, second and fourth values where those are an integer and two strings; else
/// "an event".
fn event_json_name(text: &str) -> String {
    let values: Option<Vec<serde_json::Value>> = serde_json::from_str(text).ok();
    let named = values.as_deref().and_then(|v| {
        let seq = v.first()?.as_i64()?;
        Some(event_of_key(seq, v.get(1)?.as_str()?, v.get(3)?.as_str()?))
    });
    named.unwrap_or_else(|| String::from("an event"))
}

/// Text that is not UTF-8 (SQLite keeps such bytes as stored) in the event row `name`.
fn not_utf8_event(name: &str, e: std::str::Utf8Error) -> StoreError {
    StoreError::Corrupt {
        context: format!("{name}: {NOT_UTF8}"),
        source: Some(Box::new(e)),
    }
}

/// One event (`event_json!`), as bytes: the stored row of a dedupe hit. A row holding text
/// that is not UTF-8, or one that does not read as an event, fails naming it (its sequence,
/// key and agent, read with U+FFFD for what is not UTF-8). `path`, the store's file, names it
/// in the warnings.
pub(crate) fn one_event(bytes: &[u8], path: &Path) -> Result<Event, StoreError> {
    event(
        named_row(bytes, || event_json_name(&String::from_utf8_lossy(bytes)))?,
        path,
    )
}

/// One row of a log read again on its own (`sql::EVENTS_AFTER_EACH`): its sequence, key and
/// agent as stored, and its `event_json!` as bytes. Text that is not UTF-8, or a row that does
/// not read as an event, fails naming the row. `path`, the store's file, names it in the
/// warnings.
pub(crate) fn logged_event(
    seq: i64,
    key: &[u8],
    agent: &[u8],
    bytes: &[u8],
    path: &Path,
) -> Result<Event, StoreError> {
    let name = || {
        event_of_key(
            seq,
            &String::from_utf8_lossy(key),
            &String::from_utf8_lossy(agent),
        )
    };
    event(named_row(bytes, name)?, path)
}

/// One event of a ref's page read again on its own (`sql::CHANGES_SINCE_EACH`): its sequence
/// and its fields (`fields_json!`) as bytes. Text that is not UTF-8, or fields that do not
/// read as an event's, fail naming the row. `path`, the store's file, names it in the warnings.
pub(crate) fn page_event(
    seq: i64,
    bytes: &[u8],
    session: &SessionRef,
    path: &Path,
) -> Result<Event, StoreError> {
    let raw = named_row(bytes, || event_of(seq, session))?;
    build_event(session.clone(), seq, raw, path)
}

/// One event row read on its own, as JSON bytes; text that is not UTF-8, or JSON that does not
/// read as `T`, fails naming the row (`name`).
fn named_row<'a, T: serde::Deserialize<'a>>(
    bytes: &'a [u8],
    name: impl Fn() -> String,
) -> Result<T, StoreError> {
    let text = std::str::from_utf8(bytes).map_err(|e| not_utf8_event(&name(), e))?;
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
        context: format!("{}: unreadable row", name()),
        source: Some(Box::new(e)),
    })
}

/// A JSON array of events (`event_json!`), in ascending sequence order. `path`, the store's
/// file, names it in the warnings.
pub(crate) fn events(text: &str, path: &Path) -> Result<Vec<Arc<Event>>, StoreError> {
    let raws = rows("events", text, event_fields)?;
    let mut out = raws
        .into_iter()
        .map(|raw| event(raw, path).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    ascending(&mut out);
    Ok(out)
}

fn cursor(raw: &RawCursor<'_>) -> Result<Cursor, StoreError> {
    let RawCursor(
        watcher,
        target,
        target_agent,
        last_seen,
        notified,
        material,
        updated_at,
        provenance,
    ) = raw;
    let where_ = || format!("cursor ({watcher:?}, {target:?})");
    // Only agent-qualified keys can watch (DESIGN.md section 2). A row that breaks this was not
    // written by us or by OpenClaw's own checks.
    let watcher_key = WatcherKey::parse(watcher).map_err(|_| {
        StoreError::corrupt(format!(
            "{}: the watcher key is not agent-qualified",
            where_()
        ))
    })?;
    let target_key = SessionKey::new(&**target)
        .map_err(|e| StoreError::corrupt(format!("{}: target key: {e}", where_())))?;
    let target_agent = match target_agent {
        Some(a) => AgentId::new(&**a)
            .map_err(|e| StoreError::corrupt(format!("{}: target agent: {e}", where_())))?,
        // A row OpenClaw wrote: it has no target agent column.
        None => Cursor::default_target_agent(&watcher_key, &target_key),
    };
    // The column's CHECK allows only these two.
    let provenance = WatchProvenance::from_stored(provenance)
        .ok_or_else(|| StoreError::corrupt(format!("{}: provenance {provenance:?}", where_())))?;
    Ok(Cursor {
        last_seen: sequence_of(*last_seen, where_)?,
        notified: sequence_of(*notified, where_)?,
        material: sequence_of(*material, where_)?,
        watcher: watcher_key,
        target: target_key,
        target_agent,
        updated_at: Timestamp(*updated_at),
        provenance,
    })
}

/// The rows of a JSON array of cursors: those that read as cursors, and those that cannot (a
/// torn write, a hand edit, another writer's row, a watcher key that is not agent-qualified),
/// set apart with why, so that one damaged row stops no read of many cursors
/// (docs/decisions/0016).
pub(crate) struct CursorRows {
    /// The rows read as cursors, in the array's order.
    pub readable: Vec<Cursor>,
    /// The rows that cannot be read.
    pub unreadable: Vec<UnreadableCursor>,
}

impl CursorRows {
    /// Reads a JSON array of cursors (bytes, which may not all be UTF-8: [`lossy_text`]).
    pub(crate) fn read(bytes: &[u8]) -> Result<Self, StoreError> {
        let (text, lossy) = lossy_text(bytes);
        let raws = rows("cursors", &text, cursor_fields)?;
        let mut out = Self {
            readable: Vec::with_capacity(raws.len()),
            unreadable: Vec::new(),
        };
        for raw in raws {
            let fields = [
                &*raw.0,
                &*raw.1,
                raw.2.as_deref().unwrap_or_default(),
                &*raw.7,
            ];
            let read = if spoiled(lossy, &fields) {
                Err(StoreError::corrupt(NOT_UTF8))
            } else {
                cursor(&raw)
            };
            match read {
                Ok(c) => out.readable.push(c),
                Err(e) => out.unreadable.push(UnreadableCursor {
                    watcher: raw.0.into_owned(),
                    target: raw.1.into_owned(),
                    reason: e.to_string(),
                }),
            }
        }
        Ok(out)
    }

    /// The readable cursors, each unreadable row logged (`warn!`) as left out, naming the
    /// store's file (`path`).
    pub(crate) fn warned(self, path: &Path) -> Vec<Cursor> {
        for u in &self.unreadable {
            tracing::warn!(
                path = %path.display(),
                watcher = %u.watcher,
                target = %u.target,
                error = %u.reason,
                "ignoring a watch cursor that cannot be read"
            );
        }
        self.readable
    }
}

/// A JSON array of cursors, as a listing, an acknowledgement and a re-freeze take them: a row
/// that cannot be read is left out with a warning naming it ([`CursorRows::warned`]). Reading
/// that one cursor ([`one_cursor`]) still fails. `path`, the store's file, names it in the
/// warning.
pub(crate) fn cursors(bytes: &[u8], path: &Path) -> Result<Vec<Cursor>, StoreError> {
    Ok(CursorRows::read(bytes)?.warned(path))
}

/// One cursor (`cursor_json!`).
pub(crate) fn one_cursor(bytes: &[u8]) -> Result<Cursor, StoreError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| StoreError::corrupt(format!("cursor: {NOT_UTF8} ({e})")))?;
    cursor(&json("cursor", text)?)
}

/// A JSON array of heads of the refs asked for: a row that cannot be read fails the call.
pub(crate) fn heads(bytes: &[u8]) -> Result<Vec<Head>, StoreError> {
    head_rows(bytes)?.into_iter().collect()
}

/// A JSON array of heads, as a listing takes them: a row that cannot be read (a key or agent
/// this store refuses, a negative sequence) is left out with a warning naming it, so that one
/// damaged row stops no listing of the others (docs/decisions/0020). Reading that one head by
/// its ref ([`heads`]) still fails. `path`, the store's file, names it in the warning.
pub(crate) fn listed_heads(bytes: &[u8], path: &Path) -> Result<Vec<Head>, StoreError> {
    Ok(warned_heads(head_rows(bytes)?, path))
}

/// The heads read, each row that cannot be read logged (`warn!`) as left out, naming the
/// store's file (`path`).
pub(crate) fn warned_heads(rows: Vec<Result<Head, StoreError>>, path: &Path) -> Vec<Head> {
    let mut out = Vec::new();
    for read in rows {
        match read {
            Ok(h) => out.push(h),
            Err(e) => tracing::warn!(
                path = %path.display(),
                error = %awareness_core::error::ErrorChain(&e),
                "ignoring a head row that cannot be read"
            ),
        }
    }
    out
}

/// One head row read on its own (`LIST_HEADS_EACH`): its key and agent as bytes, so that text
/// that is not UTF-8 makes exactly that row unreadable.
pub(crate) fn head_row(
    key: &[u8],
    agent: &[u8],
    last: i64,
    pruned: i64,
    updated_at: i64,
) -> Result<Head, StoreError> {
    let (Ok(k), Ok(a)) = (std::str::from_utf8(key), std::str::from_utf8(agent)) else {
        return Err(StoreError::corrupt(format!(
            "head ({:?}, {:?}): {NOT_UTF8}",
            String::from_utf8_lossy(key),
            String::from_utf8_lossy(agent)
        )));
    };
    let r =
        session_ref(k, a).map_err(|e| StoreError::corrupt(format!("head ({k:?}, {a:?}): {e}")))?;
    head(r, last, pruned, updated_at)
}

/// Each row of a JSON array of heads (bytes, which may not all be UTF-8: [`lossy_text`]), read
/// or why not.
fn head_rows(bytes: &[u8]) -> Result<Vec<Result<Head, StoreError>>, StoreError> {
    let (text, lossy) = lossy_text(bytes);
    let raws = rows("heads", &text, head_fields)?;
    Ok(raws
        .into_iter()
        .map(|RawHead(key, agent, last, pruned, updated_at)| {
            if spoiled(lossy, &[&key, &agent]) {
                return Err(StoreError::corrupt(format!(
                    "head ({key:?}, {agent:?}): {NOT_UTF8}"
                )));
            }
            let r = session_ref(&key, &agent)
                .map_err(|e| StoreError::corrupt(format!("head ({key:?}, {agent:?}): {e}")))?;
            head(r, last, pruned, updated_at)
        })
        .collect())
}

fn head(r: SessionRef, last: i64, pruned: i64, updated_at: i64) -> Result<Head, StoreError> {
    let what = || format!("head {r}");
    Ok(Head {
        last_sequence: sequence_of(last, what)?,
        pruned_max_sequence: sequence_of(pruned, what)?,
        session: r,
        updated_at: Timestamp(updated_at),
    })
}

/// `[last_sequence, pruned_max_sequence, updated_at]` of a known ref.
pub(crate) fn head_of(session: &SessionRef, text: &str) -> Result<Head, StoreError> {
    let (last, pruned, updated_at): (i64, i64, i64) = json("head", text)?;
    let what = || format!("head {session}");
    Ok(Head {
        session: session.clone(),
        last_sequence: sequence_of(last, what)?,
        pruned_max_sequence: sequence_of(pruned, what)?,
        updated_at: Timestamp(updated_at),
    })
}

/// A pruning victim: its stored sequence, and the ref and sequence a watermark is stamped with
/// (`None` for a row this store cannot read).
/// The idle cursors a pruning transaction chose (`sql::PRUNE_CURSORS_CHOOSE`): each row's
/// keys in hex, in key order.
pub(crate) fn chosen_cursors(bytes: &[u8]) -> Result<Vec<(String, String)>, StoreError> {
    let (text, _) = lossy_text(bytes);
    json("idle cursors chosen", &text)
}

pub(crate) type Victim = (i64, Option<(SessionRef, Sequence)>);

/// Pruning victims: `[sequence, key, agent]`, each with its stored sequence and, to stamp a
/// watermark with, its ref and sequence; `None` for a row whose session key or agent this
/// store cannot read (another writer's row: empty, over 1 KiB, a control character), or whose
/// sequence is negative (a row inserted by hand: this store never numbers one so). Such a row
/// is pruned in its turn all the same, by its stored sequence, with no watermark stamped over
/// it (logged): failing instead would fail every pruning pass from then on, and retention would
/// end for good.
///
/// Text that is not UTF-8 is read with U+FFFD ([`lossy_text`]) and not set apart: the stamp
/// goes to the head whose key and agent are exactly the text read, which is the victim's own
/// when its text is UTF-8 (a key may hold U+FFFD), and no head (or, should another session's
/// key be that very text, a watermark too high there: a gap reported that is not one) when it
/// is not. Setting such rows apart would leave a valid key holding U+FFFD unstamped whenever
/// another row of the chunk is not UTF-8: a gap not reported.
///
/// `path`, the store's file, names it in the warning.
pub(crate) fn victims(bytes: &[u8], path: &Path) -> Result<Vec<Victim>, StoreError> {
    let (text, _) = lossy_text(bytes);
    let raws: Vec<(i64, Cow<'_, str>, Cow<'_, str>)> = json("pruning victims", &text)?;
    Ok(raws
        .into_iter()
        .map(|(seq, key, agent)| {
            let stamp = session_ref(&key, &agent).and_then(|r| {
                let s = sequence("pruning victim", seq).map_err(|e| e.to_string())?;
                Ok((r, s))
            });
            match stamp {
                Ok(stamp) => (seq, Some(stamp)),
                Err(error) => {
                    tracing::warn!(
                        path = %path.display(),
                        sequence = seq,
                        session_key = ?key,
                        agent_id = ?agent,
                        error,
                        "pruning deletes an event this store cannot read; no watermark is stamped over it"
                    );
                    (seq, None)
                }
            }
        })
        .collect())
}

/// The heads of pruning victims' refs ([`heads`]), leaving out a head whose ref this store
/// cannot read: its events are pruned without a stamp (see [`victims`]). So are the events of
/// a head row that cannot be read (decision 0020), with a warning naming it: reading that head
/// fails, so no caller is told its history is whole, and failing instead would fail every
/// pruning pass from then on.
/// Text that is not UTF-8 is read as [`victims`] reads it. `path`, the store's file, names it in
/// the warning.
pub(crate) fn victim_heads(bytes: &[u8], path: &Path) -> Result<Vec<Head>, StoreError> {
    let (text, _) = lossy_text(bytes);
    let raws = rows("heads", &text, head_fields)?;
    Ok(raws
        .into_iter()
        .filter_map(|RawHead(key, agent, last, pruned, updated_at)| {
            let r = session_ref(&key, &agent).ok()?;
            head(r, last, pruned, updated_at)
                .inspect_err(|e| {
                    tracing::warn!(
                        path = %path.display(),
                        session_key = %key,
                        agent_id = %agent,
                        error = %awareness_core::error::ErrorChain(e),
                        "pruning deletes events of a session whose head cannot be read; no watermark is stamped"
                    );
                })
                .ok()
        })
        .collect())
}

/// One cursor as the upsert reads it: `[watcher, target, target_agent, last_seen, notified,
/// material, updated_at, provenance]`.
type CursorRow<'a> = (&'a str, &'a str, &'a str, i64, i64, i64, i64, &'a str);

/// The JSON the cursor upsert reads.
pub(crate) fn cursors_json(cursors: &[Cursor]) -> String {
    let rows: Vec<CursorRow<'_>> = cursors
        .iter()
        .map(|c| {
            (
                c.watcher.as_str(),
                c.target.as_str(),
                c.target_agent.as_str(),
                int(c.last_seen),
                int(c.notified),
                int(c.material),
                c.updated_at.millis(),
                c.provenance.as_str(),
            )
        })
        .collect();
    to_json(&rows)
}

/// An event's `fields_json` as the store writes it: `fields_json!`'s values, in its order,
/// serialized here rather than by SQLite's `json_array` in the insert, which cost a group
/// commit about 300 µs a batch of 16 events (12-01, one sqlx connection, 40 interleaved rounds
/// of 50 batches: medians 983-1011 µs against 674-702 µs with the text bound, 653-682 µs with
/// no column). The text may escape differently from `json_array` (serde_json writes `\n`
/// where SQLite may write `\u000a`) but holds the same values, which is all a read needs.
pub(crate) fn fields_json(event: &Event, payload: Option<&str>) -> String {
    to_json(&FieldsRow(
        event.session_id.as_deref(),
        event.kind.as_str(),
        event.actor_type.as_str(),
        event.actor_id.as_deref(),
        event.run_id.as_deref(),
        event.occurred_at.millis(),
        event.summary.as_str(),
        payload,
        event.dedupe_key.as_deref(),
    ))
}

/// `fields_json!`'s values, serialized as a JSON array.
#[derive(serde::Serialize)]
struct FieldsRow<'a>(
    Option<&'a str>,
    &'a str,
    &'a str,
    Option<&'a str>,
    Option<&'a str>,
    i64,
    &'a str,
    Option<&'a str>,
    Option<&'a str>,
);

/// Any serializable value as JSON text (the values here always serialize).
pub(crate) fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| String::from("[]"))
}

/// `link_json!`.
#[derive(Deserialize)]
struct RawLink<'a>(
    #[serde(borrow)] Cow<'a, str>,
    #[serde(borrow)] Cow<'a, str>,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<i64>,
    i64,
    i64,
);

fn link(raw: RawLink<'_>) -> Result<UpstreamLink, StoreError> {
    let RawLink(
        key,
        agent,
        catalog_id,
        host_id,
        thread_id,
        upstream_kind,
        upstream_ref,
        marker,
        last_scanned_at,
        created_at,
        updated_at,
    ) = raw;
    let what = || format!("upstream link ({key:?}, {agent:?})");
    let session =
        session_ref(&key, &agent).map_err(|e| StoreError::corrupt(format!("{}: {e}", what())))?;
    let value = |column: &str, text: Option<String>| {
        text.map(|t| serde_json::from_str::<serde_json::Value>(&t))
            .transpose()
            .map_err(|e| StoreError::corrupt(format!("{}: {column} is not JSON: {e}", what())))
    };
    Ok(UpstreamLink {
        session,
        catalog_id,
        host_id,
        thread_id,
        upstream_kind,
        upstream_ref: value("upstream_ref_json", upstream_ref)?,
        marker: value("last_marker_json", marker)?,
        last_scanned_at: last_scanned_at.map(Timestamp),
        created_at: Timestamp(created_at),
        updated_at: Timestamp(updated_at),
    })
}

/// One link (`link_json!`).
pub(crate) fn one_link(text: &str) -> Result<UpstreamLink, StoreError> {
    link(json("upstream link", text)?)
}

/// A JSON array of links: each one, or the error of a row that cannot be read as a link.
pub(crate) fn links(text: &str) -> Result<Vec<Result<UpstreamLink, StoreError>>, StoreError> {
    let raws: Vec<RawLink<'_>> = json("upstream links", text)?;
    Ok(raws.into_iter().map(link).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sqlx::{Connection, Row, SqliteConnection};

    /// A head row left out of a listing is logged with its cause's words, which a
    /// [`StoreError::Backend`]'s own text leaves out (they are its source), under `error`.
    #[test]
    fn a_head_left_out_is_logged_with_its_cause() {
        let capture = awareness_core::testkit::logs::Capture::default();
        let _guard = capture.install();
        let path = Path::new("/logged/heads.sqlite");
        let cause = std::io::Error::other("disk I/O error");
        let read = vec![Err(StoreError::backend("read heads", cause))];
        assert!(warned_heads(read, path).is_empty());
        let lines: Vec<String> = capture
            .lines()
            .into_iter()
            .filter(|l| l.contains("/logged/heads.sqlite"))
            .collect();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("error=store backend error: read heads: disk I/O error"),
            "{lines:?}"
        );
    }

    /// A pruning victim whose session key this store cannot read is pruned without a
    /// watermark, and that is logged once, naming the file, the row's sequence and its key; a
    /// readable victim is stamped and logs nothing. (What the mutation did: the warning was
    /// left out, and such rows went without a word; review of stop 72, SJ76.) Likewise a
    /// victim's head row that cannot be read (a negative sequence): it is left out, so its
    /// events are pruned without a watermark, logged once naming the session; a readable head
    /// is kept. (What the mutation did: that warning left out; review of stop 72, SJ77.)
    #[test]
    fn victims_pruned_without_a_watermark_are_logged() {
        let capture = awareness_core::testkit::logs::Capture::default();
        let _guard = capture.install();
        let warned = |file: &str| -> Vec<String> {
            let lines: Vec<String> = capture
                .lines()
                .into_iter()
                .filter(|l| l.contains(file))
                .collect();
            assert!(lines.iter().all(|l| l.contains("level=WARN")), "{lines:?}");
            lines
        };
        let path = Path::new("/logged/victims.sqlite");
        let read =
            victims(br#"[[3,"","main"],[4,"agent:main:main","main"]]"#, path).expect("victims");
        assert_eq!(read.len(), 2);
        assert!(read[0].1.is_none(), "{read:?}");
        assert!(read[1].1.is_some(), "{read:?}");
        let lines = warned("/logged/victims.sqlite");
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("no watermark is stamped over it") && lines[0].contains("sequence=3"),
            "{lines:?}"
        );

        let path = Path::new("/logged/victim-heads.sqlite");
        let read = victim_heads(
            br#"[["agent:main:a","main",-5,0,1],["agent:main:b","main",4,0,1]]"#,
            path,
        )
        .expect("heads");
        assert_eq!(read.len(), 1, "{read:?}");
        assert_eq!(read[0].session.session_key.as_str(), "agent:main:b");
        let lines = warned("/logged/victim-heads.sqlite");
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("whose head cannot be read")
                && lines[0].contains("session_key=agent:main:a"),
            "{lines:?}"
        );
    }

    /// Text with what JSON must escape, and anything else.
    fn text() -> impl Strategy<Value = String> {
        let c = prop_oneof![
            Just('"'),
            Just('\\'),
            Just('/'),
            Just('\u{1}'),
            Just('\n'),
            Just('\u{7f}'),
            Just('é'),
            Just('😀'),
            any::<char>(),
        ];
        proptest::collection::vec(c, 0..12).prop_map(String::from_iter)
    }

    /// The JSON SQLite itself writes for those rows (of 12, 9, 7 or 5 columns): every value
    /// goes through SQLite's `json_array`, and the rows through the aggregate the store's
    /// statements use for them (`json_rows!` for events and a page's fields,
    /// `json_group_array` for cursors and heads).
    async fn sqlite_json(conn: &mut SqliteConnection, rows: &[Vec<serde_json::Value>]) -> String {
        const Q12: &str = concat!(
            "SELECT ",
            crate::sql::json_rows!(
                "json_array(value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, \
                 value ->> 5, value ->> 6, value ->> 7, value ->> 8, value ->> 9, value ->> 10, \
                 value ->> 11)",
                "FROM json_each($1) ORDER BY key"
            )
        );
        const Q9: &str = concat!(
            "SELECT ",
            crate::sql::json_rows!(
                "json_array(value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, \
                 value ->> 5, value ->> 6, value ->> 7, value ->> 8)",
                "FROM json_each($1) ORDER BY key"
            )
        );
        const Q8: &str = "SELECT json_group_array(json_array(value ->> 0, value ->> 1, \
            value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6, value ->> 7)) \
            FROM json_each($1)";
        const Q5: &str = "SELECT json_group_array(json_array(value ->> 0, value ->> 1, \
            value ->> 2, value ->> 3, value ->> 4)) FROM json_each($1)";
        let q = match rows.first().map_or(5, Vec::len) {
            12 => Q12,
            9 => Q9,
            8 => Q8,
            _ => Q5,
        };
        sqlx::query(q)
            .bind(serde_json::to_string(rows).unwrap())
            .fetch_one(conn)
            .await
            .unwrap()
            .get(0)
    }

    /// An event row (`event_json!`'s columns) as JSON input for SQLite.
    fn event_row() -> impl Strategy<Value = Vec<serde_json::Value>> {
        (
            any::<i64>(),
            proptest::collection::vec(proptest::option::of(text()), 10),
            any::<i64>(),
        )
            .prop_map(|(seq, texts, at)| {
                let mut v: Vec<serde_json::Value> = texts.into_iter().map(Into::into).collect();
                // Key, agent, kind, actor type and summary are never NULL.
                for i in [0, 2, 3, 4, 7] {
                    if v[i].is_null() {
                        v[i] = "".into();
                    }
                }
                v.insert(0, seq.into());
                v.insert(8, at.into());
                v
            })
    }

    /// A cursor row (`cursor_json!`'s columns).
    fn cursor_row() -> impl Strategy<Value = Vec<serde_json::Value>> {
        (
            text(),
            text(),
            proptest::option::of(text()),
            proptest::collection::vec(any::<i64>(), 4),
            text(),
        )
            .prop_map(|(w, t, a, ints, p)| {
                let mut v: Vec<serde_json::Value> = vec![w.into(), t.into(), a.into()];
                v.extend(ints.into_iter().map(serde_json::Value::from));
                v.push(p.into());
                v
            })
    }

    /// A head row (`head_json!`'s columns).
    fn head_row() -> impl Strategy<Value = Vec<serde_json::Value>> {
        (text(), text(), proptest::collection::vec(any::<i64>(), 3)).prop_map(|(k, a, ints)| {
            let mut v: Vec<serde_json::Value> = vec![k.into(), a.into()];
            v.extend(ints.into_iter().map(serde_json::Value::from));
            v
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// The fast reader reads everything SQLite writes for event, page, cursor and head
        /// rows (it never falls back) and reads it exactly as serde_json does.
        #[test]
        fn fast_rows_read_what_sqlite_writes_as_serde_does(
            events in proptest::collection::vec(event_row(), 0..5),
            cursors in proptest::collection::vec(cursor_row(), 0..5),
            heads in proptest::collection::vec(head_row(), 0..5),
        ) {
            // A page's fields: an event row without its sequence (0), key (1) and agent (3).
            let pages: Vec<Vec<serde_json::Value>> = events
                .iter()
                .map(|r| {
                    let mut a = r.clone();
                    a.remove(3);
                    a.remove(1);
                    a.remove(0);
                    a
                })
                .collect();
            let seqs: Vec<i64> = events.iter().map(|r| r[0].as_i64().unwrap()).collect();
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let [full, page, cursor, head, ints] = rt.block_on(async {
                let mut conn = SqliteConnection::connect("sqlite::memory:").await.unwrap();
                // The page's sequences, as `CHANGES_SINCE` aggregates them.
                let ints: String = sqlx::query(
                    "SELECT json_group_array(value ->> '$') FROM json_each($1)",
                )
                .bind(serde_json::to_string(&seqs).unwrap())
                .fetch_one(&mut conn)
                .await
                .unwrap()
                .get(0);
                [
                    sqlite_json(&mut conn, &events).await,
                    sqlite_json(&mut conn, &pages).await,
                    sqlite_json(&mut conn, &cursors).await,
                    sqlite_json(&mut conn, &heads).await,
                    ints,
                ]
            });
            prop_assert_eq!(fast_ints(&ints), Some(seqs));
            // The fields as the store itself serializes them (`fields_json`) are read by the
            // fast reader too, as serde_json reads them.
            let ours: Vec<String> = events
                .iter()
                .map(|r| {
                    let s = |i: usize| r[i].as_str();
                    to_json(&FieldsRow(
                        s(2), s(4).unwrap_or(""), s(5).unwrap_or(""), s(6), s(7),
                        r[8].as_i64().unwrap(), s(9).unwrap_or(""), s(10), s(11),
                    ))
                })
                .collect();
            let ours = format!("[{}]", ours.join(","));
            let fast = fast_rows(&ours, fields);
            prop_assert!(fast.is_some(), "the fast reader gave up on {ours}");
            let slow: Vec<RawFields<'_>> = json("events", &ours).unwrap();
            prop_assert_eq!(fast.unwrap(), slow);
            let fast = fast_rows(&full, event_fields);
            prop_assert!(fast.is_some(), "the fast reader gave up on {full}");
            let slow: Vec<RawEvent<'_>> = json("events", &full).unwrap();
            prop_assert_eq!(fast.unwrap(), slow);
            let fast = fast_rows(&page, fields);
            prop_assert!(fast.is_some(), "the fast reader gave up on {page}");
            let slow: Vec<RawFields<'_>> = json("events", &page).unwrap();
            prop_assert_eq!(fast.unwrap(), slow);
            let fast = fast_rows(&cursor, cursor_fields);
            prop_assert!(fast.is_some(), "the fast reader gave up on {cursor}");
            let slow: Vec<RawCursor<'_>> = json("cursors", &cursor).unwrap();
            prop_assert_eq!(fast.unwrap(), slow);
            let fast = fast_rows(&head, head_fields);
            prop_assert!(fast.is_some(), "the fast reader gave up on {head}");
            let slow: Vec<RawHead<'_>> = json("heads", &head).unwrap();
            prop_assert_eq!(fast.unwrap(), slow);
        }
    }

    /// The file the warnings of these decodings name.
    fn test_path() -> &'static Path {
        Path::new("test.sqlite")
    }

    #[test]
    fn what_the_fast_reader_gives_up_on_serde_reads_or_reports() {
        let r = SessionRef::parse("agent:main:main", "main").unwrap();
        let row = r#"[[null,"human_direct_message","human",null,null,1,"s",null,null]]"#;
        // An exponent: not the fast reader's; serde_json refuses it as an i64 and says so.
        let text = r#"[[null,"human_direct_message","human",null,null,1e3,"s",null,null]]"#;
        assert!(fast_rows(text, fields).is_none());
        let err = page_events("[7]", text, &r, test_path()).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        assert!(fast_ints("[1e3]").is_none());
        let err = page_events("[1e3]", row, &r, test_path()).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        // Whitespace is read by both.
        let text = " [ [ null , \"human_direct_message\" , \"human\" , null , null , 1 , \"s\" , null , null ] ] ";
        assert!(fast_rows(text, fields).is_some());
        assert!(fast_ints(" [ 7 ] ").is_some());
        assert_eq!(
            page_events(" [ 7 ] ", text, &r, test_path()).unwrap()[0].sequence,
            Sequence(7)
        );
        // Two arrays that do not pair up are a corrupt page, not a shorter one.
        let err = page_events("[7,8]", row, &r, test_path()).unwrap_err();
        assert!(
            err.to_string().contains("2 sequences and 1 events"),
            "{err}"
        );
        assert!(page_events("[]", "[]", &r, test_path()).unwrap().is_empty());
    }
}
