//! A store that forwards every call to another and runs a hook around it, for checks that need
//! something to happen at an exact point of a call: a recording between two reads, an
//! acknowledgement held at a gate.

use std::sync::Arc;

use async_trait::async_trait;

use crate::error::StoreError;
use crate::model::{
    AgentId, Cursor, CursorFilter, CursorKey, Event, Head, LogStats, NewEvent, Sequence,
    SessionKey, SessionRef, Timestamp, WatcherKey,
};
use crate::protocol::{AckTarget, Notice};
use crate::reconcile::ChangesPage;
use crate::retention::PruneStep;
use crate::store::{AwarenessStore, CursorStore, EventStore, Recorded};

/// The store call a [`Hooked`] store is serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Call {
    /// [`EventStore::record`].
    Record,
    /// [`EventStore::changes_since`].
    ChangesSince,
    /// [`EventStore::heads`].
    Heads,
    /// [`EventStore::list_heads`].
    ListHeads,
    /// [`EventStore::events_after`].
    EventsAfter,
    /// [`EventStore::log_stats`].
    LogStats,
    /// [`EventStore::prune_chunk`].
    PruneChunk,
    /// [`EventStore::delete_session`].
    DeleteSession,
    /// [`CursorStore::watch`].
    Watch,
    /// [`CursorStore::unwatch`].
    Unwatch,
    /// [`CursorStore::acknowledge`].
    Acknowledge,
    /// [`CursorStore::cursor`].
    Cursor,
    /// [`CursorStore::cursors`].
    Cursors,
    /// [`CursorStore::refreeze`].
    Refreeze,
    /// [`CursorStore::reset_watcher`].
    ResetWatcher,
    /// [`EventStore::foreign_commits`].
    ForeignCommits,
    /// [`CursorStore::unreadable_cursors`].
    UnreadableCursors,
}

/// What a [`Hooked`] store does around each call; every method defaults to nothing (no call
/// refused).
#[async_trait]
pub trait Hook: Send + Sync {
    /// Runs before the call reaches the store.
    async fn before(&self, call: Call, store: &dyn AwarenessStore) {
        let _ = (call, store);
    }
    /// Runs after the store answered, before the caller gets the answer.
    async fn after(&self, call: Call, store: &dyn AwarenessStore) {
        let _ = (call, store);
    }
    /// Runs when [`EventStore::events_after`] answered with events: the `limit` it was called
    /// with and how many events it `returned`, for checks on how a caller pages through the log.
    fn events_read(&self, limit: usize, returned: usize) {
        let _ = (limit, returned);
    }
    /// Asked once [`Hook::before`] has run: an error here answers the call instead of the
    /// store, which is then not called (a store failing at that point); [`Hook::after`] still
    /// runs.
    fn refuse(&self, call: Call) -> Option<StoreError> {
        let _ = call;
        None
    }
    /// Answers [`EventStore::foreign_commits`] in place of the store when `Some` (unless
    /// [`Hook::refuse`] refuses it): a hook playing the other writers of a store that several
    /// processes share.
    fn foreign_commits(&self) -> Option<u64> {
        None
    }
    /// Answers [`EventStore::commit_hints`] in place of the store when `Some`: a hook playing
    /// other writers that commit as fast as it likes.
    fn commit_hints(&self) -> Option<Box<dyn crate::store::CommitHints>> {
        None
    }
}

/// A store that forwards every call to `inner`, running `hook` before and after it.
pub struct Hooked<H> {
    /// The store that answers.
    pub inner: Arc<dyn AwarenessStore>,
    /// What runs around each call.
    pub hook: H,
}

impl<H> std::fmt::Debug for Hooked<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooked")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<H: Hook> Hooked<H> {
    /// Runs `call` on the inner store between the hook's two halves, unless the hook refuses
    /// it.
    async fn around<T, F>(&self, call: Call, answer: F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>> + Send,
    {
        self.hook.before(call, &*self.inner).await;
        let out = match self.hook.refuse(call) {
            Some(e) => Err(e),
            None => answer.await,
        };
        self.hook.after(call, &*self.inner).await;
        out
    }
}

#[async_trait]
impl<H: Hook> EventStore for Hooked<H> {
    async fn record(&self, event: NewEvent, now: Timestamp) -> Result<Recorded, StoreError> {
        self.around(Call::Record, self.inner.record(event, now))
            .await
    }
    async fn changes_since(
        &self,
        session: &SessionRef,
        after: Sequence,
        limit: usize,
    ) -> Result<ChangesPage, StoreError> {
        let answer = self.inner.changes_since(session, after, limit);
        self.around(Call::ChangesSince, answer).await
    }
    async fn heads(&self, sessions: &[SessionRef]) -> Result<Vec<Head>, StoreError> {
        self.around(Call::Heads, self.inner.heads(sessions)).await
    }
    async fn list_heads(&self, agent: Option<&AgentId>) -> Result<Vec<Head>, StoreError> {
        self.around(Call::ListHeads, self.inner.list_heads(agent))
            .await
    }
    async fn events_after(
        &self,
        after: Sequence,
        limit: usize,
    ) -> Result<Vec<Arc<Event>>, StoreError> {
        let answer = self.inner.events_after(after, limit);
        let events = self.around(Call::EventsAfter, answer).await?;
        self.hook.events_read(limit, events.len());
        Ok(events)
    }
    async fn log_stats(&self) -> Result<LogStats, StoreError> {
        self.around(Call::LogStats, self.inner.log_stats()).await
    }
    async fn prune_chunk(
        &self,
        step: &PruneStep,
        max_rows: usize,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        let answer = self.inner.prune_chunk(step, max_rows, now);
        self.around(Call::PruneChunk, answer).await
    }
    async fn delete_session(&self, session: &SessionRef) -> Result<(), StoreError> {
        let answer = self.inner.delete_session(session);
        self.around(Call::DeleteSession, answer).await
    }
    async fn foreign_commits(&self) -> Result<Option<u64>, StoreError> {
        match self.hook.foreign_commits() {
            Some(answer) => {
                self.around(Call::ForeignCommits, async move { Ok(Some(answer)) })
                    .await
            }
            None => {
                self.around(Call::ForeignCommits, self.inner.foreign_commits())
                    .await
            }
        }
    }
    fn commit_hints(&self) -> Option<Box<dyn crate::store::CommitHints>> {
        self.hook
            .commit_hints()
            .or_else(|| self.inner.commit_hints())
    }
    async fn close(self: Arc<Self>) {
        // Closes the inner store too when this wrapper held its last handle.
        if let Some(hooked) = Arc::into_inner(self) {
            hooked.inner.close().await;
        }
    }
}

#[async_trait]
impl<H: Hook> CursorStore for Hooked<H> {
    async fn watch(
        &self,
        watcher: &WatcherKey,
        target: &SessionRef,
        now: Timestamp,
    ) -> Result<Cursor, StoreError> {
        let answer = self.inner.watch(watcher, target, now);
        self.around(Call::Watch, answer).await
    }
    async fn unwatch(&self, watcher: &WatcherKey, target: &SessionKey) -> Result<bool, StoreError> {
        let answer = self.inner.unwatch(watcher, target);
        self.around(Call::Unwatch, answer).await
    }
    async fn acknowledge(
        &self,
        watcher: &WatcherKey,
        targets: &[AckTarget],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        let answer = self.inner.acknowledge(watcher, targets, now);
        self.around(Call::Acknowledge, answer).await
    }
    async fn cursor(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<Option<Cursor>, StoreError> {
        let answer = self.inner.cursor(watcher, target);
        self.around(Call::Cursor, answer).await
    }
    async fn cursors(&self, filter: &CursorFilter) -> Result<Vec<Cursor>, StoreError> {
        self.around(Call::Cursors, self.inner.cursors(filter)).await
    }
    async fn refreeze(
        &self,
        keys: &[CursorKey],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        let answer = self.inner.refreeze(keys, now);
        self.around(Call::Refreeze, answer).await
    }
    async fn reset_watcher(&self, watcher: &SessionKey) -> Result<u64, StoreError> {
        let answer = self.inner.reset_watcher(watcher);
        self.around(Call::ResetWatcher, answer).await
    }
    async fn unreadable_cursors(&self) -> Result<Vec<crate::UnreadableCursor>, StoreError> {
        let answer = self.inner.unreadable_cursors();
        self.around(Call::UnreadableCursors, answer).await
    }
}
