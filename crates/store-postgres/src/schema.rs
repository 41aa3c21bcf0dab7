//! The store's schema: its name, the key of its lock, and the tables it creates.
//!
//! The tables are store-sqlite's (OpenClaw's names and columns, DESIGN.md section 6) with
//! PostgreSQL's types, plus `session_state_counter`, the one row that holds the last sequence
//! handed out (an event's number is taken from it under the store's lock, so the counter
//! never goes back, even when the newest rows are deleted), and `awareness_schema_version`, the
//! one row that says which version of the store made the schema (a later one is refused; an
//! earlier one is brought up to this build's by an open that may create). Keys are compared
//! byte by byte (`COLLATE "C"`), so that listings come in the order of the other stores.

use awareness_core::{OpenFailure, StoreError};
use sqlx::{AssertSqlSafe, PgPool};

/// The statements that create what is missing, in order.
const CREATE: [&str; 9] = [
    "CREATE TABLE IF NOT EXISTS session_state_counter (
  id smallint PRIMARY KEY CHECK (id = 0),
  last_sequence bigint NOT NULL,
  commits bigint NOT NULL DEFAULT 0)",
    r#"CREATE TABLE IF NOT EXISTS session_state_events (
  sequence bigint PRIMARY KEY,
  dedupe_key text COLLATE "C",
  session_key text COLLATE "C" NOT NULL,
  session_id text,
  agent_id text COLLATE "C" NOT NULL,
  kind text NOT NULL,
  actor_type text NOT NULL,
  actor_id text,
  run_id text,
  occurred_at bigint NOT NULL,
  summary text NOT NULL,
  payload_json text,
  CONSTRAINT session_state_events_dedupe EXCLUDE USING hash (dedupe_key WITH =))"#,
    "CREATE INDEX IF NOT EXISTS session_state_events_by_ref
ON session_state_events (session_key, agent_id, sequence)",
    "CREATE INDEX IF NOT EXISTS session_state_events_by_age
ON session_state_events (occurred_at, sequence)",
    r#"CREATE TABLE IF NOT EXISTS session_state_heads (
  session_key text COLLATE "C" NOT NULL,
  agent_id text COLLATE "C" NOT NULL,
  last_sequence bigint NOT NULL,
  pruned_max_sequence bigint NOT NULL DEFAULT 0,
  updated_at bigint NOT NULL,
  PRIMARY KEY (session_key, agent_id))"#,
    r#"CREATE TABLE IF NOT EXISTS session_watch_cursors (
  watcher_session_key text COLLATE "C" NOT NULL,
  watcher_store_path text,
  target_session_key text COLLATE "C" NOT NULL,
  last_seen_sequence bigint NOT NULL DEFAULT 0,
  notified_sequence bigint NOT NULL DEFAULT 0,
  material_sequence bigint NOT NULL DEFAULT 0,
  provenance text NOT NULL DEFAULT 'explicit'
    CHECK (provenance IN ('explicit', 'ambient-group')),
  updated_at bigint NOT NULL,
  target_agent_id text COLLATE "C",
  PRIMARY KEY (watcher_session_key, target_session_key))"#,
    "CREATE INDEX IF NOT EXISTS session_watch_cursors_by_target
ON session_watch_cursors (target_session_key)",
    r#"CREATE TABLE IF NOT EXISTS session_upstream_links (
  session_key text COLLATE "C" NOT NULL,
  agent_id text COLLATE "C" NOT NULL,
  catalog_id text NOT NULL,
  host_id text NOT NULL,
  thread_id text NOT NULL,
  upstream_kind text NOT NULL,
  upstream_ref_json text,
  last_marker_json text,
  last_scanned_at bigint,
  created_at bigint NOT NULL,
  updated_at bigint NOT NULL,
  PRIMARY KEY (session_key, agent_id))"#,
    "CREATE INDEX IF NOT EXISTS session_upstream_links_by_catalog
ON session_upstream_links (catalog_id)",
];

/// Each table and the columns the store reads and writes in it.
const COLUMNS: [(&str, &[&str]); 5] = [
    ("session_state_counter", &["id", "last_sequence", "commits"]),
    (
        "session_state_events",
        &[
            "sequence",
            "dedupe_key",
            "session_key",
            "session_id",
            "agent_id",
            "kind",
            "actor_type",
            "actor_id",
            "run_id",
            "occurred_at",
            "summary",
            "payload_json",
        ],
    ),
    (
        "session_state_heads",
        &[
            "session_key",
            "agent_id",
            "last_sequence",
            "pruned_max_sequence",
            "updated_at",
        ],
    ),
    (
        "session_watch_cursors",
        &[
            "watcher_session_key",
            "target_session_key",
            "target_agent_id",
            "last_seen_sequence",
            "notified_sequence",
            "material_sequence",
            "provenance",
            "updated_at",
        ],
    ),
    (
        "session_upstream_links",
        &[
            "session_key",
            "agent_id",
            "catalog_id",
            "host_id",
            "thread_id",
            "upstream_kind",
            "upstream_ref_json",
            "last_marker_json",
            "last_scanned_at",
            "created_at",
            "updated_at",
        ],
    ),
];

/// Refuses a schema name that would need quoting: 1-63 bytes (PostgreSQL's limit on a
/// name) of lowercase ASCII letters, digits and `_`, not starting with a digit; and the names
/// of the server's own schemas: `pg_...` (which PostgreSQL refuses to create, so that the
/// store would fail later with an error that does not say why) and `information_schema`
/// (which a role allowed to create in it would have the store's tables written into).
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.starts_with("pg_") || name == "information_schema" {
        return Err(format!(
            "schema name {name:?}: the server's own (pg_... and information_schema are \
             PostgreSQL's)"
        ));
    }
    let first_ok = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_');
    let rest_ok = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if first_ok && rest_ok && name.len() <= 63 {
        Ok(())
    } else {
        Err(format!(
            "schema name {name:?}: 1-63 lowercase ASCII letters, digits and '_', \
             not starting with a digit"
        ))
    }
}

/// The key of the advisory lock that serializes the writes of the store in `schema`: the
/// same on every host (a hash of the name, not of anything local).
pub(crate) fn lock_key(schema: &str) -> i64 {
    let hash = awareness_core::upstream::fnv1a64(format!("session-awareness:{schema}").as_bytes());
    i64::from_ne_bytes(hash.to_ne_bytes())
}

/// The counter's one row: at 0 when the store is new; when the row was lost, above every
/// sequence the store still names (its events, its heads' last and pruned sequences, its
/// cursors'), since a number handed out before is never handed out again (DESIGN.md section 2),
/// and the newest events may have been pruned or deleted while their heads and cursors stay.
/// The heads and cursors, which no index orders by sequence, are read only when the row is
/// missing.
const COUNTER_ROW: &str = "INSERT INTO session_state_counter (id, last_sequence)
SELECT 0, greatest(
  (SELECT coalesce(max(sequence), 0) FROM session_state_events),
  (SELECT coalesce(max(greatest(last_sequence, pruned_max_sequence)), 0)
     FROM session_state_heads),
  (SELECT coalesce(max(greatest(last_seen_sequence, notified_sequence, material_sequence)), 0)
     FROM session_watch_cursors))
WHERE NOT EXISTS (SELECT 1 FROM session_state_counter WHERE id = 0)
ON CONFLICT (id) DO NOTHING";

/// The PostgreSQL version the store needs at least (`server_version_num`): 12, for
/// `plan_cache_mode` (a batch's transaction sets it).
const LEAST_VERSION: i32 = 120_000;

/// Why a server of `encoding` and `version` (`server_version_num`) cannot hold the store, if
/// it cannot: text not encoded as UTF-8, or a version before [`LEAST_VERSION`].
fn unsupported(encoding: &str, version: i32) -> Option<String> {
    if encoding != "UTF8" {
        return Some(format!(
            "the database encodes text as {encoding}; the store needs UTF8"
        ));
    }
    // From 10 on, the number is major * 10000 + minor; before, it held two parts of the major.
    let major = if version >= 100_000 {
        (version / 10_000).to_string()
    } else {
        format!("{}.{}", version / 10_000, version % 10_000 / 100)
    };
    (version < LEAST_VERSION).then(|| {
        format!(
            "the server is PostgreSQL {major}; the store needs {} or later",
            LEAST_VERSION / 10_000
        )
    })
}

/// The store's tables, as [`CREATE`] makes them.
const TABLES: [&str; 5] = [
    "session_state_counter",
    "session_state_events",
    "session_state_heads",
    "session_watch_cursors",
    "session_upstream_links",
];

/// Makes sure the schema holds the store, under the store's lock, in one transaction (a
/// refusal creates nothing): creates the schema and the tables that are missing (when
/// `create_if_missing`; refuses otherwise), checks that each table has the store's columns,
/// and that the counter row is there. A store whose schema and tables exist is opened with no
/// DDL at all, so that a gateway's role needs only the rights to read and write the store's
/// rows (PostgreSQL checks the right to create before it looks whether a `CREATE ... IF NOT
/// EXISTS` has anything to do). The catalogs it reads (`pg_namespace`, `pg_class`,
/// `pg_attribute`) are readable by every role, whatever its rights on the tables. `name` names
/// the store in errors.
pub(crate) async fn create(
    pool: &PgPool,
    schema: &str,
    lock_key: i64,
    name: &str,
    create_if_missing: bool,
) -> Result<(), StoreError> {
    // Every failure of an open is an open error naming the store, said by kind: a role
    // without the right to create (the store missing) is `PermissionDenied`; one that may go
    // away by itself (the store's lock held past the role's `lock_timeout`, a connection lost,
    // a server restarting) is `Busy`, as for any write, and as store-sqlite answers an open
    // that met a held lock.
    // `lock`: the statement that waits for the store's lock, where a statement the role's
    // `statement_timeout` cancelled met another gateway's write and may pass too
    // (`crate::store::lock_failure`).
    let failed_at = |what: &str, lock: bool| {
        let reason = format!("cannot open the store: {what}");
        let busy = format!("{name}: open: {what}");
        move |e: sqlx::Error| {
            if crate::store::is_transient(&e) || (lock && crate::store::cancelled(&e)) {
                return StoreError::Busy {
                    context: busy.clone(),
                    source: e.into(),
                };
            }
            let denied = e
                .as_database_error()
                .and_then(sqlx::error::DatabaseError::code)
                .is_some_and(|code| code == "42501");
            let kind = if denied {
                OpenFailure::PermissionDenied
            } else {
                OpenFailure::Other
            };
            StoreError::open(name, kind, reason, Some(e.into()))
        }
    };
    let failed = |what: &str| failed_at(what, false);
    let refuse = |kind: OpenFailure, reason: String| StoreError::open(name, kind, reason, None);
    let (encoding, version): (String, i32) = sqlx::query_as(
        "SELECT current_setting('server_encoding'), current_setting('server_version_num')::int",
    )
    .fetch_one(pool)
    .await
    .map_err(failed("reading the server's encoding and version"))?;
    if let Some(reason) = unsupported(&encoding, version) {
        return Err(refuse(OpenFailure::Unsupported, reason));
    }
    let mut tx = pool
        .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
        .await
        .map_err(failed("beginning a transaction"))?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(lock_key)
        .execute(&mut *tx)
        .await
        .map_err(failed_at("taking the store's lock", true))?;
    let schema_exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(schema)
            .fetch_one(&mut *tx)
            .await
            .map_err(failed("looking for the schema"))?;
    let present: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class AS c
         JOIN pg_namespace AS n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = ANY($2) AND c.relkind IN ('r', 'p')",
    )
    .bind(schema)
    .bind(TABLES)
    .fetch_all(&mut *tx)
    .await
    .map_err(failed("looking for the store's tables"))?;
    let missing: Vec<&str> = TABLES
        .into_iter()
        .filter(|t| !present.iter().any(|p| p == t))
        .collect();
    if !missing.is_empty() {
        if !create_if_missing {
            return Err(refuse(
                OpenFailure::NotFound,
                if schema_exists {
                    format!(
                        "the schema holds no store (no table {}), and this open may not create one",
                        missing.join(", ")
                    )
                } else {
                    "no such schema on the server, and this open may not create one".to_owned()
                },
            ));
        }
        // The name was checked: it needs no quoting, and quoting it keeps it as spelled.
        if !schema_exists {
            sqlx::query(AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\"")))
                .execute(&mut *tx)
                .await
                .map_err(failed("creating the schema"))?;
        }
        sqlx::query(AssertSqlSafe(format!(
            "SET LOCAL search_path TO \"{schema}\""
        )))
        .execute(&mut *tx)
        .await
        .map_err(failed("creating the store's tables"))?;
        for sql in CREATE {
            sqlx::query(sql)
                .execute(&mut *tx)
                .await
                .map_err(failed("creating the store's tables"))?;
        }
    }
    for (table, columns) in COLUMNS {
        let present: Vec<String> = sqlx::query_scalar(
            "SELECT a.attname::text FROM pg_attribute AS a
             JOIN pg_class AS c ON c.oid = a.attrelid
             JOIN pg_namespace AS n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
        )
        .bind(schema)
        .bind(table)
        .fetch_all(&mut *tx)
        .await
        .map_err(failed("reading the store's columns"))?;
        let mut missing: Vec<&str> = columns
            .iter()
            .copied()
            .filter(|c| !present.iter().any(|p| p == c))
            .collect();
        if let Some(added) = upgrade(&mut tx, schema, table, &missing, create_if_missing, name)
            .await
            .map_err(failed("adding a column of a later version"))?
        {
            missing.retain(|c| *c != added);
        }
        if !missing.is_empty() {
            let earlier = missing
                .iter()
                .all(|c| ADDED_COLUMNS.iter().any(|(t, a, _)| *t == table && a == c));
            return Err(if earlier {
                refuse(
                    OpenFailure::NeedsMigration,
                    format!(
                        "made by an earlier version of this store (table {table} has no column \
                         {missing:?}): an open that may create, as the table's owner, adds it"
                    ),
                )
            } else {
                refuse(
                    OpenFailure::NotAStore,
                    format!(
                        "table {table} has none of the columns {missing:?}: it is not this \
                         store's"
                    ),
                )
            });
        }
    }
    // A store made before stop 54 keeps its dedupe keys unique with a B-tree, whose entries
    // PostgreSQL caps at 2,704 bytes: a dedupe key the contract takes (up to 4,096 bytes) that
    // does not compress below that was refused, with a backend error. The hash index of the
    // exclusion constraint holds a key's hash only, whatever its length. An open that may not
    // create changes nothing, and such keys stay refused there.
    let old_unique: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_constraint AS k
         JOIN pg_class AS c ON c.oid = k.conrelid
         JOIN pg_namespace AS n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = 'session_state_events'
         AND k.conname = 'session_state_events_dedupe_key_key')",
    )
    .bind(schema)
    .fetch_one(&mut *tx)
    .await
    .map_err(failed("reading the store's constraints"))?;
    if old_unique && create_if_missing {
        // In a savepoint: a gateway's role that may only read and write rows may not alter
        // the table (it must be the owner's), and still opens the store, as before.
        let mut moving = sqlx::Connection::begin(&mut *tx)
            .await
            .map_err(failed("keeping dedupe keys of any length unique"))?;
        let moved = sqlx::query(AssertSqlSafe(format!(
            "ALTER TABLE \"{schema}\".session_state_events
             DROP CONSTRAINT session_state_events_dedupe_key_key,
             ADD CONSTRAINT session_state_events_dedupe EXCLUDE USING hash (dedupe_key WITH =)"
        )))
        .execute(&mut *moving)
        .await;
        match moved {
            Ok(_) => moving
                .commit()
                .await
                .map_err(failed("keeping dedupe keys of any length unique"))?,
            Err(e)
                if e.as_database_error()
                    .and_then(sqlx::error::DatabaseError::code)
                    .is_some_and(|code| code == "42501") =>
            {
                moving
                    .rollback()
                    .await
                    .map_err(failed("keeping dedupe keys of any length unique"))?;
                tracing::warn!(store = %name, error = %e, "this role may not move the store's dedupe keys to a hash index (the table's owner may, by opening it once): dedupe keys longer than about 2,700 bytes are refused until then");
            }
            Err(e) => return Err(failed("keeping dedupe keys of any length unique")(e)),
        }
    }
    // The row every write moves; a table created by hand from these statements may lack it,
    // or a hand edit may have deleted it: it starts above every event there is. An open that
    // may not create writes nothing (a role that may only read opens the store), and a store
    // without the row then refuses to record, saying so.
    let counter: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM session_state_counter WHERE id = 0)")
            .fetch_one(&mut *tx)
            .await
            .map_err(failed("reading the sequence counter"))?;
    if !counter && create_if_missing {
        sqlx::query(COUNTER_ROW)
            .execute(&mut *tx)
            .await
            .map_err(failed("writing the sequence counter"))?;
    }
    // The version of the store's schema: a later one is refused (its meaning may have changed
    // where its columns did not), before this open has changed anything (the transaction is
    // dropped); an earlier one, or none (a store made before stop 58, which kept no version),
    // is raised to this build's by an open that may create, now that its columns are there.
    let table = format!("\"{schema}\".{VERSION_TABLE}");
    let kept: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&table)
        .fetch_one(&mut *tx)
        .await
        .map_err(failed("looking for the schema's version"))?;
    let version: Option<i32> = if kept {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT version FROM {table} WHERE id = 0"
        )))
        .fetch_optional(&mut *tx)
        .await
        .map_err(failed("reading the schema's version"))?
    } else {
        None
    };
    if let Some(v) = version.filter(|v| *v > SCHEMA_VERSION) {
        return Err(refuse(
            OpenFailure::Unsupported,
            format!(
                "made by a later version of this store (schema {v}; this build reads \
                 {SCHEMA_VERSION} and earlier)"
            ),
        ));
    }
    if version != Some(SCHEMA_VERSION) && create_if_missing {
        // In a savepoint: a role that may only read and write rows may not create a table.
        let mut writing = sqlx::Connection::begin(&mut *tx)
            .await
            .map_err(failed("writing the schema's version"))?;
        let written = sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {table} (
               id smallint PRIMARY KEY CHECK (id = 0),
               version integer NOT NULL);
             INSERT INTO {table} (id, version) VALUES (0, {SCHEMA_VERSION})
             ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version"
        )))
        .execute(&mut *writing)
        .await;
        match written {
            Ok(_) => writing
                .commit()
                .await
                .map_err(failed("writing the schema's version"))?,
            Err(e) => {
                writing
                    .rollback()
                    .await
                    .map_err(failed("writing the schema's version"))?;
                tracing::warn!(store = %name, error = %e, "this role may not write the store's schema version (the schema's owner may, by opening it once): a later version of this store cannot tell this one's stores until then");
            }
        }
    }
    tx.commit().await.map_err(failed("committing the open"))
}

/// The version of the store's schema this build makes and reads: 1, the first (its counter
/// without `commits`, no version kept); 2, from stop 51 (`commits`), kept in [`VERSION_TABLE`]
/// from stop 58. A store of a later version is refused.
pub(crate) const SCHEMA_VERSION: i32 = 2;

/// The table that keeps the store's schema version (one row, `id` 0).
pub(crate) const VERSION_TABLE: &str = "awareness_schema_version";

/// The columns a later version of this store added to a table it had made, and the statement
/// that adds each to a store an earlier version made: `session_state_counter.commits`, the count
/// of writes that `foreign_commits` reads (added in stop 51), which the store's first version
/// did not make. Such a store was refused as "not this store's".
const ADDED_COLUMNS: [(&str, &str, &str); 1] = [(
    "session_state_counter",
    "commits",
    "ADD COLUMN IF NOT EXISTS commits bigint NOT NULL DEFAULT 0",
)];

/// Adds to `table` the one column of [`ADDED_COLUMNS`] among its `missing` ones, when this open
/// may create (an open that may not writes nothing), in a savepoint: a role that may only read
/// and write rows may not alter the table (the owner's open adds it), and is then refused
/// saying so. Answers the column added.
async fn upgrade(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    schema: &str,
    table: &str,
    missing: &[&str],
    create_if_missing: bool,
    name: &str,
) -> Result<Option<&'static str>, sqlx::Error> {
    let Some((_, column, add)) = ADDED_COLUMNS
        .into_iter()
        .find(|(t, c, _)| *t == table && missing.contains(c))
    else {
        return Ok(None);
    };
    if !create_if_missing {
        return Ok(None);
    }
    let mut adding = sqlx::Connection::begin(&mut **tx).await?;
    let added = sqlx::query(AssertSqlSafe(format!(
        "ALTER TABLE \"{schema}\".{table} {add}"
    )))
    .execute(&mut *adding)
    .await;
    match added {
        Ok(_) => {
            adding.commit().await?;
            tracing::info!(store = %name, table, column, "added a column an earlier version of the store did not make");
            Ok(Some(column))
        }
        Err(e) => {
            adding.rollback().await?;
            tracing::warn!(store = %name, table, column, error = %e, "cannot add a column an earlier version of the store did not make (the table's owner may, by opening it once)");
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_server_before_12_or_not_in_utf8_is_refused_with_its_version_or_encoding() {
        assert_eq!(unsupported("UTF8", 150_020), None);
        assert_eq!(unsupported("UTF8", 120_000), None);
        assert_eq!(
            unsupported("UTF8", 110_022).as_deref(),
            Some("the server is PostgreSQL 11; the store needs 12 or later")
        );
        // Review of stop 69, P740: a 10.0 server (100000) was named "PostgreSQL 10.0", as if
        // its number held two parts of the major, as before 10.
        assert_eq!(
            unsupported("UTF8", 100_000).as_deref(),
            Some("the server is PostgreSQL 10; the store needs 12 or later")
        );
        assert_eq!(
            unsupported("UTF8", 90_624).as_deref(),
            Some("the server is PostgreSQL 9.6; the store needs 12 or later")
        );
        assert_eq!(
            unsupported("LATIN1", 150_020).as_deref(),
            Some("the database encodes text as LATIN1; the store needs UTF8")
        );
    }

    use super::*;

    #[test]
    fn only_names_that_need_no_quoting_are_taken() {
        for ok in ["gateway", "_x", "a1_b2", "pg", "pgx_a", &"s".repeat(63)] {
            assert!(check_name(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            "",
            "1abc",
            "Gateway",
            "a-b",
            "a b",
            "a\"b",
            "é",
            &"s".repeat(64),
            "pg_gateway",
            "pg_catalog",
            "information_schema",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn each_schema_has_its_own_lock() {
        assert_eq!(lock_key("a"), lock_key("a"));
        assert_ne!(lock_key("a"), lock_key("b"));
    }
}
