//! The service over a memory store that several of this crate's integration tests build the
//! same way, and a log capture. (Each test file that uses it declares `mod common;`; not every
//! file uses every item.)
#![allow(dead_code)]

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use awareness_core::{AwarenessStore, SessionKey, UpstreamStore};
use gateway_adapter::{
    Awareness, AwarenessConfig, InMemoryDirectory, InMemoryQueue, QueuedEntry, RecordingWake,
    SystemEventQueue,
};
use store_memory::MemoryStore;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Metadata, Subscriber};

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

/// Keeps every log event as one line of its fields and its level (`message=... error=...
/// level=WARN`). Install it for the test's thread with [`Capture::install`].
#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Vec<String>>>);

impl Capture {
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// Makes this the subscriber of the test's thread until the guard is dropped.
    ///
    /// `tracing` caches, per log call site, whether any subscriber wants it. A call site first
    /// reached by another test's thread while this thread's subscriber was being installed
    /// could be cached as wanted by nobody, and this test then saw none of its lines (seen
    /// under load: "left: 0, right: 1"). So a process-wide subscriber that wants every call
    /// site and keeps nothing is installed first, once: no call site is ever cached as unwanted.
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        static GLOBAL: std::sync::Once = std::sync::Once::new();
        GLOBAL.call_once(|| {
            // Another global subscriber set first would do as well.
            let _ = tracing::subscriber::set_global_default(Discard);
        });
        let guard = tracing::subscriber::set_default(self.clone());
        tracing::callsite::rebuild_interest_cache();
        guard
    }
}

/// Wants every event and keeps none.
struct Discard;

impl Subscriber for Discard {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = Line(String::new());
        event.record(&mut line);
        // The level last, so that a line still begins with its message.
        let _ = write!(line.0, " level={}", event.metadata().level());
        self.0.lock().unwrap().push(line.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}
