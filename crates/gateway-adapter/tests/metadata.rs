//! Gateway metadata never costs a producer its event.
//!
//! Bug: the producers built summaries, payloads, ids and dedupe keys straight from what the
//! gateway handed them (a channel name, a run id, an owner, ...). A channel of 190 characters or
//! holding a line break made `human message via <channel>` an invalid summary, the store refused
//! the whole event, the adapter logged a warning and returned `None`: the human intervention was
//! never recorded and no watcher heard of it. Each test here gives a producer metadata that
//! broke a rule and checks that its event is recorded, valid, and notifies as it should.

use std::sync::Arc;

use awareness_core::validate::{self, MAX_DEDUPE_KEY_BYTES, MAX_KEY_BYTES, MAX_SUMMARY_CHARS};
use awareness_core::{
    ActorType, CursorStore, Event, EventKind, EventStore, LinkSpec, Sequence, SessionRef,
    StoreError, Timestamp, UpsertOutcome, UpstreamLink, UpstreamStore, WatcherKey, async_trait,
};
use gateway_adapter::{
    CheckOutcome, Compaction, Detection, HumanMessage, MonitorConfig, RunOutcome, SessionEntry,
    SystemEventQueue, UpstreamMonitor, UpstreamProvider,
};
use serde_json::{Value, json};
use store_memory::MemoryStore;

mod common;
use common::{World, k, world};

const MANAGER: &str = "agent:main:main";
const CHILD: &str = "agent:main:subagent:worker";

fn child() -> SessionRef {
    SessionRef::parse(CHILD, "main").unwrap()
}

impl World {
    /// A world in which the manager spawned the worker, so a cursor of the manager watches it.
    async fn watched() -> Self {
        let w = world();
        w.svc
            .subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
            .await
            .expect("seeded");
        w
    }

    async fn events(&self, session: &SessionRef, kind: EventKind) -> Vec<Arc<Event>> {
        self.store
            .changes_since(session, Sequence::ZERO, 200)
            .await
            .unwrap()
            .events
            .into_iter()
            .filter(|e| e.kind == kind)
            .collect()
    }

    /// The one event of `kind` on the worker, which every rule accepts.
    async fn only(&self, kind: EventKind) -> Arc<Event> {
        let events = self.events(&child(), kind.clone()).await;
        assert_eq!(events.len(), 1, "{kind}: {events:?}");
        let e = events.into_iter().next().unwrap();
        assert_valid(&e);
        e
    }

    /// The manager was told once: one notice queued, one wake.
    fn manager_notified(&self, what: &str) {
        let queued = self.queue.peek(&k(MANAGER));
        assert_eq!(queued.len(), 1, "{what}: {queued:?}");
        assert!(
            queued[0]
                .text
                .starts_with(&format!("Session \"{CHILD}\" changed")),
            "{what}: {}",
            queued[0].text
        );
        assert_eq!(self.wake.count(&k(MANAGER)), 1, "{what}");
    }
}

/// Every rule a store checks, on a stored event.
fn assert_valid(e: &Event) {
    assert_eq!(validate::summary(&e.summary), Ok(()), "{:?}", e.summary);
    if let Some(p) = &e.payload {
        assert_eq!(validate::payload(p), Ok(()), "{p:?}");
    }
    for (what, v) in [
        ("session id", &e.session_id),
        ("actor id", &e.actor_id),
        ("run id", &e.run_id),
    ] {
        if let Some(v) = v {
            assert_eq!(validate::key(what, v), Ok(()), "{v:?}");
        }
    }
}

fn message(channel: &str) -> HumanMessage {
    let mut msg = HumanMessage::new(k(CHILD));
    msg.channel = Some(channel.to_owned());
    msg
}

#[tokio::test]
async fn a_long_or_broken_channel_still_records_the_human_message_and_notifies() {
    let long = "c".repeat(190);
    let cut = format!("human message via {}…", "c".repeat(MAX_SUMMARY_CHARS - 19));
    let mut lost = Vec::new();
    for (case, channel, shown) in [
        ("190 characters", long.as_str(), cut.as_str()),
        ("a newline", "tele\ngram", "human message via tele gram"),
        ("U+2028", "tele\u{2028}gram", "human message via tele gram"),
        (
            "U+2029, NEL and DEL",
            "tele\u{2029}\u{85}\u{7f}gram",
            "human message via tele   gram",
        ),
        (
            "only line breaks",
            "\n\u{2028}",
            "human message via unknown",
        ),
    ] {
        let w = World::watched().await;
        if w.svc.human_message(message(channel)).await.is_none() {
            lost.push(case);
            continue;
        }
        let e = w.only(EventKind::HumanDirectMessage).await;
        assert!(e.summary.starts_with("human message via "), "{case}");
        assert_eq!(e.summary, shown, "{case}");
        w.manager_notified(case);
    }
    assert!(
        lost.is_empty(),
        "human messages lost, channel with: {lost:?}"
    );
}

#[tokio::test]
async fn broken_ids_dedupe_key_and_payload_still_record_the_human_message() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let w = World::watched().await;
    let dedupe = format!("k\n{}", "d".repeat(MAX_DEDUPE_KEY_BYTES));
    let msg = || {
        let mut msg = message("telegram");
        msg.actor_id = Some("alice\n".into());
        msg.run_id = Some("r".repeat(2 * MAX_KEY_BYTES));
        msg.dedupe_key = Some(dedupe.clone());
        msg.entry = Some(SessionEntry {
            session_id: Some(String::new()),
            ..SessionEntry::default()
        });
        msg.payload = Some(
            json!({"note": "n".repeat(5000)})
                .as_object()
                .unwrap()
                .clone(),
        );
        msg.turns = 3;
        msg
    };
    let first = w.svc.human_message(msg()).await.expect("recorded");
    // Each fitted id is warned of once, naming it and the session: the only sign, outside the
    // stored event, that the gateway sent a broken one (the warning could be dropped without a
    // test failing: review of stop 60).
    for field in ["actor id", "run id", "dedupe key"] {
        assert_eq!(
            capture.said(&[
                &format!("the {field} broke the key rules"),
                "session_key=agent:main:subagent:worker",
                "level=WARN"
            ]),
            1,
            "{field}: {:#?}",
            capture.lines()
        );
    }
    let e = w.only(EventKind::HumanDirectMessage).await;
    assert_eq!(e.summary, "human message via telegram");
    assert_eq!(
        e.payload,
        Some(json!({"turns": 3}).as_object().unwrap().clone())
    );
    assert!(e.actor_id.as_deref().unwrap().starts_with("alice\u{fffd}#"));
    assert!(e.run_id.as_deref().unwrap().len() <= MAX_KEY_BYTES);
    assert_eq!(e.session_id, None, "an empty session id is left out");
    w.manager_notified("ids");
    // The fitted dedupe key is the same for the same key: a retry is still deduplicated.
    let again = w.svc.human_message(msg()).await.expect("deduplicated");
    assert_eq!(again.sequence, first.sequence);
    assert_eq!(
        w.events(&child(), EventKind::HumanDirectMessage)
            .await
            .len(),
        1
    );
    // A valid dedupe key is fitted to its own limit, not to the ids' (`MAX_KEY_BYTES`): one of
    // exactly its limit is recorded as given. (What the mutation did: cut and hashed, it no
    // longer matched the key the gateway sent; review of stop 65, GA44.) An empty dedupe key is
    // dropped, as an empty id is: each message that carries one is an event of its own. (What
    // the mutation did: the empty key was kept, the store refused the event, and the message was
    // not recorded; review of stop 71, GF27.)
    let valid = "d".repeat(MAX_DEDUPE_KEY_BYTES);
    for (channel, key, kept) in [
        ("telegram", valid.as_str(), Some(valid.as_str())),
        ("telegram", "", None),
        ("slack", "", None),
    ] {
        let mut msg = message(channel);
        msg.dedupe_key = Some(key.to_owned());
        let recorded = w.svc.human_message(msg).await.expect("recorded");
        let e = w
            .events(&child(), EventKind::HumanDirectMessage)
            .await
            .into_iter()
            .find(|e| e.sequence == recorded.sequence)
            .expect("its own event");
        assert!(
            e.dedupe_key.as_deref() == kept,
            "a dedupe key of {} bytes is recorded as one of {} bytes",
            key.len(),
            e.dedupe_key.as_deref().map_or(0, str::len)
        );
    }
    assert_eq!(
        w.events(&child(), EventKind::HumanDirectMessage)
            .await
            .len(),
        4,
        "three events more, none deduplicated"
    );
    // A sound session id the entry names is recorded with the turn, so the history says which
    // incarnation of the key the person wrote to. (What the mutation did: the human message
    // was recorded without the entry's session id; review of stop 72, SG58.)
    let w = World::watched().await;
    let mut msg = message("telegram");
    msg.entry = Some(SessionEntry {
        spawned_by: Some(k(MANAGER)),
        session_id: Some("s1".into()),
        ..SessionEntry::default()
    });
    w.svc.human_message(msg).await.expect("recorded");
    let e = w.only(EventKind::HumanDirectMessage).await;
    assert_eq!(e.session_id.as_deref(), Some("s1"));
}

/// A spawner that cannot watch the session (a bare key, the session itself) leaves the watch
/// to the parent the entry names: the human turn is recorded and the parent told. The parent
/// was never tried, and with no cursor on the session the turn was not recorded.
#[tokio::test]
async fn a_spawner_that_cannot_watch_leaves_the_watch_to_the_parent() {
    for spawner in ["main", CHILD] {
        let w = world();
        let mut msg = message("telegram");
        msg.entry = Some(SessionEntry {
            spawned_by: Some(k(spawner)),
            parent_session_key: Some(k(MANAGER)),
            ..SessionEntry::default()
        });
        assert!(
            w.svc.human_message(msg).await.is_some(),
            "{spawner}: recorded"
        );
        w.manager_notified(spawner);
    }
}

/// The main session of an agent called `subagent` (`agent:subagent:main`) is woken for the
/// notice its spawned worker's human turn hands out, as any main session is; only a key whose
/// part after the agent id starts with `subagent:` is a nested subagent (OpenClaw's reading).
/// Bug (review, stop 55): any key holding `:subagent:` was one, so this session got its line
/// queued and was never woken.
#[tokio::test]
async fn the_main_session_of_an_agent_called_subagent_is_woken() {
    let w = world();
    let main = k("agent:subagent:main");
    let worker = k("agent:subagent:subagent:worker");
    w.svc
        .subagent_spawned(&worker, None, &main, "run-1")
        .await
        .expect("the spawn is recorded");
    let mut msg = HumanMessage::new(worker.clone());
    msg.entry = Some(SessionEntry {
        spawned_by: Some(main.clone()),
        ..SessionEntry::default()
    });
    assert!(w.svc.human_message(msg).await.is_some(), "recorded");
    assert_eq!(w.queue.peek(&main).len(), 1, "the notice is queued");
    assert_eq!(w.wake.count(&main), 1, "and its session woken");
}

/// A parent taken because the spawner cannot watch is not the session's link up the spawn
/// tree, so a policy that follows the tree is asked whether it may see the session: under
/// `SpawnTree`, a parent the tree does not reach gets no watch and no notice (which would
/// tell it the session's key and version), one it reaches does. The turn is recorded either
/// way, as OpenClaw records it: the entry names a spawner.
#[tokio::test]
async fn a_parent_taken_for_a_spawner_that_cannot_watch_must_see_the_session() {
    for (parent, reached) in [("agent:ops:main", false), (MANAGER, true)] {
        let dir = Arc::new(gateway_adapter::InMemoryDirectory::new());
        // The bare key the child names as its spawner was spawned by the manager.
        dir.upsert(
            k("global"),
            SessionEntry {
                spawned_by: Some(k(MANAGER)),
                ..SessionEntry::default()
            },
        );
        let entry = SessionEntry {
            spawned_by: Some(k("global")),
            parent_session_key: Some(k(parent)),
            ..SessionEntry::default()
        };
        dir.upsert(k(CHILD), entry.clone());
        let (svc, queue) = under_the_spawn_tree(dir);
        let mut msg = message("telegram");
        msg.entry = Some(entry);
        assert!(svc.human_message(msg).await.is_some(), "{parent}: recorded");
        assert_eq!(
            queue.peek(&k(parent)).len(),
            usize::from(reached),
            "{parent}"
        );
    }
}

/// A session whose entry names its parent alone (no spawner) has that parent as its link up the
/// spawn tree, asked only as a spawner (`can_watch_spawned`): under `SpawnTree`, with the caller
/// passing the entry before the directory holds it, the parent is notified. (Asked whether it may
/// see the session too, as a parent taken for a spawner that cannot watch is, the tree the
/// directory does not hold refused it, and the parent never heard of its child's human turn: review
/// of stop 62, A21.)
#[tokio::test]
async fn a_parent_named_alone_is_asked_only_as_a_spawner() {
    // The second case: a spawner the entry names is that link too, asked only as a spawner.
    // (What the mutation did: the spawner was also asked whether it may see the session, the
    // tree the directory does not hold refused it, and the spawner never heard of its child's
    // human turn; review of stop 72, SG14.)
    for (spawned_by, parent) in [(None, Some(k(MANAGER))), (Some(k(MANAGER)), None)] {
        let dir = Arc::new(gateway_adapter::InMemoryDirectory::new());
        let (svc, queue) = under_the_spawn_tree(dir);
        let mut msg = message("telegram");
        msg.entry = Some(SessionEntry {
            spawned_by: spawned_by.clone(),
            parent_session_key: parent.clone(),
            ..SessionEntry::default()
        });
        assert!(svc.human_message(msg).await.is_some(), "recorded");
        assert_eq!(
            queue.peek(&k(MANAGER)).len(),
            1,
            "the session's link up the tree is notified ({spawned_by:?}, {parent:?})"
        );
    }
}

/// A service over a new memory store whose sessions are `dir`'s, under [`SpawnTree`] over the
/// same directory, and its queue.
///
/// [`SpawnTree`]: gateway_adapter::SpawnTree
fn under_the_spawn_tree(
    dir: Arc<gateway_adapter::InMemoryDirectory>,
) -> (
    gateway_adapter::Awareness,
    Arc<gateway_adapter::InMemoryQueue>,
) {
    let queue = Arc::new(gateway_adapter::InMemoryQueue::new());
    let svc = gateway_adapter::Awareness::builder(
        Arc::new(MemoryStore::new()),
        queue.clone(),
        Arc::new(gateway_adapter::RecordingWake::new()),
        dir.clone(),
    )
    .visibility(Arc::new(gateway_adapter::SpawnTree::new(dir)))
    .build();
    (svc, queue)
}

/// A policy that lets no spawner or parent watch on its own: `can_watch_spawned` always false,
/// `can_see` always true.
struct NoAutomaticWatches;

impl gateway_adapter::VisibilityPolicy for NoAutomaticWatches {
    fn can_see(&self, _: &SessionRef, _: &SessionRef) -> bool {
        true
    }
    fn can_watch_spawned(&self, _: &SessionRef, _: &SessionRef) -> bool {
        false
    }
}

/// A service under [`NoAutomaticWatches`], its queue and its store.
fn under_no_automatic_watches() -> (
    gateway_adapter::Awareness,
    Arc<gateway_adapter::InMemoryQueue>,
    Arc<MemoryStore>,
) {
    let queue = Arc::new(gateway_adapter::InMemoryQueue::new());
    let store = Arc::new(MemoryStore::new());
    let svc = gateway_adapter::Awareness::builder(
        store.clone(),
        queue.clone(),
        Arc::new(gateway_adapter::RecordingWake::new()),
        Arc::new(gateway_adapter::InMemoryDirectory::new()),
    )
    .visibility(Arc::new(NoAutomaticWatches))
    .build();
    (svc, queue, store)
}

/// Under [`NoAutomaticWatches`], the parent is kept from watching when the spawner is refused:
/// the fallback parent is asked both questions. The turn is recorded all the same (the entry
/// names a spawner, so OpenClaw records it), with no watcher.
#[tokio::test]
async fn a_parent_taken_for_a_refused_spawner_is_asked_as_a_spawner_too() {
    let (svc, queue, store) = under_no_automatic_watches();
    let mut msg = message("telegram");
    msg.entry = Some(SessionEntry {
        spawned_by: Some(k("agent:main:subagent:spawner")),
        parent_session_key: Some(k(MANAGER)),
        ..SessionEntry::default()
    });
    svc.human_message(msg).await.expect("recorded");
    let cursors = store
        .cursors(&awareness_core::CursorFilter::default())
        .await
        .unwrap();
    assert!(cursors.is_empty(), "nobody watches: {cursors:?}");
    assert!(queue.peek(&k(MANAGER)).is_empty());
}

/// A spawn whose spawner the visibility policy does not let watch the child (under
/// [`NoAutomaticWatches`]) is recorded with no watcher: the spawner gets no cursor, and so no
/// notice of the child's later events. (What the mutation did: the policy was not asked, and
/// the spawner was seeded; review of stop 68, V615.)
#[tokio::test]
async fn a_spawn_the_policy_refuses_seeds_no_cursor_for_the_spawner() {
    let (svc, queue, store) = under_no_automatic_watches();
    svc.subagent_spawned(&k(CHILD), None, &k(MANAGER), "run-1")
        .await
        .expect("the spawn is recorded");
    let cursors = store
        .cursors(&awareness_core::CursorFilter::default())
        .await
        .unwrap();
    assert!(
        cursors.is_empty(),
        "the refused spawner watches nothing: {cursors:?}"
    );
    assert!(queue.peek(&k(MANAGER)).is_empty(), "nor is told anything");
}

/// The payload of the event a human message of `turns` turns records in a watched session,
/// the caller giving `payload`.
async fn recorded_payload(payload: Option<Value>, turns: u32) -> Option<Value> {
    let w = World::watched().await;
    let mut msg = message("telegram");
    msg.payload = payload.map(|p| p.as_object().expect("a JSON object").clone());
    msg.turns = turns;
    w.svc.human_message(msg).await.expect("recorded");
    let e = w.only(EventKind::HumanDirectMessage).await;
    e.payload.as_ref().map(|p| json!(p))
}

/// `turns` in a human message's payload is the burst's size, and only when it is more than
/// one (DESIGN.md section 3), whatever the caller's extra payload held under that key.
#[tokio::test]
async fn the_turns_of_a_human_message_are_the_bursts_alone() {
    for (turns, want) in [
        (1, json!({"note": "n"})),
        (3, json!({"note": "n", "turns": 3})),
    ] {
        let given = json!({"note": "n", "turns": "many"});
        assert_eq!(
            recorded_payload(Some(given), turns).await,
            Some(want),
            "{turns}"
        );
    }
}

/// A caller's payload is kept even when it is empty (`{}`), as OpenClaw stores it; without
/// one, and with a burst of one turn, the event has none.
#[tokio::test]
async fn an_empty_payload_of_the_caller_is_kept() {
    for (given, want) in [(Some(json!({})), Some(json!({}))), (None, None)] {
        assert_eq!(recorded_payload(given.clone(), 1).await, want, "{given:?}");
    }
}

/// A caller's extra payload too large for the payload rules goes, and the event is recorded
/// as without one: the burst's size when it has one, else no payload. It was `{}` for a
/// burst of one turn (review, stop 55).
#[tokio::test]
async fn an_extra_payload_that_does_not_fit_leaves_the_event_as_without_one() {
    for (turns, want) in [(1, None), (3, Some(json!({"turns": 3})))] {
        let given = json!({"note": "n".repeat(5000)});
        assert_eq!(recorded_payload(Some(given), turns).await, want, "{turns}");
    }
}

#[tokio::test]
async fn a_broken_goal_summary_or_actor_id_still_records_and_notifies() {
    let entry = || SessionEntry {
        spawned_by: Some(k(MANAGER)),
        session_id: Some("s\u{0}1".into()),
        ..SessionEntry::default()
    };
    let long = "g".repeat(250);
    for (summary, shown) in [
        ("goal\nupdated", "goal updated".to_owned()),
        ("", "goal changed".to_owned()),
        (&long, format!("{}…", "g".repeat(MAX_SUMMARY_CHARS - 1))),
    ] {
        let w = World::watched().await;
        let recorded = w
            .svc
            .goal_changed(
                &k(CHILD),
                None,
                summary,
                (ActorType::Human, Some("\u{2028}bob\u{1b}".into())),
                Some(entry()),
            )
            .await;
        assert!(recorded.is_some(), "{summary:?}");
        let e = w.only(EventKind::GoalChanged).await;
        assert_eq!(e.summary, shown);
        assert!(e.session_id.as_deref().unwrap().starts_with("s\u{fffd}1#"));
        // The change keeps who made it: its actor's id, fitted, not dropped. (What the mutation
        // did: the goal change was recorded without its actor id; review of stop 72, SG56.)
        assert_eq!(e.actor_type, ActorType::Human);
        assert!(
            e.actor_id.as_deref().is_some_and(|id| id.contains("bob")),
            "{:?}",
            e.actor_id
        );
        w.manager_notified(summary);
    }
}

#[tokio::test]
async fn a_broken_owner_or_operation_id_still_records_the_compaction() {
    let w = World::watched().await;
    let compaction = |operation_id: &str, owner: Option<String>| Compaction {
        session: k(CHILD),
        agent_id: None,
        session_id: Some("s".repeat(MAX_KEY_BYTES + 1)),
        run_id: Some("run\r".into()),
        operation_id: operation_id.into(),
        owner,
    };
    let first = w
        .svc
        .compacted(compaction("op\n1", Some("o".repeat(5000))))
        .await
        .expect("recorded");
    let e = w.only(EventKind::Compacted).await;
    assert_eq!(
        e.payload, None,
        "an owner too large for the payload leaves the event without it"
    );
    // A compaction is the system's doing, whoever owns it, as OpenClaw records it. (What the
    // mutation did: it was recorded as an agent's; review of stop 72, SG54.)
    assert_eq!(e.actor_type, ActorType::System);
    // Its session id too long for an id is fitted, not dropped: the history still says which
    // incarnation compacted. (What the mutation did: the compaction was recorded without its
    // session id; review of stop 72, SG69.)
    assert!(
        e.session_id
            .as_deref()
            .is_some_and(|id| id.starts_with("sss") && id.len() <= MAX_KEY_BYTES),
        "{:?}",
        e.session_id
    );
    // An owner with a control character is a valid payload value: kept as given.
    let w2 = World::watched().await;
    w2.svc
        .compacted(compaction("op2", Some("harness\tx".into())))
        .await
        .expect("recorded");
    let e = w2.only(EventKind::Compacted).await;
    assert_eq!(e.payload.as_ref().unwrap()["owner"], "harness\tx");
    // An empty owner is none: no payload, as for the embedded runtime.
    let w3 = World::watched().await;
    w3.svc
        .compacted(compaction("op3", Some(String::new())))
        .await
        .expect("recorded");
    assert_eq!(w3.only(EventKind::Compacted).await.payload, None);
    // The same operation is deduplicated, another one (differing only in the broken
    // character) is not.
    let again = w.svc.compacted(compaction("op\n1", None)).await.unwrap();
    assert_eq!(again.sequence, first.sequence);
    let other = w.svc.compacted(compaction("op\t1", None)).await.unwrap();
    assert_ne!(other.sequence, first.sequence);

    // An empty operation id does not merge two sessions' compactions into one event.
    let w = World::watched().await;
    let a = w.svc.compacted(compaction("", None)).await.unwrap();
    let other_child = k("agent:main:subagent:other");
    let b = w
        .svc
        .compacted(Compaction {
            session: other_child.clone(),
            ..compaction("", None)
        })
        .await
        .unwrap();
    assert_eq!(a.session_key, k(CHILD));
    assert_eq!(
        b.session_key, other_child,
        "its own event, not the other one's"
    );
    assert_ne!(a.sequence, b.sequence);
    assert_valid(&a);
    assert_valid(&b);
}

#[tokio::test]
async fn broken_run_ids_still_record_the_spawn_its_seed_and_the_outcome() {
    let long = "r".repeat(2 * MAX_KEY_BYTES);
    for run_id in ["run\n1", long.as_str(), ""] {
        let w = world();
        let spawned = w
            .svc
            .subagent_spawned(&k(CHILD), None, &k(MANAGER), run_id)
            .await;
        assert!(spawned.is_some(), "{run_id:?}: recorded");
        let spawn = w.only(EventKind::ChildSpawned).await;
        // The seed happened: a human message on the worker notifies the manager.
        w.svc.human_message(message("telegram")).await.unwrap();
        w.manager_notified(run_id);
        let ended = w
            .svc
            .subagent_ended(&k(CHILD), None, run_id, RunOutcome::Timeout)
            .await;
        assert!(ended.is_some(), "{run_id:?}: outcome recorded");
        let outcome = w.only(EventKind::RunFailed).await;
        assert_eq!(outcome.run_id, spawn.run_id, "{run_id:?}: one run, one id");
        assert_eq!(outcome.run_id.is_none(), run_id.is_empty());
    }
    // Two children spawned with an empty run id are two spawns, each seeding its cursor.
    let w = world();
    let other = k("agent:main:subagent:other");
    let a = w
        .svc
        .subagent_spawned(&k(CHILD), None, &k(MANAGER), "")
        .await;
    let b = w.svc.subagent_spawned(&other, None, &k(MANAGER), "").await;
    assert_eq!(a.unwrap().session_key, k(CHILD));
    assert_eq!(b.unwrap().session_key, other);
    let manager = WatcherKey::parse(MANAGER).unwrap();
    assert!(w.store.cursor(&manager, &other).await.unwrap().is_some());
}

#[tokio::test]
async fn a_broken_catalog_or_host_id_still_records_the_adoption() {
    // (catalog, host, whether the payload is kept): ids are kept as given, and the payload is
    // left out when they make it larger than 4 KiB (a quote is two bytes in JSON).
    for (catalog, host, kept) in [
        ("c".repeat(190), "h".to_owned(), true),
        ("claude\ncode".to_owned(), "h\u{2028}".to_owned(), true),
        ("claude-code".to_owned(), "\"".repeat(5000), false),
        ("\"".repeat(2000), "\"".repeat(2000), false),
    ] {
        let w = world();
        let recorded = w.svc.adopted(&child(), &catalog, &host).await;
        assert!(recorded.is_some(), "{catalog:?} {host:?}");
        let e = w.only(EventKind::Adopted).await;
        assert!(e.summary.starts_with("adopted from "), "{}", e.summary);
        let want = kept.then(|| json!({"catalogId": catalog, "hostId": host}));
        assert_eq!(
            e.payload.as_ref().map(|p| json!(p)),
            want,
            "{catalog:?} {host:?}"
        );
    }
    let w = world();
    let e = w.svc.adopted(&child(), "claude\ncode", "h").await.unwrap();
    assert_eq!(e.summary, "adopted from claude code");
    // A blank catalog id is said as `unknown`, as a blank channel is. (What the mutation did:
    // the summary ended `adopted from ` with nothing after it; review of stop 72, SG52.)
    let w = world();
    let e = w.svc.adopted(&child(), " ", "h").await.unwrap();
    assert_eq!(e.summary, "adopted from unknown");
}

/// The actors OpenClaw records: an adoption is a human's (no id); a creation is the actor the
/// session entry names, with its id. (A review of stop 55 found both recorded as `system`.)
#[tokio::test]
async fn adoptions_and_creations_carry_the_actors_openclaw_records() {
    let w = world();
    w.svc
        .adopted(&child(), "claude-code", "local")
        .await
        .unwrap();
    let e = w.only(EventKind::Adopted).await;
    assert_eq!(
        (e.actor_type, e.actor_id.as_deref()),
        (ActorType::Human, None)
    );

    for (actor, id) in [
        (ActorType::Human, Some("profile-1")),
        (ActorType::Agent, Some(MANAGER)),
        (ActorType::System, None),
    ] {
        let w = world();
        let actor_id = id.map(str::to_owned);
        w.svc
            .session_created(&child(), "s1", (actor, actor_id))
            .await
            .unwrap();
        let e = w.only(EventKind::Created).await;
        assert_eq!((e.actor_type, e.actor_id.as_deref()), (actor, id));
    }
}

#[tokio::test]
async fn a_broken_session_id_still_records_the_creation() {
    let long = "s".repeat(MAX_KEY_BYTES + 1);
    for session_id in ["s\n1", long.as_str(), ""] {
        let w = world();
        let recorded = w
            .svc
            .session_created(&child(), session_id, (ActorType::Human, None))
            .await;
        assert!(recorded.is_some(), "{session_id:?}");
        let e = w.only(EventKind::Created).await;
        assert_eq!(e.session_id.is_none(), session_id.is_empty());
    }
    // Without a session id, two incarnations are two events.
    let w = world();
    let a = w
        .svc
        .session_created(&child(), "", (ActorType::Human, None))
        .await
        .unwrap();
    let b = w
        .svc
        .session_created(&child(), "", (ActorType::Human, None))
        .await
        .unwrap();
    assert_ne!(a.sequence, b.sequence);
}

/// A creation reported twice for one incarnation (a hook retried, a gateway that reports its
/// sessions again after a restart) is one `created` event: the session id makes its dedupe key.
/// (What the mutation did: no dedupe key, so a second `created` event was recorded; review of
/// stop 68, V667.)
#[tokio::test]
async fn a_creation_reported_twice_is_one_event() {
    let w = world();
    let a = w
        .svc
        .session_created(&child(), "s1", (ActorType::Human, None))
        .await
        .unwrap();
    let b = w
        .svc
        .session_created(&child(), "s1", (ActorType::Human, None))
        .await
        .unwrap();
    assert_eq!(
        a.sequence, b.sequence,
        "the second report answers the first event"
    );
    let e = w.only(EventKind::Created).await;
    assert!(e.dedupe_key.is_some(), "keyed by the session id: {e:?}");
}

// ----- a link stored before catalog ids were checked against their summaries --------------------

/// The memory store's links, but every link read back with `catalog_id` (as one stored before
/// `LinkSpec::validate` refused catalog ids too long for their summaries would be).
struct OldLinks {
    inner: Arc<MemoryStore>,
    catalog_id: String,
}

#[async_trait]
impl UpstreamStore for OldLinks {
    async fn upsert_link(
        &self,
        spec: LinkSpec,
        now: Timestamp,
    ) -> Result<UpsertOutcome, StoreError> {
        self.inner.upsert_link(spec, now).await
    }
    async fn link(&self, s: &SessionRef) -> Result<Option<UpstreamLink>, StoreError> {
        self.inner.link(s).await
    }
    async fn links(&self) -> Result<Vec<UpstreamLink>, StoreError> {
        let mut links = self.inner.links().await?;
        for l in &mut links {
            l.catalog_id.clone_from(&self.catalog_id);
        }
        Ok(links)
    }
    async fn set_marker(
        &self,
        s: &SessionRef,
        expected: Timestamp,
        marker: Value,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        self.inner.set_marker(s, expected, marker, now).await
    }
    async fn mark_scanned(&self, s: &SessionRef, now: Timestamp) -> Result<bool, StoreError> {
        self.inner.mark_scanned(s, now).await
    }
    async fn remove_link(&self, s: &SessionRef, e: Option<Timestamp>) -> Result<bool, StoreError> {
        self.inner.remove_link(s, e).await
    }
}

/// Answers every check with the outcome the test set.
struct Scripted(std::sync::Mutex<CheckOutcome>);

#[async_trait]
impl UpstreamProvider for Scripted {
    fn kind(&self) -> &'static str {
        "scripted"
    }
    async fn check(&self, _: &UpstreamLink, _: &[String]) -> CheckOutcome {
        self.0.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn a_stored_catalog_id_too_long_for_its_summaries_still_records_the_monitor_events() {
    let w = World::watched().await;
    w.svc
        .try_adopt(LinkSpec::new(child(), "remote", "h", "t", "scripted"))
        .await
        .unwrap();
    let provider = Arc::new(Scripted(std::sync::Mutex::new(CheckOutcome::HumanTurns {
        turns: 2,
        dedupe_id: "turn-9".into(),
        source_id: "h/t".into(),
        marker: json!({"uuid": "turn-9"}),
    })));
    let monitor = UpstreamMonitor::builder(
        w.svc.clone(),
        Arc::new(OldLinks {
            inner: w.store.clone(),
            catalog_id: format!("{}\n", "c".repeat(190)),
        }),
    )
    .provider(provider.clone())
    .config(MonitorConfig {
        missing_checks: 1,
        ..MonitorConfig::default()
    })
    .build();
    let mut rx = monitor.subscribe();

    monitor.tick().await;
    let human = w.only(EventKind::HumanDirectMessage).await;
    assert!(
        human.summary.starts_with("human message via ccc"),
        "{}",
        human.summary
    );
    assert_eq!(human.payload.as_ref().unwrap()["turns"], json!(2));
    w.manager_notified("human turns");

    *provider.0.lock().unwrap() = CheckOutcome::Missing;
    monitor.tick().await;
    let missing = w.only(EventKind::UpstreamMissing).await;
    assert!(
        missing.summary.starts_with("upstream missing via ccc"),
        "{}",
        missing.summary
    );
    let mut removed = None;
    while let Ok(d) = rx.try_recv() {
        if let Detection::UpstreamMissing { link_removed, .. } = d {
            removed = Some(link_removed);
        }
    }
    assert_eq!(
        removed,
        Some(true),
        "the link goes once its event is recorded"
    );
}

/// A producer that passes a chat platform's message time in seconds (Telegram's `date`,
/// Slack's `ts`) has it read as milliseconds, in 1970, and recorded as 24 h ago: it was done
/// without a word, and every such message's `occurredAt` was a day off (and pruned a day
/// early). It is still clamped (DESIGN 3), with a warning that names the unit; a time within
/// the 24 h is not warned of, and `Timestamp::from_unix_secs` gives the time meant.
#[tokio::test]
async fn a_producer_time_older_than_a_day_is_recorded_clamped_with_a_warning() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let w = World::watched().await;
    let secs = Timestamp::now().0 / 1_000;
    let mut msg = HumanMessage::new(k(CHILD));
    msg.occurred_at = Some(Timestamp(secs));
    let before = w.svc.now();
    let clamped = w.svc.human_message(msg).await.expect("recorded");
    assert!(
        clamped.occurred_at >= before.minus_ms(Timestamp::DAY_MS),
        "clamped into the last 24 h: {:?}",
        clamped.occurred_at
    );
    let warned = |capture: &common::Capture| {
        capture
            .lines()
            .iter()
            .filter(|l| l.contains("more than 24 h old") && l.contains("level=WARN"))
            .count()
    };
    assert_eq!(warned(&capture), 1, "{:?}", capture.lines());
    let mut msg = HumanMessage::new(k(CHILD));
    msg.occurred_at = Some(Timestamp::from_unix_secs(secs));
    let meant = w.svc.human_message(msg).await.expect("recorded");
    assert_eq!(meant.occurred_at, Timestamp(secs * 1_000));
    assert_eq!(warned(&capture), 1, "no warning for a time within the day");
}

/// Dedupe keys are store-wide (DESIGN 3), so a harness that numbers its compactions per
/// session (`compacted:1` in each) had the second session's compaction answered with the
/// first session's event, and nothing recorded for it, without a word. It is still not
/// recorded (the key format is OpenClaw's), with a warning that names both sessions; the same
/// operation recorded again for its own session (a retry) is not warned of. An adoption's
/// `adopted` event, written on its own task, is warned of alike.
#[tokio::test]
async fn a_dedupe_key_taken_by_another_sessions_event_is_warned_of() {
    let capture = common::Capture::default();
    let _logs = capture.install();
    let w = world();
    let compaction = |session: &str| Compaction {
        session: k(session),
        agent_id: None,
        session_id: None,
        run_id: None,
        operation_id: "1".into(),
        owner: Some("codex".into()),
    };
    let first = w.svc.compacted(compaction(CHILD)).await.expect("recorded");
    let retried = w
        .svc
        .compacted(compaction(CHILD))
        .await
        .expect("deduplicated");
    assert_eq!(retried.sequence, first.sequence);
    let warned = |capture: &common::Capture| -> Vec<String> {
        capture
            .lines()
            .into_iter()
            .filter(|l| l.contains("dedupe key is an event of another session"))
            .collect()
    };
    assert!(
        warned(&capture).is_empty(),
        "a retry: {:?}",
        warned(&capture)
    );
    let other = "agent:main:subagent:other";
    let answered = w.svc.compacted(compaction(other)).await.expect("answered");
    assert_eq!(
        answered.sequence, first.sequence,
        "the first session's event"
    );
    let lines = warned(&capture);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains(other) && lines[0].contains(CHILD) && lines[0].contains("level=WARN"),
        "{}",
        lines[0]
    );
    // An adoption's event too: `adopted:<sessionKey>` names no agent, so a second agent
    // adopting the same bare key is answered with the first one's event.
    for agent in ["alpha", "beta"] {
        let adopted = SessionRef::parse("global", agent).unwrap();
        w.svc
            .try_adopt(LinkSpec::new(adopted, "remote", "h", "t", "paired-node"))
            .await
            .expect("adopted");
    }
    let lines = warned(&capture);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[1].contains("beta") && lines[1].contains("alpha"),
        "{}",
        lines[1]
    );
}

/// A spawn whose requester has a bare key (`global`, which cannot watch) is still recorded: only
/// the seed of the requester's cursor is left out. (What the mutation did: answered `None` for
/// such a spawn, recording nothing, so the child's history lacked its `child_spawned`; review of
/// stop 71, SE44.)
#[tokio::test]
async fn a_spawn_by_a_bare_requester_is_recorded_without_a_watch() {
    let w = world();
    let event = w
        .svc
        .subagent_spawned(&k(CHILD), None, &k("global"), "run-1")
        .await
        .expect("the spawn is recorded");
    assert_eq!(event.kind, EventKind::ChildSpawned);
    assert_eq!(event.session_key, k(CHILD));
}

/// A producer's event on a bare key (`global`) whose agent the caller does not name is recorded
/// for the configured default agent ([`gateway_adapter::AwarenessConfig::default_agent`]), not for
/// `main`. (What the mutation did: took `main` for every bare key, so a gateway whose default
/// agent is `ops` recorded ops's compaction under main's `global`; review of stop 71, SE42.)
#[tokio::test]
async fn a_bare_keys_event_is_recorded_for_the_configured_default_agent() {
    let ops = awareness_core::AgentId::new("ops").unwrap();
    let (svc, _, _) = common::service_configured(
        Arc::new(MemoryStore::new()),
        None,
        Arc::new(gateway_adapter::InMemoryDirectory::new()),
        gateway_adapter::AwarenessConfig {
            default_agent: ops.clone(),
            ..gateway_adapter::AwarenessConfig::default()
        },
    );
    let event = svc
        .compacted(Compaction {
            session: k("global"),
            agent_id: None,
            session_id: None,
            run_id: None,
            operation_id: "1".into(),
            owner: None,
        })
        .await
        .expect("recorded");
    assert_eq!(
        event.agent_id, ops,
        "the bare key is the configured default agent's session"
    );
}

/// A bare target key (`global`) that the requester names without an agent, and that no cursor of
/// the requester follows, is the requester's agent's session: `agent:ops:main` asking about
/// `global` reads ops's `global`, not the default agent's. (Taking the default agent there
/// passed every test, and ops was answered `main`'s `global`: review of stop 62, A30.)
#[tokio::test]
async fn a_bare_target_is_the_requesters_agents_session() {
    let (svc, _, _) = common::service(Arc::new(MemoryStore::new()), None);
    let ops = awareness_core::AgentId::new("ops").unwrap();
    let event = awareness_core::NewEvent::new(
        SessionRef::new(k("global"), ops),
        awareness_core::EventKind::Compacted,
        awareness_core::ActorType::System,
        "session compacted",
    );
    assert!(svc.record(event).await.is_some(), "recorded");
    let status = svc
        .session_status(
            &k("agent:ops:main"),
            &k("global"),
            None,
            Some(awareness_core::Sequence(0)),
            None,
        )
        .await
        .expect("visible");
    assert!(!status.unavailable, "{status:?}");
    assert_eq!(
        status.state_version,
        awareness_core::Sequence(1),
        "ops's global, which has the event"
    );
}

/// `session_status` of a session the visibility policy hides from the requester is refused
/// (`NotVisible`), revealing nothing, not even its version: under `SameAgent`, ops's main
/// session does not see main's worker.
/// (What the mutation did: the policy was not asked, and ops read the worker's version and
/// changes; review of stop 69, V754.)
#[tokio::test]
async fn a_session_the_policy_hides_is_not_reconciled() {
    let store = Arc::new(MemoryStore::new());
    let svc = gateway_adapter::Awareness::builder(
        store.clone(),
        Arc::new(gateway_adapter::InMemoryQueue::new()),
        Arc::new(gateway_adapter::RecordingWake::new()),
        Arc::new(gateway_adapter::InMemoryDirectory::new()),
    )
    .visibility(Arc::new(gateway_adapter::SameAgent))
    .build();
    let event = awareness_core::NewEvent::new(
        child(),
        EventKind::Compacted,
        ActorType::System,
        "session compacted",
    );
    assert!(svc.record(event).await.is_some(), "recorded");
    let status = svc
        .session_status(
            &k("agent:ops:main"),
            &k(CHILD),
            None,
            Some(Sequence(0)),
            None,
        )
        .await;
    assert!(status.is_err(), "hidden from another agent: {status:?}");
    let text = svc
        .session_status_text(&k("agent:ops:main"), &k(CHILD), None, None, None)
        .await;
    assert!(text.contains("is not visible"), "{text}");
    // Nor may it watch the session through `sessions_send`: refused as not visible, no cursor
    // made. (What the mutation did: the policy was not asked, and ops's main session watched
    // main's worker and would be told of its changes; review of stop 72, SG62.)
    let watch = svc
        .watch_after_send(&k("agent:ops:main"), &k(CHILD), None, true)
        .await;
    assert_eq!(
        watch,
        gateway_adapter::WatchOutcome {
            watched: false,
            refused: Some(gateway_adapter::WatchRefusal::NotVisible),
        }
    );
    let cursor = store
        .cursor(&WatcherKey::parse("agent:ops:main").unwrap(), &k(CHILD))
        .await
        .expect("read");
    assert!(cursor.is_none(), "no watch made: {cursor:?}");
    // Its own agent's session sees it.
    let own = svc
        .session_status(&k("agent:main:main"), &k(CHILD), None, None, None)
        .await
        .expect("visible to its own agent");
    assert_eq!(own.state_version, Sequence(1));
}

/// A read bounded by `store_wait` polled outside a Tokio runtime (a host polling the service's
/// futures itself, as the benches do over the in-memory store) is answered, awaited whole: no timer
/// can be set there (set all the same, it panicked with no reactor running: review of stop 62,
/// A37).
#[test]
fn a_bounded_read_outside_a_tokio_runtime_is_answered() {
    use std::future::Future as _;
    let (svc, _, _) = common::service(Arc::new(MemoryStore::new()), None);
    let (manager, child) = (k(MANAGER), k(CHILD));
    let mut status = std::pin::pin!(svc.session_status(
        &manager,
        &child,
        None,
        Some(awareness_core::Sequence(0)),
        None,
    ));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match status.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(status) => {
            assert!(!status.expect("visible").unavailable, "answered");
        }
        std::task::Poll::Pending => panic!("the in-memory store answers at once"),
    }
}

/// A bare requester key (`global`) watches nothing, so a bare target it names without an agent is
/// its own agent's (the default agent's) session, which is read: the answer is not "unavailable".
/// (What the mutation did: every such question answered "unavailable"; review of stop 64, SV08.)
#[tokio::test]
async fn a_bare_requester_reads_a_bare_target_of_its_own_agent() {
    let (svc, _, _) = common::service(Arc::new(MemoryStore::new()), None);
    let main = awareness_core::AgentId::new("main").unwrap();
    let event = awareness_core::NewEvent::new(
        SessionRef::new(k("global"), main),
        awareness_core::EventKind::Compacted,
        awareness_core::ActorType::System,
        "session compacted",
    );
    assert!(svc.record(event).await.is_some(), "recorded");
    let status = svc
        .session_status(&k("global"), &k("global"), None, Some(Sequence(0)), None)
        .await
        .expect("visible");
    assert!(
        !status.unavailable,
        "a bare requester has no cursor to read: its agent's session is read: {status:?}"
    );
    assert_eq!(
        status.state_version,
        Sequence(1),
        "main's global, which has the event"
    );
}

/// A goal change given no entry asks the directory for it, and notifies the spawner the
/// directory's entry names. (What the mutation did: the directory not asked, a spawner not yet
/// watching the child was never told; review of stop 65, SW13.)
#[tokio::test]
async fn a_goal_change_without_an_entry_finds_the_spawner_in_the_directory() {
    let store = Arc::new(MemoryStore::new());
    let directory = Arc::new(gateway_adapter::InMemoryDirectory::new());
    directory.upsert(
        k(CHILD),
        SessionEntry {
            spawned_by: Some(k(MANAGER)),
            ..SessionEntry::default()
        },
    );
    let (svc, queue, _wake) = common::service_in(store, None, directory);
    svc.goal_changed(
        &k(CHILD),
        None,
        "goal updated",
        (ActorType::Human, None),
        None,
    )
    .await
    .expect("recorded");
    let queued = queue.peek(&k(MANAGER));
    assert_eq!(
        queued.len(),
        1,
        "the spawner the directory names is notified: {queued:?}"
    );
}

/// A run that completed records no payload, as OpenClaw's does (only a failed run says its
/// outcome). (What the mutation did: `{"outcome":"ok"}` recorded; review of stop 65, SW15.)
#[tokio::test]
async fn a_completed_run_records_no_outcome_payload() {
    let w = World::watched().await;
    w.svc
        .subagent_ended(&k(CHILD), None, "run-1", RunOutcome::Ok)
        .await
        .expect("recorded");
    let e = w.only(EventKind::RunCompleted).await;
    assert_eq!(e.payload, None, "no payload for a completed run");
}

/// A run that did not complete records `run_failed` with its outcome, whichever way it ended:
/// a cancelled run is no completed one, and its spawner is told it failed.
/// (What the mutation did: a cancelled run recorded `run_completed`; review of stop 68, V604.)
#[tokio::test]
async fn every_run_that_did_not_complete_records_its_outcome_as_a_failure() {
    for (outcome, summary) in [
        (RunOutcome::Error, "child run failed"),
        (RunOutcome::Timeout, "child run timed out"),
        (RunOutcome::Cancelled, "child run cancelled"),
    ] {
        let w = World::watched().await;
        w.svc
            .subagent_ended(&k(CHILD), None, "run-1", outcome)
            .await
            .expect("recorded");
        assert!(
            w.events(&child(), EventKind::RunCompleted).await.is_empty(),
            "{outcome:?}: no run_completed for a run that did not complete"
        );
        let e = w.only(EventKind::RunFailed).await;
        assert_eq!(
            e.payload.as_ref().and_then(|p| p.get("outcome")),
            Some(&json!(outcome.as_str())),
            "{outcome:?}: the failure says how the run ended"
        );
        // The summary the spawner reads says how the run ended too: a run that timed out is
        // not told as one that failed. (What the mutation did: a timed-out run summarised as
        // `child run failed`; review of stop 72, SG22.)
        assert_eq!(
            e.summary, summary,
            "{outcome:?}: the summary says how it ended"
        );
    }
}

/// A spawn is recorded with its spawner's session key as its actor id, as OpenClaw records it:
/// the child's history says who spawned it.
/// (What the mutation did: the `child_spawned` event was recorded with no actor id; review of
/// stop 69, V728.)
#[tokio::test]
async fn a_spawn_names_its_spawner_as_its_actor() {
    let w = World::watched().await;
    let e = w.only(EventKind::ChildSpawned).await;
    assert_eq!(e.actor_type, ActorType::Agent);
    assert_eq!(
        e.actor_id.as_deref(),
        Some(MANAGER),
        "the spawn's actor is its spawner"
    );
}

/// A run's end reported twice (a host's retry) is one event, and its spawner is told once.
/// (What the mutation did: `run_failed` was recorded without its `run-terminal:` dedupe key, so
/// the retry recorded a second event; review of stop 69, V730.)
#[tokio::test]
async fn a_run_end_reported_twice_is_one_event() {
    let w = World::watched().await;
    let first = w
        .svc
        .subagent_ended(&k(CHILD), None, "run-1", RunOutcome::Error)
        .await
        .expect("recorded");
    let again = w
        .svc
        .subagent_ended(&k(CHILD), None, "run-1", RunOutcome::Error)
        .await
        .expect("answered");
    assert_eq!(
        again.sequence, first.sequence,
        "the retry is the same event"
    );
    w.only(EventKind::RunFailed).await;
}

/// A compaction keeps the run id it was made in, fitted as an id.
/// (What the mutation did: the `compacted` event was recorded without its run id; review of
/// stop 69, V732.)
#[tokio::test]
async fn a_compaction_keeps_its_run_id() {
    let w = World::watched().await;
    w.svc
        .compacted(Compaction {
            session: k(CHILD),
            agent_id: None,
            session_id: None,
            run_id: Some("run-7".into()),
            operation_id: "op-1".into(),
            owner: None,
        })
        .await
        .expect("recorded");
    let e = w.only(EventKind::Compacted).await;
    assert_eq!(
        e.run_id.as_deref(),
        Some("run-7"),
        "the compaction's run id"
    );
}

/// Each outcome's spelling parses back to that outcome, as a host hands it over.
/// (What the mutation did: `timeout` parsed as `Error`; review of stop 68, V603.)
#[test]
fn each_run_outcome_parses_from_its_spelling() {
    for outcome in [
        RunOutcome::Ok,
        RunOutcome::Error,
        RunOutcome::Timeout,
        RunOutcome::Cancelled,
    ] {
        assert_eq!(
            RunOutcome::parse(outcome.as_str()),
            Some(outcome),
            "{outcome:?} parses from {:?}",
            outcome.as_str()
        );
    }
    assert_eq!(
        RunOutcome::parse("done"),
        None,
        "an unknown outcome parses to none"
    );
}
