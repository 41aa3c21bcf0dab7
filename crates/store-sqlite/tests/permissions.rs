//! store-sqlite runs the checks of an open by a user who may not write the store's directory or
//! its file (`awareness_core::permission_suite!`), in a test binary of their own: each starts
//! this binary again as another user, which no other test may run beside.

use std::path::PathBuf;
use std::sync::Arc;

use awareness_core::StoreError;
use awareness_core::testkit::Subject;
use store_sqlite::SqliteStore;

awareness_core::raw_access_forwarding!(SqliteStore);

/// Opens `path` read-write as a [`Subject`], creating it when missing.
async fn open(path: PathBuf) -> Result<Subject, StoreError> {
    let store = Arc::new(SqliteStore::open(path).await?);
    Ok(Subject {
        store: store.clone(),
        upstream: store.clone(),
        raw: Arc::new(Raw(store)),
        batching: None,
        guard: Box::new(()),
    })
}

awareness_core::permission_suite!(open);
