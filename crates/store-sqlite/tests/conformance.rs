//! store-sqlite runs the shared conformance suite and the model test, through `Arc<dyn ...>`,
//! each on a fresh file in a temporary directory.

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

async fn subject() -> Subject {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(
        SqliteStore::open(dir.path().join("state.sqlite"))
            .await
            .expect("open a fresh store"),
    );
    Subject {
        store: store.clone(),
        upstream: store.clone(),
        raw: Arc::new(Raw(store)),
        guard: Box::new(dir),
    }
}

awareness_core::conformance_suite!(subject);
awareness_core::model_test!(subject);
