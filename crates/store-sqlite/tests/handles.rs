//! Two handles on one file behave as two gateway processes: what one writes, the other's next
//! operation sees, whichever internal path that operation takes.

use awareness_core::{
    ActorType, AwarenessStoreExt, CursorFilter, CursorStore, EventKind, EventStore, NewEvent,
    Sequence, SessionRef, Timestamp, WatcherKey,
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
async fn a_watch_made_through_another_handle_is_honoured_by_the_next_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let a = SqliteStore::open(&path).await.unwrap();
    let b = SqliteStore::open(&path).await.unwrap();
    let child = SessionRef::parse("agent:main:subagent:c1", "main").unwrap();
    let manager = WatcherKey::parse("agent:main:main").unwrap();

    // `a` has recorded on the child while nobody watched it.
    let first = a.record(human(&child), T0).await.unwrap();
    assert!(first.notices.is_empty());
    // `b` starts watching; `a` does not know.
    b.watch(&manager, &child, T0).await.unwrap();
    let second = a.record(human(&child), T0).await.unwrap();
    assert_eq!(second.notices.len(), 1, "the watch made elsewhere notifies");
    assert_eq!(second.notices[0].last_seen, first.event.sequence);
    assert_eq!(
        second.event.sequence,
        first.event.sequence.next(),
        "the record that found a cursor spent exactly one sequence"
    );
    let c = a
        .cursor(&manager, &child.session_key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (c.last_seen, c.notified, c.material),
        (Sequence(1), Sequence(2), Sequence(2))
    );

    // `b` removes the watch; `a` still believes the child is watched, and records correctly.
    assert!(b.unwatch(&manager, &child.session_key).await.unwrap());
    let third = a.record(human(&child), T0).await.unwrap();
    assert!(third.notices.is_empty());
    assert_eq!(third.event.sequence, Sequence(3));
    assert!(
        a.cursors(&CursorFilter::default())
            .await
            .unwrap()
            .is_empty()
    );

    // A dedupe hit through each handle returns the first row and spends a sequence.
    let d1 = a
        .record(human(&child).with_dedupe_key("dk"), T0)
        .await
        .unwrap();
    let d2 = b
        .record(human(&child).with_dedupe_key("dk"), T0)
        .await
        .unwrap();
    assert!(!d1.deduplicated && d2.deduplicated);
    assert_eq!(d2.event, d1.event);
    let next = b.record(human(&child), T0).await.unwrap();
    assert_eq!(next.event.sequence, Sequence(6), "the hit spent sequence 5");
    assert_eq!(a.state_version(&child).await.unwrap(), Sequence(6));
    a.close().await;
    b.close().await;
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
