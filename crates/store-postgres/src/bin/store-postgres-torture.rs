//! Test helper of store-postgres's reliability tests (not an interface): a separate process
//! that writes to a store on a server, so the tests can kill it or run it beside other
//! writers. `<url>` is a store URL (`store_postgres::parse_url`), its schema included.
//!
//! ```text
//! store-postgres-torture record <url> <targets>           record forever from 4 tasks, print a line
//!                                                         per recording; exit 3 at once if a task
//!                                                         fails or panics
//! store-postgres-torture go-halves <url> <tag> <count>    read a line from stdin, connect, record
//!                                                         <count> events printing each sequence,
//!                                                         print `half` after the first half and
//!                                                         read a line before the second; exit 0
//! ```
//!
//! `record` prints `<sequence> <target> <stored|hit> <dedupe key|->` after each recording
//! returned: the returned event's sequence and target (for a dedupe hit, the event stored
//! first). `go-halves` prints `<sequence> <session key>`.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

use awareness_core::{
    AckTarget, ActorType, CursorStore, EventKind, EventStore, NewEvent, SessionKey, SessionRef,
    Timestamp, WatcherKey,
};
use store_postgres::PgStore;

/// The watcher that watches every torture target.
const WATCHER: &str = "agent:main:torture-watcher";

/// Concurrent recording tasks of `record`: while one transaction is in flight the others
/// queue, and group commit records them together, so a kill often finds a batch in a
/// transaction and recordings waiting.
const RECORDERS: usize = 4;

/// The exit code of `record` when one of its recorders ended (it never ends otherwise).
const RECORDER_FAILED: i32 = 3;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn target(i: usize) -> SessionRef {
    SessionRef::parse(&format!("agent:main:subagent:t{i}"), "main").expect("target")
}

fn human(session: &SessionRef) -> NewEvent {
    NewEvent::new(
        session.clone(),
        EventKind::HumanDirectMessage,
        ActorType::Human,
        "human message via torture",
    )
    .with_actor_id("user-1")
}

async fn record_forever(url: &str, targets: usize) -> Result<(), BoxError> {
    let store = Arc::new(PgStore::connect_url(url).await?);
    let watcher = WatcherKey::parse(WATCHER)?;
    for i in 0..targets {
        store.watch(&watcher, &target(i), Timestamp::now()).await?;
    }
    let mut recorders = tokio::task::JoinSet::new();
    for k in 0..RECORDERS {
        recorders.spawn(recorder(Arc::clone(&store), targets, k));
    }
    // Recorders run until the process is killed: the first to end failed (an error or a
    // panic). Say so and exit at once, with a code of its own, so the parent tells this from
    // the kill it expects.
    let ended = recorders.join_next().await.expect("recorders were spawned");
    let why = match ended {
        Ok(Ok(())) => "returned".to_owned(),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    eprintln!("store-postgres-torture: a recorder ended: {why}");
    std::process::exit(RECORDER_FAILED);
}

/// The dedupe key of call `n` of this process, on every tenth call: one of a few keys shared
/// by every process (stored once, then a hit in every later process, across kills: from the
/// second call on, as a writer makes few calls before its kill); a new key; or the key of call
/// `n - 10` again (a hit on this process's own event).
fn dedupe_key(n: usize) -> Option<String> {
    let pid = std::process::id();
    match n % 30 {
        1 => Some(format!("torture-shared-{}", (n / 30) % 4)),
        11 => Some(format!("torture-{pid}-{n}")),
        21 => Some(format!("torture-{pid}-{}", n - 10)),
        _ => None,
    }
}

/// One recording task: calls `k`, `k + RECORDERS`, ... of the process; every seventh call
/// also acknowledges the watcher's cursor on its target.
async fn recorder(store: Arc<PgStore>, targets: usize, k: usize) -> Result<(), BoxError> {
    let watcher = WatcherKey::parse(WATCHER)?;
    let keys: Vec<SessionKey> = (0..targets).map(|i| target(i).session_key).collect();
    for n in (k..).step_by(RECORDERS) {
        let t = n % targets;
        let mut e = human(&target(t));
        let key = dedupe_key(n);
        if let Some(key) = &key {
            e = e.with_dedupe_key(key.clone());
        }
        let rec = store.record(e, Timestamp::now()).await?;
        let returned = keys
            .iter()
            .position(|s| *s == rec.event.session_key)
            .ok_or("the returned event is on no target")?;
        let line = format!(
            "{} {returned} {} {}\n",
            rec.event.sequence,
            if rec.deduplicated { "hit" } else { "stored" },
            key.as_deref().unwrap_or("-"),
        );
        {
            let mut out = std::io::stdout().lock();
            out.write_all(line.as_bytes())?;
            out.flush()?;
        }
        if n % 7 == 3 {
            store
                .acknowledge(
                    &watcher,
                    &[AckTarget::any(keys[t].clone())],
                    Timestamp::now(),
                )
                .await?;
        }
    }
    Ok(())
}

/// Waits for a line on stdin, then records `count` events on `agent:<tag>:s0` to `s9`,
/// printing each, with `half` and another wait for a line between the two halves.
async fn go_halves(url: &str, tag: &str, count: usize) -> Result<(), BoxError> {
    std::io::stdin().read_line(&mut String::new())?;
    let store = PgStore::connect_url(url).await?;
    let mut out = std::io::stdout().lock();
    for i in 0..count {
        if i == count / 2 {
            writeln!(out, "half")?;
            out.flush()?;
            std::io::stdin().read_line(&mut String::new())?;
        }
        let session = SessionRef::parse(&format!("agent:{tag}:s{}", i % 10), tag)?;
        let rec = store.record(human(&session), Timestamp::now()).await?;
        writeln!(out, "{} {}", rec.event.sequence, session.session_key)?;
    }
    out.flush()?;
    store.pool().close().await;
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let result: Result<(), BoxError> = rt.block_on(async {
        match argv.as_slice() {
            ["record", url, targets] => record_forever(url, targets.parse()?).await,
            ["go-halves", url, tag, count] => go_halves(url, tag, count.parse()?).await,
            _ => Err("usage: store-postgres-torture record|go-halves ...".into()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("store-postgres-torture: {e}");
            ExitCode::FAILURE
        }
    }
}
