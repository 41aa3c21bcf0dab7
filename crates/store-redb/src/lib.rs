//! # store-redb
//!
//! The [`EventStore`] and [`CursorStore`] of session state awareness on [redb]: one file, pure
//! Rust, no SQL, crash-safe, with the durability the user chooses at open. Pick it over
//! `store-sqlite` when you want a single embedded file without a C library and the fastest
//! reconcile; pick `store-sqlite` when the file must be shared with OpenClaw or inspected with
//! SQL tools. The behaviour is exactly that of DESIGN.md sections 3 to 6: every protocol decision
//! is a call into `awareness-core`, and this crate only persists and queries.
//!
//! ```
//! use awareness_core::{ActorType, AwarenessStoreExt, CursorStore, EventKind, EventStore,
//!     NewEvent, SessionRef, Sequence, Timestamp, WatcherKey};
//! use store_redb::RedbStore;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let dir = tempfile::tempdir()?;
//! let store = RedbStore::open(dir.path().join("state.redb")).await?;
//! let now = Timestamp(1_800_000_000_000);
//! let child = SessionRef::parse("agent:main:subagent:child", "main")?;
//! let manager = WatcherKey::parse("agent:main:main")?;
//! store.watch(&manager, &child, now).await?;
//! let rec = store
//!     .record(NewEvent::new(child.clone(), EventKind::HumanDirectMessage, ActorType::Human,
//!         "human message via telegram"), now)
//!     .await?;
//! assert_eq!(rec.notices.len(), 1);
//! let status = store.session_status(&child, Some(Sequence(0)), None).await?;
//! assert_eq!(status.state_version, rec.event.sequence);
//! assert_eq!(status.state_changes.unwrap().events.len(), 1);
//! // Closing makes every commit durable off the runtime's threads (a drop would wait here).
//! store.close().await;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! ## Durability
//!
//! Chosen at open with [`RedbOptions::durability`]:
//!
//! - [`Durability::Immediate`] (the default): every commit is fsynced before the call returns;
//!   nothing committed is ever lost, not by a crash and not by a power cut.
//! - [`Durability::Bounded`]: commits use redb's `Durability::None` (atomic and visible at once,
//!   but not written to disk), and a background thread makes them durable with one empty durable
//!   commit every `flush_interval` when anything is pending. While that flush waits for redb's
//!   write lock (which a busy writer takes again and again), the next commit of a recording or
//!   another write is made durable in its stead, and the interval is timed from when the flush
//!   began. A crash loses at most the commits of
//!   the last interval (plus the time of that flush); what survives is always a consistent
//!   prefix of the commits, so heads, events and cursors still agree. [`RedbStore::flush`] makes
//!   everything durable at once, and closing the last handle does too. A lost commit's
//!   sequence numbers are never handed out again: the store reserves numbers 2^20 at a time
//!   in a durable commit (one per 1,048,576 numbers), and an open after a crash
//!   continues above the reservation, leaving a gap where the lost numbers were. After a
//!   crash, a head may read lower than a caller was told, until the session records again;
//!   a caller whose `changesSince` is above the head is told `versionAhead`.
//!
//! Closing: the last handle on a file in this process closes it (with `Bounded`, after a final
//! durable commit), whether it is dropped or [`RedbStore::close`]d. Dropping does that work on
//! the dropping thread, where it waits for an fsync; a write whose caller gave up and that the
//! writer still finishes keeps the file open until it ends, and closes it then, on its own
//! thread. In async code, `close().await` does the work on the blocking pool instead and
//! returns once the file is closed, after such writes (of every handle of the process);
//! through `Arc<dyn ...>`, `awareness_core::EventStore::close` calls it.
//!
//! Measured (criterion medians of one full run of `cargo bench -p awareness-benches --bench
//! stores`, 2026-12-01 09:41-09:50 UTC, schema 2; 50,000-event data set over 1,000 sessions,
//! `redb-bounded` flushing every second) on the development machine: 2 cores and a virtual
//! disk shared with other builds, where fsync latency moves several-fold within minutes (the
//! Immediate floor measured 577 µs in a run of 11-30). Compare within the table, not across
//! runs:
//!
//! | operation | Immediate | Bounded |
//! |---|---|---|
//! | floor: bare one-key insert per write transaction | 215 µs | 15.5 µs |
//! | the same through `spawn_blocking` | 246 µs | 22.9 µs |
//! | `record/0_watchers` | 344 µs (1.60x / 1.40x) | 42.1 µs (2.71x / 1.84x) |
//! | `record/10_watchers` | 381 µs (1.77x / 1.55x) | 59.3 µs (3.81x / 2.58x) |
//! | `reconcile/200` (a read) | 91.7 µs | 92.2 µs |
//! | `reconcile/5` | 10.7 µs | 10.4 µs |
//!
//! (ratios: to the bare insert, and to the bare insert through `spawn_blocking`, the hand-off
//! every store call pays). SQLite in the same run: 74.4 µs to record (WAL with
//! `synchronous=NORMAL`, which does not fsync each commit), 248 µs for `reconcile/200`.
//!
//! The trade-off: with Immediate one fsync dominates every commit and nothing is ever lost; the
//! bounded mode records faster (8.2x in the run above, 344 against 42.1 µs; 2.6x in the whole
//! run of 12-05 20:52, 260 against 100 µs, on a host whose hand-off to `spawn_blocking` took
//! 20 µs of the bounded floor's 28.4; `benches/README.md` has the runs) and loses at most the
//! last interval on a crash (the crash test kills it 30 times and checks exactly that).
//!
//! What a record costs is the B-tree paths it rewrites. Each is a page-path copy, checksums and
//! a root update at commit, and with Immediate its pages in the fsync; the floor rewrites one
//! path of a one-page tree. A bare redb A/B at the data set's size (direct calls, no store code)
//! gave, with Immediate and with `Durability::None`: events, reference index and heads in three
//! trees 1.7x and 2.3x the floor; the head beside the ref's events in the reference index (two
//! trees, schema 2) 1.6x and 2.1x; one tree alone 1.2x and 1.4x. This crate writes that
//! layout. `record/0_watchers` was 2.45x the direct Immediate floor in the last full run with
//! three trees, and 1.48x to 2.26x in five runs with two (the floor itself moved from 399 to
//! 577 µs between runs); the scale run (1M events, 16 tasks, group commit) went from 6.4k to
//! 8.3k events/s. The price is `sessions_list/500_refs` (500 head lookups), which
//! reads the big reference index instead of a small heads table: 344 µs before, 575 µs after
//! (SQLite: 2.35 ms). With Immediate, a record also pays for where its pages are: strace
//! counts 10 page writes and the header per commit, spread over several MB of the file, where
//! the floor writes 5 within the first 28 KiB of its small file, and on this disk `fdatasync`
//! after 10 scattered 4 KiB writes took 260 µs against 158 µs for 10 adjacent ones (redb puts a
//! commit's pages wherever its allocator finds free ones). The bounded mode stays above 1.5x
//! its floor because its floor is almost all commit overhead, which a second tree doubles; the
//! events-by-sequence tree is required (pruning, `events_after`), and keeping both orders in
//! one tree under tagged keys measured at most 16% faster than two trees (the benches' README
//! has the probe): an event's two entries are two leaves to copy either way. A write buffer
//! (each record into a one-page table, moved into the big trees every 16) measured 1.24x and
//! 1.88x in the same A/B; it was left out because it also speeds up one transaction per event,
//! the baseline group commit is measured against, and moves every read through a merge.
//!
//! Concurrent callers are where the difference is made: group commit (below) shares one
//! transaction, and one fsync, between the recordings that wait for it. 16 tasks recording at
//! once (`record/concurrent_16_tasks`), same run as the table above:
//!
//! | 16 concurrent tasks | Immediate | Bounded |
//! |---|---|---|
//! | group commit (default 64), about 15 events per transaction | 16,300 records/s | 91,100 records/s |
//! | `group_commit(1)` | 2,750 records/s (5.9x less) | |
//!
//! The Immediate ratio was 4.9x and 5.2x in the two full runs before (and 4.6x in a run of
//! 11-30): it sits around the 5x the performance issue asks for, and moves with the disk. A
//! batch of 15 events on as many sessions writes 28-33 scattered pages per fsync against 10
//! for one event, which is why 15 events a commit buy about 5x and not 15x.
//!
//! ## Group commit
//!
//! Recordings that arrive while a write transaction is being committed are queued and share
//! the next one: up to [`RedbOptions::group_commit`] events (default [`DEFAULT_GROUP_COMMIT`])
//! are recorded in order in one transaction, with one commit (one fsync with `Immediate`), and
//! each caller gets its own [`Recorded`] once that commit is done. The protocol is the same as
//! one transaction per event (a dedupe hit within a batch, one sequence spent per call); a lone
//! caller is not delayed (its transaction starts at once) and pays one hand-off to tokio's
//! blocking pool, as before. A caller that is cancelled does not cancel the others' commit.
//! [`RedbStore::write_transactions`] counts the commits, so batching can be observed.
//!
//! Every other write (watch, acknowledge, sweep, each pruning chunk, ...) goes through the same
//! queue and runs alone, in call order with the recordings, on the same drain. A drain that
//! has emptied the queue keeps its blocking thread for 10 ms for the next call before it ends,
//! so a steady load is written by one thread. glibc gives every thread that allocates its own
//! arena and keeps what an arena once held: with a drain per burst on whichever pool thread
//! was free, and pruning on others, the 4M-event scale run of the bounded mode grew to 340 MiB
//! of RSS; with one drain for all writes it stays at 83-84 MiB from 500k events to the end
//! (`Immediate`, 1M events: 49 MiB, flat). Reads run on the blocking pool, in parallel.
//!
//! A batch opens its tables and reads the sequence counter once. An event that fails inside a
//! batch (a corrupt row it reads) aborts the transaction and the batch is recorded again one
//! event per transaction, so the failure reaches only its own caller; a failed commit fails
//! every caller of the batch (each gets its own copy of the error, and nothing is retried,
//! since whether it reached the disk is unknown). `group_commit(1)` is the old behaviour, one
//! transaction per recording. A write or a recording that panics (redb meeting a damaged page,
//! say) fails only its own caller, with the panic's message and the file, and the drain goes
//! on with the rest; redb marks the file for repair, which the next read-write open makes.
//! After an I/O failure or a commit that panicked, which redb keeps refusing writes for until
//! the file is reopened, every later refusal repeats the first failure's cause. Every error after open names the file
//! ([`StoreError::in_store`](awareness_core::StoreError::in_store)).
//!
//! ## Key layout
//!
//! Events by global sequence; a covering `(agent, key, sequence)` index (it holds a copy of the
//! row) so that a reconcile page is one range scan; heads by ref with the pruned watermark, kept
//! in that index as the ref's last entry (sequence `u64::MAX`), next to its newest events, so a
//! record rewrites two B-tree paths, not three (decision 0006; schema 1 files, with a table of
//! heads, are migrated when opened, and schema 2 files, of the same layout, are marked schema 3:
//! see the sequence reservation); cursors by `(watcher, target)` and by `(target, watcher)`;
//! the dedupe index (a deleted or pruned row frees its key); upstream links by `(key, agent)`;
//! and a store-wide sequence counter that never goes back (`max` of a `meta` entry and the
//! highest event, so a record writes three rows: the event, its index entry and the head). A
//! recording opens four tables: the dedupe index only for an event with a dedupe key, the
//! cursors only when the session is watched or a watcher is named. Recording, acknowledging,
//! re-freezing are single write transactions, and so is each pruning chunk of at most 2,000
//! rows (the default; a larger chunk is split into transactions of 2,000). Pruning by age finds
//! the victims of each transaction by scanning the events in sequence order on a read snapshot
//! (old rows are the low sequences, so the scan stops at a full transaction), then deletes them
//! in one write transaction; no recording waits for the scan.
//!
//! ## Processes
//!
//! One `redb::Database` is shared by every [`RedbStore`] opened on the same file in a process.
//! A file already open in another process is refused at once with [`StoreError::Open`]
//! ("another process has it open (a running gateway?): try again once it has exited", of kind
//! [`OpenFailure::InUse`](awareness_core::OpenFailure),
//! which a caller may take as "open again later"); a file that is not a redb database is
//! refused ([`OpenFailure::NotAStore`](awareness_core::OpenFailure)) and left untouched.
//!
//! A file may also be opened read-only ([`RedbOptions::read_only`]), for a process that only
//! inspects it: nothing is created, migrated or written, and every write returns
//! [`StoreError::ReadOnly`]. Read-only handles of several processes share a file. A writer in
//! the default mode and read-only handles exclude each other. A writer opened with
//! [`RedbOptions::live_readers`] lets them in, whether it starts before or after them: they read
//! each of its commits as soon as it is durable, at the price of two-phase commits (see
//! [`RedbOptions::live_readers`] for what they cost) and no [`Durability::Bounded`]. A file
//! whose writer crashed needs a repair, which a read-only open cannot make: it is refused with
//! [`StoreError::NeedsRepair`] until a read-write open repairs it.
//!
//! In one process, a read-write open is refused while a read-only handle on its file lives.
//! Once the last one is dropped, a read that its caller gave up may still be running on the
//! read-only database: a read-write open then waits for it to end rather than refusing, for
//! 10 s at most; a read still running after that is taken to be stuck, and the open is refused
//! with [`StoreError::Open`] naming the file, where waiting longer would hang its caller. Any
//! open waits the same way, with the same bound, for a last handle that is still closing.
//!
//! [redb]: https://docs.rs/redb

mod codec;
mod commit;
mod db;
// Public, hidden, for this crate's own tests, which write damaged rows through it.
#[doc(hidden)]
pub mod raw;
mod tables;
mod upstream;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use awareness_core::reconcile::ChangesPage;
use awareness_core::{
    AckTarget, AgentId, Cursor, CursorFilter, CursorKey, CursorStore, Event, EventStore, Head,
    LogStats, NewEvent, Notice, PruneStep, Recorded, Sequence, SessionKey, SessionRef, StoreError,
    Timestamp, UnreadableCursor, WatcherKey, async_trait, protocol, reconcile, retention,
};
use redb::{ReadTransaction, ReadableTable, ReadableTableMetadata, WriteTransaction};

#[doc(hidden)]
pub use crate::commit::HeldWriter;
use crate::commit::{EndBounded, Writer};
use crate::db::{Ctx, Flusher, Shared};
use crate::tables::{
    CURSORS, CURSORS_BY_TARGET, CursorTables, EVENTS, EVENTS_BY_REF, EventTables, HEAD_SEQ,
    MAX_EVENT_SEQ, UPSTREAM_LINKS,
};

/// How commits reach the disk. See the crate documentation for the trade-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// Every commit is fsynced before it returns: nothing committed is ever lost.
    #[default]
    Immediate,
    /// Commits are made durable in the background every `flush_interval`: a crash loses at most
    /// the commits of the last interval (their sequence numbers are not reused).
    Bounded {
        /// How often pending commits are made durable (above zero).
        flush_interval: Duration,
    },
}

/// Options for [`RedbStore::open_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedbOptions {
    /// How commits reach the disk (default [`Durability::Immediate`]).
    pub durability: Durability,
    /// Create the file when it does not exist (default `true`). When `false`, the open creates
    /// no store at all: a missing file, an empty one, or a redb database without this store's
    /// tables is a [`StoreError::Open`], and no table is created in it.
    pub create_if_missing: bool,
    /// Open the file read-only (default `false`): every write returns
    /// [`StoreError::ReadOnly`], nothing is created, migrated or written, and
    /// [`RedbOptions::durability`], [`RedbOptions::create_if_missing`],
    /// [`RedbOptions::live_readers`] and [`RedbOptions::group_commit`] are ignored. See
    /// [`RedbOptions::read_only`].
    pub read_only: bool,
    /// Let other processes open the file read-only while this handle has it open read-write
    /// (default `false`). See [`RedbOptions::live_readers`].
    pub live_readers: bool,
    /// The most recordings one write transaction holds when several wait to be committed
    /// (default [`DEFAULT_GROUP_COMMIT`]); `1` commits every recording alone. Zero is refused
    /// at open. See [`RedbOptions::group_commit`].
    pub group_commit: usize,
    /// The most memory redb may use to cache pages of the file, in bytes (default
    /// [`DEFAULT_CACHE_SIZE`]). redb's own default is 1 GiB, which a long-running gateway
    /// fills as the file grows; a bound keeps the process's memory flat. Handles of one
    /// process share one database per file: the first to open the file sets it.
    pub cache_size: usize,
}

/// The default of [`RedbOptions::cache_size`]: 64 MiB, which holds every interior page of a
/// store at its 50,000-row cap many times over.
pub const DEFAULT_CACHE_SIZE: usize = 64 * 1024 * 1024;

/// The default of [`RedbOptions::group_commit`]: up to 64 recordings share a write transaction.
pub const DEFAULT_GROUP_COMMIT: usize = 64;

impl Default for RedbOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Immediate,
            create_if_missing: true,
            read_only: false,
            live_readers: false,
            group_commit: DEFAULT_GROUP_COMMIT,
            cache_size: DEFAULT_CACHE_SIZE,
        }
    }
}

impl RedbOptions {
    /// The bounded-loss mode with the given flush interval.
    pub fn bounded(flush_interval: Duration) -> Self {
        Self {
            durability: Durability::Bounded { flush_interval },
            ..Self::default()
        }
    }

    /// Group commit: recordings that arrive while a write transaction is being committed wait
    /// for the next one, and up to `max_events` of them share it (one fsync with
    /// [`Durability::Immediate`]). Each caller still gets its own [`Recorded`] only once the
    /// transaction holding its event is committed, and the protocol is the same as one
    /// transaction per event. A lone caller is never delayed: a transaction starts as soon as
    /// no other is in flight. `1` makes one transaction per recording; `0` is refused at open
    /// ([`StoreError::Open`]). Default [`DEFAULT_GROUP_COMMIT`].
    #[must_use]
    pub fn group_commit(mut self, max_events: usize) -> Self {
        self.group_commit = max_events;
        self
    }

    /// Opens the file read-only, for a process that only inspects it (a CLI's read commands).
    /// Several processes may have a file open read-only at once, and a read-only handle shares
    /// the database this process already has open on the file, in either mode (it then sees
    /// that handle's commits). A file open read-write in another process is refused, unless
    /// that writer lets readers in ([`RedbOptions::live_readers`]); so is a file that needs a
    /// repair (its writer crashed: a read-write open repairs it) or a migration (schema 1).
    /// While the handle is open, another process may open the file read-write only with
    /// `live_readers`, and this process not at all (it keeps one database per file, and a
    /// read-only one cannot write). A read-only handle that shares a read-write handle's
    /// database keeps that database, with its lock, open until it is closed too: until then
    /// the file stays open read-write in this process, as other processes see it.
    #[must_use]
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Lets other processes open the file read-only ([`RedbOptions::read_only`]) while this
    /// handle writes it, and read each commit as soon as it is durable: an operator's tool can
    /// then inspect a running gateway's store. This is redb's `SingleWriter` mode, and it has a
    /// price: every commit is a two-phase commit (redb flushes the file twice, the second time
    /// for its header alone), and non-durable commits are not allowed, so it cannot be combined
    /// with [`Durability::Bounded`] (refused at open). Measured on the development machine on
    /// 12-01 with `Immediate` by a one-off probe (benches/README.md, notes): a recording on a
    /// store of 5,000 events took 1.03-1.29x the time it took in the default mode, and redb's
    /// bare one-key commit 1.23-1.27x. Every read-write handle of a process on one file must ask
    /// for the same; a second writer process is refused either way. Ignored by a read-only
    /// handle, which finds the writer's mode itself.
    #[must_use]
    pub fn live_readers(mut self, live_readers: bool) -> Self {
        self.live_readers = live_readers;
        self
    }

    /// Why the write settings cannot work together, if they cannot.
    fn write_settings_refused(&self) -> Option<&'static str> {
        let bounded = match self.durability {
            Durability::Bounded { flush_interval } if flush_interval.is_zero() => {
                return Some("the flush interval of the bounded durability must be above zero");
            }
            Durability::Bounded { .. } => true,
            Durability::Immediate => false,
        };
        if self.live_readers && bounded {
            return Some(
                "live_readers needs every commit durable: it cannot be combined with the bounded durability",
            );
        }
        (self.group_commit == 0)
            .then_some("group_commit must be at least 1 (1 commits every recording alone)")
    }

    /// Bounds redb's page cache to `bytes` (see [`RedbOptions::cache_size`]). Default
    /// [`DEFAULT_CACHE_SIZE`].
    #[must_use]
    pub fn cache_size(mut self, bytes: usize) -> Self {
        self.cache_size = bytes;
        self
    }
}

/// Session state awareness on one redb file. Every redb call of its methods runs on tokio's
/// blocking pool, so the store must be used inside a tokio runtime: a call made outside one
/// that has to start the writer fails at once with [`StoreError::Backend`] saying so, and
/// leaves the handle as it was (a write queued while the writer, started by a call inside a
/// runtime, is still running or lingering is made by it, and answered).
///
/// Dropping the last handle of a file is the exception: the drop itself stops the flush
/// thread (after a last flush, behind a write in progress) and, when no operation still holds
/// the file, closes it, with an fsync, on the dropping thread. Close the store with
/// [`RedbStore::close`] (or [`EventStore::close`] through a shared handle) to do that on the
/// blocking pool instead.
pub struct RedbStore {
    // Dropped first: commits the writer makes after the handle is gone are durable.
    _end_bounded: EndBounded,
    // Declared next so that it is stopped (after a last flush) before the database is released.
    _flusher: Option<Flusher>,
    /// Counts this handle on its file until it is dropped or closed.
    handle: db::Handle,
    writer: Arc<Writer>,
    durability: Durability,
    group_commit: usize,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.path())
            .field("durability", &self.durability)
            .field("group_commit", &self.group_commit)
            .field("read_only", &self.is_read_only())
            .field("live_readers", &self.live_readers())
            .finish_non_exhaustive()
    }
}

/// The Tokio runtime the caller runs in, where every redb call is handed to the blocking pool;
/// outside one, a clear error instead of `spawn_blocking`'s panic (which, in a recording,
/// would also leave the writer's queue counting a call in flight for good).
pub(crate) fn runtime(what: &str) -> Result<tokio::runtime::Handle, StoreError> {
    tokio::runtime::Handle::try_current().map_err(|e| {
        StoreError::backend(
            format!(
                "{what}: called outside a Tokio runtime (store-redb runs every redb call on Tokio's blocking pool)"
            ),
            e,
        )
    })
}

async fn blocking<T, F>(what: &'static str, f: F) -> Result<T, StoreError>
where
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
    T: Send + 'static,
{
    runtime(what)?
        .spawn_blocking(f)
        .await
        .map_err(|e| StoreError::backend(format!("{what}: blocking task failed"), e))?
}

impl RedbStore {
    /// Opens (creating it when missing) the store at `path` with [`Durability::Immediate`].
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, RedbOptions::default()).await
    }

    /// Opens the store at `path` with `options`. Opening a file this process already has open
    /// shares its database, unless a write failed on it with an I/O error or a commit panicked
    /// (redb then writes nothing more until it is reopened): that open, read-only or not, is refused while other
    /// handles keep it open, and waits for it to close otherwise. A file open in another
    /// process, a file that is not a redb database of this store, or a missing file with
    /// `create_if_missing` off is a [`StoreError::Open`] naming the file, and its data are left
    /// as they were (a file that is not a redb database at all is not written; a read-write
    /// open of another application's redb file, or of a newer schema, lets redb repair it if it
    /// was not closed cleanly and close it again, which writes redb's own bookkeeping). Every
    /// error of an open names the file: one found once redb has opened it keeps its meaning (a
    /// damaged file is
    /// [`StoreError::Corrupt`], its context naming the file), and any other failure is a
    /// [`StoreError::Open`].
    pub async fn open_with(
        path: impl AsRef<Path>,
        options: RedbOptions,
    ) -> Result<Self, StoreError> {
        let path: PathBuf = path.as_ref().to_owned();
        // A read-only handle writes nothing: the write settings are ignored, not checked.
        if !options.read_only
            && let Some(reason) = options.write_settings_refused()
        {
            return Err(StoreError::open(
                path,
                awareness_core::OpenFailure::InvalidOptions,
                reason,
                None,
            ));
        }
        let mode = match (options.read_only, options.create_if_missing) {
            (true, _) => db::Mode::ReadOnly,
            (false, true) => db::Mode::Create,
            (false, false) => db::Mode::Existing,
        };
        let cache = options.cache_size;
        let live = options.live_readers;
        let opening = path.clone();
        // Every error of the open names the file: `open_shared`'s do, and so do these.
        let handle = runtime("open")
            .map_err(|e| db::naming_the_file(&path, e))?
            .spawn_blocking(move || db::open_shared(&opening, mode, cache, live))
            .await
            .map_err(|e| {
                StoreError::open(
                    path.clone(),
                    awareness_core::OpenFailure::Other,
                    format!("the blocking task opening it failed: {e}"),
                    Some(Box::new(e)),
                )
            })??;
        let shared = Arc::clone(handle.shared());
        let flusher = match options.durability {
            Durability::Bounded { flush_interval } if !options.read_only => Some(
                Flusher::start(&shared, flush_interval)
                    .map_err(|e| db::naming_the_file(&path, e))?,
            ),
            _ => None,
        };
        let bounded = matches!(options.durability, Durability::Bounded { .. });
        let writer = Arc::new(Writer::new(
            shared,
            bounded,
            // Never used by a read-only handle, which may carry any value.
            options.group_commit.max(1),
            options.read_only,
        ));
        Ok(Self {
            _end_bounded: writer.end_bounded_on_drop(),
            _flusher: flusher,
            handle,
            writer,
            durability: options.durability,
            group_commit: options.group_commit,
        })
    }

    /// The file's canonical path, as the first open of it in this process spelled it: one file
    /// reached by two paths (a hard link) is one store, whose handles all give the same path.
    pub fn path(&self) -> &Path {
        self.shared().path()
    }

    fn shared(&self) -> &Arc<Shared> {
        self.writer.shared()
    }

    /// Whether this handle was opened read-only ([`RedbOptions::read_only`]).
    pub fn is_read_only(&self) -> bool {
        self.writer.is_read_only()
    }

    /// Whether other processes may read the file while this process writes it
    /// ([`RedbOptions::live_readers`]); `false` for a read-only handle of its own.
    pub fn live_readers(&self) -> bool {
        self.shared().live_readers()
    }

    /// The durability this handle commits with.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The most recordings one write transaction holds ([`RedbOptions::group_commit`]).
    pub fn group_commit(&self) -> usize {
        self.group_commit
    }

    /// The write transactions this handle has committed since it was opened: one per batch of
    /// recordings, one per other write that changed something (a write that changed nothing is
    /// aborted and not counted). The background flushes of [`Durability::Bounded`] are not
    /// counted. Fewer transactions than recordings means group commit batched them.
    pub fn write_transactions(&self) -> u64 {
        self.writer.write_transactions()
    }

    /// The most recordings one write transaction of this handle has held since it was opened
    /// (0 before the first recording): at most [`RedbOptions::group_commit`]. With
    /// [`RedbStore::write_transactions`], shows how well group commit batches.
    pub fn largest_batch(&self) -> usize {
        self.writer.largest_batch()
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any
    /// time): holds this handle's writer until the answer is dropped. The writes given to the
    /// handle meanwhile wait in its queue, in order; once it is dropped, the recordings queued
    /// one after another are committed in one batch (up to [`RedbOptions::group_commit`] of
    /// them). The shared model test holds it while the recordings of a wave queue, so that
    /// each wave reaches the group commit, not only when the scheduler happens to queue them.
    /// A read-only handle refuses it. While the answer lives, every write of the file in this
    /// process waits, and so does closing it (`close` waits for the writer): drop it first.
    #[doc(hidden)]
    pub async fn hold_writer(&self) -> Result<HeldWriter, StoreError> {
        self.writer
            .hold()
            .await
            .map_err(|e| e.in_store(self.path()))
    }

    /// Closes this handle on the blocking pool, without blocking the async runtime's thread.
    /// If it is the last handle on its file in this process, the file is closed and its lock
    /// released when this returns, every commit made durable first (with
    /// [`Durability::Bounded`], a final durable commit, which waits behind any write in
    /// progress). A write whose caller gave up, which this handle's writer finishes on its
    /// own, ends first, and so does a read still running on the file. Dropping the handle does
    /// the same work on the dropping thread (whose last flush also waits behind a write in
    /// progress) without waiting for those two: the file then closes when the last of them
    /// ends. Failures are logged, as dropping would: to know that the last commits are
    /// durable, call [`RedbStore::flush`] first, which answers with its error (a full disk,
    /// say), and close after it.
    pub async fn close(self) {
        let path = self.path().to_owned();
        if let Err(e) = blocking("close", move || {
            self.close_blocking();
            Ok(())
        })
        .await
        {
            tracing::warn!(path = %path.display(), error = %awareness_core::error::ErrorChain(&e), "closing a redb store");
        }
    }

    /// [`RedbStore::close`]'s work. Blocking.
    fn close_blocking(self) {
        let RedbStore {
            _end_bounded: end_bounded,
            _flusher: flusher,
            handle,
            writer,
            ..
        } = self;
        let shared = Arc::clone(writer.shared());
        // The drain of a write whose caller gave up holds the writer until that commit is
        // done (about one commit; a pruning chunk at most).
        let mut writer = writer;
        loop {
            match Arc::try_unwrap(writer) {
                Ok(w) => break drop(w),
                Err(still_shared) => {
                    writer = still_shared;
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            }
        }
        // Stopped once that commit is done, so that its last flush makes it durable too
        // (stopped before it, the commit would wait for another handle's flush or for the
        // file to close).
        drop(end_bounded);
        drop(flusher);
        drop(handle);
        db::release(shared);
    }

    /// Makes every commit made so far durable now (a no-op when nothing is pending, always
    /// with [`Durability::Immediate`], and on a read-only handle, which writes nothing).
    pub async fn flush(&self) -> Result<(), StoreError> {
        if self.is_read_only() {
            return Ok(());
        }
        let shared = Arc::clone(self.shared());
        blocking("flush", move || shared.flush())
            .await
            .map_err(|e| e.in_store(self.path()))
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// deletes one event row and its index entries, and nothing else (no watermark, no head, the
    /// counter stays), as an operator repairing a store by hand would. Returns whether the row
    /// existed. The conformance suite uses it to prove that history gaps come only from pruning.
    #[doc(hidden)]
    pub async fn delete_event_row(&self, sequence: Sequence) -> Result<bool, StoreError> {
        let shared = Arc::clone(self.shared());
        self.write("delete an event row", move |txn| {
            let mut ev = EventTables::open(txn)?;
            let removed = ev.remove(sequence.get())?;
            warn_unreadable(shared.path(), "delete an event row", &ev);
            Ok((removed, removed))
        })
        .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// deletes one session's head and nothing else (its events and the cursors on it stay), as a
    /// hand edit could leave the file. Returns whether the head existed. The conformance suite uses
    /// it to check that pruning never creates a head, and the durable suite to check what the audit
    /// reports.
    #[doc(hidden)]
    pub async fn delete_head_row(&self, session: &SessionRef) -> Result<bool, StoreError> {
        let session = session.clone();
        self.write("delete a head row", move |txn| {
            let removed = tables::remove_head(&mut EventTables::open(txn)?.by_ref, &session)?;
            Ok((removed, removed))
        })
        .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// overwrites one event row, and its copy in the per-session index, with bytes that do not
    /// decode, as a torn write could leave them; its dedupe key stays taken and its head stays.
    /// Returns whether the row existed. The durable suite uses it to check what a recording does on
    /// meeting such a row.
    #[doc(hidden)]
    pub async fn damage_event_row(&self, sequence: Sequence) -> Result<bool, StoreError> {
        self.write("damage an event row", move |txn| {
            let damaged = EventTables::open(txn)?.damage(sequence.get())?;
            Ok((damaged, damaged))
        })
        .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// overwrites one cursor row so that it no longer reads as a cursor (its target agent becomes
    /// empty, which no agent id may be), as a torn write or a hand edit could leave it; its
    /// sequences and its entry in the by-target index stay. Returns whether the row existed. The
    /// durable suite uses it to check that such a row stops nothing that reads many cursors.
    #[doc(hidden)]
    pub async fn damage_cursor_row(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError> {
        let (watcher, target) = (watcher.clone(), target.clone());
        self.write("damage a cursor row", move |txn| {
            let damaged = CursorTables::open(txn)?.rewrite_agent(
                watcher.as_str(),
                target.as_str(),
                |_| Vec::new(),
            )?;
            Ok((damaged, damaged))
        })
        .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// overwrites one upstream link entry so that it no longer reads as a link (its value becomes
    /// bytes that are not JSON), as a torn write or a hand edit could leave it. Returns whether the
    /// entry existed. The durable suite uses it to check that such an entry stops no other link's
    /// monitoring.
    #[doc(hidden)]
    pub async fn damage_link_row(&self, session: &SessionRef) -> Result<bool, StoreError> {
        let session = session.clone();
        self.write("damage an upstream link", move |txn| {
            let key = (session.session_key.as_str(), session.agent_id.as_str());
            let existed = overwrite_entry(txn, tables::UPSTREAM_LINKS, &key, b"{torn")?;
            Ok((existed, existed))
        })
        .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// overwrites the thread id in one upstream link entry with bytes that are not UTF-8 (the entry
    /// is the link's JSON), as a hand edit by a tool that does not check could leave it. Returns
    /// whether the entry existed. The durable suite uses it to check that such an entry is
    /// unreadable alone.
    #[doc(hidden)]
    pub async fn spoil_link_text(&self, session: &SessionRef) -> Result<bool, StoreError> {
        const FIELD: &[u8] = b"\"threadId\":\"";
        let session = session.clone();
        self.write("spoil an upstream link's text", move |txn| {
            let key = (session.session_key.as_str(), session.agent_id.as_str());
            let mut table = txn
                .open_table(tables::UPSTREAM_LINKS)
                .ctx("spoil a link: open its table")?;
            let Some(old) = table
                .get(&key)
                .ctx("spoil a link: read it")?
                .map(|v| v.value().to_vec())
            else {
                return Ok((false, false));
            };
            let at = old
                .windows(FIELD.len())
                .position(|w| w == FIELD)
                .ok_or_else(|| StoreError::corrupt("spoil a link: no threadId in its JSON"))?
                + FIELD.len();
            let mut spoiled = old[..at].to_vec();
            spoiled.push(0xFF);
            spoiled.extend_from_slice(&old[at..]);
            table.insert(&key, spoiled.as_slice()).ctx("spoil a link")?;
            Ok((true, true))
        })
        .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// moves one upstream link entry to the session key `session`'s key followed by a byte that is
    /// not UTF-8 (0xFF), so that the entry no longer answers for `session`; its value stays.
    /// Returns whether the entry existed. The durable suite uses it to check that such an entry
    /// stops no listing of the other links.
    #[doc(hidden)]
    pub async fn spoil_link_key(&self, session: &SessionRef) -> Result<bool, StoreError> {
        let session = session.clone();
        self.write("spoil an upstream link's key", move |txn| {
            let (key, agent) = (
                session.session_key.as_str().as_bytes(),
                session.agent_id.as_str().as_bytes(),
            );
            let spoiled = [key, b"\xFF".as_slice()].concat();
            let moved = move_entry(
                txn,
                tables::UPSTREAM_LINKS_KEYS,
                &raw::pair(key, agent),
                &raw::pair(&spoiled, agent),
            )?;
            Ok((moved, moved))
        })
        .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// answers `false`: a redb cursor row has no room for a provenance (only OpenClaw makes ambient
    /// cursors, and only in its SQLite file). For the conformance suite.
    #[allow(
        clippy::unused_async,
        reason = "async like every row helper the testkit's forwarding awaits"
    )]
    #[doc(hidden)]
    pub async fn make_ambient(&self, _: &WatcherKey, _: &SessionKey) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// answers `false`, as [`RedbStore::make_ambient`] does: a redb cursor row has no room for a
    /// provenance. For the conformance suite.
    #[allow(
        clippy::unused_async,
        reason = "async like every row helper the testkit's forwarding awaits"
    )]
    #[doc(hidden)]
    pub async fn spoil_cursor_provenance(
        &self,
        _: &WatcherKey,
        _: &SessionKey,
    ) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// appends a byte that is not UTF-8 (0xFF) to the target agent of the cursor row `(watcher,
    /// target)`, writing redb's own string type from its bytes as a hand edit or a flipped bit
    /// could; its sequences and its place in every index stay. Returns whether the row existed.
    /// For the durable suite.
    #[doc(hidden)]
    pub async fn spoil_cursor_text(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError> {
        let (watcher, target) = (watcher.clone(), target.clone());
        self.write("spoil a cursor's text", move |txn| {
            let spoiled = CursorTables::open(txn)?.rewrite_agent(
                watcher.as_str(),
                target.as_str(),
                |agent| [agent, b"\xFF".as_slice()].concat(),
            )?;
            Ok((spoiled, spoiled))
        })
        .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// moves the cursor row `(watcher, target)` to the watcher key `watcher` followed by a byte
    /// that is not UTF-8 (0xFF), in the cursors and in the by-target index (where the key is
    /// kept twice), so that the row no longer answers to `watcher`; its value stays. Returns
    /// whether the row existed. For the durable suite.
    #[doc(hidden)]
    pub async fn spoil_cursor_watcher(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError> {
        let (watcher, target) = (watcher.clone(), target.clone());
        self.write("spoil a cursor's watcher key", move |txn| {
            let spoiled =
                CursorTables::open(txn)?.spoil_watcher(watcher.as_str(), target.as_str())?;
            Ok((spoiled, spoiled))
        })
        .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// moves the head entry of `session` to the agent `session`'s agent followed by a byte that is
    /// not UTF-8 (0xFF), so that the entry no longer answers for `session`; its value and the
    /// session's events stay. Returns whether the entry existed. For the durable suite.
    #[doc(hidden)]
    pub async fn spoil_head_text(&self, session: &SessionRef) -> Result<bool, StoreError> {
        let session = session.clone();
        self.write("spoil a head's text", move |txn| {
            let (agent, key) = (
                session.agent_id.as_str().as_bytes(),
                session.session_key.as_str().as_bytes(),
            );
            let spoiled = [agent, b"\xFF".as_slice()].concat();
            let moved = move_entry(
                txn,
                tables::EVENTS_BY_REF_KEYS,
                &raw::by_ref(agent, key, HEAD_SEQ),
                &raw::by_ref(&spoiled, key, HEAD_SEQ),
            )?;
            Ok((moved, moved))
        })
        .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// puts a byte that is not UTF-8 into one event row's session key (the row is this store's own
    /// encoding, which keeps strings as bytes), as a hand edit or a flipped bit could leave it.
    /// Returns whether the row existed. For the durable suite.
    #[doc(hidden)]
    pub async fn spoil_event_text(&self, sequence: Sequence) -> Result<bool, StoreError> {
        self.write("spoil an event's text", move |txn| {
            let spoiled = EventTables::open(txn)?.spoil_key(sequence.get())?;
            Ok((spoiled, spoiled))
        })
        .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// overwrites one head entry so that it no longer reads as a head (bytes of the wrong length),
    /// as a torn write or a hand edit could leave it; the session's events stay. Returns whether
    /// the entry existed. The durable suite uses it to check that such an entry stops no listing of
    /// the other heads.
    #[doc(hidden)]
    pub async fn damage_head_row(&self, session: &SessionRef) -> Result<bool, StoreError> {
        let session = session.clone();
        self.write("damage a head", move |txn| {
            let key = (
                session.agent_id.as_str(),
                session.session_key.as_str(),
                tables::HEAD_SEQ,
            );
            let existed = overwrite_entry(txn, tables::EVENTS_BY_REF, &key, b"torn")?;
            Ok((existed, existed))
        })
        .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// rewrites the closed store at `path` as schema 1 wrote it (heads in a table of their own,
    /// schema version 1), for the tests of what opens and `repair` make of a file an earlier
    /// version wrote. Blocking. Returns how many heads moved.
    #[doc(hidden)]
    pub fn rewrite_as_schema_1(path: &Path) -> Result<u64, StoreError> {
        let db = redb::Database::open(path).ctx("downgrade: open")?;
        let txn = db.begin_write().ctx("downgrade: begin a write")?;
        let moved = tables::downgrade_to_v1(&txn)?;
        txn.commit().ctx("downgrade: commit")?;
        Ok(moved)
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// moves the sequence counter forward so that exactly `left` more sequences can be handed out
    /// (to new events, or to dedupe hits, which consume one too) before it reaches the last number
    /// an event can get (`u64::MAX - 1`), as a damaged file or a hand edit could leave it; touches
    /// nothing else. Returns whether it could: `false` when the counter is already past that point
    /// (it never goes back). The conformance suite uses it to check what recording does once the
    /// counter is at its end.
    #[doc(hidden)]
    pub async fn leave_sequences(&self, left: u64) -> Result<bool, StoreError> {
        self.write("move the sequence counter", move |txn| {
            let Some(at) = tables::MAX_EVENT_SEQ.checked_sub(left) else {
                return Ok((false, false));
            };
            let mut ev = EventTables::open(txn)?;
            if ev.counter()? > at {
                return Ok((false, false));
            }
            ev.consume(at)?;
            Ok((true, true))
        })
        .await
    }

    /// Runs `f` on a read snapshot, on the blocking pool. Its error names the file, as
    /// [`Self::write`]'s and a recording's do ([`StoreError::in_store`]).
    async fn read<T, F>(&self, what: &'static str, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(&ReadTransaction) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        let shared = Arc::clone(self.shared());
        blocking(what, move || {
            let txn = shared.begin_read(what)?;
            f(&txn)
        })
        .await
        .map_err(|e| e.in_store(self.path()))
    }

    /// Runs `f` in one write transaction, on the writer's drain in queue order with the
    /// recordings. `f` returns its result and whether it wrote anything; a transaction that
    /// wrote nothing is aborted instead of committed (no fsync).
    async fn write<T, F>(&self, what: &'static str, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(&WriteTransaction) -> Result<(T, bool), StoreError> + Send + 'static,
        T: Send + 'static,
    {
        self.writer
            .write(what, move |writer| {
                let txn = writer.begin(what)?;
                // On error the transaction is dropped, which aborts it: nothing is written.
                let written = f(&txn).and_then(|(out, wrote)| {
                    if wrote {
                        writer.commit(txn, what)?;
                    } else {
                        txn.abort().ctx(what)?;
                    }
                    Ok(out)
                });
                if let Err(e) = &written {
                    writer.shared().check_after_failure(Some(e));
                }
                written
            })
            .await
            .map_err(|e| e.in_store(self.path()))
    }
}

/// What a recording touches, opened once per write transaction: a group commit's events share
/// them (and the sequence counter, read once).
pub(crate) struct RecordTables<'t> {
    ev: EventTables<'t>,
    cur: CursorTables<'t>,
}

impl<'t> RecordTables<'t> {
    pub(crate) fn open(txn: &'t WriteTransaction) -> Result<Self, StoreError> {
        Ok(Self {
            ev: EventTables::open(txn)?,
            cur: CursorTables::open(txn)?,
        })
    }

    /// See [`EventTables::reserve_ahead`].
    pub(crate) fn reserve_ahead(&mut self) -> Result<bool, StoreError> {
        self.ev.reserve_ahead()
    }
}

/// Records one validated event: the whole per-event protocol. `path`, the store's file, names it
/// in the warnings.
pub(crate) fn record_tx(
    t: &mut RecordTables<'_>,
    mut event: NewEvent,
    now: Timestamp,
    path: &Path,
) -> Result<Recorded, StoreError> {
    // Stands for redb panicking on a damaged page while it records this event.
    #[cfg(test)]
    assert!(
        event.summary != commit::PANICS_IN_TESTS,
        "recording an event panicked"
    );
    let counter = t.ev.counter()?;
    // A counter past the last number (only a damaged file has one) is refused too: adding one
    // to it would overflow, and in a release build wrap round to 0, reusing sequences.
    if counter >= tables::MAX_EVENT_SEQ {
        return Err(StoreError::counter_at_end(
            counter,
            tables::MAX_EVENT_SEQ,
            None,
        ));
    }
    let seq = counter + 1;
    if let Some(key) = &event.dedupe_key {
        let existing =
            t.ev.dedupe()?
                .get(key.as_str().as_bytes())
                .ctx("record: dedupe")?
                .map(|g| g.value());
        if let Some(existing) = existing
            && let Some(stored) = t.ev.get(existing)?
        {
            if stored.dedupe_key.as_deref() != Some(key.as_str()) {
                // Only a damaged file: the index is written with the row it points at.
                return Err(StoreError::corrupt(format!(
                    "dedupe key {key:?} points at event row {existing}, which holds {:?}",
                    stored.dedupe_key
                )));
            }
            // A dedupe hit still consumes its sequence number.
            t.ev.consume(seq)?;
            return Ok(Recorded {
                event: Arc::new(stored),
                deduplicated: true,
                notices: Vec::new(),
            });
        }
    }
    let named = std::mem::take(&mut event.watchers);
    let stored = event.into_event(Sequence(seq), now);
    let existing = t.cur.on_target(stored.session_key.as_str(), path)?;
    let effects = protocol::on_event(&stored, &named, &existing, now);
    t.ev.insert(&stored)?;
    let head = match tables::head_entry(&t.ev.by_ref, &stored.session_ref())? {
        None => protocol::head_after(None, &stored, now),
        Some(Ok(previous)) => protocol::head_after(Some(&previous), &stored, now),
        // A damaged entry stops no recording on its session (decision 0020): the new head
        // says that what came before it is of unknown history.
        Some(Err(e)) => {
            tracing::warn!(path = %path.display(), session_key = %stored.session_key, agent_id = %stored.agent_id, error = %awareness_core::error::ErrorChain(&e), "recording over a head that cannot be read: earlier versions of the session will read as a history gap");
            protocol::head_over_unreadable(&stored, now)
        }
    };
    tables::put_head(&mut t.ev.by_ref, &head)?;
    for c in &effects.upserts {
        t.cur.put(c)?;
    }
    Ok(Recorded {
        event: Arc::new(stored),
        deduplicated: false,
        notices: effects.notices,
    })
}

/// A cursor's key as stored: (watcher, target), bytes.
type CursorKeyBytes = (Vec<u8>, Vec<u8>);

/// Up to `max_rows` cursors with `updated_at < cutoff`, in key order past `after`, their keys
/// as stored. A row cut short, whose age cannot be read, is taken as idle: it holds nothing
/// anyone could be told, and would otherwise be left for good (docs/decisions/0016). A key cut
/// short cannot be named to delete it, and is passed over.
fn idle_cursors(
    txn: &ReadTransaction,
    cutoff: Timestamp,
    max_rows: usize,
    after: Option<&CursorKeyBytes>,
) -> Result<Vec<CursorKeyBytes>, StoreError> {
    use std::ops::Bound;
    let cursors = txn.open_table(CURSORS).ctx("prune: open cursors")?;
    let from = after.map(|(w, t)| raw::pair(w, t));
    let from = match &from {
        Some(key) => Bound::Excluded(key.as_slice()),
        None => Bound::Unbounded,
    };
    let mut out = Vec::new();
    for item in cursors
        .range::<&[u8]>((from, Bound::Unbounded))
        .ctx("prune: scan cursors")?
    {
        if out.len() >= max_rows {
            break;
        }
        let (k, v) = item.ctx("prune: scan cursors")?;
        if is_idle(v.value(), cutoff)
            && let Some((w, t)) = raw::split_pair(k.value())
        {
            out.push((w.to_vec(), t.to_vec()));
        }
    }
    Ok(out)
}

/// Whether the cursor row `row` (its bytes) is idle at `cutoff`: updated before it, or cut short
/// so that its age cannot be read ([`idle_cursors`]).
fn is_idle(row: &[u8], cutoff: Timestamp) -> bool {
    raw::split_cursor_row(row).is_none_or(|v| v.4 < cutoff.millis())
}

/// The lowest sequences (at most `max_rows`) of events older than `cutoff`. A row whose age
/// cannot be read (a damaged file) is skipped with a warning, and the scan goes on: such a row
/// stays until the row cap deletes it in its sequence turn, or its session is deleted.
fn aged_events(
    txn: &ReadTransaction,
    cutoff: Timestamp,
    max_rows: usize,
    path: &Path,
) -> Result<Vec<u64>, StoreError> {
    let events = txn.open_table(EVENTS).ctx("prune: open events")?;
    let mut out = Vec::new();
    for item in events.iter().ctx("prune: scan events")? {
        if out.len() >= max_rows {
            break;
        }
        let (k, v) = item.ctx("prune: scan events")?;
        let seq = k.value();
        match codec::occurred_at(seq, v.value()) {
            Ok(at) if at < cutoff.millis() => out.push(seq),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                path = %path.display(),
                sequence = seq,
                error = %awareness_core::error::ErrorChain(&e),
                "prune: an event row whose age cannot be read is kept by the age step; the row cap deletes it in its turn"
            ),
        }
    }
    Ok(out)
}

/// Logs the rows a write transaction deleted although they cannot be decoded
/// ([`EventTables::unreadable`]), and the keys of the reference index cut short that finding
/// their entries passed over ([`EventTables::cut_keys`]); none on a sound file.
fn warn_unreadable(path: &Path, what: &str, ev: &EventTables<'_>) {
    for key in &ev.cut_keys {
        tracing::warn!(
            path = %path.display(),
            key = ?key,
            "{what}: ignoring an entry of the reference index whose key is cut short"
        );
    }
    for row in &ev.unreadable {
        if row.refs.is_empty() {
            tracing::warn!(
                path = %path.display(),
                sequence = row.seq,
                error = %row.error,
                "{what}: deleting an event row that cannot be read and that no index entry names (no head's watermark to stamp)"
            );
        } else {
            tracing::warn!(
                path = %path.display(),
                sequence = row.seq,
                refs = ?row.refs,
                error = %row.error,
                "{what}: deleting an event row that cannot be read, with the index entry that names it"
            );
        }
    }
}

/// Overwrites the entry of `table` at `key` with `bytes` when there is one (the row helpers
/// that damage a row for the durable suite); whether there was.
fn overwrite_entry<K: redb::Key + 'static>(
    txn: &WriteTransaction,
    table: redb::TableDefinition<'_, K, &'static [u8]>,
    key: &K::SelfType<'_>,
    bytes: &[u8],
) -> Result<bool, StoreError> {
    let mut table = txn.open_table(table).ctx("damage a row: open its table")?;
    let existed = table.get(key).ctx("damage a row: read it")?.is_some();
    if existed {
        table.insert(key, bytes).ctx("damage a row")?;
    }
    Ok(existed)
}

/// Moves the entry of `table` (keys read as their bytes) at `from` to `to`, its value as it
/// was (the helpers that spoil a key for the durable suite); whether there was one.
fn move_entry<K: redb::Key + 'static>(
    txn: &WriteTransaction,
    table: redb::TableDefinition<'_, raw::Bytes<K>, &'static [u8]>,
    from: &[u8],
    to: &[u8],
) -> Result<bool, StoreError> {
    let mut table = txn.open_table(table).ctx("move an entry: open its table")?;
    let Some(row) = table
        .remove(from)
        .ctx("move an entry")?
        .map(|v| v.value().to_vec())
    else {
        return Ok(false);
    };
    table.insert(to, row.as_slice()).ctx("move an entry")?;
    Ok(true)
}

/// Deletes the victims, then stamps the watermarks of their heads at `now`, in one write
/// transaction (one pruning chunk), so no reader sees the one without the other. A victim that
/// cannot be read (its bytes do not decode, or the index of the session it names does not hold
/// it) is deleted in its turn like the others, under the watermark of the session whose index
/// entry names it.
fn prune_events(
    txn: &WriteTransaction,
    victims: &[u64],
    now: Timestamp,
    path: &Path,
) -> Result<u64, StoreError> {
    if victims.is_empty() {
        return Ok(0);
    }
    let mut ev = EventTables::open(txn)?;
    let mut doomed = ev.doomed(victims)?;
    // Deleted first, in the same transaction: the deletion finds the rows their own session's
    // index does not hold, whose watermark goes on the session whose index does.
    let deleted = ev.remove_many(&mut doomed)?;
    let stamps = retention::watermarks(
        doomed
            .iter()
            .filter_map(|d| Some((d.session.as_ref()?, Sequence(d.seq)))),
    );
    for (r, s) in stamps {
        match tables::head_entry(&ev.by_ref, &r)? {
            Some(Ok(h)) => tables::put_head(&mut ev.by_ref, &retention::stamp(&h, s, now))?,
            None => {}
            // A head entry that is no head (decision 0020) gets no stamp and its events go all
            // the same: reading that head fails, so no caller is told its history is whole,
            // and failing instead would fail every pruning pass from then on. (A read that
            // redb itself fails fails the pass.)
            Some(Err(e)) => tracing::warn!(
                path = %path.display(),
                session_key = %r.session_key,
                agent_id = %r.agent_id,
                error = %awareness_core::error::ErrorChain(&e),
                "pruning deletes events of a session whose head cannot be read; no watermark is stamped"
            ),
        }
    }
    warn_unreadable(path, "prune", &ev);
    Ok(deleted)
}

/// One transaction of the row-cap step: deletes the lowest sequences beyond `keep` rows, at
/// most `max_rows`.
fn prune_to_cap(
    txn: &WriteTransaction,
    keep: u64,
    max_rows: usize,
    now: Timestamp,
    path: &Path,
) -> Result<u64, StoreError> {
    let victims: Vec<u64> = {
        let events = txn.open_table(EVENTS).ctx("prune: open events")?;
        let n =
            retention::row_cap_victims(events.len().ctx("prune: count events")?, keep, max_rows);
        events
            .iter()
            .ctx("prune: scan events")?
            .take(n)
            .map(|item| item.map(|(k, _)| k.value()).ctx("prune: scan events"))
            .collect::<Result<_, _>>()?
    };
    prune_events(txn, &victims, now, path)
}

fn delete_session_tx(
    txn: &WriteTransaction,
    session: &SessionRef,
    path: &Path,
) -> Result<bool, StoreError> {
    let mut wrote = false;
    let mut ev = EventTables::open(txn)?;
    let seqs = ev.sequences_of(session)?;
    wrote |= ev.remove_of_session(session, &seqs)?;
    warn_unreadable(path, "delete a session", &ev);
    wrote |= tables::remove_head(&mut ev.by_ref, session)?;
    let (key, agent) = (session.session_key.as_str(), session.agent_id.as_str());
    wrote |= txn
        .open_table(UPSTREAM_LINKS)
        .ctx("delete: open upstream links")?
        .remove((key, agent))
        .ctx("delete: the upstream link")?
        .is_some();
    let mut cur = CursorTables::open(txn)?;
    if session.is_watcher() {
        for t in cur.targets_of(key.as_bytes())? {
            wrote |= cur.remove(key.as_bytes(), &t)?;
        }
    }
    // A row on the key that cannot be read goes too: its agent is unknown, and it could only be
    // left behind for good (decision 0016).
    for w in tables::watchers_of(&cur.by_target, key.as_bytes())? {
        let doomed = match cur.get(&w, key.as_bytes()) {
            Ok(Some(c)) => c.removed_by_delete(session),
            Ok(None) => false,
            Err(StoreError::Corrupt { .. }) => true,
            Err(e) => return Err(e),
        };
        if doomed {
            wrote |= cur.remove(&w, key.as_bytes())?;
        }
    }
    Ok(wrote)
}

#[async_trait]
impl EventStore for RedbStore {
    async fn close(self: Arc<Self>) {
        // Of handles closed at once, exactly one gets the store (`try_unwrap` could fail for
        // each, leaving the close to a drop that blocks the runtime).
        if let Some(store) = Arc::into_inner(self) {
            RedbStore::close(store).await;
        }
    }
    async fn record(&self, event: NewEvent, now: Timestamp) -> Result<Recorded, StoreError> {
        // An invalid event never enters the queue of the group commit.
        event.validate()?;
        self.writer
            .record(event, now)
            .await
            .map_err(|e| e.in_store(self.path()))
    }

    async fn changes_since(
        &self,
        session: &SessionRef,
        after: Sequence,
        limit: usize,
    ) -> Result<ChangesPage, StoreError> {
        let limit = reconcile::clamp_limit(Some(limit));
        let session = session.clone();
        self.read("changes_since", move |txn| {
            let (a, k) = (session.agent_id.as_str(), session.session_key.as_str());
            let index = txn
                .open_table(EVENTS_BY_REF)
                .ctx("reconcile: open the index")?;
            let min = match index
                .range((a, k, 0)..(a, k, HEAD_SEQ))
                .ctx("reconcile")?
                .next()
            {
                Some(item) => Some(Sequence(item.ctx("reconcile")?.0.value().2)),
                None => None,
            };
            // The index is covering: the page is one range scan.
            let mut fetched = Vec::with_capacity(limit + 1);
            if min.is_some() && after.get() < MAX_EVENT_SEQ {
                for item in index
                    .range((a, k, after.get() + 1)..(a, k, HEAD_SEQ))
                    .ctx("reconcile")?
                    .take(limit + 1)
                {
                    let (key, row) = item.ctx("reconcile")?;
                    let seq = key.value().2;
                    fetched.push(Arc::new(codec::decode(seq, row.value(), Some(&session))?));
                }
            }
            let head = tables::read_head(&index, &session)?;
            Ok(reconcile::build_page(
                after,
                head.as_ref(),
                min,
                fetched,
                limit,
            ))
        })
        .await
    }

    async fn heads(&self, sessions: &[SessionRef]) -> Result<Vec<Head>, StoreError> {
        let sessions = sessions.to_vec();
        self.read("heads", move |txn| {
            let index = txn.open_table(EVENTS_BY_REF).ctx("heads: open")?;
            let mut out = Vec::with_capacity(sessions.len());
            for r in awareness_core::store::distinct_refs(&sessions) {
                if let Some(h) = tables::read_head(&index, r)? {
                    out.push(h);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn list_heads(&self, agent: Option<&AgentId>) -> Result<Vec<Head>, StoreError> {
        let agent = agent.cloned();
        let shared = Arc::clone(self.shared());
        self.read("list_heads", move |txn| {
            let index = txn
                .open_table(tables::EVENTS_BY_REF_KEYS)
                .ctx("list_heads: open")?;
            tables::list_heads(&index, agent.as_ref().map(AgentId::as_str), shared.path())
        })
        .await
    }

    async fn events_after(
        &self,
        after: Sequence,
        limit: usize,
    ) -> Result<Vec<Arc<Event>>, StoreError> {
        self.read("events_after", move |txn| {
            let events = txn.open_table(EVENTS).ctx("events_after: open")?;
            let mut out = Vec::new();
            if after.get() == u64::MAX {
                return Ok(out);
            }
            for item in events
                .range(after.get() + 1..)
                .ctx("events_after")?
                .take(limit)
            {
                let (k, v) = item.ctx("events_after")?;
                out.push(Arc::new(codec::decode(k.value(), v.value(), None)?));
            }
            Ok(out)
        })
        .await
    }

    async fn log_stats(&self) -> Result<LogStats, StoreError> {
        self.read("log_stats", |txn| {
            let events = txn.open_table(EVENTS).ctx("log_stats: open")?;
            let first = events.first().ctx("log_stats")?.map(|(k, _)| k.value());
            let last = events.last().ctx("log_stats")?.map(|(k, _)| k.value());
            Ok(LogStats {
                rows: events.len().ctx("log_stats")?,
                min_sequence: Sequence(first.unwrap_or_default()),
                max_sequence: Sequence(last.unwrap_or_default()),
            })
        })
        .await
    }

    async fn prune_chunk(
        &self,
        step: &PruneStep,
        max_rows: usize,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        // A read-only handle refuses even a chunk with nothing to delete.
        self.writer.refuse("prune")?;
        // A chunk larger than one transaction may hold (a policy's `chunk_rows` is the
        // operator's) is several transactions, so that a recording never waits behind more
        // than one of them.
        match *step {
            // Finding old rows scans the log in sequence order (old rows are the low sequences,
            // so a chunk usually stops after about its own size; a pass with nothing to delete
            // reads every row). It runs on a read snapshot, so recording never waits for it;
            // the write transaction then only deletes. Sequences only grow, so no row older
            // than a candidate can appear after the snapshot: the chunk is still the lowest
            // sequences.
            PruneStep::Age { cutoff } => {
                retention::in_transactions(max_rows, PRUNE_TX_ROWS, |bound| {
                    self.age_round(cutoff, bound, now)
                })
                .await
            }
            PruneStep::RowCap { max_rows: keep } => {
                retention::in_transactions(max_rows, PRUNE_TX_ROWS, |bound| {
                    self.cap_round(keep, bound, now)
                })
                .await
            }
            PruneStep::Cursors { cutoff } => {
                // Each round goes on in key order from where the one before stopped.
                let after = std::sync::Mutex::new(None);
                let after = &after;
                retention::in_transactions(max_rows, PRUNE_TX_ROWS, |bound| async move {
                    let from = crate::db::lock(after).take();
                    let (chosen, deleted, last) = self.idle_round(cutoff, bound, from).await?;
                    *crate::db::lock(after) = last;
                    Ok((chosen, deleted))
                })
                .await
            }
        }
    }

    async fn delete_session(&self, session: &SessionRef) -> Result<(), StoreError> {
        let session = session.clone();
        let shared = Arc::clone(self.shared());
        self.write("delete a session", move |txn| {
            Ok(((), delete_session_tx(txn, &session, shared.path())?))
        })
        .await
    }
}

impl RedbStore {
    /// One transaction of the row-cap step, which chooses inside it (the lowest sequences:
    /// the first rows it reads); answers (chosen, deleted), the same number.
    async fn cap_round(
        &self,
        keep: u64,
        max_rows: usize,
        now: Timestamp,
    ) -> Result<(usize, u64), StoreError> {
        // The file's path is for the warnings about rows that cannot be decoded.
        let shared = Arc::clone(self.shared());
        let deleted = self
            .write("prune", move |txn| {
                let n = prune_to_cap(txn, keep, max_rows, now, shared.path())?;
                Ok((n, n > 0))
            })
            .await?;
        Ok((usize::try_from(deleted).unwrap_or(usize::MAX), deleted))
    }

    /// One round of the idle-cursor step: chooses up to `want` cursors with `updated_at <
    /// cutoff` on a read snapshot, in key order past `after` (finding them reads every cursor
    /// that is not idle, which recordings must not wait for), then deletes those still idle in
    /// one write transaction; answers (chosen, deleted, the last key chosen). A cursor created
    /// behind that key during the chunk waits for the next pass.
    async fn idle_round(
        &self,
        cutoff: Timestamp,
        want: usize,
        after: Option<CursorKeyBytes>,
    ) -> Result<(usize, u64, Option<CursorKeyBytes>), StoreError> {
        let chosen = self
            .read("prune: find idle cursors", move |txn| {
                idle_cursors(txn, cutoff, want, after.as_ref())
            })
            .await?;
        let Some(last) = chosen.last().cloned() else {
            return Ok((0, 0, None));
        };
        #[cfg(test)]
        tests::BETWEEN_CHOICE_AND_DELETE.at(self.path()).await;
        let n = chosen.len();
        let deleted = self
            .write("prune", move |txn| {
                let mut cur = CursorTables::open(txn)?;
                let mut deleted = 0;
                for (w, t) in &chosen {
                    // Touched since the choice: no longer idle, it stays.
                    let idle = cur
                        .cursors()?
                        .get(raw::pair(w, t).as_slice())
                        .ctx("prune: read a cursor")?
                        .is_some_and(|row| is_idle(row.value(), cutoff));
                    if idle && cur.remove(w, t)? {
                        deleted += 1;
                    }
                }
                Ok((deleted, deleted > 0))
            })
            .await?;
        Ok((n, deleted, Some(last)))
    }

    /// One round of the age step: chooses up to `want` old rows on a read snapshot, then
    /// deletes those still there in one write transaction; answers (chosen, deleted).
    async fn age_round(
        &self,
        cutoff: Timestamp,
        want: usize,
        now: Timestamp,
    ) -> Result<(usize, u64), StoreError> {
        let shared = Arc::clone(self.shared());
        let path = Arc::clone(&shared);
        let aged = self
            .read("prune: find old events", move |txn| {
                aged_events(txn, cutoff, want, path.path())
            })
            .await?;
        let chosen = aged.len();
        if chosen == 0 {
            return Ok((0, 0));
        }
        // Test-only: where a unit test deletes a chosen row before the write (stop 69, RU31).
        #[cfg(test)]
        tests::BETWEEN_AGE_CHOICE_AND_DELETE.at(self.path()).await;
        let deleted = self
            .write("prune", move |txn| {
                // Rows are immutable, so a victim still present still qualifies.
                let n = prune_events(txn, &aged, now, shared.path())?;
                Ok((n, n > 0))
            })
            .await?;
        Ok((chosen, deleted))
    }
}

#[async_trait]
impl CursorStore for RedbStore {
    async fn watch(
        &self,
        watcher: &WatcherKey,
        target: &SessionRef,
        now: Timestamp,
    ) -> Result<Cursor, StoreError> {
        protocol::check_watch(watcher.session_key(), &target.session_key)?;
        let (watcher, target) = (watcher.clone(), target.clone());
        let shared = Arc::clone(self.shared());
        self.write("watch", move |txn| {
            let mut cur = CursorTables::open(txn)?;
            // A row that cannot be read is watched over as if there were none (decision 0016).
            let existing = match cur.get(
                watcher.as_str().as_bytes(),
                target.session_key.as_str().as_bytes(),
            ) {
                Err(e @ StoreError::Corrupt { .. }) => {
                    tracing::warn!(path = %shared.path().display(), watcher = %watcher, target = %target.session_key, agent_id = %target.agent_id, error = %awareness_core::error::ErrorChain(&e), "replacing a watch cursor that cannot be read");
                    None
                }
                other => other?,
            };
            let head = {
                let index = txn.open_table(EVENTS_BY_REF).ctx("watch: open heads")?;
                tables::read_head(&index, &target)?.map_or(Sequence::ZERO, |h| h.last_sequence)
            };
            let (cursor, write) = protocol::watch(existing.as_ref(), &watcher, &target, head, now);
            if write {
                cur.put(&cursor)?;
            }
            Ok((cursor, write))
        })
        .await
    }

    async fn unwatch(&self, watcher: &WatcherKey, target: &SessionKey) -> Result<bool, StoreError> {
        let (watcher, target) = (watcher.clone(), target.clone());
        self.write("unwatch", move |txn| {
            let removed = CursorTables::open(txn)?
                .remove(watcher.as_str().as_bytes(), target.as_str().as_bytes())?;
            Ok((removed, removed))
        })
        .await
    }

    async fn acknowledge(
        &self,
        watcher: &WatcherKey,
        targets: &[AckTarget],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        // Nothing to acknowledge: answered at once, without queueing behind the writer (a
        // read-only handle still refuses it, as it does every write).
        if targets.is_empty() {
            self.writer.refuse("acknowledge")?;
            return Ok(Vec::new());
        }
        let (watcher, targets) = (watcher.clone(), targets.to_vec());
        let shared = Arc::clone(self.shared());
        self.write("acknowledge", move |txn| {
            let mut cur = CursorTables::open(txn)?;
            let mut notices = Vec::new();
            let mut wrote = false;
            for t in AckTarget::each_once(&targets) {
                let Some(c) = cur.get_readable(
                    watcher.as_str().as_bytes(),
                    t.target.as_str().as_bytes(),
                    shared.path(),
                )?
                else {
                    continue;
                };
                let (write, follow) = t.apply(&c, now);
                if let Some(c) = write {
                    cur.put(&c)?;
                    wrote = true;
                }
                notices.extend(follow);
            }
            Ok((notices, wrote))
        })
        .await
    }

    async fn cursor(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<Option<Cursor>, StoreError> {
        let (watcher, target) = (watcher.clone(), target.clone());
        self.read("cursor", move |txn| {
            let cursors = txn.open_table(CURSORS).ctx("cursor: open")?;
            let (w, t) = (watcher.as_str().as_bytes(), target.as_str().as_bytes());
            match cursors.get(raw::pair(w, t).as_slice()).ctx("cursor")? {
                Some(v) => tables::cursor_of(w, t, v.value()).map(Some),
                None => Ok(None),
            }
        })
        .await
    }

    async fn cursors(&self, filter: &CursorFilter) -> Result<Vec<Cursor>, StoreError> {
        let filter = filter.clone();
        let shared = Arc::clone(self.shared());
        self.read("cursors", move |txn| {
            let path = shared.path();
            let cursors = txn.open_table(CURSORS).ctx("cursors: open")?;
            let mut out = Vec::new();
            if let (None, Some(t)) = (&filter.watcher, &filter.target) {
                let by_target = txn
                    .open_table(CURSORS_BY_TARGET)
                    .ctx("cursors: open the target index")?;
                let t = t.as_str().as_bytes();
                for w in tables::watchers_of(&by_target, t)? {
                    if let Some(v) = cursors.get(raw::pair(&w, t).as_slice()).ctx("cursors")? {
                        out.extend(tables::readable_cursor(&w, t, v.value(), path));
                    }
                }
            } else {
                let start = filter.watcher.as_ref().map_or("", SessionKey::as_str);
                let from = raw::pair(start.as_bytes(), b"");
                for item in cursors.range(from.as_slice()..).ctx("cursors")? {
                    let (k, v) = item.ctx("cursors")?;
                    // A key cut short names no cursor to list (`unreadable_cursors` names it).
                    let Some((w, t)) = raw::split_pair(k.value()) else {
                        continue;
                    };
                    if filter
                        .watcher
                        .as_ref()
                        .is_some_and(|x| x.as_str().as_bytes() != w)
                    {
                        break;
                    }
                    let v = v.value();
                    // Not pending: left out before its keys are parsed (a row cut short is
                    // read, and left out with its warning).
                    if filter.pending_only
                        && raw::split_cursor_row(v)
                            .is_some_and(|v| !Cursor::pending(Sequence(v.1), Sequence(v.3)))
                    {
                        continue;
                    }
                    out.extend(tables::readable_cursor(w, t, v, path));
                }
            }
            out.retain(|c| filter.matches(c));
            Ok(out)
        })
        .await
    }

    async fn unreadable_cursors(&self) -> Result<Vec<UnreadableCursor>, StoreError> {
        self.read("unreadable_cursors", move |txn| {
            let cursors = txn.open_table(CURSORS).ctx("cursors: open")?;
            let mut out = Vec::new();
            for item in cursors.iter().ctx("cursors")? {
                let (k, v) = item.ctx("cursors")?;
                let checked = match raw::split_pair(k.value()) {
                    Some((w, t)) => tables::cursor_of(w, t, v.value()).err().map(|e| (w, t, e)),
                    None => Some((
                        k.value(),
                        b"".as_slice(),
                        StoreError::corrupt(format!(
                            "cursor key of {} bytes is cut short",
                            k.value().len()
                        )),
                    )),
                };
                if let Some((w, t, e)) = checked {
                    out.push(UnreadableCursor {
                        watcher: String::from_utf8_lossy(w).into_owned(),
                        target: String::from_utf8_lossy(t).into_owned(),
                        reason: e.to_string(),
                    });
                }
            }
            Ok(out)
        })
        .await
    }

    async fn refreeze(
        &self,
        keys: &[CursorKey],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        let keys = keys.to_vec();
        let shared = Arc::clone(self.shared());
        self.write("re-freeze cursors", move |txn| {
            let mut cur = CursorTables::open(txn)?;
            let mut notices = Vec::new();
            let mut wrote = false;
            for k in protocol::each_once(&keys) {
                let Some(c) = cur.get_readable(
                    k.watcher.as_str().as_bytes(),
                    k.target.as_str().as_bytes(),
                    shared.path(),
                )?
                else {
                    continue;
                };
                if let Some((write, n)) = protocol::refreeze(&c, now) {
                    if let Some(frozen) = write {
                        cur.put(&frozen)?;
                        wrote = true;
                    }
                    notices.push(n);
                }
            }
            Ok((notices, wrote))
        })
        .await
    }

    async fn reset_watcher(&self, watcher: &SessionKey) -> Result<u64, StoreError> {
        let watcher = watcher.clone();
        self.write("reset a watcher", move |txn| {
            let mut cur = CursorTables::open(txn)?;
            let mut n = 0;
            for t in cur.targets_of(watcher.as_str().as_bytes())? {
                if cur.remove(watcher.as_str().as_bytes(), &t)? {
                    n += 1;
                }
            }
            Ok((n, n > 0))
        })
        .await
    }
}

/// The most rows one pruning transaction deletes: the default chunk (2,000), so a policy's
/// larger `chunk_rows` is split rather than held in one transaction.
const PRUNE_TX_ROWS: usize = 2_000;

#[cfg(test)]
mod tests {
    use super::*;
    use awareness_core::{ActorType, EventKind};

    const T0: Timestamp = Timestamp(1_800_000_000_000);

    /// Between an idle-cursor round's choice and its write.
    pub(super) static BETWEEN_CHOICE_AND_DELETE: awareness_core::testkit::pause::Pause =
        awareness_core::testkit::pause::Pause::new();
    /// Where the age step holds between its choice and its write (test-only; stop 69, RU31).
    pub(super) static BETWEEN_AGE_CHOICE_AND_DELETE: awareness_core::testkit::pause::Pause =
        awareness_core::testkit::pause::Pause::new();

    /// A cursor touched between an idle-cursor round's choice (on a read snapshot) and its
    /// write is no longer idle and stays; the other one chosen goes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cursor_touched_after_the_idle_choice_is_not_pruned() {
        let (_dir, store) = fresh().await;
        let path = store.path().to_owned();
        awareness_core::testkit::pause::a_cursor_touched_after_the_idle_choice_is_not_pruned(
            Arc::new(store),
            &BETWEEN_CHOICE_AND_DELETE,
            &path,
        )
        .await;
    }

    fn session(key: &str) -> SessionRef {
        SessionRef::parse(key, "main").expect("a session ref")
    }

    fn event(at: &SessionRef, dedupe_key: Option<&str>) -> NewEvent {
        let e = NewEvent::new(at.clone(), EventKind::Compacted, ActorType::System, "x");
        match dedupe_key {
            Some(k) => e.with_dedupe_key(k),
            None => e,
        }
    }

    /// Records one event on `at` for each dedupe key, in order.
    async fn record_keyed(store: &RedbStore, at: &SessionRef, keys: &[&str]) {
        for k in keys {
            store.record(event(at, Some(k)), T0).await.expect("record");
        }
    }

    /// A new store in a directory of its own (dropped with it).
    async fn fresh() -> (tempfile::TempDir, RedbStore) {
        let dir = tempfile::tempdir().expect("dir");
        let store = RedbStore::open(dir.path().join("state.redb"))
            .await
            .expect("open");
        (dir, store)
    }

    /// A pruning chunk larger than [`PRUNE_TX_ROWS`] (2,000) is split into transactions of at
    /// most that many rows, by the row cap and by age, so a recording never waits behind a
    /// whole large chunk (the shared check store-sqlite runs with its bound too).
    #[tokio::test]
    async fn a_large_pruning_chunk_is_split_into_transactions() {
        let (_dir, store) = fresh().await;
        awareness_core::testkit::checks::a_pruning_chunk_commits_at_most_its_bound_at_a_time(
            &store,
            2_000,
            || store.write_transactions(),
        )
        .await;
    }

    /// Re-freezing a cursor already frozen at its notice (a second start-up sweep) re-delivers
    /// the notice and commits nothing (decision 0002): no fsync, no write transaction counted.
    #[tokio::test]
    async fn a_refreeze_of_a_frozen_cursor_commits_nothing() {
        let (_dir, store) = fresh().await;
        let target = session("agent:main:subagent:child");
        let watcher = WatcherKey::parse("agent:main:main").expect("watcher");
        store.watch(&watcher, &target, T0).await.expect("watch");
        let human = NewEvent::new(
            target.clone(),
            EventKind::HumanDirectMessage,
            ActorType::Human,
            "typed into the child",
        );
        let told = store.record(human, T0).await.expect("record");
        assert_eq!(told.notices.len(), 1);
        let key = CursorKey {
            watcher,
            target: target.session_key.clone(),
        };
        let before = store.write_transactions();
        let again = store
            .refreeze(std::slice::from_ref(&key), T0.plus_ms(1))
            .await
            .expect("refreeze");
        assert_eq!(again, told.notices, "re-delivered");
        assert_eq!(store.write_transactions(), before, "nothing committed");
        // Nor does watching it again within a day (decision 0018).
        store
            .watch(&key.watcher, &target, T0.plus_ms(2))
            .await
            .expect("watch again");
        assert_eq!(store.write_transactions(), before, "a watch within a day");
    }

    /// A row-cap chunk on a log within its cap deletes nothing and commits nothing: no fsync,
    /// no write transaction counted, however often the pruning pass runs.
    /// (What the mutation did: a row-cap round committed even when it deleted no row; review of
    /// stop 66, R532.)
    #[tokio::test]
    async fn a_row_cap_chunk_within_the_cap_commits_nothing() {
        let (_dir, store) = fresh().await;
        let at = session("agent:main:subagent:child");
        record_keyed(&store, &at, &["a", "b"]).await;
        let before = store.write_transactions();
        let deleted = store
            .prune_chunk(&PruneStep::RowCap { max_rows: 2 }, 100, T0.plus_ms(1))
            .await
            .expect("prune");
        assert_eq!(deleted, 0);
        assert_eq!(
            store.write_transactions(),
            before,
            "a row-cap chunk that deleted nothing committed a transaction"
        );
    }

    /// Writes that change nothing commit nothing: no fsync, no write transaction counted. An
    /// unwatch of a target not watched, an acknowledgement of a target without a cursor, a
    /// deletion of a session the store does not hold, a reset of a watcher that watches nothing;
    /// a reset that removes a cursor commits one. (What the mutations did: each committed its
    /// transaction whatever it changed: a reset, review of stop 71, RI03; `unwatch`,
    /// `acknowledge` and `delete_session`, review of stop 72, RK22, RK23, RK25.)
    #[tokio::test]
    async fn writes_that_change_nothing_commit_nothing() {
        let (_dir, store) = fresh().await;
        let at = session("agent:main:subagent:child");
        record_keyed(&store, &at, &["a"]).await;
        let watcher = WatcherKey::parse("agent:main:main").expect("a watcher");
        let before = store.write_transactions();
        assert!(
            !store
                .unwatch(&watcher, &at.session_key)
                .await
                .expect("unwatch")
        );
        assert_eq!(store.write_transactions(), before, "an unwatch of nothing");
        let told = store
            .acknowledge(&watcher, &[AckTarget::any(at.session_key.clone())], T0)
            .await
            .expect("acknowledge");
        assert!(told.is_empty(), "{told:?}");
        assert_eq!(
            store.write_transactions(),
            before,
            "an acknowledgement of no cursor"
        );
        store
            .delete_session(&session("agent:main:subagent:unknown"))
            .await
            .expect("delete");
        assert_eq!(store.write_transactions(), before, "a deletion of nothing");
        // First watching nothing, then one cursor: the reset removes as many, and commits
        // only when it removed one.
        for cursors in [0, 1] {
            if cursors == 1 {
                store.watch(&watcher, &at, T0).await.expect("watch");
            }
            let before = store.write_transactions();
            let removed = store
                .reset_watcher(watcher.session_key())
                .await
                .expect("reset");
            assert_eq!(removed, cursors);
            assert_eq!(
                store.write_transactions(),
                before + cursors,
                "a reset that removed {cursors} cursors committed as many transactions"
            );
        }
    }

    /// An old row the age step chose on its snapshot and that is gone by its write (its session
    /// deleted in between) is not counted and ends no chunk: the chunk goes on by what its round
    /// chose, so the old row past the round's bound goes in the same chunk.
    /// (What the mutations did: the age round answered what its write deleted as what it chose,
    /// which ended the chunk at the gone row, RU31; `prune_events` answered the victims it was
    /// handed, RU22; review of stop 69.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_old_row_gone_after_the_age_choice_is_not_counted_and_ends_no_chunk() {
        let (_dir, store) = fresh().await;
        let store = Arc::new(store);
        let (at, gone) = (
            session("agent:main:subagent:child"),
            session("agent:main:subagent:gone"),
        );
        for s in [&at, &at, &gone, &at] {
            store.record(event(s, None), T0).await.expect("record");
        }
        store
            .record(event(&at, None), T0.plus_ms(10))
            .await
            .expect("record a young row");
        let (chosen, go) = BETWEEN_AGE_CHOICE_AND_DELETE.arm(store.path());
        let pruning = tokio::spawn({
            let store = Arc::clone(&store);
            async move {
                // A round of three: the first chooses sequences 1, 2 and 3.
                let step = PruneStep::Age {
                    cutoff: T0.plus_ms(1),
                };
                store.prune_chunk(&step, 3, T0.plus_ms(20)).await
            }
        });
        chosen.notified().await;
        store.delete_session(&gone).await.expect("delete");
        BETWEEN_AGE_CHOICE_AND_DELETE.disarm();
        go.notify_one();
        assert_eq!(
            pruning.await.expect("task").expect("prune"),
            3,
            "1 and 2, then 4 past the first round's bound; not 3, gone before the write"
        );
        let left: Vec<u64> = store
            .events_after(Sequence::ZERO, 10)
            .await
            .expect("events")
            .iter()
            .map(|e| e.sequence.get())
            .collect();
        assert_eq!(
            left,
            [5],
            "the old row past the first round's bound was left for another pass"
        );
    }

    /// The dedupe index (key, sequence), and the sequences of `at` in the reference index
    /// (its head's `u64::MAX` included), as the file holds them.
    async fn raw_indexes(store: &RedbStore, at: &SessionRef) -> (Vec<(String, u64)>, Vec<u64>) {
        let at = at.clone();
        store
            .read("test", move |txn| {
                let dedupe = txn.open_table(tables::DEDUPE).ctx("test")?;
                let mut keys = Vec::new();
                for item in dedupe.iter().ctx("test")? {
                    let (k, v) = item.ctx("test")?;
                    keys.push((k.value().to_owned(), v.value()));
                }
                let index = txn.open_table(EVENTS_BY_REF).ctx("test")?;
                let (a, k) = (at.agent_id.as_str(), at.session_key.as_str());
                let mut seqs = Vec::new();
                for item in index.range((a, k, 0)..=(a, k, HEAD_SEQ)).ctx("test")? {
                    seqs.push(item.ctx("test")?.0.value().2);
                }
                Ok((keys, seqs))
            })
            .await
            .expect("read the indexes")
    }

    /// The row cap deletes rows it cannot decode in their turn with their index entries, frees
    /// the dedupe keys that point at them (found by a scan, since the rows cannot tell them)
    /// and no other, and stamps their session's watermark over them.
    #[tokio::test]
    async fn the_row_cap_deletes_unreadable_rows_with_their_index_entries_and_dedupe_keys() {
        let (_dir, store) = fresh().await;
        let (child, other) = (session("agent:main:child"), session("agent:main:other"));
        record_keyed(&store, &child, &["k1", "k2", "k3"]).await;
        record_keyed(&store, &other, &["k4"]).await;
        for seq in [1, 3] {
            assert!(store.damage_event_row(Sequence(seq)).await.expect("damage"));
        }
        let step = PruneStep::RowCap { max_rows: 1 };
        assert_eq!(store.prune_chunk(&step, 100, T0).await.expect("prune"), 3);
        let (keys, child_seqs) = raw_indexes(&store, &child).await;
        assert_eq!(keys, [("k4".to_owned(), 4)], "the dedupe index");
        assert_eq!(
            child_seqs,
            [HEAD_SEQ],
            "the child's index entries: its head alone"
        );
        let head = store
            .heads(std::slice::from_ref(&child))
            .await
            .expect("heads");
        assert_eq!(head[0].pruned_max_sequence, Sequence(3));
        assert_eq!(head[0].last_sequence, Sequence(3));
        let again = store
            .record(event(&child, Some("k1")), T0)
            .await
            .expect("record");
        assert!(!again.deduplicated, "k1 was freed");
        assert_eq!(again.event.sequence, Sequence(5));
        store.close().await;
    }

    /// A row that cannot be read and that two entries of the reference index name (a hand edit)
    /// is one row: the pruning pass deletes it under both entries' sessions and counts it once.
    /// (What the mutation did: the pass counted one deleted row per entry naming it, so it
    /// reported two; review of stop 69, RE14.)
    #[tokio::test]
    async fn an_unreadable_row_two_index_entries_name_is_counted_once() {
        let (_dir, store) = fresh().await;
        let (child, other) = (session("agent:main:child"), session("agent:main:other"));
        record_keyed(&store, &child, &["k1", "k2", "k3"]).await;
        record_keyed(&store, &other, &["k4"]).await;
        store
            .write("test", |txn| {
                txn.open_table(tables::EVENTS_BY_REF_KEYS)
                    .ctx("test")?
                    .insert(
                        raw::by_ref(b"main", b"agent:main:other", 1).as_slice(),
                        b"torn".as_slice(),
                    )
                    .ctx("test")?;
                Ok(((), true))
            })
            .await
            .expect("a second entry for row 1");
        assert!(store.damage_event_row(Sequence(1)).await.expect("damage"));
        let step = PruneStep::RowCap { max_rows: 3 };
        assert_eq!(
            store.prune_chunk(&step, 100, T0).await.expect("prune"),
            1,
            "one row deleted"
        );
        let (_, other_seqs) = raw_indexes(&store, &other).await;
        assert_eq!(
            other_seqs,
            [4, HEAD_SEQ],
            "the second entry went with the row"
        );
        store.close().await;
    }

    /// A dedupe key whose text is not UTF-8 (a hand edit) stops no pruning of a row that cannot
    /// be read: the scan of the dedupe index for that row's key reads the keys as bytes, frees
    /// the one pointing at the row and keeps the others, that one too. Before, redb's decode of
    /// the key panicked and failed every pass that deleted such a row.
    #[tokio::test]
    async fn a_dedupe_key_that_is_not_utf8_stops_no_pruning_of_an_unreadable_row() {
        let (_dir, store) = fresh().await;
        let (child, other) = (session("agent:main:child"), session("agent:main:other"));
        record_keyed(&store, &child, &["k1", "k2"]).await;
        record_keyed(&store, &other, &["k3"]).await;
        store
            .write("test", |txn| {
                let mut dedupe = txn.open_table(tables::DEDUPE_KEYS).ctx("test")?;
                let seq = dedupe
                    .remove(b"k3".as_slice())
                    .ctx("test")?
                    .expect("k3")
                    .value();
                dedupe.insert(b"k3\xFF".as_slice(), seq).ctx("test")?;
                Ok(((), true))
            })
            .await
            .expect("spoil a dedupe key");
        assert!(store.damage_event_row(Sequence(1)).await.expect("damage"));
        let step = PruneStep::RowCap { max_rows: 1 };
        assert_eq!(store.prune_chunk(&step, 100, T0).await.expect("prune"), 2);
        let keys = store
            .read("test", |txn| {
                let dedupe = txn.open_table(tables::DEDUPE_KEYS).ctx("test")?;
                let mut keys = Vec::new();
                for item in dedupe.iter().ctx("test")? {
                    let (k, v) = item.ctx("test")?;
                    keys.push((k.value().to_vec(), v.value()));
                }
                Ok(keys)
            })
            .await
            .expect("read the dedupe index");
        assert_eq!(keys, [(b"k3\xFF".to_vec(), 3)]);
        store.close().await;
    }

    /// A schema 1 file whose `heads` table holds a key that is not UTF-8 (a hand edit) opens:
    /// the migration moves that head as its bytes, and the listing of heads then leaves it out
    /// (decision 0020) and lists the others. Before, redb's decode of the key panicked in the
    /// migration, so the file could not be opened at all.
    #[tokio::test]
    async fn a_schema_1_head_whose_key_is_not_utf8_is_migrated_and_left_out() {
        let (dir, store) = fresh().await;
        let path = dir.path().join("state.redb");
        let (kept, spoiled) = (session("agent:main:kept"), session("agent:main:spoiled"));
        for at in [&kept, &spoiled] {
            store.record(event(at, None), T0).await.expect("record");
        }
        store.close().await;
        assert_eq!(RedbStore::rewrite_as_schema_1(&path).expect("downgrade"), 2);
        let db = redb::Database::open(&path).expect("open the file");
        let txn = db.begin_write().expect("begin a write");
        {
            let mut heads = txn
                .open_table(tables::HEADS_V1_KEYS)
                .expect("the heads table");
            let (k, a) = (spoiled.session_key.as_str().as_bytes(), b"main".as_slice());
            let row = heads
                .remove(raw::pair(k, a).as_slice())
                .expect("remove")
                .expect("the head")
                .value();
            let bad = [k, b"\xFF".as_slice()].concat();
            heads
                .insert(raw::pair(&bad, a).as_slice(), row)
                .expect("insert");
        }
        txn.commit().expect("commit");
        drop(db);
        let store = RedbStore::open(&path)
            .await
            .expect("the migration opens the file");
        let listed: Vec<SessionRef> = store
            .list_heads(None)
            .await
            .expect("list heads")
            .into_iter()
            .map(|h| h.session)
            .collect();
        assert_eq!(listed, [kept]);
        store.close().await;
    }

    /// A row whose bytes decode but whose stored session key was damaged, in `events` only (the
    /// index keeps its key), cannot be read by its own ref: the row cap deletes it with the
    /// index entry its sequence has (the index's key, not the row's, names it) under that
    /// session's watermark, deleting a session removes several such rows with their dedupe
    /// keys, and so does deleting one by hand. The damage is either a byte that no key may hold
    /// (a control character, so the ref does not parse) or one that makes another valid key
    /// ("child" read as "chile"): trusting that one left the real entry, still read by
    /// `changes_since`, and put the watermark on no head or another session's.
    #[tokio::test]
    async fn rows_with_damaged_key_bytes_are_pruned_and_deleted_with_their_entries() {
        for byte in [1u8, b'e'] {
            rows_with_a_damaged_key_byte_are_deleted_with_their_entries(byte).await;
        }
    }

    /// Writes `byte` over the last byte of the stored session key of the event rows `seqs`.
    async fn damage_key_byte(store: &RedbStore, seqs: &'static [u64], byte: u8) {
        store
            .write("test", move |txn| {
                let mut events = txn.open_table(EVENTS).ctx("test")?;
                for &seq in seqs {
                    let mut row = events
                        .get(seq)
                        .ctx("test")?
                        .expect("a row")
                        .value()
                        .to_vec();
                    let m = codec::meta(seq, &row).expect("sound before");
                    let key = m.session_key.to_owned();
                    let at = row
                        .windows(key.len())
                        .position(|w| w == key.as_bytes())
                        .expect("the key's bytes");
                    row[at + key.len() - 1] = byte;
                    events.insert(seq, row.as_slice()).ctx("test")?;
                }
                Ok(((), true))
            })
            .await
            .expect("damage the keys");
    }

    async fn rows_with_a_damaged_key_byte_are_deleted_with_their_entries(byte: u8) {
        let (_dir, store) = fresh().await;
        let (child, other) = (session("agent:main:child"), session("agent:main:other"));
        record_keyed(&store, &child, &["k1", "k2", "k3"]).await;
        record_keyed(&store, &other, &["k4", "k5", "k6"]).await;
        damage_key_byte(&store, &[1, 4, 5], byte).await;
        if byte == 1 {
            assert!(matches!(
                store.events_after(Sequence::ZERO, 10).await,
                Err(StoreError::Corrupt { .. })
            ));
        }
        let step = PruneStep::RowCap { max_rows: 5 };
        assert_eq!(store.prune_chunk(&step, 100, T0).await.expect("prune"), 1);
        let (keys, child_seqs) = raw_indexes(&store, &child).await;
        assert_eq!(child_seqs, [2, 3, HEAD_SEQ], "the child's index entries");
        assert!(!keys.iter().any(|(k, _)| k == "k1"), "k1 freed: {keys:?}");
        let head = store
            .heads(std::slice::from_ref(&child))
            .await
            .expect("heads");
        assert_eq!(head[0].pruned_max_sequence, Sequence(1));
        let page = store
            .changes_since(&child, Sequence::ZERO, 10)
            .await
            .expect("the child's changes");
        let seqs: Vec<u64> = page.events.iter().map(|e| e.sequence.get()).collect();
        assert_eq!(seqs, [2, 3], "the child's changes");
        store
            .delete_session(&other)
            .await
            .expect("delete a session holding two such rows");
        let (keys, other_seqs) = raw_indexes(&store, &other).await;
        assert!(other_seqs.is_empty(), "{other_seqs:?}");
        assert_eq!(
            keys,
            [("k2".to_owned(), 2), ("k3".to_owned(), 3)],
            "the dedupe index"
        );
        let left: Vec<u64> = store
            .events_after(Sequence::ZERO, 10)
            .await
            .expect("the log, sound again")
            .iter()
            .map(|e| e.sequence.get())
            .collect();
        assert_eq!(left, [2, 3]);
        damage_key_byte(&store, &[3], byte).await;
        assert!(store.delete_event_row(Sequence(3)).await.expect("delete"));
        let (keys, child_seqs) = raw_indexes(&store, &child).await;
        assert_eq!(child_seqs, [2, HEAD_SEQ], "a row deleted by hand");
        assert_eq!(keys, [("k2".to_owned(), 2)], "k3 freed");
        store.close().await;
    }

    /// A row whose damaged key names another session that exists ("child" read as "chila") is
    /// pruned under the watermark of the session whose index holds it, and of that session only:
    /// the session it only seems to name lost nothing, and its head says so. (What the mutation
    /// did: the row's first, trusted reading stayed among the deleted rows beside the index's,
    /// and the other session's head was stamped as pruned up to it; review of stop 69, RE12.)
    #[tokio::test]
    async fn a_row_whose_damaged_key_names_another_session_stamps_only_its_own() {
        let (_dir, store) = fresh().await;
        let (child, chila) = (session("agent:main:child"), session("agent:main:chila"));
        record_keyed(&store, &child, &["k1", "k2", "k3"]).await;
        record_keyed(&store, &chila, &["k4", "k5", "k6"]).await;
        damage_key_byte(&store, &[1], b'a').await;
        let step = PruneStep::RowCap { max_rows: 5 };
        assert_eq!(store.prune_chunk(&step, 100, T0).await.expect("prune"), 1);
        let heads = store
            .heads(&[child.clone(), chila.clone()])
            .await
            .expect("heads");
        let marks: Vec<(String, Sequence)> = heads
            .iter()
            .map(|h| (h.session.session_key.to_string(), h.pruned_max_sequence))
            .collect();
        assert!(
            marks.contains(&("agent:main:child".to_owned(), Sequence(1)))
                && marks.contains(&("agent:main:chila".to_owned(), Sequence::ZERO)),
            "only the child's watermark moves: {marks:?}"
        );
        store.close().await;
    }

    /// After a failed commit redb refuses every write on that database until it is reopened:
    /// writes then say so (redb's own error read as corruption of a sound file), a second open
    /// in this process is refused with the reason instead of sharing the database that cannot
    /// write, and once every handle is closed an open gets a fresh one that writes. (The commit
    /// failure itself, a full disk, is stood in for by marking it.)
    #[tokio::test]
    async fn after_a_failed_commit_a_new_open_gets_a_database_that_writes() {
        let (dir, store) = fresh().await;
        let child = session("agent:main:child");
        store.record(event(&child, None), T0).await.expect("record");
        store
            .shared()
            .commit_failed(&"No space left on device (stood in for)");
        let err = store.record(event(&child, None), T0).await.unwrap_err();
        assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
        let chain = awareness_core::error::ErrorChain(&err).to_string();
        assert!(
            chain.contains("(No space left on device (stood in for))")
                && chain.contains("refuses every write until the database is reopened"),
            "{chain}"
        );
        let path = dir.path().join("state.redb");
        match RedbStore::open(&path).await {
            Err(StoreError::Open { reason, kind, .. }) => {
                assert!(reason.contains("a write failed on it"), "{reason}");
                assert_eq!(
                    kind,
                    awareness_core::OpenFailure::Other,
                    "not in use: unusable until this process closes it"
                );
            }
            other => panic!("shared a database that cannot write: {other:?}"),
        }
        store.close().await;
        let again = RedbStore::open(&path).await.expect("reopen");
        let rec = again
            .record(event(&child, None), T0)
            .await
            .expect("a write");
        assert_eq!(rec.event.sequence, Sequence(2));
        again.close().await;
    }

    /// A row that cannot be decoded and that no index entry names (doubly damaged) is still
    /// deleted by the row cap, with no head to stamp; deleting the highest row that cannot be
    /// decoded by hand does not take the sequence counter back.
    #[tokio::test]
    async fn an_unreadable_row_no_index_entry_names_is_pruned_and_the_counter_stays() {
        let (_dir, store) = fresh().await;
        let child = session("agent:main:child");
        for _ in 0..3 {
            store.record(event(&child, None), T0).await.expect("record");
        }
        assert!(store.damage_event_row(Sequence(1)).await.expect("damage"));
        let (a, k) = (child.agent_id.clone(), child.session_key.clone());
        store
            .write("test", move |txn| {
                let mut index = txn.open_table(EVENTS_BY_REF).ctx("test")?;
                index.remove((a.as_str(), k.as_str(), 1)).ctx("test")?;
                Ok(((), true))
            })
            .await
            .expect("remove the index entry");
        let step = PruneStep::RowCap { max_rows: 2 };
        assert_eq!(store.prune_chunk(&step, 100, T0).await.expect("prune"), 1);
        let head = store
            .heads(std::slice::from_ref(&child))
            .await
            .expect("heads");
        assert_eq!(
            head[0].pruned_max_sequence,
            Sequence::ZERO,
            "nothing named it"
        );
        assert!(store.damage_event_row(Sequence(3)).await.expect("damage"));
        assert!(
            store
                .delete_event_row(Sequence(3))
                .await
                .expect("delete the row")
        );
        let (_, child_seqs) = raw_indexes(&store, &child).await;
        assert_eq!(child_seqs, [2, HEAD_SEQ]);
        let next = store.record(event(&child, None), T0).await.expect("record");
        assert_eq!(next.event.sequence, Sequence(4), "the counter went back");
        store.close().await;
    }

    /// A failure of any other write names the file too (reads and recordings are the durable
    /// suite's `errors_after_open_name_the_file_once`): the context said only what was being
    /// done.
    #[tokio::test]
    async fn a_failed_write_names_the_file() {
        let (dir, store) = fresh().await;
        let file = dir.path().join("state.redb").display().to_string();
        let write = store
            .write("a write", |_| -> Result<((), bool), _> {
                Err(StoreError::corrupt("refused by the test"))
            })
            .await
            .expect_err("the write fails");
        assert_eq!(
            write.to_string(),
            format!("corrupt store: {file}: refused by the test")
        );
        store.close().await;
    }

    /// A bounded handle whose background flush never fires on its own, and a read-only handle
    /// on the same file, which keeps it open once the bounded one is gone.
    async fn bounded_and_a_reader(dir: &tempfile::TempDir) -> (RedbStore, RedbStore) {
        let path = dir.path().join("state.redb");
        let bounded = RedbStore::open_with(&path, RedbOptions::bounded(Duration::from_hours(1)))
            .await
            .expect("open bounded");
        let reader = RedbStore::open_with(&path, RedbOptions::default().read_only(true))
            .await
            .expect("open read-only");
        (bounded, reader)
    }

    /// A flush that waits for redb's write lock is made by the drain's next commit, durable in
    /// its stead: a busy drain takes the lock again and again, and the flusher could wait for
    /// several intervals while the commits behind it stayed at risk.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_stands_in_for_a_flush_that_waits_for_the_lock() {
        let dir = tempfile::tempdir().expect("dir");
        let (bounded, reader) = bounded_and_a_reader(&dir).await;
        let at = session("agent:main:subagent:child");
        // The first commit reserves sequences ahead, durably; the second is not durable.
        for _ in 0..2 {
            bounded.record(event(&at, None), T0).await.expect("record");
        }
        let shared = Arc::clone(bounded.writer.shared());
        assert!(
            shared.is_unflushed(),
            "a non-durable commit waits for a flush"
        );
        shared.ask_flush();
        bounded.record(event(&at, None), T0).await.expect("record");
        assert!(
            !shared.is_flush_due(),
            "the recording's commit made the flush"
        );
        assert!(
            !shared.is_unflushed(),
            "a durable commit leaves nothing to flush, not even itself"
        );
        bounded.record(event(&at, None), T0).await.expect("record");
        assert!(
            shared.is_unflushed(),
            "the next commit is not durable again"
        );
        drop(bounded);
        drop(reader);
    }

    /// A read-only handle that opened the database itself reports no live readers, whatever it
    /// asked: it ignores the option. (What the mutation did: `live_readers()` answered the option
    /// asked for; review of stop 65, RB39. That a read-only handle beside a writer refuses a
    /// recording is the shared read-only check's.)
    #[tokio::test]
    async fn a_read_only_handle_reports_no_live_readers() {
        let (dir, writer) = fresh().await;
        writer.close().await;
        let reader = RedbStore::open_with(
            dir.path().join("state.redb"),
            RedbOptions::default().read_only(true).live_readers(true),
        )
        .await
        .expect("open read-only");
        assert!(
            !reader.live_readers(),
            "a read-only handle of its own has no live readers"
        );
        reader.close().await;
    }

    /// A flush that waits for the write lock behind a writer's transaction returns once that
    /// transaction's commit, made durable in its stead, has committed, and writes nothing of
    /// its own. A commit that fails has made nothing durable: the flush commits itself (or
    /// fails) and is never counted as stood in for. (What the mutation did: the failed commit
    /// reported the flush done, and the commits before it stayed non-durable; review of stop
    /// 65, RB20. The test's commit fails without writing, so redb does not latch the failure.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flush_behind_a_write_returns_once_that_write_committed_durably() {
        for commit_fails in [false, true] {
            let dir = tempfile::tempdir().expect("dir");
            let (bounded, reader) = bounded_and_a_reader(&dir).await;
            let at = session("agent:main:subagent:child");
            for _ in 0..2 {
                bounded.record(event(&at, None), T0).await.expect("record");
            }
            let writer = Arc::clone(&bounded.writer);
            let shared = Arc::clone(writer.shared());
            assert!(shared.is_unflushed());
            let txn = tokio::task::block_in_place(|| writer.begin("test")).expect("begin");
            let flushing = {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || shared.flush())
            };
            while !shared.is_flush_due() {
                assert!(!flushing.is_finished(), "the flush ended without asking");
                std::thread::yield_now();
            }
            assert!(
                !flushing.is_finished(),
                "the flush waits for the write lock"
            );
            shared
                .commit_fails
                .store(commit_fails, std::sync::atomic::Ordering::Release);
            let committed = tokio::task::block_in_place(|| {
                txn.open_table(tables::META)
                    .ctx("test")?
                    .insert("test", 1)
                    .ctx("test")?;
                writer.commit(txn, "test")
            });
            let flushed = flushing.join().expect("the flush's thread");
            if commit_fails {
                assert!(committed.is_err(), "the test's commit fails");
                // Ok (the flush committed itself) or the refusal of a latched handle: either
                // way not stood in for by a commit that did not happen.
                assert_eq!(
                    shared.flushes_stood_in(),
                    0,
                    "a commit that failed stood in for the flush"
                );
            } else {
                committed.expect("commit");
                flushed.expect("flush");
                assert_eq!(shared.flushes_stood_in(), 1, "the commit stood in for it");
                assert!(!shared.is_unflushed() && !shared.is_flush_due());
            }
            drop(writer);
            drop(bounded);
            drop(reader);
        }
    }

    /// A write whose caller gave up is finished by the writer's drain, possibly after the handle
    /// is dropped and its background flush stopped. While another handle keeps the file open,
    /// nothing would flush that commit: it must be durable by itself.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_after_a_bounded_handle_is_dropped_is_not_left_unflushed() {
        let dir = tempfile::tempdir().expect("dir");
        let (bounded, reader) = bounded_and_a_reader(&dir).await;
        // What the drain of an abandoned write holds: the writer.
        let writer = Arc::clone(&bounded.writer);
        drop(bounded);
        let writer = tokio::task::spawn_blocking(move || {
            let txn = writer.begin("test")?;
            txn.open_table(tables::META)
                .ctx("test")?
                .insert("test", 1)
                .ctx("test")?;
            writer.commit(txn, "test")?;
            Ok::<_, StoreError>(writer)
        })
        .await
        .expect("the commit's task")
        .expect("commit");
        assert!(
            !writer.shared().is_unflushed(),
            "a commit made after the bounded handle was dropped waits for a flush that no longer runs"
        );
        drop(writer);
        drop(reader);
    }

    /// A write transaction the drain began non-durable before the bounded handle was dropped
    /// is made durable by the handle's last flush, which waits for it to commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bounded_handles_last_flush_waits_for_the_write_in_progress() {
        let dir = tempfile::tempdir().expect("dir");
        let (bounded, reader) = bounded_and_a_reader(&dir).await;
        let writer = Arc::clone(&bounded.writer);
        let (tell, told) = std::sync::mpsc::channel();
        *db::lock(&db::tests::LAST_FLUSH_BEGINS) = Some((bounded.path().to_owned(), tell));
        let (tell_committed, committed) = std::sync::mpsc::channel();
        *db::lock(&db::tests::LAST_FLUSH_COMMITTED) =
            Some((bounded.path().to_owned(), tell_committed));
        let txn = tokio::task::block_in_place(|| writer.begin("test")).expect("begin");
        let dropping = std::thread::spawn(move || drop(bounded));
        // Dropping flushes last (the timeout only keeps the test from hanging). Once that flush
        // has begun, it cannot end before the transaction in progress does.
        let began = told.recv_timeout(Duration::from_mins(1));
        *db::lock(&db::tests::LAST_FLUSH_BEGINS) = None;
        let dropped_first = began.is_err() || dropping.is_finished();
        tokio::task::block_in_place(|| {
            txn.open_table(tables::META)
                .ctx("test")?
                .insert("test", 1)
                .ctx("test")?;
            writer.commit(txn, "test")
        })
        .expect("commit");
        dropping.join().expect("the dropping thread");
        *db::lock(&db::tests::LAST_FLUSH_COMMITTED) = None;
        assert!(
            !dropped_first,
            "the handle's last flush did not wait for the write in progress, which stays non-durable"
        );
        // Decisive whatever the timing: the last flush made a durable commit, which redb could
        // only begin once the write in progress had committed.
        assert!(
            committed.try_recv().is_ok(),
            "the handle's last flush made no durable commit after the write in progress"
        );
        drop(writer);
        drop(reader);
    }

    /// A read-only handle never makes the pending commits of a bounded handle it shares the
    /// database with durable, whatever durability it was given: neither its `flush` nor its
    /// close (it starts no background flush of its own) commits on that database; the commits
    /// stay for the bounded handle's own flush. (What the mutations did: a read-only handle's
    /// flush made a durable commit on the shared database, RD25; one opened with
    /// `Durability::Bounded` started a flusher, whose last flush, on close, did, RD29; review of
    /// stop 68.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_only_handle_never_flushes_a_bounded_handles_commits() {
        for bounded_reader in [false, true] {
            let dir = tempfile::tempdir().expect("dir");
            let path = dir.path().join("state.redb");
            let options = RedbOptions::bounded(Duration::from_hours(1));
            let bounded = RedbStore::open_with(&path, options.clone())
                .await
                .expect("open bounded");
            let given = if bounded_reader {
                options
            } else {
                RedbOptions::default()
            };
            let reader = RedbStore::open_with(&path, given.read_only(true))
                .await
                .expect("open read-only");
            let at = session("agent:main:subagent:child");
            // The first recording raises the sequence reservation in a durable commit.
            for _ in 0..2 {
                bounded.record(event(&at, None), T0).await.expect("record");
            }
            assert!(
                bounded.shared().is_unflushed(),
                "the second recording is pending"
            );
            let what = if bounded_reader {
                reader.close().await;
                "closing a read-only handle given bounded durability"
            } else {
                reader.flush().await.expect("a read-only flush");
                drop(reader);
                "a read-only handle's flush"
            };
            assert!(
                bounded.shared().is_unflushed(),
                "{what} made the bounded handle's commits durable"
            );
            drop(bounded);
        }
    }

    /// Closing a handle returns only once a write its drain still holds (one whose caller gave
    /// up) has ended, also while another handle keeps the file open, where releasing the file
    /// waits for nothing; and a bounded handle stops its background flush only after that
    /// write, so that its last flush makes it durable. (What the mutations did: `close` let go
    /// of the writer at once and returned before the drain's write had ended, RD32; it stopped
    /// the flush before waiting for the drain, whose commit stayed non-durable, RD33; review of
    /// stop 68. The pause only gives a broken close time to return or to stop the flush; the
    /// original passes whatever the timing.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closing_waits_for_the_drain_and_flushes_what_it_commits() {
        let dir = tempfile::tempdir().expect("dir");
        let (bounded, reader) = bounded_and_a_reader(&dir).await;
        let shared = Arc::clone(bounded.shared());
        // What the drain of an abandoned write holds: the writer.
        let writer = Arc::clone(&bounded.writer);
        let closing = tokio::spawn(bounded.close());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !closing.is_finished(),
            "close returned while the drain still held the writer"
        );
        tokio::task::spawn_blocking(move || {
            let txn = writer.begin("test")?;
            txn.open_table(tables::META)
                .ctx("test")?
                .insert("test", 1)
                .ctx("test")?;
            writer.commit(txn, "test")
        })
        .await
        .expect("the commit's task")
        .expect("commit");
        closing.await.expect("close");
        assert!(
            !shared.is_unflushed(),
            "the commit the drain finished while the handle closed was left non-durable"
        );
        drop(reader);
    }

    /// A flush that fails (here: refused after a failed commit) names the file, as every other
    /// write's error does.
    /// (What the mutation did: the flush's error was returned without the file's name; review
    /// of stop 70, RF14.)
    #[tokio::test]
    async fn a_failed_flush_names_the_file() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("state.redb").display().to_string();
        let store = RedbStore::open_with(
            dir.path().join("state.redb"),
            RedbOptions::bounded(Duration::from_hours(1)),
        )
        .await
        .expect("open");
        // The first recording reserves sequences, a durable commit; the second is left to flush.
        for _ in 0..2 {
            store
                .record(event(&session("agent:main:child"), None), T0)
                .await
                .expect("record");
        }
        store
            .shared()
            .commit_failed(&"No space left on device (stood in for)");
        let err = store
            .flush()
            .await
            .expect_err("a flush after a failed commit");
        let chain = awareness_core::error::ErrorChain(&err).to_string();
        assert!(
            chain.contains(&file),
            "the flush's error names no file: {chain}"
        );
        store.close().await;
    }
}
