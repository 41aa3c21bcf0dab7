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

/// A hook whose store cannot read any head row: its error is a corrupt row, with a cause.
struct UnreadableHeads;

impl awareness_core::testkit::hooked::Hook for UnreadableHeads {
    fn refuse(&self, call: awareness_core::testkit::hooked::Call) -> Option<StoreError> {
        (call == awareness_core::testkit::hooked::Call::Heads).then(|| StoreError::Corrupt {
            context: "read head of agent:main:a".into(),
            source: Some(Box::new(std::io::Error::other("a torn row"))),
        })
    }
}

/// The audit (`awareness doctor`) of a session whose events are kept but whose head row cannot
/// be read names that head, with the store's error and its causes, and audits on. (What the
/// mutation did: the reason was the store's error alone, without its cause, which
/// store-sqlite's unreadable head, an error with no cause, cannot tell; review of stop 70,
/// AU14.)
#[tokio::test]
async fn the_audit_names_an_unreadable_head_with_its_causes() {
    use awareness_core::EventStore;
    let memory = Arc::new(MemoryStore::new());
    let a = SessionRef::parse("agent:main:a", "main").unwrap();
    memory
        .record(
            awareness_core::testkit::checks::human(&a),
            awareness_core::testkit::checks::T0,
        )
        .await
        .expect("record");
    assert!(memory.delete_head_row(&a), "the head row deleted");
    let store = awareness_core::testkit::hooked::Hooked {
        inner: memory,
        hook: UnreadableHeads,
    };
    let audit = awareness_core::audit::audit_store(&store)
        .await
        .expect("an audit over the unreadable head");
    let [awareness_core::audit::Finding::UnreadableHead { session, reason }] = &audit.findings[..]
    else {
        panic!("the unreadable head alone: {:?}", audit.findings)
    };
    assert_eq!(session, &a);
    assert_eq!(
        reason, "corrupt store: read head of agent:main:a: a torn row",
        "the error with its cause"
    );
}
