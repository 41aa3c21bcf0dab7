//! The connections: the write connection with its transaction state, the reader connections
//! (shared with background checkpoints), the hints about watched targets, and running a batch.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use awareness_core::{Cursor, SessionKey, StoreError};
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Row as _, Sqlite, SqliteConnection};
use std::sync::Arc;

use tokio::sync::{Mutex, MutexGuard, OwnedMutexGuard};

use crate::{decode, error, sql};

/// A statement or batch with its binds.
pub(crate) type Query = sqlx::query::Query<'static, Sqlite, SqliteArguments>;

/// The write connection, held outside any pool, and whether a transaction may be open on it
/// (an operation that failed or was cancelled midway leaves one; the next writer rolls it back).
pub(crate) struct Writer {
    pub(crate) conn: SqliteConnection,
    pub(crate) open_tx: bool,
    /// The handle's count of write operations ([`crate::SqliteStore::write_transactions`]).
    pub(crate) ops: Arc<std::sync::atomic::AtomicU64>,
    /// The store's file, which the warnings name (shared, not copied, with the threads and
    /// tasks that finish a write: [`WriteGuard`], [`crate::group::Unfinished`]).
    pub(crate) path: Arc<Path>,
}

impl Writer {
    /// Marks a write operation begun on the connection (rolled back if it is interrupted) and
    /// counts it ([`crate::SqliteStore::write_transactions`]).
    pub(crate) fn begin(&mut self) {
        self.open_tx = true;
        self.ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) async fn rollback(&mut self) {
        // Test-only helper (review of stop 69, S903): a rollback that fails, leaving the
        // transaction open and `open_tx` set, as a ROLLBACK SQLite refused would.
        #[cfg(test)]
        if crate::tests::FAIL_THE_NEXT_ROLLBACK
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take_if(|p| p.as_path() == &*self.path)
            .is_some()
        {
            return;
        }
        match sqlx::raw_sql(sql::ROLLBACK).execute(&mut self.conn).await {
            Ok(_) => self.open_tx = false,
            // The usual, harmless answer: the operation had ended its transaction.
            Err(e) if e.to_string().contains("no transaction is active") => {
                tracing::debug!(error = %awareness_core::error::ErrorChain(&e), "rollback after an interrupted write");
                self.open_tx = false;
            }
            // A transaction may still be open, holding SQLite's write lock: the next writer
            // rolls back again before it begins (`open_tx` stays set).
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %awareness_core::error::ErrorChain(&e), "rollback after an interrupted write failed; trying again before the next write");
            }
        }
    }

    /// Ends an operation: a failure rolls back what it began.
    pub(crate) async fn finish<T>(
        &mut self,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if result.is_err() {
            self.rollback().await;
        } else {
            self.open_tx = false;
        }
        result
    }
}

/// The write connection's lock; `None` once [`crate::SqliteStore::close`] took the connection
/// out to close it (nothing locks it after that: `close` owns the store).
pub(crate) type WriteSlot = Mutex<Option<Writer>>;

/// The locked write connection, for one operation.
///
/// An operation whose caller is cancelled (its future dropped between two statements, as a
/// request timeout does) leaves its transaction open, and with it SQLite's write lock on the
/// file, which every other handle and process would wait on until `busy_timeout` and then fail
/// with [`StoreError::Busy`]. So a guard dropped while [`Writer::open_tx`] is still set rolls
/// the transaction back at once, keeping the connection locked until it is done, on a thread
/// of its own with a small runtime (as the background checkpoints run), not on a task of the
/// caller's runtime: a runtime shutting down drops such a task unrun, which left SQLite's
/// write lock held until this handle's next write; and a runtime alive but no longer driven
/// never ran it, and the connection it held kept every later write and the close of the
/// handle waiting for ever. Should the thread not start, the rollback is left to the next
/// writer.
pub(crate) struct WriteGuard(Option<OwnedMutexGuard<Option<Writer>>>);

impl WriteGuard {
    /// Waits for the write connection.
    pub(crate) async fn lock(writer: &Arc<WriteSlot>) -> Self {
        Self(Some(Arc::clone(writer).lock_owned().await))
    }
}

const HELD: &str = "a write guard holds the open write connection until dropped";

impl std::ops::Deref for WriteGuard {
    type Target = Writer;

    fn deref(&self) -> &Writer {
        self.0.as_ref().and_then(|g| g.as_ref()).expect(HELD)
    }
}

impl std::ops::DerefMut for WriteGuard {
    fn deref_mut(&mut self) -> &mut Writer {
        self.0.as_mut().and_then(|g| g.as_mut()).expect(HELD)
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        let Some(mut g) = self.0.take() else { return };
        let Some(path) = g
            .as_ref()
            .filter(|w| w.open_tx)
            .map(|w| Arc::clone(&w.path))
        else {
            return;
        };
        tracing::debug!("a write operation was cancelled midway; rolling it back");
        let shown = Arc::clone(&path);
        let started = std::thread::Builder::new()
            .name("store-sqlite-rollback".into())
            .spawn(move || {
                // Nothing in a rollback needs a timer or an IO driver: the connection answers
                // from its own worker thread.
                match tokio::runtime::Builder::new_current_thread().build() {
                    Ok(rt) => rt.block_on(async {
                        if let Some(w) = g.as_mut() {
                            w.rollback().await;
                        }
                    }),
                    Err(e) => {
                        tracing::warn!(path = %shown.display(), error = %awareness_core::error::ErrorChain(&e), "cannot roll back a cancelled write now; the next write does");
                    }
                }
            });
        if let Err(e) = started {
            tracing::warn!(path = %path.display(), error = %awareness_core::error::ErrorChain(&e), "cannot roll back a cancelled write now; the next write does");
        }
    }
}

/// Which target keys are known to have cursors, so that recording on them goes straight to
/// the two-batch path. Only a hint: a wrong or missing entry costs at most one extra batch,
/// never correctness.
#[derive(Default)]
pub(crate) struct Hints {
    watched: std::sync::Mutex<HashSet<SessionKey>>,
}

impl Hints {
    /// Bound on remembered keys; past it the set starts over.
    const MAX: usize = 65_536;

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<SessionKey>> {
        self.watched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn is_watched(&self, key: &SessionKey) -> bool {
        self.lock().contains(key)
    }

    pub(crate) fn set_watched(&self, key: &SessionKey, watched: bool) {
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
pub(crate) struct Readers {
    pub(crate) conns: Box<[Mutex<SqliteConnection>]>,
    /// One permit per connection: a read waits for whichever connection frees first, not for
    /// one picked in advance (which a checkpoint may hold for long).
    pub(crate) free: tokio::sync::Semaphore,
    pub(crate) next: AtomicUsize,
    /// Checkpoint rounds in a row that left their last pass (the one that holds the write
    /// connection) undone, every pass having been slow ([`Readers::last_pass`]).
    rounds_without_last_pass: std::sync::atomic::AtomicU32,
}

/// Checkpoint rounds in a row that may leave the WAL to grow before one holds the write
/// connection for its last pass however slow its passes were.
pub(crate) const ROUNDS_BEFORE_THE_LAST_PASS_IS_FORCED: u32 = 4;

/// The most frames the pass just before a forced last pass may leave to copy (4 MiB of 4 KiB
/// pages). The last pass copies those, and what the writes queued for the write connection
/// ahead of it add (its wait is first in, first out), and fsyncs.
const FORCED_LAST_PASS_MAX_FRAMES: i64 = 1_024;

/// How a checkpoint round makes its last pass ([`Readers::last_pass`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LastPass {
    /// Not this round.
    Not,
    /// Now (a pass was quick).
    Now,
    /// After one more pass without the write connection, if that pass leaves few frames to
    /// copy (forced after slow rounds).
    IfFewLeft,
}

/// A reader connection, held until dropped.
pub(crate) struct Reader<'a> {
    conn: MutexGuard<'a, SqliteConnection>,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl std::ops::Deref for Reader<'_> {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for Reader<'_> {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.conn
    }
}

impl Readers {
    /// The reader connections, and a permit for each.
    pub(crate) fn new(conns: Vec<Mutex<SqliteConnection>>) -> Self {
        Self {
            free: tokio::sync::Semaphore::new(conns.len()),
            conns: conns.into_boxed_slice(),
            next: AtomicUsize::new(0),
            rounds_without_last_pass: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// Whether a checkpoint round makes its last pass, which holds the write connection: after
    /// a `quick` pass that left `few_left` frames to copy (a pass is also quick when it can copy
    /// nothing, another reader holding an old snapshot: the last pass would then copy all it
    /// left while holding the write connection, so a quick pass that left many counts as a
    /// round without one); or else, once [`ROUNDS_BEFORE_THE_LAST_PASS_IS_FORCED`] rounds in a row
    /// went without, when its last pass left `few_left` frames to copy, and one more pass
    /// just before taking the connection leaves few too. Where every pass is slow (a disk
    /// whose fsync takes longer than the quick bound) the WAL otherwise never started over,
    /// and grew for as long as the writes went on; where much is left (a pruning pass writing
    /// fast), the rounds go on counting until one leaves little. A last pass made is reported
    /// with [`Readers::last_pass_made`], which starts the count over.
    pub(crate) fn last_pass(&self, quick: bool, few_left: bool) -> LastPass {
        if quick && few_left {
            return LastPass::Now;
        }
        let rounds = self
            .rounds_without_last_pass
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if rounds >= ROUNDS_BEFORE_THE_LAST_PASS_IS_FORCED && few_left {
            LastPass::IfFewLeft
        } else {
            LastPass::Not
        }
    }

    /// A last pass was made: the rounds without one are counted from 0 again.
    pub(crate) fn last_pass_made(&self) {
        self.rounds_without_last_pass.store(0, Ordering::Release);
    }

    pub(crate) async fn get(&self) -> Reader<'_> {
        // Never closed: a permit always comes.
        let permit = self
            .free
            .acquire()
            .await
            .expect("the readers' semaphore is never closed");
        for r in &*self.conns {
            if let Ok(conn) = r.try_lock() {
                return Reader {
                    conn,
                    _permit: permit,
                };
            }
        }
        // A connection held without a permit (the one `foreign_commits` asks on a read-only
        // handle): wait for one in turn.
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        Reader {
            conn: self.conns[i].lock().await,
            _permit: permit,
        }
    }

    /// Copies the WAL back into the database file with PASSIVE checkpoints on a reader
    /// connection, while writes go on. When a pass finds little left to copy, one last pass
    /// runs while holding this handle's write connection, so that the WAL is complete in the
    /// file and the next write transaction starts the WAL file over instead of growing it. When
    /// writes keep the passes long (a pruning pass), the rest is left to the next round, so the
    /// write connection is not held for a long copy, up to a bound: every
    /// [`ROUNDS_BEFORE_THE_LAST_PASS_IS_FORCED`]th round in a row without a quick pass makes
    /// its last pass all the same when one more pass leaves little to copy
    /// ([`Readers::last_pass`]).
    pub(crate) async fn checkpoint(&self, path: &Path, writer: Option<&WriteSlot>) {
        const QUICK: std::time::Duration = std::time::Duration::from_millis(5);
        // A reader is taken for each pass and let go between them. The last pass takes its
        // reader before the write connection (nothing that holds the write connection waits
        // for a reader, so this wait ends), so the writer is held for that one short pass,
        // not for a wait behind reads. Reads meanwhile take the other readers; with a single
        // reader they wait for the writes queued ahead of the pass.
        //
        // A pass answers how long it took and the frames it left to copy, `None` for those
        // when another connection held the checkpoint (SQLite's busy answer: nothing was
        // copied, and what is left is not known).
        let pass = async |conn: &mut SqliteConnection| {
            let started = std::time::Instant::now();
            let result = sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(PASSIVE)")
                .fetch_all(&mut *conn)
                .await;
            match &result {
                Ok(r) => {
                    tracing::trace!(path = %path.display(), result = ?r, "checkpointed the WAL");
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %awareness_core::error::ErrorChain(e), "background WAL checkpoint failed");
                }
            }
            // Frames the pass left to copy: in the log, less those copied (a log of -1 frames
            // is no WAL at all).
            let left = match result.as_ref().ok()?.first() {
                Some((busy, ..)) if *busy != 0 => None,
                Some((_, log, done)) => Some((log - done).max(0)),
                None => Some(0),
            };
            Some(left.map(|left| (started.elapsed(), left)))
        };
        let few = |left: Option<(std::time::Duration, i64)>| {
            left.is_some_and(|(_, left)| left <= FORCED_LAST_PASS_MAX_FRAMES)
        };
        let mut quick = false;
        let mut left = None;
        for _ in 0..4 {
            let Some(done) = pass(&mut *self.get().await).await else {
                return;
            };
            left = done;
            if done.is_some_and(|(took, _)| took < QUICK) {
                quick = true;
                break;
            }
        }
        let Some(w) = writer else { return };
        let mut conn = match self.last_pass(quick, few(left)) {
            LastPass::Not => return,
            LastPass::Now => self.get().await,
            LastPass::IfFewLeft => {
                // Measured again, with the reader the last pass uses: taking it may have
                // waited while writes went on.
                let mut conn = self.get().await;
                match pass(&mut conn).await {
                    Some(left) if few(left) => conn,
                    _ => return,
                }
            }
        };
        let _quiet = w.lock().await;
        // The count starts over only once a last pass is made (it did not fail, and another
        // connection's checkpoint did not keep it from copying); else it is tried again.
        if pass(&mut conn).await.is_some_and(|done| done.is_some()) {
            self.last_pass_made();
        }
    }
}

/// Runs a batch to the end (every statement, including a final COMMIT) and returns its rows.
/// `fetch_optional`/`fetch_one` would stop sqlx's worker after the first row.
pub(crate) async fn batch(
    conn: &mut SqliteConnection,
    q: Query,
    what: &str,
) -> Result<Vec<SqliteRow>, StoreError> {
    q.fetch_all(&mut *conn)
        .await
        .map_err(|e| error::map(what, e))
}

/// A batch that answers exactly one row.
pub(crate) async fn batch_one(
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

pub(crate) fn get<'r, T>(row: &'r SqliteRow, i: usize, what: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>,
{
    row.try_get::<T, _>(i).map_err(|e| StoreError::Corrupt {
        context: format!("{what}: column {i}"),
        source: Some(Box::new(e)),
    })
}

/// Commits, writing the cursors first when there are any.
pub(crate) async fn persist_cursors(
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
