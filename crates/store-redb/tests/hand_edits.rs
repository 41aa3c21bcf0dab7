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

/// A redb type read and written as its bytes (the store's own view, `store_redb::raw::Bytes`):
/// a table opened under it is the table of `T` on disk, so a test can write into it what
/// redb's typed writes never would (text that is not UTF-8, a tuple cut short), as a hand edit
/// or a flipped bit could.
type Raw<T> = store_redb::raw::Bytes<T>;

type CursorRow = (&'static str, u64, u64, u64, i64);
/// The cursors table with its rows as bytes (keys typed: these edits keep them sound).
const CURSOR_ROWS: redb::TableDefinition<(&str, &str), Raw<CursorRow>> =
    redb::TableDefinition::new("cursors");

/// Cursor rows damaged at byte level in the closed file (one cut short by three bytes, one
/// whose target agent is not UTF-8) are unreadable rows like any other (decision 0016): after
/// a reopen, a recording on their target commits and tells the one readable watcher, listings
/// leave them out, `unreadable_cursors` names both, reading one fails with `Corrupt`, and the
/// idle step of pruning deletes them. Before, redb's own decode (`str::from_utf8(..).unwrap()`,
/// slices at the lengths the tuple's header states) panicked on them: every recording on the
/// target failed (and its write transaction marked the file for repair), as did every listing,
/// `unreadable_cursors` and pruning's idle step.
#[tokio::test]
async fn cursor_rows_damaged_at_byte_level_are_left_out_and_stop_nothing_else() {
    use awareness_core::{CursorFilter, CursorStore, PruneStep, WatcherKey};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let target = r("agent:main:subagent:t");
    let [cut, spoiled, sound] = [
        "agent:main:main",
        "agent:main:subagent:peer",
        "agent:main:subagent:third",
    ]
    .map(|w| WatcherKey::parse(w).unwrap());
    let store = RedbStore::open(&path).await.unwrap();
    for w in [&cut, &spoiled, &sound] {
        store.watch(w, &target, T0).await.unwrap();
    }
    store.close().await;
    edit(&path, |txn| {
        let mut cursors = txn.open_table(CURSOR_ROWS).unwrap();
        let t = target.session_key.as_str();
        let row = cursors
            .get((cut.as_str(), t))
            .unwrap()
            .unwrap()
            .value()
            .to_vec();
        cursors
            .insert((cut.as_str(), t), &row[..row.len() - 3])
            .unwrap();
        let key = (spoiled.as_str(), t);
        let mut row = cursors.get(key).unwrap().unwrap().value().to_vec();
        assert_eq!(&row[1..5], b"main", "the agent follows its length");
        row[3] = 0xFF;
        cursors.insert(key, row.as_slice()).unwrap();
    });

    let store = RedbStore::open(&path).await.unwrap();
    let told = store.record(human(&target), T0).await.expect("a recording");
    let told: Vec<_> = told.notices.iter().map(|n| n.watcher.clone()).collect();
    assert_eq!(
        told,
        std::slice::from_ref(&sound),
        "the readable watcher is told"
    );
    let listed: Vec<_> = store
        .cursors(&CursorFilter::default())
        .await
        .expect("a listing")
        .into_iter()
        .map(|c| c.watcher)
        .collect();
    assert_eq!(listed, std::slice::from_ref(&sound));
    let mut unreadable: Vec<_> = store
        .unreadable_cursors()
        .await
        .expect("the unreadable rows")
        .into_iter()
        .map(|u| u.watcher)
        .collect();
    unreadable.sort();
    assert_eq!(unreadable, [cut.as_str(), spoiled.as_str()]);
    for w in [&cut, &spoiled] {
        assert_corrupt(store.cursor(w, &target.session_key).await, w.as_str());
    }
    let idle = PruneStep::Cursors {
        cutoff: Timestamp(T0.0 + 1),
    };
    assert_eq!(
        store
            .prune_chunk(&idle, 100, T0)
            .await
            .expect("the idle step"),
        3,
        "every cursor is idle, the one whose age cannot be read too"
    );
    assert_eq!(store.unreadable_cursors().await.unwrap(), []);
    store.close().await;
}
