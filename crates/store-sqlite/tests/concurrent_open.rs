//! Opens of one new file at the same moment by two processes (each succeeds, none removes the
//! file the other uses, and what each recorded is in the file afterwards), and opens cancelled
//! while they stage a new store (nothing of theirs is left). Here, in a file of their own, so
//! that no heavy test runs beside them: the opens must overlap on both cores to meet the race
//! they check.
//!
//! The open suite (`awareness_core::open_suite!`) checks two opens of a new or an empty file
//! by two threads of one process on every file-backed store; these tests add two processes,
//! and count the cancels that land while a new store is staged, which only store-sqlite does.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use awareness_core::{EventStore as _, Sequence};
use store_sqlite::SqliteStore;

const TORTURE: &str = env!("CARGO_BIN_EXE_store-sqlite-torture");

/// The names of the entries of `dir`.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
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
        for (child, tag) in children.into_iter().zip(["p0", "p1"]) {
            // Killed, and the test failed, should it hang (a deadlock between the two opens).
            let what = format!("round {round}: writer process {tag}");
            let out = awareness_core::testkit::open::wait_within(child, &what);
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
        // From before the open starts to after it ends, in steps of 40 µs (a sleep would be
        // rounded up to the timer's millisecond).
        let until = std::time::Instant::now() + std::time::Duration::from_micros(round % 120 * 40);
        while std::time::Instant::now() < until {
            tokio::task::yield_now().await;
        }
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
