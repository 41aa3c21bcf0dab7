//! Group commit: the shared checks (`awareness_core::group_commit_suite!`: concurrent
//! recordings share write transactions, each caller gets its own event, `group_commit(1)` turns
//! it off, a batch holds at most `group_commit`, `0` is refused, a cursor row that cannot be
//! read fails no batch), and what store-sqlite does of its own: a dedupe hit on a row torn
//! behind the store's back spends one sequence on both of its paths, a batch that meets
//! another connection's lock fails at once, and a write that met it is rolled back without a
//! warning. (That an event failing in a batch fails only its
//! caller is a check of the durable suite; that the batched protocol equals the per-event one
//! is the model test's `Concurrent` step; that cancelled callers cancel nobody else's commit,
//! and that an event whose caller gave up while it waited in the queue is never committed,
//! are conformance checks.)

use std::path::PathBuf;
use std::sync::Arc;

use awareness_core::testkit::group_commit::{Grouped, T0, event, session};
use awareness_core::testkit::poll_once;
use awareness_core::{CursorStore, EventStore, Sequence, StoreError, WatcherKey};
use store_sqlite::{SqliteOptions, SqliteStore};
use write_lock::WriteLock;

mod write_lock;

async fn open(dir: &tempfile::TempDir, options: SqliteOptions) -> Arc<SqliteStore> {
    Arc::new(
        SqliteStore::open_with(dir.path().join("state.sqlite"), options)
            .await
            .expect("open"),
    )
}

awareness_core::raw_access_forwarding!(SqliteStore);

/// Opens `path` with `group_commit(max_events)` for the shared group-commit checks.
async fn open_grouped(path: PathBuf, max_events: usize) -> Result<Grouped, StoreError> {
    let store = Arc::new(
        SqliteStore::open_with(path, SqliteOptions::new().group_commit(max_events)).await?,
    );
    let raw = Arc::new(Raw(Arc::clone(&store)));
    Ok(Grouped::new(
        store,
        SqliteStore::write_transactions,
        SqliteStore::largest_batch,
        raw,
    ))
}

awareness_core::group_commit_suite!(open_grouped);

/// Writes, behind the store's back, a torn row (an unknown actor type) under the dedupe key
/// "torn".
async fn insert_torn_row(path: &std::path::Path) {
    use sqlx::{ConnectOptions as _, Connection as _};
    let mut raw = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .connect()
        .await
        .expect("raw connection");
    sqlx::query(
        "INSERT INTO session_state_events (dedupe_key, session_key, agent_id, kind, actor_type,
           occurred_at, summary) VALUES ('torn', 'agent:main:subagent:s0', 'main', 'created',
           'no-such-actor', 0, 'torn')",
    )
    .execute(&mut raw)
    .await
    .expect("insert the torn row");
    raw.close().await.expect("close");
}

/// A dedupe hit on a row that cannot be read fails its caller with `Corrupt` and, like every
/// other call, spends one sequence, on a target without cursors (recorded in one batch) and
/// on a watched one (two batches) alike.
#[tokio::test]
async fn a_dedupe_hit_on_a_torn_row_fails_and_spends_one_sequence_watched_or_not() {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(&dir, SqliteOptions::new()).await;
    insert_torn_row(&dir.path().join("state.sqlite")).await;
    // The torn row holds sequence 1; each call below spends the next one.
    let mut last = Sequence(1);
    for watched in [false, true] {
        if watched {
            let watcher = WatcherKey::new(session(9).session_key).expect("watcher");
            store.watch(&watcher, &session(0), T0).await.expect("watch");
        }
        let err = store
            .record(event(0).with_dedupe_key("torn"), T0)
            .await
            .expect_err("the torn row's caller fails");
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        let next = store.record(event(1), T0).await.expect("record");
        assert_eq!(
            next.event.sequence,
            Sequence(last.0 + 2),
            "watched {watched}: the failed hit did not spend exactly one sequence"
        );
        last = next.event.sequence;
    }
}

/// Recordings that group while another connection holds the write lock all get a retryable
/// error after about one busy timeout each batch, not one more busy timeout per event: the lock
/// failed, not an event. Once the lock is released, recording works.
///
/// The calls are lined up without relying on how tasks are scheduled: the first, polled once,
/// takes the write connection (it is free) and waits on SQLite's lock; each of the others,
/// polled once, queues its event and waits for the connection, which the first cannot give up
/// before it is polled again, once every event is queued. So one transaction meets the lock
/// for the first caller alone, and exactly one more for all the others in one batch. (Spawned
/// as tasks straight away, a worker descheduled past the first one's busy timeout queued its
/// event after the batch was taken, and began a third.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recordings_that_meet_the_lock_in_a_batch_all_fail_at_once() {
    const BUSY: std::time::Duration = std::time::Duration::from_millis(500);
    const CALLS: usize = 32;
    let dir = tempfile::tempdir().expect("dir");
    let store = open(&dir, SqliteOptions::new().busy_timeout(BUSY)).await;
    store.record(event(0), T0).await.expect("record");
    let lock = WriteLock::take(&dir.path().join("state.sqlite")).await;
    let before = store.write_transactions();
    let mut calls = Vec::with_capacity(CALLS);
    for i in 1..=CALLS {
        let s = Arc::clone(&store);
        let mut call = Box::pin(async move { s.record(event(i), T0).await });
        assert!(
            !poll_once(call.as_mut()).await,
            "call {i} answered while the write lock was held elsewhere"
        );
        if i == 1 {
            assert_eq!(
                store.write_transactions() - before,
                1,
                "the first call took the free connection and met the lock"
            );
        }
        calls.push(call);
    }
    // Every event is queued, and the first call holds the connection until it is driven on.
    let tasks: Vec<_> = calls.into_iter().map(tokio::spawn).collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let err = t
            .await
            .expect("join")
            .expect_err("the write lock is held elsewhere");
        assert!(err.is_retryable(), "call {}: {err}", i + 1);
    }
    // The first caller alone, then one batch of the others, each meeting the lock once.
    // Retrying the batch's events alone began one more transaction for each (33 in all), or,
    // stopping at the first that met the lock, one more (3), each waiting the busy timeout
    // again.
    let began = store.write_transactions() - before;
    assert_eq!(
        began, 2,
        "{CALLS} recordings behind a held lock: the first alone, then one batch of the others"
    );
    assert_eq!(
        store.largest_batch(),
        CALLS - 1,
        "the {} calls queued behind the first went in one batch",
        CALLS - 1
    );
    lock.release().await;
    store
        .record(event(CALLS + 1), T0)
        .await
        .expect("record once the lock is released");
    assert_eq!(
        store.log_stats().await.expect("stats").rows,
        2,
        "nothing recorded while the lock was held"
    );
}

/// A write that meets another connection's lock (its `BEGIN IMMEDIATE` answered busy, so no
/// transaction began) is rolled back quietly: SQLite's "no transaction is active" is the usual
/// answer to that rollback, not a failure, and nothing is warned; the next write, once the lock
/// is gone, records. (That answer taken for a failed rollback, a mutation every test passed,
/// every write that met a lock warned "rollback after an interrupted write failed", and the
/// next write rolled back again first: review of stop 61.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_met_the_lock_is_rolled_back_without_a_warning() {
    let capture = awareness_core::testkit::logs::Capture::warnings();
    let dir = tempfile::tempdir().expect("dir");
    let busy = std::time::Duration::from_millis(50);
    let store = open(&dir, SqliteOptions::new().busy_timeout(busy)).await;
    let lock = WriteLock::take(&dir.path().join("state.sqlite")).await;
    let met = store.record(event(0), T0).await;
    assert!(matches!(met, Err(StoreError::Busy { .. })), "{met:?}");
    lock.release().await;
    store
        .record(event(1), T0)
        .await
        .expect("records once the lock is gone");
    let named = dir.path().join("state.sqlite").display().to_string();
    assert_eq!(
        capture.said(&["rollback after an interrupted write failed", &named]),
        0,
        "{:?}",
        capture.lines()
    );
}

/// A batch that commits ends quietly: the task that ran it lets go of it, and nothing is
/// handed to the thread that finishes a batch dropped with its runtime, nor logged as a group
/// commit that panicked. (What the mutation did: the finished batch was kept, and dropping it
/// handed it to that thread, which polled it again and logged "a group commit panicked; its
/// recordings fail" after every batch that committed; review of stop 69, S908.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_committed_logs_no_panic() {
    let capture = awareness_core::testkit::logs::Capture::warnings();
    let dir = tempfile::tempdir().expect("dir");
    let store = open(&dir, SqliteOptions::new().group_commit(64)).await;
    // The first call, polled once, takes the free connection; the others queue behind it, and
    // the next writer takes them all in one batch.
    let mut calls = Vec::new();
    for i in 0..5 {
        let s = Arc::clone(&store);
        let mut call = Box::pin(async move { s.record(event(i), T0).await });
        assert!(!poll_once(call.as_mut()).await, "call {i} answered at once");
        calls.push(call);
    }
    for call in calls {
        call.await.expect("record");
    }
    assert!(
        store.largest_batch() >= 2,
        "a batch held other callers' events (else this shows nothing)"
    );
    let named = dir.path().join("state.sqlite").display().to_string();
    // A bounded wait for the thread a kept batch would be handed to: only broken code ends it
    // early.
    for _ in 0..100 {
        if capture.said(&["group commit panicked", &named]) > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        capture.said(&["group commit panicked", &named]),
        0,
        "{:?}",
        capture.lines()
    );
}
