//! What a read-only handle does, checked the same way on every durable store that can open its
//! file read-only (an operator's tool inspecting a gateway's state): it answers exactly what the
//! file holds, it refuses every write with [`StoreError::ReadOnly`] and leaves the file's bytes
//! as they were, beside a read-write handle of the same process it sees that handle's commits,
//! and it creates nothing.
//!
//! A store provides two async factories, one opening the file it is given read-write (creating
//! it when missing) and one opening it read-only, and stamps the checks with
//! [`crate::read_only_suite!`]:
//!
//! ```text
//! async fn open(path: std::path::PathBuf)
//!     -> Result<awareness_core::testkit::Subject, awareness_core::StoreError>
//! { /* open the store on that file */ }
//! async fn open_read_only(path: std::path::PathBuf)
//!     -> Result<awareness_core::testkit::Subject, awareness_core::StoreError>
//! { /* open it read-only */ }
//! // foreign_commits: Counted, or Uncounted (what the store's foreign_commits answers)
//! awareness_core::read_only_suite!(open, open_read_only, foreign_commits: Counted);
//! ```

use std::path::Path;

use serde_json::json;

use super::checks::{T0, human, link_spec, rec, w};
use super::durable::{everything, fill, filled_refs, open};
use super::open::{contents, sizes};
use super::{OpenFile, Scratch};
use crate::error::{OpenFailure, StoreError};
use crate::model::{CursorKey, Sequence, Timestamp};
use crate::protocol::AckTarget;
use crate::retention::PruneStep;
use crate::store::AwarenessStoreExt as _;

const LATER: Timestamp = Timestamp(T0.0 + 3 * Timestamp::DAY_MS);

/// Asserts that `result` is the refusal of a read-only handle on `file`.
fn assert_refused<T: std::fmt::Debug>(what: &str, result: Result<T, StoreError>, file: &Path) {
    match result {
        Err(StoreError::ReadOnly { path, operation }) => {
            assert_eq!(
                path.file_name(),
                file.file_name(),
                "{what}: the refusal names the file"
            );
            assert!(!operation.is_empty(), "{what}: the refusal names the write");
        }
        other => {
            panic!("{what} on a read-only handle: expected StoreError::ReadOnly, got {other:?}")
        }
    }
}

/// A file a read-write handle filled ([`fill`]) and closed, and a read-only handle on it.
struct Filled {
    _dir: Scratch,
    file: std::path::PathBuf,
    /// What the read-write handle answered.
    before: String,
    /// The file's bytes once it was closed.
    bytes: Vec<u8>,
    t: super::Subject,
}

async fn filled_read_only(f: &impl OpenFile, ro: &impl OpenFile) -> Filled {
    let dir = Scratch::new("read-only");
    let file = dir.file();
    let rw = open(f, &file).await;
    let before = fill(&rw).await;
    rw.close().await;
    let bytes = std::fs::read(&file).expect("read the file");
    let t = open(ro, &file).await;
    Filled {
        _dir: dir,
        file,
        before,
        bytes,
        t,
    }
}

/// Closes the read-only handle `t` and asserts that `file` holds `bytes` still.
async fn closed_untouched(t: super::Subject, file: &Path, bytes: &[u8]) {
    t.close().await;
    assert!(
        std::fs::read(file).expect("read the file") == bytes,
        "a read-only handle left the file's bytes as they were"
    );
}

/// A read-only handle on a file a read-write handle filled and closed answers exactly what the
/// read-write handle answered: events, heads with their watermark, cursors with their pending
/// notices, upstream links, and each session's state version.
pub async fn a_read_only_handle_answers_what_the_file_holds(f: impl OpenFile, ro: impl OpenFile) {
    let dir = Scratch::new("read-only");
    let file = dir.file();
    let before = fill(&open(&f, &file).await).await;
    let t = open(&ro, &file).await;
    assert_eq!(
        everything(&t, &filled_refs()).await,
        before,
        "a read-only handle answers what the read-write handle answered"
    );
    let [kid, old, peer] = filled_refs();
    let versions = [
        t.store.state_version(&kid).await.expect("state version"),
        t.store.state_version(&old).await.expect("state version"),
        t.store.state_version(&peer).await.expect("state version"),
    ];
    assert_eq!(versions, [Sequence(9), Sequence(2), Sequence(8)]);
}

/// Every write through a read-only handle is refused with [`StoreError::ReadOnly`] naming the
/// file: writes that would change something (a pending notice to acknowledge, a session to
/// delete, events old enough to prune), writes that would change nothing, and writes a store
/// could answer from the file without writing (a recording under a dedupe key the file holds, a
/// watch the file already holds) alike. Afterwards
/// the handle answers as before, and once it is closed the file's bytes are exactly what the
/// read-write handle left.
pub async fn a_read_only_handle_refuses_every_write_and_changes_nothing(
    f: impl OpenFile,
    ro: impl OpenFile,
) {
    let Filled {
        _dir,
        file,
        before,
        bytes,
        t,
    } = filled_read_only(&f, &ro).await;
    let manager = w("agent:main:main");
    let ops = w("agent:ops:main");
    let [kid, old, peer] = filled_refs();
    let link = t
        .upstream
        .link(&kid)
        .await
        .expect("link")
        .expect("the filled store has a link");
    let (s, u) = (&*t.store, &*t.upstream);
    assert_refused("record", s.record(human(&kid), LATER).await, &file);
    assert_refused(
        "record with a dedupe key",
        s.record(human(&peer).with_dedupe_key("new"), LATER).await,
        &file,
    );
    assert_refused("watch", s.watch(&ops, &kid, LATER).await, &file);
    // Calls a store could answer from what the file holds without writing, refused all the
    // same: a recording under a dedupe key the file holds (a hit writes no event, but spends a
    // sequence), and a watch the file already holds (same watcher, same target, nothing to
    // refresh).
    assert_refused(
        "record under a stored dedupe key",
        s.record(human(&kid).with_dedupe_key("once"), LATER).await,
        &file,
    );
    let watching = s
        .cursor(&manager, &kid.session_key)
        .await
        .expect("cursor")
        .expect("the filled store has the manager's watch");
    let unchanged = watching.updated_at;
    let head = s.state_version(&kid).await.expect("state version");
    assert!(
        !crate::protocol::watch(Some(&watching), &manager, &kid, head, unchanged).1,
        "the watch again at its own clock writes nothing by the protocol"
    );
    assert_refused(
        "watch what is already watched",
        s.watch(&manager, &kid, unchanged).await,
        &file,
    );
    assert_refused(
        "unwatch",
        s.unwatch(&manager, &kid.session_key).await,
        &file,
    );
    assert_refused(
        "acknowledge",
        s.acknowledge(&manager, &[AckTarget::any(kid.session_key.clone())], LATER)
            .await,
        &file,
    );
    let key = CursorKey {
        watcher: manager.clone(),
        target: kid.session_key.clone(),
    };
    assert_refused("refreeze", s.refreeze(&[key], LATER).await, &file);
    assert_refused(
        "reset_watcher",
        s.reset_watcher(manager.session_key()).await,
        &file,
    );
    assert_refused(
        "prune_chunk",
        s.prune_chunk(&PruneStep::Age { cutoff: LATER }, 100, LATER)
            .await,
        &file,
    );
    assert_refused("delete_session", s.delete_session(&old).await, &file);
    assert_refused(
        "upsert_link",
        u.upsert_link(link_spec(&peer, "t2", 1), LATER).await,
        &file,
    );
    assert_refused(
        "set_marker",
        u.set_marker(&kid, link.updated_at, json!({"offset": 9}), LATER)
            .await,
        &file,
    );
    assert_refused("mark_scanned", u.mark_scanned(&kid, LATER).await, &file);
    assert_refused(
        "remove_link",
        u.remove_link(&kid, Some(link.updated_at)).await,
        &file,
    );
    assert_refused(
        "delete an event row",
        t.raw.delete_event_row(Sequence(3)).await,
        &file,
    );
    // Writes that would change nothing are refused too: the answer does not depend on the data.
    let stranger = crate::testkit::checks::r("agent:main:nobody", "main");
    assert_refused(
        "prune_chunk with nothing old",
        s.prune_chunk(&PruneStep::Age { cutoff: T0 }, 100, T0).await,
        &file,
    );
    assert_refused(
        "prune_chunk of no rows",
        s.prune_chunk(&PruneStep::RowCap { max_rows: 0 }, 0, T0)
            .await,
        &file,
    );
    assert_refused(
        "acknowledge nothing",
        s.acknowledge(&manager, &[], LATER).await,
        &file,
    );
    assert_refused("refreeze nothing", s.refreeze(&[], LATER).await, &file);
    assert_refused(
        "unwatch what is not watched",
        s.unwatch(&ops, &stranger.session_key).await,
        &file,
    );
    assert_refused(
        "reset a watcher without cursors",
        s.reset_watcher(&stranger.session_key).await,
        &file,
    );
    assert_refused(
        "delete an unknown session",
        s.delete_session(&stranger).await,
        &file,
    );
    assert_refused(
        "mark an unknown link scanned",
        u.mark_scanned(&stranger, LATER).await,
        &file,
    );
    assert_refused(
        "remove an unknown link",
        u.remove_link(&stranger, None).await,
        &file,
    );
    // A sweep that finds no pending cursor to re-freeze writes nothing, so it is no error on a
    // read-only handle, as `AwarenessStoreExt::sweep` says. (What the mutation did: its early
    // answer taken out, the sweep failed with `ReadOnly`; review of stop 63, U18.)
    let swept = s.sweep(LATER, &|_: &crate::WatcherKey| false).await;
    assert!(
        matches!(&swept, Ok(notices) if notices.is_empty()),
        "a sweep with nothing to re-freeze on a read-only handle: {swept:?}"
    );
    assert_eq!(
        everything(&t, &filled_refs()).await,
        before,
        "refused writes changed nothing"
    );
    closed_untouched(t, &file, &bytes).await;
}

/// Bad input to a write through a read-only handle is [`StoreError::InvalidInput`], not
/// [`StoreError::ReadOnly`]: every write checks its input first, on any handle (the contract
/// of [`EventStore`](crate::EventStore)'s errors), so that a caller learns of its mistake
/// wherever it runs it. A store that asked for its write connection first passed every other
/// check (review, stop 57). The file's bytes are left as they were.
pub async fn a_read_only_handle_refuses_bad_input_as_invalid_input(
    f: impl OpenFile,
    ro: impl OpenFile,
) {
    let Filled {
        _dir,
        file,
        bytes,
        t,
        ..
    } = filled_read_only(&f, &ro).await;
    let invalid = |what: &str, got: Result<(), StoreError>| match got {
        Err(StoreError::InvalidInput(_)) => {}
        other => panic!("{what} on a read-only handle: expected InvalidInput, got {other:?}"),
    };
    let [kid, ..] = filled_refs();
    let manager = w("agent:main:main");
    let link = t
        .upstream
        .link(&kid)
        .await
        .expect("link")
        .expect("the filled store has a link");
    let (s, u) = (&*t.store, &*t.upstream);
    let mut blank = human(&kid);
    blank.summary = " ".into();
    invalid(
        "record a blank summary",
        s.record(blank, LATER).await.map(drop),
    );
    let own = crate::model::SessionRef::new(
        manager.session_key().clone(),
        crate::model::AgentId::new("main").expect("agent"),
    );
    invalid(
        "a watcher watching its own session",
        s.watch(&manager, &own, LATER).await.map(drop),
    );
    for (what, spec, _) in super::checks::invalid_link_specs() {
        invalid(what, u.upsert_link(spec, LATER).await.map(drop));
    }
    let huge = json!({"pad": "x".repeat(crate::upstream::MAX_UPSTREAM_JSON_BYTES)});
    invalid(
        "a marker over the JSON bound",
        u.set_marker(&kid, link.updated_at, huge, LATER)
            .await
            .map(drop),
    );
    let policy = crate::retention::RetentionPolicy {
        max_rows: 0,
        ..crate::retention::RetentionPolicy::default()
    };
    invalid(
        "a pruning policy that deletes everything",
        s.prune(&policy, LATER).await.map(drop),
    );
    closed_untouched(t, &file, &bytes).await;
}

/// A read-only handle opened beside a read-write handle of the same process reads that
/// handle's commits, made before and after it opened, and the read-write handle keeps writing,
/// while the read-only one is open and after it is closed. Its
/// [`foreign_commits`](crate::EventStore::foreign_commits), like the read-write handle's, answers
/// what the stamping states ([`ForeignCommits`](super::ForeignCommits)): a number that then
/// changes with the read-write handle's commits, every one of which is another writer's to it,
/// or `None` on both handles throughout.
pub async fn a_read_only_handle_beside_a_read_write_one_sees_its_commits(
    f: impl OpenFile,
    ro: impl OpenFile,
    foreign_commits: super::ForeignCommits,
) {
    let dir = Scratch::new("read-only");
    let file = dir.file();
    let [kid, _, peer] = filled_refs();
    let rw = open(&f, &file).await;
    rec(&*rw.store, human(&kid), T0).await;
    let reader = open(&ro, &file).await;
    assert_eq!(
        reader.store.state_version(&kid).await.expect("version"),
        Sequence(1)
    );
    let foreign = async || {
        reader
            .store
            .foreign_commits()
            .await
            .expect("foreign_commits")
    };
    let before = foreign().await;
    // A read-only handle tells of other writers' commits exactly when a read-write handle of
    // the same store does, as the stamping states.
    foreign_commits.assert_answer(
        "the read-write handle",
        rw.store.foreign_commits().await.expect("foreign_commits"),
    );
    foreign_commits.assert_answer("the read-only handle", before);
    assert_eq!(foreign().await, before, "nothing was committed in between");
    rec(&*rw.store, human(&kid), T0).await;
    rec(&*rw.store, human(&peer), T0).await;
    let after = foreign().await;
    foreign_commits.assert_answer("the read-only handle after two commits", after);
    if foreign_commits.counted() {
        assert_ne!(
            after, before,
            "every commit is another writer's to a read-only handle"
        );
    }
    assert_eq!(
        reader.store.state_version(&kid).await.expect("version"),
        Sequence(2),
        "the read-only handle sees a commit made after it opened"
    );
    assert_eq!(
        reader.store.log_stats().await.expect("stats"),
        rw.store.log_stats().await.expect("stats")
    );
    assert_refused(
        "record beside a read-write handle",
        reader.store.record(human(&kid), T0).await,
        &file,
    );
    drop(reader);
    let last = rec(&*rw.store, human(&kid), T0).await;
    assert_eq!(
        last.event.sequence,
        Sequence(4),
        "the read-write handle writes after the read-only one closed"
    );
    drop(rw);
    assert_eq!(
        open(&f, &file)
            .await
            .store
            .state_version(&kid)
            .await
            .expect("version"),
        Sequence(4)
    );
}

/// A read-only open of a file that is not a store (text) is a [`StoreError::Open`] naming it,
/// and the file is left byte for byte as it was.
pub async fn a_read_only_open_refuses_a_file_that_is_not_a_store(
    _f: impl OpenFile,
    ro: impl OpenFile,
) {
    let dir = Scratch::new("read-only");
    let file = dir.file();
    let text = "not a database, but long enough to look like a header\n".repeat(200);
    std::fs::write(&file, &text).expect("a text file");
    match ro(file.clone()).await {
        Err(StoreError::Open { path, kind, .. }) => {
            assert_eq!(path.file_name(), file.file_name());
            assert_eq!(kind, OpenFailure::NotAStore, "a text file");
        }
        Err(e) => panic!("a read-only open of a text file: expected StoreError::Open, got {e}"),
        Ok(_) => panic!("a read-only open of a text file succeeded"),
    }
    assert_eq!(
        std::fs::read_to_string(&file).expect("read the file"),
        text,
        "a refused read-only open changed the file"
    );
}

/// A read-only open of a missing file is a [`StoreError::Open`] naming it, and creates
/// nothing; so is a read-only open of an empty file, which stays empty.
pub async fn a_read_only_open_creates_nothing(_f: impl OpenFile, ro: impl OpenFile) {
    let dir = Scratch::new("read-only");
    let file = dir.file();
    match ro(file.clone()).await {
        Err(StoreError::Open { path, kind, .. }) => {
            assert_eq!(path.file_name(), file.file_name());
            assert_eq!(kind, OpenFailure::NotFound, "a missing file");
        }
        Err(e) => panic!("a read-only open of a missing file: expected StoreError::Open, got {e}"),
        Ok(_) => panic!("a read-only open of a missing file succeeded"),
    }
    assert!(!file.exists(), "a read-only open created the file");
    let entries = std::fs::read_dir(dir.path()).expect("list").count();
    assert_eq!(entries, 0, "a read-only open created nothing beside it");
    std::fs::write(&file, b"").expect("an empty file");
    match ro(file.clone()).await {
        Err(StoreError::Open { path, kind, .. }) => {
            assert_eq!(path.file_name(), file.file_name());
            assert_eq!(kind, OpenFailure::NotAStore, "an empty file");
        }
        Err(e) => panic!("a read-only open of an empty file: expected StoreError::Open, got {e}"),
        Ok(_) => panic!("a read-only open of an empty file succeeded"),
    }
    assert_eq!(
        std::fs::metadata(&file).expect("metadata").len(),
        0,
        "a read-only open wrote into an empty file"
    );
}

/// Every file of `dir` with its bytes, but SQLite's shared-memory index (`-shm`), which every
/// reader of a WAL-mode file writes its read marks into and which holds no data.
fn data_files(dir: &Path) -> std::collections::BTreeMap<std::ffi::OsString, Option<Vec<u8>>> {
    let mut all = contents(dir);
    all.retain(|name, _| !name.to_string_lossy().ends_with("-shm"));
    all
}

/// A read-only open of a store's file cut to half its length is refused (an open error, or a
/// request for repair), and leaves every file in the directory as it was: no repair, no file
/// created beside it. On Unix, the same through a symbolic link in another directory: SQLite
/// makes its `-wal` and `-shm` beside the file the link names, and a store that cleaned up
/// beside the link left them there.
pub async fn a_read_only_open_refuses_a_truncated_store_and_changes_nothing(
    f: impl OpenFile,
    ro: impl OpenFile,
) {
    let dir = Scratch::new("read-only");
    let file = dir.file();
    let t = open(&f, &file).await;
    let summary = "x".repeat(150);
    for i in 0..500 {
        let session = super::checks::r(&format!("agent:main:subagent:s{}", i % 10), "main");
        rec(&*t.store, super::checks::log_only(&session, &summary), T0).await;
    }
    t.close().await;
    let len = std::fs::metadata(&file).expect("metadata").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .and_then(|file| file.set_len(len / 2))
        .expect("truncate the file");
    let links = Scratch::new("read-only-link");
    let mut paths = vec![file.clone()];
    #[cfg(unix)]
    {
        let link = links.path().join("state-link");
        std::os::unix::fs::symlink(&file, &link).expect("a symbolic link to the store");
        paths.push(link);
    }
    for opened in paths {
        let before = (contents(dir.path()), contents(links.path()));
        match ro(opened.clone()).await {
            Err(StoreError::Open { path, .. } | StoreError::NeedsRepair { path }) => {
                assert_eq!(path, opened, "the refusal names it");
            }
            Err(e) => panic!(
                "a read-only open of a truncated store ({}): expected an open error, got {e}",
                opened.display()
            ),
            Ok(_) => panic!(
                "a read-only open of a truncated store succeeded ({})",
                opened.display()
            ),
        }
        let after = (contents(dir.path()), contents(links.path()));
        assert!(
            after == before,
            "a refused read-only open of {} created, removed or wrote nothing: before {:?} {:?}, \
             after {:?} {:?}",
            opened.display(),
            sizes(&before.0),
            sizes(&before.1),
            sizes(&after.0),
            sizes(&after.1)
        );
    }
}

/// What a read-only open answers for the files of a writer that never closed, as a store's
/// invocation of [`crate::read_only_suite!`] states it (`left_open: Answers` or
/// `left_open: NeedsRepair`; `Answers` when it states nothing), for
/// [`a_read_only_handle_on_a_file_its_writer_left_open_changes_no_file`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeftOpen {
    /// The handle opens and answers what the writer had committed.
    ///
    /// store-sqlite: its file is in WAL mode, and the copy holds the main file, the `-wal` log
    /// that holds the commits not yet checkpointed, and the `-shm` index. A read-only
    /// connection reads the log as it is (the committed transactions in it, nothing of a
    /// transaction that was not committed) and neither checkpoints it into the file nor
    /// removes it; it writes only its read marks into `-shm`, which hold no data.
    Answers,
    /// The open is refused with [`StoreError::NeedsRepair`] naming the file.
    ///
    /// store-redb, in every setup (immediate, bounded, live readers): redb marks its file as
    /// needing recovery for as long as a read-write database has it open, and clears the mark
    /// only when that database closes cleanly. A copy taken while the writer is open carries
    /// the mark; recovering rebuilds redb's allocator state and writes it into the file, which
    /// a read-only open may not do, so redb gives up (`DatabaseError::RepairAborted`) and
    /// store-redb answers [`StoreError::NeedsRepair`] until a read-write open repairs it.
    NeedsRepair,
}

/// A read-only handle on the files of a writer that never closed (a gateway that crashed, as
/// an operator's tool finds them: here a copy taken while the writer is open) answers as the
/// store states (`expected`, see [`LeftOpen`]): either what the writer had committed, or a
/// refusal as needing repair naming the file; any other answer fails, and so does the answer a
/// store did not state. In both cases it leaves every data file as it found it: it neither
/// finishes the writer's work (moving a log into the file, removing it) nor repairs anything.
pub async fn a_read_only_handle_on_a_file_its_writer_left_open_changes_no_file(
    f: impl OpenFile,
    ro: impl OpenFile,
    expected: LeftOpen,
) {
    let live = Scratch::new("read-only");
    let copy = Scratch::new("read-only");
    let writer = open(&f, &live.file()).await;
    let committed = fill(&writer).await;
    for (name, bytes) in contents(live.path()) {
        let bytes = bytes.expect("the store's directory holds files only");
        std::fs::write(copy.path().join(name), bytes).expect("copy a file");
    }
    let file = copy.file();
    let before = data_files(copy.path());
    match (ro(file.clone()).await, expected) {
        (Ok(t), LeftOpen::Answers) => {
            assert_eq!(
                everything(&t, &filled_refs()).await,
                committed,
                "the read-only handle answers what the writer had committed"
            );
            t.close().await;
        }
        (Err(StoreError::NeedsRepair { path }), LeftOpen::NeedsRepair) => {
            assert_eq!(path.file_name(), file.file_name(), "the refusal names it");
        }
        (Ok(_), LeftOpen::NeedsRepair) => panic!(
            "a read-only open of a file left open succeeded, where the store states that it \
             needs repair"
        ),
        (Err(e), expected) => {
            panic!("a read-only open of a file left open, expected {expected:?}: {e:?}")
        }
    }
    let after = data_files(copy.path());
    assert!(
        after == before,
        "the read-only handle changed the files it found: before {:?}, after {:?}",
        sizes(&before),
        sizes(&after)
    );
    writer.close().await;
}
