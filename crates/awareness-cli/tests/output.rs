//! What a write command says, driven from code: on its output, and on stderr when its output
//! then fails (a full disk, a closed pipe), so that nobody runs the write again to be sure.

mod common;

use std::io;

use common::FailsAfter;
use serde_json::Value;

/// Runs `awareness --store <url> ARGS` into memory; (exit code, stdout, stderr).
async fn run(url: &str, args: &[&str]) -> (i32, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_into(url, args, &mut out, &mut err).await;
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

async fn run_into(url: &str, args: &[&str], out: &mut dyn io::Write, err: &mut Vec<u8>) -> i32 {
    let argv: Vec<&str> = ["awareness", "--store", url]
        .iter()
        .chain(args)
        .copied()
        .collect();
    awareness_cli::run(argv, out, err).await
}

/// Runs a command that must succeed; its stdout.
async fn ok(url: &str, args: &[&str]) -> String {
    let (code, out, err) = run(url, args).await;
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

/// Records one human message in `session`.
async fn human(url: &str, session: &str) {
    ok(
        url,
        &[
            "record",
            "--session",
            session,
            "--kind",
            "human_direct_message",
            "--actor-type",
            "human",
            "--summary",
            "human message via cli",
        ],
    )
    .await;
}

/// How many cursors show a pending notice.
async fn pending(url: &str) -> usize {
    let list: Value = serde_json::from_str(&ok(url, &["--json", "cursors", "--pending"]).await)
        .expect("cursors prints JSON");
    list.as_array().expect("a JSON array").len()
}

const MAIN: &str = "agent:main:main";
const C1: &str = "agent:main:subagent:c1";
const C2: &str = "agent:main:subagent:c2";

/// `ack` says what it acknowledged before the follow-ups: the sessions it was given, each
/// counted once however often it is named (the store acknowledges a repeated target once),
/// and how many of them had a notice pending (one without has nothing to acknowledge).
#[tokio::test]
async fn ack_says_what_it_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    ok(&url, &["watch", MAIN, C1]).await;
    ok(&url, &["watch", MAIN, C2]).await;
    human(&url, C1).await;
    assert_eq!(pending(&url).await, 1);

    let out = ok(&url, &["ack", MAIN, C1, C2, C1]).await;
    assert_eq!(
        out,
        "acknowledged 2 session(s) for agent:main:main (1 had a notice pending when read)\n\
         no follow-up notices\n"
    );
    assert_eq!(pending(&url).await, 0);

    // Two events on c1: the first one's notice is acknowledged, the second comes as the
    // follow-up, printed after what was acknowledged.
    human(&url, C1).await;
    human(&url, C1).await;
    let out = ok(&url, &["ack", MAIN, C1]).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some("acknowledged 1 session(s) for agent:main:main (1 had a notice pending when read)"),
        "{out}"
    );
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[1].starts_with("agent:main:main <- "),
        "the follow-up: {out}"
    );

    // With --json, the follow-ups alone, a bare array as before.
    ok(&url, &["ack", MAIN, C1]).await;
    let out = ok(&url, &["--json", "ack", MAIN, C1, C1]).await;
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v, serde_json::json!([]));
}

/// An `ack` whose output fails says what it acknowledged, a target named twice counted once,
/// on a full disk and on a closed pipe; the acknowledgement is in the store.
#[tokio::test]
async fn an_ack_whose_output_fails_counts_a_repeated_target_once() {
    for (kind, code, why) in [
        (
            io::ErrorKind::StorageFull,
            awareness_cli::EXIT_FAILURE,
            "cannot write output",
        ),
        (
            io::ErrorKind::BrokenPipe,
            awareness_cli::EXIT_CLOSED_PIPE,
            "the output's reader went away",
        ),
    ] {
        for json in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}", dir.path().join("s.db").display());
            ok(&url, &["watch", MAIN, C1]).await;
            human(&url, C1).await;
            let mut out = FailsAfter::at_once(kind);
            let mut err = Vec::new();
            let args: &[&str] = if json {
                &["--json", "ack", MAIN, C1, C1]
            } else {
                &["ack", MAIN, C1, C1]
            };
            let got = run_into(&url, args, &mut out, &mut err).await;
            let err = String::from_utf8_lossy(&err);
            assert_eq!(got, code, "{kind} (json {json}): {err}");
            assert!(
                err.contains(&format!(
                    "awareness: acknowledged 1 session(s) for agent:main:main \
                     (1 had a notice pending when read), but {why}"
                )),
                "{kind} (json {json}): {err}"
            );
            assert_eq!(pending(&url).await, 0, "{kind}: acknowledged");
        }
    }
}

/// A copy of the store at `url` (a redb file) taken while a read-write handle has it open, as a
/// writer that crashed leaves it: read-only opens refuse it until a read-write open repairs it.
async fn left_open(url: &str, dir: &std::path::Path, name: &str) -> String {
    let open = gateway_adapter::open_full_store(url).await.expect("open");
    let path = url.strip_prefix("redb://").expect("a redb URL");
    let copy = dir.join(name);
    std::fs::copy(path, &copy).expect("copy the open file");
    open.close().await;
    format!("redb://{}", copy.display())
}

/// A `repair` that opened a redb file read-write (one its writer left open) and whose output
/// then fails says that it did (which repaired it, and may have migrated it), on a full disk
/// and on a closed pipe; one that only read its file (SQLite's, or a redb file closed cleanly)
/// has nothing to add to the failure (silent on a closed pipe).
#[tokio::test]
async fn a_repair_whose_output_fails_says_it_opened_the_file_read_write() {
    for (kind, code, why) in [
        (
            io::ErrorKind::StorageFull,
            awareness_cli::EXIT_FAILURE,
            "cannot write output",
        ),
        (
            io::ErrorKind::BrokenPipe,
            awareness_cli::EXIT_CLOSED_PIPE,
            "the output's reader went away",
        ),
    ] {
        for (scheme, crashed) in [("redb", true), ("redb", false), ("sqlite", false)] {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("{scheme}://{}", dir.path().join("s.db").display());
            human(&url, C1).await;
            for json in [false, true] {
                let url = if crashed {
                    left_open(&url, dir.path(), &format!("crashed-{json}.db")).await
                } else {
                    url.clone()
                };
                let mut out = FailsAfter::at_once(kind);
                let mut err = Vec::new();
                let args: &[&str] = if json {
                    &["--json", "repair"]
                } else {
                    &["repair"]
                };
                let got = run_into(&url, args, &mut out, &mut err).await;
                let err = String::from_utf8_lossy(&err);
                let what = format!("{scheme} (crashed {crashed}) {kind} (json {json})");
                assert_eq!(got, code, "{what}: {err}");
                if crashed {
                    assert!(
                        err.contains(&format!(
                            "awareness: opened {url} read-write and closed it cleanly"
                        )) && err.contains(&format!(", but {why}")),
                        "{what}: {err}"
                    );
                } else if kind == io::ErrorKind::BrokenPipe {
                    assert!(err.is_empty(), "{what}: {err}");
                } else {
                    assert_eq!(
                        err.trim_end(),
                        "awareness: cannot write output: the output failed",
                        "{what}"
                    );
                }
            }
        }
    }
}

/// A notice names its target's agent, on every command that prints notices: a watcher of a
/// bare key under another agent (`global` of agent ops) must know which session to reconcile,
/// as `status global` alone reads agent main's. The notice's text, the protocol's, names the
/// key only; the JSON says `targetAgent`, and the text line says `(agent ops)`.
#[tokio::test]
async fn a_notice_names_its_targets_agent() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    let ops = "agent:ops:main";
    ok(&url, &["watch", ops, "global"]).await;
    let record = |json: bool| {
        let mut args = vec![
            "record",
            "--session",
            "global",
            "--agent",
            "ops",
            "--kind",
            "human_direct_message",
            "--actor-type",
            "human",
            "--summary",
            "human message via cli",
        ];
        if json {
            args.insert(0, "--json");
        }
        args
    };
    let said = |v: &Value| {
        let notices = v.as_array().expect("a JSON array of notices");
        assert_eq!(notices.len(), 1, "{v}");
        let n = &notices[0];
        assert_eq!(n["watcher"], ops, "{v}");
        assert_eq!(n["target"], "global", "{v}");
        assert_eq!(n["targetAgent"], "ops", "{v}");
        // The fields it had are kept as they were.
        assert!(n["contextKey"].is_string() && n["text"].is_string(), "{v}");
    };

    // `record`: the notices of the recording, in a text line, then (once acknowledged) in
    // JSON.
    let out = ok(&url, &record(false)).await;
    assert!(
        out.lines()
            .any(|l| l.starts_with("agent:ops:main <- ") && l.ends_with(" (agent ops)")),
        "{out}"
    );
    ok(&url, &["ack", ops, "global"]).await;
    let out = ok(&url, &record(true)).await;
    let v: Value = serde_json::from_str(&out).expect("JSON");
    said(&v["notices"]);
    // `sweep`: the pending notice, re-frozen.
    let v: Value = serde_json::from_str(&ok(&url, &["--json", "sweep"]).await).expect("JSON");
    said(&v);
    let out = ok(&url, &["sweep"]).await;
    assert!(
        out.starts_with("agent:ops:main <- Session \"global\" changed")
            && out.trim_end().ends_with(" (agent ops)"),
        "{out}"
    );
    // `ack`: the follow-up of a change after the notice.
    ok(&url, &record(false)).await;
    let v: Value =
        serde_json::from_str(&ok(&url, &["--json", "ack", ops, "global"]).await).expect("JSON");
    said(&v);
}

/// A notice names its target's agent, not its watcher's, in JSON (`targetAgent`) and in its text
/// line (`(agent ops)`): main's watcher of `global` under agent ops, from `record` and `sweep`
/// (the test above has a watcher of agent ops, where the two agree). (What the mutations did:
/// the watcher's agent, `main`, sending the watcher to reconcile the wrong session; review of
/// stop 64, CL18, in JSON, and of stop 68, CD20, in the text line alone.)
#[tokio::test]
async fn a_notice_names_its_targets_agent_not_its_watchers() {
    for json in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        ok(&url, &["watch", MAIN, "global", "--agent", "ops"]).await;
        let record = [
            "record",
            "--session",
            "global",
            "--agent",
            "ops",
            "--kind",
            "human_direct_message",
            "--actor-type",
            "human",
            "--summary",
            "human message via cli",
        ];
        if json {
            let out = ok(&url, &[&["--json"], &record[..]].concat()).await;
            let v: Value = serde_json::from_str(&out).expect("JSON");
            assert_eq!(v["notices"][0]["watcher"], MAIN, "{v}");
            assert_eq!(v["notices"][0]["targetAgent"], "ops", "record: {v}");
            let v: Value =
                serde_json::from_str(&ok(&url, &["--json", "sweep"]).await).expect("JSON");
            assert_eq!(v[0]["targetAgent"], "ops", "sweep: {v}");
        } else {
            let line = |out: &str| {
                out.lines()
                    .find(|l| l.starts_with(&format!("{MAIN} <- ")))
                    .map_or_else(|| panic!("no notice line: {out}"), str::to_owned)
            };
            let out = ok(&url, &record).await;
            assert!(line(&out).ends_with(" (agent ops)"), "record: {out}");
            let out = ok(&url, &["sweep"]).await;
            assert!(line(&out).ends_with(" (agent ops)"), "sweep: {out}");
        }
    }
}

/// A command that wrote to the store and whose output then fails (a full disk) says what it
/// wrote, in text and JSON alike: a `watch` (the cursor written), a `sweep` (how many notices
/// it found, since it re-froze their cursors), a real `prune` (what it deleted), an `unwatch`
/// (the cursor removed), an `adopt` (the link and its `adopted` event). (What the mutations
/// did: only "cannot write output", the write made unsaid; review of stop 64, CL26, for the
/// sweep, of stop 66, C612, C625 and C613, and of stop 70, CZ05 and CZ06 for `adopt` in JSON
/// and in text.) A `record` that hits its dedupe key says the event was already recorded, not
/// that it recorded one, which would read as a second event. (What the mutation did: a dedupe
/// hit said "recorded event #1"; review of stop 72, CK11.)
#[tokio::test]
async fn a_write_whose_output_fails_says_what_it_did() {
    for json in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let transcript = dir.path().join("5f1c2e3a.jsonl");
        std::fs::write(&transcript, "").unwrap();
        let file = transcript.display().to_string();
        let record = [
            "record",
            "--session",
            C1,
            "--kind",
            "goal_changed",
            "--summary",
            "new goal",
            "--dedupe-key",
            "goal-1",
        ];
        for (command, said) in [
            ("record", "event #1 was already recorded (dedupe hit)"),
            (
                "watch",
                "agent:main:main watches agent:main:subagent:c1 now",
            ),
            ("sweep", "the sweep found 1 notice(s)"),
            (
                "prune",
                "deleted 0 event(s) by age, 0 by the row cap, 0 idle cursor(s), in ",
            ),
            (
                "unwatch",
                "removed the cursor of agent:main:main on agent:main:subagent:c1",
            ),
            (
                "adopt",
                "adopted agent:main:subagent:c1 (agent main): its link and",
            ),
        ] {
            if command == "sweep" {
                human(&url, C1).await;
            }
            let mut args = vec![command];
            if command == "record" {
                ok(&url, &record).await;
                args = record.to_vec();
            }
            if matches!(command, "watch" | "unwatch") {
                args.extend([MAIN, C1]);
            }
            if command == "adopt" {
                args.extend([C1, "--file", &file]);
            }
            if json {
                args.insert(0, "--json");
            }
            let mut out = FailsAfter::at_once(io::ErrorKind::StorageFull);
            let mut err = Vec::new();
            let got = run_into(&url, &args, &mut out, &mut err).await;
            let err = String::from_utf8_lossy(&err);
            assert_eq!(
                got,
                awareness_cli::EXIT_FAILURE,
                "{command} json {json}: {err}"
            );
            let line = err.lines().next().unwrap_or_default();
            assert!(
                line.starts_with(&format!("awareness: {said}"))
                    && line.contains(", but cannot write output"),
                "{command} json {json}: {err}"
            );
        }
    }
}
