//! The upstream monitor: a tokio task that checks adopted sessions for human activity typed
//! straight into their upstream thread (DESIGN.md section 8).
//!
//! Each tick (the first after 15 s, then every 60 s, one at a time; see [`MonitorConfig`]):
//!
//! 1. lists the links, and keeps those whose session something watches (a cursor targets the
//!    session's key and agent), whose kind a provider reads and, with
//!    [`AwarenessConfig::owned_watchers_only`](crate::AwarenessConfig::owned_watchers_only)
//!    (gateways sharing a store), whose session this gateway's directory knows. The source of
//!    a link nothing watches is read only to move its marker past what was written, recording
//!    nothing: a watch that begins later starts there, as it starts at the session's head;
//! 2. defers to a later tick a session in which a run is active ([`super::RunActivity`]), or
//!    in any session linked to the same source ([`super::UpstreamProvider::source_key`]): the
//!    gateway writes into that thread then. Once other sessions' runs have deferred a
//!    session's check at 5 ticks since its last check went through, only its own runs defer
//!    it, until one goes through;
//! 3. runs the providers of every kept link concurrently, each bounded by a 45 s timeout, so one
//!    failing or hanging provider never holds up the others (a timed-out check is a failure:
//!    nothing concluded, the marker stays). The JSONL provider runs at most
//!    [`super::jsonl::MAX_PARALLEL_READS`] reads at once: with that many hung, its other
//!    links' checks fail, saying so, until one returns;
//! 4. records the human turns a provider found as **one** `human_direct_message`
//!    (`human message via <catalogId>`, `{"turns": N}` when N > 1, dedupe key
//!    [`awareness_core::upstream::human_dedupe_key`]) and only then moves the marker, by
//!    compare-and-set on the `updated_at` the tick read, so a link adopted again meanwhile keeps
//!    its new marker. If the marker does not move (a crash, a stopped task or a failed store
//!    write between the two), the next tick reads the burst again from the old marker: the
//!    burst is named by its last human turn, so the same rows give the same dedupe key and
//!    the second record is a no-op, while a burst that grew meanwhile (the person typed
//!    again) ends with a new turn and is recorded as a new event, never skipped;
//! 5. counts, per link, consecutive checks that found the source gone: at the third it records
//!    one `upstream_missing` (`upstream missing via <catalogId>`, `{"channel": "<catalogId>"}`)
//!    and removes the link (only if it has not changed meanwhile), and tells the own-prompts
//!    port to forget the session ([`super::OwnPrompts::forget`]). A check that fails neither
//!    counts nor resets.
//!
//! Each of the monitor's own store calls (listing the links, reading the watchers, storing the
//! scan time, moving the marker, removing the link) waits for the store at most the service's
//! [`crate::AwarenessConfig::store_wait`], and is then a failure like any other (logged: a
//! `warn!` the first time, `debug!` while the same failure repeats, `info!` when it ends; the
//! next tick tries again): a store that hangs held the tick, and every tick after it. A write
//! given up so may still commit once the store answers: a marker moved late only spares the
//! next tick a re-read (a burst read again is deduplicated), and a link removed late is seen
//! gone at the next tick, which forgets its prompts then, as it does for a link anyone else
//! removed since the tick before.
//!
//! Every link is checked and recorded for its own session, so several agents adopting one
//! external thread are each recorded; links to one source are judged together: each linked
//! session's last 10 own prompts are echoes for all, and a run in any defers all. A run or
//! prompts port that panics for one session fails that session's check only: for the others'
//! checks, the session is taken as not running, or as having sent no prompt (its own, echoed
//! into the thread, may then read as a person's turn), with a warning once per checked link and
//! session until the port answers again. What happened is published as [`Detection`]s
//! ([`UpstreamMonitor::subscribe`]).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use awareness_core::error::ErrorChain;
use awareness_core::upstream::{self, UpstreamStore};
use awareness_core::{
    ActorType, CursorFilter, Event, EventKind, NewEvent, Payload, SessionRef, Timestamp,
    UpstreamLink,
};
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, info, warn};

use crate::config::{self, ConfigError};
use crate::fit::Fit;

use super::{CheckOutcome, NoRuns, OwnPrompts, RecentPrompts, RunActivity, UpstreamProvider};
use crate::service::{Awareness, HumanMessage, HumanRecorded};

/// When and how long the monitor checks ([`MonitorConfig::validate`] says what is accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MonitorConfig {
    /// Delay before the first tick (default 15 s).
    pub first_tick: Duration,
    /// Time between ticks (default 60 s); a tick that takes longer delays the next.
    pub interval: Duration,
    /// Bound of one provider check (default 45 s).
    pub provider_timeout: Duration,
    /// Consecutive `missing` checks before `upstream_missing` (default 3).
    pub missing_checks: u32,
}

impl MonitorConfig {
    /// Refuses timing the monitor cannot run on: an `interval` below 1 ms (the ticks would
    /// run back to back), a `provider_timeout` below 1 ms (every check would time out) and a
    /// `missing_checks` of 0. Any `first_tick` is accepted (one beyond what the clock can
    /// reach means never).
    pub fn validate(&self) -> Result<(), ConfigError> {
        config::at_least_1ms(
            "MonitorConfig.interval",
            self.interval,
            "it must be at least 1 ms: a shorter interval runs the ticks back to back",
        )?;
        config::at_least_1ms(
            "MonitorConfig.provider_timeout",
            self.provider_timeout,
            "it must be at least 1 ms: a shorter timeout fails every check as timed out",
        )?;
        config::at_least_one(
            "MonitorConfig.missing_checks",
            self.missing_checks.into(),
            "it must be at least 1: it counts the checks that find the source gone before \
             upstream_missing is recorded",
        )
    }
}

impl Default for MonitorConfig {
    fn default() -> Self {
        Self {
            first_tick: Duration::from_secs(15),
            interval: Duration::from_mins(1),
            provider_timeout: Duration::from_secs(45),
            missing_checks: upstream::MISSING_CHECKS,
        }
    }
}

/// What one tick did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TickReport {
    /// The tick's number (1 for the first).
    pub tick: u64,
    /// Links in the store.
    pub links: usize,
    /// Links checked by a provider whose result was taken (not deferred).
    pub checked: usize,
    /// Links nothing watches: not checked, their sources read only to move their markers past
    /// what was written (nothing recorded).
    pub unwatched: usize,
    /// Links deferred because a run is active in their session (or in one linked to the same
    /// source), before their check, or because a run began or the gateway sent a prompt
    /// while their check read ([`Detection::Deferred`]).
    pub deferred: usize,
    /// Links of a kind no provider of this monitor reads.
    pub no_provider: usize,
    /// Links of sessions another gateway owns (with
    /// [`AwarenessConfig::owned_watchers_only`](crate::AwarenessConfig::owned_watchers_only),
    /// sessions the directory does not know), not checked: that gateway's monitor checks
    /// them, against the prompts it sent and the runs it holds, which this one does not know
    /// (checked here, its own prompts would read as a person's turns).
    pub not_owned: usize,
}

/// What became of a link's marker once a check's result was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerMove {
    /// The marker moved past the rows read.
    Moved,
    /// The link changed during the check (it was adopted again, or removed): the marker was
    /// left as the link now has it.
    LinkChanged,
    /// The store failed to move the marker (the error, with its causes): the next check reads
    /// the same rows again.
    Failed(String),
}

impl MarkerMove {
    /// Whether the marker moved.
    pub fn is_moved(&self) -> bool {
        matches!(self, MarkerMove::Moved)
    }
}

impl fmt::Display for MarkerMove {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MarkerMove::Moved => f.write_str("marker moved"),
            MarkerMove::LinkChanged => f.write_str("the link changed meanwhile; marker kept"),
            MarkerMove::Failed(error) => write!(
                f,
                "marker not moved: {error}; the same rows are read again next tick"
            ),
        }
    }
}

/// Something the monitor found or did, published to [`UpstreamMonitor::subscribe`]rs.
#[derive(Debug, Clone, PartialEq)]
pub enum Detection {
    /// Human turns were recorded as one event.
    HumanTurns {
        /// The adopted session.
        session: SessionRef,
        /// Its catalog (the event's channel).
        catalog_id: String,
        /// How many turns.
        turns: u32,
        /// The stored event (for a dedupe hit, the one stored first).
        event: Arc<Event>,
        /// What became of the marker: moved past the turns, kept because the link changed
        /// during the scan, or not moved because the store failed (the same rows are then read
        /// again next tick, and the event's dedupe key makes recording them again a no-op).
        marker: MarkerMove,
    },
    /// The source was not found (`consecutive` checks in a row so far).
    Missing {
        /// The adopted session.
        session: SessionRef,
        /// Consecutive checks that found it gone.
        consecutive: u32,
    },
    /// The source stayed gone: `upstream_missing` was recorded and the link removed.
    UpstreamMissing {
        /// The adopted session.
        session: SessionRef,
        /// Its catalog.
        catalog_id: String,
        /// The stored event.
        event: Arc<Event>,
        /// Whether the link was removed (false when it changed meanwhile).
        link_removed: bool,
    },
    /// The source was replaced or truncated, or the link had no marker: the marker moved to
    /// the source's current end. Published only once that marker is stored: when the link
    /// changed during the scan nothing is published (the link's new marker stays), and when
    /// the store fails to move it the detection is [`Detection::Failed`].
    Rebased {
        /// The adopted session.
        session: SessionRef,
    },
    /// A run is active in the session, or in one linked to the same source: its scan waits for
    /// a later tick. Also published when a run began, or the gateway sent one of those sessions
    /// a prompt, while its check read: the human turns it found are not recorded, and are read
    /// again later.
    Deferred {
        /// The adopted session.
        session: SessionRef,
    },
    /// A check failed, panicked or timed out, or its result could not be stored (the marker of
    /// an unchanged or rebased source included), or the session directory panicked when asked
    /// whether this gateway owns the session, or the gateway's run activity or own prompts
    /// panicked when asked about the session (not about another linked to its source);
    /// retried next tick.
    Failed {
        /// The adopted session.
        session: SessionRef,
        /// What went wrong.
        error: String,
    },
    /// A tick ended (one that panicked too, with no link counted as checked).
    TickDone(TickReport),
}

impl fmt::Display for Detection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Detection::HumanTurns {
                session,
                catalog_id,
                turns,
                event,
                marker,
            } => {
                write!(
                    f,
                    "human: {session}: {turns} turn(s) via {catalog_id}, event #{}",
                    event.sequence
                )?;
                if !marker.is_moved() {
                    write!(f, " ({marker})")?;
                }
                Ok(())
            }
            Detection::Missing {
                session,
                consecutive,
            } => write!(
                f,
                "missing: {session}: source not found ({consecutive} in a row)"
            ),
            Detection::UpstreamMissing {
                session,
                catalog_id,
                event,
                link_removed,
            } => write!(
                f,
                "upstream missing: {session} via {catalog_id}, event #{}, link {}",
                event.sequence,
                if *link_removed {
                    "removed"
                } else {
                    "kept (it changed meanwhile)"
                }
            ),
            Detection::Rebased { session } => {
                write!(
                    f,
                    "rebased: {session}: the source was replaced or truncated"
                )
            }
            Detection::Deferred { session } => {
                write!(
                    f,
                    "deferred: {session}: a run is active in it or in a session linked to its source"
                )
            }
            Detection::Failed { session, error } => write!(f, "failed: {session}: {error}"),
            Detection::TickDone(r) => write!(
                f,
                "tick {}: checked {} of {} link(s) ({} unwatched, {} deferred)",
                r.tick, r.checked, r.links, r.unwatched, r.deferred
            ),
        }
    }
}

/// Builds an [`UpstreamMonitor`].
pub struct MonitorBuilder {
    awareness: Arc<Awareness>,
    links: Arc<dyn UpstreamStore>,
    providers: HashMap<String, Arc<dyn UpstreamProvider>>,
    runs: Arc<dyn RunActivity>,
    prompts: Arc<dyn OwnPrompts>,
    config: MonitorConfig,
}

impl MonitorBuilder {
    /// Adds a provider for its kind (replacing one of the same kind).
    #[must_use]
    pub fn provider(mut self, provider: Arc<dyn UpstreamProvider>) -> Self {
        self.providers.insert(provider.kind().to_owned(), provider);
        self
    }

    /// Sets the run-activity port (default: [`NoRuns`]). A run active in any session linked
    /// to a source defers the checks of every session linked to it: the gateway writes into
    /// that thread itself then. Once other sessions' runs have deferred a session's check at 5
    /// ticks since its last check went through, only its own runs defer it, until one goes
    /// through (with a warning, once per link).
    #[must_use]
    pub fn run_activity(mut self, runs: Arc<dyn RunActivity>) -> Self {
        self.runs = runs;
        self
    }

    /// Sets the own-prompts port (default: an empty [`RecentPrompts`]). A source's rows are
    /// judged by the last 10 own prompts of every session linked to it (a thread several
    /// agents adopted), each one's a self-echo for all.
    #[must_use]
    pub fn own_prompts(mut self, prompts: Arc<dyn OwnPrompts>) -> Self {
        self.prompts = prompts;
        self
    }

    /// Sets the timing (checked by [`MonitorBuilder::try_build`] and [`MonitorBuilder::build`]).
    #[must_use]
    pub fn config(mut self, config: MonitorConfig) -> Self {
        self.config = config;
        self
    }

    /// The monitor (not running yet: see [`UpstreamMonitor::spawn`] and
    /// [`UpstreamMonitor::tick`]), or the [`ConfigError`] of a timing
    /// [`MonitorConfig::validate`] refuses.
    pub fn try_build(self) -> Result<UpstreamMonitor, ConfigError> {
        self.config.validate()?;
        let (events, _) = broadcast::channel(1024);
        let inner = Arc::new(Inner {
            awareness: self.awareness,
            links: self.links,
            providers: self.providers,
            runs: self.runs,
            prompts: self.prompts,
            config: self.config,
            events,
            missing: Mutex::new(HashMap::new()),
            deferrals: Mutex::new(HashMap::new()),
            listed: Mutex::new(HashSet::new()),
            logged: Logged::default(),
            ticks: AtomicU64::new(0),
            one_tick: tokio::sync::Mutex::new(()),
            passing: Mutex::default(),
        });
        Ok(UpstreamMonitor {
            handles: Arc::new(Handles(Arc::downgrade(&inner))),
            inner,
        })
    }

    /// The monitor (not running yet: see [`UpstreamMonitor::spawn`] and
    /// [`UpstreamMonitor::tick`]).
    ///
    /// # Panics
    ///
    /// On a timing [`MonitorConfig::validate`] refuses (a zero interval, timeout or count),
    /// with the [`ConfigError`]'s text. Timing that comes from a user goes through
    /// [`MonitorBuilder::try_build`].
    pub fn build(self) -> UpstreamMonitor {
        self.try_build()
            .unwrap_or_else(|e| panic!("invalid upstream monitor configuration: {e}"))
    }
}

/// The upstream monitor of one gateway process. Cheap to clone.
///
/// Dropping the last handle (and ending the task of [`UpstreamMonitor::spawn`], if one was
/// started) aborts the pass over the sources of unwatched links that a tick left running (a
/// read that hangs), which holds the monitor and through it the service and its store: the
/// task lets go of them once the runtime drops it.
#[derive(Clone)]
pub struct UpstreamMonitor {
    inner: Arc<Inner>,
    /// Shared by every handle and by the task of [`UpstreamMonitor::spawn`].
    handles: Arc<Handles>,
}

/// Aborts the pass over unwatched links ([`Inner::passing`]) once the last holder (a handle
/// of the monitor, or its spawned task) is dropped: nothing could tick the monitor any more,
/// and a pass whose read hangs would hold the service, and its store, for good. Weak, so that
/// it keeps nothing alive itself.
struct Handles(std::sync::Weak<Inner>);

impl Drop for Handles {
    fn drop(&mut self) {
        let Some(inner) = self.0.upgrade() else {
            return;
        };
        if let Some(task) = inner.take_pass() {
            task.abort();
        }
    }
}

impl fmt::Debug for UpstreamMonitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamMonitor")
            .field("config", &self.inner.config)
            .field(
                "providers",
                &self.inner.providers.keys().collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// `warn!` when `$news` (a failure not logged there before, or another one), else `debug!`:
/// a cause that does not go away by itself (a transcript the gateway may not read, a store
/// that stays down) is logged once at warn level, not at every tick for as long as it lasts.
macro_rules! warn_if_news {
    ($news:expr, $($arg:tt)+) => {
        if $news {
            warn!($($arg)+)
        } else {
            debug!($($arg)+)
        }
    };
}

/// Where the monitor fails, for [`Logged`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Site {
    /// Listing the links.
    List,
    /// Asking whether a link's session is watched.
    Watched,
    /// A provider's check.
    Check,
    /// Storing a scan time.
    ScanTime,
    /// Moving a marker.
    Marker,
    /// Removing a link.
    Remove,
    /// Asking the directory whether this gateway owns a link's session.
    Directory,
    /// Asking a gateway's port (run activity, own prompts) about the checked link's own
    /// session.
    Own,
    /// Passing over the source of a link nothing watches ([`Inner::pass_over`]).
    Pass,
    /// Asking a gateway's port about another session linked to the checked link's source
    /// (that session): [`Inner::ask_linked`].
    Linked(Port, SessionRef),
}

impl Site {
    /// The session other than the checked link's that the failure is about.
    fn linked(&self) -> Option<&SessionRef> {
        match self {
            Self::Linked(_, session) => Some(session),
            _ => None,
        }
    }
}

/// A gateway's port the monitor asks about a session in the tick itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Port {
    /// [`RunActivity::is_active`].
    Runs,
    /// [`OwnPrompts::recent`].
    Prompts,
}

/// The failures the monitor logged at warn level, by site and link (`None`: the tick's own),
/// with the text logged. A [`Site::Linked`] failure is kept per checked link and session
/// whose port failed.
#[derive(Debug, Default)]
struct Logged(Mutex<HashMap<(Site, Option<SessionRef>), String>>);

impl Logged {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<(Site, Option<SessionRef>), String>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `error` at `site` is news: not the failure logged there last (which it
    /// becomes).
    fn is_news(&self, site: Site, session: Option<&SessionRef>, error: &str) -> bool {
        let mut map = self.map();
        let key = (site, session.cloned());
        if map.get(&key).is_some_and(|logged| logged == error) {
            return false;
        }
        map.insert(key, error.to_owned());
        true
    }

    /// `site` worked for `session`: whether a failure had been logged there, which has ended.
    fn ended(&self, site: Site, session: Option<&SessionRef>) -> bool {
        let mut map = self.map();
        if map.is_empty() {
            return false;
        }
        map.remove(&(site, session.cloned())).is_some()
    }

    /// Forgets the failures of `session`'s link, which a tick did not check (nothing watches
    /// it, another gateway owns it, a run in it is active): a failure after that, of the same
    /// text, is news again. A linked session's port that failed is not forgotten: a check not
    /// made did not ask it, and it is warned of again only once it answered. Nor is a pass over
    /// the link's source that panicked: a link is not checked because nothing watches it, and
    /// then passed over (a pass that panics at every tick is warned of once).
    fn forget_link(&self, session: &SessionRef) {
        let mut map = self.map();
        if !map.is_empty() {
            map.retain(|(site, s), _| {
                site.linked().is_some() || *site == Site::Pass || s.as_ref() != Some(session)
            });
        }
    }

    /// Forgets the failures of links not in `now` (gone from the store), and those of the
    /// ports asked about sessions whose link is gone.
    fn keep_only(&self, now: &HashSet<SessionRef>) {
        self.map().retain(|(site, session), _| {
            session.as_ref().is_none_or(|s| now.contains(s))
                && site.linked().is_none_or(|s| now.contains(s))
        });
    }
}

struct Inner {
    awareness: Arc<Awareness>,
    links: Arc<dyn UpstreamStore>,
    providers: HashMap<String, Arc<dyn UpstreamProvider>>,
    runs: Arc<dyn RunActivity>,
    prompts: Arc<dyn OwnPrompts>,
    config: MonitorConfig,
    events: broadcast::Sender<Detection>,
    /// Consecutive `missing` checks per ref, for the link incarnation of that `updated_at`.
    missing: Mutex<HashMap<SessionRef, (Timestamp, u32)>>,
    /// Per ref: the ticks since its last check went through at which a run in another session
    /// linked to the same source deferred its check (from [`SHARED_DEFERRALS`] on, those runs
    /// no longer defer it; its own runs neither count nor start the count again, so that two
    /// sessions running by turns cannot keep each other unchecked), and whether that was
    /// warned of (once per link).
    deferrals: Mutex<HashMap<SessionRef, (u32, bool)>>,
    /// The refs of the links the last tick listed (less those whose link a check of ours
    /// removed), so that a link gone since, whoever removed it, takes its prompts with it.
    listed: Mutex<HashSet<SessionRef>>,
    /// The failures logged at `warn!`, so that one that repeats at every tick is not.
    logged: Logged,
    ticks: AtomicU64,
    /// Held for a whole tick: ticks never overlap.
    one_tick: tokio::sync::Mutex<()>,
    /// The task passing over the sources of the links nothing watches ([`Inner::pass_over`]),
    /// one at a time: while it runs (a read that hangs keeps it running), no other starts, so
    /// that those reads never take more than one of a provider's read permits from the checks
    /// of watched links. Aborted when the spawned task ends, or the last handle goes
    /// ([`Handles`]).
    passing: Mutex<Option<JoinHandle<()>>>,
}

/// The running monitor task. [`MonitorTask::stop`] ends it cleanly; dropping it ends it too.
#[derive(Debug)]
pub struct MonitorTask {
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

impl MonitorTask {
    /// Stops the task (a tick in progress is abandoned: every store write is atomic and the
    /// marker moves only after its event, so the next run reads again from the stored marker;
    /// see the module docs for why that neither records a burst twice nor skips a turn typed
    /// meanwhile) and waits for it to end, the checks of an abandoned tick included, and then
    /// for the store writes the service had started by then ([`Awareness::wait_for_writes`]: a
    /// recording an abandoned check had started runs to its end on a task of its own). Once
    /// this returns, neither the task nor a write the service runs on a task of its own holds
    /// anything of the monitor or its store; a link write (a marker moved, a link removed)
    /// that an abandoned check had begun may still be finished by the store itself (store-redb's
    /// writer finishes a write whose caller gave up), which closing the store waits for. A
    /// store write that never ends makes this wait for good.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.handle.await
            && e.is_panic()
        {
            warn!(error = %ErrorChain(&e), "the upstream monitor task panicked");
        }
    }

    /// Whether the task has ended.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

impl UpstreamMonitor {
    /// A monitor recording through `awareness`, reading and moving the links of `links`.
    pub fn builder(awareness: Arc<Awareness>, links: Arc<dyn UpstreamStore>) -> MonitorBuilder {
        MonitorBuilder {
            awareness,
            links,
            providers: HashMap::new(),
            runs: Arc::new(NoRuns),
            prompts: Arc::new(RecentPrompts::new()),
            config: MonitorConfig::default(),
        }
    }

    /// The detections from now on (a receiver that lags behind loses the oldest ones).
    pub fn subscribe(&self) -> broadcast::Receiver<Detection> {
        self.inner.events.subscribe()
    }

    /// The timing in use.
    pub fn config(&self) -> MonitorConfig {
        self.inner.config
    }

    /// Runs one tick now (waiting for a tick in progress to end first).
    pub async fn tick(&self) -> TickReport {
        Inner::tick(&self.inner, &mut JoinSet::new()).await
    }

    /// Starts the monitor on the current tokio runtime (a `first_tick` beyond what the clock can
    /// reach means never): the first tick after
    /// `config.first_tick`, then every `config.interval`.
    pub fn spawn(&self) -> MonitorTask {
        let inner = Arc::clone(&self.inner);
        // The task counts as a handle: dropping the monitor's handles while it runs ends no
        // pass of its ticks.
        let handles = Arc::clone(&self.handles);
        let (stop, mut stopped) = watch::channel(false);
        let handle = tokio::spawn(async move {
            // A first tick too far away for the clock never comes, rather than panicking.
            let start = config::after(tokio::time::Instant::now(), inner.config.first_tick);
            // At least 1 ms: checked when the monitor was built.
            let mut ticks = tokio::time::interval_at(start, inner.config.interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Outlives each tick, so that the checks of a tick abandoned by `stop` are not
            // only aborted but waited for below.
            let mut checks = JoinSet::new();
            loop {
                tokio::select! {
                    biased;
                    _ = stopped.changed() => break,
                    _ = ticks.tick() => {}
                }
                tokio::select! {
                    biased;
                    _ = stopped.changed() => break,
                    () = Inner::tick_guarded(&inner, &mut checks) => {}
                }
            }
            // An aborted check lets go of the monitor (and through it the store) only once its
            // task is dropped, on whichever thread runs it next: wait for that, so that nothing
            // of the monitor holds the store once `stop` returns.
            checks.shutdown().await;
            // So is the pass over unwatched links, which holds the monitor too.
            if let Some(task) = inner.take_pass() {
                task.abort();
                let _ = task.await;
            }
            // A recording an aborted check had started runs on to its end on a task of its
            // own, holding the store: wait for it too.
            inner.awareness.wait_for_writes().await;
            drop(handles);
            debug!("upstream monitor stopped");
        });
        MonitorTask { stop, handle }
    }
}

/// What [`Inner::watched`] found.
enum Watched {
    Yes,
    No,
    /// The store failed (`answered`) or did not answer within its wait.
    Unknown {
        error: String,
        answered: bool,
    },
}

/// Ticks, since its last check went through, at which a session's check may be deferred by
/// runs in other sessions linked to its source before only its own runs defer it (see
/// [`Inner::deferred_long`]).
const SHARED_DEFERRALS: u32 = 5;

/// A check deferred by a run ([`Inner::own_of`]).
struct Deferral {
    /// The run is another linked session's, not the checked session's own.
    by_another: bool,
}

/// What makes two links read one source: their provider, and the source it names for each
/// ([`UpstreamProvider::source_key`]). The catalog a link was adopted through is not part of
/// it: one thread is one source whichever catalog listed it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SourceId(String, String);

impl SourceId {
    /// `None` for a link no provider reads (it is not checked), or whose provider panicked
    /// naming its source (it is then judged alone).
    fn of(
        providers: &HashMap<String, Arc<dyn UpstreamProvider>>,
        link: &UpstreamLink,
    ) -> Option<Self> {
        let provider = providers.get(&link.upstream_kind)?;
        let named =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| provider.source_key(link)));
        named.ok().map(|key| Self(link.upstream_kind.clone(), key))
    }
}

impl Inner {
    /// The task of the pass over unwatched links, if one runs, taken out of [`Inner::passing`]
    /// (by the monitor's end: [`Handles`], or the spawned task's).
    fn take_pass(&self) -> Option<JoinHandle<()>> {
        self.passing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
    fn emit(&self, d: Detection) {
        // No subscriber is fine.
        let _ = self.events.send(d);
    }

    /// Tells the gateway's own prompts port that a session's link is gone. A port that panics
    /// is logged and costs nothing else: the panic ended the monitor's task when it came in a
    /// tick, and hid the removal's detection when it came in a check.
    fn forget_prompts(&self, session: &SessionRef) {
        let told = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.prompts.forget(session);
        }));
        if let Err(panic) = told {
            let message = awareness_core::error::panic_message(&*panic);
            warn!(session_key = %session.session_key, agent_id = %session.agent_id, panic = %message, "upstream monitor: the gateway's own prompts panicked while forgetting a removed link's session; the monitor goes on");
        }
    }

    fn missing_counts(&self) -> std::sync::MutexGuard<'_, HashMap<SessionRef, (Timestamp, u32)>> {
        self.missing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn listed(&self) -> std::sync::MutexGuard<'_, HashSet<SessionRef>> {
        self.listed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A tick of the monitor's task: [`Inner::tick`], a panic in it (a store or a port that
    /// panics outside a check) logged and its checks ended, instead of ending the task, and
    /// with it the monitoring of every adopted session. The next tick runs as usual.
    ///
    /// The tick still ends with its [`Detection::TickDone`], so that a subscriber counting
    /// ticks misses none: what it had counted before the panic, no link counted as checked
    /// (their results were not taken).
    async fn tick_guarded(me: &Arc<Inner>, checks: &mut JoinSet<bool>) {
        let mut report = TickReport::default();
        let tick =
            crate::service::CatchUnwind(Box::pin(Inner::tick_into(me, checks, &mut report))).await;
        if let Err(panic) = tick {
            warn!(
                tick = report.tick,
                panic = awareness_core::error::panic_message(&*panic),
                "upstream monitor: a tick panicked; its checks are ended, and the next tick runs"
            );
            checks.abort_all();
            while checks.join_next().await.is_some() {}
            report.checked = 0;
            me.emit(Detection::TickDone(report));
        }
    }

    /// One tick, its checks spawned on `checks` (empty on entry, empty again when the tick
    /// ends; a tick abandoned midway leaves the caller to end them).
    async fn tick(me: &Arc<Inner>, checks: &mut JoinSet<bool>) -> TickReport {
        let mut report = TickReport::default();
        Inner::tick_into(me, checks, &mut report).await;
        report
    }

    /// [`Inner::tick`], counting into `report` (which holds what the tick had counted if it
    /// panics).
    async fn tick_into(me: &Arc<Inner>, checks: &mut JoinSet<bool>, report: &mut TickReport) {
        let _one = me.one_tick.lock().await;
        *report = TickReport {
            tick: me.ticks.fetch_add(1, Ordering::Relaxed) + 1,
            ..TickReport::default()
        };
        let mut links = match me.awareness.bounded("list links", me.links.links()).await {
            Ok(links) => {
                if me.logged.ended(Site::List, None) {
                    info!("upstream monitor: links listed again");
                }
                links
            }
            Err(e) => {
                let e = ErrorChain(&e).to_string();
                warn_if_news!(me.logged.is_news(Site::List, None, &e), error = %e, "upstream monitor: cannot list links; trying again next tick");
                me.emit(Detection::TickDone(*report));
                return;
            }
        };
        report.links = links.len();
        // A link listed last tick and gone now takes its own prompts with it, as a removal of
        // ours does, whoever removed it: the gateway deleting its session
        // ([`crate::Awareness::on_delete`]), another process, or a removal of ours the store
        // answered too late (which `gone` took for a failure). Prompts kept for links removed
        // so grew with every session ever adopted.
        let now: HashSet<SessionRef> = links.iter().map(|l| l.session.clone()).collect();
        me.missing_counts().retain(|r, _| now.contains(r));
        me.deferrals().retain(|r, _| now.contains(r));
        me.logged.keep_only(&now);
        let forgotten: Vec<SessionRef> = {
            let mut listed = me.listed();
            let gone = listed.difference(&now).cloned().collect();
            *listed = now;
            gone
        };
        for r in &forgotten {
            me.forget_prompts(r);
        }
        // The session of each check task, for the one that panics.
        let mut sessions = HashMap::new();
        // Whether each session is watched is asked link after link, within one `store_wait`
        // for the whole tick: a wait each held a tick of 100 links for 1,000 s (10 s each)
        // when the store stopped answering. Once the wait is over, the links not asked yet are
        // not asked this tick, and the tick starts one link further on each time, so that a
        // store too slow to answer them all leaves out other links at each tick, not the same.
        let deadline = me.awareness.store_deadline();
        if !links.is_empty() {
            let first = usize::try_from(report.tick % links.len() as u64).unwrap_or(0);
            links.rotate_left(first);
        }
        // The sessions linked to each source: a thread several agents adopted is written into
        // by each of them, so the prompts any of them sent are echoes for all, and a run of any
        // defers them all (DESIGN 9.6).
        let mut sharing: HashMap<SourceId, Vec<SessionRef>> = HashMap::new();
        for link in &links {
            if let Some(source) = SourceId::of(&me.providers, link) {
                sharing
                    .entry(source)
                    .or_default()
                    .push(link.session.clone());
            }
        }
        let mut silent = false;
        let mut unwatched = Vec::new();
        for link in links {
            let Some(provider) = me.providers.get(&link.upstream_kind).cloned() else {
                report.no_provider += 1;
                me.logged.forget_link(&link.session);
                continue;
            };
            match me.awareness.monitors(&link.session) {
                Some(true) => {
                    if me.logged.ended(Site::Directory, Some(&link.session)) {
                        info!(session_key = %link.session.session_key, "upstream monitor: the gateway's session directory answers again");
                    }
                }
                Some(false) => {
                    report.not_owned += 1;
                    me.not_deferred(&link.session);
                    me.logged.forget_link(&link.session);
                    continue;
                }
                None => {
                    let error = "the gateway's session directory panicked";
                    warn_if_news!(me.logged.is_news(Site::Directory, Some(&link.session), error), session_key = %link.session.session_key, "upstream monitor: the gateway's session directory panicked when asked whether this gateway owns the session; skipping it this tick");
                    me.emit(Detection::Failed {
                        session: link.session.clone(),
                        error: error.to_owned(),
                    });
                    continue;
                }
            }
            if silent {
                me.emit(Detection::Failed {
                    session: link.session.clone(),
                    error: "not checked: the store's wait for this tick was over before it \
                            was asked whether the session is watched"
                        .to_owned(),
                });
                continue;
            }
            match me.watched(&link.session, deadline).await {
                Watched::Yes => {
                    // Not passed over while watched: a pass that panics once it is unwatched
                    // again is news again (as `forget_link` makes a check's failure).
                    me.logged.ended(Site::Pass, Some(&link.session));
                }
                Watched::No => {
                    report.unwatched += 1;
                    me.not_deferred(&link.session);
                    me.logged.forget_link(&link.session);
                    // Its rows are read and passed over once the checks are done, so that a
                    // watch that begins later starts at the source's end as it starts at the
                    // session's head.
                    unwatched.push((provider, link));
                    continue;
                }
                Watched::Unknown { error, answered } => {
                    silent = !answered;
                    me.emit(Detection::Failed {
                        session: link.session.clone(),
                        error,
                    });
                    continue;
                }
            }
            // The gateway's own ports, asked here in the tick itself: one that panics for the
            // checked session fails its check, not the monitor; one that panics for another
            // session linked to its source loses this check only that session's answer
            // (`own_of`), so that it fails no check but its own.
            let group = SourceId::of(&me.providers, &link)
                .and_then(|source| sharing.get(&source).cloned())
                .unwrap_or_else(|| vec![link.session.clone()]);
            let alone = me.deferred_long(&link.session);
            let asked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                me.own_of(&group, &link.session, alone)
            }));
            if asked.is_ok() && me.logged.ended(Site::Own, Some(&link.session)) {
                info!(session_key = %link.session.session_key, agent_id = %link.session.agent_id, "upstream monitor: the gateway's run activity and own prompts answer again for the checked session");
            }
            let own = match asked {
                Ok(Ok(own)) => own,
                Ok(Err(Deferral { by_another })) => {
                    report.deferred += 1;
                    // Another session's run counts towards checking it alone.
                    if by_another {
                        me.deferred_again(&link.session, group.len());
                    }
                    me.logged.forget_link(&link.session);
                    me.emit(Detection::Deferred {
                        session: link.session.clone(),
                    });
                    continue;
                }
                Err(panic) => {
                    let message = awareness_core::error::panic_message(&*panic);
                    warn_if_news!(me.logged.is_news(Site::Own, Some(&link.session), message), session_key = %link.session.session_key, agent_id = %link.session.agent_id, panic = %message, "upstream monitor: the gateway's run activity or own prompts panicked when asked about the checked session; its check fails this tick");
                    me.emit(Detection::Failed {
                        session: link.session.clone(),
                        error: "the gateway's run activity or own prompts panicked".to_owned(),
                    });
                    continue;
                }
            };
            report.checked += 1;
            let session = link.session.clone();
            let me = Arc::clone(me);
            let task =
                checks.spawn(async move { me.check(provider, link, own, group, alone).await });
            sessions.insert(task.id(), session);
        }
        while let Some(done) = checks.join_next_with_id().await {
            match done {
                Ok((_, true)) => {
                    report.checked -= 1;
                    report.deferred += 1;
                }
                // A provider, a port or the store that panics in one check fails that
                // session's check, said as any failure is: the marker stays, and the next
                // tick reads the rows again.
                Err(e) if e.is_panic() => {
                    // Its result was not taken: failed, as a port that panics fails a check.
                    report.checked -= 1;
                    let session = sessions.remove(&e.id());
                    let panic = e.into_panic();
                    let message = awareness_core::error::panic_message(&*panic);
                    warn!(
                        session_key = session.as_ref().map(|s| s.session_key.as_str()),
                        panic = message,
                        "upstream monitor: a check panicked"
                    );
                    if let Some(session) = session {
                        me.emit(Detection::Failed {
                            session,
                            error: format!("the check panicked: {message}"),
                        });
                    }
                }
                Ok((_, false)) | Err(_) => {}
            }
        }
        Inner::pass_over_all(me, unwatched).await;
        me.emit(Detection::TickDone(*report));
    }

    /// Starts the task of [`Inner::pass_over_all`], unless the one of an earlier tick still
    /// runs.
    fn start_passing(
        me: &Arc<Inner>,
        unwatched: Vec<(Arc<dyn UpstreamProvider>, UpstreamLink)>,
    ) -> Option<tokio::sync::oneshot::Receiver<()>> {
        let mut passing = me.passing.lock().unwrap_or_else(PoisonError::into_inner);
        if passing.as_ref().is_some_and(|task| !task.is_finished()) {
            debug!(
                links = unwatched.len(),
                "upstream monitor: the sources of unwatched links are not passed over this tick: an earlier pass still reads"
            );
            return None;
        }
        let (finished, done) = tokio::sync::oneshot::channel();
        let task = {
            let me = Arc::clone(me);
            tokio::spawn(async move {
                for (provider, link) in unwatched {
                    me.pass_over_caught(provider, link).await;
                }
                finished.send(()).ok();
            })
        };
        *passing = Some(task);
        Some(done)
    }

    /// Passes over the sources of `unwatched` one after another ([`Inner::pass_over`]) on a
    /// task of its own, and waits for it at most a provider's timeout; while the task of an
    /// earlier tick still runs (a read that hangs), this tick passes over nothing.
    async fn pass_over_all(
        me: &Arc<Inner>,
        unwatched: Vec<(Arc<dyn UpstreamProvider>, UpstreamLink)>,
    ) {
        if unwatched.is_empty() {
            return;
        }
        let Some(done) = Inner::start_passing(me, unwatched) else {
            return;
        };
        // Told when the task ends (or, dropped unsent, when it is aborted).
        let waited = tokio::time::timeout(me.config.provider_timeout, done).await;
        if waited.is_err() {
            debug!(
                "upstream monitor: passing over the sources of unwatched links goes on past the tick"
            );
        }
    }

    /// [`Inner::pass_over`], a panic in it (its provider's, or the store's) caught as a check's
    /// is: logged (a `warn!` the first time, `debug!` while the same panic repeats, `info!`
    /// once a pass reads the source again), the link's marker left where it was, and the pass goes
    /// on with the other links. The panic ended the pass's task, leaving the markers of the
    /// links after it unmoved (a watch that began later was told of their backlog), unlogged.
    async fn pass_over_caught(&self, provider: Arc<dyn UpstreamProvider>, link: UpstreamLink) {
        let session = link.session.clone();
        let passed = crate::service::CatchUnwind(Box::pin(self.pass_over(provider, link))).await;
        match passed {
            // A pass that read nothing (the source missing or unreadable) says nothing of
            // whether the panic is over: the next that reads does.
            Ok(false) => {}
            Ok(true) => {
                if self.logged.ended(Site::Pass, Some(&session)) {
                    info!(session_key = %session.session_key, agent_id = %session.agent_id, "upstream monitor: the source of an unwatched link is passed over again");
                }
            }
            Err(panic) => {
                let message = awareness_core::error::panic_message(&*panic);
                warn_if_news!(self.logged.is_news(Site::Pass, Some(&session), message), session_key = %session.session_key, agent_id = %session.agent_id, panic = %message, "upstream monitor: passing over the source of an unwatched link panicked; its marker stays, and the other links are passed over");
            }
        }
    }

    /// Whether a cursor watches the session (its key and agent), given up at `deadline`.
    async fn watched(
        &self,
        session: &SessionRef,
        deadline: Option<tokio::time::Instant>,
    ) -> Watched {
        let filter = CursorFilter {
            target: Some(session.session_key.clone()),
            ..CursorFilter::default()
        };
        let read =
            crate::service::unpanicked("read cursors", self.awareness.store().cursors(&filter));
        let (e, answered) = match self.awareness.within(deadline, read).await {
            Some(Ok(cursors)) => {
                if self.logged.ended(Site::Watched, Some(session)) {
                    info!(session_key = %session.session_key, "upstream monitor: the session's watchers read again");
                }
                return if cursors.iter().any(|c| c.follows(session)) {
                    Watched::Yes
                } else {
                    Watched::No
                };
            }
            Some(Err(e)) => (e, true),
            None => (self.awareness.no_answer("read cursors"), false),
        };
        let e = ErrorChain(&e).to_string();
        let news = self.logged.is_news(Site::Watched, Some(session), &e);
        if answered {
            warn_if_news!(news, session_key = %session.session_key, error = %e, "upstream monitor: cannot tell whether the session is watched; skipping it this tick");
        } else {
            warn_if_news!(news, session_key = %session.session_key, error = %e, "upstream monitor: the store's wait for this tick is over; skipping this link and the ones not asked yet until the next tick");
        }
        Watched::Unknown {
            error: format!("cannot read its watchers: {e}"),
            answered,
        }
    }

    /// Reads the source of a link nothing watches forward from its marker and moves the marker
    /// past what it read, recording nothing and concluding nothing (a source missing or a
    /// failed read is left to the checks once the session is watched). A watch starts at the
    /// head of its target (DESIGN.md section 4): what a person typed before it is not told
    /// to it, and the gateway's own prompts of that time, long gone from the self-echo window
    /// by the time a watch begins, would read as a person's turns. OpenClaw leaves such a
    /// link's marker where it was and records the backlog once the session is watched
    /// (decision 0004).
    ///
    /// The read is not bounded here: [`Inner::pass_over_all`] runs one pass at a time. A link
    /// watched by the time the read is done keeps its marker (the next tick checks it from
    /// there), so that a turn typed after the watch began is not passed over.
    ///
    /// Answers whether the source was read (whatever became of the marker then).
    async fn pass_over(&self, provider: Arc<dyn UpstreamProvider>, link: UpstreamLink) -> bool {
        let session = &link.session;
        let marker = match provider.check(&link, &[]).await {
            CheckOutcome::Unchanged { marker }
            | CheckOutcome::Rebased { marker }
            | CheckOutcome::HumanTurns { marker, .. } => marker,
            CheckOutcome::Missing => return false,
            CheckOutcome::Failed(error) => {
                debug!(session_key = %session.session_key, error = %error, "upstream monitor: the source of an unwatched link could not be read; its marker stays");
                return false;
            }
        };
        if link.marker.as_ref() != Some(&marker)
            && matches!(self.watched(session, None).await, Watched::No)
            && let MarkerMove::Failed(error) = self.advance(&link, marker).await
        {
            debug!(session_key = %session.session_key, error = %error, "upstream monitor: the marker of an unwatched link was not moved; read again next tick");
        }
        true
    }

    /// Checks one link and acts on the result; answers whether the result was deferred (a
    /// run or an own prompt came during the check).
    async fn check(
        &self,
        provider: Arc<dyn UpstreamProvider>,
        link: UpstreamLink,
        own: Vec<String>,
        group: Vec<SessionRef>,
        alone: bool,
    ) -> bool {
        let limit = self.config.provider_timeout;
        let outcome = tokio::time::timeout(limit, provider.check(&link, &own))
            .await
            .unwrap_or_else(|_| {
                CheckOutcome::Failed(format!(
                    "the {} check timed out after {limit:?}",
                    link.upstream_kind
                ))
            });
        let session = link.session.clone();
        if !matches!(outcome, CheckOutcome::Failed(_)) {
            if self.logged.ended(Site::Check, Some(&session)) {
                info!(session_key = %session.session_key, kind = %link.upstream_kind, "upstream check works again");
            }
            let stored = self
                .awareness
                .bounded(
                    "store the scan time",
                    self.links.mark_scanned(&session, self.awareness.now()),
                )
                .await;
            match stored {
                Ok(_) => {
                    if self.logged.ended(Site::ScanTime, Some(&session)) {
                        info!(session_key = %session.session_key, "upstream monitor: scan time stored again");
                    }
                }
                Err(e) => {
                    let e = ErrorChain(&e).to_string();
                    warn_if_news!(self.logged.is_news(Site::ScanTime, Some(&session), &e), session_key = %session.session_key, error = %e, "upstream monitor: scan time not stored");
                }
            }
        }
        match outcome {
            CheckOutcome::Unchanged { marker } => {
                self.found(&session);
                if link.marker.as_ref() != Some(&marker)
                    && let MarkerMove::Failed(error) = self.advance(&link, marker).await
                {
                    self.emit(Detection::Failed {
                        session,
                        error: format!(
                            "the marker was not moved past the rows read: {error}; they are read again next tick"
                        ),
                    });
                }
            }
            CheckOutcome::Rebased { marker } => {
                self.found(&session);
                match self.advance(&link, marker).await {
                    MarkerMove::Moved => self.emit(Detection::Rebased { session }),
                    // The link was adopted again or removed: its new state stands.
                    MarkerMove::LinkChanged => {}
                    MarkerMove::Failed(error) => self.emit(Detection::Failed {
                        session,
                        error: format!(
                            "the source was replaced or truncated, but its new marker was not stored: {error}; retried next tick"
                        ),
                    }),
                }
            }
            CheckOutcome::HumanTurns { .. }
                if self.own_of(&group, &session, alone).as_ref().ok() != Some(&own) =>
            {
                // A run began, or the gateway sent a prompt, while the check read (in this
                // session, or another linked to the same source): the rows
                // were judged against own prompts that may not hold that prompt yet. Nothing
                // is recorded and the marker stays; a later tick reads them again, once no run
                // is active, against the prompts of then.
                self.found(&session);
                debug!(session_key = %session.session_key, "a run or an own prompt came during the check; its human turns are read again later");
                self.emit(Detection::Deferred { session });
                return true;
            }
            CheckOutcome::HumanTurns {
                turns,
                dedupe_id,
                source_id,
                marker,
            } => {
                self.found(&session);
                self.human_turns(&link, turns.max(1), &source_id, &dedupe_id, marker)
                    .await;
            }
            CheckOutcome::Missing => self.gone(&link).await,
            CheckOutcome::Failed(error) => {
                warn_if_news!(self.logged.is_news(Site::Check, Some(&session), &error), session_key = %session.session_key, kind = %link.upstream_kind, error = %error, "upstream check failed; retried next tick");
                self.emit(Detection::Failed { session, error });
            }
        }
        self.not_deferred(&link.session);
        false
    }

    /// The own prompts a check of `session`'s source judges its rows by: those of every
    /// session in `group` (the sessions linked to the source), each one's last
    /// [`upstream::SELF_ECHO_WINDOW`]; a [`Deferral`] while a run of any of them is active
    /// (the gateway writes into the thread itself then), or of `session` only when it is
    /// checked `alone` ([`Inner::deferred_long`]).
    ///
    /// `session`'s own ports are asked as they are: a panic of theirs unwinds to the caller,
    /// which fails its check. Each other session's are asked under a `catch_unwind` of their
    /// own ([`Inner::ask_linked`]): one whose run activity panics is taken as not running (it
    /// cannot defer this check), one whose own prompts panic as having sent none (its own
    /// prompts echoed into the thread may then read as a person's turn), so that a port that
    /// panics for one session of a shared source fails only that session's check.
    fn own_of(
        &self,
        group: &[SessionRef],
        session: &SessionRef,
        alone: bool,
    ) -> Result<Vec<String>, Deferral> {
        // Its own run first: it defers the check whatever the others do, and never counts.
        if self.runs.is_active(session) {
            return Err(Deferral { by_another: false });
        }
        if !alone
            && group.iter().any(|s| {
                s != session && self.ask_linked(session, Port::Runs, s, || self.runs.is_active(s))
            })
        {
            return Err(Deferral { by_another: true });
        }
        let mut own = Vec::new();
        for s in group {
            let recent = if s == session {
                self.prompts.recent(s)
            } else {
                self.ask_linked(session, Port::Prompts, s, || self.prompts.recent(s))
            };
            let skip = recent.len().saturating_sub(upstream::SELF_ECHO_WINDOW);
            own.extend(recent.into_iter().skip(skip));
        }
        Ok(own)
    }

    /// Asks `port` about `other`, a session linked to the source of `session`'s check, under a
    /// `catch_unwind` of its own: a panic is logged (a `warn!` once per checked link and
    /// session whose port panicked, `debug!` while it repeats, `info!` once it answers again)
    /// and answers the default (`false`: not running; no prompts).
    fn ask_linked<T: Default>(
        &self,
        session: &SessionRef,
        port: Port,
        other: &SessionRef,
        ask: impl FnOnce() -> T,
    ) -> T {
        let site = || Site::Linked(port, other.clone());
        let name = match port {
            Port::Runs => "run activity",
            Port::Prompts => "own prompts",
        };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(ask)) {
            Ok(answer) => {
                if self.logged.ended(site(), Some(session)) {
                    info!(session_key = %session.session_key, agent_id = %session.agent_id, linked_session_key = %other.session_key, linked_agent_id = %other.agent_id, port = name, "upstream monitor: the gateway's port answers again for a session linked to the checked session's source");
                }
                answer
            }
            Err(panic) => {
                let message = awareness_core::error::panic_message(&*panic);
                let news = self.logged.is_news(site(), Some(session), message);
                match port {
                    Port::Runs => {
                        warn_if_news!(news, session_key = %session.session_key, agent_id = %session.agent_id, linked_session_key = %other.session_key, linked_agent_id = %other.agent_id, panic = %message, "upstream monitor: the gateway's run activity panicked for a session linked to the checked session's source; until it answers, that session is taken as not running (its runs do not defer the check)");
                    }
                    Port::Prompts => {
                        warn_if_news!(news, session_key = %session.session_key, agent_id = %session.agent_id, linked_session_key = %other.session_key, linked_agent_id = %other.agent_id, panic = %message, "upstream monitor: the gateway's own prompts panicked for a session linked to the checked session's source; until they answer, the check goes on with the other sessions' prompts (that session's, echoed into the thread, may read as a person's turn)");
                    }
                }
                T::default()
            }
        }
    }

    fn deferrals(&self) -> std::sync::MutexGuard<'_, HashMap<SessionRef, (u32, bool)>> {
        self.deferrals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `session`'s check went through, or was not made for another reason than a run (its
    /// link unwatched, not this gateway's): its count of deferrals starts again.
    fn not_deferred(&self, session: &SessionRef) {
        if let Some((n, _)) = self.deferrals().get_mut(session) {
            *n = 0;
        }
    }

    /// Whether `session`'s check was deferred at [`SHARED_DEFERRALS`] ticks since its last
    /// check went through by runs in other sessions linked to its source: it is then deferred only by a run of its own (as
    /// a session that shares its source with none), so that sessions linked to one thread
    /// that take turns running (agents answering each other) do not keep each other from
    /// being checked for good.
    fn deferred_long(&self, session: &SessionRef) -> bool {
        self.deferrals()
            .get(session)
            .is_some_and(|(n, _)| *n >= SHARED_DEFERRALS)
    }

    /// A run in another of the `linked` sessions of `session`'s source deferred its check.
    fn deferred_again(&self, session: &SessionRef, linked: usize) {
        let mut deferrals = self.deferrals();
        let (n, warned) = deferrals.entry(session.clone()).or_default();
        *n = n.saturating_add(1);
        if *n >= SHARED_DEFERRALS && !*warned {
            *warned = true;
            warn!(session_key = %session.session_key, agent_id = %session.agent_id, ticks = SHARED_DEFERRALS, linked, "upstream monitor: runs in other sessions linked to the same source deferred a session's check at 5 ticks since its last check went through; from then on, until one goes through, only its own runs defer it");
        }
    }

    fn found(&self, session: &SessionRef) {
        self.missing_counts().remove(session);
    }

    /// Moves the marker if the link is still the one the tick read, and says what became of it
    /// (a store failure is logged here).
    async fn advance(&self, link: &UpstreamLink, marker: Value) -> MarkerMove {
        let now = self.awareness.now();
        let write = self
            .links
            .set_marker(&link.session, link.updated_at, marker, now);
        let moved = self.awareness.bounded("move the marker", write).await;
        if moved.is_ok() && self.logged.ended(Site::Marker, Some(&link.session)) {
            info!(session_key = %link.session.session_key, "upstream monitor: the marker moves again");
        }
        match moved {
            Ok(true) => MarkerMove::Moved,
            Ok(false) => {
                debug!(session_key = %link.session.session_key, "the link changed during the scan; its marker stays");
                MarkerMove::LinkChanged
            }
            Err(e) => {
                let error = ErrorChain(&e).to_string();
                warn_if_news!(self.logged.is_news(Site::Marker, Some(&link.session), &error), session_key = %link.session.session_key, error = %error, "upstream marker not moved (a store that did not answer may still move it); the same rows are read again next tick");
                MarkerMove::Failed(error)
            }
        }
    }

    async fn human_turns(
        &self,
        link: &UpstreamLink,
        turns: u32,
        source_id: &str,
        dedupe_id: &str,
        marker: Value,
    ) {
        let session = link.session.clone();
        let mut msg = HumanMessage::new(session.session_key.clone());
        msg.agent_id = Some(session.agent_id.clone());
        msg.channel = Some(link.catalog_id.clone());
        msg.dedupe_key = Some(upstream::human_dedupe_key(link, source_id, dedupe_id));
        msg.turns = turns;
        // Logged by the service either way; the marker stays.
        let event = match self.awareness.human_message_recorded(msg).await {
            HumanRecorded::Event(event) => event,
            HumanRecorded::Unwatched => {
                self.emit(Detection::Failed {
                    session,
                    error: "the human turns were not recorded: nothing watches the session any \
                            more (its watch went during the check); the marker stays"
                        .into(),
                });
                return;
            }
            HumanRecorded::Failed(error) => {
                self.emit(Detection::Failed {
                    session,
                    error: format!(
                        "the human turns were not recorded: {error}; the marker stays, so they \
                         are read again next tick"
                    ),
                });
                return;
            }
            // The monitor's messages are a person's (`HumanMessage::new`) of one turn or more:
            // not reached.
            HumanRecorded::NotHuman | HumanRecorded::NoTurns => {
                self.emit(Detection::Failed {
                    session,
                    error: "the human turns were not recorded: taken for no person's turn; the \
                            marker stays"
                        .into(),
                });
                return;
            }
        };
        let marker = self.advance(link, marker).await;
        self.emit(Detection::HumanTurns {
            session,
            catalog_id: link.catalog_id.clone(),
            turns,
            event,
            marker,
        });
    }

    async fn gone(&self, link: &UpstreamLink) {
        let session = link.session.clone();
        let consecutive = {
            let mut counts = self.missing_counts();
            let entry = counts
                .entry(session.clone())
                .or_insert((link.updated_at, 0));
            if entry.0 != link.updated_at {
                *entry = (link.updated_at, 0);
            }
            entry.1 += 1;
            entry.1
        };
        if consecutive < self.config.missing_checks {
            self.emit(Detection::Missing {
                session,
                consecutive,
            });
            return;
        }
        // A link store accepts only catalog ids that fit (`LinkSpec::validate`); one stored
        // before that rule is fitted into the summary rather than failing every check until
        // it is removed. The payload keeps it as stored.
        let fit = Fit::new(&session.session_key, EventKind::UpstreamMissing);
        let mut payload = Payload::new();
        payload.insert("channel".into(), json!(link.catalog_id));
        let mut event = NewEvent::new(
            session.clone(),
            EventKind::UpstreamMissing,
            ActorType::System,
            fit.summary(
                "catalog id",
                upstream::UPSTREAM_MISSING_VIA,
                &link.catalog_id,
                upstream::UNKNOWN_CHANNEL,
            ),
        )
        .with_dedupe_key(upstream::missing_dedupe_key(link));
        event.payload = fit.payload("payload", payload);
        let Some(recorded) = self.awareness.record(event).await else {
            // Logged by the service; the count stays, so the next check records it again.
            self.emit(Detection::Failed {
                session,
                error: "upstream_missing was not recorded".into(),
            });
            return;
        };
        let write = self.links.remove_link(&session, Some(link.updated_at));
        let link_removed = match self.awareness.bounded("remove the link", write).await {
            Ok(removed) => {
                if self.logged.ended(Site::Remove, Some(&session)) {
                    info!(session_key = %session.session_key, "upstream monitor: the link removal was answered");
                }
                removed
            }
            Err(e) => {
                let e = ErrorChain(&e).to_string();
                warn_if_news!(self.logged.is_news(Site::Remove, Some(&session), &e), session_key = %session.session_key, error = %e, "upstream link not removed (a store that did not answer may still remove it); retried next tick");
                false
            }
        };
        if link_removed {
            self.found(&session);
            self.listed().remove(&session);
            self.forget_prompts(&session);
        }
        self.emit(Detection::UpstreamMissing {
            session,
            catalog_id: link.catalog_id.clone(),
            event: recorded.event,
            link_removed,
        });
    }
}
