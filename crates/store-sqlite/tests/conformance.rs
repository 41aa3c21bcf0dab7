//! store-sqlite runs the shared conformance suite, the durable suite (reopening, two handles on
//! one file), the open suite (what a read-write open refuses), the read-only suite and the model
//! test, through `Arc<dyn ...>`, each on a fresh file in a temporary
//! directory.

use std::path::PathBuf;
use std::sync::Arc;

use awareness_core::StoreError;
use awareness_core::testkit::Subject;
use store_sqlite::{SqliteOptions, SqliteStore};

awareness_core::raw_access_forwarding!(SqliteStore);

/// Opens `path` as a [`Subject`] (the durable suite opens the same file more than once).
async fn open(path: PathBuf) -> Result<Subject, StoreError> {
    open_with(path, SqliteOptions::new()).await
}

/// Opens `path` read-only as a [`Subject`].
async fn open_read_only(path: PathBuf) -> Result<Subject, StoreError> {
    open_with(path, SqliteOptions::new().read_only(true)).await
}

async fn open_with(path: PathBuf, options: SqliteOptions) -> Result<Subject, StoreError> {
    let store = Arc::new(SqliteStore::open_with(path, options).await?);
    Ok(Subject {
        store: store.clone(),
        upstream: store.clone(),
        raw: Arc::new(Raw(store)),
        guard: Box::new(()),
    })
}

async fn subject() -> Subject {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut subject = open(dir.path().join("state.sqlite"))
        .await
        .expect("open a fresh store");
    subject.guard = Box::new(dir);
    subject
}

awareness_core::conformance_suite!(subject);
awareness_core::durable_suite!(open);
awareness_core::open_suite!(open);
awareness_core::read_only_suite!(open, open_read_only, left_open: Answers);
awareness_core::model_test!(subject);
