//! Upstream monitoring of adopted sessions (DESIGN.md section 8, and section 9 items 4 to 6).
//!
//! A session adopted from a catalog of external agent threads keeps an upstream link
//! ([`awareness_core::UpstreamLink`], adopted with [`crate::Awareness::adopt`]). A person may
//! keep typing straight into that thread (into Claude Code itself, or on the paired node that
//! hosts it); the [`UpstreamMonitor`] notices and records one `human_direct_message` for each
//! burst, so the sessions watching the adopted one learn that their view of it is stale.
//!
//! The pieces:
//!
//! - [`UpstreamProvider`]: reads one kind of source forward from the link's marker and says what
//!   it found ([`CheckOutcome`]). Two are ready: [`JsonlProvider`] (a local Claude Code
//!   transcript, kind [`LOCAL_JSONL`]) and [`PairedNodeProvider`] (a thread on a paired node,
//!   kind [`PAIRED_NODE`], behind the [`PairedNodeClient`] port);
//! - [`transcript`]: what counts as a human turn in a Claude Code transcript, read by streaming;
//! - [`UpstreamMonitor`]: the tokio task that checks, on a fixed tick, every link whose session
//!   something watches (with `owned_watchers_only`, whose session the directory knows), records what the providers found, advances markers and retires links
//!   whose source is gone;
//! - two ports the gateway implements: [`RunActivity`] (a run in the session, or in one linked to
//!   the same source, defers its scan: the gateway is writing into the thread itself) and
//!   [`OwnPrompts`] (the session's own recent prompts, and those of the sessions linked to the
//!   same source, so that their echo in the thread is not taken for a person), with ready
//!   implementations [`RunTracker`] / [`NoRuns`] and [`RecentPrompts`].
//!
//! ```
//! use std::io::Write as _;
//! use std::sync::Arc;
//! use awareness_core::{CursorStore, EventKind, Sequence, SessionRef, WatcherKey};
//! use gateway_adapter::upstream::{jsonl, JsonlProvider, UpstreamMonitor};
//! use gateway_adapter::{Awareness, InMemoryDirectory, InMemoryQueue, RecordingWake};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store = Arc::new(store_memory::MemoryStore::new());
//! let awareness = Arc::new(
//!     Awareness::builder(store.clone(), Arc::new(InMemoryQueue::new()),
//!         Arc::new(RecordingWake::new()), Arc::new(InMemoryDirectory::new()))
//!         .upstream(store.clone())
//!         .build(),
//! );
//! let dir = tempfile::tempdir()?;
//! let transcript = dir.path().join("3f2a.jsonl");
//! std::fs::File::create(&transcript)?;
//!
//! // Adopt the transcript (from its current end) and let the manager watch the session.
//! let worker = SessionRef::parse("agent:main:worker", "main")?;
//! awareness.try_adopt(jsonl::adoption(worker.clone(), &transcript, None)?).await?;
//! let manager = WatcherKey::parse("agent:main:main")?;
//! store.watch(&manager, &worker, awareness.now()).await?;
//!
//! // A person types straight into Claude Code.
//! let mut f = std::fs::OpenOptions::new().append(true).open(&transcript)?;
//! writeln!(f, r#"{{"type":"user","uuid":"u1","message":{{"role":"user","content":"use v2"}}}}"#)?;
//!
//! let monitor = UpstreamMonitor::builder(awareness.clone(), store.clone())
//!     .provider(Arc::new(JsonlProvider::new()))
//!     .build();
//! monitor.tick().await; // a gateway runs `monitor.spawn()`: every 60 s, first after 15 s
//! let status = awareness
//!     .session_status(manager.session_key(), &worker.session_key, None, Some(Sequence(0)), None)
//!     .await?;
//! let events = status.state_changes.unwrap().events;
//! assert_eq!(events.last().unwrap().kind, EventKind::HumanDirectMessage);
//! assert_eq!(events.last().unwrap().summary, "human message via claude-code");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

pub mod jsonl;
pub mod monitor;
pub mod paired;
pub mod transcript;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use awareness_core::upstream::SELF_ECHO_WINDOW;
use awareness_core::{SessionRef, UpstreamLink, async_trait};
use serde_json::Value;

pub use jsonl::{JsonlMarker, JsonlProvider, LOCAL_JSONL};
pub use monitor::{
    Detection, MarkerMove, MonitorBuilder, MonitorConfig, MonitorTask, TickReport, UpstreamMonitor,
};
pub use paired::{
    PAIRED_NODE, PairedError, PairedItem, PairedMarker, PairedNodeClient, PairedNodeProvider,
    PairedPage, Resume,
};

/// What a provider found in one check of a link's source.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum CheckOutcome {
    /// No human turn since the marker; `marker` is where the next check starts (it may have
    /// moved over rows that are not human turns).
    Unchanged {
        /// The marker after the rows read.
        marker: Value,
    },
    /// `turns` human turns since the marker.
    HumanTurns {
        /// How many (at least 1).
        turns: u32,
        /// Identifies the burst within its source: the id of its **last** human turn (a
        /// transcript row's `uuid`, hashed when longer than 64 bytes, else its position, which
        /// names the marker's generation; a paired item's id). Reading the same
        /// rows again (the event was stored but the marker did not move) gives the same id, so
        /// the dedupe key makes the second record a no-op; a burst that grew meanwhile (the
        /// person typed again before the next check) ends with another turn, so it is recorded
        /// as a new event instead of being deduplicated and skipped. That event's turn count
        /// includes the turns already recorded.
        dedupe_id: String,
        /// Identifies the source instance (a file path, a thread); part of the dedupe key's
        /// source hash.
        source_id: String,
        /// The marker after the rows read; stored only once the event is.
        marker: Value,
    },
    /// The source is gone (the file was deleted, the thread no longer exists).
    Missing,
    /// The source was replaced, truncated or rewritten, or the link had no usable marker: the
    /// new marker starts at the source's current end, and nothing before it is counted.
    Rebased {
        /// The new marker.
        marker: Value,
    },
    /// The check failed (I/O, the paired node); nothing is concluded and the marker stays.
    Failed(String),
}

/// Reads one kind of upstream source (the link's `upstream_kind`).
#[async_trait]
pub trait UpstreamProvider: Send + Sync {
    /// The `upstream_kind` of the links it reads.
    fn kind(&self) -> &str;

    /// Reads the link's source forward from its marker. `own_recent` holds the own prompts
    /// its rows are judged by for self-echo, every one of them to be used: the monitor gives
    /// the session's most recent 10, oldest first, and as many of every other session linked
    /// to the same source (a thread several agents adopted, each writing into it). It must not
    /// panic; failures are [`CheckOutcome::Failed`]. The monitor bounds it with a timeout.
    async fn check(&self, link: &UpstreamLink, own_recent: &[String]) -> CheckOutcome;

    /// What names the source `link` reads: two links of this provider with the same key read
    /// one source (a thread several agents adopted), and the monitor judges them together
    /// (the prompts of each are echoes for all; a run in any defers all). The default is the
    /// link's host and thread id; a provider whose links find their source another way (a
    /// transcript's path) names it by that. It must not panic.
    fn source_key(&self, link: &UpstreamLink) -> String {
        format!("{}\n{}", link.host_id, link.thread_id)
    }
}

/// Whether a run of the gateway is active in a session. While one is, the gateway writes into
/// the upstream thread itself, so the monitor defers the scans of that session and of every
/// session linked to the same source to a later tick (the others' runs defer a session's check
/// at 5 ticks at most between two of its checks that went through; a prompt sent during a
/// check still makes it read again).
pub trait RunActivity: Send + Sync {
    /// Whether a run is active in `session`.
    fn is_active(&self, session: &SessionRef) -> bool;
}

/// No run is ever active (a tool that only watches).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRuns;

impl RunActivity for NoRuns {
    fn is_active(&self, _: &SessionRef) -> bool {
        false
    }
}

/// `link`'s marker read by `read`; a stored one `read` cannot take (written by another version,
/// or by hand) is logged (`warn!`), since the check then rebases the link and the turns typed
/// since that marker are not counted.
fn stored_marker<M>(link: &UpstreamLink, read: impl FnOnce(&Value) -> Option<M>) -> Option<M> {
    let stored = link.marker.as_ref()?;
    let marker = read(stored);
    if marker.is_none() {
        tracing::warn!(session_key = %link.session.session_key, kind = %link.upstream_kind,
            marker = %stored,
            "upstream marker unreadable; the link is rebased, and the turns since it are not counted");
    }
    marker
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section below leaves the maps consistent even if a caller panics.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts the runs in progress per session: hold the guard [`RunTracker::track`] returns for
/// the length of each run, or call [`RunTracker::started`] and [`RunTracker::finished`] around
/// it (a run that panics or is cancelled between the two then stays counted for good, and the
/// monitor defers the session's upstream turns until the process ends).
#[derive(Debug, Default)]
pub struct RunTracker {
    active: Mutex<HashMap<SessionRef, usize>>,
}

impl RunTracker {
    /// No run in progress.
    pub fn new() -> Self {
        Self::default()
    }

    /// A run started in `session`.
    pub fn started(&self, session: &SessionRef) {
        *lock(&self.active).entry(session.clone()).or_default() += 1;
    }

    /// A run started in `session`, until the guard returned is dropped: when the run ends,
    /// panics, or its future is dropped (cancelled).
    pub fn track(self: &Arc<Self>, session: &SessionRef) -> ActiveRun {
        self.started(session);
        ActiveRun {
            tracker: Arc::clone(self),
            session: session.clone(),
        }
    }

    /// A run ended in `session`. A call with no run counted is ignored; one more than the
    /// runs started by hand ends a run another caller counted, so a run is ended either by
    /// this or by dropping its [`ActiveRun`], never both.
    pub fn finished(&self, session: &SessionRef) {
        let mut g = lock(&self.active);
        if let Some(n) = g.get_mut(session) {
            *n -= 1;
            if *n == 0 {
                g.remove(session);
            }
        }
    }
}

/// A run in progress, counted by the [`RunTracker`] that made it ([`RunTracker::track`])
/// until this is dropped.
#[derive(Debug)]
#[must_use = "the run ends when this is dropped"]
pub struct ActiveRun {
    tracker: Arc<RunTracker>,
    session: SessionRef,
}

impl Drop for ActiveRun {
    fn drop(&mut self) {
        self.tracker.finished(&self.session);
    }
}

impl RunActivity for RunTracker {
    fn is_active(&self, session: &SessionRef) -> bool {
        lock(&self.active).contains_key(session)
    }
}

/// The prompts a session sent itself into its upstream thread, most recent last.
pub trait OwnPrompts: Send + Sync {
    /// The session's most recent own prompts, oldest first (the monitor uses the last 10).
    fn recent(&self, session: &SessionRef) -> Vec<String>;

    /// The session's upstream link is gone: the monitor removed it (its source stayed gone),
    /// or found it gone from one tick to the next (the session deleted, the link removed by
    /// another process). Its prompts are not needed any more (adopting it again starts from
    /// the source's end). The default keeps them.
    fn forget(&self, session: &SessionRef) {
        let _ = session;
    }
}

/// Remembers the last 10 prompts of each session in memory: call [`RecentPrompts::record`]
/// whenever the gateway sends a prompt into an adopted session; the monitor forgets a session
/// whose link is gone (it removed it, or found it gone at a tick), and
/// [`RecentPrompts::forget`] forgets one at once (a session deleted while no monitor runs).
///
/// In memory only: a prompt sent before the gateway restarted that the monitor had not read
/// yet (its run still going, or sent less than a tick before) is not known after the restart,
/// and reads as a person's turn. A gateway that must not tell its watchers of such a turn
/// implements [`OwnPrompts`] over storage of its own that outlives it.
#[derive(Debug, Default)]
pub struct RecentPrompts {
    by_session: Mutex<HashMap<SessionRef, VecDeque<String>>>,
}

impl RecentPrompts {
    /// Nothing remembered.
    pub fn new() -> Self {
        Self::default()
    }

    /// The gateway sent `text` into `session`'s thread.
    pub fn record(&self, session: &SessionRef, text: impl Into<String>) {
        let mut g = lock(&self.by_session);
        let q = g.entry(session.clone()).or_default();
        q.push_back(text.into());
        while q.len() > SELF_ECHO_WINDOW {
            q.pop_front();
        }
    }

    /// Forgets a session (deleted, or its link removed).
    pub fn forget(&self, session: &SessionRef) {
        lock(&self.by_session).remove(session);
    }
}

impl OwnPrompts for RecentPrompts {
    fn recent(&self, session: &SessionRef) -> Vec<String> {
        lock(&self.by_session)
            .get(session)
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn forget(&self, session: &SessionRef) {
        RecentPrompts::forget(self, session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_ports() {
        let s = SessionRef::parse("agent:main:main", "main").unwrap();
        let runs = RunTracker::new();
        assert!(!runs.is_active(&s));
        runs.started(&s);
        runs.started(&s);
        runs.finished(&s);
        assert!(runs.is_active(&s), "one of two runs still going");
        runs.finished(&s);
        runs.finished(&s);
        assert!(!runs.is_active(&s));
        assert!(!NoRuns.is_active(&s));

        // A tracked run ends with its guard, however the run ends: a panic, a dropped future.
        let runs = Arc::new(RunTracker::new());
        let panicked = std::panic::catch_unwind(|| {
            let _run = runs.track(&s);
            assert!(runs.is_active(&s));
            panic!("the run failed");
        });
        assert!(panicked.is_err());
        assert!(!runs.is_active(&s), "a run that panicked is over");
        let tracked = Arc::clone(&runs);
        let session = s.clone();
        let run = async move {
            let _run = tracked.track(&session);
            std::future::pending::<()>().await;
        };
        let mut run = Box::pin(run);
        let waker = std::task::Waker::noop();
        let polled = run
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker));
        assert!(
            polled.is_pending() && runs.is_active(&s),
            "the run is going"
        );
        drop(run);
        assert!(!runs.is_active(&s), "a cancelled run is over");

        let prompts = RecentPrompts::new();
        for i in 0..12 {
            prompts.record(&s, format!("p{i}"));
        }
        let recent = prompts.recent(&s);
        assert_eq!(recent.len(), SELF_ECHO_WINDOW);
        assert_eq!(recent.first().map(String::as_str), Some("p2"));
        assert_eq!(recent.last().map(String::as_str), Some("p11"));
        prompts.forget(&s);
        assert!(prompts.recent(&s).is_empty());
    }
}
