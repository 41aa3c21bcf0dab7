//! What a read-write open does with a path that holds no store yet, or no usable one, checked
//! the same way on every durable store: a directory, a missing directory, a file that is not a
//! store and a truncated store are refused with a [`StoreError::Open`] naming the path, and
//! leave everything as it was (nothing created, nothing written); an empty file becomes a new
//! store; two opens of a new path at once both succeed and share one store; and an open
//! cancelled at any moment leaves nothing but the store's own files, and a path that opens.
//! store-memory has no file and does not run these.
//!
//! A store provides an async factory that opens the file it is given read-write with its
//! default options (creating it when missing) and stamps the checks with
//! [`crate::open_suite!`]:
//!
//! ```text
//! async fn open(path: std::path::PathBuf)
//!     -> Result<awareness_core::testkit::Subject, awareness_core::StoreError>
//! { /* open the store on that file */ }
//! awareness_core::open_suite!(open);
//! ```

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

use super::checks::{T0, child, human, log_only, r, rec};
use super::durable::open;
use super::{OpenFile, Scratch, poll_once};
use crate::error::StoreError;
use crate::model::Sequence;
use crate::store::AwarenessStoreExt as _;

/// Every entry of `dir`, by name: a file's bytes, or `None` for a directory (and its entries,
/// by their path under `dir`).
pub(crate) fn contents(dir: &Path) -> BTreeMap<OsString, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("list the directory") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().expect("a name").to_owned();
        if path.is_dir() {
            for (inner, bytes) in contents(&path) {
                let mut nested = name.clone();
                nested.push("/");
                nested.push(inner);
                out.insert(nested, bytes);
            }
            out.insert(name, None);
        } else {
            out.insert(name, Some(std::fs::read(&path).expect("read a file")));
        }
    }
    out
}

/// Opens `path` read-write through `f` and asserts that the open is refused with a
/// [`StoreError::Open`] naming `path`, with a reason, in a message that names it too; and that
/// everything in `dir` is byte for byte as it was before.
async fn assert_refused(what: &str, f: &impl OpenFile, path: &Path, dir: &Scratch) {
    let before = contents(dir.path());
    let Err(err) = f(path.to_path_buf()).await else {
        panic!("{what}: the open succeeded");
    };
    match &err {
        StoreError::Open {
            path: named,
            reason,
            ..
        } => {
            assert_eq!(named, path, "{what}: the refusal names the path");
            assert!(!reason.is_empty(), "{what}: the refusal gives a reason");
        }
        other => panic!("{what}: expected StoreError::Open, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(&path.display().to_string()),
        "{what}: the message names the path: {text}"
    );
    let after = contents(dir.path());
    assert!(
        after == before,
        "{what}: a refused open created, removed or wrote nothing: before {:?}, after {:?}",
        sizes(&before),
        sizes(&after)
    );
}

/// The names and sizes of [`contents`] (`None` for a directory), for a message.
pub(crate) fn sizes(
    contents: &BTreeMap<OsString, Option<Vec<u8>>>,
) -> Vec<(&OsString, Option<usize>)> {
    contents
        .iter()
        .map(|(name, bytes)| (name, bytes.as_ref().map(Vec::len)))
        .collect()
}

/// A directory where the file should be is refused, and left as it was (with what it holds).
pub async fn a_directory_is_refused(f: impl OpenFile) {
    let dir = Scratch::new("open");
    let file = dir.file();
    std::fs::create_dir(&file).expect("a directory at the store's path");
    std::fs::write(file.join("inside"), b"somebody's file").expect("a file in it");
    assert_refused("a directory", &f, &file, &dir).await;
}

/// A file in a directory that does not exist is refused, and the directory is not created.
pub async fn a_missing_directory_is_not_created(f: impl OpenFile) {
    let dir = Scratch::new("open");
    let missing = dir.path().join("missing");
    let file = missing.join("state");
    assert_refused("a file in a missing directory", &f, &file, &dir).await;
    assert!(!missing.exists(), "the missing directory was not created");
}

/// A file that is not a store (text, long enough to look like a header and to span pages) is
/// refused and left byte for byte as it was, with nothing created beside it.
pub async fn a_file_that_is_not_a_store_is_refused_and_left_untouched(f: impl OpenFile) {
    let dir = Scratch::new("open");
    let file = dir.file();
    let text = "these are somebody's notes, not a database\n".repeat(2_000);
    std::fs::write(&file, &text).expect("a text file");
    assert_refused("a text file", &f, &file, &dir).await;
}

/// A store's file cut to half its length (a copy that stopped midway, a full disk) is refused
/// and left byte for byte as it was, with nothing created beside it: an open must neither
/// repair it nor start a new store over it.
pub async fn a_truncated_file_is_refused_and_left_untouched(f: impl OpenFile) {
    let dir = Scratch::new("open");
    let file = dir.file();
    let t = open(&f, &file).await;
    let summary = "x".repeat(150);
    for i in 0..500 {
        let session = r(&format!("agent:main:subagent:s{}", i % 10), "main");
        rec(&*t.store, log_only(&session, &summary), T0).await;
    }
    t.close().await;
    let len = std::fs::metadata(&file).expect("metadata").len();
    assert!(len >= 64 * 1024, "the store spans many pages: {len} bytes");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .and_then(|file| file.set_len(len / 2))
        .expect("truncate the file");
    assert_refused("a truncated store", &f, &file, &dir).await;
}

/// An empty file (created beforehand, as a deployment tool may) is opened as a new store: it
/// records from sequence 1, and what it recorded is there after a reopen.
pub async fn an_empty_file_becomes_a_new_store(f: impl OpenFile) {
    let dir = Scratch::new("open");
    let file = dir.file();
    std::fs::write(&file, b"").expect("an empty file");
    let kid = child();
    let t = open(&f, &file).await;
    assert_eq!(
        t.store.log_stats().await.expect("stats").rows,
        0,
        "an empty file holds no events"
    );
    let first = rec(&*t.store, human(&kid), T0).await;
    assert_eq!(first.event.sequence, Sequence(1), "a new store starts at 1");
    t.close().await;
    assert!(
        std::fs::metadata(&file).expect("metadata").len() > 0,
        "the store was written into the empty file"
    );
    let t = open(&f, &file).await;
    assert_eq!(
        t.store.state_version(&kid).await.expect("version"),
        Sequence(1),
        "the new store's event is there after a reopen"
    );
    let next = rec(&*t.store, human(&kid), T0).await;
    assert_eq!(next.event.sequence, Sequence(2));
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    // Names only, no bytes: a file a background task removes (a cancelled open's staged copy,
    // a companion file at close) may go between the listing and a read, which then failed the
    // check while the directory was still settling.
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("list the directory") {
            let path = entry.expect("a directory entry").path();
            let name = format!(
                "{prefix}{}",
                path.file_name().expect("a name").to_string_lossy()
            );
            if path.is_dir() {
                walk(&path, &format!("{name}/"), out);
            }
            out.push(name);
        }
    }
    let mut names = Vec::new();
    walk(dir, "", &mut names);
    names.sort();
    names
}

/// Asserts that `dir` holds the store's file `state` and nothing else (no staged copy, no
/// companion file left after every handle closed).
fn assert_only_the_store(what: &str, dir: &Scratch) {
    let left = names(dir.path());
    assert_eq!(left, ["state"], "{what}: only the store's file is left");
}

/// The names in `dir` once `done` holds for them, or after 30 s: a cancelled open may leave
/// work that ends on a thread of its own (a connection closing, a file being made), and what it
/// leaves is checked once it has ended. (A hang guard, not a timing assertion: the caller
/// asserts on the names.)
async fn settled_names(dir: &Path, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let names = names(dir);
        if done(&names) || Instant::now() >= deadline {
            return names;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Two opens of the same new path at once (two tasks of a gateway starting together) both
/// succeed and share one store: what one records, the other reads, and it is in the file once
/// both are closed, with nothing but the store's file left beside it. A store that creates a
/// new file must not let the second open fail on, or remove, what the first is making. Every
/// other round the path holds an empty file (as a deployment tool may create), which both opens
/// make a store at once. The two opens start together on two threads, behind a barrier, so
/// that they overlap on both cores (awaited on one task, they overlapped in few rounds).
pub async fn two_opens_of_a_new_file_at_once_both_succeed_and_share_it(f: impl OpenFile + Sync) {
    let kid = child();
    for round in 0..100 {
        let dir = Scratch::new("open");
        let file = dir.file();
        if round % 2 == 1 {
            std::fs::write(&file, b"").expect("an empty file");
        }
        let (a, b) = open_twice_at_once(&f, &file);
        let a = a.unwrap_or_else(|e| panic!("round {round}: the first open failed: {e}"));
        let b = b.unwrap_or_else(|e| panic!("round {round}: the second open failed: {e}"));
        // Record through each handle in turn, and read through the other.
        let (first, second) = if round % 2 == 0 { (a, b) } else { (b, a) };
        let recorded = rec(&*first.store, human(&kid), T0).await;
        assert_eq!(
            recorded.event.sequence,
            Sequence(1),
            "round {round}: one new store, starting at 1"
        );
        assert_eq!(
            second.store.state_version(&kid).await.expect("version"),
            Sequence(1),
            "round {round}: the other handle reads the same store"
        );
        let next = rec(&*second.store, human(&kid), T0).await;
        assert_eq!(next.event.sequence, Sequence(2), "round {round}");
        first.close().await;
        second.close().await;
        let t = open(&f, &file).await;
        assert_eq!(
            t.store.state_version(&kid).await.expect("version"),
            Sequence(2),
            "round {round}: both handles' events are in the file"
        );
        t.close().await;
        assert_only_the_store(&format!("round {round}"), &dir);
    }
}

/// Opens `file` through `f` on two threads released together by a barrier, each driving its
/// open on the current (multi-thread) runtime.
fn open_twice_at_once(
    f: &(impl OpenFile + Sync),
    file: &Path,
) -> (
    Result<super::Subject, StoreError>,
    Result<super::Subject, StoreError>,
) {
    let runtime = tokio::runtime::Handle::current();
    let start = std::sync::Barrier::new(2);
    let one = || {
        start.wait();
        runtime.block_on(f(file.to_path_buf()))
    };
    tokio::task::block_in_place(|| {
        std::thread::scope(|s| {
            let a = s.spawn(one);
            let b = s.spawn(one);
            (
                a.join().expect("the first open's thread"),
                b.join().expect("the second open's thread"),
            )
        })
    })
}

/// An open of a new path cancelled at any moment (a caller's timeout, a gateway shutting down
/// while it starts) leaves the directory with nothing but the store's own files, and the path
/// opens afterwards as a new, empty store: no staged copy is left, no half-made file refuses
/// the next open, and work the cancelled open left running does not hold the file against it.
pub async fn an_open_cancelled_at_any_moment_leaves_a_path_that_opens(f: impl OpenFile) {
    let kid = child();
    let mut cancelled = 0;
    for round in 0..150u64 {
        let dir = Scratch::new("open");
        let file = dir.file();
        // Polled until `budget` has passed, then dropped: from cancelled after its first poll
        // to after it finished.
        let budget = Duration::from_micros(round % 75 * 40);
        let started = Instant::now();
        {
            let mut opening = std::pin::pin!(f(file.clone()));
            while !poll_once(opening.as_mut()).await {
                if started.elapsed() >= budget {
                    // Dropped while it was under way.
                    cancelled += 1;
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        let the_stores = |names: &[String]| names.iter().all(|n| n.starts_with("state"));
        let left = settled_names(dir.path(), the_stores).await;
        assert!(
            the_stores(&left),
            "round {round}: the cancelled open left {left:?}"
        );
        let t = f(file.clone())
            .await
            .unwrap_or_else(|e| panic!("round {round}: the open after a cancelled one: {e}"));
        assert_eq!(
            t.store.log_stats().await.expect("stats").rows,
            0,
            "round {round}: a new store holds no events"
        );
        let first = rec(&*t.store, human(&kid), T0).await;
        assert_eq!(first.event.sequence, Sequence(1), "round {round}");
        t.close().await;
        let left = settled_names(dir.path(), |names| names == ["state"]).await;
        assert_eq!(
            left,
            ["state"],
            "round {round}: only the store's file is left"
        );
    }
    // Otherwise the rounds checked only complete opens.
    assert!(cancelled > 0, "no open was cancelled while under way");
}
