//! store-redb runs the checks of an open by a user who may not write the store's directory or
//! its file (`awareness_core::permission_suite!`), in a test binary of their own: each starts
//! this binary again as another user, which no other test may run beside. With the default
//! options and with live readers (which open the file another way); the bounded mode differs
//! from the default in how it commits, not in how it opens the file.

use std::path::PathBuf;
use std::sync::Arc;

use awareness_core::StoreError;
use awareness_core::testkit::Subject;
use store_redb::{RedbOptions, RedbStore};

awareness_core::raw_access_forwarding!(RedbStore);

/// Opens `path` read-write with `options` as a [`Subject`], creating it when missing.
async fn open_with(path: PathBuf, options: RedbOptions) -> Result<Subject, StoreError> {
    let store = Arc::new(RedbStore::open_with(path, options).await?);
    Ok(Subject {
        store: store.clone(),
        upstream: store.clone(),
        raw: Arc::new(Raw(store)),
        batching: None,
        guard: Box::new(()),
    })
}

async fn open(path: PathBuf) -> Result<Subject, StoreError> {
    open_with(path, RedbOptions::default()).await
}

awareness_core::permission_suite!(open);

mod live_readers {
    use super::{PathBuf, RedbOptions, StoreError, Subject};

    async fn open(path: PathBuf) -> Result<Subject, StoreError> {
        super::open_with(path, RedbOptions::default().live_readers(true)).await
    }

    awareness_core::permission_suite!(open);
}
