//! Scale run: records 1,000,000 events over 100,000 sessions from 16 concurrent tasks while the
//! default retention policy (50,000-row cap) prunes on a background task, as a gateway's hourly
//! pruning would but faster: a pass is asked for every 10,000 events (the task that records
//! the 10,000th waits, outside its recording's time, until a pass has begun) and every second
//! without one. A pass takes its time beside the recordings (store-memory's lets blocked
//! callers in between its steps), so how many events apart the passes began is reported.
//! Reports events per second, the p50/p99 recording latency, one reconcile at the end (a
//! 200-event page of a session just written: the median of 11 back-to-back reads, so a warm
//! read, not a cold one), the size of the store's files (for sqlite the database, its WAL and
//! its `-shm` index; for redb its one file; for postgres its schema's tables with their indexes,
//! on the server), peak memory (VmHWM) and the RSS sampled every
//! 100,000 events, and saves them for `bench-report` in `<target>/awareness-scale/<backend>.json`
//! (unless `--no-save`). Memory is reported, not checked: `bench-report` gives the slope of the
//! RSS samples, and a run whose memory grows passes.
//!
//! ```sh
//! cargo run --release -p awareness-benches --example scale -- --backend sqlite
//! cargo run --release -p awareness-benches --example scale -- --backend redb \
//!     --events 1000000 --sessions 100000 --tasks 16
//! cargo run --release -p awareness-benches --example scale -- --backend memory \
//!     --events 60000 --sessions 2000 --max-rows 20000 --no-save   # a quick check (CI)
//! ```
//!
//! Backends: `memory`, `sqlite`, `redb` (`Immediate` durability), `redb-bounded`, `postgres`
//! (in a fresh schema on the server `AWARENESS_PG_URL` names, dropped at the end; the memory
//! figures are this process's, not the server's), and `sqlite-1tx` / `redb-1tx` (group commit
//! off).

// Counts, bytes and nanoseconds reported here stay far below 2^52.
#![allow(clippy::cast_precision_loss)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use awareness_benches::{
    Kind, Spec, T0, dataset_session, group_commit_specs, human, open_empty, runtime, save_result,
};
use awareness_core::{AwarenessStoreExt as _, RetentionPolicy, Sequence, Timestamp};

/// The command line.
struct Args {
    backend: String,
    events: usize,
    sessions: usize,
    tasks: usize,
    prune_every: Duration,
    prune_every_events: usize,
    sample_every: usize,
    /// The row cap pruning keeps the log to (the default policy's unless given).
    max_rows: u64,
    save: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: scale --backend memory|sqlite|sqlite-1tx|redb|redb-1tx|redb-bounded|postgres \
         [--events N] [--sessions N] \
         [--tasks N] [--prune-every-ms N] [--prune-every-events N] [--sample-every N] \
         [--max-rows N] [--no-save]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut args = Args {
        backend: "sqlite".into(),
        events: 1_000_000,
        sessions: 100_000,
        tasks: 16,
        prune_every: Duration::from_secs(1),
        prune_every_events: 10_000,
        sample_every: 100_000,
        max_rows: RetentionPolicy::default().max_rows,
        save: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage());
        let mut number = || value().parse::<usize>().unwrap_or_else(|_| usage());
        match flag.as_str() {
            "--backend" => args.backend = value(),
            "--events" => args.events = number(),
            "--sessions" => args.sessions = number().max(1),
            "--tasks" => args.tasks = number().max(1),
            "--prune-every-ms" => args.prune_every = Duration::from_millis(number() as u64),
            "--prune-every-events" => args.prune_every_events = number().max(1),
            "--sample-every" => args.sample_every = number().max(1),
            "--max-rows" => args.max_rows = number().max(1) as u64,
            "--no-save" => args.save = false,
            _ => usage(),
        }
    }
    // Ten RSS samples at least, so a short run still shows whether memory stays flat.
    args.sample_every = args.sample_every.min((args.events / 10).max(1));
    args
}

/// Recording latencies in log-linear buckets (16 per power of two, about 6% wide), so memory
/// does not grow with the number of events.
struct Histogram {
    buckets: Vec<AtomicU64>,
}

impl Histogram {
    const SUB: u32 = 16;

    fn new() -> Self {
        Self {
            buckets: (0..64 * Self::SUB).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn index(ns: u64) -> usize {
        let ns = ns.max(1);
        let log = ns.ilog2();
        let sub = if log >= 4 {
            (ns >> (log - 4)) as u32 & (Self::SUB - 1)
        } else {
            0
        };
        (log * Self::SUB + sub) as usize
    }

    /// The middle of bucket `i`, in ns.
    fn value(i: usize) -> f64 {
        let (log, sub) = (i as u32 / Self::SUB, i as u32 % Self::SUB);
        let base = 2f64.powi(log as i32);
        base * (1.0 + (f64::from(sub) + 0.5) / f64::from(Self::SUB))
    }

    fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[Self::index(ns)].fetch_add(1, Ordering::Relaxed);
    }

    fn quantile(&self, q: f64) -> f64 {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value(i);
            }
        }
        f64::NAN
    }
}

/// A field of `/proc/self/status` in KiB (`VmRSS`, `VmHWM`); 0 where there is none.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let args = parse_args();
    let spec: Spec = group_commit_specs()
        .into_iter()
        .find(|s| s.name == args.backend)
        .unwrap_or_else(|| usage());
    let rt = runtime();
    let backend = rt.block_on(open_empty(&spec));
    let store = Arc::clone(&backend.store);
    let start = Instant::now();
    let now = move || Timestamp(T0.0 + start.elapsed().as_millis() as i64);
    let latencies = Arc::new(Histogram::new());
    let rss_kib = Arc::new(std::sync::Mutex::new(Vec::new()));
    eprintln!(
        "scale: {} events over {} sessions on {} from {} tasks, pruning every {:?} or {} events",
        args.events,
        args.sessions,
        spec.name,
        args.tasks,
        args.prune_every,
        args.prune_every_events
    );

    let policy = RetentionPolicy {
        max_rows: args.max_rows,
        ..RetentionPolicy::default()
    };
    let recorded = Arc::new(AtomicUsize::new(0));
    let (elapsed, mut prune_passes, mut pruned, widest_gap) = rt.block_on(async {
        let done = Arc::new(AtomicBool::new(false));
        // The recording task that crosses each `prune_every_events` mark asks for a pass and
        // waits until one has begun (not until it ends): on a runtime whose tasks never wait
        // for the store (store-memory), a pruner left to wake by itself ran when a worker
        // happened to reach it, and let the log grow to three times its cap (review, stop
        // 57). A second without a pass starts one too.
        let wanted = Arc::new(tokio::sync::Notify::new());
        let (began, began_rx) = tokio::sync::watch::channel(0u64);
        let pruner = {
            let (store, done, recorded, wanted) = (
                Arc::clone(&store),
                Arc::clone(&done),
                Arc::clone(&recorded),
                Arc::clone(&wanted),
            );
            let every = args.prune_every;
            tokio::spawn(async move {
                let (mut passes, mut rows, mut last_count, mut widest_gap) = (0u64, 0u64, 0, 0);
                loop {
                    tokio::select! {
                        () = wanted.notified() => {}
                        () = tokio::time::sleep(every) => {}
                    }
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    let count = recorded.load(Ordering::Relaxed);
                    widest_gap = widest_gap.max(count - last_count);
                    last_count = count;
                    passes += 1;
                    began.send_replace(passes);
                    let report = store.prune(&policy, now()).await.expect("prune");
                    rows += report.events_by_cap + report.events_by_age;
                }
                (passes, rows, widest_gap)
            })
        };
        let next = Arc::new(AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..args.tasks {
            let (store, next, recorded, latencies, rss_kib, wanted) = (
                Arc::clone(&store),
                Arc::clone(&next),
                Arc::clone(&recorded),
                Arc::clone(&latencies),
                Arc::clone(&rss_kib),
                Arc::clone(&wanted),
            );
            let mut began = began_rx.clone();
            let (events, sessions, sample_every, prune_every_events) = (
                args.events,
                args.sessions,
                args.sample_every,
                args.prune_every_events,
            );
            tasks.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= events {
                        break;
                    }
                    let e = human(&dataset_session(i % sessions));
                    let t = Instant::now();
                    store.record(e, now()).await.expect("record");
                    latencies.record(t.elapsed());
                    let n = recorded.fetch_add(1, Ordering::Relaxed) + 1;
                    if n % prune_every_events == 0 {
                        // Outside the recording's time.
                        let asked = *began.borrow_and_update();
                        wanted.notify_one();
                        began
                            .wait_for(|passes| *passes > asked)
                            .await
                            .expect("the pruner runs until the recordings end");
                    } else if n % 64 == 0 {
                        // store-memory never makes a task wait: let the other tasks run too.
                        tokio::task::yield_now().await;
                    }
                    if n % sample_every == 0 {
                        let rss = status_kib("VmRSS");
                        rss_kib.lock().expect("rss samples").push(rss);
                        eprintln!(
                            "  {n:>9} events  {:>7.1} s  rss {:.0} MiB",
                            start.elapsed().as_secs_f64(),
                            rss as f64 / 1024.0
                        );
                    }
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.expect("a recording task panicked");
        }
        let elapsed = start.elapsed();
        done.store(true, Ordering::Relaxed);
        wanted.notify_one();
        let (passes, rows, widest_gap) = pruner.await.expect("the pruning task panicked");
        (elapsed, passes, rows, widest_gap)
    });

    // Pruning ran beside the recordings: every task that crossed a mark waited for a pass to
    // begin (CI's small runs pass a small `--prune-every-events`).
    assert!(
        args.events < args.prune_every_events || prune_passes > 0,
        "no pruning pass began while {} events were recorded",
        args.events
    );

    // The row cap held: one last pass, and the log keeps exactly what the cap says (no event is
    // old enough for the age step), every other row deleted by a pass. A run whose events
    // exceed the cap checks it: CI's small runs pass a small `--max-rows`.
    let last = rt
        .block_on(store.prune(&policy, now()))
        .expect("the last pass");
    pruned += last.events_by_cap + last.events_by_age;
    prune_passes += 1;
    let retained = rt.block_on(store.log_stats()).expect("log stats").rows;
    assert_eq!(
        retained,
        (args.events as u64).min(args.max_rows),
        "the row cap of {} kept {retained} of {} events",
        args.max_rows,
        args.events
    );
    assert_eq!(
        pruned + retained,
        args.events as u64,
        "every event is retained or was pruned"
    );

    // One reconcile at the end: a session gets 200 events, then its page is read 11 times back
    // to back and the median kept. The session was just written and the first read warms
    // whatever it did not, so this is a warm read, not a cold one.
    let target = dataset_session(args.sessions + 1);
    let reconcile_ns = rt.block_on(async {
        for _ in 0..200 {
            store.record(human(&target), now()).await.expect("record");
        }
        let mut times: Vec<f64> = Vec::new();
        for _ in 0..11 {
            let t = Instant::now();
            let page = store
                .changes_since(&target, Sequence::ZERO, 200)
                .await
                .expect("reconcile");
            times.push(t.elapsed().as_nanos() as f64);
            assert_eq!(page.events.len(), 200);
        }
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    });
    // None for store-memory, which has no file.
    let file_bytes = rt.block_on(backend.stored_bytes());
    let stored = if matches!(spec.kind, Kind::Postgres { .. }) {
        "schema (tables, indexes)"
    } else {
        "files (db, WAL, shm)"
    };
    let events_per_sec = args.events as f64 / elapsed.as_secs_f64();
    let (p50, p99) = (latencies.quantile(0.50), latencies.quantile(0.99));
    let vm_hwm = status_kib("VmHWM");
    let rss = rss_kib.lock().expect("rss samples").clone();
    println!(
        "scale/{}: {} events over {} sessions in {:.1} s = {:.0} events/s; record p50 {:.1} µs, \
         p99 {:.1} µs; reconcile/200 at the end (median of 11 warm reads of a just-written \
         session) {:.1} µs; {} pruning passes while recording (at most {} events apart) and \
         one after it deleted {} rows, {} retained (then the reconcile's 200 events); {stored} \
         {:.1} MiB; VmHWM {:.1} MiB; RSS (MiB) {:?}",
        spec.name,
        args.events,
        args.sessions,
        elapsed.as_secs_f64(),
        events_per_sec,
        p50 / 1e3,
        p99 / 1e3,
        reconcile_ns / 1e3,
        prune_passes - 1,
        widest_gap,
        pruned,
        retained,
        file_bytes.unwrap_or(0) as f64 / 1_048_576.0,
        vm_hwm as f64 / 1024.0,
        rss.iter().map(|k| k / 1024).collect::<Vec<_>>()
    );
    if args.save {
        let json = serde_json::json!({
            "backend": spec.name,
            "events": args.events,
            "sessions": args.sessions,
            "tasks": args.tasks,
            "seconds": elapsed.as_secs_f64(),
            "events_per_sec": events_per_sec,
            "p50_ns": p50,
            "p99_ns": p99,
            "reconcile_200_ns": reconcile_ns,
            "prune_every_ms": args.prune_every.as_millis() as u64,
            "prune_every_events": args.prune_every_events,
            "prune_passes": prune_passes,
            "most_events_between_passes": widest_gap,
            "max_rows": args.max_rows,
            "pruned_rows": pruned,
            "file_bytes": file_bytes,
            "vm_hwm_kib": vm_hwm,
            "rss_every_events": args.sample_every,
            "rss_kib": rss,
        });
        let path = save_result("awareness-scale", spec.name, &json);
        eprintln!("saved {}", path.display());
    }
    drop(store);
    drop(backend);
}

#[cfg(test)]
// The buckets' middles are exact binary fractions: compared exactly.
#[allow(clippy::float_cmp)]
mod tests {
    use super::{Histogram, status_kib};
    use std::time::Duration;

    /// A latency lands in the bucket of its power of two and of its sixteenth of it, and the
    /// bucket reports its middle: the p50 and p99 the scale run prints are those middles.
    /// (What the mutation did: the sixteenths began at 2^5 ns instead of 2^4, or a bucket
    /// reported its lower edge instead of its middle; review of stop 68, BS01, BS02.)
    #[test]
    fn a_latency_is_reported_as_the_middle_of_its_bucket() {
        assert_eq!(Histogram::index(16), 64);
        assert_eq!(
            Histogram::index(24),
            72,
            "16..32 ns has sixteen buckets of 1 ns"
        );
        assert_eq!(Histogram::index(31), 79);
        assert_eq!(Histogram::value(72), 24.5);
        // 1,000 ns: 2^9 = 512 and the sixteenth of (1000 >> 5) & 15 = 15, so 512 * (1 + 15.5 / 16).
        assert_eq!(Histogram::value(Histogram::index(1_000)), 1_008.0);
        // From 16 ns up (below it, one bucket per power of two).
        for ns in [16u64, 17, 100, 999, 1_000, 123_456, 10_000_000] {
            let v = Histogram::value(Histogram::index(ns));
            assert!(
                (v - ns as f64).abs() <= ns as f64 / 16.0,
                "{ns} ns reported as {v} ns"
            );
        }
    }

    /// A quantile is the nearest rank's bucket: the `ceil(q n)`-th smallest latency, counting
    /// the latencies in the buckets below it; an empty histogram has none.
    /// (What the mutation did: the rank rounded down, or the bucket that reaches the rank was
    /// passed over for the next one; review of stop 68, BS03, BS04.)
    #[test]
    fn a_quantile_is_the_nearest_rank() {
        let us = Histogram::value(Histogram::index(1_000));
        let ms = Histogram::value(Histogram::index(1_000_000));
        let h = Histogram::new();
        assert!(h.quantile(0.5).is_nan(), "no latency, no quantile");
        // 99 fast recordings and one slow: the 99th of 100 is fast, the 100th slow.
        for _ in 0..99 {
            h.record(Duration::from_micros(1));
        }
        h.record(Duration::from_millis(1));
        assert_eq!(h.quantile(0.99), us, "p99 of 99 fast and one slow");
        assert_eq!(h.quantile(0.999), ms);
        assert_eq!(h.quantile(0.5), us);
        // Three recordings, one fast: the p50 is the 2nd (ceil(1.5)), a slow one.
        let h = Histogram::new();
        h.record(Duration::from_micros(1));
        h.record(Duration::from_millis(1));
        h.record(Duration::from_millis(1));
        assert_eq!(h.quantile(0.5), ms, "p50 of one fast and two slow");
        assert_eq!(h.quantile(0.01), us);
    }

    /// The memory figures read `/proc/self/status` in KiB (its values end in "kB"); a field
    /// it lacks reads as 0. (What the mutation did: the "kB" was kept, so every figure read
    /// as 0; review of stop 68, BS05.)
    #[test]
    fn status_fields_are_read_in_kib() {
        if !std::path::Path::new("/proc/self/status").exists() {
            return;
        }
        let (rss, hwm) = (status_kib("VmRSS"), status_kib("VmHWM"));
        assert!(rss > 0, "VmRSS read as 0");
        assert!(hwm >= rss, "VmHWM {hwm} below VmRSS {rss}");
        assert_eq!(status_kib("VmNoSuchField"), 0);
    }
}
