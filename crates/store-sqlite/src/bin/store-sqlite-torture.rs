//! Test helper of store-sqlite's reliability tests (not an interface): a separate process that
//! writes to a store file so the tests can kill it, run it beside another writer, or run it as
//! another user.
//!
//! ```text
//! store-sqlite-torture record <db> <targets>        record forever from 4 tasks, print a line per recording;
//!                                                   exit 3 at once if a task fails or panics
//! store-sqlite-torture batch <db> <tag> <count>     record <count> events, print each sequence, exit 0
//! store-sqlite-torture open <db>                    open once; exit 0, or print the error and exit 2
//! store-sqlite-torture go-batch <db> <tag> <count>  read a line from stdin, then as batch
//! store-sqlite-torture go-halves <db> <tag> <count> as go-batch, printing `half` after the first
//!                                                   half and reading a line before the second
//! ```
//!
//! `record` prints `<sequence> <target> <write transactions> <stored|hit> <dedupe key|->` after
//! each recording returned: the returned event's sequence and target (for a dedupe hit, the
//! event stored first), and the handle's write-transaction count read after it returned.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

use awareness_core::{
    AckTarget, ActorType, CursorStore, EventKind, EventStore, NewEvent, SessionKey, SessionRef,
    Timestamp, WatcherKey,
};
use store_sqlite::SqliteStore;

/// The watcher that watches every torture target.
pub const WATCHER: &str = "agent:main:torture-watcher";

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

/// Concurrent recording tasks of `record`, so group commit puts several in one transaction.
const RECORDERS: usize = 4;

async fn record_forever(db: &str, targets: usize) -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(SqliteStore::open(db).await?);
    let watcher = WatcherKey::parse(WATCHER)?;
    for i in 0..targets {
        store.watch(&watcher, &target(i), Timestamp::now()).await?;
    }
    let mut recorders = tokio::task::JoinSet::new();
    for k in 0..RECORDERS {
        recorders.spawn(recorder(Arc::clone(&store), targets, k));
    }
    // Recorders run until the process is killed: the first to end failed (an error or a
    // panic). The others must not run on without it: say so and exit at once, with a code of
    // its own, so the parent tells this from the kill it expects.
    let ended = recorders.join_next().await.expect("recorders were spawned");
    let why = match ended {
        Ok(Ok(())) => "returned".to_owned(),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    eprintln!("store-sqlite-torture: a recorder ended: {why}");
    std::process::exit(RECORDER_FAILED);
}

/// The exit code of `record` when one of its recorders ended (it never ends otherwise).
const RECORDER_FAILED: i32 = 3;

/// The dedupe key of call `n` of this process, on every tenth call: one of a few keys shared
/// by every process (stored once, then a hit in every later process, across crashes); a new
/// key; or the key of call `n - 10` again (a hit, often in the same group commit).
fn dedupe_key(n: usize) -> Option<String> {
    let pid = std::process::id();
    match n % 30 {
        9 => Some(format!("torture-shared-{}", (n / 30) % 4)),
        19 => Some(format!("torture-{pid}-{n}")),
        29 => Some(format!("torture-{pid}-{}", n - 10)),
        _ => None,
    }
}

/// One recording task: calls `k`, `k + RECORDERS`, ... of the process.
async fn recorder(
    store: Arc<SqliteStore>,
    targets: usize,
    k: usize,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
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
            "{} {returned} {} {} {}\n",
            rec.event.sequence,
            store.write_transactions(),
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

/// Records `count` events on `agent:<tag>:s0` to `s9`, printing each; with `pause`, prints
/// `half` after the first half and waits for a line on stdin before the second.
async fn batch(
    db: &str,
    tag: &str,
    count: usize,
    pause: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let store = SqliteStore::open(db).await?;
    let mut out = std::io::stdout().lock();
    for i in 0..count {
        if pause && i == count / 2 {
            writeln!(out, "half")?;
            out.flush()?;
            std::io::stdin().read_line(&mut String::new())?;
        }
        let session = SessionRef::parse(&format!("agent:{tag}:s{}", i % 10), tag)?;
        let rec = store.record(human(&session), Timestamp::now()).await?;
        writeln!(out, "{} {}", rec.event.sequence, session.session_key)?;
    }
    out.flush()?;
    store.close().await;
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = rt.block_on(async {
        match argv.as_slice() {
            ["record", db, targets] => record_forever(db, targets.parse()?).await,
            ["batch", db, tag, count] => batch(db, tag, count.parse()?, false).await,
            ["go-batch", db, tag, count] => {
                // Started beside another process, both wait for the word to open at once.
                std::io::stdin().read_line(&mut String::new())?;
                batch(db, tag, count.parse()?, false).await
            }
            ["go-halves", db, tag, count] => {
                std::io::stdin().read_line(&mut String::new())?;
                batch(db, tag, count.parse()?, true).await
            }
            ["open", db] => match SqliteStore::open(db).await {
                Ok(store) => {
                    store.close().await;
                    Ok(())
                }
                Err(e) => {
                    eprintln!("{e}");
                    std::process::exit(2);
                }
            },
            _ => Err("usage: store-sqlite-torture record|batch|go-batch|go-halves|open ...".into()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("store-sqlite-torture: {e}");
            ExitCode::FAILURE
        }
    }
}
