//! A pruning chunk larger than one pruning write transaction (store-sqlite splits chunks into
//! transactions of 250 rows, store-redb into transactions of 2,000, so that recordings wait
//! for milliseconds) ends exactly as the reference store's chunk does, on every durable
//! backend, by age and by the row cap. (Here, not in a store's own tests: no store depends on
//! another.)

use awareness_core::{
    ActorType, AwarenessStore, CursorFilter, EventKind, NewEvent, PruneStep, SessionRef, Timestamp,
    WatcherKey,
};
use awareness_e2e::backends;

const T0: Timestamp = Timestamp(1_800_000_000_000);
const DAY: i64 = Timestamp::DAY_MS;

async fn fill(store: &dyn AwarenessStore) {
    let watcher = WatcherKey::parse("agent:main:main").unwrap();
    for i in 0..4_600u32 {
        let session =
            SessionRef::parse(&format!("agent:main:subagent:s{}", i % 7), "main").unwrap();
        if i < 7 {
            store.watch(&watcher, &session, T0).await.unwrap();
        }
        // The first 3,200 are 40 days old by the time of the pruning below.
        let at = if i < 3_200 { T0 } else { T0.plus_ms(20 * DAY) };
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
    let mut all = backends().await.into_iter();
    let memory = all.next().expect("the memory backend first");
    assert_eq!(memory.name, "memory");
    let durable: Vec<_> = all.collect();
    assert!(!durable.is_empty());
    fill(&*memory.store).await;
    for b in &durable {
        fill(&*b.store).await;
    }
    let later = T0.plus_ms(40 * DAY);
    let steps = [
        (
            PruneStep::Age {
                cutoff: later.minus_ms(30 * DAY),
            },
            2_500,
            2_500,
        ),
        (
            PruneStep::Age {
                cutoff: later.minus_ms(30 * DAY),
            },
            2_500,
            700,
        ),
        (PruneStep::RowCap { max_rows: 100 }, 1_250, 1_250),
        (PruneStep::Cursors { cutoff: later }, 1_000, 7),
    ];
    for (step, bound, expected) in steps {
        let want = memory.store.prune_chunk(&step, bound, later).await.unwrap();
        assert_eq!(want, expected, "memory: {step:?} bounded by {bound}");
        let reference = observe(&*memory.store).await;
        for b in &durable {
            let got = b.store.prune_chunk(&step, bound, later).await.unwrap();
            assert_eq!(got, expected, "{}: {step:?} bounded by {bound}", b.name);
            assert_eq!(
                observe(&*b.store).await,
                reference,
                "{}: after {step:?}",
                b.name
            );
        }
    }
    for b in durable {
        b.store.close().await;
    }
}
