//! store-sqlite runs the shared open suite: what a read-write open with the default options
//! refuses and leaves untouched (a directory, a missing directory, a file that is not a store, a
//! truncated one), and an empty file becoming a new store. (Opening concerns of SQLite alone,
//! such as permissions and processes, are in `tests/reliability.rs`.)

use std::path::PathBuf;
use std::sync::Arc;

use awareness_core::testkit::{RawAccess, Subject};
use awareness_core::{Sequence, StoreError, async_trait};
use store_sqlite::SqliteStore;

struct Raw(Arc<SqliteStore>);

#[async_trait]
impl RawAccess for Raw {
    async fn delete_event_row(&self, sequence: Sequence) -> Result<(), StoreError> {
        self.0.delete_event_row(sequence).await.map(drop)
    }
}

/// Opens `path` read-write with the default options as a [`Subject`].
async fn open(path: PathBuf) -> Result<Subject, StoreError> {
    let store = Arc::new(SqliteStore::open(path).await?);
    Ok(Subject {
        store: store.clone(),
        upstream: store.clone(),
        raw: Arc::new(Raw(store)),
        guard: Box::new(()),
    })
}

awareness_core::open_suite!(open);
