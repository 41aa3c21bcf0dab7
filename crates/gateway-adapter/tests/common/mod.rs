//! The service over a memory store that several of this crate's integration tests build the
//! same way. (Each test file that uses it declares `mod common;`; not every file uses every
//! item.)
#![allow(dead_code)]

use std::sync::Arc;

use awareness_core::{AwarenessStore, SessionKey, UpstreamStore};
use gateway_adapter::{Awareness, InMemoryDirectory, InMemoryQueue, RecordingWake};
use store_memory::MemoryStore;

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
    let queue = Arc::new(InMemoryQueue::new());
    let wake = Arc::new(RecordingWake::new());
    let mut builder = Awareness::builder(
        store,
        queue.clone(),
        wake.clone(),
        Arc::new(InMemoryDirectory::new()),
    );
    if let Some(links) = links {
        builder = builder.upstream(links);
    }
    (Arc::new(builder.build()), queue, wake)
}
