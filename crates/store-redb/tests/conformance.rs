//! store-redb runs the shared conformance suite and the model test, through `Arc<dyn ...>`, on a
//! fresh file each: the suite in both durability modes, the model test in the bounded mode (the
//! suite already covers the immediate write path, and the model test then exercises the
//! non-durable one with thousands of random operations).

use std::sync::Arc;
use std::time::Duration;

use awareness_core::testkit::{RawAccess, Subject};
use awareness_core::{Sequence, StoreError, async_trait};
use store_redb::{RedbOptions, RedbStore};

struct Raw(Arc<RedbStore>);

#[async_trait]
impl RawAccess for Raw {
    async fn delete_event_row(&self, sequence: Sequence) -> Result<(), StoreError> {
        self.0.delete_event_row(sequence).await.map(drop)
    }
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
        raw: Arc::new(Raw(store)),
        guard: Box::new(dir),
    }
}

mod immediate {
    async fn subject() -> awareness_core::testkit::Subject {
        super::subject_with(store_redb::RedbOptions::default()).await
    }

    awareness_core::conformance_suite!(subject);
}

mod bounded {
    async fn subject() -> awareness_core::testkit::Subject {
        super::subject_with(store_redb::RedbOptions::bounded(
            super::Duration::from_millis(50),
        ))
        .await
    }

    awareness_core::conformance_suite!(subject);
    awareness_core::model_test!(subject);
}
