//! A store opened by a relative path stays on the file it opened after the process changes
//! its working directory: the commit-hint poller, whose connection is made at the first
//! `commit_hints`, polled the file of that name in the new directory, so that another handle's
//! commits to the store were never hinted (review, stop 57); and its check that the path
//! still names the file opened took the file of that name in the new directory for a
//! replacement, and warned (second reading, stop 59). Alone in its test binary: it changes the
//! working directory of the whole process.

use std::time::Duration;

use awareness_core::testkit::group_commit::{T0, event};
use awareness_core::{CommitHints, EventStore as _};
use store_sqlite::{SqliteOptions, SqliteStore};

/// Longest wait for a hint that must come (the poller asks every 10 ms here).
const WAIT: Duration = Duration::from_secs(30);

async fn hinted(hints: &mut Box<dyn CommitHints>) -> bool {
    tokio::time::timeout(WAIT, hints.next()).await == Ok(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_opened_by_a_relative_path_keeps_to_its_file_after_a_change_of_directory() {
    let (first, second) = (
        tempfile::tempdir().expect("temp dir"),
        tempfile::tempdir().expect("temp dir"),
    );
    let capture = awareness_core::testkit::logs::Capture::warnings();
    let options = || SqliteOptions::new().commit_hint_interval(Duration::from_millis(10));
    std::env::set_current_dir(first.path()).expect("cd into the first directory");
    let ours = SqliteStore::open_with("state.sqlite", options())
        .await
        .expect("open by a relative path");
    // Another store of the same name where the process goes next.
    let elsewhere = SqliteStore::open(second.path().join("state.sqlite"))
        .await
        .expect("open the other store");
    std::env::set_current_dir(second.path()).expect("cd into the second directory");

    let mut hints = ours.commit_hints().expect("store-sqlite pushes hints");
    assert!(hinted(&mut hints).await, "the poller's first hint");
    let theirs = SqliteStore::open(first.path().join("state.sqlite"))
        .await
        .expect("another handle on the store");
    theirs.record(event(0), T0).await.expect("record theirs");
    assert!(
        hinted(&mut hints).await,
        "another handle's commit to the store opened is hinted"
    );
    assert_eq!(
        ours.log_stats().await.expect("stats").rows,
        1,
        "the handle reads the store it opened"
    );
    assert_eq!(elsewhere.log_stats().await.expect("stats").rows, 0);
    assert!(ours.poll_commits_now().await, "the poller runs");
    assert_eq!(
        capture.said(&["deleted or replaced"]),
        0,
        "the file opened is where it was: {:?}",
        capture.lines()
    );
    std::env::set_current_dir(std::env::temp_dir()).expect("leave the directories");
}
