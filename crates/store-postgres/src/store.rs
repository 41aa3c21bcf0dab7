//! The store itself: its state and every operation, each a transaction (writes) or one
//! statement (reads) on the server. [`crate::PgStore`] runs them on the store's own runtime.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use awareness_core::reconcile::ChangesPage;
use awareness_core::upstream::{self, LinkSpec, UpsertOutcome, UpstreamLink, UpstreamStore};
use awareness_core::{
    AckTarget, AgentId, Cursor, CursorFilter, CursorKey, CursorStore, Event, EventStore, Head,
    LogStats, NewEvent, Notice, OpenFailure, PruneStep, Recorded, Sequence, SessionKey, SessionRef,
    StoreError, Timestamp, UnreadableCursor, WatcherKey, async_trait, protocol, reconcile,
    retention,
};
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Postgres, Row as _, Transaction};

use crate::rows::{self, Rows};
use crate::{LAST_SEQUENCE, PRUNE_TRANSACTION_ROWS, PgConnectOptions, PgStoreOptions, schema};

/// The store's state and operations, run on the store's own runtime by [`crate::PgStore`].
#[derive(Debug)]
pub(crate) struct Inner {
    pool: PgPool,
    /// Names the store in errors and warnings: the schema (the server is the caller's).
    pub(crate) name: String,
    /// The store's schema.
    pub(crate) schema: String,
    /// The id every session of the handle carries ([`crate::hints::HANDLE_SETTING`]), which
    /// its commits' notifications name.
    pub(crate) handle_id: String,
    /// The listener for other handles' commits, once asked for ([`crate::hints`]).
    pub(crate) listener: crate::hints::Listener,
    /// The commits of this handle counted in the store-wide commit count.
    own_commits: AtomicU64,
    /// `BEGIN` and the taking of the store's lock, sent as one.
    begin: String,
    /// The same for a group commit's batch.
    pub(crate) begin_batch: String,
    /// The turn this handle's write transactions take (see [`Inner::write`]).
    pub(crate) turn: Arc<tokio::sync::Mutex<()>>,
    /// Recordings one write transaction holds at most ([`PgStoreOptions::group_commit`]).
    pub(crate) group_commit: usize,
    /// The recordings waiting for the handle's turn (group commit).
    pub(crate) queue: crate::group::Queue,
    /// Numbers the queued recordings, so that a caller tells its own from the others.
    pub(crate) next_job: AtomicU64,
    /// Write transactions this handle has begun ([`crate::PgStore::write_transactions`]).
    pub(crate) write_transactions: AtomicU64,
    /// The most recordings one of them held ([`crate::PgStore::largest_batch`]).
    pub(crate) largest_batch: AtomicUsize,
}

tokio::task_local! {
    /// Set in a task that holds its handle's turn for the whole operation ([`crate::PgStore`]
    /// takes it before it hands the operation to the store's runtime, so that a handle's
    /// writes take effect in the order they were called, also when a caller gave up on one):
    /// its transaction takes no turn of its own.
    pub(crate) static TURN_HELD: ();
}

/// The pool retries a connection the server refuses (or a socket that is not there) until
/// its wait is over, then says only that it timed out: for that error, the error of one
/// connection made directly to `server` (given up after [`CAUSE_WAIT`]), which says why.
async fn cause_of_timeout(e: sqlx::Error, server: &PgConnectOptions) -> sqlx::Error {
    if !matches!(e, sqlx::Error::PoolTimedOut) {
        return e;
    }
    match tokio::time::timeout(CAUSE_WAIT, sqlx::ConnectOptions::connect(server)).await {
        Ok(Err(cause)) => cause,
        Ok(Ok(_)) | Err(_) => e,
    }
}

/// How long [`cause_of_timeout`] tries.
const CAUSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `e` may go away by itself, the same call then succeeding: the connection to the
/// server failed or was lost (I/O, a pool that found no connection in time, SQLSTATE class
/// `08`), the server is shutting down or starting (`57P01`-`57P03`) or has no connection left
/// (`53300`), a transaction lost a race to another (`40001`, `40P01`, `55P03`), or the server
/// ended a transaction that sat idle or ran too long (`25P03`, the store's own
/// [`PgStoreOptions::idle_transaction_timeout`](crate::PgStoreOptions::idle_transaction_timeout)
/// met by a gateway that stalled; `25P04`, a `transaction_timeout`): nothing it wrote was
/// kept, and the same call on another connection may succeed. A statement cancelled (`57014`,
/// a role's `statement_timeout`) is transient only where it waited for the store's lock
/// ([`lock_failure`]): anywhere else it was slower than the timeout and would be again.
pub(crate) fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => d.code().is_some_and(|code| transient_code(&code)),
        _ => false,
    }
}

/// Whether the SQLSTATE `code` is one of [`is_transient`]'s.
fn transient_code(code: &str) -> bool {
    code.starts_with("08")
        || matches!(
            code,
            "57P01" | "57P02" | "57P03" | "53300" | "40001" | "40P01" | "55P03" | "25P03" | "25P04"
        )
}

/// `e` as the store's error: [`StoreError::Busy`] (retryable) when it may go away by itself
/// ([`is_transient`]), else [`StoreError::Backend`]; `context` names the store and the work.
pub(crate) fn failure(context: String, e: sqlx::Error) -> StoreError {
    if is_transient(&e) {
        StoreError::Busy {
            context,
            source: e.into(),
        }
    } else {
        StoreError::backend(context, e)
    }
}

/// [`failure`] of the statement that takes the store's lock, where a cancelled statement
/// (`57014`) is [`StoreError::Busy`] too: a role's `statement_timeout` met while another
/// gateway holds the lock, as `55P03` is for its `lock_timeout`. The statement wrote nothing,
/// and once the lock is free the same call succeeds; a cancel anywhere else is a statement
/// slower than the timeout, which a retry meets again, and stays [`StoreError::Backend`].
pub(crate) fn lock_failure(context: String, e: sqlx::Error) -> StoreError {
    if cancelled(&e) {
        StoreError::Busy {
            context,
            source: e.into(),
        }
    } else {
        failure(context, e)
    }
}

/// Whether `e` is a statement the server cancelled (`57014`: a role's `statement_timeout`).
pub(crate) fn cancelled(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(sqlx::error::DatabaseError::code)
        .is_some_and(|code| code == "57014")
}

/// A write transaction of a store, holding the store's lock, and its handle's turn when the
/// task does not hold it already, until it commits or is dropped (which rolls it back).
pub(crate) struct Write {
    tx: Transaction<'static, Postgres>,
    _turn: Option<tokio::sync::OwnedMutexGuard<()>>,
    /// The transaction's id on the server, once a statement has read it (recordings do): a
    /// `COMMIT` whose answer is lost is then asked about ([`Inner::commit_known`]).
    pub(crate) id: Option<TxId>,
    /// A statement of it lost its connection ([`Inner::end_abandoned`]).
    pub(crate) lost: bool,
}

/// A write transaction's id on the server (`txid_current()`, with its epoch) and the process
/// id of the session that runs it (`pg_backend_pid()`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxId {
    xid: i64,
    pid: i32,
}

impl TxId {
    /// The two, read from the columns `at` and `at + 1` of `row`.
    pub(crate) fn at(row: &PgRow, at: usize) -> Result<Self, sqlx::Error> {
        Ok(Self {
            xid: row.try_get(at)?,
            pid: row.try_get(at + 1)?,
        })
    }
}

/// What the server tells of a transaction whose `COMMIT` lost its answer.
enum Settled {
    /// It committed, and the log holds its events as they were written.
    Committed,
    /// It rolled back.
    RolledBack,
    /// It committed, but the log does not hold the events as they were written: the id was
    /// another transaction's (after a server restart, say), or the events changed since.
    NotAsWritten,
}

/// Why a recording's transaction did not commit ([`Inner::commit_known`]).
pub(crate) enum Uncommitted {
    /// The answer to its `COMMIT` was lost, and the server then said that it did not commit:
    /// nothing it wrote was kept, and doing it again is safe ([`StoreError::Busy`]).
    RolledBack(StoreError),
    /// Anything else: a statement failed, the server refused the commit, or the answer to the
    /// `COMMIT` was lost and the server could not be asked in time (the error then says that
    /// the outcome is unknown).
    Failed(StoreError),
}

impl Uncommitted {
    /// The error to give the caller.
    pub(crate) fn into_error(self) -> StoreError {
        match self {
            Self::RolledBack(e) | Self::Failed(e) => e,
        }
    }
}

impl From<StoreError> for Uncommitted {
    fn from(e: StoreError) -> Self {
        Self::Failed(e)
    }
}

/// How long a store keeps asking the server whether a transaction committed after the answer
/// to its `COMMIT` was lost, before it gives the caller an error saying the outcome is
/// unknown: long enough for a fresh connection and a server ending the session that still ran
/// the transaction, short beside a turn's patience.
const ASK_AFTER_LOST_COMMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `e`, the failure of a `COMMIT`, may have hidden its outcome: every failure but an
/// error the server answered that is not about the connection (the server refused the
/// commit, so it did not happen).
pub(crate) fn commit_answer_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d
            .code()
            .is_none_or(|code| code.starts_with("08") || code.starts_with("57P")),
        _ => true,
    }
}

impl std::ops::Deref for Write {
    type Target = sqlx::PgConnection;

    fn deref(&self) -> &sqlx::PgConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for Write {
    fn deref_mut(&mut self) -> &mut sqlx::PgConnection {
        &mut self.tx
    }
}

/// A sequence as PostgreSQL stores it (`bigint`); one beyond its range is its largest value,
/// which no stored row is above.
pub(crate) fn int(s: Sequence) -> i64 {
    i64::try_from(s.0).unwrap_or(i64::MAX)
}

/// One column of a statement's arrays: `f` of each of `rows`.
pub(crate) fn column<'a, R: std::ops::Deref + 'a, T>(
    rows: &'a [R],
    f: impl Fn(&'a R::Target) -> T,
) -> Vec<T> {
    rows.iter().map(|r| f(r)).collect()
}

/// A count or limit as PostgreSQL takes it.
fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Inner {
    /// Connects to the server `server` and opens the store in the schema `options` names,
    /// creating the schema and its tables when missing (under the store's lock, so that
    /// several gateways connecting at once create them once).
    ///
    /// # Errors
    ///
    /// [`StoreError::Open`] naming the schema: [`OpenFailure::InvalidOptions`] for a schema
    /// name that is not 1-63 lowercase ASCII letters, digits and underscores starting with a
    /// letter or underscore, a pool of no connection, or an idle transaction timeout out of
    /// range; [`OpenFailure::Other`] when the server
    /// cannot be reached or refuses the connection; [`OpenFailure::Unsupported`] when its
    /// database does not encode text as UTF-8; [`OpenFailure::NotAStore`] when the schema holds
    /// a table of one of the store's names without the store's columns;
    /// [`OpenFailure::NotFound`] when [`PgStoreOptions::create_if_missing`] is off and the
    /// schema or a table of the store is missing. Nothing is created then.
    pub(crate) async fn connect(
        server: PgConnectOptions,
        options: PgStoreOptions,
    ) -> Result<Self, StoreError> {
        let name = format!("postgres schema {:?}", options.schema);
        let refuse = |reason: String| {
            StoreError::open(name.clone(), OpenFailure::InvalidOptions, reason, None)
        };
        schema::check_name(&options.schema).map_err(refuse)?;
        if options.max_connections == 0 {
            return Err(refuse(
                "max_connections: a pool needs at least one connection".into(),
            ));
        }
        if options.group_commit == 0 {
            return Err(refuse(
                "group_commit must be at least 1 (1 commits every recording alone)".into(),
            ));
        }
        if options.listener_keepalive < std::time::Duration::from_millis(1) {
            return Err(refuse(format!(
                "listener_keepalive: {:?}; at least 1 ms (Duration::MAX never)",
                options.listener_keepalive
            )));
        }
        let lock_key = schema::lock_key(&options.schema);
        let idle_ms = options.idle_transaction_timeout.as_millis();
        if idle_ms == 0 || idle_ms > i32::MAX as u128 {
            return Err(refuse(format!(
                "idle_transaction_timeout: {:?}; from 1 ms to {} ms",
                options.idle_transaction_timeout,
                i32::MAX
            )));
        }
        let idle_ms = idle_ms.to_string();
        // Every session of the handle carries its id, which its commits' notifications name
        // ([`crate::hints`]): the handle's listener leaves its own out.
        let handle_id = crate::hints::handle_id();
        let server = server.options([
            ("search_path", options.schema.as_str()),
            ("idle_in_transaction_session_timeout", idle_ms.as_str()),
            (crate::hints::HANDLE_SETTING, handle_id.as_str()),
        ]);
        let probe = server.clone();
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .connect_with(server)
            .await;
        let pool = match pool {
            Ok(pool) => pool,
            Err(e) => {
                // A server down or restarting may answer later: retryable, as a busy store is.
                // Told by the pool's error (a wait that was over is retryable whatever its
                // cause: a server with no connection left, say), said with the cause.
                let transient = is_transient(&e);
                let e = cause_of_timeout(e, &probe).await;
                return Err(if transient {
                    StoreError::Busy {
                        context: format!("{name}: connecting to the server"),
                        source: e.into(),
                    }
                } else {
                    StoreError::open(
                        name.clone(),
                        OpenFailure::Other,
                        "cannot connect to the server",
                        Some(e.into()),
                    )
                });
            }
        };
        let store = Self {
            pool,
            name,
            schema: options.schema.clone(),
            handle_id,
            listener: crate::hints::Listener::new(options.listener_keepalive),
            own_commits: AtomicU64::new(0),
            // READ COMMITTED whatever the server's, database's, role's or URL's default: each
            // statement after the lock then takes its snapshot after the lock was granted, and
            // sees every write committed before (under REPEATABLE READ the snapshot would be
            // the lock statement's, taken before it waited, and the counter's update would
            // fail to serialize against the writer it waited for).
            begin: format!(
                "BEGIN ISOLATION LEVEL READ COMMITTED; SELECT pg_advisory_xact_lock({lock_key})"
            ),
            // A batch's statements take arrays whose length changes from one batch to the
            // next, so PostgreSQL plans them anew each time (a quarter of a millisecond for a
            // batch of 16 here); their generic plan is as good (index scans on the keys,
            // looked up one by one), made once per connection: decision 0030.
            begin_batch: format!(
                "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL plan_cache_mode = force_generic_plan; \
                 SELECT pg_advisory_xact_lock({lock_key})"
            ),
            turn: Arc::new(tokio::sync::Mutex::new(())),
            group_commit: options.group_commit,
            queue: crate::group::Queue::default(),
            next_job: AtomicU64::new(0),
            write_transactions: AtomicU64::new(0),
            largest_batch: AtomicUsize::new(0),
        };
        schema::create(
            &store.pool,
            &options.schema,
            lock_key,
            &store.name,
            options.create_if_missing,
        )
        .await?;
        Ok(store)
    }

    /// The pool the store runs on (for an operator's own queries; the store's rows are the
    /// store's).
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub(crate) fn failed(&self, what: &str) -> impl FnOnce(sqlx::Error) -> StoreError + '_ {
        let what = what.to_owned();
        move |e| failure(format!("{}: {what}", self.name), e)
    }

    /// Begins a write transaction holding the store's lock.
    pub(crate) async fn write(&self, what: &str) -> Result<Write, StoreError> {
        self.write_with(what, &self.begin).await
    }

    /// Begins a write transaction holding the store's lock with `begin` ([`Inner::write`]'s,
    /// or a batch's).
    pub(crate) async fn write_with(&self, what: &str, begin: &str) -> Result<Write, StoreError> {
        // This handle's writers take turns here, so that at most one of its connections waits
        // for the store's lock on the server (held by another gateway, say) and the others
        // stay free for reads.
        let turn = match TURN_HELD.try_with(|()| ()) {
            Ok(()) => None,
            Err(_) => Some(Arc::clone(&self.turn).lock_owned().await),
        };
        self.write_transactions.fetch_add(1, Ordering::Relaxed);
        // `BEGIN` and the lock in one round trip.
        let tx = self
            .pool
            .begin_with(AssertSqlSafe(begin.to_owned()))
            .await
            .map_err(|e| lock_failure(format!("{}: {what}", self.name), e))?;
        Ok(Write {
            tx,
            _turn: turn,
            id: None,
            lost: false,
        })
    }

    /// Commits a write transaction that has not counted itself yet: counts it in the
    /// store-wide commit count first (see [`EventStore::foreign_commits`]), which reads the
    /// transaction's id. When the answer to the `COMMIT` is lost, the server is asked, as for
    /// a recording ([`Inner::commit_known`]): a session left idle in the transaction, holding
    /// the store's lock for every gateway until the server's idle timeout, is ended; committed,
    /// this is a success (and counted as this handle's own, which `foreign_commits` must not
    /// show as another's); rolled back, a retryable error (nothing was written); unknown,
    /// [`StoreError::Backend`] saying so.
    async fn commit(&self, mut tx: Write, what: &str) -> Result<(), StoreError> {
        let row = sqlx::query(rows::COUNT_COMMIT)
            .fetch_optional(&mut *tx)
            .await
            .map_err(self.failed(what))?
            .ok_or_else(|| {
                self.rows()
                    .corrupt("the sequence counter", "its row is missing")
            })?;
        tx.id = Some(TxId::at(&row, 0).map_err(self.failed(what))?);
        self.commit_known(tx, what, &[], false)
            .await
            .map_err(|(Uncommitted::RolledBack(e) | Uncommitted::Failed(e))| e)
    }

    /// Commits a recording's transaction, which wrote the events `written` and counted itself
    /// in the store-wide commit count, and counts it as this handle's own. When the answer to the
    /// `COMMIT` is lost (the connection failed while it was on its way), the server is asked
    /// on another connection whether the transaction ([`Write::id`]) committed: committed,
    /// with the events in the log as written, this is a success; rolled back,
    /// [`Uncommitted::RolledBack`]. A session the server still runs the transaction in, idle
    /// (a connection it has not seen gone), is ended first, so that the answer is final. A
    /// transaction that wrote no event (dedupe hits only) is a success whatever the answer:
    /// the stored events are the answer either way (it is asked all the same, which ends such
    /// a session). The handle's turn is held throughout. `recording` is false for a write
    /// other than a recording, which wrote no event and needs the server's answer.
    pub(crate) async fn commit_known(
        &self,
        tx: Write,
        what: &str,
        written: &[&Event],
        recording: bool,
    ) -> Result<(), Uncommitted> {
        let Write { tx, _turn, id, .. } = tx;
        let lost = match tx.commit().await {
            Ok(()) => {
                self.own_commits.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Err(e) => e,
        };
        let Some(id) = id.filter(|_| commit_answer_lost(&lost)) else {
            return Err(Uncommitted::Failed(self.failed(what)(lost)));
        };
        let asked = tokio::time::timeout(ASK_AFTER_LOST_COMMIT, self.settle(id, written)).await;
        if recording && written.is_empty() {
            // Dedupe hits only: the stored events are the answer whatever the server says.
            // Asking still ended a session left idle in the transaction, which held the
            // store's lock and the counter's row for every gateway.
            tracing::debug!(store = %self.name, error = %lost, "the answer to a COMMIT of dedupe hits only was lost; the stored events are the answer");
            if matches!(asked, Ok(Ok(Settled::Committed))) {
                self.own_commits.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(());
        }
        // An unknown outcome is not retryable: done again, an event without a dedupe key may
        // be recorded twice (as store-sqlite's group commit that stopped before answering),
        // and another write may do more than once (an acknowledgement of whatever notice each
        // cursor shows takes one that came meanwhile too).
        let unknown = |why: String| {
            let again = if recording {
                "read it back, or record it again (under the same dedupe key, if it had one, so as not to record it twice)"
            } else {
                "read back what it was for before doing it again"
            };
            Uncommitted::Failed(StoreError::Backend {
                context: format!(
                    "{}: {what}: the connection was lost during COMMIT (transaction {}); {why}: the outcome is unknown: {again}",
                    self.name, id.xid
                ),
                source: lost.to_string().into(),
            })
        };
        match asked {
            Ok(Ok(Settled::Committed)) => {
                tracing::warn!(store = %self.name, transaction = id.xid, error = %lost, "the answer to a COMMIT was lost; the server says it committed");
                self.own_commits.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Ok(Ok(Settled::RolledBack)) => Err(Uncommitted::RolledBack(StoreError::Busy {
                context: format!(
                    "{}: {what}: the connection was lost during COMMIT (transaction {}); the server says it did not commit: nothing was written",
                    self.name, id.xid
                ),
                source: lost.into(),
            })),
            Ok(Ok(Settled::NotAsWritten)) => Err(unknown(
                "the server says it committed, but the log does not hold its events as written \
                 (the id may have gone to another transaction after a server restart)"
                    .into(),
            )),
            Ok(Err(asking)) => Err(unknown(format!(
                "the server could not be asked whether it committed ({})",
                awareness_core::error::ErrorChain(&*asking)
            ))),
            Err(_) => Err(unknown(format!(
                "the server could not be asked whether it committed within {ASK_AFTER_LOST_COMMIT:?}"
            ))),
        }
    }

    /// Ends a write transaction `tx` one of whose statements lost its connection
    /// ([`Write::lost`], once its id is known): the server may not have seen the connection go,
    /// and keeps the transaction's session idle in it, holding the store's lock for every
    /// gateway until the idle-transaction timeout. So its connection is given up first (which
    /// frees it for the question, in a pool of one), and the server is asked to end that
    /// session, as after a lost `COMMIT` ([`Inner::settle`]); nothing was committed (no
    /// `COMMIT` was sent). Best-effort, within [`ASK_AFTER_LOST_COMMIT`]: what it cannot do is
    /// logged. The handle's turn is held until it is done; a transaction that lost nothing is
    /// only rolled back.
    pub(crate) async fn end_abandoned(&self, tx: Write) {
        let Write {
            tx,
            _turn,
            id,
            lost,
        } = tx;
        drop(tx);
        let Some(id) = id.filter(|_| lost) else {
            return;
        };
        match tokio::time::timeout(ASK_AFTER_LOST_COMMIT, self.settle(id, &[])).await {
            Ok(Ok(_)) => {
                tracing::debug!(store = %self.name, transaction = id.xid, "a write transaction lost its connection; its session on the server is ended");
            }
            Ok(Err(asking)) => {
                tracing::warn!(store = %self.name, transaction = id.xid, asking = %awareness_core::error::ErrorChain(&*asking), "a write transaction lost its connection, and its session on the server could not be ended: it holds the store's lock until the idle-transaction timeout");
            }
            Err(_) => {
                tracing::warn!(store = %self.name, transaction = id.xid, "a write transaction lost its connection, and its session on the server was not ended within {ASK_AFTER_LOST_COMMIT:?}: it holds the store's lock until the idle-transaction timeout");
            }
        }
    }

    /// What the server tells of the transaction `id`, once it has ended it (a session still
    /// running it, idle, is ended first), which wrote `written`.
    async fn settle(
        &self,
        id: TxId,
        written: &[&Event],
    ) -> Result<Settled, awareness_core::error::BoxError> {
        loop {
            let status: Option<String> = sqlx::query_scalar(rows::COMMIT_STATUS)
                .bind(id.xid)
                .fetch_one(&self.pool)
                .await?;
            match status.as_deref() {
                Some("committed") => break,
                Some("aborted") => return Ok(Settled::RolledBack),
                Some(_) => {
                    // In progress: its session is still there, idle (the server has not seen
                    // the connection gone) or busy with the commit; ended, or done, the
                    // transaction is settled for good.
                    sqlx::query(rows::END_LOST_COMMIT)
                        .bind(id.xid)
                        .bind(id.pid)
                        .execute(&self.pool)
                        .await?;
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                None => return Err("the server no longer knows the transaction".into()),
            }
        }
        if written.is_empty() {
            // Nothing to find in the log (dedupe hits only, or a write other than a recording).
            return Ok(Settled::Committed);
        }
        let held: i64 = sqlx::query_scalar(rows::EVENTS_AS_WRITTEN)
            .bind(column(written, |e| int(e.sequence)))
            .bind(column(written, |e| e.session_key.as_str()))
            .bind(column(written, |e| e.agent_id.as_str()))
            .bind(column(written, |e| e.occurred_at.millis()))
            .bind(column(written, |e| e.summary.as_str()))
            .fetch_one(&self.pool)
            .await?;
        Ok(if usize::try_from(held) == Ok(written.len()) {
            Settled::Committed
        } else {
            Settled::NotAsWritten
        })
    }

    pub(crate) fn rows(&self) -> Rows<'_> {
        Rows { store: &self.name }
    }

    async fn one_cursor(
        &self,
        tx: &mut Write,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<Option<Cursor>, StoreError> {
        let row = sqlx::query(rows::CURSOR)
            .bind(watcher.as_str())
            .bind(target.as_str())
            .fetch_optional(&mut **tx)
            .await
            .map_err(self.failed("reading a cursor"))?;
        row.map(|r| self.rows().cursor(&r)).transpose()
    }

    /// [`Inner::one_cursor`], with a row this store cannot read taken as no cursor, and a
    /// warning that says what `then` happens to it.
    async fn readable_cursor(
        &self,
        tx: &mut Write,
        watcher: &WatcherKey,
        target: &SessionKey,
        then: &str,
    ) -> Result<Option<Cursor>, StoreError> {
        match self.one_cursor(tx, watcher, target).await {
            Err(e @ StoreError::Corrupt { .. }) => {
                tracing::warn!(store = %self.name, error = %e, "a cursor row this store cannot read: {then}");
                Ok(None)
            }
            other => other,
        }
    }

    /// The cursors of the keys `(watcher, target)`, in one statement, by key; a row this store
    /// cannot read is left out, with a warning that says what `then` happens to it.
    async fn cursors_of_keys(
        &self,
        tx: &mut Write,
        keys: &[(&WatcherKey, &SessionKey)],
        then: &str,
    ) -> Result<HashMap<CursorKey, Cursor>, StoreError> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let watchers: Vec<&str> = keys.iter().map(|(w, _)| w.as_str()).collect();
        let targets: Vec<&str> = keys.iter().map(|(_, t)| t.as_str()).collect();
        let rows = sqlx::query(rows::CURSORS_OF_KEYS)
            .bind(&watchers)
            .bind(&targets)
            .fetch_all(&mut **tx)
            .await
            .map_err(self.failed("reading cursors"))?;
        let mut out = HashMap::with_capacity(rows.len());
        for r in &rows {
            match self.rows().cursor(r) {
                Ok(c) => {
                    out.insert(c.key(), c);
                }
                Err(e) => {
                    tracing::warn!(store = %self.name, error = %e, "a cursor row this store cannot read: {then}");
                }
            }
        }
        Ok(out)
    }

    async fn put_cursors(&self, tx: &mut Write, cursors: &[Cursor]) -> Result<(), StoreError> {
        if cursors.is_empty() {
            return Ok(());
        }
        CursorColumns::of(cursors)
            .bind(sqlx::query(rows::UPSERT_CURSORS))
            .execute(&mut **tx)
            .await
            .map_err(self.failed("writing cursors"))?;
        Ok(())
    }

    /// The head row of `session`: `None` when there is none, `Some(Err)` when it cannot be
    /// read.
    async fn head_in(
        &self,
        tx: &mut Write,
        session: &SessionRef,
    ) -> Result<Option<Result<Head, StoreError>>, StoreError> {
        let row = sqlx::query(rows::HEAD)
            .bind(session.session_key.as_str())
            .bind(session.agent_id.as_str())
            .fetch_optional(&mut **tx)
            .await
            .map_err(self.failed("reading a head"))?;
        Ok(row.map(|r| self.rows().head(&r)))
    }

    async fn link_in(
        &self,
        tx: &mut Write,
        session: &SessionRef,
    ) -> Result<Option<Result<UpstreamLink, StoreError>>, StoreError> {
        let row = sqlx::query(rows::LINK)
            .bind(session.session_key.as_str())
            .bind(session.agent_id.as_str())
            .fetch_optional(&mut **tx)
            .await
            .map_err(self.failed("reading an upstream link"))?;
        Ok(row.map(|r| self.rows().link(&r)))
    }

    async fn put_link(&self, tx: &mut Write, link: &UpstreamLink) -> Result<(), StoreError> {
        let json = |v: &Option<serde_json::Value>| v.as_ref().map(serde_json::Value::to_string);
        sqlx::query(rows::PUT_LINK)
            .bind(link.session.session_key.as_str())
            .bind(link.session.agent_id.as_str())
            .bind(&link.catalog_id)
            .bind(&link.host_id)
            .bind(&link.thread_id)
            .bind(&link.upstream_kind)
            .bind(json(&link.upstream_ref))
            .bind(json(&link.marker))
            .bind(link.last_scanned_at.map(Timestamp::millis))
            .bind(link.created_at.millis())
            .bind(link.updated_at.millis())
            .execute(&mut **tx)
            .await
            .map_err(self.failed("writing an upstream link"))?;
        Ok(())
    }

    /// One transaction of a pruning chunk: at most `want` rows of `step`; what it deleted and
    /// whether more may be due.
    async fn prune_transaction(
        &self,
        step: &PruneStep,
        want: usize,
        now: Timestamp,
    ) -> Result<(usize, bool), StoreError> {
        let mut tx = self.write("pruning").await?;
        let victims: Vec<PgRow> = match *step {
            PruneStep::Cursors { cutoff } => {
                let gone = sqlx::query(rows::PRUNE_CURSORS)
                    .bind(cutoff.millis())
                    .bind(count(want))
                    .execute(&mut *tx)
                    .await
                    .map_err(self.failed("pruning idle cursors"))?
                    .rows_affected() as usize;
                if gone > 0 {
                    self.commit(tx, "pruning idle cursors").await?;
                }
                return Ok((gone, gone == want));
            }
            PruneStep::Age { cutoff } => sqlx::query(rows::AGE_VICTIMS)
                .bind(cutoff.millis())
                .bind(count(want))
                .fetch_all(&mut *tx)
                .await
                .map_err(self.failed("choosing events to prune by age"))?,
            PruneStep::RowCap { max_rows } => {
                let retained: i64 = sqlx::query_scalar(rows::ROW_COUNT)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(self.failed("counting events"))?;
                let n = retention::row_cap_victims(retained.max(0) as u64, max_rows, want);
                if n == 0 {
                    return Ok((0, false));
                }
                sqlx::query(rows::CAP_VICTIMS)
                    .bind(count(n))
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(self.failed("choosing events to prune by count"))?
            }
        };
        if victims.is_empty() {
            return Ok((0, false));
        }
        let mut sequences = Vec::with_capacity(victims.len());
        // Rows whose key cannot be read stamp no head (there is no head to name), and are
        // deleted all the same.
        let mut stamped = Vec::with_capacity(victims.len());
        for r in &victims {
            let seq: i64 = r.try_get(0).map_err(self.failed("reading a victim"))?;
            sequences.push(seq);
            let key: String = r.try_get(1).map_err(self.failed("reading a victim"))?;
            let agent: String = r.try_get(2).map_err(self.failed("reading a victim"))?;
            if let (Ok(session), Ok(s)) = (SessionRef::parse(&key, &agent), u64::try_from(seq)) {
                stamped.push((session, Sequence(s)));
            }
        }
        // Each affected head as awareness-core stamps it (`retention::stamp`: the watermark only
        // raised, the time moved up to `now` with it), read and written under the lock; a head
        // this store cannot read gets none (decision 0020), a ref without one gets none made.
        let marks = retention::watermarks(stamped.iter().map(|(r, s)| (r, *s)));
        if !marks.is_empty() {
            let keys: Vec<&str> = marks.keys().map(|r| r.session_key.as_str()).collect();
            let agents: Vec<&str> = marks.keys().map(|r| r.agent_id.as_str()).collect();
            let heads = sqlx::query(rows::HEADS)
                .bind(&keys)
                .bind(&agents)
                .fetch_all(&mut *tx)
                .await
                .map_err(self.failed("reading the heads pruning stamps"))?;
            let stamped: Vec<Head> = self
                .rows()
                .readable_heads(&heads)
                .into_iter()
                .filter_map(|h| {
                    let raised = retention::stamp(&h, *marks.get(&h.session)?, now);
                    (raised != h).then_some(raised)
                })
                .collect();
            if !stamped.is_empty() {
                sqlx::query(rows::STAMP_HEADS)
                    .bind(
                        stamped
                            .iter()
                            .map(|h| h.session.session_key.as_str())
                            .collect::<Vec<_>>(),
                    )
                    .bind(
                        stamped
                            .iter()
                            .map(|h| h.session.agent_id.as_str())
                            .collect::<Vec<_>>(),
                    )
                    .bind(
                        stamped
                            .iter()
                            .map(|h| int(h.pruned_max_sequence))
                            .collect::<Vec<_>>(),
                    )
                    .bind(
                        stamped
                            .iter()
                            .map(|h| h.updated_at.millis())
                            .collect::<Vec<_>>(),
                    )
                    .execute(&mut *tx)
                    .await
                    .map_err(self.failed("stamping pruned watermarks"))?;
            }
        }
        let gone = sqlx::query("DELETE FROM session_state_events WHERE sequence = ANY($1)")
            .bind(&sequences)
            .execute(&mut *tx)
            .await
            .map_err(self.failed("pruning events"))?
            .rows_affected() as usize;
        self.commit(tx, "pruning events").await?;
        Ok((gone, victims.len() == want))
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any
    /// time): deletes one event row and nothing else. Returns whether the row existed.
    pub(crate) async fn delete_event_row(&self, sequence: Sequence) -> Result<bool, StoreError> {
        self.raw_write(
            "DELETE FROM session_state_events WHERE sequence = $1::text::bigint",
            &[int(sequence).to_string()],
        )
        .await
    }

    /// Test support, not part of the API: deletes one head row and nothing else. Returns
    /// whether the row existed.
    pub(crate) async fn delete_head_row(&self, session: &SessionRef) -> Result<bool, StoreError> {
        self.raw_write(
            "DELETE FROM session_state_heads WHERE session_key = $1 AND agent_id = $2",
            &[
                session.session_key.to_string(),
                session.agent_id.to_string(),
            ],
        )
        .await
    }

    /// Test support, not part of the API: makes one event row unreadable (a negative
    /// sequence cannot be given, so its actor type becomes one no event has). Returns whether
    /// the row existed.
    pub(crate) async fn damage_event_row(&self, sequence: Sequence) -> Result<bool, StoreError> {
        self.raw_write(
            "UPDATE session_state_events SET actor_type = '' WHERE sequence = $1::text::bigint",
            &[int(sequence).to_string()],
        )
        .await
    }

    /// Test support, not part of the API: makes one cursor row unreadable (its target agent
    /// empty). Returns whether the row existed.
    pub(crate) async fn damage_cursor_row(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError> {
        self.raw_write(
            "UPDATE session_watch_cursors SET target_agent_id = ''
             WHERE watcher_session_key = $1 AND target_session_key = $2",
            &[watcher.as_str().to_owned(), target.as_str().to_owned()],
        )
        .await
    }

    /// Test support, not part of the API: makes one link row unreadable (its marker text not
    /// JSON). Returns whether the row existed.
    pub(crate) async fn damage_link_row(&self, session: &SessionRef) -> Result<bool, StoreError> {
        self.raw_write(
            "UPDATE session_upstream_links SET last_marker_json = '{not json'
             WHERE session_key = $1 AND agent_id = $2",
            &[
                session.session_key.to_string(),
                session.agent_id.to_string(),
            ],
        )
        .await
    }

    /// Test support, not part of the API: makes one head row unreadable (a negative last
    /// sequence). Returns whether the row existed.
    pub(crate) async fn damage_head_row(&self, session: &SessionRef) -> Result<bool, StoreError> {
        self.raw_write(
            "UPDATE session_state_heads SET last_sequence = -1
             WHERE session_key = $1 AND agent_id = $2",
            &[
                session.session_key.to_string(),
                session.agent_id.to_string(),
            ],
        )
        .await
    }

    /// Test support, not part of the API: marks a cursor ambient. Returns whether the row
    /// existed.
    pub(crate) async fn make_ambient(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError> {
        self.raw_write(
            "UPDATE session_watch_cursors SET provenance = 'ambient-group'
             WHERE watcher_session_key = $1 AND target_session_key = $2",
            &[watcher.as_str().to_owned(), target.as_str().to_owned()],
        )
        .await
    }

    /// Test support, not part of the API: gives a cursor a provenance this version does not
    /// know, past the CHECK that keeps it out of a store this version made (dropped for it, as
    /// a later version's wider one would allow). Returns whether the row existed.
    pub(crate) async fn spoil_cursor_provenance(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError> {
        self.raw_write(
            "ALTER TABLE session_watch_cursors
             DROP CONSTRAINT IF EXISTS session_watch_cursors_provenance_check",
            &[],
        )
        .await?;
        self.raw_write(
            "UPDATE session_watch_cursors SET provenance = 'ambient-channel'
             WHERE watcher_session_key = $1 AND target_session_key = $2",
            &[watcher.as_str().to_owned(), target.as_str().to_owned()],
        )
        .await
    }

    /// Test support, not part of the API: moves the counter so that exactly `left` more
    /// sequences can be handed out. Returns whether it could (the counter never goes back).
    pub(crate) async fn leave_sequences(&self, left: u64) -> Result<bool, StoreError> {
        let Some(at) = LAST_SEQUENCE.checked_sub(left) else {
            return Ok(false);
        };
        self.raw_write(
            "UPDATE session_state_counter SET last_sequence = $1::text::bigint
             WHERE id = 0 AND last_sequence <= $1::text::bigint
               AND NOT EXISTS (SELECT 1 FROM session_state_events
                 WHERE sequence > $1::text::bigint)",
            &[at.to_string()],
        )
        .await
    }

    /// Test support, not part of the API: `false`, always. A database that encodes text as
    /// UTF-8 (the only kind [`PgStore::connect`] takes) holds no text that is not UTF-8, so
    /// no row of this store can be spoiled so.
    #[allow(clippy::unused_async)] // async as the testkit's forwarding macro calls it
    pub(crate) async fn spoil_link_text(&self, _session: &SessionRef) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// Test support, not part of the API: `false`, always (see
    /// `Inner::spoil_link_text`): a link's session key is a `text` column, which can no more
    /// hold text that is not UTF-8 than its thread id can.
    #[allow(clippy::unused_async)] // async as the testkit's forwarding macro calls it
    pub(crate) async fn spoil_link_key(&self, _session: &SessionRef) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// Test support, not part of the API: `false`, always (see
    /// `Inner::spoil_link_text`).
    #[allow(clippy::unused_async)] // async as the testkit's forwarding macro calls it
    pub(crate) async fn spoil_cursor_text(
        &self,
        _watcher: &WatcherKey,
        _target: &SessionKey,
    ) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// Test support, not part of the API: `false`, always (see
    /// `Inner::spoil_link_text`).
    #[allow(clippy::unused_async)] // async as the testkit's forwarding macro calls it
    pub(crate) async fn spoil_cursor_watcher(
        &self,
        _watcher: &WatcherKey,
        _target: &SessionKey,
    ) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// Test support, not part of the API: `false`, always (see
    /// `Inner::spoil_link_text`).
    #[allow(clippy::unused_async)] // async as the testkit's forwarding macro calls it
    pub(crate) async fn spoil_head_text(&self, _session: &SessionRef) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// Test support, not part of the API: `false`, always (see
    /// `Inner::spoil_link_text`).
    #[allow(clippy::unused_async)] // async as the testkit's forwarding macro calls it
    pub(crate) async fn spoil_event_text(&self, _sequence: Sequence) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// Runs one statement whose binds are texts under the store's lock; whether it changed a
    /// row.
    async fn raw_write(&self, sql: &'static str, binds: &[String]) -> Result<bool, StoreError> {
        let mut tx = self.write("editing a row by hand").await?;
        let mut q = sqlx::query(sql);
        for b in binds {
            q = q.bind(b);
        }
        let changed = q
            .execute(&mut *tx)
            .await
            .map_err(self.failed("editing a row by hand"))?
            .rows_affected()
            > 0;
        // Not counted: a hand edit counts in no commit count, as one made with psql would not.
        tx.tx
            .commit()
            .await
            .map_err(self.failed("editing a row by hand"))?;
        Ok(changed)
    }
}

/// Cursors as the column arrays the statements that write them bind (`unnest`): watcher,
/// target, target agent, last seen, notified, material, updated at, provenance.
pub(crate) struct CursorColumns {
    watchers: Vec<String>,
    targets: Vec<String>,
    agents: Vec<String>,
    last_seen: Vec<i64>,
    notified: Vec<i64>,
    material: Vec<i64>,
    updated_at: Vec<i64>,
    provenance: Vec<&'static str>,
}

impl CursorColumns {
    pub(crate) fn of(cursors: &[Cursor]) -> Self {
        Self {
            watchers: cursors
                .iter()
                .map(|c| c.watcher.as_str().to_owned())
                .collect(),
            targets: cursors
                .iter()
                .map(|c| c.target.as_str().to_owned())
                .collect(),
            agents: cursors
                .iter()
                .map(|c| c.target_agent.as_str().to_owned())
                .collect(),
            last_seen: cursors.iter().map(|c| int(c.last_seen)).collect(),
            notified: cursors.iter().map(|c| int(c.notified)).collect(),
            material: cursors.iter().map(|c| int(c.material)).collect(),
            updated_at: cursors.iter().map(|c| c.updated_at.millis()).collect(),
            provenance: cursors.iter().map(|c| c.provenance.as_str()).collect(),
        }
    }

    /// `query` with the eight arrays bound as its next parameters.
    pub(crate) fn bind(
        self,
        query: sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments> {
        query
            .bind(self.watchers)
            .bind(self.targets)
            .bind(self.agents)
            .bind(self.last_seen)
            .bind(self.notified)
            .bind(self.material)
            .bind(self.updated_at)
            .bind(self.provenance)
    }
}

impl Inner {
    /// One try at recording `event` (valid) in one transaction of four round trips: the lock
    /// (with the `BEGIN`), what the protocol needs (one statement, which also moves the
    /// counter and reads the transaction's id), what it decided (one statement), the commit.
    async fn record_once(&self, event: &NewEvent, now: Timestamp) -> Result<Recorded, Uncommitted> {
        let mut tx = self.write("recording").await?;
        let session = &event.session;
        let rows = sqlx::query(rows::RECORD_READ)
            .bind(int(Sequence(LAST_SEQUENCE)))
            .bind(event.dedupe_key.as_deref())
            .bind(session.session_key.as_str())
            .bind(session.agent_id.as_str())
            .fetch_all(&mut *tx)
            .await
            .map_err(self.failed("recording"))?;
        let first = rows.first().ok_or_else(|| {
            self.rows()
                .corrupt("the sequence counter", "its row is missing")
        })?;
        let read = |i: usize| -> Result<Option<i64>, StoreError> {
            first.try_get(i).map_err(self.failed("recording"))
        };
        let Some(next) = read(0)? else {
            let at = read(1)?.unwrap_or_default();
            return Err(StoreError::counter_at_end(at.max(0) as u64, LAST_SEQUENCE, None).into());
        };
        let seq = Sequence(next as u64);
        tx.id = Some(TxId::at(first, rows::RECORD_XID).map_err(self.failed("recording"))?);
        if read(2)?.is_some() {
            // A dedupe hit. An unreadable row fails the caller and the transaction rolls back:
            // nothing changes, the number included.
            let existing = self.rows().event_at(first, 2)?;
            self.commit_known(tx, "recording a dedupe hit", &[], true)
                .await?;
            return Ok(Recorded {
                event: Arc::new(existing),
                deduplicated: true,
                notices: Vec::new(),
            });
        }
        let mut event = event.clone();
        let named = std::mem::take(&mut event.watchers);
        let stored = event.into_event(seq, now);
        let existing = self.rows().readable_cursors_at(&rows, 18);
        let head = match self.rows().head_at(session, first, 14) {
            Ok(previous) => protocol::head_after(previous.as_ref(), &stored, now),
            Err(e) => {
                tracing::warn!(store = %self.name, error = %e, "recording over a head this store cannot read: its history before the event is reported as a gap");
                protocol::head_over_unreadable(&stored, now)
            }
        };
        let effects = protocol::on_event(&stored, &named, &existing, now);
        let payload = stored
            .payload
            .as_ref()
            .map(|p| serde_json::to_string(p).expect("a JSON map always serializes"));
        let moved = CursorColumns::of(&effects.upserts);
        let written = moved
            .bind(
                sqlx::query(rows::RECORD_WRITE)
                    .bind(next)
                    .bind(stored.dedupe_key.as_deref())
                    .bind(stored.session_key.as_str())
                    .bind(stored.session_id.as_deref())
                    .bind(stored.agent_id.as_str())
                    .bind(stored.kind.as_str())
                    .bind(stored.actor_type.as_str())
                    .bind(stored.actor_id.as_deref())
                    .bind(stored.run_id.as_deref())
                    .bind(stored.occurred_at.millis())
                    .bind(&stored.summary)
                    .bind(payload)
                    .bind(head.session.session_key.as_str())
                    .bind(head.session.agent_id.as_str())
                    .bind(int(head.last_sequence))
                    .bind(int(head.pruned_max_sequence))
                    .bind(head.updated_at.millis()),
            )
            .execute(&mut *tx)
            .await;
        if let Err(e) = written {
            tx.lost = commit_answer_lost(&e);
            self.end_abandoned(tx).await;
            return Err(self.failed("recording")(e).into());
        }
        self.commit_known(tx, "recording", &[&stored], true).await?;
        Ok(Recorded {
            event: Arc::new(stored),
            deduplicated: false,
            notices: effects.notices,
        })
    }
}

#[async_trait]
impl EventStore for Inner {
    async fn record(&self, event: NewEvent, now: Timestamp) -> Result<Recorded, StoreError> {
        event.validate()?;
        match self.record_once(&event, now).await {
            Err(Uncommitted::RolledBack(e)) => {
                tracing::warn!(store = %self.name, error = %awareness_core::error::ErrorChain(&e), "a recording did not commit after the answer to its COMMIT was lost; recording it again");
                self.record_once(&event, now)
                    .await
                    .map_err(Uncommitted::into_error)
            }
            done => done.map_err(Uncommitted::into_error),
        }
    }

    async fn changes_since(
        &self,
        session: &SessionRef,
        after: Sequence,
        limit: usize,
    ) -> Result<ChangesPage, StoreError> {
        let limit = reconcile::clamp_limit(Some(limit));
        let rows = sqlx::query(rows::CHANGES_SINCE)
            .bind(session.session_key.as_str())
            .bind(session.agent_id.as_str())
            .bind(int(after))
            .bind(count(limit + 1))
            .fetch_all(&self.pool)
            .await
            .map_err(self.failed("reading a page of changes"))?;
        self.rows().page(session, after, limit, &rows)
    }

    async fn heads(&self, sessions: &[SessionRef]) -> Result<Vec<Head>, StoreError> {
        let wanted: Vec<&SessionRef> = awareness_core::store::distinct_refs(sessions).collect();
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<&str> = wanted.iter().map(|r| r.session_key.as_str()).collect();
        let agents: Vec<&str> = wanted.iter().map(|r| r.agent_id.as_str()).collect();
        let rows = sqlx::query(rows::HEADS)
            .bind(keys)
            .bind(agents)
            .fetch_all(&self.pool)
            .await
            .map_err(self.failed("reading heads"))?;
        // A head asked for that cannot be read fails the call: no caller is told that such a
        // session has no head (decision 0020).
        let mut found: HashMap<SessionRef, Head> = HashMap::with_capacity(rows.len());
        for r in &rows {
            let h = self.rows().head(r)?;
            found.insert(h.session.clone(), h);
        }
        Ok(wanted.into_iter().filter_map(|r| found.remove(r)).collect())
    }

    async fn list_heads(&self, agent: Option<&AgentId>) -> Result<Vec<Head>, StoreError> {
        let rows = sqlx::query(rows::LIST_HEADS)
            .bind(agent.map(AgentId::as_str))
            .fetch_all(&self.pool)
            .await
            .map_err(self.failed("listing heads"))?;
        Ok(self.rows().readable_heads(&rows))
    }

    async fn events_after(
        &self,
        after: Sequence,
        limit: usize,
    ) -> Result<Vec<Arc<Event>>, StoreError> {
        let rows = sqlx::query(rows::EVENTS_AFTER)
            .bind(int(after))
            .bind(count(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(self.failed("reading the log"))?;
        rows.iter()
            .map(|r| self.rows().event(r).map(Arc::new))
            .collect()
    }

    async fn log_stats(&self) -> Result<LogStats, StoreError> {
        let row = sqlx::query(
            "SELECT count(*) FILTER (WHERE sequence > 0),
               coalesce(min(sequence) FILTER (WHERE sequence > 0), 0),
               coalesce(max(sequence) FILTER (WHERE sequence > 0), 0)
             FROM session_state_events",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(self.failed("reading the log's size"))?;
        let get = |i: usize| -> Result<i64, StoreError> {
            row.try_get(i)
                .map_err(self.failed("reading the log's size"))
        };
        Ok(LogStats {
            rows: get(0)?.max(0) as u64,
            min_sequence: self.rows().sequence("the log's first event", get(1)?)?,
            max_sequence: self.rows().sequence("the log's last event", get(2)?)?,
        })
    }

    async fn prune_chunk(
        &self,
        step: &PruneStep,
        max_rows: usize,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        let mut deleted = 0usize;
        while deleted < max_rows {
            let want = (max_rows - deleted).min(PRUNE_TRANSACTION_ROWS);
            let (gone, more) = self.prune_transaction(step, want, now).await?;
            deleted += gone;
            if !more {
                break;
            }
        }
        Ok(deleted as u64)
    }

    /// Closes the pool's connections once the last handle is closed (each ends its session on
    /// the server, which then holds nothing of this handle's); with other handles left, only
    /// drops this one.
    async fn close(self: Arc<Self>) {
        if let Ok(store) = Arc::try_unwrap(self) {
            store.pool.close().await;
        }
    }

    /// The store-wide count of write transactions (a one-row table every write transaction
    /// of every handle, on every host, adds itself to before it commits) less this handle's
    /// own: it changes only when another handle or process commits a write. One read.
    async fn foreign_commits(&self) -> Result<Option<u64>, StoreError> {
        let all: i64 = sqlx::query_scalar("SELECT commits FROM session_state_counter WHERE id = 0")
            .fetch_one(&self.pool)
            .await
            .map_err(self.failed("reading the commit count"))?;
        let own = self.own_commits.load(Ordering::Relaxed);
        Ok(Some((all as u64).wrapping_sub(own)))
    }

    async fn delete_session(&self, session: &SessionRef) -> Result<(), StoreError> {
        let key = session.session_key.as_str();
        let agent = session.agent_id.as_str();
        let mut tx = self.write("deleting a session").await?;
        let mut gone = 0;
        for sql in [
            "DELETE FROM session_upstream_links WHERE session_key = $1 AND agent_id = $2",
            "DELETE FROM session_state_events WHERE session_key = $1 AND agent_id = $2",
            "DELETE FROM session_state_heads WHERE session_key = $1 AND agent_id = $2",
        ] {
            gone += sqlx::query(sql)
                .bind(key)
                .bind(agent)
                .execute(&mut *tx)
                .await
                .map_err(self.failed("deleting a session"))?
                .rows_affected();
        }
        // The cursors deleting the session removes, as awareness-core says
        // (`Cursor::removed_by_delete`: its own when it is a watcher, those that follow it), and
        // the rows on its key, or of it as a watcher, that cannot be read.
        let rows = sqlx::query(rows::CURSORS_OF_SESSION)
            .bind(key)
            .bind(session.is_watcher())
            .fetch_all(&mut *tx)
            .await
            .map_err(self.failed("deleting a session"))?;
        let (mut watchers, mut targets) = (Vec::new(), Vec::new());
        for r in rows.iter().filter(|r| {
            self.rows()
                .cursor(r)
                .map_or(true, |c| c.removed_by_delete(session))
        }) {
            let text = |i| {
                r.try_get::<String, _>(i)
                    .map_err(self.failed("deleting a session"))
            };
            watchers.push(text(0)?);
            targets.push(text(1)?);
        }
        gone += sqlx::query(rows::DELETE_CURSORS)
            .bind(&watchers)
            .bind(&targets)
            .execute(&mut *tx)
            .await
            .map_err(self.failed("deleting a session"))?
            .rows_affected();
        // A deletion of nothing rolls back: no other gateway is sent looking for notices.
        if gone == 0 {
            return Ok(());
        }
        self.commit(tx, "deleting a session").await
    }
}

#[async_trait]
impl CursorStore for Inner {
    async fn watch(
        &self,
        watcher: &WatcherKey,
        target: &SessionRef,
        now: Timestamp,
    ) -> Result<Cursor, StoreError> {
        protocol::check_watch(watcher.session_key(), &target.session_key)?;
        let mut tx = self.write("watching").await?;
        // A row this store cannot read is written over, as a watch with no cursor writes one.
        let existing = self
            .readable_cursor(
                &mut tx,
                watcher,
                &target.session_key,
                "a watch writes over it",
            )
            .await?;
        let head = match self.head_in(&mut tx, target).await? {
            None => Sequence::ZERO,
            Some(h) => h?.last_sequence,
        };
        let (cursor, write) = protocol::watch(existing.as_ref(), watcher, target, head, now);
        if write {
            self.put_cursors(&mut tx, std::slice::from_ref(&cursor))
                .await?;
            self.commit(tx, "watching").await?;
        }
        Ok(cursor)
    }

    async fn unwatch(&self, watcher: &WatcherKey, target: &SessionKey) -> Result<bool, StoreError> {
        let mut tx = self.write("unwatching").await?;
        let gone = sqlx::query(
            "DELETE FROM session_watch_cursors
             WHERE watcher_session_key = $1 AND target_session_key = $2",
        )
        .bind(watcher.as_str())
        .bind(target.as_str())
        .execute(&mut *tx)
        .await
        .map_err(self.failed("unwatching"))?
        .rows_affected()
            > 0;
        if gone {
            self.commit(tx, "unwatching").await?;
        }
        Ok(gone)
    }

    async fn acknowledge(
        &self,
        watcher: &WatcherKey,
        targets: &[AckTarget],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        let mut tx = self.write("acknowledging").await?;
        let targets: Vec<&AckTarget> = AckTarget::each_once(targets).collect();
        let keys: Vec<(&WatcherKey, &SessionKey)> =
            targets.iter().map(|t| (watcher, &t.target)).collect();
        let mut found = self
            .cursors_of_keys(&mut tx, &keys, "it is left out of an acknowledgement")
            .await?;
        let mut notices = Vec::new();
        let mut writes = Vec::new();
        for t in targets {
            let key = CursorKey {
                watcher: watcher.clone(),
                target: t.target.clone(),
            };
            let Some(c) = found.remove(&key) else {
                continue;
            };
            let (write, follow) = t.apply(&c, now);
            writes.extend(write);
            notices.extend(follow);
        }
        if !writes.is_empty() {
            self.put_cursors(&mut tx, &writes).await?;
            self.commit(tx, "acknowledging").await?;
        }
        Ok(notices)
    }

    async fn cursor(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<Option<Cursor>, StoreError> {
        let row = sqlx::query(rows::CURSOR)
            .bind(watcher.as_str())
            .bind(target.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(self.failed("reading a cursor"))?;
        row.map(|r| self.rows().cursor(&r)).transpose()
    }

    async fn cursors(&self, filter: &CursorFilter) -> Result<Vec<Cursor>, StoreError> {
        let rows = sqlx::query(rows::CURSORS)
            .bind(filter.watcher.as_ref().map(SessionKey::as_str))
            .bind(filter.target.as_ref().map(SessionKey::as_str))
            .bind(filter.pending_only)
            .fetch_all(&self.pool)
            .await
            .map_err(self.failed("listing cursors"))?;
        let mut out = self.rows().readable_cursors(&rows);
        out.retain(|c| filter.matches(c));
        Ok(out)
    }

    async fn refreeze(
        &self,
        keys: &[CursorKey],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        let mut tx = self.write("re-freezing cursors").await?;
        let keys: Vec<&CursorKey> = protocol::each_once(keys).collect();
        let pairs: Vec<(&WatcherKey, &SessionKey)> =
            keys.iter().map(|k| (&k.watcher, &k.target)).collect();
        let mut found = self
            .cursors_of_keys(&mut tx, &pairs, "it is left out of a re-freeze")
            .await?;
        let mut notices = Vec::new();
        let mut writes = Vec::new();
        for k in keys {
            let Some(c) = found.remove(k) else {
                continue;
            };
            if let Some((write, n)) = protocol::refreeze(&c, now) {
                writes.extend(write);
                notices.push(n);
            }
        }
        // A frozen cursor re-delivers its notice and is not written: nothing is committed.
        if !writes.is_empty() {
            self.put_cursors(&mut tx, &writes).await?;
            self.commit(tx, "re-freezing cursors").await?;
        }
        Ok(notices)
    }

    async fn unreadable_cursors(&self) -> Result<Vec<UnreadableCursor>, StoreError> {
        let rows = sqlx::query(rows::CURSORS)
            .bind(None::<&str>)
            .bind(None::<&str>)
            .bind(false)
            .fetch_all(&self.pool)
            .await
            .map_err(self.failed("listing cursors"))?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let e = self.rows().cursor(r).err()?;
                let text = |i: usize| r.try_get::<String, _>(i).unwrap_or_default();
                Some(UnreadableCursor {
                    watcher: text(0),
                    target: text(1),
                    reason: e.to_string(),
                })
            })
            .collect())
    }

    async fn reset_watcher(&self, watcher: &SessionKey) -> Result<u64, StoreError> {
        let mut tx = self.write("resetting a watcher").await?;
        let gone = sqlx::query("DELETE FROM session_watch_cursors WHERE watcher_session_key = $1")
            .bind(watcher.as_str())
            .execute(&mut *tx)
            .await
            .map_err(self.failed("resetting a watcher"))?
            .rows_affected();
        if gone > 0 {
            self.commit(tx, "resetting a watcher").await?;
        }
        Ok(gone)
    }
}

#[async_trait]
impl UpstreamStore for Inner {
    async fn upsert_link(
        &self,
        spec: LinkSpec,
        now: Timestamp,
    ) -> Result<UpsertOutcome, StoreError> {
        spec.validate()?;
        let mut tx = self.write("adopting").await?;
        let (existing, unreadable) =
            upstream::adopting_over(self.link_in(&mut tx, &spec.session).await?);
        if let Some(e) = unreadable {
            tracing::warn!(store = %self.name, error = %e, "an upstream link row this store cannot read is written over by a new adoption");
        }
        let plan = upstream::plan_upsert(existing.as_ref(), spec, now)?;
        if plan.write {
            self.put_link(&mut tx, &plan.outcome.link).await?;
            self.commit(tx, "adopting").await?;
        }
        Ok(plan.outcome)
    }

    async fn link(&self, session: &SessionRef) -> Result<Option<UpstreamLink>, StoreError> {
        let row = sqlx::query(rows::LINK)
            .bind(session.session_key.as_str())
            .bind(session.agent_id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(self.failed("reading an upstream link"))?;
        row.map(|r| self.rows().link(&r)).transpose()
    }

    async fn links(&self) -> Result<Vec<UpstreamLink>, StoreError> {
        let rows = sqlx::query(rows::LINKS)
            .fetch_all(&self.pool)
            .await
            .map_err(self.failed("listing upstream links"))?;
        Ok(rows
            .iter()
            .filter_map(|r| match self.rows().link(r) {
                Ok(link) => Some(link),
                Err(e) => {
                    tracing::warn!(store = %self.name, error = %e, "an upstream link row this store cannot read is left out");
                    None
                }
            })
            .collect())
    }

    async fn set_marker(
        &self,
        session: &SessionRef,
        expected_updated_at: Timestamp,
        marker: serde_json::Value,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        upstream::validate_json("marker", Some(&marker))?;
        let mut tx = self.write("moving an upstream marker").await?;
        let Some(found) = self.link_in(&mut tx, session).await? else {
            return Ok(false);
        };
        let Some(next) = upstream::plan_set_marker(&found?, expected_updated_at, marker, now)
        else {
            return Ok(false);
        };
        self.put_link(&mut tx, &next).await?;
        self.commit(tx, "moving an upstream marker").await?;
        Ok(true)
    }

    async fn mark_scanned(&self, session: &SessionRef, now: Timestamp) -> Result<bool, StoreError> {
        let mut tx = self.write("stamping a scan").await?;
        let stamped = sqlx::query(
            "UPDATE session_upstream_links SET last_scanned_at = $3
             WHERE session_key = $1 AND agent_id = $2",
        )
        .bind(session.session_key.as_str())
        .bind(session.agent_id.as_str())
        .bind(now.millis())
        .execute(&mut *tx)
        .await
        .map_err(self.failed("stamping a scan"))?
        .rows_affected()
            > 0;
        if stamped {
            self.commit(tx, "stamping a scan").await?;
        }
        Ok(stamped)
    }

    async fn remove_link(
        &self,
        session: &SessionRef,
        expected_updated_at: Option<Timestamp>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.write("removing an upstream link").await?;
        let found = self.link_in(&mut tx, session).await?;
        if !upstream::may_remove_found(found, expected_updated_at)? {
            return Ok(false);
        }
        sqlx::query("DELETE FROM session_upstream_links WHERE session_key = $1 AND agent_id = $2")
            .bind(session.session_key.as_str())
            .bind(session.agent_id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(self.failed("removing an upstream link"))?;
        self.commit(tx, "removing an upstream link").await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_is_retryable_and_a_bad_statement_is_not() {
        let lost = failure(
            "s: recording".into(),
            sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
        );
        assert!(lost.is_retryable(), "{lost:?}");
        assert!(failure("s: recording".into(), sqlx::Error::PoolTimedOut).is_retryable());
        let bad = failure("s: recording".into(), sqlx::Error::RowNotFound);
        assert!(!bad.is_retryable(), "{bad:?}");
        assert!(bad.to_string().contains("s: recording"), "{bad}");
    }

    /// The SQLSTATEs that may go away by themselves, and some that do not. A transaction the
    /// server ended for sitting idle (`25P03`: the store's own idle transaction timeout, met by
    /// a gateway that stalled) wrote nothing and was a `Backend` error (review, stop 55).
    #[test]
    fn the_server_states_that_may_pass_are_transient() {
        for code in [
            "08006", "08001", "57P01", "57P02", "57P03", "53300", "40001", "40P01", "55P03",
            "25P03", "25P04",
        ] {
            assert!(transient_code(code), "{code}");
        }
        for code in [
            "23505", "42501", "42P01", "22P02", "25P02", "57014", "53100",
        ] {
            assert!(!transient_code(code), "{code}");
        }
    }
}
