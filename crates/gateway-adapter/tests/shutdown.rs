//! The shutdown the crate docs describe: once the monitor is stopped, the pruning task aborted
//! and awaited, and the service dropped, closing the store through its last handle leaves a
//! file that holds every commit on its own.

use std::sync::Arc;

use awareness_core::{AwarenessStoreExt as _, SessionKey, SessionRef};
use gateway_adapter::upstream::{JsonlProvider, UpstreamMonitor};
use gateway_adapter::{
    Awareness, HumanMessage, InMemoryDirectory, InMemoryQueue, RecordingWake, open_full_store,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_shutdown_leaves_every_commit_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state.sqlite");
    let url = format!("sqlite://{}", file.display());
    let store = open_full_store(&url).await.unwrap();
    let awareness = Arc::new(
        Awareness::builder(
            store.clone(),
            Arc::new(InMemoryQueue::new()),
            Arc::new(RecordingWake::new()),
            Arc::new(InMemoryDirectory::new()),
        )
        .upstream(store.clone())
        .build(),
    );
    let pruning = awareness.spawn_pruning();
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
