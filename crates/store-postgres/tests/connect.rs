//! What connecting refuses and accepts, and the server-side bound on a writer that stops
//! mid-transaction.

mod server;

use std::time::Duration;

use awareness_core::{
    ActorType, AwarenessStoreExt as _, CursorStore as _, EventKind, EventStore as _, NewEvent,
    OpenFailure, RetentionPolicy, Sequence, SessionRef, StoreError, Timestamp, WatcherKey,
};
use sqlx::ConnectOptions as _;
use store_postgres::{PgStore, PgStoreOptions};

/// A hang guard, never a timing assertion: what it guards takes well under a second.
const HANG: Duration = Duration::from_mins(1);

const T0: Timestamp = Timestamp(1_800_000_000_000);

fn human(key: &str) -> NewEvent {
    NewEvent::new(
        SessionRef::parse(key, "main").expect("ref"),
        EventKind::HumanDirectMessage,
        ActorType::Human,
        "human message via test",
    )
}

async fn refused(options: PgStoreOptions) -> StoreError {
    PgStore::connect(server::server(), options)
        .await
        .expect_err("the connect is refused")
}

/// An open of the store in `schema` as `role`, a role made for it with `attributes` (`LOGIN
/// PASSWORD 'pw'` and those) and dropped once the open has answered.
async fn opened_as_a_new_role(
    role: &str,
    attributes: &str,
    schema: &str,
) -> Result<PgStore, StoreError> {
    let made = server::DropRole::create(role.to_owned(), attributes).await;
    let opened = PgStore::connect(server::as_role(role), PgStoreOptions::new(schema)).await;
    drop(made);
    opened
}

/// The tables of `schema` on the test server with a name of the store's (`session_...`; the
/// server's own schemas hold others).
async fn tables_of(schema: &str) -> Vec<String> {
    let mut conn = server::server().connect().await.expect("connect");
    sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1
         AND table_name LIKE 'session\\_%' ORDER BY 1",
    )
    .bind(schema)
    .fetch_all(&mut conn)
    .await
    .expect("list tables")
}

#[tokio::test]
async fn options_that_cannot_work_are_refused_before_anything_is_created() {
    for (options, says) in [
        (PgStoreOptions::new("Not-A-Name"), "schema name"),
        (PgStoreOptions::new(""), "schema name"),
        (PgStoreOptions::new("pg_gateway"), "the server's own"),
        (
            PgStoreOptions::new("information_schema"),
            "the server's own",
        ),
        (
            PgStoreOptions::new(server::fresh_schema()).max_connections(0),
            "max_connections",
        ),
        (
            PgStoreOptions::new(server::fresh_schema())
                .idle_transaction_timeout(Duration::from_micros(10)),
            "idle_transaction_timeout",
        ),
        (
            PgStoreOptions::new(server::fresh_schema()).group_commit(0),
            "group_commit",
        ),
        (
            PgStoreOptions::new(server::fresh_schema()).listener_keepalive(Duration::ZERO),
            "listener_keepalive",
        ),
    ] {
        let schema = options.schema().to_owned();
        let e = refused(options).await;
        assert_eq!(e.open_failure(), Some(OpenFailure::InvalidOptions), "{e}");
        assert!(e.to_string().contains(says), "{e}");
        assert!(tables_of(&schema).await.is_empty(), "nothing created: {e}");
    }
}

#[tokio::test]
async fn a_server_that_cannot_be_reached_is_a_retryable_error_naming_the_store() {
    // No server there (yet: one starting has no socket either), so a later try may work.
    let nowhere = server::server().socket("/nonexistent/socket/dir");
    let e = PgStore::connect(nowhere, PgStoreOptions::new("anything"))
        .await
        .expect_err("no server there");
    assert!(e.is_retryable(), "{e:?}");
    assert!(
        e.to_string()
            .contains("postgres schema \"anything\": connecting to the server"),
        "{e}"
    );
    let chain = awareness_core::error::ErrorChain(&e).to_string();
    assert!(chain.contains("No such file or directory"), "{chain}");
}

/// A role the server has no connection left for (its limit reached, here 0): retryable, as a
/// wait for the pool that was over is, and saying why (review of stop 54's change: the cause
/// made it an error not to retry).
#[tokio::test]
async fn a_server_with_no_connection_left_is_a_retryable_error_that_says_so() {
    let role = format!("{}_full", server::fresh_schema());
    let opened = opened_as_a_new_role(&role, "CONNECTION LIMIT 0", "anything").await;
    let e = opened.expect_err("no connection for the role");
    assert!(e.is_retryable(), "{e:?}");
    let chain = awareness_core::error::ErrorChain(&e).to_string();
    assert!(chain.contains("too many connections"), "{chain}");
}

/// A server that refuses the connection (nothing listens on the port): the pool tries again
/// until its wait is over (30 s), then says only that it timed out; the error says why
/// (review, stop 54: `pool timed out while waiting for an open connection`, the refusal and
/// the address nowhere).
#[tokio::test]
async fn a_server_that_refuses_the_connection_is_an_error_that_says_so() {
    let refusing: store_postgres::PgConnectOptions = "postgres://gw@127.0.0.1:1/awareness"
        .parse()
        .expect("options");
    let e = PgStore::connect(refusing, PgStoreOptions::new("anything"))
        .await
        .expect_err("nothing listens there");
    assert!(e.is_retryable(), "{e:?}");
    let chain = awareness_core::error::ErrorChain(&e).to_string();
    assert!(chain.contains("refused"), "{chain}");
}

#[tokio::test]
async fn a_schema_whose_table_is_not_the_stores_is_refused_and_left_as_it_was() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let mut conn = server::server().connect().await.expect("connect");
    for sql in [
        format!("CREATE SCHEMA \"{schema}\""),
        format!("CREATE TABLE \"{schema}\".session_state_heads (note text)"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .expect("set up");
    }
    let e = refused(PgStoreOptions::new(schema.clone())).await;
    assert_eq!(e.open_failure(), Some(OpenFailure::NotAStore), "{e}");
    assert!(e.to_string().contains("session_state_heads"), "{e}");
    assert_eq!(
        tables_of(&schema).await,
        ["session_state_heads"],
        "no table of the store was created beside it"
    );
}

/// A fresh store's schema, its handle dropped, after `edit` (SQL naming the schema
/// `{schema}`) was run on it by hand.
async fn edited_by_hand(edit: &str) -> server::DropSchema {
    let (store, schema) = server::fresh_store().await;
    drop(store);
    server::run_as_admin(&edit.replace("{schema}", schema.name())).await;
    schema
}

/// A store that lost one of its tables (here `session_upstream_links`, dropped by hand) is
/// refused by an open that may not create, naming the table, and gets it back from one that
/// may. (What the mutation did: the links' table was left out of the tables looked for, and
/// both opens were refused as not this store's; review of stop 71, PH17.)
#[tokio::test]
async fn a_store_that_lost_a_table_gets_it_back_from_an_open_that_may_create() {
    let schema = edited_by_hand("DROP TABLE \"{schema}\".session_upstream_links").await;
    let e = refused(PgStoreOptions::new(schema.name()).create_if_missing(false)).await;
    assert_eq!(e.open_failure(), Some(OpenFailure::NotFound), "{e}");
    assert!(e.to_string().contains("session_upstream_links"), "{e}");
    let store = PgStore::connect(server::server(), PgStoreOptions::new(schema.name()))
        .await
        .expect("an open that may create makes the lost table again");
    assert!(
        tables_of(schema.name())
            .await
            .contains(&"session_upstream_links".to_owned()),
        "the table is back"
    );
    awareness_core::upstream::UpstreamStore::links(&store)
        .await
        .expect("the links are read");
}

/// A table of the store that lacks a column the store reads (here the cursors'
/// `target_agent_id`, dropped by hand) is refused at the open, the error naming the columns it
/// lacks, and only those. (What the mutations did: the column was not among those looked for,
/// and the store opened, to fail at its first read of a cursor, PH27; the error listed every
/// column of the table, those it has too, PH22; review of stop 71.)
#[tokio::test]
async fn a_table_that_lacks_a_column_is_refused_naming_only_that_column() {
    let schema = edited_by_hand(
        "ALTER TABLE \"{schema}\".session_watch_cursors DROP COLUMN target_agent_id",
    )
    .await;
    let e = refused(PgStoreOptions::new(schema.name())).await;
    assert_eq!(e.open_failure(), Some(OpenFailure::NotAStore), "{e}");
    let shown = e.to_string();
    assert!(
        shown.contains("session_watch_cursors") && shown.contains(r#"["target_agent_id"]"#),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_connecting_at_once_to_a_new_schema_share_one_store() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let connects: Vec<_> = (0..4)
        .map(|_| {
            let schema = schema.clone();
            tokio::spawn(async move {
                PgStore::connect(server::server(), PgStoreOptions::new(schema)).await
            })
        })
        .collect();
    let mut stores = Vec::new();
    for c in connects {
        stores.push(c.await.expect("join").expect("every connect succeeds"));
    }
    let now = Timestamp(1_800_000_000_000);
    let first = stores[0]
        .record(human("agent:main:subagent:a"), now)
        .await
        .expect("record");
    let second = stores[3]
        .record(human("agent:main:subagent:a"), now)
        .await
        .expect("record");
    assert_eq!(second.event.sequence.0, first.event.sequence.0 + 1);
    assert_eq!(tables_of(&schema).await.len(), 5, "one set of tables");
}

/// A writer that stops between two statements of its transaction (its host frozen, its network
/// gone) holds what the transaction locked; the server ends it after the idle timeout, and the
/// other gateways' writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_stopped_mid_transaction_holds_the_others_up_only_until_its_timeout() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let frozen = PgStore::connect(
        server::server(),
        PgStoreOptions::new(schema.clone()).idle_transaction_timeout(Duration::from_millis(300)),
    )
    .await
    .expect("connect");
    let other = PgStore::connect(server::server(), PgStoreOptions::new(schema.clone()))
        .await
        .expect("connect");
    // The frozen gateway's transaction locks the row every recording writes, then idles.
    let mut tx = frozen.pool().begin().await.expect("begin");
    sqlx::query("UPDATE session_state_counter SET commits = commits WHERE id = 0")
        .execute(&mut *tx)
        .await
        .expect("lock the counter row");
    let recorded = tokio::time::timeout(
        HANG,
        other.record(human("agent:main:subagent:a"), Timestamp(1_800_000_000_000)),
    )
    .await
    .expect("the recording waited for the frozen writer past the hang guard")
    .expect("the recording succeeds once the frozen transaction is ended");
    assert_eq!(recorded.event.sequence.0, 1);
    let ended = tx.commit().await;
    assert!(
        ended.is_err(),
        "the server ended the idle transaction: {ended:?}"
    );
}

/// An open that meets the store's lock held past its role's `lock_timeout` or
/// `statement_timeout` (another gateway in the middle of a write, with a DBA's timeout on the
/// role) is a retryable error naming the store and what it was doing, as a write that met it
/// is, and as store-sqlite answers an open that met a held lock. It was a permanent `Open`
/// error saying "opening the store" (both timeouts), then a permanent one for
/// `statement_timeout` (review, stop 58).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_that_meets_the_held_lock_past_its_lock_or_statement_timeout_is_retryable() {
    for setting in ["lock_timeout", "statement_timeout"] {
        let schema = server::fresh_schema();
        let _drop = server::DropSchema(schema.clone());
        drop(
            PgStore::connect(server::server(), PgStoreOptions::new(schema.clone()))
                .await
                .expect("create the store"),
        );
        let held = store_postgres::testkit::StoreLock::take(&schema).await;
        let e = tokio::time::timeout(
            HANG,
            PgStore::connect(
                server::server().options([(setting, "300ms")]),
                PgStoreOptions::new(schema.clone()),
            ),
        )
        .await
        .expect("the open ends at its timeout")
        .expect_err("the lock is held");
        assert!(e.is_retryable(), "{setting}: {e:?}");
        let said = awareness_core::error::ErrorChain(&e).to_string();
        assert!(
            said.contains(&schema) && said.contains("taking the store's lock"),
            "{setting}: {said}"
        );
        held.release().await;
        PgStore::connect(
            server::server().options([(setting, "300ms")]),
            PgStoreOptions::new(schema.clone()),
        )
        .await
        .expect("the same open once the lock is free");
    }
}

/// A store in `schema` whose connections have a `statement_timeout` of 300 ms, as a DBA sets
/// on a role.
async fn with_statement_timeout(schema: &str) -> PgStore {
    PgStore::connect(
        server::server().options([("statement_timeout", "300ms")]),
        PgStoreOptions::new(schema),
    )
    .await
    .expect("connect")
}

/// A recording and a watch that wait for the store's lock past the role's `statement_timeout`
/// wrote nothing, and the same calls succeed once the lock is free: `Busy`, as for
/// `lock_timeout`. They were permanent `Backend` errors (review, stop 58), so a gateway's
/// group commit failed every caller of a batch for good while another gateway stalled
/// mid-write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_meet_the_held_lock_past_the_statement_timeout_are_retryable() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let store = with_statement_timeout(&schema).await;
    let watcher = WatcherKey::parse("agent:main:main").expect("watcher");
    let child = SessionRef::parse("agent:main:subagent:a", "main").expect("ref");
    let held = store_postgres::testkit::StoreLock::take(&schema).await;
    let recorded = tokio::time::timeout(HANG, store.record(human("agent:main:subagent:a"), T0))
        .await
        .expect("the recording ends at its timeout")
        .expect_err("the lock is held");
    assert!(recorded.is_retryable(), "{recorded:?}");
    let watched = tokio::time::timeout(HANG, store.watch(&watcher, &child, T0))
        .await
        .expect("the watch ends at its timeout")
        .expect_err("the lock is held");
    assert!(watched.is_retryable(), "{watched:?}");
    held.release().await;
    assert_eq!(
        store.log_stats().await.expect("stats").rows,
        0,
        "the refused recording wrote nothing"
    );
    let again = store
        .record(human("agent:main:subagent:a"), T0)
        .await
        .expect("the same recording once the lock is free");
    assert_eq!(again.event.sequence, Sequence(1), "no number was taken");
    store
        .watch(&watcher, &child, T0)
        .await
        .expect("the same watch once the lock is free");
}

#[tokio::test]
async fn closing_the_last_handle_closes_its_connections_and_another_handle_keeps_them() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let store = std::sync::Arc::new(
        PgStore::connect(server::server(), PgStoreOptions::new(schema))
            .await
            .expect("connect"),
    );
    store
        .record(human("agent:main:subagent:a"), Timestamp(1_800_000_000_000))
        .await
        .expect("record");
    let pool = store.pool().clone();
    let other = std::sync::Arc::clone(&store);
    store.close().await;
    assert!(!pool.is_closed(), "another handle is left");
    other.close().await;
    assert!(pool.is_closed(), "the last handle closed the pool");
}

#[tokio::test]
async fn an_open_that_may_not_create_refuses_a_missing_store_and_creates_nothing() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let look = || PgStoreOptions::new(schema.clone()).create_if_missing(false);
    let e = refused(look()).await;
    assert_eq!(e.open_failure(), Some(OpenFailure::NotFound), "{e}");
    assert!(e.to_string().contains("no such schema"), "{e}");
    let mut conn = server::server().connect().await.expect("connect");
    let exists = async |conn: &mut sqlx::PgConnection| -> bool {
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(&schema)
            .fetch_one(conn)
            .await
            .expect("look")
    };
    assert!(!exists(&mut conn).await, "the schema was not created");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\"")))
        .execute(&mut conn)
        .await
        .expect("an empty schema");
    let e = refused(look()).await;
    assert_eq!(e.open_failure(), Some(OpenFailure::NotFound), "{e}");
    assert!(e.to_string().contains("session_state_events"), "{e}");
    assert!(tables_of(&schema).await.is_empty(), "no table was created");
    PgStore::connect(server::server(), PgStoreOptions::new(schema.clone()))
        .await
        .expect("an open that may create makes the store there");
    PgStore::connect(server::server(), look())
        .await
        .expect("the store is there now");
}

/// A gateway's role may read and write the store's rows and nothing more (no right to create
/// in the database or the schema): it opens a store that exists, and works. Also a store made
/// before its dedupe keys moved to a hash index, which such a role may not move (it is the
/// table owner's): the open leaves it as it is (review of stop 54's change: the open failed,
/// `must be owner of table session_state_events`).
#[tokio::test]
async fn a_role_that_may_only_read_and_write_rows_opens_an_existing_store() {
    for old in [false, true] {
        a_role_that_may_only_read_and_write_rows_opens(old).await;
    }
}

async fn a_role_that_may_only_read_and_write_rows_opens(old: bool) {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let role = format!("{schema}_gw");
    let (admin, _) = server::fresh_store_in(&schema).await;
    if old {
        back_to_the_old_dedupe_index(admin.pool()).await;
    }
    drop(admin);
    // The role goes whatever happens (its grants go with the schema).
    let role = server::DropRole::create(role, "").await;
    server::run_as_admin(&format!("REVOKE CREATE ON SCHEMA \"{schema}\" FROM PUBLIC")).await;
    role.may_use_rows_of(&schema).await;
    let store = PgStore::connect(
        server::as_role(&role.0),
        PgStoreOptions::new(schema.clone()),
    )
    .await
    .unwrap_or_else(|e| panic!("the limited role cannot open the store (old: {old}): {e}"));
    let recorded = store
        .record(human("agent:main:subagent:a"), Timestamp(1_800_000_000_000))
        .await;
    store.pool().close().await;
    drop(store);
    drop(role);
    assert_eq!(recorded.expect("record").event.sequence.0, 1);
}

/// Writes of one handle waiting for the store (another gateway in the middle of a write) hold
/// at most one of its connections: its reads go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_on_while_writes_wait_for_another_gateway() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let store = std::sync::Arc::new(
        PgStore::connect(
            server::server(),
            PgStoreOptions::new(schema.clone()).max_connections(2),
        )
        .await
        .expect("connect"),
    );
    let now = Timestamp(1_800_000_000_000);
    let first = human("agent:main:subagent:a");
    let session = first.session.clone();
    store.record(first, now).await.expect("record");
    // Another gateway's write holds the row every recording writes.
    let mut other = server::server().connect().await.expect("connect");
    sqlx::query("BEGIN")
        .execute(&mut other)
        .await
        .expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT * FROM \"{schema}\".session_state_counter FOR UPDATE"
    )))
    .execute(&mut other)
    .await
    .expect("lock the counter row");
    let writes: Vec<_> = (0..4)
        .map(|_| {
            let store = std::sync::Arc::clone(&store);
            tokio::spawn(async move { store.record(human("agent:main:subagent:a"), now).await })
        })
        .collect();
    // Until a write of this store waits for the other gateway's transaction, then a little
    // longer, so that writes that could take the pool's other connection would have.
    let holder: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut other)
        .await
        .expect("the other gateway's session");
    let mut probe = server::server().connect().await.expect("connect");
    tokio::time::timeout(HANG, async {
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
            )
            .bind(holder)
            .fetch_one(&mut probe)
            .await
            .expect("probe");
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a write waits for the other gateway");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let page = tokio::time::timeout(HANG, store.changes_since(&session, Sequence(0), 10))
        .await
        .expect("the read waited for the writes past the hang guard")
        .expect("the read succeeds while the writes wait");
    assert_eq!(page.events.len(), 1);
    sqlx::query("COMMIT")
        .execute(&mut other)
        .await
        .expect("commit");
    let mut got: Vec<u64> = Vec::new();
    for w in writes {
        got.push(w.await.expect("join").expect("record").event.sequence.0);
    }
    got.sort_unstable();
    assert_eq!(got, [2, 3, 4, 5]);
}

/// The store's writes run at READ COMMITTED whatever the default isolation: two gateways whose
/// sessions default to SERIALIZABLE record at once without a serialization failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_need_no_particular_default_isolation() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let serializable =
        || server::server().options([("default_transaction_isolation", "serializable")]);
    let mut handles = Vec::new();
    for _ in 0..2 {
        handles.push(std::sync::Arc::new(
            PgStore::connect(serializable(), PgStoreOptions::new(schema.clone()))
                .await
                .expect("connect"),
        ));
    }
    let now = Timestamp(1_800_000_000_000);
    let writes: Vec<_> = (0..40)
        .map(|i| {
            let store = std::sync::Arc::clone(&handles[i % 2]);
            tokio::spawn(async move { store.record(human("agent:main:subagent:a"), now).await })
        })
        .collect();
    let mut got = Vec::new();
    for w in writes {
        got.push(
            w.await
                .expect("join")
                .expect("no serialization failure")
                .event
                .sequence
                .0,
        );
    }
    got.sort_unstable();
    assert_eq!(got, (1..=40).collect::<Vec<u64>>());
}

/// A counter row lost (a hand edit) is made again above every event there is, by an open that
/// may create, even with the heads lost too (the events alone still name the numbers handed
/// out); an open that may not writes nothing, and its recordings fail saying why. (What the
/// mutation did: left the events out of the numbers the row comes back above, so that with
/// the heads lost it came back at 0 and the next recording took a number an event holds, and
/// failed; review of stop 69, P732.)
#[tokio::test]
async fn a_lost_counter_row_comes_back_above_every_event() {
    let (store, schema) = server::fresh_store().await;
    let now = Timestamp(1_800_000_000_000);
    for _ in 0..3 {
        store
            .record(human("agent:main:subagent:a"), now)
            .await
            .expect("record");
    }
    let a = SessionRef::parse("agent:main:subagent:a", "main").expect("ref");
    assert!(store.delete_head_row(&a).await.expect("lose the head"));
    sqlx::query("DELETE FROM session_state_counter")
        .execute(store.pool())
        .await
        .expect("lose the row");
    let looking = PgStore::connect(
        server::server(),
        PgStoreOptions::new(schema.name()).create_if_missing(false),
    )
    .await
    .expect("an open that may not create opens the store");
    let e = looking
        .record(human("agent:main:subagent:a"), now)
        .await
        .expect_err("no counter to number the event with");
    assert!(
        matches!(&e, StoreError::Corrupt { .. }) && e.to_string().contains("counter"),
        "{e}"
    );
    // So do the other writes, which count themselves in the row (they failed with a bare
    // `RowNotFound`: review of stop 54's change).
    let e = looking
        .watch(
            &WatcherKey::parse("agent:main:main").expect("watcher"),
            &SessionRef::parse("agent:main:subagent:a", "main").expect("ref"),
            now,
        )
        .await
        .expect_err("no counter to count the write in");
    assert!(
        matches!(&e, StoreError::Corrupt { .. }) && e.to_string().contains("counter"),
        "{e}"
    );
    let opened = PgStore::connect(server::server(), PgStoreOptions::new(schema.name()))
        .await
        .expect("an open that may create");
    let next = opened
        .record(human("agent:main:subagent:b"), now)
        .await
        .expect("record");
    assert_eq!(
        next.event.sequence,
        Sequence(4),
        "above every event there is"
    );
}

/// A counter row lost after the newest events were pruned (or their session deleted) comes
/// back above every sequence the store still names: its heads' and cursors', not only its
/// events'. It came back at the highest event left, and handed out numbers again: the head
/// went back below its watermark, and the watcher of the session was told nothing. Also with
/// no cursor on the session, where the head alone names the numbers (leaving the heads out
/// passed every test while a cursor named them too: review of stop 60).
#[tokio::test]
async fn a_lost_counter_row_comes_back_above_the_heads_and_cursors_of_pruned_events() {
    for watched in [true, false] {
        a_lost_counter_row_comes_back_above_pruned_events(watched).await;
    }
}

/// `store`'s counter row deleted (as a hand edit or a lost write could leave it), then the store
/// opened again by an open that may create, which makes the row again.
async fn reopened_without_its_counter_row(store: &PgStore, schema: &str) -> PgStore {
    sqlx::query("DELETE FROM session_state_counter")
        .execute(store.pool())
        .await
        .expect("lose the row");
    PgStore::connect(server::server(), PgStoreOptions::new(schema))
        .await
        .expect("an open that may create")
}

async fn a_lost_counter_row_comes_back_above_pruned_events(watched: bool) {
    let (store, schema) = server::fresh_store().await;
    let now = Timestamp(1_800_000_000_000);
    let a = SessionRef::parse("agent:main:subagent:a", "main").expect("ref");
    let watcher = WatcherKey::parse("agent:main:main").expect("watcher");
    for _ in 0..3 {
        store
            .record(human("agent:main:subagent:a"), now)
            .await
            .expect("record");
    }
    if watched {
        store.watch(&watcher, &a, now).await.expect("watch");
    }
    let policy = RetentionPolicy {
        max_age_ms: 1_000,
        ..RetentionPolicy::default()
    };
    let report = store
        .prune(&policy, Timestamp(now.millis() + 10_000))
        .await
        .expect("prune");
    assert_eq!(report.events_by_age, 3, "{report:?}");
    let opened = reopened_without_its_counter_row(&store, schema.name()).await;
    let next = opened
        .record(human("agent:main:subagent:a"), now)
        .await
        .expect("record");
    assert_eq!(
        next.event.sequence,
        Sequence(4),
        "never handed out again (watched: {watched})"
    );
    assert_eq!(
        next.notices.len(),
        usize::from(watched),
        "the watcher is told: {next:?}"
    );
}

/// Puts back the dedupe index a store had before stop 54 (a `UNIQUE` B-tree, which refuses
/// long keys), as an older version left it.
async fn back_to_the_old_dedupe_index(pool: &sqlx::PgPool) {
    sqlx::query(
        "ALTER TABLE session_state_events DROP CONSTRAINT session_state_events_dedupe,
         ADD CONSTRAINT session_state_events_dedupe_key_key UNIQUE (dedupe_key)",
    )
    .execute(pool)
    .await
    .expect("make the store as it was");
}

/// A store made before its dedupe keys were kept unique by a hash index (a B-tree `UNIQUE`,
/// whose entries PostgreSQL caps at 2,704 bytes) is moved to the hash index by the next open
/// that may create, and then takes a dedupe key of 4,096 bytes of random text, which the
/// B-tree refused; the uniqueness holds after the move. An open that may not create changes
/// nothing.
#[tokio::test]
async fn a_store_with_the_old_dedupe_index_takes_long_dedupe_keys_once_reopened() {
    let (store, schema) = server::fresh_store().await;
    back_to_the_old_dedupe_index(store.pool()).await;
    let now = Timestamp(1_800_000_000_000);
    let key = awareness_core::testkit::checks::incompressible(4096);
    let long = || human("agent:main:subagent:a").with_dedupe_key(&key);
    let e = store
        .record(long(), now)
        .await
        .expect_err("the B-tree refuses it");
    assert!(!e.is_retryable(), "{e}");

    let constraints = async |store: &PgStore| -> Vec<String> {
        sqlx::query_scalar(
            "SELECT conname::text FROM pg_constraint
             WHERE conrelid = 'session_state_events'::regclass AND contype IN ('u', 'x')",
        )
        .fetch_all(store.pool())
        .await
        .expect("constraints")
    };
    let looking = PgStore::connect(
        server::server(),
        PgStoreOptions::new(schema.name()).create_if_missing(false),
    )
    .await
    .expect("an open that may not create");
    assert_eq!(
        constraints(&looking).await,
        ["session_state_events_dedupe_key_key"]
    );
    let opened = PgStore::connect(server::server(), PgStoreOptions::new(schema.name()))
        .await
        .expect("an open that may create");
    assert_eq!(constraints(&opened).await, ["session_state_events_dedupe"]);
    let first = opened.record(long(), now).await.expect("record");
    assert!(!first.deduplicated);
    let again = opened.record(long(), now).await.expect("record");
    assert!(again.deduplicated, "still unique");
    assert_eq!(again.event.sequence, first.event.sequence);
}

/// A statement the role's `statement_timeout` cancels once the store's lock is held (here a
/// recording's, and a read's, held up by another session's lock on the events table) is a
/// permanent error: the store cannot tell such a cancel from a statement slower than the
/// timeout, which fails the same way at every retry, and `Busy` would promise that a retry
/// may succeed. Only the wait for the store's lock is `Busy` (the two tests above). The first
/// version of that fix made every cancel `Busy` (the second reading of stop 58: a read of a
/// large log under a 10 ms timeout was "busy" at every try).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_cancelled_once_the_stores_lock_is_held_is_not_retryable() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let store = with_statement_timeout(&schema).await;
    store
        .record(human("agent:main:subagent:a"), T0)
        .await
        .expect("a first recording");
    let mut other = server::server().connect().await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; LOCK TABLE \"{schema}\".session_state_events IN ACCESS EXCLUSIVE MODE"
    )))
    .execute(&mut other)
    .await
    .expect("lock the events table");
    let recorded = tokio::time::timeout(HANG, store.record(human("agent:main:subagent:a"), T0))
        .await
        .expect("the recording ends at its timeout")
        .expect_err("the table is locked");
    let read = tokio::time::timeout(HANG, store.log_stats())
        .await
        .expect("the read ends at its timeout")
        .expect_err("the table is locked");
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("let the table go");
    for e in [&recorded, &read] {
        assert!(!e.is_retryable(), "{e:?}");
        assert!(
            awareness_core::error::ErrorChain(e)
                .to_string()
                .contains("statement timeout"),
            "{e:?}"
        );
    }
    assert_eq!(
        store.log_stats().await.expect("stats").rows,
        1,
        "the cancelled recording wrote nothing"
    );
}

/// An open whose statement the role's `statement_timeout` cancels past the store's lock (here
/// another session holds the counter's table, which the open reads once it has the lock) is
/// not retryable, as a write's is not (the test above): such a cancel cannot be told from a
/// statement too slow for the timeout, which a retry meets again. (Every cancel of an open
/// taken for the wait for the lock, retryable, passed every test: review of stop 60; a
/// gateway retrying its open would retry for ever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_cancelled_past_the_stores_lock_is_not_retryable() {
    let (store, schema) = server::fresh_store().await;
    drop(store);
    let mut other = server::server().connect().await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; LOCK TABLE \"{}\".session_state_counter IN ACCESS EXCLUSIVE MODE",
        schema.name()
    )))
    .execute(&mut other)
    .await
    .expect("lock the counter's table");
    let opened = tokio::time::timeout(
        HANG,
        PgStore::connect(
            server::server().options([("statement_timeout", "300ms")]),
            PgStoreOptions::new(schema.name()),
        ),
    )
    .await
    .expect("the open ends at its timeout");
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("let the table go");
    let e = opened.expect_err("the table is locked");
    assert!(!e.is_retryable(), "{e:?}");
    assert!(
        awareness_core::error::ErrorChain(&e)
            .to_string()
            .contains("statement timeout"),
        "{e:?}"
    );
}

/// A role that may not create in the database is refused a missing store as
/// `PermissionDenied`, naming the schema, and nothing is created. (Read as `Other` when the
/// server's `42501` was not recognised, and every test passed: review of stop 60.)
#[tokio::test]
async fn a_role_that_may_not_create_is_refused_a_missing_store_as_permission_denied() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let opened = opened_as_a_new_role(&format!("{schema}_nc"), "", &schema).await;
    let e = opened.expect_err("refused");
    assert_eq!(e.open_failure(), Some(OpenFailure::PermissionDenied), "{e}");
    assert!(e.to_string().contains(&schema), "{e}");
    assert!(!e.is_retryable());
    let mut conn = server::server().connect().await.expect("connect");
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(&schema)
            .fetch_one(&mut conn)
            .await
            .expect("look");
    assert!(!exists, "nothing was created");
}

/// A store the first version of store-postgres made (its counter without the `commits` column
/// a later version added) is refused by an open that may not create, saying it needs the
/// column, and changed by none; an open that may create adds the column, and the store goes on
/// from its events. Every open refused it as "not this store's" (review, stop 58: a store made
/// by the crate's first commit, with three events, could not be read or written). A counter
/// that lacks another column as well is not the store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_an_earlier_version_made_gains_the_column_it_lacks() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let store = PgStore::connect(server::server(), PgStoreOptions::new(schema.clone()))
        .await
        .expect("create the store");
    for _ in 0..3 {
        store
            .record(human("agent:main:subagent:a"), T0)
            .await
            .expect("record");
    }
    store.pool().close().await;
    let mut admin = server::server().connect().await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE \"{schema}\".session_state_counter DROP COLUMN commits"
    )))
    .execute(&mut admin)
    .await
    .expect("make it as the first version did");
    let e = refused(PgStoreOptions::new(schema.clone()).create_if_missing(false)).await;
    assert_eq!(e.open_failure(), Some(OpenFailure::NeedsMigration), "{e}");
    assert!(e.to_string().contains("earlier version"), "{e}");
    let columns = || async {
        let mut conn = server::server().connect().await.expect("connect");
        sqlx::query_scalar::<_, String>(
            "SELECT column_name::text FROM information_schema.columns
             WHERE table_schema = $1 AND table_name = 'session_state_counter' ORDER BY 1",
        )
        .bind(schema.clone())
        .fetch_all(&mut conn)
        .await
        .expect("columns")
    };
    assert_eq!(
        columns().await,
        ["id", "last_sequence"],
        "the refusal changed nothing"
    );
    let store = PgStore::connect(server::server(), PgStoreOptions::new(schema.clone()))
        .await
        .expect("an open that may create adds the column");
    assert_eq!(columns().await, ["commits", "id", "last_sequence"]);
    let next = store
        .record(human("agent:main:subagent:a"), T0)
        .await
        .expect("record");
    assert_eq!(
        next.event.sequence,
        Sequence(4),
        "it goes on from its events"
    );
    store.pool().close().await;
    // A counter table that lacks another column as well is not the store's, nor an earlier
    // version's to migrate: only a table whose every missing column is one a later version added
    // is. (Under mutation, `any` for `all`, such a table was called an earlier version's, and
    // every test passed; review of stop 64, PG33.)
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE \"{schema}\".session_state_counter DROP COLUMN commits, \
         DROP COLUMN last_sequence"
    )))
    .execute(&mut admin)
    .await
    .expect("a counter table of someone else's");
    let e = refused(PgStoreOptions::new(schema.clone()).create_if_missing(false)).await;
    assert_eq!(e.open_failure(), Some(OpenFailure::NotAStore), "{e}");
}

/// A store keeps its schema's version: a new one says this build's, a store made before it
/// kept one (the table dropped) gains it at an open that may create, as an earlier kept version
/// is raised to this build's, and a store of a later version is refused by every open, which
/// changes nothing. Without it a build older than the
/// store's meaning opened it silently (review, stop 58: a build of the crate's first commit
/// recorded into a current store, counting no commit and sending no hint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_keeps_its_schema_version_and_a_later_one_is_refused() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let version = || async {
        let mut conn = server::server().connect().await.expect("connect");
        sqlx::query_scalar::<_, i32>(sqlx::AssertSqlSafe(format!(
            "SELECT version FROM \"{schema}\".awareness_schema_version WHERE id = 0"
        )))
        .fetch_optional(&mut conn)
        .await
    };
    let store = PgStore::connect(server::server(), PgStoreOptions::new(schema.clone()))
        .await
        .expect("create the store");
    assert_eq!(version().await.expect("the version"), Some(2));
    store.pool().close().await;
    let mut admin = server::server().connect().await.expect("connect");
    let run = |sql: String| sqlx::raw_sql(sqlx::AssertSqlSafe(sql));
    run(format!("DROP TABLE \"{schema}\".awareness_schema_version"))
        .execute(&mut admin)
        .await
        .expect("as a store made before the version was kept");
    let store = PgStore::connect(
        server::server(),
        PgStoreOptions::new(schema.clone()).create_if_missing(false),
    )
    .await
    .expect("an open that may not create takes it as it is");
    assert!(version().await.is_err(), "and writes nothing");
    store.pool().close().await;
    let store = PgStore::connect(server::server(), PgStoreOptions::new(schema.clone()))
        .await
        .expect("an open that may create");
    assert_eq!(version().await.expect("the version"), Some(2));
    store.pool().close().await;
    // An earlier kept version (1, by hand here; the next build that raises the version meets
    // this build's 2 the same way) is raised to this build's by an open that may create. (Under
    // mutation only a store of no kept version was, and every test passed; review of stop 64,
    // PG35.)
    run(format!(
        "UPDATE \"{schema}\".awareness_schema_version SET version = 1"
    ))
    .execute(&mut admin)
    .await
    .expect("as an earlier version kept it");
    PgStore::connect(server::server(), PgStoreOptions::new(schema.clone()))
        .await
        .expect("an open that may create")
        .pool()
        .close()
        .await;
    assert_eq!(
        version().await.expect("the version"),
        Some(2),
        "raised to this build's"
    );
    run(format!(
        "UPDATE \"{schema}\".awareness_schema_version SET version = 3"
    ))
    .execute(&mut admin)
    .await
    .expect("as a later version would");
    for create in [true, false] {
        let e = refused(PgStoreOptions::new(schema.clone()).create_if_missing(create)).await;
        assert_eq!(e.open_failure(), Some(OpenFailure::Unsupported), "{e}");
        assert!(e.to_string().contains("later version"), "{e}");
    }
    assert_eq!(
        version().await.expect("the version"),
        Some(3),
        "left as it was"
    );
}

/// A schema guard dropped while its thread unwinds from a panic for want of the server's
/// variable (the scale example's guard, made before its connection) does not panic again:
/// the process ended in an abort ("panic in a destructor during cleanup", review, stop 58)
/// rather than the panic that names the variable. Run in a child process without the
/// variable; the child's test fails with its own panic, and the harness exits as for any
/// failed test.
#[test]
fn a_schema_guard_without_the_server_variable_is_dropped_quietly() {
    const CHILD: &str = "AWARENESS_TEST_SCHEMA_GUARD_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let _schema = store_postgres::testkit::Schema::fresh("guard");
        store_postgres::testkit::server_url();
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "a_schema_guard_without_the_server_variable_is_dropped_quietly",
            "--test-threads=1",
        ])
        .env_remove(store_postgres::testkit::SERVER_VAR)
        .env(CHILD, "1")
        .output()
        .expect("run the child");
    let err = String::from_utf8_lossy(&out.stderr);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(101), "{said}{err}");
    assert!(said.contains(store_postgres::testkit::SERVER_VAR), "{said}");
    assert!(!err.contains("panic in a destructor"), "{err}");
}

/// The bounds the options document are taken themselves: an idle transaction timeout of `i32::MAX`
/// ms (PostgreSQL's largest) and a listener keepalive of 1 ms ("at least 1 ms"). Refusing either
/// bound passed every other test: review of stop 62, P10, P11.
#[tokio::test]
async fn the_largest_idle_timeout_and_the_shortest_keepalive_are_taken() {
    let bounds: [fn(PgStoreOptions) -> PgStoreOptions; 2] = [
        |o| o.idle_transaction_timeout(Duration::from_millis(i32::MAX as u64)),
        |o| o.listener_keepalive(Duration::from_millis(1)),
    ];
    for options in bounds {
        let schema = server::fresh_schema();
        let _drop = server::DropSchema(schema.clone());
        let store = PgStore::connect(server::server(), options(PgStoreOptions::new(schema)))
            .await
            .expect("an option at its documented bound is taken");
        store
            .record(human("agent:main:subagent:a"), T0)
            .await
            .expect("record");
        store.pool().close().await;
    }
}

/// A role that may only read and write rows opens a store made before the schema's version was kept
/// (no version table): it may not create the table, so the version is left for the owner's open to
/// write, with a warning, and the store opens. (What the mutation did: the open failed there,
/// "writing the schema's version"; the existing limited-role test opens a store that already keeps
/// its version; review of stop 64, PG36.)
#[tokio::test]
async fn a_role_that_may_only_read_and_write_rows_opens_a_store_of_no_kept_version() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let (role, opened) = an_earlier_store_opened_by_a_row_only_role(
        &schema,
        "DROP TABLE \"{schema}\".awareness_schema_version",
    )
    .await;
    let recorded = match opened {
        Ok(store) => {
            let recorded = store.record(human("agent:main:subagent:a"), T0).await;
            store.pool().close().await;
            Ok(recorded)
        }
        Err(e) => Err(e),
    };
    drop(role);
    let recorded =
        recorded.unwrap_or_else(|e| panic!("the limited role cannot open the store: {e}"));
    assert_eq!(recorded.expect("record").event.sequence.0, 1);
}

/// A lost counter row comes back above a cursor's material sequence, the highest sequence a store
/// may still name once the events and the head row of its target are gone (a watcher frozen at its
/// first notice while a second material event came: notified 1, material 2). (What the mutation
/// did: `material_sequence` left out of the rebuilt row, and sequence 2 was handed out again while
/// a cursor still named it; review of stop 64, PG38.)
#[tokio::test]
async fn a_lost_counter_row_comes_back_above_a_cursors_material_sequence() {
    let (store, schema) = server::fresh_store().await;
    let a = SessionRef::parse("agent:main:subagent:a", "main").expect("ref");
    let watcher = WatcherKey::parse("agent:main:main").expect("watcher");
    store.watch(&watcher, &a, T0).await.expect("watch");
    for _ in 0..2 {
        store
            .record(human("agent:main:subagent:a"), T0)
            .await
            .expect("record");
    }
    let cursor = store
        .cursor(&watcher, &a.session_key)
        .await
        .expect("read")
        .expect("the cursor");
    assert!(
        cursor.material > cursor.notified && cursor.material > cursor.last_seen,
        "the cursor names a sequence no other of its numbers does: {cursor:?}"
    );
    for s in [1, 2] {
        assert!(store.delete_event_row(Sequence(s)).await.expect("delete"));
    }
    assert!(store.delete_head_row(&a).await.expect("delete the head"));
    let opened = reopened_without_its_counter_row(&store, schema.name()).await;
    let next = opened
        .record(human("agent:main:subagent:b"), T0)
        .await
        .expect("record");
    assert!(
        next.event.sequence > cursor.material,
        "never handed out again: {:?} after the cursor's material {:?}",
        next.event.sequence,
        cursor.material
    );
}

/// A role that may only read and write rows, opening a store an earlier version made (its
/// counter without `commits`), may not add the column (the table owner's open does): it is
/// refused as a store that needs migration, which says who can migrate it, not as a role
/// denied a right. (What the mutation did: answered the failed `ALTER TABLE` as the open's own
/// error, a permission denied; review of stop 67, P529.)
#[tokio::test]
async fn a_role_that_may_not_add_the_missing_column_is_told_the_store_needs_migration() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let (role, opened) = an_earlier_store_opened_by_a_row_only_role(
        &schema,
        "ALTER TABLE \"{schema}\".session_state_counter DROP COLUMN commits",
    )
    .await;
    drop(role);
    let e = opened.expect_err("the store lacks a column this role may not add");
    assert_eq!(e.open_failure(), Some(OpenFailure::NeedsMigration), "{e}");
    assert!(e.to_string().contains("earlier version"), "{e}");
}

/// A store made in `schema`, then changed by `earlier` (SQL in which `{schema}` stands for the
/// schema's name) to what an earlier version made, opened by a role that may only read and write
/// rows (it may not create in the schema). The role is dropped with the answer.
async fn an_earlier_store_opened_by_a_row_only_role(
    schema: &str,
    earlier: &str,
) -> (server::DropRole, Result<PgStore, StoreError>) {
    let (admin, _) = server::fresh_store_in(schema).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(earlier.replace("{schema}", schema)))
        .execute(admin.pool())
        .await
        .expect("make it as an earlier version did");
    admin.pool().close().await;
    drop(admin);
    let role = server::DropRole::create(format!("{schema}_gw"), "").await;
    server::run_as_admin(&format!("REVOKE CREATE ON SCHEMA \"{schema}\" FROM PUBLIC")).await;
    role.may_use_rows_of(schema).await;
    let opened = PgStore::connect(
        server::as_role(&role.0),
        PgStoreOptions::new(schema.to_owned()),
    )
    .await;
    (role, opened)
}

/// The store's key columns compare byte by byte (`COLLATE "C"`) whatever the database's own
/// collation, so that its listings come in the order of the other stores on a database made
/// with a locale's collation too (the test server's is byte-ordered, so the order alone would
/// not tell). (What the mutation did: made the heads' keys with the database's collation;
/// review of stop 69, P736.)
#[tokio::test]
async fn the_stores_keys_compare_byte_by_byte() {
    let (_store, schema) = server::fresh_store().await;
    let mut conn = server::server().connect().await.expect("connect");
    let byte_ordered: Vec<(String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text FROM information_schema.columns
         WHERE table_schema = $1 AND table_name LIKE 'session\\_%' AND collation_name = 'C'
         ORDER BY 1, 2",
    )
    .bind(schema.name())
    .fetch_all(&mut conn)
    .await
    .expect("read the columns' collations");
    let expected: Vec<(String, String)> = [
        ("session_state_events", "agent_id"),
        ("session_state_events", "dedupe_key"),
        ("session_state_events", "session_key"),
        ("session_state_heads", "agent_id"),
        ("session_state_heads", "session_key"),
        ("session_upstream_links", "agent_id"),
        ("session_upstream_links", "session_key"),
        ("session_watch_cursors", "target_agent_id"),
        ("session_watch_cursors", "target_session_key"),
        ("session_watch_cursors", "watcher_session_key"),
    ]
    .into_iter()
    .map(|(t, c)| (t.to_owned(), c.to_owned()))
    .collect();
    assert_eq!(byte_ordered, expected);
}

/// A store opened with the default options has the server end a transaction of it that sits
/// idle for a minute (`DEFAULT_IDLE_TRANSACTION_TIMEOUT`, the 60 s the documentation gives).
/// (What the mutation did: made the default 30 s; the unit test compares the options with the
/// constant, so it passed; review of stop 69, P706.)
#[tokio::test]
async fn a_store_of_the_default_options_ends_transactions_idle_for_a_minute() {
    let (store, _schema) = server::fresh_store().await;
    let shown: String = sqlx::query_scalar("SHOW idle_in_transaction_session_timeout")
        .fetch_one(store.pool())
        .await
        .expect("the session's setting");
    assert_eq!(shown, "1min");
}
