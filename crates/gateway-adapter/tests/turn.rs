//! A watcher's turn while its acknowledgement is still in flight: a store whose `acknowledge`
//! waits at a gate the test opens lets events and a second turn of the same watcher land in
//! between, and the tests check what each turn reads and where the cursor ends.
//!
//! Nothing here waits on time: the gate is a semaphore the test releases, and the tests run on
//! tokio's single-threaded test runtime, so a spawned turn runs exactly as far as it can when
//! the test yields. The last tests gate other calls (before or after the store answers) and
//! drop a turn or a recording there, as a gateway's timeout would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use awareness_core::testkit::hooked::{Call, Hook, Hooked};
use awareness_core::upstream::UpstreamStore as _;
use awareness_core::{
    ActorType, AwarenessStore, Cursor, CursorFilter, CursorStore, EventStore, LinkSpec, Sequence,
    SessionKey, SessionRef, StoreError, WatcherKey, async_trait,
};
use gateway_adapter::{
    Awareness, AwarenessConfig, HeartbeatWake, HumanMessage, InMemoryDirectory, InMemoryQueue,
    PickUp, QueuedEntry, RecordingWake, SessionEntry, SystemEventQueue,
};
use store_memory::MemoryStore;
use tokio::sync::{Semaphore, mpsc};

const MANAGER: &str = "agent:main:main";
const CHILD: &str = "agent:main:subagent:worker";

mod common;
use common::{Capture, FaultyQueue, k, settle};

/// Holds each call `at.0` of the memory store at a gate, before it reaches the store (or,
/// with `at.1`, once the store has answered): it reports that it got there, then waits for a
/// permit of `permits`. Only while `armed`.
struct Gate {
    permits: Semaphore,
    entered: mpsc::UnboundedSender<()>,
    at: std::sync::Mutex<(Call, bool)>,
    armed: AtomicBool,
    /// Fails every reset of a watcher while set (a disk that refuses writes).
    refuse_resets: AtomicBool,
    /// Fails every call of this kind, once past the gate (a disk that fails a write the
    /// caller has stopped waiting for).
    refuse_at: std::sync::Mutex<Option<Call>>,
    /// Panics in every acknowledgement while set (a store with a bug).
    panic_on_ack: AtomicBool,
    /// Panics in the next acknowledgement, once, before the gate.
    panic_next_ack: AtomicBool,
    /// One message each time the store is asked whether another writer committed (it answers
    /// that another writer did, once, before the first question).
    questions: mpsc::UnboundedSender<()>,
}

impl Gate {
    async fn hold(&self, call: Call, after: bool) {
        assert!(
            call != Call::Acknowledge
                || !(self.panic_on_ack.load(Ordering::SeqCst)
                    || !after && self.panic_next_ack.swap(false, Ordering::SeqCst)),
            "the store panicked while acknowledging"
        );
        if call == Call::ForeignCommits && after {
            let _ = self.questions.send(());
        }
        let at = *self.at.lock().unwrap();
        if (call, after) == at && self.armed.load(Ordering::SeqCst) {
            let _ = self.entered.send(());
            self.permits.acquire().await.expect("gate open").forget();
        }
    }
}

#[async_trait]
impl Hook for Gate {
    async fn before(&self, call: Call, _store: &dyn AwarenessStore) {
        self.hold(call, false).await;
    }

    async fn after(&self, call: Call, _store: &dyn AwarenessStore) {
        self.hold(call, true).await;
    }

    fn refuse(&self, call: Call) -> Option<StoreError> {
        if *self.refuse_at.lock().unwrap() == Some(call) {
            return Some(StoreError::backend(
                "write",
                std::io::Error::other("disk I/O error"),
            ));
        }
        (call == Call::ResetWatcher && self.refuse_resets.load(Ordering::SeqCst)).then(|| {
            StoreError::backend("reset a watcher", std::io::Error::other("disk I/O error"))
        })
    }

    fn foreign_commits(&self) -> Option<u64> {
        Some(1)
    }
}

type GatedAck = Hooked<Gate>;

struct World {
    store: Arc<GatedAck>,
    /// The service's upstream links (not gated).
    links: Arc<MemoryStore>,
    /// An in-memory queue that panics when told to.
    queue: Arc<FaultyQueue>,
    wake: Arc<Wakes>,
    svc: Arc<Awareness>,
    /// One message each time an acknowledgement reaches the store.
    entered: mpsc::UnboundedReceiver<()>,
    /// One message each time the store answered whether another writer committed.
    questions: mpsc::UnboundedReceiver<()>,
}

/// The wakes the service asks for, recorded; the next one panics when told to (a heartbeat
/// runner that fails).
#[derive(Default)]
struct Wakes {
    woken: RecordingWake,
    panic_next: AtomicBool,
}

impl Wakes {
    fn count(&self, session: &SessionKey) -> usize {
        self.woken.count(session)
    }
}

impl HeartbeatWake for Wakes {
    fn wake(&self, session: &SessionKey, reason: &str) {
        assert!(
            !self.panic_next.swap(false, Ordering::SeqCst),
            "the heartbeat runner failed"
        );
        self.woken.wake(session, reason);
    }
}

impl World {
    /// A manager that spawned a worker (its cursor seeded at sequence 1); each
    /// acknowledgement waits at the gate before it reaches the store.
    async fn new() -> Self {
        Self::gated(Call::Acknowledge, false).await
    }

    /// The same, with the gate on `call` (once the store answered, with `after`), armed once
    /// the worker is spawned.
    async fn gated(call: Call, after: bool) -> Self {
        Self::gated_with(call, after, AwarenessConfig::default()).await
    }

    /// [`World::gated`], the service built with `config`.
    async fn gated_with(call: Call, after: bool, config: AwarenessConfig) -> Self {
        // The gateway owns the manager (for the pick-ups).
        let directory = Arc::new(InMemoryDirectory::new());
        directory.upsert(k(MANAGER), SessionEntry::default());
        Self::gated_in(call, after, config, directory).await
    }

    /// [`World::gated_with`], the gateway's sessions in `directory` (which must know the
    /// manager).
    async fn gated_in(
        call: Call,
        after: bool,
        config: AwarenessConfig,
        directory: Arc<dyn gateway_adapter::SessionDirectory>,
    ) -> Self {
        Self::gated_over(Arc::new(MemoryStore::new()), call, after, config, directory).await
    }

    /// [`World::gated_in`], the gate in front of `inner`.
    async fn gated_over(
        inner: Arc<dyn AwarenessStore>,
        call: Call,
        after: bool,
        config: AwarenessConfig,
        directory: Arc<dyn gateway_adapter::SessionDirectory>,
    ) -> Self {
        let (tx, entered) = mpsc::unbounded_channel();
        let (asked, questions) = mpsc::unbounded_channel();
        let store = Arc::new(GatedAck {
            inner,
            hook: Gate {
                permits: Semaphore::new(0),
                entered: tx,
                at: std::sync::Mutex::new((call, after)),
                armed: AtomicBool::new(false),
                refuse_resets: AtomicBool::new(false),
                refuse_at: std::sync::Mutex::new(None),
                panic_on_ack: AtomicBool::new(false),
                panic_next_ack: AtomicBool::new(false),
                questions: asked,
            },
        });
        let queue = Arc::new(FaultyQueue::default());
        let wake = Arc::new(Wakes::default());
        let links = Arc::new(MemoryStore::new());
        let svc = Awareness::builder(store.clone(), queue.clone(), wake.clone(), directory)
            .upstream(links.clone())
            .config(config)
            .build();
        let svc = Arc::new(svc);
        svc.subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
            .await
            .expect("seeded");
        store.hook.armed.store(true, Ordering::SeqCst);
        Self {
            store,
            links,
            queue,
            wake,
            svc,
            entered,
            questions,
        }
    }

    /// [`World::gated_with`] (gated on acknowledgements) over an OpenClaw SQLite file in `dir`,
    /// where the manager also watches a group's session ambiently, as OpenClaw marks such a
    /// cursor (the only store where an ambient cursor exists); with the group's key.
    #[cfg(feature = "sqlite")]
    async fn over_an_ambient_cursor(
        dir: &std::path::Path,
        after: bool,
        config: AwarenessConfig,
    ) -> (Self, SessionKey) {
        let sqlite = Arc::new(
            store_sqlite::SqliteStore::open(&dir.join("state.sqlite"))
                .await
                .expect("open"),
        );
        let directory = Arc::new(InMemoryDirectory::new());
        directory.upsert(k(MANAGER), SessionEntry::default());
        let w = Self::gated_over(sqlite.clone(), Call::Acknowledge, after, config, directory).await;
        let group = k("agent:main:subagent:group");
        w.svc
            .subagent_spawned(&group, None, &k(MANAGER), "run-2")
            .await
            .expect("seeded");
        assert!(
            sqlite
                .make_ambient(&WatcherKey::parse(MANAGER).unwrap(), &group)
                .await
                .expect("marked")
        );
        (w, group)
    }

    /// A manager whose turn was dropped once its acknowledgement committed, leaving what it
    /// read (a person's message in the worker) to the next turn; the gate is open.
    async fn with_a_dropped_turn() -> Self {
        let w = Self::with_a_dropped_turn_armed().await;
        w.open_gate();
        w
    }

    /// [`World::with_a_dropped_turn`], the gate still armed (on acknowledgements, with no
    /// permit left).
    async fn with_a_dropped_turn_armed() -> Self {
        let (w, _) = Self::with_a_turn_dropped_at_its_answer().await;
        // The acknowledgement committed; the gate held its answer, which now returns.
        w.store.hook.permits.add_permits(1);
        settle().await;
        w
    }

    /// A manager whose turn took an exec's line with the notice's and was dropped once its
    /// acknowledgement committed, the answer since come back and the wake the lines were owed
    /// paid by a pick-up; with the exec's line.
    async fn with_an_exec_line_left_and_woken() -> (Self, QueuedEntry) {
        let mut w = Self::gated(Call::Acknowledge, true).await;
        w.human().await;
        let exec = w.queue_an_exec_line();
        let turn = w.turn_at_the_gate().await;
        dropped(turn).await;
        // The acknowledgement committed; its answer, held at the gate, returns.
        w.store.hook.permits.add_permits(1);
        settle().await;
        w.pick_up_wakes(0, "woken for the lines as the acknowledgement ended")
            .await;
        (w, exec)
    }

    /// A manager whose turn was dropped once its acknowledgement committed, the answer held at
    /// the gate (no permit left): the acknowledgement still holds the turn's lock. With how
    /// often the manager was woken before the turn.
    async fn with_a_turn_dropped_at_its_answer() -> (Self, usize) {
        let mut w = Self::gated(Call::Acknowledge, true).await;
        w.human().await;
        let before = w.wake.count(&k(MANAGER));
        let a = w.turn_at_the_gate().await;
        dropped(a).await;
        (w, before)
    }

    /// The manager's turn, dropped when it reaches `call` (before the store has it); the
    /// gate is open afterwards.
    async fn drop_a_turn_at(&mut self, call: Call) {
        *self.store.hook.at.lock().unwrap() = (call, false);
        let turn = self.turn_at_the_gate().await;
        dropped(turn).await;
        self.open_gate();
    }

    /// Queues a line of another kind than session-state for the manager (an exec's), as the
    /// host does; returns it.
    fn queue_an_exec_line(&self) -> QueuedEntry {
        let exec = QueuedEntry {
            text: "Exec finished: cargo test".into(),
            context_key: None,
        };
        assert!(self.queue.enqueue(&k(MANAGER), exec.clone()));
        exec
    }

    /// A pick-up, after which the manager was woken `more` times more than before it.
    async fn pick_up_wakes(&self, more: usize, why: &str) {
        let before = self.wake.count(&k(MANAGER));
        self.svc.pick_up().await;
        assert_eq!(self.wake.count(&k(MANAGER)), before + more, "{why}");
    }

    /// The manager's next turn shows the notice of the first event, and nothing else.
    async fn turn_shows_the_first_notice(&self, why: &str) {
        assert_eq!(
            texts(&self.svc.drain_turn(&k(MANAGER)).await),
            vec![notice(Sequence(1))],
            "{why}"
        );
    }

    /// A person types into the worker; returns the event's sequence.
    async fn human(&self) -> Sequence {
        self.svc
            .human_message(human_message())
            .await
            .expect("recorded")
            .sequence
    }

    /// The manager's turn, on its own task.
    fn turn(&self) -> tokio::task::JoinHandle<Vec<QueuedEntry>> {
        let svc = Arc::clone(&self.svc);
        tokio::spawn(async move { svc.drain_turn(&k(MANAGER)).await })
    }

    /// The manager's turn, on its own task, once it has reached the gate.
    async fn turn_at_the_gate(&mut self) -> tokio::task::JoinHandle<Vec<QueuedEntry>> {
        let turn = self.turn();
        self.entered
            .recv()
            .await
            .expect("the turn reaches the gate");
        turn
    }

    /// The manager's deletion, on its own task.
    fn delete_the_manager(&self) -> tokio::task::JoinHandle<Result<(), StoreError>> {
        let svc = Arc::clone(&self.svc);
        let manager = SessionRef::parse(MANAGER, "main").unwrap();
        tokio::spawn(async move { svc.try_on_delete(&manager).await })
    }

    fn open_gate(&self) {
        self.store
            .hook
            .permits
            .add_permits(Semaphore::MAX_PERMITS / 2);
    }

    async fn cursor(&self) -> Cursor {
        self.store
            .cursor(&WatcherKey::parse(MANAGER).unwrap(), &k(CHILD))
            .await
            .unwrap()
            .expect("the manager watches the worker")
    }
}

/// A person's message in the worker, which the manager spawned.
fn human_message() -> HumanMessage {
    let mut msg = HumanMessage::new(k(CHILD));
    msg.entry = Some(SessionEntry {
        spawned_by: Some(k(MANAGER)),
        ..SessionEntry::default()
    });
    msg
}

fn texts(lines: &[QueuedEntry]) -> Vec<String> {
    lines.iter().map(|e| e.text.clone()).collect()
}

fn notice(since: Sequence) -> String {
    awareness_core::protocol::notice_text(&k(CHILD), since)
}

/// A pick-up ([`Awareness::pick_up`]) leaves a watcher whose turn is running to that turn: the
/// turn has drained the queue and reads the cursors itself, and a line queued now would be a
/// copy of what it reads.
#[tokio::test]
async fn a_pick_up_leaves_a_watcher_whose_turn_runs_to_that_turn() {
    let mut w = World::new().await;
    let first = w.human().await;
    let turn = w.turn_at_the_gate().await;
    assert!(w.queue.peek(&k(MANAGER)).is_empty(), "the turn drained it");
    assert_eq!(
        w.svc.pick_up().await,
        PickUp {
            queued: 0,
            complete: false
        },
        "skipped for its turn, to be tried again"
    );
    assert!(
        w.queue.peek(&k(MANAGER)).is_empty(),
        "nothing queued beside the turn"
    );
    w.open_gate();
    assert_eq!(texts(&turn.await.unwrap()), vec![notice(Sequence(1))]);
    let c = w.cursor().await;
    assert_eq!((c.last_seen, c.notified), (first, first));
    assert_eq!(
        w.svc.pick_up().await,
        PickUp {
            queued: 0,
            complete: true
        },
        "nothing is pending"
    );
}

/// A notice another writer hands out after a running turn read the cursors (so the turn does
/// not see it) reaches the watcher at the pick-up task's next question once the turn ends,
/// however long the turn ran, even with no other commit since: a main session takes no turn
/// until it is woken. The pick-ups that found the turn running do not back off.
#[tokio::test(start_paused = true)]
async fn a_notice_a_running_turn_missed_is_picked_up_at_the_next_question_after_it() {
    // A turn that runs long, not a store that hangs: the turn waits for the store's answer.
    let config = AwarenessConfig {
        store_wait: std::time::Duration::from_hours(1),
        ..AwarenessConfig::default()
    };
    let mut w = World::gated_with(Call::Cursors, true, config).await;
    let turn = w.turn_at_the_gate().await;
    w.store.hook.armed.store(false, Ordering::SeqCst);
    // Another writer: past the service, so no queue hears of it.
    w.store
        .inner
        .record(
            awareness_core::testkit::checks::human(&SessionRef::parse(CHILD, "main").unwrap()),
            awareness_core::Timestamp::now(),
        )
        .await
        .expect("recorded elsewhere");
    let pickup = w.svc.spawn_pickup();
    // The turn runs for 40 questions, each pick-up finding it running.
    for _ in 0..40 {
        w.questions.recv().await.expect("asked");
    }
    while w.questions.try_recv().is_ok() {}
    assert_eq!(
        w.wake.count(&k(MANAGER)),
        0,
        "nothing delivered beside the turn"
    );
    w.open_gate();
    assert!(
        turn.await.unwrap().is_empty(),
        "the turn read nothing pending"
    );
    let mut questions = 0;
    while w.wake.count(&k(MANAGER)) == 0 {
        w.questions.recv().await.expect("asked");
        questions += 1;
        assert!(
            questions <= 2,
            "no wake by the second question after the turn ended"
        );
    }
    assert_eq!(texts(&w.queue.peek(&k(MANAGER))), vec![notice(Sequence(1))]);
    pickup.abort();
    let _ = pickup.await;
}

/// A pick-up reads a watcher's cursors again once it holds the watcher's turn lock: a turn that
/// acknowledged the notice after the pick-up's first read is not followed by a copy of it.
#[tokio::test]
async fn a_pick_up_does_not_queue_a_notice_a_turn_acknowledged_meanwhile() {
    let mut w = World::gated(Call::Cursors, true).await;
    w.store.hook.armed.store(false, Ordering::SeqCst);
    w.human().await;
    let lost = w.queue.drain(&k(MANAGER));
    assert_eq!(texts(&lost), vec![notice(Sequence(1))], "the queue lost it");

    w.store.hook.armed.store(true, Ordering::SeqCst);
    let svc = Arc::clone(&w.svc);
    let pick_up = tokio::spawn(async move { svc.pick_up().await });
    w.entered
        .recv()
        .await
        .expect("the pick-up has read the pending cursors");
    w.store.hook.armed.store(false, Ordering::SeqCst);
    let read = w.svc.drain_turn(&k(MANAGER)).await;
    assert_eq!(texts(&read), vec![notice(Sequence(1))], "the turn reads it");

    w.open_gate();
    assert_eq!(
        pick_up.await.unwrap(),
        PickUp {
            queued: 0,
            complete: true
        }
    );
    assert!(
        w.queue.peek(&k(MANAGER)).is_empty(),
        "no copy of the acknowledged notice"
    );
    assert_eq!(w.wake.count(&k(MANAGER)), 1, "woken once, by the recording");
}

/// Bug: a change on the target while the turn's acknowledgement was in flight pushed the
/// notice the turn had just read back into the (emptied) queue, and the next turn read it again
/// next to the follow-up.
#[tokio::test]
async fn a_change_during_the_acknowledgement_is_not_read_twice() {
    let mut w = World::new().await;
    let first = w.human().await;
    assert_eq!(first, Sequence(2));

    let a = w.turn();
    w.entered.recv().await.expect("turn A acknowledges");
    let later = w.human().await; // lands while A's acknowledgement waits
    w.store.hook.permits.add_permits(1);
    let read_a = a.await.unwrap();
    assert_eq!(texts(&read_a), vec![notice(Sequence(1))]);
    assert_eq!(
        texts(&w.queue.peek(&k(MANAGER))),
        vec![notice(first)],
        "the copy queued during the acknowledgement is gone; the follow-up waits"
    );

    w.open_gate();
    let read_b = w.svc.drain_turn(&k(MANAGER)).await;
    assert_eq!(
        texts(&read_b),
        vec![notice(first)],
        "only the follow-up: the notice turn A consumed is not delivered again"
    );
    let c = w.cursor().await;
    assert_eq!((c.last_seen, c.notified, c.material), (later, later, later));
    assert!(w.queue.peek(&k(MANAGER)).is_empty());
}

/// Bug: a second turn of the same watcher, started while the first one's acknowledgement was
/// in flight, re-queued and read the same notice, and its own acknowledgement then moved
/// `last_seen` over a newer notice no turn had read: after a restart that notice was lost.
#[tokio::test]
async fn concurrent_turns_of_one_watcher_read_each_notice_once_and_lose_none() {
    let mut w = World::new().await;
    w.human().await; // notice: changesSince 1

    let a = w.turn();
    w.entered.recv().await.expect("turn A acknowledges");
    let b = w.turn();
    for _ in 0..8 {
        // Turn B runs as far as it can while A's acknowledgement waits.
        tokio::task::yield_now().await;
    }
    w.store.hook.permits.add_permits(1); // A's acknowledgement (the first waiting) commits
    let read_a = a.await.unwrap();
    let second = w.human().await; // notice: changesSince 2
    w.open_gate();
    let read_b = b.await.unwrap();

    // A restart: the in-memory queue is gone, the sweep re-delivers whatever is pending.
    w.queue.inner.clear();
    w.svc.sweep().await;
    let read_c = w.svc.drain_turn(&k(MANAGER)).await;

    let mut read: Vec<String> = [read_a, read_b, read_c]
        .iter()
        .flat_map(|lines| texts(lines))
        .collect();
    read.sort();
    assert_eq!(
        read,
        vec![notice(Sequence(1)), notice(Sequence(2))],
        "each notice read by exactly one turn, none lost by the restart"
    );
    let c = w.cursor().await;
    assert_eq!(
        (c.last_seen, c.notified, c.material),
        (second, second, second)
    );
}

/// Bug: a recording that committed before a turn's acknowledgement but delivered its notice
/// only after the turn ended queued a copy of the notice the turn had read, and the next turn
/// read it again (it acknowledged nothing, but the watcher was told twice).
#[tokio::test]
async fn a_notice_delivered_after_its_acknowledgement_is_not_read_again() {
    let w = World::new().await;
    w.open_gate();
    w.human().await;
    let read = w.svc.drain_turn(&k(MANAGER)).await;
    assert_eq!(texts(&read), vec![notice(Sequence(1))]);
    let acknowledged = w.cursor().await;
    // The late delivery, and an unrelated line beside it.
    assert!(w.queue.enqueue(&k(MANAGER), read[0].clone()));
    let other = QueuedEntry {
        text: "Reminder: standup at 10".into(),
        context_key: None,
    };
    assert!(w.queue.enqueue(&k(MANAGER), other.clone()));
    let again = w.svc.drain_turn(&k(MANAGER)).await;
    assert_eq!(
        again,
        vec![other],
        "the stale notice is left out, the rest is read"
    );
    assert_eq!(
        w.cursor().await,
        acknowledged,
        "and it acknowledged nothing"
    );
    assert!(w.queue.peek(&k(MANAGER)).is_empty());
}

/// Drops a turn or a recording, as a gateway's timeout would.
async fn dropped<T: std::fmt::Debug>(task: tokio::task::JoinHandle<T>) {
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
}

/// Bug: a turn dropped (a gateway's turn timeout) once its acknowledgement had committed lost
/// the notice for good: the queue was drained and the cursor acknowledged, and no turn ever
/// showed it. The next turn now shows what the dropped one had read.
#[tokio::test]
async fn a_turn_dropped_after_its_acknowledgement_leaves_its_lines_to_the_next_turn() {
    let mut w = World::gated(Call::Acknowledge, true).await;
    let first = w.human().await;
    let a = w.turn_at_the_gate().await;
    dropped(a).await;
    w.open_gate();
    settle().await;
    let c = w.cursor().await;
    assert_eq!(
        c.last_seen, first,
        "the dropped turn's acknowledgement committed"
    );
    let read = w.svc.drain_turn(&k(MANAGER)).await;
    assert_eq!(
        texts(&read),
        vec![notice(Sequence(1))],
        "the notice the dropped turn had read"
    );
    assert!(w.svc.drain_turn(&k(MANAGER)).await.is_empty(), "shown once");
}

/// What a dropped turn settled on (its acknowledgement committed) goes to the next turn even
/// when that turn cannot read the cursors (decision 0003): returning only the lines nobody had
/// read yet passed every other test, and the notice, acknowledged, was never shown.
#[tokio::test]
async fn a_turn_that_cannot_read_the_cursors_still_shows_what_a_dropped_turn_settled_on() {
    let w = World::with_a_dropped_turn().await;
    let exec = w.queue_an_exec_line();
    *w.store.hook.refuse_at.lock().unwrap() = Some(Call::Cursors);
    let mut read = texts(&w.svc.drain_turn(&k(MANAGER)).await);
    read.sort();
    let mut want = vec![notice(Sequence(1)), exec.text];
    want.sort();
    assert_eq!(
        read, want,
        "the dropped turn's notice and the queued line, though the cursors could not be read"
    );
    *w.store.hook.refuse_at.lock().unwrap() = None;
    assert!(
        w.svc.drain_turn(&k(MANAGER)).await.is_empty(),
        "shown once: nothing carried on, nothing pending"
    );
}

/// Bug: a turn dropped while it read the cursors lost the other lines it had drained from the
/// queue (the notices came back from the cursors, the rest did not). They come first at the next
/// turn, in the order they were queued, before the lines queued since. (What the mutation did:
/// the lines drained now put ahead of those the dropped turn had taken; review of stop 66,
/// SV513.)
#[tokio::test]
async fn a_turn_dropped_while_reading_the_cursors_loses_no_queued_line() {
    let mut w = World::gated(Call::Cursors, false).await;
    w.human().await;
    let earlier = w.queue_an_exec_line();
    let a = w.turn_at_the_gate().await;
    dropped(a).await;
    w.open_gate();
    let later = QueuedEntry {
        text: "Cron finished: nightly backup".into(),
        context_key: None,
    };
    assert!(w.queue.enqueue(&k(MANAGER), later.clone()));
    let read = texts(&w.svc.drain_turn(&k(MANAGER)).await);
    assert_eq!(
        read,
        vec![notice(Sequence(1)), earlier.text, later.text],
        "what the dropped turn had drained, none lost, then the line queued since"
    );
}

/// Bug: a recording dropped once the store had committed it never queued its notice nor woke
/// the manager: the change sat in the cursor until the manager took a turn for another reason.
#[tokio::test]
async fn a_recording_dropped_after_its_commit_still_delivers_and_wakes() {
    let mut w = World::gated(Call::Record, true).await;
    let svc = Arc::clone(&w.svc);
    let recording = tokio::spawn(async move { svc.human_message(human_message()).await });
    w.entered.recv().await.expect("the recording committed");
    dropped(recording).await;
    w.open_gate();
    settle().await;
    assert_eq!(texts(&w.queue.peek(&k(MANAGER))), vec![notice(Sequence(1))]);
    assert_eq!(w.wake.count(&k(MANAGER)), 1, "the manager was woken");
}

/// Bug: a turn dropped while its acknowledgement was in flight released the watcher's turn
/// lock at once, so the next turn read the cursors and acknowledged while that
/// acknowledgement still ran, and acknowledged the follow-up it queued, which no turn showed.
/// The dropped turn's acknowledgement now keeps the lock until it ends.
#[tokio::test]
async fn a_turn_after_a_dropped_one_waits_for_its_acknowledgement() {
    let mut w = World::new().await;
    let first = w.human().await; // notice: changesSince 1
    let a = w.turn_at_the_gate().await;
    let later = w.human().await; // lands while A's acknowledgement waits
    dropped(a).await;
    let b = w.turn();
    settle().await;
    w.store.hook.permits.add_permits(1); // the first acknowledgement to reach the gate commits
    settle().await;
    w.open_gate();
    let read_b = texts(&b.await.unwrap());
    let read_c = texts(&w.svc.drain_turn(&k(MANAGER)).await);
    let mut read: Vec<String> = read_b.into_iter().chain(read_c).collect();
    read.sort();
    assert_eq!(
        read,
        vec![notice(Sequence(1)), notice(first)],
        "each notice shown once, the follow-up of the dropped turn's acknowledgement included"
    );
    let c = w.cursor().await;
    assert_eq!((c.last_seen, c.notified, c.material), (later, later, later));
}

/// Bug: a turn acknowledged whatever notice its cursor showed when the acknowledgement
/// committed. The manager was reset and spawned the worker again while its turn's
/// acknowledgement waited, and the worker changed: the turn's acknowledgement consumed that new
/// notice, which no turn had read, and the next turn dropped its queued line as stale.
#[tokio::test]
async fn a_notice_that_came_after_a_reset_during_the_turn_stays_for_the_next_turn() {
    let mut w = World::new().await;
    w.human().await;
    let a = w.turn_at_the_gate().await; // it read "changesSince 1"
    w.svc.on_reset(&k(MANAGER)).await;
    w.svc
        .subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-2")
        .await
        .expect("seeded again");
    let seeded = w.cursor().await.last_seen;
    let changed = w.human().await;
    assert_eq!(
        texts(&w.queue.peek(&k(MANAGER))),
        vec![notice(seeded)],
        "the new notice is queued behind the turn"
    );
    w.open_gate();
    assert_eq!(texts(&a.await.unwrap()), vec![notice(Sequence(1))]);
    let c = w.cursor().await;
    assert_eq!(
        (c.last_seen, c.notified, c.material),
        (seeded, changed, changed),
        "the notice the turn did not read is still pending"
    );
    assert_eq!(
        texts(&w.svc.drain_turn(&k(MANAGER)).await),
        vec![notice(seeded)],
        "and the next turn reads it"
    );
    let c = w.cursor().await;
    assert_eq!((c.last_seen, c.notified), (changed, changed));
}

/// Bug: a reset while a turn held the watcher's lock, its cursor read not made yet, marked the
/// watcher for the next turn to drop what a dropped turn left; the turn then read and
/// acknowledged a notice of a watch made after the reset, and was dropped once its
/// acknowledgement had committed: the next turn dropped that notice, which no turn showed
/// (its queued copy is stale once acknowledged). A reset now drops only what was taken before
/// it began.
#[tokio::test]
async fn a_notice_read_after_a_reset_by_a_turn_that_is_then_dropped_is_not_lost() {
    let mut w = World::gated(Call::Cursors, false).await;
    let a = w.turn_at_the_gate().await; // holds the lock, has drained the (empty) queue
    w.svc.on_reset(&k(MANAGER)).await;
    w.svc
        .subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-2")
        .await
        .expect("seeded again");
    let seeded = w.cursor().await.last_seen;
    let changed = w.human().await;
    *w.store.hook.at.lock().unwrap() = (Call::Acknowledge, true);
    w.store.hook.permits.add_permits(1); // the read goes on; the acknowledgement commits
    w.entered
        .recv()
        .await
        .expect("the acknowledgement committed");
    dropped(a).await;
    w.open_gate();
    settle().await;
    let c = w.cursor().await;
    assert_eq!(
        (c.last_seen, c.notified),
        (changed, changed),
        "acknowledged"
    );
    assert_eq!(
        texts(&w.svc.drain_turn(&k(MANAGER)).await),
        vec![notice(seeded)],
        "the next turn shows what the dropped one read"
    );
}

/// Bug: a turn whose acknowledgement's task failed (the store panicked) returned nothing, and
/// what it had read waited for the watcher's next turn, which nothing woke. It returns what it
/// read.
#[tokio::test]
async fn a_turn_whose_acknowledgement_panics_still_returns_what_it_read() {
    let w = World::new().await;
    *w.store.hook.at.lock().unwrap() = (Call::Unwatch, false); // no gate on this path
    w.store.hook.panic_on_ack.store(true, Ordering::SeqCst);
    w.human().await;
    let other = w.queue_an_exec_line();
    let mut read = texts(&w.svc.drain_turn(&k(MANAGER)).await);
    read.sort();
    let mut want = vec![notice(Sequence(1)), other.text];
    want.sort();
    assert_eq!(read, want);
    w.store.hook.panic_on_ack.store(false, Ordering::SeqCst);
    w.turn_shows_the_first_notice(
        "the notice, still pending, is shown again; the other line is not",
    )
    .await;
}

/// A turn whose acknowledgement panicked waits for its lock to take back what it read; should
/// a turn that came meanwhile have taken those lines over and shown them (its own
/// acknowledgement outlasting the store wait), the first turn shows nothing, whether it has the
/// lock again or gives up waiting for it (three store waits). (What the mutations did: the
/// first turn returned the lines all the same, and the notice was shown twice; once it had the
/// lock, review of stop 64, SV21; once it gave up, review of stop 65, SW30.)
#[tokio::test(start_paused = true)]
async fn lines_a_later_turn_showed_while_an_acknowledgement_panicked_are_not_shown_again() {
    for gate_opens in [true, false] {
        let mut w = World::new().await;
        w.human().await;
        w.store.hook.panic_next_ack.store(true, Ordering::SeqCst);
        let first = w.turn();
        let second = w.turn();
        w.entered
            .recv()
            .await
            .expect("the second turn's acknowledgement reaches the gate");
        assert_eq!(
            texts(&second.await.unwrap()),
            vec![notice(Sequence(1))],
            "the second turn took the lines over and showed them as its store wait ran out"
        );
        if gate_opens {
            w.open_gate();
        }
        let first = first.await.unwrap();
        assert!(
            first.is_empty(),
            "gate opens {gate_opens}: the first turn shows nothing the second showed: {:?}",
            texts(&first)
        );
        w.open_gate();
        w.svc.wait_for_writes().await;
        assert!(!w.cursor().await.is_pending(), "acknowledged by the second");
    }
}

/// Bug: a main session's turn dropped once its acknowledgement had committed left what it
/// read to the next turn, but nothing woke the session for it: no cursor was pending any more
/// for a pick-up to find, and a main session takes no turn until woken, so the notice waited
/// for a turn taken for another reason. Then (review, stop 53) the wake was paid only by a
/// pick-up that found the turn's lock free; one made while the dropped turn's acknowledgement
/// still held it (committed, not yet ended) passed it over and said it was complete, and the
/// pick-up task then asked nothing more until the recovery interval. The acknowledgement now
/// pays it as it lets the lock go, once: a pick-up then owes it nothing.
#[tokio::test]
async fn a_wake_a_dropped_turn_owes_is_paid_when_its_acknowledgement_ends() {
    let (w, before) = World::with_a_turn_dropped_at_its_answer().await;
    // The acknowledgement committed and holds the lock, at the gate.
    w.pick_up_wakes(0, "the lock is held").await;
    w.open_gate();
    w.svc.wait_for_writes().await;
    assert_eq!(
        w.wake.count(&k(MANAGER)),
        before + 1,
        "woken as the acknowledgement let the lock go"
    );
    w.pick_up_wakes(0, "once").await;
    w.turn_shows_the_first_notice("the woken turn shows it")
        .await;
}

/// A reset after a dropped turn owes a pick-up nothing: what the turn left is gone.
#[tokio::test]
async fn a_reset_after_a_dropped_turn_owes_nothing() {
    let mut w = World::with_a_dropped_turn_armed().await;
    w.drop_a_turn_at(Call::Cursors).await;
    w.svc.on_reset(&k(MANAGER)).await;
    w.pick_up_wakes(0, "the reset dropped what it left").await;
}

/// The wake a dropped turn's lines are owed survives a second turn dropped before it settles
/// on them (while it reads the cursors, as a slow store makes likely): it forgot the debt, and
/// the lines waited again for a turn taken for another reason.
#[tokio::test]
async fn a_wake_owed_survives_a_second_dropped_turn() {
    let mut w = World::with_a_dropped_turn_armed().await;
    w.drop_a_turn_at(Call::Cursors).await;
    w.pick_up_wakes(1, "woken for the lines").await;
    w.turn_shows_the_first_notice("the lines").await;
}

/// A wake paid is owed again when the turn it brought is dropped too, before it settles on
/// the lines (a slow store drops both): the debt was paid, so nothing woke the session for the
/// lines a second time, and they waited for a turn taken for another reason.
#[tokio::test]
async fn a_wake_is_owed_again_when_the_turn_it_brought_is_dropped_too() {
    let mut w = World::with_a_dropped_turn_armed().await;
    w.pick_up_wakes(0, "woken for the lines as the acknowledgement ended")
        .await;
    // The woken turn, dropped while it reads the cursors.
    w.drop_a_turn_at(Call::Cursors).await;
    w.pick_up_wakes(1, "owed again").await;
    w.turn_shows_the_first_notice("the lines").await;
}

/// A reset drops the session-state lines a dropped turn left, and the wake they were owed with
/// them: what is left (an exec's line) wakes nobody. A pick-up woke the session "for
/// session-state" with an exec's line alone.
#[tokio::test]
async fn a_reset_takes_the_wake_owed_with_the_notices() {
    let mut w = World::gated(Call::Acknowledge, true).await;
    w.human().await;
    let exec = w.queue_an_exec_line();
    let turn = w.turn_at_the_gate().await;
    dropped(turn).await;
    w.open_gate();
    settle().await;
    assert!(
        !w.cursor().await.is_pending(),
        "the dropped turn's acknowledgement committed"
    );
    w.svc.on_reset(&k(MANAGER)).await;
    w.pick_up_wakes(0, "nothing that wakes is left").await;
    assert_eq!(texts(&w.svc.drain_turn(&k(MANAGER)).await), vec![exec.text]);
}

/// The same with the wake still owed when the reset comes (the turn the first wake brought
/// was dropped too): the reset takes it. In the test above the wake was paid before the
/// reset, and keeping the debt through the reset passed every test.
#[tokio::test]
async fn a_reset_takes_a_wake_owed_again_with_the_notices() {
    let (mut w, exec) = World::with_an_exec_line_left_and_woken().await;
    w.drop_a_turn_at(Call::Cursors).await;
    w.svc.on_reset(&k(MANAGER)).await;
    w.pick_up_wakes(0, "the wake owed again went with the notice")
        .await;
    assert_eq!(texts(&w.svc.drain_turn(&k(MANAGER)).await), vec![exec.text]);
}

/// A reset drops the session-state lines a dropped turn left, and with them whether what is left
/// wakes: a turn that takes the exec's line left over and is dropped too owes no wake for it. (With
/// `read_wakes` kept through the reset, the pick-up woke the manager "for session-state" with the
/// exec's line alone: review of stop 62, A04.)
#[tokio::test]
async fn a_turn_dropped_after_a_reset_owes_no_wake_for_what_the_reset_left() {
    let (mut w, exec) = World::with_an_exec_line_left_and_woken().await;
    w.svc.on_reset(&k(MANAGER)).await;
    // The next turn takes the exec's line over, and is dropped while it reads the cursors.
    w.drop_a_turn_at(Call::Cursors).await;
    w.pick_up_wakes(0, "the exec's line the reset left wakes nobody")
        .await;
    assert_eq!(texts(&w.svc.drain_turn(&k(MANAGER)).await), vec![exec.text]);
}

/// `wait_for_writes` waits for the writes started before it was called, and not for one started
/// after, even when an earlier one is still running when the later one starts (with the mark taken
/// as "after" only past the next write's number, it waited for the write started right after the
/// call, here one the store never answers: review of stop 62, A12).
#[tokio::test(start_paused = true)]
async fn wait_for_writes_waits_for_no_write_started_after_it() {
    let mut w = World::gated(Call::Record, false).await;
    let event = |summary: &str| {
        awareness_core::NewEvent::new(
            SessionRef::parse(CHILD, "main").unwrap(),
            awareness_core::EventKind::Compacted,
            awareness_core::ActorType::System,
            summary,
        )
    };
    let svc = Arc::clone(&w.svc);
    let before = event("before");
    let first = tokio::spawn(async move { svc.try_record(before).await });
    w.entered
        .recv()
        .await
        .expect("the first recording reached the store");
    let svc = Arc::clone(&w.svc);
    let waiting = tokio::spawn(async move { svc.wait_for_writes().await });
    settle().await;
    let svc = Arc::clone(&w.svc);
    let after = event("after");
    let _second = tokio::spawn(async move { svc.try_record(after).await });
    w.entered
        .recv()
        .await
        .expect("the second recording reached the store");
    // The first recording is answered; the second never is.
    w.store.hook.permits.add_permits(1);
    first.await.unwrap().expect("the first recording committed");
    within_an_hour(waiting)
        .await
        .expect("wait_for_writes ended once the write started before it had");
}

/// An adoption answers its `adopted` event whether the store answers at once (the write's task
/// has ended before the caller looks at the link's answer) or later, within `store_wait`. (With
/// the event dropped on either path, `awareness adopt` said the event was not recorded when it
/// was: review of stop 62, A28, for the later answer; review of stop 71, SE47, for the one at
/// once, the usual case.)
#[tokio::test]
async fn an_adoption_answers_its_event_recorded_after_its_link() {
    let adopted = SessionRef::parse("agent:ops:main", "ops").unwrap();
    let spec = LinkSpec::new(adopted.clone(), "remote", "h", "t", "paired-node");
    let at_once = common::world()
        .svc
        .try_adopt_recorded(spec.clone())
        .await
        .expect("adopted");
    let event = at_once
        .event
        .expect("the adopted event, recorded with the link, is answered");
    assert_eq!(event.kind, awareness_core::EventKind::Adopted);
    assert_eq!(event.session_ref(), adopted);
    let mut w = World::gated(Call::Record, false).await;
    let svc = Arc::clone(&w.svc);
    let adoption = tokio::spawn(async move { svc.try_adopt_recorded(spec).await });
    w.entered
        .recv()
        .await
        .expect("the adopted event reached the store");
    w.store.hook.permits.add_permits(1);
    let adoption = adoption.await.unwrap().expect("adopted");
    let event = adoption
        .event
        .expect("the adopted event, recorded within store_wait, is answered");
    assert_eq!(event.kind, awareness_core::EventKind::Adopted);
    assert_eq!(event.session_ref(), adopted);
}

/// A reset made while a dropped turn's acknowledgement holds the watcher's lock, with the next
/// turn waiting for that lock: the lock goes straight to the waiting turn (neither the
/// acknowledgement letting it go nor a pick-up finds it free), and that turn, taking it, drops
/// the lines the reset marked: it shows no notice of the watch the reset removed. (A review of
/// stop 55 removed that drop at the taking of the lock, and every test passed.)
#[tokio::test]
async fn a_reset_while_an_acknowledgement_holds_the_lock_drops_its_lines_for_the_waiting_turn() {
    let (w, _) = World::with_a_turn_dropped_at_its_answer().await;
    let next = w.turn();
    settle().await;
    assert!(!next.is_finished(), "the next turn waits for the lock");
    w.svc.on_reset(&k(MANAGER)).await;
    w.open_gate();
    let shown = texts(&next.await.expect("the next turn"));
    assert!(
        shown.is_empty(),
        "the reset removed the watch: no notice of it is shown, got {shown:?}"
    );
}

/// A reset made while a dropped turn's acknowledgement holds the watcher's lock takes the wake
/// that turn owed: the acknowledgement, letting the lock go, wakes nobody for lines the reset
/// dropped. (A review of stop 55 removed the drop before that wake, and every test passed.)
#[tokio::test]
async fn a_reset_while_an_acknowledgement_holds_the_lock_takes_the_wake_owed() {
    let (w, before) = World::with_a_turn_dropped_at_its_answer().await;
    w.svc.on_reset(&k(MANAGER)).await;
    w.open_gate();
    w.svc.wait_for_writes().await;
    assert_eq!(
        w.wake.count(&k(MANAGER)),
        before,
        "no wake for notices the reset dropped"
    );
    assert!(texts(&w.svc.drain_turn(&k(MANAGER)).await).is_empty());
}

/// A wake for a dropped turn's lines that panics leaves the wake owed, whether the
/// acknowledgement that let the lock go or a pick-up tried it: the debt was cleared before the
/// wake was tried, and no later pick-up woke the session, which takes no turn unless woken.
#[tokio::test]
async fn a_wake_owed_that_panics_is_owed_to_the_next_pick_up() {
    let (mut w, before) = World::with_a_turn_dropped_at_its_answer().await;
    w.wake.panic_next.store(true, Ordering::SeqCst);
    // The acknowledgement's answer returns; the gate stays armed, with no permit left.
    w.store.hook.permits.add_permits(1);
    w.svc.wait_for_writes().await;
    assert_eq!(w.wake.count(&k(MANAGER)), before, "the wake panicked");
    // The woken turn of a pick-up, dropped while it reads the cursors: owed again.
    w.pick_up_wakes(1, "woken at the next pick-up").await;
    w.drop_a_turn_at(Call::Cursors).await;
    w.wake.panic_next.store(true, Ordering::SeqCst);
    assert!(!w.svc.pick_up().await.complete, "the wake panicked");
    assert_eq!(w.wake.count(&k(MANAGER)), before + 1);
    w.pick_up_wakes(1, "woken at the next one").await;
}

/// A pick-up that queues a dropped turn's notices again (its acknowledgement failed, so they
/// are still pending) wakes the session for them once: it woke it a second time for the
/// lines the dropped turn left, the same notices.
#[tokio::test]
async fn a_pick_up_wakes_once_for_a_dropped_turns_notices_still_pending() {
    let mut w = World::gated(Call::Acknowledge, false).await;
    w.human().await;
    let turn = w.turn_at_the_gate().await;
    dropped(turn).await;
    *w.store.hook.refuse_at.lock().unwrap() = Some(Call::Acknowledge);
    w.open_gate();
    settle().await;
    assert!(w.cursor().await.is_pending(), "the acknowledgement failed");
    w.pick_up_wakes(1, "woken once").await;
}

/// Bug (race review, stop 53): a reset that began before a turn took what a dropped turn had
/// left, and committed after that turn was dropped while it read the cursors, kept those
/// lines: the turn stamped them anew as taken by it, and a reset drops only lines taken before
/// it began. The next turn showed a notice of a watch the reset removed, and a pick-up woke the
/// session for it. Lines taken over keep the stamp of the turn that first took them.
#[tokio::test]
async fn a_reset_racing_a_turn_that_takes_a_dropped_turns_lines_still_drops_them() {
    let mut w = World::with_a_dropped_turn_armed().await;
    // The reset begins (it is numbered), its store write held at the gate.
    *w.store.hook.at.lock().unwrap() = (Call::ResetWatcher, false);
    let reset = {
        let svc = Arc::clone(&w.svc);
        tokio::spawn(async move { svc.try_on_reset(&k(MANAGER)).await })
    };
    w.entered.recv().await.expect("the reset reaches the gate");
    // A turn takes the dropped one's lines, and is dropped while it reads the cursors.
    *w.store.hook.at.lock().unwrap() = (Call::Cursors, false);
    let turn = w.turn_at_the_gate().await;
    dropped(turn).await;
    // The reset commits.
    w.store.hook.armed.store(false, Ordering::SeqCst);
    w.store.hook.permits.add_permits(1);
    assert_eq!(reset.await.expect("the reset's task").expect("reset"), 1);
    w.pick_up_wakes(0, "nothing left that wakes").await;
    assert!(
        texts(&w.svc.drain_turn(&k(MANAGER)).await).is_empty(),
        "no notice of the watch the reset removed"
    );
}

/// What a dropped turn left for the next one goes with the watcher's watches when it is reset:
/// the next turn does not show notices of watches that no longer exist.
#[tokio::test]
async fn a_reset_drops_what_a_dropped_turn_left() {
    let w = World::with_a_dropped_turn().await;
    w.svc.on_reset(&k(MANAGER)).await;
    assert_eq!(
        texts(&w.svc.drain_turn(&k(MANAGER)).await),
        Vec::<String>::new()
    );
}

/// Bug: a reset whose caller gave up once the store had it (a host's own timeout around
/// `on_reset`, which `store_wait` does not bound) left what a dropped turn had left: the store
/// removed the watches, but what came after the write in the caller's future (dropping the
/// dropped turn's lines) never ran, and the next turn showed a notice of a watch the reset
/// had removed. The write and its clean-up now run to their end together.
#[tokio::test]
async fn a_reset_whose_caller_gives_up_still_drops_what_a_dropped_turn_left() {
    let mut w = World::gated(Call::Acknowledge, true).await;
    w.human().await;
    let a = w.turn_at_the_gate().await;
    dropped(a).await;
    w.store.hook.permits.add_permits(1); // the dropped turn's acknowledgement goes on
    settle().await;
    *w.store.hook.at.lock().unwrap() = (Call::ResetWatcher, true);
    let svc = Arc::clone(&w.svc);
    let reset = tokio::spawn(async move { svc.on_reset(&k(MANAGER)).await });
    w.entered.recv().await.expect("the reset reaches the store");
    dropped(reset).await;
    w.open_gate();
    settle().await;
    assert_eq!(
        texts(&w.svc.drain_turn(&k(MANAGER)).await),
        Vec::<String>::new(),
        "the reset committed: its watches, and what the dropped turn left of them, are gone"
    );
}

/// Bug: a message into the worker from another session (an agent) or from the gateway itself
/// (system input) was recorded as a `human_direct_message` and told the manager another actor
/// changed the worker: OpenClaw records only a person's message as that kind (its actor
/// classification is what decides), and so now does this service. A person's message still
/// is recorded and notifies.
#[tokio::test]
async fn only_a_persons_message_is_recorded_as_a_human_turn() {
    let w = World::new().await;
    for (actor_type, actor_id) in [
        (ActorType::Agent, Some("agent:ops:main".to_owned())),
        (ActorType::System, None),
    ] {
        let mut msg = human_message();
        msg.actor_type = actor_type;
        msg.actor_id = actor_id;
        let recorded = w.svc.human_message_recorded(msg).await;
        assert!(
            matches!(recorded, gateway_adapter::HumanRecorded::NotHuman),
            "{actor_type}: {recorded:?}"
        );
    }
    assert!(w.queue.peek(&k(MANAGER)).is_empty(), "nobody told");
    let log = w.store.events_after(Sequence::ZERO, 10).await.unwrap();
    assert_eq!(log.len(), 1, "only the spawn: {log:?}");
    assert!(w.svc.human_message(human_message()).await.is_some());
    assert_eq!(texts(&w.queue.peek(&k(MANAGER))), vec![notice(Sequence(1))]);
}

/// A message that stands for no human turn (`turns` 0, a caller's mistake) is refused: it was
/// recorded as a human turn like any other and notified the manager (review, stop 57).
#[tokio::test]
async fn a_message_of_no_turns_is_not_recorded() {
    let w = World::new().await;
    let mut msg = human_message();
    msg.turns = 0;
    let recorded = w.svc.human_message_recorded(msg).await;
    assert!(
        matches!(recorded, gateway_adapter::HumanRecorded::NoTurns),
        "{recorded:?}"
    );
    assert!(w.queue.peek(&k(MANAGER)).is_empty(), "nobody told");
    let log = w.store.events_after(Sequence::ZERO, 10).await.unwrap();
    assert_eq!(log.len(), 1, "only the spawn: {log:?}");
}

/// Bug: an unwatch the wait for the store gave up on was dropped with its caller, while a
/// watch given up on goes on (its wake must not be lost): a watch then an unwatch, both given
/// up on a slow store, could leave the session watched against the caller's last word. An
/// unwatch given up on now goes on too, and removes the watch once the store answers.
#[tokio::test]
async fn an_unwatch_given_up_on_still_removes_the_watch() {
    let mut w = World::gated_with(
        Call::Unwatch,
        false,
        AwarenessConfig {
            store_wait: Duration::from_millis(50),
            ..AwarenessConfig::default()
        },
    )
    .await;
    let unwatch = {
        let svc = Arc::clone(&w.svc);
        tokio::spawn(async move { svc.unwatch(&k(MANAGER), &k(CHILD)).await })
    };
    w.entered
        .recv()
        .await
        .expect("the unwatch reaches the store");
    assert!(!unwatch.await.unwrap(), "given up on: said as not made");
    w.open_gate();
    settle().await;
    let cursor = w
        .store
        .cursor(&WatcherKey::parse(MANAGER).unwrap(), &k(CHILD))
        .await
        .unwrap();
    assert!(
        cursor.is_none(),
        "the watch is gone once the store answered: {cursor:?}"
    );
}

/// Bug: a deletion whose caller gave up once the store had it left the deleted watcher's
/// session-state notices in its queue for good (no turn of it drains them), with its turn
/// lock's lines: the clean-up after the write ran in the caller's future. It now runs with
/// the write.
#[tokio::test]
async fn a_deletion_whose_caller_gives_up_still_takes_its_notices_out_of_the_queue() {
    let mut w = World::gated(Call::DeleteSession, true).await;
    w.human().await;
    assert!(
        w.queue
            .peek(&k(MANAGER))
            .iter()
            .any(QueuedEntry::is_session_state),
        "a notice is queued for the manager"
    );
    let svc = Arc::clone(&w.svc);
    let delete = tokio::spawn(async move {
        svc.on_delete(&SessionRef::parse(MANAGER, "main").unwrap())
            .await;
    });
    w.entered
        .recv()
        .await
        .expect("the deletion reaches the store");
    dropped(delete).await;
    w.open_gate();
    settle().await;
    let left = w.queue.peek(&k(MANAGER));
    assert!(
        !left.iter().any(QueuedEntry::is_session_state),
        "the deleted watcher's notices went with it: {left:?}"
    );
}

/// Bug: a reset dropped everything a dropped turn left, the gateway's other system events (an
/// exec's, a cron's) included, which have nothing to do with the watches a reset removes. It
/// drops only the session-state notices now, whether the turn was dropped before it had
/// classified what it drained (while it read the cursors) or after it had settled on what to
/// show (once its acknowledgement committed).
#[tokio::test]
async fn a_reset_keeps_the_other_system_events_a_dropped_turn_drained() {
    // The third case: the next turn fails to read the cursors and shows its lines unclassified,
    // still without the notice the reset dropped. (What the mutation did: the reset kept the
    // session-state lines the dropped turn had drained but not classified, and that turn showed
    // the notice of a watch the reset removed; review of stop 66, SV532.)
    for (gate, after, unread) in [
        (Call::Cursors, false, false),
        (Call::Acknowledge, true, false),
        (Call::Cursors, false, true),
    ] {
        let at = (gate, after, unread);
        let mut w = World::gated(gate, after).await;
        w.human().await;
        let other = w.queue_an_exec_line();
        assert_eq!(
            w.queue.peek(&k(MANAGER)).len(),
            2,
            "a notice and another line"
        );
        let a = w.turn_at_the_gate().await;
        dropped(a).await;
        w.open_gate();
        settle().await;
        w.svc.on_reset(&k(MANAGER)).await;
        if unread {
            *w.store.hook.refuse_at.lock().unwrap() = Some(Call::Cursors);
        }
        assert_eq!(
            texts(&w.svc.drain_turn(&k(MANAGER)).await),
            vec![other.text],
            "{at:?}: the notice went with the watch, the other line stays"
        );
    }
}

/// What a dropped turn left stays while the watches it is about stay: deleting the manager's
/// key under another agent (whose cursors are not the manager's) and a reset the store fails
/// keep it for the next turn. Both dropped it, and those notices had been acknowledged.
#[tokio::test]
async fn what_a_dropped_turn_left_stays_while_its_watches_stay() {
    let w = World::with_a_dropped_turn().await;
    w.svc
        .on_delete(&SessionRef::parse(MANAGER, "ops").unwrap())
        .await;
    w.turn_shows_the_first_notice("another agent's session of the key was deleted")
        .await;
    let w = World::with_a_dropped_turn().await;
    w.store.hook.refuse_resets.store(true, Ordering::SeqCst);
    w.svc.on_reset(&k(MANAGER)).await;
    w.turn_shows_the_first_notice("the reset failed").await;
}

/// A wake that panics after a recording committed (the gateway's heartbeat runner failing)
/// does not make the recording look failed: the caller would record it again. The line is
/// taken back out of the queue (a pick-up would otherwise take it for delivered, woken), and
/// the watcher's next turn reads the notice from its cursor.
#[tokio::test]
async fn a_panicking_wake_does_not_fail_a_committed_recording() {
    let (svc, queue) = over_a_panicking_wake();
    svc.subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
        .await
        .expect("seeded");
    let recorded = svc.human_message(human_message()).await;
    assert!(recorded.is_some(), "the committed recording is reported");
    assert!(queue.peek(&k(MANAGER)).is_empty(), "taken back");
    assert_eq!(
        texts(&svc.drain_turn(&k(MANAGER)).await),
        vec![notice(Sequence(1))]
    );
}

/// `Awareness::deliver` takes the line whose wake panicked back out, then lets the panic go on
/// to its caller, as its doc says: a host that calls it learns that the wake failed. (Swallowed,
/// the call returned as if the session had been woken, and every test passed: review of stop
/// 62, A34.)
#[test]
fn deliver_lets_a_wakes_panic_go_on_to_its_caller() {
    let (svc, queue) = over_a_panicking_wake();
    let notice = awareness_core::Notice {
        watcher: WatcherKey::parse(MANAGER).unwrap(),
        target: k(CHILD),
        target_agent: awareness_core::AgentId::new("main").unwrap(),
        last_seen: Sequence(4),
        queue_only: false,
    };
    let delivered =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| svc.deliver(&[notice])));
    assert!(delivered.is_err(), "the wake's panic goes on to the caller");
    assert!(
        queue.peek(&k(MANAGER)).is_empty(),
        "its line was taken back out"
    );
}

/// A wake that panics at every call (the gateway's heartbeat runner failing).
struct Panicking;

impl HeartbeatWake for Panicking {
    fn wake(&self, _: &SessionKey, _: &str) {
        panic!("the heartbeat runner failed");
    }
}

/// A service over a new memory store whose wakes panic ([`Panicking`]), and its queue.
fn over_a_panicking_wake() -> (Awareness, Arc<InMemoryQueue>) {
    let queue = Arc::new(InMemoryQueue::new());
    let svc = Awareness::builder(
        Arc::new(MemoryStore::new()),
        queue.clone(),
        Arc::new(Panicking),
        Arc::new(InMemoryDirectory::new()),
    )
    .build();
    (svc, queue)
}

/// A wake that panics for one watcher costs the others nothing: with two main sessions
/// watching the worker and the wake failing at its first call, the other watcher's line is
/// queued and its session woken, and only the failed one's line is taken back.
#[tokio::test]
async fn a_wake_that_panics_for_one_watcher_still_delivers_to_the_others() {
    struct FirstPanics(std::sync::Mutex<Vec<SessionKey>>);
    impl HeartbeatWake for FirstPanics {
        fn wake(&self, session: &SessionKey, _: &str) {
            let mut woken = self.0.lock().unwrap();
            woken.push(session.clone());
            if woken.len() == 1 {
                drop(woken);
                panic!("the heartbeat runner failed");
            }
        }
    }
    let store = Arc::new(MemoryStore::new());
    let queue = Arc::new(InMemoryQueue::new());
    let wake = Arc::new(FirstPanics(std::sync::Mutex::default()));
    let svc = Awareness::builder(
        store.clone(),
        queue.clone(),
        wake.clone(),
        Arc::new(InMemoryDirectory::new()),
    )
    .build();
    svc.subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
        .await
        .expect("seeded");
    let child = SessionRef::parse(CHILD, "main").unwrap();
    store
        .watch(
            &WatcherKey::parse("agent:main:other").unwrap(),
            &child,
            awareness_core::Timestamp::now(),
        )
        .await
        .unwrap();
    assert!(svc.human_message(human_message()).await.is_some());
    let woken = wake.0.lock().unwrap().clone();
    assert_eq!(woken.len(), 2, "both watchers' wakes were tried: {woken:?}");
    assert!(
        queue.peek(&woken[0]).is_empty(),
        "the failed wake's line taken back"
    );
    assert_eq!(
        texts(&queue.peek(&woken[1])),
        vec![notice(Sequence(1))],
        "the other watcher's line queued"
    );
}

/// Decision 0003 and DESIGN.md "Delivery": decoding a context key is strict, so a line queued
/// under a broken `session-state:` key is no notice. The turn reads it as it was queued (it is
/// not left out as a stale notice), it acknowledges no cursor, and it does not stand in for the
/// notice whose text it carries: that notice is shown too.
#[tokio::test]
async fn a_line_under_a_malformed_session_state_key_is_read_and_acknowledges_nothing() {
    let store = Arc::new(MemoryStore::new());
    let (svc, queue, _) = common::service(store.clone(), None);
    svc.subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
        .await
        .expect("seeded");
    let cursor = async || {
        store
            .cursor(&WatcherKey::parse(MANAGER).unwrap(), &k(CHILD))
            .await
            .unwrap()
            .expect("the manager watches the worker")
    };
    let seeded = cursor().await;
    let good = awareness_core::protocol::context_key(&k(CHILD));
    let hex = good.strip_prefix("session-state:").unwrap();
    let line = |text: &str, key: String| QueuedEntry {
        text: text.to_owned(),
        context_key: Some(key),
    };
    let broken = vec![
        // The worker's key in uppercase hex, carrying the text of its notice.
        line(
            &notice(Sequence(1)),
            format!("session-state:{}", hex.to_uppercase()),
        ),
        line("an odd number of digits", format!("session-state:{hex}6")),
        line("not UTF-8", "session-state:ff".into()),
        line("no target", "session-state:".into()),
    ];
    for e in &broken {
        assert!(queue.enqueue(&k(MANAGER), e.clone()));
    }
    assert_eq!(
        svc.drain_turn(&k(MANAGER)).await,
        broken,
        "every line under a broken key is read, as it was queued"
    );
    assert_eq!(cursor().await, seeded, "and no cursor moved");
    assert!(svc.drain_turn(&k(MANAGER)).await.is_empty(), "read once");

    // A pending notice lost from the queue, with only a broken copy of its text queued: the turn
    // reads both, and the acknowledgement is the real notice's.
    let first = svc
        .human_message(human_message())
        .await
        .expect("recorded")
        .sequence;
    queue.clear();
    assert!(queue.enqueue(&k(MANAGER), broken[0].clone()));
    assert_eq!(
        svc.drain_turn(&k(MANAGER)).await,
        vec![broken[0].clone(), line(&notice(Sequence(1)), good)]
    );
    let c = cursor().await;
    assert_eq!((c.last_seen, c.notified, c.material), (first, first, first));
}

/// `call`, which must end within an hour of the test's paused clock: a turn that waits for a
/// store that never answers fails the test instead of hanging it.
async fn within_an_hour<T>(call: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_hours(1), call)
        .await
        .expect("the call went on without the store")
}

/// A pick-up whose read of the cursors hangs gives up after `AwarenessConfig::store_wait`, as a
/// turn's read does, and answers not complete (nothing queued), whether the read of every
/// pending cursor hangs or the read of one watcher's cursors (made holding that watcher's turn
/// lock, which it then lets go of): it does not hold the pick-up task, and the watcher's turns,
/// for as long as the store hangs. (What the mutations did: each read waited with no bound;
/// review of stop 66, SV527 and SV528.)
#[tokio::test(start_paused = true)]
async fn a_pick_up_whose_cursor_reads_hang_gives_up() {
    for watchers_read in [false, true] {
        let mut w = World::gated(Call::Cursors, false).await;
        w.human().await;
        let mut reads = vec!["every pending cursor"];
        if watchers_read {
            // The line is lost from the queue: the pick-up has it to queue again. The read of
            // every pending cursor answers; the watcher's own read then hangs.
            assert_eq!(w.queue.drain(&k(MANAGER)).len(), 1);
            w.store.hook.permits.add_permits(1);
            reads.push("the watcher's cursors");
        }
        let picked = within_an_hour(w.svc.pick_up()).await;
        assert_eq!(
            picked,
            PickUp {
                queued: 0,
                complete: false
            },
            "the pick-up gave up on the read of {} and said so",
            reads[reads.len() - 1]
        );
        for read in reads {
            w.entered.recv().await.expect(read);
        }
    }
}

/// Bug: a store that hung on the read of the pending cursors held the watcher's turn until the
/// gateway's own timeout dropped it, and every later turn the same: the manager could not act
/// at all. After `AwarenessConfig::store_wait`, the turn shows what it drained and
/// acknowledges nothing.
#[tokio::test(start_paused = true)]
async fn a_turn_whose_cursor_read_hangs_shows_its_queued_lines() {
    let mut w = World::gated(Call::Cursors, false).await;
    let first = w.human().await;
    let other = w.queue_an_exec_line();
    let mut read = texts(&within_an_hour(w.svc.drain_turn(&k(MANAGER))).await);
    read.sort();
    let mut want = vec![notice(Sequence(1)), other.text];
    want.sort();
    assert_eq!(read, want, "the turn showed its queued lines");
    w.entered.recv().await.expect("the turn reached the store");
    // The next turn waits for the store again, and goes on again.
    assert!(
        within_an_hour(w.svc.drain_turn(&k(MANAGER)))
            .await
            .is_empty()
    );
    w.open_gate();
    let c = w.cursor().await;
    assert_eq!(
        (c.last_seen, c.notified),
        (Sequence(1), first),
        "nothing acknowledged"
    );
    w.turn_shows_the_first_notice(
        "the notice is shown again once the store answers, and acknowledged then",
    )
    .await;
    assert_eq!(w.cursor().await.last_seen, first);
}

/// Bug: a store whose writes hung (an fsync that never returned) held the turn in its
/// acknowledgement, and the next turns behind its lock. Now the turn shows what it read once
/// `AwarenessConfig::store_wait` has passed; the next turn shows the lines queued for it
/// without waiting for the lock for good; and once the acknowledgement commits, nothing the
/// first turn showed is shown again, nor is the session woken for it (the wake a turn dropped
/// while it acknowledges would owe is not owed by one that showed what it read: paid all the
/// same, as it was with that condition left out and every other test passing, it woke the
/// session for lines it had seen).
#[tokio::test(start_paused = true)]
async fn a_turn_whose_acknowledgement_hangs_shows_what_it_read_once() {
    let mut w = World::new().await;
    let first = w.human().await;
    let woken = w.wake.count(&k(MANAGER));
    let turn = w.turn_at_the_gate().await;
    assert_eq!(
        texts(&within_an_hour(turn).await.expect("the turn")),
        vec![notice(Sequence(1))],
        "what the turn read"
    );
    let other = w.queue_an_exec_line();
    assert_eq!(
        within_an_hour(w.svc.drain_turn(&k(MANAGER))).await,
        [other],
        "the next turn, behind the acknowledgement's lock"
    );
    w.open_gate();
    settle().await;
    assert_eq!(
        w.cursor().await.last_seen,
        first,
        "the acknowledgement committed"
    );
    assert_eq!(
        w.wake.count(&k(MANAGER)),
        woken,
        "no wake for what the turn showed"
    );
    assert!(
        w.svc.drain_turn(&k(MANAGER)).await.is_empty(),
        "what the first turn showed is not shown again"
    );
}

/// Bug: the tools a model calls in its turn (`session_status`, `sessions_list`'s versions, a
/// watch or an unwatch) waited for a store that hung as long as it hung, holding the turn, as a
/// notice tells the model to call `session_status` at once. Each is now answered as a failure
/// of the store after `AwarenessConfig::store_wait`: unavailable, no version, refused, false.
#[tokio::test(start_paused = true)]
async fn the_tools_of_a_turn_give_up_on_a_store_that_hangs() {
    let w = World::gated(Call::Heads, false).await;
    let manager = k(MANAGER);
    let child = SessionRef::parse(CHILD, "main").unwrap();
    let wait = AwarenessConfig::default().store_wait;
    let gate = |call| *w.store.hook.at.lock().unwrap() = (call, false);
    let started = tokio::time::Instant::now();
    let status =
        within_an_hour(
            w.svc
                .session_status(&manager, &k(CHILD), None, Some(Sequence::ZERO), None),
        )
        .await
        .expect("visible");
    assert_eq!(
        status,
        awareness_core::SessionStatus::unavailable(Some(Sequence::ZERO))
    );
    assert_eq!(started.elapsed(), wait, "one wait");
    assert!(
        within_an_hour(w.svc.state_versions(&manager, std::slice::from_ref(&child)))
            .await
            .is_empty(),
        "no version read"
    );
    // A bare key: which agent's session is meant is read from the requester's cursor.
    gate(Call::Cursor);
    let status = within_an_hour(
        w.svc
            .session_status(&manager, &k("global"), None, None, None),
    )
    .await
    .expect("visible");
    assert_eq!(status, awareness_core::SessionStatus::unavailable(None));
    gate(Call::Watch);
    let watched =
        within_an_hour(
            w.svc
                .watch_after_send(&manager, &k("agent:main:subagent:b"), None, true),
        )
        .await;
    assert_eq!(
        watched.refused,
        Some(gateway_adapter::WatchRefusal::StoreFailed)
    );
    gate(Call::Unwatch);
    assert!(!within_an_hour(w.svc.unwatch(&manager, &k(CHILD))).await);
    // Once the store answers, every tool does again; the unwatch given up on went on, and
    // removed the watch.
    w.open_gate();
    settle().await;
    assert!(
        w.store
            .cursor(&WatcherKey::parse(MANAGER).unwrap(), &k(CHILD))
            .await
            .unwrap()
            .is_none(),
        "the unwatch given up on was made"
    );
    let watched = w
        .svc
        .watch_after_send(&manager, &k(CHILD), None, true)
        .await;
    assert!(watched.watched, "{watched:?}");
    assert!(
        w.svc.unwatch(&manager, &k(CHILD)).await,
        "the watch was there"
    );
}

/// The read a watch makes first (whether it makes an ambient cursor explicit) is optional: a
/// store whose reads hang but whose writes answer still registers the watch, the read given
/// up at half the wait. It could take the whole wait, and the watch then failed.
#[tokio::test(start_paused = true)]
async fn a_watch_whose_optional_read_hangs_is_still_made() {
    let w = World::gated(Call::Cursor, false).await;
    let target = k("agent:main:subagent:other");
    let started = tokio::time::Instant::now();
    let watched = within_an_hour(w.svc.watch_after_send(&k(MANAGER), &target, None, true)).await;
    assert!(watched.watched, "{watched:?}");
    assert_eq!(started.elapsed(), AwarenessConfig::default().store_wait / 2);
}

/// A tool that asks the store several things waits for it `store_wait` in all, not at each:
/// `sessions_list`'s versions, read a batch at a time, gave a store that hung a wait per batch.
#[tokio::test(start_paused = true)]
async fn a_tool_that_reads_in_batches_waits_for_a_hung_store_once() {
    let config = AwarenessConfig {
        list_batch: 1,
        ..AwarenessConfig::default()
    };
    let w = World::gated_with(Call::Heads, false, config).await;
    let refs: Vec<SessionRef> = ["a", "b", "c"]
        .iter()
        .map(|s| SessionRef::parse(&format!("agent:main:subagent:{s}"), "main").unwrap())
        .collect();
    let started = tokio::time::Instant::now();
    assert!(
        within_an_hour(w.svc.state_versions(&k(MANAGER), &refs))
            .await
            .is_empty()
    );
    assert_eq!(started.elapsed(), AwarenessConfig::default().store_wait);
}

/// Bug: a best-effort producer waited for a store that hung as long as it hung, holding the
/// gateway's handling of the message. It answers `None` after `AwarenessConfig::store_wait`;
/// the recording goes on, and when it commits its notice is delivered and the manager woken.
#[tokio::test(start_paused = true)]
async fn a_recording_that_hangs_gives_up_waiting_and_still_delivers() {
    let mut w = World::gated(Call::Record, false).await;
    assert!(
        within_an_hour(w.svc.human_message(human_message()))
            .await
            .is_none(),
        "not recorded yet"
    );
    w.entered
        .recv()
        .await
        .expect("the recording reached the store");
    assert!(w.queue.peek(&k(MANAGER)).is_empty());
    w.open_gate();
    settle().await;
    assert_eq!(texts(&w.queue.peek(&k(MANAGER))), vec![notice(Sequence(1))]);
    assert_eq!(w.wake.count(&k(MANAGER)), 1, "the manager was woken");
}

/// A recording the store has not answered within the wait is logged as not recorded *yet*, with
/// the reason, since it goes on and may commit; only one that failed is logged as not recorded.
/// (What the mutation did: the recording given up on logged as "not recorded", as a failure;
/// review of stop 66, SV508.)
#[tokio::test(start_paused = true)]
async fn a_recording_given_up_on_is_logged_as_not_recorded_yet() {
    let capture = Capture::default();
    let _logging = capture.install();
    let mut w = World::gated(Call::Record, false).await;
    assert!(
        within_an_hour(w.svc.human_message(human_message()))
            .await
            .is_none()
    );
    w.entered
        .recv()
        .await
        .expect("the recording reached the store");
    assert_eq!(
        capture.said(&[
            "session-state event not recorded yet",
            "the recording goes on"
        ]),
        1,
        "the recording given up on is said to go on: {:?}",
        capture.lines()
    );
    w.open_gate();
    settle().await;
}

/// Bug: with a store that hangs, every best-effort producer's call left one more task holding
/// its event for as long as the store hung, without limit. Past
/// `AwarenessConfig::max_pending_writes` outstanding writes, a recording or an acknowledgement
/// outside a turn is refused at once, as busy (retryable), and a turn's acknowledgement or a
/// sweep is not; the outstanding recordings commit and deliver when the store answers, and the
/// next one is made.
#[tokio::test(start_paused = true)]
async fn writes_a_hung_store_has_not_answered_are_capped() {
    let config = AwarenessConfig {
        max_pending_writes: 2,
        ..AwarenessConfig::default()
    };
    let mut w = World::gated_with(Call::Record, false, config).await;
    // One recording the store answers (the manager has a notice pending), then two it does
    // not: as many as may be outstanding.
    for answered in [true, false, false] {
        if answered {
            w.store.hook.permits.add_permits(1);
        }
        let recorded = within_an_hour(w.svc.human_message(human_message())).await;
        assert_eq!(recorded.is_some(), answered);
        w.entered
            .recv()
            .await
            .expect("the recording reached the store");
    }
    let started = tokio::time::Instant::now();
    let refused = w.svc.human_message_recorded(human_message()).await;
    assert_eq!(
        started.elapsed(),
        std::time::Duration::ZERO,
        "refused at once"
    );
    let gateway_adapter::HumanRecorded::Failed(why) = refused else {
        panic!("expected a failure, got {refused:?}");
    };
    assert!(why.contains("max_pending_writes"), "{why}");
    let event = awareness_core::NewEvent::new(
        SessionRef::parse(CHILD, "main").unwrap(),
        awareness_core::EventKind::Compacted,
        awareness_core::ActorType::System,
        "compacted",
    );
    let busy = w.svc.try_record(event.clone()).await.unwrap_err();
    assert!(
        matches!(busy, StoreError::Busy { .. }) && busy.is_retryable(),
        "{busy:?}"
    );
    // An acknowledgement outside a turn is refused too; a sweep is not.
    let refused = w.svc.try_acknowledge(&k(MANAGER), &[k(CHILD)]).await;
    assert!(
        matches!(refused, Err(StoreError::Busy { .. })),
        "{refused:?}"
    );
    assert!(w.svc.acknowledge(&k(MANAGER), &[k(CHILD)]).await.is_empty());
    assert!(
        w.cursor().await.is_pending(),
        "acknowledge was refused as well"
    );
    // So are a watch, an unwatch, a reset, a deletion and an adoption: each goes on, once
    // begun, for as long as the store takes.
    let other = "agent:ops:main";
    let watch = w
        .svc
        .watch_after_send(&k(other), &k(CHILD), None, true)
        .await;
    assert!(!watch.watched, "{watch:?}");
    let unwatch = w.svc.try_unwatch(&k(MANAGER), &k(CHILD)).await;
    assert!(
        matches!(unwatch, Err(StoreError::Busy { .. })),
        "{unwatch:?}"
    );
    let reset = w.svc.try_on_reset(&k(other)).await;
    assert!(matches!(reset, Err(StoreError::Busy { .. })), "{reset:?}");
    let deleted = w
        .svc
        .try_on_delete(&SessionRef::parse(other, "ops").unwrap())
        .await;
    assert!(
        matches!(deleted, Err(StoreError::Busy { .. })),
        "{deleted:?}"
    );
    assert!(
        w.store
            .cursor(&WatcherKey::parse(other).unwrap(), &k(CHILD))
            .await
            .unwrap()
            .is_none(),
        "no watch was made"
    );
    // And an adoption: neither its link nor its `adopted` event is written.
    let adopted = SessionRef::parse(other, "ops").unwrap();
    let adoption = w
        .svc
        .try_adopt(LinkSpec::new(
            adopted.clone(),
            "remote",
            "h",
            "t",
            "paired-node",
        ))
        .await;
    assert!(
        matches!(adoption, Err(StoreError::Busy { .. })),
        "{adoption:?}"
    );
    assert!(
        w.links.link(&adopted).await.unwrap().is_none(),
        "no link was made"
    );
    assert_eq!(
        w.svc.try_sweep().await.expect("swept"),
        1,
        "the sweep is made: it re-delivers the pending notice"
    );
    // A turn's acknowledgement is made: refused, its notice would be shown at every turn.
    let shown = within_an_hour(w.svc.drain_turn(&k(MANAGER))).await;
    assert_eq!(texts(&shown), vec![notice(Sequence(1))]);
    assert!(!w.cursor().await.is_pending(), "the turn acknowledged it");
    w.open_gate();
    settle().await;
    assert_eq!(
        texts(&w.queue.peek(&k(MANAGER))),
        vec![notice(Sequence(2))],
        "the outstanding recordings committed and delivered their notice (once)"
    );
    let events = w
        .store
        .events_after(Sequence::ZERO, 10)
        .await
        .unwrap()
        .iter()
        .map(|e| e.kind.clone())
        .collect::<Vec<_>>();
    assert_eq!(
        events,
        [
            awareness_core::EventKind::ChildSpawned,
            awareness_core::EventKind::HumanDirectMessage,
            awareness_core::EventKind::HumanDirectMessage,
            awareness_core::EventKind::HumanDirectMessage,
        ],
        "both outstanding recordings committed, nothing refused did"
    );
    let made = within_an_hour(w.svc.try_record(event)).await.expect("made");
    assert_eq!(made.event.sequence, Sequence(5), "nothing refused was made");
}

/// The question whether an unlinked session has a watcher, and the recording after it, wait
/// for the store `AwarenessConfig::store_wait` in all: a store that hangs on the question costs
/// the producer one wait, the turn is recorded all the same, and its notice delivered.
#[tokio::test(start_paused = true)]
async fn a_question_for_watchers_that_hangs_still_records_the_turn() {
    let mut w = World::gated(Call::Cursors, false).await;
    // No entry, and the directory does not know the worker: nothing names its spawner.
    let msg = HumanMessage::new(k(CHILD));
    let started = tokio::time::Instant::now();
    assert!(
        within_an_hour(w.svc.human_message(msg)).await.is_none(),
        "not recorded within the wait"
    );
    assert_eq!(
        started.elapsed(),
        AwarenessConfig::default().store_wait,
        "one wait for the question and the recording"
    );
    w.entered
        .recv()
        .await
        .expect("the question reached the store");
    settle().await;
    assert_eq!(texts(&w.queue.peek(&k(MANAGER))), vec![notice(Sequence(1))]);
}

/// A turn that waits for the watcher's lock gives up only after three store waits: the turn
/// holding it may wait for the store twice (its read, its acknowledgement), each within
/// `AwarenessConfig::store_wait`, and is not a store that hangs. Giving up sooner, the waiting
/// turn showed a late copy of a notice the first turn read, unclassified: shown twice. The
/// holder here takes 19 s of its two waits of 10 s, nearly the most a holder can take: a
/// waiting turn that gave up within two waits minus a second fails this test (one within
/// three waits but after two cannot be told from the right one by a holder that answers).
#[tokio::test(start_paused = true)]
async fn a_turn_waits_out_a_slow_turn_that_holds_the_lock() {
    let mut w = World::gated(Call::Cursors, false).await;
    w.human().await;
    let copy = w.queue.peek(&k(MANAGER));
    assert_eq!(texts(&copy), vec![notice(Sequence(1))]);
    let first = w.turn_at_the_gate().await;
    *w.store.hook.at.lock().unwrap() = (Call::Acknowledge, false);
    // Delivered late, while the first turn runs.
    assert!(w.queue.enqueue(&k(MANAGER), copy[0].clone()));
    let second = w.turn();
    let slow = std::time::Duration::from_millis(9_500);
    assert!(slow < AwarenessConfig::default().store_wait);
    tokio::time::sleep(slow).await;
    w.store.hook.permits.add_permits(1); // the read answers
    w.entered
        .recv()
        .await
        .expect("the acknowledgement reaches the store");
    tokio::time::sleep(slow).await;
    w.store.hook.permits.add_permits(1); // the acknowledgement answers
    assert_eq!(
        texts(&within_an_hour(first).await.expect("first turn")),
        vec![notice(Sequence(1))]
    );
    assert!(
        within_an_hour(second)
            .await
            .expect("second turn")
            .is_empty(),
        "the late copy is not shown again"
    );
}

/// Bug: a host queue that panicked while the turn took back the copies of what it had read,
/// after its acknowledgement committed, lost what the turn had read: the notice was
/// acknowledged, out of the queue, and shown by no turn. The next turn now shows it, once.
#[tokio::test]
async fn a_queue_that_panics_after_the_acknowledgement_loses_no_notice() {
    let w = World::new().await;
    w.open_gate();
    let first = w.human().await;
    w.queue.panic_on_remove.store(true, Ordering::SeqCst);
    assert!(
        w.turn().await.expect_err("the queue panicked").is_panic(),
        "the turn met the host's panic"
    );
    w.queue.panic_on_remove.store(false, Ordering::SeqCst);
    assert_eq!(w.cursor().await.last_seen, first, "acknowledged");
    w.turn_shows_the_first_notice("the next turn shows what the failed one read")
        .await;
    assert!(w.svc.drain_turn(&k(MANAGER)).await.is_empty(), "once");
}

/// Bug: a turn whose host queue panicked in its drain had already taken what a dropped turn
/// left for it, and lost it: notices the dropped turn had acknowledged were shown by no turn.
#[tokio::test]
async fn a_queue_that_panics_in_its_drain_keeps_what_a_dropped_turn_left() {
    let w = World::with_a_dropped_turn().await;
    w.queue.panic_on_drain.store(true, Ordering::SeqCst);
    assert!(
        w.turn().await.expect_err("the queue panicked").is_panic(),
        "the turn met the host's panic"
    );
    w.queue.panic_on_drain.store(false, Ordering::SeqCst);
    w.turn_shows_the_first_notice("the next turn shows what the dropped one read")
        .await;
}

/// Bug: a recording or an acknowledgement that failed (or panicked) after its caller had
/// stopped waiting for it (`AwarenessConfig::store_wait`) was logged by no one: the caller had
/// logged only that the write went on. The write's task now logs the failure once, with the
/// write and its session; a failure its caller waits for is logged by the caller alone.
#[tokio::test(start_paused = true)]
async fn a_write_that_fails_after_its_caller_gave_up_is_logged() {
    /// How the write ends once its caller has stopped waiting.
    #[derive(Clone, Copy, Debug)]
    enum End {
        Refused,
        Panics,
    }
    for (call, end, what, session, cause) in [
        (
            Call::Record,
            End::Refused,
            "record",
            CHILD,
            "disk I/O error",
        ),
        (
            Call::Acknowledge,
            End::Refused,
            "acknowledge",
            MANAGER,
            "disk I/O error",
        ),
        (
            Call::Acknowledge,
            End::Panics,
            "acknowledge",
            MANAGER,
            "the write panicked",
        ),
    ] {
        let capture = Capture::default();
        let _logging = capture.install();
        let mut w = World::gated(call, false).await;
        if call == Call::Record {
            assert!(
                within_an_hour(w.svc.human_message(human_message()))
                    .await
                    .is_none(),
                "the caller stopped waiting"
            );
        } else {
            w.human().await;
            let turn = within_an_hour(w.turn()).await.expect("the turn");
            assert_eq!(
                texts(&turn),
                vec![notice(Sequence(1))],
                "the turn stopped waiting and showed what it read"
            );
        }
        w.entered.recv().await.expect("the write reached the store");
        match end {
            End::Refused => *w.store.hook.refuse_at.lock().unwrap() = Some(call),
            End::Panics => w.store.hook.panic_on_ack.store(true, Ordering::SeqCst),
        }
        w.open_gate();
        w.svc.wait_for_writes().await;
        let lines = capture.lines();
        let failed: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains("its caller had stopped waiting"))
            .collect();
        assert_eq!(failed.len(), 1, "{what} {end:?}: {lines:#?}");
        for part in [what, session, cause, "level=WARN"] {
            assert!(
                failed[0].contains(part),
                "{what} {end:?}: {part} in {}",
                failed[0]
            );
        }
    }

    // A failure its caller waits for is the caller's to log, once.
    let capture = Capture::default();
    let _logging = capture.install();
    let w = World::gated(Call::Record, false).await;
    *w.store.hook.refuse_at.lock().unwrap() = Some(Call::Record);
    w.open_gate();
    assert!(w.svc.human_message(human_message()).await.is_none());
    w.svc.wait_for_writes().await;
    let lines = capture.lines();
    let count = |text: &str| lines.iter().filter(|l| l.contains(text)).count();
    assert_eq!(count("disk I/O error"), 1, "{lines:#?}");
    assert_eq!(count("session-state event not recorded"), 1, "{lines:#?}");

    // The same for a turn's acknowledgement, which the turn waits for: it shows what it read,
    // the notice stays pending for the next turn, and the failure is warned of once, with the
    // watcher and the cause (that warning could be dropped without a test failing: review of
    // stop 60).
    let capture = Capture::default();
    let _logging = capture.install();
    let w = World::gated(Call::Acknowledge, false).await;
    *w.store.hook.refuse_at.lock().unwrap() = Some(Call::Acknowledge);
    w.open_gate();
    w.human().await;
    assert_eq!(
        texts(&w.svc.drain_turn(&k(MANAGER)).await),
        vec![notice(Sequence(1))]
    );
    w.svc.wait_for_writes().await;
    assert!(w.cursor().await.is_pending(), "nothing acknowledged");
    assert_eq!(
        capture.said(&[
            "acknowledge failed; the notices stay pending",
            MANAGER,
            "disk I/O error",
            "level=WARN"
        ]),
        1,
        "{:#?}",
        capture.lines()
    );
    assert_eq!(
        capture.said(&["disk I/O error"]),
        1,
        "{:#?}",
        capture.lines()
    );
    *w.store.hook.refuse_at.lock().unwrap() = None;
    w.turn_shows_the_first_notice("shown again, and acknowledged now")
        .await;
    assert!(!w.cursor().await.is_pending());
}

/// `Awareness::on_delete` of a watcher takes the session-state notices queued for it out of
/// its queue, which no turn would drain; the gateway's own lines stay, for the gateway. A
/// deletion of another agent's session of the key takes nothing.
#[tokio::test]
async fn deleting_a_watcher_takes_its_notices_out_of_its_queue() {
    let w = World::new().await;
    w.human().await;
    let other = w.queue_an_exec_line();
    assert_eq!(w.queue.peek(&k(MANAGER)).len(), 2);
    w.svc
        .on_delete(&SessionRef::parse(MANAGER, "ops").unwrap())
        .await;
    assert_eq!(
        w.queue.peek(&k(MANAGER)).len(),
        2,
        "another agent's session of the key"
    );
    // A deletion the store refused takes nothing either: the watches are still there.
    *w.store.hook.refuse_at.lock().unwrap() = Some(Call::DeleteSession);
    let manager = SessionRef::parse(MANAGER, "main").unwrap();
    w.svc.on_delete(&manager).await;
    assert_eq!(w.queue.peek(&k(MANAGER)).len(), 2, "the deletion failed");
    *w.store.hook.refuse_at.lock().unwrap() = None;
    w.svc.on_delete(&manager).await;
    assert_eq!(
        w.queue.peek(&k(MANAGER)),
        vec![other],
        "the gateway's line stays"
    );
}

/// Bug: a pick-up that had read a watcher's pending cursors before the watcher was deleted
/// queued their line after the deletion had cleaned its queue: a session-state line stayed for
/// the process's life in a queue no turn drains. The deletion cleans the queue once the
/// pick-up has let go of the watcher's lock.
#[tokio::test]
async fn a_pick_up_overlapping_a_deletion_leaves_no_line_in_the_deleted_watchers_queue() {
    let mut w = World::gated(Call::Cursors, true).await;
    w.human().await;
    // The manager's line is lost from the queue: the pick-up will queue it again.
    assert_eq!(w.svc.take_queued(&k(MANAGER)).len(), 1);
    let svc = Arc::clone(&w.svc);
    let pick_up = tokio::spawn(async move { svc.pick_up().await });
    // The pending cursors of every watcher, then the manager's under its lock, each answered
    // by the store; the second is held at the gate, its answer from before the deletion.
    w.entered
        .recv()
        .await
        .expect("the pick-up lists the pending cursors");
    w.store.hook.permits.add_permits(1);
    w.entered
        .recv()
        .await
        .expect("the pick-up reads the manager's cursors");
    let delete = w.delete_the_manager();
    settle().await;
    // The deletion committed before the pick-up's line is queued, and waits for its lock.
    assert!(
        w.store
            .inner
            .cursors(&CursorFilter {
                watcher: Some(k(MANAGER)),
                ..CursorFilter::default()
            })
            .await
            .unwrap()
            .is_empty(),
        "the deletion committed"
    );
    assert!(!delete.is_finished(), "the deletion waits for the pick-up");
    w.open_gate();
    pick_up.await.expect("the pick-up ends");
    delete.await.expect("the deletion ends").expect("deleted");
    assert_eq!(
        w.queue.peek(&k(MANAGER)),
        Vec::<QueuedEntry>::new(),
        "no line for the deleted watcher"
    );
}

/// A deletion of a watcher waits for its lock as a turn waits for it, three store waits: an
/// acknowledgement of the watcher that committed before the deletion holds the lock for as
/// long as the store takes to answer (its turn stops waiting after one), and queues its
/// follow-up for the deleted watcher when it returns, which the deletion then takes out of
/// the queue. (A deletion waiting one store wait passed every other test, and the follow-up
/// stayed queued for the process's life.) The clock is tokio's paused one.
#[tokio::test(start_paused = true)]
async fn a_deletion_waits_three_store_waits_for_an_acknowledgement_holding_the_lock() {
    let mut w = World::new().await;
    w.human().await;
    let turn = w.turn_at_the_gate().await;
    // A change the acknowledgement will not cover: its answer carries a follow-up.
    w.human().await;
    // The acknowledgement commits now, and its answer is held at the gate.
    *w.store.hook.at.lock().unwrap() = (Call::Acknowledge, true);
    w.store.hook.permits.add_permits(1);
    w.entered
        .recv()
        .await
        .expect("the acknowledgement committed");
    let delete = w.delete_the_manager();
    let store_wait = AwarenessConfig::default().store_wait;
    tokio::time::sleep(store_wait * 2).await;
    assert_eq!(
        texts(&turn.await.expect("the turn")),
        vec![notice(Sequence(1))],
        "the turn stopped waiting for its acknowledgement and showed what it read"
    );
    assert!(
        !delete.is_finished(),
        "two store waits in, the deletion still waits for the lock"
    );
    w.open_gate();
    delete.await.expect("the deletion ends").expect("deleted");
    // The acknowledgement's task, done by now, whichever let go first.
    settle().await;
    assert_eq!(
        w.queue.peek(&k(MANAGER)),
        Vec::<QueuedEntry>::new(),
        "the acknowledgement's follow-up for the deleted watcher is taken out"
    );
}

/// A deletion of a watcher that gives up waiting for its lock (a dropped turn's acknowledgement
/// holds it, its answer held for longer than three store waits) still drops all that dropped turn
/// left, the other system events (an exec's) with its notices: the deleted session's next turn,
/// under a new session of the key, shows none of it. (Marking only the notices to go, as a reset
/// does, passed every other test: review of stop 62, S18.)
#[tokio::test(start_paused = true)]
async fn a_deletion_that_gives_up_on_the_lock_still_drops_all_a_dropped_turn_left() {
    let mut w = World::gated(Call::Acknowledge, true).await;
    w.human().await;
    let exec = w.queue_an_exec_line();
    let a = w.turn_at_the_gate().await;
    dropped(a).await;
    // The acknowledgement committed; its answer, held at the gate, holds the lock.
    let delete = w.delete_the_manager();
    delete
        .await
        .expect("the deletion ends, having given up on the lock")
        .expect("deleted");
    w.open_gate();
    settle().await;
    let shown = texts(&w.svc.drain_turn(&k(MANAGER)).await);
    assert!(
        !shown.contains(&exec.text) && shown.is_empty(),
        "the deleted session's dropped turn left nothing for the next turn, got {shown:?}"
    );
}

/// A directory that knows the manager, and panics at the next question while armed (a host's
/// directory with a bug).
#[derive(Default)]
struct PanicsNext {
    inner: InMemoryDirectory,
    armed: AtomicBool,
}

impl gateway_adapter::SessionDirectory for PanicsNext {
    fn exists(&self, s: &SessionKey) -> bool {
        assert!(
            !self.armed.swap(false, Ordering::SeqCst),
            "the host's directory failed"
        );
        self.inner.exists(s)
    }
    fn entry(&self, s: &SessionKey) -> Option<SessionEntry> {
        self.inner.entry(s)
    }
}

/// A directory that panics when asked about a session owed a wake (a dropped turn's lines, its
/// acknowledgement letting the lock go) leaves the wake owed to the next pick-up, as a wake that
/// panics does: the session takes no turn unless woken, also when the next pick-up's directory
/// panics on it too (that pick-up is not complete). (The debt dropped at that panic passed
/// every other test, and the session was never woken for the lines: review of stop 62, S25.)
#[tokio::test]
async fn a_wake_owed_whose_directory_panics_is_owed_to_the_next_pick_up() {
    let directory = Arc::new(PanicsNext::default());
    directory.inner.upsert(k(MANAGER), SessionEntry::default());
    let mut w = World::gated_in(
        Call::Acknowledge,
        true,
        AwarenessConfig::default(),
        directory.clone(),
    )
    .await;
    w.human().await;
    let before = w.wake.count(&k(MANAGER));
    let a = w.turn_at_the_gate().await;
    dropped(a).await;
    directory.armed.store(true, Ordering::SeqCst);
    // The acknowledgement's answer returns; it lets the lock go and asks the directory.
    w.store.hook.permits.add_permits(1);
    w.svc.wait_for_writes().await;
    assert!(
        !directory.armed.load(Ordering::SeqCst),
        "the directory was asked, and panicked"
    );
    assert_eq!(w.wake.count(&k(MANAGER)), before, "nobody woken yet");
    // A pick-up whose directory panics on the wake owed owes it again and is not complete, so
    // that the pick-up task asks again at its next question, not at the recovery interval
    // (reported complete, it passed every other test: review of stop 64, SV33).
    directory.armed.store(true, Ordering::SeqCst);
    let picked = w.svc.pick_up().await;
    assert!(
        !directory.armed.load(Ordering::SeqCst),
        "the pick-up asked the directory about the wake owed, and it panicked"
    );
    assert_eq!(w.wake.count(&k(MANAGER)), before, "nobody woken yet");
    assert!(
        !picked.complete,
        "a wake owed that the directory panicked on leaves the pick-up incomplete: {picked:?}"
    );
    w.pick_up_wakes(1, "woken at the next pick-up").await;
    w.turn_shows_the_first_notice("the woken turn shows what the dropped one read")
        .await;
}

/// The read a spawn makes first (whether the seed makes an ambient cursor explicit) is optional, as
/// a watch's is: given up at half the wait, it leaves the recording the other half. A store whose
/// first cursor read hangs (later reads answer) still has the spawn recorded and answered. (What
/// the mutation did: the read took the whole wait, left the recording none, and the spawn was
/// answered as not recorded; review of stop 64, SV10.)
#[tokio::test(start_paused = true)]
async fn a_spawn_whose_optional_read_hangs_is_still_recorded() {
    let mut w = World::gated(Call::Cursor, false).await;
    let svc = Arc::clone(&w.svc);
    let spawn = tokio::spawn(async move {
        svc.subagent_spawned(&k("agent:main:subagent:other"), None, &k(MANAGER), "run-2")
            .await
    });
    w.entered.recv().await.expect("the read reaches the store");
    // Only that read hangs: the spawn's later read of the cursor answers.
    w.store.hook.armed.store(false, Ordering::SeqCst);
    let event = within_an_hour(spawn).await.expect("the spawn's task");
    assert!(
        event.is_some(),
        "the spawn is recorded within store_wait, its optional read given up at half of it"
    );
}

/// A subagent that spawns a subagent is owed no wake, so its spawn asks the store nothing about
/// its cursor: a store whose cursor reads hang still has the nested spawn recorded and answered
/// within the wait. (What the mutation did: the nested spawn read the spawner's cursor before and
/// after the recording, as a main session's does, and was answered as not recorded; review of
/// stop 66, SV511.)
#[tokio::test(start_paused = true)]
async fn a_nested_spawn_asks_nothing_of_a_store_whose_cursor_reads_hang() {
    let mut w = World::gated(Call::Cursor, false).await;
    let svc = Arc::clone(&w.svc);
    let spawn = tokio::spawn(async move {
        svc.subagent_spawned(&k("agent:main:subagent:nested"), None, &k(CHILD), "run-3")
            .await
    });
    let event = within_an_hour(spawn).await.expect("the spawn's task");
    assert!(
        event.is_some(),
        "the nested spawn is recorded and answered, with no read of the spawner's cursor"
    );
    assert!(
        w.entered.try_recv().is_err(),
        "no cursor read reached the store"
    );
}

/// A turn waits three store waits for the watcher's lock, as documented, not two: an
/// acknowledgement of an earlier turn that answers after two and a half waits lets the waiting turn
/// read the cursors, and the late copy of the notice that turn read is not shown twice. (What the
/// mutation did: given up after two waits, the waiting turn showed its queue unclassified, the copy
/// with it; review of stop 64, SV13.)
#[tokio::test(start_paused = true)]
async fn a_turn_waits_three_store_waits_for_the_lock() {
    let mut w = World::gated(Call::Acknowledge, false).await;
    w.human().await;
    let copy = w.queue.peek(&k(MANAGER));
    assert_eq!(texts(&copy), vec![notice(Sequence(1))]);
    let first = w.turn_at_the_gate().await;
    // Delivered late, while the first turn's acknowledgement waits for the store.
    assert!(w.queue.enqueue(&k(MANAGER), copy[0].clone()));
    let second = w.turn();
    let store_wait = AwarenessConfig::default().store_wait;
    tokio::time::sleep(store_wait * 5 / 2).await;
    w.open_gate(); // the acknowledgement answers
    assert_eq!(
        texts(&within_an_hour(first).await.expect("first turn")),
        vec![notice(Sequence(1))]
    );
    assert_eq!(
        texts(&within_an_hour(second).await.expect("second turn")),
        Vec::<String>::new(),
        "the late copy is not shown again"
    );
}

/// `session_status` waits for the store `store_wait` in all, its read of the requester's cursor and
/// its read of the session together: a cursor read that answers late leaves the status read the
/// rest of the wait, not a wait of its own. Answered one and a half waits after the call, the
/// status comes too late and the answer is "unavailable". (What the mutation did: a fresh wait for
/// the second read, holding a turn about twice the store wait; review of stop 64, SV40.)
#[tokio::test(start_paused = true)]
async fn session_status_waits_for_the_store_once_in_all() {
    let mut w = World::gated(Call::Cursor, false).await;
    let svc = Arc::clone(&w.svc);
    let status = tokio::spawn(async move {
        svc.session_status(&k(MANAGER), &k("global"), None, None, None)
            .await
    });
    w.entered
        .recv()
        .await
        .expect("the cursor read reaches the store");
    *w.store.hook.at.lock().unwrap() = (Call::Heads, false);
    let store_wait = AwarenessConfig::default().store_wait;
    tokio::time::sleep(store_wait * 9 / 10).await;
    w.store.hook.permits.add_permits(1); // the cursor read answers, late
    w.entered
        .recv()
        .await
        .expect("the status read reaches the store");
    tokio::time::sleep(store_wait / 2).await;
    w.open_gate();
    let status = within_an_hour(status)
        .await
        .expect("the call's task")
        .expect("visible");
    assert!(
        status.unavailable,
        "given up store_wait after the call, before the store answered: {status:?}"
    );
}

/// A bare key watches nothing, so its turn classifies nothing: a line under a session-state context
/// key that the host queued for it is shown, not dropped as stale for want of a cursor (a bare key
/// has none). (What the mutation did: the line dropped as stale; review of stop 64, SV43.)
#[tokio::test]
async fn a_bare_keys_turn_shows_every_line_it_drains() {
    let (svc, queue, _) = common::service(Arc::new(MemoryStore::new()), None);
    let n = awareness_core::Notice {
        watcher: WatcherKey::parse(MANAGER).unwrap(),
        target: k(CHILD),
        target_agent: awareness_core::AgentId::new("main").unwrap(),
        last_seen: Sequence(0),
        queue_only: false,
    };
    let line = QueuedEntry {
        text: n.text(),
        context_key: Some(n.context_key()),
    };
    assert!(queue.enqueue(&k("global"), line.clone()));
    assert_eq!(
        svc.drain_turn(&k("global")).await,
        vec![line],
        "a bare key's turn shows what it drained"
    );
}

/// A turn that took over the lines a dropped turn left (which wake the manager: a person's message
/// in the worker) and then reads from the cursors only a queue-only notice (an ambient cursor's,
/// OpenClaw's, decision 0015) still owes their wake when it is dropped while acknowledging: nobody
/// has shown them, and a main session takes no turn unless woken. An ambient cursor exists only in
/// OpenClaw's SQLite file: the gated store wraps one. (What the mutation did: only what the cursors
/// gave was owed, nothing, and nothing woke the session to show the lines; review of stop 64,
/// SV18.)
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_turn_that_took_over_waking_lines_owes_their_wake_past_a_queue_only_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut w, group) =
        World::over_an_ambient_cursor(dir.path(), true, AwarenessConfig::default()).await;
    w.human().await;
    let a = w.turn_at_the_gate().await;
    dropped(a).await;
    // A's acknowledgement committed; its answer returns and pays the wake A's lines owe.
    w.store.hook.permits.add_permits(1);
    w.svc.wait_for_writes().await;
    let before = w.wake.count(&k(MANAGER));
    // A change in the group: its notice is queued without a wake.
    w.svc
        .human_message(HumanMessage::new(group.clone()))
        .await
        .expect("recorded");
    assert_eq!(w.wake.count(&k(MANAGER)), before, "a queue-only notice");
    // B takes A's lines over, reads the group's notice and acknowledges it; it is dropped.
    let b = w.turn_at_the_gate().await;
    dropped(b).await;
    w.store.hook.permits.add_permits(1);
    w.svc.wait_for_writes().await;
    assert_eq!(
        w.wake.count(&k(MANAGER)),
        before + 1,
        "the lines B took over and nobody showed are owed their wake"
    );
}

/// Lines a turn showed once it stopped waiting for its acknowledgement are dropped by the turn that
/// next takes the lock, and with them their wake: that turn, reading from the cursors only a
/// queue-only notice (an ambient cursor's, decision 0015) and dropped while acknowledging it, owes
/// no wake, and the manager is not woken for a notice that wakes nobody. The store wait is a real 5
/// s (an ambient cursor exists only in OpenClaw's SQLite file, whose reads a paused clock would
/// time out): the first turn stops waiting then. (What the mutation did: the shown lines' wakes
/// kept, and the manager woken; review of stop 64, SV15.)
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn lines_shown_already_leave_no_wake_to_the_turn_that_drops_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = AwarenessConfig {
        store_wait: Duration::from_secs(5),
        ..AwarenessConfig::default()
    };
    let (mut w, group) = World::over_an_ambient_cursor(dir.path(), false, config).await;
    w.human().await;
    let a = w.turn_at_the_gate().await;
    assert_eq!(
        texts(&within_an_hour(a).await.expect("turn A")),
        vec![notice(Sequence(1))],
        "A stopped waiting for its acknowledgement and showed what it read"
    );
    w.svc
        .human_message(HumanMessage::new(group.clone()))
        .await
        .expect("recorded");
    let before = w.wake.count(&k(MANAGER));
    let b = w.turn();
    w.store.hook.permits.add_permits(1); // A's acknowledgement goes on, and lets the lock go
    w.entered
        .recv()
        .await
        .expect("B acknowledges the group's notice");
    dropped(b).await;
    w.store.hook.permits.add_permits(1);
    w.svc.wait_for_writes().await;
    assert_eq!(
        w.wake.count(&k(MANAGER)),
        before,
        "the group's queue-only notice, all B left, wakes nobody"
    );
}

/// A turn that cannot read the cursors returns what a dropped turn had settled on first, then
/// the lines it drained, as `drain_turn`'s doc says. (What the mutation did: the lines drained
/// now first; review of stop 65, SW23.)
#[tokio::test]
async fn unreadable_cursors_return_the_dropped_turns_lines_first() {
    let w = World::with_a_dropped_turn().await;
    let exec = w.queue_an_exec_line();
    *w.store.hook.refuse_at.lock().unwrap() = Some(Call::Cursors);
    let read = texts(&w.svc.drain_turn(&k(MANAGER)).await);
    assert_eq!(
        read,
        vec![notice(Sequence(1)), exec.text],
        "what the dropped turn settled on comes first, then the lines drained now"
    );
}

/// A notice a turn dropped while reading the cursors had drained, queued again by a pick-up
/// meanwhile, is shown once by the next turn. (What the mutation did: the skip of a line shown
/// already removed, shown twice; review of stop 65, SW26.)
#[tokio::test]
async fn a_notice_drained_twice_is_shown_once() {
    let mut w = World::gated(Call::Cursors, false).await;
    w.human().await;
    w.drop_a_turn_at(Call::Cursors).await;
    // The lock is free: a pick-up queues the pending notice again.
    let picked = w.svc.pick_up().await;
    assert_eq!(picked.queued, 1, "the pick-up queued the notice again");
    w.turn_shows_the_first_notice(
        "the notice, drained by the dropped turn and again now, is shown once",
    )
    .await;
}

/// An adoption whose link is written answers once the store wait is over even while its
/// `adopted` event waits for the store (the event is then `None`). (What the mutation did: the
/// link's answer not sent ahead of the event, the adoption hung as long as the recording;
/// review of stop 65, SW16.)
#[tokio::test(start_paused = true)]
async fn an_adoption_answers_within_store_wait_while_its_event_hangs() {
    let mut w = World::gated(Call::Record, false).await;
    let adopted = SessionRef::parse("agent:ops:main", "ops").unwrap();
    let spec = LinkSpec::new(adopted, "remote", "h", "t", "paired-node");
    let svc = Arc::clone(&w.svc);
    let adoption = tokio::spawn(async move { svc.try_adopt_recorded(spec).await });
    w.entered
        .recv()
        .await
        .expect("the adopted event reached the store");
    let wait = AwarenessConfig::default().store_wait;
    let answered = tokio::time::timeout(wait * 3, adoption).await;
    w.open_gate();
    let adoption = answered
        .expect("the adoption answers once store_wait is over, its event still held")
        .unwrap()
        .expect("adopted: the link is written");
    assert!(
        adoption.event.is_none(),
        "the event was not recorded in time"
    );
}
