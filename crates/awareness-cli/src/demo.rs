//! `awareness demo`: a manager, two subagents, a human who steps in, and what each session
//! learns, narrated as a timeline, through the real adapter and store.

use std::io::Write;
use std::sync::Arc;

use awareness_core::{AwarenessStore, Sequence, SessionKey, Timestamp};
use gateway_adapter::{
    Awareness, AwarenessConfig, CoalescingWake, HeartbeatWake, HumanMessage, InMemoryDirectory,
    InMemoryQueue, ManualClock, RecordingWake, RunOutcome, SessionEntry, StoreUrl,
    SystemEventQueue, WakeSink,
};

use crate::table::render;
use crate::{Cli, CliError};

struct Stage {
    svc: Awareness,
    queue: Arc<InMemoryQueue>,
    woken: Arc<RecordingWake>,
}

fn stage(
    store: Arc<dyn AwarenessStore>,
    dir: &Arc<InMemoryDirectory>,
    clock: &Arc<ManualClock>,
) -> Stage {
    let queue = Arc::new(InMemoryQueue::new());
    let woken = Arc::new(RecordingWake::new());
    let rec = Arc::clone(&woken);
    let sink: WakeSink = Arc::new(move |s, r| rec.wake(s, r));
    let svc = Awareness::builder(
        store,
        queue.clone(),
        Arc::new(CoalescingWake::new(sink)),
        dir.clone(),
    )
    .clock(clock.clone())
    .build();
    Stage { svc, queue, woken }
}

struct Narrator<'a> {
    out: &'a mut dyn Write,
    start: Timestamp,
    clock: Arc<ManualClock>,
    /// Steps that did not happen as told (a recording the store refused, say): the adapter
    /// carries on past them, as a gateway must, and the demo then fails at its end.
    missed: usize,
}

impl Narrator<'_> {
    /// `done`, counted as a missed step when it is `None`.
    fn count<T>(&mut self, done: Option<T>) -> Option<T> {
        if done.is_none() {
            self.missed += 1;
        }
        done
    }

    fn at(&mut self, secs: i64, what: &str) -> Result<(), CliError> {
        self.clock.set(self.start.plus_ms(secs * 1_000));
        self.line(&format!("[+{secs:>3}s] {what}"))
    }

    fn line(&mut self, text: &str) -> Result<(), CliError> {
        writeln!(self.out, "{text}").map_err(|e| CliError::output(&e))
    }

    fn detail(&mut self, text: &str) -> Result<(), CliError> {
        for l in text.lines() {
            self.line(&format!("         {l}"))?;
        }
        Ok(())
    }
}

fn k(s: &str) -> SessionKey {
    SessionKey::new(s).expect("demo keys are valid")
}

/// Runs the demo; returns the exit code.
///
/// The store is closed before this returns, an early error's return included (output that
/// cannot be written, say): the demo's events are then in the file itself, not left in
/// SQLite's log by a process that exits at once.
pub async fn run(cli: &Cli, out: &mut dyn Write) -> Result<i32, CliError> {
    let url = StoreUrl::parse(&cli.store).map_err(|e| CliError::usage(e.to_string()))?;
    let store = crate::commands::open(cli).await?;
    // The one store handle outside the stages: the restart puts the reopened store here.
    let mut open = Some(store);
    let result = narrate(cli, &url, &mut open, out).await;
    if let Some(store) = open.take() {
        store.close().await;
    }
    result
}

/// A handle on the open store, for a stage (dropped with it).
fn handle(open: Option<&Arc<dyn AwarenessStore>>) -> Result<Arc<dyn AwarenessStore>, CliError> {
    open.cloned()
        .ok_or_else(|| CliError::failure("the demo's store is closed"))
}

/// The demo itself, on the store in `open`; every stage is dropped when it returns.
#[allow(clippy::too_many_lines)]
async fn narrate(
    cli: &Cli,
    url: &StoreUrl,
    open: &mut Option<Arc<dyn AwarenessStore>>,
    out: &mut dyn Write,
) -> Result<i32, CliError> {
    let where_ = match url {
        StoreUrl::Sqlite(p) | StoreUrl::Redb(p) => std::path::absolute(p)
            .unwrap_or_else(|_| p.clone())
            .display()
            .to_string(),
        StoreUrl::Memory => "memory (gone when the demo ends)".to_owned(),
    };
    let start = Timestamp::now();
    // A tag per run keeps runs on the same file apart.
    let tag = format!("demo-{:x}", start.millis() % 0xff_ffff);
    let manager = k(&format!("agent:main:{tag}"));
    let research = k(&format!("agent:main:{tag}:subagent:research"));
    let writer = k(&format!("agent:main:{tag}:subagent:writer"));
    let peer = k(&format!("agent:ops:{tag}"));

    let clock = Arc::new(ManualClock::new(start));
    let dir = Arc::new(InMemoryDirectory::new());
    for s in [&manager, &peer] {
        dir.upsert(s.clone(), SessionEntry::default());
    }
    for child in [&research, &writer] {
        dir.upsert(
            child.clone(),
            SessionEntry {
                spawned_by: Some(manager.clone()),
                ..SessionEntry::default()
            },
        );
    }
    let mut n = Narrator {
        out,
        start,
        clock: clock.clone(),
        missed: 0,
    };
    n.line("Session state awareness: a demo through the real adapter and store")?;
    n.line(&format!("store: {where_}"))?;
    n.line("")?;

    let s = stage(handle(open.as_ref())?, &dir, &clock);
    n.at(0, &format!("{manager} spawns two subagents"))?;
    for (child, run) in [(&research, "run-research"), (&writer, "run-writer")] {
        let run = format!("{tag}-{run}");
        let ev = s.svc.subagent_spawned(child, None, &manager, &run).await;
        let ev = n.count(ev);
        let seq = ev.map_or_else(|| "not recorded".to_owned(), |e| format!("#{}", e.sequence));
        n.detail(&format!(
            "child_spawned {seq} on {child}: the manager's cursor is seeded there"
        ))?;
    }

    n.at(
        5,
        &format!("a human types straight into {research}, five times"),
    )?;
    for _ in 0..5 {
        let mut m = HumanMessage::new(research.clone());
        m.channel = Some("telegram".into());
        m.actor_id = Some("user-7".into());
        let ev = s.svc.human_message(m).await;
        n.count(ev);
    }
    let queued = s.queue.peek(&manager);
    n.detail(&format!("the manager's queue holds {} line:", queued.len()))?;
    for q in &queued {
        n.detail(&format!("  {}", q.text))?;
    }
    n.detail(&format!(
        "the manager was woken {} time(s) (coalesced)",
        s.woken.count(&manager)
    ))?;

    n.at(
        12,
        "the manager takes its turn: drains, then reconciles before acting",
    )?;
    let drained = s.svc.drain_turn(&manager).await;
    n.detail(&format!(
        "drained {} line(s) and acknowledged them",
        drained.len()
    ))?;
    let since = first_since(&queued);
    let status = s
        .svc
        .session_status(&manager, &research, None, Some(Sequence(since)), None)
        .await
        .map_err(|_| CliError::failure("the demo's manager cannot see its child"))?;
    if let Some(page) = &status.state_changes {
        n.detail(&format!(
            "session_status sessionKey \"{research}\" changesSince {since}: stateVersion {}, {} event(s)",
            status.state_version,
            page.events.len()
        ))?;
        let rows: Vec<Vec<String>> = page
            .events
            .iter()
            .map(|e| {
                vec![
                    e.sequence.to_string(),
                    e.kind.to_string(),
                    e.actor_type.to_string(),
                    e.summary.clone(),
                ]
            })
            .collect();
        n.detail(&render(&["SEQ", "KIND", "ACTOR", "SUMMARY"], &rows))?;
    }

    n.at(
        14,
        &format!("while the manager acts, the human types into {research} again"),
    )?;
    let mut m = HumanMessage::new(research.clone());
    m.channel = Some("slack".into());
    let ev = s.svc.human_message(m).await;
    n.count(ev);
    let follow = s.queue.peek(&manager);
    n.detail(&format!("exactly {} follow-up line:", follow.len()))?;
    for q in &follow {
        n.detail(&format!("  {}", q.text))?;
    }

    n.at(20, "the gateway restarts: every in-memory queue is lost")?;
    drop(s);
    if *url != StoreUrl::Memory {
        // As a gateway that stops does: the file is closed before it is opened again.
        if let Some(store) = open.take() {
            store.close().await;
        }
        *open = Some(crate::commands::open(cli).await?);
    }
    let s = stage(handle(open.as_ref())?, &dir, &clock);
    n.detail(&format!(
        "queue after restart: {} line(s)",
        s.queue.peek(&manager).len()
    ))?;
    let report = s.svc.startup().await;
    n.detail(&format!(
        "start-up: pruning pass ({} event(s) deleted), sweep re-delivered {} notice(s):",
        report.pruned.events_by_age + report.pruned.events_by_cap,
        report.redelivered
    ))?;
    for q in s.queue.peek(&manager) {
        n.detail(&format!("  {}", q.text))?;
    }
    let drained = s.svc.drain_turn(&manager).await;
    n.detail(&format!(
        "the manager's next turn drains {} line(s); nothing is left pending",
        drained.len()
    ))?;

    n.at(30, &format!("{writer} ends with a timeout"))?;
    let ended = s
        .svc
        .subagent_ended(
            &writer,
            None,
            &format!("{tag}-run-writer"),
            RunOutcome::Timeout,
        )
        .await;
    if let Some(e) = n.count(ended) {
        n.detail(&format!(
            "{} #{}: \"{}\" {} (log only: no notice)",
            e.kind,
            e.sequence,
            e.summary,
            e.payload
                .as_ref()
                .map(|p| serde_json::to_string(p).unwrap_or_default())
                .unwrap_or_default()
        ))?;
    }
    n.detail(&format!(
        "manager's queue: {} line(s)",
        s.queue.peek(&manager).len()
    ))?;

    n.at(
        35,
        &format!("{peer} sends a message to {writer} with watch: true"),
    )?;
    let watched = s.svc.watch_after_send(&peer, &writer, None, true).await;
    n.count(watched.watched.then_some(()));
    n.detail(&format!(
        "sessions_send: dispatched, watched: {}",
        watched.watched
    ))?;
    let mut m = HumanMessage::new(writer.clone());
    m.channel = Some("discord".into());
    let ev = s.svc.human_message(m).await;
    n.count(ev);
    n.detail(&format!("a human types into {writer}; {peer} gets:"))?;
    for q in s.queue.peek(&peer) {
        n.detail(&format!("  {}", q.text))?;
    }

    n.at(
        40,
        &format!("another gateway process on the same file records a human turn in {research}"),
    )?;
    another_gateway(cli, &s, &manager, &research, &clock, &mut n).await?;

    n.line("")?;
    n.line(&format!(
        "final session_status of {research} (changesSince 0):"
    ))?;
    let status = s
        .svc
        .session_status(&manager, &research, None, Some(Sequence::ZERO), None)
        .await
        .map_err(|_| CliError::failure("the demo's manager cannot see its child"))?;
    n.line(&serde_json::to_string_pretty(&status).unwrap_or_default())?;
    n.line("")?;
    if *url == StoreUrl::Memory {
        n.line("the store was in memory; nothing was left behind")?;
    } else {
        n.line(&format!(
            "the database is left at {where_} for inspection, e.g.:"
        ))?;
        n.line(&format!("  awareness --store {} list", cli.store))?;
        n.line(&format!(
            "  awareness --store {} cursors --watcher {manager}",
            cli.store
        ))?;
    }
    if n.missed > 0 {
        return Err(CliError::failure(format!(
            "the demo did not run as told: {} step(s) did not happen (the warnings above say why)",
            n.missed
        )));
    }
    Ok(0)
}

/// The act of a second gateway process sharing the store (DESIGN.md section 9.1): it records
/// a change on `research`, delivers nothing for `manager`, which it does not own, and this
/// gateway's pick-up queues the notice and wakes the manager. A store with one writer (redb,
/// memory) says so instead.
async fn another_gateway(
    cli: &Cli,
    s: &Stage,
    manager: &SessionKey,
    research: &SessionKey,
    clock: &Arc<ManualClock>,
    n: &mut Narrator<'_>,
) -> Result<(), CliError> {
    let before = s.svc.store().foreign_commits().await.ok().flatten();
    if before.is_none() {
        n.detail("skipped: this store has one writer, so no other process records on it")?;
        return Ok(());
    }
    // Its own handle on the file, as another process has; it owns none of these sessions.
    let theirs = crate::commands::open(cli).await?;
    let other = Awareness::builder(
        Arc::clone(&theirs),
        Arc::new(InMemoryQueue::new()),
        Arc::new(RecordingWake::new()),
        Arc::new(InMemoryDirectory::new()),
    )
    .clock(clock.clone())
    .config(AwarenessConfig {
        owned_watchers_only: true,
        ..AwarenessConfig::default()
    })
    .build();
    let mut m = HumanMessage::new(research.clone());
    m.channel = Some("whatsapp".into());
    m.entry = Some(SessionEntry {
        spawned_by: Some(manager.clone()),
        ..SessionEntry::default()
    });
    let recorded = other.human_message(m).await;
    let recorded = n.count(recorded);
    drop(other);
    theirs.close().await;
    n.detail(&format!(
        "recorded there as {}; that process queues nothing for the manager, which it does not own",
        recorded.map_or_else(|| "nothing".to_owned(), |e| format!("#{}", e.sequence))
    ))?;
    let after = s.svc.store().foreign_commits().await.ok().flatten();
    n.detail(&format!(
        "this gateway asks the file whether another writer committed: {}",
        if after == before { "no" } else { "yes" }
    ))?;
    let queued_before = s.queue.peek(manager);
    let picked = s.svc.pick_up().await;
    n.detail(&format!(
        "its pick-up queues {} line(s) for the manager and asks to wake it:",
        picked.queued
    ))?;
    for q in s.queue.peek(manager) {
        if !queued_before.contains(&q) {
            n.detail(&format!("  {}", q.text))?;
        }
    }
    Ok(())
}

/// The `changesSince` of the first queued notice (what the manager reads).
fn first_since(queued: &[gateway_adapter::QueuedEntry]) -> u64 {
    queued
        .first()
        .and_then(|q| q.text.rsplit(' ').next())
        .and_then(|n| n.trim_end_matches('.').parse().ok())
        .unwrap_or(0)
}
