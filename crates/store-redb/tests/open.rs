//! Opening files: what is refused (and left untouched), what is shared, which schemas and modes
//! a file reopens in. The shared open suite (a directory, a missing directory, a file that is
//! not a store and a truncated one refused and left untouched, an empty file becoming a new
//! store) runs in each setup of the store, in `tests/conformance.rs`; the checks below are
//! redb's own. (What survives a reopen is the shared durable suite's, there too.)

use std::time::Duration;

use awareness_core::testkit::open::assert_source_not_quoted;
use awareness_core::{
    ActorType, AwarenessStoreExt, CursorStore, EventKind, EventStore, NewEvent, OpenFailure,
    Sequence, SessionRef, StoreError, Timestamp, WatcherKey,
};
use redb::{ReadableDatabase, ReadableTable, TableHandle};
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

/// `Immediate`, then `Bounded` flushing every minute (so that only a close makes it durable).
fn both_durabilities() -> [RedbOptions; 2] {
    [
        RedbOptions::default(),
        RedbOptions::bounded(Duration::from_mins(1)),
    ]
}

fn no_create() -> RedbOptions {
    RedbOptions {
        create_if_missing: false,
        ..RedbOptions::default()
    }
}

/// The error is `Open`, names the file, and gives a reason containing `reason`.
fn assert_open_error(err: &StoreError, file: &std::path::Path, reason: &str, kind: OpenFailure) {
    match err {
        StoreError::Open {
            path,
            reason: r,
            kind: k,
            ..
        } => {
            assert_eq!(path, file, "{err}");
            assert!(r.contains(reason), "reason {r:?} lacks {reason:?}");
            assert_eq!(*k, kind, "{err}");
        }
        other => panic!("expected StoreError::Open, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(&*file.to_string_lossy()),
        "the message names the file: {text}"
    );
}

/// The tables of a redb file, as redb lists them.
fn table_names(txn: &redb::ReadTransaction) -> Vec<String> {
    txn.list_tables()
        .unwrap()
        .map(|t| t.name().to_owned())
        .collect()
}

/// Writes `value` under `key` in the store's `meta` table, behind the store's back (as a
/// future build, or damage, would).
fn set_meta(path: &std::path::Path, key: &str, value: u64) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    txn.open_table(redb::TableDefinition::<&str, u64>::new("meta"))
        .unwrap()
        .insert(key, value)
        .unwrap();
    txn.commit().unwrap();
}

/// The schema version a store wrote in its `meta` table.
fn schema_version(txn: &redb::ReadTransaction) -> u64 {
    txn.open_table(redb::TableDefinition::<&str, u64>::new("meta"))
        .unwrap()
        .get("schema_version")
        .unwrap()
        .unwrap()
        .value()
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
        assert_open_error(&err, &path, "not a redb database", OpenFailure::NotAStore);
        // In the store's words, redb's ("magic number mismatch") as the source only. Before,
        // the message quoted it too.
        assert_source_not_quoted("a text file", &err);
        let source = std::error::Error::source(&err)
            .expect("redb's error")
            .to_string();
        assert!(source.contains("magic number"), "{source}");
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
    assert_open_error(&err, &path, "no such file", OpenFailure::NotFound);
    assert!(!path.exists(), "nothing was created");
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
    assert_open_error(&err, &path, "another application", OpenFailure::NotAStore);
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_read().unwrap();
    let names = table_names(&txn);
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

/// With `create_if_missing` off an open creates no store at all: an empty file and a redb
/// database holding no table yet are refused and left as they were (a mistyped path must not
/// turn them into stores); a store opens as always.
#[tokio::test]
async fn without_create_if_missing_a_file_that_is_no_store_yet_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.redb");
    std::fs::write(&empty, b"").unwrap();
    let bare = dir.path().join("bare.redb");
    drop(redb::Database::create(&bare).unwrap());
    let ours = dir.path().join("state.redb");
    RedbStore::open(&ours).await.unwrap().close().await;
    let existing = RedbOptions {
        create_if_missing: false,
        ..RedbOptions::default()
    };
    for path in [&empty, &bare] {
        let err = RedbStore::open_with(path, existing.clone())
            .await
            .expect_err("no store yet");
        assert_open_error(
            &err,
            path,
            "create_if_missing is off",
            OpenFailure::NotAStore,
        );
    }
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0, "still empty");
    // redb itself may rewrite its header when it opens a file read-write; no table is added.
    let db = redb::Database::open(&bare).unwrap();
    assert_eq!(table_names(&db.begin_read().unwrap()), Vec::<String>::new());
    drop(db);
    RedbStore::open_with(&ours, existing)
        .await
        .expect("a store opens")
        .close()
        .await;
}

/// A store file deleted while a handle holds it, and a new store created at its path in the
/// same process, are two files: the new handle writes the new file (it shared the deleted
/// one's database before, whose writes vanished with it), and the old handle keeps its own.
#[tokio::test]
async fn a_new_file_at_a_deleted_stores_path_is_another_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let old = RedbStore::open(&path).await.unwrap();
    old.record(human(&child()), T0).await.unwrap();
    std::fs::remove_file(&path).unwrap();
    let new = RedbStore::open(&path).await.unwrap();
    assert!(
        new.events_after(Sequence::ZERO, 10)
            .await
            .unwrap()
            .is_empty(),
        "a new, empty store"
    );
    let kept = new.record(human(&child()), T0).await.unwrap().event;
    assert_eq!(old.events_after(Sequence::ZERO, 10).await.unwrap().len(), 1);
    old.close().await;
    new.close().await;
    let reopened = RedbStore::open(&path).await.unwrap();
    let log = reopened.events_after(Sequence::ZERO, 10).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].sequence, kept.sequence);
    reopened.close().await;
}

/// Another application's redb file whose only table is called `meta`, like ours, but holds no
/// schema version of ours, is refused and left as it was: it is not a new store to create
/// tables in, nor is its `last_sequence` ours to reset.
#[tokio::test]
async fn a_redb_file_whose_only_table_is_another_meta_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.redb");
    drop(redb::Database::create(&path).unwrap());
    set_meta(&path, "last_sequence", 5);
    let err = RedbStore::open(&path).await.unwrap_err();
    assert_open_error(&err, &path, "another application", OpenFailure::NotAStore);
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_read().unwrap();
    assert_eq!(table_names(&txn), ["meta"], "none of our tables was added");
    let meta = txn
        .open_table(redb::TableDefinition::<&str, u64>::new("meta"))
        .unwrap();
    assert_eq!(meta.get("last_sequence").unwrap().unwrap().value(), 5);
    assert!(meta.get("schema_version").unwrap().is_none());
}

/// A file whose `meta` counter was edited near the end of `u64` while it was closed hands out,
/// after a reopen, up to the last sequence an event can have: `u64::MAX - 1`, one below the key
/// of a ref's head in the reference index (`u64::MAX`), whose entry therefore never lands on the
/// event's. What a store does at its counter's end (every further recording refused with one
/// error, nothing written) is the shared conformance check
/// `a_counter_at_its_end_refuses_to_record_and_writes_nothing`, in `tests/conformance.rs`.
#[tokio::test]
async fn the_last_sequence_is_one_below_the_head_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let store = RedbStore::open(&path).await.unwrap();
    let first = store.record(human(&child()), T0).await.unwrap().event;
    store.close().await;
    set_meta(&path, "last_sequence", u64::MAX - 2);
    let store = RedbStore::open(&path).await.unwrap();
    let last = store.record(human(&child()), T0).await.unwrap().event;
    assert_eq!(last.sequence, Sequence(u64::MAX - 1), "the last sequence");
    let page = store
        .changes_since(&child(), Sequence::ZERO, 10)
        .await
        .unwrap();
    assert_eq!(
        page.events,
        [first, last.clone()],
        "both events read back: the head's entry is not the last event's"
    );
    let heads = store.heads(&[child()]).await.unwrap();
    assert_eq!(
        heads[0].last_sequence, last.sequence,
        "the head names the last event"
    );
    let err = store.record(human(&child()), T0).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt { context, .. } if context.contains("sequence counter")),
        "{err:?}"
    );
    store.close().await;
}

#[tokio::test]
async fn a_zero_flush_interval_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let err = RedbStore::open_with(&path, RedbOptions::bounded(Duration::ZERO))
        .await
        .unwrap_err();
    assert_open_error(&err, &path, "flush interval", OpenFailure::InvalidOptions);
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

/// One file reached by two paths (a hard link) is one file: an open through the other path
/// shares the database the first open holds, read-write and read-only, where redb's own file
/// lock refused it as "already open in another process".
#[cfg(unix)]
#[tokio::test]
async fn a_file_opened_through_a_hard_link_shares_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let link = dir.path().join("link.redb");
    let a = RedbStore::open(&path).await.unwrap();
    std::fs::hard_link(&path, &link).unwrap();
    let b = RedbStore::open(&link)
        .await
        .unwrap_or_else(|e| panic!("the second path of one file is refused: {e}"));
    let w = WatcherKey::parse("agent:main:main").unwrap();
    a.watch(&w, &child(), T0).await.unwrap();
    let rec = b.record(human(&child()), T0).await.unwrap();
    assert_eq!(rec.notices.len(), 1, "b sees the cursor a wrote");
    let reader = RedbStore::open_with(&link, RedbOptions::default().read_only(true))
        .await
        .unwrap_or_else(|e| panic!("a read-only open through the link is refused: {e}"));
    assert_eq!(
        reader.state_version(&child()).await.unwrap(),
        rec.event.sequence
    );
    reader.close().await;
    b.close().await;
    a.close().await;
}

/// The writer's drain outlives the recordings it answers (it keeps its thread a little while
/// for the next one), but never the handle: once the last handle is dropped, the file is closed
/// and its lock released, so redb itself can open it at once. Checked after lone recordings and
/// after a burst that shares transactions, with both durabilities.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_closes_the_file_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    for options in both_durabilities() {
        let store = std::sync::Arc::new(RedbStore::open_with(&path, options).await.unwrap());
        store.record(human(&child()), T0).await.unwrap();
        let burst: Vec<_> = (0..32)
            .map(|_| {
                let s = std::sync::Arc::clone(&store);
                tokio::spawn(async move { s.record(human(&child()), T0).await })
            })
            .collect();
        for task in burst {
            task.await.unwrap().unwrap();
        }
        let last = store.record(human(&child()), T0).await.unwrap();
        drop(store);
        let db = redb::Database::open(&path).unwrap_or_else(|e| {
            panic!("the file is still open after the last handle was dropped: {e}")
        });
        drop(db);
        // And the store reopens it with every recording (the bounded mode flushes on drop).
        let again = RedbStore::open(&path).await.unwrap();
        assert_eq!(
            again.state_version(&child()).await.unwrap(),
            last.event.sequence
        );
    }
}

/// `close().await` on the last handle (on a single-threaded runtime, whose one thread it must
/// not block) returns with the file closed, so redb itself opens it at once, and with every
/// commit of the bounded mode made durable.
#[tokio::test]
async fn closing_the_last_handle_releases_the_file_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    for options in both_durabilities() {
        let store = RedbStore::open_with(&path, options).await.unwrap();
        let last = store.record(human(&child()), T0).await.unwrap();
        store.close().await;
        let db = redb::Database::open(&path)
            .unwrap_or_else(|e| panic!("the file is still open after close() returned: {e}"));
        drop(db);
        let again = RedbStore::open(&path).await.unwrap();
        assert_eq!(
            again.state_version(&child()).await.unwrap(),
            last.event.sequence
        );
        again.close().await;
    }
}

/// `close().await` on the last handle also waits for what another handle of the process left
/// running: that handle was dropped while its writer still finished recordings whose callers
/// gave up. When `close` returns, redb itself opens the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_last_handle_waits_for_writes_another_handle_left_running() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    for options in both_durabilities() {
        let a = RedbStore::open_with(&path, options.clone()).await.unwrap();
        let b = RedbStore::open_with(&path, options).await.unwrap();
        for _ in 0..100 {
            let call = std::pin::pin!(a.record(human(&child()), T0));
            awareness_core::testkit::poll_once(call).await;
        }
        drop(a);
        b.close().await;
        let db = redb::Database::open(&path).unwrap_or_else(|e| {
            panic!("the file is still open after the last handle's close() returned: {e}")
        });
        drop(db);
    }
}

/// A file written in one durability mode reopens in the other with everything in it. (What a
/// reopen keeps in either mode, and the counter across reopens, are the shared durable suite's
/// checks, run in both modes by `tests/conformance.rs`.)
#[tokio::test]
async fn a_file_reopens_in_the_other_durability_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let w = WatcherKey::parse("agent:main:main").unwrap();
    let mut last = Sequence::ZERO;
    for options in [
        RedbOptions::default(),
        RedbOptions::bounded(Duration::from_millis(10)),
        RedbOptions::default(),
    ] {
        let s = RedbStore::open_with(&path, options).await.unwrap();
        assert_eq!(s.state_version(&child()).await.unwrap(), last);
        if last == Sequence::ZERO {
            s.watch(&w, &child(), T0).await.unwrap();
        }
        let rec = s.record(human(&child()), T0).await.unwrap();
        assert_eq!(rec.event.sequence, last.next());
        last = rec.event.sequence;
        let c = s.cursor(&w, &child().session_key).await.unwrap().unwrap();
        assert_eq!(
            (c.last_seen, c.notified, c.material),
            (Sequence(0), Sequence(1), last)
        );
    }
}

/// Rewrites a store's file as schema 1 wrote it: heads in a `heads` table keyed by
/// (key, agent), none in the reference index.
fn downgrade_to_schema_1(path: &std::path::Path) {
    let moved = RedbStore::rewrite_as_schema_1(path).expect("rewrite as schema 1");
    assert!(moved > 0, "schema 3 keeps heads in events_by_ref");
}

#[tokio::test]
async fn a_schema_1_file_is_migrated_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let ops = SessionRef::parse("agent:ops:worker", "ops").unwrap();
    let w = WatcherKey::parse("agent:main:main").unwrap();
    let (heads, page, cursor) = {
        let s = RedbStore::open(&path).await.unwrap();
        s.watch(&w, &child(), T0).await.unwrap();
        for i in 0..12 {
            let r = if i % 3 == 0 { ops.clone() } else { child() };
            s.record(human(&r), Timestamp(T0.millis() + i))
                .await
                .unwrap();
        }
        // Prune the oldest rows so that both heads carry a pruned watermark.
        let step = awareness_core::PruneStep::RowCap { max_rows: 10 };
        assert_eq!(s.prune_chunk(&step, 100, T0).await.unwrap(), 2);
        (
            s.list_heads(None).await.unwrap(),
            s.changes_since(&child(), Sequence(0), 200).await.unwrap(),
            s.cursor(&w, &child().session_key).await.unwrap(),
        )
    };
    downgrade_to_schema_1(&path);

    assert!(heads.iter().all(|h| h.pruned_max_sequence > Sequence::ZERO));
    let s = RedbStore::open(&path).await.unwrap();
    assert_eq!(s.list_heads(None).await.unwrap(), heads);
    assert_eq!(
        s.changes_since(&child(), Sequence(0), 200).await.unwrap(),
        page
    );
    assert_eq!(s.cursor(&w, &child().session_key).await.unwrap(), cursor);
    let next = s.record(human(&ops), T0).await.unwrap();
    assert_eq!(next.event.sequence, Sequence(13));
    assert_eq!(s.state_version(&ops).await.unwrap(), Sequence(13));
    drop(s);

    // The old table is gone and the file says schema 3, straight from 1.
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_read().unwrap();
    let names = table_names(&txn);
    assert!(!names.iter().any(|n| n == "heads"), "{names:?}");
    assert_eq!(schema_version(&txn), 3);
}

/// What a store reads back: every head, every event, and the cursor of `watcher()` on
/// `child()`.
#[derive(Debug, PartialEq)]
struct Held {
    heads: Vec<awareness_core::Head>,
    events: Vec<std::sync::Arc<awareness_core::Event>>,
    cursor: Option<awareness_core::Cursor>,
}

fn watcher() -> WatcherKey {
    WatcherKey::parse("agent:main:main").unwrap()
}

async fn held(s: &RedbStore) -> Held {
    Held {
        heads: s.list_heads(None).await.unwrap(),
        events: s.events_after(Sequence::ZERO, 200).await.unwrap(),
        cursor: s.cursor(&watcher(), &child().session_key).await.unwrap(),
    }
}

/// Creates a store at `path` holding events of two sessions (one under a dedupe key) and a
/// cursor, closes it, and returns what it held.
async fn a_closed_store_with_rows(path: &std::path::Path) -> Held {
    let ops = SessionRef::parse("agent:ops:worker", "ops").unwrap();
    let s = RedbStore::open(path).await.unwrap();
    s.watch(&watcher(), &child(), T0).await.unwrap();
    for i in 0..5 {
        let r = if i % 2 == 0 { child() } else { ops.clone() };
        s.record(human(&r), Timestamp(T0.millis() + i))
            .await
            .unwrap();
    }
    s.record(human(&child()).with_dedupe_key("once"), T0)
        .await
        .unwrap();
    let held = held(&s).await;
    s.close().await;
    assert_eq!(held.events.len(), 6);
    assert!(held.cursor.is_some());
    held
}

/// A new store says schema 3: the schema whose `meta` may hold the bounded mode's sequence
/// reservation, which builds of schema 2 would read past; they refuse a file of schema 3.
#[tokio::test]
async fn a_new_file_says_schema_3() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    RedbStore::open(&path).await.unwrap().close().await;
    let db = redb::Database::open(&path).unwrap();
    assert_eq!(schema_version(&db.begin_read().unwrap()), 3);
}

/// A schema 2 file (schema 3's tables; a build of this workspace wrote it before schema 3,
/// possibly with a reservation its bounded writer left at a crash) opened read-write is marked
/// schema 3, keeps its events, heads and cursors, and has the reservation settled: the next
/// recording gets a sequence above it. Before, the file stayed at schema 2, which a build older
/// than the reservation opens after such a crash and then hands a lost number out again.
#[tokio::test]
async fn a_schema_2_file_opened_read_write_becomes_schema_3_and_keeps_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let before = a_closed_store_with_rows(&path).await;
    let last = before.events.last().unwrap().sequence.get();
    let reserved = last + 1_000;
    set_meta(&path, "reserved_sequence", reserved);
    set_meta(&path, "schema_version", 2);

    let s = RedbStore::open(&path).await.unwrap();
    assert_eq!(held(&s).await, before, "the migration kept every row");
    awareness_core::testkit::durable::assert_counter_resumes_above(
        &s,
        human(&child()),
        last,
        reserved,
        0,
    )
    .await;
    s.close().await;

    let db = redb::Database::open(&path).unwrap();
    assert_eq!(schema_version(&db.begin_read().unwrap()), 3);
}

/// A read-only open reads a file of schema 2 as it is (it has schema 3's tables, and a read-only
/// open cannot write the new version), and one of schema 3, and leaves each byte for byte as it
/// was, at its version: the next read-write open marks the schema 2 file.
#[tokio::test]
async fn a_read_only_open_reads_schema_2_and_3_as_they_are() {
    let dir = tempfile::tempdir().unwrap();
    for version in [2, 3] {
        let path = dir.path().join(format!("schema{version}.redb"));
        let before = a_closed_store_with_rows(&path).await;
        set_meta(&path, "schema_version", version);
        let bytes = std::fs::read(&path).unwrap();
        let s = RedbStore::open_with(&path, read_only())
            .await
            .unwrap_or_else(|e| panic!("schema {version} is refused read-only: {e}"));
        assert_eq!(held(&s).await, before, "schema {version}");
        s.close().await;
        assert!(
            std::fs::read(&path).unwrap() == bytes,
            "schema {version}: the read-only open changed the file"
        );
        let db = redb::Database::open(&path).unwrap();
        assert_eq!(schema_version(&db.begin_read().unwrap()), version);
    }
}

/// Schema 3 is the newest this build opens: a file of schema 4 (a later build's) is refused,
/// read-only and read-write, and left as it was.
#[tokio::test]
async fn a_file_of_schema_4_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    a_closed_store_with_rows(&path).await;
    set_meta(&path, "schema_version", 4);
    let before = dump(&path);
    let bytes = std::fs::read(&path).unwrap();
    let err = RedbStore::open_with(&path, read_only()).await.unwrap_err();
    assert_open_error(
        &err,
        &path,
        "schema version 4 is not supported",
        OpenFailure::Unsupported,
    );
    assert!(
        std::fs::read(&path).unwrap() == bytes,
        "the refused read-only open changed the file"
    );
    let err = RedbStore::open(&path).await.unwrap_err();
    assert_open_error(
        &err,
        &path,
        "schema version 4 is not supported",
        OpenFailure::Unsupported,
    );
    assert_eq!(dump(&path), before, "the refused open changed the file");
}

/// A file that an older redb wrote (file format 2 in the header of its transaction slot) is
/// refused as `Unsupported`, naming the format, read-write and read-only alike: a build that
/// can open it is what the user needs, not a retry. (What the mutation did: refused as
/// `Other`, a kind that does not say this build is the problem; review of stop 71, RG11.)
#[tokio::test]
async fn a_file_of_an_older_redb_format_is_refused_as_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    a_closed_store_with_rows(&path).await;
    let mut bytes = std::fs::read(&path).unwrap();
    // The format version of each transaction slot (bytes 64 and 192 of the header).
    bytes[64] = 2;
    bytes[64 + 128] = 2;
    std::fs::write(&path, &bytes).unwrap();
    for options in [RedbOptions::default(), read_only()] {
        let err = RedbStore::open_with(&path, options).await.unwrap_err();
        assert_open_error(&err, &path, "redb file format 2", OpenFailure::Unsupported);
    }
}

/// The entries of the table `name`, typed `K` to `V`, each as `key => value` (debug form).
fn entries<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::ReadTransaction,
    name: &str,
) -> Vec<String>
where
    for<'a> K::SelfType<'a>: std::fmt::Debug,
    for<'a> V::SelfType<'a>: std::fmt::Debug,
{
    let table = txn
        .open_table(redb::TableDefinition::<K, V>::new(name))
        .unwrap_or_else(|e| panic!("open the table {name}: {e}"));
    table
        .iter()
        .unwrap()
        .map(|entry| {
            let (k, v) = entry.unwrap();
            format!("{:?} => {:?}", k.value(), v.value())
        })
        .collect()
}

/// Every entry of every table of the redb file at `path`, by table name, as redb reads them
/// with the types the store keeps them in. A table of another name fails it (the dump would
/// leave it out), and so does a multimap table.
fn dump(path: &std::path::Path) -> std::collections::BTreeMap<String, Vec<String>> {
    type Bytes = &'static [u8];
    type Pair = (&'static str, &'static str);
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let multimap: Vec<String> = txn
        .list_multimap_tables()
        .unwrap()
        .map(|t| redb::MultimapTableHandle::name(&t).to_owned())
        .collect();
    assert!(multimap.is_empty(), "multimap tables: {multimap:?}");
    table_names(&txn)
        .into_iter()
        .map(|name| {
            let rows = match name.as_str() {
                "meta" | "dedupe" => entries::<&str, u64>(&txn, &name),
                "events" => entries::<u64, Bytes>(&txn, &name),
                "events_by_ref" => entries::<(&str, &str, u64), Bytes>(&txn, &name),
                "cursors" => entries::<Pair, (&str, u64, u64, u64, i64)>(&txn, &name),
                "cursors_by_target" => entries::<Pair, ()>(&txn, &name),
                "upstream_links" => entries::<Pair, Bytes>(&txn, &name),
                other => panic!("a table the dump does not know: {other}"),
            };
            (name, rows)
        })
        .collect()
}

#[tokio::test]
async fn a_file_of_a_newer_schema_is_refused_and_left_as_it_was() {
    use awareness_core::UpstreamStore as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    {
        // A row in every table: events (one under a dedupe key), heads, a cursor, a link.
        let s = RedbStore::open(&path).await.unwrap();
        let w = WatcherKey::parse("agent:main:main").unwrap();
        s.watch(&w, &child(), T0).await.unwrap();
        s.record(human(&child()), T0).await.unwrap();
        s.record(human(&child()).with_dedupe_key("once"), T0)
            .await
            .unwrap();
        let link =
            awareness_core::LinkSpec::new(child(), "claude-code", "local", "t1", "local-jsonl");
        s.upsert_link(link, T0).await.unwrap();
        s.close().await;
    }
    set_meta(&path, "schema_version", 99);
    // What the file holds, as redb reads it (opening a redb file rewrites its header, so the
    // bytes are not the measure): every entry of every table.
    let before = dump(&path);
    assert_eq!(
        schema_version(&redb::Database::open(&path).unwrap().begin_read().unwrap()),
        99
    );
    for (table, rows) in &before {
        assert!(!rows.is_empty(), "the table {table} holds rows to compare");
    }
    let err = RedbStore::open(&path).await.unwrap_err();
    assert_open_error(
        &err,
        &path,
        "schema version 99 is not supported",
        OpenFailure::Unsupported,
    );
    let after = dump(&path);
    assert!(
        after.keys().eq(before.keys()),
        "the same tables: {:?}",
        after.keys()
    );
    for (table, rows) in &before {
        assert_eq!(
            &after[table], rows,
            "the refused open changed the table {table}"
        );
    }
}

fn read_only() -> RedbOptions {
    RedbOptions::default().read_only(true)
}

/// A read-only open refuses every file it cannot read as it is, and leaves each byte for byte as
/// it was (a read-write open rewrites a redb file's header; a read-only one must not).
#[tokio::test]
async fn a_read_only_open_refuses_what_it_cannot_read_as_it_is_and_writes_nothing() {
    const OTHER: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("their_data");
    let dir = tempfile::tempdir().unwrap();
    let store_with = |name: &str| {
        let path = dir.path().join(name);
        async move {
            let s = RedbStore::open(&path).await.unwrap();
            s.record(human(&child()), T0).await.unwrap();
            s.close().await;
            path
        }
    };
    let schema_1 = store_with("schema1.redb").await;
    downgrade_to_schema_1(&schema_1);
    let newer = store_with("newer.redb").await;
    set_meta(&newer, "schema_version", 99);
    let other = dir.path().join("other.redb");
    {
        let db = redb::Database::create(&other).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(OTHER).unwrap().insert("k", 7).unwrap();
        txn.commit().unwrap();
    }
    let cases = [
        (&schema_1, "schema 1", OpenFailure::NeedsMigration),
        (
            &newer,
            "schema version 99 is not supported",
            OpenFailure::Unsupported,
        ),
        (
            &other,
            "not a session-awareness store",
            OpenFailure::NotAStore,
        ),
    ];
    for (path, reason, kind) in cases {
        let before = std::fs::read(path).unwrap();
        let err = RedbStore::open_with(path, read_only()).await.unwrap_err();
        assert_open_error(&err, path, reason, kind);
        assert!(
            std::fs::read(path).unwrap() == before,
            "{}: a refused read-only open changed the file",
            path.display()
        );
    }
}

/// A read-write open in a process whose read-only handles keep the file open is refused with a
/// reason saying so (the process keeps one database per file, and theirs cannot write), and
/// succeeds once they are closed.
#[tokio::test]
async fn a_read_write_open_beside_read_only_handles_of_its_process_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    RedbStore::open(&path).await.unwrap().close().await;
    let reader = RedbStore::open_with(&path, read_only()).await.unwrap();
    let err = RedbStore::open(&path).await.unwrap_err();
    assert_open_error(
        &err,
        &path,
        "open read-only in this process",
        OpenFailure::InUse,
    );
    reader.close().await;
    let writer = RedbStore::open(&path).await.unwrap();
    let rec = writer.record(human(&child()), T0).await.unwrap();
    assert_eq!(rec.event.sequence, Sequence(1));
}

/// Live readers need every commit durable, so they are refused with the bounded durability; and
/// the read-write handles of a process on one file must agree on them (the first decides how
/// the file is open).
#[tokio::test]
async fn live_readers_are_refused_where_they_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let bounded = RedbOptions::bounded(Duration::from_millis(50)).live_readers(true);
    let err = RedbStore::open_with(&path, bounded).await.unwrap_err();
    assert_open_error(
        &err,
        &path,
        "cannot be combined with the bounded durability",
        OpenFailure::InvalidOptions,
    );
    assert!(!path.exists(), "a refused open creates nothing");

    let live = RedbStore::open_with(&path, RedbOptions::default().live_readers(true))
        .await
        .unwrap();
    assert!(live.live_readers());
    let err = RedbStore::open(&path).await.unwrap_err();
    assert_open_error(
        &err,
        &path,
        "open in this process with live_readers true",
        OpenFailure::InvalidOptions,
    );
    // A read-only handle ignores the write settings: none of them is checked. (What a
    // read-only handle beside a live writer reads and refuses is the shared read-only suite's,
    // run with live readers by tests/conformance.rs.)
    let ignoring = RedbOptions::bounded(Duration::ZERO)
        .live_readers(true)
        .group_commit(0)
        .read_only(true);
    RedbStore::open_with(&path, ignoring).await.unwrap();
}

/// A read-only open beside a read-write handle of its process ignores its own `live_readers`
/// setting, whichever the writer chose: it is handed the writer's database, not refused for
/// disagreeing with it. (What the mutation did: a read-only open went through the read-write
/// checks, and beside a writer with live readers one with the default options was refused as
/// `InvalidOptions`; review of stop 67, RC30.)
#[tokio::test]
async fn a_read_only_open_beside_a_live_writer_needs_no_live_readers_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let live = RedbStore::open_with(&path, RedbOptions::default().live_readers(true))
        .await
        .unwrap();
    let rec = live.record(human(&child()), T0).await.unwrap();
    let reader = RedbStore::open_with(&path, read_only())
        .await
        .unwrap_or_else(|e| panic!("a read-only open beside a live writer is refused: {e}"));
    assert_eq!(
        reader.state_version(&child()).await.unwrap(),
        rec.event.sequence
    );
    reader.close().await;
    live.close().await;
}

/// An open that fails after redb has opened the file (here migrating a schema 1 file whose
/// `heads` table is not of the type schema 1 wrote: a damaged file) names the file in its
/// message, keeps its meaning (`Corrupt`), and leaves the file at schema 1.
#[tokio::test]
async fn an_open_failing_after_redb_opened_the_file_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let s = RedbStore::open(&path).await.unwrap();
    s.record(human(&child()), T0).await.unwrap();
    s.close().await;
    {
        const HEADS: redb::TableDefinition<(&str, &str), &[u8]> =
            redb::TableDefinition::new("heads");
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(HEADS)
            .unwrap()
            .insert(("agent:main:subagent:child", "main"), b"torn".as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    set_meta(&path, "schema_version", 1);
    let err = RedbStore::open(&path).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Corrupt { .. }),
        "a damaged file is Corrupt: {err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&*path.to_string_lossy()),
        "the message names the file: {text}"
    );
    let db = redb::Database::open(&path).unwrap();
    assert_eq!(
        schema_version(&db.begin_read().unwrap()),
        1,
        "nothing migrated"
    );
}

/// A schema 1 file that holds a sequence reservation (its bounded-mode writer did not close
/// cleanly) has it settled by the migration, as any read-write open settles one: the next
/// recording gets a sequence above the reservation, since numbers up to it may have been
/// handed out before the crash. Before, the migration's transaction never settled it (the
/// reservation was dropped by the next clean close), so the counter resumed after the last
/// event and could hand such a number out again.
#[tokio::test]
async fn a_schema_1_file_migrated_settles_its_sequence_reservation() {
    const META: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("meta");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let s = RedbStore::open(&path).await.unwrap();
    let last = s.record(human(&child()), T0).await.unwrap().event.sequence;
    s.close().await;
    // What a bounded writer killed between its reservation's commit and its close leaves.
    let reserved = last.get() + 1_000;
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert("reserved_sequence", reserved)
            .unwrap();
        txn.commit().unwrap();
    }
    downgrade_to_schema_1(&path);

    let s = RedbStore::open(&path).await.unwrap();
    awareness_core::testkit::durable::assert_counter_resumes_above(
        &s,
        human(&child()),
        last.get(),
        reserved,
        0,
    )
    .await;
    s.close().await;
}

/// A read-only open refuses a file one byte short of the regions its header describes, and
/// one page short, naming the file and saying it was cut short, and changes neither; the same
/// file whole opens. (The shared check cuts a store to half its length: a mutation review left
/// the header page out of the length, and every test passed.)
#[tokio::test]
async fn a_read_only_open_refuses_a_file_one_byte_or_one_page_short() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let store = RedbStore::open(&path).await.unwrap();
    for _ in 0..50 {
        store.record(human(&child()), T0).await.unwrap();
    }
    store.close().await;
    let whole = std::fs::read(&path).unwrap();
    let page = u64::from(u32::from_le_bytes(whole[12..16].try_into().unwrap()));
    assert!(page >= 512, "redb's page size, from its header: {page}");
    let len = u64::try_from(whole.len()).unwrap();
    for short in [1, page] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(len - short))
            .unwrap();
        let cut = std::fs::read(&path).unwrap();
        let err = RedbStore::open_with(&path, read_only())
            .await
            .err()
            .unwrap_or_else(|| panic!("a file {short} bytes short opened read-only"));
        assert_open_error(&err, &path, "it was cut short", OpenFailure::Other);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            cut,
            "{short}: nothing written"
        );
        std::fs::write(&path, &whole).unwrap();
    }
    let reader = RedbStore::open_with(&path, read_only())
        .await
        .expect("the whole file opens");
    assert_eq!(
        reader
            .events_after(Sequence::ZERO, 100)
            .await
            .unwrap()
            .len(),
        50
    );
    reader.close().await;
}
