//! Reliability with real processes and real files: a writer killed with SIGKILL at random
//! moments loses nothing it reported and tears nothing; writers in one process and in several
//! processes share one file without a BUSY error reaching them; bad files give a clear error
//! naming the path and are left exactly as they were. (A directory without write permission
//! and a store file the user may not write are shared checks,
//! `awareness_core::permission_suite!`, in `tests/permissions.rs`.)

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use awareness_core::testkit::durable::assert_counter_resumes_above;
use awareness_core::testkit::open::KillMoments;
use awareness_core::testkit::process::Writer;
use awareness_core::{
    ActorType, AwarenessStoreExt, CursorStore, Event, EventKind, EventStore, NewEvent, OpenFailure,
    Sequence, SessionRef, StoreError, Timestamp, WatcherKey,
};
use store_sqlite::{SqliteOptions, SqliteStore};

const TORTURE: &str = env!("CARGO_BIN_EXE_store-sqlite-torture");
const WATCHER: &str = "agent:main:torture-watcher";
const TARGETS: usize = 4;
/// A hang guard, never a timing assertion: a slow run on a busy machine stays far below it.
const HANG: Duration = Duration::from_mins(2);

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

/// A torture process started with `args` ([`Writer`]), waits for it bounded by [`HANG`].
fn start(args: &[&str]) -> Writer {
    Writer::start(TORTURE, args, HANG)
}

/// One line of the torture writer: `<sequence> <target> <write transactions> <stored|hit>
/// <dedupe key|->`, the event a recording returned (for a dedupe hit, the event stored first).
struct Report {
    sequence: u64,
    target: usize,
    write_transactions: u64,
    hit: bool,
    dedupe_key: Option<String>,
}

fn parse_report(line: &str) -> Report {
    let bad = || panic!("bad report line {line:?}");
    let parts: Vec<&str> = line.split(' ').collect();
    let [sequence, target, txns, outcome, key] = parts.as_slice() else {
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
        write_transactions: txns.parse().unwrap_or_else(|_| bad()),
        hit,
        dedupe_key,
    }
}

/// Everything the killed writers reported must be there (a dedupe hit's sequence too: it is
/// the stored event's), with its target and dedupe key; heads must equal the highest committed
/// sequence of their ref; every cursor must have moved with its event; and the sequence counter
/// must not go back. `reported` maps each sequence to its target and dedupe key. Returns the
/// sequence of the event recorded after the checks.
async fn verify_after_crash(
    db: &Path,
    reported: &BTreeMap<u64, (usize, Option<String>)>,
    round: usize,
) -> u64 {
    let store = SqliteStore::open(db).await.expect("reopen after SIGKILL");
    let events = store
        .events_after(Sequence::ZERO, usize::MAX)
        .await
        .unwrap();
    let present: BTreeMap<u64, &Event> = events.iter().map(|e| (e.sequence.get(), &**e)).collect();
    for (seq, (t, key)) in reported {
        let e = present.get(seq).unwrap_or_else(|| {
            panic!("round {round}: reported sequence {seq} is missing after the crash")
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
        let reported_max = reported
            .iter()
            .filter(|(_, (x, _))| *x == t)
            .map(|(s, _)| Sequence(*s))
            .max()
            .unwrap_or_default();
        let head = store.state_version(&r).await.unwrap();
        assert_eq!(
            head, committed_max,
            "round {round}: head of {r} is its highest committed sequence"
        );
        assert!(
            head >= reported_max,
            "round {round}: head of {r} covers every reported sequence"
        );
        // The writer committed its watches before it reported anything.
        let c = store
            .cursor(&watcher, &r.session_key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("round {round}: the watcher's cursor on {r} is missing"));
        // Every event of the torture writer is material to the watcher: the cursor moved in
        // the same transaction as the event, or neither happened.
        assert_eq!(c.material, head, "round {round}: cursor on {r} torn: {c:?}");
        assert!(c.is_well_formed(), "round {round}: {c:?}");
        for s in [c.last_seen, c.notified] {
            assert!(
                s == Sequence::ZERO || present.contains_key(&s.get()),
                "round {round}: cursor on {r} points at {s}, not a committed event: {c:?}"
            );
        }
    }
    // The counter never goes back: the next sequence is above everything present and above
    // every sequence a writer ever reported (nothing committed is lost on a process kill, so
    // the second follows from the first; it is checked anyway).
    let max_present = present.keys().next_back().copied().unwrap_or(0);
    let handed_out = reported.keys().next_back().copied().unwrap_or(0);
    let next = assert_counter_resumes_above(
        &store,
        NewEvent::new(
            target(0),
            EventKind::HumanDirectMessage,
            ActorType::Human,
            "human message after the crash",
        ),
        max_present,
        handed_out,
        round,
    )
    .await;
    store.close().await;
    next
}

#[test]
fn sigkill_at_random_moments_loses_nothing_reported_and_tears_nothing() {
    const KILLS: usize = 30;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.sqlite");
    let rt = runtime();
    // Every sequence reported, stored or as a dedupe hit, with its target and dedupe key.
    let mut reported: BTreeMap<u64, (usize, Option<String>)> = BTreeMap::new();
    // The sequences reported as stored (not as a dedupe hit).
    let mut stored: BTreeSet<u64> = BTreeSet::new();
    let mut hits_total = 0;
    // Hits on an event stored by an earlier, killed writer, and the sequence below which
    // every event was stored by one.
    let mut hits_across = 0;
    let mut earlier_writers = 0;
    // Each writer's highest write-transaction count: its watches, recordings and
    // acknowledgements.
    let mut txns_total = 0;
    // Writers killed before they reported anything.
    let mut silent = 0;
    let mut moments = KillMoments::new("sigkill_at_random_moments");
    for round in 0..KILLS {
        let mut writer = start(&["record", db.to_str().unwrap(), &TARGETS.to_string()]);
        let what = format!("round {round}");
        // A writer is recording once it reports its first commit: most are killed at a random
        // moment after that; every fourth at one from its start on, so that some kills land
        // while it opens, creates or recovers the file (never one of the first two: the
        // cursors checked exist once a writer reported). The sleeps are the point of the test,
        // not waits for something.
        let mut lines = Vec::new();
        if round % 4 == 2 {
            std::thread::sleep(moments.delay_below(Duration::from_millis(15)));
        } else {
            lines.push(writer.next_line(&what));
            std::thread::sleep(moments.delay_below(Duration::from_millis(40)));
        }
        lines.extend(writer.kill(&what));
        silent += usize::from(lines.is_empty());
        let mut txns = 0;
        for line in lines {
            let r = parse_report(&line);
            txns = txns.max(r.write_transactions);
            let entry = (r.target, r.dedupe_key);
            if r.hit {
                hits_total += 1;
                if r.sequence < earlier_writers {
                    hits_across += 1;
                }
                // The stored event of the key, reported before or not: the same event.
                if let Some(earlier) = reported.insert(r.sequence, entry.clone()) {
                    assert_eq!(
                        earlier, entry,
                        "round {round}: the hit on sequence {} names another event",
                        r.sequence
                    );
                }
            } else {
                assert!(
                    stored.insert(r.sequence),
                    "round {round}: sequence {} reported stored twice",
                    r.sequence
                );
                // A hit may have named it before (its line came first): the same event.
                if let Some(earlier) = reported.insert(r.sequence, entry.clone()) {
                    assert_eq!(
                        earlier, entry,
                        "round {round}: sequence {} reported as two events",
                        r.sequence
                    );
                }
            }
        }
        txns_total += txns;
        // Every third file goes to the next writer as the kill left it, for that writer to
        // recover, and is checked after that writer's kill, with what both reported.
        if round % 3 != 1 || round + 1 == KILLS {
            earlier_writers = rt.block_on(verify_after_crash(&db, &reported, round));
        }
    }
    let stored_total = stored.len();
    let recordings = (stored_total + hits_total) as u64;
    eprintln!(
        "{KILLS} kills ({silent} before a report), {recordings} reported recordings ({stored_total} stored, {hits_total} dedupe hits, {hits_across} of them on an event of an earlier writer) in at most {txns_total} write transactions (recordings, acknowledgements, watches)"
    );
    assert!(stored_total >= KILLS);
    assert!(
        hits_across > 0,
        "no dedupe hit on an event stored before a crash happened"
    );
    assert!(
        txns_total < recordings,
        "group commit never batched: {recordings} recordings took {txns_total} transactions"
    );
}

/// Ten writers, eight tasks of this process and two processes, record at once on the same ten
/// refs: none gets a BUSY error, every sequence is unique, and each ref's head is the highest
/// sequence any writer got on it.
#[test]
fn eight_tasks_and_two_processes_share_one_file_without_busy_errors() {
    const PER_WRITER: usize = 2_000;
    // The agent of every writer's refs: `agent:shared:s0` to `agent:shared:s9`.
    const SHARED: &str = "shared";
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.sqlite");
    let rt = runtime();
    let store = Arc::new(rt.block_on(SqliteStore::open(&db)).unwrap());
    let count = PER_WRITER.to_string();
    let mut processes = [0, 1].map(|_| start(&["go-halves", db.to_str().unwrap(), SHARED, &count]));
    // The writers interleave by construction rather than by timing: told together, the
    // processes open and record their first halves at once; the tasks start once both have,
    // and the processes record their second halves once every task has recorded. So each
    // writer has sequences below and above some of every other's (how closely they run side
    // by side beyond that is the scheduler's).
    let mut stdins = processes
        .each_mut()
        .map(|p| p.child.stdin.take().expect("a process's stdin"));
    for stdin in &mut stdins {
        stdin.write_all(b"go\n").unwrap();
    }
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
    // The halves ordered the writers as the test planned them (the processes' first halves
    // before the tasks began, their second halves after every task had recorded), so that
    // each writer's first sequence is below the last of every other: this checks the test's
    // own set-up (a broken barrier fails it), not that SQLite's busy handling ran, which the
    // set-up makes possible and the unique sequences and heads below check the outcome of.
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
    let all: Vec<(u64, String)> = writers.concat();
    assert_eq!(all.len(), 10 * PER_WRITER);
    let unique: BTreeSet<u64> = all.iter().map(|(s, _)| *s).collect();
    assert_eq!(unique.len(), all.len(), "every sequence is unique");
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
        assert_eq!(
            store.log_stats().await.unwrap().rows,
            10 * PER_WRITER as u64
        );
    });
    let store = Arc::into_inner(store).expect("every task has finished");
    rt.block_on(store.close());
}

/// Files in `dir` with their size and a hash of their bytes.
fn listing(dir: &Path) -> BTreeMap<PathBuf, (usize, u64)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let bytes = std::fs::read(&p).unwrap_or_default();
            let mut h = std::hash::DefaultHasher::new();
            h.write(&bytes);
            (p, (bytes.len(), h.finish()))
        })
        .collect()
}

/// A new store at `path` holding one event.
async fn store_with_one_event(path: &Path) -> SqliteStore {
    let store = SqliteStore::open(path).await.unwrap();
    store
        .record(
            NewEvent::new(target(0), EventKind::Created, ActorType::System, "x"),
            Timestamp::now(),
        )
        .await
        .unwrap();
    store
}

fn assert_open_error(err: &StoreError, path: &Path, reason: &str, kind: OpenFailure) {
    match err {
        StoreError::Open {
            path: p,
            reason: r,
            kind: k,
            ..
        } => {
            assert_eq!(p, path);
            assert!(r.contains(reason), "reason {r:?} should say {reason:?}");
            assert_eq!(*k, kind, "{err}");
        }
        other => panic!("expected StoreError::Open, got {other:?}"),
    }
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "the message names the file: {err}"
    );
}

#[tokio::test]
async fn a_file_that_is_not_sqlite_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.sqlite");
    std::fs::write(&path, "these are my notes, not a database\n".repeat(200)).unwrap();
    let before = listing(dir.path());
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert_open_error(
        &err,
        &path,
        "not an SQLite database",
        OpenFailure::NotAStore,
    );
    assert_eq!(
        listing(dir.path()),
        before,
        "nothing created or overwritten"
    );
}

/// A write-ahead log left beside a path whose database was deleted (a process killed before
/// folding it back, then the file removed) is not read into a new store there: the open is
/// refused, naming the log, and creates nothing. SQLite recovered the old log's pages over the
/// new file.
#[tokio::test]
async fn a_write_ahead_log_without_its_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let wal = dir.path().join("state.sqlite-wal");
    let store = SqliteStore::open(&path).await.unwrap();
    store
        .record(
            NewEvent::new(target(0), EventKind::Created, ActorType::System, "old"),
            Timestamp::now(),
        )
        .await
        .unwrap();
    let left = std::fs::read(&wal).unwrap();
    assert!(!left.is_empty(), "the recording is in the log");
    store.close().await;
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&wal, &left).unwrap();
    let before = listing(dir.path());
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert_open_error(&err, &path, "write-ahead log", OpenFailure::Other);
    assert!(err.to_string().contains("state.sqlite-wal"), "{err}");
    assert_eq!(listing(dir.path()), before, "nothing created");
}

/// A store moved away (or deleted) while a process still has it open leaves that process's log
/// and shared-memory index at the old path, the log empty until it writes: a new store there
/// would share them with it, each reading the other's pages as its own. The open is refused,
/// naming them, and creates nothing; once they are gone, it creates the store. An empty log
/// was taken for no log.
#[tokio::test]
async fn a_log_and_index_still_in_use_by_a_moved_store_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let wal = dir.path().join("state.sqlite-wal");
    let shm = dir.path().join("state.sqlite-shm");
    let first = SqliteStore::open(&path).await.unwrap();
    assert_eq!(first.log_stats().await.unwrap().rows, 0, "a read");
    assert!(shm.exists(), "the index is there while the store is open");
    assert_eq!(
        std::fs::metadata(&wal).map(|m| m.len()).ok(),
        Some(0),
        "the log is there, empty: nothing was written since the open"
    );
    std::fs::rename(&path, dir.path().join("moved.sqlite")).unwrap();
    let before = listing(dir.path());
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert_open_error(&err, &path, "write-ahead log", OpenFailure::Other);
    assert!(err.to_string().contains("state.sqlite-wal"), "{err}");
    assert_eq!(listing(dir.path()), before, "nothing created");
    // The index alone is refused as well.
    std::fs::remove_file(&wal).unwrap();
    let before = listing(dir.path());
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert_open_error(&err, &path, "shared-memory index", OpenFailure::Other);
    assert!(err.to_string().contains("state.sqlite-shm"), "{err}");
    assert_eq!(listing(dir.path()), before, "nothing created");
    first.close().await;
    let _ = std::fs::remove_file(&shm);
    let store = SqliteStore::open(&path)
        .await
        .expect("nothing left at the old path");
    assert_eq!(
        store.log_stats().await.unwrap().rows,
        0,
        "a new, empty store"
    );
    store.close().await;
}

/// Options out of range are refused before the path is touched: no group commit size
/// (`group_commit(0)`), more readers than [`store_sqlite::MAX_READERS`] (which panicked,
/// allocating room for them: review, stop 57).
#[tokio::test]
async fn options_out_of_range_are_refused_and_nothing_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    for (options, what) in [
        (SqliteOptions::default().group_commit(0), "group_commit"),
        (
            SqliteOptions::default().readers(store_sqlite::MAX_READERS + 1),
            "readers must be at most 64",
        ),
        (SqliteOptions::default().readers(usize::MAX), "readers"),
    ] {
        let err = SqliteStore::open_with(&path, options).await.unwrap_err();
        assert_open_error(&err, &path, what, OpenFailure::InvalidOptions);
        assert!(listing(dir.path()).is_empty(), "{what}: nothing created");
    }
    let most = SqliteStore::open_with(
        &path,
        SqliteOptions::default().readers(store_sqlite::MAX_READERS),
    )
    .await
    .expect("as many readers as allowed");
    assert_eq!(most.log_stats().await.unwrap().rows, 0);
    most.close().await;
}

/// An empty file put where a store that is still open was moved from (`mv state.sqlite
/// state.bak && touch state.sqlite`) is refused like a missing one, read-write and read-only,
/// and nothing beside it is touched: SQLite deleted the moved store's log and shared its
/// index, and the moved store lost the event it had committed and failed every later write
/// (review, stop 57).
#[tokio::test]
async fn an_empty_file_where_a_store_still_open_was_moved_from_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let first = store_with_one_event(&path).await;
    std::fs::rename(&path, dir.path().join("moved.sqlite")).unwrap();
    std::fs::write(&path, b"").unwrap();
    let before = listing(dir.path());
    for options in [
        SqliteOptions::default(),
        SqliteOptions::default().read_only(true),
    ] {
        let err = SqliteStore::open_with(&path, options).await.unwrap_err();
        assert_open_error(&err, &path, "write-ahead log", OpenFailure::Other);
        assert!(err.to_string().contains("the file is empty"), "{err}");
        assert_eq!(listing(dir.path()), before, "nothing touched");
    }
    // Through a symbolic link elsewhere, whose target SQLite names the log after (the second
    // reading: the log was looked for beside the link).
    #[cfg(unix)]
    {
        let elsewhere = tempfile::tempdir().unwrap();
        let link = elsewhere.path().join("link.sqlite");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let err = SqliteStore::open(&link).await.unwrap_err();
        assert_open_error(&err, &link, "write-ahead log", OpenFailure::Other);
        assert_eq!(
            listing(dir.path()),
            before,
            "nothing touched through the link"
        );
    }
    first
        .record(
            NewEvent::new(target(1), EventKind::Created, ActorType::System, "y"),
            Timestamp::now(),
        )
        .await
        .expect("the moved store still records");
    assert_eq!(first.log_stats().await.unwrap().rows, 2, "both its events");
    first.close().await;
    let moved = SqliteStore::open(dir.path().join("moved.sqlite"))
        .await
        .unwrap();
    assert_eq!(moved.log_stats().await.unwrap().rows, 2, "kept in its file");
    moved.close().await;
    // As the error says: once no process has the old database open, its files go.
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.path().join(format!("state.sqlite{suffix}")));
    }
    let store = SqliteStore::open(&path)
        .await
        .expect("nothing left beside the empty file");
    assert_eq!(
        store.log_stats().await.unwrap().rows,
        0,
        "a new, empty store"
    );
    store.close().await;
}

/// An empty file with a rollback journal beside it, live by SQLite's test (its first byte set:
/// another opener making the store in this empty file has one for a moment), opens: SQLite
/// does not play a journal back over an empty file. The first version of the empty-file check
/// refused it as stray (stop 57).
#[tokio::test]
async fn an_empty_file_with_a_journal_beside_it_opens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    std::fs::write(&path, b"").unwrap();
    std::fs::write(dir.path().join("state.sqlite-journal"), b"\xd9journal").unwrap();
    let store = SqliteStore::open(&path).await.expect("opens");
    assert_eq!(
        store.log_stats().await.unwrap().rows,
        0,
        "a new, empty store"
    );
    store.close().await;
}

/// A database file with another name (a hard link: a backup made with links, a link made by
/// hand) is refused under either name, read-write and read-only, naming the other name when it
/// is in the same directory, and nothing is created beside either: SQLite keeps a log beside
/// each name a database is opened under, and two logs of one file corrupt it. Once the other
/// name is gone the store opens with what it held.
#[cfg(unix)]
#[tokio::test]
async fn a_database_with_another_name_is_refused_under_each() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let other = dir.path().join("linked.sqlite");
    let recorded = store_with_one_event(&path).await;
    recorded.close().await;
    std::fs::hard_link(&path, &other).unwrap();
    let before = listing(dir.path());
    for (name, also) in [(&path, "linked.sqlite"), (&other, "state.sqlite")] {
        let err = SqliteStore::open(name).await.unwrap_err();
        assert_open_error(&err, name, "1 other name (hard links)", OpenFailure::Other);
        assert!(err.to_string().contains(also), "{err}");
        let err = SqliteStore::open_with(name, SqliteOptions::default().read_only(true))
            .await
            .unwrap_err();
        assert_open_error(&err, name, "hard links", OpenFailure::Other);
    }
    assert_eq!(listing(dir.path()), before, "nothing created or changed");
    std::fs::remove_file(&other).unwrap();
    // A name in another directory is counted, and said not to be in the file's.
    let elsewhere = dir.path().join("backup");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::hard_link(&path, elsewhere.join("state.sqlite")).unwrap();
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert_open_error(
        &err,
        &path,
        &format!(
            "1 other name (hard links) (none in {})",
            dir.path().display()
        ),
        OpenFailure::Other,
    );
    std::fs::remove_file(elsewhere.join("state.sqlite")).unwrap();
    let store = SqliteStore::open(&path).await.expect("one name left");
    assert_eq!(store.log_stats().await.unwrap().rows, 1, "what it held");
    store.close().await;
}

/// The refusal of a file with other names names those beside it in order, and counts those
/// elsewhere as they are: none when all are beside it, one when one other is in another
/// directory. (What the mutations did: every other name was also counted as elsewhere, "and 5
/// elsewhere" with none there, review of stop 68, S835; the names were given in the
/// directory's order, not sorted, S840.)
#[cfg(unix)]
#[tokio::test]
async fn a_refusal_for_other_names_names_those_beside_in_order_and_counts_those_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    store_with_one_event(&path).await.close().await;
    let names = ["a-link", "b-link", "c-link", "d-link", "e-link"];
    for name in names {
        std::fs::hard_link(&path, dir.path().join(name)).unwrap();
    }
    // The refusal with `count` other names, those beside it listed, then `tail`.
    let refused_with = async |count: usize, tail: &str| {
        let err = SqliteStore::open(&path).await.unwrap_err();
        let said = format!(
            "{count} other names (hard links) ({} in {}{tail}):",
            names.join(", "),
            dir.path().display()
        );
        assert_open_error(&err, &path, &said, OpenFailure::Other);
    };
    refused_with(5, "").await;
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::hard_link(&path, elsewhere.path().join("backup.sqlite")).unwrap();
    refused_with(6, ", and 1 elsewhere").await;
}

/// The name a new store is prepared under is linked at the store's path for a moment before
/// it is removed, and a process killed in that moment leaves it for good: that name is not
/// taken for another (no store is opened under it), and it is left alone; also when the store
/// is opened through a symbolic link in another directory (the names beside the file count).
#[cfg(unix)]
#[tokio::test]
async fn a_prepared_name_left_by_a_killed_creator_is_not_another_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    store_with_one_event(&path).await.close().await;
    let staged = dir.path().join(".awareness-new-4194303-7");
    std::fs::hard_link(&path, &staged).unwrap();
    let store = SqliteStore::open(&path)
        .await
        .expect("a prepared name is not another name");
    assert_eq!(store.log_stats().await.unwrap().rows, 1);
    store.close().await;
    let away = tempfile::tempdir().unwrap();
    let alias = away.path().join("alias.sqlite");
    std::os::unix::fs::symlink(&path, &alias).unwrap();
    let store = SqliteStore::open(&alias)
        .await
        .expect("through a symbolic link, the prepared name beside the file is found");
    assert_eq!(store.log_stats().await.unwrap().rows, 1);
    store.close().await;
    assert!(staged.exists(), "left alone");
    // A name only like it is another name.
    let like = dir.path().join(".awareness-new-old-copy");
    std::fs::hard_link(&path, &like).unwrap();
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert_open_error(&err, &path, "1 other name (hard links)", OpenFailure::Other);
    assert!(err.to_string().contains(".awareness-new-old-copy"), "{err}");
}

/// A name that starts like a prepared one but is not one (`.awareness-new-12-copy`, a process
/// id then anything but a number; `.awareness-new-12-`, `.awareness-new--7`, a part left
/// empty: copies named by hand) is another name of the file: the store is refused, naming it.
/// (What the mutations did: only the part before the second dash was checked, S625, review
/// of stop 67; an empty part counted as a number, S833, review of stop 68: such a link was
/// taken for a prepared name left by a killed creator, and the store opened under two names.)
#[cfg(unix)]
#[tokio::test]
async fn a_name_like_a_prepared_one_that_is_not_one_is_another_name() {
    for name in [
        ".awareness-new-12-copy",
        ".awareness-new-12-",
        ".awareness-new--7",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.sqlite");
        store_with_one_event(&path).await.close().await;
        std::fs::hard_link(&path, dir.path().join(name)).unwrap();
        let err = SqliteStore::open(&path)
            .await
            .expect_err("a link named by hand is another name");
        assert_open_error(&err, &path, "1 other name (hard links)", OpenFailure::Other);
        assert!(err.to_string().contains(name), "{err}");
    }
}

/// Names a new store is prepared under, left by an earlier process that had this process's id
/// (killed while preparing; in a container the same small ids come back), are skipped: the
/// store is created under the next free name, and those left are left alone. (What the
/// mutation did: a name taken failed the open with "cannot create it", and no store could be
/// made in that directory by any process with that id; review of stop 67, S629.)
#[cfg(unix)]
#[tokio::test]
async fn prepared_names_left_by_an_earlier_process_with_this_id_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    // More than this test binary creates stores in all: whatever number the next one takes,
    // its name is taken.
    let pid = std::process::id();
    let left: Vec<PathBuf> = (0..4096)
        .map(|n| dir.path().join(format!(".awareness-new-{pid}-{n}")))
        .collect();
    for p in &left {
        std::fs::write(p, b"").unwrap();
    }
    let path = dir.path().join("state.sqlite");
    let store = SqliteStore::open(&path)
        .await
        .expect("the store is created under a name not taken");
    store.close().await;
    assert!(left.iter().all(|p| p.exists()), "left alone");
}

/// A read-only handle that closes last cannot remove the log and index it made: a store
/// deleted after it (to start over) is not created again over them, and the refusal says this
/// may be why, and to move them away; then the open creates it.
#[tokio::test]
async fn a_store_deleted_after_a_read_only_close_names_the_files_left() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    SqliteStore::open(&path).await.unwrap().close().await;
    let reader = SqliteStore::open_with(&path, SqliteOptions::default().read_only(true))
        .await
        .unwrap();
    assert_eq!(reader.log_stats().await.unwrap().rows, 0, "a read");
    reader.close().await;
    let left: Vec<PathBuf> = ["state.sqlite-wal", "state.sqlite-shm"]
        .iter()
        .map(|n| dir.path().join(n))
        .filter(|p| p.exists())
        .collect();
    assert!(
        !left.is_empty(),
        "the read-only close left its log or index"
    );
    std::fs::remove_file(&path).unwrap();
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert_open_error(
        &err,
        &path,
        "after a read-only handle closed last",
        OpenFailure::Other,
    );
    for p in &left {
        std::fs::remove_file(p).unwrap();
    }
    let store = SqliteStore::open(&path).await.expect("nothing left");
    assert_eq!(store.log_stats().await.unwrap().rows, 0);
    store.close().await;
}

/// A rollback journal left beside a path whose database was deleted (a process in rollback
/// mode killed in a transaction whose pages had started to reach the file, then the file
/// removed): the open is refused, naming the journal, and creates nothing. SQLite plays a
/// journal back over any database that is not empty, and a new store is complete before
/// SQLite first opens it there: the old database's pages were written over the new store.
#[tokio::test]
async fn a_rollback_journal_without_its_database_is_refused_and_left_alone() {
    use sqlx::{ConnectOptions as _, Connection as _};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let journal = dir.path().join("state.sqlite-journal");
    // A journal as a killed process leaves it: synced, with its pages counted, taken while the
    // transaction that wrote it was still open (a two-page cache makes SQLite sync the journal
    // and write pages into the file before the transaction ends).
    let old = dir.path().join("old.sqlite");
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&old)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Delete)
        .connect()
        .await
        .unwrap();
    sqlx::raw_sql(
        "PRAGMA cache_size = 2;
         CREATE TABLE t(x);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
         INSERT INTO t SELECT printf('%.500c', 'a') FROM n;
         BEGIN;
         UPDATE t SET x = 'b';",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let left = std::fs::read(dir.path().join("old.sqlite-journal")).unwrap();
    assert!(
        left.len() > 4096,
        "the transaction's pages are in the journal"
    );
    sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
    std::fs::remove_file(&old).unwrap();
    std::fs::write(&journal, &left).unwrap();
    let before = listing(dir.path());
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert_open_error(&err, &path, "rollback journal", OpenFailure::Other);
    assert!(err.to_string().contains("state.sqlite-journal"), "{err}");
    assert_eq!(listing(dir.path()), before, "nothing created");
    // Its header zeroed, as `journal_mode=PERSIST` leaves a finished one, SQLite ignores it:
    // so does the open, which creates the store.
    let mut zeroed = left;
    zeroed[..28].fill(0);
    std::fs::write(&journal, &zeroed).unwrap();
    let store = SqliteStore::open(&path)
        .await
        .expect("a zeroed journal is no live one");
    assert_eq!(
        store.log_stats().await.unwrap().rows,
        0,
        "a new, empty store"
    );
    store.close().await;
}

#[tokio::test]
async fn a_truncated_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let store = SqliteStore::open(&path).await.unwrap();
    let s = target(0);
    for _ in 0..500 {
        store
            .record(
                NewEvent::new(
                    s.clone(),
                    EventKind::Created,
                    ActorType::System,
                    "x".repeat(150),
                ),
                Timestamp::now(),
            )
            .await
            .unwrap();
    }
    store.close().await;
    let len = std::fs::metadata(&path).unwrap().len();
    assert!(len > 16 * 4096, "the database spans many pages: {len}");
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len / 2).unwrap();
    drop(f);
    let before = listing(dir.path());
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert_open_error(&err, &path, "corrupt or truncated", OpenFailure::Other);
    assert_eq!(
        listing(dir.path()),
        before,
        "nothing created or overwritten"
    );
}

/// A file whose migrations table records a version this crate does not know (a later version
/// wrote it) is refused by a read-write and a read-only open alike, and left as it was: a later
/// version may keep rows in a way this one would misread or overwrite (store-redb refuses a
/// newer schema the same way, decision 0006).
#[tokio::test]
async fn a_file_of_a_newer_schema_is_refused_and_left_as_it_was() {
    use sqlx::{ConnectOptions as _, Connection as _};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let store = store_with_one_event(&path).await;
    store.close().await;
    let mut raw = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .unwrap();
    sqlx::raw_sql(
        "INSERT INTO awareness_schema_migrations VALUES (99, 'a later version', 0);
         PRAGMA wal_checkpoint(TRUNCATE);",
    )
    .execute(&mut raw)
    .await
    .unwrap();
    raw.close().await.unwrap();
    let before = listing(dir.path());
    let err = SqliteStore::open(&path).await.expect_err("a newer schema");
    assert_open_error(
        &err,
        &path,
        "schema is version 99",
        OpenFailure::Unsupported,
    );
    assert_eq!(
        listing(dir.path()),
        before,
        "nothing created or overwritten"
    );
    // A read-only connection leaves SQLite's empty `-wal` and `-shm` behind (it may not remove
    // them: the version that wrote the file may be using it); the file itself is as it was.
    let err = SqliteStore::open_with(&path, SqliteOptions::new().read_only(true))
        .await
        .expect_err("a newer schema, read-only");
    assert_open_error(
        &err,
        &path,
        "schema is version 99",
        OpenFailure::Unsupported,
    );
    assert_eq!(listing(dir.path())[&path], before[&path], "read-only");
}

/// With `create_if_missing(false)` an open creates no store at all: an empty file and another
/// application's SQLite database are refused and left as they were (a mistyped path must not
/// turn them into stores); a store, OpenClaw's included, opens as always.
#[tokio::test]
async fn without_create_if_missing_a_file_that_is_no_store_yet_is_refused() {
    use sqlx::Connection as _;
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let theirs = dir.path().join("theirs.db");
    let mut raw = made_by_hand(&theirs).await;
    sqlx::raw_sql("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine');")
        .execute(&mut raw)
        .await
        .unwrap();
    raw.close().await.unwrap();
    let ours = dir.path().join("state.sqlite");
    SqliteStore::open(&ours).await.unwrap().close().await;
    let before = listing(dir.path());
    for path in [&empty, &theirs] {
        let err = SqliteStore::open_with(path, SqliteOptions::new().create_if_missing(false))
            .await
            .expect_err("no store yet");
        assert_open_error(
            &err,
            path,
            "create_if_missing is off",
            OpenFailure::NotAStore,
        );
    }
    assert_eq!(
        listing(dir.path()),
        before,
        "nothing created or overwritten"
    );
    SqliteStore::open_with(&ours, SqliteOptions::new().create_if_missing(false))
        .await
        .expect("a store opens")
        .close()
        .await;
}

/// With `create_if_missing` on (the default), another application's SQLite database (tables,
/// none of OpenClaw's) is refused all the same and left as it was: a mistyped path must not get
/// our tables and WAL. A database without tables (an empty file, one whose creation stopped
/// before its tables were written) becomes a store.
#[tokio::test]
async fn a_creating_open_refuses_another_applications_database() {
    use sqlx::Connection as _;
    let dir = tempfile::tempdir().unwrap();
    let database = async |path: &std::path::Path, sql: &'static str| {
        let mut raw = made_by_hand(path).await;
        sqlx::raw_sql(sql).execute(&mut raw).await.unwrap();
        raw.close().await.unwrap();
    };
    let theirs = dir.path().join("theirs.db");
    database(
        &theirs,
        "CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine');",
    )
    .await;
    let bare = dir.path().join("bare.db");
    // A database, not an empty file: its header is written.
    database(&bare, "CREATE TABLE gone (x); DROP TABLE gone;").await;
    assert!(std::fs::metadata(&bare).unwrap().len() > 0);
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let before = listing(dir.path());
    let err = SqliteStore::open(&theirs)
        .await
        .expect_err("another application's database");
    assert_open_error(
        &err,
        &theirs,
        "another application's database",
        OpenFailure::NotAStore,
    );
    assert_eq!(listing(dir.path()), before, "their file is as it was");
    for path in [&bare, &empty] {
        let store = SqliteStore::open(path).await.expect("a store is made");
        store.close().await;
        SqliteStore::open_with(path, SqliteOptions::new().create_if_missing(false))
            .await
            .expect("and opens as one")
            .close()
            .await;
    }
}

#[tokio::test]
async fn a_missing_directory_is_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing").join("state.sqlite");
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert_open_error(&err, &path, "does not exist", OpenFailure::NotFound);
    assert!(!dir.path().join("missing").exists());
    let readonly = store_sqlite::SqliteOptions::new().create_if_missing(false);
    let flat = dir.path().join("absent.sqlite");
    let err = SqliteStore::open_with(&flat, readonly).await.unwrap_err();
    assert_open_error(&err, &flat, "does not exist", OpenFailure::NotFound);
    assert!(listing(dir.path()).is_empty());
}

#[tokio::test]
async fn new_files_are_private() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let store = store_with_one_event(&path).await;
    for suffix in ["", "-wal", "-shm"] {
        let p = PathBuf::from(format!("{}{suffix}", path.display()));
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} has mode {mode:o}", p.display());
    }
    store.close().await;
}

/// A named pipe at the store's path is refused as not a regular file (`NotAStore`, saying so),
/// read-write and read-only, before SQLite is given it. (What the mutation did: only a
/// directory was refused, and SQLite, given the pipe, failed with "an I/O error occurred";
/// review of stop 68, S845.)
#[cfg(unix)]
#[tokio::test]
async fn a_named_pipe_at_the_path_is_refused_as_no_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo");
    for options in [
        SqliteOptions::default(),
        SqliteOptions::default().read_only(true),
    ] {
        let opened = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            SqliteStore::open_with(&path, options),
        )
        .await
        .expect("the open of a pipe answers");
        let err = opened.unwrap_err();
        assert_open_error(&err, &path, "not a regular file", OpenFailure::NotAStore);
    }
}

/// A file that is not SQLite, with the empty `-wal` and the `-shm` a read-only handle that closed
/// last leaves beside a store (it may not remove them): the refused open removes only the
/// companions it created itself, and leaves these two, which were there before it, as they were.
/// (What the mutation did: every `-shm`, and an empty `-wal`, beside a file refused as unusable
/// went, also those there before the open; review of stop 64, SQ20.)
#[tokio::test]
async fn a_refused_open_leaves_the_companions_that_were_there_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    std::fs::write(&path, "these are my notes, not a database\n".repeat(200)).unwrap();
    std::fs::write(dir.path().join("state.sqlite-wal"), b"").unwrap();
    std::fs::write(dir.path().join("state.sqlite-shm"), vec![0u8; 32 * 1024]).unwrap();
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert_open_error(
        &err,
        &path,
        "not an SQLite database",
        OpenFailure::NotAStore,
    );
    for suffix in ["-wal", "-shm"] {
        assert!(
            dir.path().join(format!("state.sqlite{suffix}")).exists(),
            "the {suffix} that was there before the open is still there"
        );
    }
}

/// A file that is not SQLite with only a `-shm` beside it (no `-wal`): the refused open leaves
/// that `-shm`, which was there before it, whether or not a `-wal` was. (What the mutation did:
/// whether the `-shm` was there before was taken from the `-wal`, and the refused open removed
/// a `-shm` it had not created; review of stop 68, S844.)
#[tokio::test]
async fn a_refused_open_leaves_a_shm_that_was_there_before_it_without_a_wal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    std::fs::write(&path, "these are my notes, not a database\n".repeat(200)).unwrap();
    let shm = dir.path().join("state.sqlite-shm");
    std::fs::write(&shm, vec![0u8; 32 * 1024]).unwrap();
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert_open_error(
        &err,
        &path,
        "not an SQLite database",
        OpenFailure::NotAStore,
    );
    assert!(
        shm.exists(),
        "the -shm that was there before the open is still there"
    );
}

/// A database whose one table is our migrations record, with nothing recorded yet (its other tables
/// never written, or dropped by hand), is no other application's: the record is ours, and a
/// creating open makes the store in it, as in a database without tables. (What the mutation did:
/// the record counted as another application's table, and the open refused the file as another
/// application's database; review of stop 64, SQ29.)
#[tokio::test]
async fn a_database_holding_only_our_empty_migrations_record_becomes_a_store() {
    use sqlx::Connection as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let mut raw = made_by_hand(&path).await;
    sqlx::raw_sql(
        "CREATE TABLE awareness_schema_migrations (
  version INTEGER PRIMARY KEY,
  description TEXT NOT NULL,
  applied_at INTEGER NOT NULL
) STRICT",
    )
    .execute(&mut raw)
    .await
    .unwrap();
    raw.close().await.unwrap();
    let store = SqliteStore::open(&path).await.expect("a store is made");
    store.close().await;
}

/// A connection of its own to the SQLite database at `path`, created if missing, as another
/// application (or a hand edit) would open it.
async fn made_by_hand(path: &std::path::Path) -> sqlx::SqliteConnection {
    use sqlx::ConnectOptions as _;
    sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .connect()
        .await
        .unwrap()
}
