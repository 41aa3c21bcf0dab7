//! Turning the JSON values the statements build back into core types, and core types into the
//! JSON the write statements read. Anything a stored row cannot be is a
//! [`StoreError::Corrupt`] naming the row.

use std::borrow::Cow;
use std::sync::Arc;

use awareness_core::{
    ActorType, AgentId, Cursor, Event, EventKind, Head, Payload, Sequence, SessionKey, SessionRef,
    StoreError, Timestamp, UpstreamLink, WatcherKey,
};
use serde::Deserialize;

/// `json_array(sequence, session_key, session_id, agent_id, kind, actor_type, actor_id, run_id,
/// occurred_at, summary, payload_json, dedupe_key)`.
#[derive(Deserialize)]
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

/// A page's event, whose key and agent are the page's: `json_array(sequence, session_id, kind,
/// actor_type, actor_id, run_id, occurred_at, summary, payload_json, dedupe_key)`.
#[derive(Deserialize)]
struct RawPageEvent<'a>(
    i64,
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

/// `json_array(watcher, target, target_agent_id, last_seen, notified, material, updated_at)`.
#[derive(Deserialize)]
struct RawCursor<'a>(
    #[serde(borrow)] Cow<'a, str>,
    #[serde(borrow)] Cow<'a, str>,
    #[serde(borrow)] Option<Cow<'a, str>>,
    i64,
    i64,
    i64,
    i64,
);

/// `json_array(session_key, agent_id, last_sequence, pruned_max_sequence, updated_at)`.
#[derive(Deserialize)]
struct RawHead<'a>(
    #[serde(borrow)] Cow<'a, str>,
    #[serde(borrow)] Cow<'a, str>,
    i64,
    i64,
    i64,
);

fn json<'a, T: Deserialize<'a>>(what: &str, text: &'a str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
        context: format!("{what}: unreadable row set"),
        source: Some(Box::new(e)),
    })
}

/// A stored sequence (never negative).
pub(crate) fn sequence(what: &str, v: i64) -> Result<Sequence, StoreError> {
    u64::try_from(v)
        .map(Sequence)
        .map_err(|_| StoreError::corrupt(format!("{what}: negative sequence {v}")))
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

fn event(raw: RawEvent<'_>) -> Result<Event, StoreError> {
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
    let r = session_ref(&key, &agent)
        .map_err(|why| StoreError::corrupt(format!("event {seq}: {why}")))?;
    build_event(
        r,
        RawPageEvent(
            seq,
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
    )
}

fn build_event(r: SessionRef, raw: RawPageEvent<'_>) -> Result<Event, StoreError> {
    let RawPageEvent(
        seq,
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
    let bad = |why: String| StoreError::corrupt(format!("event {seq}: {why}"));
    let payload = match payload {
        None => None,
        Some(text) => Some(
            serde_json::from_str::<Payload>(&text)
                .map_err(|e| bad(format!("payload_json is not a JSON object: {e}")))?,
        ),
    };
    Ok(Event {
        sequence: sequence("event", seq)?,
        session_key: r.session_key,
        session_id,
        agent_id: r.agent_id,
        kind: EventKind::parse(&kind).map_err(|e| bad(e.to_string()))?,
        actor_type: ActorType::parse(&actor_type).map_err(|e| bad(e.to_string()))?,
        actor_id,
        run_id,
        occurred_at: Timestamp(occurred_at),
        summary,
        payload,
        dedupe_key,
    })
}

/// The events of one ref's page (`page_event_json!`), in ascending sequence order.
pub(crate) fn page_events(text: &str, session: &SessionRef) -> Result<Vec<Arc<Event>>, StoreError> {
    let raws: Vec<RawPageEvent<'_>> = json("events", text)?;
    let mut out = raws
        .into_iter()
        .map(|raw| build_event(session.clone(), raw).map(Arc::new))
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

/// One event (`event_json!`).
pub(crate) fn one_event(text: &str) -> Result<Event, StoreError> {
    event(json("event", text)?)
}

/// A JSON array of events (`event_json!`), in ascending sequence order.
pub(crate) fn events(text: &str) -> Result<Vec<Arc<Event>>, StoreError> {
    let raws: Vec<RawEvent<'_>> = json("events", text)?;
    let mut out = raws
        .into_iter()
        .map(|raw| event(raw).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    ascending(&mut out);
    Ok(out)
}

fn cursor(raw: RawCursor<'_>) -> Result<Option<Cursor>, StoreError> {
    let RawCursor(watcher, target, target_agent, last_seen, notified, material, updated_at) = raw;
    let where_ = || format!("cursor ({watcher:?}, {target:?})");
    let Ok(watcher_key) = WatcherKey::parse(&watcher) else {
        // Only agent-qualified keys can watch (DESIGN.md section 2). A row that breaks this was
        // not written by us or by OpenClaw's own checks; it is left in the file untouched and
        // ignored, so one bad row cannot stop recording on its target.
        tracing::warn!(
            watcher = %watcher,
            target = %target,
            "ignoring a watch cursor whose watcher key is not agent-qualified"
        );
        return Ok(None);
    };
    let target_key = SessionKey::new(&*target)
        .map_err(|e| StoreError::corrupt(format!("{}: target key: {e}", where_())))?;
    let target_agent = match target_agent {
        Some(a) => AgentId::new(&*a)
            .map_err(|e| StoreError::corrupt(format!("{}: target agent: {e}", where_())))?,
        // A row OpenClaw wrote: it has no target agent column.
        None => Cursor::default_target_agent(&watcher_key, &target_key),
    };
    let what = where_();
    Ok(Some(Cursor {
        watcher: watcher_key,
        target: target_key,
        target_agent,
        last_seen: sequence(&what, last_seen)?,
        notified: sequence(&what, notified)?,
        material: sequence(&what, material)?,
        updated_at: Timestamp(updated_at),
    }))
}

/// A JSON array of cursors (rows with a bare watcher key are skipped with a warning).
pub(crate) fn cursors(text: &str) -> Result<Vec<Cursor>, StoreError> {
    let raws: Vec<RawCursor<'_>> = json("cursors", text)?;
    let mut out = Vec::with_capacity(raws.len());
    for raw in raws {
        out.extend(cursor(raw)?);
    }
    Ok(out)
}

/// One cursor (`cursor_json!`).
pub(crate) fn one_cursor(text: &str) -> Result<Option<Cursor>, StoreError> {
    cursor(json("cursor", text)?)
}

/// A JSON array of heads.
pub(crate) fn heads(text: &str) -> Result<Vec<Head>, StoreError> {
    let raws: Vec<RawHead<'_>> = json("heads", text)?;
    raws.into_iter()
        .map(|RawHead(key, agent, last, pruned, updated_at)| {
            let r = session_ref(&key, &agent)
                .map_err(|e| StoreError::corrupt(format!("head ({key:?}, {agent:?}): {e}")))?;
            let what = format!("head {r}");
            Ok(Head {
                last_sequence: sequence(&what, last)?,
                pruned_max_sequence: sequence(&what, pruned)?,
                session: r,
                updated_at: Timestamp(updated_at),
            })
        })
        .collect()
}

/// `[last_sequence, pruned_max_sequence, updated_at]` of a known ref.
pub(crate) fn head_of(session: &SessionRef, text: &str) -> Result<Head, StoreError> {
    let (last, pruned, updated_at): (i64, i64, i64) = json("head", text)?;
    let what = format!("head {session}");
    Ok(Head {
        session: session.clone(),
        last_sequence: sequence(&what, last)?,
        pruned_max_sequence: sequence(&what, pruned)?,
        updated_at: Timestamp(updated_at),
    })
}

/// Pruning victims: `[sequence, key, agent]`.
pub(crate) fn victims(text: &str) -> Result<Vec<(Sequence, SessionRef)>, StoreError> {
    let raws: Vec<(i64, Cow<'_, str>, Cow<'_, str>)> = json("pruning victims", text)?;
    raws.into_iter()
        .map(|(seq, key, agent)| {
            let r = session_ref(&key, &agent)
                .map_err(|e| StoreError::corrupt(format!("event {seq}: {e}")))?;
            Ok((sequence("event", seq)?, r))
        })
        .collect()
}

/// The JSON the cursor upsert reads.
pub(crate) fn cursors_json(cursors: &[Cursor]) -> String {
    let rows: Vec<(&str, &str, &str, i64, i64, i64, i64)> = cursors
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
            )
        })
        .collect();
    to_json(&rows)
}

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

/// A JSON array of links.
pub(crate) fn links(text: &str) -> Result<Vec<UpstreamLink>, StoreError> {
    let raws: Vec<RawLink<'_>> = json("upstream links", text)?;
    raws.into_iter().map(link).collect()
}
