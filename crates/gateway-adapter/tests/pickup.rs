//! Notices handed out by another writer of the store reach this gateway's watchers
//! ([`Awareness::pick_up`], [`Awareness::spawn_pickup`]; DESIGN.md section 9.1).
//!
//! "Another writer" is played by writing to the store directly, past the service: the cursor
//! becomes pending and the service's queue never hears of it, exactly as when another gateway
//! process records on a file this one shares. The last test shares a real SQLite file between
//! two handles, whose connections see each other as SQLite sees two processes.

use std::sync::Arc;
use std::time::Duration;

use awareness_core::testkit::checks::human;
use awareness_core::testkit::hooked::{Call, Hook, Hooked};
use awareness_core::{
    AwarenessStore, CursorFilter, CursorStore as _, EventStore as _, SessionKey, SessionRef,
    Timestamp, WatcherKey,
};
use gateway_adapter::{
    Awareness, AwarenessConfig, HeartbeatWake, InMemoryDirectory, InMemoryQueue, PickUp,
    RecordingWake, SessionDirectory, SessionEntry, SystemEventQueue,
};
use store_memory::MemoryStore;
use tokio::sync::mpsc;

mod common;
use common::{FaultyQueue, k};

const MANAGER: &str = "agent:main:main";
const NESTED: &str = "agent:main:subagent:planner";
const ELSEWHERE: &str = "agent:ops:main";
const CHILD: &str = "agent:main:subagent:worker";

fn child() -> SessionRef {
    SessionRef::parse(CHILD, "main").unwrap()
}

/// A directory that knows `sessions` (this gateway's) and no others.
fn directory(sessions: &[&str]) -> Arc<InMemoryDirectory> {
    let dir = Arc::new(InMemoryDirectory::new());
    for s in sessions {
        dir.upsert(k(s), SessionEntry::default());
    }
    dir
}

/// Another writer watches the child for `watchers` and records a human turn on it: every
/// watcher's cursor is pending, and no queue of this gateway was told.
async fn written_elsewhere(store: &dyn AwarenessStore, watchers: &[&str]) {
    for w in watchers {
        store
            .watch(&WatcherKey::parse(w).unwrap(), &child(), Timestamp::now())
            .await
            .expect("watch");
    }
    let recorded = store
        .record(human(&child()), Timestamp::now())
        .await
        .expect("record");
    assert_eq!(recorded.notices.len(), watchers.len());
}

/// Texts queued for `session`.
fn texts(queue: &InMemoryQueue, session: &str) -> Vec<String> {
    queue
        .peek(&k(session))
        .into_iter()
        .map(|e| e.text)
        .collect()
}

/// Only the watchers this gateway's directory knows are queued a notice, and only main
/// sessions are woken (a nested subagent reads it on its next turn); another gateway's watcher
/// is left to that gateway. A second pick-up queues nothing and wakes nobody: the lines are
/// already there.
#[tokio::test]
async fn pick_up_queues_the_notices_of_this_gateways_watchers_once() {
    let store = Arc::new(MemoryStore::new());
    let (svc, queue, wake) = common::service_in(store.clone(), None, directory(&[MANAGER, NESTED]));
    written_elsewhere(&*store, &[MANAGER, NESTED, ELSEWHERE]).await;

    assert_eq!(
        svc.pick_up().await,
        PickUp {
            queued: 2,
            complete: true
        }
    );
    for watcher in [MANAGER, NESTED] {
        let lines = texts(&queue, watcher);
        assert_eq!(lines.len(), 1, "{watcher}: {lines:?}");
        assert!(lines[0].contains(CHILD), "{}", lines[0]);
    }
    assert!(texts(&queue, ELSEWHERE).is_empty(), "not this gateway's");
    assert_eq!(wake.all(), [k(MANAGER)], "only the main session is woken");

    assert_eq!(svc.pick_up().await.queued, 0);
    assert_eq!(wake.all(), [k(MANAGER)], "no second wake");
    assert_eq!(texts(&queue, MANAGER).len(), 1);

    // The manager's turn reads the notice and acknowledges it: nothing is pending any more.
    let read = svc.drain_turn(&k(MANAGER)).await;
    assert_eq!(read.len(), 1);
    let pending = svc
        .store()
        .cursors(&CursorFilter {
            watcher: Some(k(MANAGER)),
            pending_only: true,
            ..CursorFilter::default()
        })
        .await
        .expect("cursors");
    assert!(pending.is_empty(), "acknowledged in the store: {pending:?}");
    assert_eq!(svc.pick_up().await.queued, 0);
}

/// A notice the gateway's queue lost (another component drained it without a turn) is queued
/// again and its session woken by the next pick-up, without waiting for a restart or a turn
/// (DESIGN.md section 9, item 7).
#[tokio::test]
async fn pick_up_queues_again_a_notice_the_queue_lost() {
    let store = Arc::new(MemoryStore::new());
    let (svc, queue, wake) = common::service_in(store.clone(), None, directory(&[MANAGER]));
    svc.subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
        .await
        .expect("spawned");
    let mut msg = gateway_adapter::HumanMessage::new(k(CHILD));
    msg.channel = Some("telegram".into());
    svc.human_message(msg).await.expect("recorded");
    assert_eq!(wake.count(&k(MANAGER)), 1, "delivered by this gateway");
    let lost = queue.drain(&k(MANAGER));
    assert_eq!(lost.len(), 1);

    assert_eq!(svc.pick_up().await.queued, 1);
    assert_eq!(queue.peek(&k(MANAGER)), lost, "the same line again");
    assert_eq!(wake.count(&k(MANAGER)), 2);
}

/// A wake sink that panics (the gateway's heartbeat runner failing) does not end the pick-up,
/// which would take the pick-up task down with it, unlogged: the pick-up says it is not
/// complete (so the task tries again), and the line whose wake panicked is taken back out of
/// the queue, so the next pick-up queues it again and wakes the session. It stayed queued,
/// and every later pick-up took it for delivered: a main session, which takes no turn unless
/// woken, was never woken for it. The watcher's notice on another target, delivered after
/// the one that panicked, is queued and counted all the same.
#[tokio::test]
async fn a_panicking_wake_leaves_the_pick_up_incomplete_not_ended() {
    struct PanicsOnce(
        std::sync::atomic::AtomicBool,
        gateway_adapter::RecordingWake,
    );
    impl HeartbeatWake for PanicsOnce {
        fn wake(&self, session: &SessionKey, reason: &str) {
            assert!(
                self.0.swap(true, std::sync::atomic::Ordering::SeqCst),
                "the heartbeat runner failed"
            );
            self.1.wake(session, reason);
        }
    }
    let capture = common::Capture::default();
    let _logs = capture.install();
    let store = Arc::new(MemoryStore::new());
    let queue = Arc::new(InMemoryQueue::new());
    let wake = Arc::new(PanicsOnce(
        std::sync::atomic::AtomicBool::new(false),
        gateway_adapter::RecordingWake::new(),
    ));
    let svc = Arc::new(
        Awareness::builder(
            store.clone(),
            queue.clone(),
            wake.clone(),
            directory(&[MANAGER]),
        )
        .build(),
    );
    // A second target, after the worker in the manager's listing.
    let later = SessionRef::parse("agent:main:subagent:zz", "main").unwrap();
    let manager = WatcherKey::parse(MANAGER).unwrap();
    store
        .watch(&manager, &later, Timestamp::now())
        .await
        .expect("watch");
    store
        .record(human(&later), Timestamp::now())
        .await
        .expect("record");
    written_elsewhere(&*store, &[MANAGER]).await;

    let first = tokio::spawn({
        let svc = Arc::clone(&svc);
        async move { svc.pick_up().await }
    })
    .await
    .expect("the pick-up survives a panicking wake");
    assert_eq!(
        first,
        PickUp {
            queued: 1,
            complete: false
        },
        "the notice on the second target queued and counted"
    );
    assert_eq!(
        texts(&queue, MANAGER).len(),
        1,
        "the worker's line taken back with its wake, the second target's queued"
    );
    assert_eq!(wake.1.count(&k(MANAGER)), 1, "woken for the second target");
    // Warned of, with the session and the panic: the pick-up's only other sign is its
    // `complete`, which the task does not log (the warning could be dropped without a test
    // failing: review of stop 60).
    assert_eq!(
        capture.said(&[
            "delivering a notice panicked",
            "session_key=agent:main:main",
            "the heartbeat runner failed",
            "level=WARN"
        ]),
        1,
        "{:#?}",
        capture.lines()
    );

    assert_eq!(
        svc.pick_up().await,
        PickUp {
            queued: 1,
            complete: true
        }
    );
    assert_eq!(wake.1.count(&k(MANAGER)), 2, "woken by the next pick-up");
    assert_eq!(svc.drain_turn(&k(MANAGER)).await.len(), 2);
}

/// A queue that panics when a notice that wakes nobody (a nested subagent's) is queued leaves
/// the pick-up not complete, as a panicking wake does, so that the pick-up task tries again;
/// the next pick-up queues the line.
/// (What the mutation did: only a panic while delivering the notices that wake was counted,
/// and the pick-up said it was complete with the subagent's line missing; review of stop 69,
/// V707.)
#[tokio::test]
async fn a_queue_that_panics_for_a_quiet_notice_leaves_the_pick_up_incomplete() {
    struct PanicsOnce(std::sync::atomic::AtomicBool, InMemoryQueue);
    impl SystemEventQueue for PanicsOnce {
        fn enqueue(&self, session: &SessionKey, entry: gateway_adapter::QueuedEntry) -> bool {
            assert!(
                self.0.swap(true, std::sync::atomic::Ordering::SeqCst),
                "the host's queue failed"
            );
            self.1.enqueue(session, entry)
        }
        fn drain(&self, session: &SessionKey) -> Vec<gateway_adapter::QueuedEntry> {
            self.1.drain(session)
        }
        fn peek(&self, session: &SessionKey) -> Vec<gateway_adapter::QueuedEntry> {
            self.1.peek(session)
        }
        fn remove(&self, session: &SessionKey, entry: &gateway_adapter::QueuedEntry) -> bool {
            self.1.remove(session, entry)
        }
    }
    let store = Arc::new(MemoryStore::new());
    let queue = Arc::new(PanicsOnce(
        std::sync::atomic::AtomicBool::new(false),
        InMemoryQueue::new(),
    ));
    let svc = Awareness::builder(
        store.clone(),
        queue.clone(),
        Arc::new(RecordingWake::new()),
        directory(&[NESTED]),
    )
    .build();
    written_elsewhere(&*store, &[NESTED]).await;

    let first = svc.pick_up().await;
    assert!(
        !first.complete,
        "a line whose queueing panicked is no complete pick-up: {first:?}"
    );
    assert_eq!(first.queued, 0);
    assert_eq!(
        svc.pick_up().await,
        PickUp {
            queued: 1,
            complete: true
        }
    );
    assert_eq!(queue.1.peek(&k(NESTED)).len(), 1);
}

/// With `owned_watchers_only`, what this gateway's own recordings hand out reaches only the
/// watchers its directory knows; another gateway's watcher is left to that gateway's pick-up
/// (DESIGN.md section 9.1). By default a gateway delivers to every watcher. `Awareness::deliver`,
/// handed the notices of a write another path made, keeps the setting the same way (ignoring it
/// there passed every test, another gateway's watcher queued and woken here: review of stop 64,
/// SV04).
#[tokio::test]
async fn owned_watchers_only_leaves_another_gateways_watchers_out_of_delivery() {
    for owned_only in [false, true] {
        for through_deliver in [false, true] {
            let store = Arc::new(MemoryStore::new());
            let queue = Arc::new(InMemoryQueue::new());
            let wake = Arc::new(gateway_adapter::RecordingWake::new());
            let svc = Awareness::builder(
                store.clone(),
                queue.clone(),
                wake.clone(),
                directory(&[MANAGER, CHILD]),
            )
            .config(AwarenessConfig {
                owned_watchers_only: owned_only,
                ..AwarenessConfig::default()
            })
            .build();
            for w in [MANAGER, ELSEWHERE] {
                store
                    .watch(&WatcherKey::parse(w).unwrap(), &child(), Timestamp::now())
                    .await
                    .expect("watch");
            }
            if through_deliver {
                let recorded = store
                    .record(human(&child()), Timestamp::now())
                    .await
                    .expect("record");
                assert_eq!(recorded.notices.len(), 2);
                svc.deliver(&recorded.notices);
            } else {
                let mut msg = gateway_adapter::HumanMessage::new(k(CHILD));
                msg.channel = Some("telegram".into());
                svc.human_message(msg).await.expect("recorded");
            }
            let case = format!("owned only: {owned_only}, through deliver: {through_deliver}");
            assert_eq!(texts(&queue, MANAGER).len(), 1, "{case}");
            assert_eq!(
                texts(&queue, ELSEWHERE).len(),
                usize::from(!owned_only),
                "{case}"
            );
            assert_eq!(
                wake.count(&k(ELSEWHERE)),
                usize::from(!owned_only),
                "{case}"
            );
        }
    }
}

/// `owned_watchers_only` leaves out only what recordings hand out: an acknowledgement's
/// follow-up goes to the watcher acknowledging, whether or not the directory knows it yet.
#[tokio::test]
async fn an_acknowledgements_follow_up_reaches_its_watcher_with_owned_watchers_only() {
    let store = Arc::new(MemoryStore::new());
    let queue = Arc::new(InMemoryQueue::new());
    let svc = Awareness::builder(
        store.clone(),
        queue.clone(),
        Arc::new(gateway_adapter::RecordingWake::new()),
        directory(&[]),
    )
    .config(AwarenessConfig {
        owned_watchers_only: true,
        ..AwarenessConfig::default()
    })
    .build();
    written_elsewhere(&*store, &[MANAGER]).await;
    store
        .record(human(&child()), Timestamp::now())
        .await
        .expect("a second change while the notice is out");
    let follow = svc.acknowledge(&k(MANAGER), &[k(CHILD)]).await;
    assert_eq!(follow.len(), 1, "one follow-up for the second change");
    assert_eq!(
        queue.peek(&k(MANAGER)).len(),
        1,
        "queued for the watcher that acknowledged"
    );
}

/// A queue-only notice (an ambient cursor's, which only OpenClaw makes) is queued for the
/// watcher's next turn without waking it, as OpenClaw delivers it; another is woken as always.
#[tokio::test]
async fn a_queue_only_notice_is_queued_without_a_wake() {
    let store = Arc::new(MemoryStore::new());
    let (svc, queue, wake) = common::service_in(store, None, directory(&[MANAGER, ELSEWHERE]));
    let notice = |watcher: &str, queue_only: bool| awareness_core::Notice {
        watcher: WatcherKey::parse(watcher).unwrap(),
        target: k(CHILD),
        target_agent: child().agent_id,
        last_seen: awareness_core::Sequence(4),
        queue_only,
    };
    svc.deliver(&[notice(MANAGER, true), notice(ELSEWHERE, false)]);
    assert_eq!(texts(&queue, MANAGER).len(), 1, "queued");
    assert_eq!(texts(&queue, ELSEWHERE).len(), 1);
    assert_eq!(
        wake.all(),
        [k(ELSEWHERE)],
        "only the explicit watcher is woken"
    );
}

/// A store at `path` where MANAGER's and ELSEWHERE's cursors on CHILD are pending, MANAGER's
/// ambient as OpenClaw marks one (the file is written as OpenClaw writes it).
#[cfg(feature = "sqlite")]
async fn ambient_manager(path: &std::path::Path) -> Arc<store_sqlite::SqliteStore> {
    use sqlx::{ConnectOptions as _, Connection as _};
    let store = Arc::new(store_sqlite::SqliteStore::open(path).await.expect("open"));
    for w in [MANAGER, ELSEWHERE] {
        store
            .watch(&WatcherKey::parse(w).unwrap(), &child(), Timestamp::now())
            .await
            .expect("watched");
    }
    // A change recorded by another writer: pending for both, delivered to neither here.
    store
        .record(human(&child()), Timestamp::now())
        .await
        .expect("recorded");
    let mut raw = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .connect()
        .await
        .expect("a second connection");
    sqlx::query(
        "UPDATE session_watch_cursors SET provenance = 'ambient-group' \
         WHERE watcher_session_key = $1",
    )
    .bind(MANAGER)
    .execute(&mut raw)
    .await
    .expect("marked ambient, as OpenClaw does");
    raw.close().await.expect("closed");
    store
}

/// Bug: an ambient cursor's notice is queued without a wake (decision 0015); a watch that
/// then made the cursor explicit kept the notice pending, and every recording after it handed
/// out the same notice, whose line the queue already held: nothing woke the main session,
/// which takes no turn unless woken. The watch now wakes it when the line is queued; a watch
/// repeated on the cursor, explicit by then, wakes nobody, and neither does a watch of a
/// cursor whose line is not queued (nothing is queued by a watch: a turn may be acknowledging
/// it). An ambient cursor is OpenClaw's: the file is written as OpenClaw marks one.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_watch_that_makes_a_queued_ambient_notice_explicit_wakes_the_session() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = ambient_manager(&dir.path().join("state.sqlite")).await;
    let (svc, queue, wake) =
        common::service_in(store.clone(), None, directory(&[MANAGER, ELSEWHERE]));
    let cursor = store
        .cursor(&WatcherKey::parse(MANAGER).unwrap(), &k(CHILD))
        .await
        .unwrap()
        .expect("the manager's cursor");
    let notice = awareness_core::Notice::of(&cursor);
    assert!(notice.queue_only);
    svc.deliver(&[notice]);
    assert!(wake.all().is_empty(), "queued without a wake");
    let watch = async |watcher: &str| {
        svc.watch_after_send(&k(watcher), &k(CHILD), None, true)
            .await
            .watched
    };
    assert!(watch(MANAGER).await);
    assert_eq!(wake.all(), [k(MANAGER)], "woken by the watch");
    assert_eq!(texts(&queue, MANAGER).len(), 1, "the line, once");
    assert!(watch(MANAGER).await);
    assert_eq!(wake.all(), [k(MANAGER)], "a repeated watch wakes nobody");
    // The other watcher's notice was never queued here.
    assert!(watch(ELSEWHERE).await);
    assert!(texts(&queue, ELSEWHERE).is_empty());
    assert_eq!(wake.all(), [k(MANAGER)]);
}

/// A watch that makes an ambient cursor explicit wakes nobody when the notice's line is not
/// queued here (never delivered by this gateway, or drained by a turn that may be
/// acknowledging it): the watch queues nothing, and the session would wake to nothing to read.
/// The next pick-up queues the line and wakes the session, the cursor explicit now. (Waking
/// whether or not the line was queued passed every test: the one above has it queued.)
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_watch_that_makes_an_ambient_notice_not_queued_explicit_wakes_nobody() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = ambient_manager(&dir.path().join("state.sqlite")).await;
    let (svc, queue, wake) = common::service_in(store, None, directory(&[MANAGER]));
    let outcome = svc
        .watch_after_send(&k(MANAGER), &k(CHILD), None, true)
        .await;
    assert!(outcome.watched, "{outcome:?}");
    assert!(wake.all().is_empty(), "no line queued: nobody woken");
    assert!(texts(&queue, MANAGER).is_empty(), "a watch queues nothing");
    assert_eq!(svc.pick_up().await.queued, 1);
    assert_eq!(texts(&queue, MANAGER).len(), 1);
    assert_eq!(
        wake.all(),
        [k(MANAGER)],
        "woken by the pick-up, once: the cursor is explicit"
    );
}

/// Bug (review, stop 53): a spawn's seed keeps a pending cursor the spawner has on the child
/// and makes it explicit when it was ambient, as a watch does, but woke nobody: the line of an
/// ambient cursor was queued without a wake, every recording after the spawn hands out the same
/// notice, whose line the queue holds, and a pick-up skips a watcher whose lines are queued, so
/// the main session took no turn for the notice. The spawn now wakes it, once: a dedupe hit of
/// the same spawn and a re-spawn (the cursor explicit by then) wake nobody, and neither does
/// the spawn of a watcher whose explicit cursor's line is not queued here.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_spawn_that_makes_a_queued_ambient_notice_explicit_wakes_the_session() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = ambient_manager(&dir.path().join("state.sqlite")).await;
    let (svc, queue, wake) =
        common::service_in(store.clone(), None, directory(&[MANAGER, ELSEWHERE]));
    let manager = WatcherKey::parse(MANAGER).unwrap();
    let cursor = store
        .cursor(&manager, &k(CHILD))
        .await
        .unwrap()
        .expect("the manager's cursor");
    svc.deliver(&[awareness_core::Notice::of(&cursor)]);
    assert!(wake.all().is_empty(), "queued without a wake");
    let spawn = async |spawner: &str, run: &str| {
        svc.subagent_spawned(&k(CHILD), None, &k(spawner), run)
            .await
            .expect("recorded")
    };
    spawn(MANAGER, "run-1").await;
    assert_eq!(wake.all(), [k(MANAGER)], "woken by the spawn");
    let kept = store
        .cursor(&manager, &k(CHILD))
        .await
        .unwrap()
        .expect("the manager's cursor");
    assert_eq!(
        (kept.last_seen, kept.material),
        (cursor.last_seen, cursor.material)
    );
    assert!(
        !awareness_core::Notice::of(&kept).queue_only,
        "explicit now"
    );
    assert_eq!(texts(&queue, MANAGER).len(), 1, "the line, once");
    spawn(MANAGER, "run-2").await;
    assert_eq!(
        wake.all(),
        [k(MANAGER)],
        "a re-spawn, explicit by then, wakes nobody"
    );
    // Ambient again, so that only the dedupe hit's own rule keeps it from waking: it seeds
    // nothing (a spawn recorded, and woken for, before).
    assert!(
        store
            .make_ambient(&manager, &k(CHILD))
            .await
            .expect("make the cursor ambient"),
        "the manager's cursor"
    );
    spawn(MANAGER, "run-1").await;
    assert_eq!(wake.all(), [k(MANAGER)], "a dedupe hit wakes nobody");
    assert_eq!(wake.all(), [k(MANAGER)], "a spawn again wakes nobody");
    spawn(ELSEWHERE, "run-3").await;
    assert!(texts(&queue, ELSEWHERE).is_empty());
    assert_eq!(wake.all(), [k(MANAGER)]);
}

/// Bug (review, stop 53): a watch or a spawn that could not read whether the cursor was ambient
/// (a read that failed, or took half the store wait) counted it as explicit and woke nobody;
/// when it was ambient, its queued line then waited for good, as in the tests above. Not known
/// now counts as "may be": the watch wakes the session when the notice its cursor keeps is
/// queued, and the spawn reads the cursor again once it is recorded.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_watch_or_a_spawn_that_cannot_read_the_cursor_still_wakes_the_session() {
    for spawn in [false, true] {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Arc::new(Hooked {
            inner: ambient_manager(&dir.path().join("state.sqlite")).await,
            hook: RefuseNth::new(Call::Cursor, 0),
        });
        let cursor = store
            .inner
            .cursor(&WatcherKey::parse(MANAGER).unwrap(), &k(CHILD))
            .await
            .unwrap()
            .expect("the manager's cursor");
        let (svc, queue, wake) = common::service_in(store.clone(), None, directory(&[MANAGER]));
        svc.deliver(&[awareness_core::Notice::of(&cursor)]);
        assert!(wake.all().is_empty(), "queued without a wake");
        if spawn {
            svc.subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
                .await
                .expect("recorded");
        } else {
            let outcome = svc
                .watch_after_send(&k(MANAGER), &k(CHILD), None, true)
                .await;
            assert!(outcome.watched, "{outcome:?}");
        }
        assert!(
            store.hook.asked.load(std::sync::atomic::Ordering::SeqCst) > 0,
            "the read failed"
        );
        assert_eq!(wake.all(), [k(MANAGER)], "spawn: {spawn}");
        assert_eq!(texts(&queue, MANAGER).len(), 1);
    }
}

/// A watch that cannot read whether the cursor is ambient wakes the session only when the
/// cursor it leaves is pending: watching another agent's session of the key re-points the
/// ambient cursor there from that session's head, nothing to read, and the queued line, whose
/// text (the key, "changesSince 0") the re-pointed cursor's notice shares, would only be
/// dropped as stale by the turn. (What the mutation did: the pending check taken out of the
/// wake, the main session was woken for the line; review of stop 62, S27.)
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_watch_that_cannot_read_the_cursor_and_re_points_it_wakes_nobody() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(Hooked {
        inner: ambient_manager(&dir.path().join("state.sqlite")).await,
        hook: RefuseNth::new(Call::Cursor, 0),
    });
    let manager = WatcherKey::parse(MANAGER).unwrap();
    let cursor = async || {
        store
            .inner
            .cursor(&manager, &k(CHILD))
            .await
            .unwrap()
            .expect("the manager's cursor")
    };
    let ambient = cursor().await;
    let (svc, queue, wake) = common::service_in(store.clone(), None, directory(&[MANAGER]));
    svc.deliver(&[awareness_core::Notice::of(&ambient)]);
    assert!(wake.all().is_empty(), "queued without a wake");
    let ops = awareness_core::AgentId::new("ops").unwrap();
    let outcome = svc
        .watch_after_send(&k(MANAGER), &k(CHILD), Some(&ops), true)
        .await;
    assert!(outcome.watched, "{outcome:?}");
    assert!(
        store.hook.asked.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "the read failed"
    );
    let repointed = cursor().await;
    assert_eq!(repointed.target_agent, ops, "re-pointed at ops's session");
    assert!(!repointed.is_pending(), "{repointed:?}");
    assert_eq!(
        awareness_core::Notice::of(&repointed).text(),
        awareness_core::Notice::of(&ambient).text(),
        "the queued line's text"
    );
    assert!(wake.all().is_empty(), "nothing to read: nobody woken");
    assert_eq!(texts(&queue, MANAGER).len(), 1, "the line stays queued");
}

/// Bug: a watch the wait for the store gave up on (`store_wait`) may still commit, and the
/// wake it owed the ambient cursor's queued line was lost with its caller; asked again, the
/// watch found the cursor explicit already and woke nobody either, so the main session took
/// no turn for the notice. The watch and its wake now run to their end together.
/// A hook that holds the store's answer to `call`, once it is done, until the test gives the
/// gate a permit, telling `reached` when it holds one: the caller's future can then be
/// dropped after the store committed.
#[cfg(feature = "sqlite")]
struct HeldAfter {
    call: Call,
    gate: tokio::sync::Semaphore,
    reached: tokio::sync::Notify,
}

#[cfg(feature = "sqlite")]
impl HeldAfter {
    fn new(call: Call) -> Self {
        Self {
            call,
            gate: tokio::sync::Semaphore::new(0),
            reached: tokio::sync::Notify::new(),
        }
    }
}

#[cfg(feature = "sqlite")]
#[awareness_core::async_trait]
impl Hook for HeldAfter {
    async fn after(&self, call: Call, _store: &dyn AwarenessStore) {
        if call == self.call {
            self.reached.notify_one();
            self.gate.acquire().await.expect("the gate").forget();
        }
    }
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_given_up_on_that_commits_still_wakes_the_session() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(Hooked {
        inner: ambient_manager(&dir.path().join("state.sqlite")).await,
        hook: HeldAfter::new(Call::Watch),
    });
    let (svc, _queue, mut woken) = woken_service(
        store.clone(),
        directory(&[MANAGER]),
        AwarenessConfig {
            // The watch is held at the gate however long this is; the read of whether the
            // cursor is ambient, before it, gets half of it, which a loaded machine needs.
            store_wait: Duration::from_secs(4),
            ..AwarenessConfig::default()
        },
    );
    let cursor = store
        .inner
        .cursor(&WatcherKey::parse(MANAGER).unwrap(), &k(CHILD))
        .await
        .unwrap()
        .expect("the manager's cursor");
    svc.deliver(&[awareness_core::Notice::of(&cursor)]);
    assert!(woken.try_recv().is_err(), "queued without a wake");
    let watching = {
        let svc = Arc::clone(&svc);
        tokio::spawn(async move {
            svc.watch_after_send(&k(MANAGER), &k(CHILD), None, true)
                .await
        })
    };
    store.hook.reached.notified().await;
    let outcome = watching.await.expect("the watch's caller");
    assert!(!outcome.watched, "given up on: {outcome:?}");
    assert!(woken.try_recv().is_err(), "nobody woken yet");
    store.hook.gate.add_permits(1); // the store answers, late
    let got = tokio::time::timeout(Duration::from_secs(30), woken.recv())
        .await
        .expect("woken once the watch committed");
    assert_eq!(got, Some(k(MANAGER)));
}

/// Bug: a watch of an ambient cursor asks the host's queue whether the notice's line is there
/// (to wake the session for it); a queue that panicked there failed the watch after the store
/// had registered it, so the caller's turn ended in a panic. Now the watch is said as made,
/// the panic is logged, and nobody is woken: the line stays for the session's next turn.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_queue_that_panics_when_a_watch_looks_fails_nothing() {
    let capture = common::Capture::default();
    let _guard = capture.install();
    let dir = tempfile::tempdir().expect("temp dir");
    let store = ambient_manager(&dir.path().join("state.sqlite")).await;
    let queue = Arc::new(FaultyQueue::default());
    let (svc, wake) = common::service_with_queue(
        store.clone(),
        directory(&[MANAGER, ELSEWHERE]),
        AwarenessConfig::default(),
        Arc::clone(&queue),
    );
    let cursor = store
        .cursor(&WatcherKey::parse(MANAGER).unwrap(), &k(CHILD))
        .await
        .unwrap()
        .expect("the manager's cursor");
    svc.deliver(&[awareness_core::Notice::of(&cursor)]);
    *queue.panic_on_peek_of.lock().unwrap() = Some(k(MANAGER));
    let outcome = svc
        .watch_after_send(&k(MANAGER), &k(CHILD), None, true)
        .await;
    *queue.panic_on_peek_of.lock().unwrap() = None;
    assert!(outcome.watched, "the watch is made");
    assert!(wake.all().is_empty(), "nobody woken");
    assert_eq!(texts(&queue.inner, MANAGER).len(), 1, "the line stays");
    let explicit = store
        .cursor(&WatcherKey::parse(MANAGER).unwrap(), &k(CHILD))
        .await
        .unwrap()
        .expect("the manager's cursor");
    assert!(
        !awareness_core::Notice::of(&explicit).queue_only,
        "explicit now"
    );
    assert_eq!(
        capture.said(&[
            "looking for the watcher's queued notice",
            "the host's queue failed to show"
        ]),
        1,
        "logged once: {:?}",
        capture.lines()
    );
}

/// A watch repeated on an explicit cursor whose notice is queued wakes nobody: its session was
/// woken when the line was queued (one notice, one wake).
#[tokio::test]
async fn a_repeated_watch_of_a_pending_explicit_cursor_wakes_nobody() {
    let store = Arc::new(MemoryStore::new());
    let (svc, queue, wake) = common::service_in(store.clone(), None, directory(&[MANAGER]));
    let watch = async || {
        svc.watch_after_send(&k(MANAGER), &k(CHILD), None, true)
            .await
            .watched
    };
    assert!(watch().await);
    let mut msg = gateway_adapter::HumanMessage::new(k(CHILD));
    msg.agent_id = Some(child().agent_id);
    assert!(svc.human_message(msg).await.is_some(), "recorded");
    assert_eq!(texts(&queue, MANAGER).len(), 1);
    assert_eq!(wake.all(), [k(MANAGER)], "woken with the line");
    assert!(watch().await);
    assert_eq!(wake.all(), [k(MANAGER)], "not woken again");
}

/// Sends every wake to a channel, so that a test waits for one instead of for time.
struct WakeChannel(mpsc::UnboundedSender<SessionKey>);

impl HeartbeatWake for WakeChannel {
    fn wake(&self, session: &SessionKey, _reason: &str) {
        let _ = self.0.send(session.clone());
    }
}

/// A service over `store` for the sessions of `directory`, built with `config`, whose wakes
/// come out of the receiver it answers with its queue.
fn woken_service(
    store: Arc<dyn AwarenessStore>,
    directory: Arc<dyn SessionDirectory>,
    config: AwarenessConfig,
) -> (
    Arc<Awareness>,
    Arc<InMemoryQueue>,
    mpsc::UnboundedReceiver<SessionKey>,
) {
    let queue = Arc::new(InMemoryQueue::new());
    let (tx, woken) = mpsc::unbounded_channel();
    let svc = Awareness::builder(store, queue.clone(), Arc::new(WakeChannel(tx)), directory)
        .config(config)
        .build();
    (Arc::new(svc), queue, woken)
}

/// A notice lost from the queue (here drained by another component, without a turn) is
/// queued again and its session woken by the pick-up task within the recovery interval
/// (DESIGN.md section 9, item 7), with no other writer committing meanwhile: on a store that
/// tells of no other writer (store-memory) and on one whose answer stays the same. Not before
/// the interval: nothing changed that the task is told of.
#[tokio::test(start_paused = true)]
async fn a_notice_lost_from_the_queue_comes_back_within_the_recovery_interval() {
    const RECOVERY: Duration = Duration::from_secs(30);
    let memory: Arc<dyn AwarenessStore> = Arc::new(MemoryStore::new());
    let shared: Arc<dyn AwarenessStore> = shared_store();
    for store in [memory, shared] {
        let (svc, queue, mut woken) = woken_service(
            store,
            directory(&[MANAGER]),
            AwarenessConfig {
                recovery_interval: RECOVERY,
                ..AwarenessConfig::default()
            },
        );
        let pickup = svc.spawn_pickup();
        svc.subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
            .await
            .expect("spawned");
        svc.human_message(gateway_adapter::HumanMessage::new(k(CHILD)))
            .await
            .expect("recorded");
        assert_eq!(woken.recv().await, Some(k(MANAGER)), "delivered at once");
        let lost = queue.drain(&k(MANAGER));
        assert_eq!(lost.len(), 1);

        tokio::time::sleep(RECOVERY / 2).await;
        assert!(woken.try_recv().is_err(), "nothing new before the interval");
        assert!(queue.peek(&k(MANAGER)).is_empty());
        let again = tokio::time::timeout(RECOVERY, woken.recv())
            .await
            .expect("woken within the recovery interval");
        assert_eq!(again, Some(k(MANAGER)));
        assert_eq!(queue.peek(&k(MANAGER)), lost, "the same line again");
        assert!(!pickup.is_finished(), "the task goes on");
        pickup.abort();
        let _ = pickup.await;
    }
}

/// Two services in one process over one store handle, each owning its own sessions
/// (`owned_watchers_only`): the notice one's recording hands out to the other's watcher is
/// left to the other, whose pick-up task queues it and wakes the session within the recovery
/// interval, although the store's answer never tells it another writer committed (one
/// handle; store-memory answers none at all). The task used to end on such a store, and the
/// notice waited for a turn the session took for another reason.
#[tokio::test(start_paused = true)]
async fn a_notice_another_service_over_the_same_store_hands_out_is_picked_up() {
    const RECOVERY: Duration = Duration::from_secs(30);
    let owned_only = AwarenessConfig {
        owned_watchers_only: true,
        recovery_interval: RECOVERY,
        ..AwarenessConfig::default()
    };
    let store = Arc::new(MemoryStore::new());
    let (theirs, _their_queue, their_wake) =
        common::service_configured(store.clone(), None, directory(&[CHILD]), owned_only.clone());
    let (ours, queue, mut woken) = woken_service(store, directory(&[MANAGER]), owned_only);
    let pickup = ours.spawn_pickup();
    tokio::time::sleep(Duration::from_secs(2)).await; // past the task's first question
    theirs
        .subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
        .await
        .expect("spawned");
    theirs
        .human_message(gateway_adapter::HumanMessage::new(k(CHILD)))
        .await
        .expect("recorded");
    assert!(their_wake.all().is_empty(), "not theirs to wake");
    let got = tokio::time::timeout(RECOVERY, woken.recv())
        .await
        .expect("woken within the recovery interval");
    assert_eq!(got, Some(k(MANAGER)));
    let lines = texts(&queue, MANAGER);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(CHILD), "{}", lines[0]);
    pickup.abort();
    let _ = pickup.await;
}

/// A store whose first question hangs (a handle's own write waiting for another process's
/// lock, a disk that stopped), after another writer handed MANAGER a notice.
struct HangsOnce(std::sync::atomic::AtomicBool);

#[awareness_core::async_trait]
impl Hook for HangsOnce {
    async fn before(&self, call: Call, _store: &dyn AwarenessStore) {
        if call == Call::ForeignCommits && !self.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
    fn foreign_commits(&self) -> Option<u64> {
        Some(1)
    }
}

/// Runs the pick-up task with `store_wait` over a store whose first question hangs, after
/// another writer handed MANAGER a notice; answers when MANAGER was woken, from the start.
async fn woken_after_a_question_that_hangs(store_wait: Duration) -> Duration {
    let store = Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: HangsOnce(std::sync::atomic::AtomicBool::new(false)),
    });
    written_elsewhere(&*store.inner, &[MANAGER]).await;
    let (svc, _queue, mut woken) = woken_service(
        store,
        directory(&[MANAGER]),
        AwarenessConfig {
            store_wait,
            ..AwarenessConfig::default()
        },
    );
    let start = tokio::time::Instant::now();
    let pickup = svc.spawn_pickup();
    let got = tokio::time::timeout(Duration::from_secs(10), woken.recv())
        .await
        .expect("woken");
    assert_eq!(got, Some(k(MANAGER)));
    let took = start.elapsed();
    pickup.abort();
    let _ = pickup.await;
    took
}

/// A question the store does not answer within `QUESTION_PATIENCE` is not waited for: the
/// task picks up as if another writer had committed, so that a notice another process handed
/// out is delivered while this handle's own write waits for that process's lock. Bug (review
/// of hints, stop 59): the question waited behind the handle's own write (up to SQLite's
/// `busy_timeout`, 5 s, or for a PostgreSQL gateway stopped mid-write), then failed at
/// `store_wait` and picked up nothing. Not answered, it is no failure: nothing is warned of.
#[tokio::test(start_paused = true)]
async fn a_question_the_store_does_not_answer_in_time_picks_up() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let took = woken_after_a_question_that_hangs(Duration::from_secs(2)).await;
    // 500 ms, as decision 0014 says: compared with the constant itself, a patience three
    // times as long passed (review of stop 60).
    assert_eq!(
        took,
        Duration::from_millis(500),
        "woken at the patience's end"
    );
    assert_eq!(gateway_adapter::QUESTION_PATIENCE, took);
    assert_eq!(
        capture.said(&["cannot ask the store whether another writer committed"]),
        0,
        "{:?}",
        capture.lines()
    );
}

/// With a `store_wait` shorter than `QUESTION_PATIENCE`, a question the store does not answer
/// is given up at `store_wait`, and picked up at as one not answered in time. (Given up as a
/// failure, it picked up nothing, and a store that kept hanging was never picked up from,
/// recovery interval included: the second reading, stop 59.)
#[tokio::test(start_paused = true)]
async fn a_store_wait_shorter_than_the_patience_bounds_the_question() {
    let took = woken_after_a_question_that_hangs(Duration::from_millis(200)).await;
    assert_eq!(took, Duration::from_millis(200), "woken at store_wait");
}

/// A store answering each question in `delay`, with nothing new: how many times the pick-up
/// task read the pending cursors in 59 s (no recovery interval within it).
async fn cursor_reads_of_a_store_answering_in(delay: Duration) -> usize {
    struct Slow {
        delay: Duration,
        reads: std::sync::atomic::AtomicUsize,
    }
    #[awareness_core::async_trait]
    impl Hook for Slow {
        async fn before(&self, call: Call, _store: &dyn AwarenessStore) {
            match call {
                Call::ForeignCommits => tokio::time::sleep(self.delay).await,
                Call::Cursors | Call::Cursor => {
                    self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                _ => {}
            }
        }
        fn foreign_commits(&self) -> Option<u64> {
            Some(1)
        }
    }
    let store = Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: Slow {
            delay,
            reads: std::sync::atomic::AtomicUsize::new(0),
        },
    });
    written_elsewhere(&*store.inner, &[MANAGER]).await;
    let (svc, _queue, _woken) = woken_service(
        store.clone(),
        directory(&[MANAGER]),
        AwarenessConfig::default(),
    );
    let pickup = svc.spawn_pickup();
    tokio::time::sleep(Duration::from_secs(59)).await;
    pickup.abort();
    let _ = pickup.await;
    store.hook.reads.load(std::sync::atomic::Ordering::SeqCst)
}

/// A store merely slower than `QUESTION_PATIENCE` (every question takes 550 ms, nothing new) is
/// read from no more often than one that answers in 450 ms: the first answer not known is
/// picked up, the ones after it are not. Bug (second reading, stop 59): every question over
/// the patience made a whole pick-up, 60 reads of the cursors in 59 s against 2.
#[tokio::test(start_paused = true)]
async fn a_store_slower_than_the_patience_is_not_picked_up_from_at_every_question() {
    let quick = cursor_reads_of_a_store_answering_in(Duration::from_millis(450)).await;
    let slow = cursor_reads_of_a_store_answering_in(Duration::from_millis(550)).await;
    assert!(quick > 0, "the first question picks up");
    assert_eq!(
        slow, quick,
        "reads with questions over the patience and under it"
    );
}

/// A store whose every question fails is still picked up from at the recovery interval: a
/// notice another writer handed out reaches its watcher within it. Bug (second reading, stop
/// 59): a failed question ended the task's turn before the recovery interval was looked at,
/// so nothing was picked up for as long as questions failed.
#[tokio::test(start_paused = true)]
async fn the_recovery_interval_is_kept_while_every_question_fails() {
    struct Fails;
    #[awareness_core::async_trait]
    impl Hook for Fails {
        fn refuse(&self, call: Call) -> Option<awareness_core::StoreError> {
            (call == Call::ForeignCommits)
                .then(|| awareness_core::StoreError::backend("ask", "the question fails"))
        }
    }
    let store = Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: Fails,
    });
    written_elsewhere(&*store.inner, &[MANAGER]).await;
    let recovery = Duration::from_secs(5);
    let (svc, _queue, mut woken) = woken_service(
        store,
        directory(&[MANAGER]),
        AwarenessConfig {
            recovery_interval: recovery,
            ..AwarenessConfig::default()
        },
    );
    let start = tokio::time::Instant::now();
    let pickup = svc.spawn_pickup();
    let got = tokio::time::timeout(Duration::from_mins(1), woken.recv())
        .await
        .expect("woken");
    assert_eq!(got, Some(k(MANAGER)));
    assert!(
        start.elapsed() <= recovery,
        "woken at {:?}",
        start.elapsed()
    );
    pickup.abort();
    let _ = pickup.await;
}

/// Two handles on one store, as two gateway processes have: the one this gateway uses
/// and another writer's. The other writer watches the child for the manager, which this
/// gateway owns, and records on it; the pick-up task, asking every 10 ms, wakes the manager
/// with the notice queued, and the manager's turn acknowledges it in the shared store. A later
/// notice of the other writer wakes the manager again. Run on the backends where two handles
/// on one store are two writers.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
async fn a_notice_another_writer_hands_out_wakes_this_gateways_watcher(
    ours: Arc<dyn AwarenessStore>,
    theirs: Arc<dyn AwarenessStore>,
) {
    a_notice_another_writer_hands_out_wakes_this_gateways_watcher_with(
        ours,
        theirs,
        AwarenessConfig {
            pickup_interval: Duration::from_millis(10),
            ..AwarenessConfig::default()
        },
        async {},
    )
    .await;
}

/// [`a_notice_another_writer_hands_out_wakes_this_gateways_watcher`] under `config`, the
/// other writer starting once `ready` (awaited after the pick-up task is spawned) is.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
async fn a_notice_another_writer_hands_out_wakes_this_gateways_watcher_with(
    ours: Arc<dyn AwarenessStore>,
    theirs: Arc<dyn AwarenessStore>,
    config: AwarenessConfig,
    ready: impl std::future::Future<Output = ()>,
) {
    let (svc, queue, mut woken) = woken_service(ours, directory(&[MANAGER]), config);
    let pickup = svc.spawn_pickup();
    ready.await;
    let next_wake = async |woken: &mut mpsc::UnboundedReceiver<SessionKey>| {
        tokio::time::timeout(Duration::from_mins(1), woken.recv())
            .await
            .expect("a wake comes")
            .expect("the wake channel is open")
    };

    written_elsewhere(&*theirs, &[MANAGER]).await;
    assert_eq!(next_wake(&mut woken).await, k(MANAGER));
    let lines = texts(&queue, MANAGER);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(CHILD), "{}", lines[0]);

    let read = svc.drain_turn(&k(MANAGER)).await;
    assert_eq!(read.len(), 1);
    let cursor = theirs
        .cursor(&WatcherKey::parse(MANAGER).unwrap(), &k(CHILD))
        .await
        .expect("cursor")
        .expect("the cursor the other writer made");
    assert_eq!(
        cursor.last_seen, cursor.notified,
        "the other writer sees the notice acknowledged"
    );

    // A second notice by the other writer, after the acknowledgement: woken again.
    theirs
        .record(human(&child()), Timestamp::now())
        .await
        .expect("record");
    assert_eq!(next_wake(&mut woken).await, k(MANAGER));
    assert_eq!(texts(&queue, MANAGER).len(), 1);
    assert_eq!(svc.pick_up().await.queued, 0, "the line is queued already");

    pickup.abort();
    let _ = pickup.await;
}

/// [`a_notice_another_writer_hands_out_wakes_this_gateways_watcher`] on two handles on one
/// SQLite file.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_another_writer_on_one_sqlite_file_hands_out_wakes_this_gateways_watcher() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.sqlite");
    let open = async || Arc::new(store_sqlite::SqliteStore::open(&path).await.expect("open"));
    let (ours, theirs) = (open().await, open().await);
    a_notice_another_writer_hands_out_wakes_this_gateways_watcher(ours, theirs).await;
}

/// [`a_notice_another_writer_hands_out_wakes_this_gateways_watcher`] on two handles on one
/// SQLite file whose pick-up asks only once an hour (and picks up everything never): each
/// notice of the other writer is picked up at the store's hint of its commit (`PRAGMA
/// data_version` polled), the second right after the acknowledgement of the first.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_writers_notice_is_picked_up_at_the_hint_of_its_commit_on_sqlite() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.sqlite");
    let open = async || Arc::new(store_sqlite::SqliteStore::open(&path).await.expect("open"));
    let (ours, theirs) = (open().await, open().await);
    let polling = Arc::clone(&ours);
    picked_up_at_hints_alone(ours, theirs, async move {
        let started = tokio::time::timeout(Duration::from_secs(30), async {
            while !polling.poll_commits_now().await {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        started
            .await
            .expect("the pick-up task asked the store for hints, and the store polls");
    })
    .await;
}

/// [`a_notice_another_writer_hands_out_wakes_this_gateways_watcher_with`] a pick-up that asks
/// only once an hour and never picks up everything, so that only the store's hints deliver;
/// `ready` ends once the store watches for other writers' commits.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
async fn picked_up_at_hints_alone(
    ours: Arc<dyn AwarenessStore>,
    theirs: Arc<dyn AwarenessStore>,
    ready: impl std::future::Future<Output = ()>,
) {
    let config = AwarenessConfig {
        pickup_interval: Duration::from_hours(1),
        recovery_interval: Duration::MAX,
        ..AwarenessConfig::default()
    };
    a_notice_another_writer_hands_out_wakes_this_gateways_watcher_with(ours, theirs, config, ready)
        .await;
}

/// Two handles on the store in `schema`, as two gateways on two hosts have.
#[cfg(feature = "postgres")]
async fn two_gateways_on(
    schema: &store_postgres::testkit::Schema,
) -> (Arc<store_postgres::PgStore>, Arc<store_postgres::PgStore>) {
    let open = async || {
        Arc::new(
            store_postgres::PgStore::connect_url(&schema.url())
                .await
                .expect("connect"),
        )
    };
    (open().await, open().await)
}

/// [`a_notice_another_writer_hands_out_wakes_this_gateways_watcher`] on two handles on one
/// PostgreSQL schema, as gateways on two hosts have (DESIGN.md section 9.1).
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_another_gateway_on_one_postgres_schema_hands_out_wakes_this_gateways_watcher() {
    let schema = store_postgres::testkit::Schema::fresh("ga");
    let (ours, theirs) = two_gateways_on(&schema).await;
    a_notice_another_writer_hands_out_wakes_this_gateways_watcher(ours, theirs).await;
}

/// [`a_notice_another_writer_hands_out_wakes_this_gateways_watcher`] on two handles on one
/// PostgreSQL schema whose pick-up asks only once an hour (and picks up everything never):
/// each notice of the other gateway is picked up at the store's hint of its commit
/// (`LISTEN`/`NOTIFY`), the second right after the acknowledgement of the first.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_gateways_notice_is_picked_up_at_the_hint_of_its_commit_on_postgres() {
    let schema = store_postgres::testkit::Schema::fresh("ga");
    let (ours, theirs) = two_gateways_on(&schema).await;
    let listening = Arc::clone(&ours);
    picked_up_at_hints_alone(ours, theirs, async move {
        tokio::time::timeout(Duration::from_secs(30), listening.hints_listening())
            .await
            .expect("the pick-up task asked the store for hints, and the store listens");
    })
    .await;
}

/// Another writer hands MANAGER a notice; right after, `take_lock` takes the store's write lock
/// from outside (a third process), and this gateway's own recording waits for it: MANAGER is
/// woken while that recording still waits, then the lock is let go and the recording commits.
/// Bug (review of hints, stop 59): the pick-up's question waited behind the recording (store-
/// sqlite's write connection, store-postgres's turn), so the notice waited for the lock too:
/// up to SQLite's `busy_timeout`, or for as long as a PostgreSQL gateway stopped mid-write
/// holds it.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
async fn woken_while_our_own_write_waits_for_a_lock(
    ours: Arc<dyn AwarenessStore>,
    theirs: Arc<dyn AwarenessStore>,
    take_lock: impl std::future::Future<Output = awareness_core::testkit::model::Release>,
) {
    let (svc, _queue, mut woken) = woken_service(
        ours.clone(),
        directory(&[MANAGER]),
        AwarenessConfig::default(),
    );
    let pickup = svc.spawn_pickup();
    written_elsewhere(&*theirs, &[MANAGER]).await;
    let held = take_lock.await;
    let writer = Arc::clone(&ours);
    let own = tokio::spawn(async move {
        let solo = SessionRef::parse("agent:main:solo", "main").unwrap();
        writer.record(human(&solo), Timestamp::now()).await
    });
    let got = tokio::time::timeout(Duration::from_mins(1), woken.recv())
        .await
        .expect("woken");
    assert_eq!(got, Some(k(MANAGER)));
    assert!(
        !own.is_finished(),
        "woken while this gateway's own recording still waits for the lock: {:?}",
        own.await
    );
    held.release().await;
    own.await
        .expect("join")
        .expect("recorded once the lock is let go");
    pickup.abort();
    let _ = pickup.await;
}

/// [`woken_while_our_own_write_waits_for_a_lock`] on one SQLite file, a third connection
/// holding the write lock (`BEGIN IMMEDIATE`) while this handle's recording waits in SQLite's
/// `busy_timeout` (5 s). This handle polls for hints only when asked, so that the pick-up's
/// questions (every second) are what find the other writer's commit.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_is_picked_up_while_our_own_write_waits_for_sqlites_lock() {
    use sqlx::{ConnectOptions as _, Connection as _};
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.sqlite");
    let options = store_sqlite::SqliteOptions::new().commit_hint_interval(Duration::MAX);
    let ours = Arc::new(
        store_sqlite::SqliteStore::open_with(&path, options)
            .await
            .expect("open"),
    );
    let theirs = Arc::new(store_sqlite::SqliteStore::open(&path).await.expect("open"));
    let lock = async {
        let mut third = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .connect()
            .await
            .expect("a third connection");
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut third)
            .await
            .expect("the write lock");
        awareness_core::testkit::model::Release::new(async move {
            sqlx::raw_sql("COMMIT")
                .execute(&mut third)
                .await
                .expect("let go");
            third.close().await.expect("closed");
        })
    };
    woken_while_our_own_write_waits_for_a_lock(ours, theirs, lock).await;
}

/// [`woken_while_our_own_write_waits_for_a_lock`] on one PostgreSQL schema, the store's lock
/// held by a third session (a gateway stopped mid-write) while this handle's recording waits
/// for it in the handle's turn.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_is_picked_up_while_our_own_write_waits_for_the_postgres_stores_lock() {
    let schema = store_postgres::testkit::Schema::fresh("ga");
    let (ours, theirs) = two_gateways_on(&schema).await;
    let lock = async {
        let held = store_postgres::testkit::StoreLock::take(schema.name()).await;
        awareness_core::testkit::model::Release::new(held.release())
    };
    woken_while_our_own_write_waits_for_a_lock(ours, theirs, lock).await;
}

/// A memory store played as one that other processes share: its answer to
/// `foreign_commits` is `answer`, which the test moves to play another writer's commit.
struct Shared {
    answer: std::sync::atomic::AtomicU64,
}

#[awareness_core::async_trait]
impl Hook for Shared {
    fn foreign_commits(&self) -> Option<u64> {
        Some(self.answer.load(std::sync::atomic::Ordering::SeqCst))
    }
}

fn shared_store() -> Arc<Hooked<Shared>> {
    Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: Shared {
            answer: std::sync::atomic::AtomicU64::new(1),
        },
    })
}

/// A store that panics in a pick-up (here the first time the pick-up reads the pending
/// cursors) does not end the pick-up task: the panic fails that read, logged with it, and the
/// notice is picked up at a later question, with no other commit since. (The gateway's session
/// directory, which this test made panic until stop 56, no longer fails a pick-up: it leaves
/// out the one watcher it panicked for. Until stop 57 the store's panic unwound out of the
/// read, and the pick-up task caught it as a pick-up that panicked.)
#[tokio::test(start_paused = true)]
async fn the_pickup_task_outlives_a_pick_up_that_panics() {
    struct PanicsFirst(std::sync::atomic::AtomicBool);
    #[awareness_core::async_trait]
    impl Hook for PanicsFirst {
        fn foreign_commits(&self) -> Option<u64> {
            Some(1)
        }
        async fn before(&self, call: Call, _store: &dyn AwarenessStore) {
            if call == Call::Cursors {
                assert!(
                    self.0.swap(true, std::sync::atomic::Ordering::SeqCst),
                    "the store failed"
                );
            }
        }
    }
    let store = Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: PanicsFirst(std::sync::atomic::AtomicBool::new(false)),
    });
    picked_up_after_a_panic(
        store,
        directory(&[MANAGER]),
        &[
            "cannot read the pending cursors to pick up notices",
            "the store panicked: the store failed",
        ],
    )
    .await;
}

/// Bug (review, stop 53): a store whose answer to the pick-up task's question panicked ended
/// the task, so no notice another process handed out was picked up again, and no notice lost
/// from a queue came back. The panic now fails that question, logged once, and the next
/// interval asks again.
#[tokio::test(start_paused = true)]
async fn the_pickup_task_outlives_a_question_that_panics() {
    struct PanicsFirst(std::sync::atomic::AtomicBool);
    #[awareness_core::async_trait]
    impl Hook for PanicsFirst {
        fn foreign_commits(&self) -> Option<u64> {
            assert!(
                self.0.swap(true, std::sync::atomic::Ordering::SeqCst),
                "the store failed"
            );
            Some(1)
        }
    }
    let store = Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: PanicsFirst(std::sync::atomic::AtomicBool::new(false)),
    });
    let said = [
        "cannot ask the store whether another writer committed",
        "the store panicked: the store failed",
    ];
    picked_up_after_a_panic(store, directory(&[MANAGER]), &said).await;
}

/// Questions that fail in a row are warned of once, at the first failure: the ones after it,
/// while the store keeps failing, go to `debug!`, so that a store down for hours does not write
/// a warning at every pick-up interval; a question that fails again after the store has
/// answered one is warned of again. (What the mutations did: the run of failures was never
/// marked, and every failed question warned, review of stop 69, V749; an answer did not end
/// the run, and the next failure, hours later perhaps, went to `debug!` only, review of stop
/// 66, SV542.)
#[tokio::test(start_paused = true)]
async fn questions_failing_in_a_row_are_warned_of_once_and_again_after_an_answer() {
    /// Fails the first three questions and the fifth.
    struct FailsInTwoRuns(std::sync::atomic::AtomicUsize);
    impl Hook for FailsInTwoRuns {
        fn refuse(&self, call: Call) -> Option<awareness_core::StoreError> {
            if call != Call::ForeignCommits {
                return None;
            }
            let n = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            (n <= 3 || n == 5).then(|| {
                awareness_core::StoreError::backend(
                    "ask whether another writer committed",
                    std::io::Error::other("disk I/O error"),
                )
            })
        }
    }
    let capture = common::Capture::default();
    let _logs = capture.install();
    let store = Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: FailsInTwoRuns(std::sync::atomic::AtomicUsize::new(0)),
    });
    let asked = || store.hook.0.load(std::sync::atomic::Ordering::SeqCst);
    let (svc, _queue, _woken) = woken_service(
        store.clone(),
        directory(&[MANAGER]),
        AwarenessConfig::default(),
    );
    let pickup = svc.spawn_pickup();
    // A question at every pick-up interval (1 s): bounded, so that a task that stopped asking
    // fails the test instead of hanging it.
    for _ in 0..600 {
        if asked() >= 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pickup.abort();
    let _ = pickup.await;
    assert!(asked() >= 6, "six questions asked");
    let warned = capture
        .lines()
        .iter()
        .filter(|l| {
            l.starts_with("message=cannot ask the store whether another writer committed")
                && l.contains("level=WARN")
        })
        .count();
    assert_eq!(
        warned,
        2,
        "three failures in a row, an answer, a failure: two warnings: {:?}",
        capture.lines()
    );
}

/// Runs the pick-up task over `store` (a memory store) and `directory`, in which a port
/// panics once, after another writer handed MANAGER a notice: the notice is picked up and
/// MANAGER woken while the task lives, and one log line says all of `said`.
async fn picked_up_after_a_panic<H: Hook + 'static>(
    store: Arc<Hooked<H>>,
    directory: Arc<dyn SessionDirectory>,
    said: &[&str],
) {
    let capture = common::Capture::default();
    let _logs = capture.install();
    written_elsewhere(&*store.inner, &[MANAGER]).await;
    let (svc, queue, mut woken) = woken_service(store, directory, AwarenessConfig::default());
    let pickup = svc.spawn_pickup();
    let first = tokio::time::timeout(Duration::from_mins(10), woken.recv())
        .await
        .expect("woken while the task lives");
    assert_eq!(first, Some(k(MANAGER)));
    assert_eq!(texts(&queue, MANAGER).len(), 1);
    assert!(!pickup.is_finished());
    assert_eq!(capture.said(said), 1, "{:?}", capture.lines());
    pickup.abort();
    let _ = pickup.await;
}

/// Bug (review, stop 53): a pruning pass that panicked (a store that panics) ended the pruning
/// task, and nothing was pruned again: the log grew without bound. The pass is now logged and
/// counted as a failed one, and the next interval prunes.
#[tokio::test(start_paused = true)]
async fn the_pruning_task_outlives_a_pass_that_panics() {
    struct PanicsFirst(std::sync::atomic::AtomicBool);
    #[awareness_core::async_trait]
    impl Hook for PanicsFirst {
        async fn before(&self, call: Call, _store: &dyn AwarenessStore) {
            if call == Call::PruneChunk {
                assert!(
                    self.0.swap(true, std::sync::atomic::Ordering::SeqCst),
                    "the store failed"
                );
            }
        }
    }
    let capture = common::Capture::default();
    let _logs = capture.install();
    let store = Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: PanicsFirst(std::sync::atomic::AtomicBool::new(false)),
    });
    let (svc, _queue, _woken) =
        woken_service(store, directory(&[MANAGER]), AwarenessConfig::default());
    let mut passes = svc.subscribe_pruning();
    let pruning = svc.spawn_pruning();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        tokio::time::timeout(Duration::from_hours(3), passes.changed())
            .await
            .expect("a pass while the task lives")
            .expect("the service lives");
        let pass = *passes.borrow_and_update();
        seen.push((pass.passes, pass.failed));
    }
    assert_eq!(seen, [(1, true), (2, false)], "the panic, then a pass");
    assert!(!pruning.is_finished());
    assert!(
        capture.said(&["a pruning pass panicked", "the store failed"]) > 0,
        "{:?}",
        capture.lines()
    );
    pruning.abort();
    let _ = pruning.await;
}

/// A gateway that sees another writer commit to its store while `owned_watchers_only` is off
/// says so once: its recordings then fill queues of the other writer's watchers that nobody
/// here drains. With it on, or with no other writer, nothing is said.
#[tokio::test(start_paused = true)]
async fn another_writer_seen_with_owned_watchers_only_off_is_said_once() {
    for owned_only in [false, true] {
        let capture = common::Capture::default();
        let _logs = capture.install();
        let store = shared_store();
        let svc = Arc::new(
            Awareness::builder(
                store.clone(),
                Arc::new(InMemoryQueue::new()),
                Arc::new(gateway_adapter::RecordingWake::new()),
                directory(&[MANAGER]),
            )
            .config(AwarenessConfig {
                owned_watchers_only: owned_only,
                ..AwarenessConfig::default()
            })
            .build(),
        );
        let pickup = svc.spawn_pickup();
        let said = || capture.said(&["owned_watchers_only is off"]);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(said(), 0, "no other writer yet");
        for answer in 2..5 {
            store
                .hook
                .answer
                .store(answer, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        assert_eq!(
            said(),
            usize::from(!owned_only),
            "owned_watchers_only {owned_only}"
        );
        pickup.abort();
        let _ = pickup.await;
    }
}

/// Bug: a host queue that panicked when asked what it held for one watcher ended the whole
/// pick-up, and every retry the same way: the other watchers' notices from another writer were
/// never queued, and their sessions never woken. Now only that watcher's look is lost (its
/// notices are delivered as if none were queued), and the pick-up is not complete.
#[tokio::test]
async fn a_queue_that_panics_for_one_watcher_costs_the_others_nothing() {
    let store = Arc::new(MemoryStore::new());
    let queue = Arc::new(FaultyQueue::default());
    let (svc, wake) = common::service_with_queue(
        store.clone(),
        directory(&[MANAGER, NESTED]),
        AwarenessConfig::default(),
        Arc::clone(&queue),
    );
    written_elsewhere(&*store, &[MANAGER, NESTED]).await;
    // MANAGER sorts first: the watcher listed first fails.
    *queue.panic_on_peek_of.lock().unwrap() = Some(k(MANAGER));
    assert_eq!(
        svc.pick_up().await,
        PickUp {
            queued: 2,
            complete: false
        }
    );
    *queue.panic_on_peek_of.lock().unwrap() = None;
    for w in [MANAGER, NESTED] {
        assert_eq!(texts(&queue.inner, w).len(), 1, "{w}'s notice is queued");
    }
    assert_eq!(wake.count(&k(MANAGER)), 1, "the main session is woken");
}

/// A hook that refuses one call of a kind, the `nth` (from 0) the store is asked (a store
/// failing once).
struct RefuseNth {
    call: Call,
    nth: usize,
    asked: std::sync::atomic::AtomicUsize,
}

impl RefuseNth {
    /// Refuses the `nth` call of kind `call` (from 0).
    fn new(call: Call, nth: usize) -> Self {
        Self {
            call,
            nth,
            asked: std::sync::atomic::AtomicUsize::default(),
        }
    }
}

#[awareness_core::async_trait]
impl Hook for RefuseNth {
    fn refuse(&self, call: Call) -> Option<awareness_core::StoreError> {
        use std::sync::atomic::Ordering;
        (call == self.call && self.asked.fetch_add(1, Ordering::SeqCst) == self.nth).then(|| {
            awareness_core::StoreError::backend(
                "read cursors",
                std::io::Error::other("the store failed once"),
            )
        })
    }
}

/// A pick-up that cannot read one watcher's cursors still delivers the others' notices, and
/// says it is not complete, so that the task makes it again (decision 0014): said complete, as
/// it was with that failure left uncounted and every test passing, the task took the notice as
/// delivered and never looked for it again until the recovery interval.
#[tokio::test]
async fn a_pick_up_that_cannot_read_one_watchers_cursors_is_not_complete() {
    let inner = Arc::new(MemoryStore::new());
    // The listing of every pending cursor is the first read; MANAGER's own, the second.
    let store = Arc::new(Hooked {
        inner: inner.clone(),
        hook: RefuseNth::new(Call::Cursors, 1),
    });
    let (svc, queue, wake) = common::service_in(store, None, directory(&[MANAGER, NESTED]));
    written_elsewhere(&*inner, &[MANAGER, NESTED]).await;
    assert_eq!(
        svc.pick_up().await,
        PickUp {
            queued: 1,
            complete: false
        },
        "the nested session's notice queued, the manager's read failed"
    );
    assert!(texts(&queue, MANAGER).is_empty());
    assert_eq!(texts(&queue, NESTED).len(), 1);
    assert!(wake.all().is_empty(), "nobody woken yet");
    assert_eq!(
        svc.pick_up().await,
        PickUp {
            queued: 1,
            complete: true
        },
        "made again, the manager's notice is delivered"
    );
    assert_eq!(texts(&queue, MANAGER).len(), 1);
    assert_eq!(wake.all(), [k(MANAGER)]);
}

/// A notice lost from its queue comes back within the recovery interval even when that is
/// shorter than the pick-up interval: the task asks at the shorter of the two. It came back only
/// at the pick-up interval, ten minutes here (review, stop 55).
#[tokio::test(start_paused = true)]
async fn a_recovery_interval_shorter_than_the_pickup_interval_is_kept() {
    const RECOVERY: Duration = Duration::from_secs(30);
    let store = Arc::new(MemoryStore::new());
    let queue = Arc::new(InMemoryQueue::new());
    let (svc, _wake) = common::service_with_queue(
        store.clone(),
        directory(&[MANAGER]),
        AwarenessConfig {
            recovery_interval: RECOVERY,
            pickup_interval: Duration::from_mins(10),
            ..AwarenessConfig::default()
        },
        Arc::clone(&queue),
    );
    let pickup = svc.spawn_pickup();
    tokio::time::sleep(Duration::from_secs(1)).await;
    written_elsewhere(&*store, &[MANAGER]).await;
    tokio::time::sleep(RECOVERY * 2).await;
    let lost = queue.drain(&k(MANAGER));
    assert_eq!(lost.len(), 1, "picked up once");
    tokio::time::sleep(RECOVERY * 2).await;
    assert_eq!(
        queue.peek(&k(MANAGER)),
        lost,
        "back within two recovery intervals"
    );
    pickup.abort();
    let _ = pickup.await;
}

/// The recovery pick-up is made at the question the recovery interval ends at, not at the one
/// a period before it (`>=` for `>` passed every other test, which look only half an interval
/// in or give a whole period of slack). The clock is tokio's paused one.
#[tokio::test(start_paused = true)]
async fn the_recovery_pick_up_comes_at_its_interval_not_a_period_before() {
    const PERIOD: Duration = Duration::from_secs(1);
    const RECOVERY: Duration = Duration::from_secs(10);
    let store = Arc::new(MemoryStore::new());
    written_elsewhere(&*store, &[MANAGER]).await;
    let (svc, queue, mut woken) = woken_service(
        store,
        directory(&[MANAGER]),
        AwarenessConfig {
            pickup_interval: PERIOD,
            recovery_interval: RECOVERY,
            ..AwarenessConfig::default()
        },
    );
    let start = tokio::time::Instant::now();
    let pickup = svc.spawn_pickup();
    assert_eq!(woken.recv().await, Some(k(MANAGER)), "the first pick-up");
    assert_eq!(start.elapsed(), Duration::ZERO);
    let lost = queue.drain(&k(MANAGER));
    assert_eq!(lost.len(), 1);
    tokio::time::sleep_until(start + RECOVERY - PERIOD / 2).await;
    assert!(
        woken.try_recv().is_err() && queue.peek(&k(MANAGER)).is_empty(),
        "not picked up a period before the recovery interval"
    );
    let again = tokio::time::timeout(PERIOD, woken.recv())
        .await
        .expect("woken at the recovery interval");
    assert_eq!(again, Some(k(MANAGER)));
    assert_eq!(start.elapsed(), RECOVERY);
    assert_eq!(queue.peek(&k(MANAGER)), lost);
    pickup.abort();
    let _ = pickup.await;
}

/// A gateway with a watcher whose turn stays running still makes the recovery pick-up: the
/// looks at that watcher alone, made at every question, are not whole pick-ups, and a notice
/// lost from another watcher's queue comes back within the recovery interval. (Timing the
/// recovery from those looks passed every other test; the lost notice then waited for as long
/// as the turn ran.) The clock is tokio's paused one.
#[tokio::test(start_paused = true)]
async fn a_watcher_whose_turn_keeps_running_does_not_hold_off_the_recovery_pick_up() {
    const PERIOD: Duration = Duration::from_secs(1);
    const RECOVERY: Duration = Duration::from_secs(10);
    let store = Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: HeldBefore::new(Call::Cursors),
    });
    // Both watch the worker, whose change another writer recorded: neither line is queued.
    written_elsewhere(&*store.inner, &[MANAGER, ELSEWHERE]).await;
    let (svc, queue, mut woken) = woken_service(
        store.clone(),
        directory(&[MANAGER, ELSEWHERE]),
        AwarenessConfig {
            pickup_interval: PERIOD,
            recovery_interval: RECOVERY,
            // The turn waits for the store as long as it takes.
            store_wait: Duration::MAX,
            ..AwarenessConfig::default()
        },
    );
    // The manager's turn reads its cursors, and is held there, its lock taken.
    let turn = store.hook.hold_a_turn(&svc, MANAGER).await;
    let start = tokio::time::Instant::now();
    let pickup = svc.spawn_pickup();
    assert_eq!(
        woken.recv().await,
        Some(k(ELSEWHERE)),
        "the first pick-up delivers the other watcher's notice and skips the manager"
    );
    assert!(texts(&queue, MANAGER).is_empty(), "left to its turn");
    let lost = queue.drain(&k(ELSEWHERE));
    assert_eq!(lost.len(), 1);
    let again = tokio::time::timeout(RECOVERY * 3, woken.recv())
        .await
        .expect("woken again while the manager's turn runs");
    assert_eq!(again, Some(k(ELSEWHERE)));
    assert!(start.elapsed() <= RECOVERY, "at {:?}", start.elapsed());
    assert_eq!(queue.peek(&k(ELSEWHERE)), lost, "the same line again");
    assert!(!turn.is_finished(), "the manager's turn still runs");
    store
        .hook
        .gate
        .add_permits(tokio::sync::Semaphore::MAX_PERMITS / 2);
    assert_eq!(turn.await.expect("the turn ends").len(), 1);
    pickup.abort();
    let _ = pickup.await;
}

/// A pick-up while a watcher's turn runs says it is complete when every pending notice of that
/// watcher is queued already: it has nothing to deliver there, so the watcher is not one it
/// skipped, and the pick-up task does not look at it again at every question. (What the
/// mutation did: every watcher with a pending cursor was looked at, whether or not its lines
/// were queued, so the running turn's watcher was skipped as busy and the pick-up said it was
/// not complete; review of stop 72, SG38.)
#[tokio::test]
async fn a_running_turns_watcher_whose_lines_are_queued_leaves_the_pick_up_complete() {
    let store = Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: HeldBefore::new(Call::Cursors),
    });
    written_elsewhere(&*store.inner, &[MANAGER]).await;
    let (svc, queue, _wake) = common::service_in(store.clone(), None, directory(&[MANAGER]));
    // The manager's turn drains its (empty) queue, reads its cursors and is held there.
    let turn = store.hook.hold_a_turn(&svc, MANAGER).await;
    // A change recorded meanwhile queues the manager's pending notice.
    svc.record(human(&child())).await.expect("recorded");
    assert_eq!(texts(&queue, MANAGER).len(), 1);
    assert_eq!(
        svc.pick_up().await,
        PickUp {
            queued: 0,
            complete: true
        },
        "nothing to deliver, and no watcher skipped"
    );
    store.hook.gate.add_permits(1);
    assert_eq!(turn.await.expect("the turn ends").len(), 1);
}

/// Makes the store's first `foreign_commits` question take 10 ms; the later ones take none.
struct FirstQuestionSlow(std::sync::atomic::AtomicBool);

#[awareness_core::async_trait]
impl Hook for FirstQuestionSlow {
    async fn before(&self, call: Call, _: &dyn AwarenessStore) {
        if call == Call::ForeignCommits && !self.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A notice lost from its queue comes back within the recovery interval of the first
/// question's pick-up however long the questions take, whether the task asks at the recovery
/// interval (shorter than the pick-up's), at a pick-up interval that divides it, or at one that
/// does not (the recovery is then made at the last question before the interval ends). Recovery
/// was timed from the questions' answers: after a first question slower than the next, the
/// interval looked a hair short at the question that ended it, and the notice came back a
/// whole period late, at 60 s and 40 s here (review, stop 58); and made at the first question
/// after the interval, it came back at 31 s of 25 (the second reading).
#[tokio::test(start_paused = true)]
async fn a_lost_notice_comes_back_within_the_recovery_interval_when_a_question_was_slow() {
    for (pickup_interval, recovery) in [
        (Duration::from_mins(10), Duration::from_secs(30)),
        (Duration::from_secs(10), Duration::from_secs(30)),
        (Duration::from_secs(10), Duration::from_secs(25)),
    ] {
        let inner = Arc::new(MemoryStore::new());
        let store = Arc::new(Hooked {
            inner: inner.clone(),
            hook: FirstQuestionSlow(false.into()),
        });
        let queue = Arc::new(InMemoryQueue::new());
        let (svc, _wake) = common::service_with_queue(
            store,
            directory(&[MANAGER]),
            AwarenessConfig {
                recovery_interval: recovery,
                pickup_interval,
                ..AwarenessConfig::default()
            },
            Arc::clone(&queue),
        );
        let began = tokio::time::Instant::now();
        let pickup = svc.spawn_pickup();
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Written past the service, where no answer of the store changes: only the recovery
        // picks it up.
        written_elsewhere(&*inner, &[MANAGER]).await;
        let mut back_at = None;
        for _ in 0..70 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if !queue.peek(&k(MANAGER)).is_empty() {
                back_at = Some(began.elapsed());
                break;
            }
        }
        pickup.abort();
        let _ = pickup.await;
        assert!(
            back_at.is_some_and(|at| at <= recovery + Duration::from_secs(1)),
            "pick-up interval {pickup_interval:?}: back at {back_at:?}, the recovery interval \
             being {recovery:?}"
        );
    }
}

/// Another writer that commits every millisecond, forever: a hint at each, and a new answer to
/// every question; a pick-up's read of the cursors takes 20 ms.
struct Storm {
    answer: std::sync::atomic::AtomicU64,
    reads: std::sync::atomic::AtomicU64,
}

struct StormHints;

#[awareness_core::async_trait]
impl awareness_core::CommitHints for StormHints {
    async fn next(&mut self) -> bool {
        tokio::time::sleep(Duration::from_millis(1)).await;
        true
    }
}

#[awareness_core::async_trait]
impl Hook for Storm {
    async fn before(&self, call: Call, _: &dyn AwarenessStore) {
        if call == Call::Cursors {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    fn foreign_commits(&self) -> Option<u64> {
        Some(
            self.answer
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst),
        )
    }
    fn commit_hints(&self) -> Option<Box<dyn awareness_core::CommitHints>> {
        Some(Box::new(StormHints))
    }
}

/// Under another writer's hints at every millisecond, the pick-ups they bring take at most
/// about a tenth of the task's time: after a pick-up of 20 ms the next hint waits 180 ms, so 2 s
/// hold about ten. Nothing tested the wait (review of hints, stop 58: without it, 79 pick-ups
/// in 2 s of a real-time run, every pending cursor read back to back; 96 here).
#[tokio::test(start_paused = true)]
async fn hints_at_every_commit_take_a_tenth_of_the_task_at_most() {
    let store = Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: Storm {
            answer: 0.into(),
            reads: 0.into(),
        },
    });
    let (svc, _wake) = common::service_with_queue(
        store.clone(),
        directory(&[MANAGER]),
        AwarenessConfig {
            pickup_interval: Duration::from_hours(1),
            recovery_interval: Duration::from_hours(1),
            ..AwarenessConfig::default()
        },
        Arc::new(InMemoryQueue::new()),
    );
    let pickup = svc.spawn_pickup();
    tokio::time::sleep(Duration::from_secs(2)).await;
    pickup.abort();
    let _ = pickup.await;
    // One read of the pending cursors per pick-up: 11 here, 96 without the wait, and 5 with a
    // wait three times as long (a 28th of the time: that passed the bounds 5 to 15 this test
    // had, review of stop 60).
    let made = store.hook.reads.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (9..=13).contains(&made),
        "{made} pick-ups of 20 ms in 2 s of hints (a tenth of the time is ten)"
    );
}

/// A host directory that knows its sessions the first time it is asked, and none after: a
/// session deleted between two questions.
struct KnowsOnce {
    inner: Arc<InMemoryDirectory>,
    asked: std::sync::atomic::AtomicUsize,
}

impl SessionDirectory for KnowsOnce {
    fn exists(&self, s: &SessionKey) -> bool {
        let first = self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        first && self.inner.exists(s)
    }
    fn entry(&self, s: &SessionKey) -> Option<SessionEntry> {
        self.inner.entry(s)
    }
}

/// A watcher the directory stopped knowing after the pick-up's first read of the pending
/// cursors (a session deleted meanwhile) is not delivered to: nothing queued, nobody woken.
/// The directory's second question could be dropped without a test failing (review, stop 57).
#[tokio::test]
async fn a_watcher_the_directory_forgot_since_the_first_read_is_not_delivered_to() {
    let store = Arc::new(MemoryStore::new());
    let dir = Arc::new(KnowsOnce {
        inner: directory(&[MANAGER]),
        asked: std::sync::atomic::AtomicUsize::new(0),
    });
    let queue = Arc::new(InMemoryQueue::new());
    let wake = Arc::new(RecordingWake::new());
    let svc = Awareness::builder(store.clone(), queue.clone(), wake.clone(), dir.clone()).build();
    written_elsewhere(&*store, &[MANAGER]).await;
    let picked = svc.pick_up().await;
    assert!(
        dir.asked.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "asked again before delivering"
    );
    assert_eq!(picked.queued, 0, "{picked:?}");
    assert!(texts(&queue, MANAGER).is_empty(), "nothing queued");
    assert_eq!(wake.count(&k(MANAGER)), 0, "nobody woken");
}

/// A host directory that panics when asked about one session (a bug for one row).
struct PanicsFor {
    inner: Arc<InMemoryDirectory>,
    bad: SessionKey,
}

impl SessionDirectory for PanicsFor {
    fn exists(&self, s: &SessionKey) -> bool {
        assert!(*s != self.bad, "the host's directory failed for {s}");
        self.inner.exists(s)
    }
    fn entry(&self, s: &SessionKey) -> Option<SessionEntry> {
        self.inner.entry(s)
    }
}

/// A directory that panics for one watcher with a pending notice costs the others nothing, in
/// a pick-up (then incomplete) and in the start-up sweep: that watcher is left out, as one the
/// directory does not know. Both panicked as a whole, and the pick-up task's every retry the
/// same way, so that no watcher of the gateway was ever picked up (review, stop 55).
#[tokio::test]
async fn a_directory_that_panics_for_one_watcher_costs_the_others_nothing() {
    for sweep in [false, true] {
        let store = Arc::new(MemoryStore::new());
        let dir = Arc::new(PanicsFor {
            inner: directory(&[MANAGER, NESTED]),
            bad: k(NESTED),
        });
        let queue = Arc::new(InMemoryQueue::new());
        let wake = Arc::new(RecordingWake::new());
        let svc = Awareness::builder(store.clone(), queue.clone(), wake.clone(), dir).build();
        written_elsewhere(&*store, &[MANAGER, NESTED]).await;
        if sweep {
            assert_eq!(
                svc.try_sweep().await.expect("the sweep"),
                1,
                "the manager's"
            );
        } else {
            assert_eq!(
                svc.pick_up().await,
                PickUp {
                    queued: 1,
                    complete: false
                }
            );
        }
        assert_eq!(
            texts(&queue, MANAGER).len(),
            1,
            "sweep {sweep}: the manager's notice is queued"
        );
        assert_eq!(
            wake.count(&k(MANAGER)),
            1,
            "sweep {sweep}: the main session is woken"
        );
        assert!(texts(&queue, NESTED).is_empty(), "sweep {sweep}");
    }
}

/// A pick-up pays the wake owed for a dropped turn's lines exactly when it queued a line that
/// wakes. With the waking notice's line queued already (no wake) and only an ambient notice's
/// line queued anew (queued without a wake, decision 0015), it took the debt as paid and woke
/// nobody, and the main session, which takes no turn unless woken, was left with the lines;
/// with the ambient line queued already and the waking one queued anew (a wake), it kept the
/// debt and woke the session a second time. Once, either way, and whichever of the two
/// sessions comes first in the order of the cursors (the pick-up delivers the waking notices
/// first: without that, an ambient notice first was taken for one that woke, and the debt for
/// paid; the order could be dropped without a test failing: review, stop 57). An ambient
/// cursor is OpenClaw's: the file is written as OpenClaw marks one.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_up_wakes_once_for_a_wake_owed_whichever_line_it_queues() {
    // The explicit watch's session before the worker's, and after it.
    for explicit in ["agent:main:subagent:other", "agent:main:subagent:zeta"] {
        for lost in [CHILD, explicit] {
            assert_eq!(
                wakes_of_a_pick_up_owing_a_wake(explicit, lost).await,
                vec![k(MANAGER)],
                "the {lost} line lost, {explicit} watched explicitly"
            );
        }
    }
}

/// A hook that holds every call `call` at a gate before the store has it, while armed,
/// telling `reached` when one is held.
struct HeldBefore {
    call: Call,
    armed: std::sync::atomic::AtomicBool,
    gate: tokio::sync::Semaphore,
    reached: tokio::sync::Notify,
}

impl HeldBefore {
    /// Holds every call `call` while armed; not armed yet.
    fn new(call: Call) -> Self {
        Self {
            call,
            armed: std::sync::atomic::AtomicBool::new(false),
            gate: tokio::sync::Semaphore::new(0),
            reached: tokio::sync::Notify::new(),
        }
    }
}

impl HeldBefore {
    /// Starts `watcher`'s turn on `svc` and answers once the turn is held at this hook (armed
    /// for that one call, then disarmed): a turn running, its lock taken.
    async fn hold_a_turn(
        &self,
        svc: &Arc<Awareness>,
        watcher: &str,
    ) -> tokio::task::JoinHandle<Vec<gateway_adapter::QueuedEntry>> {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
        let turn = tokio::spawn({
            let (svc, watcher) = (Arc::clone(svc), k(watcher));
            async move { svc.drain_turn(&watcher).await }
        });
        self.reached.notified().await;
        self.armed.store(false, std::sync::atomic::Ordering::SeqCst);
        turn
    }
}

#[awareness_core::async_trait]
impl Hook for HeldBefore {
    async fn before(&self, call: Call, _store: &dyn AwarenessStore) {
        if call == self.call && self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            self.reached.notify_one();
            self.gate.acquire().await.expect("the gate").forget();
        }
    }
}

/// The wakes of a pick-up while the manager is owed a wake for what its dropped turns read
/// (the worker's notice, ambient, and `explicit`'s, explicit), both sessions having
/// changed again since and the line of `lost` been lost from the queue. The first turn is
/// dropped once its acknowledgement committed (which pays the wake as it ends: checked), the
/// second while it reads the cursors, which owes it again to the pick-up.
#[cfg(feature = "sqlite")]
async fn wakes_of_a_pick_up_owing_a_wake(explicit: &str, lost: &str) -> Vec<SessionKey> {
    let dir = tempfile::tempdir().expect("temp dir");
    // The manager's cursor on the worker is ambient and pending; its cursor on another
    // session is explicit and pending.
    let inner = ambient_manager(&dir.path().join("state.sqlite")).await;
    let other = SessionRef::parse(explicit, "main").unwrap();
    let manager = WatcherKey::parse(MANAGER).unwrap();
    inner
        .watch(&manager, &other, Timestamp::now())
        .await
        .expect("watched");
    inner
        .record(human(&other), Timestamp::now())
        .await
        .expect("recorded");
    let acks = Arc::new(Hooked {
        inner,
        hook: HeldAfter::new(Call::Acknowledge),
    });
    let store = Arc::new(Hooked {
        inner: acks.clone(),
        hook: HeldBefore::new(Call::Cursors),
    });
    let (svc, queue, mut woken) = woken_service(
        store.clone(),
        directory(&[MANAGER]),
        AwarenessConfig::default(),
    );
    // The manager's turn reads both notices and is dropped once its acknowledgement committed.
    let turn = {
        let svc = Arc::clone(&svc);
        tokio::spawn(async move { svc.drain_turn(&k(MANAGER)).await })
    };
    acks.hook.reached.notified().await;
    turn.abort();
    let _ = turn.await;
    while woken.try_recv().is_ok() {}
    acks.hook.gate.add_permits(1);
    svc.wait_for_writes().await;
    assert_eq!(
        std::iter::from_fn(|| woken.try_recv().ok()).collect::<Vec<_>>(),
        [k(MANAGER)],
        "the acknowledgement paid the wake as it ended"
    );
    // The turn that wake brought takes the lines and is dropped while it reads the cursors.
    let turn = store.hook.hold_a_turn(&svc, MANAGER).await;
    turn.abort();
    let _ = turn.await;
    store.hook.gate.add_permits(1);
    // Both change again: the other session's line is queued with a wake, the worker's
    // (ambient) without one; then one of the two lines is lost.
    svc.try_record(human(&other)).await.expect("recorded");
    svc.try_record(human(&child())).await.expect("recorded");
    while woken.try_recv().is_ok() {}
    let gone: Vec<_> = queue
        .peek(&k(MANAGER))
        .into_iter()
        .filter(|l| l.text.contains(&format!("\"{lost}\"")))
        .collect();
    assert_eq!(gone.len(), 1, "the {lost} line was queued");
    assert!(queue.remove(&k(MANAGER), &gone[0]));
    let picked = svc.pick_up().await;
    assert_eq!(picked.queued, 1, "the lost line, again");
    std::iter::from_fn(|| woken.try_recv().ok()).collect()
}

/// The pruning task's first pass comes an interval after it is spawned, not at once: the start-up
/// ([`Awareness::startup`]) has just pruned. (A pass at once passed every other test: review of
/// stop 62, S05.)
#[tokio::test(start_paused = true)]
async fn the_pruning_task_first_prunes_an_interval_after_it_is_spawned() {
    let config = AwarenessConfig::default();
    let interval = config.prune_interval;
    let (svc, _queue, _woken) =
        woken_service(Arc::new(MemoryStore::new()), directory(&[MANAGER]), config);
    let mut passes = svc.subscribe_pruning();
    let pruning = svc.spawn_pruning();
    let early = tokio::time::timeout(interval / 2, passes.changed()).await;
    assert!(
        early.is_err(),
        "a pass before the first interval: {} pass(es)",
        passes.borrow().passes
    );
    tokio::time::timeout(interval, passes.changed())
        .await
        .expect("a pass at the interval")
        .expect("the service lives");
    assert_eq!(passes.borrow_and_update().passes, 1);
    pruning.abort();
    let _ = pruning.await;
}

/// A store whose answer to the pick-up task's question is always 1 (nothing new), whose
/// questions fail while `fail` is set, and that counts the task's reads of cursors.
#[derive(Default)]
struct Asked {
    fail: std::sync::atomic::AtomicBool,
    reads: std::sync::atomic::AtomicUsize,
}

#[awareness_core::async_trait]
impl Hook for Asked {
    async fn before(&self, call: Call, _store: &dyn AwarenessStore) {
        if matches!(call, Call::Cursors | Call::Cursor) {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    fn refuse(&self, call: Call) -> Option<awareness_core::StoreError> {
        (call == Call::ForeignCommits && self.fail.load(std::sync::atomic::Ordering::SeqCst))
            .then(|| awareness_core::StoreError::backend("ask", "the question fails"))
    }
    fn foreign_commits(&self) -> Option<u64> {
        Some(1)
    }
}

/// A store in memory whose questions for a commit are counted, and failed when told.
fn asked_memory_store() -> Arc<Hooked<Asked>> {
    Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: Asked::default(),
    })
}

/// A pick-up task asking every second, with a recovery interval of 10 s, over `store`.
fn asked_every_second(
    store: Arc<Hooked<Asked>>,
) -> (
    Arc<Awareness>,
    mpsc::UnboundedReceiver<SessionKey>,
    tokio::task::JoinHandle<()>,
) {
    let (svc, _queue, woken) = woken_service(
        store,
        directory(&[MANAGER]),
        AwarenessConfig {
            pickup_interval: Duration::from_secs(1),
            recovery_interval: Duration::from_secs(10),
            ..AwarenessConfig::default()
        },
    );
    let pickup = svc.spawn_pickup();
    (svc, woken, pickup)
}

fn reads(store: &Hooked<Asked>) -> usize {
    store.hook.reads.load(std::sync::atomic::Ordering::SeqCst)
}

/// The recovery pick-up comes once per recovery interval, not at every question once the first
/// recovery interval is over: the interval is timed from the last whole pick-up. (Timing it from
/// the task's start passed every other test, and every question after the first 10 s read every
/// pending cursor of the store: review of stop 62, S33.) The clock is tokio's paused one.
#[tokio::test(start_paused = true)]
async fn the_recovery_pick_up_comes_once_per_recovery_interval() {
    let store = asked_memory_store();
    written_elsewhere(&*store.inner, &[MANAGER]).await;
    let (_svc, _woken, pickup) = asked_every_second(store.clone());
    tokio::time::sleep(Duration::from_millis(12_500)).await;
    let after_the_first_recovery = reads(&store);
    assert!(after_the_first_recovery > 0, "the first question picks up");
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(
        reads(&store),
        after_the_first_recovery,
        "no pick-up between two recovery intervals, nothing new committed"
    );
    pickup.abort();
    let _ = pickup.await;
}

/// While every question fails, the task picks up at the recovery interval only, not at each failed
/// question. (Picking up at every failed question passed every other test, a whole pick-up every
/// interval against a store that cannot answer: review of stop 62, S31.)
#[tokio::test(start_paused = true)]
async fn questions_that_fail_pick_up_at_the_recovery_interval_only() {
    let store = asked_memory_store();
    store
        .hook
        .fail
        .store(true, std::sync::atomic::Ordering::SeqCst);
    written_elsewhere(&*store.inner, &[MANAGER]).await;
    let (_svc, mut woken, pickup) = asked_every_second(store.clone());
    tokio::time::sleep(Duration::from_millis(9_500)).await;
    assert_eq!(reads(&store), 0, "no pick-up at a failed question");
    let got = tokio::time::timeout(Duration::from_secs(2), woken.recv())
        .await
        .expect("woken at the recovery interval");
    assert_eq!(got, Some(k(MANAGER)));
    pickup.abort();
    let _ = pickup.await;
}

/// The first answer after a question that failed is picked up even when it is the answer seen
/// before the failure: a store's answers need not compare across a lost connection. (Keeping the
/// answers seen passed every other test, and the notice waited for the recovery interval: review of
/// stop 62, S32.)
#[tokio::test(start_paused = true)]
async fn the_first_answer_after_a_failed_question_is_picked_up_even_if_seen() {
    let store = asked_memory_store();
    let (_svc, mut woken, pickup) = asked_every_second(store.clone());
    // The first question (answer 1) picks up: nothing pending.
    tokio::time::sleep(Duration::from_millis(500)).await;
    written_elsewhere(&*store.inner, &[MANAGER]).await;
    store
        .hook
        .fail
        .store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await; // the question at 1 s fails
    store
        .hook
        .fail
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let got = tokio::time::timeout(Duration::from_secs(5), woken.recv())
        .await
        .expect("woken at the first answer after the failure, not at the recovery interval");
    assert_eq!(got, Some(k(MANAGER)));
    pickup.abort();
    let _ = pickup.await;
}

/// A store whose question is never answered in time (its handle's own write waits for another
/// process's lock) and that hints at each commit.
struct SilentWithHints(std::sync::Mutex<Option<mpsc::UnboundedReceiver<()>>>);

struct ChannelHints(mpsc::UnboundedReceiver<()>);

#[awareness_core::async_trait]
impl awareness_core::CommitHints for ChannelHints {
    async fn next(&mut self) -> bool {
        self.0.recv().await.is_some()
    }
}

#[awareness_core::async_trait]
impl Hook for SilentWithHints {
    async fn before(&self, call: Call, _: &dyn AwarenessStore) {
        if call == Call::ForeignCommits {
            std::future::pending::<()>().await;
        }
    }
    fn commit_hints(&self) -> Option<Box<dyn awareness_core::CommitHints>> {
        let hints = self.0.lock().unwrap().take()?;
        Some(Box::new(ChannelHints(hints)))
    }
}

/// A question a hint brought is picked up from even when the store does not answer it in time,
/// after a pick-up at an answer not known already: the hint says another writer committed. The
/// recovery interval is three periods off, so that the hinted question is no recovery's. (What the
/// mutation did: such a question taken for an unhinted one, and the notice waited for the recovery
/// interval; review of stop 64, SV35.)
#[tokio::test(start_paused = true)]
async fn a_hinted_question_left_unanswered_picks_up_again() {
    let (hint, hints) = mpsc::unbounded_channel();
    let store = Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: SilentWithHints(std::sync::Mutex::new(Some(hints))),
    });
    let (svc, _queue, mut woken) = woken_service(
        store.clone(),
        directory(&[MANAGER]),
        AwarenessConfig {
            pickup_interval: Duration::from_hours(1),
            recovery_interval: Duration::from_hours(3),
            ..AwarenessConfig::default()
        },
    );
    let pickup = svc.spawn_pickup();
    // The first question goes unanswered; the pick-up it makes finds nothing.
    tokio::time::sleep(Duration::from_secs(1)).await;
    written_elsewhere(&*store, &[MANAGER]).await;
    hint.send(()).expect("the task listens");
    let got = tokio::time::timeout(Duration::from_mins(1), woken.recv())
        .await
        .expect("woken at the hint, its question unanswered too");
    assert_eq!(got, Some(k(MANAGER)));
    pickup.abort();
    let _ = pickup.await;
}

/// A memory store played as one whose question fails for a while (a lost connection) and then
/// answers from another count (a new connection's), no other writer committing.
struct Reconnecting {
    answer: std::sync::atomic::AtomicU64,
    failing: std::sync::atomic::AtomicBool,
}

#[awareness_core::async_trait]
impl Hook for Reconnecting {
    fn foreign_commits(&self) -> Option<u64> {
        Some(self.answer.load(std::sync::atomic::Ordering::SeqCst))
    }
    fn refuse(&self, call: Call) -> Option<awareness_core::StoreError> {
        (call == Call::ForeignCommits && self.failing.load(std::sync::atomic::Ordering::SeqCst))
            .then(|| {
                awareness_core::StoreError::backend(
                    "ask whether another writer committed",
                    std::io::Error::other("connection lost"),
                )
            })
    }
}

/// The store's answers after a failed question are not compared with those before it (they need not
/// compare across a lost connection, as the pick-up's own schedule assumes): a gateway alone on its
/// store whose question failed once and then answers another number does not warn that another
/// writer commits. (What the mutation did: compared, and a writer that is not there was warned of;
/// review of stop 64, SV41.)
#[tokio::test(start_paused = true)]
async fn answers_after_a_failed_question_are_not_taken_for_another_writer() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let store = Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: Reconnecting {
            answer: std::sync::atomic::AtomicU64::new(1),
            failing: std::sync::atomic::AtomicBool::new(false),
        },
    });
    let svc = Arc::new(
        Awareness::builder(
            store.clone(),
            Arc::new(InMemoryQueue::new()),
            Arc::new(gateway_adapter::RecordingWake::new()),
            directory(&[MANAGER]),
        )
        .build(),
    );
    let pickup = svc.spawn_pickup();
    let said = || capture.said(&["owned_watchers_only is off"]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    store
        .hook
        .failing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    store
        .hook
        .answer
        .store(7, std::sync::atomic::Ordering::SeqCst);
    store
        .hook
        .failing
        .store(false, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(said(), 0, "no other writer: nothing is said");
    pickup.abort();
    let _ = pickup.await;
}

/// Once the store's commit hints have ended (`next` answered `false`), the pick-up task asks at
/// its interval only and never polls the ended stream again. (What the mutation did: it spun on
/// the ended stream, a core busy for good; review of stop 65, SW33. The waits only give a
/// spinning task room to show itself: the original asks once however long they last.)
#[tokio::test]
async fn ended_commit_hints_are_not_polled_again() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    struct Ended(Arc<AtomicUsize>);
    #[awareness_core::async_trait]
    impl awareness_core::store::CommitHints for Ended {
        async fn next(&mut self) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst);
            false
        }
    }
    struct EndedHints(Arc<AtomicUsize>);
    #[awareness_core::async_trait]
    impl Hook for EndedHints {
        fn commit_hints(&self) -> Option<Box<dyn awareness_core::store::CommitHints>> {
            Some(Box::new(Ended(Arc::clone(&self.0))))
        }
    }
    let polls = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: EndedHints(Arc::clone(&polls)),
    });
    let (svc, _queue, _wake) = common::service(store, None);
    let task = svc.spawn_pickup();
    // Until the task has asked the stream (it does at its first wait after the first question).
    for _ in 0..1000 {
        if polls.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Time for a task that spins on the ended stream to ask it again (an original task asks
    // nothing more whatever this lasts).
    tokio::time::sleep(Duration::from_millis(50)).await;
    task.abort();
    let _ = task.await;
    assert_eq!(
        polls.load(Ordering::SeqCst),
        1,
        "the ended stream is asked once, then left"
    );
}
