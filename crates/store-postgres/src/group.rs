//! Group commit (docs/decisions/0005): recordings that arrive while the handle's writes wait
//! for their turn queue up, and the next writer records up to
//! [`crate::PgStoreOptions::group_commit`] of them in one transaction of four round trips,
//! whatever their number: `BEGIN` with the store's lock, [`rows::GROUP_READ`],
//! [`rows::GROUP_WRITE`], `COMMIT`.
//!
//! The protocol is core's, event by event in queue order, each through
//! [`protocol::on_event`] against the cursors and the head as the events before it in the batch
//! left them, exactly as one transaction per event would decide: the model test's `Concurrent`
//! step holds the two equal. Each caller gets its own [`Recorded`] only after the commit that
//! holds its event.
//!
//! Failure: a batch whose statements fail is rolled back and its events are recorded again one
//! per transaction, so that an event that cannot be written (a dedupe hit on a row that cannot
//! be read, one past the counter's end) fails only its own caller. When the failure is the
//! transaction's own (its `BEGIN`, the store's lock, its `COMMIT`) or may go away by itself (a
//! lost connection, a server restarting: [`StoreError::is_retryable`]), each event alone would
//! meet it again: every caller gets it at once, each a copy of its own. A connection lost
//! during the `COMMIT` is settled as for one recording ([`Inner::commit_known`]): committed,
//! every caller is answered; rolled back, the batch is recorded again, once, as one batch.
//!
//! Cancellation: a batch runs on the store's runtime, in a task of its own that holds the
//! handle's turn: a caller that gives up cancels nobody's commit. A caller that gives up while
//! its event still waits in the queue takes the event out ([`awareness_core::queue::Queued`]);
//! once a batch holds it, it is committed, unless the handle itself is dropped first (its
//! runtime then drops the batch, which rolls back; a caller still waiting holds the handle, so
//! only events whose callers all gave up can go that way).

use std::collections::HashMap;
use std::sync::Arc;

use awareness_core::{
    Cursor, Event, Head, NewEvent, Recorded, Sequence, SessionKey, SessionRef, StoreError,
    Timestamp, WatcherKey, protocol,
};
use sqlx::Row as _;
use tokio::sync::oneshot;

use crate::LAST_SEQUENCE;
use crate::rows;
use crate::store::{CursorColumns, Inner, TxId, Uncommitted, Write, column, int};

const WHAT: &str = "recording";

/// One queued recording: the caller's event (valid), its clock, and where its answer goes.
pub(crate) struct Job {
    /// Tells a caller's own job from the others when it takes the queue.
    pub(crate) id: u64,
    pub(crate) event: NewEvent,
    pub(crate) now: Timestamp,
    pub(crate) reply: oneshot::Sender<Result<Recorded, StoreError>>,
}

impl awareness_core::queue::Job for Job {
    fn id(&self) -> u64 {
        self.id
    }
}

/// The recordings waiting for the handle's turn.
pub(crate) type Queue = awareness_core::queue::Queue<Job>;

/// A caller's answer from the batch that held its event; a batch that ended without answering
/// (it panicked, or the store's runtime ended) is an error naming the store.
pub(crate) fn answered(
    store: &str,
    got: Result<Result<Recorded, StoreError>, oneshot::error::RecvError>,
) -> Result<Recorded, StoreError> {
    got.unwrap_or_else(|e| {
        Err(StoreError::backend(
            format!("{store}: {WHAT}: the batch that held this event stopped before its commit was known"),
            e,
        ))
    })
}

/// What a batch decided for one of its recordings.
enum Outcome {
    Stored(Recorded),
    /// A dedupe hit on an event stored before the batch, or earlier in it.
    Hit(Arc<Event>),
}

/// How a batch failed.
enum Failed {
    /// Its transaction: the `BEGIN` or the store's lock (a statement timeout while another
    /// gateway held it, say), or the `COMMIT`. Each event alone would meet it again.
    Transaction(StoreError),
    /// One of its statements, or what it read (a dedupe hit on a row that cannot be read, too
    /// few numbers left): possibly one event's failure.
    Statement(StoreError),
    /// The answer to its `COMMIT` was lost and the server then said it did not commit:
    /// nothing was written, and the batch is recorded again.
    RolledBack(StoreError),
}

impl Inner {
    /// Records `jobs` (at least two) in one transaction and answers every caller. A batch whose
    /// statements fail is rolled back and its events are recorded again one per transaction, so
    /// that an event that cannot be written fails only its own caller; when the failure is the
    /// transaction's own or may go away by itself (retryable), every caller gets it at once,
    /// as do those after an event recorded alone that met a retryable one.
    pub(crate) async fn record_batch(&self, jobs: Vec<Job>) {
        let mut done = self.batch(&jobs).await;
        if let Err(Failed::RolledBack(e)) = &done {
            tracing::warn!(store = %self.name, error = %awareness_core::error::ErrorChain(e), events = jobs.len(), "a group commit did not commit after the answer to its COMMIT was lost; recording it again");
            done = self.batch(&jobs).await;
        }
        let e = match done {
            Ok(answers) => {
                for (job, rec) in jobs.into_iter().zip(answers) {
                    // A caller that went away no longer wants its answer; its event is
                    // committed.
                    drop(job.reply.send(Ok(rec)));
                }
                return;
            }
            Err(Failed::Statement(e)) if !e.is_retryable() => e,
            Err(Failed::Statement(e) | Failed::Transaction(e) | Failed::RolledBack(e)) => {
                tracing::debug!(store = %self.name, error = %awareness_core::error::ErrorChain(&e), events = jobs.len(), "a group commit's transaction failed; every caller gets the error");
                fail_all(jobs, &e);
                return;
            }
        };
        tracing::debug!(store = %self.name, error = %awareness_core::error::ErrorChain(&e), events = jobs.len(), "a group commit failed; recording its events one by one");
        let mut jobs = jobs.into_iter();
        let mut lost = None;
        for job in jobs.by_ref() {
            let res = awareness_core::EventStore::record(self, job.event, job.now).await;
            lost = res
                .as_ref()
                .err()
                .filter(|e| e.is_retryable())
                .map(StoreError::for_another_caller);
            drop(job.reply.send(res));
            if lost.is_some() {
                break;
            }
        }
        if let Some(e) = lost {
            fail_all(jobs, &e);
        }
    }

    /// The batch's transaction; one answer per job, in order.
    async fn batch(&self, jobs: &[Job]) -> Result<Vec<Recorded>, Failed> {
        let mut tx = self
            .write_with(WHAT, &self.begin_batch)
            .await
            .map_err(Failed::Transaction)?;
        let answers = match self.batch_statements(&mut tx, jobs).await {
            Ok(answers) => answers,
            Err(e) => {
                self.end_abandoned(tx).await;
                return Err(Failed::Statement(e));
            }
        };
        let written: Vec<&Event> = answers
            .iter()
            .filter(|r| !r.deduplicated)
            .map(|r| &*r.event)
            .collect();
        self.commit_known(tx, WHAT, &written, true)
            .await
            .map_err(|u| match u {
                Uncommitted::RolledBack(e) => Failed::RolledBack(e),
                Uncommitted::Failed(e) => Failed::Transaction(e),
            })?;
        Ok(answers)
    }

    /// The batch's two statements in `tx` (the second left out when nothing is to be written:
    /// every recording a dedupe hit); one answer per job, in order, all settled before the
    /// commit (a failure after it would record the events a second time, one by one).
    async fn batch_statements(
        &self,
        tx: &mut Write,
        jobs: &[Job],
    ) -> Result<Vec<Recorded>, StoreError> {
        let n = i64::try_from(jobs.len()).unwrap_or(i64::MAX);
        let mut refs: Vec<SessionRef> = jobs.iter().map(|j| j.event.session.clone()).collect();
        refs.sort_unstable();
        refs.dedup();
        let keys: Vec<&str> = jobs
            .iter()
            .filter_map(|j| j.event.dedupe_key.as_deref())
            .collect();
        let read = sqlx::query(rows::GROUP_READ)
            .bind(int(Sequence(LAST_SEQUENCE)))
            .bind(n)
            .bind(keys)
            .bind(
                refs.iter()
                    .map(|r| r.session_key.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(refs.iter().map(|r| r.agent_id.as_str()).collect::<Vec<_>>())
            .fetch_all(&mut **tx)
            .await
            .map_err(self.failed(WHAT))?;
        let first_row = read.first().ok_or_else(|| {
            self.rows()
                .corrupt("the sequence counter", "its row is missing")
        })?;
        let col = |i: usize| -> Result<Option<i64>, StoreError> {
            first_row.try_get(i).map_err(self.failed(WHAT))
        };
        let Some(top) = col(0)? else {
            // Fewer numbers left than events: recorded one by one, those that fit are.
            let at = col(1)?.unwrap_or_default();
            return Err(StoreError::counter_at_end(
                at.max(0) as u64,
                LAST_SEQUENCE,
                None,
            ));
        };
        let first = top - n + 1;
        tx.id = Some(TxId::at(first_row, rows::GROUP_XID).map_err(self.failed(WHAT))?);

        // What the batch read: the events of the dedupe keys, the heads, the cursors.
        let mut stored: HashMap<String, Result<Arc<Event>, StoreError>> = HashMap::new();
        let mut heads: HashMap<SessionRef, Result<Option<Head>, StoreError>> = HashMap::new();
        for row in &read {
            let text = |i: usize| -> Result<Option<String>, StoreError> {
                row.try_get(i).map_err(self.failed(WHAT))
            };
            if row
                .try_get::<Option<i64>, _>(2)
                .map_err(self.failed(WHAT))?
                .is_some()
            {
                if let Some(key) = text(3)? {
                    stored.insert(key, self.rows().event_at(row, 2).map(Arc::new));
                }
            } else if row
                .try_get::<Option<bool>, _>(19)
                .map_err(self.failed(WHAT))?
                .is_some()
            {
                let (key, agent) = (text(14)?, text(15)?);
                // The row was read by its key and agent: it is one of the batch's refs.
                if let Some(r) = refs.iter().find(|r| {
                    key.as_deref() == Some(r.session_key.as_str())
                        && agent.as_deref() == Some(r.agent_id.as_str())
                }) {
                    heads.insert(r.clone(), self.rows().head_at(r, row, 16));
                }
            }
        }
        let mut on_key: HashMap<SessionKey, Vec<Cursor>> = HashMap::new();
        for c in self.rows().readable_cursors_at(&read, 20) {
            on_key.entry(c.target.clone()).or_default().push(c);
        }

        // The protocol, event by event in queue order.
        let mut changed: HashMap<(WatcherKey, SessionKey), Cursor> = HashMap::new();
        let mut last: HashMap<SessionRef, Head> = HashMap::new();
        let mut events: Vec<Arc<Event>> = Vec::with_capacity(jobs.len());
        let mut outcomes = Vec::with_capacity(jobs.len());
        for (i, job) in jobs.iter().enumerate() {
            if let Some(key) = job.event.dedupe_key.as_deref() {
                let earlier = events.iter().find(|e| e.dedupe_key.as_deref() == Some(key));
                if let Some(e) = earlier {
                    outcomes.push(Outcome::Hit(Arc::clone(e)));
                    continue;
                }
                match stored.get(key) {
                    Some(Ok(e)) => {
                        outcomes.push(Outcome::Hit(Arc::clone(e)));
                        continue;
                    }
                    Some(Err(e)) => return Err(e.for_another_caller()),
                    None => {}
                }
            }
            let mut event = job.event.clone();
            let named = std::mem::take(&mut event.watchers);
            let seq = first + i64::try_from(i).unwrap_or(i64::MAX);
            let event = event.into_event(self.rows().sequence(WHAT, seq)?, job.now);
            let session = event.session_ref();
            let head = match last.get(&session) {
                Some(previous) => protocol::head_after(Some(previous), &event, job.now),
                None => match heads.get(&session) {
                    None | Some(Ok(None)) => protocol::head_after(None, &event, job.now),
                    Some(Ok(Some(previous))) => {
                        protocol::head_after(Some(previous), &event, job.now)
                    }
                    Some(Err(e)) => {
                        tracing::warn!(store = %self.name, error = %e, "recording over a head this store cannot read: its history before the event is reported as a gap");
                        protocol::head_over_unreadable(&event, job.now)
                    }
                },
            };
            last.insert(session, head);
            let cursors = on_key.entry(event.session_key.clone()).or_default();
            let effects = protocol::on_event(&event, &named, cursors, job.now);
            for c in effects.upserts {
                match cursors.iter_mut().find(|x| x.watcher == c.watcher) {
                    Some(x) => x.clone_from(&c),
                    None => cursors.push(c.clone()),
                }
                changed.insert((c.watcher.clone(), c.target.clone()), c);
            }
            let event = Arc::new(event);
            events.push(Arc::clone(&event));
            outcomes.push(Outcome::Stored(Recorded {
                event,
                deduplicated: false,
                notices: effects.notices,
            }));
        }

        if !events.is_empty() || !changed.is_empty() {
            let heads: Vec<&Head> = last.values().collect();
            let changed: Vec<Cursor> = changed.into_values().collect();
            let payloads = column(&events, |e| {
                e.payload
                    .as_ref()
                    .map(|p| serde_json::to_string(p).expect("a JSON map always serializes"))
            });
            let written = CursorColumns::of(&changed)
                .bind(
                    sqlx::query(rows::GROUP_WRITE)
                        .bind(column(&events, |e| int(e.sequence)))
                        .bind(column(&events, |e| e.dedupe_key.as_deref()))
                        .bind(column(&events, |e| e.session_key.as_str()))
                        .bind(column(&events, |e| e.session_id.as_deref()))
                        .bind(column(&events, |e| e.agent_id.as_str()))
                        .bind(column(&events, |e| e.kind.as_str()))
                        .bind(column(&events, |e| e.actor_type.as_str()))
                        .bind(column(&events, |e| e.actor_id.as_deref()))
                        .bind(column(&events, |e| e.run_id.as_deref()))
                        .bind(column(&events, |e| e.occurred_at.millis()))
                        .bind(column(&events, |e| e.summary.as_str()))
                        .bind(payloads)
                        .bind(column(&heads, |h| h.session.session_key.as_str()))
                        .bind(column(&heads, |h| h.session.agent_id.as_str()))
                        .bind(column(&heads, |h| int(h.last_sequence)))
                        .bind(column(&heads, |h| int(h.pruned_max_sequence)))
                        .bind(column(&heads, |h| h.updated_at.millis())),
                )
                .execute(&mut **tx)
                .await;
            if let Err(e) = written {
                tx.lost = crate::store::commit_answer_lost(&e);
                return Err(self.failed(WHAT)(e));
            }
        }
        Ok(outcomes
            .into_iter()
            .map(|o| match o {
                Outcome::Stored(rec) => rec,
                Outcome::Hit(event) => Recorded {
                    event,
                    deduplicated: true,
                    notices: Vec::new(),
                },
            })
            .collect())
    }
}

/// Answers every job with `e` (each caller a copy of its own).
fn fail_all(jobs: impl IntoIterator<Item = Job>, e: &StoreError) {
    for job in jobs {
        drop(job.reply.send(Err(e.for_another_caller())));
    }
}
