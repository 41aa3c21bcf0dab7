//! Store benches: one criterion group per user-visible operation, every backend side by side.
//!
//! Run: `cargo bench -p awareness-benches --bench stores`.

// Criterion's idiom: `c` the criterion, `g` a group, `b` a backend, `bench` the bencher.
#![allow(clippy::many_single_char_names)]

use std::sync::atomic::{AtomicUsize, Ordering};

use awareness_benches::{
    Backend, DATASET_EVENTS, DATASET_SESSIONS, T0, add_watchers, dataset_session, head, human,
    load_dataset, open_backends, poll_ready, runtime,
};
use awareness_core::{AwarenessStore, AwarenessStoreExt as _, RetentionPolicy, Sequence};
use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;

/// Runs one store call: memory is polled directly, durable stores on the runtime.
fn run<T>(rt: &Runtime, b: &Backend, f: impl std::future::Future<Output = T>) -> T {
    if b.name == "memory" {
        poll_ready(f)
    } else {
        rt.block_on(f)
    }
}

fn loaded(rt: &Runtime) -> Vec<Backend> {
    let backends = rt.block_on(open_backends());
    for b in &backends {
        rt.block_on(load_dataset(&*b.store, DATASET_EVENTS, DATASET_SESSIONS));
    }
    backends
}

/// Keeps a store at the data set's size while a record bench runs, as the 50,000-row cap does in
/// a gateway: every 10,000 recordings a pruning pass runs in the un-measured set-up.
fn keep_capped(rt: &Runtime, b: &Backend, n: usize) {
    if n % 10_000 == 9_999 {
        run(rt, b, b.store.prune(&RetentionPolicy::default(), T0)).expect("prune");
    }
}

fn record(c: &mut Criterion) {
    let rt = runtime();
    let backends = loaded(&rt);
    let mut g = c.benchmark_group("record");
    for b in &backends {
        let store: &dyn AwarenessStore = &*b.store;
        // Events are built outside the measurement: the bench measures the store.
        let fresh: Vec<_> = (0..DATASET_SESSIONS)
            .map(|i| dataset_session(DATASET_SESSIONS + i))
            .collect();
        let i = AtomicUsize::new(0);
        g.bench_function(BenchmarkId::new("no_watchers", b.name), |bench| {
            bench.iter_batched(
                || {
                    let n = i.fetch_add(1, Ordering::Relaxed);
                    keep_capped(&rt, b, n);
                    human(&fresh[n % fresh.len()])
                },
                // The result is dropped inside the measurement, as a caller drops it, so the
                // harness does not collect outputs into a growing buffer.
                |e| {
                    let got = run(&rt, b, store.record(e, T0)).expect("record");
                    std::hint::black_box(got.event.sequence);
                },
                BatchSize::SmallInput,
            );
        });
        let target = dataset_session(7);
        rt.block_on(add_watchers(store, &target, 10));
        g.bench_function(BenchmarkId::new("10_watchers", b.name), |bench| {
            bench.iter_batched(
                || {
                    keep_capped(&rt, b, i.fetch_add(1, Ordering::Relaxed));
                    human(&target)
                },
                |e| {
                    let got = run(&rt, b, store.record(e, T0)).expect("record");
                    assert_eq!(got.notices.len(), 10);
                    std::hint::black_box(got.event.sequence);
                },
                BatchSize::SmallInput,
            );
        });
    }
    g.finish();
}

fn reconcile(c: &mut Criterion) {
    let rt = runtime();
    let backends = loaded(&rt);
    let mut g = c.benchmark_group("reconcile");
    // 50 events per session in the data set: a session gets 200 more so a full page exists.
    let target = dataset_session(11);
    for b in &backends {
        let store: &dyn AwarenessStore = &*b.store;
        for _ in 0..200 {
            rt.block_on(store.record(human(&target), T0))
                .expect("record");
        }
        let last = rt.block_on(head(store, &target)).get();
        for (name, limit, after) in [("200", 200usize, 0u64), ("5", 5, last - 5)] {
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

/// The floor of `record` on redb: a bare one-key insert per write transaction on a separate
/// redb file, per durability (`immediate`: fsynced; `none`: redb's `Durability::None`, as
/// `redb-bounded` commits), called directly and through `spawn_blocking` as the store calls redb.
fn floor(c: &mut Criterion) {
    const TABLE: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("floor");
    let rt = runtime();
    let dir = tempfile::tempdir().expect("temp dir for the floor");
    let db = std::sync::Arc::new(
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
        g.bench_function(BenchmarkId::new("insert_one_key", mode), |bench| {
            bench.iter(|| insert(&db, n.fetch_add(1, Ordering::Relaxed)));
        });
        g.bench_function(
            BenchmarkId::new("insert_one_key_spawn_blocking", mode),
            |bench| {
                bench.iter(|| {
                    let (db, k) = (
                        std::sync::Arc::clone(&db),
                        n.fetch_add(1, Ordering::Relaxed),
                    );
                    rt.block_on(async {
                        tokio::task::spawn_blocking(move || insert(&db, k)).await
                    })
                    .expect("join");
                });
            },
        );
    }
    g.finish();
}

/// Rows above the data set that one pruning pass removes (60,000 down to 50,000).
const PRUNE_EXCESS: usize = 10_000;

/// Latencies of `n` recordings on fresh sessions.
async fn record_latencies(store: &dyn AwarenessStore, n: usize) -> Vec<std::time::Duration> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let e = human(&dataset_session(
            2 * DATASET_SESSIONS + i % DATASET_SESSIONS,
        ));
        let t = std::time::Instant::now();
        store.record(e, T0).await.expect("record");
        out.push(t.elapsed());
    }
    out
}

fn p99(mut v: Vec<std::time::Duration>) -> Option<std::time::Duration> {
    v.sort();
    v.get((v.len() * 99 / 100).min(v.len().saturating_sub(1)))
        .copied()
}

/// One pruning pass from 60,000 rows down to 50,000 (row cap, in the default chunks of 2,000
/// rows), and beside it the p99 of recording while such a pass runs against the quiet p99.
fn prune(c: &mut Criterion) {
    let rt = runtime();
    let backends = loaded(&rt);
    let policy = RetentionPolicy {
        max_rows: DATASET_EVENTS as u64,
        ..RetentionPolicy::default()
    };
    let refill = |store: &dyn AwarenessStore| {
        rt.block_on(load_dataset(store, PRUNE_EXCESS, DATASET_SESSIONS));
    };
    let mut g = c.benchmark_group("prune");
    g.sample_size(10);
    for b in &backends {
        let store: &dyn AwarenessStore = &*b.store;
        g.bench_function(BenchmarkId::new("60k_to_50k", b.name), |bench| {
            bench.iter_custom(|iters| {
                let mut total = std::time::Duration::ZERO;
                for _ in 0..iters {
                    refill(store);
                    let t = std::time::Instant::now();
                    let report = run(&rt, b, store.prune(&policy, T0)).expect("prune");
                    total += t.elapsed();
                    assert_eq!(report.events_by_cap, PRUNE_EXCESS as u64);
                }
                total
            });
        });
        // Recording while a pass runs on another task, against recording alone.
        refill(store);
        let quiet = p99(rt.block_on(record_latencies(store, 2_000)));
        let pruning = rt.block_on(async {
            let shared = std::sync::Arc::clone(&b.store);
            let pass = tokio::spawn(async move { shared.prune(&policy, T0).await });
            let mut during = Vec::new();
            while !pass.is_finished() {
                during.extend(record_latencies(store, 1).await);
                tokio::task::yield_now().await;
            }
            pass.await.expect("join").expect("prune");
            during
        });
        let show =
            |d: Option<std::time::Duration>| d.map_or_else(|| "n/a".into(), |d| format!("{d:?}"));
        println!(
            "prune/record_p99/{}: quiet {}, while pruning {} ({} recordings during the pass)",
            b.name,
            show(quiet),
            show(p99(pruning.clone())),
            pruning.len()
        );
    }
    g.finish();
}

criterion_group!(benches, record, reconcile, floor, prune);
criterion_main!(benches);
