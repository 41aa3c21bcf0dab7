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
use awareness_core::{
    AwarenessStore, AwarenessStoreExt as _, PruneReport, RetentionPolicy, Sequence, SessionRef,
    Timestamp,
};

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

impl Args {
    /// The arguments after the program's name; `None` for a flag this run does not know or a
    /// value that is missing or not a number.
    fn parse(args: impl IntoIterator<Item = String>) -> Option<Self> {
        let mut parsed = Self {
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
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            if flag == "--no-save" {
                parsed.save = false;
                continue;
            }
            let value = it.next()?;
            let number = value.parse::<usize>().ok();
            match flag.as_str() {
                "--backend" => parsed.backend = value,
                "--events" => parsed.events = number?,
                "--sessions" => parsed.sessions = number?.max(1),
                "--tasks" => parsed.tasks = number?.max(1),
                "--prune-every-ms" => parsed.prune_every = Duration::from_millis(number? as u64),
                "--prune-every-events" => parsed.prune_every_events = number?.max(1),
                "--sample-every" => parsed.sample_every = number?.max(1),
                "--max-rows" => parsed.max_rows = number?.max(1) as u64,
                _ => return None,
            }
        }
        // Ten RSS samples at least, so a short run still shows whether memory stays flat.
        parsed.sample_every = parsed.sample_every.min((parsed.events / 10).max(1));
        Some(parsed)
    }
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

/// The process's resident memory now (`VmRSS`), in KiB: the samples taken while recording.
fn rss_kib() -> u64 {
    status_kib("VmRSS")
}

/// The process's peak resident memory so far (`VmHWM`), in KiB.
fn peak_kib() -> u64 {
    status_kib("VmHWM")
}

/// The run's clock: event times start at [`T0`] and advance with the wall clock.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn now(self) -> Timestamp {
        Timestamp(T0.0 + self.0.elapsed().as_millis() as i64)
    }
}

/// The pruning passes' tally.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Passes {
    /// Passes begun.
    begun: u64,
    /// Rows they deleted.
    rows: u64,
    /// Events recorded when the last pass began.
    last_count: usize,
    /// The most events recorded between two passes' beginnings while recording.
    widest_gap: usize,
}

impl Passes {
    /// A pass begins while recording, with `count` events recorded: returns its number.
    fn begin(&mut self, count: usize) -> u64 {
        self.widest_gap = self.widest_gap.max(count - self.last_count);
        self.last_count = count;
        self.begun += 1;
        self.begun
    }

    /// A pass deleted what `report` says.
    fn deleted(&mut self, report: &PruneReport) {
        self.rows += report.events_by_cap + report.events_by_age;
    }
}

/// What a run measured.
struct Outcome {
    /// The time of the recordings (not of the checks and the reconcile after them).
    elapsed: Duration,
    latencies: Arc<Histogram>,
    /// `VmRSS` every `sample_every` events, in KiB.
    rss_kib: Vec<u64>,
    /// Every pass, the one after the recordings included (its gap is not counted).
    passes: Passes,
    /// Rows in the log after the last pass.
    retained: u64,
    /// The median of the reconcile's reads, in ns.
    reconcile_ns: f64,
    /// `VmHWM` at the end, in KiB.
    vm_hwm_kib: u64,
}

/// Records `args.events` events over `args.sessions` sessions from `args.tasks` tasks while a
/// task prunes to `args.max_rows` (asked at each `prune_every_events` mark, and every
/// `prune_every` without one), makes one last pass and checks the row cap held, then times
/// the reconcile.
async fn run(store: &Arc<dyn AwarenessStore>, args: &Args, clock: Clock) -> Outcome {
    let policy = RetentionPolicy {
        max_rows: args.max_rows,
        ..RetentionPolicy::default()
    };
    let latencies = Arc::new(Histogram::new());
    let rss = Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorded = Arc::new(AtomicUsize::new(0));
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
            Arc::clone(store),
            Arc::clone(&done),
            Arc::clone(&recorded),
            Arc::clone(&wanted),
        );
        let every = args.prune_every;
        tokio::spawn(async move {
            let mut tally = Passes::default();
            loop {
                tokio::select! {
                    () = wanted.notified() => {}
                    () = tokio::time::sleep(every) => {}
                }
                if done.load(Ordering::Relaxed) {
                    break;
                }
                began.send_replace(tally.begin(recorded.load(Ordering::Relaxed)));
                let report = store.prune(&policy, clock.now()).await.expect("prune");
                tally.deleted(&report);
            }
            tally
        })
    };
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.tasks {
        let (store, next, recorded, latencies, rss, wanted) = (
            Arc::clone(store),
            Arc::clone(&next),
            Arc::clone(&recorded),
            Arc::clone(&latencies),
            Arc::clone(&rss),
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
                store.record(e, clock.now()).await.expect("record");
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
                    let kib = rss_kib();
                    rss.lock().expect("rss samples").push(kib);
                    eprintln!(
                        "  {n:>9} events  {:>7.1} s  rss {:.0} MiB",
                        clock.0.elapsed().as_secs_f64(),
                        kib as f64 / 1024.0
                    );
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("a recording task panicked");
    }
    let elapsed = clock.0.elapsed();
    done.store(true, Ordering::Relaxed);
    wanted.notify_one();
    let mut passes = pruner.await.expect("the pruning task panicked");

    // Pruning ran beside the recordings: every task that crossed a mark waited for a pass to
    // begin (CI's small runs pass a small `--prune-every-events`).
    assert!(
        args.events < args.prune_every_events || passes.begun > 0,
        "no pruning pass began while {} events were recorded",
        args.events
    );

    // The row cap held: one last pass, and the log keeps exactly what the cap says (no event is
    // old enough for the age step), every other row deleted by a pass. A run whose events
    // exceed the cap checks it: CI's small runs pass a small `--max-rows`.
    let last = store
        .prune(&policy, clock.now())
        .await
        .expect("the last pass");
    passes.deleted(&last);
    passes.begun += 1;
    let retained = store.log_stats().await.expect("log stats").rows;
    assert_eq!(
        retained,
        (args.events as u64).min(args.max_rows),
        "the row cap of {} kept {retained} of {} events",
        args.max_rows,
        args.events
    );
    assert_eq!(
        passes.rows + retained,
        args.events as u64,
        "every event is retained or was pruned"
    );

    let reconcile_ns = reconcile_at_end(store, args.sessions, clock).await;
    let rss_kib = rss.lock().expect("rss samples").clone();
    Outcome {
        elapsed,
        latencies,
        rss_kib,
        passes,
        retained,
        reconcile_ns,
        vm_hwm_kib: peak_kib(),
    }
}

/// The session the reconcile at the end reads: one of no event of the data set's.
fn reconcile_target(sessions: usize) -> SessionRef {
    dataset_session(sessions + 1)
}

/// One reconcile at the end: a session gets 200 events, then its page is read 11 times back
/// to back and the median kept (ns). The session was just written and the first read warms
/// whatever it did not, so this is a warm read, not a cold one.
async fn reconcile_at_end(store: &Arc<dyn AwarenessStore>, sessions: usize, clock: Clock) -> f64 {
    let target = reconcile_target(sessions);
    for _ in 0..200 {
        store
            .record(human(&target), clock.now())
            .await
            .expect("record");
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
    median(times)
}

/// The middle of `times` in order (of an even count, the upper of the two middles).
fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

impl Outcome {
    fn events_per_sec(&self, args: &Args) -> f64 {
        args.events as f64 / self.elapsed.as_secs_f64()
    }

    /// The line the run prints: `stored` says what `file_bytes` counts.
    fn line(&self, args: &Args, name: &str, stored: &str, file_bytes: Option<u64>) -> String {
        format!(
            "scale/{}: {} events over {} sessions in {:.1} s = {:.0} events/s; record p50 {:.1} \
             µs, p99 {:.1} µs; reconcile/200 at the end (median of 11 warm reads of a \
             just-written session) {:.1} µs; {} pruning passes while recording (at most {} events \
             apart) and one after it deleted {} rows, {} retained (then the reconcile's 200 \
             events); {stored} {:.1} MiB; VmHWM {:.1} MiB; RSS (MiB) {:?}",
            name,
            args.events,
            args.sessions,
            self.elapsed.as_secs_f64(),
            self.events_per_sec(args),
            self.latencies.quantile(0.50) / 1e3,
            self.latencies.quantile(0.99) / 1e3,
            self.reconcile_ns / 1e3,
            self.passes.begun - 1,
            self.passes.widest_gap,
            self.passes.rows,
            self.retained,
            file_bytes.unwrap_or(0) as f64 / 1_048_576.0,
            self.vm_hwm_kib as f64 / 1024.0,
            self.rss_kib.iter().map(|k| k / 1024).collect::<Vec<_>>()
        )
    }

    /// What `bench-report` reads.
    fn json(&self, args: &Args, name: &str, file_bytes: Option<u64>) -> serde_json::Value {
        serde_json::json!({
            "backend": name,
            "events": args.events,
            "sessions": args.sessions,
            "tasks": args.tasks,
            "seconds": self.elapsed.as_secs_f64(),
            "events_per_sec": self.events_per_sec(args),
            "p50_ns": self.latencies.quantile(0.50),
            "p99_ns": self.latencies.quantile(0.99),
            "reconcile_200_ns": self.reconcile_ns,
            "prune_every_ms": args.prune_every.as_millis() as u64,
            "prune_every_events": args.prune_every_events,
            "prune_passes": self.passes.begun,
            "most_events_between_passes": self.passes.widest_gap,
            "max_rows": args.max_rows,
            "pruned_rows": self.passes.rows,
            "file_bytes": file_bytes,
            "vm_hwm_kib": self.vm_hwm_kib,
            "rss_every_events": args.sample_every,
            "rss_kib": self.rss_kib,
        })
    }
}

fn main() {
    let args = Args::parse(std::env::args().skip(1)).unwrap_or_else(|| usage());
    let spec: Spec = group_commit_specs()
        .into_iter()
        .find(|s| s.name == args.backend)
        .unwrap_or_else(|| usage());
    let rt = runtime();
    let backend = rt.block_on(open_empty(&spec));
    let store = Arc::clone(&backend.store);
    eprintln!(
        "scale: {} events over {} sessions on {} from {} tasks, pruning every {:?} or {} events",
        args.events,
        args.sessions,
        spec.name,
        args.tasks,
        args.prune_every,
        args.prune_every_events
    );
    let outcome = rt.block_on(run(&store, &args, Clock(Instant::now())));
    // None for store-memory, which has no file.
    let file_bytes = rt.block_on(backend.stored_bytes());
    let stored = if matches!(spec.kind, Kind::Postgres { .. }) {
        "schema (tables, indexes)"
    } else {
        "files (db, WAL, shm)"
    };
    println!("{}", outcome.line(&args, spec.name, stored, file_bytes));
    if args.save {
        let path = save_result(
            "awareness-scale",
            spec.name,
            &outcome.json(&args, spec.name, file_bytes),
        );
        eprintln!("saved {}", path.display());
    }
    drop(store);
    drop(backend);
}

#[cfg(test)]
// The buckets' middles are exact binary fractions: compared exactly.
#[allow(clippy::float_cmp)]
mod tests {
    use super::{
        Args, Clock, Histogram, Outcome, Passes, median, peak_kib, reconcile_target, rss_kib, run,
        status_kib,
    };
    use awareness_benches::{Spec, dataset_session, group_commit_specs, open_empty};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn args(list: &[&str]) -> Option<Args> {
        Args::parse(list.iter().map(|a| (*a).to_owned()))
    }

    /// Flags set what they name, a run of fewer than ten samples' events samples ten times, and
    /// a flag this run does not know, a missing value or one not a number is refused.
    /// (What the mutation did: the sample interval was raised to a tenth of the events instead
    /// of lowered to it, so CI's runs took no RSS sample; review of stop 69, BS06.)
    #[test]
    fn flags_parse_and_a_short_run_still_takes_ten_rss_samples() {
        let a = args(&[]).expect("no flags");
        assert_eq!(
            (a.backend.as_str(), a.events, a.sessions),
            ("sqlite", 1_000_000, 100_000)
        );
        assert_eq!(
            (a.tasks, a.prune_every_events, a.sample_every),
            (16, 10_000, 100_000)
        );
        assert!(a.save);
        let a = args(&[
            "--backend",
            "memory",
            "--events",
            "60000",
            "--sessions",
            "2000",
            "--no-save",
            "--max-rows",
            "20000",
            "--prune-every-events",
            "1000",
            "--prune-every-ms",
            "250",
            "--tasks",
            "3",
        ])
        .expect("CI's flags");
        assert_eq!(
            (a.backend.as_str(), a.events, a.sessions),
            ("memory", 60_000, 2_000)
        );
        assert_eq!(
            (a.max_rows, a.prune_every_events, a.tasks),
            (20_000, 1_000, 3)
        );
        assert_eq!(a.prune_every, Duration::from_millis(250));
        assert!(!a.save);
        assert_eq!(a.sample_every, 6_000, "ten samples of 60,000 events");
        let a = args(&["--events", "5", "--sample-every", "2"]).expect("tiny");
        assert_eq!(a.sample_every, 1);
        assert!(args(&["--events"]).is_none(), "a flag without its value");
        assert!(
            args(&["--events", "many"]).is_none(),
            "a value not a number"
        );
        assert!(args(&["--fast"]).is_none(), "a flag of no meaning");
        // A count of 0 is taken as 1: no session, task, mark or sample interval of 0 (a
        // division by zero in the run) and no row cap of 0. (What the mutation did: a flag's
        // `max(1)` left out; review of stop 72, BX32 to BX36.)
        let a = args(&[
            "--sessions",
            "0",
            "--tasks",
            "0",
            "--prune-every-events",
            "0",
            "--sample-every",
            "0",
            "--max-rows",
            "0",
        ])
        .expect("zeros");
        assert_eq!(
            (
                a.sessions,
                a.tasks,
                a.prune_every_events,
                a.sample_every,
                a.max_rows
            ),
            (1, 1, 1, 1, 1)
        );
    }

    /// A run with one task on one thread is exact: a pass begins at each mark (the crossing
    /// task waits for it, whatever the timer), so the widest gap is one interval; the last pass
    /// deletes what the recordings after the last mark put over the cap and is counted; the
    /// events go round-robin to the data set's sessions, and the reconcile to one of its own.
    /// (What the mutation did: the events each went to a session of their own (BS07); the gap
    /// kept the least, or was measured from the start (BS09, BS10); a pass's deletions replaced
    /// the tally (BS11); the crossing task went on before its pass began (BS12) or did not ask
    /// for one and waited for the timer (BS13); the last pass's deletions or the pass itself
    /// went uncounted (BS16, BS17); the reconcile read a session of the data set (BS21);
    /// review of stop 69.)
    #[test]
    fn a_run_prunes_at_each_mark_and_counts_every_pass() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let spec: Spec = group_commit_specs()
            .into_iter()
            .find(|s| s.name == "memory")
            .expect("memory");
        let a = args(&[
            "--events",
            "5500",
            "--sessions",
            "100",
            "--tasks",
            "1",
            "--max-rows",
            "1500",
            "--prune-every-events",
            "1000",
            "--prune-every-ms",
            "3600000",
        ])
        .expect("flags");
        let backend = rt.block_on(open_empty(&spec));
        let outcome = rt
            .block_on(async {
                tokio::time::timeout(
                    Duration::from_mins(2),
                    run(&backend.store, &a, Clock(Instant::now())),
                )
                .await
            })
            .expect("every pass began at its mark, not on the hour's timer");
        // Five marks, then the last pass.
        assert_eq!(outcome.passes.begun, 6);
        assert_eq!(
            outcome.passes.widest_gap, 1_000,
            "passes began 1,000 events apart"
        );
        assert_eq!((outcome.passes.rows, outcome.retained), (4_000, 1_500));
        assert_eq!(outcome.rss_kib.len(), 10);
        let heads = rt.block_on(backend.store.list_heads(None)).expect("heads");
        assert_eq!(heads.len(), 101, "100 sessions and the reconcile's");
        let target = reconcile_target(100);
        assert!((0..100).all(|i| dataset_session(i) != target));
        let page = rt
            .block_on(
                backend
                    .store
                    .changes_since(&target, awareness_core::Sequence::ZERO, 500),
            )
            .expect("page");
        assert_eq!(
            page.events.len(),
            200,
            "the reconcile's session has its 200 events only"
        );
    }

    /// The reconcile figure is the middle of the reads in order, not in time (the first read
    /// may be a cold one). (What the mutation did: the slowest read, or the sixth in time order;
    /// review of stop 69, BS19, BS20.)
    #[test]
    fn the_reconcile_figure_is_the_median_of_its_reads() {
        // In time order the middle read is 8.0, and 1.0 of the four.
        assert_eq!(median(vec![900.0, 5.0, 8.0, 6.0, 7.0]), 7.0);
        assert_eq!(median(vec![100.0, 3.0, 1.0, 2.0]), 3.0);
    }

    /// The RSS samples are the memory now and the peak its high-water mark, which memory given
    /// back does not lower. (What the mutation did: the samples read the high-water mark, or the
    /// peak read the memory now; review of stop 69, BS14, BS24.)
    #[test]
    fn rss_samples_follow_memory_given_back_and_the_peak_does_not() {
        if !std::path::Path::new("/proc/self/status").exists() {
            return;
        }
        // 64 MiB, touched, then freed (an allocation this large is unmapped when freed).
        let spike = std::hint::black_box(vec![1u8; 64 << 20]);
        assert!(peak_kib() >= 64 << 10);
        drop(spike);
        let (now, peak) = (rss_kib(), peak_kib());
        assert!(
            peak >= now + (32 << 10),
            "a peak of {peak} KiB and {now} KiB now, after 64 MiB were given back"
        );
    }

    /// The saved result and the printed line carry each figure under its own name: events per
    /// second over the recordings' time, the p99 (not another quantile), the RSS samples'
    /// interval. (What the mutation did: events per second over the time to the end of the
    /// reconcile, the p90 for the p99, the pruning interval for the samples'; review of stop
    /// 69, BS22, BS23, BS25.)
    #[test]
    fn the_saved_result_names_each_figure() {
        let a = args(&[
            "--events",
            "1000",
            "--sessions",
            "10",
            "--prune-every-events",
            "300",
            "--sample-every",
            "50",
        ])
        .expect("flags");
        let latencies = Histogram::new();
        for _ in 0..95 {
            latencies.record(Duration::from_micros(1));
        }
        for _ in 0..5 {
            latencies.record(Duration::from_millis(1));
        }
        let outcome = Outcome {
            elapsed: Duration::from_millis(2_500),
            latencies: Arc::new(latencies),
            rss_kib: vec![2048, 4096],
            passes: Passes {
                begun: 4,
                rows: 700,
                last_count: 900,
                widest_gap: 310,
            },
            retained: 300,
            reconcile_ns: 600_000.0,
            vm_hwm_kib: 8192,
        };
        let json = outcome.json(&a, "memory", Some(3 << 20));
        let us = Histogram::value(Histogram::index(1_000));
        let ms = Histogram::value(Histogram::index(1_000_000));
        assert_eq!(json["events_per_sec"], 400.0);
        assert_eq!(json["seconds"], 2.5);
        assert_eq!(
            (json["p50_ns"].as_f64(), json["p99_ns"].as_f64()),
            (Some(us), Some(ms))
        );
        assert_eq!(json["rss_every_events"], 50);
        assert_eq!(json["prune_every_events"], 300);
        assert_eq!(json["prune_passes"], 4);
        assert_eq!(json["most_events_between_passes"], 310);
        assert_eq!(json["pruned_rows"], 700);
        assert_eq!(json["vm_hwm_kib"], 8192);
        assert_eq!(json["rss_kib"], serde_json::json!([2048, 4096]));
        assert_eq!(json["file_bytes"], 3 << 20);
        // The run's shape and the reconcile in ns, as `bench-report` reads them (its RSS window
        // starts at `max_rows`). (What the mutation did: the reconcile saved in µs, the row cap
        // under another name, the events or the sessions for the sessions or the tasks; review
        // of stop 72, BX39, BX40, BX41, BX44.)
        assert_eq!(json["reconcile_200_ns"], 600_000.0);
        assert_eq!(
            (
                &json["events"],
                &json["sessions"],
                &json["tasks"],
                &json["max_rows"]
            ),
            (
                &serde_json::json!(1000),
                &serde_json::json!(10),
                &serde_json::json!(16),
                &serde_json::json!(a.max_rows)
            )
        );
        let line = outcome.line(&a, "memory", "files (db, WAL, shm)", Some(3 << 20));
        assert!(
            line.starts_with("scale/memory: 1000 events over 10 sessions in 2.5 s = 400 events/s"),
            "{line}"
        );
        assert!(line.contains(&format!("p99 {:.1} µs", ms / 1e3)), "{line}");
        // The line's p50 is the p50 and its reconcile in µs. (What the mutation did: the p99
        // printed as the p50, the reconcile divided into ms; review of stop 72, BX37, BX38.)
        assert!(
            line.contains(&format!("record p50 {:.1} µs,", us / 1e3)),
            "{line}"
        );
        assert!(line.contains("just-written session) 600.0 µs;"), "{line}");
        assert!(line.contains("3 pruning passes while recording (at most 310 events apart)"));
        assert!(line.contains("deleted 700 rows, 300 retained"), "{line}");
        assert!(line.contains("files (db, WAL, shm) 3.0 MiB; VmHWM 8.0 MiB; RSS (MiB) [2, 4]"));
    }

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
