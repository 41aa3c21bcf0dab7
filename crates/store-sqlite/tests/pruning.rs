//! A pruning chunk larger than one pruning write transaction (store-sqlite splits chunks so
//! that recordings wait for milliseconds) ends exactly as the reference store's chunk does.

use awareness_core::{
    ActorType, AwarenessStore, CursorFilter, EventKind, EventStore, NewEvent, PruneStep,
    SessionRef, Timestamp, WatcherKey,
};
use store_memory::MemoryStore;
use store_sqlite::SqliteStore;

const T0: Timestamp = Timestamp(1_800_000_000_000);
const DAY: i64 = Timestamp::DAY_MS;

async fn fill(store: &dyn AwarenessStore) {
    let watcher = WatcherKey::parse("agent:main:main").unwrap();
    for i in 0..1_300u32 {
        let session =
            SessionRef::parse(&format!("agent:main:subagent:s{}", i % 7), "main").unwrap();
        if i < 7 {
            store.watch(&watcher, &session, T0).await.unwrap();
        }
        // The first 900 are 40 days old by the time of the pruning below.
        let at = if i < 900 { T0 } else { T0.plus_ms(20 * DAY) };
        let e = NewEvent::new(
            session,
            EventKind::HumanDirectMessage,
            ActorType::Human,
            "x",
        );
        store.record(e, at).await.unwrap();
    }
}

async fn observe(store: &dyn AwarenessStore) -> String {
    format!(
        "{:?}\n{:?}\n{:?}",
        store.log_stats().await.unwrap(),
        store.list_heads(None).await.unwrap(),
        store.cursors(&CursorFilter::default()).await.unwrap()
    )
}

#[tokio::test]
async fn chunks_larger_than_one_transaction_match_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(dir.path().join("state.sqlite"))
        .await
        .unwrap();
    let memory = MemoryStore::new();
    fill(&sqlite).await;
    fill(&memory).await;
    let later = T0.plus_ms(40 * DAY);
    let steps = [
        (
            PruneStep::Age {
                cutoff: later.minus_ms(30 * DAY),
            },
            620,
            620,
        ),
        (
            PruneStep::Age {
                cutoff: later.minus_ms(30 * DAY),
            },
            620,
            280,
        ),
        (PruneStep::RowCap { max_rows: 100 }, 555, 300),
        (PruneStep::Cursors { cutoff: later }, 1_000, 7),
    ];
    for (step, bound, expected) in steps {
        let got = sqlite.prune_chunk(&step, bound).await.unwrap();
        let want = memory.prune_chunk(&step, bound).await.unwrap();
        assert_eq!(
            (got, want),
            (expected, expected),
            "{step:?} bounded by {bound}"
        );
        assert_eq!(
            observe(&sqlite).await,
            observe(&memory).await,
            "after {step:?}"
        );
    }
    sqlite.close().await;
}
