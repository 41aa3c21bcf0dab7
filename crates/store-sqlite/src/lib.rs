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
//!   reads correctly. Our only addition is the nullable `session_watch_cursors.target_agent_id`;
//!   every other table of such a database, and its `user_version`, are never touched.
//! - **Atomic.** Recording is one `BEGIN IMMEDIATE` transaction: the event insert (a dedupe hit
//!   returns the stored row and still spends one sequence, as OpenClaw's AUTOINCREMENT does),
//!   the head move and every cursor move. Acknowledge, sweep, delete and each pruning chunk are
//!   one transaction each.
//! - **Crash-safe.** WAL with `synchronous=NORMAL`: a committed record survives a killed
//!   process; `busy_timeout=5000` makes writers of several processes wait for each other.
//! - **Protocol once.** Every cursor decision is a call into `awareness_core::protocol`; this
//!   crate loads what a decision needs and persists what it returns.
//! - **Pruning off the hot path.** [`EventStore::prune_chunk`] deletes at most a bounded number
//!   of rows per write transaction, so a recording waits behind pruning for one chunk at most;
//!   run [`awareness_core::AwarenessStoreExt::prune`] from a background task.
//!
//! New files are created with mode 0600 (SQLite gives its `-wal` and `-shm` files the same
//! mode). [`SqliteStore::open`] never creates a missing directory and never overwrites a file
//! that is not an SQLite database.
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

mod decode;
mod error;
mod schema;
mod sql;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use awareness_core::reconcile::ChangesPage;
use awareness_core::{
    AgentId, Cursor, CursorFilter, CursorKey, CursorStore, EventStore, Head, LogStats, NewEvent,
    Notice, PruneStep, Recorded, Sequence, SessionKey, SessionRef, StoreError, Timestamp,
    WatcherKey, async_trait, protocol, reconcile, retention,
};
use sqlx::sqlite::{SqliteArguments, SqliteConnectOptions, SqliteRow, SqliteSynchronous};
use sqlx::{ConnectOptions as _, Connection as _, Row as _, Sqlite, SqliteConnection};
use tokio::sync::{Mutex, MutexGuard};

use crate::decode::{int, limit};

type Query = sqlx::query::Query<'static, Sqlite, SqliteArguments>;

/// Write transactions between two background checkpoints (a recording appends about eight
/// WAL frames, so about 2,000 frames or 8 MiB of WAL; the writer's own autocheckpoint at 8,000
/// pages is only a safety net for when no tokio runtime runs the background checkpoint).
const CHECKPOINT_EVERY: u32 = 256;

/// How much a pruning chunk (up to thousands of deleted rows) counts towards the next
/// checkpoint.
const PRUNE_WEIGHT: u32 = 32;

/// How to open a store. The defaults suit a gateway: read-write, create the file when missing.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    read_only: bool,
    create_if_missing: bool,
    readers: usize,
    busy_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            read_only: false,
            create_if_missing: true,
            readers: 2,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

impl SqliteOptions {
    /// The defaults: read-write, create when missing, two reader connections, 5 s busy timeout.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens without the write connection: every write returns an error, nothing is created,
    /// and the schema must already be up to date.
    #[must_use]
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Whether a missing file is created (mode 0600; its directory must exist). Default `true`;
    /// commands that only read should pass `false`.
    #[must_use]
    pub fn create_if_missing(mut self, create: bool) -> Self {
        self.create_if_missing = create;
        self
    }

    /// How many connections serve reads (at least one). Default 2.
    #[must_use]
    pub fn readers(mut self, readers: usize) -> Self {
        self.readers = readers.max(1);
        self
    }

    /// How long a statement waits for another process's write lock before reporting
    /// [`StoreError::Busy`]. Default 5 s.
    #[must_use]
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }
}

/// The write connection, held outside any pool, and whether a transaction may be open on it
/// (an operation that failed or was cancelled midway leaves one; the next writer rolls it back).
struct Writer {
    conn: SqliteConnection,
    open_tx: bool,
}

impl Writer {
    async fn rollback(&mut self) {
        if let Err(e) = sqlx::raw_sql(sql::ROLLBACK).execute(&mut self.conn).await {
            // "cannot rollback - no transaction is active" is the usual, harmless answer.
            tracing::debug!(error = %e, "rollback after an interrupted write");
        }
        self.open_tx = false;
    }

    /// Ends an operation: a failure rolls back what it began.
    async fn finish<T>(&mut self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if result.is_err() {
            self.rollback().await;
        } else {
            self.open_tx = false;
        }
        result
    }
}

/// A session-awareness store in one SQLite file. Share it as `Arc<SqliteStore>` (or
/// `Arc<dyn AwarenessStore>`); one handle serializes its own writes on one connection and reads
/// on a few others.
pub struct SqliteStore {
    path: PathBuf,
    writer: Option<Arc<Mutex<Writer>>>,
    readers: Arc<Readers>,
    /// Write transactions (weighted) since the last background checkpoint was started.
    writes_since_checkpoint: AtomicU32,
    /// A background checkpoint is running.
    checkpointing: Arc<AtomicBool>,
    /// The last background checkpoint, awaited by [`SqliteStore::close`].
    checkpoint_task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    hints: Hints,
}

/// Which target keys are known to have cursors, so that recording on them goes straight to
/// the two-batch path. Only a hint: a stale entry costs one batch, never correctness.
#[derive(Default)]
struct Hints {
    watched: std::sync::Mutex<std::collections::HashSet<SessionKey>>,
}

impl Hints {
    /// Bound on remembered keys; past it the set starts over.
    const MAX: usize = 65_536;

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<SessionKey>> {
        self.watched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn is_watched(&self, key: &SessionKey) -> bool {
        self.lock().contains(key)
    }

    fn set_watched(&self, key: &SessionKey, watched: bool) {
        let mut set = self.lock();
        if watched {
            if set.len() >= Self::MAX {
                set.clear();
            }
            set.insert(key.clone());
        } else {
            set.remove(key);
        }
    }
}

/// The reader connections (shared with background checkpoints).
struct Readers {
    conns: Box<[Mutex<SqliteConnection>]>,
    next: AtomicUsize,
}

impl Readers {
    async fn get(&self) -> MutexGuard<'_, SqliteConnection> {
        for r in &*self.conns {
            if let Ok(g) = r.try_lock() {
                return g;
            }
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        self.conns[i].lock().await
    }

    /// Copies the WAL back into the database file in two PASSIVE passes on a reader
    /// connection: the bulk while recordings go on, then the few frames appended meanwhile
    /// while holding this handle's write connection, so that the WAL is complete in the file
    /// and the next write transaction starts the WAL file over instead of growing it.
    async fn checkpoint(&self, path: &Path, writer: Option<&Mutex<Writer>>) {
        let mut conn = self.get().await;
        let mut pass = async || {
            sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(PASSIVE)")
                .fetch_all(&mut *conn)
                .await
        };
        let bulk = pass().await;
        let tail = match (&bulk, writer) {
            (Ok(_), Some(w)) => {
                let _quiet = w.lock().await;
                Some(pass().await)
            }
            _ => None,
        };
        for r in std::iter::once(bulk).chain(tail) {
            match r {
                Ok(r) => {
                    tracing::trace!(path = %path.display(), result = ?r, "checkpointed the WAL");
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "background WAL checkpoint failed");
                }
            }
        }
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
    /// SQLite database, a truncated one, or one in a place without the needed permissions gives
    /// [`StoreError::Open`] naming the path; nothing is created or overwritten then.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// Opens the store at `path` with `options`.
    pub async fn open_with(
        path: impl AsRef<Path>,
        options: SqliteOptions,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let created = prepare_file(&path, &options)?;
        match Self::connect(&path, &options).await {
            Ok(store) => Ok(store),
            Err(e) => {
                if created {
                    remove_created(&path);
                }
                Err(e)
            }
        }
    }

    async fn connect(path: &Path, options: &SqliteOptions) -> Result<Self, StoreError> {
        // journal_mode is set by hand after connecting (not as a connect option), so that the
        // first statement that reads the file fails on a connection we own and can close before
        // cleaning up after it.
        let base = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(false)
            .read_only(options.read_only)
            .busy_timeout(options.busy_timeout)
            .synchronous(SqliteSynchronous::Normal)
            // Our four tables have no foreign keys; leaving enforcement off guarantees that no
            // statement of ours cascades into another table of an OpenClaw database.
            .foreign_keys(false);
        let fail = |e: sqlx::Error| error::open(path, error::open_reason(&e), Some(Box::new(e)));
        let companions = Companions::before_open(path);
        let mut readers = Vec::with_capacity(options.readers);
        let writer = if options.read_only {
            None
        } else {
            let mut conn = match base.connect().await {
                Ok(conn) => conn,
                Err(e) => {
                    companions.remove_if_unusable(&e);
                    return Err(fail(e));
                }
            };
            if let Err(e) = init_writer(&mut conn).await {
                drop(conn.close().await);
                companions.remove_if_unusable(&e);
                return Err(fail(e));
            }
            Some(Arc::new(Mutex::new(Writer {
                conn,
                open_tx: false,
            })))
        };
        for _ in 0..options.readers.max(1) {
            readers.push(Mutex::new(base.connect().await.map_err(fail)?));
        }
        if writer.is_none() {
            let version = match schema::version(readers[0].get_mut()).await {
                Ok(v) => v,
                Err(e) => {
                    for r in readers {
                        drop(r.into_inner().close().await);
                    }
                    companions.remove_if_unusable(&e);
                    return Err(fail(e));
                }
            };
            if version < schema::LATEST {
                return Err(error::open(
                    path,
                    format!(
                        "the schema is at version {version} of {}; open it read-write once to \
                         migrate it",
                        schema::LATEST
                    ),
                    None,
                ));
            }
        }
        tracing::debug!(path = %path.display(), read_only = options.read_only, "opened store");
        Ok(Self {
            path: path.to_path_buf(),
            writer,
            readers: Arc::new(Readers {
                conns: readers.into_boxed_slice(),
                next: AtomicUsize::new(0),
            }),
            writes_since_checkpoint: AtomicU32::new(0),
            checkpointing: Arc::new(AtomicBool::new(false)),
            checkpoint_task: std::sync::Mutex::new(None),
            hints: Hints::default(),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes every connection cleanly (the last one checkpoints the WAL into the file).
    /// Dropping the store closes them too, without waiting.
    pub async fn close(self) {
        let task = self
            .checkpoint_task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(task) = task
            && let Err(e) = task.await
        {
            tracing::debug!(path = %self.path.display(), error = %e, "background checkpoint task");
        }
        let readers = match Arc::try_unwrap(self.readers) {
            Ok(r) => r.conns.into_vec(),
            // Still shared (a checkpoint task of a runtime that stopped): dropping closes them.
            Err(_) => Vec::new(),
        };
        for r in readers {
            if let Err(e) = r.into_inner().close().await {
                tracing::warn!(path = %self.path.display(), error = %e, "closing a reader");
            }
        }
        if let Some(w) = self.writer.and_then(|w| Arc::try_unwrap(w).ok()) {
            let mut w = w.into_inner();
            if w.open_tx {
                w.rollback().await;
            }
            if let Err(e) = w.conn.close().await {
                tracing::warn!(path = %self.path.display(), error = %e, "closing the writer");
            }
        }
    }

    /// Deletes one event row and nothing else (no watermark, no head change), as an operator
    /// repairing a store by hand would. Returns whether the row existed. The conformance suite
    /// uses it to prove that history gaps come only from pruning.
    pub async fn delete_event_row(&self, sequence: Sequence) -> Result<bool, StoreError> {
        let mut w = self.writer("delete an event row").await?;
        let res = async {
            let row = batch_one(
                &mut w.conn,
                sqlx::query(sql::DELETE_EVENT_ROW).bind(int(sequence)),
                "delete an event row",
            )
            .await?;
            Ok(get::<i64>(&row, 0, "delete an event row")? > 0)
        }
        .await;
        w.finish(res).await
    }

    async fn writer(&self, what: &str) -> Result<MutexGuard<'_, Writer>, StoreError> {
        let Some(w) = &self.writer else {
            return Err(StoreError::backend(
                what,
                format!("{} was opened read-only", self.path.display()),
            ));
        };
        let mut g = w.lock().await;
        if g.open_tx {
            g.rollback().await;
        }
        g.open_tx = true;
        self.count_write(1);
        Ok(g)
    }

    async fn reader(&self) -> MutexGuard<'_, SqliteConnection> {
        self.readers.get().await
    }

    /// Counts a write transaction of `weight` and, every [`CHECKPOINT_EVERY`], starts a
    /// PASSIVE checkpoint on a reader connection in the background, so that the cost of copying
    /// the WAL into the file (and its fsync) never lands on a recording. Without a tokio
    /// runtime, the writer's own autocheckpoint (a larger safety net) does it.
    fn count_write(&self, weight: u32) {
        let n = self
            .writes_since_checkpoint
            .fetch_add(weight, Ordering::Relaxed)
            + weight;
        if n < CHECKPOINT_EVERY || self.checkpointing.swap(true, Ordering::AcqRel) {
            return;
        }
        self.writes_since_checkpoint.store(0, Ordering::Relaxed);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.checkpointing.store(false, Ordering::Release);
            return;
        };
        let readers = Arc::clone(&self.readers);
        let writer = self.writer.clone();
        let flag = Arc::clone(&self.checkpointing);
        let path = self.path.clone();
        let task = rt.spawn(async move {
            readers.checkpoint(&path, writer.as_deref()).await;
            flag.store(false, Ordering::Release);
        });
        *self
            .checkpoint_task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(task);
    }

    /// Runs a one-row read on a reader connection.
    async fn read_one(&self, q: Query, what: &str) -> Result<SqliteRow, StoreError> {
        let mut conn = self.reader().await;
        batch_one(&mut conn, q, what).await
    }
}

/// WAL mode (persistent in the file), then the schema.
async fn init_writer(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(sql::WRITER_PRAGMAS)
        .execute(&mut *conn)
        .await?;
    schema::migrate(conn, Timestamp::now().millis()).await
}

/// SQLite's `-wal` and `-shm` files of a database, and whether they existed before we opened
/// it: reading a damaged WAL-mode file makes SQLite create them before it notices the damage.
struct Companions {
    paths: [PathBuf; 2],
    existed: [bool; 2],
}

impl Companions {
    fn before_open(path: &Path) -> Self {
        let paths = ["-wal", "-shm"].map(|suffix| {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            PathBuf::from(p)
        });
        let existed = [paths[0].exists(), paths[1].exists()];
        Self { paths, existed }
    }

    /// After a failed open of a file that is no usable database (so no healthy process can be
    /// using these files), removes the companions this open created: nothing is left behind.
    fn remove_if_unusable(&self, e: &sqlx::Error) {
        if !error::is_unusable_file(e) {
            return;
        }
        for (p, existed) in self.paths.iter().zip(self.existed) {
            let empty_wal = p == &self.paths[0] && std::fs::metadata(p).is_ok_and(|m| m.len() == 0);
            if !existed
                && (p == &self.paths[1] || empty_wal)
                && let Err(e) = std::fs::remove_file(p)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %p.display(), error = %e, "cannot remove a file a failed open created");
            }
        }
    }
}

/// Checks the path and creates a missing file with mode 0600. Returns whether it created it.
fn prepare_file(path: &Path, options: &SqliteOptions) -> Result<bool, StoreError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(false),
        Ok(_) => Err(error::open(path, "it is not a regular file", None)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if options.read_only || !options.create_if_missing {
                return Err(error::open(
                    path,
                    "the file does not exist",
                    Some(Box::new(e)),
                ));
            }
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            if !parent.is_dir() {
                return Err(error::open(
                    path,
                    format!("its directory {} does not exist", parent.display()),
                    None,
                ));
            }
            create_private(path)
        }
        Err(e) => Err(error::open(
            path,
            format!("cannot inspect it: {e}"),
            Some(Box::new(e)),
        )),
    }
}

#[cfg(unix)]
fn create_private(path: &Path) -> Result<bool, StoreError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let res = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    created(path, res)
}

#[cfg(not(unix))]
fn create_private(path: &Path) -> Result<bool, StoreError> {
    let res = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path);
    created(path, res)
}

fn created(path: &Path, res: std::io::Result<std::fs::File>) -> Result<bool, StoreError> {
    match res {
        Ok(_) => Ok(true),
        // Another process created it in the meantime: open what is there.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(error::open(
            path,
            format!("cannot create it: {e}"),
            Some(Box::new(e)),
        )),
    }
}

/// Removes a file this open created (and SQLite's companions) after the open failed.
fn remove_created(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let p = PathBuf::from(p);
        if let Err(e) = std::fs::remove_file(&p)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %p.display(), error = %e, "cannot remove a file a failed open created");
        }
    }
}

/// Runs a batch to the end (every statement, including a final COMMIT) and returns its rows.
/// `fetch_optional`/`fetch_one` would stop sqlx's worker after the first row.
async fn batch(
    conn: &mut SqliteConnection,
    q: Query,
    what: &str,
) -> Result<Vec<SqliteRow>, StoreError> {
    q.fetch_all(&mut *conn)
        .await
        .map_err(|e| error::map(what, e))
}

/// A batch that answers exactly one row.
async fn batch_one(
    conn: &mut SqliteConnection,
    q: Query,
    what: &str,
) -> Result<SqliteRow, StoreError> {
    let mut rows = batch(conn, q, what).await?;
    match rows.len() {
        1 => Ok(rows.swap_remove(0)),
        n => Err(StoreError::backend(
            what,
            format!("expected one row, got {n}"),
        )),
    }
}

fn get<'r, T>(row: &'r SqliteRow, i: usize, what: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>,
{
    row.try_get::<T, _>(i).map_err(|e| StoreError::Corrupt {
        context: format!("{what}: column {i}"),
        source: Some(Box::new(e)),
    })
}

/// Commits, writing the cursors first when there are any.
async fn persist_cursors(
    conn: &mut SqliteConnection,
    cursors: &[Cursor],
    what: &str,
) -> Result<(), StoreError> {
    let q = if cursors.is_empty() {
        sqlx::query(sql::COMMIT)
    } else {
        sqlx::query(sql::UPSERT_CURSORS_COMMIT).bind(decode::cursors_json(cursors))
    };
    batch(conn, q, what).await.map(drop)
}

/// The record batches' binds (see [`sql::RECORD_BEGIN`]).
fn record_query(
    sql: &'static str,
    event: &awareness_core::Event,
    payload: Option<&str>,
    now: Timestamp,
) -> Query {
    sqlx::query(sql)
        .bind(event.dedupe_key.as_deref())
        .bind(event.session_key.as_str())
        .bind(event.session_id.as_deref())
        .bind(event.agent_id.as_str())
        .bind(event.kind.as_str())
        .bind(event.actor_type.as_str())
        .bind(event.actor_id.as_deref())
        .bind(event.run_id.as_deref())
        .bind(event.occurred_at.millis())
        .bind(event.summary.as_str())
        .bind(payload)
        .bind(now.millis())
}

/// The stored event of a dedupe hit (column 2 of a record batch's row).
fn dedupe_hit(row: &SqliteRow, event: &awareness_core::Event) -> Result<Recorded, StoreError> {
    const WHAT: &str = "record an event";
    let stored: Option<&str> = get(row, 2, WHAT)?;
    let stored = stored.ok_or_else(|| {
        StoreError::corrupt(format!(
            "{WHAT}: the dedupe key {:?} conflicted but has no row",
            event.dedupe_key
        ))
    })?;
    Ok(Recorded {
        event: Arc::new(decode::one_event(stored)?),
        deduplicated: true,
        notices: Vec::new(),
    })
}

/// What the one-batch recording found.
enum Fast {
    /// Recorded and committed.
    Done(Recorded),
    /// The target has cursors: nothing was written; record it (given back) the two-batch way.
    Watched(awareness_core::Event),
}

/// Records an event whose cursor effects, with no cursor on the target, are none (core says
/// so before this is chosen), in one batch that commits. The insert is guarded by "the target
/// has no cursor" under the write lock, so the precondition holds when it commits; when the
/// guard finds a cursor, nothing is written (not even a sequence is spent).
async fn record_fast(
    conn: &mut SqliteConnection,
    mut event: awareness_core::Event,
    payload: Option<&str>,
    now: Timestamp,
) -> Result<Fast, StoreError> {
    const WHAT: &str = "record an event";
    let q = record_query(sql::RECORD_ONE_BATCH, &event, payload, now);
    let row = batch_one(conn, q, WHAT).await?;
    if get::<i64>(&row, 3, WHAT)? != 0 {
        return Ok(Fast::Watched(event));
    }
    if get::<i64>(&row, 0, WHAT)? == 0 {
        return dedupe_hit(&row, &event).map(Fast::Done);
    }
    event.sequence = decode::sequence(WHAT, get(&row, 1, WHAT)?)?;
    let effects = protocol::on_event(&event, &[], &[], now);
    debug_assert!(
        effects.upserts.is_empty(),
        "checked before choosing this path"
    );
    Ok(Fast::Done(Recorded {
        event: Arc::new(event),
        deduplicated: false,
        notices: effects.notices,
    }))
}

/// Records an event in two batches: insert, head and the cursors on the target; then what
/// `protocol::on_event` decides, and commit. Also says whether the target has cursors now
/// (`None` after a dedupe hit, which reads none).
async fn record_two_batches(
    conn: &mut SqliteConnection,
    mut event: awareness_core::Event,
    payload: Option<&str>,
    named: &[WatcherKey],
    now: Timestamp,
) -> Result<(Recorded, Option<bool>), StoreError> {
    const WHAT: &str = "record an event";
    let q = record_query(sql::RECORD_BEGIN, &event, payload, now);
    let row = batch_one(conn, q, WHAT).await?;
    if get::<i64>(&row, 0, WHAT)? == 0 {
        // Dedupe hit: nothing moves, but the spent sequence is committed (as OpenClaw's).
        let hit = dedupe_hit(&row, &event)?;
        batch(conn, sqlx::query(sql::COMMIT), WHAT).await?;
        return Ok((hit, None));
    }
    event.sequence = decode::sequence(WHAT, get(&row, 1, WHAT)?)?;
    let existing: Option<&str> = get(&row, 3, WHAT)?;
    let existing = decode::cursors(existing.unwrap_or("[]"))?;
    let effects = protocol::on_event(&event, named, &existing, now);
    persist_cursors(conn, &effects.upserts, WHAT).await?;
    let watched = !existing.is_empty() || !effects.upserts.is_empty();
    Ok((
        Recorded {
            event: Arc::new(event),
            deduplicated: false,
            notices: effects.notices,
        },
        Some(watched),
    ))
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn record(&self, mut event: NewEvent, now: Timestamp) -> Result<Recorded, StoreError> {
        event.validate()?;
        let named = std::mem::take(&mut event.watchers);
        // Core builds the stored event (it clamps occurredAt); the sequence comes from SQLite.
        let event = event.into_event(Sequence::ZERO, now);
        let payload = event.payload.as_ref().map(decode::to_json);
        // One batch when core says the event moves no cursor on an unwatched target and the
        // target is not known to be watched; two batches otherwise.
        let one_batch = protocol::on_event(&event, &named, &[], now)
            .upserts
            .is_empty()
            && !self.hints.is_watched(&event.session_key);
        let key = event.session_key.clone();
        let mut w = self.writer("record an event").await?;
        let res = async {
            let event = if one_batch {
                match record_fast(&mut w.conn, event, payload.as_deref(), now).await? {
                    Fast::Done(rec) => return Ok(rec),
                    Fast::Watched(event) => event,
                }
            } else {
                event
            };
            let (rec, watched) =
                record_two_batches(&mut w.conn, event, payload.as_deref(), &named, now).await?;
            if let Some(watched) = watched {
                self.hints.set_watched(&key, watched);
            }
            Ok(rec)
        }
        .await;
        w.finish(res).await
    }

    async fn changes_since(
        &self,
        session: &SessionRef,
        after: Sequence,
        limit: usize,
    ) -> Result<ChangesPage, StoreError> {
        const WHAT: &str = "read changes since";
        let limit = reconcile::clamp_limit(Some(limit));
        let q = sqlx::query(sql::CHANGES_SINCE)
            .bind(session.session_key.as_str().to_owned())
            .bind(session.agent_id.as_str().to_owned())
            .bind(int(after))
            .bind(decode::limit(limit + 1));
        let row = self.read_one(q, WHAT).await?;
        let head: Option<&str> = get(&row, 0, WHAT)?;
        let head = head.map(|h| decode::head_of(session, h)).transpose()?;
        let min: Option<i64> = get(&row, 1, WHAT)?;
        let min = min.map(|m| decode::sequence(WHAT, m)).transpose()?;
        let events: &str = get(&row, 2, WHAT)?;
        let fetched = decode::page_events(events, session)?;
        Ok(reconcile::build_page(
            after,
            head.as_ref(),
            min,
            fetched,
            limit,
        ))
    }

    async fn heads(&self, sessions: &[SessionRef]) -> Result<Vec<Head>, StoreError> {
        const WHAT: &str = "read heads";
        if sessions.is_empty() {
            return Ok(Vec::new());
        }
        let refs: Vec<(&str, &str)> = sessions
            .iter()
            .map(|r| (r.session_key.as_str(), r.agent_id.as_str()))
            .collect();
        let q = sqlx::query(sql::HEADS).bind(decode::to_json(&refs));
        let row = self.read_one(q, WHAT).await?;
        decode::heads(get(&row, 0, WHAT)?)
    }

    async fn list_heads(&self, agent: Option<&AgentId>) -> Result<Vec<Head>, StoreError> {
        const WHAT: &str = "list heads";
        let q = sqlx::query(sql::LIST_HEADS).bind(agent.map(|a| a.as_str().to_owned()));
        let row = self.read_one(q, WHAT).await?;
        decode::heads(get(&row, 0, WHAT)?)
    }

    async fn events_after(
        &self,
        after: Sequence,
        max: usize,
    ) -> Result<Vec<Arc<awareness_core::Event>>, StoreError> {
        const WHAT: &str = "read events after";
        let q = sqlx::query(sql::EVENTS_AFTER)
            .bind(int(after))
            .bind(limit(max));
        let row = self.read_one(q, WHAT).await?;
        decode::events(get(&row, 0, WHAT)?)
    }

    async fn log_stats(&self) -> Result<LogStats, StoreError> {
        const WHAT: &str = "read log stats";
        let row = self.read_one(sqlx::query(sql::LOG_STATS), WHAT).await?;
        Ok(LogStats {
            rows: decode::sequence(WHAT, get(&row, 0, WHAT)?)?.get(),
            min_sequence: decode::sequence(WHAT, get(&row, 1, WHAT)?)?,
            max_sequence: decode::sequence(WHAT, get(&row, 2, WHAT)?)?,
        })
    }

    async fn prune_chunk(&self, step: &PruneStep, max_rows: usize) -> Result<u64, StoreError> {
        let mut w = self.writer("prune").await?;
        self.count_write(PRUNE_WEIGHT - 1);
        let res = prune_tx(&mut w.conn, step, max_rows).await;
        w.finish(res).await
    }

    async fn delete_session(&self, session: &SessionRef) -> Result<(), StoreError> {
        const WHAT: &str = "delete a session";
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let key = session.session_key.as_str().to_owned();
            let q = sqlx::query(sql::DELETE_SESSION_BEGIN).bind(key.clone());
            let row = batch_one(&mut w.conn, q, WHAT).await?;
            let on_target = decode::cursors(get(&row, 0, WHAT)?)?;
            let doomed: Vec<(&str, &str)> = on_target
                .iter()
                .filter(|c| c.target_agent == session.agent_id)
                .map(|c| (c.watcher.as_str(), c.target.as_str()))
                .collect();
            let q = sqlx::query(sql::DELETE_SESSION_COMMIT)
                .bind(key)
                .bind(session.agent_id.as_str().to_owned())
                .bind(decode::to_json(&doomed));
            batch(&mut w.conn, q, WHAT).await.map(drop)
        }
        .await;
        w.finish(res).await
    }
}

/// One pruning chunk inside the write transaction.
async fn prune_tx(
    conn: &mut SqliteConnection,
    step: &PruneStep,
    max_rows: usize,
) -> Result<u64, StoreError> {
    const WHAT: &str = "prune";
    let victims_row = match *step {
        PruneStep::Cursors { cutoff } => {
            let q = sqlx::query(sql::PRUNE_CURSORS)
                .bind(cutoff.millis())
                .bind(limit(max_rows));
            let row = batch_one(conn, q, WHAT).await?;
            return Ok(decode::sequence(WHAT, get(&row, 0, WHAT)?)?.get());
        }
        PruneStep::Age { cutoff } => {
            let q = sqlx::query(sql::PRUNE_AGE_BEGIN)
                .bind(cutoff.millis())
                .bind(limit(max_rows));
            batch_one(conn, q, WHAT).await?
        }
        PruneStep::RowCap { max_rows: keep } => {
            let row = batch_one(conn, sqlx::query(sql::PRUNE_CAP_BEGIN), WHAT).await?;
            let retained = decode::sequence(WHAT, get(&row, 0, WHAT)?)?.get();
            let n = retention::row_cap_victims(retained, keep, max_rows);
            if n == 0 {
                batch(conn, sqlx::query(sql::COMMIT), WHAT).await?;
                return Ok(0);
            }
            batch_one(
                conn,
                sqlx::query(sql::PRUNE_CAP_VICTIMS).bind(limit(n)),
                WHAT,
            )
            .await?
        }
    };
    let victims = decode::victims(get(&victims_row, 0, WHAT)?)?;
    if victims.is_empty() {
        batch(conn, sqlx::query(sql::COMMIT), WHAT).await?;
        return Ok(0);
    }
    let heads: BTreeMap<SessionRef, Head> = decode::heads(get(&victims_row, 1, WHAT)?)?
        .into_iter()
        .map(|h| (h.session.clone(), h))
        .collect();
    // Watermarks are stamped before the rows go, in the same transaction; a ref without a head
    // gets none (pruning never creates a head).
    let stamps: Vec<(&str, &str, i64)> =
        retention::watermarks(victims.iter().map(|(s, r)| (r, *s)))
            .into_iter()
            .filter_map(|(r, pruned)| {
                let head = heads.get(&r)?;
                let stamped = retention::stamp(head, pruned);
                Some((
                    head.session.session_key.as_str(),
                    head.session.agent_id.as_str(),
                    int(stamped.pruned_max_sequence),
                ))
            })
            .collect();
    let seqs: Vec<i64> = victims.iter().map(|(s, _)| int(*s)).collect();
    let q = sqlx::query(sql::PRUNE_DELETE_COMMIT)
        .bind(decode::to_json(&stamps))
        .bind(decode::to_json(&seqs));
    let row = batch_one(conn, q, WHAT).await?;
    Ok(decode::sequence(WHAT, get(&row, 0, WHAT)?)?.get())
}

/// Applies `decide` to each listed target's cursor in order (a repeated target sees the cursor
/// the previous step wrote, as in the reference store) and collects what to write.
fn apply_in_order<'k>(
    loaded: Vec<Cursor>,
    keys: impl IntoIterator<Item = (&'k WatcherKey, &'k SessionKey)>,
    mut decide: impl FnMut(&Cursor) -> (Option<Cursor>, Option<Notice>),
) -> (Vec<Cursor>, Vec<Notice>) {
    let mut current: BTreeMap<CursorKey, Cursor> =
        loaded.into_iter().map(|c| (c.key(), c)).collect();
    let mut written: BTreeMap<CursorKey, Cursor> = BTreeMap::new();
    let mut notices = Vec::new();
    for (w, t) in keys {
        let key = CursorKey {
            watcher: w.clone(),
            target: t.clone(),
        };
        let Some(c) = current.get(&key) else { continue };
        let (write, notice) = decide(c);
        if let Some(c) = write {
            current.insert(key.clone(), c.clone());
            written.insert(key, c);
        }
        notices.extend(notice);
    }
    (written.into_values().collect(), notices)
}

#[async_trait]
impl CursorStore for SqliteStore {
    async fn watch(
        &self,
        watcher: &WatcherKey,
        target: &SessionRef,
        now: Timestamp,
    ) -> Result<Cursor, StoreError> {
        const WHAT: &str = "watch";
        protocol::check_watch(watcher.session_key(), &target.session_key)?;
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let q = sqlx::query(sql::WATCH_BEGIN)
                .bind(watcher.as_str().to_owned())
                .bind(target.session_key.as_str().to_owned())
                .bind(target.agent_id.as_str().to_owned());
            let row = batch_one(&mut w.conn, q, WHAT).await?;
            let existing: Option<&str> = get(&row, 0, WHAT)?;
            let existing = existing.map(decode::one_cursor).transpose()?.flatten();
            let head: Option<i64> = get(&row, 1, WHAT)?;
            let head = head
                .map(|h| decode::sequence(WHAT, h))
                .transpose()?
                .unwrap_or(Sequence::ZERO);
            let (cursor, write) = protocol::watch(existing.as_ref(), watcher, target, head, now);
            self.hints.set_watched(&target.session_key, true);
            let upserts = if write {
                std::slice::from_ref(&cursor)
            } else {
                &[]
            };
            persist_cursors(&mut w.conn, upserts, WHAT).await?;
            Ok(cursor)
        }
        .await;
        w.finish(res).await
    }

    async fn unwatch(&self, watcher: &WatcherKey, target: &SessionKey) -> Result<bool, StoreError> {
        const WHAT: &str = "unwatch";
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let q = sqlx::query(sql::UNWATCH)
                .bind(watcher.as_str().to_owned())
                .bind(target.as_str().to_owned());
            let row = batch_one(&mut w.conn, q, WHAT).await?;
            Ok(get::<i64>(&row, 0, WHAT)? > 0)
        }
        .await;
        w.finish(res).await
    }

    async fn acknowledge(
        &self,
        watcher: &WatcherKey,
        targets: &[SessionKey],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        const WHAT: &str = "acknowledge";
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<&str> = targets.iter().map(SessionKey::as_str).collect();
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let q = sqlx::query(sql::ACK_BEGIN)
                .bind(watcher.as_str().to_owned())
                .bind(decode::to_json(&names));
            let row = batch_one(&mut w.conn, q, WHAT).await?;
            let loaded = decode::cursors(get(&row, 0, WHAT)?)?;
            let (writes, notices) =
                apply_in_order(loaded, targets.iter().map(|t| (watcher, t)), |c| {
                    protocol::acknowledge(c, now)
                });
            persist_cursors(&mut w.conn, &writes, WHAT).await?;
            Ok(notices)
        }
        .await;
        w.finish(res).await
    }

    async fn cursor(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<Option<Cursor>, StoreError> {
        const WHAT: &str = "read a cursor";
        let q = sqlx::query(sql::CURSOR)
            .bind(watcher.as_str().to_owned())
            .bind(target.as_str().to_owned());
        let mut conn = self.reader().await;
        let rows = batch(&mut conn, q, WHAT).await?;
        match rows.first() {
            Some(row) => decode::one_cursor(get(row, 0, WHAT)?),
            None => Ok(None),
        }
    }

    async fn cursors(&self, filter: &CursorFilter) -> Result<Vec<Cursor>, StoreError> {
        const WHAT: &str = "list cursors";
        let q = sqlx::query(sql::CURSORS)
            .bind(filter.watcher.as_ref().map(|k| k.as_str().to_owned()))
            .bind(filter.target.as_ref().map(|k| k.as_str().to_owned()));
        let row = self.read_one(q, WHAT).await?;
        let mut all = decode::cursors(get(&row, 0, WHAT)?)?;
        all.retain(|c| filter.matches(c));
        Ok(all)
    }

    async fn refreeze(
        &self,
        keys: &[CursorKey],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        const WHAT: &str = "re-freeze cursors";
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let pairs: Vec<(&str, &str)> = keys
            .iter()
            .map(|k| (k.watcher.as_str(), k.target.as_str()))
            .collect();
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let q = sqlx::query(sql::REFREEZE_BEGIN).bind(decode::to_json(&pairs));
            let row = batch_one(&mut w.conn, q, WHAT).await?;
            let loaded = decode::cursors(get(&row, 0, WHAT)?)?;
            let (writes, notices) =
                apply_in_order(loaded, keys.iter().map(|k| (&k.watcher, &k.target)), |c| {
                    match protocol::refreeze(c, now) {
                        Some((c, n)) => (Some(c), Some(n)),
                        None => (None, None),
                    }
                });
            persist_cursors(&mut w.conn, &writes, WHAT).await?;
            Ok(notices)
        }
        .await;
        w.finish(res).await
    }

    async fn reset_watcher(&self, watcher: &SessionKey) -> Result<u64, StoreError> {
        const WHAT: &str = "reset a watcher";
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let q = sqlx::query(sql::RESET_WATCHER).bind(watcher.as_str().to_owned());
            let row = batch_one(&mut w.conn, q, WHAT).await?;
            Ok(decode::sequence(WHAT, get(&row, 0, WHAT)?)?.get())
        }
        .await;
        w.finish(res).await
    }
}
