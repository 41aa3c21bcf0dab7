//! store-redb's event rows (`crates/store-redb/src/codec.rs`, compiled here as it is) read
//! from any bytes, as a damaged file holds them: each of the three reads (the event, its
//! bookkeeping fields, its age alone) gives a value or `Corrupt`, never a panic; on a row that
//! reads as an event they agree with it, a page's read (the ref known) gives the same event,
//! and the event is written back as a row that reads as the same event.

use awareness_core::{EventKind, SessionRef, StoreError};

#[allow(dead_code)]
#[path = "../../crates/store-redb/src/codec.rs"]
mod codec;

/// The sequence the rows are read under (the row's key, not in its bytes).
const SEQ: u64 = 7;

/// Runs the target on one input (any bytes); panics on a failure. Whether the row read as an
/// event (which the other reads and the write back were then compared with).
pub fn run(data: &[u8]) -> bool {
    let event = codec::decode(SEQ, data, None);
    let meta = codec::meta(SEQ, data);
    let age = codec::occurred_at(SEQ, data);
    for e in [
        event.as_ref().err(),
        meta.as_ref().err(),
        age.as_ref().err(),
    ]
    .into_iter()
    .flatten()
    {
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e:?}: {data:?}");
    }
    let Ok(event) = event else {
        return false;
    };
    let meta = meta.expect("a row that reads as an event has its bookkeeping fields");
    assert_eq!(meta.session_key, event.session_key.as_str());
    assert_eq!(meta.agent_id, event.agent_id.as_str());
    assert_eq!(meta.dedupe_key, event.dedupe_key.as_deref());
    assert_eq!(age.expect("and its age"), event.occurred_at.millis());

    let known = SessionRef::parse(event.session_key.as_str(), event.agent_id.as_str())
        .expect("a ref read back is valid");
    assert_eq!(
        codec::decode(SEQ, data, Some(&known)).expect("read under its own ref"),
        event
    );
    // A later version's kind reads as `Other`, which this version never writes.
    if !matches!(event.kind, EventKind::Other(_)) {
        let row = codec::encode(&event).expect("an event read encodes");
        assert_eq!(codec::decode(SEQ, &row, None).expect("reads back"), event);
    }
    true
}
