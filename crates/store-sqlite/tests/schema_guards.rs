//! What an open of an existing file promises about its schema, and a bound of pruning's idle
//! cursor step, each a mutation of store-sqlite's Rust that every test passed (review of
//! store-sqlite's Rust by mutation, stop 59): an up-to-date file opens without the write lock;
//! a read-only open refuses a file without one of OpenClaw's four tables; a migration that
//! fails midway leaves the file as it was; an idle-cursor chunk commits at most 250 rows at a
//! time.

use std::time::Duration;

use awareness_core::{
    EventStore as _, OpenFailure, SessionRef, StoreError, Timestamp, UpstreamStore as _,
};
use sqlx::{ConnectOptions as _, Connection as _};
use store_sqlite::{SqliteOptions, SqliteStore};
use write_lock::WriteLock;

mod write_lock;

/// A new store's file in `dir`, closed.
async fn new_store(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("state.sqlite");
    SqliteStore::open(&path).await.unwrap().close().await;
    path
}

async fn raw(path: &std::path::Path) -> sqlx::SqliteConnection {
    sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .connect()
        .await
        .unwrap()
}

/// Opening an up-to-date store takes no write lock (the crate docs: "opening an up-to-date
/// file costs a few reads ... and no write lock"): it opens while another connection holds
/// it. Every open migrating passed every test.
#[tokio::test]
async fn an_up_to_date_store_opens_while_another_connection_holds_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path()).await;
    let lock = WriteLock::take(&path).await;
    let opened = SqliteStore::open_with(
        &path,
        SqliteOptions::new().busy_timeout(Duration::from_millis(300)),
    )
    .await;
    lock.release().await;
    let store = opened.expect("nothing to migrate, so the held write lock does not matter");
    store.close().await;
}

/// A read-only open refuses a file without one of OpenClaw's four tables (`SqliteOptions::
/// read_only`), here `session_upstream_links`, as not a store; checking three of them passed
/// every test, which only used files with none.
#[tokio::test]
async fn a_read_only_open_refuses_a_file_without_the_links_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path()).await;
    let mut c = raw(&path).await;
    sqlx::raw_sql("DROP TABLE session_upstream_links")
        .execute(&mut c)
        .await
        .unwrap();
    c.close().await.unwrap();
    match SqliteStore::open_with(&path, SqliteOptions::new().read_only(true)).await {
        Err(StoreError::Open { kind, .. }) => assert_eq!(kind, OpenFailure::NotAStore),
        Err(e) => panic!("{e:?}"),
        Ok(store) => {
            let links = store.links().await;
            panic!("opened; links() then answers {links:?}");
        }
    }
}

/// A read-write open of a database with some of OpenClaw's four tables and not our record of
/// migrations takes it for OpenClaw's and migrates it as always: the tables missing are made,
/// and links answer. Three of the four (an OpenClaw version from before
/// `session_upstream_links`) and any one of them alone count. A file holding only our own
/// record of migrations, empty, is no other application's either: the store is made in it.
/// (What the mutations did: a database lacking any of the four was refused as another
/// application's, S638, review of stop 67; `session_state_heads` was not counted among
/// OpenClaw's tables, so a file holding only it was refused, S822, review of stop 68; our
/// migrations table was counted as another application's, SB27, review of stop 71.)
#[tokio::test]
async fn a_read_write_open_migrates_a_file_with_some_of_openclaws_tables() {
    const TABLES: [&str; 4] = [
        "session_state_events",
        "session_state_heads",
        "session_watch_cursors",
        "session_upstream_links",
    ];
    // Each set of OpenClaw's tables kept, without our record of migrations; then none of
    // them, with that record kept, empty.
    let mut kept_sets = vec![&TABLES[..3]];
    kept_sets.extend(TABLES.chunks(1));
    kept_sets.push(&[]);
    for kept in kept_sets {
        let dir = tempfile::tempdir().unwrap();
        let path = new_store(dir.path()).await;
        let mut c = raw(&path).await;
        for table in TABLES.iter().filter(|t| !kept.contains(t)) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
                .execute(&mut c)
                .await
                .unwrap();
        }
        let ours = if kept.is_empty() {
            "DELETE FROM awareness_schema_migrations"
        } else {
            "DROP TABLE awareness_schema_migrations"
        };
        sqlx::raw_sql(ours).execute(&mut c).await.unwrap();
        c.close().await.unwrap();
        let store = SqliteStore::open(&path)
            .await
            .unwrap_or_else(|e| panic!("a database holding only {kept:?}, migrated: {e}"));
        assert_eq!(store.links().await.expect("links").len(), 0, "{kept:?}");
        store.close().await;
    }
}

/// An open whose migrations fail midway (the second applies, the third cannot) leaves the
/// file's schema and its record of migrations as they were: they run in one transaction,
/// rolled back. Committing it all the same passed every test.
#[tokio::test]
async fn a_migration_that_fails_midway_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_store(dir.path()).await;
    let mut c = raw(&path).await;
    sqlx::raw_sql(
        "DELETE FROM awareness_schema_migrations WHERE version >= 2;
         ALTER TABLE session_watch_cursors DROP COLUMN target_agent_id;
         DROP TABLE session_state_events;",
    )
    .execute(&mut c)
    .await
    .unwrap();
    let snapshot = async |c: &mut sqlx::SqliteConnection| -> Vec<(String, String)> {
        sqlx::query_as(
            "SELECT name, coalesce(sql, '') FROM sqlite_master
             UNION ALL SELECT 'migration', group_concat(version) FROM awareness_schema_migrations
             ORDER BY 1",
        )
        .fetch_all(&mut *c)
        .await
        .unwrap()
    };
    let before = snapshot(&mut c).await;
    c.close().await.unwrap();
    let err = SqliteStore::open(&path)
        .await
        .expect_err("the migration cannot finish");
    assert!(matches!(err, StoreError::Open { .. }), "{err}");
    let mut c = raw(&path).await;
    let after = snapshot(&mut c).await;
    c.close().await.unwrap();
    assert_eq!(before, after, "a failed open changed the file's schema");
}

/// An idle-cursor chunk deletes in write transactions of at most 250 rows, as the events'
/// steps do (`prune_chunk`: "at most 250 rows per transaction"): 600 idle cursors take three
/// at least. One transaction for the whole chunk passed every test.
#[tokio::test]
async fn an_idle_cursor_chunk_commits_at_most_250_rows_at_a_time() {
    use awareness_core::{CursorStore as _, PruneStep, WatcherKey};
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("state.sqlite"))
        .await
        .unwrap();
    let watcher = WatcherKey::parse("agent:main:main").unwrap();
    for i in 0..600 {
        let t = SessionRef::parse(&format!("agent:main:subagent:c{i}"), "main").unwrap();
        store.watch(&watcher, &t, Timestamp(1_000)).await.unwrap();
    }
    let before = store.write_transactions();
    let deleted = store
        .prune_chunk(
            &PruneStep::Cursors {
                cutoff: Timestamp(2_000),
            },
            2_000,
            Timestamp(3_000),
        )
        .await
        .unwrap();
    let txs = store.write_transactions() - before;
    assert_eq!(deleted, 600);
    assert!(
        txs >= 3,
        "600 idle cursors deleted in {txs} write transaction(s)"
    );
    store.close().await;
}
