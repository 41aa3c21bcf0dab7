//! Once a store is open, a failure of any of its calls names the store's file (the store was
//! opened long before, maybe among others: an error without the path says nothing of which), and
//! so does a warning it logs.

use std::path::Path;

use awareness_core::{
    ActorType, EventKind, EventStore as _, NewEvent, Sequence, SessionRef, StoreError, Timestamp,
};
use sqlx::Connection as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use store_sqlite::SqliteStore;

/// Runs `sql` on the file through a connection of its own, behind the store's back.
async fn behind_the_back(path: &Path, sql: &'static str) {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(std::time::Duration::from_secs(10));
    let mut conn = SqliteConnection::connect_with(&options)
        .await
        .expect("a connection of its own");
    sqlx::query(sql).execute(&mut conn).await.expect(sql);
    conn.close().await.expect("close");
}

/// `err`'s text names the file, once.
fn names_the_file_once(err: &StoreError, path: &Path) {
    let text = err.to_string();
    assert_eq!(
        text.matches(&path.display().to_string()).count(),
        1,
        "{text}"
    );
}

/// A row damaged behind the store's back fails a read with `Corrupt`, and a write refused by
/// SQLite fails with a backend error; both name the file, and keep their variant and source.
#[tokio::test]
async fn an_error_after_the_open_names_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.sqlite");
    let store = SqliteStore::open(&path).await.expect("open");
    let session = SessionRef::parse("agent:main:main", "main").expect("ref");
    let event = || {
        NewEvent::new(
            session.clone(),
            EventKind::HumanDirectMessage,
            ActorType::Human,
            "a message",
        )
    };
    store.record(event(), Timestamp(1)).await.expect("record");

    // An actor type this store does not know makes the row corrupt (without `fields_json`,
    // this store's copy of the fields, the row is read from its columns, as OpenClaw's rows are).
    behind_the_back(
        &path,
        "UPDATE session_state_events SET actor_type = 'alien', fields_json = NULL",
    )
    .await;
    let err = store
        .changes_since(&session, Sequence::ZERO, 10)
        .await
        .expect_err("the damaged row fails the page");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("alien"), "{err}");
    names_the_file_once(&err, &path);
    let err = store
        .events_after(Sequence::ZERO, 10)
        .await
        .expect_err("the damaged row fails the log");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    names_the_file_once(&err, &path);

    // A trigger refusing every insert fails the recording in SQLite.
    behind_the_back(
        &path,
        "CREATE TRIGGER refuse BEFORE INSERT ON session_state_events BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END",
    )
    .await;
    let err = store
        .record(event(), Timestamp(2))
        .await
        .expect_err("the trigger refuses the insert");
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
    assert!(!err.is_retryable());
    assert!(
        std::error::Error::source(&err)
            .is_some_and(|s| s.to_string().contains("refused by a trigger")),
        "the source is kept: {err:?}"
    );
    names_the_file_once(&err, &path);

    // The row edits beside the trait's calls (test support) name it too.
    behind_the_back(
        &path,
        "CREATE TRIGGER keep BEFORE DELETE ON session_state_events BEGIN SELECT RAISE(ABORT, 'kept by a trigger'); END",
    )
    .await;
    let err = store
        .delete_event_row(Sequence(1))
        .await
        .expect_err("the trigger refuses the deletion");
    assert!(
        std::error::Error::source(&err)
            .is_some_and(|s| s.to_string().contains("kept by a trigger")),
        "the source is kept: {err:?}"
    );
    names_the_file_once(&err, &path);
    store.close().await;
}

/// An open of a text file says what is wrong in our words, with SQLite's as its source, shown
/// once by `ErrorChain`. (That the message does not quote its source, which a reporter
/// printing every source would print twice, is the shared open checks' on every store.)
#[tokio::test]
async fn an_open_of_a_text_file_shows_its_cause_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("notes.sqlite");
    std::fs::write(&path, "these are my notes, not a database\n".repeat(200)).expect("write");
    let err = SqliteStore::open(&path).await.expect_err("not a database");
    let cause = std::error::Error::source(&err)
        .expect("SQLite's error is the source")
        .to_string();
    assert!(cause.contains("file is not a database"), "{cause}");
    let chain = awareness_core::error::ErrorChain(&err).to_string();
    assert_eq!(chain.matches(&cause).count(), 1, "{chain}");
    names_the_file_once(&err, &path);
}
