//! A store whose every call fails as a full disk or a lost database would, for tests of what a
//! caller does when its store fails: turns that must not fail, logs that must carry the cause.

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
use crate::store::{CursorStore, EventStore, Recorded};

/// Every call fails with [`StoreError::Backend`]: its context says what was being done
/// (`record`, `read heads`, `read cursors`, ...), and its source is an I/O error whose text is
/// the store's `cause` (found only through [`std::error::Error::source`]).
#[derive(Debug, Clone, Copy)]
pub struct Failing {
    cause: &'static str,
}

impl Failing {
    /// A store whose failures all have `cause` as their source's text.
    pub fn new(cause: &'static str) -> Self {
        Self { cause }
    }

    /// The error of a call doing `what`.
    pub fn error(&self, what: &str) -> StoreError {
        StoreError::backend(what, std::io::Error::other(self.cause))
    }
}

#[async_trait]
impl EventStore for Failing {
    async fn record(&self, _: NewEvent, _: Timestamp) -> Result<Recorded, StoreError> {
        Err(self.error("record"))
    }
    async fn changes_since(
        &self,
        _: &SessionRef,
        _: Sequence,
        _: usize,
    ) -> Result<ChangesPage, StoreError> {
        Err(self.error("read changes"))
    }
    async fn heads(&self, _: &[SessionRef]) -> Result<Vec<Head>, StoreError> {
        Err(self.error("read heads"))
    }
    async fn list_heads(&self, _: Option<&AgentId>) -> Result<Vec<Head>, StoreError> {
        Err(self.error("list heads"))
    }
    async fn events_after(&self, _: Sequence, _: usize) -> Result<Vec<Arc<Event>>, StoreError> {
        Err(self.error("read events"))
    }
    async fn log_stats(&self) -> Result<LogStats, StoreError> {
        Err(self.error("log stats"))
    }
    async fn prune_chunk(&self, _: &PruneStep, _: usize, _: Timestamp) -> Result<u64, StoreError> {
        Err(self.error("prune"))
    }
    async fn delete_session(&self, _: &SessionRef) -> Result<(), StoreError> {
        Err(self.error("delete session"))
    }
    async fn foreign_commits(&self) -> Result<Option<u64>, StoreError> {
        Err(self.error("ask whether another writer committed"))
    }
}

#[async_trait]
impl CursorStore for Failing {
    async fn watch(
        &self,
        _: &WatcherKey,
        _: &SessionRef,
        _: Timestamp,
    ) -> Result<Cursor, StoreError> {
        Err(self.error("watch"))
    }
    async fn unwatch(&self, _: &WatcherKey, _: &SessionKey) -> Result<bool, StoreError> {
        Err(self.error("unwatch"))
    }
    async fn acknowledge(
        &self,
        _: &WatcherKey,
        _: &[AckTarget],
        _: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        Err(self.error("acknowledge"))
    }
    async fn cursor(&self, _: &WatcherKey, _: &SessionKey) -> Result<Option<Cursor>, StoreError> {
        Err(self.error("read cursor"))
    }
    async fn cursors(&self, _: &CursorFilter) -> Result<Vec<Cursor>, StoreError> {
        Err(self.error("read cursors"))
    }
    async fn refreeze(&self, _: &[CursorKey], _: Timestamp) -> Result<Vec<Notice>, StoreError> {
        Err(self.error("refreeze"))
    }
    async fn reset_watcher(&self, _: &SessionKey) -> Result<u64, StoreError> {
        Err(self.error("reset watcher"))
    }
    async fn unreadable_cursors(&self) -> Result<Vec<crate::UnreadableCursor>, StoreError> {
        Err(self.error("list unreadable cursors"))
    }
}
