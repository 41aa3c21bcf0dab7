//! store-redb runs the shared conformance suite, the durable suite (reopening, two handles on one
//! file), the open suite (what a read-write open refuses), the read-only suite and the model
//! test, through `Arc<dyn ...>`, on a fresh file each,
//! in both durability modes and with live readers (the model tests of the durable setups,
//! with an fsync per commit, are the slowest of the run). The model test's waves of concurrent
//! recordings are committed as one batch each ([`batching`]).

use std::path::PathBuf;
use std::sync::Arc;

use awareness_core::StoreError;
use awareness_core::testkit::Subject;
use awareness_core::testkit::model::{Batching, Release};
use store_redb::{RedbOptions, RedbStore};

awareness_core::raw_access_forwarding!(RedbStore);

/// Opens `path` with `options` as a [`Subject`] (the durable suite opens the same file more than
/// once); `writes` for a handle that records, whose writer the durable suite may hold so that
/// concurrent recordings are committed as one batch ([`batching`]).
async fn open_with(
    path: PathBuf,
    options: RedbOptions,
    writes: bool,
) -> Result<Subject, StoreError> {
    let store = Arc::new(RedbStore::open_with(path, options).await?);
    Ok(Subject {
        store: store.clone(),
        upstream: store.clone(),
        raw: Arc::new(Raw(Arc::clone(&store))),
        batching: writes.then(|| batching(store)),
        guard: Box::new(()),
    })
}

async fn subject_with(options: RedbOptions) -> Subject {
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = Arc::new(
        RedbStore::open_with(dir.path().join("state.redb"), options)
            .await
            .expect("open a fresh store"),
    );
    Subject {
        store: store.clone(),
        upstream: store.clone(),
        raw: Arc::new(Raw(store.clone())),
        batching: Some(batching(store)),
        guard: Box::new(dir),
    }
}

/// Holds the writer of `store` for the model test with its test hook
/// ([`RedbStore::hold_writer`]): its drain waits on a write that does nothing while the
/// recordings of a wave queue behind it, then takes them all into one batch. (Nothing the
/// store offers otherwise keeps its drain waiting: it writes on a thread of its own, and
/// another handle on the file shares its `redb::Database` but not its writer.)
fn batching(store: Arc<RedbStore>) -> Batching {
    let measured = Arc::clone(&store);
    Batching {
        hold_writer: Box::new(move || {
            let store = Arc::clone(&store);
            Box::pin(async move {
                let held = store.hold_writer().await.expect("hold the writer");
                Release::new(async move { drop(held) })
            })
        }),
        largest_batch: Box::new({
            let measured = Arc::clone(&measured);
            move || measured.largest_batch()
        }),
        write_transactions: Box::new(move || measured.write_transactions()),
        // The held job commits nothing.
        hold_transactions: 0,
        given_up: awareness_core::testkit::model::GivenUp::AtMostOnce,
    }
}

/// Stamps every shared suite for one setup of the store: `$name` is the module, `$options` the
/// [`RedbOptions`] each open uses (the read-only opens add `read_only(true)`).
macro_rules! setup {
    ($name:ident, $options:expr) => {
        mod $name {
            use super::{PathBuf, RedbOptions, StoreError, Subject};

            fn options() -> RedbOptions {
                $options
            }

            async fn subject() -> Subject {
                super::subject_with(options()).await
            }

            async fn open(path: PathBuf) -> Result<Subject, StoreError> {
                super::open_with(path, options(), true).await
            }

            async fn open_read_only(path: PathBuf) -> Result<Subject, StoreError> {
                super::open_with(path, options().read_only(true), false).await
            }

            // One process at a time writes the file, and its handles share one database: none
            // tells of foreign commits (`EventStore::foreign_commits`).
            awareness_core::conformance_suite!(subject, foreign_commits: Uncounted);
            // Every check, those of text that is not UTF-8 in cursor and head rows too: redb
            // checks no bytes on disk, and the store reads those rows from their bytes.
            awareness_core::durable_suite!(open, foreign_commits: Uncounted);
            awareness_core::open_suite!(open);
            awareness_core::read_only_suite!(
                open,
                open_read_only,
                left_open: NeedsRepair,
                foreign_commits: Uncounted
            );
            awareness_core::model_test!(subject);
        }
    };
}

setup!(immediate, RedbOptions::default());
setup!(live_readers, RedbOptions::default().live_readers(true));
setup!(
    bounded,
    RedbOptions::bounded(std::time::Duration::from_millis(50))
);
