//! Store benches: one criterion group per user-visible operation, every backend side by side.
//!
//! Run: `cargo bench -p awareness-benches --bench stores`.

use std::sync::atomic::{AtomicUsize, Ordering};

use awareness_benches::{
    Backend, DATASET_EVENTS, DATASET_SESSIONS, T0, add_watchers, dataset_session, head, human,
    load_dataset, open_backends, poll_ready, runtime,
};
use awareness_core::{AwarenessStore, Sequence};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
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

fn record(c: &mut Criterion) {
    let rt = runtime();
    let backends = loaded(&rt);
    let mut g = c.benchmark_group("record");
    for b in &backends {
        let store: &dyn AwarenessStore = &*b.store;
        let i = AtomicUsize::new(0);
        g.bench_function(BenchmarkId::new("no_watchers", b.name), |bench| {
            bench.iter(|| {
                let n = i.fetch_add(1, Ordering::Relaxed);
                let s = dataset_session(DATASET_SESSIONS + n % DATASET_SESSIONS);
                run(&rt, b, store.record(human(&s), T0)).expect("record")
            });
        });
        let target = dataset_session(7);
        rt.block_on(add_watchers(store, &target, 10));
        g.bench_function(BenchmarkId::new("10_watchers", b.name), |bench| {
            bench.iter(|| {
                let got = run(&rt, b, store.record(human(&target), T0)).expect("record");
                assert_eq!(got.notices.len(), 10);
                got
            });
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

criterion_group!(benches, record, reconcile);
criterion_main!(benches);
