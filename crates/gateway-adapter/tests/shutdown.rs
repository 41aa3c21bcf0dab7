//! The shutdown the crate docs describe: once the monitor is stopped, the pruning task aborted
//! and awaited, the service's writes waited for and the service dropped, closing the store
//! through its last handle leaves a file that holds every commit on its own; and a monitor
//! stopped while one of its checks is inside a recording lets go of the store only once that
//! recording has ended.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use awareness_core::testkit::hooked::{Call, Hook, Hooked};
use awareness_core::{
    AwarenessStore, CursorStore as _, LinkSpec, SessionRef, UpstreamLink, WatcherKey, async_trait,
};
use gateway_adapter::MonitorConfig;
use gateway_adapter::upstream::{CheckOutcome, UpstreamMonitor, UpstreamProvider};
use store_memory::MemoryStore;
use tokio::sync::{Semaphore, mpsc};

mod common;

/// Bug: a pruning or pick-up task whose handle was dropped (not aborted) held the service, and
/// with it the store, for good: closing the store became a drop of one handle, and a redb file
/// stayed locked. The tasks hold the service only while they work: dropping the service lets
/// go of the store at once, and each task ends at its next interval.
#[tokio::test(start_paused = true)]
async fn background_tasks_let_go_of_a_dropped_service() {
    // A store another writer commits to, as a shared SQLite file is (the task asks on at
    // every interval on any store).
    struct Shared;
    #[async_trait]
    impl Hook for Shared {
        fn foreign_commits(&self) -> Option<u64> {
            Some(7)
        }
    }
    let store = Arc::new(Hooked {
        inner: Arc::new(MemoryStore::new()),
        hook: Shared,
    });
    let (awareness, _, _) = common::service(store.clone(), None);
    let pruning = awareness.spawn_pruning();
    let pickup = awareness.spawn_pickup();
    // Both tasks started (pruning past its first tick, the pick-up at its first question).
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(
        !pickup.is_finished(),
        "the pick-up asks on: another writer commits"
    );
    drop(awareness);
    assert_eq!(
        Arc::strong_count(&store),
        1,
        "nothing but this test holds the store once the service is dropped"
    );
    let config = gateway_adapter::AwarenessConfig::default();
    tokio::time::sleep(config.pickup_interval).await;
    assert!(
        pickup.is_finished(),
        "the pick-up ended at its next interval"
    );
    assert!(
        !pruning.is_finished(),
        "pruning waits for its next interval"
    );
    tokio::time::sleep(config.prune_interval).await;
    assert!(pruning.is_finished(), "pruning ended at its next interval");
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_shutdown_leaves_every_commit_in_the_file() {
    use awareness_core::{AwarenessStoreExt as _, SessionKey};
    use gateway_adapter::upstream::JsonlProvider;
    use gateway_adapter::{HumanMessage, open_full_store};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state.sqlite");
    let url = format!("sqlite://{}", file.display());
    let store = open_full_store(&url).await.unwrap();
    let (awareness, _, _) = common::service(store.clone(), Some(store.clone()));
    let pruning = awareness.spawn_pruning();
    let pickup = awareness.spawn_pickup();
    let monitor = UpstreamMonitor::builder(awareness.clone(), store.clone())
        .provider(Arc::new(JsonlProvider::new()))
        .build();
    let task = monitor.spawn();
    let child = SessionKey::new("agent:main:subagent:worker").unwrap();
    let mut msg = HumanMessage::new(child.clone());
    msg.channel = Some("telegram".into());
    msg.entry = Some(gateway_adapter::SessionEntry {
        spawned_by: Some(SessionKey::new("agent:main:main").unwrap()),
        ..Default::default()
    });
    let event = awareness
        .human_message(msg)
        .await
        .expect("the message is recorded");

    task.stop().await;
    drop(monitor);
    pruning.abort();
    let _ = pruning.await;
    pickup.abort();
    let _ = pickup.await;
    awareness.wait_for_writes().await;
    drop(awareness);
    assert_eq!(
        Arc::strong_count(&store),
        1,
        "after the documented steps, nothing else holds the store"
    );
    store.close().await;

    let copy = dir.path().join("copy.sqlite");
    std::fs::copy(&file, &copy).unwrap();
    let alone = open_full_store(&format!("sqlite://{}", copy.display()))
        .await
        .unwrap();
    let r = SessionRef::new(child, event.agent_id.clone());
    assert_eq!(
        alone.state_version(&r).await.unwrap(),
        event.sequence,
        "the file alone holds the recording"
    );
}

/// Holds every recording, once armed, until the test closes `gate`; says when one got there.
struct RecordGate {
    armed: AtomicBool,
    entered: mpsc::UnboundedSender<()>,
    gate: Semaphore,
}

#[async_trait]
impl Hook for RecordGate {
    async fn before(&self, call: Call, _: &dyn AwarenessStore) {
        if call == Call::Record && self.armed.load(Ordering::SeqCst) {
            let _ = self.entered.send(());
            // Closed by the test: the gate is open.
            let _ = self.gate.acquire().await;
        }
    }
}

/// Finds one human turn at every check.
struct OneTurn;

#[async_trait]
impl UpstreamProvider for OneTurn {
    fn kind(&self) -> &'static str {
        "one-turn"
    }

    async fn check(&self, _: &UpstreamLink, _: &[String]) -> CheckOutcome {
        CheckOutcome::HumanTurns {
            turns: 1,
            dedupe_id: "turn-1".into(),
            source_id: "node/thread".into(),
            marker: serde_json::json!({"after": "turn-1"}),
        }
    }
}

/// Bug: a check aborted by `stop` while inside a recording left the recording running on a
/// task of its own, holding the store after `stop` returned, so that closing the store did not
/// reach its last handle.
// One thread and tokio's paused clock: the sleep below returns once every other task waits,
// so `stop` has either returned by then or is waiting for the recording.
#[tokio::test(start_paused = true)]
async fn a_monitor_stopped_inside_a_recording_lets_go_of_the_store_once_stop_returns() {
    let links = Arc::new(MemoryStore::new());
    let (entered, mut recording) = mpsc::unbounded_channel();
    let store = Arc::new(Hooked {
        inner: links.clone(),
        hook: RecordGate {
            armed: AtomicBool::new(false),
            entered,
            gate: Semaphore::new(0),
        },
    });
    let (awareness, _, _) = common::service(store.clone(), Some(links.clone()));
    let session = SessionRef::parse("agent:main:remote", "main").unwrap();
    awareness
        .try_adopt(LinkSpec::new(
            session.clone(),
            "remote",
            "node",
            "thread",
            "one-turn",
        ))
        .await
        .unwrap();
    links
        .watch(
            &WatcherKey::parse("agent:main:main").unwrap(),
            &session,
            awareness.now(),
        )
        .await
        .unwrap();
    let monitor = UpstreamMonitor::builder(awareness, links)
        .provider(Arc::new(OneTurn))
        .config(MonitorConfig {
            first_tick: Duration::ZERO,
            ..MonitorConfig::default()
        })
        .build();
    store.hook.armed.store(true, Ordering::SeqCst);
    let task = monitor.spawn();
    recording
        .recv()
        .await
        .expect("the check is inside its recording");

    let stopping = tokio::spawn(task.stop());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !stopping.is_finished(),
        "stop waits for the recording under way rather than leaving it behind"
    );
    store.hook.gate.close();
    stopping.await.expect("stop");
    drop(monitor);
    assert_eq!(
        Arc::strong_count(&store),
        1,
        "the recording of the stopped check still holds the store"
    );
}
