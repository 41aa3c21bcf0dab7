//! `awareness adopt` and `awareness monitor`: adopt a Claude Code transcript for a session, then
//! watch it for human turns typed straight into it (DESIGN.md section 8).

use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use awareness_core::{FullStore, LinkSpec, SessionKey, SessionRef, WatcherKey};
use gateway_adapter::upstream::jsonl::{self, JsonlMarker};
use gateway_adapter::upstream::{Detection, JsonlProvider, MonitorConfig, UpstreamMonitor};
use gateway_adapter::{Awareness, InMemoryDirectory, InMemoryQueue, RecordingWake};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::{Cli, CliError};

/// Flags of `awareness adopt`.
#[derive(Debug, clap::Args)]
pub struct AdoptArgs {
    /// The session key the transcript is adopted into.
    pub key: String,
    /// The Claude Code transcript (one JSON object per line).
    #[arg(long)]
    pub file: PathBuf,
    /// The session's agent (default: the key's agent, else main).
    #[arg(long)]
    pub agent: Option<String>,
    /// The catalog the session comes from (the channel of its events).
    #[arg(long, default_value = "claude-code")]
    pub catalog: String,
    /// The host holding the transcript.
    #[arg(long, default_value = "local")]
    pub host: String,
    /// The external thread id (default: the file's name without extension).
    #[arg(long)]
    pub thread: Option<String>,
    /// Also make this session (agent-qualified) watch the adopted one: the monitor only
    /// checks sessions that something watches.
    #[arg(long)]
    pub watcher: Option<String>,
}

/// The longest any of `monitor`'s durations may be: a larger one is a usage error (exit 2),
/// not a task that panics when it adds the duration to the clock.
const WEEK_SECS: u64 = 7 * 24 * 3600;

/// Flags of `awareness monitor`.
#[derive(Debug, clap::Args)]
pub struct MonitorArgs {
    /// Seconds between two ticks (1 to a week).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=WEEK_SECS))]
    pub interval_secs: u64,
    /// Seconds before the first tick (up to a week).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(0..=WEEK_SECS))]
    pub first_tick_secs: u64,
    /// Seconds one check of a source may take (1 to a week).
    #[arg(long, default_value_t = 45, value_parser = clap::value_parser!(u64).range(1..=WEEK_SECS))]
    pub timeout_secs: u64,
    /// Also print a line at the end of every tick.
    #[arg(long)]
    pub verbose: bool,
}

fn emit(out: &mut dyn Write, text: &str) -> Result<(), CliError> {
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| CliError::failure(format!("cannot write output: {e}")))
}

fn service(store: &Arc<dyn FullStore>) -> Arc<Awareness> {
    // Notices are durable in the store's cursors; the gateway delivers them on its own turns.
    Arc::new(
        Awareness::builder(
            store.clone(),
            Arc::new(InMemoryQueue::new()),
            Arc::new(RecordingWake::new()),
            Arc::new(InMemoryDirectory::new()),
        )
        .upstream(store.clone())
        .build(),
    )
}

/// `awareness adopt KEY --file PATH`.
pub async fn adopt(cli: &Cli, args: &AdoptArgs, out: &mut dyn Write) -> Result<i32, CliError> {
    let key = SessionKey::new(&args.key).map_err(|e| CliError::usage(e.to_string()))?;
    let agent = crate::commands::agent_for(&key, args.agent.as_deref(), None)?;
    let session = SessionRef::new(key.clone(), agent);
    let watcher = args
        .watcher
        .as_deref()
        .map(WatcherKey::parse)
        .transpose()
        .map_err(|e| CliError::usage(e.to_string()))?;
    if let Some(w) = &watcher {
        awareness_core::protocol::check_watch(w.session_key(), &key)
            .map_err(|e| CliError::usage(e.to_string()))?;
    }
    let spec = jsonl::adoption(session.clone(), &args.file, args.thread.as_deref())
        .map_err(|e| CliError::failure(format!("cannot read {}: {e}", args.file.display())))?;
    let spec = LinkSpec {
        catalog_id: args.catalog.clone(),
        host_id: args.host.clone(),
        ..spec
    };
    // Checked before the store is opened: bad flags create or migrate no file.
    spec.validate()
        .map_err(|e| CliError::usage(format!("adopt: {e}")))?;
    let store = crate::commands::open_full(cli).await?;
    let code = adopt_into(&store, spec, watcher.as_ref(), &session, cli.json, out).await;
    // Every handle the adoption took is dropped by now: this closes the file cleanly.
    store.close().await;
    code
}

/// Adopts `spec` into the open store and reports it.
async fn adopt_into(
    store: &Arc<dyn FullStore>,
    spec: LinkSpec,
    watcher: Option<&WatcherKey>,
    session: &SessionRef,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<i32, CliError> {
    let svc = service(store);
    let adopted = svc
        .try_adopt(spec)
        .await
        .map_err(|e| CliError::failure(format!("adopt: {e}")))?;
    if let Some(w) = watcher {
        store
            .watch(w, session, svc.now())
            .await
            .map_err(|e| CliError::failure(format!("watch: {e}")))?;
    }
    let link = &adopted.link;
    let from = link
        .marker
        .as_ref()
        .and_then(JsonlMarker::from_value)
        .map_or(0, |m| m.position());
    if as_json {
        let text = serde_json::to_string_pretty(&json!({
            "link": link,
            "created": adopted.created,
            "rebased": adopted.rebased,
            "watcher": watcher,
        }))
        .unwrap_or_default();
        return emit(out, &format!("{text}\n")).map(|()| 0);
    }
    let how = match (adopted.created, adopted.rebased) {
        (true, _) => "new link",
        (false, true) => "the source changed: rebased",
        (false, false) => "same source: the link and its marker are kept",
    };
    let path = jsonl::path_of(link).unwrap_or_default();
    let mut text = format!(
        "adopted {session} from {} ({how})\n  transcript {} (thread {}), read from byte {from} on\n",
        link.catalog_id,
        path.display(),
        link.thread_id
    );
    match &watcher {
        Some(w) => {
            let _ = writeln!(text, "  watched by {w}");
        }
        None => text.push_str(
            "  nothing is known to watch it yet: `awareness monitor` checks watched sessions only\n",
        ),
    }
    emit(out, &text).map(|()| 0)
}

fn detection_json(d: &Detection) -> Value {
    let session = |s: &SessionRef| json!({"sessionKey": s.session_key, "agentId": s.agent_id});
    match d {
        Detection::HumanTurns {
            session: s,
            catalog_id,
            turns,
            event,
            marker,
        } => json!({"detection": "human", "session": session(s), "channel": catalog_id,
            "turns": turns, "sequence": event.sequence, "markerAdvanced": marker.is_moved()}),
        Detection::Missing {
            session: s,
            consecutive,
        } => json!({"detection": "missing", "session": session(s), "consecutive": consecutive}),
        Detection::UpstreamMissing {
            session: s,
            catalog_id,
            event,
            link_removed,
        } => json!({"detection": "upstream_missing", "session": session(s), "channel": catalog_id,
            "sequence": event.sequence, "linkRemoved": link_removed}),
        Detection::Rebased { session: s } => json!({"detection": "rebased", "session": session(s)}),
        Detection::Deferred { session: s } => {
            json!({"detection": "deferred", "session": session(s)})
        }
        Detection::Failed { session: s, error } => {
            json!({"detection": "failed", "session": session(s), "error": error})
        }
        Detection::TickDone(r) => json!({"detection": "tick", "tick": r.tick, "links": r.links,
            "checked": r.checked, "unwatched": r.unwatched, "deferred": r.deferred}),
    }
}

/// Resolves when the process is asked to stop (Ctrl-C). The handler is installed before this
/// returns, so a signal that arrives from then on is never lost.
fn interrupted() -> Result<impl Future<Output = ()>, CliError> {
    #[cfg(unix)]
    {
        let mut sig = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(|e| CliError::failure(format!("cannot handle Ctrl-C: {e}")))?;
        Ok(async move {
            sig.recv().await;
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

/// `awareness monitor`: runs until Ctrl-C, printing each detection.
pub async fn monitor(cli: &Cli, args: &MonitorArgs, out: &mut dyn Write) -> Result<i32, CliError> {
    let stop = interrupted()?;
    let store = crate::commands::open_full(cli).await?;
    let code = monitor_links(cli, args, &store, stop, out).await;
    // The monitor is stopped and dropped by now: this closes the file cleanly.
    store.close().await;
    code
}

/// Runs the monitor on the open store until `stop`, printing each detection.
async fn monitor_links(
    cli: &Cli,
    args: &MonitorArgs,
    store: &Arc<dyn FullStore>,
    stop: impl Future<Output = ()>,
    out: &mut dyn Write,
) -> Result<i32, CliError> {
    let links = store
        .links()
        .await
        .map_err(|e| CliError::failure(format!("monitor: {e}")))?;
    let config = MonitorConfig {
        first_tick: Duration::from_secs(args.first_tick_secs),
        interval: Duration::from_secs(args.interval_secs.max(1)),
        provider_timeout: Duration::from_secs(args.timeout_secs.max(1)),
        ..MonitorConfig::default()
    };
    let monitor = UpstreamMonitor::builder(service(store), store.clone())
        .provider(Arc::new(JsonlProvider::new()))
        .config(config)
        .build();
    let mut rx = monitor.subscribe();
    let task = monitor.spawn();
    if !cli.json {
        emit(
            out,
            &format!(
                "monitoring {} adopted session(s) in {}: first check in {} s, then every {} s (Ctrl-C stops)\n",
                links.len(),
                cli.store,
                args.first_tick_secs,
                config.interval.as_secs()
            ),
        )?;
    }
    tokio::pin!(stop);
    let result = loop {
        let d = tokio::select! {
            () = &mut stop => break Ok(()),
            d = rx.recv() => d,
        };
        let line = match d {
            Ok(Detection::TickDone(_)) if !args.verbose => continue,
            Ok(d) if cli.json => format!("{}\n", detection_json(&d)),
            Ok(d) => format!("{d}\n"),
            Err(RecvError::Lagged(n)) => format!("({n} detection(s) not shown: output too slow)\n"),
            Err(RecvError::Closed) => break Ok(()),
        };
        if let Err(e) = emit(out, &line) {
            break Err(e);
        }
    };
    task.stop().await;
    result?;
    if !cli.json {
        emit(out, "monitor stopped\n")?;
    }
    Ok(0)
}
