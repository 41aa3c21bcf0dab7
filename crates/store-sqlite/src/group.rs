//! Group commit: recordings that arrive while the write connection is busy wait in a queue, and
//! the next writer records all of them in one transaction of two batches, whatever their number
//! (see [`sql::GROUP_RECORD_BEGIN`]).
//!
//! Each caller still gets its own [`Recorded`] only once the commit that holds its event is
//! done. The per-event protocol is unchanged: the events are applied in queue order, each one
//! through `awareness_core::protocol::on_event` against the cursors as the events before it in
//! the batch left them, exactly as one transaction per event would (the conformance check
//! `concurrent_records_each_get_their_own_event` and the model test hold either way).
//!
//! Failure: a batch that fails is rolled back and its events are recorded again one per
//! transaction, so one event that cannot be written fails only its own caller. A batch that
//! fails because another connection holds the write lock (BUSY, retryable) is not: the lock
//! failed, not an event, and each event alone would wait the whole busy timeout again, so every
//! caller gets the error at once (and may retry). For the same reason, when an event recorded
//! alone after a failed batch meets the lock, the events after it get that error at once.
//!
//! Cancellation: a caller that records alone runs its recording itself, as without group
//! commit. A batch holding other callers' events runs on a task of its own, so that cancelling
//! the caller that happened to start it cancels nobody's commit, and a task dropped with its
//! runtime hands it to a thread that finishes it ([`Unfinished`]). A caller cancelled while its
//! event still waits in the queue takes the event out ([`awareness_core::queue::Queued`]); once
//! a batch holds it, it is committed (the caller cannot tell, as with any write cancelled
//! midway). A writer whose
//! own event is not in the batch it took (the queue held `group_commit` older ones) waits for
//! the write connection again, so it never waits for an answer nobody is going to give.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use awareness_core::{
    Cursor, Event, Recorded, Sequence, SessionKey, SessionRef, StoreError, Timestamp, WatcherKey,
    protocol,
};
use sqlx::SqliteConnection;
use tokio::sync::oneshot;

use crate::conn::{Hints, Writer, batch, batch_one, get};
use crate::decode;
use crate::events::record_alone;
use crate::sql;

const WHAT: &str = "record an event";

/// One queued recording: the event core built (sequence still zero), its payload as JSON, the
/// watchers its producer named, the caller's clock, and where its result goes.
pub(crate) struct Job {
    /// Tells a caller's own job from the others when it takes the queue.
    pub(crate) id: u64,
    pub(crate) event: Event,
    pub(crate) payload: Option<String>,
    pub(crate) named: Vec<WatcherKey>,
    pub(crate) now: Timestamp,
    pub(crate) reply: oneshot::Sender<Result<Recorded, StoreError>>,
}

impl awareness_core::queue::Job for Job {
    fn id(&self) -> u64 {
        self.id
    }
}

/// The recordings waiting for the write connection.
pub(crate) type Queue = awareness_core::queue::Queue<Job>;

/// What a batch decided for one job.
enum Outcome {
    Stored(Recorded),
    /// A dedupe hit on this key; the stored row is looked up once the batch has read them.
    Hit(String),
}

/// A batch holding other callers' events, run by a task of its own on the runtime of the
/// caller that started it ([`Unfinished::run`]), so that it goes on whatever becomes of that
/// caller. Should the task be dropped before the batch ends (its runtime shut down), the batch
/// is handed to a thread of its own with a small runtime, which runs it to its end: the other
/// callers get their answers, and the write connection is let go of. (Dropped with the task,
/// the batch told its callers it stopped, their outcome unknown.) A runtime alive but no longer
/// driven does not drop its tasks: a batch there waits for it, holding the write connection.
/// Nothing in a batch may use `tokio::time` or `Handle::current()`, which would bind it to the
/// first runtime. A batch that panics is dropped (its callers are told it stopped, and its
/// transaction is rolled back). The store's file (`path`) names it in the logs.
pub(crate) struct Unfinished {
    batch: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    path: Arc<Path>,
}

impl Unfinished {
    pub(crate) fn new(batch: impl Future<Output = ()> + Send + 'static, path: Arc<Path>) -> Self {
        Self {
            batch: Some(Box::pin(batch)),
            path,
        }
    }

    /// Runs the batch to its end here.
    pub(crate) async fn run(&mut self) {
        std::future::poll_fn(|cx| {
            let Some(batch) = self.batch.as_mut() else {
                return Poll::Ready(());
            };
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| batch.as_mut().poll(cx)))
            {
                Ok(Poll::Pending) => Poll::Pending,
                Ok(Poll::Ready(())) => {
                    self.batch = None;
                    Poll::Ready(())
                }
                Err(panic) => {
                    tracing::error!(
                        path = %self.path.display(),
                        panic = awareness_core::error::panic_message(&*panic),
                        "a group commit panicked; its recordings fail"
                    );
                    self.batch = None;
                    Poll::Ready(())
                }
            }
        })
        .await;
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        let Some(batch) = self.batch.take() else {
            return;
        };
        let path = Arc::clone(&self.path);
        let started = std::thread::Builder::new()
            .name("store-sqlite-batch".into())
            .spawn(move || match tokio::runtime::Builder::new_current_thread().build() {
                Ok(rt) => {
                    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        rt.block_on(batch);
                    }));
                    if let Err(panic) = ran {
                        tracing::error!(path = %path.display(), panic = awareness_core::error::panic_message(&*panic), "a group commit panicked; its recordings fail");
                    }
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %awareness_core::error::ErrorChain(&e), "cannot finish a group commit whose starter gave up; its recordings fail");
                }
            });
        if let Err(e) = started {
            tracing::warn!(path = %self.path.display(), error = %awareness_core::error::ErrorChain(&e), "cannot finish a group commit whose starter gave up; its recordings fail");
        }
    }
}

/// Records `jobs` in one transaction on the locked, begun write connection and answers every
/// caller. When the batch fails, it is rolled back and each event is recorded again in a
/// transaction of its own, so an event that cannot be written fails only its own caller; unless
/// the failure is the lock (retryable): then every caller still waiting gets it at once.
pub(crate) async fn record_batch(w: &mut Writer, jobs: Vec<Job>, hints: &Hints) {
    let e = match run(&mut w.conn, &w.path, &jobs, hints).await {
        Ok(results) => {
            w.open_tx = false;
            for (job, rec) in jobs.into_iter().zip(results) {
                // A caller that went away no longer wants its result; its event is committed.
                drop(job.reply.send(Ok(rec)));
            }
            return;
        }
        Err(e) => e,
    };
    w.rollback().await;
    if e.is_retryable() {
        tracing::debug!(error = %awareness_core::error::ErrorChain(&e), events = jobs.len(), "a group commit met the lock; every caller gets the error");
        fail_all(jobs, &e);
        return;
    }
    tracing::debug!(error = %awareness_core::error::ErrorChain(&e), events = jobs.len(), "a group commit failed; recording its events one by one");
    let mut jobs = jobs.into_iter();
    let mut locked = None;
    for job in jobs.by_ref() {
        // A test's pause point, before each event recorded alone (compiled in tests only).
        #[cfg(test)]
        crate::tests::BEFORE_AN_EVENT_OF_A_FAILED_BATCH
            .at(&w.path)
            .await;
        // A ROLLBACK that failed (the batch's, or the previous event's) left the transaction
        // open: it is tried again first, or this event's BEGIN would fail for nothing of its own.
        if w.open_tx {
            w.rollback().await;
        }
        w.begin();
        let res = record_alone(w, hints, job.event, job.payload, &job.named, job.now).await;
        let res = w.finish(res).await;
        // The lock again (another process took it meanwhile): the events left would each wait
        // the whole busy timeout for it.
        locked = res
            .as_ref()
            .err()
            .filter(|e| e.is_retryable())
            .map(StoreError::for_another_caller);
        drop(job.reply.send(res));
        if locked.is_some() {
            break;
        }
    }
    if let Some(e) = locked {
        fail_all(jobs, &e);
    }
}

/// Answers every job with `e` (each caller a copy of its own).
fn fail_all(jobs: impl IntoIterator<Item = Job>, e: &StoreError) {
    for job in jobs {
        drop(job.reply.send(Err(e.for_another_caller())));
    }
}

/// The two batches; answers one [`Recorded`] per job, in order. `path`, the store's file,
/// names it in the warnings.
async fn run(
    conn: &mut SqliteConnection,
    path: &Path,
    jobs: &[Job],
    hints: &Hints,
) -> Result<Vec<Recorded>, StoreError> {
    let rows: Vec<_> = jobs
        .iter()
        .map(|j| {
            let e = &j.event;
            (
                e.dedupe_key.as_deref(),
                e.session_key.as_str(),
                e.session_id.as_deref(),
                e.agent_id.as_str(),
                e.kind.as_str(),
                e.actor_type.as_str(),
                e.actor_id.as_deref(),
                e.run_id.as_deref(),
                e.occurred_at.millis(),
                e.summary.as_str(),
                j.payload.as_deref(),
                decode::fields_json(e, j.payload.as_deref()),
            )
        })
        .collect();
    let n = i64::try_from(jobs.len()).unwrap_or(i64::MAX);
    let q = sqlx::query(sql::GROUP_RECORD_BEGIN)
        .bind(decode::to_json(&rows))
        .bind(n);
    let after = batch_one(conn, q, WHAT).await?;
    let after = &after;
    let mut on_key: HashMap<SessionKey, Vec<Cursor>> = HashMap::new();
    let rows = decode::CursorRows::read(get(after, 3, WHAT)?)?;
    // Keys with a row that cannot be read stay watched, for the hint.
    let damaged: HashSet<String> = rows.unreadable.iter().map(|u| u.target.clone()).collect();
    for c in rows.warned(path) {
        on_key.entry(c.target.clone()).or_default().push(c);
    }
    let top: i64 = get(after, 0, WHAT)?;
    let inserted: Vec<i64> = serde_json::from_str(get(after, 1, WHAT)?)
        .map_err(|e| StoreError::corrupt(format!("{WHAT}: inserted sequences: {e}")))?;
    let first = top - n + 1;
    let mut was_inserted = vec![false; jobs.len()];
    for s in &inserted {
        let i = usize::try_from(s - first)
            .ok()
            .filter(|i| *i < jobs.len())
            .ok_or_else(|| {
                StoreError::corrupt(format!(
                    "{WHAT}: sequence {s} is outside the batch's {first}..={top}"
                ))
            })?;
        was_inserted[i] = true;
    }

    // The protocol, event by event in queue order, on the cursors as the batch leaves them.
    let mut changed: HashMap<(WatcherKey, SessionKey), Cursor> = HashMap::new();
    // Per ref: the batch's first and last sequences on it, and the last one's clock.
    let mut heads: HashMap<SessionRef, (Sequence, Sequence, Timestamp)> = HashMap::new();
    let mut outcomes = Vec::with_capacity(jobs.len());
    for (i, job) in jobs.iter().enumerate() {
        if !was_inserted[i] {
            let key = job.event.dedupe_key.clone().ok_or_else(|| {
                StoreError::corrupt(format!(
                    "{WHAT}: an event without a dedupe key was not inserted"
                ))
            })?;
            outcomes.push(Outcome::Hit(key));
            continue;
        }
        let mut event = job.event.clone();
        event.sequence = decode::sequence(WHAT, first + i64::try_from(i).unwrap_or(i64::MAX))?;
        let cursors = on_key.entry(event.session_key.clone()).or_default();
        let effects = protocol::on_event(&event, &job.named, cursors, job.now);
        for c in effects.upserts {
            match cursors.iter_mut().find(|x| x.watcher == c.watcher) {
                Some(x) => x.clone_from(&c),
                None => cursors.push(c.clone()),
            }
            changed.insert((c.watcher.clone(), c.target.clone()), c);
        }
        // The head core's rule gives this event (its sequence, the caller's clock); the
        // watermark, which recording keeps, is kept by the upsert in SQL, as in
        // `record_alone` (the model test holds both equal to core's rule). Over a head that
        // cannot be read, the upsert sets it below the batch's first event on the ref, as
        // `protocol::head_over_unreadable` does for the first of them (decision 0020).
        let head = protocol::head_after(None, &event, job.now);
        heads
            .entry(head.session)
            .and_modify(|(_, last, now)| (*last, *now) = (head.last_sequence, head.updated_at))
            .or_insert((head.last_sequence, head.last_sequence, head.updated_at));
        outcomes.push(Outcome::Stored(Recorded {
            event: Arc::new(event),
            deduplicated: false,
            notices: effects.notices,
        }));
    }

    let stored: HashMap<String, Arc<Event>> = decode::events(get(after, 2, WHAT)?, path)?
        .into_iter()
        .filter_map(|e| Some((e.dedupe_key.clone()?, e)))
        .collect();

    let heads: Vec<(&str, &str, i64, i64, i64)> = heads
        .iter()
        .map(|(r, (first, last, now))| {
            (
                r.session_key.as_str(),
                r.agent_id.as_str(),
                decode::int(*last),
                now.millis(),
                decode::int(*first),
            )
        })
        .collect();
    let changed: Vec<Cursor> = changed.into_values().collect();
    let q = if changed.is_empty() {
        sqlx::query(sql::GROUP_RECORD_HEADS_COMMIT).bind(decode::to_json(&heads))
    } else {
        sqlx::query(sql::GROUP_RECORD_COMMIT)
            .bind(decode::to_json(&heads))
            .bind(decode::cursors_json(&changed))
    };
    // Every answer is settled before the commit: nothing after it may fail, since a failed
    // batch is recorded again event by event (a failure after the commit would commit each
    // event twice).
    let answers = outcomes
        .into_iter()
        .map(|o| match o {
            Outcome::Stored(rec) => Ok(rec),
            Outcome::Hit(key) => {
                let event = stored.get(&key).cloned().ok_or_else(|| {
                    StoreError::corrupt(format!(
                        "{WHAT}: the dedupe key {key:?} conflicted but has no row"
                    ))
                })?;
                Ok(Recorded {
                    event,
                    deduplicated: true,
                    notices: Vec::new(),
                })
            }
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    batch(conn, q, WHAT).await?;
    for (key, cursors) in &on_key {
        hints.set_watched(key, !cursors.is_empty() || damaged.contains(key.as_str()));
    }
    Ok(answers)
}
