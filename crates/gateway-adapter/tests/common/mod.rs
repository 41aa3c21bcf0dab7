//! The service over a memory store that several of this crate's integration tests build the
//! same way, and a log capture. (Each test file that uses it declares `mod common;`; not every
//! file uses every item.)
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use awareness_core::testkit::hooked::{Hook, Hooked};
use awareness_core::{AwarenessStore, SessionKey, UpstreamStore};
use gateway_adapter::{
    Awareness, AwarenessConfig, InMemoryDirectory, InMemoryQueue, QueuedEntry, RecordingWake,
    SystemEventQueue,
};
use store_memory::MemoryStore;

/// Lets the spawned tasks run as far as they can, on a runtime of one thread (the task that
/// calls it then polls on with a fresh cooperative budget).
pub async fn settle() {
    for _ in 0..32 {
        tokio::task::yield_now().await;
    }
}

/// A session key from a string the test knows is valid.
pub fn k(key: &str) -> SessionKey {
    SessionKey::new(key).unwrap()
}

/// A service over a memory store that also keeps its upstream links, with a queue and a wake
/// the test reads.
pub struct World {
    pub store: Arc<MemoryStore>,
    pub queue: Arc<InMemoryQueue>,
    pub wake: Arc<RecordingWake>,
    pub svc: Arc<Awareness>,
}

pub fn world() -> World {
    let store = Arc::new(MemoryStore::new());
    let (svc, queue, wake) = service(store.clone(), Some(store.clone()));
    World {
        store,
        queue,
        wake,
        svc,
    }
}

/// [`world`] over a memory store wrapped in `hook` (which runs around each of its calls; the
/// upstream links are the memory store's own, unhooked), and the wrapped store, whose hook the
/// test arms.
pub fn hooked_world<H: Hook + 'static>(hook: H) -> (World, Arc<Hooked<H>>) {
    let store = Arc::new(MemoryStore::new());
    let hooked = Arc::new(Hooked {
        inner: store.clone(),
        hook,
    });
    let (svc, queue, wake) = service(hooked.clone(), Some(store.clone()));
    let w = World {
        store,
        queue,
        wake,
        svc,
    };
    (w, hooked)
}

/// A service over `store` (and `links`, its upstream links, when given) with an empty
/// directory, and the queue and wake the test reads.
pub fn service(
    store: Arc<dyn AwarenessStore>,
    links: Option<Arc<dyn UpstreamStore>>,
) -> (Arc<Awareness>, Arc<InMemoryQueue>, Arc<RecordingWake>) {
    service_in(store, links, Arc::new(InMemoryDirectory::new()))
}

/// [`service`] with the gateway's sessions in `directory`.
pub fn service_in(
    store: Arc<dyn AwarenessStore>,
    links: Option<Arc<dyn UpstreamStore>>,
    directory: Arc<InMemoryDirectory>,
) -> (Arc<Awareness>, Arc<InMemoryQueue>, Arc<RecordingWake>) {
    service_configured(store, links, directory, AwarenessConfig::default())
}

/// [`service_in`] with `config`.
pub fn service_configured(
    store: Arc<dyn AwarenessStore>,
    links: Option<Arc<dyn UpstreamStore>>,
    directory: Arc<InMemoryDirectory>,
    config: AwarenessConfig,
) -> (Arc<Awareness>, Arc<InMemoryQueue>, Arc<RecordingWake>) {
    let queue = Arc::new(InMemoryQueue::new());
    let wake = Arc::new(RecordingWake::new());
    let mut builder =
        Awareness::builder(store, queue.clone(), wake.clone(), directory).config(config);
    if let Some(links) = links {
        builder = builder.upstream(links);
    }
    (Arc::new(builder.build()), queue, wake)
}

/// A queue that is an [`InMemoryQueue`] until told to panic in one of its calls, as a host's
/// queue with a bug would.
#[derive(Debug, Default)]
pub struct FaultyQueue {
    pub inner: InMemoryQueue,
    /// Panics in every drain while set, before draining anything.
    pub panic_on_drain: AtomicBool,
    /// Panics in every removal while set, before removing anything.
    pub panic_on_remove: AtomicBool,
    /// Panics when asked what is queued for this session.
    pub panic_on_peek_of: Mutex<Option<SessionKey>>,
}

impl SystemEventQueue for FaultyQueue {
    fn enqueue(&self, session: &SessionKey, entry: QueuedEntry) -> bool {
        self.inner.enqueue(session, entry)
    }

    fn drain(&self, session: &SessionKey) -> Vec<QueuedEntry> {
        assert!(
            !self.panic_on_drain.load(Ordering::SeqCst),
            "the host's queue failed to drain"
        );
        self.inner.drain(session)
    }

    fn peek(&self, session: &SessionKey) -> Vec<QueuedEntry> {
        assert!(
            self.panic_on_peek_of.lock().unwrap().as_ref() != Some(session),
            "the host's queue failed to show {session}'s lines"
        );
        self.inner.peek(session)
    }

    fn remove(&self, session: &SessionKey, entry: &QueuedEntry) -> bool {
        assert!(
            !self.panic_on_remove.load(Ordering::SeqCst),
            "the host's queue failed to remove a line"
        );
        self.inner.remove(session, entry)
    }
}

/// A service over `store` with the gateway's sessions in `directory`, `config` and `queue`,
/// and the wake the test reads.
pub fn service_with_queue<Q: SystemEventQueue + 'static>(
    store: Arc<dyn AwarenessStore>,
    directory: Arc<InMemoryDirectory>,
    config: AwarenessConfig,
    queue: Arc<Q>,
) -> (Arc<Awareness>, Arc<RecordingWake>) {
    let wake = Arc::new(RecordingWake::new());
    let svc = Awareness::builder(store, queue, wake.clone(), directory)
        .config(config)
        .build();
    (Arc::new(svc), wake)
}

/// The log capture the tests install for their thread ([`Capture::install`]).
#[allow(unused_imports)] // not every test file that declares `mod common;` captures logs
pub use awareness_core::testkit::logs::Capture;
