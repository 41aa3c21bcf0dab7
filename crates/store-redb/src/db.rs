//! Opening a file: the process-wide registry (one `Database` per file per process), the schema
//! check, error mapping, and the background flusher of the bounded-loss mode.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use awareness_core::{OpenFailure, StoreError};
use redb::{
    ConcurrencyMode, Database, DatabaseError, ReadOnlyDatabase, ReadTransaction, ReadableDatabase,
    ReadableTable, ReadableTableMetadata, TableHandle,
};
use tracing::{error, warn};

use crate::tables::{self, LAST_SEQUENCE, META, SCHEMA_VERSION, SCHEMA_VERSION_KEY};

/// Maps any redb error into a [`StoreError`], keeping it as the source.
pub(crate) trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, StoreError>;
}

impl<T, E: Into<redb::Error>> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, StoreError> {
        self.map_err(|e| from_redb(what, e.into()))
    }
}

/// Whether redb refused to begin a write transaction for a failure it keeps refusing every
/// write for until the database is reopened: an I/O failure met earlier (`PreviousIo`), or
/// its allocator state discarded by a commit that panicked or failed its check (a
/// `Corrupted` error of a sound file). Every storage error at the beginning of a write is
/// taken as one: redb has written nothing by then, so it refuses for the state of this open
/// database, which reopening rebuilds (and repairs, or refuses, when the file itself is
/// damaged).
fn latched(e: &redb::TransactionError) -> bool {
    matches!(e, redb::TransactionError::Storage(_))
}

fn from_redb(what: &str, e: redb::Error) -> StoreError {
    match e {
        redb::Error::Corrupted(_)
        | redb::Error::TableTypeMismatch { .. }
        | redb::Error::TypeDefinitionChanged { .. }
        | redb::Error::TableIsMultimap(_)
        | redb::Error::TableIsNotMultimap(_)
        | redb::Error::TableDoesNotExist(_) => StoreError::Corrupt {
            context: format!("{what}: {e}"),
            source: Some(Box::new(e)),
        },
        e => StoreError::backend(what.to_owned(), e),
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here only reads or replaces plain values, so a panic elsewhere
    // cannot leave them half-updated.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A one-shot "this database handle is closed" signal.
#[derive(Default)]
struct Closed {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Closed {
    fn set(&self) {
        *lock(&self.done) = true;
        self.cv.notify_all();
    }

    fn is_set(&self) -> bool {
        *lock(&self.done)
    }

    /// Waits for the signal for at most `timeout`; returns whether it is set.
    fn wait_for(&self, timeout: Duration) -> bool {
        let g = lock(&self.done);
        *self
            .cv
            .wait_timeout_while(g, timeout, |done| !*done)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }
}

/// How this process has a file open.
enum Db {
    /// Read-write: the file is locked against every other process's writers, and against its
    /// readers too unless opened with live readers (decision 0009).
    Write(Database),
    /// Read-only: other processes may open it read-only too, and a writer with live readers
    /// may join (decision 0009); no other writer.
    Read(ReadOnlyDatabase),
}

/// One open file, shared by every [`crate::RedbStore`] on it in this process.
pub(crate) struct Shared {
    db: Option<Db>,
    path: PathBuf,
    /// A commit with `Durability::None` happened since the last durable commit.
    unflushed: AtomicBool,
    /// The number of the flush waiting for redb's write lock (0: none): the next commit of a
    /// writer is made durable in its stead ([`Shared::flush_to_stand_in_for`]). A busy drain
    /// takes the lock again microseconds after each commit, and redb's lock is not fair:
    /// measured under 16 recording tasks, the flusher waited up to 161 ms for it (a 50 ms
    /// interval), and the commits of that wait were at risk beyond the promised interval. The
    /// flush still waits for the lock before it returns (to abort an empty transaction).
    flush_asked: AtomicU64,
    /// The last number given to a flush.
    flush_numbers: AtomicU64,
    /// The highest flush number a durable commit has stood in for, once it committed.
    flush_made: AtomicU64,
    /// The flush number a durable commit is standing in for, from just before its commit until
    /// it says how that went: redb lets go of its lock inside the commit, so the flush may
    /// have the lock before the stand-in has reported.
    flush_pending: AtomicU64,
    /// Flushes that found a commit had stood in for them (tests).
    #[cfg(test)]
    stood_in: AtomicU64,
    /// Makes the next check after a failed write panic while it begins its transaction, as
    /// redb does once a lock of its is poisoned (tests).
    #[cfg(test)]
    pub(crate) check_panics: AtomicBool,
    /// Makes the next commit of a writer fail as a write of the file would, without
    /// committing (tests).
    #[cfg(test)]
    pub(crate) commit_fails: AtomicBool,
    /// Makes the next flush's durable commit fail as a write of the file would, without
    /// committing (tests).
    #[cfg(test)]
    pub(crate) flush_fails: AtomicBool,
    /// Held by a flush from claiming the pending commits until its durable commit is done, so
    /// that a second flush cannot find nothing pending and return before the first is durable.
    flushing: Mutex<()>,
    /// Opened read-write in redb's `SingleWriter` mode ([`crate::RedbOptions::live_readers`]).
    live_readers: bool,
    closed: Arc<Closed>,
    /// The [`crate::RedbStore`]s open on this file (see [`Handle`]).
    handles: AtomicUsize,
    /// A commit failed, or redb met an I/O failure inside a write transaction (growing the
    /// file, say), or a commit panicked. redb then refuses every write transaction on this
    /// database until it is closed and opened again (`PreviousIo`, or an allocator state
    /// "discarded", which reads as corruption of a sound file): writes say so instead, and a
    /// new open does not share it.
    write_failed: AtomicBool,
    /// What the first failure that set `write_failed` said: every later refusal repeats it,
    /// so that the cause (a full disk, say) is not lost behind "failed earlier".
    first_failure: OnceLock<String>,
}

impl Shared {
    fn db(&self) -> &Db {
        self.db
            .as_ref()
            .expect("the database stays open until the handle is dropped")
    }

    /// The database, when this process has the file open read-write.
    pub(crate) fn writable(&self) -> Option<&Database> {
        match self.db() {
            Db::Write(db) => Some(db),
            Db::Read(_) => None,
        }
    }

    /// Whether other processes may read the file while this process writes it.
    pub(crate) fn live_readers(&self) -> bool {
        self.live_readers
    }

    /// The database, for a write: [`StoreError::ReadOnly`] when the file is open read-only,
    /// and a [`StoreError::Backend`] saying so once a write failed in a way redb refuses every
    /// later write for ([`Shared::commit_failed`]).
    pub(crate) fn for_write(&self, what: &str) -> Result<&Database, StoreError> {
        let db = self.writable().ok_or_else(|| self.read_only(what))?;
        if self.write_failed.load(Ordering::Acquire) {
            let cause = self.first_failure.get().map_or("", String::as_str);
            return Err(StoreError::backend(
                what.to_owned(),
                // The file is named by `StoreError::in_store`, where the refusal is returned.
                format!(
                    "a write on this file failed earlier ({cause}), and redb \
                     refuses every write until the database is reopened: close every handle \
                     on it in this process, then open it again"
                ),
            ));
        }
        Ok(db)
    }

    /// Records that a commit failed, or that redb met an I/O failure in a write (see
    /// [`Shared::write_failed`]), on `cause`. The first cause is logged, with the file, and
    /// kept for the refusals of the writes after it.
    pub(crate) fn commit_failed(&self, cause: &dyn std::fmt::Display) {
        if self.first_failure.set(cause.to_string()).is_ok() {
            error!(
                path = %self.path.display(),
                error = %cause,
                "a write failed in a way redb refuses every later write for; every write on this file is refused until it is reopened"
            );
        }
        self.write_failed.store(true, Ordering::Release);
    }

    /// Whether a write failed on this database in a way redb refuses every later write for
    /// ([`Shared::write_failed`]).
    pub(crate) fn needs_reopen(&self) -> bool {
        self.write_failed.load(Ordering::Acquire)
    }

    /// Begins a write transaction ([`Shared::for_write`]). When redb refuses it for an I/O
    /// failure it met earlier (one inside a write transaction that was then dropped), that is
    /// recorded as a failed commit would be, and the refusal says to reopen. Blocking.
    pub(crate) fn begin_write(&self, what: &str) -> Result<redb::WriteTransaction, StoreError> {
        match self.for_write(what)?.begin_write() {
            Ok(txn) => Ok(txn),
            Err(e) if latched(&e) => {
                self.commit_failed(&e);
                // Refused now, saying to reopen.
                self.for_write(what).and_then(|_| Err(e).ctx(what))
            }
            Err(e) => Err(e).ctx(what),
        }
    }

    /// After a write failed: records whether redb now refuses every write transaction (an I/O
    /// failure it latched, its allocator state discarded by a commit that panicked), so that
    /// the next write says to reopen and a new open in this process does not share the
    /// database. Costs one write transaction begun and aborted, on a failure path only. A
    /// panic while beginning it (a lock of redb's poisoned by the first panic) counts as such
    /// a refusal, and is caught: this runs where a panic is handled, and a second one would
    /// unwind out of the writer's drain. Blocking.
    ///
    /// `failure` is the error that failed the write, when there is one (not a panic): redb
    /// then refuses with its generic `PreviousIo` ("Previous I/O error occurred..."), and the
    /// failure is kept as the cause instead, so that every later refusal repeats what went
    /// wrong ("File too large", "No space left on device").
    pub(crate) fn check_after_failure(&self, failure: Option<&StoreError>) {
        if self.needs_reopen() {
            return;
        }
        if let Some(db) = self.writable() {
            let begun = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                #[cfg(test)]
                assert!(
                    !self.check_panics.swap(false, Ordering::AcqRel),
                    "the check's own panic"
                );
                match db.begin_write() {
                    Ok(txn) => drop(txn.abort()),
                    Err(e) if latched(&e) => match (failure, &e) {
                        (
                            Some(failure),
                            redb::TransactionError::Storage(redb::StorageError::PreviousIo),
                        ) => self.commit_failed(&awareness_core::error::ErrorChain(failure)),
                        _ => self.commit_failed(&e),
                    },
                    Err(_) => {}
                }
            }));
            if let Err(panic) = begun {
                self.commit_failed(&format_args!(
                    "beginning a write transaction panicked: {}",
                    awareness_core::error::panic_message(&*panic)
                ));
            }
        }
    }

    /// The refusal of a write on a read-only handle.
    pub(crate) fn read_only(&self, what: &str) -> StoreError {
        StoreError::ReadOnly {
            path: self.path.clone(),
            operation: what.to_owned(),
        }
    }

    /// A read snapshot, in either mode.
    pub(crate) fn begin_read(&self, what: &str) -> Result<ReadTransaction, StoreError> {
        match self.db() {
            Db::Write(db) => db.begin_read().ctx(what),
            Db::Read(db) => db.begin_read().ctx(what),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn mark_unflushed(&self) {
        self.unflushed.store(true, Ordering::Release);
    }

    /// The number of a flush waiting for redb's write lock that no commit has stood in for
    /// yet, if any: a commit holding the lock (commits take it one at a time) that is made
    /// durable then reports it with [`Shared::flush_stood_in`], once it has committed.
    pub(crate) fn flush_to_stand_in_for(&self) -> Option<u64> {
        let asked = self.flush_asked.load(Ordering::Acquire);
        (asked > self.flush_made.load(Ordering::Acquire)).then_some(asked)
    }

    /// A commit made durable for flush `number` is about to commit.
    pub(crate) fn stand_in_begins(&self, number: u64) {
        self.flush_pending.store(number, Ordering::Release);
    }

    /// A durable commit that stood in for flush `number` has committed.
    pub(crate) fn flush_stood_in(&self, number: u64) {
        self.flush_made.fetch_max(number, Ordering::AcqRel);
    }

    /// A durable commit that stood in for flush `number` is over: when it did not report
    /// [`Self::flush_stood_in`] first (it failed, or panicked), the flush commits itself.
    pub(crate) fn stand_in_over(&self, number: u64) {
        let _ = self
            .flush_pending
            .compare_exchange(number, 0, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Whether a commit stood in for flush `number`. Called with redb's write lock, so a
    /// stand-in has finished its commit; should it not have reported yet (it has only just
    /// let go of the lock), its report is waited for, a second at most (a stand-in that
    /// panicked never reports: the flush then commits itself).
    fn stood_in_for(&self, number: u64) -> bool {
        let served = || self.flush_made.load(Ordering::Acquire) >= number;
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        while !served()
            && self.flush_pending.load(Ordering::Acquire) == number
            && std::time::Instant::now() < deadline
        {
            std::thread::yield_now();
        }
        served()
    }

    /// Does what a flush does before it waits for the write lock (claims the pending commits,
    /// asks for a stand-in), for the tests of the stand-in.
    #[cfg(test)]
    pub(crate) fn ask_flush(&self) {
        self.unflushed.store(false, Ordering::Release);
        self.ask_for_stand_in();
    }

    /// Publishes a new flush number for a writer's next commit to stand in for (see
    /// [`Shared::flush_asked`]); answers it.
    fn ask_for_stand_in(&self) -> u64 {
        let number = self.flush_numbers.fetch_add(1, Ordering::AcqRel) + 1;
        self.flush_asked.store(number, Ordering::Release);
        number
    }

    /// Whether a flush still waits for a stand-in.
    #[cfg(test)]
    pub(crate) fn is_flush_due(&self) -> bool {
        self.flush_to_stand_in_for().is_some()
    }

    /// How many flushes found a commit had stood in for them.
    #[cfg(test)]
    pub(crate) fn flushes_stood_in(&self) -> u64 {
        self.stood_in.load(Ordering::Acquire)
    }

    /// Whether a commit is waiting for a flush to be durable.
    #[cfg(test)]
    pub(crate) fn is_unflushed(&self) -> bool {
        self.unflushed.load(Ordering::Acquire)
    }

    /// Makes every non-durable commit durable with one empty durable commit (a no-op when there
    /// is none). Returns once every commit made before the call is durable: a flush that finds
    /// another one in progress waits for it (that one may itself be waiting behind a long
    /// write), instead of returning at once because it claimed the pending commits.
    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        self.flush_with(false)
    }

    /// The last flush of a handle's background flusher: a durable commit even when none seems
    /// pending, so that it waits for a write transaction in progress that began non-durable
    /// (its handle was dropped meanwhile, and the flag that marks it comes with its commit)
    /// and makes it durable too. Blocking.
    pub(crate) fn flush_last(&self) -> Result<(), StoreError> {
        self.flush_with(true)
    }

    fn flush_with(&self, last: bool) -> Result<(), StoreError> {
        #[cfg(test)]
        if self.flushing.try_lock().is_err() {
            tests::flush_waits();
        }
        let _one_at_a_time = lock(&self.flushing);
        #[cfg(test)]
        if last {
            tests::last_flush_begins(&self.path);
        }
        if !self.unflushed.swap(false, Ordering::AcqRel) && !last {
            return Ok(());
        }
        // A panic inside redb (the flush thread catches it and goes on) must not leave the
        // commits it was making durable marked flushed: the next interval flushes them again.
        let _on_panic = RestoreOnPanic(self);
        // While this waits for the write lock, a writer's next commit is made durable in its
        // stead; once that has committed there is nothing left to commit here (except for a
        // last flush, which also waits for a transaction in progress that began non-durable).
        let number = self.ask_for_stand_in();
        #[cfg(test)]
        tests::panic_if_asked(&self.path);
        let result = self
            .begin_write("flush: begin a durable transaction")
            .and_then(|txn| {
                if last || !self.stood_in_for(number) {
                    #[cfg(test)]
                    let committed = if self.flush_fails.swap(false, Ordering::AcqRel) {
                        drop(txn);
                        Err(redb::CommitError::Storage(redb::StorageError::Io(
                            std::io::Error::other("the flush's own failure"),
                        )))
                    } else {
                        txn.commit()
                    };
                    #[cfg(not(test))]
                    let committed = txn.commit();
                    committed
                        .inspect_err(|e| self.commit_failed(e))
                        .ctx("flush: durable commit")
                } else {
                    #[cfg(test)]
                    self.stood_in.fetch_add(1, Ordering::AcqRel);
                    // A durable commit stood in for this flush: nothing to write.
                    txn.abort().ctx("flush: abort the empty transaction")
                }
            });
        self.flush_asked.store(0, Ordering::Release);
        if result.is_err() {
            self.mark_unflushed();
        }
        #[cfg(test)]
        if last && result.is_ok() {
            tests::last_flush_committed(&self.path);
        }
        result
    }
}

/// Marks the commits of a flush unflushed again, and its stand-in request withdrawn, when the
/// flush unwinds.
struct RestoreOnPanic<'a>(&'a Shared);

impl Drop for RestoreOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.flush_asked.store(0, Ordering::Release);
            self.0.mark_unflushed();
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let Some(db) = self.db.take() else {
            self.closed.set();
            return;
        };
        let path = &self.path;
        // A panic in redb while closing (a damaged page) is logged, not passed on to whoever
        // dropped the last handle, and the database counts as closed all the same: a
        // `close()` waiting for it, and the next open of the file, would otherwise wait for good.
        let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // A clean close also makes pending non-durable commits durable.
            let closed = match db {
                Db::Write(db) => {
                    drop_reservation(&db, path);
                    db.close()
                }
                Db::Read(db) => db.close(),
            };
            if let Err(e) = closed {
                warn!(path = ?path, error = %awareness_core::error::ErrorChain(&e), "closing the redb database failed");
            }
        }));
        if let Err(panic) = ended {
            error!(path = ?path, panic = awareness_core::error::panic_message(&*panic), "closing the redb database panicked; what was not durable may be lost");
        }
        self.closed.set();
    }
}

/// Removes the bounded mode's reservation of sequences before a clean close (see the `tables`
/// module), in a durable commit, so that the next open continues from the counter. A failure is
/// logged: the next open then skips the numbers reserved, which is safe.
fn drop_reservation(db: &Database, path: &Path) {
    let dropped = db.begin_write().ctx("close: begin").and_then(|txn| {
        if tables::drop_reservation(&txn)? {
            txn.commit().ctx("close: remove the reserved sequences")?;
        }
        Ok(())
    });
    if let Err(e) = dropped {
        warn!(path = ?path, error = %awareness_core::error::ErrorChain(&e), "removing the reserved sequences at close failed; the next open skips them");
    }
}

/// The database this process has (or last had) open on one file.
struct Entry {
    shared: Weak<Shared>,
    closed: Arc<Closed>,
    /// The file when it was opened: a file at the same path with another identity is another
    /// file (the first one deleted or renamed away), whose opens share nothing with this
    /// entry's.
    identity: FileKey,
}

impl Entry {
    /// Still open, or still closing (its file lock not yet released).
    fn is_live(&self) -> bool {
        self.shared.strong_count() > 0 || !self.closed.is_set()
    }
}

/// One file's place in the registry. Its lock is held while the file is opened (which may
/// repair it, or wait for its last handle to close), so that two opens of the file share one
/// database; other files' opens do not wait for it.
type Slot = Arc<Mutex<Option<Entry>>>;

/// What the registry knows a file by: its device and inode where the platform has them, so
/// that one file reached by two paths (a hard link, a bind mount) is one file, whose opens
/// share one database (redb's file lock would refuse the second as another process's); its
/// canonical path elsewhere.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum FileKey {
    /// Device and inode.
    #[cfg_attr(not(unix), allow(dead_code))]
    Inode(u64, u64),
    /// The canonical path, where the platform has no inode.
    #[cfg_attr(unix, allow(dead_code))]
    Path(PathBuf),
}

/// Every file this process has open, by [`FileKey`]. Its lock is only held to find or add a
/// file's [`Slot`], never across an open.
fn registry() -> &'static Mutex<HashMap<FileKey, Slot>> {
    static REGISTRY: OnceLock<Mutex<HashMap<FileKey, Slot>>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

/// The slot of `file`, added when missing. Drops the slots no open uses and whose file is
/// closed.
fn slot(file: &FileKey) -> Slot {
    let mut reg = lock(registry());
    reg.retain(|_, slot| {
        Arc::strong_count(slot) > 1
            || slot
                .try_lock()
                .map_or(true, |entry| entry.as_ref().is_some_and(Entry::is_live))
    });
    Arc::clone(reg.entry(file.clone()).or_default())
}

fn open_error(
    path: &Path,
    kind: OpenFailure,
    reason: impl Into<String>,
    source: Option<redb::Error>,
) -> StoreError {
    StoreError::open(
        path,
        kind,
        reason,
        source.map(|e| Box::new(e) as awareness_core::BoxError),
    )
}

/// Names the file in the error of an open that failed after redb opened the file, where the
/// error carries only what was being done. A damaged file stays [`StoreError::Corrupt`] and a
/// busy one [`StoreError::Busy`], the file named in their context (as store-sqlite names it in
/// a busy open); any other failure (an I/O error, a task or a thread that failed) is a
/// [`StoreError::Open`] naming the file, with the failure's chain as the reason and the
/// original error as the source; an error that names the file already is returned as it is.
pub(crate) fn naming_the_file(path: &Path, e: StoreError) -> StoreError {
    // "open <path>: <what>", without a second "open: " where the context starts with one.
    let named = |context: String| {
        let what = context.strip_prefix("open: ").unwrap_or(&context);
        format!("open {}: {what}", path.display())
    };
    match e {
        StoreError::Corrupt { context, source } => StoreError::Corrupt {
            context: named(context),
            source,
        },
        StoreError::Busy { context, source } => StoreError::Busy {
            context: named(context),
            source,
        },
        StoreError::Backend { context, source } => StoreError::open(
            path,
            OpenFailure::Other,
            format!(
                "{}: {}",
                context.strip_prefix("open: ").unwrap_or(&context),
                awareness_core::error::ErrorChain(&*source)
            ),
            Some(source),
        ),
        named_already => named_already,
    }
}

fn io_open_error(path: &Path, what: &str, e: std::io::Error) -> StoreError {
    StoreError::open(path, OpenFailure::of_io(&e), what, Some(Box::new(e)))
}

/// Why a read-write open is refused while another process has the file open, and what to do.
pub(crate) const ALREADY_OPEN: &str =
    "another process has it open (a running gateway?): try again once it has exited";

fn database_error(path: &Path, e: DatabaseError) -> StoreError {
    let kind = match &e {
        DatabaseError::DatabaseAlreadyOpen => OpenFailure::InUse,
        DatabaseError::UpgradeRequired(_) => OpenFailure::Unsupported,
        DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() == ErrorKind::InvalidData =>
        {
            OpenFailure::NotAStore
        }
        DatabaseError::Storage(redb::StorageError::Io(io)) => OpenFailure::of_io(io),
        _ => OpenFailure::Other,
    };
    let reason = match &e {
        // Only a read-only open gives up on a repair.
        DatabaseError::RepairAborted => {
            return StoreError::NeedsRepair {
                path: path.to_owned(),
            };
        }
        // The reason in our words, and redb's error as the source only: a reporter that walks
        // the sources (`ErrorChain`) then prints redb's words once.
        DatabaseError::DatabaseAlreadyOpen => ALREADY_OPEN.to_owned(),
        DatabaseError::UpgradeRequired(v) => {
            format!("written in redb file format {v}, which this version cannot open")
        }
        // redb reports a foreign file as InvalidData ("Not a redb database: ...").
        DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() == ErrorKind::InvalidData =>
        {
            "not a redb database".to_owned()
        }
        DatabaseError::Storage(redb::StorageError::Corrupted(_)) => {
            "not a redb database, or a damaged one".to_owned()
        }
        _ => "redb cannot open it".to_owned(),
    };
    open_error(path, kind, reason, Some(e.into()))
}

/// How a file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Read-write, creating a missing file.
    Create,
    /// Read-write, refusing a missing file.
    Existing,
    /// Read-only: nothing is created or written.
    ReadOnly,
}

/// Creates a missing file (mode 0600 on unix) when allowed. An open that fails after this
/// leaves the file, empty, which the next creating open makes a store: removing it could
/// remove the store another opener made of it meanwhile (in this process or another), which
/// an empty file costs nothing to avoid.
fn ensure_file(path: &Path, mode: Mode) -> Result<(), StoreError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {
            let refused = match mode {
                _ if m.len() > 0 => None,
                Mode::Create => None,
                Mode::Existing => {
                    Some("an empty file, not yet a store, and create_if_missing is off")
                }
                Mode::ReadOnly => {
                    Some("an empty file, not yet a store, and a read-only open creates nothing")
                }
            };
            match refused {
                Some(reason) => Err(open_error(path, OpenFailure::NotAStore, reason, None)),
                None => Ok(()),
            }
        }
        Ok(_) => Err(open_error(
            path,
            OpenFailure::NotAStore,
            "not a regular file",
            None,
        )),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let refused = match mode {
                Mode::Create => None,
                Mode::Existing => Some("no such file (create_if_missing is off)"),
                Mode::ReadOnly => Some("no such file (a read-only open creates nothing)"),
            };
            if let Some(reason) = refused {
                return Err(io_open_error(path, reason, e));
            }
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            match opts.open(path) {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(io_open_error(path, "cannot create the file", e)),
            }
        }
        Err(e) => Err(io_open_error(path, "cannot read the file's metadata", e)),
    }
}

/// The schema version in the opened meta table; `None` when the table or the key is missing (a
/// read transaction cannot create the table). A meta table of another shape is not our store.
fn stored_version<T: ReadableTable<&'static str, u64>>(
    meta: Result<T, redb::TableError>,
    path: &Path,
) -> Result<Option<u64>, StoreError> {
    match meta {
        Ok(meta) => Ok(meta
            .get(SCHEMA_VERSION_KEY)
            .ctx("open: read the schema")?
            .map(|g| g.value())),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(open_error(
            path,
            OpenFailure::NotAStore,
            format!("not a session-awareness store: {e}"),
            Some(e.into()),
        )),
    }
}

/// Creates the tables of a new file, or checks that an existing file is one of ours: one of
/// schema 1 or 2 is migrated to [`SCHEMA_VERSION`], and a sequence reservation its last writer
/// left is settled ([`tables::settle_reservation`]).
fn init_schema(db: &Database, path: &Path, mode: Mode) -> Result<(), StoreError> {
    let txn = db.begin_write().ctx("open: begin a write")?;
    let version = stored_version(txn.open_table(META), path)?;
    match version {
        Some(SCHEMA_VERSION) => {
            if tables::settle_reservation(&txn)? {
                txn.commit().ctx("open: settle the reserved sequences")?;
            }
            Ok(())
        }
        Some(from @ (1 | 2)) => {
            // Schema 1 kept heads in a table of their own; schema 2 keeps them in the
            // reference index, as schema 3 does. Schema 3 changes no table: it says that the
            // file may hold a sequence reservation, which a build of schema 2 reads past
            // (docs/decisions/0006); writing it makes such builds refuse the file. One write
            // transaction: a crash during it leaves the file at its old schema.
            let moved = if from == 1 {
                tables::migrate_v1(&txn)?
            } else {
                0
            };
            txn.open_table(META)
                .ctx("open: the meta table")?
                .insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)
                .ctx("open: write the schema")?;
            // A reservation the last writer left (files of schema 1 and 2 had them too) is
            // settled as at any read-write open: the numbers it covered may have been handed
            // out.
            tables::settle_reservation(&txn)?;
            txn.commit().ctx("open: migrate the schema")?;
            tracing::info!(
                path = %path.display(),
                heads = moved,
                "migrated a store from schema {from} to {SCHEMA_VERSION}"
            );
            Ok(())
        }
        Some(v) => Err(unsupported_schema(path, v)),
        None => {
            let mut foreign: Vec<String> = txn
                .list_tables()
                .ctx("open: list tables")?
                .map(|t| t.name().to_owned())
                .filter(|n| n != META.name())
                .collect();
            // `stored_version` opened (so created) the meta table if it was missing. One that
            // holds keys but no schema version is another application's: a new store of ours
            // writes its tables and its schema version in one transaction.
            let meta_rows = txn
                .open_table(META)
                .ctx("open: the meta table")?
                .len()
                .ctx("open: read the meta table")?;
            if meta_rows > 0 {
                foreign.insert(0, META.name().to_owned());
            }
            if !foreign.is_empty() {
                // Dropping the transaction aborts it: the other application's file is untouched.
                return Err(open_error(
                    path,
                    OpenFailure::NotAStore,
                    format!(
                        "a redb database of another application (tables {foreign:?}), not a session-awareness store"
                    ),
                    None,
                ));
            }
            if mode != Mode::Create {
                // A redb database holding no table yet: this open may create no store.
                return Err(open_error(
                    path,
                    OpenFailure::NotAStore,
                    "a redb database without this store's tables, and create_if_missing is off",
                    None,
                ));
            }
            tables::create_all(&txn)?;
            {
                let mut meta = txn.open_table(META).ctx("open: the meta table")?;
                meta.insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)
                    .ctx("open: write the schema")?;
                meta.insert(LAST_SEQUENCE, 0)
                    .ctx("open: write the schema")?;
            }
            txn.commit().ctx("open: create the tables")
        }
    }
}

fn unsupported_schema(path: &Path, version: u64) -> StoreError {
    open_error(
        path,
        OpenFailure::Unsupported,
        format!(
            "store schema version {version} is not supported (this build reads versions up to {SCHEMA_VERSION})"
        ),
        None,
    )
}

/// Checks, without writing, that a file opened read-only is a store this build reads as it is:
/// of this build's schema, or of schema 2, whose tables are the same (a read-only open cannot
/// write the new version; the file's next read-write open does).
fn check_schema(db: &ReadOnlyDatabase, path: &Path) -> Result<(), StoreError> {
    let txn = db.begin_read().ctx("open: begin a read")?;
    let version = stored_version(txn.open_table(META), path)?;
    match version {
        Some(2 | SCHEMA_VERSION) => Ok(()),
        Some(1) => Err(open_error(
            path,
            OpenFailure::NeedsMigration,
            format!(
                "written in store schema 1, which a read-write open migrates to {SCHEMA_VERSION}; a read-only open cannot"
            ),
            None,
        )),
        Some(v) => Err(unsupported_schema(path, v)),
        None => Err(open_error(
            path,
            OpenFailure::NotAStore,
            "a redb database without this store's schema version: not a session-awareness store",
            None,
        )),
    }
}

/// Opens `path` read-only in redb's `SingleWriter` mode, which shares the file with a writer
/// that lets readers in and, with no writer, lets one start meanwhile (a reader in the default
/// mode would lock it out). Where that mode is not available (it needs byte-range locks), the
/// default mode.
fn open_read_only(
    path: &Path,
    canonical: &Path,
    cache_size: usize,
) -> Result<ReadOnlyDatabase, StoreError> {
    refuse_if_shorter_than_its_layout(path, canonical)?;
    let open = |mode| {
        Database::builder()
            .set_cache_size(cache_size)
            .set_concurrency_mode(mode)
            .open_read_only(canonical)
    };
    match open(ConcurrencyMode::SingleWriter) {
        Ok(db) => Ok(db),
        Err(e @ DatabaseError::DatabaseAlreadyOpen) => Err(open_error(
            path,
            OpenFailure::InUse,
            "already open in another process, in a mode that excludes readers (a writer without live_readers)",
            Some(e.into()),
        )),
        // The storage has no byte-range locks: the default mode's whole-file lock instead.
        Err(DatabaseError::Storage(redb::StorageError::Unsupported)) => {
            open(ConcurrencyMode::ExclusiveWriter).map_err(|e| database_error(path, e))
        }
        Err(e) => Err(database_error(path, e)),
    }
}

/// The length in bytes that the header of a redb file (file format 3, redb 4) gives its
/// regions, or `None` when `header` is not one, or not one whose counts redb trusts: the
/// database header page, then each full region (its header pages and its data pages) and a
/// trailing partial region. The counts are u32 little-endian from byte 12: page size, region
/// header pages, region data pages, full regions, the trailing region's data pages. redb
/// rebuilds them from the file's length when the file was not closed cleanly (the god byte,
/// byte 9, has its recovery bit), since they may then be torn: `None` for such a file too.
fn layout_len(header: &[u8]) -> Option<u64> {
    const MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];
    const RECOVERY_REQUIRED: u8 = 2;
    if header.get(..MAGIC.len())? != MAGIC || header.get(9)? & RECOVERY_REQUIRED != 0 {
        return None;
    }
    let word = |at: usize| -> Option<u64> {
        let bytes = header.get(at..at + 4)?.try_into().ok()?;
        Some(u64::from(u32::from_le_bytes(bytes)))
    };
    let (page, region_header, region_data, full, trailing) =
        (word(12)?, word(16)?, word(20)?, word(24)?, word(28)?);
    let trailing_region = if trailing > 0 {
        region_header.checked_add(trailing)?
    } else {
        0
    };
    full.checked_mul(region_header.checked_add(region_data)?)?
        .checked_add(trailing_region)?
        .checked_add(1)?
        .checked_mul(page)
}

/// Refuses a file shorter than the regions its header describes: cut short (a copy that
/// stopped, a full disk). A read-write open finds this and refuses the file; redb's read-only
/// open in `SingleWriter` mode does not look (a writer of another process may be resizing the
/// file), and would open it, to fail on the first read that reaches a missing page. A file
/// longer than its layout is left to redb (a writer may have grown it meanwhile), and so is
/// one its writer did not close (redb asks for a repair). The header is read without redb's
/// lock: a writer of another process shrinking the file at that moment could make a sound
/// file look short, and the open is refused; opening again then succeeds.
fn refuse_if_shorter_than_its_layout(path: &Path, canonical: &Path) -> Result<(), StoreError> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(canonical)
        .map_err(|e| io_open_error(path, "cannot open the file", e))?;
    let mut header = [0; 32];
    let len = file
        .metadata()
        .map_err(|e| io_open_error(path, "cannot read the file's metadata", e))?
        .len();
    if file.read_exact(&mut header).is_err() {
        // Too short for a header: redb refuses it with its own reason.
        return Ok(());
    }
    match layout_len(&header) {
        Some(expected) if len < expected => Err(open_error(
            path,
            OpenFailure::Other,
            format!(
                "the file is {len} bytes, shorter than the {expected} its header describes: it was cut short (a copy that stopped, a full disk); a read-only open cannot repair it"
            ),
            None,
        )),
        _ => Ok(()),
    }
}

/// How long an open waits for the database of its file to close when no handle holds it any
/// longer (its last handle is closing, or only an operation whose caller gave up still runs
/// on it) before it is refused: a close takes milliseconds and an operation seconds at most,
/// so a longer wait means something is stuck, and an error says so where a wait would hang.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

fn close_wait(canonical: &Path) -> Duration {
    #[cfg(test)]
    if let Some(bound) = tests::close_wait(canonical) {
        return bound;
    }
    let _ = canonical;
    CLOSE_WAIT
}

/// The [`FileKey`] of the file at `canonical` now.
fn file_identity(canonical: &Path) -> std::io::Result<FileKey> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(canonical)?;
        Ok(FileKey::Inode(meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        std::fs::metadata(canonical)?;
        Ok(FileKey::Path(canonical.to_path_buf()))
    }
}

/// How many times an open looks the file up again when the file at its path changed between
/// finding its slot and locking it, before it says so.
const LOOKUPS: usize = 8;

/// Opens (or shares) the database of `path`. Blocking: call inside `spawn_blocking`.
///
/// A read-only open shares a database this process already has open, in either mode. A
/// read-write open cannot share a read-only one, which cannot write, and a process keeps one
/// database per file: it is refused until the read-only handles close. `live_readers` opens a
/// new read-write database in redb's `SingleWriter` mode; a read-write open must agree with
/// the database it shares.
///
/// A database no handle holds any longer (only an operation whose caller gave up still runs
/// on it) is not held against a read-write open: the open waits for that operation to end and
/// then opens the file anew, or is refused after [`CLOSE_WAIT`]. The returned [`Handle`] is counted with the file's slot locked,
/// so that such an open can tell the two cases apart.
pub(crate) fn open_shared(
    path: &Path,
    mode: Mode,
    cache_size: usize,
    live_readers: bool,
) -> Result<Handle, StoreError> {
    ensure_file(path, mode)?;
    open_file(path, mode, cache_size, live_readers)
}

/// [`open_shared`] once the file exists.
fn open_file(
    path: &Path,
    mode: Mode,
    cache_size: usize,
    live_readers: bool,
) -> Result<Handle, StoreError> {
    let canonical = std::fs::canonicalize(path)
        .map_err(|e| io_open_error(path, "cannot resolve the path", e))?;
    let identity = || {
        file_identity(&canonical)
            .map_err(|e| io_open_error(path, "cannot read the file's metadata", e))
    };
    // The file's slot, locked, found for the file still at the path once it is locked.
    let mut lookups = 0;
    let mut slot_of_file;
    let mut entry_of_file;
    let identity_now = loop {
        let key = identity()?;
        slot_of_file = slot(&key);
        entry_of_file = lock(&slot_of_file);
        if identity()? == key {
            break key;
        }
        drop(entry_of_file);
        lookups += 1;
        if lookups == LOOKUPS {
            return Err(open_error(
                path,
                OpenFailure::Other,
                "the file at this path kept being replaced while it was being opened",
                None,
            ));
        }
    };
    #[cfg(test)]
    tests::while_opening(&canonical);
    // An entry of another file at this path (the one it had was deleted or renamed away while
    // open) is neither shared nor waited for: its handles keep their own file.
    if let Some(entry) = entry_of_file
        .as_ref()
        .filter(|e| e.identity == identity_now)
    {
        if let Some(shared) = entry.shared.upgrade() {
            let refused = if shared.needs_reopen() {
                // Not in use: unusable, until this process's own handles are all closed.
                Some((
                    OpenFailure::Other,
                    "a write failed on it in this process (an I/O error, or a commit that panicked), and redb refuses every write until it is reopened: close every handle on it first"
                        .to_owned(),
                ))
            } else if mode == Mode::ReadOnly {
                None
            } else if shared.writable().is_none() {
                Some((
                    OpenFailure::InUse,
                    "open read-only in this process: a read-write handle needs every read-only handle on the file closed first"
                        .to_owned(),
                ))
            } else if shared.live_readers != live_readers {
                // Options that contradict those the file is open with: no wait makes them agree.
                Some((
                    OpenFailure::InvalidOptions,
                    format!(
                        "open in this process with live_readers {}: every read-write handle on a file must agree",
                        shared.live_readers
                    ),
                ))
            } else {
                None
            };
            match refused {
                None => return Ok(Handle::new(&shared)),
                // Only an operation whose caller gave up still holds the database: the open
                // waits for it below instead of refusing.
                Some(_) if shared.handles.load(Ordering::Acquire) == 0 => {}
                Some((kind, reason)) => return Err(open_error(path, kind, reason, None)),
            }
        }
        // The last handle is being dropped right now, or is gone while an operation its caller
        // gave up still runs: wait until the file lock is released.
        #[cfg(test)]
        tests::waiting_for_close(&canonical);
        let bound = close_wait(&canonical);
        if !entry.closed.wait_for(bound) {
            return Err(open_error(
                path,
                OpenFailure::InUse,
                format!(
                    "still open in this process after {} s: its last handle is still closing, or an operation whose caller gave up still runs on it; open again once it ends",
                    bound.as_secs_f64()
                ),
                None,
            ));
        }
        *entry_of_file = None;
    }
    let db = if mode == Mode::ReadOnly {
        let db = open_read_only(path, &canonical, cache_size)?;
        // A file redb opened but cannot read is refused as one that cannot be opened (a
        // damaged one as Corrupt), naming it.
        check_schema(&db, path).map_err(|e| naming_the_file(path, e))?;
        Db::Read(db)
    } else {
        let concurrency = if live_readers {
            ConcurrencyMode::SingleWriter
        } else {
            ConcurrencyMode::ExclusiveWriter
        };
        let db = Database::builder()
            .set_cache_size(cache_size)
            .set_concurrency_mode(concurrency)
            .create(&canonical)
            .map_err(|e| database_error(path, e))?;
        init_schema(&db, path, mode).map_err(|e| naming_the_file(path, e))?;
        Db::Write(db)
    };
    let closed = Arc::new(Closed::default());
    let shared = Arc::new(Shared {
        db: Some(db),
        path: canonical.clone(),
        unflushed: AtomicBool::new(false),
        flush_asked: AtomicU64::new(0),
        flush_numbers: AtomicU64::new(0),
        flush_made: AtomicU64::new(0),
        flush_pending: AtomicU64::new(0),
        #[cfg(test)]
        stood_in: AtomicU64::new(0),
        #[cfg(test)]
        check_panics: AtomicBool::new(false),
        #[cfg(test)]
        commit_fails: AtomicBool::new(false),
        #[cfg(test)]
        flush_fails: AtomicBool::new(false),
        flushing: Mutex::new(()),
        live_readers: live_readers && mode != Mode::ReadOnly,
        closed: Arc::clone(&closed),
        handles: AtomicUsize::new(0),
        write_failed: AtomicBool::new(false),
        first_failure: OnceLock::new(),
    });
    // Which of two files redb opened, when another one took the path meanwhile, cannot be
    // told, nor could a later open of either find this one under the slot it sits in: refused.
    if identity()? != identity_now {
        return Err(open_error(
            path,
            OpenFailure::Other,
            "the file at this path was replaced while it was being opened; open it again",
            None,
        ));
    }
    *entry_of_file = Some(Entry {
        shared: Arc::downgrade(&shared),
        closed,
        identity: identity_now,
    });
    Ok(Handle::new(&shared))
}

/// Counts one [`crate::RedbStore`] on a file while it lives: a closing handle that finds none
/// left waits for the file to close ([`release`]). The writer is not what counts: the drain of
/// a dropped handle keeps it until its last commit is done. Made only by [`open_shared`],
/// with the file's slot locked.
pub(crate) struct Handle(Arc<Shared>);

impl Handle {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.handles.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(shared))
    }

    /// The file this handle holds.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.0
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.handles.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Lets go of `shared`, the last thing a closing handle holds of its file. When no handle is
/// left on the file, waits until the database is closed: an operation still running on it
/// (a read whose caller gave up) holds it until it ends, and the file stays locked meanwhile.
/// Stops waiting should another handle open the file in the meantime: it is then theirs.
/// Blocking.
pub(crate) fn release(shared: Arc<Shared>) {
    let closed = Arc::clone(&shared.closed);
    let weak = Arc::downgrade(&shared);
    drop(shared);
    loop {
        let in_use = weak
            .upgrade()
            .is_some_and(|s| s.handles.load(Ordering::Acquire) > 0);
        if in_use || closed.wait_for(Duration::from_millis(5)) {
            return;
        }
    }
}

/// The background thread of the bounded-loss mode: every interval, one durable commit if any
/// non-durable commit happened since the last one. Stopped (after a last flush) on drop.
pub(crate) struct Flusher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    /// The file, for the warning should the thread panic.
    path: PathBuf,
}

impl Flusher {
    pub(crate) fn start(shared: &Arc<Shared>, interval: Duration) -> Result<Self, StoreError> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let weak = Arc::downgrade(shared);
        let signal = Arc::clone(&stop);
        #[cfg(test)]
        let path = shared.path.clone();
        let thread = std::thread::Builder::new()
            .name("store-redb-flush".into())
            .spawn(move || {
                // Each interval is timed from when the last flush began (asked for its
                // stand-in), not from when it returned: it may wait for the write lock long
                // after a commit stood in for it.
                let mut wait = interval;
                let mut said_unwritable = false;
                let mut said_panicked = false;
                loop {
                    #[cfg(test)]
                    tests::flusher_waits(&path, wait);
                    let g = lock(&signal.0);
                    let (g, _) = signal
                        .1
                        .wait_timeout_while(g, wait, |stopping| !*stopping)
                        .unwrap_or_else(PoisonError::into_inner);
                    let stopping = *g;
                    drop(g);
                    let began = std::time::Instant::now();
                    let Some(shared) = weak.upgrade() else { return };
                    // A panic inside redb must not end the thread: the writers go on committing
                    // without durability, and nothing would flush them until the file closes.
                    let flushed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        if stopping {
                            shared.flush_last()
                        } else {
                            shared.flush()
                        }
                    }))
                    .unwrap_or_else(|_| {
                        if !said_panicked {
                            said_panicked = true;
                            error!(path = ?shared.path, "a flush of non-durable commits panicked; the flush thread goes on, trying again at each interval (logged once; the panic hook may print each one)");
                        }
                        // Logged here; the flush marked its commits unflushed as it unwound.
                        Ok(())
                    });
                    match flushed {
                        Ok(()) => {}
                        // Nothing can be made durable until the file is reopened: said once,
                        // not at every interval.
                        Err(_) if shared.needs_reopen() && said_unwritable => {}
                        Err(e) if shared.needs_reopen() => {
                            said_unwritable = true;
                            error!(path = ?shared.path, error = %awareness_core::error::ErrorChain(&e), "a write failed on this file (an I/O error, or a commit that panicked): the non-durable commits since the last flush cannot be made durable, and are lost when the process stops; close every handle on it and open it again");
                        }
                        Err(e) if stopping => {
                            warn!(path = ?shared.path, error = %awareness_core::error::ErrorChain(&e), "last flush of a closing handle's non-durable commits failed; they become durable with the next durable commit or when the file closes");
                        }
                        Err(e) => {
                            warn!(path = ?shared.path, error = %awareness_core::error::ErrorChain(&e), "periodic flush of non-durable commits failed; retrying at the next interval");
                        }
                    }
                    drop(shared);
                    if stopping {
                        return;
                    }
                    wait = interval.saturating_sub(began.elapsed());
                }
            })
            .map_err(|e| StoreError::backend("start the flush thread", e))?;
        Ok(Self {
            stop,
            thread: Some(thread),
            path: shared.path.clone(),
        })
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        *lock(&self.stop.0) = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            warn!(path = ?self.path, "the store-redb flush thread panicked");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::{Mode, OpenFailure, from_redb, latched, lock, open_shared};

    /// redb's own corruption errors (a damaged page, a table of another type under one of our
    /// names) are [`awareness_core::StoreError::Corrupt`], which says retrying does not help,
    /// naming what failed; its other errors are backend failures. Every other corruption test
    /// damages the store's own row encoding, which the codec reports, so dropping this mapping
    /// failed nothing (review, stop 55).
    #[test]
    fn redbs_corruption_errors_are_corrupt() {
        use awareness_core::StoreError;
        let corrupt = [
            redb::Error::Corrupted("a page checksum failed".into()),
            redb::Error::TableDoesNotExist("cursors".into()),
        ];
        for e in corrupt {
            let shown = e.to_string();
            match from_redb("read a cursor", e) {
                StoreError::Corrupt { context, source } => {
                    assert_eq!(context, format!("read a cursor: {shown}"));
                    assert!(source.is_some(), "redb's error is kept as the source");
                }
                other => panic!("{shown}: {other:?}"),
            }
        }
        let other = from_redb("read a cursor", redb::Error::DatabaseAlreadyOpen);
        assert!(matches!(other, StoreError::Backend { .. }), "{other:?}");
    }

    /// A table of ours whose stored type definition differs from this build's (its width or
    /// alignment changed: a hand edit, or another application's table under our name) is
    /// [`awareness_core::StoreError::Corrupt`], which says retrying does not help, as redb's
    /// other table mismatches are. (What the mutation did: a backend error, as if a retry
    /// could succeed; review of stop 71, RG18.)
    #[test]
    fn a_changed_type_definition_is_corrupt() {
        let e = redb::Error::TypeDefinitionChanged {
            name: redb::TypeName::new("store_redb::cursor_row"),
            alignment: 1,
            width: Some(8),
        };
        let got = from_redb("open the cursors", e);
        assert!(
            matches!(got, awareness_core::StoreError::Corrupt { .. }),
            "{got:?}"
        );
    }

    /// A write refused because redb discarded its allocator state (after a commit panicked)
    /// latches the handle as an I/O failure does: until the database is reopened, writes say
    /// to reopen it, and a new open in this process does not share it. It was taken for
    /// corruption, every later write failed as such, and reopening shared the broken database.
    #[test]
    fn a_discarded_allocator_state_latches_like_an_io_failure() {
        use redb::{StorageError, TransactionError};
        let discarded = StorageError::Corrupted(
            "Allocator state was discarded by a failed integrity check or commit; reopen the \
             database to repair it"
                .to_owned(),
        );
        assert!(latched(&TransactionError::Storage(discarded)));
        assert!(latched(&TransactionError::Storage(
            StorageError::PreviousIo
        )));
    }

    /// What runs inside the next open of a file, with the file's slot locked.
    type Hook = (PathBuf, Box<dyn FnOnce() + Send>);
    static WHILE_OPENING: Mutex<Option<Hook>> = Mutex::new(None);

    /// Called by `open_shared` with the file's slot locked: runs the hook set for this file.
    pub(super) fn while_opening(canonical: &Path) {
        let hook = {
            let mut hook = lock(&WHILE_OPENING);
            if hook.as_ref().is_some_and(|(p, _)| p == canonical) {
                hook.take()
            } else {
                None
            }
        };
        if let Some((_, run)) = hook {
            run();
        }
    }

    /// A shorter [`super::CLOSE_WAIT`] for one file.
    static CLOSE_WAIT_OF: Mutex<Option<(PathBuf, Duration)>> = Mutex::new(None);

    pub(super) fn close_wait(canonical: &Path) -> Option<Duration> {
        lock(&CLOSE_WAIT_OF)
            .as_ref()
            .and_then(|(path, bound)| (path == canonical).then_some(*bound))
    }

    /// Told when an open of its file starts waiting for the file to close.
    static WAITING_FOR_CLOSE: Mutex<Option<(PathBuf, std::sync::mpsc::Sender<Opening>)>> =
        Mutex::new(None);

    /// Called by `open_shared` before it waits for the file's database to close.
    pub(super) fn waiting_for_close(canonical: &Path) {
        let waiting = lock(&WAITING_FOR_CLOSE);
        if let Some((path, tell)) = waiting.as_ref()
            && path == canonical
        {
            tell.send(Opening::Waiting).ok();
        }
    }

    /// Told when the last flush of a handle of this file begins (it holds the flush lock and
    /// is about to take redb's write lock).
    pub(crate) static LAST_FLUSH_BEGINS: Mutex<Option<(PathBuf, std::sync::mpsc::Sender<()>)>> =
        Mutex::new(None);

    pub(super) fn last_flush_begins(path: &Path) {
        let waiting = lock(&LAST_FLUSH_BEGINS);
        if let Some((p, tell)) = waiting.as_ref()
            && p == path
        {
            tell.send(()).ok();
        }
    }

    /// Told when the last flush of a handle on a file has made a durable commit.
    pub(crate) static LAST_FLUSH_COMMITTED: Mutex<Option<(PathBuf, std::sync::mpsc::Sender<()>)>> =
        Mutex::new(None);

    pub(super) fn last_flush_committed(path: &Path) {
        let waiting = lock(&LAST_FLUSH_COMMITTED);
        if let Some((p, tell)) = waiting.as_ref()
            && p == path
        {
            tell.send(()).ok();
        }
    }

    /// Told how long the flush thread of a handle of this file waits before its next flush.
    static FLUSHER_WAITS: Mutex<Option<(PathBuf, std::sync::mpsc::Sender<Duration>)>> =
        Mutex::new(None);

    pub(super) fn flusher_waits(path: &Path, wait: Duration) {
        let waiting = lock(&FLUSHER_WAITS);
        if let Some((p, tell)) = waiting.as_ref()
            && p == path
        {
            tell.send(wait).ok();
        }
    }

    /// The file whose next flush panics once it has claimed the pending commits and asked for
    /// a stand-in (as a panic inside redb's commit would).
    static PANIC_IN_THE_NEXT_FLUSH: Mutex<Option<PathBuf>> = Mutex::new(None);

    pub(super) fn panic_if_asked(path: &Path) {
        let asked = {
            let mut asked = lock(&PANIC_IN_THE_NEXT_FLUSH);
            if asked.as_deref() == Some(path) {
                asked.take()
            } else {
                None
            }
        };
        assert!(asked.is_none(), "the test asked this flush to panic");
    }

    /// Told when a flush finds another one in progress and waits for it.
    static FLUSH_WAITS: Mutex<Option<std::sync::mpsc::Sender<Flushing>>> = Mutex::new(None);

    /// Called by `flush` when another flush holds the flush lock.
    pub(super) fn flush_waits() {
        if let Some(tell) = lock(&FLUSH_WAITS).as_ref() {
            tell.send(Flushing::Waits).ok();
        }
    }

    /// What the second flush of [`a_flush_returns_only_after_the_flush_in_progress_has_committed`]
    /// did first.
    #[derive(Debug, PartialEq, Eq)]
    enum Flushing {
        Waits,
        Returned,
    }

    /// What an open in [`a_read_write_open_waits_for_an_abandoned_read_instead_of_refusing`]
    /// did, in order.
    #[derive(Debug)]
    enum Opening {
        Waiting,
        /// Its result: whether the database it got is writable.
        Done(Result<bool, String>),
    }

    /// An error of an open found once redb opened the file names the file and keeps its
    /// meaning; one that names it already is left as it is.
    #[test]
    fn an_open_error_after_redb_opened_the_file_names_it() {
        use awareness_core::StoreError;
        let path = Path::new("/somewhere/state.redb");
        let named = |e| super::naming_the_file(path, e);
        match named(StoreError::corrupt("migrate: open heads: a bad type")) {
            StoreError::Corrupt { context, .. } => assert_eq!(
                context,
                "open /somewhere/state.redb: migrate: open heads: a bad type"
            ),
            other => panic!("{other:?}"),
        }
        let busy = named(StoreError::Busy {
            context: "open: begin a write".into(),
            source: "locked".into(),
        });
        assert!(busy.is_retryable());
        assert!(busy.to_string().contains("/somewhere/state.redb"), "{busy}");
        match named(StoreError::backend(
            "open: create the tables",
            std::io::Error::other("disk full"),
        )) {
            StoreError::Open {
                path: p,
                kind,
                reason,
                source,
            } => {
                assert_eq!(p, path);
                assert_eq!(kind, OpenFailure::Other);
                assert_eq!(reason, "create the tables: disk full");
                assert_eq!(source.map(|s| s.to_string()).as_deref(), Some("disk full"));
            }
            other => panic!("{other:?}"),
        }
        let open = super::open_error(
            path,
            OpenFailure::InUse,
            "already open in another process",
            None,
        );
        let text = open.to_string();
        assert_eq!(named(open).to_string(), text, "named once");
    }

    /// A store file in `dir` whose last handle, read-only, is gone while a read its caller gave
    /// up still runs on it: the database, which such a read holds (not a handle).
    fn abandoned_read(dir: &tempfile::TempDir) -> (PathBuf, Arc<super::Shared>) {
        let path = dir.path().join("state.redb");
        drop(open_shared(&path, Mode::Create, 1 << 20, false).expect("create"));
        let read_only = open_shared(&path, Mode::ReadOnly, 1 << 20, false).expect("read-only");
        let abandoned_read = Arc::clone(read_only.shared());
        drop(read_only);
        (path, abandoned_read)
    }

    /// The length read from a redb file's header is the file's length, for a new file and for
    /// one grown by many commits, and what redb's layout gives for headers of several regions;
    /// a file that is not redb's, one not closed cleanly and counts that overflow have none.
    #[test]
    fn the_layout_length_of_a_redb_file_is_its_length() {
        use super::{Database, layout_len};
        const T: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("t");
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.redb");
        let header_and_len = |path: &Path| {
            let bytes = std::fs::read(path).expect("read");
            (layout_len(&bytes[..32]), bytes.len() as u64)
        };
        let db = Database::create(&path).expect("create");
        drop(db);
        let (layout, len) = header_and_len(&path);
        assert_eq!(layout, Some(len), "a new file");
        let db = Database::create(&path).expect("open");
        let row = vec![7u8; 4_000];
        for round in 0..20u64 {
            let txn = db.begin_write().expect("write");
            {
                let mut t = txn.open_table(T).expect("table");
                for i in 0..200 {
                    t.insert(round * 200 + i, row.as_slice()).expect("insert");
                }
            }
            txn.commit().expect("commit");
        }
        drop(db);
        let (layout, len) = header_and_len(&path);
        assert!(len > 8 << 20, "the file grew: {len} bytes");
        assert_eq!(layout, Some(len), "a grown file");
        assert_eq!(layout_len(b"SQLite format 3\0 and more bytes"), None);
        // Files of several regions (4 GiB each by default) are built by hand: the header page,
        // then each region's header and data pages.
        let header = |god: u8, counts: [u32; 5]| {
            let mut h = [0u8; 32];
            h[..9].copy_from_slice(&[b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A]);
            h[9] = god;
            for (i, c) in counts.iter().enumerate() {
                h[12 + 4 * i..16 + 4 * i].copy_from_slice(&c.to_le_bytes());
            }
            h
        };
        // Page 4096, 2 header pages and 100 data pages a region, 3 full regions, a trailing
        // region of 7 data pages: 1 + 3 * 102 + (2 + 7) = 316 pages.
        assert_eq!(
            layout_len(&header(0, [4096, 2, 100, 3, 7])),
            Some(316 * 4096)
        );
        // Without a trailing region: 1 + 3 * 102 pages.
        assert_eq!(
            layout_len(&header(1, [4096, 2, 100, 3, 0])),
            Some(307 * 4096)
        );
        // Counts of a file not closed cleanly are not trusted, nor counts that overflow.
        assert_eq!(layout_len(&header(2, [4096, 2, 100, 3, 7])), None);
        assert_eq!(layout_len(&header(0, [u32::MAX; 5])), None);
    }

    /// Once the last read-only handle on a file is dropped, a read-write open must not be
    /// refused because a read its caller gave up still runs on the read-only database: it
    /// waits for that read to end, then opens the file read-write.
    #[test]
    fn a_read_write_open_waits_for_an_abandoned_read_instead_of_refusing() {
        let dir = tempfile::tempdir().expect("dir");
        let (path, abandoned_read) = abandoned_read(&dir);
        let (tell, told) = std::sync::mpsc::channel();
        let canonical = std::fs::canonicalize(&path).expect("canonical");
        *lock(&WAITING_FOR_CLOSE) = Some((canonical, tell.clone()));
        let opener = std::thread::spawn(move || {
            let opened = open_shared(&path, Mode::Existing, 1 << 20, false)
                .map(|handle| handle.shared().writable().is_some())
                .map_err(|e| e.to_string());
            tell.send(Opening::Done(opened)).ok();
        });
        // The timeouts only keep the test from hanging.
        let first = told.recv_timeout(Duration::from_mins(1));
        assert!(
            matches!(first, Ok(Opening::Waiting)),
            "the read-write open did not wait for the abandoned read: {first:?}"
        );
        drop(abandoned_read);
        let then = told.recv_timeout(Duration::from_mins(1));
        *lock(&WAITING_FOR_CLOSE) = None;
        opener.join().expect("the opener's thread");
        assert!(
            matches!(then, Ok(Opening::Done(Ok(true)))),
            "the read-write open did not open the file read-write once the read ended: {then:?}"
        );
    }

    /// An abandoned read that does not end (stuck) must not hang a read-write open of its file:
    /// the open is refused after its bound, naming the file, and opens once the read has ended.
    #[test]
    fn a_read_write_open_behind_a_stuck_abandoned_read_is_refused_not_hung() {
        let dir = tempfile::tempdir().expect("dir");
        let (path, abandoned_read) = abandoned_read(&dir);
        let canonical = std::fs::canonicalize(&path).expect("canonical");
        *lock(&CLOSE_WAIT_OF) = Some((canonical, Duration::from_millis(50)));
        let (tell, told) = std::sync::mpsc::channel();
        let opening = path.clone();
        let opener = std::thread::spawn(move || {
            tell.send(open_shared(&opening, Mode::Existing, 1 << 20, false).map(drop))
                .ok();
        });
        // A bound, so that an open that waits forever fails the test instead of hanging it.
        let refused = told.recv_timeout(Duration::from_secs(30));
        *lock(&CLOSE_WAIT_OF) = None;
        drop(abandoned_read);
        opener.join().expect("the opener's thread");
        let message = match refused.expect("the open hung behind the abandoned read") {
            Err(awareness_core::StoreError::Open {
                path: named,
                reason,
                ..
            }) => {
                assert_eq!(named, path, "the error names another path");
                reason
            }
            Err(other) => panic!("refused with the wrong error: {other}"),
            Ok(()) => panic!("opened read-write while a read still held the file read-only"),
        };
        assert!(
            message.contains("caller gave up"),
            "the reason does not say what holds the file: {message}"
        );
        let handle =
            open_shared(&path, Mode::Existing, 1 << 20, false).expect("open once it ended");
        assert!(
            handle.shared().writable().is_some(),
            "not opened read-write"
        );
    }

    /// An open that takes long (a repair, or the wait for a closing handle) holds up other
    /// opens of its file only: another file opens meanwhile.
    #[test]
    fn opening_one_file_does_not_hold_up_opening_another() {
        let dir = tempfile::tempdir().expect("dir");
        let (a, b) = (dir.path().join("a.redb"), dir.path().join("b.redb"));
        drop(open_shared(&a, Mode::Create, 1 << 20, false).expect("create a"));
        let canonical = std::fs::canonicalize(&a).expect("canonical a");
        let (opened, answer) = std::sync::mpsc::channel();
        // While `a`'s open is held up in its hook, `b` opens on a thread of its own; the
        // timeout only keeps the test from hanging when `b` waits for `a`.
        *lock(&WHILE_OPENING) = Some((
            canonical,
            Box::new(move || {
                let (b_done, b_result) = std::sync::mpsc::channel();
                let b_open = std::thread::spawn(move || {
                    b_done
                        .send(open_shared(&b, Mode::Create, 1 << 20, false).map(drop))
                        .ok();
                });
                let during = b_result.recv_timeout(Duration::from_mins(1));
                opened.send((during, b_open)).ok();
            }),
        ));
        let reopened = open_shared(&a, Mode::Create, 1 << 20, false).expect("reopen a");
        let (during, b_open) = answer.recv().expect("the hook ran");
        b_open.join().expect("b's thread");
        assert!(
            matches!(during, Ok(Ok(()))),
            "b did not open while a's open was under way: {during:?}"
        );
        drop(reopened);
    }

    /// An open that found its file's slot and then waited for its lock while the file at the
    /// path was replaced looks the path up again and opens the file now there: it is not
    /// refused. (What the mutation did: kept the slot of the file it found first, and the open
    /// was refused, "the file at this path was replaced while it was being opened"; review of
    /// stop 71, RG03.)
    #[test]
    fn an_open_that_waited_while_its_file_was_replaced_opens_the_new_file() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("state.redb");
        let other = dir.path().join("other.redb");
        drop(open_shared(&path, Mode::Create, 1 << 20, false).expect("create"));
        drop(open_shared(&other, Mode::Create, 1 << 20, false).expect("create the other"));
        let canonical = std::fs::canonicalize(&path).expect("canonical");
        let key = super::file_identity(&canonical).expect("identity");
        let (started, second) = std::sync::mpsc::channel();
        let path_b = path.clone();
        *lock(&WHILE_OPENING) = Some((
            canonical,
            Box::new(move || {
                // A second open of the path, on a thread of its own, finds this file's slot
                // (held by this open, the registry and here: a fourth holder is the second
                // open) and waits for its lock.
                let moved_to = path_b.clone();
                let b_open = std::thread::spawn(move || {
                    open_shared(&path_b, Mode::Create, 1 << 20, false).map(drop)
                });
                let slot = Arc::clone(lock(super::registry()).get(&key).expect("the slot"));
                let deadline = std::time::Instant::now() + Duration::from_mins(1);
                while Arc::strong_count(&slot) < 4 && std::time::Instant::now() < deadline {
                    std::thread::yield_now();
                }
                drop(slot);
                // The file at the path is replaced before either open has it.
                std::fs::rename(&other, &moved_to).expect("replace the file");
                started.send(b_open).ok();
            }),
        ));
        let first = open_shared(&path, Mode::Create, 1 << 20, false).map(drop);
        let b_open = second.recv().expect("the hook ran");
        let got = b_open.join().expect("the second open's thread");
        assert!(
            first.is_err(),
            "the open that held the slot saw its file replaced under it: {first:?}"
        );
        assert!(
            got.is_ok(),
            "an open that waited while the file was replaced opens the new one: {got:?}"
        );
    }

    /// A new store file in `dir`, opened: the handle (the database stays open while it lives)
    /// and its shared state.
    fn new_shared(dir: &tempfile::TempDir) -> (super::Handle, Arc<super::Shared>) {
        let handle = open_shared(
            &dir.path().join("state.redb"),
            super::Mode::Create,
            1 << 20,
            false,
        )
        .expect("open");
        let shared = Arc::clone(handle.shared());
        (handle, shared)
    }

    /// The flush thread of the bounded mode waits one interval before its first flush and,
    /// after each, what is left of the next interval (timed from when that flush began), never
    /// longer. (A mutation review made it wait three and eight intervals, and every test
    /// passed: the crash test's margin for a busy disk, 300 ms, outlasts eight of its 25 ms
    /// intervals, and no test may time the thread.)
    #[test]
    fn the_flush_thread_waits_one_interval_at_most() {
        let dir = tempfile::tempdir().expect("dir");
        let (_handle, shared) = new_shared(&dir);
        let (tell, told) = std::sync::mpsc::channel();
        *lock(&FLUSHER_WAITS) = Some((shared.path.clone(), tell));
        let interval = Duration::from_millis(30);
        let flusher = super::Flusher::start(&shared, interval).expect("start");
        let mut waits = Vec::new();
        for _ in 0..4 {
            // Something to make durable, so that each flush commits.
            shared.mark_unflushed();
            // The timeout only keeps the test from hanging.
            waits.push(told.recv_timeout(Duration::from_mins(1)).expect("a wait"));
        }
        drop(flusher);
        *lock(&FLUSHER_WAITS) = None;
        assert_eq!(waits[0], interval, "one interval before the first flush");
        assert!(
            waits[1..].iter().all(|wait| *wait <= interval),
            "at most one interval after each flush: {waits:?}"
        );
    }

    /// The wait after a flush that committed is the interval less the time that flush took
    /// (a durable commit takes some): the flushes begin one interval apart, not one interval
    /// plus a flush. (What the mutation did: waited a whole interval after each flush, so the
    /// commits at risk in a crash reached back further than the promised interval; review of
    /// stop 71, RG07.)
    #[test]
    fn the_time_a_flush_took_comes_off_the_next_wait() {
        let dir = tempfile::tempdir().expect("dir");
        let (_handle, shared) = new_shared(&dir);
        let (tell, told) = std::sync::mpsc::channel();
        *lock(&FLUSHER_WAITS) = Some((shared.path.clone(), tell));
        let interval = Duration::from_millis(30);
        shared.mark_unflushed();
        let flusher = super::Flusher::start(&shared, interval).expect("start");
        // The timeout only keeps the test from hanging.
        let first = told
            .recv_timeout(Duration::from_mins(1))
            .expect("the first wait");
        let second = told
            .recv_timeout(Duration::from_mins(1))
            .expect("the wait after a flush");
        drop(flusher);
        *lock(&FLUSHER_WAITS) = None;
        assert_eq!(first, interval, "one interval before the first flush");
        assert!(
            second < interval,
            "the flush's own time comes off the wait after it: {second:?}"
        );
    }

    /// A flush whose durable commit fails (a full disk) latches the handle with that failure as
    /// its cause: the commits it was making durable stay pending, and every later write is
    /// refused saying so and to reopen, not with redb's bare "Previous I/O error occurred".
    /// (What the mutation did: the flush's failure was not noted, and the handle went on taking
    /// writes; review of stop 71, RG10.)
    #[test]
    fn a_flush_whose_commit_fails_latches_the_handle_with_its_cause() {
        let dir = tempfile::tempdir().expect("dir");
        let (_handle, shared) = new_shared(&dir);
        shared.mark_unflushed();
        shared.flush_fails.store(true, Ordering::Release);
        let failed = shared.flush().expect_err("the flush's commit fails");
        assert!(shared.is_unflushed(), "its commits stay pending: {failed}");
        assert!(shared.needs_reopen(), "the handle is latched: {failed}");
        let refused = shared
            .begin_write("test")
            .map(drop)
            .expect_err("a write after the failed flush is refused");
        let refused = awareness_core::error::ErrorChain(&refused).to_string();
        assert!(
            refused.contains("the flush's own failure") && refused.contains("reopened"),
            "{refused}"
        );
    }

    /// A flush that panics (inside redb, which the flush thread survives) leaves the commits
    /// it had claimed pending and withdraws its call for a stand-in, so the next interval
    /// flushes them. (What the mutation did: the commits stayed marked flushed, and the
    /// intervals after skipped them until a later commit, so a crash could lose commits older
    /// than the promised interval; review of stop 69, RE28.)
    #[test]
    fn a_flush_that_panics_leaves_its_commits_pending() {
        let dir = tempfile::tempdir().expect("dir");
        let (_handle, shared) = new_shared(&dir);
        shared.mark_unflushed();
        *lock(&PANIC_IN_THE_NEXT_FLUSH) = Some(shared.path.clone());
        let flushed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| shared.flush()));
        assert!(
            flushed.is_err(),
            "the flush was asked to panic: {flushed:?}"
        );
        assert!(
            shared.is_unflushed(),
            "the claimed commits are pending again"
        );
        assert!(
            !shared.is_flush_due(),
            "no writer is asked to stand in for it"
        );
        shared.flush().expect("the next flush");
        assert!(!shared.is_unflushed(), "the next flush made them durable");
    }

    /// A flush called while an earlier one waits for the write lock (behind a long write) must
    /// not return until that one has committed: returning at once, because the earlier flush
    /// had already claimed the pending commits, would report them durable before they are.
    #[test]
    fn a_flush_returns_only_after_the_flush_in_progress_has_committed() {
        let dir = tempfile::tempdir().expect("dir");
        let (_handle, shared) = new_shared(&dir);
        shared.mark_unflushed();
        // A long write in progress: it holds redb's write lock.
        let long_write = shared
            .for_write("test")
            .expect("writable")
            .begin_write()
            .expect("begin");
        let first = {
            let s = Arc::clone(&shared);
            std::thread::spawn(move || s.flush())
        };
        while shared.unflushed.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        // The first flush has claimed the pending commit and waits for the write lock. The
        // second must wait for it rather than return.
        let (tell, told) = std::sync::mpsc::channel();
        *lock(&FLUSH_WAITS) = Some(tell.clone());
        let second = {
            let s = Arc::clone(&shared);
            std::thread::spawn(move || {
                let r = s.flush();
                tell.send(Flushing::Returned).ok();
                r
            })
        };
        // The timeout only keeps the test from hanging.
        let first_news = told.recv_timeout(Duration::from_mins(1));
        *lock(&FLUSH_WAITS) = None;
        drop(long_write);
        first.join().expect("first flush").expect("first flush");
        second.join().expect("second flush").expect("second flush");
        assert_eq!(
            first_news,
            Ok(Flushing::Waits),
            "a flush returned while the flush holding the pending commits had not committed"
        );
    }
}
