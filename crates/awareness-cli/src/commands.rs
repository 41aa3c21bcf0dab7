//! The operator commands.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use awareness_core::audit;
use awareness_core::error::ErrorChain;
use awareness_core::protocol::IgnoredWatcher;
use awareness_core::{
    AckTarget, ActorType, AgentId, AwarenessStore, AwarenessStoreExt, Cursor, CursorFilter, Event,
    EventKind, FullStore, Head, NewEvent, Notice, OpenFailure, RetentionPolicy, Sequence,
    SessionKey, SessionRef, StoreError, Timestamp, ValidationError, WatcherKey, protocol,
    retention, validate,
};
use gateway_adapter::{OpenError, OpenOptions, StoreUrl, open_full_store_with};
use serde_json::{Value, json};

use crate::table::{render, time};
use crate::{Cli, CliError, Command, EXIT_FAILURE};

/// Flags of `awareness record`.
#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// The session key.
    #[arg(long)]
    pub session: String,
    /// The session's agent (default: the key's agent, else main).
    #[arg(long)]
    pub agent: Option<String>,
    /// The kind (human_direct_message, goal_changed, upstream_missing, child_spawned,
    /// run_completed, run_failed, compacted, adopted, created).
    #[arg(long)]
    pub kind: String,
    /// human, agent or system.
    #[arg(long, default_value = "system")]
    pub actor_type: String,
    /// The actor's id (for an agent, the session key that acted).
    #[arg(long)]
    pub actor_id: Option<String>,
    /// One line, at most 200 characters.
    #[arg(long)]
    pub summary: String,
    /// A JSON object of at most 4 KiB.
    #[arg(long)]
    pub payload: Option<String>,
    /// Idempotency key.
    #[arg(long)]
    pub dedupe_key: Option<String>,
    /// Run id.
    #[arg(long)]
    pub run_id: Option<String>,
    /// Session id.
    #[arg(long)]
    pub session_id: Option<String>,
    /// A watcher the producer names (repeatable; not for a log-only kind, which notifies
    /// nobody, nor the session itself).
    #[arg(long)]
    pub watcher: Vec<String>,
}

fn invalid(e: &ValidationError) -> CliError {
    CliError::usage(e.to_string())
}

/// The failure of the command `what` on `e`: exit code 75 ([`crate::EXIT_TEMPFAIL`]) with a
/// hint when the same call may succeed later ([`StoreError::is_retryable`]), else 1. The
/// command's name comes first unless the store's own words already say it (`record` before
/// `store busy: /x.db: record an event: ...` would say it twice).
pub(crate) fn store_err(what: &str, e: &StoreError) -> CliError {
    let text = ErrorChain(e).to_string();
    let message = if names_command(&text, what) {
        text
    } else {
        format!("{what}: {text}")
    };
    if e.is_retryable() {
        CliError::temporary(message)
    } else {
        CliError::failure(message)
    }
}

/// Whether `text` says `what` as a step of its own: after a `: `, and followed by a space, a
/// `:` or nothing (`record` in `...: record an event`, not in `...: recorder.db: ...`).
fn names_command(text: &str, what: &str) -> bool {
    let step = format!(": {what}");
    text.match_indices(&step)
        .any(|(at, m)| matches!(text[at + m.len()..].chars().next(), None | Some(' ' | ':')))
}

/// The failure of an open that failed on `e` (not a bad URL): exit code 75 with a hint when
/// opening again may succeed ([`OpenError::is_retryable`]: the store was busy, or its file is
/// in use by another process), else 1.
fn open_err(e: &OpenError) -> CliError {
    if e.is_retryable() {
        CliError::temporary(ErrorChain(e).to_string())
    } else {
        CliError::failure(ErrorChain(e).to_string())
    }
}

/// The session key given as `arg` (named so in the error: a command takes several keys).
pub(crate) fn key(arg: &str, s: &str) -> Result<SessionKey, CliError> {
    SessionKey::new(s).map_err(|e| CliError::usage(format!("{arg}: {e}")))
}

/// "1st", "2nd", "3rd", "4th", ...: which of several arguments is at fault.
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// The watcher given as `arg` (named so in the error).
pub(crate) fn watcher(arg: &str, s: &str) -> Result<WatcherKey, CliError> {
    WatcherKey::parse(s).map_err(|e| CliError::usage(format!("{arg}: {e}")))
}

pub(crate) fn agent_for(
    k: &SessionKey,
    given: Option<&str>,
    fallback: Option<&str>,
) -> Result<AgentId, CliError> {
    let a = given
        .or_else(|| k.agent_id())
        .or(fallback)
        .unwrap_or("main");
    AgentId::new(a).map_err(|e| invalid(&e))
}

/// What a command may do to its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Only reads: opens the store read-only, never creates a file and never writes to one.
    Read,
    /// Writes to a store that must exist: a missing file is refused, and none is created.
    Write,
    /// Puts something new into the store (`record`, `watch`, `adopt`, `demo`): a missing or
    /// empty file is made a store; another application's database is refused (by the store's
    /// open).
    Create,
}

/// What `c` may do to its store. Only the commands that put something new into a store create
/// a missing file: the others, on a mistyped path, would report that an empty store holds
/// nothing to do.
fn access(c: &Command) -> Access {
    match c {
        Command::Status { .. }
        | Command::List { .. }
        | Command::Cursors { .. }
        | Command::Tail { .. }
        | Command::Doctor
        | Command::Prune { dry_run: true } => Access::Read,
        Command::Record(_) | Command::Watch { .. } | Command::Adopt(_) | Command::Demo => {
            Access::Create
        }
        Command::Unwatch { .. }
        | Command::Ack { .. }
        | Command::Sweep
        | Command::Prune { dry_run: false }
        | Command::Monitor(_)
        | Command::Repair => Access::Write,
    }
}

/// [`open_full`], as the store alone (the demo opens its store so too: with live readers on
/// redb, as every command that writes).
pub(crate) async fn open(cli: &Cli) -> Result<Arc<dyn AwarenessStore>, CliError> {
    let store: Arc<dyn AwarenessStore> = open_full(cli).await?;
    Ok(store)
}

/// Opens the store with its upstream links. A read command opens it read-only: it never
/// creates the file, and never writes to it (not even a migration). Only `record`, `watch`,
/// `adopt` and `demo` create a store, in a missing or empty file (another application's
/// database they refuse, as the store's open does without `create_if_missing`); every other
/// command refuses a missing file with a failure naming the path. Every command that writes
/// lets read commands in while it has the file open, and opens beside a read command that has
/// it open (`tail --follow`): redb's live
/// readers, whose two-phase commit costs a one-shot command nothing it would notice; SQLite
/// always does.
///
/// A PostgreSQL store has no read-only open: a read command opens it as the others do, but
/// only where its schema holds a store already (a missing schema, or one without the store's
/// tables, is refused, and nothing is created), and then only reads. A URL sqlx cannot read,
/// or a schema name the store cannot take, is a usage error, as a bad file URL is.
pub(crate) async fn open_full(cli: &Cli) -> Result<Arc<dyn FullStore>, CliError> {
    let url = StoreUrl::parse(&cli.store).map_err(|e| CliError::usage(e.to_string()))?;
    let access = access(&cli.command);
    let path = match &url {
        StoreUrl::Sqlite(p) | StoreUrl::Redb(p) => Some(p),
        StoreUrl::Memory | StoreUrl::Postgres(_) => None,
    };
    let postgres = matches!(url, StoreUrl::Postgres(_));
    // A command that creates a store creates it only where there is none (a missing file, an
    // empty one, a database without tables); another application's database at the path (a
    // mistyped path) the store's open refuses and leaves as it was.
    let create = access == Access::Create;
    if !create {
        // Only a file known to be missing is refused here: one that cannot be looked at
        // (permission denied) is left to the open, whose error says why.
        if let Some(p) = path.filter(|p| matches!(p.try_exists(), Ok(false))) {
            return Err(CliError::failure(format!(
                "no store at {} (only record, watch, adopt and demo create one)",
                p.display()
            )));
        }
    }
    open_full_store_with(
        &cli.store,
        OpenOptions {
            // Also refused by the open itself when the file goes between the check and it.
            create_if_missing: create,
            read_only: access == Access::Read && !postgres,
            live_readers: access != Access::Read,
        },
    )
    .await
    .map_err(|e| match e {
        OpenError::BadUrl(_) => CliError::usage(e.to_string()),
        OpenError::Store(ref s)
            if postgres && s.open_failure() == Some(OpenFailure::InvalidOptions) =>
        {
            CliError::usage(ErrorChain(&e).to_string())
        }
        OpenError::Store(ref s)
            if matches!(s, StoreError::NeedsRepair { .. })
                || s.open_failure() == Some(OpenFailure::NeedsMigration) =>
        {
            CliError::failure(format!("{e} (`awareness repair` does that)"))
        }
        other => open_err(&other),
    })
}

fn emit(out: &mut dyn Write, text: &str) -> Result<(), CliError> {
    out.write_all(crate::table::printable(text).as_bytes())
        .map_err(|e| CliError::output(&e))
}

fn emit_json(out: &mut dyn Write, v: &Value) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(v).unwrap_or_default();
    emit(out, &format!("{text}\n"))
}

fn event_rows(events: &[Arc<Event>]) -> Vec<Vec<String>> {
    events
        .iter()
        .map(|e| {
            vec![
                e.sequence.to_string(),
                e.session_key.to_string(),
                e.agent_id.to_string(),
                e.kind.to_string(),
                format!(
                    "{}{}",
                    e.actor_type,
                    e.actor_id
                        .as_deref()
                        .map(|i| format!(" {i}"))
                        .unwrap_or_default()
                ),
                time(e.occurred_at),
                e.summary.clone(),
            ]
        })
        .collect()
}

const EVENT_HEADERS: [&str; 7] = [
    "SEQ", "SESSION", "AGENT", "KIND", "ACTOR", "OCCURRED", "SUMMARY",
];

fn head_json(h: &Head) -> Value {
    json!({
        "sessionKey": h.session.session_key,
        "agentId": h.session.agent_id,
        "stateVersion": h.last_sequence,
        "prunedMaxSequence": h.pruned_max_sequence,
        "updatedAt": h.updated_at,
    })
}

fn cursor_json(c: &Cursor) -> Value {
    let mut v = serde_json::to_value(c).unwrap_or_default();
    v["pending"] = json!(c.is_pending());
    v
}

fn cursor_rows(cursors: &[Cursor]) -> Vec<Vec<String>> {
    cursors
        .iter()
        .map(|c| {
            vec![
                c.watcher.to_string(),
                c.target.to_string(),
                c.target_agent.to_string(),
                c.last_seen.to_string(),
                c.notified.to_string(),
                c.material.to_string(),
                if c.is_pending() {
                    "yes".into()
                } else {
                    "no".into()
                },
                time(c.updated_at),
            ]
        })
        .collect()
}

const CURSOR_HEADERS: [&str; 8] = [
    "WATCHER",
    "TARGET",
    "AGENT",
    "LAST_SEEN",
    "NOTIFIED",
    "MATERIAL",
    "PENDING",
    "UPDATED",
];

/// Notices as JSON, the same shape wherever a command lists them (`record`, `ack`, `sweep`).
/// `targetAgent` is the target's agent: the notice's text names the key alone, and a bare key
/// (`global`) of another agent than main is another session than `status global` reads.
fn notices_json(notices: &[Notice]) -> Value {
    notices
        .iter()
        .map(|n| {
            json!({"watcher": n.watcher, "target": n.target, "targetAgent": n.target_agent,
                "contextKey": n.context_key(), "text": n.text()})
        })
        .collect()
}

/// A notice as a text line, the same wherever a command lists them: the watcher, the notice's
/// exact text, then the target's agent, as other output names a session's agent
/// (`WATCHER <- TEXT (agent AGENT)`).
fn notice_line(n: &Notice) -> String {
    format!("{} <- {} (agent {})", n.watcher, n.text(), n.target_agent)
}

fn notices_out(out: &mut dyn Write, json_mode: bool, notices: &[Notice]) -> Result<(), CliError> {
    if json_mode {
        return emit_json(out, &notices_json(notices));
    }
    if notices.is_empty() {
        return emit(out, "no notices\n");
    }
    let mut text = String::new();
    for n in notices {
        let _ = writeln!(text, "{}", notice_line(n));
    }
    emit(out, &text)
}

/// Runs the parsed command; returns the exit code.
pub async fn execute(cli: &Cli, out: &mut dyn Write) -> Result<i32, CliError> {
    refuse_memory(cli)?;
    match &cli.command {
        Command::Demo if cli.json => {
            return Err(CliError::usage(
                "demo prints a narration, never JSON: run it without --json",
            ));
        }
        Command::Demo => return crate::demo::run(cli, out).await,
        Command::Adopt(args) => return crate::upstream::adopt(cli, args, out).await,
        Command::Monitor(args) => return crate::upstream::monitor(cli, args, out).await,
        Command::Repair => return repair(cli, out).await,
        _ => {}
    }
    // Checked before the store is opened: bad input is a usage error whether or not the store
    // exists, and it neither creates a file nor migrates one (OpenClaw's included).
    let checked = check_input(cli)?;
    refuse_missing_cursors_before_writing(cli, &checked).await?;
    let store = open(cli).await?;
    let code = on_store(cli, checked, &*store, out).await;
    // Closed before the process exits: SQLite's write-ahead log then goes into the file, so
    // a write command leaves a file that holds all it wrote, even copied without its log.
    store.close().await;
    code
}

/// `unwatch` and `ack` of a cursor the file does not hold (a typo, a session never watched)
/// fail before the file is opened for writing: a read-write open migrates a file of an older
/// schema (OpenClaw's own among them, which gets our columns), and a command refused for its
/// input changes nothing. So the cursors are looked for in a read-only open first. When that
/// open fails (a redb file that needs a repair, or that a gateway holds without live readers),
/// the read-write open decides, and the command checks again there, as it always does.
/// PostgreSQL has no read-only open, and its schema is the store's own.
async fn refuse_missing_cursors_before_writing(
    cli: &Cli,
    checked: &Checked,
) -> Result<(), CliError> {
    let (wk, targets) = match checked {
        Checked::Unwatch(wk, t) => (wk, std::slice::from_ref(t)),
        Checked::Ack(wk, targets) => (wk, targets.as_slice()),
        _ => return Ok(()),
    };
    let Ok(StoreUrl::Sqlite(file) | StoreUrl::Redb(file)) = StoreUrl::parse(&cli.store) else {
        return Ok(());
    };
    if !matches!(file.try_exists(), Ok(true)) {
        return Ok(());
    }
    let options = OpenOptions {
        create_if_missing: false,
        read_only: true,
        live_readers: false,
    };
    let Ok(store) = open_full_store_with(&cli.store, options).await else {
        return Ok(());
    };
    let ack = matches!(checked, Checked::Ack(..));
    let mut refused = None;
    for t in targets {
        match store.cursor(wk, t).await {
            Ok(None) => {
                refused = Some(CliError::failure(format!(
                    "no cursor of {} on {t}",
                    wk.as_str()
                )));
                break;
            }
            // A cursor row that cannot be read: `ack` refuses it (an acknowledgement leaves
            // it as it is), as the read-write open would, after migrating the file; `unwatch`
            // removes it there (decision 0016).
            Err(e @ StoreError::Corrupt { .. }) if ack => {
                refused = Some(store_err("ack", &e));
                break;
            }
            // Any other failure is left to the read-write open.
            Ok(Some(_)) | Err(_) => {}
        }
    }
    store.close().await;
    refused.map_or(Ok(()), Err)
}

/// Refuses, as a usage error, a command that `memory:` makes pointless: a store in memory lives
/// only as long as the command, so a write to it is thrown away when the command ends, and
/// nothing else can write to it for `tail --follow` to wait for. The demo (self-contained) and
/// the read commands take it.
fn refuse_memory(cli: &Cli) -> Result<(), CliError> {
    if !StoreUrl::parse(&cli.store).is_ok_and(|u| u == StoreUrl::Memory) {
        return Ok(());
    }
    let name = match &cli.command {
        Command::Repair => return Err(CliError::usage("memory: holds no file to repair")),
        Command::Tail { follow: true, .. } => {
            return Err(CliError::usage(
                "memory: lives only as long as this command, and nothing else can write to \
                 it: `tail --follow` would wait for events that never come (use \
                 sqlite:///path, redb:///path or postgres://host/database)",
            ));
        }
        Command::Record(_) => "record",
        Command::Watch { .. } => "watch",
        Command::Unwatch { .. } => "unwatch",
        Command::Ack { .. } => "ack",
        Command::Sweep => "sweep",
        Command::Prune { dry_run: false } => "prune",
        Command::Adopt(_) => "adopt",
        Command::Monitor(_) => "monitor",
        Command::Demo
        | Command::Status { .. }
        | Command::List { .. }
        | Command::Cursors { .. }
        | Command::Tail { follow: false, .. }
        | Command::Doctor
        | Command::Prune { dry_run: true } => return Ok(()),
    };
    Err(CliError::usage(format!(
        "memory: lives only as long as this command: what `{name}` writes would be gone when \
         it ends (use sqlite:///path, redb:///path or postgres://host/database)"
    )))
}

/// A command's input, checked before its store is opened.
enum Checked {
    /// A command without input to check.
    Nothing,
    Watch(WatcherKey, SessionRef),
    Unwatch(WatcherKey, SessionKey),
    Record(Box<NewEvent>),
    Ack(WatcherKey, Vec<SessionKey>),
    Read(Read),
}

/// A read command's input, checked.
enum Read {
    Status {
        session: SessionRef,
        changes_since: Option<Sequence>,
        limit: Option<usize>,
    },
    List(Option<AgentId>),
    Cursors(CursorFilter),
}

/// Checks the input of a command (see [`Checked`]).
fn check_input(cli: &Cli) -> Result<Checked, CliError> {
    Ok(match &cli.command {
        Command::Watch {
            watcher: w,
            target,
            agent,
        } => {
            let t = key("TARGET", target)?;
            let wk = watcher("WATCHER", w)?;
            protocol::check_watch(wk.session_key(), &t).map_err(|e| invalid(&e))?;
            let agent = agent_for(&t, agent.as_deref(), Some(wk.agent_id()))?;
            Checked::Watch(wk, SessionRef::new(t, agent))
        }
        Command::Unwatch { watcher: w, target } => {
            Checked::Unwatch(watcher("WATCHER", w)?, key("TARGET", target)?)
        }
        Command::Record(a) => Checked::Record(Box::new(new_event(a)?)),
        Command::Ack {
            watcher: w,
            targets,
        } => {
            let wk = watcher("WATCHER", w)?;
            let targets: Vec<SessionKey> = targets
                .iter()
                .enumerate()
                .map(|(i, t)| key(&format!("TARGETS (the {})", ordinal(i + 1)), t))
                .collect::<Result<_, _>>()?;
            Checked::Ack(wk, targets)
        }
        Command::Status {
            key: k,
            agent,
            changes_since,
            limit,
        } => {
            let k = key("KEY", k)?;
            let agent = agent_for(&k, agent.as_deref(), None)?;
            Checked::Read(Read::Status {
                session: SessionRef::new(k, agent),
                changes_since: changes_since.map(Sequence),
                limit: *limit,
            })
        }
        Command::List { agent } => Checked::Read(Read::List(
            agent
                .as_deref()
                .map(AgentId::new)
                .transpose()
                .map_err(|e| invalid(&e))?,
        )),
        Command::Cursors {
            watcher: w,
            target,
            pending,
        } => Checked::Read(Read::Cursors(CursorFilter {
            // A watcher, as `watch` takes it: a bare key watches nothing.
            watcher: w
                .as_deref()
                .map(|w| watcher("--watcher", w).map(|wk| wk.session_key().clone()))
                .transpose()?,
            target: target.as_deref().map(|t| key("--target", t)).transpose()?,
            pending_only: *pending,
        })),
        Command::Demo
        | Command::Adopt(_)
        | Command::Monitor(_)
        | Command::Repair
        | Command::Sweep
        | Command::Prune { .. }
        | Command::Tail { .. }
        | Command::Doctor => Checked::Nothing,
    })
}

/// Runs a command that needs nothing but the open store; `checked` is its input as
/// [`check_input`] checked it.
async fn on_store(
    cli: &Cli,
    checked: Checked,
    store: &dyn AwarenessStore,
    out: &mut dyn Write,
) -> Result<i32, CliError> {
    let now = Timestamp::now();
    let as_json = cli.json;
    match checked {
        Checked::Watch(wk, r) => {
            let before = pending_elsewhere(store, &wk, &r).await;
            let c = store
                .watch(&wk, &r, now)
                .await
                .map_err(|e| store_err("watch", &e))?;
            said_if_moved(&wk, &r, before, Some(&c));
            let done = format!("{} watches {} now", c.watcher, c.target);
            if as_json {
                emit_json(out, &cursor_json(&c))
            } else {
                emit(out, &render(&CURSOR_HEADERS, &cursor_rows(&[c])))
            }
            .map_err(|e| e.after(&done))?;
        }
        Checked::Unwatch(wk, t) => {
            let removed = store
                .unwatch(&wk, &t)
                .await
                .map_err(|e| store_err("unwatch", &e))?;
            let w = wk.as_str();
            if !removed {
                return Err(CliError::failure(format!("no cursor of {w} on {t}")));
            }
            if as_json {
                emit_json(out, &json!({"removed": true}))
            } else {
                emit(out, &format!("removed the cursor of {w} on {t}\n"))
            }
            .map_err(|e| e.after(&format!("removed the cursor of {w} on {t}")))?;
        }
        Checked::Record(ev) => record(store, *ev, now, as_json, out).await?,
        Checked::Ack(wk, targets) => {
            // A target named twice is acknowledged once (as the store would): counted once.
            let mut seen = std::collections::HashSet::new();
            let targets: Vec<SessionKey> = targets
                .into_iter()
                .filter(|t| seen.insert(t.clone()))
                .collect();
            // A target the watcher has no cursor on is a mistake (a typo, a session it never
            // watched), as for `unwatch`, and one whose cursor row cannot be read is left as it
            // is by an acknowledgement: both refused, with what was found, before anything is
            // acknowledged.
            let mut pending = 0;
            for t in &targets {
                let found = store
                    .cursor(&wk, t)
                    .await
                    .map_err(|e| store_err("ack", &e))?;
                match found {
                    None => {
                        return Err(CliError::failure(format!(
                            "no cursor of {} on {t}",
                            wk.as_str()
                        )));
                    }
                    Some(c) if c.is_pending() => pending += 1,
                    Some(_) => {}
                }
            }
            // An operator acknowledges whatever notice each cursor shows; a cursor with none
            // pending is left as it is. Which had one is known as of the read above (a gateway
            // may acknowledge, or record, in between), and said so.
            let done = format!(
                "acknowledged {} session(s) for {} ({pending} had a notice pending when read)",
                targets.len(),
                wk.as_str()
            );
            let targets: Vec<AckTarget> = targets.into_iter().map(AckTarget::any).collect();
            let follow = store
                .acknowledge(&wk, &targets, now)
                .await
                .map_err(|e| store_err("ack", &e))?;
            if as_json {
                // A bare array of the follow-ups, the shape `sweep` prints too.
                emit_json(out, &notices_json(&follow))
            } else {
                let mut text = format!("{done}\n");
                if follow.is_empty() {
                    text.push_str("no follow-up notices\n");
                }
                for n in &follow {
                    let _ = writeln!(text, "{}", notice_line(n));
                }
                emit(out, &text)
            }
            .map_err(|e| e.after(&done))?;
        }
        Checked::Read(read) => on_store_read(read, store, as_json, out).await?,
        Checked::Nothing => return on_store_other(cli, store, now, out).await,
    }
    Ok(0)
}

/// The read commands, with their input as [`check_input`] checked it.
async fn on_store_read(
    read: Read,
    store: &dyn AwarenessStore,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    match read {
        Read::Status {
            session: r,
            changes_since,
            limit,
        } => {
            let heads = store
                .heads(std::slice::from_ref(&r))
                .await
                .map_err(|e| store_err("status", &e))?;
            if heads.is_empty() {
                return Err(CliError::failure(format!(
                    "unknown session {} (agent {})",
                    r.session_key, r.agent_id
                )));
            }
            let status = store
                .session_status(&r, changes_since, limit)
                .await
                .map_err(|e| store_err("status", &e))?;
            if as_json {
                emit_json(out, &serde_json::to_value(&status).unwrap_or_default())?;
            } else {
                let h = &heads[0];
                let mut text = format!(
                    "{} (agent {}): stateVersion {}, pruned up to {}, updated {}\n",
                    r.session_key,
                    r.agent_id,
                    status.state_version,
                    h.pruned_max_sequence,
                    time(h.updated_at)
                );
                if let Some(page) = &status.state_changes {
                    let _ = writeln!(
                        text,
                        "changes since {}: {} event(s), truncated {}, earliestAvailableSequence {}, historyGap {}{}",
                        changes_since.unwrap_or_default(),
                        page.events.len(),
                        page.truncated,
                        page.earliest_available_sequence,
                        page.history_gap,
                        if page.version_ahead {
                            ", versionAhead true"
                        } else {
                            ""
                        }
                    );
                    if !page.events.is_empty() {
                        text.push_str(&render(&EVENT_HEADERS, &event_rows(&page.events)));
                    }
                }
                emit(out, &text)?;
            }
        }
        Read::List(a) => {
            let heads = store
                .list_heads(a.as_ref())
                .await
                .map_err(|e| store_err("list", &e))?;
            if as_json {
                emit_json(out, &json!(heads.iter().map(head_json).collect::<Vec<_>>()))?;
            } else {
                let rows: Vec<Vec<String>> = heads
                    .iter()
                    .map(|h| {
                        vec![
                            h.session.session_key.to_string(),
                            h.session.agent_id.to_string(),
                            h.last_sequence.to_string(),
                            h.pruned_max_sequence.to_string(),
                            time(h.updated_at),
                        ]
                    })
                    .collect();
                emit(
                    out,
                    &render(
                        &["SESSION", "AGENT", "STATE_VERSION", "PRUNED_MAX", "UPDATED"],
                        &rows,
                    ),
                )?;
            }
        }
        Read::Cursors(filter) => {
            let cursors = store
                .cursors(&filter)
                .await
                .map_err(|e| store_err("cursors", &e))?;
            if as_json {
                emit_json(
                    out,
                    &json!(cursors.iter().map(cursor_json).collect::<Vec<_>>()),
                )?;
            } else {
                emit(out, &render(&CURSOR_HEADERS, &cursor_rows(&cursors)))?;
            }
        }
    }
    Ok(())
}

/// The commands that need the open store and have no input to check.
async fn on_store_other(
    cli: &Cli,
    store: &dyn AwarenessStore,
    now: Timestamp,
    out: &mut dyn Write,
) -> Result<i32, CliError> {
    let as_json = cli.json;
    match &cli.command {
        Command::Sweep => {
            let notices = store
                .sweep(now, &|_| true)
                .await
                .map_err(|e| store_err("sweep", &e))?;
            notices_out(out, as_json, &notices)
                .map_err(|e| e.after(&format!("the sweep found {} notice(s)", notices.len())))?;
        }
        Command::Prune { dry_run } => prune(store, *dry_run, now, as_json, out).await?,
        Command::Tail { follow, after } => tail(store, *follow, *after, as_json, out).await?,
        Command::Doctor => return doctor(store, as_json, out).await,
        // Run elsewhere: the first four open what they need; the others come with their
        // checked input (`on_store`).
        Command::Demo
        | Command::Adopt(_)
        | Command::Monitor(_)
        | Command::Repair
        | Command::Watch { .. }
        | Command::Unwatch { .. }
        | Command::Record(_)
        | Command::Ack { .. }
        | Command::Status { .. }
        | Command::List { .. }
        | Command::Cursors { .. } => {}
    }
    Ok(0)
}

/// The event `awareness record` asks for, checked.
fn new_event(args: &RecordArgs) -> Result<NewEvent, CliError> {
    let k = key("--session", &args.session)?;
    let r = SessionRef::new(k.clone(), agent_for(&k, args.agent.as_deref(), None)?);
    let kind = EventKind::parse(&args.kind).map_err(|e| invalid(&e))?;
    let actor = ActorType::parse(&args.actor_type).map_err(|e| invalid(&e))?;
    let mut ev = NewEvent::new(r, kind, actor, args.summary.clone());
    ev.actor_id.clone_from(&args.actor_id);
    ev.dedupe_key.clone_from(&args.dedupe_key);
    ev.run_id.clone_from(&args.run_id);
    ev.session_id.clone_from(&args.session_id);
    if let Some(p) = &args.payload {
        let v: Value = serde_json::from_str(p)
            .map_err(|e| CliError::usage(format!("--payload is not JSON: {e}")))?;
        ev.payload = Some(validate::payload_from_value(v).map_err(|e| invalid(&e))?);
    }
    // A named watcher the protocol would ignore is refused, not silently dropped.
    for w in &args.watcher {
        let w = watcher("--watcher", w)?;
        let ignored = protocol::ignored_watcher(ev.kind.class(), &k, ev.actor_id.as_deref(), &w);
        match ignored {
            None => {}
            Some(IgnoredWatcher::LogOnly) => {
                return Err(CliError::usage(format!(
                    "--watcher: a {} event is log-only and notifies no watcher (only \
                     human_direct_message, goal_changed, upstream_missing and child_spawned \
                     take one)",
                    ev.kind
                )));
            }
            Some(IgnoredWatcher::ItsOwnSession) => {
                let e = ValidationError::SelfWatch {
                    key: k.as_str().to_owned(),
                };
                return Err(CliError::usage(format!("--watcher: {e}")));
            }
            Some(IgnoredWatcher::ItsOwnActor) => {
                return Err(CliError::usage(format!(
                    "--watcher {w}: it is the event's --actor-id, and a session is not notified \
                     of its own change (nothing would be written for it)"
                )));
            }
        }
        ev.watchers.push(w);
    }
    ev.validate().map_err(|e| invalid(&e))?;
    Ok(ev)
}

/// `watcher`'s cursor on `target`'s key when it follows another agent's session of the key and
/// holds a notice: what a watch of `target`, or a recording on it naming the watcher, moves to
/// `target` from scratch, dropping that notice (decision 0008). A cursor that cannot be read
/// counts as none (the write that follows says what it meets).
pub(crate) async fn pending_elsewhere(
    store: &dyn AwarenessStore,
    watcher: &WatcherKey,
    target: &SessionRef,
) -> Option<Cursor> {
    store
        .cursor(watcher, &target.session_key)
        .await
        .ok()
        .flatten()
        .filter(|c| !c.follows(target) && c.is_pending())
}

/// Says on stderr (a warning: the output shows the cursor as it is now, or nothing of it) that
/// `watcher`'s cursor `before` ([`pending_elsewhere`]) moved to `target`, when `now` (the cursor
/// after the write) shows it did, and that the notice pending there was dropped.
pub(crate) fn said_if_moved(
    watcher: &WatcherKey,
    target: &SessionRef,
    before: Option<Cursor>,
    now: Option<&Cursor>,
) {
    let Some(before) = before else { return };
    if now.is_some_and(|c| c.follows(target)) {
        tracing::warn!(
            watcher = %watcher,
            session_key = %target.session_key,
            from_agent = %before.target_agent,
            to_agent = %target.agent_id,
            changes_since = before.last_seen.get(),
            "the watch moved from another agent's session of the key, and the notice pending there is dropped"
        );
    }
}

async fn record(
    store: &dyn AwarenessStore,
    ev: NewEvent,
    now: Timestamp,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let mut before = Vec::new();
    for w in &ev.watchers {
        if let Some(c) = pending_elsewhere(store, w, &ev.session).await {
            before.push((w.clone(), c));
        }
    }
    let target = ev.session.clone();
    let rec = store
        .record(ev, now)
        .await
        .map_err(|e| store_err("record", &e))?;
    for (w, c) in before {
        let now = store.cursor(&w, &target.session_key).await.ok().flatten();
        said_if_moved(&w, &target, Some(c), now.as_ref());
    }
    let done = if rec.deduplicated {
        format!(
            "event #{} was already recorded (dedupe hit)",
            rec.event.sequence
        )
    } else {
        format!("recorded event #{}", rec.event.sequence)
    };
    if as_json {
        let notices = notices_json(&rec.notices);
        emit_json(
            out,
            &json!({"event": &*rec.event, "deduplicated": rec.deduplicated, "notices": notices}),
        )
    } else {
        let mut text = render(
            &EVENT_HEADERS,
            &event_rows(std::slice::from_ref(&rec.event)),
        );
        if rec.deduplicated {
            text.push_str("(dedupe hit: the stored event, nothing moved)\n");
        }
        for n in &rec.notices {
            let _ = writeln!(text, "{}", notice_line(n));
        }
        emit(out, &text)
    }
    .map_err(|e| e.after(&done))
}

/// How many events one read of the log asks for while `prune --dry-run` counts it: the largest
/// page a reconcile returns, so that counting holds one page of events at a time.
const PRUNE_PAGE: usize = awareness_core::reconcile::MAX_PAGE_LIMIT;

/// Where `prune --dry-run` stopped reading the log: at a row the store cannot read.
struct UnreadLog {
    /// The last event read before it.
    after: Sequence,
    /// The store's error.
    reason: String,
    /// The rows from it on, not counted by age (the log's rows less those counted), when the
    /// store could count them; the row cap counts them ([`retention::Preview::unread`]).
    not_counted: Option<u64>,
}

/// What a pruning pass at `now` would delete, counted without deleting anything: the log is
/// read a page at a time into a [`retention::Preview`], so a dry run holds one page of events
/// however long the log is. A row the store cannot read ends the reading of the log there,
/// read in halves down to it so that every event before it is counted (as `doctor` reads it),
/// and is said ([`UnreadLog`]): a pass deletes such rows in their turn, and the dry run, which
/// failed at them, answered nothing for the store that most needed a pass (review, stop 57).
async fn would_prune(
    store: &dyn AwarenessStore,
    policy: &RetentionPolicy,
    now: Timestamp,
) -> Result<(retention::PruneReport, Option<UnreadLog>), CliError> {
    let mut would = retention::Preview::new(policy, now);
    let mut counted = 0u64;
    let stopped = audit::read_log(store, PRUNE_PAGE, |page| {
        counted += page.len() as u64;
        would.events(page.iter().map(|e| e.occurred_at));
    })
    .await
    .map_err(|e| store_err("read events", &e))?;
    let mut unread = None;
    if let Some(row) = stopped {
        let not_counted = store
            .log_stats()
            .await
            .ok()
            .map(|stats| stats.rows.saturating_sub(counted));
        // A pass applies the cap to the whole log, the rows it could not read with it (the
        // second reading: counted alone, the rows before them were under the cap, and the dry
        // run said 0 where the pass deleted 10,009).
        would.unread(not_counted.unwrap_or(0));
        unread = Some(UnreadLog {
            after: row.after,
            reason: ErrorChain(&row.error).to_string(),
            not_counted,
        });
    }
    let cursors = store
        .cursors(&CursorFilter::default())
        .await
        .map_err(|e| store_err("read cursors", &e))?;
    would.cursors(cursors.iter().map(|c| c.updated_at));
    Ok((would.report(), unread))
}

/// `prune`: with `dry_run`, what a pass would delete ([`would_prune`]); else one pass, which
/// reports what it deleted (it previews nothing).
async fn prune(
    store: &dyn AwarenessStore,
    dry_run: bool,
    now: Timestamp,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let policy = RetentionPolicy::default();
    if dry_run {
        let (would, unread) = would_prune(store, &policy, now).await?;
        let (by_age, by_cap, idle_cursors) =
            (would.events_by_age, would.events_by_cap, would.cursors);
        // Rows the preview cannot read: the pass deletes those that are idle (decision 0016).
        let unreadable = store
            .unreadable_cursors()
            .await
            .map_err(|e| store_err("read cursors", &e))?
            .len();
        return if as_json {
            let plan =
                json!({"eventsByAge": by_age, "eventsByCap": by_cap, "cursors": idle_cursors});
            let mut answer =
                json!({"dryRun": true, "wouldDelete": plan, "unreadableCursors": unreadable});
            if let Some(u) = &unread {
                answer["unreadableEvent"] = json!({
                    "after": u.after,
                    "notCounted": u.not_counted,
                    "reason": u.reason,
                });
            }
            emit_json(out, &answer)
        } else {
            let mut also = if unreadable > 0 {
                format!(
                    "; {unreadable} cursor row(s) that cannot be read are not counted (deleted if idle)"
                )
            } else {
                String::new()
            };
            if let Some(u) = &unread {
                let rows = u
                    .not_counted
                    .map_or_else(|| "the rows".to_owned(), |n| format!("{n} row(s)"));
                let _ = write!(
                    also,
                    "; the log was counted up to event #{} only: the row after it cannot be read ({}), so {rows} from it on are not counted by age (they are counted for the row cap, as rows too young for the age step; a pass deletes them in their turn, by age or as the oldest beyond the cap)",
                    u.after, u.reason
                );
            }
            emit(
                out,
                &format!(
                    "would delete {by_age} event(s) older than {}, {by_cap} beyond the {}-row cap, {idle_cursors} cursor(s) idle since {}{also}\n",
                    time(policy.age_cutoff(now)),
                    policy.max_rows,
                    time(policy.idle_cutoff(now))
                ),
            )
        };
    }
    let deleted = |r: &retention::PruneReport| {
        format!(
            "deleted {} event(s) by age, {} by the row cap, {} idle cursor(s), in {} chunk(s)",
            r.events_by_age, r.events_by_cap, r.cursors, r.chunks
        )
    };
    let report = match store.prune_counted(&policy, now).await {
        Ok(report) => report,
        // What the committed chunks deleted stays deleted: said, not only the failure. The
        // chunk that failed may have committed some of its transactions (store-sqlite's chunk
        // is several), so the count is a floor, and said so even when no chunk ended.
        Err(f) => {
            let done = format!(
                "{} before it failed (the failed chunk may have deleted some rows too)",
                deleted(&f.done)
            );
            return Err(store_err("prune", &f.error).after(&done));
        }
    };
    let done = deleted(&report);
    if as_json {
        emit_json(out, &json!({"dryRun": false, "deleted": report}))
    } else {
        emit(out, &format!("{done}\n"))
    }
    .map_err(|e| e.after(&done))
}

/// Events `tail` shows when not told where to start.
const TAIL_LAST: usize = 20;

/// Events `tail` reads at a time.
const TAIL_PAGE: usize = 500;

/// The sequence just before the last `n` retained events (0 when there are fewer). Sequences
/// have gaps (a dedupe hit spends one, pruning and deletion remove rows), so it widens a window
/// back from the newest until the window holds `n` events. A window is read a page at a time,
/// keeping its last `n + 1` events: a wide window of a sparse log may hold most of the log.
async fn before_the_last(store: &dyn AwarenessStore, n: usize) -> Result<Sequence, CliError> {
    let stats = store.log_stats().await.map_err(|e| store_err("tail", &e))?;
    if stats.rows <= n as u64 {
        // The whole log is within the last `n`.
        return Ok(Sequence::ZERO);
    }
    let top = stats.max_sequence.get();
    let mut width = n as u64;
    loop {
        let from = top.saturating_sub(width);
        let mut last: VecDeque<Sequence> = VecDeque::with_capacity(n + 1);
        let mut held = 0usize;
        let mut after = Sequence(from);
        loop {
            let page = store
                .events_after(after, TAIL_PAGE)
                .await
                .map_err(|e| store_err("tail", &e))?;
            for e in page.iter().take_while(|e| e.sequence.get() <= top) {
                held += 1;
                if last.len() > n {
                    last.pop_front();
                }
                last.push_back(e.sequence);
            }
            match page.last() {
                Some(e) if page.len() == TAIL_PAGE && e.sequence.get() < top => after = e.sequence,
                _ => break,
            }
        }
        if held >= n || from == 0 {
            return Ok(if held > n { last[0] } else { Sequence(from) });
        }
        width = width.saturating_mul(4);
    }
}

async fn tail(
    store: &dyn AwarenessStore,
    follow: bool,
    after: Option<u64>,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    // Installed before the first read, and kept across the loop: a Ctrl-C that comes while a
    // page is read or printed stops it at the next wait instead of being lost.
    let mut stop = if follow {
        Some(Box::pin(crate::upstream::interrupted()?))
    } else {
        None
    };
    let mut after = match after {
        Some(a) => Sequence(a),
        None => before_the_last(store, TAIL_LAST).await?,
    };
    let mut header = !as_json;
    loop {
        let page = store
            .events_after(after, TAIL_PAGE)
            .await
            .map_err(|e| store_err("tail", &e))?;
        if let Some(last) = page.last() {
            after = last.sequence;
            if as_json {
                let mut text = String::new();
                for e in &page {
                    text.push_str(&serde_json::to_string(&**e).unwrap_or_default());
                    text.push('\n');
                }
                emit(out, &text)?;
            } else {
                let table = render(&EVENT_HEADERS, &event_rows(&page));
                let body = if header {
                    table
                } else {
                    // Only the first page prints the header.
                    table
                        .split_once('\n')
                        .map_or_else(String::new, |(_, rows)| rows.to_owned())
                };
                header = false;
                emit(out, &body)?;
            }
            let _ = out.flush();
            if page.len() == TAIL_PAGE {
                // More to read at once, unless a Ctrl-C came meanwhile: a log that grows as
                // fast as it is printed would otherwise never reach the wait below.
                if let Some(stop) = stop.as_mut() {
                    tokio::select! {
                        biased;
                        () = stop.as_mut() => return Ok(()),
                        () = std::future::ready(()) => {}
                    }
                }
                continue;
            }
        }
        let Some(stop) = stop.as_mut() else {
            return Ok(());
        };
        tokio::select! {
            () = stop.as_mut() => return Ok(()),
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// `repair`: see [`gateway_adapter::repair_store`].
/// (`memory:` is refused before, by [`refuse_memory`]; a PostgreSQL store, which has no file
/// of ours either, is refused by the adapter, as a usage error too.)
async fn repair(cli: &Cli, out: &mut dyn Write) -> Result<i32, CliError> {
    let postgres = StoreUrl::parse(&cli.store).is_ok_and(|u| matches!(u, StoreUrl::Postgres(_)));
    let done = gateway_adapter::repair_store(&cli.store)
        .await
        .map_err(|e| match e {
            OpenError::BadUrl(_) | OpenError::NothingToRepair(_) => CliError::usage(e.to_string()),
            // A PostgreSQL URL sqlx cannot read.
            OpenError::Store(ref s)
                if postgres && s.open_failure() == Some(OpenFailure::InvalidOptions) =>
            {
                CliError::usage(ErrorChain(&e).to_string())
            }
            other => open_err(&other),
        })?;
    let (repaired, events, text) = match done {
        gateway_adapter::Repair::Reopened { events } => (
            true,
            events,
            "a read-only open refused it (its writer crashed, or it is of an older schema): \
             opened read-write and closed cleanly, which repaired it",
        ),
        gateway_adapter::Repair::NotNeeded { events } => (
            false,
            events,
            if StoreUrl::parse(&cli.store).is_ok_and(|u| matches!(u, StoreUrl::Sqlite(_))) {
                "SQLite needs no repair (readers recover its write-ahead log); checked \
                 read-only, unchanged"
            } else {
                "a read-only open takes it (closed cleanly, or open in a writer that lets \
                 readers in): nothing to repair; checked read-only, unchanged"
            },
        ),
    };
    if cli.json {
        emit_json(
            out,
            &json!({ "ok": true, "repaired": repaired, "events": events }),
        )
    } else {
        let store = crate::table::shown_store(&cli.store);
        emit(out, &format!("{store}: {text}; {events} event(s)\n"))
    }
    .map(|()| 0)
    .map_err(|e| {
        // Only a file opened read-write was written to (repaired, perhaps migrated): one that
        // needed nothing was only read, and there is nothing to tell of it.
        if repaired {
            e.after(&format!(
                "opened {} read-write and closed it cleanly (which repairs a file whose writer \
                 crashed, and migrates one of an older schema)",
                cli.store
            ))
        } else {
            e
        }
    })
}

async fn doctor(
    store: &dyn AwarenessStore,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<i32, CliError> {
    // The store may be live (a gateway, `monitor`): `audit_store` reads it in an order, and
    // reads again what a deletion between its reads could fake, so that no write meanwhile
    // shows as a problem.
    let audit = audit::audit_store(store)
        .await
        .map_err(|e| store_err("doctor", &e))?;
    let problems: Vec<String> = audit.findings.iter().map(ToString::to_string).collect();
    let stats = store
        .log_stats()
        .await
        .map_err(|e| store_err("doctor", &e))?;
    if as_json {
        emit_json(
            out,
            &json!({
                "ok": problems.is_empty(),
                "schema": "ok",
                "events": stats.rows,
                "heads": audit.heads,
                "cursors": audit.cursors,
                "problems": problems,
            }),
        )?;
    } else {
        let mut text = format!(
            "schema ok; {} event(s), {} head(s), {} cursor(s)\n",
            stats.rows, audit.heads, audit.cursors
        );
        if problems.is_empty() {
            text.push_str("no problems found\n");
        } else {
            for p in &problems {
                let _ = writeln!(text, "problem: {p}");
            }
        }
        emit(out, &text)?;
    }
    Ok(if problems.is_empty() { 0 } else { EXIT_FAILURE })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use awareness_core::async_trait;
    use awareness_core::reconcile::MAX_PAGE_LIMIT;
    use awareness_core::testkit::hooked::{Call, Hook, Hooked};

    use super::*;

    /// Counts a store's `events_after` calls and keeps the most events one call asked for and
    /// returned (a [`Hook`] of the testkit's [`Hooked`] store).
    #[derive(Default)]
    struct Reads {
        count: AtomicUsize,
        largest_limit: AtomicUsize,
        largest_page: AtomicUsize,
    }

    #[async_trait]
    impl Hook for Reads {
        async fn before(&self, call: Call, _: &dyn AwarenessStore) {
            if call == Call::EventsAfter {
                self.count.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn events_read(&self, limit: usize, returned: usize) {
            self.largest_limit.fetch_max(limit, Ordering::Relaxed);
            self.largest_page.fetch_max(returned, Ordering::Relaxed);
        }
    }

    impl Reads {
        /// The largest limit one read asked for, and the most events one read returned.
        fn largest(&self) -> (usize, usize) {
            (
                self.largest_limit.load(Ordering::Relaxed),
                self.largest_page.load(Ordering::Relaxed),
            )
        }
    }

    /// `store` behind a [`Reads`] hook.
    fn counted(store: Arc<dyn AwarenessStore>) -> Hooked<Reads> {
        Hooked {
            inner: store,
            hook: Reads::default(),
        }
    }

    fn parsed(out: &[u8]) -> Value {
        serde_json::from_slice(out)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(out)))
    }

    /// `tail` without `--after` finds where its last 20 events start a page at a time, in a log
    /// whose newest sequences are sparse (a deleted session took most of them) and whose older
    /// ones are dense: the window that holds 20 events holds all 610 of the log, which it read
    /// in one call asking for 5,120.
    #[tokio::test]
    async fn tail_finds_its_last_events_a_page_at_a_time() {
        let store = gateway_adapter::open_store("memory:").await.unwrap();
        let now = Timestamp::now();
        let session = |name: &str| SessionRef::parse(name, "main").unwrap();
        let (dense, sparse, gone) = (
            session("agent:main:subagent:dense"),
            session("agent:main:subagent:sparse"),
            session("agent:main:subagent:gone"),
        );
        let e = |r: &SessionRef| {
            NewEvent::new(
                r.clone(),
                EventKind::GoalChanged,
                ActorType::System,
                "goal updated",
            )
        };
        for _ in 0..600 {
            store.record(e(&dense), now).await.unwrap();
        }
        for i in 0..2_000 {
            let r = if i % 200 == 199 { &sparse } else { &gone };
            store.record(e(r), now).await.unwrap();
        }
        store.delete_session(&gone).await.unwrap();
        let paged = counted(store.clone());
        assert_eq!(
            before_the_last(&paged, TAIL_LAST).await.unwrap(),
            Sequence(590),
            "the last 20: the sparse session's 10 and the dense one's last 10 (591..=600)"
        );
        let (limit, page) = paged.hook.largest();
        assert!(
            limit <= TAIL_PAGE && page <= TAIL_PAGE,
            "tail asked for {limit} events in one read and held {page}"
        );
    }

    /// `prune --dry-run` on a log of more than two pages counts it a page at a time (it read the
    /// whole log into memory, asking for 5,000 events a read), and counts what it counted
    /// before; a real `prune` reads no event at all to preview (it read the whole log too).
    #[tokio::test]
    async fn prune_reads_the_log_a_page_at_a_time_and_only_for_a_dry_run() {
        let store = gateway_adapter::open_store("memory:").await.unwrap();
        let now = Timestamp::now();
        let long_ago = now.minus_ms(40 * Timestamp::DAY_MS);
        let busy = SessionRef::parse("agent:main:subagent:busy", "main").unwrap();
        for i in 0..450 {
            let at = if i < 300 { long_ago } else { now };
            let e = NewEvent::new(
                busy.clone(),
                EventKind::GoalChanged,
                ActorType::System,
                "goal updated",
            );
            store.record(e, at).await.unwrap();
        }
        // One cursor idle for 40 days, on a target nothing recorded to since.
        let idle = SessionRef::parse("agent:main:subagent:quiet", "main").unwrap();
        let manager = WatcherKey::parse("agent:main:main").unwrap();
        store.watch(&manager, &idle, long_ago).await.unwrap();
        // What the dry run counted before: the retention preview of the whole log at once.
        let mut all = Vec::new();
        let mut after = Sequence::ZERO;
        while let Some(last) = store
            .events_after(after, 1_000)
            .await
            .unwrap()
            .into_iter()
            .inspect(|e| all.push(e.occurred_at))
            .last()
        {
            after = last.sequence;
        }
        assert_eq!(all.len(), 450);
        let all_times = all.clone();
        let cursors = store.cursors(&CursorFilter::default()).await.unwrap();
        let whole = retention::preview(
            &RetentionPolicy::default(),
            now,
            all,
            cursors.iter().map(|c| c.updated_at),
        );
        assert_eq!((whole.events_by_age, whole.cursors), (300, 1));

        let paged = counted(store.clone());
        let mut out = Vec::new();
        prune(&paged, true, now, true, &mut out).await.unwrap();
        let dry = parsed(&out);
        assert_eq!(
            dry["wouldDelete"],
            json!({"eventsByAge": whole.events_by_age, "eventsByCap": whole.events_by_cap,
                "cursors": whole.cursors})
        );
        let (limit, page) = paged.hook.largest();
        assert!(
            limit <= MAX_PAGE_LIMIT && page <= MAX_PAGE_LIMIT,
            "the dry run asked for {limit} events in one read and held {page}"
        );

        // With a row cap the log is over, the cap counts the younger events of every page.
        let capped = RetentionPolicy {
            max_rows: 100,
            ..RetentionPolicy::default()
        };
        let (would, unread) = would_prune(&*store, &capped, now).await.unwrap();
        assert!(unread.is_none(), "every row read");
        let whole_capped = retention::preview(
            &capped,
            now,
            all_times.iter().copied(),
            cursors.iter().map(|c| c.updated_at),
        );
        assert_eq!(would, whole_capped);
        assert_eq!(
            would.events_by_cap, 50,
            "150 younger events over a cap of 100"
        );

        let paged = counted(store);
        let mut out = Vec::new();
        prune(&paged, false, now, true, &mut out).await.unwrap();
        let done = parsed(&out);
        assert_eq!(done["deleted"]["eventsByAge"], 300, "{done}");
        assert_eq!(done["deleted"]["cursors"], 1, "{done}");
        assert_eq!(
            paged.hook.count.load(Ordering::SeqCst),
            0,
            "a real prune read the log to preview it"
        );
    }

    /// Refuses every pruning chunk from the `nth` (from 1) on.
    struct ChunkFails {
        nth: usize,
        seen: AtomicUsize,
    }

    impl Hook for ChunkFails {
        fn refuse(&self, call: Call) -> Option<StoreError> {
            let n = (call == Call::PruneChunk).then(|| self.seen.fetch_add(1, Ordering::SeqCst));
            (n? + 1 >= self.nth).then(|| StoreError::corrupt("refused by the test"))
        }
    }

    /// A `prune` that fails part-way says what its committed chunks deleted (they stay
    /// deleted) beside the failure, as a floor (a backend may have committed part of the chunk
    /// that failed), and exits as a failure. It said only the failure, as if nothing had gone.
    #[tokio::test]
    async fn a_prune_that_fails_part_way_says_what_it_deleted() {
        let chunk = RetentionPolicy::default().chunk_rows;
        let now = Timestamp::now();
        let long_ago = now.minus_ms(40 * Timestamp::DAY_MS);
        let old = SessionRef::parse("agent:main:subagent:old", "main").unwrap();
        for nth in [1, 2] {
            let inner = gateway_adapter::open_store("memory:").await.unwrap();
            for _ in 0..chunk + 5 {
                let e = NewEvent::new(old.clone(), EventKind::GoalChanged, ActorType::System, "g");
                inner.record(e, long_ago).await.unwrap();
            }
            let store = Hooked {
                inner: inner.clone(),
                hook: ChunkFails {
                    nth,
                    seen: AtomicUsize::new(0),
                },
            };
            let mut out = Vec::new();
            let e = prune(&store, false, now, true, &mut out)
                .await
                .expect_err("the pass failed");
            assert_eq!(e.code, EXIT_FAILURE);
            assert!(out.is_empty(), "nothing printed as a result");
            assert!(e.message.contains("prune: "), "{}", e.message);
            let left = inner.log_stats().await.unwrap().rows;
            let (gone, chunks) = if nth == 1 { (0, 0) } else { (chunk, 1) };
            assert_eq!(
                left as usize,
                chunk + 5 - gone,
                "the committed chunks' rows are gone"
            );
            assert!(
                e.message.starts_with(&format!(
                    "deleted {gone} event(s) by age, 0 by the row cap, 0 idle cursor(s), in \
                     {chunks} chunk(s) before it failed (the failed chunk may have deleted some \
                     rows too), but prune: "
                )),
                "{}",
                e.message
            );
        }
    }

    /// Answers every cursor read with a busy store.
    struct CursorBusy;

    impl Hook for CursorBusy {
        fn refuse(&self, call: Call) -> Option<StoreError> {
            (call == Call::Cursor).then(|| StoreError::Busy {
                context: "read a cursor".into(),
                source: "database is locked".into(),
            })
        }
    }

    /// `ack` whose read of a target's cursor fails says that failure (a busy store: exit 75,
    /// to try again), not that the watcher has no cursor there. (What the mutation did: a
    /// failed read counted as no cursor, "no cursor of ... on ..." with exit 1 for a cursor
    /// that is there; review of stop 70, CE32.)
    #[tokio::test]
    async fn ack_says_a_cursor_read_that_failed_not_a_missing_cursor() {
        let inner = gateway_adapter::open_store("memory:").await.unwrap();
        let (w, t) = ("agent:main:main", "agent:main:subagent:c1");
        let wk = WatcherKey::parse(w).unwrap();
        let target = SessionRef::parse(t, "main").unwrap();
        inner.watch(&wk, &target, Timestamp::now()).await.unwrap();
        let store = Hooked {
            inner,
            hook: CursorBusy,
        };
        let cli =
            <Cli as clap::Parser>::try_parse_from(["awareness", "--store", "memory:", "ack", w, t])
                .unwrap();
        let checked = check_input(&cli).unwrap();
        let mut out = Vec::new();
        let e = on_store(&cli, checked, &store, &mut out)
            .await
            .expect_err("the cursor could not be read");
        assert_eq!(e.code, crate::EXIT_TEMPFAIL, "{}", e.message);
        assert!(
            e.message.contains("database is locked") && !e.message.contains("no cursor"),
            "{}",
            e.message
        );
        assert!(out.is_empty(), "nothing acknowledged");
    }

    /// Sends SIGINT to this process at the `nth` (from 1) `events_after` of `tail --follow`,
    /// outside its wait, and returns only once the runtime has handled the signal.
    #[cfg(unix)]
    struct InterruptOnRead {
        nth: usize,
        reads: Reads,
        heard: std::sync::Mutex<Option<tokio::signal::unix::Signal>>,
    }

    /// Held by a test that sends this process a SIGINT: every `tail --follow` running in the
    /// process would hear it.
    #[cfg(unix)]
    static SIGINT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    #[cfg(unix)]
    #[async_trait]
    impl Hook for InterruptOnRead {
        async fn before(&self, call: Call, store: &dyn AwarenessStore) {
            self.reads.before(call, store).await;
            if call != Call::EventsAfter || self.reads.count.load(Ordering::SeqCst) != self.nth {
                return;
            }
            let heard = self.heard.lock().unwrap().take();
            let mut heard = heard.expect("one interrupt");
            let sent = std::process::Command::new("kill")
                .args(["-INT", &std::process::id().to_string()])
                .status()
                .unwrap();
            assert!(sent.success());
            // Handled: every listener registered by now has been told, and none other will be.
            heard.recv().await;
            // The task of `tail`'s listener, told too, runs before the read goes on.
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        }
    }

    /// `tail --follow` stops on a Ctrl-C that comes while it reads a page, not only on one that
    /// comes while it waits: it listened only during the wait, with a new listener each time,
    /// so a signal handled between two waits was lost and it ran on.
    #[cfg(unix)]
    #[tokio::test]
    async fn tail_follow_stops_on_a_ctrl_c_that_comes_while_it_reads() {
        // The second read, after it has waited once (the first page being short).
        let (reads, _) = tail_interrupted_at_read(2, 0).await;
        assert_eq!(
            reads, 2,
            "it stopped at the wait after the interrupted read"
        );
    }

    /// `tail --follow` reading a backlog of full pages stops after the page it was reading when
    /// a Ctrl-C came, without waiting first: a log that grows as fast as it is printed never
    /// lets it reach the wait. (What the mutation did: read on while pages came full, stopping
    /// only at the wait after the whole backlog was printed; review of stop 68, CD06.)
    #[cfg(unix)]
    #[tokio::test]
    async fn tail_follow_stops_between_two_full_pages_on_a_ctrl_c() {
        let (reads, out) = tail_interrupted_at_read(1, TAIL_PAGE * 2 + 100).await;
        assert_eq!(
            (reads, out.lines().count()),
            (1, TAIL_PAGE),
            "tail --follow read on, and printed, past the full page it was reading when a \
             Ctrl-C came"
        );
    }

    /// Runs `tail --follow` from the start of a log of `backlog` events, a SIGINT sent to this
    /// process at its `nth` read ([`InterruptOnRead`]); answers how many reads it made, and what
    /// it printed.
    #[cfg(unix)]
    async fn tail_interrupted_at_read(nth: usize, backlog: usize) -> (usize, String) {
        use tokio::signal::unix::{SignalKind, signal};
        let _alone = SIGINT.lock().await;
        // Listening before the signal is sent also keeps SIGINT from ending the test process.
        let heard = signal(SignalKind::interrupt()).unwrap();
        let inner = gateway_adapter::open_store("memory:").await.unwrap();
        let now = Timestamp::now();
        let busy = SessionRef::parse("agent:main:subagent:busy", "main").unwrap();
        for _ in 0..backlog {
            let e = NewEvent::new(busy.clone(), EventKind::GoalChanged, ActorType::System, "g");
            inner.record(e, now).await.unwrap();
        }
        let store = Hooked {
            inner,
            hook: InterruptOnRead {
                nth,
                reads: Reads::default(),
                heard: std::sync::Mutex::new(Some(heard)),
            },
        };
        let mut out = Vec::new();
        // A hang guard, not a measure: tail returns at its next wait, in half a second.
        let tailed = tokio::time::timeout(
            Duration::from_mins(1),
            tail(&store, true, Some(0), true, &mut out),
        )
        .await;
        let reads = store.hook.reads.count.load(Ordering::SeqCst);
        assert!(
            tailed.is_ok(),
            "tail --follow ran on after a Ctrl-C that came during read {nth} ({reads} reads)"
        );
        tailed.unwrap().unwrap();
        (reads, String::from_utf8_lossy(&out).into_owned())
    }

    /// A store's error that names the command as a step of its own, followed by a `:` (the
    /// file named before it), is not prefixed with the command again: `store busy: /x.db:
    /// watch: ...`, not `watch: store busy: ... watch: ...`. (Only a following space counted,
    /// under mutation, and every test passed: review of stop 60.)
    #[test]
    fn a_store_error_naming_the_command_before_a_colon_names_it_once() {
        assert!(names_command(
            "store busy: /x.db: watch: database is locked",
            "watch"
        ));
        assert!(names_command("x: watch", "watch"));
        assert!(!names_command("x: watcher.db: locked", "watch"));
        // `store_err` names the command once: before a store's words that do not name it, and
        // not again before words that do. (What the mutation did: the command always put
        // first, "record: store busy: /x.db: record an event: ..."; review of stop 72, CK45.)
        let busy = StoreError::Busy {
            context: "/x.db: record an event".to_owned(),
            source: "database is locked".into(),
        };
        let e = store_err("record", &busy);
        assert_eq!(e.code, crate::EXIT_TEMPFAIL, "{}", e.message);
        assert!(
            e.message.starts_with("store busy: /x.db: record an event"),
            "{}",
            e.message
        );
        let corrupt = StoreError::Corrupt {
            context: "/x.db: row 3".to_owned(),
            source: None,
        };
        let e = store_err("record", &corrupt);
        assert_eq!(e.code, crate::EXIT_FAILURE, "{}", e.message);
        assert_eq!(e.message, "record: corrupt store: /x.db: row 3");
        // The usage error's ordinal of an eleventh argument (the teens end in "th").
        for (n, said) in [
            (1, "1st"),
            (2, "2nd"),
            (3, "3rd"),
            (11, "11th"),
            (12, "12th"),
            (13, "13th"),
            (21, "21st"),
            (111, "111th"),
        ] {
            assert_eq!(ordinal(n), said);
        }
    }
}
