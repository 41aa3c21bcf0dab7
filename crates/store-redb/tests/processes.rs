//! Reliability across processes, with real child processes.
//!
//! - SIGKILL crash test, once per durability mode: a child records continuously from
//!   `RECORDERS` concurrent tasks (so group commit puts several recordings in one write
//!   transaction) and reports each committed sequence on a pipe; the parent kills it at a random
//!   moment (at least 30 times per mode, some before its first report, while it opens or
//!   repairs the file), reopens the file (after every third kill, only once the next child ran
//!   on it as the kill left it) and checks every promise: with `Immediate` every reported sequence
//!   is present; with `Bounded` every sequence reported more than one flush interval (plus a
//!   margin) before the kill is present; in both, heads equal the highest sequence of their ref,
//!   cursors are not torn, and the sequence counter never goes back.
//! - A file held open by another process is refused at once with a clear error naming it.
//! - Read-only opens of two processes share a file and exclude a default-mode writer, which
//!   excludes them; a file whose writer was killed is refused read-only, untouched, until a read-write
//!   open repairs it. A writer with live readers lets a reader of another process follow its
//!   commits.
//! - In the bounded mode, `flush()` and a clean close make commits durable, and commits after
//!   the last flush are really not durable (the mode does what it says); the numbers such a
//!   lost commit took are not handed out again, past the first reservation of sequences too;
//!   a write commit that stands in for a waiting flush is durable. With `Immediate`, a watch, an
//!   acknowledgement and an unwatch survive a kill right after they return.
//!
//! The binary re-invokes itself as the child (`STORE_REDB_CHILD`), so it has its own `main`
//! (`harness = false`). Arguments that do not start with `-` filter the tests by name.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use awareness_core::testkit::durable::assert_counter_resumes_above;
use awareness_core::testkit::open::{KillMoments, output_within};
use awareness_core::upstream::{LinkSpec, UpstreamStore as _};
use awareness_core::{
    AckTarget, ActorType, AwarenessStoreExt, CursorStore, EventKind, EventStore, NewEvent,
    OpenFailure, Sequence, SessionRef, StoreError, Timestamp, WatcherKey,
};
use store_redb::{RedbOptions, RedbStore};

const CHILD: &str = "STORE_REDB_CHILD";
const PATH: &str = "STORE_REDB_PATH";
const INTERVAL_MS: &str = "STORE_REDB_INTERVAL_MS";

const KILLS_PER_MODE: usize = 30;
/// The bounded mode's flush interval in the crash test.
const FLUSH_INTERVAL: Duration = Duration::from_millis(25);
/// Slack on top of the interval for the flush itself (an fsync on a busy shared disk) and for
/// scheduling; the promise checked is "older than interval + margin is durable".
const FLUSH_MARGIN: Duration = Duration::from_millis(300);
/// How often a bounded-mode recording child prints [`HEARTBEAT_LINE`]: the longest gap
/// between two of them (or the last one and the kill) the parent saw is how long the child (or
/// the parent's reading) was held up, added to the promise of that round. On an idle machine
/// that is a few ms; a flusher that does not flush still loses commits far older than that.
const HEARTBEAT: Duration = Duration::from_millis(5);
const HEARTBEAT_LINE: &str = "T";
const WATCHED: usize = 3;
/// Concurrent recording tasks in the crash test's child.
const RECORDERS: u64 = 4;
/// The exit code of a recording child that panicked.
const RECORDER_PANICKED: i32 = 3;
/// The events that [`child_stand_in`] records, and then deletes in one write transaction long
/// enough for a flush to come while it runs.
const STAND_IN_EVENTS: u64 = 20_000;
/// Where [`child_reserve_again`] moves the sequence counter: past the first reservation of the
/// bounded mode, which is `RESERVE_AHEAD` (2^20, store-redb's `tables::RESERVE_AHEAD`) past the
/// first event.
const PAST_FIRST_RESERVATION: u64 = (1 << 21) + 5;
/// A hang guard, never a timing assertion: a slow run on a busy machine stays far below it.
const HANG: Duration = Duration::from_mins(2);

/// What a child that ended well printed; a child that failed fails the test with its stdout
/// and stderr, `what` naming it.
#[track_caller]
fn stdout_of_success(out: &std::process::Output, what: &str) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {:?}: {text}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn watcher() -> WatcherKey {
    WatcherKey::parse("agent:main:main").unwrap()
}

/// Targets 0..WATCHED are watched and get human messages; target WATCHED gets log-only events.
fn target(i: usize) -> SessionRef {
    SessionRef::parse(&format!("agent:main:subagent:t{i}"), "main").unwrap()
}

/// The `i` of [`target`]`(i)`.
fn target_index(key: &awareness_core::SessionKey) -> usize {
    (0..=WATCHED)
        .find(|i| target(*i).session_key == *key)
        .expect("an event of the crash test is on one of its targets")
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn options(interval_ms: Option<u64>) -> RedbOptions {
    match interval_ms {
        Some(ms) => RedbOptions::bounded(Duration::from_millis(ms)),
        None => RedbOptions::default(),
    }
}

// ---------------------------------------------------------------------------------------------
// Children

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .expect("report to the parent");
}

fn wait_for_stdin_eof() {
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {
        sink.clear();
    }
}

/// Records until killed, from `RECORDERS` concurrent tasks: human messages on the watched
/// targets, log-only events on another, a dedupe hit now and then, and acknowledgements. Reports
/// `R <sequence> <target> <write transactions so far>` after each record returned, `H` in
/// place of `R` for a dedupe hit (the sequence is then the stored event's).
async fn child_record(path: &Path, interval_ms: Option<u64>, live_readers: bool) {
    // A recorder that panics ends the process at once, with a code of its own: the others do
    // not run on without it, and the parent tells this from the kill it expects.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("child: {info}");
        std::process::exit(RECORDER_PANICKED);
    }));
    if interval_ms.is_some() {
        // A heartbeat (HEARTBEAT), so that the parent can see how long this process was
        // stalled (not scheduled) and not hold the flusher to a promise the machine kept it
        // from keeping.
        std::thread::spawn(|| {
            loop {
                say(HEARTBEAT_LINE);
                std::thread::sleep(HEARTBEAT);
            }
        });
    }
    let store = std::sync::Arc::new(
        RedbStore::open_with(path, options(interval_ms).live_readers(live_readers))
            .await
            .expect("child: open"),
    );
    for i in 0..WATCHED {
        store
            .watch(&watcher(), &target(i), now())
            .await
            .expect("child: watch");
    }
    let tasks: Vec<_> = (0..RECORDERS)
        .map(|k| tokio::spawn(recorder(std::sync::Arc::clone(&store), k)))
        .collect();
    for t in tasks {
        t.await.expect("child: recorder");
    }
}

/// One recording task of the child: calls `k`, `k + RECORDERS`, ...
async fn recorder(store: std::sync::Arc<RedbStore>, k: u64) {
    let targets: Vec<AckTarget> = (0..WATCHED)
        .map(|i| AckTarget::any(target(i).session_key))
        .collect();
    for n in (k..).step_by(RECORDERS as usize) {
        let t = (n % (WATCHED as u64 + 1)) as usize;
        let mut e = if t < WATCHED {
            NewEvent::new(
                target(t),
                EventKind::HumanDirectMessage,
                ActorType::Human,
                "human message via telegram",
            )
        } else {
            NewEvent::new(
                target(t),
                EventKind::RunCompleted,
                ActorType::System,
                "child run completed",
            )
        };
        if n % 10 == 9 {
            // The first is stored, every later one is a hit that consumes a sequence.
            e = e.with_dedupe_key("crash-test-once");
        }
        let rec = store.record(e, now()).await.expect("child: record");
        say(&format!(
            "{} {} {} {}",
            if rec.deduplicated { "H" } else { "R" },
            rec.event.sequence,
            target_index(&rec.event.session_key),
            store.write_transactions()
        ));
        if n % 7 == 6 {
            store
                .acknowledge(&watcher(), &targets, now())
                .await
                .expect("child: acknowledge");
        }
    }
}

/// Holds the file open with `options` until stdin closes.
async fn child_hold(path: &Path, options: RedbOptions) {
    let store = RedbStore::open_with(path, options)
        .await
        .expect("child: open");
    say("ready");
    wait_for_stdin_eof();
    drop(store);
}

/// The sequences of every retained event of `store`, ascending.
async fn logged(store: &RedbStore) -> Vec<u64> {
    store
        .events_after(Sequence::ZERO, 1000)
        .await
        .unwrap()
        .iter()
        .map(|e| e.sequence.get())
        .collect()
}

/// Opens the file read-write with live readers and records one event; then records one more
/// for each line read on stdin, reporting `recorded <sequence>` after each, until stdin closes.
async fn child_live(path: &Path) {
    let store = RedbStore::open_with(path, RedbOptions::default().live_readers(true))
        .await
        .expect("child: open with live readers");
    let mut line = String::new();
    loop {
        record_said(&store, "recorded").await;
        line.clear();
        if !std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
            break;
        }
    }
    store.close().await;
}

/// Bounded mode with a flush interval that never fires: records 5 events, flushes, records 5
/// more, then waits to be killed.
async fn child_flush(path: &Path) {
    let store = open_never_flushing(path).await;
    for _ in 0..5 {
        record_said(&store, "durable").await;
    }
    store.flush().await.expect("child: flush");
    for _ in 0..5 {
        record_said(&store, "pending").await;
    }
    say("done");
    wait_for_stdin_eof();
}

/// `Immediate` durability: every write but recordings too is durable once it returns. Watches
/// two targets, records on the first (which notifies), acknowledges that notice, unwatches the
/// second, says `done`, then waits to be killed: no recording follows the last two writes,
/// whose durability is then their own.
async fn child_cursor_writes(path: &Path) {
    let store = RedbStore::open(path).await.expect("child: open");
    for i in [1, 2] {
        store
            .watch(&watcher(), &target(i), now())
            .await
            .expect("child: watch");
    }
    let typed = NewEvent::new(
        target(1),
        EventKind::HumanDirectMessage,
        ActorType::Human,
        "human message",
    );
    let rec = store.record(typed, now()).await.expect("child: record");
    assert_eq!(rec.notices.len(), 1, "child: the watch notifies");
    store
        .acknowledge(&watcher(), &[AckTarget::any(target(1).session_key)], now())
        .await
        .expect("child: acknowledge");
    store
        .unwatch(&watcher(), &target(2).session_key)
        .await
        .expect("child: unwatch");
    say(&format!("done {}", rec.event.sequence));
    wait_for_stdin_eof();
}

/// The store at `path` in the bounded mode with a flush interval that never fires (an hour).
async fn open_never_flushing(path: &Path) -> RedbStore {
    RedbStore::open_with(path, RedbOptions::bounded(Duration::from_hours(1)))
        .await
        .expect("child: open")
}

/// Records an event of target 0 and says its sequence after `word`.
async fn record_said(store: &RedbStore, word: &str) {
    let rec = store
        .record(log_only(0), now())
        .await
        .expect("child: record");
    say(&format!("{word} {}", rec.event.sequence));
}

/// Bounded mode with a flush interval that never fires: records 3 events (the first raises the
/// reservation of sequences, in a durable commit; the others are not durable), says each, then
/// waits to be killed.
async fn child_reserve(path: &Path) {
    let store = open_never_flushing(path).await;
    for _ in 0..3 {
        record_said(&store, "recorded").await;
    }
    say("done");
    wait_for_stdin_eof();
}

/// Bounded mode with a flush interval that never fires: records [`STAND_IN_EVENTS`] events on
/// target 0 (not durable but the first, which raises the reservation of sequences), then
/// deletes that session, a long write transaction, and calls `flush()` while it runs: the
/// flush waits for redb's write lock and the delete's commit stands in for it. Says
/// `recorded`, `flushed` once the flush returned, and `done` once the delete did, then waits
/// to be killed.
async fn child_stand_in(path: &Path) {
    let store = std::sync::Arc::new(open_never_flushing(path).await);
    // In waves of concurrent recordings, which group commit puts in few write transactions.
    for _ in 0..STAND_IN_EVENTS / 250 {
        let mut wave = tokio::task::JoinSet::new();
        for _ in 0..250 {
            let store = std::sync::Arc::clone(&store);
            wave.spawn(async move { store.record(log_only(0), now()).await });
        }
        while let Some(rec) = wave.join_next().await {
            rec.expect("child: join a recording")
                .expect("child: record");
        }
    }
    say("recorded");
    let delete = {
        let store = std::sync::Arc::clone(&store);
        tokio::spawn(async move { store.delete_session(&target(0)).await })
    };
    // Lets the delete begin its transaction first.
    tokio::time::sleep(Duration::from_millis(5)).await;
    store.flush().await.expect("child: flush");
    say("flushed");
    delete
        .await
        .expect("child: join the delete")
        .expect("child: delete the session");
    say("done");
    wait_for_stdin_eof();
}

/// Bounded mode with a flush interval that never fires: records an event (its commit raises
/// the reservation of sequences, durably), moves the counter past that reservation
/// ([`RedbStore::leave_sequences`]), then records 2 more events, so that the reservation must
/// be raised a second time. Says each sequence, then waits to be killed.
async fn child_reserve_again(path: &Path) {
    let store = open_never_flushing(path).await;
    record_said(&store, "recorded").await;
    // The last number an event can get is `u64::MAX - 1`: the counter lands on
    // `PAST_FIRST_RESERVATION`, above the first reservation (`1 + RESERVE_AHEAD`).
    assert!(
        store
            .leave_sequences(u64::MAX - 1 - PAST_FIRST_RESERVATION)
            .await
            .expect("child: move the counter"),
        "child: the counter was already past {PAST_FIRST_RESERVATION}"
    );
    for _ in 0..2 {
        record_said(&store, "recorded").await;
    }
    say("done");
    wait_for_stdin_eof();
}

/// Bounded mode with a flush interval that never fires: records 5 events, closes the store
/// (the last handle), then waits to be killed.
async fn child_close(path: &Path) {
    let store = open_never_flushing(path).await;
    for _ in 0..5 {
        record_said(&store, "closed").await;
    }
    drop(store);
    say("done");
    wait_for_stdin_eof();
}

/// Records events with 4 KiB payloads until one fails (the parent runs this under a file-size
/// limit, so a commit fails writing the file), then reports what the next write and a second
/// open of the file in this process answer: `failed <error>`, `next <error>`, `second <result>`.
/// With [`Fill::Batch`], the events go in waves of eight queued behind the held writer, so that
/// each wave is one group commit: the failure is a batch's, and the line `failed` gives the
/// first error of the wave (its jobs are recorded again alone, and refused) and the largest
/// batch. With [`Fill::Links`], sessions are adopted instead, with upstream links of about
/// 15 KiB each: the failure is a write other than a recording's.
async fn child_fill(path: &Path, interval: Option<u64>, fill: Fill) {
    let store = std::sync::Arc::new(
        RedbStore::open_with(path, options(interval))
            .await
            .expect("child: open"),
    );
    let big = || {
        let mut p = awareness_core::Payload::new();
        p.insert("text".into(), serde_json::json!("x".repeat(4_000)));
        NewEvent::new(target(0), EventKind::Compacted, ActorType::System, "filled").with_payload(p)
    };
    let link = |i: u64| {
        let i = usize::try_from(i).expect("a small count");
        LinkSpec::new(
            target(i),
            "claude-code",
            "local",
            format!("thread-{i}"),
            "local-jsonl",
        )
        .with_marker(serde_json::json!({ "m": "x".repeat(15_000) }))
    };
    let chain = |e: &StoreError| awareness_core::error::ErrorChain(e).to_string();
    let mut recorded = 0u64;
    let failed = loop {
        let result = if fill == Fill::Links {
            store
                .upsert_link(link(recorded), now())
                .await
                .map(|_| recorded += 1)
        } else if fill == Fill::Batch {
            let held = store.hold_writer().await.expect("child: hold the writer");
            let calls: Vec<_> = (0..8)
                .map(|_| {
                    let store = std::sync::Arc::clone(&store);
                    tokio::spawn(async move { store.record(big(), now()).await })
                })
                .collect();
            // On this current-thread runtime, every recording spawned reaches the queue first.
            tokio::task::yield_now().await;
            drop(held);
            let mut first = Ok(());
            for call in calls {
                match call.await.expect("child: join a recording") {
                    Ok(_) => recorded += 1,
                    Err(e) => first = first.and(Err(e)),
                }
            }
            first
        } else {
            store.record(big(), now()).await.map(|_| recorded += 1)
        };
        if let Err(e) = result {
            break e;
        }
        assert!(recorded < 1_000_000, "child: the file-size limit never bit");
    };
    say(&format!(
        "failed after {recorded} (largest batch {}): {}",
        store.largest_batch(),
        chain(&failed)
    ));
    // Opened before any other write: the failure itself must be what refuses it.
    match RedbStore::open_with(path, options(interval)).await {
        Ok(_) => say("second shared"),
        Err(e) => say(&format!("second refused {}", chain(&e))),
    }
    let next = store
        .record(log_only(0), now())
        .await
        .expect_err("child: a write after it");
    say(&format!("next {}", chain(&next)));
    match RedbStore::open_with(path, read_only()).await {
        Ok(_) => say("read-only shared"),
        Err(e) => say(&format!("read-only refused {}", chain(&e))),
    }
}

/// What [`child_fill`] writes until a write fails.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// One recording at a time.
    One,
    /// Recordings in waves of eight, each wave a group commit.
    Batch,
    /// Adoptions, each an upstream link.
    Links,
}

/// Opens (creating) the store at `path`, which the parent runs under a file-size limit of
/// nothing, so that redb cannot write the new file's header; reports `refused <error>` (or
/// `opened`), then `exists <whether the file is at the path>`.
async fn child_create(path: &Path) {
    match RedbStore::open(path).await {
        Ok(_) => say("opened"),
        Err(e) => say(&format!(
            "refused {}",
            awareness_core::error::ErrorChain(&e)
        )),
    }
    say(&format!("exists {}", path.exists()));
}

fn log_only(i: usize) -> NewEvent {
    NewEvent::new(
        target(i),
        EventKind::Compacted,
        ActorType::System,
        "session compacted",
    )
}

fn run_child(mode: &str) {
    let path = PathBuf::from(std::env::var_os(PATH).expect("child: STORE_REDB_PATH"));
    let interval = std::env::var(INTERVAL_MS)
        .ok()
        .map(|v| v.parse().expect("child: interval"));
    let rt = runtime();
    match mode {
        "record" => rt.block_on(child_record(&path, interval, false)),
        "record_live" => rt.block_on(child_record(&path, interval, true)),
        "live" => rt.block_on(child_live(&path)),
        "hold" => rt.block_on(child_hold(&path, RedbOptions::default())),
        "hold_read_only" => rt.block_on(child_hold(&path, read_only())),
        "flush" => rt.block_on(child_flush(&path)),
        "close" => rt.block_on(child_close(&path)),
        "fill" => rt.block_on(child_fill(&path, interval, Fill::One)),
        "fill_batch" => rt.block_on(child_fill(&path, interval, Fill::Batch)),
        "fill_links" => rt.block_on(child_fill(&path, interval, Fill::Links)),
        "create" => rt.block_on(child_create(&path)),
        "cursor_writes" => rt.block_on(child_cursor_writes(&path)),
        "reserve" => rt.block_on(child_reserve(&path)),
        "reserve_again" => rt.block_on(child_reserve_again(&path)),
        "stand_in" => rt.block_on(child_stand_in(&path)),
        other => panic!("unknown child mode {other}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Parent side

/// A child and the lines it printed, each with the instant the parent read it.
struct Spawned {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
}

fn spawn(mode: &str, path: &Path, interval_ms: Option<u64>) -> Spawned {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env(CHILD, mode)
        .env(PATH, path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(ms) = interval_ms {
        cmd.env(INTERVAL_MS, ms.to_string());
    }
    let mut child = cmd.spawn().expect("spawn the child");
    let stdout: ChildStdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send((Instant::now(), line)).is_err() {
                return;
            }
        }
    });
    Spawned { child, lines: rx }
}

impl Spawned {
    /// The next line, failing the test if the child says nothing for 30 s.
    fn next_line(&self) -> (Instant, String) {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("the child reported nothing for 30 s (see its stderr)")
    }

    /// The lines the child prints up to its `done` (included), then kills it: for a child that
    /// waits to be killed once it has said what it did.
    fn lines_until_done(self) -> Vec<(Instant, String)> {
        let mut lines = Vec::new();
        loop {
            let line = self.next_line();
            let done = line.1 == "done";
            lines.push(line);
            if done {
                break;
            }
        }
        drop(self.kill());
        lines
    }

    /// Kills the child (SIGKILL), reaps it, and returns the kill instant and every line it
    /// printed before dying; fails if it had ended on its own.
    fn kill(mut self) -> (Instant, Vec<(Instant, String)>) {
        let at = Instant::now();
        self.child.kill().expect("SIGKILL the child");
        let status = self.child.wait().expect("reap the child");
        assert_eq!(
            status.signal(),
            Some(9),
            "the child ended on its own ({status}), not by the kill (see its stderr above)"
        );
        // The reader thread ends at EOF, once the dead child's pipe is drained.
        (at, self.lines.iter().collect())
    }

    /// Waits for the child to exit (its stdout ends then), skipping what it still prints; kills
    /// it and fails the test if it has not after [`HANG`].
    fn wait(mut self, what: &str) -> ExitStatus {
        let deadline = Instant::now() + HANG;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!("{what} hung: not exited after {HANG:?} (killed)");
                }
            }
        }
        self.child.wait().expect("reap the child")
    }
}

/// A child of `mode` run on a file of a new directory up to its `done` ([`Spawned::lines_until_done`]):
/// the directory (removed when dropped), the file, and the lines.
fn child_done(mode: &str) -> (tempfile::TempDir, PathBuf, Vec<(Instant, String)>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let lines = spawn(mode, &path, None).lines_until_done();
    (dir, path, lines)
}

/// `R <sequence> <target> <write transactions>`, or `H ...` for a dedupe hit (`true`).
fn parse_report(line: &str) -> Option<(u64, usize, u64, bool)> {
    let (hit, rest) = match line.split_at_checked(2)? {
        ("R ", rest) => (false, rest),
        ("H ", rest) => (true, rest),
        _ => return None,
    };
    let mut parts = rest.split(' ');
    let seq = parts.next()?.parse().ok()?;
    let t = parts.next()?.parse().ok()?;
    let txns = parts.next()?.parse().ok()?;
    Some((seq, t, txns, hit))
}

/// Opens the file after a kill and checks every invariant; `must_have` are the sequences that
/// the mode promises to keep. Returns the sequences present.
/// Checks the file after a kill. `handed_out` is the highest sequence any child ever reported
/// to its caller: lost or not, no later event may get it again.
async fn verify(
    path: &Path,
    must_have: &BTreeMap<u64, usize>,
    handed_out: u64,
    round: usize,
) -> BTreeSet<u64> {
    let store = tokio::time::timeout(HANG, RedbStore::open(path))
        .await
        .unwrap_or_else(|_| panic!("round {round}: the reopen after the kill hung ({HANG:?})"))
        .unwrap_or_else(|e| panic!("round {round}: reopen: {e}"));
    let events = store
        .events_after(Sequence::ZERO, usize::MAX / 2)
        .await
        .unwrap();
    let present: BTreeMap<u64, String> = events
        .iter()
        .map(|e| (e.sequence.get(), e.session_key.as_str().to_owned()))
        .collect();
    for (seq, t) in must_have {
        assert_eq!(
            present.get(seq).map(String::as_str),
            Some(target(*t).session_key.as_str()),
            "round {round}: committed sequence {seq} (target {t}) is missing after the kill"
        );
    }
    for i in 0..=WATCHED {
        let r = target(i);
        let max_present = events
            .iter()
            .filter(|e| e.session_key == r.session_key)
            .map(|e| e.sequence)
            .max()
            .unwrap_or_default();
        let head = store.state_version(&r).await.unwrap();
        assert_eq!(head, max_present, "round {round}: head of target {i}");
        if i < WATCHED {
            let c = store
                .cursor(&watcher(), &r.session_key)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("round {round}: cursor on target {i} is missing"));
            // Every event on a watched target is material: the cursor moved with each one, in
            // the same transaction, so it must agree with the log exactly.
            assert_eq!(
                c.material, head,
                "round {round}: torn cursor on target {i}: {c:?}"
            );
            assert!(
                c.is_well_formed(),
                "round {round}: torn cursor on target {i}: {c:?}"
            );
            for s in [c.last_seen, c.notified] {
                assert!(
                    s == Sequence::ZERO || present.contains_key(&s.get()),
                    "round {round}: cursor on target {i} points at {s}, not an event of it: {c:?}"
                );
            }
        }
    }
    let max = present.keys().next_back().copied().unwrap_or(0);
    // The counter never goes back: the next sequence is above everything ever present, and
    // above every sequence a caller was given, even one whose commit the crash lost (the
    // bounded mode's loss must not hand its numbers out again).
    assert_counter_resumes_above(&store, log_only(WATCHED), max, handed_out, round).await;
    present.into_keys().collect()
}

fn crash_test(interval_ms: Option<u64>, live_readers: bool) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let mut rng = KillMoments::new(&format!(
        "crash_test(interval {interval_ms:?}, live readers {live_readers})"
    ));
    let mut reported_total = 0;
    // Each child's highest write-transaction count: they held recordings, acknowledgements
    // and the watches.
    let mut txns_total = 0;
    let mut lost_total = 0;
    let mut checked_rounds = 0;
    let mut handed_out = 0;
    // Dedupe hits on an event an earlier, killed writer stored (below `earlier`, the highest
    // sequence the file held at the last check): the event must still be there.
    let mut hits_across = 0;
    let mut earlier = 0;
    // Every sequence a child reported stored: none is handed out twice.
    let mut stored = BTreeSet::new();
    // Since the last check: the sequences the mode promised to keep, and every one reported.
    let mut must_have: BTreeMap<u64, usize> = BTreeMap::new();
    let mut unchecked = BTreeSet::new();
    // Children killed before they reported anything.
    let mut silent = 0;
    for round in 0..KILLS_PER_MODE {
        let mode = if live_readers {
            "record_live"
        } else {
            "record"
        };
        let child = spawn(mode, &path, interval_ms);
        // Most children run for a random while after their first commit and are killed
        // mid-stream; every fourth at a random moment from its start on, so that some kills
        // land while it opens or repairs the file (never one of the first two: the cursors
        // checked exist once a child reported).
        let mut lines = Vec::new();
        if round % 4 == 2 {
            std::thread::sleep(Duration::from_micros(rng.below(15_000)));
        } else {
            loop {
                let line = child.next_line();
                let report = line.1 != HEARTBEAT_LINE;
                lines.push(line);
                if report {
                    break;
                }
            }
            let delay = match interval_ms {
                None => Duration::from_millis(1 + rng.below(120)),
                Some(_) => Duration::from_millis(20 + rng.below(900)),
            };
            std::thread::sleep(delay);
        }
        let (killed_at, rest) = child.kill();
        lines.extend(rest);
        // The longest stall seen (see HEARTBEAT), then the reports alone.
        let stall = lines
            .iter()
            .filter(|(_, l)| l == HEARTBEAT_LINE)
            .map(|(at, _)| *at)
            .chain([killed_at])
            .collect::<Vec<_>>()
            .windows(2)
            .map(|w| w[1].saturating_duration_since(w[0]))
            .max()
            .unwrap_or(Duration::ZERO);
        lines.retain(|(_, l)| l != HEARTBEAT_LINE);
        silent += usize::from(lines.is_empty());
        let mut txns = 0;
        let mut across = BTreeMap::new();
        let reported: Vec<(Instant, u64, usize)> = lines
            .iter()
            .filter_map(|(at, l)| {
                let (s, t, n, hit) =
                    parse_report(l).unwrap_or_else(|| panic!("bad report line {l:?}"));
                txns = txns.max(n);
                if !hit {
                    return Some((*at, s, t));
                }
                if s <= earlier {
                    hits_across += 1;
                    across.insert(s, t);
                }
                None
            })
            .collect();
        reported_total += reported.len();
        txns_total += txns;
        let promise = interval_ms.map_or(Duration::ZERO, |ms| {
            Duration::from_millis(ms) + FLUSH_MARGIN + stall
        });
        must_have.extend(
            reported
                .iter()
                .filter(|(at, _, _)| killed_at.saturating_duration_since(*at) >= promise)
                .map(|(_, s, t)| (*s, *t)),
        );
        // In the file when this writer opened it, whatever the mode: still there.
        must_have.extend(across);
        for (_, s, _) in &reported {
            assert!(
                stored.insert(*s),
                "round {round}: sequence {s} handed out twice"
            );
            unchecked.insert(*s);
            handed_out = handed_out.max(*s);
        }
        // Every third file goes to the next child as the kill left it, for that child to
        // repair, and is checked after that child's kill, with what both reported.
        if round % 3 == 1 && round + 1 < KILLS_PER_MODE {
            continue;
        }
        if !must_have.is_empty() {
            checked_rounds += 1;
        }
        let present = rt.block_on(verify(&path, &must_have, handed_out, round));
        lost_total += unchecked.difference(&present).count();
        earlier = present.last().copied().unwrap_or(0);
        must_have.clear();
        unchecked.clear();
    }
    eprintln!(
        "  {KILLS_PER_MODE} kills ({silent} before a report), {reported_total} reported commits in at most {txns_total} write transactions (recordings, acknowledgements, watches), {lost_total} reported but lost (allowed only in the bounded mode), {checked_rounds} checks of commits the mode promised, {hits_across} dedupe hits on an event of an earlier writer"
    );
    assert!(
        hits_across > 0,
        "no dedupe hit on an event stored before a kill happened"
    );
    assert!(
        txns_total < reported_total as u64,
        "group commit never batched: {reported_total} recordings took {txns_total} transactions"
    );
    if interval_ms.is_none() {
        assert_eq!(lost_total, 0);
    } else {
        // Otherwise no kill lost a reported commit, and the check that lost numbers are not
        // handed out again (in `verify`) checked nothing.
        assert!(
            lost_total > 0,
            "no kill lost a reported commit: the bounded mode's loss was never exercised"
        );
    }
    assert!(
        checked_rounds >= KILLS_PER_MODE / 3,
        "too few checks had anything to check ({checked_rounds}): the test would prove nothing"
    );
}

fn crash_test_immediate() {
    crash_test(None, false);
}

fn crash_test_bounded() {
    crash_test(
        Some(u64::try_from(FLUSH_INTERVAL.as_millis()).unwrap()),
        false,
    );
}

/// `Immediate` with live readers: redb's `SingleWriter` mode commits in two phases, and the
/// file reopens in the default mode (`verify` opens it so), which repairs it.
fn crash_test_live_readers() {
    crash_test(None, true);
}

fn file_open_in_another_process_is_refused_not_waited_for() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let holder = spawn("hold", &path, None);
    assert_eq!(holder.next_line().1, "ready");
    let err = rt
        .block_on(open_at_once(
            &path,
            RedbOptions::default(),
            "a file held by another process",
        ))
        .expect_err("a file held by another process was opened twice");
    let canonical = std::fs::canonicalize(&path).unwrap();
    match &err {
        StoreError::Open {
            path: p,
            kind,
            reason,
            source,
        } => {
            assert!(p == &path || p == &canonical, "{}", p.display());
            assert_eq!(
                *kind,
                OpenFailure::InUse,
                "worth opening again once it is let go"
            );
            assert_eq!(
                reason,
                "another process has it open (a running gateway?): try again once it has exited"
            );
            assert!(source.is_some(), "redb's error is kept as the source");
        }
        other => panic!("expected StoreError::Open, got {other:?}"),
    }
    // Once the other process has let go, the file opens.
    release(holder);
    rt.block_on(async {
        let s = RedbStore::open(&path)
            .await
            .expect("open after the holder exited");
        s.record(log_only(0), Timestamp::now()).await.unwrap();
    });
}

fn read_only() -> RedbOptions {
    RedbOptions::default().read_only(true)
}

/// Opens `path` with `options`, an open that must answer at once (refuse, not wait for another
/// process): fails the test if it has not after [`HANG`].
async fn open_at_once(
    path: &Path,
    options: RedbOptions,
    what: &str,
) -> Result<RedbStore, StoreError> {
    tokio::time::timeout(HANG, RedbStore::open_with(path, options))
        .await
        .unwrap_or_else(|_| panic!("{what}: the open hung ({HANG:?}); it must refuse, not wait"))
}

/// The reason [`open_at_once`] refuses with, a [`StoreError::Open`] of a file in use
/// ([`OpenFailure::InUse`]); fails the test on anything else.
async fn open_refusal(path: &Path, options: RedbOptions, what: &str) -> String {
    match open_at_once(path, options, what).await {
        Err(StoreError::Open {
            reason,
            kind: OpenFailure::InUse,
            ..
        }) => reason,
        other => panic!("{what}: expected StoreError::Open, got {other:?}"),
    }
}

/// Stops a child that waits for its stdin to close, and checks it exited cleanly.
fn release(mut holder: Spawned) {
    drop(holder.child.stdin.take());
    let status = holder.wait("the holder's exit once its stdin closed");
    assert!(status.success(), "the holder exited cleanly ({status})");
}

/// Read-only handles of two processes share a file, which no process may then open read-write
/// in the default mode; a file open read-write in the default mode in another process is
/// refused to a read-only open too; a file whose writer was killed is refused read-only,
/// untouched, until a read-write open repairs it.
fn read_only_opens_across_processes() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    rt.block_on(async {
        let s = RedbStore::open(&path).await.unwrap();
        s.record(log_only(0), Timestamp::now()).await.unwrap();
        s.close().await;
    });

    let reader = spawn("hold_read_only", &path, None);
    assert_eq!(reader.next_line().1, "ready");
    rt.block_on(async {
        let s = RedbStore::open_with(&path, read_only())
            .await
            .expect("a second process opens the file read-only beside the first");
        assert_eq!(s.state_version(&target(0)).await.unwrap(), Sequence(1));
        s.close().await;
        let reason = open_refusal(&path, RedbOptions::default(), "read-write beside readers").await;
        assert_eq!(
            reason,
            "another process has it open (a running gateway?): try again once it has exited"
        );
    });
    release(reader);

    let writer = spawn("hold", &path, None);
    assert_eq!(writer.next_line().1, "ready");
    let reason = rt.block_on(open_refusal(
        &path,
        read_only(),
        "read-only beside a writer",
    ));
    assert_eq!(
        reason,
        "already open in another process, in a mode that excludes readers (a writer without live_readers)"
    );
    release(writer);

    let killed = spawn("flush", &path, None);
    while killed.next_line().1 != "done" {}
    drop(killed.kill());
    let before = std::fs::read(&path).unwrap();
    match rt.block_on(open_at_once(&path, read_only(), "read-only after a crash")) {
        Err(StoreError::NeedsRepair { path: p }) => {
            assert_eq!(p.file_name(), path.file_name());
        }
        other => panic!("read-only after a crash: expected StoreError::NeedsRepair, got {other:?}"),
    }
    assert!(
        std::fs::read(&path).unwrap() == before,
        "a refused read-only open left the file as it was"
    );
    rt.block_on(async {
        RedbStore::open(&path).await.expect("repair").close().await;
        let s = RedbStore::open_with(&path, read_only())
            .await
            .expect("read-only once repaired");
        assert_eq!(
            s.state_version(&target(0)).await.unwrap(),
            Sequence(6),
            "the 5 flushed commits after the first survive, the 5 unflushed ones do not"
        );
    });
}

/// A read-only handle of one process beside a writer of another that lets readers in: it reads
/// the writer's commits, made before and after it opened, while no second writer may open the
/// file; once the writer is gone, a read-write open works.
fn a_live_reader_in_another_process_follows_the_writer() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let mut writer = spawn("live", &path, None);
    assert_eq!(writer.next_line().1, "recorded 1");
    let mut stdin = writer.child.stdin.take().expect("the writer's stdin");
    rt.block_on(async {
        let reader = RedbStore::open_with(&path, read_only())
            .await
            .expect("a reader beside a writer with live readers");
        assert_eq!(reader.state_version(&target(0)).await.unwrap(), Sequence(1));
        for n in 2..=4 {
            writeln!(stdin, "more").expect("ask the writer for a commit");
            assert_eq!(writer.next_line().1, format!("recorded {n}"));
            assert_eq!(
                reader.state_version(&target(0)).await.unwrap(),
                Sequence(n),
                "the reader sees the commit the writer reported"
            );
        }
        assert_eq!(logged(&reader).await, [1, 2, 3, 4]);
        assert!(matches!(
            reader.record(log_only(0), now()).await,
            Err(StoreError::ReadOnly { .. })
        ));
        // (This process's reader closes first: its read lock would refuse a writer here.)
        reader.close().await;
        for options in [
            RedbOptions::default(),
            RedbOptions::default().live_readers(true),
        ] {
            let reason = open_refusal(&path, options, "a second writer").await;
            assert_eq!(
                reason,
                "another process has it open (a running gateway?): try again once it has exited"
            );
        }
    });
    drop(stdin);
    let status = writer.wait("the writer's exit once its stdin closed");
    assert!(status.success(), "the writer exited cleanly ({status})");
    rt.block_on(async {
        let s = RedbStore::open(&path)
            .await
            .expect("open once the writer is gone");
        assert_eq!(s.state_version(&target(0)).await.unwrap(), Sequence(4));
    });
}

/// A reader opened while no writer runs does not keep a writer with live readers from starting
/// (the reader joins in the writer's mode, not in one that excludes it), and then follows it.
fn a_reader_opened_first_lets_a_live_writer_start() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    rt.block_on(async {
        let s = RedbStore::open(&path).await.unwrap();
        s.record(log_only(0), now()).await.unwrap();
        s.close().await;
    });
    let reader = rt
        .block_on(RedbStore::open_with(&path, read_only()))
        .expect("a reader with no writer");
    let writer = spawn("live", &path, None);
    assert_eq!(
        writer.next_line().1,
        "recorded 2",
        "the writer started beside the reader"
    );
    assert_eq!(
        rt.block_on(reader.state_version(&target(0))).unwrap(),
        Sequence(2)
    );
    rt.block_on(reader.close());
    release(writer);
}

fn sequences(lines: &[(Instant, String)], prefix: &str) -> Vec<u64> {
    lines
        .iter()
        .filter_map(|(_, l)| l.strip_prefix(prefix)?.trim().parse().ok())
        .collect()
}

fn bounded_flush_makes_durable_and_unflushed_commits_are_not() {
    let rt = runtime();
    let (_dir, path, lines) = child_done("flush");
    let durable = sequences(&lines, "durable ");
    let pending = sequences(&lines, "pending ");
    assert_eq!((durable.len(), pending.len()), (5, 5));
    rt.block_on(async {
        let s = RedbStore::open(&path).await.unwrap();
        let present = logged(&s).await;
        assert_eq!(
            present, durable,
            "flushed commits survive, unflushed ones are lost"
        );
        assert_eq!(
            s.state_version(&target(0)).await.unwrap(),
            Sequence(durable[4])
        );
    });
}

/// With `Immediate` durability a watch, an acknowledgement and an unwatch survive a SIGKILL
/// right after they return, with no recording after them: each commits durably itself. (A
/// review of stop 55 made them commit with `Durability::None` and every test passed: the crash
/// test reports recordings only.)
fn immediate_cursor_writes_survive_a_kill() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let child = spawn("cursor_writes", &path, None);
    let (_, line) = child.next_line();
    let recorded: u64 = line
        .strip_prefix("done ")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("child said {line:?}"));
    drop(child.kill());
    rt.block_on(async {
        let s = RedbStore::open(&path).await.unwrap();
        let c = s
            .cursor(&watcher(), &target(1).session_key)
            .await
            .unwrap()
            .expect("the watch survived");
        assert_eq!(
            (c.last_seen, c.notified),
            (Sequence(recorded), Sequence(recorded)),
            "the acknowledgement survived"
        );
        assert_eq!(
            s.cursor(&watcher(), &target(2).session_key).await.unwrap(),
            None,
            "the unwatch survived"
        );
    });
}

/// In the bounded mode, the numbers a lost commit took are never handed out again: the commit
/// that raises the reservation of sequences is durable, so a kill that loses every recording
/// after it leaves the counter past them at the next open. (A review of stop 55 made that
/// commit not durable: only the random crash test could see it, about once in six runs.)
fn bounded_lost_sequences_are_never_handed_out_again() {
    let rt = runtime();
    let (_dir, path, lines) = child_done("reserve");
    let handed_out = sequences(&lines, "recorded ");
    assert_eq!(handed_out.len(), 3);
    rt.block_on(async {
        let s = RedbStore::open(&path).await.unwrap();
        assert!(
            logged(&s).await.len() < handed_out.len(),
            "the kill lost the recordings after the reservation (the test's premise)"
        );
        let next = s.record(log_only(0), now()).await.unwrap().event.sequence;
        let highest = handed_out.iter().max().copied().unwrap_or_default();
        assert!(
            next.get() > highest,
            "sequence {next} handed out again (the lost commits took up to {highest})"
        );
    });
}

/// In the bounded mode, a write commit that stands in for a flush waiting for redb's write lock
/// is durable: once the flush has returned, what it covered survives a kill. The child's
/// delete of a session of many events (a long transaction) stands in for its flush; after the
/// kill the session has either no events (the delete was durable) or all of them (the flush
/// took the lock first and committed itself, and the delete after it, not durable, was lost):
/// anything else lost commits that the flush had returned over. (A review of stop 57 removed
/// the stand-in's `set_durability(Immediate)` in `Writer::commit`, keeping its report to the
/// flush, and every test passed: the flush then returned over nothing durable.)
fn bounded_flush_stood_in_for_by_a_write_is_durable() {
    let rt = runtime();
    for round in 0..3 {
        let (_dir, path, lines) = child_done("stand_in");
        let said: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(said, ["recorded", "flushed", "done"], "round {round}");
        rt.block_on(async {
            let s = RedbStore::open(&path).await.unwrap();
            let rows = s.log_stats().await.unwrap().rows;
            assert!(
                rows == 0 || rows == STAND_IN_EVENTS,
                "round {round}: {rows} of the {STAND_IN_EVENTS} events of the session survived \
                 the kill: the flush returned over commits that were not durable"
            );
            s.close().await;
        });
    }
}

/// In the bounded mode, a handle raises the reservation of sequences again (durably) each time
/// its allocations pass it, not only the first time: the numbers handed out past the first
/// reservation and then lost in a kill are not handed out again at the next open. (A review of
/// stop 57 made `EventTables::reserve_ahead` raise it only once, `if counter <= reserved ||
/// reserved != 0`, and every test passed: they never allocate 2^20 numbers in one open.)
fn bounded_reservation_is_raised_again_past_the_first() {
    let rt = runtime();
    let (_dir, path, lines) = child_done("reserve_again");
    let handed_out = sequences(&lines, "recorded ");
    assert_eq!(handed_out.len(), 3);
    assert!(
        handed_out[1] > PAST_FIRST_RESERVATION,
        "the test's premise: the last two recordings passed the first reservation ({handed_out:?})"
    );
    rt.block_on(async {
        let s = RedbStore::open(&path).await.unwrap();
        let next = s.record(log_only(0), now()).await.unwrap().event.sequence;
        let highest = handed_out.iter().max().copied().unwrap_or_default();
        assert!(
            next.get() > highest,
            "sequence {next} is not above {highest}, which the child handed out: the numbers \
             up to it would be handed out again"
        );
    });
}

fn bounded_close_makes_everything_durable() {
    let rt = runtime();
    let (_dir, path, lines) = child_done("close");
    let closed = sequences(&lines, "closed ");
    assert_eq!(closed.len(), 5);
    rt.block_on(async {
        let s = RedbStore::open(&path).await.unwrap();
        let present = logged(&s).await;
        assert_eq!(present, closed);
    });
}

/// A commit that fails writing the file (here a file-size limit, as a full disk would) leaves
/// redb refusing every write until the database is reopened: the next write says so, and a
/// second open in the process is refused with that reason instead of sharing a database that
/// cannot write. Before, the write answered redb's own error (an I/O error, or "corrupt") and
/// the open shared the database.
///
/// The refusals repeat the real cause ("File too large", EFBIG), whether the failure came at
/// a commit, inside a write transaction (growing the file), or in a group commit (`fill_batch`,
/// whose jobs are then recorded again alone). Before, a failure inside a write transaction was
/// remembered as redb's generic refusal ("Previous I/O error occurred..."), so every later
/// refusal (and every job of a failed batch) named that instead, and the real error was
/// logged only at debug level.
///
/// The same for a write other than a recording (`fill_links`: adoptions, whose upstream links
/// grow the file). (What the mutation did: such a write no longer checked the database after
/// its failure, and the second open shared the broken database; review of stop 65, RB04.)
fn a_failed_commit_is_named_and_its_database_not_shared() {
    // The bounded mode's flush interval outlasts the test: no flush may be what notices the
    // failure (its next transaction would), the failing write itself must.
    for (mode, interval) in [
        ("fill", None),
        ("fill", Some(600_000)),
        ("fill_batch", None),
        ("fill_batch", Some(600_000)),
        ("fill_links", None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("full.redb");
        // 8 MiB (`ulimit -f` counts 1 KiB blocks in bash, 512 B in dash: 4 MiB there), and
        // SIGXFSZ ignored, so that a write past it fails with EFBIG instead of killing the
        // child.
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg("trap '' XFSZ; ulimit -f 8192 && exec \"$0\"")
            .arg(std::env::current_exe().unwrap())
            .env(CHILD, mode)
            .env(PATH, &path);
        if let Some(ms) = interval {
            cmd.env(INTERVAL_MS, ms.to_string());
        }
        let out = output_within(&mut cmd, &format!("the {mode} child"));
        let text = stdout_of_success(&out, &format!("{mode} {interval:?}"));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{interval:?}: {text}");
        eprintln!("  {mode} {interval:?}:\n  {}", lines.join("\n  "));
        assert!(lines[0].starts_with("failed after "), "{text}");
        assert!(
            lines[2].starts_with("next ")
                && lines[2].contains("refuses every write until the database is reopened"),
            "{interval:?}: {text}"
        );
        for line in [lines[0], lines[2]] {
            assert!(
                line.contains("File too large") && !line.contains("Previous I/O"),
                "{mode} {interval:?}: the real cause: {text}"
            );
        }
        if mode == "fill_batch" {
            let largest: usize = lines[0]
                .split_once("(largest batch ")
                .and_then(|(_, rest)| rest.split_once(')'))
                .and_then(|(n, _)| n.parse().ok())
                .unwrap_or_else(|| panic!("{interval:?}: no largest batch in {text}"));
            assert!(largest >= 2, "{interval:?}: recorded in batches: {text}");
        }
        for (line, open) in [(lines[1], "second"), (lines[3], "read-only")] {
            assert!(
                line.starts_with(&format!("{open} refused"))
                    && line.contains("a write failed on it"),
                "{interval:?}: {text}"
            );
        }
    }
}

/// An open that creates the file and then fails (here redb cannot write the new file's header:
/// a file-size limit of nothing, as a full disk would) says why, and leaves at most an empty
/// file, which the next creating open makes a store ([`StoreError::Open`]'s promise; removing
/// it could remove a store another opener made of it meanwhile).
fn a_failed_create_leaves_an_empty_file_the_next_open_makes_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.redb");
    let out = output_within(
        Command::new("sh")
            .arg("-c")
            .arg("trap '' XFSZ; ulimit -f 0 && exec \"$0\"")
            .arg(std::env::current_exe().unwrap())
            .env(CHILD, "create")
            .env(PATH, &path),
        "the create child",
    );
    let text = stdout_of_success(&out, "the create child");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with("refused ") && lines[0].contains("File too large"),
        "{text}"
    );
    assert_eq!(lines[1], "exists true", "{text}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "empty");
    let rt = runtime();
    rt.block_on(async {
        let store = RedbStore::open(&path).await.expect("a store made of it");
        store
            .record(log_only(0), Timestamp::now())
            .await
            .expect("record");
        store.close().await;
    });
}

fn main() {
    if let Ok(mode) = std::env::var(CHILD) {
        run_child(&mode);
        return;
    }
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let tests: [(&str, fn()); 15] = [
        (
            "immediate_cursor_writes_survive_a_kill",
            immediate_cursor_writes_survive_a_kill,
        ),
        (
            "bounded_flush_stood_in_for_by_a_write_is_durable",
            bounded_flush_stood_in_for_by_a_write_is_durable,
        ),
        (
            "bounded_reservation_is_raised_again_past_the_first",
            bounded_reservation_is_raised_again_past_the_first,
        ),
        (
            "bounded_lost_sequences_are_never_handed_out_again",
            bounded_lost_sequences_are_never_handed_out_again,
        ),
        (
            "a_failed_create_leaves_an_empty_file_the_next_open_makes_a_store",
            a_failed_create_leaves_an_empty_file_the_next_open_makes_a_store,
        ),
        (
            "a_failed_commit_is_named_and_its_database_not_shared",
            a_failed_commit_is_named_and_its_database_not_shared,
        ),
        (
            "file_open_in_another_process_is_refused_not_waited_for",
            file_open_in_another_process_is_refused_not_waited_for,
        ),
        (
            "bounded_flush_makes_durable_and_unflushed_commits_are_not",
            bounded_flush_makes_durable_and_unflushed_commits_are_not,
        ),
        (
            "bounded_close_makes_everything_durable",
            bounded_close_makes_everything_durable,
        ),
        (
            "read_only_opens_across_processes",
            read_only_opens_across_processes,
        ),
        ("crash_test_immediate", crash_test_immediate),
        ("crash_test_bounded", crash_test_bounded),
        ("crash_test_live_readers", crash_test_live_readers),
        (
            "a_live_reader_in_another_process_follows_the_writer",
            a_live_reader_in_another_process_follows_the_writer,
        ),
        (
            "a_reader_opened_first_lets_a_live_writer_start",
            a_reader_opened_first_lets_a_live_writer_start,
        ),
    ];
    let mut ran = 0;
    for (name, test) in tests {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let started = Instant::now();
        eprintln!("test {name} ...");
        test();
        eprintln!("test {name} ... ok ({:.1?})", started.elapsed());
        ran += 1;
    }
    eprintln!("test result: ok. {ran} passed");
}
