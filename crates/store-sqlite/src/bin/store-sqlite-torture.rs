//! Test helper of store-sqlite's reliability tests (not an interface): a separate process that
//! writes to a store file so the tests can kill it, run it beside another writer, or run it as
//! another user.
//!
//! ```text
//! store-sqlite-torture record <db> <targets>        record forever, print "<sequence> <target>" per commit
//! store-sqlite-torture batch <db> <tag> <count>     record <count> events, print each sequence, exit 0
//! store-sqlite-torture open <db>                    open once; exit 0, or print the error and exit 2
//! ```

use std::io::Write as _;
use std::process::ExitCode;

use awareness_core::{
    ActorType, CursorStore, EventKind, EventStore, NewEvent, SessionKey, SessionRef, Timestamp,
    WatcherKey,
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

async fn record_forever(db: &str, targets: usize) -> Result<(), Box<dyn std::error::Error>> {
    let store = SqliteStore::open(db).await?;
    let watcher = WatcherKey::parse(WATCHER)?;
    for i in 0..targets {
        store.watch(&watcher, &target(i), Timestamp::now()).await?;
    }
    let mut out = std::io::stdout().lock();
    for i in 0usize.. {
        let t = i % targets;
        let rec = store.record(human(&target(t)), Timestamp::now()).await?;
        writeln!(out, "{} {t}", rec.event.sequence)?;
        out.flush()?;
        if i % 7 == 3 {
            let key = SessionKey::new(target(t).session_key.as_str())?;
            store
                .acknowledge(&watcher, &[key], Timestamp::now())
                .await?;
        }
    }
    Ok(())
}

async fn batch(db: &str, tag: &str, count: usize) -> Result<(), Box<dyn std::error::Error>> {
    let store = SqliteStore::open(db).await?;
    let mut out = std::io::stdout().lock();
    for i in 0..count {
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
            ["batch", db, tag, count] => batch(db, tag, count.parse()?).await,
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
            _ => Err("usage: store-sqlite-torture record|batch|open ...".into()),
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
