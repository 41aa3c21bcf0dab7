//! # store-sqlite
//!
//! The embedded default backend of session state awareness: [`EventStore`] and [`CursorStore`]
//! on one SQLite file, through sqlx. Pick it for a gateway on one host (several gateway
//! processes may share the file); pick `store-memory` when nothing needs to survive the
//! process.
//!
//! - **On-disk compatible with OpenClaw.** The four tables (`session_state_events`,
//!   `session_state_heads`, `session_watch_cursors`, `session_upstream_links`) are OpenClaw's,
//!   with the same names, columns, types and keys, so a state database OpenClaw wrote opens and
//!   reads correctly. Our additions are two nullable columns (`session_watch_cursors.target_agent_id`
//!   and `session_state_events.fields_json`, below) and one table of our own,
//!   `awareness_schema_migrations` (decision 0012); OpenClaw's other tables, and the file's
//!   `user_version`, are never touched. Rows OpenClaw wrote read as OpenClaw reads them, a kind
//!   this version does not know, an empty id or a payload that is not a JSON object included
//!   (decision 0013).
//! - **Atomic.** Recording writes in one `BEGIN IMMEDIATE` transaction: the event insert (a
//!   dedupe hit returns the stored row and still spends one sequence, as OpenClaw's
//!   AUTOINCREMENT does), the head move and every cursor move. (A recording tried the one-batch
//!   way whose target turns out to be watched commits a transaction that wrote nothing, then
//!   writes in a second one; below.) Acknowledge, sweep and delete are one transaction
//!   each; a pruning chunk may take several (below).
//! - **Crash-safe.** WAL with `synchronous=NORMAL`: a committed record survives a killed
//!   process; `busy_timeout=5000` makes writers of several processes wait for each other.
//! - **Protocol once.** Every cursor decision is a call into `awareness_core::protocol`; this
//!   crate loads what a decision needs and persists what it returns.
//! - **Pruning off the hot path.** [`EventStore::prune_chunk`] deletes a chunk (at most
//!   `max_rows` rows; `prune` passes `RetentionPolicy::chunk_rows`, 2,000 by default) in
//!   write transactions of at most 250 rows, releasing the write connection between them, so
//!   a recording waits behind one of them, not behind the whole chunk. Each transaction stamps
//!   the pruned watermarks of the rows it deletes before deleting them, so a failure partway
//!   leaves every row already deleted covered by its head's watermark. Run
//!   [`awareness_core::AwarenessStoreExt::prune`] from a background task.
//!
//! New files are created with mode 0600 (SQLite gives its `-wal` and `-shm` files the same
//! mode). [`SqliteStore::open`] never creates a missing directory and never overwrites a file
//! that is not an SQLite database. A new store is prepared under a name of its own beside the
//! path and linked into place complete, so handles and processes that open a new path at the
//! same moment all open one store, and an open that fails (or is cancelled) while preparing it
//! leaves nothing behind (on a file system without hard links, an empty file at the path,
//! which the next open makes a store). Once linked into place, the new store is never removed,
//! since another opener may be using it: an open that fails after that (connecting to it)
//! leaves a new, empty store at the path.
//!
//! It also implements [`UpstreamStore`] on OpenClaw's `session_upstream_links`.
//!
//! ## How it talks to SQLite
//!
//! sqlx runs each SQLite connection on its own thread; every statement result and every row
//! is a message between threads. The store is shaped around that:
//!
//! - one **write connection** held outside any pool (no ping on acquire), behind an async
//!   mutex, and two **reader connections** (WAL readers never block the writer);
//! - a write is mostly **two batches**: the first begins the `IMMEDIATE` transaction, writes
//!   what needs no decision and reads what the protocol needs; the second writes what
//!   `awareness_core::protocol` decided and commits. A recording that core says moves no
//!   cursor when its target has none (no producer-named watcher) is **one batch**: its insert
//!   is guarded by "the target has no cursor" under the write lock, and only when the guard
//!   finds one (nothing written, no sequence spent) does it take the two-batch path, in a
//!   transaction of its own (three batches in all, the first writing nothing). A pruning
//!   transaction of the row cap is three batches (count, choose, delete). An
//!   in-memory hint of watched targets sends those straight to two batches;
//! - **group commit**: recordings that arrive while the write connection is busy queue up, and
//!   the next writer records all of them (up to [`SqliteOptions::group_commit`], default 64) in
//!   one transaction of two batches: one multi-row insert walking a JSON array, then the heads,
//!   the cursors `awareness_core::protocol` decided event by event in queue order, and the
//!   commit. Each caller gets its own event only after that commit; a lone caller records as
//!   above. [`SqliteStore::write_transactions`] shows how well it batches. The batch runs on
//!   a task of the runtime of the caller that found the connection free; should that runtime
//!   shut down meanwhile, the batch is finished on a thread of its own, and its callers get
//!   their answers. A runtime kept alive but no longer driven keeps its tasks where they
//!   are: a batch there, its callers, and every later write of the handle wait until that
//!   runtime is driven again or dropped;
//! - every read answers in **one row**: lists are built inside SQLite as one JSON value
//!   (`json_group_array`), so a 200-event page is one message, not 201;
//! - **an event's fields are stored as JSON too**: the insert writes them, as a JSON array,
//!   into `fields_json`, so a reconcile page joins stored texts instead of building one per
//!   row, which was the larger part of its statement (a 200-event page went from 257-339 µs to
//!   180-191 µs in `reconcile/200`, alternating the bench binaries). Rows OpenClaw wrote have
//!   none and are built on the fly. The price is space: about 110 bytes more per event on the
//!   standard data set (its 50,000 events take 15.9 MB of table and indexes instead of
//!   10.4 MB; docs/decisions/0007);
//! - **WAL checkpoints run in the background** on a reader connection every 256 write
//!   transactions, a pruning transaction counting as 64 (`PRUNE_WEIGHT`: four of them start
//!   one), on a thread of their own (not a task of the caller's runtime, which
//!   [`SqliteStore::close`] would then depend on), while recordings go on; only a short last pass, when little is left, holds
//!   the write connection so the WAL file starts over. The writer's own autocheckpoint
//!   (40,000 pages) is only a safety net. Under sustained concurrent recording the passes
//!   rarely find little left, and a group commit counts as one write transaction however many
//!   events it holds, so the WAL file grows past a few MiB: 57-124 MiB at its largest while 16
//!   or 128 tasks recorded without a pause (a probe of 64,000 events a round). It starts over
//!   once a checkpoint catches recording in a pause, and is then cut back to 64 MiB
//!   (`journal_size_limit`); and since stop 38, where every pass is slow (an fsync slower than
//!   5 ms), after 4 rounds in a row without a last pass (since stop 47 a quick pass that left
//!   many frames, one that could copy nothing past another reader's snapshot, counts as such
//!   a round rather than making the last pass at once), by a forced last pass made when one
//!   more pass just before it leaves at most 1,024 frames to copy. (The sizes above
//!   were measured before that pass existed.)
//!   Counting a batch by its events instead bounded it at 1.4-18 MiB but cost 7-45% of the
//!   events per second in the same probe, so throughput was kept.
//! - **a cancelled write takes its lock with it**: a caller cancelled between its two batches
//!   (a request timeout, say) leaves an open transaction, which would keep every other handle
//!   and process waiting on the file; it is rolled back at once on a thread of its own. A
//!   recording cancelled while it still waits in the group-commit queue leaves the queue.
//! - **other writers' commits are hinted** (DESIGN.md section 9.1, decision 0014): a handle
//!   asked for [`EventStore::commit_hints`](awareness_core::EventStore::commit_hints) reads
//!   `PRAGMA data_version` every [`SqliteOptions::commit_hint_interval`] (20 ms by default) on a
//!   connection of its own, from a thread of its own, and hints when another process (or
//!   another handle) has committed to the file. At each change the write connection is asked
//!   for its own number, which its own commits never move, so that they are left out. In
//!   `hints/*` (12-05, two runs on a noisy host): a poll asked and answered, hand-offs to the
//!   poller's thread and back included, 21.4 and 67.8 µs (at the default rate, at most 0.4%
//!   of one core); a handle polling every millisecond (twenty times the default rate)
//!   recorded at 0.96x and 1.10x the time of one not polling in the same run (113.0 against
//!   117.1 µs, 124.5 against 113.4 µs); another handle's commit was hinted 21.8 and 21.4 ms
//!   after its recording began (the bench's recordings start right after a poll, so they
//!   wait a whole interval: half of one on average otherwise).
//!
//! ## Decisions
//!
//! - Migrations are a tiny runner keyed on our own table `awareness_schema_migrations` (sqlx's
//!   `migrate!` needs the `macros` feature, and a column must only be added when missing):
//!   opening an up-to-date file costs a few reads (the schema version, the additive columns) and
//!   no write lock.
//! - A cursor row OpenClaw wrote has no target agent; [`awareness_core::Cursor::default_target_agent`]
//!   supplies it. A cursor row that cannot be read (its watcher key is not agent-qualified, a
//!   sequence is negative, text that is not UTF-8, ...) is left out of every read of many
//!   cursors with a `warn!` and left in the file, so one bad row cannot stop recording on its
//!   target (decision 0016). SQLite keeps text that is not UTF-8 as it is and copies it into
//!   the one JSON text a read of many rows decodes; such a text is read with each bad sequence
//!   as U+FFFD, and a cursor row holding one is unreadable (pruning victims keep the text as
//!   read, so a stamp reaches exactly the head keyed by it; a listing of heads, and of links,
//!   decision 0017, is read again a row at a time).
//! - An event row that cannot be read (text that is not UTF-8, stored fields that are not
//!   JSON, an actor type no version knows) still fails every read that meets it (a page that
//!   left it out would be a wrong answer, decision 0016), with [`StoreError::Corrupt`] naming
//!   it: `event <sequence> of <session>`. A page that cannot be read as a whole is read again
//!   a row at a time to find that row, so a page that reads costs nothing more. A row
//!   numbered 0 or below (OpenClaw's table takes one; no writer we know gives one) is returned
//!   by no read of pages or of the log and fails none (a dedupe hit on its key answers it, or
//!   fails naming it); [`SqliteStore::events_numbered_below_one`] finds it, and pruning
//!   deletes it in its turn (`prune --dry-run`, which counts from the log, leaves it out).
//! - Deleting a session also deletes its upstream link (DESIGN.md section 6).
//! - Foreign-key enforcement stays off: our tables have none, and no statement of ours may
//!   cascade into another table of an OpenClaw database.
//!
//! ```
//! use awareness_core::{ActorType, AwarenessStoreExt, CursorStore, EventKind, EventStore,
//!     NewEvent, SessionRef, Sequence, Timestamp, WatcherKey};
//! use store_sqlite::SqliteStore;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let dir = tempfile::tempdir()?;
//! let store = SqliteStore::open(dir.path().join("state.sqlite")).await?;
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
//! store.close().await;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! [`EventStore`]: awareness_core::EventStore
//! [`CursorStore`]: awareness_core::CursorStore
//! [`EventStore::prune_chunk`]: awareness_core::EventStore::prune_chunk
//! [`UpstreamStore`]: awareness_core::UpstreamStore

mod commit_poll;
mod conn;
mod cursors;
mod decode;
mod error;
mod events;
mod group;
mod open;
mod rows;
mod schema;
mod sql;
mod upstream;

#[doc(hidden)]
pub use commit_poll::CommitPolls;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use awareness_core::{OpenFailure, Sequence, SessionKey, SessionRef, StoreError, WatcherKey};
use sqlx::sqlite::{SqliteConnectOptions, SqliteRow, SqliteSynchronous};
use sqlx::{ConnectOptions as _, Connection as _, SqliteConnection};
use tokio::sync::Mutex;

use crate::conn::{Hints, Query, Readers, WriteGuard, WriteSlot, Writer, batch_one, get};
use crate::decode::int;
use crate::open::{Companions, init_writer, prepare_file};

/// Write transactions between two background checkpoints (a recording made alone appends
/// about seven WAL frames, so about 1,800 frames or 7 MiB of WAL; a group commit counts once
/// and appends more, see the crate docs; the writer's own autocheckpoint at 40,000 pages is
/// only a safety net).
const CHECKPOINT_EVERY: u32 = 256;

/// Most rows one pruning write transaction deletes. A deleted event row touches the table and
/// three indexes spread over every session, so 2,000 rows (the default chunk) in one
/// transaction dirty most index pages and hold the write lock for tens of milliseconds; 250
/// keep a recording's wait behind pruning to a few milliseconds.
pub(crate) const PRUNE_TX_ROWS: usize = 250;

/// How much a pruning write transaction counts towards the next checkpoint.
pub(crate) const PRUNE_WEIGHT: u32 = 64;

/// Recordings one group commit may hold by default.
const DEFAULT_GROUP_COMMIT: usize = 64;

/// How to open a store. The defaults suit a gateway: read-write, create the file when missing.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    read_only: bool,
    create_if_missing: bool,
    readers: usize,
    busy_timeout: Duration,
    group_commit: usize,
    commit_hint_interval: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            read_only: false,
            create_if_missing: true,
            readers: 2,
            busy_timeout: Duration::from_secs(5),
            group_commit: DEFAULT_GROUP_COMMIT,
            commit_hint_interval: DEFAULT_COMMIT_HINT_INTERVAL,
        }
    }
}

impl SqliteOptions {
    /// The defaults: read-write, create when missing, two reader connections, 5 s busy timeout,
    /// group commit of up to 64 recordings, commit hints polled every 20 ms.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens without the write connection: every write returns [`StoreError::ReadOnly`], and
    /// neither the database file nor its schema is ever written or created (SQLite itself may
    /// create the `-wal` and `-shm` files beside a database in WAL mode, write its read marks
    /// into `-shm`, and leave them). A database behind this crate's schema (an OpenClaw
    /// database never opened read-write by it) is read as it is, this crate's additive columns
    /// read as NULL, as the rows OpenClaw wrote hold them anyway; a SQLite file without
    /// OpenClaw's four tables is refused with [`StoreError::Open`].
    #[must_use]
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Whether a missing file is created (mode 0600; its directory must exist). Default `true`.
    /// On, a store is also made in an existing database without tables (an empty file); off,
    /// the open creates no store at all: an existing file that is not yet one (an empty file)
    /// is refused with [`StoreError::Open`] and left as it was. Either way, another
    /// application's SQLite database (tables, none of OpenClaw's four session-state tables: a
    /// mistyped path) is refused and left as it was, and an OpenClaw database is opened (and
    /// gains our columns, as always).
    #[must_use]
    pub fn create_if_missing(mut self, create: bool) -> Self {
        self.create_if_missing = create;
        self
    }

    /// How many connections serve reads (at least one; at most [`MAX_READERS`], more is
    /// refused at open with [`StoreError::Open`]: each is a connection on a thread of its
    /// own). Default 2.
    #[must_use]
    pub fn readers(mut self, readers: usize) -> Self {
        self.readers = readers.max(1);
        self
    }

    /// How many recordings may share one write transaction (group commit). Recordings that
    /// arrive while the write connection is busy queue up, and the next writer records up to
    /// this many of them in one transaction of two batches; each caller still gets its own
    /// event back only after that commit. A lone caller records as it would without group
    /// commit. `1` turns it off (one transaction per event); `0` is refused at open
    /// ([`StoreError::Open`]). Default 64.
    #[must_use]
    pub fn group_commit(mut self, max_events: usize) -> Self {
        self.group_commit = max_events;
        self
    }

    /// How long a statement waits for another process's write lock before reporting
    /// [`StoreError::Busy`]. Default 5 s. SQLite counts it in milliseconds in an `int`: a longer
    /// wait than `i32::MAX` ms (about 24.8 days; `Duration::MAX` for "as long as it takes") is
    /// that.
    #[must_use]
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout.min(MAX_BUSY_TIMEOUT);
        self
    }

    /// How often a handle asked for [`EventStore::commit_hints`](awareness_core::EventStore::commit_hints)
    /// reads `PRAGMA data_version` to learn of other writers' commits (another process, or
    /// another handle of this one, on the same file): a hint comes within about this long of
    /// such a commit. Each poll is one statement on a connection of the poller's own (tens of
    /// microseconds, hand-offs included, measured in `benches/`); when the number changed,
    /// the write connection is asked for its own, to leave this handle's commits out (a
    /// write of the handle that keeps it past 250 ms, as one waiting for another process's lock
    /// does, is not waited for: the change is hinted). Each poll also checks that the path still
    /// names the file the handle opened, and warns once when it was moved away, deleted or
    /// replaced (the handle goes on in its file, which nothing opening the path reaches). Nothing
    /// polls until `commit_hints` is first called (the poller starts then, in the background,
    /// and gives one hint once it has begun, for what came before). At least 1 ms (a shorter interval is taken as 1 ms);
    /// `Duration::MAX` never polls on its own. Default 20 ms
    /// ([`DEFAULT_COMMIT_HINT_INTERVAL`]).
    #[must_use]
    pub fn commit_hint_interval(mut self, interval: Duration) -> Self {
        self.commit_hint_interval = interval.max(MIN_COMMIT_HINT_INTERVAL);
        self
    }
}

/// The default of [`SqliteOptions::commit_hint_interval`].
pub const DEFAULT_COMMIT_HINT_INTERVAL: Duration = Duration::from_millis(20);

/// The shortest interval [`SqliteOptions::commit_hint_interval`] takes.
const MIN_COMMIT_HINT_INTERVAL: Duration = Duration::from_millis(1);

/// The longest busy timeout SQLite takes: milliseconds in an `int`.
const MAX_BUSY_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// Closes the connections of an open that failed, then, when the failure `e` says the file is
/// no usable database, removes the companion files the open created (an open connection would
/// keep them): a refused open leaves nothing behind.
async fn abandon(
    readers: Vec<Mutex<SqliteConnection>>,
    writer: Option<SqliteConnection>,
    companions: &Companions,
    e: Option<&sqlx::Error>,
) {
    for r in readers {
        drop(r.into_inner().close().await);
    }
    if let Some(w) = writer {
        drop(w.close().await);
    }
    if let Some(e) = e {
        companions.remove_if_unusable(e);
    }
}

/// Why a read-write open is refused when SQLite opened the file read-only (`e`, its refusal to
/// write).
fn opened_read_only_reason(e: &sqlx::Error) -> String {
    format!(
        "SQLite opened it read-only and refuses writes ({e}): this user may not write the file, \
         or its file system is read-only; open the store read-only to read it"
    )
}

/// The most reader connections a handle may have ([`SqliteOptions::readers`]).
pub const MAX_READERS: usize = 64;

/// `path` as SQLite takes it for the file's name. sqlx opens every connection with
/// `SQLITE_OPEN_URI`, under which a name that starts with `file:` is a URI (`file:x.db` opens
/// `x.db`, `file:x.db%3Fmode=memory` a database in memory) and `:memory:` is a database in
/// memory, while the file this crate checked or created is the one the path names. A relative
/// path is made absolute against the working directory of the open (which SQLite reads as
/// nothing but a file's name), so that a connection made later (a reader the pool opens
/// again, the commit-hint poller, made at the first `commit_hints`) opens the same file after
/// the process changed directory; where the working directory cannot be read, `./` and the
/// path.
fn file_name(path: &Path) -> std::borrow::Cow<'_, Path> {
    if path.is_relative() {
        std::borrow::Cow::Owned(
            std::path::absolute(path).unwrap_or_else(|_| Path::new(".").join(path)),
        )
    } else {
        std::borrow::Cow::Borrowed(path)
    }
}

/// The options of every connection to `path`: the file must exist (a missing one is created
/// by `open::prepare_file`), and journal_mode is set by hand after connecting (not as a connect
/// option), so that the first statement that reads the file fails on a connection we own and can
/// close before cleaning up after it.
fn connect_options(path: &Path, options: &SqliteOptions) -> SqliteConnectOptions {
    unsynced_options(path, options).synchronous(SqliteSynchronous::Normal)
}

/// [`connect_options`] but `synchronous`, whose pragma reads the file (SQLite loads the schema
/// for it), and so would create a WAL store's `-wal` and `-shm` while connecting: the write
/// connection is made with these, asked whether SQLite opened the file read-only before
/// anything reads it (`open::file_opened_read_only`), and only then given `synchronous`
/// ([`sql::SYNCHRONOUS`]).
fn unsynced_options(path: &Path, options: &SqliteOptions) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(file_name(path))
        .create_if_missing(false)
        .read_only(options.read_only)
        .busy_timeout(options.busy_timeout)
        // Our four tables have no foreign keys; leaving enforcement off guarantees that no
        // statement of ours cascades into another table of an OpenClaw database.
        .foreign_keys(false)
        // A statement that writes many rows (a group commit's insert and head upsert, a
        // pruning chunk) keeps a statement journal, which SQLite spills to a new temporary
        // file past 64 KiB: group commits of 16 events created, wrote and deleted such files
        // in /var/tmp (strace counted 1,293 in one short bench run). Kept in memory, a batch
        // of 16 took 26-29% less time in two A/B runs (678-727 µs down to 504-514 µs).
        // Connection-local: nothing in the database file changes.
        .pragma("temp_store", "memory")
        // sqlx logs every statement at DEBUG and one slower than a second at WARN, with its
        // SQL over several lines; the store reports its own failures, and a statement that
        // waits for another connection's lock is slow by design (the busy timeout).
        .disable_statement_logging()
}

/// Clears a flag when dropped.
struct ClearOnDrop(Arc<AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A session-awareness store in one SQLite file. Share it as `Arc<SqliteStore>` (or
/// `Arc<dyn AwarenessStore>`); one handle serializes its own writes on one connection and reads
/// on a few others.
pub struct SqliteStore {
    path: PathBuf,
    writer: Option<Arc<WriteSlot>>,
    readers: Arc<Readers>,
    /// Write transactions (weighted) since the last background checkpoint was started.
    writes_since_checkpoint: AtomicU32,
    /// A background checkpoint is running.
    checkpointing: Arc<AtomicBool>,
    /// The last background checkpoint, awaited by [`SqliteStore::close`]: its thread drops the
    /// sender once the checkpoint is over and its connections' handles are let go.
    checkpoint_task: std::sync::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
    hints: Arc<Hints>,
    /// Polls for other writers' commits once asked for hints.
    poller: commit_poll::Poller,
    /// The options of the poller's connection, and its interval.
    poll_options: SqliteConnectOptions,
    poll_interval: Duration,
    /// The file opened, which the poller checks the path still names.
    file: Option<commit_poll::OpenedFile>,
    /// Recordings waiting for the write connection (group commit).
    queue: group::Queue,
    /// Numbers the queued recordings.
    next_job: std::sync::atomic::AtomicU64,
    /// Most recordings in one write transaction.
    group_commit: usize,
    /// Write operations begun on the write connection since open (shared with [`Writer`], whose
    /// group commits count the recordings they retry alone).
    write_ops: Arc<std::sync::atomic::AtomicU64>,
    /// The most recordings one write transaction has held.
    largest_batch: std::sync::atomic::AtomicUsize,
}

/// Event rows a store holds numbered 0 or below, which no read returns
/// ([`SqliteStore::events_numbered_below_one`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventsBelowOne {
    /// How many.
    pub rows: u64,
    /// The lowest sequence among them.
    pub lowest: i64,
}

impl fmt::Display for EventsBelowOne {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} event row(s) numbered 0 or below (the lowest: event {}), which no read returns; pruning deletes them in their turn",
            self.rows, self.lowest
        )
    }
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("read_only", &self.writer.is_none())
            .field("readers", &self.readers.conns.len())
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (or creates, mode 0600) the store at `path` with the default [`SqliteOptions`], and
    /// brings its schema up to date. The directory must exist. An existing file that is not an
    /// SQLite database, a truncated one, one in a place without the needed permissions, one this
    /// user may not write (its mode or owner, a read-only file system: SQLite would open it
    /// read-only and fail every write later; open it with [`SqliteOptions::read_only`] to read
    /// it), or one a later version of this crate migrated (decision 0012) gives
    /// [`StoreError::Open`] naming the path; nothing is created or overwritten then (a file
    /// this user may not write is refused before SQLite reads it, so not even its `-wal` and
    /// `-shm` are made beside it). So does a
    /// missing or empty file with a `-wal`, a `-shm` or a live `-journal` beside it (its database deleted
    /// or moved, perhaps while a process still has it open, or after a read-only handle closed
    /// last, which cannot remove them; an empty file put where a store was moved away from):
    /// a new store there would read them as its own, or take them from the process that
    /// still writes its log there, whose committed events would go with it. Whether
    /// another process still uses them cannot be told from here (opening them would drop this
    /// process's own locks on them): move them away once none has the old database open. So
    /// does a file with other names (hard links, on Unix): SQLite keeps a log beside each name
    /// a database is opened under, and two logs of one file corrupt it. A file whose
    /// schema this open must bring up to date while another connection holds its write lock for
    /// longer than the busy timeout gives [`StoreError::Busy`] (retryable) naming the path.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// Opens the store at `path` with `options`.
    pub async fn open_with(
        path: impl AsRef<Path>,
        options: SqliteOptions,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        if options.readers > MAX_READERS {
            return Err(StoreError::open(
                path,
                OpenFailure::InvalidOptions,
                format!(
                    "readers must be at most {MAX_READERS} (each is a connection on a thread of its own), not {}",
                    options.readers
                ),
                None,
            ));
        }
        if options.group_commit == 0 {
            // Refused before the file is touched, as store-redb does.
            return Err(StoreError::open(
                path,
                OpenFailure::InvalidOptions,
                "group_commit must be at least 1 (1 commits every recording alone)",
                None,
            ));
        }
        let base = connect_options(&path, &options);
        // A store this open creates is complete before it appears at `path`, and is never
        // removed afterwards, even if connecting to it below fails: another opener may be using
        // it by then (see `open::create`).
        let created = prepare_file(&path, &options, &base).await?;
        let store = Self::connect(&path, &options, base).await?;
        if created {
            tracing::debug!(path = %path.display(), "created a new store");
        }
        Ok(store)
    }

    async fn connect(
        path: &Path,
        options: &SqliteOptions,
        base: SqliteConnectOptions,
    ) -> Result<Self, StoreError> {
        let fail = |e: sqlx::Error| error::failed_open(path, e);
        let companions = Companions::before_open(path);
        let mut readers = Vec::with_capacity(options.readers);
        let write_ops = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let writer = if options.read_only {
            None
        } else {
            let mut conn = match unsynced_options(path, options).connect().await {
                Ok(conn) => conn,
                Err(e) => {
                    abandon(Vec::new(), None, &companions, Some(&e)).await;
                    return Err(fail(e));
                }
            };
            // A file this user may not write is refused before anything reads it: the first
            // read of a connection SQLite opened read-only creates the `-wal` and `-shm` of a
            // WAL store, and leaves them (see `open::file_opened_read_only`). `synchronous`
            // reads the file, so it is set after.
            let checked = async {
                if let Some(e) =
                    open::file_opened_read_only(&mut conn, options.busy_timeout).await?
                {
                    return Ok(Some(e));
                }
                sqlx::raw_sql(sql::SYNCHRONOUS)
                    .execute(&mut conn)
                    .await
                    .map(|_| None)
            }
            .await;
            match checked {
                Ok(None) => {}
                Ok(Some(e)) => {
                    abandon(Vec::new(), Some(conn), &companions, None).await;
                    return Err(error::open(
                        path,
                        OpenFailure::PermissionDenied,
                        opened_read_only_reason(&e),
                        None,
                    ));
                }
                Err(e) => {
                    abandon(Vec::new(), Some(conn), &companions, Some(&e)).await;
                    return Err(fail(e));
                }
            }
            // A file a later version wrote is refused before anything is written to it, and so
            // is one that is no state database yet when this open may create none (an empty
            // file, another application's database: a mistyped path), and another
            // application's database when it may.
            let refused = async {
                let refused = match schema::too_new(&mut conn).await? {
                    None if !options.create_if_missing => {
                        schema::not_a_state_database(&mut conn).await?.map(|r| {
                            (
                                OpenFailure::NotAStore,
                                format!("{r}, and create_if_missing is off"),
                            )
                        })
                    }
                    None => schema::another_applications(&mut conn)
                        .await?
                        .map(|r| (OpenFailure::NotAStore, r)),
                    Some(r) => Some((OpenFailure::Unsupported, r)),
                };
                if refused.is_some() {
                    return Ok(refused);
                }
                init_writer(&mut conn, path, options.busy_timeout).await?;
                // The schema is checked again once settled: a later version may have migrated
                // the file between the check above and `migrate` (two versions starting at
                // once). `migrate` writes nothing into such a file (`schema::tests`), which is
                // refused here as the check above refuses it.
                if let Some(reason) = schema::too_new(&mut conn).await? {
                    return Ok(Some((OpenFailure::Unsupported, reason)));
                }
                Ok(open::opened_read_only(&mut conn, options.busy_timeout)
                    .await?
                    .map(|e| (OpenFailure::PermissionDenied, opened_read_only_reason(&e))))
            }
            .await;
            match refused {
                Ok(None) => {}
                Ok(Some((kind, reason))) => {
                    abandon(Vec::new(), Some(conn), &companions, None).await;
                    return Err(error::open(path, kind, reason, None));
                }
                Err(e) => {
                    abandon(Vec::new(), Some(conn), &companions, Some(&e)).await;
                    return Err(fail(e));
                }
            }
            Some(Arc::new(Mutex::new(Some(Writer {
                conn,
                open_tx: false,
                ops: Arc::clone(&write_ops),
                path: Arc::from(path),
            }))))
        };
        for _ in 0..options.readers.max(1) {
            match base.connect().await {
                Ok(conn) => readers.push(Mutex::new(conn)),
                Err(e) => {
                    // A read-only open of a damaged file fails here, on the pragmas.
                    let writer = writer
                        .and_then(Arc::into_inner)
                        .and_then(Mutex::into_inner)
                        .map(|w| w.conn);
                    abandon(readers, writer, &companions, Some(&e)).await;
                    return Err(fail(e));
                }
            }
        }
        if writer.is_none() {
            // Whatever our migrations table records (a column it lists may have been dropped
            // since), each missing additive column is read as NULL: an OpenClaw database, or
            // one behind our schema, is read as it is, and nothing is written.
            // A file a later version wrote is refused, as by a read-write open.
            for r in &mut readers {
                let shadowed = match schema::too_new(r.get_mut()).await {
                    Ok(None) => schema::shadow_missing_columns(r.get_mut())
                        .await
                        .map(|r| r.map_err(|reason| (OpenFailure::NotAStore, reason))),
                    Ok(Some(reason)) => Ok(Err((OpenFailure::Unsupported, reason))),
                    Err(e) => Err(e),
                };
                let (kind, reason) = match shadowed {
                    Ok(Ok(())) => continue,
                    Ok(Err(refused)) => refused,
                    // As any other failed open: busy stays retryable, the cause stays the
                    // source, and companions this open created go.
                    Err(e) => {
                        abandon(readers, None, &companions, Some(&e)).await;
                        return Err(fail(e));
                    }
                };
                abandon(readers, None, &companions, None).await;
                return Err(error::open(path, kind, reason, None));
            }
        }
        tracing::debug!(path = %path.display(), read_only = options.read_only, "opened store");
        Ok(Self {
            path: path.to_path_buf(),
            writer,
            readers: Arc::new(Readers::new(readers)),
            writes_since_checkpoint: AtomicU32::new(0),
            checkpointing: Arc::new(AtomicBool::new(false)),
            checkpoint_task: std::sync::Mutex::new(None),
            hints: Arc::default(),
            poller: commit_poll::Poller::default(),
            poll_options: base,
            poll_interval: options.commit_hint_interval,
            file: commit_poll::OpenedFile::at(path),
            queue: group::Queue::default(),
            next_job: std::sync::atomic::AtomicU64::new(0),
            group_commit: options.group_commit,
            write_ops,
            largest_batch: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes every connection cleanly: the log is checkpointed into the file first (without
    /// waiting for readers, so a reader that still holds an older snapshot can keep part of it
    /// in the log), and the last connection to close removes it. Dropping the store closes
    /// them too, without waiting: a process that exits right after may leave the log beside
    /// the file. A background checkpoint still running is waited for first; it runs on a
    /// thread of its own, so waiting for it does not depend on the runtime that started it
    /// being driven; so does the rollback of a write cancelled midway, which `close` waits for
    /// too (it holds the write connection). Through a shared handle,
    /// [`EventStore::close`](awareness_core::EventStore::close) calls this when it holds the
    /// last one.
    pub async fn close(self) {
        // The poller's connection first: the last connection to close removes the log.
        self.poller.stop().await;
        let task = self
            .checkpoint_task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(done) = task {
            // Answers once the checkpoint's thread let go of its handles (the sender dropped,
            // never sent): on that thread, whatever runtime this is and whichever started it.
            drop(done.await);
        }
        let readers = match Arc::try_unwrap(self.readers) {
            Ok(r) => r.conns.into_vec(),
            // Not expected: a checkpoint's thread lets go of its clone before `done` answers,
            // and one that could not start dropped it with its closure. Should a clone live on,
            // dropping closes them.
            Err(_) => Vec::new(),
        };
        for r in readers {
            if let Err(e) = r.into_inner().close().await {
                tracing::warn!(path = %self.path.display(), error = %awareness_core::error::ErrorChain(&e), "closing a reader");
            }
        }
        // A batch or the rollback of a cancelled write may still hold the connection on a task
        // of its own: the lock waits for it, then the connection is taken out and closed.
        let writer = match &self.writer {
            Some(slot) => slot.lock().await.take(),
            None => None,
        };
        if let Some(mut w) = writer {
            if w.open_tx {
                w.rollback().await;
            }
            // Closing the last connection would checkpoint, but another handle's connections
            // may still be closing in the background (a handle dropped, not closed): copy the
            // log into the file now, without waiting for readers (PASSIVE), so that the file
            // holds every commit unless a reader still pins an older snapshot.
            let checkpoint = sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(PASSIVE)")
                .fetch_all(&mut w.conn)
                .await;
            if let Err(e) = checkpoint {
                tracing::warn!(path = %self.path.display(), error = %awareness_core::error::ErrorChain(&e), "checkpoint at close");
            }
            if let Err(e) = w.conn.close().await {
                tracing::warn!(path = %self.path.display(), error = %awareness_core::error::ErrorChain(&e), "closing the writer");
            }
        }
    }

    /// The event rows numbered 0 or below, or `None` when there are none (a search of the
    /// key). OpenClaw's table takes such a number (its key is SQLite's, which takes any number
    /// a writer gives), though neither OpenClaw nor this store ever gives one. No read returns
    /// such a row: every read of events starts above 0, and `changes_since` and `log_stats`
    /// answer over the rows above 0. Pruning deletes them in their turn, by age or first under
    /// the row cap. This is the probe an audit needs to report them (the shared audit has no
    /// way to them yet: it reads through the store traits, which return no such row).
    pub async fn events_numbered_below_one(&self) -> Result<Option<EventsBelowOne>, StoreError> {
        const WHAT: &str = "count the events numbered 0 or below";
        let found = async {
            let row = self
                .read_one(sqlx::query(sql::EVENTS_BELOW_ONE), WHAT)
                .await?;
            let rows: i64 = get(&row, 0, WHAT)?;
            let lowest: Option<i64> = get(&row, 1, WHAT)?;
            Ok(lowest.map(|lowest| EventsBelowOne {
                rows: u64::try_from(rows).unwrap_or_default(),
                lowest,
            }))
        };
        self.named(found.await)
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// deletes one event row and nothing else (no watermark, no head change), as an operator
    /// repairing a store by hand would. Returns whether the row existed. The conformance suite uses
    /// it to prove that history gaps come only from pruning.
    #[doc(hidden)]
    pub async fn delete_event_row(&self, sequence: Sequence) -> Result<bool, StoreError> {
        let q = sqlx::query(sql::DELETE_EVENT_ROW).bind(int(sequence));
        self.write_changed("delete an event row", q).await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// deletes one session's head row and nothing else (its events and the cursors on it stay), as
    /// a hand edit could leave the file. Returns whether the row existed. The conformance suite
    /// uses it to check that pruning never creates a head, and the durable suite to check what the
    /// audit reports.
    #[doc(hidden)]
    pub async fn delete_head_row(&self, session: &SessionRef) -> Result<bool, StoreError> {
        self.edit_session_row(sql::DELETE_HEAD_ROW, session, "delete a head row")
            .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// overwrites one event row so that it no longer reads as an event (its actor type becomes one
    /// no version knows, and its `fields_json` is cleared so reads fall back to the columns), as a
    /// torn write or another writer could leave it; its dedupe key stays taken and its head stays.
    /// Returns whether the row existed. The durable suite uses it to check what a recording does on
    /// meeting such a row.
    #[doc(hidden)]
    pub async fn damage_event_row(&self, sequence: Sequence) -> Result<bool, StoreError> {
        let q = sqlx::query(sql::DAMAGE_EVENT_ROW).bind(int(sequence));
        self.write_changed("damage an event row", q).await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// overwrites one cursor row so that it no longer reads as a cursor (its target agent becomes
    /// empty, which no agent id may be), as a torn write or another writer could leave it. Returns
    /// whether the row existed. The durable suite uses it to check that such a row stops nothing
    /// that reads many cursors.
    #[doc(hidden)]
    pub async fn damage_cursor_row(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(sql::DAMAGE_CURSOR_ROW)
            .bind(watcher.as_str().to_owned())
            .bind(target.as_str().to_owned());
        self.write_changed("damage a cursor row", q).await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// overwrites one upstream link row so that it no longer reads as a link (its marker becomes
    /// text that is not JSON), as a torn write or another writer could leave it. Returns whether
    /// the row existed. The durable suite uses it to check that such a row stops no other link's
    /// monitoring.
    #[doc(hidden)]
    pub async fn damage_link_row(&self, session: &SessionRef) -> Result<bool, StoreError> {
        self.edit_session_row(sql::DAMAGE_LINK_ROW, session, "damage an upstream link row")
            .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// overwrites one upstream link row's thread id with text that is not UTF-8 (SQLite stores such
    /// bytes as they are), as a hand edit by a tool that does not check could leave it. Returns
    /// whether the row existed. The durable suite uses it to check that such a row is unreadable
    /// alone.
    #[doc(hidden)]
    pub async fn spoil_link_text(&self, session: &SessionRef) -> Result<bool, StoreError> {
        self.edit_session_row(
            sql::SPOIL_LINK_TEXT,
            session,
            "spoil an upstream link's text",
        )
        .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// appends a byte that is not UTF-8 to one upstream link row's session key, as
    /// [`SqliteStore::spoil_link_text`] does to its thread id, so that the row no longer answers
    /// to `session`. Returns whether the row existed.
    #[doc(hidden)]
    pub async fn spoil_link_key(&self, session: &SessionRef) -> Result<bool, StoreError> {
        self.edit_session_row(sql::SPOIL_LINK_KEY, session, "spoil an upstream link's key")
            .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// appends a byte that is not UTF-8 to one cursor row's target agent, as a hand edit by a tool
    /// that does not check could leave it. Returns whether the row existed. The durable suite uses
    /// it to check that such a row is unreadable alone.
    #[doc(hidden)]
    pub async fn spoil_cursor_text(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(sql::SPOIL_CURSOR_TEXT)
            .bind(watcher.as_str().to_owned())
            .bind(target.as_str().to_owned());
        self.write_changed("spoil a cursor's text", q).await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// marks one cursor row ambient (`provenance = 'ambient-group'`), as OpenClaw writes its
    /// ambient watch of a group's sessions. Returns whether the row existed. The conformance suite
    /// uses it to check that every write keeps an ambient cursor ambient (its notices queue-only)
    /// until a watch makes it explicit.
    #[doc(hidden)]
    pub async fn make_ambient(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(sql::MAKE_AMBIENT)
            .bind(watcher.as_str().to_owned())
            .bind(target.as_str().to_owned());
        self.write_changed("mark a cursor ambient", q).await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// gives one cursor row a provenance this version does not know (`ambient-channel`), as a
    /// later version's writer could. Returns whether the row existed. The conformance suite uses
    /// it to check that such a row is read as unreadable, not as a watch of some kind.
    #[doc(hidden)]
    pub async fn spoil_cursor_provenance(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(sql::SPOIL_CURSOR_PROVENANCE)
            .bind(watcher.as_str().to_owned())
            .bind(target.as_str().to_owned());
        self.write_changed("give a cursor an unknown provenance", q)
            .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// appends a byte that is not UTF-8 to one cursor row's watcher key, as
    /// [`SqliteStore::spoil_cursor_text`] does to its target agent.
    #[doc(hidden)]
    pub async fn spoil_cursor_watcher(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(sql::SPOIL_CURSOR_WATCHER)
            .bind(watcher.as_str().to_owned())
            .bind(target.as_str().to_owned());
        self.write_changed("spoil a cursor's watcher key", q).await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// appends a byte that is not UTF-8 to one head row's agent, as
    /// [`SqliteStore::spoil_cursor_text`] does to a cursor's.
    #[doc(hidden)]
    pub async fn spoil_head_text(&self, session: &SessionRef) -> Result<bool, StoreError> {
        self.edit_session_row(sql::SPOIL_HEAD_TEXT, session, "spoil a head's text")
            .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// appends a byte that is not UTF-8 to one event row's session key, as
    /// [`SqliteStore::spoil_cursor_text`] does to a cursor's.
    #[doc(hidden)]
    pub async fn spoil_event_text(&self, sequence: Sequence) -> Result<bool, StoreError> {
        let q = sqlx::query(sql::SPOIL_EVENT_TEXT).bind(int(sequence));
        self.write_changed("spoil an event's text", q).await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// overwrites one head row so that it can no longer be read (a negative last sequence, which no
    /// writer stores), as a torn write or another writer could leave it. Returns whether the row
    /// existed. The durable suite uses it to check that such a row stops no listing of the other
    /// heads.
    #[doc(hidden)]
    pub async fn damage_head_row(&self, session: &SessionRef) -> Result<bool, StoreError> {
        self.edit_session_row(sql::DAMAGE_HEAD_ROW, session, "damage a head row")
            .await
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// moves the AUTOINCREMENT counter of the events (`sqlite_sequence`) forward so that exactly
    /// `left` more sequences can be handed out (to new events, or to dedupe hits, which consume one
    /// too) before it reaches `i64::MAX`, SQLite's last rowid, as a hand edit or another writer
    /// could leave it; touches nothing else. Returns whether it could: `false` when the counter or
    /// a stored event is already past that point (it never goes back). The conformance suite uses
    /// it to check what recording does once the counter is at its end.
    #[doc(hidden)]
    pub async fn leave_sequences(&self, left: u64) -> Result<bool, StoreError> {
        let Some(at) = i64::try_from(left)
            .ok()
            .and_then(|left| i64::MAX.checked_sub(left))
        else {
            return Ok(false);
        };
        let q = sqlx::query(sql::LEAVE_SEQUENCES).bind(at);
        self.write_changed("move the sequence counter", q).await
    }

    /// Runs `statements` (a row helper's transaction, `$1` the session key and `$2` its agent,
    /// ending with `SELECT changes()`); answers whether it changed a row.
    async fn edit_session_row(
        &self,
        statements: &'static str,
        session: &SessionRef,
        what: &str,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(statements)
            .bind(session.session_key.as_str().to_owned())
            .bind(session.agent_id.as_str().to_owned());
        self.write_changed(what, q).await
    }

    /// Runs `q` (a transaction whose last statement selects `changes()`) on the write
    /// connection; answers whether it changed a row. Its error names the file.
    pub(crate) async fn write_changed(&self, what: &str, q: Query) -> Result<bool, StoreError> {
        let mut w = self.writer(what).await?;
        let res = async {
            let row = batch_one(&mut w.conn, q, what).await?;
            Ok(get::<i64>(&row, 0, what)? > 0)
        }
        .await;
        self.named(w.finish(res).await)
    }

    async fn writer(&self, what: &str) -> Result<WriteGuard, StoreError> {
        let mut g = WriteGuard::lock(self.write_connection(what)?).await;
        self.begin_write(&mut g).await;
        Ok(g)
    }

    /// `r`, its error said of this store's file ([`StoreError::in_store`]): what every method
    /// of the store traits returns, so that a failure names the file.
    fn named<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        r.map_err(|e| e.in_store(&self.path))
    }

    /// The write connection's lock, or the error of a read-only handle.
    fn write_connection(&self, what: &str) -> Result<&Arc<WriteSlot>, StoreError> {
        self.writer.as_ref().ok_or_else(|| StoreError::ReadOnly {
            path: self.path.clone(),
            operation: what.to_owned(),
        })
    }

    /// Readies the locked write connection for an operation: rolls back what an interrupted one
    /// left open and counts the write towards the next checkpoint.
    async fn begin_write(&self, w: &mut Writer) {
        if w.open_tx {
            w.rollback().await;
        }
        w.begin();
        self.count_write(1);
    }

    /// Write operations this handle has begun on its write connection since it was opened: one
    /// per recording made alone (a recording of a failed group commit retried alone included;
    /// one whose one-batch attempt found its target watched after all commits an empty
    /// transaction before its two batches, and is still counted once),
    /// one per group commit however many recordings it holds, one per
    /// other write call (a pruning chunk counts each of its transactions). Shows how well group
    /// commit batches.
    pub fn write_transactions(&self) -> u64 {
        self.write_ops.load(Ordering::Relaxed)
    }

    /// The most recordings one write transaction of this handle has held since it was opened
    /// (0 before the first recording): at most [`SqliteOptions::group_commit`]. With
    /// [`SqliteStore::write_transactions`], shows how well group commit batches.
    pub fn largest_batch(&self) -> usize {
        self.largest_batch.load(Ordering::Relaxed)
    }

    async fn reader(&self) -> conn::Reader<'_> {
        self.readers.get().await
    }

    /// Counts a write transaction of `weight` and, every [`CHECKPOINT_EVERY`], starts a
    /// PASSIVE checkpoint on a reader connection in the background, so that the cost of copying
    /// the WAL into the file (and its fsync) never lands on a recording.
    ///
    /// The checkpoint runs on a thread of its own, which drives it to the end (sqlx's SQLite
    /// connections answer from their own threads and need no runtime), not on a task of the
    /// caller's runtime: [`SqliteStore::close`] waits for it, and a task of a current-thread
    /// runtime that is alive but no longer driven (a handle used from several runtimes, as
    /// tests and one-shot tools do) never finished, so `close` from another runtime waited for
    /// ever. It also runs now where no tokio runtime is (it was skipped there, and left to the
    /// writer's own autocheckpoint), and no longer stops when the runtime that started it shuts
    /// down. Where no thread can be started, the writer's own autocheckpoint (a larger safety
    /// net) does it.
    fn count_write(&self, weight: u32) {
        let n = self
            .writes_since_checkpoint
            .fetch_add(weight, Ordering::Relaxed)
            + weight;
        if n < CHECKPOINT_EVERY || self.checkpointing.swap(true, Ordering::AcqRel) {
            return;
        }
        self.writes_since_checkpoint.store(0, Ordering::Relaxed);
        let readers = Arc::clone(&self.readers);
        let writer = self.writer.clone();
        let flag = Arc::clone(&self.checkpointing);
        let path = self.path.clone();
        // Started and stored under one lock: a checkpoint started and stored in two steps
        // could finish, and a later one be started and stored, in between, and this one's
        // receiver would then replace the later one's, which `close` would not wait for.
        let mut slot = self
            .checkpoint_task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        // Cleared however the checkpoint ends, its thread never started included: a flag left
        // set would keep this handle from checkpointing in the background again. Made here,
        // moved into the thread.
        let clears = ClearOnDrop(flag);
        let thread_path = path.clone();
        let started = std::thread::Builder::new()
            .name("store-sqlite-checkpoint".into())
            .spawn(move || {
                // Dropped in the reverse order, a panic included: the checkpoint (and with it
                // the handles of the connections) first, then the flag, then the sender, which
                // tells `close` that the connections are its alone.
                let done = done;
                let clears = clears;
                let shown = thread_path.clone();
                let checkpoint = async move {
                    readers.checkpoint(&thread_path, writer.as_deref()).await;
                };
                match tokio::runtime::Builder::new_current_thread().build() {
                    Ok(rt) => rt.block_on(checkpoint),
                    Err(e) => {
                        drop(checkpoint);
                        tracing::warn!(path = %shown.display(), error = %awareness_core::error::ErrorChain(&e), "cannot run a background checkpoint");
                    }
                }
                drop(clears);
                drop(done);
            });
        match started {
            Ok(_) => *slot = Some(finished),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %awareness_core::error::ErrorChain(&e), "cannot start a background checkpoint");
            }
        }
    }

    /// Runs a one-row read on a reader connection.
    async fn read_one(&self, q: Query, what: &str) -> Result<SqliteRow, StoreError> {
        let mut conn = self.reader().await;
        batch_one(&mut conn, q, what).await
    }

    /// `PRAGMA data_version` of one fixed connection of this handle: SQLite changes it when a
    /// commit by any other connection to the file becomes visible to that one (and when another
    /// process's RESTART or TRUNCATE checkpoint starts the WAL over: a question too many, never
    /// one too few). The write connection's (a read-only handle's first reader's) is taken,
    /// since the value of one connection means nothing to another; this handle's own commits
    /// are all made on the write connection, so they never change it, and its own checkpoints
    /// are PASSIVE ones on its readers.
    pub(crate) async fn data_version(&self) -> Result<u64, StoreError> {
        if let Some(slot) = &self.writer {
            commit_poll::writer_data_version(slot).await
        } else {
            let mut conn = self.readers.conns[0].lock().await;
            commit_poll::data_version(&mut conn).await
        }
    }

    /// The hints of [`EventStore::commit_hints`](awareness_core::EventStore::commit_hints),
    /// the poller started at the first call.
    pub(crate) fn subscribe_commit_hints(&self) -> Box<dyn awareness_core::CommitHints> {
        self.poller.subscribe(|| commit_poll::Setup {
            options: self.poll_options.clone(),
            writer: self.writer.as_ref().map(Arc::downgrade),
            interval: self.poll_interval,
            path: Arc::from(self.path.as_path()),
            file: self.file.clone(),
        })
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any
    /// time): asks the commit poller (started by
    /// [`EventStore::commit_hints`](awareness_core::EventStore::commit_hints)) for a poll now
    /// and waits for it to end; `false` when no poller runs.
    #[doc(hidden)]
    pub async fn poll_commits_now(&self) -> bool {
        match self.poller.poll_now() {
            Some(done) => done.await.is_ok(),
            None => false,
        }
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any
    /// time): what the commit poller has done (zeros before it starts).
    #[doc(hidden)]
    pub fn commit_polls(&self) -> commit_poll::CommitPolls {
        self.poller.counts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use awareness_core::EventStore as _;

    /// Between an idle-cursor round's choice and its write.
    pub(crate) static BETWEEN_CHOICE_AND_DELETE: awareness_core::testkit::pause::Pause =
        awareness_core::testkit::pause::Pause::new();

    /// As a new store's creation begins (`open::create`).
    pub(crate) static CREATING: awareness_core::testkit::pause::Pause =
        awareness_core::testkit::pause::Pause::new();

    /// Inside a poll of the commit poller, before it reads the number (`commit_poll::poll`).
    pub(crate) static IN_A_POLL: awareness_core::testkit::pause::Pause =
        awareness_core::testkit::pause::Pause::new();

    /// Before each event a failed group commit records alone (`group::record_batch`).
    pub(crate) static BEFORE_AN_EVENT_OF_A_FAILED_BATCH: awareness_core::testkit::pause::Pause =
        awareness_core::testkit::pause::Pause::new();

    /// Makes the next `Writer::rollback` on the store at this path fail (a test-only helper,
    /// review of stop 69, S903).
    pub(crate) static FAIL_THE_NEXT_ROLLBACK: std::sync::Mutex<Option<std::path::PathBuf>> =
        std::sync::Mutex::new(None);

    /// A write that failed inside its transaction, rolled back, leaves the write connection
    /// known to be outside any transaction: the next writer does not roll back again, nor does
    /// the guard's drop on a thread of its own. (What the mutation did: `open_tx` stayed set
    /// after a successful ROLLBACK, and every such failure was followed by a needless second
    /// rollback on a new thread, logged as a cancelled write; review of stop 69, S920.)
    #[tokio::test]
    async fn a_failed_write_rolled_back_leaves_no_transaction_open() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("t.db"))
            .await
            .expect("open");
        let mut w = WriteGuard::lock(store.writer.as_ref().expect("a handle that writes")).await;
        w.begin();
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut w.conn)
            .await
            .expect("begin");
        let failed: Result<(), _> = w
            .finish(Err(StoreError::backend(
                "a write that failed midway",
                std::io::Error::other("its own failure"),
            )))
            .await;
        assert!(failed.is_err(), "the failure is passed on");
        assert!(!w.open_tx, "the rollback ended the transaction");
        drop(w);
        store.close().await;
    }

    /// A batch that panics is dropped as soon as the panic is caught (its callers' answers
    /// dropped with it, so each is told at once that it stopped, and its transaction rolled
    /// back), not kept to be resumed. (What the mutation did: the panicked batch was kept,
    /// handed on drop to a thread of its own that polled it again, and logged a second panic;
    /// review of stop 69, S907.)
    #[tokio::test]
    async fn a_batch_that_panics_is_dropped_at_once() {
        /// A batch that panics when polled, holding its caller's answer until it is dropped.
        struct Panics(#[allow(dead_code)] tokio::sync::oneshot::Sender<()>);
        impl Future for Panics {
            type Output = ();
            fn poll(
                self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<()> {
                panic!("this batch panics")
            }
        }
        let (reply, mut answer) = tokio::sync::oneshot::channel::<()>();
        let mut batch =
            group::Unfinished::new(Panics(reply), Arc::from(std::path::Path::new("t.db")));
        batch.run().await;
        assert!(
            matches!(
                answer.try_recv(),
                Err(tokio::sync::oneshot::error::TryRecvError::Closed)
            ),
            "the batch, and its caller's answer, dropped once the panic was caught"
        );
        drop(batch);
    }

    /// Records an event under the dedupe key "torn" and tears its row, as the durable suite
    /// damages one: a later recording under that key fails.
    async fn tear_a_row_under_torn(store: &SqliteStore) {
        use awareness_core::testkit::group_commit::{T0, event};
        let torn = store
            .record(event(9).with_dedupe_key("torn"), T0)
            .await
            .expect("record")
            .event
            .sequence;
        assert!(
            store.damage_event_row(torn).await.expect("damage"),
            "a torn row"
        );
    }

    /// Three recordings queued in turn behind a write connection the caller holds, the one of
    /// index `torn` under the dedupe key "torn": let go of, they make one batch that fails on
    /// the torn row, whose events are then recorded alone in the order they were queued.
    async fn a_batch_of_three_behind_torn(
        store: &Arc<SqliteStore>,
        torn: usize,
    ) -> Vec<tokio::task::JoinHandle<Result<awareness_core::Recorded, StoreError>>> {
        use awareness_core::testkit::group_commit::{T0, event};
        let mut tasks = Vec::new();
        for (i, queued) in (0..3).zip(1u64..) {
            let s = Arc::clone(store);
            let e = if i == torn {
                event(i).with_dedupe_key("torn")
            } else {
                event(i)
            };
            tasks.push(tokio::spawn(async move { s.record(e, T0).await }));
            while store.next_job.load(Ordering::SeqCst) < queued {
                tokio::task::yield_now().await;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        tasks
    }

    /// A batch that failed for one of its events (a dedupe hit on a torn row) records its events
    /// one at a time; when one of them meets another connection's lock, the events after it fail at
    /// once with that error, instead of each waiting the busy timeout in turn (and recording, here,
    /// once the lock is let go of). (What the mutation did: the loop went on after the lock, every
    /// event after it waited the busy timeout, or was recorded after an earlier one had failed;
    /// review of stop 63, Q09.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_an_event_of_a_failed_batch_meets_the_lock_the_rest_fail_at_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("t.db");
        let options = SqliteOptions::new()
            .group_commit(64)
            .busy_timeout(Duration::from_millis(300));
        let store = Arc::new(SqliteStore::open_with(&file, options).await.expect("open"));
        let mut raw = SqliteConnectOptions::new()
            .filename(&file)
            .connect()
            .await
            .expect("a connection of its own");
        // A torn row under the dedupe key "torn", as the durable suite damages one.
        tear_a_row_under_torn(&store).await;
        // The write connection held, so that the three recordings queue and make one batch.
        let held = WriteGuard::lock(store.writer.as_ref().expect("a handle that writes")).await;
        let tasks = a_batch_of_three_behind_torn(&store, 0).await;
        let (reached, go) = BEFORE_AN_EVENT_OF_A_FAILED_BATCH.arm(&store.path);
        drop(held);
        // The batch failed on the torn row; before its first event alone, another connection
        // takes the lock.
        reached.notified().await;
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut raw)
            .await
            .expect("take the lock");
        go.notify_one();
        // Should a later event be tried alone all the same, the lock is let go of first.
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let release = tokio::spawn(async move {
            tokio::select! {
                () = reached.notified() => {
                    BEFORE_AN_EVENT_OF_A_FAILED_BATCH.disarm();
                    sqlx::raw_sql("ROLLBACK").execute(&mut raw).await.expect("let go");
                    go.notify_one();
                }
                _ = finished => {
                    sqlx::raw_sql("ROLLBACK").execute(&mut raw).await.expect("let go");
                }
            }
            raw.close().await.expect("close");
        });
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.expect("join"));
        }
        drop(done);
        release.await.expect("join");
        BEFORE_AN_EVENT_OF_A_FAILED_BATCH.disarm();
        assert_eq!(
            store.largest_batch(),
            3,
            "one batch of three (else this shows nothing)"
        );
        assert!(
            results.iter().all(Result::is_err),
            "no event after the one that met the lock was recorded: {results:?}"
        );
        assert!(
            results
                .iter()
                .filter(|r| r.as_ref().is_err_and(StoreError::is_retryable))
                .count()
                >= 2,
            "the lock's error, for the event that met it and those after: {results:?}"
        );
    }

    /// A batch whose rollback failed (its transaction left open) has its events recorded one
    /// at a time all the same: the first of them rolls back what was left open before it
    /// begins, and is recorded. (What the mutation did: that rollback was skipped, and the first
    /// event failed on SQLite's "cannot start a transaction within a transaction", for nothing
    /// of its own; review of stop 69, S903.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_batch_whose_rollback_failed_records_its_first_event() {
        let dir = tempfile::tempdir().expect("temp dir");
        let options = SqliteOptions::new().group_commit(64);
        let store = Arc::new(
            SqliteStore::open_with(dir.path().join("t.db"), options)
                .await
                .expect("open"),
        );
        tear_a_row_under_torn(&store).await;
        let held = WriteGuard::lock(store.writer.as_ref().expect("a handle that writes")).await;
        // The torn row's recording last: the first event recorded alone is a sound one.
        let tasks = a_batch_of_three_behind_torn(&store, 2).await;
        *FAIL_THE_NEXT_ROLLBACK.lock().expect("the helper") = Some(store.path.clone());
        drop(held);
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.expect("join"));
        }
        assert!(
            FAIL_THE_NEXT_ROLLBACK
                .lock()
                .expect("the helper")
                .take()
                .is_none(),
            "the batch's rollback failed (else this shows nothing)"
        );
        assert_eq!(
            store.largest_batch(),
            3,
            "one batch of three (else this shows nothing)"
        );
        assert!(
            results[0].is_ok() && results[1].is_ok() && results[2].is_err(),
            "only the torn row's caller fails: {results:?}"
        );
    }

    /// An open that finds no file and begins to create the store, while another opener makes
    /// it meanwhile and has it open (its log and index beside it), opens that store instead of
    /// failing: the log and index are the other opener's, not ones a deleted database left, and
    /// the store linked there first is the one both use, without a warning. (What the mutations
    /// did: the log beside a path no longer empty was refused as a stray one, S627; or the link's
    /// "already exists" was taken for a file system without hard links, warned of as such;
    /// review of stop 67, S626.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_another_opener_made_meanwhile_is_opened() {
        use awareness_core::testkit::group_commit::{T0, event};
        let capture = awareness_core::testkit::logs::Capture::warnings();
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("t.db");
        let (reached, go) = CREATING.arm(&file);
        let opening = tokio::spawn(SqliteStore::open(file.clone()));
        reached.notified().await;
        CREATING.disarm();
        let other = SqliteStore::open(&file).await.expect("the other opener");
        other.record(event(0), T0).await.expect("record");
        go.notify_one();
        let store = opening
            .await
            .expect("join")
            .expect("the store the other opener made opens");
        let log = store
            .events_after(awareness_core::Sequence::ZERO, 10)
            .await
            .expect("log");
        assert_eq!(log.len(), 1, "the other opener's store: {log:?}");
        store.close().await;
        other.close().await;
        assert_eq!(
            capture.said(&[
                "cannot link the new store into place",
                &file.display().to_string()
            ]),
            0,
            "another opener's store in place is no failure to link: {:?}",
            capture.lines()
        );
    }

    /// `close` returns once the commit poller has closed its connection, also when a poll is
    /// under way: it waits for that poll to end. A process that exits right after `close` (the
    /// CLI) otherwise left the poller's connection open, and the log beside the file if that
    /// connection was the last. (What the mutation did: `close` stopped the poller without
    /// waiting for it; review of stop 67, S608.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn close_waits_for_a_poll_under_way() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("t.db");
        let options = SqliteOptions::new().commit_hint_interval(Duration::MAX);
        let store = SqliteStore::open_with(&file, options).await.expect("open");
        let _hints = store.commit_hints().expect("hints");
        assert!(store.poll_commits_now().await, "the poller has begun");
        let (reached, go) = IN_A_POLL.arm(&store.path);
        let polled = store.poller.poll_now().expect("the poller runs");
        reached.notified().await;
        let closing = tokio::spawn(store.close());
        // Bounded, and only a broken close can end it: the poll is held until let go below.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let closed_early = closing.is_finished();
        IN_A_POLL.disarm();
        go.notify_one();
        closing.await.expect("join");
        drop(polled.await);
        assert!(
            !closed_early,
            "close returned while the poller was still polling on its connection"
        );
    }

    /// `close` waits for a background checkpoint under way (here waiting for a reader the test
    /// holds) before it closes the connections and returns, as documented: a process that exits
    /// right after `close` would otherwise cut the checkpoint off, and the last close would not
    /// be `close`'s. (What the mutation did: `close` dropped the checkpoint's receiver without
    /// waiting for it; review of stop 68, S742.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn close_waits_for_a_background_checkpoint_under_way() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = fresh(&dir).await;
        let readers = Arc::clone(&store.readers);
        let held: Vec<_> = [readers.get().await, readers.get().await].into();
        store.count_write(CHECKPOINT_EVERY);
        let closing = tokio::spawn(store.close());
        // Bounded, and only a broken close can end it: the checkpoint waits for the readers
        // held until let go below.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let closed_early = closing.is_finished();
        drop(held);
        closing.await.expect("join");
        drop(readers);
        assert!(
            !closed_early,
            "close returned while a background checkpoint was still under way"
        );
    }

    /// A group commit that failed for one of its events (a dedupe hit on a torn row) and is
    /// recorded again event by event counts one write transaction for the batch and one for
    /// each event recorded alone, as `write_transactions` documents ("a recording of a failed
    /// group commit retried alone included"). (What the mutation did: the events recorded alone
    /// were not begun as write operations, neither counted nor marked open for a rollback should
    /// the batch be dropped midway; review of stop 67, S613.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_event_of_a_failed_batch_recorded_alone_is_a_write_transaction() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("t.db");
        let options = SqliteOptions::new().group_commit(64);
        let store = Arc::new(SqliteStore::open_with(&file, options).await.expect("open"));
        tear_a_row_under_torn(&store).await;
        // The write connection held, so that the three recordings queue and make one batch.
        let held = WriteGuard::lock(store.writer.as_ref().expect("a handle that writes")).await;
        let before = store.write_transactions();
        let tasks = a_batch_of_three_behind_torn(&store, 0).await;
        drop(held);
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.expect("join"));
        }
        assert_eq!(
            store.largest_batch(),
            3,
            "one batch of three (else this shows nothing)"
        );
        assert_eq!(
            results.iter().filter(|r| r.is_ok()).count(),
            2,
            "the torn hit alone failed: {results:?}"
        );
        assert_eq!(
            store.write_transactions() - before,
            4,
            "the failed batch, then each of its three events alone"
        );
    }

    /// A pruning chunk deletes at most 250 rows ([`PRUNE_TX_ROWS`]) per write transaction, by age
    /// and by the row cap, so that a recording waits behind one transaction, not the chunk.
    /// (A review of stop 55 raised the bound to a million and every test passed: the shared
    /// checks compare what a chunk leaves, which one transaction leaves too.)
    #[tokio::test]
    async fn a_pruning_chunk_commits_at_most_its_bound_of_rows_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("s.sqlite"))
            .await
            .unwrap();
        // The bound the docs state (the trait's, this crate's), not the constant it is kept in.
        awareness_core::testkit::checks::a_pruning_chunk_commits_at_most_its_bound_at_a_time(
            &store,
            250,
            || store.write_transactions(),
        )
        .await;
    }

    /// A background checkpoint started inside a runtime that then shuts down (a handle used
    /// from several runtimes, as tests and one-shot tools do) runs to its end all the same, on
    /// its own thread, and leaves the handle able to checkpoint again: once it is over, its flag
    /// is clear, and the next one starts. (It ran on a task of that runtime, and was dropped
    /// with it; the flag it left set then kept every later one from starting.)
    #[test]
    fn a_checkpoint_dropped_with_its_runtime_does_not_stop_later_ones() {
        let dir = tempfile::tempdir().unwrap();
        let opener = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store = opener
            .block_on(SqliteStore::open(dir.path().join("s.sqlite")))
            .unwrap();
        let take = |store: &SqliteStore| {
            store
                .checkpoint_task
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take()
        };
        let gone = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        {
            let _in = gone.enter();
            store.count_write(CHECKPOINT_EVERY);
        }
        drop(gone);
        let first = take(&store).expect("one started");
        opener.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), first)
                .await
                .expect("the checkpoint ends although its runtime is gone")
                .expect_err("its thread drops the sender, never sends");
        });
        assert!(
            !store.checkpointing.load(Ordering::Acquire),
            "the checkpoint that ended is not taken as running"
        );
        store.count_write(CHECKPOINT_EVERY);
        assert!(take(&store).is_some(), "the next one started");
        opener.block_on(store.close());
    }

    /// `close` does not wait for a runtime nobody drives: a handle whose 256th write started
    /// its background checkpoint inside one current-thread runtime's `block_on`, which then
    /// returned (the runtime alive, never driven again), closes from another runtime. The
    /// checkpoint ran on a task of the first runtime, which `close` awaited for ever. (The
    /// timeout, on the real clock, only keeps a regression from hanging.)
    #[test]
    fn close_does_not_wait_for_a_runtime_nobody_drives() {
        use awareness_core::{ActorType, EventKind, NewEvent, Timestamp};
        let dir = tempfile::tempdir().expect("temp dir");
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let store = first.block_on(async {
            let store = SqliteStore::open(dir.path().join("t.db"))
                .await
                .expect("open");
            let session = SessionRef::parse("agent:main:subagent:c", "main").expect("ref");
            for i in 0..CHECKPOINT_EVERY {
                let e = NewEvent::new(
                    session.clone(),
                    EventKind::HumanDirectMessage,
                    ActorType::Human,
                    format!("message {i}"),
                );
                store.record(e, Timestamp(1)).await.expect("record");
            }
            store
        });
        assert!(
            store
                .checkpoint_task
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_some(),
            "the 256th write started a checkpoint"
        );
        let second = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let closed = second
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), store.close()).await });
        assert!(
            closed.is_ok(),
            "close waited 30 s for a checkpoint on a runtime nobody drives"
        );
        drop(first);
    }

    /// A batch holding other callers' events, started inside a current-thread runtime that
    /// then shuts down before its task ran, is finished all the same on a thread of its own:
    /// the other callers get their events. Dropped with the runtime, the task told them the
    /// group commit stopped, their outcome unknown. (The timeouts, on the real clock, only keep
    /// a regression from hanging.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_whose_runtime_shuts_down_is_finished() {
        use awareness_core::testkit::poll_once;
        use std::sync::mpsc;
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Arc::new(fresh(&dir).await);
        let slot = Arc::clone(store.writer.as_ref().expect("a read-write handle"));
        let held = WriteGuard::lock(&slot).await;
        let (queued, starter_queued) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let starter = std::thread::spawn({
            let store = Arc::clone(&store);
            move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(async {
                    let mut call = Box::pin(store.record(message("starter".to_owned()), T));
                    assert!(
                        !poll_once(call.as_mut()).await,
                        "queued behind the held lock"
                    );
                    queued.send(()).expect("tell the test");
                    released.recv().expect("the lock released");
                    // First in line for the lock: takes every queued event and spawns the
                    // batch's task, which this runtime has not run when it shuts down.
                    assert!(!poll_once(call.as_mut()).await, "the batch is started");
                });
                drop(runtime);
            }
        });
        starter_queued.recv().expect("the starter queued");
        let mut others = Vec::new();
        for i in 0..4 {
            let store = Arc::clone(&store);
            let mut call =
                Box::pin(async move { store.record(message(format!("other {i}")), T).await });
            assert!(!poll_once(call.as_mut()).await, "queued behind the starter");
            others.push(tokio::spawn(call));
        }
        drop(held);
        release.send(()).expect("tell the starter");
        tokio::task::spawn_blocking(move || starter.join())
            .await
            .expect("join")
            .expect("the starter's thread");
        for call in others {
            let got = tokio::time::timeout(Duration::from_secs(30), call)
                .await
                .expect("another caller waited 30 s for a batch whose runtime shut down")
                .expect("join");
            got.expect("another caller's recording");
        }
        assert!(
            store.largest_batch() >= 5,
            "the starter's batch held the others"
        );
        let store = Arc::into_inner(store).expect("the last handle");
        tokio::time::timeout(Duration::from_secs(30), store.close())
            .await
            .expect("close waited 30 s");
    }

    /// A checkpoint round makes its last pass, which holds the write connection, after a quick
    /// pass that left few frames, or after rounds in a row that had none when few frames are
    /// left to copy (checked again by one more pass before the connection is taken): where
    /// every pass is slow, the WAL would otherwise never start over, and where much is left the
    /// write connection would be held for a long copy. A quick pass that left many (one that
    /// could copy nothing, past another reader's old snapshot) made the last pass at once, and
    /// that pass copied them all holding the write connection. The count starts over only once
    /// a last pass is made.
    #[test]
    fn the_last_checkpoint_pass_is_forced_after_rounds_without_it() {
        use conn::LastPass;
        let readers = Readers::new(Vec::new());
        assert_eq!(readers.last_pass(true, true), LastPass::Now);
        readers.last_pass_made();
        assert_eq!(
            readers.last_pass(true, false),
            LastPass::Not,
            "quick, but much left: a round without one"
        );
        readers.last_pass_made();
        for round in 1..conn::ROUNDS_BEFORE_THE_LAST_PASS_IS_FORCED {
            assert_eq!(
                readers.last_pass(false, true),
                LastPass::Not,
                "slow round {round}"
            );
        }
        assert_eq!(
            readers.last_pass(false, false),
            LastPass::Not,
            "not with much left to copy"
        );
        assert_eq!(
            readers.last_pass(false, true),
            LastPass::IfFewLeft,
            "the round that forces it"
        );
        assert_eq!(
            readers.last_pass(false, true),
            LastPass::IfFewLeft,
            "again while none was made (the pass before it left too much)"
        );
        readers.last_pass_made();
        assert_eq!(
            readers.last_pass(false, true),
            LastPass::Not,
            "counting starts over once one is made"
        );
    }

    /// The fourth slow round in a row with few frames left forces the last pass (the crate docs:
    /// "after 4 rounds in a row without a last pass"); a fifth round forcing it passed every
    /// test, whose fourth round had many frames left (review by mutation, stop 59).
    #[test]
    fn the_fourth_slow_round_forces_the_last_pass() {
        use conn::LastPass;
        let readers = Readers::new(Vec::new());
        for _ in 1..conn::ROUNDS_BEFORE_THE_LAST_PASS_IS_FORCED {
            assert_eq!(readers.last_pass(false, true), LastPass::Not);
        }
        assert_eq!(readers.last_pass(false, true), LastPass::IfFewLeft);
    }

    /// A read waits for whichever reader frees first, not for one picked in advance: with one
    /// reader held for long (a checkpoint waiting for the write connection, say), a read goes
    /// on as soon as the other one is let go. (The timeout only keeps a failure from hanging.
    /// One thread: the read has reached its wait for a reader when the test goes on.)
    #[tokio::test]
    async fn a_read_takes_whichever_reader_frees_first() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Arc::new(
            SqliteStore::open_with(dir.path().join("t.db"), SqliteOptions::default().readers(2))
                .await
                .expect("open"),
        );
        let held_long = store.readers.get().await;
        let held_briefly = store.readers.get().await;
        let read = tokio::spawn({
            let store = Arc::clone(&store);
            async move { store.events_after(awareness_core::Sequence::ZERO, 10).await }
        });
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        drop(held_briefly);
        let done = tokio::time::timeout(std::time::Duration::from_secs(30), read).await;
        assert!(
            matches!(done, Ok(Ok(Ok(ref events))) if events.is_empty()),
            "the read waited for the reader still held: {done:?}"
        );
        drop(held_long);
    }

    /// A cursor touched between an idle-cursor round's choice (on a reader) and its write is
    /// no longer idle and stays; the other one chosen goes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cursor_touched_after_the_idle_choice_is_not_pruned() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("t.db"))
            .await
            .expect("open");
        let path = store.path.clone();
        awareness_core::testkit::pause::a_cursor_touched_after_the_idle_choice_is_not_pruned(
            Arc::new(store),
            &BETWEEN_CHOICE_AND_DELETE,
            &path,
        )
        .await;
    }

    /// A pruning transaction of idle cursors or of events counts as a pruning one
    /// (`PRUNE_WEIGHT`) towards the next background checkpoint, as the crate docs say of every
    /// pruning transaction: four of them start one. (What the mutations did: the weight of each
    /// kind dropped to that of any write, and a pruning pass let the log file grow for 256
    /// writes before a checkpoint; review of stop 63, Q03, for idle cursors, and of stop 66,
    /// S507, for events.)
    #[tokio::test]
    async fn four_pruning_transactions_of_either_kind_start_a_checkpoint() {
        use awareness_core::{CursorStore as _, PruneStep, Timestamp};
        const T0: Timestamp = Timestamp(1_800_000_000_000);
        let cutoff = T0.plus_ms(1);
        for step in [PruneStep::Cursors { cutoff }, PruneStep::Age { cutoff }] {
            let dir = tempfile::tempdir().expect("temp dir");
            let store = SqliteStore::open(dir.path().join("t.db"))
                .await
                .expect("open");
            // Four rows to prune: four cursors, or four events (of four writes, which the
            // cursors' watches are too).
            let w = WatcherKey::parse("agent:main:main").expect("watcher");
            for key in ["a", "b", "c", "d"] {
                let target =
                    SessionRef::parse(&format!("agent:main:subagent:{key}"), "main").expect("ref");
                if matches!(step, PruneStep::Cursors { .. }) {
                    store.watch(&w, &target, T0).await.expect("watch");
                } else {
                    store
                        .record(awareness_core::testkit::checks::human(&target), T0)
                        .await
                        .expect("record");
                }
            }
            let checkpoint_started = || {
                store
                    .checkpoint_task
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .is_some()
            };
            let later = T0.plus_ms(2 * Timestamp::DAY_MS);
            for _ in 0..4 {
                assert!(
                    !checkpoint_started(),
                    "{step:?}: fewer than four pruning transactions so far"
                );
                let pruned = store.prune_chunk(&step, 1, later).await.expect("prune");
                assert_eq!(pruned, 1, "{step:?}: one transaction of one row");
            }
            assert!(
                checkpoint_started(),
                "{step:?}: four pruning transactions start a checkpoint"
            );
            store.close().await;
        }
    }

    /// Leaves a transaction open on `store`'s write connection, marked open, as a ROLLBACK that
    /// failed after an interrupted write leaves it.
    async fn leave_a_transaction_open(store: &SqliteStore) {
        let slot = store.writer.as_ref().expect("a read-write handle");
        let mut held = slot.lock().await;
        let w = held.as_mut().expect("the write connection");
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut w.conn)
            .await
            .expect("a transaction left open");
        w.open_tx = true;
    }

    /// Closing a handle whose write connection a failed rollback left inside a transaction
    /// rolls that transaction back before the checkpoint at close, which then copies the log
    /// into the file as after any other write: nothing is warned. (What the mutation did: the
    /// transaction stayed open through the checkpoint, which failed, and close warned
    /// "checkpoint at close"; review of stop 70, SA38.)
    #[tokio::test]
    async fn close_rolls_back_a_transaction_left_open_before_its_checkpoint() {
        let capture = awareness_core::testkit::logs::Capture::warnings();
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("t.db"))
            .await
            .expect("open");
        store
            .record(message("kept".to_owned()), T)
            .await
            .expect("record");
        leave_a_transaction_open(&store).await;
        store.close().await;
        assert_eq!(
            capture.said(&["checkpoint at close"]),
            0,
            "{:?}",
            capture.lines()
        );
    }

    /// A recording that finds a transaction left open on the write connection (a rollback
    /// after an interrupted write failed, which leaves `open_tx` set for the next writer) rolls
    /// it back first and records, through the group-commit queue and with group commit off
    /// alike. (What the mutations did: the queue's path, or `begin_write` that every other
    /// write takes, skipped that rollback, and the recording failed on SQLite's "cannot start a
    /// transaction within a transaction"; review of stop 66, S505, and of stop 68, S737.)
    #[tokio::test]
    async fn a_recording_rolls_back_what_a_failed_rollback_left_open() {
        for group_commit in [64, 1] {
            let dir = tempfile::tempdir().expect("temp dir");
            let store = SqliteStore::open_with(
                dir.path().join("t.db"),
                SqliteOptions::new().group_commit(group_commit),
            )
            .await
            .expect("open");
            leave_a_transaction_open(&store).await;
            let rec = store
                .record(message("after".to_owned()), T)
                .await
                .expect("records over the transaction left open");
            assert_eq!(rec.event.sequence.get(), 1, "group commit {group_commit}");
            store.close().await;
        }
    }

    /// Asking the write connection for its data version (`foreign_commits`, and the commit
    /// poller at each change) first rolls back a transaction a failed rollback left open, as
    /// every write does: SQLite's write lock is let go of there, not kept from every other
    /// connection until this handle's next write. (What the mutation did: the number was read
    /// inside the transaction left open, and another connection met the lock; review of stop
    /// 69, S917.)
    #[tokio::test]
    async fn asking_the_writers_data_version_rolls_back_what_a_failed_rollback_left_open() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("t.db");
        let store = SqliteStore::open_with(&file, SqliteOptions::new())
            .await
            .expect("open");
        leave_a_transaction_open(&store).await;
        store.foreign_commits().await.expect("the data version");
        let mut raw = SqliteConnectOptions::new()
            .filename(&file)
            .busy_timeout(Duration::ZERO)
            .connect()
            .await
            .expect("a connection of its own");
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut raw)
            .await
            .expect("the write lock, let go of once the data version was asked");
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut raw)
            .await
            .expect("let go");
        raw.close().await.expect("close");
        store.close().await;
    }

    /// A background checkpoint starts every 256 write transactions ([`CHECKPOINT_EVERY`]), the
    /// count starting over at each: the write after one has ended starts none. (What the
    /// mutation did: the count was never reset, and once past 256 every write transaction
    /// started a checkpoint of its own; review of stop 66, S523.)
    #[tokio::test]
    async fn the_write_after_a_background_checkpoint_starts_none() {
        use awareness_core::Timestamp;
        const T0: Timestamp = Timestamp(1_800_000_000_000);
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("t.db"))
            .await
            .expect("open");
        let child = SessionRef::parse("agent:main:subagent:a", "main").expect("ref");
        let started = || {
            store
                .checkpoint_task
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take()
        };
        for _ in 0..CHECKPOINT_EVERY {
            store
                .record(awareness_core::testkit::checks::human(&child), T0)
                .await
                .expect("record");
        }
        let first = started().expect("256 write transactions start a checkpoint");
        drop(first.await);
        store
            .record(awareness_core::testkit::checks::human(&child), T0)
            .await
            .expect("record");
        assert!(
            started().is_none(),
            "the write after a checkpoint starts none"
        );
        store.close().await;
    }

    /// The store's own background checkpoint (the pass [`SqliteStore::count_write`] starts every
    /// [`CHECKPOINT_EVERY`] writes, run here directly so that it surely ran, its last pass under
    /// the write connection included) is not another writer's commit: `foreign_commits` keeps
    /// its answer across it, and the next recording starts the WAL over without changing it.
    #[tokio::test]
    async fn the_stores_own_checkpoint_is_no_foreign_commit() {
        use awareness_core::{ActorType, EventKind, EventStore as _, NewEvent, Timestamp};
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("t.db"))
            .await
            .expect("open");
        let session = SessionRef::parse("agent:main:subagent:c", "main").expect("ref");
        let record = async || {
            let e = NewEvent::new(
                session.clone(),
                EventKind::HumanDirectMessage,
                ActorType::Human,
                "a message",
            );
            store.record(e, Timestamp(1)).await.expect("record");
        };
        for _ in 0..20 {
            record().await;
        }
        let before = store.foreign_commits().await.expect("foreign commits");
        assert!(before.is_some(), "store-sqlite answers");
        store
            .readers
            .checkpoint(&store.path, store.writer.as_deref())
            .await;
        assert_eq!(
            store.foreign_commits().await.expect("foreign commits"),
            before
        );
        record().await;
        assert_eq!(
            store.foreign_commits().await.expect("foreign commits"),
            before
        );
        // The checkpoint ran: the WAL started over, and holds the last recording's frames only
        // (twenty-one recordings would have appended well over a hundred).
        let mut conn = sqlx::SqliteConnection::connect(&format!(
            "sqlite://{}",
            dir.path().join("t.db").display()
        ))
        .await
        .expect("another connection");
        let (_, frames, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&mut conn)
            .await
            .expect("the WAL's frames");
        assert!((1..=20).contains(&frames), "{frames} frames in the WAL");
        store.close().await;
    }

    /// A checkpoint round whose pass copied every frame of a large WAL (more than the forced
    /// last pass's bound, 1,024 frames, written by one commit) left nothing to copy: it makes
    /// its last pass, and the rounds without one are counted from 0 again (the next slow round
    /// is the first). (What the mutation
    /// did: the frames left were taken for the WAL's whole length, a WAL past the bound never
    /// had "few left", and no round made its last pass, so under steady writes the WAL never
    /// started over; review of stop 69, S929.)
    #[tokio::test]
    async fn a_pass_that_copied_a_large_wal_leaves_few_frames() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = fresh(&dir).await;
        let mut conn = sqlx::SqliteConnection::connect(&format!(
            "sqlite://{}",
            dir.path().join("t.db").display()
        ))
        .await
        .expect("another connection");
        sqlx::raw_sql("CREATE TABLE pad (x); INSERT INTO pad VALUES (zeroblob(8000000));")
            .execute(&mut conn)
            .await
            .expect("a commit of some 2,000 frames");
        conn.close().await.expect("close");
        // Three slow rounds first: the round below makes its last pass whether its passes are
        // quick or not, when it finds few frames left.
        for _ in 1..conn::ROUNDS_BEFORE_THE_LAST_PASS_IS_FORCED {
            assert_eq!(store.readers.last_pass(false, false), conn::LastPass::Not);
        }
        store
            .readers
            .checkpoint(&store.path, store.writer.as_deref())
            .await;
        assert_eq!(
            store.readers.last_pass(false, true),
            conn::LastPass::Not,
            "the round's last pass was made, and the count started over"
        );
        store.close().await;
    }

    /// A checkpoint round's last pass holds the write connection, so that no write lands
    /// between it and the next write transaction's start of the WAL: while a write has the
    /// connection, the round waits for it. (Three slow rounds counted first, so the round makes
    /// its last pass whether its passes are quick or not. What the mutation did: the last pass
    /// ran without the write connection, and under steady writes the WAL never started over;
    /// review of stop 69, S926.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_last_checkpoint_pass_waits_for_the_write_connection() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Arc::new(fresh(&dir).await);
        store
            .record(message("one".to_owned()), T)
            .await
            .expect("record");
        for _ in 1..conn::ROUNDS_BEFORE_THE_LAST_PASS_IS_FORCED {
            assert_eq!(store.readers.last_pass(false, false), conn::LastPass::Not);
        }
        let held = WriteGuard::lock(store.writer.as_ref().expect("a handle that writes")).await;
        let mut round = tokio::spawn({
            let store = Arc::clone(&store);
            async move {
                store
                    .readers
                    .checkpoint(&store.path, store.writer.as_deref())
                    .await;
            }
        });
        // A bounded wait, which only broken code ends early.
        let early = tokio::time::timeout(Duration::from_millis(500), &mut round).await;
        assert!(
            early.is_err(),
            "the round ended while a write held the write connection"
        );
        drop(held);
        round.await.expect("the round ends once the write is done");
    }

    /// Every connection has the settings DESIGN.md section 6 names (WAL, `synchronous=NORMAL`,
    /// `busy_timeout=5000`) and keeps statement journals and temporary tables in memory (see
    /// `connect_options`), the writer above all.
    #[tokio::test]
    async fn every_connection_has_the_documented_settings() {
        // fetch_all: fetch_one would leave the statement open (see `conn::batch`).
        async fn settings(conn: &mut sqlx::SqliteConnection) -> Vec<String> {
            let mut out = Vec::new();
            for sql in [
                "SELECT 'journal_mode=' || journal_mode FROM pragma_journal_mode",
                "SELECT 'synchronous=' || synchronous FROM pragma_synchronous",
                "SELECT 'busy_timeout=' || timeout FROM pragma_busy_timeout",
                "SELECT 'temp_store=' || temp_store FROM pragma_temp_store",
            ] {
                let got: Vec<String> = sqlx::query_scalar(sql)
                    .fetch_all(&mut *conn)
                    .await
                    .expect(sql);
                out.extend(got);
            }
            out
        }
        // synchronous NORMAL is 1, temp_store MEMORY is 2.
        const EXPECTED: [&str; 4] = [
            "journal_mode=wal",
            "synchronous=1",
            "busy_timeout=5000",
            "temp_store=2",
        ];
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("t.db"))
            .await
            .expect("open");
        let mut w = store.writer("test").await.expect("writer");
        w.open_tx = false;
        assert_eq!(settings(&mut w.conn).await, EXPECTED, "the writer");
        // The writer also bounds the log file a checkpoint leaves at 64 MiB (set with its other
        // pragmas, `sql::WRITER_PRAGMAS`): a log that once grew large stays that large on disk
        // without it. (What the mutation did: the bound was left out, SQLite's default -1;
        // review of stop 70, SA40.)
        let limit: Vec<i64> = sqlx::query_scalar("PRAGMA journal_size_limit")
            .fetch_all(&mut w.conn)
            .await
            .expect("journal_size_limit");
        assert_eq!(limit, [67_108_864], "the writer's journal_size_limit");
        drop(w);
        for r in &*store.readers.conns {
            let mut conn = r.lock().await;
            assert_eq!(settings(&mut conn).await, EXPECTED, "a reader");
        }
        store.close().await;
    }

    /// The time of the counter's-end tests' recordings.
    const T: awareness_core::Timestamp = awareness_core::Timestamp(1_800_000_000_000);

    /// A new store in `dir`, for the counter's-end tests.
    async fn fresh(dir: &tempfile::TempDir) -> SqliteStore {
        SqliteStore::open(dir.path().join("t.db"))
            .await
            .expect("open")
    }

    /// A human message `summary` on one subagent session, for the counter's-end tests.
    fn message(summary: String) -> awareness_core::NewEvent {
        use awareness_core::{ActorType, EventKind, NewEvent, SessionRef};
        let child = SessionRef::parse("agent:main:subagent:c", "main").expect("ref");
        NewEvent::new(
            child,
            EventKind::HumanDirectMessage,
            ActorType::Human,
            summary,
        )
    }

    /// The counter's end is told by the highest number SQLite's AUTOINCREMENT can have handed
    /// out, as SQLite tells it: with the counter's row deleted by hand (SQLite's documented way
    /// to reset it) and an event at `i64::MAX`, a recording is still refused as the counter's
    /// end, not as a full disk.
    #[tokio::test]
    async fn a_counter_row_deleted_by_hand_still_ends_at_the_highest_event() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = fresh(&dir).await;
        let event = || message("message".to_owned());
        assert!(store.leave_sequences(1).await.expect("leave one number"));
        let last = store.record(event(), T).await.expect("the last number");
        assert_eq!(last.event.sequence.get(), i64::MAX as u64);
        let mut w = store.writer("test").await.expect("writer");
        sqlx::raw_sql("DELETE FROM sqlite_sequence")
            .execute(&mut w.conn)
            .await
            .expect("delete the counter's row");
        drop(w);
        let err = store.record(event(), T).await.expect_err("no number left");
        assert!(err.is_counter_at_end(), "{err:?}");
        // With no counter row, a stored event past the point still keeps the counter from
        // being set below it: `leave_sequences` answers that it could not. (What the mutation
        // did: the counter's row was inserted below the highest event and the call answered
        // true; review of stop 71, SC29.)
        assert!(
            !store.leave_sequences(5).await.expect("leave five numbers"),
            "a stored event is past that point: the counter cannot be moved there"
        );
        store.close().await;
    }

    /// A database that is full (SQLite's FULL, here from a `max_page_count` on the write
    /// connection, as a full disk gives it) keeps SQLite's error: only a counter at its end,
    /// which SQLite answers with the same code, is reported as the sequence counter's
    /// ([`crate::error::is_full`] and the check of the counter in `events::record_batch`).
    #[tokio::test]
    async fn a_full_database_is_not_reported_as_the_sequence_counter() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = fresh(&dir).await;
        let mut payload = awareness_core::Payload::new();
        payload.insert("text".into(), "x".repeat(4_000).into());
        let event = |i: usize| message(format!("message {i}")).with_payload(payload.clone());
        // One event first, so that the counter has its row (1): a FULL read as the counter's
        // end whatever the counter says would then be told apart.
        store.record(event(0), T).await.expect("record");
        let mut w = store.writer("test").await.expect("writer");
        w.open_tx = false;
        // SQLite raises it to the pages the database has.
        sqlx::raw_sql("PRAGMA max_page_count = 1")
            .execute(&mut w.conn)
            .await
            .expect("limit the database to the pages it has");
        drop(w);
        let mut err = None;
        for i in 1..100 {
            if let Err(e) = store.record(event(i), T).await {
                err = Some(e);
                break;
            }
        }
        let err = err.expect("a database that may not grow fills up");
        assert!(
            crate::error::is_full(&err),
            "a full database is SQLite's FULL, as a backend error: {err:?}"
        );
        assert!(
            !err.is_counter_at_end(),
            "a full database is not the sequence counter's end: {err}"
        );
        store.close().await;
    }

    /// A database found full by a later statement of a recording, after its insert took the
    /// counter's last number, is a full database, not the counter's end: that number was never
    /// committed, and once there is room it is handed out. (The head's insert is made to fill
    /// the database here by a trigger that writes a large row elsewhere.) (What the mutation
    /// did: the counter was read inside the failed transaction, which still held the insert, so
    /// the error said the sequence counter was at its end; review of stop 66, S501.)
    #[tokio::test]
    async fn a_database_full_after_the_last_number_was_taken_is_not_the_counters_end() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = fresh(&dir).await;
        // Free pages for the event's own insert: large events recorded, then their rows deleted.
        let mut payload = awareness_core::Payload::new();
        payload.insert("text".into(), "x".repeat(4_000).into());
        for i in 0..4 {
            let large = store
                .record(
                    message(format!("large {i}")).with_payload(payload.clone()),
                    T,
                )
                .await
                .expect("record");
            assert!(
                store
                    .delete_event_row(large.event.sequence)
                    .await
                    .expect("delete")
            );
        }
        assert!(store.leave_sequences(1).await.expect("leave one number"));
        let mut w = store.writer("test").await.expect("writer");
        w.open_tx = false;
        sqlx::raw_sql(
            "CREATE TABLE pad (x);
             CREATE TRIGGER pad_heads AFTER INSERT ON session_state_heads
             BEGIN INSERT INTO pad VALUES (zeroblob(1000000)); END;
             PRAGMA max_page_count = 1",
        )
        .execute(&mut w.conn)
        .await
        .expect("a head insert that fills the database");
        drop(w);
        let other =
            awareness_core::SessionRef::parse("agent:main:subagent:other", "main").expect("ref");
        let event = || {
            awareness_core::NewEvent::new(
                other.clone(),
                awareness_core::EventKind::HumanDirectMessage,
                awareness_core::ActorType::Human,
                "message",
            )
        };
        let err = store
            .record(event(), T)
            .await
            .expect_err("the head's insert fills the database");
        assert!(crate::error::is_full(&err), "{err:?}");
        assert!(
            !err.is_counter_at_end(),
            "a full database is not the sequence counter's end: {err}"
        );
        let mut w = store.writer("test").await.expect("writer");
        w.open_tx = false;
        sqlx::raw_sql("DROP TRIGGER pad_heads")
            .execute(&mut w.conn)
            .await
            .expect("room again");
        drop(w);
        let last = store.record(event(), T).await.expect("the last number");
        assert_eq!(last.event.sequence.get(), i64::MAX as u64);
        store.close().await;
    }

    /// A busy timeout longer than SQLite's `int` of milliseconds opens a store that waits the
    /// longest SQLite can: sqlx panicked on it in the connection's worker (the open failed with
    /// "a crashed background worker"), and a value written back past `i32::MAX` reads as 0.
    #[tokio::test]
    async fn a_busy_timeout_past_sqlites_longest_waits_the_longest() {
        let dir = tempfile::tempdir().expect("temp dir");
        let options = SqliteOptions::new().busy_timeout(Duration::MAX);
        let store = SqliteStore::open_with(dir.path().join("t.db"), options)
            .await
            .expect("open");
        let mut w = store.writer("test").await.expect("writer");
        w.open_tx = false;
        let got: Vec<i64> = sqlx::query_scalar("SELECT timeout FROM pragma_busy_timeout")
            .fetch_all(&mut w.conn)
            .await
            .expect("busy_timeout");
        assert_eq!(got, [i64::from(i32::MAX)]);
        drop(w);
        store.close().await;
    }

    /// Every insert path (one batch, two batches, a group commit) stores in `fields_json` the
    /// values `fields_json!` builds from the row's own columns, escapes and payloads included,
    /// and a page reads the same events from a row with it as from a row without it (as
    /// OpenClaw writes them).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fields_json_is_what_the_columns_give() {
        use awareness_core::{
            ActorType, CursorStore as _, EventKind, EventStore as _, NewEvent, Payload, SessionRef,
            Timestamp, WatcherKey,
        };
        const T: Timestamp = Timestamp(1_800_000_000_000);
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("t.db");
        let store = Arc::new(SqliteStore::open(&path).await.expect("open"));
        let target = SessionRef::parse("agent:main:subagent:t", "main").expect("ref");
        let plain = SessionRef::parse("agent:main:subagent:u", "main").expect("ref");
        // Payloads may hold control characters; ids and summaries may not.
        let tricky = "quote \" backslash \\ newline \n tab \t control \u{1} del \u{7f} é 😀 /";
        let id = "id \" \\ é 😀 /";
        let full = |at: &SessionRef, i: usize| {
            let mut payload = Payload::new();
            payload.insert("text".into(), tricky.into());
            payload.insert("n".into(), 1.5.into());
            NewEvent::new(
                at.clone(),
                EventKind::HumanDirectMessage,
                ActorType::Human,
                format!("quote \" backslash \\ é 😀 / {i}"),
            )
            .with_actor_id(id)
            .with_session_id(format!("{id} {i}"))
            .with_run_id("run \"1\"")
            .with_payload(payload)
            .with_dedupe_key(format!("dedupe {i}"))
        };
        let bare = |at: &SessionRef, i: usize| {
            NewEvent::new(
                at.clone(),
                EventKind::GoalChanged,
                ActorType::System,
                format!("g{i}"),
            )
        };
        // One batch: no cursor on either target yet; then a dedupe hit.
        store.record(full(&target, 0), T).await.expect("record");
        store.record(bare(&plain, 1), T).await.expect("record");
        store.record(full(&target, 0), T).await.expect("dedupe hit");
        // Two batches: a watched target.
        let watcher = WatcherKey::new(plain.session_key.clone()).expect("watcher");
        store.watch(&watcher, &target, T).await.expect("watch");
        store.record(full(&target, 2), T).await.expect("record");
        // A group commit: recordings that queue behind each other share transactions.
        let before = store.write_transactions();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..48 {
            let (store, at) = (
                Arc::clone(&store),
                if i % 3 == 0 { &plain } else { &target },
            );
            let event = if i % 2 == 0 {
                full(at, 100 + i)
            } else {
                bare(at, 100 + i)
            };
            tasks.spawn(async move { store.record(event, T).await });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("task").expect("record");
        }
        assert!(
            store.write_transactions() - before < 48,
            "the recordings shared transactions"
        );

        let mut raw = SqliteConnectOptions::new()
            .filename(&path)
            .connect()
            .await
            .expect("raw connection");
        let pairs: Vec<(i64, Option<String>, String)> = sqlx::query_as(concat!(
            "SELECT sequence, fields_json, ",
            crate::sql::fields_json!(),
            " FROM session_state_events"
        ))
        .fetch_all(&mut raw)
        .await
        .expect("compare");
        assert_eq!(pairs.len(), 51);
        for (seq, stored, columns) in &pairs {
            let stored = stored
                .as_deref()
                .expect("every row of ours has fields_json");
            let value = |t: &str| serde_json::from_str::<serde_json::Value>(t).expect("JSON");
            assert_eq!(
                value(stored),
                value(columns),
                "event {seq}: {stored} / {columns}"
            );
        }

        let page = store
            .changes_since(&target, Sequence(0), 200)
            .await
            .expect("page");
        assert_eq!(page.events.len(), 34);
        sqlx::query("UPDATE session_state_events SET fields_json = NULL WHERE sequence % 2 = 0")
            .execute(&mut raw)
            .await
            .expect("forget half");
        let again = store
            .changes_since(&target, Sequence(0), 200)
            .await
            .expect("page");
        assert_eq!(again, page);
        let partial = store
            .changes_since(&target, Sequence(0), 7)
            .await
            .expect("page");
        assert_eq!(partial.events[..], page.events[..7]);
        assert!(partial.truncated);
        raw.close().await.expect("close");
        Arc::into_inner(store)
            .expect("the tasks are done")
            .close()
            .await;
    }

    /// The hints of watched targets are bounded: past `Hints::MAX` keys the set starts over, so
    /// a handle that records on ever new watched targets does not keep every key it has seen.
    /// (What the mutation did: the set was never cleared, and grew with every target key for
    /// the life of the handle; review of stop 69, S923.)
    #[test]
    fn the_watched_hints_start_over_past_their_bound() {
        let hints = conn::Hints::default();
        let key = |i: usize| {
            awareness_core::SessionKey::new(format!("agent:main:subagent:h{i}")).expect("key")
        };
        for i in 0..=65_536 {
            hints.set_watched(&key(i), true);
        }
        assert!(hints.is_watched(&key(65_536)), "the last key is watched");
        assert!(
            !hints.is_watched(&key(0)),
            "the first key was let go of when the set started over"
        );
    }

    /// A write that ends (committed, here a recording) leaves no transaction marked open: the
    /// write connection's guard, let go of, rolls nothing back and says nothing of a cancelled
    /// write. (What the mutation did: a success left `open_tx` set, and every write was
    /// followed by a rollback on a thread of its own, logged as "a write operation was
    /// cancelled midway"; review of stop 69, S922.)
    #[tokio::test]
    async fn a_write_that_ended_is_not_rolled_back_as_cancelled() {
        let capture = awareness_core::testkit::logs::Capture::default();
        let _guard = capture.install();
        let dir = tempfile::tempdir().expect("temp dir");
        let store = fresh(&dir).await;
        store
            .record(message("ended".to_owned()), T)
            .await
            .expect("record");
        assert_eq!(
            capture.said(&["cancelled midway"]),
            0,
            "{:?}",
            capture.lines()
        );
        store.close().await;
    }
}
