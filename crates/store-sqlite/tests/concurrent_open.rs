//! Opens of one file at the same moment, by two handles of one process and by two processes:
//! each of them succeeds, none of them removes the file another one uses, and what each one
//! recorded is in the file afterwards. (Here, in a file of their own, so that no heavy test
//! runs beside them: the opens must overlap on both cores to meet the race they check.)
//!
//! The open suite (`awareness_core::open_suite!`) checks the same contract on every file-backed
//! store, with both opens polled by one task; these tests start them on two tasks behind a
//! barrier, in two processes, and count the cancels that land while a new store is staged,
//! which only store-sqlite does.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use awareness_core::{
    ActorType, AwarenessStoreExt as _, EventKind, EventStore as _, NewEvent, Sequence, SessionRef,
    Timestamp,
};
use store_sqlite::SqliteStore;

const TORTURE: &str = env!("CARGO_BIN_EXE_store-sqlite-torture");

fn target() -> SessionRef {
    SessionRef::parse("agent:main:subagent:t0", "main").unwrap()
}

/// The names of the entries of `dir`.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Opens `path` twice at once, records through one handle and reads through the other, closes
/// both and reopens the file: both opens must succeed, the event must be in the file, and
/// nothing but the store must be left in its directory.
async fn open_twice_at_once(path: &Path, round: usize) {
    // Two tasks that start their opens together, so that the opens overlap on both cores
    // (awaited one after the other on one task, they overlapped in a few rounds of 200).
    let start = Arc::new(tokio::sync::Barrier::new(2));
    let open = || {
        let (path, start) = (path.to_path_buf(), Arc::clone(&start));
        tokio::spawn(async move {
            start.wait().await;
            SqliteStore::open(path).await
        })
    };
    let (a, b) = tokio::join!(open(), open());
    let a = a
        .unwrap()
        .unwrap_or_else(|e| panic!("round {round}: the first open failed: {e}"));
    let b = b
        .unwrap()
        .unwrap_or_else(|e| panic!("round {round}: the second open failed: {e}"));
    assert!(path.is_file(), "round {round}: the file is gone");
    let (first, second) = if round.is_multiple_of(2) {
        (&a, &b)
    } else {
        (&b, &a)
    };
    let rec = first
        .record(
            NewEvent::new(target(), EventKind::Created, ActorType::System, "x"),
            Timestamp::now(),
        )
        .await
        .unwrap_or_else(|e| panic!("round {round}: record: {e}"));
    assert_eq!(
        second.state_version(&target()).await.unwrap(),
        rec.event.sequence,
        "round {round}: the other handle reads the same file"
    );
    a.close().await;
    b.close().await;
    let reopened = SqliteStore::open(path).await.unwrap();
    assert_eq!(
        reopened.state_version(&target()).await.unwrap(),
        rec.event.sequence,
        "round {round}: the recorded event is in the file"
    );
    reopened.close().await;
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(
        names(path.parent().unwrap()),
        [name],
        "round {round}: only the store is left"
    );
}

/// Two opens of the same new path at once both succeed, and neither loses the file the other
/// is using. (Before, one of them could fail on the lock the other held while switching the
/// new file to WAL, and remove the file if it had created it, under the other.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_opens_of_a_new_file_at_once_both_succeed_and_keep_it() {
    for round in 0..150 {
        let dir = tempfile::tempdir().unwrap();
        open_twice_at_once(&dir.path().join("new.sqlite"), round).await;
    }
}

/// Two opens at once of an empty file (as a deployment tool may create) both succeed: both
/// switch it to WAL, and the one SQLite answers BUSY at once tries again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_opens_of_an_empty_file_at_once_both_succeed() {
    for round in 0..150 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.sqlite");
        std::fs::write(&path, b"").unwrap();
        open_twice_at_once(&path, round).await;
    }
}

/// Two processes that open the same new path at once, told to go together, both succeed, and
/// the events each recorded are all in the file afterwards (none went into a file the other
/// removed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_opening_a_new_file_at_once_keep_what_each_recorded() {
    const EVENTS: usize = 5;
    for round in 0..40 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.sqlite");
        let spawn = |tag: &str| {
            Command::new(TORTURE)
                .args(["go-batch", path.to_str().unwrap(), tag, &EVENTS.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn a writer process")
        };
        let mut children = [spawn("p0"), spawn("p1")];
        for child in &mut children {
            child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        }
        let mut sequences = Vec::new();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "round {round}: a writer process failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            for line in String::from_utf8(out.stdout).unwrap().lines() {
                let (seq, _) = line.split_once(' ').unwrap();
                sequences.push(seq.parse::<u64>().unwrap());
            }
        }
        assert_eq!(sequences.len(), 2 * EVENTS, "round {round}");
        let store = SqliteStore::open(&path).await.unwrap();
        let stored: Vec<u64> = store
            .events_after(Sequence::ZERO, 100)
            .await
            .unwrap()
            .iter()
            .map(|e| e.sequence.get())
            .collect();
        store.close().await;
        sequences.sort_unstable();
        assert_eq!(
            stored, sequences,
            "round {round}: every event a process recorded is in the file"
        );
        assert_eq!(names(dir.path()), ["new.sqlite"], "round {round}");
    }
}

/// An open of a new file cancelled at any point (a start-up timeout, an aborted task) leaves
/// no file of its own behind: the directory holds the store, or nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_cancelled_while_it_creates_the_store_leaves_no_staged_file() {
    // Rounds whose open was cancelled while it had a staged file: the case checked.
    let mut cancelled_while_staging = 0;
    for round in 0..400u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.sqlite");
        let opening = path.clone();
        let open = tokio::spawn(async move { SqliteStore::open(&opening).await });
        // From before the open starts to after it ends.
        tokio::time::sleep(std::time::Duration::from_micros(round % 120 * 40)).await;
        let staging = names(dir.path())
            .iter()
            .any(|n| n.starts_with(".awareness-new-"));
        open.abort();
        match open.await {
            Ok(opened) => drop(opened.expect("open")),
            Err(e) => {
                assert!(e.is_cancelled(), "round {round}: {e}");
                // Staging ends with the link: a store not in place yet was cancelled while
                // staging (not after it, during the WAL switch, say).
                cancelled_while_staging += usize::from(staging && !path.exists());
            }
        }
        // A statement the cancelled open had sent finishes on sqlx's thread, which may make
        // SQLite's journal beside the staged file again for a moment: what is left is checked
        // once that thread is done (30 s is a hang guard, not a timing assertion).
        let ours = |names: &[String]| names.iter().all(|n| n.starts_with("new.sqlite"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut left = names(dir.path());
        while !ours(&left) && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            left = names(dir.path());
        }
        assert!(
            ours(&left),
            "round {round}: the cancelled open left {left:?}"
        );
        if cancelled_while_staging >= 20 {
            break;
        }
    }
    // Otherwise the rounds checked nothing.
    assert!(
        cancelled_while_staging > 0,
        "no open was cancelled while it staged the store"
    );
}
