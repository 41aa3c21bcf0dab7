//! The by-target index of the cursors (`cursors_by_target`, (target key, watcher) -> ()) holds
//! an entry for every cursor and nothing else, whatever removed a cursor: an unwatch, a reset
//! of the watcher, the deletion of its target or of its watcher's session, pruning of idle
//! cursors. Read in the closed file, beside the cursors themselves. (A review of stop 55
//! removed the index's removal from the one place that removes cursors, and every test passed:
//! the answers stay right, since a lookup finds no cursor for a stale entry, but the index
//! grows without bound and every recording on a much-watched target reads every stale entry.)
//! The same holds for the dedupe index and a session's deletion: no entry outlives its row.

use std::collections::BTreeSet;

use awareness_core::{
    CursorStore as _, EventStore as _, PruneStep, SessionRef, Timestamp, WatcherKey,
};
use redb::{ReadableDatabase as _, ReadableTable as _};
use store_redb::RedbStore;

const T0: Timestamp = Timestamp(1_800_000_000_000);

/// A redb type read as its bytes (the store's own view): the cursor rows are not decoded here.
type Raw<T> = store_redb::raw::Bytes<T>;
type CursorRow = (&'static str, u64, u64, u64, i64);
const CURSORS: redb::TableDefinition<(&str, &str), Raw<CursorRow>> =
    redb::TableDefinition::new("cursors");
const BY_TARGET: redb::TableDefinition<(&str, &str), ()> =
    redb::TableDefinition::new("cursors_by_target");

fn w(key: &str) -> WatcherKey {
    WatcherKey::parse(key).unwrap()
}

fn r(key: &str) -> SessionRef {
    SessionRef::parse(key, "main").unwrap()
}

/// (watcher, target) pairs.
type Pairs = BTreeSet<(String, String)>;

/// The (watcher, target) pairs of the cursors, and those of the index turned the same way.
fn both_tables(path: &std::path::Path) -> (Pairs, Pairs) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let cursors = txn.open_table(CURSORS).unwrap();
    let by_target = txn.open_table(BY_TARGET).unwrap();
    let pairs = |(a, b): (&str, &str)| (a.to_owned(), b.to_owned());
    let held = cursors
        .iter()
        .unwrap()
        .map(|row| pairs(row.unwrap().0.value()))
        .collect();
    let indexed = by_target
        .iter()
        .unwrap()
        .map(|row| {
            let (target, watcher) = pairs(row.unwrap().0.value());
            (watcher, target)
        })
        .collect();
    (held, indexed)
}

#[tokio::test]
async fn the_by_target_index_holds_every_cursor_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let store = RedbStore::open(&path).await.unwrap();
    let later = Timestamp(T0.0 + 60_000);
    let (kept, unwatched, reset, deleted, idle) = (
        w("agent:main:main"),
        w("agent:main:subagent:a"),
        w("agent:main:subagent:b"),
        w("agent:main:subagent:c"),
        w("agent:main:subagent:d"),
    );
    let (t1, t2, t3) = (
        r("agent:main:subagent:t1"),
        r("agent:main:subagent:t2"),
        r("agent:main:subagent:t3"),
    );
    // Each removal below leaves another cursor on the same target, so that a stale entry
    // would sit among live ones.
    for (watcher, target) in [
        (&kept, &t1),
        (&unwatched, &t1),
        (&reset, &t1),
        (&reset, &t2),
        (&kept, &t3),
        (&deleted, &t3),
    ] {
        store.watch(watcher, target, later).await.unwrap();
    }
    // Idle since T0, the others refreshed at `later`.
    store.watch(&idle, &t1, T0).await.unwrap();
    // The watcher's own session deleted: its cursors go with it.
    store.watch(&deleted, &t2, later).await.unwrap();
    // A target deleted: the cursors on it go with it.
    let gone = r("agent:main:subagent:t4");
    store.watch(&kept, &gone, later).await.unwrap();
    store.watch(&unwatched, &gone, later).await.unwrap();

    assert!(store.unwatch(&unwatched, &t1.session_key).await.unwrap());
    assert_eq!(store.reset_watcher(reset.session_key()).await.unwrap(), 2);
    store.delete_session(&r(deleted.as_str())).await.unwrap();
    store.delete_session(&gone).await.unwrap();
    let idle_pruned = store
        .prune_chunk(
            &PruneStep::Cursors {
                cutoff: Timestamp(T0.0 + 1),
            },
            100,
            later,
        )
        .await
        .unwrap();
    assert_eq!(idle_pruned, 1, "the idle cursor");
    store.close().await;

    let (held, indexed) = both_tables(&path);
    let expected: Pairs = [(&kept, &t1), (&kept, &t3)]
        .iter()
        .map(|(w, t)| (w.as_str().to_owned(), t.session_key.as_str().to_owned()))
        .collect();
    assert_eq!(held, expected, "the cursors left");
    assert_eq!(indexed, held, "the index holds exactly the cursors");
}

/// Deleting a session whose event row cannot be read frees that row's dedupe key too (its key
/// unread, the entries pointing at its sequence are found): no entry of the dedupe index
/// outlives its row. Read in the closed file: every answer stays right either way (a lookup
/// that finds no row records anew), but the index kept an entry for each such row for good
/// when that freeing was left out, a mutation every test passed (review of stop 61).
#[tokio::test]
async fn deleting_a_session_frees_the_dedupe_key_of_its_unreadable_row() {
    use awareness_core::{ActorType, EventKind, NewEvent};
    const DEDUPE: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("dedupe");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let at = r("agent:main:subagent:a");
    let store = RedbStore::open(&path).await.unwrap();
    let e = NewEvent::new(at.clone(), EventKind::Compacted, ActorType::System, "s")
        .with_dedupe_key("k");
    let seq = store.record(e, T0).await.unwrap().event.sequence;
    assert!(store.damage_event_row(seq).await.unwrap());
    store.delete_session(&at).await.unwrap();
    store.close().await;
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_read().unwrap();
    let left: Vec<(String, u64)> = txn
        .open_table(DEDUPE)
        .unwrap()
        .iter()
        .unwrap()
        .map(|entry| {
            let (k, v) = entry.unwrap();
            (k.value().to_owned(), v.value())
        })
        .collect();
    assert!(left.is_empty(), "dedupe entries left: {left:?}");
}
