//! A warning the store logs names the store's file, as its errors do: a host with several stores
//! must be able to tell which file a warning is about.
//!
//! The store's reads and writes run on tokio's blocking pool, not on the test's thread, so the
//! log capture here is the process-wide subscriber; this file holds one test, so that what it
//! captures is that test's.

use awareness_core::testkit::logs::Capture;
use awareness_core::{CursorFilter, CursorStore as _, SessionRef, Timestamp, WatcherKey};
use store_redb::RedbStore;

const T0: Timestamp = Timestamp(1_800_000_000_000);

/// A cursor row damaged by hand is left out of a listing with a warning that names the file.
#[tokio::test]
async fn a_warning_names_the_file() {
    let capture = Capture::install_globally();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.redb");
    let store = RedbStore::open(&path).await.expect("open");
    let watcher = WatcherKey::parse("agent:main:main").expect("watcher");
    let target = SessionRef::parse("agent:main:subagent:a", "main").expect("ref");
    store.watch(&watcher, &target, T0).await.expect("watch");
    assert!(
        store
            .damage_cursor_row(&watcher, &target.session_key)
            .await
            .expect("damage the cursor row"),
        "the store has a cursor row to damage"
    );

    let listed = store
        .cursors(&CursorFilter::default())
        .await
        .expect("the listing leaves the row out");
    assert_eq!(listed, Vec::new());
    let lines = capture.lines();
    let warned: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("ignoring a watch cursor that cannot be read"))
        .collect();
    assert_eq!(warned.len(), 1, "{lines:#?}");
    assert!(
        // The store names the file as it opened it: canonical (a temporary directory may sit
        // behind a symbolic link).
        warned[0].contains(&format!("path={} ", store.path().display())),
        "the warning does not name the file: {}",
        warned[0]
    );
    store.close().await;
}
