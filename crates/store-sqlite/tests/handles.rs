//! A read-only handle beside a read-write one on the same file. (Two read-write handles on one
//! file are the shared durable suite's check, in `tests/conformance.rs`.)

use awareness_core::{
    ActorType, AwarenessStoreExt, EventKind, EventStore, NewEvent, Sequence, SessionRef, Timestamp,
};
use store_sqlite::SqliteStore;

const T0: Timestamp = Timestamp(1_800_000_000_000);

fn human(session: &SessionRef) -> NewEvent {
    NewEvent::new(
        session.clone(),
        EventKind::HumanDirectMessage,
        ActorType::Human,
        "human message via telegram",
    )
}

#[tokio::test]
async fn a_read_only_handle_reads_and_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let rw = SqliteStore::open(&path).await.unwrap();
    let child = SessionRef::parse("agent:main:subagent:c1", "main").unwrap();
    rw.record(human(&child), T0).await.unwrap();
    let options = store_sqlite::SqliteOptions::new().read_only(true);
    let ro = SqliteStore::open_with(&path, options.clone())
        .await
        .unwrap();
    assert_eq!(ro.state_version(&child).await.unwrap(), Sequence(1));
    let err = ro.record(human(&child), T0).await.unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    ro.close().await;
    rw.close().await;

    let missing = dir.path().join("missing.sqlite");
    let err = SqliteStore::open_with(&missing, options).await.unwrap_err();
    assert!(
        matches!(err, awareness_core::StoreError::Open { .. }),
        "{err}"
    );
    assert!(!missing.exists(), "a read-only open creates nothing");
}
