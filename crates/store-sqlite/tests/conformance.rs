//! store-sqlite runs the shared conformance suite, the durable suite (reopening, two handles on
//! one file), the open suite (what a read-write open refuses), the read-only suite and the model
//! test, through `Arc<dyn ...>`, each on a fresh file in a temporary
//! directory. The model test's waves of concurrent recordings are committed as one batch each
//! ([`batching`]).

use std::path::PathBuf;
use std::sync::Arc;

use awareness_core::StoreError;
use awareness_core::testkit::Subject;
use awareness_core::testkit::model::{Batching, Release};
use store_sqlite::{SqliteOptions, SqliteStore};
use write_lock::WriteLock;

mod write_lock;

awareness_core::raw_access_forwarding!(SqliteStore);

/// Opens `path` as a [`Subject`] (the durable suite opens the same file more than once).
async fn open(path: PathBuf) -> Result<Subject, StoreError> {
    open_with(path, SqliteOptions::new(), true).await
}

/// Opens `path` read-only as a [`Subject`].
async fn open_read_only(path: PathBuf) -> Result<Subject, StoreError> {
    open_with(path, SqliteOptions::new().read_only(true), false).await
}

/// Opens `path` with `options`; `writes` for a handle that records, whose writer the durable
/// suite may hold so that concurrent recordings are committed as one batch ([`batching`]).
async fn open_with(
    path: PathBuf,
    options: SqliteOptions,
    writes: bool,
) -> Result<Subject, StoreError> {
    let store = Arc::new(SqliteStore::open_with(&path, options).await?);
    Ok(Subject {
        store: store.clone(),
        upstream: store.clone(),
        raw: Arc::new(Raw(Arc::clone(&store))),
        batching: writes.then(|| batching(store, path)),
        guard: Box::new(()),
    })
}

async fn subject() -> Subject {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.sqlite");
    let store = Arc::new(SqliteStore::open(&path).await.expect("open a fresh store"));
    Subject {
        store: store.clone(),
        upstream: store.clone(),
        raw: Arc::new(Raw(store.clone())),
        batching: Some(batching(store, path)),
        guard: Box::new(dir),
    }
}

/// Holds the writer of `store` (on `path`) for the model test as the group-commit tests do,
/// through SQLite's own lock: another connection takes the file's write lock (`BEGIN
/// IMMEDIATE`), then a write that changes nothing (an unwatch of a cursor no test makes) takes
/// the store's write connection, polled once so that it is first in line for it, and waits on
/// that lock. The recordings given to the store meanwhile queue behind it (a recording that
/// found the connection free would take the queue as it then was: the first of a wave alone).
/// Released, the lock lets the unwatch through, and the first recording to get the connection
/// then takes every queued event into one batch.
fn batching(store: Arc<SqliteStore>, path: PathBuf) -> Batching {
    let measured = Arc::clone(&store);
    Batching {
        hold_writer: Box::new(move || Box::pin(hold_writer(Arc::clone(&store), path.clone()))),
        largest_batch: Box::new({
            let measured = Arc::clone(&measured);
            move || measured.largest_batch()
        }),
        write_transactions: Box::new(move || measured.write_transactions()),
        // The unwatch queued first in line.
        hold_transactions: 1,
        given_up: awareness_core::testkit::model::GivenUp::LeavesTheQueue,
    }
}

async fn hold_writer(store: Arc<SqliteStore>, path: PathBuf) -> Release {
    let lock = WriteLock::take(&path).await;
    Release::behind_a_noop_write(store, lock.release()).await
}

// Every handle is a writer of its own on a file other processes may write too: each counts the
// commits of the others (the gateway's cue to look for notices it did not hand out).
awareness_core::conformance_suite!(subject, foreign_commits: Counted);
awareness_core::durable_suite!(open, foreign_commits: Counted);
awareness_core::open_suite!(open);
awareness_core::read_only_suite!(
    open,
    open_read_only,
    left_open: Answers,
    foreign_commits: Counted
);
awareness_core::model_test!(subject);
