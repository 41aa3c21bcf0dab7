//! Store benches: one criterion group per user-visible operation, every backend side by side.
//!
//! Run: `cargo bench -p awareness-benches --bench stores`. Under `-- --test` the data sets are
//! small (see `awareness_benches::test_mode`).

// Criterion's idiom: `c` the criterion, `g` a group, `b` a backend, `bench` the bencher.
#![allow(clippy::many_single_char_names)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use awareness_benches::{
    Backend, Dataset, Kind, PgSchema, Spec, T0, add_watchers, dataset_session, group_commit_specs,
    head, human, is_wanted, load_dataset, loaded, loaded_backends, pg_server, poll_ready, runtime,
    save_result, test_mode, wanted, watcher,
};
use awareness_core::{
    AckTarget, AwarenessStore, AwarenessStoreExt as _, NewEvent, RetentionPolicy, Sequence,
};
use criterion::{
    BatchSize, Bencher, BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group,
};
use gateway_adapter::{
    Awareness, InMemoryDirectory, InMemoryQueue, ManualClock, RecordingWake, SessionEntry,
};
use store_sqlite::{SqliteOptions, SqliteStore};
use tokio::runtime::Runtime;

/// Runs one store call: memory is polled directly, durable stores on the runtime.
fn run<T>(rt: &Runtime, b: &Backend, f: impl std::future::Future<Output = T>) -> T {
    if b.name == "memory" {
        poll_ready(f)
    } else {
        rt.block_on(f)
    }
}

/// Keeps a store at the data set's size while a bench that records runs, as the row cap does in
/// a gateway: every fifth of the data set's size in recordings a pruning pass down to that size
/// runs in the un-measured set-up.
///
/// Under `--test` a bench records once or a few times, which never reaches a fifth of the data
/// set: there a pass runs before every recording instead, so each bench that has one runs it at
/// least once, down to one row below the data set's size, so that every pass (the first one
/// included) has rows to delete, and each pass is checked to delete exactly the rows above the
/// cap. A real run is unchanged.
struct Capped {
    policy: RetentionPolicy,
    every: usize,
    recorded: AtomicUsize,
}

impl Capped {
    fn new(data: Dataset) -> Self {
        let (max_rows, every) = if test_mode() {
            (data.events() - 1, 1)
        } else {
            (data.events(), (data.events() / 5).max(1))
        };
        Self {
            policy: RetentionPolicy {
                max_rows: max_rows as u64,
                ..RetentionPolicy::default()
            },
            every,
            recorded: AtomicUsize::new(0),
        }
    }

    /// Counts `n` recordings about to be made and prunes first when a pass is due; returns the
    /// count before them (an index for picking sessions).
    fn before(&self, rt: &Runtime, b: &Backend, n: usize) -> usize {
        let before = self.recorded.fetch_add(n, Ordering::Relaxed);
        if before / self.every != (before + n) / self.every {
            self.pass(rt, b);
        }
        before
    }

    /// One pruning pass down to the cap; under `--test`, checked against the rows before it
    /// (some above the cap, all of those deleted, and no other) and reported.
    fn pass(&self, rt: &Runtime, b: &Backend) {
        // The pass's background work is waited for before the timed recordings go on (see
        // `Backend::settle`: redb-bounded's flush; not SQLite's checkpoint).
        if !test_mode() {
            run(rt, b, b.store.prune(&self.policy, T0)).expect("prune");
            run(rt, b, b.settle());
            return;
        }
        let rows = run(rt, b, b.store.log_stats()).expect("log stats").rows;
        let report = run(rt, b, b.store.prune(&self.policy, T0)).expect("prune");
        run(rt, b, b.settle());
        let after = run(rt, b, b.store.log_stats()).expect("log stats").rows;
        let excess = rows.saturating_sub(self.policy.max_rows);
        assert!(
            excess > 0,
            "{rows} rows: none above the cap for the pass to delete"
        );
        assert_eq!(
            report.events_by_cap, excess,
            "the pass pruned the rows above the cap"
        );
        assert_eq!(after, rows - excess, "the log is at the cap");
        println!(
            "row cap pass on {}: {rows} rows, {excess} pruned, {after} left",
            b.name
        );
    }
}

/// Measures recording the events `pick(n)` builds (outside the measurement) for the n-th
/// recording, each reaching `watchers` watchers.
fn bench_record(
    bench: &mut Bencher<'_>,
    rt: &Runtime,
    b: &Backend,
    capped: &Capped,
    pick: impl Fn(usize) -> NewEvent,
    watchers: usize,
) {
    bench.iter_batched(
        || pick(capped.before(rt, b, 1)),
        // The result is dropped inside the measurement, as a caller drops it, so the harness
        // does not collect outputs into a growing buffer.
        |e| {
            let got = run(rt, b, b.store.record(e, T0)).expect("record");
            assert_eq!(got.notices.len(), watchers);
            std::hint::black_box(got.event.sequence);
        },
        BatchSize::SmallInput,
    );
}

/// `record/{0,1,10}_watchers` (a human message on a session with that many watchers) and
/// `record/dedupe_hit` (an event whose dedupe key is already stored).
fn record(c: &mut Criterion) {
    let rt = runtime();
    let data = Dataset::standard();
    let backends = rt.block_on(loaded_backends(data));
    let mut g = c.benchmark_group("record");
    for b in &backends {
        let store: &dyn AwarenessStore = &*b.store;
        let capped = Capped::new(data);
        // Events are built outside the measurement: the bench measures the store.
        let fresh: Vec<_> = (0..data.sessions())
            .map(|i| dataset_session(data.sessions() + i))
            .collect();
        g.bench_function(BenchmarkId::new("0_watchers", b.name), |bench| {
            bench_record(
                bench,
                &rt,
                b,
                &capped,
                |n| human(&fresh[n % fresh.len()]),
                0,
            );
        });
        for (name, watchers, session) in [("1_watchers", 1, 6), ("10_watchers", 10, 7)] {
            let target = dataset_session(session);
            rt.block_on(add_watchers(store, &target, watchers));
            g.bench_function(BenchmarkId::new(name, b.name), |bench| {
                bench_record(bench, &rt, b, &capped, |_| human(&target), watchers);
            });
        }
        let stored = human(&dataset_session(8)).with_dedupe_key("bench-dedupe-hit");
        run(&rt, b, store.record(stored.clone(), T0)).expect("record");
        g.bench_function(BenchmarkId::new("dedupe_hit", b.name), |bench| {
            bench.iter_batched(
                || stored.clone(),
                |e| {
                    let got = run(&rt, b, store.record(e, T0)).expect("record");
                    assert!(got.deduplicated);
                    std::hint::black_box(got.event.sequence);
                },
                BatchSize::SmallInput,
            );
        });
    }
    g.finish();
}

/// `reconcile/{5,200}`: the last 5 events of a session, and a full 200-event page.
fn reconcile(c: &mut Criterion) {
    let rt = runtime();
    let backends = rt.block_on(loaded_backends(Dataset::standard()));
    let mut g = c.benchmark_group("reconcile");
    // A session gets 200 more events than the data set gave it, so a full page exists.
    let target = dataset_session(11);
    for b in &backends {
        let store: &dyn AwarenessStore = &*b.store;
        for _ in 0..200 {
            rt.block_on(store.record(human(&target), T0))
                .expect("record");
        }
        let last = rt.block_on(head(store, &target)).get();
        for (name, limit, after) in [("5", 5usize, last - 5), ("200", 200, 0)] {
            g.bench_function(BenchmarkId::new(name, b.name), |bench| {
                bench.iter(|| {
                    let page = run(&rt, b, store.changes_since(&target, Sequence(after), limit))
                        .expect("page");
                    assert_eq!(page.events.len(), limit);
                    page
                });
            });
        }
    }
    g.finish();
}

/// Refs the gateway enriches per `heads` call (its default `list_batch`).
const LIST_REFS: usize = 500;

/// `sessions_list/500_refs`: the gateway's `sessions_list` enrichment for one page of sessions,
/// which is one `heads` call for the 500 refs, keeping the heads above 0 by ref.
fn sessions_list(c: &mut Criterion) {
    let rt = runtime();
    let data = Dataset::standard();
    let backends = rt.block_on(loaded_backends(data));
    let refs: Vec<_> = (0..LIST_REFS).map(dataset_session).collect();
    let mut g = c.benchmark_group("sessions_list");
    for b in &backends {
        let store: &dyn AwarenessStore = &*b.store;
        g.bench_function(BenchmarkId::new("500_refs", b.name), |bench| {
            bench.iter(|| {
                let heads = run(&rt, b, store.heads(&refs)).expect("heads");
                let versions: HashMap<_, _> = heads
                    .into_iter()
                    .filter(|h| h.last_sequence > Sequence::ZERO)
                    .map(|h| (h.session, h.last_sequence))
                    .collect();
                assert_eq!(versions.len(), LIST_REFS.min(data.events()));
                versions
            });
        });
    }
    g.finish();
}

/// `acknowledge`: a watcher acknowledges its pending notice on one session (the material event
/// that made it pending is recorded in the un-measured set-up). `acknowledge` returns only the
/// follow-up notices (none here), so whether it moved the cursor is checked outside the
/// measurement: each set-up first reads the cursor and checks that the previous iteration's
/// acknowledgement left it at the event that set-up recorded, with nothing pending (a no-op
/// acknowledge would fail there, not be timed); the last iteration is checked after the bench.
fn acknowledge(c: &mut Criterion) {
    let rt = runtime();
    let data = Dataset::standard();
    let backends = rt.block_on(loaded_backends(data));
    let watcher = awareness_core::WatcherKey::parse("agent:main:acknowledger").expect("watcher");
    let target = dataset_session(13);
    let mut g = c.benchmark_group("acknowledge");
    for b in &backends {
        let store: &dyn AwarenessStore = &*b.store;
        let capped = Capped::new(data);
        run(&rt, b, store.watch(&watcher, &target, T0)).expect("watch");
        // The event the last set-up made pending, and how many acknowledgements were checked.
        let pending = std::cell::Cell::new(None::<Sequence>);
        let checked = std::cell::Cell::new(0usize);
        let check_acknowledged = || {
            let Some(seq) = pending.take() else { return };
            let cursor = run(&rt, b, store.cursor(&watcher, &target.session_key))
                .expect("cursor")
                .expect("the acknowledger's cursor");
            assert!(
                cursor.last_seen == seq && !cursor.is_pending(),
                "the acknowledgement moved the cursor to {seq:?}: {cursor:?}"
            );
            checked.set(checked.get() + 1);
        };
        g.bench_function(b.name, |bench| {
            bench.iter_batched(
                || {
                    check_acknowledged();
                    capped.before(&rt, b, 1);
                    let got = run(&rt, b, store.record(human(&target), T0)).expect("record");
                    assert_eq!(got.notices.len(), 1);
                    pending.set(Some(got.event.sequence));
                    // The set-up's background work, not the acknowledgement's (see `settle`).
                    run(&rt, b, b.settle());
                },
                |()| {
                    let follow_up = run(
                        &rt,
                        b,
                        store.acknowledge(
                            &watcher,
                            &[AckTarget::any(target.session_key.clone())],
                            T0,
                        ),
                    )
                    .expect("acknowledge");
                    assert!(follow_up.is_empty());
                },
                // Every acknowledgement needs its own pending notice.
                BatchSize::PerIteration,
            );
        });
        check_acknowledged();
        // Under `--test` every recording of a bench with a row cap is preceded by a pass down to
        // one row below the data set's size: the acknowledgements' set-ups leave the log at that
        // size exactly (one more row if no pass ran). (What the mutation did: `Capped::before`
        // ran a pass only when none was due, so under `--test` no pass ran at all and the row
        // cap's checks checked nothing; review of stop 68, BS28.)
        if test_mode() {
            let rows = run(&rt, b, store.log_stats()).expect("log stats").rows;
            assert_eq!(
                rows,
                data.events() as u64,
                "acknowledge/{}: a row cap pass before each recording",
                b.name
            );
        }
        if test_mode() && checked.get() > 0 {
            println!(
                "acknowledge/{}: {} acknowledgements checked to move the cursor",
                b.name,
                checked.get()
            );
        }
    }
    g.finish();
}

/// The service a `turn/` bench takes turns through, on the data set's clock: on the machine's,
/// the row cap's pruning (run at T0) would find the taker's cursors idle and delete them.
fn turn_service(b: &Backend) -> Awareness {
    Awareness::builder(
        Arc::clone(&b.store),
        Arc::new(InMemoryQueue::new()),
        Arc::new(RecordingWake::new()),
        Arc::new(InMemoryDirectory::new()),
    )
    .clock(Arc::new(ManualClock::new(T0)))
    .build()
}

/// `turn/{0,1,10}_notices`: what a watcher's turn pays before it acts
/// ([`Awareness::drain_turn`]: drain its queue, read its pending cursors, acknowledge the
/// notices it read, drop their queued copies), with nothing pending, one notice and ten (the
/// recordings that hand them out, through the same service, run in the un-measured set-up).
fn turn(c: &mut Criterion) {
    const TARGETS: usize = 10;
    let rt = runtime();
    let data = Dataset::standard();
    let backends = rt.block_on(loaded_backends(data));
    // A subagent: its notices are queued without a wake, so the set-up's deliveries leave
    // nothing behind in the (recording) wake sink over millions of iterations.
    let taker =
        awareness_core::WatcherKey::parse("agent:main:subagent:turn-taker").expect("watcher");
    let targets: Vec<_> = (0..TARGETS).map(|i| dataset_session(29 + 7 * i)).collect();
    let mut g = c.benchmark_group("turn");
    for b in &backends {
        let store: &dyn AwarenessStore = &*b.store;
        for t in &targets {
            rt.block_on(store.watch(&taker, t, T0)).expect("watch");
        }
        let svc = turn_service(b);
        // Whatever the loading left pending for the taker is read and acknowledged first.
        rt.block_on(svc.drain_turn(taker.session_key()));
        let capped = Capped::new(data);
        let turn = || {
            let read = rt.block_on(svc.drain_turn(taker.session_key()));
            assert!(read.is_empty(), "nothing pending");
            read
        };
        g.bench_function(BenchmarkId::new("0_notices", b.name), |bench| {
            bench.iter(turn);
        });
        for notices in [1, TARGETS] {
            let id = BenchmarkId::new(format!("{notices}_notices"), b.name);
            g.bench_function(id, |bench| {
                bench.iter_batched(
                    || {
                        capped.before(&rt, b, notices);
                        for t in &targets[..notices] {
                            let got = rt.block_on(svc.try_record(human(t))).expect("record");
                            assert_eq!(got.notices.len(), 1, "the taker is told");
                        }
                        // The set-up's background work, not the turn's (see `settle`).
                        rt.block_on(b.settle());
                    },
                    |()| {
                        let read = rt.block_on(svc.drain_turn(taker.session_key()));
                        assert_eq!(read.len(), notices, "one line per notice");
                        read
                    },
                    // Every turn needs its own notices.
                    BatchSize::PerIteration,
                );
            });
        }
    }
    g.finish();
}

/// The backends loaded with the sweep's data set ([`Dataset::cursors`]), with its numbers of
/// watchers and of targets pending for each.
fn cursor_backends(rt: &Runtime) -> (usize, usize, Vec<Backend>) {
    let data = Dataset::cursors();
    let Dataset::Cursors {
        watchers,
        pending_targets,
        ..
    } = data
    else {
        unreachable!("the cursors data set")
    };
    (
        watchers,
        pending_targets,
        rt.block_on(loaded_backends(data)),
    )
}

/// `sweep/100k_cursors`: the start-up sweep (every pending cursor re-frozen and its notice
/// returned) over 100,000 cursors of which 10,000 are pending.
fn sweep(c: &mut Criterion) {
    let rt = runtime();
    let (watchers, pending_targets, backends) = cursor_backends(&rt);
    let mut g = c.benchmark_group("sweep");
    g.sample_size(10);
    let exists = |_: &awareness_core::WatcherKey| true;
    for b in &backends {
        let store: &dyn AwarenessStore = &*b.store;
        g.bench_function(BenchmarkId::new("100k_cursors", b.name), |bench| {
            bench.iter(|| {
                let notices = run(&rt, b, store.sweep(T0, &exists)).expect("sweep");
                assert_eq!(notices.len(), watchers * pending_targets);
                notices
            });
        });
    }
    g.finish();
}

/// `turn/0_notices_100k_cursors`: the turn of a watcher with 1,000 cursors and nothing pending,
/// in a store of 100,000 cursors (the sweep's data set, the watcher's 100 pending notices
/// acknowledged by a turn first): what a watcher pays before acting when nothing changed, in a
/// store much larger than its own cursors.
fn turn_among_cursors(c: &mut Criterion) {
    let rt = runtime();
    let (_, pending_targets, backends) = cursor_backends(&rt);
    let taker = watcher(0);
    let mut g = c.benchmark_group("turn");
    for b in &backends {
        let svc = turn_service(b);
        let first = rt.block_on(svc.drain_turn(taker.session_key()));
        assert_eq!(
            first.len(),
            pending_targets,
            "the first turn reads them all"
        );
        g.bench_function(
            BenchmarkId::new("0_notices_100k_cursors", b.name),
            |bench| {
                bench.iter(|| {
                    let read = rt.block_on(svc.drain_turn(taker.session_key()));
                    assert!(read.is_empty(), "nothing pending");
                    read
                });
            },
        );
    }
    g.finish();
}

/// A pick-up of the notices another writer handed out ([`Awareness::pick_up`]) on the sweep's
/// data set, every notice already queued: what a gateway pays each time another process
/// sharing its store commits, and on any store once every recovery interval (it reads every
/// pending cursor once and looks at each watcher's queue once, queuing nothing).
fn pickup(c: &mut Criterion) {
    let rt = runtime();
    let (watchers, pending_targets, backends) = cursor_backends(&rt);
    let mut g = c.benchmark_group("pickup");
    g.sample_size(10);
    for b in &backends {
        let directory = Arc::new(InMemoryDirectory::new());
        for i in 0..watchers {
            directory.upsert(watcher(i).session_key().clone(), SessionEntry::default());
        }
        let svc = Awareness::builder(
            Arc::clone(&b.store),
            Arc::new(InMemoryQueue::new()),
            Arc::new(RecordingWake::new()),
            directory,
        )
        .build();
        let first = run(&rt, b, svc.pick_up()).queued;
        assert_eq!(
            first,
            watchers * pending_targets,
            "the first pick-up queues them all"
        );
        g.bench_function(BenchmarkId::new("100k_cursors", b.name), |bench| {
            bench.iter(|| {
                let queued = run(&rt, b, svc.pick_up()).queued;
                assert_eq!(queued, 0, "every notice is queued already");
                queued
            });
        });
    }
    g.finish();
}

/// The floor of `record` on redb: a bare one-key insert per write transaction on a separate
/// redb file, per durability (`immediate`: fsynced; `none`: redb's `Durability::None`, as
/// `redb-bounded` commits), called directly and through `spawn_blocking` as the store calls redb.
/// The keys go round [`FLOOR_KEYS`], so the table stays that small whatever the number of
/// iterations: with a new key each time it grew by every iteration of the run (about a million
/// with `none`), and its cost with it.
fn floor(c: &mut Criterion) {
    const TABLE: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("floor");
    /// The keys of the floor's table.
    const FLOOR_KEYS: u64 = 4_096;
    let rt = runtime();
    let dir = tempfile::tempdir().expect("temp dir for the floor");
    let db = Arc::new(
        redb::Database::create(dir.path().join("floor.redb")).expect("open the floor database"),
    );
    let mut g = c.benchmark_group("floor");
    for (mode, durability) in [
        ("immediate", redb::Durability::Immediate),
        ("none", redb::Durability::None),
    ] {
        let insert = move |db: &redb::Database, k: u64| {
            let mut txn = db.begin_write().expect("begin");
            txn.set_durability(durability).expect("durability");
            txn.open_table(TABLE)
                .expect("table")
                .insert(k, k)
                .expect("insert");
            txn.commit().expect("commit");
        };
        let n = std::sync::atomic::AtomicU64::new(0);
        let next = || n.fetch_add(1, Ordering::Relaxed) % FLOOR_KEYS;
        g.bench_function(BenchmarkId::new("insert_one_key", mode), |bench| {
            bench.iter(|| insert(&db, next()));
        });
        g.bench_function(
            BenchmarkId::new("insert_one_key_spawn_blocking", mode),
            |bench| {
                bench.iter(|| {
                    let (db, k) = (Arc::clone(&db), next());
                    rt.block_on(async {
                        tokio::task::spawn_blocking(move || insert(&db, k)).await
                    })
                    .expect("join");
                });
            },
        );
    }
    sqlx_floor(&rt, &mut g, dir.path());
    if is_wanted("postgres") {
        postgres_floor(&rt, &mut g);
    }
    g.finish();
}

/// The floor of `record` on PostgreSQL through sqlx, on the server the `postgres` backend uses
/// (its settings, `synchronous_commit` included, as the server has them), in a schema of its
/// own dropped afterwards, over one connection: `sqlx_round_trip` is `SELECT 1` (one message
/// each way between the process and the server), `sqlx_insert_one_row` a bare one-row insert
/// per transaction (autocommit: one WAL flush each), into a table with a primary key and
/// nothing else, its keys going round 4,096 as the other floors' do. A recording pays at least
/// the insert, and more: the store's lock, its counter, the event's row and two indexes, its
/// head, each a statement of its own.
fn postgres_floor(
    rt: &Runtime,
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
) {
    use sqlx::{ConnectOptions as _, Connection as _};
    let schema = PgSchema::fresh("bench");
    let mut conn = rt.block_on(async {
        let mut conn = pg_server()
            .connect()
            .await
            .expect("connect the postgres floor");
        // PgSchema's names need no quoting.
        let create = format!(
            "CREATE SCHEMA \"{0}\"; CREATE TABLE \"{0}\".floor (k bigint PRIMARY KEY, v bigint); \
             SET search_path TO \"{0}\"",
            schema.name()
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(create))
            .execute(&mut conn)
            .await
            .expect("create the postgres floor table");
        conn
    });
    g.bench_function(BenchmarkId::new("sqlx_round_trip", "postgres"), |bench| {
        bench.iter(|| {
            rt.block_on(sqlx::query("SELECT 1").fetch_all(&mut conn))
                .expect("select 1")
        });
    });
    let mut k: i64 = 0;
    g.bench_function(
        BenchmarkId::new("sqlx_insert_one_row", "postgres"),
        |bench| {
            bench.iter(|| {
                k = (k + 1) % 4_096;
                let q = sqlx::query(
                    "INSERT INTO floor (k, v) VALUES ($1, $1) \
                     ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
                )
                .bind(k);
                rt.block_on(q.execute(&mut conn)).expect("insert")
            });
        },
    );
    rt.block_on(conn.close()).expect("close the postgres floor");
    drop(schema);
}

/// The floor of `record` on SQLite through sqlx, on a file of its own in WAL mode with
/// `synchronous=NORMAL` as the store's connections (SQLite's default autocheckpoint runs in the
/// insert that crosses 1,000 pages, where the store checkpoints in the background):
/// `sqlx_round_trip` is `SELECT 1` (one message each way between
/// the caller and sqlx's worker thread, and almost no SQLite work), `sqlx_insert_one_row` a bare
/// one-row insert per write transaction (autocommit), the SQLite counterpart of redb's floor.
/// A recording pays at least the round trip, and more pages (strace counted seven WAL frames
/// per recording).
fn sqlx_floor(
    rt: &Runtime,
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    dir: &std::path::Path,
) {
    use sqlx::ConnectOptions as _;
    let mut conn = rt.block_on(async {
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.join("floor.sqlite"))
            .create_if_missing(true)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
            .connect()
            .await
            .expect("open the sqlx floor database");
        sqlx::raw_sql(
            "PRAGMA journal_mode = WAL; CREATE TABLE floor (k INTEGER PRIMARY KEY, v INTEGER)",
        )
        .execute(&mut conn)
        .await
        .expect("create the sqlx floor table");
        conn
    });
    g.bench_function(BenchmarkId::new("sqlx_round_trip", "sqlite"), |bench| {
        bench.iter(|| {
            rt.block_on(sqlx::query("SELECT 1").fetch_all(&mut conn))
                .expect("select 1")
        });
    });
    // Its keys go round 4,096 too, as the redb floor's: with a new key each time, the table
    // grew by every iteration of the run.
    let mut k: i64 = 0;
    g.bench_function(BenchmarkId::new("sqlx_insert_one_row", "sqlite"), |bench| {
        bench.iter(|| {
            k = (k + 1) % 4_096;
            let q = sqlx::query("INSERT OR REPLACE INTO floor (k, v) VALUES ($1, $1)").bind(k);
            rt.block_on(q.execute(&mut conn)).expect("insert")
        });
    });
}

/// Latencies of `n` recordings on sessions outside the data set, the `from`-th onwards (each
/// recording on the next of `sessions` such sessions, round-robin).
async fn record_latencies(
    store: &dyn AwarenessStore,
    sessions: usize,
    from: usize,
    n: usize,
) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for i in from..from + n {
        let e = human(&dataset_session(2 * sessions + i % sessions));
        let t = Instant::now();
        store.record(e, T0).await.expect("record");
        out.push(t.elapsed());
    }
    out
}

/// The nearest-rank p99: the smallest sample at or above 99% of them (index `ceil(0.99 n) - 1`
/// of the sorted samples; the maximum below 100 samples, which is why the pruning section
/// collects a few hundred).
fn p99(mut v: Vec<Duration>) -> Option<Duration> {
    v.sort();
    let rank = (v.len() * 99).div_ceil(100);
    v.get(rank.checked_sub(1)?).copied()
}

/// The bench's own check of [`p99`] on made-up samples, under `--test` (a test target with
/// `harness = false` runs no `#[test]`): the nearest rank, `ceil(0.99 n)`, of the sorted
/// samples, whatever their order; none of no samples. (What the mutation did: the rank rounded
/// down, or the sample after the rank's was taken; review of stop 68, BS40, BS41.)
fn p99_is_the_nearest_rank() {
    let us = |n: u64| Duration::from_micros(n);
    // 150 samples: ceil(148.5) = 149, so the 149th smallest.
    assert_eq!(
        p99((1..=150).rev().map(us).collect()),
        Some(us(149)),
        "p99 of 1..=150 µs"
    );
    assert_eq!(
        p99((1..=100).map(us).collect()),
        Some(us(99)),
        "p99 of 1..=100 µs"
    );
    assert_eq!(p99(vec![us(7)]), Some(us(7)), "p99 of one sample");
    assert_eq!(p99(Vec::new()), None, "p99 of no samples");
}

/// `prune/60k_to_50k`: one pruning pass from 60,000 rows down to 50,000 (row cap, in the default
/// chunks of 2,000 rows), and beside it the p99 of recording while such a pass runs against the
/// quiet p99 (printed).
fn prune(c: &mut Criterion) {
    let rt = runtime();
    let data = Dataset::standard();
    let excess = data.events() / 5;
    let backends = rt.block_on(loaded_backends(data));
    let policy = RetentionPolicy {
        max_rows: data.events() as u64,
        ..RetentionPolicy::default()
    };
    // The refill's background work is waited for before the pass is timed: redb-bounded's
    // commits are flushed (its background flush could otherwise land in the pass). SQLite's
    // background checkpoint, which the refill's writes may have started, cannot be: see
    // `Backend::settle`.
    let refill = |b: &Backend| {
        let settled = rt.block_on(async {
            load_dataset(&b.store, excess, data.sessions()).await;
            b.settle().await
        });
        if test_mode() {
            println!(
                "prune/60k_to_50k/{}: refilled {excess} rows; {settled}",
                b.name
            );
        }
    };
    let mut g = c.benchmark_group("prune");
    g.sample_size(10);
    for b in &backends {
        let store: &dyn AwarenessStore = &*b.store;
        // Measured once, the first time criterion runs this bench (so only when a filter
        // selects it): recording while passes run, against recording alone.
        let mut latencies_done = false;
        g.bench_function(BenchmarkId::new("60k_to_50k", b.name), |bench| {
            if !latencies_done {
                latencies_done = true;
                record_beside_pruning(&rt, b, &policy, data, excess);
            }
            bench.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    refill(b);
                    let t = Instant::now();
                    let report = run(&rt, b, store.prune(&policy, T0)).expect("prune");
                    total += t.elapsed();
                    assert_eq!(report.events_by_cap, excess as u64);
                }
                total
            });
        });
    }
    g.finish();
}

/// The p99 of recording while pruning passes (60,000 rows down to 50,000) run on another task,
/// against the quiet p99, printed and saved for `bench-report`. Passes are repeated (each
/// after refilling the excess) until at least [`DURING_SAMPLES`] recordings ran during them, at
/// most [`MAX_PASSES`] passes; the recordings go round-robin over the data set's number of
/// sessions outside it (the quiet ones first, then those during the passes). A recording counts
/// as during a pass when it starts after the pass's task started and before it ended; when none
/// did, it says so and the result is n/a. Leaves the store at
/// the row cap, where the bench's own passes start.
fn record_beside_pruning(
    rt: &tokio::runtime::Runtime,
    b: &Backend,
    policy: &RetentionPolicy,
    data: Dataset,
    excess: usize,
) {
    let store: &dyn AwarenessStore = &*b.store;
    // Under `--test` one recording during a pass is enough, but passes are repeated as in a real
    // run until one is made: a pass on the small data set can end before any recording starts.
    let (quiet_n, want) = if test_mode() {
        (200, 1)
    } else {
        (2_000, DURING_SAMPLES)
    };
    let quiet = p99(rt.block_on(record_latencies(store, data.sessions(), 0, quiet_n)));
    let mut during = Vec::new();
    let mut passes = 0;
    // Recordings made, during the passes or not (the next one's index).
    let mut made = quiet_n;
    while during.len() < want && passes < MAX_PASSES {
        rt.block_on(load_dataset(&b.store, excess, data.sessions()));
        passes += 1;
        rt.block_on(async {
            let shared = Arc::clone(&b.store);
            let policy = *policy;
            // Set by the pass's task when it starts: a recording made before then (the task
            // not yet scheduled) ran beside no pass and is not counted.
            let started = Arc::new(AtomicBool::new(false));
            let pass = tokio::spawn({
                let started = Arc::clone(&started);
                async move {
                    started.store(true, Ordering::Release);
                    shared.prune(&policy, T0).await
                }
            });
            while !pass.is_finished() {
                let beside = started.load(Ordering::Acquire) && !pass.is_finished();
                let took = record_latencies(store, data.sessions(), made, 1).await;
                made += 1;
                if beside {
                    during.extend(took);
                }
                tokio::task::yield_now().await;
            }
            pass.await.expect("join").expect("prune");
        });
    }
    // A result with no recording during a pass measures nothing: said, and shown as n/a (a
    // pass on a small data set in memory can end before any recording starts, on a loaded
    // machine even ten times over; failing the run for it would fail CI for the machine's load).
    if during.is_empty() {
        println!(
            "prune/record_p99/{}: no recording started while any of {passes} pruning passes ran",
            b.name
        );
    }
    // Back to the cap exactly (the recordings during the last pass added a few rows), as the
    // bench's passes expect.
    rt.block_on(store.prune(policy, T0)).expect("prune");
    let show = |d: Option<Duration>| d.map_or_else(|| "n/a".into(), |d| format!("{d:?}"));
    let during_p99 = p99(during.clone());
    let during_max = during.iter().max().copied();
    println!(
        "prune/record_p99/{}: quiet {}, while pruning {} (the slowest {}; {} recordings during {passes} passes)",
        b.name,
        show(quiet),
        show(during_p99),
        show(during_max),
        during.len()
    );
    // Saved for bench-report; a `--test` run's small data set would only mislead it, and a run
    // that discards criterion's results (CI's short real run) keeps none of its own either.
    if !test_mode() && !std::env::args().any(|a| a == "--discard-baseline") {
        let ns = |d: Option<Duration>| d.map(|d| d.as_nanos() as u64);
        save_result(
            "awareness-prune",
            b.name,
            &serde_json::json!({
                "backend": b.name,
                "quiet_p99_ns": ns(quiet),
                "pruning_p99_ns": ns(during_p99),
                "pruning_max_ns": ns(during_max),
                "recordings_during": during.len(),
                "passes": passes,
                "quiet_recordings": quiet_n,
            }),
        );
    }
}

/// Recordings during pruning passes wanted for their p99 (at 100 the nearest-rank p99 is the
/// second largest).
const DURING_SAMPLES: usize = 300;
/// Most pruning passes run for [`DURING_SAMPLES`].
const MAX_PASSES: usize = 10;

/// Recording tasks of `record/concurrent_16_tasks`.
const TASKS: usize = 16;
/// Recordings per task between two checks of the row cap.
const CHUNK: usize = 256;

/// `record/concurrent_16_tasks`: 16 tokio tasks recording at once; one iteration is one
/// recording per task, so the report's throughput is events per second. Each durable store
/// runs with group commit (its default) and again with one transaction per event (`-1tx`).
fn record_concurrent(c: &mut Criterion) {
    let rt = runtime();
    let data = Dataset::standard();
    let backends = rt.block_on(loaded(&wanted(group_commit_specs()), data));
    let mut g = c.benchmark_group("record");
    g.throughput(Throughput::Elements(TASKS as u64));
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(20);
    for b in &backends {
        let capped = Capped::new(data);
        let fresh: Vec<_> = (0..data.sessions())
            .map(|i| dataset_session(data.sessions() + i))
            .collect();
        g.bench_function(BenchmarkId::new("concurrent_16_tasks", b.name), |bench| {
            bench.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    let chunk = left.min(CHUNK);
                    left -= chunk;
                    let n = capped.before(&rt, b, chunk * TASKS);
                    // Events are built outside the measurement.
                    let batches: Vec<Vec<_>> = (0..TASKS)
                        .map(|t| {
                            (0..chunk)
                                .map(|k| human(&fresh[(n + k * TASKS + t) % fresh.len()]))
                                .collect()
                        })
                        .collect();
                    total += rt.block_on(async {
                        let start = Instant::now();
                        let mut tasks = tokio::task::JoinSet::new();
                        for batch in batches {
                            let store = Arc::clone(&b.store);
                            tasks.spawn(async move {
                                for e in batch {
                                    let got = store.record(e, T0).await.expect("record");
                                    std::hint::black_box(got.event.sequence);
                                }
                            });
                        }
                        while let Some(done) = tasks.join_next().await {
                            done.expect("a recording task panicked");
                        }
                        start.elapsed()
                    });
                }
                total
            });
        });
    }
    g.finish();
}

/// `hints/*`: what store-sqlite's commit hints cost (DESIGN.md section 9.1: a handle asked for
/// hints polls `PRAGMA data_version` on a connection of its own).
///
/// - `poll/sqlite`: one poll, asked of an idle handle's poller and answered (its statement, and
///   the hand-offs to the poller's thread and back, which a timed poll does not pay): an upper
///   bound of what the default interval (20 ms) costs fifty times a second.
/// - `another_handles_commit/sqlite`: from the start of a recording by another handle on the
///   same file to the hint of it, at the default interval. Each recording starts right after
///   the last hint, so right after a poll: it waits a whole interval, the longest wait.
/// - `record_0_watchers/sqlite` and `record_0_watchers/sqlite-polling-1ms`: `record/0_watchers`
///   on the data set, on a handle nobody asked for hints and on one that polls every
///   millisecond (twenty times the default rate), where a poll that follows one of the
///   handle's own recordings also asks the write connection for its number: the cost a poller
///   adds to the handle's own writes, in the same run.
fn hints(c: &mut Criterion) {
    if !is_wanted("sqlite") {
        return;
    }
    let rt = runtime();
    let mut g = c.benchmark_group("hints");
    let dir = tempfile::tempdir().expect("temp dir");
    let options = SqliteOptions::new().commit_hint_interval(Duration::MAX);
    let idle = rt
        .block_on(SqliteStore::open_with(dir.path().join("poll.db"), options))
        .expect("open");
    let _hints =
        awareness_core::EventStore::commit_hints(&idle).expect("store-sqlite pushes hints");
    g.bench_function(BenchmarkId::new("poll", "sqlite"), |bench| {
        bench.iter(|| assert!(rt.block_on(idle.poll_commits_now()), "the poller runs"));
    });
    // Two handles on one file, as two gateway processes: from the start of the other handle's
    // recording to the hint of it, at the default interval.
    let shared = dir.path().join("shared.db");
    let (ours, theirs) = rt.block_on(async {
        let ours = SqliteStore::open(&shared).await.expect("open");
        let theirs = SqliteStore::open(&shared).await.expect("open");
        (ours, theirs)
    });
    let mut hints =
        awareness_core::EventStore::commit_hints(&ours).expect("store-sqlite pushes hints");
    let session = dataset_session(0);
    g.bench_function(
        BenchmarkId::new("another_handles_commit", "sqlite"),
        |bench| {
            bench.iter_custom(|iters| {
                let mut took = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    rt.block_on(async {
                        awareness_core::EventStore::record(&theirs, human(&session), T0)
                            .await
                            .expect("record");
                        assert!(hints.next().await, "a hint");
                    });
                    took += start.elapsed();
                }
                took
            });
        },
    );
    let data = Dataset::standard();
    let polling = SqliteOptions::new().commit_hint_interval(Duration::from_millis(1));
    let specs = [
        Spec {
            name: "sqlite",
            kind: Kind::Sqlite(SqliteOptions::new()),
        },
        Spec {
            name: "sqlite-polling-1ms",
            kind: Kind::Sqlite(polling),
        },
    ];
    let backends = rt.block_on(loaded(&specs, data));
    let fresh: Vec<_> = (0..data.sessions())
        .map(|i| dataset_session(data.sessions() + i))
        .collect();
    for b in &backends {
        // Kept for the group's length: the poller runs from the first call to the handle's end.
        let _stream = (b.name != "sqlite").then(|| b.store.commit_hints());
        let capped = Capped::new(data);
        g.bench_function(BenchmarkId::new("record_0_watchers", b.name), |bench| {
            bench_record(
                bench,
                &rt,
                b,
                &capped,
                |n| human(&fresh[n % fresh.len()]),
                0,
            );
        });
    }
    g.finish();
}

// The floor runs right after `record`: redb's record is judged against it, and this disk's
// fsync latency drifts within minutes, so the two are measured as close together as the groups
// allow.
criterion_group!(
    benches,
    record,
    floor,
    reconcile,
    sessions_list,
    acknowledge,
    turn,
    turn_among_cursors,
    sweep,
    pickup,
    hints,
    prune,
    record_concurrent
);
// `criterion_main!`, and then the loaded templates go (a static is never dropped).
fn main() {
    if test_mode() {
        p99_is_the_nearest_rank();
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
    awareness_benches::remove_templates();
}
