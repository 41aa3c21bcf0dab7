//! Group commit: concurrent recordings share write transactions, each caller still gets its own
//! event after the commit that holds it, and the protocol is that of one transaction per event.
//!
//! The exact-count tests make the batching deterministic: the runtime has one blocking thread,
//! held busy while every recording is polled once (which queues its event), so the drain starts
//! only once all of them wait. The checks every batching store shares (concurrent callers
//! share transactions, `group_commit(1)`, the batch bound, `0` refused, a cursor row that
//! cannot be read failing no batch) run from
//! `awareness_core::group_commit_suite!`, in both durability modes and with live readers.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::mpsc;
use std::task::{Context, Poll, Waker};

use awareness_core::testkit::group_commit::Grouped;
use awareness_core::{
    ActorType, CursorStore, EventKind, EventStore, NewEvent, Recorded, Sequence, SessionRef,
    StoreError, Timestamp, WatcherKey,
};
use store_redb::{DEFAULT_GROUP_COMMIT, RedbOptions, RedbStore};

const T0: Timestamp = Timestamp(1_800_000_000_000);
const CALLS: usize = 32;

fn session(i: usize) -> SessionRef {
    SessionRef::parse(&format!("agent:main:subagent:s{}", i % 4), "main").unwrap()
}

/// Call `i`: a human message on one of four sessions; every eighth call carries the same dedupe
/// key (the first stores, the later ones are hits inside the same batch).
fn event(i: usize) -> NewEvent {
    let mut e = NewEvent::new(
        session(i),
        EventKind::HumanDirectMessage,
        ActorType::Human,
        format!("message {i}"),
    );
    if i % 8 == 7 {
        e = e.with_dedupe_key("same");
    }
    e
}

/// A store on a new file (the directory first: it outlives the store when the pair is dropped).
async fn fresh(options: RedbOptions) -> (tempfile::TempDir, RedbStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open_with(dir.path().join("state.redb"), options)
        .await
        .unwrap();
    (dir, store)
}

/// A current-thread runtime with a single blocking thread.
fn one_blocking_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(1)
        .build()
        .unwrap()
}

type Pending<'a> = Pin<Box<dyn Future<Output = Result<Recorded, StoreError>> + Send + 'a>>;

/// Occupies the only blocking thread until the returned sender is dropped or sent to, once it
/// is free: a drain that has answered every call keeps the thread a few milliseconds for the
/// next recording, and the recordings queued next must not find it.
async fn hold_the_pool() -> mpsc::Sender<()> {
    tokio::task::spawn_blocking(|| ()).await.unwrap();
    let (release, wait) = mpsc::channel::<()>();
    drop(tokio::task::spawn_blocking(move || {
        let _ = wait.recv();
    }));
    release
}

/// Polls `f` once (queueing its event) and returns it, still pending.
fn queue(mut f: Pending<'_>) -> Pending<'_> {
    let mut cx = Context::from_waker(Waker::noop());
    assert!(
        f.as_mut().poll(&mut cx).is_pending(),
        "a recording waits for its commit"
    );
    f
}

/// Checks the answers of `CALLS` recordings of `event(i)` made on an empty store with one
/// watcher on session 0: each call got its own event, hits returned the first stored event,
/// and every call spent one sequence.
fn check_answers(got: &[Recorded]) {
    let first_dedupe = &got[7];
    assert!(!first_dedupe.deduplicated);
    let mut seqs = Vec::new();
    for (i, rec) in got.iter().enumerate() {
        if i % 8 == 7 && i > 7 {
            assert!(rec.deduplicated, "call {i} is a dedupe hit");
            assert_eq!(
                rec.event, first_dedupe.event,
                "a hit returns the first event"
            );
            assert!(rec.notices.is_empty());
            continue;
        }
        assert!(!rec.deduplicated, "call {i}");
        assert_eq!(
            rec.event.summary,
            format!("message {i}"),
            "call {i} got its own event"
        );
        assert_eq!(rec.event.session_ref(), session(i));
        if i == 0 || i % 4 != 0 {
            assert_eq!(rec.notices.len(), usize::from(i == 0), "call {i}: notices");
        }
        seqs.push(rec.event.sequence.get());
    }
    // Recorded in call order, one sequence per call (hits included).
    let expected: Vec<u64> = (1..=CALLS as u64)
        .filter(|s| (s - 1) % 8 != 7 || *s == 8)
        .collect();
    assert_eq!(seqs, expected);
}

/// Records `event(0..CALLS)` all queued before the first commit; returns the answers and the
/// write transactions they took.
fn record_all_queued(options: RedbOptions) -> (Vec<Recorded>, u64) {
    let rt = one_blocking_thread();
    rt.block_on(async {
        let (_dir, store) = fresh(options).await;
        let watcher = WatcherKey::parse("agent:main:main").unwrap();
        store.watch(&watcher, &session(0), T0).await.unwrap();
        let before = store.write_transactions();
        let release = hold_the_pool().await;
        let pending: Vec<Pending<'_>> = (0..CALLS)
            .map(|i| queue(store.record(event(i), T0)))
            .collect();
        drop(release);
        let mut got = Vec::new();
        for f in pending {
            got.push(f.await.expect("record"));
        }
        let took = store.write_transactions() - before;
        // The next call spends the next sequence: nothing was spent twice or skipped.
        let next = store.record(event(0), T0).await.unwrap();
        assert_eq!(next.event.sequence, Sequence(CALLS as u64 + 1));
        let stored = store.events_after(Sequence::ZERO, 100).await.unwrap();
        assert_eq!(
            stored.len(),
            CALLS - 3 + 1,
            "every event but the hits is stored"
        );
        (got, took)
    })
}

#[test]
fn queued_recordings_share_one_transaction() {
    let (got, took) = record_all_queued(RedbOptions::default());
    check_answers(&got);
    assert_eq!(took, 1, "{CALLS} queued recordings, one commit");
}

#[test]
fn a_batch_holds_at_most_group_commit_recordings() {
    let (got, took) = record_all_queued(RedbOptions::default().group_commit(8));
    check_answers(&got);
    assert_eq!(took, 4);
}

#[test]
fn group_commit_of_one_commits_every_recording_alone() {
    let (got, took) = record_all_queued(
        RedbOptions::bounded(std::time::Duration::from_millis(20)).group_commit(1),
    );
    check_answers(&got);
    assert_eq!(took, CALLS as u64);
}

#[test]
fn a_batch_answers_exactly_as_one_transaction_per_event() {
    let (batched, took) = record_all_queued(RedbOptions::default());
    assert_eq!(took, 1);
    let (alone, took) = record_all_queued(RedbOptions::default().group_commit(1));
    assert_eq!(took, CALLS as u64);
    assert_eq!(batched, alone);
}

#[test]
fn the_default_batch_is_documented() {
    assert_eq!(RedbOptions::default().group_commit, DEFAULT_GROUP_COMMIT);
    assert_eq!(DEFAULT_GROUP_COMMIT, 64);
}

awareness_core::raw_access_forwarding!(RedbStore);

/// Opens `path` with `options` and `group_commit(max_events)` for the shared group-commit
/// checks.
async fn open_grouped(
    path: std::path::PathBuf,
    options: RedbOptions,
    max_events: usize,
) -> Result<Grouped, StoreError> {
    let store = Arc::new(RedbStore::open_with(path, options.group_commit(max_events)).await?);
    let raw = Arc::new(Raw(Arc::clone(&store)));
    Ok(Grouped::new(
        store,
        RedbStore::write_transactions,
        RedbStore::largest_batch,
        raw,
    ))
}

mod immediate {
    async fn open(
        path: std::path::PathBuf,
        max_events: usize,
    ) -> Result<super::Grouped, super::StoreError> {
        super::open_grouped(path, super::RedbOptions::default(), max_events).await
    }

    awareness_core::group_commit_suite!(open);
}

mod bounded {
    async fn open(
        path: std::path::PathBuf,
        max_events: usize,
    ) -> Result<super::Grouped, super::StoreError> {
        let options = super::RedbOptions::bounded(std::time::Duration::from_millis(20));
        super::open_grouped(path, options, max_events).await
    }

    awareness_core::group_commit_suite!(open);
}

mod live_readers {
    async fn open(
        path: std::path::PathBuf,
        max_events: usize,
    ) -> Result<super::Grouped, super::StoreError> {
        let options = super::RedbOptions::default().live_readers(true);
        super::open_grouped(path, options, max_events).await
    }

    awareness_core::group_commit_suite!(open);
}

#[test]
fn a_cancelled_caller_cancels_nobody_elses_commit() {
    let rt = one_blocking_thread();
    rt.block_on(async {
        let (_dir, store) = fresh(RedbOptions::default()).await;
        let release = hold_the_pool().await;
        let pending: Vec<Pending<'_>> = (0..CALLS)
            .map(|i| queue(store.record(event(i), T0)))
            .collect();
        // Every other caller gives up after its event was queued.
        let kept: Vec<_> = pending
            .into_iter()
            .enumerate()
            .filter_map(|(i, f)| (i % 2 == 0).then_some((i, f)))
            .collect();
        drop(release);
        for (i, f) in kept {
            let rec = f.await.expect("record");
            assert_eq!(rec.event.summary, format!("message {i}"));
        }
        assert_eq!(store.write_transactions(), 1);
        // A queued event is committed even when its caller left (as a cancelled write may be).
        let stored = store.events_after(Sequence::ZERO, 100).await.unwrap();
        assert_eq!(stored.len(), CALLS - 3);
    });
}

#[test]
fn a_drain_that_never_runs_fails_its_caller_and_the_store_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let first = one_blocking_thread();
    let store = first
        .block_on(RedbStore::open(dir.path().join("state.redb")))
        .unwrap();
    let handle = first.handle().clone();
    // A runtime shutting down drops the blocking tasks it is handed without running them.
    first.shutdown_background();
    {
        let _inside = handle.enter();
        let mut f = store.record(event(0), T0);
        let got = f.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        assert!(
            matches!(got, Poll::Ready(Err(StoreError::Backend { .. }))),
            "{got:?}"
        );
    }
    let second = one_blocking_thread();
    second.block_on(async {
        let rec = store
            .record(event(1), T0)
            .await
            .expect("a new drain starts");
        assert_eq!(rec.event.summary, "message 1");
        assert_eq!(store.write_transactions(), 1);
    });
}

/// A recording or another write called outside a Tokio runtime (polled by hand, with no
/// runtime entered) fails at once with an error saying so, instead of panicking, and leaves
/// nothing queued: the next calls on the handle, inside a runtime, are answered (the bound
/// keeps a handle wedged by a job left queued with no drain from hanging the test). What the
/// writer's queue counts is checked in `commit.rs`.
#[test]
fn a_write_outside_a_runtime_fails_and_does_not_wedge_the_handle() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let store = runtime
        .block_on(RedbStore::open(dir.path().join("state.redb")))
        .unwrap();
    let watcher = WatcherKey::parse("agent:main:main").unwrap();
    // A panic is caught, so that what it leaves behind is checked too.
    let outside = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut cx = Context::from_waker(Waker::noop());
        let recorded = store.record(event(0), T0).as_mut().poll(&mut cx);
        let watched = store
            .watch(&watcher, &session(0), T0)
            .as_mut()
            .poll(&mut cx);
        (recorded, watched)
    }));
    runtime.block_on(async {
        // The bound only keeps a wedged handle from hanging the test.
        let later = std::time::Duration::from_secs(30);
        let rec = tokio::time::timeout(later, store.record(event(1), T0))
            .await
            .expect("a recording inside a runtime, after one outside, was never answered")
            .unwrap();
        assert_eq!(
            rec.event.sequence,
            Sequence(1),
            "nothing was recorded outside"
        );
        tokio::time::timeout(later, store.watch(&watcher, &session(0), T0))
            .await
            .expect("a write inside a runtime, after one outside, was never answered")
            .unwrap();
    });
    let (recorded, watched) = outside.expect("a call outside a runtime panicked");
    for (what, got) in [
        ("record", recorded.map(|r| r.map(drop))),
        ("watch", watched.map(|r| r.map(drop))),
    ] {
        match got {
            Poll::Ready(Err(StoreError::Backend { context, .. })) => assert!(
                context.contains("outside a Tokio runtime"),
                "{what}: {context}"
            ),
            other => panic!("{what} outside a runtime: {other:?}"),
        }
    }
}

#[test]
fn an_event_that_fails_in_a_batch_fails_only_its_own_caller() {
    const EVENTS: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("events");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let rt = one_blocking_thread();
    // Sequence 1 carries the dedupe key "same"; then its row is damaged, as a torn disk would.
    rt.block_on(async {
        let store = RedbStore::open(&path).await.unwrap();
        store.record(event(7), T0).await.unwrap();
    });
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(EVENTS)
            .unwrap()
            .insert(1, b"torn".as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    rt.block_on(async {
        let store = RedbStore::open(&path).await.unwrap();
        let before = store.write_transactions();
        let release = hold_the_pool().await;
        // Call 15 carries the same dedupe key: recording it reads the torn row.
        let pending: Vec<Pending<'_>> = [0, 1, 15, 2, 3]
            .into_iter()
            .map(|i| queue(store.record(event(i), T0)))
            .collect();
        drop(release);
        let mut got = Vec::new();
        for f in pending {
            got.push(f.await);
        }
        assert!(
            matches!(&got[2], Err(StoreError::Corrupt { .. })),
            "{:?}",
            got[2]
        );
        for (i, r) in [(0, &got[0]), (1, &got[1]), (2, &got[3]), (3, &got[4])] {
            let rec = r.as_ref().expect("an unrelated caller is not failed");
            assert_eq!(rec.event.summary, format!("message {i}"));
        }
        // The batch was aborted, then each event recorded alone: four commits, none for the
        // failing one.
        assert_eq!(store.write_transactions() - before, 4);
    });
}

/// Writes other than recordings (here `watch`) go through the same queue as the recordings and
/// take effect in the order they were called: a recording queued after a `watch` notifies the
/// new watcher, one queued before it does not, though the two recordings could have shared a
/// batch.
#[test]
fn writes_and_recordings_take_effect_in_call_order() {
    let rt = one_blocking_thread();
    rt.block_on(async {
        let (_dir, store) = fresh(RedbOptions::default()).await;
        let watcher = WatcherKey::parse("agent:main:main").unwrap();
        let release = hold_the_pool().await;
        let before = queue(store.record(event(0), T0));
        let target = session(0);
        let mut watch = Box::pin(store.watch(&watcher, &target, T0));
        assert!(
            watch
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_pending()
        );
        // Call 4 is on call 0's session.
        let after = queue(store.record(event(4), T0));
        drop(release);
        let before = before.await.unwrap();
        let cursor = watch.await.unwrap();
        let after = after.await.unwrap();
        assert!(before.notices.is_empty(), "recorded before the watch");
        assert_eq!(
            cursor.last_seen, before.event.sequence,
            "watched at the head"
        );
        assert_eq!(after.notices.len(), 1, "recorded after the watch");
        assert_eq!(store.write_transactions(), 3);
    });
}
