//! Files edited by hand (or a flipped bit) in ways only redb's own layout allows: an entry of
//! one index that no longer agrees with the row it points at. The store answers `Corrupt`,
//! naming the row, rather than hand out another session's event or another caller's.

use awareness_core::{
    ActorType, EventKind, EventStore, NewEvent, Sequence, SessionRef, StoreError, Timestamp,
};
use redb::ReadableTable as _;
use store_redb::RedbStore;

const T0: Timestamp = Timestamp(1_800_000_000_000);
const EVENTS_BY_REF: redb::TableDefinition<(&str, &str, u64), &[u8]> =
    redb::TableDefinition::new("events_by_ref");
const DEDUPE: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("dedupe");

fn r(key: &str) -> SessionRef {
    SessionRef::parse(key, "main").unwrap()
}

fn human(session: &SessionRef) -> NewEvent {
    NewEvent::new(
        session.clone(),
        EventKind::HumanDirectMessage,
        ActorType::Human,
        "human message via telegram",
    )
}

/// Runs `edit` in one write transaction of the closed store's file.
fn edit(path: &std::path::Path, edit: impl FnOnce(&redb::WriteTransaction)) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    edit(&txn);
    txn.commit().unwrap();
}

fn assert_corrupt<T: std::fmt::Debug>(got: Result<T, StoreError>, needle: &str) {
    match got {
        Err(StoreError::Corrupt { context, .. }) => {
            assert!(context.contains(needle), "{context}");
        }
        other => panic!("expected Corrupt naming {needle:?}, got {other:?}"),
    }
}

/// A copy in the reference index of session S that holds an event of session T (its key
/// edited): a page of S's changes fails naming the row, instead of listing T's event as one
/// of S's.
#[tokio::test]
async fn a_page_refuses_an_indexed_row_that_names_another_session() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let (s, t) = (r("agent:main:subagent:s"), r("agent:main:subagent:t"));
    let store = RedbStore::open(&path).await.unwrap();
    store.record(human(&s), T0).await.unwrap();
    let theirs = store
        .record(human(&t), T0)
        .await
        .unwrap()
        .event
        .sequence
        .get();
    store.close().await;
    edit(&path, |txn| {
        let mut by_ref = txn.open_table(EVENTS_BY_REF).unwrap();
        let row = by_ref
            .get(("main", t.session_key.as_str(), theirs))
            .unwrap()
            .expect("the copy of T's event")
            .value()
            .to_vec();
        by_ref
            .insert(("main", s.session_key.as_str(), theirs), row.as_slice())
            .unwrap();
    });
    let store = RedbStore::open(&path).await.unwrap();
    assert_corrupt(
        store.changes_since(&s, Sequence::ZERO, 200).await,
        &format!("event row {theirs}: indexed under"),
    );
    store.close().await;
}

/// A dedupe entry pointing at a row that holds another dedupe key: recording under that key
/// fails naming both, instead of answering another caller's event as this one's duplicate.
#[tokio::test]
async fn a_dedupe_entry_pointing_at_another_row_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let s = r("agent:main:subagent:s");
    let store = RedbStore::open(&path).await.unwrap();
    store
        .record(human(&s).with_dedupe_key("a"), T0)
        .await
        .unwrap();
    let other = store
        .record(human(&s).with_dedupe_key("b"), T0)
        .await
        .unwrap()
        .event
        .sequence
        .get();
    store.close().await;
    edit(&path, |txn| {
        txn.open_table(DEDUPE).unwrap().insert("a", other).unwrap();
    });
    let store = RedbStore::open(&path).await.unwrap();
    assert_corrupt(
        store.record(human(&s).with_dedupe_key("a"), T0).await,
        &format!("points at event row {other}"),
    );
    store.close().await;
}
