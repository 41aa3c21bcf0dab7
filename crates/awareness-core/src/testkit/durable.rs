//! What a file keeps, checked the same way on every store that keeps its state in one (the
//! durable ones): everything committed survives closing and reopening the store, a store
//! closed through its last handle leaves every commit in its one file, the store-wide
//! sequence never goes back across reopens, two handles on one file see each other's writes
//! (and, where they are two writers, each other's commits as foreign ones),
//! a write cancelled midway leaves the file to the others at once, pruning cancelled midway
//! leaves every loss behind a watermark, an event row that can no longer be read fails only the
//! recording that meets it, and
//! a cursor row that can no longer be read is left out of what reads many cursors.
//! store-memory has no file and does not run these.
//!
//! A store provides an async factory that opens the file it is given (creating it when missing)
//! and stamps the checks with [`crate::durable_suite!`]:
//!
//! ```text
//! async fn open(path: std::path::PathBuf)
//!     -> Result<awareness_core::testkit::Subject, awareness_core::StoreError>
//! { /* open the store on that file */ }
//! awareness_core::durable_suite!(open, foreign_commits: Counted); // or Uncounted
//! ```
//!
//! A check closes a store by dropping its [`Subject`], as a gateway that stops does: whatever
//! was committed must then be in the file, whatever durability the store was opened with (a
//! store that defers durability makes it durable when its last handle goes).

use std::fmt::Write as _;
use std::future::Future;
use std::path::Path;

use super::checks::{T0, child, human, link_spec, log_only, r, rec, spawn, w};
use super::{OpenFile, Scratch, Subject, observe, poll_once};
use crate::model::{CursorKey, NewEvent, Sequence, SessionRef, Timestamp};
use crate::protocol::AckTarget;
use crate::retention::PruneStep;
use crate::store::{AwarenessStore, AwarenessStoreExt as _};
use serde_json::json;

const LATER: Timestamp = Timestamp(T0.0 + 2 * Timestamp::DAY_MS);

pub(crate) async fn open(open: &impl OpenFile, file: &Path) -> Subject {
    open(file.to_path_buf())
        .await
        .unwrap_or_else(|e| panic!("open {}: {e}", file.display()))
}

/// Two handles on one new file in a scratch directory (dropped with it).
async fn two_handles(f: &impl OpenFile) -> (Scratch, Subject, Subject) {
    let dir = Scratch::new("durable");
    let a = open(f, &dir.file()).await;
    let b = open(f, &dir.file()).await;
    (dir, a, b)
}

/// Everything the store answers about what it holds ([`observe`]) and its upstream links.
pub(crate) async fn everything(t: &Subject, refs: &[SessionRef]) -> String {
    let mut out = observe(&*t.store, refs).await;
    writeln!(out, "{:?}", t.upstream.links().await.expect("links")).expect("write");
    out
}

/// The sessions [`fill`] writes to: a watched child (with a dedupe key), an old session whose
/// events are pruned, and another agent's session.
pub(crate) fn filled_refs() -> [SessionRef; 3] {
    [
        child(),
        r("agent:main:old", "main"),
        r("agent:ops:main", "ops"),
    ]
}

/// Writes a bit of everything a store keeps into a new store: events with and without a
/// dedupe key (and a hit), a watch with a pending notice and an acknowledged one, a pruned
/// session that keeps its head and watermark, and an upstream link (sequences 1 to 9 spent).
/// Returns what the store then answers ([`everything`] of [`filled_refs`]).
pub(crate) async fn fill(t: &Subject) -> String {
    let manager = w("agent:main:main");
    let [kid, old, peer] = filled_refs();
    rec(&*t.store, log_only(&old, "old one"), T0).await; // 1
    rec(&*t.store, log_only(&old, "old two"), T0).await; // 2
    t.store.watch(&manager, &kid, LATER).await.expect("watch");
    for _ in 0..3 {
        rec(&*t.store, human(&kid), LATER).await; // 3, 4, 5
    }
    let first = rec(&*t.store, human(&kid).with_dedupe_key("once"), LATER).await; // 6
    let hit = rec(&*t.store, human(&kid).with_dedupe_key("once"), LATER).await; // 7, spent
    assert!(hit.deduplicated && hit.event == first.event);
    rec(&*t.store, human(&peer), LATER).await; // 8
    t.store
        .acknowledge(&manager, &[AckTarget::any(kid.session_key.clone())], LATER)
        .await
        .expect("acknowledge");
    let pending = rec(&*t.store, human(&kid), LATER).await; // 9
    assert_eq!(pending.event.sequence, Sequence(9));
    assert_eq!(
        pending.notices.len(),
        1,
        "the acknowledged watcher is told again"
    );
    let cutoff = T0.plus_ms(Timestamp::DAY_MS);
    let pruned = t
        .store
        .prune_chunk(&PruneStep::Age { cutoff }, 100, cutoff)
        .await
        .expect("prune");
    assert_eq!(pruned, 2, "the two old events go");
    t.upstream
        .upsert_link(link_spec(&kid, "t1", 7), LATER)
        .await
        .expect("upsert a link");
    let heads = t
        .store
        .heads(std::slice::from_ref(&old))
        .await
        .expect("heads");
    assert_eq!(
        heads
            .iter()
            .map(|h| (h.last_sequence, h.pruned_max_sequence))
            .collect::<Vec<_>>(),
        [(Sequence(2), Sequence(2))],
        "the old ref keeps its head and its watermark"
    );
    everything(t, &filled_refs()).await
}

/// A store closed and opened again answers exactly as before: events with every field, heads
/// with their pruned watermark, cursors with pending notices, upstream links; a dedupe key still
/// names its row, and a hit still spends one sequence after the last one spent.
pub async fn everything_committed_survives_a_reopen(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let file = dir.file();
    let refs = filled_refs();
    let [kid, _, peer] = refs.clone();
    let before = fill(&open(&f, &file).await).await;
    let t = open(&f, &file).await;
    assert_eq!(
        everything(&t, &refs).await,
        before,
        "the store answers the same after a reopen"
    );
    let hit = rec(&*t.store, human(&kid).with_dedupe_key("once"), LATER).await;
    assert!(hit.deduplicated, "the dedupe key survives a reopen");
    assert_eq!(hit.event.sequence, Sequence(6));
    let next = rec(&*t.store, human(&peer), LATER).await;
    assert_eq!(
        next.event.sequence,
        Sequence(11),
        "the hit after the reopen spent 10, and 9 was the last before it"
    );
}

/// Opens a copy of the closed store's `file` alone, without any file beside it (SQLite's
/// write-ahead log), and asserts that it answers about `refs` as `file` does with whatever lies
/// beside it. Returns the copy, for checks of its own.
async fn copy_alone_answers_as_the_file(
    f: &impl OpenFile,
    dir: &Scratch,
    refs: &[SessionRef],
    what: &str,
) -> Subject {
    let file = dir.file();
    let copy = dir.path().join("copy");
    std::fs::copy(&file, &copy).expect("copy the closed file alone");
    let alone = open(f, &copy).await;
    assert_eq!(
        everything(&alone, refs).await,
        everything(&open(f, &file).await, refs).await,
        "{what}: the file alone holds every commit"
    );
    alone
}

/// A store closed through [`EventStore::close`](crate::EventStore::close) on its last handle
/// leaves every commit in its one file: a copy of that file alone, without any file beside it
/// (SQLite's write-ahead log), answers exactly as the store did.
pub async fn a_closed_store_leaves_every_commit_in_its_file(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let file = dir.file();
    let t = open(&f, &file).await;
    let before = fill(&t).await;
    t.close().await;
    let alone = copy_alone_answers_as_the_file(&f, &dir, &filled_refs(), "closed").await;
    assert_eq!(
        everything(&alone, &filled_refs()).await,
        before,
        "the closed file alone answers as the store did"
    );
}

/// A store closed at once after a write was given up midway still closes cleanly: the closed
/// file alone answers as the file with whatever lies beside it does (the given-up write is
/// in both or in neither).
pub async fn a_store_closed_right_after_a_cancelled_write_leaves_it_in_its_file(f: impl OpenFile) {
    let kid = child();
    let manager = w("agent:main:main");
    let refs = [kid.clone()];
    let mut cancelled = 0;
    for polls in 1..=3 {
        let dir = Scratch::new("durable");
        let file = dir.file();
        let t = open(&f, &file).await;
        t.store.watch(&manager, &kid, T0).await.expect("watch");
        rec(&*t.store, human(&kid), T0).await;
        // A write can finish within its polls (its connection's thread ran it on the other
        // core): such a write is committed, and the next one is tried, up to twenty.
        let mut finished = 0;
        while finished < 20 {
            if give_up_after(polls, t.store.record(human(&kid), T0)).await {
                cancelled += 1;
                break;
            }
            finished += 1;
        }
        t.close().await;
        let what = format!("closed right after a write given up at poll {polls}");
        let c = copy_alone_answers_as_the_file(&f, &dir, &refs, &what).await;
        // What committed before the given-up write is there, whatever became of that write.
        let version = c.store.state_version(&kid).await.expect("version");
        let committed = Sequence(1 + finished);
        assert!(
            [committed, committed.next()].contains(&version),
            "the recordings that finished ({committed:?}), and the given-up one or not: {version:?}"
        );
        let cursor = c
            .store
            .cursor(&manager, &kid.session_key)
            .await
            .expect("cursor")
            .expect("the watch committed first");
        assert_eq!(
            cursor.material, version,
            "the cursor moved with each commit"
        );
    }
    assert!(cancelled > 0, "no write was given up midway");
}

/// Closing the last handle on a file keeps in it what another handle of the process left
/// running when it was dropped (recordings whose callers gave up): once the close returns, the
/// file alone, copied, answers as the file with whatever lies beside it.
pub async fn closing_the_last_handle_keeps_what_a_dropped_handle_left_running(f: impl OpenFile) {
    let kid = child();
    let refs = [kid.clone()];
    let (dir, a, b) = two_handles(&f).await;
    rec(&*a.store, human(&kid), T0).await;
    let mut cancelled = 0;
    for _ in 0..20 {
        cancelled += usize::from(give_up_after(1, a.store.record(human(&kid), T0)).await);
    }
    assert!(cancelled > 0, "no recording was left running");
    drop(a);
    b.close().await;
    let c = copy_alone_answers_as_the_file(&f, &dir, &refs, "after a dropped handle").await;
    assert!(
        c.store.state_version(&kid).await.expect("version") >= Sequence(1),
        "the first recording is in the file"
    );
}

/// Runs `work` on a runtime of its own on a thread of its own, then shuts that runtime down,
/// giving it five seconds (a runtime waits for its blocking tasks: a store's task that never
/// ends fails the check here, named as such, rather than as the work).
async fn elsewhere<T: Send + 'static>(
    what: &str,
    work: impl Future<Output = T> + Send + 'static,
) -> T {
    const SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(5);
    let (answer, answered) = tokio::sync::oneshot::channel();
    let (shut, shut_down) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        drop(answer.send(runtime.block_on(work)));
        let started = std::time::Instant::now();
        runtime.shutdown_timeout(SHUTDOWN);
        shut.send(started.elapsed()).ok();
    });
    let minute = std::time::Duration::from_mins(1);
    let got = tokio::time::timeout(minute, answered)
        .await
        .unwrap_or_else(|_| panic!("{what}: still running after a minute"))
        .unwrap_or_else(|_| panic!("{what}: the thread panicked"));
    let took = tokio::time::timeout(minute, shut_down)
        .await
        .unwrap_or_else(|_| panic!("{what}: its runtime still shutting down after a minute"))
        .unwrap_or_else(|_| panic!("{what}: the thread panicked while shutting down"));
    assert!(
        took < SHUTDOWN,
        "{what}: the runtime's shutdown waited {took:?} for a task the store left running"
    );
    got
}

/// A runtime dropped on a thread of its own when this is dropped (a runtime may not be dropped
/// on an async thread), also while a failed check unwinds.
struct DroppedElsewhere(Option<tokio::runtime::Runtime>);

impl Drop for DroppedElsewhere {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            std::thread::spawn(move || drop(runtime));
        }
    }
}

/// A store is not tied to a runtime that used it: opened here, it takes sixteen recordings at
/// once on a runtime of another thread, which is then shut down (within five seconds: no task
/// of the store keeps it); it records here again (no writer, worker or task it needs ended
/// with that runtime); it is closed on a third runtime, which returns; and the file, reopened,
/// holds every event. Before the last recording, writes cancelled midway inside a runtime's
/// `block_on` that then returned, the runtime kept alive and never driven again: whatever the
/// store left to finish them (a rollback) must not wait on that runtime, or every later write
/// and the close wait for ever. (Those writes come one at a time: a batch of other callers'
/// recordings started there and left is not checked.) A gateway may hand its store to another
/// runtime, or call it from a short-lived runtime of a blocking tool. Each step is given a
/// minute: a store waiting on a runtime that is gone hangs. (The runtime that opened the store
/// lives on here: an open on a short-lived runtime is not checked.)
pub async fn a_store_outlives_the_runtimes_that_used_it(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let file = dir.file();
    let kid = child();
    let t = open(&f, &file).await;
    let mut sequences = elsewhere("sixteen recordings at once on another runtime", {
        let store = std::sync::Arc::clone(&t.store);
        let e = human(&kid);
        async move {
            let calls: Vec<_> = (0..16)
                .map(|_| {
                    let (store, e) = (std::sync::Arc::clone(&store), e.clone());
                    tokio::spawn(async move { store.record(e, T0).await })
                })
                .collect();
            let mut got = Vec::new();
            for call in calls {
                let rec = call
                    .await
                    .expect("join")
                    .expect("a recording on another runtime");
                got.push(rec.event.sequence);
            }
            got
        }
    })
    .await;
    sequences.sort();
    // Writes (on another session) given up after one to three polls, on a runtime that is
    // then left alive and undriven until the end of the check.
    let (idle, idled) = tokio::sync::oneshot::channel();
    std::thread::spawn({
        let store = std::sync::Arc::clone(&t.store);
        let other = r("agent:main:subagent:cancelled", "main");
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let cancelled = runtime.block_on(async {
                let mut cancelled = 0;
                for polls in 0..30 {
                    let call = store.record(human(&other), T0);
                    cancelled += usize::from(give_up_after(1 + polls % 3, call).await);
                }
                cancelled
            });
            // This thread's handle goes before the answer, so that the close below is the last
            // handle's.
            drop(store);
            drop(idle.send((DroppedElsewhere(Some(runtime)), cancelled)));
        }
    });
    let (undriven, cancelled) = tokio::time::timeout(std::time::Duration::from_mins(1), idled)
        .await
        .expect("writes cancelled on another runtime: still running after a minute")
        .expect("writes cancelled on another runtime: the thread panicked");
    assert!(cancelled > 0, "no write was given up midway");
    let last = tokio::time::timeout(
        std::time::Duration::from_mins(1),
        t.store.record(human(&kid), T0),
    )
    .await
    .expect("a recording here, once the other runtime is gone, still running after a minute")
    .expect("a recording here, once the other runtime is gone");
    assert!(
        last.event.sequence > sequences[15],
        "a later sequence (the cancelled writes may have spent some)"
    );
    sequences.push(last.event.sequence);
    elsewhere("a close on another runtime", t.close()).await;
    let t = open(&f, &file).await;
    let page = t
        .store
        .changes_since(&kid, Sequence::ZERO, 100)
        .await
        .expect("changes");
    assert_eq!(
        page.events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        sequences,
        "every event is in the file"
    );
    drop(undriven);
}

/// The store-wide sequence resumes after the highest number ever spent, across reopens, even
/// when the rows that held the highest numbers are gone: a deleted session, a dedupe hit (which
/// leaves no row), a row deleted by hand, the whole log pruned.
pub async fn the_sequence_never_goes_back_across_reopens(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let file = dir.file();
    let kid = child();
    let peer = r("agent:ops:main", "ops");
    {
        let t = open(&f, &file).await;
        rec(&*t.store, human(&kid), T0).await; // 1
        rec(&*t.store, human(&peer).with_dedupe_key("k"), T0).await; // 2
        assert!(
            rec(&*t.store, human(&peer).with_dedupe_key("k"), T0)
                .await
                .deduplicated
        ); // 3, spent
        rec(&*t.store, human(&peer), T0).await; // 4
        t.store.delete_session(&peer).await.expect("delete");
    }
    let top = {
        let t = open(&f, &file).await;
        let next = rec(&*t.store, human(&kid), T0).await.event.sequence;
        assert_eq!(
            next,
            Sequence(5),
            "after deleting the session holding 2 to 4, one of them a dedupe hit"
        );
        t.raw.delete_event_row(next).await.expect("delete a row");
        next
    };
    {
        let t = open(&f, &file).await;
        let next = rec(&*t.store, human(&kid), T0).await.event.sequence;
        assert_eq!(next, top.next(), "after deleting the highest row by hand");
        let pruned = t
            .store
            .prune_chunk(&PruneStep::RowCap { max_rows: 0 }, 100, T0)
            .await
            .expect("prune");
        assert_eq!(pruned, 2, "every retained row goes");
    }
    let t = open(&f, &file).await;
    assert_eq!(t.store.log_stats().await.expect("stats").rows, 0);
    let next = rec(&*t.store, human(&kid), T0).await.event.sequence;
    assert_eq!(next, Sequence(7), "after pruning the whole log");
}

/// Two handles on one file are two writers when the store says so
/// ([`crate::EventStore::foreign_commits`] answers a number): each one's commits change what the
/// other answers, and leave its own answer alone. A store stamped
/// `foreign_commits: Uncounted` (its handles share one writer) answers `None` on both, before
/// and after the other's commits.
pub async fn each_handle_sees_the_other_handles_commits_as_foreign(
    f: impl OpenFile,
    foreign_commits: super::ForeignCommits,
) {
    let (_dir, a, b) = two_handles(&f).await;
    let foreign = async |t: &Subject| t.store.foreign_commits().await.expect("foreign_commits");
    let kid = child();
    let manager = w("agent:main:main");
    let (a0, b0) = (foreign(&a).await, foreign(&b).await);
    foreign_commits.assert_answer("the first handle", a0);
    foreign_commits.assert_answer("the second handle", b0);
    if !foreign_commits.counted() {
        rec(&*a.store, human(&kid), T0).await;
        b.store.watch(&manager, &kid, T0).await.expect("watch");
        assert_eq!((foreign(&a).await, foreign(&b).await), (None, None));
        return;
    }
    rec(&*a.store, human(&kid), T0).await;
    let b1 = foreign(&b).await;
    assert_ne!(b1, b0, "`b` is told of the recording `a` committed");
    assert_eq!(
        foreign(&a).await,
        a0,
        "`a` is not told of its own recording"
    );
    assert_eq!(foreign(&b).await, b1, "nothing was committed since");
    b.store.watch(&manager, &kid, T0).await.expect("watch");
    let a1 = foreign(&a).await;
    assert_ne!(a1, a0, "`a` is told of the watch `b` committed");
    let told = rec(&*a.store, human(&kid), T0).await;
    assert_eq!(
        told.notices.len(),
        1,
        "the recording of `a` hands out a notice"
    );
    assert_eq!(foreign(&a).await, a1);
    let b2 = foreign(&b).await;
    assert_ne!(
        b2, b1,
        "`b`, whose gateway owns the watcher, is told a notice may be waiting"
    );
    // The cursor is frozen at the notice just handed out: re-freezing it (a start-up sweep)
    // re-delivers the notice and changes nothing (decision 0002), so no other writer is sent to
    // look for notices. (SQLite leaves a page clean when a row is rewritten with the same
    // bytes, so this guards against a re-freeze that changes the row, such as one moving
    // `updated_at`; store-redb, which answers `None`, counts its commits in a test of its own.)
    let key = CursorKey {
        watcher: manager.clone(),
        target: kid.session_key.clone(),
    };
    let again = a
        .store
        .refreeze(std::slice::from_ref(&key), T0.plus_ms(1))
        .await
        .expect("refreeze");
    assert_eq!(again, told.notices, "the notice is re-delivered");
    assert_eq!(
        foreign(&b).await,
        b2,
        "a re-freeze of a frozen cursor committed a write"
    );
    // Nor does watching it again within a day (decision 0018: `updated_at` is refreshed only
    // after a day).
    a.store
        .watch(&manager, &kid, T0.plus_ms(2))
        .await
        .expect("watch again");
    assert_eq!(
        foreign(&b).await,
        b2,
        "a repeated watch within a day committed a write"
    );
    // Nor do writes that find nothing to change: an acknowledgement of a target the watcher has
    // no cursor on, a reset of a session that watches nothing, a deletion of a session the
    // store has never heard of, an unwatch of no watch. Counted as commits, each would send
    // every other gateway looking for notices (store-postgres committed and notified them all
    // the same under mutation, and every test passed: review of stop 60).
    let nobody = r("agent:main:subagent:nobody", "main");
    a.store
        .acknowledge(&manager, &[AckTarget::any(nobody.session_key.clone())], T0)
        .await
        .expect("acknowledge nothing");
    assert_eq!(foreign(&b).await, b2, "an acknowledgement of nothing");
    assert_eq!(
        a.store
            .reset_watcher(&nobody.session_key)
            .await
            .expect("reset nothing"),
        0
    );
    assert_eq!(foreign(&b).await, b2, "a reset of a watcher of nothing");
    a.store
        .delete_session(&nobody)
        .await
        .expect("delete nothing");
    assert_eq!(foreign(&b).await, b2, "a deletion of an unknown session");
    assert!(
        !a.store
            .unwatch(&manager, &nobody.session_key)
            .await
            .expect("unwatch nothing")
    );
    assert_eq!(foreign(&b).await, b2, "an unwatch of no watch");
    // Nor does a pruning chunk that finds nothing to delete, of each kind: events older than the
    // oldest, rows beyond a cap the log is under, cursors idle since before the newest was
    // touched. (store-postgres committed an idle-cursor chunk that deleted none under mutation,
    // and every test passed: review of stop 64, PG11.)
    for step in [
        PruneStep::Age { cutoff: T0 },
        PruneStep::RowCap { max_rows: 1_000 },
        PruneStep::Cursors { cutoff: T0 },
    ] {
        assert_eq!(
            a.store.prune_chunk(&step, 100, T0).await.expect("prune"),
            0,
            "{step:?} finds nothing"
        );
        assert_eq!(
            foreign(&b).await,
            b2,
            "a pruning chunk of nothing: {step:?}"
        );
    }
    // Nor do upstream link writes that change nothing: the same source adopted again later (a
    // refresh, which keeps the link and its marker), a scan time stamped on a session with no
    // link. (store-postgres committed both under mutation, and every test passed: review of
    // stop 66, P427 and P428.)
    a.upstream
        .upsert_link(link_spec(&kid, "t-1", 7), T0)
        .await
        .expect("adopt");
    let b3 = foreign(&b).await;
    assert_ne!(b3, b2, "`b` is told of the adoption `a` committed");
    let refreshed = a
        .upstream
        .upsert_link(link_spec(&kid, "t-1", 7), T0.plus_ms(1_000))
        .await
        .expect("adopt the same source again");
    assert!(!refreshed.created, "the same source: the link is kept");
    assert_eq!(foreign(&b).await, b3, "a refresh of an adopted link");
    assert!(
        !a.upstream
            .mark_scanned(&nobody, T0)
            .await
            .expect("stamp no link"),
        "no link to stamp"
    );
    assert_eq!(foreign(&b).await, b3, "a scan time stamped on no link");
}

/// A store that pushes commit hints gives one as it begins to listen (or poll), with no
/// commit of another writer, to the streams made before: a commit made between the caller's
/// first question and the moment it listens is in no later hint. A stream made after that hint
/// does not get it, and nothing else hints while nobody else commits. store-sqlite's poller
/// and store-postgres's listener each tested this of themselves; a store that pushes no hints
/// (`None`) has nothing to check.
pub async fn a_store_that_pushes_hints_gives_one_as_it_begins(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let Some(mut first) = t.store.commit_hints() else {
        return;
    };
    let hinted = tokio::time::timeout(std::time::Duration::from_secs(30), first.next())
        .await
        .expect("a hint within 30 s of asking, with no other writer");
    assert!(hinted, "a hint, not the end of the stream");
    let mut later = t.store.commit_hints().expect("the store gave a hint");
    assert!(
        !super::poll_once(std::pin::pin!(later.next())).await,
        "the start's hint is not given to a stream made after it"
    );
}

/// Two handles on one store, where the store pushes commit hints
/// ([`crate::EventStore::commit_hints`]; a store that pushes none answers `None` on both): a
/// stream of `a`'s gives a hint once `b` commits (`b` records again every 100 ms until one
/// comes, for at most 30 s: a stream need not be told of a commit made before its store
/// listens), and answers that no hint will come once every handle of `a` is dropped. The
/// stream checked is `a`'s second, made after its first had a hint: a store gives one as it
/// begins watching, for what came before ([`a_store_that_pushes_hints_gives_one_as_it_begins`]),
/// which says nothing of `b`'s commits.
pub async fn another_handles_commit_is_hinted(f: impl OpenFile) {
    let (_dir, a, b) = two_handles(&f).await;
    let Some(mut first) = a.store.commit_hints() else {
        assert!(
            b.store.commit_hints().is_none(),
            "one handle of the store pushes hints and the other does not"
        );
        return;
    };
    let kid = child();
    let wait = std::time::Duration::from_secs(30);
    let hinted = async |hints: &mut Box<dyn crate::store::CommitHints>| {
        let hinted = tokio::time::timeout(wait, async {
            loop {
                rec(&*b.store, human(&kid), T0).await;
                let tick = std::time::Duration::from_millis(100);
                if let Ok(next) = tokio::time::timeout(tick, hints.next()).await {
                    return next;
                }
            }
        })
        .await
        .expect("a hint within 30 s of the other handle's commits");
        assert!(hinted, "a hint, not the end of the stream");
    };
    hinted(&mut first).await;
    let mut hints = a.store.commit_hints().expect("the store gave a hint");
    hinted(&mut hints).await;
    drop((first, a));
    // Hints of commits made before the drop may come first; then the end.
    let ended = tokio::time::timeout(wait, async { while hints.next().await {} }).await;
    assert!(ended.is_ok(), "no hint comes once the store is gone");
}

/// Two handles on one file behave as two gateway processes: what one writes (a watch, an
/// unwatch, a dedupe key), the other's next operation sees, whichever path that operation
/// takes; closing one leaves the other working.
pub async fn two_handles_on_one_file_see_each_others_writes(f: impl OpenFile) {
    let (_dir, a, b) = two_handles(&f).await;
    let kid = child();
    let manager = w("agent:main:main");

    // `a` has recorded on the child while nobody watched it.
    let first = rec(&*a.store, human(&kid), T0).await;
    assert!(first.notices.is_empty());
    // `b` starts watching; `a` does not know.
    b.store.watch(&manager, &kid, T0).await.expect("watch");
    let second = rec(&*a.store, human(&kid), T0).await;
    assert_eq!(second.notices.len(), 1, "the watch made elsewhere notifies");
    assert_eq!(second.notices[0].last_seen, first.event.sequence);
    assert_eq!(
        second.event.sequence,
        first.event.sequence.next(),
        "the record that found a cursor spent exactly one sequence"
    );
    let c = a
        .store
        .cursor(&manager, &kid.session_key)
        .await
        .expect("cursor")
        .expect("the cursor `b` wrote");
    assert_eq!(
        (c.last_seen, c.notified, c.material),
        (Sequence(1), Sequence(2), Sequence(2))
    );

    // `b` removes the watch; `a` records correctly.
    assert!(
        b.store
            .unwatch(&manager, &kid.session_key)
            .await
            .expect("unwatch")
    );
    let third = rec(&*a.store, human(&kid), T0).await;
    assert!(
        third.notices.is_empty(),
        "the watch removed elsewhere is gone"
    );
    assert_eq!(third.event.sequence, Sequence(3));

    // A dedupe hit through the other handle returns the first row and spends a sequence.
    let d1 = rec(&*a.store, human(&kid).with_dedupe_key("dk"), T0).await;
    let d2 = rec(&*b.store, human(&kid).with_dedupe_key("dk"), T0).await;
    assert!(!d1.deduplicated && d2.deduplicated);
    assert_eq!(d2.event, d1.event);
    drop(a);
    let next = rec(&*b.store, human(&kid), T0).await;
    assert_eq!(next.event.sequence, Sequence(6), "the hit spent sequence 5");
    assert_eq!(
        b.store.state_version(&kid).await.expect("version"),
        Sequence(6)
    );
}

/// A write whose caller is cancelled midway (its future dropped after one, two or three polls,
/// as a request timeout does) leaves no lock behind: another handle on the file records at once
/// (a store that left its transaction open would make it wait out its busy timeout and fail),
/// and what the cancelled calls did is all or nothing: the watched target's cursor still names
/// the target's last event as its latest change.
pub async fn a_cancelled_write_leaves_the_file_writable(f: impl OpenFile) {
    let (_dir, a, b) = two_handles(&f).await;
    let kid = child();
    let other = r("agent:main:subagent:other", "main");
    let manager = w("agent:main:main");
    a.store.watch(&manager, &kid, T0).await.expect("watch");
    let mut cancelled = 0;
    for polls in 1..=3 {
        // A recording that moves a cursor, and a watch, each given up after `polls` polls.
        cancelled += usize::from(give_up_after(polls, a.store.record(human(&kid), T0)).await);
        b_records(&b, &other, polls).await;
        let watcher = w(&format!("agent:main:w{polls}"));
        cancelled += usize::from(give_up_after(polls, a.store.watch(&watcher, &kid, T0)).await);
        b_records(&b, &other, polls).await;
        // `a` writes too. A store may finish a cancelled write in the background (redb's
        // writer does); this write is queued behind it, so the reads below see it done.
        rec(&*a.store, human(&other), T0).await;
        let head = a.store.state_version(&kid).await.expect("version");
        let c = a
            .store
            .cursor(&manager, &kid.session_key)
            .await
            .expect("cursor")
            .expect("the manager's cursor");
        assert_eq!(
            c.material, head,
            "after writes cancelled at poll {polls}, the cursor's latest change is the head"
        );
    }
    assert!(cancelled > 0, "no write was given up midway");
}

/// Acknowledging and re-freezing are atomic (DESIGN.md section 4), for a caller cancelled
/// midway too: a watcher with pending notices on two targets gives up on acknowledging both
/// (and, on two other targets, on re-freezing both) after one, two or three polls, and after
/// it was polled for 0 to 1,100 µs, as a request timeout or a shutdown does; once a write
/// queued behind the call has committed, either both cursors moved or neither did, and a call
/// that finished moved both. Some call must really have been dropped unfinished, or the check
/// checked nothing. Dropped unfinished is not dropped between its two cursor writes: how far
/// the store got by then depends on time, not on the polls, so the rounds that give up by time
/// drop calls at moments spread over a fixed window (0 to 1,100 µs, 50 µs apart), wherever the
/// store's writes fall in it; a store that wrote the two in two commits was caught in most runs
/// by the poll counts alone, and in every run of eight by the time rounds (store-sqlite, whose
/// call takes a few hundred µs here; a call much longer than the window is dropped only in its
/// first part).
pub async fn a_cancelled_acknowledgement_or_refreeze_moves_both_cursors_or_neither(
    f: impl OpenFile,
) {
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let s = &*t.store;
    let other = r("agent:main:subagent:other", "main");
    let (mut acks_given_up, mut refreezes_given_up) = (0, 0);
    // Nine rounds by poll count (one, two, three), then twenty-three by time, 50 µs apart.
    for round in 0..32u64 {
        let when = if round < 9 {
            GiveUp::Polls(1 + round % 3)
        } else {
            GiveUp::After(std::time::Duration::from_micros((round - 9) * 50))
        };
        for refreezing in [false, true] {
            let watcher = w(&format!("agent:main:w{round}{refreezing}"));
            let targets = [
                r(&format!("agent:main:subagent:a{round}{refreezing}"), "main"),
                r(&format!("agent:main:subagent:b{round}{refreezing}"), "main"),
            ];
            for target in &targets {
                s.watch(&watcher, target, T0).await.expect("watch");
                // A notice handed out and frozen, then a change past it: both calls move it.
                rec(s, human(target), T0).await;
                rec(s, human(target), T0).await;
            }
            let states = async || {
                let mut out = Vec::new();
                for target in &targets {
                    let c = s
                        .cursor(&watcher, &target.session_key)
                        .await
                        .expect("cursor")
                        .expect("the watch's cursor");
                    out.push((c.last_seen, c.notified, c.material));
                }
                out
            };
            let before = states().await;
            assert!(
                before
                    .iter()
                    .all(|(seen, notified, material)| seen < notified && notified < material),
                "a pending notice and a change past it on each target: {before:?}"
            );
            let what = if refreezing {
                "re-freeze"
            } else {
                "acknowledgement"
            };
            let gave_up = if refreezing {
                let keys: Vec<CursorKey> = targets
                    .iter()
                    .map(|target| CursorKey {
                        watcher: watcher.clone(),
                        target: target.session_key.clone(),
                    })
                    .collect();
                let gave_up = give_up(when, s.refreeze(&keys, T0)).await;
                refreezes_given_up += usize::from(gave_up);
                gave_up
            } else {
                let acks: Vec<AckTarget> = targets
                    .iter()
                    .map(|target| AckTarget::any(target.session_key.clone()))
                    .collect();
                let gave_up = give_up(when, s.acknowledge(&watcher, &acks, T0)).await;
                acks_given_up += usize::from(gave_up);
                gave_up
            };
            // A store may finish a given-up call in the background (redb's writer does); this
            // write is queued behind it, so the reads below see it done.
            rec(s, human(&other), T0).await;
            let after = states().await;
            let moved: Vec<bool> = before.iter().zip(&after).map(|(b, a)| b != a).collect();
            assert!(
                moved[0] == moved[1],
                "the {what} given up after {when:?} (unfinished: {gave_up}) moved one cursor of \
                 two: {before:?} -> {after:?}"
            );
            assert!(
                gave_up || moved[0],
                "the finished {what} moved neither cursor: {before:?} -> {after:?}"
            );
        }
    }
    assert!(acks_given_up > 0, "no acknowledgement was given up midway");
    assert!(refreezes_given_up > 0, "no re-freeze was given up midway");
}

/// Pruning cancelled midway (its future dropped after a few polls, as a shutdown or a timeout
/// does, chunk after chunk) leaves every deleted event behind its ref's watermark: whatever a
/// ref lost is at or below `pruned_max_sequence`, its page says there is a gap, heads stay, and
/// the store passes the audit; after a reopen too. (A store that deleted in one transaction and
/// stamped the watermark in another would show a loss no page admits.)
pub async fn a_cancelled_prune_leaves_every_loss_behind_a_watermark(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let refs: Vec<SessionRef> = (0..7)
        .map(|i| r(&format!("agent:main:subagent:p{i}"), "main"))
        .collect();
    let mut recorded: Vec<Vec<u64>> = vec![Vec::new(); refs.len()];
    for i in 0..700 {
        let at = i % refs.len();
        let got = rec(&*t.store, log_only(&refs[at], "x"), T0).await;
        recorded[at].push(got.event.sequence.get());
    }
    // Rounds whose pass was dropped while under way after it had deleted something: the case
    // checked.
    let mut cut_short_with_losses = 0;
    for round in 0..30u64 {
        let policy = crate::RetentionPolicy {
            max_rows: 700 - 20 * (round + 1),
            chunk_rows: 3,
            ..crate::RetentionPolicy::default()
        };
        let before = t.store.log_stats().await.expect("stats").rows;
        // Polled until `budget` has passed, then dropped: from after its first poll to after
        // it finished. One round in three is instead dropped once the log has lost rows (read
        // between its polls), so that some rounds cut a pass short after it deleted something
        // however slow or fast the machine runs.
        let budget = std::time::Duration::from_micros(round % 10 * 300);
        let once_it_deleted = round % 3 == 2;
        let started = std::time::Instant::now();
        let mut cut_short = false;
        {
            let mut pass = std::pin::pin!(t.store.prune(&policy, T0));
            while !poll_once(pass.as_mut()).await {
                let over = if once_it_deleted {
                    t.store.log_stats().await.expect("stats").rows < before
                } else {
                    started.elapsed() >= budget
                };
                if over {
                    cut_short = true;
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        assert_losses_behind_watermarks(&*t.store, &refs, &recorded, &format!("round {round}"))
            .await;
        let after = t.store.log_stats().await.expect("stats").rows;
        cut_short_with_losses += usize::from(cut_short && after < before);
    }
    // Otherwise the rounds checked only passes that ran to their end, or deleted nothing.
    assert!(
        cut_short_with_losses > 0,
        "no pass was dropped midway after deleting something"
    );
    // Every row cap asked for is reached once a pass runs to its end.
    let policy = crate::RetentionPolicy {
        max_rows: 100,
        chunk_rows: 3,
        ..crate::RetentionPolicy::default()
    };
    t.store.prune(&policy, T0).await.expect("a whole pass");
    assert_eq!(t.store.log_stats().await.expect("stats").rows, 100);
    drop(t);
    let t = open(&f, &dir.file()).await;
    assert_losses_behind_watermarks(&*t.store, &refs, &recorded, "after a reopen").await;
}

/// For each of `refs`, whose events were given the sequences `recorded` (in the same order):
/// the head names its last event, every sequence it lost is at or below its watermark, and its
/// page admits the gap; and the store's audit finds nothing. Each page is read before the
/// heads: a cancelled pass may still run (a store may finish a cancelled write), and a
/// watermark is raised before the deletion it covers, so a head read after a page covers what
/// that page lacks.
async fn assert_losses_behind_watermarks(
    store: &dyn AwarenessStore,
    refs: &[SessionRef],
    recorded: &[Vec<u64>],
    what: &str,
) {
    let mut pages = Vec::with_capacity(refs.len());
    for session in refs {
        let page = store
            .changes_since(session, Sequence::ZERO, 200)
            .await
            .expect("changes_since");
        pages.push(page);
    }
    let heads = store.heads(refs).await.expect("heads");
    for ((session, seqs), page) in refs.iter().zip(recorded).zip(pages) {
        let head = heads
            .iter()
            .find(|h| &h.session == session)
            .unwrap_or_else(|| panic!("{what}: pruning removed the head of {session}"));
        assert_eq!(
            head.last_sequence.get(),
            *seqs.last().expect("events"),
            "{what}: {session}'s head"
        );
        let present: Vec<u64> = page.events.iter().map(|e| e.sequence.get()).collect();
        let lost: Vec<u64> = seqs
            .iter()
            .copied()
            .filter(|s| !present.contains(s))
            .collect();
        if let Some(&highest) = lost.last() {
            assert!(
                highest <= head.pruned_max_sequence.get(),
                "{what}: {session} lost {highest}, above its watermark {}",
                head.pruned_max_sequence
            );
            assert!(page.history_gap, "{what}: {session}'s page hides its loss");
        }
    }
    let audit = crate::audit::audit_store(store).await.expect("audit");
    assert!(audit.findings.is_empty(), "{what}: {:?}", audit.findings);
}

/// A dedupe hit on an event row the store cannot read (a torn write, a hand edit) fails its
/// caller with [`StoreError::Corrupt`](crate::StoreError::Corrupt) and changes nothing the
/// store answers: no event is added, no head or cursor moves; the session then records on.
/// Checked on an unwatched session and on a watched one, which a store may record by different
/// paths. Whether the failed call used up a sequence number is the store's own (after it, a
/// recording gets a higher number than any before, which is what the contract asks).
pub async fn a_dedupe_hit_on_an_unreadable_row_fails_and_changes_nothing(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let s = &*t.store;
    let manager = w("agent:main:main");
    for (i, watched) in [false, true].into_iter().enumerate() {
        let session = r(&format!("agent:main:subagent:torn{i}"), "main");
        if watched {
            s.watch(&manager, &session, T0).await.expect("watch");
        }
        let key = format!("torn-{i}");
        let damaged = rec(s, human(&session).with_dedupe_key(&key), T0)
            .await
            .event
            .sequence;
        let last = rec(s, human(&session), T0).await.event.sequence;
        assert!(
            t.raw.damage_event_row(damaged).await.expect("damage a row"),
            "the store has a row to damage"
        );
        let answers = async || {
            (
                s.list_heads(None).await.expect("heads"),
                s.cursors(&crate::CursorFilter::default())
                    .await
                    .expect("cursors"),
                s.events_after(damaged, 100).await.expect("events"),
            )
        };
        let before = answers().await;
        let err = s
            .record(human(&session).with_dedupe_key(&key), T0)
            .await
            .expect_err("a dedupe hit on an unreadable row");
        assert!(
            matches!(err, crate::StoreError::Corrupt { .. }),
            "watched {watched}: {err}"
        );
        assert_eq!(
            answers().await,
            before,
            "watched {watched}: the failed recording changed what the store answers"
        );
        let next = rec(s, human(&session), T0).await.event.sequence;
        assert!(next > last, "watched {watched}: {next} after {last}");
        let head = s
            .heads(std::slice::from_ref(&session))
            .await
            .expect("heads");
        assert_eq!(
            head.iter().map(|h| h.last_sequence).collect::<Vec<_>>(),
            [next],
            "watched {watched}: the head after the failed call"
        );
    }
}

/// Sixteen recordings made at once, one of them a dedupe hit on a row the store cannot read,
/// ten rounds: only that caller fails, with `Corrupt`, and every other gets its own event (a
/// store that batches concurrent recordings must not fail a whole batch for one event).
pub async fn an_unreadable_dedupe_hit_among_concurrent_recordings_fails_only_its_caller(
    f: impl OpenFile,
) {
    const CALLS: usize = 16;
    const FAILING: usize = 7;
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let damaged = rec(&*t.store, human(&child()).with_dedupe_key("torn"), T0)
        .await
        .event
        .sequence;
    assert!(
        t.raw.damage_event_row(damaged).await.expect("damage a row"),
        "the store has a row to damage"
    );
    for round in 0..10 {
        let calls: Vec<_> = (0..CALLS)
            .map(|i| {
                let store = std::sync::Arc::clone(&t.store);
                let session = r(&format!("agent:main:subagent:s{}", i % 4), "main");
                let e = if i == FAILING {
                    human(&child()).with_dedupe_key("torn")
                } else {
                    log_only(&session, &format!("round {round} call {i}"))
                };
                tokio::spawn(async move { store.record(e, T0).await })
            })
            .collect();
        for (i, call) in calls.into_iter().enumerate() {
            let got = call.await.expect("join");
            if i == FAILING {
                let err = got.expect_err("the unreadable row's caller fails");
                assert!(
                    matches!(err, crate::StoreError::Corrupt { .. }),
                    "round {round}: {err}"
                );
            } else {
                let got =
                    got.unwrap_or_else(|e| panic!("round {round}: call {i} failed with it: {e}"));
                assert_eq!(got.event.summary, format!("round {round} call {i}"));
                assert!(!got.deduplicated, "round {round}: call {i}");
            }
        }
    }
}

/// A row the store cannot read stops neither pruning nor the deletion of its session: the row
/// cap deletes it in its turn, with the rows around it, and stamps its session's watermark
/// over it; deleting its session removes it; and a pass that ages out every row it can read
/// succeeds. (Whether the age step can tell such a row's age is the store's own: it may keep
/// it until the cap reaches it.) Otherwise one damaged row would end retention for good, and
/// the file would grow without bound.
pub async fn an_unreadable_row_stops_neither_pruning_nor_deleting_its_session(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let s = &*t.store;
    let doomed = r("agent:main:subagent:doomed", "main");
    let mut seqs = Vec::new();
    for i in 0..12 {
        let at = if i % 3 == 0 { &doomed } else { &child() };
        seqs.push((
            at.clone(),
            rec(s, log_only(at, "x"), T0).await.event.sequence,
        ));
    }
    // The child's second event (sequence 2), which the row cap deletes first but one.
    let (_, damaged) = seqs[1].clone();
    assert!(
        t.raw.damage_event_row(damaged).await.expect("damage a row"),
        "the store has a row to damage"
    );
    let policy = crate::RetentionPolicy {
        max_rows: 8,
        chunk_rows: 3,
        ..crate::RetentionPolicy::default()
    };
    let report = s
        .prune(&policy, T0)
        .await
        .expect("a pass over an unreadable row");
    assert_eq!(report.events_by_cap, 4, "{report:?}");
    let left: Vec<Sequence> = s
        .events_after(Sequence::ZERO, 100)
        .await
        .expect("the log, its unreadable row gone")
        .iter()
        .map(|e| e.sequence)
        .collect();
    assert_eq!(left, seqs[4..].iter().map(|(_, q)| *q).collect::<Vec<_>>());
    let child_head = s.heads(&[child()]).await.expect("heads");
    assert!(
        child_head[0].pruned_max_sequence >= damaged,
        "the watermark covers the unreadable row: {child_head:?}"
    );
    // An unreadable row of a session being deleted goes with it.
    let (_, on_doomed) = seqs[6].clone();
    assert!(
        t.raw
            .damage_event_row(on_doomed)
            .await
            .expect("damage a row")
    );
    s.delete_session(&doomed)
        .await
        .expect("delete a session holding an unreadable row");
    let left = s.events_after(Sequence::ZERO, 100).await.expect("the log");
    assert!(
        left.iter().all(|e| e.session_ref() != doomed),
        "the deleted session's rows: {left:?}"
    );
    assert_eq!(s.log_stats().await.expect("stats").rows, left.len() as u64);
    // A pass that ages out every row still succeeds over an unreadable one.
    let (_, last) = seqs[11].clone();
    assert!(t.raw.damage_event_row(last).await.expect("damage a row"));
    s.prune(
        &crate::RetentionPolicy::default(),
        Timestamp(LATER.0 + 31 * Timestamp::DAY_MS),
    )
    .await
    .expect("an age pass over an unreadable row");
    assert!(
        s.log_stats().await.expect("stats").rows <= 1,
        "only the unreadable row may outlive its age"
    );
}

/// When pruning or the deletion of its session removes an event row the store cannot read,
/// that row's dedupe key is free again (recording with it makes a new event), and no other
/// row's is: every key of a row still retained is a hit answering that row. The sequence
/// counter does not go back, also when the unreadable row deleted held the highest sequence:
/// every call, hit or new event, spends the next one. (A store that finds a row's dedupe key by
/// reading the row cannot free it that way: one that then freed none refused the key for good
/// as a hit on a row that is gone; one that guessed could free another row's key.)
pub async fn an_unreadable_row_removed_frees_its_dedupe_key_and_no_other(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let s = &*t.store;
    let (doomed, kid) = (r("agent:main:subagent:doomed", "main"), child());
    // Sequences 1 to 8, each under its own key `k<sequence>`: the doomed session holds 1, 4
    // and 7, the child the others.
    for i in 1..=8 {
        let at = if i % 3 == 1 { &doomed } else { &kid };
        let got = rec(s, log_only(at, "x").with_dedupe_key(format!("k{i}")), T0).await;
        assert_eq!(got.event.sequence, Sequence(i));
    }
    let mut keys = Keys {
        s,
        on: kid.clone(),
        spent: Sequence(8),
    };
    // The row cap deletes 1, 2 and 3, of which 2 (the child's) is unreadable.
    damage_event(&t, Sequence(2)).await;
    let policy = crate::RetentionPolicy {
        max_rows: 5,
        ..crate::RetentionPolicy::default()
    };
    let report = s
        .prune(&policy, T0)
        .await
        .expect("a pass over an unreadable row");
    assert_eq!(report.events_by_cap, 3, "{report:?}");
    let again = keys.fresh("k2", "the pruned unreadable row's key").await;
    for seq in 4..=8 {
        keys.hit(
            &format!("k{seq}"),
            Sequence(seq),
            "a retained row's key, after pruning",
        )
        .await;
    }
    // The doomed session's last event takes the highest sequence; it and 7 are unreadable when
    // the session is deleted.
    let last = rec(s, log_only(&doomed, "last").with_dedupe_key("k-last"), T0)
        .await
        .event
        .sequence;
    keys.spent = last;
    for seq in [Sequence(7), last] {
        damage_event(&t, seq).await;
    }
    s.delete_session(&doomed)
        .await
        .expect("delete a session holding unreadable rows");
    keys.fresh(
        "k-last",
        "the deleted unreadable row of the highest sequence's key",
    )
    .await;
    keys.fresh("k7", "a deleted unreadable row's key").await;
    keys.fresh("k4", "a deleted row's key").await;
    for seq in [5, 6, 8] {
        keys.hit(
            &format!("k{seq}"),
            Sequence(seq),
            "a retained row's key, after a deletion",
        )
        .await;
    }
    keys.hit("k2", again, "the freed key, recorded again").await;
}

/// Damages the event row `seq` through the store's [`RawAccess`](super::RawAccess), which must
/// find it.
async fn damage_event(t: &Subject, seq: Sequence) {
    assert!(
        t.raw.damage_event_row(seq).await.expect("damage a row"),
        "the store has row {seq} to damage"
    );
}

/// Recordings under dedupe keys on `on`, each spending the sequence after `spent`
/// ([`an_unreadable_row_removed_frees_its_dedupe_key_and_no_other`]).
struct Keys<'a> {
    s: &'a dyn AwarenessStore,
    on: SessionRef,
    spent: Sequence,
}

impl Keys<'_> {
    /// Records under `key`, which must be free (`what` says whose it was): a new event, with
    /// the next sequence. Returns it.
    async fn fresh(&mut self, key: &str, what: &str) -> Sequence {
        let got = rec(self.s, log_only(&self.on, "again").with_dedupe_key(key), T0).await;
        assert!(!got.deduplicated, "{what} ({key}) is still taken");
        self.spent = Sequence(self.spent.get() + 1);
        assert_eq!(
            got.event.sequence, self.spent,
            "{what} ({key}): a new event takes the next sequence, the counter never goes back"
        );
        self.spent
    }

    /// Records under `key`, which must still name the event `seq` (`what` says whose it is):
    /// a hit answering that event, which spends a sequence.
    async fn hit(&mut self, key: &str, seq: Sequence, what: &str) {
        let got = rec(self.s, log_only(&self.on, "again").with_dedupe_key(key), T0).await;
        assert!(got.deduplicated, "{what} ({key}) was freed");
        assert_eq!(got.event.sequence, seq, "{what} ({key}) answers its event");
        self.spent = Sequence(self.spent.get() + 1);
    }
}

/// An upstream link row the store cannot read (decision 0017) stops no other link: the listing
/// the monitor reads at every tick leaves it out and lists the others, whose markers still
/// move. A read of its ref, a marker update and a removal conditioned on its token fail with
/// `Corrupt` and leave it; a stamp of its scan fails so or stamps it; an adoption of its ref writes a new link over it; an unconditional
/// removal removes it, and so does a deletion of its session.
pub async fn an_unreadable_link_row_is_left_out_and_stops_no_other_link(f: impl OpenFile) {
    unreadable_link_rows(f, false).await;
}

/// [`an_unreadable_link_row_is_left_out_and_stops_no_other_link`], with rows whose thread id is
/// text that is not UTF-8 (a hand edit by a tool that does not check), beside a row whose
/// session key is such text, which is left out of every listing too. A store that read every
/// link in one piece of text failed the whole listing, so the monitor checked no link at all;
/// one that decoded the keys of its rows as it listed them failed it on such a key.
pub async fn a_link_row_with_text_that_is_not_utf8_is_left_out(f: impl OpenFile) {
    unreadable_link_rows(f, true).await;
}

/// The check of unreadable link rows, with rows damaged by
/// [`RawAccess::damage_link_row`](super::RawAccess::damage_link_row), or spoiled by
/// [`RawAccess::spoil_link_text`](super::RawAccess::spoil_link_text) (`spoil`, which also
/// spoils one more row's key with [`RawAccess::spoil_link_key`](super::RawAccess::spoil_link_key)).
async fn unreadable_link_rows(f: impl OpenFile, spoil: bool) {
    use crate::StoreError;
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let u = &*t.upstream;
    let (kept, torn, gone, keyed) = (
        r("agent:main:subagent:a", "main"),
        r("agent:main:subagent:b", "main"),
        r("agent:main:subagent:c", "main"),
        r("agent:main:subagent:d", "main"),
    );
    for (i, session) in [&kept, &torn, &gone].into_iter().enumerate() {
        u.upsert_link(link_spec(session, &format!("t{i}"), 10), T0)
            .await
            .expect("adopt");
    }
    // Scanned before it became unreadable: the adoption over it below keeps none of that.
    assert!(
        u.mark_scanned(&torn, T0.plus_ms(1))
            .await
            .expect("mark scanned")
    );
    if spoil {
        // A row whose key is spoiled answers to no ref from then on: every listing below
        // leaves it out.
        u.upsert_link(link_spec(&keyed, "t3", 10), T0)
            .await
            .expect("adopt");
        assert!(
            t.raw
                .spoil_link_key(&keyed)
                .await
                .expect("spoil a link's key"),
            "the store has a link row to spoil"
        );
    }
    let damage_or_spoil = async |session: &SessionRef| {
        if spoil {
            t.raw.spoil_link_text(session).await
        } else {
            t.raw.damage_link_row(session).await
        }
        .expect("damage a link row")
    };
    assert!(
        damage_or_spoil(&torn).await,
        "the store has a link row to damage"
    );
    let damage = async |session: &SessionRef| {
        assert!(
            damage_or_spoil(session).await,
            "the store has a link row to damage"
        );
    };
    let listed = async || -> Vec<SessionRef> {
        u.links()
            .await
            .expect("the listing leaves the unreadable row out")
            .into_iter()
            .map(|l| l.session)
            .collect()
    };
    let corrupt = |what: &str, res: Result<(), StoreError>| {
        assert!(
            matches!(res, Err(StoreError::Corrupt { .. })),
            "{what}: {res:?}"
        );
    };
    assert_eq!(listed().await, [kept.clone(), gone.clone()]);
    corrupt("link", u.link(&torn).await.map(drop));
    corrupt(
        "set_marker",
        u.set_marker(&torn, T0, json!({"offset": 11}), T0.plus_ms(1))
            .await
            .map(drop),
    );
    corrupt(
        "remove_link with a token",
        u.remove_link(&torn, Some(T0)).await.map(drop),
    );
    // A stamp of its scan fails as `Corrupt` (a store that reads the link to stamp it) or
    // stamps the row (one that writes the column alone, leaving the row as unreadable as it
    // was): never "no link here", which would hide the damage from a scanner. (What the
    // mutation did: store-redb answered `false`; review of stop 71, RG34.)
    match u.mark_scanned(&torn, T0.plus_ms(1)).await {
        Ok(stamped) => assert!(stamped, "mark_scanned found the unreadable link's row"),
        Err(e) => assert!(
            matches!(e, StoreError::Corrupt { .. }),
            "mark_scanned: {e:?}"
        ),
    }
    assert_eq!(
        listed().await,
        [kept.clone(), gone.clone()],
        "the others stay listed"
    );
    corrupt(
        "link, after the refusals: the row stays as it was",
        u.link(&torn).await.map(drop),
    );
    assert!(
        u.set_marker(&kept, T0, json!({"offset": 12}), T0.plus_ms(1))
            .await
            .expect("another link's marker moves"),
    );

    let again = u
        .upsert_link(link_spec(&torn, "t1", 20), T0.plus_ms(2))
        .await
        .expect("adopting again writes over the row");
    assert!(
        again.created,
        "nothing of the unreadable link is kept: {again:?}"
    );
    // Not its scan either (store-postgres kept the old `last_scanned_at` under mutation, and
    // every test passed: review of stop 60).
    assert_eq!(again.link.last_scanned_at, None, "{again:?}");
    assert_eq!(u.link(&torn).await.expect("link"), Some(again.link));
    assert_eq!(listed().await, [kept.clone(), torn.clone(), gone.clone()]);

    damage(&torn).await;
    assert!(
        u.remove_link(&torn, None)
            .await
            .expect("remove without a token"),
        "removed"
    );
    damage(&gone).await;
    t.store
        .delete_session(&gone)
        .await
        .expect("delete the session");
    assert_eq!(listed().await, std::slice::from_ref(&kept));
    for removed in [&torn, &gone] {
        assert_eq!(u.link(removed).await.expect("link"), None, "{removed:?}");
    }
    if spoil {
        // The row whose key was spoiled shadows nothing: adopting its ref again makes a new
        // link, listed beside the others.
        let fresh = u
            .upsert_link(link_spec(&keyed, "t3", 30), T0.plus_ms(3))
            .await
            .expect("adopt the spoiled row's ref again");
        assert!(fresh.created, "a new link: {fresh:?}");
        assert_eq!(listed().await, [kept.clone(), keyed.clone()]);
    }
}

/// The refs of the heads `list_heads` lists for `agent` (every agent with `None`); `what` says
/// which listing failed.
async fn listed_heads(s: &dyn AwarenessStore, agent: Option<&str>, what: &str) -> Vec<SessionRef> {
    let agent = agent.map(|a| crate::model::AgentId::new(a).expect("agent"));
    s.list_heads(agent.as_ref())
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .into_iter()
        .map(|h| h.session)
        .collect()
}

/// One pruning pass of the row cap `max_rows` at [`T0`] (it must succeed: `what` says over
/// what), and the events the log keeps after it.
async fn prune_to_cap(
    s: &dyn AwarenessStore,
    max_rows: u64,
    what: &str,
) -> (crate::PruneReport, Vec<std::sync::Arc<crate::Event>>) {
    let policy = crate::RetentionPolicy {
        max_rows,
        ..crate::RetentionPolicy::default()
    };
    let report = s
        .prune(&policy, T0)
        .await
        .unwrap_or_else(|e| panic!("a pass over {what}: {e}"));
    let left = s
        .events_after(Sequence::ZERO, 100)
        .await
        .expect("the log after the pass");
    (report, left)
}

/// A head row the store cannot read (a torn write, a hand edit, another writer's row) is left
/// out of listing the heads (decision 0020), which lists the others, per agent too; reading
/// that head by its ref fails with `Corrupt`, and the audit names it once (through its events
/// and through the cursor on it). Pruning deletes its session's events in their turn, with no
/// watermark stamped over it.
pub async fn an_unreadable_head_row_is_left_out_of_the_listings(f: impl OpenFile) {
    use crate::StoreError;
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let s = &*t.store;
    let (kept, torn, other) = (
        r("agent:main:subagent:a", "main"),
        r("agent:main:subagent:b", "main"),
        r("agent:ops:subagent:c", "ops"),
    );
    for session in [&kept, &torn, &other] {
        rec(s, human(session), T0).await;
    }
    s.watch(&w("agent:main:main"), &torn, T0)
        .await
        .expect("watch");
    assert!(
        t.raw
            .damage_head_row(&torn)
            .await
            .expect("damage a head row"),
        "the store has a head row to damage"
    );
    let listed = async |agent: Option<&str>| {
        listed_heads(s, agent, "the listing leaves the unreadable row out").await
    };
    assert_eq!(listed(None).await, [kept.clone(), other.clone()]);
    assert_eq!(listed(Some("main")).await, std::slice::from_ref(&kept));
    let read = s.heads(std::slice::from_ref(&torn)).await;
    let Err(why @ StoreError::Corrupt { .. }) = read else {
        panic!("reading that head: {read:?}")
    };
    // A page of its session fails the same way, naming the head, rather than being answered
    // from its events under a state version the row does not hold; the other sessions' pages
    // are answered. (What the mutation did: store-sqlite's page read a negative last sequence
    // as 0 and answered; review of stop 68, S811, tested for store-sqlite alone until stop 70.)
    let page = s.changes_since(&torn, Sequence::ZERO, 10).await;
    let Err(StoreError::Corrupt { .. }) = &page else {
        panic!("a page over the unreadable head: {page:?}")
    };
    let said = page.expect_err("corrupt").to_string();
    assert!(said.contains(torn.session_key.as_str()), "{said}");
    let reason = why.to_string();
    let reason = reason.rsplit(": ").next().unwrap_or_default();
    assert!(
        said.ends_with(reason),
        "{said}: as reading the head says, {reason}"
    );
    let page = s
        .changes_since(&kept, Sequence::ZERO, 10)
        .await
        .expect("another session's page");
    assert_eq!(page.events.len(), 1, "{page:?}");
    // Watching it fails the same way and writes no cursor: a cursor started at 0, as over a
    // session with no head, would hand out its whole history as news. (What the mutation did:
    // store-postgres took the unreadable head for none; review of stop 66, P423.)
    let newcomer = w("agent:main:other");
    let watched = s.watch(&newcomer, &torn, T0).await;
    assert!(
        matches!(watched, Err(StoreError::Corrupt { .. })),
        "a watch over an unreadable head: {watched:?}"
    );
    assert_eq!(
        s.cursor(&newcomer, &torn.session_key)
            .await
            .expect("cursor"),
        None,
        "the failed watch wrote no cursor"
    );
    let findings = crate::audit::audit_store(s).await.expect("audit").findings;
    let named: Vec<_> = findings
        .iter()
        .filter(|f| matches!(f, crate::audit::Finding::UnreadableHead { session, .. } if *session == torn))
        .collect();
    assert_eq!(named.len(), 1, "{findings:?}");
    // The audit says why, as the read did, causes included.
    let crate::audit::Finding::UnreadableHead { reason, .. } = named[0] else {
        unreachable!()
    };
    assert_eq!(*reason, crate::error::ErrorChain(&why).to_string());
    // And names nothing else: its events are not said to have no head. (What the mutation did:
    // `events of ... have no head` reported beside it, and alone with no cursor on it; review
    // of stop 67, CY21.)
    assert_eq!(findings.len(), 1, "{findings:?}");
    // Nor does it stop pruning: a pass of the row cap deletes its events with the others', and
    // leaves the row as it was.
    let (report, left) = prune_to_cap(s, 1, "an unreadable head").await;
    assert_eq!(report.events_by_cap, 2, "{report:?}");
    let left: Vec<SessionRef> = left.iter().map(|e| e.session_ref()).collect();
    assert_eq!(left, std::slice::from_ref(&other));
    // With its events pruned, the audit still names the head, through the cursor on it alone.
    // (What the mutation did: the cursor's fresh read took the unreadable head for a settled
    // finding, and the audit found nothing; review of stop 67, CY22.)
    let findings = crate::audit::audit_store(s).await.expect("audit").findings;
    assert!(
        matches!(&findings[..], [crate::audit::Finding::UnreadableHead { session, .. }] if *session == torn),
        "after pruning: {findings:?}"
    );
    let read = s.heads(std::slice::from_ref(&torn)).await;
    assert!(
        matches!(read, Err(StoreError::Corrupt { .. })),
        "the head is left as it was: {read:?}"
    );
    assert_eq!(
        s.heads(std::slice::from_ref(&kept)).await.expect("heads")[0].pruned_max_sequence,
        Sequence(1),
        "the readable head is stamped"
    );
    // A recording on the session writes a head again, which must not hide what was pruned.
    let next = rec(s, human(&torn), T0).await.event.sequence;
    let page = s
        .changes_since(&torn, Sequence::ZERO, 200)
        .await
        .expect("the session's changes once it is recorded on again");
    assert_eq!(
        page.events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        [next]
    );
    assert!(
        page.history_gap,
        "its first event was pruned under the damaged head: {page:?}"
    );
}

/// The heads asked for are read by key and agent: an unreadable head of another agent's session
/// of the same key fails neither a read of the heads it is not among nor a page of the session
/// asked for. (What the mutation did: store-postgres read the heads by their keys alone, so that
/// the key's other agent's unreadable head failed the call; review of stop 72, PQ27.)
pub async fn an_unreadable_head_fails_no_read_of_another_agents_session_of_its_key(
    f: impl OpenFile,
) {
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let s = &*t.store;
    let (main, ops) = (r("global", "main"), r("global", "ops"));
    for session in [&main, &ops] {
        rec(s, human(session), T0).await;
    }
    assert!(
        t.raw
            .damage_head_row(&ops)
            .await
            .expect("damage a head row"),
        "the store has a head row to damage"
    );
    let heads = s
        .heads(std::slice::from_ref(&main))
        .await
        .expect("main's head is read whatever ops' holds");
    assert_eq!(
        heads.iter().map(|h| h.last_sequence).collect::<Vec<_>>(),
        [Sequence(1)]
    );
    let page = s
        .changes_since(&main, Sequence::ZERO, 10)
        .await
        .expect("main's page is read whatever ops' head holds");
    assert_eq!(page.events.len(), 1, "{page:?}");
}

/// A failure of an open store names its file, once: a read that meets a damaged row (a page of
/// the session, the log), and a recording whose dedupe key hits that row. The context said only
/// what was being done, so a gateway with two stores could not tell which file had failed.
pub async fn errors_after_open_name_the_file_once(f: impl OpenFile) {
    use crate::StoreError;
    let dir = Scratch::new("durable");
    let file = dir.file();
    let t = open(&f, &file).await;
    let s = &*t.store;
    let kid = child();
    let first = human(&kid).with_dedupe_key("named");
    let seq = rec(s, first.clone(), T0).await.event.sequence;
    assert!(
        t.raw.damage_event_row(seq).await.expect("damage a row"),
        "the store has a row to damage"
    );
    let shown = file.display().to_string();
    let names_it_once = |err: &StoreError, what: &str| {
        let text = err.to_string();
        assert_eq!(text.matches(&shown).count(), 1, "{what}: {text}");
    };
    let page = s
        .changes_since(&kid, Sequence::ZERO, 10)
        .await
        .expect_err("the damaged row fails the page");
    assert!(matches!(page, StoreError::Corrupt { .. }), "{page:?}");
    names_it_once(&page, "a page");
    let log = s
        .events_after(Sequence::ZERO, 10)
        .await
        .expect_err("the damaged row fails the log");
    assert!(matches!(log, StoreError::Corrupt { .. }), "{log:?}");
    names_it_once(&log, "the log");
    let again = s
        .record(first, T0)
        .await
        .expect_err("the dedupe hit meets the damaged row");
    names_it_once(&again, "a recording");
}

/// Four sessions, the second of whose keys holds U+FFFD (which a key may), each recorded on
/// once, in this order, the third under the dedupe key `third_key` when given; and the
/// sequences of their events.
async fn four_sessions_one_with_u_fffd(
    s: &dyn AwarenessStore,
    third_key: Option<&str>,
) -> ([SessionRef; 4], Vec<Sequence>) {
    let sessions = [
        r("agent:main:subagent:a", "main"),
        r("agent:main:subagent:\u{FFFD}", "main"),
        r("agent:main:subagent:b", "main"),
        r("agent:main:subagent:c", "main"),
    ];
    let mut seqs = Vec::new();
    for (i, session) in sessions.iter().enumerate() {
        let event = match third_key {
            Some(key) if i == 2 => human(session).with_dedupe_key(key),
            _ => human(session),
        };
        seqs.push(rec(s, event, T0).await.event.sequence);
    }
    (sessions, seqs)
}

/// A head row holding text that is not UTF-8 (a hand edit by a tool that does not check) stops
/// neither a listing of heads, which lists the others with their pruned watermarks, nor
/// pruning, which stamps the heads of what it deletes. A store that read many heads as one piece of text failed the listing as a
/// whole, for good. (Stamped for a store whose head rows can hold such text.)
pub async fn a_head_with_text_that_is_not_utf8_stops_neither_listing_nor_pruning(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let s = &*t.store;
    let ([first, replacement, spoiled, last], seqs) = four_sessions_one_with_u_fffd(s, None).await;
    let listed = async |agent: Option<&str>| {
        listed_heads(s, agent, "a listing over a head that is not UTF-8").await
    };
    assert!(
        t.raw.spoil_head_text(&spoiled).await.expect("spoil a head"),
        "the store has a head row to spoil"
    );
    let others = [first, last, replacement.clone()];
    assert_eq!(listed(None).await, others);
    assert_eq!(listed(Some("main")).await, others);
    // The row cap deletes the spoiled head's event with the two before it.
    let (report, left) = prune_to_cap(s, 1, "a head that is not UTF-8").await;
    assert_eq!(report.events_by_cap, 3, "{report:?}");
    let left: Vec<Sequence> = left.iter().map(|e| e.sequence).collect();
    assert_eq!(left, [seqs[3]]);
    let head = s
        .heads(std::slice::from_ref(&replacement))
        .await
        .expect("its head");
    assert_eq!(head[0].pruned_max_sequence, seqs[1], "{head:?}");
    // Listed past the head that is not UTF-8, it keeps that watermark too. (What the mutation
    // did: store-sqlite, reading such a listing again one row at a time, gave each head a
    // watermark of 0, hiding the history gap; review of stop 68, S809.)
    let heads = s
        .list_heads(None)
        .await
        .expect("a listing over a head that is not UTF-8");
    let again = heads.iter().find(|h| h.session == replacement);
    assert_eq!(
        again.map(|h| h.pruned_max_sequence),
        Some(seqs[1]),
        "{heads:?}"
    );
    // A head listed past that row keeps its last sequence and its watermark, each in its place:
    // the last session, none of whose events went, ends at its event with nothing pruned. (What
    // the mutation did: store-sqlite, reading such a listing again one row at a time, swapped the
    // two, giving a head a watermark past its last sequence; review of stop 71, SC05.)
    let untouched = heads.iter().find(|h| h.session == others[1]);
    assert_eq!(
        untouched.map(|h| (h.last_sequence, h.pruned_max_sequence)),
        Some((seqs[3], Sequence::ZERO)),
        "{heads:?}"
    );
}

/// The links and the heads listed past a row holding text that is not UTF-8 come by key then
/// agent, as each whole listing does, with two refs whose key order is not their agent order.
/// (What the mutations did: store-sqlite, reading such a listing again one row at a time,
/// ordered those rows by agent first, so a listing changed order when one of its rows could not
/// be read: review of stop 63, Q23 for the links, Q24 for the heads.)
pub async fn listings_past_a_row_that_is_not_utf8_keep_key_then_agent_order(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let (s, u) = (&*t.store, &*t.upstream);
    let first = r("agent:main:subagent:a", "zed");
    let second = r("agent:main:subagent:b", "main");
    let spoiled = r("agent:main:subagent:c", "main");
    for (i, session) in [&second, &first, &spoiled].into_iter().enumerate() {
        rec(s, human(session), T0).await;
        u.upsert_link(link_spec(session, &format!("t{i}"), 10), T0)
            .await
            .expect("adopt");
    }
    let links = async || -> Vec<SessionRef> {
        let links = u.links().await.expect("links");
        links.into_iter().map(|l| l.session).collect()
    };
    let heads = async || -> Vec<SessionRef> {
        let heads = s.list_heads(None).await.expect("heads");
        heads.into_iter().map(|h| h.session).collect()
    };
    let whole = [first.clone(), second.clone(), spoiled.clone()];
    assert_eq!(links().await, whole, "the whole listing of links");
    assert_eq!(heads().await, whole, "the whole listing of heads");
    assert!(
        t.raw.spoil_link_text(&spoiled).await.expect("spoil a link"),
        "the store has a link row to spoil"
    );
    assert!(
        t.raw.spoil_head_text(&spoiled).await.expect("spoil a head"),
        "the store has a head row to spoil"
    );
    // One agent's listing past the spoiled row holds that agent's heads alone.
    let main = crate::AgentId::new("main").expect("agent");
    let of_main = s.list_heads(Some(&main)).await.expect("heads of main");
    let of_main: Vec<SessionRef> = of_main.into_iter().map(|h| h.session).collect();
    assert_eq!(
        of_main,
        std::slice::from_ref(&second),
        "agent main's heads past the spoiled row"
    );
    let readable = [first, second];
    assert_eq!(links().await, readable, "links past the spoiled row");
    assert_eq!(heads().await, readable, "heads past the spoiled row");
}

/// A head row and event rows holding text that is not UTF-8 in one file stop no pruning: a
/// pass of the row cap and a pass of the age step each delete the events they reach, the
/// spoiled ones among them, and stamp the readable heads of what they delete; the listing of
/// heads still leaves out only the spoiled head. Each damage alone was pruned over, but a store
/// that looked for the session of an event it could not read by decoding every key of its
/// index met the spoiled head there, and failed every pass from then on.
pub async fn a_head_and_an_event_with_text_that_is_not_utf8_together_stop_no_pruning(
    f: impl OpenFile,
) {
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let s = &*t.store;
    let ([first, replacement, spoiled, last], seqs) = four_sessions_one_with_u_fffd(s, None).await;
    assert!(
        t.raw.spoil_head_text(&spoiled).await.expect("spoil a head"),
        "the store has a head row to spoil"
    );
    let spoil_event = async |seq: Sequence| {
        assert!(
            t.raw.spoil_event_text(seq).await.expect("spoil an event"),
            "the store has an event row to spoil"
        );
    };
    spoil_event(seqs[0]).await;
    // The row cap deletes the spoiled event with the one after it.
    let (report, left) = prune_to_cap(s, 2, "a head and an event that are not UTF-8").await;
    assert_eq!(report.events_by_cap, 2, "{report:?}");
    assert_eq!(sequences(&left), seqs[2..]);
    let head = s
        .heads(std::slice::from_ref(&replacement))
        .await
        .expect("its head");
    assert_eq!(head[0].pruned_max_sequence, seqs[1], "{head:?}");
    // The age step deletes the rest: the event of the spoiled head, spoiled too, and the last.
    spoil_event(seqs[2]).await;
    let cutoff = T0.plus_ms(1);
    let deleted = s
        .prune_chunk(&PruneStep::Age { cutoff }, 100, cutoff)
        .await
        .unwrap_or_else(|e| panic!("an age pass over a head and an event that are not UTF-8: {e}"));
    assert_eq!(deleted, 2);
    let left = s
        .events_after(Sequence::ZERO, 100)
        .await
        .expect("the log after the age pass");
    assert!(left.is_empty(), "{left:?}");
    let head = s
        .heads(std::slice::from_ref(&last))
        .await
        .expect("its head");
    assert_eq!(head[0].pruned_max_sequence, seqs[3], "{head:?}");
    assert_eq!(
        listed_heads(s, None, "a listing after both passes").await,
        [first, last, replacement]
    );
}

/// An event row holding text that is not UTF-8 stops no pruning, which deletes that event in
/// its turn. A store that read many events as one piece of text failed every pruning pass from
/// then on, so the log grew without bound.
pub async fn an_event_with_text_that_is_not_utf8_is_pruned_in_its_turn(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let s = &*t.store;
    let ([_, replacement, _, _], seqs) = four_sessions_one_with_u_fffd(s, None).await;
    assert!(
        t.raw
            .spoil_event_text(seqs[0])
            .await
            .expect("spoil an event"),
        "the store has an event row to spoil"
    );
    let (report, left) = prune_to_cap(s, 1, "an event that is not UTF-8").await;
    assert_eq!(report.events_by_cap, 3, "{report:?}");
    let left: Vec<Sequence> = left.iter().map(|e| e.sequence).collect();
    assert_eq!(left, [seqs[3]], "the spoiled event pruned in its turn");
    // Pruned in the same chunk as the spoiled event, the session whose key holds U+FFFD is
    // stamped as any other: its history is not reported whole.
    let head = s
        .heads(std::slice::from_ref(&replacement))
        .await
        .expect("its head");
    assert_eq!(head[0].pruned_max_sequence, seqs[1], "{head:?}");
}

/// Whether `message` names the event row `seq` as the stores do (`event <seq>` or
/// `event row <seq>`, the number whole).
fn names_event(message: &str, seq: Sequence) -> bool {
    ["event ", "event row "].iter().any(|prefix| {
        let needle = format!("{prefix}{}", seq.get());
        message
            .match_indices(&needle)
            .any(|(at, _)| !message[at + needle.len()..].starts_with(|c: char| c.is_ascii_digit()))
    })
}

/// `err` is a [`StoreError::Corrupt`](crate::StoreError::Corrupt) whose message names the
/// event row `seq` ([`names_event`]); `what` says which call failed.
fn assert_corrupt_naming(err: &crate::StoreError, seq: Sequence, what: &str) {
    assert!(
        matches!(err, crate::StoreError::Corrupt { .. }),
        "{what}: a corrupt row: {err:?}"
    );
    let message = crate::error::ErrorChain(err).to_string();
    assert!(
        names_event(&message, seq),
        "{what}: the error names event {seq}: {message}"
    );
}

/// The sequences of `events`.
fn sequences(events: &[std::sync::Arc<crate::Event>]) -> Vec<Sequence> {
    events.iter().map(|e| e.sequence).collect()
}

/// An event row holding text that is not UTF-8 fails a read of the log that meets it, and a
/// recording whose dedupe key hits it, with a [`StoreError::Corrupt`](crate::StoreError::Corrupt)
/// that names the row (its sequence), so that an operator can find it (decision 0016: a read
/// that meets such a row fails, since a log that left it out would be a wrong answer); reads
/// that do not reach it answer: the log past it and below it, the pages of other sessions,
/// the log's stats. (Which session's page holds a row whose session key is no longer UTF-8 is
/// the store's own: [`an_unreadable_event_row_fails_the_reads_that_reach_it_naming_it`]
/// checks a page that reaches an unreadable row.) One store failed naming a byte offset into a
/// page of many rows, which no tool can act on.
pub async fn an_event_with_text_that_is_not_utf8_fails_the_log_naming_it(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let s = &*t.store;
    let (sessions, seqs) = four_sessions_one_with_u_fffd(s, Some("spoiled")).await;
    let spoiled = seqs[2];
    assert!(
        t.raw
            .spoil_event_text(spoiled)
            .await
            .expect("spoil an event"),
        "the store has an event row to spoil"
    );
    let err = s
        .events_after(Sequence::ZERO, 100)
        .await
        .expect_err("the log meets the spoiled event");
    assert_corrupt_naming(&err, spoiled, "the log over it");
    let err = s
        .record(human(&sessions[2]).with_dedupe_key("spoiled"), T0)
        .await
        .expect_err("a dedupe hit on the spoiled event");
    assert_corrupt_naming(&err, spoiled, "a dedupe hit on it");
    let past = s
        .events_after(spoiled, 100)
        .await
        .expect("the log past the spoiled event");
    assert_eq!(sequences(&past), [seqs[3]]);
    let below = s
        .events_after(Sequence::ZERO, 2)
        .await
        .expect("the log below the spoiled event");
    assert_eq!(sequences(&below), seqs[..2]);
    for i in [0, 1, 3] {
        let page = s
            .changes_since(&sessions[i], Sequence::ZERO, 100)
            .await
            .unwrap_or_else(|e| panic!("another session's page: {e}"));
        assert_eq!(sequences(&page.events), [seqs[i]], "session {i}'s page");
    }
    let stats = s.log_stats().await.expect("the log's stats");
    assert_eq!(
        (stats.rows, stats.min_sequence, stats.max_sequence),
        (4, seqs[0], seqs[3])
    );
}

/// An event row the store cannot read ([`RawAccess::damage_event_row`](super::RawAccess)) fails
/// every read that reaches it with a [`StoreError::Corrupt`](crate::StoreError::Corrupt) naming
/// the row (its sequence): the log from below it, its session's page from below it, and a
/// recording whose dedupe key hits it, on an unwatched session and on a watched one (which a
/// store may record by different paths); reads that do not reach it answer: the log up to
/// below it and past it, its session's page past it, another session's page, the log's stats.
/// A page of another agent's session on its key, over an unreadable row of its own, names that
/// row, not the one before it. A read that failed naming no row left an operator nothing to act
/// on; one that failed without reaching the row would stop a session for one damaged row of
/// another.
pub async fn an_unreadable_event_row_fails_the_reads_that_reach_it_naming_it(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let s = &*t.store;
    let (on_it, other) = (
        r("agent:main:subagent:a", "main"),
        r("agent:main:subagent:b", "main"),
    );
    // On it 1, 3 (under the dedupe key "third") and 5; on the other 2 and 4.
    for i in 1..=5 {
        let event = match i {
            3 => human(&on_it).with_dedupe_key("third"),
            _ if i % 2 == 1 => human(&on_it),
            _ => human(&other),
        };
        assert_eq!(rec(s, event, T0).await.event.sequence, Sequence(i));
    }
    let damaged = Sequence(3);
    damage_event(&t, damaged).await;
    let err = s
        .events_after(Sequence::ZERO, 100)
        .await
        .expect_err("the log over the damaged row");
    assert_corrupt_naming(&err, damaged, "the log over it");
    let err = s
        .changes_since(&on_it, Sequence::ZERO, 100)
        .await
        .expect_err("its session's page over the damaged row");
    assert_corrupt_naming(&err, damaged, "its session's page over it");
    let manager = w("agent:main:main");
    for watched in [false, true] {
        if watched {
            s.watch(&manager, &on_it, T0).await.expect("watch");
        }
        let err = s
            .record(human(&on_it).with_dedupe_key("third"), T0)
            .await
            .expect_err("a dedupe hit on the damaged row");
        assert_corrupt_naming(
            &err,
            damaged,
            &format!("watched {watched}: a dedupe hit on it"),
        );
    }
    let below = s
        .events_after(Sequence::ZERO, 2)
        .await
        .expect("the log up to below the damaged row");
    assert_eq!(sequences(&below), [Sequence(1), Sequence(2)]);
    let past = s
        .events_after(damaged, 100)
        .await
        .expect("the log past the damaged row");
    assert_eq!(sequences(&past), [Sequence(4), Sequence(5)]);
    let page = s
        .changes_since(&on_it, damaged, 100)
        .await
        .expect("its session's page past the damaged row");
    assert_eq!(sequences(&page.events), [Sequence(5)]);
    let page = s
        .changes_since(&other, Sequence::ZERO, 100)
        .await
        .expect("another session's page");
    assert_eq!(sequences(&page.events), [Sequence(2), Sequence(4)]);
    let stats = s.log_stats().await.expect("the log's stats");
    assert_eq!(
        (stats.rows, stats.min_sequence, stats.max_sequence),
        (5, Sequence(1), Sequence(5))
    );
    // (What the mutation did: store-sqlite looked for the row at fault among every agent's rows
    // on the key, and named event 3 of agent main as agent zed's; review of stop 68, S705.)
    let zed = r("agent:main:subagent:a", "zed");
    let its_own = rec(s, human(&zed), T0).await.event.sequence;
    damage_event(&t, its_own).await;
    let err = s
        .changes_since(&zed, Sequence::ZERO, 100)
        .await
        .expect_err("another agent's page on the key, over its own damaged row");
    assert_corrupt_naming(&err, its_own, "another agent's page on the key");
}

/// The audit of a store (`awareness doctor`) over an event row the store cannot read reports it,
/// as [`Finding::UnreadableEvent`](crate::audit::Finding::UnreadableEvent) after the last event
/// before it, with the store's error naming the row, and audits the rest: the events before it,
/// every head and every cursor (here a session whose head row is gone, found through its event
/// before the damaged row and through the cursor on it, and a cursor row the store cannot read
/// either). It failed as a whole, reporting nothing else. The findings come in the order
/// [`audit_store`](crate::audit::audit_store) gives: the log's and heads' and cursors', then
/// the unreadable event row, then the unreadable cursor rows. The row's reason is the store's
/// error with its causes, as the reading of the log fails with.
pub async fn the_audit_reports_an_unreadable_event_row_and_audits_the_rest(f: impl OpenFile) {
    use crate::audit::Finding;
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let s = &*t.store;
    let (headless, other) = (
        r("agent:main:subagent:a", "main"),
        r("agent:main:subagent:b", "main"),
    );
    for i in 1..=5 {
        let on = if i % 2 == 1 { &headless } else { &other };
        assert_eq!(rec(s, human(on), T0).await.event.sequence, Sequence(i));
    }
    let manager = w("agent:main:main");
    let watching_a = s.watch(&manager, &headless, T0).await.expect("watch");
    s.watch(&manager, &other, T0).await.expect("watch");
    t.raw
        .delete_head_row(&headless)
        .await
        .expect("delete its head");
    assert!(
        t.raw
            .damage_cursor_row(&manager, &other.session_key)
            .await
            .expect("damage a cursor row"),
        "the store has the cursor row to damage"
    );
    // The other session's first event: the one before it is the first of the log, which a
    // halving that stopped at two rows would not read.
    let damaged = Sequence(2);
    damage_event(&t, damaged).await;
    let audit = crate::audit::audit_store(s)
        .await
        .expect("an audit over the damaged row");
    assert_eq!((audit.heads, audit.cursors), (1, 1), "{audit:?}");
    let [first, second, third, fourth] = &audit.findings[..] else {
        panic!("four findings: {:?}", audit.findings)
    };
    assert_eq!(
        first,
        &Finding::EventsWithoutHead {
            session: headless.clone(),
            max: Sequence(1)
        },
        "the event before the damaged row is audited"
    );
    assert_eq!(second, &Finding::OrphanedCursor(watching_a));
    let Finding::UnreadableEvent { after, reason } = third else {
        panic!("the damaged row: {third:?}")
    };
    assert_eq!(*after, Sequence(1), "the last event read before it");
    assert!(
        names_event(reason, damaged),
        "the reason names it: {reason}"
    );
    let Finding::UnreadableCursor(row) = fourth else {
        panic!("the damaged cursor row, last (review of stop 63, K26): {fourth:?}")
    };
    assert_eq!(
        (&row.watcher, &row.target),
        (&manager.to_string(), &other.session_key.to_string())
    );
    // So does the reading of the log under the audit, whatever its page (at least one row: a
    // page of 0 read nothing and answered a sound log, and a halving that stopped at two rows
    // never gave event 1; both passed every test, the audit's page size halving down to one
    // row: review of stop 60).
    for page in [0, 1, 2, 4, 5000] {
        let mut read = Vec::new();
        let stop = crate::audit::read_log(s, page, |events| {
            read.extend(events.iter().map(|e| e.sequence));
        })
        .await
        .expect("read the log")
        .unwrap_or_else(|| panic!("page {page}: the damaged row stops the reading"));
        assert_eq!(read, [Sequence(1)], "page {page}");
        assert_eq!(stop.after, Sequence(1), "page {page}");
        assert!(names_event(&stop.error.to_string(), damaged), "page {page}");
        assert_eq!(
            *reason,
            crate::error::ErrorChain(&stop.error).to_string(),
            "page {page}: the audit's reason is the error with its causes"
        );
    }
}

/// A recording on a session whose head row the store cannot read succeeds and writes a readable
/// head at its event, with a pruned watermark just below it
/// ([`head_over_unreadable`](crate::protocol::head_over_unreadable), decision 0020): what came
/// before is of unknown history (events may have been pruned under the damaged row, its old
/// watermark is lost), so a reconcile from an earlier version reports a history gap, and one
/// from just below the event does not. Checked for a watched session, an unwatched one, and
/// four recorded among sixteen at once, which a store that batches concurrent recordings
/// ([`Subject::batching`]) must commit as one batch, its writer held while they queue: the
/// session's head is then judged by the first of the four, not the last. One store refused
/// every recording on the session; the other kept a watermark that hid what pruning had
/// deleted.
pub async fn a_recording_over_an_unreadable_head_reports_a_history_gap(f: impl OpenFile) {
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let s = &*t.store;
    let (watched, alone, grouped) = (
        r("agent:main:subagent:a", "main"),
        r("agent:main:subagent:b", "main"),
        r("agent:main:subagent:c", "main"),
    );
    s.watch(&w("agent:main:main"), &watched, T0)
        .await
        .expect("watch");
    let mut first = Vec::new();
    for session in [&watched, &alone, &grouped] {
        first.push(rec(s, human(session), T0).await.event.sequence);
        assert!(
            t.raw.damage_head_row(session).await.expect("damage a head"),
            "the store has a head row to damage"
        );
    }
    // `new`: the session's events recorded over the damaged head, ascending; the first of
    // them is the first to write a head again.
    let check = async |session: &SessionRef, first: Sequence, new: &[Sequence]| {
        let (earliest, last) = (new[0], new[new.len() - 1]);
        let head = s
            .heads(std::slice::from_ref(session))
            .await
            .unwrap_or_else(|e| panic!("{session}: the head is readable again: {e}"));
        assert_eq!(head.len(), 1, "{session}");
        assert_eq!(head[0].last_sequence, last, "{session}");
        assert_eq!(
            head[0].pruned_max_sequence,
            Sequence(earliest.0 - 1),
            "{session}: just below the first event recorded over it"
        );
        let page = s
            .changes_since(session, Sequence::ZERO, 200)
            .await
            .expect("changes");
        assert!(page.history_gap, "{session}: from 0: {page:?}");
        let mut all = vec![first];
        all.extend_from_slice(new);
        assert_eq!(
            page.events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            all,
            "{session}"
        );
        let page = s
            .changes_since(session, Sequence(earliest.0 - 1), 200)
            .await
            .expect("changes");
        assert!(!page.history_gap, "{session}: from just below: {page:?}");
    };
    for (i, session) in [&watched, &alone].into_iter().enumerate() {
        let last = rec(s, human(session), T0).await.event.sequence;
        check(session, first[i], &[last]).await;
    }
    // Four of the sixteen on the damaged session: a group holding several of them is judged
    // by its first. A store that batches concurrent recordings has its writer held while they
    // queue, so that one batch takes all sixteen (left to the scheduler, a wave may be
    // committed one event at a time and never reach the batch path).
    let events: Vec<NewEvent> = (0..16)
        .map(|i| {
            let session = if i % 4 == 1 {
                grouped.clone()
            } else {
                r(&format!("agent:main:subagent:s{}", i % 4), "main")
            };
            log_only(&session, "e")
        })
        .collect();
    let batching = t.batching.as_ref();
    let txs_before = batching.map(|b| (b.write_transactions)());
    let answers = super::model::record_wave(&t.store, batching, &events, T0).await;
    let mut new = Vec::new();
    for (i, answer) in answers.into_iter().enumerate() {
        let got = match answer {
            super::model::Answer::Queued(call) => call.await.expect("join"),
            super::model::Answer::AtOnce(got) => {
                panic!("call {i} answered while the writer was held: {got:?}")
            }
        };
        let got = got.expect("every recording succeeds");
        if i % 4 == 1 {
            new.push(got.event.sequence);
        }
    }
    if let (Some(b), Some(before)) = (batching, txs_before) {
        assert_eq!(
            (b.write_transactions)() - before,
            b.hold_transactions + 1,
            "the sixteen were committed in one batch"
        );
    }
    new.sort();
    check(&grouped, first[2], &new).await;
}

/// A cursor row the store can no longer read (a torn write, a hand edit, another writer's row)
/// is left out, with a warning, of everything that reads many cursors, and stops none of it: a
/// recording on its target (alone or among concurrent ones) moves the other watchers' cursors,
/// listings and the start-up sweep answer every other cursor, and an acknowledgement naming its
/// target acknowledges the others; none of them rewrites it. Reading that one cursor fails with
/// [`StoreError::Corrupt`](crate::StoreError::Corrupt), and
/// [`unreadable_cursors`](crate::CursorStore::unreadable_cursors) and the audit name it. A
/// write that names that cursor (a watch, a recording naming its watcher) writes a new cursor
/// over it; an unwatch, a reset of its watcher, a deletion of its target or a pruning pass
/// (once it is idle) removes it.
pub async fn an_unreadable_cursor_row_is_left_out_and_stops_nothing_else(f: impl OpenFile) {
    unreadable_cursor_rows(f, false).await;
}

/// [`an_unreadable_cursor_row_is_left_out_and_stops_nothing_else`], with rows whose target agent
/// is text that is not UTF-8 (a hand edit by a tool that does not check). A store that reads
/// many cursors as one piece of text failed every such read as a whole: no recording on the
/// target, no start-up sweep, no deletion of the target.
pub async fn a_cursor_row_with_text_that_is_not_utf8_is_left_out_and_stops_nothing_else(
    f: impl OpenFile,
) {
    unreadable_cursor_rows(f, true).await;
}

/// A warning the store logs about its file names the file, as its errors do, so that a host
/// with several stores can tell which file holds what it warns of: a cursor row damaged behind
/// the store's back, left out of a listing with a warning, is named with the path the store
/// was opened with (or its canonical form); a watch that then replaces the row warns naming
/// the file, the watcher, the target and its agent. The warning is read from the process-wide capture
/// ([`Capture::warnings`](super::logs::Capture::warnings)), since a store may log on tokio's
/// blocking pool; this check's lines are the ones naming its own file.
pub async fn a_warning_names_the_file(f: impl OpenFile) {
    let capture = super::logs::Capture::warnings();
    let dir = Scratch::new("durable");
    let file = dir.file();
    let t = open(&f, &file).await;
    let (watcher, target) = (w("agent:main:main"), r("agent:main:subagent:a", "main"));
    t.store.watch(&watcher, &target, T0).await.expect("watch");
    assert!(
        t.raw
            .damage_cursor_row(&watcher, &target.session_key)
            .await
            .expect("damage the cursor row"),
        "the store has a cursor row to damage"
    );
    let listed = t
        .store
        .cursors(&crate::CursorFilter::default())
        .await
        .expect("the listing leaves the row out");
    assert_eq!(listed, Vec::new());
    let canonical = std::fs::canonicalize(&file).expect("the store's file");
    let named = |line: &str| {
        [&file, &canonical]
            .iter()
            .any(|p| line.contains(&format!("path={} ", p.display())))
    };
    // Other tests of the binary log into the same capture: a line naming no file cannot be
    // told to be this check's, so a warning that does not name the file is not found at all.
    let lines = capture.lines();
    let warned = lines
        .iter()
        .filter(|l| l.contains("cannot be read") && l.contains(target.session_key.as_str()))
        .filter(|l| named(l))
        .count();
    assert_eq!(
        warned, 1,
        "one warning about the row, naming the file as path=: {lines:#?}"
    );
    t.store
        .watch(&watcher, &target, T0)
        .await
        .expect("a watch replaces the row");
    let lines = capture.lines();
    let replaced: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("replacing a watch cursor") && named(l))
        .collect();
    assert_eq!(replaced.len(), 1, "{lines:#?}");
    for field in [
        format!("watcher={watcher} "),
        format!("target={} ", target.session_key),
        format!("agent_id={} ", target.agent_id),
        "error=corrupt store: ".to_owned(),
    ] {
        assert!(replaced[0].contains(&field), "{field}: {}", replaced[0]);
    }
    // A head row a listing leaves out is warned of too, once, naming the file and the session.
    // (What the mutation did: store-postgres left such a row out without a word; review of
    // stop 72, PQ34, there tested on its own; the warning of the others is checked here.)
    rec(&*t.store, human(&target), T0).await;
    assert!(
        t.raw
            .damage_head_row(&target)
            .await
            .expect("damage a head row"),
        "the store has a head row to damage"
    );
    let about_the_head = || {
        capture
            .lines()
            .iter()
            .filter(|l| l.contains("head") && l.contains(target.session_key.as_str()))
            .filter(|l| named(l))
            .count()
    };
    let before = about_the_head();
    let listed = listed_heads(&*t.store, None, "the listing leaves the row out").await;
    assert!(!listed.contains(&target), "{listed:?}");
    assert_eq!(
        about_the_head() - before,
        1,
        "one warning about the head row, naming the file as path=: {:#?}",
        capture.lines()
    );
    t.close().await;
}

/// The check of unreadable cursor rows, with rows damaged by
/// [`RawAccess::damage_cursor_row`](super::RawAccess::damage_cursor_row), or spoiled by
/// [`RawAccess::spoil_cursor_text`](super::RawAccess::spoil_cursor_text) (`spoil`).
async fn unreadable_cursor_rows(f: impl OpenFile, spoil: bool) {
    use crate::{CursorFilter, StoreError};
    let dir = Scratch::new("durable");
    let t = open(&f, &dir.file()).await;
    let s = &*t.store;
    let (manager, other) = (w("agent:main:main"), w("agent:main:subagent:peer"));
    let (first, second) = (
        r("agent:main:subagent:a", "main"),
        r("agent:main:subagent:b", "main"),
    );
    for (watcher, target) in [(&manager, &first), (&manager, &second), (&other, &first)] {
        s.watch(watcher, target, T0).await.expect("watch");
    }
    let told = rec(s, human(&first), T0).await;
    assert_eq!(
        told.notices.len(),
        2,
        "both watchers of the first target are told"
    );
    let second_seen = rec(s, human(&second), T0).await.event.sequence;
    let damage_or_spoil = async |watcher: &crate::WatcherKey, target: &SessionRef| {
        if spoil {
            t.raw.spoil_cursor_text(watcher, &target.session_key).await
        } else {
            t.raw.damage_cursor_row(watcher, &target.session_key).await
        }
        .expect("damage a cursor row")
    };
    assert!(
        damage_or_spoil(&manager, &first).await,
        "the store has a cursor row to damage"
    );
    let damage = async |watcher: &crate::WatcherKey, target: &SessionRef| {
        assert!(
            damage_or_spoil(watcher, target).await,
            "the store has a cursor row to damage"
        );
    };
    // Every listing, whatever its filter, leaves it out.
    let listed = async |watcher: Option<&crate::WatcherKey>,
                        target: Option<&SessionRef>,
                        pending_only: bool| {
        let filter = CursorFilter {
            watcher: watcher.map(|w| w.session_key().clone()),
            target: target.map(|t| t.session_key.clone()),
            pending_only,
        };
        s.cursors(&filter)
            .await
            .unwrap_or_else(|e| panic!("{filter:?}: {e}"))
            .into_iter()
            .map(|c| (c.watcher.to_string(), c.target.to_string()))
            .collect::<Vec<_>>()
    };
    let others = vec![
        (manager.to_string(), second.session_key.to_string()),
        (other.to_string(), first.session_key.to_string()),
    ];
    assert_eq!(
        listed(None, None, false).await,
        others,
        "every cursor but the damaged one"
    );
    assert_eq!(listed(None, None, true).await, others, "the pending ones");
    assert_eq!(
        listed(None, Some(&first), false).await,
        [(other.to_string(), first.session_key.to_string())]
    );
    // Its watcher's, which every turn asks for.
    assert_eq!(
        listed(Some(&manager), None, false).await,
        [(manager.to_string(), second.session_key.to_string())]
    );

    // The point read names it, and so do the store's list of such rows and the audit.
    let err = s
        .cursor(&manager, &first.session_key)
        .await
        .expect_err("reading the damaged cursor");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    let unreadable = s.unreadable_cursors().await.expect("unreadable cursors");
    assert_eq!(
        unreadable
            .iter()
            .map(|u| (u.watcher.as_str(), u.target.as_str()))
            .collect::<Vec<_>>(),
        [(manager.as_str(), first.session_key.as_str())],
        "{unreadable:?}"
    );
    let audit = crate::audit::audit_store(s).await.expect("the audit");
    assert!(
        audit
            .findings
            .contains(&crate::audit::Finding::UnreadableCursor(
                unreadable[0].clone()
            )),
        "{:?}",
        audit.findings
    );

    // A re-freeze naming it re-freezes the others it names.
    let refrozen = s
        .refreeze(
            &[
                crate::CursorKey {
                    watcher: manager.clone(),
                    target: first.session_key.clone(),
                },
                crate::CursorKey {
                    watcher: other.clone(),
                    target: first.session_key.clone(),
                },
            ],
            LATER,
        )
        .await
        .expect("a re-freeze naming the damaged cursor");
    assert_eq!(
        refrozen
            .iter()
            .map(|n| (n.watcher.to_string(), n.target.to_string()))
            .collect::<Vec<_>>(),
        [(other.to_string(), first.session_key.to_string())]
    );

    // The start-up sweep re-delivers every other pending notice.
    let mut swept: Vec<(String, String)> = s
        .sweep(LATER, &|_| true)
        .await
        .expect("the sweep")
        .into_iter()
        .map(|n| (n.watcher.to_string(), n.target.to_string()))
        .collect();
    swept.sort();
    assert_eq!(swept, others, "the sweep's notices");

    // Recordings on its target, one and then sixteen at once (a store may batch those), move the
    // other watcher's cursor.
    let again = rec(s, human(&first), LATER).await.event.sequence;
    let peer = async || {
        s.cursor(&other, &first.session_key)
            .await
            .expect("the other watcher's cursor")
            .expect("it exists")
    };
    assert_eq!(
        peer().await.material,
        again,
        "the other watcher's cursor moved"
    );
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let store = std::sync::Arc::clone(&t.store);
            let e = human(&first);
            tokio::spawn(async move { store.record(e, LATER).await })
        })
        .collect();
    let mut last = again;
    for call in calls {
        let got = call.await.expect("join").expect("a concurrent recording");
        last = last.max(got.event.sequence);
    }
    assert_eq!(
        peer().await.material,
        last,
        "moved by the concurrent recordings"
    );

    // An acknowledgement naming both targets acknowledges the readable one.
    let follow = s
        .acknowledge(
            &manager,
            &[
                AckTarget::any(first.session_key.clone()),
                AckTarget::any(second.session_key.clone()),
            ],
            LATER,
        )
        .await
        .expect("an acknowledgement naming the damaged cursor's target");
    assert!(
        follow.is_empty(),
        "nothing new on the second target: {follow:?}"
    );
    let second_cursor = s
        .cursor(&manager, &second.session_key)
        .await
        .expect("read")
        .expect("the cursor on the second target");
    assert_eq!(
        second_cursor.last_seen, second_seen,
        "the second target acknowledged"
    );
    assert_eq!(
        s.unreadable_cursors().await.expect("unreadable cursors"),
        unreadable,
        "nothing rewrote the damaged row"
    );

    // A watch from its watcher writes a new cursor over it, at the target's head.
    let fresh = s
        .watch(&manager, &first, LATER)
        .await
        .expect("a watch over it");
    assert_eq!((fresh.last_seen, fresh.material), (last, last), "{fresh:?}");
    assert_eq!(
        s.cursor(&manager, &first.session_key).await.expect("read"),
        Some(fresh)
    );
    assert_eq!(s.unreadable_cursors().await.expect("unreadable"), []);

    // So does a recording that names its watcher.
    damage(&manager, &first).await;
    let spawned = rec(
        s,
        spawn(&first, manager.as_str(), "run-over-a-damaged-row"),
        LATER,
    )
    .await;
    let seeded = s
        .cursor(&manager, &first.session_key)
        .await
        .expect("the seeded cursor reads")
        .expect("a cursor");
    assert_eq!(seeded.last_seen, spawned.event.sequence, "{seeded:?}");
    assert_eq!(s.unreadable_cursors().await.expect("unreadable"), []);

    // Unwatching removes it.
    damage(&manager, &first).await;
    assert!(
        s.unwatch(&manager, &first.session_key)
            .await
            .expect("unwatch"),
        "the damaged row was there to remove"
    );
    assert_eq!(
        s.cursor(&manager, &first.session_key).await.expect("read"),
        None
    );

    // Deleting its target removes it, whatever agent it was for.
    damage(&other, &first).await;
    s.delete_session(&first).await.expect("delete the target");
    assert_eq!(s.unreadable_cursors().await.expect("unreadable"), []);
    assert_eq!(
        listed(None, None, false).await,
        [(manager.to_string(), second.session_key.to_string())]
    );

    // Deleting another agent's session of its watcher's key (which watches nothing: the key
    // names agent `main`) leaves it, as it leaves that watcher's readable rows. store-postgres
    // passed every check with the watcher condition of its choice of rows dropped, deleting it
    // (review, stop 58).
    damage(&manager, &second).await;
    let namesake = r(manager.as_str(), "ops");
    rec(s, human(&namesake), LATER).await;
    s.delete_session(&namesake)
        .await
        .expect("delete the namesake");
    assert_eq!(
        s.unreadable_cursors().await.expect("unreadable").len(),
        1,
        "the watcher's damaged row stays"
    );

    // A pruning pass deletes it once it is idle, as it deletes any idle cursor.
    let idle = PruneStep::Cursors {
        cutoff: Timestamp(LATER.0 + 1),
    };
    assert_eq!(
        s.prune_chunk(&idle, 100, LATER).await.expect("prune"),
        1,
        "the idle damaged row deleted"
    );
    assert_eq!(s.unreadable_cursors().await.expect("unreadable"), []);
    assert_eq!(
        s.cursors(&CursorFilter::default()).await.expect("cursors"),
        []
    );

    // A reset of its watcher removes it, and counts it.
    s.watch(&manager, &second, LATER).await.expect("watch");
    damage(&manager, &second).await;
    assert_eq!(
        s.reset_watcher(manager.session_key()).await.expect("reset"),
        1,
        "the reset counts the damaged row it removed"
    );
    assert_eq!(s.unreadable_cursors().await.expect("unreadable"), []);
    assert_eq!(
        s.cursors(&CursorFilter::default()).await.expect("cursors"),
        []
    );

    if spoil {
        // A watcher key that is not UTF-8 (the row no longer answers to its watcher): left out
        // of listings, and removed by a deletion of its target, though no text read back
        // names it; a cursor on another agent's session of the key stays.
        let third = w("agent:ops:main");
        let theirs = r(second.session_key.as_str(), "ops");
        for watcher in [&manager, &other] {
            s.watch(watcher, &second, LATER).await.expect("watch");
        }
        s.watch(&third, &theirs, LATER).await.expect("watch");
        assert!(
            t.raw
                .spoil_cursor_watcher(&manager, &second.session_key)
                .await
                .expect("spoil a watcher key"),
            "the row exists"
        );
        let kept = (third.to_string(), second.session_key.to_string());
        assert_eq!(
            listed(None, None, false).await,
            [
                (other.to_string(), second.session_key.to_string()),
                kept.clone()
            ]
        );
        assert_eq!(s.unreadable_cursors().await.expect("unreadable").len(), 1);
        s.delete_session(&second).await.expect("delete the target");
        assert_eq!(s.unreadable_cursors().await.expect("unreadable"), []);
        assert_eq!(
            listed(None, None, false).await,
            [kept],
            "another agent's session of the key keeps its watcher"
        );
    }
}

/// Polls `call` up to `polls` times, then drops it unless it finished: a cancelled caller.
/// Answers whether it was cancelled (a check whose calls all finished cancelled nothing, and
/// asserts that some did not).
async fn give_up_after<F: Future>(polls: usize, call: F) -> bool {
    give_up(GiveUp::Polls(polls as u64), call).await
}

/// When a check drops a call it gives up on.
#[derive(Debug, Clone, Copy)]
enum GiveUp {
    /// After this many polls (yielding between them) that left it unfinished.
    Polls(u64),
    /// Once this much time has passed since its first poll, polled (yielding) until then.
    After(std::time::Duration),
}

/// Polls `call` (yielding between polls) until `when` says to give up, then drops it; answers
/// whether it was dropped unfinished.
async fn give_up<F: Future>(when: GiveUp, call: F) -> bool {
    let mut call = std::pin::pin!(call);
    let started = std::time::Instant::now();
    let mut polls = 0;
    loop {
        let over = match when {
            GiveUp::Polls(n) => polls >= n,
            GiveUp::After(budget) => polls > 0 && started.elapsed() >= budget,
        };
        if over {
            return true;
        }
        if poll_once(call.as_mut()).await {
            return false;
        }
        polls += 1;
        tokio::task::yield_now().await;
    }
}

/// `b` records on `other`, which must not fail.
async fn b_records(b: &Subject, other: &SessionRef, polls: usize) {
    // A store whose cancelled write kept a lock would keep this waiting: a minute is a failure.
    let got = tokio::time::timeout(
        std::time::Duration::from_mins(1),
        b.store.record(human(other), T0),
    )
    .await;
    assert!(
        matches!(got, Ok(Ok(_))),
        "a write cancelled after {polls} polls kept the file from another handle: {got:?}"
    );
}

/// For the stores' crash tests, after a kill and a reopen: records `event` and checks that it
/// gets a sequence above every sequence the file holds (`present_max`) and above every sequence
/// a caller was ever given (`handed_out`), lost or not: the counter never goes back, and no
/// number is handed out twice. Returns the new sequence. `round` names the kill in messages.
pub async fn assert_counter_resumes_above(
    store: &dyn AwarenessStore,
    event: NewEvent,
    present_max: u64,
    handed_out: u64,
    round: usize,
) -> u64 {
    let next = store
        .record(event, Timestamp::now())
        .await
        .unwrap_or_else(|e| panic!("round {round}: recording after the reopen failed: {e}"))
        .event
        .sequence
        .get();
    assert!(
        next > present_max,
        "round {round}: sequence {next} reused (the file holds up to {present_max})"
    );
    assert!(
        next > handed_out,
        "round {round}: sequence {next} handed out again (callers were given up to {handed_out})"
    );
    next
}
