//! Group commit: concurrent recordings share write transactions, each caller gets its own
//! event, `group_commit(1)` turns it off, and an event failing in a batch fails only its
//! caller. (That the batched protocol equals the per-event one is the model test's `Concurrent`
//! step; that cancelled callers cancel nobody else's commit is a conformance check.)

use std::sync::Arc;

use awareness_core::{
    ActorType, EventKind, EventStore, NewEvent, Sequence, SessionRef, Timestamp, WatcherKey,
};
use awareness_core::{AwarenessStoreExt as _, CursorStore as _};
use store_sqlite::{SqliteOptions, SqliteStore};

const T0: Timestamp = Timestamp(1_800_000_000_000);

fn session(i: usize) -> SessionRef {
    SessionRef::parse(&format!("agent:main:subagent:s{i}"), "main").expect("ref")
}

fn event(i: usize) -> NewEvent {
    NewEvent::new(
        session(i % 4),
        EventKind::HumanDirectMessage,
        ActorType::Human,
        format!("message {i}"),
    )
}

async fn open(dir: &tempfile::TempDir, options: SqliteOptions) -> Arc<SqliteStore> {
    Arc::new(
        SqliteStore::open_with(dir.path().join("state.sqlite"), options)
            .await
            .expect("open"),
    )
}

/// Records `n` events on `n` tasks at once; answers the transactions they took.
async fn record_at_once(store: &Arc<SqliteStore>, n: usize) -> u64 {
    let before = store.write_transactions();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = Arc::clone(store);
            tokio::spawn(async move { store.record(event(i), T0).await })
        })
        .collect();
    let mut seqs = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let rec = t.await.expect("join").expect("record");
        assert_eq!(rec.event.summary, format!("message {i}"), "its own event");
        seqs.push(rec.event.sequence);
    }
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), n, "distinct sequences");
    store.write_transactions() - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_recordings_share_write_transactions() {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(&dir, SqliteOptions::new()).await;
    let watcher = WatcherKey::parse("agent:main:main").expect("watcher");
    store.watch(&watcher, &session(0), T0).await.expect("watch");
    let txs = record_at_once(&store, 64).await;
    assert!(
        txs < 64,
        "64 concurrent recordings took {txs} write transactions: none were grouped"
    );
    assert_eq!(store.log_stats().await.expect("stats").rows, 64);
    let cursor = store
        .cursor(&watcher, &session(0).session_key)
        .await
        .expect("cursor")
        .expect("exists");
    assert_eq!(cursor.last_seen, Sequence(0));
    assert_eq!(
        cursor.material,
        store.state_version(&session(0)).await.expect("head"),
        "the cursor saw the last event on its target"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_of_one_is_one_transaction_per_recording() {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(&dir, SqliteOptions::new().group_commit(1)).await;
    assert_eq!(record_at_once(&store, 32).await, 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_failing_in_a_batch_fails_only_its_own_caller() {
    use sqlx::{ConnectOptions as _, Connection as _};
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("state.sqlite");
    let store = open(&dir, SqliteOptions::new()).await;
    // A torn row (an unknown kind) under the dedupe key "torn", written behind the store's back.
    let mut raw = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .expect("raw connection");
    sqlx::query(
        "INSERT INTO session_state_events (dedupe_key, session_key, agent_id, kind, actor_type,
           occurred_at, summary) VALUES ('torn', 'agent:main:subagent:s0', 'main', 'no-such-kind',
           'human', 0, 'torn')",
    )
    .execute(&mut raw)
    .await
    .expect("insert the torn row");
    raw.close().await.expect("close");
    for round in 0..10 {
        let before = store.write_transactions();
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let store = Arc::clone(&store);
                let mut e = event(round * 16 + i);
                if i == 7 {
                    e = e.with_dedupe_key("torn");
                }
                tokio::spawn(async move { store.record(e, T0).await })
            })
            .collect();
        for (i, t) in tasks.into_iter().enumerate() {
            let got = t.await.expect("join");
            if i == 7 {
                let err = got.expect_err("the torn row's caller fails");
                assert!(
                    matches!(err, awareness_core::StoreError::Corrupt { .. }),
                    "{err}"
                );
            } else {
                let rec = got.unwrap_or_else(|e| panic!("call {i} failed with its batch: {e}"));
                assert_eq!(rec.event.summary, format!("message {}", round * 16 + i));
            }
        }
        assert!(store.write_transactions() > before);
    }
}
