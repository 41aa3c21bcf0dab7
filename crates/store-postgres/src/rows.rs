//! The statements that read and write rows, and the reading of rows into the core's types.
//!
//! A row is read as the other durable stores read theirs (decisions 0013, 0016, 0017, 0020):
//! an empty optional text is absent, a payload that is not a JSON object is left out with a
//! warning, a kind this version does not know is kept as spelled; a row that breaks an
//! invariant (a negative sequence, a key that is not one, an actor type no event has) is
//! [`StoreError::Corrupt`] naming it, and is left out, with a warning, of every read of many
//! cursors, heads or links.

use std::sync::Arc;

use awareness_core::reconcile::{self, ChangesPage};
use awareness_core::upstream::UpstreamLink;
use awareness_core::{
    ActorType, AgentId, Cursor, Event, EventKind, Head, Payload, Sequence, SessionKey, SessionRef,
    StoreError, Timestamp, WatchProvenance, WatcherKey,
};
use sqlx::Row as _;
use sqlx::postgres::PgRow;

/// Tells the listeners of the database that the store's commit count moved, as the
/// counter's update returns it: `NOTIFY` on [`CHANNEL`] with the store's schema and the
/// handle's id as payload, `<schema> <id>` (the search path is the schema's, so the current
/// schema is the store's; the id is the session's `session_awareness.handle`,
/// [`crate::hints::HANDLE_SETTING`]). The server delivers it when the transaction commits,
/// and not at all when it rolls back; a statement that moves no counter row notifies nothing.
macro_rules! notify {
    () => {
        "pg_notify('session_awareness', \
         current_schema() || ' ' || coalesce(current_setting('session_awareness.handle', true), ''))"
    };
}

/// The channel [`notify!`] notifies on, one for every store of the database (the payload
/// tells them apart).
pub(crate) const CHANNEL: &str = "session_awareness";

/// An event row's columns, in the order [`Rows::event`] reads them.
macro_rules! event_columns {
    () => {
        "sequence, dedupe_key, session_key, session_id, agent_id, kind, actor_type, actor_id, \
         run_id, occurred_at, summary, payload_json"
    };
}

/// At most `$2` events after `$1`, in order.
pub(crate) const EVENTS_AFTER: &str = concat!(
    "SELECT ",
    event_columns!(),
    " FROM session_state_events WHERE sequence > $1 ORDER BY sequence LIMIT $2"
);

/// A cursor row's columns, in the order [`Rows::cursor`] reads them.
macro_rules! cursor_columns {
    () => {
        "watcher_session_key, target_session_key, target_agent_id, last_seen_sequence, \
         notified_sequence, material_sequence, updated_at, provenance"
    };
}

/// A head row's columns, in the order [`Rows::head`] reads them.
macro_rules! head_columns {
    () => {
        "session_key, agent_id, last_sequence, pruned_max_sequence, updated_at"
    };
}

/// A link row's columns, in the order [`Rows::link`] reads them.
macro_rules! link_columns {
    () => {
        "session_key, agent_id, catalog_id, host_id, thread_id, upstream_kind, \
         upstream_ref_json, last_marker_json, last_scanned_at, created_at, updated_at"
    };
}

/// Writes the cursors of the eight arrays bound to the given placeholders (watcher, target,
/// target agent, last seen, notified, material, updated at, provenance), as the protocol
/// decided them; `watcher_store_path` keeps its value. Shared by [`UPSERT_CURSORS`] and
/// [`RECORD_WRITE`].
macro_rules! upsert_cursors {
    ($w:literal, $t:literal, $a:literal, $l:literal, $n:literal, $m:literal, $u:literal, $p:literal) => {
        concat!(
            "INSERT INTO session_watch_cursors (watcher_session_key, target_session_key,
  target_agent_id, last_seen_sequence, notified_sequence, material_sequence, updated_at,
  provenance)
SELECT * FROM unnest(",
            $w,
            "::text[], ",
            $t,
            "::text[], ",
            $a,
            "::text[], ",
            $l,
            "::bigint[], ",
            $n,
            "::bigint[], ",
            $m,
            "::bigint[], ",
            $u,
            "::bigint[], ",
            $p,
            "::text[])
ON CONFLICT (watcher_session_key, target_session_key) DO UPDATE SET
  target_agent_id = excluded.target_agent_id,
  last_seen_sequence = excluded.last_seen_sequence,
  notified_sequence = excluded.notified_sequence,
  material_sequence = excluded.material_sequence,
  updated_at = excluded.updated_at,
  provenance = excluded.provenance"
        )
    };
}

/// What a recording reads, under the store's lock, in one statement: a row per cursor on the
/// target key `$3` (one row when there is none), each with the counter moved by one
/// (column 0, NULL when it is at `$1`, the store's end; with the commit count moved too), the
/// counter as it was (1), the stored event of the dedupe key `$2` (2-13, NULL when none), the
/// head of the ref (`$3`, `$4`; 14-17, the last one true when there is a head), the cursor
/// (18-25, NULL when none), the transaction's id and its session's ([`RECORD_XID`]). The
/// counter row's update, in a CTE, is the one write: the reads see the rows as the
/// transactions before this one left them (the lock was taken before this statement, whose
/// snapshot is taken after it).
pub(crate) const RECORD_READ: &str = concat!(
    "WITH moved AS (
  UPDATE session_state_counter SET last_sequence = last_sequence + 1, commits = commits + 1
  WHERE id = 0 AND last_sequence < $1 RETURNING last_sequence, ",
    notify!(),
    ")
SELECT (SELECT last_sequence FROM moved), k.last_sequence, e.*, h.*, c.*, txid_current(),
  pg_backend_pid()
FROM session_state_counter AS k
LEFT JOIN LATERAL (SELECT ",
    event_columns!(),
    " FROM session_state_events WHERE dedupe_key = $2) AS e ON true
LEFT JOIN LATERAL (SELECT last_sequence, pruned_max_sequence, updated_at, true AS found
  FROM session_state_heads WHERE session_key = $3 AND agent_id = $4) AS h ON true
LEFT JOIN LATERAL (SELECT ",
    cursor_columns!(),
    " FROM session_watch_cursors WHERE target_session_key = $3) AS c ON true
WHERE k.id = 0"
);

/// The column of [`RECORD_READ`] that holds the transaction's id (`txid_current()`), which
/// tells after a lost `COMMIT` whether it committed ([`COMMIT_STATUS`]); the next holds the
/// process id of its session (`pg_backend_pid()`, [`END_LOST_COMMIT`]).
pub(crate) const RECORD_XID: usize = 26;

/// What a recording writes, in one statement: the event (`$1`-`$12`, its number given), its
/// ref's head as the protocol decided it (`$13`-`$17`) and the cursors the protocol moved (the
/// arrays `$18`-`$25`, as [`UPSERT_CURSORS`]; empty ones write none).
pub(crate) const RECORD_WRITE: &str = concat!(
    "WITH event AS (
  INSERT INTO session_state_events (sequence, dedupe_key, session_key, session_id, agent_id,
    kind, actor_type, actor_id, run_id, occurred_at, summary, payload_json)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)),
head AS (
  INSERT INTO session_state_heads (session_key, agent_id, last_sequence, pruned_max_sequence,
    updated_at) VALUES ($13, $14, $15, $16, $17)
  ON CONFLICT (session_key, agent_id) DO UPDATE SET last_sequence = excluded.last_sequence,
    pruned_max_sequence = excluded.pruned_max_sequence, updated_at = excluded.updated_at),
cursors AS (",
    upsert_cursors!("$18", "$19", "$20", "$21", "$22", "$23", "$24", "$25"),
    ")
SELECT 1"
);

/// The columns of an event row, as NULLs of their types (a row of [`GROUP_READ`] that holds
/// no event).
macro_rules! no_event {
    () => {
        "NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, \
         NULL::text, NULL::text, NULL::bigint, NULL::text, NULL::text"
    };
}

/// The head columns of [`GROUP_READ`] (ref, last sequence, watermark, time, found), as NULLs.
macro_rules! no_head {
    () => {
        "NULL::text, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint, NULL::boolean"
    };
}

/// The columns of a cursor row, as NULLs of their types.
macro_rules! no_cursor {
    () => {
        "NULL::text, NULL::text, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint, \
         NULL::bigint, NULL::text"
    };
}

/// What a batch of `$2` recordings (group commit) reads, under the store's lock, in one
/// statement, as [`RECORD_READ`] does for one: the counter moved by `$2` (column 0, NULL when
/// fewer than `$2` numbers are left before `$1`, the store's end; with the commit count moved
/// by one), the counter as it was (1), then a row per thing read, each holding one of: a
/// stored event of one of the dedupe keys `$3` (columns 2-13, as [`event_columns!`]), the head
/// of one of the refs `($4[i], $5[i])` (14-19: key, agent, last sequence, watermark, time,
/// `true`), a cursor on one of the keys `$4` (20-27, as [`cursor_columns!`]); one row with
/// none of them when there is nothing to read. Every row ends with the transaction's id and
/// its session's ([`GROUP_XID`]).
pub(crate) const GROUP_READ: &str = concat!(
    "WITH moved AS (
  UPDATE session_state_counter SET last_sequence = last_sequence + $2, commits = commits + 1
  WHERE id = 0 AND last_sequence <= $1 - $2 RETURNING last_sequence, ",
    notify!(),
    ")
SELECT (SELECT last_sequence FROM moved), k.last_sequence, x.*, txid_current(), pg_backend_pid()
FROM session_state_counter AS k
LEFT JOIN LATERAL (
  SELECT ",
    event_columns!(),
    ", ",
    no_head!(),
    ", ",
    no_cursor!(),
    "
  FROM session_state_events WHERE dedupe_key = ANY($3::text[])
  UNION ALL
  SELECT ",
    no_event!(),
    ", session_key, agent_id, last_sequence, pruned_max_sequence, updated_at, true, ",
    no_cursor!(),
    "
  FROM session_state_heads
  WHERE (session_key, agent_id) IN (SELECT * FROM unnest($4::text[], $5::text[]))
  UNION ALL
  SELECT ",
    no_event!(),
    ", ",
    no_head!(),
    ", ",
    cursor_columns!(),
    "
  FROM session_watch_cursors WHERE target_session_key = ANY($4::text[])) AS x ON true
WHERE k.id = 0"
);

/// The column of [`GROUP_READ`] that holds the transaction's id, then its session's, as
/// [`RECORD_XID`].
pub(crate) const GROUP_XID: usize = 28;

/// Whether the transaction of id `$1` committed (`committed`, `aborted`, `in progress`; NULL
/// when it is too old for the server to tell): asked after the answer to its `COMMIT` was
/// lost.
pub(crate) const COMMIT_STATUS: &str = "SELECT txid_status($1)";

/// Ends the session `$2` when it still runs the transaction of id `$1` and waits for its
/// client (a `COMMIT` that never reached the server, on a connection the server has not seen
/// gone: a half-open TCP connection, say): its transaction then rolls back for good, and
/// [`COMMIT_STATUS`] tells so. The session is named by its process id and the transaction it
/// runs (its 32-bit id) together, since either alone may have gone to another session by then
/// (a process id once the session ended, a transaction id after a server restart). A session
/// busy with the `COMMIT` (waiting for a synchronous standby, say) is left to finish it, and
/// so is every session when the server tracks no state (`track_activities` off).
pub(crate) const END_LOST_COMMIT: &str =
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE pid = $2 AND backend_xid::text::bigint = $1 % 4294967296
  AND state LIKE 'idle in transaction%'";

/// How many of the events `($1[i], $2[i], $3[i], $4[i], $5[i])` (sequence, key, agent, time,
/// summary) the log holds as they are: after a lost `COMMIT` that [`COMMIT_STATUS`] says
/// committed, whether the rows are the transaction's own (after a server restart, its id may
/// have been given to another transaction, which took the same numbers).
pub(crate) const EVENTS_AS_WRITTEN: &str = "SELECT count(*) FROM session_state_events
WHERE (sequence, session_key, agent_id, occurred_at, summary) IN
  (SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::text[]))";

/// What a batch of recordings writes, in one statement: the events it stored (the arrays
/// `$1`-`$12`, one element per event, in [`event_columns!`]'s order), the heads of their refs
/// as the protocol left them (`$13`-`$17`: key, agent, last sequence, watermark, time; one per
/// ref) and the cursors it moved (`$18`-`$25`, as [`UPSERT_CURSORS`]; one per cursor).
pub(crate) const GROUP_WRITE: &str = concat!(
    "WITH events AS (
  INSERT INTO session_state_events (",
    event_columns!(),
    ")
  SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
    $7::text[], $8::text[], $9::text[], $10::bigint[], $11::text[], $12::text[])),
heads AS (
  INSERT INTO session_state_heads (",
    head_columns!(),
    ")
  SELECT * FROM unnest($13::text[], $14::text[], $15::bigint[], $16::bigint[], $17::bigint[])
  ON CONFLICT (session_key, agent_id) DO UPDATE SET last_sequence = excluded.last_sequence,
    pruned_max_sequence = excluded.pruned_max_sequence, updated_at = excluded.updated_at),
cursors AS (",
    upsert_cursors!("$18", "$19", "$20", "$21", "$22", "$23", "$24", "$25"),
    ")
SELECT 1"
);

/// Counts a write transaction in the store-wide commit count (`foreign_commits`), and
/// notifies the other handles ([`notify!`]); answers the transaction's id and its session's
/// (columns 0 and 1, as [`crate::store::TxId::at`] reads them), asked about when the answer
/// to its `COMMIT` is lost.
pub(crate) const COUNT_COMMIT: &str = concat!(
    "UPDATE session_state_counter SET commits = commits + 1 WHERE id = 0 \
     RETURNING txid_current(), pg_backend_pid(), ",
    notify!()
);

/// One ref's head.
pub(crate) const HEAD: &str = concat!(
    "SELECT ",
    head_columns!(),
    " FROM session_state_heads WHERE session_key = $1 AND agent_id = $2"
);

/// The heads of the refs `($1[i], $2[i])`.
pub(crate) const HEADS: &str = concat!(
    "SELECT ",
    head_columns!(),
    " FROM session_state_heads
WHERE (session_key, agent_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))"
);

/// Every head, or those of the agent `$1`, by ref.
pub(crate) const LIST_HEADS: &str = concat!(
    "SELECT ",
    head_columns!(),
    " FROM session_state_heads WHERE $1::text IS NULL OR agent_id = $1
ORDER BY session_key, agent_id"
);

/// The reconcile page in one statement (one snapshot): a row per event of the ref (`$1`,
/// `$2`) after `$3`, at most `$4`, in order, each beside the ref's head (columns 0-3, the
/// fourth true when there is a head) and its smallest retained sequence above 0 (column 4);
/// one row with no event when there is none.
pub(crate) const CHANGES_SINCE: &str = concat!(
    "SELECT h.last_sequence, h.pruned_max_sequence, h.updated_at, h.found, m.least, e.*
FROM (SELECT min(sequence) AS least FROM session_state_events
      WHERE session_key = $1 AND agent_id = $2 AND sequence > 0) AS m
LEFT JOIN LATERAL (SELECT last_sequence, pruned_max_sequence, updated_at, true AS found
      FROM session_state_heads WHERE session_key = $1 AND agent_id = $2) AS h ON true
LEFT JOIN LATERAL (SELECT ",
    event_columns!(),
    "
      FROM session_state_events WHERE session_key = $1 AND agent_id = $2 AND sequence > $3
      ORDER BY sequence LIMIT $4) AS e ON true
ORDER BY e.sequence"
);

/// One cursor.
pub(crate) const CURSOR: &str = concat!(
    "SELECT ",
    cursor_columns!(),
    " FROM session_watch_cursors WHERE watcher_session_key = $1 AND target_session_key = $2"
);

/// The cursors of the keys `($1[i], $2[i])`.
pub(crate) const CURSORS_OF_KEYS: &str = concat!(
    "SELECT ",
    cursor_columns!(),
    " FROM session_watch_cursors
WHERE (watcher_session_key, target_session_key) IN (SELECT * FROM unnest($1::text[], $2::text[]))"
);

/// The cursors on the key `$1` and, when `$2`, those of `$1` as a watcher.
pub(crate) const CURSORS_OF_SESSION: &str = concat!(
    "SELECT ",
    cursor_columns!(),
    " FROM session_watch_cursors
WHERE target_session_key = $1 OR ($2 AND watcher_session_key = $1)"
);

/// Deletes the cursors `($1[i], $2[i])`.
pub(crate) const DELETE_CURSORS: &str = "DELETE FROM session_watch_cursors
WHERE (watcher_session_key, target_session_key) IN (SELECT * FROM unnest($1::text[], $2::text[]))";

/// The cursors of the watcher `$1` (any when NULL) on the target `$2` (any when NULL), only
/// the pending ones when `$3`, by watcher then target.
pub(crate) const CURSORS: &str = concat!(
    "SELECT ",
    cursor_columns!(),
    " FROM session_watch_cursors
WHERE ($1::text IS NULL OR watcher_session_key = $1)
  AND ($2::text IS NULL OR target_session_key = $2)
  AND (NOT $3 OR material_sequence > last_seen_sequence)
ORDER BY watcher_session_key, target_session_key"
);

/// Writes the cursors of the arrays `$1`-`$8` (watcher, target, target agent, last seen,
/// notified, material, updated at, provenance); `watcher_store_path` keeps its value.
pub(crate) const UPSERT_CURSORS: &str =
    upsert_cursors!("$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8");

/// Deletes at most `$2` cursors not updated since `$1`.
pub(crate) const PRUNE_CURSORS: &str = "DELETE FROM session_watch_cursors WHERE ctid IN (
  SELECT ctid FROM session_watch_cursors WHERE updated_at < $1 LIMIT $2)";

/// The oldest `$2` events that occurred before `$1`: sequence, key, agent.
pub(crate) const AGE_VICTIMS: &str = "SELECT sequence, session_key, agent_id
FROM session_state_events WHERE occurred_at < $1 ORDER BY sequence LIMIT $2";

/// The events retained.
pub(crate) const ROW_COUNT: &str = "SELECT count(*) FROM session_state_events";

/// The `$1` lowest events: sequence, key, agent.
pub(crate) const CAP_VICTIMS: &str = "SELECT sequence, session_key, agent_id
FROM session_state_events ORDER BY sequence LIMIT $1";

/// Writes the pruned watermark `$3[i]` and the time `$4[i]` of the heads `($1[i], $2[i])`, as
/// `awareness_core::retention::stamp` decided them.
pub(crate) const STAMP_HEADS: &str = "UPDATE session_state_heads AS h
SET pruned_max_sequence = v.mark, updated_at = v.updated_at
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS v(key, agent, mark, updated_at)
WHERE h.session_key = v.key AND h.agent_id = v.agent";

/// One ref's link.
pub(crate) const LINK: &str = concat!(
    "SELECT ",
    link_columns!(),
    " FROM session_upstream_links WHERE session_key = $1 AND agent_id = $2"
);

/// Every link, by ref.
pub(crate) const LINKS: &str = concat!(
    "SELECT ",
    link_columns!(),
    " FROM session_upstream_links ORDER BY session_key, agent_id"
);

/// Writes a whole link.
pub(crate) const PUT_LINK: &str = "INSERT INTO session_upstream_links (session_key, agent_id,
  catalog_id, host_id, thread_id, upstream_kind, upstream_ref_json, last_marker_json,
  last_scanned_at, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (session_key, agent_id) DO UPDATE SET catalog_id = excluded.catalog_id,
  host_id = excluded.host_id, thread_id = excluded.thread_id,
  upstream_kind = excluded.upstream_kind, upstream_ref_json = excluded.upstream_ref_json,
  last_marker_json = excluded.last_marker_json, last_scanned_at = excluded.last_scanned_at,
  created_at = excluded.created_at, updated_at = excluded.updated_at";

/// Reads rows of one store, named in errors and warnings.
pub(crate) struct Rows<'a> {
    pub store: &'a str,
}

fn get<'r, T>(row: &'r PgRow, i: usize, what: &dyn Fn() -> String) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(i)
        .map_err(|e| StoreError::corrupt(format!("{}: column {i}: {e}", what())))
}

impl Rows<'_> {
    pub(crate) fn corrupt(&self, what: &str, why: impl std::fmt::Display) -> StoreError {
        StoreError::corrupt(format!("{}: {what}: {why}", self.store))
    }

    /// A stored sequence (never negative).
    pub(crate) fn sequence(&self, what: &str, v: i64) -> Result<Sequence, StoreError> {
        u64::try_from(v)
            .map(Sequence)
            .map_err(|_| self.corrupt(what, format_args!("negative sequence {v}")))
    }

    /// The event of [`event_columns!`].
    pub(crate) fn event(&self, row: &PgRow) -> Result<Event, StoreError> {
        self.event_at(row, 0)
    }

    /// The event of [`event_columns!`] from column `at` on.
    pub(crate) fn event_at(&self, row: &PgRow, at: usize) -> Result<Event, StoreError> {
        let seq: i64 = get(row, at, &|| format!("{}: an event row", self.store))?;
        let what = || format!("{}: event {seq}", self.store);
        let text = |i: usize| get::<Option<String>>(row, at + i, &what);
        let key: String = get(row, at + 2, &what)?;
        let agent: String = get(row, at + 4, &what)?;
        let bad = |why: String| StoreError::corrupt(format!("{}: {why}", what()));
        let session = SessionRef::parse(&key, &agent).map_err(|e| bad(e.to_string()))?;
        let sequence = self.sequence(&format!("event {seq}"), seq)?;
        let present = |v: Option<String>| v.filter(|s| !s.is_empty());
        let kind: String = get(row, at + 5, &what)?;
        let actor_type: String = get(row, at + 6, &what)?;
        let actor_type = ActorType::parse(&actor_type).map_err(|e| bad(e.to_string()))?;
        let payload = match text(11)?.filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => match serde_json::from_str::<Payload>(&t) {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(store = %self.store, sequence = seq, error = %e, "an event's payload_json is not a JSON object; the event is read without it");
                    None
                }
            },
        };
        Ok(Event {
            sequence,
            session_key: session.session_key,
            session_id: present(text(3)?),
            agent_id: session.agent_id,
            kind: EventKind::from_stored(&kind),
            actor_type,
            actor_id: present(text(7)?),
            run_id: present(text(8)?),
            occurred_at: Timestamp(get(row, at + 9, &what)?),
            summary: get(row, at + 10, &what)?,
            payload,
            dedupe_key: text(1)?,
        })
    }

    /// The rows of [`CHANGES_SINCE`] as a page.
    pub(crate) fn page(
        &self,
        session: &SessionRef,
        after: Sequence,
        limit: usize,
        rows: &[PgRow],
    ) -> Result<ChangesPage, StoreError> {
        let what = || format!("{}: the page of {session}", self.store);
        let Some(first) = rows.first() else {
            return Err(StoreError::corrupt(format!("{}: no row", what())));
        };
        let head = self.head_at(session, first, 0)?;
        let least = get::<Option<i64>>(first, 4, &what)?
            .map(|s| self.sequence(&format!("an event of {session}"), s))
            .transpose()?;
        let mut events = Vec::with_capacity(rows.len());
        for r in rows {
            if get::<Option<i64>>(r, 5, &what)?.is_some() {
                events.push(Arc::new(self.event_at(r, 5)?));
            }
        }
        Ok(reconcile::build_page(
            after,
            head.as_ref(),
            least,
            events,
            limit,
        ))
    }

    /// The head of `session` from the columns `at` on: last sequence, pruned watermark, time,
    /// and `true` when there is a head (NULL when the row was left-joined to none).
    pub(crate) fn head_at(
        &self,
        session: &SessionRef,
        row: &PgRow,
        at: usize,
    ) -> Result<Option<Head>, StoreError> {
        let name = format!("the head of {session}");
        let what = || format!("{}: {name}", self.store);
        if get::<Option<bool>>(row, at + 3, &what)?.is_none() {
            return Ok(None);
        }
        Ok(Some(Head {
            session: session.clone(),
            last_sequence: self.sequence(&name, get(row, at, &what)?)?,
            pruned_max_sequence: self.sequence(&name, get(row, at + 1, &what)?)?,
            updated_at: Timestamp(get(row, at + 2, &what)?),
        }))
    }

    /// The cursor of [`cursor_columns!`].
    pub(crate) fn cursor(&self, row: &PgRow) -> Result<Cursor, StoreError> {
        self.cursor_at(row, 0)
    }

    /// The cursor of [`cursor_columns!`] from column `at` on.
    pub(crate) fn cursor_at(&self, row: &PgRow, at: usize) -> Result<Cursor, StoreError> {
        let watcher: String = get(row, at, &|| format!("{}: a cursor row", self.store))?;
        let target: String = get(row, at + 1, &|| format!("{}: a cursor row", self.store))?;
        let name = format!("cursor ({watcher:?}, {target:?})");
        let what = || format!("{}: {name}", self.store);
        let watcher = WatcherKey::parse(&watcher).map_err(|e| self.corrupt(&name, e))?;
        let target = SessionKey::new(&target).map_err(|e| self.corrupt(&name, e))?;
        let target_agent = match get::<Option<String>>(row, at + 2, &what)? {
            Some(a) => AgentId::new(&a).map_err(|e| self.corrupt(&name, e))?,
            None => Cursor::default_target_agent(&watcher, &target),
        };
        let provenance: String = get(row, at + 7, &what)?;
        let provenance = WatchProvenance::from_stored(&provenance)
            .ok_or_else(|| self.corrupt(&name, format_args!("provenance {provenance:?}")))?;
        Ok(Cursor {
            last_seen: self.sequence(&name, get(row, at + 3, &what)?)?,
            notified: self.sequence(&name, get(row, at + 4, &what)?)?,
            material: self.sequence(&name, get(row, at + 5, &what)?)?,
            updated_at: Timestamp(get(row, at + 6, &what)?),
            watcher,
            target,
            target_agent,
            provenance,
        })
    }

    /// The cursors of `rows` that can be read; the others are left out with a warning.
    pub(crate) fn readable_cursors(&self, rows: &[PgRow]) -> Vec<Cursor> {
        self.readable_cursors_at(rows, 0)
    }

    /// [`Rows::readable_cursors`] of the cursor columns from `at` on, in rows that may have
    /// none (their watcher NULL).
    pub(crate) fn readable_cursors_at(&self, rows: &[PgRow], at: usize) -> Vec<Cursor> {
        rows.iter()
            .filter(|r| matches!(r.try_get::<Option<String>, _>(at), Ok(Some(_))))
            .filter_map(|r| match self.cursor_at(r, at) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(error = %e, "a cursor row this store cannot read is left out");
                    None
                }
            })
            .collect()
    }

    /// The head of [`head_columns!`].
    pub(crate) fn head(&self, row: &PgRow) -> Result<Head, StoreError> {
        let key: String = get(row, 0, &|| format!("{}: a head row", self.store))?;
        let agent: String = get(row, 1, &|| format!("{}: a head row", self.store))?;
        let name = format!("the head of ({key:?}, {agent:?})");
        let what = || format!("{}: {name}", self.store);
        let session = SessionRef::parse(&key, &agent).map_err(|e| self.corrupt(&name, e))?;
        Ok(Head {
            session,
            last_sequence: self.sequence(&name, get(row, 2, &what)?)?,
            pruned_max_sequence: self.sequence(&name, get(row, 3, &what)?)?,
            updated_at: Timestamp(get(row, 4, &what)?),
        })
    }

    /// The heads of `rows` that can be read; the others are left out with a warning.
    pub(crate) fn readable_heads(&self, rows: &[PgRow]) -> Vec<Head> {
        rows.iter()
            .filter_map(|r| match self.head(r) {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::warn!(error = %e, "a head row this store cannot read is left out");
                    None
                }
            })
            .collect()
    }

    /// The link of [`link_columns!`].
    pub(crate) fn link(&self, row: &PgRow) -> Result<UpstreamLink, StoreError> {
        let key: String = get(row, 0, &|| format!("{}: a link row", self.store))?;
        let agent: String = get(row, 1, &|| format!("{}: a link row", self.store))?;
        let name = format!("upstream link ({key:?}, {agent:?})");
        let what = || format!("{}: {name}", self.store);
        let session = SessionRef::parse(&key, &agent).map_err(|e| self.corrupt(&name, e))?;
        let json = |i: usize, column: &str| -> Result<Option<serde_json::Value>, StoreError> {
            get::<Option<String>>(row, i, &what)?
                .map(|t| serde_json::from_str(&t))
                .transpose()
                .map_err(|e| self.corrupt(&name, format_args!("{column} is not JSON: {e}")))
        };
        Ok(UpstreamLink {
            session,
            catalog_id: get(row, 2, &what)?,
            host_id: get(row, 3, &what)?,
            thread_id: get(row, 4, &what)?,
            upstream_kind: get(row, 5, &what)?,
            upstream_ref: json(6, "upstream_ref_json")?,
            marker: json(7, "last_marker_json")?,
            last_scanned_at: get::<Option<i64>>(row, 8, &what)?.map(Timestamp),
            created_at: Timestamp(get(row, 9, &what)?),
            updated_at: Timestamp(get(row, 10, &what)?),
        })
    }
}

#[cfg(all(test, feature = "testkit"))]
mod tests {
    /// [`END_LOST_COMMIT`] ends the session still idle in the transaction whatever the server's
    /// epoch: the id a store reads (`txid_current()`) carries the epoch above its 32 bits, and a
    /// server past its first 4 billion transactions is in epoch 1 or later, while the session's
    /// `backend_xid` is the 32-bit id. (What the mutation did: compared the session's 32-bit id
    /// with the id and its epoch, which never match once the epoch is above 0: the session is
    /// never ended, and a lost `COMMIT` is an unknown outcome with the store's lock held until
    /// the idle timeout; review of stop 68, P635.)
    #[test]
    fn a_lost_commits_session_is_ended_whatever_the_servers_epoch() {
        use sqlx::ConnectOptions as _;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let server = crate::testkit::server();
            let mut held = server.connect().await.expect("connect");
            sqlx::query("BEGIN")
                .execute(&mut held)
                .await
                .expect("begin");
            let (xid, pid): (i64, i32) = sqlx::query_as("SELECT txid_current(), pg_backend_pid()")
                .fetch_one(&mut held)
                .await
                .expect("the transaction's ids");
            let mut asking = server.connect().await.expect("connect");
            // The same transaction as the server numbers it one epoch later.
            let next_epoch = xid + (1_i64 << 32);
            let ended: i64 = sqlx::query_scalar(super::END_LOST_COMMIT)
                .bind(next_epoch)
                .bind(pid)
                .fetch_one(&mut asking)
                .await
                .expect("end the session");
            assert_eq!(
                ended, 1,
                "the session {pid}, idle in transaction {xid}, is ended"
            );
        });
    }
}
