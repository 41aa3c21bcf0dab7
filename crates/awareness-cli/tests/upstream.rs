//! `awareness adopt` and `awareness monitor` as a user runs them: adopt a Claude Code
//! transcript on a SQLite store, run the monitor in the foreground, type into the transcript,
//! see the detection printed, stop it with Ctrl-C (SIGINT), and read the recorded event.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

/// The binary, with its log at the default level whatever the environment says. On Linux it is
/// started through GNU `env` with SIGHUP, SIGINT and SIGTERM at their default action: the tests
/// stop it with them, and it leaves a signal it inherited as ignored ignored (a test runner
/// started in the background, or under `nohup`, passes those on). Elsewhere (no `/proc`, so
/// the binary installs every handler, and perhaps no GNU `env`) it is started as it is.
fn bin() -> Command {
    if cfg!(target_os = "linux") {
        started_with("--default-signal=HUP,INT,TERM")
    } else {
        let mut c = Command::new(env!("CARGO_BIN_EXE_awareness"));
        c.env_remove("AWARENESS_LOG");
        c
    }
}

/// The binary started through `env` with `signals` (an `env` option that sets dispositions).
fn started_with(signals: &str) -> Command {
    let mut c = Command::new("env");
    c.arg(signals).arg(env!("CARGO_BIN_EXE_awareness"));
    c.env_remove("AWARENESS_LOG");
    c
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run awareness")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn human_line(path: &Path, uuid: &str, said: &str) {
    let row = json!({"type": "user", "isSidechain": false, "uuid": uuid,
        "timestamp": "2026-11-30T10:00:00Z", "message": {"role": "user", "content": said}});
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    writeln!(f, "{row}").unwrap();
}

/// Kills the child on drop unless it has exited (a test that fails midway leaves no process).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl KillOnDrop {
    /// Waits for the child to exit, for at most the testkit's hang guard
    /// ([`awareness_core::testkit::open::exit_within`]): still running then, it is killed and the
    /// test fails saying `what` it was told, instead of blocking the suite.
    fn wait_stopped(&mut self, what: &str) -> std::process::ExitStatus {
        awareness_core::testkit::open::exit_within(&mut self.0).unwrap_or_else(|| {
            panic!(
                "still running {:?} after {what}: killed (it hung instead of stopping)",
                awareness_core::testkit::open::CHILD_DEADLINE
            )
        })
    }
}

/// A running child and its stdout, line by line (the thread reading it ends at EOF); the child
/// is killed if the test fails before it exits.
struct Reading {
    child: KillOnDrop,
    lines: (mpsc::Receiver<String>, std::thread::JoinHandle<()>),
}

trait SpawnReading {
    /// Spawns with stdout piped, read line by line on a thread of its own.
    fn spawn_reading(&mut self) -> std::io::Result<Reading>;
}

impl SpawnReading for Command {
    fn spawn_reading(&mut self) -> std::io::Result<Reading> {
        let mut child = self.stdout(Stdio::piped()).spawn()?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Reading {
            child: KillOnDrop(child),
            lines: (lines, reader),
        })
    }
}

/// Waits for a line containing `needle`, returning every line seen up to it.
fn wait_for(lines: &mpsc::Receiver<String>, needle: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => {
                let hit = l.contains(needle);
                seen.push(l);
                if hit {
                    return seen;
                }
            }
            Err(e) => panic!("no line with {needle:?} ({e}); saw {seen:#?}"),
        }
    }
}

#[test]
fn adopt_then_monitor_prints_detections_and_stops_on_ctrl_c() {
    for scheme in ["sqlite", "redb"] {
        adopt_then_monitor_on(scheme);
    }
}

/// Adopts a transcript on a new store of `scheme` and runs the monitor; read commands work while
/// it runs.
fn adopt_then_monitor_on(scheme: &str) {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("{scheme}://{}", dir.path().join("state.db").display());
    let transcript = dir.path().join("5f1c2e3a.jsonl");
    std::fs::File::create(&transcript).unwrap();
    human_line(&transcript, "h0", "history from before the adoption");
    let file = transcript.to_str().unwrap();

    let o = adopt_watched(&store, file);
    let out = text(&o);
    assert!(
        out.contains("adopted agent:main:worker (agent main) from claude-code (new link)"),
        "{out}"
    );
    assert!(out.contains("(thread 5f1c2e3a)"), "{out}");
    assert!(out.contains("watched by agent:main:main"), "{out}");
    // Adopting the same transcript again keeps the link as it is.
    let o = run(&[
        "--store",
        &store,
        "--json",
        "adopt",
        "agent:main:worker",
        "--file",
        file,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let again: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (&again["created"], &again["rebased"]),
        (&json!(false), &json!(false))
    );
    assert_eq!(again["link"]["upstreamKind"], json!("local-jsonl"));

    let Reading {
        mut child,
        lines: (lines, reader),
    } = bin()
        .args([
            "--store",
            &store,
            "monitor",
            "--first-tick-secs",
            "2",
            "--interval-secs",
            "1",
        ])
        .stderr(Stdio::piped())
        .spawn_reading()
        .unwrap();
    wait_for(&lines, "monitoring 1 adopted session(s)");
    // Typed before the first check (2 s), so one event normally holds both; a slow machine may
    // see them in two checks, so count the turns of every detection.
    human_line(&transcript, "h1", "actually, keep the old endpoint");
    human_line(&transcript, "h2", "and add a test for it");
    let prefix = "human: agent:main:worker (agent main): ";
    let mut turns = 0;
    while turns < 2 {
        let seen = wait_for(&lines, prefix);
        let line = seen.last().unwrap();
        assert!(line.contains(" turn(s) via claude-code, event #"), "{line}");
        let n: u32 = line[prefix.len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        turns += n;
    }
    assert_eq!(turns, 2);
    // A read command beside the running monitor, which keeps the file open.
    let o = run(&["--store", &store, "--json", "status", "agent:main:worker"]);
    assert!(
        o.status.success(),
        "{store}: status beside the monitor: {}",
        text(&o)
    );
    let status: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(status["stateVersion"].as_u64() >= Some(2), "{status}");
    let killed = Command::new("kill")
        .args(["-INT", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait_stopped("SIGINT (Ctrl-C) to the monitor");
    reader.join().unwrap();
    let rest: Vec<String> = lines.try_iter().collect();
    assert!(
        status.success(),
        "Ctrl-C stops it cleanly: {status:?}, {rest:?}"
    );
    assert_eq!(
        rest.last().map(String::as_str),
        Some("monitor stopped"),
        "{rest:?}"
    );

    // Stopped by Ctrl-C, the monitor closed its store: the file alone, copied without
    // SQLite's write-ahead log, holds every detection it recorded.
    let copy = dir.path().join("copy.db");
    std::fs::copy(dir.path().join("state.db"), &copy).unwrap();
    let copied = format!("{scheme}://{}", copy.display());
    let o = run(&["--store", &copied, "--json", "status", "agent:main:worker"]);
    assert!(o.status.success(), "{copied}: {}", text(&o));
    let alone: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(alone["stateVersion"].as_u64() >= Some(2), "{alone}");

    // The event is in the store, once, with the burst size; the watcher has a pending notice.
    let o = run(&[
        "--store",
        &store,
        "--json",
        "status",
        "agent:main:worker",
        "--changes-since",
        "0",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let status: Value = serde_json::from_slice(&o.stdout).unwrap();
    let events = status["stateChanges"]["events"].as_array().unwrap();
    assert_eq!(events[0]["kind"], json!("adopted"), "{status}");
    assert_eq!(events[0]["summary"], json!("adopted from claude-code"));
    let human: Vec<&Value> = events[1..]
        .iter()
        .filter(|e| e["kind"] == json!("human_direct_message"))
        .collect();
    assert_eq!(human.len(), events.len() - 1, "{status}");
    for e in &human {
        assert_eq!(e["summary"], json!("human message via claude-code"));
    }
    if let [one] = human.as_slice() {
        assert_eq!(one["payload"], json!({"turns": 2}));
    }
    let o = run(&["--store", &store, "--json", "cursors", "--pending"]);
    let pending: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(pending.as_array().unwrap().len(), 1, "{pending}");
}

/// The lines of a reader, read on a thread of their own (which ends at EOF).
fn lines_of(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// A warning the library logs from the monitor's own task (a worker thread) reaches stderr, and
/// the monitor goes on: here a check that fails because the transcript became a directory. The
/// binary had no subscriber, so the warning went nowhere; and it held stderr locked for the
/// whole run, so a subscriber writing from another thread would have blocked the monitor's
/// task for good (the detection never printed, Ctrl-C never ending it).
#[test]
fn a_check_that_fails_in_the_monitor_task_warns_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("state.db").display());
    let transcript = dir.path().join("t.jsonl");
    std::fs::File::create(&transcript).unwrap();
    adopt_watched(&store, transcript.to_str().unwrap());
    std::fs::remove_file(&transcript).unwrap();
    std::fs::create_dir(&transcript).unwrap();

    let mut child = KillOnDrop(
        bin()
            .args([
                "--store",
                &store,
                "monitor",
                "--first-tick-secs",
                "0",
                "--interval-secs",
                "1",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let out = lines_of(child.0.stdout.take().unwrap());
    let err = lines_of(child.0.stderr.take().unwrap());
    wait_for(&out, "failed: agent:main:worker (agent main): reading ");
    let warned = wait_for(&err, "upstream check failed");
    let line = warned.last().unwrap();
    assert!(
        line.starts_with("awareness: WARN gateway_adapter::upstream::monitor: ")
            && line.contains("session_key=agent:main:worker"),
        "{warned:?}"
    );
    let killed = Command::new("kill")
        .args(["-INT", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_for(&out, "monitor stopped");
    let status = child.wait_stopped("SIGINT, once the monitor said it stopped");
    assert!(status.success(), "{status:?}");
}

/// `adopt` refuses a transcript that is not there (exit 1), and a watcher that is bare or the
/// adopted session itself (a usage error, exit 2), the self-watch checked before the store is
/// opened, so that nothing is created. (The self-watch refused only after the store was created
/// and the adoption recorded, with exit 1, passed every test: review of stop 63, L19.)
#[test]
fn adopt_refuses_a_missing_file_a_bare_watcher_and_a_self_watch() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("state.db").display());
    let missing = dir.path().join("nope.jsonl");
    let o = run(&[
        "--store",
        &store,
        "adopt",
        "agent:main:worker",
        "--file",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("cannot read"), "{}", text(&o));
    let file = dir.path().join("t.jsonl");
    std::fs::File::create(&file).unwrap();
    let o = run(&[
        "--store",
        &store,
        "adopt",
        "agent:main:worker",
        "--file",
        file.to_str().unwrap(),
        "--watcher",
        "main",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let untouched = dir.path().join("untouched.db");
    let o = run(&[
        "--store",
        &format!("sqlite://{}", untouched.display()),
        "adopt",
        "agent:main:worker",
        "--file",
        file.to_str().unwrap(),
        "--watcher",
        "agent:main:worker",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!untouched.exists(), "no store is created: {}", text(&o));
}

/// A `monitor` whose output fails on the line of a detection it recorded says on stderr what it
/// recorded, as every write command does: on a full disk (exit 1), and on a closed pipe (141),
/// which otherwise ends it without a word. The event is in the store either way.
#[cfg(target_os = "linux")]
#[test]
fn a_monitor_whose_output_fails_says_what_it_recorded() {
    for closed_pipe in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = format!("sqlite://{}", dir.path().join("state.db").display());
        let transcript = dir.path().join("5f1c2e3a.jsonl");
        std::fs::File::create(&transcript).unwrap();
        adopt_watched(&store, transcript.to_str().unwrap());
        // Typed after the adoption, before the monitor starts: its first check finds it, and
        // its line (JSON: there is no line before it) is the first write to the output.
        human_line(&transcript, "h1", "typed straight into the thread");
        let mut monitor = bin();
        monitor
            .args([
                "--store",
                &store,
                "--json",
                "monitor",
                "--first-tick-secs",
                "0",
            ])
            .stderr(Stdio::piped());
        if closed_pipe {
            monitor.stdout(Stdio::piped());
        } else {
            let full = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .expect("open /dev/full");
            monitor.stdout(full);
        }
        let mut child = KillOnDrop(monitor.spawn().unwrap());
        if closed_pipe {
            // The reader is gone before anything is printed.
            drop(child.0.stdout.take());
        }
        let stderr = lines_of(child.0.stderr.take().expect("stderr is piped"));
        let mut said = Vec::new();
        loop {
            match stderr.recv_timeout(Duration::from_secs(30)) {
                Ok(line) => said.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("closed pipe {closed_pipe}: the monitor did not stop: {said:?}")
                }
            }
        }
        let status = child.wait_stopped(&format!(
            "closing its stderr (closed pipe {closed_pipe}), its output failing"
        ));
        let (code, why) = if closed_pipe {
            (141, "the output's reader went away")
        } else {
            (1, "cannot write output: ")
        };
        assert_eq!(status.code(), Some(code), "{said:?}");
        let want = format!(
            "awareness: recorded event #2 (human turns) for agent:main:worker (agent main), \
             but {why}"
        );
        assert!(
            said.iter().any(|l| l.starts_with(&want)),
            "closed pipe {closed_pipe}: {said:?}"
        );
        let o = run(&["--store", &store, "--json", "status", "agent:main:worker"]);
        let status: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(status["stateVersion"], json!(2), "{status}");
    }
}

/// Runs `sql` on the SQLite file at `path` behind the CLI's back.
fn edit_by_hand(path: &Path, sql: &str) {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        use sqlx::Connection as _;
        let url = format!("sqlite://{}", path.display());
        let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut c)
            .await
            .unwrap();
        c.close().await.unwrap();
    });
}

/// Bug (review, stop 55): the `adopted` event's dedupe key names the session key alone
/// (`adopted:<key>`, DESIGN.md section 3), so after agent `main` adopted `global`, agent `ops`
/// adopting its own `global` recorded nothing, and `adopt` exited 0 reporting `main`'s event as
/// its own. It now says the link is in place and watched, that the event cannot be recorded
/// and why, and exits 1 (without advising to run it again, which would change nothing). The
/// watch asked for is made (a first fix left it out while saying the link was monitored: the
/// monitor checks watched links only).
#[test]
fn adopt_says_when_another_agents_adopted_event_holds_its_dedupe_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("state.db").display());
    let transcript = dir.path().join("t.jsonl");
    std::fs::File::create(&transcript).unwrap();
    let adopt = |agent: &str| {
        let watcher = format!("agent:{agent}:main");
        run(&[
            "--store",
            &store,
            "--json",
            "adopt",
            "global",
            "--agent",
            agent,
            "--file",
            transcript.to_str().unwrap(),
            "--watcher",
            &watcher,
        ])
    };
    let o = adopt("main");
    assert!(o.status.success(), "{}", text(&o));
    let o = adopt("ops");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(o.stdout.is_empty(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(
            "the link of global (agent ops) is in place and agent:ops:main watches it, but its \
             `adopted` event cannot be recorded: its dedupe key `adopted:global` is taken by \
             the `adopted` event #1 of global (agent main)"
        ) && !err.contains("run `adopt` again"),
        "{err}"
    );
    let o = run(&[
        "--store",
        &store,
        "--json",
        "cursors",
        "--watcher",
        "agent:ops:main",
    ]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    assert_eq!(
        v.as_array().map(Vec::len),
        Some(1),
        "the watch is made: {v}"
    );
    // Nothing was recorded for `ops`'s session: its log is empty.
    let o = run(&["--store", &store, "status", "global", "--agent", "ops"]);
    assert!(text(&o).contains("unknown session"), "{}", text(&o));
}

/// `adopt agent:main:worker --file FILE --watcher agent:main:main` on `store`, which succeeds.
fn adopt_watched(store: &str, file: &str) -> Output {
    let o = adopt_worker(store, Path::new(file), &["--watcher", "agent:main:main"]);
    assert!(o.status.success(), "{}", text(&o));
    o
}

/// `awareness --store STORE adopt agent:main:worker --file FILE` and `more` arguments.
fn adopt_worker(store: &str, file: &Path, more: &[&str]) -> Output {
    let file = file.to_str().unwrap();
    let args = [
        "--store",
        store,
        "adopt",
        "agent:main:worker",
        "--file",
        file,
    ];
    run(&[&args[..], more].concat())
}

/// In `dir`: a SQLite store's file and URL (not created yet), and an empty transcript.
fn store_and_transcript(dir: &Path) -> (PathBuf, String, PathBuf) {
    let db = dir.join("state.db");
    let store = format!("sqlite://{}", db.display());
    let transcript = dir.join("t.jsonl");
    std::fs::File::create(&transcript).unwrap();
    (db, store, transcript)
}

/// `adopt` records `adopted` best effort through the library, and says when it could not: the
/// link is in place, the command exits 1 naming the event, and adopting again, once the store
/// takes writes of it, records it once. It exited 0 with the event missing.
#[test]
fn adopt_fails_when_its_adopted_event_is_not_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let (db, store, transcript) = store_and_transcript(dir.path());
    let adopt = [
        "--store",
        &store,
        "--json",
        "adopt",
        "agent:main:worker",
        "--file",
        transcript.to_str().unwrap(),
    ];
    // Creates the store (an unrelated event), then refuses every `adopted` row.
    let o = run(&[
        "--store",
        &store,
        "record",
        "--session",
        "agent:main:other",
        "--kind",
        "created",
        "--actor-type",
        "system",
        "--summary",
        "session created",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    edit_by_hand(
        &db,
        "CREATE TRIGGER refuse_adopted BEFORE INSERT ON session_state_events \
         WHEN NEW.kind = 'adopted' BEGIN SELECT RAISE(ABORT, 'adopted refused by the test'); END;",
    );
    let o = run(&adopt);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("adopted refused by the test")
            && err.contains("the link of agent:main:worker (agent main) is in place")
            && err.contains("run `adopt` again"),
        "{err}"
    );
    // With a watcher, the refusal also says that the watch was not made.
    let o = run(&[&adopt[..], &["--watcher", "agent:main:main"]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("and agent:main:main does not watch it yet; run `adopt` again"),
        "{err}"
    );
    let status = ["--store", &store, "--json", "status", "agent:main:worker"];
    let o = run(&status);
    assert!(text(&o).contains("unknown session"), "{}", text(&o));

    edit_by_hand(&db, "DROP TRIGGER refuse_adopted;");
    for _ in 0..2 {
        let o = run(&adopt);
        assert!(o.status.success(), "{}", text(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["created"], json!(false), "{v}");
        assert_eq!(v["adoptedSequence"], json!(2), "{v}");
    }
    let v: Value = serde_json::from_slice(&run(&status).stdout).unwrap();
    assert_eq!(v["stateVersion"], json!(2), "{v}");
    // One recording per adoption: the first stored 2, the second was a dedupe hit that spent
    // 3 (DESIGN.md: a hit spends a sequence). Asking for the event by recording it a second
    // time spent two more.
    let o = run(&[
        "--store",
        &store,
        "--json",
        "record",
        "--session",
        "agent:main:other",
        "--kind",
        "created",
        "--actor-type",
        "system",
        "--summary",
        "session created",
    ]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    assert_eq!(v["event"]["sequence"], json!(4), "{v}");

    // A store error says its cause, as every other command's does: it said only
    // "store backend error: adopt a session (upstream link)".
    edit_by_hand(
        &db,
        "CREATE TRIGGER refuse_links BEFORE INSERT ON session_upstream_links \
         BEGIN SELECT RAISE(ABORT, 'links refused by the test'); END;",
    );
    let o = run(&[
        "--store",
        &store,
        "adopt",
        "agent:main:second",
        "--file",
        transcript.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("links refused by the test"),
        "{}",
        text(&o)
    );
}

/// `monitor` running on `store` (no link adopted), once `record` created the store with one
/// human message in `agent:main:worker`.
fn monitor_after_one_event(store: &str) -> Reading {
    one_event(store);
    let monitor = bin()
        .args(["--store", store, "monitor"])
        .stderr(Stdio::null())
        .spawn_reading()
        .unwrap();
    wait_for(&monitor.lines.0, "monitoring 0 adopted session(s)");
    monitor
}

/// `monitor`'s first line is one line whatever the store's name holds: a path with a line
/// break printed as it was, and the header could be read as two lines (the second forged by
/// whoever chose the name).
#[test]
fn monitor_names_its_store_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!(
        "sqlite://{}",
        dir.path().join("a\nmonitoring 9 forged").display()
    );
    one_event(&store);
    let Reading {
        mut child,
        lines: (lines, reader),
    } = bin()
        .args(["--store", &store, "monitor"])
        .stderr(Stdio::null())
        .spawn_reading()
        .unwrap();
    let header = wait_for(&lines, "monitoring 0 adopted session(s)");
    let _ = child.0.kill();
    let _ = child.0.wait();
    reader.join().unwrap();
    let rest: Vec<String> = lines.try_iter().collect();
    assert_eq!(header.len(), 1, "{header:?}");
    assert!(
        header[0].contains("a\\nmonitoring 9 forged: first check in"),
        "the break is printed as an escape: {header:?}"
    );
    assert!(
        rest.iter().all(|l| !l.starts_with("monitoring 9 forged")),
        "{rest:?}"
    );
}

/// `adopt` prints the transcript's path on one line whatever it holds: a file name with a line
/// break was printed as it was (the thread and catalog are refused with one).
#[test]
fn adopt_names_its_transcript_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("state.db").display());
    let transcript = dir.path().join("t\nforged: line.jsonl");
    std::fs::File::create(&transcript).unwrap();
    let o = adopt_worker(&store, &transcript, &["--thread", "t1"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.lines().all(|l| !l.starts_with("forged: line")), "{out}");
    assert!(out.contains("t\\nforged: line.jsonl (thread t1)"), "{out}");
}

/// `adopt` without `--watcher` says who already watches the session (a cursor OpenClaw or
/// `watch` made), and that nothing does when nothing does; `--json` lists them as `watchedBy`.
/// It said "nothing is known to watch it" whenever `--watcher` was left out, telling an
/// operator to add a watch the monitor did not need (review, stop 58).
#[test]
fn adopt_names_the_watchers_a_session_already_has() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("state.db").display());
    let transcript = dir.path().join("t.jsonl");
    std::fs::File::create(&transcript).unwrap();
    let adopt = |session: &str, json: bool| {
        let mut args = vec!["--store", &store];
        if json {
            args.push("--json");
        }
        args.extend([
            "adopt",
            session,
            "--file",
            transcript.to_str().unwrap(),
            "--thread",
            session,
        ]);
        let o = run(&args);
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let out = adopt("agent:main:lonely", false);
    assert!(
        out.contains("  nothing watches it yet: `awareness monitor` checks watched sessions only"),
        "{out}"
    );
    for watcher in ["agent:main:main", "agent:main:subagent:planner"] {
        let o = run(&["--store", &store, "watch", watcher, "agent:main:worker"]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let out = adopt("agent:main:worker", false);
    assert!(
        out.contains("  watched by agent:main:main, agent:main:subagent:planner\n"),
        "{out}"
    );
    assert!(!out.contains("nothing"), "{out}");
    let v: Value = serde_json::from_str(&adopt("agent:main:worker", true)).unwrap();
    assert_eq!(
        v["watchedBy"],
        json!(["agent:main:main", "agent:main:subagent:planner"]),
        "{v}"
    );
    assert_eq!(v["watcher"], Value::Null, "{v}");
}

/// `record` creates `store` with one human message in `agent:main:worker`.
fn one_event(store: &str) {
    let o = run(&[
        "--store",
        store,
        "record",
        "--session",
        "agent:main:worker",
        "--kind",
        "human_direct_message",
        "--actor-type",
        "human",
        "--summary",
        "human message via cli",
    ]);
    assert!(o.status.success(), "{}", text(&o));
}

/// SIGTERM (a service manager, `kill`, `timeout`) and SIGHUP (a closed terminal) stop `monitor`
/// as Ctrl-C does: it closes its store, so a redb file needs no `repair` before read commands
/// take it. Both killed the process with the file left open.
#[test]
fn monitor_stops_cleanly_on_sigterm_and_sighup() {
    for signal in ["-TERM", "-HUP"] {
        let dir = tempfile::tempdir().unwrap();
        let store = format!("redb://{}", dir.path().join("state.redb").display());
        let Reading {
            mut child,
            lines: (lines, reader),
        } = monitor_after_one_event(&store);
        let sent = Command::new("kill")
            .args([signal, &child.0.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        wait_for(&lines, "monitor stopped");
        let status =
            child.wait_stopped(&format!("kill {signal}, once the monitor said it stopped"));
        reader.join().unwrap();
        assert!(status.success(), "{signal}: {status:?}");
        let o = run(&["--store", &store, "--json", "status", "agent:main:worker"]);
        assert!(
            o.status.success(),
            "{signal}: no repair needed: {}",
            text(&o)
        );
    }
}

/// The signals of `/proc/<pid>/status` line `name` (`SigIgn`, `SigCgt`) as a bit set, bit
/// `n - 1` for signal `n`.
#[cfg(target_os = "linux")]
fn signal_line(pid: u32, name: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} line in {status}"));
    u64::from_str_radix(hex.trim(), 16).unwrap()
}

/// `monitor` and `tail --follow` started with SIGHUP and SIGINT ignored (`nohup`, or a job a
/// script put in the background) leave them ignored, and SIGTERM still stops them cleanly.
/// They installed their handlers over the inherited `SIG_IGN`, so `nohup awareness monitor`
/// stopped when its terminal closed.
#[cfg(target_os = "linux")]
#[test]
fn signals_ignored_at_start_stay_ignored() {
    const HUP: u64 = 1;
    const INT: u64 = 1 << 1;
    const TERM: u64 = 1 << 14;
    for command in ["monitor", "tail"] {
        let dir = tempfile::tempdir().unwrap();
        let store = format!("redb://{}", dir.path().join("state.redb").display());
        one_event(&store);
        let mut started = started_with("--ignore-signal=HUP,INT");
        started.args(["--store", &store]);
        match command {
            "monitor" => started.arg("monitor"),
            _ => started.args(["--json", "tail", "--follow"]),
        };
        let Reading {
            mut child,
            lines: (lines, reader),
        } = started.stderr(Stdio::null()).spawn_reading().unwrap();
        let ready = match command {
            "monitor" => "monitoring 0 adopted session(s)",
            _ => "human message via cli",
        };
        wait_for(&lines, ready);
        let pid = child.0.id();
        // The handlers are installed before the first line is printed.
        let (ignored, caught) = (signal_line(pid, "SigIgn"), signal_line(pid, "SigCgt"));
        assert_eq!(
            ignored & (HUP | INT),
            HUP | INT,
            "{command}: ignored {ignored:x}"
        );
        assert_eq!(caught & (HUP | INT), 0, "{command}: handles {caught:x}");
        assert_eq!(caught & TERM, TERM, "{command}: handles {caught:x}");
        for signal in ["-HUP", "-INT", "-TERM"] {
            let sent = Command::new("kill")
                .args([signal, &pid.to_string()])
                .status()
                .unwrap();
            assert!(sent.success());
        }
        let status = child.wait_stopped(&format!("SIGHUP, SIGINT and SIGTERM to {command}"));
        reader.join().unwrap();
        assert!(
            status.success(),
            "{command}: SIGTERM stops it cleanly: {status:?}"
        );
        if command == "monitor" {
            let rest: Vec<String> = lines.try_iter().collect();
            assert_eq!(
                rest.last().map(String::as_str),
                Some("monitor stopped"),
                "{rest:?}"
            );
        }
    }
}

/// On redb, a write command (`record`, the demo) opens beside `tail --follow`, which keeps the
/// file open read-only, and the tail prints what it recorded: every command that writes opens
/// with live readers. Both were refused ("already open in another process") while a tail ran.
/// The tail prints the new event at its next look at the store (it looks every half second),
/// well within 15 seconds. (What the mutation did: it looked every 30 seconds, so a new event
/// showed half a minute late; review of stop 70, CE44.)
#[test]
fn a_write_command_runs_beside_tail_follow_on_redb() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("redb://{}", dir.path().join("state.redb").display());
    let record = |summary: &str| {
        run(&[
            "--store",
            &store,
            "record",
            "--session",
            "agent:main:worker",
            "--kind",
            "goal_changed",
            "--summary",
            summary,
        ])
    };
    let o = record("goal one");
    assert!(o.status.success(), "{}", text(&o));
    let Reading {
        mut child,
        lines: (lines, reader),
    } = bin()
        .args(["--store", &store, "--json", "tail", "--follow"])
        .stderr(Stdio::null())
        .spawn_reading()
        .unwrap();
    wait_for(&lines, "goal one");
    let o = record("goal two");
    assert!(o.status.success(), "beside the tail: {}", text(&o));
    let next = lines.recv_timeout(Duration::from_secs(15));
    assert!(
        next.as_deref().is_ok_and(|l| l.contains("goal two")),
        "the new event within 15 s: {next:?}"
    );
    let v: Value = serde_json::from_str(&next.unwrap()).unwrap();
    assert_eq!(v["sequence"], json!(2), "{v}");
    let o = run(&["--store", &store, "demo"]);
    assert!(o.status.success(), "demo beside the tail: {}", text(&o));
    let sent = Command::new("kill")
        .args(["-INT", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.wait_stopped("SIGINT (Ctrl-C) to tail --follow");
    assert!(status.success(), "{status:?}");
    reader.join().unwrap();
}

/// A redb file of the older schema (1): read commands refuse it and point to `repair`, which
/// migrates it (`"repaired": true`); read commands then take it, with what it held. (The
/// hint named only a file left open.)
#[test]
fn repair_migrates_a_redb_file_of_the_older_schema() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state.redb");
    let store = format!("redb://{}", file.display());
    let o = run(&[
        "--store",
        &store,
        "record",
        "--session",
        "agent:main:worker",
        "--kind",
        "created",
        "--actor-type",
        "system",
        "--summary",
        "created",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        store_redb::RedbStore::rewrite_as_schema_1(&file).expect("rewrite as schema 1"),
        1,
        "the session's head moved out of the reference index"
    );
    let status = ["--store", &store, "--json", "status", "agent:main:worker"];
    let o = run(&status);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("schema 1") && text(&o).contains("awareness repair"),
        "{}",
        text(&o)
    );
    let o = run(&["--store", &store, "--json", "repair"]);
    assert!(o.status.success(), "repair: {}", text(&o));
    let repaired: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(repaired, json!({"ok": true, "repaired": true, "events": 1}));
    let o = run(&status);
    assert!(o.status.success(), "status after repair: {}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["stateVersion"], json!(1));
}

/// A store whose writer was killed: on redb, read commands refuse it ("not closed cleanly")
/// until `repair` opens it read-write once; SQLite needs no repair, and `repair` leaves its
/// store answering the same. A file that needs no repair (SQLite's; the redb file once
/// repaired) is only read: `"repaired": false`, and its bytes as they were. The writer killed here is `monitor`, which keeps the file open.
#[test]
fn repair_lets_read_commands_in_after_a_killed_writer() {
    for scheme in ["redb", "sqlite"] {
        let dir = tempfile::tempdir().unwrap();
        let store = format!("{scheme}://{}", dir.path().join("state.db").display());
        let Reading {
            mut child,
            lines: (_, reader),
        } = monitor_after_one_event(&store);
        child.0.kill().expect("SIGKILL the monitor");
        child.0.wait().unwrap();
        reader.join().unwrap();

        let status = ["--store", &store, "--json", "status", "agent:main:worker"];
        let o = run(&status);
        if scheme == "redb" {
            assert_eq!(o.status.code(), Some(1), "{}", text(&o));
            assert!(text(&o).contains("not closed cleanly"), "{}", text(&o));
            assert!(text(&o).contains("awareness repair"), "{}", text(&o));
        } else {
            assert!(o.status.success(), "{}", text(&o));
        }
        let o = run(&["--store", &store, "--json", "repair"]);
        assert!(o.status.success(), "{scheme}: repair: {}", text(&o));
        let repaired: Value = serde_json::from_slice(&o.stdout).unwrap();
        let reopened = scheme == "redb";
        assert_eq!(
            repaired,
            json!({"ok": true, "repaired": reopened, "events": 1})
        );
        let o = run(&status);
        assert!(
            o.status.success(),
            "{scheme}: status after repair: {}",
            text(&o)
        );
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["stateVersion"], json!(1));
        // Repaired, the file needs nothing more: a second repair only reads it, and says so.
        let file = dir.path().join("state.db");
        let before = std::fs::read(&file).unwrap();
        let o = run(&["--store", &store, "--json", "repair"]);
        assert!(o.status.success(), "{scheme}: repair again: {}", text(&o));
        let again: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            again,
            json!({"ok": true, "repaired": false, "events": 1}),
            "{scheme}"
        );
        assert!(
            std::fs::read(&file).unwrap() == before,
            "{scheme}: a repair of a file that needed none changed it"
        );
        let o = run(&["--store", &store, "repair"]);
        assert!(
            text(&o).contains("checked read-only, unchanged"),
            "{scheme}: {}",
            text(&o)
        );
    }
    // repair never creates a store, and leaves what is not one as it was.
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("other.sqlite");
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        use sqlx::Connection as _;
        let url = format!("sqlite://{}?mode=rwc", foreign.display());
        let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::query("CREATE TABLE foo(x)")
            .execute(&mut c)
            .await
            .unwrap();
        c.close().await.unwrap();
    });
    for scheme in ["redb", "sqlite"] {
        let missing = dir.path().join(format!("missing.{scheme}"));
        let empty = dir.path().join(format!("empty.{scheme}"));
        std::fs::write(&empty, b"").unwrap();
        for file in [&missing, &empty] {
            let o = run(&[
                "--store",
                &format!("{scheme}://{}", file.display()),
                "repair",
            ]);
            assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        }
        assert!(!missing.exists(), "repair created a {scheme} store");
        assert_eq!(
            std::fs::metadata(&empty).unwrap().len(),
            0,
            "repair wrote into an empty file"
        );
    }
    let before = std::fs::read(&foreign).unwrap();
    let o = run(&[
        "--store",
        &format!("sqlite://{}", foreign.display()),
        "repair",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        std::fs::read(&foreign).unwrap() == before,
        "repair changed another application's database"
    );
    let o = run(&["--store", "memory:", "repair"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// `adopt` says the byte it reads from (the transcript's end), that a session from another file
/// is rebased and one from the same file keeps its link and marker; it lists as watchers only
/// cursors on this agent's session of the key, not another agent's. (The rebase told as "kept",
/// and a watcher of another agent's `global` listed, passed every test: review of stop 60; byte
/// 0 said for any file, and "rebased" for the same source: review of stop 62, C17 and C30;
/// `"rebased": false` in JSON whatever the source: review of stop 63, L21.)
#[test]
fn adopt_says_its_byte_a_rebase_or_a_kept_link_and_lists_only_this_agents_watchers() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("state.db").display());
    let (a, b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    for file in [&a, &b] {
        std::fs::write(file, "{}\n").unwrap();
    }
    let adopt = |session: &str, file: &Path, json: bool| {
        let mut args = vec!["--store", store.as_str()];
        if json {
            args.push("--json");
        }
        args.extend(["adopt", session, "--file", file.to_str().unwrap()]);
        let o = run(&args);
        assert!(o.status.success(), "{}", text(&o));
        o
    };
    let first = adopt("agent:main:worker", &a, false);
    assert!(text(&first).contains("(new link)"), "{}", text(&first));
    // From the transcript's end: only what is typed from now on counts.
    assert!(
        text(&first).contains("read from byte 3 on"),
        "{}",
        text(&first)
    );
    let moved = adopt("agent:main:worker", &b, false);
    assert!(
        text(&moved).contains("(the source changed: rebased)"),
        "{}",
        text(&moved)
    );
    let again = adopt("agent:main:worker", &b, false);
    assert!(
        text(&again).contains("(same source: the link and its marker are kept)"),
        "{}",
        text(&again)
    );
    assert!(
        text(&again).contains("read from byte 3 on"),
        "{}",
        text(&again)
    );
    // In JSON too: back to a is a rebase, a again is not.
    for rebased in [true, false] {
        let o = adopt("agent:main:worker", &a, true);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        assert_eq!(
            (&v["created"], &v["rebased"]),
            (&json!(false), &json!(rebased)),
            "{v}"
        );
    }
    // ops's main session watches ops's `global`, not main's.
    let watched = run(&["--store", &store, "watch", "agent:ops:main", "global"]);
    assert!(watched.status.success(), "{}", text(&watched));
    let o = adopt("global", &a, true);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["watchedBy"], serde_json::json!([]), "{v}");
}

/// `adopt --catalog` names the link's catalog (the channel of its events), `--json` names the
/// `--watcher` it was given, and `adopt` closes its store: the SQLite file alone, copied without
/// its write-ahead log, holds the adoption. (What the mutations did: the flag dropped after the
/// transcript was read, CU17; `"watcher": null`, CU24; the store left unclosed, CU18; review of
/// stop 65.)
#[test]
fn adopt_keeps_its_catalog_and_leaves_the_file_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store, transcript) = store_and_transcript(dir.path());
    human_line(&transcript, "h0", "before");
    let o = run(&[
        "--store",
        &store,
        "--json",
        "adopt",
        "agent:main:worker",
        "--file",
        transcript.to_str().unwrap(),
        "--catalog",
        "my-catalog",
        "--watcher",
        "agent:main:main",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["link"]["catalogId"], json!("my-catalog"), "{v}");
    assert_eq!(v["watcher"], json!("agent:main:main"), "{v}");
    // A store left unclosed kept the adoption in SQLite's log, unless the handle's drop
    // happened to close it before the process exited: several stores, so that a race lost
    // once in three does not hide it.
    for i in 0..8 {
        let db = dir.path().join(format!("state{i}.db"));
        let o = adopt_worker(&format!("sqlite://{}", db.display()), &transcript, &[]);
        assert!(o.status.success(), "{}", text(&o));
        let copy = dir.path().join(format!("copy{i}.db"));
        std::fs::copy(&db, &copy).unwrap();
        let o = run(&[
            "--store",
            &format!("sqlite://{}", copy.display()),
            "--json",
            "status",
            "agent:main:worker",
        ]);
        assert!(
            o.status.success(),
            "the copied file alone ({i}): {}",
            text(&o)
        );
    }
}

/// `adopt --json` names the link's host as `--host` gave it, says whether the link is new
/// (`created`, false when the same transcript is adopted again) and gives the number of the
/// `adopted` event, the same one the second time. (What the mutation did: `--host` dropped
/// once the transcript was read, the link's host `local`; review of stop 67, CV18.)
#[test]
fn adopt_json_names_its_host_whether_the_link_is_new_and_its_event() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store, transcript) = store_and_transcript(dir.path());
    human_line(&transcript, "h0", "before");
    let adopt = || {
        let o = run(&[
            "--store",
            &store,
            "--json",
            "adopt",
            "agent:main:worker",
            "--file",
            transcript.to_str().unwrap(),
            "--host",
            "box-7",
        ]);
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_slice::<Value>(&o.stdout).unwrap()
    };
    let first = adopt();
    assert_eq!(first["link"]["hostId"], json!("box-7"), "{first}");
    assert_eq!(first["created"], json!(true), "{first}");
    let seq = first["adoptedSequence"].as_u64().unwrap_or_default();
    assert!(seq > 0, "{first}");
    let again = adopt();
    assert_eq!(again["created"], json!(false), "{again}");
    assert_eq!(again["adoptedSequence"], json!(seq), "{again}");
}

/// `monitor` closes its store when it stops: the SQLite file alone, copied without its
/// write-ahead log, holds the human turn the monitor recorded, as `status` on the store itself
/// shows it. (What the mutation did: the store was only dropped, not closed, when the monitor
/// stopped, and the event stayed in SQLite's log; review of stop 67, CV15.)
#[test]
fn monitor_closes_its_store_and_leaves_the_file_whole() {
    // Several stores, so that a drop that happens to close the file in time does not hide it.
    for i in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let (db, store, transcript) = store_and_transcript(dir.path());
        let file = transcript.to_str().unwrap();
        adopt_watched(&store, file);
        human_line(&transcript, "h1", "typed straight in");
        let Reading {
            mut child,
            lines: (lines, _reader),
        } = bin()
            .args([
                "--store",
                &store,
                "--json",
                "monitor",
                "--first-tick-secs",
                "0",
                "--interval-secs",
                "1",
            ])
            .spawn_reading()
            .unwrap();
        wait_for(&lines, r#""detection":"human""#);
        let pid = child.0.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let status = child.wait_stopped("monitor, sent SIGTERM");
        assert!(status.success(), "{status:?}");
        let status_of = |url: &str| {
            let o = run(&["--store", url, "--json", "status", "agent:main:worker"]);
            assert!(o.status.success(), "{i}: {}", text(&o));
            serde_json::from_slice::<Value>(&o.stdout).unwrap()
        };
        let copy = dir.path().join("copy.db");
        std::fs::copy(&db, &copy).unwrap();
        assert_eq!(
            status_of(&format!("sqlite://{}", copy.display())),
            status_of(&store),
            "{i}: the file alone, and the store"
        );
    }
}

/// A transcript whose file name cannot be a thread id (it holds a line break), adopted
/// without `--thread`, is a usage error (exit 2) found before the store is opened: no store
/// file is created. (What the mutation did: the link taken from the file went unchecked until
/// the store had been created; review of stop 67, CV19.)
#[test]
fn adopt_refuses_a_thread_from_the_file_name_before_it_opens_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let (db, store, _) = store_and_transcript(dir.path());
    let transcript = dir.path().join("t\nx.jsonl");
    std::fs::File::create(&transcript).unwrap();
    let o = adopt_worker(&store, &transcript, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!db.exists(), "the store was created: {}", text(&o));
}
