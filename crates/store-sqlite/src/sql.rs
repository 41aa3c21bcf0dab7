//! Every statement the store runs, as `&'static str`.
//!
//! Shapes that keep the number of messages between the async caller and sqlx's SQLite worker
//! thread small (each statement result and each row is one message):
//! - a write operation is mostly two batches: the first begins the `IMMEDIATE` transaction,
//!   writes what needs no decision and reads what the protocol needs; the second persists what
//!   `awareness_core::protocol` decided and commits (the exceptions, a recording whose one-batch
//!   try met a watched target and a row-cap pruning transaction, are in the crate docs);
//! - every read answers in **one row**, building lists inside SQLite as one JSON value
//!   (`json_group_array`, or [`json_rows!`] for an ordered, limited list), so a 200-event page
//!   is one message, not 201.
//!
//! Placeholders are `$N` throughout: in a multi-statement batch each statement binds its own
//! `$N` by name, while a `?N` a later statement skips would be bound positionally.
//!
//! A bound `LIMIT` is written `LIMIT +$N`. The SQLite that sqlx bundles (3.51) reads a
//! parameter that is the whole `LIMIT` expression while planning, and marks the statement to
//! be compiled again whenever that parameter is bound anew, which sqlx does on every
//! execution: the statement cache then saves nothing, and the reconcile page paid a fresh
//! compile of its three subqueries on every read (`sqlite3_stmt_status` counted one
//! re-prepare per execution). The unary plus makes the limit an expression SQLite evaluates
//! when it runs; `EXPLAIN QUERY PLAN` gave the same plans for the reconcile page,
//! `EVENTS_AFTER` and both prune-by-condition statements (the row-cap victims are a plain scan
//! by sequence). A test below keeps every `LIMIT` in this file in that form.
//!
//! Lists the store sends in (events of a group commit, heads, cursors, keys) are one JSON
//! parameter walked with `jsonb_each`, never `json_each`: `json_each` hands each row of an
//! array of arrays back as JSON text, which every `value ->> N` parses again, while
//! `jsonb_each` hands it back as SQLite's binary JSON, read in place. Reading eleven columns of
//! sixteen rows took 117-120 µs with `json_each` and 63-64 µs with `jsonb_each` (one sqlx
//! connection, 2,000 runs, alternating). The answers are the same; the conformance suite and
//! the model test run every statement here. A test below keeps `json_each` out of this file.

/// The rows `$row` (a JSON value per row) of `SELECT ... $rest` (which orders and limits) as one
/// JSON array, in the subquery's order.
///
/// An ordered, limited list needs a subquery, which SQLite runs as a co-routine: every column
/// the subquery yields is copied into the outer query's registers (a deep copy of each text).
/// Built inside the subquery, each row crosses as one text instead of ten or twelve columns,
/// and `group_concat` joins those texts as they are (`json_group_array` would take a text
/// coming out of a subquery, which has lost its JSON subtype, for a string and quote it). A
/// 200-event page through the store, when it was built this way: 259-263 µs with
/// `json_group_array(json_array(...))` over `SELECT *`, 232-241 µs this way (alternating
/// binaries, three rounds of 4,000 pages each); it now reads stored texts instead (see
/// [`CHANGES_SINCE`]). An empty list is `[]`, never NULL.
macro_rules! json_rows {
    ($row:expr, $rest:expr) => {
        concat!(
            "(SELECT '[' || coalesce(group_concat(json_row, ','), '') || ']' FROM (SELECT ",
            $row,
            " AS json_row ",
            $rest,
            "))"
        )
    };
}
// For the reader's property test, which builds its rows the way the statements do.
#[cfg_attr(not(test), allow(unused_imports))]
pub(crate) use json_rows;

/// One event row as a JSON array, decoded by `decode::RawEvent`.
macro_rules! event_json {
    () => {
        "json_array(sequence, session_key, session_id, agent_id, kind, actor_type, actor_id, \
         run_id, occurred_at, summary, payload_json, dedupe_key)"
    };
}

/// An event's fields after its sequence, key and agent as a JSON array, decoded by
/// `decode::RawFields`: the values the inserts store in our column `fields_json` (serialized
/// in Rust by `decode::fields_json`), and what a read builds for a row without it (a row
/// OpenClaw wrote).
///
/// Storing it saves the reconcile page SQLite's `json_array` on each of its rows, the larger
/// part of the page's statement: through one sqlx connection, 200 events of a ref on the
/// standard data set (12-01, four rounds of 3,000 pages, alternating) took 86-90 µs read from
/// the column against 155-182 µs with a `json_array` built for each row. No statement of this
/// store updates an event row, and none of the operations OpenClaw's fixture replays does, so
/// the stored text does not go stale (docs/decisions/0007);
/// `fields_json_is_what_the_columns_give` checks every insert's values against this
/// expression's.
macro_rules! fields_json {
    () => {
        "json_array(session_id, kind, actor_type, actor_id, run_id, occurred_at, summary, \
         payload_json, dedupe_key)"
    };
}
// For tests, which compare the stored column with what the columns give.
#[cfg_attr(not(test), allow(unused_imports))]
pub(crate) use fields_json;

/// One cursor row as a JSON array, decoded by `decode::RawCursor`.
macro_rules! cursor_json {
    () => {
        "json_array(watcher_session_key, target_session_key, target_agent_id, \
         last_seen_sequence, notified_sequence, material_sequence, updated_at, provenance)"
    };
}

/// One head row as a JSON array, decoded by `decode::RawHead`.
macro_rules! head_json {
    () => {
        "json_array(session_key, agent_id, last_sequence, pruned_max_sequence, updated_at)"
    };
}

/// Upserts the cursors of the JSON array bound to the placeholder `$p` (`[watcher, target,
/// target_agent, last_seen, notified, material, updated_at, provenance]` each);
/// `watcher_store_path` keeps its stored value (new rows: NULL).
macro_rules! upsert_cursors {
    ($p:literal) => {
        concat!(
            "INSERT INTO session_watch_cursors (
  watcher_session_key, target_session_key, target_agent_id, last_seen_sequence,
  notified_sequence, material_sequence, updated_at, provenance)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6,
  value ->> 7
FROM jsonb_each(",
            $p,
            ") WHERE true
ON CONFLICT (watcher_session_key, target_session_key) DO UPDATE SET
  target_agent_id = excluded.target_agent_id,
  last_seen_sequence = excluded.last_seen_sequence,
  notified_sequence = excluded.notified_sequence,
  material_sequence = excluded.material_sequence,
  updated_at = excluded.updated_at,
  provenance = excluded.provenance;"
        )
    };
}

/// What a recording sets on the head row its events move (`ON CONFLICT ... DO UPDATE SET`):
/// the last sequence and the time, keeping the pruned watermark, except over a row this store
/// cannot read (a negative sequence), whose watermark becomes just below the first of the
/// recording's events on the ref (`$first`, an SQL expression), as
/// `awareness_core::protocol::head_over_unreadable` decides for that event (decision 0020):
/// what came before is of unknown history. SQLite evaluates every expression of the `SET`
/// against the row as it was, and a `CASE` branch only when taken. The durable suite checks
/// this rule (`a_recording_over_an_unreadable_head_reports_a_history_gap`); the model test
/// cannot, having no damaged rows.
macro_rules! head_moved {
    ($first:expr) => {
        concat!(
            "last_sequence = excluded.last_sequence, updated_at = excluded.updated_at,
  pruned_max_sequence = CASE WHEN last_sequence < 0 OR pruned_max_sequence < 0
    THEN ",
            $first,
            " - 1 ELSE pruned_max_sequence END"
        )
    };
}

/// Record, first batch. Binds: `$1` dedupe key, `$2` session key, `$3` session id, `$4` agent,
/// `$5` kind, `$6` actor type, `$7` actor id, `$8` run id, `$9` occurred at (clamped by core),
/// `$10` summary, `$11` payload JSON, `$12` now, `$13` the event's fields as JSON
/// (`decode::fields_json`, the values of [`fields_json!`]).
///
/// The insert spends an AUTOINCREMENT number even when the dedupe key already exists (as in
/// OpenClaw). One row comes back: `changes()` of the insert (0 on a dedupe hit), the new
/// sequence, the stored event on a hit, and the cursors on the target key otherwise. The head
/// moves only when a row was inserted; the cursors wait for `protocol::on_event`.
pub(crate) const RECORD_BEGIN: &str = concat!(
    "BEGIN IMMEDIATE;
INSERT INTO session_state_events (dedupe_key, session_key, session_id, agent_id, kind,
  actor_type, actor_id, run_id, occurred_at, summary, payload_json, fields_json)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $13)
ON CONFLICT (dedupe_key) DO NOTHING;
SELECT changes(), last_insert_rowid(),
  CASE WHEN changes() = 0 THEN
    (SELECT ",
    event_json!(),
    " FROM session_state_events WHERE dedupe_key = $1) END,
  CASE WHEN changes() > 0 THEN
    (SELECT json_group_array(",
    cursor_json!(),
    ") FROM session_watch_cursors WHERE target_session_key = $2) END;
INSERT INTO session_state_heads (session_key, agent_id, last_sequence, pruned_max_sequence,
  updated_at)
SELECT $2, $4, last_insert_rowid(), 0, $12 WHERE changes() > 0
ON CONFLICT (session_key, agent_id) DO UPDATE SET ",
    head_moved!("excluded.last_sequence")
);

/// What `connect_options` sets on every connection but the write one, set on that one once
/// `open::file_opened_read_only` has answered (see `unsynced_options`).
pub(crate) const SYNCHRONOUS: &str = "PRAGMA synchronous = NORMAL";

/// Set on the write connection: WAL (persistent in the file); as a safety net only, a large
/// autocheckpoint interval (the store checkpoints in the background, off the recording path;
/// see `SqliteStore::count_write`); and a 64 MiB bound on the WAL file kept after a restart.
pub(crate) const WRITER_PRAGMAS: &str = "PRAGMA journal_mode = WAL; \
     PRAGMA wal_autocheckpoint = 40000; PRAGMA journal_size_limit = 67108864";

/// Waits, with the busy timeout, until no other connection holds the write lock, and takes
/// nothing: a statement that met the lock at once (SQLite answers BUSY without waiting when a
/// connection that reads asks for the write lock another one holds) waits here before it is
/// tried again (see `open::init_writer`).
pub(crate) const WAIT_FOR_WRITER: &str = "BEGIN IMMEDIATE; ROLLBACK";

/// Record in one batch, for an event whose cursor effects are none when its target has no
/// cursor (binds as [`RECORD_BEGIN`]). The insert only happens when the target key has no
/// cursor, which this transaction checks under the write lock; the row answers `changes()`,
/// the new sequence, the stored event on a dedupe hit, and whether the target has cursors (then
/// nothing was written and the caller records the two-batch way). Commits.
pub(crate) const RECORD_ONE_BATCH: &str = concat!(
    "BEGIN IMMEDIATE;
INSERT INTO session_state_events (dedupe_key, session_key, session_id, agent_id, kind,
  actor_type, actor_id, run_id, occurred_at, summary, payload_json, fields_json)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $13
WHERE NOT EXISTS (SELECT 1 FROM session_watch_cursors WHERE target_session_key = $2)
ON CONFLICT (dedupe_key) DO NOTHING;
SELECT changes(), last_insert_rowid(),
  CASE WHEN changes() = 0 THEN
    (SELECT ",
    event_json!(),
    " FROM session_state_events WHERE dedupe_key = $1) END,
  EXISTS (SELECT 1 FROM session_watch_cursors WHERE target_session_key = $2);
INSERT INTO session_state_heads (session_key, agent_id, last_sequence, pruned_max_sequence,
  updated_at)
SELECT $2, $4, last_insert_rowid(), 0, $12 WHERE changes() > 0
ON CONFLICT (session_key, agent_id) DO UPDATE SET ",
    head_moved!("excluded.last_sequence"),
    ";
COMMIT"
);

/// Group commit, first batch: records the events of several callers in one `IMMEDIATE`
/// transaction. `$1` is a JSON array with one `[dedupe key, session key, session id, agent,
/// kind, actor type, actor id, run id, occurred at, summary, payload JSON, fields JSON]` per
/// event, in queue order; `$2` is how many.
///
/// The insert walks `$1` in order and, like a single insert, spends one AUTOINCREMENT number
/// per event, dedupe conflicts included, so the event at index `i` is sequence
/// `top - $2 + 1 + i` where `top` is `sqlite_sequence`'s value after the insert; those that
/// conflicted are the numbers missing from the inserted list. One row comes back: `top`, the
/// inserted sequences, the stored rows of the batch's dedupe keys (for the hits), and the
/// cursors on every target key of the batch. The insert writes no cursor, so they are the
/// cursors as they were before the batch; reading them in the same row as the rest saves a
/// statement and a row, each a message from sqlx's worker thread.
pub(crate) const GROUP_RECORD_BEGIN: &str = concat!(
    "BEGIN IMMEDIATE;
INSERT INTO session_state_events (dedupe_key, session_key, session_id, agent_id, kind,
  actor_type, actor_id, run_id, occurred_at, summary, payload_json, fields_json)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5,
  value ->> 6, value ->> 7, value ->> 8, value ->> 9, value ->> 10, value ->> 11
FROM jsonb_each($1) WHERE true ORDER BY key
ON CONFLICT (dedupe_key) DO NOTHING;
SELECT t.top,
  (SELECT json_group_array(sequence) FROM session_state_events WHERE sequence > t.top - $2),
  (SELECT json_group_array(",
    event_json!(),
    ") FROM session_state_events
    WHERE dedupe_key IN (SELECT value ->> 0 FROM jsonb_each($1) WHERE value ->> 0 IS NOT NULL)),
  (SELECT json_group_array(",
    cursor_json!(),
    ") FROM session_watch_cursors
    WHERE target_session_key IN (SELECT value ->> 1 FROM jsonb_each($1)))
FROM (SELECT seq AS top FROM sqlite_sequence WHERE name = 'session_state_events') AS t"
);

/// Moves the heads `$1` (`[key, agent, last sequence, now, first sequence]`, one per ref,
/// computed from the inserted sequences); the pruned watermark keeps its stored value
/// (`head_moved!`, which reads the first sequence only over a head it cannot read).
macro_rules! move_heads {
    () => {
        concat!(
            "INSERT INTO session_state_heads (session_key,
  agent_id, last_sequence, pruned_max_sequence, updated_at)
SELECT value ->> 0, value ->> 1, value ->> 2, 0, value ->> 3 FROM jsonb_each($1) WHERE true
ON CONFLICT (session_key, agent_id) DO UPDATE SET ",
            head_moved!(
                "(SELECT j.value ->> 4 FROM jsonb_each($1) AS j\n    WHERE j.value ->> 0 = excluded.session_key AND j.value ->> 1 = excluded.agent_id)"
            ),
            ";
"
        )
    };
}

/// Group commit, last batch: moves the heads `$1` (`[key, agent, last sequence, now, first
/// sequence]`, one per ref, computed from the inserted sequences), upserts the cursors `$2` (as
/// [`UPSERT_CURSORS_COMMIT`], the final state `awareness_core::protocol` decided over the batch
/// in order) and commits.
pub(crate) const GROUP_RECORD_COMMIT: &str =
    concat!(move_heads!(), upsert_cursors!("$2"), "\nCOMMIT");

/// Group commit, last batch of a batch that moved no cursor: [`GROUP_RECORD_COMMIT`] without
/// the cursor statement (one statement, so one message from sqlx's worker, fewer).
pub(crate) const GROUP_RECORD_HEADS_COMMIT: &str = concat!(move_heads!(), "COMMIT");

/// Ends a write transaction that has nothing more to write.
pub(crate) const COMMIT: &str = "COMMIT";

/// Rolls back whatever a failed or cancelled operation left open.
pub(crate) const ROLLBACK: &str = "ROLLBACK";

/// Upserts the cursors `$1` (a JSON array of `[watcher, target, target_agent, last_seen,
/// notified, material, updated_at, provenance]`) and commits. `watcher_store_path` keeps its
/// stored value (new rows: NULL).
pub(crate) const UPSERT_CURSORS_COMMIT: &str = concat!(upsert_cursors!("$1"), "\nCOMMIT");

/// The reconcile page in one row: the head, the smallest retained sequence (of the rows
/// numbered above 0: a row another writer numbered 0 or below, which OpenClaw's table allows
/// and no writer we know does, is read by no page and so does not fail this one;
/// [`EVENTS_BELOW_ONE`] finds it), and up to `$4` events of the ref (`$1`, `$2`) after `$3`,
/// as two JSON arrays of the same length: their sequences, and their fields (without key and
/// agent, which are the ref's; see [`fields_json!`]). Both aggregates take the subquery's
/// ascending order; decoding checks it rather than paying for a second sort here. The ordered, limited subquery runs as a
/// co-routine that hands the outer query two columns a row, the sequence and one text (see
/// [`json_rows!`] for why one text and not ten columns).
pub(crate) const CHANGES_SINCE: &str = concat!(
    "SELECT
  (SELECT json_array(last_sequence, pruned_max_sequence, updated_at) FROM session_state_heads
    WHERE session_key = $1 AND agent_id = $2),
  (SELECT sequence FROM session_state_events WHERE session_key = $1 AND agent_id = $2
    AND sequence > 0 ORDER BY sequence LIMIT 1),
  json_group_array(sequence),
  '[' || coalesce(group_concat(fields, ','), '') || ']'
FROM (SELECT sequence, coalesce(fields_json, ",
    fields_json!(),
    ") AS fields FROM session_state_events
  WHERE session_key = $1 AND agent_id = $2 AND sequence > $3 ORDER BY sequence LIMIT +$4)"
);

/// The events of [`CHANGES_SINCE`]'s page one row each (`[sequence, fields]`, the fields as that
/// page joins them), read only when the page cannot be read as a whole (text that is not UTF-8,
/// which SQLite copies into the page as it is, or a row that does not decode), to name the
/// row at fault.
pub(crate) const CHANGES_SINCE_EACH: &str = concat!(
    "SELECT sequence, coalesce(fields_json, ",
    fields_json!(),
    ") FROM session_state_events
  WHERE session_key = $1 AND agent_id = $2 AND sequence > $3 ORDER BY sequence LIMIT +$4"
);

/// Heads of the refs in `$1` (a JSON array of `[key, agent]`).
pub(crate) const HEADS: &str = concat!(
    "SELECT json_group_array(",
    head_json!(),
    ") FROM session_state_heads
WHERE (session_key, agent_id) IN (SELECT value ->> 0, value ->> 1 FROM jsonb_each($1))"
);

/// Every head, or those of agent `$1`, ordered by key then agent.
pub(crate) const LIST_HEADS: &str = concat!(
    "SELECT json_group_array(",
    head_json!(),
    " ORDER BY session_key, agent_id) FROM session_state_heads
WHERE $1 IS NULL OR agent_id = $1"
);

/// [`LIST_HEADS`] one row each (`[key, agent, last, pruned, updated at]`), read only when that
/// one text is not UTF-8, to tell the rows apart exactly.
pub(crate) const LIST_HEADS_EACH: &str = "SELECT session_key, agent_id, last_sequence,
  pruned_max_sequence, updated_at FROM session_state_heads WHERE $1 IS NULL OR agent_id = $1
  ORDER BY session_key, agent_id";

/// Retained events after `$1`, ascending (checked when decoding), at most `$2`.
pub(crate) const EVENTS_AFTER: &str = concat!(
    "SELECT ",
    json_rows!(
        event_json!(),
        "FROM session_state_events WHERE sequence > $1 ORDER BY sequence LIMIT +$2"
    )
);

/// [`EVENTS_AFTER`] one row each (`[sequence, session key, agent, event_json!]`), read only
/// when that one text cannot be read as a whole, to name the row at fault.
pub(crate) const EVENTS_AFTER_EACH: &str = concat!(
    "SELECT sequence, session_key, agent_id, ",
    event_json!(),
    " FROM session_state_events WHERE sequence > $1 ORDER BY sequence LIMIT +$2"
);

/// The connection's data version: changes when another connection's commit becomes visible.
pub(crate) const DATA_VERSION: &str = "PRAGMA data_version";

/// Rows, smallest and largest retained sequence, of the rows numbered above 0 (the only ones a
/// read returns; see [`CHANGES_SINCE`]). Each is a subquery of its own, so that the count is
/// SQLite's count of a whole index and the ends are two searches of the key: over 200,000 rows
/// (sqlite3 3.40) 5 ms, against 44-60 ms for one aggregate over the table, with or without
/// the condition.
pub(crate) const LOG_STATS: &str = "SELECT
  (SELECT count(*) FROM session_state_events)
    - (SELECT count(*) FROM session_state_events WHERE sequence <= 0),
  coalesce((SELECT min(sequence) FROM session_state_events WHERE sequence > 0), 0),
  coalesce((SELECT max(sequence) FROM session_state_events WHERE sequence > 0), 0)";

/// The event rows numbered 0 or below (how many, and the lowest), which no read returns: a
/// search of the key, which finds none in a file only we and OpenClaw wrote.
pub(crate) const EVENTS_BELOW_ONE: &str =
    "SELECT count(*), min(sequence) FROM session_state_events WHERE sequence <= 0";

/// Explicit watch, first batch: the existing cursor (`$1`, `$2`) and the head of the target
/// ref (`$2`, `$3`).
pub(crate) const WATCH_BEGIN: &str = concat!(
    "BEGIN IMMEDIATE;
SELECT
  (SELECT ",
    cursor_json!(),
    " FROM session_watch_cursors
    WHERE watcher_session_key = $1 AND target_session_key = $2),
  (SELECT last_sequence FROM session_state_heads WHERE session_key = $2 AND agent_id = $3)"
);

/// Removes one cursor; answers how many rows went.
pub(crate) const UNWATCH: &str = "BEGIN IMMEDIATE;
DELETE FROM session_watch_cursors WHERE watcher_session_key = $1 AND target_session_key = $2;
SELECT changes();
COMMIT";

/// One cursor.
pub(crate) const CURSOR: &str = concat!(
    "SELECT ",
    cursor_json!(),
    " FROM session_watch_cursors WHERE watcher_session_key = $1 AND target_session_key = $2"
);

/// A listing of cursors by watcher then target, whose rows pass `$where` and, with `$pending`
/// set, are pending (`Cursor::is_pending`: material past last seen), so that the sweep and the
/// pick-up of notices do not build every cursor of the store to keep a tenth of them. One
/// statement per filter shape: with `($1 IS NULL OR watcher_session_key = $1)` SQLite plans
/// a scan of the whole table even when `$1` is given, so a turn, which lists its watcher's
/// cursors, would read every cursor of the store.
macro_rules! cursors_where {
    ($where:literal, $pending:literal) => {
        concat!(
            "SELECT json_group_array(",
            cursor_json!(),
            " ORDER BY watcher_session_key, target_session_key) FROM session_watch_cursors
WHERE ",
            $where,
            " AND (",
            $pending,
            " = 0 OR material_sequence > last_seen_sequence)"
        )
    };
}

/// Every cursor; `$1`: pending only.
pub(crate) const CURSORS: &str = cursors_where!("1", "$1");
/// The cursors of watcher `$1` (the primary key's prefix); `$2`: pending only.
pub(crate) const CURSORS_OF_WATCHER: &str = cursors_where!("watcher_session_key = $1", "$2");
/// The cursors on target key `$1` (its index); `$2`: pending only.
pub(crate) const CURSORS_ON_TARGET: &str = cursors_where!("target_session_key = $1", "$2");
/// The cursor of watcher `$1` on target key `$2`, as a list; `$3`: pending only.
pub(crate) const CURSORS_OF_PAIR: &str =
    cursors_where!("watcher_session_key = $1 AND target_session_key = $2", "$3");

/// Acknowledge, first batch: the cursors of watcher `$1` on the targets in `$2` (JSON array).
pub(crate) const ACK_BEGIN: &str = concat!(
    "BEGIN IMMEDIATE;
SELECT json_group_array(",
    cursor_json!(),
    ") FROM session_watch_cursors
WHERE watcher_session_key = $1 AND target_session_key IN (SELECT value FROM jsonb_each($2))"
);

/// Re-freeze, first batch: the cursors whose `[watcher, target]` is in `$1` (JSON array).
pub(crate) const REFREEZE_BEGIN: &str = concat!(
    "BEGIN IMMEDIATE;
SELECT json_group_array(",
    cursor_json!(),
    ") FROM session_watch_cursors
WHERE (watcher_session_key, target_session_key) IN
  (SELECT value ->> 0, value ->> 1 FROM jsonb_each($1))"
);

/// Session reset: deletes the cursors of watcher `$1`; answers how many.
pub(crate) const RESET_WATCHER: &str = "BEGIN IMMEDIATE;
DELETE FROM session_watch_cursors WHERE watcher_session_key = $1;
SELECT changes();
COMMIT";

/// Delete, first batch: the cursors on target key `$1` (their target agent is decided in Rust,
/// with `Cursor::default_target_agent` for rows OpenClaw wrote).
pub(crate) const DELETE_SESSION_BEGIN: &str = concat!(
    "BEGIN IMMEDIATE;
SELECT json_group_array(",
    cursor_json!(),
    ") FROM session_watch_cursors WHERE target_session_key = $1"
);

/// Delete, second batch: the ref's (`$1`, `$2`) events, head and upstream link, the cursors it
/// owns as watcher when `$4` is 1 (core's `SessionRef::is_watcher`), every cursor on its key but
/// those listed in `$3` (`[watcher, target]` pairs, the ones on another agent's session of the
/// key); commits.
pub(crate) const DELETE_SESSION_COMMIT: &str = "DELETE FROM session_state_events
  WHERE session_key = $1 AND agent_id = $2;
DELETE FROM session_state_heads WHERE session_key = $1 AND agent_id = $2;
DELETE FROM session_upstream_links WHERE session_key = $1 AND agent_id = $2;
DELETE FROM session_watch_cursors WHERE watcher_session_key = $1 AND $4 = 1;
DELETE FROM session_watch_cursors WHERE target_session_key = $1
  AND (watcher_session_key, target_session_key) NOT IN
    (SELECT value ->> 0, value ->> 1 FROM jsonb_each($3));
COMMIT";

/// The choice of idle cursors, with `$extra` added to its condition (keys are given as hex, which
/// any bytes a row holds round-trip through).
macro_rules! prune_cursors_choose {
    ($extra:literal) => {
        concat!(
            "SELECT json_group_array(json_array(hex(watcher_session_key),
    hex(target_session_key)) ORDER BY watcher_session_key, target_session_key)
FROM (SELECT watcher_session_key, target_session_key FROM session_watch_cursors
  WHERE updated_at < $1",
            $extra,
            "
  ORDER BY watcher_session_key, target_session_key LIMIT +$2)"
        )
    };
}

/// Prune by age, first batch: up to `$2` victims with `occurred_at < $1`, lowest sequence
/// first, as `[sequence, key, agent]`, and the heads of their refs.
pub(crate) const PRUNE_AGE_BEGIN: &str = concat!(
    "BEGIN IMMEDIATE;
WITH v AS MATERIALIZED (SELECT sequence, session_key, agent_id FROM session_state_events
  WHERE occurred_at < $1 ORDER BY sequence LIMIT +$2)
SELECT
  (SELECT json_group_array(json_array(sequence, session_key, agent_id) ORDER BY sequence) FROM v),
  (SELECT json_group_array(",
    head_json!(),
    ") FROM session_state_heads
    WHERE (session_key, agent_id) IN (SELECT session_key, agent_id FROM v))"
);

/// Prune by row cap, first batch: how many rows are retained.
pub(crate) const PRUNE_CAP_BEGIN: &str = "BEGIN IMMEDIATE;
SELECT count(*) FROM session_state_events";

/// Prune by row cap, second batch: the `$1` lowest sequences and the heads of their refs.
pub(crate) const PRUNE_CAP_VICTIMS: &str = concat!(
    "WITH v AS MATERIALIZED (SELECT sequence, session_key, agent_id FROM session_state_events
  ORDER BY sequence LIMIT +$1)
SELECT
  (SELECT json_group_array(json_array(sequence, session_key, agent_id) ORDER BY sequence) FROM v),
  (SELECT json_group_array(",
    head_json!(),
    ") FROM session_state_heads
    WHERE (session_key, agent_id) IN (SELECT session_key, agent_id FROM v))"
);

/// Prune, last batch: stamps the watermarks `$1` (`[key, agent, pruned_max, updated_at]`,
/// computed by `retention::stamp`), deletes the sequences `$2`, answers how many went, commits.
pub(crate) const PRUNE_DELETE_COMMIT: &str = "UPDATE session_state_heads
SET pruned_max_sequence = w.value ->> 2, updated_at = w.value ->> 3
FROM jsonb_each($1) AS w
WHERE session_key = w.value ->> 0 AND agent_id = w.value ->> 1;
DELETE FROM session_state_events WHERE sequence IN (SELECT value FROM jsonb_each($2));
SELECT changes();
COMMIT";

/// Prune idle cursors, the choice (on a reader, outside any write transaction: the cursors'
/// table has no index on `updated_at`, so finding idle ones reads every row): up to `$2`
/// cursors with `updated_at < $1`, in key order, as `[hex(watcher), hex(target)]` (hex: any
/// bytes a row holds round-trip through it).
pub(crate) const PRUNE_CURSORS_CHOOSE: &str = concat!(prune_cursors_choose!(""), ";");

/// [`PRUNE_CURSORS_CHOOSE`] past the key `(unhex($3), unhex($4))`, where the transaction
/// before stopped.
pub(crate) const PRUNE_CURSORS_CHOOSE_AFTER: &str = concat!(
    prune_cursors_choose!(
        " AND (watcher_session_key, target_session_key) > (CAST(unhex($3) AS TEXT), CAST(unhex($4) AS TEXT))"
    ),
    ";"
);

/// Prune idle cursors, the write: deletes the cursors `$1` (`[hex(watcher), hex(target)]`)
/// still idle (`updated_at < $2`: a cursor touched since the choice stays); answers how many
/// went.
pub(crate) const PRUNE_CURSORS_DELETE: &str = "BEGIN IMMEDIATE;
DELETE FROM session_watch_cursors
  WHERE (watcher_session_key, target_session_key) IN
    (SELECT CAST(unhex(value ->> 0) AS TEXT), CAST(unhex(value ->> 1) AS TEXT)
     FROM jsonb_each($1))
  AND updated_at < $2;
SELECT changes();
COMMIT";

/// Deletes one event row and nothing else (operator repair, tests).
pub(crate) const DELETE_EVENT_ROW: &str = "BEGIN IMMEDIATE;
DELETE FROM session_state_events WHERE sequence = $1;
SELECT changes();
COMMIT";

/// Moves the AUTOINCREMENT counter of the events (`sqlite_sequence`) up to `$1`, unless it or
/// a stored event is already past it (`SqliteStore::leave_sequences`); answers `changes()` of
/// the insert, 0 when it moved nothing.
pub(crate) const LEAVE_SEQUENCES: &str = "BEGIN IMMEDIATE;
DELETE FROM sqlite_sequence WHERE name = 'session_state_events' AND seq <= $1
  AND coalesce((SELECT max(sequence) FROM session_state_events), 0) <= $1;
INSERT INTO sqlite_sequence (name, seq) SELECT 'session_state_events', $1
WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'session_state_events')
  AND coalesce((SELECT max(sequence) FROM session_state_events), 0) <= $1;
SELECT changes();
COMMIT";

/// The highest number the events' AUTOINCREMENT can have handed out: its counter or the highest
/// stored sequence, whichever is higher (SQLite takes the higher too, so a counter row deleted
/// by hand still ends at the highest row). Read after an insert failed with SQLITE_FULL, to
/// tell a counter at its end from a full disk.
pub(crate) const SEQUENCE_COUNTER: &str = "SELECT max(
  coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'session_state_events'), 0),
  coalesce((SELECT max(sequence) FROM session_state_events), 0))";

/// Makes one event row unreadable (`SqliteStore::damage_event_row`).
pub(crate) const DAMAGE_EVENT_ROW: &str = "BEGIN IMMEDIATE;
UPDATE session_state_events SET actor_type = 'no-such-actor', fields_json = NULL WHERE sequence = $1;
SELECT changes();
COMMIT";

/// Overwrites one cursor row's target agent with an empty one, which no agent id may be
/// (`SqliteStore::damage_cursor_row`).
pub(crate) const DAMAGE_CURSOR_ROW: &str = "BEGIN IMMEDIATE;
UPDATE session_watch_cursors SET target_agent_id = '' WHERE watcher_session_key = $1 AND target_session_key = $2;
SELECT changes();
COMMIT";

/// Overwrites one upstream link row's marker with text that is not JSON
/// (`SqliteStore::damage_link_row`).
pub(crate) const DAMAGE_LINK_ROW: &str = "BEGIN IMMEDIATE;
UPDATE session_upstream_links SET last_marker_json = '{torn' WHERE session_key = $1 AND agent_id = $2;
SELECT changes();
COMMIT";

/// Overwrites one link row's thread id with text that is not UTF-8 (`"t"`, the byte 0xFF, `"x"`)
/// (`SqliteStore::spoil_link_text`).
pub(crate) const SPOIL_LINK_TEXT: &str = "BEGIN IMMEDIATE;
UPDATE session_upstream_links SET thread_id = CAST(X'74FF78' AS TEXT)
  WHERE session_key = $1 AND agent_id = $2;
SELECT changes();
COMMIT";

/// Appends the byte 0xFF (text that is not UTF-8) to one link row's session key
/// (`SqliteStore::spoil_link_key`).
pub(crate) const SPOIL_LINK_KEY: &str = "BEGIN IMMEDIATE;
UPDATE session_upstream_links SET session_key = session_key || CAST(X'FF' AS TEXT)
  WHERE session_key = $1 AND agent_id = $2;
SELECT changes();
COMMIT";

/// Appends the byte 0xFF (text that is not UTF-8) to one cursor row's target agent
/// (`SqliteStore::spoil_cursor_text`).
pub(crate) const SPOIL_CURSOR_TEXT: &str = "BEGIN IMMEDIATE;
UPDATE session_watch_cursors SET target_agent_id = target_agent_id || CAST(X'FF' AS TEXT)
  WHERE watcher_session_key = $1 AND target_session_key = $2;
SELECT changes();
COMMIT";

/// Marks one cursor row ambient, as OpenClaw writes its ambient watch of a group's sessions
/// (`SqliteStore::make_ambient`).
pub(crate) const MAKE_AMBIENT: &str = "BEGIN IMMEDIATE;
UPDATE session_watch_cursors SET provenance = 'ambient-group'
  WHERE watcher_session_key = $1 AND target_session_key = $2;
SELECT changes();
COMMIT";

/// Gives one cursor row a provenance this version does not know, past the CHECK that keeps it
/// out of a file this version made (`SqliteStore::spoil_cursor_provenance`).
pub(crate) const SPOIL_CURSOR_PROVENANCE: &str = "PRAGMA ignore_check_constraints = ON;
BEGIN IMMEDIATE;
UPDATE session_watch_cursors SET provenance = 'ambient-channel'
  WHERE watcher_session_key = $1 AND target_session_key = $2;
SELECT changes();
COMMIT;
PRAGMA ignore_check_constraints = OFF";

/// Appends the byte 0xFF to one cursor row's watcher key (`SqliteStore::spoil_cursor_watcher`).
pub(crate) const SPOIL_CURSOR_WATCHER: &str = "BEGIN IMMEDIATE;
UPDATE session_watch_cursors SET watcher_session_key = watcher_session_key || CAST(X'FF' AS TEXT)
  WHERE watcher_session_key = $1 AND target_session_key = $2;
SELECT changes();
COMMIT";

/// Appends the byte 0xFF to one head row's agent (`SqliteStore::spoil_head_text`).
pub(crate) const SPOIL_HEAD_TEXT: &str = "BEGIN IMMEDIATE;
UPDATE session_state_heads SET agent_id = agent_id || CAST(X'FF' AS TEXT)
  WHERE session_key = $1 AND agent_id = $2;
SELECT changes();
COMMIT";

/// Appends the byte 0xFF to one event row's session key (`SqliteStore::spoil_event_text`).
pub(crate) const SPOIL_EVENT_TEXT: &str = "BEGIN IMMEDIATE;
UPDATE session_state_events SET session_key = session_key || CAST(X'FF' AS TEXT)
  WHERE sequence = $1;
SELECT changes();
COMMIT";

/// Overwrites one head row's last sequence with a negative one, which no writer stores
/// (`SqliteStore::damage_head_row`).
pub(crate) const DAMAGE_HEAD_ROW: &str = "BEGIN IMMEDIATE;
UPDATE session_state_heads SET last_sequence = -5 WHERE session_key = $1 AND agent_id = $2;
SELECT changes();
COMMIT";

/// Deletes one head row (`SqliteStore::delete_head_row`).
pub(crate) const DELETE_HEAD_ROW: &str = "BEGIN IMMEDIATE;
DELETE FROM session_state_heads WHERE session_key = $1 AND agent_id = $2;
SELECT changes();
COMMIT";

/// One upstream link as a JSON array, decoded by `decode::RawLink` (the two JSON columns come
/// back as strings, parsed in Rust, so numbers such as `u64::MAX` keep every digit).
macro_rules! link_json {
    () => {
        "json_array(session_key, agent_id, catalog_id, host_id, thread_id, upstream_kind, \
         upstream_ref_json, last_marker_json, last_scanned_at, created_at, updated_at)"
    };
}

/// The link of the ref (`$1`, `$2`).
pub(crate) const LINK: &str = concat!(
    "SELECT ",
    link_json!(),
    " FROM session_upstream_links WHERE session_key = $1 AND agent_id = $2"
);

/// A link write, first batch: the current link of the ref (`$1`, `$2`), under the write lock.
pub(crate) const LINK_BEGIN: &str = concat!(
    "BEGIN IMMEDIATE;
SELECT (SELECT ",
    link_json!(),
    " FROM session_upstream_links WHERE session_key = $1 AND agent_id = $2)"
);

/// Every link, by key then agent.
pub(crate) const LINKS: &str = concat!(
    "SELECT json_group_array(",
    link_json!(),
    " ORDER BY session_key, agent_id) FROM session_upstream_links"
);

/// Every link, one row each, by key then agent: its key, its agent and `link_json!`. Read only
/// when [`LINKS`] holds text that is not UTF-8 (a hand edit), to tell the rows apart.
pub(crate) const LINKS_EACH: &str = concat!(
    "SELECT session_key, agent_id, ",
    link_json!(),
    " FROM session_upstream_links ORDER BY session_key, agent_id"
);

/// Writes the whole link decided by `awareness_core::upstream` and commits. Binds: `$1` key,
/// `$2` agent, `$3` catalog, `$4` host, `$5` thread, `$6` kind, `$7` reference JSON, `$8`
/// marker JSON, `$9` last scanned at, `$10` created at, `$11` updated at.
pub(crate) const PUT_LINK_COMMIT: &str = "INSERT INTO session_upstream_links (session_key,
  agent_id, catalog_id, host_id, thread_id, upstream_kind, upstream_ref_json, last_marker_json,
  last_scanned_at, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (session_key, agent_id) DO UPDATE SET
  catalog_id = excluded.catalog_id, host_id = excluded.host_id,
  thread_id = excluded.thread_id, upstream_kind = excluded.upstream_kind,
  upstream_ref_json = excluded.upstream_ref_json, last_marker_json = excluded.last_marker_json,
  last_scanned_at = excluded.last_scanned_at, created_at = excluded.created_at,
  updated_at = excluded.updated_at;
COMMIT";

/// Stamps `last_scanned_at` (`$3`) of the ref's link, leaving `updated_at`; answers how many.
pub(crate) const MARK_SCANNED: &str = "BEGIN IMMEDIATE;
UPDATE session_upstream_links SET last_scanned_at = $3 WHERE session_key = $1 AND agent_id = $2;
SELECT changes();
COMMIT";

/// Removes the ref's link and commits.
pub(crate) const DELETE_LINK_COMMIT: &str = "DELETE FROM session_upstream_links
WHERE session_key = $1 AND agent_id = $2;
COMMIT";

#[cfg(test)]
mod tests {
    /// Every `LIMIT` in the statements is a literal or `+$N` (see the module docs): a bare
    /// `LIMIT $N` would have SQLite compile the statement again on every execution.
    #[test]
    fn bound_limits_are_not_planned_on() {
        let source = include_str!("sql.rs");
        let statements = &source[..source.find("\n#[cfg(test)]").expect("this module")];
        let code = statements
            .lines()
            .map(str::trim_start)
            .filter(|l| !l.starts_with("//"));
        let mut checked = 0;
        for line in code {
            for (at, _) in line.match_indices("LIMIT ") {
                let rest = &line[at + "LIMIT ".len()..];
                checked += 1;
                assert!(
                    rest.starts_with("+$") || rest.starts_with(|c: char| c.is_ascii_digit()),
                    "a LIMIT neither literal nor `+$N`: {line}"
                );
            }
        }
        assert!(
            checked >= 6,
            "found only {checked} LIMITs: the scan is broken"
        );
    }

    /// A listing of one watcher's cursors (what every turn asks), of one target's, or of one
    /// pair searches an index: a scan would read every cursor of the store for each of them.
    #[test]
    fn filtered_cursor_listings_search_an_index() {
        use sqlx::Connection as _;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
                .await
                .unwrap();
            // The schema a new file gets, through the migration runner itself, so an index a
            // later migration adds is in the plans too.
            crate::schema::migrate(&mut conn, std::path::Path::new(":memory:"), 0)
                .await
                .unwrap();
            for (name, statement, binds) in [
                ("one watcher's", super::CURSORS_OF_WATCHER, 2),
                ("one target's", super::CURSORS_ON_TARGET, 2),
                ("one pair's", super::CURSORS_OF_PAIR, 3),
            ] {
                let explain = format!("EXPLAIN QUERY PLAN {statement}");
                // The statement is one of this module's constants.
                let mut q =
                    sqlx::query_as::<_, (i64, i64, i64, String)>(sqlx::AssertSqlSafe(explain));
                for _ in 1..binds {
                    q = q.bind("agent:main:main");
                }
                let plan: Vec<String> = q
                    .bind(true)
                    .fetch_all(&mut conn)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|row| row.3)
                    .collect();
                assert!(
                    plan.iter()
                        .any(|step| step.starts_with("SEARCH session_watch_cursors USING")),
                    "{name} cursors: {plan:?}"
                );
                assert!(
                    !plan.iter().any(|step| step.starts_with("SCAN")),
                    "{name} cursors: {plan:?}"
                );
            }
        });
    }

    /// Lists sent in are walked with `jsonb_each` (see the module docs), which the statements
    /// here use at least ten times.
    #[test]
    fn lists_are_walked_as_binary_json() {
        let source = include_str!("sql.rs");
        let statements = &source[..source.find("\n#[cfg(test)]").expect("this module")];
        let code: Vec<&str> = statements
            .lines()
            .map(str::trim_start)
            .filter(|l| !l.starts_with("//"))
            .collect();
        let text = code.join("\n");
        assert!(
            !text.contains(" json_each("),
            "a statement walks a list with json_each"
        );
        let uses = text.matches("jsonb_each(").count();
        assert!(
            uses >= 10,
            "found only {uses} jsonb_each: the scan is broken"
        );
    }
}
