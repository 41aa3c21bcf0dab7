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
