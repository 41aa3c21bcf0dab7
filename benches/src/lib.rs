//! Shared set-up for the criterion benches and the scale example: every backend opened side by
//! side, and the data sets (the standard one: 50,000 events over 1,000 sessions; the sweep's:
//! 100,000 cursors) loaded through the public API.
//!
//! Loading is fast: a data set is recorded once per run and per file format, with
//! [`LOAD_IN_FLIGHT`] recordings in flight (so a store's group commit batches them), redb's copy
//! with the default `Immediate` durability (its pages are then laid out as that mode lays them
//! out); every backend then opens its own copy of that file with its own options. Under
//! `cargo bench -- --test` ([`test_mode`]) the data sets are small, so CI executes every bench
//! quickly.
//!
//! The `postgres` backend works on the PostgreSQL server `AWARENESS_PG_URL` names ([`pg_server`];
//! `.ci/postgres` starts one), each store in a schema of its own ([`PgSchema`]: a fresh name,
//! dropped with the store). Its data sets are recorded once per run into a template schema and
//! copied table by table into each store's schema.
//!
//! ```
//! // Every backend, or those AWARENESS_BENCH_BACKENDS names (postgres needs AWARENESS_PG_URL).
//! let rt = awareness_benches::runtime();
//! let backends = rt.block_on(awareness_benches::open_backends());
//! assert!(!backends.is_empty());
//! ```

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use awareness_core::{
    ActorType, AwarenessStore, EventKind, NewEvent, Sequence, SessionRef, Timestamp, WatcherKey,
};
use sqlx::AssertSqlSafe;
use store_postgres::{PgConnectOptions, PgStore, PgStoreOptions};
use store_redb::{RedbOptions, RedbStore};
use store_sqlite::{SqliteOptions, SqliteStore};

/// The fixed start of the benches' clock.
pub const T0: Timestamp = Timestamp(1_800_000_000_000);
/// Events in the standard data set.
pub const DATASET_EVENTS: usize = 50_000;
/// Sessions in the standard data set.
pub const DATASET_SESSIONS: usize = 1_000;
/// Recordings (or watches) in flight while a data set loads.
pub const LOAD_IN_FLIGHT: usize = 32;

/// Cargo's target directory: `CARGO_TARGET_DIR`, or the workspace's `target`. Results that
/// criterion does not keep are saved under it for `bench-report`.
pub fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("workspace root")
                .join("target")
        },
        std::path::PathBuf::from,
    )
}

/// Saves one result as `<target>/<dir>/<name>.json` (pretty JSON), where `bench-report` reads
/// it: `awareness-scale` for the scale runs, `awareness-prune` for the recording p99 beside a
/// pruning pass.
pub fn save_result(dir: &str, name: &str, value: &serde_json::Value) -> std::path::PathBuf {
    let out = target_dir().join(dir);
    std::fs::create_dir_all(&out).expect("create the results dir");
    let path = out.join(format!("{name}.json"));
    std::fs::write(&path, format!("{value:#}\n")).expect("save the results");
    path
}

/// Whether criterion runs each bench once instead of measuring it: under
/// `cargo bench -- --test` (as CI runs them), and, as criterion decides, whenever `--bench` is
/// not given (`cargo test --benches`, `--all-targets`, a debug build); or when it only lists
/// them (`--list`). The data sets are then small, and no result is saved for `bench-report`
/// (a debug build's figures in the results table would mislead).
pub fn test_mode() -> bool {
    let has = |flag: &str| std::env::args().any(|a| a == flag);
    has("--test") || has("--list") || !has("--bench")
}

/// A data set a group's backends start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dataset {
    /// `events` human messages spread round-robin over `sessions` sessions
    /// ([`dataset_session`]).
    Events {
        /// Events recorded.
        events: usize,
        /// Sessions they are spread over.
        sessions: usize,
    },
    /// `watchers` watchers ([`watcher`]) each watching `targets` sessions ([`dataset_session`]),
    /// and one human message on each of the first `pending_targets` targets, which leaves
    /// `watchers * pending_targets` cursors pending.
    Cursors {
        /// Watchers.
        watchers: usize,
        /// Targets each watcher watches.
        targets: usize,
        /// Targets with a pending notice for every watcher.
        pending_targets: usize,
    },
}

impl Dataset {
    /// The standard data set: 50,000 events over 1,000 sessions (2,000 events under `--test`).
    pub fn standard() -> Self {
        Self::Events {
            events: if test_mode() { 2_000 } else { DATASET_EVENTS },
            sessions: DATASET_SESSIONS,
        }
    }

    /// The sweep's data set: 100,000 cursors, 10,000 of them pending (1,000 cursors, 100
    /// pending, under `--test`).
    pub fn cursors() -> Self {
        if test_mode() {
            Self::Cursors {
                watchers: 10,
                targets: 100,
                pending_targets: 10,
            }
        } else {
            Self::Cursors {
                watchers: 100,
                targets: 1_000,
                pending_targets: 100,
            }
        }
    }

    /// Events recorded by the data set.
    pub fn events(self) -> usize {
        match self {
            Self::Events { events, .. } => events,
            Self::Cursors {
                pending_targets, ..
            } => pending_targets,
        }
    }

    /// Sessions the data set's events go to.
    pub fn sessions(self) -> usize {
        match self {
            Self::Events { sessions, .. } => sessions,
            Self::Cursors { targets, .. } => targets,
        }
    }

    /// Loads the data set into `store`, [`LOAD_IN_FLIGHT`] calls at a time.
    pub async fn load(self, store: &Arc<dyn AwarenessStore>) {
        match self {
            Self::Events { events, sessions } => load_dataset(store, events, sessions).await,
            Self::Cursors {
                watchers,
                targets,
                pending_targets,
            } => {
                let s = Arc::clone(store);
                concurrently(watchers * targets, LOAD_IN_FLIGHT, move |i| {
                    let s = Arc::clone(&s);
                    async move {
                        s.watch(&watcher(i / targets), &dataset_session(i % targets), T0)
                            .await
                            .expect("watch");
                    }
                })
                .await;
                load_dataset(store, pending_targets, pending_targets).await;
            }
        }
    }
}

/// How a backend stores its data.
#[derive(Debug, Clone)]
pub enum Kind {
    /// store-memory.
    Memory,
    /// store-sqlite with these options.
    Sqlite(SqliteOptions),
    /// store-redb with these options.
    Redb(RedbOptions),
    /// store-postgres with its default options but `group_commit` (its default,
    /// [`store_postgres::DEFAULT_GROUP_COMMIT`], or `1`: one transaction per event), in a fresh
    /// schema ([`PgSchema`]) on the server of [`pg_server`].
    Postgres {
        /// [`PgStoreOptions::group_commit`].
        group_commit: usize,
    },
}

impl Kind {
    /// The file format, which names the template a data set is loaded into once.
    fn format(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite(_) => "sqlite",
            Self::Redb(_) => "redb",
            Self::Postgres { .. } => "postgres",
        }
    }
}

/// A backend to open: its report name and how it stores.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The name shown in the report (`memory`, `sqlite`, ...).
    pub name: &'static str,
    /// The store and its options.
    pub kind: Kind,
}

/// One backend under measurement.
pub struct Backend {
    /// The name shown in the report (`memory`, `sqlite`, ...).
    pub name: &'static str,
    /// The store.
    pub store: Arc<dyn AwarenessStore>,
    /// Its file format (`memory`, `sqlite`, `redb`, `postgres`), and the same store when it is
    /// a redb one, for [`Backend::settle`], or a postgres one, for [`Backend::stored_bytes`].
    format: &'static str,
    redb: Option<Arc<RedbStore>>,
    postgres: Option<Arc<PgStore>>,
    /// Keeps temporary files alive (a [`tempfile::TempDir`]), or the postgres store's schema (a
    /// [`PgSchema`], dropped with it). Declared last, so it goes after the store.
    pub guard: Box<dyn Any + Send + Sync>,
}

impl Backend {
    /// Waits for the background work the store's last writes left, so that it does not run into
    /// a measurement that follows: redb's commits not yet durable (`redb-bounded`'s, which its
    /// background flush would otherwise make durable at any time) are flushed now; for redb
    /// with `Immediate` durability, and for memory, there is none.
    ///
    /// store-sqlite's background WAL checkpoint (started every 256 write transactions) is not
    /// waited for: store-sqlite has no public way to force one or to wait for the one running
    /// (only `SqliteStore::close` awaits it), so a checkpoint started by the last writes may
    /// still run while the measurement does.
    ///
    /// PostgreSQL's own background work (autovacuum, checkpoints, the WAL writer) is the
    /// server's: nothing here waits for it.
    ///
    /// Returns what it did, for a `--test` run to show.
    pub async fn settle(&self) -> &'static str {
        if let Some(redb) = &self.redb {
            redb.flush().await.expect("flush the redb store");
            "redb flushed"
        } else if self.format == "sqlite" {
            "sqlite's background checkpoint not waited for (no public way)"
        } else if self.format == "postgres" {
            "the server's autovacuum and checkpoints not waited for (the server's own)"
        } else {
            "nothing to wait for"
        }
    }

    /// Bytes the store keeps: every file of its directory for sqlite (the database, its WAL and
    /// its `-shm` index) and redb (its one file); for postgres the tables of its schema with
    /// their indexes and TOAST (`pg_total_relation_size`; not the server's WAL, which every
    /// schema shares); `None` for memory.
    pub async fn stored_bytes(&self) -> Option<u64> {
        if let Some(pg) = &self.postgres {
            let bytes: i64 = sqlx::query_scalar(
                "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0)::bigint
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = current_schema() AND c.relkind = 'r'",
            )
            .fetch_one(pg.pool())
            .await
            .expect("the postgres store's size");
            return u64::try_from(bytes).ok();
        }
        let dir = self
            .guard
            .downcast_ref::<tempfile::TempDir>()
            .filter(|_| self.format != "memory")?;
        Some(
            std::fs::read_dir(dir.path())
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(std::fs::Metadata::is_file)
                .map(|m| m.len())
                .sum(),
        )
    }
}

/// The PostgreSQL server of the `postgres` backend: the connection URL in `AWARENESS_PG_URL`
/// (as [`store_postgres::parse_url`] reads it; a `schema=` in it is ignored, every store getting
/// a fresh one). Panics, naming the variable, when it is not set: `.ci/postgres` starts a
/// server and prints its URL.
pub fn pg_server() -> PgConnectOptions {
    let Ok(url) = std::env::var("AWARENESS_PG_URL") else {
        panic!(
            "the postgres backend needs a PostgreSQL server: set AWARENESS_PG_URL to its URL \
             (for example postgres:///awareness_test?host=/var/run/postgresql; \
             `export AWARENESS_PG_URL=\"$(bash .ci/postgres)\"` installs and starts one), or \
             leave postgres out of AWARENESS_BENCH_BACKENDS (memory,sqlite,redb,redb-bounded)"
        )
    };
    // parse_url's error quotes the URL without its password.
    store_postgres::parse_url(&url)
        .unwrap_or_else(|e| panic!("AWARENESS_PG_URL: {e}"))
        .0
}

/// A schema of its own on the server for one postgres store (or the floor's table):
/// `bench_<process id>_<counter>_<clock>` ([`PgSchema::fresh`] with `"bench"`), a name no other
/// bench of any run uses. The store creates it; dropping this drops it with everything in it.
pub use store_postgres::testkit::Schema as PgSchema;

/// The default multi-threaded tokio runtime the benches run durable stores on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The flush interval of the `redb-bounded` backend (commits use redb's `Durability::None` and
/// are made durable in the background at this interval).
pub const REDB_FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Every backend of the standard groups, in report order: `memory`, `sqlite`, `redb`
/// (`Immediate` durability), `redb-bounded` and `postgres`.
pub fn specs() -> Vec<Spec> {
    vec![
        Spec {
            name: "memory",
            kind: Kind::Memory,
        },
        Spec {
            name: "sqlite",
            kind: Kind::Sqlite(SqliteOptions::new()),
        },
        Spec {
            name: "redb",
            kind: Kind::Redb(RedbOptions::default()),
        },
        Spec {
            name: "redb-bounded",
            kind: Kind::Redb(RedbOptions::bounded(REDB_FLUSH_INTERVAL)),
        },
        Spec {
            name: "postgres",
            kind: Kind::Postgres {
                group_commit: store_postgres::DEFAULT_GROUP_COMMIT,
            },
        },
    ]
}

/// The backends of `record/concurrent_16_tasks`: those of [`specs`], each durable store followed
/// by the same store recording one transaction per event (`sqlite-1tx`, `redb-1tx`,
/// `postgres-1tx`: group commit off), so the gain of group commit shows in one run.
pub fn group_commit_specs() -> Vec<Spec> {
    let mut out = Vec::new();
    for spec in specs() {
        let off = match (&spec.name, &spec.kind) {
            (&"sqlite", Kind::Sqlite(o)) => Some(Spec {
                name: "sqlite-1tx",
                kind: Kind::Sqlite(o.clone().group_commit(1)),
            }),
            (&"redb", Kind::Redb(o)) => Some(Spec {
                name: "redb-1tx",
                kind: Kind::Redb(o.clone().group_commit(1)),
            }),
            (&"postgres", Kind::Postgres { .. }) => Some(Spec {
                name: "postgres-1tx",
                kind: Kind::Postgres { group_commit: 1 },
            }),
            _ => None,
        };
        out.push(spec);
        out.extend(off);
    }
    out
}

/// `specs` without the backends `AWARENESS_BENCH_BACKENDS` (a comma-separated list such as
/// `memory,sqlite`) does not name. When a postgres backend is left, its server is checked
/// first ([`pg_server`] panics without `AWARENESS_PG_URL`), before any data set loads.
pub fn wanted(specs: Vec<Spec>) -> Vec<Spec> {
    let out: Vec<Spec> = match std::env::var("AWARENESS_BENCH_BACKENDS") {
        Ok(list) => specs
            .into_iter()
            .filter(|s| list.split(',').any(|n| n.trim() == s.name))
            .collect(),
        Err(_) => specs,
    };
    if out.iter().any(|s| matches!(s.kind, Kind::Postgres { .. })) {
        pg_server();
    }
    out
}

/// Whether [`wanted`] keeps the backend named `name`.
pub fn is_wanted(name: &str) -> bool {
    wanted(specs()).iter().any(|s| s.name == name)
}

/// Every backend of [`specs`] that is [`wanted`], empty.
pub async fn open_backends() -> Vec<Backend> {
    let mut out = Vec::new();
    for spec in wanted(specs()) {
        out.push(open_empty(&spec).await);
    }
    out
}

/// Every backend of [`specs`] that is [`wanted`], holding `data`.
pub async fn loaded_backends(data: Dataset) -> Vec<Backend> {
    loaded(&wanted(specs()), data).await
}

/// The given backends, each holding `data` (loaded once per run and file format, then copied).
pub async fn loaded(specs: &[Spec], data: Dataset) -> Vec<Backend> {
    let mut out = Vec::new();
    for spec in specs {
        out.push(open_loaded(spec, data).await);
    }
    out
}

/// Opens one empty backend (a postgres one in a fresh schema).
pub async fn open_empty(spec: &Spec) -> Backend {
    if matches!(spec.kind, Kind::Postgres { .. }) {
        return open_postgres(spec, PgSchema::fresh("bench")).await;
    }
    let dir = tempfile::tempdir().expect("temp dir for a store");
    open_in(spec, dir).await
}

/// Connects a postgres store in `schema` (created, with its tables, when missing), which the
/// backend then owns and drops.
async fn open_postgres(spec: &Spec, schema: PgSchema) -> Backend {
    let Kind::Postgres { group_commit } = spec.kind else {
        unreachable!("a postgres spec")
    };
    let store = Arc::new(
        PgStore::connect(
            pg_server(),
            PgStoreOptions::new(schema.name()).group_commit(group_commit),
        )
        .await
        .expect("connect the postgres store"),
    );
    Backend {
        name: spec.name,
        store: Arc::clone(&store) as Arc<dyn AwarenessStore>,
        format: spec.kind.format(),
        redb: None,
        postgres: Some(store),
        guard: Box::new(schema),
    }
}

async fn open_in(spec: &Spec, dir: tempfile::TempDir) -> Backend {
    let (store, redb): (Arc<dyn AwarenessStore>, _) = match &spec.kind {
        Kind::Memory => (Arc::new(store_memory::MemoryStore::new()), None),
        Kind::Postgres { .. } => unreachable!("postgres has no file"),
        Kind::Sqlite(options) => (
            Arc::new(
                SqliteStore::open_with(dir.path().join("bench.db"), options.clone())
                    .await
                    .expect("open the sqlite store"),
            ),
            None,
        ),
        Kind::Redb(options) => {
            let redb = Arc::new(
                RedbStore::open_with(dir.path().join("bench.redb"), options.clone())
                    .await
                    .expect("open the redb store"),
            );
            (Arc::clone(&redb) as Arc<dyn AwarenessStore>, Some(redb))
        }
    };
    Backend {
        name: spec.name,
        store,
        format: spec.kind.format(),
        redb,
        postgres: None,
        guard: Box::new(dir),
    }
}

/// A data set loaded once per run and format, which each backend of that format copies.
enum Template {
    /// The directory of a loaded, cleanly closed sqlite or redb file.
    Files(tempfile::TempDir),
    /// A loaded postgres schema.
    Schema(PgSchema),
}

/// Loaded templates by (format, data set), kept for the whole run.
type Templates = Mutex<HashMap<(&'static str, Dataset), Arc<Template>>>;

fn templates() -> &'static Templates {
    static TEMPLATES: OnceLock<Templates> = OnceLock::new();
    TEMPLATES.get_or_init(Mutex::default)
}

/// Removes the loaded files (and drops the template schemas) kept for the run. A static is
/// never dropped, so without this each run left its templates (up to 70 MB a file) in the
/// temporary directory: the bench's `main` calls it once every group has run.
pub fn remove_templates() {
    templates()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
}

async fn open_loaded(spec: &Spec, data: Dataset) -> Backend {
    if matches!(spec.kind, Kind::Memory) {
        let b = open_empty(spec).await;
        data.load(&b.store).await;
        return b;
    }
    let key = (spec.kind.format(), data);
    let cached = templates()
        .lock()
        .expect("templates")
        .get(&key)
        .map(Arc::clone);
    let template = if let Some(t) = cached {
        t
    } else {
        let t = Arc::new(build_template(&spec.kind, data).await);
        templates()
            .lock()
            .expect("templates")
            .insert(key, Arc::clone(&t));
        t
    };
    match &*template {
        Template::Files(files) => {
            let dir = tempfile::tempdir().expect("temp dir for a store");
            copy_files(files.path(), dir.path());
            open_in(spec, dir).await
        }
        Template::Schema(from) => {
            // A first connection creates the store's tables in a fresh schema, which are then
            // filled from the template's; the store measured opens the filled schema, as the
            // other formats open a copied file (whatever a store reads when it connects, it
            // reads from the data set).
            let schema = PgSchema::fresh("bench");
            let setup = PgStore::connect(pg_server(), PgStoreOptions::new(schema.name()))
                .await
                .expect("create the postgres copy's tables");
            copy_schema(&setup, schema.name(), from.name()).await;
            setup.pool().close().await;
            drop(setup);
            open_postgres(spec, schema).await
        }
    }
}

/// Copies every table of the schema `from` into the (empty) tables of the schema `schema` of
/// the store `to`, which its connect created as `from`'s were, column by column by name, in
/// one transaction, then vacuums and analyzes them: the copy's rows are then all visible and
/// its statistics current, as the server would leave them some time after loading (its
/// autovacuum would otherwise start on them during the first measurement).
async fn copy_schema(to: &PgStore, schema: &str, from: &str) {
    // Each table and its columns, each name quoted by the server.
    let tables: Vec<(String, String)> = sqlx::query_as(
        "SELECT quote_ident(table_name::text),
                string_agg(quote_ident(column_name::text), ', ' ORDER BY ordinal_position)
         FROM information_schema.columns WHERE table_schema = $1
         GROUP BY table_name ORDER BY table_name",
    )
    .bind(from)
    .fetch_all(to.pool())
    .await
    .expect("the template's tables");
    assert!(
        !tables.is_empty(),
        "the template schema {from} has no table"
    );
    // Schema names are PgSchema's (no quoting needed), the rest quoted by the server above.
    let mut tx = to.pool().begin().await.expect("begin the copy");
    for (table, columns) in &tables {
        for sql in [
            format!("TRUNCATE \"{schema}\".{table}"),
            format!(
                "INSERT INTO \"{schema}\".{table} ({columns}) \
                 SELECT {columns} FROM \"{from}\".{table}"
            ),
        ] {
            sqlx::query(AssertSqlSafe(sql))
                .execute(&mut *tx)
                .await
                .expect("copy the template");
        }
    }
    tx.commit().await.expect("commit the copy");
    for (table, _) in &tables {
        let sql = format!("VACUUM (ANALYZE) \"{schema}\".{table}");
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(to.pool())
            .await
            .expect("vacuum the copy");
    }
}

/// Loads `data` into a new file of `kind`'s format (a new schema for postgres) and closes it
/// cleanly.
async fn build_template(kind: &Kind, data: Dataset) -> Template {
    if matches!(kind, Kind::Postgres { .. }) {
        let schema = PgSchema::fresh("bench");
        // Its commits need not be durable: the stores copy its rows, whatever their layout.
        let server = pg_server().options([("synchronous_commit", "off")]);
        let pg = Arc::new(
            PgStore::connect(server, PgStoreOptions::new(schema.name()))
                .await
                .expect("connect the postgres template"),
        );
        data.load(&(Arc::clone(&pg) as Arc<dyn AwarenessStore>))
            .await;
        pg.pool().close().await;
        return Template::Schema(schema);
    }
    let dir = tempfile::tempdir().expect("temp dir for a template");
    let store: Arc<dyn AwarenessStore> = match kind {
        Kind::Memory => unreachable!("memory has no file"),
        Kind::Postgres { .. } => unreachable!("postgres has no file"),
        Kind::Sqlite(_) => Arc::new(
            SqliteStore::open(dir.path().join("bench.db"))
                .await
                .expect("open the sqlite template"),
        ),
        // Loaded with the default (`Immediate`) durability, whichever setup copies it: redb
        // reuses freed pages differently after commits that are not durable, and the file the
        // setups record on must be laid out as the default would leave it.
        Kind::Redb(_) => Arc::new(
            RedbStore::open(dir.path().join("bench.redb"))
                .await
                .expect("open the redb template"),
        ),
    };
    data.load(&store).await;
    // The only handle left: this closes the file cleanly (the WAL copied back, redb's commits
    // durable and its lock released).
    store.close().await;
    Template::Files(dir)
}

fn copy_files(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read the template dir") {
        let entry = entry.expect("template entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy the template");
    }
}

/// Runs `f(0) .. f(n - 1)` on `in_flight` tokio tasks, each taking the next index when its last
/// call finished.
pub async fn concurrently<F, Fut>(n: usize, in_flight: usize, f: F)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let f = Arc::new(f);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..in_flight.clamp(1, n.max(1)) {
        let (f, next) = (Arc::clone(&f), Arc::clone(&next));
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                f(i).await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a loading task panicked");
    }
}

/// The session of index `i` in the data set.
pub fn dataset_session(i: usize) -> SessionRef {
    SessionRef::parse(&format!("agent:main:subagent:s{i}"), "main").expect("valid ref")
}

/// The watcher of index `i` (`agent:main:w{i}`).
pub fn watcher(i: usize) -> WatcherKey {
    WatcherKey::parse(&format!("agent:main:w{i}")).expect("watcher")
}

/// A human message on `session`.
pub fn human(session: &SessionRef) -> NewEvent {
    NewEvent::new(
        session.clone(),
        EventKind::HumanDirectMessage,
        ActorType::Human,
        "human message via telegram",
    )
    .with_actor_id("user-1")
}

/// Loads `events` events spread round-robin over `sessions` sessions, [`LOAD_IN_FLIGHT`]
/// recordings at a time.
pub async fn load_dataset(store: &Arc<dyn AwarenessStore>, events: usize, sessions: usize) {
    let s = Arc::clone(store);
    concurrently(events, LOAD_IN_FLIGHT, move |i| {
        let s = Arc::clone(&s);
        async move {
            s.record(human(&dataset_session(i % sessions)), T0)
                .await
                .expect("load the data set");
        }
    })
    .await;
}

/// Gives `target` `n` watchers ([`watcher`] 0 to n - 1), each with a cursor at the head.
pub async fn add_watchers(store: &dyn AwarenessStore, target: &SessionRef, n: usize) {
    for i in 0..n {
        store.watch(&watcher(i), target, T0).await.expect("watch");
    }
}

/// The head of a session, for reconcile benches.
pub async fn head(store: &dyn AwarenessStore, session: &SessionRef) -> Sequence {
    use awareness_core::AwarenessStoreExt as _;
    store.state_version(session).await.expect("head")
}

/// Polls a future with a no-op waker until it is ready: the cheapest way to drive a store whose
/// futures never wait on anything (store-memory, whose only pending is a pruning pass letting
/// its executor run others between steps), so its benches measure the store and not an
/// executor. Panics after a million polls: a future that waits on something else never gets
/// ready here.
pub fn poll_ready<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for _ in 0..1_000_000 {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
    panic!("poll_ready used on a future that waits on something: it never got ready")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use awareness_core::{AwarenessStore, CursorFilter};
    use store_redb::RedbOptions;

    use super::{
        Dataset, Kind, REDB_FLUSH_INTERVAL, Spec, add_watchers, dataset_session,
        group_commit_specs, loaded, open_empty, runtime, save_result, target_dir, test_mode,
        wanted, watcher,
    };

    /// A run without `--bench` (`cargo test --benches`, this very test binary) is a test run:
    /// small data sets, and no result saved for `bench-report`.
    /// (What the mutation did: only `--test` and `--list` counted; review of stop 68, BR01.)
    #[test]
    fn a_run_without_bench_is_a_test_run() {
        assert!(
            test_mode(),
            "a run without --bench ({:?}) is not a test run",
            std::env::args().collect::<Vec<_>>()
        );
    }

    /// `record/concurrent_16_tasks`'s backends: each durable store followed by the same store
    /// with one transaction per event (`group_commit(1)`), `redb-1tx` being `redb`'s
    /// (`Immediate`) and not `redb-bounded`'s, which keeps its background flush.
    /// (What the mutation did: a `-1tx` backend kept group commit, or was made from the
    /// bounded redb; `redb-bounded` opened with the default durability; review of stop 68,
    /// BR06 to BR09.)
    #[test]
    fn group_commit_specs_pair_each_durable_store_with_one_transaction_per_event() {
        let specs = group_commit_specs();
        let names: Vec<&str> = specs.iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "memory",
                "sqlite",
                "sqlite-1tx",
                "redb",
                "redb-1tx",
                "redb-bounded",
                "postgres",
                "postgres-1tx"
            ]
        );
        let kind = |name: &str| &specs.iter().find(|s| s.name == name).expect(name).kind;
        let debug = |name: &str| format!("{:?}", kind(name));
        assert!(
            debug("sqlite-1tx").contains("group_commit: 1,"),
            "{}",
            debug("sqlite-1tx")
        );
        assert!(
            !debug("sqlite").contains("group_commit: 1,"),
            "{}",
            debug("sqlite")
        );
        let redb = |name: &str| match kind(name) {
            Kind::Redb(o) => o.clone(),
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(redb("redb-1tx"), RedbOptions::default().group_commit(1));
        assert_eq!(
            redb("redb-bounded"),
            RedbOptions::bounded(REDB_FLUSH_INTERVAL)
        );
        let pg = |name: &str| match kind(name) {
            Kind::Postgres { group_commit } => *group_commit,
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(pg("postgres-1tx"), 1);
        assert_eq!(pg("postgres"), store_postgres::DEFAULT_GROUP_COMMIT);
    }

    /// The sweep's data set: every watcher watches every target (so a watcher of
    /// `turn/0_notices_100k_cursors` holds `targets` cursors), no other watcher has one, and
    /// `watchers * pending_targets` cursors are pending.
    /// (What the mutation did: watchers numbered `i / watchers`, so there were `targets`
    /// watchers of `watchers` targets each; or one watch too many; review of stop 68, BR02,
    /// BR12: both also fail the stores bench's `--test` run, this says why in a unit test.)
    #[test]
    fn the_cursors_data_set_gives_each_watcher_every_target() {
        let data = Dataset::cursors();
        let Dataset::Cursors {
            watchers,
            targets,
            pending_targets,
        } = data
        else {
            unreachable!("the cursors data set")
        };
        let rt = runtime();
        let memory = Spec {
            name: "memory",
            kind: Kind::Memory,
        };
        let b = rt.block_on(open_empty(&memory));
        rt.block_on(data.load(&b.store));
        let store: &Arc<dyn AwarenessStore> = &b.store;
        let of = |w: usize, pending_only: bool| {
            rt.block_on(store.cursors(&CursorFilter {
                watcher: Some(watcher(w).session_key().clone()),
                pending_only,
                ..CursorFilter::default()
            }))
            .expect("cursors")
            .len()
        };
        assert_eq!(of(0, false), targets, "the first watcher's cursors");
        assert_eq!(
            of(watchers - 1, false),
            targets,
            "the last watcher's cursors"
        );
        assert_eq!(of(watchers, false), 0, "a watcher beyond the data set's");
        let pending = rt
            .block_on(store.cursors(&CursorFilter {
                pending_only: true,
                ..CursorFilter::default()
            }))
            .expect("cursors")
            .len();
        assert_eq!(pending, watchers * pending_targets);
        // The events the data set says it records are those in the log.
        // (What the mutation did: the cursors' data set counted `watchers * pending_targets`
        // events; review of stop 72, BX01.)
        let rows = rt.block_on(store.log_stats()).expect("log stats").rows;
        assert_eq!(usize::try_from(rows).ok(), Some(data.events()));
    }

    /// Each backend `loaded` hands out holds the data set asked for, spread over its sessions,
    /// a second data set of the same format its own and not the first's template; a postgres
    /// store's size is its own schema's, which another schema's data leaves as it was.
    /// (What the mutation did: the events went to a session each; the templates were cached by
    /// format alone; memory was handed out empty; the postgres copy read the empty schema's
    /// tables; the size summed every schema on the server; review of stop 72, BX02, BX06 to
    /// BX09.)
    #[test]
    fn loaded_backends_hold_each_data_set_on_its_sessions() {
        let rt = runtime();
        let specs: Vec<Spec> = group_commit_specs()
            .into_iter()
            .filter(|s| ["memory", "sqlite", "postgres"].contains(&s.name))
            .collect();
        let empty_pg = rt.block_on(open_empty(&specs[2]));
        let empty_bytes = rt.block_on(empty_pg.stored_bytes());
        for (events, sessions) in [(30, 10), (12, 4)] {
            let data = Dataset::Events { events, sessions };
            for b in rt.block_on(loaded(&specs, data)) {
                let rows = rt.block_on(b.store.log_stats()).expect("log stats").rows;
                let heads = rt.block_on(b.store.list_heads(None)).expect("heads").len();
                assert_eq!((rows, heads), (events as u64, sessions), "{}", b.name);
            }
        }
        assert_eq!(
            rt.block_on(empty_pg.stored_bytes()),
            empty_bytes,
            "an empty store's size after other schemas were loaded"
        );
    }

    /// [`add_watchers`] gives the target the watchers 0 to n - 1, one cursor each.
    /// (What the mutation did: the watchers began at 1; review of stop 72, BX10.)
    #[test]
    fn add_watchers_gives_the_first_n_watchers_a_cursor() {
        let rt = runtime();
        let b = rt.block_on(open_empty(&Spec {
            name: "memory",
            kind: Kind::Memory,
        }));
        rt.block_on(add_watchers(b.store.as_ref(), &dataset_session(0), 3));
        let of = |w: usize| {
            rt.block_on(b.store.cursors(&CursorFilter {
                watcher: Some(watcher(w).session_key().clone()),
                ..CursorFilter::default()
            }))
            .expect("cursors")
            .len()
        };
        assert_eq!([of(0), of(1), of(2), of(3)], [1, 1, 1, 0]);
    }

    /// A result is saved as `<target>/<dir>/<name>.json`, the extension `bench-report` reads.
    /// (What the mutation did: the file was saved without `.json`, which the report skips;
    /// review of stop 72, BX11.)
    #[test]
    fn save_result_writes_a_json_file_under_the_target_dir() {
        let dir = format!("awareness-bench-test-{}", std::process::id());
        let value = serde_json::json!({"backend": "memory"});
        let path = save_result(&dir, "memory", &value);
        let read = std::fs::read_to_string(&path).map(|s| serde_json::from_str(&s).ok());
        std::fs::remove_dir_all(target_dir().join(&dir)).expect("remove the test's dir");
        assert_eq!(path, target_dir().join(&dir).join("memory.json"));
        assert_eq!(read.ok().flatten(), Some(value));
    }

    /// store-memory keeps no file: its size is none, not 0 bytes (the scale table's files
    /// column shows `-`); a sqlite store's is its files'.
    /// (What the mutation did: memory's temporary directory measured; review of stop 68, BR03.)
    #[test]
    fn a_memory_store_has_no_stored_bytes() {
        let rt = runtime();
        let memory = rt.block_on(open_empty(&Spec {
            name: "memory",
            kind: Kind::Memory,
        }));
        assert_eq!(rt.block_on(memory.stored_bytes()), None);
        let sqlite = rt.block_on(open_empty(&Spec {
            name: "sqlite",
            kind: Kind::Sqlite(store_sqlite::SqliteOptions::new()),
        }));
        assert!(rt.block_on(sqlite.stored_bytes()).is_some_and(|n| n > 0));
    }

    /// Runs [`wanted_in_a_child`] in a child process of this test binary with `backends` as
    /// `AWARENESS_BENCH_BACKENDS` and `AWARENESS_PG_URL` unset (the environment is the
    /// process's: no test sets it in its own); with `None`, no list and `AWARENESS_PG_URL` as
    /// this process has it.
    fn wanted_with(backends: Option<&str>) -> std::process::Output {
        let mut child =
            std::process::Command::new(std::env::current_exe().expect("the test binary"));
        child
            .args(["--exact", "tests::wanted_in_a_child", "--nocapture"])
            .env("AWARENESS_BENCHES_WANTED_CHILD", "1");
        match backends {
            Some(backends) => child
                .env("AWARENESS_BENCH_BACKENDS", backends)
                .env_remove("AWARENESS_PG_URL"),
            None => child.env_remove("AWARENESS_BENCH_BACKENDS"),
        };
        child.output().expect("run the test binary")
    }

    /// Prints the names [`wanted`] keeps, in a child process started by [`wanted_with`]
    /// (nothing otherwise).
    #[test]
    fn wanted_in_a_child() {
        if std::env::var_os("AWARENESS_BENCHES_WANTED_CHILD").is_none() {
            return;
        }
        let names: Vec<&str> = wanted(group_commit_specs())
            .iter()
            .map(|s| s.name)
            .collect();
        println!("wanted: {}", names.join(","));
    }

    /// `AWARENESS_BENCH_BACKENDS` keeps the backends it names, spaces after its commas
    /// allowed; one that keeps postgres without `AWARENESS_PG_URL` panics at once, naming the
    /// variable, before any data set loads.
    /// (What the mutation did: names compared untrimmed; the server's check left out; review of
    /// stop 68, BR04, BR05.)
    #[test]
    fn wanted_keeps_the_named_backends_and_checks_the_server_first() {
        let out = wanted_with(Some("memory, sqlite-1tx ,redb"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(
            stdout.contains("wanted: memory,sqlite-1tx,redb\n"),
            "{stdout}"
        );

        let out = wanted_with(Some("memory,postgres"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && !stdout.contains("wanted:"),
            "postgres kept without a server: {stdout}"
        );
        assert!(
            stdout.contains("AWARENESS_PG_URL") || stderr.contains("AWARENESS_PG_URL"),
            "{stdout}{stderr}"
        );
    }

    /// Without `AWARENESS_BENCH_BACKENDS` every backend is kept, in report order.
    /// (What the mutation did: no list kept none; review of stop 72, BX12.)
    #[test]
    fn wanted_keeps_every_backend_without_a_list() {
        let out = wanted_with(None);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(
                "wanted: memory,sqlite,sqlite-1tx,redb,redb-1tx,redb-bounded,postgres,postgres-1tx\n"
            ),
            "{out:?}"
        );
    }
}
