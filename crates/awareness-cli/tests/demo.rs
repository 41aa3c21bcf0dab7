//! `awareness demo` driven from code: a demo that fails midway still leaves what it recorded in
//! the database file itself.

mod common;

use std::io;
use std::path::Path;

use common::FailsAfter;
use serde_json::Value;

/// `awareness --store <url> record` of a `goal_changed` event on `agent:main:x`.
fn record_args<'a>(url: &'a str, summary: &'a str) -> [&'a str; 10] {
    [
        "awareness",
        "--store",
        url,
        "record",
        "--session",
        "agent:main:x",
        "--kind",
        "goal_changed",
        "--summary",
        summary,
    ]
}

/// The refs with a head in the store at `url`, through `awareness --json list`.
async fn listed(url: &str) -> Vec<Value> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = awareness_cli::run(
        ["awareness", "--store", url, "--json", "list"],
        &mut out,
        &mut err,
    )
    .await;
    assert_eq!(code, 0, "list on {url}: {}", String::from_utf8_lossy(&err));
    let list: Value = serde_json::from_slice(&out).expect("list prints JSON");
    list.as_array().expect("a JSON array").clone()
}

/// Copies the database file alone, without any file beside it (SQLite's `-wal` and `-shm`).
fn copy_alone(file: &Path, dir: &Path) -> std::path::PathBuf {
    let copy = dir
        .join("copy")
        .join(file.file_name().expect("a file name"));
    std::fs::create_dir_all(copy.parent().expect("a parent")).expect("create the copy's dir");
    std::fs::copy(file, &copy).expect("copy the file alone");
    copy
}

async fn a_demo_that_fails_midway_closes_its_store(scheme: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("demo.db");
    let url = format!("{scheme}://{}", file.display());
    // The two spawns and the human's five messages are recorded before this line is printed.
    let mut out = FailsAfter {
        taken: Vec::new(),
        needle: "the manager's queue holds",
        kind: io::ErrorKind::StorageFull,
    };
    let mut err = Vec::new();
    let code = awareness_cli::run(["awareness", "--store", &url, "demo"], &mut out, &mut err).await;
    let err = String::from_utf8_lossy(&err);
    assert_eq!(code, awareness_cli::EXIT_FAILURE, "{scheme}: {err}");
    assert!(err.contains("cannot write output"), "{scheme}: {err}");
    // Right away, as a process that exits on the error would leave it.
    let copy = copy_alone(&file, dir.path());
    let heads = listed(&format!("{scheme}://{}", copy.display())).await;
    assert_eq!(
        heads.len(),
        2,
        "{scheme}: the file alone holds the heads of both subagents: {heads:?}"
    );
}

// SQLite only: a redb store commits into the file itself (`Immediate`), and dropping its last
// handle closes the file at once, so on redb this could not fail without the close.
#[tokio::test]
async fn a_demo_that_fails_midway_closes_its_store_sqlite() {
    a_demo_that_fails_midway_closes_its_store("sqlite").await;
}

/// A demo whose reader goes away (`awareness demo | head`) stops without a message, with exit
/// code 141 (as SIGPIPE ends a Unix tool), and what it had recorded is in the file.
#[tokio::test]
async fn a_demo_whose_reader_goes_away_stops_without_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("demo.db");
    let url = format!("sqlite://{}", file.display());
    let mut out = FailsAfter {
        taken: Vec::new(),
        needle: "the manager's queue holds",
        kind: io::ErrorKind::BrokenPipe,
    };
    let mut err = Vec::new();
    let code = awareness_cli::run(["awareness", "--store", &url, "demo"], &mut out, &mut err).await;
    assert_eq!(
        code,
        awareness_cli::EXIT_CLOSED_PIPE,
        "{}",
        String::from_utf8_lossy(&err)
    );
    assert!(err.is_empty(), "{}", String::from_utf8_lossy(&err));
    assert!(
        !String::from_utf8_lossy(&out.taken).contains("final session_status"),
        "the demo stopped where its reader left"
    );
    assert_eq!(listed(&url).await.len(), 2, "the two spawns are recorded");
}

/// A demo whose recordings the store refuses (here a trigger aborts every event insert) tells
/// its story to the end, as the adapter carries on past a failed recording, and then fails,
/// saying how many steps did not happen: it does not exit 0 on a demo that showed nothing. So
/// does one where only the second gateway process's recording is refused (its channel,
/// WhatsApp, is in its summary), which it says was "recorded there as nothing". (What the
/// mutation did: that step left uncounted, the demo exited 0; review of stop 65, CU31.)
#[tokio::test]
async fn a_demo_whose_recordings_fail_exits_with_a_failure() {
    use sqlx::Connection as _;
    for (when, missed) in [("", None), ("WHEN NEW.summary LIKE '%whatsapp%'", Some(1))] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("demo.db");
        let url = format!("sqlite://{}", file.display());
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code =
            awareness_cli::run(record_args(&url, "makes the store"), &mut out, &mut err).await;
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", file.display()))
            .await
            .unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE TRIGGER refuse BEFORE INSERT ON session_state_events {when} \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();

        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code =
            awareness_cli::run(["awareness", "--store", &url, "demo"], &mut out, &mut err).await;
        let (out, err) = (String::from_utf8_lossy(&out), String::from_utf8_lossy(&err));
        assert_eq!(code, awareness_cli::EXIT_FAILURE, "{when}: {out}\n{err}");
        assert!(
            out.contains("final session_status"),
            "{when}: the story is told to the end: {out}"
        );
        assert!(
            err.contains("the demo did not run as told") && err.contains("step(s) did not happen"),
            "{when}: {err}"
        );
        if let Some(n) = missed {
            assert!(out.contains("recorded there as nothing"), "{when}: {out}");
            assert!(
                err.contains(&format!(": {n} step(s) did not happen")),
                "{when}: {err}"
            );
        }
    }
}

/// What the demo narrates is what it did: the lines its second gateway's pick-up queued are
/// those listed under it, as many as it says, not also the line queued before it (the
/// writer's, at +35 s); and each event is recorded at its narrated time, the human's messages
/// at +5 s 5 s after the spawn at +0 s, the one at +14 s 14 s after it, and the other gateway
/// process's, in the same file, 40 s after it. (What the mutations
/// did: every queued line listed, the older one too, CU42; the demo's clock moved 100 ms per
/// narrated second, CU45; review of stop 65.)
#[tokio::test]
async fn the_demo_narrates_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("demo.db").display());
    let out = demo_on(&url).await;
    let mut lines = out
        .lines()
        .skip_while(|l| !l.contains("its pick-up queues "));
    let said = lines
        .next()
        .unwrap_or_else(|| panic!("no pick-up line: {out}"));
    let queued: usize = said
        .split("its pick-up queues ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    let listed: Vec<&str> = lines.take_while(|l| !l.is_empty()).collect();
    assert_eq!(listed.len(), queued, "{said}\n{listed:#?}");
    assert!(
        listed
            .iter()
            .all(|l| l.contains(":subagent:research\" changed")),
        "{listed:#?}"
    );
    let status = final_status(&out);
    let at: Vec<i64> = status["stateChanges"]["events"]
        .as_array()
        .unwrap_or_else(|| panic!("{status}"))
        .iter()
        .map(|e| e["occurredAt"].as_i64().unwrap())
        .collect();
    let since_spawn: Vec<i64> = at.iter().map(|t| t - at[0]).collect();
    assert_eq!(
        since_spawn,
        [0, 5_000, 5_000, 5_000, 5_000, 5_000, 14_000, 40_000],
        "{status}"
    );
}

/// A write whose output then fails says that the write was done, so that nobody runs it again
/// to be sure (a second `record` without a dedupe key is a second event): on a full disk, and
/// on a closed pipe too, which otherwise ends a command without a word.
#[tokio::test]
async fn a_record_whose_output_fails_says_it_was_recorded() {
    for (kind, code, says) in [
        (
            io::ErrorKind::StorageFull,
            awareness_cli::EXIT_FAILURE,
            "recorded event #1, but cannot write output",
        ),
        (
            io::ErrorKind::BrokenPipe,
            awareness_cli::EXIT_CLOSED_PIPE,
            "recorded event #1, but the output's reader went away",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let mut out = FailsAfter::at_once(kind);
        let mut err = Vec::new();
        let got = awareness_cli::run(record_args(&url, "once"), &mut out, &mut err).await;
        let err = String::from_utf8_lossy(&err);
        assert_eq!(got, code, "{kind}: {err}");
        assert!(err.contains(says), "{kind}: {err}");
        assert_eq!(listed(&url).await.len(), 1, "{kind}: the event is stored");
    }
}

/// The demo and `repair` print the store's name on one line whatever it holds: a path with a
/// line break printed as it was, and a line of the output could be forged by whoever chose the
/// name (the demo printed it three times, `repair` once).
#[tokio::test]
async fn a_store_name_with_a_line_break_is_printed_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("a\nforged: line").display());
    for args in [&["demo"][..], &["repair"][..]] {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let argv = ["awareness", "--store", &url]
            .into_iter()
            .chain(args.iter().copied());
        let code = awareness_cli::run(argv, &mut out, &mut err).await;
        let out = String::from_utf8_lossy(&out);
        assert_eq!(code, 0, "{args:?}: {out}{}", String::from_utf8_lossy(&err));
        assert!(
            out.lines().all(|l| !l.starts_with("forged: line")),
            "{args:?}: {out}"
        );
        assert!(out.contains("a\\nforged: line"), "{args:?}: {out}");
    }
}

/// A second demo on the same file records its own spawns: its run ids are its own, not those
/// of the demo before it (dedupe keys are store-wide, and a run's names a spawn). Each demo's
/// closing lines name a command that lists its manager's cursors. (What the mutations did:
/// every demo's run ids were the same, so the second demo's spawns were taken for the
/// first's, recorded nowhere, and narrated with the first's numbers, CZ22; the command named
/// the research subagent's cursors, which watches nothing, CZ26; review of stop 70.)
#[tokio::test]
async fn a_second_demo_on_the_same_file_records_its_own_spawns() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("demo.db").display());
    for run in 1..=2 {
        let out = demo_on(&url).await;
        let status = final_status(&out);
        assert_eq!(
            status["stateChanges"]["events"][0]["kind"], "child_spawned",
            "demo {run}: {out}"
        );
        let manager = out
            .lines()
            .find_map(|l| l.strip_prefix("[+  0s] "))
            .and_then(|l| l.split(' ').next())
            .unwrap_or_else(|| panic!("the manager spawns: {out}"));
        assert!(
            out.contains(&format!(" cursors --watcher {manager}\n")),
            "demo {run}: {out}"
        );
    }
}

/// Runs the demo on `url` and answers what it printed, once it has exited 0.
async fn demo_on(url: &str) -> String {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = awareness_cli::run(["awareness", "--store", url, "demo"], &mut out, &mut err).await;
    let out = String::from_utf8(out).unwrap();
    assert_eq!(code, 0, "{out}{}", String::from_utf8_lossy(&err));
    out
}

/// The final `session_status` the demo printed.
fn final_status(out: &str) -> Value {
    let json = out
        .lines()
        .skip_while(|l| !l.starts_with("final session_status"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}
