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
