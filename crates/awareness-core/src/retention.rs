//! Retention planning of DESIGN.md section 6: what pruning deletes, in which order, and how the
//! pruned watermarks are stamped. Backends run the steps in bounded chunks.
//!
//! The age step compares each event's stored `occurredAt` with a cutoff taken from the local
//! clock. `occurredAt` is the producer's time clamped into `[now - 24 h, now]` when the event
//! was recorded, so an event can be pruned up to 24 h earlier than its recording time alone
//! would allow (docs/decisions/0011).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{Head, Sequence, SessionRef, Timestamp};
use crate::validate::ValidationError;

/// How much history a store keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionPolicy {
    /// Events whose `occurredAt` is older than this (measured from the local clock at pruning)
    /// are deleted. `occurredAt` may lie up to 24 h before the recording, so an event may go
    /// up to a day early (docs/decisions/0011). Default 30 days.
    pub max_age_ms: i64,
    /// At most this many events are kept store-wide (the oldest go first). Default 50,000.
    pub max_rows: u64,
    /// Cursors not updated for this long are deleted. Default 30 days. A repeated watch
    /// refreshes a cursor at most once a day ([`crate::protocol::WATCH_REFRESH_MS`]): below a
    /// day or so, a watch confirmed often may still go as idle (docs/decisions/0018).
    pub cursor_idle_ms: i64,
    /// At most this many rows are deleted by one [`crate::EventStore::prune_chunk`] call.
    /// A backend may split a chunk into smaller write transactions, each atomic (store-sqlite:
    /// 250 rows each; store-redb: 2,000; store-memory: steps of 256 rows under its lock).
    /// Default 2,000.
    pub chunk_rows: usize,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self {
            max_age_ms: 30 * Timestamp::DAY_MS,
            max_rows: 50_000,
            cursor_idle_ms: 30 * Timestamp::DAY_MS,
            chunk_rows: 2_000,
        }
    }
}

/// One kind of deletion; a backend runs it as repeated chunks until a chunk deletes fewer rows
/// than its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    tag = "step"
)]
pub enum PruneStep {
    /// Delete events with `occurredAt < cutoff`, lowest sequence first. The cutoff comes from
    /// the local clock; `occurredAt` is the event's clamped time, not its recording time.
    Age {
        /// The cutoff.
        cutoff: Timestamp,
    },
    /// Delete the lowest sequences beyond `max_rows` retained rows.
    RowCap {
        /// Rows to keep.
        max_rows: u64,
    },
    /// Delete cursors with `updated_at < cutoff`, in an order of the backend's choosing (a
    /// chunk bounded below the idle cursors' number may take any of them; a pass takes all).
    Cursors {
        /// The cutoff.
        cutoff: Timestamp,
    },
}

impl RetentionPolicy {
    /// Refuses a policy that would delete everything: an age or idle limit of zero or less (its
    /// cutoff is now or later, so a pass deletes every event or every cursor, and with them
    /// every pending notice), a row cap of 0, or chunks of 0 rows.
    /// [`crate::AwarenessStoreExt::prune`] checks it before deleting anything.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let refuse =
            |field, value: i128, rule| Err(ValidationError::RetentionPolicy { field, value, rule });
        if self.max_age_ms <= 0 {
            return refuse(
                "maxAgeMs",
                self.max_age_ms.into(),
                "it must be at least 1 ms",
            );
        }
        if self.cursor_idle_ms <= 0 {
            return refuse(
                "cursorIdleMs",
                self.cursor_idle_ms.into(),
                "it must be at least 1 ms",
            );
        }
        if self.max_rows == 0 {
            return refuse(
                "maxRows",
                0,
                "it must be at least 1 (u64::MAX keeps every event)",
            );
        }
        if self.chunk_rows == 0 {
            return refuse("chunkRows", 0, "it must be at least 1");
        }
        Ok(())
    }

    /// The steps of one pruning pass at `now`, in order: by age, by row cap, idle cursors.
    pub fn steps(&self, now: Timestamp) -> [PruneStep; 3] {
        [
            PruneStep::Age {
                cutoff: self.age_cutoff(now),
            },
            PruneStep::RowCap {
                max_rows: self.max_rows,
            },
            PruneStep::Cursors {
                cutoff: self.idle_cutoff(now),
            },
        ]
    }

    /// A pass at `now` deletes the events whose `occurredAt` is before this.
    pub fn age_cutoff(&self, now: Timestamp) -> Timestamp {
        now.minus_ms(self.max_age_ms)
    }

    /// A pass at `now` deletes the cursors last updated before this.
    pub fn idle_cutoff(&self, now: Timestamp) -> Timestamp {
        now.minus_ms(self.cursor_idle_ms)
    }
}

/// How many of `retained` rows a row-cap chunk may delete, bounded by `chunk`.
pub fn row_cap_victims(retained: u64, max_rows: u64, chunk: usize) -> usize {
    let excess = retained.saturating_sub(max_rows);
    usize::try_from(excess).unwrap_or(usize::MAX).min(chunk)
}

/// The highest deleted sequence per ref, to stamp **before** deleting.
pub fn watermarks<'a>(
    victims: impl IntoIterator<Item = (&'a SessionRef, Sequence)>,
) -> BTreeMap<SessionRef, Sequence> {
    let mut out: BTreeMap<SessionRef, Sequence> = BTreeMap::new();
    for (r, s) in victims {
        let e = out.entry(r.clone()).or_default();
        *e = (*e).max(s);
    }
    out
}

/// Stamps a head's pruned watermark at `now`: the watermark is only ever raised and the head
/// never lowered; `updated_at` moves up to `now` when the watermark rises (never back: a
/// recording between two chunks of one pass may be later than the pass; OpenClaw's heads show
/// the time of the pruning that raised it: in its fixture, `agent:main:subagent:old`, recorded
/// at 1800000000000, has `updated_at` 1802600000000, the time of the recording whose pruning
/// deleted its event).
pub fn stamp(head: &Head, pruned: Sequence, now: Timestamp) -> Head {
    let mut h = head.clone();
    if pruned > h.pruned_max_sequence {
        h.pruned_max_sequence = pruned;
        h.updated_at = h.updated_at.max(now);
    }
    h
}

/// What a pruning pass at `now` would delete, from the retained events' `occurredAt` and the
/// cursors' `updated_at`, without deleting anything (an operator's dry run). The counts equal the
/// [`PruneReport`] of the pass (chunks aside). [`Preview`] counts the same a piece at a time.
pub fn preview(
    policy: &RetentionPolicy,
    now: Timestamp,
    event_times: impl IntoIterator<Item = Timestamp>,
    cursor_times: impl IntoIterator<Item = Timestamp>,
) -> PruneReport {
    let mut p = Preview::new(policy, now);
    p.events(event_times);
    p.cursors(cursor_times);
    p.report()
}

/// [`preview`], fed in as many pieces as wanted (a page of events at a time), so that a dry
/// run over a long log holds one page, not the log.
#[derive(Debug, Clone)]
pub struct Preview {
    age_cutoff: Timestamp,
    max_rows: u64,
    idle_cutoff: Timestamp,
    rows: u64,
    old: u64,
    idle: u64,
}

impl Preview {
    /// Counts for a pass of `policy` at `now`, nothing counted yet.
    pub fn new(policy: &RetentionPolicy, now: Timestamp) -> Self {
        Self {
            age_cutoff: policy.age_cutoff(now),
            max_rows: policy.max_rows,
            idle_cutoff: policy.idle_cutoff(now),
            rows: 0,
            old: 0,
            idle: 0,
        }
    }

    /// Counts retained events, by their `occurredAt`.
    pub fn events(&mut self, times: impl IntoIterator<Item = Timestamp>) {
        for t in times {
            self.rows += 1;
            self.old += u64::from(t < self.age_cutoff);
        }
    }

    /// Counts `rows` retained events whose time cannot be read (rows the store cannot read):
    /// not for the age step, which only a pass can tell them for; for the row cap, which a pass
    /// applies to the whole log, oldest first, and so to the rows counted before them.
    pub fn unread(&mut self, rows: u64) {
        self.rows += rows;
    }

    /// Counts cursors, by their `updated_at`.
    pub fn cursors(&mut self, times: impl IntoIterator<Item = Timestamp>) {
        self.idle += times.into_iter().filter(|t| *t < self.idle_cutoff).count() as u64;
    }

    /// What the pass would delete, from everything counted so far (chunks: 0).
    pub fn report(&self) -> PruneReport {
        PruneReport {
            events_by_age: self.old,
            events_by_cap: (self.rows - self.old).saturating_sub(self.max_rows),
            cursors: self.idle,
            chunks: 0,
        }
    }
}

/// What one pruning pass deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PruneReport {
    /// Events deleted for age.
    pub events_by_age: u64,
    /// Events deleted for the row cap.
    pub events_by_cap: u64,
    /// Idle cursors deleted.
    pub cursors: u64,
    /// [`crate::EventStore::prune_chunk`] calls made (a backend may use more write
    /// transactions than this).
    pub chunks: u64,
}

impl PruneReport {
    /// Adds a chunk's count to the counter of its step.
    pub fn add(&mut self, step: &PruneStep, deleted: u64) {
        self.chunks += 1;
        match step {
            PruneStep::Age { .. } => self.events_by_age += deleted,
            PruneStep::RowCap { .. } => self.events_by_cap += deleted,
            PruneStep::Cursors { .. } => self.cursors += deleted,
        }
    }
}

/// A pruning pass that stopped at a failure ([`crate::AwarenessStoreExt::prune_counted`]): the
/// chunks that committed before it stay deleted, and a pass run again goes on from there.
#[derive(Debug)]
pub struct PruneFailed {
    /// What the chunks that ended before the failure deleted. The failed chunk is not counted,
    /// though a backend that splits a chunk into several transactions may have committed part
    /// of it: this is a lower bound.
    pub done: PruneReport,
    /// Why the pass stopped.
    pub error: crate::error::StoreError,
}

impl std::fmt::Display for PruneFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pruning stopped after {} chunk(s) (at least {} event(s) by age, {} by the row cap, \
             {} idle cursor(s) deleted)",
            self.done.chunks, self.done.events_by_age, self.done.events_by_cap, self.done.cursors
        )
    }
}

impl std::error::Error for PruneFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Runs one pruning chunk of at most `max_rows` rows as write transactions of at most `per_tx`
/// rows each ([`crate::EventStore::prune_chunk`]: a backend splits a chunk so that a recording
/// never waits behind more than one transaction). `one_tx(bound)` chooses at most `bound` rows
/// and deletes those still there in one transaction, answering (chosen, deleted); a backend that
/// chooses inside the transaction answers the same number twice. The chunk ends at `max_rows`
/// rows deleted, or after a transaction that chose fewer than its bound (the step has nothing
/// more to delete). A transaction that chose its bound but deleted fewer (rows deleted between
/// the choice and the write, by a backend that chooses on a read snapshot) is followed by more
/// for the rest: a chunk answering fewer than `max_rows` ends its step
/// ([`crate::AwarenessStoreExt::prune`]), and the step's other rows would wait for the next
/// pass. After [`IDLE_TRANSACTIONS`] transactions in a row that chose their bound and deleted
/// nothing, the chunk ends all the same: a backend whose choice keeps naming rows its write
/// cannot delete would otherwise loop for good. Answers the rows deleted.
pub async fn in_transactions<F, Fut>(
    max_rows: usize,
    per_tx: usize,
    mut one_tx: F,
) -> Result<u64, crate::StoreError>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(usize, u64), crate::StoreError>>,
{
    let mut total = 0u64;
    let mut left = max_rows;
    let mut idle = 0;
    while left > 0 {
        let bound = left.min(per_tx.max(1));
        let (chosen, deleted) = one_tx(bound).await?;
        total = total.saturating_add(deleted);
        if chosen < bound {
            break;
        }
        idle = if deleted == 0 { idle + 1 } else { 0 };
        if idle == IDLE_TRANSACTIONS {
            break;
        }
        left -= usize::try_from(deleted).map_or(bound, |d| d.min(bound));
    }
    Ok(total)
}

/// How many transactions in a row of [`in_transactions`] may choose their bound and delete
/// nothing (every row chosen was deleted by another writer in between, or cannot be deleted)
/// before the chunk ends.
pub const IDLE_TRANSACTIONS: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;

    /// The transactions of a chunk, as scripted (chosen, deleted) answers: what each was asked
    /// for, and the total. Rows chosen but deleted meanwhile are made up by more transactions;
    /// a transaction that chose fewer than its bound ends the chunk.
    #[test]
    fn a_chunk_makes_up_rows_deleted_between_the_choice_and_the_write() {
        fn run(per_tx: usize, answers: &[(usize, u64)]) -> (u64, Vec<usize>) {
            let mut asked = Vec::new();
            let mut answers = answers.iter().copied();
            let total = futures_lite_block_on(in_transactions(4, per_tx, |bound| {
                asked.push(bound);
                let answer = answers.next().expect("no transaction beyond the script");
                std::future::ready(Ok(answer))
            }))
            .expect("transactions");
            (total, asked)
        }
        assert_eq!(run(4, &[(4, 3), (1, 1)]), (4, vec![4, 1]));
        assert_eq!(run(4, &[(4, 0), (4, 4)]), (4, vec![4, 4]));
        assert_eq!(run(4, &[(4, 2), (2, 1), (0, 0)]), (3, vec![4, 2, 1]));
        assert_eq!(run(4, &[(4, 4)]), (4, vec![4]));
        assert_eq!(run(4, &[(3, 3)]), (3, vec![4]));
        assert_eq!(run(4, &[(0, 0)]), (0, vec![4]));
        assert_eq!(run(3, &[(3, 3), (1, 1)]), (4, vec![3, 1]));
        assert_eq!(run(3, &[(2, 2)]), (2, vec![3]));
        // Review, stop 53: a choice that keeps naming rows the write does not delete looped for
        // good; three such transactions in a row end the chunk.
        assert_eq!(run(4, &[(4, 0), (4, 0), (4, 0)]), (0, vec![4, 4, 4]));
        assert_eq!(
            run(4, &[(4, 0), (4, 0), (4, 1), (4, 0), (4, 0), (3, 3)]),
            (4, vec![4, 4, 4, 3, 3, 3])
        );
    }

    /// Polls a future that never waits (each transaction here is `ready`) to its end.
    fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(out) => out,
            std::task::Poll::Pending => panic!("a scripted transaction waited"),
        }
    }

    /// The defaults DESIGN.md section 6 names (30 days, 50,000 rows, cursors idle 30 days) and
    /// the chunk the docs give; a changed default changes what every gateway keeps.
    #[test]
    fn the_default_policy_is_the_documented_one() {
        assert_eq!(
            RetentionPolicy::default(),
            RetentionPolicy {
                max_age_ms: 30 * 24 * 60 * 60 * 1_000,
                max_rows: 50_000,
                cursor_idle_ms: 30 * 24 * 60 * 60 * 1_000,
                chunk_rows: 2_000,
            }
        );
    }

    #[test]
    fn steps_and_caps() {
        let p = RetentionPolicy::default();
        let now = Timestamp(40 * Timestamp::DAY_MS);
        assert_eq!(
            p.steps(now)[0],
            PruneStep::Age {
                cutoff: Timestamp(10 * Timestamp::DAY_MS)
            }
        );
        assert_eq!(row_cap_victims(60_000, 50_000, 2_000), 2_000);
        assert_eq!(row_cap_victims(50_500, 50_000, 2_000), 500);
        assert_eq!(row_cap_victims(10, 50_000, 2_000), 0);
    }

    /// Each limit cuts at its own cutoff (a policy keeping events a day and cursors thirty days
    /// must not expire cursors after a day), and a preview counts only what is strictly older
    /// than its cutoff, as a pass deletes: what sits on it stays.
    #[test]
    fn each_limit_cuts_at_its_own_cutoff_and_keeps_what_is_on_it() {
        let p = RetentionPolicy {
            max_age_ms: Timestamp::DAY_MS,
            cursor_idle_ms: 30 * Timestamp::DAY_MS,
            ..RetentionPolicy::default()
        };
        let now = Timestamp(40 * Timestamp::DAY_MS);
        assert_eq!(
            p.steps(now),
            [
                PruneStep::Age {
                    cutoff: Timestamp(39 * Timestamp::DAY_MS)
                },
                PruneStep::RowCap { max_rows: 50_000 },
                PruneStep::Cursors {
                    cutoff: Timestamp(10 * Timestamp::DAY_MS)
                },
            ]
        );
        let (age, idle) = (p.age_cutoff(now), p.idle_cutoff(now));
        let r = preview(
            &p,
            now,
            [age, age.minus_ms(1)],
            [idle, idle.minus_ms(1), Timestamp(38 * Timestamp::DAY_MS)],
        );
        assert_eq!((r.events_by_age, r.cursors), (1, 1));
    }

    /// A step's fields are named in camelCase in JSON, as the policy's are.
    #[test]
    fn steps_name_their_fields_in_camel_case() {
        let json = serde_json::to_value([
            PruneStep::RowCap { max_rows: 7 },
            PruneStep::Cursors {
                cutoff: Timestamp(5),
            },
        ])
        .unwrap();
        assert_eq!(
            json,
            serde_json::json!([
                {"step": "rowCap", "maxRows": 7},
                {"step": "cursors", "cutoff": 5},
            ])
        );
        let back: PruneStep = serde_json::from_value(json[0].clone()).unwrap();
        assert_eq!(back, PruneStep::RowCap { max_rows: 7 });
    }

    /// Counted a piece at a time, a preview gives what one call gives.
    #[test]
    fn a_preview_in_pieces_counts_what_one_call_counts() {
        let p = RetentionPolicy {
            max_rows: 3,
            ..RetentionPolicy::default()
        };
        let now = Timestamp(40 * Timestamp::DAY_MS);
        let times: Vec<Timestamp> = (0..11)
            .map(|d| Timestamp(d * 4 * Timestamp::DAY_MS))
            .collect();
        let whole = preview(&p, now, times.iter().copied(), times.iter().copied());
        let mut pieces = Preview::new(&p, now);
        for chunk in times.chunks(4) {
            pieces.events(chunk.iter().copied());
        }
        pieces.cursors(times[..5].iter().copied());
        pieces.cursors(times[5..].iter().copied());
        assert_eq!(pieces.report(), whole);
        assert_eq!(
            (whole.events_by_age, whole.events_by_cap, whole.cursors),
            (3, 5, 3),
            "3 events older than 30 days, 8 younger of which 3 stay, 3 idle cursors"
        );
    }

    #[test]
    fn preview_counts_unread_rows_for_the_cap_only() {
        let policy = RetentionPolicy {
            max_rows: 3,
            ..RetentionPolicy::default()
        };
        let now = Timestamp(100 * Timestamp::DAY_MS);
        let mut p = Preview::new(&policy, now);
        // One event old enough for the age step, two young.
        p.events([Timestamp(0), now, now]);
        p.unread(4);
        let r = p.report();
        assert_eq!(
            (r.events_by_age, r.events_by_cap),
            (1, 3),
            "6 left after age, cap 3"
        );
    }

    #[test]
    fn preview_counts_what_a_pass_deletes() {
        let p = RetentionPolicy {
            max_rows: 3,
            ..RetentionPolicy::default()
        };
        let now = Timestamp(40 * Timestamp::DAY_MS);
        let old = Timestamp(5 * Timestamp::DAY_MS);
        let fresh = Timestamp(39 * Timestamp::DAY_MS);
        let r = preview(
            &p,
            now,
            [old, old, fresh, fresh, fresh, fresh, fresh],
            [old, fresh],
        );
        assert_eq!(
            (r.events_by_age, r.events_by_cap, r.cursors, r.chunks),
            (2, 2, 1, 0)
        );
    }

    #[test]
    fn watermark_never_lowers() {
        let a = SessionRef::parse("a", "main").unwrap();
        let b = SessionRef::parse("a", "ops").unwrap();
        let w = watermarks([(&a, Sequence(3)), (&b, Sequence(1)), (&a, Sequence(2))]);
        assert_eq!(w[&a], Sequence(3));
        assert_eq!(w[&b], Sequence(1));
        let h = Head {
            session: a,
            last_sequence: Sequence(9),
            pruned_max_sequence: Sequence(5),
            updated_at: Timestamp(0),
        };
        let now = Timestamp(1_000);
        assert_eq!(stamp(&h, Sequence(3), now), h, "not raised: unchanged");
        let raised = stamp(&h, Sequence(7), now);
        assert_eq!(raised.pruned_max_sequence, Sequence(7));
        assert_eq!(raised.last_sequence, Sequence(9));
        assert_eq!(raised.updated_at, now, "raised at `now`, as OpenClaw's");
        let recorded_later = Head {
            updated_at: Timestamp(2_000),
            ..h
        };
        assert_eq!(
            stamp(&recorded_later, Sequence(7), now).updated_at,
            Timestamp(2_000),
            "a head's clock never goes back"
        );
    }
    /// A failed pass names the store's error as its source, so an error chain says why pruning
    /// stopped, not only how far it got. (What the mutation did: `source` answered `None`, the
    /// chain printed "pruning stopped after 2 chunk(s) ..." without the store's error; review of
    /// stop 68, CP08.)
    #[test]
    fn a_failed_pass_shows_its_cause_in_the_error_chain() {
        let failed = PruneFailed {
            done: PruneReport {
                chunks: 2,
                ..PruneReport::default()
            },
            error: crate::StoreError::corrupt("the events table is unreadable"),
        };
        let chain = crate::error::ErrorChain(&failed).to_string();
        assert!(
            chain.starts_with("pruning stopped after 2 chunk(s)"),
            "{chain}"
        );
        assert!(
            chain.contains("the events table is unreadable"),
            "the cause: {chain}"
        );
    }

    /// A stamp that raises no watermark leaves the head as it is, `updated_at` included (it
    /// "moves up to now when the watermark rises"): two pruners stamping the same sequence
    /// move it once. (`>=` for `>`, a mutation every test passed, moved it at each: review of
    /// stop 61.)
    #[test]
    fn a_stamp_that_raises_nothing_leaves_the_head() {
        let h = Head {
            session: SessionRef::parse("agent:main:x", "main").unwrap(),
            last_sequence: Sequence(9),
            pruned_max_sequence: Sequence(4),
            updated_at: Timestamp(10),
        };
        assert_eq!(stamp(&h, Sequence(4), Timestamp(50)), h);
        assert_eq!(stamp(&h, Sequence(3), Timestamp(50)), h);
        assert_eq!(
            stamp(&h, Sequence(5), Timestamp(50)).updated_at,
            Timestamp(50)
        );
    }
}
