//! The property-based model test: random operation sequences run against a backend and against
//! a deliberately simple reference model; every observable result must agree.
//!
//! The model keeps the log as a plain vector and applies the protocol functions of
//! [`crate::protocol`] directly, so it checks what a backend persists and queries (and any rule a
//! backend chose to express in its own query language) against the rules as written once.

#![allow(clippy::missing_panics_doc)]

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use serde_json::{Value, json};

use super::Subject;
use crate::error::StoreError;
use crate::model::{
    ActorType, AgentId, Cursor, CursorFilter, CursorKey, Event, EventKind, Head, LogStats,
    NewEvent, Sequence, SessionKey, SessionRef, Timestamp, WatcherKey,
};
use crate::protocol::{self, AckTarget, Notice, ReadNotice};
use crate::reconcile::{self, ChangesPage};
use crate::retention::{self, PruneReport, PruneStep, RetentionPolicy};
use crate::store::{AwarenessStore, AwarenessStoreExt, Recorded};
use crate::upstream::{self, LinkSpec, UpstreamLink};

/// Session keys; the last differs from the first in case only (keys compare byte for byte).
const KEYS: [&str; 5] = [
    "agent:main:main",
    "agent:main:subagent:a",
    "agent:ops:main",
    "global",
    "agent:main:Main",
];
const AGENTS: [&str; 2] = ["main", "ops"];
const WATCHERS: [&str; 3] = ["agent:main:main", "agent:main:subagent:a", "agent:ops:main"];
const T0: Timestamp = Timestamp(1_800_000_000_000);

/// One random operation.
#[derive(Debug, Clone)]
pub enum Op {
    /// Record an event.
    Record {
        /// Index into the session pool (key × agent).
        session: usize,
        /// Index into [`EventKind::ALL`].
        kind: usize,
        /// 0 human, 1 system, 2.. an agent whose id is a watcher key.
        actor: usize,
        /// The watchers the producer names: none, one, or two (the same one twice, or the
        /// event's own session, at times).
        named: Vec<usize>,
        /// A dedupe key: 0 to 3, one of a pool every step of the case draws from; 4 and up,
        /// one of the step's own, new at that step (the calls of one [`Op::Concurrent`] wave
        /// may share it).
        dedupe: Option<u8>,
        /// `occurredAt` relative to now, in hours (may lie outside the clamp window).
        offset_hours: Option<i64>,
        /// What else it carries, as bits: 1 a payload (nested, with escapes, non-ASCII text and
        /// a float), 2 a session id, 4 a run id, 8 something invalid (one of six ways): the store
        /// must refuse it and change nothing.
        extras: u8,
    },
    /// Several recordings at once (each an [`Op::Record`]), each on its own task: a store may
    /// group them into one write transaction, and one that group-commits
    /// ([`Subject::batching`]) is made to when `held`, its writer held while they queue. The
    /// model replays them in the order the store gave them sequences.
    Concurrent {
        /// The recordings.
        records: Vec<Op>,
        /// Whether the store's writer is held while they queue, so that they make one batch;
        /// otherwise the scheduler decides (one alone and the rest together, say), so that the
        /// split shapes of a group commit are checked too.
        held: bool,
    },
    /// Explicit watch.
    Watch {
        /// Watcher index.
        watcher: usize,
        /// Session index.
        session: usize,
    },
    /// Unwatch.
    Unwatch {
        /// Watcher index.
        watcher: usize,
        /// Key index.
        key: usize,
    },
    /// Acknowledge some targets.
    Ack {
        /// Watcher index.
        watcher: usize,
        /// Key indexes, each with the notice acknowledged: whichever is pending (0), the one
        /// the cursor shows (1), or another one: the next `last_seen` (2), another agent (3),
        /// an older `last_seen` (4: a turn that read the notice before another turn
        /// acknowledged it).
        keys: Vec<(usize, u8)>,
    },
    /// Start-up sweep; watchers whose bit is set exist.
    Sweep {
        /// Existence mask over `WATCHERS`.
        exists: u8,
    },
    /// A pruning pass.
    Prune {
        /// Row cap.
        max_rows: u64,
        /// Chunk size.
        chunk: usize,
        /// Age limit of events (mostly hours, so the age step runs).
        max_age_ms: i64,
        /// Idle limit of cursors (mostly hours or seconds, so the idle-cursor step runs).
        cursor_idle_ms: i64,
    },
    /// Session reset.
    Reset {
        /// Key index.
        key: usize,
    },
    /// Session delete.
    Delete {
        /// Session index.
        session: usize,
    },
    /// Reconcile page.
    Reconcile {
        /// Session index.
        session: usize,
        /// `changesSince`.
        after: u64,
        /// Requested limit.
        limit: usize,
    },
    /// Move the clock, mostly forward, at times back.
    Advance {
        /// Milliseconds.
        ms: i64,
    },
    /// `cursors(filter)` with a random filter.
    Cursors {
        /// Watcher key index into `KEYS` (`global` matches nothing).
        watcher: Option<usize>,
        /// Target key index.
        target: Option<usize>,
        /// Only pending cursors.
        pending: bool,
    },
    /// `cursor(watcher, target)`.
    Cursor {
        /// Watcher index.
        watcher: usize,
        /// Key index.
        key: usize,
    },
    /// `heads(refs)` of several refs at once: refs of the pool, with and without a head,
    /// refs outside it that never have one, and repeated refs.
    Heads {
        /// Indexes into the session pool, then past it (two refs that never have a head).
        refs: Vec<usize>,
        /// Whether the first ref is asked for again, last.
        repeat: bool,
    },
    /// `refreeze(keys)`: quiet, missing and repeated keys among them.
    Refreeze {
        /// (watcher index, key index) pairs.
        keys: Vec<(usize, usize)>,
    },
    /// `events_after(after, limit)`.
    EventsAfter {
        /// Reduced modulo (the last allocated sequence + 3), so it spans `0..=last + 2`.
        after: u64,
        /// The limit.
        limit: usize,
    },
    /// `upsert_link` of a source from a small pool.
    Adopt {
        /// Session index.
        session: usize,
        /// Source index into `SOURCES`.
        source: usize,
        /// Starting marker.
        marker: Option<u8>,
    },
    /// `set_marker` with the link's token (0), a stale one (1) or `now` (2).
    SetMarker {
        /// Session index.
        session: usize,
        /// Which token.
        token: u8,
        /// The marker.
        marker: u8,
    },
    /// `mark_scanned`.
    MarkScanned {
        /// Session index.
        session: usize,
    },
    /// `remove_link` without token, or with the link's (0) or a stale (1) one.
    RemoveLink {
        /// Session index.
        session: usize,
        /// Which token.
        token: Option<u8>,
    },
    /// One `prune_chunk` call, outside a pass: a bound of its own, which may be 0 or past
    /// anything a pass asks for.
    PruneChunk {
        /// Which step of a pass's ([`RetentionPolicy::steps`]): 0 age, 1 row cap, 2 idle
        /// cursors.
        step: usize,
        /// The chunk's bound.
        max: usize,
        /// Row cap of the step.
        max_rows: u64,
        /// Age limit of events.
        max_age_ms: i64,
        /// Idle limit of cursors.
        cursor_idle_ms: i64,
    },
    /// A write on cursors or a deletion (an [`Op::Watch`], [`Op::Unwatch`], [`Op::Ack`],
    /// [`Op::Refreeze`], [`Op::Reset`] or [`Op::Delete`]) made while recordings on the same
    /// key run, each call on a task of its own. Every store makes each call atomic: the write
    /// takes effect between two of the recordings (or before or after all of them), and the
    /// model finds a point where replaying it gives every answer and the state the store gave.
    Mixed {
        /// The recordings (valid, without dedupe keys: each spends and stores one sequence,
        /// so their order is the order of their sequences).
        records: Vec<Op>,
        /// The write.
        write: Box<Op>,
        /// How many recordings are spawned before the write is.
        at: usize,
    },
}

/// A write an [`Op`] describes, its arguments fixed when it is made (an acknowledgement names
/// the notices the cursors showed then, as a turn acknowledges what it read).
#[derive(Debug, Clone)]
enum Write {
    Watch(WatcherKey, SessionRef),
    Unwatch(CursorKey),
    Ack(WatcherKey, Vec<AckTarget>),
    Refreeze(Vec<CursorKey>),
    Reset(SessionKey),
    Delete(SessionRef),
}

/// What a [`Write`] answers; notices sorted.
#[derive(Debug, Clone, PartialEq)]
enum Answered {
    Cursor(Cursor),
    Removed(bool),
    Notices(Vec<Notice>),
    Count(u64),
    Done,
    /// Refused as invalid input (a watch of the watcher's own key), nothing changed.
    Refused,
}

/// Refs outside the session pool, which no operation records on: `heads` must leave them out
/// ([`Op::Heads`] indexes them after the pool's). The second is a pool key under an agent
/// that is not the pool's.
const UNKNOWN: [(&str, &str); 2] = [("agent:main:subagent:never", "main"), (KEYS[0], "nobody")];

/// The ref of an [`Op::Heads`] index: the pool's first, then [`UNKNOWN`].
fn heads_ref(i: usize) -> SessionRef {
    let n = KEYS.len() * AGENTS.len();
    if i < n {
        session(i)
    } else {
        let (key, agent) = UNKNOWN[i - n];
        SessionRef::parse(key, agent).expect("an unknown ref")
    }
}

/// Upstream ops use the first sessions of the pool only, so that they meet the same links.
const LINKED: usize = 3;

/// Upstream sources: (thread, reference path).
const SOURCES: [(&str, Option<&str>); 3] = [("t1", Some("/a")), ("t1", None), ("t2", Some("/b"))];

/// Dedupe keys of the pool every step draws from (`Op::Record::dedupe`); the step's own keys
/// come after them, up to [`ALL_KEYS`].
const SHARED_KEYS: u8 = 4;
const ALL_KEYS: u8 = 6;

/// The most recordings of one [`Op::Concurrent`] wave.
pub const MAX_WAVE: usize = 9;

/// A recording on one of `sessions`, its dedupe key (with probability `dedupe`) one of `keys`.
fn record_strategy(
    sessions: std::ops::Range<usize>,
    dedupe: f64,
    keys: std::ops::Range<u8>,
) -> impl Strategy<Value = Op> {
    (
        sessions,
        0..EventKind::ALL.len(),
        0..2 + WATCHERS.len(),
        proptest::collection::vec(0..WATCHERS.len(), 0..3),
        proptest::option::weighted(dedupe, keys),
        proptest::option::weighted(0.2, -48i64..4),
        prop_oneof![9 => 0u8..8, 1 => 8u8..16],
    )
        .prop_map(
            |(session, kind, actor, named, dedupe, offset_hours, extras)| Op::Record {
                session,
                kind,
                actor,
                named,
                dedupe,
                offset_hours,
                extras,
            },
        )
}

/// An [`Op::Concurrent`] wave: recordings anywhere in the pool; or, as often, recordings that
/// meet, all on one key under either agent, half of them with a dedupe key (of the pool, or of
/// the wave's own, which two of them may share), so that within one batch an event names a
/// watcher an earlier one named or created a cursor for, re-points a cursor at the key's other
/// agent, or is caused by a watcher it names (an actor id is a watcher key in 3 of 5 events).
fn wave_strategy() -> impl Strategy<Value = Op> {
    let n = KEYS.len() * AGENTS.len();
    let anywhere = proptest::collection::vec(record_strategy(0..n, 0.3, 0..ALL_KEYS), 2..=MAX_WAVE);
    let meeting = (0..KEYS.len()).prop_flat_map(|k| {
        let on_key = k * AGENTS.len()..(k + 1) * AGENTS.len();
        proptest::collection::vec(record_strategy(on_key, 0.5, 2..ALL_KEYS), 2..=MAX_WAVE)
    });
    (
        prop_oneof![anywhere, meeting],
        proptest::bool::weighted(0.75),
    )
        .prop_map(|(records, held)| Op::Concurrent { records, held })
}

/// The most recordings of one [`Op::Mixed`].
const MAX_MIXED: usize = 6;

/// An [`Op::Mixed`]: recordings on one key (under either agent, valid, without dedupe keys),
/// and a write on the same key (a watch of one of its sessions, an unwatch, an
/// acknowledgement, mostly of it, a re-freeze, a reset of a watcher, a deletion of one of its
/// sessions), spawned among them.
fn mixed_strategy() -> impl Strategy<Value = Op> {
    (0..KEYS.len())
        .prop_flat_map(|k| {
            let on_key = k * AGENTS.len()..(k + 1) * AGENTS.len();
            let records = proptest::collection::vec(
                record_strategy(on_key.clone(), 0.5, 0..1),
                1..=MAX_MIXED,
            )
            .prop_map(|records| records.into_iter().map(stored).collect::<Vec<_>>());
            let acked = proptest::collection::vec(
                (prop_oneof![3 => Just(k), 1 => 0..KEYS.len()], 0u8..5),
                1..3,
            );
            let write = prop_oneof![
                (0..WATCHERS.len(), on_key.clone())
                    .prop_map(|(watcher, session)| Op::Watch { watcher, session }),
                (0..WATCHERS.len()).prop_map(move |watcher| Op::Unwatch { watcher, key: k }),
                (0..WATCHERS.len(), acked).prop_map(|(watcher, keys)| Op::Ack { watcher, keys }),
                proptest::collection::vec((0..WATCHERS.len(), Just(k)), 1..3)
                    .prop_map(|keys| Op::Refreeze { keys }),
                (0..KEYS.len()).prop_map(|key| Op::Reset { key }),
                on_key.prop_map(|session| Op::Delete { session }),
            ];
            (records, write, 0..=MAX_MIXED)
        })
        .prop_map(|(records, write, at)| Op::Mixed {
            records,
            write: Box::new(write),
            at,
        })
}

/// `op` (an [`Op::Record`]) made to store an event: valid, without a dedupe key.
fn stored(op: Op) -> Op {
    match op {
        Op::Record {
            session,
            kind,
            actor,
            named,
            offset_hours,
            extras,
            ..
        } => Op::Record {
            session,
            kind,
            actor,
            named,
            dedupe: None,
            offset_hours,
            extras: extras & 7,
        },
        other => other,
    }
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let n = KEYS.len() * AGENTS.len();
    prop_oneof![
        6 => record_strategy(0..n, 0.3, 0..SHARED_KEYS),
        2 => wave_strategy(),
        2 => (0..WATCHERS.len(), 0..n).prop_map(|(watcher, session)| Op::Watch { watcher, session }),
        1 => (0..WATCHERS.len(), 0..KEYS.len()).prop_map(|(watcher, key)| Op::Unwatch { watcher, key }),
        2 => (0..WATCHERS.len(), proptest::collection::vec((0..KEYS.len(), 0u8..5), 0..3))
            .prop_map(|(watcher, keys)| Op::Ack { watcher, keys }),
        1 => any::<u8>().prop_map(|exists| Op::Sweep { exists }),
        2 => (0u64..25, 1usize..6, age_ms(), idle_ms()).prop_map(
            |(max_rows, chunk, max_age_ms, cursor_idle_ms)| Op::Prune { max_rows, chunk, max_age_ms, cursor_idle_ms }
        ),
        1 => (0..KEYS.len()).prop_map(|key| Op::Reset { key }),
        1 => (0..n).prop_map(|session| Op::Delete { session }),
        2 => (
            0..n,
            0u64..40,
            prop_oneof![
                8 => 0usize..8,
                1 => Just(reconcile::MAX_PAGE_LIMIT),
                1 => Just(usize::MAX),
            ],
        )
            .prop_map(|(session, after, limit)| Op::Reconcile { session, after, limit }),
        2 => mixed_strategy(),
        1 => (
            0usize..3,
            prop_oneof![6 => 0usize..6, 1 => Just(usize::MAX)],
            0u64..25,
            age_ms(),
            idle_ms(),
        )
            .prop_map(|(step, max, max_rows, max_age_ms, cursor_idle_ms)| Op::PruneChunk {
                step,
                max,
                max_rows,
                max_age_ms,
                cursor_idle_ms,
            }),
        2 => prop_oneof![
            4 => 0i64..5_000,
            2 => Just(Timestamp::HOUR_MS * 2),
            2 => Just(Timestamp::DAY_MS * 11),
            // The wall clock stepping back (NTP): stamps may go back, sequences never do.
            1 => prop_oneof![-5_000i64..0, Just(-Timestamp::HOUR_MS * 3)],
        ]
            .prop_map(|ms| Op::Advance { ms }),
        2 => (
            proptest::option::of(0..KEYS.len()),
            proptest::option::of(0..KEYS.len()),
            any::<bool>(),
        )
            .prop_map(|(watcher, target, pending)| Op::Cursors { watcher, target, pending }),
        1 => (0..WATCHERS.len(), 0..KEYS.len()).prop_map(|(watcher, key)| Op::Cursor { watcher, key }),
        2 => proptest::collection::vec((0..WATCHERS.len(), 0..KEYS.len()), 0..6)
            .prop_map(|keys| Op::Refreeze { keys }),
        2 => (proptest::collection::vec(0..n + UNKNOWN.len(), 0..8), any::<bool>())
            .prop_map(|(refs, repeat)| Op::Heads { refs, repeat }),
        2 => (
            0u64..1_000,
            prop_oneof![8 => 1usize..=5, 1 => Just(0usize), 1 => Just(usize::MAX / 2)],
        )
            .prop_map(|(after, limit)| Op::EventsAfter { after, limit }),
        2 => (0..LINKED, 0..SOURCES.len(), proptest::option::of(0u8..3))
            .prop_map(|(session, source, marker)| Op::Adopt { session, source, marker }),
        1 => (0..LINKED, 0u8..3, 0u8..3)
            .prop_map(|(session, token, marker)| Op::SetMarker { session, token, marker }),
        1 => (0..LINKED).prop_map(|session| Op::MarkScanned { session }),
        1 => (0..LINKED, proptest::option::of(0u8..2))
            .prop_map(|(session, token)| Op::RemoveLink { session, token }),
    ]
}

/// An age limit: mostly 1 h to 48 h in whole hours (so an event's `occurredAt`, also in whole
/// hours, can fall exactly on the cutoff), sometimes the default 30 days.
fn age_ms() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => (1i64..=48).prop_map(|h| h * Timestamp::HOUR_MS),
        1 => Just(RetentionPolicy::default().max_age_ms),
    ]
}

/// An idle limit of cursors: hours as [`age_ms`] (often exactly one [`Op::Advance`] jump, so a
/// cursor's `updated_at` can fall on the cutoff), or seconds (the clock mostly moves by
/// seconds), sometimes the default.
fn idle_ms() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => (1i64..=48).prop_map(|h| h * Timestamp::HOUR_MS),
        1 => Just(Timestamp::HOUR_MS * 2),
        2 => (1i64..=5).prop_map(|s| s * 1_000),
        1 => Just(RetentionPolicy::default().cursor_idle_ms),
    ]
}

fn link_spec(r: SessionRef, source: usize, marker: Option<u8>) -> LinkSpec {
    let (thread, path) = SOURCES[source];
    let mut spec = LinkSpec::new(r, "claude-code", "local", thread, "local-jsonl");
    if let Some(p) = path {
        spec = spec.with_ref(json!({ "path": p }));
    }
    if let Some(m) = marker {
        spec = spec.with_marker(marker_value(m));
    }
    spec
}

fn marker_value(m: u8) -> Value {
    json!({ "offset": u32::from(m) * 10 })
}

fn session(i: usize) -> SessionRef {
    SessionRef::parse(KEYS[i / AGENTS.len()], AGENTS[i % AGENTS.len()]).expect("pool ref")
}
/// The cursor of watcher `wi` on key `ki`.
fn cursor_key(wi: usize, ki: usize) -> CursorKey {
    CursorKey {
        watcher: watcher(wi),
        target: key(ki),
    }
}

fn watcher(i: usize) -> WatcherKey {
    WatcherKey::parse(WATCHERS[i]).expect("pool watcher")
}
fn key(i: usize) -> SessionKey {
    SessionKey::new(KEYS[i]).expect("pool key")
}

/// The reference model: the storage contract written as plainly as possible.
#[derive(Debug, Default, Clone)]
pub struct Model {
    last: u64,
    events: Vec<Arc<Event>>,
    heads: BTreeMap<SessionRef, Head>,
    cursors: BTreeMap<CursorKey, Cursor>,
    links: BTreeMap<SessionRef, UpstreamLink>,
}

impl Model {
    fn record(
        &mut self,
        mut e: NewEvent,
        now: Timestamp,
    ) -> Option<(Arc<Event>, bool, Vec<Notice>)> {
        if e.validate().is_err() {
            return None;
        }
        self.last += 1;
        if let Some(k) = &e.dedupe_key
            && let Some(old) = self
                .events
                .iter()
                .find(|x| x.dedupe_key.as_ref() == Some(k))
        {
            return Some((old.clone(), true, Vec::new()));
        }
        let named = std::mem::take(&mut e.watchers);
        let ev = Arc::new(e.into_event(Sequence(self.last), now));
        let existing: Vec<Cursor> = self
            .cursors
            .values()
            .filter(|c| c.target == ev.session_key)
            .cloned()
            .collect();
        let fx = protocol::on_event(&ev, &named, &existing, now);
        for c in fx.upserts {
            self.cursors.insert(c.key(), c);
        }
        let r = ev.session_ref();
        let h = self.heads.entry(r.clone()).or_insert(Head {
            session: r,
            last_sequence: Sequence::ZERO,
            pruned_max_sequence: Sequence::ZERO,
            updated_at: now,
        });
        h.last_sequence = ev.sequence;
        h.updated_at = now;
        self.events.push(ev.clone());
        Some((ev, false, fx.notices))
    }

    fn page(&self, r: &SessionRef, after: Sequence, limit: usize) -> ChangesPage {
        let limit = reconcile::clamp_limit(Some(limit));
        let mine: Vec<Arc<Event>> = self
            .events
            .iter()
            .filter(|e| e.session_ref() == *r)
            .cloned()
            .collect();
        let min = mine.first().map(|e| e.sequence);
        let fetched = mine
            .into_iter()
            .filter(|e| e.sequence > after)
            .take(limit + 1)
            .collect();
        reconcile::build_page(after, self.heads.get(r), min, fetched, limit)
    }

    fn prune(&mut self, policy: &RetentionPolicy, now: Timestamp) -> PruneReport {
        let mut report = PruneReport::default();
        for step in policy.steps(now) {
            loop {
                let n = self.prune_chunk(&step, policy.chunk_rows, now);
                report.add(&step, n);
                if n < policy.chunk_rows as u64 {
                    break;
                }
            }
        }
        report
    }

    fn prune_chunk(&mut self, step: &PruneStep, max: usize, now: Timestamp) -> u64 {
        let victims: Vec<Sequence> = match *step {
            PruneStep::Age { cutoff } => self
                .events
                .iter()
                .filter(|e| e.occurred_at < cutoff)
                .take(max)
                .map(|e| e.sequence)
                .collect(),
            PruneStep::RowCap { max_rows } => {
                let n = retention::row_cap_victims(self.events.len() as u64, max_rows, max);
                self.events.iter().take(n).map(|e| e.sequence).collect()
            }
            PruneStep::Cursors { cutoff } => {
                let before = self.cursors.len();
                let mut left = max;
                self.cursors.retain(|_, c| {
                    if c.updated_at < cutoff && left > 0 {
                        left -= 1;
                        false
                    } else {
                        true
                    }
                });
                return (before - self.cursors.len()) as u64;
            }
        };
        let refs: Vec<(SessionRef, Sequence)> = self
            .events
            .iter()
            .filter(|e| victims.contains(&e.sequence))
            .map(|e| (e.session_ref(), e.sequence))
            .collect();
        for (r, s) in retention::watermarks(refs.iter().map(|(r, s)| (r, *s))) {
            if let Some(h) = self.heads.get_mut(&r) {
                *h = retention::stamp(h, s, now);
            }
        }
        self.events.retain(|e| !victims.contains(&e.sequence));
        victims.len() as u64
    }

    fn stats(&self) -> LogStats {
        LogStats {
            rows: self.events.len() as u64,
            min_sequence: self.events.first().map(|e| e.sequence).unwrap_or_default(),
            max_sequence: self.events.last().map(|e| e.sequence).unwrap_or_default(),
        }
    }
}

fn sorted(mut v: Vec<Notice>) -> Vec<Notice> {
    v.sort_by(|a, b| {
        (&a.watcher, &a.target, a.last_seen).cmp(&(&b.watcher, &b.target, b.last_seen))
    });
    v
}

/// The [`Write`] `op` describes, given the model before it; `None` for an op that is not one.
fn write_of(op: &Op, model: &Model) -> Option<Write> {
    Some(match op {
        Op::Watch {
            watcher: wi,
            session: si,
        } => Write::Watch(watcher(*wi), session(*si)),
        Op::Unwatch {
            watcher: wi,
            key: ki,
        } => Write::Unwatch(cursor_key(*wi, *ki)),
        Op::Ack { watcher: wi, keys } => {
            // The notice each entry names, from the cursors before the call.
            let targets = keys
                .iter()
                .map(|(ki, read)| {
                    let (agent, seen) = model.cursors.get(&cursor_key(*wi, *ki)).map_or(
                        (AgentId::new(AGENTS[0]).expect("agent"), Sequence::ZERO),
                        |c| (c.target_agent.clone(), c.last_seen),
                    );
                    let other = AGENTS
                        .iter()
                        .find(|a| **a != agent.as_str())
                        .map(|a| AgentId::new(*a).expect("agent"))
                        .expect("two agents");
                    let (target_agent, last_seen) = match read {
                        0 => return AckTarget::any(key(*ki)),
                        1 => (agent, seen),
                        2 => (agent, Sequence(seen.0 + 1)),
                        3 => (other, seen),
                        _ => (agent, Sequence(seen.0.saturating_sub(1))),
                    };
                    AckTarget {
                        target: key(*ki),
                        read: Some(ReadNotice {
                            target_agent,
                            last_seen,
                        }),
                    }
                })
                .collect();
            Write::Ack(watcher(*wi), targets)
        }
        Op::Refreeze { keys } => {
            let mut keys: Vec<CursorKey> = keys.iter().map(|(w, k)| cursor_key(*w, *k)).collect();
            // A repeated key in most calls.
            if let Some(first) = keys.first().cloned() {
                keys.push(first);
            }
            Write::Refreeze(keys)
        }
        Op::Reset { key: ki } => Write::Reset(key(*ki)),
        Op::Delete { session: si } => Write::Delete(session(*si)),
        _ => return None,
    })
}

impl Model {
    /// Makes `w` in the model; answers what the store must answer.
    fn write(&mut self, w: &Write, now: Timestamp) -> Answered {
        match w {
            Write::Watch(w, target) => {
                if protocol::check_watch(w.session_key(), &target.session_key).is_err() {
                    return Answered::Refused;
                }
                let head = self
                    .heads
                    .get(target)
                    .map_or(Sequence::ZERO, |h| h.last_sequence);
                let k = CursorKey {
                    watcher: w.clone(),
                    target: target.session_key.clone(),
                };
                let (c, write) = protocol::watch(self.cursors.get(&k), w, target, head, now);
                if write {
                    self.cursors.insert(k, c.clone());
                }
                Answered::Cursor(c)
            }
            Write::Unwatch(k) => Answered::Removed(self.cursors.remove(k).is_some()),
            Write::Ack(w, targets) => {
                let mut follow = Vec::new();
                // Core's rules, as every store applies them: one acknowledgement per target,
                // as its first entry says, and only of the notice it read.
                for t in AckTarget::each_once(targets) {
                    let k = CursorKey {
                        watcher: w.clone(),
                        target: t.target.clone(),
                    };
                    if let Some(c) = self.cursors.get(&k) {
                        let (write, next) = t.apply(c, now);
                        if let Some(c) = write {
                            self.cursors.insert(k, c);
                        }
                        follow.extend(next);
                    }
                }
                Answered::Notices(sorted(follow))
            }
            Write::Refreeze(keys) => {
                let mut notices = Vec::new();
                // Once per distinct key; missing and quiet cursors give nothing.
                let mut done = std::collections::BTreeSet::new();
                for k in keys {
                    if done.insert(k.clone())
                        && let Some(c) = self.cursors.get_mut(k)
                        && let Some((nc, n)) = protocol::refreeze(c, now)
                    {
                        if let Some(nc) = nc {
                            *c = nc;
                        }
                        notices.push(n);
                    }
                }
                Answered::Notices(sorted(notices))
            }
            Write::Reset(k) => {
                let before = self.cursors.len();
                self.cursors.retain(|_, c| c.watcher.session_key() != k);
                Answered::Count((before - self.cursors.len()) as u64)
            }
            Write::Delete(r) => {
                self.events.retain(|e| e.session_ref() != *r);
                self.heads.remove(r);
                self.cursors.retain(|_, c| !c.removed_by_delete(r));
                self.links.remove(r);
                Answered::Done
            }
        }
    }
}

/// Makes `w` on `store`; a refusal as invalid input is [`Answered::Refused`], any other error
/// is the store's.
async fn make(
    store: &dyn AwarenessStore,
    w: &Write,
    now: Timestamp,
) -> Result<Answered, StoreError> {
    let answered = match w {
        Write::Watch(w, target) => store.watch(w, target, now).await.map(Answered::Cursor),
        Write::Unwatch(k) => store
            .unwatch(&k.watcher, &k.target)
            .await
            .map(Answered::Removed),
        Write::Ack(w, targets) => store
            .acknowledge(w, targets, now)
            .await
            .map(|n| Answered::Notices(sorted(n))),
        Write::Refreeze(keys) => store
            .refreeze(keys, now)
            .await
            .map(|n| Answered::Notices(sorted(n))),
        Write::Reset(k) => store.reset_watcher(k).await.map(Answered::Count),
        Write::Delete(r) => store.delete_session(r).await.map(|()| Answered::Done),
    };
    match answered {
        Err(StoreError::InvalidInput(_)) => Ok(Answered::Refused),
        other => other,
    }
}

fn kind_actor(kind: usize, actor: usize) -> (EventKind, ActorType, Option<String>) {
    let kind = EventKind::ALL[kind].clone();
    match actor {
        0 => (kind, ActorType::Human, Some("user-1".into())),
        1 => (kind, ActorType::System, None),
        n => (kind, ActorType::Agent, Some(WATCHERS[n - 2].into())),
    }
}

/// The event an [`Op::Record`] of step `step` describes; `tag` makes its summary unique.
fn new_event(op: &Op, step: usize, tag: &str, now: Timestamp) -> NewEvent {
    let Op::Record {
        session: si,
        kind,
        actor,
        named,
        dedupe,
        offset_hours,
        extras,
    } = op
    else {
        unreachable!("only Op::Record describes an event")
    };
    let (kind, actor_type, actor_id) = kind_actor(*kind, *actor);
    let summary = format!("{kind} at {tag}");
    let mut e = NewEvent::new(session(*si), kind, actor_type, summary);
    e.actor_id = actor_id;
    e.dedupe_key = dedupe.map(|d| {
        if d < SHARED_KEYS {
            format!("dk-{d}")
        } else {
            format!("dk-{d}-of-step-{step}")
        }
    });
    e.occurred_at = offset_hours.map(|h| now.plus_ms(h * Timestamp::HOUR_MS));
    e.watchers.extend(named.iter().map(|n| watcher(*n)));
    if extras & 1 != 0 {
        let payload = serde_json::json!({
            "tag": tag,
            "text": "caf\u{e9} \"quoted\"\nline \u{1F600}",
            "nested": {"list": [1, {"k": null}, -2.5], "empty": {}},
            "big": u64::MAX,
        });
        e.payload = Some(crate::validate::payload_from_value(payload).expect("an object"));
    }
    if extras & 2 != 0 {
        e.session_id = Some(format!("sid-{si}"));
    }
    if extras & 4 != 0 {
        e.run_id = Some(format!("run-{tag}"));
    }
    if extras & 8 != 0 {
        spoil(&mut e, *si + *actor);
        // The model judges events with the store's own `validate`: a rule it stopped applying
        // would let both accept a spoiled event, so each spoiling is held to a refusal here.
        assert!(e.validate().is_err(), "a spoiled event is invalid: {e:?}");
    }
    e
}

/// Makes `e` invalid in one of several ways, chosen by `how`; its dedupe key, if any, stays
/// (a refusal must come before the dedupe lookup).
fn spoil(e: &mut NewEvent, how: usize) {
    match how % 6 {
        0 => e.summary = "x".repeat(crate::validate::MAX_SUMMARY_CHARS + 1),
        1 => e.summary = String::new(),
        2 => e.actor_id = Some("line\nbreak".into()),
        3 => e.run_id = Some(String::new()),
        4 => {
            let mut deep = json!(1);
            for _ in 0..=crate::validate::MAX_JSON_DEPTH {
                deep = json!({ "d": deep });
            }
            let Value::Object(deep) = deep else {
                unreachable!("an object")
            };
            e.payload = Some(deep);
        }
        _ => {
            e.watchers = (0..=crate::validate::MAX_NAMED_WATCHERS)
                .map(|i| WatcherKey::parse(&format!("agent:main:w{i}")).expect("a watcher key"))
                .collect();
        }
    }
}

/// What lets a held writer go ([`Batching::hold_writer`]).
pub struct Release(Pin<Box<dyn Future<Output = ()> + Send>>);

impl Release {
    /// What `release` does: let the writer go, and undo whatever the hold did to keep it.
    pub fn new(release: impl Future<Output = ()> + Send + 'static) -> Self {
        Self(Box::pin(release))
    }

    /// Lets the writer go; returns once it is free again.
    pub async fn release(self) {
        self.0.await;
    }

    /// Holds `store`'s writer with a write that changes nothing (an unwatch of a cursor no
    /// test makes), made while the store's lock is held from outside (another connection's
    /// transaction, another gateway's lock): polled once here, so that it is first in line for
    /// the writer, it waits on that lock, and the recordings given to the store meanwhile queue
    /// behind it. The answer's `release` runs `let_go` (which lets the outside lock go), then
    /// waits for the unwatch to end.
    ///
    /// # Panics
    ///
    /// When the unwatch does not wait for the lock, fails, or removes a cursor.
    pub async fn behind_a_noop_write(
        store: Arc<dyn AwarenessStore>,
        let_go: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        let mut unwatch = Box::pin(async move {
            let watcher = WatcherKey::parse("agent:main:subagent:holder").expect("watcher");
            let target = SessionKey::new("agent:main:subagent:held").expect("key");
            store.unwatch(&watcher, &target).await
        });
        assert!(
            !super::poll_once(unwatch.as_mut()).await,
            "a write waits for the lock"
        );
        let unwatch = tokio::spawn(unwatch);
        Self::new(async move {
            let_go.await;
            let removed = unwatch.await.expect("join").expect("the unwatch");
            assert!(!removed, "no test makes the holder's cursor");
        })
    }
}

/// Holds a store's writer; answers its [`Release`].
pub type HoldWriter = Box<dyn Fn() -> Pin<Box<dyn Future<Output = Release> + Send>> + Send + Sync>;

/// How the model test makes a store that group-commits concurrent recordings (decision 0005)
/// batch a held [`Op::Concurrent`] wave (three in four), and checks that it did: the batch path
/// is the most involved way to record, and a wave left to the scheduler reached it only when
/// the store's writer happened to be busy. The other waves are left to the scheduler, for the
/// split shapes (one recording alone, the rest together). The store must batch at least
/// [`MAX_WAVE`] recordings, and 16 for the durable suite, whose check of recordings over an
/// unreadable head holds sixteen in one batch.
pub struct Batching {
    /// Holds the store's writer, as test support (with the store's own means: a lock taken
    /// from outside, a hook hidden from its docs): once the answer is there, every recording
    /// the store is then given queues its event at its first poll and waits; once the
    /// [`Release`] is released, the writer commits the queued events, in order, in one batch.
    /// Called before each held wave, released once each of its calls was polled once.
    pub hold_writer: HoldWriter,
    /// The most recordings one of the store's write transactions has held (its
    /// `largest_batch()`): after a wave of at least two valid recordings, at least their number.
    pub largest_batch: Box<dyn Fn() -> usize + Send + Sync>,
    /// The store's count of committed write transactions (its `write_transactions()`): a held
    /// wave adds exactly [`Batching::hold_transactions`], plus one when any of its recordings
    /// is valid.
    pub write_transactions: Box<dyn Fn() -> u64 + Send + Sync>,
    /// The write transactions a hold and its release count themselves (store-sqlite's no-op
    /// write queued first in line: 1; store-redb's held job commits nothing: 0).
    pub hold_transactions: u64,
    /// What becomes of a recording whose caller gives up while its event waits behind the
    /// held writer.
    pub given_up: GivenUp,
}

/// What a store that batches does with a recording whose caller gives up (drops the call)
/// while its event waits in the queue ([`Batching::given_up`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GivenUp {
    /// The event leaves the queue with its caller: it is never committed (store-sqlite,
    /// store-postgres). The conformance check
    /// [`super::checks::a_recording_given_up_in_the_queue_is_never_committed`] holds it to
    /// that.
    LeavesTheQueue,
    /// The writer may already hold the event when its caller gives up: it is committed at most
    /// once (store-redb, whose writer thread takes events from its channel as they come), as
    /// [`super::checks::cancelled_recordings_cancel_nobody_elses_commit`] checks of every store.
    AtMostOnce,
}

/// A call of a wave: answered at its first poll, or queued and left to a task of its own.
pub(crate) enum Answer {
    AtOnce(Result<Recorded, StoreError>),
    Queued(tokio::task::JoinHandle<Result<Recorded, StoreError>>),
}

/// Starts a recording of each of `events` on `store`, all at once, each on a task of its own.
/// With `batching` (a store that group-commits, in a held wave), its writer is held while each
/// call is polled once (which queues its event), so that the writer, once released, finds
/// every valid one queued and commits them together.
pub(crate) async fn record_wave(
    store: &Arc<dyn AwarenessStore>,
    batching: Option<&Batching>,
    events: &[NewEvent],
    now: Timestamp,
) -> Vec<Answer> {
    let held = match batching {
        Some(b) => Some((b.hold_writer)().await),
        None => None,
    };
    let mut answers = Vec::with_capacity(events.len());
    for e in events {
        let (store, e) = (Arc::clone(store), e.clone());
        let mut call = Box::pin(async move { store.record(e, now).await });
        if held.is_some() {
            let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            if let Poll::Ready(answer) = first {
                answers.push(Answer::AtOnce(answer));
                continue;
            }
        }
        answers.push(Answer::Queued(tokio::spawn(call)));
    }
    if let Some(held) = held {
        held.release().await;
    }
    answers
}

/// Makes `w` on `store` on a task of its own.
fn spawn_write(
    store: &Arc<dyn AwarenessStore>,
    w: &Write,
    now: Timestamp,
) -> tokio::task::JoinHandle<Result<Answered, StoreError>> {
    let (store, w) = (Arc::clone(store), w.clone());
    tokio::spawn(async move { make(&*store, &w, now).await })
}

/// Replays an [`Op::Mixed`] in `model`: the recordings of `events` in `order` (the order of
/// their sequences), with the write made after `point` of them; fails at the first answer that
/// differs from the store's (`got` for the recordings, `wrote` for the write).
fn replay(
    model: &mut Model,
    events: &[NewEvent],
    order: &[usize],
    got: &[Recorded],
    (point, w, wrote): (usize, &Write, &Answered),
    now: Timestamp,
) -> Result<(), String> {
    let write = |model: &mut Model| {
        let want = model.write(w, now);
        if want == *wrote {
            Ok(())
        } else {
            Err(format!("the write answers {want:?}"))
        }
    };
    for (n, i) in order.iter().enumerate() {
        if n == point {
            write(model)?;
        }
        model.last = got[*i].event.sequence.get() - 1;
        let (ev, _, notices) = model
            .record(events[*i].clone(), now)
            .expect("the recordings are valid");
        if got[*i].deduplicated {
            return Err(format!("call {i}, without a dedupe key, answered as a hit"));
        }
        if *ev != *got[*i].event {
            return Err(format!("call {i} stores {ev:?}"));
        }
        if sorted(notices.clone()) != sorted(got[*i].notices.clone()) {
            return Err(format!("call {i} notifies {notices:?}"));
        }
    }
    if point == order.len() {
        write(model)?;
    }
    Ok(())
}

/// What a store holds, as the reads after every step see it.
struct State {
    cursors: Vec<Cursor>,
    heads: Vec<Head>,
    events: Vec<Arc<Event>>,
}

impl State {
    async fn of(store: &dyn AwarenessStore) -> Result<Self, StoreError> {
        Ok(Self {
            cursors: store.cursors(&CursorFilter::default()).await?,
            heads: store.list_heads(None).await?,
            events: store.events_after(Sequence::ZERO, usize::MAX / 2).await?,
        })
    }

    /// Whether the model holds the same.
    fn is(&self, model: &Model) -> bool {
        self.cursors.iter().eq(model.cursors.values())
            && self.heads.iter().eq(model.heads.values())
            && self.events == model.events
    }
}

async fn check_case(subject: &Subject, ops: &[Op]) -> Result<(), TestCaseError> {
    let store = &*subject.store;
    let up = &*subject.upstream;
    let mut model = Model::default();
    let mut now = T0;
    for (step, op) in ops.iter().enumerate() {
        let ctx = format!("step {step}: {op:?}");
        match op {
            Op::Record { .. } => {
                let e = new_event(op, step, &step.to_string(), now);
                let want = model.record(e.clone(), now);
                let got = store.record(e, now).await;
                let Some((ev, dedup, notices)) = want else {
                    // Refused before anything is written; the next steps check that nothing
                    // changed and no sequence was spent.
                    prop_assert!(
                        matches!(got, Err(StoreError::InvalidInput(_))),
                        "{}: an invalid event is refused as invalid input, got {:?}",
                        ctx,
                        got.map(|r| r.event.sequence)
                    );
                    continue;
                };
                let got = got.map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                prop_assert_eq!(&*got.event, &*ev, "{}", ctx);
                prop_assert_eq!(got.deduplicated, dedup, "{}", ctx);
                prop_assert_eq!(sorted(got.notices), sorted(notices), "{}", ctx);
            }
            Op::Concurrent { records, held } => {
                let batching = subject.batching.as_ref().filter(|_| *held);
                let events: Vec<NewEvent> = records
                    .iter()
                    .enumerate()
                    .map(|(i, op)| new_event(op, step, &format!("{step}.{i}"), now))
                    .collect();
                let valid = events.iter().filter(|e| e.validate().is_ok()).count();
                let largest_before = batching.map(|b| (b.largest_batch)());
                let txs_before = batching.map(|b| (b.write_transactions)());
                let answers = record_wave(&subject.store, batching, &events, now).await;
                let mut got = Vec::with_capacity(answers.len());
                // The calls made with an invalid event, refused without spending a sequence.
                let mut refused = Vec::new();
                for (i, answer) in answers.into_iter().enumerate() {
                    let answer = match answer {
                        Answer::Queued(t) => t
                            .await
                            .map_err(|e| TestCaseError::fail(format!("{ctx}: join: {e}")))?,
                        Answer::AtOnce(answer) => {
                            prop_assert!(
                                batching.is_none() || events[i].validate().is_err(),
                                "{}: call {} answered while the store's writer was held: {:?}",
                                ctx,
                                i,
                                answer.map(|r| r.event.sequence)
                            );
                            answer
                        }
                    };
                    if events[i].validate().is_err() {
                        prop_assert!(
                            matches!(answer, Err(StoreError::InvalidInput(_))),
                            "{}: call {} is invalid and refused as such, got {:?}",
                            ctx,
                            i,
                            answer.map(|r| r.event.sequence)
                        );
                        refused.push(i);
                        continue;
                    }
                    got.push(
                        answer.map_err(|e| TestCaseError::fail(format!("{ctx}: call {i}: {e}")))?,
                    );
                }
                let events: Vec<NewEvent> = events
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| !refused.contains(i))
                    .map(|(_, e)| e)
                    .collect();
                // Every call spends one sequence; the stored ones, in sequence order, are the
                // order the store applied them in, which the model replays.
                let base = model.last;
                let mut stored: Vec<usize> =
                    (0..got.len()).filter(|i| !got[*i].deduplicated).collect();
                stored.sort_by_key(|i| got[*i].event.sequence);
                let mut previous = base;
                for i in stored {
                    let seq = got[i].event.sequence.get();
                    prop_assert!(
                        seq > previous && seq <= base + got.len() as u64,
                        "{}: sequence {} outside the wave's {}..={}",
                        ctx,
                        seq,
                        base + 1,
                        base + got.len() as u64
                    );
                    previous = seq;
                    model.last = seq - 1;
                    let (ev, dedup, notices) = model
                        .record(events[i].clone(), now)
                        .expect("pool events are valid");
                    prop_assert!(!dedup, "{}: call {} is a hit in the model", ctx, i);
                    prop_assert_eq!(&*got[i].event, &*ev, "{}: call {}", ctx, i);
                    prop_assert_eq!(
                        sorted(got[i].notices.clone()),
                        sorted(notices),
                        "{}: call {}",
                        ctx,
                        i
                    );
                }
                // A hit answers the caller's own key (checked against what it asked, not what it
                // got back), whose row the log holds by now: stored before the wave, or by a
                // call of the wave.
                for (i, rec) in got.iter().enumerate().filter(|(_, r)| r.deduplicated) {
                    let key = events[i].dedupe_key.as_ref();
                    prop_assert!(key.is_some(), "{}: call {} had no dedupe key", ctx, i);
                    let first = model.events.iter().find(|e| e.dedupe_key.as_ref() == key);
                    prop_assert_eq!(Some(&rec.event), first, "{}: call {} is a hit", ctx, i);
                    prop_assert!(rec.notices.is_empty(), "{}: a hit notifies", ctx);
                }
                model.last = base + got.len() as u64;
                // The wave's valid recordings, queued behind the held writer, were committed
                // in one write transaction (nothing else writes meanwhile)...
                if let (Some(b), Some(before)) = (batching, txs_before) {
                    let txs = (b.write_transactions)() - before;
                    let want = b.hold_transactions + u64::from(valid > 0);
                    prop_assert_eq!(
                        txs,
                        want,
                        "{}: the wave's {} valid recordings took {} write transactions, the \
                         hold's {} included",
                        ctx,
                        valid,
                        txs,
                        b.hold_transactions
                    );
                }
                // ...as one batch: the store's largest batch is at least that, and exactly that
                // when it was smaller before.
                if let (Some(b), Some(before)) = (batching, largest_before)
                    && valid >= 2
                {
                    let largest = (b.largest_batch)();
                    prop_assert!(
                        largest >= valid && (before >= valid || largest == valid),
                        "{}: the wave's {} valid recordings were not committed as one batch \
                         (largest batch {} before the wave, {} after)",
                        ctx,
                        valid,
                        before,
                        largest
                    );
                }
            }
            Op::Watch { .. }
            | Op::Unwatch { .. }
            | Op::Ack { .. }
            | Op::Refreeze { .. }
            | Op::Reset { .. }
            | Op::Delete { .. } => {
                let w = write_of(op, &model).expect("a write");
                let want = model.write(&w, now);
                let got = make(store, &w, now)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                prop_assert_eq!(got, want, "{}", ctx);
            }
            Op::Mixed { records, write, at } => {
                let w = write_of(write, &model).expect("a write");
                let events: Vec<NewEvent> = records
                    .iter()
                    .enumerate()
                    .map(|(i, op)| new_event(op, step, &format!("{step}.{i}"), now))
                    .collect();
                let mut calls = Vec::with_capacity(events.len());
                let mut made = None;
                for (i, e) in events.iter().enumerate() {
                    if i == *at {
                        made = Some(spawn_write(&subject.store, &w, now));
                    }
                    let (store, e) = (Arc::clone(&subject.store), e.clone());
                    calls.push(tokio::spawn(async move { store.record(e, now).await }));
                }
                let made = made.unwrap_or_else(|| spawn_write(&subject.store, &w, now));
                let mut got = Vec::with_capacity(calls.len());
                for (i, call) in calls.into_iter().enumerate() {
                    let answer = call
                        .await
                        .map_err(|e| TestCaseError::fail(format!("{ctx}: join: {e}")))?;
                    got.push(
                        answer.map_err(|e| TestCaseError::fail(format!("{ctx}: call {i}: {e}")))?,
                    );
                }
                let wrote = made
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: join: {e}")))?
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: the write: {e}")))?;
                // Each recording stored one event, in the order of their sequences.
                let base = model.last;
                let mut order: Vec<usize> = (0..got.len()).collect();
                order.sort_by_key(|i| got[*i].event.sequence);
                let sequences: Vec<u64> =
                    order.iter().map(|i| got[*i].event.sequence.get()).collect();
                prop_assert_eq!(
                    sequences,
                    (base + 1..=base + got.len() as u64).collect::<Vec<_>>(),
                    "{}: each recording stores one event",
                    ctx
                );
                let state = State::of(store)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                let mut tried = Vec::new();
                let mut found = None;
                for point in 0..=order.len() {
                    let mut m = model.clone();
                    match replay(&mut m, &events, &order, &got, (point, &w, &wrote), now) {
                        Ok(()) if state.is(&m) => {
                            found = Some(m);
                            break;
                        }
                        Ok(()) => tried.push(format!("after {point}: the state differs")),
                        Err(why) => tried.push(format!("after {point}: {why}")),
                    }
                }
                let Some(m) = found else {
                    return Err(TestCaseError::fail(format!(
                        "{ctx}: the write ({wrote:?}) fits after no recording of the \
                         {}: {tried:#?}",
                        order.len()
                    )));
                };
                model = m;
            }
            Op::PruneChunk {
                step: which,
                max,
                max_rows,
                max_age_ms,
                cursor_idle_ms,
            } => {
                let policy = RetentionPolicy {
                    max_age_ms: *max_age_ms,
                    max_rows: *max_rows,
                    cursor_idle_ms: *cursor_idle_ms,
                    ..RetentionPolicy::default()
                };
                let chunk_step = policy.steps(now)[*which];
                // Which idle cursors a chunk takes among more than it may delete is the
                // backend's choice (`PruneStep::Cursors`): the model takes the ones the store
                // took, once they are as many as it may delete, and all of them idle.
                let idle: Option<std::collections::BTreeSet<CursorKey>> = match chunk_step {
                    PruneStep::Cursors { cutoff } => Some(
                        model
                            .cursors
                            .iter()
                            .filter(|(_, c)| c.updated_at < cutoff)
                            .map(|(k, _)| k.clone())
                            .collect(),
                    ),
                    _ => None,
                };
                let got = store
                    .prune_chunk(&chunk_step, *max, now)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                if let Some(idle) = idle {
                    prop_assert_eq!(got, idle.len().min(*max) as u64, "{}", ctx);
                    let left: std::collections::BTreeSet<CursorKey> = store
                        .cursors(&CursorFilter::default())
                        .await
                        .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?
                        .iter()
                        .map(Cursor::key)
                        .collect();
                    let gone: Vec<CursorKey> = model
                        .cursors
                        .keys()
                        .filter(|k| !left.contains(*k))
                        .cloned()
                        .collect();
                    prop_assert!(
                        gone.len() as u64 == got && gone.iter().all(|k| idle.contains(k)),
                        "{}: deleted {} cursors, of which not all idle: {:?}",
                        ctx,
                        got,
                        gone
                    );
                    model.cursors.retain(|k, _| !gone.contains(k));
                } else {
                    let want = model.prune_chunk(&chunk_step, *max, now);
                    prop_assert_eq!(got, want, "{}", ctx);
                }
            }
            Op::Sweep { exists } => {
                let alive = |w: &WatcherKey| {
                    WATCHERS
                        .iter()
                        .position(|x| *x == w.as_str())
                        .is_some_and(|i| exists & (1 << i) != 0)
                };
                let mut want = Vec::new();
                for c in model.cursors.values_mut() {
                    if alive(&c.watcher)
                        && let Some((nc, n)) = protocol::refreeze(c, now)
                    {
                        if let Some(nc) = nc {
                            *c = nc;
                        }
                        want.push(n);
                    }
                }
                let got = store
                    .sweep(now, &alive)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                prop_assert_eq!(sorted(got), sorted(want), "{}", ctx);
            }
            Op::Prune {
                max_rows,
                chunk,
                max_age_ms,
                cursor_idle_ms,
            } => {
                let policy = RetentionPolicy {
                    max_age_ms: *max_age_ms,
                    max_rows: *max_rows,
                    cursor_idle_ms: *cursor_idle_ms,
                    chunk_rows: *chunk,
                };
                if policy.validate().is_err() {
                    // A row cap of 0: refused, and nothing deleted (the reads below compare).
                    let got = store.prune(&policy, now).await;
                    prop_assert!(
                        matches!(got, Err(crate::StoreError::InvalidInput(_))),
                        "{}: an invalid policy was not refused: {:?}",
                        ctx,
                        got
                    );
                } else {
                    let want = model.prune(&policy, now);
                    let got = store
                        .prune(&policy, now)
                        .await
                        .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                    prop_assert_eq!(got, want, "{}", ctx);
                }
            }
            Op::Reconcile {
                session: si,
                after,
                limit,
            } => {
                let r = session(*si);
                let want = model.page(&r, Sequence(*after), *limit);
                let got = store
                    .changes_since(&r, Sequence(*after), *limit)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                prop_assert_eq!(got, want, "{}", ctx);
                let v = store
                    .state_version(&r)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                prop_assert_eq!(
                    v,
                    model
                        .heads
                        .get(&r)
                        .map_or(Sequence::ZERO, |h| h.last_sequence),
                    "{}",
                    ctx
                );
            }
            Op::Advance { ms } => now = now.plus_ms(*ms),
            Op::Cursors {
                watcher: wi,
                target: ti,
                pending,
            } => {
                let filter = CursorFilter {
                    watcher: wi.map(key),
                    target: ti.map(key),
                    pending_only: *pending,
                };
                // Ordered by watcher then target: the model's key order.
                let want: Vec<Cursor> = model
                    .cursors
                    .values()
                    .filter(|c| filter.matches(c))
                    .cloned()
                    .collect();
                let got = store
                    .cursors(&filter)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                prop_assert_eq!(got, want, "{}", ctx);
            }
            Op::Cursor {
                watcher: wi,
                key: ki,
            } => {
                let k = cursor_key(*wi, *ki);
                let got = store
                    .cursor(&k.watcher, &k.target)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                prop_assert_eq!(got.as_ref(), model.cursors.get(&k), "{}", ctx);
            }
            Op::Heads { refs, repeat } => {
                let mut refs: Vec<SessionRef> = refs.iter().map(|i| heads_ref(*i)).collect();
                if *repeat && let Some(first) = refs.first().cloned() {
                    refs.push(first);
                }
                // The head of each distinct ref that has one, in any order: compared by ref.
                let want: Vec<Head> = refs
                    .iter()
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .filter_map(|r| model.heads.get(r).cloned())
                    .collect();
                let mut got = store
                    .heads(&refs)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                got.sort_by(|a, b| a.session.cmp(&b.session));
                prop_assert_eq!(got, want, "{}", ctx);
            }
            Op::EventsAfter { after, limit } => {
                let after = Sequence(after % (model.last + 3));
                let want: Vec<Arc<Event>> = model
                    .events
                    .iter()
                    .filter(|e| e.sequence > after)
                    .take(*limit)
                    .cloned()
                    .collect();
                let got = store
                    .events_after(after, *limit)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                prop_assert_eq!(got, want, "{} (after {})", ctx, after);
            }
            Op::Adopt {
                session: si,
                source,
                marker,
            } => {
                let r = session(*si);
                let spec = link_spec(r.clone(), *source, *marker);
                let plan = upstream::plan_upsert(model.links.get(&r), spec.clone(), now)
                    .expect("pool specs are valid");
                if plan.write {
                    model.links.insert(r, plan.outcome.link.clone());
                }
                let got = up
                    .upsert_link(spec, now)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                prop_assert_eq!(got, plan.outcome, "{}", ctx);
            }
            Op::SetMarker {
                session: si,
                token,
                marker,
            } => {
                let r = session(*si);
                let current = model.links.get(&r).map(|l| l.updated_at);
                let expected = match (token, current) {
                    (0, Some(t)) => t,
                    (1, Some(t)) => t.minus_ms(1),
                    _ => now,
                };
                let next = model.links.get(&r).and_then(|l| {
                    upstream::plan_set_marker(l, expected, marker_value(*marker), now)
                });
                let want = next.is_some();
                if let Some(l) = next {
                    model.links.insert(r.clone(), l);
                }
                let got = up
                    .set_marker(&r, expected, marker_value(*marker), now)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                prop_assert_eq!(got, want, "{}", ctx);
            }
            Op::MarkScanned { session: si } => {
                let r = session(*si);
                let link = model.links.get_mut(&r);
                let want = link.is_some();
                if let Some(l) = link {
                    l.last_scanned_at = Some(now);
                }
                let got = up
                    .mark_scanned(&r, now)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                prop_assert_eq!(got, want, "{}", ctx);
            }
            Op::RemoveLink { session: si, token } => {
                let r = session(*si);
                let current = model.links.get(&r).map_or(now, |l| l.updated_at);
                let expected = token.map(|t| current.minus_ms(i64::from(t)));
                let want = model
                    .links
                    .get(&r)
                    .is_some_and(|l| upstream::may_remove(l, expected));
                if want {
                    model.links.remove(&r);
                }
                let got = up
                    .remove_link(&r, expected)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
                prop_assert_eq!(got, want, "{}", ctx);
            }
        }
        if let Op::Adopt { session: si, .. }
        | Op::SetMarker { session: si, .. }
        | Op::MarkScanned { session: si }
        | Op::RemoveLink { session: si, .. }
        | Op::Delete { session: si } = op
        {
            let r = session(*si);
            let got = up
                .link(&r)
                .await
                .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
            prop_assert_eq!(got.as_ref(), model.links.get(&r), "link after {}", ctx);
            let all = up
                .links()
                .await
                .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
            prop_assert_eq!(
                all,
                model.links.values().cloned().collect::<Vec<_>>(),
                "links after {}",
                ctx
            );
        }
        // Every observable after every step.
        let State {
            cursors,
            heads,
            events,
        } = State::of(store)
            .await
            .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
        // Every invariant `awareness doctor` checks (no torn cursor among them).
        let findings = crate::audit::audit(&heads, &events, &cursors);
        prop_assert!(findings.is_empty(), "after {}: {:?}", ctx, findings);
        prop_assert_eq!(
            cursors,
            model.cursors.values().cloned().collect::<Vec<_>>(),
            "cursors after {}",
            ctx
        );
        prop_assert_eq!(
            heads,
            model.heads.values().cloned().collect::<Vec<_>>(),
            "heads after {}",
            ctx
        );
        let stats = store
            .log_stats()
            .await
            .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
        prop_assert_eq!(stats, model.stats(), "log after {}", ctx);
        // The whole log too, so an event stored wrong and pruned or deleted before any read
        // step asked for it does not slip by.
        prop_assert_eq!(&events, &model.events, "log after {}", ctx);
    }
    let all = store
        .events_after(Sequence::ZERO, usize::MAX / 2)
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(all, model.events.clone(), "whole log at the end");
    let links = up
        .links()
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(
        links,
        model.links.values().cloned().collect::<Vec<_>>(),
        "links at the end"
    );
    let by_agent = store
        .list_heads(Some(&AgentId::new("ops").expect("agent")))
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(
        by_agent,
        model
            .heads
            .values()
            .filter(|h| h.session.agent_id.as_str() == "ops")
            .cloned()
            .collect::<Vec<_>>()
    );
    Ok(())
}

/// Runs the model test: `PROPTEST_CASES` cases (default 256) of up to 60 operations each, a
/// fresh subject from `factory` per case.
///
/// The cases come from a seed drawn at random, or `PROPTEST_RNG_SEED`; a failure names the
/// seed, so that the same cases can be generated again (on two threads, the interleaving of
/// a concurrent wave is not replayed). Shrinking a failing case stops after
/// `PROPTEST_MAX_SHRINK_TIME` milliseconds (default two minutes: each shrinking step runs a
/// case again on a fresh store, on a file for the durable ones), reporting the smallest case
/// found by then.
///
/// On two worker threads, as the conformance suite runs: the calls of an `Op::Concurrent` wave
/// then overlap on a store whose `record` never waits (store-memory), where one thread ran
/// them one after another in the order they were spawned. A store that group-commits
/// ([`Subject::batching`]) commits each wave's valid calls in one batch, which each wave checks.
pub fn run<F, Fut>(factory: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Subject>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (mut runner, again) = seeded_runner();
    let result = runner.run(&proptest::collection::vec(op_strategy(), 1..60), |ops| {
        rt.block_on(async {
            let subject = factory().await;
            check_case(&subject, &ops).await
        })
    });
    if let Err(e) = result {
        panic!("model test failed: {e}\n({again})");
    }
}

/// A proptest runner as the workspace's model tests use one: `PROPTEST_CASES` cases (default
/// 256), from a seed drawn at random or given as `PROPTEST_RNG_SEED`, no failure persisted,
/// and shrinking bounded by `PROPTEST_MAX_SHRINK_TIME` milliseconds (default two minutes).
/// Also returns what to set to run the same cases again, for a failure's message.
pub fn seeded_runner() -> (TestRunner, String) {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let defaults = Config::default();
    let seed = match defaults.rng_seed {
        RngSeed::Fixed(seed) => seed,
        RngSeed::Random => {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        }
    };
    let max_shrink_time = match defaults.max_shrink_time {
        0 => MAX_SHRINK_MS,
        set => set,
    };
    let runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        max_shrink_time,
        ..defaults
    });
    let again =
        format!("PROPTEST_RNG_SEED={seed} PROPTEST_CASES={cases} generates the same cases again");
    (runner, again)
}

/// How long, in milliseconds, shrinking a failing case may take unless
/// `PROPTEST_MAX_SHRINK_TIME` says otherwise.
const MAX_SHRINK_MS: u32 = 120_000;
