//! # gateway-adapter
//!
//! The part of session state awareness a gateway calls. It wires a store (`awareness-core`'s
//! traits, any backend) into the gateway through four small ports:
//!
//! - [`SystemEventQueue`]: the per-session queue a turn reads (ready: [`InMemoryQueue`], which
//!   drops duplicate lines and never evicts a session-state notice);
//! - [`HeartbeatWake`]: wake a main session now (ready: [`CoalescingWake`], 20 s window);
//! - [`SessionDirectory`]: does a session exist, who spawned it (ready: [`InMemoryDirectory`]);
//! - [`VisibilityPolicy`]: may a requester see a session ([`AllowAll`], [`SameAgent`],
//!   [`SpawnTree`]).
//!
//! The [`Awareness`] service holds the producers (human message, goal change, compaction,
//! spawn, run outcome, adoption with its upstream link, creation), the tools (`session_status`, `sessions_list`
//! enrichment, `sessions_send` watch), delivery, the turn ([`Awareness::drain_turn`] acknowledges
//! exactly what it drained), lifecycle hooks, the start-up sweep, background pruning and the
//! pick-up of notices another gateway process handed out on a shared store, or that a queue
//! lost ([`Awareness::spawn_pickup`]). The
//! [`upstream`] module monitors adopted sessions for human activity typed straight into their
//! upstream thread (a Claude Code transcript, a paired node's thread). The backend is chosen at
//! run time with [`open_store`] or [`open_full_store`] (`sqlite:///path`, `redb:///path`,
//! `memory:`, `postgres://host/database?schema=name`), each behind an additive cargo feature
//! (`sqlite` is the default; see [`backend`]).
//!
//! ```
//! use std::sync::Arc;
//! use awareness_core::{SessionKey, Sequence};
//! use gateway_adapter::{Awareness, HumanMessage, InMemoryDirectory, InMemoryQueue, RecordingWake,
//!     SystemEventQueue};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store = Arc::new(store_memory::MemoryStore::new());
//! let queue = Arc::new(InMemoryQueue::new());
//! let wake = Arc::new(RecordingWake::new());
//! let awareness = Awareness::builder(store, queue.clone(), wake.clone(), Arc::new(InMemoryDirectory::new())).build();
//!
//! let manager = SessionKey::new("agent:main:main")?;
//! let child = SessionKey::new("agent:main:subagent:worker")?;
//! awareness.subagent_spawned(&child, None, &manager, "run-1").await;
//! for _ in 0..20 {
//!     let mut msg = HumanMessage::new(child.clone());
//!     msg.channel = Some("telegram".into());
//!     msg.entry = Some(gateway_adapter::SessionEntry { spawned_by: Some(manager.clone()), ..Default::default() });
//!     awareness.human_message(msg).await;
//! }
//! assert_eq!(wake.count(&manager), 1, "woken once");
//! let lines = awareness.drain_turn(&manager).await;
//! assert_eq!(lines.len(), 1, "twenty changes, one line");
//! let status = awareness.session_status(&manager, &child, None, Some(Sequence(1)), None).await?;
//! assert_eq!(status.state_changes.unwrap().events.len(), 20);
//! // The notice froze at the first change; the acknowledgement re-opens exactly one follow-up
//! // for the changes that came after it, never jumping to the head.
//! assert_eq!(queue.peek(&manager).len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! Shutting down: stop the upstream monitor ([`MonitorTask::stop`]) and drop the
//! [`UpstreamMonitor`] itself (it holds the service too), abort the pruning and pick-up tasks
//! and await their handles (which returns once the task has let go of the service; a task whose
//! handle was dropped instead holds the service only while its pass or pick-up runs, and ends
//! at its next interval once the service is gone), wait for the store
//! writes whose callers gave up on them ([`Awareness::wait_for_writes`]: a recording, an
//! acknowledgement, a sweep, a watch or an unwatch, a reset or a deletion, an adoption runs to
//! its end on a task of its own, holding the store), drop the
//! [`Awareness`], then close the store through its last handle with
//! [`EventStore::close`](awareness_core::EventStore::close). A store still shared then is only
//! dropped: SQLite's write-ahead log may stay beside the file, and redb's file closes once its
//! last holder lets go.

pub mod backend;
pub mod config;
pub mod directory;
mod fit;
pub mod ports;
pub mod queue;
pub mod service;
pub mod upstream;
pub mod wake;

pub use backend::{
    OpenError, OpenOptions, Repair, StoreUrl, open_full_store, open_full_store_with, open_store,
    open_store_with, repair_store,
};
pub use config::ConfigError;
pub use directory::{InMemoryDirectory, SpawnTree};
pub use ports::{
    AllowAll, HeartbeatWake, InputProvenance, QueuedEntry, SameAgent, SessionDirectory,
    SessionEntry, SystemEventQueue, VisibilityPolicy, classify_actor,
};
pub use queue::InMemoryQueue;
pub use service::{
    Adoption, Awareness, AwarenessBuilder, AwarenessConfig, Clock, Compaction,
    DEFAULT_MAX_PENDING_WRITES, HumanMessage, HumanRecorded, ManualClock, NotVisible, PickUp,
    PrunePass, QUESTION_PATIENCE, RunOutcome, StartupReport, SystemClock, WatchOutcome,
    WatchRefusal, render_status,
};
pub use upstream::{
    ActiveRun, CheckOutcome, Detection, JsonlProvider, MarkerMove, MonitorConfig, MonitorTask,
    NoRuns, OwnPrompts, PairedNodeClient, PairedNodeProvider, RecentPrompts, RunActivity,
    RunTracker, TickReport, UpstreamMonitor, UpstreamProvider,
};
pub use wake::{CoalescingWake, DEFAULT_WAKE_WINDOW, RecordingWake, WakeSink};
