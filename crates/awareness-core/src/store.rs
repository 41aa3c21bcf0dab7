//! The storage traits every backend implements, and the conveniences built on them.

use std::sync::Arc;

use async_trait::async_trait;

use crate::error::StoreError;
use crate::model::{
    AgentId, Cursor, CursorFilter, CursorKey, Event, Head, LogStats, NewEvent, Sequence,
    SessionKey, SessionRef, Timestamp, WatcherKey,
};
use crate::protocol::{AckTarget, Notice};
use crate::reconcile::{self, ChangesPage, SessionStatus};
use crate::retention::{PruneFailed, PruneReport, PruneStep, RetentionPolicy};

/// The result of recording an event.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// The stored event (for a dedupe hit, the event stored first, unchanged).
    pub event: Arc<Event>,
    /// `true` when the dedupe key already existed: nothing moved.
    pub deduplicated: bool,
    /// The watchers that became or stay pending because of this event, as data for delivery.
    pub notices: Vec<Notice>,
}

/// A stream of hints that another writer committed to a store
/// ([`EventStore::commit_hints`]).
#[async_trait]
pub trait CommitHints: Send {
    /// Waits for the next hint: `true` once another writer may have committed since the last
    /// hint this stream gave (or since it was made), which includes the store having lost,
    /// for a while, its means of being told (a hint may have been missed then); `false` once
    /// the store is gone, after which no hint comes.
    async fn next(&mut self) -> bool;
}

/// The durable signal log: events and heads.
///
/// Every method is atomic: it commits completely or not at all. The exception is
/// [`EventStore::prune_chunk`], which a backend may commit in several transactions.
///
/// # Errors common to every method
///
/// What any method of this trait, of [`CursorStore`], of [`AwarenessStoreExt`] and of
/// [`UpstreamStore`](crate::UpstreamStore) may return besides what its own `# Errors` says.
/// store-memory returns none of them: its only errors are the ones a method names as its own
/// ([`StoreError::InvalidInput`], and the counter at its end of [`EventStore::record`]).
///
/// - [`StoreError::ReadOnly`]: every write through a handle opened read-only (the `read_only`
///   option of store-sqlite and store-redb), also one that would change nothing (an empty list
///   to acknowledge, a pruning chunk with nothing due, a dedupe hit). Nothing is written. A
///   write checks its input first, so an input it refuses is [`StoreError::InvalidInput`] on
///   any handle. Reads never return it.
/// - [`StoreError::Busy`] (store-sqlite and store-postgres;
///   [`is_retryable`](StoreError::is_retryable)): store-sqlite: a statement waited longer than
///   the busy timeout for a lock another connection held, usually another process's write, or
///   lost a race for the write-ahead log's locks (`PROTOCOL`); store-postgres: the store's
///   lock held past the role's `lock_timeout`, a lost connection, a lost race, a server
///   restarting (its crate docs list them). The write transaction is rolled back, so a write
///   that gets it has written nothing and the same call may be made again. (A store-postgres
///   write whose `COMMIT` lost its answer, when the server cannot say whether it committed,
///   gets [`StoreError::Backend`] saying the outcome is unknown: see
///   [`EventStore::record`].)
/// - [`StoreError::Corrupt`]: the file is damaged (SQLite's `CORRUPT` or `NOTADB`, redb's
///   corruption errors), or a row the method must read cannot be read. Each method says which
///   rows fail it; the others pass over them. Retrying does not help.
/// - [`StoreError::Backend`]: any other failure: I/O (a full disk), the driver, a blocking
///   task; also a call made outside a Tokio runtime (store-redb: any call that must hand work
///   to the blocking pool; store-sqlite: [`record`](EventStore::record) with group commit on),
///   refused before anything is queued. After a failed write, store-sqlite has rolled the
///   transaction back, a failed commit included (docs/decisions/0005): nothing of the call is
///   kept, unless the method says otherwise. store-redb has written nothing when the failure came before the
///   commit, but cannot tell whether a commit that failed reached the file, and the error
///   does not say which of the two it was: read back what the write was for. After a failed
///   commit, or an I/O failure inside a write, store-redb refuses every later write on that
///   file in the process with `Backend`, until every handle on it is closed and the file is
///   opened again.
/// - [`StoreError::Open`] and [`StoreError::NeedsRepair`] come from opening a store (the
///   backends' own `open` functions), never from these methods.
///
/// A store in a file names the file in every error ([`StoreError::in_store`]). Cancelling a
/// write (dropping its future) is not an error; whether the write committed is then unknown
/// (store-redb finishes it anyway, and so does a store-sqlite group commit that holds it).
#[async_trait]
pub trait EventStore: Send + Sync + std::fmt::Debug {
    /// Records an event: validates it (nothing is written on error), allocates the next
    /// store-wide sequence (a dedupe hit consumes one too), moves the head and applies
    /// [`crate::protocol::on_event`] to the cursors, all in one transaction.
    ///
    /// # Errors
    ///
    /// Besides those of every write (see the [trait](EventStore#errors-common-to-every-method)):
    ///
    /// - [`StoreError::InvalidInput`]: `event` breaks a rule of [`NewEvent::validate`] (an
    ///   unknown kind; a summary that is blank, longer than 200 characters or not one line; a
    ///   payload over 4 KiB or nested too deep; an empty, too long or line-breaking session id,
    ///   actor id, run id or dedupe key; more than
    ///   [`MAX_NAMED_WATCHERS`](crate::validate::MAX_NAMED_WATCHERS) named watchers). Checked
    ///   before anything else, on any handle: nothing is written and no sequence is spent.
    /// - [`StoreError::Corrupt`] for which [`StoreError::is_counter_at_end`] holds: the
    ///   sequence counter has handed out its last number (only a damaged or hand-edited store
    ///   gets there). Nothing is written, and every later recording, a dedupe hit included,
    ///   gets the same error (docs/decisions/0025).
    /// - [`StoreError::Corrupt`] for a dedupe hit whose stored event cannot be read: no event
    ///   is added and no head or cursor moves. store-sqlite has still spent (committed) a
    ///   sequence number for the call; store-redb has not.
    /// - When the group commit that holds the event fails as a whole (store-sqlite: on the
    ///   lock, [`StoreError::Busy`]; store-redb: beginning or committing its transaction),
    ///   every caller in it gets a copy of the same error
    ///   ([`StoreError::for_another_caller`]: same variant, so `is_retryable` answers alike).
    ///   Any other failure of one event reaches only its own caller.
    /// - store-sqlite: a [`StoreError::Backend`] saying that the group commit holding the event
    ///   stopped before answering leaves it unknown whether the event was committed: read it
    ///   back, or record it again under the same dedupe key. store-postgres: the same, saying
    ///   that the connection was lost during `COMMIT` and the server could not say whether it
    ///   committed. Not retryable: an event without a dedupe key, recorded again, may be
    ///   recorded twice.
    async fn record(&self, event: NewEvent, now: Timestamp) -> Result<Recorded, StoreError>;

    /// The reconcile page: events of exactly `session` after `after`, at most `limit`
    /// (callers clamp with [`reconcile::clamp_limit`]; stores clamp again). Moves no cursor.
    ///
    /// # Errors
    ///
    /// [`StoreError::Corrupt`] when the ref's head or an event of the page cannot be read (for
    /// an event, the error names its row); otherwise those of every read (see the
    /// [trait](EventStore#errors-common-to-every-method)). No `limit` is refused.
    async fn changes_since(
        &self,
        session: &SessionRef,
        after: Sequence,
        limit: usize,
    ) -> Result<ChangesPage, StoreError>;

    /// The heads of the given refs that exist, in any order (one batch); a ref listed more than
    /// once has one head.
    ///
    /// # Errors
    ///
    /// [`StoreError::Corrupt`] when the head row of a ref asked for cannot be read, so that no
    /// caller is told that such a session has no head (docs/decisions/0020); otherwise those of
    /// every read (see the [trait](EventStore#errors-common-to-every-method)).
    async fn heads(&self, sessions: &[SessionRef]) -> Result<Vec<Head>, StoreError>;

    /// Every head, optionally of one agent, ordered by key then agent.
    ///
    /// # Errors
    ///
    /// Only those of every read (see the [trait](EventStore#errors-common-to-every-method)): a
    /// head row that cannot be read is left out, with a warning naming it
    /// (docs/decisions/0020).
    async fn list_heads(&self, agent: Option<&AgentId>) -> Result<Vec<Head>, StoreError>;

    /// Retained events of every session with `sequence > after`, ascending, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Corrupt`] when an event it would return cannot be read (the error names
    /// the row; docs/decisions/0016); otherwise those of every read (see the
    /// [trait](EventStore#errors-common-to-every-method)).
    async fn events_after(
        &self,
        after: Sequence,
        limit: usize,
    ) -> Result<Vec<Arc<Event>>, StoreError>;

    /// Size and range of the retained log. It reads no event's fields.
    ///
    /// # Errors
    ///
    /// Only those of every read (see the [trait](EventStore#errors-common-to-every-method)):
    /// an event row that cannot be read does not fail it (docs/decisions/0016), so that
    /// `awareness tail` and `doctor` still answer over one.
    async fn log_stats(&self) -> Result<LogStats, StoreError>;

    /// Runs one bounded chunk of a pruning step, deleting at most `max_rows` rows; returns how
    /// many were deleted. A backend may split the chunk into smaller write transactions, each
    /// atomic (store-sqlite: at most 250 rows per transaction; store-redb: at most 2,000, the
    /// default chunk; store-memory: 256 rows deleted, or 1,024 looked at, per hold of its
    /// lock). It returns fewer than `max_rows` only when it found no more rows due (a cursor
    /// written meanwhile behind store-memory's scan waits for the next pass). Event
    /// steps stamp the pruned watermark of every affected head before deleting the
    /// rows it covers, in the same transaction, so a failure partway leaves every deleted row
    /// covered by its head's watermark. They never create, delete or lower a head; a head whose
    /// watermark they raise has its `updated_at` moved up to `now`, as OpenClaw's
    /// ([`crate::retention::stamp`]).
    ///
    /// # Errors
    ///
    /// Those of every write (see the [trait](EventStore#errors-common-to-every-method)),
    /// [`StoreError::ReadOnly`] even for a chunk with nothing to delete. It does not check
    /// `step` ([`AwarenessStoreExt::prune`] checks the policy). A row that cannot be read does
    /// not fail it: such a row is deleted in its turn (store-redb's age step keeps an event
    /// whose age it cannot read until the row cap reaches it), and a head that cannot be read
    /// gets no watermark (docs/decisions/0020). After a failure, the transactions of the chunk
    /// that committed before it stay committed, each whole, and the error does not say what
    /// they deleted.
    async fn prune_chunk(
        &self,
        step: &PruneStep,
        max_rows: usize,
        now: Timestamp,
    ) -> Result<u64, StoreError>;

    /// Deletes a session: its events, its head, and the cursors where it is the watcher or the
    /// target (of that agent). Another agent's same-named session is left alone.
    ///
    /// # Errors
    ///
    /// Only those of every write (see the [trait](EventStore#errors-common-to-every-method)):
    /// rows of the session that cannot be read do not stop it, they are deleted with the
    /// others.
    async fn delete_session(&self, session: &SessionRef) -> Result<(), StoreError>;

    /// Closes the store through a shared handle, without blocking the runtime: when `self` is
    /// the last handle, the backend's own close runs (SQLite checkpoints its write-ahead log into
    /// the file and closes its connections, and the log file is removed when the last
    /// connection of any process closes: while another process or handle has the file open,
    /// the log stays beside it; redb makes every commit durable and releases its lock on the
    /// blocking pool). Otherwise it only drops this
    /// handle, and the last one's drop closes the store. Failures are logged, as dropping
    /// would. The default drops the handle, which is all a store without a file needs.
    async fn close(self: Arc<Self>) {
        drop(self);
    }

    /// Whether another writer has committed to this store: an opaque number that stays the
    /// same while only this handle writes and changes once a commit by any other writer of the
    /// same file (another process, or another handle of this one) is visible to this handle.
    /// Compare two answers; the value means nothing else.
    ///
    /// It is the hint behind the push of DESIGN.md section 9.1: a gateway that shares its store
    /// with other processes polls it, and when it changes, reads the pending cursors of the
    /// watchers it owns, since another process may have handed out notices it never saw. A
    /// hint only: reading the cursors is what is exact.
    ///
    /// `None` from a store that does not tell: the default, for a store in memory, and
    /// store-redb, whose file one process at a time opens for writing and whose handles in one
    /// process share one database, so that a gateway (which writes) is its file's only writer.
    /// A read-only redb handle beside a writer in another process answers `None` too, though
    /// it sees that writer's commits.
    ///
    /// # Errors
    ///
    /// The default never fails. store-sqlite reads the number from the file and fails as any
    /// read does (see the [trait](EventStore#errors-common-to-every-method)).
    ///
    /// # Waiting
    ///
    /// store-sqlite (on its write connection) and store-postgres (in the handle's turn) answer
    /// after the handle's own write in progress, which may itself wait for another process's
    /// lock: up to SQLite's `busy_timeout`, or for as long as a PostgreSQL gateway stopped
    /// mid-write holds it. An asker that cannot wait so long bounds the question and takes no
    /// answer for a change, as gateway-adapter's pick-up does (`QUESTION_PATIENCE`).
    async fn foreign_commits(&self) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }

    /// Hints pushed as other writers commit, so that a gateway need not wait for its next
    /// question of [`EventStore::foreign_commits`] to learn of them (DESIGN.md section 9.1:
    /// "a store can offer a stream of hints"). A hint only: after one, ask
    /// [`EventStore::foreign_commits`] and read the cursors, as at any other question.
    ///
    /// `None` from a store that cannot push them: the default (store-memory, store-redb).
    /// store-postgres offers them through `LISTEN`/`NOTIFY`, store-sqlite by polling `PRAGMA
    /// data_version` on a connection of its own. Each call gives a stream of its own; a stream
    /// does not keep the store open. A store may start listening or polling in the background
    /// at the first call; it gives one hint once it has, covering the commits made before, to
    /// the streams made before (the durable suite's
    /// `a_store_that_pushes_hints_gives_one_as_it_begins`), else a commit made before it listens
    /// would wait for the caller's next question of [`EventStore::foreign_commits`].
    ///
    /// A store that pushes hints answers [`EventStore::foreign_commits`] with a number: the
    /// question a hint brings is what tells a commit, and an answer of `None`, which never
    /// changes, tells none (gateway-adapter's pick-up then waits for its recovery interval).
    fn commit_hints(&self) -> Option<Box<dyn CommitHints>> {
        None
    }
}

/// Watch cursors.
///
/// Every method is atomic.
///
/// A cursor row a durable store can no longer read (a torn write, a hand edit, a row another
/// writer of the file left) is left out, with a warning naming it, of every method that reads
/// many cursors ([`cursors`](Self::cursors), [`acknowledge`](Self::acknowledge),
/// [`refreeze`](Self::refreeze), and a recording's moves of the cursors on its target), so
/// that one damaged row stops none of them, and none of them rewrites it.
/// [`cursor`](Self::cursor) on its key fails with [`StoreError::Corrupt`];
/// [`unreadable_cursors`](Self::unreadable_cursors) lists it. A write that names that cursor
/// ([`watch`](Self::watch), a recording naming its watcher) treats the row as absent and
/// writes a new cursor over it; [`unwatch`](Self::unwatch),
/// [`reset_watcher`](Self::reset_watcher) and [`EventStore::delete_session`] of its target key
/// (whatever its agent) remove it (docs/decisions/0016).
///
/// # Errors
///
/// Every method may fail as any method of a store may (see
/// [`EventStore`](EventStore#errors-common-to-every-method)); on a read-only handle, each write
/// (never a read) fails with [`StoreError::ReadOnly`]. What each method adds is in its own
/// `# Errors`.
#[async_trait]
pub trait CursorStore: Send + Sync {
    /// Explicit watch (see [`crate::protocol::watch`]). With no cursor on the target key, a new
    /// cursor starts at the target's current head. An existing cursor on the same ref (same
    /// target agent) keeps its sequences, pending notice included; an ambient one is made
    /// explicit (docs/decisions/0015), and one idle for a day has its `updated_at` refreshed
    /// (docs/decisions/0018). An existing cursor on another
    /// agent's session of the same key is replaced by a new one at this ref's head, and its
    /// pending notice is dropped (docs/decisions/0008). Returns the cursor in effect.
    ///
    /// # Errors
    ///
    /// Besides those of every write (see the [trait](CursorStore#errors)):
    ///
    /// - [`StoreError::InvalidInput`]
    ///   ([`ValidationError::SelfWatch`](crate::ValidationError::SelfWatch)) when `watcher` is
    ///   the target's own key. Checked first, on any handle; nothing is written.
    /// - [`StoreError::Corrupt`] when the target's head row cannot be read (store-sqlite,
    ///   store-redb); nothing is written. A cursor row on the key that cannot be read does not
    ///   fail it: it is written over.
    async fn watch(
        &self,
        watcher: &WatcherKey,
        target: &SessionRef,
        now: Timestamp,
    ) -> Result<Cursor, StoreError>;

    /// Removes a cursor; `true` when one existed.
    ///
    /// # Errors
    ///
    /// Only those of every write (see the [trait](CursorStore#errors)); a row that cannot be
    /// read is removed as any other.
    async fn unwatch(&self, watcher: &WatcherKey, target: &SessionKey) -> Result<bool, StoreError>;

    /// Acknowledges the watcher's notices on `targets` (see [`crate::protocol::acknowledge`]),
    /// in one transaction; returns the follow-up notices. A target whose
    /// [`AckTarget::read`] names a notice other than the one its
    /// cursor shows is left as it is ([`AckTarget::apply`]). Unknown
    /// targets are ignored; a target listed more than once is acknowledged once, as its first
    /// entry says ([`AckTarget::each_once`]).
    ///
    /// # Errors
    ///
    /// Only those of every write (see the [trait](CursorStore#errors)),
    /// [`StoreError::ReadOnly`] even for an empty `targets`. A target left as it is (unknown,
    /// another notice, a cursor row that cannot be read) is no error.
    async fn acknowledge(
        &self,
        watcher: &WatcherKey,
        targets: &[AckTarget],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError>;

    /// One cursor.
    ///
    /// # Errors
    ///
    /// [`StoreError::Corrupt`] when its row cannot be read (the listings leave such a row out);
    /// otherwise those of every read (see the [trait](CursorStore#errors)).
    async fn cursor(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<Option<Cursor>, StoreError>;

    /// Cursors passing the filter, ordered by watcher then target.
    ///
    /// # Errors
    ///
    /// Only those of every read (see the [trait](CursorStore#errors)): a row that cannot be
    /// read is left out.
    async fn cursors(&self, filter: &CursorFilter) -> Result<Vec<Cursor>, StoreError>;

    /// Re-freezes the given cursors that are still pending (see
    /// [`crate::protocol::refreeze`]) and returns their notices, in one transaction. A key
    /// listed more than once counts once ([`crate::protocol::each_once`]).
    ///
    /// # Errors
    ///
    /// Only those of every write (see the [trait](CursorStore#errors)),
    /// [`StoreError::ReadOnly`] even for an empty `keys`. A key without a readable cursor is
    /// passed over.
    async fn refreeze(&self, keys: &[CursorKey], now: Timestamp)
    -> Result<Vec<Notice>, StoreError>;

    /// Session reset: deletes the cursors where `watcher` is the watcher; returns how many.
    ///
    /// # Errors
    ///
    /// Only those of every write (see the [trait](CursorStore#errors)).
    async fn reset_watcher(&self, watcher: &SessionKey) -> Result<u64, StoreError>;

    /// The cursor rows this store holds but cannot read, which every other read leaves out
    /// (see the trait's docs), for an operator's audit ([`crate::audit::audit_store`]). A
    /// store that keeps values rather than bytes has none: the provided method answers so.
    ///
    /// # Errors
    ///
    /// The provided method never fails; a durable store's fails as any read does (see the
    /// [trait](CursorStore#errors)). A row it lists is no error.
    async fn unreadable_cursors(&self) -> Result<Vec<UnreadableCursor>, StoreError> {
        Ok(Vec::new())
    }
}

/// A cursor row a store holds but cannot read ([`CursorStore::unreadable_cursors`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableCursor {
    /// The row's watcher key, as stored.
    pub watcher: String,
    /// The row's target key, as stored.
    pub target: String,
    /// Why it cannot be read.
    pub reason: String,
}

impl std::fmt::Display for UnreadableCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cursor {:?} -> {:?} cannot be read: {}",
            self.watcher, self.target, self.reason
        )
    }
}

/// A backend that holds both the log and the cursors (every store of this workspace).
pub trait AwarenessStore: EventStore + CursorStore {}

impl<T: EventStore + CursorStore + ?Sized> AwarenessStore for T {}

/// Conveniences written once on top of the traits.
///
/// # Errors
///
/// Each method returns the first error of the trait methods it calls, as they return it (see
/// [`EventStore`](EventStore#errors-common-to-every-method)), and adds none of its own but
/// the refusal of a retention policy by [`prune`](Self::prune).
#[async_trait]
pub trait AwarenessStoreExt: AwarenessStore {
    /// `stateVersion` of a ref (0 when nothing was recorded).
    ///
    /// # Errors
    ///
    /// Those of [`EventStore::heads`]: [`StoreError::Corrupt`] when the ref's head row cannot
    /// be read.
    async fn state_version(&self, session: &SessionRef) -> Result<Sequence, StoreError> {
        let heads = self.heads(std::slice::from_ref(session)).await?;
        Ok(heads
            .into_iter()
            .find(|h| &h.session == session)
            .map_or(Sequence::ZERO, |h| h.last_sequence))
    }

    /// `session_status`: the version, and the page when `changes_since` is given.
    ///
    /// The version and the page are two reads, and a recording may land between them. The
    /// version is read first and raised to the page's last event, so it never names an event
    /// recorded after the page was read: a caller that resumes from it may see an event again
    /// (a truncated page's version is at or above its last event, and the caller asks again), but
    /// never misses one. A page that found `N` within the head it read (not `versionAhead`)
    /// raises the version to `N` too, so that `versionAhead` is set exactly when `N` is above
    /// the version answered, also when `N` is an event recorded between the reads. A session
    /// deleted between the reads leaves a page that found no head beside a version read
    /// before: the answer is then version 0 ([`reconcile::status`]), and a page that found its
    /// head below `N` has the version read again, so that the answer describes the session
    /// after the delete.
    ///
    /// # Errors
    ///
    /// Those of [`EventStore::heads`] and [`EventStore::changes_since`]: the first read that
    /// fails fails the call, with no partial answer. It writes nothing.
    async fn session_status(
        &self,
        session: &SessionRef,
        changes_since: Option<Sequence>,
        limit: Option<usize>,
    ) -> Result<SessionStatus, StoreError> {
        let mut state_version = self.state_version(session).await?;
        let page = match changes_since {
            Some(after) => Some((
                after,
                self.changes_since(session, after, reconcile::clamp_limit(limit))
                    .await?,
            )),
            None => None,
        };
        if let Some((after, p)) = &page
            && p.version_ahead
            && *after <= state_version
        {
            // The head the page read is below the version read first: the session shrank
            // between the reads.
            state_version = self.state_version(session).await?;
        }
        Ok(reconcile::status(state_version, page))
    }

    /// One pruning pass: every step of `policy`, each in chunks of `policy.chunk_rows`, until a
    /// chunk comes up short. Under recordings faster than its chunks the row-cap step goes on
    /// as long as they do, holding the log at the cap, and the pass returns once they slow
    /// down. (Ending the step at what was beyond the cap when it began was tried in stop 58:
    /// the log then grew past the cap until the next pass, and the scale run's peak memory on
    /// store-memory rose from 98-107 MiB in five runs to 140-150 MiB in five of six.)
    ///
    /// # Errors
    ///
    /// - [`StoreError::InvalidInput`] for a policy that [`RetentionPolicy::validate`] refuses,
    ///   before anything is deleted, on any handle.
    /// - Otherwise the first error of [`EventStore::prune_chunk`] ([`StoreError::ReadOnly`] on
    ///   a read-only handle). The pass stops there; what the chunks before it deleted stays
    ///   deleted, and a pass run again goes on from there. [`prune_counted`](Self::prune_counted)
    ///   says how much that was.
    async fn prune(
        &self,
        policy: &RetentionPolicy,
        now: Timestamp,
    ) -> Result<PruneReport, StoreError> {
        self.prune_counted(policy, now).await.map_err(|f| f.error)
    }

    /// [`AwarenessStoreExt::prune`], saying on failure what the chunks that committed before it
    /// deleted.
    ///
    /// # Errors
    ///
    /// Those of [`prune`](Self::prune), as [`PruneFailed::error`], beside
    /// [`PruneFailed::done`]: what the chunks that ended before the failure deleted (nothing
    /// for a policy refused up front). The failed chunk is not counted, though part of it may
    /// have committed: `done` is a lower bound.
    async fn prune_counted(
        &self,
        policy: &RetentionPolicy,
        now: Timestamp,
    ) -> Result<PruneReport, PruneFailed> {
        let mut report = PruneReport::default();
        let failed = |done: PruneReport| move |error: StoreError| PruneFailed { done, error };
        policy
            .validate()
            .map_err(|e| failed(report)(StoreError::from(e)))?;
        let chunk = policy.chunk_rows;
        for step in policy.steps(now) {
            loop {
                let deleted = self
                    .prune_chunk(&step, chunk, now)
                    .await
                    .map_err(failed(report))?;
                report.add(&step, deleted);
                if deleted < chunk as u64 {
                    break;
                }
            }
        }
        Ok(report)
    }

    /// Every pending cursor whose watcher `exists` (a gateway's own: its directory knows it),
    /// ordered by watcher then target: what the start-up sweep re-freezes and what a gateway
    /// picks up after another writer's commit and once every recovery interval. `exists` is asked once per watcher.
    ///
    /// # Errors
    ///
    /// Those of [`CursorStore::cursors`]: a cursor row that cannot be read is left out.
    async fn pending_of(
        &self,
        exists: &(dyn for<'w> Fn(&'w WatcherKey) -> bool + Send + Sync),
    ) -> Result<Vec<Cursor>, StoreError> {
        let mut pending = self
            .cursors(&CursorFilter {
                pending_only: true,
                ..CursorFilter::default()
            })
            .await?;
        // Listed by watcher: `exists` is asked once per watcher.
        let mut last: Option<(WatcherKey, bool)> = None;
        pending.retain(|c| match &last {
            Some((w, known)) if *w == c.watcher => *known,
            _ => {
                let known = exists(&c.watcher);
                last = Some((c.watcher.clone(), known));
                known
            }
        });
        Ok(pending)
    }

    /// Start-up sweep: re-freezes every pending cursor whose watcher `exists`
    /// ([`AwarenessStoreExt::pending_of`]) and returns the notices to re-deliver.
    ///
    /// # Errors
    ///
    /// Those of [`pending_of`](Self::pending_of), then those of [`CursorStore::refreeze`]. On a
    /// read-only handle that is [`StoreError::ReadOnly`] as soon as there is a pending cursor to
    /// re-freeze; with none, it answers no notice and writes nothing.
    async fn sweep(
        &self,
        now: Timestamp,
        exists: &(dyn for<'w> Fn(&'w WatcherKey) -> bool + Send + Sync),
    ) -> Result<Vec<Notice>, StoreError> {
        let keys: Vec<CursorKey> = self
            .pending_of(exists)
            .await?
            .iter()
            .map(Cursor::key)
            .collect();
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.refreeze(&keys, now).await
    }
}

impl<T: AwarenessStore + ?Sized> AwarenessStoreExt for T {}

/// The refs of a [`EventStore::heads`] call, each once (its first occurrence), as that method
/// promises. A single ref (what [`AwarenessStoreExt::session_status`] asks) builds no set.
pub fn distinct_refs(sessions: &[SessionRef]) -> impl Iterator<Item = &SessionRef> {
    let mut seen =
        (sessions.len() > 1).then(|| std::collections::HashSet::with_capacity(sessions.len()));
    sessions
        .iter()
        .filter(move |r| seen.as_mut().is_none_or(|seen| seen.insert(*r)))
}
