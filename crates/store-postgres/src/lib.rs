//! # store-postgres
//!
//! [`EventStore`], [`CursorStore`] and [`UpstreamStore`] on PostgreSQL through sqlx: one store
//! that gateways on several hosts share (DESIGN.md sections 6 and 9.1). The four tables are
//! store-sqlite's (OpenClaw's names and columns) in a schema of their own, with PostgreSQL's
//! types, plus a one-row table that holds the sequence counter. It needs PostgreSQL 12 or
//! later (tested on 15; an older server is refused at connect).
//!
//! Every decision of the protocol is `awareness_core`'s ([`awareness_core::protocol`],
//! [`awareness_core::retention`], [`awareness_core::reconcile`], [`awareness_core::upstream`]);
//! this crate reads the rows a decision needs and writes what it
//! decided, each operation in one transaction.
//!
//! **Writes are serialized** per store (per schema) by a transaction-level advisory lock
//! taken first in every write transaction, whatever process or host runs it. PostgreSQL's own
//! sequences hand out numbers in the order transactions ask for them, not in the order they
//! commit: a reader could then see event 8 committed before event 7, move a cursor past 7 and
//! never see it. Under the lock, the counter is read, moved and committed by one transaction at
//! a time, so the log is always a prefix of the sequences handed out, as in the other stores.
//! A dedupe hit consumes its number too (section 3), and the counter never goes back.
//!
//! Reads take no lock. Each read is one statement, which PostgreSQL answers from one snapshot
//! (a page and the head it is checked against never disagree).
//!
//! A handle runs its operations on a runtime of its own, and its writes take one turn in the
//! order they were called (recordings queued together may commit ahead of other writes called
//! while they waited: group commit, below): a write whose caller gives up still ends
//! (committed or rolled back) before the handle's next one starts, and never leaves the lock
//! held by a connection nobody drives; a handle waiting for another gateway's write keeps its
//! other connections for reads (with `max_connections` of 1 there are none: reads then wait
//! behind the write).
//! A recording is four round trips: `BEGIN` with the lock, one statement that reads what the
//! protocol needs, one that writes what it decided, `COMMIT`.
//!
//! **Group commit** ([`PgStoreOptions::group_commit`], default 64): recordings that arrive
//! while the handle's writes wait for their turn queue up, and the next writer records them
//! together in one transaction of the same four round trips, each caller answered after the
//! commit that holds its event, with the notices one transaction per event would give.
//! [`PgStore::write_transactions`] and [`PgStore::largest_batch`] show how well it batches.
//!
//! **Other gateways' commits** ([`EventStore::foreign_commits`], the hint behind DESIGN.md
//! section 9.1's push): every write transaction that changes something adds one to a
//! store-wide commit count before it commits; a handle answers that count less its own
//! commits. A gateway stopped in the middle of a write transaction holds the lock until the
//! server ends the idle transaction ([`PgStoreOptions::idle_transaction_timeout`], 60 s).
//! The same transactions also `NOTIFY` the channel `session_awareness` with the store's schema
//! and the handle's id as payload (every session of a handle carries a random id), which the
//! server delivers once they commit: a handle asked for [`EventStore::commit_hints`] listens
//! on a connection of its own (outside the pool) and gives a hint for each commit of another
//! handle of its store (its own and other schemas' left out), one when it first listens (for
//! the commits made since it was asked), and one after it listens again on a connection it
//! lost (what came meanwhile is lost). So a gateway learns of another's commit when it is made, not at its
//! next question. The cost: PostgreSQL serializes the commits of notifying transactions
//! database-wide (a store's writes are serialized by its lock already; the stores of other
//! schemas in the database, and other notifying applications, now take turns with it at
//! commit).
//!
//! **A lost `COMMIT` is asked about.** When the connection fails while a recording's `COMMIT`
//! (or a batch's) is on its way or its answer is on the way back, the store asks the server,
//! on another connection, whether the transaction committed (`txid_status` of the id the
//! recording read), first ending the session that still runs it if the server has not seen
//! its connection gone and it waits there, idle. Committed, with its events in the log as
//! written (their numbers, refs, times and summaries), each caller gets its event; rolled
//! back, the store records the events again, once, in the same turn. A recording of dedupe
//! hits only is answered with the stored events whatever the server says. Otherwise (the server out of reach for five seconds, or not knowing the
//! transaction, or its events not in the log as written) the caller gets a
//! [`StoreError::Backend`] saying that the outcome is unknown: read it back, or record it
//! again under the same dedupe key (an event without one, recorded again, may be recorded
//! twice; so the error is not retryable). The question starts when the client sees its connection fail: a
//! connection that stays half-open on the client's side waits for TCP to give up first. The
//! other writes are asked about the same way (so that a session left idle in their
//! transaction, holding the store's lock, is ended too, and a commit that went through counts
//! as the handle's own): committed, a success; rolled back, a retryable error; unknown, a
//! [`StoreError::Backend`] saying so.
//! Why these choices: docs/decisions/0030.
//!
//! ```no_run
//! use awareness_core::{ActorType, AwarenessStoreExt, CursorStore, EventKind, EventStore,
//!     NewEvent, SessionRef, Sequence, Timestamp, WatcherKey};
//! use store_postgres::{PgConnectOptions, PgStore, PgStoreOptions};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let server = PgConnectOptions::new().socket("/var/run/postgresql").database("awareness");
//! let store = PgStore::connect(server, PgStoreOptions::new("gateway")).await?;
//! let now = Timestamp::now();
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
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod group;
mod hints;
mod rows;
mod schema;
mod store;
#[cfg(feature = "testkit")]
pub mod testkit;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use awareness_core::reconcile::ChangesPage;
use awareness_core::upstream::{LinkSpec, UpsertOutcome, UpstreamLink, UpstreamStore};
use awareness_core::{
    AckTarget, AgentId, Cursor, CursorFilter, CursorKey, CursorStore, Event, EventStore, Head,
    LogStats, NewEvent, Notice, OpenFailure, PruneStep, Recorded, Sequence, SessionKey, SessionRef,
    StoreError, Timestamp, UnreadableCursor, WatcherKey, async_trait,
};
use sqlx::postgres::PgPool;

pub use sqlx::postgres::PgConnectOptions;

use store::Inner;

/// The last sequence an event can get here: PostgreSQL's `bigint` holds no more.
pub const LAST_SEQUENCE: u64 = i64::MAX as u64;

/// [`PgStoreOptions::idle_transaction_timeout`] unless set.
pub const DEFAULT_IDLE_TRANSACTION_TIMEOUT: Duration = Duration::from_mins(1);

/// [`PgStoreOptions::group_commit`] unless set.
pub const DEFAULT_GROUP_COMMIT: usize = 64;

/// Rows one pruning transaction deletes at most: a recording waits behind pruning for one
/// such transaction, not for the whole chunk.
const PRUNE_TRANSACTION_ROWS: usize = 500;

/// How a [`PgStore`] is set up on its server.
#[derive(Debug, Clone)]
pub struct PgStoreOptions {
    schema: String,
    max_connections: u32,
    idle_transaction_timeout: Duration,
    create_if_missing: bool,
    group_commit: usize,
    listener_keepalive: Duration,
}

impl PgStoreOptions {
    /// The store kept in the schema `schema` (created with its tables at connect when
    /// missing). Every gateway that shares the store names the same schema.
    pub fn new(schema: impl Into<String>) -> Self {
        Self {
            schema: schema.into(),
            max_connections: 4,
            idle_transaction_timeout: DEFAULT_IDLE_TRANSACTION_TIMEOUT,
            create_if_missing: true,
            group_commit: DEFAULT_GROUP_COMMIT,
            listener_keepalive: DEFAULT_LISTENER_KEEPALIVE,
        }
    }

    /// How often the connection that listens for other handles' commits
    /// ([`EventStore::commit_hints`]) is proven alive (default 30 s; `Duration::MAX` never):
    /// the handle notifies itself on a channel of its own through its pool, and a notification
    /// that has not come back by the next one takes the connection for lost, so it listens
    /// again on a new one, with a hint for what it may have missed. A connection the network
    /// dropped without telling the client (a NAT's or a firewall's idle timeout, a host gone)
    /// would otherwise wait for notifications that never come, for as long as the process
    /// runs; a listening connection is idle by nature. So such a loss is noticed within two
    /// periods (and a try to listen again that does not begin within 10 s, its connection
    /// silent too, is given up and made again). Each proof is one `NOTIFY` (which takes its
    /// turn among the database's notifying commits) and one notification, to this handle
    /// alone. The period must be well above a round trip to the server: a proof that is not
    /// back by the next one takes a live connection for lost (with a warning and a hint too
    /// many), as a period of 1 ms does on a local server (review of hints, stop 59).
    #[must_use]
    pub fn listener_keepalive(mut self, every: Duration) -> Self {
        self.listener_keepalive = every;
        self
    }

    /// Connections the store's pool opens at most (default 4). Writes take turns on the
    /// store's lock whatever the number; reads run side by side.
    #[must_use]
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// How long the server lets a transaction of this store sit idle between two statements
    /// before it ends the session and rolls the transaction back (PostgreSQL's
    /// `idle_in_transaction_session_timeout`; default 60 s, at least 1 ms). A write
    /// transaction holds the store's lock, which every gateway's writes wait for: a gateway
    /// whose host froze or lost the network mid-write would otherwise hold it until the
    /// server noticed the dead connection, which TCP may take hours to tell. The store sends
    /// each statement of a transaction as soon as the previous one answered, so only a client
    /// that stopped running idles that long.
    #[must_use]
    pub fn idle_transaction_timeout(mut self, timeout: Duration) -> Self {
        self.idle_transaction_timeout = timeout;
        self
    }

    /// Whether connecting creates the schema and the store's tables when they are missing
    /// (default `true`). Off, a schema that is missing, or lacks a table of the store, is
    /// refused ([`OpenFailure::NotFound`]) and nothing is created: for a tool that only looks,
    /// so that a mistyped name creates no store.
    #[must_use]
    pub fn create_if_missing(mut self, create: bool) -> Self {
        self.create_if_missing = create;
        self
    }

    /// How many recordings of this handle may share one write transaction (group commit,
    /// docs/decisions/0005). Recordings that arrive while the handle's writes wait for their
    /// turn (its previous write in progress, or another gateway holding the store's lock)
    /// queue up, and the next writer records up to this many of them in one transaction of
    /// four round trips, whatever their number; each caller still gets its own event back only
    /// after that commit, and the notices are those one transaction per event would give. A
    /// lone caller records as it would without group commit. `1` turns it off (one
    /// transaction per event); `0` is refused at connect ([`OpenFailure::InvalidOptions`]).
    /// Default [`DEFAULT_GROUP_COMMIT`].
    #[must_use]
    pub fn group_commit(mut self, max_events: usize) -> Self {
        self.group_commit = max_events;
        self
    }

    /// The schema's name.
    pub fn schema(&self) -> &str {
        &self.schema
    }
}

/// [`PgStoreOptions::listener_keepalive`] unless set.
pub const DEFAULT_LISTENER_KEEPALIVE: Duration = Duration::from_secs(30);

/// The schema a URL without `schema=` names.
pub const DEFAULT_SCHEMA: &str = "session_awareness";

/// The parameters of a store URL's query that are the store's, not sqlx's ([`parse_url`]).
const STORE_PARAMETERS: [&str; 4] = [
    "schema",
    "max_connections",
    "group_commit",
    "idle_transaction_timeout_ms",
];

/// The query keys sqlx 0.9 reads from a connection URL (besides `options[<name>]`): it ignores
/// any other key, logging it with its value, so a misspelt `sslmode` would connect without the
/// TLS it asked for, and a misspelt password key would be written to the log.
const SQLX_PARAMETERS: [&str; 17] = [
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
];

/// Whether sqlx reads the query key `key`, read as sqlx reads it (percent-decoded,
/// [`awareness_core::error::query_key`]).
fn sqlx_reads(key: &str) -> bool {
    let decoded = awareness_core::error::query_key(key);
    let Ok(key) = std::str::from_utf8(&decoded) else {
        return false;
    };
    SQLX_PARAMETERS.contains(&key)
        || key == "options"
        || (key.starts_with("options[") && key.ends_with(']'))
}

/// `url` as an error shows it: [`awareness_core::error::redact_url`], then the value of every
/// query key neither sqlx nor the store reads hidden as well (it may be a password under a
/// misspelt key). Redacted first, so that what the redaction takes for a password (a user
/// part holding a `?`, say) is hidden whatever the query looks like after it.
fn shown_url(url: &str) -> String {
    let redacted = awareness_core::error::redact_url(url);
    let Some((base, query)) = redacted.split_once('?') else {
        return redacted;
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if !sqlx_reads(key) && !STORE_PARAMETERS.contains(&key) => {
                format!("{key}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{base}?{}", pairs.join("&"))
}

/// Reads a store URL: a PostgreSQL connection URL (`postgres://` or `postgresql://`, as sqlx
/// takes it: user, password, host or `?host=/socket/dir`, port, database, `sslmode`, ...)
/// whose query may also hold the store's own options: `schema=<name>` ([`DEFAULT_SCHEMA`]
/// when it does not), `max_connections=<n>` ([`PgStoreOptions::max_connections`]),
/// `group_commit=<n>` ([`PgStoreOptions::group_commit`]) and
/// `idle_transaction_timeout_ms=<ms>` ([`PgStoreOptions::idle_transaction_timeout`]), each at
/// most once; the rest of the query is sqlx's, and only keys sqlx reads are taken (`sslmode`,
/// `sslrootcert`, `sslcert`, `sslkey`, `host`, `hostaddr`, `port`, `dbname`, `user`, `password`,
/// `application_name`, `options`, `options[<name>]`, `statement-cache-capacity`, and sqlx's
/// dashed spellings of the `ssl` ones): sqlx would ignore any other, libpq's among them.
///
/// ```
/// let (server, options) = store_postgres::parse_url(
///     "postgres://gw@db.internal/awareness?schema=team_a&sslmode=require&max_connections=8",
/// )?;
/// assert_eq!(options.schema(), "team_a");
/// assert_eq!(server.get_database(), Some("awareness"));
/// # Ok::<(), awareness_core::StoreError>(())
/// ```
///
/// # Errors
///
/// [`StoreError::Open`] ([`OpenFailure::InvalidOptions`]) when sqlx cannot read the URL, or it
/// names one of the store's options twice, gives one a value that is not a whole number in
/// range, names a schema [`PgStore::connect`] refuses, or gives a key that neither sqlx nor the
/// store reads (a misspelt `sslmode`, which sqlx would ignore and connect without TLS; a
/// password under another key, libpq's `sslpassword` or `pwd`, which sqlx would log with its
/// value; libpq's `connect_timeout`); the error quotes the URL as
/// [`awareness_core::error::redact_url`] shows it, with the values of such keys hidden too. (A
/// count of 0 or a timeout out of range
/// is refused by [`PgStore::connect`], as when set in code.)
pub fn parse_url(url: &str) -> Result<(PgConnectOptions, PgStoreOptions), StoreError> {
    let shown = shown_url(url);
    let refuse =
        |reason: String| StoreError::open(shown.clone(), OpenFailure::InvalidOptions, reason, None);
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut given: [Option<&str>; STORE_PARAMETERS.len()] = [None; STORE_PARAMETERS.len()];
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match STORE_PARAMETERS.iter().position(|p| *p == key) {
            Some(i) if given[i].is_none() => given[i] = Some(value),
            Some(_) => return Err(refuse(format!("the URL gives {key}= twice"))),
            // sqlx reads `password` and logs any key it does not read with its value: a secret
            // under another name (libpq's `sslpassword`, a misspelt `Password`) would be
            // logged in the clear, and is refused unshown.
            None if key != "password" && awareness_core::error::is_secret_query_key(key) => {
                return Err(refuse(format!(
                    "the URL gives {key}=, which names a password sqlx does not read (it would \
                     log its value): the server's password goes in password= or the user part"
                )));
            }
            None if !sqlx_reads(key) => {
                // Named only where the URL as shown names it: a `?` in a password not
                // percent-encoded makes a key of the password's end.
                let which = if shown.contains(&format!("{key}=")) {
                    format!("{key}=")
                } else {
                    "a key".to_owned()
                };
                return Err(refuse(format!(
                    "the URL gives {which}, which neither sqlx nor the store reads (sqlx would \
                     ignore it, logging its value): see store_postgres::parse_url for the keys"
                )));
            }
            None => rest.push(pair),
        }
    }
    let [schema, max_connections, group_commit, idle_ms] = given;
    let number = |key: &str, value: &str| -> Result<u64, StoreError> {
        value.parse::<u64>().map_err(|_| {
            refuse(format!(
                "{key}={value:?}: a whole number (0 to {}) is wanted",
                u64::MAX
            ))
        })
    };
    let server = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    let server: PgConnectOptions = server
        .parse()
        .map_err(|e| refuse(format!("not a PostgreSQL connection URL: {e}")))?;
    let mut options = PgStoreOptions::new(schema.unwrap_or(DEFAULT_SCHEMA));
    schema::check_name(options.schema()).map_err(refuse)?;
    if let Some(n) = max_connections {
        let n = number("max_connections", n)?;
        options = options.max_connections(u32::try_from(n).map_err(|_| {
            refuse(format!(
                "max_connections={n}: a pool opens at most {} connections",
                u32::MAX
            ))
        })?);
    }
    if let Some(n) = group_commit {
        let n = number("group_commit", n)?;
        options = options.group_commit(usize::try_from(n).unwrap_or(usize::MAX));
    }
    if let Some(ms) = idle_ms {
        let ms = number("idle_transaction_timeout_ms", ms)?;
        options = options.idle_transaction_timeout(Duration::from_millis(ms));
    }
    Ok((server, options))
}

/// The PostgreSQL store. Share it as `Arc<PgStore>`; every gateway process on every host that
/// connects to the same schema shares its log, heads, cursors and links.
///
/// A handle runs every operation on a runtime of its own (two threads), which its pool's
/// connections belong to: an operation whose caller gives up (a cancelled future, a runtime
/// shut down or never driven again) still ends on the store's runtime, committed or rolled
/// back, so that it never leaves the store's lock held by a connection nobody drives; and the
/// handle outlives the runtimes that called it.
#[derive(Debug)]
pub struct PgStore {
    inner: Arc<Inner>,
    runtime: OwnRuntime,
}

/// The store's runtime, shut down in the background when the handle goes (dropping a runtime
/// blocks, which an async caller may not).
#[derive(Debug)]
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl OwnRuntime {
    fn new() -> Result<Self, std::io::Error> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("store-postgres")
            .enable_all()
            .build()
            .map(|rt| Self(Some(rt)))
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.0
            .as_ref()
            .expect("the runtime is there until the handle is dropped")
            .handle()
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Runs `work` on `runtime` and waits for it there; a caller that gives up leaves it running
/// to its end. A panic in `work` is the caller's.
async fn on<T: Send + 'static>(
    runtime: &tokio::runtime::Handle,
    name: &str,
    work: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Result<T, StoreError> {
    match runtime.spawn(work).await {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(StoreError::backend(
            format!("{name}: the store's runtime ended"),
            e,
        )),
    }
}

impl PgStore {
    /// Connects to the server `server` and opens the store in the schema `options` names,
    /// creating the schema and its tables when missing (under the store's lock, so that
    /// several gateways connecting at once create them once).
    ///
    /// # Errors
    ///
    /// [`StoreError::Open`] naming the schema: [`OpenFailure::InvalidOptions`] for a schema
    /// name that is not 1-63 lowercase ASCII letters, digits and underscores starting with a
    /// letter or underscore, or that is the server's own (`pg_...`, `information_schema`), a
    /// pool of no connection, or an idle transaction timeout out of range; [`OpenFailure::Other`] when the server refuses the connection (a wrong
    /// password, say), or the store's runtime cannot be started; [`OpenFailure::Unsupported`] when
    /// its database does not encode text as UTF-8; [`OpenFailure::NotAStore`] when the schema
    /// holds a table of one of the store's names without the store's columns;
    /// [`OpenFailure::NotFound`] when [`PgStoreOptions::create_if_missing`] is off and the
    /// schema or a table of the store is missing. Nothing is created then. [`StoreError::Busy`]
    /// (retryable) when the server cannot be reached (not started yet, restarting, the network
    /// down), or the open's own transaction meets what a write would call busy (the store's
    /// lock held past the role's `lock_timeout`, its connection lost): a later try may work.
    /// The store's operations answer `Busy` too when their connection is lost, a transaction
    /// loses a race, or the server ends a transaction that sat idle (SQLSTATE `08...`,
    /// `57P01`-`57P03`, `53300`, `40001`, `40P01`, `55P03`, `25P03`, `25P04`), `Backend`
    /// otherwise; a write whose `COMMIT` lost its answer, which the server could not settle,
    /// answers `Backend` (see "A lost `COMMIT` is asked about" above).
    pub async fn connect(
        server: PgConnectOptions,
        options: PgStoreOptions,
    ) -> Result<Self, StoreError> {
        let name = format!("postgres schema {:?}", options.schema);
        let runtime = OwnRuntime::new().map_err(|e| {
            StoreError::open(
                name.clone(),
                OpenFailure::Other,
                "cannot start the store's runtime",
                Some(e.into()),
            )
        })?;
        let inner = on(runtime.handle(), &name, Inner::connect(server, options)).await?;
        Ok(Self {
            inner: Arc::new(inner),
            runtime,
        })
    }

    /// [`PgStore::connect`] with what a URL says ([`parse_url`]).
    ///
    /// # Errors
    ///
    /// Those of [`parse_url`], then those of [`PgStore::connect`].
    pub async fn connect_url(url: &str) -> Result<Self, StoreError> {
        let (server, options) = parse_url(url)?;
        Self::connect(server, options).await
    }

    /// The pool the store runs on (for an operator's own queries; the store's rows are the
    /// store's). Its connections belong to the store's runtime, and work from any other.
    pub fn pool(&self) -> &PgPool {
        self.inner.pool()
    }

    /// Write transactions this handle has begun since it was connected: one per recording
    /// made alone (a recording of a failed group commit recorded again alone included), one
    /// per group commit however many recordings it holds, one per other write call (a pruning
    /// chunk counts each of its transactions), and one more for each recording or batch
    /// recorded again after its `COMMIT` was lost and did not commit. Shows how well group
    /// commit batches.
    pub fn write_transactions(&self) -> u64 {
        self.inner.write_transactions.load(Ordering::Relaxed)
    }

    /// The most recordings one write transaction of this handle has been given since it was
    /// connected (0 before the first recording; a batch that failed and was recorded again one
    /// by one counts too): at most [`PgStoreOptions::group_commit`].
    pub fn largest_batch(&self) -> usize {
        self.inner.largest_batch.load(Ordering::Relaxed)
    }

    /// `work`, a write of one transaction, on the store's runtime, in this handle's turn: the
    /// turn is taken here, before the work is handed over, so that writes take effect in the
    /// order they were called, a given-up one included (it ends on the store's runtime before
    /// the next one starts).
    async fn run_write<T, F>(&self, work: impl FnOnce(Arc<Inner>) -> F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let turn = Arc::clone(&self.inner.turn).lock_owned().await;
        let work = work(Arc::clone(&self.inner));
        on(
            self.runtime.handle(),
            &self.inner.name,
            store::TURN_HELD.scope((), async move {
                let done = work.await;
                drop(turn);
                done
            }),
        )
        .await
    }

    /// `work` on the store, on its runtime.
    async fn run<T, F>(&self, work: impl FnOnce(Arc<Inner>) -> F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        on(
            self.runtime.handle(),
            &self.inner.name,
            work(Arc::clone(&self.inner)),
        )
        .await
    }
}

/// Test support for commit hints, not part of the API (hidden from the docs).
impl PgStore {
    /// Waits until the handle's listener (started by [`EventStore::commit_hints`]) listens,
    /// and answers its session's backend process id.
    #[doc(hidden)]
    pub async fn hints_listening(&self) -> u32 {
        let mut session = self.inner.listener.session.subscribe();
        let pid = *session
            .wait_for(Option::is_some)
            .await
            .expect("the listener's state lives as long as the handle");
        pid.expect("waited for")
    }

    /// Notifications of the handle's own commits its listener left out.
    #[doc(hidden)]
    pub fn own_commits_left_out(&self) -> u64 {
        self.inner.listener.own_left_out.load(Ordering::Relaxed)
    }

    /// The hints the handle's listener has given.
    #[doc(hidden)]
    pub fn hints_given(&self) -> u64 {
        self.inner.listener.given()
    }
}

/// Test support, not part of the API (hidden from the docs; they may change or go at any
/// time): hand edits of one row, as `awareness_core::testkit::RawAccess` names them, each
/// under the store's lock and counted in no commit count. Each answers whether it changed a
/// row; the `spoil_*` ones answer `false`, always: a database that encodes text as UTF-8 (the
/// only kind [`PgStore::connect`] takes) holds no text that is not UTF-8.
macro_rules! hand_edits {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {
        impl PgStore {
            $(
                #[doc(hidden)]
                pub async fn $name(&self, $($arg: $ty),*) -> Result<bool, StoreError> {
                    $(let $arg = $arg.clone();)*
                    self.run_write(move |s| async move { s.$name($(&$arg),*).await }).await
                }
            )*
        }
    };
}

hand_edits! {
    delete_head_row(session: &SessionRef);
    damage_cursor_row(watcher: &WatcherKey, target: &SessionKey);
    damage_link_row(session: &SessionRef);
    damage_head_row(session: &SessionRef);
    make_ambient(watcher: &WatcherKey, target: &SessionKey);
    spoil_cursor_provenance(watcher: &WatcherKey, target: &SessionKey);
    spoil_link_text(session: &SessionRef);
    spoil_link_key(session: &SessionRef);
    spoil_cursor_text(watcher: &WatcherKey, target: &SessionKey);
    spoil_cursor_watcher(watcher: &WatcherKey, target: &SessionKey);
    spoil_head_text(session: &SessionRef);
}

impl PgStore {
    /// Test support, not part of the API: deletes one event row and nothing else.
    #[doc(hidden)]
    pub async fn delete_event_row(&self, sequence: Sequence) -> Result<bool, StoreError> {
        self.run_write(move |s| async move { s.delete_event_row(sequence).await })
            .await
    }

    /// Test support, not part of the API: makes one event row unreadable.
    #[doc(hidden)]
    pub async fn damage_event_row(&self, sequence: Sequence) -> Result<bool, StoreError> {
        self.run_write(move |s| async move { s.damage_event_row(sequence).await })
            .await
    }

    /// Test support, not part of the API: `false`, always (see [`PgStore::spoil_link_text`]).
    #[doc(hidden)]
    pub async fn spoil_event_text(&self, sequence: Sequence) -> Result<bool, StoreError> {
        self.run(move |s| async move { s.spoil_event_text(sequence).await })
            .await
    }

    /// Test support, not part of the API: moves the counter so that exactly `left` more
    /// sequences can be handed out; whether it could (the counter never goes back).
    #[doc(hidden)]
    pub async fn leave_sequences(&self, left: u64) -> Result<bool, StoreError> {
        self.run_write(move |s| async move { s.leave_sequences(left).await })
            .await
    }
}

#[async_trait]
impl EventStore for PgStore {
    /// A hint each time another handle (of this process or another, on any host) commits a
    /// write to this store, through `LISTEN`/`NOTIFY` (see the crate's docs); the first call
    /// starts the handle's listener, which gives one hint once it listens, covering the
    /// commits made before.
    fn commit_hints(&self) -> Option<Box<dyn awareness_core::CommitHints>> {
        let inner = &self.inner;
        Some(inner.listener.subscribe(
            self.runtime.handle(),
            inner.pool(),
            &inner.schema,
            &inner.handle_id,
        ))
    }

    /// With group commit on ([`PgStoreOptions::group_commit`] above 1), queues the event, then
    /// either a writer records it with its batch (the answer comes first), or this caller gets
    /// the handle's turn and records what the queue holds: alone, as without group commit, or
    /// as a batch on a task of the store's runtime, so that cancelling this call cancels
    /// nobody's commit.
    async fn record(&self, event: NewEvent, now: Timestamp) -> Result<Recorded, StoreError> {
        let inner = &self.inner;
        if inner.group_commit <= 1 {
            inner.largest_batch.fetch_max(1, Ordering::Relaxed);
            return self
                .run_write(move |s| async move { s.record(event, now).await })
                .await;
        }
        // Bad input is refused here, before anything is queued.
        event.validate()?;
        let id = inner.next_job.fetch_add(1, Ordering::Relaxed);
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        inner.queue.push(group::Job {
            id,
            event,
            now,
            reply,
        });
        // Should this call be given up while its event still waits in the queue, the event
        // leaves the queue with it instead of being committed later by someone else's batch.
        let mut queued = awareness_core::queue::Queued::new(&inner.queue, id);
        loop {
            let turn = tokio::select! {
                biased;
                got = &mut answer => {
                    queued.taken();
                    return group::answered(&inner.name, got);
                }
                turn = Arc::clone(&inner.turn).lock_owned() => turn,
            };
            // No await from the take until the batch is handed to the store's runtime:
            // cancelling this call cannot drop the other callers' events.
            let mut jobs = inner.queue.take(inner.group_commit);
            let mine = jobs.iter().any(|j| j.id == id);
            if mine || jobs.is_empty() {
                queued.taken();
            }
            if jobs.is_empty() {
                // The batch that took this event has answered before it let go of the turn.
                drop(turn);
                return group::answered(&inner.name, answer.await);
            }
            inner.largest_batch.fetch_max(jobs.len(), Ordering::Relaxed);
            let store = Arc::clone(inner);
            if mine && jobs.len() == 1 {
                // Alone: recorded as without group commit.
                let job = jobs.pop().expect("one job was taken");
                return on(
                    self.runtime.handle(),
                    &inner.name,
                    store::TURN_HELD.scope((), async move {
                        let done = store.record(job.event, job.now).await;
                        drop(turn);
                        done
                    }),
                )
                .await;
            }
            let name = inner.name.clone();
            let batch = self
                .runtime
                .handle()
                .spawn(store::TURN_HELD.scope((), async move {
                    store.record_batch(jobs).await;
                    drop(turn);
                }));
            // A batch that panics answers nobody: its callers are told it stopped (`answered`),
            // and the panic is logged here.
            self.runtime.handle().spawn(async move {
                if let Err(e) = batch.await
                    && e.is_panic()
                {
                    let panic = e.into_panic();
                    tracing::error!(store = %name, panic = awareness_core::error::panic_message(&*panic), "a group commit panicked; its recordings fail");
                }
            });
            if mine {
                return group::answered(&inner.name, answer.await);
            }
            // The queue held `group_commit` older events than this one: wait for the turn
            // again (or for a writer that takes this event with its batch).
        }
    }

    async fn changes_since(
        &self,
        session: &SessionRef,
        after: Sequence,
        limit: usize,
    ) -> Result<ChangesPage, StoreError> {
        let session = session.clone();
        self.run(move |s| async move { s.changes_since(&session, after, limit).await })
            .await
    }

    async fn heads(&self, sessions: &[SessionRef]) -> Result<Vec<Head>, StoreError> {
        let sessions = sessions.to_vec();
        self.run(move |s| async move { s.heads(&sessions).await })
            .await
    }

    async fn list_heads(&self, agent: Option<&AgentId>) -> Result<Vec<Head>, StoreError> {
        let agent = agent.cloned();
        self.run(move |s| async move { s.list_heads(agent.as_ref()).await })
            .await
    }

    async fn events_after(
        &self,
        after: Sequence,
        limit: usize,
    ) -> Result<Vec<Arc<Event>>, StoreError> {
        self.run(move |s| async move { s.events_after(after, limit).await })
            .await
    }

    async fn log_stats(&self) -> Result<LogStats, StoreError> {
        self.run(|s| async move { s.log_stats().await }).await
    }

    async fn prune_chunk(
        &self,
        step: &PruneStep,
        max_rows: usize,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        let step = *step;
        self.run(move |s| async move { s.prune_chunk(&step, max_rows, now).await })
            .await
    }

    async fn delete_session(&self, session: &SessionRef) -> Result<(), StoreError> {
        let session = session.clone();
        self.run_write(move |s| async move { s.delete_session(&session).await })
            .await
    }

    /// Closes the pool's connections once the last handle is closed (each ends its session on
    /// the server, which then holds nothing of this handle's), then the store's runtime; with
    /// other handles left, only drops this one.
    async fn close(self: Arc<Self>) {
        if let Ok(store) = Arc::try_unwrap(self) {
            let pool = store.inner.pool().clone();
            let closed = on(store.runtime.handle(), &store.inner.name, async move {
                pool.close().await;
                Ok(())
            })
            .await;
            if let Err(e) = closed {
                tracing::warn!(error = %e, "closing a postgres store");
            }
        }
    }

    /// The store-wide count of write transactions (a one-row table every write transaction
    /// of every handle, on every host, adds itself to before it commits) less this handle's
    /// own: it changes only when another handle or process commits a write. One read, in the
    /// handle's turn, so never between one of the handle's own commits and the handle's
    /// counting of it (which would read that commit as another's, then hide another's real one
    /// behind it).
    async fn foreign_commits(&self) -> Result<Option<u64>, StoreError> {
        self.run_write(|s| async move { s.foreign_commits().await })
            .await
    }
}

#[async_trait]
impl CursorStore for PgStore {
    async fn watch(
        &self,
        watcher: &WatcherKey,
        target: &SessionRef,
        now: Timestamp,
    ) -> Result<Cursor, StoreError> {
        let (watcher, target) = (watcher.clone(), target.clone());
        self.run_write(move |s| async move { s.watch(&watcher, &target, now).await })
            .await
    }

    async fn unwatch(&self, watcher: &WatcherKey, target: &SessionKey) -> Result<bool, StoreError> {
        let (watcher, target) = (watcher.clone(), target.clone());
        self.run_write(move |s| async move { s.unwatch(&watcher, &target).await })
            .await
    }

    async fn acknowledge(
        &self,
        watcher: &WatcherKey,
        targets: &[AckTarget],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        // Nothing to acknowledge: answered at once, without waiting for the handle's turn or
        // another gateway's lock.
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        let (watcher, targets) = (watcher.clone(), targets.to_vec());
        self.run_write(move |s| async move { s.acknowledge(&watcher, &targets, now).await })
            .await
    }

    async fn cursor(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<Option<Cursor>, StoreError> {
        let (watcher, target) = (watcher.clone(), target.clone());
        self.run(move |s| async move { s.cursor(&watcher, &target).await })
            .await
    }

    async fn cursors(&self, filter: &CursorFilter) -> Result<Vec<Cursor>, StoreError> {
        let filter = filter.clone();
        self.run(move |s| async move { s.cursors(&filter).await })
            .await
    }

    async fn refreeze(
        &self,
        keys: &[CursorKey],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        let keys = keys.to_vec();
        self.run_write(move |s| async move { s.refreeze(&keys, now).await })
            .await
    }

    async fn reset_watcher(&self, watcher: &SessionKey) -> Result<u64, StoreError> {
        let watcher = watcher.clone();
        self.run_write(move |s| async move { s.reset_watcher(&watcher).await })
            .await
    }

    async fn unreadable_cursors(&self) -> Result<Vec<UnreadableCursor>, StoreError> {
        self.run(|s| async move { s.unreadable_cursors().await })
            .await
    }
}

#[async_trait]
impl UpstreamStore for PgStore {
    async fn upsert_link(
        &self,
        spec: LinkSpec,
        now: Timestamp,
    ) -> Result<UpsertOutcome, StoreError> {
        self.run_write(move |s| async move { s.upsert_link(spec, now).await })
            .await
    }

    async fn link(&self, session: &SessionRef) -> Result<Option<UpstreamLink>, StoreError> {
        let session = session.clone();
        self.run(move |s| async move { s.link(&session).await })
            .await
    }

    async fn links(&self) -> Result<Vec<UpstreamLink>, StoreError> {
        self.run(|s| async move { s.links().await }).await
    }

    async fn set_marker(
        &self,
        session: &SessionRef,
        expected_updated_at: Timestamp,
        marker: serde_json::Value,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let session = session.clone();
        self.run_write(move |s| async move {
            s.set_marker(&session, expected_updated_at, marker, now)
                .await
        })
        .await
    }

    async fn mark_scanned(&self, session: &SessionRef, now: Timestamp) -> Result<bool, StoreError> {
        let session = session.clone();
        self.run_write(move |s| async move { s.mark_scanned(&session, now).await })
            .await
    }

    async fn remove_link(
        &self,
        session: &SessionRef,
        expected_updated_at: Option<Timestamp>,
    ) -> Result<bool, StoreError> {
        let session = session.clone();
        self.run_write(move |s| async move { s.remove_link(&session, expected_updated_at).await })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A URL names its schema, or the store takes the default; its other parameters reach
    /// sqlx, a value holding a `?` or a `=` whole: the query begins at the URL's first `?`, and
    /// a pair's key ends at its first `=` (sqlx's `options` take `-c name=value`). (What the
    /// mutations did: the query began at the last `?`, PH33, or a key ran to the pair's last
    /// `=`, PH28, and the URL was refused as giving a key nobody reads; review of stop 71.)
    #[test]
    fn a_url_names_its_schema_or_gets_the_default() {
        let (server, options) =
            parse_url("postgres:///awareness?host=/var/run/postgresql&schema=gw_1&port=5433")
                .expect("a URL with a schema");
        assert_eq!(options.schema(), "gw_1");
        assert_eq!(server.get_port(), 5433, "the other parameters reach sqlx");
        assert_eq!(server.get_database(), Some("awareness"));
        let (_, options) = parse_url("postgresql://u@h/db").expect("a URL without a schema");
        assert_eq!(options.schema(), DEFAULT_SCHEMA);
        let (server, options) = parse_url("postgres://u@h/db?application_name=gw?1&schema=a")
            .expect("a URL whose application name holds a '?'");
        assert_eq!(
            (options.schema(), server.get_application_name()),
            ("a", Some("gw?1"))
        );
        let (server, options) =
            parse_url("postgres://u@h/db?options=-c%20statement_timeout=5s&schema=a")
                .expect("a URL whose options value holds a '='");
        assert_eq!(options.schema(), "a");
        let options = server.get_options().expect("options");
        assert!(options.contains("statement_timeout=5s"), "{options}");
    }

    #[test]
    fn a_url_sets_the_store_options_it_names_and_leaves_the_others_at_their_defaults() {
        let (server, options) = parse_url(
            "postgres://u@h/db?max_connections=9&sslmode=disable&group_commit=1\
             &idle_transaction_timeout_ms=2500&application_name=gw",
        )
        .expect("a URL with store options");
        assert_eq!(
            (
                options.schema(),
                options.max_connections,
                options.group_commit,
                options.idle_transaction_timeout
            ),
            (DEFAULT_SCHEMA, 9, 1, Duration::from_millis(2500))
        );
        assert_eq!(
            server.get_application_name(),
            Some("gw"),
            "sqlx's parameters reach sqlx"
        );
        let (_, defaults) = parse_url("postgres://u@h/db?schema=a").expect("a URL");
        assert_eq!(
            (
                defaults.max_connections,
                defaults.group_commit,
                defaults.idle_transaction_timeout
            ),
            (4, DEFAULT_GROUP_COMMIT, DEFAULT_IDLE_TRANSACTION_TIMEOUT)
        );
    }

    /// A query key that is not UTF-8 once percent-decoded is no key sqlx reads (sqlx would
    /// ignore it, logging its value): the URL is refused, the value hidden. (What the mutation
    /// did: took such a key as one sqlx reads, and the URL was taken; review of stop 67, P526.)
    #[test]
    fn a_query_key_that_is_not_utf8_is_refused_unshown() {
        let e = parse_url("postgres://u@h/db?x%FF=secret").expect_err("refused");
        assert_eq!(e.open_failure(), Some(OpenFailure::InvalidOptions));
        let shown = e.to_string();
        assert!(
            shown.contains("neither sqlx nor the store reads"),
            "{shown}"
        );
        assert!(!shown.contains("secret"), "{shown}");
    }

    /// Every key sqlx reads reaches it (only the others are refused).
    #[test]
    fn every_key_sqlx_reads_is_taken() {
        let url = "postgres://u@h/db?sslmode=disable&ssl-mode=disable&sslrootcert=/ca.pem\
                   &ssl-root-cert=/ca.pem&ssl-ca=/ca.pem&sslcert=/c.pem&ssl-cert=/c.pem\
                   &sslkey=/k.pem&ssl-key=/k.pem&statement-cache-capacity=10&host=db2\
                   &hostaddr=127.0.0.1&port=5433&dbname=other&user=gw&password=p\
                   &application_name=gw&options=-c%20search_path%3Dx&options[timezone]=UTC\
                   &options%5Bdatestyle%5D=ISO&ssl%6Dode=disable";
        let (server, _) = parse_url(url).expect("keys sqlx reads");
        assert_eq!(
            (
                server.get_host(),
                server.get_port(),
                server.get_database(),
                server.get_username(),
                server.get_application_name()
            ),
            ("db2", 5433, Some("other"), "gw", Some("gw"))
        );
        let options = server.get_options().expect("options");
        assert!(
            options.contains("search_path")
                && options.contains("timezone")
                && options.contains("datestyle"),
            "{options}"
        );
    }

    /// A store's listening connection is proven alive every 30 s unless told otherwise: a
    /// connection the network dropped silently is noticed. (What the mutation did: the default
    /// was never, and such a loss went unnoticed for as long as the process ran; review of stop
    /// 71, PH01.)
    #[test]
    fn the_listening_connection_is_proven_alive_by_default() {
        assert_eq!(
            PgStoreOptions::new("a").listener_keepalive,
            DEFAULT_LISTENER_KEEPALIVE
        );
        assert_eq!(DEFAULT_LISTENER_KEEPALIVE, Duration::from_secs(30));
    }

    #[test]
    fn a_bad_url_is_refused_without_showing_its_password() {
        for (url, why, shown_as) in [
            (
                "postgres://u:secret@h/db?schema=a&schema=b",
                "twice",
                "postgres://u:***@h/db?schema=a&schema=b",
            ),
            (
                "postgres://u:secret@h:notaport/db",
                "not a PostgreSQL connection URL",
                "postgres://u:***@h:notaport/db",
            ),
            (
                "postgres://u:sec/ret@h:notaport/db",
                "not a PostgreSQL connection URL",
                "postgres://u:***@h:notaport/db",
            ),
            (
                "postgres://h:notaport/db?password=secret",
                "not a PostgreSQL connection URL",
                "postgres://h:notaport/db?password=***",
            ),
            (
                "postgres://u:sec?ret@h:notaport/db",
                "the URL gives a key, which neither sqlx nor the store reads",
                "postgres://u:***@h:notaport/db",
            ),
            (
                "postgres://u:secret@h/db?schema=Not-A-Name",
                "schema name",
                "postgres://u:***@h/db?schema=Not-A-Name",
            ),
            (
                "postgres://u:secret@h/db?group_commit=8&group_commit=9",
                "gives group_commit= twice",
                "postgres://u:***@h/db?group_commit=8&group_commit=9",
            ),
            (
                "postgres://u:secret@h/db?max_connections=four",
                "max_connections=\"four\": a whole number",
                "postgres://u:***@h/db?max_connections=four",
            ),
            (
                "postgres://u:secret@h/db?max_connections=4294967296",
                "a pool opens at most 4294967295 connections",
                "postgres://u:***@h/db?max_connections=4294967296",
            ),
            (
                "postgres://u:secret@h/db?idle_transaction_timeout_ms=-1",
                "idle_transaction_timeout_ms=\"-1\": a whole number",
                "postgres://u:***@h/db?idle_transaction_timeout_ms=-1",
            ),
            (
                "postgres://u:secret@h/db?group_commit",
                "group_commit=\"\": a whole number",
                "postgres://u:***@h/db?group_commit",
            ),
            // Review, stop 53: sqlx logged these with their values, as keys it does not read.
            (
                "postgres://u@h/db?sslpassword=secret&sslmode=require",
                "the URL gives sslpassword=, which names a password",
                "postgres://u@h/db?sslpassword=***&sslmode=require",
            ),
            (
                "postgres://u@h/db?Password=secret",
                "the URL gives Password=, which names a password",
                "postgres://u@h/db?Password=***",
            ),
            // Review, stop 55: sqlx logged a password under a key not naming one, and ignored
            // a misspelt sslmode, connecting without TLS.
            (
                "postgres://u:secret@h/db?pwd=secret&sslmode=require",
                "the URL gives pwd=, which neither sqlx nor the store reads",
                "postgres://u:***@h/db?pwd=***&sslmode=require",
            ),
            (
                "postgres://u@h/db?sslmdoe=require&schema=a",
                "the URL gives sslmdoe=, which neither sqlx",
                "postgres://u@h/db?sslmdoe=***&schema=a",
            ),
            (
                "postgres://u@h/db?connect_timeout=10",
                "the URL gives connect_timeout=",
                "postgres://u@h/db?connect_timeout=***",
            ),
            (
                "postgres://u@h/db?ssl%6dod=require",
                "the URL gives ssl%6dod=",
                "postgres://u@h/db?ssl%6dod=***",
            ),
            // Review of stop 60: an `options[` key without its `]` passed, and sqlx dropped
            // the setting unsaid.
            (
                "postgres://u@h/db?options[statement_timeout=5s",
                "the URL gives options[statement_timeout=, which neither sqlx",
                "postgres://u@h/db?options[statement_timeout=***",
            ),
            // Review of stop 71, PH32: a value holding a `?` under a key nobody reads was
            // shown up to that `?` when the query was taken from the URL's last `?`.
            (
                "postgres://u@h/db?pwd=secret?x&sslmode=require",
                "the URL gives pwd=, which neither sqlx nor the store reads",
                "postgres://u@h/db?pwd=***&sslmode=require",
            ),
            // Second reading, stop 56: a `?` then a `=` inside a password not percent-encoded
            // made the query hide the `@` the redaction looks for.
            (
                "postgres://gw:hunter2?x=topsecret@db.internal/awareness",
                "the URL gives a key, which neither sqlx nor the store reads",
                "postgres://gw:***@db.internal/awareness",
            ),
        ] {
            let e = parse_url(url).expect_err(url);
            let shown = e.to_string();
            assert!(shown.contains(why), "{shown}");
            assert!(
                !shown.contains("secret") && !shown.contains("ret@") && !shown.contains("hunter"),
                "{shown}"
            );
            assert!(shown.contains(&format!("{shown_as:?}")), "{shown}");
            assert_eq!(e.open_failure(), Some(OpenFailure::InvalidOptions));
        }
    }
}
