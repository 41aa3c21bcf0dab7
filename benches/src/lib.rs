//! Shared set-up for the criterion benches: every backend opened side by side, and the standard
//! data set (50,000 events over 1,000 sessions) loaded through the public API.
//!
//! ```
//! let rt = awareness_benches::runtime();
//! let backends = rt.block_on(awareness_benches::open_backends());
//! assert!(backends.iter().any(|b| b.name == "memory"));
//! ```

use std::any::Any;
use std::future::Future;
use std::sync::Arc;

use awareness_core::{
    ActorType, AwarenessStore, EventKind, NewEvent, Sequence, SessionRef, Timestamp, WatcherKey,
};

/// The fixed start of the benches' clock.
pub const T0: Timestamp = Timestamp(1_800_000_000_000);
/// Events in the standard data set.
pub const DATASET_EVENTS: usize = 50_000;
/// Sessions in the standard data set.
pub const DATASET_SESSIONS: usize = 1_000;

/// One backend under measurement.
pub struct Backend {
    /// The name shown in the report (`memory`, `sqlite`, ...).
    pub name: &'static str,
    /// The store.
    pub store: Arc<dyn AwarenessStore>,
    /// Keeps temporary files alive.
    pub guard: Box<dyn Any + Send + Sync>,
}

/// The default multi-threaded tokio runtime the benches run durable stores on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Every backend this workspace has, empty, in report order; `AWARENESS_BENCH_BACKENDS`
/// (a comma-separated list such as `memory,sqlite`) keeps only the named ones.
pub async fn open_backends() -> Vec<Backend> {
    let wanted = std::env::var("AWARENESS_BENCH_BACKENDS").ok();
    let mut backends = open_all().await;
    if let Some(list) = wanted {
        backends.retain(|b| list.split(',').any(|n| n.trim() == b.name));
    }
    backends
}

async fn open_all() -> Vec<Backend> {
    let mut backends = vec![Backend {
        name: "memory",
        store: Arc::new(store_memory::MemoryStore::new()),
        guard: Box::new(()),
    }];
    let dir = tempfile::tempdir().expect("temp dir for sqlite");
    let sqlite = store_sqlite::SqliteStore::open(dir.path().join("bench.db"))
        .await
        .expect("open the sqlite store");
    backends.push(Backend {
        name: "sqlite",
        store: Arc::new(sqlite),
        guard: Box::new(dir),
    });
    for (name, options) in [
        ("redb", store_redb::RedbOptions::default()),
        (
            "redb-bounded",
            store_redb::RedbOptions::bounded(REDB_FLUSH_INTERVAL),
        ),
    ] {
        let dir = tempfile::tempdir().expect("temp dir for redb");
        let redb = store_redb::RedbStore::open_with(dir.path().join("bench.redb"), options)
            .await
            .expect("open the redb store");
        backends.push(Backend {
            name,
            store: Arc::new(redb),
            guard: Box::new(dir),
        });
    }
    backends
}

/// The flush interval of the `redb-bounded` backend (commits use redb's `Durability::None` and
/// are made durable in the background at this interval).
pub const REDB_FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The session of index `i` in the data set.
pub fn dataset_session(i: usize) -> SessionRef {
    SessionRef::parse(&format!("agent:main:subagent:s{i}"), "main").expect("valid ref")
}

/// A human message on `session`.
pub fn human(session: &SessionRef) -> NewEvent {
    NewEvent::new(
        session.clone(),
        EventKind::HumanDirectMessage,
        ActorType::Human,
        "human message via telegram",
    )
    .with_actor_id("user-1")
}

/// Loads `events` events spread round-robin over `sessions` sessions.
pub async fn load_dataset(store: &dyn AwarenessStore, events: usize, sessions: usize) {
    for i in 0..events {
        store
            .record(human(&dataset_session(i % sessions)), T0)
            .await
            .expect("load the data set");
    }
}

/// Gives `target` `n` watchers (`agent:main:w0` ...), each with a cursor at the head.
pub async fn add_watchers(store: &dyn AwarenessStore, target: &SessionRef, n: usize) {
    for i in 0..n {
        let w = WatcherKey::parse(&format!("agent:main:w{i}")).expect("watcher");
        store.watch(&w, target, T0).await.expect("watch");
    }
}

/// The head of a session, for reconcile benches.
pub async fn head(store: &dyn AwarenessStore, session: &SessionRef) -> Sequence {
    use awareness_core::AwarenessStoreExt as _;
    store.state_version(session).await.expect("head")
}

/// Polls a future once with a no-op waker: the cheapest way to drive a store whose futures are
/// always ready (store-memory), so its benches measure the store and not an executor.
pub fn poll_ready<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("poll_ready used on a future that is not ready"),
    }
}
