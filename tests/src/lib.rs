//! Helpers for the end-to-end tests: where the shared fixtures are, and every backend as a
//! fresh store: on a real file, in memory, or in a fresh schema of the PostgreSQL server
//! `AWARENESS_PG_URL` names (`.ci/run` starts one; without the variable, [`backends`] fails
//! naming it rather than leaving postgres out quietly).
//!
//! A postgres store runs on a runtime of its own ([`OffTheClock`]): most tests run under
//! tokio's paused clock, which jumps to the next timer whenever every task waits, and a
//! PostgreSQL store waits on its socket, so sqlx's pool would give up every connection attempt
//! at once (its acquire timeout fired by the jump). Each call is made from a blocking thread,
//! which holds the paused clock still while the server answers, as redb's blocking calls do.
//!
//! ```
//! let dir = awareness_e2e::shared_dir();
//! assert!(dir.join("fixtures").is_dir(), "{}", dir.display());
//! ```

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use awareness_core::error::ErrorChain;
use awareness_core::reconcile::ChangesPage;
use awareness_core::{
    AckTarget, AgentId, AwarenessStore, Cursor, CursorFilter, CursorKey, CursorStore, Event,
    EventStore, Head, LogStats, NewEvent, Notice, PruneStep, Recorded, Sequence, SessionKey,
    SessionRef, StoreError, Timestamp, UnreadableCursor, WatcherKey, async_trait,
};

/// The project's `shared/` folder: `$AWARENESS_SHARED_DIR`, else `../shared` beside the checkout.
pub fn shared_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("AWARENESS_SHARED_DIR") {
        return PathBuf::from(dir);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
        .join("shared")
}

/// The OpenClaw fixture folder.
pub fn openclaw_fixture_dir() -> PathBuf {
    shared_dir().join("fixtures").join("openclaw-2026.9.6")
}

/// A fresh store of one backend and what keeps its data alive.
pub struct Backend {
    /// Backend name.
    pub name: &'static str,
    /// Its store URL (for reopening the same file, or schema, as a "restart").
    pub url: String,
    /// The store.
    pub store: Arc<dyn AwarenessStore>,
    /// Keeps the temporary directory (where a file backend's file is; empty for the others).
    pub dir: tempfile::TempDir,
    /// postgres: the store's schema, kept for reopens as long as the `Backend` lives, and
    /// dropped with it (declared after `store`, so that the handle goes first).
    pub schema: Option<PgSchema>,
}

/// Every backend compiled in, each on a fresh file in its own temporary directory (postgres:
/// in a fresh schema of its own).
pub async fn backends() -> Vec<Backend> {
    let mut out = Vec::new();
    for (name, place_of) in BACKENDS {
        let dir = tempfile::tempdir().expect("temp dir");
        let (url, schema) = place_of(&dir);
        let store = open_store(&url).await;
        out.push(Backend {
            name,
            url,
            store,
            dir,
            schema,
        });
    }
    out
}

/// Opens the store `url` names with [`gateway_adapter::open_store`], as a gateway does (a
/// "restart" reopens it so): a postgres one on the runtime of [`OffTheClock`], wrapped in it.
///
/// # Panics
///
/// When the store cannot be opened.
pub async fn open_store(url: &str) -> Arc<dyn AwarenessStore> {
    let failed = |url: &str, e: &gateway_adapter::OpenError| -> ! {
        panic!("open {url}: {}", ErrorChain(e))
    };
    if !matches!(
        gateway_adapter::StoreUrl::parse(url),
        Ok(gateway_adapter::StoreUrl::Postgres(_))
    ) {
        return gateway_adapter::open_store(url)
            .await
            .unwrap_or_else(|e| failed(url, &e));
    }
    let owned = url.to_owned();
    let inner = off_the_clock(async move { gateway_adapter::open_store(&owned).await })
        .await
        .unwrap_or_else(|e| failed(url, &e));
    Arc::new(OffTheClock { inner })
}

/// The runtime postgres stores run on: its own clock (never paused), its own threads.
fn server_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("e2e-postgres")
            .enable_all()
            .build()
            .expect("the postgres stores' runtime")
    });
    &RUNTIME
}

/// Runs `work` to its end on the postgres stores' runtime, from a blocking thread of the
/// caller's runtime: a paused clock there does not move meanwhile. A panic in `work` is the
/// caller's.
///
/// # Panics
///
/// When `work` panics.
pub async fn off_the_clock<T: Send + 'static>(work: impl Future<Output = T> + Send + 'static) -> T {
    tokio::task::spawn_blocking(move || server_runtime().block_on(work))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// A store whose every call runs [`off_the_clock`] (see the crate's doc for why): the store
/// itself is untouched, and answers as it would to the caller directly.
#[derive(Debug)]
pub struct OffTheClock {
    inner: Arc<dyn AwarenessStore>,
}

impl OffTheClock {
    /// `call` on the inner store, off the clock.
    async fn run<T, F>(&self, call: impl FnOnce(Arc<dyn AwarenessStore>) -> F) -> T
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        off_the_clock(call(Arc::clone(&self.inner))).await
    }
}

#[async_trait]
impl EventStore for OffTheClock {
    async fn record(&self, event: NewEvent, now: Timestamp) -> Result<Recorded, StoreError> {
        self.run(|s| async move { s.record(event, now).await })
            .await
    }

    async fn changes_since(
        &self,
        session: &SessionRef,
        after: Sequence,
        limit: usize,
    ) -> Result<ChangesPage, StoreError> {
        let session = session.clone();
        self.run(|s| async move { s.changes_since(&session, after, limit).await })
            .await
    }

    async fn heads(&self, sessions: &[SessionRef]) -> Result<Vec<Head>, StoreError> {
        let sessions = sessions.to_vec();
        self.run(|s| async move { s.heads(&sessions).await }).await
    }

    async fn list_heads(&self, agent: Option<&AgentId>) -> Result<Vec<Head>, StoreError> {
        let agent = agent.cloned();
        self.run(|s| async move { s.list_heads(agent.as_ref()).await })
            .await
    }

    async fn events_after(
        &self,
        after: Sequence,
        limit: usize,
    ) -> Result<Vec<Arc<Event>>, StoreError> {
        self.run(|s| async move { s.events_after(after, limit).await })
            .await
    }

    async fn log_stats(&self) -> Result<LogStats, StoreError> {
        self.run(|s| async move { s.log_stats().await }).await
    }

    async fn prune_chunk(
        &self,
        step: &PruneStep,
        max_rows: usize,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        let step = *step;
        self.run(|s| async move { s.prune_chunk(&step, max_rows, now).await })
            .await
    }

    async fn delete_session(&self, session: &SessionRef) -> Result<(), StoreError> {
        let session = session.clone();
        self.run(|s| async move { s.delete_session(&session).await })
            .await
    }

    async fn close(self: Arc<Self>) {
        let inner = Arc::clone(&self.inner);
        // The inner store's last handle, when this was the last one of the wrapper.
        drop(self);
        off_the_clock(async move { inner.close().await }).await;
    }

    async fn foreign_commits(&self) -> Result<Option<u64>, StoreError> {
        self.run(|s| async move { s.foreign_commits().await }).await
    }
}

#[async_trait]
impl CursorStore for OffTheClock {
    async fn watch(
        &self,
        watcher: &WatcherKey,
        target: &SessionRef,
        now: Timestamp,
    ) -> Result<Cursor, StoreError> {
        let (watcher, target) = (watcher.clone(), target.clone());
        self.run(|s| async move { s.watch(&watcher, &target, now).await })
            .await
    }

    async fn unwatch(&self, watcher: &WatcherKey, target: &SessionKey) -> Result<bool, StoreError> {
        let (watcher, target) = (watcher.clone(), target.clone());
        self.run(|s| async move { s.unwatch(&watcher, &target).await })
            .await
    }

    async fn acknowledge(
        &self,
        watcher: &WatcherKey,
        targets: &[AckTarget],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        let (watcher, targets) = (watcher.clone(), targets.to_vec());
        self.run(|s| async move { s.acknowledge(&watcher, &targets, now).await })
            .await
    }

    async fn cursor(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<Option<Cursor>, StoreError> {
        let (watcher, target) = (watcher.clone(), target.clone());
        self.run(|s| async move { s.cursor(&watcher, &target).await })
            .await
    }

    async fn cursors(&self, filter: &CursorFilter) -> Result<Vec<Cursor>, StoreError> {
        let filter = filter.clone();
        self.run(|s| async move { s.cursors(&filter).await }).await
    }

    async fn refreeze(
        &self,
        keys: &[CursorKey],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        let keys = keys.to_vec();
        self.run(|s| async move { s.refreeze(&keys, now).await })
            .await
    }

    async fn reset_watcher(&self, watcher: &SessionKey) -> Result<u64, StoreError> {
        let watcher = watcher.clone();
        self.run(|s| async move { s.reset_watcher(&watcher).await })
            .await
    }

    async fn unreadable_cursors(&self) -> Result<Vec<UnreadableCursor>, StoreError> {
        self.run(|s| async move { s.unreadable_cursors().await })
            .await
    }
}

/// A backend's store URL, and the schema it lives in (postgres).
type PlaceOf = fn(&tempfile::TempDir) -> (String, Option<PgSchema>);

const BACKENDS: &[(&str, PlaceOf)] = &[
    ("memory", |_| ("memory:".to_owned(), None)),
    ("sqlite", |d| {
        let url = format!("sqlite://{}", d.path().join("state.db").display());
        (url, None)
    }),
    ("redb", |d| {
        let url = format!("redb://{}", d.path().join("state.redb").display());
        (url, None)
    }),
    ("postgres", |_| {
        let schema = PgSchema::fresh("e2e");
        (schema.url(), Some(schema))
    }),
];

/// The PostgreSQL server's URL, `AWARENESS_PG_URL` (`store_postgres::testkit::server_url`).
///
/// # Panics
///
/// When the variable is not set: the postgres backend is tested, not skipped.
pub fn pg_server_url() -> String {
    store_postgres::testkit::server_url()
}

/// A schema of the server [`pg_server_url`] names that no other test of any run uses
/// ([`PgSchema::fresh`] with `"e2e"`); dropped (with all it holds) when this is. Nothing is
/// created until a store is opened in it.
pub use store_postgres::testkit::Schema as PgSchema;
