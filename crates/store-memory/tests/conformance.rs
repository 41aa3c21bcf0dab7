//! store-memory runs the shared conformance suite and the model test, through `Arc<dyn ...>`.

use std::sync::Arc;

use awareness_core::testkit::{RawAccess, Subject};
use awareness_core::{Sequence, SessionKey, SessionRef, StoreError, WatcherKey, async_trait};
use store_memory::MemoryStore;

struct Raw(Arc<MemoryStore>);

#[async_trait]
impl RawAccess for Raw {
    async fn delete_event_row(&self, sequence: Sequence) -> Result<(), StoreError> {
        self.0.delete_event_row(sequence);
        Ok(())
    }

    async fn delete_head_row(&self, session: &SessionRef) -> Result<(), StoreError> {
        self.0.delete_head_row(session);
        Ok(())
    }

    async fn damage_event_row(&self, _: Sequence) -> Result<bool, StoreError> {
        // The store keeps events as values: there are no bytes a torn write could leave.
        Ok(false)
    }

    async fn damage_cursor_row(&self, _: &WatcherKey, _: &SessionKey) -> Result<bool, StoreError> {
        // Cursors too are kept as values.
        Ok(false)
    }

    async fn damage_link_row(&self, _: &SessionRef) -> Result<bool, StoreError> {
        // And links.
        Ok(false)
    }

    async fn spoil_link_text(&self, _: &SessionRef) -> Result<bool, StoreError> {
        // Their text is a Rust string, always UTF-8.
        Ok(false)
    }

    async fn spoil_link_key(&self, _: &SessionRef) -> Result<bool, StoreError> {
        // Their keys too.
        Ok(false)
    }

    async fn spoil_cursor_text(&self, _: &WatcherKey, _: &SessionKey) -> Result<bool, StoreError> {
        // As is every text this store keeps.
        Ok(false)
    }

    async fn spoil_cursor_watcher(
        &self,
        _: &WatcherKey,
        _: &SessionKey,
    ) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn spoil_head_text(&self, _: &SessionRef) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn spoil_event_text(&self, _: Sequence) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn damage_head_row(&self, _: &SessionRef) -> Result<bool, StoreError> {
        // And heads.
        Ok(false)
    }

    async fn leave_sequences(&self, left: u64) -> Result<bool, StoreError> {
        Ok(self.0.leave_sequences(left))
    }

    async fn make_ambient(&self, _: &WatcherKey, _: &SessionKey) -> Result<bool, StoreError> {
        // Only OpenClaw makes ambient cursors, in its SQLite file.
        Ok(false)
    }

    async fn spoil_cursor_provenance(
        &self,
        _: &WatcherKey,
        _: &SessionKey,
    ) -> Result<bool, StoreError> {
        // No room for a provenance, as above.
        Ok(false)
    }
}

async fn subject() -> Subject {
    let store = Arc::new(MemoryStore::new());
    Subject {
        store: store.clone(),
        upstream: store.clone(),
        raw: Arc::new(Raw(store)),
        batching: None,
        guard: Box::new(()),
    }
}

// One process's values, one writer: no commit is ever another writer's.
awareness_core::conformance_suite!(subject, foreign_commits: Uncounted);
awareness_core::model_test!(subject);
