//! Event rows another writer of the file may leave: text that is not UTF-8, stored fields that
//! are not JSON, a sequence of 0 or below. A read that meets a row it cannot read still fails
//! (decision 0016), but names the row (`event <sequence>`, its session, the file), so that an
//! operator can act on it; reads that do not reach it answer. A row numbered 0 or below is
//! returned by no read, fails none, is found by the store's probe, and is pruned in its turn.

use std::path::Path;

use awareness_core::testkit::checks::human;
use awareness_core::{
    AwarenessStoreExt as _, CursorStore as _, EventStore as _, RetentionPolicy, Sequence,
    SessionRef, StoreError, Timestamp, WatcherKey,
};
use sqlx::Connection as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use store_sqlite::{EventsBelowOne, SqliteStore};

/// The clock of the rows these tests write.
const T0: Timestamp = Timestamp(1_800_000_000_000);

/// A store in `dir` with one human event on `agent:main:subagent:a`, then `sql` run on its file
/// behind the store's back.
async fn one_event_then_behind_the_back(
    dir: &tempfile::TempDir,
    sql: &str,
) -> (SqliteStore, SessionRef) {
    let path = dir.path().join("state.sqlite");
    let store = SqliteStore::open(&path).await.expect("open");
    let session = SessionRef::parse("agent:main:subagent:a", "main").expect("ref");
    store.record(human(&session), T0).await.expect("record");
    behind_the_back(&path, sql, &[]).await;
    (store, session)
}

/// Runs `sql` (binding `binds` to `$1`, `$2`, ...) on the file through a connection of its own,
/// behind the store's back, as another writer would.
async fn behind_the_back(path: &Path, sql: &str, binds: &[i64]) {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(std::time::Duration::from_secs(10));
    let mut conn = SqliteConnection::connect_with(&options)
        .await
        .expect("a connection of its own");
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()));
    for b in binds {
        q = q.bind(*b);
    }
    q.execute(&mut conn).await.expect(sql);
    conn.close().await.expect("close");
}

/// `err` is `Corrupt` and names the row (`event <seq> `, then what says its session) and the
/// file, once.
fn names_the_row(err: &StoreError, path: &Path, seq: u64, session: &str) {
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&format!("event {seq} ")), "{text}");
    assert!(text.contains(session), "{text}");
    assert_eq!(
        text.matches(&path.display().to_string()).count(),
        1,
        "{text}"
    );
}

fn seqs(events: &[std::sync::Arc<awareness_core::Event>]) -> Vec<u64> {
    events.iter().map(|e| e.sequence.get()).collect()
}

/// Sessions a and b, recorded on alternately (a 1, b 2, a 3 with the dedupe key "third",
/// b 4, a 5), in a new store at `path`.
async fn five_events(path: &Path) -> (SqliteStore, SessionRef, SessionRef) {
    let store = SqliteStore::open(path).await.expect("open");
    let a = SessionRef::parse("agent:main:subagent:a", "main").expect("ref");
    let b = SessionRef::parse("agent:main:subagent:b", "main").expect("ref");
    for (i, session) in [&a, &b, &a, &b, &a].into_iter().enumerate() {
        let event = if i == 2 {
            human(session).with_dedupe_key("third")
        } else {
            human(session)
        };
        let rec = store.record(event, T0).await.expect("record");
        assert_eq!(rec.event.sequence.get(), i as u64 + 1);
    }
    (store, a, b)
}

/// An event row whose summary holds a byte that is not UTF-8 and that has no stored fields (as
/// OpenClaw's writer leaves a row) fails the log and its session's page from below it, and a
/// recording whose dedupe key hits it (alone and on a watched target, one batch and two),
/// each with `Corrupt` naming `event 3`, its session and the file. SQLite copies the bytes
/// into the one text a page is read from, which failed as a whole with an offset into the
/// page and no row. The log and the page from past it, the log up to below it, the other
/// session's page and the log's stats answer. The audit (`awareness doctor`) gives the row's
/// error with its cause, the byte that is not UTF-8. (What the mutation did: the error's first
/// line only; review of stop 65, CM53.)
#[tokio::test]
async fn an_event_whose_text_is_not_utf8_fails_the_reads_that_reach_it_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.sqlite");
    let (store, a, b) = five_events(&path).await;
    behind_the_back(
        &path,
        "UPDATE session_state_events SET summary = summary || CAST(X'FF' AS TEXT), \
         fields_json = NULL WHERE sequence = $1",
        &[3],
    )
    .await;
    let key = a.session_key.as_str();

    let err = store
        .events_after(Sequence::ZERO, 10)
        .await
        .expect_err("the log over the row");
    names_the_row(&err, &path, 3, key);
    let chain = awareness_core::error::ErrorChain(&err).to_string();
    assert_ne!(chain, err.to_string(), "the error has a cause: {chain}");
    let audit = awareness_core::audit::audit_store(&store)
        .await
        .expect("an audit over the row");
    let reasons: Vec<&String> = audit
        .findings
        .iter()
        .filter_map(|f| match f {
            awareness_core::audit::Finding::UnreadableEvent { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons,
        [&chain],
        "the audit gives the error with its cause"
    );
    let err = store
        .changes_since(&a, Sequence::ZERO, 10)
        .await
        .expect_err("the session's page over the row");
    names_the_row(&err, &path, 3, key);
    for watched in [false, true] {
        if watched {
            // A watched target records in two batches.
            store
                .watch(&WatcherKey::parse("agent:main:main").unwrap(), &a, T0)
                .await
                .expect("watch");
        }
        let err = store
            .record(human(&a).with_dedupe_key("third"), T0)
            .await
            .expect_err("a dedupe hit on the row");
        names_the_row(&err, &path, 3, key);
    }

    let log = store
        .events_after(Sequence::ZERO, 2)
        .await
        .expect("the log up to below the row");
    assert_eq!(seqs(&log), [1, 2]);
    let log = store
        .events_after(Sequence(3), 10)
        .await
        .expect("the log past the row");
    assert_eq!(seqs(&log), [4, 5]);
    let page = store
        .changes_since(&a, Sequence(3), 10)
        .await
        .expect("the page past the row");
    assert_eq!(seqs(&page.events), [5]);
    let page = store
        .changes_since(&b, Sequence::ZERO, 10)
        .await
        .expect("the other session's page");
    assert_eq!(seqs(&page.events), [2, 4]);
    let stats = store.log_stats().await.expect("stats");
    assert_eq!((stats.rows, stats.max_sequence), (5, Sequence(5)));
    store.close().await;
}

/// An event row whose session key holds a byte that is not UTF-8 (the testkit's
/// `spoil_event_text`) fails the log and a dedupe hit on it naming `event 3`, its key as read
/// (with U+FFFD) as its session and its agent as its agent; it is no longer on its session's
/// page, which answers.
#[tokio::test]
async fn an_event_whose_session_key_is_not_utf8_fails_the_log_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.sqlite");
    let (store, a, _) = five_events(&path).await;
    assert!(store.spoil_event_text(Sequence(3)).await.expect("spoil"));
    let key = format!("{}\u{FFFD}", a.session_key.as_str());

    let err = store
        .events_after(Sequence(1), 10)
        .await
        .expect_err("the log over the row");
    names_the_row(&err, &path, 3, &key);
    // Its key as its session and its agent as its agent, in place. (What the mutation did: the
    // row read again on its own was named `of session "main" (agent "agent:main:...")`; review
    // of stop 68, S820.)
    let text = err.to_string();
    assert!(
        text.contains(&format!("event 3 of session \"{}", a.session_key.as_str())),
        "{text}"
    );
    assert!(text.contains("(agent \"main\")"), "{text}");
    let err = store
        .record(human(&a).with_dedupe_key("third"), T0)
        .await
        .expect_err("a dedupe hit on the row");
    names_the_row(&err, &path, 3, &key);
    let page = store
        .changes_since(&a, Sequence::ZERO, 10)
        .await
        .expect("its old session's page, which no longer holds it");
    assert_eq!(seqs(&page.events), [1, 5]);
    store.close().await;
}

/// An event row whose stored fields (`fields_json`, this store's copy) are not JSON fails its
/// session's page naming `event 3`, its session and the file (the page's error named no row:
/// "events: unreadable row set"); the log, read from the columns, answers. Fields one
/// character away from JSON, which serde_json refuses, fail the page the same way: the
/// store's own fast reader of them (decision 0007) gives up wherever serde_json would. (A
/// `\u` escape whose digits begin with `+`, `nulx` for `null`, a raw U+001F in a string,
/// before an escape or after one: each was read as an event under a mutation of that reader
/// that every test passed: review of stop 61.)
#[tokio::test]
async fn an_event_whose_stored_fields_are_not_json_fails_its_page_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.sqlite");
    let (store, a, _) = five_events(&path).await;
    for torn in [
        "[torn",
        r#"[null,"message","human",null,null,0,"\u+041",null,null]"#,
        r#"[nulx,"message","human",null,null,0,"x",null,null]"#,
        "[null,\"message\",\"human\",null,null,0,\"a\u{1f}b\",null,null]",
        // The same after an escape, which the reader takes another way.
        "[null,\"message\",\"human\",null,null,0,\"a\\nb\u{1f}c\",null,null]",
    ] {
        tear_fields(&path, 3, torn).await;
        let err = store
            .changes_since(&a, Sequence::ZERO, 10)
            .await
            .expect_err("the session's page over the row");
        names_the_row(&err, &path, 3, a.session_key.as_str());
    }
    let log = store
        .events_after(Sequence::ZERO, 10)
        .await
        .expect("the log");
    assert_eq!(seqs(&log), [1, 2, 3, 4, 5]);
    store.close().await;
}

/// Replaces event `sequence`'s stored fields with `torn`, which serde_json does not read.
async fn tear_fields(path: &Path, sequence: i64, torn: &str) {
    assert!(
        serde_json::from_str::<serde_json::Value>(torn).is_err(),
        "{torn}"
    );
    behind_the_back(
        path,
        &format!("UPDATE session_state_events SET fields_json = '{torn}' WHERE sequence = $1"),
        &[sequence],
    )
    .await;
}

/// Stored fields that serde_json refuses, though the store's fast reader of a page (decision
/// 0007) could take them, fail their session's page naming the row: a high surrogate escaped
/// before `\ue000`, just past the low surrogates (row 3), and the last row's fields followed
/// by `] x`, which closes the page's array early and leaves text after it (row 5). (What the
/// mutations did: the low surrogates' range took `\ue000` in, and the page read row 3 with a
/// character made up of the two; or the reader no longer checked the page's text ended after
/// its array, and read row 5 as if its fields were whole; review of stop 69, S939 and S940.)
#[tokio::test]
async fn fields_just_past_what_serde_json_reads_fail_the_page_naming_the_row() {
    for (sequence, torn) in [
        (
            3,
            r#"[null,"message","human",null,null,0,"\ud83d\ue000",null,null]"#,
        ),
        (
            5,
            r#"[null,"message","human",null,null,0,"x",null,null]] x"#,
        ),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("state.sqlite");
        let (store, a, _) = five_events(&path).await;
        tear_fields(&path, sequence, torn).await;
        let err = store
            .changes_since(&a, Sequence::ZERO, 10)
            .await
            .expect_err("the session's page over the row");
        names_the_row(
            &err,
            &path,
            sequence.cast_unsigned(),
            a.session_key.as_str(),
        );
        store.close().await;
    }
}

/// An event row whose stored fields (`fields_json`) hold two rows of fields, which the page's
/// one joined text then reads as one event more than it has sequences, fails its session's
/// page naming `event 3`, its session and the file; no page is answered with the later events
/// each given the fields before theirs. (What the mutation did: the page's sequences and
/// fields compared with `>` instead of `!=`, so a page with more fields than sequences was
/// paired up and answered with event 5 holding event 3's second row; review of stop 68, S801.)
#[tokio::test]
async fn an_event_whose_stored_fields_hold_two_rows_fails_its_page_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.sqlite");
    let (store, a, _) = five_events(&path).await;
    let two = r#"[null,"message","human",null,null,0,"first",null,null],[null,"message","human",null,null,0,"second",null,null]"#;
    behind_the_back(
        &path,
        &format!("UPDATE session_state_events SET fields_json = '{two}' WHERE sequence = $1"),
        &[3],
    )
    .await;
    match store.changes_since(&a, Sequence::ZERO, 10).await {
        Err(err) => names_the_row(&err, &path, 3, a.session_key.as_str()),
        Ok(page) => panic!(
            "a page was answered over a row of two rows of fields: {:?}",
            page.events
                .iter()
                .map(|e| (e.sequence.get(), e.summary.clone()))
                .collect::<Vec<_>>()
        ),
    }
    store.close().await;
}

/// Rows numbered -1 and 0 (OpenClaw's table takes them; no writer we know numbers a row so)
/// fail neither their session's page, whose earliest sequence was taken over every row and
/// refused -1, nor the log's stats, which `tail` reads first; the log does not return them.
/// The store's probe finds both, and pruning by age deletes them in their turn.
#[tokio::test]
async fn events_numbered_below_one_fail_no_read_are_found_and_pruned_in_their_turn() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.sqlite");
    let store = SqliteStore::open(&path).await.expect("open");
    let a = SessionRef::parse("agent:main:subagent:a", "main").expect("ref");
    assert_eq!(
        store.events_numbered_below_one().await.expect("probe"),
        None
    );
    // Two months old, as OpenClaw writes a row (no stored fields).
    let old = T0.minus_ms(60 * Timestamp::DAY_MS).millis();
    for seq in [-1, 0] {
        behind_the_back(
            &path,
            "INSERT INTO session_state_events (sequence, session_key, agent_id, kind, \
             actor_type, occurred_at, summary) VALUES ($1, 'agent:main:subagent:a', 'main', \
             'created', 'system', $2, 'x')",
            &[seq, old],
        )
        .await;
        // A log of such rows only has no row a read returns: its stats are 0 rows, 0 and 0.
        // (What the mutation did: the highest sequence taken over every row, -1 while that is
        // the only one, and the stats failed as a negative sequence; review of stop 70, SA19.)
        let stats = store
            .log_stats()
            .await
            .unwrap_or_else(|e| panic!("the stats of rows below one only, to {seq}: {e}"));
        assert_eq!(
            (stats.rows, stats.min_sequence, stats.max_sequence),
            (0, Sequence::ZERO, Sequence::ZERO)
        );
    }
    for _ in 0..3 {
        store.record(human(&a), T0).await.expect("record");
    }

    let page = store
        .changes_since(&a, Sequence::ZERO, 10)
        .await
        .expect("the session's page");
    assert_eq!(seqs(&page.events), [1, 2, 3]);
    assert!(!page.history_gap, "{page:?}");
    let stats = store.log_stats().await.expect("the log's stats");
    assert_eq!(
        (stats.rows, stats.min_sequence, stats.max_sequence),
        (3, Sequence(1), Sequence(3))
    );
    let log = store.events_after(Sequence::ZERO, 10).await.expect("log");
    assert_eq!(seqs(&log), [1, 2, 3]);
    assert_eq!(
        store.events_numbered_below_one().await.expect("probe"),
        Some(EventsBelowOne {
            rows: 2,
            lowest: -1
        })
    );

    let report = store
        .prune(&RetentionPolicy::default(), T0)
        .await
        .expect("a pruning pass");
    assert_eq!(report.events_by_age, 2, "{report:?}");
    assert_eq!(
        store.events_numbered_below_one().await.expect("probe"),
        None
    );
    let log = store.events_after(Sequence::ZERO, 10).await.expect("log");
    assert_eq!(seqs(&log), [1, 2, 3]);
    store.close().await;
}

/// A head row whose pruned watermark another writer left negative (a hand edit) cannot be read,
/// as one whose version is: the next recording on its session writes it again, its watermark
/// just below the new event, so that reads report the history gap (decision 0020). Only a
/// negative version was tested (the testkit damages that), and the recording's check of the
/// watermark could be dropped, leaving the head unreadable for good (review, stop 58).
#[tokio::test]
async fn a_recording_over_a_head_whose_watermark_is_negative_writes_it_again() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (store, session) = one_event_then_behind_the_back(
        &dir,
        "UPDATE session_state_heads SET pruned_max_sequence = -1",
    )
    .await;
    assert!(
        store.heads(std::slice::from_ref(&session)).await.is_err(),
        "the damaged head cannot be read"
    );
    let second = store
        .record(human(&session), T0.plus_ms(1))
        .await
        .expect("record over it")
        .event
        .sequence;
    let heads = store
        .heads(std::slice::from_ref(&session))
        .await
        .expect("the head is readable again");
    assert_eq!(heads[0].last_sequence, second);
    assert_eq!(heads[0].pruned_max_sequence, Sequence(second.get() - 1));
    let page = store
        .changes_since(&session, Sequence::ZERO, 200)
        .await
        .expect("its page");
    assert!(page.history_gap, "{page:?}");
}

/// A head row another writer left at sequence 0 (no event of its own) is readable, and the next
/// recording on its session keeps its watermark, 0: its history is whole, and its page reports
/// no gap. Only a negative sequence is a head this store cannot read (decision 0020). (What the
/// mutation did: a head at 0 was taken for an unreadable one, and the recording set its
/// watermark just below the new event, a history gap nobody made; review of stop 70, SA15.)
#[tokio::test]
async fn a_recording_over_a_head_at_sequence_zero_reports_no_gap() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("state.sqlite");
    let store = SqliteStore::open(&path).await.expect("open");
    let other = SessionRef::parse("agent:main:subagent:b", "main").expect("ref");
    store.record(human(&other), T0).await.expect("record");
    let session = SessionRef::parse("agent:main:subagent:a", "main").expect("ref");
    behind_the_back(
        &path,
        "INSERT INTO session_state_heads (session_key, agent_id, last_sequence, \
         pruned_max_sequence, updated_at) VALUES ('agent:main:subagent:a', 'main', 0, 0, $1)",
        &[T0.millis()],
    )
    .await;
    let second = store
        .record(human(&session), T0.plus_ms(1))
        .await
        .expect("record")
        .event
        .sequence;
    assert_eq!(second, Sequence(2));
    let heads = store
        .heads(std::slice::from_ref(&session))
        .await
        .expect("heads");
    assert_eq!(heads[0].last_sequence, second);
    assert_eq!(heads[0].pruned_max_sequence, Sequence::ZERO, "{heads:?}");
    let page = store
        .changes_since(&session, Sequence::ZERO, 200)
        .await
        .expect("its page");
    assert!(!page.history_gap, "{page:?}");
    assert_eq!(seqs(&page.events), [2]);
    store.close().await;
}

/// An event row whose payload_json another writer left empty (with no stored fields, as
/// OpenClaw's writer leaves a row) is read without a payload, as OpenClaw reads an empty
/// optional text, and quietly: nothing is warned at each read of it. (What the mutation did: the
/// empty text was parsed as JSON, and every page or log read that reached the row warned that its
/// payload_json "is not a JSON object"; review of stop 67, S640.)
#[tokio::test]
async fn an_empty_payload_is_read_as_none_without_a_warning() {
    let capture = awareness_core::testkit::logs::Capture::warnings();
    let dir = tempfile::tempdir().expect("a temp dir");
    let (store, session) = one_event_then_behind_the_back(
        &dir,
        "UPDATE session_state_events SET payload_json = '', fields_json = NULL",
    )
    .await;
    let path = dir.path().join("state.sqlite");
    let page = store
        .changes_since(&session, Sequence::ZERO, 200)
        .await
        .expect("its page");
    assert_eq!(page.events.len(), 1, "{page:?}");
    assert!(page.events[0].payload.is_none(), "{page:?}");
    let log = store
        .events_after(Sequence::ZERO, 200)
        .await
        .expect("the log");
    assert!(log[0].payload.is_none(), "{log:?}");
    let named = path.display().to_string();
    assert_eq!(
        capture.said(&["payload_json", &named]),
        0,
        "{:?}",
        capture.lines()
    );
    store.close().await;
}

/// A page of one event reads one more (to tell whether more follow): a row that cannot be read
/// in either place, the page's own first row (more of the ref's events following) or the one
/// past its end, fails the page as any other, and the error names it, the rows read again one
/// at a time being the page's, lowest first, and the one past its end. (What the mutations did:
/// the rows read again up to the page's limit alone, review of stop 63, Q01; or highest first,
/// the ref's last events, which read, review of stop 66, S532: each time the error was the
/// page's, naming no row.) A page from past a row that cannot be read, whose own rows hold
/// another, names the one on the page. (What the mutation did: the rows read again began at
/// the page's `after` itself, and the error named event 1, which the page does not hold;
/// review of stop 70, SA18.)
#[tokio::test]
async fn an_unreadable_event_in_or_just_past_a_pages_limit_is_named() {
    for (torn, after, limit, named) in [(&[3][..], 0, 1, 3), (&[1], 0, 1, 1), (&[1, 5], 1, 10, 5)] {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("state.sqlite");
        let (store, a, _) = five_events(&path).await;
        for &torn in torn {
            behind_the_back(
                &path,
                "UPDATE session_state_events SET fields_json = '[torn' WHERE sequence = $1",
                &[torn],
            )
            .await;
        }
        let err = store
            .changes_since(&a, Sequence(after), limit)
            .await
            .expect_err("the page reads a torn row");
        names_the_row(&err, &path, named, a.session_key.as_str());
        store.close().await;
    }
}

/// A listing of one agent's heads, one of whose head rows holds a key that is not UTF-8 (so that
/// the rows are read again one at a time), lists that agent's readable heads only, not another
/// agent's. (What the mutation did: the rows read again one at a time were every agent's, and the
/// listing of agent `main` held agent `zed`'s head; review of stop 66, S535.)
#[tokio::test]
async fn one_agents_heads_listed_past_a_key_that_is_not_utf8_are_that_agents() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.sqlite");
    let (store, a, _) = five_events(&path).await;
    let other = SessionRef::parse("agent:main:subagent:z", "zed").expect("ref");
    store.record(human(&other), T0).await.expect("record");
    behind_the_back(
        &path,
        "UPDATE session_state_heads SET session_key = session_key || CAST(X'FF' AS TEXT)
           WHERE session_key = 'agent:main:subagent:b'",
        &[],
    )
    .await;
    let main = awareness_core::AgentId::new("main").expect("agent");
    let heads = store.list_heads(Some(&main)).await.expect("heads");
    let listed: Vec<SessionRef> = heads.into_iter().map(|h| h.session).collect();
    assert_eq!(listed, [a], "agent main's readable heads only");
    store.close().await;
}

/// A cursor row whose target key holds a byte that is not UTF-8 (another writer's row) is
/// left out of every listing and reported unreadable as "text that is not UTF-8", not listed
/// as a cursor on a target whose key holds U+FFFD (a session nobody records to). (What the
/// mutation did: the target key was not among the texts looked at for U+FFFD, and the
/// listing held the cursor on `agent:main:subagent:a\u{FFFD}`; review of stop 68, S807.)
#[tokio::test]
async fn a_cursor_whose_target_key_is_not_utf8_is_left_out_of_listings() {
    use awareness_core::CursorFilter;
    // The target key, then the provenance (past the CHECK). (What the mutation did: the
    // provenance was not among the texts looked at for U+FFFD, and the reason named a
    // provenance "explicit\u{FFFD}" this version does not know, which points an operator at a
    // newer version; review of stop 70, SA32.)
    for spoil in [
        "UPDATE session_watch_cursors SET target_session_key = target_session_key || CAST(X'FF' AS TEXT)
           WHERE target_session_key = 'agent:main:subagent:a'",
        "PRAGMA ignore_check_constraints = ON;
         UPDATE session_watch_cursors SET provenance = provenance || CAST(X'FF' AS TEXT)
           WHERE target_session_key = 'agent:main:subagent:a'",
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("state.sqlite");
        let (store, a, b) = five_events(&path).await;
        let manager = WatcherKey::parse("agent:main:main").expect("watcher");
        for target in [&a, &b] {
            store.watch(&manager, target, T0).await.expect("watch");
        }
        behind_the_back(&path, spoil, &[]).await;
        let listed: Vec<String> = store
            .cursors(&CursorFilter::default())
            .await
            .expect("cursors")
            .into_iter()
            .map(|c| c.target.to_string())
            .collect();
        assert_eq!(
            listed,
            [b.session_key.to_string()],
            "the readable cursor only: {spoil}"
        );
        let unreadable = store
            .unreadable_cursors()
            .await
            .expect("unreadable cursors");
        assert_eq!(unreadable.len(), 1, "{spoil}: {unreadable:?}");
        assert!(
            unreadable[0].reason.contains("not UTF-8"),
            "{spoil}: {unreadable:?}"
        );
        store.close().await;
    }
}

/// A link row whose `upstream_ref_json` another writer left not JSON is unreadable as a whole,
/// as one whose marker is not JSON: reading it fails as corrupt, and the listing leaves it out,
/// instead of giving it as a link with no upstream reference (a transcript no adapter can find
/// again); the listing says so, naming the store's file, so that an operator learns of the
/// row. (What the mutations did: a reference that was not JSON was read as none, S813; such a
/// row was dropped before the listing could log it, and left out without a word, S846; review
/// of stop 68.)
#[tokio::test]
async fn a_link_whose_upstream_ref_is_not_json_is_unreadable() {
    use awareness_core::{LinkSpec, UpstreamStore as _};
    let capture = awareness_core::testkit::logs::Capture::default();
    let _guard = capture.install();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.sqlite");
    let (store, a, b) = five_events(&path).await;
    for (session, thread) in [(&a, "ta"), (&b, "tb")] {
        let spec = LinkSpec::new(
            session.clone(),
            "claude-code",
            "local",
            thread,
            "local-jsonl",
        )
        .with_ref(serde_json::json!({"path": format!("/p/{thread}.jsonl")}));
        store.upsert_link(spec, T0).await.expect("adopt");
    }
    behind_the_back(
        &path,
        "UPDATE session_upstream_links SET upstream_ref_json = '{torn'
           WHERE session_key = 'agent:main:subagent:a'",
        &[],
    )
    .await;
    let read = store.link(&a).await;
    assert!(matches!(read, Err(StoreError::Corrupt { .. })), "{read:?}");
    let listed: Vec<SessionRef> = store
        .links()
        .await
        .expect("links")
        .into_iter()
        .map(|l| l.session)
        .collect();
    assert_eq!(listed, [b], "the readable link only");
    let lines: Vec<String> = capture
        .lines()
        .into_iter()
        .filter(|l| l.contains("ignoring an upstream link that cannot be read"))
        .collect();
    assert_eq!(lines.len(), 1, "{:?}", capture.lines());
    assert!(lines[0].contains(&path.display().to_string()), "{lines:?}");
    store.close().await;
}
