//! Opening files: what is refused (and left untouched), what is shared, and what survives a
//! reopen.

use std::time::Duration;

use awareness_core::{
    ActorType, AwarenessStoreExt, CursorStore, EventKind, EventStore, NewEvent, Sequence,
    SessionRef, StoreError, Timestamp, WatcherKey,
};
use store_redb::{Durability, RedbOptions, RedbStore};

const T0: Timestamp = Timestamp(1_800_000_000_000);

fn child() -> SessionRef {
    SessionRef::parse("agent:main:subagent:child", "main").unwrap()
}

fn human(r: &SessionRef) -> NewEvent {
    NewEvent::new(
        r.clone(),
        EventKind::HumanDirectMessage,
        ActorType::Human,
        "human message via telegram",
    )
}

fn no_create() -> RedbOptions {
    RedbOptions {
        create_if_missing: false,
        ..RedbOptions::default()
    }
}

/// The error is `Open`, names the file, and gives a reason containing `reason`.
fn assert_open_error(err: &StoreError, file: &std::path::Path, reason: &str) {
    match err {
        StoreError::Open {
            path, reason: r, ..
        } => {
            assert_eq!(path, file, "{err}");
            assert!(r.contains(reason), "reason {r:?} lacks {reason:?}");
        }
        other => panic!("expected StoreError::Open, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(&*file.to_string_lossy()),
        "the message names the file: {text}"
    );
}

#[tokio::test]
async fn a_file_that_is_not_redb_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    let bytes: Vec<u8> = b"not a database, but somebody's notes\n"
        .iter()
        .copied()
        .cycle()
        .take(64 * 1024)
        .collect();
    std::fs::write(&path, &bytes).unwrap();
    for options in [
        RedbOptions::default(),
        no_create(),
        RedbOptions::bounded(Duration::from_millis(10)),
    ] {
        let err = RedbStore::open_with(&path, options).await.unwrap_err();
        assert_open_error(&err, &path, "not a redb database");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "the file is unchanged"
        );
    }
}

#[tokio::test]
async fn a_missing_file_without_create_is_refused_and_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.redb");
    let err = RedbStore::open_with(&path, no_create()).await.unwrap_err();
    assert_open_error(&err, &path, "no such file");
    assert!(!path.exists(), "nothing was created");
    let err = RedbStore::open(dir.path().join("no-such-dir/state.redb"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
}

#[tokio::test]
async fn a_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = RedbStore::open(dir.path()).await.unwrap_err();
    assert_open_error(&err, dir.path(), "not a regular file");
}

#[tokio::test]
async fn an_empty_file_becomes_a_new_store() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let store = RedbStore::open_with(file.path(), no_create())
        .await
        .unwrap();
    let rec = store.record(human(&child()), T0).await.unwrap();
    assert_eq!(rec.event.sequence, Sequence(1));
}

#[cfg(unix)]
#[tokio::test]
async fn a_new_file_is_private_to_its_owner() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    drop(RedbStore::open(&path).await.unwrap());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
}

#[tokio::test]
async fn a_redb_file_of_another_application_is_refused() {
    const OTHER: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("their_data");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(OTHER).unwrap().insert("k", 7).unwrap();
        txn.commit().unwrap();
    }
    let err = RedbStore::open(&path).await.unwrap_err();
    assert_open_error(&err, &path, "another application");
    let db = redb::Database::open(&path).unwrap();
    let txn = redb::ReadableDatabase::begin_read(&db).unwrap();
    let names: Vec<String> = txn
        .list_tables()
        .unwrap()
        .map(|t| redb::TableHandle::name(&t).to_owned())
        .collect();
    assert_eq!(names, ["their_data"], "none of our tables was added");
    let value = txn
        .open_table(OTHER)
        .unwrap()
        .get("k")
        .unwrap()
        .unwrap()
        .value();
    assert_eq!(value, 7);
}

#[tokio::test]
async fn a_zero_flush_interval_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let err = RedbStore::open_with(&path, RedbOptions::bounded(Duration::ZERO))
        .await
        .unwrap_err();
    assert_open_error(&err, &path, "flush interval");
    assert!(!path.exists());
}

#[tokio::test]
async fn the_same_file_twice_in_one_process_shares_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let a = RedbStore::open(&path).await.unwrap();
    // Through another spelling of the same path, and with the other durability.
    let b = RedbStore::open_with(
        dir.path().join(".").join("state.redb"),
        RedbOptions::bounded(Duration::from_millis(20)),
    )
    .await
    .unwrap();
    assert_eq!(a.path(), b.path());
    assert_eq!(
        b.durability(),
        Durability::Bounded {
            flush_interval: Duration::from_millis(20)
        }
    );
    let w = WatcherKey::parse("agent:main:main").unwrap();
    a.watch(&w, &child(), T0).await.unwrap();
    let rec = b.record(human(&child()), T0).await.unwrap();
    assert_eq!(rec.notices.len(), 1, "b sees the cursor a wrote");
    assert_eq!(a.state_version(&child()).await.unwrap(), rec.event.sequence);
    b.flush().await.unwrap();
    drop(a);
    // The remaining handle still works after the other one is gone.
    let rec2 = b.record(human(&child()), T0).await.unwrap();
    assert_eq!(rec2.event.sequence, rec.event.sequence.next());
}

#[tokio::test]
async fn everything_survives_a_reopen_and_the_counter_never_goes_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let w = WatcherKey::parse("agent:main:main").unwrap();
    let other = SessionRef::parse("agent:main:subagent:other", "main").unwrap();
    {
        let s = RedbStore::open(&path).await.unwrap();
        s.watch(&w, &child(), T0).await.unwrap();
        for _ in 0..3 {
            s.record(human(&child()), T0).await.unwrap();
        }
        s.record(human(&other), T0).await.unwrap(); // 4
        // Deleting the ref holding the highest sequence must not lower the counter.
        s.delete_session(&other).await.unwrap();
        // A dedupe hit consumes a number without leaving a row.
        let e = human(&child()).with_dedupe_key("once");
        assert!(!s.record(e.clone(), T0).await.unwrap().deduplicated); // 5
        assert!(s.record(e, T0).await.unwrap().deduplicated); // 6, consumed
    }
    for options in [
        RedbOptions::default(),
        RedbOptions::bounded(Duration::from_millis(10)),
    ] {
        let s = RedbStore::open_with(&path, options).await.unwrap();
        assert_eq!(s.state_version(&child()).await.unwrap(), Sequence(5));
        assert_eq!(s.state_version(&other).await.unwrap(), Sequence::ZERO);
        let c = s.cursor(&w, &child().session_key).await.unwrap().unwrap();
        assert_eq!(
            (c.last_seen, c.notified, c.material),
            (Sequence(0), Sequence(1), Sequence(5))
        );
        let page = s.changes_since(&child(), Sequence(0), 200).await.unwrap();
        let seqs: Vec<u64> = page.events.iter().map(|e| e.sequence.get()).collect();
        assert_eq!(seqs, [1, 2, 3, 5]);
        let rec = s
            .record(
                NewEvent::new(
                    other.clone(),
                    EventKind::Created,
                    ActorType::System,
                    "session created",
                ),
                T0,
            )
            .await
            .unwrap();
        assert!(rec.event.sequence > Sequence(6), "{:?}", rec.event.sequence);
        // Now delete the highest row by hand and reopen: the counter keeps its place.
        let top = rec.event.sequence;
        assert!(s.delete_event_row(top).await.unwrap());
        drop(s);
        let s = RedbStore::open(&path).await.unwrap();
        let next = s.record(human(&other), T0).await.unwrap().event.sequence;
        assert_eq!(next, top.next());
        s.delete_session(&other).await.unwrap();
    }
}
