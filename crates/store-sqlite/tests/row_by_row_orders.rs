//! An order the shared suite does not reach: the listings read again one row at a time (a row
//! holding text that is not UTF-8) keep the order of the whole listing, key then agent. (It
//! passed every test when broken: review of stop 63.)

use awareness_core::testkit::checks::human;
use awareness_core::upstream::{LinkSpec, UpstreamStore as _};
use awareness_core::{EventStore as _, SessionRef, Timestamp};
use store_sqlite::SqliteStore;

const T0: Timestamp = Timestamp(1_800_000_000_000);

/// Two refs whose key order is not their agent order: (a, zed) before (b, main) by key.
fn two_refs() -> (SessionRef, SessionRef) {
    (
        SessionRef::parse("agent:main:subagent:a", "zed").expect("ref"),
        SessionRef::parse("agent:main:subagent:b", "main").expect("ref"),
    )
}

/// The links and the heads read one row at a time (a row holding text that is not UTF-8 makes
/// the one text of the listing unreadable) come by key then agent, as each whole listing does.
/// (What the mutations did: those rows ordered by agent first, a listing changed order when one
/// of its rows could not be read; review of stop 63, Q23 for the links, Q24 for the heads.)
#[tokio::test]
async fn listings_read_row_by_row_keep_key_then_agent_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("state.sqlite"))
        .await
        .expect("open");
    let (first, second) = two_refs();
    let spoiled = SessionRef::parse("agent:main:subagent:c", "main").expect("ref");
    for (i, session) in [&second, &first, &spoiled].into_iter().enumerate() {
        store.record(human(session), T0).await.expect("record");
        let spec = LinkSpec::new(
            session.clone(),
            "claude-code",
            "local",
            format!("t{i}"),
            "local-jsonl",
        );
        store.upsert_link(spec, T0).await.expect("adopt");
    }
    let links = async || -> Vec<SessionRef> {
        let links = store.links().await.expect("links");
        links.into_iter().map(|l| l.session).collect()
    };
    let heads = async || -> Vec<SessionRef> {
        let heads = store.list_heads(None).await.expect("heads");
        heads.into_iter().map(|h| h.session).collect()
    };
    let whole = [first.clone(), second.clone(), spoiled.clone()];
    assert_eq!(links().await, whole, "the whole listing of links");
    assert_eq!(heads().await, whole, "the whole listing of heads");
    assert!(
        store.spoil_link_text(&spoiled).await.expect("spoil"),
        "a link row to spoil"
    );
    assert!(
        store.spoil_head_text(&spoiled).await.expect("spoil"),
        "a head row to spoil"
    );
    let read_alone = [first, second];
    assert_eq!(links().await, read_alone, "links read row by row");
    assert_eq!(heads().await, read_alone, "heads read row by row");
}
