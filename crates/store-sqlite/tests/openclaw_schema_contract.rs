//! A state database OpenClaw 2026.9.6 wrote, once opened read-write by this store, still
//! passes the schema check OpenClaw runs when it opens its state database, on the four
//! session-state tables.
//!
//! The rules are those of OpenClaw's `src/infra/sqlite-schema-contract.ts`
//! (`collectSqliteSchemaIssues`, `compareTableDefinitions`, `isCompatibleAdditiveColumnDefinition`)
//! with the compatibility of `src/state/openclaw-state-schema-compatibility.ts`
//! (`allowCompatibleAdditiveColumns: true`), read in the search corpus, not necessarily from
//! build 2026.9.6. OpenClaw compares a file's tables with its canonical SQL; the file as OpenClaw
//! wrote it stands for that SQL here, so every rule becomes "what our open changed is allowed":
//!
//! - a column OpenClaw does not know is tolerated only when its declaration, as parsed from the
//!   `CREATE TABLE` text in `sqlite_master` (split at top-level commas, comments dropped,
//!   whitespace collapsed), is its name and one of ANY, BLOB, INT, INTEGER, REAL, TEXT with
//!   nothing after it (else `unexpected-column`);
//! - every known column's declaration is unchanged (`missing-column`,
//!   `column-definition-drift`), and so are the table constraints (`table-constraint-drift`);
//! - every index of the table is still there as it was (`missing-or-drifted-index`), and no
//!   unique index was added (`unexpected-unique-index`); other indexes are ignored;
//! - no trigger was added (`unexpected-trigger`);
//! - STRICT and WITHOUT ROWID are unchanged (`table-options-drift`);
//! - tables OpenClaw does not know are ignored.
//!
//! OpenClaw's `PRAGMA user_version` must not move either (decision 0012).

use std::collections::{BTreeMap, BTreeSet};

use awareness_core::testkit::checks::human;
use awareness_core::{CursorStore as _, EventStore as _, SessionRef, Timestamp, WatcherKey};
use sqlx::{Connection as _, SqliteConnection};
use store_sqlite::SqliteStore;

mod fixture;
use fixture::{copy_fixture, raw};

/// OpenClaw's session-state tables, which our migrations change.
const SESSION_TABLES: [&str; 4] = [
    "session_state_events",
    "session_state_heads",
    "session_watch_cursors",
    "session_upstream_links",
];

/// The types OpenClaw accepts, bare, for a column it does not know (`SQLITE_STRICT_DATATYPES`;
/// also in `schema.rs`'s unit test, which checks our migrations' declarations).
const BARE_TYPES: [&str; 6] = ["ANY", "BLOB", "INT", "INTEGER", "REAL", "TEXT"];

/// The index just after the quoted text (`'...'`, `"..."`, `` `...` ``, `[...]`, a doubled
/// quote inside kept) or the comment (`-- ...` to the line's end, `/* ... */`) that starts at
/// `i`, or `i` when none starts there. As OpenClaw's `skipSqlQuotedOrComment`.
fn skip_quoted_or_comment(s: &[u8], i: usize) -> usize {
    let close = match s[i] {
        q @ (b'\'' | b'"' | b'`') => q,
        b'[' => b']',
        b'-' if s.get(i + 1) == Some(&b'-') => {
            return s[i + 2..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(s.len(), |n| i + 2 + n + 1);
        }
        b'/' if s.get(i + 1) == Some(&b'*') => {
            return s[i + 2..]
                .windows(2)
                .position(|w| w == b"*/")
                .map_or(s.len(), |n| i + 2 + n + 2);
        }
        _ => return i,
    };
    let mut j = i + 1;
    while j < s.len() {
        if s[j] != close {
            j += 1;
        } else if close != b']' && s.get(j + 1) == Some(&close) {
            j += 2;
        } else {
            return j + 1;
        }
    }
    s.len()
}

/// `sql` with its comments dropped and each run of whitespace (a comment counting as one)
/// made one space outside quotes, trimmed. As OpenClaw's `normalizeSqlWhitespace`.
fn normalize_whitespace(sql: &str) -> String {
    let s = sql.as_bytes();
    let mut out = String::new();
    let mut space = false;
    let mut i = 0;
    while i < s.len() {
        let next = skip_quoted_or_comment(s, i);
        if next != i {
            if s[i] == b'-' || s[i] == b'/' {
                space = true;
            } else {
                if space && !out.is_empty() {
                    out.push(' ');
                }
                out.push_str(&sql[i..next]);
                space = false;
            }
            i = next;
            continue;
        }
        let c = sql[i..].chars().next().unwrap();
        if c.is_whitespace() {
            space = true;
        } else {
            if space && !out.is_empty() {
                out.push(' ');
            }
            out.push(c);
            space = false;
        }
        i += c.len_utf8();
    }
    out
}

/// The pieces of the text between the first `(` of `sql` and its matching `)`, split at the
/// commas outside parentheses, quotes and comments. As OpenClaw's `parseTableDefinition`
/// splits a table's definition.
fn top_level_pieces(sql: &str) -> Vec<&str> {
    let s = sql.as_bytes();
    let mut depth = 0usize;
    let mut start = None;
    let mut pieces = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let next = skip_quoted_or_comment(s, i);
        if next != i {
            i = next;
            continue;
        }
        match s[i] {
            b'(' => {
                depth += 1;
                if depth == 1 {
                    start = Some(i + 1);
                }
            }
            b')' => {
                depth -= 1;
                if depth == 0 {
                    pieces.push(&sql[start.unwrap()..i]);
                    return pieces;
                }
            }
            b',' if depth == 1 => {
                pieces.push(&sql[start.unwrap()..i]);
                start = Some(i + 1);
            }
            _ => {}
        }
        i += 1;
    }
    panic!("an unterminated table definition: {sql}");
}

/// The first token of a normalized definition: an identifier, quoted or not.
fn first_token(definition: &str) -> &str {
    let s = definition.as_bytes();
    let end = skip_quoted_or_comment(s, 0);
    if end != 0 {
        return &definition[..end];
    }
    definition.split(' ').next().unwrap()
}

/// A table's definition as OpenClaw reads it from its `CREATE TABLE` text: the columns by
/// their (unquoted, lower-cased) name with their whole declaration, and the table constraints
/// (a piece starting with CONSTRAINT, PRIMARY, UNIQUE, CHECK or FOREIGN), sorted.
#[derive(Debug)]
struct TableDefinition {
    columns: BTreeMap<String, String>,
    constraints: Vec<String>,
}

fn parse_table(sql: &str) -> TableDefinition {
    let mut columns = BTreeMap::new();
    let mut constraints = Vec::new();
    for piece in top_level_pieces(sql) {
        let definition = normalize_whitespace(piece);
        if definition.is_empty() {
            continue;
        }
        let token = first_token(&definition);
        if ["CONSTRAINT", "PRIMARY", "UNIQUE", "CHECK", "FOREIGN"]
            .iter()
            .any(|k| token.eq_ignore_ascii_case(k))
        {
            constraints.push(definition);
            continue;
        }
        let name = token
            .trim_matches(|c| matches!(c, '"' | '`' | '[' | ']' | '\''))
            .to_lowercase();
        assert!(
            columns.insert(name.clone(), definition).is_none(),
            "duplicate column {name} in {sql}"
        );
    }
    constraints.sort();
    TableDefinition {
        columns,
        constraints,
    }
}

/// The parser reads OpenClaw's definitions as OpenClaw does: commas inside a CHECK, a
/// composite key and a comment do not split, a comment is dropped, and a quoted name is one
/// token.
#[test]
fn the_splitter_reads_definitions_as_openclaw_does() {
    let def = parse_table(
        "CREATE TABLE t (\n  a TEXT NOT NULL DEFAULT 'x, y',\n  \"b c\" INTEGER,\n  \
         p TEXT CHECK (p IN ('explicit', 'ambient-group')),\n  \
         -- (a, b) a comment, with \"quotes\" and commas\n  \
         PRIMARY KEY (a, p)\n, d TEXT) STRICT",
    );
    assert_eq!(
        def.columns.into_iter().collect::<Vec<_>>(),
        [
            ("a".into(), "a TEXT NOT NULL DEFAULT 'x, y'".into()),
            ("b c".into(), "\"b c\" INTEGER".into()),
            ("d".into(), "d TEXT".into()),
            (
                "p".into(),
                "p TEXT CHECK (p IN ('explicit', 'ambient-group'))".into()
            ),
        ]
    );
    assert_eq!(def.constraints, ["PRIMARY KEY (a, p)"]);
}

/// What OpenClaw's schema check reads of the file, for the four session-state tables, and the
/// file's objects.
#[derive(Debug)]
struct Schema {
    /// Every object of `sqlite_master`: (type, name, tbl_name) to its SQL.
    objects: BTreeMap<(String, String, String), Option<String>>,
    /// Each session table's indexes (`PRAGMA index_list` and `index_xinfo`, an automatic
    /// index's name left out as OpenClaw does), as (unique, fingerprint).
    indexes: BTreeMap<&'static str, BTreeSet<(bool, String)>>,
    /// Each session table's triggers, as (name, SQL).
    triggers: BTreeMap<&'static str, Vec<(String, Option<String>)>>,
    /// Each session table's (strict, without rowid) of `PRAGMA table_list`.
    options: BTreeMap<&'static str, (i64, i64)>,
    user_version: i64,
}

/// One term of an index as `PRAGMA index_xinfo` lists it: (seqno, cid, name, desc, coll, key),
/// the fields OpenClaw's index fingerprint keeps.
type IndexTerm = (i64, i64, Option<String>, i64, Option<String>, i64);

async fn read_schema(conn: &mut SqliteConnection) -> Schema {
    let rows: Vec<(String, String, String, Option<String>)> =
        sqlx::query_as("SELECT type, name, tbl_name, sql FROM main.sqlite_master")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    let objects = rows
        .into_iter()
        .map(|(kind, name, table, sql)| ((kind, name, table), sql))
        .collect();
    let mut indexes = BTreeMap::new();
    let mut triggers = BTreeMap::new();
    let mut options = BTreeMap::new();
    for table in SESSION_TABLES {
        let list: Vec<(String, bool, String, i64, Option<String>)> = sqlx::query_as(
            "SELECT i.name, i.\"unique\", i.origin, i.partial, m.sql \
             FROM pragma_index_list($1, 'main') AS i \
             LEFT JOIN main.sqlite_master AS m ON m.type = 'index' AND m.name = i.name",
        )
        .bind(table)
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        let mut set = BTreeSet::new();
        for (name, unique, origin, partial, sql) in list {
            let terms: Vec<IndexTerm> = sqlx::query_as(
                "SELECT seqno, cid, name, \"desc\", coll, \"key\" \
                     FROM pragma_index_xinfo($1, 'main') ORDER BY seqno",
            )
            .bind(&name)
            .fetch_all(&mut *conn)
            .await
            .unwrap();
            let name = (!name.starts_with("sqlite_autoindex_")).then_some(name);
            let sql = sql.as_deref().map(normalize_whitespace);
            set.insert((
                unique,
                format!(
                    "name={name:?} origin={origin} partial={partial} unique={unique} \
                     sql={sql:?} terms={terms:?}"
                ),
            ));
        }
        indexes.insert(table, set);
        let t: Vec<(String, Option<String>)> = sqlx::query_as(
            "SELECT name, sql FROM main.sqlite_master WHERE type = 'trigger' AND tbl_name = $1 \
             ORDER BY name",
        )
        .bind(table)
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        triggers.insert(table, t);
        let o: (i64, i64) = sqlx::query_as(
            "SELECT strict, wr FROM pragma_table_list WHERE schema = 'main' AND name = $1",
        )
        .bind(table)
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("table_list of {table}: {e}"));
        options.insert(table, o);
    }
    let user_version = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    Schema {
        objects,
        indexes,
        triggers,
        options,
        user_version,
    }
}

/// The `CREATE TABLE` text of `table`.
fn table_sql<'a>(schema: &'a Schema, table: &str) -> &'a str {
    schema
        .objects
        .get(&("table".into(), table.into(), table.into()))
        .and_then(Option::as_deref)
        .unwrap_or_else(|| panic!("no table {table}"))
}

/// OpenClaw's state database, opened read-write by this store with its default options (our
/// migrations run: two columns added, our migrations table created), written to (a watch, so
/// a cursor row with our column, and a recording), and closed, still passes OpenClaw's schema
/// check on its session-state tables, rule by rule (the module's comment lists them); the
/// only object the open adds to the file is `awareness_schema_migrations`, and OpenClaw's
/// `user_version` stays.
#[tokio::test]
async fn a_file_we_opened_still_passes_openclaws_schema_check() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_fixture(dir.path());
    let before = {
        let mut conn = raw(&path).await;
        let schema = read_schema(&mut conn).await;
        conn.close().await.unwrap();
        schema
    };
    assert!(
        !before
            .objects
            .keys()
            .any(|(_, name, _)| name == "awareness_schema_migrations"),
        "the fixture is OpenClaw's alone: none of our migrations ran on it"
    );

    let store = SqliteStore::open(&path)
        .await
        .expect("open OpenClaw's database read-write");
    let target = SessionRef::parse("agent:ops:subagent:contract", "ops").unwrap();
    let watcher = WatcherKey::parse("agent:main:main").unwrap();
    let now = Timestamp(1_802_600_200_000);
    store.watch(&watcher, &target, now).await.expect("watch");
    let rec = store.record(human(&target), now).await.expect("record");
    assert_eq!(rec.notices.len(), 1, "the watch's cursor moved");
    store.close().await;

    let after = {
        let mut conn = raw(&path).await;
        let written: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM session_watch_cursors \
               WHERE target_session_key = $1 AND target_agent_id = 'ops') \
             + (SELECT count(*) FROM session_state_events \
               WHERE session_key = $1 AND fields_json IS NOT NULL)",
        )
        .bind(target.session_key.as_str())
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!(
            written, 2,
            "a cursor and an event were written with our columns"
        );
        let schema = read_schema(&mut conn).await;
        conn.close().await.unwrap();
        schema
    };

    // What the check reads of OpenClaw's tables as OpenClaw wrote them (so that no rule below
    // holds only because the parser or the PRAGMAs saw nothing): columns, table constraints,
    // indexes.
    let shape: Vec<(usize, usize, usize)> = SESSION_TABLES
        .iter()
        .map(|table| {
            let def = parse_table(table_sql(&before, table));
            (
                def.columns.len(),
                def.constraints.len(),
                before.indexes[table].len(),
            )
        })
        .collect();
    assert_eq!(shape, [(12, 0, 3), (5, 1, 1), (8, 1, 2), (11, 1, 2)]);

    let mut new_columns = Vec::new();
    for table in SESSION_TABLES {
        let old = parse_table(table_sql(&before, table));
        let new = parse_table(table_sql(&after, table));
        for (column, declaration) in &new.columns {
            if old.columns.contains_key(column) {
                continue;
            }
            new_columns.push((table, declaration.as_str().to_owned()));
            let bare = declaration
                .split_once(' ')
                .is_some_and(|(name, ty)| name == column && BARE_TYPES.contains(&ty));
            assert!(
                bare,
                "OpenClaw's unexpected-column: {table}.{column} is declared `{declaration}`, \
                 and OpenClaw tolerates a column it does not know only as `<name> <type>`, the \
                 type one of {BARE_TYPES:?}, nothing after it \
                 (isCompatibleAdditiveColumnDefinition)"
            );
        }
        for (column, declaration) in &old.columns {
            match new.columns.get(column) {
                None => panic!("OpenClaw's missing-column: {table}.{column} is gone"),
                Some(now) => assert_eq!(
                    now, declaration,
                    "OpenClaw's column-definition-drift: {table}.{column}'s declaration changed"
                ),
            }
        }
        assert_eq!(
            new.constraints, old.constraints,
            "OpenClaw's table-constraint-drift: {table}'s table constraints changed"
        );

        let (old_indexes, new_indexes) = (&before.indexes[table], &after.indexes[table]);
        for index in old_indexes {
            assert!(
                new_indexes.contains(index),
                "OpenClaw's missing-or-drifted-index: {table} lost or changed the index {}",
                index.1
            );
        }
        for index in new_indexes.difference(old_indexes) {
            assert!(
                !index.0,
                "OpenClaw's unexpected-unique-index: {table} gained the unique index {}",
                index.1
            );
        }
        assert_eq!(
            after.triggers[table], before.triggers[table],
            "OpenClaw's unexpected-trigger (and missing-or-drifted-trigger): {table}'s \
             triggers changed"
        );
        assert_eq!(
            after.options[table], before.options[table],
            "OpenClaw's table-options-drift: {table}'s (STRICT, WITHOUT ROWID) changed"
        );
    }

    println!("columns added: {new_columns:?}");
    assert_eq!(
        new_columns,
        [
            ("session_state_events", "fields_json TEXT".to_owned()),
            ("session_watch_cursors", "target_agent_id TEXT".to_owned())
        ],
        "our two additive columns, and no other"
    );

    let gone: Vec<_> = before
        .objects
        .keys()
        .filter(|k| !after.objects.contains_key(*k))
        .collect();
    assert!(
        gone.is_empty(),
        "OpenClaw's missing-table / missing-or-drifted-index: objects gone: {gone:?}"
    );
    let added: Vec<(&str, &str, &str)> = after
        .objects
        .keys()
        .filter(|k| !before.objects.contains_key(*k))
        .map(|(kind, name, table)| (kind.as_str(), name.as_str(), table.as_str()))
        .collect();
    let changed: Vec<(&str, &str)> = after
        .objects
        .iter()
        .filter(|(k, sql)| before.objects.get(*k).is_some_and(|old| old != *sql))
        .map(|((kind, name, _), _)| (kind.as_str(), name.as_str()))
        .collect();
    println!(
        "sqlite_master: {} objects before, {} after; added {added:?}; SQL changed {changed:?}",
        before.objects.len(),
        after.objects.len()
    );
    // `version INTEGER PRIMARY KEY` is the rowid: no automatic index.
    assert_eq!(
        added,
        [(
            "table",
            "awareness_schema_migrations",
            "awareness_schema_migrations"
        )],
        "OpenClaw ignores a table it does not know, and an index that is not unique, but \
         nothing else may be added (unexpected-unique-index, unexpected-trigger): the open \
         added only our migrations table"
    );
    assert_eq!(
        changed,
        [
            ("table", "session_state_events"),
            ("table", "session_watch_cursors")
        ],
        "only the two tables we add a column to have new CREATE TABLE text; any other change \
         is a drift OpenClaw's check would report"
    );
    assert_eq!(
        after.user_version, before.user_version,
        "OpenClaw's PRAGMA user_version (its own schema version) is not ours to move"
    );
}
