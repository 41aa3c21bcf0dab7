//! End-to-end: a gateway's view of the adapter, on every backend (real files for the durable
//! ones), with tokio's paused clock driving the coalescing heartbeat wake.

use std::sync::Arc;
use std::time::Duration;

use awareness_core::testkit::failing::Failing;
use awareness_core::{
    ActorType, AgentId, AwarenessStore, AwarenessStoreExt as _, CursorFilter, Event, EventKind,
    NewEvent, Sequence, SessionKey, SessionRef, Timestamp, WatcherKey,
};
use awareness_e2e::{Backend, backends};
use gateway_adapter::{
    AllowAll, Awareness, CoalescingWake, HumanMessage, InMemoryDirectory, InMemoryQueue,
    ManualClock, RecordingWake, RunOutcome, SameAgent, SessionEntry, SpawnTree, SystemEventQueue,
    VisibilityPolicy, WakeSink, WatchOutcome, WatchRefusal,
};

const T0: Timestamp = Timestamp(1_800_000_000_000);
const MANAGER: &str = "agent:main:main";
const CHILD: &str = "agent:main:subagent:worker";

fn k(s: &str) -> SessionKey {
    SessionKey::new(s).unwrap()
}

struct Gateway {
    svc: Arc<Awareness>,
    queue: Arc<InMemoryQueue>,
    woken: Arc<RecordingWake>,
    dir: Arc<InMemoryDirectory>,
    clock: Arc<ManualClock>,
}

impl Gateway {
    fn new(store: Arc<dyn AwarenessStore>) -> Self {
        Self::with_policy(store, Arc::new(AllowAll))
    }

    fn with_policy(store: Arc<dyn AwarenessStore>, policy: Arc<dyn VisibilityPolicy>) -> Self {
        Self::with_parts(
            store,
            policy,
            Arc::new(InMemoryDirectory::new()),
            Arc::new(ManualClock::new(T0)),
        )
    }

    fn with_parts(
        store: Arc<dyn AwarenessStore>,
        policy: Arc<dyn VisibilityPolicy>,
        dir: Arc<InMemoryDirectory>,
        clock: Arc<ManualClock>,
    ) -> Self {
        let queue = Arc::new(InMemoryQueue::new());
        let woken = Arc::new(RecordingWake::new());
        let sink_rec = Arc::clone(&woken);
        let sink: WakeSink = Arc::new(move |s, r| {
            use gateway_adapter::HeartbeatWake as _;
            sink_rec.wake(s, r);
        });
        let svc = Awareness::builder(
            store,
            queue.clone(),
            Arc::new(CoalescingWake::new(sink)),
            dir.clone(),
        )
        .visibility(policy)
        .clock(clock.clone())
        // The paused clock runs ahead while a durable store works on another thread: the turn
        // and the producers wait for the store as long as it takes.
        .config(gateway_adapter::AwarenessConfig {
            store_wait: Duration::MAX,
            ..gateway_adapter::AwarenessConfig::default()
        })
        .build();
        Self {
            svc: Arc::new(svc),
            queue,
            woken,
            dir,
            clock,
        }
    }

    fn spawn_entry(&self, child: &str, parent: &str) {
        self.dir.upsert(
            k(child),
            SessionEntry {
                spawned_by: Some(k(parent)),
                ..SessionEntry::default()
            },
        );
        if self.dir.entry_of(parent).is_none() {
            self.dir.upsert(k(parent), SessionEntry::default());
        }
    }

    /// The manager spawns the child: a directory entry and the seeding `child_spawned`.
    async fn spawn_child(&self) {
        self.spawn_entry(CHILD, MANAGER);
        self.svc
            .subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
            .await
            .expect("spawned");
    }

    async fn human(&self, session: &str) -> Option<Arc<Event>> {
        let mut m = HumanMessage::new(k(session));
        m.channel = Some("telegram".into());
        m.actor_id = Some("user-7".into());
        self.svc.human_message(m).await
    }
}

trait EntryOf {
    fn entry_of(&self, key: &str) -> Option<SessionEntry>;
}
impl EntryOf for InMemoryDirectory {
    fn entry_of(&self, key: &str) -> Option<SessionEntry> {
        use gateway_adapter::SessionDirectory as _;
        self.entry(&k(key))
    }
}

/// The store a restarted gateway opens: the same file (postgres: schema) opened anew once the
/// old handle is gone (within one process, store-redb would otherwise share the open
/// database), or for memory the same store.
async fn reopen(b: &mut Backend) -> Arc<dyn AwarenessStore> {
    if b.name == "memory" {
        return Arc::clone(&b.store);
    }
    let gone = std::mem::replace(&mut b.store, Arc::new(store_memory::MemoryStore::new()));
    assert_eq!(
        Arc::strong_count(&gone),
        1,
        "{}: nothing else holds the old handle",
        b.name
    );
    drop(gone);
    let store = awareness_e2e::open_store(&b.url).await;
    b.store = Arc::clone(&store);
    store
}

#[tokio::test(start_paused = true)]
async fn manager_gets_one_notice_for_twenty_human_messages_and_reconciles_them() {
    for b in backends().await {
        let gw = Gateway::new(Arc::clone(&b.store));
        gw.spawn_child().await;
        let mut sequences = Vec::new();
        for _ in 0..20 {
            sequences.push(gw.human(CHILD).await.expect("recorded").sequence);
        }
        let queued = gw.queue.peek(&k(MANAGER));
        assert_eq!(queued.len(), 1, "{}: exactly one line", b.name);
        assert_eq!(gw.woken.count(&k(MANAGER)), 1, "{}: woken once", b.name);
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(
            gw.woken.count(&k(MANAGER)),
            1,
            "{}: no further wake: one line, one wake",
            b.name
        );
        assert!(
            queued[0].text.ends_with("changesSince 1."),
            "{}",
            queued[0].text
        );

        let drained = gw.svc.drain_turn(&k(MANAGER)).await;
        assert_eq!(drained, queued);
        let status = gw
            .svc
            .session_status(&k(MANAGER), &k(CHILD), None, Some(Sequence(1)), None)
            .await
            .expect("visible");
        let json = serde_json::to_value(&status).unwrap();
        let page = status.state_changes.expect("page");
        let got: Vec<Sequence> = page.events.iter().map(|e| e.sequence).collect();
        assert_eq!(got, sequences, "{}: exactly those 20 events", b.name);
        assert!(
            page.events.iter().all(
                |e| e.kind == EventKind::HumanDirectMessage && e.actor_type == ActorType::Human
            )
        );
        assert_eq!(status.state_version, *sequences.last().unwrap());
        assert_eq!(
            json.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["stateVersion", "stateChanges"],
            "an answer read from the store has OpenClaw's fields only, in its order"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn event_between_enqueue_and_drain_reopens_exactly_one_follow_up() {
    for b in backends().await {
        let gw = Gateway::new(Arc::clone(&b.store));
        gw.spawn_child().await;
        let first = gw.human(CHILD).await.unwrap().sequence; // notice queued: changesSince 1
        let queued = gw.queue.peek(&k(MANAGER));
        let later = gw.human(CHILD).await.unwrap().sequence; // arrives before the drain
        assert_eq!(
            gw.queue.peek(&k(MANAGER)),
            queued,
            "{}: still one line",
            b.name
        );
        gw.svc.drain_turn(&k(MANAGER)).await;
        let follow = gw.queue.peek(&k(MANAGER));
        assert_eq!(follow.len(), 1, "{}: exactly one follow-up", b.name);
        assert!(
            follow[0].text.ends_with(&format!("changesSince {first}.")),
            "{}",
            follow[0].text
        );
        let again = gw.svc.drain_turn(&k(MANAGER)).await;
        assert_eq!(again, follow);
        assert!(
            gw.queue.peek(&k(MANAGER)).is_empty(),
            "{}: nothing after the follow-up",
            b.name
        );
        let c = b
            .store
            .cursor(&WatcherKey::parse(MANAGER).unwrap(), &k(CHILD))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((c.last_seen, c.notified, c.material), (later, later, later));
    }
}

#[tokio::test(start_paused = true)]
async fn nested_subagent_watcher_is_not_woken_and_reads_it_next_turn() {
    const NESTED: &str = "agent:main:subagent:worker:subagent:helper";
    for b in backends().await {
        let gw = Gateway::new(Arc::clone(&b.store));
        gw.spawn_entry(NESTED, CHILD);
        gw.svc
            .subagent_spawned(&k(NESTED), None, &k(CHILD), "run-n")
            .await
            .expect("the spawn is logged");
        gw.human(NESTED)
            .await
            .expect("recorded: the helper has a spawner");
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(
            gw.woken.all(),
            [],
            "{}: a nested subagent is not woken, nor anyone else",
            b.name
        );
        let turn = gw.svc.drain_turn(&k(CHILD)).await;
        assert_eq!(
            turn.len(),
            1,
            "{}: it sees the notice on its next turn",
            b.name
        );
        assert!(turn[0].text.contains(NESTED));
    }
}

#[tokio::test(start_paused = true)]
async fn restart_brings_the_pending_notice_back() {
    for mut b in backends().await {
        let dir = Arc::new(InMemoryDirectory::new());
        let clock = Arc::new(ManualClock::new(T0));
        let gw = Gateway::with_parts(
            Arc::clone(&b.store),
            Arc::new(AllowAll),
            dir.clone(),
            clock.clone(),
        );
        gw.spawn_child().await;
        gw.human(CHILD).await;
        gw.human(CHILD).await;
        let before = gw.queue.peek(&k(MANAGER));
        drop(gw);
        clock.advance(60_000);
        // A new process on the same file: queues are empty.
        let store = reopen(&mut b).await;
        let gw = Gateway::with_parts(store, Arc::new(AllowAll), dir, clock);
        assert!(gw.queue.peek(&k(MANAGER)).is_empty());
        let report = gw.svc.startup().await;
        assert_eq!(report.redelivered, 1, "{}", b.name);
        assert!(!report.prune_failed && !report.sweep_failed, "{}", b.name);
        assert_eq!(
            gw.queue.peek(&k(MANAGER)),
            before,
            "{}: the same line comes back",
            b.name
        );
        assert_eq!(gw.woken.count(&k(MANAGER)), 1);
        gw.svc.drain_turn(&k(MANAGER)).await;
        assert!(
            gw.queue.peek(&k(MANAGER)).is_empty(),
            "{}: the sweep froze at material, so the ack covers all",
            b.name
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_notice_lost_from_the_queue_reappears_on_the_next_turn() {
    for b in backends().await {
        let gw = Gateway::new(Arc::clone(&b.store));
        gw.spawn_child().await;
        gw.human(CHILD).await;
        let lost = gw.queue.drain(&k(MANAGER)); // something else emptied the queue
        assert_eq!(lost.len(), 1);
        let turn = gw.svc.drain_turn(&k(MANAGER)).await;
        assert_eq!(
            turn, lost,
            "{}: recovered from the durable cursor without a restart",
            b.name
        );
        let c = b
            .store
            .cursor(&WatcherKey::parse(MANAGER).unwrap(), &k(CHILD))
            .await
            .unwrap()
            .unwrap();
        assert!(!c.is_pending(), "{}: and acknowledged", b.name);
    }
}

#[tokio::test(start_paused = true)]
async fn explicit_watch_through_sessions_send_on_a_peer() {
    const PEER: &str = "agent:main:peer";
    for b in backends().await {
        let gw = Gateway::new(Arc::clone(&b.store));
        gw.dir.upsert(k(PEER), SessionEntry::default());
        let old = NewEvent::new(
            SessionRef::parse(PEER, "main").unwrap(),
            EventKind::GoalChanged,
            ActorType::System,
            "goal created",
        );
        gw.svc.record(old).await.expect("recorded");
        assert_eq!(
            gw.svc
                .watch_after_send(&k(MANAGER), &k(PEER), None, false)
                .await,
            WatchOutcome {
                watched: false,
                refused: Some(WatchRefusal::NotDispatched)
            },
            "not after a failed dispatch"
        );
        assert_eq!(
            gw.svc
                .watch_after_send(&k("global"), &k(PEER), None, true)
                .await,
            WatchOutcome {
                watched: false,
                refused: Some(WatchRefusal::InvalidWatcher)
            },
            "a bare key never watches"
        );
        assert_eq!(
            gw.svc
                .watch_after_send(&k(PEER), &k(PEER), None, true)
                .await,
            WatchOutcome {
                watched: false,
                refused: Some(WatchRefusal::InvalidWatcher)
            },
            "no self-watch"
        );
        assert!(
            gw.svc
                .watch_after_send(&k(MANAGER), &k(PEER), None, true)
                .await
                .watched
        );
        assert!(
            gw.queue.peek(&k(MANAGER)).is_empty(),
            "{}: history before the watch never notifies",
            b.name
        );
        let ev = gw.human(PEER).await.expect("recorded: the peer is watched");
        let lines = gw.queue.peek(&k(MANAGER));
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0]
                .text
                .ends_with(&format!("changesSince {}.", ev.sequence.get() - 1))
        );
        assert!(gw.svc.unwatch(&k(MANAGER), &k(PEER)).await);
        gw.svc.drain_turn(&k(MANAGER)).await;
        gw.human(PEER).await;
        assert!(
            gw.queue.peek(&k(MANAGER)).is_empty(),
            "{}: unwatched",
            b.name
        );
    }
}

#[tokio::test(start_paused = true)]
async fn goal_change_by_the_watcher_itself_gives_no_notice() {
    for b in backends().await {
        let gw = Gateway::new(Arc::clone(&b.store));
        gw.spawn_child().await;
        let ev = gw
            .svc
            .goal_changed(
                &k(CHILD),
                None,
                "goal set by the manager",
                (ActorType::Agent, Some(MANAGER.into())),
                None,
            )
            .await
            .expect("logged");
        assert_eq!(ev.kind, EventKind::GoalChanged);
        assert!(
            gw.queue.peek(&k(MANAGER)).is_empty(),
            "{}: self-caused",
            b.name
        );
        assert_eq!(gw.woken.count(&k(MANAGER)), 0);
        gw.svc
            .goal_changed(
                &k(CHILD),
                None,
                "goal set by a person",
                (ActorType::Human, None),
                None,
            )
            .await;
        assert_eq!(
            gw.queue.peek(&k(MANAGER)).len(),
            1,
            "{}: another actor notifies",
            b.name
        );
    }
}

#[tokio::test(start_paused = true)]
async fn run_outcomes_and_compaction_are_logged_exactly_without_notices() {
    for b in backends().await {
        let gw = Gateway::new(Arc::clone(&b.store));
        gw.svc
            .subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
            .await
            .expect("spawned");
        let manager = WatcherKey::parse(MANAGER).unwrap();
        let watching = b
            .store
            .cursor(&manager, &k(CHILD))
            .await
            .unwrap()
            .expect("the manager watches the child");
        for (run, outcome, summary) in [
            ("run-1", RunOutcome::Ok, "child run completed"),
            ("run-2", RunOutcome::Error, "child run failed"),
            ("run-3", RunOutcome::Timeout, "child run timed out"),
            ("run-4", RunOutcome::Cancelled, "child run cancelled"),
        ] {
            let ev = gw
                .svc
                .subagent_ended(&k(CHILD), None, run, outcome)
                .await
                .expect("logged");
            assert_eq!(ev.summary, summary);
            if outcome == RunOutcome::Ok {
                assert_eq!(ev.kind, EventKind::RunCompleted);
                assert!(ev.payload.is_none());
            } else {
                assert_eq!(ev.kind, EventKind::RunFailed);
                assert_eq!(ev.payload.as_ref().unwrap()["outcome"], outcome.as_str());
            }
        }
        let harness = gw
            .svc
            .compacted(gateway_adapter::Compaction {
                session: k(CHILD),
                agent_id: None,
                session_id: None,
                run_id: None,
                operation_id: "op-9".into(),
                owner: Some("codex".into()),
            })
            .await
            .expect("any owner can record a compaction");
        assert_eq!(harness.payload.as_ref().unwrap()["owner"], "codex");
        assert!(
            gw.queue.peek(&k(MANAGER)).is_empty(),
            "{}: log-only kinds",
            b.name
        );
        // Nor any cursor change (DESIGN.md section 4): nothing pending for a later sweep.
        assert_eq!(
            b.store.cursor(&manager, &k(CHILD)).await.unwrap(),
            Some(watching),
            "{}: log-only kinds move no cursor",
            b.name
        );
        // A kind that notifies does reach the manager's queue.
        gw.spawn_entry(CHILD, MANAGER);
        assert!(gw.human(CHILD).await.is_some(), "{}", b.name);
        assert_eq!(gw.queue.peek(&k(MANAGER)).len(), 1, "{}", b.name);
    }
}

/// Under `SpawnTree` a spawner watches what it spawned even when the spawn is reported before
/// the directory holds the child, and a turn whose entry the caller passes (the directory
/// does not know the session yet) notifies the spawner that entry names.
#[tokio::test(start_paused = true)]
async fn a_spawn_tree_spawner_watches_its_child_before_the_directory_knows_it() {
    for b in backends().await {
        let dir = Arc::new(InMemoryDirectory::new());
        let gw = Gateway::with_parts(
            Arc::clone(&b.store),
            Arc::new(SpawnTree::new(dir.clone())),
            dir,
            Arc::new(ManualClock::new(T0)),
        );
        gw.svc
            .subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
            .await
            .expect("the spawn is logged");
        let manager = WatcherKey::parse(MANAGER).unwrap();
        assert!(
            b.store.cursor(&manager, &k(CHILD)).await.unwrap().is_some(),
            "{}: seeded",
            b.name
        );
        gw.svc.unwatch(&k(MANAGER), &k(CHILD)).await;
        let mut msg = HumanMessage::new(k(CHILD));
        msg.entry = Some(SessionEntry {
            spawned_by: Some(k(MANAGER)),
            ..SessionEntry::default()
        });
        assert!(gw.svc.human_message(msg).await.is_some(), "{}", b.name);
        assert_eq!(
            gw.queue.peek(&k(MANAGER)).len(),
            1,
            "{}: the spawner the entry names is told",
            b.name
        );
    }
}

/// A run ends once: a second terminal outcome of the same run (a timeout reported after the
/// completion, say) is the stored event again, spending a sequence as every dedupe hit does
/// and moving no head; a spawn reported twice is one `child_spawned`, and the second report
/// leaves the spawner's cursor (with its pending notice) as it was.
#[tokio::test(start_paused = true)]
async fn a_run_ends_once_and_a_spawn_reported_twice_is_one_spawn() {
    for b in backends().await {
        let gw = Gateway::new(Arc::clone(&b.store));
        gw.spawn_child().await;
        let child = SessionRef::parse(CHILD, "main").unwrap();
        let first = gw
            .svc
            .subagent_ended(&k(CHILD), None, "run-1", RunOutcome::Ok)
            .await
            .expect("logged");
        let again = gw
            .svc
            .subagent_ended(&k(CHILD), None, "run-1", RunOutcome::Timeout)
            .await
            .expect("the stored event");
        assert_eq!(again, first, "{}: the first outcome stands", b.name);
        assert_eq!(
            b.store.state_version(&child).await.unwrap(),
            first.sequence,
            "{}: a dedupe hit moves no head",
            b.name
        );

        gw.human(CHILD).await.expect("recorded");
        let manager = WatcherKey::parse(MANAGER).unwrap();
        let pending = b.store.cursor(&manager, &k(CHILD)).await.unwrap();
        let spawned_again = gw
            .svc
            .subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
            .await
            .expect("the stored event");
        assert_eq!(spawned_again.kind, EventKind::ChildSpawned);
        assert!(
            spawned_again.sequence < first.sequence,
            "{}: the first spawn's event",
            b.name
        );
        assert_eq!(
            b.store.cursor(&manager, &k(CHILD)).await.unwrap(),
            pending,
            "{}: the cursor and its notice are left alone",
            b.name
        );
        let next = gw
            .svc
            .subagent_ended(&k(CHILD), None, "run-2", RunOutcome::Ok)
            .await
            .expect("logged");
        assert_eq!(
            next.sequence.0,
            b.store.state_version(&child).await.unwrap().0,
            "{}",
            b.name
        );
        let log = b
            .store
            .changes_since(&child, Sequence(0), 200)
            .await
            .unwrap();
        let kinds: Vec<&EventKind> = log.events.iter().map(|e| &e.kind).collect();
        assert_eq!(
            kinds,
            [
                &EventKind::ChildSpawned,
                &EventKind::RunCompleted,
                &EventKind::HumanDirectMessage,
                &EventKind::RunCompleted
            ],
            "{}: one row per spawn and per run",
            b.name
        );
        assert_eq!(
            next.sequence.0 - log.events[2].sequence.0,
            2,
            "{}: the repeated spawn spent one sequence",
            b.name
        );
    }
}

/// The agent of each event on the page of `status`.
fn agents_of_page(status: awareness_core::SessionStatus) -> Vec<String> {
    let page = status.state_changes.expect("a page");
    page.events.iter().map(|e| e.agent_id.to_string()).collect()
}

/// A watch the gateway registers for a session asks the visibility policy as an explicit watch
/// does (DESIGN.md section 5): a spawner that may not see its child (here another agent's,
/// under `SameAgent`) is not seeded by the spawn and is not the directory's named watcher of
/// the child's human messages, so it gets no cursor and no notice and learns nothing of the
/// child (whose human turn is recorded, as OpenClaw records a turn in any session whose entry
/// names a spawner, but with nothing watching it tells nobody); a child of its own agent is
/// watched as before.
#[tokio::test(start_paused = true)]
async fn a_watch_the_gateway_registers_asks_the_visibility_policy() {
    const THEIRS: &str = "agent:ops:subagent:z";
    for b in backends().await {
        let gw = Gateway::with_policy(Arc::clone(&b.store), Arc::new(SameAgent));
        gw.spawn_entry(THEIRS, MANAGER);
        gw.svc
            .subagent_spawned(&k(THEIRS), None, &k(MANAGER), "run-z")
            .await
            .expect("the spawn is logged");
        gw.spawn_child().await;
        let manager = WatcherKey::parse(MANAGER).unwrap();
        assert_eq!(
            b.store.cursor(&manager, &k(THEIRS)).await.unwrap(),
            None,
            "{}: no cursor on a child the manager may not see",
            b.name
        );
        assert!(
            b.store.cursor(&manager, &k(CHILD)).await.unwrap().is_some(),
            "{}: its own agent's child is watched",
            b.name
        );
        for child in [THEIRS, CHILD] {
            let mut msg = HumanMessage::new(k(child));
            msg.channel = Some("telegram".into());
            assert!(
                gw.svc.human_message(msg).await.is_some(),
                "{}: {child}",
                b.name
            );
        }
        let lines: Vec<String> = gw
            .queue
            .peek(&k(MANAGER))
            .into_iter()
            .map(|e| e.text)
            .collect();
        assert_eq!(lines.len(), 1, "{}: {lines:?}", b.name);
        assert!(lines[0].contains(CHILD), "{}: {lines:?}", b.name);
        assert!(
            b.store
                .cursors(&CursorFilter {
                    target: Some(k(THEIRS)),
                    ..CursorFilter::default()
                })
                .await
                .unwrap()
                .is_empty(),
            "{}: nothing watches the other agent's child",
            b.name
        );
    }
}

/// Under global scope every agent has its own `global`: a bare requester named `global` reads
/// its own, not another agent's of the same name.
#[tokio::test(start_paused = true)]
async fn a_bare_requester_sees_its_own_global_session_not_another_agents() {
    for b in backends().await {
        let gw = Gateway::with_policy(Arc::clone(&b.store), Arc::new(SameAgent));
        let (mine, theirs) = (
            SessionRef::parse("global", "main").unwrap(),
            SessionRef::parse("global", "ops").unwrap(),
        );
        gw.svc
            .session_created(&mine, "s-main", (ActorType::Human, None))
            .await
            .expect("logged");
        gw.svc
            .session_created(&theirs, "s-ops", (ActorType::Human, None))
            .await
            .expect("logged");
        let ops = AgentId::new("ops").unwrap();
        assert!(
            gw.svc
                .session_status(
                    &k("global"),
                    &k("global"),
                    Some(&ops),
                    Some(Sequence(0)),
                    None
                )
                .await
                .is_err(),
            "{}: another agent's global is not the requester's own",
            b.name
        );
        assert!(
            gw.svc
                .state_versions(&k("global"), std::slice::from_ref(&theirs))
                .await
                .is_empty(),
            "{}",
            b.name
        );
        let own = gw
            .svc
            .session_status(&k("global"), &k("global"), None, Some(Sequence(0)), None)
            .await
            .expect("its own global");
        assert_eq!(agents_of_page(own), ["main"], "{}", b.name);
        // Agent ops's own `global`, its agent named by the gateway: its own, not main's.
        let own = gw
            .svc
            .session_status_as(&theirs, &k("global"), None, Some(Sequence(0)), None)
            .await
            .expect("ops's own global");
        assert_eq!(agents_of_page(own), ["ops"], "{}", b.name);
        let main = AgentId::new("main").unwrap();
        assert!(
            gw.svc
                .session_status_as(&theirs, &k("global"), Some(&main), None, None)
                .await
                .is_err(),
            "{}",
            b.name
        );
        let versions = gw
            .svc
            .state_versions_as(&theirs, &[mine.clone(), theirs.clone()])
            .await;
        assert_eq!(versions.keys().collect::<Vec<_>>(), [&theirs], "{}", b.name);
    }
}

/// Under `SameAgent`, each agent's `global` (named through the `_as` methods) sees its own
/// agent's subagents and not another agent's (decision 0010, stop 45); through the key-only
/// methods `global` is the default agent's, and sees the default agent's subagents.
#[tokio::test(start_paused = true)]
async fn a_bare_requester_sees_its_own_agents_subagents_through_the_as_methods() {
    for b in backends().await {
        let gw = Gateway::with_policy(Arc::clone(&b.store), Arc::new(SameAgent));
        let ops_global = SessionRef::parse("global", "ops").unwrap();
        let (ops_child, main_child) = (
            SessionRef::parse("agent:ops:subagent:x", "ops").unwrap(),
            SessionRef::parse("agent:main:subagent:y", "main").unwrap(),
        );
        for (child, id) in [(&ops_child, "s-x"), (&main_child, "s-y")] {
            gw.svc
                .session_created(child, id, (ActorType::Human, None))
                .await
                .expect("logged");
        }
        let status = |requester: SessionRef, child: &SessionRef| {
            let svc = &gw.svc;
            let key = child.session_key.clone();
            async move {
                svc.session_status_as(&requester, &key, None, Some(Sequence(0)), None)
                    .await
                    .is_ok()
            }
        };
        assert!(status(ops_global.clone(), &ops_child).await, "{}", b.name);
        assert!(!status(ops_global.clone(), &main_child).await, "{}", b.name);
        let main_global = SessionRef::parse("global", "main").unwrap();
        assert!(status(main_global.clone(), &main_child).await, "{}", b.name);
        assert!(!status(main_global, &ops_child).await, "{}", b.name);
        // Key-only: the default agent's `global`.
        let key_only = |child: &SessionRef| {
            let svc = &gw.svc;
            let key = child.session_key.clone();
            async move {
                svc.session_status(&k("global"), &key, None, Some(Sequence(0)), None)
                    .await
                    .is_ok()
            }
        };
        assert!(key_only(&main_child).await, "{}", b.name);
        assert!(!key_only(&ops_child).await, "{}", b.name);
    }
}

/// A gateway on `b` whose manager watches agent ops's `global` (decision 0008), while agent
/// main's `global` holds one event; and ops's id.
async fn watching_ops_global(b: &Backend) -> (Gateway, AgentId) {
    let gw = Gateway::new(Arc::clone(&b.store));
    let ops = AgentId::new("ops").unwrap();
    gw.svc
        .session_created(
            &SessionRef::parse("global", "main").unwrap(),
            "s-main",
            (ActorType::Human, None),
        )
        .await
        .expect("logged");
    assert!(
        gw.svc
            .watch_after_send(&k(MANAGER), &k("global"), Some(&ops), true)
            .await
            .watched,
        "{}",
        b.name
    );
    (gw, ops)
}

/// A watcher that follows another agent's session of a bare key (decision 0008) is told
/// `session_status sessionKey "global" changesSince N`: the notice cannot name the agent. Its
/// reconcile without an agent reads the session its cursor follows; it read the requester's
/// own agent's `global`, and so missed the change it was told of. With no cursor on the key,
/// the requester's agent's session is read, as before.
#[tokio::test(start_paused = true)]
async fn a_notice_about_another_agents_bare_session_reconciles_that_session() {
    for b in backends().await {
        let (gw, ops) = watching_ops_global(&b).await;
        let mut m = HumanMessage::new(k("global"));
        m.agent_id = Some(ops.clone());
        m.channel = Some("telegram".into());
        let ev = gw
            .svc
            .human_message(m)
            .await
            .expect("recorded: it is watched");
        let lines = gw.svc.drain_turn(&k(MANAGER)).await;
        // Watched at its head, 0: ops's `global` had no event yet (main's has one).
        let since = Sequence(0);
        assert_eq!(
            lines.iter().map(|l| l.text.clone()).collect::<Vec<_>>(),
            [awareness_core::protocol::notice_text(&k("global"), since)],
            "{}",
            b.name
        );
        let status = gw
            .svc
            .session_status(&k(MANAGER), &k("global"), None, Some(since), None)
            .await
            .expect("visible");
        assert_eq!(status.state_version, ev.sequence, "{}", b.name);
        assert_eq!(
            agents_of_page(status),
            ["ops"],
            "{}: the change told of",
            b.name
        );
        let unwatched = gw
            .svc
            .session_status(
                &k("agent:main:peer"),
                &k("global"),
                None,
                Some(Sequence(0)),
                None,
            )
            .await
            .expect("visible");
        assert_eq!(agents_of_page(unwatched), ["main"], "{}", b.name);
    }
}

/// A damaged cursor row reads as `Corrupt` at every read (decision 0016). A bare-key reconcile
/// without an agent then counts it as no cursor and reads the requester's own agent's session,
/// on each durable store, rather than answering `unavailable` for good (decision 0008).
#[tokio::test(start_paused = true)]
async fn a_bare_key_reconcile_over_a_damaged_cursor_reads_the_requesters_session() {
    let mut damaged_stores = 0;
    for b in backends().await {
        let (gw, _) = watching_ops_global(&b).await;
        let manager = WatcherKey::parse(MANAGER).unwrap();
        // A second handle on the same file (postgres: schema) damages the row, as another
        // writer could.
        let damaged = match b.name {
            "sqlite" => store_sqlite::SqliteStore::open(b.dir.path().join("state.db"))
                .await
                .expect("a second handle")
                .damage_cursor_row(&manager, &k("global"))
                .await
                .expect("damage"),
            "redb" => store_redb::RedbStore::open(b.dir.path().join("state.redb"))
                .await
                .expect("a second handle")
                .damage_cursor_row(&manager, &k("global"))
                .await
                .expect("damage"),
            "postgres" => {
                let (url, watcher) = (b.url.clone(), manager.clone());
                awareness_e2e::off_the_clock(async move {
                    store_postgres::PgStore::connect_url(&url)
                        .await
                        .expect("a second handle")
                        .damage_cursor_row(&watcher, &k("global"))
                        .await
                        .expect("damage")
                })
                .await
            }
            "memory" => continue, // store-memory keeps values: nothing to tear
            other => panic!("no way to damage a row of {other}"),
        };
        damaged_stores += 1;
        assert!(damaged, "{}: the cursor row existed", b.name);
        assert!(
            matches!(
                b.store.cursor(&manager, &k("global")).await,
                Err(awareness_core::StoreError::Corrupt { .. })
            ),
            "{}: the row reads as damaged",
            b.name
        );
        let status = gw
            .svc
            .session_status(&k(MANAGER), &k("global"), None, Some(Sequence(0)), None)
            .await
            .expect("visible");
        assert!(!status.unavailable, "{}: {status:?}", b.name);
        assert_eq!(agents_of_page(status), ["main"], "{}", b.name);
    }
    assert_eq!(
        damaged_stores, 3,
        "every durable store was damaged and checked"
    );
}

#[tokio::test(start_paused = true)]
async fn visibility_policy_guards_every_read_and_watch() {
    const OPS: &str = "agent:ops:main";
    for b in backends().await {
        let dir = Arc::new(InMemoryDirectory::new());
        let tree = Gateway::with_parts(
            Arc::clone(&b.store),
            Arc::new(SpawnTree::new(dir.clone())),
            dir,
            Arc::new(ManualClock::new(T0)),
        );
        tree.spawn_entry(CHILD, MANAGER);
        tree.dir.upsert(k(OPS), SessionEntry::default());
        tree.svc
            .subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
            .await;
        tree.human(CHILD).await;
        let child_ref = SessionRef::parse(CHILD, "main").unwrap();
        let before = b.store.cursors(&CursorFilter::default()).await.unwrap();

        assert!(
            tree.svc
                .session_status(&k(OPS), &k(CHILD), None, None, None)
                .await
                .is_err()
        );
        assert!(
            tree.svc
                .session_status(&k(OPS), &k(CHILD), None, Some(Sequence(0)), None)
                .await
                .is_err()
        );
        let text = tree
            .svc
            .session_status_text(&k(OPS), &k(CHILD), None, Some(Sequence(0)), None)
            .await;
        assert_eq!(
            text,
            format!("Session \"{CHILD}\" is not visible to this session."),
            "reveals nothing"
        );
        let text_missing = tree
            .svc
            .session_status_text(&k(OPS), &k("agent:main:subagent:nobody"), None, None, None)
            .await;
        assert_eq!(
            text_missing.replace("agent:main:subagent:nobody", CHILD),
            text,
            "an existing and a missing session are refused alike"
        );
        assert!(
            tree.svc
                .state_versions(&k(OPS), std::slice::from_ref(&child_ref))
                .await
                .is_empty()
        );
        assert_eq!(
            tree.svc
                .watch_after_send(&k(OPS), &k(CHILD), None, true)
                .await
                .refused,
            Some(WatchRefusal::NotVisible),
            "{}: refused as not visible",
            b.name
        );
        assert_eq!(
            b.store.cursors(&CursorFilter::default()).await.unwrap(),
            before,
            "{}: a refused request writes nothing",
            b.name
        );
        // The manager sees its own child.
        assert!(
            tree.svc
                .session_status(&k(MANAGER), &k(CHILD), None, Some(Sequence(0)), None)
                .await
                .is_ok()
        );

        let open = Gateway::new(Arc::clone(&b.store));
        let status = open
            .svc
            .session_status(&k(OPS), &k(CHILD), None, Some(Sequence(0)), None)
            .await
            .expect("allow-all");
        assert_eq!(status.state_version, Sequence(2));
        let versions = open
            .svc
            .state_versions(&k(OPS), std::slice::from_ref(&child_ref))
            .await;
        assert_eq!(versions.get(&child_ref), Some(&Sequence(2)));
        assert!(
            open.svc
                .watch_after_send(&k(OPS), &k(CHILD), None, true)
                .await
                .watched
        );
    }
}

/// Counts the `heads` calls a store answers.
#[derive(Default)]
struct CountHeads(std::sync::atomic::AtomicUsize);

#[async_trait::async_trait]
impl awareness_core::testkit::hooked::Hook for CountHeads {
    async fn before(&self, call: awareness_core::testkit::hooked::Call, _: &dyn AwarenessStore) {
        if call == awareness_core::testkit::hooked::Call::Heads {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn sessions_list_enrichment_reads_versions_in_batches() {
    for b in backends().await {
        let counted = Arc::new(awareness_core::testkit::hooked::Hooked {
            inner: Arc::clone(&b.store),
            hook: CountHeads::default(),
        });
        let gw = Gateway::new(counted.clone());
        let refs: Vec<SessionRef> = (0..1_200)
            .map(|i| SessionRef::parse(&format!("agent:main:s{i}"), "main").unwrap())
            .collect();
        for r in refs.iter().step_by(3) {
            gw.svc
                .session_created(r, "sess", (ActorType::Human, None))
                .await
                .expect("logged");
        }
        let before = counted.hook.0.load(std::sync::atomic::Ordering::SeqCst);
        let versions = gw.svc.state_versions(&k(MANAGER), &refs).await;
        assert_eq!(versions.len(), 400, "{}: only heads above 0", b.name);
        assert_eq!(
            counted.hook.0.load(std::sync::atomic::Ordering::SeqCst) - before,
            3,
            "{}: 1,200 refs in batches of 500",
            b.name
        );
        assert!(
            versions
                .keys()
                .all(|r| refs.iter().position(|x| x == r).unwrap() % 3 == 0)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn bare_key_sessions_are_logged_and_reconciled_but_never_notified() {
    for b in backends().await {
        let gw = Gateway::new(Arc::clone(&b.store));
        let global = k("global");
        assert!(
            !gw.svc
                .watch_after_send(&global, &k(CHILD), None, true)
                .await
                .watched
        );
        gw.svc
            .goal_changed(
                &global,
                Some(&AgentId::new("ops").unwrap()),
                "goal updated",
                (ActorType::System, None),
                None,
            )
            .await
            .expect("logged");
        let status = gw
            .svc
            .session_status(
                &global,
                &global,
                Some(&AgentId::new("ops").unwrap()),
                Some(Sequence(0)),
                None,
            )
            .await
            .unwrap();
        assert_eq!(status.state_changes.unwrap().events.len(), 1);
        // The refused watch left no cursor, and a change of the child it asked for notifies
        // nobody (a bare key is never a watcher).
        let cursors = b
            .store
            .cursors(&CursorFilter {
                watcher: Some(global.clone()),
                ..CursorFilter::default()
            })
            .await
            .expect("cursors");
        assert!(cursors.is_empty(), "{}: {cursors:?}", b.name);
        // A turn in the child whose entry names the bare key as its spawner (and the manager
        // as its parent) is recorded and notifies the manager, never the bare key.
        gw.dir.upsert(
            k(CHILD),
            SessionEntry {
                spawned_by: Some(global.clone()),
                parent_session_key: Some(k(MANAGER)),
                ..SessionEntry::default()
            },
        );
        assert!(gw.human(CHILD).await.is_some(), "{}: recorded", b.name);
        assert_eq!(gw.queue.peek(&k(MANAGER)).len(), 1, "{}", b.name);
        assert!(gw.queue.peek(&global).is_empty(), "{}", b.name);
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_that_fails_every_call_never_fails_a_turn() {
    let gw = Gateway::new(Arc::new(Failing::new("simulated failure")));
    gw.spawn_entry(CHILD, MANAGER);
    assert!(
        gw.svc
            .subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
            .await
            .is_none()
    );
    assert!(gw.human(CHILD).await.is_none());
    assert!(
        gw.svc
            .goal_changed(&k(CHILD), None, "g", (ActorType::Human, None), None)
            .await
            .is_none()
    );
    assert!(
        gw.svc
            .subagent_ended(&k(CHILD), None, "run-1", RunOutcome::Timeout)
            .await
            .is_none()
    );
    let status = gw
        .svc
        .session_status(&k(MANAGER), &k(CHILD), None, Some(Sequence(4)), None)
        .await
        .expect("degrades, never fails");
    assert!(
        status.unavailable,
        "the answer says the store could not be read"
    );
    assert_eq!(
        serde_json::to_value(&status).unwrap()["unavailable"],
        serde_json::json!(true)
    );
    assert_eq!(status.state_version, Sequence(0));
    let page = status.state_changes.unwrap();
    assert!(page.events.is_empty() && !page.history_gap);
    assert!(
        !page.version_ahead,
        "nothing was read to say the caller's version is from another incarnation"
    );
    assert!(
        gw.svc
            .state_versions(&k(MANAGER), &[SessionRef::parse(CHILD, "main").unwrap()])
            .await
            .is_empty()
    );
    assert!(
        !gw.svc
            .watch_after_send(&k(MANAGER), &k(CHILD), None, true)
            .await
            .watched
    );
    assert!(gw.svc.drain_turn(&k(MANAGER)).await.is_empty());
    gw.svc.on_reset(&k(MANAGER)).await;
    gw.svc
        .on_delete(&SessionRef::parse(CHILD, "main").unwrap())
        .await;
    // The host can tell the failures apart from nothing to do.
    assert!(gw.svc.try_unwatch(&k(MANAGER), &k(CHILD)).await.is_err());
    assert!(
        gw.svc
            .try_acknowledge(&k(MANAGER), &[k(CHILD)])
            .await
            .is_err()
    );
    assert!(gw.svc.try_on_reset(&k(MANAGER)).await.is_err());
    assert!(
        gw.svc
            .try_on_delete(&SessionRef::parse(CHILD, "main").unwrap())
            .await
            .is_err()
    );
    assert!(gw.svc.try_sweep().await.is_err());
    let report = gw.svc.startup().await;
    assert_eq!(
        report,
        gateway_adapter::StartupReport {
            prune_failed: true,
            sweep_failed: true,
            ..gateway_adapter::StartupReport::default()
        }
    );
    assert!(
        gw.svc
            .session_status_text(&k(MANAGER), &k(CHILD), None, Some(Sequence(4)), None)
            .await
            .contains("its state could not be read just now")
    );
}

/// The shortest pruning interval accepted (1 ms; zero is refused when the service is built,
/// see `gateway-adapter/tests/config.rs`) runs pass after pass.
#[tokio::test(start_paused = true)]
async fn the_shortest_pruning_interval_runs_pass_after_pass() {
    let store: Arc<dyn AwarenessStore> = Arc::new(store_memory::MemoryStore::new());
    let svc = Arc::new(
        Awareness::builder(
            store,
            Arc::new(InMemoryQueue::new()),
            Arc::new(RecordingWake::new()),
            Arc::new(InMemoryDirectory::new()),
        )
        .config(gateway_adapter::AwarenessConfig {
            prune_interval: Duration::from_millis(1),
            ..gateway_adapter::AwarenessConfig::default()
        })
        .build(),
    );
    let mut passes = svc.subscribe_pruning();
    let mut handle = svc.spawn_pruning();
    for pass in 1..=2 {
        tokio::select! {
            changed = passes.changed() => changed.expect("the service is alive"),
            ended = &mut handle => panic!("the pruning task ended before pass {pass}: {ended:?}"),
        }
    }
    let last = *passes.borrow();
    assert!(last.passes >= 2 && !last.failed, "{last:?}");
    handle.abort();
}

/// When each pruning chunk was asked of the store (tokio's clock).
#[derive(Default)]
struct ChunkTimes(std::sync::Mutex<Vec<tokio::time::Instant>>);

impl awareness_core::testkit::hooked::Hook for ChunkTimes {
    fn refuse(
        &self,
        call: awareness_core::testkit::hooked::Call,
    ) -> Option<awareness_core::StoreError> {
        if call == awareness_core::testkit::hooked::Call::PruneChunk {
            self.0.lock().unwrap().push(tokio::time::Instant::now());
        }
        None
    }
}

/// The background pass runs an hour after start-up and every hour after that, on a task of
/// its own (no recording prunes).
#[tokio::test(start_paused = true)]
async fn background_pruning_runs_hourly_off_the_recording_path() {
    for b in backends().await {
        let timed = Arc::new(awareness_core::testkit::hooked::Hooked {
            inner: Arc::clone(&b.store),
            hook: ChunkTimes::default(),
        });
        let gw = Gateway::new(Arc::clone(&timed) as Arc<dyn AwarenessStore>);
        let start = tokio::time::Instant::now();
        let r = SessionRef::parse(CHILD, "main").unwrap();
        gw.svc
            .session_created(&r, "s1", (ActorType::Human, None))
            .await
            .expect("logged");
        gw.clock.advance(31 * Timestamp::DAY_MS);
        // A recording once the first event is old prunes nothing: that is the pass's work.
        let other = SessionRef::parse("agent:main:subagent:other", "main").unwrap();
        gw.svc
            .session_created(&other, "s2", (ActorType::Human, None))
            .await
            .expect("logged");
        assert_eq!(b.store.log_stats().await.unwrap().rows, 2, "{}", b.name);
        let mut passes = gw.svc.subscribe_pruning();
        let handle = gw.svc.spawn_pruning();
        tokio::time::sleep(Duration::from_secs(3_599)).await;
        // Read without awaiting: while a test awaits a store's own thread (sqlx's worker,
        // redb's blocking pool), the paused clock counts the runtime idle and jumps to the
        // next timer, which would be the pruning pass.
        assert_eq!(
            passes.borrow().passes,
            0,
            "{}: no pass before the hour",
            b.name
        );
        passes.changed().await.expect("the pruning task runs");
        // Counted before any other wait: while the test awaits a store's own thread, the paused
        // clock may jump to the next pass's tick, and that pass start.
        let first_pass = timed.hook.0.lock().unwrap().len();
        let pass = *passes.borrow();
        assert_eq!(
            (pass.passes, pass.report.events_by_age, pass.failed),
            (1, 1, false),
            "{}",
            b.name
        );
        assert_eq!(
            b.store.log_stats().await.unwrap().rows,
            1,
            "{}: the hourly pass pruned the old event, not the new one",
            b.name
        );
        // The second pass may have begun already (see above), or ended: it was counted.
        if passes.borrow().passes < 2 {
            passes.changed().await.expect("the pruning task runs on");
        }
        let times = timed.hook.0.lock().unwrap().clone();
        // Each pass asks its first chunk at its tick, before it awaits the store.
        assert_eq!(
            (times[0] - start, times[first_pass] - start),
            (Duration::from_hours(1), Duration::from_hours(2)),
            "{}: a pass every hour",
            b.name
        );
        handle.abort();
    }
}

/// A head row that cannot be read (a torn write, a hand edit; decision 0020) costs the
/// `sessions_list` versions only its own session's, on each durable store: the batch of heads
/// it fails is read again one ref at a time.
#[tokio::test]
async fn a_head_that_cannot_be_read_hides_only_its_own_version() {
    let mut damaged_stores = 0;
    for b in backends().await {
        let g = Gateway::new(Arc::clone(&b.store));
        let keys = [
            "agent:main:subagent:a",
            "agent:main:subagent:b",
            "agent:main:subagent:c",
        ];
        let refs: Vec<SessionRef> = keys
            .iter()
            .map(|key| SessionRef::parse(key, "main").unwrap())
            .collect();
        for r in &refs {
            let typed = awareness_core::testkit::checks::human(r);
            b.store.record(typed, T0).await.expect("recorded");
        }
        let torn = &refs[1];
        // A second handle on the same file (postgres: schema) damages the row, as another
        // writer could.
        let damaged = match b.name {
            "sqlite" => store_sqlite::SqliteStore::open(b.dir.path().join("state.db"))
                .await
                .expect("a second handle")
                .damage_head_row(torn)
                .await
                .expect("damage"),
            "redb" => store_redb::RedbStore::open(b.dir.path().join("state.redb"))
                .await
                .expect("a second handle")
                .damage_head_row(torn)
                .await
                .expect("damage"),
            "postgres" => {
                let (url, torn) = (b.url.clone(), torn.clone());
                awareness_e2e::off_the_clock(async move {
                    store_postgres::PgStore::connect_url(&url)
                        .await
                        .expect("a second handle")
                        .damage_head_row(&torn)
                        .await
                        .expect("damage")
                })
                .await
            }
            "memory" => continue, // store-memory keeps values: nothing to tear
            other => panic!("no way to damage a row of {other}"),
        };
        damaged_stores += 1;
        assert!(damaged, "{}: the head row existed", b.name);
        let me = SessionRef::parse(MANAGER, "main").unwrap();
        let versions = g.svc.state_versions_as(&me, &refs).await;
        let mut listed: Vec<&str> = versions.keys().map(|r| r.session_key.as_str()).collect();
        listed.sort_unstable();
        assert_eq!(
            listed,
            ["agent:main:subagent:a", "agent:main:subagent:c"],
            "{}",
            b.name
        );
    }
    assert_eq!(
        damaged_stores, 3,
        "every durable store was damaged and checked"
    );
}
