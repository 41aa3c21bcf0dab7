//! The `awareness` binary as a user runs it: the demo, the operator commands on a fresh file and
//! on a copy of OpenClaw's own state database, and its errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The binary, with its log at the default level whatever the environment says.
fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_awareness"));
    c.env_remove("AWARENESS_LOG");
    c
}

fn run_in(dir: &Path, args: &[&str]) -> Output {
    bin()
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run awareness")
}

/// `awareness --store STORE ARGS...` in `dir`.
fn run_on(dir: &Path, store: &str, args: &[&str]) -> Output {
    run_in(dir, &[&["--store", store][..], args].concat())
}

/// [`run_on`], which must succeed.
fn run_ok(dir: &Path, store: &str, args: &[&str]) -> Output {
    let o = run_on(dir, store, args);
    assert!(o.status.success(), "{store} {args:?}: {}", stderr(&o));
    o
}

/// Runs one SQL statement on the SQLite store at `url` behind the CLI's back, as a bad tool
/// or a hand edit would.
fn edit_by_hand(url: &str, statement: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use sqlx::Connection as _;
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned()))
            .execute(&mut c)
            .await
            .unwrap();
        c.close().await.unwrap();
    });
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
/// A usage error: exit code 2 and one line on stderr; `what` names the case.
fn assert_usage(o: &Output, what: &str) {
    assert_eq!(o.status.code(), Some(2), "{what}: {}", stderr(o));
    assert_eq!(stderr(o).lines().count(), 1, "{what}: {}", stderr(o));
}
fn json(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        stderr(o)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)))
}

fn fixture_dir() -> PathBuf {
    let shared = std::env::var("AWARENESS_SHARED_DIR").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
        PathBuf::from,
    );
    shared.join("fixtures/openclaw-2026.9.6")
}

/// A writable copy of OpenClaw's database (the fixture itself is never opened).
fn fixture_copy(dir: &Path) -> String {
    let dst = dir.join("state.sqlite");
    std::fs::copy(fixture_dir().join("state.sqlite"), &dst).expect("copy the fixture");
    let mut perms = std::fs::metadata(&dst).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&dst, perms).unwrap();
    format!("sqlite://{}", dst.display())
}

#[test]
fn demo_runs_and_leaves_the_database_behind() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_in(dir.path(), &["demo"]);
    assert!(o.status.success(), "demo failed: {}", stderr(&o));
    let text = stdout(&o);
    for needle in [
        "the manager's queue holds 1 line:",
        "the manager was woken 1 time(s)",
        "exactly 1 follow-up line:",
        "sweep re-delivered 1 notice(s)",
        "child run timed out",
        "watched: true",
        "another writer committed: yes",
        "its pick-up queues 1 line(s) for the manager and asks to wake it:",
        "\"stateVersion\"",
        "the database is left at",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(
        dir.path().join("awareness.db").exists(),
        "the demo leaves ./awareness.db"
    );
    // The file it left is consistent and inspectable.
    let doctor = run_in(dir.path(), &["doctor"]);
    assert!(
        doctor.status.success(),
        "{}{}",
        stdout(&doctor),
        stderr(&doctor)
    );
    let list = json(&run_in(dir.path(), &["--json", "list"]));
    assert_eq!(
        list.as_array().unwrap().len(),
        2,
        "research and writer have heads"
    );
    // A second run on the same file does not collide with the first.
    let again = run_in(dir.path(), &["demo"]);
    assert!(again.status.success(), "{}", stderr(&again));
}

/// The demo on the default store names the file it leaves by its absolute path, which finds it
/// from any directory: `awareness.db` in the directory it ran in. (What the mutation did: the
/// path printed as typed, `awareness.db`; review of stop 67, CV38.)
#[test]
fn the_demo_names_its_file_by_its_absolute_path() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_in(dir.path(), &["demo"]);
    assert!(o.status.success(), "demo failed: {}", stderr(&o));
    let path = std::path::absolute(dir.path().join("awareness.db")).unwrap();
    let text = stdout(&o);
    assert!(
        text.contains(&format!("store: {}\n", path.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "the database is left at {} for inspection",
            path.display()
        )),
        "{text}"
    );
}

#[test]
fn status_list_and_cursors_match_openclaw_expected_answers() {
    let dir = tempfile::tempdir().unwrap();
    let store = fixture_copy(dir.path());
    let file = dir.path().join("state.sqlite");
    let before = std::fs::read(&file).unwrap();
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture_dir().join("expected.json")).unwrap(),
    )
    .unwrap();
    let mut checked = 0;
    for read in expected["reads"].as_array().unwrap() {
        let q = &read["query"];
        let want = &read["result"];
        match q["op"].as_str().unwrap() {
            "version" => {
                let key = q["sessionKey"].as_str().unwrap();
                let agent = q["agentId"].as_str().unwrap();
                let got = json(&run_in(
                    dir.path(),
                    &["--store", &store, "--json", "status", key, "--agent", agent],
                ));
                assert_eq!(&got["stateVersion"], want, "{q}");
                assert!(got.get("stateChanges").is_none());
            }
            "since" => {
                let key = q["sessionKey"].as_str().unwrap();
                let agent = q["agentId"].as_str().unwrap();
                let after = q["afterSequence"].to_string();
                let limit = q["limit"].to_string();
                let got = json(&run_in(
                    dir.path(),
                    &[
                        "--store",
                        &store,
                        "--json",
                        "status",
                        key,
                        "--agent",
                        agent,
                        "--changes-since",
                        &after,
                        "--limit",
                        &limit,
                    ],
                ));
                assert_eq!(&got["stateChanges"], want, "{q}");
            }
            "head" => {
                let got = json(&run_in(dir.path(), &["--store", &store, "--json", "list"]));
                let row = got
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|r| r["sessionKey"] == q["sessionKey"] && r["agentId"] == q["agentId"])
                    .expect("listed");
                assert_eq!(
                    row,
                    &serde_json::json!({
                        "sessionKey": want["session_key"],
                        "agentId": want["agent_id"],
                        "stateVersion": want["last_sequence"],
                        "prunedMaxSequence": want["pruned_max_sequence"],
                        "updatedAt": want["updated_at"],
                    }),
                    "{q}"
                );
            }
            "cursors" => {
                let got = json(&run_in(
                    dir.path(),
                    &["--store", &store, "--json", "cursors"],
                ));
                let got = got.as_array().unwrap();
                let want = want.as_array().unwrap();
                assert_eq!(got.len(), want.len());
                for (g, w) in got.iter().zip(want) {
                    // OpenClaw's rows name no target agent: the target key's own agent, else
                    // (a bare key) the watcher's (`Cursor::default_target_agent`).
                    let target = w["target_session_key"].as_str().unwrap();
                    let agent_of = |key: &str| {
                        key.strip_prefix("agent:")
                            .and_then(|rest| rest.split(':').next())
                            .map(str::to_owned)
                    };
                    let watcher = w["watcher_session_key"].as_str().unwrap();
                    let agent = agent_of(target).or_else(|| agent_of(watcher)).unwrap();
                    let mut row = serde_json::json!({
                        "watcher": w["watcher_session_key"],
                        "target": target,
                        "targetAgent": agent,
                        "lastSeen": w["last_seen_sequence"],
                        "notified": w["notified_sequence"],
                        "material": w["material_sequence"],
                        "updatedAt": w["updated_at"],
                        // `Cursor::is_pending`: something not yet seen.
                        "pending": w["material_sequence"].as_u64() > w["last_seen_sequence"].as_u64(),
                    });
                    // The JSON leaves an explicit watch's provenance out.
                    if w["provenance"] != "explicit" {
                        row["provenance"] = w["provenance"].clone();
                    }
                    assert_eq!(g, &row, "{q}");
                }
            }
            other => panic!("unknown read {other}"),
        }
        checked += 1;
    }
    assert_eq!(checked, 7);
    // Every session OpenClaw has a head for is listed with its version.
    let list = json(&run_in(dir.path(), &["--store", &store, "--json", "list"]));
    let versions: Vec<(String, String, u64)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["sessionKey"].as_str().unwrap().to_owned(),
                r["agentId"].as_str().unwrap().to_owned(),
                r["stateVersion"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        versions,
        vec![
            ("agent:main:subagent:child".into(), "main".into(), 10),
            ("agent:main:subagent:old".into(), "main".into(), 1),
            ("global".into(), "main".into(), 7),
            ("global".into(), "ops".into(), 9),
        ]
    );
    let doctor = run_in(dir.path(), &["--store", &store, "doctor"]);
    assert!(
        doctor.status.success(),
        "OpenClaw's own database is healthy: {}",
        stdout(&doctor)
    );
    // Read commands read only: OpenClaw's file is byte for byte as it was (no migration, no
    // table of ours, no journal mode changed), and nothing went to a WAL.
    assert!(
        std::fs::read(&file).unwrap() == before,
        "a read command changed OpenClaw's database"
    );
    let wal = dir.path().join("state.sqlite-wal");
    assert!(std::fs::metadata(&wal).map_or(true, |m| m.len() == 0));
}

/// `tail` without `--after` shows the last 20 events, however sparse their sequences: here 24
/// dedupe hits spent sequences 24 to 47 without rows.
#[test]
fn tail_shows_the_last_twenty_events_across_gaps_in_the_sequence() {
    for store in ["sqlite://t.db", "redb://t.redb"] {
        tail_across_gaps_on(store);
    }
}

/// `tail` on a new file of the backend `store` names, after dedupe hits left 24 numbers unused.
fn tail_across_gaps_on(store: &str) {
    let dir = tempfile::tempdir().unwrap();
    let record = |dedupe: Option<&str>| {
        let mut args = vec![
            "--store",
            store,
            "--json",
            "record",
            "--session",
            "agent:main:subagent:c1",
            "--kind",
            "goal_changed",
            "--summary",
            "goal updated",
        ];
        if let Some(k) = dedupe {
            args.extend(["--dedupe-key", k]);
        }
        let o = run_in(dir.path(), &args);
        assert!(o.status.success(), "{}", stderr(&o));
        json(&o)["event"]["sequence"].as_u64().unwrap()
    };
    for _ in 0..22 {
        record(None);
    }
    for _ in 0..25 {
        assert_eq!(record(Some("same")), 23, "one row, 24 hits");
    }
    assert_eq!(record(None), 48);
    let want: Vec<u64> = (5..=23).chain([48]).collect();
    assert_eq!(tailed(dir.path(), store), want, "{store}");
}

/// The sequences `tail --json` prints on `store`, run in `dir`.
fn tailed(dir: &Path, store: &str) -> Vec<u64> {
    let o = run_in(dir, &["--store", store, "--json", "tail"]);
    assert!(o.status.success(), "{store}: {}", stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["sequence"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[test]
fn operator_commands_on_a_fresh_file() {
    for store in ["sqlite://ops.db", "redb://ops.redb"] {
        operator_commands_on(store);
    }
}

/// Every operator command on a new file of the backend `store` names.
fn operator_commands_on(store: &str) {
    let dir = tempfile::tempdir().unwrap();
    let s = ["--store", store];
    let run = |args: &[&str]| run_in(dir.path(), &[&s[..], args].concat());
    let child = "agent:main:subagent:c1";

    let w = json(&run(&["--json", "watch", "agent:main:main", child]));
    assert_eq!(w["lastSeen"], 0);
    let rec = json(&run(&[
        "--json",
        "record",
        "--session",
        child,
        "--kind",
        "human_direct_message",
        "--actor-type",
        "human",
        "--summary",
        "human message via cli",
        "--payload",
        r#"{"turns":2}"#,
    ]));
    assert_eq!(rec["event"]["sequence"], 1);
    assert_eq!(rec["event"]["payload"]["turns"], 2);
    assert_eq!(rec["notices"].as_array().unwrap().len(), 1);
    // The shape `ack` and `sweep` list notices in.
    let notice = &rec["notices"][0];
    assert_eq!(notice["watcher"], "agent:main:main");
    assert_eq!(notice["target"], child);
    assert!(
        notice["contextKey"]
            .as_str()
            .is_some_and(|k| k.starts_with("session-state:")),
        "{notice}"
    );
    assert!(notice["text"].is_string(), "{notice}");
    // A write command closes its store before it exits: the file alone, copied without
    // SQLite's write-ahead log, holds what it wrote.
    let name = store.split_once("://").unwrap().1;
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::copy(dir.path().join(name), elsewhere.path().join(name)).unwrap();
    let copied = json(&run_in(
        elsewhere.path(),
        &["--store", store, "--json", "status", child],
    ));
    assert_eq!(
        copied["stateVersion"], 1,
        "the copied file holds the record"
    );
    let pending = json(&run(&["--json", "cursors", "--pending"]));
    assert_eq!(pending.as_array().unwrap().len(), 1);
    assert_eq!(pending[0]["notified"], 1);
    // Human tables are aligned and name their columns.
    let table = stdout(&run(&["cursors"]));
    assert!(table.starts_with("WATCHER"), "{table}");
    assert!(
        table.contains("agent:main:main  agent:main:subagent:c1"),
        "{table}"
    );

    let sweep = json(&run(&["--json", "sweep"]));
    assert_eq!(
        sweep.as_array().unwrap().len(),
        1,
        "the pending notice is re-delivered"
    );
    // A target the watcher has no cursor on (a typo) fails, as `unwatch` does, and nothing
    // is acknowledged, not even the target it does watch.
    let typo = run(&["ack", "agent:main:main", child, "agent:main:subagent:typo"]);
    assert_eq!(typo.status.code(), Some(1), "{}", stderr(&typo));
    assert!(
        stderr(&typo).contains("no cursor of agent:main:main on agent:main:subagent:typo"),
        "{}",
        stderr(&typo)
    );
    assert_eq!(
        json(&run(&["--json", "cursors", "--pending"]))
            .as_array()
            .unwrap()
            .len(),
        1,
        "still pending"
    );
    let ack = json(&run(&["--json", "ack", "agent:main:main", child]));
    assert!(ack.as_array().unwrap().is_empty());
    assert!(
        json(&run(&["--json", "cursors", "--pending"]))
            .as_array()
            .unwrap()
            .is_empty()
    );

    let status = json(&run(&["--json", "status", child, "--changes-since", "0"]));
    assert_eq!(status["stateVersion"], 1);
    assert_eq!(
        status["stateChanges"]["events"][0]["summary"],
        "human message via cli"
    );
    let tail = stdout(&run(&["--json", "tail", "--after", "0"]));
    assert_eq!(tail.lines().count(), 1);

    let dry = json(&run(&["--json", "prune", "--dry-run"]));
    assert_eq!(dry["wouldDelete"]["eventsByAge"], 0);
    let pruned = json(&run(&["--json", "prune"]));
    assert_eq!(pruned["deleted"]["eventsByAge"], 0);
    let file = dir.path().join(store.split_once("://").unwrap().1);
    // The file and SQLite's write-ahead log, where a write command's pages stay until a
    // checkpoint (absent for redb). A read-only SQLite open creates an empty log when the last
    // writer's close deleted it; a missing log and an empty one hold the same (no frames).
    let wal = PathBuf::from(format!("{}-wal", file.display()));
    let bytes = || {
        (
            std::fs::read(&file).unwrap(),
            std::fs::read(&wal).unwrap_or_default(),
        )
    };
    let before = bytes();
    let reads: [&[&str]; 6] = [
        &["status", child],
        &["list"],
        &["cursors"],
        &["tail"],
        &["doctor"],
        &["prune", "--dry-run"],
    ];
    for read in reads {
        let o = run(read);
        assert!(o.status.success(), "{read:?}: {}", stderr(&o));
    }
    assert!(
        bytes() == before,
        "the read commands left {store}'s file and log as they were"
    );

    let un = run(&["unwatch", "agent:main:main", child]);
    assert!(un.status.success(), "{}", stderr(&un));
    let again = run(&["unwatch", "agent:main:main", child]);
    assert_eq!(again.status.code(), Some(1), "nothing left to remove");
    assert!(file.is_file(), "{store} wrote its file");
}

/// `doctor` reports cursors pointing past their heads, every one it found: the text prints a
/// line for each problem `--json` lists. (What the mutation did: the text printed the first
/// problem alone; review of stop 70, CE47.)
#[test]
fn doctor_reports_a_cursor_pointing_past_its_head() {
    let dir = tempfile::tempdir().unwrap();
    let store = fixture_copy(dir.path());
    let path = dir.path().join("state.sqlite");
    // Break the copy by hand, as a bad tool would: every cursor of the fixture.
    edit_by_hand(
        &format!("sqlite://{}", path.display()),
        "UPDATE session_watch_cursors SET material_sequence = 99",
    );
    let o = run_in(dir.path(), &["--store", &store, "doctor"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("points past the target's head"),
        "{}",
        stdout(&o)
    );
    let j = run_in(dir.path(), &["--store", &store, "--json", "doctor"]);
    let v: Value = serde_json::from_slice(&j.stdout).unwrap();
    assert_eq!(v["ok"], false);
    let problems = v["problems"].as_array().map_or(0, Vec::len);
    assert!(problems >= 2, "{v}");
    let text = stdout(&o);
    assert_eq!(
        text.lines().filter(|l| l.starts_with("problem: ")).count(),
        problems,
        "{text}"
    );
}

/// `unwatch` and `ack` of a cursor OpenClaw's file does not hold fail, naming it, and leave the
/// file byte for byte as it was: the read-write open would have added our columns before the
/// command found the cursor missing. With the cursor there, they write (and migrate).
#[test]
fn unwatch_and_ack_of_a_missing_cursor_leave_openclaws_file_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let store = fixture_copy(dir.path());
    let file = dir.path().join("state.sqlite");
    let before = std::fs::read(&file).unwrap();
    let child = "agent:main:subagent:child";
    missing_cursors_refused_leaving(dir.path(), &store, &file, child);
    let o = run_in(
        dir.path(),
        &["--store", &store, "unwatch", "agent:ops:main", child],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        std::fs::read(&file).unwrap() != before,
        "a cursor that is there is removed"
    );
}

/// Runs `unwatch` and `ack` of cursors `store` does not hold (agent:main:main's on a typo, and
/// agent:main:other's on `child`, whose cursor agent:main:main holds): each fails naming the
/// cursor and leaves `file` byte for byte as it was.
fn missing_cursors_refused_leaving(dir: &Path, store: &str, file: &Path, child: &str) {
    let before = std::fs::read(file).unwrap();
    for args in [
        &["unwatch", "agent:main:main", "agent:main:subagent:typo"][..],
        &["ack", "agent:main:main", child, "agent:main:subagent:typo"][..],
        &["ack", "agent:main:other", child][..],
    ] {
        let o = run_in(dir, &[&["--store", store][..], args].concat());
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("no cursor of"),
            "{args:?}: {}",
            stderr(&o)
        );
        assert!(
            std::fs::read(file).unwrap() == before,
            "{args:?} changed {}",
            file.display()
        );
    }
}

/// `ack` of a cursor row OpenClaw's file holds but that cannot be read (a negative sequence, as
/// a bad tool writes) fails, saying what is wrong with the row, and leaves the file byte for
/// byte as it was: the read-only look for the cursor left a failed read to the read-write open,
/// which added our columns before `ack` refused the row (review, stop 57). `unwatch` of that
/// row removes it, as it always did (decision 0016).
#[test]
fn ack_of_an_unreadable_cursor_leaves_openclaws_file_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let store = fixture_copy(dir.path());
    let file = dir.path().join("state.sqlite");
    edit_by_hand(
        &format!("sqlite://{}", file.display()),
        "INSERT INTO session_watch_cursors (watcher_session_key, target_session_key, \
         last_seen_sequence, notified_sequence, material_sequence, updated_at) \
         VALUES ('agent:main:main', 'agent:main:subagent:torn', -1, 0, 0, 0)",
    );
    let before = std::fs::read(&file).unwrap();
    let o = run_in(
        dir.path(),
        &[
            "--store",
            &store,
            "ack",
            "agent:main:main",
            "agent:main:subagent:torn",
            "agent:main:subagent:typo",
        ],
    );
    // The first refusal is said, not the missing cursor after it. (What the mutation did: the
    // read-only look went on past the unreadable row and named the missing cursor; review of
    // stop 70, CE50.)
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("corrupt store")
            && stderr(&o).contains("negative")
            && !stderr(&o).contains("no cursor"),
        "{}",
        stderr(&o)
    );
    assert!(
        std::fs::read(&file).unwrap() == before,
        "a refused ack changed OpenClaw's file"
    );
    let o = run_in(
        dir.path(),
        &[
            "--store",
            &store,
            "unwatch",
            "agent:main:main",
            "agent:main:subagent:torn",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `prune --dry-run` on a log with an event row that cannot be read (an agent id with a `:`,
/// written by hand) answers, exit 0: what the events before that row and the cursors would
/// lose, and that the row and those after it were not counted. It failed, answering nothing,
/// where a pass (which deletes such rows in their turn) succeeds (review, stop 57).
#[test]
fn a_dry_run_of_pruning_counts_the_log_up_to_a_row_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = fixture_copy(dir.path());
    let file = dir.path().join("state.sqlite");
    let dry = |dir: &Path| {
        json(&run_in(
            dir,
            &["--store", &store, "--json", "prune", "--dry-run"],
        ))
    };
    let whole = dry(dir.path());
    assert!(whole.get("unreadableEvent").is_none(), "{whole}");
    let tail = run_in(dir.path(), &["--store", &store, "--json", "tail"]);
    assert!(tail.status.success(), "{}", stderr(&tail));
    let last: Value = serde_json::from_str(stdout(&tail).lines().last().expect("an event"))
        .expect("one event per line");
    edit_by_hand(
        &format!("sqlite://{}", file.display()),
        "INSERT INTO session_state_events (session_key, agent_id, kind, actor_type, \
         occurred_at, summary) VALUES ('global', 'a:b', 'goal_changed', 'system', 1, 'bad')",
    );
    let damaged = dry(dir.path());
    assert_eq!(damaged["wouldDelete"], whole["wouldDelete"], "{damaged}");
    assert_eq!(damaged["unreadableEvent"]["notCounted"], 1, "{damaged}");
    assert_eq!(
        damaged["unreadableEvent"]["after"], last["sequence"],
        "{damaged} after {last}"
    );
    // The reason names what is wrong with the row, as the text does. (What the mutation did:
    // an empty reason in the JSON; review of stop 68, CD46.)
    let reason = damaged["unreadableEvent"]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains("corrupt store") && reason.contains("\"a:b\""),
        "{damaged}"
    );
    let o = run_in(dir.path(), &["--store", &store, "prune", "--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The text says how many rows it did not count, as `notCounted` does. (What the mutation
    // did: "the rows" in place of the count; review of stop 70, CE39.)
    assert!(
        stdout(&o).contains("counted up to event #")
            && stdout(&o).contains("so 1 row(s) from it on are not counted by age"),
        "{}",
        stdout(&o)
    );
}

/// The dry run's row-cap count over a log with an unreadable row holds the rows it could not
/// read: a pass applies the cap to the whole log, oldest first, and deletes exactly as many as
/// the dry run said. Counted from the rows before the unreadable one alone, the cap came to 0
/// where the pass deleted 10,009 (the second reading of stop 57).
#[test]
fn a_dry_run_counts_the_rows_it_cannot_read_for_the_row_cap() {
    let dir = tempfile::tempdir().unwrap();
    let store = fixture_copy(dir.path());
    let file = dir.path().join("state.sqlite");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let bulk = format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 30000) \
         INSERT INTO session_state_events (session_key, agent_id, kind, actor_type, occurred_at, \
         summary) SELECT 'agent:main:bulk', 'main', 'goal_changed', 'system', {now}, 'bulk' FROM n"
    );
    edit_by_hand(&format!("sqlite://{}", file.display()), &bulk);
    edit_by_hand(
        &format!("sqlite://{}", file.display()),
        &format!(
            "INSERT INTO session_state_events (session_key, agent_id, kind, actor_type, \
             occurred_at, summary) VALUES ('global', 'a:b', 'goal_changed', 'system', {now}, 'bad')"
        ),
    );
    edit_by_hand(&format!("sqlite://{}", file.display()), &bulk);
    let dry = json(&run_in(
        dir.path(),
        &["--store", &store, "--json", "prune", "--dry-run"],
    ));
    assert_eq!(dry["unreadableEvent"]["notCounted"], 30_001, "{dry}");
    let pass = json(&run_in(dir.path(), &["--store", &store, "--json", "prune"]));
    assert!(
        pass["deleted"]["eventsByCap"]
            .as_u64()
            .is_some_and(|n| n > 10_000),
        "{pass}"
    );
    assert_eq!(
        dry["wouldDelete"]["eventsByCap"], pass["deleted"]["eventsByCap"],
        "{dry} {pass}"
    );
}

/// `cursors --watcher` and `cursors --target` list exactly the cursors of that watcher, and on
/// that target, out of OpenClaw's database (two watchers on one target) and one more cursor on
/// another target. (A review of stop 55 found either filter could be dropped, its value still
/// checked, without a test failing.)
#[test]
fn cursors_lists_what_its_filters_name_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let store = fixture_copy(dir.path());
    let watched = run_in(
        dir.path(),
        &[
            "--store",
            &store,
            "watch",
            "agent:main:main",
            "agent:main:subagent:other",
        ],
    );
    assert!(watched.status.success(), "{}", stderr(&watched));
    let list = |filter: &[&str]| {
        let listed = json(&run_in(
            dir.path(),
            &[&["--store", &store, "--json", "cursors"], filter].concat(),
        ));
        listed
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let field = |f: &str| c[f].as_str().unwrap().to_owned();
                (field("watcher"), field("target"))
            })
            .collect::<Vec<_>>()
    };
    let all = list(&[]);
    let (watcher, target) = all[0].clone();
    for (flag, value, pick) in [("--watcher", &watcher, 0), ("--target", &target, 1)] {
        let expected: Vec<_> = all
            .iter()
            .filter(|c| {
                if pick == 0 {
                    &c.0 == value
                } else {
                    &c.1 == value
                }
            })
            .cloned()
            .collect();
        assert!(
            !expected.is_empty() && expected.len() < all.len(),
            "the fixture has cursors of {flag} {value} and others: {all:?}"
        );
        assert_eq!(list(&[flag, value]), expected, "{flag} {value}");
    }
}

/// A cursor row that cannot be read (a negative sequence, which no writer stores) is left out of
/// `cursors`, which lists the others, and `doctor` names it.
#[test]
fn doctor_names_a_cursor_row_that_cannot_be_read_and_cursors_lists_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let store = fixture_copy(dir.path());
    let path = dir.path().join("state.sqlite");
    let all = json(&run_in(
        dir.path(),
        &["--store", &store, "--json", "cursors"],
    ));
    let all = all.as_array().unwrap();
    let damaged: Vec<String> = all
        .iter()
        .filter(|c| c["watcher"] == "agent:ops:main")
        .map(|c| c["target"].as_str().unwrap().to_owned())
        .collect();
    let all = all.len();
    edit_by_hand(
        &format!("sqlite://{}", path.display()),
        "UPDATE session_watch_cursors SET last_seen_sequence = -5 \
         WHERE watcher_session_key = 'agent:ops:main'",
    );
    let listed = run_in(dir.path(), &["--store", &store, "--json", "cursors"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let listed = listed.as_array().unwrap();
    assert!(
        !listed.is_empty() && listed.len() < all,
        "{} of {all} listed",
        listed.len()
    );
    assert!(
        listed.iter().all(|c| c["watcher"] != "agent:ops:main"),
        "{listed:?}"
    );
    let o = run_in(dir.path(), &["--store", &store, "doctor"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("\"agent:ops:main\"") && stdout(&o).contains("cannot be read"),
        "{}",
        stdout(&o)
    );
    // A dry run of pruning, which previews from readable rows, says what it could not count.
    let dry = json(&run_in(
        dir.path(),
        &["--store", &store, "--json", "prune", "--dry-run"],
    ));
    assert_eq!(dry["unreadableCursors"], 1, "{dry}");
    // `ack` of that cursor says what is wrong with its row (not that there is none).
    assert_eq!(damaged.len(), 1, "{damaged:?}");
    let ack = run_in(
        dir.path(),
        &["--store", &store, "ack", "agent:ops:main", &damaged[0]],
    );
    assert_eq!(ack.status.code(), Some(1), "{}", stdout(&ack));
    assert!(
        stderr(&ack).contains("corrupt store") && !stderr(&ack).contains("no cursor"),
        "{}",
        stderr(&ack)
    );
}

/// Runs `awareness` in `dir` like [`run_in`]; `None` when it had not exited after a minute
/// (it is then killed): a command that should refuse at once but runs on must not hang the test.
fn run_guarded(dir: &Path, args: &[&str]) -> Option<Output> {
    let child = bin()
        .current_dir(dir)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run awareness");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let exited = rx.recv_timeout(std::time::Duration::from_mins(1)).ok();
    if exited.is_none() {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        // Not joined: its wait reads the output to its end, which a process the child started
        // may hold open after the kill; the thread ends with that.
        drop(waiter);
        return None;
    }
    waiter.join().unwrap();
    exited.map(|o| o.expect("wait for awareness"))
}

/// Only `record`, `watch`, `adopt` and `demo` create a missing store. The other write commands,
/// given a mistyped path, created an empty store there and reported success on it ("no
/// notices", "deleted 0", a monitor of 0 sessions that ran until Ctrl-C): each now fails with
/// exit 1 and one line naming the path, and creates nothing, on each backend.
#[test]
fn write_commands_that_add_nothing_refuse_a_missing_store() {
    let mut wrong = Vec::new();
    for scheme in ["sqlite", "redb"] {
        for args in [
            &["unwatch", "agent:main:main", "agent:main:subagent:c1"][..],
            &["ack", "agent:main:main", "agent:main:subagent:c1"][..],
            &["sweep"][..],
            &["prune"][..],
            &["--json", "prune"][..],
            &["monitor", "--first-tick-secs", "0"][..],
        ] {
            let dir = tempfile::tempdir().unwrap();
            let store = format!("{scheme}://nope.db");
            let what = format!("{store} {args:?}");
            match run_guarded(
                dir.path(),
                &[&["--store", store.as_str()][..], args].concat(),
            ) {
                None => wrong.push(format!("{what}: still running after a minute")),
                Some(o) => {
                    let err = stderr(&o);
                    if o.status.code() != Some(1)
                        || err.lines().count() != 1
                        || !err.contains("no store at nope.db")
                    {
                        wrong.push(format!(
                            "{what}: exit {:?}, stdout {:?}, stderr {err:?}",
                            o.status.code(),
                            stdout(&o)
                        ));
                    }
                }
            }
            let left: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            if !left.is_empty() {
                wrong.push(format!("{what}: created {left:?}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Another application's SQLite database, `theirs.db` in `dir`: one table of its own.
fn their_database(dir: &Path) -> std::path::PathBuf {
    let theirs = dir.join("theirs.db");
    edit_by_hand(
        &format!("sqlite://{}?mode=rwc", theirs.display()),
        "CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine');",
    );
    theirs
}

/// Runs each of `commands` on `store` in `dir`: what went otherwise than a failure (exit 1)
/// naming `file` on stderr.
fn not_refused(dir: &Path, store: &str, file: &str, commands: &[&[&str]]) -> Vec<String> {
    let mut wrong = Vec::new();
    for args in commands {
        let o = run_in(dir, &[&["--store", store][..], args].concat());
        let err = stderr(&o);
        if o.status.code() != Some(1) || !err.contains(file) {
            wrong.push(format!(
                "{store} {args:?}: exit {:?}, stdout {:?}, stderr {err:?}",
                o.status.code(),
                stdout(&o)
            ));
        }
    }
    wrong
}

/// The same commands, given an existing file that is no store (an empty file; another
/// application's SQLite database), made it one (OpenClaw's tables, our migrations table, WAL)
/// and reported success on it. Each now fails with exit 1 naming the file, which is left as it
/// was, on each backend.
#[test]
fn write_commands_that_add_nothing_refuse_a_file_that_is_no_store() {
    let dir = tempfile::tempdir().unwrap();
    their_database(dir.path());
    let mut wrong = Vec::new();
    for (scheme, file) in [
        ("sqlite", "empty.db"),
        ("redb", "empty.redb"),
        ("sqlite", "theirs.db"),
    ] {
        let path = dir.path().join(file);
        if !path.exists() {
            std::fs::write(&path, b"").unwrap();
        }
        let before = std::fs::read(&path).unwrap();
        let store = format!("{scheme}://{}", path.display());
        wrong.extend(not_refused(
            dir.path(),
            &store,
            file,
            &[
                &["unwatch", "agent:main:main", "agent:main:subagent:c1"],
                &["ack", "agent:main:main", "agent:main:subagent:c1"],
                &["sweep"],
                &["prune"],
            ],
        ));
        if std::fs::read(&path).unwrap() != before {
            wrong.push(format!("{file}: changed"));
        }
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !["empty.db", "empty.redb", "theirs.db"].contains(&n.as_str()))
        .collect();
    assert!(left.is_empty(), "created {left:?}");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The commands that create a store (`record`, `watch`, `adopt`, `demo`) create it only where
/// there is none, a missing file or an empty one: another application's database at the path
/// (a mistyped path) is refused, naming it, and left as it was. Before, they wrote our tables
/// into it and switched it to WAL.
#[test]
fn commands_that_create_a_store_refuse_another_applications_database() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = their_database(dir.path());
    let transcript = dir.path().join("t.jsonl");
    std::fs::write(&transcript, b"").unwrap();
    let record = [
        "record",
        "--session",
        "s",
        "--kind",
        "created",
        "--summary",
        "x",
    ];
    let before = std::fs::read(&theirs).unwrap();
    let store = format!("sqlite://{}", theirs.display());
    let wrong = not_refused(
        dir.path(),
        &store,
        "theirs.db",
        &[
            &record,
            &["watch", "agent:main:main", "agent:main:subagent:c1"],
            &[
                "adopt",
                "agent:main:x",
                "--file",
                transcript.to_str().unwrap(),
            ],
            &["demo"],
        ],
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert_eq!(
        std::fs::read(&theirs).unwrap(),
        before,
        "their file is as it was"
    );
    // An empty file is no one's database: a store is created in it.
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let store = format!("sqlite://{}", empty.display());
    let args: Vec<&str> = ["--store", store.as_str()]
        .into_iter()
        .chain(record)
        .collect();
    let o = run_in(dir.path(), &args);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A watch of one agent's session of a key moves the watcher's cursor from another agent's
/// session of it (decision 0008), and the notice pending there goes: `watch` says so on stderr
/// (its output is the new cursor), and says nothing when no notice was pending. A recording or
/// an adoption naming the watcher says it too (for each watcher it names), unless it moved
/// nothing (a dedupe hit, or the session the watcher already follows).
#[test]
fn a_watch_that_drops_a_pending_notice_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("state.db").display());
    let run = |args: &[&str]| stderr(&run_ok(dir.path(), &store, args));
    let dropped = "the notice pending there is dropped";
    // A person's goal change in `agent`'s `global`, with `more` flags; what it logged.
    let goal = |agent: &str, more: &[&str]| {
        let args = [
            "record",
            "--session",
            "global",
            "--agent",
            agent,
            "--kind",
            "goal_changed",
            "--actor-type",
            "human",
            "--summary",
            "goal updated",
        ];
        run(&[&args[..], more].concat())
    };
    // The manager watches ops's `global`, which then holds a notice for it.
    let pending_on_ops = || {
        run(&["watch", "agent:main:main", "global", "--agent", "ops"]);
        goal("ops", &[]);
    };
    run(&["watch", "agent:main:main", "global", "--agent", "ops"]);
    // Nothing pending yet: moved back and forth without a word.
    assert!(!run(&["watch", "agent:main:main", "global"]).contains(dropped));
    pending_on_ops();
    let said = run(&["watch", "agent:main:main", "global"]);
    assert!(said.contains(dropped), "{said}");
    assert!(said.contains("from_agent=ops"), "{said}");
    // Watching the same session again keeps its cursor and says nothing.
    assert!(!run(&["watch", "agent:main:main", "global"]).contains(dropped));
    // A recording or an adoption naming the watcher moves the cursor the same way.
    pending_on_ops();
    let said = goal("main", &["--watcher", "agent:main:main"]);
    assert!(said.contains(dropped), "record --watcher: {said}");
    // One that is a dedupe hit (the stored event, on ops's `global`, answers) moves nothing and
    // says nothing: the notice is still pending there. (Warned of whenever a cursor was read
    // back after the write, every test passing: review of stop 62, C10.)
    run(&["watch", "agent:main:main", "global", "--agent", "ops"]);
    goal("ops", &["--dedupe-key", "the-same-change"]);
    let said = goal(
        "main",
        &[
            "--watcher",
            "agent:main:main",
            "--dedupe-key",
            "the-same-change",
        ],
    );
    assert!(
        !said.contains(dropped),
        "record --watcher, a dedupe hit: {said}"
    );
    let pending = json(&run_ok(
        dir.path(),
        &store,
        &["--json", "cursors", "--pending"],
    ));
    assert_eq!(pending.as_array().unwrap().len(), 1, "{pending}");
    assert_eq!(pending[0]["targetAgent"], "ops", "{pending}");
    pending_on_ops();
    let transcript = dir.path().join("t.jsonl");
    std::fs::write(&transcript, b"").unwrap();
    let said = run(&[
        "adopt",
        "global",
        "--agent",
        "main",
        "--file",
        transcript.to_str().unwrap(),
        "--watcher",
        "agent:main:main",
    ]);
    assert!(said.contains(dropped), "adopt --watcher: {said}");
    // A watch, or a recording naming the watcher, of the very session whose notice the watcher
    // holds moves nothing and drops nothing: the notice is still pending. (What the mutation
    // did: warned of any pending cursor on the key, the session it already follows included,
    // telling the operator a notice was lost that was not; review of stop 68, CD41.)
    pending_on_ops();
    let said = run(&["watch", "agent:main:main", "global", "--agent", "ops"]);
    assert!(
        !said.contains(dropped),
        "watch of the session it follows: {said}"
    );
    let said = goal("ops", &["--watcher", "agent:main:main"]);
    assert!(
        !said.contains(dropped),
        "record --watcher on the session it follows: {said}"
    );
    let pending = json(&run_ok(
        dir.path(),
        &store,
        &["--json", "cursors", "--pending"],
    ));
    assert_eq!(pending.as_array().map(Vec::len), Some(1), "{pending}");
    // A recording naming several watchers whose notices it drops says so for each. (What the
    // mutation did: only the first watcher named was looked at; review of stop 68, CD44.)
    let lead = "agent:main:subagent:lead";
    run(&["watch", lead, "global", "--agent", "ops"]);
    goal("ops", &[]);
    let said = goal("main", &["--watcher", "agent:main:main", "--watcher", lead]);
    let warned = |w: &str| {
        said.lines()
            .any(|l| l.contains(dropped) && l.contains(&format!("watcher={w}")))
    };
    assert!(warned("agent:main:main") && warned(lead), "{said}");
}

/// A store the user may not look at is reported as such, naming the file, not as missing
/// ("no store at ..."), which would send them looking for a typo.
#[test]
fn a_store_the_user_may_not_read_is_not_called_missing() {
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::process::CommandExt as _;
    let outer = tempfile::tempdir().unwrap();
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    };
    mode(outer.path(), 0o755);
    // A copy of the binary an unprivileged user may run, wherever the build lives.
    let bin_dir = outer.path().join("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    let exe = bin_dir.join("awareness");
    std::fs::copy(env!("CARGO_BIN_EXE_awareness"), &exe).unwrap();
    mode(&exe, 0o755);
    let locked = outer.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    let store = format!("sqlite://{}", locked.join("state.db").display());
    let made = run_in(
        outer.path(),
        &[
            "--store",
            &store,
            "watch",
            "agent:main:main",
            "agent:main:subagent:c1",
        ],
    );
    assert!(made.status.success(), "{}", stderr(&made));
    mode(&locked, 0o000);
    let mut cmd = Command::new(&exe);
    cmd.env_remove("AWARENESS_LOG")
        .current_dir(outer.path())
        .args(["--store", &store, "list"]);
    // Root reads anything: as root (the owner of what it creates), the child runs as nobody.
    if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&exe).unwrap()) == 0 {
        cmd.uid(65_534).gid(65_534);
    }
    let o = cmd.output().expect("run awareness");
    mode(&locked, 0o755);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("no store at"), "{err}");
    assert!(err.contains("state.db"), "names the file: {err}");
}

/// A warning the libraries log reaches stderr: here store-sqlite's, for a cursor row whose
/// watcher key is not agent-qualified (a row neither we nor OpenClaw write, which it ignores).
/// Without a subscriber, the binary dropped every such line. `AWARENESS_LOG=off` silences it;
/// a value that names no level is a usage error.
#[test]
fn a_library_warning_reaches_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let store = format!("sqlite://{}", path.display());
    let o = run_in(
        dir.path(),
        &[
            "--store",
            &store,
            "watch",
            "agent:main:main",
            "agent:main:subagent:c1",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    edit_by_hand(
        &store,
        "UPDATE session_watch_cursors SET watcher_session_key = 'global'",
    );
    let o = run_in(dir.path(), &["--store", &store, "--json", "cursors"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(json(&o), serde_json::json!([]), "the bad row is ignored");
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "one warning on stderr: {err:?}");
    assert!(
        err.starts_with("awareness: WARN ")
            && err.contains("ignoring a watch cursor that cannot be read")
            && err.contains("the watcher key is not agent-qualified")
            && err.contains("watcher=global"),
        "{err}"
    );
    let cursors_with = |level: &str| {
        bin()
            .current_dir(dir.path())
            .args(["--store", &store, "cursors"])
            .env("AWARENESS_LOG", level)
            .output()
            .unwrap()
    };
    let o = cursors_with("off");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "");
    let o = cursors_with("loud");
    assert_usage(&o, "AWARENESS_LOG=loud");
    assert!(stderr(&o).contains("AWARENESS_LOG"), "{}", stderr(&o));
}

#[test]
fn errors_are_one_clear_line_with_the_right_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    // A read command on a missing file: failure, and nothing is created.
    let o = run_in(dir.path(), &["--store", "sqlite://missing.db", "list"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("missing.db"));
    assert!(
        !dir.path().join("missing.db").exists(),
        "a read command never creates a file"
    );
    let o = run_in(dir.path(), &["status", "agent:main:x"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(!dir.path().join("awareness.db").exists());
    // Bad input to a read command is usage whether or not the store exists: it is checked
    // before the store is opened.
    for args in [
        &["status", "bad key\n"][..],
        &["status", "global", "--agent", ""][..],
        &["list", "--agent", ""][..],
        &["cursors", "--target", ""][..],
        &["cursors", "--watcher", "global"][..],
        &[
            "status",
            "agent:main:x",
            "--changes-since",
            "0",
            "--limit",
            "0",
        ][..],
        &[
            "status",
            "agent:main:x",
            "--changes-since",
            "0",
            "--limit",
            "201",
        ][..],
    ] {
        let o = run_in(dir.path(), args);
        assert_usage(&o, &format!("{args:?}"));
        assert!(!dir.path().join("awareness.db").exists());
    }

    // A wrong URL: usage.
    let o = run_in(dir.path(), &["--store", "mysql://x", "list"]);
    assert_usage(&o, "a wrong URL");
    // Given to the demo too. (What the mutation did: the demo's wrong URL exited 1, a
    // failure, not a usage error; review of stop 70, CZ20.)
    let o = run_in(dir.path(), &["--store", "mysql://x", "demo"]);
    assert_usage(&o, "a wrong URL given to the demo");

    // A duration the clock cannot reach: usage, before anything starts (guarded: were the
    // refusal lost, the monitor would run until killed).
    let o = run_guarded(
        dir.path(),
        &["monitor", "--first-tick-secs", "18446744073709551615"],
    )
    .expect("a duration the clock cannot reach: the monitor was still running after a minute");
    assert_usage(&o, "a duration the clock cannot reach");

    // Bad flags: usage.
    let o = run_in(dir.path(), &["list", "--bogus"]);
    assert_usage(&o, "a bad flag");
    // A missing argument is named, and a missing command is said to be one.
    for (args, says) in [
        (&["status"][..], "<KEY>"),
        (&["record", "--session", "s"][..], "--kind <KIND>"),
        (&[][..], "a command is required"),
        (&["status", "global", "--limit", "5"][..], "--changes-since"),
    ] {
        let o = run_in(dir.path(), args);
        assert_usage(&o, &format!("{args:?}"));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    // Bad keys: the argument at fault is named (a command takes several keys).
    for (args, says) in [
        (&["watch", "global", "agent:main:x"][..], "WATCHER: "),
        (&["watch", "agent:main:main", ""][..], "TARGET: "),
        (&["unwatch", "agent:main:main", ""][..], "TARGET: "),
        (
            &["ack", "agent:main:main", "agent:main:x", ""][..],
            "TARGETS (the 2nd): ",
        ),
        (&["status", ""][..], "KEY: "),
        (&["cursors", "--target", ""][..], "--target: "),
        (&["cursors", "--watcher", "global"][..], "--watcher: "),
        (
            &[
                "record",
                "--session",
                "",
                "--kind",
                "created",
                "--summary",
                "s",
            ][..],
            "--session: ",
        ),
        (&["adopt", "", "--file", "t.jsonl"][..], "KEY: "),
        (
            &[
                "adopt",
                "agent:main:x",
                "--file",
                "t.jsonl",
                "--watcher",
                "global",
            ][..],
            "--watcher: ",
        ),
    ] {
        let o = run_in(dir.path(), args);
        assert_usage(&o, &format!("{args:?}"));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    let o = run_in(
        dir.path(),
        &[
            "record",
            "--session",
            "s",
            "--kind",
            "created",
            "--summary",
            "two\nlines",
        ],
    );
    assert_usage(&o, "a summary of two lines");
    // A payload that is not JSON too, named (it exited 1, a failure, under mutation with every
    // test passing; review of stop 64, CL29).
    let o = run_in(
        dir.path(),
        &[
            "record",
            "--session",
            "s",
            "--kind",
            "created",
            "--summary",
            "s",
            "--payload",
            "{not json",
        ],
    );
    assert_usage(&o, "a payload that is not JSON");
    assert!(
        stderr(&o).contains("--payload is not JSON"),
        "{}",
        stderr(&o)
    );
    assert!(
        !dir.path().join("awareness.db").exists(),
        "bad input to a write command creates no store"
    );

    // Nor does it migrate one: OpenClaw's file stays byte for byte as it was.
    let store = fixture_copy(dir.path());
    let file = dir.path().join("state.sqlite");
    let before = std::fs::read(&file).unwrap();
    for args in [
        &[
            "record",
            "--session",
            "s",
            "--kind",
            "bogus",
            "--summary",
            "x",
        ][..],
        &["watch", "global", "agent:main:x"][..],
        &["ack", "global", "agent:main:x"][..],
        &["unwatch", "agent:main:main", "bad key\n"][..],
        &["cursors", "--watcher", "global"][..],
    ] {
        let o = run_in(
            dir.path(),
            &[&["--store", store.as_str()][..], args].concat(),
        );
        assert_usage(&o, &format!("{args:?}"));
        assert!(
            std::fs::read(&file).unwrap() == before,
            "{args:?} changed the file"
        );
    }
    std::fs::write(dir.path().join("t.jsonl"), "{}\n").unwrap();
    // An empty flag the transcript does not decide is a usage error, whether the file is
    // there or missing (the flags are checked before it is read).
    for (file, flag) in [
        ("t.jsonl", "--catalog"),
        ("missing.jsonl", "--catalog"),
        ("missing.jsonl", "--host"),
        ("missing.jsonl", "--thread"),
    ] {
        let o = run_in(
            dir.path(),
            &[
                "--store",
                "redb://adopted.redb",
                "adopt",
                "agent:main:x",
                "--file",
                file,
                flag,
                "",
            ],
        );
        assert_usage(&o, &format!("adopt {file} with an empty {flag}"));
    }
    let o = run_in(
        dir.path(),
        &[
            "--store",
            "mysql://x",
            "adopt",
            "agent:main:x",
            "--file",
            "missing.jsonl",
        ],
    );
    assert_usage(&o, "adopt with a bad store URL and a missing file");
    assert!(
        !dir.path().join("adopted.redb").exists(),
        "adopt created its store"
    );

    // An unknown session: failure.
    let o = run_in(
        dir.path(),
        &["--store", &store, "status", "agent:main:nobody"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("unknown session agent:main:nobody"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stderr(&o).lines().count(), 1);
}

/// `doctor` beside a writer that keeps recording finds nothing wrong: it read heads first, so a
/// commit between its reads showed events and cursors past the heads it had read, and it
/// reported problems that were not there (exit 1).
#[test]
fn doctor_beside_a_live_writer_finds_no_false_problems() {
    use awareness_core::{ActorType, EventKind, NewEvent, SessionRef, Timestamp, WatcherKey};
    for scheme in ["sqlite", "redb"] {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("{scheme}://{}", dir.path().join("state.db").display());
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = rt
            .block_on(gateway_adapter::open_full_store_with(
                &url,
                gateway_adapter::OpenOptions {
                    live_readers: true,
                    ..gateway_adapter::OpenOptions::default()
                },
            ))
            .unwrap();
        let manager = WatcherKey::parse("agent:main:main").unwrap();
        let targets: Vec<SessionRef> = (0..4)
            .map(|i| SessionRef::parse(&format!("agent:main:subagent:t{i}"), "main").unwrap())
            .collect();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let writer = {
            let (store, stop, targets) = (store.clone(), stop.clone(), targets.clone());
            let progress = progress.clone();
            rt.spawn(async move {
                for t in &targets {
                    store.watch(&manager, t, Timestamp::now()).await.unwrap();
                }
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let t = &targets[(n % 4) as usize];
                    let e = NewEvent::new(
                        t.clone(),
                        EventKind::HumanDirectMessage,
                        ActorType::Human,
                        "human message via cli",
                    );
                    store.record(e, Timestamp::now()).await.unwrap();
                    n += 1;
                    progress.store(n, std::sync::atomic::Ordering::Relaxed);
                }
                n
            })
        };
        // Doctor runs until the writer has recorded during them (at least 15 runs; how many
        // overlap depends on the machine, not what is checked): each run must find nothing.
        let recorded = || progress.load(std::sync::atomic::Ordering::Relaxed);
        let mut runs = Vec::new();
        let mut first = None;
        while runs.len() < 15 || first.is_none_or(|f| recorded() < f + 10) {
            assert!(runs.len() < 2_000, "{scheme}: the writer made no progress");
            if first.is_none() && recorded() > 0 {
                first = Some(recorded());
            }
            let o = run_in(dir.path(), &["--store", &url, "doctor"]);
            runs.push((o.status.code(), stdout(&o), stderr(&o)));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // The loop above ran until the writer had recorded ten events during the runs.
        rt.block_on(writer).unwrap();
        for (code, out, err) in runs {
            assert_eq!(
                code,
                Some(0),
                "{scheme}: doctor beside the writer: {out}{err}"
            );
        }
    }
}

/// Records `events` (each a session key of agent main, and the clock it is recorded at) on a
/// new store at `url` through the library, and closes it, so that the binary opens it next.
fn record_through_library(url: &str, events: &[(&str, awareness_core::Timestamp)]) {
    use awareness_core::{ActorType, EventKind, NewEvent, SessionRef};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = gateway_adapter::open_store(url).await.unwrap();
        for (i, (key, at)) in events.iter().enumerate() {
            let e = NewEvent::new(
                SessionRef::parse(key, "main").unwrap(),
                EventKind::GoalChanged,
                ActorType::System,
                format!("goal {i}"),
            );
            store.record(e, *at).await.unwrap();
        }
        store.close().await;
    });
}

/// Records on `key` in a new store at `url` two events past the 30 days `prune` keeps, then two
/// recent ones.
fn two_old_events_then_two_recent(url: &str, key: &str) {
    let now = awareness_core::Timestamp::now();
    let long_ago = now.minus_ms(40 * awareness_core::Timestamp::DAY_MS);
    record_through_library(
        url,
        &[(key, long_ago), (key, long_ago), (key, now), (key, now)],
    );
}

/// `tail --after` reads the log 500 events a read and reads on while a read comes back full:
/// with 501 events it prints all 501, in sequence order, on each backend, and a text table has
/// its header once. Had it stopped at a full page, it would have printed 500.
#[test]
fn tail_after_prints_every_event_past_a_full_page() {
    for scheme in ["sqlite", "redb"] {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("{scheme}://{}", dir.path().join("state.db").display());
        let now = awareness_core::Timestamp::now();
        let events: Vec<(&str, _)> = (0..501)
            .map(|i| {
                let key = if i % 2 == 0 {
                    "agent:main:subagent:a"
                } else {
                    "agent:main:subagent:b"
                };
                (key, now)
            })
            .collect();
        record_through_library(&url, &events);

        let o = run_in(
            dir.path(),
            &["--store", &url, "--json", "tail", "--after", "0"],
        );
        assert!(o.status.success(), "{scheme}: {}", stderr(&o));
        let shown: Vec<(u64, String)> = stdout(&o)
            .lines()
            .map(|l| {
                let e: Value = serde_json::from_str(l).unwrap();
                (
                    e["sequence"].as_u64().unwrap(),
                    e["summary"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let want: Vec<(u64, String)> = (1..=501).map(|s| (s, format!("goal {}", s - 1))).collect();
        assert_eq!(
            shown.len(),
            501,
            "{scheme}: tail printed {} events",
            shown.len()
        );
        assert_eq!(shown, want, "{scheme}");

        let o = run_in(dir.path(), &["--store", &url, "tail", "--after", "0"]);
        assert!(o.status.success(), "{scheme}: {}", stderr(&o));
        let text = stdout(&o);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + 501, "{scheme}: a header and 501 rows");
        assert!(lines[0].starts_with("SEQ"), "{scheme}: {}", lines[0]);
        assert_eq!(
            lines.iter().filter(|l| l.starts_with("SEQ")).count(),
            1,
            "{scheme}: the header once"
        );
        assert!(
            lines[501].starts_with("501 ") && lines[501].ends_with("goal 500"),
            "{scheme}: {}",
            lines[501]
        );
    }
}

/// `watch` of a target key that names no agent (`global`) watches the watcher's agent's
/// session of that key: `agent:ops:main` watching `global` watches ops' `global`, and a change
/// there notifies it while a change to main's `global` does not. A target key that names its
/// agent keeps it.
#[test]
fn watch_of_a_bare_key_watches_the_watchers_agents_session() {
    let dir = tempfile::tempdir().unwrap();
    let s = ["--store", "sqlite://w.db"];
    let run = |args: &[&str]| run_in(dir.path(), &[&s[..], args].concat());

    let w = json(&run(&["--json", "watch", "agent:ops:main", "global"]));
    assert_eq!(w["watcher"], "agent:ops:main", "{w}");
    assert_eq!(w["target"], "global", "{w}");
    assert_eq!(w["targetAgent"], "ops", "{w}");
    let table = stdout(&run(&["cursors"]));
    assert!(
        table.contains("agent:ops:main  global  ops"),
        "the cursor is on ops' global:\n{table}"
    );

    let record = |agent: &str| {
        json(&run(&[
            "--json",
            "record",
            "--session",
            "global",
            "--agent",
            agent,
            "--kind",
            "human_direct_message",
            "--actor-type",
            "human",
            "--summary",
            "human message via cli",
        ]))
    };
    let main = record("main");
    assert_eq!(main["event"]["agentId"], "main", "{main}");
    assert_eq!(
        main["notices"],
        serde_json::json!([]),
        "main's global is not watched"
    );
    let ops = record("ops");
    assert_eq!(ops["event"]["agentId"], "ops", "{ops}");
    let notices = ops["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1, "ops' global is watched: {ops}");
    assert_eq!(notices[0]["watcher"], "agent:ops:main", "{ops}");

    let w = json(&run(&[
        "--json",
        "watch",
        "agent:ops:main",
        "agent:main:subagent:c1",
    ]));
    assert_eq!(w["targetAgent"], "main", "the key's own agent: {w}");
}

/// `--agent` wins over the key's own agent: `record --session agent:ops:subagent:x --agent main`
/// records to main's session of that key (the flag's default is the key's agent, else main).
/// (What the mutation did: the key's agent before `--agent`, so the event went to ops' session
/// and `--agent` was ignored; review of stop 66, C602.) The event's row says its own agent, and
/// a bare key recorded without `--agent` is main's session too.
#[test]
fn an_agent_given_wins_over_the_keys_own() {
    let dir = tempfile::tempdir().unwrap();
    let store = "sqlite://a.db";
    // A goal change recorded on `session`, with `flags` after it.
    let record = |session: &str, flags: &[&str]| {
        let mut args = vec!["--json", "record", "--session", session];
        args.extend_from_slice(flags);
        args.extend(["--kind", "goal_changed", "--summary", "goal updated"]);
        json(&run_on(dir.path(), store, &args))
    };
    let v = record("agent:ops:subagent:x", &["--agent", "main"]);
    assert_eq!(v["event"]["agentId"], "main", "--agent main: {v}");
    let heads = json(&run_on(dir.path(), store, &["--json", "list"]));
    assert_eq!(
        heads,
        serde_json::json!([{
            "sessionKey": "agent:ops:subagent:x",
            "agentId": "main",
            "stateVersion": 1,
            "prunedMaxSequence": 0,
            "updatedAt": heads[0]["updatedAt"],
        }]),
        "main's session of the key"
    );
    // The AGENT column of the event's row is the event's agent. (What the mutation did: the
    // column showed the key's agent, `ops`; review of stop 70, CE15.)
    let text = stdout(&run_ok(dir.path(), store, &["tail"]));
    let row: Vec<&str> = text
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row.get(1), Some(&"agent:ops:subagent:x"), "{text}");
    assert_eq!(row.get(2), Some(&"main"), "the AGENT column: {text}");
    // A bare key, no `--agent`: main's, the agent every command defaults to. (What the
    // mutation did: another default, so `record global` wrote to a session `status global
    // --agent main` does not know; review of stop 70, CE12.)
    let v = record("global", &[]);
    assert_eq!(v["event"]["agentId"], "main", "{v}");
    let s = json(&run_on(
        dir.path(),
        store,
        &["--json", "status", "global", "--agent", "main"],
    ));
    assert_eq!(s["stateVersion"], v["event"]["sequence"], "{s}");
}

/// `list --agent A` lists A's sessions only, in JSON and in text. (What the mutation did: the
/// filter dropped, every agent's sessions listed; review of stop 66, C607.)
#[test]
fn list_with_an_agent_lists_that_agents_sessions_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = "sqlite://l.db";
    for session in ["agent:main:subagent:a", "agent:ops:subagent:b"] {
        run_ok(
            dir.path(),
            store,
            &[
                "record",
                "--session",
                session,
                "--kind",
                "goal_changed",
                "--summary",
                "goal updated",
            ],
        );
    }
    let ops = json(&run_on(
        dir.path(),
        store,
        &["--json", "list", "--agent", "ops"],
    ));
    let keys: Vec<&str> = ops
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["sessionKey"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["agent:ops:subagent:b"], "{ops}");
    let text = stdout(&run_ok(dir.path(), store, &["list", "--agent", "ops"]));
    assert!(
        text.contains("agent:ops:subagent:b") && !text.contains("agent:main:subagent:a"),
        "{text}"
    );
}

/// `--help` and `--version` are answers, not errors: exit 0, the text on stdout, nothing on
/// stderr, and no store is opened or created.
#[test]
fn help_and_version_exit_zero_and_print_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    for args in [&["--help"][..], &["-h"][..], &["status", "--help"][..]] {
        let o = run_in(dir.path(), args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o), "", "{args:?}");
        assert!(
            stdout(&o).contains("Usage: awareness"),
            "{args:?}: {}",
            stdout(&o)
        );
    }
    let help = stdout(&run_in(dir.path(), &["--help"]));
    for needle in [
        "Session state awareness: demo and operator tools",
        "status",
        "tail",
        "--store",
        "--json",
    ] {
        assert!(help.contains(needle), "missing {needle:?} in:\n{help}");
    }
    for flag in ["--version", "-V"] {
        let o = run_in(dir.path(), &[flag]);
        assert_eq!(o.status.code(), Some(0), "{flag}: {}", stderr(&o));
        assert_eq!(stderr(&o), "", "{flag}");
        assert_eq!(
            stdout(&o),
            format!("awareness {}\n", env!("CARGO_PKG_VERSION")),
            "{flag}"
        );
    }
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "help and version create nothing"
    );
}

/// `record --json` says whether the event was a dedupe hit: the first record of a key is not
/// (`deduplicated` false), the second is (true) and answers with the first's event, whatever
/// it was asked to record; another key is not. The text answer says so too.
#[test]
fn record_json_reports_a_dedupe_hit() {
    for store in ["sqlite://d.db", "redb://d.redb"] {
        let dir = tempfile::tempdir().unwrap();
        let record = |key: &str, summary: &str, as_json: bool| {
            let mut args = vec!["--store", store];
            if as_json {
                args.push("--json");
            }
            args.extend([
                "record",
                "--session",
                "agent:main:subagent:c1",
                "--kind",
                "goal_changed",
                "--summary",
                summary,
                "--dedupe-key",
                key,
            ]);
            run_in(dir.path(), &args)
        };
        let first = json(&record("k1", "goal updated", true));
        assert_eq!(first["deduplicated"], false, "{store}: {first}");
        assert_eq!(first["event"]["sequence"], 1, "{store}: {first}");
        let second = json(&record("k1", "goal updated again", true));
        assert_eq!(second["deduplicated"], true, "{store}: {second}");
        assert_eq!(second["event"], first["event"], "{store}: the stored event");
        let other = json(&record("k2", "another goal", true));
        assert_eq!(other["deduplicated"], false, "{store}: {other}");
        assert_eq!(other["event"]["sequence"], 3, "{store}: {other}");

        let o = record("k1", "goal updated", false);
        assert!(o.status.success(), "{store}: {}", stderr(&o));
        assert!(
            stdout(&o).contains("(dedupe hit: the stored event, nothing moved)"),
            "{store}: {}",
            stdout(&o)
        );
        let o = record("k3", "a third goal", false);
        assert!(o.status.success(), "{store}: {}", stderr(&o));
        assert!(
            !stdout(&o).contains("dedupe hit"),
            "{store}: {}",
            stdout(&o)
        );
    }
}

/// `record --run-id R --session-id S` stores both on the event, which the JSON answer and
/// `tail --json` show. (What the mutation did: the flag parsed and dropped, the event without
/// it; review of stop 66, C618 and C619.)
#[test]
fn record_keeps_its_run_and_session_ids() {
    let dir = tempfile::tempdir().unwrap();
    let store = "sqlite://r.db";
    let v = json(&run_on(
        dir.path(),
        store,
        &[
            "--json",
            "record",
            "--session",
            "agent:main:subagent:c1",
            "--kind",
            "run_completed",
            "--summary",
            "run done",
            "--run-id",
            "run-7",
            "--session-id",
            "sess-9",
        ],
    ));
    assert_eq!(v["event"]["runId"], "run-7", "{v}");
    assert_eq!(v["event"]["sessionId"], "sess-9", "{v}");
    let tailed = stdout(&run_ok(dir.path(), store, &["--json", "tail"]));
    let e: Value = serde_json::from_str(tailed.trim()).expect("one JSON line");
    assert_eq!(
        (&e["runId"], &e["sessionId"]),
        (&Value::from("run-7"), &Value::from("sess-9")),
        "stored: {e}"
    );
}

/// A right-to-left override in a session key and a summary (which validation lets through:
/// it is no control character) prints as its escape in every output, the text tables and the
/// JSON alike, which JSON readers read back as the key; the terminal shows the line in order.
#[test]
fn a_bidirectional_override_prints_as_an_escape() {
    let dir = tempfile::tempdir().unwrap();
    let key = "agent:main:subagent:\u{202E}cba";
    let store = "sqlite://d.db";
    let o = run_in(
        dir.path(),
        &[
            "--store",
            store,
            "record",
            "--session",
            key,
            "--kind",
            "goal_changed",
            "--summary",
            "goal \u{2067}x\u{2069}",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run_in(dir.path(), &["--store", store, "list"]);
    let text = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    let row = text
        .lines()
        .find(|l| l.starts_with("agent:main:subagent:\\u202Ecba  main"))
        .unwrap_or_else(|| panic!("{text}"));
    let header = text.lines().next().unwrap();
    assert_eq!(
        header.find("AGENT"),
        row.find("  main").map(|at| at + 2),
        "the columns line up with the escape as printed: {text}"
    );
    let o = run_in(dir.path(), &["--store", store, "tail"]);
    let text = stdout(&o);
    assert!(text.contains("goal \\u2067x\\u2069"), "{text}");
    let listed = json(&run_in(dir.path(), &["--store", store, "--json", "list"]));
    assert!(listed.to_string().contains(key), "{listed}");
    for args in [
        &["list"][..],
        &["tail"],
        &["--json", "list"],
        &["status", key],
    ] {
        let mut all = vec!["--store", store];
        all.extend_from_slice(args);
        let o = run_in(dir.path(), &all);
        assert!(
            !stdout(&o).contains(['\u{202E}', '\u{2067}', '\u{2069}']),
            "{args:?}: {}",
            stdout(&o)
        );
    }
}

/// Text `status --changes-since` prints the page's flags each under its own name: on a session
/// pruned below its head, a read from 0 has a history gap and is not truncated, and a read
/// from past the pruned part cut by `--limit` is truncated with no gap, as `--json` says.
#[test]
fn text_status_prints_the_history_gap_and_truncated_apart() {
    for scheme in ["sqlite", "redb"] {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("{scheme}://{}", dir.path().join("state.db").display());
        let key = "agent:main:subagent:c1";
        two_old_events_then_two_recent(&url, key);
        let pruned = json(&run_in(dir.path(), &["--store", &url, "--json", "prune"]));
        assert_eq!(pruned["deleted"]["eventsByAge"], 2, "{scheme}: {pruned}");

        let status = |extra: &[&str], as_json: bool| {
            let mut args = vec!["--store", url.as_str()];
            if as_json {
                args.push("--json");
            }
            args.extend(["status", key]);
            args.extend(extra);
            let o = run_in(dir.path(), &args);
            assert!(o.status.success(), "{scheme} {extra:?}: {}", stderr(&o));
            o
        };
        for (extra, want) in [
            (
                &["--changes-since", "0"][..],
                "changes since 0: 2 event(s), truncated false, earliestAvailableSequence 3, historyGap true",
            ),
            (
                &["--changes-since", "2", "--limit", "1"][..],
                "changes since 2: 1 event(s), truncated true, earliestAvailableSequence 3, historyGap false",
            ),
            // A read from past the session's head says `versionAhead true` at the end of the
            // line, as `--json` says it. (What the mutation did: the text never said
            // `versionAhead`; review of stop 72, CK01.)
            (
                &["--changes-since", "9"][..],
                "changes since 9: 0 event(s), truncated false, earliestAvailableSequence 3, historyGap false, versionAhead true",
            ),
        ] {
            let page = json(&status(extra, true))["stateChanges"].clone();
            let truncated = want.contains("truncated true");
            let gap = want.contains("historyGap true");
            assert_eq!(page["truncated"], truncated, "{scheme} {extra:?}: {page}");
            assert_eq!(page["historyGap"], gap, "{scheme} {extra:?}: {page}");
            // `versionAhead` is left out of the JSON when false.
            let ahead = want.contains("versionAhead true");
            assert_eq!(
                page["versionAhead"].as_bool().unwrap_or(false),
                ahead,
                "{scheme} {extra:?}: {page}"
            );
            let text = stdout(&status(extra, false));
            let lines: Vec<&str> = text.lines().collect();
            assert!(
                lines[0].starts_with(&format!(
                    "{key} (agent main): stateVersion 4, pruned up to 2, updated "
                )),
                "{scheme} {extra:?}:\n{text}"
            );
            assert_eq!(lines[1], want, "{scheme} {extra:?}:\n{text}");
        }
    }
}

/// An error line stays one line whatever text it carries: a path with a line break in it (or
/// any other control character) prints as an escape, so it cannot forge a second line.
#[test]
fn an_error_naming_a_path_with_a_line_break_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!(
        "sqlite://{}/nope\nawareness: forged.db",
        dir.path().display()
    );
    let o = run_in(dir.path(), &["--store", &store, "list"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("nope\\nawareness: forged.db"),
        "{}",
        stderr(&o)
    );
}

/// A parse error whose value holds a blank line keeps its whole reason on one line: clap's
/// message was cut at its first blank line (`invalid value '1`), and the line breaks and
/// escape sequences of what was typed reached the terminal as they were.
#[test]
fn a_parse_error_keeps_its_whole_reason_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    for (value, shown) in [
        ("1\n\nx", "'1\\n\\nx'"),
        ("\u{1b}[31mred", "'\\u{1b}[31mred'"),
        ("1\u{202E}2", "'1\\u202E2'"),
    ] {
        let o = run_in(dir.path(), &["tail", "--after", value]);
        assert_usage(&o, &format!("{value:?}"));
        let err = stderr(&o);
        assert!(
            err.contains(&format!("invalid value {shown} for '--after <AFTER>'"))
                && err.contains("invalid digit found in string")
                && err.ends_with(" (see awareness --help)\n"),
            "{value:?}: {err}"
        );
        assert!(
            !err.contains(['\u{1b}', '\u{202E}']),
            "{value:?}: an escape sequence reached the terminal: {err:?}"
        );
    }
    // So is an unknown argument, and clap's own lines are still joined.
    let o = run_in(dir.path(), &["list", "--bo\n\ngus"]);
    assert_usage(&o, "an unknown argument with a blank line");
    assert!(
        stderr(&o).contains("unexpected argument '--bo\\n\\ngus' found"),
        "{}",
        stderr(&o)
    );
    let o = run_in(dir.path(), &["status"]);
    assert_usage(&o, "a missing argument");
    assert!(
        stderr(&o).contains("were not provided: <KEY> (see awareness --help)"),
        "{}",
        stderr(&o)
    );
}

/// On `memory:`, a store that lives only as long as the command, the write commands reported
/// success for what was thrown away when they ended, and `monitor` and `tail --follow` waited
/// for a store nothing else can write to: each is now a usage error saying why. The demo (self
/// contained) and the read commands still run on it.
#[test]
fn memory_is_refused_where_it_would_lose_what_is_written() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.jsonl"), "{}\n").unwrap();
    let mut wrong = Vec::new();
    for args in [
        &[
            "record",
            "--session",
            "agent:main:x",
            "--kind",
            "goal_changed",
            "--summary",
            "x",
        ][..],
        &["watch", "agent:main:main", "agent:main:x"][..],
        &["unwatch", "agent:main:main", "agent:main:x"][..],
        &["ack", "agent:main:main", "agent:main:x"][..],
        &["sweep"][..],
        &["prune"][..],
        &["adopt", "agent:main:x", "--file", "t.jsonl"][..],
        &["monitor", "--first-tick-secs", "0"][..],
        &["tail", "--follow"][..],
        &["repair"][..],
    ] {
        let all = [&["--store", "memory:"][..], args].concat();
        match run_guarded(dir.path(), &all) {
            None => wrong.push(format!("{args:?}: still running after a minute")),
            Some(o) => {
                let err = stderr(&o);
                let why = if args[0] == "repair" {
                    "memory: holds no file to repair"
                } else {
                    "memory: lives only as long as this command"
                };
                if o.status.code() != Some(2) || err.lines().count() != 1 || !err.contains(why) {
                    wrong.push(format!(
                        "{args:?}: exit {:?}, stdout {:?}, stderr {err:?}",
                        o.status.code(),
                        stdout(&o)
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    for args in [
        &["demo"][..],
        &["list"][..],
        &["cursors"][..],
        &["tail"][..],
        &["doctor"][..],
        &["prune", "--dry-run"][..],
    ] {
        let o = run_in(dir.path(), &[&["--store", "memory:"][..], args].concat());
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["t.jsonl"], "memory: wrote no file");
}

/// Flags that contradict each other were accepted and one was dropped without a word: a
/// watcher named on a log-only kind (which notifies nobody) or on the session itself (which
/// never watches itself) made no cursor, and `--json demo` printed text. Each is a usage
/// error now, before any store is created; a watcher a notify kind takes still works.
#[test]
fn flags_that_would_be_dropped_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let record = |kind: &str, watcher: &str| {
        run_in(
            dir.path(),
            &[
                "record",
                "--session",
                "agent:main:x",
                "--kind",
                kind,
                "--summary",
                "s",
                "--watcher",
                watcher,
            ],
        )
    };
    for kind in [
        "run_completed",
        "run_failed",
        "compacted",
        "adopted",
        "created",
    ] {
        let o = record(kind, "agent:main:main");
        assert_usage(&o, kind);
        assert!(
            stderr(&o).contains(&format!("--watcher: a {kind} event is log-only")),
            "{kind}: {}",
            stderr(&o)
        );
    }
    for kind in ["goal_changed", "child_spawned"] {
        let o = record(kind, "agent:main:x");
        assert_usage(&o, &format!("{kind} watched by its own session"));
        assert!(
            stderr(&o).contains("--watcher: session \"agent:main:x\" cannot watch itself"),
            "{kind}: {}",
            stderr(&o)
        );
    }
    // A notifying event's own actor named as its watcher: self-suppression writes nothing for
    // it. A seed is kept (a spawner that spawns its child is the actor of `child_spawned`).
    let by_watcher = |dir: &Path, kind: &str| {
        run_in(
            dir,
            &[
                "record",
                "--session",
                "agent:main:x",
                "--kind",
                kind,
                "--summary",
                "s",
                "--actor-type",
                "agent",
                "--actor-id",
                "agent:main:main",
                "--watcher",
                "agent:main:main",
            ],
        )
    };
    let o = by_watcher(dir.path(), "goal_changed");
    assert_usage(&o, "goal_changed watched by its actor");
    assert!(
        stderr(&o).contains("it is the event's --actor-id"),
        "{}",
        stderr(&o)
    );
    let seeded = tempfile::tempdir().unwrap();
    let o = by_watcher(seeded.path(), "child_spawned");
    assert_eq!(o.status.code(), Some(0), "a seed: {}", stderr(&o));
    let o = run_in(dir.path(), &["--json", "demo"]);
    assert_usage(&o, "--json demo");
    assert!(
        stderr(&o).contains("demo prints a narration, never JSON"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stdout(&o), "", "--json demo printed text");
    assert!(
        !dir.path().join("awareness.db").exists(),
        "a refused command created the store"
    );
    let o = record("goal_changed", "agent:main:main");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("agent:main:main <- "),
        "the named watcher is notified: {}",
        stdout(&o)
    );
}

/// A store another process holds is a failure that may pass: exit code 75 (`EX_TEMPFAIL`)
/// and a hint to try again, where it exited 1 like a failure no retry cures (which a file
/// that is no store still is). The line names the command once: `record: store busy: ...:
/// record an event` said it twice.
#[test]
fn a_store_another_process_holds_exits_75_with_a_hint() {
    const HINT: &str =
        "(another process holds the store, or its server is out of reach: try again)";
    let dir = tempfile::tempdir().unwrap();
    let record: &[&str] = &[
        "record",
        "--session",
        "agent:main:x",
        "--kind",
        "created",
        "--summary",
        "made",
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // redb: a writer without live readers excludes every other process (in use).
    let redb = dir.path().join("held.redb");
    let url = format!("redb://{}", redb.display());
    let held = rt
        .block_on(store_redb::RedbStore::open(&redb))
        .expect("hold the redb store");
    for args in [&["list"][..], record] {
        let o = run_in(dir.path(), &[&["--store", &url][..], args].concat());
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(75), "{args:?}: {err}");
        assert!(
            err.starts_with("awareness: ") && err.contains("try again"),
            "{args:?}: {err}"
        );
        assert_eq!(err.matches("try again").count(), 1, "advised once: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    rt.block_on(held.close());

    // SQLite: another process holds the write lock past the busy timeout (busy).
    let url = "sqlite://held.db";
    let o = run_in(dir.path(), &[&["--store", url][..], record].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let path = dir.path().join("held.db");
    let holder = rt.block_on(async {
        use sqlx::Connection as _;
        let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        sqlx::raw_sql("BEGIN EXCLUSIVE")
            .execute(&mut c)
            .await
            .unwrap();
        c
    });
    let o = run_in(dir.path(), &[&["--store", url][..], record].concat());
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(75), "{err}");
    assert!(
        err.starts_with("awareness: store busy: ") && err.trim_end().ends_with(HINT),
        "{err}"
    );
    assert!(
        !err.contains("record: store busy"),
        "the command named twice: {err}"
    );
    rt.block_on(async {
        use sqlx::Connection as _;
        holder.close().await.unwrap();
    });

    // A failure that stays: a text file as the store.
    std::fs::write(dir.path().join("notes.db"), "my notes\n".repeat(100)).unwrap();
    let o = run_in(
        dir.path(),
        &[&["--store", "sqlite://notes.db"][..], record].concat(),
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("awareness: ") && !err.contains(HINT),
        "{err}"
    );
}

/// A command line clap refuses is a usage error (exit code 2) on one line starting
/// `awareness: `, as every other error line does, not clap's `error: `.
#[test]
fn a_parse_error_starts_as_every_error_line_does() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_in(dir.path(), &["list", "--foo"]);
    assert_usage(&o, "an unknown flag");
    assert_eq!(
        stderr(&o),
        "awareness: unexpected argument '--foo' found (see awareness --help)\n"
    );
    let o = run_in(dir.path(), &[]);
    assert_usage(&o, "no command");
    assert_eq!(
        stderr(&o),
        "awareness: a command is required (see awareness --help)\n"
    );
}

/// `tail` on a log without gaps (the usual case) shows its last 20 events, on each backend.
/// (One short, 19, when the window held exactly 20 rows, passed every test: the test above has
/// gaps; review of stop 60.)
#[test]
fn tail_shows_the_last_twenty_events_of_a_log_without_gaps() {
    for scheme in ["sqlite", "redb"] {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("{scheme}://{}", dir.path().join("t.db").display());
        let now = awareness_core::Timestamp::now();
        record_through_library(&url, &[("agent:main:subagent:a", now); 25]);
        assert_eq!(
            tailed(dir.path(), &url),
            (6..=25).collect::<Vec<_>>(),
            "{scheme}"
        );
    }
}

/// `watch` of a session by itself is a usage error (exit 2), found before any store is opened:
/// nothing is created. (Left to the store, it exited 1 and created the file, and every test
/// passed: review of stop 60.)
#[test]
fn a_self_watch_is_a_usage_error_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_in(
        dir.path(),
        &[
            "--store",
            "sqlite://s.db",
            "watch",
            "agent:main:subagent:x",
            "agent:main:subagent:x",
        ],
    );
    assert_usage(&o, "a self-watch");
    assert!(!dir.path().join("s.db").exists(), "a store was created");
}

/// The eleventh of `ack`'s targets is named "the 11th" when it is refused.
#[test]
fn a_refused_eleventh_target_is_the_11th() {
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<String> = (0..10)
        .map(|i| format!("agent:main:subagent:k{i}"))
        .collect();
    let mut args = vec!["--store", "sqlite://s.db", "ack", "agent:main:main"];
    args.extend(keys.iter().map(String::as_str));
    args.push("");
    let o = run_in(dir.path(), &args);
    assert_usage(&o, "an empty target");
    assert!(stderr(&o).contains("TARGETS (the 11th)"), "{}", stderr(&o));
}

/// The text of `list` puts each number under its header, and the text of `status
/// --changes-since` prints the page's events under theirs. (The two numbers of `list`
/// swapped, and the page's events left out of `status`, passed every test, which read the
/// JSON: review of stop 60.)
#[test]
fn text_list_and_status_print_their_numbers_and_events_under_their_headers() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let key = "agent:main:subagent:c1";
    two_old_events_then_two_recent(&url, key);
    let pruned = run_in(dir.path(), &["--store", &url, "prune"]);
    assert!(pruned.status.success(), "{}", stderr(&pruned));
    let list = run_in(dir.path(), &["--store", &url, "list"]);
    assert!(list.status.success(), "{}", stderr(&list));
    let text = stdout(&list);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0][..4],
        ["SESSION", "AGENT", "STATE_VERSION", "PRUNED_MAX"],
        "{text}"
    );
    assert_eq!(rows[1][..4], [key, "main", "4", "2"], "{text}");
    let status = run_in(
        dir.path(),
        &["--store", &url, "status", key, "--changes-since", "2"],
    );
    assert!(status.status.success(), "{}", stderr(&status));
    let text = stdout(&status);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() >= 5
            && lines[2].starts_with("SEQ")
            && lines[3].starts_with("3 ")
            && lines[4].starts_with("4 "),
        "{text}"
    );
}

/// The text of `prune --dry-run` says so when a single cursor row cannot be read (decision
/// 0016), as the JSON counts it. (Said only from two rows on passed every test: review of stop
/// 60.)
#[test]
fn a_text_dry_run_says_a_single_cursor_row_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = fixture_copy(dir.path());
    edit_by_hand(
        &store,
        "UPDATE session_watch_cursors SET last_seen_sequence = -5 \
         WHERE rowid = (SELECT min(rowid) FROM session_watch_cursors)",
    );
    let counted = json(&run_in(
        dir.path(),
        &["--store", &store, "--json", "prune", "--dry-run"],
    ));
    assert_eq!(counted["unreadableCursors"], 1, "{counted}");
    let o = run_in(dir.path(), &["--store", &store, "prune", "--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("; 1 cursor row(s) that cannot be read are not counted"),
        "{}",
        stdout(&o)
    );
}

/// `ack` naming two targets the watcher has no cursor on names the first of them, as the check on
/// the open store does (and as it does on PostgreSQL, which has no read-only look first). (Without
/// the `break` in the read-only look, the last one was named, and every test passed: review of stop
/// 62, C06.)
#[test]
fn ack_of_two_missing_targets_names_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| run_on(dir.path(), "sqlite://s.db", args);
    let w = run(&["watch", "agent:main:main", "agent:main:subagent:c1"]);
    assert!(w.status.success(), "{}", stderr(&w));
    let o = run(&[
        "ack",
        "agent:main:main",
        "agent:main:subagent:c1",
        "agent:main:subagent:typo1",
        "agent:main:subagent:typo2",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no cursor of agent:main:main on agent:main:subagent:typo1"),
        "the first target without a cursor is named: {}",
        stderr(&o)
    );
}

/// A `sweep` with nothing pending says so in words, and `[]` with `--json`. (Printing nothing at
/// all passed every test: review of stop 62, C34.)
#[test]
fn a_sweep_with_nothing_pending_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| run_on(dir.path(), "sqlite://s.db", args);
    let w = run(&["watch", "agent:main:main", "agent:main:subagent:c1"]);
    assert!(w.status.success(), "{}", stderr(&w));
    let o = run(&["sweep"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "no notices\n");
    assert_eq!(json(&run(&["--json", "sweep"])), serde_json::json!([]));
}

/// The text `cursors` table says `yes` under PENDING for a cursor with a notice pending, and `no`
/// for one without. (The two swapped passed every test: review of stop 62, C22.)
#[test]
fn the_cursors_table_says_which_cursor_has_a_notice_pending() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| run_ok(dir.path(), "sqlite://s.db", args);
    let (c1, c2) = ("agent:main:subagent:c1", "agent:main:subagent:c2");
    run(&["watch", "agent:main:main", c1]);
    run(&["watch", "agent:main:main", c2]);
    run(&[
        "record",
        "--session",
        c1,
        "--kind",
        "human_direct_message",
        "--actor-type",
        "human",
        "--summary",
        "typed",
    ]);
    let table = stdout(&run(&["cursors"]));
    let pending_of = |target: &str| {
        table
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|cells| cells.get(1) == Some(&target))
            .and_then(|cells| cells.get(6).map(|c| (*c).to_owned()))
            .unwrap_or_else(|| panic!("no row for {target}: {table}"))
    };
    assert!(table.starts_with("WATCHER"), "{table}");
    assert_eq!(pending_of(c1), "yes", "c1 holds a notice: {table}");
    assert_eq!(pending_of(c2), "no", "c2 holds none: {table}");
}

/// The text `cursors` table puts each of a cursor's three sequences under its own header: a
/// cursor that has seen nothing, was notified of event #1 and holds #2 as its latest material
/// change reads `0 1 2` under LAST_SEEN, NOTIFIED and MATERIAL, as the JSON says. (What the
/// mutation did: LAST_SEEN and NOTIFIED swapped, an operator reading an acknowledged notice as
/// not yet notified; review of stop 68, CD19.)
#[test]
fn the_cursors_table_puts_each_sequence_under_its_header() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| run_ok(dir.path(), "sqlite://s.db", args);
    let c1 = "agent:main:subagent:c1";
    run(&["watch", "agent:main:main", c1]);
    for (kind, summary) in [("goal_changed", "goal"), ("human_direct_message", "typed")] {
        run(&[
            "record",
            "--session",
            c1,
            "--kind",
            kind,
            "--actor-type",
            "human",
            "--summary",
            summary,
        ]);
    }
    let v = json(&run(&["--json", "cursors"]));
    assert_eq!(
        (&v[0]["lastSeen"], &v[0]["notified"], &v[0]["material"]),
        (&Value::from(0), &Value::from(1), &Value::from(2)),
        "{v}"
    );
    let table = stdout(&run(&["cursors"]));
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0][3..6],
        ["LAST_SEEN", "NOTIFIED", "MATERIAL"],
        "{table}"
    );
    assert_eq!(
        rows[1][3..6],
        ["0", "1", "2"],
        "each sequence under its header: {table}"
    );
}

/// `doctor` counts heads and cursors each under its own name, in text and in JSON: two sessions
/// with events and one cursor. (The two counts swapped, in either output, passed every test: review
/// of stop 62, C31 and C32.)
#[test]
fn doctor_counts_heads_and_cursors_apart() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| run_ok(dir.path(), "sqlite://s.db", args);
    let (c1, c2) = ("agent:main:subagent:c1", "agent:main:subagent:c2");
    run(&["watch", "agent:main:main", c1]);
    for session in [c1, c2, c2] {
        run(&[
            "record",
            "--session",
            session,
            "--kind",
            "goal_changed",
            "--summary",
            "goal updated",
        ]);
    }
    let text = stdout(&run(&["doctor"]));
    assert_eq!(
        text,
        "schema ok; 3 event(s), 2 head(s), 1 cursor(s)\nno problems found\n"
    );
    let v = json(&run(&["--json", "doctor"]));
    assert_eq!(
        (&v["events"], &v["heads"], &v["cursors"], &v["ok"]),
        (
            &serde_json::json!(3),
            &serde_json::json!(2),
            &serde_json::json!(1),
            &serde_json::json!(true)
        ),
        "{v}"
    );
}

/// `prune --json` says whether it was a dry run (`dryRun`), and the text dry run names the
/// retention's row cap (50,000 rows). (A real prune saying `"dryRun": true`, and the cap said as
/// the chunk size, passed every test: review of stop 62, C38 and C39.)
#[test]
fn prune_says_whether_it_was_a_dry_run_and_names_the_row_cap() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| run_ok(dir.path(), "sqlite://s.db", args);
    run(&["watch", "agent:main:main", "agent:main:subagent:c1"]);
    let cap = awareness_core::RetentionPolicy::default().max_rows;
    let text = stdout(&run(&["prune", "--dry-run"]));
    assert!(
        text.contains(&format!(", 0 beyond the {cap}-row cap, ")),
        "{text}"
    );
    assert_eq!(
        json(&run(&["--json", "prune", "--dry-run"]))["dryRun"],
        true
    );
    let done = json(&run(&["--json", "prune"]));
    assert_eq!(done["dryRun"], false, "a real prune: {done}");
}

/// `repair` of a file that needs none says why in its backend's words: SQLite's readers recover its
/// log; a redb file closed cleanly is taken by a read-only open. (The two texts swapped passed
/// every test: review of stop 62, C40.)
#[test]
fn repair_of_a_file_that_needs_none_says_why_in_its_backends_words() {
    let dir = tempfile::tempdir().unwrap();
    for (store, says) in [
        ("sqlite://s.db", "SQLite needs no repair"),
        ("redb://s.redb", "a read-only open takes it"),
    ] {
        let run = |args: &[&str]| run_ok(dir.path(), store, args);
        run(&["watch", "agent:main:main", "agent:main:subagent:c1"]);
        run(&[
            "record",
            "--session",
            "agent:main:subagent:c1",
            "--kind",
            "goal_changed",
            "--summary",
            "new goal",
        ]);
        let text = stdout(&run(&["repair"]));
        assert!(text.contains(says), "{store}: {text}");
        // The line ends with how many events the file holds, as `--json`'s `events` says.
        // (What the mutation did: the count left out of the text; review of stop 72, CK24.)
        assert!(text.ends_with("; 1 event(s)\n"), "{store}: {text}");
    }
}

/// `unwatch --json` says `{"removed": true}` when it removed the cursor. (`false` there passed
/// every test: review of stop 62, C41.)
#[test]
fn unwatch_json_says_it_removed_the_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| run_ok(dir.path(), "sqlite://s.db", args);
    run(&["watch", "agent:main:main", "agent:main:subagent:c1"]);
    let v = json(&run(&[
        "--json",
        "unwatch",
        "agent:main:main",
        "agent:main:subagent:c1",
    ]));
    assert_eq!(v, serde_json::json!({"removed": true}));
}

/// The JSON a command prints ends with a line break, as every text output does: appended to a
/// file, two runs' documents stand on lines of their own, and a shell's prompt starts on its
/// own line. (What the mutation did: the document printed without its final line break;
/// review of stop 68, CD29.)
#[test]
fn json_output_ends_with_a_line_break() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| run_ok(dir.path(), "sqlite://s.db", args);
    let c1 = "agent:main:subagent:c1";
    for args in [
        &["--json", "watch", "agent:main:main", c1][..],
        &["--json", "list"],
        &["--json", "cursors"],
        &["--json", "doctor"],
        &["--json", "sweep"],
    ] {
        let out = stdout(&run(args));
        assert!(
            out.ends_with("}\n") || out.ends_with("]\n"),
            "{args:?}: {out:?}"
        );
    }
}

/// The ACTOR column of a text table names the actor's type and its id (the session that acted), as
/// `--json` gives `actorType` and `actorId`; an event without an id shows its type alone. (What the
/// mutation did: the id dropped, `agent` alone for an agent's event; review of stop 64, CL21.)
#[test]
fn the_actor_column_names_the_acting_session() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("a.db").display());
    let rec = |actor: &[&str]| {
        let args = [
            &[
                "--store",
                url.as_str(),
                "record",
                "--session",
                "agent:main:subagent:c1",
                "--kind",
                "goal_changed",
                "--summary",
                "goal updated",
            ][..],
            actor,
        ]
        .concat();
        let o = run_in(dir.path(), &args);
        assert!(o.status.success(), "{}", stderr(&o));
    };
    rec(&[
        "--actor-type",
        "agent",
        "--actor-id",
        "agent:main:subagent:c2",
    ]);
    rec(&[]);
    let o = run_in(dir.path(), &["--store", &url, "tail"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[1].contains("  agent agent:main:subagent:c2  "),
        "the actor's id is shown: {text}"
    );
    assert!(lines[2].contains("  system  "), "{text}");
}

/// Text `status --changes-since` at the session's head prints its two lines and no event table.
/// (What the mutation did: a table header over no rows; review of stop 64, CL23.)
#[test]
fn text_status_without_changes_prints_no_event_table() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    let key = "agent:main:subagent:c1";
    let o = run_in(
        dir.path(),
        &[
            "--store",
            &url,
            "record",
            "--session",
            key,
            "--kind",
            "goal_changed",
            "--summary",
            "goal updated",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run_in(
        dir.path(),
        &["--store", &url, "status", key, "--changes-since", "1"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[1].starts_with("changes since 1: 0 event(s), truncated false"),
        "{text}"
    );
}

/// A text `prune --dry-run` of a store whose cursor rows all read says nothing of unreadable cursor
/// rows. (What the mutation did: "0 cursor row(s) that cannot be read are not counted" on every dry
/// run; review of stop 64, CL30.)
#[test]
fn a_text_dry_run_with_every_cursor_readable_says_nothing_of_unreadable_ones() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("d.db").display());
    let w = run_in(
        dir.path(),
        &[
            "--store",
            &url,
            "watch",
            "agent:main:main",
            "agent:main:subagent:c1",
        ],
    );
    assert!(w.status.success(), "{}", stderr(&w));
    let o = run_in(dir.path(), &["--store", &url, "prune", "--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.starts_with("would delete 0 event(s) older than "),
        "{text}"
    );
    assert!(!text.contains("cannot be read"), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
}

/// A path holding a right-to-left override prints as its escape in an error line too, so the
/// line shows in order. (What the mutation did: error lines left out of `printable`, the
/// terminal showed the line reversed; review of stop 65, CU07.)
#[test]
fn an_error_line_prints_a_bidirectional_override_as_its_escape() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!(
        "sqlite://{}",
        dir.path().join("a\u{202E}b").join("state.db").display()
    );
    let o = run_on(dir.path(), &store, &["list"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("a\\u202Eb"), "{err}");
    assert!(!err.contains('\u{202E}'), "{err:?}");
}

/// `--json` prints a command's answer indented, a field to a line (only `tail` and `monitor`
/// print one object per line). (What the mutation did: the answer printed on one line; review
/// of stop 70, CE14.)
#[test]
fn json_answers_are_printed_indented() {
    let dir = tempfile::tempdir().unwrap();
    let out = stdout(&run_ok(
        dir.path(),
        "sqlite://s.db",
        &[
            "--json",
            "watch",
            "agent:main:main",
            "agent:main:subagent:c1",
        ],
    ));
    assert!(out.starts_with("{\n  \""), "{out:?}");
    assert!(out.lines().count() > 3, "{out:?}");
}

/// `unwatch` and `ack` of a cursor a redb file does not hold fail, naming it, before the file is
/// opened for writing, and leave it byte for byte as it was, as they do a SQLite file. (What
/// the mutation did: only SQLite was looked at read-only first; review of stop 70, CE51.)
#[test]
fn unwatch_and_ack_of_a_missing_cursor_leave_a_redb_file_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.redb");
    let store = format!("redb://{}", file.display());
    let child = "agent:main:subagent:c1";
    run_ok(dir.path(), &store, &["watch", "agent:main:main", child]);
    missing_cursors_refused_leaving(dir.path(), &store, &file, child);
}
