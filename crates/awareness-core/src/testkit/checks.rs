//! The conformance checks. Each function sets up its own data on a fresh [`Subject`] and panics
//! with a message naming the rule when the backend breaks it.

#![allow(clippy::missing_panics_doc, missing_docs)]
// Short names keep the checks readable: `t` the subject, `s` its store, `k`/`w`/`r` key builders.
#![allow(clippy::many_single_char_names)]

use serde_json::{Value, json};

use super::Subject;
use crate::model::{
    ActorType, AgentId, CursorFilter, CursorKey, EventKind, NewEvent, Payload, Sequence,
    SessionKey, SessionRef, Timestamp, WatcherKey,
};
use crate::protocol::{self, AckTarget};
use crate::retention::{PruneStep, RetentionPolicy};
use crate::store::{AwarenessStore, AwarenessStoreExt, Recorded};
use crate::{StoreError, validate};

/// The fixed clock of the checks (OpenClaw's scenario epoch).
pub const T0: Timestamp = Timestamp(1_800_000_000_000);
const DAY: i64 = Timestamp::DAY_MS;

const MANAGER: &str = "agent:main:main";
const CHILD: &str = "agent:main:subagent:c1";
const PEER: &str = "agent:ops:main";

pub(crate) fn r(key: &str, agent: &str) -> SessionRef {
    SessionRef::parse(key, agent).unwrap()
}
pub(crate) fn child() -> SessionRef {
    r(CHILD, "main")
}
pub(crate) fn w(key: &str) -> WatcherKey {
    WatcherKey::parse(key).unwrap()
}
fn k(key: &str) -> SessionKey {
    SessionKey::new(key).unwrap()
}
/// An acknowledgement of whatever notice is pending on `key`.
fn any(key: &str) -> AckTarget {
    AckTarget::any(k(key))
}
/// A person's message typed into `session` (a notify-eligible event by `user-1`), for the
/// checks and for a store's or a gateway's own tests.
pub fn human(session: &SessionRef) -> NewEvent {
    NewEvent::new(
        session.clone(),
        EventKind::HumanDirectMessage,
        ActorType::Human,
        "human message via telegram",
    )
    .with_actor_id("user-1")
}
pub(crate) fn log_only(session: &SessionRef, summary: &str) -> NewEvent {
    NewEvent::new(
        session.clone(),
        EventKind::Created,
        ActorType::System,
        summary,
    )
}
pub(crate) fn spawn(child: &SessionRef, spawner: &str, run: &str) -> NewEvent {
    NewEvent::new(
        child.clone(),
        EventKind::ChildSpawned,
        ActorType::Agent,
        "child session spawned",
    )
    .with_actor_id(spawner)
    .with_run_id(run)
    .with_dedupe_key(crate::dedupe::child_spawned(run).expect("a run id"))
    .with_watcher(w(spawner))
}

pub(crate) async fn rec(s: &dyn AwarenessStore, e: NewEvent, now: Timestamp) -> Recorded {
    s.record(e, now).await.expect("record")
}
async fn version(s: &dyn AwarenessStore, r: &SessionRef) -> u64 {
    s.state_version(r).await.expect("state_version").get()
}
async fn cursor3(s: &dyn AwarenessStore, watcher: &str, target: &str) -> Option<(u64, u64, u64)> {
    s.cursor(&w(watcher), &k(target))
        .await
        .expect("cursor")
        .map(|c| (c.last_seen.get(), c.notified.get(), c.material.get()))
}
async fn seqs(s: &dyn AwarenessStore, r: &SessionRef, after: u64) -> Vec<u64> {
    s.changes_since(r, Sequence(after), 200)
        .await
        .expect("changes_since")
        .events
        .iter()
        .map(|e| e.sequence.get())
        .collect()
}
async fn all_cursors(s: &dyn AwarenessStore) -> Vec<crate::Cursor> {
    s.cursors(&CursorFilter::default()).await.expect("cursors")
}
async fn count(s: &dyn AwarenessStore) -> u64 {
    s.log_stats().await.expect("log_stats").rows
}
/// Asserts that every head of `s` is at its session's highest event and that every session
/// with an event has one: what a store nothing was pruned from or deleted in must show. (The
/// audit cannot say this: after pruning, a head above every retained event is right.)
async fn assert_heads_at_last_events(s: &dyn AwarenessStore, why: &str) {
    let mut last = std::collections::BTreeMap::new();
    for e in s
        .events_after(Sequence::ZERO, 10_000)
        .await
        .expect("events_after")
    {
        let at = last.entry(e.session_ref()).or_insert(e.sequence);
        *at = (*at).max(e.sequence);
    }
    let heads: std::collections::BTreeMap<_, _> = s
        .list_heads(None)
        .await
        .expect("list_heads")
        .into_iter()
        .map(|h| (h.session, h.last_sequence))
        .collect();
    assert_eq!(heads, last, "{why}: each head at its session's last event");
}

pub async fn record_assigns_increasing_sequences(t: &Subject) {
    let s = &*t.store;
    let mut last = 0;
    for i in 0..5 {
        let session = r(&format!("agent:main:s{}", i % 2), "main");
        let got = rec(s, log_only(&session, "e"), T0)
            .await
            .event
            .sequence
            .get();
        assert!(
            got > last,
            "sequences must strictly increase: {got} after {last}"
        );
        last = got;
    }
    assert_eq!(last, 5, "a fresh store numbers from 1 without gaps");
}

pub async fn record_returns_every_field(t: &Subject) {
    let s = &*t.store;
    let payload = validate::payload_from_value(json!({"outcome": "timeout", "n": [1, 2]})).unwrap();
    let e = NewEvent::new(
        child(),
        EventKind::RunFailed,
        ActorType::System,
        "child run timed out",
    )
    .with_session_id("sess-1")
    .with_actor_id("sys")
    .with_run_id("run-1")
    .with_payload(payload.clone())
    .with_occurred_at(T0.minus_ms(1_000));
    let got = rec(s, e, T0).await;
    assert!(!got.deduplicated);
    let page = s.changes_since(&child(), Sequence(0), 200).await.unwrap();
    assert_eq!(page.events.len(), 1);
    let stored = &page.events[0];
    assert_eq!(
        **stored, *got.event,
        "the page returns what record returned"
    );
    assert_eq!(stored.session_id.as_deref(), Some("sess-1"));
    assert_eq!(stored.actor_id.as_deref(), Some("sys"));
    assert_eq!(stored.run_id.as_deref(), Some("run-1"));
    assert_eq!(stored.payload.as_ref(), Some(&payload));
    assert_eq!(stored.occurred_at, T0.minus_ms(1_000));
    assert_eq!(stored.kind, EventKind::RunFailed);
    assert_eq!(stored.actor_type, ActorType::System);
    assert_eq!(stored.summary, "child run timed out");
}

/// A session key with quotes, a backslash, a slash, text that looks like an escape, an accent
/// and a character outside the BMP.
pub(crate) fn tricky_session() -> SessionRef {
    r("agent:main:\"q\" \\ /\\u0041 é😀", "main")
}

/// A payload whose strings hold control characters and escape look-alikes, with numbers of
/// every JSON kind and a float only an exact parser reads back as written.
pub(crate) fn tricky_payload() -> Payload {
    validate::payload_from_value(json!({
        "text": "line1\nline2\t\"q\" \\ \u{1} \u{7f} 😀 \\u0041 \\ud83d",
        "n": [1.5, -2e3, 12_345_678_901_234_i64, null, {"k": ""}],
        // serde_json's default float parser reads this one back a unit off in the last place.
        "f": 117.633_311_394_000_17,
    }))
    .unwrap()
}

/// An event on `session` whose every text field holds what an encoding could get wrong, with
/// [`tricky_payload`] and the dedupe key `dk "{tag}" \ 😀`.
pub(crate) fn tricky_event(session: SessionRef, tag: &str) -> NewEvent {
    NewEvent::new(
        session,
        EventKind::HumanDirectMessage,
        ActorType::Human,
        "said \"hi\" \\ back/slash \\n \\u00e9 é ☃ 😀",
    )
    .with_session_id("sess \"é\" \\")
    .with_actor_id("user \"x\" \\ 😀")
    .with_run_id("run/1 \\u0041")
    .with_payload(tricky_payload())
    .with_dedupe_key(format!("dk \"{tag}\" \\ 😀"))
}

pub async fn text_fields_round_trip_exactly(t: &Subject) {
    // Quotes, backslashes, slashes, text that looks like an escape, accents, characters outside
    // the BMP, and a payload whose strings hold control characters: whatever encoding a backend
    // stores or reads them through, they come back as given.
    let s = &*t.store;
    let session = tricky_session();
    let payload = tricky_payload();
    let e = tricky_event(session.clone(), "1");
    let got = rec(s, e.clone(), T0).await.event;
    assert_eq!(got.session_key, session.session_key);
    assert_eq!(got.summary, "said \"hi\" \\ back/slash \\n \\u00e9 é ☃ 😀");
    assert_eq!(got.session_id.as_deref(), Some("sess \"é\" \\"));
    assert_eq!(got.actor_id.as_deref(), Some("user \"x\" \\ 😀"));
    assert_eq!(got.run_id.as_deref(), Some("run/1 \\u0041"));
    assert_eq!(got.payload.as_ref(), Some(&payload));
    let page = s.changes_since(&session, Sequence(0), 200).await.unwrap();
    assert_eq!(page.events.len(), 1);
    assert_eq!(
        *page.events[0], *got,
        "the page reads back what was recorded"
    );
    let tail = s.events_after(Sequence(0), 10).await.unwrap();
    assert_eq!(tail.len(), 1);
    assert_eq!(*tail[0], *got, "events_after reads back what was recorded");
    let again = rec(s, e, T0.plus_ms(1)).await;
    assert!(
        again.deduplicated,
        "the same dedupe key, however spelled, is a hit"
    );
    assert_eq!(
        *again.event, *got,
        "a dedupe hit reads back what was recorded"
    );
}

/// A JSON value nested `depth` levels deep (arrays and objects alternating).
fn nested(depth: usize) -> serde_json::Value {
    let mut v = json!("leaf");
    for level in 0..depth {
        v = if level % 2 == 0 {
            serde_json::Value::Array(vec![v, json!(level)])
        } else {
            json!({"down": v})
        };
    }
    v
}

pub async fn json_nested_too_deep_is_rejected_and_the_deepest_allowed_reads_back(t: &Subject) {
    // serde_json reads at most 128 levels back: a deeper payload or link, once written, would
    // fail every read of its page or of the links as corrupt on a durable store.
    let s = &*t.store;
    let u = &*t.upstream;
    let max = validate::MAX_JSON_DEPTH;
    let payload = |depth: usize| {
        let mut map = Payload::new();
        map.insert("x".into(), nested(depth - 1));
        map
    };
    let refused = s
        .record(human(&child()).with_payload(payload(max + 1)), T0)
        .await;
    assert!(
        matches!(
            refused,
            Err(StoreError::InvalidInput(validate::ValidationError::JsonTooDeep { what: "payload", depth })) if depth == max + 1
        ),
        "a payload {} levels deep: {refused:?}",
        max + 1
    );
    let too_deep = s
        .record(human(&child()).with_payload(payload(200)), T0)
        .await;
    assert!(
        matches!(too_deep, Err(StoreError::InvalidInput(_))),
        "{too_deep:?}"
    );
    assert_eq!(count(s).await, 0, "a refused payload writes nothing");
    let deepest = payload(max);
    let got = rec(s, human(&child()).with_payload(deepest.clone()), T0)
        .await
        .event;
    let page = s.changes_since(&child(), Sequence(0), 200).await.unwrap();
    assert_eq!(page.events.len(), 1);
    assert_eq!(page.events[0].payload.as_ref(), Some(&deepest));
    assert_eq!(*page.events[0], *got);
    let tail = s.events_after(Sequence(0), 10).await.unwrap();
    assert_eq!(tail[0].payload.as_ref(), Some(&deepest));

    let spec = |reference: serde_json::Value| link_spec(&child(), "t1", 0).with_ref(reference);
    let refused = u.upsert_link(spec(nested(max + 1)), T0).await;
    assert!(
        matches!(
            refused,
            Err(StoreError::InvalidInput(
                validate::ValidationError::JsonTooDeep {
                    what: "upstream ref",
                    ..
                }
            ))
        ),
        "{refused:?}"
    );
    assert!(
        u.links().await.unwrap().is_empty(),
        "a refused link is not stored"
    );
    u.upsert_link(spec(nested(max)), T0).await.unwrap();
    let links = u.links().await.unwrap();
    assert_eq!(links.len(), 1);
    assert_eq!(links[0].upstream_ref.as_ref(), Some(&nested(max)));
    let refused = u
        .set_marker(&child(), T0, nested(max + 1), T0.plus_ms(1))
        .await;
    assert!(
        matches!(refused, Err(StoreError::InvalidInput(_))),
        "{refused:?}"
    );
    u.set_marker(&child(), T0, nested(max), T0.plus_ms(1))
        .await
        .unwrap();
    let link = u.link(&child()).await.unwrap().expect("the link");
    assert_eq!(link.marker.as_ref(), Some(&nested(max)));
}

pub async fn payload_keys_keep_the_order_they_were_recorded_in(t: &Subject) {
    // OpenClaw keeps a payload's keys in the order they were written (a JavaScript object), so a
    // page is byte-compatible only if every backend does too, nested objects included.
    let s = &*t.store;
    let text = r#"{"zeta":1,"alpha":{"y":true,"b":null},"mid":[{"q":"x","a":2.5}],"beta":"b"}"#;
    let value: serde_json::Value = serde_json::from_str(text).unwrap();
    let payload = validate::payload_from_value(value).unwrap();
    let order = |p: Option<&Payload>, what: &str| {
        assert_eq!(
            serde_json::to_string(p.expect("a payload")).unwrap(),
            text,
            "{what} reorders the payload's keys"
        );
    };
    order(Some(&payload), "building the payload");
    let e = human(&child())
        .with_payload(payload)
        .with_dedupe_key("ordered");
    let got = rec(s, e.clone(), T0).await.event;
    order(got.payload.as_ref(), "record");
    let page = s.changes_since(&child(), Sequence(0), 200).await.unwrap();
    order(page.events[0].payload.as_ref(), "changes_since");
    let tail = s.events_after(Sequence(0), 10).await.unwrap();
    order(tail[0].payload.as_ref(), "events_after");
    let again = rec(s, e, T0.plus_ms(1)).await;
    assert!(again.deduplicated);
    order(again.event.payload.as_ref(), "a dedupe hit");
}

pub async fn dedupe_returns_stored_event_and_moves_nothing(t: &Subject) {
    let s = &*t.store;
    s.watch(&w(MANAGER), &child(), T0).await.unwrap();
    let first = rec(s, human(&child()).with_dedupe_key("dk-1"), T0).await;
    let before_cursor = s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap();
    let mut again = human(&child()).with_dedupe_key("dk-1");
    again.summary = "something else".into();
    let second = rec(s, again, T0.plus_ms(5)).await;
    assert!(second.deduplicated, "a repeated dedupe key is a hit");
    assert_eq!(
        *second.event, *first.event,
        "the hit returns the stored event unchanged"
    );
    assert!(second.notices.is_empty(), "a hit notifies nobody");
    assert_eq!(
        version(s, &child()).await,
        first.event.sequence.get(),
        "the head did not move"
    );
    assert_eq!(
        s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap(),
        before_cursor,
        "no cursor moved"
    );
    assert_eq!(count(s).await, 1);
    let head = s.heads(&[child()]).await.unwrap().remove(0);
    assert_eq!(head.updated_at, T0, "the head's clock did not move either");
}

/// Dedupe keys are store-wide (DESIGN 3): a key another session's event holds answers a
/// recording for this session with that event, unchanged (its session and sequence), notifies
/// nobody, and writes nothing for this session: no event, no head, no cursor moved. (The
/// gateway warns of such a hit, telling it by the event's session.)
pub async fn dedupe_keys_are_store_wide(t: &Subject) {
    let s = &*t.store;
    let other = r("agent:main:subagent:other", "main");
    s.watch(&w(MANAGER), &other, T0).await.unwrap();
    let first = rec(s, human(&child()).with_dedupe_key("compacted:1"), T0).await;
    let before_cursor = s.cursor(&w(MANAGER), &other.session_key).await.unwrap();
    let hit = rec(
        s,
        human(&other).with_dedupe_key("compacted:1"),
        T0.plus_ms(5),
    )
    .await;
    assert!(hit.deduplicated, "the key is another session's: a hit");
    assert_eq!(*hit.event, *first.event, "the stored event, unchanged");
    assert_eq!(
        hit.event.session_ref(),
        child(),
        "of the session that holds the key"
    );
    assert!(hit.notices.is_empty(), "a hit notifies nobody");
    assert_eq!(version(s, &other).await, 0, "no head for the other session");
    assert_eq!(
        s.cursor(&w(MANAGER), &other.session_key).await.unwrap(),
        before_cursor,
        "its watcher's cursor did not move"
    );
    assert_eq!(count(s).await, 1);
}

pub async fn dedupe_hit_consumes_a_sequence(t: &Subject) {
    let s = &*t.store;
    let a = rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    let b = rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    assert_eq!(a.event.sequence, Sequence(1));
    assert!(b.deduplicated);
    let c = rec(s, log_only(&child(), "next"), T0).await;
    assert_eq!(
        c.event.sequence,
        Sequence(3),
        "the hit spent sequence 2, as OpenClaw's AUTOINCREMENT does"
    );
}

/// Whether `err` is the error every store gives a recording once its sequence counter is at
/// its end: [`StoreError::Corrupt`] naming the sequence counter (only a damaged or hand-edited
/// store gets there), which no retry gets past.
pub(crate) fn is_counter_at_end(err: &StoreError) -> bool {
    err.is_counter_at_end() && !err.is_retryable()
}

/// A store whose sequence counter is near its end (a damaged or hand-edited file:
/// [`super::RawAccess::leave_sequences`]) hands out its last numbers, a dedupe hit consuming
/// one as anywhere, and then refuses every recording with one clear error, a dedupe hit of a
/// stored event included (it would consume a number there is none left of), writing nothing:
/// no wrap round to reuse sequence 0, no event over a head, no cursor for a watcher the refused
/// event names, no panic.
pub async fn a_counter_at_its_end_refuses_to_record_and_writes_nothing(t: &Subject) {
    let s = &*t.store;
    let other = r("agent:main:other", "main");
    s.watch(&w(MANAGER), &child(), T0).await.unwrap();
    let first = rec(s, human(&child()).with_dedupe_key("dk-end"), T0).await;
    assert!(
        t.raw.leave_sequences(3).await.expect("leave_sequences"),
        "the counter moved up to three numbers before its end"
    );
    let hit = rec(s, human(&child()).with_dedupe_key("dk-end"), T0).await;
    assert!(hit.deduplicated, "a hit near the end is still a hit");
    assert_eq!(*hit.event, *first.event, "the hit returns the stored event");
    let a = rec(s, human(&child()), T0.plus_ms(1)).await;
    let b = rec(s, log_only(&child(), "the last one"), T0.plus_ms(2)).await;
    assert!(
        a.event.sequence > first.event.sequence,
        "the counter moved forward: {:?} after {:?}",
        a.event.sequence,
        first.event.sequence
    );
    assert_eq!(
        b.event.sequence.get(),
        a.event.sequence.get() + 1,
        "the last two numbers, in order (the hit consumed the one before them)"
    );
    assert_eq!(
        a.notices.len(),
        1,
        "the watcher is told of the first of them"
    );
    let refs = [child(), other.clone()];
    let before = super::observe(s, &refs).await;
    let page = s.changes_since(&child(), Sequence::ZERO, 10).await.unwrap();
    assert_eq!(
        page.events,
        [first.event, a.event, b.event.clone()],
        "the events at the end read back as answered, and nothing else was written"
    );
    let heads = s.heads(&refs).await.unwrap();
    assert_eq!(
        heads.iter().map(|h| h.last_sequence).collect::<Vec<_>>(),
        [b.event.sequence],
        "the head names the last event"
    );
    // Read from the last event, nothing is left (an event at the very end of a store's range
    // included).
    let page = s
        .changes_since(&child(), b.event.sequence, 10)
        .await
        .unwrap();
    assert!(
        page.events.is_empty(),
        "nothing past the last event: {page:?}"
    );
    let log = s.events_after(b.event.sequence, 10).await.unwrap();
    assert!(
        log.is_empty(),
        "nothing past the last event in the log: {log:?}"
    );
    let attempts = [
        ("a message on the watched ref", human(&child())),
        ("an event of a new ref", log_only(&other, "new ref")),
        (
            "a dedupe hit of a stored event",
            human(&child()).with_dedupe_key("dk-end"),
        ),
        ("the watched ref again", log_only(&child(), "again")),
        ("a new ref again", human(&other).with_dedupe_key("dk-new")),
        (
            "a message naming a watcher with no cursor yet",
            human(&other).with_watcher(w(PEER)),
        ),
        (
            "a spawn naming the session's watcher",
            spawn(&child(), MANAGER, "run-at-the-end"),
        ),
    ];
    for (what, e) in attempts {
        let err = s.record(e, T0.plus_ms(3)).await.unwrap_err();
        assert!(
            is_counter_at_end(&err),
            "{what}, with the counter at its end: {err:?}"
        );
        // It says where the counter is: at the last number, the one the last event got.
        // (What the mutation did: store-postgres read the number from a column the counter's
        // row holds NULL in at the end, and said the counter was at 0; review of stop 70,
        // P821.)
        let last = b.event.sequence.get();
        assert!(
            err.to_string().contains(&format!(
                "the sequence counter is at {last}, and the last number an event can get is \
                 {last}"
            )),
            "the message names the sequence counter and where it is: {err}"
        );
    }
    assert_eq!(
        super::observe(s, &refs).await,
        before,
        "the refused recordings changed no head, cursor, event or page"
    );
    // The handle goes on with everything that needs no new number.
    let acked = s
        .acknowledge(&w(MANAGER), &[any(CHILD)], T0.plus_ms(4))
        .await
        .expect("an acknowledgement after the refusals");
    assert_eq!(acked.len(), 1, "the pending notice is acknowledged");
    s.delete_session(&child())
        .await
        .expect("a deletion after the refusals");
    assert!(
        s.heads(&refs).await.expect("heads").is_empty(),
        "the deleted session's head is gone"
    );
}

/// Recordings that need exactly the numbers left before the counter's end
/// ([`super::RawAccess::leave_sequences`]) are each stored under one of them, in order, and a
/// store that batches ([`Subject::batching`]) commits them, held behind its writer, as one
/// batch in one write transaction: a batch is refused only when it does not fit. The next
/// recording is refused. (store-postgres refused such a batch one number early and then
/// recorded its events one by one, with the same answers, a mutation every test passed:
/// review of stop 62.)
pub async fn recordings_that_take_the_last_numbers_commit_as_one_batch(t: &Subject) {
    const LEFT: u64 = 3;
    let s = &*t.store;
    let first = rec(s, human(&child()), T0).await;
    assert!(
        t.raw.leave_sequences(LEFT).await.expect("leave_sequences"),
        "the counter moved up to {LEFT} numbers before its end"
    );
    // Asked again, the hook answers that it can (the counter stands exactly there), and only
    // a point behind the counter is refused. (What the mutations did: `>` for `>=`, a counter
    // already there refused, in store-memory and in store-redb; review of stop 64, ME01, and of
    // stop 70, RF03.)
    assert!(
        t.raw.leave_sequences(LEFT).await.expect("leave_sequences"),
        "the counter already leaves {LEFT}: nothing to move"
    );
    assert!(
        !t.raw
            .leave_sequences(LEFT + 1)
            .await
            .expect("leave_sequences"),
        "the counter never goes back"
    );
    let events: Vec<NewEvent> = (0..LEFT)
        .map(|i| log_only(&child(), &format!("one of the last {i}")))
        .collect();
    let before = t.batching.as_ref().map(|b| (b.write_transactions)());
    let answers = super::model::record_wave(&t.store, t.batching.as_ref(), &events, T0).await;
    let mut stored = Vec::new();
    for (i, answer) in answers.into_iter().enumerate() {
        let got = match answer {
            super::model::Answer::Queued(call) => call.await.expect("join"),
            super::model::Answer::AtOnce(got) => {
                assert!(
                    t.batching.is_none(),
                    "call {i} answered while the writer was held: {got:?}"
                );
                got
            }
        };
        let got = got.unwrap_or_else(|e| panic!("call {i}, within the numbers left: {e}"));
        assert_eq!(got.event.summary, events[i].summary, "its own event");
        stored.push(got.event.sequence.get());
    }
    stored.sort_unstable();
    assert!(
        stored[0] > first.event.sequence.get() && stored.windows(2).all(|p| p[1] == p[0] + 1),
        "the last numbers, one each: {stored:?}"
    );
    if let (Some(b), Some(before)) = (t.batching.as_ref(), before) {
        assert_eq!(
            (b.write_transactions)() - before,
            b.hold_transactions + 1,
            "the {LEFT} recordings were committed in one batch"
        );
        assert!(
            (b.largest_batch)() >= LEFT as usize,
            "a batch of {LEFT}, got at most {}",
            (b.largest_batch)()
        );
    }
    let err = s.record(human(&child()), T0).await.unwrap_err();
    assert!(
        is_counter_at_end(&err),
        "then the counter is at its end: {err:?}"
    );
}

pub async fn dedupe_key_is_free_again_after_its_row_is_pruned(t: &Subject) {
    let s = &*t.store;
    let first = rec(s, log_only(&child(), "old").with_dedupe_key("dk"), T0).await;
    s.prune(&RetentionPolicy::default(), T0.plus_ms(31 * DAY))
        .await
        .unwrap();
    let again = rec(
        s,
        log_only(&child(), "new").with_dedupe_key("dk"),
        T0.plus_ms(31 * DAY),
    )
    .await;
    assert!(
        !again.deduplicated,
        "the key's row is gone, so the key is unused"
    );
    assert!(again.event.sequence > first.event.sequence);
    assert_eq!(again.event.summary, "new");
}

pub async fn occurred_at_is_clamped_into_the_last_day(t: &Subject) {
    let s = &*t.store;
    let now = Timestamp(1_802_678_400_000);
    let old = rec(
        s,
        log_only(&child(), "old").with_occurred_at(Timestamp(0)),
        now,
    )
    .await;
    assert_eq!(old.event.occurred_at, Timestamp(1_802_592_000_000));
    let future = rec(
        s,
        log_only(&child(), "future").with_occurred_at(Timestamp(1_803_456_000_000)),
        now,
    )
    .await;
    assert_eq!(future.event.occurred_at, now);
    let page = s.changes_since(&child(), Sequence(0), 200).await.unwrap();
    assert_eq!(
        page.events[0].occurred_at,
        Timestamp(1_802_592_000_000),
        "the clamped time is stored"
    );
    assert_eq!(page.events[1].occurred_at, now);
}

pub async fn occurred_at_defaults_to_now(t: &Subject) {
    let s = &*t.store;
    let got = rec(s, log_only(&child(), "x"), T0.plus_ms(7)).await;
    assert_eq!(got.event.occurred_at, T0.plus_ms(7));
}

pub async fn head_tracks_last_sequence_and_local_clock(t: &Subject) {
    let s = &*t.store;
    rec(s, log_only(&child(), "a"), T0).await;
    let b = rec(
        s,
        log_only(&child(), "b").with_occurred_at(T0.minus_ms(DAY)),
        T0.plus_ms(10),
    )
    .await;
    let head = s.heads(&[child()]).await.unwrap().remove(0);
    assert_eq!(head.last_sequence, b.event.sequence);
    assert_eq!(head.pruned_max_sequence, Sequence(0));
    assert_eq!(
        head.updated_at,
        T0.plus_ms(10),
        "bookkeeping uses the local clock, not the event's time"
    );
    assert_eq!(head.session, child());
}

pub async fn same_key_under_two_agents_is_two_sessions(t: &Subject) {
    let s = &*t.store;
    let main = r("global", "main");
    let ops = r("global", "ops");
    rec(s, log_only(&main, "goal updated"), T0).await;
    rec(s, log_only(&ops, "goal complete"), T0).await;
    rec(s, log_only(&ops, "session compacted"), T0).await;
    assert_eq!(version(s, &main).await, 1);
    assert_eq!(version(s, &ops).await, 3);
    assert_eq!(seqs(s, &main, 0).await, vec![1]);
    assert_eq!(seqs(s, &ops, 0).await, vec![2, 3]);
    s.delete_session(&main).await.unwrap();
    assert_eq!(version(s, &main).await, 0);
    assert_eq!(
        seqs(s, &ops, 0).await,
        vec![2, 3],
        "deleting main's global leaves ops' alone"
    );
}

pub async fn heads_survive_pruning(t: &Subject) {
    let s = &*t.store;
    for _ in 0..3 {
        rec(s, log_only(&child(), "x"), T0).await;
    }
    s.prune(&RetentionPolicy::default(), T0.plus_ms(31 * DAY))
        .await
        .unwrap();
    assert_eq!(count(s).await, 0);
    let head = s.heads(&[child()]).await.unwrap().remove(0);
    assert_eq!(
        head.last_sequence,
        Sequence(3),
        "pruning never lowers a head"
    );
    assert_eq!(head.pruned_max_sequence, Sequence(3));
    assert_eq!(
        head.updated_at,
        T0.plus_ms(31 * DAY),
        "the pruning that raised the watermark stamps the head's clock, as OpenClaw's does"
    );
}

pub async fn heads_unaffected_by_deleting_other_refs(t: &Subject) {
    let s = &*t.store;
    let a = r("agent:main:a", "main");
    let b = r("agent:main:b", "main");
    rec(s, log_only(&a, "a1"), T0).await;
    rec(s, log_only(&b, "b1"), T0).await;
    rec(s, log_only(&a, "a2"), T0).await;
    s.delete_session(&a).await.unwrap();
    assert_eq!(version(s, &b).await, 2);
    assert_eq!(seqs(s, &b, 0).await, vec![2]);
    let heads = s.heads(&[a.clone(), b.clone()]).await.unwrap();
    assert_eq!(heads.len(), 1, "the deleted ref has no head any more");
}

pub async fn sequences_never_reused_after_prune_and_delete(t: &Subject) {
    let s = &*t.store;
    for _ in 0..4 {
        rec(s, log_only(&child(), "x"), T0).await;
    }
    s.delete_session(&child()).await.unwrap();
    assert_eq!(count(s).await, 0);
    let next = rec(s, log_only(&child(), "y"), T0).await;
    assert_eq!(
        next.event.sequence,
        Sequence(5),
        "a deleted sequence is never reused"
    );
    s.prune(&RetentionPolicy::default(), T0.plus_ms(40 * DAY))
        .await
        .unwrap();
    let after = rec(s, log_only(&child(), "z"), T0.plus_ms(40 * DAY)).await;
    assert_eq!(
        after.event.sequence,
        Sequence(6),
        "a pruned sequence is never reused"
    );
}

pub async fn history_gap_only_from_pruned_watermark(t: &Subject) {
    let s = &*t.store;
    for _ in 0..3 {
        rec(s, log_only(&child(), "x"), T0).await;
    }
    t.raw.delete_event_row(Sequence(1)).await.unwrap();
    let page = s.changes_since(&child(), Sequence(0), 200).await.unwrap();
    assert!(
        !page.history_gap,
        "a hand-deleted row is no gap: only pruning stamps the watermark"
    );
    assert_eq!(page.earliest_available_sequence, Sequence(2));
    assert_eq!(page.events.len(), 2);
}

pub async fn history_gap_after_prune(t: &Subject) {
    let s = &*t.store;
    for _ in 0..4 {
        rec(s, log_only(&child(), "x"), T0).await;
    }
    let later = T0.plus_ms(31 * DAY);
    rec(s, log_only(&child(), "late"), later).await;
    s.prune(&RetentionPolicy::default(), later).await.unwrap();
    let gap = |after: u64| async move {
        s.changes_since(&child(), Sequence(after), 200)
            .await
            .unwrap()
    };
    let p0 = gap(0).await;
    assert!(p0.history_gap);
    assert_eq!(p0.earliest_available_sequence, Sequence(5));
    assert_eq!(p0.events.len(), 1);
    assert!(gap(3).await.history_gap, "3 < pruned watermark 4");
    assert!(
        !gap(4).await.history_gap,
        "4 is the watermark itself: nothing unseen was pruned"
    );
}

pub async fn earliest_available_is_smallest_retained(t: &Subject) {
    let s = &*t.store;
    rec(s, log_only(&r("agent:main:other", "main"), "o"), T0).await;
    rec(s, log_only(&child(), "a"), T0).await;
    rec(s, log_only(&child(), "b"), T0).await;
    let p = s.changes_since(&child(), Sequence(2), 200).await.unwrap();
    assert_eq!(
        p.earliest_available_sequence,
        Sequence(2),
        "independent of N"
    );
    assert_eq!(p.events.len(), 1);
}

pub async fn earliest_available_is_head_plus_one_when_all_pruned(t: &Subject) {
    let s = &*t.store;
    rec(s, log_only(&child(), "a"), T0).await;
    s.prune(&RetentionPolicy::default(), T0.plus_ms(31 * DAY))
        .await
        .unwrap();
    let p = s.changes_since(&child(), Sequence(0), 200).await.unwrap();
    assert_eq!(p.earliest_available_sequence, Sequence(2));
    assert!(p.history_gap);
    assert!(p.events.is_empty());
}

pub async fn earliest_available_is_zero_for_unknown_session(t: &Subject) {
    let s = &*t.store;
    rec(s, log_only(&child(), "a"), T0).await;
    let p = s
        .changes_since(&r("agent:main:nobody", "main"), Sequence(0), 200)
        .await
        .unwrap();
    assert_eq!(p.earliest_available_sequence, Sequence(0));
    assert!(!p.history_gap && !p.truncated && !p.version_ahead && p.events.is_empty());
    assert_eq!(version(s, &r("agent:main:nobody", "main")).await, 0);
    // So is a recorded session's key under another agent: its page reads nothing of that
    // session's head. (What the mutation did: store-postgres read the page's head by the key
    // alone; review of stop 72, PQ15.)
    let p = s
        .changes_since(&r(CHILD, "ops"), Sequence(0), 200)
        .await
        .unwrap();
    assert_eq!(p.earliest_available_sequence, Sequence(0), "{p:?}");
    assert!(
        !p.history_gap && !p.truncated && !p.version_ahead && p.events.is_empty(),
        "{p:?}"
    );
}

pub async fn changes_since_returns_exactly_that_ref_after_n(t: &Subject) {
    let s = &*t.store;
    let other_agent = r(CHILD, "ops");
    for i in 0..6 {
        let target = if i % 2 == 0 {
            child()
        } else {
            other_agent.clone()
        };
        rec(s, log_only(&target, "x"), T0).await;
    }
    assert_eq!(seqs(s, &child(), 0).await, vec![1, 3, 5]);
    assert_eq!(seqs(s, &child(), 1).await, vec![3, 5]);
    assert_eq!(seqs(s, &child(), 4).await, vec![5]);
    assert_eq!(seqs(s, &other_agent, 0).await, vec![2, 4, 6]);
    assert!(seqs(s, &child(), 5).await.is_empty());
}

pub async fn limit_is_clamped_and_truncated_reported(t: &Subject) {
    let s = &*t.store;
    for _ in 0..205 {
        rec(s, log_only(&child(), "x"), T0).await;
    }
    let p = s.changes_since(&child(), Sequence(0), 0).await.unwrap();
    assert_eq!(p.events.len(), 1, "limit 0 is clamped to 1");
    assert!(p.truncated);
    let p = s
        .changes_since(&child(), Sequence(0), 10_000)
        .await
        .unwrap();
    assert_eq!(p.events.len(), 200, "limit is clamped to 200");
    assert!(p.truncated);
    assert_eq!(p.events.last().unwrap().sequence, Sequence(200));
    let p = s.changes_since(&child(), Sequence(5), 200).await.unwrap();
    assert_eq!(p.events.len(), 200);
    assert!(!p.truncated, "exactly 200 left: not truncated");
    let p = s.changes_since(&child(), Sequence(1), 5).await.unwrap();
    assert_eq!(
        p.events
            .iter()
            .map(|e| e.sequence.get())
            .collect::<Vec<_>>(),
        vec![2, 3, 4, 5, 6]
    );
    assert!(p.truncated);
}

pub async fn version_ahead_when_caller_is_past_the_head(t: &Subject) {
    let s = &*t.store;
    rec(s, log_only(&child(), "x"), T0).await;
    rec(s, log_only(&child(), "x"), T0).await;
    assert!(
        !s.changes_since(&child(), Sequence(2), 200)
            .await
            .unwrap()
            .version_ahead
    );
    let p = s.changes_since(&child(), Sequence(3), 200).await.unwrap();
    assert!(p.version_ahead, "3 > stateVersion 2");
    assert!(p.events.is_empty());
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["versionAhead"], json!(true));
    let ordinary =
        serde_json::to_value(s.changes_since(&child(), Sequence(0), 200).await.unwrap()).unwrap();
    assert!(ordinary.get("versionAhead").is_none(), "absent unless true");
}

pub async fn changes_since_moves_no_cursor(t: &Subject) {
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    rec(s, human(&child()), T0).await;
    let before = all_cursors(s).await;
    s.session_status(&child(), Some(Sequence(0)), Some(5))
        .await
        .unwrap();
    s.changes_since(&child(), Sequence(1), 200).await.unwrap();
    assert_eq!(all_cursors(s).await, before);
}

pub async fn twenty_material_events_one_byte_identical_notice(t: &Subject) {
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    let mut texts = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let got = rec(s, human(&child()), T0).await;
        assert_eq!(got.notices.len(), 1);
        texts.insert((got.notices[0].text(), got.notices[0].context_key()));
    }
    assert_eq!(texts.len(), 1, "20 rapid changes give one byte-stable line");
    let (text, key) = texts.into_iter().next().unwrap();
    assert_eq!(
        text,
        "Session \"agent:main:subagent:c1\" changed (other actor). Reconcile before acting: session_status sessionKey \"agent:main:subagent:c1\" changesSince 1."
    );
    assert_eq!(
        key,
        "session-state:6167656e743a6d61696e3a7375626167656e743a6331"
    );
    assert_eq!(cursor3(s, MANAGER, CHILD).await, Some((1, 2, 21)));
    let pending = s
        .cursors(&CursorFilter {
            pending_only: true,
            ..CursorFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(pending.len(), 1, "exactly one pending notice");
}

pub async fn frozen_watermark_stays_at_first_unseen_event(t: &Subject) {
    let s = &*t.store;
    s.watch(&w(PEER), &child(), T0).await.unwrap();
    rec(s, log_only(&child(), "log"), T0).await;
    rec(s, human(&child()), T0).await;
    rec(s, human(&child()), T0).await;
    assert_eq!(
        cursor3(s, PEER, CHILD).await,
        Some((0, 2, 3)),
        "log-only seq 1 is no material"
    );
}

pub async fn every_material_event_hands_the_notice_to_delivery(t: &Subject) {
    let s = &*t.store;
    s.watch(&w(MANAGER), &child(), T0).await.unwrap();
    s.watch(&w(PEER), &child(), T0).await.unwrap();
    let a = rec(s, human(&child()), T0).await;
    let b = rec(s, human(&child()), T0).await;
    for got in [&a, &b] {
        let mut watchers: Vec<_> = got
            .notices
            .iter()
            .map(|n| n.watcher.as_str().to_owned())
            .collect();
        watchers.sort();
        assert_eq!(watchers, vec![MANAGER.to_owned(), PEER.to_owned()]);
        assert!(got.notices.iter().all(|n| n.last_seen == Sequence(0)));
    }
}

/// Many callers recording at once (which a durable store may group into one write transaction)
/// each get their own event back, with the per-event protocol unchanged: distinct sequences,
/// one spent per call (hits included), one winner per dedupe key, heads at each ref's highest
/// sequence, every material event handing the notices over, the watermark frozen at the first.
pub async fn concurrent_records_each_get_their_own_event(t: &Subject) {
    const CALLS: usize = 24;
    let s = &*t.store;
    s.watch(&w(MANAGER), &child(), T0).await.unwrap();
    s.watch(&w(PEER), &child(), T0).await.unwrap();
    let mine = |i: usize| -> NewEvent {
        let mut e = match i % 3 {
            0 => human(&child()),
            1 => human(&r(&format!("agent:main:subagent:solo{i}"), "main")),
            _ => human(&child()).with_dedupe_key(format!("dk-{}", i % 2)),
        };
        e.summary = format!("message {i}");
        e
    };
    let tasks: Vec<_> = (0..CALLS)
        .map(|i| {
            let store = std::sync::Arc::clone(&t.store);
            let e = mine(i);
            tokio::spawn(async move { store.record(e, T0).await })
        })
        .collect();
    let mut got = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        got.push((i, task.await.expect("join").expect("record")));
    }
    let mut winners: std::collections::BTreeMap<String, std::sync::Arc<crate::Event>> =
        std::collections::BTreeMap::new();
    let mut child_seqs = Vec::new();
    let mut stored = std::collections::BTreeSet::new();
    for (i, rec) in &got {
        let own = mine(*i);
        if rec.deduplicated {
            assert!(rec.notices.is_empty(), "a hit notifies nobody");
            continue;
        }
        assert_eq!(rec.event.summary, own.summary, "call {i} got its own event");
        assert_eq!(
            (&rec.event.session_key, &rec.event.agent_id),
            (&own.session.session_key, &own.session.agent_id),
            "call {i} got its own session"
        );
        assert!(
            stored.insert(rec.event.sequence.get()),
            "sequences are distinct"
        );
        if let Some(key) = &own.dedupe_key {
            assert!(
                winners.insert(key.clone(), rec.event.clone()).is_none(),
                "one winner per dedupe key"
            );
        }
        if own.session == child() {
            child_seqs.push(rec.event.sequence.get());
            let mut who: Vec<_> = rec.notices.iter().map(|n| n.watcher.as_str()).collect();
            who.sort_unstable();
            assert_eq!(
                who,
                [MANAGER, PEER],
                "call {i}: both watchers are handed the notice"
            );
            assert!(rec.notices.iter().all(|n| n.last_seen == Sequence(0)));
        } else {
            assert!(
                rec.notices.is_empty(),
                "an unwatched session notifies nobody"
            );
            assert_eq!(version(s, &own.session).await, rec.event.sequence.get());
        }
    }
    assert_eq!(
        winners.len(),
        2,
        "each of the two dedupe keys was stored once"
    );
    assert_heads_at_last_events(s, "after the concurrent recordings").await;
    for (i, rec) in got.iter().filter(|(_, r)| r.deduplicated) {
        let key = mine(*i).dedupe_key.expect("only keyed calls can hit");
        assert_eq!(
            rec.event, winners[&key],
            "call {i}: a hit returns the stored event"
        );
    }
    let next = rec(s, log_only(&child(), "after"), T0).await;
    assert_eq!(
        next.event.sequence.get(),
        CALLS as u64 + 1,
        "every call spent exactly one sequence, hits included"
    );
    let logged: std::collections::BTreeSet<u64> = s
        .events_after(Sequence(0), 1000)
        .await
        .unwrap()
        .iter()
        .map(|e| e.sequence.get())
        .filter(|q| *q <= CALLS as u64)
        .collect();
    assert_eq!(logged, stored, "exactly the stored events are in the log");
    let (first, last) = (child_seqs.iter().min(), child_seqs.iter().max());
    let (first, last) = (*first.unwrap(), *last.unwrap());
    for watcher in [MANAGER, PEER] {
        assert_eq!(
            cursor3(s, watcher, CHILD).await,
            Some((0, first, last)),
            "{watcher}: frozen at the first material event, material at the last"
        );
    }
}

/// Callers that give up (cancelled before their task ran, or after zero to three yields of the
/// test's task: on a durable store, while queued, while their batch is written, or after) never
/// cost another caller its commit: every caller still waiting gets its own event, committed as
/// returned, every given-up event is in the log at most once, and the store goes on. On a
/// store that batches concurrent recordings ([`Subject::batching`]), some cancellation must
/// have hit a recording under way (polled, not finished): otherwise every cancelled caller was
/// cancelled before it started or after it ended, and the check checked nothing a store could
/// get wrong. (A store that records within one poll, such as store-memory, has no such moment.)
pub async fn cancelled_recordings_cancel_nobody_elses_commit(t: &Subject) {
    let s = &*t.store;
    let on = |i: usize| r(&format!("agent:main:subagent:c{}", i % 4), "main");
    // Cancelled callers whose recording had been polled and had not finished.
    let mut hit_under_way = 0;
    for round in 0..20 {
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let store = std::sync::Arc::clone(&t.store);
                let mut e = human(&on(i));
                e.summary = format!("message {round}.{i}");
                let polled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                let task = tokio::spawn({
                    let polled = std::sync::Arc::clone(&polled);
                    async move {
                        // Set in the task's first poll, which then polls the recording.
                        polled.store(true, std::sync::atomic::Ordering::Relaxed);
                        store.record(e, T0).await
                    }
                });
                (task, polled)
            })
            .collect();
        // Let some of them start (none in one round of four), then cancel every other caller,
        // wherever it is. In the other rounds, the test's task first waits (yielding, bounded)
        // until a caller it will cancel has been polled, then yields zero to two more times:
        // fixed yields alone, on a loaded machine, cancelled every caller before it started
        // or after it ended, and the check then failed for want of a cancellation under way.
        if round % 4 != 0 {
            for _ in 0..10_000 {
                let started = tasks
                    .iter()
                    .step_by(2)
                    .any(|(_, polled)| polled.load(std::sync::atomic::Ordering::Relaxed));
                if started {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        for _ in 1..round % 4 {
            tokio::task::yield_now().await;
        }
        let mut kept = Vec::new();
        let mut aborted = Vec::new();
        for (i, (task, polled)) in tasks.into_iter().enumerate() {
            if i % 2 == 0 {
                task.abort();
                aborted.push((task, polled));
            } else {
                kept.push((i, task));
            }
        }
        for (task, polled) in aborted {
            // Cancelled (not finished) after its first poll: the recording was under way.
            let cancelled = task.await.is_err_and(|e| e.is_cancelled());
            hit_under_way +=
                usize::from(cancelled && polled.load(std::sync::atomic::Ordering::Relaxed));
        }
        for (i, task) in kept {
            let got = task
                .await
                .expect("join")
                .expect("a kept caller's recording");
            assert_eq!(got.event.summary, format!("message {round}.{i}"));
            let before = Sequence(got.event.sequence.get() - 1);
            let page = s.changes_since(&on(i), before, 1).await.unwrap();
            assert_eq!(
                page.events.first(),
                Some(&got.event),
                "committed as returned"
            );
        }
    }
    let log = s.events_after(Sequence::ZERO, 1_000).await.unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for e in &log {
        assert!(seen.insert(e.summary.clone()), "{:?} twice", e.summary);
    }
    // Each head is its ref's last event, on the sessions of the cancelled callers too (c0,
    // c2), before any recording after them could put a torn head right.
    assert_eq!(
        crate::audit::audit_store(s).await.expect("audit").findings,
        [],
        "nothing torn by a cancelled recording"
    );
    // The audit passes a head above every event of its session (right after pruning, which
    // this check does not do): a cancelled caller's head moved without its event is caught
    // here.
    assert_heads_at_last_events(s, "after the cancellations").await;
    let last = rec(s, human(&on(0)), T0).await;
    assert_eq!(version(s, &on(0)).await, last.event.sequence.get());
    if t.batching.is_some() {
        assert!(
            hit_under_way > 0,
            "no cancellation hit a recording under way (polled, not finished)"
        );
    }
}

/// A recording whose caller gives up while its event waits in the queue behind the store's
/// held writer ([`Subject::batching`]) is never committed, by that writer's batch or a later
/// one, on a store whose queued events leave with their callers
/// ([`super::model::GivenUp::LeavesTheQueue`]): its caller may be retrying it. The recording
/// that waited with them and three after them are committed. (Other stores are held to "at
/// most once" by [`cancelled_recordings_cancel_nobody_elses_commit`].)
pub async fn a_recording_given_up_in_the_queue_is_never_committed(t: &Subject) {
    let Some(b) = t
        .batching
        .as_ref()
        .filter(|b| b.given_up == super::model::GivenUp::LeavesTheQueue)
    else {
        return;
    };
    let s = &*t.store;
    let gone = r("agent:main:subagent:gone", "main");
    let release = (b.hold_writer)().await;
    for i in 0..8 {
        let mut e = human(&gone);
        e.summary = format!("given up {i}");
        let mut call = std::pin::pin!(s.record(e, T0));
        assert!(
            !super::poll_once(call.as_mut()).await,
            "a recording waits behind the held writer"
        );
    }
    let store = std::sync::Arc::clone(&t.store);
    let mut waited = Box::pin(async move { store.record(human(&child()), T0).await });
    assert!(
        !super::poll_once(waited.as_mut()).await,
        "a recording waits behind the held writer"
    );
    let waited = tokio::spawn(waited);
    release.release().await;
    waited
        .await
        .expect("join")
        .expect("the recording that waited");
    for _ in 0..3 {
        rec(s, human(&child()), T0).await;
    }
    assert_eq!(
        version(s, &gone).await,
        0,
        "an event whose caller gave up in the queue was committed"
    );
    assert_eq!(
        s.events_after(Sequence::ZERO, 100).await.unwrap().len(),
        4,
        "the recordings whose callers waited"
    );
}

/// Recordings racing the other writes of the same cursor: acknowledgements, re-freezes and a
/// repeated watch, made a day after the round before (so that it refreshes the cursor and
/// writes: at the same clock a repeated watch writes nothing, and a race with it proved
/// nothing). Each is atomic and reads the cursor inside its own write, so after every
/// round the cursor's `material` is the head (no recording lost to a write of old values) and
/// `last_seen <= notified <= material`; two acknowledgements then leave it at the head. A
/// store that read the cursor outside its write transaction would write stale values back.
/// Rounds take turns: all the writes at once, then recordings against re-freezes only, then
/// against acknowledgements only (with two re-freezes among nineteen tasks, a store-memory
/// whose re-freeze let its lock go between its read and its write passed every run; one whose
/// acknowledgement did, half of them: review, stop 58). The tasks are spawned interleaved:
/// spawned after the eight recordings, the acknowledgements mostly ran once they were done,
/// and on a loaded machine that acknowledgement passed 31 runs of 40 (the second reading);
/// interleaved, with both cores busy elsewhere, the acknowledgement's mutation failed 12 runs
/// of 12 (90 rounds) and the re-freeze's 8 of 10 (150 rounds); in runs of the whole suite at
/// 150 rounds, 6 of 6 and 5 of 6. A race check catches such a store often, not surely.
pub async fn cursor_writes_racing_recordings_lose_no_event(t: &Subject) {
    const ROUNDS: usize = 150;
    let s = &*t.store;
    s.watch(&w(MANAGER), &child(), T0).await.unwrap();
    let key = CursorKey {
        watcher: w(MANAGER),
        target: k(CHILD),
    };
    for round in 0..ROUNDS {
        let mut tasks: Vec<tokio::task::JoinHandle<Result<(), StoreError>>> = Vec::new();
        // Which write each of the 11 tasks after the 8 recordings makes.
        let (acks, refreezes) = match round % 3 {
            0 => (8, 2),
            1 => (0, 11),
            _ => (11, 0),
        };
        // Spawned interleaved (a recording, another write, ...), so that the other writes
        // start while recordings still run rather than after the last one.
        for i in (0..8).flat_map(|r| [r, r + 8]).chain(16..19) {
            let store = std::sync::Arc::clone(&t.store);
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                match i {
                    0..8 => store.record(human(&child()), T0).await.map(drop),
                    i if i < 8 + acks => store
                        .acknowledge(&w(MANAGER), &[any(CHILD)], T0)
                        .await
                        .map(drop),
                    i if i < 8 + acks + refreezes => store.refreeze(&[key], T0).await.map(drop),
                    _ => {
                        let later = T0.plus_ms(DAY * (i64::try_from(round).unwrap_or(0) + 1));
                        store.watch(&w(MANAGER), &child(), later).await.map(drop)
                    }
                }
            }));
        }
        for task in tasks {
            task.await
                .expect("join")
                .expect("a cursor write or a recording");
        }
        let head = version(s, &child()).await;
        assert_eq!(
            head,
            8 * (round as u64 + 1),
            "round {round}: every recording"
        );
        let (last_seen, notified, material) = cursor3(s, MANAGER, CHILD).await.expect("cursor");
        assert_eq!(
            material, head,
            "round {round}: no recording lost to a stale write"
        );
        assert!(
            last_seen <= notified && notified <= material,
            "round {round}: ({last_seen}, {notified}, {material})"
        );
    }
    for _ in 0..2 {
        s.acknowledge(&w(MANAGER), &[any(CHILD)], T0).await.unwrap();
    }
    let head = version(s, &child()).await;
    assert_eq!(cursor3(s, MANAGER, CHILD).await, Some((head, head, head)));
}

/// A first watch of a session racing a recording on it: whichever commits first, the cursor
/// ends at the session's head (the watch starts at the head it reads, and a recording after
/// it moves the cursor). A store whose watch read the head outside its write would start the
/// cursor below an event recorded in between, which would then never notify.
pub async fn a_first_watch_racing_a_recording_loses_no_event(t: &Subject) {
    const ROUNDS: usize = 40;
    for round in 0..ROUNDS {
        let target = r(&format!("agent:main:subagent:first-watch-{round}"), "main");
        rec(&*t.store, human(&target), T0).await;
        let (watch, record) = {
            let (a, b) = (
                std::sync::Arc::clone(&t.store),
                std::sync::Arc::clone(&t.store),
            );
            let (ta, tb) = (target.clone(), target.clone());
            (
                tokio::spawn(async move { a.watch(&w(MANAGER), &ta, T0).await.map(drop) }),
                tokio::spawn(async move { b.record(human(&tb), T0).await.map(drop) }),
            )
        };
        watch.await.expect("join").expect("the watch");
        record.await.expect("join").expect("the recording");
        let head = version(&*t.store, &target).await;
        assert_eq!(head, 2 * round as u64 + 2, "round {round}: both recordings");
        let c = t
            .store
            .cursor(&w(MANAGER), &target.session_key)
            .await
            .unwrap()
            .expect("the watch");
        assert_eq!(c.material.get(), head, "round {round}: {c:?}");
        assert!(c.is_well_formed(), "round {round}: {c:?}");
    }
}

/// The deletion of a session racing the spawn that records it (and seeds its spawner's cursor on
/// it): whichever commits first, the session has a head exactly when the spawner has a cursor on
/// it (deleted together, or recorded together after). A store that deleted the session's rows
/// and its cursors in two writes would leave a head without the cursor its spawn made, or a
/// cursor on a session without a head.
pub async fn a_deletion_racing_a_spawn_leaves_both_or_neither(t: &Subject) {
    const ROUNDS: usize = 40;
    for round in 0..ROUNDS {
        let target = r(&format!("agent:main:subagent:spawned-{round}"), "main");
        let (delete, record) = {
            let (a, b) = (
                std::sync::Arc::clone(&t.store),
                std::sync::Arc::clone(&t.store),
            );
            let (ta, tb) = (target.clone(), target.clone());
            let run = format!("run-spawned-{round}");
            (
                tokio::spawn(async move { a.delete_session(&ta).await.map(drop) }),
                tokio::spawn(
                    async move { b.record(spawn(&tb, MANAGER, &run), T0).await.map(drop) },
                ),
            )
        };
        delete.await.expect("join").expect("the deletion");
        record.await.expect("join").expect("the spawn");
        let head = version(&*t.store, &target).await;
        let cursor = t
            .store
            .cursor(&w(MANAGER), &target.session_key)
            .await
            .unwrap();
        assert_eq!(
            head > 0,
            cursor.is_some(),
            "round {round}: head {head}, cursor {cursor:?}"
        );
    }
}

/// Two marker updates racing under one compare-and-set token, and one racing a change of the
/// link's source (a rebase, which moves the token): at most one update under a token is
/// written, and none after the rebase that moved it. A store that compared the token outside
/// its write would let two scans both advance one marker, or write a marker over a rebase.
pub async fn marker_updates_racing_under_one_token_write_at_most_once(t: &Subject) {
    const ROUNDS: usize = 40;
    for round in 0..ROUNDS {
        let session = r(&format!("agent:main:subagent:marker-{round}"), "main");
        let link = t
            .upstream
            .upsert_link(link_spec(&session, "t1", 0), T0)
            .await
            .unwrap()
            .link;
        let token = link.updated_at;
        let rebase = round % 2 == 1;
        let mut tasks = Vec::new();
        for i in 0..2 {
            let u = std::sync::Arc::clone(&t.upstream);
            let s = session.clone();
            tasks.push(tokio::spawn(async move {
                if rebase && i == 1 {
                    u.upsert_link(link_spec(&s, "t2", 7), T0)
                        .await
                        .map(|o| o.rebased)
                } else {
                    u.set_marker(&s, token, json!({"offset": 100 + i}), T0.plus_ms(1))
                        .await
                }
            }));
        }
        let mut results = Vec::new();
        for task in tasks {
            results.push(
                task.await
                    .expect("join")
                    .expect("a marker write or a rebase"),
            );
        }
        let stored = t.upstream.link(&session).await.unwrap().expect("the link");
        if rebase {
            assert!(results[1], "round {round}: a change of source rebases");
            assert_eq!(stored.thread_id, "t2", "round {round}");
            // A marker written before the rebase is rebased over; one after it is refused.
            assert_eq!(
                stored.marker,
                Some(json!({"offset": 7})),
                "round {round}: no marker over the rebase ({results:?})"
            );
        } else {
            let written = results.iter().filter(|w| **w).count();
            assert_eq!(written, 1, "round {round}: one write under the token");
            let i = results.iter().position(|w| *w).unwrap_or(0);
            assert_eq!(
                stored.marker,
                Some(json!({"offset": 100 + i})),
                "round {round}"
            );
        }
    }
}

/// A removal of a cursor (an unwatch, or a reset of its watcher) racing recordings on its
/// target: once both are done the cursor is gone, whatever the order (a recording that names
/// no watcher never makes one), and another watcher's cursor on the target saw every
/// recording. A store that read the cursors before the removal committed and wrote them back
/// after (in a batch, say) would bring the removed cursor back.
pub async fn removals_racing_recordings_bring_no_cursor_back(t: &Subject) {
    const ROUNDS: usize = 20;
    let s = &*t.store;
    s.watch(&w(PEER), &child(), T0).await.unwrap();
    for round in 0..ROUNDS {
        s.watch(&w(MANAGER), &child(), T0).await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..9 {
            let store = std::sync::Arc::clone(&t.store);
            tasks.push(tokio::spawn(async move {
                match (i, round % 2) {
                    (0..8, _) => store.record(human(&child()), T0).await.map(drop),
                    (_, 0) => store.unwatch(&w(MANAGER), &k(CHILD)).await.map(drop),
                    _ => store.reset_watcher(&k(MANAGER)).await.map(drop),
                }
            }));
        }
        for task in tasks {
            task.await.expect("join").expect("a removal or a recording");
        }
        assert_eq!(
            s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap(),
            None,
            "round {round}: the removed cursor stays removed"
        );
        let head = version(s, &child()).await;
        assert_eq!(
            head,
            8 * (round as u64 + 1),
            "round {round}: every recording"
        );
        let (_, _, material) = cursor3(s, PEER, CHILD).await.expect("the peer's cursor");
        assert_eq!(
            material, head,
            "round {round}: the other cursor saw them all"
        );
    }
}

/// Pages read while pruning passes delete the rows they cover never hide a loss: a page
/// either starts right after the caller's version, or says `historyGap`; its events follow one
/// another, from `earliestAvailableSequence` on when the caller's next was pruned. (Only the
/// child's events are in the log, so its sequences have no holes but the pruned ones.) A
/// store that read a page's events and its head (or its watermark) in two steps, with a pass
/// between them, would show a page with its first events gone and no gap: the stores here
/// read a page at once, which is what this holds any other backend to.
pub async fn pages_read_while_pruning_never_hide_a_loss(t: &Subject) {
    const EVENTS: u64 = 400;
    let s = &*t.store;
    for _ in 0..EVENTS {
        rec(s, human(&child()), T0).await;
    }
    let policy = RetentionPolicy {
        max_rows: 20,
        chunk_rows: 7,
        ..RetentionPolicy::default()
    };
    let pruner = {
        let store = std::sync::Arc::clone(&t.store);
        tokio::spawn(async move {
            // Pass after pass, each deleting a few chunks, down to the cap.
            loop {
                let report = store.prune(&policy, T0).await?;
                if report.events_by_age + report.events_by_cap == 0 {
                    return Ok::<_, StoreError>(());
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let mut pages = 0_u64;
    while !pruner.is_finished() || pages == 0 {
        for after in [0, 1, 100, 200, 300, 370] {
            let page = s
                .changes_since(&child(), Sequence(after), 10)
                .await
                .expect("changes_since");
            pages += 1;
            let seen: Vec<u64> = page.events.iter().map(|e| e.sequence.get()).collect();
            for pair in seen.windows(2) {
                assert_eq!(pair[1], pair[0] + 1, "after {after}: {seen:?} has a hole");
            }
            let Some(&first) = seen.first() else {
                continue;
            };
            if page.history_gap {
                assert_eq!(
                    first,
                    page.earliest_available_sequence.get(),
                    "after {after}: a gap page starts at the earliest available"
                );
            } else {
                assert_eq!(
                    first,
                    after + 1,
                    "after {after}: the page starts at {first} without a gap"
                );
            }
        }
        tokio::task::yield_now().await;
    }
    pruner.await.expect("join").expect("prune");
    // Once the passes are done, a read from before the cap's rows sees the gap.
    let page = s.changes_since(&child(), Sequence(0), 10).await.unwrap();
    assert!(page.history_gap, "{page:?}");
    assert_eq!(page.earliest_available_sequence, Sequence(EVENTS - 19));
}

/// Pruning passes racing recordings on the sessions they prune: every head ends at the last
/// event recorded on it (a pass never writes back a head it read before a recording moved it),
/// each watermark stays at or below its head, the row cap holds once the last pass ran alone,
/// and what the store holds breaks none of the audit's invariants. The passes are started
/// while recordings land, and what they report must be what they deleted (see
/// `racing_prune`); whether a pass overlaps a recording is left to the scheduler, not timed.
/// No other check runs pruning beside recording.
pub async fn pruning_racing_recordings_lowers_no_head(t: &Subject) {
    // Chunks of a few rows, then chunks that store-memory deletes in several steps (256 rows
    // under one hold of its lock) while the recordings go on between them.
    racing_prune(t, 8, 24, 3).await;
    racing_prune(t, 2, 600, 600).await;
}

/// [`pruning_racing_recordings_lowers_no_head`]: `rounds` rounds of `per_round` recordings on
/// one task beside pruning passes down to 12 rows, in chunks of `chunk_rows`, on another, from
/// a log of at least twice the cap (so that the first passes have rows to delete).
///
/// A pass begins each time `per_round / 8` more recordings have landed. Halfway through a
/// round the recorder waits until a pass that began after the first half landed has ended
/// (never for a time): the passes of the round up to that one began after its first recording
/// landed and ended before the second half began, and since only they delete, they must report
/// exactly the rows the round began with plus the first half, less the cap. The passes racing
/// the second half must then report exactly what the round's end leaves missing. A store whose
/// reports were not what its passes deleted fails one of the two. (The pass between the halves
/// runs with no recording in flight and could do all the deleting: that the other passes
/// overlap a recording is likely, not asserted.)
async fn racing_prune(t: &Subject, rounds: usize, per_round: usize, chunk_rows: usize) {
    const SESSIONS: usize = 3;
    const CAP: u64 = 12;
    let s = &*t.store;
    let refs: Vec<SessionRef> = (0..SESSIONS)
        .map(|i| r(&format!("agent:main:p{i}"), "main"))
        .collect();
    let policy = RetentionPolicy {
        max_rows: CAP,
        chunk_rows,
        ..RetentionPolicy::default()
    };
    let rows = async || s.log_stats().await.expect("stats").rows;
    // A log of at least twice the cap, so that the first passes delete.
    for i in rows().await..2 * CAP {
        let session = &refs[usize::try_from(i).expect("small") % SESSIONS];
        rec(s, log_only(session, "x"), T0).await;
    }
    let mut last = [0u64; SESSIONS];
    for h in s.heads(&refs).await.expect("heads") {
        let i = refs
            .iter()
            .position(|r| *r == h.session)
            .expect("one of ours");
        last[i] = h.last_sequence.get();
    }
    let half = per_round / 2;
    let every = (per_round / 8).max(1);
    for round in 0..rounds {
        let at_start = rows().await;
        assert!(
            at_start >= CAP,
            "round {round}: {at_start} rows, below the cap"
        );
        // How many recordings of the round have landed, for the pruner.
        let (landed_tx, mut landed) = tokio::sync::watch::channel(0_usize);
        // A pass that began once the first half had landed has ended.
        let (midway_tx, midway) = tokio::sync::oneshot::channel::<()>();
        let recorder = {
            let store = std::sync::Arc::clone(&t.store);
            let refs = refs.clone();
            tokio::spawn(async move {
                let mut midway = Some(midway);
                let mut got = Vec::new();
                for i in 0..per_round {
                    if i == half
                        && let Some(pass) = midway.take()
                    {
                        // A pruner that failed dropped its sender: its error is reported.
                        let _ = pass.await;
                    }
                    let rec = store.record(log_only(&refs[i % SESSIONS], "x"), T0).await?;
                    got.push((i % SESSIONS, rec.event.sequence.get()));
                    landed_tx.send_replace(i + 1);
                    tokio::task::yield_now().await;
                }
                Ok::<_, StoreError>(got)
            })
        };
        let pruner = {
            let store = std::sync::Arc::clone(&t.store);
            tokio::spawn(async move {
                let mut midway = Some(midway_tx);
                // Rows the passes deleted up to the one between the halves, and after it.
                let (mut first_half, mut second_half) = (0_u64, 0_u64);
                let mut next = 1;
                loop {
                    let waiting = midway.is_some();
                    let Ok(seen) = landed
                        .wait_for(|&n| n >= next || (waiting && n >= half))
                        .await
                        .map(|n| *n)
                    else {
                        // The recorder is done.
                        break;
                    };
                    let report = store.prune(&policy, T0).await?;
                    let deleted = report.events_by_age + report.events_by_cap;
                    if midway.is_some() {
                        first_half += deleted;
                    } else {
                        second_half += deleted;
                    }
                    if seen >= half
                        && let Some(pass) = midway.take()
                    {
                        let _ = pass.send(());
                    }
                    next = seen + every;
                }
                Ok::<_, StoreError>((first_half, second_half))
            })
        };
        for (i, seq) in recorder.await.expect("join").expect("record") {
            last[i] = last[i].max(seq);
        }
        let (first_half, second_half) = pruner.await.expect("join").expect("prune");
        let at_end = rows().await;
        let half_rows = u64::try_from(half).expect("small");
        assert_eq!(
            first_half,
            at_start + half_rows - CAP,
            "round {round}: the passes up to the one between the round's halves, which began \
             after its first recording landed, deleted every row above the cap"
        );
        assert_eq!(
            first_half + second_half,
            at_start + u64::try_from(per_round).expect("small") - at_end,
            "round {round}: the passes report every row the round deleted"
        );
        let heads = s.heads(&refs).await.expect("heads");
        for (i, r) in refs.iter().enumerate() {
            let h = heads
                .iter()
                .find(|h| h.session == *r)
                .unwrap_or_else(|| panic!("round {round}: {r:?} has a head"));
            assert_eq!(
                h.last_sequence.get(),
                last[i],
                "round {round}: the head of {r:?} is its last event"
            );
            assert!(
                h.pruned_max_sequence <= h.last_sequence,
                "round {round}: {h:?}"
            );
        }
    }
    s.prune(&policy, T0).await.expect("the last pass, alone");
    assert_eq!(s.log_stats().await.expect("stats").rows, CAP);
    let heads = s.list_heads(None).await.expect("heads");
    let events = s.events_after(Sequence::ZERO, 1_000).await.expect("events");
    let cursors = s.cursors(&CursorFilter::default()).await.expect("cursors");
    let found = crate::audit::audit(&heads, &events, &cursors);
    assert!(found.is_empty(), "broken invariants: {found:#?}");
}

/// A pruning pass whose clock is behind a head's (the head was moved by a recording on another
/// process, or a clock stepped back) stamps its watermark without moving its clock back:
/// bookkeeping times only go forward.
pub async fn a_prune_behind_a_heads_clock_leaves_the_clock(t: &Subject) {
    let s = &*t.store;
    let later = T0.plus_ms(60_000);
    for _ in 0..30 {
        rec(s, log_only(&child(), "x"), later).await;
    }
    let policy = RetentionPolicy {
        max_rows: 10,
        chunk_rows: 7,
        ..RetentionPolicy::default()
    };
    let report = s.prune(&policy, T0).await.unwrap();
    assert_eq!(report.events_by_cap, 20);
    let h = s.heads(&[child()]).await.unwrap().remove(0);
    assert_eq!(
        (h.last_sequence, h.pruned_max_sequence, h.updated_at),
        (Sequence(30), Sequence(20), later)
    );
}

pub async fn acknowledge_with_interleaved_event_reopens_exactly_one(t: &Subject) {
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    rec(s, human(&child()), T0).await; // 2: notice changesSince 1
    rec(s, human(&child()), T0).await; // 3: arrives before the ack
    let follow = s
        .acknowledge(&w(MANAGER), &[any(CHILD)], T0.plus_ms(1_000))
        .await
        .unwrap();
    assert_eq!(follow.len(), 1, "exactly one follow-up");
    assert_eq!(
        follow[0].last_seen,
        Sequence(2),
        "it names the old watermark, not the head"
    );
    assert_eq!(
        follow[0].text(),
        protocol::notice_text(&k(CHILD), Sequence(2))
    );
    let c = s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap().unwrap();
    assert_eq!(
        (c.last_seen, c.notified, c.material),
        (Sequence(2), Sequence(3), Sequence(3))
    );
    assert_eq!(c.updated_at, T0.plus_ms(1_000));
    let again = s
        .acknowledge(&w(MANAGER), &[any(CHILD)], T0.plus_ms(2_000))
        .await
        .unwrap();
    assert!(again.is_empty(), "nothing new: no follow-up");
    assert_eq!(cursor3(s, MANAGER, CHILD).await, Some((3, 3, 3)));
}

pub async fn acknowledging_a_target_twice_in_one_call_acknowledges_it_once(t: &Subject) {
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    rec(s, human(&child()), T0).await; // 2: notice changesSince 1
    rec(s, human(&child()), T0).await; // 3: arrives before the ack
    let follow = s
        .acknowledge(&w(MANAGER), &[any(CHILD), any(CHILD)], T0.plus_ms(1_000))
        .await
        .unwrap();
    assert_eq!(
        follow.iter().map(|n| n.last_seen).collect::<Vec<_>>(),
        [Sequence(2)],
        "one follow-up, as for the target listed once"
    );
    assert_eq!(
        cursor3(s, MANAGER, CHILD).await,
        Some((2, 3, 3)),
        "the follow-up stays pending until a turn reads it"
    );
    let next = s
        .acknowledge(&w(MANAGER), &[any(CHILD)], T0.plus_ms(2_000))
        .await
        .unwrap();
    assert!(next.is_empty());
    assert_eq!(cursor3(s, MANAGER, CHILD).await, Some((3, 3, 3)));
}

/// A turn read the notice `changesSince 1`; before its acknowledgement the watcher was reset
/// and watched the target again, and a new notice (`changesSince 2`) is pending that the turn
/// never showed. The acknowledgement of what the turn read leaves that one pending. So it does
/// when the cursor was re-pointed to another agent's session of the key, from the same
/// `last_seen` (0, where a named watcher's cursor starts).
pub async fn an_acknowledgement_of_a_notice_no_longer_shown_changes_nothing(t: &Subject) {
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    rec(s, human(&child()), T0).await; // 2: notice changesSince 1
    let read = protocol::Notice::of(&s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap().unwrap());
    assert_eq!(read.last_seen, Sequence(1));
    s.reset_watcher(&k(MANAGER)).await.unwrap();
    s.watch(&w(MANAGER), &child(), T0).await.unwrap(); // at the head, 2
    rec(s, human(&child()), T0).await; // 3: notice changesSince 2
    let before = s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap();
    acknowledges_nothing(
        s,
        &[AckTarget::read(&read)],
        "the notice nobody read stays pending, and not even updated_at moves",
    )
    .await;
    // Listed twice, the target is acknowledged as its first entry says.
    s.acknowledge(
        &w(MANAGER),
        &[AckTarget::read(&read), any(CHILD)],
        T0.plus_ms(1_000),
    )
    .await
    .unwrap();
    assert_eq!(cursor3(s, MANAGER, CHILD).await, Some((2, 3, 3)));
    // The notice the cursor shows is acknowledged, with its follow-up.
    rec(s, human(&child()), T0).await; // 4: after the notice was frozen at 3
    let shown = protocol::Notice::of(before.as_ref().unwrap());
    let follow = s
        .acknowledge(&w(MANAGER), &[AckTarget::read(&shown)], T0.plus_ms(2_000))
        .await
        .unwrap();
    assert_eq!(
        follow.iter().map(|n| n.last_seen).collect::<Vec<_>>(),
        [Sequence(3)]
    );
    assert_eq!(cursor3(s, MANAGER, CHILD).await, Some((3, 4, 4)));

    let (main, ops) = (r("global", "main"), r("global", "ops"));
    rec(s, human(&main).with_watcher(w(PEER)), T0).await;
    let read = protocol::Notice::of(&s.cursor(&w(PEER), &k("global")).await.unwrap().unwrap());
    assert_eq!(
        (read.last_seen, read.target_agent.as_str()),
        (Sequence(0), "main")
    );
    rec(s, human(&ops).with_watcher(w(PEER)), T0).await; // re-pointed, from 0
    let before = s.cursor(&w(PEER), &k("global")).await.unwrap();
    assert_eq!(
        before.as_ref().map(|c| (c.last_seen, &c.target_agent)),
        Some((Sequence(0), &ops.agent_id)),
        "the same last_seen: only the agent tells the notices apart"
    );
    acknowledges_nothing_of(
        s,
        PEER,
        "global",
        &[AckTarget::read(&read)],
        "ops's notice stays pending",
    )
    .await;
}

pub async fn refreezing_a_key_twice_in_one_call_redelivers_once(t: &Subject) {
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    rec(s, human(&child()), T0).await; // notified 2
    rec(s, human(&child()), T0).await; // material 3
    let key = CursorKey {
        watcher: w(MANAGER),
        target: k(CHILD),
    };
    let out = s
        .refreeze(&[key.clone(), key], T0.plus_ms(100))
        .await
        .unwrap();
    assert_eq!(
        out.iter().map(|n| n.last_seen).collect::<Vec<_>>(),
        [Sequence(1)],
        "one notice per cursor"
    );
    assert_eq!(cursor3(s, MANAGER, CHILD).await, Some((1, 3, 3)));
}

/// Acknowledges `targets` for the manager, later, and checks that this hands out no follow-up
/// and leaves its cursor on the child exactly as it was.
async fn acknowledges_nothing(s: &dyn AwarenessStore, targets: &[AckTarget], why: &str) {
    acknowledges_nothing_of(s, MANAGER, CHILD, targets, why).await;
}

/// `watcher`'s acknowledgement of `targets` hands out nothing and leaves its cursor on
/// `target` exactly as it was.
async fn acknowledges_nothing_of(
    s: &dyn AwarenessStore,
    watcher: &str,
    target: &str,
    targets: &[AckTarget],
    why: &str,
) {
    let before = s.cursor(&w(watcher), &k(target)).await.unwrap();
    let out = s
        .acknowledge(&w(watcher), targets, T0.plus_ms(1_000))
        .await
        .unwrap();
    assert!(out.is_empty(), "{why}: {out:?}");
    assert_eq!(
        s.cursor(&w(watcher), &k(target)).await.unwrap(),
        before,
        "{why}"
    );
}

pub async fn acknowledge_without_pending_changes_nothing(t: &Subject) {
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    acknowledges_nothing(s, &[any(CHILD)], "not even updated_at moves").await;
}

pub async fn acknowledge_ignores_unknown_targets(t: &Subject) {
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    rec(s, human(&child()), T0).await;
    let out = s
        .acknowledge(&w(MANAGER), &[any("agent:main:subagent:unknown")], T0)
        .await
        .unwrap();
    assert!(out.is_empty());
    assert_eq!(
        cursor3(s, MANAGER, CHILD).await,
        Some((1, 2, 2)),
        "an unrelated cursor is untouched"
    );
    let out = s.acknowledge(&w(PEER), &[any(CHILD)], T0).await.unwrap();
    assert!(
        out.is_empty(),
        "another watcher's ack does not touch this cursor"
    );
    assert_eq!(cursor3(s, MANAGER, CHILD).await, Some((1, 2, 2)));
}

/// An acknowledgement of no targets answers nothing at once and writes nothing: with the
/// store's writer held ([`Subject::batching`]: another process's lock, another gateway's), it
/// answers before the writer is let go, and commits no write transaction. (store-sqlite
/// opened a write transaction for it when its early return was left out, a mutation every
/// test passed: behind another process's lock it waited out the busy timeout and failed
/// `Busy`: review of stop 61.)
pub async fn an_acknowledgement_of_nothing_takes_no_lock(t: &Subject) {
    let s = &*t.store;
    let Some(b) = t.batching.as_ref() else {
        assert!(
            s.acknowledge(&w(MANAGER), &[], T0)
                .await
                .unwrap()
                .is_empty()
        );
        return;
    };
    let before = (b.write_transactions)();
    let release = (b.hold_writer)().await;
    // A hang guard, never a timing assertion: the answer needs no writer.
    let answered = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        s.acknowledge(&w(MANAGER), &[], T0),
    )
    .await;
    release.release().await;
    let answered = answered
        .expect("an acknowledgement of nothing waited for the held writer")
        .expect("an acknowledgement of nothing");
    assert!(answered.is_empty(), "{answered:?}");
    assert_eq!(
        (b.write_transactions)() - before,
        b.hold_transactions,
        "an acknowledgement of nothing committed a write transaction"
    );
}

pub async fn self_caused_events_never_notify(t: &Subject) {
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    // Another watcher of the same session: the actor's own cursor alone is spared.
    s.watch(&w(PEER), &child(), T0).await.unwrap();
    let before = s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap();
    let goal = NewEvent::new(
        child(),
        EventKind::GoalChanged,
        ActorType::Agent,
        "goal updated",
    )
    .with_actor_id(MANAGER)
    .with_watcher(w(MANAGER));
    let got = rec(s, goal, T0.plus_ms(9)).await;
    let notified: Vec<&WatcherKey> = got.notices.iter().map(|n| &n.watcher).collect();
    assert_eq!(
        notified,
        [&w(PEER)],
        "the manager caused it; the peer did not"
    );
    assert_eq!(
        s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap(),
        before,
        "a self-caused event writes nothing"
    );
    assert_eq!(
        cursor3(s, PEER, CHILD).await,
        Some((1, 2, 2)),
        "the peer's cursor is notified of it"
    );
    assert_eq!(version(s, &child()).await, 2, "it is still logged");
}

/// Each notice of `notices` as (its watcher, whether it is queue-only).
fn queue_only(notices: &[crate::Notice]) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = notices
        .iter()
        .map(|n| (n.watcher.as_str().to_owned(), n.queue_only))
        .collect();
    out.sort();
    out
}

/// A cursor row whose provenance this version does not know (a later version's, which a wider
/// CHECK lets it write) cannot be read: reading it fails as corrupt, listings leave it out and
/// [`unreadable_cursors`](crate::CursorStore::unreadable_cursors) names it with that
/// provenance; it is no watch of either kind, so a recording on its target tells its watcher
/// nothing. A store with no room for a provenance
/// ([`super::RawAccess::spoil_cursor_provenance`] answers `false`) has nothing to check but
/// the first step: a sound cursor on a bare target is no unreadable row. (What the mutation
/// did: store-postgres read the row as an explicit watch, whose notices wake the watcher;
/// review of stop 68, P638.)
pub async fn a_cursor_row_of_a_provenance_this_version_does_not_know_is_unreadable(t: &Subject) {
    let s = &*t.store;
    // A sound cursor on a target whose key names no agent (a bare key) is no unreadable row.
    // (What the mutation did: store-redb listed the rows with watcher and target swapped, and
    // the bare target failed as a watcher key; review of stop 71, RI20.)
    let bare = r("main", "main");
    s.watch(&w(PEER), &bare, T0).await.unwrap();
    assert_eq!(
        s.unreadable_cursors().await.expect("unreadable cursors"),
        Vec::new(),
        "a sound cursor on a bare key was named unreadable"
    );
    assert!(s.unwatch(&w(PEER), &bare.session_key).await.unwrap());
    s.watch(&w(MANAGER), &child(), T0).await.unwrap();
    if !t
        .raw
        .spoil_cursor_provenance(&w(MANAGER), &k(CHILD))
        .await
        .expect("spoil_cursor_provenance")
    {
        return;
    }
    let read = s.cursor(&w(MANAGER), &k(CHILD)).await;
    assert!(matches!(read, Err(StoreError::Corrupt { .. })), "{read:?}");
    let listed = s
        .cursors(&crate::CursorFilter::default())
        .await
        .expect("the listing leaves the row out");
    assert_eq!(listed, Vec::new());
    let unreadable = s.unreadable_cursors().await.expect("unreadable cursors");
    assert_eq!(unreadable.len(), 1, "{unreadable:?}");
    assert!(
        unreadable[0].reason.contains("ambient-channel"),
        "{unreadable:?}"
    );
    let got = rec(s, human(&child()), T0).await;
    assert!(got.notices.is_empty(), "no watch of either kind: {got:?}");
}

/// A cursor marked ambient (OpenClaw's ambient watch of a group's sessions, decision 0015)
/// stays ambient through every write that moves it: a recording, recordings at once (a batch,
/// on a store that batches), one naming its watcher, a re-freeze, the start-up sweep and an
/// acknowledgement; and every notice it hands out is queue-only, where another watcher's is
/// not. A re-spawn naming its watcher makes it explicit, its pending notice kept (decision
/// 0018), as a watch does. A store with no room for a provenance ([`super::RawAccess::make_ambient`]
/// answers `false`) holds no ambient cursor, and has nothing to check.
pub async fn an_ambient_cursor_stays_ambient_until_a_spawn_or_watch(t: &Subject) {
    use crate::WatchProvenance::{AmbientGroup, Explicit};
    let s = &*t.store;
    s.watch(&w(MANAGER), &child(), T0).await.unwrap();
    s.watch(&w(PEER), &child(), T0).await.unwrap();
    if !t
        .raw
        .make_ambient(&w(MANAGER), &k(CHILD))
        .await
        .expect("make_ambient")
    {
        return;
    }
    let provenance = async || {
        s.cursor(&w(MANAGER), &k(CHILD))
            .await
            .unwrap()
            .expect("the manager's cursor")
            .provenance
    };
    let both = |manager: bool| {
        let mut v = vec![(MANAGER.to_owned(), manager), (PEER.to_owned(), false)];
        v.sort();
        v
    };
    assert_eq!(provenance().await, AmbientGroup);

    let got = rec(s, human(&child()), T0).await;
    assert_eq!(queue_only(&got.notices), both(true), "a recording");
    assert_eq!(provenance().await, AmbientGroup, "after a recording");

    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = std::sync::Arc::clone(&t.store);
            tokio::spawn(async move { store.record(human(&child()), T0).await })
        })
        .collect();
    for task in tasks {
        let got = task.await.expect("join").expect("record");
        assert_eq!(queue_only(&got.notices), both(true), "recordings at once");
    }
    assert_eq!(provenance().await, AmbientGroup, "after recordings at once");

    let named = rec(s, human(&child()).with_watcher(w(MANAGER)), T0).await;
    assert_eq!(
        queue_only(&named.notices),
        both(true),
        "a recording naming it"
    );
    assert_eq!(
        provenance().await,
        AmbientGroup,
        "after a recording naming it"
    );

    let key = CursorKey {
        watcher: w(MANAGER),
        target: k(CHILD),
    };
    let again = s.refreeze(&[key], T0).await.unwrap();
    assert_eq!(
        queue_only(&again),
        [(MANAGER.to_owned(), true)],
        "a re-freeze"
    );
    assert_eq!(provenance().await, AmbientGroup, "after a re-freeze");

    let swept = s.sweep(T0, &|_| true).await.unwrap();
    assert_eq!(queue_only(&swept), both(true), "the sweep");
    assert_eq!(provenance().await, AmbientGroup, "after the sweep");

    s.acknowledge(&w(MANAGER), &[any(CHILD)], T0).await.unwrap();
    assert_eq!(provenance().await, AmbientGroup, "after an acknowledgement");

    let got = rec(s, human(&child()), T0).await;
    assert_eq!(queue_only(&got.notices), both(true), "pending again");
    let pending = s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap().unwrap();
    rec(s, spawn(&child(), MANAGER, "run-2"), T0).await;
    let spawned = s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap().unwrap();
    assert_eq!(spawned.provenance, Explicit, "a re-spawn makes it explicit");
    assert_eq!(
        (spawned.last_seen, spawned.notified, spawned.material),
        (pending.last_seen, pending.notified, pending.material),
        "its pending notice kept"
    );
    let got = rec(s, human(&child()), T0).await;
    assert_eq!(
        queue_only(&got.notices),
        both(false),
        "explicit from then on"
    );

    // Ambient again, then watched: explicit, its pending notice kept.
    assert!(
        t.raw
            .make_ambient(&w(MANAGER), &k(CHILD))
            .await
            .expect("make_ambient")
    );
    let pending = s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap().unwrap();
    assert!(pending.is_pending());
    let watched = s.watch(&w(MANAGER), &child(), T0).await.unwrap();
    assert_eq!(watched.provenance, Explicit, "a watch makes it explicit");
    assert_eq!(
        (watched.last_seen, watched.notified, watched.material),
        (pending.last_seen, pending.notified, pending.material),
        "its pending notice kept"
    );
    assert_eq!(provenance().await, Explicit, "stored explicit");
}

/// An ambient cursor goes as any other: a recording on the other agent's session of its key
/// that names its watcher re-points it there from scratch, explicit (its notice is no longer
/// queue-only); idle pruning takes it when it is idle; deleting its target takes it. Checked
/// on a store that can hold an ambient row ([`super::RawAccess::make_ambient`] answers `true`:
/// store-sqlite, whose file OpenClaw writes them into); on the others (store-memory,
/// store-redb, which hold explicit cursors only) it checks nothing.
pub async fn an_ambient_cursor_is_re_pointed_pruned_and_deleted_as_any_other(t: &Subject) {
    use crate::WatchProvenance::Explicit;
    let s = &*t.store;
    let ops = r(CHILD, "ops");
    s.watch(&w(MANAGER), &child(), T0).await.unwrap();
    s.watch(&w(PEER), &child(), T0).await.unwrap();
    let ambient = async || {
        t.raw
            .make_ambient(&w(MANAGER), &k(CHILD))
            .await
            .expect("make_ambient")
    };
    if !ambient().await {
        return;
    }
    let got = rec(s, human(&ops).with_watcher(w(MANAGER)), T0).await;
    assert_eq!(
        queue_only(&got.notices),
        [(MANAGER.to_owned(), false)],
        "the re-pointed cursor's notice is delivered as an explicit watch's"
    );
    let moved = s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap().unwrap();
    assert_eq!(
        (moved.target_agent.as_str(), moved.provenance),
        ("ops", Explicit),
        "re-pointed from scratch: explicit"
    );

    // Idle: the pruning of idle cursors takes the ambient one with the other.
    assert!(ambient().await);
    let idle = PruneStep::Cursors {
        cutoff: T0.plus_ms(DAY),
    };
    assert_eq!(
        s.prune_chunk(&idle, 100, T0.plus_ms(31 * DAY))
            .await
            .unwrap(),
        2,
        "both idle cursors, the ambient one included"
    );
    assert_eq!(all_cursors(s).await, [], "no cursor is left");

    // Deleted: the target's deletion takes the ambient cursor with the other.
    s.watch(&w(MANAGER), &child(), T0).await.unwrap();
    s.watch(&w(PEER), &child(), T0).await.unwrap();
    assert!(ambient().await);
    s.delete_session(&child()).await.unwrap();
    assert_eq!(
        all_cursors(s).await,
        [],
        "deleting the target takes both cursors"
    );
}

pub async fn log_only_kinds_move_the_head_only(t: &Subject) {
    let s = &*t.store;
    s.watch(&w(MANAGER), &child(), T0).await.unwrap();
    let before = all_cursors(s).await;
    let mut last = 0;
    for kind in [
        EventKind::RunCompleted,
        EventKind::RunFailed,
        EventKind::Compacted,
        EventKind::Adopted,
        EventKind::Created,
    ] {
        let got = rec(
            s,
            NewEvent::new(child(), kind.clone(), ActorType::System, "x").with_watcher(w(PEER)),
            T0,
        )
        .await;
        assert!(got.notices.is_empty(), "{kind} is log-only");
        last = got.event.sequence.get();
    }
    assert_eq!(version(s, &child()).await, last);
    assert_eq!(all_cursors(s).await, before, "no cursor moved or appeared");
}

pub async fn seed_starts_cursor_at_spawn_sequence(t: &Subject) {
    let s = &*t.store;
    rec(s, log_only(&r("agent:main:other", "main"), "x"), T0).await;
    let got = rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    assert!(got.notices.is_empty(), "a spawn seeds, it does not notify");
    assert_eq!(cursor3(s, MANAGER, CHILD).await, Some((2, 2, 2)));
    let c = s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap().unwrap();
    assert_eq!(c.target_agent, AgentId::new("main").unwrap());
    assert_eq!(c.updated_at, T0);
}

/// A re-spawn keeps a pending notice, and refreshes the cursor's `updated_at` once it is a day
/// old, as a repeated watch does (decision 0018): idle pruning then keeps the cursor of a
/// watcher that spawned the session 29 days after the notice came.
pub async fn seeding_keeps_a_pending_notice(t: &Subject) {
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    rec(s, human(&child()), T0).await;
    rec(s, spawn(&child(), MANAGER, "run-2"), T0.plus_ms(20)).await;
    assert_eq!(
        cursor3(s, MANAGER, CHILD).await,
        Some((1, 2, 2)),
        "a re-spawn never discards a notice"
    );
    let updated = |c: Option<crate::model::Cursor>| c.expect("the spawner's cursor").updated_at;
    assert_eq!(
        updated(s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap()),
        T0,
        "within a day the cursor is kept as it is"
    );

    let day = crate::protocol::WATCH_REFRESH_MS;
    let later = T0.plus_ms(29 * day);
    rec(s, spawn(&child(), MANAGER, "run-3"), later).await;
    assert_eq!(
        updated(s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap()),
        later,
        "a day later the re-spawn refreshes it"
    );
    s.prune(&RetentionPolicy::default(), T0.plus_ms(30 * day + 1))
        .await
        .expect("prune");
    assert_eq!(
        cursor3(s, MANAGER, CHILD).await,
        Some((1, 2, 2)),
        "the re-spawned watcher's pending notice outlives idle pruning"
    );
}

pub async fn reseeding_a_quiet_cursor_moves_it(t: &Subject) {
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    rec(s, log_only(&child(), "x"), T0).await;
    rec(s, spawn(&child(), MANAGER, "run-2"), T0.plus_ms(3)).await;
    assert_eq!(cursor3(s, MANAGER, CHILD).await, Some((3, 3, 3)));
}

pub async fn named_watcher_without_cursor_starts_at_zero(t: &Subject) {
    let s = &*t.store;
    rec(s, log_only(&child(), "x"), T0).await;
    let got = rec(s, human(&child()).with_watcher(w(MANAGER)), T0).await;
    assert_eq!(cursor3(s, MANAGER, CHILD).await, Some((0, 2, 2)));
    assert_eq!(got.notices.len(), 1);
    assert_eq!(got.notices[0].last_seen, Sequence(0));
}

/// A producer naming a watcher that already watches the event's session (the adapter names the
/// spawner on every turn of a child, decision 0010) moves that cursor from where it is: one
/// notice, from what the watcher read, never a second cursor from scratch. A backend that
/// left the named watcher's cursor out of the cursors it moves (a change of the core's
/// protocol passed every check: review, stop 58) hands out two notices, one from 0, and resets
/// the cursor.
pub async fn a_named_watcher_already_watching_is_moved_from_where_it_read(t: &Subject) {
    let s = &*t.store;
    let spawned = rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    let first = rec(s, human(&child()).with_watcher(w(MANAGER)), T0).await;
    let from: Vec<u64> = first.notices.iter().map(|n| n.last_seen.get()).collect();
    assert_eq!(from, [spawned.event.sequence.get()], "{:?}", first.notices);
    s.acknowledge(&w(MANAGER), &[AckTarget::read(&first.notices[0])], T0)
        .await
        .unwrap();
    let second = rec(s, human(&child()).with_watcher(w(MANAGER)), T0).await;
    let from: Vec<u64> = second.notices.iter().map(|n| n.last_seen.get()).collect();
    assert_eq!(
        from,
        [first.event.sequence.get()],
        "one notice, from the event read: {:?}",
        second.notices
    );
    let at = second.event.sequence.get();
    assert_eq!(
        cursor3(s, MANAGER, CHILD).await,
        Some((first.event.sequence.get(), at, at))
    );
}

/// A producer naming a watcher whose cursor points at another agent's session of the same key
/// re-points that cursor at the event's session from scratch: the watcher is told, and the
/// cursor follows (decision 0008), rather than the named watcher being skipped as one already
/// watching.
pub async fn a_named_watcher_on_another_agents_session_of_the_key_is_re_pointed(t: &Subject) {
    let s = &*t.store;
    let ops = r("global", "ops");
    let main = r("global", "main");
    s.watch(&w(PEER), &ops, T0).await.unwrap();
    rec(s, log_only(&main, "x"), T0).await;
    let got = rec(s, human(&main).with_watcher(w(PEER)), T0.plus_ms(5)).await;
    let notified: Vec<(&str, &str)> = got
        .notices
        .iter()
        .map(|n| (n.watcher.as_str(), n.target.as_str()))
        .collect();
    assert_eq!(notified, [(PEER, "global")], "the named watcher is told");
    let cursor = s
        .cursor(&w(PEER), &k("global"))
        .await
        .unwrap()
        .expect("the cursor");
    assert_eq!(cursor.target_agent, main.agent_id, "the cursor follows");
    assert_eq!(
        (cursor.last_seen, cursor.notified, cursor.material),
        (Sequence(0), Sequence(2), Sequence(2)),
        "from scratch"
    );
}

/// A producer that names one watcher twice, or names the event's own session, gets one cursor
/// and one notice for that watcher, and none for the session itself: on a notifying event and
/// on a seeding one.
pub async fn a_watcher_named_twice_or_the_session_itself_counts_once_or_not_at_all(t: &Subject) {
    let s = &*t.store;
    rec(s, log_only(&child(), "x"), T0).await;
    let got = rec(
        s,
        human(&child())
            .with_watcher(w(MANAGER))
            .with_watcher(w(CHILD))
            .with_watcher(w(MANAGER)),
        T0,
    )
    .await;
    let notified: Vec<&str> = got.notices.iter().map(|n| n.watcher.as_str()).collect();
    assert_eq!(notified, [MANAGER], "one notice, for the manager only");
    assert_eq!(cursor3(s, MANAGER, CHILD).await, Some((0, 2, 2)));
    assert_eq!(
        cursor3(s, CHILD, CHILD).await,
        None,
        "a session does not watch itself"
    );
    let kid = r("agent:main:subagent:c2", "main");
    rec(
        s,
        spawn(&kid, MANAGER, "run-9")
            .with_watcher(w("agent:main:subagent:c2"))
            .with_watcher(w(MANAGER)),
        T0,
    )
    .await;
    let watchers: Vec<String> = all_cursors(s)
        .await
        .into_iter()
        .filter(|c| c.target == kid.session_key)
        .map(|c| c.watcher.as_str().to_owned())
        .collect();
    assert_eq!(watchers, [MANAGER], "one seeded cursor, the spawner's");
}

pub async fn notify_ignores_cursor_on_other_agents_session(t: &Subject) {
    let s = &*t.store;
    let main_global = r("global", "main");
    let ops_global = r("global", "ops");
    s.watch(&w(MANAGER), &main_global, T0).await.unwrap();
    let got = rec(s, human(&ops_global), T0).await;
    assert!(
        got.notices.is_empty(),
        "the cursor watches main's global, not ops'"
    );
    assert_eq!(cursor3(s, MANAGER, "global").await, Some((0, 0, 0)));
    let got = rec(s, human(&main_global), T0).await;
    assert_eq!(got.notices.len(), 1);
    assert_eq!(cursor3(s, MANAGER, "global").await, Some((0, 2, 2)));
}

pub async fn watch_starts_at_head(t: &Subject) {
    let s = &*t.store;
    let work = r("agent:main:work", "main");
    for _ in 0..3 {
        rec(s, log_only(&work, "e"), T0).await;
    }
    let c = s.watch(&w(PEER), &work, T0.plus_ms(10)).await.unwrap();
    assert_eq!(
        (c.last_seen, c.notified, c.material),
        (Sequence(3), Sequence(3), Sequence(3))
    );
    assert_eq!(c.updated_at, T0.plus_ms(10));
    let got = rec(s, human(&work), T0).await;
    assert_eq!(got.notices.len(), 1);
    assert_eq!(
        got.notices[0].last_seen,
        Sequence(3),
        "old history never notifies"
    );
}

pub async fn watch_on_empty_target_starts_at_zero(t: &Subject) {
    let s = &*t.store;
    let c = s
        .watch(&w(PEER), &r("agent:main:fresh", "main"), T0)
        .await
        .unwrap();
    assert_eq!(
        (c.last_seen, c.notified, c.material),
        (Sequence(0), Sequence(0), Sequence(0))
    );
    assert!(
        s.cursor(&w(PEER), &k("agent:main:fresh"))
            .await
            .unwrap()
            .is_some()
    );
}

/// A session may not watch itself: the watch is refused and writes no cursor. (That a bare key
/// is never a watcher is [`WatcherKey`]'s own, checked by its unit tests: no store is handed one.)
pub async fn a_watch_of_itself_is_refused_and_writes_nothing(t: &Subject) {
    let s = &*t.store;
    let err = s.watch(&w(CHILD), &child(), T0).await.unwrap_err();
    assert!(
        matches!(err, StoreError::InvalidInput(_)),
        "self-watch: {err}"
    );
    assert!(
        all_cursors(s).await.is_empty(),
        "a refused watch writes nothing"
    );
}

pub async fn watching_again_keeps_pending_state(t: &Subject) {
    let s = &*t.store;
    let work = r("agent:main:work", "main");
    s.watch(&w(PEER), &work, T0).await.unwrap();
    rec(s, human(&work), T0).await;
    let again = s.watch(&w(PEER), &work, T0.plus_ms(20)).await.unwrap();
    assert_eq!(
        (again.last_seen, again.notified, again.material),
        (Sequence(0), Sequence(1), Sequence(1))
    );
    assert_eq!(again.updated_at, T0, "the existing cursor is kept as it is");
    assert_eq!(cursor3(s, PEER, "agent:main:work").await, Some((0, 1, 1)));

    // A day later the same watch refreshes `updated_at` (and nothing else), so idle pruning
    // (30 days without an update) keeps a watch confirmed 29 days after it began.
    let day = crate::protocol::WATCH_REFRESH_MS;
    let later = T0.plus_ms(29 * day);
    let confirmed = s.watch(&w(PEER), &work, later).await.unwrap();
    assert_eq!(confirmed.updated_at, later);
    assert_eq!(
        (confirmed.last_seen, confirmed.notified, confirmed.material),
        (Sequence(0), Sequence(1), Sequence(1))
    );
    s.prune(&RetentionPolicy::default(), T0.plus_ms(30 * day + 1))
        .await
        .expect("prune");
    assert_eq!(
        cursor3(s, PEER, "agent:main:work").await,
        Some((0, 1, 1)),
        "the confirmed watch outlives idle pruning"
    );
}

/// A spawn seeds its spawner's cursor on the child even when the spawner's cursor on that key
/// holds a pending notice of another agent's session of the same key: that cursor is re-pointed
/// to the child (decision 0008), whose changes then notify the spawner.
pub async fn a_spawn_moves_a_pending_cursor_on_another_agents_session_of_the_key(t: &Subject) {
    let s = &*t.store;
    let (ops, main) = (r("global", "ops"), r("global", "main"));
    s.watch(&w(MANAGER), &ops, T0).await.unwrap();
    rec(s, human(&ops), T0).await;
    assert_eq!(
        cursor3(s, MANAGER, "global").await,
        Some((0, 1, 1)),
        "pending"
    );
    let seeded = rec(s, spawn(&main, MANAGER, "run-g"), T0)
        .await
        .event
        .sequence;
    let cursor = s
        .cursor(&w(MANAGER), &k("global"))
        .await
        .unwrap()
        .expect("the spawner's cursor");
    assert_eq!(
        cursor.target_agent, main.agent_id,
        "re-pointed to the child"
    );
    assert_eq!(
        (cursor.last_seen, cursor.notified, cursor.material),
        (seeded, seeded, seeded)
    );
    let told = rec(s, human(&main), T0).await;
    assert_eq!(
        told.notices
            .iter()
            .map(|n| n.watcher.as_str())
            .collect::<Vec<_>>(),
        [MANAGER],
        "the spawner is told of its child's change"
    );
}

/// A cursor is keyed by watcher and target key; watching another agent's session of the same
/// key moves the cursor there, starting at that session's head, and its changes notify.
pub async fn watching_another_agents_session_of_the_same_key_moves_the_cursor(t: &Subject) {
    let s = &*t.store;
    let ops = r("global", "ops");
    let main = r("global", "main");
    rec(s, human(&main), T0).await;
    s.watch(&w(PEER), &ops, T0).await.unwrap();
    rec(s, human(&ops), T0).await;
    let moved = s.watch(&w(PEER), &main, T0.plus_ms(5)).await.unwrap();
    assert_eq!(
        moved.target_agent, main.agent_id,
        "the cursor follows the watch"
    );
    assert_eq!(
        (moved.last_seen, moved.notified, moved.material),
        (Sequence(1), Sequence(1), Sequence(1)),
        "it starts at main's head, not at ops' pending state"
    );
    assert_eq!(
        s.cursor(&w(PEER), &k("global")).await.unwrap(),
        Some(moved.clone())
    );
    let got = rec(s, human(&main), T0.plus_ms(10)).await;
    assert_eq!(got.notices.len(), 1, "main's change notifies the watcher");
    assert_eq!(got.notices[0].last_seen, Sequence(1));
    let again = s.watch(&w(PEER), &main, T0.plus_ms(20)).await.unwrap();
    assert_eq!(
        (again.last_seen, again.notified, again.material),
        (Sequence(1), Sequence(3), Sequence(3)),
        "watching the same ref again keeps its pending state"
    );
}

pub async fn unwatch_removes_cursor_and_stops_notices(t: &Subject) {
    let s = &*t.store;
    s.watch(&w(PEER), &child(), T0).await.unwrap();
    assert!(s.unwatch(&w(PEER), &k(CHILD)).await.unwrap());
    assert!(
        !s.unwatch(&w(PEER), &k(CHILD)).await.unwrap(),
        "a second unwatch finds nothing"
    );
    let got = rec(s, human(&child()), T0).await;
    assert!(got.notices.is_empty());
    assert!(all_cursors(s).await.is_empty());
}

pub async fn reset_removes_own_watches_and_keeps_history(t: &Subject) {
    let s = &*t.store;
    let c2 = r("agent:main:subagent:c2", "main");
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    rec(s, spawn(&c2, MANAGER, "run-2"), T0).await;
    s.watch(&w(PEER), &child(), T0).await.unwrap();
    s.watch(&w(CHILD), &r(MANAGER, "main"), T0).await.unwrap();
    let removed = s.reset_watcher(&k(MANAGER)).await.unwrap();
    assert_eq!(removed, 2);
    let left: Vec<_> = all_cursors(s)
        .await
        .into_iter()
        .map(|c| (c.watcher.as_str().to_owned(), c.target.as_str().to_owned()))
        .collect();
    assert_eq!(
        left,
        vec![
            (CHILD.to_owned(), MANAGER.to_owned()),
            (PEER.to_owned(), CHILD.to_owned())
        ]
    );
    assert_eq!(version(s, &child()).await, 1);
    assert_eq!(version(s, &c2).await, 2);
    let got = rec(s, human(&child()).with_watcher(w(MANAGER)), T0).await;
    assert_eq!(got.event.sequence, Sequence(3));
    assert_eq!(
        cursor3(s, MANAGER, CHILD).await,
        Some((0, 3, 3)),
        "re-created from scratch"
    );
}

pub async fn delete_removes_ref_and_leaves_other_agent_alone(t: &Subject) {
    let s = &*t.store;
    let main_global = r("global", "main");
    let ops_global = r("global", "ops");
    rec(s, log_only(&main_global, "m"), T0).await;
    rec(s, log_only(&ops_global, "o"), T0).await;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    s.watch(&w(MANAGER), &main_global, T0).await.unwrap();
    s.watch(&w("agent:ops:x"), &ops_global, T0).await.unwrap();
    s.watch(&w(CHILD), &r(PEER, "ops"), T0).await.unwrap();
    s.delete_session(&main_global).await.unwrap();
    assert_eq!(version(s, &main_global).await, 0);
    assert!(seqs(s, &main_global, 0).await.is_empty());
    assert_eq!(seqs(s, &ops_global, 0).await, vec![2]);
    assert_eq!(version(s, &ops_global).await, 2);
    assert!(
        s.cursor(&w(MANAGER), &k("global")).await.unwrap().is_none(),
        "cursor on the deleted target"
    );
    assert!(
        s.cursor(&w("agent:ops:x"), &k("global"))
            .await
            .unwrap()
            .is_some(),
        "ops' global is another session"
    );
    // A ref that names the watcher's key under another agent is another session: deleting it
    // leaves the watcher's cursors.
    s.delete_session(&r(CHILD, "ops")).await.unwrap();
    assert!(
        s.cursor(&w(CHILD), &k(PEER)).await.unwrap().is_some(),
        "the watcher's key under another agent is not the watcher"
    );
    s.delete_session(&child()).await.unwrap();
    assert!(
        s.cursor(&w(CHILD), &k(PEER)).await.unwrap().is_none(),
        "cursors where it is the watcher go too"
    );
    assert!(s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap().is_none());
    assert_eq!(all_cursors(s).await.len(), 1);
}

pub async fn sweep_refreezes_and_redelivers(t: &Subject) {
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    rec(s, human(&child()), T0).await; // notified 2
    rec(s, human(&child()), T0).await; // material 3
    s.watch(&w(PEER), &child(), T0).await.unwrap(); // quiet at 3
    let notices = s.sweep(T0.plus_ms(100), &|_| true).await.unwrap();
    assert_eq!(notices.len(), 1, "only the pending cursor is re-delivered");
    assert_eq!(notices[0].watcher, w(MANAGER));
    assert_eq!(notices[0].last_seen, Sequence(1));
    let c = s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap().unwrap();
    assert_eq!(
        (c.last_seen, c.notified, c.material),
        (Sequence(1), Sequence(3), Sequence(3))
    );
    assert_eq!(c.updated_at, T0.plus_ms(100));
    // Another start-up re-delivers the same notice and leaves the frozen cursor as it was,
    // its time included (a cursor's time is what its idle expiry counts from).
    let again = s.sweep(T0.plus_ms(200), &|_| true).await.unwrap();
    assert_eq!(again, notices, "the same notice again");
    assert_eq!(
        s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap().unwrap(),
        c,
        "a frozen cursor is left as it was"
    );
    let follow = s.acknowledge(&w(MANAGER), &[any(CHILD)], T0).await.unwrap();
    assert!(
        follow.is_empty(),
        "after a sweep the ack covers everything up to material"
    );
    assert_eq!(cursor3(s, MANAGER, CHILD).await, Some((3, 3, 3)));
}

pub async fn sweep_skips_watchers_that_no_longer_exist(t: &Subject) {
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    rec(s, human(&child()), T0).await;
    rec(s, human(&child()), T0).await;
    let before = all_cursors(s).await;
    let notices = s
        .sweep(T0.plus_ms(100), &|wk: &WatcherKey| wk.as_str() != MANAGER)
        .await
        .unwrap();
    assert!(notices.is_empty());
    assert_eq!(all_cursors(s).await, before);
}

pub async fn refreeze_of_quiet_cursor_is_noop(t: &Subject) {
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    let before = all_cursors(s).await;
    let key = CursorKey {
        watcher: w(MANAGER),
        target: k(CHILD),
    };
    let missing = CursorKey {
        watcher: w(PEER),
        target: k(CHILD),
    };
    let out = s.refreeze(&[key, missing], T0.plus_ms(5)).await.unwrap();
    assert!(out.is_empty());
    assert_eq!(all_cursors(s).await, before);
}

pub async fn prune_by_age_stamps_the_watermark_of_what_it_deletes(t: &Subject) {
    let s = &*t.store;
    let other = r("agent:main:other", "main");
    rec(s, log_only(&child(), "old"), T0).await; // 1
    rec(s, log_only(&other, "old"), T0).await; // 2
    rec(s, log_only(&child(), "old"), T0.plus_ms(DAY)).await; // 3
    let later = T0.plus_ms(30 * DAY + DAY / 2);
    let report = s.prune(&RetentionPolicy::default(), later).await.unwrap();
    assert_eq!(report.events_by_age, 2, "only events older than 30 days go");
    assert_eq!(seqs(s, &child(), 0).await, vec![3]);
    let heads = s.heads(&[child(), other.clone()]).await.unwrap();
    assert_eq!(heads.len(), 2, "both heads stay: {heads:?}");
    for h in heads {
        let want = if h.session == child() { (3, 1) } else { (2, 2) };
        assert_eq!(
            (h.last_sequence.get(), h.pruned_max_sequence.get()),
            want,
            "{}",
            h.session
        );
    }
}

pub async fn prune_row_cap_keeps_newest_rows(t: &Subject) {
    let s = &*t.store;
    for i in 0..30 {
        let target = if i % 3 == 0 {
            r("agent:main:a", "main")
        } else {
            child()
        };
        rec(s, log_only(&target, "x"), T0).await;
    }
    let policy = RetentionPolicy {
        max_rows: 10,
        chunk_rows: 7,
        ..RetentionPolicy::default()
    };
    let report = s.prune(&policy, T0).await.unwrap();
    assert_eq!(report.events_by_cap, 20);
    assert_eq!(report.events_by_age, 0);
    let stats = s.log_stats().await.unwrap();
    assert_eq!(
        (
            stats.rows,
            stats.min_sequence.get(),
            stats.max_sequence.get()
        ),
        (10, 21, 30)
    );
    let h = s.heads(&[child()]).await.unwrap().remove(0);
    assert_eq!(h.pruned_max_sequence, Sequence(20));
    assert_eq!(h.last_sequence, Sequence(30));
    let a = s
        .heads(&[r("agent:main:a", "main")])
        .await
        .unwrap()
        .remove(0);
    assert_eq!(a.pruned_max_sequence, Sequence(19));
    assert_eq!(a.last_sequence, Sequence(28));
}

/// Cursors not updated for `cursor_idle_ms` go, pending or not (decision 0022); a cursor a
/// material event touched since stays.
pub async fn prune_expires_idle_cursors(t: &Subject) {
    let s = &*t.store;
    let c2 = r("agent:main:subagent:c2", "main");
    let c3 = r("agent:main:subagent:c3", "main");
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    rec(s, spawn(&c2, MANAGER, "run-2"), T0).await;
    rec(s, spawn(&c3, MANAGER, "run-3"), T0).await;
    rec(s, human(&c3), T0.plus_ms(1)).await; // a notice the manager never reads
    rec(s, human(&c2), T0.plus_ms(10 * DAY)).await; // touches the c2 cursor
    let pending = s.cursor(&w(MANAGER), &c3.session_key).await.unwrap();
    assert!(
        pending.as_ref().is_some_and(crate::Cursor::is_pending),
        "{pending:?}"
    );
    let report = s
        .prune(&RetentionPolicy::default(), T0.plus_ms(31 * DAY))
        .await
        .unwrap();
    assert_eq!(report.cursors, 2);
    assert!(s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap().is_none());
    assert!(
        s.cursor(&w(MANAGER), &c3.session_key)
            .await
            .unwrap()
            .is_none(),
        "idle, if pending"
    );
    assert!(
        s.cursor(&w(MANAGER), &k("agent:main:subagent:c2"))
            .await
            .unwrap()
            .is_some()
    );
}

/// The idle cutoff is exclusive: a cursor last updated exactly at `now - cursor_idle_ms` stays,
/// one a millisecond older goes (as OpenClaw's `updated_at < cutoff`), and a pruning chunk does
/// not choose the cursors at the cutoff either. One store's `<=` passed every other check.
pub async fn prune_keeps_a_cursor_updated_exactly_at_the_idle_cutoff(t: &Subject) {
    let s = &*t.store;
    let older = r("agent:main:subagent:older", "main");
    let at_cutoff = r("agent:main:subagent:at-cutoff", "main");
    s.watch(&w(MANAGER), &older, T0).await.unwrap();
    s.watch(&w(MANAGER), &at_cutoff, T0.plus_ms(1))
        .await
        .unwrap();
    let policy = RetentionPolicy::default();
    let now = T0.plus_ms(policy.cursor_idle_ms + 1);
    assert_eq!(policy.idle_cutoff(now), T0.plus_ms(1));
    let report = s.prune(&policy, now).await.unwrap();
    assert_eq!(report.cursors, 1);
    assert!(
        s.cursor(&w(MANAGER), &older.session_key)
            .await
            .unwrap()
            .is_none(),
        "a millisecond before the cutoff"
    );
    assert!(
        s.cursor(&w(MANAGER), &at_cutoff.session_key)
            .await
            .unwrap()
            .is_some(),
        "exactly at the cutoff"
    );
    // A chunk chooses as its write deletes: cursors exactly at the cutoff, which sort before the
    // idle one here, are not chosen, so a chunk of one row still reaches the idle cursor past
    // them. (What the mutation did: store-sqlite choosing `updated_at <= cutoff`, its chunk
    // chose them, deleted none and ended, the idle cursor left: review of stop 63, Q28.)
    let cutoff = policy.idle_cutoff(now);
    for key in ["a1", "a2", "a3"] {
        let at = r(&format!("agent:main:subagent:{key}"), "main");
        s.watch(&w(MANAGER), &at, cutoff).await.unwrap();
    }
    let idle = r("agent:main:subagent:b-idle", "main");
    s.watch(&w(MANAGER), &idle, cutoff.minus_ms(1))
        .await
        .unwrap();
    assert_eq!(
        s.prune_chunk(&PruneStep::Cursors { cutoff }, 1, now)
            .await
            .unwrap(),
        1,
        "the idle cursor past those at the cutoff"
    );
    assert!(
        s.cursor(&w(MANAGER), &idle.session_key)
            .await
            .unwrap()
            .is_none(),
        "the idle cursor goes"
    );
    for key in ["a1", "a2", "a3", "at-cutoff"] {
        let at = SessionKey::new(format!("agent:main:subagent:{key}")).unwrap();
        assert!(
            s.cursor(&w(MANAGER), &at).await.unwrap().is_some(),
            "{key} stays"
        );
    }
}

pub async fn an_invalid_retention_policy_is_refused_and_nothing_deleted(t: &Subject) {
    // A limit of zero or less puts the cutoff at now or later: every event and every cursor
    // (with its pending notice) would go.
    let s = &*t.store;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    rec(s, human(&child()), T0.plus_ms(1)).await;
    let now = T0.plus_ms(2);
    let bad = [
        (
            "maxAgeMs",
            RetentionPolicy {
                max_age_ms: 0,
                ..RetentionPolicy::default()
            },
        ),
        (
            "maxAgeMs",
            RetentionPolicy {
                max_age_ms: -DAY,
                ..RetentionPolicy::default()
            },
        ),
        (
            "cursorIdleMs",
            RetentionPolicy {
                cursor_idle_ms: 0,
                ..RetentionPolicy::default()
            },
        ),
        (
            "maxRows",
            RetentionPolicy {
                max_rows: 0,
                ..RetentionPolicy::default()
            },
        ),
        (
            "chunkRows",
            RetentionPolicy {
                chunk_rows: 0,
                ..RetentionPolicy::default()
            },
        ),
    ];
    for (field, policy) in bad {
        let got = s.prune(&policy, now).await;
        assert!(
            matches!(
                &got,
                Err(StoreError::InvalidInput(validate::ValidationError::RetentionPolicy { field: f, .. })) if *f == field
            ),
            "{field}: {got:?}"
        );
    }
    assert_eq!(count(s).await, 2, "a refused policy deletes no event");
    let cursor = s.cursor(&w(MANAGER), &k(CHILD)).await.unwrap();
    assert!(
        cursor.is_some_and(|c| c.is_pending()),
        "a refused policy deletes no cursor"
    );
}

/// A head whose watermark a pruning chunk raises gets the chunk's time as `updated_at`, as
/// OpenClaw's heads do (its fixture's `agent:main:subagent:old` shows the time of the pruning,
/// not of its event); a head the chunk leaves alone keeps its time, the pruned head's key
/// under another agent's among them. (What the mutation did: store-postgres stamped the heads
/// by their keys alone, so that the other agent's head showed a loss it never had; review of
/// stop 72, PQ23.)
pub async fn pruning_stamps_the_heads_it_raises_with_its_time(t: &Subject) {
    let s = &*t.store;
    let old = r("agent:main:subagent:old", "main");
    let (kept, twin) = (child(), r("agent:main:subagent:old", "ops"));
    let first = rec(s, log_only(&old, "old news"), T0).await.event.sequence;
    for fresh in [&kept, &twin] {
        rec(s, log_only(fresh, "fresh"), T0.plus_ms(2 * DAY)).await;
    }
    let at = T0.plus_ms(31 * DAY);
    let age = PruneStep::Age {
        cutoff: T0.plus_ms(DAY),
    };
    assert_eq!(s.prune_chunk(&age, 100, at).await.unwrap(), 1);
    let heads = s
        .heads(&[old.clone(), kept.clone(), twin.clone()])
        .await
        .unwrap();
    let head = |r: &SessionRef| {
        heads
            .iter()
            .find(|h| h.session == *r)
            .cloned()
            .expect("the head stays")
    };
    let h = head(&old);
    assert_eq!(
        (h.last_sequence, h.pruned_max_sequence, h.updated_at),
        (first, first, at),
        "the pruned head: its watermark raised at the pruning's time"
    );
    for left in [&kept, &twin] {
        let h = head(left);
        assert_eq!(
            (h.pruned_max_sequence, h.updated_at),
            (Sequence::ZERO, T0.plus_ms(2 * DAY)),
            "the head the chunk left alone: {left}"
        );
    }
}

/// A chunk that deletes events below the watermark an earlier chunk left (the age step takes
/// an event told late, with a higher sequence, before a lower one; decision 0011) keeps the
/// watermark: it is only ever raised (`max(current, highest pruned)`, DESIGN.md section 6), and
/// the head's time moves only when it rises. A chunk that wrote its own highest sequence over
/// it would make a page after the late event's sequence look whole.
pub async fn a_prune_below_the_watermark_keeps_it(t: &Subject) {
    let s = &*t.store;
    let now = T0.plus_ms(DAY / 2);
    let first = rec(s, log_only(&child(), "recent"), now)
        .await
        .event
        .sequence;
    // Recorded after the first but said to have happened twelve hours before it.
    let late = rec(s, log_only(&child(), "told late").with_occurred_at(T0), now)
        .await
        .event
        .sequence;
    assert!(late > first);
    let at = T0.plus_ms(31 * DAY);
    let older = PruneStep::Age {
        cutoff: T0.plus_ms(DAY / 4),
    };
    assert_eq!(s.prune_chunk(&older, 100, at).await.unwrap(), 1);
    let expected = (late, late, at);
    let head = |h: Vec<crate::Head>| {
        let h = h.into_iter().next().expect("the head stays");
        (h.last_sequence, h.pruned_max_sequence, h.updated_at)
    };
    assert_eq!(
        head(s.heads(&[child()]).await.unwrap()),
        expected,
        "the later sequence, told late, went first: the watermark is at it"
    );
    let all = PruneStep::Age {
        cutoff: T0.plus_ms(DAY),
    };
    assert_eq!(
        s.prune_chunk(&all, 100, at.plus_ms(1_000)).await.unwrap(),
        1
    );
    assert_eq!(
        head(s.heads(&[child()]).await.unwrap()),
        expected,
        "deleting the lower sequence left the watermark and the head's time as they were"
    );
    let page = s.changes_since(&child(), first, 10).await.unwrap();
    assert!(
        page.history_gap && page.events.is_empty(),
        "a page after the first event misses the late one: {page:?}"
    );
    assert_eq!(page.earliest_available_sequence, late.next());
}

/// A pruning chunk of more rows than `bound`, by the row cap and then by age, commits them in
/// exactly as many transactions as `bound` rows each make (`transactions` reads the store's
/// count of write transactions: `write_transactions` of store-sqlite and store-redb), so that
/// a recording waits behind one transaction, not the whole chunk. Called with the bound the
/// store's docs state, not the constant it keeps it in, so that a larger constant fails it.
pub async fn a_pruning_chunk_commits_at_most_its_bound_at_a_time(
    s: &dyn AwarenessStore,
    bound: usize,
    transactions: impl Fn() -> u64,
) {
    let rows = bound + 1;
    for i in 0..2 * rows {
        rec(s, log_only(&child(), &format!("e{i}")), T0).await;
    }
    let later = T0.plus_ms(1);
    for step in [
        PruneStep::RowCap {
            max_rows: rows as u64,
        },
        PruneStep::Age { cutoff: later },
    ] {
        let before = transactions();
        let deleted = s.prune_chunk(&step, 10 * rows, later).await.unwrap();
        assert_eq!(deleted, rows as u64, "{step:?}");
        assert_eq!(
            transactions() - before,
            rows.div_ceil(bound) as u64,
            "{step:?}: {rows} rows in transactions of at most {bound}"
        );
    }
}

pub async fn prune_runs_in_bounded_chunks(t: &Subject) {
    let s = &*t.store;
    for _ in 0..25 {
        rec(s, log_only(&child(), "x"), T0).await;
    }
    let step = PruneStep::Age {
        cutoff: T0.plus_ms(1),
    };
    assert_eq!(
        s.prune_chunk(&step, 10, T0.plus_ms(1)).await.unwrap(),
        10,
        "a chunk deletes at most its bound"
    );
    assert_eq!(count(s).await, 15);
    let h = s.heads(&[child()]).await.unwrap().remove(0);
    assert_eq!(
        h.pruned_max_sequence,
        Sequence(10),
        "each chunk stamps what it deletes, oldest first"
    );
    let policy = RetentionPolicy {
        chunk_rows: 4,
        ..RetentionPolicy::default()
    };
    let report = s.prune(&policy, T0.plus_ms(31 * DAY)).await.unwrap();
    assert_eq!(report.events_by_age, 15);
    assert_eq!(
        report.chunks,
        4 + 1 + 1,
        "15 rows in chunks of 4 (4, 4, 4, 3), then one chunk each for the cap and the cursors: {report:?}"
    );
    assert_eq!(count(s).await, 0);
}

/// A chunk deletes its whole bound when that many rows are due, however the store splits it
/// (store-sqlite commits 250 rows at a time; store-memory lets its lock go every 256 rows
/// deleted and every 1,024 looked at), and stamps each head with what it deleted. The rows
/// due start at the 1,025th, just past store-memory's first look, and come after rows that
/// are not.
/// `blocks` blocks of 64 cursors, each block named as watchers by one human turn on a session
/// of its own (so that none moves another's cursors) at `at(block)`: the watchers are
/// `agent:main:<prefix><n>`, numbered in key order across the blocks.
async fn cursors_named_in_blocks(
    s: &dyn AwarenessStore,
    prefix: &str,
    blocks: usize,
    at: impl Fn(usize) -> Timestamp,
) {
    for block in 0..blocks {
        let mut e = human(&r(
            &format!("agent:main:subagent:{prefix}{block:03}"),
            "main",
        ));
        for i in block * 64..(block + 1) * 64 {
            e = e.with_watcher(w(&format!("agent:main:{prefix}{i:05}")));
        }
        rec(s, e, at(block)).await;
    }
}

pub async fn a_chunk_deletes_its_whole_bound_however_it_is_split(t: &Subject) {
    let s = &*t.store;
    let now = T0.plus_ms(DAY);
    let other = r("agent:main:other", "main");
    // Old (their occurredAt a day back from the recording): 1025 and 1101..=1700; the rest new.
    let old = |seq: u64| seq == 1_025 || seq > 1_100;
    for seq in 1..=1_700u64 {
        let session = if seq % 2 == 1 { child() } else { other.clone() };
        let e = log_only(&session, "e");
        let e = if old(seq) { e.with_occurred_at(T0) } else { e };
        rec(s, e, now).await;
    }
    let age = PruneStep::Age {
        cutoff: T0.plus_ms(1),
    };
    assert_eq!(
        s.prune_chunk(&age, 500, now).await.unwrap(),
        500,
        "the first 500 old rows: 1025, then 1101..=1599"
    );
    let watermarks = |heads: Vec<crate::Head>| {
        let mut w: Vec<(String, u64)> = heads
            .into_iter()
            .map(|h| {
                (
                    h.session.session_key.to_string(),
                    h.pruned_max_sequence.get(),
                )
            })
            .collect();
        w.sort();
        w
    };
    let pair = [child(), other.clone()];
    assert_eq!(
        watermarks(s.heads(&pair).await.unwrap()),
        vec![
            ("agent:main:other".to_string(), 1_598),
            (CHILD.to_string(), 1_599)
        ],
        "each head stamped with the highest of its events the chunk deleted"
    );
    assert_eq!(s.prune_chunk(&age, 500, now).await.unwrap(), 101);
    assert_eq!(count(s).await, 1_099);
    let cap = PruneStep::RowCap { max_rows: 100 };
    assert_eq!(s.prune_chunk(&cap, 600, now).await.unwrap(), 600);
    assert_eq!(s.prune_chunk(&cap, 600, now).await.unwrap(), 399);
    assert_eq!(count(s).await, 100);
    assert_eq!(
        seqs(s, &child(), 0).await,
        (1_001..1_025)
            .chain(1_026..=1_100)
            .filter(|seq| seq % 2 == 1)
            .collect::<Vec<u64>>(),
        "the cap deletes the lowest sequences"
    );
    // 1,152 cursors: the first 1,024 in key order are not idle, the 128 after them are.
    let fresh = T0.plus_ms(2 * DAY);
    cursors_named_in_blocks(s, "w", 18, |block| if block < 16 { fresh } else { T0 }).await;
    let idle = PruneStep::Cursors {
        cutoff: T0.plus_ms(1),
    };
    assert_eq!(s.prune_chunk(&idle, 100, now).await.unwrap(), 100);
    assert_eq!(s.prune_chunk(&idle, 100, now).await.unwrap(), 28);
    assert_eq!(all_cursors(s).await.len(), 1_024);
    // One chunk over 2,176 idle cursors, in blocks of 64 between blocks that are not idle: more
    // than one transaction of every durable store, each going on from where the last stopped.
    cursors_named_in_blocks(s, "x", 68, |block| if block % 2 == 0 { fresh } else { T0 }).await;
    assert_eq!(s.prune_chunk(&idle, 2_500, now).await.unwrap(), 2_176);
    let left = all_cursors(s).await;
    assert_eq!(left.len(), 1_024 + 2_176);
    assert!(
        left.iter().all(|c| c.updated_at > T0),
        "every idle cursor went, no other"
    );
}

pub async fn invalid_summary_is_rejected_and_nothing_written(t: &Subject) {
    let s = &*t.store;
    s.watch(&w(MANAGER), &child(), T0).await.unwrap();
    for bad in ["two\nlines", "", "   ", "tab\there"] {
        let mut e = human(&child());
        e.summary = bad.into();
        let err = s.record(e, T0).await.unwrap_err();
        assert!(matches!(err, StoreError::InvalidInput(_)), "{bad:?}: {err}");
    }
    let mut long = human(&child());
    long.summary = "x".repeat(201);
    assert!(matches!(
        s.record(long, T0).await,
        Err(StoreError::InvalidInput(_))
    ));
    assert_eq!(count(s).await, 0);
    assert_eq!(version(s, &child()).await, 0);
    assert_eq!(cursor3(s, MANAGER, CHILD).await, Some((0, 0, 0)));
    let ok = rec(s, human(&child()), T0).await;
    assert_eq!(
        ok.event.sequence,
        Sequence(1),
        "a refused input spends no sequence"
    );
}

pub async fn invalid_payload_is_rejected_and_nothing_written(t: &Subject) {
    let s = &*t.store;
    let big = validate::payload_from_value(json!({"x": "a"})).unwrap();
    let mut huge = big.clone();
    huge.insert("x".into(), json!("a".repeat(5000)));
    let err = s
        .record(human(&child()).with_payload(huge), T0)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::InvalidInput(validate::ValidationError::PayloadTooLarge { .. })
    ));
    assert_eq!(count(s).await, 0);
    assert!(s.list_heads(None).await.unwrap().is_empty());
}

pub async fn invalid_ids_are_rejected_and_nothing_written(t: &Subject) {
    let s = &*t.store;
    for e in [
        human(&child()).with_dedupe_key(""),
        human(&child()).with_actor_id("bad\u{1}id"),
        human(&child()).with_run_id(""),
        human(&child()).with_session_id(""),
        human(&child()).with_session_id("bad\u{1}id"),
        // A kind this version does not know is only ever read, never recorded.
        NewEvent::new(
            child(),
            EventKind::from_stored("session_reset"),
            ActorType::System,
            "x",
        ),
    ] {
        assert!(matches!(
            s.record(e, T0).await,
            Err(StoreError::InvalidInput(_))
        ));
    }
    assert_eq!(count(s).await, 0);

    // One watcher more than the limit is refused, and writes no cursor; a watcher named twice
    // counts once, so the limit itself, named twice over, records.
    let named = |n: usize, times: usize| {
        (0..n * times).fold(human(&child()), |e, i| {
            e.with_watcher(w(&format!("agent:main:subagent:w{}", i % n)))
        })
    };
    let max = crate::validate::MAX_NAMED_WATCHERS;
    assert!(matches!(
        s.record(named(max + 1, 1), T0).await,
        Err(StoreError::InvalidInput(validate::ValidationError::TooManyWatchers { count, .. }))
            if count == max + 1
    ));
    assert_eq!(count(s).await, 0);
    assert!(all_cursors(s).await.is_empty());
    rec(s, named(max, 2), T0).await;
    assert_eq!(
        all_cursors(s).await.len(),
        max,
        "one cursor per watcher named"
    );
}

/// `len` ASCII letters no compression shortens much (a fixed pseudo-random sequence).
pub fn incompressible(len: usize) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + u8::try_from(x % 26).unwrap_or(0))
        })
        .collect()
}

/// Inputs at the limits record and read back exactly, on every store: a session key, an agent
/// id and a watcher key of 1 KiB, a dedupe key of 4 KiB, a payload of 4 KiB and a summary of
/// 200 characters of two bytes each; through a page, the log, a dedupe hit, the cursor and the
/// notice.
pub async fn inputs_at_the_limits_read_back_exactly(t: &Subject) {
    use crate::validate::{MAX_DEDUPE_KEY_BYTES, MAX_KEY_BYTES, MAX_PAYLOAD_BYTES};
    let s = &*t.store;
    let pad = |prefix: &str, c: char| {
        format!(
            "{prefix}{}",
            c.to_string().repeat(MAX_KEY_BYTES - prefix.len())
        )
    };
    let long_key = r(&pad("agent:main:subagent:", 'k'), "main");
    let long_agent = r("global", &pad("", 'a'));
    let watcher = w(&pad("agent:main:", 'w'));
    assert_eq!(long_key.session_key.as_str().len(), MAX_KEY_BYTES);
    assert_eq!(long_agent.agent_id.as_str().len(), MAX_KEY_BYTES);
    assert_eq!(watcher.as_str().len(), MAX_KEY_BYTES);
    // `{"p":"..."}`: 8 bytes around the text.
    let payload = crate::validate::payload_from_value(json!({
        "p": "x".repeat(MAX_PAYLOAD_BYTES - 8)
    }))
    .expect("a payload object");
    assert_eq!(
        crate::validate::payload_json(&payload).len(),
        MAX_PAYLOAD_BYTES
    );
    let summary = "\u{e9}".repeat(crate::validate::MAX_SUMMARY_CHARS);
    // Not one letter repeated: a store that compresses it (PostgreSQL's B-tree entries, capped
    // at 2,704 bytes, took `d` 4,096 times and refused a key of random text half as long).
    let dedupe = incompressible(MAX_DEDUPE_KEY_BYTES);

    s.watch(&watcher, &long_key, T0).await.expect("watch");
    let mut e = human(&long_key)
        .with_payload(payload)
        .with_dedupe_key(&dedupe);
    e.summary.clone_from(&summary);
    let got = rec(s, e.clone(), T0).await;
    assert_eq!(got.event.summary, summary);
    assert_eq!(got.event.dedupe_key.as_deref(), Some(dedupe.as_str()));
    assert_eq!(got.notices.len(), 1, "the long watcher is told");
    assert_eq!(&got.notices[0].watcher, &watcher);
    let page = s
        .changes_since(&long_key, Sequence::ZERO, 200)
        .await
        .expect("page");
    assert_eq!(page.events, std::slice::from_ref(&got.event), "the page");
    let log = s.events_after(Sequence::ZERO, 10).await.expect("log");
    assert_eq!(log, std::slice::from_ref(&got.event), "the log");
    let hit = rec(s, e, T0).await;
    assert!(hit.deduplicated);
    assert_eq!(hit.event, got.event, "the dedupe hit");
    let cursor = s
        .cursor(&watcher, &long_key.session_key)
        .await
        .expect("cursor")
        .expect("the long watcher's cursor");
    assert_eq!(cursor.material, got.event.sequence);

    assert_eq!(
        (cursor.watcher.as_str(), cursor.target.as_str()),
        (watcher.as_str(), long_key.session_key.as_str())
    );
    let listed = s
        .cursors(&CursorFilter {
            watcher: Some(watcher.session_key().clone()),
            pending_only: true,
            ..CursorFilter::default()
        })
        .await
        .expect("cursors");
    assert_eq!(listed, [cursor], "listed as read");
    assert_eq!(
        crate::Notice::of(&listed[0]),
        got.notices[0],
        "the notice the stored cursor gives is the one handed out"
    );

    // The long agent, as a ref's and as a cursor's target agent.
    s.watch(&watcher, &long_agent, T0).await.expect("watch");
    let on_long_agent = rec(s, human(&long_agent), T0).await;
    let cursor = s
        .cursor(&watcher, &long_agent.session_key)
        .await
        .expect("cursor")
        .expect("the watch on the long agent's session");
    assert_eq!(cursor.target_agent, long_agent.agent_id);
    assert_eq!(cursor.material, on_long_agent.event.sequence);
    let page = s
        .changes_since(&long_agent, Sequence::ZERO, 200)
        .await
        .expect("page");
    assert_eq!(page.events, std::slice::from_ref(&on_long_agent.event));
    assert_eq!(
        version(s, &long_agent).await,
        on_long_agent.event.sequence.get()
    );

    // Ids at their limit, and an empty payload object, read back exactly; one byte over an
    // id's or a dedupe key's limit is refused, writes nothing and spends no sequence.
    let id = "i".repeat(MAX_KEY_BYTES);
    let mut e = human(&child())
        .with_session_id(&id)
        .with_actor_id(&id)
        .with_run_id(&id)
        .with_payload(Payload::new());
    e.summary = "ids at their limit".into();
    let got = rec(s, e, T0).await;
    let page = s
        .changes_since(&child(), Sequence::ZERO, 200)
        .await
        .expect("page");
    assert_eq!(
        page.events,
        std::slice::from_ref(&got.event),
        "ids at their limit"
    );
    let stored = &page.events[0];
    assert_eq!(
        (
            stored.session_id.as_deref(),
            stored.actor_id.as_deref(),
            stored.run_id.as_deref()
        ),
        (Some(id.as_str()), Some(id.as_str()), Some(id.as_str()))
    );
    assert_eq!(
        stored.payload,
        Some(Payload::new()),
        "an empty payload stays one"
    );
    let over = "i".repeat(MAX_KEY_BYTES + 1);
    for e in [
        human(&child()).with_session_id(&over),
        human(&child()).with_actor_id(&over),
        human(&child()).with_run_id(&over),
        human(&child()).with_dedupe_key("d".repeat(MAX_DEDUPE_KEY_BYTES + 1)),
    ] {
        assert!(matches!(
            s.record(e, T0).await,
            Err(StoreError::InvalidInput(_))
        ));
    }
    let next = rec(s, human(&child()), T0).await;
    assert_eq!(
        next.event.sequence.get(),
        got.event.sequence.get() + 1,
        "the refused recordings spent no sequence"
    );
}

/// Keys whose lengths sit either side of where an encoding changes the size of its length
/// prefix (127 and 128 bytes for a one-byte varint; 253 to 256 for redb's tuples, whose
/// one-byte prefix ends at 253) record, list and read back exactly as session keys, agent ids
/// and watchers, and a reset and a deletion remove exactly what they name.
pub async fn keys_either_side_of_a_length_prefix_boundary_read_back_exactly(t: &Subject) {
    const LENGTHS: [usize; 7] = [127, 128, 253, 254, 255, 256, 1023];
    let s = &*t.store;
    let pad = |prefix: &str, c: char, len: usize| {
        format!("{prefix}{}", c.to_string().repeat(len - prefix.len()))
    };
    let mut all: Vec<(WatcherKey, SessionRef, u64)> = Vec::new();
    let mut events = Vec::new();
    for len in LENGTHS {
        let watcher = w(&pad("agent:main:", 'w', len));
        let sessions = [
            r(&pad("agent:main:", 'k', len), "main"),
            r(&format!("agent:main:{len}"), &pad("", 'a', len)),
        ];
        for session in sessions {
            s.watch(&watcher, &session, T0).await.expect("watch");
            let got = rec(s, human(&session), T0).await;
            assert_eq!(got.notices.len(), 1, "{len} bytes: the watcher is told");
            assert_eq!(got.notices[0].watcher, watcher, "{len} bytes: the notice");
            let page = s
                .changes_since(&session, Sequence::ZERO, 200)
                .await
                .expect("page");
            assert_eq!(
                page.events,
                std::slice::from_ref(&got.event),
                "{len} bytes: the page"
            );
            let cursor = s
                .cursor(&watcher, &session.session_key)
                .await
                .expect("cursor")
                .expect("the watch's cursor");
            assert_eq!(
                (
                    &cursor.watcher,
                    &cursor.target,
                    &cursor.target_agent,
                    cursor.material
                ),
                (
                    &watcher,
                    &session.session_key,
                    &session.agent_id,
                    got.event.sequence
                ),
                "{len} bytes: the cursor"
            );
            all.push((watcher.clone(), session, got.event.sequence.get()));
            events.push(got.event);
        }
    }
    let heads = |all: &[(WatcherKey, SessionRef, u64)]| {
        let mut v: Vec<(SessionRef, u64)> =
            all.iter().map(|(_, s, seq)| (s.clone(), *seq)).collect();
        v.sort();
        v
    };
    let listed = |got: Vec<crate::model::Head>| {
        let mut v: Vec<(SessionRef, u64)> = got
            .into_iter()
            .map(|h| (h.session, h.last_sequence.get()))
            .collect();
        v.sort();
        v
    };
    let pairs = |all: &[(WatcherKey, SessionRef, u64)]| {
        let mut v: Vec<String> = all.iter().map(|(w, s, _)| format!("{w:?} {s:?}")).collect();
        v.sort();
        v
    };
    let cursors = || async {
        let mut v: Vec<String> = s
            .cursors(&CursorFilter::default())
            .await
            .expect("cursors")
            .iter()
            .map(|c| format!("{:?} {:?}", c.watcher, c.target_ref()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        listed(s.list_heads(None).await.expect("heads")),
        heads(&all),
        "every session listed once with its head"
    );
    for (_, session, seq) in &all {
        assert_eq!(
            listed(s.list_heads(Some(&session.agent_id)).await.expect("heads"))
                .iter()
                .filter(|(listed, _)| listed == session)
                .count(),
            1,
            "{session:?} (its head {seq}) listed under its agent"
        );
    }
    let log = s.events_after(Sequence::ZERO, 100).await.expect("log");
    assert_eq!(log, events, "the log");
    assert_eq!(cursors().await, pairs(&all), "every cursor listed once");

    // The 254-byte watcher's reset removes its two cursors and no other; the 254-byte
    // session's deletion removes it alone.
    let at = 2 * LENGTHS
        .iter()
        .position(|&n| n == 254)
        .expect("254 is a length");
    let (watcher, session, _) = all[at].clone();
    assert_eq!(
        s.reset_watcher(watcher.session_key()).await.expect("reset"),
        2,
        "the reset removes the watcher's two cursors"
    );
    s.delete_session(&session).await.expect("delete");
    let mut left = all.clone();
    left.remove(at);
    assert_eq!(
        listed(s.list_heads(None).await.expect("heads")),
        heads(&left),
        "the deletion removes that session's head alone"
    );
    left.retain(|(w, _, _)| *w != watcher);
    assert_eq!(cursors().await, pairs(&left), "the other cursors stay");
    assert!(
        s.changes_since(&session, Sequence::ZERO, 200)
            .await
            .expect("page")
            .events
            .is_empty(),
        "the deleted session's events are gone"
    );
}

/// Every session is listed and read however many there are: 1,100 sessions under two agents
/// are each listed once, in key then agent order, by `list_heads` (all, and each agent's), and
/// `heads` of them, asked among 1,000 refs with no head and one asked twice (over 2,000 refs in
/// one call, past SQLite's old limit of 999 parameters), answers each once with its head. A
/// store that read the heads in pages, or bound one parameter per ref, and kept only the first
/// would answer short.
pub async fn every_session_is_listed_and_read_however_many(t: &Subject) {
    const SESSIONS: usize = 1_100;
    let s = &*t.store;
    let mut want = Vec::with_capacity(SESSIONS);
    for i in 0..SESSIONS {
        let agent = if i % 2 == 0 { "main" } else { "ops" };
        let session = r(&format!("agent:main:s{i:04}"), agent);
        let got = rec(s, log_only(&session, "e"), T0).await;
        want.push((session, got.event.sequence.get()));
    }
    want.sort();
    let of = |heads: Vec<crate::model::Head>| {
        heads
            .into_iter()
            .map(|h| (h.session, h.last_sequence.get()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        of(s.list_heads(None).await.expect("list_heads")),
        want,
        "every head, in key then agent order"
    );
    for agent in ["main", "ops"] {
        let of_agent: Vec<_> = want
            .iter()
            .filter(|(session, _)| session.agent_id.as_str() == agent)
            .cloned()
            .collect();
        assert_eq!(of_agent.len(), SESSIONS / 2);
        let id = AgentId::new(agent).expect("an agent id");
        assert_eq!(
            of(s.list_heads(Some(&id)).await.expect("list_heads")),
            of_agent,
            "every head of {agent}, in key order"
        );
    }
    let mut asked: Vec<SessionRef> = want.iter().map(|(session, _)| session.clone()).collect();
    asked.extend((0..1_000).map(|i| r(&format!("agent:main:none{i:04}"), "main")));
    asked.push(want[SESSIONS / 2].0.clone());
    let mut got = of(s.heads(&asked).await.expect("heads"));
    got.sort();
    assert_eq!(got, want, "each session asked for once, with its head");
}

/// Keys one of which is a proper prefix of another (`…:c1` and `…:c10`, `…:t1` and `…:t10`)
/// are separate watchers and sessions: a reset, an unwatch, an acknowledgement and a delete of
/// one leave the other's cursors, heads and events exactly as they were, and the listings hold
/// each once, in order. A prefix scan, a `LIKE 'k%'` or a concatenated key would reach both.
pub async fn keys_that_prefix_each_other_stay_apart(t: &Subject) {
    const C1: &str = "agent:main:subagent:c1";
    const C10: &str = "agent:main:subagent:c10";
    const T1: &str = "agent:main:t1";
    const T10: &str = "agent:main:t10";
    let s = &*t.store;
    for watcher in [C1, C10] {
        for target in [T1, T10] {
            s.watch(&w(watcher), &r(target, "main"), T0).await.unwrap();
        }
    }
    for target in [T1, T10] {
        rec(s, human(&r(target, "main")), T0).await;
    }
    let heads = s.list_heads(None).await.expect("heads");
    let listed: Vec<&str> = heads
        .iter()
        .map(|h| h.session.session_key.as_str())
        .collect();
    assert_eq!(listed, [T1, T10], "each session listed once, in order");
    assert_eq!(seqs(s, &r(T1, "main"), 0).await, [1], "{T1}'s events alone");
    assert_eq!(version(s, &r(T1, "main")).await, 1);
    let heads = s
        .heads(&[r(T1, "main"), r("agent:main:t", "main")])
        .await
        .expect("heads");
    let asked: Vec<(&str, u64)> = heads
        .iter()
        .map(|h| (h.session.session_key.as_str(), h.last_sequence.get()))
        .collect();
    assert_eq!(
        asked,
        [(T1, 1)],
        "the heads of the refs asked, and no other"
    );
    let of = |filter: CursorFilter| async move {
        let mut pairs: Vec<(String, String)> = s
            .cursors(&filter)
            .await
            .expect("cursors")
            .iter()
            .map(|c| (c.watcher.as_str().to_owned(), c.target.as_str().to_owned()))
            .collect();
        pairs.sort();
        pairs
    };
    let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(
        of(CursorFilter {
            watcher: Some(k(C1)),
            ..CursorFilter::default()
        })
        .await,
        [pair(C1, T1), pair(C1, T10)],
        "{C1}'s cursors alone"
    );
    assert_eq!(
        of(CursorFilter {
            target: Some(k(T1)),
            pending_only: true,
            ..CursorFilter::default()
        })
        .await,
        [pair(C1, T1), pair(C10, T1)],
        "the cursors on {T1} alone"
    );
    let before = all_cursors(s).await;
    assert_eq!(before.len(), 4);
    let without = |gone: &dyn Fn(&crate::Cursor) -> bool| -> Vec<crate::Cursor> {
        before.iter().filter(|c| !gone(c)).cloned().collect()
    };

    assert_eq!(s.reset_watcher(&k(C1)).await.unwrap(), 2);
    assert_eq!(
        all_cursors(s).await,
        without(&|c| c.watcher.as_str() == C1),
        "a reset of {C1}"
    );
    assert!(s.unwatch(&w(C10), &k(T1)).await.unwrap());
    assert_eq!(
        cursor3(s, C10, T10).await,
        Some((0, 2, 2)),
        "the unwatch left {T10}"
    );
    assert!(s.cursor(&w(C10), &k(T1)).await.unwrap().is_none());
    s.acknowledge(&w(C10), &[any(T10)], T0).await.unwrap();
    assert_eq!(cursor3(s, C10, T10).await, Some((2, 2, 2)));
    rec(s, human(&r(T1, "main")), T0).await; // 3, on t1 only
    assert_eq!(
        cursor3(s, C10, T10).await,
        Some((2, 2, 2)),
        "t1's change is not t10's"
    );
    s.delete_session(&r(T1, "main")).await.unwrap();
    assert_eq!(seqs(s, &r(T10, "main"), 0).await, [2], "t10's events");
    assert_eq!(version(s, &r(T10, "main")).await, 2);
    let heads = s.list_heads(None).await.expect("heads");
    let listed: Vec<&str> = heads
        .iter()
        .map(|h| h.session.session_key.as_str())
        .collect();
    assert_eq!(listed, [T10]);
    let by_target = s
        .cursors(&CursorFilter {
            target: Some(k(T10)),
            ..CursorFilter::default()
        })
        .await
        .unwrap();
    let watchers: Vec<&str> = by_target.iter().map(|c| c.watcher.as_str()).collect();
    assert_eq!(watchers, [C10]);
}

/// A caller's `changesSince` at or beyond 2^63 (a value no SQL integer holds) is past the head:
/// no events, `versionAhead`, nothing truncated; the log after such a sequence is empty. A store
/// that bound it `as i64` wrapped it below zero and answered the whole history as a delta.
pub async fn a_changes_since_beyond_any_stored_sequence_is_ahead(t: &Subject) {
    let s = &*t.store;
    for _ in 0..3 {
        rec(s, human(&child()), T0).await;
    }
    for after in [1u64 << 63, (1u64 << 63) + 1, u64::MAX - 1, u64::MAX] {
        let page = s
            .changes_since(&child(), Sequence(after), 200)
            .await
            .expect("page");
        assert!(page.events.is_empty(), "after {after}: {:?}", page.events);
        assert!(page.version_ahead, "after {after}");
        assert!(!page.truncated, "after {after}");
        let status = s
            .session_status(&child(), Some(Sequence(after)), None)
            .await
            .expect("status");
        assert_eq!(status.state_version, Sequence(3), "after {after}");
        assert!(
            s.events_after(Sequence(after), 10)
                .await
                .expect("log")
                .is_empty(),
            "the log after {after}"
        );
    }
}

pub async fn cursors_filter_and_order(t: &Subject) {
    let s = &*t.store;
    let c2 = r("agent:main:subagent:c2", "main");
    rec(s, spawn(&c2, MANAGER, "run-2"), T0).await;
    rec(s, spawn(&child(), MANAGER, "run-1"), T0).await;
    s.watch(&w(PEER), &child(), T0).await.unwrap();
    rec(s, human(&child()), T0).await;
    let all: Vec<(String, String)> = all_cursors(s)
        .await
        .iter()
        .map(|c| (c.watcher.to_string(), c.target.to_string()))
        .collect();
    assert_eq!(
        all,
        vec![
            (MANAGER.into(), CHILD.into()),
            (MANAGER.into(), "agent:main:subagent:c2".into()),
            (PEER.into(), CHILD.into()),
        ],
        "ordered by watcher then target"
    );
    let by_watcher = s
        .cursors(&CursorFilter {
            watcher: Some(k(PEER)),
            ..CursorFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(by_watcher.len(), 1);
    let by_target = s
        .cursors(&CursorFilter {
            target: Some(k(CHILD)),
            ..CursorFilter::default()
        })
        .await
        .unwrap();
    // Listed by target alone, the cursors come ordered by watcher too. (What the mutation did:
    // store-redb walked its by-target index backwards; review of stop 70, RF32.)
    assert_eq!(
        by_target
            .iter()
            .map(|c| c.watcher.to_string())
            .collect::<Vec<_>>(),
        [MANAGER, PEER],
        "the cursors on one target, ordered by watcher"
    );
    let pending = s
        .cursors(&CursorFilter {
            pending_only: true,
            ..CursorFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(pending.len(), 2);
    assert!(pending.iter().all(|c| c.target == k(CHILD)));
    // The fields combine: each one set narrows the listing, whichever others are set.
    let c2k = "agent:main:subagent:c2";
    for (watcher, target, pending_only, want) in [
        (Some(MANAGER), Some(CHILD), false, vec![(MANAGER, CHILD)]),
        (Some(MANAGER), None, true, vec![(MANAGER, CHILD)]),
        (None, Some(c2k), true, vec![]),
        (Some(PEER), Some(c2k), false, vec![]),
        (Some(MANAGER), Some(c2k), false, vec![(MANAGER, c2k)]),
        (Some(MANAGER), Some(CHILD), true, vec![(MANAGER, CHILD)]),
        (Some(PEER), Some(CHILD), true, vec![(PEER, CHILD)]),
    ] {
        let filter = CursorFilter {
            watcher: watcher.map(k),
            target: target.map(k),
            pending_only,
        };
        let got: Vec<(String, String)> = s
            .cursors(&filter)
            .await
            .unwrap()
            .iter()
            .map(|c| (c.watcher.to_string(), c.target.to_string()))
            .collect();
        let want: Vec<(String, String)> = want
            .into_iter()
            .map(|(w, t)| (w.to_owned(), t.to_owned()))
            .collect();
        assert_eq!(got, want, "{filter:?}");
    }
}

pub async fn list_heads_by_agent(t: &Subject) {
    let s = &*t.store;
    rec(s, log_only(&r("global", "ops"), "x"), T0).await;
    rec(s, log_only(&r("global", "main"), "x"), T0).await;
    rec(s, log_only(&child(), "x"), T0).await;
    let all = s.list_heads(None).await.unwrap();
    let names: Vec<String> = all
        .iter()
        .map(|h| format!("{}/{}", h.session.session_key, h.session.agent_id))
        .collect();
    assert_eq!(
        names,
        vec![
            format!("{CHILD}/main"),
            "global/main".into(),
            "global/ops".into()
        ]
    );
    let ops = s
        .list_heads(Some(&AgentId::new("ops").unwrap()))
        .await
        .unwrap();
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].last_sequence, Sequence(1));
    // An agent that sorts before another one's, and agents with no session, around both.
    let main: Vec<(String, u64)> = s
        .list_heads(Some(&AgentId::new("main").unwrap()))
        .await
        .unwrap()
        .iter()
        .map(|h| {
            assert_eq!(h.session.agent_id.as_str(), "main");
            (
                h.session.session_key.as_str().to_owned(),
                h.last_sequence.get(),
            )
        })
        .collect();
    assert_eq!(main, [(CHILD.to_owned(), 3), ("global".to_owned(), 2)]);
    for none in ["a", "mai", "main2", "op", "zz"] {
        assert!(
            s.list_heads(Some(&AgentId::new(none).unwrap()))
                .await
                .unwrap()
                .is_empty(),
            "agent {none}"
        );
    }
}

/// A batch of refs that share keys and agents crosswise (`global` of two agents, another key
/// of one of them) answers the heads of exactly the pairs asked: a store that filtered keys
/// and agents apart (`key IN (..) AND agent IN (..)`) would add the pairs nobody asked for.
pub async fn heads_of_refs_crossing_keys_and_agents_are_exact(t: &Subject) {
    let s = &*t.store;
    rec(s, log_only(&r("global", "main"), "x"), T0).await; // 1
    rec(s, log_only(&r("global", "ops"), "x"), T0).await; // 2
    rec(s, log_only(&r("agent:ops:main", "ops"), "x"), T0).await; // 3
    rec(s, log_only(&r("agent:ops:main", "main"), "x"), T0).await; // 4
    let asked = [
        r("global", "main"),
        r("agent:ops:main", "ops"),
        r("global", "qa"),
    ];
    let mut got: Vec<(String, String, u64)> = s
        .heads(&asked)
        .await
        .unwrap()
        .iter()
        .map(|h| {
            (
                h.session.session_key.as_str().to_owned(),
                h.session.agent_id.as_str().to_owned(),
                h.last_sequence.get(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("agent:ops:main".to_owned(), "ops".to_owned(), 3),
            ("global".to_owned(), "main".to_owned(), 1),
        ]
    );
}

/// An event the rules refuse is refused even when its dedupe key is stored already: the
/// refusal comes before the dedupe lookup, so the caller learns its input is bad instead of
/// getting the stored event back, and nothing is written or spent.
pub async fn an_invalid_event_under_a_stored_dedupe_key_is_refused(t: &Subject) {
    let s = &*t.store;
    let first = rec(s, human(&child()).with_dedupe_key("d-1"), T0).await;
    let mut huge = validate::payload_from_value(json!({"x": "a"})).unwrap();
    huge.insert("x".into(), json!("a".repeat(5000)));
    for bad in [
        human(&child()).with_dedupe_key("d-1").with_payload(huge),
        human(&child())
            .with_dedupe_key("d-1")
            .with_actor_id("bad\u{1}id"),
    ] {
        assert!(matches!(
            s.record(bad, T0).await,
            Err(StoreError::InvalidInput(_))
        ));
    }
    assert_eq!(count(s).await, 1);
    let next = rec(s, human(&child()), T0).await;
    assert_eq!(
        next.event.sequence.get(),
        first.event.sequence.get() + 1,
        "the refused recordings spent no sequence"
    );
}

pub async fn events_after_and_log_stats(t: &Subject) {
    let s = &*t.store;
    assert_eq!(s.log_stats().await.unwrap(), crate::LogStats::default());
    for i in 0..6 {
        rec(
            s,
            log_only(&r(&format!("agent:main:s{}", i % 3), "main"), "x"),
            T0,
        )
        .await;
    }
    let tail: Vec<u64> = s
        .events_after(Sequence(2), 3)
        .await
        .unwrap()
        .iter()
        .map(|e| e.sequence.get())
        .collect();
    assert_eq!(tail, vec![3, 4, 5]);
    // The largest limit, beyond what a server's integer holds, is no limit. (What the mutation
    // did: store-postgres took it for 0 and read nothing; review of stop 66, P403.)
    let rest: Vec<u64> = s
        .events_after(Sequence(2), usize::MAX)
        .await
        .unwrap()
        .iter()
        .map(|e| e.sequence.get())
        .collect();
    assert_eq!(rest, vec![3, 4, 5, 6], "the largest limit");
    // Read a page at a time (`awareness prune --dry-run` counts what it is given), the log
    // gives each event once, in order. (What the mutation did: each page began past the first
    // event of the one before, every event but the first page's given again; review of stop
    // 70, AU16.)
    let mut pages = Vec::new();
    let stop = crate::audit::read_log(s, 4, |events| {
        pages.push(events.iter().map(|e| e.sequence.get()).collect::<Vec<_>>());
    })
    .await
    .expect("read the log");
    assert!(stop.is_none(), "a sound log");
    assert_eq!(pages, [vec![1, 2, 3, 4], vec![5, 6]], "each event once");
    let stats = s.log_stats().await.unwrap();
    assert_eq!(
        (
            stats.rows,
            stats.min_sequence.get(),
            stats.max_sequence.get()
        ),
        (6, 1, 6)
    );
}

pub async fn heads_batch_returns_only_existing(t: &Subject) {
    let s = &*t.store;
    let refs: Vec<SessionRef> = (0..300)
        .map(|i| r(&format!("agent:main:s{i}"), "main"))
        .collect();
    for r in refs.iter().step_by(2) {
        rec(s, log_only(r, "x"), T0).await;
    }
    let heads = s.heads(&refs).await.unwrap();
    assert_eq!(heads.len(), 150);
    for h in &heads {
        let i: usize = h.session.session_key.as_str()["agent:main:s".len()..]
            .parse()
            .unwrap();
        assert_eq!(i % 2, 0);
        assert_eq!(h.last_sequence.get(), (i / 2 + 1) as u64);
    }
    // A ref listed twice has one head, on every backend.
    let twice = [
        refs[0].clone(),
        refs[2].clone(),
        refs[0].clone(),
        refs[1].clone(),
    ];
    let mut got: Vec<String> = s
        .heads(&twice)
        .await
        .unwrap()
        .iter()
        .map(|h| h.session.session_key.as_str().to_owned())
        .collect();
    got.sort();
    assert_eq!(
        got,
        ["agent:main:s0", "agent:main:s2"],
        "one head per ref listed"
    );
}

// ----- upstream links (DESIGN.md section 8) ---------------------------------------------------

pub(crate) fn link_spec(session: &SessionRef, thread: &str, offset: u64) -> crate::LinkSpec {
    crate::LinkSpec::new(
        session.clone(),
        "claude-code",
        "local",
        thread,
        "local-jsonl",
    )
    .with_ref(json!({"path": format!("/home/me/.claude/projects/p/{thread}.jsonl")}))
    .with_marker(json!({"offset": offset}))
}

async fn marker_of(t: &Subject, session: &SessionRef) -> Option<serde_json::Value> {
    t.upstream
        .link(session)
        .await
        .expect("link")
        .expect("the link exists")
        .marker
}

/// A handle's own writes, of every kind, are never commits of another writer
/// ([`crate::EventStore::foreign_commits`]): a gateway alone on its store is never sent to look
/// for notices it handed out itself. The recordings are enough for store-sqlite to start a
/// background checkpoint of its write-ahead log (every 256 writes), though nothing here waits
/// for it (store-sqlite runs that pass directly in a unit test of its own). The answer is of
/// the kind the stamping states (`foreign`): a number that none of the writes moves, or `None`
/// (one writer: store-memory, store-redb) before and after them all.
pub async fn a_handles_own_writes_are_never_foreign_commits(
    t: &Subject,
    foreign_commits: super::ForeignCommits,
) {
    let s = &*t.store;
    let foreign = async || s.foreign_commits().await.expect("foreign_commits");
    let before = foreign().await;
    foreign_commits.assert_answer("a new store", before);
    assert_eq!(foreign().await, before, "nothing was written in between");
    let manager = w(MANAGER);
    let kid = child();
    rec(s, spawn(&kid, MANAGER, "run-1"), T0).await;
    assert!(rec(s, spawn(&kid, MANAGER, "run-1"), T0).await.deduplicated);
    s.watch(&w(PEER), &kid, T0).await.expect("watch");
    for i in 0..300 {
        let session = if i % 3 == 0 {
            kid.clone()
        } else {
            r(&format!("agent:main:solo{}", i % 7), "main")
        };
        rec(s, human(&session), T0).await;
    }
    // Asked while its own recordings are under way (between one's commit and the handle's
    // counting of it, say), the answer stays the same too.
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let store = std::sync::Arc::clone(&t.store);
            tokio::spawn(async move { store.record(human(&child()), T0).await })
        })
        .collect();
    let asking = {
        let store = std::sync::Arc::clone(&t.store);
        tokio::spawn(async move {
            let mut answers = Vec::new();
            for _ in 0..64 {
                answers.push(store.foreign_commits().await.expect("foreign_commits"));
                tokio::task::yield_now().await;
            }
            answers
        })
    };
    for task in tasks {
        task.await.expect("join").expect("record");
    }
    let answers = asking.await.expect("join");
    assert!(
        answers.iter().all(|a| *a == before),
        "asked during this handle's own recordings: {before:?}, then {answers:?}"
    );
    s.acknowledge(&manager, &[AckTarget::any(kid.session_key.clone())], T0)
        .await
        .expect("acknowledge");
    rec(s, human(&kid), T0).await;
    s.sweep(T0, &|_| true).await.expect("sweep");
    assert!(
        s.unwatch(&w(PEER), &kid.session_key)
            .await
            .expect("unwatch")
    );
    s.prune_chunk(&PruneStep::RowCap { max_rows: 100 }, 50, T0)
        .await
        .expect("prune");
    s.delete_session(&r("agent:main:solo1", "main"))
        .await
        .expect("delete");
    s.reset_watcher(manager.session_key()).await.expect("reset");
    assert_eq!(
        foreign().await,
        before,
        "this handle's own writes changed its answer"
    );
}

pub async fn upstream_upsert_creates_then_same_source_keeps_marker(t: &Subject) {
    let u = &*t.upstream;
    assert!(u.link(&child()).await.unwrap().is_none());
    let first = u
        .upsert_link(link_spec(&child(), "t1", 100), T0)
        .await
        .unwrap();
    assert!(first.created && !first.rebased);
    assert_eq!(first.link.created_at, T0);
    assert_eq!(first.link.updated_at, T0);
    assert_eq!(first.link.last_scanned_at, None);
    assert_eq!(
        u.link(&child()).await.unwrap().as_ref(),
        Some(&first.link),
        "the stored link is what upsert returned"
    );
    // The monitor advances the marker; adopting again from the same source keeps it.
    assert!(
        u.set_marker(&child(), T0, json!({"offset": 500}), T0.plus_ms(10))
            .await
            .unwrap()
    );
    let again = u
        .upsert_link(link_spec(&child(), "t1", 0), T0.plus_ms(20))
        .await
        .unwrap();
    assert!(!again.created && !again.rebased, "a same-source refresh");
    assert_eq!(again.link.marker, Some(json!({"offset": 500})));
    assert_eq!(
        again.link.updated_at,
        T0.plus_ms(10),
        "a refresh does not move the compare-and-set token"
    );
    assert_eq!(marker_of(t, &child()).await, Some(json!({"offset": 500})));
}

pub async fn upstream_changed_source_rebases_marker(t: &Subject) {
    let u = &*t.upstream;
    let first = u
        .upsert_link(link_spec(&child(), "t1", 100), T0)
        .await
        .unwrap();
    u.set_marker(&child(), T0, json!({"offset": 500}), T0)
        .await
        .unwrap();
    let moved = u
        .upsert_link(link_spec(&child(), "t2", 7), T0)
        .await
        .unwrap();
    assert!(moved.rebased && !moved.created);
    assert_eq!(moved.link.thread_id, "t2");
    assert_eq!(moved.link.marker, Some(json!({"offset": 7})), "rebased");
    assert_eq!(moved.link.created_at, first.link.created_at);
    assert!(
        moved.link.updated_at > T0.plus_ms(1),
        "the token moved forward"
    );
    assert_eq!(u.link(&child()).await.unwrap(), Some(moved.link));
    // Each part of the source counts: a new catalog, host, kind or ref with the same thread
    // is another source too.
    for (i, part) in ["catalog", "host", "kind", "ref"].into_iter().enumerate() {
        let session = r(&format!("agent:main:subagent:source{i}"), "main");
        u.upsert_link(link_spec(&session, "t1", 100), T0)
            .await
            .unwrap();
        u.set_marker(&session, T0, json!({"offset": 500}), T0)
            .await
            .unwrap();
        let mut spec = link_spec(&session, "t1", 7);
        match part {
            "catalog" => spec.catalog_id = "codex".into(),
            "host" => spec.host_id = "node-2".into(),
            "kind" => spec.upstream_kind = "remote-jsonl".into(),
            _ => spec.upstream_ref = Some(json!({"path": "/elsewhere.jsonl"})),
        }
        let moved = u.upsert_link(spec, T0).await.unwrap();
        assert!(
            moved.rebased && !moved.created,
            "another {part} is another source"
        );
        // Stored as the adoption answered, the new part with it. (What the mutation did:
        // store-sqlite's write over the row kept its host; review of stop 66, S541.)
        assert_eq!(
            u.link(&session).await.unwrap().as_ref(),
            Some(&moved.link),
            "another {part}: the link stored is the one answered"
        );
        assert_eq!(
            marker_of(t, &session).await,
            Some(json!({"offset": 7})),
            "another {part}: the marker starts again"
        );
    }
}

pub async fn upstream_marker_update_is_compare_and_set(t: &Subject) {
    let u = &*t.upstream;
    let link = u
        .upsert_link(link_spec(&child(), "t1", 0), T0)
        .await
        .unwrap()
        .link;
    // A scan read the link at T0; meanwhile the session is adopted from another thread.
    u.upsert_link(link_spec(&child(), "t2", 3), T0.plus_ms(5))
        .await
        .unwrap();
    assert!(
        !u.set_marker(
            &child(),
            link.updated_at,
            json!({"offset": 999}),
            T0.plus_ms(6)
        )
        .await
        .unwrap(),
        "the link changed during the scan: the stale marker is refused"
    );
    assert_eq!(marker_of(t, &child()).await, Some(json!({"offset": 3})));
    let current = u.link(&child()).await.unwrap().unwrap();
    assert!(
        u.set_marker(
            &child(),
            current.updated_at,
            json!({"offset": 4}),
            T0.plus_ms(6)
        )
        .await
        .unwrap()
    );
    let after = u.link(&child()).await.unwrap().unwrap();
    assert_eq!(after.marker, Some(json!({"offset": 4})));
    assert!(
        after.updated_at > current.updated_at,
        "every write moves the token"
    );
    assert!(
        !u.set_marker(
            &child(),
            current.updated_at,
            json!({"offset": 5}),
            T0.plus_ms(7)
        )
        .await
        .unwrap(),
        "a token is good for one write"
    );
    assert!(
        !u.set_marker(&r(PEER, "ops"), T0, json!(1), T0)
            .await
            .unwrap(),
        "no link: false, nothing created"
    );
    assert!(u.link(&r(PEER, "ops")).await.unwrap().is_none());
    let huge = json!({"x": "a".repeat(crate::upstream::MAX_UPSTREAM_JSON_BYTES)});
    assert!(matches!(
        u.set_marker(&child(), after.updated_at, huge, T0).await,
        Err(StoreError::InvalidInput(_))
    ));
    assert_eq!(u.link(&child()).await.unwrap().unwrap(), after);
}

pub async fn upstream_mark_scanned_keeps_the_cas_token(t: &Subject) {
    let u = &*t.upstream;
    let link = u
        .upsert_link(link_spec(&child(), "t1", 0), T0)
        .await
        .unwrap()
        .link;
    assert!(u.mark_scanned(&child(), T0.plus_ms(50)).await.unwrap());
    let scanned = u.link(&child()).await.unwrap().unwrap();
    assert_eq!(scanned.last_scanned_at, Some(T0.plus_ms(50)));
    assert_eq!(scanned.updated_at, link.updated_at);
    assert!(
        u.set_marker(
            &child(),
            link.updated_at,
            json!({"offset": 1}),
            T0.plus_ms(60)
        )
        .await
        .unwrap(),
        "a scan stamp does not break a marker update in flight"
    );
    assert_eq!(
        u.link(&child()).await.unwrap().unwrap().last_scanned_at,
        Some(T0.plus_ms(50))
    );
    assert!(!u.mark_scanned(&r(PEER, "ops"), T0).await.unwrap());
    assert!(u.link(&r(PEER, "ops")).await.unwrap().is_none());
    // The time given is stamped, even one before the last stamp (a clock that stepped back):
    // the stamp says when the link was last scanned, by that clock. (store-memory kept the
    // later time under mutation, where every durable store stamps the given one, and every
    // test passed; review of stop 64, ME35.)
    assert!(u.mark_scanned(&child(), T0.plus_ms(40)).await.unwrap());
    assert_eq!(
        u.link(&child()).await.unwrap().unwrap().last_scanned_at,
        Some(T0.plus_ms(40)),
        "the time given, before the last stamp"
    );
}

pub async fn upstream_remove_link_with_and_without_token(t: &Subject) {
    let u = &*t.upstream;
    let link = u
        .upsert_link(link_spec(&child(), "t1", 0), T0)
        .await
        .unwrap()
        .link;
    assert!(
        !u.remove_link(&child(), Some(link.updated_at.minus_ms(1)))
            .await
            .unwrap(),
        "a stale token removes nothing"
    );
    assert!(u.link(&child()).await.unwrap().is_some());
    assert!(
        u.remove_link(&child(), Some(link.updated_at))
            .await
            .unwrap()
    );
    assert!(u.link(&child()).await.unwrap().is_none());
    assert!(!u.remove_link(&child(), None).await.unwrap());
    let fresh = u
        .upsert_link(link_spec(&child(), "t1", 9), T0.plus_ms(1))
        .await
        .unwrap();
    assert!(
        fresh.created,
        "adopting again after removal creates a fresh link"
    );
    assert_eq!(fresh.link.marker, Some(json!({"offset": 9})));
    assert!(u.remove_link(&child(), None).await.unwrap());
    assert!(u.links().await.unwrap().is_empty());
}

pub async fn upstream_delete_session_removes_only_that_refs_link(t: &Subject) {
    let u = &*t.upstream;
    let main_global = r("global", "main");
    let ops_global = r("global", "ops");
    rec(&*t.store, log_only(&main_global, "m"), T0).await;
    u.upsert_link(link_spec(&main_global, "t1", 1), T0)
        .await
        .unwrap();
    u.upsert_link(link_spec(&ops_global, "t1", 2), T0)
        .await
        .unwrap();
    u.upsert_link(link_spec(&child(), "t1", 3), T0)
        .await
        .unwrap();
    t.store.delete_session(&main_global).await.unwrap();
    assert!(
        u.link(&main_global).await.unwrap().is_none(),
        "the ref's link goes"
    );
    assert_eq!(
        marker_of(t, &ops_global).await,
        Some(json!({"offset": 2})),
        "ops' global is another session"
    );
    assert!(u.link(&child()).await.unwrap().is_some());
    // A session without events or head still loses its link.
    t.store.delete_session(&child()).await.unwrap();
    assert!(u.link(&child()).await.unwrap().is_none());
    // Reset keeps the session's own link (its history stays).
    t.store.reset_watcher(&k("global")).await.unwrap();
    assert_eq!(u.links().await.unwrap().len(), 1);
}

pub async fn upstream_links_ordered_and_json_round_trips(t: &Subject) {
    let u = &*t.upstream;
    let refs = [
        r("global", "ops"),
        r(PEER, "ops"),
        r("global", "main"),
        r(CHILD, "main"),
    ];
    for (i, session) in refs.iter().enumerate() {
        u.upsert_link(link_spec(session, &format!("t{i}"), i as u64), T0)
            .await
            .unwrap();
    }
    let order: Vec<(String, String)> = u
        .links()
        .await
        .unwrap()
        .into_iter()
        .map(|l| {
            (
                l.session.session_key.to_string(),
                l.session.agent_id.to_string(),
            )
        })
        .collect();
    let mut expected: Vec<(String, String)> = refs
        .iter()
        .map(|r| (r.session_key.to_string(), r.agent_id.to_string()))
        .collect();
    expected.sort();
    assert_eq!(order, expected, "ordered by key, then agent");

    // References and markers come back as the same JSON (nesting, unicode, large integers,
    // escapes), and a link without them has none.
    let odd = r("agent:main:odd", "main");
    let reference = json!({"path": "/tmp/d\u{e9}j\u{e0} vu/\"q\".jsonl", "n": [1, {"k": null}]});
    let marker = json!({"offset": u64::MAX, "dev": 2049, "ino": 0, "partial": {"t": "a\nb"}});
    let spec = crate::LinkSpec::new(odd.clone(), "claude-code", "host \u{2603}", "th", "k")
        .with_ref(reference.clone())
        .with_marker(marker.clone());
    u.upsert_link(spec, T0).await.unwrap();
    let got = u.link(&odd).await.unwrap().unwrap();
    assert_eq!(got.upstream_ref, Some(reference));
    assert_eq!(got.marker, Some(marker));
    assert_eq!(got.host_id, "host \u{2603}");
    let bare = r("agent:main:bare", "main");
    u.upsert_link(crate::LinkSpec::new(bare.clone(), "c", "h", "t", "k"), T0)
        .await
        .unwrap();
    let got = u.link(&bare).await.unwrap().unwrap();
    assert_eq!((got.upstream_ref, got.marker), (None, None));

    // A reference and a marker that are JSON null are kept as null, not read back as absent:
    // adopting again from the same spec is then a same-source refresh, not a rebase.
    let nulls = r("agent:main:nulls", "main");
    let spec = || {
        crate::LinkSpec::new(nulls.clone(), "c", "h", "t", "k")
            .with_ref(Value::Null)
            .with_marker(Value::Null)
    };
    u.upsert_link(spec(), T0).await.unwrap();
    let got = u.link(&nulls).await.unwrap().unwrap();
    assert_eq!(
        (got.upstream_ref, got.marker),
        (Some(Value::Null), Some(Value::Null))
    );
    let again = u.upsert_link(spec(), T0.plus_ms(5)).await.unwrap();
    assert!(!again.created && !again.rebased, "{again:?}");
    assert_eq!(again.link.updated_at, T0, "a refresh keeps the token");
    assert!(
        u.set_marker(&nulls, T0, Value::Null, T0.plus_ms(10))
            .await
            .unwrap()
    );
    assert_eq!(marker_of(t, &nulls).await, Some(Value::Null));
}

/// What a refusal of a spec must say.
type Refusal = fn(&validate::ValidationError) -> bool;

/// Specs a store must refuse, with what the refusal says: each would rebase [`child`]'s link (it
/// names another thread) if it were valid.
pub(crate) fn invalid_link_specs() -> Vec<(&'static str, crate::upstream::LinkSpec, Refusal)> {
    let mut blank = link_spec(&child(), "t2", 0);
    blank.host_id = String::new();
    let huge = link_spec(&child(), "t2", 0).with_ref(json!({
        "path": "a".repeat(crate::upstream::MAX_UPSTREAM_JSON_BYTES)
    }));
    // A catalog id too long for the summaries quoted from it (its events would all be refused).
    let mut long = link_spec(&child(), "t2", 0);
    long.catalog_id = "c".repeat(crate::upstream::MAX_CATALOG_ID_CHARS + 1);
    // A line separator in it, which its summaries refuse.
    let mut broken = link_spec(&child(), "t2", 0);
    broken.catalog_id = "claude\u{2028}code".into();
    vec![
        ("a blank host id", blank, |_| true),
        ("a ref over the JSON bound", huge, |_| true),
        ("a catalog id too long", long, |v| {
            matches!(v, validate::ValidationError::CatalogIdTooLong { .. })
        }),
        ("a line separator in the catalog id", broken, |v| {
            matches!(v, validate::ValidationError::ControlCharacter { .. })
        }),
    ]
}

/// Invalid specs are refused as invalid input and write nothing: no link where there was
/// none, and over a stored link (its marker moved by the monitor) no change at all (no row
/// replaced or removed, no rebase, no token moved).
pub async fn upstream_invalid_spec_is_rejected_and_nothing_written(t: &Subject) {
    let u = &*t.upstream;
    let refused =
        |what: &str, says: Refusal, got: Result<crate::upstream::UpsertOutcome, StoreError>| {
            match got {
                Err(StoreError::InvalidInput(v)) => assert!(says(&v), "{what}: {v:?}"),
                other => panic!("{what} is refused as invalid input: {other:?}"),
            }
        };
    for (what, spec, says) in invalid_link_specs() {
        refused(what, says, u.upsert_link(spec, T0).await);
    }
    assert!(u.links().await.unwrap().is_empty());
    assert_eq!(
        count(&*t.store).await,
        0,
        "adopting writes no event by itself"
    );
    u.upsert_link(link_spec(&child(), "t1", 0), T0)
        .await
        .unwrap();
    assert!(
        u.set_marker(&child(), T0, json!({"offset": 500}), T0.plus_ms(10))
            .await
            .unwrap()
    );
    let before = u.links().await.unwrap();
    for (what, spec, says) in invalid_link_specs() {
        refused(what, says, u.upsert_link(spec, T0.plus_ms(20)).await);
        assert_eq!(
            u.links().await.unwrap(),
            before,
            "{what} over a stored link changes nothing"
        );
    }
    assert_eq!(marker_of(t, &child()).await, Some(json!({"offset": 500})));
}

/// Records a human message on [`child`] after every read of a head or a page: someone types
/// into the child all the time.
struct TypesAfterReads;

#[async_trait::async_trait]
impl super::hooked::Hook for TypesAfterReads {
    async fn after(&self, call: super::hooked::Call, store: &dyn AwarenessStore) {
        use super::hooked::Call;
        if matches!(call, Call::ChangesSince | Call::Heads) {
            rec(store, human(&child()), T0).await;
        }
    }
}

/// `session_status` reads the version and the page in two calls. Whatever lands between them,
/// every event after `N` up to the reported version is in the page (or the page says it is
/// truncated), the version is at least the page's last event, for a full page and for a page
/// cut short by the limit, and `versionAhead` says whether `N` is above the reported version,
/// also when `N` is the event that landed between the reads.
pub async fn session_status_never_names_an_event_its_page_left_out(t: &Subject) {
    let busy = super::hooked::Hooked {
        inner: t.store.clone(),
        hook: TypesAfterReads,
    };
    rec(&busy, human(&child()), T0).await;
    for (after, limit) in [
        (0, None),
        (1, None),
        (0, Some(1)),
        (2, Some(2)),
        (u64::MAX, None),
    ] {
        // Last: the sequence of the recording that lands after the version's read.
        let after = if after == u64::MAX {
            t.store
                .state_version(&child())
                .await
                .expect("version")
                .get()
                + 1
        } else {
            after
        };
        let status = busy
            .session_status(&child(), Some(Sequence(after)), limit)
            .await
            .expect("session_status");
        let page = status.state_changes.expect("page");
        let seen: Vec<u64> = page.events.iter().map(|e| e.sequence.get()).collect();
        // The caller's limit bounds the page. (What the mutation did: the limit dropped, every
        // page as long as the largest; review of stop 67, CY25.)
        assert!(
            seen.len() <= limit.unwrap_or(usize::MAX),
            "after {after}: a page of limit {limit:?} holds {seen:?}"
        );
        let version = status.state_version.get();
        if let Some(last) = seen.last() {
            assert!(
                version >= *last,
                "version {version} below the page's last event: {seen:?}"
            );
        }
        if page.truncated {
            // Only the child's events land: a page cut short holds the next ones in a row.
            let expected: Vec<u64> = (after + 1..).take(limit.unwrap_or(seen.len())).collect();
            assert_eq!(
                seen, expected,
                "after {after}: a truncated page of limit {limit:?} holds {seen:?}"
            );
        } else {
            let expected: Vec<u64> = (after + 1..=version).collect();
            assert_eq!(
                seen, expected,
                "after {after}: version {version} but the page holds {seen:?}, not truncated"
            );
        }
        assert_eq!(
            page.version_ahead,
            after > version,
            "after {after}: version {version}"
        );
    }
}

/// Deletes the child once, right after the store first answers a call of its kind (`Heads`:
/// after the version's read).
struct DeletesOnceAfter(super::hooked::Call, std::sync::atomic::AtomicBool);

impl DeletesOnceAfter {
    fn new(call: super::hooked::Call) -> Self {
        Self(call, std::sync::atomic::AtomicBool::new(false))
    }
}

#[async_trait::async_trait]
impl super::hooked::Hook for DeletesOnceAfter {
    async fn after(&self, call: super::hooked::Call, store: &dyn AwarenessStore) {
        if call == self.0 && !self.1.swap(true, std::sync::atomic::Ordering::SeqCst) {
            store.delete_session(&child()).await.expect("delete");
        }
    }
}

/// A session deleted between `session_status`'s two reads: the version read first (3) is
/// gone, and the page finds no head under `N` = 2 (`versionAhead`). The answer describes the
/// session after the delete: version 0, and `versionAhead` agreeing with it. So it does from
/// `N` = 0, where the page cannot be ahead: it answered the version read before the delete
/// beside a page that found no session.
pub async fn session_status_across_a_delete_between_its_reads_agrees_with_itself(t: &Subject) {
    for (after, ahead) in [(2, true), (0, false)] {
        let racing = super::hooked::Hooked {
            inner: t.store.clone(),
            hook: DeletesOnceAfter::new(super::hooked::Call::Heads),
        };
        for _ in 0..3 {
            rec(t.store.as_ref(), human(&child()), T0).await;
        }
        let status = racing
            .session_status(&child(), Some(Sequence(after)), None)
            .await
            .expect("session_status");
        let page = status.state_changes.expect("page");
        assert!(page.events.is_empty(), "N = {after}: {:?}", page.events);
        assert_eq!(
            page.version_ahead, ahead,
            "N = {after} against a deleted session's head"
        );
        assert_eq!(
            page.earliest_available_sequence,
            Sequence::ZERO,
            "N = {after}"
        );
        assert_eq!(
            status.state_version,
            Sequence::ZERO,
            "N = {after}: the version of the session after the delete, not the one read before it"
        );
    }
}

/// Drops the child's head row once, its events staying (a hand edit, another application's
/// writer: [`RawAccess::delete_head_row`](super::RawAccess::delete_head_row)), right after the
/// first read of heads.
struct LosesTheHeadAfterTheVersion {
    raw: std::sync::Arc<dyn super::RawAccess>,
    done: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl super::hooked::Hook for LosesTheHeadAfterTheVersion {
    async fn after(&self, call: super::hooked::Call, _store: &dyn AwarenessStore) {
        if matches!(call, super::hooked::Call::Heads)
            && !self.done.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            self.raw
                .delete_head_row(&child())
                .await
                .expect("delete the head row");
        }
    }
}

/// A session whose head row is lost between `session_status`'s two reads, its events staying
/// (decision 0020): the page finds no head under `N` = 3 (`versionAhead`), and the version is
/// read again, as the method's docs say, so the answer is the session's version after the loss
/// (0, what a fresh read answers), not one neither read saw. (The check of a deleted session
/// above never takes that path, [`crate::reconcile::status`] answering 0 for a page with no
/// events; reading the version again could be dropped without a test failing: review of stop
/// 60.)
pub async fn session_status_across_a_head_lost_between_its_reads_reads_the_version_again(
    t: &Subject,
) {
    for _ in 0..3 {
        rec(t.store.as_ref(), human(&child()), T0).await;
    }
    let racing = super::hooked::Hooked {
        inner: t.store.clone(),
        hook: LosesTheHeadAfterTheVersion {
            raw: std::sync::Arc::clone(&t.raw),
            done: std::sync::atomic::AtomicBool::new(false),
        },
    };
    let status = racing
        .session_status(&child(), Some(Sequence(3)), None)
        .await
        .expect("session_status");
    let page = status.state_changes.clone().expect("page");
    assert!(page.version_ahead, "{status:?}");
    assert_eq!(
        t.store
            .state_version(&child())
            .await
            .expect("state_version"),
        Sequence::ZERO,
        "no head now"
    );
    assert_eq!(
        status.state_version,
        Sequence::ZERO,
        "the version after the loss: {status:?}"
    );
}

/// [`crate::AwarenessStoreExt::pending_of`] lists the pending cursors of the watchers it is
/// told exist, and nothing else: not a cursor that has seen everything (a fresh watch), not
/// one of a watcher it is told does not exist. (Listing every cursor passed every test: the
/// pick-ups and sweeps filter again; review of stop 60.)
pub async fn pending_of_lists_only_pending_cursors(t: &Subject) {
    let s = &*t.store;
    let other = r("agent:main:subagent:other", "main");
    s.watch(&w(MANAGER), &child(), T0).await.expect("watch");
    s.watch(&w(MANAGER), &other, T0).await.expect("watch");
    let every = |_: &crate::WatcherKey| true;
    assert!(
        s.pending_of(&every).await.expect("pending_of").is_empty(),
        "fresh cursors are not pending"
    );
    rec(s, human(&child()), T0).await;
    let pending = s.pending_of(&every).await.expect("pending_of");
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(
        (&pending[0].watcher, &pending[0].target),
        (&w(MANAGER), &child().session_key)
    );
    assert!(pending[0].is_pending());
    let nobody = |_: &crate::WatcherKey| false;
    assert!(
        s.pending_of(&nobody).await.expect("pending_of").is_empty(),
        "a watcher that does not exist"
    );
    // `exists` is asked once per watcher, however many of its cursors are pending (a
    // gateway's directory lookup). (What the mutation did: asked once per cursor; review of
    // stop 69, CQ21.)
    rec(s, human(&other), T0).await;
    let asked = std::sync::atomic::AtomicUsize::new(0);
    let counted = |_: &crate::WatcherKey| {
        asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        true
    };
    let pending = s.pending_of(&counted).await.expect("pending_of");
    assert_eq!(pending.len(), 2, "{pending:?}");
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "asked once for the one watcher"
    );
}

/// Deletes the child and watches it again (a cursor that has seen nothing) just before the
/// heads are listed.
struct DeletesBeforeHeads;

#[async_trait::async_trait]
impl super::hooked::Hook for DeletesBeforeHeads {
    async fn before(&self, call: super::hooked::Call, store: &dyn AwarenessStore) {
        if matches!(call, super::hooked::Call::ListHeads) {
            store.delete_session(&child()).await.expect("delete");
            store.watch(&w(MANAGER), &child(), T0).await.expect("watch");
        }
    }
}

/// The manager watches the child, which has one event (a notice pending).
async fn a_watched_child_with_an_event(t: &Subject) {
    t.store
        .watch(&w(MANAGER), &child(), T0)
        .await
        .expect("watch");
    rec(&*t.store, human(&child()), T0).await;
}

/// [`crate::audit::audit_store`] on a live store reports no problem that a write between its
/// reads made up: the child deleted and watched again after its events and the manager's
/// cursor on it were read looks like events without a head and an orphaned cursor, and is
/// neither.
pub async fn auditing_a_live_store_reports_no_problem_a_write_between_reads_made_up(t: &Subject) {
    a_watched_child_with_an_event(t).await;
    let live = super::hooked::Hooked {
        inner: t.store.clone(),
        hook: DeletesBeforeHeads,
    };
    let audit = crate::audit::audit_store(&live).await.expect("audit");
    assert!(audit.findings.is_empty(), "{:#?}", audit.findings);
    assert_eq!((audit.heads, audit.cursors), (0, 1), "what it read");
}

/// Deletes the child once its events are read, and records on it again once the heads are
/// listed; with `watch_again`, the manager watches it again then too, and with `unreadable`,
/// every page of its changes fails as a row the store cannot read would.
#[derive(Default)]
struct DeletedAndBack {
    deleted: std::sync::atomic::AtomicBool,
    back: std::sync::atomic::AtomicBool,
    watch_again: bool,
    unreadable: bool,
}

#[async_trait::async_trait]
impl super::hooked::Hook for DeletedAndBack {
    async fn after(&self, call: super::hooked::Call, store: &dyn AwarenessStore) {
        use std::sync::atomic::Ordering::SeqCst;
        if matches!(call, super::hooked::Call::EventsAfter) && !self.deleted.swap(true, SeqCst) {
            store.delete_session(&child()).await.expect("delete");
        }
        if matches!(call, super::hooked::Call::ListHeads) && !self.back.swap(true, SeqCst) {
            rec(store, human(&child()), T0.plus_ms(1)).await;
            if self.watch_again {
                store
                    .watch(&w(MANAGER), &child(), T0.plus_ms(1))
                    .await
                    .expect("watch");
            }
        }
    }

    fn refuse(&self, call: super::hooked::Call) -> Option<StoreError> {
        (self.unreadable && matches!(call, super::hooked::Call::ChangesSince))
            .then(|| StoreError::corrupt("event 9: a row that cannot be read"))
    }
}

/// The audit's fresh reads of what it found settle it against the store as it is then: a
/// cursor deleted (with its session) after the cursors were listed is no orphan, and a session
/// deleted after its events were read and recorded on again before the heads were listed has a
/// head, even when its page cannot be read. (Reporting the finding regardless, in either case,
/// passed every test: review of stop 60.)
pub async fn auditing_a_live_store_drops_findings_its_fresh_reads_settle(t: &Subject) {
    a_watched_child_with_an_event(t).await;
    let live = super::hooked::Hooked {
        inner: t.store.clone(),
        hook: DeletesOnceAfter::new(super::hooked::Call::Cursors),
    };
    let audit = crate::audit::audit_store(&live).await.expect("audit");
    assert!(
        audit.findings.is_empty(),
        "a cursor deleted between the reads: {:#?}",
        audit.findings
    );
    let live = super::hooked::Hooked {
        inner: t.store.clone(),
        hook: DeletedAndBack {
            unreadable: true,
            ..DeletedAndBack::default()
        },
    };
    rec(&*t.store, human(&child()), T0).await;
    let audit = crate::audit::audit_store(&live).await.expect("audit");
    assert!(
        audit.findings.is_empty(),
        "a session deleted and recorded on again between the reads: {:#?}",
        audit.findings
    );
    // The same with the page readable, and the manager watching it again: the fresh reads find
    // the session's head, which the events and the new cursor are within. (What the mutations
    // did: the fresh read of the session, or of the cursor, audited without the head it read,
    // so the events and the cursor were reported without a head; review of stop 69, CQ18 and
    // CQ19.)
    t.store
        .watch(&w(MANAGER), &child(), T0)
        .await
        .expect("watch");
    let live = super::hooked::Hooked {
        inner: t.store.clone(),
        hook: DeletedAndBack {
            watch_again: true,
            ..DeletedAndBack::default()
        },
    };
    let audit = crate::audit::audit_store(&live).await.expect("audit");
    assert!(
        audit.findings.is_empty(),
        "a session deleted, recorded on and watched again between the reads: {:#?}",
        audit.findings
    );
}

/// A session whose head row is gone (a hand edit; another application's writer) keeps its
/// events, and pruning them does not make a head for it: pruning raises the watermarks of the
/// heads there are and never creates one.
pub async fn pruning_never_creates_a_head(t: &Subject) {
    let s = &*t.store;
    let kept = r("agent:main:subagent:kept", "main");
    rec(s, log_only(&child(), "old"), T0).await;
    rec(s, log_only(&kept, "old"), T0).await;
    t.raw
        .delete_head_row(&child())
        .await
        .expect("delete a head row");
    let report = s
        .prune(&RetentionPolicy::default(), T0.plus_ms(31 * DAY))
        .await
        .expect("prune");
    assert_eq!(report.events_by_age, 2, "both events were old: {report:?}");
    assert_eq!(count(s).await, 0);
    assert!(
        s.heads(&[child()]).await.expect("heads").is_empty(),
        "pruning made a head for a session that had none"
    );
    let heads = s.list_heads(None).await.expect("list heads");
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert_eq!(heads[0].session, kept);
    assert_eq!(
        heads[0].pruned_max_sequence,
        Sequence(2),
        "the head there was"
    );
}

/// A session whose head row is gone (a hand edit; another application's writer) keeps its
/// events: a page of its changes still lists them, a new recording makes it a head again and
/// pages the old events with the new one, and deleting the session deletes them all.
pub async fn a_session_without_its_head_keeps_its_events(t: &Subject) {
    let s = &*t.store;
    let summaries = async || -> Vec<String> {
        s.changes_since(&child(), Sequence::ZERO, 200)
            .await
            .expect("changes_since")
            .events
            .iter()
            .map(|e| e.summary.clone())
            .collect()
    };
    rec(s, log_only(&child(), "first"), T0).await;
    rec(s, log_only(&child(), "second"), T0).await;
    t.raw
        .delete_head_row(&child())
        .await
        .expect("delete a head row");
    assert!(s.heads(&[child()]).await.expect("heads").is_empty());
    assert_eq!(summaries().await, ["first", "second"], "the events stay");
    let third = rec(s, log_only(&child(), "third"), T0).await.event.sequence;
    assert_eq!(
        s.state_version(&child()).await.expect("state_version"),
        third,
        "a head again"
    );
    assert_eq!(summaries().await, ["first", "second", "third"]);
    t.raw
        .delete_head_row(&child())
        .await
        .expect("delete a head row");
    s.delete_session(&child())
        .await
        .expect("delete the session");
    assert!(summaries().await.is_empty(), "deleted with the session");
    assert_eq!(count(s).await, 0, "nothing of it is left in the log");
}

/// The audit of a store ([`crate::audit::audit_store`], which `awareness doctor` runs) reports
/// what a lost head leaves: the session's retained events without a head, and a cursor that
/// has seen them with no head to compare against. A head row deleted by hand (or by another
/// application's writer) leaves the session's events and cursors in every store, store-memory
/// too ([`RawAccess::delete_head_row`](super::RawAccess::delete_head_row) touches nothing else,
/// as [`a_session_without_its_head_keeps_its_events`] checks), and the audit's fresh re-read of
/// the session's page still finds them.
pub async fn the_audit_reports_events_and_cursors_left_without_a_head(t: &Subject) {
    let s = &*t.store;
    rec(s, human(&child()), T0).await;
    rec(s, human(&child()), T0).await;
    s.watch(&w(MANAGER), &child(), T0).await.expect("watch");
    let cursor = s
        .cursor(&w(MANAGER), &child().session_key)
        .await
        .expect("cursor")
        .expect("the watch's cursor");
    assert_eq!(
        crate::audit::audit_store(s).await.expect("audit").findings,
        [],
        "a sound store"
    );
    t.raw
        .delete_head_row(&child())
        .await
        .expect("delete a head row");
    let findings = crate::audit::audit_store(s).await.expect("audit").findings;
    assert!(
        findings.contains(&crate::audit::Finding::EventsWithoutHead {
            session: child(),
            max: Sequence(2),
        }),
        "the events without a head: {findings:?}"
    );
    assert!(
        findings.contains(&crate::audit::Finding::OrphanedCursor(cursor)),
        "the cursor without a head: {findings:?}"
    );
    // A fresh read of the session's page that fails (a busy store) fails the audit with its
    // error, which a retry gets past, rather than confirm the finding. (What the mutation did:
    // the failure taken for the finding holding; review of stop 67, CY32.)
    let busy = super::hooked::Hooked {
        inner: t.store.clone(),
        hook: BusyPages,
    };
    let failed = crate::audit::audit_store(&busy).await;
    assert!(
        matches!(&failed, Err(e) if e.is_retryable()),
        "a busy fresh read: {failed:?}"
    );
}

/// The audit of a store reports a cursor past its target's head, as [`crate::audit::audit`]
/// finds it, beside what a lost head leaves: a cursor on a bare key whose session's head row
/// is gone is held to the highest head of the key's other sessions, which is below it. (What
/// the mutation did: the fresh reads kept only the events without a head and the orphaned
/// cursors, so `awareness doctor` never reported a cursor past its head, a torn cursor or a
/// watermark above its version; review of stop 69, CQ15.)
pub async fn the_audit_reports_a_cursor_past_its_head(t: &Subject) {
    let s = &*t.store;
    let global = |agent: &str| r("global", agent);
    rec(s, human(&global("ops")), T0).await;
    s.watch(&w(MANAGER), &global("main"), T0)
        .await
        .expect("watch");
    rec(s, human(&global("main")), T0).await;
    let cursor = s
        .cursor(&w(MANAGER), &global("main").session_key)
        .await
        .expect("cursor")
        .expect("the watch's cursor");
    assert_eq!(cursor.material, Sequence(2), "{cursor:?}");
    t.raw
        .delete_head_row(&global("main"))
        .await
        .expect("delete a head row");
    let findings = crate::audit::audit_store(s).await.expect("audit").findings;
    assert!(
        findings.contains(&crate::audit::Finding::CursorPastHead {
            cursor,
            head: Sequence(1),
        }),
        "the cursor past the key's highest head: {findings:?}"
    );
}

/// Refuses every read of heads as a row the store cannot read, with a cause.
struct UnreadableHeads;

impl super::hooked::Hook for UnreadableHeads {
    fn refuse(&self, call: super::hooked::Call) -> Option<StoreError> {
        matches!(call, super::hooked::Call::Heads).then(|| StoreError::Corrupt {
            context: format!("read head of {CHILD}"),
            source: Some(Box::new(std::io::Error::other("a torn row"))),
        })
    }
}

/// The audit (`awareness doctor`) of a session whose events are kept but whose head cannot be
/// read names that head with the store's error and its causes, and nothing else. (What the
/// mutation did: the reason was the error alone, without its cause, which no store's own
/// unreadable head could show, their errors having none; review of stop 70, AU14.)
pub async fn the_audit_names_an_unreadable_head_with_its_causes(t: &Subject) {
    rec(&*t.store, human(&child()), T0).await;
    t.raw
        .delete_head_row(&child())
        .await
        .expect("delete a head row");
    let store = super::hooked::Hooked {
        inner: t.store.clone(),
        hook: UnreadableHeads,
    };
    let audit = crate::audit::audit_store(&store)
        .await
        .expect("an audit over the unreadable head");
    let [crate::audit::Finding::UnreadableHead { session, reason }] = &audit.findings[..] else {
        panic!("the unreadable head alone: {:?}", audit.findings)
    };
    assert_eq!(session, &child());
    assert_eq!(
        *reason,
        format!("corrupt store: read head of {CHILD}: a torn row"),
        "the error with its cause"
    );
}

/// Refuses every page of changes as a busy store does.
struct BusyPages;

#[async_trait::async_trait]
impl super::hooked::Hook for BusyPages {
    fn refuse(&self, call: super::hooked::Call) -> Option<StoreError> {
        matches!(call, super::hooked::Call::ChangesSince).then(|| StoreError::Busy {
            context: "read changes".into(),
            source: "database is locked".into(),
        })
    }
}

/// After recordings (with a dedupe hit), watches, an acknowledgement, pruning by age and a
/// deleted session, what the store holds breaks none of [`crate::audit`]'s invariants.
pub async fn a_store_keeps_the_audit_invariants(t: &Subject) {
    let s = &*t.store;
    let manager = w(MANAGER);
    let (kid, old, gone) = (
        child(),
        r("agent:main:old", "main"),
        r("agent:main:gone", "main"),
    );
    rec(s, log_only(&old, "old"), T0).await;
    s.watch(&manager, &kid, T0).await.expect("watch");
    s.watch(&manager, &gone, T0).await.expect("watch");
    for _ in 0..3 {
        rec(s, human(&kid), T0.plus_ms(2 * DAY)).await;
        rec(s, human(&gone), T0.plus_ms(2 * DAY)).await;
    }
    rec(s, human(&kid).with_dedupe_key("once"), T0.plus_ms(2 * DAY)).await;
    rec(s, human(&kid).with_dedupe_key("once"), T0.plus_ms(2 * DAY)).await;
    s.acknowledge(
        &manager,
        &[AckTarget::any(kid.session_key.clone())],
        T0.plus_ms(2 * DAY),
    )
    .await
    .expect("acknowledge");
    rec(s, human(&kid), T0.plus_ms(2 * DAY)).await;
    s.prune_chunk(
        &PruneStep::Age {
            cutoff: T0.plus_ms(DAY),
        },
        100,
        T0.plus_ms(31 * DAY),
    )
    .await
    .expect("prune");
    s.delete_session(&gone).await.expect("delete");
    let heads = s.list_heads(None).await.expect("heads");
    let events = s.events_after(Sequence::ZERO, 1_000).await.expect("events");
    let cursors = s.cursors(&CursorFilter::default()).await.expect("cursors");
    assert!(!heads.is_empty() && !events.is_empty() && !cursors.is_empty());
    let found = crate::audit::audit(&heads, &events, &cursors);
    assert!(found.is_empty(), "broken invariants: {found:#?}");
}
