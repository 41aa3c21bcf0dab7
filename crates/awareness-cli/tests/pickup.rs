//! Two processes on one SQLite file (DESIGN.md section 9.1): a gateway in this test's process
//! runs its pick-up task, and the `awareness` command, another process, makes a watch for one
//! of the gateway's sessions and records a change on its target. The gateway learns of it from
//! the file alone: it wakes its session with the notice queued, and the session's turn
//! acknowledges it in the file, where the command then reads it.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use awareness_core::SessionKey;
use gateway_adapter::{
    Awareness, AwarenessConfig, HeartbeatWake, InMemoryDirectory, InMemoryQueue, SessionEntry,
    SystemEventQueue, open_store,
};
use serde_json::Value;
use tokio::sync::mpsc;

const MANAGER: &str = "agent:main:main";
const WORKER: &str = "agent:main:subagent:worker";

/// Sends every wake to a channel, so that the test waits for one instead of for time.
struct WakeChannel(mpsc::UnboundedSender<SessionKey>);

impl HeartbeatWake for WakeChannel {
    fn wake(&self, session: &SessionKey, _reason: &str) {
        let _ = self.0.send(session.clone());
    }
}

/// Runs the command (another process) on the store and returns what it printed; it must succeed.
fn awareness(url: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_awareness"))
        .env_remove("AWARENESS_LOG")
        .arg("--store")
        .arg(url)
        .args(args)
        .output()
        .expect("run awareness");
    assert!(
        out.status.success(),
        "awareness {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_the_command_hands_out_wakes_the_gateways_session() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("state.db").display());
    let store = open_store(&url).await.expect("open the store");
    let directory = Arc::new(InMemoryDirectory::new());
    directory.upsert(SessionKey::new(MANAGER).unwrap(), SessionEntry::default());
    let queue = Arc::new(InMemoryQueue::new());
    let (tx, mut woken) = mpsc::unbounded_channel();
    let svc = Arc::new(
        Awareness::builder(store, queue.clone(), Arc::new(WakeChannel(tx)), directory)
            .config(AwarenessConfig {
                pickup_interval: Duration::from_millis(10),
                ..AwarenessConfig::default()
            })
            .build(),
    );
    let pickup = svc.spawn_pickup();

    let (watch_url, record_url) = (url.clone(), url.clone());
    tokio::task::spawn_blocking(move || {
        awareness(&watch_url, &["watch", MANAGER, WORKER]);
        awareness(
            &record_url,
            &[
                "record",
                "--session",
                WORKER,
                "--kind",
                "human_direct_message",
                "--actor-type",
                "human",
                "--summary",
                "human message via telegram",
            ],
        );
    })
    .await
    .expect("the command ran");

    let manager = SessionKey::new(MANAGER).unwrap();
    let who = tokio::time::timeout(Duration::from_mins(1), woken.recv())
        .await
        .expect("the gateway wakes its session")
        .expect("the wake channel is open");
    assert_eq!(who, manager);
    let lines = queue.peek(&manager);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].text.contains(WORKER), "{}", lines[0].text);

    let read = svc.drain_turn(&manager).await;
    assert_eq!(read, lines, "the turn reads the notice");
    pickup.abort();
    let _ = pickup.await;

    let cursors: Value = serde_json::from_str(&awareness(
        &url,
        &["cursors", "--json", "--watcher", MANAGER],
    ))
    .expect("JSON");
    let cursor = &cursors.as_array().expect("a list")[0];
    assert_eq!(
        cursor["lastSeen"], cursor["notified"],
        "the command reads the acknowledgement: {cursor}"
    );
    assert_eq!(
        cursor["lastSeen"], 1,
        "acknowledged up to the recording: {cursor}"
    );
}
