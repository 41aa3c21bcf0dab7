//! Reliability with real processes on a real server (`AWARENESS_PG_URL`, see `server`): a
//! writer killed with SIGKILL at random moments loses nothing it reported, tears nothing and
//! leaves the store's write lock free; writers in one process and in several processes share
//! one schema, every sequence handed out once and in order, and no error reaches them.

mod server;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use awareness_core::testkit::durable::assert_counter_resumes_above;
use awareness_core::testkit::open::KillMoments;
use awareness_core::testkit::process::Writer;
use awareness_core::{
    ActorType, AwarenessStoreExt, CursorStore, Event, EventKind, EventStore, NewEvent, Sequence,
    SessionRef, Timestamp, WatcherKey,
};
use store_postgres::{PgStore, PgStoreOptions};

use server::{DropSchema, fresh_schema};

const TORTURE: &str = env!("CARGO_BIN_EXE_store-postgres-torture");
const WATCHER: &str = "agent:main:torture-watcher";
const TARGETS: usize = 4;
/// A hang guard, never a timing assertion: a slow run on a busy machine stays far below it.
const HANG: Duration = Duration::from_mins(2);
/// The hang guard of the checks after a kill, whose recording waits for the store's lock:
/// below the server-side timeout that ends a dead client's idle transaction anyway
/// (`idle_in_transaction_session_timeout`, which the torture writer leaves at its default), so
/// that a lock the kill left held fails the test instead of passing once that timeout ends it.
/// A healthy check takes milliseconds.
const LOCK_HANG: Duration = Duration::from_secs(20);
const _: () = assert!(
    LOCK_HANG.as_millis() < store_postgres::DEFAULT_IDLE_TRANSACTION_TIMEOUT.as_millis(),
    "the hang guard must stay below the idle transaction timeout"
);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn target(i: usize) -> SessionRef {
    SessionRef::parse(&format!("agent:main:subagent:t{i}"), "main").unwrap()
}

/// Whether a commit waits for the server to flush it to disk (PostgreSQL's
/// `synchronous_commit`, on by default). Off, a commit is as final to every other session the
/// moment it returns, and as final across a client's kill (only a crash of the server itself
/// could lose it): only the time a write holds the store's lock gets shorter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SyncCommit {
    On,
    Off,
}

/// The store URL of `schema` on the test server, for a torture process.
fn url_of(schema: &str, sync: SyncCommit) -> String {
    let server = std::env::var("AWARENESS_PG_URL").expect(
        "AWARENESS_PG_URL names the PostgreSQL server the store-postgres tests use \
         (for example postgres:///awareness_test?host=/var/run/postgresql); .ci/run starts one",
    );
    let joint = if server.contains('?') { '&' } else { '?' };
    let url = format!("{server}{joint}schema={schema}");
    match sync {
        SyncCommit::On => url,
        SyncCommit::Off => format!("{url}&options[synchronous_commit]=off"),
    }
}

async fn connect(schema: &str, connections: u32, sync: SyncCommit) -> PgStore {
    let mut server = server::server();
    if sync == SyncCommit::Off {
        server = server.options([("synchronous_commit", "off")]);
    }
    PgStore::connect(
        server,
        PgStoreOptions::new(schema).max_connections(connections),
    )
    .await
    .unwrap_or_else(|e| panic!("connect to schema {schema}: {e}"))
}

/// A torture process started with `args` ([`Writer`]), waits for it bounded by [`HANG`].
fn start(args: &[&str]) -> Writer {
    Writer::start(TORTURE, args, HANG)
}

/// One line of `record`: `<sequence> <target> <stored|hit> <dedupe key|->`, the event a
/// recording returned (for a dedupe hit, the event stored first).
struct Report {
    sequence: u64,
    target: usize,
    hit: bool,
    dedupe_key: Option<String>,
}

fn parse_report(line: &str) -> Report {
    let bad = || panic!("bad report line {line:?}");
    let parts: Vec<&str> = line.split(' ').collect();
    let [sequence, target, outcome, key] = parts.as_slice() else {
        bad()
    };
    let hit = match *outcome {
        "stored" => false,
        "hit" => true,
        _ => bad(),
    };
    let dedupe_key = (*key != "-").then(|| (*key).to_owned());
    assert!(
        !hit || dedupe_key.is_some(),
        "a hit without a dedupe key: {line:?}"
    );
    Report {
        sequence: sequence.parse().unwrap_or_else(|_| bad()),
        target: target.parse().unwrap_or_else(|_| bad()),
        hit,
        dedupe_key,
    }
}

/// What the killed writers reported: each sequence with its target and dedupe key.
type Reported = BTreeMap<u64, (usize, Option<String>)>;

/// Everything the killed writers reported must be there (a dedupe hit's sequence too: it is
/// the stored event's), with its target and dedupe key; heads must equal the highest committed
/// sequence of their ref; every cursor must have moved with its event; the sequence counter
/// must not go back; and a recording must get the store's lock (the kill left it free).
/// Returns the sequence of the event recorded after the checks.
async fn verify_after_kill(schema: &str, reported: &Reported, round: usize) -> u64 {
    let store = connect(schema, 2, SyncCommit::On).await;
    let events = store
        .events_after(Sequence::ZERO, usize::MAX)
        .await
        .unwrap();
    let present: BTreeMap<u64, &Event> = events.iter().map(|e| (e.sequence.get(), &**e)).collect();
    for (seq, (t, key)) in reported {
        let e = present.get(seq).unwrap_or_else(|| {
            panic!("round {round}: reported sequence {seq} is missing after the kill")
        });
        assert_eq!(
            e.session_key,
            target(*t).session_key,
            "round {round}: reported sequence {seq} is on another target"
        );
        assert_eq!(
            &e.dedupe_key, key,
            "round {round}: reported sequence {seq} has another dedupe key"
        );
    }
    let watcher = WatcherKey::parse(WATCHER).unwrap();
    for t in 0..TARGETS {
        let r = target(t);
        let committed_max = events
            .iter()
            .filter(|e| e.session_ref() == r)
            .map(|e| e.sequence)
            .max()
            .unwrap_or_default();
        let head = store.state_version(&r).await.unwrap();
        assert_eq!(
            head, committed_max,
            "round {round}: head of {r} is its highest committed sequence"
        );
        // The writers committed their watches before they reported anything.
        let c = store
            .cursor(&watcher, &r.session_key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("round {round}: the watcher's cursor on {r} is missing"));
        // Every event recorded here is material to the watcher: the cursor moved in the same
        // transaction as the event, or neither happened.
        assert_eq!(c.material, head, "round {round}: cursor on {r} torn: {c:?}");
        assert!(c.is_well_formed(), "round {round}: {c:?}");
        for s in [c.last_seen, c.notified] {
            assert!(
                s == Sequence::ZERO || present.contains_key(&s.get()),
                "round {round}: cursor on {r} points at {s}, not a committed event: {c:?}"
            );
        }
    }
    // The counter never goes back: the next sequence is above everything present and every
    // sequence a writer was given. Recording it needs the store's lock: a lock the dead
    // writer's session still held would make it wait (the caller's hang guard).
    let max_present = present.keys().next_back().copied().unwrap_or(0);
    let handed_out = reported.keys().next_back().copied().unwrap_or(0);
    let next = assert_counter_resumes_above(
        &store,
        NewEvent::new(
            target(0),
            EventKind::HumanDirectMessage,
            ActorType::Human,
            "human message after the kill",
        ),
        max_present,
        handed_out,
        round,
    )
    .await;
    store.pool().close().await;
    next
}

#[test]
fn sigkill_at_random_moments_loses_nothing_reported_and_leaves_the_lock_free() {
    const KILLS: usize = 30;
    let schema = fresh_schema();
    let _drop = DropSchema(schema.clone());
    let url = url_of(&schema, SyncCommit::On);
    let rt = runtime();
    let mut reported = Reported::new();
    // The sequences reported as stored (not as a dedupe hit).
    let mut stored: BTreeSet<u64> = BTreeSet::new();
    let mut hits_total = 0;
    // Hits on an event stored by an earlier, killed writer, and the sequence below which
    // every event was stored by one (or by the checks).
    let mut hits_across = 0;
    let mut earlier_writers = 0;
    // Writers killed before they reported anything.
    let mut silent = 0;
    let mut moments = KillMoments::new("sigkill_at_random_moments");
    for round in 0..KILLS {
        let mut writer = start(&["record", &url, &TARGETS.to_string()]);
        let what = format!("round {round}");
        // A writer is recording once it reports its first recording: most are killed at a
        // random moment after that; every fourth at one from its start on, so that some kills
        // land while it connects, creates the tables (under the store's lock) or watches
        // (never one of the first two: the cursors checked exist once a writer reported). The
        // sleeps are the point of the test, not waits for something.
        let mut lines = Vec::new();
        if round % 4 == 2 {
            std::thread::sleep(moments.delay_below(Duration::from_millis(80)));
        } else {
            lines.push(writer.next_line(&what));
            std::thread::sleep(moments.delay_below(Duration::from_millis(40)));
        }
        lines.extend(writer.kill(&what));
        silent += usize::from(lines.is_empty());
        for line in lines {
            let r = parse_report(&line);
            let entry = (r.target, r.dedupe_key);
            if r.hit {
                hits_total += 1;
                if r.sequence < earlier_writers {
                    hits_across += 1;
                }
            } else {
                assert!(
                    stored.insert(r.sequence),
                    "round {round}: sequence {} reported stored twice",
                    r.sequence
                );
            }
            // A hit and the recording that stored its event, whichever was reported first,
            // name the same event.
            if let Some(earlier) = reported.insert(r.sequence, entry.clone()) {
                assert_eq!(
                    earlier, entry,
                    "round {round}: sequence {} reported as two events",
                    r.sequence
                );
            }
        }
        let checked = rt.block_on(async {
            tokio::time::timeout(LOCK_HANG, verify_after_kill(&schema, &reported, round)).await
        });
        earlier_writers = checked.unwrap_or_else(|_| {
            panic!(
                "round {round}: the checks after the kill hung for {LOCK_HANG:?}: the killed \
                 writer left the store's lock held?"
            )
        });
    }
    let stored_total = stored.len();
    eprintln!(
        "{KILLS} kills ({silent} before a report), {} reported recordings ({stored_total} stored, {hits_total} dedupe hits, {hits_across} of them on an event of an earlier writer)",
        stored_total + hits_total
    );
    // The set-up: the writers recorded (each kill after a first report lands among more).
    assert!(
        stored_total + hits_total >= KILLS,
        "only {} recordings reported in {KILLS} rounds",
        stored_total + hits_total
    );
    assert!(
        hits_across > 0,
        "no dedupe hit on an event stored before a kill happened"
    );
}

/// Reads the log as a watcher tails it while the writers write, each read after the last
/// sequence it saw, until it has seen `total` events: with nothing deduplicated or deleted,
/// each read must go on from the last without a gap. A later sequence committed before an
/// earlier one would show as a gap, and a reader that moved past it would never see the
/// earlier event. Returns the reads that found new events.
async fn tail_the_log(store: Arc<PgStore>, total: u64) -> usize {
    let mut last = 0;
    let mut reads = 0;
    while last < total {
        let page = store.events_after(Sequence(last), 1_000).await.unwrap();
        reads += usize::from(!page.is_empty());
        for e in page {
            let s = e.sequence.get();
            assert_eq!(
                s,
                last + 1,
                "the reader saw sequence {s} after {last}: a later sequence committed first"
            );
            last = s;
        }
    }
    reads
}

/// Ten writers, eight tasks of this process and two processes, record at once on the same ten
/// refs of one schema, which all three connect to at once (the first creates it): no error
/// reaches them, a reader tailing the log meanwhile never sees a later sequence before an
/// earlier one, the sequences are exactly 1 to 20,000 (each handed out once, none lost), the
/// log holds each on the ref its writer named, and each ref's head is the highest sequence any
/// writer got on it.
#[test]
fn eight_tasks_and_two_processes_share_one_schema() {
    const PER_WRITER: usize = 2_000;
    const WRITERS: usize = 10;
    // The agent of every writer's refs: `agent:shared:s0` to `agent:shared:s9`.
    const SHARED: &str = "shared";
    let schema = fresh_schema();
    let _drop = DropSchema(schema.clone());
    // The 20,000 commits take turns on the store's lock: each waiting for the disk, they took
    // 70 s on a busy machine, 25 s without (what is checked here is the order of commits, the
    // same either way).
    let url = url_of(&schema, SyncCommit::Off);
    let rt = runtime();
    let count = PER_WRITER.to_string();
    let mut processes = [0, 1].map(|_| start(&["go-halves", &url, SHARED, &count]));
    // The writers interleave by construction rather than by timing: told together, the
    // processes connect (with this one) and record their first halves at once; the tasks
    // start once both have, and the processes record their second halves once every task has
    // recorded. So each writer has sequences below and above some of every other's.
    let mut stdins = processes
        .each_mut()
        .map(|p| p.child.stdin.take().expect("a process's stdin"));
    for stdin in &mut stdins {
        stdin.write_all(b"go\n").unwrap();
    }
    // A connection for each task and one for the reader.
    let store = Arc::new(rt.block_on(connect(&schema, 9, SyncCommit::Off)));
    let reader = rt.spawn(tail_the_log(
        Arc::clone(&store),
        (WRITERS * PER_WRITER) as u64,
    ));
    let mut firsts: [Vec<String>; 2] = Default::default();
    for (i, p) in processes.iter_mut().enumerate() {
        loop {
            let line = p.next_line(&format!("process {i}"));
            if line == "half" {
                break;
            }
            firsts[i].push(line);
        }
    }
    let tasks = async {
        let (began, mut begun) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut tasks = Vec::new();
        for task in 0..8 {
            let store = Arc::clone(&store);
            let began = began.clone();
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::with_capacity(PER_WRITER);
                for i in 0..PER_WRITER {
                    let session =
                        SessionRef::parse(&format!("agent:{SHARED}:s{}", i % 10), SHARED).unwrap();
                    let e = NewEvent::new(
                        session.clone(),
                        EventKind::HumanDirectMessage,
                        ActorType::Human,
                        "human message via test",
                    );
                    let rec = store
                        .record(e, Timestamp::now())
                        .await
                        .unwrap_or_else(|err| {
                            panic!(
                                "task {task}: a write failed ({err}); retryable={}",
                                err.is_retryable()
                            )
                        });
                    out.push((rec.event.sequence.get(), session.session_key.to_string()));
                    if i == 0 {
                        let _ = began.send(());
                    }
                }
                out
            }));
        }
        // Only the tasks hold senders now: one that fails before its first recording ends the
        // wait (once the others are done), and its failure is reported below.
        drop(began);
        for _ in 0..8 {
            if begun.recv().await.is_none() {
                break;
            }
        }
        for stdin in &mut stdins {
            stdin.write_all(b"go\n").unwrap();
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    };
    let Ok(recorded) = rt.block_on(async { tokio::time::timeout(HANG, tasks).await }) else {
        for p in &mut processes {
            let _ = p.child.kill();
        }
        panic!("the tasks of this process hung: not done after {HANG:?}");
    };
    let reads = match rt.block_on(async { tokio::time::timeout(HANG, reader).await }) {
        Ok(Ok(reads)) => reads,
        Ok(Err(e)) => std::panic::resume_unwind(e.into_panic()),
        Err(elapsed) => panic!("the reader hung: not done after {HANG:?} ({elapsed})"),
    };
    // The reader read while the writers wrote (this checks the test's set-up).
    assert!(
        reads > 10,
        "the reader found new events in only {reads} reads"
    );
    // Each writer's sequences: the tasks together, then each process.
    let mut writers = vec![recorded];
    for (i, (p, first)) in processes.into_iter().zip(firsts).enumerate() {
        let mut lines = first;
        lines.extend(p.finish(&format!("process {i}")));
        let parsed = lines.iter().map(|line| {
            let (seq, key) = line.split_once(' ').unwrap();
            (seq.parse().unwrap(), key.to_owned())
        });
        writers.push(parsed.collect());
    }
    // The set-up ordered the writers as planned (a broken barrier fails this): each writer's
    // first sequence is below the last of every other.
    let range = |w: &[(u64, String)]| {
        let seqs = w.iter().map(|(s, _)| *s);
        (seqs.clone().min().unwrap(), seqs.max().unwrap())
    };
    for (a, wa) in writers.iter().enumerate() {
        for (b, wb) in writers.iter().enumerate().filter(|(b, _)| *b != a) {
            let ((min_a, _), (_, max_b)) = (range(wa), range(wb));
            assert!(
                min_a < max_b,
                "writer {a} began ({min_a}) after writer {b} ended ({max_b}): they never overlapped (0 is this process's tasks)"
            );
        }
    }
    let all: BTreeMap<u64, String> = writers.concat().into_iter().collect();
    assert_eq!(
        all.len(),
        WRITERS * PER_WRITER,
        "every sequence is handed out once"
    );
    assert!(
        all.keys().copied().eq(1..=(WRITERS * PER_WRITER) as u64),
        "the sequences are 1 to {} without a gap: {:?}..{:?}",
        WRITERS * PER_WRITER,
        all.keys().next(),
        all.keys().next_back()
    );
    // The highest sequence any writer got on each ref.
    let mut highest: BTreeMap<&str, u64> = BTreeMap::new();
    for (s, k) in &all {
        let e = highest.entry(k.as_str()).or_default();
        *e = (*e).max(*s);
    }
    assert_eq!(
        highest.len(),
        10,
        "every writer recorded on the same ten refs"
    );
    rt.block_on(async {
        let log = store
            .events_after(Sequence::ZERO, usize::MAX)
            .await
            .unwrap();
        let logged: BTreeMap<u64, String> = log
            .iter()
            .map(|e| (e.sequence.get(), e.session_key.to_string()))
            .collect();
        assert!(logged == all, "the log holds what the writers were told");
        let heads = store.list_heads(None).await.unwrap();
        assert_eq!(heads.len(), highest.len());
        for h in heads {
            assert_eq!(
                Some(&h.last_sequence.get()),
                highest.get(h.session.session_key.as_str()),
                "head of {}",
                h.session
            );
        }
        store.pool().close().await;
    });
}
