//! Replays every recorded OpenClaw scenario (`shared/fixtures/openclaw-2026.9.6/scenarios/`)
//! through the adapter, on every backend, and compares each answer with OpenClaw's.
//!
//! A script dropped into that folder is picked up without code changes. Deliberate differences
//! from OpenClaw (DESIGN.md) are listed in [`normalize_expected`] with their reasons.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use awareness_core::{
    ActorType, AgentId, AwarenessStore, AwarenessStoreExt, Cursor, CursorFilter, EventKind, Head,
    NewEvent, Sequence, SessionKey, SessionRef, Timestamp, WatcherKey, protocol, validate,
};
use awareness_e2e::{backends, openclaw_fixture_dir};
use gateway_adapter::{
    Awareness, Clock, Compaction, HumanMessage, InMemoryDirectory, InMemoryQueue, ManualClock,
    RecordingWake, RunOutcome, SessionEntry, SystemEventQueue,
};
use serde_json::{Value, json};

const START: Timestamp = Timestamp(1_800_000_000_000);

struct Replayer {
    store: Arc<dyn AwarenessStore>,
    clock: Arc<ManualClock>,
    dir: Arc<InMemoryDirectory>,
    queue: Arc<InMemoryQueue>,
    svc: Awareness,
    last_prune: Option<Timestamp>,
}

fn key(v: &Value) -> SessionKey {
    SessionKey::new(v.as_str().expect("a session key string")).expect("valid key")
}
fn opt_str(v: &Value, field: &str) -> Option<String> {
    v.get(field).and_then(Value::as_str).map(str::to_owned)
}
fn agent(v: &Value, field: &str) -> Option<AgentId> {
    opt_str(v, field).map(|a| AgentId::new(a).expect("agent id"))
}

fn entry(v: Option<&Value>) -> Option<SessionEntry> {
    let v = v?;
    Some(SessionEntry {
        spawned_by: v.get("spawnedBy").map(key),
        parent_session_key: v.get("parentSessionKey").map(key),
        session_id: opt_str(v, "sessionId"),
    })
}

fn cursor_row(c: &Cursor) -> Value {
    json!({
        "watcher_session_key": c.watcher.as_str(),
        "target_session_key": c.target.as_str(),
        "last_seen_sequence": c.last_seen.get(),
        "notified_sequence": c.notified.get(),
        "material_sequence": c.material.get(),
        "provenance": c.provenance.as_str(),
        "updated_at": c.updated_at.millis(),
    })
}

fn head_row(h: &Head) -> Value {
    json!({
        "session_key": h.session.session_key.as_str(),
        "agent_id": h.session.agent_id.as_str(),
        "last_sequence": h.last_sequence.get(),
        "pruned_max_sequence": h.pruned_max_sequence.get(),
        "updated_at": h.updated_at.millis(),
    })
}

/// OpenClaw's answers, adjusted where DESIGN.md decides differently on purpose:
/// `watcher_store_path` is an OpenClaw-only cursor column (the fixtures README says to compare
/// it only where a store keeps it). Our cursor model does not hold it: the memory and redb
/// stores do not store it, and store-sqlite keeps the value of rows OpenClaw wrote but gives its
/// own new rows the column's default (NULL), where OpenClaw writes the watcher agent's store
/// path. So it is compared on no backend. `provenance` is compared on every backend (each
/// cursor of the scenario is a spawn's or a watch's: `explicit`).
fn normalize_expected(mut v: Value) -> Value {
    fn strip(row: &mut Value) {
        if let Some(o) = row.as_object_mut() {
            // `shift_remove` keeps the other columns in OpenClaw's order (`remove` would move
            // the last one into the gap).
            o.shift_remove("watcher_store_path");
        }
    }
    match &mut v {
        Value::Array(rows) => rows.iter_mut().for_each(strip),
        Value::Object(_) => strip(&mut v),
        _ => {}
    }
    v
}

impl Replayer {
    fn new(store: Arc<dyn AwarenessStore>) -> Self {
        let clock = Arc::new(ManualClock::new(START));
        let dir = Arc::new(InMemoryDirectory::new());
        let queue = Arc::new(InMemoryQueue::new());
        let svc = Self::service(&store, &clock, &dir, &queue);
        Self {
            store,
            clock,
            dir,
            queue,
            svc,
            last_prune: None,
        }
    }

    fn service(
        store: &Arc<dyn AwarenessStore>,
        clock: &Arc<ManualClock>,
        dir: &Arc<InMemoryDirectory>,
        queue: &Arc<InMemoryQueue>,
    ) -> Awareness {
        Awareness::builder(
            Arc::clone(store),
            queue.clone(),
            Arc::new(RecordingWake::new()),
            dir.clone(),
        )
        .clock(clock.clone())
        .build()
    }

    /// OpenClaw prunes on the first recording of a process and again on a recording once more
    /// than an hour passed since the last prune (after the recording itself).
    async fn after_recording(&mut self) {
        let now = self.clock.now();
        if self
            .last_prune
            .is_none_or(|t| now.millis() > t.millis() + Timestamp::HOUR_MS)
        {
            self.svc.prune().await;
            self.last_prune = Some(now);
        }
    }

    fn new_event(input: &Value) -> NewEvent {
        let r = SessionRef::new(
            key(&input["sessionKey"]),
            agent(input, "agentId").expect("agentId"),
        );
        let kind = EventKind::parse(input["kind"].as_str().expect("kind")).expect("kind");
        let actor =
            ActorType::parse(input["actorType"].as_str().expect("actorType")).expect("actorType");
        let mut e = NewEvent::new(r, kind, actor, input["summary"].as_str().expect("summary"));
        e.session_id = opt_str(input, "sessionId");
        e.actor_id = opt_str(input, "actorId");
        e.run_id = opt_str(input, "runId");
        e.dedupe_key = opt_str(input, "dedupeKey");
        e.occurred_at = input
            .get("occurredAt")
            .and_then(Value::as_i64)
            .map(Timestamp);
        e.payload = input
            .get("payload")
            .map(|p| validate::payload_from_value(p.clone()).expect("payload"));
        if let Some(ws) = input.get("watcherSessionKeys").and_then(Value::as_array) {
            e.watchers = ws
                .iter()
                .map(|w| WatcherKey::new(key(w)).expect("watcher"))
                .collect();
        }
        e
    }

    #[allow(clippy::too_many_lines)]
    async fn apply(&mut self, op: &Value) -> Value {
        if let Some(now) = op.get("now").and_then(Value::as_i64) {
            self.clock.set(Timestamp(now));
        }
        let name = op["op"].as_str().expect("op name");
        match name {
            "record" => {
                let got = self.svc.record(Self::new_event(&op["input"])).await;
                self.after_recording().await;
                got.map_or(Value::Null, |r| {
                    serde_json::to_value(&*r.event).expect("json")
                })
            }
            "bulk" => {
                let count = op["count"].as_u64().expect("count");
                let sessions = op["sessions"].as_u64().unwrap_or(1).max(1);
                let mut last = 0;
                let mut recorded = 0;
                for i in 0..count {
                    let mut input = op["input"].clone();
                    let k = input["sessionKey"]
                        .as_str()
                        .expect("sessionKey")
                        .replace("{n}", &(i % sessions).to_string());
                    input["sessionKey"] = json!(k);
                    if let Some(r) = self.svc.record(Self::new_event(&input)).await {
                        recorded += 1;
                        last = r.event.sequence.get();
                    }
                    self.after_recording().await;
                }
                json!({"recorded": recorded, "lastSequence": last})
            }
            "spawn" => {
                self.svc
                    .subagent_spawned(
                        &key(&op["childSessionKey"]),
                        agent(op, "agentId").as_ref(),
                        &key(&op["requesterSessionKey"]),
                        op["childRunId"].as_str().expect("childRunId"),
                    )
                    .await
                    .expect("the spawn is recorded");
                self.after_recording().await;
                Value::Null
            }
            "terminal" => {
                let outcome = RunOutcome::parse(op["outcomeStatus"].as_str().expect("outcome"))
                    .expect("known outcome");
                self.svc
                    .subagent_ended(
                        &key(&op["childSessionKey"]),
                        None,
                        op["runId"].as_str().expect("runId"),
                        outcome,
                    )
                    .await
                    .expect("the run's end is recorded");
                self.after_recording().await;
                Value::Null
            }
            "human" => {
                let mut msg = HumanMessage::new(key(&op["sessionKey"]));
                msg.agent_id = agent(op, "agentId");
                if let Some(a) = op.get("actor") {
                    msg.actor_type = ActorType::parse(a["actorType"].as_str().expect("actorType"))
                        .expect("actor");
                    msg.actor_id = opt_str(a, "actorId");
                }
                msg.channel = opt_str(op, "channel");
                msg.entry = entry(op.get("entry"));
                msg.run_id = opt_str(op, "runId");
                msg.dedupe_key = opt_str(op, "dedupeKey");
                msg.payload = op
                    .get("payload")
                    .map(|p| validate::payload_from_value(p.clone()).expect("payload"));
                msg.occurred_at = op.get("occurredAt").and_then(Value::as_i64).map(Timestamp);
                let got = self.svc.human_message(msg).await;
                if got.is_some() {
                    self.after_recording().await;
                }
                got.map_or(Value::Null, |e| serde_json::to_value(&*e).expect("json"))
            }
            "goal" => {
                let actor = op.get("actor").map_or((ActorType::System, None), |a| {
                    (
                        ActorType::parse(a["type"].as_str().expect("type")).expect("actor"),
                        opt_str(a, "id"),
                    )
                });
                self.svc
                    .goal_changed(
                        &key(&op["sessionKey"]),
                        agent(op, "agentId").as_ref(),
                        op["summary"].as_str().expect("summary"),
                        actor,
                        entry(op.get("entry")),
                    )
                    .await
                    .expect("the goal change is recorded");
                self.after_recording().await;
                Value::Null
            }
            "compacted" => {
                self.svc
                    .compacted(Compaction {
                        session: key(&op["sessionKey"]),
                        agent_id: agent(op, "agentId"),
                        session_id: opt_str(op, "sessionId"),
                        run_id: opt_str(op, "runId"),
                        operation_id: opt_str(op, "operationId").expect("operationId"),
                        owner: opt_str(op, "owner"),
                    })
                    .await
                    .expect("the compaction is recorded");
                self.after_recording().await;
                Value::Null
            }
            "watch" => {
                let out = self
                    .svc
                    .watch_after_send(
                        &key(&op["watcherSessionKey"]),
                        &key(&op["targetSessionKey"]),
                        agent(op, "targetAgentId").as_ref(),
                        true,
                    )
                    .await;
                json!(out.watched)
            }
            "since" => {
                let k = key(&op["sessionKey"]);
                let status = self
                    .svc
                    .session_status(
                        &k,
                        &k,
                        agent(op, "agentId").as_ref(),
                        Some(Sequence(
                            op["afterSequence"].as_u64().expect("afterSequence"),
                        )),
                        op.get("limit").and_then(Value::as_u64).map(|l| l as usize),
                    )
                    .await
                    .expect("visible");
                serde_json::to_value(status.state_changes.expect("page")).expect("json")
            }
            "version" => {
                let r = SessionRef::new(
                    key(&op["sessionKey"]),
                    agent(op, "agentId").expect("agentId"),
                );
                json!(self.store.state_version(&r).await.expect("version").get())
            }
            "ack" => {
                let targets: Vec<SessionKey> = op["targetSessionKeys"]
                    .as_array()
                    .expect("targets")
                    .iter()
                    .map(key)
                    .collect();
                self.svc
                    .acknowledge(&key(&op["watcherSessionKey"]), &targets)
                    .await;
                Value::Null
            }
            "sweep" => {
                self.svc.prune().await;
                self.last_prune = Some(self.clock.now());
                self.svc.sweep().await;
                Value::Null
            }
            "reset" => {
                self.svc.on_reset(&key(&op["sessionKey"])).await;
                Value::Null
            }
            "delete" => {
                let r = SessionRef::new(
                    key(&op["sessionKey"]),
                    agent(op, "agentId").expect("agentId"),
                );
                self.svc.on_delete(&r).await;
                Value::Null
            }
            "notices" => {
                let k = key(&op["sessionKey"]);
                let peek = op.get("peek").and_then(Value::as_bool).unwrap_or(false);
                let lines = if peek {
                    self.queue.peek(&k)
                } else {
                    self.svc.take_queued(&k)
                };
                json!(lines.into_iter().map(|e| e.text).collect::<Vec<_>>())
            }
            "entries" => {
                let lines = self.queue.peek(&key(&op["sessionKey"]));
                json!(
                    lines
                        .into_iter()
                        .map(|e| {
                            let target = e
                                .context_key
                                .as_deref()
                                .and_then(|c| protocol::decode_context_key(c).ok())
                                .map(|k| k.as_str().to_owned());
                            json!({"text": e.text, "contextKey": e.context_key, "target": target})
                        })
                        .collect::<Vec<_>>()
                )
            }
            "cursor" => {
                let w = WatcherKey::new(key(&op["watcherSessionKey"])).expect("watcher");
                let c = self
                    .store
                    .cursor(&w, &key(&op["targetSessionKey"]))
                    .await
                    .expect("cursor");
                c.as_ref().map_or(Value::Null, cursor_row)
            }
            "cursors" => {
                let all = self
                    .store
                    .cursors(&CursorFilter::default())
                    .await
                    .expect("cursors");
                json!(all.iter().map(cursor_row).collect::<Vec<_>>())
            }
            "head" => {
                let r = SessionRef::new(
                    key(&op["sessionKey"]),
                    agent(op, "agentId").expect("agentId"),
                );
                let h = self.store.heads(&[r]).await.expect("heads");
                h.first().map_or(Value::Null, head_row)
            }
            "count" => {
                let s = self.store.log_stats().await.expect("stats");
                json!({"rows": s.rows, "minSequence": s.min_sequence.get(), "maxSequence": s.max_sequence.get()})
            }
            "session" => {
                let e = SessionEntry {
                    session_id: opt_str(op, "sessionId"),
                    ..SessionEntry::default()
                };
                self.dir.upsert(key(&op["sessionKey"]), e);
                json!(true)
            }
            "restart" => {
                self.queue = Arc::new(InMemoryQueue::new());
                self.svc = Self::service(&self.store, &self.clock, &self.dir, &self.queue);
                self.last_prune = None;
                Value::Null
            }
            "clock" => json!(self.clock.now().millis()),
            other => panic!("unknown scenario op {other:?}"),
        }
    }
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{}: bad line {l}: {e}", path.display()))
        })
        .collect()
}

fn scenarios() -> Vec<(PathBuf, PathBuf)> {
    let dir = openclaw_fixture_dir().join("scenarios");
    let mut out: Vec<(PathBuf, PathBuf)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "jsonl")
                && !p.to_string_lossy().ends_with(".expected.jsonl")
        })
        .map(|p| {
            let expected = p.with_extension("expected.jsonl");
            (p, expected)
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn every_recorded_scenario_matches_openclaw_on_every_backend() {
    let scripts = scenarios();
    assert!(
        scripts.len() >= 6,
        "the fixture folder holds the recorded scenarios"
    );
    let mut compared = 0;
    let mut steps = 0;
    let mut backends_run = 0;
    for (script, expected) in &scripts {
        let ops = read_jsonl(script);
        let answers = read_jsonl(expected);
        assert_eq!(
            ops.len(),
            answers.len(),
            "{}: one answer per op",
            script.display()
        );
        steps += ops.len();
        let all = backends().await;
        backends_run = all.len();
        for backend in all {
            let mut r = Replayer::new(Arc::clone(&backend.store));
            for (i, (op, answer)) in ops.iter().zip(&answers).enumerate() {
                assert_eq!(answer["i"].as_u64(), Some(i as u64 + 1));
                assert_eq!(answer["op"], op["op"], "the answer is to this op");
                let got = r.apply(op).await;
                let want = normalize_expected(answer["result"].clone());
                // As text, so that fields out of OpenClaw's order fail too (JSON values
                // compare objects without regard to order; serde_json keeps it).
                assert_eq!(
                    got.to_string(),
                    want.to_string(),
                    "{} on {}: op {} {}",
                    script.file_name().unwrap_or_default().to_string_lossy(),
                    backend.name,
                    i + 1,
                    op
                );
                compared += 1;
            }
        }
    }
    assert_eq!(backends_run, 4, "memory, sqlite, redb and postgres");
    assert!(steps > 100, "{steps} recorded steps");
    assert_eq!(
        compared,
        steps * backends_run,
        "every step on every backend"
    );
}

/// The operations that produced OpenClaw's fixture database, replayed through the adapter on
/// every backend, give exactly the reads recorded in its `expected.json`.
#[tokio::test]
async fn fixture_operations_reproduce_openclaw_reads_on_every_backend() {
    let dir = openclaw_fixture_dir();
    let ops = read_jsonl(&dir.join("operations.jsonl"));
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("expected.json")).expect("expected.json"),
    )
    .expect("json");
    let reads = expected["reads"].as_array().expect("reads");
    assert_eq!(reads.len(), 7, "the fixture's seven reads");
    let openclaw_heads = fixture_heads().await;
    for backend in backends().await {
        let mut r = Replayer::new(Arc::clone(&backend.store));
        let mut answers = Vec::new();
        for op in &ops {
            let got = r.apply(op).await;
            if let Some(read @ ("version" | "since" | "cursors" | "head")) = op["op"].as_str() {
                answers.push((read, got));
            }
        }
        assert_eq!(answers.len(), reads.len());
        for ((op, got), read) in answers.iter().zip(reads) {
            assert_eq!(
                read["query"]["op"], *op,
                "{}: the reads pair up in order",
                backend.name
            );
            assert_eq!(
                got.to_string(),
                normalize_expected(read["result"].clone()).to_string(),
                "{}: {}",
                backend.name,
                read["query"]
            );
        }
        // Every head, clock included, is the one OpenClaw left in its file: a head whose
        // watermark pruning raised carries the pruning's time.
        assert_eq!(
            backend.store.list_heads(None).await.expect("heads"),
            openclaw_heads,
            "{}: the heads OpenClaw's file holds",
            backend.name
        );
    }
}

/// The heads of OpenClaw's fixture database, read from a copy opened read-only.
async fn fixture_heads() -> Vec<awareness_core::Head> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let copy = dir.path().join("state.sqlite");
    std::fs::copy(openclaw_fixture_dir().join("state.sqlite"), &copy).expect("copy the fixture");
    let store = gateway_adapter::open_store_with(
        &format!("sqlite://{}", copy.display()),
        gateway_adapter::OpenOptions {
            read_only: true,
            create_if_missing: false,
            ..gateway_adapter::OpenOptions::default()
        },
    )
    .await
    .expect("open the fixture's copy read-only");
    let heads = store.list_heads(None).await.expect("the fixture's heads");
    store.close().await;
    assert_eq!(heads.len(), 4, "the fixture holds four heads");
    heads
}
