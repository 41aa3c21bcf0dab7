//! `session_status` reads the version and the page in two calls; a recording that lands
//! between them must not leave the version naming an event the page left out. A store that
//! records one more event after every read it serves stands for the busiest case.

use std::sync::Arc;

use awareness_core::retention::PruneStep;
use awareness_core::{
    ActorType, AgentId, AwarenessStoreExt as _, ChangesPage, Cursor, CursorFilter, CursorKey,
    CursorStore, Event, EventKind, EventStore, Head, LogStats, NewEvent, Notice, Recorded,
    Sequence, SessionKey, SessionRef, StoreError, Timestamp, WatcherKey, async_trait,
};
use store_memory::MemoryStore;

const T0: Timestamp = Timestamp(1_800_000_000_000);

fn child() -> SessionRef {
    SessionRef::parse("agent:main:subagent:child", "main").expect("ref")
}

fn human() -> NewEvent {
    NewEvent::new(
        child(),
        EventKind::HumanDirectMessage,
        ActorType::Human,
        "human message via telegram",
    )
}

/// The memory store, with a human message recorded on the child after every read of a head
/// or a page: someone types into the child all the time.
#[derive(Debug)]
struct Busy(MemoryStore);

impl Busy {
    async fn someone_types(&self) {
        self.0.record(human(), T0).await.expect("record");
    }
}

#[async_trait]
impl EventStore for Busy {
    async fn record(&self, e: NewEvent, now: Timestamp) -> Result<Recorded, StoreError> {
        self.0.record(e, now).await
    }
    async fn changes_since(
        &self,
        s: &SessionRef,
        after: Sequence,
        limit: usize,
    ) -> Result<ChangesPage, StoreError> {
        let page = self.0.changes_since(s, after, limit).await;
        self.someone_types().await;
        page
    }
    async fn heads(&self, refs: &[SessionRef]) -> Result<Vec<Head>, StoreError> {
        let heads = self.0.heads(refs).await;
        self.someone_types().await;
        heads
    }
    async fn list_heads(&self, agent: Option<&AgentId>) -> Result<Vec<Head>, StoreError> {
        self.0.list_heads(agent).await
    }
    async fn events_after(&self, a: Sequence, n: usize) -> Result<Vec<Arc<Event>>, StoreError> {
        self.0.events_after(a, n).await
    }
    async fn log_stats(&self) -> Result<LogStats, StoreError> {
        self.0.log_stats().await
    }
    async fn prune_chunk(&self, step: &PruneStep, n: usize) -> Result<u64, StoreError> {
        self.0.prune_chunk(step, n).await
    }
    async fn delete_session(&self, s: &SessionRef) -> Result<(), StoreError> {
        self.0.delete_session(s).await
    }
}

#[async_trait]
impl CursorStore for Busy {
    async fn watch(
        &self,
        w: &WatcherKey,
        t: &SessionRef,
        now: Timestamp,
    ) -> Result<Cursor, StoreError> {
        self.0.watch(w, t, now).await
    }
    async fn unwatch(&self, w: &WatcherKey, t: &SessionKey) -> Result<bool, StoreError> {
        self.0.unwatch(w, t).await
    }
    async fn acknowledge(
        &self,
        w: &WatcherKey,
        t: &[SessionKey],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        self.0.acknowledge(w, t, now).await
    }
    async fn cursor(&self, w: &WatcherKey, t: &SessionKey) -> Result<Option<Cursor>, StoreError> {
        self.0.cursor(w, t).await
    }
    async fn cursors(&self, f: &CursorFilter) -> Result<Vec<Cursor>, StoreError> {
        self.0.cursors(f).await
    }
    async fn refreeze(&self, k: &[CursorKey], now: Timestamp) -> Result<Vec<Notice>, StoreError> {
        self.0.refreeze(k, now).await
    }
    async fn reset_watcher(&self, w: &SessionKey) -> Result<u64, StoreError> {
        self.0.reset_watcher(w).await
    }
}

/// Whatever lands between the two reads, every event after `N` up to the reported version is
/// in the page (or the page says it is truncated), and the version is at least the page's last
/// event, for a full page and for a page cut short by the limit.
#[tokio::test]
async fn the_version_never_names_an_event_the_page_left_out() {
    let store = Busy(MemoryStore::new());
    store.someone_types().await;
    for (after, limit) in [(0, None), (1, None), (0, Some(1)), (2, Some(2))] {
        let status = store
            .session_status(&child(), Some(Sequence(after)), limit)
            .await
            .expect("session_status");
        let page = status.state_changes.expect("page");
        let seen: Vec<u64> = page.events.iter().map(|e| e.sequence.get()).collect();
        let version = status.state_version.get();
        if let Some(last) = seen.last() {
            assert!(
                version >= *last,
                "version {version} below the page's last event: {seen:?}"
            );
        }
        if !page.truncated {
            let expected: Vec<u64> = (after + 1..=version).collect();
            assert_eq!(
                seen, expected,
                "after {after}: version {version} but the page holds {seen:?}, not truncated"
            );
        }
    }
}
