//! Relative paths that SQLite would read as something other than a file's name (sqlx opens
//! with `SQLITE_OPEN_URI`): the store is the file the path names. Here, in a process of their
//! own, because the test changes the working directory.

use awareness_core::{
    ActorType, EventKind, EventStore as _, NewEvent, Sequence, SessionRef, Timestamp,
};
use store_sqlite::SqliteStore;

/// `:memory:` and `file:` names given relative to the working directory are files there,
/// which keep what was recorded across a reopen; no other file is made beside them.
#[tokio::test]
async fn a_relative_path_that_looks_like_an_sqlite_uri_is_a_file() {
    let dir = tempfile::tempdir().unwrap();
    std::env::set_current_dir(dir.path()).unwrap();
    let session = SessionRef::parse("agent:main:main", "main").unwrap();
    let now = Timestamp::now();
    for name in [":memory:", "file:state.db", "file:other.db%3Fmode=memory"] {
        let store = SqliteStore::open(name).await.unwrap();
        let event = NewEvent::new(
            session.clone(),
            EventKind::HumanDirectMessage,
            ActorType::Human,
            "typed",
        );
        let recorded = store.record(event, now).await.unwrap().event;
        store.close().await;
        let again = SqliteStore::open(name).await.unwrap();
        let log = again.events_after(Sequence::ZERO, 10).await.unwrap();
        assert_eq!(
            log.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            [recorded.sequence],
            "{name} keeps what was recorded in it"
        );
        again.close().await;
        assert!(
            std::fs::metadata(dir.path().join(name)).unwrap().len() > 0,
            "{name} is the file written"
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with("-wal") && !n.ends_with("-shm"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [":memory:", "file:other.db%3Fmode=memory", "file:state.db"]
    );
}
