//! Rows another writer of the schema left (a hand edit, a tool, a later version) are read as
//! store-sqlite reads OpenClaw's (decision 0013; decision 0001 for a cursor's target agent):
//! written here with SQL, past the store.

mod server;

use awareness_core::{CursorStore as _, EventStore as _, Sequence, SessionKey, WatcherKey};
use serde_json::{Value, json};

/// Events whose ids are empty text read with those ids absent, and a payload that is empty or
/// not a JSON object reads as none, as store-sqlite reads OpenClaw's rows. (Empty ids read as
/// given, `Some("")`, passed every test: review of stop 60.)
#[tokio::test]
async fn events_with_empty_ids_or_a_payload_that_is_no_object_read_as_openclaw_reads_them() {
    let (store, _schema) = server::fresh_store().await;
    let payloads = [
        Some(""),
        Some("null"),
        Some("[1,2]"),
        Some("not json"),
        Some("{\"turns\":2}"),
        None,
    ];
    for (i, payload) in payloads.iter().enumerate() {
        sqlx::query(
            "INSERT INTO session_state_events (sequence, session_key, session_id, agent_id, \
             kind, actor_type, actor_id, run_id, occurred_at, summary, payload_json) \
             VALUES ($1, 'agent:main:subagent:foreign', '', 'main', 'human_direct_message', \
             'human', '', '', 1800000000000, 'human message via telegram', $2)",
        )
        .bind(1001 + i64::try_from(i).expect("few"))
        .bind(*payload)
        .execute(store.pool())
        .await
        .expect("insert a row");
    }
    let read = store
        .events_after(Sequence(1000), 100)
        .await
        .expect("the rows are read");
    let expected: Vec<Value> = (0..payloads.len())
        .map(|i| {
            let mut e = json!({
                "sequence": 1001 + i,
                "sessionKey": "agent:main:subagent:foreign",
                "agentId": "main",
                "kind": "human_direct_message",
                "actorType": "human",
                "occurredAt": 1_800_000_000_000_i64,
                "summary": "human message via telegram",
            });
            if i == 4 {
                e["payload"] = json!({"turns": 2});
            }
            e
        })
        .collect();
    assert_eq!(
        serde_json::to_value(&read).expect("json"),
        Value::Array(expected)
    );
}

/// A cursor row without a target agent is on the agent its target's key names (or the
/// watcher's, for a bare key), as store-sqlite reads an OpenClaw row (decision 0001). (`main`
/// whatever the key, passed every test: review of stop 60.)
#[tokio::test]
async fn a_cursor_row_without_a_target_agent_is_on_the_agent_its_key_names() {
    let (store, _schema) = server::fresh_store().await;
    let watcher = WatcherKey::parse("agent:ops:main").expect("watcher");
    for (target, agent) in [("agent:qa:subagent:x", "qa"), ("global", "ops")] {
        sqlx::query(
            "INSERT INTO session_watch_cursors (watcher_session_key, target_session_key, \
             updated_at) VALUES ($1, $2, 1800000000000)",
        )
        .bind(watcher.as_str())
        .bind(target)
        .execute(store.pool())
        .await
        .expect("insert a row");
        let cursor = store
            .cursor(&watcher, &SessionKey::new(target).expect("key"))
            .await
            .expect("read")
            .expect("the row");
        assert_eq!(cursor.target_agent.as_str(), agent, "{target}");
    }
}

/// An event row whose dedupe key is empty text reads with that key as stored, `Some("")`, as
/// store-sqlite reads such a row (only the ids and the payload read empty as absent).
/// (What the mutation did: read an empty dedupe key as none; review of stop 66, P441.)
#[tokio::test]
async fn an_event_row_with_an_empty_dedupe_key_reads_with_it() {
    let (store, _schema) = server::fresh_store().await;
    sqlx::query(
        "INSERT INTO session_state_events (sequence, dedupe_key, session_key, agent_id, kind, \
         actor_type, occurred_at, summary) VALUES (1001, '', 'agent:main:subagent:foreign', \
         'main', 'human_direct_message', 'human', 1800000000000, 'human message via telegram')",
    )
    .execute(store.pool())
    .await
    .expect("insert a row");
    let read = store
        .events_after(Sequence(1000), 10)
        .await
        .expect("the row is read");
    assert_eq!(read.len(), 1);
    assert_eq!(
        read[0].dedupe_key.as_deref(),
        Some(""),
        "the dedupe key as the row holds it"
    );
}

/// Inserts, past the store, an event row of `agent:main:subagent:foreign` numbered `sequence`.
async fn insert_event_row(store: &store_postgres::PgStore, sequence: i64) {
    sqlx::query(
        "INSERT INTO session_state_events (sequence, session_key, agent_id, kind, actor_type, \
         occurred_at, summary) VALUES ($1, 'agent:main:subagent:foreign', 'main', \
         'human_direct_message', 'human', 1800000000000, 'human message via telegram')",
    )
    .bind(sequence)
    .execute(store.pool())
    .await
    .expect("insert a row");
}

/// The log's size and range leave out a row numbered below 1 (which no recording makes and no
/// read returns), as store-sqlite's do: such a row does not fail `log_stats` (decision 0016).
/// (What the mutation did: took the range's lower end over every row, 0 and below included,
/// and failed as `Corrupt`; review of stop 66, P420. The row was counted until then, where
/// store-sqlite left it out.)
#[tokio::test]
async fn the_logs_range_leaves_out_a_row_numbered_below_one() {
    let (store, _schema) = server::fresh_store().await;
    insert_event_row(&store, 1001).await;
    insert_event_row(&store, -1).await;
    let stats = store
        .log_stats()
        .await
        .expect("a row numbered below 1 does not fail log_stats");
    assert_eq!(
        (stats.rows, stats.min_sequence, stats.max_sequence),
        (1, Sequence(1001), Sequence(1001))
    );
}

/// A page of changes reads past a row of its session numbered below 1, which no page reaches:
/// its earliest available event is the smallest numbered one.
/// (What the mutation did: took the earliest over every row of the session, 0 and below
/// included; review of stop 66, P435.)
#[tokio::test]
async fn a_page_of_changes_reads_past_a_row_numbered_below_one() {
    let (store, _schema) = server::fresh_store().await;
    insert_event_row(&store, 1001).await;
    insert_event_row(&store, -1).await;
    let session =
        awareness_core::SessionRef::parse("agent:main:subagent:foreign", "main").expect("ref");
    let page = store
        .changes_since(&session, Sequence(0), 10)
        .await
        .expect("a row numbered below 1 is reached by no page");
    assert_eq!(page.earliest_available_sequence, Sequence(1001));
    assert_eq!(page.events.len(), 1);
}

/// A column another writer left NULL where the store's rows always hold a value (a table such a
/// writer made, whose column allows it) makes the row one this store cannot read: a cursor row
/// so is written over by a watch, as a row of any other unreadable kind is.
/// (What the mutation did: took a column that cannot be read as a backend error, not as an
/// unreadable row, so that the watch failed; review of stop 70, P839.)
#[tokio::test]
async fn a_cursor_row_with_a_null_time_is_written_over_by_a_watch() {
    let (store, _schema) = server::fresh_store().await;
    let watcher = WatcherKey::parse("agent:ops:main").expect("watcher");
    let target = awareness_core::SessionRef::parse("agent:main:subagent:x", "main").expect("ref");
    for sql in [
        "ALTER TABLE session_watch_cursors ALTER COLUMN updated_at DROP NOT NULL",
        "INSERT INTO session_watch_cursors (watcher_session_key, target_session_key) \
         VALUES ('agent:ops:main', 'agent:main:subagent:x')",
    ] {
        sqlx::query(sql)
            .execute(store.pool())
            .await
            .expect("another writer's table and row");
    }
    let now = awareness_core::Timestamp(1_800_000_000_000);
    let cursor = store
        .watch(&watcher, &target, now)
        .await
        .expect("the watch writes over the row");
    assert_eq!(cursor.updated_at, now);
}

/// An event row whose payload is empty text reads without a payload, quietly, as an empty
/// optional text is absent: no warning that it is not a JSON object, at each read of it.
/// (What the mutation did: parsed the empty text as JSON, so that every read of the row warned;
/// review of stop 72, PQ29.)
#[tokio::test]
async fn an_event_row_with_an_empty_payload_reads_without_it_quietly() {
    let logs = awareness_core::testkit::logs::Capture::warnings();
    let (store, schema) = server::fresh_store().await;
    insert_event_row(&store, 1001).await;
    sqlx::query("UPDATE session_state_events SET payload_json = '' WHERE sequence = 1001")
        .execute(store.pool())
        .await
        .expect("an empty payload");
    let read = store
        .events_after(Sequence(1000), 10)
        .await
        .expect("the row is read");
    assert_eq!(read.len(), 1);
    assert!(read[0].payload.is_none(), "{read:?}");
    assert_eq!(
        logs.said(&[schema.name(), "payload_json"]),
        0,
        "{:?}",
        logs.lines()
    );
}

/// A recording on a target no cursor watches reads no cursor row, and warns of none that it
/// cannot read: the row its read returns for no cursor (all NULL) is no row of the table.
/// (What the mutation did: read the row of no cursor as a cursor row, which could not be read,
/// so that every recording on an unwatched target warned of one; review of stop 72, PQ33.)
#[tokio::test]
async fn a_recording_on_an_unwatched_target_warns_of_no_cursor_row() {
    let logs = awareness_core::testkit::logs::Capture::warnings();
    let (store, schema) = server::fresh_store().await;
    let event = awareness_core::NewEvent::new(
        awareness_core::SessionRef::parse("agent:main:subagent:x", "main").expect("ref"),
        awareness_core::EventKind::HumanDirectMessage,
        awareness_core::ActorType::Human,
        "human message via test",
    );
    let recorded = store
        .record(event, awareness_core::Timestamp(1_800_000_000_000))
        .await
        .expect("record");
    assert!(recorded.notices.is_empty());
    assert_eq!(
        logs.said(&["cursor row", schema.name()]),
        0,
        "{:?}",
        logs.lines()
    );
}

/// A head row this store cannot read (a negative last sequence) is left out of the listing of
/// heads with a warning naming it, so that an operator learns why a session is missing.
/// (What the mutation did: left the row out without a word; review of stop 72, PQ34.)
#[tokio::test]
async fn an_unreadable_head_row_is_left_out_of_the_listing_with_a_warning() {
    let logs = awareness_core::testkit::logs::Capture::warnings();
    let (store, schema) = server::fresh_store().await;
    sqlx::query(
        "INSERT INTO session_state_heads (session_key, agent_id, last_sequence, \
         pruned_max_sequence, updated_at) VALUES ('agent:main:subagent:foreign', 'main', -1, 0, \
         1800000000000)",
    )
    .execute(store.pool())
    .await
    .expect("insert a row");
    let heads = store.list_heads(None).await.expect("the listing");
    assert!(heads.is_empty(), "{heads:?}");
    assert_eq!(
        logs.said(&[
            "a head row this store cannot read is left out",
            schema.name(),
            "negative sequence -1",
        ]),
        1,
        "{:?}",
        logs.lines()
    );
}

/// Inserts, past the store, a link row of `agent:main:subagent:foreign` whose marker text is
/// `marker` and whose last scan was at `scanned`.
async fn insert_link_row(store: &store_postgres::PgStore, marker: &str, scanned: i64) {
    sqlx::query(
        "INSERT INTO session_upstream_links (session_key, agent_id, catalog_id, host_id, \
         thread_id, upstream_kind, last_marker_json, last_scanned_at, created_at, updated_at) \
         VALUES ('agent:main:subagent:foreign', 'main', 'cat', 'host', 'thread', 'kind', $1, $2, \
         1800000000000, 1800000000000)",
    )
    .bind(marker)
    .bind(scanned)
    .execute(store.pool())
    .await
    .expect("insert a row");
}

/// A link row's last scan reads as stored, the first millisecond of the epoch included: only a
/// NULL is a link never scanned. (What the mutation did: read a scan at 0 as none; review of
/// stop 72, PQ35.)
#[tokio::test]
async fn a_link_scanned_at_zero_reads_with_that_scan() {
    use awareness_core::upstream::UpstreamStore as _;
    let (store, _schema) = server::fresh_store().await;
    insert_link_row(&store, "{\"at\":1}", 0).await;
    let session =
        awareness_core::SessionRef::parse("agent:main:subagent:foreign", "main").expect("ref");
    let link = store
        .link(&session)
        .await
        .expect("the row is read")
        .expect("the link");
    assert_eq!(link.last_scanned_at, Some(awareness_core::Timestamp(0)));
}

/// An adoption over a link row this store cannot read (its marker not JSON) writes over it with
/// a warning naming the row, so that an operator learns the row's old contents are gone.
/// (What the mutation did: wrote over it without a word; review of stop 72, PQ44.)
#[tokio::test]
async fn an_adoption_over_an_unreadable_link_row_warns_of_it() {
    use awareness_core::upstream::UpstreamStore as _;
    let logs = awareness_core::testkit::logs::Capture::warnings();
    let (store, schema) = server::fresh_store().await;
    insert_link_row(&store, "{not json", 1_800_000_000_000).await;
    let session =
        awareness_core::SessionRef::parse("agent:main:subagent:foreign", "main").expect("ref");
    let spec =
        awareness_core::upstream::LinkSpec::new(session.clone(), "cat", "host", "t2", "kind");
    store
        .upsert_link(spec, awareness_core::Timestamp(1_800_000_000_001))
        .await
        .expect("the adoption writes over the row");
    assert_eq!(
        logs.said(&[
            "written over by a new adoption",
            schema.name(),
            "last_marker_json is not JSON",
        ]),
        1,
        "{:?}",
        logs.lines()
    );
}
