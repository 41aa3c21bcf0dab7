//! Group commit (decision 0005), checked the same way on every store that batches concurrent
//! recordings into shared write transactions: the durable ones. store-memory has no
//! transactions to share and does not run these.
//!
//! A store provides an async factory that opens a fresh store on the file it is given with
//! `group_commit(max_events)` and stamps the checks with [`crate::group_commit_suite!`]:
//!
//! ```text
//! async fn open(path: std::path::PathBuf, max_events: usize)
//!     -> Result<awareness_core::testkit::group_commit::Grouped, awareness_core::StoreError>
//! { /* open the store with that option */ }
//! awareness_core::group_commit_suite!(open);
//! ```
//!
//! What a store does to batch (its queue, its drain) is its own; these checks hold only what a
//! caller can see: every caller's own event, distinct sequences, fewer write transactions than
//! recordings, none larger than `group_commit`, and `0` refused at open.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use super::{Scratch, observe, poll_once};
use crate::error::{OpenFailure, StoreError};
use crate::model::{ActorType, EventKind, NewEvent, Sequence, SessionRef, Timestamp, WatcherKey};
use crate::store::{AwarenessStore, AwarenessStoreExt as _, Recorded};

/// The store factory of these checks: an async function that opens the file it is given with
/// that `group_commit`, such as
/// `async fn open(path: PathBuf, max_events: usize) -> Result<Grouped, StoreError>`.
pub trait OpenGrouped: AsyncFn(PathBuf, usize) -> Result<Grouped, StoreError> {}

impl<F: AsyncFn(PathBuf, usize) -> Result<Grouped, StoreError>> OpenGrouped for F {}

/// A store opened for a group-commit check, and how many write transactions it has committed.
pub struct Grouped {
    /// The store, as a gateway holds it.
    pub store: Arc<dyn AwarenessStore>,
    /// The store's count of committed write transactions (`write_transactions()`).
    pub write_transactions: Box<dyn Fn() -> u64 + Send + Sync>,
    /// The most recordings one of the store's write transactions has held (`largest_batch()`).
    pub largest_batch: Box<dyn Fn() -> usize + Send + Sync>,
    /// Raw row access to the same store, for the checks that damage a row.
    pub raw: Arc<dyn super::RawAccess>,
}

impl Grouped {
    /// `store`, its counts read through its own `write_transactions` and `largest_batch`, and
    /// `raw`, its row access.
    pub fn new<S: AwarenessStore + 'static>(
        store: Arc<S>,
        write_transactions: fn(&S) -> u64,
        largest_batch: fn(&S) -> usize,
        raw: Arc<dyn super::RawAccess>,
    ) -> Self {
        let (counted, measured) = (Arc::clone(&store), Arc::clone(&store));
        Self {
            store,
            write_transactions: Box::new(move || write_transactions(&counted)),
            largest_batch: Box::new(move || largest_batch(&measured)),
            raw,
        }
    }
}

/// The clock every recording of these checks is made at.
pub const T0: Timestamp = Timestamp(1_800_000_000_000);

/// The `i`-th session of these checks (`agent:main:subagent:s{i}`, agent `main`).
pub fn session(i: usize) -> SessionRef {
    SessionRef::parse(&format!("agent:main:subagent:s{i}"), "main").expect("ref")
}

/// The `i`-th recording of these checks: a human message on one of four sessions.
pub fn event(i: usize) -> NewEvent {
    NewEvent::new(
        session(i % 4),
        EventKind::HumanDirectMessage,
        ActorType::Human,
        format!("message {i}"),
    )
}

/// Records each event at its clock on a task of its own, all at once; returns the callers'
/// answers in the order given.
async fn record_concurrently(
    store: &Arc<dyn AwarenessStore>,
    events: impl IntoIterator<Item = (NewEvent, Timestamp)>,
) -> Vec<Recorded> {
    let tasks: Vec<_> = events
        .into_iter()
        .map(|(e, now)| {
            let store = Arc::clone(store);
            tokio::spawn(async move { store.record(e, now).await })
        })
        .collect();
    let mut answers = Vec::with_capacity(tasks.len());
    for (i, t) in tasks.into_iter().enumerate() {
        let got = t.await.expect("join");
        answers.push(got.unwrap_or_else(|e| panic!("record call {i}: {e}")));
    }
    answers
}

/// Records `n` events on `n` tasks at once; checks that each caller got its own event under a
/// distinct sequence and answers the write transactions they took.
async fn record_at_once(g: &Grouped, n: usize) -> u64 {
    let before = (g.write_transactions)();
    let answers = record_concurrently(&g.store, (0..n).map(|i| (event(i), T0))).await;
    let mut seqs = BTreeSet::new();
    for (i, rec) in answers.iter().enumerate() {
        assert_eq!(rec.event.summary, format!("message {i}"), "its own event");
        assert!(!rec.deduplicated);
        assert!(seqs.insert(rec.event.sequence), "distinct sequences");
    }
    (g.write_transactions)() - before
}

async fn open(open: &impl OpenGrouped, file: PathBuf, max_events: usize) -> Grouped {
    open(file, max_events)
        .await
        .unwrap_or_else(|e| panic!("open with group_commit({max_events}): {e}"))
}

/// 64 concurrent recordings take fewer than 64 write transactions; the log holds all 64 and a
/// watcher's cursor saw the last event on its target.
pub async fn concurrent_recordings_share_write_transactions(f: impl OpenGrouped) {
    let dir = Scratch::new("group-commit");
    let g = open(&f, dir.file(), 64).await;
    let watcher = WatcherKey::parse("agent:main:main").expect("watcher");
    g.store
        .watch(&watcher, &session(0), T0)
        .await
        .expect("watch");
    let txs = record_at_once(&g, 64).await;
    assert!(
        txs < 64,
        "64 concurrent recordings took {txs} write transactions: none were grouped"
    );
    assert_eq!(g.store.log_stats().await.expect("stats").rows, 64);
    let cursor = g
        .store
        .cursor(&watcher, &session(0).session_key)
        .await
        .expect("cursor")
        .expect("exists");
    assert_eq!(cursor.last_seen, Sequence(0));
    assert_eq!(
        cursor.material,
        g.store.state_version(&session(0)).await.expect("head"),
        "the cursor saw the last event on its target"
    );
}

/// A cursor row the store cannot read (decision 0016) fails no batch on its target: 64
/// concurrent recordings there still share write transactions, the readable watcher's cursor
/// sees the last event, and the damaged row stays as it was, listed as unreadable. (A batch
/// that failed on the row would still answer every caller, its events recorded again one per
/// transaction: only the count of write transactions, then at least one per recording, shows
/// it.)
pub async fn a_batch_on_a_target_with_an_unreadable_cursor_row_commits(f: impl OpenGrouped) {
    let dir = Scratch::new("group-commit");
    let g = open(&f, dir.file(), 64).await;
    let target = session(0);
    let reader = WatcherKey::parse("agent:main:subagent:reader").expect("watcher");
    let damaged = WatcherKey::parse("agent:main:subagent:damaged").expect("watcher");
    for w in [&reader, &damaged] {
        g.store.watch(w, &target, T0).await.expect("watch");
    }
    assert!(
        g.raw
            .damage_cursor_row(&damaged, &target.session_key)
            .await
            .expect("damage the row"),
        "the damaged watcher's row exists"
    );
    let before = (g.write_transactions)();
    let on_target = (0..64).map(|i| {
        let e = NewEvent::new(
            target.clone(),
            EventKind::HumanDirectMessage,
            ActorType::Human,
            format!("message {i}"),
        );
        (e, T0)
    });
    let answers = record_concurrently(&g.store, on_target).await;
    let txs = (g.write_transactions)() - before;
    assert!(
        txs < 64,
        "64 concurrent recordings on a target with an unreadable cursor row took {txs} write \
         transactions: a batch failed on the row, or none were grouped"
    );
    let last = answers
        .iter()
        .map(|r| r.event.sequence)
        .max()
        .expect("answers");
    let cursor = g
        .store
        .cursor(&reader, &target.session_key)
        .await
        .expect("the readable cursor")
        .expect("exists");
    assert_eq!(
        cursor.material, last,
        "the readable watcher saw the last event"
    );
    let unreadable = g.store.unreadable_cursors().await.expect("unreadable");
    assert_eq!(
        unreadable
            .iter()
            .map(|u| (u.watcher.as_str(), u.target.as_str()))
            .collect::<Vec<_>>(),
        [(damaged.as_str(), target.session_key.as_str())],
        "the damaged row stays as it was"
    );
}

/// Recordings in batches over refs whose heads cannot be read, each beside another agent's
/// session of the same key recorded just before it, stamp each such head's watermark just below
/// the ref's own event (`protocol::head_over_unreadable`), not below the other agent's. 32
/// pairs, so that the order in which a batch writes its heads cannot hide it. (What the mutation
/// did: store-sqlite matching the batch's first sequence by key alone, a head's watermark stood
/// below another agent's event: review of stop 63, Q32.)
pub async fn a_batch_over_an_unreadable_head_stamps_it_below_its_own_event(f: impl OpenGrouped) {
    let dir = Scratch::new("group-commit");
    let g = open(&f, dir.file(), 64).await;
    let pair = |i: usize| {
        let key = format!("agent:main:subagent:k{i}");
        (
            SessionRef::parse(&key, "alpha").expect("ref"),
            SessionRef::parse(&key, "beta").expect("ref"),
        )
    };
    let human = |session: &SessionRef| {
        let e = NewEvent::new(
            session.clone(),
            EventKind::HumanDirectMessage,
            ActorType::Human,
            "typed",
        );
        (e, T0)
    };
    for i in 0..32 {
        let (damaged, _) = pair(i);
        let (e, now) = human(&damaged);
        g.store.record(e, now).await.expect("record");
        assert!(
            g.raw.damage_head_row(&damaged).await.expect("damage"),
            "a head to damage"
        );
    }
    let before = (g.write_transactions)();
    let recordings = (0..32).flat_map(|i| {
        let (damaged, other) = pair(i);
        [human(&other), human(&damaged)]
    });
    record_concurrently(&g.store, recordings).await;
    let txs = (g.write_transactions)() - before;
    assert!(
        txs < 64,
        "64 concurrent recordings took {txs} write transactions: none were grouped"
    );
    for i in 0..32 {
        let (damaged, _) = pair(i);
        let head = g
            .store
            .heads(std::slice::from_ref(&damaged))
            .await
            .expect("the head is readable again")
            .remove(0);
        assert_eq!(
            head.pruned_max_sequence,
            Sequence(head.last_sequence.get() - 1),
            "the watermark just below the ref's own event: {head:?}"
        );
    }
}

/// After rounds of 64 concurrent recordings on four sessions, each with its own clock and some
/// sharing a dedupe key, every head is its ref's last recorded event, stamped with that
/// recording's clock, and every dedupe hit answers the event stored under its key. Rounds run
/// without a watcher and then with one on a session, so batches with and without cursors on
/// their targets are both checked.
pub async fn concurrent_recordings_leave_each_head_at_its_last_event(f: impl OpenGrouped) {
    let dir = Scratch::new("group-commit");
    let g = open(&f, dir.file(), 64).await;
    let sessions: Vec<SessionRef> = (0..4).map(session).collect();
    let mut last: Vec<Option<(Sequence, Timestamp)>> = vec![None; 4];
    // The sequence stored under each dedupe key, over all rounds: later rounds' hits answer
    // events of earlier ones.
    let mut by_key = std::collections::HashMap::new();
    for round in 0..4_usize {
        if round == 2 {
            let watcher = WatcherKey::parse("agent:main:main").expect("watcher");
            g.store
                .watch(&watcher, &sessions[1], T0)
                .await
                .expect("watch");
        }
        let clock = |n: usize| Timestamp(T0.0 + i64::try_from(n).expect("small"));
        let events = (0..64_usize).map(|i| {
            let n = round * 64 + i;
            // Occurred before it is recorded, so that the head's clock cannot be mistaken for
            // the event's.
            let mut e = event(n).with_occurred_at(T0);
            if i % 5 == 0 {
                // Five keys, the same in every round: the first round stores them (and hits
                // them too), every later round only hits them.
                e = e.with_dedupe_key(format!("key-{}", (i / 5) % 5));
            }
            (e, clock(n))
        });
        let mut hits = Vec::new();
        for (i, rec) in record_concurrently(&g.store, events)
            .await
            .into_iter()
            .enumerate()
        {
            let (n, now) = (round * 64 + i, clock(round * 64 + i));
            let asked = (i % 5 == 0).then(|| format!("key-{}", (i / 5) % 5));
            assert_eq!(
                rec.event.dedupe_key, asked,
                "round {round}, call {i}: the event of the key it asked for"
            );
            if rec.deduplicated {
                hits.push(rec);
                continue;
            }
            assert_eq!(rec.event.summary, format!("message {n}"), "its own event");
            if let Some(key) = &rec.event.dedupe_key {
                by_key.insert(key.clone(), rec.event.sequence);
            }
            let l = &mut last[n % 4];
            if l.is_none_or(|(s, _)| s < rec.event.sequence) {
                *l = Some((rec.event.sequence, now));
            }
        }
        // Thirteen recordings of each round have a key, five keys in all: the first round
        // stores five and hits them eight times; after it each is a hit on an event the first
        // round stored.
        assert_eq!(
            hits.len(),
            if round == 0 { 8 } else { 13 },
            "round {round}: dedupe hits"
        );
        for hit in hits {
            let key = hit.event.dedupe_key.as_ref().expect("a hit has a key");
            let seq = by_key
                .get(key)
                .unwrap_or_else(|| panic!("round {round}: a hit on {key:?}, which nothing stored"));
            assert_eq!(hit.event.sequence, *seq, "the hit answers the stored event");
        }
        let heads = g.store.heads(&sessions).await.expect("heads");
        assert_eq!(heads.len(), 4, "round {round}: a head per session");
        for h in heads {
            let i = sessions
                .iter()
                .position(|s| *s == h.session)
                .expect("asked for");
            let (seq, now) = last[i].expect("recorded");
            assert_eq!(
                (h.last_sequence, h.updated_at),
                (seq, now),
                "round {round}: the head of session {i} is its last event"
            );
        }
    }
}

/// Text recorded in shared write transactions reads back exactly, as the conformance suite's
/// `text_fields_round_trip_exactly` checks for a recording made alone: 32 events whose text
/// fields hold quotes, backslashes, escape look-alikes and characters outside the BMP (and
/// control characters in their payloads), half of them on a watched session, recorded at
/// once; each caller's event is what a page, `events_after` and a later dedupe hit read back.
pub async fn text_recorded_in_a_batch_reads_back_exactly(f: impl OpenGrouped) {
    use crate::testkit::checks::{tricky_event, tricky_session};
    let dir = Scratch::new("group-commit");
    let g = open(&f, dir.file(), 64).await;
    let sessions = [tricky_session(), session(0)];
    let watcher = WatcherKey::parse("agent:main:main").expect("watcher");
    g.store
        .watch(&watcher, &sessions[1], T0)
        .await
        .expect("watch");
    let before = (g.write_transactions)();
    let events = (0..32_usize).map(|i| (tricky_event(sessions[i % 2].clone(), &i.to_string()), T0));
    let mut recorded = Vec::new();
    for rec in record_concurrently(&g.store, events).await {
        assert!(!rec.deduplicated);
        recorded.push(rec.event);
    }
    let txs = (g.write_transactions)() - before;
    assert!(
        txs < 32,
        "32 concurrent recordings took {txs} write transactions"
    );
    let tail = g.store.events_after(Sequence(0), 100).await.expect("tail");
    for s in &sessions {
        let page = g
            .store
            .changes_since(s, Sequence(0), 200)
            .await
            .expect("page");
        let mine: Vec<_> = recorded.iter().filter(|e| e.session_ref() == *s).collect();
        assert_eq!(page.events.len(), mine.len());
        for e in mine {
            let read = page
                .events
                .iter()
                .find(|p| p.sequence == e.sequence)
                .expect("on the page");
            assert_eq!(**read, **e, "the page reads back what was recorded");
            let read = tail
                .iter()
                .find(|p| p.sequence == e.sequence)
                .expect("in events_after");
            assert_eq!(**read, **e, "events_after reads back what was recorded");
        }
    }
    let again = recorded
        .iter()
        .enumerate()
        .map(|(i, e)| (tricky_event(e.session_ref(), &i.to_string()), T0));
    let hits = record_concurrently(&g.store, again).await;
    for (hit, e) in hits.into_iter().zip(&recorded) {
        assert!(hit.deduplicated);
        assert_eq!(*hit.event, **e, "a dedupe hit reads back what was recorded");
    }
}

/// The `i`-th recording of [`a_batch_answers_as_its_recordings_one_at_a_time`]: human messages
/// on four sessions (two of them watched), every eighth one under a shared dedupe key (the
/// first stored, the rest hits), log-only events, children spawned with their spawner named as
/// watcher (a cursor created, or reseeded, inside the batch), and messages on those children.
fn mixed(i: usize) -> NewEvent {
    use crate::testkit::checks::{human, log_only, spawn};
    let child = session(4 + (i / 12) % 3);
    if i % 8 == 7 {
        human(&session(i % 4)).with_dedupe_key("shared")
    } else if i % 12 == 5 {
        spawn(&child, "agent:main:main", &format!("run-{i}"))
    } else if i % 12 == 9 {
        human(&child)
    } else if i % 6 == 2 {
        log_only(&session(i % 4), &format!("created {i}"))
    } else {
        event(i)
    }
}

/// Recordings that share write transactions answer, and leave the store, exactly as the same
/// recordings made one transaction each in the order of the sequences they were given: 48
/// recordings of `mixed` at once on a store with `group_commit(64)` and two watchers, then
/// the same events one by one on a second store with `group_commit(1)`, in that order (a dedupe
/// hit, which leaves no sequence behind, replayed where a sequence is missing). Every answer
/// (event, notices, hit or not) and the two stores' heads, cursors, events and pages are equal.
pub async fn a_batch_answers_as_its_recordings_one_at_a_time(f: impl OpenGrouped) {
    const N: usize = 48;
    let (dir_a, dir_b) = (Scratch::new("group-commit"), Scratch::new("group-commit"));
    let batched = open(&f, dir_a.file(), 64).await;
    let alone = open(&f, dir_b.file(), 1).await;
    for g in [&batched, &alone] {
        for (watcher, target) in [("agent:main:main", 0), ("agent:ops:main", 1)] {
            let watcher = WatcherKey::parse(watcher).expect("watcher");
            g.store
                .watch(&watcher, &session(target), T0)
                .await
                .expect("watch");
        }
    }
    let before = (batched.write_transactions)();
    let answers = record_concurrently(&batched.store, (0..N).map(|i| (mixed(i), T0))).await;
    let txs = (batched.write_transactions)() - before;
    assert!(
        txs < N as u64,
        "{N} recordings at once took {txs} transactions"
    );

    // The order the batches gave them: each stored event at its sequence, a hit in each gap.
    let mut by_sequence = std::collections::BTreeMap::new();
    let mut hits = Vec::new();
    for (i, rec) in answers.iter().enumerate() {
        if rec.deduplicated {
            hits.push(i);
        } else {
            let seq = rec.event.sequence.get();
            assert!(
                (1..=N as u64).contains(&seq),
                "call {i} got sequence {seq}, outside the {N} spent"
            );
            assert!(by_sequence.insert(seq, i).is_none(), "sequence {seq} twice");
        }
    }
    assert_eq!(
        hits.len(),
        N / 8 - 1,
        "every shared key but the first is a hit"
    );
    assert!(
        answers.iter().any(|r| !r.notices.is_empty()),
        "some recordings notify"
    );
    let mut hits = hits.into_iter();
    for seq in 1..=N as u64 {
        let i = match by_sequence.get(&seq) {
            Some(&i) => i,
            None => hits.next().expect("a hit for each sequence no event holds"),
        };
        let got = alone.store.record(mixed(i), T0).await.expect("record");
        assert_eq!(
            got, answers[i],
            "call {i}, at sequence {seq}: the batched answer differs from one transaction per event"
        );
    }
    assert!(hits.next().is_none(), "as many gaps as hits");
    let refs: Vec<SessionRef> = (0..7).map(session).collect();
    assert_eq!(
        observe(&*batched.store, &refs).await,
        observe(&*alone.store, &refs).await,
        "the two stores hold the same"
    );
}

/// 64 concurrent recordings (some sharing a dedupe key) on a store with 16 sequences left
/// ([`super::RawAccess::leave_sequences`]) cross the end of its counter, inside a batch or
/// between two: exactly 16 callers are answered (an event stored under a sequence of its own
/// among the last 16, or a dedupe hit, which consumes one too), every other one gets the error
/// of a recording at the end ([`crate::StoreError::is_counter_at_end`]), and nothing is torn:
/// the log holds the events stored before and the 16 answers' events, each as answered, each
/// head is its ref's last stored event, and the watcher's cursor saw its target's. A recording
/// after them fails too and changes nothing.
pub async fn recordings_crossing_the_end_of_the_counter_commit_only_those_that_fit(
    f: impl OpenGrouped,
) {
    const LEFT: usize = 16;
    let dir = Scratch::new("group-commit");
    let g = open(&f, dir.file(), 64).await;
    let watcher = WatcherKey::parse("agent:main:main").expect("watcher");
    g.store
        .watch(&watcher, &session(0), T0)
        .await
        .expect("watch");
    let first = g.store.record(event(64), T0).await.expect("record");
    assert!(
        g.raw
            .leave_sequences(LEFT as u64)
            .await
            .expect("leave_sequences"),
        "the counter moved up to {LEFT} numbers before its end"
    );
    let events = (0..64_usize).map(|i| {
        let e = event(i);
        if i % 8 == 0 {
            (e.with_dedupe_key(format!("key-{}", i % 16)), T0)
        } else {
            (e, T0)
        }
    });
    let tasks: Vec<_> = events
        .map(|(e, now)| {
            let store = Arc::clone(&g.store);
            tokio::spawn(async move { store.record(e, now).await })
        })
        .collect();
    let mut stored = std::collections::BTreeMap::new();
    let mut hits = Vec::new();
    let mut refused = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.expect("join") {
            Ok(rec) if rec.deduplicated => {
                assert_eq!(
                    rec.event.dedupe_key,
                    Some(format!("key-{}", i % 16)).filter(|_| i % 8 == 0),
                    "call {i}: a hit on the key it asked for"
                );
                hits.push(rec);
            }
            Ok(rec) => {
                assert_eq!(rec.event.summary, format!("message {i}"), "its own event");
                let seq = rec.event.sequence;
                assert!(
                    stored.insert(seq, rec.event).is_none(),
                    "sequence {seq:?} twice"
                );
            }
            Err(e) => {
                assert!(
                    super::checks::is_counter_at_end(&e),
                    "call {i}: the error of a recording at the end of the counter, got {e:?}"
                );
                refused += 1;
            }
        }
    }
    assert_eq!(
        stored.len() + hits.len(),
        LEFT,
        "as many callers answered as numbers were left ({} stored, {} hits, {refused} refused)",
        stored.len(),
        hits.len()
    );
    let (low, high) = (
        stored.keys().next().expect("some stored").get(),
        stored.keys().next_back().expect("some stored").get(),
    );
    assert!(
        low > first.event.sequence.get() && high - low < LEFT as u64,
        "the stored events hold {low}..={high}, within the last {LEFT} numbers"
    );
    for hit in &hits {
        let key = hit.event.dedupe_key.as_ref().expect("a hit has a key");
        assert!(
            stored.values().any(|e| e == &hit.event),
            "the hit on {key:?} answers an event stored in the same round"
        );
    }
    let log = g
        .store
        .events_after(Sequence::ZERO, 1_000)
        .await
        .expect("events");
    let expected: Vec<_> = std::iter::once(&first.event)
        .chain(stored.values())
        .cloned()
        .collect();
    assert_eq!(log, expected, "the log holds exactly the events answered");
    let refs: Vec<SessionRef> = (0..4).map(session).collect();
    let heads = g.store.heads(&refs).await.expect("heads");
    let with_events: std::collections::BTreeSet<_> =
        expected.iter().map(|e| e.session_ref()).collect();
    assert_eq!(
        heads.len(),
        with_events.len(),
        "a head for each session with a stored event"
    );
    for h in heads {
        let last = expected
            .iter()
            .filter(|e| e.session_ref() == h.session)
            .map(|e| e.sequence)
            .max();
        assert_eq!(
            Some(h.last_sequence),
            last,
            "the head of {} is its last stored event",
            h.session
        );
    }
    let cursor = g
        .store
        .cursor(&watcher, &session(0).session_key)
        .await
        .expect("cursor")
        .expect("exists");
    assert_eq!(
        cursor.material,
        g.store.state_version(&session(0)).await.expect("head"),
        "the cursor saw the last event on its target"
    );
    let before = observe(&*g.store, &refs).await;
    let err = g.store.record(event(65), T0).await.unwrap_err();
    assert!(super::checks::is_counter_at_end(&err), "{err:?}");
    assert_eq!(
        observe(&*g.store, &refs).await,
        before,
        "the refused recording changed nothing"
    );
}

/// `group_commit(1)` is one write transaction per recording, however many arrive at once, and
/// the store says so: its largest batch is 1 once it has recorded (0 before). (What the mutation
/// did: store-sqlite's path that records without the queue never counted, and its largest batch
/// stayed 0; review of stop 66, S504.)
pub async fn group_commit_of_one_commits_every_recording_alone(f: impl OpenGrouped) {
    let dir = Scratch::new("group-commit");
    let g = open(&f, dir.file(), 1).await;
    assert_eq!((g.largest_batch)(), 0, "nothing recorded yet");
    assert_eq!(record_at_once(&g, 32).await, 32);
    assert_eq!(
        (g.largest_batch)(),
        1,
        "each transaction held one recording"
    );
}

/// No write transaction holds more than `group_commit` recordings: 32 at once with
/// `group_commit(4)` take at least 8, and the largest batch the store reports is at most 4.
pub async fn a_batch_holds_at_most_group_commit_recordings(f: impl OpenGrouped) {
    let dir = Scratch::new("group-commit");
    let g = open(&f, dir.file(), 4).await;
    let txs = record_at_once(&g, 32).await;
    assert!(txs >= 8, "32 recordings in {txs} transactions of at most 4");
    let largest = (g.largest_batch)();
    assert!(
        (1..=4).contains(&largest),
        "the largest batch held {largest} recordings, with group_commit(4)"
    );
}

/// A recording polled outside a Tokio runtime (by hand, on a thread that entered none) fails
/// at once with an error saying so, where it would have queued its event for a batch it could
/// not commit; it leaves nothing queued, so the next recording, inside a runtime, is answered,
/// with the first sequence and alone in its batch.
pub async fn a_recording_outside_a_runtime_fails_and_queues_nothing(f: impl OpenGrouped) {
    use std::task::{Context, Poll, Waker};
    let dir = Scratch::new("group-commit");
    let g = open(&f, dir.file(), 16).await;
    let store = Arc::clone(&g.store);
    let outside = std::thread::spawn(move || {
        let mut call = store.record(event(0), T0);
        match call.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Err(StoreError::Backend { context, .. })) => Ok(context),
            other => Err(format!("{:?}", other.map(|r| r.map(drop)))),
        }
    })
    .join()
    .expect("the thread outside a runtime");
    match outside {
        Ok(context) => assert!(context.contains("outside a Tokio runtime"), "{context}"),
        Err(other) => panic!("a recording outside a runtime: {other}"),
    }
    let later = std::time::Duration::from_secs(30);
    let rec = tokio::time::timeout(later, g.store.record(event(1), T0))
        .await
        .expect("a recording inside a runtime, after one outside, was never answered")
        .expect("record");
    assert_eq!(
        rec.event.sequence,
        Sequence(1),
        "nothing was recorded outside"
    );
    assert_eq!(
        (g.largest_batch)(),
        1,
        "the batch held this recording alone"
    );
}

/// What a call driven outside a Tokio runtime did
/// ([`writes_outside_a_runtime_fail_and_leave_the_handle_working`]).
#[derive(Debug)]
#[expect(
    dead_code,
    reason = "the fields are read through Debug, in the check's message"
)]
enum Outside {
    /// Answered with `Ok`: the store could do it without a runtime.
    Answered,
    /// Failed with [`StoreError::Backend`] saying it was called outside a Tokio runtime.
    Refused,
    /// Answered another error: the error.
    Failed(String),
    /// Still pending at the deadline, never woken to finish.
    Stuck,
    /// Panicked, with the panic's message.
    Panicked(String),
}

/// Wakes the thread that drives a call outside a runtime ([`drive_outside`]).
struct Unpark(std::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// A call of the store's traits, as `async_trait` returns it.
type Call<'a, T> = std::pin::Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Drives a store call to its answer on this thread, which entered no Tokio runtime, as a
/// caller that polls the store's futures itself does (parked between polls until woken), until
/// `deadline` at the latest; a panic is caught, so that what it leaves behind can be checked
/// too.
fn drive_outside<'a, T>(
    deadline: std::time::Instant,
    call: impl FnOnce() -> Call<'a, T>,
) -> Outside {
    match drive(deadline, call) {
        Ok(Some(Ok(_))) => Outside::Answered,
        Ok(Some(Err(StoreError::Backend { context, .. })))
            if context.contains("outside a Tokio runtime") =>
        {
            Outside::Refused
        }
        Ok(Some(Err(e))) => Outside::Failed(crate::error::ErrorChain(&e).to_string()),
        Ok(None) => Outside::Stuck,
        Err(panic) => Outside::Panicked(panic),
    }
}

/// Drives a store call on this thread, which entered no Tokio runtime, parked between polls
/// until woken, until `deadline` at the latest: its answer, `None` when it had none by then,
/// or the message of its panic.
fn drive<'a, T>(
    deadline: std::time::Instant,
    call: impl FnOnce() -> Call<'a, T>,
) -> Result<Option<Result<T, StoreError>>, String> {
    use std::task::{Context, Poll, Waker};
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut call = call();
        loop {
            if let Poll::Ready(answer) = call.as_mut().poll(&mut Context::from_waker(&waker)) {
                return Some(answer);
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return None;
            }
            std::thread::park_timeout(deadline - now);
        }
    }))
    .map_err(|panic| crate::error::panic_message(&*panic).to_owned())
}

/// For a store that runs its work on a runtime of its own: recordings made outside any Tokio
/// runtime (each polled by hand on a thread that entered none, parked until woken, as a
/// caller that polls the store's futures itself does) are answered. One alone gets the first
/// sequence; then eight at once, each on a thread of its own (they queue behind each other,
/// and may share batches), each get their own event under distinct sequences; a recording
/// made inside a runtime afterwards gets the next sequence, and the log holds the ten.
pub async fn a_recording_outside_a_runtime_is_answered(f: impl OpenGrouped) {
    let dir = Scratch::new("group-commit");
    let g = open(&f, dir.file(), 16).await;
    let outside = |from: usize, n: usize| {
        let threads: Vec<_> = (from..from + n)
            .map(|i| {
                let store = Arc::clone(&g.store);
                std::thread::spawn(move || {
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                    match drive(deadline, || store.record(event(i), T0)) {
                        Ok(Some(Ok(rec))) => rec,
                        Ok(Some(Err(e))) => panic!("recording {i} outside a runtime: {e}"),
                        Ok(None) => panic!("recording {i} outside a runtime was never answered"),
                        Err(panic) => panic!("recording {i} outside a runtime panicked: {panic}"),
                    }
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a recording's thread"))
            .collect::<Vec<_>>()
    };
    let alone = outside(0, 1);
    assert_eq!(alone[0].event.sequence, Sequence(1), "the first sequence");
    let wave = outside(1, 8);
    let mut seqs = BTreeSet::new();
    for (rec, i) in wave.iter().zip(1..) {
        assert_eq!(rec.event.summary, format!("message {i}"), "its own event");
        assert!(seqs.insert(rec.event.sequence), "distinct sequences");
    }
    assert_eq!(
        seqs,
        (2..=9).map(Sequence).collect::<BTreeSet<_>>(),
        "the eight took the next eight sequences"
    );
    let inside = answered_inside(&g.store, "a recording", g.store.record(event(9), T0)).await;
    assert_eq!(inside.event.sequence, Sequence(10), "the next sequence");
    assert_eq!(g.store.log_stats().await.expect("stats").rows, 10);
}

/// The answer of `call` on `store`, made inside a runtime after calls outside one: it must
/// succeed, within 30 s. A call never answered leaves the handle wedged: the store is then
/// leaked, so that the check fails instead of hanging in the drop of a handle that waits for
/// its wedged writer.
async fn answered_inside<T>(
    store: &Arc<dyn AwarenessStore>,
    what: &str,
    call: impl Future<Output = Result<T, StoreError>>,
) -> T {
    let Ok(answer) = tokio::time::timeout(std::time::Duration::from_secs(30), call).await else {
        std::mem::forget(Arc::clone(store));
        panic!("{what} inside a runtime, after writes outside one, was never answered");
    };
    answer.unwrap_or_else(|e| panic!("{what} inside a runtime, after writes outside one: {e}"))
}

/// Every write other than a recording (`watch`, `acknowledge`, `refreeze`, `unwatch`,
/// `reset_watcher`, `prune_chunk`, `delete_session`), driven outside a Tokio runtime (polled
/// on a thread that entered none, parked until woken, as a caller that polls the store's
/// futures itself does), either fails with [`StoreError::Backend`] saying it was called outside
/// a Tokio runtime, as a recording does
/// ([`a_recording_outside_a_runtime_fails_and_queues_nothing`]), or, where the store can do
/// that write without one, is answered: it neither panics nor waits for a wake-up that never
/// comes. Afterwards the handle is not wedged: each of those writes made inside a runtime is
/// answered, and so is a recording, with the sequence after the last one spent. (The traits
/// ask for no runtime; a store that needs one says so instead of failing some other way.)
pub async fn writes_outside_a_runtime_fail_and_leave_the_handle_working(f: impl OpenGrouped) {
    use crate::protocol::AckTarget;
    let dir = Scratch::new("group-commit");
    let g = open(&f, dir.file(), 16).await;
    let watcher = WatcherKey::parse("agent:main:main").expect("watcher");
    let target = session(0);
    let s = &g.store;
    // Before any write (nothing running yet on the store's behalf), then after a watch and a
    // recording that leave a notice to acknowledge. The handle is checked before what the
    // calls outside answered: one that panicked there may have left it wedged.
    let mut outside = writes_outside(s, &watcher, &target, "on a new store");
    answered_inside(s, "watch", s.watch(&watcher, &target, T0)).await;
    let first = answered_inside(s, "a recording", s.record(event(0), T0)).await;
    assert_eq!(first.notices.len(), 1, "a pending notice to acknowledge");
    outside.extend(writes_outside(s, &watcher, &target, "after a recording"));
    let key = crate::model::CursorKey {
        watcher: watcher.clone(),
        target: target.session_key.clone(),
    };
    let ack = [AckTarget::any(target.session_key.clone())];
    let cap = crate::retention::PruneStep::RowCap { max_rows: 100 };
    answered_inside(s, "watch", s.watch(&watcher, &target, T0)).await;
    answered_inside(s, "acknowledge", s.acknowledge(&watcher, &ack, T0)).await;
    answered_inside(s, "refreeze", s.refreeze(&[key], T0)).await;
    answered_inside(s, "unwatch", s.unwatch(&watcher, &target.session_key)).await;
    answered_inside(s, "reset_watcher", s.reset_watcher(watcher.session_key())).await;
    answered_inside(s, "prune_chunk", s.prune_chunk(&cap, 10, T0)).await;
    answered_inside(s, "delete_session", s.delete_session(&target)).await;
    let rec = answered_inside(s, "a recording", s.record(event(1), T0)).await;
    assert_eq!(
        rec.event.sequence,
        Sequence(first.event.sequence.get() + 1),
        "the sequence after the last one spent"
    );
    for (what, got) in outside {
        assert!(
            matches!(got, Outside::Refused | Outside::Answered),
            "{what} outside a Tokio runtime: {got:?}"
        );
    }
}

/// Drives each write of [`writes_outside_a_runtime_fail_and_leave_the_handle_working`] on
/// `store` outside a Tokio runtime, on a thread of its own; answers what each did, named with
/// `when`.
fn writes_outside(
    store: &Arc<dyn AwarenessStore>,
    watcher: &WatcherKey,
    target: &SessionRef,
    when: &str,
) -> Vec<(String, Outside)> {
    use crate::model::CursorKey;
    use crate::protocol::AckTarget;
    use crate::retention::PruneStep;
    let (s, w, t) = (Arc::clone(store), watcher.clone(), target.clone());
    let key = CursorKey {
        watcher: w.clone(),
        target: t.session_key.clone(),
    };
    let ack = [AckTarget::any(t.session_key.clone())];
    let cap = PruneStep::RowCap { max_rows: 100 };
    let done = std::thread::spawn(move || {
        // 30 s for all of them: a call is answered in milliseconds, or never.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        [
            ("watch", drive_outside(deadline, || s.watch(&w, &t, T0))),
            (
                "acknowledge",
                drive_outside(deadline, || s.acknowledge(&w, &ack, T0)),
            ),
            (
                "refreeze",
                drive_outside(deadline, || s.refreeze(std::slice::from_ref(&key), T0)),
            ),
            (
                "unwatch",
                drive_outside(deadline, || s.unwatch(&w, &t.session_key)),
            ),
            (
                "reset_watcher",
                drive_outside(deadline, || s.reset_watcher(w.session_key())),
            ),
            (
                "prune_chunk",
                drive_outside(deadline, || s.prune_chunk(&cap, 10, T0)),
            ),
            (
                "delete_session",
                drive_outside(deadline, || s.delete_session(&t)),
            ),
        ]
    })
    .join()
    .expect("the thread outside a runtime");
    done.into_iter()
        .map(|(what, got)| (format!("{what} {when}"), got))
        .collect()
}

/// `group_commit(0)` is refused at open with [`StoreError::Open`] naming the option (an
/// [`OpenFailure::InvalidOptions`]), and nothing is created.
pub async fn a_group_commit_of_zero_is_refused_at_open(f: impl OpenGrouped) {
    let dir = Scratch::new("group-commit");
    let Err(err) = f(dir.file(), 0).await else {
        panic!("group_commit(0) was accepted");
    };
    assert!(
        matches!(&err, StoreError::Open { reason, kind: OpenFailure::InvalidOptions, .. } if reason.contains("group_commit")),
        "{err:?}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read the scratch directory")
        .collect();
    assert!(left.is_empty(), "nothing is created: {left:?}");
}

/// Recordings whose callers give up while they wait for a batch (polled once, then dropped, as
/// a request timeout does) hold up no later one. With `group_commit(2)`, a recording is in
/// progress (recordings are started until one is still pending after its first poll: one the
/// store answered within that poll left nothing to queue behind), four callers each start a
/// recording behind it and give up after one poll, still pending (a caller answered within
/// that poll does not count), and the one in progress is awaited. Then a recording made alone
/// and four made at once (two batches' worth) each return
/// (a store that left them queued behind the abandoned ones would keep them waiting for a
/// writer that never comes), each with its own event. Afterwards the log holds every recording
/// whose caller waited exactly once, the answered ones under the sequence they were answered,
/// and besides them only abandoned events, each at most once, under its own sequence; the
/// abandoned session's head is the last of them that was kept.
pub async fn cancelled_recordings_hold_up_no_later_one(f: impl OpenGrouped) {
    let dir = Scratch::new("group-commit");
    let g = open(&f, dir.file(), 2).await;
    let gone = session(9);
    let abandoned = |i: usize| {
        NewEvent::new(
            gone.clone(),
            EventKind::HumanDirectMessage,
            ActorType::Human,
            format!("abandoned {i}"),
        )
    };
    // The recordings started until one stayed pending: those before it finished in their poll.
    let mut finished = 0;
    let mut first = loop {
        let mut first = g.store.record(event(finished), T0);
        if !poll_once(first.as_mut()).await {
            break first;
        }
        finished += 1;
        assert!(finished < 100, "no recording stayed pending after one poll");
    };
    // Four callers that give up while their recording is still pending. A store whose writer
    // runs on a thread of its own may answer one within its one poll (its thread committed it
    // between the call's wake-up and its poll): that one is not abandoned, only dropped after
    // its answer, and another caller is started.
    let (mut pending, mut started) = (0, 0);
    while pending < 4 {
        let mut call = std::pin::pin!(g.store.record(abandoned(started), T0));
        if !poll_once(call.as_mut()).await {
            pending += 1;
        }
        started += 1;
        assert!(
            started < 100,
            "no call stayed pending behind a recording in progress"
        );
    }
    let mut answered = vec![first.as_mut().await.expect("the recording in progress")];
    let within = |what: &str| {
        format!("{what}, made after the abandoned recordings, was left waiting for them")
    };
    let later = finished + 1;
    let alone = tokio::time::timeout(
        std::time::Duration::from_mins(1),
        g.store.record(event(later), T0),
    )
    .await
    .unwrap_or_else(|_| panic!("{}", within("a recording alone")))
    .expect("record");
    answered.push(alone);
    let at_once = tokio::time::timeout(
        std::time::Duration::from_mins(1),
        record_concurrently(&g.store, (later + 1..later + 5).map(|i| (event(i), T0))),
    )
    .await
    .unwrap_or_else(|_| panic!("{}", within("one of four recordings at once")));
    answered.extend(at_once);
    for (rec, i) in answered
        .iter()
        .zip((finished..=finished).chain(later..later + 5))
    {
        assert!(!rec.deduplicated, "recording {i}");
        assert_eq!(rec.event.summary, format!("message {i}"), "its own event");
    }

    let log = g
        .store
        .events_after(Sequence::ZERO, 1_000)
        .await
        .expect("events_after");
    let (kept, waited): (Vec<_>, Vec<_>) = log
        .iter()
        .partition(|e| e.summary.starts_with("abandoned "));
    let mut waited_for: Vec<&str> = waited.iter().map(|e| e.summary.as_str()).collect();
    waited_for.sort_unstable();
    let mut expected: Vec<String> = (0..=finished)
        .chain(later..later + 5)
        .map(|i| format!("message {i}"))
        .collect();
    expected.sort_unstable();
    assert_eq!(
        waited_for, expected,
        "the log holds every recording whose caller waited, exactly once"
    );
    for rec in &answered {
        let stored = log
            .iter()
            .find(|e| e.sequence == rec.event.sequence)
            .unwrap_or_else(|| panic!("no event at the answered sequence {}", rec.event.sequence));
        assert_eq!(**stored, *rec.event, "the log holds the answered event");
    }
    let summaries: Vec<&str> = kept.iter().map(|e| e.summary.as_str()).collect();
    let distinct: BTreeSet<&str> = summaries.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        summaries.len(),
        "each abandoned event at most once: {summaries:?}"
    );
    assert!(
        kept.iter().all(|e| e.session_ref() == gone),
        "an abandoned event under its own session: {kept:?}"
    );
    let sequences: BTreeSet<Sequence> = log.iter().map(|e| e.sequence).collect();
    assert_eq!(sequences.len(), log.len(), "distinct sequences");
    let page = g
        .store
        .changes_since(&gone, Sequence::ZERO, 200)
        .await
        .expect("changes_since");
    assert_eq!(
        page.events.len(),
        kept.len(),
        "the abandoned session's page holds the kept events"
    );
    assert_eq!(
        g.store.state_version(&gone).await.expect("version"),
        kept.last().map_or(Sequence::ZERO, |e| e.sequence),
        "the head is the last abandoned event that was kept"
    );
}
