//! The schema: OpenClaw's four tables exactly as OpenClaw 2026.9.6 declares them, our additive
//! columns (a cursor's target agent, an event's fields as JSON), and a tiny migration runner
//! keyed on a table of ours.
//!
//! The runner never reads or writes `PRAGMA user_version` (OpenClaw's) and never touches a table
//! that is not listed here. Applying a migration is idempotent on a database OpenClaw already
//! created: the tables use `CREATE TABLE IF NOT EXISTS` with OpenClaw's DDL, and a column is only
//! added when `pragma_table_info` does not list it yet.

use std::path::Path;

use sqlx::SqliteConnection;

/// The table that records which of our migrations a database has.
pub(crate) const MIGRATIONS_TABLE: &str = "awareness_schema_migrations";

/// The highest migration version this crate knows.
pub(crate) const LATEST: i64 = 3;

/// OpenClaw's four tables and their indexes, verbatim apart from `IF NOT EXISTS` (which SQLite
/// drops from the text it stores in `sqlite_master`, so a database we create carries exactly
/// OpenClaw's schema text).
const OPENCLAW_TABLES: &str = r#"CREATE TABLE IF NOT EXISTS session_state_events (
  sequence INTEGER PRIMARY KEY AUTOINCREMENT,
  dedupe_key TEXT UNIQUE,
  session_key TEXT NOT NULL,
  session_id TEXT,
  agent_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  actor_type TEXT NOT NULL,
  actor_id TEXT,
  run_id TEXT,
  occurred_at INTEGER NOT NULL,
  summary TEXT NOT NULL,
  payload_json TEXT
) STRICT;
CREATE INDEX IF NOT EXISTS idx_session_state_events_session_sequence
  ON session_state_events(session_key, sequence DESC);
CREATE INDEX IF NOT EXISTS idx_session_state_events_time
  ON session_state_events(occurred_at DESC, sequence DESC);
CREATE TABLE IF NOT EXISTS session_state_heads (
  session_key TEXT NOT NULL,
  agent_id TEXT NOT NULL,
  last_sequence INTEGER NOT NULL,
  pruned_max_sequence INTEGER NOT NULL DEFAULT 0,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (session_key, agent_id)
) STRICT;
CREATE TABLE IF NOT EXISTS session_watch_cursors (
  watcher_session_key TEXT NOT NULL,
  watcher_store_path TEXT,
  target_session_key TEXT NOT NULL,
  last_seen_sequence INTEGER NOT NULL DEFAULT 0,
  notified_sequence INTEGER NOT NULL DEFAULT 0,
  material_sequence INTEGER NOT NULL DEFAULT 0,
  provenance TEXT NOT NULL DEFAULT 'explicit' CHECK (provenance IN ('explicit', 'ambient-group')),
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (watcher_session_key, target_session_key)
) STRICT;
CREATE INDEX IF NOT EXISTS idx_session_watch_cursors_target
  ON session_watch_cursors(target_session_key);
CREATE TABLE IF NOT EXISTS session_upstream_links (
  session_key TEXT NOT NULL,
  agent_id TEXT NOT NULL,
  catalog_id TEXT NOT NULL,
  host_id TEXT NOT NULL,
  thread_id TEXT NOT NULL,
  upstream_kind TEXT NOT NULL,
  upstream_ref_json TEXT,
  last_marker_json TEXT,
  last_scanned_at INTEGER,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  -- (session_key, agent_id) composite identity: under session.scope="global" agents
  -- share bare keys; a key-only row would let one agent overwrite another's upstream.
  PRIMARY KEY (session_key, agent_id)
) STRICT;
CREATE INDEX IF NOT EXISTS idx_session_upstream_links_catalog_id
  ON session_upstream_links(catalog_id);"#;

/// One step of the schema.
enum Step {
    /// Plain SQL, idempotent by construction.
    Sql(&'static str),
    /// `ALTER TABLE <table> ADD COLUMN <column> <decl>` unless the column already exists.
    AddColumn {
        table: &'static str,
        column: &'static str,
        decl: &'static str,
    },
}

struct Migration {
    version: i64,
    description: &'static str,
    step: Step,
}

const MIGRATIONS: [Migration; 3] = [
    Migration {
        version: 1,
        description: "OpenClaw session-state tables",
        step: Step::Sql(OPENCLAW_TABLES),
    },
    Migration {
        version: 2,
        description: "session_watch_cursors.target_agent_id (additive, nullable)",
        step: Step::AddColumn {
            table: "session_watch_cursors",
            column: "target_agent_id",
            decl: "TEXT",
        },
    },
    Migration {
        version: 3,
        description: "session_state_events.fields_json (additive, nullable)",
        step: Step::AddColumn {
            table: "session_state_events",
            column: "fields_json",
            decl: "TEXT",
        },
    },
];

/// The migration version recorded in the database (0 when it has none of ours).
pub(crate) async fn version(conn: &mut SqliteConnection) -> Result<i64, sqlx::Error> {
    if !has_table(conn, MIGRATIONS_TABLE).await? {
        return Ok(0);
    }
    applied(conn).await
}

/// Why the file must not be opened by this version of the crate: its migrations table records
/// a version above [`LATEST`], so a later version wrote it and may keep its rows in a way this
/// one would misread (`fields_json`, which reads trust over the columns, among them) or
/// overwrite. `None` for a file of [`LATEST`] or older, OpenClaw's included.
pub(crate) async fn too_new(conn: &mut SqliteConnection) -> Result<Option<String>, sqlx::Error> {
    let v = version(conn).await?;
    Ok((v > LATEST).then(|| {
        format!(
            "its schema is version {v}, newer than the version {LATEST} this store-sqlite \
             knows: open it with the version that wrote it"
        )
    }))
}

/// The highest migration recorded in the migrations table, which must exist.
async fn applied(conn: &mut SqliteConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT coalesce(max(version), 0) FROM awareness_schema_migrations")
        .fetch_one(&mut *conn)
        .await
}

/// Whether the database file has the table `name` (a TEMP object of the connection is not
/// the file's).
async fn has_table(conn: &mut SqliteConnection, name: &str) -> Result<bool, sqlx::Error> {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM main.sqlite_master WHERE type = 'table' AND name = $1",
    )
    .bind(name)
    .fetch_one(&mut *conn)
    .await?;
    Ok(n > 0)
}

/// Whether the database file's table `table` has the column `column`.
async fn has_column(
    conn: &mut SqliteConnection,
    table: &str,
    column: &str,
) -> Result<bool, sqlx::Error> {
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pragma_table_info($1, 'main') WHERE name = $2")
            .bind(table)
            .bind(column)
            .fetch_one(&mut *conn)
            .await?;
    Ok(n > 0)
}

/// Whether the file has everything the store reads and writes: our migrations recorded up to
/// [`LATEST`], and each additive column really there. The record alone is not trusted: a
/// table rebuilt by another writer of the file (OpenClaw changes a table's keys that way) or
/// a column dropped by hand leaves the record saying 3 without the column, and every write
/// would then fail with "no such column". `path`, the file, names it in the warning.
async fn complete(conn: &mut SqliteConnection, path: &Path) -> Result<bool, sqlx::Error> {
    match version(conn).await? {
        v if v < LATEST => return Ok(false),
        // A later version's schema is not ours to mend: the open refuses it (`too_new`).
        v if v > LATEST => return Ok(true),
        _ => {}
    }
    let missing = missing_columns(conn).await?;
    for (table, column) in &missing {
        tracing::warn!(
            path = %path.display(),
            table,
            column,
            "the file records our migrations but lacks one of their columns; adding it again"
        );
    }
    Ok(missing.is_empty())
}

/// Our additive columns the file's tables lack, as (table, column), in migration order.
async fn missing_columns(
    conn: &mut SqliteConnection,
) -> Result<Vec<(&'static str, &'static str)>, sqlx::Error> {
    let mut missing = Vec::new();
    for m in &MIGRATIONS {
        if let Step::AddColumn { table, column, .. } = m.step
            && !has_column(conn, table, column).await?
        {
            missing.push((table, column));
        }
    }
    Ok(missing)
}

/// Brings the schema up to [`LATEST`] in one `BEGIN IMMEDIATE` transaction. Cheap when nothing
/// is missing (four reads, no write lock). `path`, the file the connection is on, names it in
/// the warnings.
pub(crate) async fn migrate(
    conn: &mut SqliteConnection,
    path: &Path,
    now_ms: i64,
) -> Result<(), sqlx::Error> {
    if complete(conn, path).await? {
        return Ok(());
    }
    sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut *conn).await?;
    let applied = apply_missing(conn, now_ms).await;
    let end = if applied.is_ok() {
        "COMMIT"
    } else {
        "ROLLBACK"
    };
    let ended = sqlx::raw_sql(end).execute(&mut *conn).await;
    applied?;
    ended.map(|_| ())
}

/// Why the file is no OpenClaw or session-awareness state database (one of OpenClaw's four
/// tables is missing: an empty file, another application's database), or `None`.
pub(crate) async fn not_a_state_database(
    conn: &mut SqliteConnection,
) -> Result<Option<String>, sqlx::Error> {
    for table in OPENCLAW_TABLE_NAMES {
        if !has_table(conn, table).await? {
            return Ok(Some(format!(
                "not an OpenClaw or session-awareness state database (no table {table})"
            )));
        }
    }
    Ok(None)
}

/// Why an open that may create a store refuses the database: another application's, which has
/// tables and none of OpenClaw's four (a mistyped path; a store is made only in a database
/// without tables: a missing or empty file, or one whose creation stopped before its tables
/// were written). A database with some of OpenClaw's tables is OpenClaw's, perhaps of a
/// version before the others, and is migrated as always; the migrations table alone is ours.
pub(crate) async fn another_applications(
    conn: &mut SqliteConnection,
) -> Result<Option<String>, sqlx::Error> {
    let (tables, openclaws): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE name IN ($1, $2, $3, $4))
  FROM main.sqlite_master
  WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND name <> $5",
    )
    .bind(OPENCLAW_TABLE_NAMES[0])
    .bind(OPENCLAW_TABLE_NAMES[1])
    .bind(OPENCLAW_TABLE_NAMES[2])
    .bind(OPENCLAW_TABLE_NAMES[3])
    .bind(MIGRATIONS_TABLE)
    .fetch_one(&mut *conn)
    .await?;
    Ok((tables > 0 && openclaws == 0).then(|| {
        format!(
            "another application's database ({tables} table(s), none of OpenClaw's \
             session-state tables): a store is created only in a missing or empty file"
        )
    }))
}

/// OpenClaw's four tables, which a database must hold to be read without migrating it.
const OPENCLAW_TABLE_NAMES: [&str; 4] = [
    "session_state_events",
    "session_state_heads",
    "session_watch_cursors",
    "session_upstream_links",
];

/// Readies a read-only connection on a database whose schema is behind [`LATEST`] (an
/// OpenClaw database never opened read-write by this crate, say) without writing to it: each of
/// our additive columns it lacks is read as NULL, through a TEMP view named after its table
/// (TEMP objects live in the connection, shadow the file's table of the same name, and are
/// never written to the file). Answers `Err(reason)` when the database is not one of OpenClaw's
/// or ours (one of OpenClaw's four tables is missing).
pub(crate) async fn shadow_missing_columns(
    conn: &mut SqliteConnection,
) -> Result<Result<(), String>, sqlx::Error> {
    if let Some(reason) = not_a_state_database(conn).await? {
        return Ok(Err(reason));
    }
    // The missing additive columns, by table, in migration order.
    let mut missing: Vec<(&str, Vec<&str>)> = Vec::new();
    for (table, column) in missing_columns(conn).await? {
        match missing.iter_mut().find(|(t, _)| *t == table) {
            Some((_, columns)) => columns.push(column),
            None => missing.push((table, vec![column])),
        }
    }
    for (table, columns) in missing {
        let nulls: Vec<String> = columns.iter().map(|c| format!("NULL AS {c}")).collect();
        let sql = format!(
            "CREATE TEMP VIEW {table} AS SELECT *, {} FROM main.{table}",
            nulls.join(", ")
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut *conn)
            .await?;
    }
    Ok(Ok(()))
}

async fn apply_missing(conn: &mut SqliteConnection, now_ms: i64) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS awareness_schema_migrations (
  version INTEGER PRIMARY KEY,
  description TEXT NOT NULL,
  applied_at INTEGER NOT NULL
) STRICT",
    )
    .execute(&mut *conn)
    .await?;
    // Re-read under the write lock: another process may have migrated meanwhile. The steps
    // not recorded yet run; of those recorded, only the added columns run again (a column can
    // be lost while the record stays: see `complete`). A recorded `Sql` step does not: the
    // file's tables and indexes are OpenClaw's once it has them, and one OpenClaw dropped or
    // renamed since is not ours to bring back.
    let current = applied(conn).await?;
    if current > LATEST {
        // A later version migrated the file since `complete` looked: nothing is written to
        // it, and the open refuses it once this returns (`too_new`).
        return Ok(());
    }
    for m in &MIGRATIONS {
        match m.step {
            Step::Sql(_) if m.version <= current => {}
            Step::Sql(sql) => {
                sqlx::raw_sql(sql).execute(&mut *conn).await?;
            }
            Step::AddColumn {
                table,
                column,
                decl,
            } => {
                if !has_column(conn, table, column).await? {
                    let sql = format!("ALTER TABLE {table} ADD COLUMN {column} {decl}");
                    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&mut *conn)
                        .await?;
                }
            }
        }
        if m.version <= current {
            continue;
        }
        sqlx::query(
            "INSERT INTO awareness_schema_migrations (version, description, applied_at) \
             VALUES ($1, $2, $3)",
        )
        .bind(m.version)
        .bind(m.description)
        .bind(now_ms)
        .execute(&mut *conn)
        .await?;
        tracing::debug!(
            version = m.version,
            description = m.description,
            "applied migration"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use sqlx::Connection as _;

    use super::*;

    /// Every column we add to one of OpenClaw's tables is declared as its name and one bare
    /// type, nothing after it: OpenClaw's schema check on opening its state database
    /// (`compareTableDefinitions`, `isCompatibleAdditiveColumnDefinition` in its
    /// `src/infra/sqlite-schema-contract.ts`) tolerates a column it does not know only when
    /// its declaration is `<name> ANY|BLOB|INT|INTEGER|REAL|TEXT`. A DEFAULT, NOT NULL, CHECK,
    /// COLLATE or REFERENCES here would make OpenClaw refuse the file once we opened it
    /// (`unexpected-column`). `tests/openclaw_schema_contract.rs`
    /// (`a_file_we_opened_still_passes_openclaws_schema_check`) checks the text SQLite stores.
    #[test]
    fn every_added_column_is_declared_as_a_bare_type_openclaw_tolerates() {
        // As in tests/openclaw_schema_contract.rs, which checks the file itself.
        const BARE_TYPES: [&str; 6] = ["ANY", "BLOB", "INT", "INTEGER", "REAL", "TEXT"];
        let mut added = 0;
        for m in &MIGRATIONS {
            let Step::AddColumn {
                table,
                column,
                decl,
            } = m.step
            else {
                continue;
            };
            added += 1;
            assert!(
                OPENCLAW_TABLE_NAMES.contains(&table),
                "migration {}: {table} is not one of OpenClaw's session-state tables",
                m.version
            );
            // The column is one bare identifier, so nothing can ride in on its name either.
            assert!(
                !column.is_empty()
                    && column
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "migration {}: column name {column:?} is not a bare identifier",
                m.version
            );
            assert!(
                BARE_TYPES.contains(&decl),
                "migration {}: {table}.{column} is declared {decl:?}; OpenClaw accepts an extra \
                 column only as `<name> <type>` with the type one of {BARE_TYPES:?} and nothing \
                 after it (no DEFAULT, NOT NULL, CHECK, COLLATE, REFERENCES), and would refuse \
                 the file with unexpected-column",
                m.version
            );
        }
        assert_eq!(added, 2, "target_agent_id and fields_json");
    }

    /// A file a later version migrated (its record above [`LATEST`]) is never written to by
    /// `migrate`, even when it lacks one of our additive columns: the open refuses it once the
    /// schema is settled (decision 0012). It added the column back and committed, when another
    /// process migrated the file between the open's first check and `migrate`.
    #[tokio::test]
    async fn migrate_writes_nothing_into_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sqlite");
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let mut conn = SqliteConnection::connect(&url).await.unwrap();
        migrate(&mut conn, &path, 1).await.expect("a new file");
        assert!(
            has_column(&mut conn, "session_state_events", "fields_json")
                .await
                .unwrap()
        );
        sqlx::raw_sql(
            "INSERT INTO awareness_schema_migrations (version, description, applied_at) \
             VALUES (4, 'a later version', 2); \
             ALTER TABLE session_state_events DROP COLUMN fields_json;",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        migrate(&mut conn, &path, 3).await.expect("nothing to do");
        // The race itself: `complete` found the file ours, and another process migrated it
        // before `migrate` took the write lock.
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .unwrap();
        apply_missing(&mut conn, 4).await.expect("nothing to apply");
        sqlx::raw_sql("COMMIT").execute(&mut conn).await.unwrap();
        assert!(
            !has_column(&mut conn, "session_state_events", "fields_json")
                .await
                .unwrap(),
            "the newer schema was changed"
        );
        assert_eq!(applied(&mut conn).await.unwrap(), 4);
        assert!(too_new(&mut conn).await.unwrap().is_some());
        conn.close().await.unwrap();
    }
}
